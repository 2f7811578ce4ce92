"""Find what happened before where following began: scan that part of each file in the background.

The log pane starts at a file's last lines (probes/backlog.py, `backlog_lines`), so that they show at
once; a signature from an hour ago must still appear in the findings. For each file followed from
past its start, the follower hands over a `SkippedLines` (bytes [0, end) of that inode, through a
file descriptor of its own, and how many lines that is). This scans it with the fast scanner
(`probes.logscan.LogScanner`: C-speed matching, context and batch stats looked up only for hits)
on a daemon thread and feeds the hits to the same FindingsBuilder, through the Ingestor, which
holds the hits of the live part of that file until the scan is done (a file's first occurrence is
the first hit the builder is given). Runs on its own Matcher: one Matcher serves one scan at a time.

The scanner reads to the end of the file as it is then; hits past `end` are the follower's and are
not fed twice (the scan stops at the first one). A file truncated while it is scanned gives what
was read.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from radixtop.session.ingest import Ingestor, IngestResult, finding_file


class _PastTheStart(Exception):
    """A hit at or after where following began: the follower delivers those lines."""


class _Stopped(Exception):
    """radixtop is quitting."""


def _path_of(fd: int, fallback: str) -> str:
    # The inode the follower opened, even if the path was rotated or deleted since (Linux).
    proc = f"/proc/self/fd/{fd}"
    return proc if os.path.exists(proc) else fallback


def scan_skipped(
    part: Any,
    ingestor: Ingestor,
    signatures: Any,
    *,
    context: int,
    after: int,
    stopping: threading.Event,
) -> IngestResult:
    """Scan one SkippedLines into the ingestor's builder; returns what release() reports.
    Closes the part's file descriptor."""
    from radixtop.diagnosis.matcher import Matcher
    from radixtop.probes.logscan import LogScanner

    file = finding_file(part.source, part.generation)
    note = None
    lines = 0
    try:
        lines = part.lines  # waits for the follower's line count (it runs beside this)
        scanner = LogScanner(Matcher(signatures), context=context, after=after)

        def on_hit(hit: Any) -> None:
            if stopping.is_set():
                raise _Stopped
            if hit.line > lines:
                raise _PastTheStart
            ingestor.add_history_hit(
                file,
                hit.line,
                hit.text,
                hit.signature_index,
                hit.context_before,
                hit.batch_before,
                context_after=hit.context_after,
                opener=hit.opener,
            )

        try:
            scanner.scan(_path_of(part.fd, part.source), on_hit)
        except _PastTheStart:
            pass
    except _Stopped:
        pass
    except Exception as exc:  # the live part still works: say what is missing, and why
        note = (
            f"scanning {part.source} before where following began failed ({exc}); "
            "findings from its earlier lines may be missing"
        )
    finally:
        part.close()
    return ingestor.release(file, lines, note)


def start_history_scan(
    parts: list[Any],
    ingestor: Ingestor,
    signatures: Any,
    *,
    context: int,
    after: int,
    stopping: threading.Event,
    deliver: Callable[[IngestResult], None],
) -> threading.Thread:
    """Scan the parts one after another on a daemon thread (quitting never waits for it); each
    result goes to `deliver`, called on that thread."""

    def run() -> None:
        for part in parts:
            if stopping.is_set():
                part.close()
                continue
            deliver(scan_skipped(part, ingestor, signatures, context=context, after=after, stopping=stopping))

    thread = threading.Thread(target=run, name="radixtop-history-scan", daemon=True)
    thread.start()
    return thread
