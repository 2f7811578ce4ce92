"""Client of radixtop's debug endpoint (radixtop/schema.py): one rank's snapshot, events and health.

`RadixProbe.poll()` fetches the snapshot (and the events since the last poll, and now and then the
health) and returns a `RadixSample`; it never raises: garbage, a wrong schema version, a timeout, an
answer too large or a server that went away are each a `status` with one line saying what to do.
Parsing and indexing the tree run in a thread (a 100,000-node snapshot takes a while), and an answer
byte-identical to the previous one is not parsed again.

`RadixBoard` is the pure side: it folds the samples of every rank into what the radix pane shows
(the last good snapshot per rank, eviction rates, lock anomalies with their times, whether the
ranks' trees agree), keeping the last values while a rank is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from radixtop.probes.http import Fetched, PolledProbe, fetch, is_loopback_url
from radixtop.probes.status import SourceState, StateClock, one_line
from radixtop.schema import (
    BUDGET_PARAM,
    EVENTS_PATH,
    HEALTH_PATH,
    LIMIT_PARAM,
    MAX_PAYLOAD_BYTES,
    MAX_TREE_NODES,
    SINCE_PARAM,
    SNAPSHOT_PATH,
    Event,
    Health,
    NodeRow,
    Snapshot,
    parse_error,
    parse_events,
    parse_health,
    parse_snapshot,
)

if TYPE_CHECKING:  # imported when first used: httpx costs ~70 ms of start-up
    import httpx

DEFAULT_INTERVAL_S = 2.0
DEFAULT_BUDGET = 5_000  # nodes asked for; the server caps it at its own max_budget
MAX_SNAPSHOT_BYTES = 32 * 1024 * 1024  # 200,000 nodes are ~16 MiB; more than twice that is not a snapshot
MAX_EVENTS_BYTES = 8 * 1024 * 1024
EVENT_PAGE = 1_000
EVENT_PAGES_PER_POLL = 5
HEALTH_EVERY_S = 30.0  # the snapshot carries hooks_state; health adds only the endpoint's own view
INLINE_PARSE_BYTES = 64 * 1024  # smaller answers are parsed on the loop (a thread hop costs more)
SPLICE_PARSE_BYTES = 256 * 1024  # larger ones are parsed row by row (see _parse_spliced)
ANOMALY_KINDS = frozenset(
    {"negative_lock_ref", "lock_failure", "unlock_failure", "evict_failure", "evict_short", "hooks_disabled", "instrument_error"}
)


# ----------------------------------------------------------------------------------------------
# The tree, indexed for lazy display


@dataclass(frozen=True, slots=True)
class TreeIndex:
    """Children of each row (locked first, then the heaviest subtree) and which rows lead to a lock.

    `marks[row]` is a bit set: 1 the row or a descendant holds a lock (lock_ref > 0), 2 the row or
    a descendant has a negative lock_ref (a double unlock)."""

    children: tuple[tuple[int, ...], ...]
    marks: bytes
    depth_max: int

    LOCKED = 1
    NEGATIVE = 2

    @classmethod
    def build(cls, snapshot: Snapshot) -> TreeIndex | None:
        tree = snapshot.tree
        if tree is None:
            return None
        nodes = tree.nodes
        n = len(nodes)
        kids: list[list[int]] = [[] for _ in range(n)]
        marks = bytearray(n)
        depth = [0] * n
        for i in range(1, n):
            p = nodes[i].parent
            kids[p].append(i)
            depth[i] = depth[p] + 1
        for i in range(n - 1, -1, -1):  # children come after their parent: one backward pass
            lr = nodes[i].lock_ref
            if lr > 0:
                marks[i] |= cls.LOCKED
            elif lr < 0:
                marks[i] |= cls.NEGATIVE
            if i:
                marks[nodes[i].parent] |= marks[i]

        def weight(row: int) -> tuple[int, int]:
            node = nodes[row]
            sub = node.subtree_tokens if node.subtree_tokens is not None else node.tokens
            return (-(marks[row] & cls.NEGATIVE), -(marks[row] & cls.LOCKED), -sub)

        ordered = tuple(tuple(sorted(k, key=weight)) if len(k) > 1 else tuple(k) for k in kids)
        return cls(ordered, bytes(marks), max(depth) if depth else 0)


def parse_and_index(data: bytes) -> tuple[Snapshot, TreeIndex | None]:
    """Parse (all checks of radixtop.schema) and index a snapshot; ValueError with one line."""
    if len(data) <= SPLICE_PARSE_BYTES:
        snapshot = parse_snapshot(data)
        return snapshot, TreeIndex.build(snapshot)
    with _no_gc_pauses():
        snapshot = _parse_spliced(data) if len(data) <= MAX_PAYLOAD_BYTES else None
        if snapshot is None:
            snapshot = parse_snapshot(data)
        return snapshot, TreeIndex.build(snapshot)


_gc_lock = threading.Lock()
_gc_depth = 0
_gc_was_enabled = True


@contextlib.contextmanager
def _no_gc_pauses() -> Iterator[None]:
    """A big snapshot is a few hundred thousand new containers: with the cyclic GC on, its
    collections walk them (and the whole app) over and over, holding the GIL for 100+ ms at a time
    and freezing the UI thread. Off while building (its objects have no cycles; refcounting frees
    them), then frozen out of future collections (gc.freeze), then on again."""
    global _gc_depth, _gc_was_enabled
    with _gc_lock:
        if _gc_depth == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_depth += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth -= 1
            if _gc_depth == 0:
                gc.freeze()
                if _gc_was_enabled:
                    gc.enable()


_NODES_KEY = re.compile(r'"nodes"\s*:\s*\[')
_WS = " \t\n\r"


def _parse_spliced(data: bytes) -> Snapshot | None:
    """A big snapshot parsed without one long C call: json.loads of a 6 MB answer holds the GIL
    for hundreds of milliseconds, which would freeze the UI thread however the parse is threaded.
    The tree's rows are decoded one at a time (raw_decode, so the interpreter can switch threads
    between rows), the rest of the document in one small call, and the whole then goes through
    Snapshot.from_dict's checks. None when the document is not shaped as expected: the caller
    then parses it whole (and reports its errors)."""
    try:
        text = data.decode("utf-8")
        m = _NODES_KEY.search(text)
        if m is None:
            return None
        decoder = json.JSONDecoder()
        rows: list[Any] = []
        i, n = m.end(), len(text)
        while i < n and text[i] in _WS:
            i += 1
        if i < n and text[i] == "]":
            end = i + 1
        else:
            pace = _Pacer()
            while True:
                if len(rows) > MAX_TREE_NODES + 1:
                    return None
                row, i = decoder.raw_decode(text, i)
                rows.append(row)
                if not len(rows) & 511:
                    pace()
                while i < n and text[i] in _WS:
                    i += 1
                if i >= n:
                    return None
                c = text[i]
                i += 1
                if c == "]":
                    end = i
                    break
                if c != ",":
                    return None
                while i < n and text[i] in _WS:
                    i += 1
        obj = json.loads(text[: m.start()] + '"nodes":[]' + text[end:])
        tree = obj.get("tree") if isinstance(obj, dict) else None
        if not isinstance(tree, dict) or tree.get("nodes") != [] or not rows:
            return None  # the key was somewhere else
    except (ValueError, RecursionError):
        return None
    # Everything but the rows after the root is checked by the schema on a one-row tree; then each
    # row by the schema's own row check, with the walked count checked as TreeView.from_dict does.
    walked = tree.get("walked_nodes")
    tree["nodes"], tree["walked_nodes"] = rows[:1], 0
    snapshot = Snapshot.from_dict(obj)
    if snapshot.tree is None:
        return snapshot
    if type(walked) is not int or walked < 0:
        raise ValueError(f"snapshot.tree.walked_nodes: expected an integer in [0, {2**63 - 1}], got {walked!r}")
    if walked != len(rows) - 1:
        raise ValueError(f"snapshot.tree.walked_nodes: says {walked} but {len(rows) - 1} non-root rows were sent")
    nodes = [snapshot.tree.nodes[0]]
    pace = _Pacer()
    try:
        for i in range(1, len(rows)):
            nodes.append(NodeRow.from_row(rows[i], i, "snapshot.tree.nodes"))
            if not i & 511:
                pace()
    except ValueError:
        raise
    except Exception as exc:  # as the schema's own guard does: never anything but a ValueError
        raise ValueError(f"snapshot: malformed ({type(exc).__name__})") from None
    return replace(snapshot, tree=replace(snapshot.tree, nodes=tuple(nodes), walked_nodes=walked))


class _Pacer:
    """Called now and then from a long loop on a worker thread: after every few milliseconds of
    work, sleep a little, so the UI thread gets the GIL at once instead of at the interpreter's
    next switch (which, on a loaded machine, can be a whole OS time slice away)."""

    def __init__(self, work_s: float = 0.004, rest_s: float = 0.001) -> None:
        self.work_s, self.rest_s = work_s, rest_s
        self.since = time.perf_counter()

    def __call__(self) -> None:
        now = time.perf_counter()
        if now - self.since >= self.work_s:
            time.sleep(self.rest_s)
            self.since = time.perf_counter()


# ----------------------------------------------------------------------------------------------
# Freeing a big tree without freezing the UI

BIG_TREE_NODES = 20_000  # smaller trees are freed where they are dropped (a few ms at most)
_RELEASE_CHUNK = 4_000


class _Graveyard:
    """Freeing a 100,000-node snapshot is one C loop of a million decrefs: ~100 ms holding the
    GIL, on whichever thread drops the last reference, usually the UI's. `discard()` hands the
    object to a daemon thread instead, which waits until it holds the only reference and then
    frees the rows a few thousand at a time, resting between chunks."""

    def __init__(self) -> None:
        self._pending: dict[int, tuple[float, Any]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def discard(self, obj: Any) -> None:
        if obj is None or _tree_size(obj) < BIG_TREE_NODES:
            return
        with self._lock:
            self._pending.setdefault(id(obj), (time.monotonic(), obj))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="radixtop-release", daemon=True)
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(1.0)
            self._wake.clear()
            time.sleep(0.5)  # let the UI drop its references first
            with self._lock:
                keys = list(self._pending)
            for key in keys:
                with self._lock:
                    entry = self._pending.pop(key, None)
                if entry is None:
                    continue
                since, obj = entry
                del entry
                # `obj` and getrefcount's argument: anyone else still uses it, so wait
                if sys.getrefcount(obj) > 2 and time.monotonic() - since < 60:
                    with self._lock:
                        self._pending.setdefault(key, (since, obj))
                    del obj
                    continue
                rows = _release_parts(obj)
                del obj  # cheap now: `rows` keeps the members alive
                while rows:
                    del rows[-_RELEASE_CHUNK:]
                    time.sleep(0.001)
            if self._pending:
                self._wake.set()


def _tree_size(obj: Any) -> int:
    if isinstance(obj, Snapshot):
        return len(obj.tree.nodes) if obj.tree is not None else 0
    if isinstance(obj, TreeIndex):
        return len(obj.children)
    return 0


def _release_parts(obj: Any) -> list[Any]:
    """A list holding the big parts' members, so that dropping `obj` itself is cheap."""
    if isinstance(obj, Snapshot) and obj.tree is not None:
        return list(obj.tree.nodes)
    if isinstance(obj, TreeIndex):
        return list(obj.children)
    return []


