"""A rank's flight record as a view of its own in the radix pane: the tree and its locks as the
rank's cache failed (probes/flight.py reads it as the failing scheduler writes it), with the last
safe point before it one key away. The board turns to the first rank that failed."""

from __future__ import annotations

import time

from radixtop.probes.flight import FlightFile
from radixtop.probes.radix import RadixSample
from radixtop.probes.radix_tree import TreeIndex
from radixtop.probes.status import SourceState


def flight_sample(found: FlightFile) -> RadixSample:
    record = found.record
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
        snapshot=record.snapshot,
        index=TreeIndex.build(record.snapshot),
        source_note=f"flight record of pid {record.pid}: {what}{more}",
        label=f"failed r{record.rank}",
        before=record.before,
        failed_node=on_node.node if on_node is not None else None,
        failed_op=on_node.kind if on_node is not None else "",
        locks_known=record.snapshot.lock_detail != "none",
    )
