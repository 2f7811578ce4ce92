"""The live sources behind the radix, GPU, processes and vitals panes: which server to watch, the
probes that watch it, and the state their samples fold into. No Textual here: the app runs
`LiveSources.run()` in one worker and redraws the panes from `LiveState` when its version moves.

Attaching: `resolve_targets` takes the user's --url/--log/--instrument (they win) and fills the
rest from discovery (radixtop.probes.discovery): with several servers on the node and nothing
given, the one the user picks (`pick`, the app's picker; it remembers the choice for the session),
else the first SGLang (then vLLM, then simulator) server found; its log file and its ranks' debug
endpoints. A log that is no file (a tmux pane, a journald unit, a container's) is opened as a spool
file (radixtop.probes.logsource) and followed like one. What it found and what it could not is kept
as lines for the log pane.

Following: each probe runs in its own loop at its own interval (a slow source slows only itself).
When the server restarts, its debug endpoints may move (the simulator binds free ports) and its
pid changes: the server probe's /server_info after the restart gives the new endpoints, and
discovery (every few seconds while something is down) the new pid. A source that fails keeps its
last values in the state; the panes show them frozen, with the time the source went down.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from radixtop.probes.discovery import Discovery, FoundServer, discover
from radixtop.probes.flight import FlightProbe, FlightSample
from radixtop.probes.gpu import GpuProbe, GpuSample
from radixtop.probes.kv_events import KvEventsProbe
from radixtop.probes.kv_events_config import KvEventsSource, from_argv, from_server_info
from radixtop.probes.logsource import LogSource, open_source
from radixtop.probes.procs import ProcProbe, ProcsSample
from radixtop.probes.radix import RadixProbe, RadixSample
from radixtop.probes.sglang import ServerProbe, ServerSample
from radixtop.probes.status import SourceState, poll_forever
from radixtop.probes.tokenizer import TokenText, load_for_server
from radixtop.session.flight_views import flight_sample
from radixtop.session.idle_watch import IdleWatch
from radixtop.session.radix_board import RadixBoard, rank_groups
from radixtop.session.vitals import Vitals

REDISCOVER_DOWN_S = 5.0  # look for the server's new pid this often while it is down (a look costs
# about 12 ms of CPU per 100 processes on the node)
REDISCOVER_S = 30.0  # and now and then anyway (a server started after radixtop)
MAX_XIDS = 50


@dataclass
class Targets:
    """What to watch. `pinned_*` say the user chose it (discovery never replaces it)."""

    url: str | None = None
    logs: list[str] = field(default_factory=list)
    instruments: list[str] = field(default_factory=list)
    pid: int | None = None
    kind: str | None = None  # "sglang" | "vllm" | "sim" | None (unknown until the server answers)
    pinned_url: bool = False
    pinned_instruments: bool = False
    picked: bool = False  # the user picked this server among several: rediscovery keeps to it
    lines: list[str] = field(default_factory=list)  # what discovery found / could not, for the log pane
    log_source: LogSource | None = None  # the spool behind `logs` when the log is no file
    kv_events: list[KvEventsSource] = field(default_factory=list)  # publishers, read when no debug endpoint
    # Other nodes' debug endpoints, forwarded to this node's loopback: URL here -> the node's name.
    node_instruments: dict[str, str] = field(default_factory=dict)
    node_flight_dirs: list[Path] = field(default_factory=list)  # their flight records, brought here


_PREFERENCE = {"sglang": 0, "vllm": 1, "sim": 2}


def choose(
    found: Sequence[FoundServer], url: str | None = None, logs: Sequence[str] = (), pid: int | None = None
) -> FoundServer | None:
    """The server to watch: the one at `url` when given; else the one writing a log given with
    --log (`radixtop demo` finds its own simulator so, whatever else runs on the node); else the one
    with `pid` (picked by the user) while it lives; else SGLang before vLLM before the simulator,
    one that answers before one that does not, the oldest first."""
    if url is not None:
        port = url.rstrip("/").rsplit(":", 1)[-1]
        for s in found:
            if s.url == url.rstrip("/") or (s.url and s.url.rsplit(":", 1)[-1] == port):
                return s
        return None
    if logs:
        wanted = {os.path.realpath(p) for pattern in logs for p in (glob.glob(pattern) or [pattern])}
        for s in found:
            if s.log_path and os.path.realpath(s.log_path) in wanted:
                return s
    if pid is not None:
        for s in found:
            if s.pid == pid:
                return s
    order = ranked(found)
    return order[0] if order else None


def ranked(found: Sequence[FoundServer]) -> list[FoundServer]:
    """Servers in the order `choose` prefers them (the picker lists them so)."""
    return sorted(found, key=lambda s: (s.url is None, _PREFERENCE.get(s.kind, 9), s.started))


async def resolve_targets(
    *,
    url: str | None = None,
    logs: Sequence[str] = (),
    instruments: Sequence[str] = (),
    discover_fn: Callable[[], Awaitable[Discovery]] = discover,
    pick: Callable[[Sequence[FoundServer]], Awaitable[FoundServer | None]] | None = None,
) -> Targets:
    targets = Targets(
        url=url.rstrip("/") if url else None,
        logs=list(logs),
        instruments=[u.rstrip("/") for u in instruments],
        pinned_url=bool(url),
        pinned_instruments=bool(instruments),
    )
    found = await discover_fn()
    chosen = choose(found.servers, targets.url, targets.logs)
    if pick is not None and not url and not logs and len(found.servers) > 1:
        picked = await pick(ranked(found.servers))
        if picked is not None:
            chosen, targets.picked = picked, True
    if chosen is not None:
        targets.pid = chosen.pid
        targets.kind = "sglang" if chosen.kind == "sim" else chosen.kind
        if targets.url is None:
            targets.url = chosen.url
        if not targets.logs and chosen.log_path:
            targets.logs = [chosen.log_path]
        elif not targets.logs and chosen.log_elsewhere is not None:
            targets.log_source, why = await asyncio.to_thread(open_source, chosen.log_elsewhere)
            if targets.log_source is not None:
                targets.logs = [targets.log_source.path]
            else:
                chosen = replace(chosen, problems=(*chosen.problems, why))
        if not targets.instruments:
            targets.instruments = list(chosen.instrument_urls)
        if not targets.instruments:  # no radixtop plugin: SGLang's own kv-events, if it publishes them
            targets.kv_events, _ = from_argv(chosen.cmdline, targets.url)
    if targets.url is None and not found.servers:
        targets.lines = found.describe()
    elif chosen is None:
        targets.lines = [
            (f"watching {targets.url} (given with --url); no process of it found on this node, "
             "so the processes pane stays empty"),
            *found.notes,
        ]
    else:
        lines = ["attached by discovery:" if not url else "server given with --url:"]
        lines += Discovery((chosen,), found.notes).describe()
        if targets.log_source is not None:
            lines.append(f"  following {targets.log_source.name} through {targets.log_source.path}")
        others = [s for s in found.servers if s.pid != chosen.pid]
        if others:
            lines.append("also found (s switches server): " + ", ".join(
                f"{s.name} pid {s.pid}{' at ' + s.url if s.url else ''}" for s in others[:4]))
        targets.lines = lines
    return targets


class LiveState:
    """Everything the live panes show; kept (frozen) when a source fails."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.board = RadixBoard()
        self.vitals = Vitals()
        self.idle = IdleWatch()
        self.server: ServerSample | None = None
        self.server_last_ok: float | None = None
        self.gpu: GpuSample | None = None
        self.gpu_last_good: GpuSample | None = None
        self.xids: deque[Any] = deque(maxlen=MAX_XIDS)
        self.procs: ProcsSample | None = None
        self.procs_last_good: ProcsSample | None = None
        self.kind: str | None = None  # "vllm" when the server is vLLM: the radix pane says it needs SGLang
        # The served model's tokenizer (the radix pane's prefixes as text), or why there is none.
        self.tokens: TokenText | None = None
        self.tokens_note = ""  # said from the first /server_info on
        self.version = 0

    # -- intake -------------------------------------------------------------------------------

    def apply(self, sample: Any) -> None:
        if isinstance(sample, RadixSample):
            self.board.add(sample)
            if sample.snapshot is not None and not sample.source and not sample.unchanged:
                self.board.alarm(self.idle.snapshot(sample.rank, sample.snapshot, sample.time))
            if (
                sample.snapshot is not None
                and not sample.unchanged
                and not sample.source
                and (sample.rank or 0) == min(self._ranks(), default=0)
            ):
                self.vitals.feed_radix(sample.snapshot, sample.time)
        elif isinstance(sample, FlightSample):
            for found in sample.records:
                self.board.add(flight_sample(found))
        elif isinstance(sample, ServerSample):
            self._server(sample)
        elif isinstance(sample, GpuSample):
            self.gpu = sample
            if sample.gpus:
                self.gpu_last_good = sample
                self.vitals.feed_gpu(sample, list(self.server_pids()) or None)
            self.xids.extend(sample.xids)
        elif isinstance(sample, ProcsSample):
            self.procs = sample
            if any(p.status != "gone" for p in sample.procs):
                self.procs_last_good = sample
        self.version += 1

    def _ranks(self) -> list[int]:
        return [v.rank for v in self.board.ranks.values() if v.rank is not None]

    def _server(self, sample: ServerSample) -> None:
        self.server = sample
        if sample.status.ok:
            self.server_last_ok = sample.time
        if sample.metrics is not None:
            self.vitals.feed_metrics(sample.metrics, sample.time)
        self.board.alarm(self.idle.server(sample))
        info = sample.info
        if info is not None and info.kind != "unknown":
            self.kind = info.kind

    def set_tokens(self, tokens: TokenText | None, note: str) -> None:
        self.tokens, self.tokens_note = tokens, note
        self.version += 1

    def mark(self, epoch: float | None, label: str) -> None:
        """The first signature appeared at `epoch` (from the log line): mark it on every plot."""
        if epoch is not None:
            self.vitals.mark(epoch, label)
            self.version += 1

    # -- reading ------------------------------------------------------------------------------

    def server_pids(self) -> dict[int, str]:
        """pid -> label ("scheduler TP0") of the server's live processes."""
        procs = self.procs_last_good if self.procs is None or not self.procs.procs else self.procs
        if procs is None:
            return {}
        return {p.pid: p.label for p in procs.procs if p.status != "gone"}

    def groups(self) -> Callable[[int], int] | None:
        info = self.server.info if self.server is not None else None
        return rank_groups(info.tp_size if info is not None and info.dp_size > 1 else None)

    def sources(self) -> list[tuple[str, SourceState]]:
        """(label, status) of every live source, for the status line."""
        out: list[tuple[str, SourceState]] = []
        if self.server is not None:
            out.append(("server", self.server.status))
        for view in self.board.ordered():
            out.append((f"r{view.rank}" if view.rank is not None else "radix", view.status))
        if self.procs is not None:
            out.append(("procs", self.procs.status))
        if self.gpu is not None:
            out.append(("gpu", self.gpu.status))
        return out