_graveyard = _Graveyard()


def discard(obj: Any) -> None:
    """Drop a (possibly big) Snapshot or TreeIndex without freeing it on the calling thread."""
    _graveyard.discard(obj)


# ----------------------------------------------------------------------------------------------
# One rank's probe


@dataclass(frozen=True, slots=True)
class RadixSample:
    url: str
    status: SourceState
    time: float  # time.time() of this poll
    rank: int | None = None
    snapshot: Snapshot | None = None  # None when this poll got none (the board keeps the last)
    index: TreeIndex | None = None
    health: Health | None = None
    events: tuple[Event, ...] = ()  # new since the previous sample
    events_dropped: int = 0  # events that left the server's ring before we read them
    restarted: bool = False  # the endpoint's instance changed: the server restarted
    unchanged: bool = False  # the snapshot answer was byte-identical to the previous one
    seconds: float = 0.0  # fetch + parse
    size: int = 0  # bytes of the snapshot answer


class RadixProbe(PolledProbe):
    """Polls one rank's debug endpoint at `base_url` (e.g. http://127.0.0.1:39100)."""

    def __init__(
        self,
        base_url: str,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        budget: int = DEFAULT_BUDGET,
        timeout_s: float = 3.0,
        max_bytes: int = MAX_SNAPSHOT_BYTES,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = base_url.rstrip("/")
        self.interval_s = interval_s
        self.budget = budget
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._client = client
        self._own_client = client is None
        self._clock = clock
        self._state = StateClock(clock)
        self._instance: str | None = None
        self._since = 0
        self._last_body = b""
        self._last: tuple[Snapshot, TreeIndex | None] | None = None
        self._health: Health | None = None
        self._health_at = -float("inf")

    def _sample(self, state: str, message: str = "", **kw) -> RadixSample:
        return RadixSample(self.url, self._state.update(state, message), self._clock(), **kw)

    async def _poll(self) -> RadixSample:
        started = time.monotonic()
        got = await fetch(
            self.client, self.url + SNAPSHOT_PATH, max_bytes=self.max_bytes, params={BUDGET_PARAM: self.budget}
        )
        if got.error is not None:
            if got.refused:
                return self._sample("down", f"{self.url}: {got.error}")
            return self._sample("error", f"{self.url}: snapshot: {got.error}")
        if got.status != 200:
            return await self._not_ok(got)
        unchanged = got.body == self._last_body and self._last is not None
        if unchanged:
            snapshot, index = self._last  # type: ignore[misc]
        else:
            try:
                if len(got.body) <= INLINE_PARSE_BYTES:
                    snapshot, index = parse_and_index(got.body)
                else:
                    snapshot, index = await asyncio.to_thread(parse_and_index, got.body)
            except ValueError as exc:
                return self._sample("error", f"{self.url}: {one_line(str(exc))}")
            if self._last is not None:
                discard(self._last[0])
                discard(self._last[1])
            self._last_body, self._last = got.body, (snapshot, index)
        restarted = self._instance is not None and snapshot.instance != self._instance
        if snapshot.instance != self._instance:
            self._instance, self._since = snapshot.instance, 0
            self._health_at = -float("inf")
        events: tuple[Event, ...] = ()
        dropped, problem = 0, ""
        if snapshot.events_seq != self._since:  # the snapshot names the newest event: skip a no-op request
            events, dropped, problem = await self._events()
        now = time.monotonic()
        if now - self._health_at >= HEALTH_EVERY_S:
            self._health_at = now
            health, _ = await self._fetch_health()
            if health is not None:
                self._health = health
        state, message = "ok", ""
        if snapshot.hooks_state == "disabled" or (self._health is not None and self._health.status == "degraded"):
            state = "degraded"
            message = (self._health.message if self._health is not None else "") or "hooks disabled"
        elif not snapshot.walkable:
            state, message = "degraded", f"tree not walkable: {snapshot.reason}"
        elif problem:
            state, message = "degraded", problem
        return self._sample(
            state,
            message,
            rank=snapshot.rank,
            snapshot=snapshot,
            index=index,
            health=self._health,
            events=events,
            events_dropped=dropped,
            restarted=restarted,
            unchanged=unchanged,
            seconds=time.monotonic() - started,
            size=len(got.body),
        )

    async def _not_ok(self, got: Fetched) -> RadixSample:
        message = parse_error(got.body)
        if got.status == 404:
            return self._sample(
                "error",
                f"{self.url} has no radixtop debug endpoint (HTTP 404: {message}); "
                "check the URL (see /server_info radixtop_instrument)",
            )
        if got.status == 503:
            health, _ = await self._fetch_health()
            return self._sample("starting", f"{self.url}: {message}", health=health)
        return self._sample("error", f"{self.url}: HTTP {got.status}: {message}")

    async def _fetch_health(self) -> tuple[Health | None, str]:
        got = await fetch(self.client, self.url + HEALTH_PATH, max_bytes=256 * 1024)
        if not got.ok:
            return None, got.error or f"HTTP {got.status}"
        try:
            return parse_health(got.body), ""
        except ValueError as exc:
            return None, one_line(str(exc))

    async def _events(self) -> tuple[tuple[Event, ...], int, str]:
        """New events since the last poll (a few pages at most); a failure is a line, not a stop."""
        out: list[Event] = []
        dropped = 0
        for _ in range(EVENT_PAGES_PER_POLL):
            got = await fetch(
                self.client,
                self.url + EVENTS_PATH,
                max_bytes=MAX_EVENTS_BYTES,
                params={SINCE_PARAM: self._since, LIMIT_PARAM: EVENT_PAGE},
            )
            if not got.ok:
                why = got.error or f"HTTP {got.status}: {parse_error(got.body)}"
                return tuple(out), dropped, f"events: {why}"
            try:
                if len(got.body) <= INLINE_PARSE_BYTES:
                    page = parse_events(got.body)
                else:
                    page = await asyncio.to_thread(parse_events, got.body)
            except ValueError as exc:
                return tuple(out), dropped, one_line(str(exc))
            if page.instance != self._instance:  # the server restarted between the two requests
                self._instance, self._since = page.instance, 0
                continue
            out.extend(page.events)
            dropped += page.dropped
            self._since = page.next_since
            if not page.more:
                break
        return tuple(out), dropped, ""


# ----------------------------------------------------------------------------------------------
# Every rank together, for the pane


@dataclass(frozen=True, slots=True)
class Anomaly:
    time: float
    rank: int | None
    kind: str
    node_id: int | None
    lock_ref: int | None
    message: str


@dataclass
class RankView:
    """What the pane shows for one endpoint: the last good snapshot (kept while the rank is down)."""

    url: str
    status: SourceState
    rank: int | None = None
    snapshot: Snapshot | None = None
    index: TreeIndex | None = None
    snapshot_at: float | None = None  # time.time() the kept snapshot was fetched
    evictions_per_s: float | None = None
    evicted_tokens_per_s: float | None = None
    restarts: int = 0
    events_dropped: int = 0
    _prev: tuple[float, str, int, int] | None = None  # (snapshot time, instance, evictions, evicted tokens)
    digest: str = ""  # the latest complete census's digest ...
    digest_steady: bool = False  # ... and whether the tree is at rest (Census.at_rest, else the same digest twice)
    version: int = 0  # moves when what this rank's view shows changed (the pane redraws one rank)

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else self.url


class RadixBoard:
    """Folds RadixSamples of several endpoints into the pane's view. Pure: no I/O, no Textual."""

    def __init__(self, *, max_anomalies: int = 200, rate_window_s: float = 10.0) -> None:
        self.ranks: dict[str, RankView] = {}
        self.anomalies: deque[Anomaly] = deque(maxlen=max_anomalies)
        self.evictions: deque[tuple[float, int | None, int]] = deque(maxlen=500)  # (time, rank, tokens)
        self.rate_window_s = rate_window_s
        self.version = 0
        self.note: str = ""  # why the pane cannot show a tree (no endpoint, vLLM, ...)

    def add(self, sample: RadixSample) -> None:
        view = self.ranks.get(sample.url)
        changed = view is None or view.status != sample.status or bool(sample.events) or not sample.unchanged
        if view is None:
            view = self.ranks[sample.url] = RankView(sample.url, sample.status)
        view.status = sample.status
        if sample.rank is not None:
            view.rank = sample.rank
        if sample.restarted:
            view.restarts += 1
            view._prev = None
        view.events_dropped += sample.events_dropped
        snap = sample.snapshot
        if snap is not None:
            if not sample.unchanged or view.snapshot is None:
                self._rates(view, snap)
                census = snap.census
                digest = census.digest if census is not None and census.complete else ""
                at_rest = census.at_rest if census is not None else None
                if at_rest is not None:  # the server tells: the tree unmoved since its census began
                    view.digest_steady = bool(digest) and at_rest
                else:  # an older server: the same digest in two snapshots
                    view.digest_steady = bool(digest) and digest == view.digest and (
                        view.snapshot is None or view.snapshot.seq != snap.seq)
                view.digest = digest
                if view.snapshot is not snap:
                    discard(view.snapshot)
                    discard(view.index)
                view.snapshot, view.index = snap, sample.index
            view.snapshot_at = sample.time
        for ev in sample.events:
            if ev.kind in ANOMALY_KINDS:
                self.anomalies.append(Anomaly(ev.time, view.rank, ev.kind, ev.node_id, ev.lock_ref, ev.message))
            elif ev.kind == "evict" and ev.tokens:
                self.evictions.append((ev.time, view.rank, ev.tokens))
        if changed:  # an unchanged snapshot of a rank in the same state redraws nothing
            self.version += 1
            view.version += 1

    def _rates(self, view: RankView, snap: Snapshot) -> None:
        c = snap.counters
        prev = view._prev
        if prev is not None and prev[1] == snap.instance and snap.time > prev[0]:
            dt = snap.time - prev[0]
            view.evictions_per_s = max(0, c.evictions - prev[2]) / dt
            view.evicted_tokens_per_s = max(0, c.evicted_tokens - prev[3]) / dt
        view._prev = (snap.time, snap.instance, c.evictions, c.evicted_tokens)

    def ordered(self) -> list[RankView]:
        return sorted(self.ranks.values(), key=lambda v: (v.rank is None, v.rank or 0, v.url))

    def disagreement(self, groups: Callable[[int], int] | None = None) -> str | None:
        """A line when ranks that should hold the same tree (TP ranks of one DP group) report
        different census digests while their trees are at rest (the server's Census.at_rest: nothing
        moved since the census began; from an older server, the same digest in its last two
        snapshots): ranks snapshot at different moments, so a changing tree always differs;
        None when they agree or cannot be compared."""
        by_group: dict[int, list[tuple[int, str]]] = {}
        for v in self.ordered():
            if v.rank is None or not v.digest or not v.digest_steady or not v.status.ok:
                continue
            by_group.setdefault(groups(v.rank) if groups else 0, []).append((v.rank, v.digest))
        for members in by_group.values():
            digests = {d for _, d in members}
            if len(digests) > 1:
                shown = " ".join(f"r{r}={d[:8]}" for r, d in members)
                return f"ranks disagree: tree digests {shown} (each rank's last census)"
        return None

    def recent_evictions(self, now: float) -> tuple[int, int]:
        """(eviction events, evicted tokens) within the rate window before now."""
        count = tokens = 0
        for t, _, n in reversed(self.evictions):
            if now - t > self.rate_window_s:
                break
            count += 1
            tokens += n
        return count, tokens


def rank_groups(tp_size: int | None) -> Callable[[int], int] | None:
    """Ranks are numbered tp + dp * tp_size (as the simulator and instrument number them)."""
    if not tp_size or tp_size < 1:
        return None
    return lambda rank: rank // tp_size


async def poll_all(probes: Sequence[RadixProbe]) -> list[RadixSample]:
    """Poll several ranks at once (their servers answer independently)."""
    return list(await asyncio.gather(*(p.poll() for p in probes)))


def instrument_urls(values: Iterable[object], dropped: list[str] | None = None) -> list[str]:
    """The debug-endpoint URLs in /server_info's radixtop_instrument list that radixtop may contact.

    The list is network content, so the one rule for addresses radixtop did not get from its
    user applies (the UI, discovery and the bundle all read the list here): only loopback URLs
    are kept; an address off this machine is contacted only when the user types it
    (--instrument). Anything else (not http(s), too long, off loopback) goes to ``dropped``.
    """
    out = []
    for v in values:
        if isinstance(v, str) and v.startswith(("http://", "https://")) and len(v) < 300 and is_loopback_url(v):
            out.append(v.rstrip("/"))
        elif dropped is not None:
            dropped.append(str(v)[:300])
    return out
