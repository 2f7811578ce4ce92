"""End to end in a real terminal: radixtop under tmux follows a file, and a signature line appended
to it shows up highlighted (checked in the escape codes tmux captured) and listed as a finding."""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest
from tmux_helpers import Tmux

pytestmark = [
    pytest.mark.tmux,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

SIGQUIT = "[2026-12-02 14:03:14.964] Received sigquit from a child process. It usually means the child failed."
ORDINARY = (
    "[2026-12-02 14:03:13.281 TP0] Decode batch, #running-req: 61, #token: 387604, token usage: 0.94, "
    "cuda graph: True, gen throughput (token/s): 1782.15, #queue-req: 11"
)

_SGR = re.compile(r"\x1b\[([0-9;:]*)m")


def attributes_at(line: str, needle: str) -> set[str]:
    """The SGR attributes (bold, underline, reverse) in effect where `needle` starts in a line
    captured with `tmux capture-pane -e`."""
    position = _SGR.sub(lambda m: "\x00" * len(m.group(0)), line).find(needle)
    assert position >= 0, f"{needle!r} not in {line!r}"
    attrs: set[str] = set()
    for m in _SGR.finditer(line[:position]):
        params = [int(p) if p.isdigit() else 0 for p in re.split("[;:]", m.group(1) or "0")]
        i = 0
        while i < len(params):
            p = params[i]
            if p in (38, 48, 58):  # a colour: skip its arguments
                i += 2 if params[i + 1 : i + 2] == [5] else 4
            elif p == 0:
                attrs.clear()
            elif p in (1, 4, 7):
                attrs.add({1: "bold", 4: "underline", 7: "reverse"}[p])
            elif p in (22, 24, 27):
                attrs.discard({22: "bold", 24: "underline", 27: "reverse"}[p])
            i += 1
    return attrs


def test_appended_signature_is_highlighted_and_listed_in_a_real_terminal(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(ORDINARY + "\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    tmux = Tmux(120, 40)
    try:
        tmux.start([sys.executable, "-m", "radixtop", "--log", str(log)], tmp_path, env=env)
        tmux.wait_for(lambda s: "FOLLOW" in s and "q Quit" in s, "radixtop to start", timeout=30)
        with open(log, "a", encoding="utf-8") as f:
            f.write(ORDINARY + "\n" + SIGQUIT + "\n")
        appended = time.monotonic()
        screen = tmux.wait_for(
            lambda s: "Received sigquit from a child process. It" in s, "the appended line", timeout=10
        )
        lag = time.monotonic() - appended
        # The last line of a file waits up to AFTER_WAIT for lines after it before it is reported.
        screen = tmux.wait_for(lambda s: "Findings (1)" in s, "the finding", timeout=10)
        assert "Received sigquit from a child" in screen.split("Findings (1)", 1)[1]  # in the findings panel
        assert "first: 14:03:14.964 Received sigquit" in screen  # the initiating line (TP=1: no rank)
        colored = tmux.capture(escapes=True)
        line = next(l for l in colored.splitlines() if "Received sigquit from a child process. It" in _SGR.sub("", l))
        assert _SGR.sub("", line).startswith("!! ")
        assert {"bold", "reverse"} <= attributes_at(line, "Received sigquit from a child process. It")
        plain = next(l for l in colored.splitlines() if "Decode batch" in _SGR.sub("", l))
        assert "reverse" not in attributes_at(plain, "Decode batch")
        assert lag < 10
    finally:
        tmux.kill()


def _numbered(n: int) -> str:
    return ORDINARY.replace("Decode batch", f"n={n:06d} Decode batch")


def test_following_bursts_bigger_than_the_pane_shows_the_newest_lines_in_order(tmp_path: Path) -> None:
    """Each burst scrolls the pane by more than its height: the view must move to the end and
    every row be drawn afresh (the pane's own quick scroll to the end, its rows divided whole by
    the compositor), so the screen shows the newest lines, consecutive, the last one last."""
    log = tmp_path / "server.log"
    log.write_text(ORDINARY + "\n", encoding="utf-8")
    tmux = Tmux(100, 30)
    numbered = re.compile(r"n=(\d{6}) Decode")
    try:
        tmux.start([sys.executable, "-m", "radixtop", "--log", str(log)], tmp_path)
        tmux.wait_for(lambda s: "FOLLOW" in s and "q Quit" in s, "radixtop to start", timeout=30)
        written = 0
        for burst in (150, 40, 400, 25, 300):
            with open(log, "a", encoding="utf-8") as f:
                f.write("".join(_numbered(written + i) + "\n" for i in range(burst)))
            written += burst
            last = written - 1

            def newest_in_order(screen: str, last: int = last) -> bool:
                shown = [int(n) for n in numbered.findall(screen)]
                return len(shown) >= 10 and shown == list(range(last - len(shown) + 1, last + 1))

            tmux.wait_for(newest_in_order, f"lines up to n={last:06d}, in order", timeout=10)
    finally:
        tmux.kill()
