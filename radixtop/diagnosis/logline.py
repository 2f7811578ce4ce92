"""Parse one log line of SGLang (and, where cheap, vLLM and Python logging) into time, rank, level,
message and scheduler batch statistics.

SGLang writes ``[%Y-%m-%d %H:%M:%S{.mmm}{ DP0}{ PP0}{ TP3}{ EP2}] message`` (the milliseconds only
with SGLANG_LOG_MS, each rank part only when that parallel size is > 1). Its default format has no
level name, so ``level`` is None for most SGLang lines; uvicorn's lines (``INFO:     ...``) and
warnings written as ``WARNING: ...`` carry one in the message.

Also understood:
- vLLM: ``INFO 12-02 14:00:00 [file.py:123] msg``, optionally behind a process tag such as
  ``(VllmWorker rank=1 pid=42)`` or ``(Worker_DP0_TP1 pid=42)`` (its year is not written: the
  current year is assumed).
- Python logging: ``2026-12-02 14:00:00,123 - name - WARNING - msg``.
- A logging config that writes the level, a number and SGLang's rank prefix in the file's bracket:
  ``ERROR 499 [ TP4 scheduler.py:2982] msg`` (rank ``TP4``; no time).
- SGLang's prefix without a date (``[14:00:00 TP0]``) or with ranks only (``[TP5 EP5]``), as
  pasted excerpts and some launchers write it: a time without a date has no epoch.
- PyTorch's C++ (glog) prefix ``[E323 21:33:26.170490902 ProcessGroupNCCL.cpp:1896]`` and its
  process-group tag ``[PG ID 2 PG GUID 3 Rank 2]`` or ``[Rank 2]``: rank ``rank2``. A line that no
  prefix gives a rank takes it from that tag further in, as in a C++ exception's
  ``  what():  [PG ID 2 PG GUID 3 Rank 1] Process group watchdog thread terminated ...``.
- In front of any of the above, in this order: a Kubernetes timestamp (``kubectl logs
  --timestamps``) or pod tag (``--prefix``), a console box border (``│``, ``|``; a trailing one is
  dropped too), a Ray tag (``(SGLangEngine pid=23902)``, ``(RayWorkerWrapper pid=7, ip=10.0.0.2)``,
  ``(pid=7)``), torchrun's ``[rank3]:`` or ``[default3]:``. The rank comes from the innermost
  prefix that names one.

A line opens a record when it carries a time, an SGLang rank prefix or a logging config's level and
number prefix; the lines after it that do not (a traceback's body, the rest of a line the terminal
wrapped) take its time and rank. A line left without a rank that way (no prefix, and a record that
names none) may take one from the lines after it: ``rank_ahead`` says which.

``parse_line`` runs on every live line: one compiled regular expression for the prefix, and the
batch fields only when the message starts with ``Prefill batch`` / ``Decode batch``; a rankless
line is searched for a process-group tag only when it holds ``Rank ``. Trailing carriage returns
and newlines are dropped. It never raises, whatever the input.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from typing import Literal, NamedTuple

from radixtop.textsafe import strip_ansi

__all__ = [
    "BatchStats",
    "access_key",
    "LogLine",
    "parse_line",
    "parse_batch",
    "is_continuation",
    "opens_record",
    "RANK_LOOKAHEAD",
    "rank_ahead",
    "rank_handed_back",
    "strip_ansi",
]


# NamedTuples, not dataclasses: one is built per parsed line (a tuple is several times cheaper),
# and `radixtop scan` starts without importing dataclasses (and inspect).
BatchKind = Literal["prefill", "decode"]


class BatchStats(NamedTuple):
    kind: BatchKind
    token_usage: float | None = None
    running_req: int | None = None
    queue_req: int | None = None
    cached_token: int | None = None
    new_token: int | None = None
    new_seq: int | None = None
    num_token: int | None = None
    gen_throughput: float | None = None


class LogLine(NamedTuple):
    time: str | None  # as written, e.g. "2026-12-02 14:00:00.123"
    epoch: float | None  # seconds since the epoch (local time), for ordering across files
    rank: str | None  # e.g. "TP3", "DP0 TP3"; None when the line has no rank
    level: str | None  # "INFO" | "WARNING" | "ERROR" | "CRITICAL" | "DEBUG"
    message: str
    batch: BatchStats | None




# SGLang: "[2026-12-02 14:00:00.123 DP0 TP3] ". Rank parts are "<LETTERS/_><digits>" words; any
# other words inside the brackets (" encode_server") are tolerated and ignored.
_SGLANG = re.compile(
    r"\[(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?:[.,](\d{1,6}))?"
    r"((?: [A-Z][A-Z_]*\d+)*)(?: [^\]\[]{0,64})?\] ?"
)
# Python logging's default-ish "2026-12-02 14:00:00,123 - name - LEVEL - msg" (also " LEVEL msg").
_PYLOG = re.compile(
    r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?:[.,](\d{1,6}))?"
    r"(?: - [^ ]{1,80} - (DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL) - | ?)"
)
# vLLM: "INFO 12-02 14:00:00 [file.py:123] msg" (newer releases add ".mmm" to the time).
_VLLM = re.compile(
    r"(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d:\d\d:\d\d)(?:\.(\d{1,6}))?"
    r"(?: \[[^\]]{0,120}\])? ?"
)
# A logging config with the level, a number and the ranks in front of the file and line: "ERROR 499
# [ TP4 scheduler.py:2982] " (SGLang's rank prefix keeps its leading space: "[ scheduler.py:1]" at size 1).
_LEVELED = re.compile(
    r"(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) \d{1,9} \[ ?([A-Z][A-Z_]*\d+(?: [A-Z][A-Z_]*\d+)*)?"
    r"(?: ?[^\]\[\s]{1,200}:\d+)?\] ?"
)
# SGLang's prefix without the date, or with ranks only: "[14:00:00.123 TP0] ", "[TP5 EP5] ".
_SGLANG_CLOCK = re.compile(r"\[(\d\d:\d\d:\d\d)(?:[.,](\d{1,6}))?((?: [A-Z][A-Z_]*\d+)*)\] ?")
_SGLANG_RANKS = re.compile(r"\[([A-Z][A-Z_]*\d+(?: [A-Z][A-Z_]*\d+)*)\] ?")
# PyTorch's glog prefix and its process-group tag: "[E323 21:33:26.170490902 ProcessGroupNCCL.cpp:1896] "
# then "[PG ID 2 PG GUID 3(default_pg) Rank 2] " or "[Rank 2] ".
_GLOG = re.compile(r"\[([IWEF])(\d{1,2})(\d\d) (\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(?: [^\]\[]{0,120})?\] ?")
_PG_RANK = re.compile(r"\[(?:PG ID \d+ PG GUID [^\]\[]{0,60} )?Rank (\d+)\] ?")
_GLOG_LEVELS = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}
# Wrappers in front: "2026-12-02T14:00:00.123456789Z " (kubectl --timestamps), "[pod/x/y] "
# (kubectl --prefix), a box border "│ " / "| ".
_WRAPPER = re.compile(
    r"(?:\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?Z |\[pod/[^\]\s]{1,200}\] |[│┃║|] ?)+"
)
_BORDER_END = re.compile(r" *[│┃║|]\s*$")
# A process tag in front: "(VllmWorker rank=1 pid=7) ", "(EngineCore_DP0 pid=3) ", "(SGLangEngine pid=9) ",
# Ray's "(RayWorkerWrapper pid=7, ip=10.0.0.2) " and "(pid=7) ".
_PROC = re.compile(r"\((?:([A-Za-z][\w.\- ]{0,60}?) )?(?:rank=(\d+) )?pid=\d+(?:, ip=[^)\s]{1,64})?\) ?")
_TORCH_RANK = re.compile(r"\[(?:rank|default)(\d+)\]: ?")
_PROC_RANK_PART = re.compile(r"(?:^|_)((?:DP|PP|TP|EP|CP)\d+)")
_LEVEL_WORD = re.compile(r"\[?(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\]?(?::|\s|$)")
_LEVEL_NAMES = {"WARN": "WARNING", "FATAL": "CRITICAL"}

_YEAR = time.localtime().tm_year  # vLLM does not write the year
_EPOCH_CACHE: dict[str, float | None] = {}


def _epoch(stamp: str) -> float | None:
    """Seconds since the epoch for "YYYY-MM-DD HH:MM:SS" (local time), cached: lines of one second share it."""
    value = _EPOCH_CACHE.get(stamp, -1.0)
    if value != -1.0:
        return value
    try:
        fields = (
            int(stamp[0:4]),
            int(stamp[5:7]),
            int(stamp[8:10]),
            int(stamp[11:13]),
            int(stamp[14:16]),
            int(stamp[17:19]),
        )
        year, month, day, hour, minute, second = fields
        if 1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second <= 60:
            value = time.mktime((*fields, 0, 0, -1))
        else:  # mktime would quietly roll "13-45 99:99" into some other date
            value = None
    except (ValueError, OverflowError):
        value = None
    if len(_EPOCH_CACHE) > 4096:  # bounded: a long log has a new second every line at most
        _EPOCH_CACHE.clear()
    _EPOCH_CACHE[stamp] = value
    return value


def _with_fraction(epoch: float | None, fraction: str | None) -> float | None:
    if epoch is None or not fraction:
        return epoch
    scale: int = 10 ** len(fraction)  # int ** int is typed Any: it is a float for a negative power
    return epoch + int(fraction) / scale


def _level_of(message: str) -> str | None:
    if not message or message[0] not in "DIWECF[":
        return None
    m = _LEVEL_WORD.match(message)
    if m is None:
        return None
    word = m.group(1)
    return _LEVEL_NAMES.get(word, word)


def _clean(text: str) -> str:
    return strip_ansi(text).rstrip("\r\n")


def _rank_from_proc(tag: str | None, rank_number: str | None) -> str | None:
    if rank_number is not None:
        return f"rank{rank_number}"
    parts = _PROC_RANK_PART.findall(tag or "")
    return " ".join(parts) if parts else None


def _unwrap(line: str) -> tuple[str, int, str | None]:
    """The line without a trailing box border, where its own text starts past the wrappers in
    front (Kubernetes, box border, Ray tag, torchrun rank), and the rank those name."""
    rank: str | None = None
    pos = 0
    head = line[:1]
    if head.isdigit() or head in "[│┃║|":
        m = _WRAPPER.match(line)
        if m is not None:
            pos = m.end()
            if line.endswith(("│", "┃", "║", "|", " ")):
                line = _BORDER_END.sub("", line)
    if line.startswith("(", pos):
        m = _PROC.match(line, pos)
        if m is not None:
            rank = _rank_from_proc(m.group(1), m.group(2))
            pos = m.end()
    if line.startswith("[", pos) and line[pos + 1 : pos + 2] in ("r", "d"):
        m = _TORCH_RANK.match(line, pos)
        if m is not None:
            rank = rank or f"rank{m.group(1)}"
            pos = m.end()
    return line, pos, rank


def parse_line(text: str) -> LogLine:
    """Split one line into time, rank, level, message and batch stats. Never raises."""
    try:
        parsed = _parse(_clean(text))
        if parsed.rank is None and "Rank " in parsed.message:
            # PyTorch's process-group tag inside the line: "  what():  [PG ID 2 PG GUID 3 Rank 1] ..."
            m = _PG_RANK.search(parsed.message)
            if m is not None:
                return parsed._replace(rank=f"rank{m.group(1)}")
        return parsed
    except Exception:  # defensive: a parser on the live path must not take the app down
        return LogLine(None, None, None, None, text if isinstance(text, str) else "", None)


def _parse(line: str) -> LogLine:
    line, pos, rank = _unwrap(line)
    head = line[pos : pos + 1]
    if head == "[":
        m = _SGLANG.match(line, pos)
        if m is not None:
            stamp, frac, ranks = m.group(1), m.group(2), m.group(3)
            message = line[m.end() :]
            written = f"{stamp}.{frac}" if frac else stamp
            if ranks:
                rank = ranks.strip()
            return LogLine(
                written,
                _with_fraction(_epoch(stamp), frac),
                rank,
                _level_of(message),
                message,
                parse_batch(message),
            )
        found = _parse_bracket(line, pos, rank)
        if found is not None:
            return found
    elif head.isdigit():
        m = _PYLOG.match(line, pos)
        if m is not None:
            stamp, frac, level = m.group(1), m.group(2), m.group(3)
            message = line[m.end() :]
            written = line[pos : pos + 19] + (f",{frac}" if frac else "")
            if level is None:
                level = _level_of(message)
            else:
                level = _LEVEL_NAMES.get(level, level)
            return LogLine(
                written,
                _with_fraction(_epoch(stamp), frac),
                rank,
                level,
                message,
                parse_batch(message),
            )
    elif head in ("D", "I", "W", "E", "C"):
        m = _VLLM.match(line, pos)
        if m is not None:
            level, month, day, clock, frac = m.groups()
            stamp = f"{_YEAR:04d}-{month}-{day} {clock}"
            message = line[m.end() :]
            written = f"{month}-{day} {clock}" + (f".{frac}" if frac else "")
            return LogLine(
                written,
                _with_fraction(_epoch(stamp), frac),
                rank,
                _LEVEL_NAMES.get(level, level),
                message,
                parse_batch(message),
            )
        m = _LEVELED.match(line, pos)
        if m is not None:
            level, ranks = m.group(1), m.group(2)
            message = line[m.end() :]
            return LogLine(
                None, None, ranks or rank, _LEVEL_NAMES.get(level, level), message, parse_batch(message)
            )
    message = line[pos:]
    return LogLine(None, None, rank, _level_of(message), message, None)


def _parse_bracket(line: str, pos: int, rank: str | None) -> LogLine | None:
    """A line whose own text starts with one of the bracketed prefixes other than SGLang's full one:
    the time-only or ranks-only SGLang prefix, or PyTorch's glog prefix (with its Rank tag)."""
    m = _SGLANG_CLOCK.match(line, pos)
    if m is not None:
        clock, frac, ranks = m.groups()
        message = line[m.end() :]
        written = f"{clock}.{frac}" if frac else clock
        return LogLine(written, None, ranks.strip() or rank, _level_of(message), message, parse_batch(message))
    m = _SGLANG_RANKS.match(line, pos)
    if m is not None:
        message = line[m.end() :]
        return LogLine(None, None, m.group(1), _level_of(message), message, parse_batch(message))
    m = _GLOG.match(line, pos)
    if m is not None:
        letter, month, day, clock, frac = m.groups()
        end = m.end()
        tag = _PG_RANK.match(line, end)
        if tag is not None:
            rank = f"rank{tag.group(1)}"
            end = tag.end()
        month = month.zfill(2)  # PyTorch writes March as "323"
        stamp = f"{_YEAR:04d}-{month}-{day} {clock}"
        frac = frac[:6] if frac else None
        written = f"{month}-{day} {clock}" + (f".{frac}" if frac else "")
        return LogLine(written, _with_fraction(_epoch(stamp), frac), rank, _GLOG_LEVELS[letter], line[end:], None)
    m = _PG_RANK.match(line, pos)
    if m is not None:
        return LogLine(None, None, f"rank{m.group(1)}", None, line[m.end() :], None)
    return None


