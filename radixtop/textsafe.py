"""One rule for text from outside (log lines, file and process names, a server's answers) on its
way to a terminal: every control character (C0, DEL, C1) and every bidirectional override or
isolate becomes U+FFFD, one for one, so no escape sequence, title change, clipboard write or
reordered text reaches the screen, and offsets into the text still point at the same characters.
A tab becomes one space. Standard library only: the instrument and headless commands use it too.
"""

from __future__ import annotations

import re
from typing import Protocol, TypeVar

__all__ = ["ANSI_ESCAPE", "printable", "printable_escaped", "printable_line", "printable_text", "strip_ansi"]

# Terminal escape sequences: CSI (ESC [ ... final), OSC (ESC ] ... BEL or ESC \), charset
# selections like ESC ( B and other nF escapes, other two-byte (Fe) escapes, and 8-bit CSI. No
# alternative can match a newline, so it is safe on a whole block of lines at once.
ANSI_ESCAPE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI
    r"|\x1b\][^\x07\x1b\n]*(?:\x07|\x1b\\)"  # OSC
    r"|\x1b[ -/]+[0-~]"  # charset selection and other nF escapes
    r"|\x1b[@-Z\\-_]"  # other two-byte (Fe) escapes
    r"|\x9b[0-?]*[ -/]*[@-~]"  # 8-bit CSI
)

_BIDI = (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)
_TABLE = str.maketrans({**{i: "\ufffd" for i in (*range(32), *range(0x7F, 0xA0), *_BIDI)}, 9: " "})
_BLOCK_TABLE: dict[int, str | int] = {**_TABLE, 10: 10}


def printable(text: str, *, block: bool = False) -> str:
    """`text` safe to show; `block`: a block of lines whose newlines are kept."""
    # Every character the tables replace is one str.isprintable() rejects: the usual text, all
    # printable, skips the per-character walk (a block's newlines taken out first, at C speed).
    if (text.replace("\n", "") if block else text).isprintable():
        return text
    return text.translate(_BLOCK_TABLE if block else _TABLE)


def strip_ansi(text: str) -> str:
    """`text` without its terminal escape sequences (a server's coloured warnings, a title
    change): what they meant is gone, not shown as U+FFFD and stray brackets; `printable` still
    guards whatever is left."""
    if "\x1b" not in text and "\x9b" not in text:
        return text
    return ANSI_ESCAPE.sub("", text)


def printable_line(text: str, limit: int = 200) -> str:
    """`text` (a server's error page, an answer) as one printable line: each run of whitespace,
    newlines included, becomes one space; cut to `limit` characters, ending in "…" when cut."""
    line = printable(" ".join(text.split()))
    return line if len(line) <= limit else line[: limit - 1] + "…"


def printable_escaped(text: str) -> str:
    """`text` (a decoded prompt) on one line that still shows its line breaks: a newline is the
    two characters \\n, a carriage return \\r; every other control character is as `printable`
    makes it. A backslash stays as it is."""
    if text.isprintable():
        return text
    return printable(text.replace("\r", "\\r").replace("\n", "\\n"))


class _Plain(Protocol):
    plain: str


T = TypeVar("T", bound=_Plain)


def printable_text(text: T) -> T:
    """A styled text (Rich's Text) made printable in place, newlines kept; its spans still fit,
    the rule being one for one."""
    text.plain = printable(text.plain, block=True)
    return text
