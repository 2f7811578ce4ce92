"""`radixtop bundle --node HOST` against real OpenSSH servers on loopback (tests/sshd_helpers.py):
127.0.0.2 is a node with radixtop on its sessions' PATH, 127.0.0.3 one without. Each node's
simulator dies of the lock race, the second node's first; one bundle holds this node's evidence
and the second node's own bundle (nodes/node2/), verifies as a whole, and its timeline puts both
nodes' first signatures in order, each tagged with its node. A node that cannot be reached, has
no radixtop, or answers with something that is not a bundle (junk, a tar that climbs out of its
folder or holds a link, an endless stream, nothing at all) is one line, and the bundle is written."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
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

from radixtop.incident.bundle.bundle import verify_bundle
from radixtop.incident.replay.replay import replay_once
from radixtop.incident.replay.trace import plan_requests
from radixtop.incident.replay.workloads import pressure_trace

LOCK_RACE = (
    "--max-total-tokens", "1024", "--page-size", "16", "--tp-size", "2", "--fault", "lock-race:1:probability=1",
)
BUNDLE_WITHIN_S = 90.0  # every wait in a bundle across nodes is bounded; this one bounds the test


@dataclass
class Crashed:
    url: str
    pid: int
    log: Path


@dataclass
class Nodes:
    workdir: Path
    config: Path
    radixtop: Path  # the node's radixtop (this checkout)
    here: Crashed  # this node's simulator, dead of the lock race
    node2: Crashed  # the second node's, dead of it first
    live_url: str  # a healthy simulator, still running
    live_pid: int


def _crash(workdir: Path) -> Crashed:
    """A simulator dead of the lock race under pressure (as the seed's incident ends)."""
    sim, url, log = start_sim(workdir, *LOCK_RACE)
    planned = plan_requests(pressure_trace(1024, 8, page_size=16))

    async def load() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            for _ in range(5):
                if sim.poll() is not None:
                    break
                await replay_once(client, url, planned)

    try:
        asyncio.run(load())
        sim.wait(timeout=30)
    finally:
        stop(sim)
    assert sim.returncode != 0, "the lock race did not kill the simulator"
    return Crashed(url, sim.pid, log)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    require_openssh()
    work = tmp_path_factory.mktemp("bundle-nodes")
    user = work / "id_user"
    authorized = [keygen(user)]
    folder = radixtop_bin(work / "bin")
    servers: list[Sshd] = []
    live = None
    try:
        servers.append(start_sshd(work / "node2", "127.0.0.2", authorized, f"{folder}:{PLAIN_PATH}"))
        servers.append(start_sshd(work / "bare", "127.0.0.3", authorized, PLAIN_PATH))
        node2, bare = servers
        known = work / "known_hosts"
        known.write_text(f"{node2.known_hosts_line()}\n{bare.known_hosts_line()}\n")
        closed = Sshd("127.0.0.2", free_port("127.0.0.2"), "", node2.proc, node2.log)
        config = client_config(work / "ssh_config", {"node2": (node2, user), "bare": (bare, user),
                                                      "closed": (closed, user)}, known)
        second = _crash(work / "sim-node2")  # the second node fails first
        time.sleep(1.1)  # a second apart: the logs' times are whole seconds
        first = _crash(work / "sim-here")
        live, live_url, _ = start_sim(work / "sim-live", "--tp-size", "2")
        yield Nodes(work, config, folder / "radixtop", first, second, live_url, live.pid)
    finally:
        if live is not None:
            stop(live)
        for server in servers:
            server.stop()


def bundle(nodes: Nodes, out: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """`radixtop bundle --out OUT` of this node's dead simulator, with ARGS (this checkout)."""
    here = nodes.here
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "radixtop", "bundle", "--out", str(out), "--url", here.url, "--pid", str(here.pid),
         "--log", str(here.log), "--ssh-config", str(nodes.config), *args],
        capture_output=True, text=True, check=False, timeout=BUNDLE_WITHIN_S, cwd=ROOT, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return done, time.monotonic() - started


def written(done: subprocess.CompletedProcess[str]) -> Path:
    assert done.returncode == 0, (done.stdout, done.stderr)
    path = Path(next(line for line in done.stdout.splitlines() if line.startswith("bundle: "))[8:])
    assert path.is_dir() and verify_bundle(path) == []
    return path


def test_one_bundle_holds_both_nodes_and_one_timeline(nodes: Nodes, tmp_path: Path) -> None:
    done, took = bundle(nodes, tmp_path, "--node", "node2", "--node-url", f"node2={nodes.node2.url}",
                        "--node-log", f"node2={nodes.node2.log}", "--node", "bare", "--node", "closed")
    path = written(done)
    # The second node's own bundle, whole: its evidence of the race, its manifest, checked.
    theirs = path / "nodes" / "node2"
    assert next(theirs.glob("evidence/*radix-page-lock-eviction.log")).is_file()
    assert (theirs / "findings.json").is_file() and verify_bundle(theirs) == []
    assert next(path.glob("evidence/*radix-page-lock-eviction.log")).is_file()  # and this node's
    # The whole is one bundle: its manifest lists the node's files, its archive verifies, and so
    # does `radixtop bundle --verify`.
    manifest = json.loads((path / "MANIFEST.json").read_text())
    listed = {e["path"] for e in manifest["files"]}
    assert "nodes/node2/MANIFEST.json" in listed and "nodes/node2/findings.json" in listed
    archive = path.with_name(path.name + ".tar.gz")
    assert verify_bundle(archive) == []
    check = subprocess.run([sys.executable, "-m", "radixtop", "bundle", "--verify", str(path)], capture_output=True,
                           text=True, timeout=60, cwd=ROOT, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert check.returncode == 0, check.stderr
    # The clock skew, measured over ssh: one machine, one clock, so zero within its uncertainty.
    by_node = {n["node"]: n for n in manifest["nodes"]}
    two = by_node["node2"]
    assert two["ok"] and two["files"] > 10 and two["manifest_problems"] == []
    assert 0 < two["clock_skew_uncertainty_s"] < 5
    assert abs(two["clock_skew_s"]) <= two["clock_skew_uncertainty_s"] + 0.01
    assert two["clock_correction_s"] == 0  # within its uncertainty: the node's times are not moved by noise
    assert "radixtop is not installed there" in by_node["bare"]["error"]
    assert "connection refused" in by_node["closed"]["error"]
    # One line each for the nodes that gave nothing, in the output and the bundle's notes.
    failed = [line for line in done.stdout.splitlines() if line.startswith("  not collected: nodes/")]
    assert len(failed) == 2, done.stdout
    assert failed[0].startswith("  not collected: nodes/bare: bare: radixtop is not installed there")
    assert failed[1].startswith("  not collected: nodes/closed: closed: connection refused")
    assert (path / "nodes" / "bare.note.txt").read_text().count("\n") == 1
    assert any(line.startswith("  node node2: nodes/node2/ (hostname ") and "± " in line and "not corrected" in line
               for line in done.stdout.splitlines()), done.stdout
    readme = (path / "README.txt").read_text()
    assert "node2: nodes/node2/ (hostname" in readme and "against this one" in readme
    # One timeline: both nodes' first signatures, on this node's clock, in order, each tagged.
    timeline = json.loads((path / "timeline.json").read_text())
    events = timeline["events"]
    assert [e["time"] for e in events] == sorted(e["time"] for e in events)
    lock_race = [e for e in events if "lock" in e["event"].lower()]
    assert [e["node"] for e in lock_race][:1] == ["node2"], events
    assert {"node2", "local"} <= {e["node"] for e in lock_race}, events
    assert [n["node"] for n in timeline["nodes"]] == ["node2"]
    page = (path / "timeline.html").read_text()
    assert "node2: " in page and "local: " in page
    assert took < BUNDLE_WITHIN_S


def test_a_node_bundles_the_server_it_finds_at_the_url_named(nodes: Nodes, tmp_path: Path) -> None:
    """No --node-log: the node finds the server listening on --node-url's port there, its log and
    its ranks' endpoints, as radixtop alone would."""
    done, _ = bundle(nodes, tmp_path, "--node", "node2", "--node-url", f"node2={nodes.live_url}")
    theirs = written(done) / "nodes" / "node2"
    manifest = json.loads((theirs / "MANIFEST.json").read_text())
    assert manifest["server"] == nodes.live_url and manifest["pid"] == nodes.live_pid
    assert manifest["logs"] == [str(nodes.workdir / "sim-live" / "sim.log")]
    assert (theirs / "logs" / "01-sim.log.tail.log").is_file() and (theirs / "server" / "server_info.json").is_file()
    assert (theirs / "radix" / "rank0-snapshot.json").is_file() and (theirs / "radix" / "rank1-snapshot.json").is_file()


def hostile(tmp_path: Path, nodes: Nodes, name: str, body: str) -> Path:
    """A "radixtop" on the node that answers discover as radixtop does and bundle --stream with `body`."""
    script = tmp_path / name
    script.write_text(f'#!/bin/sh\nif [ "$1" = discover ]; then exec {nodes.radixtop} "$@"; fi\n{body}\n')
    script.chmod(0o755)
    return script


def evil_tar(path: Path, kind: str) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        top = tarfile.TarInfo("radixtop-bundle-x")
        top.type = tarfile.DIRTYPE
        tar.addfile(top)
        if kind == "climbs":
            member = tarfile.TarInfo("radixtop-bundle-x/../../../escaped.txt")
            member.size = 3
            tar.addfile(member, io.BytesIO(b"bad"))
        else:
            link = tarfile.TarInfo("radixtop-bundle-x/passwd")
            link.type = tarfile.SYMTYPE
            link.linkname = "/etc/passwd"
            tar.addfile(link)
    path.write_bytes(buf.getvalue())
    return path


@pytest.mark.parametrize(("case", "says"), [
    ("junk", "its bundle stream is refused: not a readable tar.gz"),
    ("climbs", "its bundle stream is refused: member 'radixtop-bundle-x/../../../escaped.txt' climbs out"),
    ("link", "its bundle stream is refused: member 'radixtop-bundle-x/passwd' is a link or a device"),
    ("endless", "its answer is over 1048576 bytes"),
    ("stuck", "no answer within 4 s (ssh still connecting, or radixtop bundle stuck there)"),
])
def test_a_node_whose_answer_is_not_a_bundle_is_one_line(nodes: Nodes, tmp_path: Path, case: str, says: str) -> None:
    bodies = {
        "junk": "echo 'Welcome to node2!'",
        "climbs": f"cat {evil_tar(tmp_path / 'climbs.tar.gz', 'climbs')}",
        "link": f"cat {evil_tar(tmp_path / 'link.tar.gz', 'link')}",
        "endless": "exec cat /dev/zero",
        "stuck": "exec sleep 8",  # ends by itself soon after: killing ssh here does not stop it there
    }
    fake = hostile(tmp_path, nodes, "radixtop", bodies[case])
    started = time.monotonic()
    done, took = bundle(nodes, tmp_path / "out", "--node", "node2", "--remote-radixtop", str(fake),
                        "--node-max-bytes", str(1 << 20), "--node-timeout", "4")
    path = written(done)
    failed = [line for line in done.stdout.splitlines() if "nodes/node2" in line]
    assert len(failed) == 1 and failed[0].startswith("  not collected: nodes/node2: node2: ") and says in failed[0], \
        done.stdout
    assert not (path / "nodes" / "node2").exists() and not list((path / "nodes").glob(".*"))
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path.parent / "escaped.txt").exists()
    assert took < 60 and time.monotonic() - started < 60


def scan(nodes: Nodes, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "radixtop", "scan", "--ssh-config", str(nodes.config), *args],
        capture_output=True, text=True, check=False, timeout=BUNDLE_WITHIN_S, cwd=ROOT, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_scan_across_nodes_tags_each_finding_and_names_the_earliest_initiating_one(nodes: Nodes) -> None:
    done = scan(nodes, str(nodes.here.log), "--node", "node2", "--node-log", f"node2={nodes.node2.log}",
                "--node", "bare", "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()] and done.stderr.startswith(
        "radixtop: bare: radixtop is not installed there"), done.stderr
    doc = json.loads(done.stdout)
    local, two, bare = doc["nodes"]
    assert (local["node"], two["node"], bare["node"]) == ("local", "node2", "bare")
    assert two["ok"] and not bare["ok"] and two["clock_correction_s"] == 0
    assert abs(two["clock_skew_s"]) <= two["clock_skew_uncertainty_s"] + 0.01
    # The race on node2 came first: its cause is the initiating finding across nodes.
    init = doc["initiating"]
    assert (init["node"], init["signature"]) == ("node2", "radix-page-lock-eviction")
    assert init["first"]["file"] == str(nodes.node2.log) and init["first"]["rank"] in ("TP0", "TP1")
    found = doc["findings"]
    assert [f["first"]["epoch"] for f in found] == sorted(f["first"]["epoch"] for f in found)
    races = [f["node"] for f in found if f["signature"] == "radix-page-lock-eviction"]
    assert races == ["node2", "local"]
    # The same for a person.
    done = scan(nodes, str(nodes.here.log), "--node", "node2", "--node-log", f"node2={nodes.node2.log}")
    assert done.returncode == 0, done.stderr
    assert "\nInitiating: node2 TP" in done.stdout and "radix-page-lock-eviction (error)" in done.stdout
    assert "node node2: clock " in done.stdout and "not corrected" in done.stdout


def test_scan_on_a_node_without_a_log_named_takes_the_servers_it_finds(nodes: Nodes) -> None:
    done = scan(nodes, "--node", "node2", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert [n["node"] for n in doc["nodes"]] == ["node2"]  # no LOG here: this node adds nothing
    # Every server's log there, the live simulator's among them (the crashed ones are no process).
    live = (nodes.workdir / "sim-live" / "sim.log").read_text().count("\n")
    assert doc["nodes"][0]["lines"] >= live > 0
    assert any(f["signature"] == "server-ready" for f in doc["findings"])
    assert all(f["node"] == "node2" for f in doc["findings"])


def test_scan_with_nothing_to_scan_is_one_line(nodes: Nodes) -> None:
    done = subprocess.run([sys.executable, "-m", "radixtop", "scan"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2
    assert done.stderr == "radixtop: scan: name the LOG files (or - for stdin), or pass --found or --node HOST\n"


def test_a_bundle_that_does_not_match_its_manifest_or_has_a_hostile_timeline_is_kept_and_said(
        nodes: Nodes, tmp_path: Path) -> None:
    """A well-formed archive whose contents lie: stored (it is the node's evidence), its own
    manifest's check and the refused timeline said in the bundle's manifest, nothing drawn from it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("MANIFEST.json", b'{"format": "radixtop-bundle", "files": []}'),
                           ("SHA256SUMS", b""), ("timeline.json", b'{"radixtop_timeline": 1, "marks": [[1, {}]]}'),
                           ("evidence/01-x.log", b"<script>alert(1)</script>\n")):
            info = tarfile.TarInfo(f"radixtop-bundle-lies/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (tmp_path / "lies.tar.gz").write_bytes(buf.getvalue())
    fake = hostile(tmp_path, nodes, "radixtop", f"cat {tmp_path / 'lies.tar.gz'}")
    done, _ = bundle(nodes, tmp_path / "out", "--node", "node2", "--remote-radixtop", str(fake))
    path = written(done)  # the whole verifies: its manifest lists the node's files as they came
    assert (path / "nodes" / "node2" / "evidence" / "01-x.log").is_file()
    part = json.loads((path / "MANIFEST.json").read_text())["nodes"][0]
    assert part["ok"] and part["files"] == 4
    assert part["manifest_problems"][0] == "evidence/01-x.log: present but not in the manifest"
    assert part["manifest_problems"][-1].startswith("timeline.json: marks: a name is not a string")
    assert json.loads((path / "timeline.json").read_text())["nodes"] == []
