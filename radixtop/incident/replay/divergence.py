"""Are the outputs identical across runs? Per request, per copy, with the distinct variants.

At temperature 0 the same prompt must give the same text every run; a call whose text changes
from run to run read something it should not have (the seed's stale KV page). Each copy of a
request is its own prompt, so variants are counted per copy; a request diverged when any of its
copies did, and its ``variants``/``samples`` are those of its most-diverged copy. Failed calls
are not variants: they are counted apart (a server that died is a different kind of evidence).

The text report follows the seed's reproduction output (DIVERGED / STABLE sections, a RESULT line
when the trace says which requests are expected to diverge). Calls that failed prove nothing: when
no expected request diverged and some were never answered twice, the result is INCONCLUSIVE.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from radixtop.incident.replay.replay import ReplaySeries
from radixtop.incident.replay.reuse import (
    Answer,
    Call,
    ReuseRow,
    ReuseSummary,
    evicted_between,
    expectations,
    format_reuse,
    format_summary,
    reuse_rows,
)
from radixtop.incident.replay.trace import Trace

__all__ = [
    "CacheAccount",
    "CopyResult",
    "DivergenceReport",
    "RequestResult",
    "cache_account",
    "compare_runs",
    "format_report",
    "jitter_ms",
    "jitter_per_run_ms",
]

SAMPLE_WIDTH = 40


@dataclass(frozen=True)
class CopyResult:
    copy: int
    variants: tuple[str, ...]  # distinct texts, in the order first seen
    counts: tuple[int, ...]  # how many runs gave each variant
    errors: tuple[str, ...]  # distinct error texts
    failed: int  # calls that failed

    @property
    def diverged(self) -> bool:
        return len(self.variants) > 1


@dataclass(frozen=True)
class RequestResult:
    id: str
    copies: tuple[CopyResult, ...]
    expected: bool  # named in the trace's expect_diverged

    @property
    def diverged(self) -> bool:
        return any(c.diverged for c in self.copies)

    @property
    def worst(self) -> CopyResult | None:
        if not self.copies:
            return None
        return max(self.copies, key=lambda c: (len(c.variants), -c.copy))

    @property
    def variants(self) -> int:
        worst = self.worst
        return 0 if worst is None else len(worst.variants)

    @property
    def failed(self) -> int:
        return sum(c.failed for c in self.copies)

    @property
    def comparable(self) -> bool:
        """Some copy was answered at least twice: there was something to diverge."""
        return any(sum(c.counts) >= 2 for c in self.copies)

    def to_json(self) -> dict[str, Any]:
        worst = self.worst
        return {
            "id": self.id,
            "diverged": self.diverged,
            "variants": self.variants,
            "samples": [] if worst is None else list(worst.variants),
            "expected": self.expected,
            "failed_calls": self.failed,
            "copies": [
                {
                    "copy": c.copy,
                    "diverged": c.diverged,
                    "variants": len(c.variants),
                    "samples": list(c.variants),
                    "counts": list(c.counts),
                    "failed_calls": c.failed,
                    "errors": list(c.errors),
                }
                for c in self.copies
            ],
        }


@dataclass(frozen=True)
class CacheAccount:
    """Cached tokens per call against what the trace lets a radix cache reuse (radixtop.incident.replay.reuse)."""

    page_size: int
    page_size_from: str  # "server" (/server_info) or "trace" (its page_size_hint: the server did not say)
    cache_disabled: bool
    evictions_seen: bool  # every run's evictions were read from the server's debug endpoint
    rows: tuple[ReuseRow, ...]
    summary: ReuseSummary

    def shown(self, diverged: Sequence[str]) -> list[ReuseRow]:
        """The rows worth a look: calls short of their prefix, and every call of a diverged request."""
        return [r for r in self.rows if r.missed or r.exp.request_id in diverged]

    def to_json(self) -> dict[str, Any]:
        return {
            "page_size": self.page_size,
            "page_size_from": self.page_size_from,
            "cache_disabled": self.cache_disabled,
            "evictions_seen": self.evictions_seen,
            **self.summary.to_json(),
            "calls": [r.to_json() for r in self.rows],
        }


def cache_account(series: ReplaySeries, trace: Trace) -> CacheAccount:
    setting = series.cache
    server_page = setting.page_size if setting is not None else None
    known = server_page is not None
    page_size = server_page if server_page is not None else trace.page_size_hint
    exps = expectations(trace, page_size, namespace_per_request=series.namespace_per_request)
    by_call = {e.call: e for e in exps}
    runs: list[dict[Call, Answer]] = []
    for run in series.runs:
        answered = {(o.request_id, o.copy): o for o in run.outcomes if o.error is None and o.cached_tokens is not None}
        answers: dict[Call, Answer] = {}
        for call, outcome in answered.items():
            exp = by_call.get(call)
            tokens = outcome.cached_tokens  # never None here: answered keeps only counted calls
            if exp is None or tokens is None:
                continue
            sharer = answered.get(exp.sharer) if exp.sharer is not None else None
            start = sharer.sent_at if sharer is not None else outcome.sent_at
            seen = run.eviction_times
            answers[call] = (tokens, None if seen is None else evicted_between(seen, start, outcome.answered_at))
        runs.append(answers)
    disabled = setting is not None and setting.disabled
    rows, summary = reuse_rows(exps, runs, cache_disabled=disabled)
    evictions_seen = bool(series.runs) and all(r.eviction_times is not None for r in series.runs)
    return CacheAccount(page_size, "server" if known else "trace", disabled, evictions_seen, tuple(rows), summary)


@dataclass(frozen=True)
class DivergenceReport:
    trace: str
    url: str
    runs: int  # runs actually made
    requested_runs: int
    flush: bool
    requests: tuple[RequestResult, ...]
    expect_diverged: tuple[str, ...]
    jitter: dict[str, float]
    notes: tuple[str, ...]
    stopped_early: str | None
    cache: CacheAccount | None = None
    jitter_runs: tuple[dict[str, float], ...] = ()  # jitter per run, in run order

    @property
    def diverged(self) -> list[str]:
        return [r.id for r in self.requests if r.diverged]

    @property
    def failed_calls(self) -> int:
        return sum(r.failed for r in self.requests)

    @property
    def uncompared(self) -> list[str]:
        """The expected requests no copy of which was answered twice (their calls failed)."""
        by_id = {r.id: r for r in self.requests}
        return [rid for rid in self.expect_diverged if rid not in by_id or not by_id[rid].comparable]

    @property
    def result(self) -> str | None:
        """CONFIRMED / PARTIAL / NOT REPRODUCED against expect_diverged, INCONCLUSIVE when none
        diverged and some could not (their calls failed); None without expectations."""
        if not self.expect_diverged:
            return None
        hit = [rid for rid in self.expect_diverged if rid in self.diverged]
        if len(hit) == len(self.expect_diverged):
            return "CONFIRMED"
        if hit:
            return "PARTIAL"
        return "INCONCLUSIVE" if self.uncompared else "NOT REPRODUCED"

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "requested_runs": self.requested_runs,
            "trace": self.trace,
            "url": self.url,
            "flushed_between_runs": self.flush,
            "requests": [r.to_json() for r in self.requests],
            "diverged": self.diverged,
            "expect_diverged": list(self.expect_diverged),
            "result": self.result,
            "failed_calls": self.failed_calls,
            "dispatch_jitter_ms": dict(self.jitter),
            "dispatch_jitter_per_run_ms": [{"run": i, **j} for i, j in enumerate(self.jitter_runs, 1)],
            "notes": list(self.notes),
            "stopped_early": self.stopped_early,
            "cached_tokens": None if self.cache is None else self.cache.to_json(),
        }


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of already sorted values."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def _jitter(lateness: Sequence[float]) -> dict[str, float]:
    late = sorted(lateness)
    return {
        "p50": round(_percentile(late, 50), 3),
        "p99": round(_percentile(late, 99), 3),
        "max": round(late[-1], 3) if late else 0.0,
        "calls": len(late),
    }


def jitter_ms(series: ReplaySeries) -> dict[str, float]:
    """How late calls were written against their offsets, over every call of every run."""
    return _jitter([o.lateness_ms for run in series.runs for o in run.outcomes])


def jitter_per_run_ms(series: ReplaySeries) -> tuple[dict[str, float], ...]:
    """The same for each run: a run whose calls went out late is one whose timing was not the trace's."""
    return tuple(_jitter([o.lateness_ms for o in run.outcomes]) for run in series.runs)


