"""probes/discovery on real processes: the simulator found with its port, log file and debug
endpoints; gone when killed; found again on its new pid; an SGLang-like launcher (a real process
running `python -m sglang.launch_server` from a stand-in module) with titled schedulers and its
stdout in a file, or in a pipe."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from pane_helpers import start_sim, stop

from radixtop.probes import discovery
from radixtop.probes.discovery import Discovery, discover
from radixtop.probes.server_cmdline import classify

# A stand-in `sglang.launch_server`: serves /v1/models and /server_info on --port, starts two children
# titled like SGLang's schedulers, and prints to stdout.
LAUNCHER = textwrap.dedent(
    """
    import json, subprocess, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    port = int(sys.argv[sys.argv.index("--port") + 1])
    kids = [subprocess.Popen([f"sglang::scheduler_TP{r}", "-c", "import time; time.sleep(120)"],
                             executable=sys.executable) for r in range(2)]
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"version": "0.5.23", "port": port, "tp_size": 2}).encode()
            self.send_response(200 if self.path in ("/v1/models", "/server_info") else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    print("[2026-12-02 14:00:00] server started", flush=True)
    try:
        HTTPServer(("127.0.0.1", port), H).serve_forever()
    finally:
        for k in kids:
            k.kill()
    """
)


def _discover() -> Discovery:
    return asyncio.run(discover(exclude={os.getpid()}))


def _find(pid: int, tries: int = 40, ranks: int = 0):
    """Discovery until it has the server's URL (and its schedulers: a child seen between fork and
    exec still carries its parent's command line, so the first look may not show them)."""
    for _ in range(tries):
        found = next((s for s in _discover().servers if s.pid == pid), None)
        if found is not None and found.url is not None and len(found.ranks) >= ranks:
            return found
        time.sleep(0.25)
    return next((s for s in _discover().servers if s.pid == pid), None)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_classify_command_lines() -> None:
    assert classify(["python3", "-m", "sglang.launch_server", "--model-path", "m"]) == "sglang"
    assert classify(["/usr/bin/python", "-u", "-m", "sglang.launch_server"]) == "sglang"
    assert classify(["sglang", "serve", "--model-path", "m"]) == "sglang"
    assert classify(["sglang::scheduler_TP3"]) == "sglang-child"
    assert classify(["python", "-m", "vllm.entrypoints.openai.api_server"]) == "vllm"
    assert classify(["/venv/bin/vllm", "serve", "m"]) == "vllm"
    assert classify(["python", "-m", "radixtop", "sim", "--port", "0"]) == "sim"
    assert classify(["bash", "-c", "python -m sglang.launch_server"]) is None, "a wrapper is not the server"
    assert classify(["python", "-m", "pytest", "sglang"]) is None
    assert classify(["grep", "sglang.launch_server"]) is None


def test_the_simulator_is_found_lost_and_found_again(tmp_path: Path) -> None:
    proc, url, log = start_sim(tmp_path / "a", "--tp-size", "2")
    try:
        found = _find(proc.pid)
        assert found is not None, "the simulator was not discovered"
        assert found.kind == "sim" and found.url == url
        assert found.log_path == str(log) and found.log_how == "--log-file"
        assert len(found.instrument_urls) == 2
        assert int(url.rsplit(":", 1)[1]) in found.ports
        lines = Discovery((found,)).describe()
        assert any(f"radixtop sim pid {proc.pid}" in line and url in line for line in lines)
        assert any(str(log) in line for line in lines)
    finally:
        stop(proc)
    assert all(s.pid != proc.pid for s in _discover().servers), "a killed server is no longer listed"
    again, url2, _ = start_sim(tmp_path / "b")
    try:
        found2 = _find(again.pid)
        assert found2 is not None and found2.pid != proc.pid and found2.url == url2
    finally:
        stop(again)


@pytest.mark.parametrize("stdout_to", ["file", "pipe"])
def test_an_sglang_launcher_with_schedulers(tmp_path: Path, stdout_to: str) -> None:
    pkg = tmp_path / "mods" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(LAUNCHER)
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "mods")}
    log = tmp_path / "server.log"
    sink = open(log, "wb") if stdout_to == "file" else subprocess.PIPE  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", "x", "--port", str(port)],
        stdout=sink, stderr=subprocess.STDOUT, env=env,
    )
    try:
        found = _find(proc.pid, ranks=2)
        assert found is not None and found.kind == "sglang"
        assert found.url == f"http://127.0.0.1:{port}"
        assert found.ranks == ("TP0", "TP1")
        assert found.version == "0.5.23"
        assert any("no radixtop debug endpoint" in p for p in found.problems)
        if stdout_to == "file":
            assert found.log_path == str(log) and found.log_how == "stdout"
        else:
            assert found.log_path is None
            assert any("is a pipe" in p and "pass --log" in p for p in found.problems)
    finally:
        for child in psutil.Process(proc.pid).children():
            child.kill()
        proc.kill()
        proc.wait(10)
        if sink is not subprocess.PIPE:
            sink.close()
        elif proc.stdout is not None:
            proc.stdout.close()


