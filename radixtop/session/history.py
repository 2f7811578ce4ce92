"""Find what happened before where following began: scan that part of each file in the background.

The log pane starts at a file's last lines (probes/backlog.py, `backlog_lines`), so that they show at
once; a signature from an hour ago must still appear in the findings. For each file followed from
past its start, the follower hands over a `SkippedLines` (bytes [0, end) of that inode, through a
file descriptor of its own, and how many lines that is). This scans it with the fast scanner
(`probes.logscan.LogScanner`: C-speed matching, context and batch stats looked up only for hits)
on a daemon thread and feeds the hits to the same FindingsBuilder, through the Ingestor, which
holds the hits of the live part of that file until the scan is done (a file's first occurrence is
the first hit the builder is given). Runs on its own Matcher: one Matcher serves one scan at a time.

The scan stops at `end` (hits past it are the follower's and are not fed twice), reading on only
for the lines after a hit just before it. It counts the part's lines on its way, for the live
lines' numbers too (`SkippedLines.claim`: the counter thread then does not read them again),
unless the counter began first. A file truncated while it is scanned gives what was read.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from radixtop.session.ingest import Ingestor, IngestResult, finding_file


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
    counting: bool = False,
) -> IngestResult:
    """Scan one SkippedLines into the ingestor's builder; returns what release() reports.
    `counting`: the caller claimed the part's line count for this scan. Closes the part's file
    descriptor."""
    from radixtop.diagnosis.matcher import Matcher
    from radixtop.probes.logscan import LogScanner

    file = finding_file(part.source, part.generation)
    note = None
    lines = 0
    try:
        if not counting:
            lines = part.lines  # waits for the follower's line count (it runs beside this)
        scanner = LogScanner(Matcher(signatures), context=context, after=after)

        def on_hit(hit: Any) -> None:
            if stopping.is_set():
                raise _Stopped
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

        summary = scanner.scan(_path_of(part.fd, part.source), on_hit, stop_at=part.end)
        if counting:
            lines = summary.lines
            part.counted(lines)
    except _Stopped:
        pass
    except Exception as exc:  # the live part still works: say what is missing, and why
        note = (
            f"scanning {part.source} before where following began failed ({exc}); "
            "findings from its earlier lines may be missing"
        )
    finally:
        part.close()  # a claimed count the scan did not finish is counted now, on a thread
    if counting and not part.wait(0) and not stopping.is_set():
        part.wait()
        lines = part.lines
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
    result goes to `deliver`, called on that thread. Each part's line count is claimed here, before
    the thread starts: the scan counts them unless the counter thread began first."""
    counting = [part.claim() for part in parts]

    def run() -> None:
        for part, claimed in zip(parts, counting, strict=True):
            if stopping.is_set():
                part.close()
                continue
            deliver(scan_skipped(part, ingestor, signatures, context=context, after=after, stopping=stopping,
                                 counting=claimed))

    thread = threading.Thread(target=run, name="radixtop-history-scan", daemon=True)
    thread.start()
    return thread
