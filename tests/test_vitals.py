"""probes/vitals: log lines and /metrics into per-second series; /metrics wins over the log."""

from __future__ import annotations

import time

import pytest

from radixtop.probes.sglang import ServerMetrics
from radixtop.session.vitals import LIVE_TAIL_LINES, Series, Vitals, live_lines, log_observations

LINES = [
    "[2026-12-02 14:00:00 TP0] Prefill batch, #new-seq: 2, #new-token: 300, #cached-token: 100, token usage: 0.42, "
    "#running-req: 5, #queue-req: 3, ",
    "[2026-12-02 14:00:01 TP0] Decode batch, #running-req: 7, #token: 900, token usage: 0.55, cuda graph: True, "
    "gen throughput (token/s): 812.4, #queue-req: 1, ",
    "[2026-12-02 14:00:02 TP0] KV cache pool is full. Retract requests. "
    "#retracted_reqs: 4, #new_token_ratio: 0.5 -> 0.7",
    "[2026-12-02 14:00:02] INFO:     127.0.0.1:5555 - \"POST /generate HTTP/1.1\" 200 OK",
    "INFO 12-02 14:00:03 [loggers.py:123] Engine 000: Avg prompt throughput: 10.0 tokens/s, "
    "Avg generation throughput: 50.0 tokens/s, Running: 3 reqs, Waiting: 2 reqs, "
    "GPU KV cache usage: 61.5%, Prefix cache hit rate: 40.0%",
    "a batch of nothing",
]


def _epoch(clock: str) -> float:
    return time.mktime(time.strptime(f"2026-12-02 {clock}", "%Y-%m-%d %H:%M:%S"))


def test_log_lines_become_observations() -> None:
    obs = log_observations(LINES)
    got = {(o.key, o.value) for o in obs}
    assert ("token_usage", 0.42) in got and ("running", 5) in got and ("queued", 3) in got
    assert ("cache_hit_rate", 0.25) in got, "cached / (new + cached) from a prefill line"
    assert ("token_usage", 0.55) in got and ("running", 7) in got and ("queued", 1) in got
    assert ("retracted", 4.0) in got
    assert ("running", 3.0) in got and ("queued", 2.0) in got  # vLLM
    assert ("token_usage", 0.615) in got and ("cache_hit_rate", 0.4) in got
    first = next(o for o in obs if o.key == "token_usage")
    assert first.time == _epoch("14:00:00") and first.rank == "TP0"


def test_metrics_take_precedence_over_the_log() -> None:
    v = Vitals()
    t = 1_000_000.0
    v.feed_metrics(ServerMetrics("sglang", {"token_usage": 0.9, "running": 3.0, "evicted_tokens_total": 100.0}), t)
    v.feed_log(log_observations([LINES[1]], now=t))  # has a time of its own, far from t: accepted
    assert v.series["token_usage"].source == "log"
    v2 = Vitals()
    v2.feed_metrics(ServerMetrics("sglang", {"token_usage": 0.9}), t)
    from radixtop.session.vitals import Observation

    v2.feed_log([Observation(t + 1, "token_usage", 0.1)])
    assert v2.series["token_usage"].last == 0.9 and v2.series["token_usage"].source == "metrics"
    v2.feed_log([Observation(t + 60, "token_usage", 0.2)])
    assert v2.series["token_usage"].last == 0.2, "a log value is taken once /metrics has gone quiet"


def test_counters_become_rates_and_resets_are_not_negative() -> None:
    v = Vitals()
    v.feed_metrics(ServerMetrics("sglang", {"evicted_tokens_total": 100.0}), 10.0)
    assert v.series["evicted_tokens"].last is None
    v.feed_metrics(ServerMetrics("sglang", {"evicted_tokens_total": 300.0}), 12.0)
    assert v.series["evicted_tokens"].last == pytest.approx(100.0)
    v.feed_metrics(ServerMetrics("sglang", {"evicted_tokens_total": 5.0}), 14.0)  # the server restarted
    assert v.series["evicted_tokens"].last == pytest.approx(100.0)
    # vLLM: hit rate from the two counters
    v.feed_metrics(ServerMetrics("vllm", {"prefix_queries_total": 100.0, "prefix_hits_total": 10.0}), 10.0)
    v.feed_metrics(ServerMetrics("vllm", {"prefix_queries_total": 200.0, "prefix_hits_total": 60.0}), 12.0)
    assert v.series["cache_hit_rate"].last == pytest.approx(0.5)


