"""The incident actions in the app (b, the automatic bundle, c), driven with Textual's Pilot against
a real simulator on loopback. The confirmation runs are kept short as in test_confirm.py: a healthy
simulator, a small trace, one run (a few seconds each)."""

from __future__ import annotations

import io
import json
import re
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from incident_helpers import gone, small_trace, start_sim, write_lines
from rich.console import Console
from test_confirm import HEALTHY
from textual.errors import NoWidget

from radixtop.cli import build_parser
from radixtop.incident.bundle.bundle import verify_bundle
from radixtop.options import TuiOptions
from radixtop.tui import app as app_module
from radixtop.tui.actions import ActionSettings
from radixtop.tui.app import RadixtopApp
from radixtop.tui.help import help_text
from radixtop.tui.messages import BundleTaken, CrashDumpArmed
from radixtop.tui.panes import LiveOptions
from radixtop.widgets.confirm import PlanScreen, RunScreen

SIGQUIT = "[2026-12-02 14:03:14.964] Received sigquit from a child process. It usually means the child failed."
ORDINARY = (
    "[2026-12-02 14:03:13.281] Decode batch, #running-req: 6, #token: 3876, token usage: 0.24, cuda graph: True, "
    "gen throughput (token/s): 1782.15, #queue-req: 0"
)
SIZE = (120, 40)


@pytest.fixture
def sim(tmp_path: Path):
    sim = start_sim(tmp_path / "live", *HEALTHY)
    yield sim
    sim.stop()


@pytest.fixture()
def leaky(tmp_path: Path):
    """A live server that leaks KV pages whatever the load, reuse or cache: the experiment goes on to
    start a server without the cache, and the live server lives through it."""
    sim = start_sim(tmp_path / "live", *HEALTHY, "--fault", "leak")
    yield sim
    sim.stop()


def make_app(
    tmp_path: Path, url: str, log: Path, *, readonly: bool = False, auto: bool = True, **confirm
) -> RadixtopApp:
    settings = ActionSettings(
        out_dir=tmp_path / "out",
        auto_bundle=auto,
        confirm={"trace": small_trace(), "runs": 1, "control_timeout_s": 20, **confirm},
        bundle={"tool_timeout_s": 5, "torch_env_timeout_s": 5},
    )
    return RadixtopApp(log_patterns=[str(log)], live=LiveOptions(url=url, gpu=False, discover=False),
                       readonly=readonly, actions=settings)


async def until(pilot, condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await pilot.pause(0.05)


def append(path: Path, lines: list[str]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(f"{line}\n" for line in lines))


def footer_keys(app: RadixtopApp) -> set[str]:
    return {b.binding.description for b in app.screen.active_bindings.values() if b.binding.show}


def bar_text(app: RadixtopApp) -> str:
    """What the action bar says where a person reads it, the main screen's row above the status
    line ("" while something else is drawn there: a bar clipped by its container is never seen)."""
    bar = app.query_one("#action-bar")
    status = app.query_one("#status").region
    try:
        shown, _ = bar.screen.get_widget_at(status.x + 1, status.y - 1)
    except NoWidget:
        return ""
    return str(bar.content) if shown is bar else ""


def new_children(before: set[int]) -> list[str]:
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.pid not in before and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(" ".join(proc.cmdline()))
        except psutil.Error:
            continue
    return found


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


# -- b and the automatic bundle --------------------------------------------------------------------


async def test_b_takes_a_bundle_of_the_server_and_its_log_and_shows_where(tmp_path: Path, sim) -> None:
    app = make_app(tmp_path, sim.url, sim.log, auto=False)
    async with app.run_test(size=SIZE) as pilot:
        assert "Bundle" in footer_keys(app) and "Confirm" in footer_keys(app)
        await until(pilot, lambda: app.state.report is not None, "the sim log's findings (server-ready)", 10)
        await pilot.press("b")
        await until(pilot, lambda: app.last_bundle is not None or "failed" in bar_text(app), "the bundle", 60)
        result = app.last_bundle
        assert result is not None, bar_text(app)
        assert f"bundle written: {result.path}" in bar_text(app)
        assert any(f"bundle written: {result.path}" in n.message for n in app.state.notices)
    assert result.path.parent == tmp_path / "out"
    assert verify_bundle(result.path) == [] and verify_bundle(result.archive) == []
    manifest = json.loads((result.path / "MANIFEST.json").read_text())
    assert manifest["server"] == sim.url and manifest["pid"] == sim.pid  # the server the app watches
    assert manifest["logs"] == [str(sim.log)] and manifest["reason"] == "manual"
    assert (result.path / "server" / "server_info.json").is_file()
    assert (result.path / "findings-live.json").is_file()  # the UI's own findings went in too


async def test_the_first_critical_signature_in_a_followed_log_takes_a_bundle_by_itself(tmp_path: Path, sim) -> None:
    log = tmp_path / "server.log"
    write_lines(log, [ORDINARY])
    app = make_app(tmp_path, sim.url, log)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.5)
        assert app.auto_bundler is None or app.auto_bundler.state == "armed"  # nothing critical yet
        append(log, [ORDINARY, SIGQUIT])
        await until(pilot, lambda: app.auto_bundler is not None and app.auto_bundler.state in ("done", "failed"),
                    "the automatic bundle", 60)
        auto = app.auto_bundler
        assert auto.state == "done", auto.error
        await until(pilot, lambda: "auto bundle (on child-sigquit) written" in bar_text(app), "the bar to say so", 5)
        assert any("auto bundle (on child-sigquit) written" in n.message for n in app.state.notices)
        # once only: a second critical line takes no second bundle
        append(log, [SIGQUIT])
        await pilot.pause(0.5)
    bundles = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    assert bundles == [auto.result.path] and "auto-child-sigquit" in auto.result.path.name
    assert verify_bundle(auto.result.path) == []
    assert next(auto.result.path.glob("evidence/*child-sigquit.log")).is_file()


