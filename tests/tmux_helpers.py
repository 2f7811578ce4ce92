"""A tmux server of the test's own, for the real-terminal checks (tests/test_tmux_*.py, test_demo_tmux.py)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

SESSION = "radixtop"


class Tmux:
    """One tmux server on a socket of its own (other sessions on the machine are untouched), one
    session named SESSION of width x height."""

    def __init__(self, width: int = 120, height: int = 40) -> None:
        self.socket = f"radixtop-test-{uuid.uuid4().hex[:8]}"
        self.size = (width, height)

    def __call__(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True, capture_output=True, text=True,
                              timeout=10).stdout

    def start(self, command: Sequence[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        """Run an argv (quoted here, never taken from outside the test) in the session, in cwd."""
        line = f"cd {shlex.quote(str(cwd))} && exec " + " ".join(shlex.quote(c) for c in command)
        # The tmux server takes our environment; pytest's COLUMNS/LINES would make Textual draw 80x24.
        base = env if env is not None else os.environ
        clean = {k: v for k, v in base.items() if k not in ("COLUMNS", "LINES", "TMUX")}
        if env is None or "TMPDIR" not in env:
            # What the command keeps in temporary directories (the demo's logs and bundles, 22 MB
            # a run) stays in the test's own directory, which pytest prunes, not in /tmp.
            clean["TMPDIR"] = str(cwd)
        subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", "new-session", "-d", "-s", SESSION,
                        "-x", str(self.size[0]), "-y", str(self.size[1]), line], check=True, timeout=10,
                       env=clean)

    def send(self, *keys: str) -> None:
        self("send-keys", "-t", SESSION, *keys)

    def capture(self, escapes: bool = False) -> str:
        return self("capture-pane", "-p", *(["-e"] if escapes else []), "-t", SESSION)

    def wait_for(self, condition: Callable[[str], bool], what: str, timeout: float, step: float = 0.1) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.capture()
            if condition(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}; screen:\n{screen}"
                                     f"\n{self.stacks()}")
            time.sleep(step)

    def stacks(self) -> str:
        """The Python stacks of the pane's process (py-spy, a radixtop dependency): what a timed-out
        wait was stuck behind, for the failure's report."""
        try:
            pid = self("display-message", "-p", "-t", SESSION, "#{pane_pid}").strip()
            spy = Path(sys.executable).with_name("py-spy")
            done = subprocess.run([str(spy), "dump", "--pid", pid], capture_output=True, text=True, timeout=30,
                                  check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"(no stacks: {exc})"
        return f"py-spy dump of pid {pid}:\n{done.stdout}{done.stderr}"

    def kill(self) -> None:
        kill_server(self.socket)


def kill_server(socket: str) -> None:
    """End the tmux server on ``socket`` and remove its socket file, which tmux leaves behind (runs
    would pile them up); the benchmarks' tmux wrappers end theirs here too."""
    subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, timeout=10, check=False)
    tmpdir = os.environ.get("TMUX_TMPDIR", "/tmp")
    Path(tmpdir, f"tmux-{os.getuid()}", socket).unlink(missing_ok=True)
