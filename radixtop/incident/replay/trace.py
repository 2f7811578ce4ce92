"""Workload traces: a versioned JSON format and deterministic prompts built from it.

A trace records the shape of a workload, not its text, in the form SGLang issue #22819's fuzzer
reported (``finding_03330``)::

    {"version": 1, "name": "finding_03330", "page_size_hint": 64,
     "requests": [{"id": "r02", "offset_ms": 45, "prompt_len": 256, "prefix_len": 64,
                   "group": "r02", "max_tokens": 32, "n": 4}, ...]}

* ``offset_ms``: when the request is sent, from the start of the replay;
* ``prompt_len``: prompt tokens; ``max_tokens``: tokens to generate;
* ``group`` / ``prefix_len``: requests of one group share exactly their first ``prefix_len``
  tokens (a shared system prompt); nothing else is shared, and distinct groups never share even a
  first token, so the radix cache can only hit on what the trace says;
* ``prefix_of`` (optional): the id of an earlier request whose first ``prefix_len`` tokens this one
  starts with (its first copy's). It replaces the group's shared base for this request, so sharing
  that is a tree (a system prompt, then each conversation's history) keeps its shape: this request
  shares with another exactly what it shares with ``prefix_of`` up to where their paths part.
  ``radixtop record`` writes it for every prompt that shares;
* ``n``: concurrent copies sent at ``offset_ms``. Each copy is a member of the group like any
  other request: it shares the group's first ``prefix_len`` tokens and differs after them (the
  fuzzer's copies are independent samples of the family, not identical prompts);
* ``page_size_hint``: the page (block) size the prefix lengths were written for; see
  :func:`rescale_prefixes` to replay a trace at another page size.
* ``prefix_unit`` (optional): ``"pages"`` (the default: a hand-written or fuzzer-found trace whose
  prefixes are so many pages, moved page for page to another page size) or ``"tokens"`` (recorded
  traffic, a crash dump, a Mooncake trace: the prefixes are what the prompts shared, never moved).

Optional top-level keys: ``source`` (where the trace came from), ``expect_diverged`` (request ids
a replay is expected to see diverge). Loading errors are one line naming the file and field.
Sizes are held to what a node can build (``MAX_PROMPT_TOKENS``, ``MAX_NEW_TOKENS``, ``MAX_COPIES``,
``MAX_OFFSET_MS`` per request, ``MAX_TRACE_TOKENS`` for all of a replay's prompts: ``check_size``),
since every call's prompt is built before the first goes out.
Prompts are lists of token ids (``input_ids``), so a replay controls prefix lengths exactly; the
ids are drawn from the served model's vocabulary (``radixtop.incident.replay.vocab``), never a special
token: an id the model does not have crashes its server.

Optional request keys, written only by ``radixtop record --keep-prompts`` (prompts may be
sensitive, so a trace holds none by default): ``input_ids`` (the exact token ids the client sent)
or ``text`` (the exact prompt text). A request that has one of them is replayed with it, every copy
alike, instead of synthesized tokens; ``prompt_len`` and ``prefix_len`` are then descriptive only
(for a text prompt, token counts come from the server's answer and the shared prefix is an
estimate, see ``radixtop.incident.replay.record``).

Optional request key ``extra_key``: the request's cache namespace, sent as SGLang's ``extra_key``
(requests with different keys never share cached pages, as with different LoRA adapters).
``ignore_eos``: sent as SGLang's sampling parameter, so the call generates its ``max_tokens``;
``stop``: its stop strings, sent as they were (a list of strings).
``in_flight``: the request was unfinished when the server died (descriptive).
"""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Mapping
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal, NamedTuple

from radixtop.incident.replay.draws import draws_below
from radixtop.incident.replay.vocab import SIM_VOCABULARY, Vocabulary

