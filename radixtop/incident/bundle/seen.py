"""What radixtop saw, for the evidence bundle: the server's ranks die before a bundle can ask them.

When the lock race kills a rank, its debug endpoint goes with it, and a bundle taken a second
later gets "connection refused" for the tree and its locks, the evidence that matters most for a
radix-cache incident. The TUI had it on screen moments before: each rank's last snapshots and the
events it received, the vital signs up to the crash, and the screen itself. `SeenState` holds
references to those (immutable snapshots and events, copied series), taken on the UI thread at
the moment of the bundle; `write()` turns them into files on the bundle's thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixtop.incident.bundle.evidence import Sink

__all__ = ["RankSeen", "SeenState"]


@dataclass(frozen=True)
class RankSeen:
    label: str  # "rank0", or the endpoint's URL when the rank is unknown
    url: str
    status: str  # the endpoint's state when the bundle was taken ("down since ...")
    snapshots: tuple[tuple[float, Any], ...]  # (time fetched, schema.Snapshot), oldest first
    events: tuple[Any, ...]  # schema.Event, oldest first
    source: str = ""  # where the tree came from when not radixtop's endpoint ("kv-events: ...")
    locks_known: bool = True  # False: the rows' lock_ref 0 means unknown (kv-events carry no locks)


@dataclass(frozen=True)
class SeenState:
    ranks: tuple[RankSeen, ...] = ()
    vitals: dict[str, Any] = field(default_factory=dict)  # series key -> {source, points [[t, v], ...]}
    marks: tuple[tuple[float, str], ...] = ()  # first signatures on the time axis
    screen_svg: str | None = None  # the screen as it was (Textual's export)
    screen_error: str | None = None  # why there is no screen_svg
    flight_dirs: tuple[str, ...] = ()  # where the ranks' flight recorders write, as their /health said

    def write(self, sink: Sink) -> list[str]:
        """The files, under seen/; returns their relative paths."""
        written: list[str] = []
        for rank in self.ranks:
            base = f"seen/radix/{rank.label}"
            if rank.snapshots:
                sink.json(f"{base}-snapshots.json", {
                    "url": rank.url, "status": rank.status, "source": rank.source or "radixtop debug endpoint",
                    "locks_known": rank.locks_known,
                    "snapshots": [{"fetched": t, "snapshot": s.to_dict()} for t, s in rank.snapshots],
                })
                written.append(f"{base}-snapshots.json")
            if rank.events:
                sink.json(f"{base}-events.json", {"url": rank.url, "events": [e.to_dict() for e in rank.events]})
                written.append(f"{base}-events.json")
        if self.vitals:
            sink.json("seen/vitals.json", {"series": self.vitals, "first_signatures": [list(m) for m in self.marks]})
            written.append("seen/vitals.json")
        if self.screen_svg:
            sink.text("seen/screen.svg", self.screen_svg)
            written.append("seen/screen.svg")
        elif self.screen_error:
            sink.note("seen/screen.svg", f"the screen could not be exported: {self.screen_error}")
        return written
