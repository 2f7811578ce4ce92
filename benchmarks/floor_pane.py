"""The floor of a log pane in Python, a peer for screen_bench's live test: what following a flood
costs without radixtop's app around it.

    python benchmarks/floor_pane.py [--parts PARTS] LOG

Every 1/40 s on the clock, as radixtop's flood frames: read what the file holds past the last read,
split it into lines, keep the last 100,000, and write the newest rows of the terminal (160 columns,
time of day dimmed) in one write. Plain asyncio, no Textual. PARTS, comma-separated, adds radixtop's
own pieces in its place:

- matcher: radixtop's catalog and needles (hyperscan) over each read's bytes;
- folds: the HTTP access folds over each read's lines;
- pipeline: radixtop's log follower (read_now, take), ingest and incident state (the ring, the
  matcher, the folds and the findings), the rows read from that state.

screen_bench runs it as "python floor" (no parts) and "radixtop pipeline" (pipeline).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this tree's radixtop

FRAME_S = 1 / 40
ROWS = 17  # the log pane's rows at 160x48 with every pane shown
RING = 100_000
_PREFIX = re.compile(r"\[\d{4}-\d\d-\d\d[ T](\d\d:\d\d:\d\d(?:[.,]\d{1,6})?)[^\]\[]{0,64}\] ?")


class Floor:
    def __init__(self, path: str, parts: set[str]) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        self.offset = max(0, os.fstat(self.fd).st_size - 65536)
        self.partial = b""
        self.ring: deque[str] = deque(maxlen=RING)
        self.seq = 0
        self.parts = parts
        self.matcher: Any = None
        self.folds: Any = None
        self.follower: Any = None
        if parts & {"matcher", "folds", "pipeline"}:
            self._radixtop_parts()

    def _radixtop_parts(self) -> None:
        from radixtop.diagnosis.catalog import load_catalog
        from radixtop.diagnosis.findings import FindingsBuilder
        from radixtop.diagnosis.matcher import Matcher, literal_signatures
        from radixtop.session.needles import NEEDLES

        catalog = load_catalog()
        if "matcher" in self.parts:
            self.matcher = Matcher([*catalog.signatures, *literal_signatures(NEEDLES)])
        if "folds" in self.parts:
            from radixtop.session.access_fold import AccessFolds

            self.folds = AccessFolds()
        if "pipeline" in self.parts:
            from radixtop.probes.follow import LogFollower
            from radixtop.session.incident_state import IncidentState
            from radixtop.session.ingest import Ingestor

            builder = FindingsBuilder(catalog, matcher=Matcher(catalog.signatures), context=100)
            self.ingestor = Ingestor(builder, catalog)
            self.state = IncidentState()
            self.follower = LogFollower([self.path], backlog_lines=ROWS, poll_interval=0.025)
            self.follower.start()
            self.follower.wait_caught_up(5.0)

    def read(self) -> int:
        """Take what the file holds now; the number of new lines."""
        if self.follower is not None:
            self.follower.read_now()
            batch = self.follower.take()
            if batch is None:
                return 0
            self.state.apply(self.ingestor.process(batch))
            return len(batch.records)
        data = os.pread(self.fd, 1 << 20, self.offset)
        self.offset += len(data)
        data = self.partial + data
        end = data.rfind(b"\n")
        self.partial = data[end + 1 :]
        if end < 0:
            return 0
        raw = data[:end]
        lines = raw.decode("utf-8", "replace").split("\n")
        if self.matcher is not None:
            self.matcher.line_hits(lines, raw)
        if self.folds is not None:
            self.folds.feed(self.seq, lines)
        self.ring.extend(lines)
        self.seq += len(lines)
        return len(lines)

    def newest(self) -> list[str]:
        if self.follower is not None:
            state = self.state
            seqs = (state.view_seq(row) for row in range(max(0, state.view_len - ROWS), state.view_len))
            return [state.text(seq) or "" for seq in seqs if seq is not None]
        return [self.ring[i] for i in range(max(0, len(self.ring) - ROWS), len(self.ring))]

    def draw(self) -> None:
        out = []
        for y, text in enumerate(self.newest()):
            m = _PREFIX.match(text)
            clock, message = (m.group(1), text[m.end() :]) if m else ("", text)
            out.append(f"\x1b[{y + 2};1H\x1b[0m   \x1b[2m{clock:<12.12} \x1b[22m{message[:143]:<143}")
        os.write(1, "".join(out).encode())

    async def run(self) -> None:
        os.write(1, b"\x1b[2J")
        self.read()
        self.draw()
        due = time.monotonic()
        while True:
            due += FRAME_S
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if self.read():
                self.draw()
            else:
                due = time.monotonic()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="", help="comma-separated: matcher, folds, pipeline")
    parser.add_argument("log")
    args = parser.parse_args()
    parts = {p for p in args.parts.split(",") if p}
    unknown = parts - {"matcher", "folds", "pipeline"}
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}: choose from matcher, folds, pipeline")
    try:
        asyncio.run(Floor(args.log, parts).run())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
