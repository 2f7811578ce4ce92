"""`radixtop analyze`: how cache-friendly a trace is, without a server or a GPU.

The trace's calls run through the simulator's engine in-process (``radixtop.sim.offline``: the
same scheduler and radix cache as ``radixtop sim``, on a virtual clock) with the page size, pool
size, batch bound and eviction policy asked for. The report is the replay's cached-token account
(``radixtop.incident.replay.reuse``): hit rate, tokens saved, the calls short of their prefix by reason,
plus the pool's peak token usage, evicted tokens and retractions. A sweep runs one setting per
value of one flag, so the row where the hit rate falls shows where the cache stops helping.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from radixtop.incident.replay.reuse import (
    REASONS,
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
from radixtop.incident.replay.trace import Trace, plan_requests
from radixtop.sim.engine import SimConfig, check_token_ids
from radixtop.sim.model import SimTokenizer
from radixtop.sim.offline import OfflineCall, run_offline

__all__ = ["SWEEPABLE", "Analysis", "analyze", "format_analysis", "format_sweep", "parse_sweep"]

# --sweep FLAG=V1,V2,...: the flag's SimConfig field.
SWEEPABLE = {
    "page-size": "page_size",
    "max-total-tokens": "max_total_tokens",
    "max-running-requests": "max_running_requests",
}


@dataclass(frozen=True)
class Analysis:
    trace: str
    config: SimConfig
    rows: tuple[ReuseRow, ...]
    summary: ReuseSummary
    failed: tuple[tuple[Call, str], ...]  # calls the engine refused or aborted, and why
    evicted_tokens: int
    peak_token_usage: float
    retractions: int
    duration_s: float  # the trace's span on the engine's virtual clock

    @property
    def missed(self) -> list[ReuseRow]:
        return [r for r in self.rows if r.missed]

    def setting(self) -> dict[str, Any]:
        c = self.config
        return {
            "page_size": c.page_size,
            "max_total_tokens": c.max_total_tokens,
            "max_running_requests": c.max_running_requests,
            "eviction_policy": c.radix_eviction_policy,
            "disable_radix_cache": c.disable_radix_cache,
            "step_ms": c.step_time_s * 1000.0,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "trace": self.trace,
            "setting": self.setting(),
            **self.summary.to_json(),
            "tokens_saved": self.summary.cached_tokens,
            "evicted_tokens": self.evicted_tokens,
            "peak_token_usage": round(self.peak_token_usage, 4),
            "retractions": self.retractions,
            "failed_calls": [{"id": rid, "copy": copy, "error": why} for (rid, copy), why in self.failed],
            "simulated_s": round(self.duration_s, 3),
            "calls": [r.to_json() for r in self.rows],
        }


def analyze(trace: Trace, config: SimConfig, *, seed: int = 0) -> Analysis:
    """Run the trace once on a fresh engine built from ``config`` (ValueError names a bad field)."""
    config.validate()
    # The prompts, the tree and the requests are millions of objects and no garbage until the
    # run ends: the cyclic collector would only walk them again and again.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _analyze(trace, config, seed)
    finally:
        if collecting:
            gc.enable()


def _recorded_ids_valid(trace: Trace) -> bool:
    """Whether every recorded prompt holds token ids of the simulator's vocabulary. Then so does
    every prompt of the plan (the rest are drawn from that vocabulary, copied from recorded ones
    or the simulator tokenizer's), and the engine need not check each call's ids again."""
    try:
        for req in trace.requests:
            if req.input_ids is not None:
                check_token_ids(req.input_ids)
    except ValueError:
        return False  # the engine names the bad id of each call that has it
    return True


def _analyze(trace: Trace, config: SimConfig, seed: int) -> Analysis:
    tokenizer = SimTokenizer()
    ids_checked = _recorded_ids_valid(trace)
    calls = [
        OfflineCall(
            (p.request_id, p.copy),
            p.offset_s,
            p.input_ids if p.text is None else tokenizer.encode(p.text),
            p.max_tokens,
            p.extra_key,
            ids_checked,
        )
        for p in plan_requests(trace, seed=seed)  # drawn from SIM_VOCABULARY, the engine's
    ]
    run = run_offline(config, calls)
    exps = expectations(trace, config.page_size)
    by_call = {r.key: r for r in run.results}
    answers: dict[Call, Answer] = {}
    for exp in exps:
        call = exp.call
        result = by_call[call]
        if result.cached_tokens is None or result.finished_s is None:
            continue
        start = by_call[exp.sharer].arrived_s if exp.sharer is not None else result.arrived_s
        answers[call] = (result.cached_tokens, evicted_between(run.eviction_times_s, start, result.finished_s))
    rows, summary = reuse_rows(exps, [answers], cache_disabled=config.disable_radix_cache)
    failed = tuple((r.key, r.error) for r in run.results if r.error is not None)
    return Analysis(trace.name, config, tuple(rows), summary, failed, run.evicted_tokens,
                    run.peak_token_usage, run.retractions, run.duration_s)


def parse_sweep(text: str) -> tuple[str, list[int]]:
    """``page-size=1,16,64`` -> ("page_size", [1, 16, 64]); ValueError says what to write instead."""
    flag, sep, values = text.partition("=")
    flag = flag.strip().removeprefix("--")
    if not sep or flag not in SWEEPABLE:
        raise ValueError(f"--sweep {text!r}: write FLAG=V1,V2,... with FLAG one of {', '.join(SWEEPABLE)}")
    try:
        numbers = [int(v) for v in values.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--sweep {text!r}: the values must be whole numbers, comma-separated") from None
    if not numbers:
        raise ValueError(f"--sweep {text!r}: give at least one value after =")
    return SWEEPABLE[flag], numbers


def sweep(trace: Trace, config: SimConfig, field: str, values: Sequence[int], *, seed: int = 0) -> list[Analysis]:
    return [analyze(trace, _with(config, field, value), seed=seed) for value in values]


def _with(config: SimConfig, field: str, value: int) -> SimConfig:
    changes: dict[str, Any] = {field: value}  # one of SWEEPABLE's fields, named at run time
    return replace(config, **changes)


def _setting_line(a: Analysis) -> str:
    s = a.setting()
    cache = "radix cache disabled" if s["disable_radix_cache"] else f"{s['eviction_policy']} eviction"
    return (f"page size {s['page_size']}, {s['max_total_tokens']:,} tokens, "
            f"{s['max_running_requests']} running requests, {cache}, {s['step_ms']:g} ms steps")


def format_analysis(a: Analysis, *, source: str = "", limit: int = 40) -> str:
    bar = "=" * 60
    out = [
        bar,
        f"  Trace    : {a.trace}" + (f"  ({source})" if source else ""),
        f"  Setting  : {_setting_line(a)}",
        f"  Simulated: {a.summary.calls} calls over {a.duration_s:.2f} s (simulator in-process, no server)",
        bar,
        "",
        *format_summary(a.summary),
        f"  Tokens saved: {a.summary.cached_tokens:,}; peak token usage {a.peak_token_usage:.2f}; "
        f"evicted {a.evicted_tokens:,} tokens; {a.retractions} retractions",
    ]
    if a.failed:
        (rid, copy), why = a.failed[0]
        out.append(f"  Failed calls: {len(a.failed)}, e.g. {rid} copy {copy}: {why[:120]}")
    missed = a.missed
    if missed:
        out += ["", *format_reuse([r.to_json() for r in missed], title="SHORT OF THEIR PREFIX", limit=limit)]
    out.append(bar)
    return "\n".join(out) + "\n"


def format_sweep(rows: Sequence[Analysis], field: str) -> str:
    """One line per setting: the swept value, hit rate, tokens saved, evictions and misses by reason."""
    flag = next(k for k, v in SWEEPABLE.items() if v == field)
    head = f"  {flag:>20}  {'hit rate':>8}  {'saved':>9}  {'evicted':>9}  {'peak':>5}  misses by reason"
    out = [f"  Trace {rows[0].trace}; {_setting_line(rows[0])}; {flag} swept", head]
    for a in rows:
        misses = ", ".join(f"{REASONS[r]} {n}" for r, (n, _) in a.summary.missed.items()) or "none"
        out.append(
            f"  {getattr(a.config, field):>20,}  {a.summary.hit_rate:>8.1%}  {a.summary.cached_tokens:>9,}  "
            f"{a.evicted_tokens:>9,}  {a.peak_token_usage:>5.2f}  {misses}"
        )
    return "\n".join(out) + "\n"