# -- c: the confirmation run -----------------------------------------------------------------------


async def test_c_shows_the_plan_and_cancelling_it_launches_nothing(tmp_path: Path, sim) -> None:
    app = make_app(tmp_path, sim.url, sim.log, auto=False)
    before = children()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, PlanScreen), "the plan modal", 60)
        plan_text = "\n".join(app.screen.lines)
        assert "the server without the cache: " in plan_text and "--disable-radix-cache" in plan_text
        assert sim.url in plan_text and "Experiment" in plan_text
        assert "Evidence      " in plan_text and "radixtop-bundle-" in plan_text  # evidence first
        assert "Live server   left running" in plan_text
        await pilot.press("n")
        await until(pilot, lambda: app.confirm_state == "done", "the refusal")
        assert isinstance(app.screen, RunScreen)
        assert "not approved: nothing was started" in app.screen._verdict.plain
        assert new_children(before) == []
    workdir = next((tmp_path / "out").glob("radixtop-confirm-*"))
    assert (workdir / "plan.json").is_file()
    assert not (workdir / "control.out").exists() and not (workdir / "verdict.json").exists()


async def test_quitting_at_the_plan_launches_nothing_and_quits_at_once(tmp_path: Path, sim) -> None:
    app = make_app(tmp_path, sim.url, sim.log, auto=False)
    before = children()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, PlanScreen), "the plan modal", 60)
        await pilot.press("ctrl+q")  # the app's quit, from the modal
        await until(pilot, lambda: not app.is_running, "the app to quit", 10)
    assert app.confirm_run is None and new_children(before) == []
    assert not next((tmp_path / "out").glob("radixtop-confirm-*/control.out"), None)


async def test_approving_runs_to_a_verdict_on_screen_and_stops_the_control(tmp_path: Path, leaky) -> None:
    sim = leaky
    app = make_app(tmp_path, sim.url, sim.log, auto=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, PlanScreen), "the plan modal", 60)
        await pilot.press("y")
        await until(pilot, lambda: app.confirm_state == "done", "the verdict", 90)
        phases = [phase for phase, _ in app._confirm_lines]
        assert phases[0] == "evidence" and phases.index("baseline") < phases.index("control-start")
        screen = app.screen
        assert isinstance(screen, RunScreen) and screen.done
        shown = str(screen.query_one("#run-verdict").content)
        assert shown.startswith("VERDICT: persists-under-control"), shown
        assert "Needs: pressure not-needed · reuse not-needed · cache not-needed" in shown
        assert "Repeat:          radixtop confirm --url" in shown and "Evidence bundle: " in shown
        assert "evict/s" in shown and "The server without the cache: " in shown  # the table, then what is behind it
        assert app.confirm_verdict.verdict == "persists-under-control"
        assert "VERDICT: persists-under-control" in bar_text(app)
        control_pid = app.confirm_run.control.pid
        await pilot.press("escape")
        assert not isinstance(app.screen, RunScreen)
    assert gone(control_pid) and sim.proc.poll() is None  # the live server is never touched
    assert Path(app.confirm_verdict.bundle, "MANIFEST.json").is_file()


