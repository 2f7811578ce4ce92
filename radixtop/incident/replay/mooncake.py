"""Mooncake traces: the JSON Lines workload format of SGLang's, vLLM's and AIPerf's benchmarks.

One JSON object a line, one request each, as Mooncake's published traces (FAST'25)::

    {"timestamp": 0, "input_length": 6755, "output_length": 500, "hash_ids": [0, 1, 2, ..., 13]}
    {"timestamp": 3052, "input_length": 2287, "output_length": 316, "hash_ids": [0, 42, 43, 44, 45]}

* ``timestamp``: when the request arrives, in milliseconds;
* ``input_length`` / ``output_length``: prompt tokens, tokens to generate;
* ``hash_ids``: one id per block of ``block_size`` prompt tokens, the last block possibly partial
  (``ceil(input_length / block_size)`` ids). Two requests share their first k blocks exactly when
  their first k ids are equal. Mooncake's traces use 512-token blocks, as AIPerf does by default
  (``--isl-block-size``); vLLM's ``timed_trace`` reads the block size from
  ``--timed-trace-chunk-hash-size``. A file says nothing about it: the reader must be told.

Read (:func:`read_mooncake`), a file becomes a radixtop trace whose synthesized prompts share
exactly the whole blocks the ids say: each request names, as ``prefix_of``, the earlier request
that reached the deepest block it shares, with ``prefix_len`` that many blocks' tokens (cut to
both prompts). Written (:func:`mooncake_records`), each call of a trace (one line per copy) gets
equal ids for the whole blocks its prompt shares with earlier ones, as the trace's synthesis
shares them (a group's base, a ``prefix_of`` chain, recorded token ids by their content), and
fresh ids after; a partial last block always gets a fresh id. Requests of different cache
namespaces (``extra_key``) never share an id, as they never share cached pages.

A Mooncake file holds no prompts and no cache namespaces; ``n``, ``ignore_eos`` and ``in_flight``
have no field either. Errors are one line naming the file and the line.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import stat
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from radixtop.incident.replay.trace import Trace, TraceError, TraceRequest

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_LINE_BYTES",
    "MAX_PROMPT_TOKENS",
    "MAX_REQUESTS",
    "MOONCAKE_BLOCK_SIZE",
    "dump_mooncake",
    "is_mooncake",
    "mooncake_records",
    "parse_mooncake",
    "read_mooncake",
]

MOONCAKE_BLOCK_SIZE = 512  # tokens per hash id in Mooncake's traces (and AIPerf's default)
MAX_FILE_BYTES = 64 << 20  # Mooncake's largest published trace is ~30 MB
MAX_LINE_BYTES = 1 << 20
MAX_REQUESTS = 100_000
MAX_PROMPT_TOKENS = 16 << 20  # all prompts together: a replay or an analysis makes every one of them up (~1 GB)
_REQUIRED = ("timestamp", "input_length", "output_length")
_KNOWN = frozenset({*_REQUIRED, "hash_ids"})


@dataclass(frozen=True)
class _Line:
    number: int  # in the file, from 1
    timestamp: int | float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _open_regular(path: Path) -> BinaryIO:
    """The file open for reading if it is a regular file (never blocks on a FIFO); TraceError else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise TraceError(f"{path}: not a regular file")
    return os.fdopen(fd, "rb")


def _read_bounded(path: Path) -> bytes:
    """The file's bytes, at most MAX_FILE_BYTES of them."""
    with _open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > MAX_FILE_BYTES:
            raise TraceError(f"{path}: {size:,} bytes; a Mooncake trace radixtop reads is at most {MAX_FILE_BYTES:,}")
        data = fh.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise TraceError(f"{path}: more than {MAX_FILE_BYTES:,} bytes; a Mooncake trace radixtop reads is at most that")
    return data