def compare_runs(series: ReplaySeries, trace: Trace) -> DivergenceReport:
    texts: dict[tuple[str, int], list[str]] = {}
    errors: dict[tuple[str, int], list[str]] = {}
    for run in series.runs:
        for o in run.outcomes:
            key = (o.request_id, o.copy)
            if o.error is None and o.text is not None:
                texts.setdefault(key, []).append(o.text)
            else:
                errors.setdefault(key, []).append(o.error or "no text")
    requests = []
    for req in trace.requests:
        copies = []
        for copy in range(req.n):
            key = (req.id, copy)
            seen: dict[str, int] = {}
            for text in texts.get(key, []):
                seen[text] = seen.get(text, 0) + 1
            errs = errors.get(key, [])
            copies.append(CopyResult(copy, tuple(seen), tuple(seen.values()), tuple(dict.fromkeys(errs)), len(errs)))
        requests.append(RequestResult(req.id, tuple(copies), req.id in trace.expect_diverged))
    return DivergenceReport(
        trace=trace.name,
        url=series.url,
        runs=len(series.runs),
        requested_runs=series.requested_runs,
        flush=series.flush,
        requests=tuple(requests),
        expect_diverged=trace.expect_diverged,
        jitter=jitter_ms(series),
        notes=series.notes,
        stopped_early=series.stopped_early,
        cache=cache_account(series, trace),
        jitter_runs=jitter_per_run_ms(series),
    )


def _sample(text: str) -> str:
    shown = text if len(text) <= SAMPLE_WIDTH else text[:SAMPLE_WIDTH] + "..."
    return repr(shown)