@pytest.mark.parametrize("key", ["x", "q"])
async def test_cancelling_or_quitting_during_the_run_leaves_no_process(tmp_path: Path, leaky, key: str) -> None:
    """x cancels the run; q quits the app, which cancels it first. Either way the control goes."""
    sim = leaky
    app = make_app(tmp_path, sim.url, sim.log, auto=False, runs=30, bundle=False)
    before = children()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, PlanScreen), "the plan modal", 30)
        await pilot.press("enter")
        await until(pilot, lambda: any(p == "baseline" for p, _ in app._confirm_lines), "the baseline", 30)
        if key == "x":  # Esc hides the run, which goes on; c shows it again with what it said meanwhile
            await pilot.press("escape")
            assert not isinstance(app.screen, RunScreen) and app.confirm_state == "running", app._confirm_end
            await pilot.press("c")
            assert isinstance(app.screen, RunScreen) and app.screen is app.run_screen
            await pilot.pause(0.05)
            assert "[baseline] step 1, lower load" in "\n".join(app.screen.query_one("#run-log").lines)
        await until(pilot, lambda: any(p == "control" and "run 2/" in m for p, m in app._confirm_lines),
                    "the control's second run", 120)
        control_pid = app.confirm_run.control.pid
        assert not gone(control_pid)
        await pilot.press(key)
        if key == "x":
            await until(pilot, lambda: app.confirm_state == "done", "the cancellation", 30)
            assert "cancelled: the control server was stopped" in app.run_screen._verdict.plain
            assert app.is_running
        else:  # q: the app cancels the run, waits for it, then quits
            await until(pilot, lambda: not app.is_running, "the app to quit", 30)
            assert app._confirm_end[0].startswith("cancelled: the control server was stopped")
    assert gone(control_pid)
    assert new_children(before) == [] and sim.proc.poll() is None
    assert not next((tmp_path / "out").glob("radixtop-confirm-*/verdict.json"), None)


