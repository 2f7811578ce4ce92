"""`radixtop --node HOST` in a real terminal against a real OpenSSH server on loopback
(tests/sshd_helpers.py): one TP4 group over two "nodes", two ranks on each (`radixtop sim --tp-size
4 --nnodes 2 --node-rank R`), the lock race on the second node's rank 3. The first node's radixtop
follows the second's log through ssh, names `node2 TP3` first, shows each node's radix pane, and
`b` writes one bundle with both nodes' evidence and one timeline. A node that cannot be reached is
one line, and the rest goes on."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from pane_helpers import start_sim, stop
from sshd_helpers import PLAIN_PATH, Sshd, client_config, free_port, keygen, radixtop_bin, require_openssh, start_sshd
from tmux_helpers import Tmux

from radixtop.incident.replay.replay import replay_once
from radixtop.incident.replay.trace import plan_requests
from radixtop.incident.replay.workloads import pressure_trace
from radixtop.probes.node_local import gpu_reports

pytestmark = [
    pytest.mark.tmux,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

GROUP = ("--max-total-tokens", "1024", "--page-size", "16", "--tp-size", "4", "--nnodes", "2")
RACE_ON_RANK_3 = ("--fault", "lock-race:1:probability=1,rank=3")


@dataclass
class TwoNodes:
    work: Path
    config: Path
    here_url: str
    here_log: Path
    node2_url: str
    node2: object  # its simulator's process


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[TwoNodes]:
    require_openssh()
    user = tmp_path / "id_user"
    authorized = [keygen(user)]
    folder = radixtop_bin(tmp_path / "bin")
    server = start_sshd(tmp_path / "sshd", "127.0.0.2", authorized, f"{folder}:{PLAIN_PATH}")
    bare = start_sshd(tmp_path / "bare", "127.0.0.3", authorized, PLAIN_PATH)  # no radixtop there
    locked = start_sshd(tmp_path / "locked", "127.0.0.3", [], PLAIN_PATH)  # our key refused: it would ask a password
    sims = []
    try:
        known = tmp_path / "known_hosts"
        known.write_text("".join(s.known_hosts_line() + "\n" for s in (server, bare, locked)))
        closed = Sshd("127.0.0.2", free_port("127.0.0.2"), "", server.proc, server.log)
        config = client_config(tmp_path / "ssh_config", {"node2": (server, user), "gone": (closed, user),
                                                         "bare": (bare, user), "locked": (locked, user)}, known)
        here, here_url, here_log = start_sim(tmp_path / "node1", *GROUP, "--node-rank", "0")
        sims.append(here)
        node2, node2_url, _ = start_sim(tmp_path / "node2", *GROUP, "--node-rank", "1", *RACE_ON_RANK_3)
        sims.append(node2)
        yield TwoNodes(tmp_path, config, here_url, here_log, node2_url, node2)
    finally:
        for sim in sims:
            stop(sim)
        for sshd in (server, bare, locked):
            sshd.stop()


def _race(url: str, proc) -> None:
    """The second node's simulator under pressure until the lock race kills it."""
    planned = plan_requests(pressure_trace(1024, 8, page_size=16))

    async def load() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            for _ in range(5):
                if proc.poll() is not None:
                    break
                try:
                    await replay_once(client, url, planned)
                except httpx.HTTPError:
                    break

    asyncio.run(load())
    proc.wait(timeout=30)


def test_the_first_node_names_the_second_nodes_rank_first_and_b_bundles_both(two_nodes: TwoNodes) -> None:
    nodes = two_nodes
    out = nodes.work / "out"
    out.mkdir()
    env = {**os.environ, "RADIXTOP_RUNTIME_DIR": str(nodes.work / "run")}
    tmux = Tmux(160, 48)
    try:
        tmux.start([sys.executable, "-m", "radixtop", "--log", str(nodes.here_log), "--url", nodes.here_url,
                    "--node", "node2", "--node-url", f"node2={nodes.node2_url}", "--node", "gone", "--node", "bare",
                    "--node", "locked",
                    "--ssh-config", str(nodes.config), "--no-gpu"], out, env)
        screen = tmux.wait_for(lambda s: "node2: following its logs" in s, "the second node's log stream", timeout=60)
        assert "node2: following its logs through ssh (clock " in screen, screen  # the skew, as measured
        # A node that cannot be reached, one without radixtop, one that would ask for a password: one
        # line each in the log pane, nothing hangs, and the rest goes on.
        for line in ("gone: connection refused", "bare: radixtop is not installed there",
                     "locked: authentication needed"):
            tmux.send("&")  # the log pane's filter: the line may have scrolled off under the backlog
            tmux.wait_for(lambda s: "show only lines containing" in s, "the filter's prompt", timeout=10)
            tmux.send("-l", line)
            tmux.send("Enter")
            # one row of the log pane holds it
            tmux.wait_for(lambda s, line=line: f"filter '{line}' 1 row" in s, f"{line!r} filtered", timeout=10)
            tmux.send("Escape")
            tmux.wait_for(lambda s: "filter '" not in s, "the filter cleared", timeout=10)
        # node2's GPUs in the GPU pane, as its stream reports them (this machine has no NVIDIA driver:
        # the reason NVML gives there, named by node)
        gpus, why = gpu_reports()
        expect = f"node2 GPU {gpus[0].index}" if gpus else f"node2: {why}"[:40]
        tmux.wait_for(lambda s: expect in s, "node2's GPUs in the GPU pane", timeout=20)
        started = time.monotonic()
        _race(nodes.node2_url, nodes.node2)
        screen = tmux.wait_for(lambda s: "first: node2 TP3" in s, "node2 TP3 named first in the status line",
                               timeout=30)
        assert "Radix cache page lock failed" in screen, screen
        spool = next((nodes.work / "run" / "nodes").glob("*/node2/*.log"))
        assert "TP3" in spool.read_text()
        assert time.monotonic() - started < 60
        # Each node's radix pane: this node's ranks 0 and 1, and node2's, named by node.
        tmux.send("2")
        tmux.wait_for(lambda s: "node2 rank" in s, "node2's ranks in the radix pane", timeout=20)
        # and node2's rank 3 as it failed: its flight record, brought from node2 by the stream
        tmux.wait_for(lambda s: "as rank 3 failed" in s, "rank 3's flight record in the radix pane", timeout=20)
        assert list((nodes.work / "run" / "nodes").glob("*/node2/flight/rank3-pid*.json"))
        tmux.send("2")  # back to every pane
        tmux.send("b")
        tmux.wait_for(lambda s: "bundle: written" in s or "bundle written" in s, "the bundle", timeout=120)
        # b's bundle (the crash's automatic one lies beside it)
        (bundle,) = [p for p in out.iterdir() if p.is_dir() and p.name.startswith("radixtop-bundle-")
                     and p.name.endswith("-manual")]
        assert (bundle / "nodes" / "node2").is_dir(), sorted(p.name for p in bundle.iterdir())
        timeline = json.loads((bundle / "timeline.json").read_text())
        assert any(e.get("node") == "node2" for e in timeline["events"]), timeline
        # The stream drops (its process on node2 is killed): one line, then it comes back by itself.
        streams = [p for p in psutil.process_iter(["cmdline"])
                   if "follow" in (p.info["cmdline"] or []) and nodes.node2_url in (p.info["cmdline"] or [])]
        assert streams, "no radixtop follow running on node2"
        for proc in streams:
            proc.kill()
        tmux.wait_for(lambda s: "node2: its log stream is back" in s, "the stream back after it dropped", timeout=30)
    finally:
        tmux.send("q")
        time.sleep(1)
        tmux.kill()
