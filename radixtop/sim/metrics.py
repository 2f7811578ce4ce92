"""`/metrics` in Prometheus text with SGLang's metric names and labels (sglang 0.5.23).

Scheduler gauges (`sglang:token_usage`, ...) carry `model_name, engine_type, tp_rank, pp_rank,
moe_ep_rank` and come from TP rank 0 only, as in SGLang where only the stats-logging rank reports.
Radix-cache metrics (`sglang:evicted_tokens_total`, `sglang:eviction_duration_seconds`) carry
`cache_type, tp_rank, pp_rank, dp_rank`, one series per rank. A node of a TP group spread over
machines without TP0 (`--node-rank 1`) reports only its ranks' radix-cache series: SGLang's
stats-logging rank, the one that sets the gauges, is TP0. Token counters
(`sglang:prompt_tokens_total`, `sglang:generation_tokens_total`) are the tokenizer's:
`model_name, engine_type, is_streaming`.

Everything is yielded by one collector in a CollectorRegistry of its own (never the global one);
no `_created` series are written, because SGLang's multiprocess collector writes none.

When the gauges are taken, as in SGLang: its scheduler sets them where it writes its `Prefill batch`
and `Decode batch` lines (`log_prefill_stats`, `log_decode_stats`), and while idle refreshes them
every 30 s (`check_memory`); a scrape reads whatever was set last. So after a burst, /metrics keeps
the token usage of the last batch line (0.92, say) rather than the idle pool's 0.0. The simulator's
engine calls `StatsLatch.observe_line` for each of those lines (`Engine.on_batch_line`), which
takes `engine.stats()` then; the radix-cache counters and the tokenizer's token counters move live, as SGLang's do.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector

ENGINE_TYPE = "unified"  # DisaggregationMode.to_engine_type for a non-disaggregated server
CACHE_TYPE = "RadixCache"  # the cache class name SGLang puts in cache_type
# SGLang's bucket_eviction_duration.
EVICTION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)

SCHEDULER_GAUGES = (
    # (metric name, EngineStats field, documentation as SGLang writes it)
    ("sglang:num_running_reqs", "num_running_reqs", "The number of running requests."),
    ("sglang:num_queue_reqs", "num_queue_reqs", "The number of requests in the waiting queue."),
    ("sglang:gen_throughput", "gen_throughput", "The generation throughput (token/s)."),
    ("sglang:cache_hit_rate", "cache_hit_rate", "The prefix cache hit rate."),
    ("sglang:token_usage", "token_usage", "The token usage."),
    ("sglang:kv_available_tokens", "available_tokens", "Number of free token slots in the KV cache pool."),
    (
        "sglang:kv_evictable_tokens",
        "evictable_tokens",
        "Number of evictable (radix-cached) token slots in the KV cache pool.",
    ),
    ("sglang:num_retracted_reqs", "num_retracted_reqs", "The number of retracted requests."),
)
STATS_LINES = ("Prefill batch", "Decode batch")  # where SGLang's scheduler sets its gauges
IDLE_REFRESH_S = 30.0  # SGLang's check_memory: "During idle time, also collect metrics every 30 seconds."


class StatsLatch:
    """The scheduler gauges' values as SGLang would report them: the engine's stats taken when it
    writes a batch line (`observe_line`), or, when no batch line came for IDLE_REFRESH_S (an idle
    server, or none yet), at the scrape."""

    def __init__(self, stats: Callable[[], Any], *, clock: Callable[[], float] = time.monotonic) -> None:
        self._stats = stats
        self._clock = clock
        self._latched: Any = None
        self._latched_at = -float("inf")

    def observe_line(self, line: str) -> None:
        if "batch, #" in line and any(kind in line for kind in STATS_LINES):
            self.latch()

    def latch(self) -> None:
        self._latched = self._stats()
        self._latched_at = self._clock()

    def current(self) -> Any:
        if self._latched is None or self._clock() - self._latched_at >= IDLE_REFRESH_S:
            self.latch()
        return self._latched


def batch_line_hooks(stats: Callable[[], Any]) -> list[Callable[[str], None]] | None:
    """The simulator Engine's `on_batch_line` list when `stats` is an Engine's bound `stats`
    (None otherwise: the gauges are then taken at each scrape)."""
    hooks = getattr(getattr(stats, "__self__", None), "on_batch_line", None)
    return hooks if isinstance(hooks, list) else None


class _Histogram:
    """Bucket counts for one label set."""

    def __init__(self) -> None:
        self.counts = [0] * (len(EVICTION_BUCKETS) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(EVICTION_BUCKETS, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, count in zip([*map(str, EVICTION_BUCKETS), "+Inf"], self.counts, strict=False):
            running += count
            out.append((bound, float(running)))
        return out


class SimMetrics(Collector):
    """The simulator's metrics, in a registry of their own."""

    def __init__(
        self,
        stats: Callable[[], Any],
        *,
        model_name: str,
        tp_size: int = 1,
        dp_size: int = 1,
        batch_lines: list[Callable[[str], None]] | None = None,
        tp_ranks: Sequence[int] | None = None,
    ):
        """`tp_ranks`: the TP ranks this server runs (a node's share of a group spread over
        machines; default all of `tp_size`)."""
        self._stats = stats
        self.gauges = StatsLatch(stats)
        # The engine's batch-line subscribers (Engine.on_batch_line); found from `stats` when not given.
        hooks = batch_lines if batch_lines is not None else batch_line_hooks(stats)
        if hooks is not None:  # the engine tells us its batch lines (Engine.on_batch_line)
            hooks.append(self.gauges.observe_line)
        self._scheduler_labels = {
            "model_name": model_name,
            "engine_type": ENGINE_TYPE,
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        if dp_size > 1:
            self._scheduler_labels["dp_rank"] = "0"
        ranks = range(tp_size) if tp_ranks is None else tp_ranks
        self._reports_gauges = 0 in ranks
        # Rank index r = tp + dp * tp_size, as radixtop.sim.cli numbers the debug endpoints.
        self.rank_labels = {
            dp * tp_size + tp: {"cache_type": CACHE_TYPE, "tp_rank": str(tp), "pp_rank": "0", "dp_rank": str(dp)}
            for dp in range(dp_size)
            for tp in ranks
        }
        self._evictions = {rank: _Histogram() for rank in self.rank_labels}
        self._model_name = model_name
        self._prompt_tokens = {False: 0, True: 0}
        self._generation_tokens = {False: 0, True: 0}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def observe_request(self, prompt_tokens: int, completion_tokens: int, streaming: bool) -> None:
        self._prompt_tokens[bool(streaming)] += prompt_tokens
        self._generation_tokens[bool(streaming)] += completion_tokens

    def observe_eviction(self, rank_index: int, seconds: float) -> None:
        """One eviction pass on rank `rank_index` took `seconds`."""
        self._evictions[rank_index].observe(seconds)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_PLAIN_0_0_4

    def collect(self) -> Iterable[Any]:
        stats = self._stats()  # live: the radix-cache counters
        gauges = self.gauges.current()  # as of the last batch line (SGLang's scheduler gauges)
        names, values = list(self._scheduler_labels), list(self._scheduler_labels.values())
        for metric, attr, doc in SCHEDULER_GAUGES if self._reports_gauges else ():
            family = GaugeMetricFamily(metric, doc, labels=names)
            family.add_metric(values, float(getattr(gauges, attr)))
            yield family

        rank_names = list(next(iter(self.rank_labels.values())))
        # One pool count per rank: TP ranks replicate the tree, so each evicts the same tokens.
        evicted = CounterMetricFamily(
            "sglang:evicted_tokens",
            "The number of device KV token slots freed by eviction.",
            labels=rank_names,
        )
        duration = HistogramMetricFamily(
            "sglang:eviction_duration_seconds",
            "End-to-end time of a device eviction pass in seconds.",
            labels=rank_names,
        )
        for rank, labels in self.rank_labels.items():
            histogram = self._evictions[rank]
            evicted.add_metric(list(labels.values()), float(stats.evicted_tokens_total))
            duration.add_metric(list(labels.values()), histogram.buckets(), histogram.total)
        yield evicted
        yield duration

        token_names = ["model_name", "engine_type", "is_streaming"]
        for metric, doc, counts in (
            ("sglang:prompt_tokens", "Number of prefill tokens processed.", self._prompt_tokens),
            ("sglang:generation_tokens", "Number of generation tokens processed.", self._generation_tokens),
        ):
            counter = CounterMetricFamily(metric, doc, labels=token_names)
            for streaming, count in counts.items():
                counter.add_metric([self._model_name, ENGINE_TYPE, str(streaming).lower()], float(count))
            yield counter
