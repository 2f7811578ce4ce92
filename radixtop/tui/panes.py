"""The live panes inside the app: radix, vitals, GPU, processes; their layout, keys and redraws.

Layout: a screen at least WIDE_MIN columns by TALL_MIN rows shows everything at once (the log and
findings on top, radix | vitals, then GPU | processes); a smaller one shows one pane at a time,
chosen with 1 log, 2 radix, 3 GPU, 4 processes, 5 vitals. On a big screen the same keys zoom one
pane, and the key again (or 0) shows everything.

Redraws: on the app's timer, at most PANES_HZ times a second, every visible pane whose data moved
is redrawn, all in the same frame (Textual renders one box around everything that changed in a
frame: panes redrawn at scattered moments cost one such pass each); the vitals every
VITALS_REDRAW_S anyway (their time axis moves). Hidden panes are not drawn. Nothing here waits on
I/O: the probes run in one worker (LiveSources.run).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from textual.containers import Horizontal

from radixtop.widgets.fmt import clock

# The probes and the pane widgets are imported when first used, after the log's first frame:
# discovery (psutil), the HTTP probes and the schema cost 70-100 ms of start-up here, and this
# module is imported by the app whether or not the panes are shown.
if TYPE_CHECKING:
    from radixtop.probes.status import SourceState
    from radixtop.session.live import LiveSources, LiveState, Targets
    from radixtop.session.needles import NeedleLines
    from radixtop.session.printed import PrintedTrees
    from radixtop.session.vitals import LiveLines

RADIX_SUBSYSTEM = "radix-cache"  # the signatures' subsystem the radix pane repeats from the log


class LogFinding(NamedTuple):
    """A radix-cache signature as the log showed it, for the radix pane."""

    epoch: float | None  # its first occurrence
    rank: str | None
    title: str
    count: int  # type: ignore[assignment]  # shadows tuple.count, which nothing here calls
    severity: str


WIDE_MIN = 140
TALL_MIN = 40
PANES_HZ = 1.0  # the live panes are redrawn together, at most this often (sources poll every 2 s)
VITALS_REDRAW_S = 2.0  # the vitals also when nothing moved, for their time axis
# The log's lines feed the vitals at most this often (each read parses a batch's last lines; the
# series keep one value a second and are drawn once a second, and a batch comes every few
# milliseconds under a flood).
VITALS_READ_S = 0.25
PANES = ("log", "radix", "gpu", "procs", "vitals")
PANE_KEYS = {"1": "log", "2": "radix", "3": "gpu", "4": "procs", "5": "vitals"}
_WIDGET_IDS = {"radix": "#radix-pane", "gpu": "#gpu-pane", "procs": "#procs-pane", "vitals": "#vitals-pane"}
LOG_BACKLOG_LINES = 20_000  # read before the panes run: the vitals' history from the log


@dataclass(frozen=True)
class LiveOptions:
    """What the user asked to watch (--url, --instrument; --log is the log pane's)."""

    url: str | None = None
    instruments: tuple[str, ...] = ()
    logs: tuple[str, ...] = ()  # --log patterns: the server writing one of them is the one watched
    gpu: bool = True
    discover: bool = True  # False: no discovery at all (tests, or a --url that is elsewhere)
    node_instruments: tuple[tuple[str, str], ...] = ()  # other nodes' forwarded endpoints: (URL here, node)
    node_flight_dirs: tuple[str, ...] = ()  # where their flight records are brought


def pane_rows() -> list[Horizontal]:
    """The panes' two rows, to mount under the log once the first frame is up."""
    from radixtop.widgets.gpu import GpuPane
    from radixtop.widgets.procs import ProcsPane
    from radixtop.widgets.radix import RadixPane
    from radixtop.widgets.vitals import VitalsPane

    return [
        Horizontal(
            RadixPane(id="radix-pane", classes="pane"),
            VitalsPane(id="vitals-pane", classes="pane"),
            id="row-a",
            classes="pane-row",
        ),
        Horizontal(
            GpuPane(id="gpu-pane", classes="pane"),
            ProcsPane(id="procs-pane", classes="pane"),
            id="row-b",
            classes="pane-row",
        ),
    ]


def _short(text: str, limit: int = 48) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def source_detail(state: SourceState) -> str:
    """What the status line says about a source that is not ok."""
    if state.state == "down":
        return f"since {clock(state.since)}"
    return _short(state.message)


class Panes:
    """The app's live side. The app calls start() once mounted, tick() on its timer, layout() on
    resize, and reads status_sources() for the status line."""

    def __init__(
        self,
        app: Any,
        options: LiveOptions,
        *,
        follow_log: Callable[[list[str]], None],
        add_lines: Callable[[list[str]], None],
        clock_fn: Callable[[], float] = time.time,
        on_status_change: Callable[[], None] | None = None,
    ) -> None:
        self.app = app
        self.options = options
        self.follow_log = follow_log  # start following a log the discovery found
        self.add_lines = add_lines  # guidance lines into the log pane
        self.clock = clock_fn
        self._state: LiveState | None = None  # made when first needed (see the imports above)
        # The pane widgets are mounted after the log's first frame; until then the panes keep the
        # log's last lines (the backlog feeds the vitals once they run) and draw nothing.
        self.mounted = False
        self._log_backlog: deque[str] = deque(maxlen=LOG_BACKLOG_LINES)
        self.on_status_change = on_status_change  # a live source changed state: redraw the status line now
        self._status_key: tuple = ()
        self.sources: LiveSources | None = None
        self.targets: Targets | None = None
        self.zoom: str | None = None  # the pane shown alone on a big screen
        self.shown = "log"  # the pane shown on a small screen
        self._requested: str | None = None  # a pane key pressed before the panes were mounted
        self.wide = False
        self._drawn: dict[str, tuple[Any, float]] = {}
        self._widgets: dict[str, Any] = {}  # pane widgets looked up once
        self._redraw_pending = False
        self._frame_at = -1e9
        self._marked: str | None = None
        self._radix_log: tuple[LogFinding, ...] = ()
        self._printed: PrintedTrees | None = None  # the trees the server printed into its log
        self._printed_backlog: list[Any] = []  # the log's runs read before the state was made
        self._vitals_lines: LiveLines | None = None  # the log's lines the vitals have not read yet
        self._vitals_read_at = -1e9  # monotonic

    @property
    def state(self) -> LiveState:
        if self._state is None:
            from radixtop.session.live import LiveState

            self._state = LiveState()
            runs, self._printed_backlog = self._printed_backlog, []
            self._read_printed_trees(runs)
        return self._state

    @property
    def live(self) -> LiveState | None:
        """The state if it was made: for those who only look (making it costs the first frame)."""
        return self._state

    # -- starting ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Resolve what to watch, then poll it until cancelled (the app runs this in a worker)."""
        from radixtop.session.live import LiveSources, Targets, resolve_targets

        if self._log_backlog:  # the lines read before the first frame, for the vitals
            texts, self._log_backlog = list(self._log_backlog), deque(maxlen=LOG_BACKLOG_LINES)
            self._feed_texts(texts)
        opts = self.options
        discoverer = _discoverer(opts.url) if opts.discover else _nothing  # one, so what it described is asked once
        if opts.discover:
            targets = await resolve_targets(url=opts.url, logs=opts.logs, instruments=opts.instruments,
                                            discover_fn=discoverer, pick=getattr(self.app, "pick_server", None))
        else:
            targets = Targets(url=opts.url, instruments=list(opts.instruments), pinned_url=bool(opts.url),
                              pinned_instruments=bool(opts.instruments))
        targets.node_instruments = dict(opts.node_instruments)
        targets.node_flight_dirs = [Path(d) for d in opts.node_flight_dirs]
        self.targets = targets
        if targets.lines:
            self.add_lines(targets.lines)
        if not opts.logs and targets.logs:
            self.follow_log(targets.logs)
        if targets.kind == "vllm":
            self.state.kind = "vllm"

        def attached(found: Any) -> None:
            self.add_lines([f"attached to {found.name} pid {found.pid}" + (f" at {found.url}" if found.url else "")])
            if not self.options.logs and found.log_path and not getattr(self.app, "log_patterns", None):
                self.follow_log([found.log_path])

        self.sources = LiveSources(
            targets,
            self.state,
            gpu=opts.gpu,
            discover_fn=discoverer,
            on_attach=attached,
            on_change=self._sources_changed,
        )
        await self.sources.run()

    def _sources_changed(self) -> None:
        """After each sample: when a source's state moved (attached, down, back) the status line
        says so at once, not at the app's next idle tick (up to 2 s later)."""
        key = tuple((label, s.state, s.since) for label, s in self.state.sources())
        if key != self._status_key:
            self._status_key = key
            if self.on_status_change is not None:
                self.on_status_change()

    # -- log lines and findings -------------------------------------------------------------

    def feed_log(self, batch: Any, needles: NeedleLines | None = None) -> None:
        """Vitals from the log's batch lines, only while /metrics does not feed them (before the
        panes run, the last lines are kept for them); and the server probe told its log spoke.
        `needles`: where the ingest's pass found the readers' needles in the batch (else they look)."""
        runs = getattr(batch.records, "runs", None)
        server = self.sources.server if self.sources is not None else None
        if server is not None:  # lazily: the first line almost always decides
            server.log_spoke(chain.from_iterable(run.texts for run in runs) if runs is not None
                             else (r.text for r in batch.records))
        if runs is not None:
            if self._state is None:  # the first frame does not wait for the radix pane's imports
                self._printed_backlog.extend(runs)
            else:
                self._read_printed_trees(runs, needles)
        if self._state is not None and not self._log_feeds_vitals():
            return
        texts: Sequence[str]
        if runs is not None:
            # A flood's batch is one read: its lines as they are, no copy.
            texts = runs[0].texts if len(runs) == 1 else list(chain.from_iterable(run.texts for run in runs))
        else:
            texts = [r.text for r in batch.records]
        if self._state is None:
            self._log_backlog.extend(texts)
            return
        from radixtop.diagnosis.needles import RARE_NEEDLES
        from radixtop.session.vitals import LiveLines

        if self._vitals_lines is None:
            self._vitals_lines = LiveLines()
        self._vitals_lines.add(texts, needles.of(RARE_NEEDLES) if needles is not None else None)
        if time.monotonic() - self._vitals_read_at >= VITALS_READ_S:
            self.read_vitals()

    def read_vitals(self) -> None:
        """Feed the vitals the lines that came since they last read (LiveLines' rule)."""
        self._vitals_read_at = time.monotonic()
        if self._vitals_lines is not None and len(self._vitals_lines):
            self._feed_texts(self._vitals_lines.take())

    def _read_printed_trees(self, runs: Any, needles: NeedleLines | None = None) -> None:
        """A tree SGLang printed at a failure gets a view of its own in the radix pane."""
        if self._printed is None:
            from radixtop.session.printed import PrintedTrees

            self._printed = PrintedTrees()
        start = 0
        for run in runs:
            size = len(run.texts)
            found = needles.found(start, start + size) if needles is not None else None
            start += size
            for sample in self._printed.feed(run.source, run.texts, found):
                self.state.board.add(sample)

    def _log_feeds_vitals(self) -> bool:
        usage = self.state.vitals.series["token_usage"]
        return not (usage.source == "metrics" and self.clock() - usage.updated < 15)

    def _feed_texts(self, texts: Sequence[str]) -> None:
        """Callers have checked `_log_feeds_vitals` (the backlog is fed before any source runs)."""
        from radixtop.session.vitals import log_observations

        observations = log_observations(texts, now=self.clock(), latest_only=True)
        if observations:
            self.state.vitals.feed_log(observations)
            self.state.version += 1

    def note_report(self, report: Any, title_of: Callable[[str], str]) -> None:
        """Mark the initiating failure's moment (the earliest cause, see findings.py) on every
        plot, and hand the radix pane what the log says about the radix cache (a rank that raised
        RadixCacheError is usually dead before its endpoint is read again)."""
        findings = getattr(report, "findings", ()) if report is not None else ()
        self._radix_log = tuple(
            LogFinding(f.first.epoch, f.first.rank, f.signature.title, f.count, f.signature.severity)
            for f in findings
            if f.signature.subsystem == RADIX_SUBSYSTEM
        )
        initiating = getattr(report, "initiating", None) if report is not None else None
        if initiating is None:
            return
        sig_id, occ = initiating
        key = f"{sig_id}@{occ.epoch}"
        if key != self._marked and occ.epoch is not None:
            self._marked = key
            rank = f"{occ.rank} " if occ.rank else ""
            self.state.mark(occ.epoch, f"{rank}{title_of(sig_id)}")

    # -- layout and keys --------------------------------------------------------------------

    def layout(self, width: int, height: int) -> None:
        if not self.mounted:
            return
        self.wide = width >= WIDE_MIN and height >= TALL_MIN
        # A pane key pressed before the panes were mounted (they come after the log's first frame)
        # takes effect now rather than being lost.
        requested, self._requested = self._requested, None
        if requested is not None:
            self._select(requested)
        visible = self.visible()
        app = self.app
        screen = app.screen
        main = app.query_one("#main")
        row_a, row_b = app.query_one("#row-a"), app.query_one("#row-b")
        main.display = "log" in visible
        row_a.display = bool({"radix", "vitals"} & visible)
        row_b.display = bool({"gpu", "procs"} & visible)
        for name, selector in _WIDGET_IDS.items():
            app.query_one(selector).display = name in visible
        # A class on the screen restyles every widget in it (30 to 50 ms with the panes): only the
        # one the stylesheet reads is set, and set_class leaves a class that is already so.
        screen.set_class(len(visible) == 1, "-pane-alone")
        self.redraw(force=True)
        if requested is not None:
            self._focus()

    def visible(self) -> set[str]:
        if not self.wide:
            return {self.shown}
        return set(PANES) if self.zoom is None else {self.zoom}

    def show(self, name: str) -> None:
        """Key 1-5 (or 0 = everything / the log). Before the panes are mounted, the last key
        pressed is kept and applied when they are."""
        if name not in PANES and name != "all":
            name = "log"
        if not self.mounted:
            self._requested = name
            return
        self._select(name)
        self.layout(self.app.size.width, self.app.size.height)
        self._focus()

    def _select(self, name: str) -> None:
        if self.wide:
            self.zoom = None if (self.zoom == name or name == "all") else name
        else:
            self.shown = "log" if name == "all" else name

    def _focus(self) -> None:
        target = self.zoom if self.wide else self.shown
        if target == "radix":
            from radixtop.widgets.radix import RadixTreeView

            self.app.query_one(RadixTreeView).focus()
        elif target in (None, "log"):
            self.app.log_view.focus()

    @property
    def current(self) -> str:
        return (self.zoom or "all") if self.wide else self.shown

    # -- drawing ----------------------------------------------------------------------------

    def _keys(self) -> dict[str, Any]:
        """What each pane shows, as something comparable: a pane is redrawn when its key moved."""
        st = self.state
        gpu, procs = st.gpu, st.procs
        return {
            "radix": self._radix_key(),
            "vitals": (st.vitals.version, st.server.status if st.server is not None else None, self._moment()),
            "gpu": (None if gpu is None else (gpu.status, gpu.gpus, len(st.xids), gpu.xid_note), self._node_gpus()),
            "procs": None if procs is None else (procs.status, procs.procs, procs.problems),
        }

    def _node_gpus(self) -> tuple[Any, ...]:
        """Other nodes' GPUs, as their streams last reported them (radixtop --node)."""
        nodes = getattr(self.app, "nodes", None)
        return tuple(nodes.gpus()) if nodes is not None else ()

    def _moment(self) -> float | None:
        """The time of what the radix pane shows when it is not live (an earlier snapshot, a
        flight record, a print): the vitals mark it."""
        pane = self._widgets.get("radix")
        if pane is None:
            return None
        view = self.state.board.ranks.get(pane.selected) if pane.selected else None
        if view is None or view.snapshot is None or (view.cursor is None and not view.name):
            return None
        return view.moment_times()[view.cursor if view.cursor is not None else -1]

    def _radix_key(self) -> Any:
        """The radix pane shows one rank: its own view, and of the others only what the title and
        the "ranks disagree" line say (state, tree digest at rest). Another rank's new snapshot
        redrew it too (with 2 ranks polled 2 s apart, twice as often as the shown one moved)."""
        st = self.state
        board = st.board
        pane = self._widgets.get("radix")
        if pane is None:
            from radixtop.widgets.radix import RadixPane

            pane = self._widgets["radix"] = self.app.query_one(RadixPane)
        selected = board.ranks.get(pane.selected) if pane.selected else None
        others = tuple(
            (v.url, v.rank, v.status.state, v.status.since, v.digest if v.digest_steady else "")
            for v in board.ranks.values()
        )
        return (
            st.kind,
            self.targets is None,
            pane.selected,
            selected.version if selected is not None else None,
            others,
            self._radix_log,
            (id(st.tokens), st.tokens_note),
        )

    def redraw_after_frame(self) -> None:
        """redraw() once the frame being drawn is on screen (the app's log pane frame), so that
        the panes get a frame of their own; calls in between add nothing."""
        if self.mounted and not self._redraw_pending and time.monotonic() - self._frame_at >= 1.0 / PANES_HZ:
            self._redraw_pending = True
            self.app.call_after_refresh(self._redraw_pending_now)

    def _redraw_pending_now(self) -> None:
        self._redraw_pending = False
        self.redraw()

    def redraw(self, force: bool = False) -> None:
        """Redraw the visible panes whose data moved, all in one frame (one compositor pass for all
        of them, instead of one per pane), at most PANES_HZ times a second."""
        now_m = time.monotonic()
        if not self.mounted or (not force and now_m - self._frame_at < 1.0 / PANES_HZ):
            return
        if self._vitals_lines is not None and len(self._vitals_lines):
            self.read_vitals()  # the last lines of a burst, which no later batch brings in
        self._frame_at = now_m
        visible = self.visible()
        keys = self._keys()
        for name in ("radix", "vitals", "gpu", "procs"):
            if name not in visible:
                continue
            last_key, last_at = self._drawn.get(name, (object(), -1e9))
            moved = keys[name] != last_key
            axis = name == "vitals" and now_m - last_at >= VITALS_REDRAW_S
            if force or moved or axis:
                self._drawn[name] = (keys[name], now_m)
                self._draw(name)

    def _draw(self, name: str) -> None:
        from radixtop.widgets.gpu import GpuPane
        from radixtop.widgets.procs import ProcsPane
        from radixtop.widgets.radix import NEEDS_SGLANG, RadixPane
        from radixtop.widgets.vitals import VitalsPane

        st = self.state
        now = self.clock()
        app = self.app
        if name == "radix":
            note = ""
            if st.kind == "vllm":
                note = NEEDS_SGLANG
            elif self.targets is None:
                note = "looking for servers on this node…"
            pane = app.query_one(RadixPane)
            # The rows' prefixes as text with the served model's tokenizer (or why they stay ids).
            pane.tree_view.set_text_source(st.tokens, st.tokens_note)
            pane.show(st.board, now=now, note=note, groups=st.groups(), from_log=self._radix_log)
        elif name == "vitals":
            status = st.server.status if st.server is not None else None
            note = ""
            if st.server is not None and st.server.metrics_note and st.vitals.series["token_usage"].source != "log":
                note = st.server.metrics_note
            app.query_one(VitalsPane).show(st.vitals, status=status, note=_short(note, 90), now=now,
                                           cursor=self._moment())
        elif name == "gpu":
            app.query_one(GpuPane).show(st.gpu, server_pids=st.server_pids(), xids=list(st.xids),
                                        last_good=st.gpu_last_good, now=now, nodes=self._node_gpus())
        elif name == "procs":
            app.query_one(ProcsPane).show(st.procs, now=now, last_good=st.procs_last_good)

    # -- status line ------------------------------------------------------------------------

    def status_sources(self) -> list[tuple[str, str, str]]:
        """(label, state, detail) for each live source (none before the panes run)."""
        if self._state is None:
            return []
        return [(label, s.state, "" if s.ok else source_detail(s)) for label, s in self._state.sources()]


def _discoverer(url: str | None) -> Callable[[], Any]:
    from radixtop.probes.discovery import Rediscovery

    return Rediscovery(url)


async def _nothing() -> Any:
    from radixtop.probes.discovery import Discovery

    return Discovery()
