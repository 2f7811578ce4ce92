"""What radixtop's in-process instrumentation costs the SGLang scheduler thread.

1. Hook overhead: one seeded stream of scheduler-shaped cache operations (match_prefix, lock,
   alloc/evict under pressure, insert, relock, unlock) on the simulator's RadixCache, run without
   hooks (the peer) and with hooks installed on the instance and on the class, interleaved, best
   of N. Target: at most 5 % slower.
2. Snapshot cost at 1k / 10k / 100k nodes, this thread's CPU time (time.thread_time: wall time on
   a shared box also counts other people's work): the capture (the budgeted detail walk's raw
   reads: what a snapshot costs the scheduler thread), the build + JSON the endpoint's HTTP thread
   then does, both on one thread (how snapshots were taken before: the peer of the capture), the
   incremental census (its slices, one per safe point, and how long a whole-tree census takes at
   its duty), and the naive peer: every node walked and serialised each time. Each is turned into
   the share of one scheduler thread at the default rate (2 snapshots/s). Target: under 1 % at
   100k nodes. Then end to end: a scheduler-shaped loop calling safe_point on the 100k tree
   while a client reads, with the share safe_point took.

3. --real: the same two measurements on sglang 0.5.23's own RadixCache on a CPU torch (run with
   the environment .ci/sglang-tests builds): a scheduler-shaped stream of real cache operations
   (tests/sglang/real_cache.py's Driver: match_prefix, inc_lock_ref, evict_for_alloc under pool
   pressure, alloc, path_device_indices, insert, relock, dec_lock_ref) with no hooks, with the
   hooks on the class, and with attach()'s whole instrument (its hooks for the instance, endpoint
   being watched, the safe point once per request); per-call costs for both install routes; and
   snapshot cost (as in 2., end to end included) on real trees of 1k, 10k and 100k nodes.

Usage:  python benchmarks/instrument_bench.py [--quick] [--write-readme]
        <sglang env>/bin/python benchmarks/instrument_bench.py --real [--quick] [--write-readme]
"""

from __future__ import annotations

import argparse
import gc
import random
import re
import statistics
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from bench_rows import row  # noqa: E402  (benchmarks/ is the script's own directory)

from radixtop.instrument.hooks import CacheHooks
from radixtop.instrument.snapshot import SnapshotConfig, TreeSnapshotter, run_census
from radixtop.sim.pool import TokenToKVPoolAllocator
from radixtop.sim.radix import (
    EvictParams,
    InsertParams,
    MatchPrefixParams,
    RadixCache,
    RadixKey,
)

README = Path(__file__).with_name("README.md")
START, END = "<!-- instrument_bench:start -->", "<!-- instrument_bench:end -->"
REAL_START, REAL_END = "<!-- instrument_bench_real:start -->", "<!-- instrument_bench_real:end -->"
RATE_HZ = 2.0  # InstrumentEndpoint's default min_interval_s = 0.5 while someone is watching
MAX_DUTY = 0.01  # InstrumentEndpoint's default max_duty
MIN_CENSUS_GAP_S = 0.02  # InstrumentEndpoint's least spacing of census steps


# ------------------------------------------------------------------------------------------------
# 1. Hook overhead


