"""How fast `radixtop analyze` runs a trace, against the raw radix-cache loop, in the same run.

The workload: a synthetic trace of N requests (default 100,000) in 64 groups sharing a 128-token
system prompt, 256-token prompts, 8 new tokens each, 2 ms apart, analyzed at page size 16 with a
65,536-token pool and 32 running requests. Measured: requests/s of ``analyze()`` (the simulator's
scheduler and radix cache on a virtual clock, prompts synthesized, reasons attached).

Peer: the bare radix-cache loop over the same prompts: ``match_prefix`` then ``insert`` per
prompt on the simulator's ``RadixCache`` (no scheduler, no pool, no eviction, no decode). It is the
floor any cache analyzer pays; the ratio says what the scheduler's faithfulness costs.

Usage::

    python benchmarks/analyze_bench.py --requests 2000     # a quick look (shared machine: noise)
    python benchmarks/analyze_bench.py                     # 100,000 requests: the figure to write down
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from bench_rows import row  # noqa: E402  (benchmarks/ is the script's own directory)

from radixtop.incident.analyze.analyze import analyze  # noqa: E402
from radixtop.incident.replay.trace import Trace, TraceRequest, plan_requests  # noqa: E402
from radixtop.sim.engine import SimConfig  # noqa: E402
from radixtop.sim.radix import InsertParams, MatchPrefixParams, RadixCache, RadixKey  # noqa: E402

GROUPS = 64
PROMPT_LEN = 256
PREFIX_LEN = 128
MAX_TOKENS = 8
GAP_MS = 2.0
CONFIG = SimConfig(page_size=16, max_total_tokens=65_536, max_running_requests=32)


def make_trace(requests: int) -> Trace:
    return Trace(
        "bench",
        16,
        tuple(
            TraceRequest(f"r{i}", i * GAP_MS, PROMPT_LEN, PREFIX_LEN, f"g{i % GROUPS}", MAX_TOKENS)
            for i in range(requests)
        ),
    )


def bench_analyze(trace: Trace) -> tuple[float, float]:
    began = time.perf_counter()
    result = analyze(trace, CONFIG)
    return time.perf_counter() - began, result.summary.hit_rate


def bench_raw_cache(trace: Trace) -> tuple[float, float]:
    prompts = [p.input_ids for p in plan_requests(trace)]  # built outside the timing, as analyze builds its own inside
    cache = RadixCache.create_simulated(page_size=CONFIG.page_size)
    cached = total = 0
    began = time.perf_counter()
    for ids in prompts:
        key = RadixKey(ids[:-1])
        cached += len(cache.match_prefix(MatchPrefixParams(key=key)).device_indices)
        cache.insert(InsertParams(key=RadixKey(ids)))
        total += len(ids)
    return time.perf_counter() - began, cached / total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100_000, help="requests in the trace (default 100,000)")
    args = parser.parse_args()
    if args.requests < 1:
        parser.error("--requests must be at least 1")
    trace = make_trace(args.requests)
    print(f"python {platform.python_version()} on {platform.machine()}; {args.requests:,} requests, "
          f"{GROUPS} groups, {PROMPT_LEN}-token prompts sharing {PREFIX_LEN}, {MAX_TOKENS} new tokens, page 16")
    rates = {}
    for name, run in (
        ("raw radix-cache match+insert loop (peer)", bench_raw_cache), ("radixtop analyze", bench_analyze)
    ):
        seconds, hit_rate = run(trace)
        rates[name] = args.requests / seconds
        print(f"  {name:<42} {args.requests / seconds:>10,.0f} requests/s  ({seconds:.2f} s; hit rate {hit_rate:.1%})")
    row(f"`radixtop analyze`, {args.requests:,}-request trace, requests/s", f"{rates['radixtop analyze']:,.0f}",
        f"bare radix-cache match+insert loop: {rates['raw radix-cache match+insert loop (peer)']:,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