def opens_record(text: str) -> bool:
    """True when the line starts a new log record: it carries a time, an SGLang rank prefix, or a
    logging config's level and number prefix."""
    line = text
    if line.startswith("\x1b"):
        line = strip_ansi(line)
    line, pos, _ = _unwrap(line)
    head = line[pos : pos + 1]
    if head == "[":
        return (
            _SGLANG.match(line, pos) is not None
            or _SGLANG_CLOCK.match(line, pos) is not None
            or _SGLANG_RANKS.match(line, pos) is not None
            or _GLOG.match(line, pos) is not None
        )
    if head.isdigit():
        return _PYLOG.match(line, pos) is not None
    if head in ("D", "I", "W", "E", "C"):
        return _VLLM.match(line, pos) is not None or _LEVELED.match(line, pos) is not None
    return False


def is_continuation(text: str) -> bool:
    """A line that belongs to the record opened before it.

    Any line without a time prefix continues the record before it: the traceback body
    (``Traceback (most recent call last):``, indented ``File "..."`` and code lines, the final
    ``SomeError: msg``, ``During handling of ...``, blank lines between chained tracebacks) and
    the extra lines of a multi-line message (SGLang's "Decode out of memory ..." writes several).
    """
    return not opens_record(text)


RANK_LOOKAHEAD = 5  # lines looked at after a rankless one (a CUDA error's hint lines and a blank)


