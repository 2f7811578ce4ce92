"""In a real terminal (tmux): an ASCII locale gets ASCII drawing, not escapes; SIGTERM or SIGHUP
to radixtop or the demo leave the terminal as it was and no process behind."""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
from pathlib import Path

import incident_helpers
import psutil
import pytest
from incident_helpers import wait_for
from tmux_helpers import Tmux

pytestmark = [
    pytest.mark.tmux,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

LINES = "".join(f"[2026-12-02 14:00:01 TP0] Decode batch, #running-req: {i}, token usage: 0.10\n" for i in range(30))
ASCII_ENVS = ({"PYTHONIOENCODING": "ascii"}, {"LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"})


@pytest.mark.parametrize("extra", ASCII_ENVS, ids=["PYTHONIOENCODING=ascii", "LC_ALL=C"])
def test_an_ascii_locale_gets_ascii_drawing_not_escapes(tmp_path: Path, extra: dict) -> None:
    log = tmp_path / "server.log"
    log.write_text(LINES)
    env = {k: v for k, v in os.environ.items() if k not in ("LANG", "LC_CTYPE", "PYTHONUTF8", "NO_COLOR")}
    tmux = Tmux(120, 40)
    try:
        tmux.start([sys.executable, "-m", "radixtop", "--log", str(log), "--no-discover", "--no-gpu"], tmp_path,
                   env={**env, **extra})  # fmt: skip
        screen = tmux.wait_for(lambda s: "q Quit" in s and "running-req: 29" in s, "radixtop to draw", timeout=30)
        assert not re.search(r"\\u[0-9a-f]{4}|\\x[0-9a-f]{2}", screen), screen
        assert screen.isascii()
        assert "FOLLOW" in screen and "|" in screen  # the panes' borders and separators, in ASCII
    finally:
        tmux.kill()


# Runs radixtop, then says how it ended and keeps the pane, as a shell prompt would.
SCRIPT = '"$0" -m radixtop "$@"; echo "EXITED $?"; exec sleep 120'


def _radixtop_pid(tmux: Tmux) -> int:
    shell = psutil.Process(int(tmux("display", "-p", "-t", "radixtop", "#{pane_pid}").strip()))
    assert wait_for(lambda: bool(shell.children()), 10)
    return shell.children()[0].pid


def _terminal_state(tmux: Tmux) -> str:
    return tmux("display", "-p", "-t", "radixtop", "#{alternate_on} #{cursor_flag} #{mouse_any_flag} "
                "#{mouse_button_flag} #{mouse_standard_flag} #{mouse_sgr_flag}").strip()  # fmt: skip


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
@pytest.mark.parametrize("demo", [False, True], ids=["ui", "demo"])
def test_a_signal_restores_the_terminal_and_stops_the_children(tmp_path: Path, sig, demo: bool) -> None:
    log = tmp_path / "server.log"
    log.write_text(LINES)
    args = ["demo", "--fault", "none"] if demo else ["--log", str(log), "--no-discover", "--no-gpu"]
    tmux = Tmux(120, 40)
    try:
        tmux.start(["sh", "-c", SCRIPT, sys.executable, *args], tmp_path)
        tmux.wait_for(lambda s: "q Quit" in s, "radixtop to draw", timeout=60)
        pid = _radixtop_pid(tmux)
        children = psutil.Process(pid).children(recursive=True)
        assert len(children) >= (2 if demo else 0)  # the demo's simulator and load
        assert _terminal_state(tmux).split()[0] == "1"  # the alternate screen is on
        os.kill(pid, sig)
        screen = tmux.wait_for(lambda s: "EXITED" in s, "radixtop to exit", timeout=20)
        assert f"EXITED {128 + sig}" in screen
        assert _terminal_state(tmux) == "0 1 0 0 0 0", "alternate screen, cursor or mouse reporting left as the UI set them"
        assert "Traceback" not in screen
        if demo:
            assert "radixtop demo: stopped the simulator" in screen
        assert wait_for(lambda: all(incident_helpers.gone(c.pid) for c in children), 10), "a child was left running"
    finally:
        tmux.kill()


@pytest.mark.parametrize("what", ["ui", "demo"])
def test_a_terminal_that_goes_away_leaves_no_radixtop_behind(tmp_path: Path, what: str) -> None:
    """The tmux server (or the ssh session) gone: radixtop gets SIGHUP and its terminal is gone,
    so restoring it can block for ever; the quit path gets a few seconds, then the process ends,
    and the demo's children with it."""
    log = tmp_path / "server.log"
    log.write_text(LINES)
    argv = ([sys.executable, "-m", "radixtop", "--log", str(log), "--no-discover", "--no-gpu"] if what == "ui"
            else [sys.executable, "-m", "radixtop", "demo", "--fault", "none"])  # fmt: skip
    tmux = Tmux(120, 40)
    try:
        tmux.start(argv, tmp_path)
        tmux.wait_for(lambda s: "q Quit" in s, "radixtop to draw", timeout=30)
        pid = int(tmux("display-message", "-p", "-t", "radixtop", "#{pane_pid}").strip())
        family = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    finally:
        tmux.kill()  # the terminal goes away under it
    assert wait_for(lambda: all(incident_helpers.gone(p) for p in family), 20), [
        " ".join(psutil.Process(p).cmdline()) for p in family if not incident_helpers.gone(p)
    ]
