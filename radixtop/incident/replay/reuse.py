"""Why a call's prompt was, or was not, served from the prefix cache: expected against cached tokens.

The expectation comes from the trace alone. Requests of one group share their first ``prefix_len``
tokens, so a call can reuse ``min(its prefix_len, the longest prefix_len an earlier call of its
group had)`` tokens (the copies of one request share their whole ``prefix_len``); a request with
``prefix_of`` shares its ``prefix_len`` with that request, and with that request's own ``prefix_of``
as far as both go. Reuse comes only from calls in its cache namespace (``extra_key``: SGLang keys
the tree by it, LoRA adapters by theirs); a replay that gives every call a namespace of its own
(``namespace_per_request``) expects no reuse at all.
A radix cache serves whole pages, and never the prompt's last token (it is computed to get the
next token's logits), so the *expected* cached tokens are that share, capped at ``prompt_len - 1``
and rounded down to whole pages. For a recorded trace the groups are the recorder's estimate.

Each call whose cached tokens fall short of its ``prefix_len`` gets one reason, the first that
applies, in this order:

* ``cache-disabled``: the server runs without the radix cache;
* ``first-of-group``: no earlier call shared its prefix (or shared less of it than it has), or
  the calls that share it were sent at the same instant and this one got there first;
* ``evicted``: less than expected, and the cache evicted between the call that first held the
  prefix being sent and this call's answer; ``not-cached-yet``: less than expected with no eviction
  seen (it arrived with the call that was computing the prefix); ``unexplained``: less than
  expected and nothing says whether the cache evicted (no instrument);
* ``namespace``: the earlier calls that share it are in another cache namespace;
* ``shorter-than-page``: what it shares is shorter than one page;
* ``last-token``: the whole prompt is shared, and its last token is always computed;
* ``page-tail``: what it shares is not page-aligned: the tail of the last page is computed again.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from radixtop.incident.replay.trace import Trace, TraceRequest

__all__ = [
    "REASONS",
    "Expectation",
    "ReuseRow",
    "ReuseSummary",
    "evicted_between",
    "expectations",
    "explain",
    "format_reuse",
    "format_summary",
    "reuse_rows",
    "summarize",
]

REASONS = {
    "cache-disabled": "cache disabled",
    "first-of-group": "first of its group",
    "evicted": "evicted before reuse",
    "not-cached-yet": "not cached yet (no eviction seen)",
    "unexplained": "short; evictions unseen (no instrument)",
    "namespace": "different cache namespace",
    "shorter-than-page": "shorter than a page",
    "last-token": "last token always computed",
    "page-tail": "not page-aligned (the page's tail)",
}

Call = tuple[str, int]  # (request id, copy)


class Expectation(NamedTuple):
    """What a faithful cache gives one call (a named tuple: one is made per call of a trace)."""

    request_id: str
    copy: int
    prompt_len: int
    prefix_len: int
    shared: int  # tokens shared with an earlier call, in any namespace
    shared_in_namespace: int  # ... with an earlier call in this call's namespace
    sharer: Call | None  # the earlier call (of this namespace) that first held those tokens
    page_size: int
    with_sharer: bool = False  # sent at the same instant as its sharer: either may compute the prefix

    @property
    def call(self) -> Call:
        return (self.request_id, self.copy)

    @property
    def expected(self) -> int:
        """Cached tokens a faithful radix cache gives this call when nothing was evicted."""
        return _pages(min(self.shared_in_namespace, self.prompt_len - 1), self.page_size)


def _pages(tokens: int, page_size: int) -> int:
    return max(0, tokens) // page_size * page_size


_OFFSET_MS = operator.attrgetter("offset_ms")


def expectations(trace: Trace, page_size: int, *, namespace_per_request: bool = False) -> list[Expectation]:
    """One Expectation per call, in the order a replay sends them (offsets, then trace order, then
    copy). ``namespace_per_request``: every call in a cache namespace of its own, as a replay with
    that setting sends them: what a call shares with earlier ones is all in other namespaces."""
    if namespace_per_request:
        return [
            e._replace(shared_in_namespace=0, sharer=None, with_sharer=False)
            for e in expectations(trace, page_size)
        ]
    longest: dict[str, int] = {}  # group -> longest prefix_len sent so far
    # (group, namespace) -> (longest, first call, its offset)
    holder: dict[tuple[str, str | None], tuple[int, Call, float]] = {}
    by_id = {req.id: req for req in trace.requests}
    out = []
    for req in sorted(trace.requests, key=_OFFSET_MS):
        if req.prefix_of is not None:
            out.extend(_along_prefixes(req, by_id, page_size))
            continue
        namespace = (req.group, req.extra_key)
        for copy in range(req.n):
            shared = min(req.prefix_len, longest.get(req.group, 0))
            held, sharer, sent = holder.get(namespace, (0, None, -1.0))
            out.append(Expectation(req.id, copy, req.prompt_len, req.prefix_len, shared, min(req.prefix_len, held),
                                   sharer, page_size, sent == req.offset_ms))
            if req.prefix_len > longest.get(req.group, 0):
                longest[req.group] = req.prefix_len
            if req.prefix_len > held:
                holder[namespace] = (req.prefix_len, (req.id, copy), req.offset_ms)
    return out


def _along_prefixes(req: TraceRequest, by_id: dict[str, TraceRequest], page_size: int) -> list[Expectation]:
    """A prefix_of request's calls: it shares its prefix_len with the request it names; in its own
    cache namespace, with the nearest request up that chain in the namespace, as far as the chain's
    prefixes all go."""
    parent = by_id[req.prefix_of or ""]
    shared, reach, sharer = req.prefix_len, req.prefix_len, parent
    while sharer.extra_key != req.extra_key and sharer.prefix_of is not None:
        reach = min(reach, sharer.prefix_len)
        sharer = by_id[sharer.prefix_of]
    in_namespace = reach if sharer.extra_key == req.extra_key else 0
    holder = (sharer.id, 0) if in_namespace else None
    together = sharer.offset_ms == req.offset_ms
    return [Expectation(req.id, copy, req.prompt_len, req.prefix_len, shared, in_namespace, holder, page_size, together)
            for copy in range(req.n)]


def explain(exp: Expectation, cached: int, *, cache_disabled: bool = False, evicted: bool | None = None) -> str | None:
    """The reason (a key of REASONS) why ``cached`` falls short of the call's prefix_len; None when it does not."""
    if cached >= exp.prefix_len:
        return None
    if cache_disabled:
        return "cache-disabled"
    if exp.shared == 0:
        return "first-of-group"
    if cached < exp.expected:
        if exp.with_sharer:  # sent together: the server may have let this one compute the prefix
            return "first-of-group"
        return "unexplained" if evicted is None else ("evicted" if evicted else "not-cached-yet")
    reachable = min(exp.shared, exp.prompt_len - 1)
    if _pages(exp.shared_in_namespace, exp.page_size) < _pages(reachable, exp.page_size):
        return "namespace"
    shared = exp.shared_in_namespace
    if shared < exp.page_size:
        return "shorter-than-page"
    if shared >= exp.prompt_len:
        return "last-token"
    if shared % exp.page_size:
        return "page-tail"
    return "first-of-group"  # its group's earlier calls share only part of its prefix