def is_mooncake(path: str | Path) -> bool:
    """A ``.jsonl`` file, or a file whose first non-empty line is a JSON object with ``hash_ids``."""
    path = Path(path)
    if path.suffix == ".jsonl":
        return True
    try:
        with _open_regular(path) as fh:
            head = fh.read(MAX_LINE_BYTES)
    except (TraceError, OSError):
        return False
    first = next((line for line in head.splitlines() if line.strip()), b"")
    if not first.lstrip().startswith(b"{"):
        return False
    try:
        doc = json.loads(first)
    except (ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and "hash_ids" in doc


def _number(where: str, doc: dict[str, Any], key: str, *, low: int, floats: bool = False) -> int | float:
    value = doc[key]
    kinds = (int, float) if floats else (int,)
    finite = not isinstance(value, float) or math.isfinite(value)
    if isinstance(value, bool) or not isinstance(value, kinds) or not finite:
        raise TraceError(f"{where}: {key} must be {'a number' if floats else 'a whole number'}, got {value!r}")
    if value < low:
        raise TraceError(f"{where}: {key} must be >= {low}, got {value!r}")
    return value


def _parse_line(where: str, number: int, raw: bytes, block_size: int) -> tuple[_Line, set[str]]:
    if len(raw) > MAX_LINE_BYTES:
        raise TraceError(f"{where}: {len(raw):,} bytes; a line is at most {MAX_LINE_BYTES:,}")
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise TraceError(f"{where}: nested too deeply") from None
    except ValueError as exc:
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
        raise TraceError(f"{where}: not valid JSON ({msg})") from None
    if not isinstance(doc, dict):
        raise TraceError(f"{where}: a request is a JSON object, got {type(doc).__name__}")
    missing = [key for key in _REQUIRED if key not in doc]
    if missing:
        raise TraceError(f"{where}: {missing[0]} is missing; a request has {', '.join(_REQUIRED)} and hash_ids")
    timestamp = _number(where, doc, "timestamp", low=0, floats=True)
    input_length = int(_number(where, doc, "input_length", low=1))
    output_length = int(_number(where, doc, "output_length", low=0))
    ids = doc.get("hash_ids", [])
    if not isinstance(ids, list) or not all(type(h) is int for h in ids):
        raise TraceError(f"{where}: hash_ids must be a list of whole numbers")
    blocks = -(-input_length // block_size)
    if ids and len(ids) != blocks:
        raise TraceError(f"{where}: {len(ids):,} hash_ids for input_length {input_length:,}, which is {blocks:,} "
                         f"blocks of {block_size} tokens: is the block size {block_size}? "
                         "(radixtop trace convert --block-size N)")
    return _Line(number, timestamp, input_length, output_length, tuple(ids)), set(doc) - _KNOWN


def _lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    for number, raw in enumerate(data.split(b"\n"), 1):
        if raw.strip():
            yield number, raw


def parse_mooncake(data: bytes, source: str, *, block_size: int = MOONCAKE_BLOCK_SIZE,
                   name: str = "mooncake") -> tuple[Trace, str]:
    """The trace of a Mooncake file's bytes, and a one-line description of it."""
    if block_size < 1:
        raise TraceError(f"block size must be >= 1, got {block_size}")
    rows: list[_Line] = []
    ignored: set[str] = set()
    tokens = 0
    for number, raw in _lines(data):
        where = f"{source}: line {number}"
        if len(rows) == MAX_REQUESTS:
            raise TraceError(f"{where}: more than {MAX_REQUESTS:,} requests; take a part of the trace (head -n N)")
        row, extra = _parse_line(where, number, raw, block_size)
        tokens += row.input_length
        if tokens > MAX_PROMPT_TOKENS:
            raise TraceError(f"{where}: the prompts so far add up to more than {MAX_PROMPT_TOKENS:,} tokens; "
                             "take a part of the trace (head -n N)")
        rows.append(row)
        ignored |= extra
    if not rows:
        raise TraceError(f"{source}: no requests (a Mooncake trace is one JSON object a line)")
    trace = _as_trace(rows, block_size, name, source)
    start = min(r.timestamp for r in rows)
    shared = sum(1 for r in trace.requests if r.prefix_of is not None)
    notes = [f"{len(rows):,} requests, block size {block_size}, {shared:,} share a prefix with an earlier one"]
    if start:
        notes.append(f"offsets count from its first timestamp, {start:,} ms")
    if ignored:
        notes.append(f"ignored keys: {', '.join(sorted(ignored))}")
    return trace, f"{source} (a Mooncake trace: {'; '.join(notes)})"


def _as_trace(rows: list[_Line], block_size: int, name: str, source: str) -> Trace:
    """Requests in arrival order; each names the earlier request that first reached the deepest
    block it shares (a prefix tree of the ids), and shares that many blocks' tokens with it."""
    order = sorted(rows, key=lambda r: (r.timestamp, r.number))
    start = order[0].timestamp
    children: dict[tuple[int, int], int] = {}  # (node, hash id) -> node; node 0 is the root
    owner: list[_Line | None] = [None]  # node -> the first request through it
    made: dict[int, TraceRequest] = {}  # line number -> its request
    requests = []
    for row in order:
        node, depth, parent = 0, 0, None
        for h in row.hash_ids:
            nxt = children.get((node, h))
            if nxt is None:
                break
            node, depth, parent = nxt, depth + 1, owner[nxt]
        for h in row.hash_ids[depth:]:
            children[node, h] = node = len(owner)
            owner.append(row)
        rid = f"line{row.number}"
        if parent is not None:
            sharer = made[parent.number]
            prefix = min(depth * block_size, parent.input_length, row.input_length)
            req = TraceRequest(rid, row.timestamp - start, row.input_length, prefix, sharer.group, row.output_length,
                               prefix_of=sharer.id)
        else:
            req = TraceRequest(rid, row.timestamp - start, row.input_length, 0, rid, row.output_length)
        made[row.number] = req
        requests.append(req)
    return Trace(name=name, page_size_hint=block_size, requests=tuple(requests), source=f"mooncake:{source}",
                 prefix_unit="tokens")


def read_mooncake(path: str | Path, block_size: int = MOONCAKE_BLOCK_SIZE) -> tuple[Trace, str]:
    """A Mooncake JSONL file as a trace named after it, and a one-line description."""
    path = Path(path)
    name = path.name.split(".")[0] or "mooncake"
    return parse_mooncake(_read_bounded(path), str(path), block_size=block_size, name=name)


# -- writing ------------------------------------------------------------------------------------


class _Blocks:
    """Ids of whole blocks, in one counter: a group's shared base by position, recorded token ids
    by their content (chained, so a block's id names the whole prefix up to it), a text prompt's
    per request (its copies are one text), anything else fresh."""

    def __init__(self, block_size: int) -> None:
        self.size = block_size
        self.fresh = itertools.count()
        self.groups: dict[str, list[int]] = {}
        self.texts: dict[str, list[int]] = {}
        self.content: dict[tuple[int, bytes], int] = {}

    def new(self, count: int) -> list[int]:
        return [next(self.fresh) for _ in range(count)]

    def of_tokens(self, ids: tuple[int, ...], whole: int) -> list[int]:
        out, prev = [], -1
        for j in range(whole):
            block = array("Q", ids[j * self.size : (j + 1) * self.size]).tobytes()
            digest = hashlib.blake2b(block, digest_size=16).digest()
            found = self.content.get((prev, digest))
            if found is None:
                found = self.content[prev, digest] = next(self.fresh)
            out.append(prev := found)
        return out

    def lazy(self, table: dict[str, list[int]], key: str, count: int) -> list[int]:
        base = table.setdefault(key, [])
        base.extend(self.new(count - len(base)))
        return base[:count]


def mooncake_records(trace: Trace, block_size: int) -> list[dict[str, Any]]:
    """One Mooncake request per call of ``trace`` (per copy), in send order, with hash ids numbered
    from 0 in order of first appearance."""
    if block_size < 1:
        raise TraceError(f"block size must be >= 1, got {block_size}")
    blocks = _Blocks(block_size)
    firsts: dict[str, list[int]] = {}  # the first copy's block ids of every request
    lengths: dict[str, int] = {}  # the tokens of its prompt a prefix_of can share (none of a text)
    calls: list[tuple[float, TraceRequest, int, list[int]]] = []
    for req in trace.requests:
        length = len(req.input_ids) if req.input_ids is not None else req.prompt_len
        whole, partial = divmod(length, block_size)
        recorded = blocks.of_tokens(req.input_ids, whole) if req.input_ids is not None else None
        for copy in range(req.n):
            if recorded is not None:
                ids = list(recorded)
            elif req.text is not None:
                ids = blocks.lazy(blocks.texts, req.id, whole)
            elif req.prefix_len > 0 and req.prefix_of is not None:
                shared = min(req.prefix_len, lengths[req.prefix_of])
                ids = firsts[req.prefix_of][: shared // block_size]
            elif req.prefix_len > 0:
                ids = blocks.lazy(blocks.groups, req.group, req.prefix_len // block_size)
            else:
                ids = []
            ids += blocks.new(whole - len(ids) + (1 if partial else 0))
            if copy == 0:
                firsts[req.id] = ids
                lengths[req.id] = 0 if req.text is not None and req.input_ids is None else length
            calls.append((req.offset_ms, req, length, ids))
    calls.sort(key=lambda c: c[0])  # stable: trace order, then copies, within one instant
    numbering: dict[tuple[str | None, int], int] = {}
    return [
        {"timestamp": round(offset), "input_length": length, "output_length": req.max_tokens,
         "hash_ids": [numbering.setdefault((req.extra_key, i), len(numbering)) for i in ids]}
        for offset, req, length, ids in calls
    ]


def dump_mooncake(trace: Trace, block_size: int) -> bytes:
    """The JSONL bytes of :func:`mooncake_records`."""
    return "".join(json.dumps(rec) + "\n" for rec in mooncake_records(trace, block_size)).encode()
