"""Signatures that appear in log files from a moment on: what a replay window made the server say.

``LogWindow.start()`` remembers where each file ends; ``poll()`` reads what was appended since
(whole lines only; a partial last line waits for its newline), feeds it to a FindingsBuilder and
returns the signature ids seen for the first time. A file that does not exist yet is read from
its first byte once it appears (the control's log). Rotation inside a window is not followed: a
window lasts one replay, and the bundle holds the full evidence.

It also keeps what the confirmation run's verdict compares besides signatures: the peak token
usage the scheduler's batch lines reported and the requests retracted, and the newest lines (a
server's own progress while it loads, shown while the run waits for its health).
"""

from __future__ import annotations

import os
import re
import threading
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from radixtop.diagnosis.evidence_policy import CONTEXT_BEFORE

if TYPE_CHECKING:
    from radixtop.diagnosis.catalog import Catalog
    from radixtop.diagnosis.findings import Report
    from radixtop.diagnosis.matcher import Matcher

__all__ = ["LogWindow"]

READ_LIMIT = 8 << 20  # per poll and file
FRESH_LINES = 200  # newest lines kept for whoever shows progress
# The batch lines' "token usage: 0.93", and the same figure in other lines ("(token usage 0.93)").
_TOKEN_USAGE = re.compile(r"token usage:? (\d+(?:\.\d+)?)")
_RETRACTED = re.compile(r"#retracted_reqs: (\d+)")
_OTHER_TP_RANK = re.compile(r"\[[^\]]*\bTP[1-9]\d*\]")  # every TP rank logs a retraction: count TP0's


def _count_lines(path: str, end: int) -> int:
    count = 0
    try:
        with open(path, "rb") as fh:
            left = end
            while left > 0:
                block = fh.read(min(left, 1 << 20))
                if not block:
                    break
                count += block.count(b"\n")
                left -= len(block)
    except OSError:
        return 0
    return count


class LogWindow:
    def __init__(self, paths: Sequence[str], catalog: Catalog, matcher: Matcher | None = None, *,
                 context: int = CONTEXT_BEFORE):
        from radixtop.diagnosis.findings import FindingsBuilder

        self.paths = list(dict.fromkeys(paths))
        self.builder = FindingsBuilder(catalog, matcher=matcher, context=context)
        self._offsets: dict[str, int] = {}
        self._lines: dict[str, int] = {}
        self._partial: dict[str, bytes] = {}
        self._seen: set[str] = set()
        self._lock = threading.Lock()  # poll() may be called from worker threads, one at a time
        self.peak_token_usage: float | None = None
        self.retracted = 0
        self.fresh: deque[str] = deque(maxlen=FRESH_LINES)  # newest lines; a reader may clear it

    def start(self) -> None:
        for path in self.paths:
            try:
                size = os.stat(path).st_size
            except OSError:
                size = 0
            self._offsets[path] = size
            self._lines[path] = _count_lines(path, size) if size else 0
            self._partial[path] = b""

    def poll(self) -> list[str]:
        """New lines of every file into the builder; the ids of signatures not seen before."""
        with self._lock:
            return self._poll()

    def _poll(self) -> list[str]:
        new: list[str] = []
        for path in self.paths:
            offset = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    if size < offset:  # truncated: start over
                        offset, self._partial[path] = 0, b""
                    fh.seek(offset)
                    data = fh.read(READ_LIMIT)
            except OSError:
                continue
            self._offsets[path] = offset + len(data)
            data = self._partial.get(path, b"") + data
            cut = data.rfind(b"\n")
            if cut < 0:
                self._partial[path] = data
                continue
            self._partial[path] = data[cut + 1 :]
            lineno = self._lines.get(path, 0)
            for raw in data[:cut].split(b"\n"):
                lineno += 1
                text = raw.decode("utf-8", "replace")
                self._stats(text)
                for sig_id in self.builder.feed(path, lineno, text):
                    if sig_id not in self._seen:
                        self._seen.add(sig_id)
                        new.append(sig_id)
            self._lines[path] = lineno
        return new

    def _stats(self, text: str) -> None:
        self.fresh.append(text)
        if "token usage" in text:
            m = _TOKEN_USAGE.search(text)
            if m is not None:
                usage = float(m.group(1))
                self.peak_token_usage = usage if self.peak_token_usage is None else max(self.peak_token_usage, usage)
        elif "#retracted_reqs" in text:
            m = _RETRACTED.search(text)
            if m is not None and not _OTHER_TP_RANK.match(text):
                self.retracted += int(m.group(1))

    def report(self) -> Report:
        with self._lock:
            return self.builder.report()
