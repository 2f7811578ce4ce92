"""The radixtop app: the live log pane, the findings list and the status line, wired to the probes.

Data flow (docs/ARCHITECTURE.md): the LogFollower starts reading when the app is built, `backlog_lines`
before each file's end (a few thousand lines; with --from-start a whole ring's worth), so that
reading, counting line numbers and Textual's own start-up overlap; on_mount applies that backlog
before the first frame, so the first frame shows the files' last lines. What lies before them is
scanned for findings in the background (session/history.py) after the first frame. One worker then
consumes the follower's batches: it matches each batch (`Ingestor.process`, about 1 us a line,
C-speed matching; run inline, a thread hop per batch cost more lag than the work) and draws a
frame when lines came, when tui/pacing.py's FramePacer says one is due. Lines arriving between
frames wait in the follower and are taken together: nothing redraws per line. A slow timer redraws
what else changed (keys draw at once). Every handler is guarded (tui/guard.py): an exception
becomes a visible notice, not a dead app.

The app's other jobs live beside it, each in a module of its own: search and filter
(tui/search.py), the server watched (tui/servers.py), the incident actions (tui/actions.py), the
keys' table (tui/keys.py), the live panes' layout (tui/panes.py), the terminal and the quit
signals (tui/terminal.py).
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import traceback
from argparse import Namespace
from collections.abc import Callable, Sequence
from dataclasses import replace
from importlib import resources
from typing import TYPE_CHECKING, Any, ClassVar

from textual import work
from textual.app import App, ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Label, OptionList, Static

from radixtop.options import TuiOptions
from radixtop.session.incident_state import DEFAULT_CAPACITY, IncidentState
from radixtop.session.ingest import Ingestor, finding_file
from radixtop.themes import CLI_THEMES, THEMES, next_theme, variable_defaults
from radixtop.tui.actions import IncidentActions, action_settings
from radixtop.tui.fleet import FleetWatch
from radixtop.tui.fleet import checked_url as fleet_url
from radixtop.tui.guard import guarded
from radixtop.tui.keys import bindings, load_keymap
from radixtop.tui.nodes import NodeWatching, prepare_nodes
from radixtop.tui.pacing import FRAME_BUSY, INGEST_STEP_S, REFRESH_HZ, FramePacer
from radixtop.tui.panes import LiveOptions, Panes, pane_rows
from radixtop.tui.search import SearchKeys

if TYPE_CHECKING:
    from radixtop.session.node_watch import NodeWatch
from radixtop.tui.servers import ServerChoice
from radixtop.tui.terminal import fit_terminal, run_until_quit
from radixtop.widgets.findings import EvidenceScreen, FindingsList
from radixtop.widgets.footer import KeysFooter
from radixtop.widgets.logview import LogView, time_of_day
from radixtop.widgets.statusline import SourceStatus, StatusInfo, StatusLine
from radixtop.widgets.textual_private import CroppedCompositor

BACKLOG_LINES = 5_000  # lines before each file's end shown at start (a screenful plus scrollback)
INITIAL_WAIT = 0.5  # seconds the first frame waits for that backlog, at most
COUNT_DELAY = 2.0  # seconds the count of the lines above the backlog waits for the first frame, at most
# The reader thread's poll while lines come. Each frame reads the files itself first (read_now), so
# the poll sets how the matching is spread between frames, not how new a frame's lines are; each
# wake-up of the reader is a cold start for its caches, and a flood's frames come every 28 ms.
FOLLOW_POLL_S = 0.025
GC_YOUNG_THRESHOLD = 10_000  # new objects between young collections (Python's default: 700)
_MAX_WORKER_RESTARTS = 5
_MAX_FAILURE_NOTICES = 3  # per kind of failure; later ones are only counted


def no_log_message() -> list[str]:
    """What the pane says when no --log was given (short lines: the findings panel is beside it)."""
    lines = [
        "radixtop is not following any log yet.",
        "",
        "Point it at your server's log:",
        "    radixtop --log /path/to/server.log",
        "It opens at each file's last lines and finds what",
        "happened before them. Repeat --log for each rank;",
        "globs work; --from-start keeps more lines in view:",
        "    radixtop --log '/var/log/sglang/*.log' --from-start",
        "",
    ]
    sample = resources.files("radixtop") / "data" / "sample_incident.log"
    if sample.is_file():
        lines += ["Or look at the bundled sample incident:", f"    radixtop --from-start --log {sample}", ""]
    lines += [
        "Or watch a simulated SGLang server fail:",
        "    radixtop demo",
        "",
        "Without --no-panes, radixtop finds a running server",
        "and its log by itself. Press ? for keys, q to quit.",
    ]
    return lines


# The main screen's plain containers: their children fill them (tests/test_tui_frames.py
# checks it in every layout), so what they draw themselves is never seen. Textual still renders
# every widget whose clip meets a frame's changed rows: the screen, #body, #main and #bottom,
# row by row through the styles cache, for strips the log pane covers: a large share of a log
# frame's compositing (benchmarks/README.md). BLANK widgets hand back blank rows of their background instead.
class TiledScreen(Screen):
    BLANK = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._compositor = CroppedCompositor()  # renders only the rows a frame changes


class TiledVertical(Vertical):
    BLANK = True


class TiledHorizontal(Horizontal):
    BLANK = True


class RadixtopApp(IncidentActions, SearchKeys, ServerChoice, FleetWatch, NodeWatching, App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "radixtop"
    ENABLE_COMMAND_PALETTE = False
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]

    BINDINGS: ClassVar[list[BindingType]] = list(bindings())  # radixtop/tui/keys.py: one table for keys and help

    def __init__(
        self,
        *,
        log_patterns: Sequence[str] = (),
        from_start: bool = False,
        theme: str | None = None,
        catalog: Any = None,
        context: int = 100,
        capacity: int = DEFAULT_CAPACITY,
        clock: Callable[[], float] | None = None,
        banner: str | None = None,
        live: LiveOptions | None = None,
        readonly: bool = False,
        actions: Any = None,
        fleet: str | None = None,
        nodes: NodeWatch | None = None,
    ) -> None:
        super().__init__()
        self.init_fleet(fleet)  # the fleet view's Prometheus (tui/fleet.py)
        self.init_nodes(nodes)  # other nodes, linked through ssh (tui/nodes.py)
        self.user_keymap: dict[str, str] = {}  # binding id -> keys, from the keymap file (tui/keys.py)
        self.init_actions(readonly, actions)  # b, c and the automatic bundle (tui/actions.py)
        for t in THEMES.values():
            self.register_theme(t)
        self.theme = CLI_THEMES.get(theme or "dark", "radixtop-dark")
        self.log_patterns = list(log_patterns)
        self.banner = banner  # one line shown first in the pane (e.g. what `radixtop demo` started)
        self.live_options = live  # the radix, GPU, processes and vitals panes; None: the log pane alone
        self.panes: Panes | None = None
        self.from_start = from_start
        if catalog is None:
            from radixtop.diagnosis.catalog import load_catalog

            catalog = load_catalog()
        self.catalog = catalog
        from radixtop.diagnosis.findings import FindingsBuilder
        from radixtop.diagnosis.matcher import Matcher

        self.matcher = Matcher(catalog.signatures)
        node_of = nodes.node_of if nodes is not None else None  # their spools: tagged, on this clock
        self.builder = FindingsBuilder(catalog, matcher=self.matcher, context=context, node_of=node_of)
        self.ingestor = Ingestor(self.builder, catalog)
        self.state = IncidentState(capacity, clock=clock) if clock else IncidentState(capacity)
        self.follower: Any = None
        self._follow_error: str | None = None
        self._stopping = threading.Event()  # set when quitting: background scans stop early
        self._history_parts: list[Any] = []  # SkippedLines waiting for the first frame
        self._history_started = False
        self.pacer = FramePacer()  # what was drawn when, and when to draw next (tui/pacing.py)
        self._failures: dict[str, int] = {}
        self._flushing = False
        # The main screen's widgets, looked up once (per frame otherwise).
        self._log_view: LogView | None = None
        self._status_line: StatusLine | None = None
        self._timer: Any = None  # the one timer (_on_timer), re-armed after each run
        self._findings_title = ""
        self._left_sources: set[str] = set()  # logs of a server switched away from: off the status line
        if self.log_patterns:
            self._open_logs(capacity)

    # -- layout ------------------------------------------------------------------------------------

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return variable_defaults()

    def get_default_screen(self) -> Screen:
        return TiledScreen(id="_default")

    def compose(self) -> ComposeResult:
        with TiledVertical(id="body"):
            with TiledHorizontal(id="main"):
                yield LogView(self.state, id="log")
                with Vertical(id="findings-panel"):
                    yield Static("Findings", id="findings-title")
                    yield FindingsList(id="findings")
        with Horizontal(id="prompt-bar"):
            yield Label("/", id="prompt-label")  # the Input joins it on first use: start-up time
        # In a container of their own: Textual redraws every widget whose parent's area meets the
        # changed rows, and the screen's area meets every frame of the log pane.
        with TiledVertical(id="bottom"):
            yield StatusLine(id="status")
            yield KeysFooter(compact=True)

    @property
    def log_view(self) -> LogView:
        view = self._log_view
        if view is None:
            view = self._log_view = self.query_one("#log", LogView)
        return view

    @property
    def findings_list(self) -> FindingsList:
        return self.query_one("#findings", FindingsList)

    @property
    def status_line(self) -> StatusLine:
        line = self._status_line
        if line is None:
            line = self._status_line = self.query_one("#status", StatusLine)
        return line

    def on_mount(self) -> None:
        self.log_view.focus()
        self.user_keymap, problem = load_keymap()
        if self.user_keymap:
            self.set_keymap(self.user_keymap)
        if problem:
            self.state.add_notice("radixtop", "keymap", problem)
        if self.matcher.fallback_note:
            self.state.add_notice("radixtop", "engine", self.matcher.fallback_note)
        for note in getattr(self.catalog, "notes", ()):
            self.state.add_notice("radixtop", "catalog", note)
        if self.banner:
            self.state.add_message([self.banner])
        self.say_node_failures()
        if self.live_options is not None:
            self.panes = self._new_panes(self.live_options)
            # After the first frame: mounting the panes, discovery and the first NVML read would
            # otherwise hold back the log's first screen.
            self.call_after_refresh(self._mount_panes)
        if not self.log_patterns and self.live_options is not None and self.live_options.discover:
            self.state.add_message(["radixtop is looking for SGLang and vLLM servers on this node…"])
        elif not self.log_patterns:
            self.state.add_message(no_log_message())
        elif self._follow_error is not None:
            self.state.add_notice("radixtop", "error", self._follow_error)
        else:
            self._poll_health()
            self._take_backlog()
            self._consume()
            self.call_after_refresh(self._start_history)
        self._schedule_timer(1 / REFRESH_HZ)
        self._tick(force=True)
        self.call_after_refresh(self.start_fleet)
        self.call_after_refresh(self._freeze_startup_objects)

    def _freeze_startup_objects(self) -> None:
        """What start-up built (Textual's modules, styles and widgets: some 70,000 objects) lives
        as long as the app: move it out of the cyclic GC's sight. Each full collection walked it
        all, and while lines stream in, the many small objects of each frame bring one every few
        seconds. Young collections every 10,000 new objects instead of 700 keep the collector a
        small share of the UI thread's CPU at a flood (benchmarks/README.md, "On screen")."""
        gc.collect()
        gc.freeze()
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
        gc.enable()  # the command line keeps it off until here (radixtop/cli.py)

    # -- the live panes ----------------------------------------------------------------------------

    async def _mount_panes(self) -> None:
        panes = self.panes
        if panes is None:
            return
        await self.query_one("#body").mount_all(pane_rows())
        panes.mounted = True
        panes.layout(self.size.width, self.size.height)
        self._run_live()

    @work(exclusive=True, group="live", exit_on_error=False)
    async def _run_live(self) -> None:
        panes = self.panes
        if panes is None:
            return
        try:
            await panes.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.report_failure("watching the server", exc)

    def _new_panes(self, options: LiveOptions) -> Panes:
        return Panes(self, options, follow_log=self.follow_logs, add_lines=self._add_lines,
                     on_status_change=self._update_status)

    def _add_lines(self, lines: list[str]) -> None:
        self.state.add_message(lines)
        self._tick(force=True)

    def on_resize(self, event: Any) -> None:
        if self.panes is not None:
            self.panes.layout(event.size.width, event.size.height)

    # -- reading the logs --------------------------------------------------------------------------

    def _open_logs(self, capacity: int) -> None:
        """Open the logs and start reading now, while Textual starts: the last lines are ready
        (or nearly) when the first frame is drawn."""
        from radixtop.probes.follow import LogFollower

        backlog = capacity if self.from_start else min(BACKLOG_LINES, capacity)
        try:
            # The lines above the backlog are counted after the first frame (start_counting): the
            # count competes for the CPU with Textual's start-up, later the bigger the file.
            self.follower = LogFollower(self.log_patterns, backlog_lines=backlog, history=True, count_delay=COUNT_DELAY,
                                        poll_interval=FOLLOW_POLL_S)
            self.follower.start()
        except (OSError, ValueError, TypeError) as exc:
            self._follow_error = f"cannot follow {self.log_patterns}: {exc}"

    def follow_logs(self, patterns: Sequence[str]) -> None:
        """Start following logs named after start-up (found by discovery, say): their last lines
        at once, the findings of what came before in the background. Does nothing when logs are
        followed already."""
        if self.follower is not None or not patterns:
            return
        self._left_sources.difference_update(patterns)
        self.log_patterns = list(patterns)
        self._follow_error = None
        self._open_logs(self.state.capacity)
        if self._follow_error is not None:
            self.state.add_notice("radixtop", "error", self._follow_error)
            return
        self._poll_health()
        self._take_backlog()
        self._consume()
        self._start_history()
        self._tick(force=True)
        self._offer_pipe()

    def _take_backlog(self) -> None:
        """Apply the files' last lines before the first frame (bounded wait)."""
        follower = self.follower
        try:
            follower.wait_caught_up(INITIAL_WAIT)
            for _ in range(self.state.capacity // 1000 + 10):  # bounded: batches are >= 1000 lines or the end
                batch = follower.take()
                if batch is None:
                    break
                self._ingest(batch)
        except Exception as exc:
            self.report_failure("reading the logs", exc)

    def _ingest(self, batch: Any) -> None:
        result = self.ingestor.process(batch)
        self.state.apply(result)
        if self.panes is not None:
            self.panes.feed_log(batch, result.needles)
        if result.skipped:
            self._history_parts.extend(result.skipped)
            if self._history_started:
                self._start_history()

    def _start_history(self) -> None:
        """Scan the parts of the files before where following began, for their findings."""
        try:
            self._scan_history()
        finally:
            # After the scan has claimed its parts' line counts: the counter leaves those.
            if self.follower is not None and not self._history_started:
                self.follower.start_counting()
            self._history_started = True

    def _scan_history(self) -> None:
        from radixtop.session.history import start_history_scan

        parts, self._history_parts = self._history_parts, []
        if not parts:
            return
        loop = asyncio.get_running_loop()

        def deliver(result: Any) -> None:
            try:
                loop.call_soon_threadsafe(self._apply_now, result)
            except RuntimeError:
                pass  # the app has gone: nothing to show it in

        try:
            start_history_scan(
                parts,
                self.ingestor,
                self.catalog.signatures,
                context=self.builder.context,
                after=self.builder.after,
                stopping=self._stopping,
                deliver=deliver,
            )
        except Exception as exc:  # the live part must not wait for a scan that never runs
            self.report_failure("scanning the logs before where following began", exc)
            for part in parts:
                lines = part.lines if part.wait(0) else 0
                part.close()
                self.state.apply(self.ingestor.release(finding_file(part.source, part.generation), lines))

    def _apply_now(self, result: Any) -> None:
        if not self.is_running:
            return
        self.state.apply(result)
        self._tick()

    @work(exclusive=True, group="logs", exit_on_error=False)
    async def _consume(self) -> None:
        follower = self.follower
        failures = 0
        while True:
            try:
                async for batch in follower.batches():
                    self._ingest(batch)
                    # Draw when the next frame is due. Lines that arrive meanwhile are taken every
                    # INGEST_STEP_S (the matching is spread, not all in the frame's lead-up), and
                    # the files are read once more for the frame, so that it shows the lines
                    # written up to it.
                    for _ in range(100):  # bounded: the wait is at most the pacer's BULK_INTERVAL
                        state = self.state
                        wait = self.pacer.frame_wait(time.monotonic(), state.total_lines, self.log_view.size.height,
                                                     state.lines_per_second())
                        if wait <= 0:
                            break
                        await asyncio.sleep(min(wait, INGEST_STEP_S))
                        self._take_waiting(follower)
                    follower.read_now()
                    self._take_waiting(follower)
                    self._tick()
                    await self._frames_while_flooded(follower)
                return  # the follower was stopped
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                self.report_failure("reading the logs", exc)
                if failures > _MAX_WORKER_RESTARTS:
                    self.state.add_notice(
                        "radixtop", "error", "log reading failed repeatedly; stopped (restart radixtop to retry)"
                    )
                    return
                await asyncio.sleep(min(5.0, 0.5 * failures))

    async def _frames_while_flooded(self, follower: Any) -> None:
        """While lines come faster than a screenful a frame, draw every FRAME_BUSY on the clock,
        each frame from one wake-up: read the files, take and match what came since the last
        one, draw. Frames are timed from when the last was due, not from when it was drawn: the
        reading and matching before a frame would otherwise stretch every interval by their
        time. A wake-up that draws nothing (the writer paused) looks again a frame later; the
        flood ends when the rate over the last seconds falls under a screenful a frame."""
        pacer = self.pacer
        due = pacer.drawn_at + FRAME_BUSY
        for _ in range(1_000_000):  # bounded: hours of flood at FRAME_BUSY; then the caller's loop
            if (self.state.lines_per_second() or 0.0) * FRAME_BUSY < self.log_view.size.height:
                return
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            drawn = pacer.drawn_version
            follower.read_now()
            self._take_waiting(follower)
            now = time.monotonic()
            self._tick(at=due if now - due < FRAME_BUSY / 2 else now)  # on the clock unless far behind
            due = pacer.drawn_at + FRAME_BUSY if pacer.drawn_version != drawn else now + FRAME_BUSY

    def _take_waiting(self, follower: Any) -> None:
        for _ in range(100):  # bounded; each take is at most max_batch lines
            more = follower.take()
            if more is None:
                break
            self._ingest(more)

    def _flush_findings(self) -> None:
        """First occurrences whose lines-after never came (the writer stopped) are reported."""
        if not self._flushing:  # never two at once, and never one cancelled with its report
            self._flushing = True
            self._flush_worker()

    @work(group="flush", exit_on_error=False)
    async def _flush_worker(self) -> None:
        try:
            result = self.ingestor.flush()  # cheap: no matching, only hits that waited
            if result is not None:
                self.state.apply(result)
        except Exception as exc:
            self.report_failure("reporting findings", exc)
        finally:
            self._flushing = False

    def _poll_health(self) -> None:
        self.poll_nodes()
        if self.follower is None:
            return
        try:
            self.state.set_health(self.follower.health())
            shown = self.pacer.status_key
            if shown is not None and self._status_key() != shown:
                self._update_status()  # a file's new state (rotated, deleted ...) shows at once
        except Exception as exc:
            self.report_failure("reading the sources' health", exc)

    def _stop_following(self) -> None:
        self._stop_log_source()
        self._stopping.set()
        for part in self._history_parts:
            part.close()
        self._history_parts = []
        follower, self.follower = self.follower, None
        if follower is not None:
            try:
                follower.stop()
            except Exception as exc:  # quitting must not fail because the follower did
                self.log.error(f"stopping the log follower failed: {exc!r}")

    def _leave_logs(self) -> None:
        """Stop following the logs of a server switched away from, ready to follow the next one's:
        their lines stay in the pane, their sources leave the status line."""
        self._left_sources.update(s.source for s in self.state.sources())
        self._stop_following()
        self._stopping = threading.Event()
        self._history_started = False
        self.log_patterns = []

    async def action_quit(self) -> None:
        await self.stop_actions()  # a confirmation run's control server is stopped first
        self._stop_following()
        self.exit(0)

    def on_unmount(self) -> None:
        self._stop_following()
        self.stop_nodes()

    # -- failures ----------------------------------------------------------------------------------

    def report_failure(self, what: str, exc: BaseException) -> None:
        count = self._failures[what] = self._failures.get(what, 0) + 1
        self.log.error(f"{what} failed:\n{''.join(traceback.format_exception(exc))}")
        if count <= _MAX_FAILURE_NOTICES:
            suffix = "" if count < _MAX_FAILURE_NOTICES else " (further failures of this kind are not shown)"
            self.state.add_notice("radixtop", "error", f"{what} failed: {exc!r}; radixtop keeps running{suffix}")

    # -- the timer: redraw only when something changed ---------------------------------------------

    def _schedule_timer(self, delay: float) -> None:
        self._timer = self.set_timer(delay, self._on_timer, name="radixtop tick")

    def _on_timer(self) -> None:
        """The one timer: the health of the followed files (pacing.HEALTH_EVERY_S), the findings
        whose lines-after never came (only while a hit waits), and the slow redraws (_tick). Its
        pace is FramePacer.timer_delay's: fast while something moves, slow once nothing does, so
        an idle app wakes rarely and starts no worker."""
        try:
            if self.pacer.health_due(time.monotonic()):
                self._poll_health()
            if self.ingestor.has_waiting():
                self._flush_findings()
            self._tick()
        finally:
            if self.is_running:
                delay = self.pacer.timer_delay(time.monotonic(), self.state.version, self.ingestor.has_waiting())
                self._schedule_timer(delay)

    @guarded("refreshing the screen")
    def _tick(self, force: bool = False, at: float | None = None) -> None:
        state, pacer = self.state, self.pacer
        now = time.monotonic() if at is None else at
        drew = False
        # Frames are paced also for this timer's calls: a frame in between the consumer's would
        # cost as much as theirs and show little more.
        if pacer.frame_due(now, state.version, state.total_lines, self.log_view.size.height, state.lines_per_second(),
                           force):
            pacer.drew_frame(now, state.version, state.total_lines)
            self.log_view.refresh_view()
            self._show_findings(now, force)
            drew = True
        self.log_view.keep_following()
        panes = self.panes
        if panes is not None:
            self.watch_server()
            panes.note_report(state.report, self._title_of)
            if drew and not force:
                # Not in the log pane's frame: the box around both is the whole screen, several
                # times the cost of redrawing the panes alone.
                panes.redraw_after_frame()
            else:
                panes.redraw(force)
        # The counters (lines, lines/s) move at most once a second; a mode change, a new
        # initiating failure or a file's new state shows at once (_status_key).
        mode = self._status_key()
        pacer.note_lines(now, state.total_lines)
        how = pacer.status_draw(now, mode, drew, force)
        if how == "now":
            self._update_status()
        elif how == "after_frame":
            self.call_after_refresh(self._update_status)

    def _update_status(self) -> None:
        self.pacer.status_drawn(time.monotonic(), self._status_key())
        self.status_line.show(self.status_info())

    def _status_key(self) -> tuple:
        """What the status line shows at once when it changes: the mode, the first failure, the
        filter and search, each followed file's state (rotated, missing, ...); the counters wait
        for the pacer's STATUS_INTERVAL."""
        state = self.state
        report = state.report
        initiating = report.initiating if report is not None else None
        sources = tuple((view.state, view.detail) for view in state.sources())
        return (state.paused, self.log_view.follow, initiating, state.filter_text, state.search_text, sources)

    def _show_findings(self, now: float, force: bool) -> None:
        report = self.state.report
        ids = tuple(f.signature.id for f in report.findings) if report is not None else ()
        if not self.pacer.findings_due(now, ids, force):
            return
        self.observe_findings(report)  # the automatic evidence bundle
        self.findings_list.show_report(report, self.state.label)
        title = f"Findings ({len(ids)}) · Enter jump · d evidence"
        if title != self._findings_title:  # an update redraws it even when equal: a wider frame per line
            self._findings_title = title
            self.query_one("#findings-title", Static).update(title, layout=False)

    def _title_of(self, sig_id: str) -> str:
        try:
            return self.catalog.get(sig_id).title
        except Exception:
            return sig_id

    def status_info(self) -> StatusInfo:
        state = self.state
        view = self.log_view
        mode = "PAUSED" if state.paused else ("FOLLOW" if view.follow else "SCROLL")
        report = state.report
        initiating = None
        if report is not None and report.initiating is not None:
            sig_id, occ = report.initiating
            try:
                title = self.catalog.get(sig_id).title
            except Exception:
                title = sig_id
            initiating = " ".join(p for p in (occ.rank, time_of_day(occ.time), title) if p)
            if state.source_count > 1:
                initiating += f" ({state.label(occ.file)}:{occ.line})"
        sources = tuple(
            SourceStatus(s.label, s.state, s.detail.replace(s.source + " ", "").replace(s.source, s.label))
            for s in state.sources()
            if s.source not in self._left_sources
        )
        if self.follower is None and self.log_patterns and not sources:
            sources = (SourceStatus("logs", "error", "not followed; see the notice in the pane"),)
        if self.panes is not None:
            sources += tuple(SourceStatus(*s) for s in self.panes.status_sources())
        engine = f"matcher: {self.matcher.engine}"
        return StatusInfo(
            mode=mode,
            position=view.position if mode != "FOLLOW" else None,
            pending=state.pending_count,
            total_lines=state.total_lines,
            rate=state.lines_per_second(),
            sources=sources,
            initiating=initiating,
            findings=len(report.findings) if report is not None else 0,
            findings_hidden=self.screen.has_class("-narrow") and not self.screen.has_class("-show-findings"),
            filter_text=state.filter_text,
            filter_rows=state.view_len if state.filter_text else 0,
            search_text=state.search_text,
            engine=engine,
            extra=self.status_extra(),
        )

    # -- keys (search and filter: tui/search.py; s, the servers: tui/servers.py) ------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if self.allow_incident_action(action) is False:
            return False  # --readonly, the prompt has the keys, or a modal is open
        # Main-screen keys do nothing while the help or evidence screen is open.
        if action in ("pane", "rank") and self.panes is None:
            return False  # no live panes: the keys are not offered
        if action == "server" and (self.panes is None or not self.panes.options.discover):
            return False
        return not (isinstance(self.screen, ModalScreen) and action != "quit")

    @guarded("switch pane")
    def action_pane(self, name: str) -> None:
        if self.panes is not None:
            self.panes.show(name)
            self._tick(force=True)

    @guarded("switch rank")
    def action_rank(self, step: int) -> None:
        if self.panes is not None:
            from radixtop.widgets.radix import RadixPane

            self.query_one(RadixPane).select_step(step)

    @guarded("step through time")
    def action_moment(self, step: int) -> None:
        if self.panes is not None:
            from radixtop.widgets.radix import RadixPane

            self.query_one(RadixPane).step_moment(step)

    @guarded("help")
    def action_help(self) -> None:
        from radixtop.tui.help import HelpScreen  # on first use: start-up time

        self.push_screen(HelpScreen(self.user_keymap))

    @guarded("follow")
    def action_toggle_follow(self) -> None:
        self.log_view.set_follow(not self.log_view.follow)
        self._tick(force=True)

    @guarded("pause")
    def action_toggle_pause(self) -> None:
        state = self.state
        dropped = state.set_paused(not state.paused)
        if dropped:
            self.notify(
                f"{dropped:,} lines read while paused did not fit the {state.capacity:,}-line view buffer; "
                "the findings still include them",
                severity="warning",
            )
        self._tick(force=True)

    @guarded("access lines")
    def action_toggle_access(self) -> None:
        state = self.state
        state.set_fold_access(not state.fold_access)
        self.log_view.invalidate()
        self.notify(
            "HTTP access lines folded: one counted row per second" if state.fold_access
            else f"HTTP access lines shown ({state.folds.hidden_count:,} were folded)",
            timeout=3,
        )
        self._tick(force=True)

    @guarded("cycle theme")
    def action_cycle_theme(self) -> None:
        self.theme = next_theme(self.theme)

    @guarded("findings")
    def action_toggle_findings(self) -> None:
        findings = self.findings_list
        if self.focused is findings:
            self.screen.remove_class("-show-findings")
            self.log_view.focus()
        else:
            self.screen.add_class("-show-findings")
            findings.focus()

    # -- findings ----------------------------------------------------------------------------------

    @guarded("jump to finding")
    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        finding = self.findings_list.finding_at(event.option_index)
        if finding is not None:
            self.jump_to_finding(finding)

    @guarded("evidence")
    def on_findings_list_details_requested(self, event: FindingsList.DetailsRequested) -> None:
        self.push_screen(EvidenceScreen(event.finding, self.state.label))

    def jump_to_finding(self, finding: Any) -> None:
        """Show the finding's first line in the log pane with the lines before it; when that line
        has left the view buffer, show the evidence the FindingsBuilder kept instead."""
        state, view = self.state, self.log_view
        seq = self.find_occurrence(finding.first.file, finding.first.line)
        if seq is not None and state.row_of(seq) is None and state.filter_text:
            state.set_filter(None)
            view.refresh_view()
            self.notify("filter cleared to show the finding", severity="information")
        row = state.row_of(seq) if seq is not None else None
        if row is None:
            self.notify("its first line has left the view buffer: showing the evidence kept for it")
            self.push_screen(EvidenceScreen(finding, state.label))
            return
        height = max(1, view.scrollable_content_region.height)
        view.jump_to_row(row, context=(height * 2) // 3)
        self.screen.remove_class("-show-findings")
        view.focus()
        self._tick(force=True)

    def find_occurrence(self, file: str, line: int) -> int | None:
        """Sequence number of the ring entry for a finding's occurrence (file as the builder saw it)."""
        state = self.state
        # Hits are few and the first occurrence is among the earliest: walk them in order.
        for seq in state.hit_seqs():
            entry = state.entry(seq)
            if entry is not None and entry.lineno == line and finding_file(entry.source, entry.generation) == file:
                return seq
        return None


def run_from_args(args: Namespace) -> int:
    """`radixtop` with no subcommand (radixtop/cli.py's parse)."""
    return run_tui(TuiOptions.from_args(args))


def run_tui(options: TuiOptions) -> int:
    """Entry point for the default command (`radixtop [--log PATH ...]`) and the demo."""
    from radixtop.diagnosis.catalog import CatalogError, load_catalog
    from radixtop.errors import UsageError

    try:
        catalog = load_catalog(options.signatures)
    except CatalogError as exc:
        raise UsageError(str(exc)) from exc
    options, nodes = prepare_nodes(options)
    # What the imports built (modules, classes, functions) lives as long as the process: frozen now,
    # the first frame's collection walks only what the app builds (13 ms instead of 50 here; the
    # cycles the imports left, some 1,300 objects, stay).
    gc.freeze()
    try:
        return _run_app(options, catalog, nodes)
    finally:
        gc.enable()  # should the app have ended before its first frame
        if nodes is not None:
            nodes.stop()


def _run_app(options: TuiOptions, catalog: Any, nodes: NodeWatch | None) -> int:
    from radixtop.errors import ExitStatus

    app = RadixtopApp(
        log_patterns=[*options.logs, *(nodes.patterns() if nodes is not None else ())],
        from_start=options.from_start,
        theme=options.theme,
        catalog=catalog,
        context=options.context,
        banner=options.banner,
        live=_with_nodes(live_options(options), nodes),
        readonly=options.readonly,
        actions=action_settings(options),
        fleet=fleet_url(options.prometheus),
        nodes=nodes,
    )
    fit_terminal()
    signum = run_until_quit(app)
    return ExitStatus.OK if signum is None else 128 + signum  # as a shell reports a signal


def live_options(options: TuiOptions) -> LiveOptions | None:
    """The live panes' options, or None for the log pane alone."""
    if not options.panes:
        return None
    return LiveOptions(url=options.url, instruments=options.instruments, logs=options.logs, gpu=options.gpu,
                       discover=options.discover)


def _with_nodes(live: LiveOptions | None, nodes: NodeWatch | None) -> LiveOptions | None:
    if live is None or nodes is None:
        return live
    return replace(live, node_instruments=nodes.instruments(), node_flight_dirs=nodes.flight_dirs())
