"""The evidence kept around a finding: one policy for every path that finds one.

A finding is made on three paths: the live log pane (session/ingest.py's Ingestor, over the lines it
keeps), the scan of whole files (probes/logscan.py, over byte windows of a file) and the builder's
own line-by-line feed (diagnosis/findings.py, used by the bundle's log window). Each reaches back
through its own storage, but how far, and what it keeps, is decided here, so the same finding has
the same opener, batch stats and evidence lines from every path.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable
from typing import TYPE_CHECKING

from radixtop.diagnosis.logline import opens_record

if TYPE_CHECKING:
    from radixtop.diagnosis.logline import BatchStats

__all__ = [
    "BATCH_LOOKBACK",
    "CONTEXT_AFTER",
    "CONTEXT_BEFORE",
    "EVIDENCE_LINE",
    "OPENER_LOOKBACK",
    "batch_stats_before",
    "evidence_text",
    "find_opener",
]

CONTEXT_BEFORE = 100  # lines kept before a first occurrence (the seed's checklist: 100 or more)
CONTEXT_AFTER = 50  # lines kept after it
OPENER_LOOKBACK = 400  # lines looked back for the line that opened a traceback's record
BATCH_LOOKBACK = 4096  # lines looked back for each rank's last batch stats before the first failure
EVIDENCE_LINE = 64 * 1024  # characters kept of an evidence line: the follower's default max_line


def find_opener(lines_newest_first: Iterable[str]) -> tuple[int, str] | None:
    """The line that opened the record a continuation line (a traceback's body) belongs to: the
    nearest earlier line with a time prefix, within OPENER_LOOKBACK lines; (how many lines back,
    counting from 1, the line)."""
    for looked, line in enumerate(lines_newest_first):
        if looked >= OPENER_LOOKBACK:
            return None
        if opens_record(line):
            return looked + 1, line
    return None


def _decode(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace")
    return text.removesuffix("\r")


def evidence_text(buf: bytes | bytearray, start: int = 0, end: int | None = None) -> str:
    """buf[start:end] as an evidence line: decoded, and cut to EVIDENCE_LINE characters with a
    marker giving the line's whole length when longer (at most 4 bytes a character are copied)."""
    end = len(buf) if end is None else end
    nbytes = end - start
    if nbytes <= EVIDENCE_LINE:
        return _decode(bytes(buf[start:end]))
    whole = nbytes <= 4 * EVIDENCE_LINE
    head = bytes(buf[start : start + 4 * EVIDENCE_LINE])
    text = codecs.getincrementaldecoder("utf-8")("replace").decode(head, final=whole).removesuffix("\r")
    if whole and len(text) <= EVIDENCE_LINE:
        return text
    return f"{text[:EVIDENCE_LINE]} …[line truncated: {nbytes} bytes]"


def _rank_key(line: bytes) -> bytes:
    # "[2026-12-02 14:00:00.123 DP0 TP3] ..." or "[14:00:00 DP0 TP3] ..." -> b"DP0 TP3": cheap, to
    # parse one line per rank (the date and time start with digits, rank words with letters).
    if not line.startswith(b"["):
        return b""
    close = line.find(b"]")
    parts = line[1:close].split(b" ")
    return b" ".join(p for p in parts if p[:1].isalpha())


def batch_stats_before(window: bytes) -> dict[str, BatchStats]:
    """The last batch-stats line per rank in `window` (whole lines; the first may be cut)."""
    from radixtop.diagnosis.logline import parse_line

    found: dict[str, BatchStats] = {}
    seen: set[bytes] = set()
    for line in reversed(window.split(b"\n")):
        if b" batch" not in line:
            continue
        key = _rank_key(line)
        if key in seen:
            continue
        parsed = parse_line(evidence_text(line))
        if parsed.batch is None:
            continue
        seen.add(key)
        found.setdefault(parsed.rank or "", parsed.batch)
    return found
