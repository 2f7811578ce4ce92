"""A rank's flight record as a view of its own in the radix pane: the tree and its locks as the
rank's cache failed (probes/flight.py reads it as the failing scheduler writes it), with the last
safe point before it one key away. The board turns to the first rank that failed."""

from __future__ import annotations

import time
from dataclasses import replace

from radixtop.probes.flight import FlightFile
from radixtop.probes.radix import RadixSample
from radixtop.probes.radix_tree import TreeIndex
from radixtop.probes.status import SourceState


def flight_sample(found: FlightFile) -> RadixSample:
    record = found.record
    at = record.snapshot
    holders_note = ""
    if at.holders is None and record.before is not None and record.before.holders is not None:
        # Mid-iteration the scheduler's requests are not read; the safe point's are a step older.
        at = replace(at, holders=record.before.holders)
        holders_note = f" · lock holders as of the safe point {max(0.0, at.time - record.before.time):.1f} s before"
    first = record.triggers[0] if record.triggers else None
    when = first.time if first is not None else record.written_at
    what = f"{first.kind}: {first.message}" if first is not None else "written without a trigger"
    more = f" (+{len(record.triggers) - 1} later)" if len(record.triggers) > 1 else ""
    on_node = next((t for t in record.triggers if t.node is not None), None)  # the failing operation's
    return RadixSample(
        url=f"flight {found.path}",
        status=SourceState("ok", "", when),
        time=time.time(),
        rank=record.rank,
        snapshot=at,
        index=TreeIndex.build(at),
        source_note=f"flight record of pid {record.pid}: {what}{more}{holders_note}",
        label=f"failed r{record.rank}",
        before=record.before,
        failed_node=on_node.node if on_node is not None else None,
        failed_op=on_node.kind if on_node is not None else "",
        locks_known=at.lock_detail != "none",
    )
