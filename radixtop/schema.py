"""The debug-endpoint contract between instrument/ (inside the SGLang scheduler), sim/ and probes/radix.

Standard library only: this module is imported inside someone else's server process.

Versioning: additive changes (a new optional field, a new event kind) keep SCHEMA_VERSION and parsers
ignore keys they do not know; anything that changes or removes a field bumps SCHEMA_VERSION and the
route prefix with it. Parsers reject other versions with one line that says what to do.

Wire shapes (JSON objects, UTF-8):
  snapshot   Snapshot.to_dict(); the tree is a table: `tree.fields` names the columns (NODE_FIELDS) and
             `tree.nodes` holds one row (a list) per node, root first, each row's parent given as the
             row index of its parent (always an earlier row), so depth never nests the JSON.
  events     EventPage.to_dict(); read incrementally with ?since=<seq>.
  health     Health.to_dict().
  errors     {"schema_version": 1, "error": "<one line>"} with a 4xx/5xx status.
  /metrics   Prometheus text exposition 0.0.4, names in METRIC_NAMES, label rank.
"""

from __future__ import annotations

import heapq
import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple, Protocol, TypeVar

SCHEMA_VERSION = 1
API_PREFIX = f"/radixtop/v{SCHEMA_VERSION}"
SNAPSHOT_PATH = f"{API_PREFIX}/snapshot"
EVENTS_PATH = f"{API_PREFIX}/events"
HEALTH_PATH = f"{API_PREFIX}/health"
METRICS_PATH = "/metrics"
ROUTES = (SNAPSHOT_PATH, EVENTS_PATH, HEALTH_PATH, METRICS_PATH)

# Query parameters.
BUDGET_PARAM = "budget"  # snapshot: at most this many nodes (never more than the server's cap)
SINCE_PARAM = "since"  # events: only events with seq > since
LIMIT_PARAM = "limit"  # events: at most this many events per page

DEFAULT_HOST = "127.0.0.1"
DEFAULT_BASE_PORT = 39100  # each rank serves on DEFAULT_BASE_PORT + rank unless configured
# The ports a rank's endpoint may take from its base on: base + rank, or the next free one above when
# another server on the node holds it; discovery looks for endpoints in this window.
INSTRUMENT_PORT_SPAN = 256

# Absurd-size guards for parsers (and upper bounds for servers).
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
MAX_TREE_NODES = 200_000
MAX_EVENTS_PER_PAGE = 10_000
MAX_HISTOGRAM_BUCKETS = 100_000
MAX_HEAD_TOKENS = 64
MAX_TEXT = 4_096
_MAX_INT = 2**63 - 1
_MIN_INT = -(2**63)

NODE_FIELDS = (
    "id",  # the cache's node id (int) or null
    "parent",  # row index of the parent (an earlier row); -1 for the root row
    "tokens",  # len(node.key)
    "lock_ref",  # node.lock_ref
    "evicted",  # node.value is None
    "hit_count",  # node.hit_count or null
    "last_access",  # node.last_access_time (the cache's clock; see Snapshot.monotonic) or null
    "children",  # number of children in the live tree (rows may show fewer)
    "subtree_tokens",  # tokens in the node and all its descendants, from the last census, or null
    "head",  # the first few token ids of node.key (ints)
)

EVENT_KINDS = (
    "evict",  # an evict call freed tokens
    "evict_short",  # an evict freed less than asked while protected (locked) tokens > 0
    "lock_failure",  # inc_lock_ref raised
    "unlock_failure",  # dec_lock_ref raised
    "evict_failure",  # evict raised (the seed's RadixCacheError during dynamic prefix eviction is one)
    "negative_lock_ref",  # after dec_lock_ref a node on the unlocked path has lock_ref < 0
    "instrument_error",  # radixtop's own code failed (caught, counted)
    "hooks_disabled",  # too many instrument errors: hooks removed themselves
)
HOOK_STATES = ("active", "off", "disabled")
HOLDER_STATES = ("running", "chunked", "waiting")  # where the scheduler keeps a request holding a lock
MAX_HOLDERS = 4_096
MAX_SHARERS = 1_024
LOCK_DETAILS = ("counts", "locked-only", "none")
HEALTH_STATES = ("ok", "starting", "degraded")

# Prometheus names (counters end in _total); every sample carries the label rank.
METRIC_NAMES = {
    "lock_ops": "radixtop_lock_ops_total",
    "unlock_ops": "radixtop_unlock_ops_total",
    "lock_failures": "radixtop_lock_failures_total",
    "unlock_failures": "radixtop_unlock_failures_total",
    "negative_lock_ref": "radixtop_negative_lock_ref_total",
    "evict_calls": "radixtop_evict_calls_total",
    "evictions": "radixtop_evictions_total",
    "evicted_tokens": "radixtop_evicted_tokens_total",
    "evict_short_locked": "radixtop_evict_short_locked_total",
    "evict_failures": "radixtop_evict_failures_total",
    "instrument_errors": "radixtop_instrument_errors_total",
    "events_dropped": "radixtop_events_dropped_total",
}
STATE_METRIC_NAMES = {  # gauges, and the endpoint's own counters (names ending in _total)
    "hooks_active": "radixtop_hooks_active",
    "snapshots": "radixtop_snapshots_total",
    "snapshot_seconds": "radixtop_snapshot_seconds",
    "capacity_tokens": "radixtop_capacity_tokens",
    "available_tokens": "radixtop_available_tokens",
    "evictable_tokens": "radixtop_evictable_tokens",
    "protected_tokens": "radixtop_protected_tokens",
    "tree_nodes": "radixtop_tree_nodes",
    "census_age_seconds": "radixtop_census_age_seconds",
    "lock_ref_nodes": "radixtop_lock_ref_nodes",  # extra label lock_ref: "<0", "0", "1", "2-3", ...
    "safe_point_errors": "radixtop_safe_point_errors_total",
    "client_disconnects": "radixtop_client_disconnects_total",
    "clients_refused": "radixtop_clients_refused_total",
}