def rank_handed_back(text: str) -> tuple[bool, str | None]:
    """What one line says of the rank of a rankless line before it: (the look stops here, the rank).

    A line that continues the record and names a rank (torchrun's ``[rank0]:``, a process tag, the
    process-group tag in ``what():``) hands it back, and so does PyTorch's glog line with its rank
    tag: it reports the CUDA or NCCL error whose bare text may come just before it. Any other
    record opener stops the look empty-handed: an SGLang, vLLM or Python logging record belongs to
    the process that wrote it, which need not be the one that wrote the line before (a child's
    ``[... TP0] Scheduler hit an exception`` right after the parent's rankless SIGQUIT line). A
    line that opens nothing and names no rank (a blank, a CUDA error's hint) lets the look go on.
    """
    line = _clean(text)
    rank = parse_line(line).rank
    if not opens_record(line):
        return rank is not None, rank
    if rank is not None:
        line, pos, _ = _unwrap(line)
        if line.startswith("[", pos) and _GLOG.match(line, pos) is not None:
            return True, rank
    return True, None


def rank_ahead(lines_after: Iterable[str]) -> str | None:
    """The rank a line that names none (no prefix, and a record that names none) takes from the
    lines after it, looking at RANK_LOOKAHEAD of them at most (see ``rank_handed_back``)."""
    for looked, text in enumerate(lines_after):
        if looked >= RANK_LOOKAHEAD:
            return None
        stop, rank = rank_handed_back(text)
        if stop:
            return rank
    return None


