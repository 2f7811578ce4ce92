"""The requests holding tree locks, read from the scheduler at its safe point.

SGLang (0.5.23) keeps the lock a request holds as `req.lock`, a TreeLock whose `node` is the
deepest node it holds (a TreeNode on RadixCache, a NodeId int on UnifiedRadixCache, Python or
Rust core); the lock holds that node and every node above it. A request gets it when it is
admitted and a new one at each prefill chunk's checkpoint, and gives it back when it finishes or
is retracted. The scheduler keeps its requests in `chunked_req`, `running_batch.reqs`,
`cur_batch.reqs`, `last_batch.reqs` and `waiting_queue`.

HolderTracker.observe(scheduler) runs at every safe point (scheduler thread): it reads those places
duck-typed (any of them may be missing), at most MAX_HOLDERS holders and the first MAX_WAITING_SCAN
waiting requests, and remembers when it first saw each lock object (a dict keyed by id(lock) that
keeps the lock, so its id cannot be reused while it is there, and forgets every lock the next
safe point does not see). held_s is therefore a lower bound: the time since the first safe point
that saw this lock. Locks held by anything but a request in those places (a streaming session's
slot, disaggregation's queues) are not seen.

raw_holders() turns the latest observation into plain values when a snapshot is captured (still
the scheduler thread); named() makes them schema.Holders on the endpoint's thread, once the
snapshot's rows are known (snapshot.Capture.build()). Standard library only; nothing here raises
into the host.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import Any, NamedTuple

from radixtop.schema import MAX_HOLDERS, Holder

MAX_WAITING_SCAN = 256  # waiting requests looked at per safe point (0.5.23's hold no lock)
MAX_RID_CHARS = 200
_BATCHES = ("running_batch", "cur_batch", "last_batch")
_new_seen = tuple.__new__


class Seen(NamedTuple):
    """A request holding a lock at the latest safe point."""

    req: Any
    lock: Any
    state: str  # schema.HOLDER_STATES
    first_seen: float  # time.monotonic() at the first safe point that saw this lock


class RawHolder(NamedTuple):
    """A holder as captured on the scheduler thread: `node` is what the snapshot's rows will be
    matched against (a node id for a tree walked from Python; the device slots of the locked path
    on the Rust core), `ids` the request's token id sequences (prompt, output), references read
    later and only on the Rust core."""

    rid: Any
    node: Any
    held_s: float
    prompt_tokens: int
    state: str
    ids: tuple[Any, Any] | None


class HolderTracker:
    """The lock holders of one scheduler, observed at each safe point."""

    def __init__(self, max_holders: int = MAX_HOLDERS, max_waiting: int = MAX_WAITING_SCAN) -> None:
        self.max_holders = max_holders
        self.max_waiting = max_waiting
        self._first: dict[int, tuple[Any, float]] = {}  # id(lock) -> (lock, first seen)
        self.latest: list[Seen] | None = None  # None: unknown (no scheduler, or it could not be read)
        self.errors = 0

    def observe(self, scheduler: Any, now: float | None = None) -> None:
        """Read the scheduler's lock holders (its thread, at a safe point). Never raises."""
        if scheduler is None:
            self.latest, self._first = None, {}
            return
        try:
            self.latest = self._read(scheduler, time.monotonic() if now is None else now)
        except Exception:  # a scheduler we do not understand: holders unknown
            self.errors += 1
            self.latest, self._first = None, {}

    def _read(self, scheduler: Any, now: float) -> list[Seen]:
        # Plain tuples built in C (a NamedTuple's own __new__ doubles the cost per request).
        before, fresh = self._first.get, {}
        seen: list[Seen] = []
        add, cap = seen.append, self.max_holders
        for state, reqs in _places(scheduler, self.max_waiting):
            for req in reqs:
                lock = getattr(req, "lock", None)
                if lock is None:
                    continue
                key = id(lock)
                if key in fresh:
                    continue
                old = before(key)
                since = old[1] if old is not None and old[0] is lock else now
                fresh[key] = (lock, since)
                add(_new_seen(Seen, (req, lock, state, since)))
                if len(seen) >= cap:
                    self._first = fresh
                    return seen
        self._first = fresh
        return seen


def _places(scheduler: Any, max_waiting: int) -> list[tuple[str, Iterable[Any]]]:
    """Where the scheduler keeps its requests, each with the state its holders are in; a request
    in several places (the chunked one is in the last batch too) counts in the first."""
    places: list[tuple[str, Iterable[Any]]] = []
    chunked = getattr(scheduler, "chunked_req", None)
    if chunked is not None:
        places.append(("chunked", (chunked,)))
    for name in _BATCHES:
        reqs = getattr(getattr(scheduler, name, None), "reqs", None)
        if reqs:
            places.append(("running", reqs))
    waiting = getattr(scheduler, "waiting_queue", None)
    if waiting:
        places.append(("waiting", islice(waiting, max_waiting)))
    return places


def raw_holders(
    seen: Sequence[Seen], now: float, path_of: Callable[[Any], Any] | None = None
) -> tuple[RawHolder, ...]:
    """The holders as plain values (scheduler thread, at the capture). `path_of(node)`: on the Rust
    core, the locked path's device slots (`cache.path_device_indices`), matched against the
    rebuilt chains in build(); elsewhere the node's own id is what the rows carry."""
    out = []
    for s in seen:
        req, node = s.req, getattr(s.lock, "node", None)
        prompt = getattr(req, "origin_input_ids", None)
        if path_of is None:
            ref, ids = getattr(node, "id", node), None
        else:
            ref, ids = _path(path_of, node), (prompt, getattr(req, "output_ids", None))
        out.append(RawHolder(
            getattr(req, "rid", None), ref, max(0.0, now - s.first_seen), len(prompt) if prompt is not None else 0,
            s.state, ids,
        ))
    return tuple(out)


def _path(path_of: Callable[[Any], Any], node: Any) -> Any:
    try:
        return path_of(node) if node is not None else None
    except Exception:  # a node the core no longer has: its chain is unknown
        return None


def last_slot(path: Any) -> int | None:
    """The last device slot of a path (a tensor or a sequence), None for an empty or odd one."""
    try:
        if path is None or len(path) == 0:
            return None
        slot = path[-1]
        slot = slot.item() if hasattr(slot, "item") else slot
    except Exception:
        return None
    return slot if type(slot) is int else None


def token_at(ids: tuple[Any, Any], position: int) -> int | None:
    """The request's token id at `position` of its sequence (prompt, then output), None where it
    has none or the id is not a plain int."""
    prompt, output = ids
    try:
        n = len(prompt) if prompt is not None else 0
        if position < n:
            token = prompt[position]
        elif output is not None and position - n < len(output):
            token = output[position - n]
        else:
            return None
    except Exception:
        return None
    return token if type(token) is int else None


def named(raw: Sequence[RawHolder], nodes: Sequence[int | None] | None = None) -> tuple[Holder, ...]:
    """schema.Holders (endpoint thread): `nodes`, where given, the row id each holder's node maps
    to (the Rust core's chains); else the id captured, when it is a plain int."""
    out = []
    for i, h in enumerate(raw):
        node = nodes[i] if nodes is not None else h.node
        out.append(Holder(
            rid=h.rid[:MAX_RID_CHARS] if isinstance(h.rid, str) else "",
            node=node if type(node) is int else None,
            held_s=h.held_s,
            prompt_tokens=h.prompt_tokens if type(h.prompt_tokens) is int else 0,
            state=h.state,
        ))
    return tuple(out)
