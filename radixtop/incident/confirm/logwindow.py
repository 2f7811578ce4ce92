"""Signatures that appear in log files from a moment on: what a replay window made the server say.

``LogWindow.start()`` remembers where each file ends; ``poll()`` reads what was appended since
(``incident.common.appended``), feeds it to a FindingsBuilder and returns the signature ids seen
for the first time. Rotation inside a window is not followed: a window lasts one replay, and the
bundle holds the full evidence.

It also keeps what the confirmation run's verdict compares besides signatures (``BatchTally``: the
peak token usage the scheduler's batch lines reported and the requests retracted), and the newest
lines (a server's own progress while it loads, shown while the run waits for its health).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from radixtop.diagnosis.evidence_policy import CONTEXT_BEFORE
from radixtop.incident.common.appended import AppendedLines, BatchTally

if TYPE_CHECKING:
    from radixtop.diagnosis.catalog import Catalog
    from radixtop.diagnosis.findings import Report
    from radixtop.diagnosis.matcher import Matcher

__all__ = ["LogWindow"]

FRESH_LINES = 200  # newest lines kept for whoever shows progress


class LogWindow:
    def __init__(self, paths: Sequence[str], catalog: Catalog, matcher: Matcher | None = None, *,
                 context: int = CONTEXT_BEFORE):
        from radixtop.diagnosis.findings import FindingsBuilder

        self._lines = AppendedLines(paths, count_lines=True)
        self.paths = self._lines.paths
        self.builder = FindingsBuilder(catalog, matcher=matcher, context=context)
        self._seen: set[str] = set()
        self._lock = threading.Lock()  # poll() may be called from worker threads, one at a time
        self._tally = BatchTally()
        self.fresh: deque[str] = deque(maxlen=FRESH_LINES)  # newest lines; a reader may clear it

    @property
    def peak_token_usage(self) -> float | None:
        return self._tally.peak_token_usage

    @property
    def retracted(self) -> int:
        return self._tally.retracted

    def start(self) -> None:
        self._lines.start()

    def poll(self) -> list[str]:
        """New lines of every file into the builder; the ids of signatures not seen before."""
        with self._lock:
            new: list[str] = []
            for path, lineno, text in self._lines.read():
                self.fresh.append(text)
                self._tally.add(text)
                for sig_id in self.builder.feed(path, lineno, text):
                    if sig_id not in self._seen:
                        self._seen.add(sig_id)
                        new.append(sig_id)
            return new

    def report(self) -> Report:
        with self._lock:
            return self.builder.report()