# ---------------------------------------------------------------------------------------------
# Batch statistics

_INT_FIELDS = {
    "#running-req": "running_req",
    "#queue-req": "queue_req",
    "#cached-token": "cached_token",
    "#new-token": "new_token",
    "#new-seq": "new_seq",
    "#token": "num_token",
}
_FLOAT_FIELDS = {
    "token usage": "token_usage",
    "full token usage": "full_usage",  # hybrid (SWA/SSM) models write this instead of "token usage"
    "gen throughput (token/s)": "gen_throughput",
}
# "key: value" right after the start or a separator, so "token usage" never matches inside
# "swa token usage"; one C-level findall instead of splitting in Python.
_BATCH_FIELD = re.compile(
    r"(?:^|[,.\]] )(#running-req|#queue-req|#cached-token|#new-token|#new-seq|#token|token usage"
    r"|full token usage|gen throughput \(token/s\)): ([^,\s]*)"
)


def _number(text: str, kind: type[int] | type[float]) -> int | float | None:
    try:
        return kind(text)
    except ValueError:
        try:
            return kind(float(text)) if kind is int else None
        except (ValueError, OverflowError):
            return None


def parse_batch(message: str) -> BatchStats | None:
    """Stats of a ``Prefill batch``/``Decode batch`` message (fields by key, any order, any missing)."""
    kind: BatchKind
    if message.startswith("Prefill batch"):
        kind = "prefill"
    elif message.startswith("Decode batch"):
        kind = "decode"
    else:
        return None
    values: dict[str, int | float | None] = {}
    for key, value in _BATCH_FIELD.findall(message, 12):
        field = _INT_FIELDS.get(key)
        if field is not None:
            values[field] = _number(value, int)
        else:
            values[_FLOAT_FIELDS[key]] = _number(value, float)
    full_usage = values.pop("full_usage", None)
    if "token_usage" not in values and full_usage is not None:
        values["token_usage"] = full_usage
    return BatchStats(kind, **values)  # type: ignore[arg-type]


# uvicorn's access format (SGLang's and vLLM's front ends): `... "POST /generate HTTP/1.1" 503 ...`
_ACCESS = re.compile(r'"(GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) (\S+) HTTP/[0-9.]+" (\d{3})')


def access_key(text: str) -> tuple[str, str, str] | None:
    """(method, path without its query, status) of an HTTP access line, else None."""
    if "HTTP/" not in text:  # the usual line: one C-speed scan, no regex
        return None
    m = _ACCESS.search(text)
    if m is None:
        return None
    method, path, status = m.group(1, 2, 3)
    return method, path.split("?", 1)[0] if "?" in path else path, status