def test_series_window_and_bounds() -> None:
    s = Series("last", history_s=5)
    for t in range(10):
        s.add(100.0 + t, float(t), "log")
    assert len(s.points) == 5
    assert s.window(109.0, 5) == [5.0, 6.0, 7.0, 8.0, 9.0]
    assert s.window(109.0, 3, seconds_per_column=2) == [5.0, 7.0, 9.0]
    s.add(107.5, 70.0, "log")  # late value: folds into its own second
    assert s.window(109.0, 5)[2] == 70.0
    m = Series("max")
    m.add(5.2, 3.0, "log")
    m.add(5.7, 1.0, "log")
    assert m.last == 3.0
    s.add(float("nan"), 1.0, "log")
    s.add(111.0, float("inf"), "log")
    assert s.last == 9.0


def test_marks_are_kept_in_order_and_deduplicated() -> None:
    v = Vitals()
    v.mark(20.0, "b")
    v.mark(10.0, "a")
    v.mark(10.2, "a")
    assert v.marks == [(10.0, "a"), (20.0, "b")]
    assert v.first_mark == (10.0, "a")


def test_latest_only_parses_the_last_line_of_each_kind() -> None:
    lines = [LINES[0].replace("0.42", "0.11"), LINES[0], LINES[1].replace("0.55", "0.22"), LINES[1], LINES[2]]
    obs = log_observations(lines, latest_only=True)
    usages = [o.value for o in obs if o.key == "token_usage"]
    assert usages == [0.42, 0.55], "one prefill and one decode line: the last of each"
    assert ("retracted", 4.0) in {(o.key, o.value) for o in obs}
    times = [o.time for o in obs]
    assert times == sorted(times)


def test_short_gaps_are_filled_but_nothing_after_the_last_value() -> None:
    s = Series("last")
    for t in (100.0, 102.0, 104.0, 120.0):
        s.add(t, t - 100, "metrics")
    got = s.window(124.0, 25, fill_s=6.0)
    assert got[:5] == [0.0, 0.0, 2.0, 2.0, 4.0], "a 2 s poll does not leave holes"
    assert got[5:20] == [None] * 15, "a 16 s silence stays a gap"
    assert got[20] == 20.0 and got[21:] == [None] * 4, "nothing is invented after the last value"


# ----------------------------------------------------------------------------------------------
# The simulator's /metrics gauges, as SGLang sets them (the vitals pane reads both sides)


def test_sim_metrics_keep_the_last_batch_lines_token_usage_after_a_burst(tmp_path) -> None:
    """SGLang sets its scheduler gauges where it writes a batch line; /metrics keeps them while the
    server idles. Computed at the scrape instead, once the requests finished their tokens would
    be evictable and /metrics would say 0.0 while the last batch line said 0.12 (in the demo, 0 %
    on the vitals pane against 0.92 in the log)."""
    import httpx
    from pane_helpers import start_sim, stop

    from radixtop.probes.sglang import parse_metrics

    proc, url, log = start_sim(tmp_path, "--enable-metrics", "--max-total-tokens", "4096")
    try:
        with httpx.Client(base_url=url, timeout=10.0) as c:
            for first in (1, 1000):  # two prompts that share nothing: both stay in the cache
                body = {"input_ids": list(range(first, first + 400)), "sampling_params": {"max_new_tokens": 50}}
                assert c.post("/generate", json=body).status_code == 200
            metrics = parse_metrics(c.get("/metrics").text)
    finally:
        stop(proc)
    logged = [ob for ob in log_observations(log.read_text().splitlines()) if ob.key == "token_usage"]
    assert logged, "the simulator wrote no batch line"
    assert logged[-1].value > 0.1
    assert metrics.get("token_usage") == pytest.approx(logged[-1].value, abs=0.006)


def test_stats_latch_refreshes_while_idle() -> None:
    from radixtop.sim.metrics import IDLE_REFRESH_S, StatsLatch

    now = [0.0]
    values = iter(range(100))
    latch = StatsLatch(lambda: next(values), clock=lambda: now[0])
    assert latch.current() == 0, "no batch line yet: taken at the scrape"
    latch.observe_line("[2026-12-02 14:00:01 TP0] Decode batch, #running-req: 7, token usage: 0.55")
    latch.observe_line('[2026-12-02 14:00:02] INFO:     127.0.0.1:5555 - "GET /metrics HTTP/1.1" 200 OK')
    now[0] = IDLE_REFRESH_S - 1
    assert latch.current() == 1, "the batch line's stats, not the scrape's"
    now[0] = IDLE_REFRESH_S + 1
    assert latch.current() == 2, "refreshed once the server has been idle for 30 s"


