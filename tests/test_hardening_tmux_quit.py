"""In a real terminal: `q` while a bundle waits on a server that answers a byte every 2 s quits
at once (it does not wait out the bundle's network deadline), the bundle's partial directory is
gone and the terminal is back to normal."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import psutil
import pytest
from hardening_helpers import start_standin
from incident_helpers import wait_for, write_lines
from tmux_helpers import Tmux

pytestmark = [
    pytest.mark.tmux,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

# Runs radixtop, then says how it ended and keeps the pane (a shell prompt stand-in).
SCRIPT = '"$0" -m radixtop "$@"; echo "EXITED $?"; exec sleep 120'


def _partials(where: Path) -> list[Path]:
    return [p for p in where.iterdir() if ".partial-" in p.name]


def test_q_quits_at_once_while_a_bundle_waits_on_a_dripping_server(tmp_path: Path) -> None:
    slow = start_standin(tmp_path / "slow", "--mode", "slow", "--drip", "2")
    log = tmp_path / "server.log"
    write_lines(log, [f"[2026-12-02 14:00:01 TP0] line {i}" for i in range(50)])
    tmux = Tmux(120, 40)
    try:
        tmux.start(["sh", "-c", SCRIPT, sys.executable, "--url", slow.url, "--log", str(log), "--no-discover",
                    "--no-gpu"], tmp_path)
        tmux.wait_for(lambda s: "q Quit" in s, "radixtop to start", timeout=30)
        tmux.send("b")
        assert wait_for(lambda: _partials(tmp_path), 15), "no bundle in progress"
        time.sleep(1.0)  # in the middle of its slow GETs
        assert _partials(tmp_path)
        tmux.send("q")
        sent = time.monotonic()
        screen = tmux.wait_for(lambda s: "EXITED" in s, "radixtop to exit", timeout=60, step=0.05)
        took = time.monotonic() - sent
        assert "EXITED 0" in screen
        # Far below the bundle's own 20 s network deadline: q cancels it rather than waiting for it
        # (a bound on behaviour, not a speed target: those live in benchmarks/).
        print(f"q quit {took:.2f} s after it was pressed")
        assert took < 8, f"q took {took:.1f} s to quit during a bundle"
        assert tmux("display", "-p", "-t", "radixtop", "#{alternate_on}").strip() == "0"
        assert not _partials(tmp_path)
    finally:
        tmux.kill()
        slow.stop()


COMBO_CATALOG = """
[[signature]]
id = "big-count"
title = "A counted repeat RE2 and hyperscan refuse"
pattern = 'Zq{1,60000}Y'
severity = "error"
subsystem = "custom"
meaning = "m"
first_checks = ["x"]
competing = []

[[signature]]
id = "nested"
title = "A repeat inside a repeat"
pattern = '(\\w+\\s?)+QZX'
severity = "error"
subsystem = "custom"
meaning = "m"
first_checks = ["x"]
competing = []
"""


def test_a_catalog_with_a_nested_repeat_draws_and_q_quits(tmp_path: Path) -> None:
    # The first signature moved the whole catalog to Python's re, where the second backtracked
    # 2**40 ways on the log's lines: a blank screen that no key and no SIGTERM ended.
    catalog = tmp_path / "combo.toml"
    catalog.write_text(COMBO_CATALOG, encoding="utf-8")
    log = tmp_path / "redos.log"
    # The first line fails after 2**40 tries; the second matches late, after as many (the span the
    # log pane marks is searched too).
    write_lines(log, ["QZX! " + "a" * 40 + "!", "a" * 40 + "! b QZX", "[2026-12-02 14:00:01 TP0] after the line"])
    tmux = Tmux(120, 40)
    pane = None
    try:
        tmux.start(["sh", "-c", SCRIPT, sys.executable, "--signatures", str(catalog), "--log", str(log),
                    "--no-discover", "--no-gpu", "--readonly", "--from-start"], tmp_path)
        pane = psutil.Process(int(tmux("display", "-p", "-t", "radixtop", "#{pane_pid}")))
        tmux.wait_for(lambda s: "q Quit" in s and "after the line" in s and "Findings (1)" in s,
                      "radixtop to draw the log and the finding", timeout=30)
        tmux.send("q")
        assert "EXITED 0" in tmux.wait_for(lambda s: "EXITED" in s, "radixtop to exit", timeout=30)
    finally:
        for child in pane.children(recursive=True) if pane is not None and pane.is_running() else ():
            child.kill()  # a hung radixtop handles no signal but this one
        tmux.kill()
