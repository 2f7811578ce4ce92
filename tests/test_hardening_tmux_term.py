"""In a real terminal (tmux): an ASCII locale gets ASCII drawing, not escapes; SIGTERM or SIGHUP
to radixtop or the demo leave the terminal as it was and no process behind."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest
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
