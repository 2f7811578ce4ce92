"""The confirmation run in a real terminal: radixtop attached to a failing simulator at 120x40, c,
the plan, y, the progress, the verdict; then nothing of the run is left running.

The simulator has the lock-race fault and the demo's pool (4,096 tokens, 32 running requests): the
default pressure workload kills it in the baseline and the bounded control survives it, so the
verdict is pressure-dependent, in about 15 s here."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest
from incident_helpers import gone, start_sim, wait_for
from tmux_helpers import Tmux

pytestmark = [
    pytest.mark.tmux,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

DEMO_POOL = ("--max-total-tokens", "4096", "--page-size", "16", "--max-running-requests", "32", "--tp-size", "2")


def test_c_approve_watch_and_read_the_verdict_in_a_real_terminal(tmp_path: Path) -> None:
    sim = start_sim(tmp_path / "live", *DEMO_POOL, "--fault", "lock-race:7")
    tmux = Tmux(120, 40)
    screens: list[str] = []

    def seen(needle: str):
        def check(screen: str) -> bool:
            screens.append(screen)
            return needle in screen

        return check

    try:
        tmux.start([sys.executable, "-m", "radixtop", "--url", sim.url, "--log", str(sim.log), "--no-gpu"], tmp_path)
        tmux.wait_for(lambda s: "FOLLOW" in s and "c Confirm" in s, "radixtop to start", 30)
        tmux.send("c")
        # The question can be drawn a frame before the rest of the dialog: wait for all of it.
        plan = tmux.wait_for(lambda s: seen("as planned?")(s) and "Confirmation run: the plan" in s
                             and "Experiment" in s, "the plan to approve", 120)
        # The servers' changes may lie below the dialog's fold (it scrolls): the plan file has them all.
        written = json.loads(next(tmp_path.glob("radixtop-confirm-*/plan.json")).read_text())
        assert "--disable-radix-cache" in next(a for a in written["arms"] if a["role"] == "control")["argv"]
        assert written["ladder"] == [8, 16]
        assert "Evidence      " in plan and "Approve (y)" in plan and "Cancel (n)" in plan
        assert not (tmp_path / "live" / "control.out").exists()
        tmux.send("y")
        final = tmux.wait_for(seen("VERDICT: pressure-dependent"), "the verdict", 120, step=0.2)
        time.sleep(0.5)  # the whole frame drawn: a capture can land in the middle of one
        final = tmux.capture()
        Path(tmp_path, "verdict-screen.txt").write_text(final, encoding="utf-8")
        print("\n" + final)  # pytest -s shows what the terminal showed
        # the progress was on screen as it came, phase by phase (the control's steps take a second
        # or two: on a loaded machine the last of them may be on the final screen only)
        screens.append(final)
        assert any("[baseline] run 1/3" in s for s in screens) and any("[control]" in s for s in screens)
        assert "Pressure ladder" in final and "FAIL" in final
        assert "Repeat:          radixtop confirm --url" in final and "Evidence bundle: " in final
        assert "Esc / q / Enter close" in final
        verdict = json.loads(next(tmp_path.glob("radixtop-confirm-*/verdict.json")).read_text())
        assert verdict["verdict"] == "pressure-dependent"
        # Clean lower on the ladder, still failing with reuse off, gone without the cache.
        assert "Needs: pressure needed · reuse not-needed · cache needed" in final
        assert {k: v["state"] for k, v in verdict["conditions"].items()} == {
            "pressure": "needed", "reuse": "not-needed", "cache": "needed"
        }
        started = [s["pid"] for s in verdict["steps"] if s.get("pid")]
        assert started and wait_for(lambda: all(gone(pid) for pid in started), 10)  # every started server stopped
        tmux.send("Escape")
        # the main screen again (its footer), still saying the verdict (the action bar, the log pane's notice)
        tmux.wait_for(lambda s: "c Confirm" in s and "VERDICT: pressure-dependent" in s, "the log pane again", 10)
        pane_pid = int(tmux("display-message", "-p", "-t", "radixtop", "#{pane_pid}").strip())
        tmux.send("q")
        assert wait_for(lambda: gone(pane_pid), 15), "radixtop did not quit"
    finally:
        tmux.kill()
        sim.stop()
