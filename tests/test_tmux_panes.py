"""`radixtop demo` in a real terminal: at 160x48 every pane at once with live numbers from the
simulator; at 80x24 one pane at a time behind 1-5."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.tmux,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


class Tmux:
    def __init__(self, width: int, height: int) -> None:
        self.socket = f"radixtop-test-{uuid.uuid4().hex[:8]}"  # our own server: other sessions untouched
        self.size = (width, height)

    def __call__(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True, capture_output=True, text=True,
                              timeout=10).stdout  # fmt: skip

    def start(self, command: list[str], cwd: Path) -> None:
        line = f"cd {shlex.quote(str(cwd))} && exec " + " ".join(shlex.quote(c) for c in command)
        # The tmux server takes our environment; pytest's COLUMNS/LINES would make Textual draw 80x24.
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", "new-session", "-d", "-s", "radixtop",
                        "-x", str(self.size[0]), "-y", str(self.size[1]), line], check=True, timeout=10,
                       env=env)  # fmt: skip

    def capture(self) -> str:
        return self("capture-pane", "-p", "-t", "radixtop")

    def wait_for(self, condition, what: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.capture()
            if condition(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}; screen:\n{screen}")
            time.sleep(0.2)

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10, check=False)
        tmpdir = os.environ.get("TMUX_TMPDIR", "/tmp")
        Path(tmpdir, f"tmux-{os.getuid()}", self.socket).unlink(missing_ok=True)


def _live_numbers(screen: str) -> bool:
    return (
        "rank 0 ●" in screen
        and "rank 1 ●" in screen
        and re.search(r"pool 4,096 .* free [\d,]+", screen) is not None
        and re.search(r"token usage .*\d+% /metrics", screen) is not None
        and "server ok" in screen
    )


@pytest.mark.parametrize("size", [(160, 48), (80, 24)])
def test_demo_shows_the_panes_with_live_numbers(tmp_path: Path, size: tuple[int, int]) -> None:
    tmux = Tmux(*size)
    repo = Path(__file__).resolve().parents[1]
    try:
        tmux.start([sys.executable, "-m", "radixtop", "demo", "--fault", "none"], repo)
        if size == (160, 48):
            screen = tmux.wait_for(_live_numbers, "every pane with live numbers", 60)
            assert "Vital signs" in screen and "GPU" in screen and "Processes" in screen
            assert re.search(r"\d+ server +\w+ +[\d.]+ MiB", screen), "the simulator's process with its RSS"
            return
        tmux.wait_for(lambda s: "FOLLOW" in s, "the log pane", 60)
        for key, needle in (("2", r"pool 4,096 .* free [\d,]+"), ("5", r"token usage .*\d+% /metrics"),
                            ("3", r"GPU .*(ok|unavailable)"), ("4", r"\d+ server +\w+ +[\d.]+ MiB"),
                            ("1", r"FOLLOW")):  # fmt: skip
            tmux("send-keys", "-t", "radixtop", key)
            tmux.wait_for(lambda s, n=needle: re.search(n, s) is not None, f"pane {key}", 20)
    finally:
        tmux("send-keys", "-t", "radixtop", "q")
        time.sleep(1.0)
        tmux.kill()