# Schedulers that run radixtop's own debug endpoint, as the plugin starts it in SGLang's schedulers
# (rank r on RADIXTOP_INSTRUMENT_PORT + r); SGLang's /server_info does not list them.
INSTRUMENTED = LAUNCHER.replace(
    '"-c", "import time; time.sleep(120)"',
    '"-c", f"import os, time; from radixtop.instrument.endpoint import InstrumentEndpoint; '
    "ep = InstrumentEndpoint(rank={r}, base_port=int(os.environ['RADIXTOP_INSTRUMENT_PORT'])); "
    'ep.start(); time.sleep(120)"',
)


def _free_run(n: int) -> int:
    """The first of n consecutive free loopback ports."""
    import socket

    for _ in range(50):
        base = _free_port()
        socks = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    pytest.skip(f"no {n} consecutive free ports found")


def test_the_ranks_endpoints_are_found_among_the_schedulers_ports(tmp_path: Path) -> None:
    """A real SGLang's /server_info knows nothing of radixtop: the endpoints are found on the
    schedulers' listening ports in the instrument's range (the base from the server's environment),
    each answering radixtop's health path, in rank order."""
    pkg = tmp_path / "mods" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    assert INSTRUMENTED != LAUNCHER
    (pkg / "launch_server.py").write_text(INSTRUMENTED)
    port, base = _free_port(), _free_run(2)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "mods"), "RADIXTOP_INSTRUMENT_PORT": str(base)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", "x", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )
    try:
        found = None
        for _ in range(60):  # the endpoints come up after the schedulers import radixtop
            found = _find(proc.pid, ranks=2)
            if found is not None and len(found.instrument_urls) == 2:
                break
            time.sleep(0.25)
        assert found is not None, "the launcher was not found"
        assert found.instrument_urls == (f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"), found
        assert not any("no radixtop debug endpoint" in p for p in found.problems), found.problems
        # An evidence bundle of that server finds them the same way (given only its URL).
        from radixtop.incident.bundle.bundle import take_bundle

        bundle = take_bundle(tmp_path / "out", url=f"http://127.0.0.1:{port}", archive=False)
        for rank in (0, 1):
            events = json.loads((bundle.path / "radix" / f"rank{rank}-events.json").read_text())
            assert events["rank"] == rank, events
        assert "radix/snapshots.json" not in bundle.notes
    finally:
        for child in psutil.Process(proc.pid).children():
            child.kill()
        proc.kill()
        proc.wait(10)


def test_nothing_found_says_what_to_do() -> None:
    lines = Discovery((), ("3 processes could not be read",)).describe()
    assert lines[0] == "No SGLang or vLLM server found on this node."
    assert any("radixtop demo" in line for line in lines)
    assert any("--url" in line for line in lines)


def test_a_zombie_is_not_counted_as_another_users_process() -> None:
    """A dead child not yet reaped has no command line left: it hides no server, and root was
    told to "run as root" for it."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.02)
        zombie = psutil.Process(child.pid)
        assert zombie.status() == psutil.STATUS_ZOMBIE
        assert not discovery._unreadable(zombie)
        _, notes = discovery.find_candidates()
    finally:
        child.wait(10)
    if os.geteuid() == 0:  # root reads every other process: no note at all
        assert not any("could not be read" in note for note in notes), notes


def test_the_endpoints_base_port_is_read_from_the_servers_environment_as_the_instrument_reads_it(caplog) -> None:
    """One reading of RADIXTOP_INSTRUMENT_PORT for the instrument and for discovery: a bad or
    out-of-range value means the instrument's default, 0 means any free port (not guessable);
    and radixtop logs nothing about another process's environment."""
    from radixtop.instrument.config import InstrumentConfig
    from radixtop.probes.discovery import _instrument_base_port

    class Proc:  # psutil.Process at its one seam here
        def __init__(self, env: dict[str, str]) -> None:
            self.env = env

        def environ(self) -> dict[str, str]:
            return self.env

    default = InstrumentConfig().base_port
    for value, want in (("", default), ("40000", 40000), ("0", None), ("70000", default), ("x", default)):
        env = {"RADIXTOP_INSTRUMENT_PORT": value}
        assert _instrument_base_port(Proc(env)) == want, value
        assert (InstrumentConfig.from_env(env, warn=False).base_port or None) == want
    assert not caplog.records


async def test_rediscovery_asks_a_server_it_described_in_full_nothing_more(tmp_path: Path) -> None:
    """Every request is a line in the server's access log: discovery runs every 30 s, and a server
    it has described in full (same pid, same start) is taken as it was, not asked again."""
    from radixtop.probes.discovery import Rediscovery

    proc, url, log = start_sim(tmp_path / "sim")
    try:
        again = Rediscovery()
        first = await again()
        asked = log.read_text().count('"GET ')
        assert asked > 0
        second = await again()
        third = await again()
        mine = [s for s in first.servers if s.pid == proc.pid]
        assert mine and mine[0].url == url and mine[0].instrument_urls
        assert (
            [s for s in third.servers if s.pid == proc.pid] == mine == [s for s in second.servers if s.pid == proc.pid]
        )
        assert log.read_text().count('"GET ') == asked, "a server described in full was asked again"
    finally:
        stop(proc)


async def test_a_server_the_user_named_is_the_only_one_asked(tmp_path: Path, monkeypatch) -> None:
    """radixtop --url A on a node that also runs B: B's access log gets no line from it."""
    from radixtop.probes.discovery import Rediscovery

    a, url_a, log_a = start_sim(tmp_path / "a")
    b, url_b, log_b = start_sim(tmp_path / "b")
    try:
        again = Rediscovery(url_a)
        found = await again()
        assert [s.url for s in found.servers] == [url_a]
        assert log_a.read_text().count('"GET ') > 0 and log_b.read_text().count('"GET ') == 0
        # Found listening on the port once, the same process's sockets are not read again.
        read: list[int] = []
        listens_on = discovery._listens_on
        monkeypatch.setattr(discovery, "_listens_on",
                            lambda cand, port: read.append(cand.proc.pid) or listens_on(cand, port))
        # Nobody to ask: no HTTP client is made (httpx's import and SSL context, 60 ms of CPU).
        clients: list[float] = []
        make_client = discovery.make_client
        monkeypatch.setattr(discovery, "make_client",
                            lambda timeout_s: clients.append(timeout_s) or make_client(timeout_s))
        assert [s.url for s in (await again()).servers] == [url_a]
        assert a.pid not in read and b.pid in read
        assert clients == []
        # A URL no server on the node listens on (a container's published port): every one is described.
        everyone = await Rediscovery("http://127.0.0.1:1")()
        assert {url_a, url_b} <= {s.url for s in everyone.servers}
    finally:
        stop(a)
        stop(b)
