"""`radixtop demo` in a real terminal: the incident shows up within a minute, and q leaves nothing
running (the simulator and the load generator are gone with the UI)."""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from pathlib import Path

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



def note_cmdline(seen: dict[int, str], proc: psutil.Process) -> None:
    """The child's command line as it is now: one just forked, or inside its exec, reads empty or
    as its parent's for a moment, so a later read replaces it."""
    command = " ".join(proc.cmdline())
    if command:
        seen[proc.pid] = command

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
                    note_cmdline(seen, proc)
                except psutil.Error:
                    pass
            time.sleep(0.1)
        cmdlines = list(seen.values())
        assert any("radixtop sim" in c for c in cmdlines), cmdlines
        assert any("radixtop.incident.replay.load" in c for c in cmdlines), cmdlines

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


def test_demo_crash_then_c_runs_the_experiment_to_the_conditions_and_q_leaves_nothing(tmp_path) -> None:
    """The headline flow as a new user meets it: the demo's server dies, c, the plan lays out the
    experiment (a reproduction, the control), y, the verdict naming the conditions with the steps
    side by side and the ladder, q."""
    tmux = Tmux(160, 48)
    try:
        tmux.start([sys.executable, "-m", "radixtop", "demo"], tmp_path)
        pane_pid = int(tmux("display-message", "-p", "-t", "radixtop", "#{pane_pid}").strip())
        # The status line groups sources by state and time: "server r0 DOWN since ..., r1 procs DOWN ..."
        tmux.wait_for(lambda s: re.search(r"│ server\b[^│]*DOWN since", s) is not None,
                      "the demo's server to die", timeout=90)
        time.sleep(2)  # a person reads the crash before pressing c
        tmux.send("c")
        plan = tmux.wait_for(lambda s: "as planned?" in s, "the plan to approve", timeout=60)
        assert "DOWN: the server died at" in plan and "Experiment" in plan and "lower load: at most" in plan
        # The workload is the crash's own: the requests the simulator dumped as it died (SGLang's
        # --crash-dump-folder, which the demo gives it), not the made-up pressure.
        assert "the crash's own: " in plan and "crash-dumps/" in plan and "made up:" not in plan, plan
        started: dict[int, str] = {}

        def verdict_shown(screen: str) -> bool:
            for proc in psutil.Process(pane_pid).children(recursive=True):  # what the run starts
                try:
                    note_cmdline(started, proc)
                except psutil.Error:
                    pass
            # the whole verdict drawn: its conditions line too (under load it can come a frame later)
            return "VERDICT: pressure-dependent" in screen and "Pressure ladder" in screen and "Needs: " in screen

        tmux.send("y")
        began = time.monotonic()
        screen = tmux.wait_for(verdict_shown, "the verdict with the steps side by side", timeout=420, step=0.5)
        took = time.monotonic() - began
        # The lock race: clean lower on the ladder, failing with reuse off, gone without the cache.
        assert "Needs: pressure needed · reuse not-needed · cache needed" in screen, screen
        assert "repro" in screen and "no cache" in screen and "evict/s" in screen
        assert any("--disable-radix-cache" in c for c in started.values()), started  # the control ran
        print(f"\nverdict {took:.0f} s after y\n{screen}")
        tmux.send("Escape")
        tmux.wait_for(lambda s: "c Confirm" in s, "the main screen again", timeout=10)
        tmux.send("q")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (_alive(pane_pid) or any(_alive(pid) for pid in started)):
            time.sleep(0.2)
        left = [cmd for pid, cmd in started.items() if _alive(pid)]
        assert not _alive(pane_pid) and not left, f"still running after q: {left}"
    finally:
        tmux.kill()


