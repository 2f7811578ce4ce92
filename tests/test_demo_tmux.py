"""`radixtop demo` in a real terminal: the incident shows up within a minute, and q leaves nothing
running (the simulator and the load generator are gone with the UI)."""

from __future__ import annotations

import shutil
import sys
import time

import psutil
import pytest
from tmux_helpers import Tmux

pytestmark = [
    pytest.mark.tmux,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_demo_shows_the_incident_and_q_leaves_nothing_running(tmp_path) -> None:
    tmux = Tmux(120, 40)
    try:
        tmux.start([sys.executable, "-m", "radixtop", "demo"], tmp_path)
        pane_pid = int(tmux("display-message", "-p", "-t", "radixtop", "#{pane_pid}").strip())
        # The UI, the simulator and the load generator, with their command lines read while alive.
        seen: dict[int, str] = {pane_pid: " ".join(psutil.Process(pane_pid).cmdline())}  # the UI (exec'd)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(seen) < 3:
            for proc in psutil.Process(pane_pid).children(recursive=True):
                try:
                    seen.setdefault(proc.pid, " ".join(proc.cmdline()))
                except psutil.Error:
                    pass
            time.sleep(0.1)
        cmdlines = list(seen.values())
        assert any("radixtop sim" in c for c in cmdlines), cmdlines
        assert any("radixtop.sim.load" in c for c in cmdlines), cmdlines

        # What a person reads, which no flood of lines can scroll away: the findings list names
        # the seed's failure and the status line the rank that spoke first.
        screen = tmux.wait_for(
            lambda s: "Radix cache page lock failed" in s and "first: TP" in s,
            "the seed's failure in the findings list and the first rank in the status line",
            timeout=60,
        )
        # The crash stays readable: the refused calls' access lines are folded into counted rows,
        # so the traceback's last line is still in the log pane once the server is down.
        screen = tmux.wait_for(lambda s: "DOWN since" in s, "the server DOWN in the status line", timeout=30)
        assert "RadixCacheError: Failed to" in screen, screen

        tmux("send-keys", "-t", "radixtop", "q")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(pid) for pid in seen):
            time.sleep(0.2)
        left = [cmd for pid, cmd in seen.items() if _alive(pid)]
        assert not left, f"still running after q: {left}"
    finally:
        tmux.kill()