async def test_sim_metrics_latch_the_gauges_at_each_batch_line_through_the_engines_hook() -> None:
    """The engine tells its subscribers each batch line it writes (Engine.on_batch_line), and
    SimMetrics subscribes its latch there: the gauges are the engine's stats as of that line.
    The engine's log sink itself is left alone (not wrapped through stats.__self__)."""
    import asyncio

    from radixtop.sim.engine import Engine, SimConfig
    from radixtop.sim.metrics import SimMetrics

    lines: list[str] = []
    engine = Engine(SimConfig(page_size=16, step_time_s=0), lines.append)
    sink = engine._emit_fn
    metrics = SimMetrics(engine.stats, model_name="m")
    assert engine.on_batch_line == [metrics.gauges.observe_line]
    assert engine._emit_fn is sink, "the log sink is not wrapped"
    heard: list[str] = []
    engine.on_batch_line.append(heard.append)
    latched_at: list[float] = []
    engine.on_batch_line.append(lambda line: latched_at.append(metrics.gauges.current().token_usage))
    task = asyncio.create_task(engine.run())
    try:
        async with asyncio.timeout(10):
            await engine.generate(list(range(1, 400)), max_new_tokens=40)
    finally:
        engine.stop()
        async with asyncio.timeout(10):
            await task
    batch = [line for line in lines if "Prefill batch" in line or "Decode batch" in line]
    assert batch and heard == [line.split("] ", 1)[1] for line in batch], "every batch line, and only those"
    usages = [float(line.split("token usage: ")[1].split(",")[0]) for line in batch]
    assert latched_at == pytest.approx(usages, abs=0.006), "the gauges as of each batch line"


def test_a_live_batch_is_read_from_its_tail_but_every_retraction_and_vllm_stats_line_counts() -> None:
    decode = (
        "[2026-12-02 14:00:0{s} TP0] Decode batch, #running-req: 9, #token: 100, token usage: 0.{u:02d}, #queue-req: 0"
    )
    flood = [decode.format(s=i * 5 // 3000, u=10 + i * 80 // 3000) for i in range(3000)]
    retract = (
        "[2026-12-02 14:00:00 TP1] KV cache pool is full. Retract requests. "
        "#retracted_reqs: 3, #new_token_ratio: 0.4 -> 0.5"
    )
    vllm = "INFO 12-02 14:00:01 [loggers.py:1] Running: 4 reqs, Waiting: 2 reqs, GPU KV cache usage: 37.5%"
    batch = flood[:10] + [retract] + flood[10:20] + [vllm] + flood[20:]
    read = live_lines(batch)
    assert list(read) == [retract, vllm, *batch[-LIVE_TAIL_LINES:]]
    assert live_lines(flood[:LIVE_TAIL_LINES]) == flood[:LIVE_TAIL_LINES]  # a small batch: all of it
    assert list(live_lines(flood)) == flood[-LIVE_TAIL_LINES:]
    obs = log_observations(read, latest_only=True)
    assert ("retracted", 3.0) in {(o.key, o.value) for o in obs}
    assert ("token_usage", 0.375) in {(o.key, o.value) for o in obs}
    usages = [o.value for o in obs if o.key == "token_usage" and o.rank == "TP0"]
    assert usages[-1] == 0.89  # the newest value of the flood


def test_lines_kept_across_batches_are_live_lines_of_the_batches_joined() -> None:
    """LiveLines: what the vitals read a few times a second is what live_lines makes of every
    batch since, joined: its last lines and each retraction or vLLM stats line before them."""
    import random

    from radixtop.session.vitals import LiveLines

    decode = "[2026-12-02 14:00:0{s} TP0] Decode batch, #running-req: 9, #token: 100, token usage: 0.{u:02d}"
    retract = "[2026-12-02 14:00:00 TP1] KV cache pool is full. Retract requests. #retracted_reqs: {n}"
    rng = random.Random(3)
    for _ in range(40):
        lines = [retract.format(n=i) if rng.random() < 0.02 else decode.format(s=i // 400, u=i % 100)
                 for i in range(rng.randrange(1, 2500))]
        kept, at = LiveLines(), 0
        while at < len(lines):
            size = rng.choice((1, 7, 300, 499, 500, 501, 1200))
            kept.add(lines[at : at + size])
            at += size
        assert len(kept) == len(lines)
        head = lines[: max(0, len(lines) - LIVE_TAIL_LINES)]
        expected = [line for line in head if "Retract" in line] + lines[len(head) :]
        assert kept.take() == expected == list(live_lines(lines))
        assert kept.take() == [] and len(kept) == 0  # taken: nothing left to read twice
