"""A server whose output goes to a terminal, in a real tmux (a server of the test's own, on its own
socket): discovery finds the pane by its tty; the pane's history shows at once, new lines are read
every second, `tmux pipe-pane` (once agreed) copies every line and is undone at the end; a pane that
closes is said once; a terminal that is no tmux pane gets one line saying what to do. End to end:
`radixtop` with no arguments, in one pane, fills its log pane from a simulator writing only to
another pane; with two servers it asks which one, and `s` switches."""

from __future__ import annotations

import asyncio
import os
import pty
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from incident_helpers import wait_for
from launch_helpers import wait_port

from radixtop.probes.discovery import Discovery, FoundServer, discover
from radixtop.probes.panelog import PaneLog, new_lines
from radixtop.probes.spool import Spool
from radixtop.probes.terminal import tmux

pytestmark = [
    pytest.mark.tmux,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


def _clean(env: dict[str, str] | os._Environ) -> dict[str, str]:
    """The environment for tmux: pytest's COLUMNS/LINES would make Textual draw 80x24 in a pane."""
    return {k: v for k, v in env.items() if k not in ("TMUX", "COLUMNS", "LINES", "NO_COLOR")}


class OwnTmux:
    """A tmux server on a socket of the test's own. With `isolated`, it runs in a PID namespace of
    its own (unshare), so that `radixtop` in it sees only the servers the test started, whatever
    else runs on this machine; its server process is ours (tmux -D: not a daemon)."""

    def __init__(self, where: Path, isolated: bool = False) -> None:
        self.socket = str(where / "tmux.sock")
        self.server: subprocess.Popen | None = None
        if isolated:
            self.server = subprocess.Popen(
                ["unshare", "--pid", "--fork", "--mount-proc", "tmux", "-S", self.socket, "-f", "/dev/null", "-D"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_clean(os.environ),
            )
            deadline = time.monotonic() + 10
            while not os.path.exists(self.socket):
                if self.server.poll() is not None or time.monotonic() > deadline:
                    err = self.server.stderr.read().decode() if self.server.stderr else ""
                    self.kill()
                    pytest.skip(f"no PID namespace here for an isolated tmux: {err.strip()[:200]}")
                time.sleep(0.05)

    def __call__(self, *args: str) -> str:
        got = tmux(self.socket, *args, timeout_s=10)
        assert got.returncode == 0, (args, got.stderr)
        return got.stdout

    def start(self, argv: list[str], *, env: dict[str, str] | None = None, split: bool = False,
              window: bool = False, width: int = 160, height: int = 40) -> str:
        """Run an argv (never a string from outside the test) in a new session, a new pane below
        the first, or a new window; its pane id."""
        import shlex

        line = "exec " + " ".join(shlex.quote(a) for a in argv)
        base = _clean(env or os.environ)
        exe = shutil.which("tmux") or "tmux"
        if window:
            cmd = [exe, "-S", self.socket, "new-window", "-d", "-t", "t", "-P", "-F", "#{pane_id}", line]
        elif split:
            cmd = [exe, "-S", self.socket, "split-window", "-d", "-v", "-l", str(height), "-t", "t:0", "-P",
                   "-F", "#{pane_id}", line]
        else:
            cmd = [exe, "-S", self.socket, "-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", str(width),
                   "-y", "80", "-P", "-F", "#{pane_id}", line]
        return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=10, env=base).stdout.strip()

    def capture(self, pane: str) -> str:
        return self("capture-pane", "-p", "-t", pane)

    def wait_for(self, pane: str, condition: Callable[[str], bool], what: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.capture(pane)
            if condition(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}; screen:\n{screen}")
            time.sleep(0.2)

    def pipe_of(self, pane: str) -> str:
        return self("display-message", "-p", "-t", pane, "#{pane_pipe}").strip()

    def kill(self) -> None:
        tmux(self.socket, "kill-server")
        if self.server is not None:
            try:
                self.server.wait(10)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait(10)
            if self.server.stderr is not None:
                self.server.stderr.close()
        Path(self.socket).unlink(missing_ok=True)


def _sim_argv(ready: Path) -> list[str]:
    return [sys.executable, "-m", "radixtop", "sim", "--port", "0", "--ready-file", str(ready), "--step-ms", "1"]


def _found(pid_or_port: Callable[[FoundServer], bool], tries: int = 40) -> FoundServer:
    for _ in range(tries):
        for s in asyncio.run(discover(exclude={os.getpid()})).servers:
            if pid_or_port(s):
                return s
        time.sleep(0.25)
    raise AssertionError("the server was not discovered")


def _generate(port: int, text: str) -> None:
    got = httpx.post(f"http://127.0.0.1:{port}/generate", json={"text": text, "sampling_params": {"max_new_tokens": 2}},
                     timeout=10)
    assert got.status_code == 200


def test_new_lines_after_two_reads_of_a_pane() -> None:
    assert new_lines([], ["a", "b"]) == (["a", "b"], False)
    assert new_lines(["a", "b", "c"], ["b", "c", "d", "e"], anchor=2) == (["d", "e"], False)
    assert new_lines(["a", "b"], ["a", "b"]) == ([], False)
    assert new_lines(["x", "y"], ["p", "q"], anchor=2) == (["p", "q"], True), "the last lines seen are gone: a gap"


@dataclass
class PaneServer:
    own: OwnTmux
    pane: str
    port: int
    server: FoundServer
    spool: Spool


@pytest.fixture
def pane_server(tmp_path: Path) -> Iterator[PaneServer]:
    """A simulator writing only to a tmux pane, discovered; a spool directory for its log."""
    own = OwnTmux(tmp_path)
    spool = Spool(str(tmp_path))
    try:
        ready = tmp_path / "port"
        pane = own.start(_sim_argv(ready))
        port = wait_port(ready)
        yield PaneServer(own, pane, port, _found(lambda s: s.port == port), spool)
    finally:
        spool.close()
        own.kill()


def test_a_server_in_a_tmux_pane_is_found_read_piped_and_restored(pane_server: PaneServer) -> None:
    own, pane, port, server = pane_server.own, pane_server.pane, pane_server.port, pane_server.server
    notes: list[str] = []
    where = server.log_elsewhere
    assert server.log_path is None and where is not None and where.pane is not None, server
    assert where.pane.pane_id == pane and where.pane.socket == own.socket
    assert not any("pass --log" in p for p in server.problems), server.problems
    assert any(f"log: tmux pane {pane} (t:0.0)" in line for line in Discovery((server,)).describe())

    log = PaneLog(where.pane, pane_server.spool, on_note=notes.append, poll_s=0.2)
    assert log.start() == ""
    assert "The server is fired up" in Path(log.path).read_text(), "the pane's history at once"
    assert Path(log.path).name == f"tmux pane {pane} (t:0.0)", "the source's label names the pane"
    _generate(port, "read by polling")
    assert wait_for(lambda: "Prefill batch" in Path(log.path).read_text(), 15), "new lines read from the pane"
    assert own.pipe_of(pane) == "0", "reading changes nothing in tmux"

    assert log.pipe() == "" and log.mode == "piped"
    assert own.pipe_of(pane) == "1"
    before = Path(log.path).read_text().count("POST /generate")
    _generate(port, "copied by pipe-pane")
    assert wait_for(lambda: Path(log.path).read_text().count("POST /generate") > before, 15), "piped lines arrive"
    log.stop()
    assert own.pipe_of(pane) == "0", "the pipe is undone"
    assert not notes, notes


PIPING = (
    "import sys, time\n"
    "from radixtop.probes.panelog import PaneLog\n"
    "from radixtop.probes.spool import Spool\n"
    "from radixtop.probes.terminal import Pane\n"
    "log = PaneLog(Pane(*sys.argv[1:5]), Spool(sys.argv[5]))\n"
    "assert log.start() == '' and log.pipe() == '', log.mode\n"
    "print('piped', log.path, flush=True)\n"
    "time.sleep(120)\n"
)


def test_a_pipe_ends_with_a_radixtop_killed_without_its_clean_up(pane_server: PaneServer, tmp_path: Path) -> None:
    """radixtop killed (SIGKILL, or its pane closed) cannot undo its pipe: the pipe's own command
    ends with it, and tmux closes the pane's pipe."""
    pane = pane_server.server.log_elsewhere.pane  # type: ignore[union-attr]
    holder = subprocess.Popen([sys.executable, "-c", PIPING, pane.socket, pane.pane_id, pane.target, pane.tty,
                               str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().startswith("piped")
        assert pane_server.own.pipe_of(pane_server.pane) == "1"
        holder.kill()
        holder.wait(10)
        # The pipe's command sees radixtop gone within a second; tmux sees the command gone when the
        # pane next prints.
        def closed() -> bool:
            _generate(pane_server.port, "printed after radixtop died")
            return pane_server.own.pipe_of(pane_server.pane) == "0"

        assert wait_for(closed, 10, 0.5), "the pipe outlived radixtop"
    finally:
        holder.kill()
        holder.wait(10)
        if holder.stdout is not None:
            holder.stdout.close()


def test_a_pane_that_closes_is_said_once(pane_server: PaneServer) -> None:
    notes: list[str] = []
    where = pane_server.server.log_elsewhere
    assert where is not None and where.pane is not None
    log = PaneLog(where.pane, pane_server.spool, on_note=notes.append, poll_s=0.2)
    assert log.start() == ""
    pane_server.own("kill-pane", "-t", pane_server.pane)
    assert wait_for(lambda: bool(notes), 15), "the closed pane is said"
    time.sleep(0.5)
    assert len(notes) == 1 and "closed" in notes[0] and "--log" in notes[0], notes
    assert "Traceback" not in notes[0]
    assert log.pipe() != "" and log.mode == "closed", "no pipe on a closed pane"
    log.stop()


def test_a_terminal_that_is_no_tmux_pane_says_what_to_do(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    ready = tmp_path / "port"
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}
    env["TMUX_TMPDIR"] = str(tmp_path)  # no tmux server for this user there either
    proc = subprocess.Popen(_sim_argv(ready), stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    os.close(slave)
    try:
        port = wait_port(ready)
        server = _found(lambda s: s.pid == proc.pid and s.port == port)
        assert server.log_path is None and server.log_elsewhere is None
        said = [p for p in server.problems if "terminal" in p]
        assert len(said) == 1, server.problems
        assert "no tmux pane" in said[0] and "--log-file PATH" in said[0] and "radixtop --log PATH" in said[0], said
    finally:
        proc.terminate()
        proc.wait(10)
        os.close(master)


# -- end to end: radixtop with no arguments, in a tmux of its own PID namespace -------------------


def _radixtop_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "RADIXTOP_PANES")}


@pytest.mark.slow
def test_the_log_pane_fills_from_a_server_that_writes_only_to_its_terminal(tmp_path: Path) -> None:
    own = OwnTmux(tmp_path, isolated=True)
    try:
        ready = tmp_path / "port"
        server_pane = own.start(_sim_argv(ready))
        port = wait_port(ready)
        ui = own.start([sys.executable, "-m", "radixtop", "--no-gpu"], env=_radixtop_env(), split=True)
        screen = own.wait_for(ui, lambda s: "through tmux pipe-pane?" in s, "the question about pipe-pane")
        assert f"tmux pane {server_pane} (t:0.0)" in screen
        own("send-keys", "-t", ui, "y")
        screen = own.wait_for(ui, lambda s: "through tmux pipe-pane (undone when radixtop exits)" in s, "the pipe")
        assert "The server is fired up" in screen, "the pane's history is in the log pane"
        assert own.pipe_of(server_pane) == "1"
        _generate(port, "shown in the log pane")
        screen = own.wait_for(ui, lambda s: "Prefill batch" in s and "POST /generate" in s, "the new lines")
        assert f"tmux pane {server_pane} (t:0.0) ok" in screen, "the status line names the pane"
        own("send-keys", "-t", ui, "q")
        assert wait_for(lambda: own.pipe_of(server_pane) == "0", 10), "the pipe is undone when radixtop exits"
    finally:
        own.kill()


@pytest.mark.slow
def test_several_servers_are_listed_picked_and_switched(tmp_path: Path) -> None:
    own = OwnTmux(tmp_path, isolated=True)
    try:
        ports = {}
        for name in ("alpha", "beta"):
            ready = tmp_path / f"{name}.port"
            argv = [*_sim_argv(ready), "--log-file", str(tmp_path / f"{name}.log")]
            own.start(argv, window=name == "beta")
            ports[name] = wait_port(ready)
        ui = own.start([sys.executable, "-m", "radixtop", "--no-gpu"], env=_radixtop_env(), split=True, height=38)
        screen = own.wait_for(ui, lambda s: "which one to watch?" in s, "the server picker")
        rows = [line for line in screen.splitlines() if "pid " in line and "radixtop sim" in line]
        assert len(rows) == 2, screen
        for row in rows:
            assert "radixtop/sim-model" in row and " up " in row and ".log" in row, row
        order = [next(n for n, p in ports.items() if str(p) in row) for row in rows]
        assert sorted(order) == ["alpha", "beta"]
        own("send-keys", "-t", ui, "Down", "Enter")
        second, first = order[1], order[0]
        own.wait_for(ui, lambda s: f"{second}.log ok" in s, f"watching {second} (its log in the status line)")
        own("send-keys", "-t", ui, "s")
        screen = own.wait_for(ui, lambda s: "which one to watch?" in s, "the picker again")
        marked = next(line for line in screen.splitlines() if "▶" in line)
        assert str(ports[second]) in marked, "the server watched is marked"
        own("send-keys", "-t", ui, "Up", "Enter")
        screen = own.wait_for(ui, lambda s: f"{first}.log ok" in s, f"watching {first} after the switch")
        assert "switching to radixtop sim" in screen and f"127.0.0.1:{ports[first]}" in screen
        assert f"{second}.log" not in screen.splitlines()[-2], "the old log is no longer followed"
        own("send-keys", "-t", ui, "q")
    finally:
        own.kill()