def _wrap_ids(ids: Sequence[str], width: int = 72, indent: str = "    ") -> list[str]:
    lines, line = [], ""
    for rid in ids:
        piece = rid if not line else f", {rid}"
        if line and len(indent) + len(line) + len(piece) > width:
            lines.append(indent + line + ",")
            piece = rid
            line = ""
        line += piece
    if line:
        lines.append(indent + line)
    return lines


def format_cache_account(account: CacheAccount | None, diverged: Sequence[str]) -> list[str]:
    """The cached-token account: totals, then the calls short of their prefix and the diverged ones."""
    if account is None:
        return []
    if account.summary.calls == 0:
        return ["", "  Cached tokens: the server reported none (no meta_info.cached_tokens in its answers)"]
    source = "the server's" if account.page_size_from == "server" else "the trace's hint: the server did not say"
    evictions = (
        "evictions from its debug endpoint" if account.evictions_seen else "evictions unseen (no debug endpoint)"
    )
    out = ["", f"  Page size {account.page_size} ({source}); {evictions}", *format_summary(account.summary)]
    shown = account.shown(diverged)
    if shown:
        out += [
            "",
            *format_reuse([r.to_json() for r in shown], title="CACHED TOKENS — short of their prefix, or diverged"),
        ]
    return out


def _format_jitter(j: dict[str, float]) -> str:
    return f"p50 {j['p50']:.2f} ms, p99 {j['p99']:.2f} ms, max {j['max']:.2f} ms over {int(j['calls'])} calls"


def format_report(report: DivergenceReport, *, source: str = "", extra: Sequence[str] = ()) -> str:
    """The report as text; ``extra``: lines of the caller's, after the dispatch jitter."""
    bar = "=" * 60
    total = len(report.requests)
    diverged = [r for r in report.requests if r.diverged]
    failed = [r for r in report.requests if not r.diverged and r.failed]
    stable = [r for r in report.requests if not r.diverged and not r.failed]
    flush = "cache flushed before each run" if report.flush else "cache NOT flushed between runs (--no-flush)"
    out = [
        bar,
        f"  Trace    : {report.trace}" + (f"  ({source})" if source else ""),
        f"  Server   : {report.url}",
    ]
    if report.expect_diverged:
        out.append(f"  Expect   : {list(report.expect_diverged)} to diverge")
    runs = f"{report.runs}" if report.runs == report.requested_runs else f"{report.runs} of {report.requested_runs}"
    out += [f"  Runs     : {runs} at temperature 0, {flush}", bar, ""]
    if report.runs < 2:
        out += ["  note: divergence needs at least 2 runs; only the failures below can be judged", ""]
    out.append(f"  [DIVERGED — {len(diverged)}/{total} requests non-deterministic]")
    for r in diverged:
        mark = "  ✓ (expected)" if r.expected else ("  (NOT expected)" if report.expect_diverged else "")
        out.append("")
        out.append(f"    {r.id}{mark}")
        for c in r.copies:
            if not c.diverged:
                continue
            if len(r.copies) > 1:
                out.append(f"      copy {c.copy}: {len(c.variants)} variants across {sum(c.counts)} answers")
            for i, (text, count) in enumerate(zip(c.variants, c.counts, strict=True), 1):
                out.append(f"      variant {i}: {_sample(text)}  ({count}x)")
    out.append("")
    out.append(f"  [STABLE — {len(stable)} requests consistent across all runs]")
    out += _wrap_ids(sorted(r.id for r in stable))
    if failed:
        out.append("")
        out.append(f"  [FAILED — {len(failed)} requests with failed calls and no divergence among their answers]")
        for r in failed:
            first_error = next((e for c in r.copies for e in c.errors), "")
            out.append(f"    {r.id}: {r.failed} failed calls, e.g. {first_error[:120]}")
    out += format_cache_account(report.cache, report.diverged)
    out += ["", f"  Dispatch jitter: {_format_jitter(report.jitter)} (written this late against the trace's offsets)"]
    if len(report.jitter_runs) > 1:
        out += [f"    run {i}: {_format_jitter(j)}" for i, j in enumerate(report.jitter_runs, 1)]
    out += extra
    for note in report.notes:
        out.append(f"  note: {note}")
    if report.stopped_early:
        out.append(f"  stopped early: {report.stopped_early}")
    if report.result is not None:
        hit = sum(1 for rid in report.expect_diverged if rid in report.diverged)
        unexpected = [rid for rid in report.diverged if rid not in report.expect_diverged]
        extra = f"; also diverged, not expected: {', '.join(unexpected)}" if unexpected else ""
        if report.result == "INCONCLUSIVE":
            extra += (f"; {len(report.uncompared)} of them never answered twice to compare "
                      "(their calls failed: see FAILED)")
        out += [
            "",
            f"  RESULT: {report.result}  ({hit}/{len(report.expect_diverged)} expected divergences reproduced{extra})",
        ]
    out.append(bar)
    return "\n".join(out) + "\n"
