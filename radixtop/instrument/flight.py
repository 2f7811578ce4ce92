"""The flight recorder: a rank's radix cache as it was when it failed, on disk before the process
dies (a bundle taken afterwards can no longer ask the endpoint).

Two triggers, on the failing thread: the hooks see the cache raise in evict / inc_lock_ref /
dec_lock_ref (hooks.py calls `on_host_failure`), and the host's glue sees the scheduler's
exception handler run (sglang.py: its log record; the simulator: its death). Either calls
FlightRecorder.record(), which captures the tree (a bounded walk and a bounded census, as a
Snapshot), the newest events and the counters, and writes one JSON file (schema.FlightRecord) per
rank and process, `rank<R>-pid<P>.json`, atomically (a temporary file renamed over it) and capped
in size. It never raises into the host and writes at most MAX_WRITES times per process and rank,
so a cache failing in a loop can neither fill a disk nor stall its scheduler; the file keeps
every trigger so far, the first one first.

The directory: RADIXTOP_FLIGHT_DIR, else `flight/` in radixtop's runtime directory (rundir.py);
the endpoint's /health names it. radixtop's bundle collects the records of the server it is given.
Standard library only: it runs inside SGLang.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from radixtop.instrument.snapshot import SnapshotConfig, TreeSnapshotter, rust_core
from radixtop.schema import SCHEMA_VERSION, FlightRecord, Trigger, encode_json

log = logging.getLogger("radixtop.instrument")

ENV_FLIGHT_DIR = "RADIXTOP_FLIGHT_DIR"
MAX_WRITES = 8  # per process and rank
MAX_TRIGGERS = 32  # kept in the record, the first ones
MAX_RECORD_BYTES = 8 << 20
RECORD_EVENTS = 2_000
# A bigger detail walk than a live snapshot's (this one is read once, post mortem), and a census
# bounded so that a huge tree costs its dying scheduler at most a fraction of a second; 4 token ids
# a node (not a live snapshot's 32) keep a 4,000-row record, written as the rank dies, small.
RECORD_CONFIG = SnapshotConfig(max_nodes=4_000, census_max_nodes=300_000, census_slice=4_096, head_tokens=4)


def flight_dir(environ: Any = None) -> Path:
    """Where records go: RADIXTOP_FLIGHT_DIR, else the runtime directory's flight/ (not created)."""
    from radixtop.rundir import ENV_RUNTIME_DIR, default_runtime_dir

    env = os.environ if environ is None else environ
    chosen = env.get(ENV_FLIGHT_DIR, "").strip()
    if chosen:
        return Path(chosen)
    return Path(env.get(ENV_RUNTIME_DIR, "").strip() or default_runtime_dir(env)) / "flight"


def record_name(rank: int, pid: int) -> str:
    return f"rank{rank}-pid{pid}.json"


class FlightRecorder:
    """One rank's recorder. `cache`, `hooks` (CacheHooks, or None) and `instance` (the endpoint's)
    are what it reads at a trigger."""

    def __init__(
        self, cache: Any, *, rank: int, hooks: Any = None, instance: str = "0", directory: str | Path | None = None,
        before: Callable[[], Any] | None = None,
    ) -> None:
        """`before`: the last snapshot taken at a safe point (the endpoint's), or None."""
        self.cache = cache
        self.before = before
        self.rank = int(rank)
        self.hooks = hooks
        self.instance = instance
        self.directory = Path(directory) if directory is not None else flight_dir()
        self.triggers: list[Trigger] = []
        self.writes = 0
        self.last_error = ""  # why the latest write failed, one line
        self.path: Path | None = None  # the file once written

    def record(self, kind: str, message: str, node: int | None = None) -> bool:
        """Write the record now (on the calling thread: the failing one). True when written.
        `node`: the failing operation's node as the cache's API names it (a node's id, a NodeId);
        the trigger names it as the record's rows do (on the Rust core: the chain holding its
        path's last slot, known only when the record is written). Never raises."""
        try:
            kept = len(self.triggers) < MAX_TRIGGERS
            if kept:
                self.triggers.append(Trigger(kind, message.splitlines()[0][:500] if message else "", time.time()))
            if self.writes >= MAX_WRITES:
                if kept and rust_core(self.cache) is None:
                    self._name_last(node if type(node) is int else None)
                return False
            self.writes += 1
            record, named = self._build(node)
            if kept:
                self._name_last(named)
                record = dataclasses.replace(record, triggers=tuple(self.triggers))
            return self._write(record)
        except Exception as exc:  # noqa: BLE001 - the host must never see our failure
            self.last_error = f"{type(exc).__name__}: {exc}"[:500]
            log.warning("radixtop flight recorder (rank %d): %s", self.rank, self.last_error)
            return False

    def _name_last(self, node: int | None) -> None:
        self.triggers[-1] = dataclasses.replace(self.triggers[-1], node=node)

    def _build(self, node: int | None) -> tuple[FlightRecord, int | None]:
        """The record, and `node` as its rows name it (None: unknown)."""
        hooks = self.hooks
        snapshot, marks = TreeSnapshotter(RECORD_CONFIG).take_marked(
            self.cache, force_census=True, rank=self.rank, instance=self.instance,
            counters=hooks.counters() if hooks is not None else None,
            hooks_state=hooks.state if hooks is not None else "off",
            events_seq=hooks.events.latest_seq if hooks is not None else 0,
            marks=(node,) if type(node) is int else (),
        )
        events: tuple[Any, ...] = ()
        dropped = 0
        if hooks is not None:
            ring = hooks.events
            events, _, dropped, _ = ring.read(max(0, ring.latest_seq - RECORD_EVENTS), RECORD_EVENTS)
        before = None
        if self.before is not None:
            try:
                before = self.before()
            except Exception as exc:  # noqa: BLE001 - the record at the trigger still goes out
                self.last_error = f"the last snapshot: {type(exc).__name__}: {exc}"[:500]
        return FlightRecord(
            SCHEMA_VERSION, self.rank, os.getpid(), os.getppid(), time.time(), tuple(self.triggers), snapshot,
            tuple(events), dropped, before,
        ), marks[0] if marks else None

    def _write(self, record: FlightRecord) -> bool:
        data = encode_json(record.to_dict())
        nodes = max(
            (s.tree.walked_nodes for s in (record.snapshot, record.before) if s is not None and s.tree is not None),
            default=0,
        )
        while len(data) > MAX_RECORD_BYTES and (nodes or record.events):
            # The tree's far rows go first, halving (the figures and the census stay whole), then
            # the older events.
            if nodes:
                nodes //= 2
                before = record.before.with_budget(nodes) if record.before is not None else None
                record = dataclasses.replace(record, snapshot=record.snapshot.with_budget(nodes), before=before)
            else:
                record = dataclasses.replace(record, events=record.events[len(record.events) // 2 + 1 :])
            data = encode_json(record.to_dict())
        from radixtop.rundir import make_private_dirs, private_dir_problem, write_file

        make_private_dirs(self.directory)
        why = private_dir_problem(self.directory)
        if why is not None:
            # In a shared /tmp another user could have made it, or put a FIFO in it that would
            # hang the dying scheduler, or read what the server writes.
            raise PermissionError(f"{why}; set {ENV_FLIGHT_DIR} to a private directory")
        path = self.directory / record_name(self.rank, record.pid)
        write_file(path, data)
        self.path = path
        log.warning("radixtop flight record for rank %d written: %s", self.rank, path)
        return True