def evicted_between(eviction_times: Sequence[float], start: float, end: float) -> bool:
    """Whether a sorted list of eviction times has one within [start, end]."""
    i = bisect.bisect_left(eviction_times, start)
    return i < len(eviction_times) and eviction_times[i] <= end


class ReuseRow(NamedTuple):
    """One call over every run: what was expected, what each run's server reported, and why it fell short."""

    exp: Expectation
    cached: tuple[int, ...]  # per answered run
    reason: str | None  # for the run that cached least

    @property
    def missed(self) -> bool:
        return self.reason is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.exp.request_id,
            "copy": self.exp.copy,
            "prompt_tokens": self.exp.prompt_len,
            "prefix_len": self.exp.prefix_len,
            "shared_with_earlier": self.exp.shared,
            "expected_cached_tokens": self.exp.expected,
            "cached_tokens": list(self.cached),
            "reason": self.reason,
            "why": REASONS.get(self.reason or "", ""),
        }


@dataclass(frozen=True)
class ReuseSummary:
    calls: int  # answered calls, over every run
    prompt_tokens: int
    cached_tokens: int
    expected_tokens: int
    missed: dict[str, tuple[int, int]]  # reason -> (calls, tokens short of prefix_len)

    @property
    def hit_rate(self) -> float:
        """SGLang's cache hit rate: cached tokens over prompt tokens."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "expected_cached_tokens": self.expected_tokens,
            "hit_rate": round(self.hit_rate, 6),
            "missed": {r: {"calls": c, "tokens": t} for r, (c, t) in self.missed.items()},
        }


def summarize(answers: Iterable[tuple[Expectation, int, str | None]]) -> ReuseSummary:
    """Totals over (expectation, cached tokens, reason) for every answered call of every run."""
    calls = prompt = cached_total = expected = 0
    missed: dict[str, tuple[int, int]] = {}
    for exp, cached, reason in answers:
        calls += 1
        prompt += exp.prompt_len
        cached_total += cached
        expected += exp.expected
        if reason is not None:
            n, short = missed.get(reason, (0, 0))
            missed[reason] = (n + 1, short + exp.prefix_len - cached)
    order = {r: i for i, r in enumerate(REASONS)}
    return ReuseSummary(
        calls, prompt, cached_total, expected, dict(sorted(missed.items(), key=lambda kv: order[kv[0]]))
    )


Answer = tuple[int, bool | None]  # (cached tokens, whether the cache evicted in the call's window)


def reuse_rows(exps: Sequence[Expectation], runs: Sequence[dict[Call, Answer]], *,
               cache_disabled: bool = False) -> tuple[list[ReuseRow], ReuseSummary]:
    """Every call's row over the runs (a failed call is absent from its run's dict), and the totals."""
    rows = []
    answered: list[tuple[Expectation, int, str | None]] = []
    for exp in exps:
        call = exp.call
        cached: list[int] = []
        worst: str | None = None
        for run in runs:
            if call not in run:
                continue
            tokens, evicted = run[call]
            reason = explain(exp, tokens, cache_disabled=cache_disabled, evicted=evicted)
            answered.append((exp, tokens, reason))
            if not cached or tokens < min(cached):
                worst = reason
            cached.append(tokens)
        rows.append(ReuseRow(exp, tuple(cached), worst))
    return rows, summarize(answered)


def format_summary(summary: ReuseSummary) -> list[str]:
    lines = [
        f"  Cached tokens: {summary.cached_tokens:,} of {summary.prompt_tokens:,} prompt tokens "
        f"(hit rate {summary.hit_rate:.1%}; {summary.expected_tokens:,} expected from the trace)"
    ]
    if summary.missed:
        parts = [f"{REASONS[r]}: {n} calls, {t:,} tokens" for r, (n, t) in summary.missed.items()]
        lines.append(f"  Short of their prefix: {'; '.join(parts)}")
    return lines


def format_reuse(rows: Sequence[dict[str, Any]], *, title: str = "CACHED TOKENS", limit: int = 40) -> list[str]:
    """Rows (ReuseRow.to_json()'s, so a verdict read back from JSON prints alike) as a text table:
    at most ``limit``, and the count of the rest."""
    if not rows:
        return []
    out = [f"  [{title} — {len(rows)} calls]",
           f"    {'request':<22} {'copy':>4} {'prompt':>6} {'prefix':>6} {'expect':>6} {'cached':>9}  why"]
    for row in rows[:limit]:
        runs = row["cached_tokens"]
        lo, hi = (min(runs), max(runs)) if runs else (None, None)
        cached = "-" if lo is None else (f"{lo}" if lo == hi else f"{lo}..{hi}")
        out.append(
            f"    {row['id'][:22]:<22} {row['copy']:>4} {row['prompt_tokens']:>6} {row['prefix_len']:>6} "
            f"{row['expected_cached_tokens']:>6} {cached:>9}  {row['why']}"
        )
    if len(rows) > limit:
        out.append(f"    ... {len(rows) - limit} more (--json has every call)")
    return out
