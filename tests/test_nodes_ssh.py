"""`radixtop discover --node HOST` against real OpenSSH servers on loopback (tests/sshd_helpers.py):
127.0.0.2 serves a node with radixtop on its sessions' PATH, 127.0.0.3 one without. Each node that
cannot answer is one line saying what to do, well within its deadline: a closed port, no radixtop
there, a key the node does not accept (where ssh would ask for a password), a host key that
changed, one not known yet, a radixtop that does not answer, an answer that is not the report."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pane_helpers import start_sim, stop
from sshd_helpers import (
    PLAIN_PATH,
    ROOT,
    Sshd,
    client_config,
    free_port,
    keygen,
    radixtop_bin,
    require_openssh,
    start_sshd,
)

FAILS_WITHIN_S = 8.0  # a failing node is said well before the 30 s --timeout


@dataclass
class Nodes:
    workdir: Path
    config: Path  # the client's ssh config: one alias per case
    with_radixtop: Sshd
    without_radixtop: Sshd
    identity: Path
    sim_pid: int
    sim_url: str


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    require_openssh()
    work = tmp_path_factory.mktemp("nodes")
    user, stranger = work / "id_user", work / "id_stranger"
    authorized = [keygen(user)]
    keygen(stranger)  # a key the nodes do not know: ssh would go on to ask for a password
    on_path = f"{radixtop_bin(work / 'bin')}:{PLAIN_PATH}"
    servers: list[Sshd] = []
    sim = None
    try:
        servers.append(start_sshd(work / "node-a", "127.0.0.2", authorized, on_path))
        servers.append(start_sshd(work / "node-b", "127.0.0.3", authorized, PLAIN_PATH))
        a, b = servers
        known = work / "known_hosts"
        known.write_text(f"{a.known_hosts_line()}\n{b.known_hosts_line()}\n")
        closed = Sshd("127.0.0.2", free_port("127.0.0.2"), "", a.proc, a.log)  # nothing listens there
        config = client_config(work / "ssh_config", {
            "node-a": (a, user), "node-b": (b, user), "node-closed": (closed, user), "node-stranger": (a, stranger),
        }, known)
        sim, url, _ = start_sim(work / "sim", "--tp-size", "2")
        yield Nodes(work, config, a, b, user, sim.pid, url)
    finally:
        if sim is not None:
            stop(sim)
        for server in servers:
            server.stop()


def discover(*args: str, timeout_s: float = 60.0) -> tuple[subprocess.CompletedProcess[str], float]:
    """`radixtop discover ARGS` as a process (this checkout), and how long it took."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "radixtop", "discover", *args], capture_output=True, text=True, check=False,
        timeout=timeout_s, cwd=ROOT, stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return done, time.monotonic() - started


def one_failure(nodes: Nodes, host: str, *extra: str) -> tuple[str, float]:
    """The one line `--node HOST` fails with (exit 1: its only node failed), and how long it took."""
    done, took = discover("--no-local", "--ssh-config", str(nodes.config), "--node", host, *extra)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"radixtop: {host}: "), done.stderr
    assert took < FAILS_WITHIN_S, took
    entry = json.loads(done.stdout)["nodes"][0] if "--json" in extra else None
    if entry is not None:
        assert entry["ok"] is False and f"radixtop: {entry['error']}" == lines[0]
    return lines[0], took


def test_a_nodes_report_comes_back_through_ssh(nodes: Nodes) -> None:
    """Its hostname and the simulator it found, through ssh (sshd logs the session), the clock skew
    measured over the channel; a second, closed node fails in one line without failing the run."""
    done, _ = discover("--ssh-config", str(nodes.config), "--node", "node-a", "--node", "node-closed", "--json")
    assert done.returncode == 0, done.stderr
    local, remote, closed = json.loads(done.stdout)["nodes"]
    assert (local["node"], remote["node"], closed["node"]) == ("local", "node-a", "node-closed")
    assert remote["ok"] and not closed["ok"]
    report = remote["report"]
    assert report["radixtop_node_report"] == 1 and report["hostname"] == socket.gethostname()
    sim = next(s for s in report["servers"] if s["pid"] == nodes.sim_pid)
    assert sim["kind"] == "sim" and sim["url"] == nodes.sim_url and len(sim["instrument_urls"]) == 2
    assert any(p["pid"] == nodes.sim_pid for p in sim["processes"])
    assert report["gpus"] or report["gpus_unavailable"]
    # One machine, one clock: the skew is within its uncertainty (half the round trip) of zero.
    assert abs(remote["clock_skew_s"]) <= remote["clock_skew_uncertainty_s"] + 0.01
    assert 0 < remote["clock_skew_uncertainty_s"] < remote["seconds"]
    assert "Accepted publickey" in nodes.with_radixtop.log.read_text()
    assert done.stderr.splitlines() == [f"radixtop: {closed['error']}"] and "connection refused" in closed["error"]