__all__ = [
    "TRACE_VERSION",
    "PlannedRequest",
    "Trace",
    "TraceError",
    "TraceRequest",
    "builtin_trace",
    "dump_trace",
    "load_trace",
    "parse_trace",
    "plan_requests",
    "rescale_prefixes",
    "save_trace",
    "scale_offsets",
    "check_recorded_ids",
    "check_size",
    "synthesize_input_ids",
]

TRACE_VERSION = 1
MAX_TRACE_BYTES = 1 << 30  # a trace file; recorded prompts make big ones
# What one replay builds stays within memory a node has: every call's prompt is a list of token ids
# (about 36 bytes a token), made before the first call goes out.
MAX_PROMPT_TOKENS = 1 << 21  # one prompt: above the longest context a served model has
MAX_NEW_TOKENS = 1 << 21
MAX_COPIES = 1 << 10  # n: copies sent at once
MAX_OFFSET_MS = 7 * 24 * 3600 * 1000.0  # a week: a recorded incident is hours long
MAX_TRACE_TOKENS = 1 << 25  # prompt tokens over all calls (prompt_len x n): about 1.2 GB of ids


class TraceError(ValueError):
    """A trace that cannot be used; str() is one line naming the file and the field."""


@dataclass(frozen=True)
class TraceRequest:
    id: str
    offset_ms: float
    prompt_len: int
    prefix_len: int
    group: str
    max_tokens: int
    n: int = 1
    input_ids: tuple[int, ...] | None = None  # the recorded prompt (only with --keep-prompts)
    text: str | None = None  # the recorded prompt text (only with --keep-prompts)
    extra_key: str | None = None  # the cache namespace (SGLang's extra_key; a LoRA adapter's name)
    prefix_of: str | None = None  # the earlier request whose first prefix_len tokens this one starts with
    ignore_eos: bool = False  # generate max_tokens whatever comes (SGLang's sampling parameter)
    stop: tuple[str, ...] = ()  # stop strings (SGLang's sampling parameter)
    in_flight: bool = False  # unfinished when the server died (a crash dump says so)


@dataclass(frozen=True)
class Trace:
    name: str
    page_size_hint: int
    requests: tuple[TraceRequest, ...]
    version: int = TRACE_VERSION
    source: str = ""
    expect_diverged: tuple[str, ...] = ()
    prefix_unit: Literal["pages", "tokens"] = "pages"

    def request(self, request_id: str) -> TraceRequest:
        for req in self.requests:
            if req.id == request_id:
                return req
        raise KeyError(request_id)


class PlannedRequest(NamedTuple):
    """One generate call of a replay: when to send it and what. (A named tuple: one is made per
    call of a trace, without a frozen dataclass's setattr per field.)"""

    offset_s: float
    request_id: str
    copy: int
    input_ids: list[int]
    max_tokens: int
    text: str | None = None  # send this text instead of input_ids
    extra_key: str | None = None
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()

    def __repr__(self) -> str:  # the prompt is long, and its text may be sensitive: left out
        return (f"PlannedRequest(offset_s={self.offset_s!r}, request_id={self.request_id!r}, copy={self.copy!r}, "
                f"max_tokens={self.max_tokens!r}, extra_key={self.extra_key!r}, ignore_eos={self.ignore_eos!r}, "
                f"stop={self.stop!r})")


_REQUEST_FIELDS: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "offset_ms": (int, float),
    "prompt_len": (int,),
    "prefix_len": (int,),
    "group": (str,),
    "max_tokens": (int,),
    "n": (int,),
    "input_ids": (list,),
    "text": (str,),
    "extra_key": (str,),
    "prefix_of": (str,),
    "ignore_eos": (bool,),
    "stop": (list,),
    "in_flight": (bool,),
}
_OPTIONAL_REQUEST_FIELDS = frozenset({"n", "input_ids", "text", "extra_key", "prefix_of", "ignore_eos", "in_flight",
                                      "stop"})
_TOP_FIELDS = {"version", "name", "page_size_hint", "requests", "source", "expect_diverged", "prefix_unit"}