def _loopback(url: str) -> bool:
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower()
    return host in ("localhost", "::1") or host.startswith("127.")


class LiveSources:
    """The probes of one attachment, each polled in its own loop, folded into `state`."""

    def __init__(
        self,
        targets: Targets,
        state: LiveState | None = None,
        *,
        gpu: bool = True,
        discover_fn: Callable[[], Awaitable[Discovery]] = discover,
        on_change: Callable[[], None] | None = None,
        on_attach: Callable[[FoundServer], None] | None = None,
        interval_s: float | None = None,
        rediscover_down_s: float = REDISCOVER_DOWN_S,
    ) -> None:
        self.targets = targets
        self.state = state or LiveState()
        self.discover_fn = discover_fn
        self.on_change = on_change
        self.on_attach = on_attach  # told when rediscovery attaches to a (new) server process
        self.server = ServerProbe(targets.url) if targets.url else None
        self.radix: dict[str, RadixProbe] = {u: RadixProbe(u) for u in targets.instruments}
        self.node_radix = {u: RadixProbe(u, node=node) for u, node in targets.node_instruments.items()}
        self.kv: dict[str, KvEventsProbe] = {} if self.radix else {s.url: KvEventsProbe(s) for s in targets.kv_events}
        self.procs = ProcProbe(targets.pid) if targets.pid else None
        self.gpu = GpuProbe() if gpu else None
        self.flight = FlightProbe(self._flight_dirs, lambda: self.targets.pid, lambda: self.targets.node_flight_dirs)
        self.interval_s = interval_s  # overrides every probe's own interval (tests, benchmarks)
        self.rediscover_down_s = rediscover_down_s
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopping = False
        self._tokenizer_for: tuple[str, ...] | None = None  # the server and model paths it was read for
        if self.server is None:
            self.state.tokens_note = "no server URL to ask which model it serves"
        if targets.kind == "vllm":
            self.state.kind = "vllm"

    async def run(self) -> None:
        """Poll everything until cancelled."""
        if self.server is not None:
            self._spawn("server", self.server)
        for url, probe in (*self.radix.items(), *self.node_radix.items()):
            self._spawn(f"radix {url}", probe)
        for url, kv in self.kv.items():
            self._spawn(url, kv)
        if self.procs is not None:
            self._spawn("procs", self.procs)
        if self.gpu is not None:
            self._spawn("gpu", self.gpu)
        self._spawn("flight", self.flight)
        try:
            await self._rediscover_forever()
        finally:
            await self.aclose()

    def _flight_dirs(self) -> list[Path]:
        """Where the ranks said their flight records go (their /health), and the default place."""
        from radixtop.instrument.flight import flight_dir

        named = [Path(v.flight_dir) for v in self.state.board.ranks.values() if v.flight_dir and not v.node]
        return [*named, flight_dir()]

    def _spawn(self, name: str, probe: Any) -> None:
        self._tasks[name] = asyncio.create_task(self._loop(probe), name=f"radixtop {name}")

    async def _stop(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _loop(self, probe: Any) -> None:
        async for sample in poll_forever(probe, interval_s=self.interval_s):
            self.state.apply(sample)
            if isinstance(sample, ServerSample):
                await self._follow_server(sample)
            if self.on_change is not None:
                self.on_change()

    async def _follow_server(self, sample: ServerSample) -> None:
        """After a (re)start the server may name other debug endpoints: follow them."""
        info = sample.info
        if info is not None and info.raw is not None:
            self._follow_tokenizer(info)
        if info is not None and not self.radix and not self.targets.pinned_instruments and not info.instrument_urls:
            await self._follow_kv_events(info)
        if info is None or self.targets.pinned_instruments or not info.instrument_urls:
            return
        wanted = set(info.instrument_urls)
        if wanted == set(self.radix):
            return
        for url in list(self.radix):
            if url not in wanted:
                await self._stop(f"radix {url}")
                probe = self.radix.pop(url)
                await probe.aclose()
                self.state.board.ranks.pop(url, None)
        for url in info.instrument_urls:
            if url not in self.radix:
                self.radix[url] = RadixProbe(url)
                self._spawn(f"radix {url}", self.radix[url])
        self.targets.instruments = list(info.instrument_urls)

    def _follow_tokenizer(self, info: Any) -> None:
        """Read the served model's tokenizer.json once per model (a restart may serve another),
        on a worker thread: a big one takes a second to parse."""
        raw = info.raw
        key = (info.url, str(raw.get("model_path")), str(raw.get("tokenizer_path")))
        if key == self._tokenizer_for:
            return
        self._tokenizer_for = key
        local = _loopback(info.url) or self.targets.pid is not None
        self.state.set_tokens(None, "reading the model's tokenizer.json…")
        old = self._tasks.pop("tokenizer", None)
        if old is not None:
            old.cancel()

        async def load() -> None:
            tokens, note = await asyncio.to_thread(load_for_server, raw, local=local)
            if self._tokenizer_for == key:
                self.state.set_tokens(tokens, note)
                if self.on_change is not None:
                    self.on_change()

        self._tasks["tokenizer"] = asyncio.create_task(load(), name="radixtop tokenizer")

    async def _follow_kv_events(self, info: Any) -> None:
        """No debug endpoint: mirror the publishers /server_info names (SGLang's kv-events)."""
        sources, _ = from_server_info(info.raw or {}, self.targets.url)
        for source in sources:
            if source.url not in self.kv:
                self.kv[source.url] = KvEventsProbe(source)
                self._spawn(source.url, self.kv[source.url])

    def _something_down(self) -> bool:
        st = self.state
        if self.server is None:
            return True  # nothing attached yet: look for a server starting
        return bool(
            (st.procs is not None and st.procs.status.state == "down")
            or (st.server is not None and st.server.status.state == "down")
        )

    async def _rediscover_forever(self) -> None:
        last = time.monotonic()
        while not self._stopping:
            await asyncio.sleep(self.rediscover_down_s)
            now = time.monotonic()
            if not self._something_down() and now - last < REDISCOVER_S:
                continue
            last = now
            await self.rediscover()

    async def rediscover(self) -> None:
        """Find the server again (a new pid after a restart; a server that appeared later)."""
        found = await self.discover_fn()
        chosen = choose(
            found.servers, self.targets.url, self.targets.logs, self.targets.pid if self.targets.picked else None
        )
        if chosen is None:
            return
        if chosen.pid != self.targets.pid:
            if self.on_attach is not None:
                self.on_attach(chosen)
            await self._stop("procs")
            self.targets.pid = chosen.pid
            self.procs = ProcProbe(chosen.pid)
            self._spawn("procs", self.procs)
        if self.server is None and chosen.url:
            self.targets.url = chosen.url
            self.server = ServerProbe(chosen.url)
            self._spawn("server", self.server)
        if not self.radix and not self.targets.pinned_instruments:
            for url in chosen.instrument_urls:
                self.radix[url] = RadixProbe(url)
                self._spawn(f"radix {url}", self.radix[url])

    async def aclose(self) -> None:
        self._stopping = True
        if self.targets.log_source is not None:
            await asyncio.to_thread(self.targets.log_source.stop)
        for name in list(self._tasks):
            await self._stop(name)
        for probe in (self.server, self.procs, self.gpu, *self.radix.values(), *self.node_radix.values(),
                      *self.kv.values()):
            if probe is not None:
                with contextlib.suppress(Exception):
                    await probe.aclose()
