"""`radixtop demo` in a real terminal: the incident shows up within a minute, and q leaves nothing
running (the simulator and the load generator are gone with the UI)."""

from __future__ import annotations

import shlex
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
    tmux = Tmux()
    command = f"cd {shlex.quote(str(tmp_path))} && {shlex.quote(sys.executable)} -m radixtop demo"
    try:
        tmux("new-session", "-d", "-s", "radixtop", "-x", "120", "-y", "40", command)
        pane_pid = int(tmux("display-message", "-p", "-t", "radixtop", "#{pane_pid}").strip())
        # The UI, the simulator and the load generator, with their command lines read while alive.
        seen: dict[int, str] = {}
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

        screen = tmux.wait_for(
            # The log pane may be narrow enough to cut the message after "Failed to".
            lambda s: "RadixCacheError: Failed to" in s or "Radix cache page lock failed" in s,
            "the seed's RadixCacheError on screen",
            timeout=60,
        )
        assert "first: TP" in screen  # the status line names the rank that spoke first

        tmux("send-keys", "-t", "radixtop", "q")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(pid) for pid in seen):
            time.sleep(0.2)
        left = [cmd for pid, cmd in seen.items() if _alive(pid)]
        assert not left, f"still running after q: {left}"
    finally:
        tmux.kill()
