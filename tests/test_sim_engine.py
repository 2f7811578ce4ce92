"""The simulator engine in-process: scheduling, determinism, SGLang's log lines, and the faults."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from collections import defaultdict
from concurrent.futures import Future

import pytest

from radixtop.incident.replay.trace import builtin_trace, plan_requests, rescale_prefixes, scale_offsets
from radixtop.sim.engine import Engine, EngineDead, GenerateResult, SimConfig
from radixtop.sim.faults import FaultSet, FaultSpec

STAMP = r"\[(?P<time>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{3})?)(?P<rank>(?: DP\d+)?(?: PP\d+)?(?: TP\d+)?)\] "
PREFILL = re.compile(
    STAMP
    + r"Prefill batch, #new-seq: (?P<seq>\d+), #new-token: (?P<new>\d+), #cached-token: (?P<cached>\d+), "
    r"token usage: (?P<usage>\d+\.\d{2}), #running-req: (?P<running>\d+), #queue-req: (?P<queue>\d+),"
)
DECODE = re.compile(
    STAMP
    + r"Decode batch, #running-req: (?P<running>\d+), #token: (?P<token>\d+), token usage: (?P<usage>\d+\.\d{2}), "
    r"cuda graph: (?:True|False), gen throughput \(token/s\): (?P<gen>\d+\.\d{2}), #queue-req: (?P<queue>\d+)"
)
WORD = re.compile(r"^( u\d{1,4}_\d{1,4})+$")


@contextlib.asynccontextmanager
async def engine_running(config: SimConfig):
    lines: list[str] = []
    engine = Engine(config, lines.append)
    task = asyncio.create_task(engine.run())
    try:
        yield engine, lines
    finally:
        engine.stop()
        async with asyncio.timeout(10):
            await task


def prompt(n: int, start: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [start] + [rng.randrange(1 << 20) for _ in range(n - 1)]


def pressure_workload(n: int = 48, shared: int = 0) -> list[list[int]]:
    """48 distinct 300-token prompts (optionally 5 families sharing `shared` tokens)."""
    rng = random.Random(7)
    base = [rng.randrange(1 << 20) for _ in range(shared)]
    return [
        [9_000_000 + (i % 5 if shared else i)] + base + [rng.randrange(1 << 20) for _ in range(299 - shared)]
        for i in range(n)
    ]


async def test_identical_requests_give_identical_outputs_and_hit_the_cache():
    async with engine_running(SimConfig(page_size=16, step_time_s=0)) as (engine, _):
        ids = prompt(100, 1234)
        first = await engine.generate(ids, max_new_tokens=12)
        second = await engine.generate(ids, max_new_tokens=12)
    assert first.output_ids == second.output_ids and first.text == second.text
    assert WORD.match(first.text) and len(first.output_ids) == 12
    assert (first.prompt_tokens, first.completion_tokens, first.finish_reason) == (100, 12, "length")
    assert first.cached_tokens == 0
    assert second.cached_tokens == 96  # at most prompt_len - 1, in whole pages
    assert engine.tokenizer.encode(first.text) == first.output_ids


async def test_output_depends_on_the_kv_read_not_on_batching_or_caching():
    ids = prompt(80, 4321)
    async with engine_running(SimConfig(step_time_s=0)) as (engine, _):
        alone = await engine.generate(ids, max_new_tokens=20)
    async with engine_running(SimConfig(step_time_s=0, page_size=4)) as (engine, _):
        await engine.generate(ids[:50], max_new_tokens=5)  # a cached partial prefix
        crowd = await asyncio.gather(
            *[engine.generate(prompt(60, 77 + i), max_new_tokens=9) for i in range(8)],
            engine.generate(ids, max_new_tokens=20),
        )
    assert crowd[-1].output_ids == alone.output_ids
    assert crowd[-1].cached_tokens == 48
    assert engine.tokenizer.decode([7892 << 11 | 1146]) == " u7892_1146"


async def test_outputs_survive_eviction_and_retraction_unchanged():
    work = pressure_workload(shared=100)
    async with engine_running(SimConfig(max_total_tokens=131072, step_time_s=0)) as (engine, _):
        roomy = await asyncio.gather(*[engine.generate(w, max_new_tokens=64) for w in work])
    async with engine_running(SimConfig(max_total_tokens=4096, step_time_s=0, page_size=4)) as (
        engine,
        lines,
    ):
        tight = await asyncio.gather(*[engine.generate(w, max_new_tokens=64) for w in work])
        stats = engine.stats()
    assert [r.output_ids for r in tight] == [r.output_ids for r in roomy]
    assert stats.evicted_tokens_total > 0 and stats.num_retracted_reqs > 0
    retract = [line for line in lines if "KV cache pool is full. Retract requests." in line]
    assert retract and re.search(
        r"#retracted_reqs: \d+, #new_tokens_gained: -?\d+, #new_token_ratio: \d\.\d{4} -> \d\.\d{4}$",
        retract[0],
    )
    assert (
        stats.available_tokens + stats.evictable_tokens + stats.protected_tokens == stats.max_total_num_tokens
    )


async def test_temperature_mixes_in_a_per_request_rng_unless_deterministic():
    ids = prompt(30, 555)
    async with engine_running(SimConfig(step_time_s=0)) as (engine, _):
        a = await engine.generate(ids, max_new_tokens=8, temperature=0.7)
        b = await engine.generate(ids, max_new_tokens=8, temperature=0.7)
    assert a.output_ids != b.output_ids
    async with engine_running(SimConfig(step_time_s=0, enable_deterministic_inference=True)) as (engine, _):
        c = await engine.generate(ids, max_new_tokens=8, temperature=0.7)
        d = await engine.generate(ids, max_new_tokens=8, temperature=0.7)
    assert c.output_ids == d.output_ids


async def replay(engine: Engine, plan) -> dict[tuple[str, int], list[int]]:
    """Send every planned call at its offset (copies as separate calls) and collect outputs."""
    start = time.monotonic()

    async def one(p):
        delay = start + p.offset_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        result = await engine.generate(p.input_ids, max_new_tokens=p.max_tokens)
        return (p.request_id, p.copy), result.output_ids

    return dict(await asyncio.gather(*[one(p) for p in plan]))


async def diverged_requests(
    page_size: int, *, disable: bool, runs: int = 4, scale: float = 0.25
) -> list[str]:
    trace = builtin_trace("finding_03330")
    if page_size != trace.page_size_hint:
        trace = rescale_prefixes(trace, page_size)
    trace = scale_offsets(trace, scale)
    plan = plan_requests(trace, seed=3)
    # Offsets x0.25: r02's page is allocated at ~11 ms, its copies match it one iteration later,
    # r02_b_s_b_s_s_s matches it again at 96 ms. A 10 ms window sits well inside that gap, so
    # only an event-loop stall of ~75 ms at the wrong moment could blur the two.
    fault = FaultSpec("block-boundary", seed=5, params={"window_ms": 10})
    config = SimConfig(
        page_size=page_size,
        max_total_tokens=131072,
        disable_radix_cache=disable,
        step_time_s=0.001,
        faults=(fault,),
    )
    outputs: dict[str, set] = defaultdict(set)
    async with engine_running(config) as (engine, _):
        for _ in range(runs):
            for (rid, copy), out in (await replay(engine, plan)).items():
                outputs[rid].add((copy, tuple(out)))
            assert engine.flush_cache()
    # A request diverged when some copy produced more than one output across the runs.
    return sorted(rid for rid, seen in outputs.items() if len(seen) > trace.request(rid).n)


@pytest.mark.parametrize("page_size", [64, 16])
async def test_block_boundary_diverges_exactly_the_one_page_prefix_in_the_first_burst(page_size):
    assert await diverged_requests(page_size, disable=False) == ["r02"]


async def test_block_boundary_is_gone_with_the_radix_cache_disabled():
    assert await diverged_requests(64, disable=True) == []


async def test_block_boundary_varies_between_replays_with_a_consistent_prefix():
    """Diverged outputs keep the u<stem> of the healthy one: the stale page changes the _lo parts."""
    trace = builtin_trace("finding_03330")
    r02 = trace.request("r02")
    from radixtop.incident.replay.trace import synthesize_input_ids

    first, second = synthesize_input_ids(r02, trace, 0, 0), synthesize_input_ids(r02, trace, 0, 1)
    config = SimConfig(
        page_size=64, step_time_s=0, faults=(FaultSpec("block-boundary", 0, {"window_ms": 10_000}),)
    )
    async with engine_running(config) as (engine, _):
        healthy = await engine.generate(second, max_new_tokens=8)
        assert engine.flush_cache()
        await engine.generate(first, max_new_tokens=8)  # allocates the shared page just now
        stale = await engine.generate(second, max_new_tokens=8)  # matches exactly that page
    assert stale.cached_tokens == 64
    assert stale.output_ids != healthy.output_ids
    assert stale.text.split("_")[0] == healthy.text.split("_")[0]


async def lock_race_run(
    max_running: int,
    seed: int = 1,
    tp_size: int = 1,
    disable: bool = False,
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    rank: int | None = None,
):
    config = SimConfig(
        max_total_tokens=4096,
        max_running_requests=max_running,
        step_time_s=0,
        tp_size=tp_size,
        nnodes=nnodes,
        node_rank=node_rank,
        disable_radix_cache=disable,
        faults=(FaultSpec("lock-race", seed=seed, params={} if rank is None else {"rank": rank}),),
    )
    lines: list[str] = []
    engine = Engine(config, lines.append)
    task = asyncio.create_task(engine.run())
    results = await asyncio.gather(
        *[engine.generate(w, max_new_tokens=64) for w in pressure_workload()], return_exceptions=True
    )
    engine.stop()
    async with asyncio.timeout(10):
        await task
    return engine, lines, results


async def test_lock_race_fires_under_pressure_and_kills_the_engine():
    engine, lines, results = await lock_race_run(32)
    assert engine.dead_reason == "RadixCacheError: Failed to lock memory page during dynamic prefix eviction"
    warn = next(
        i
        for i, line in enumerate(lines)
        if "WARNING: radix cache eviction contended with a page lock" in line
    )
    error = next(
        i
        for i, line in enumerate(lines)
        if "Scheduler hit an exception: Traceback (most recent call last):" in line
    )
    sigquit = [
        i
        for i, line in enumerate(lines)
        if "SIGQUIT received. signum=None, frame=None. It usually means one child failed." in line
    ]
    assert warn < error < sigquit[0] and len(sigquit) == 1
    assert (
        lines[error]
        .rstrip()
        .endswith("RadixCacheError: Failed to lock memory page during dynamic prefix eviction")
    )
    usage = float(re.search(r"token usage (\d\.\d\d)", lines[warn]).group(1))
    assert usage >= 0.90
    assert any(isinstance(r, EngineDead) for r in results)
    with pytest.raises(EngineDead, match="RadixCacheError"):
        await engine.generate([1, 2, 3], max_new_tokens=1)
    # Seeded: the same seed and workload fail the same way, at the same node.
    _, again, _ = await lock_race_run(32)
    assert [line.split("] ", 1)[1] for line in again if "WARNING" in line] == [
        line.split("] ", 1)[1] for line in lines if "WARNING" in line
    ]


async def test_lock_race_never_fires_under_bounded_pressure():
    engine, lines, results = await lock_race_run(2)
    assert engine.dead_reason is None
    assert not any("WARNING" in line or "exception" in line for line in lines)
    assert all(not isinstance(r, Exception) for r in results)
    assert engine.stats().evicted_tokens_total > 0  # evictions happened, just below the threshold


async def test_lock_race_cannot_fire_without_the_radix_cache_and_pressure_retracts_instead():
    # SGLang with --disable-radix-cache runs a chunk cache: no tree, no prefix eviction to race.
    engine, lines, results = await lock_race_run(32, disable=True)
    assert engine.dead_reason is None
    assert not any("WARNING" in line or "exception" in line for line in lines)
    assert engine.stats().num_retracted_reqs > 0  # the same pressure shows as retractions
    assert any("KV cache pool is full. Retract requests." in line for line in lines)
    assert all(not isinstance(r, Exception) for r in results)


async def test_lock_race_with_tp2_the_initiating_rank_speaks_then_the_parent():
    engine, lines, _ = await lock_race_run(32, seed=1, tp_size=2)
    assert engine.dead_reason is not None
    warn = next(line for line in lines if "WARNING: radix cache eviction" in line)
    rank = re.match(STAMP, warn).group("rank")
    error = next(i for i, line in enumerate(lines) if "Scheduler hit an exception" in line)
    assert re.match(STAMP, lines[error]).group("rank") == rank
    # SGLang 0.5.23: the parent's SIGQUIT handler writes it, with no rank, once.
    sigquit = [i for i, line in enumerate(lines) if "SIGQUIT received." in line]
    assert len(sigquit) == 1 and sigquit[0] > error and not re.match(STAMP, lines[sigquit[0]]).group("rank")


def test_lock_race_draws_its_rank_from_the_ranks_it_is_given_unless_one_is_named():
    def fired(spec: FaultSpec, ranks: range) -> int | None:
        race = FaultSet([spec]).lock_race
        assert race is not None
        return race.consider(0.95, 1, ranks)

    def drawn(seed: int, ranks: range) -> int:
        rng = random.Random(f"lock-race:{seed}")
        rng.random()  # the fire-or-not draw comes first
        return ranks[rng.randrange(len(ranks))]

    for seed in range(8):
        spec = FaultSpec("lock-race", seed, {"probability": 1})
        # One node: the draw randrange(tp_size) always made, so a seed keeps its rank.
        single = random.Random(f"lock-race:{seed}")
        single.random()
        assert fired(spec, range(4)) == drawn(seed, range(4)) == single.randrange(4)
        assert fired(spec, range(2, 4)) == drawn(seed, range(2, 4))
    assert {fired(FaultSpec("lock-race", seed, {"probability": 1}), range(2, 4)) for seed in range(8)} == {2, 3}
    assert fired(FaultSpec.parse("lock-race:seed=1,probability=1,rank=3"), range(2, 4)) == 3
    with pytest.raises(ValueError, match="rank must be a TP rank"):
        FaultSpec.parse("lock-race:rank=-1")


async def test_a_node_of_a_multi_node_tp_group_runs_its_share_of_the_ranks():
    workload = [prompt(60, 300 + i % 3, seed=i % 2) for i in range(9)]

    async def run(**node: int) -> tuple[Engine, list[str]]:
        config = SimConfig(tp_size=4, page_size=4, decode_log_interval=4, step_time_s=0, log_ms=False, **node)
        async with engine_running(config) as (engine, lines):
            for ids in workload:  # one at a time: both engines take the same decisions
                await engine.generate(ids, max_new_tokens=12)
        return engine, lines

    whole, _ = await run()
    engine, lines = await run(nnodes=2, node_rank=1)
    assert sorted(engine.caches) == [2, 3]
    ranked = {m.group("rank") for m in map(lambda x: re.match(STAMP, x), lines) if m and m.group("rank")}
    assert ranked == {" TP2", " TP3"}
    # TP0 writes the batch statistics and the pool's size: it runs on node 0.
    assert not any(text in x for x in lines for text in ("Prefill batch", "Decode batch", "max_total_num_tokens="))

    def shape(cache):
        return [(n.id, n.key.token_ids, n.value, n.lock_ref) for n in cache.iter_nodes()]

    # The same requests give this node's ranks the trees the whole group's ranks 2 and 3 have.
    assert shape(engine.caches[2]) and shape(engine.caches[2]) == shape(whole.caches[2])
    assert shape(engine.caches[3]) == shape(whole.caches[3])
    assert engine.rank_requests(3).waiting_queue == []
    assert engine.flush_cache() and lines[-1].endswith(" TP2] Cache flushed successfully!")


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"nnodes": 0}, "nnodes must be within 1..64, got 0"),
        ({"nnodes": 2, "node_rank": 2, "tp_size": 4}, "node_rank must be below the number of nodes (2), got 2"),
        ({"nnodes": 2, "tp_size": 3}, "tp_size must be a multiple of the number of nodes (2)"),
        ({"nnodes": 2, "tp_size": 4, "dp_size": 2}, "dp_size must be 1 when the TP group spans several nodes"),
    ],
)
def test_node_settings_are_checked(node: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        SimConfig(**node).validate()


async def test_lock_race_on_a_node_fires_on_its_ranks_or_the_named_one():
    engine, lines, _ = await lock_race_run(32, seed=1, tp_size=4, nnodes=2, node_rank=1)
    assert engine.dead_reason is not None
    warn = next(line for line in lines if "WARNING: radix cache eviction" in line)
    assert re.match(STAMP, warn).group("rank") in (" TP2", " TP3")
    engine, lines, _ = await lock_race_run(32, seed=1, tp_size=4, nnodes=2, node_rank=1, rank=3)
    for text in ("WARNING: radix cache eviction", "Scheduler hit an exception"):
        assert re.match(STAMP, next(x for x in lines if text in x)).group("rank") == " TP3"
    assert sorted(engine.dead_nodes) == [2, 3]
    with pytest.raises(ValueError, match=re.escape("rank=1 is not a TP rank this node runs (2, 3)")):
        SimConfig(tp_size=4, nnodes=2, node_rank=1, faults=(FaultSpec("lock-race", 0, {"rank": 1}),)).validate()


async def test_leak_is_real_and_the_idle_check_logs_sglang_0523_wording():
    config = SimConfig(page_size=4, step_time_s=0, faults=(FaultSpec("leak", 0),))
    async with engine_running(config) as (engine, lines):
        await engine.generate(prompt(40, 99), max_new_tokens=10)
        for _ in range(100):
            if any("memory leak detected" in line for line in lines):
                break
            await asyncio.sleep(0.01)
        stats = engine.stats()
    line = next(line for line in lines if "memory leak detected" in line)
    m = re.search(
        r"\] pool memory leak detected! \[full\] total=(\d+), available=(\d+), evictable=(\d+), "
        r"protected=(\d+), session_held=0, uncached=0$",
        line,
    )
    total, available, evictable, protected = map(int, m.groups())
    assert total - (available + evictable + protected) == 4  # one page really leaked
    assert stats.available_tokens + stats.evictable_tokens + stats.protected_tokens == total - 4
    assert sum("memory leak detected" in x for x in lines) == 1  # raise_error_or_warn: 1st of every 1000


async def test_leak_legacy_wording_and_strict_mode_kills():
    config = SimConfig(step_time_s=0, faults=(FaultSpec("leak", 0, {"style": "legacy"}),))
    async with engine_running(config) as (engine, lines):
        await engine.generate(prompt(10, 98), max_new_tokens=3)
        await asyncio.sleep(0.15)
    assert any(
        re.search(
            r"token_to_kv_pool_allocator memory leak detected! available_size=\d+, evictable_size=\d+, "
            r"protected_size=\d+, max_total_num_tokens=16384",
            x,
        )
        for x in lines
    )
    config = SimConfig(step_time_s=0, faults=(FaultSpec.parse("leak:strict=true"),))
    lines = []
    engine = Engine(config, lines.append)
    task = asyncio.create_task(engine.run())
    await engine.generate(prompt(10, 97), max_new_tokens=3)
    async with asyncio.timeout(5):
        await task  # the idle check raises and the scheduler dies
    assert engine.dead_reason.startswith("ValueError: pool memory leak detected!")
    assert any("Scheduler hit an exception" in x and "ValueError: pool memory leak" in x for x in lines)


async def test_no_fault_no_leak_line():
    async with engine_running(SimConfig(step_time_s=0)) as (engine, lines):
        await engine.generate(prompt(10, 96), max_new_tokens=3)
        await asyncio.sleep(0.12)
    assert not any("leak" in line for line in lines)


async def test_double_unlock_drives_lock_ref_negative_silently():
    config = SimConfig(
        tp_size=2, step_time_s=0, faults=(FaultSpec("double-unlock", 0, {"probability": 1.0}),)
    )
    async with engine_running(config) as (engine, lines):
        await engine.generate(prompt(20, 95), max_new_tokens=4)
        for cache in engine.caches.values():
            assert min(n.lock_ref for n in cache.iter_nodes()) == -1
    assert not any("WARNING" in line or "exception" in line for line in lines)
    async with engine_running(SimConfig(step_time_s=0)) as (engine, _):
        await engine.generate(prompt(20, 95), max_new_tokens=4)
        assert min(n.lock_ref for n in engine.caches[0].iter_nodes()) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"input_ids": [], "max_new_tokens": 4}, "input_ids is empty"),
        ({"input_ids": [1, 2], "max_new_tokens": -1}, "max_new_tokens must be >= 0"),
        ({"input_ids": [1, "x"], "max_new_tokens": 4}, r"input_ids\[1\] must be an integer"),
        (
            {"input_ids": [1, 1 << 30], "max_new_tokens": 4},
            r"input_ids\[1\]=1073741824 is outside the vocabulary",
        ),
        ({"input_ids": [1] * 60, "max_new_tokens": 10}, r"= 70 tokens exceeds the KV pool \(64 tokens\)"),
        ({"input_ids": [1], "max_new_tokens": 1, "temperature": -1}, "temperature must be a number >= 0"),
        ({"input_ids": "hello", "max_new_tokens": 1}, "input_ids must be a list"),
    ],
)
async def test_bad_input_raises_a_clear_value_error(kwargs, message):
    async with engine_running(SimConfig(max_total_tokens=64, step_time_s=0)) as (engine, _):
        with pytest.raises(ValueError, match=message):
            await engine.generate(**kwargs)
        assert (await engine.generate([1, 2], max_new_tokens=1)).completion_tokens == 1  # still serving


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (SimConfig(page_size=0), "page_size must be >= 1"),
        (SimConfig(max_total_tokens=8, page_size=16), "must hold at least one page"),
        (SimConfig(radix_eviction_policy="random"), "radix_eviction_policy must be one of"),
        (SimConfig(faults=(FaultSpec("meltdown"),)), "unknown fault 'meltdown'"),
        (
            SimConfig(faults=(FaultSpec("lock-race", 0, {"treshold": 0.5}),)),
            r"unknown parameter\(s\) treshold",
        ),
        (
            SimConfig(faults=(FaultSpec("lock-race", 0, {"threshold": 2}),)),
            r"threshold must be within \[0, 1\]",
        ),
    ],
)
def test_bad_config_raises_a_clear_value_error(config, message):
    with pytest.raises(ValueError, match=message):
        Engine(config, lambda line: None)


def test_fault_spec_parse():
    spec = FaultSpec.parse("block-boundary:seed=4,window_ms=20")
    assert (spec.name, spec.seed, dict(spec.params)) == ("block-boundary", 4, {"window_ms": "20"})
    with pytest.raises(ValueError, match="expected key=value"):
        FaultSpec.parse("leak:strict")
    with pytest.raises(ValueError, match="must be float"):
        FaultSpec.parse("lock-race:threshold=high")


async def test_prefill_and_decode_lines_parse_as_sglang_writes_them():
    config = SimConfig(decode_log_interval=5, step_time_s=0)
    async with engine_running(config) as (engine, lines):
        await asyncio.gather(*[engine.generate(prompt(30, 60 + i), max_new_tokens=12) for i in range(3)])
    prefill = [PREFILL.match(line) for line in lines if "Prefill batch" in line]
    decode = [DECODE.match(line) for line in lines if "Decode batch" in line]
    assert prefill and all(prefill) and decode and all(decode)
    assert int(prefill[0]["seq"]) == 3 and int(prefill[0]["new"]) == 90 and prefill[0]["rank"] == ""
    assert int(decode[0]["running"]) == 3
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}", prefill[0]["time"])
    assert (
        "#pending-token: 0, cuda graph: False, input throughput (token/s): "
        in lines[next(i for i, x in enumerate(lines) if "Prefill batch" in x)]
    )


async def test_rank_prefixes_and_which_ranks_log_what():
    config = SimConfig(tp_size=2, dp_size=2, decode_log_interval=4, step_time_s=0, log_ms=False)
    async with engine_running(config) as (engine, lines):
        await asyncio.gather(*[engine.generate(prompt(20, 70 + i), max_new_tokens=8) for i in range(4)])
        engine.emit_ready()
    ranks = lambda text: sorted({re.match(STAMP, x).group("rank") for x in lines if text in x})  # noqa: E731
    assert ranks("KV Cache is allocated") == [" DP0 TP0", " DP0 TP1", " DP1 TP0", " DP1 TP1"]
    # Batch statistics come from the first TP rank of each DP group only (is_stats_logging_rank).
    assert ranks("Prefill batch") == [" DP0 TP0", " DP1 TP0"]
    assert ranks("Decode batch") == [" DP0 TP0", " DP1 TP0"]
    assert re.fullmatch(
        r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] The server is fired up and ready to roll!", lines[-1]
    )
    assert sorted(engine.caches) == [0, 1, 2, 3]


async def test_tp_ranks_mirror_the_same_tree():
    config = SimConfig(tp_size=3, page_size=2, max_total_tokens=512, step_time_s=0)
    async with engine_running(config) as (engine, _):
        await asyncio.gather(
            *[engine.generate(prompt(70, 80 + i % 3, seed=i % 2), max_new_tokens=20) for i in range(12)]
        )

        def shape(cache):
            return [(n.id, n.key.token_ids, n.value, n.lock_ref) for n in cache.iter_nodes()]

        caches = engine.caches
        assert shape(caches[0]) and shape(caches[0]) == shape(caches[1]) == shape(caches[2])
        assert engine.stats().evicted_tokens_total > 0


async def test_flush_cache_refuses_while_running_and_resets_when_idle():
    async with engine_running(SimConfig(step_time_s=0.002)) as (engine, lines):
        job = asyncio.create_task(engine.generate(prompt(20, 90), max_new_tokens=30))
        await asyncio.sleep(0.01)
        assert engine.flush_cache() is False
        await job
        assert engine.stats().evictable_tokens > 0
        assert engine.flush_cache() is True
        stats = engine.stats()
    assert stats.evictable_tokens == 0 and stats.available_tokens == stats.max_total_num_tokens
    assert any(
        "Cache not flushed because there are pending requests. #queue-req: 0, #running-req: 1" in x
        for x in lines
    )
    assert any(x.endswith("] Cache flushed successfully!") for x in lines)


async def test_safe_point_hooks_run_each_iteration_and_cannot_kill_the_engine():
    calls: list[int] = []
    async with engine_running(SimConfig(step_time_s=0)) as (engine, _):
        engine.on_safe_point.append(lambda: calls.append(engine.iteration))
        engine.on_safe_point.append(lambda: 1 / 0)
        result = await engine.generate(prompt(10, 91), max_new_tokens=6)
    assert result.completion_tokens == 6
    assert len(calls) >= 6 and calls == sorted(set(calls))
    assert engine.safe_point_errors >= 6 and engine.dead_reason is None


async def test_stop_fails_pending_requests_and_cancel_frees_the_kv():
    lines: list[str] = []
    engine = Engine(SimConfig(step_time_s=0.002), lines.append)
    task = asyncio.create_task(engine.run())
    cancelled = asyncio.create_task(engine.generate(prompt(30, 92), max_new_tokens=500))
    await asyncio.sleep(0.02)
    cancelled.cancel()
    for _ in range(100):
        if engine.stats().num_running_reqs == 0:
            break
        await asyncio.sleep(0.005)
    stats = engine.stats()
    assert stats.num_running_reqs == 0 and stats.protected_tokens == 0
    pending = asyncio.create_task(engine.generate(prompt(30, 93), max_new_tokens=500))
    await asyncio.sleep(0.01)
    engine.stop()
    async with asyncio.timeout(5):
        await task
    with pytest.raises(EngineDead, match="engine stopped"):
        await pending
    assert engine.dead_reason is None


def test_a_request_waits_for_the_page_another_in_its_batch_computes_after_the_same_prefix() -> None:
    engine = Engine(SimConfig(page_size=4, step_time_s=0), None, kv_contents=False)
    futures: list[Future[GenerateResult]] = []

    def submit(*tokens: int) -> None:
        futures.append(Future())
        engine.submit(list(tokens), max_new_tokens=2, future=futures[-1])

    submit(1, 2, 3, 4, 9, 9, 9, 9, 5)
    submit(5, 6, 7, 8, 9, 9, 9, 9, 5)
    while not all(f.done() for f in futures):
        engine.iterate()
    submit(1, 2, 3, 4, 7, 7, 7, 7, 8, 8, 8, 8, 1)  # matches a page, then computes [7, 7, 7, 7]
    submit(5, 6, 7, 8, 7, 7, 7, 7, 8, 8, 8, 8, 1)  # the same page after another prefix: computes it too
    submit(1, 2, 3, 4, 7, 7, 7, 7, 6, 6, 6, 6, 1)  # the first one's next page: waits to match it
    engine.iterate()
    assert [f.done() or None for f in futures[2:]] == [None, None, None]
    sched = engine._schedulers[0]
    assert [r.origin_input_ids[0] for r in sched.running] == [1, 5]
    assert [r.origin_input_ids[8] for r in sched.waiting] == [6]
    while not all(f.done() for f in futures):
        engine.iterate()
    assert futures[4].result().cached_tokens == 8  # the page the first one computed