async def test_a_plan_that_cannot_be_made_says_why_in_one_line(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    write_lines(log, [ORDINARY])
    app = make_app(tmp_path, "http://127.0.0.1:9", log, auto=False)  # nothing listens there
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("c")
        await until(pilot, lambda: app.confirm_state == "done", "the plan error", 30)
        text = app.screen._verdict.plain
        assert text.startswith("no confirmation run: cannot make a plan\n")
        assert "pass --launch-command" in text and text.count("\n") == 1
        assert "cannot make a plan" in bar_text(app)


async def test_c_without_a_server_says_what_to_pass(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    write_lines(log, [ORDINARY])
    app = RadixtopApp(log_patterns=[str(log)], actions=ActionSettings(out_dir=tmp_path / "out"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("c")
        await pilot.pause(0.1)
        assert "start radixtop with --url URL" in bar_text(app) and app.confirm_state == "idle"
    assert not (tmp_path / "out").exists()


# -- --readonly, and the keys' neighbours ----------------------------------------------------------


async def test_readonly_removes_b_c_and_the_automatic_bundle(tmp_path: Path, sim) -> None:
    log = tmp_path / "server.log"
    write_lines(log, [ORDINARY, SIGQUIT])  # a critical signature from the start
    app = make_app(tmp_path, sim.url, log, readonly=True)
    before = children()
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.report is not None and app.state.report.findings, "the finding", 10)
        assert "Bundle" not in footer_keys(app) and "Confirm" not in footer_keys(app)
        assert "Theme" in footer_keys(app)  # the footer is there, without the actions
        await pilot.press("b", "c")
        await pilot.pause(0.5)
        assert not isinstance(app.screen, (PlanScreen, RunScreen)) and app.confirm_state == "idle"
        assert app.auto_bundler is None and not app.query("#action-bar")
        assert new_children(before) == []
    assert not (tmp_path / "out").exists()


async def test_b_typed_in_the_search_prompt_is_a_letter(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    write_lines(log, [ORDINARY])
    app = RadixtopApp(log_patterns=[str(log)], actions=ActionSettings(out_dir=tmp_path / "out"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("slash", "b", "c")
        await pilot.pause(0.1)
        assert app.query_one("#prompt").value == "bc"
        assert app.confirm_state == "idle" and not app._bundling
    assert not (tmp_path / "out").exists()


async def test_the_actions_threads_report_in_messages_and_a_failure_to_show_one_is_a_notice(tmp_path: Path) -> None:
    """A bundle's, a sighting's and an arming's threads post typed messages (tui/messages.py); the
    app shows them on its own loop, and a failure in showing one is a notice, not a dead app."""
    app = RadixtopApp(actions=ActionSettings(out_dir=tmp_path / "out", auto_bundle=False))

    failed: list[BaseException] = []

    def tell(message: object) -> None:
        try:
            app._tell(message)
        except BaseException as exc:
            failed.append(exc)

    def from_a_thread(message: object) -> None:
        thread = threading.Thread(target=tell, args=(message,))
        thread.start()
        thread.join()

    async with app.run_test(size=SIZE) as pilot:
        app._arming = True
        from_a_thread(CrashDumpArmed("/run/dumps", None))
        await until(pilot, lambda: app.dump_armed == "/run/dumps", "the arming's message", 5)
        assert not app._arming and "crash dump armed" in bar_text(app)
        app._bundling = True
        app._say = lambda *a, **k: 1 / 0  # type: ignore[method-assign]  # drawing fails
        from_a_thread(BundleTaken(None, "the server went away"))
        await until(pilot, lambda: not app._bundling, "the bundle's message", 5)
        await until(pilot, lambda: any("showing an incident action's progress failed" in n.message
                                       for n in app.state.notices), "the notice", 5)
        assert app.is_running
    from_a_thread(BundleTaken(None, "too late"))  # the app has gone: nothing, and no error
    assert failed == []


def test_readonly_on_the_command_line_reaches_the_app(monkeypatch, tmp_path: Path) -> None:
    """`radixtop --readonly` and `radixtop --readonly demo` (run_demo hands its args to run_tui)."""
    built: list[RadixtopApp] = []
    monkeypatch.setattr(RadixtopApp, "run", lambda self, *a, **k: built.append(self))  # no terminal here
    parser = build_parser()
    for argv, readonly in ((["--readonly", "--no-panes"], True), (["--no-panes"], False)):
        app_module.run_tui(TuiOptions.from_args(parser.parse_args(argv)))
        assert built[-1].readonly is readonly
    demo_args = parser.parse_args(["--readonly", "demo"])
    assert demo_args.readonly is True and demo_args.command == "demo"
    # what run_demo passes on: the same options with the log, the URL and the banner added
    app_module.run_tui(replace(TuiOptions.from_args(demo_args), logs=(), url="http://127.0.0.1:9", panes=False))
    assert built[-1].readonly is True


def test_the_help_screen_lists_b_and_c() -> None:
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(help_text())
    text = console.export_text()
    assert re.search(r"^b +evidence bundle now", text, re.MULTILINE), text
    assert re.search(r"^c +confirmation run: evidence first", text, re.MULTILINE), text
    assert re.search(r"^--readonly +b, c and the automatic bundle are off", text, re.MULTILINE), text


def test_the_demo_keeps_its_bundles_and_runs_in_its_own_work_directory(monkeypatch) -> None:
    """`radixtop demo` starts a real simulator and hands the app its work directory, so b and c
    do not write into wherever the demo was started from."""
    from radixtop.demo import run_demo

    built: list[RadixtopApp] = []
    monkeypatch.setattr(RadixtopApp, "run", lambda self, *a, **k: built.append(self))  # no terminal here
    args = build_parser().parse_args(["demo", "--no-panes", "--fault", "none"])
    assert run_demo(args) == 0
    settings = built[-1].action_settings
    assert settings.out_dir is not None and settings.directory == Path(built[-1].log_patterns[0]).parent
    assert settings.directory.name.startswith("radixtop-demo-")
    shutil.rmtree(settings.directory)  # the demo keeps it for the user; the test does not
