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

A lock the next safe point does not see was let go (the request finished, was retracted, or moved
its lock to a deeper node at a checkpoint): the tracker remembers the request's rid and ids and
the node it held (`Released`, the newest MAX_RELEASED), so that the nodes it used name it while
they stay cached. A node id is never reused (SGLang numbers nodes from a counter, both cores), so
a remembered node either is the node the request held, with the same path, or is gone: on the
Rust core `path_device_indices` raises for it, and the capture forgets it.

raw_holders() turns the latest observation into plain values when a snapshot is captured (still
the scheduler thread); named() makes them schema.Holders on the endpoint's thread, once the
snapshot's rows are known (snapshot.Capture.build()). Standard library only; nothing here raises
into the host.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from itertools import chain, islice, repeat
from typing import Any, NamedTuple

from radixtop.schema import MAX_HOLDERS, MAX_SHARERS, Holder, Sharer

MAX_WAITING_SCAN = 256  # waiting requests looked at per safe point (0.5.23's hold no lock)
# Requests remembered after they let go of a lock: each capture on the Rust core asks the core for
# every remembered node's path (a few microseconds each), so the memory stays small.
MAX_RELEASED = min(128, MAX_SHARERS)
MAX_RID_CHARS = 200
_BATCHES = ("running_batch", "cur_batch", "last_batch")
_new_seen = tuple.__new__


class Seen(NamedTuple):
    """A request holding a lock at the latest safe point."""

    req: Any
    lock: Any
    state: str  # schema.HOLDER_STATES
    first_seen: float  # time.monotonic() at the first safe point that saw this lock


class Released(NamedTuple):
    """A request's lock the scheduler let go of: what names the nodes it held while they stay."""

    rid: Any
    node: int  # the node's id as the cache's API names it
    prompt: Any  # the request's token id sequences, references
    output: Any
    released: float  # time.monotonic() at the first safe point that no longer saw the lock


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

    def __init__(
        self, max_holders: int = MAX_HOLDERS, max_waiting: int = MAX_WAITING_SCAN, max_released: int = MAX_RELEASED
    ) -> None:
        self.max_holders = max_holders
        self.max_waiting = max_waiting
        self.max_released = max_released
        self._first: dict[int, Seen] = {}  # id(lock) -> the lock as first seen (it keeps the lock)
        self.latest: list[Seen] | None = None  # None: unknown (no scheduler, or it could not be read)
        self.released: OrderedDict[tuple[Any, int], Released] = OrderedDict()  # (rid, node) -> newest last
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
        places = _places(scheduler, self.max_waiting)
        for state, req in chain.from_iterable(zip(repeat(state), reqs) for state, reqs in places):
            lock = getattr(req, "lock", None)
            if lock is None:
                continue
            key = id(lock)
            if key in fresh:
                continue
            old = before(key)
            entry = _new_seen(Seen, (req, lock, state, old[3] if old is not None and old[1] is lock else now))
            fresh[key] = entry
            add(entry)
            if len(seen) >= cap:  # the rest unseen: not known to be let go either
                self._first = fresh
                return seen
        self._let_go(fresh, now)
        self._first = fresh
        return seen

    def _let_go(self, fresh: dict[int, Seen], now: float) -> None:
        """Remember the locks the last safe point saw and this one does not."""
        gone = self._first.keys() - fresh.keys()
        if not gone:
            return
        released = self.released
        for key in gone:
            req, lock = self._first[key][:2]
            node = getattr(lock, "node", None)
            node = getattr(node, "id", node)  # a TreeNode's id; the unified cache's NodeId as is
            if type(node) is not int:
                continue
            entry = (getattr(req, "rid", None), node)
            released.pop(entry, None)
            released[entry] = Released(
                entry[0], node, getattr(req, "origin_input_ids", None), getattr(req, "output_ids", None), now
            )
        while len(released) > self.max_released:
            released.popitem(last=False)


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


def raw_sharers(
    released: OrderedDict[tuple[Any, int], Released], holding: Sequence[Seen], now: float,
    path_of: Callable[[Any], Any] | None = None,
) -> tuple[RawHolder, ...]:
    """The requests that let go of their locks, newest first, one per rid (its newest node that is
    still there), none that holds a lock now (scheduler thread, at the capture). On the Rust core a
    node the core no longer has is forgotten, and the rest carry their path's slots and ids."""
    holding_rids = {getattr(s.req, "rid", None) for s in holding}
    named: set[Any] = set()
    out, gone = [], []
    for entry, r in reversed(released.items()):
        if r.rid in holding_rids or r.rid in named:
            continue
        if path_of is None:
            ref, ids = r.node, None
        else:
            try:
                ref, ids = path_of(r.node), (r.prompt, r.output)
            except Exception:  # gone from the tree (its id is never reused)
                gone.append(entry)
                continue
        named.add(r.rid)
        out.append(RawHolder(
            r.rid, ref, max(0.0, now - r.released), len(r.prompt) if r.prompt is not None else 0, "released", ids,
        ))
    for entry in gone:
        del released[entry]
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


def named_sharers(raw: Sequence[RawHolder], nodes: Sequence[int | None] | None = None) -> tuple[Sharer, ...]:
    """schema.Sharers (endpoint thread), their nodes named as named() names holders'."""
    return tuple(
        Sharer(rid=h.rid, node=h.node, released_s=h.held_s, prompt_tokens=h.prompt_tokens)
        for h in named(raw, nodes)
    )
