"""What seeing the tree of SGLang's Rust TreeCore costs, beside the Python TreeCore's walk.

The Rust core's tree is rebuilt from its two KV-canary walks (radixtop/instrument/slot_chains.py):
the scheduler thread pays for the two walks (read_walk), the endpoint's thread (which shares the
scheduler's GIL) for rebuilding the chains from the rows in torch (build). The peer is the Python
core's snapshot on the same workload: the scheduler thread pays for the budgeted detail walk
(capture) and, spread over safe points, a whole-tree census. Both on trees of about 100k and 1M slots filled by the same
scheduler-shaped stream (tests/sglang/real_cache.py's Driver: 16 requests kept locked), costs in
this thread's CPU time, best of N. Both stay within the endpoint's duty cap (1 % of the scheduler
thread): what a bigger tree costs is freshness, so the table gives how often each can refresh
(the Rust core's whole structure per snapshot, the Python core's census at its own 0.3 %).

Usage (the environment .ci/sglang-tests builds):
    <sglang env>/bin/python benchmarks/rust_walk_bench.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "sglang")]

import real_cache  # noqa: E402
from bench_rows import row  # noqa: E402  (benchmarks/ is the script's own directory)

from radixtop.instrument import slot_chains  # noqa: E402
from radixtop.instrument.snapshot import SnapshotConfig, TreeSnapshotter  # noqa: E402

RATE = 2.0  # snapshots per second while someone watches


def filled(backend: str, slots: int) -> object:
    cache = real_cache.unified_cache(size=slots, backend=backend)
    driver = real_cache.Driver(cache, window=16, seed=3)
    while cache.token_to_kv_pool_allocator.available_size() > slots // 50 or driver.tally.inserts < 50:
        driver.request()
    return cache


def timed(fn, runs: int) -> tuple[list[float], object]:
    """This thread's CPU time of `runs` calls in a row, sorted, and the last call's result."""
    times, out = [], None
    for _ in range(runs):
        started = time.thread_time()
        out = fn()
        times.append(time.thread_time() - started)
    return sorted(times), out


def best(fn, repeat: int) -> tuple[float, object]:
    times, out = timed(fn, repeat)
    return times[0], out


def spread(fn, runs: int = 60) -> tuple[float, float]:
    """Median and 90th percentile of `runs` calls in a row: the best hides the collections that
    a call's garbage sets off."""
    times, _ = timed(fn, runs)
    return times[runs // 2], times[runs * 9 // 10]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="100k slots only, fewer repeats")
    args = parser.parse_args()
    sizes = (100_000,) if args.quick else (100_000, 1_000_000)
    repeat = 3 if args.quick else 5
    print(f"Command: <sglang env>/bin/python benchmarks/rust_walk_bench.py{' --quick' if args.quick else ''}; "
          f"best of {repeat}")
    config = SnapshotConfig()
    detail_duty = 0.01 - config.census_duty  # the endpoint's default max_duty, less the census's share
    print("| slots | Rust core: the two walks, per snapshot (scheduler) | copy + rebuild (endpoint thread) "
          "| rebuild, median / p90 of 60 in a row | nodes "
          "| Rust: snapshot every, at the duty cap | Python core: capture per snapshot | whole census | nodes "
          "| Python: census every, at its duty |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for slots in sizes:
        rust = filled("rust", slots)
        read_s, walk = best(lambda c=rust: slot_chains.read_walk(c.tree_core), repeat)
        build_s, built = best(lambda w=walk: slot_chains.build(w, config.max_nodes), repeat)
        build_median, build_p90 = spread(lambda w=walk: slot_chains.build(w, config.max_nodes))
        python = filled("python", slots)
        snapper = TreeSnapshotter(config)
        census_s, _ = best(lambda c=python, s=snapper: s.finish_census(c), repeat)
        capture_s, cap = best(lambda c=python, s=snapper: s.capture(c), repeat)
        nodes = cap.census.node_count if cap.census is not None else 0
        print(f"| {len(walk.slots):,} | {read_s * 1e3:.1f} ms | {build_s * 1e3:.1f} ms "
              f"| {build_median * 1e3:.1f} / {build_p90 * 1e3:.1f} ms | {built[1].node_count:,} "
              f"| {max(1 / RATE, read_s / detail_duty):.1f} s | {capture_s * 1e3:.2f} ms | {census_s * 1e3:.1f} ms "
              f"| {nodes:,} | {census_s / config.census_duty:.1f} s |")
        row(f"Rust TreeCore's tree from its KV-canary walks, {len(walk.slots):,} slots: walk per snapshot / rebuild",
            f"{read_s * 1e3:.1f} ms / {build_s * 1e3:.0f} ms",
            f"Python core: capture {capture_s * 1e3:.2f} ms, census {census_s * 1e3:.0f} ms",
            "walk under 100 ms, rebuild <= 20 ms (100k slots)", read_s < 0.1 and (slots > 100_000 or build_s <= 0.02))

if __name__ == "__main__":
    main()
