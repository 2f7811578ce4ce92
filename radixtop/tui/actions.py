"""The incident actions in the app: `b` (evidence bundle), the automatic bundle, `c` (confirmation run).

RadixtopApp inherits IncidentActions. The work itself is radixtop.incident's (the same functions
the headless `radixtop bundle` and `radixtop confirm` call); this module only runs it off the UI
loop and shows it:

* a bundle blocks for seconds (stacks, HTTP, files): it runs in a thread worker; its progress and
  result come back as messages (tui/messages.py) and go to the action bar (one line above the
  status line) and a notice in the log pane;
* the confirmation run's planning (the bundle, psutil, the workload) runs in a thread with its own
  event loop; the plan is shown in a modal and nothing is launched unless approved there;
* the approved run is an async worker on the app's own loop, NOT a thread: the control server
  gets PR_SET_PDEATHSIG, which fires when the *thread* that started it exits;
* quitting cancels a run and waits for its control server to stop (bounded), so nothing is left;
* while the server lives, what is seen of it (argv, /server_info, environment, GPUs) is kept and
  written to the runtime directory (radixtop.incident.common.sighting), so that `c` after the crash can
  plan a reproduction; the moment it goes down is noted;
* one confirmation run per user and node (radixtop.incident.confirm.runlock): `c` while another radixtop
  runs one shows that run's progress and verdict instead of starting a second.

`--readonly` removes all of it: the keys are refused (and hidden) and no bundle is taken by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from textual import work
from textual.css.query import NoMatches
from textual.message import Message
from textual.widgets import Input

from radixtop.tui.messages import AutoBundleTaken, BundleProgressed, BundleTaken, CrashDumpArmed, ServerSighted

if TYPE_CHECKING:
    from radixtop.incident.confirm.verdict import Verdict
    from radixtop.options import TuiOptions
    from radixtop.widgets.confirm import RunScreen

# The widgets (and the incident modules) are imported on first use: the app's start-up does not pay.

INCIDENT_ACTIONS = ("bundle", "confirm", "arm_dump")
BAR_LINGER_S = 12.0  # a result stays in the action bar this long (the log pane keeps it as a notice)
QUIT_WAIT_S = 20.0  # quitting waits this long, at most, for a cancelled run to stop its control
SIGHT_EVERY_S = 15.0  # a live server is looked at again this often (and at once when it changes)
WATCH_EVERY_S = 1.0  # another radixtop's run is read this often

# Where `c` stands: idle -> preparing -> approval -> running -> done (c again prepares a new run);
# watching -> done while another radixtop runs the node's confirmation run.
ConfirmState = Literal["idle", "preparing", "approval", "running", "watching", "done"]


@dataclass(frozen=True)
class ActionSettings:
    """Where the actions write and what they may change; the CLI fills it, tests narrow it."""

    out_dir: Path | None = None  # None: the current directory, like `radixtop bundle --out .` and
    # `radixtop confirm`'s default ./radixtop-confirm-<time>
    auto_bundle: bool = True
    signature_files: tuple[str, ...] = ()
    confirm: Mapping[str, Any] = field(default_factory=dict)  # ConfirmOptions fields (tests: a small trace)
    bundle: Mapping[str, Any] = field(default_factory=dict)  # take_bundle keywords (tests: shorter timeouts)
    nodes: tuple[Any, ...] = ()  # other nodes' NodeTargets: b takes each one's own bundle too
    node_options: Any = None  # their NodeOptions

    def node_bundles(self) -> Any:
        """A fresh collector of the other nodes' bundles for one b (None: this node alone)."""
        if not self.nodes:
            return None
        from radixtop.incident.bundle.nodes import NodeBundles

        return NodeBundles(self.nodes, self.node_options)

    @property
    def directory(self) -> Path:
        return Path(self.out_dir) if self.out_dir is not None else Path.cwd()


def action_settings(options: TuiOptions) -> ActionSettings:
    """From the command line's options (`radixtop demo` gives its own work directory)."""
    nodes: tuple[Any, ...] = ()
    node_options = None
    if options.nodes:
        from radixtop.incident.bundle.nodes import NodeOptions
        from radixtop.incident.commands import node_targets

        nodes = tuple(node_targets(options.nodes, options.node_urls, (), options.ssh_config, options.remote_radixtop))
        node_options = NodeOptions(ssh_config=options.ssh_config, command=options.remote_radixtop)
    return ActionSettings(
        out_dir=Path(options.actions_dir) if options.actions_dir else None,
        signature_files=options.signatures,
        nodes=nodes,
        node_options=node_options,
    )


