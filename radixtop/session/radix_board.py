"""The radix pane's state: every rank's samples folded into what it shows (the last good snapshot
per rank, eviction rates, lock anomalies with their times, whether the ranks' trees agree), the
last values kept while a rank is down. Pure: no I/O, no Textual.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from radixtop.probes.radix_tree import TreeIndex, discard, no_gc_pauses
from radixtop.probes.status import SourceState
from radixtop.schema import Event, Snapshot
from radixtop.session.snapshot_store import Kept, SnapshotStore

if TYPE_CHECKING:
    from radixtop.probes.radix import RadixSample
    from radixtop.session.idle_watch import IdleAlarm

BUNDLE_SNAPSHOTS = 3  # of the earlier snapshots kept (session/snapshot_store.py), the newest a bundle keeps
KEPT_EVENTS = 1_000  # events kept per rank
SAME_FAILURE_S = 5.0  # prints this close together are one failure seen by several ranks

ANOMALY_KINDS = frozenset({
    "negative_lock_ref", "lock_failure", "unlock_failure", "evict_failure", "evict_short", "hooks_disabled",
    "instrument_error",
})


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
    flight_dir: str = ""  # where the rank's flight recorder writes, as its /health said
    source: str = ""  # the tree's source when not the debug endpoint (kv-events), named in the pane
    source_note: str = ""  # that source's line of what it holds and missed
    locks_known: bool = True
    name: str = ""  # the title's name for a view that is not a rank's endpoint (a printed tree)
    node: str = ""  # the node the rank runs on, when not this one
    before: Snapshot | None = None  # a flight record's last safe point before the failure
    failed_node: int | None = None  # the node the failing lock or unlock was on
    failed_op: str = ""  # what failed there (the trigger's kind)
    cursor: int | None = None  # the moment shown (an index of moment_times()); None: the latest
    # Earlier moments decoded and indexed once: the cursor's, and the one shown beside another rank.
    _opened: dict[str, tuple[object, Snapshot, TreeIndex | None]] = field(default_factory=dict)
    # What radixtop saw, to step back through and for an evidence bundle (a dead rank's endpoint
    # cannot be asked): the snapshots before the last one, and every event received, bounded.
    earlier: SnapshotStore = field(default_factory=SnapshotStore)
    events: deque[Event] = field(default_factory=lambda: deque(maxlen=KEPT_EVENTS))

    def moment_times(self) -> list[float]:
        """When each moment the pane can step through was, oldest first: a flight record's safe
        point and its failure, else the snapshots kept and the latest."""
        if self.snapshot is None:
            return []
        if self.before is not None:
            return [self.before.time, self.snapshot.time]
        return [*(k.time for k in self.earlier), self.snapshot_at or self.snapshot.time]

    def step(self, by: int) -> None:
        """Move the cursor `by` moments (negative: earlier); past the latest it follows again."""
        count = len(self.moment_times())
        if not count:
            return
        at = (count - 1 if self.cursor is None else self.cursor) + by
        self.cursor = None if at >= count - 1 else max(0, at)
        self.version += 1

    def _pinned(self) -> object | None:
        """What the cursor is on, to find it again once the kept snapshots have moved."""
        if self.cursor is None:
            return None
        if self.before is not None:
            return self.before
        return self.earlier[self.cursor] if self.cursor < len(self.earlier) else None

    def shown(self) -> tuple[Snapshot | None, TreeIndex | None]:
        """The snapshot at the cursor and its index (decoded and built once for an earlier one)."""
        pinned = self._pinned()
        opened = self._open(pinned, "cursor") if pinned is not None else None
        return opened if opened is not None else (self.snapshot, self.index)

    def at_moment(self, t: float) -> tuple[Snapshot | None, TreeIndex | None, float | None]:
        """This rank's tree as it was at `t` (the moment another view shows): its newest moment at
        or before `t`, with when that was; (None, None, None) when it had none yet."""
        times = self.moment_times()
        i = bisect_right(times, t) - 1
        if i < 0:
            return None, None, None
        if i == len(times) - 1:
            return self.snapshot, self.index, times[i]
        opened = self._open(self.before if self.before is not None else self.earlier[i], "side")
        return (*opened, times[i]) if opened is not None else (None, None, None)

    def _open(self, pinned: object, use: str) -> tuple[Snapshot, TreeIndex | None] | None:
        """An earlier moment decoded and indexed, kept for `use` (the cursor's, the side view's)
        until another is asked for; None when its rows cannot be made whole."""
        kept = self._opened.get(use)
        if kept is None or kept[0] is not pinned:
            try:
                snap = pinned if isinstance(pinned, Snapshot) else self.earlier.load(cast(Kept, pinned))
            except ValueError:
                return None
            with no_gc_pauses(freeze=False):
                kept = self._opened[use] = (pinned, snap, TreeIndex.lazy(snap))  # children sorted as listed
        return kept[1], kept[2]

    @property
    def kind(self) -> str:
        """What sort of view: "" a rank's endpoint, else its name's first word ("failed", "printed")."""
        return self.name.split(" ")[0]

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if self.rank is None:
            return self.url
        rank = f"dp {self.rank}" if self.source else f"rank {self.rank}"  # kv-events publish per DP rank
        return f"{self.node} {rank}" if self.node else rank


class RadixBoard:
    """Folds RadixSamples of several endpoints into the pane's view. Pure: no I/O, no Textual."""

    def __init__(self, *, max_anomalies: int = 200) -> None:
        self.ranks: dict[str, RankView] = {}
        self.anomalies: deque[Anomaly] = deque(maxlen=max_anomalies)
        self.version = 0
        self.note: str = ""  # why the pane cannot show a tree (no endpoint, vLLM, ...)
        # The view the pane turns to: a tree the server printed at a failure, when it first comes.
        self.focus: str | None = None
        self.focus_seq = 0

    def add(self, sample: RadixSample) -> None:
        view = self.ranks.get(sample.url)
        changed = view is None or view.status != sample.status or bool(sample.events) or not sample.unchanged
        if view is None:
            view = self.ranks[sample.url] = RankView(sample.url, sample.status)
            if sample.label and self._newer_than_focus(sample):
                self.focus, self.focus_seq = sample.url, self.focus_seq + 1
        view.status = sample.status
        changed = changed or view.source_note != sample.source_note
        view.source, view.source_note, view.locks_known = sample.source, sample.source_note, sample.locks_known
        view.name, view.before, view.node = sample.label, sample.before, sample.node
        view.failed_node, view.failed_op = sample.failed_node, sample.failed_op
        if sample.rank is not None:
            view.rank = sample.rank
        if sample.health is not None and sample.health.flight_dir:
            view.flight_dir = sample.health.flight_dir
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
                pinned = view._pinned()
                if view.snapshot is not snap:
                    old = view.snapshot
                    if old is not None and view.snapshot_at is not None:
                        view.earlier.add(view.snapshot_at, old)  # its rows, shared with its neighbours
                    discard(old)
                    discard(view.index)
                view.snapshot, view.index = snap, sample.index
                if isinstance(pinned, Kept):  # the moment looked at stays in view while new ones come
                    at = view.earlier.index_of(pinned)
                    view.cursor = at if at is not None else 0
            view.snapshot_at = sample.time
        view.events.extend(sample.events)
        for ev in sample.events:
            if ev.kind in ANOMALY_KINDS:
                self.anomalies.append(Anomaly(ev.time, view.rank, ev.kind, ev.node_id, ev.lock_ref, ev.message))
        if changed:  # an unchanged snapshot of a rank in the same state redraws nothing
            self.version += 1
            view.version += 1

    def alarm(self, alarms: Sequence[IdleAlarm]) -> None:
        """Live alarms (session/idle_watch.py) among the anomalies the pane lists."""
        for a in alarms:
            self.anomalies.append(Anomaly(a.time, a.rank, a.kind, None, None, a.message))
        if alarms:
            self.version += 1

    def _newer_than_focus(self, sample: RadixSample) -> bool:
        """A print of the same failure by another rank (seconds apart) leaves the pane on the first."""
        focused = self.ranks.get(self.focus) if self.focus else None
        if focused is None or focused.snapshot is None or sample.snapshot is None:
            return True
        return sample.snapshot.time > focused.snapshot.time + SAME_FAILURE_S

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
            if v.rank is None or v.name or not v.digest or not v.digest_steady or not v.status.ok:
                continue  # a flight record or a print is a moment of its own, not a rank now
            by_group.setdefault(groups(v.rank) if groups else 0, []).append((v.rank, v.digest))
        for members in by_group.values():
            digests = {d for _, d in members}
            if len(digests) > 1:
                shown = " ".join(f"r{r}={d[:8]}" for r, d in members)
                return f"ranks disagree: tree digests {shown} (each rank's last census)"
        return None


def rank_groups(tp_size: int | None) -> Callable[[int], int] | None:
    """Ranks are numbered tp + dp * tp_size (as the simulator and instrument number them)."""
    if not tp_size or tp_size < 1:
        return None
    return lambda rank: rank // tp_size


