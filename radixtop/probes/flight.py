"""The ranks' flight records (radixtop.instrument.flight): the tree and its locks as a rank's
cache failed, written by the failing scheduler into the runtime directory's flight/ before it
died. Read here for the bundle and, as they appear, for the radix pane.

A record is taken only as a regular file of the server's own user, read through no link, and
only when it belongs to the server (its pid or parent pid is the server's), or, with no pid known,
when it was written in the last hour.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from radixtop.probes.status import SourceState
from radixtop.schema import FlightRecord, decode_json

FLIGHT_MAX_BYTES = 64 << 20
FLIGHT_MAX_AGE_S = 3600.0  # with no pid to match, records written this recently are taken
FLIGHT_MAX_FILES = 256  # per directory: a directory of others' leftovers is not read whole
FLIGHT_POLL_S = 0.5  # the pane shows a rank's failure within a second


@dataclass(frozen=True, slots=True)
class FlightFile:
    path: Path
    mtime: float
    record: FlightRecord


@dataclass(frozen=True, slots=True)
class FlightRead:
    records: tuple[FlightFile, ...]
    skipped: tuple[str, ...] = ()  # "path: why", for records that could not be read


def record_owners(pid: int | None) -> tuple[int, ...]:
    """Whose files may be the server's flight records: its user's (while it runs), else ours."""
    try:
        return (psutil.Process(pid).uids().effective,) if pid is not None else (os.geteuid(),)
    except (psutil.Error, OSError):
        return (os.geteuid(),)


def read_flight_records(dirs: Sequence[Path], pid: int | None, *, seen: dict[Path, float] | None = None) -> FlightRead:
    """The server's records in `dirs`. `seen` (path -> mtime) skips files unchanged since then."""
    from radixtop.rundir import read_checked

    found: list[FlightFile] = []
    skipped: list[str] = []
    now = time.time()
    owners = record_owners(pid)
    for directory in dict.fromkeys(dirs):
        try:
            paths = sorted(directory.glob("rank*-pid*.json"))[:FLIGHT_MAX_FILES]
        except OSError:
            continue
        for path in paths:
            if seen is not None:
                try:
                    if seen.get(path) == path.lstat().st_mtime:
                        continue
                except OSError:
                    continue
            try:
                # Checked on the open file, never through a link: what is checked is what is read.
                read = read_checked(path, FLIGHT_MAX_BYTES, owners=owners)
                if read is None:
                    continue
                data, info = read
                if seen is not None:
                    seen[path] = info.st_mtime
                if pid is None and now - info.st_mtime > FLIGHT_MAX_AGE_S:
                    continue
                record = FlightRecord.from_dict(decode_json(data, "flight record"))
            except (OSError, ValueError) as exc:
                skipped.append(f"{path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
                continue
            if pid is not None and pid not in (record.pid, record.ppid):
                continue
            found.append(FlightFile(path, info.st_mtime, record))
    return FlightRead(tuple(found), tuple(skipped))


@dataclass(frozen=True, slots=True)
class FlightSample:
    status: SourceState
    time: float
    records: tuple[FlightFile, ...] = field(default=())  # new or rewritten since the last poll


class FlightProbe:
    """Polls the flight directories the ranks named (and the default one) for the server's new
    records: a glob of a small directory every FLIGHT_POLL_S."""

    def __init__(self, dirs: Callable[[], Sequence[Path]], pid: Callable[[], int | None],
                 others: Callable[[], Sequence[Path]] = tuple) -> None:
        self.interval_s = FLIGHT_POLL_S
        self._dirs = dirs
        self._pid = pid
        self._others = others  # other nodes' records, brought here as they came: no pid of ours to match
        self._seen: dict[Path, float] = {}

    async def poll(self) -> FlightSample:
        import asyncio

        read = await asyncio.to_thread(read_flight_records, self._dirs(), self._pid(), seen=self._seen)
        theirs = await asyncio.to_thread(read_flight_records, self._others(), None, seen=self._seen)
        return FlightSample(SourceState("ok"), time.time(), read.records + theirs.records)

    async def aclose(self) -> None:
        return None
