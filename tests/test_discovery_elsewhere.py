"""Logs and ports that are not where they seem: servers run by systemd (journald), in containers, or
that radixtop may not read.

What is real and what is a seam here: docker's daemon does not run on this machine and systemd is
not PID 1, so
- containers are made with the kernel's own means (tests/container_helpers.py: a mount namespace and
  a root of their own, with --net a network of their own, and a docker-proxy stand-in with the real
  proxy's command line): the log is read through /proc/PID/root, the ports through /proc/PID/net and
  the published port; the runtime's cgroup names and log files (docker's json-file, podman's
  k8s-file) are given at their seam, as text and as files written in those formats;
- journald: the unit is read from cgroup text (the seam), the stdout socket is a real one, and the
  reader is started as journalctl would be (`journalctl -u UNIT -f -o cat`), its argv checked; the
  plumbing from a reader's output to the log follower runs with a real stand-in program;
- a process radixtop may not read: discovery runs in a process without capabilities (setpriv), which
  the kernel treats as it treats another user's process, against real servers.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from container_helpers import can_make_containers, read_inside, server_in, start_container, start_proxy
from container_helpers import stop as stop_group
from incident_helpers import wait_for
from launch_helpers import wait_port

from radixtop.probes import serverlog
from radixtop.probes.container import Container, container_of, runtime_log_files
from radixtop.probes.discovery import Discovery, FoundServer, discover
from radixtop.probes.journal import journal_argv, unit_of
from radixtop.probes.logsource import open_source
from radixtop.probes.runtimelog import RuntimeLog
from radixtop.probes.serverlog import LogElsewhere
from radixtop.probes.spool import Spool
from radixtop.session.live import LiveSources, resolve_targets

CID = "3f4e1b2c" * 8


def _sim(ready: Path, *flags: str) -> list[str]:
    return [
        sys.executable, "-m", "radixtop", "sim", "--port", "0", "--ready-file", str(ready), "--step-ms", "1", *flags
    ]


def _server(pid: int, tries: int = 40, want=lambda s: True) -> FoundServer:
    found = None
    for _ in range(tries):
        found = next((s for s in asyncio.run(discover(exclude={os.getpid()})).servers if s.pid == pid), None)
        if found is not None and want(found):
            return found
        time.sleep(0.25)
    assert found is not None, f"pid {pid} was not discovered"
    return found


# -- journald ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cgroup", "unit"),
    [
        ("0::/system.slice/sglang.service\n", ("sglang.service", False)),
        (
            "12:pids:/system.slice/vllm.service\n1:name=systemd:/system.slice/vllm.service\n0::/\n",
            ("vllm.service", False),
        ),
        (
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/sglang-dev.service\n",
            ("sglang-dev.service", True),
        ),
        (f"0::/system.slice/docker-{CID}.scope\n", None),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
        ("0::/init.scope\n", None),
        ("0::/\n", None),
        ("", None),
    ],
)
def test_the_unit_is_read_from_the_cgroup(cgroup: str, unit: tuple[str, bool] | None) -> None:
    assert unit_of(cgroup) == unit


def test_the_journal_reader_argv() -> None:
    assert journal_argv("sglang.service", False) == [
        "journalctl", "-u", "sglang.service", "-f", "-o", "cat", "-n", "5000", "--no-pager"]
    assert journal_argv("sglang.service", True)[:3] == ["journalctl", "--user-unit", "sglang.service"]


def test_a_server_writing_to_journald_is_followed_through_journalctl(tmp_path: Path, monkeypatch) -> None:
    """A real server whose stdout is a socket (journald's stream, here a socketpair) in a unit's
    cgroup (given as text: the seam): its log is `journalctl -u UNIT -f -o cat`, when journalctl
    reads that journal; else one line says what to do."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ready = tmp_path / "port"
    proc = subprocess.Popen(_sim(ready), stdout=theirs.fileno(), stderr=theirs.fileno(), stdin=subprocess.DEVNULL,
                            start_new_session=True)
    theirs.close()
    try:
        port = wait_port(ready)
        monkeypatch.setattr(
            serverlog, "read_cgroup", lambda pid: "0::/system.slice/sglang.service\n" if pid == proc.pid else ""
        )
        real = _server(proc.pid)
        assert real.port == port
        if real.log_elsewhere is None:  # journalctl cannot read a journal here (no systemd): said so
            said = [p for p in real.problems if "journal" in p]
            assert len(said) == 1 and "sglang.service" in said[0] and "pass --log" in said[0], real.problems
        monkeypatch.setattr(serverlog, "can_read", lambda unit, user: "")
        found = _server(proc.pid)
        where = found.log_elsewhere
        assert where is not None and where.kind == "journald", found
        assert where.argv == ("journalctl", "-u", "sglang.service", "-f", "-o", "cat", "-n", "5000", "--no-pager")
        assert any("log: journal of unit sglang.service" in line for line in Discovery((found,)).describe())
    finally:
        proc.terminate()
        proc.wait(10)
        ours.close()


async def test_a_reader_process_log_is_followed_and_stopped(tmp_path: Path) -> None:
    """The plumbing behind journalctl / docker logs: a reader's output lands in a spool file that
    the attachment follows; stopping the attachment stops the reader and removes the spool."""
    reader = (sys.executable, "-c", "import time; print('[2026-12-02 14:00:00] first line', flush=True); "
              "print('[2026-12-02 14:00:01] second line', flush=True); time.sleep(60)")
    server = FoundServer(
        4242,
        "sglang",
        ("python",),
        1.0,
        log_elsewhere=LogElsewhere("journald", "journal of unit x.service", argv=reader),
    )

    async def one() -> Discovery:
        return Discovery((server,))

    targets = await resolve_targets(discover_fn=one)
    source = targets.log_source
    assert source is not None and targets.logs == [source.path]
    sources = LiveSources(targets, gpu=False, discover_fn=one)
    try:
        assert Path(source.path).name == "journal of unit x.service", "the label names the unit"
        assert any("following journal of unit x.service" in line for line in targets.lines), targets.lines
        assert await asyncio.to_thread(wait_for, lambda: "second line" in Path(source.path).read_text(), 15)
        reader_proc = source.impl.proc
    finally:
        await sources.aclose()
    assert reader_proc.poll() is not None, "the reader is stopped"
    assert not Path(source.path).exists(), "the spool is removed"


# -- the runtime's log files ----------------------------------------------------------------------


def test_docker_and_podman_log_files_are_decoded_and_followed(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    try:
        dj = tmp_path / f"{CID}-json.log"
        records = [
            {"log": "[2026-12-02 14:00:00] server started\n", "stream": "stdout", "time": "2026-12-02T14:00:00.1Z"},
            {"log": "[2026-12-02 14:00:01] a long line, ", "stream": "stderr", "time": "2026-12-02T14:00:01.1Z"},
            {"log": "continued\n", "stream": "stderr", "time": "2026-12-02T14:00:01.2Z"},
        ]
        dj.write_text("".join(json.dumps(r) + "\n" for r in records) + "not json\n")
        log = RuntimeLog("docker container 3f4e1b2c3f4e log", str(dj), "docker-json", spool, poll_s=0.05)
        assert log.start() == ""
        out = Path(log.path)
        assert wait_for(lambda: out.exists() and "continued" in out.read_text(), 15)
        assert out.read_text().splitlines() == ["[2026-12-02 14:00:00] server started",
                                                "[2026-12-02 14:00:01] a long line, continued"]
        with open(dj, "a") as f:
            f.write(json.dumps({"log": "[2026-12-02 14:00:02] appended\n", "stream": "stdout", "time": "t"}) + "\n")
        assert wait_for(lambda: "appended" in out.read_text(), 15)
        dj.rename(tmp_path / "old.log")  # the runtime rotates it
        dj.write_text(
            json.dumps({"log": "[2026-12-02 14:00:03] after rotation\n", "stream": "stdout", "time": "t"}) + "\n"
        )
        assert wait_for(lambda: "after rotation" in out.read_text(), 15)
        log.stop()

        k8s = tmp_path / "ctr.log"
        k8s.write_text("2026-12-02T14:00:00.1+00:00 stdout F [2026-12-02 14:00:00] one\n"
                       "2026-12-02T14:00:00.2+00:00 stderr P [2026-12-02 14:00:01] two \n"
                       "2026-12-02T14:00:00.3+00:00 stderr F halves\n")
        log2 = RuntimeLog("podman container x log", str(k8s), "k8s-file", spool, poll_s=0.05)
        assert log2.start() == ""
        out2 = Path(log2.path)
        assert wait_for(lambda: out2.exists() and "halves" in out2.read_text(), 15)
        assert out2.read_text().splitlines() == ["[2026-12-02 14:00:00] one", "[2026-12-02 14:00:01] two halves"]
        log2.stop()
    finally:
        spool.close()


def test_a_container_is_told_by_its_cgroup_and_its_log_found_by_runtime(tmp_path: Path, monkeypatch) -> None:
    me = os.getpid()
    docker = container_of(me, f"0::/system.slice/docker-{CID}.scope\n")
    assert docker == Container(me, "docker", CID, own_root=False, own_net=False)
    assert docker.name == f"docker container {CID[:12]}"
    assert container_of(me, f"0::/machine.slice/libpod-{CID}.scope/container\n").runtime == "podman"
    assert container_of(me, "0::/user.slice/user-0.slice/session-1.scope\n") is None, "not in a container"
    assert runtime_log_files(docker)[0] == (f"/var/lib/docker/containers/{CID}/{CID}-json.log", "docker-json")
    podman = container_of(me, f"0::/machine.slice/libpod-{CID}.scope\n")
    assert runtime_log_files(podman, 0)[0] == (
        f"/var/lib/containers/storage/overlay-containers/{CID}/userdata/ctr.log",
        "k8s-file",
    )

    proc = psutil.Process(me)
    # No runtime log file and no daemon answering (docker's does not run here): one line, what to pass.
    monkeypatch.setattr(
        serverlog, "runtime_log_files", lambda c, uid=None: [(str(tmp_path / "absent.log"), "docker-json")]
    )
    monkeypatch.setattr(serverlog, "logs_argv", lambda c: None)
    where, _, said = serverlog.log_elsewhere(proc, [], docker)
    assert where is None and len(said) == 1, said
    assert f"docker logs -f {CID[:12]} > server.log" in said[0] and "pass --log" in said[0]
    # Its json-file readable: followed, decoded.
    dj = tmp_path / "x-json.log"
    dj.write_text(json.dumps({"log": "hello\n", "stream": "stdout", "time": "t"}) + "\n")
    monkeypatch.setattr(serverlog, "runtime_log_files", lambda c, uid=None: [(str(dj), "docker-json")])
    where, how, said = serverlog.log_elsewhere(proc, [], docker)
    assert where is not None and where.path == str(dj) and where.path_format == "docker-json" and not said
    source, why = open_source(where)
    assert source is not None and why == ""
    try:
        assert wait_for(lambda: Path(source.path).exists() and Path(source.path).read_text() == "hello\n", 15)
    finally:
        source.stop()


# -- a container of the kernel's own making ------------------------------------------------------

needs_namespaces = pytest.mark.skipif(bool(can_make_containers()), reason=can_make_containers() or "ok")


@needs_namespaces
def test_a_server_in_a_container_has_its_log_read_through_its_root(tmp_path: Path) -> None:
    box = start_container(tmp_path, _sim(Path("/logs/port"), "--log-file", "/logs/server.log"))
    try:
        pid = server_in(box)
        port = int(read_inside(pid, "/logs/port"))
        assert not os.path.exists("/logs/server.log"), "the log exists only inside"
        found = _server(pid, want=lambda s: s.url is not None)
        assert found.url == f"http://127.0.0.1:{port}", "its network is the node's: the port is found as is"
        assert found.log_path == f"/proc/{pid}/root/logs/server.log" and found.log_how == "--log-file"
        assert "The server is fired up" in Path(found.log_path).read_text()
    finally:
        stop_group(box)


@needs_namespaces
def test_a_server_in_a_container_network_is_reached_through_its_published_port(tmp_path: Path) -> None:
    box = start_container(tmp_path, _sim(Path("/logs/port"), "--log-file", "/logs/server.log"), net=True)
    proxy = None
    try:
        pid = server_in(box)
        port = int(read_inside(pid, "/logs/port"))
        unpublished = _server(pid)
        assert unpublished.url is None
        said = [p for p in unpublished.problems if "inside the network of" in p]
        assert (
            len(said) == 1 and str(port) in said[0] and "pass --url http://127.0.0.1:PORT" in said[0]
        ), unpublished.problems
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            host_port = s.getsockname()[1]
        proxy = start_proxy(tmp_path, pid, port, host_port)
        found = _server(pid, want=lambda s: s.url is not None)
        assert found.url == f"http://127.0.0.1:{host_port}", found
        assert found.log_path == f"/proc/{pid}/root/logs/server.log"
    finally:
        if proxy is not None:
            stop_group(proxy)
        stop_group(box)


# -- what radixtop may not read -------------------------------------------------------------------

DESCRIBE = (
    "import asyncio, json, os, sys\n"
    "from radixtop.probes.discovery import Discovery, discover\n"
    "pids = {int(p) for p in sys.argv[1:]}\n"
    "found = asyncio.run(discover())\n"
    "print(json.dumps({s.pid: Discovery((s,)).describe() for s in found.servers if s.pid in pids}))\n"
)


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv is not installed")
def test_servers_radixtop_may_not_read_get_one_line_each(tmp_path: Path) -> None:
    """Discovery without capabilities: the kernel refuses it the servers' file descriptors, working
    directories, roots and sockets, as for another user's processes. Each refusal is one line
    naming what to pass; nothing raises."""
    ready = tmp_path / "port"
    out = open(tmp_path / "out.txt", "ab")  # noqa: SIM115
    plain = subprocess.Popen(_sim(ready), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
    out.close()
    boxes = []
    try:
        wait_port(ready)
        pids = [plain.pid]
        if not can_make_containers():
            box = start_container(tmp_path / "box", _sim(Path("/logs/port"), "--log-file", "/logs/server.log"))
            boxes.append(box)
            pids.append(server_in(box))
            read_inside(pids[-1], "/logs/port")
        got = subprocess.run(["setpriv", "--bounding-set=-all", "--inh-caps=-all", sys.executable, "-c", DESCRIBE,
                              *map(str, pids)], capture_output=True, text=True, timeout=120)
        assert got.returncode == 0 and "Traceback" not in got.stderr, got.stderr[-2000:]
        described = {int(k): v for k, v in json.loads(got.stdout).items()}
        lines = described[plain.pid]
        assert any(
            f"cannot read /proc/{plain.pid}/fd/1: permission denied" in l and "pass --log" in l for l in lines
        ), lines
        assert any("cannot see the ports" in l and "pass --url" in l for l in lines), lines
        if boxes:
            lines = described[pids[1]]
            said = [l for l in lines if "--log-file /logs/server.log" in l]
            assert len(said) == 1 and "cannot be read" in said[0] and "pass --log" in said[0], lines
            assert not any("log: /logs/server.log" in l for l in lines), "no path that is not this node's"
    finally:
        plain.terminate()
        plain.wait(10)
        for box in boxes:
            stop_group(box)


def test_a_containers_absolute_link_resolves_inside_its_root_never_to_a_file_of_the_node(tmp_path: Path) -> None:
    """Under /proc/PID/root the kernel resolves an absolute link against the reader's root,
    so a container could point its log at any host file; radixtop resolves it in the container."""
    from radixtop.probes.container import resolve_in_root

    secret = tmp_path / "host_secret.txt"
    secret.write_text("HOST_SECRET_LINE\n")
    root = tmp_path / "root"
    (root / "var" / "log").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "data" / "real.log").write_text("ok\n")
    (root / "var" / "log" / "sglang.log").symlink_to(secret)  # absolute: the node's file
    (root / "var" / "log" / "up.log").symlink_to("../../../../../../" + str(secret).lstrip("/"))  # climbs out
    (root / "var" / "log" / "good.log").symlink_to("/data/real.log")
    (root / "loop").symlink_to("/loop")
    assert resolve_in_root(str(root), "/var/log/sglang.log") == str(secret)  # inside root: root + that path
    assert not Path(str(root) + resolve_in_root(str(root), "/var/log/sglang.log")).exists()
    assert not Path(str(root) + resolve_in_root(str(root), "/var/log/up.log")).exists()
    assert Path(str(root) + resolve_in_root(str(root), "/var/log/good.log")).read_text() == "ok\n"
    with pytest.raises(OSError, match="too many links"):
        resolve_in_root(str(root), "/loop/x")