def make_workload(n_requests: int, seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    systems = [[rng.randrange(32000) for _ in range(rng.randrange(64, 256))] for _ in range(8)]
    prompts = []
    for _ in range(n_requests):
        sys_prompt = rng.choice(systems)
        turns = [rng.randrange(32000) for _ in range(rng.randrange(16, 96))]
        prompts.append(sys_prompt + turns)
    return prompts


def run_stream(prompts: list[list[int]], hooks_on: str | None, pool_tokens: int) -> tuple[float, CacheHooks | None]:
    alloc = TokenToKVPoolAllocator(pool_tokens, store_contents=False)
    cache = RadixCache.create_simulated(mock_allocator=alloc)
    hooks = None
    if hooks_on == "instance":
        hooks = CacheHooks()
        hooks.install(cache)
    elif hooks_on == "class":
        hooks = CacheHooks()
        hooks.install(RadixCache)
    running: list = []
    gc.collect()
    started = time.thread_time()
    try:
        for tokens in prompts:
            key = RadixKey(tokens)
            match = cache.match_prefix(MatchPrefixParams(key=key))
            node = match.last_device_node
            cache.inc_lock_ref(node)
            need = len(tokens) - len(match.device_indices)
            if alloc.available_size() < need:
                cache.evict(EvictParams(num_tokens=need))
            slots = alloc.alloc(need)
            if slots is None:  # pool exhausted by locked requests: finish the oldest, retry later
                cache.dec_lock_ref(node)
            else:
                result = cache.insert(InsertParams(key=key, value=list(match.device_indices) + slots))
                alloc.free(slots[: max(0, result.prefix_len - len(match.device_indices))])
                new = cache.match_prefix(MatchPrefixParams(key=key)).last_device_node
                cache.dec_lock_ref(node)
                cache.inc_lock_ref(new)
                running.append(new)
            if len(running) > 32:  # a window of running requests keeps their paths locked
                cache.dec_lock_ref(running.pop(0))
        for node in running:
            cache.dec_lock_ref(node)
        return time.thread_time() - started, hooks
    finally:
        if hooks is not None:
            hooks.uninstall()


def hook_overhead(n_requests: int, rounds: int) -> dict:
    """Many short rounds, each running the three modes back to back in a rotating order; the
    per-round ratio to the unhooked run cancels the load drift of a shared machine."""
    prompts = make_workload(n_requests)
    pool = 40 * 200  # small enough that evict runs often
    modes = ("none", "instance", "class")
    times: dict[str, list[float]] = {m: [] for m in modes}
    ratios: dict[str, list[float]] = {m: [] for m in modes}
    counters = None
    run_stream(prompts[: n_requests // 4], None, pool)  # warm-up: imports, allocator, caches
    for r in range(rounds):
        order = modes[r % 3 :] + modes[: r % 3]
        this: dict[str, float] = {}
        for mode in order:
            seconds, hooks = run_stream(prompts, None if mode == "none" else mode, pool)
            this[mode] = seconds
            times[mode].append(seconds)
            if hooks is not None:
                counters = hooks.counters()
        for mode in modes:
            ratios[mode].append(this[mode] / this["none"])
    return {
        "requests": n_requests,
        "rounds": rounds,
        "best": {m: min(v) for m, v in times.items()},
        "ratio": {m: statistics.median(v) for m, v in ratios.items()},
        "counters": counters,
    }


def per_call_overhead(loops: int = 20_000, repeats: int = 9) -> dict:
    """Extra CPU per hooked call (best of many short loops: steadier than whole streams)."""

    def fresh() -> tuple[RadixCache, object]:
        cache = RadixCache.create_simulated(mock_allocator=TokenToKVPoolAllocator(1 << 16, store_contents=False))
        cache.insert(InsertParams(key=RadixKey(list(range(50)))))
        cache.insert(InsertParams(key=RadixKey(list(range(30)) + [7] * 10)))  # a 2-node path
        node = cache.match_prefix(MatchPrefixParams(key=RadixKey(list(range(50))))).last_device_node
        return cache, node

    def lock_pair(cache, node) -> float:
        best = float("inf")
        for _ in range(repeats):
            t = time.thread_time()
            for _ in range(loops):
                cache.inc_lock_ref(node)
                cache.dec_lock_ref(node)
            best = min(best, time.thread_time() - t)
        return best / loops

    def evicts(cache) -> float:
        best = float("inf")
        for _ in range(repeats):
            t = time.thread_time()
            for _ in range(loops):
                cache.evict(EvictParams(num_tokens=0))
            best = min(best, time.thread_time() - t)
        return best / loops

    out = {}
    for mode in ("none", "instance", "class"):
        cache, node = fresh()
        hooks = CacheHooks()
        if mode == "instance":
            hooks.install(cache)
        elif mode == "class":
            hooks.install(RadixCache)
        try:
            out[mode] = (lock_pair(cache, node), evicts(cache))
        finally:
            hooks.uninstall()
    return {
        mode: {"lock_pair_us": 1e6 * (out[mode][0] - out["none"][0]), "evict_us": 1e6 * (out[mode][1] - out["none"][1])}
        for mode in ("instance", "class")
    }


# ------------------------------------------------------------------------------------------------
# 2. Snapshot cost


def build_tree(n_nodes: int, seed: int = 2) -> RadixCache:
    rng = random.Random(seed)
    cache = RadixCache.create_simulated(mock_allocator=TokenToKVPoolAllocator(1024, store_contents=False))
    systems = [[rng.randrange(32000) for _ in range(rng.randrange(16, 128))] for _ in range(max(4, n_nodes // 200))]
    count = 0
    while count < n_nodes:
        for _ in range(max(100, (n_nodes - count) // 2)):
            tokens = rng.choice(systems) + [rng.randrange(32000) for _ in range(rng.randrange(8, 48))]
            cache.insert(InsertParams(key=RadixKey(tokens)))  # values default to the token ids
        count = sum(1 for _ in cache.iter_nodes())
    # A few hundred running requests hold paths locked, as on a busy server.
    leaves = [n for n in cache.iter_nodes() if not n.children]
    for node in rng.sample(leaves, min(256, len(leaves))):
        cache.inc_lock_ref(node)
    return cache


def cpu_ms(fn, repeats: int) -> float:
    """Median CPU time of this thread (what the scheduler thread would lose), in ms: on a shared
    box wall time also counts other people's work."""
    times = []
    for _ in range(repeats):
        gc.collect()
        t = time.thread_time()
        fn()
        times.append(time.thread_time() - t)
    return statistics.median(times) * 1e3


def calibrate() -> float:
    """ns per iteration of a bare Python loop here, to scale these figures to another machine."""

    def loop():
        n = 0
        for _ in range(1_000_000):
            n += 1

    return cpu_ms(loop, 5)  # ms per 1M iterations == ns per iteration


def census_slices(cache, cfg: SnapshotConfig) -> dict:
    """One whole incremental census, stepped as the endpoint steps it (one slice per safe point):
    each slice's CPU time, and what they add up to."""
    shot = TreeSnapshotter(cfg)
    slices = []
    gc.collect()
    for _ in range(10**7):
        t = time.thread_time()
        shot.census_step(cache)
        slices.append(time.thread_time() - t)
        census = shot.census()
        if census is not None and census.complete:
            break
    total = sum(slices)
    # The endpoint spaces steps by slice cost / census_duty (and at least _MIN_CENSUS_GAP_S).
    period = sum(max(MIN_CENSUS_GAP_S, x / cfg.census_duty) for x in slices)
    return {
        "slice_ms": statistics.median(slices) * 1e3,
        "slice_p99_ms": sorted(slices)[int(0.99 * (len(slices) - 1))] * 1e3,
        "slice_max_ms": max(slices) * 1e3,
        "slices": len(slices),
        "census_ms": total * 1e3,
        "census_every_s": period,
        "census_share": total / period,
        "node_count": census.node_count,
    }


# Budgets compared with the default at 100k nodes: the former default and one between.
OTHER_BUDGETS = [SnapshotConfig(max_nodes=256, max_scan=1024), SnapshotConfig(max_nodes=192, max_scan=768)]


def snapshot_costs(
    sizes: list[int], repeats: int, others: list[SnapshotConfig], build=None, count=None, keep: list | None = None
) -> list[dict]:
    """Per tree size: the scheduler thread's part of a snapshot (capture: the budgeted detail walk
    reading raw rows), the endpoint thread's part (build the checked Snapshot + JSON), the old way
    (all of it on the scheduler thread, the peer of the capture), the incremental census's slices,
    and the naive peer (every node walked and serialised each time)."""
    rows = []
    defaults = SnapshotConfig()
    build = build or build_tree
    count = count or (lambda cache: sum(1 for _ in cache.iter_nodes()))
    for size in sizes:
        cache = build(size)
        nodes = count(cache)
        if keep is not None and size == sizes[-1]:
            keep.append((cache, nodes))  # for the end-to-end run
        configs = [("default", defaults)] + ([("other", o) for o in others] if size == sizes[-1] else [])
        for label, cfg in configs:
            shot = TreeSnapshotter(cfg)
            shot.finish_census(cache)  # the weight hints a finished census leaves for the detail walk
            capture = cpu_ms(lambda: shot.capture(cache), repeats)
            cap = shot.capture(cache)
            build_json = cpu_ms(lambda: cap.build().to_json(), repeats)
            all_on_one = cpu_ms(lambda: shot.capture(cache).build().to_json(), repeats)
            payload = len(cap.build().to_json())
            census = census_slices(cache, cfg)
            naive = float("nan")
            if label == "default":
                naive_shot = TreeSnapshotter(
                    SnapshotConfig(max_nodes=min(nodes, 200_000), census_max_nodes=0, max_scan=10**9)
                )
                naive = cpu_ms(lambda: naive_shot.take(cache).to_json(), 1 if nodes > 20_000 else 3)
            # The endpoint captures every max(0.5 s, cost / (1 % - census duty)); census steps take
            # census_share of the thread (at most census_duty).
            detail_duty = MAX_DUTY - cfg.census_duty
            rate = min(RATE_HZ, detail_duty / (capture / 1e3))
            rows.append(
                {
                    "config": f"{cfg.max_nodes} nodes / {cfg.max_scan} scanned",
                    "nodes": nodes,
                    "capture_ms": capture,
                    "build_json_ms": build_json,
                    "all_on_one_ms": all_on_one,
                    "payload_kb": payload / 1024,
                    **census,
                    "fraction_at_2hz": capture / 1e3 * RATE_HZ + census["census_share"],
                    "old_fraction_at_2hz": all_on_one / 1e3 * RATE_HZ + census["census_share"],
                    "rate": rate,
                    "fraction": capture / 1e3 * rate + census["census_share"],
                    "naive_ms": naive,
                    "naive_fraction": naive / 1e3 * RATE_HZ,
                }
            )
    return rows


def end_to_end(cache, seconds: float, iteration_s: float = 0.005) -> dict:
    """The whole instrument as a scheduler runs it: a loop of `iteration_s` busy iterations, each
    ending in InstrumentEndpoint.safe_point(cache), while a client reads the snapshot every 0.5 s
    (the endpoint is watched: 2 snapshots/s, the census at its full duty). The shares are the CPU
    time spent inside safe_point over the loop's wall time (what the endpoint's duty cap holds to
    1 %) and over the loop's own CPU time (higher when other processes take the core: the loop
    then gets less CPU per second); the reader's build + JSON run on the endpoint's threads and
    are reported apart."""
    import threading
    import urllib.request

    from radixtop.instrument.endpoint import InstrumentEndpoint
    from radixtop.schema import SNAPSHOT_PATH

    ep = InstrumentEndpoint(port=0)
    if not ep.start():
        raise RuntimeError("the endpoint could not start")
    # Steady state: a census has finished before (its weights order the detail walk), the next
    # one is in progress. (Only the first minutes after start run without one.)
    ep._snapshotter.finish_census(cache)
    stop = threading.Event()
    reads = []

    def reader() -> None:
        while not stop.is_set():
            t = time.thread_time()
            try:
                with urllib.request.urlopen(ep.url + SNAPSHOT_PATH, timeout=10) as r:
                    r.read()
            except OSError:
                pass  # 503 before the first snapshot
            reads.append(time.thread_time() - t)
            stop.wait(0.5)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    time.sleep(0.2)  # the first read marks the endpoint as watched
    in_safe_point = idle = 0.0
    iterations = idle_calls = 0
    t = time.thread_time()
    for _ in range(1_000_000):
        pass
    work = range(max(1, int(iteration_s / max(1e-9, (time.thread_time() - t) / 1e6))))
    gc.collect()
    begin_cpu, begin = time.thread_time(), time.monotonic()
    try:
        while time.monotonic() - begin < seconds:
            x = 0
            for _ in work:  # the scheduler's own work (plain Python: no clock syscall per turn)
                x += 1
            seq, steps = ep._seq, ep._census_steps
            t, w = time.thread_time(), time.perf_counter()
            ep.safe_point(cache)
            if ep._seq != seq or ep._census_steps != steps:
                in_safe_point += time.thread_time() - t
            else:
                idle_calls += 1  # nothing was due: costed below, in a loop of its own
            del w
            iterations += 1
        total = time.thread_time() - begin_cpu
        wall = time.monotonic() - begin
    finally:
        stop.set()
        thread.join(timeout=10)
        ep.stop()
    # A safe_point with nothing due costs well under a microsecond, below what timing each call
    # can resolve here (the thread CPU clock of this VM jumps by up to hundreds of µs now and then,
    # and the wall clock counts GIL hand-offs to the endpoint's threads): best of short loops.
    ep._next_at = ep._census_next_at = float("inf")
    ep._running = True
    per_idle = min(timeit.repeat(lambda: ep.safe_point(cache), number=20_000, repeat=5)) / 20_000
    idle = idle_calls * per_idle
    run = ep._snapshotter._run
    return {
        "seconds": seconds,
        "iterations": iterations,
        "share": (in_safe_point + idle) / total,
        "wall_share": (in_safe_point + idle) / wall,
        "idle_us": 1e6 * per_idle,
        "cpu_per_wall": total / wall,
        "snapshots": ep.health().snapshots,
        "snapshot_rate": ep.health().snapshots / seconds,
        "census_steps": ep._census_steps,
        "census_share": ep._census_cost / seconds,
        "census_progress": run.node_count if run is not None else 0,
        "reader_ms": 1e3 * statistics.median(reads) if reads else float("nan"),
    }


def end_to_end_line(e: dict, nodes: int) -> str:
    done = f"the census in progress had reached {e['census_progress']:,} nodes"
    return (
        f"End to end on {nodes:,} nodes ({e['seconds']:.0f} s of a scheduler loop of 5 ms iterations calling "
        "safe_point, a client reading every 0.5 s; a census finished before, the next in progress): "
        f"safe_point's CPU time was **{100 * e['wall_share']:.2f} %** of the loop's wall time and "
        f"{100 * e['share']:.2f} % of the loop's own CPU time (the loop got "
        f"{100 * e['cpu_per_wall']:.0f} % of a core here) ({e['snapshots']} snapshots, {e['snapshot_rate']:.1f}/s; "
        f"{e['census_steps']} census steps, {100 * e['census_share']:.2f} % of wall time; {done}; "
        f"a safe_point with nothing due: {e['idle_us']:.1f} µs); each read cost the endpoint's thread "
        f"{e['reader_ms']:.1f} ms (build + JSON + HTTP)."
    )


def snapshot_table(snaps: list[dict]) -> list[str]:
    lines = [
        "| nodes | budget | capture (scheduler) | build + JSON (endpoint thread) | all on the scheduler (one thread) "
        "| payload | census slice: median / p99 / max | slices | census CPU | whole census every "
        "| share at 2/s (one thread) | duty-capped rate | naive walk + JSON | naive share at 2/s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in snaps:
        naive = "" if r["naive_ms"] != r["naive_ms"] else f"{r['naive_ms']:.0f} ms"
        naive_share = "" if r["naive_ms"] != r["naive_ms"] else f"{100 * r['naive_fraction']:.0f} %"
        lines.append(
            f"| {r['nodes']:,} | {r['config']} | {r['capture_ms']:.2f} ms | {r['build_json_ms']:.2f} ms | "
            f"{r['all_on_one_ms']:.2f} ms | {r['payload_kb']:.0f} KiB | "
            f"{1e3 * r['slice_ms']:.0f} / {1e3 * r['slice_p99_ms']:.0f} / {1e3 * r['slice_max_ms']:.0f} µs | "
            f"{r['slices']:,} | {r['census_ms']:.0f} ms | {r['census_every_s']:.1f} s | "
            f"{100 * r['fraction_at_2hz']:.2f} % ({100 * r['old_fraction_at_2hz']:.2f} %) | "
            f"{r['rate']:.1f}/s | {naive} | {naive_share} |"
        )
    return lines


def snapshot_caption(where: str) -> str:
    d = SnapshotConfig()
    return (
        f"Snapshot cost {where}, this thread's CPU time (defaults: budget {d.max_nodes} nodes, {d.max_scan} children "
        f"scanned; census {d.census_slice} units of work per slice, its slices spaced to use at most "
        f"{100 * d.census_duty:g} % of the thread; the capture gets the rest of the {100 * MAX_DUTY:g} % cap; 256 "
        "locked paths). Capture is what a snapshot costs the scheduler thread; the endpoint's HTTP thread builds the "
        "checked snapshot and its JSON (once per snapshot, whoever reads it); \"all on the scheduler\" is both on one "
        "thread, the design this split replaces, for comparison. The census is one whole-tree census stepped slice "
        "by slice; it restarts when done, so \"whole census every\" is how old its figures get. Share at "
        f"{RATE_HZ:g}/s: captures plus census steps (in brackets: had the build and JSON stayed on the scheduler "
        "thread). The peer is the naive snapshot: every node walked and serialised each time. The last rows are "
        "other budgets at 100k nodes (256 / 1024 and more) for comparison with the default."
    )


# ------------------------------------------------------------------------------------------------


def render(hooks: dict, snaps: list[dict], command: str, ns_per_loop: float) -> str:
    lines = [
        f"Command: `{command}`; Python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d')}; this machine runs a "
        f"bare Python loop at {ns_per_loop:.0f} ns per iteration (scale the figures by that).",
        "",
        f"Hook overhead: {hooks['requests']} scheduler-shaped requests on the sim RadixCache (match, lock, "
        f"evict under pressure, insert, relock, unlock), {hooks['rounds']} rounds of the three modes back to back "
        "(rotating order), thread CPU time. The overhead is the median of the per-round ratios to the unhooked run:",
        "",
        "| hooks | best run | overhead (median ratio) | per-call overhead (best of short loops) × the stream's calls |",
        "|---|---:|---:|---|",
    ]
    per_call = hooks.get("per_call", {})
    c = hooks["counters"]
    for mode in ("none", "instance", "class"):
        line = f"| {mode} | {hooks['best'][mode]:.3f} s | {100 * (hooks['ratio'][mode] - 1):+.1f} % |"
        if mode in per_call and c is not None:
            p = per_call[mode]
            # lock_pair covers one inc + one dec on a 2-node path; evict_us an evict with its event.
            modelled = (c.lock_ops * p["lock_pair_us"] + c.evict_calls * p["evict_us"]) / 1e6 / hooks["best"]["none"]
            line += (
                f" {p['lock_pair_us']:.2f} µs per lock+unlock, {p['evict_us']:.2f} µs per evict: "
                f"{100 * modelled:+.1f} % |"
            )
        else:
            line += " |"
        lines.append(line)
    if c is not None:
        lines += [
            "",
            f"(a hooked run counted {c.lock_ops} locks, {c.unlock_ops} unlocks, {c.evict_calls} evict calls, "
            f"{c.evicted_tokens} evicted tokens)",
        ]
    lines += ["", snapshot_caption("on the simulator's RadixCache"), "", *snapshot_table(snaps)]
    return "\n".join(lines)


def write_readme(block: str, start: str = START, end: str = END) -> None:
    text = README.read_text() if README.exists() else "# Benchmarks\n"
    section = f"{start}\n{block}\n{end}"
    if start in text and end in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: section, text, flags=re.DOTALL)
    else:
        text = text.rstrip() + "\n\n## Instrumentation\n\n" + section + "\n"
    README.write_text(text)


# ------------------------------------------------------------------------------------------------
# 3. The real SGLang RadixCache (--real)


def _real():
    """tests/sglang/real_cache.py: sglang 0.5.23's caches on the CPU (imports sglang and torch)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sglang"))
    import real_cache

    return real_cache


def real_hook_overhead(rc, n_requests: int, passes: int, chunk: int = 25) -> dict:
    """Four real RadixCaches fed the same prompts in lockstep, chunk by chunk, the order rotating
    per chunk: "none" (the peer), "control" (a second unhooked cache: the noise floor of the
    method), "hooks" (the counting hooks) and "attach" (attach()'s whole instrument: hooks, an
    endpoint a client is reading, the safe point once per request). The hooked caches are
    instances of their own subclasses, so the peer runs with no wrapper at all: "hooks" installed
    on its subclass (the class route: wrappers bound to their hooks), "attach" as attach() installs
    them, for the instance (the dispatching wrappers, one table lookup per call; its subclass
    carries its own copies of the hooked methods, so the wrappers go there rather than on
    RadixCache itself). Lockstep chunks keep
    the trees in the same state and let each chunk's ratio cancel the load of a shared machine;
    this thread's CPU time (time.thread_time)."""
    import urllib.error
    import urllib.request

    from radixtop.instrument.hooks import CacheHooks
    from radixtop.instrument.sglang import InstrumentConfig, attach
    from radixtop.schema import SNAPSHOT_PATH

    base = type(rc.radix_cache(size=8))
    classes = {m: type(f"{m.title()}RadixCache", (base,), {}) for m in ("control", "hooks")}
    classes["attach"] = _own_methods_subclass(base, "AttachRadixCache")
    classes["none"] = base

    def new_cache(cls, size):
        return cls(
            rc.CacheInitParams(
                disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=rc.allocator(size), page_size=1
            )
        )

    rng = random.Random(1)
    systems = [[rng.randrange(1, 32000) for _ in range(rng.randrange(64, 256))] for _ in range(8)]
    prompts = [
        rng.choice(systems) + [rng.randrange(1, 32000) for _ in range(rng.randrange(16, 96))] for _ in range(n_requests)
    ]
    pool = 40 * 200  # small enough that evict_for_alloc runs often
    modes = ("none", "control", "hooks", "attach")
    ratios: dict[str, list[float]] = {m: [] for m in modes}
    totals = dict.fromkeys(modes, 0.0)
    counters = snapshots = None
    for _ in range(passes):
        drivers = {m: rc.Driver(new_cache(classes[m], pool), window=32) for m in modes}
        hooks = CacheHooks()
        hooks.install(classes["hooks"])
        inst = attach(drivers["attach"].cache, rank=0, config=InstrumentConfig(base_port=0))
        try:  # a client reads the endpoint, as the TUI would: snapshots at 2/s from here on
            urllib.request.urlopen(inst.endpoint.url + SNAPSHOT_PATH, timeout=10).close()
        except urllib.error.HTTPError:
            pass  # 503: no snapshot yet; the request still counts as watching
        gc.collect()
        for i, first in enumerate(range(0, n_requests, chunk)):
            part = prompts[first : first + chunk]
            this = {}
            for mode in modes[i % 4 :] + modes[: i % 4]:
                driver = drivers[mode]
                started = time.thread_time()
                if mode == "attach":
                    for tokens in part:
                        inst.safe_point()
                        driver.request(tokens)
                else:
                    for tokens in part:
                        driver.request(tokens)
                this[mode] = time.thread_time() - started
            for mode in modes:
                ratios[mode].append(this[mode] / this["none"])
                totals[mode] += this[mode]
        counters = hooks.counters()
        snapshots = inst.endpoint.health().snapshots
        hooks.uninstall()
        inst.close()
    return {
        "requests": n_requests,
        "passes": passes,
        "chunk": chunk,
        "per_request_us": {m: 1e6 * totals[m] / (n_requests * passes) for m in modes},
        "median": {m: statistics.median(v) for m, v in ratios.items()},
        "quartiles": {m: statistics.quantiles(v, n=4) for m, v in ratios.items()},
        "sum_ratio": {m: totals[m] / totals["none"] for m in modes},
        "counters": counters,
        "snapshots": snapshots,
    }


def _own_methods_subclass(base: type, name: str) -> type:
    """A subclass defining its own copies of the hooked methods: an instance install then puts its
    dispatching wrappers on this subclass, and `base` stays untouched for the peer."""
    from radixtop.instrument.hooks import HOOKED_METHODS

    return type(name, (base,), {m: getattr(base, m) for m in HOOKED_METHODS})


def real_per_call(rc, loops: int = 2000, repeats: int = 25) -> dict:
    """Extra CPU per hooked call on the real cache: three caches (none; hooks on a subclass, the
    class route; hooks for the instance, attach()'s dispatching route), the same short loops on
    each, in rotating order, best of many (steadier than whole streams)."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams

    from radixtop.instrument.hooks import CacheHooks

    base = type(rc.radix_cache(size=8))
    hooked_cls = type("HookedRadixCache", (base,), {})
    dispatch_cls = _own_methods_subclass(base, "DispatchRadixCache")
    hooks = CacheHooks()
    hooks.install(hooked_cls)
    instance_hooks = CacheHooks()
    setups = {}
    for mode, cls in (("none", base), ("hooks", hooked_cls), ("instance", dispatch_cls)):
        cache = cls(
            rc.CacheInitParams(
                disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=rc.allocator(1 << 12), page_size=1
            )
        )
        cache.insert(InsertParams(key=rc.key(list(range(1, 51)))))
        cache.insert(InsertParams(key=rc.key(list(range(1, 31)) + [7] * 10)))  # a 2-node path
        node = cache.match_prefix(MatchPrefixParams(key=rc.key(list(range(1, 51))))).last_device_node
        setups[mode] = (cache, node)
    instance_hooks.install(setups["instance"][0])
    best = {(m, op): float("inf") for m in setups for op in ("lock", "evict")}
    params = EvictParams(num_tokens=0)
    modes = ("none", "hooks", "instance")
    try:
        for r in range(repeats):
            for mode in modes[r % 3 :] + modes[: r % 3]:
                cache, node = setups[mode]
                inc, dec, evict_for_alloc = cache.inc_lock_ref, cache.dec_lock_ref, cache.evict_for_alloc
                t = time.thread_time()
                for _ in range(loops):
                    inc(node)
                    dec(node)
                best[mode, "lock"] = min(best[mode, "lock"], (time.thread_time() - t) / loops)
                t = time.thread_time()
                for _ in range(loops):
                    evict_for_alloc(params)
                best[mode, "evict"] = min(best[mode, "evict"], (time.thread_time() - t) / loops)
    finally:
        hooks.uninstall()
        instance_hooks.uninstall()
    return {
        "lock_pair_us": 1e6 * (best["hooks", "lock"] - best["none", "lock"]),
        "lock_pair_base_us": 1e6 * best["none", "lock"],
        "evict_us": 1e6 * (best["hooks", "evict"] - best["none", "evict"]),
        "evict_base_us": 1e6 * best["none", "evict"],
        "instance_lock_pair_us": 1e6 * (best["instance", "lock"] - best["none", "lock"]),
        "instance_evict_us": 1e6 * (best["instance", "evict"] - best["none", "evict"]),
    }


def real_build_tree(rc, n_nodes: int, seed: int = 2):
    """A real RadixCache with about n_nodes nodes: prompts sharing system prompts, inserted with
    token ids as values (RadixCache's own fallback), 256 leaves locked as running requests hold them."""
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams

    rng = random.Random(seed)
    cache = rc.radix_cache(size=1024)
    systems = [[rng.randrange(1, 32000) for _ in range(rng.randrange(16, 128))] for _ in range(max(4, n_nodes // 200))]
    count = 0
    while count < n_nodes:
        for _ in range(max(100, (n_nodes - count) // 2)):
            tokens = rng.choice(systems) + [rng.randrange(1, 32000) for _ in range(rng.randrange(8, 48))]
            cache.insert(InsertParams(key=rc.key(tokens)))
        count = real_count(cache)
    leaves, stack = [], [cache.root_node]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if not node.children:
            leaves.append(node)
    for node in rng.sample(leaves, min(256, len(leaves))):
        cache.inc_lock_ref(node)
    return cache


def real_count(cache) -> int:
    return run_census(cache.root_node, 10**9, 1 << 30).census.node_count


def render_real(hooks: dict, per_call: dict, snaps: list[dict], command: str, ns_per_loop: float) -> str:
    import sglang
    import torch

    c = hooks["counters"]
    lines = [
        f"Command: `{command}`; Python {sys.version.split()[0]}, sglang {sglang.__version__}, "
        f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}; "
        f"a bare Python loop here: {ns_per_loop:.0f} ns per iteration.",
        "",
        f"Hook overhead on sglang's RadixCache: {hooks['requests']} scheduler-shaped requests (match, lock, "
        "evict_for_alloc under pool pressure, alloc, path indices, insert, relock, unlock; 32 running requests "
        f"hold locks) fed to four caches in lockstep, {hooks['chunk']} requests at a time in rotating order, "
        f"{hooks['passes']} passes; this thread's CPU time. Per-chunk ratios to the unhooked cache (median and "
        "quartiles), and the ratio of the totals (which also carries the rare snapshot). The control is a second "
        "unhooked cache: how far the method itself strays here.",
        "",
        "| instrumentation | CPU per request | overhead: median chunk | quartiles | total |",
        "|---|---:|---:|---:|---:|",
    ]
    labels = {
        "none": "none (the peer)",
        "control": "none again (control)",
        "hooks": "the counting hooks",
        "attach": "attach(): hooks for the instance + endpoint being read + safe point per request",
    }
    for mode, label in labels.items():
        q = hooks["quartiles"][mode]
        lines.append(
            f"| {label} | {hooks['per_request_us'][mode]:.0f} µs | {100 * (hooks['median'][mode] - 1):+.1f} % | "
            f"{100 * (q[0] - 1):+.1f} % to {100 * (q[2] - 1):+.1f} % | {100 * (hooks['sum_ratio'][mode] - 1):+.1f} % |"
        )
    lines += [
        "",
        f"(the attach() cache was snapshotted {hooks['snapshots']} times in the last pass)",
        "",
        "Per call (best of short loops): a lock + unlock on a 2-node path costs "
        f"{per_call['lock_pair_base_us']:.2f} µs, hooks add {per_call['lock_pair_us']:.2f} µs; "
        f"an evict_for_alloc that frees nothing costs {per_call['evict_base_us']:.2f} µs, "
        f"hooks add {per_call['evict_us']:.2f} µs (installed for the instance, "
        f"as attach() does: {per_call['instance_lock_pair_us']:.2f} and {per_call['instance_evict_us']:.2f} µs).",
    ]
    if c is not None:
        none_s = hooks["per_request_us"]["none"] * hooks["requests"] / 1e6  # one pass
        modelled = (c.lock_ops * per_call["lock_pair_us"] + c.evict_calls * per_call["evict_us"]) / 1e6 / none_s
        lines.append(
            f"Those per-call figures times this stream's calls: {100 * modelled:+.1f} % of the unhooked run "
            "(a floor: hot loops, warm caches)."
        )
    if c is not None:
        lines.append(
            f"(a hooked run counted {c.lock_ops} locks, {c.unlock_ops} unlocks, {c.evict_calls} evict calls, "
            f"{c.evicted_tokens} evicted tokens)"
        )
    lines += ["", snapshot_caption("on sglang's RadixCache"), "", *snapshot_table(snaps)]
    return "\n".join(lines)


def main_real(quick: bool, write: bool) -> None:
    rc = _real()
    n_requests, passes = (400, 2) if quick else (1000, 6)
    ns_per_loop = calibrate()
    hooks = real_hook_overhead(rc, n_requests, passes)
    per_call = real_per_call(rc)
    others = OTHER_BUDGETS
    kept: list = []
    snaps = snapshot_costs(
        [1_000, 10_000, 100_000], 3 if quick else 9, others,
        build=lambda n: real_build_tree(rc, n), count=real_count, keep=kept,
    )
    e2e = end_to_end(kept[0][0], 20 if quick else 60)
    command = "<sglang env>/bin/python benchmarks/instrument_bench.py --real" + (" --quick" if quick else "")
    block = render_real(hooks, per_call, snaps, command, ns_per_loop) + "\n\n" + end_to_end_line(e2e, kept[0][1])
    print(block)
    overhead = 100 * (hooks["median"]["hooks"] - 1)
    row("instrument hooks on SGLang's `RadixCache`, median chunk", f"{overhead:+.1f} %",
        f"unhooked cache (control: {100 * (hooks['median']['control'] - 1):+.1f} %)", "<= 5 %", overhead <= 5)
    row("instrument duty end to end, 100k nodes, 5 ms scheduler loop (SGLang's cache)",
        f"{100 * e2e['wall_share']:.2f} % of the loop", "duty cap: 1 %", "< 1 %", e2e["wall_share"] < 0.01)
    if write:
        write_readme(block, REAL_START, REAL_END)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and repeats (a shared 2-core box)")
    parser.add_argument("--write-readme", action="store_true", help="replace the results block in README.md")
    parser.add_argument("--real", action="store_true", help="on sglang's own RadixCache (needs sglang and torch)")
    args = parser.parse_args()
    if args.real:
        main_real(args.quick, args.write_readme)
        return
    n_requests, rounds = (400, 15) if args.quick else (1500, 41)
    ns_per_loop = calibrate()
    hooks = hook_overhead(n_requests, rounds)
    hooks["per_call"] = per_call_overhead()
    others = OTHER_BUDGETS
    kept: list = []
    snaps = snapshot_costs([1_000, 10_000, 100_000], 5 if args.quick else 15, others, keep=kept)
    e2e = end_to_end(kept[0][0], 20 if args.quick else 60)
    command = "python benchmarks/instrument_bench.py" + (" --quick" if args.quick else "")
    block = render(hooks, snaps, command, ns_per_loop) + "\n\n" + end_to_end_line(e2e, kept[0][1])
    print(block)
    row("instrument hooks on the simulator's `RadixCache`, whole stream", " / ".join(
        f"{100 * (hooks['ratio'][mode] - 1):+.1f} % ({mode})" for mode in ("instance", "class")), "unhooked cache")
    row("instrument duty end to end, 100k nodes, 5 ms scheduler loop (simulator's cache)",
        f"{100 * e2e['wall_share']:.2f} % of the loop", "duty cap: 1 %", "< 1 %", e2e["wall_share"] < 0.01)
    if args.write_readme:
        write_readme(block)


if __name__ == "__main__":
    main()
