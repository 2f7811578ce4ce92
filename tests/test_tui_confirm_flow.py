"""The confirmation run's key when it matters, in the app (Textual's Pilot, real simulators): after
the server died, with a colleague's run in progress, with a plan that cannot start, and with one
that finds no GPU free beside the live server."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from incident_helpers import HEALTHY_FLAGS, LOCK_RACE_FLAGS, gone, start_sim
from test_probe_gpu import FakeNvml
from test_tui_actions import SIZE, bar_text, make_app, until

from radixtop.incident.confirm.runlock import RunLock
from radixtop.tui.actions import ActionSettings
from radixtop.tui.app import RadixtopApp
from radixtop.tui.panes import LiveOptions
from radixtop.widgets.confirm import PlanScreen, RunScreen


def verdict_text(app: RadixtopApp) -> str:
    return str(app.screen.query_one("#run-verdict").content)


async def test_c_after_the_server_died_plans_a_reproduction_from_what_was_seen(tmp_path: Path) -> None:
    sim = start_sim(tmp_path / "live", *HEALTHY_FLAGS)
    try:
        # Discovery finds the simulator's process (its pid, hence its argv and environment).
        app = make_app(tmp_path, sim.url, sim.log, auto=False)
        app.live_options = LiveOptions(url=sim.url, gpu=False, discover=True)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.sighting is not None and app.sighting.argv, "the server to be seen", 30)
            sim.proc.send_signal(signal.SIGKILL)
            sim.proc.wait(10)
            await until(pilot, lambda: app.sighting.died_at is not None, "its death to be noted", 30)
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, PlanScreen), "the plan modal", 60)
            plan_text = "\n".join(app.screen.lines)
            assert "DOWN: the server died at" in plan_text and "planned from what was seen at" in plan_text
            assert "the reproduction: " in plan_text and "the server without the cache: " in plan_text
            assert "--disable-radix-cache" in plan_text.split("the server without the cache: ", 1)[1]
            assert "1 lower load: at most 2 calls in flight on the reproduction" in plan_text
            await pilot.press("y")
            await until(pilot, lambda: app.confirm_state == "done", "the verdict", 90)
            shown = verdict_text(app)
            assert shown.startswith("VERDICT: not-reproduced"), shown
            assert "repro" in shown and "peak" in shown  # the steps side by side
            assert "Cached tokens (step 1):" in shown and "Cached tokens (step 3):" in shown
            servers = [s.pid for s in app.confirm_run.servers]
    finally:
        sim.stop()
    assert len(servers) == 1 and all(gone(pid) for pid in servers)  # one start for the whole ladder
    verdict = json.loads(next((tmp_path / "out").glob("radixtop-confirm-*/verdict.json")).read_text())
    assert verdict["mode"] == "relaunch" and {s["role"] for s in verdict["steps"]} == {"reproduction"}


async def test_c_while_a_colleague_runs_one_shows_that_run_then_its_verdict(tmp_path: Path) -> None:
    sim = start_sim(tmp_path / "live", *HEALTHY_FLAGS)
    other = RunLock(sim.url, tmp_path / "theirs")  # another radixtop on the node (flock is per open file)
    try:
        assert other.acquire()
        other.note("control", "run 1/3: 4 calls")
        app = make_app(tmp_path, sim.url, sim.log, auto=False)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, RunScreen), "the run screen", 10)
            await until(pilot, lambda: any("run 1/3" in m for _, m in app._confirm_lines), "the other run's line", 10)
            assert any("a confirmation run is in progress on this node" in m for _, m in app._confirm_lines)
            assert app.confirm_state == "watching" and app.confirm_run is None  # nothing of its own
            await pilot.press("escape")
            await pilot.press("c")  # c again shows the same run, still starts nothing
            await until(pilot, lambda: isinstance(app.screen, RunScreen), "the run screen again", 10)
            other.note("control", "run 2/3: 4 calls")
            await until(pilot, lambda: any("run 2/3" in m for _, m in app._confirm_lines), "its next line", 10)
            other.finish("VERDICT: pressure-dependent", "the baseline showed ...", "pressure-dependent")
            await until(pilot, lambda: app.confirm_state == "done", "its verdict", 10)
            assert verdict_text(app).startswith("VERDICT: pressure-dependent")
            assert "VERDICT: pressure-dependent" in bar_text(app)
    finally:
        other.release()
        sim.stop()
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("radixtop-confirm-*/control.out"))


async def test_a_plan_that_cannot_start_offers_only_close(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("radixtop.incident.common.server.process_environ", lambda pid: None)  # another user's server
    sim = start_sim(tmp_path / "live", *HEALTHY_FLAGS)
    try:
        app = make_app(tmp_path, sim.url, sim.log, auto=False, bundle=False, pid=sim.pid)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, PlanScreen), "the plan modal", 60)
            assert len(app.screen.query("#approve")) == 0
            assert "cannot start" in str(app.screen.query_one("#plan-question").content)
            await pilot.press("y")  # refused: nothing to approve
            await pilot.pause(0.3)
            assert isinstance(app.screen, PlanScreen)
            await pilot.press("escape")
            await until(pilot, lambda: app.confirm_state == "done", "the end", 10)
            assert "--own-env" in verdict_text(app)
            assert app.confirm_run is None
            # Said once: the headline heads the verdict box; the phase line above it is gone.
            assert verdict_text(app).startswith("no confirmation run: the plan cannot start")
            assert not app.screen.query_one("#run-phase").display
    finally:
        sim.stop()


async def test_on_a_node_whose_gpus_are_taken_the_steps_run_on_the_live_server_and_say_what_stayed_open(
    tmp_path: Path, monkeypatch
) -> None:
    sim = start_sim(tmp_path / "live", *LOCK_RACE_FLAGS)
    try:
        FakeNvml(monkeypatch, layout=[(120, [(sim.pid, 118)])] * 2 + [(130, [(777, 128)])] * 6)
        settings = ActionSettings(out_dir=tmp_path / "out", auto_bundle=False, confirm={
            "runs": 2, "control_timeout_s": 20, "bundle": False, "pid": sim.pid,
            "launch_command": "python -m sglang.launch_server --model-path m --tp-size 2",
        })
        app = RadixtopApp(log_patterns=[str(sim.log)], live=LiveOptions(url=sim.url, gpu=False, discover=False),
                          actions=settings)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, PlanScreen), "the plan modal", 60)
            plan_text = "\n".join(app.screen.lines)
            assert "no room for a server radixtop starts" in plan_text and "open: cache: no GPU is free" in plan_text
            await pilot.press("y")
            await until(pilot, lambda: app.confirm_state == "done", "the run to end", 90)
            shown = verdict_text(app)
            servers = list(app.confirm_run.servers)
    finally:
        sim.stop()
    # Nothing was started; the ladder ran on the live server until the race killed it.
    assert servers == []
    assert shown.startswith("VERDICT: pressure-dependent"), shown
    assert "Needs: pressure needed · reuse open · cache open" in shown
    assert "no GPU is free to start another" in shown and "no GPU is free to start a server without the cache" in shown