def test_the_demos_automatic_bundle_keeps_what_the_radix_pane_showed_after_the_ranks_died(tmp_path) -> None:
    """The lock race kills the ranks before the bundle can ask their endpoints; the bundle keeps
    what radixtop saw: each rank's last snapshot and the flight record the pane turned to (the one
    it showed: same number, same locked tokens and lock counts), its events, the vital signs and
    the screen."""
    tmux = Tmux(160, 48)
    try:
        tmux.start([sys.executable, "-m", "radixtop", "demo"], tmp_path)
        pane_pid = int(tmux("display-message", "-p", "-t", "radixtop", "#{pane_pid}").strip())
        workdir = None
        deadline = time.monotonic() + 20
        while workdir is None and time.monotonic() < deadline:  # the demo's directory, from its simulator
            for proc in psutil.Process(pane_pid).children(recursive=True):
                try:
                    argv = proc.cmdline()
                except psutil.Error:
                    continue
                if "--log-file" in argv and "sim" in argv:
                    workdir = Path(argv[argv.index("--log-file") + 1]).parent
            time.sleep(0.1)
        assert workdir is not None
        screen = tmux.wait_for(lambda s: re.search(r"│ server\b[^│]*DOWN since", s) is not None,
                               "the demo's server to die", timeout=90)
        tmux.wait_for(lambda s: "auto bundle (on child-sigquit) written" in s or
                      any(workdir.glob("radixtop-bundle-*-auto-child-sigquit/MANIFEST.json")),
                      "the automatic bundle of the crash", timeout=60)
        screen = tmux.capture()
        shown = re.search(r"snapshot #(\d+)", screen)
        pool = re.search(r"locked ([\d,]+) running", screen)
        locks = re.search(r"locks ([\d,]+)/([\d,]+)", screen)
        failed = re.search(r"as rank (\d+) failed", screen)  # the pane turned to a rank's flight record
        assert shown and pool and locks, screen
        tmux.send("q")
    finally:
        tmux.kill()
    bundle = next(workdir.glob("radixtop-bundle-*-auto-child-sigquit"))
    seen = json.loads((bundle / "seen/radix/rank0-snapshots.json").read_text())
    last = seen["snapshots"][-1]["snapshot"]
    if failed:
        (kept,) = bundle.glob(f"flight/rank{failed.group(1)}-pid*.json")
        on_screen = json.loads(kept.read_text())["snapshot"]
    else:
        on_screen = last
    number = lambda text: int(text.replace(",", ""))  # noqa: E731
    assert on_screen["seq"] == number(shown.group(1))
    assert on_screen["protected_tokens"] == number(pool.group(1))
    assert (on_screen["counters"]["lock_ops"], on_screen["counters"]["unlock_ops"]) == (
        number(locks.group(1)),
        number(locks.group(2)),
    )
    events = json.loads((bundle / "seen/radix/rank0-events.json").read_text())["events"]
    assert any(e["kind"] == "evict" for e in events)
    vitals = json.loads((bundle / "seen/vitals.json").read_text())
    assert vitals["series"]["token_usage"]["points"] and vitals["first_signatures"]
    # And the rank's own flight record, written inside the simulator as it died.
    (flight,) = bundle.glob("flight/rank0-pid*.json")
    record = json.loads(flight.read_text())
    assert record["triggers"][-1]["message"].endswith("Failed to lock memory page during dynamic prefix eviction")
    assert record["snapshot"]["counters"]["lock_ops"] >= last["counters"]["lock_ops"]  # no older than the pane's
    page = (bundle / "timeline.html").read_text()  # the picture: the UI's vital signs and the rank's locks
    assert "token usage (" in page and "locked tokens, rank 0" in page and "Radix cache page lock failed" in page
    svg = bundle / "seen/screen.svg"
    assert svg.exists(), [p.read_text() for p in bundle.glob("seen/screen.svg*")]  # the note says why
    assert svg.read_text().lstrip().startswith("<svg")


def test_the_tree_the_server_printed_at_its_failure_is_in_the_radix_pane(tmp_path) -> None:
    """The double-unlock fault ends in SGLang's `Prefill out of memory` with each rank's tree
    printed into the log: the radix pane turns to the first rank's print, its lock counts and the
    pool figures of its error line, beside the ranks' last live snapshots."""
    tmux = Tmux(160, 48)
    try:
        tmux.start([sys.executable, "-m", "radixtop", "demo", "--fault", "double-unlock"], tmp_path)
        tmux.wait_for(lambda s: "printed TP0" in s, "the printed tree among the radix pane's views", timeout=90)
        tmux.send("2")  # the radix pane alone: its title has room for every view (flight records too)
        # Read the screen once the key has taken effect (under load the next capture can precede it).
        tmux.wait_for(lambda s: "printed TP1" in s and "Vital signs" not in s, "the radix pane alone", timeout=30)
        # The simulator's instrument also wrote flight records, which the pane may have turned to:
        # ] steps to the next view until the print is the one shown (bounded: one pass of the views).
        for _ in range(8):
            screen = tmux.capture()
            if "source printed by the server at" in screen and "(TP0)" in screen:
                break
            tmux.send("]")
            time.sleep(0.5)
        assert "printed TP0" in screen and "printed TP1" in screen and "(TP0)" in screen, screen
        assert re.search(r"pool at the failure: available [\d,]+ · evictable [\d,]+ · locked [\d,]+", screen), screen
        # what the print itself shows first: the double unlock left a node locked less than its child
        assert "node(s) locked less than a child (a lock released twice) · RadixCache print" in screen, screen
        assert re.search(r"root · \d+ nodes", screen), screen
    finally:
        tmux.kill()