_KIND_RE = re.compile(r"[a-z][a-z0-9_]{0,39}")
_INSTANCE_RE = re.compile(r"[0-9a-f]{1,64}")
_DIGEST_RE = re.compile(r"(?:[0-9a-f]{16})?")


# ----------------------------------------------------------------------------------------------
# Validation helpers: every failure is a one-line ValueError naming the field.


class _Bad(ValueError):
    pass


def _fail(where: str, what: str, got: Any) -> _Bad:
    shown = repr(got)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return _Bad(f"{where}: expected {what}, got {shown}")


def _obj(v: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise _fail(where, "a JSON object", type(v).__name__)
    return v


def _get(obj: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise _Bad(f"{where}: missing field {key!r}")
    return obj[key]


def _int(v: Any, where: str, lo: int = _MIN_INT, hi: int = _MAX_INT) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise _fail(where, f"an integer in [{lo}, {hi}]", v)
    return v


def _opt_int(v: Any, where: str, lo: int = _MIN_INT, hi: int = _MAX_INT) -> int | None:
    return None if v is None else _int(v, where, lo, hi)


def _float(v: Any, where: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    if type(v) not in (int, float) or not math.isfinite(v) or not lo <= v <= hi:
        raise _fail(where, f"a finite number in [{lo}, {hi}]", v)
    return float(v)


def _opt_float(v: Any, where: str, lo: float = -math.inf, hi: float = math.inf) -> float | None:
    return None if v is None else _float(v, where, lo, hi)


def _bool(v: Any, where: str) -> bool:
    if type(v) is not bool:
        raise _fail(where, "true or false", v)
    return v


def _str(v: Any, where: str, limit: int = MAX_TEXT) -> str:
    if type(v) is not str or len(v) > limit:
        raise _fail(where, f"a string of at most {limit} characters", v)
    return v


def _choice(v: Any, where: str, allowed: tuple[str, ...]) -> str:
    if v not in allowed or type(v) is not str:
        raise _fail(where, "one of " + ", ".join(allowed), v)
    return v


def _pattern(v: Any, where: str, pattern: re.Pattern[str], what: str) -> str:
    if type(v) is not str or not pattern.fullmatch(v):
        raise _fail(where, what, v)
    return v


def _list(v: Any, where: str, limit: int) -> list[Any]:
    if type(v) is not list:
        raise _fail(where, "a JSON array", type(v).__name__)
    if len(v) > limit:
        raise _Bad(f"{where}: {len(v)} entries is more than the limit of {limit}; refusing it")
    return v


def _version(obj: Mapping[str, Any], where: str) -> int:
    v = _get(obj, "schema_version", where)
    if type(v) is not int:
        raise _fail(f"{where}.schema_version", "an integer", v)
    if v != SCHEMA_VERSION:
        raise _Bad(
            f"{where}: schema version {v} is not supported (this radixtop speaks {SCHEMA_VERSION}); "
            "use matching radixtop versions on both ends"
        )
    return v


_T = TypeVar("_T")


def _guard(kind: str, parse: Callable[[Any], _T], obj: Any) -> _T:
    """Run a parser; anything but our own one-line ValueError becomes one (never a crash)."""
    try:
        return parse(obj)
    except _Bad:
        raise
    except RecursionError:
        raise ValueError(f"{kind}: nested too deeply; refusing it") from None
    except Exception as exc:  # a gap in validation must still not crash the caller
        raise ValueError(f"{kind}: malformed ({type(exc).__name__})") from None


def decode_json(data: bytes | str, kind: str) -> Any:
    """Bytes -> JSON value with the size guard; one-line ValueError on anything wrong. Every level
    is checked by the parsers here, so nothing is cut."""
    from radixtop.bounded import load_json

    if not isinstance(data, (bytes, bytearray, memoryview, str)):
        raise ValueError(f"{kind}: expected bytes, got {type(data).__name__}")
    return load_json(data, kind, max_bytes=MAX_PAYLOAD_BYTES, cut_depth=None)


def encode_json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()


# ----------------------------------------------------------------------------------------------
# Dataclasses


@dataclass(frozen=True, slots=True)
class Counters:
    """Cumulative since the hooks were created (per rank)."""

    lock_ops: int = 0
    unlock_ops: int = 0
    lock_failures: int = 0
    unlock_failures: int = 0
    negative_lock_ref: int = 0  # dec_lock_ref calls that left a node on their path below zero
    evict_calls: int = 0
    evictions: int = 0  # evict calls that freed at least one token
    evicted_tokens: int = 0
    evict_short_locked: int = 0  # evicts that freed less than asked while protected tokens > 0
    instrument_errors: int = 0
    events_dropped: int = 0  # events pushed out of the bounded ring before anyone read them
    evict_failures: int = 0  # evict calls that raised (optional: absent from older servers)

    def to_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, obj: Any, where: str = "counters") -> Counters:
        o = _obj(obj, where)
        return cls(**{
            f.name: _int(o.get(f.name, 0) if f.name in _OPTIONAL_COUNTERS else _get(o, f.name, where),
                         f"{where}.{f.name}", 0)
            for f in fields(cls)
        })


_OPTIONAL_COUNTERS = frozenset({"evict_failures"})


class NodeRow(NamedTuple):
    """One node; a tuple in NODE_FIELDS order (cheap to build on the scheduler thread, and it is
    serialised as the JSON row itself)."""

    id: int | None
    parent: int
    tokens: int
    lock_ref: int
    evicted: bool
    hit_count: int | None
    last_access: float | None
    children: int
    subtree_tokens: int | None
    head: tuple[int, ...]

    def to_row(self) -> list[Any]:
        return [*self[:-1], list(self.head)]

    @classmethod
    def from_row(cls, row: Any, index: int, where: str) -> NodeRow:
        w = f"{where}[{index}]"
        if type(row) is not list or len(row) != len(NODE_FIELDS):
            raise _fail(w, f"a row of {len(NODE_FIELDS)} values", row)
        nid, parent, tokens, lock_ref, evicted, hits, last, children, sub, head = row
        if index == 0:
            if parent != -1 or type(parent) is not int:
                raise _fail(f"{w}.parent", "-1 (the first row is the root)", parent)
        else:
            _int(parent, f"{w}.parent", 0, index - 1)
        head_list = _list(head, f"{w}.head", MAX_HEAD_TOKENS)
        return cls(
            id=_opt_int(nid, f"{w}.id"),
            parent=parent,
            tokens=_int(tokens, f"{w}.tokens", 0),
            lock_ref=_int(lock_ref, f"{w}.lock_ref"),
            evicted=_bool(evicted, f"{w}.evicted"),
            hit_count=_opt_int(hits, f"{w}.hit_count"),
            last_access=_opt_float(last, f"{w}.last_access"),
            children=_int(children, f"{w}.children", 0),
            subtree_tokens=_opt_int(sub, f"{w}.subtree_tokens", 0),
            head=tuple(_int(t, f"{w}.head[{i}]") for i, t in enumerate(head_list)),
        )


@dataclass(frozen=True, slots=True)
class TreeView:
    """A budgeted walk: root row first, then nodes best-first (locked first, then heaviest subtree).

    Counts exclude the root row. Any prefix of `nodes` is itself a valid, connected view.
    cut_* are exact when cut_exact, else estimates (from the last census and the cache's sizes);
    None when unknown.
    """

    budget: int
    walked_nodes: int
    walked_tokens: int
    cut_nodes: int | None
    cut_tokens: int | None
    cut_exact: bool
    nodes: tuple[NodeRow, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "walked_nodes": self.walked_nodes,
            "walked_tokens": self.walked_tokens,
            "cut_nodes": self.cut_nodes,
            "cut_tokens": self.cut_tokens,
            "cut_exact": self.cut_exact,
            "fields": list(NODE_FIELDS),
            "nodes": list(self.nodes),  # NodeRow tuples encode as JSON arrays
        }

    def truncated(self, budget: int) -> TreeView:
        """The first `budget` non-root nodes (a prefix, so still connected), with the cut recounted."""
        if budget >= self.walked_nodes:
            return self
        budget = max(0, budget)
        kept = self.nodes[: budget + 1]
        dropped = self.nodes[budget + 1 :]
        dropped_tokens = sum(n.tokens for n in dropped)
        return replace(
            self,
            budget=budget,
            walked_nodes=budget,
            walked_tokens=self.walked_tokens - dropped_tokens,
            cut_nodes=None if self.cut_nodes is None else self.cut_nodes + len(dropped),
            cut_tokens=None if self.cut_tokens is None else self.cut_tokens + dropped_tokens,
            nodes=kept,
        )

    @classmethod
    def from_dict(cls, obj: Any, where: str = "tree") -> TreeView:
        o = _obj(obj, where)
        cols = _list(_get(o, "fields", where), f"{where}.fields", 64)
        if tuple(cols) != NODE_FIELDS:
            raise _fail(f"{where}.fields", "the v1 node columns " + ",".join(NODE_FIELDS), cols)
        rows = _list(_get(o, "nodes", where), f"{where}.nodes", MAX_TREE_NODES + 1)
        if not rows:
            raise _Bad(f"{where}.nodes: empty; the root row is required")
        nodes = tuple(NodeRow.from_row(r, i, f"{where}.nodes") for i, r in enumerate(rows))
        walked = _int(_get(o, "walked_nodes", where), f"{where}.walked_nodes", 0)
        if walked != len(nodes) - 1:
            raise _Bad(f"{where}.walked_nodes: says {walked} but {len(nodes) - 1} non-root rows were sent")
        return cls(
            budget=_int(_get(o, "budget", where), f"{where}.budget", 0),
            walked_nodes=walked,
            walked_tokens=_int(_get(o, "walked_tokens", where), f"{where}.walked_tokens", 0),
            cut_nodes=_opt_int(_get(o, "cut_nodes", where), f"{where}.cut_nodes", 0),
            cut_tokens=_opt_int(_get(o, "cut_tokens", where), f"{where}.cut_tokens", 0),
            cut_exact=_bool(_get(o, "cut_exact", where), f"{where}.cut_exact"),
            nodes=nodes,
        )


class Holder(NamedTuple):
    """A request the scheduler holds a tree lock for (`req.lock`). The lock holds `node` and every
    node on the path above it, so a node's holders are those whose node is it or below it."""

    rid: str
    # The id of the deepest node the lock holds, as the snapshot's rows name nodes (it may be cut
    # from the rows sent, as any node); None where the instrument cannot name it.
    node: int | None
    held_s: float  # seconds since the instrument first saw this lock (a lower bound)
    prompt_tokens: int
    state: str  # HOLDER_STATES

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_dict(cls, obj: Any, where: str) -> Holder:
        o = _obj(obj, where)
        return cls(
            rid=_str(_get(o, "rid", where), f"{where}.rid", 200),
            node=_opt_int(_get(o, "node", where), f"{where}.node"),
            held_s=_float(_get(o, "held_s", where), f"{where}.held_s", 0.0),
            prompt_tokens=_int(_get(o, "prompt_tokens", where), f"{where}.prompt_tokens", 0),
            state=_choice(_get(o, "state", where), f"{where}.state", HOLDER_STATES),
        )


class Sharer(NamedTuple):
    """A request that held a lock and let go of it (it finished, or moved its lock deeper), whose
    node is still cached: the nodes on its path are the ones it used."""

    rid: str
    node: int | None  # the deepest node it held, as the rows name nodes; None: unknown
    released_s: float  # seconds since the instrument first saw it let go
    prompt_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_dict(cls, obj: Any, where: str) -> Sharer:
        o = _obj(obj, where)
        return cls(
            rid=_str(_get(o, "rid", where), f"{where}.rid", 200),
            node=_opt_int(_get(o, "node", where), f"{where}.node"),
            released_s=_float(_get(o, "released_s", where), f"{where}.released_s", 0.0),
            prompt_tokens=_int(_get(o, "prompt_tokens", where), f"{where}.prompt_tokens", 0),
        )


class Branch(NamedTuple):
    """A node of a tree rebuilt outside the instrument's walk (the Rust TreeCore's slots,
    kv-events' blocks), for heaviest_first()."""

    id: int | None
    tokens: int
    lock_ref: int
    subtree: int  # tokens in it and below it
    children: tuple[int, ...]  # indices in the same list


class Branches(Protocol):
    """Branches by index: a list of them, or a tree that makes each when asked for."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> Branch: ...


def heaviest_first(
    branches: Branches, roots: Sequence[int], budget: int,
    head_of: Callable[[int], tuple[int, ...]] = lambda _: (),
    weights: Sequence[int] | None = None,
) -> TreeView:
    """The rows of a rebuilt tree as the instrument's walk sends them: the root row, then nodes
    heaviest subtree first within `budget` (a prefix of the rows is a connected tree; ties go to
    the lower index). `head_of(index)`: a node's first token ids, asked only for the rows sent.
    `weights`: each branch's subtree by index, where the caller has them: then a branch is asked
    for only when its row is sent, not for each child weighed."""
    weight = weights.__getitem__ if weights is not None else (lambda i: branches[i].subtree)
    total = sum(weight(i) for i in roots)
    rows = [NodeRow(None, -1, 0, 0, False, None, None, len(roots), total, ())]
    heap = [(-weight(i), i, 0) for i in roots]
    heapq.heapify(heap)
    walked_tokens = 0
    while heap and len(rows) <= budget:
        _, i, parent_row = heapq.heappop(heap)
        b = branches[i]
        rows.append(
            NodeRow(b.id, parent_row, b.tokens, b.lock_ref, False, None, None, len(b.children), b.subtree, head_of(i))
        )
        walked_tokens += b.tokens
        row = len(rows) - 1
        for child in b.children:
            heapq.heappush(heap, (-weight(child), child, row))
    walked = len(rows) - 1
    return TreeView(
        budget=budget, walked_nodes=walked, walked_tokens=walked_tokens, cut_nodes=len(branches) - walked,
        cut_tokens=total - walked_tokens, cut_exact=True, nodes=tuple(rows),
    )

def rebuilt_snapshot(
    tree: TreeView, *, rank: int, instance: str, seq: int, when: float, cache_class: str, page_size: int | None,
    lock_detail: str, seconds: float = 0.0, available: int | None = None, evictable: int | None = None,
    protected: int | None = None,
) -> Snapshot:
    """A tree rebuilt outside the instrument (kv-events, a print in the log) in the debug
    endpoint's shape: what its source does not carry is None, its counters zero, no census."""
    return Snapshot(
        schema_version=SCHEMA_VERSION, rank=rank, instance=instance, seq=max(0, seq), time=when,
        monotonic=time.monotonic(), seconds=seconds, cache_class=cache_class, walkable=True, reason="",
        page_size=page_size, capacity_tokens=None, available_tokens=available, evictable_tokens=evictable,
        protected_tokens=protected, hooks_state="off", counters=Counters(), events_seq=0, census=None, tree=tree,
        lock_detail=lock_detail,
    )


@dataclass(frozen=True, slots=True)
class Census:
    """A full walk of the tree, assembled a bounded slice at a time over `slices` scheduler safe
    points (`span_s` seconds from the first to the last); duty-cycle limited, so it may be older
    than the snapshot. A tree that moved meanwhile is counted as each part was when reached.

    node_count and the histogram exclude the root. When not complete (still in progress, or given
    up at the server's node limit), node_count is a lower bound and digest is "".
    slices and span_s were added in schema 1 without a version bump: older servers omit them
    (read as 1 and 0.0, a census in one pause).

    at_rest (also added without a bump; None from older servers, and while incomplete): True when
    the tree's mutation counters (lock, unlock and evict calls, the pool's sizes) have not moved
    from the census's first slice to this snapshot, so the digest describes the tree as it is
    now; False when they moved (a digest assembled over a moving tree is compared with nothing).
    """

    complete: bool
    node_count: int
    total_tokens: int
    lock_ref_histogram: dict[int, int]
    digest: str  # 16 hex digits over the tree's shape (key lengths, first/last token, nesting)
    age_s: float  # how old the census's first slice was when the snapshot was taken
    seconds: float  # what the census cost the scheduler thread (CPU seconds, all its slices)
    slices: int = 1  # the safe points (steps) it was assembled over
    span_s: float = 0.0  # seconds from its first slice to its last
    at_rest: bool | None = None  # the tree unchanged from the first slice to the snapshot

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "complete": self.complete,
            "node_count": self.node_count,
            "total_tokens": self.total_tokens,
            "lock_ref_histogram": {str(k): v for k, v in sorted(self.lock_ref_histogram.items())},
            "digest": self.digest,
            "age_s": self.age_s,
            "seconds": self.seconds,
            "slices": self.slices,
            "span_s": self.span_s,
        }
        if self.at_rest is not None:  # absent, as from an older server, when unknown
            d["at_rest"] = self.at_rest
        return d

    @classmethod
    def from_dict(cls, obj: Any, where: str = "census") -> Census:
        o = _obj(obj, where)
        hist_raw = _obj(_get(o, "lock_ref_histogram", where), f"{where}.lock_ref_histogram")
        if len(hist_raw) > MAX_HISTOGRAM_BUCKETS:
            raise _Bad(f"{where}.lock_ref_histogram: {len(hist_raw)} buckets is more than the limit")
        hist: dict[int, int] = {}
        for k, v in hist_raw.items():
            hw = f"{where}.lock_ref_histogram[{str(k)[:20]!r}]"
            if type(k) is not str or not re.fullmatch(r"-?[0-9]{1,19}", k):
                raise _fail(hw, "an integer key", k)
            hist[_int(int(k), hw)] = _int(v, hw, 0)
        return cls(
            complete=_bool(_get(o, "complete", where), f"{where}.complete"),
            node_count=_int(_get(o, "node_count", where), f"{where}.node_count", 0),
            total_tokens=_int(_get(o, "total_tokens", where), f"{where}.total_tokens", 0),
            lock_ref_histogram=hist,
            digest=_pattern(_get(o, "digest", where), f"{where}.digest", _DIGEST_RE, "16 hex digits or empty"),
            age_s=_float(_get(o, "age_s", where), f"{where}.age_s", 0.0),
            seconds=_float(_get(o, "seconds", where), f"{where}.seconds", 0.0),
            slices=_int(o.get("slices", 1), f"{where}.slices", 1),
            span_s=_float(o.get("span_s", 0.0), f"{where}.span_s", 0.0),
            at_rest=None if o.get("at_rest") is None else _bool(o["at_rest"], f"{where}.at_rest"),
        )


@dataclass(frozen=True, slots=True)
class Snapshot:
    schema_version: int
    rank: int
    instance: str  # random hex per endpoint start: a change means the server restarted
    seq: int  # snapshot number within this instance
    time: float  # wall clock (epoch seconds) when taken
    monotonic: float  # time.monotonic() in the server when taken (for node last_access ages)
    # what reading it cost the scheduler thread (CPU seconds of the detail walk; census steps and
    # serialising not included)
    seconds: float
    cache_class: str
    walkable: bool
    reason: str  # why the tree is not shown ("" when walkable)
    page_size: int | None
    capacity_tokens: int | None
    available_tokens: int | None
    evictable_tokens: int | None
    protected_tokens: int | None
    hooks_state: str
    counters: Counters
    events_seq: int  # the latest event seq when taken
    census: Census | None
    tree: TreeView | None
    # What the rows' lock_ref means: "counts" (the node's lock_ref), "locked-only" (1: locked by
    # some count; the Rust TreeCore's walk), "none" (unknown: kv-events). Added without a bump.
    lock_detail: str = "counts"
    # The requests holding tree locks as the scheduler sees them (added without a bump): None where
    # they are unknown (an older server, a tree rebuilt from kv-events or a print), () where none.
    holders: tuple[Holder, ...] | None = None
    # The requests that let go of their locks while the nodes they held stay cached, newest first
    # (added without a bump): None where the source does not remember them.
    sharers: tuple[Sharer, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in fields(self):
            if f.name in ("holders", "sharers"):
                records = getattr(self, f.name)
                d[f.name] = None if records is None else [r.to_dict() for r in records]
            elif f.name != "tree":
                v = getattr(self, f.name)
                d[f.name] = v.to_dict() if hasattr(v, "to_dict") else v
        d["tree"] = self.tree.to_dict() if self.tree is not None else None  # last: see encode_snapshot
        return d

    def to_json(self) -> bytes:
        return encode_json(self.to_dict())

    def with_budget(self, budget: int) -> Snapshot:
        if self.tree is None or budget >= self.tree.walked_nodes:
            return self
        return replace(self, tree=self.tree.truncated(budget))

    @classmethod
    def from_dict(cls, obj: Any) -> Snapshot:
        return _guard("snapshot", cls._parse, obj)

    @classmethod
    def _parse(cls, obj: Any) -> Snapshot:
        w = "snapshot"
        o = _obj(obj, w)
        _version(o, w)
        census = _get(o, "census", w)
        tree = _get(o, "tree", w)
        walkable = _bool(_get(o, "walkable", w), f"{w}.walkable")
        if walkable and tree is None:
            raise _Bad(f"{w}.tree: missing although walkable is true")
        return cls(
            schema_version=SCHEMA_VERSION,
            rank=_int(_get(o, "rank", w), f"{w}.rank", 0, 1_000_000),
            instance=_pattern(_get(o, "instance", w), f"{w}.instance", _INSTANCE_RE, "hex digits"),
            seq=_int(_get(o, "seq", w), f"{w}.seq", 0),
            time=_float(_get(o, "time", w), f"{w}.time", 0.0),
            monotonic=_float(_get(o, "monotonic", w), f"{w}.monotonic"),
            seconds=_float(_get(o, "seconds", w), f"{w}.seconds", 0.0),
            cache_class=_str(_get(o, "cache_class", w), f"{w}.cache_class", 200),
            walkable=walkable,
            reason=_str(_get(o, "reason", w), f"{w}.reason"),
            page_size=_opt_int(_get(o, "page_size", w), f"{w}.page_size", 0),
            capacity_tokens=_opt_int(_get(o, "capacity_tokens", w), f"{w}.capacity_tokens", 0),
            available_tokens=_opt_int(_get(o, "available_tokens", w), f"{w}.available_tokens", 0),
            evictable_tokens=_opt_int(_get(o, "evictable_tokens", w), f"{w}.evictable_tokens"),
            protected_tokens=_opt_int(_get(o, "protected_tokens", w), f"{w}.protected_tokens"),
            hooks_state=_choice(_get(o, "hooks_state", w), f"{w}.hooks_state", HOOK_STATES),
            counters=Counters.from_dict(_get(o, "counters", w), f"{w}.counters"),
            events_seq=_int(_get(o, "events_seq", w), f"{w}.events_seq", 0),
            census=None if census is None else Census.from_dict(census, f"{w}.census"),
            tree=None if tree is None else TreeView.from_dict(tree, f"{w}.tree"),
            lock_detail=_choice(o.get("lock_detail", "counts"), f"{w}.lock_detail", LOCK_DETAILS),
            holders=_records(Holder, o.get("holders"), f"{w}.holders", MAX_HOLDERS),
            sharers=_records(Sharer, o.get("sharers"), f"{w}.sharers", MAX_SHARERS),
        )


_Record = TypeVar("_Record", Holder, Sharer)


def _records(kind: type[_Record], v: Any, where: str, cap: int) -> tuple[_Record, ...] | None:
    """A list of `kind` records (Holder, Sharer), None where the field is null or missing."""
    if v is None:
        return None
    return tuple(kind.from_dict(r, f"{where}[{i}]") for i, r in enumerate(_list(v, where, cap)))


class Event(NamedTuple):
    """A tuple, so the hooks can build one cheaply on the scheduler thread."""

    seq: int  # strictly increasing per instance, starting at 1
    time: float  # wall clock
    kind: str  # one of EVENT_KINDS (parsers accept other lowercase kinds from newer servers)
    node_id: int | None = None
    lock_ref: int | None = None
    tokens: int | None = None  # evict: tokens freed
    requested: int | None = None  # evict: tokens asked for
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_dict(cls, obj: Any, where: str = "event") -> Event:
        o = _obj(obj, where)
        return cls(
            seq=_int(_get(o, "seq", where), f"{where}.seq", 1),
            time=_float(_get(o, "time", where), f"{where}.time", 0.0),
            kind=_pattern(_get(o, "kind", where), f"{where}.kind", _KIND_RE, "a lowercase event kind"),
            node_id=_opt_int(o.get("node_id"), f"{where}.node_id"),
            lock_ref=_opt_int(o.get("lock_ref"), f"{where}.lock_ref"),
            tokens=_opt_int(o.get("tokens"), f"{where}.tokens", 0),
            requested=_opt_int(o.get("requested"), f"{where}.requested", 0),
            message=_str(o.get("message", ""), f"{where}.message"),
        )


@dataclass(frozen=True, slots=True)
class EventPage:
    schema_version: int
    rank: int
    instance: str
    since: int  # the since= asked for
    next_since: int  # pass this as since= next time
    latest_seq: int  # the newest seq the server holds (0: none yet)
    dropped: int  # events after `since` that the bounded ring had already discarded
    more: bool  # more events are waiting after this page
    events: tuple[Event, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["events"] = [e.to_dict() for e in self.events]
        return d

    @classmethod
    def from_dict(cls, obj: Any) -> EventPage:
        return _guard("events", cls._parse, obj)

    @classmethod
    def _parse(cls, obj: Any) -> EventPage:
        w = "events"
        o = _obj(obj, w)
        _version(o, w)
        raw = _list(_get(o, "events", w), f"{w}.events", MAX_EVENTS_PER_PAGE)
        events = tuple(Event.from_dict(e, f"{w}.events[{i}]") for i, e in enumerate(raw))
        since = _int(_get(o, "since", w), f"{w}.since", 0)
        for i, e in enumerate(events):
            if e.seq <= since or (i and e.seq <= events[i - 1].seq):
                raise _Bad(f"{w}.events[{i}].seq: {e.seq} is out of order (since={since})")
        return cls(
            schema_version=SCHEMA_VERSION,
            rank=_int(_get(o, "rank", w), f"{w}.rank", 0, 1_000_000),
            instance=_pattern(_get(o, "instance", w), f"{w}.instance", _INSTANCE_RE, "hex digits"),
            since=since,
            next_since=_int(_get(o, "next_since", w), f"{w}.next_since", 0),
            latest_seq=_int(_get(o, "latest_seq", w), f"{w}.latest_seq", 0),
            dropped=_int(_get(o, "dropped", w), f"{w}.dropped", 0),
            more=_bool(_get(o, "more", w), f"{w}.more"),
            events=events,
        )


@dataclass(frozen=True, slots=True)
class Health:
    schema_version: int
    rank: int
    instance: str
    status: str  # "ok", "starting" (no snapshot yet) or "degraded" (hooks disabled)
    hooks_state: str
    snapshots: int
    safe_points: int  # safe_point() calls seen (rate-limited ones included)
    last_snapshot_age_s: float | None
    # scheduler-thread cost of the latest (radixtop's instrument serialises on its HTTP thread)
    last_snapshot_seconds: float | None
    snapshot_interval_s: float  # the current minimum interval between snapshots (idle or watched)
    max_budget: int  # the server-side cap on ?budget=
    message: str = ""
    # Optional, absent from older servers (parsed as 0 / ""):
    safe_point_errors: int = 0  # errors caught at the scheduler's safe point (it switches off after repeated ones)
    last_error: str = ""  # the latest safe point or snapshot error, one line
    client_disconnects: int = 0  # clients that went away before their request was answered
    clients_refused: int = 0  # connections answered 503 because every connection slot was busy
    flight_dir: str = ""  # where this rank's flight record goes if the cache fails (FlightRecord)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, obj: Any) -> Health:
        return _guard("health", cls._parse, obj)

    @classmethod
    def _parse(cls, obj: Any) -> Health:
        w = "health"
        o = _obj(obj, w)
        _version(o, w)
        return cls(
            schema_version=SCHEMA_VERSION,
            rank=_int(_get(o, "rank", w), f"{w}.rank", 0, 1_000_000),
            instance=_pattern(_get(o, "instance", w), f"{w}.instance", _INSTANCE_RE, "hex digits"),
            status=_choice(_get(o, "status", w), f"{w}.status", HEALTH_STATES),
            hooks_state=_choice(_get(o, "hooks_state", w), f"{w}.hooks_state", HOOK_STATES),
            snapshots=_int(_get(o, "snapshots", w), f"{w}.snapshots", 0),
            safe_points=_int(_get(o, "safe_points", w), f"{w}.safe_points", 0),
            last_snapshot_age_s=_opt_float(_get(o, "last_snapshot_age_s", w), f"{w}.last_snapshot_age_s", 0.0),
            last_snapshot_seconds=_opt_float(
                _get(o, "last_snapshot_seconds", w), f"{w}.last_snapshot_seconds", 0.0
            ),
            snapshot_interval_s=_float(_get(o, "snapshot_interval_s", w), f"{w}.snapshot_interval_s", 0.0),
            max_budget=_int(_get(o, "max_budget", w), f"{w}.max_budget", 0, MAX_TREE_NODES),
            message=_str(o.get("message", ""), f"{w}.message"),
            safe_point_errors=_int(o.get("safe_point_errors", 0), f"{w}.safe_point_errors", 0),
            last_error=_str(o.get("last_error", ""), f"{w}.last_error"),
            client_disconnects=_int(o.get("client_disconnects", 0), f"{w}.client_disconnects", 0),
            clients_refused=_int(o.get("clients_refused", 0), f"{w}.clients_refused", 0),
            flight_dir=_str(o.get("flight_dir", ""), f"{w}.flight_dir"),
        )


FLIGHT_RECORD_KIND = "radixtop-flight-record"


@dataclass(frozen=True, slots=True)
class Trigger:
    """What made a flight recorder write: the cache raising, or the scheduler's exception handler."""

    kind: str  # evict_failure, lock_failure, unlock_failure or scheduler_exception
    message: str  # the exception's first line
    time: float  # wall clock
    # The node the failing lock or unlock was on, as the record's rows name nodes, where known (a
    # scheduler exception's: where the host names one, as the simulator's faults do).
    node: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "time": self.time, "node": self.node}

    @classmethod
    def from_dict(cls, obj: Any, where: str = "trigger") -> Trigger:
        o = _obj(obj, where)
        return cls(
            kind=_pattern(_get(o, "kind", where), f"{where}.kind", _KIND_RE, "a lowercase kind"),
            message=_str(_get(o, "message", where), f"{where}.message"),
            time=_float(_get(o, "time", where), f"{where}.time", 0.0),
            node=_opt_int(o.get("node"), f"{where}.node"),
        )


@dataclass(frozen=True, slots=True)
class FlightRecord:
    """A rank's last state, written by the instrument's flight recorder as the cache failed, for
    the post-mortem of a server that is gone: the tree and its locks at that moment (a Snapshot,
    bounded), the events before it, and what triggered the write (the first trigger first)."""

    schema_version: int
    rank: int
    pid: int
    ppid: int
    written_at: float  # wall clock of this write
    triggers: tuple[Trigger, ...]  # every trigger so far in this process, oldest first (bounded)
    snapshot: Snapshot  # read at the trigger, from a cache that may be half-way through a change
    events: tuple[Event, ...]  # the newest events, oldest first
    events_dropped: int  # events older than these that the ring had already let go
    # The last snapshot taken at a safe point before (a consistent tree, maybe seconds older): what
    # remains when the failed cache cannot be read at all (the Rust core after a panic).
    before: Snapshot | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": FLIGHT_RECORD_KIND, "schema_version": self.schema_version, "rank": self.rank,
            "pid": self.pid, "ppid": self.ppid, "written_at": self.written_at,
            "triggers": [t.to_dict() for t in self.triggers], "snapshot": self.snapshot.to_dict(),
            "events": [e.to_dict() for e in self.events], "events_dropped": self.events_dropped,
            "before": self.before.to_dict() if self.before is not None else None,
        }

    @classmethod
    def from_dict(cls, obj: Any) -> FlightRecord:
        return _guard("flight record", cls._parse, obj)

    @classmethod
    def _parse(cls, obj: Any) -> FlightRecord:
        w = "flight"
        o = _obj(obj, w)
        _version(o, w)
        if o.get("kind") != FLIGHT_RECORD_KIND:
            raise _Bad(f"{w}.kind: not a radixtop flight record")
        triggers = _list(_get(o, "triggers", w), f"{w}.triggers", 1_000)
        events = _list(_get(o, "events", w), f"{w}.events", MAX_EVENTS_PER_PAGE)
        return cls(
            schema_version=SCHEMA_VERSION,
            rank=_int(_get(o, "rank", w), f"{w}.rank", 0, 1_000_000),
            pid=_int(_get(o, "pid", w), f"{w}.pid", 0),
            ppid=_int(_get(o, "ppid", w), f"{w}.ppid", 0),
            written_at=_float(_get(o, "written_at", w), f"{w}.written_at", 0.0),
            triggers=tuple(Trigger.from_dict(t, f"{w}.triggers[{i}]") for i, t in enumerate(triggers)),
            snapshot=Snapshot.from_dict(_get(o, "snapshot", w)),
            events=tuple(Event.from_dict(e, f"{w}.events[{i}]") for i, e in enumerate(events)),
            events_dropped=_int(_get(o, "events_dropped", w), f"{w}.events_dropped", 0),
            before=Snapshot.from_dict(o["before"]) if o.get("before") is not None else None,
        )


def error_body(message: str) -> bytes:
    return encode_json(
        {"schema_version": SCHEMA_VERSION, "error": message.splitlines()[0][:MAX_TEXT] if message else ""}
    )


def parse_error(data: bytes | str) -> str:
    """The one-line message of an error response (a generic line when the body is not ours)."""
    try:
        obj = decode_json(data, "error")
        if isinstance(obj, Mapping) and type(obj.get("error")) is str:
            return obj["error"].splitlines()[0][:MAX_TEXT] if obj["error"] else "error (no message)"
    except ValueError:
        pass
    return "error response without a radixtop message"


def parse_snapshot(data: bytes | str) -> Snapshot:
    return Snapshot.from_dict(decode_json(data, "snapshot"))


def parse_events(data: bytes | str) -> EventPage:
    return EventPage.from_dict(decode_json(data, "events"))


def parse_health(data: bytes | str) -> Health:
    return Health.from_dict(decode_json(data, "health"))
