"""`radixtop demo` in a real terminal: at 160x48 every pane at once with live numbers from the
simulator; at 80x24 one pane at a time behind 1-5."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tmux_helpers import Tmux

pytestmark = [
    pytest.mark.tmux,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


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
        # Its temporary directories (the demo's logs) in the test's own, not in the checkout.
        tmux.start([sys.executable, "-m", "radixtop", "demo", "--fault", "none"], repo,
                   env={**os.environ, "TMPDIR": str(tmp_path)})
        if size == (160, 48):
            screen = tmux.wait_for(_live_numbers, "every pane with live numbers", 60)
            assert "Vital signs" in screen and "GPU" in screen and "Processes" in screen
            assert re.search(r"\d+ server +\w+ +[\d.]+ MiB", screen), "the simulator's process with its RSS"
            return
        # The first key goes in as soon as the log pane is drawn, usually before the panes are
        # mounted (they come after the log's first frame): it must take effect when they are.
        # Back on the log (1): its lines, not FOLLOW (the status line shows that under every pane).
        tmux.wait_for(lambda s: "FOLLOW" in s, "the log pane", 60)
        for key, needle in (("2", r"pool 4,096 .* free [\d,]+"), ("5", r"token usage .*\d+% /metrics"),
                            ("3", r"GPU .*(ok|unavailable)"), ("4", r"\d+ server +\w+ +[\d.]+ MiB"),
                            ("1", r"(Prefill|Decode) batch, #")):
            tmux("send-keys", "-t", "radixtop", key)
            tmux.wait_for(lambda s, n=needle: re.search(n, s) is not None, f"pane {key}", 20)
    finally:
        tmux("send-keys", "-t", "radixtop", "q")
        _until_closed(tmux, 5.0)
        tmux.kill()


def _until_closed(tmux: Tmux, timeout_s: float) -> None:
    """Until the app has quit (its session ends with it), at most timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            tmux("has-session", "-t", "radixtop")
        except subprocess.CalledProcessError:
            return
        time.sleep(0.1)
