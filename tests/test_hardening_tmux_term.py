"""In a real terminal (tmux): an ASCII locale gets ASCII drawing, not escapes; SIGTERM or SIGHUP
to radixtop or the demo leave the terminal as it was and no process behind."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
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
                   env={**env, **extra})
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
                "#{mouse_button_flag} #{mouse_standard_flag} #{mouse_sgr_flag}").strip()


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
        assert _terminal_state(tmux) == "0 1 0 0 0 0", (
            "alternate screen, cursor or mouse reporting left as the UI set them"
        )
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
            else [sys.executable, "-m", "radixtop", "demo", "--fault", "none"])
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


# What a log (or the process that names its log) may hold: a clipboard write and a title change
# (OSC 52, OSC 2, ended by ST), a full reset and cursor saves (Fs/Fp escapes), the 8-bit C1 OSC,
# a bidi override, and Textual markup that would be a clickable quit.
HOSTILE = ("[@click=app.quit]CLICKQUIT[/] [/] \x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUveCB8IHNo\x1b\\\x1b]2;PWNED_TITLE\x1b\\ "
           "reset \x1bc save \x1b7\x1b8 keypad \x1b= c1 \x9d2;C1_TITLE\x9c bidi \u202eevil\u202c")


def test_escapes_in_a_log_files_name_and_lines_never_reach_the_terminal(tmp_path: Path) -> None:
    """The status line shows the file's name, the log pane and the evidence view (d)
    its lines; none of them passes an escape, a C1 control or a bidi override to the terminal,
    and none interprets markup."""
    name = "sim\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUveCB8IHNo\x1b\\\x1b]2;PWNED_NAME\x1b\\.log"
    log = tmp_path / name
    log.write_text(LINES + "[2026-12-02 14:00:02 TP0] RadixCacheError: "
                   f"Failed to lock memory page during dynamic prefix eviction {HOSTILE}\n"
                   + "".join(f"[2026-12-02 14:00:03 TP0] after {i} {HOSTILE}\n" for i in range(3)))
    raw = tmp_path / "raw.bin"
    tmux = Tmux(160, 48)
    try:
        tmux.start(["sh", "-c", 'printf "\\033]2;BASELINE\\007"; exec "$0" "$@"', sys.executable, "-m", "radixtop",
                    "--log", str(log), "--no-discover", "--no-gpu", "--from-start", "--readonly"], tmp_path)
        tmux("set", "-g", "set-clipboard", "on")
        tmux("pipe-pane", "-t", "radixtop", "-o", f"cat > {raw}")
        screen = tmux.wait_for(lambda s: "after 2" in s and "Findings (1)" in s, "the hostile lines on screen", 30)
        assert "[@click=app.quit]CLICKQUIT" in screen  # shown as text, not taken as markup
        tmux.send("Tab")
        tmux.send("d")
        tmux.wait_for(lambda s: "Finding (Esc closes)" in s, "the evidence view", 10)
        tmux.send("End")
        tmux.wait_for(lambda s: "after 2" in s and "Finding (Esc closes)" in s, "the evidence's last lines", 10)
        tmux.send("Escape")
        title = tmux("display", "-p", "-t", "radixtop", "#{pane_title}").strip()
        buffers = subprocess.run(["tmux", "-L", tmux.socket, "list-buffers"], capture_output=True, text=True,
                                 timeout=10).stdout
        written = raw.read_bytes()
    finally:
        tmux.kill()
    assert "PWNED" not in title and "C1_TITLE" not in title, title
    assert buffers.strip() == "", buffers
    for sequence in (b"\x1b]52", b"\x1b]2;", b"\x1bc", b"\x1b7", b"\x1b=", b"\xc2\x9d", "\u202e".encode()):
        assert sequence not in written, sequence