@dataclass(frozen=True)
class Target:
    """The server the actions are about, as the app knows it now."""

    url: str | None
    pid: int | None
    logs: tuple[str, ...]
    instruments: tuple[str, ...] = ()  # the ranks' debug endpoints the radix pane reads


def expand_logs(patterns: Any) -> tuple[str, ...]:
    """The followed --log patterns as files (a pattern matching nothing stays: its absence is a note)."""
    out: list[str] = []
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]:
            if path not in out:
                out.append(path)
    return tuple(out)


def verdict_body(verdict: Verdict, width: int | None = None) -> str:
    """What the run screen shows under the headline: the reason and the arms side by side first,
    then what to do next (the repeat command, where the evidence is), then the evidence behind it.
    `width`: the screen's, for the steps' table."""
    lines = [
        verdict.reason,
        "",
        *verdict.summary(width),
        "",
        f"Repeat:          {shlex.join(verdict.repeat)}",
        f"Evidence bundle: {verdict.bundle or '(none)'}",
        f"Work directory:  {verdict.workdir}",
        "",
        "─" * 40,
        *verdict.details(),
    ]
    return "\n".join(lines) + "\n"


class IncidentActions:
    """Mixin for RadixtopApp (an App): call init_actions() in __init__, observe_findings() whenever
    the findings change, allow_incident_action() from check_action, stop_actions() when quitting."""

    state: Any  # the app's IncidentState and FindingsBuilder (annotations only: the app sets them)
    builder: Any

    def init_actions(self, readonly: bool = False, settings: ActionSettings | None = None) -> None:
        self.readonly = readonly
        self.action_settings = settings or ActionSettings()
        self.last_bundle: Any = None  # the last BundleResult taken with b
        self.auto_bundler: Any = None
        self.confirm_state: ConfirmState = "idle"
        self.confirm_run: Any = None
        self.confirm_verdict: Verdict | None = None
        self.run_screen: RunScreen | None = None
        self._confirm_lines: list[tuple[str, str]] = []  # (phase, message) of the current run, for a re-shown screen
        self._confirm_end: tuple[str, str, str | None] | None = None
        self._bundling = False
        self._bundle_cancel = threading.Event()  # set on quit: bundles in flight stop, leave nothing
        self._prepare_cancel = threading.Event()
        self._confirm_worker: Any = None
        self._actions_loop: asyncio.AbstractEventLoop | None = None
        self._bar_timer: Any = None
        self.sighting: Any = None  # what was seen of the server while it lived (incident.sighting)
        self._sighting_key: tuple = ()
        self._sighted_at = 0.0
        self._sighting_busy = False
        self.run_lock: Any = None  # this app's hold on the node's confirmation run
        self._watch_timer: Any = None
        self._watch_shown = 0
        self.dump_armed: str | None = None  # the folder a live server was told to dump into (D)
        self._arming = False

    # -- what the app knows about the server -----------------------------------------------------

    def incident_target(self) -> Target:
        app: Any = self
        url = pid = None
        live = getattr(app, "live_options", None)
        if live is not None and live.url:
            url = live.url
        panes = getattr(app, "panes", None)
        targets = getattr(panes, "targets", None) if panes is not None else None
        instruments: tuple[str, ...] = ()
        if targets is not None:
            url = url or targets.url
            if targets.url and url and targets.url.rstrip("/") == url.rstrip("/"):
                pid = targets.pid
            instruments = tuple(targets.instruments)
        nodes = getattr(app, "nodes", None)  # other nodes' spools: their own bundles carry their logs
        logs = expand_logs(getattr(app, "log_patterns", ()) or ())
        logs = tuple(p for p in logs if nodes is None or not nodes.node_of(p))
        return Target(url, pid, logs, instruments)

    # -- what was seen of the server ---------------------------------------------------------------

    def watch_server(self) -> None:
        """On the app's ticks: look at a live server now and then (in a thread), note when it dies."""
        app: Any = self
        panes = getattr(app, "panes", None)
        server = getattr(getattr(panes, "live", None), "server", None) if panes is not None else None
        if self.readonly or panes is None or server is None or self._sighting_busy:
            return
        now = time.time()
        if server.status.ok:
            # Cheap checks first: this runs on every tick, and the target expands --log globs.
            info = server.info.raw if server.info is not None else None
            targets = getattr(panes, "targets", None)
            key = (server.url, getattr(targets, "pid", None), id(info))
            if key == self._sighting_key and now - self._sighted_at < SIGHT_EVERY_S:
                return
            target = self.incident_target()
            if target.url is None:
                return
            self._sighting_key, self._sighted_at, self._sighting_busy = key, now, True
            self._sight_worker(target, info, panes.state.gpu)
        elif server.status.state == "down" and self.sighting is not None and self.sighting.died_at is None:
            died_at, first = server.status.since or now, ""
            procs = getattr(panes.state, "procs", None)
            death = procs.first_death() if procs is not None else None
            if death is not None and death[0] < died_at:  # a child's death began it, seconds before the server's
                died_at, first = death
            self.sighting = self.sighting.died(died_at, first)
            self._sighting_busy = True
            self._sight_worker(None, None, None)

    @work(thread=True, group="sighting", exit_on_error=False)
    def _sight_worker(self, target: Target | None, info: Any, gpu: Any) -> None:
        from radixtop.incident.common.sighting import observe, save_sighting

        seen = self.sighting
        try:
            if target is not None and target.url is not None:  # watch_server passes only targets with a url
                seen = observe(target.url, target.pid, server_info=info, gpu_sample=gpu, logs=target.logs,
                               previous=self.sighting)
            if seen is not None:
                save_sighting(seen)
        except OSError:
            pass  # kept in memory all the same; the runtime directory's trouble shows when c uses it
        finally:
            self._tell(ServerSighted(seen))

    def on_server_sighted(self, message: ServerSighted) -> None:
        self._guarded_ui(self._sighted, (message.seen,))

    def _sighted(self, seen: Any) -> None:
        self._sighting_busy = False
        if seen is not None and (self.sighting is None or self.sighting.died_at is None or seen.died_at is not None):
            self.sighting = seen

    # -- keys ------------------------------------------------------------------------------------

    def allow_incident_action(self, action: str) -> bool | None:
        """False: the key is refused and hidden (--readonly, typing in the prompt, a modal open);
        None: not one of ours."""
        if action not in INCIDENT_ACTIONS:
            return None
        app: Any = self
        if self.readonly or isinstance(app.focused, Input):
            return False  # `b` is a priority key: refused, it falls through (PageUp in the log, a letter in the prompt)
        return not app.screen.is_modal

    def _say(self, text: str, error: bool = False, final: bool = False) -> None:
        """One line in the action bar (over the row above the status line, mounted on first use).
        A final line (a result, an error) goes after BAR_LINGER_S; the log pane keeps it as a notice."""
        app: Any = self
        if self._bar_timer is not None:
            self._bar_timer.stop()
            self._bar_timer = None
        from radixtop.widgets.confirm import ActionBar

        found = app.query("#action-bar")
        if found:
            bar = found.first(ActionBar)
            bar.say(text, error)
        else:
            bar = ActionBar(id="action-bar")
            bar.say(text, error)
            try:
                app.query_one("#bottom").mount(bar, before=0)
            except NoMatches:  # not on the main screen's layout: a toast says it instead
                app.notify(text, severity="error" if error else "information")
                return
        if final:
            self._bar_timer = app.set_timer(BAR_LINGER_S, bar.clear)

    def _tell(self, message: Message) -> None:
        """Post a message to the app from any thread (tui/messages.py); nothing when the app has gone."""
        app: Any = self
        with contextlib.suppress(RuntimeError):  # its loop has closed
            app.post_message(message)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        """Run fn on the UI loop soon, from any thread (also the loop's own: a failure in drawing
        must never reach the incident code that reported the event); nothing when the app has gone.
        The confirmation run's events come this way, not as messages: the app's message queue
        waits while q waits for a cancelled run to stop, and the run's last lines must still show
        (and reach the run lock's status for a second radixtop) meanwhile."""
        loop = self._actions_loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._guarded_ui, fn, args)

    def _guarded_ui(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        """Show what an action reported: nothing once the app is ending, and a failure in drawing
        is the app's notice, not a dead app."""
        app: Any = self
        if not app.is_running:
            return
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - the app's notice, not a dead app or a failed run
            app.report_failure("showing an incident action's progress", exc)

    def _remember_loop(self) -> None:
        if self._actions_loop is None:
            self._actions_loop = asyncio.get_running_loop()

    # -- b: the evidence bundle ------------------------------------------------------------------

    def action_bundle(self) -> None:
        if self._bundling:
            self._say("bundle: one is being taken already", final=True)
            return
        self._bundling = True
        target = self.incident_target()
        where = self.action_settings.directory
        self._say(f"bundle: collecting the evidence of {target.url or 'the followed logs'} into {where}…")
        self._bundle_worker(target, where, self.state.report, self.seen_state())

    def _workload_shape(self) -> Callable[[Sequence[str]], Any]:
        """What a bundle keeps of the crash's own workload: its shape, found as c would find it."""
        from functools import partial

        from radixtop.incident.replay.crash_dump import workload_shape

        server = self._server_sample()
        raw = server.info.raw if server is not None and server.info is not None else None
        seen = self.sighting.server_info if self.sighting is not None else None
        return partial(workload_shape, server_args=raw or seen, armed=self.dump_armed)

    @work(thread=True, group="bundle", exit_on_error=False)
    def _bundle_worker(self, target: Target, where: Path, report: Any, seen: Any) -> None:
        from radixtop.incident.bundle.bundle import BundleError, take_bundle
        from radixtop.incident.common.server import ServerError

        settings = self.action_settings
        try:
            result = take_bundle(
                where, url=target.url, logs=target.logs, pid=target.pid, instruments=target.instruments,
                reason="manual", signature_files=settings.signature_files, context=self.builder.context,
                live_report=report, seen=seen, cancel=self._bundle_cancel,
                on_progress=lambda p: self._tell(BundleProgressed(p)), workload=self._workload_shape(),
                nodes=settings.node_bundles(), **dict(settings.bundle),
            )
        except (BundleError, ServerError) as exc:
            self._tell(BundleTaken(None, str(exc)))
        except Exception as exc:  # noqa: BLE001 - shown as one line, the app keeps running
            self._tell(BundleTaken(None, f"{type(exc).__name__}: {exc}"))
        else:
            self._tell(BundleTaken(result, None))

    def on_bundle_progressed(self, message: BundleProgressed) -> None:
        self._guarded_ui(self._bundle_progress, (message.progress,))

    def on_bundle_taken(self, message: BundleTaken) -> None:
        self._guarded_ui(self._bundle_done, (message.result, message.error))

    def _bundle_progress(self, progress: Any) -> None:
        self._say(f"bundle: {progress.message} ({progress.done}/{progress.total})")

    def _bundle_done(self, result: Any, error: str | None) -> None:
        self._bundling = False
        self._show_bundle("bundle", result, error)
        if result is not None:
            self.last_bundle = result

    def _show_bundle(self, what: str, result: Any, error: str | None) -> None:
        app: Any = self
        if result is None:
            text = f"{what} failed: {error}"
            self._say(text, error=True, final=True)
            app.state.add_notice("radixtop", "error", text)
            app.notify(text, severity="error")
            return
        missing = f"; {len(result.notes)} sources not collected, see its notes" if result.notes else ""
        text = f"{what} written: {result.path} ({len(result.files)} files{missing})"
        self._say(text, final=True)  # no toast: it would cover the status line; the bar and the log pane keep it
        app.state.add_notice("radixtop", "bundle", text)

    def seen_state(self) -> Any:
        """What the screen holds now, for a bundle (radixtop.incident.bundle.seen): each rank's last
        snapshots and events (immutable, so the bundle's thread serializes them), the vital signs
        (copied) and the screen itself. Called on the UI thread, at the moment of the bundle."""
        from radixtop.incident.bundle.seen import RankSeen, SeenState
        from radixtop.session.radix_board import BUNDLE_SNAPSHOTS

        app: Any = self
        panes = getattr(app, "panes", None)
        live = getattr(panes, "live", None)
        ranks: list[RankSeen] = []
        vitals: dict[str, Any] = {}
        marks: tuple = ()
        flight_dirs: list[str] = []
        if live is not None:
            for view in live.board.ordered():
                shots = [
                    *view.earlier.newest(BUNDLE_SNAPSHOTS),
                    *([(view.snapshot_at or 0.0, view.snapshot)] if view.snapshot is not None else []),
                ]
                if view.name:  # a tree the server printed: beside its rank's snapshots, not over them
                    label = view.name.replace(" ", "-")
                else:
                    label = f"rank{view.rank}" if view.rank is not None else f"endpoint{len(ranks)}"
                status = view.status.state + (f" ({view.status.message})" if view.status.message else "")
                ranks.append(RankSeen(label, view.url, status, tuple(shots), tuple(view.events),
                                      view.source, view.locks_known))
                if view.flight_dir and view.flight_dir not in flight_dirs:
                    flight_dirs.append(view.flight_dir)
            for key, series in live.vitals.series.items():
                if series.points:
                    vitals[key] = {"source": series.source, "points": [list(p) for p in series.points]}
            marks = tuple(live.vitals.marks)
        try:
            screen = app.export_screenshot(title="radixtop")
        except Exception as exc:  # noqa: BLE001 - a bundle without the picture is still a bundle; it says why
            return SeenState(
                tuple(ranks), vitals, marks, screen_error=f"{type(exc).__name__}: {exc}", flight_dirs=tuple(flight_dirs)
            )
        # The export renders the whole screen and forgets the regions waiting to be drawn: draw
        # them all on the next frame, or a pane that changed just now stays stale on the terminal.
        app.screen.refresh()
        return SeenState(tuple(ranks), vitals, marks, screen, flight_dirs=tuple(flight_dirs))

    # -- the automatic bundle --------------------------------------------------------------------

    def observe_findings(self, report: Any) -> None:
        """Called whenever the findings change: the first error-or-worse signature while a server
        is known takes one bundle, in the background, before the server can die and take its
        state with it. Never with --readonly."""
        if self.readonly or report is None or not self.action_settings.auto_bundle:
            return
        auto = self.auto_bundler
        if auto is not None and (auto.state == "running" or auto.exhausted):
            return
        target = self.incident_target()
        if target.url is None and target.pid is None:
            return  # no live server: the logs already persist; nothing volatile to keep
        if auto is None:
            from radixtop.incident.bundle.bundle import AutoBundler

            settings = self.action_settings
            options = {"signature_files": settings.signature_files, "cancel": self._bundle_cancel,
                       "context": self.builder.context, **dict(settings.bundle)}
            auto = self.auto_bundler = AutoBundler(
                settings.directory, on_done=lambda result, error: self._tell(AutoBundleTaken(result, error)),
                options=options,
            )
        auto.url, auto.pid, auto.logs = target.url, target.pid, target.logs
        auto.options["instruments"] = target.instruments
        auto.options["workload"] = self._workload_shape()
        if auto.observe(report, seen=self.seen_state):
            self._say(f"auto bundle: {auto.trigger} seen; preserving the evidence into {auto.out_dir}…")

    def on_auto_bundle_taken(self, message: AutoBundleTaken) -> None:
        self._guarded_ui(self._auto_done, (message.result, message.error))

    def _auto_done(self, result: Any, error: str | None) -> None:
        trigger = self.auto_bundler.trigger if self.auto_bundler is not None else "?"
        self._show_bundle(f"auto bundle (on {trigger})", result, error)
        # A worse finding that came while this bundle ran (the crash right after its error) found
        # the bundler busy: look again, or the crash's own bundle would wait for the next finding.
        self.observe_findings(self.state.report)

    # -- D: arm SGLang's crash dump -----------------------------------------------------------------

    def status_extra(self) -> tuple[str, ...]:
        return ("crash dump armed",) if self.dump_armed else ()  # where: the bar said it, D says it again

    def _server_sample(self) -> Any:
        panes = getattr(self, "panes", None)
        return getattr(getattr(panes, "live", None), "server", None) if panes is not None else None

    def _why_not_arm(self, target: Target) -> str | None:
        import psutil

        server = self._server_sample()
        if target.url is None or server is None:
            return "no live server known: start radixtop with --url URL"
        if not server.status.ok:
            return f"{target.url} is not answering: there is nothing to arm"
        raw = server.info.raw if server.info is not None else None
        folder = raw.get("crash_dump_folder") if isinstance(raw, dict) else None
        if folder:
            return f"the server already dumps into {folder} (--crash-dump-folder): c replays what it writes"
        if self.dump_armed:
            return f"already armed: {self.dump_armed}"
        try:
            uid = psutil.Process(target.pid).uids().real if target.pid else None
        except psutil.Error:
            uid = None
        if uid is not None and uid != os.geteuid():
            return (f"the server runs as uid {uid}: it cannot write into your private folder; start it with "
                    "--crash-dump-folder instead")
        return None

    def action_arm_dump(self) -> None:
        from radixtop.incident.replay.crash_dump import arm_request, dump_folder
        from radixtop.rundir import RuntimeDirError
        from radixtop.widgets.confirm import PlanScreen

        app: Any = self
        target = self.incident_target()
        why = "one is being armed" if self._arming else self._why_not_arm(target)
        if why is not None:
            self._say(f"arm crash dump: {why}", error=not why.startswith(("already", "the server already")), final=True)
            return
        try:
            folder = dump_folder()
        except RuntimeDirError as exc:
            self._say(f"arm crash dump: {exc}", error=True, final=True)
            return
        assert target.url is not None
        where, body = arm_request(target.url, folder)
        lines = [
            f"Arm SGLang's crash dump on {target.url}:",
            f"  POST {where}  {json.dumps(body)}",
            (
                "  Only crash_dump_folder is sent; every other setting stays as it is."
                " In effect until the server restarts."
            ),
            "  When one of its processes dies, SGLang writes the requests of its last 300 s and those in flight,",
            f"  with their prompts, to {folder}/<host>/crash_dump_<time>.pkl (your private folder, mode 700),",
            "  and c then replays the crash's own workload instead of a made-up one.",
        ]

        def answered(approved: bool | None) -> None:
            if not approved:
                self._say("arm crash dump: not armed; nothing was sent", final=True)
                return
            self._arming = True
            self._say(f"arm crash dump: POST {where} …")
            self._arm_worker(target.url, folder)

        app.push_screen(PlanScreen(lines, question="Arm the crash dump?  y / Enter arm · n / Esc cancel"), answered)

    @work(thread=True, group="arm-dump", exit_on_error=False)
    def _arm_worker(self, url: str, folder: Path) -> None:
        from radixtop.incident.replay.crash_dump import DumpError, arm

        try:
            arm(url, folder)
            error = None
        except DumpError as exc:
            error = str(exc)
        self._tell(CrashDumpArmed(str(folder), error))

    def on_crash_dump_armed(self, message: CrashDumpArmed) -> None:
        self._guarded_ui(self._armed, (message.folder, message.error))

    def _armed(self, folder: str, error: str | None) -> None:
        self._arming = False
        if error is not None:
            self._say(f"arm crash dump: not armed: {error}", error=True, final=True)
            return
        self.dump_armed = folder
        self._say(f"crash dump armed: the server dumps its requests into {folder} if a child dies", final=True)

    # -- c: the confirmation run -----------------------------------------------------------------

    def action_confirm(self) -> None:
        app: Any = self
        self._remember_loop()
        if self.confirm_state in ("preparing", "running", "watching"):
            if self.run_screen not in app.screen_stack:
                self._show_run_screen()  # hidden with Esc: show it again
            return
        if self.confirm_state == "approval":
            return
        from radixtop.incident.confirm.confirm import ConfirmOptions
        from radixtop.incident.confirm.runlock import RunLock

        target = self.incident_target()
        if target.url is None:
            self._say(
                "confirm: no server known to confirm against; start radixtop with --url URL", error=True, final=True
            )
            return
        settings = self.action_settings
        workdir = (settings.directory / f"radixtop-confirm-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
        lock = RunLock(target.url, workdir)
        try:
            if not lock.acquire():
                self._watch_other_run()
                return
        except OSError as exc:
            self._say(f"confirm: {exc}", error=True, final=True)
            return
        self.run_lock = lock
        options = ConfirmOptions(**{
            "url": target.url, "workdir": workdir, "logs": target.logs, "pid": target.pid,
            "signature_files": settings.signature_files, "sighting": self.sighting,
            "crash_dump_folder": self.dump_armed,
            **dict(settings.confirm),
        })
        self.confirm_state = "preparing"
        self.confirm_run = self.confirm_verdict = None
        self._prepare_cancel = threading.Event()
        self._confirm_lines, self._confirm_end = [], None
        self._show_run_screen()
        self._say("confirm: preserving evidence first, then the plan for approval")
        self._confirm_worker = self._confirm_flow(options)

    def _watch_other_run(self) -> None:
        """Another radixtop runs the node's confirmation run: show its progress, then its verdict."""
        from radixtop.incident.confirm.runlock import read_status

        app: Any = self
        self.confirm_state = "watching"
        self.confirm_run = self.confirm_verdict = None
        self._confirm_lines, self._confirm_end, self._watch_shown = [], None, 0
        status = read_status()
        self._show_event("watching", (status.summary() if status else "a confirmation run is in progress on this node")
                         + "; showing it instead of starting another")
        self._show_run_screen()
        self._watch_timer = app.set_interval(WATCH_EVERY_S, self._watch_tick)
        self._watch_tick()

    def _watch_tick(self) -> None:
        from radixtop.incident.confirm.runlock import lock_held_by_other, read_status

        status = read_status()
        lines = list(status.get("lines") or []) if status else []
        noted = int(status.get("noted") or 0) if status else 0
        for line in lines[len(lines) - min(len(lines), max(0, noted - self._watch_shown)) :]:
            phase, _, message = line.partition("] ")
            self._show_event(phase.lstrip("[") or "run", message or line)
        self._watch_shown = max(self._watch_shown, noted)
        if status is not None and status.done:
            self._stop_watching()
            verdict = status.get("verdict")
            self._finish(str(status.get("headline") or "the run ended"), str(status.get("body") or ""), verdict,
                         error=verdict is None)
        elif not lock_held_by_other():
            self._stop_watching()
            self._finish("the other radixtop ended without a verdict (killed?)", "press c to start a run of your own",
                         error=True)

    def _stop_watching(self) -> None:
        if self._watch_timer is not None:
            self._watch_timer.stop()
            self._watch_timer = None

    def _show_run_screen(self) -> None:
        """A fresh screen with what the run has said so far (a dismissed screen is not reused)."""
        from radixtop.widgets.confirm import RunScreen

        screen = self.run_screen = RunScreen(on_cancel=self.cancel_confirm)
        for phase, message in self._confirm_lines:
            screen.add_event(phase, message)
        if self._confirm_end is not None:
            screen.finish(*self._confirm_end)
        elif self.confirm_run is not None and self.confirm_run.cancelled:
            screen.set_cancelling()
        app: Any = self
        app.push_screen(screen, callback=lambda _: self._run_screen_closed(screen))

    def _run_screen_closed(self, screen: RunScreen) -> None:
        if self.run_screen is screen:
            self.run_screen = None  # hidden: the run goes on; its lines are kept for c
    def cancel_confirm(self) -> None:
        """The run screen's x (and quitting): stop whatever stage the run is in."""
        self._prepare_cancel.set()
        if self.confirm_run is not None:
            self.confirm_run.cancel()
        if self.confirm_state in ("preparing", "running"):
            self._say("confirm: cancelling…")

    def _confirm_event(self, event: Any) -> None:
        if event.phase == "plan":
            return  # the plan is shown whole, in the modal
        self._post(self._show_event, event.phase, event.message)

    def _show_event(self, phase: str, message: str) -> None:
        if self.run_lock is not None:
            self.run_lock.note(phase, message)  # for a colleague's radixtop watching this run
        self._confirm_lines.append((phase, message))
        del self._confirm_lines[:-2000]
        if self.run_screen is not None:
            self.run_screen.add_event(phase, message)
        if self.confirm_state != "done":  # a late line must not replace the verdict in the bar
            self._say(f"confirm [{phase}] {message}")

    def _finish(self, headline: str, body: str, verdict: str | None = None, error: bool = False) -> None:
        self.confirm_state = "done"
        lock, self.run_lock = self.run_lock, None
        if lock is not None:
            lock.finish(headline, body, verdict)
        self._confirm_end = (headline, body, verdict)
        if self.run_screen is not None:
            self.run_screen.finish(headline, body, verdict)
        self._say(f"confirm: {headline}", error=error, final=True)
        first = body.splitlines()[0] if body else ""
        self.state.add_notice("radixtop", "confirm", f"{headline}; {first}" if first else headline)

    async def _prepare(self, options: Any, cancel: threading.Event) -> Any:
        """Evidence and plan in a thread of their own (psutil, files, the bundle: nothing for the UI loop)."""
        from radixtop.incident.confirm.confirm import prepare

        return await asyncio.to_thread(lambda: asyncio.run(prepare(options, self._confirm_event, cancel)))

    @work(exclusive=True, group="confirm", exit_on_error=False)
    async def _confirm_flow(self, options: Any) -> None:
        from radixtop.incident.common.server import ServerError
        from radixtop.incident.confirm.confirm import (
            ConfirmCancelled,
            PlanError,
        )
        from radixtop.incident.confirm.confirm_run import ConfirmationRun
        from radixtop.widgets.confirm import PlanScreen

        app: Any = self
        try:
            plan = await self._prepare(options, self._prepare_cancel)
        except (PlanError, ServerError) as exc:
            self._finish("no confirmation run: cannot make a plan", str(exc), error=True)
            return
        except ConfirmCancelled:
            self._finish("cancelled before anything was started", "no process was launched")
            return
        except Exception as exc:  # noqa: BLE001 - one line, the app keeps running
            self._finish("no confirmation run: planning failed", f"{type(exc).__name__}: {exc}", error=True)
            return
        if self._prepare_cancel.is_set():
            self._finish("cancelled before anything was started", "no process was launched")
            return
        kept = f" The evidence bundle is kept: {plan.bundle.path}" if plan.bundle is not None else ""
        self.confirm_state = "approval"
        if plan.blockers:
            self._say("confirm: the plan cannot start (Esc closes it)", error=True)
        elif plan.stops_original:
            self._say("confirm: the plan stops the live server first: type stop and Enter to approve, Esc cancels")
        else:
            self._say("confirm: the plan waits for your approval (y approve, n cancel)")
        approved = await app.push_screen_wait(
            PlanScreen(plan.describe(), blockers=plan.blockers, requires_stop=plan.stops_original)
        )
        if plan.blockers:
            self._finish("no confirmation run: the plan cannot start", f"{plan.blockers[0]}.{kept}", error=True)
            return
        if not approved:
            self._finish("not approved: nothing was started", f"The plan is in {options.workdir}/plan.json.{kept}")
            return
        run = self.confirm_run = ConfirmationRun(plan, self._confirm_event)
        self.confirm_state = "running"
        self._show_event("approved", f"starting the experiment: {plan.options.runs} runs per step, each step "
                         "only while its question is open")
        try:
            verdict = await run.run()  # on this loop's thread: see the module's docstring
        except ConfirmCancelled:
            self._finish("cancelled: the control server was stopped, nothing is left running",
                         f"Work directory: {options.workdir}.{kept}")
            return
        except Exception as exc:  # noqa: BLE001 - the run's finally has stopped the control
            self._finish("the confirmation run failed", f"{type(exc).__name__}: {exc}", error=True)
            return
        self.confirm_verdict = verdict
        # the run screen's text is its width less its border and padding
        self._finish(f"VERDICT: {verdict.verdict}", verdict_body(verdict, app.size.width - 8), verdict.verdict)

    # -- quitting --------------------------------------------------------------------------------

    async def stop_actions(self) -> None:
        """Before the app exits: cancel a confirmation run and wait (bounded) for its control to
        stop; stop bundles in flight (their partial directories are removed)."""
        self._bundle_cancel.set()
        worker = self._confirm_worker
        if worker is None or worker.is_finished:
            return
        self.cancel_confirm()
        if self.confirm_state == "approval":
            worker.cancel()  # waiting for the user's answer: nothing was launched, nothing to wait for
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(QUIT_WAIT_S):
                await worker.wait()

    def on_unmount(self) -> None:
        # Last resort (the app ended without action_quit): never leave a started server behind.
        self._bundle_cancel.set()
        self._prepare_cancel.set()
        self._stop_watching()
        run = self.confirm_run
        if run is not None:
            run.cancel()
            for server in getattr(run, "servers", ()):
                if server.proc is not None and server.exited() is None:
                    server.stop()
        lock, self.run_lock = self.run_lock, None
        if lock is not None:
            lock.finish("radixtop quit: the run was cancelled")