def _field(source: str, where: str, obj: Mapping[str, Any], key: str, kinds: tuple[type, ...]) -> Any:
    if key not in obj:
        raise TraceError(f"{source}: {where}{key} is missing")
    value = obj[key]
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):  # True is an int to Python
        names = " or ".join("number" if k is float else k.__name__ for k in kinds)
        raise TraceError(f"{source}: {where}{key} must be {names}, got {value!r}")
    return value


def _prompt_fields(source: str, where: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """The optional recorded prompt: input_ids as a tuple of ints, or text; never both."""
    if "input_ids" in raw and "text" in raw:
        raise TraceError(f"{source}: {where}input_ids and text are both given; keep one")
    out: dict[str, Any] = {}
    if "input_ids" in raw:
        ids = raw["input_ids"]
        if not ids or not all(type(t) is int and 0 <= t for t in ids):
            raise TraceError(f"{source}: {where}input_ids must be a non-empty list of token ids (ints >= 0)")
        out["input_ids"] = tuple(ids)
    if "text" in raw:
        if not raw["text"]:
            raise TraceError(f"{source}: {where}text is empty")
        out["text"] = raw["text"]
    return out


def _parse_request(source: str, i: int, raw: Any, seen: Mapping[str, TraceRequest]) -> TraceRequest:
    """requests[i], every field checked; ``seen``: the requests before it, by id."""
    where = f"requests[{i}]."
    if not isinstance(raw, dict):
        raise TraceError(f"{source}: requests[{i}] must be an object, got {type(raw).__name__}")
    extra = sorted(set(raw) - set(_REQUEST_FIELDS))
    if extra:
        raise TraceError(
            f"{source}: {where}{extra[0]} is not a request field; fields: {', '.join(_REQUEST_FIELDS)}"
        )
    values = {
        key: _field(source, where, raw, key, kinds)
        for key, kinds in _REQUEST_FIELDS.items()
        if key not in _OPTIONAL_REQUEST_FIELDS or key in raw
    }
    values.update(_prompt_fields(source, where, raw))
    if "stop" in values:
        if not all(isinstance(v, str) and v for v in values["stop"]):
            raise TraceError(f"{source}: {where}stop must be a list of non-empty strings")
        values["stop"] = tuple(values["stop"])
    req = TraceRequest(**values)
    if not req.id:
        raise TraceError(f"{source}: {where}id is empty")
    if req.id in seen:
        raise TraceError(f"{source}: {where}id {req.id!r} appears twice; ids must be unique")
    if not 0 <= req.offset_ms <= MAX_OFFSET_MS:  # NaN fails both tests
        raise TraceError(f"{source}: {where}offset_ms must be within 0..{MAX_OFFSET_MS:,.0f} (a week), "
                         f"got {req.offset_ms}")
    if not 1 <= req.prompt_len <= MAX_PROMPT_TOKENS:
        raise TraceError(f"{source}: {where}prompt_len must be within 1..{MAX_PROMPT_TOKENS:,}, got {req.prompt_len}")
    if not 0 <= req.prefix_len <= req.prompt_len:
        raise TraceError(
            f"{source}: {where}prefix_len must be within 0..prompt_len ({req.prompt_len}), got {req.prefix_len}"
        )
    if not req.group:
        raise TraceError(f"{source}: {where}group is empty")
    if not 0 <= req.max_tokens <= MAX_NEW_TOKENS:
        raise TraceError(f"{source}: {where}max_tokens must be within 0..{MAX_NEW_TOKENS:,}, got {req.max_tokens}")
    if not 1 <= req.n <= MAX_COPIES:
        raise TraceError(f"{source}: {where}n must be within 1..{MAX_COPIES:,}, got {req.n}")
    if req.prefix_of is not None:
        _check_prefix_of(source, where, req, seen)
    return req


def parse_trace(data: Any, source: str = "<trace>") -> Trace:
    """Build a Trace from decoded JSON, checking every field."""
    if not isinstance(data, dict):
        raise TraceError(f"{source}: a trace is a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - _TOP_FIELDS)
    if unknown:
        raise TraceError(
            f"{source}: unknown key {unknown[0]!r}; known keys: {', '.join(sorted(_TOP_FIELDS))}"
        )
    version = _field(source, "", data, "version", (int,))
    if version != TRACE_VERSION:
        raise TraceError(f"{source}: version is {version}; this radixtop reads version {TRACE_VERSION}")
    name = _field(source, "", data, "name", (str,))
    hint = _field(source, "", data, "page_size_hint", (int,))
    if hint < 1:
        raise TraceError(f"{source}: page_size_hint must be >= 1, got {hint}")
    raw_requests = _field(source, "", data, "requests", (list,))
    if not raw_requests:
        raise TraceError(f"{source}: requests is empty; a trace needs at least one request")
    requests: list[TraceRequest] = []
    seen: dict[str, TraceRequest] = {}
    for i, raw in enumerate(raw_requests):
        req = _parse_request(source, i, raw, seen)
        seen[req.id] = req
        requests.append(req)
    src = data.get("source", "")
    if not isinstance(src, str):
        raise TraceError(f"{source}: source must be a string, got {src!r}")
    expect = data.get("expect_diverged", [])
    if not isinstance(expect, list) or not all(isinstance(x, str) for x in expect):
        raise TraceError(f"{source}: expect_diverged must be a list of request ids, got {expect!r}")
    for rid in expect:
        if rid not in seen:
            raise TraceError(f"{source}: expect_diverged names {rid!r}, which is not a request id")
    unit = data.get("prefix_unit", "pages")
    if unit not in ("pages", "tokens"):
        raise TraceError(f"{source}: prefix_unit must be \"pages\" or \"tokens\", got {unit!r}")
    trace = Trace(name, hint, tuple(requests), version, src, tuple(expect), unit)
    check_size(trace, source)
    return trace


def check_size(trace: Trace, source: str, fix: str = "split the trace or shorten its prompts") -> None:
    """TraceError when one replay of the trace would build more prompt tokens than MAX_TRACE_TOKENS
    (every trace, however made, is held to it before its calls are built)."""
    total = sum(r.prompt_len * r.n for r in trace.requests)
    if total > MAX_TRACE_TOKENS:
        raise TraceError(f"{source}: its calls hold {total:,} prompt tokens (prompt_len x n), more than the "
                         f"{MAX_TRACE_TOKENS:,} radixtop builds for one replay; {fix}")


def _check_prefix_of(source: str, where: str, req: TraceRequest, seen: Mapping[str, TraceRequest]) -> None:
    parent = seen.get(req.prefix_of or "")
    if parent is None or parent is req:
        raise TraceError(f"{source}: {where}prefix_of names {req.prefix_of!r}, which is not an earlier request's id")
    if not 0 < req.prefix_len <= parent.prompt_len:
        raise TraceError(f"{source}: {where}prefix_len must be within 1..{parent.prompt_len} (the prompt_len of "
                         f"{parent.id!r}, its prefix_of), got {req.prefix_len}")
    if req.offset_ms < parent.offset_ms:
        raise TraceError(f"{source}: {where}offset_ms {req.offset_ms} is before that of {parent.id!r}, its prefix_of")


def load_trace(path: str | Path) -> Trace:
    from radixtop.bounded import load_json

    path = Path(path)
    try:
        with path.open("rb") as fh:  # in chunks: read(n) would take n bytes of memory up front
            chunks: list[bytes] = []
            size = 0
            while size <= MAX_TRACE_BYTES and (chunk := fh.read(1 << 20)):
                chunks.append(chunk)
                size += len(chunk)
            data = b"".join(chunks)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace: {exc.strerror or exc}") from None
    try:  # every level parse_trace reads is checked there: nothing is cut
        doc = load_json(data, str(path), max_bytes=MAX_TRACE_BYTES, cut_depth=None)
    except ValueError as exc:
        raise TraceError(str(exc)) from None
    return parse_trace(doc, str(path))


def dump_trace(trace: Trace) -> dict[str, Any]:
    out: dict[str, Any] = {
        "version": trace.version,
        "name": trace.name,
        "page_size_hint": trace.page_size_hint,
    }
    if trace.source:
        out["source"] = trace.source
    if trace.expect_diverged:
        out["expect_diverged"] = list(trace.expect_diverged)
    if trace.prefix_unit != "pages":
        out["prefix_unit"] = trace.prefix_unit
    out["requests"] = []
    for r in trace.requests:
        item: dict[str, Any] = {
            "id": r.id,
            "offset_ms": r.offset_ms,
            "prompt_len": r.prompt_len,
            "prefix_len": r.prefix_len,
            "group": r.group,
            "max_tokens": r.max_tokens,
            "n": r.n,
        }
        if r.input_ids is not None:
            item["input_ids"] = list(r.input_ids)
        if r.text is not None:
            item["text"] = r.text
        if r.extra_key is not None:
            item["extra_key"] = r.extra_key
        if r.prefix_of is not None:
            item["prefix_of"] = r.prefix_of
        if r.ignore_eos:
            item["ignore_eos"] = True
        if r.stop:
            item["stop"] = list(r.stop)
        if r.in_flight:
            item["in_flight"] = True
        out["requests"].append(item)
    return out


def save_trace(trace: Trace, path: str | Path) -> None:
    """Written 0600, whole or not at all: a trace can hold the users' prompts."""
    from radixtop.rundir import write_file

    write_file(Path(path), (json.dumps(dump_trace(trace), indent=2) + "\n").encode())


def builtin_trace(name: str) -> Trace:
    """A trace shipped with radixtop (``radixtop/incident/replay/traces/<name>.json``)."""
    ref = resources.files("radixtop.incident.replay").joinpath("traces", f"{name}.json")
    if not ref.is_file():
        raise TraceError(f"no built-in trace named {name!r}")
    return parse_trace(json.loads(ref.read_text(encoding="utf-8")), f"builtin:{name}")


def rescale_prefixes(trace: Trace, page_size: int) -> Trace:
    """The same trace with prefix lengths moved from ``page_size_hint`` to ``page_size``.

    A prefix of k pages at the hint becomes k pages at ``page_size`` (64 -> 16 turns a one-page
    prefix of 64 tokens into one of 16); a prefix that is not a whole number of hint pages scales
    proportionally, rounded down. Prompt lengths, offsets and everything else stay as they are.
    """
    if page_size < 1:
        raise TraceError(f"page_size must be >= 1, got {page_size}")
    if trace.prefix_unit == "tokens":
        return trace  # what real prompts shared: another page size does not change it
    hint = trace.page_size_hint
    lengths = {r.id: r.prompt_len for r in trace.requests}

    def moved(r: TraceRequest) -> int:
        room = min(r.prompt_len, lengths[r.prefix_of]) if r.prefix_of is not None else r.prompt_len
        return max(1 if r.prefix_of is not None else 0, min(room, r.prefix_len * page_size // hint))

    requests = tuple(replace(r, prefix_len=moved(r)) for r in trace.requests)
    return replace(trace, page_size_hint=page_size, requests=requests)


def scale_offsets(trace: Trace, factor: float) -> Trace:
    """The same trace played ``factor`` times as fast or slow (0.2 = offsets five times shorter)."""
    if not factor > 0:
        raise TraceError(f"offset scale factor must be > 0, got {factor}")
    return replace(trace, requests=tuple(replace(r, offset_ms=r.offset_ms * factor) for r in trace.requests))


def _seed_key(*parts: object) -> bytes:
    return "\x1f".join(map(str, parts)).encode()


def _seed_int(*parts: object) -> int:
    return int.from_bytes(hashlib.blake2b(_seed_key(*parts), digest_size=8).digest(), "little")


def _band_indices(trace: Trace) -> dict[tuple[str, ...], int]:
    """A distinct index, in trace order, for every token that must be unique in the trace.

    Those are the first token of every sequence start (a group that shares a prefix, or a copy of
    a request that shares nothing) and the first private token after a shared prefix (one per
    copy). Band tokens come from the upper half of the usable ids and every other token from the
    lower half, so a band token can equal neither an ordinary token nor another band token.
    """
    index: dict[tuple[str, ...], int] = {}
    for req in trace.requests:
        for copy in range(req.n):
            if req.prefix_len > 0:
                if req.prefix_of is None:
                    index.setdefault(("group", req.group), len(index))
                index.setdefault(("diverge", req.id, str(copy)), len(index))
            else:
                index.setdefault(("start", req.id, str(copy)), len(index))
    return index


class _Bands:
    """The vocabulary's usable ids cut in two: ordinary tokens below, unique tokens in a band above."""

    def __init__(self, trace: Trace, vocab: Vocabulary, index: dict[tuple[str, ...], int]) -> None:
        self.vocab = vocab
        self.ordinary = vocab.usable // 2
        self.band_size = vocab.usable // 4
        if len(index) > self.band_size:
            raise TraceError(f"trace {trace.name!r} needs {len(index):,} distinct first tokens; a vocabulary of "
                             f"{vocab.size:,} ids has room for {self.band_size:,}")
        self.index = index
        self.trace_name = trace.name
        self._offsets: dict[int, int] = {}
        self._bases: dict[tuple[str, int], list[int]] = {}  # per group: the longest base made so far

    def offset(self, seed: int) -> int:
        """Where the band's numbering starts for ``seed``."""
        if seed not in self._offsets:
            self._offsets[seed] = _seed_int("band", self.trace_name, seed) % self.band_size
        return self._offsets[seed]

    def group_base(self, group: str, seed: int, length: int) -> list[int]:
        """The first ``length`` tokens of ``group``'s shared base: its band token, then ordinary
        tokens drawn under the group's own key. Made once per group (again only when a longer
        one is asked for): a shorter base is the head of a longer one, the draws coming in the
        same order however many are taken."""
        base = self._bases.get((group, seed))
        if base is None or len(base) < length:
            key = _seed_key("group", self.trace_name, group, seed)
            base = [self.band_token(("group", group), self.offset(seed)), *self.ordinary_tokens(key, length - 1)]
            self._bases[group, seed] = base
        return base[:length]  # a copy: the caller adds to it

    def band_token(self, key: tuple[str, ...], offset: int) -> int:
        return self.vocab.nth(self.ordinary + (offset + self.index[key]) % self.band_size)

    def ordinary_tokens(self, key: bytes, count: int) -> list[int]:
        """``count`` ordinary tokens, fixed by ``key``."""
        return self.vocab.nth_many_in_range(draws_below(key, self.ordinary, count))  # below ordinary


def synthesize_input_ids(
    request: TraceRequest, trace: Trace, seed: int = 0, copy: int = 0, vocab: Vocabulary = SIM_VOCABULARY
) -> list[int]:
    """The prompt of ``request`` (copy ``copy`` of its ``n``), as token ids of ``vocab``, deterministic in ``seed``.

    Requests of one group share exactly their first ``prefix_len`` tokens (a group's shared base,
    cut to each request's prefix_len), a request with ``prefix_of`` starts with that request's
    first ``prefix_len`` tokens; every other token is private to (request, copy), and the first
    token of every sequence start, like the first token after a shared prefix, is unique in the
    whole trace, so a radix cache matches exactly what the trace says and nothing more.
    """
    if request not in trace.requests:
        raise TraceError(f"request {request.id!r} is not part of trace {trace.name!r}")
    if not 0 <= copy < request.n:
        raise TraceError(f"copy must be within 0..{request.n - 1} for request {request.id!r}, got {copy}")
    bands = _Bands(trace, vocab, _band_indices(trace))
    chain = [request]
    while chain[-1].prefix_of is not None:
        chain.append(trace.request(chain[-1].prefix_of))
    firsts: dict[str, list[int]] = {}
    for ancestor in reversed(chain[1:]):
        firsts[ancestor.id] = _recorded_or_synthesized(ancestor, trace, seed, 0, bands, firsts)
    return _synthesize(request, trace, seed, copy, bands, firsts)


def _synthesize(request: TraceRequest, trace: Trace, seed: int, copy: int, bands: _Bands,
                firsts: Mapping[str, list[int]]) -> list[int]:
    """``firsts``: the first copy's prompt of every request named by a ``prefix_of`` so far."""
    band_offset = bands.offset(seed)
    shared = request.prefix_len
    tokens: list[int]
    if shared > 0 and request.prefix_of is not None:
        tokens = firsts[request.prefix_of][:shared]  # a text prompt's is empty: nothing to share
        if len(tokens) < request.prompt_len:
            tokens.append(bands.band_token(("diverge", request.id, str(copy)), band_offset))
    elif shared > 0:
        tokens = bands.group_base(request.group, seed, shared)  # a list of its own
        if len(tokens) < request.prompt_len:
            tokens.append(bands.band_token(("diverge", request.id, str(copy)), band_offset))
    else:
        tokens = [bands.band_token(("start", request.id, str(copy)), band_offset)]
    own = f"own\x1f{trace.name}\x1f{request.id}\x1f{copy}\x1f{seed}".encode()  # _seed_key's, formatted at once
    tokens.extend(bands.ordinary_tokens(own, request.prompt_len - len(tokens)))
    return tokens


def _recorded_or_synthesized(req: TraceRequest, trace: Trace, seed: int, copy: int, bands: _Bands,
                             firsts: Mapping[str, list[int]]) -> list[int]:
    if req.input_ids is not None:
        return list(req.input_ids)
    if req.text is not None:
        return []  # sent as text
    return _synthesize(req, trace, seed, copy, bands, firsts)


def plan_requests(trace: Trace, seed: int = 0, vocab: Vocabulary = SIM_VOCABULARY) -> list[PlannedRequest]:
    """Every generate call of one replay, sorted by send time (copies of a request together), its
    made-up prompts drawn from ``vocab``. TraceError when a recorded prompt has an id ``vocab`` lacks."""
    check_size(trace, trace.name)
    check_recorded_ids(trace, vocab)
    bands = _Bands(trace, vocab, _band_indices(trace))  # once for the whole trace: per request it is quadratic
    named = {req.prefix_of for req in trace.requests if req.prefix_of is not None}
    firsts: dict[str, list[int]] = {}  # a prefix_of names an earlier request: built before it is needed
    planned = []
    for req in trace.requests:
        for copy in range(req.n):
            if req.input_ids is None and req.text is None:  # _recorded_or_synthesized's common case
                ids = _synthesize(req, trace, seed, copy, bands, firsts)
            else:
                ids = _recorded_or_synthesized(req, trace, seed, copy, bands, firsts)
            if copy == 0 and req.id in named:
                firsts[req.id] = ids
            # PlannedRequest(offset_s, request_id, copy, input_ids, max_tokens, text, extra_key,
            # ignore_eos, stop), positionally: one per call
            planned.append(PlannedRequest(req.offset_ms / 1000.0, req.id, copy, ids, req.max_tokens, req.text,
                                          req.extra_key, req.ignore_eos, req.stop))
    planned.sort(key=_OFFSET_S)  # stable: trace order within one instant
    return planned


_OFFSET_S = operator.attrgetter("offset_s")


def check_recorded_ids(trace: Trace, vocab: Vocabulary) -> None:
    """TraceError naming the first recorded prompt with a token id outside ``vocab``: sent, it
    would crash the server rather than replay the incident."""
    for req in trace.requests:
        if req.input_ids is not None:
            top = max(req.input_ids)
            if top >= vocab.size:
                raise TraceError(f"request {req.id!r} has token id {top:,}, outside the model's vocabulary of "
                                 f"{vocab.describe()}: the trace was recorded against another model")