def test_the_human_description_names_each_node(nodes: Nodes) -> None:
    done, _ = discover("--ssh-config", str(nodes.config), "--node", "node-a")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"this node (hostname {socket.gethostname()}")
    assert f"\nnode-a (hostname {socket.gethostname()}, radixtop " in done.stdout
    assert "± " in done.stdout and f"at {nodes.sim_url}" in done.stdout


def test_an_unreachable_node_is_one_line(nodes: Nodes) -> None:
    line, _ = one_failure(nodes, "node-closed", "--json")
    assert "connection refused: nothing listens on its ssh port" in line


def test_a_node_without_radixtop_is_one_line(nodes: Nodes) -> None:
    argv = ["ssh", "-F", str(nodes.config), "-o", "BatchMode=yes", "node-b", "--", "command -v radixtop"]
    there = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False, stdin=subprocess.DEVNULL)
    if there.returncode == 0:
        pytest.skip(f"radixtop is installed system-wide here ({there.stdout.strip()}): no node lacks it")
    line, _ = one_failure(nodes, "node-b")
    assert "radixtop is not installed there, or not on the PATH of a non-interactive ssh session" in line
    assert "--remote-radixtop" in line


def test_a_node_that_would_ask_for_a_password_is_one_line(nodes: Nodes) -> None:
    """The node offers password authentication; BatchMode makes ssh fail instead of asking."""
    line, _ = one_failure(nodes, "node-stranger")
    assert line == ("radixtop: node-stranger: authentication needed: radixtop uses your ssh agent/keys; "
                    "run `ssh node-stranger` once to check")
    assert "Failed publickey" in nodes.with_radixtop.log.read_text()


def test_a_new_host_key_is_accepted_and_a_changed_one_refused(nodes: Nodes, tmp_path: Path) -> None:
    """StrictHostKeyChecking accept-new (the user's config): the first visit records the key; once
    the recorded key is not the node's, ssh refuses and radixtop says what to check."""
    known = tmp_path / "known_hosts"
    config = client_config(tmp_path / "ssh_config", {"node-a": (nodes.with_radixtop, nodes.identity)}, known,
                           checking="accept-new")
    done, _ = discover("--no-local", "--ssh-config", str(config), "--node", "node-a")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert nodes.with_radixtop.host_key_line in known.read_text()
    other = " ".join(keygen(tmp_path / "other_host_key").split()[:2])
    known.write_text(f"[{nodes.with_radixtop.ip}]:{nodes.with_radixtop.port} {other}\n")
    done, took = discover("--no-local", "--ssh-config", str(config), "--node", "node-a")
    assert done.returncode == 1 and took < FAILS_WITHIN_S
    assert done.stderr.startswith("radixtop: node-a: its host key changed since your known_hosts recorded it")
    assert "`ssh-keygen -R node-a`" in done.stderr and done.stderr.count("\n") == 1


def test_an_unknown_host_key_is_one_line(nodes: Nodes, tmp_path: Path) -> None:
    config = client_config(tmp_path / "ssh_config", {"node-a": (nodes.with_radixtop, nodes.identity)},
                           tmp_path / "known_hosts")
    line, _ = one_failure(nodes, "node-a", "--ssh-config", str(config))
    assert "its host key is not in your known_hosts (BatchMode cannot ask): run `ssh node-a` once" in line


def test_a_radixtop_that_does_not_answer_is_cut_off_at_the_deadline(nodes: Nodes, tmp_path: Path) -> None:
    stuck = tmp_path / "stuck"
    stuck.write_text("#!/bin/sh\nexec sleep 6\n")
    stuck.chmod(0o755)
    done, took = discover("--no-local", "--ssh-config", str(nodes.config), "--node", "node-a",
                          "--remote-radixtop", str(stuck), "--timeout", "2")
    assert done.returncode == 1 and 2 <= took < 5, took
    assert done.stderr == ("radixtop: node-a: no answer within 2 s (ssh still connecting, or radixtop discover stuck "
                           f"there); try `ssh node-a {stuck} discover --json`, or a longer --timeout\n")


def test_an_answer_that_is_not_the_report_is_one_line(nodes: Nodes, tmp_path: Path) -> None:
    chatty = tmp_path / "chatty"
    chatty.write_text("#!/bin/sh\necho 'Welcome to node-a!'\n")
    chatty.chmod(0o755)
    line, _ = one_failure(nodes, "node-a", "--remote-radixtop", str(chatty))
    assert "its answer is not radixtop's node report (the answer: not valid JSON" in line
