"""What log files gained from a moment on: whole lines, and the scheduler's pressure in them.

``AppendedLines.start()`` remembers where each file ends; ``read()`` gives what was appended since
(whole lines only; a partial last line waits for its newline). A file that does not exist yet is
read from its first byte once it appears (a control's log); a file that shrank was truncated and is
read from its start. Rotation is not followed: a window lasts one replay.

``BatchTally`` keeps what a replay made the scheduler say about pressure: the peak token usage of
its batch lines (SGLang logs one per prefill and every 40th decode step, so the lines hold every
value its ``sglang:token_usage`` gauge takes) and the requests it retracted.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

__all__ = ["AppendedLines", "BatchTally"]

READ_LIMIT = 8 << 20  # per read and file

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


class AppendedLines:
    """Not thread-safe: one reader at a time."""

    def __init__(self, paths: Sequence[str], *, count_lines: bool = False) -> None:
        self.paths = list(dict.fromkeys(paths))
        self._count = count_lines  # line numbers from the file's start (evidence cites them)
        self._offsets: dict[str, int] = {}
        self._lines: dict[str, int] = {}
        self._partial: dict[str, bytes] = {}

    def start(self) -> None:
        for path in self.paths:
            try:
                size = os.stat(path).st_size
            except OSError:
                size = 0
            self._offsets[path] = size
            self._lines[path] = _count_lines(path, size) if size and self._count else 0
            self._partial[path] = b""

    def read(self) -> list[tuple[str, int, str]]:
        """``(path, line number, text)`` of each whole line appended since the last read."""
        out: list[tuple[str, int, str]] = []
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
                out.append((path, lineno, raw.decode("utf-8", "replace")))
            self._lines[path] = lineno
        return out


class BatchTally:
    def __init__(self) -> None:
        self.peak_token_usage: float | None = None
        self.usage_lines = 0  # lines that gave a token usage
        self.retracted = 0

    def add(self, text: str) -> None:
        if "token usage" in text:
            m = _TOKEN_USAGE.search(text)
            if m is not None:
                usage = float(m.group(1))
                self.usage_lines += 1
                self.peak_token_usage = usage if self.peak_token_usage is None else max(self.peak_token_usage, usage)
        elif "#retracted_reqs" in text:
            m = _RETRACTED.search(text)
            if m is not None and not _OTHER_TP_RANK.match(text):
                self.retracted += int(m.group(1))
