"""The server's vital signs over time: token usage, running and queued requests, cache hit rate,
evictions, retractions, GPU memory. Pure Python: no I/O, no Textual.

Where each comes from, best first:
- /metrics when the server has `--enable-metrics` (SGLang's gauges; vLLM's KV-usage, queue and
  prefix-cache counters): `Vitals.feed_metrics`;
- otherwise the log: SGLang's `Prefill batch`/`Decode batch` lines (token usage, running, queued,
  cached/new tokens for a hit rate), `KV cache pool is full. Retract requests. #retracted_reqs: N`,
  and vLLM's periodic `Running: N reqs, Waiting: N reqs, GPU KV cache usage: x%, Prefix cache hit
  rate: y%` line: `log_observations` picks them out of a batch of lines (cheap substring checks
  first; it runs on the ingest thread), `Vitals.feed_log` takes them;
- evictions from the debug endpoint's counters when /metrics has none (`feed_radix`), GPU memory
  from NVML (`feed_gpu`).
A log value for a series is ignored while /metrics has fed that series recently, so the two never
interleave on one plot. Each series keeps one value per second (the last, or the sum for counts of
events), bounded in length; `marks` holds the moments the first signatures appeared.
"""

from __future__ import annotations

import math
import re
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from radixtop.diagnosis.logline import parse_line
from radixtop.diagnosis.matcher import Matcher
from radixtop.diagnosis.needles import RARE_NEEDLES

HISTORY_S = 1800  # seconds of history kept per series
METRICS_PRECEDENCE_S = 15.0  # a series fed by /metrics this recently ignores the log


@dataclass(frozen=True, slots=True)
class SeriesSpec:
    key: str
    title: str
    unit: str  # "ratio" (0..1), "count", "rate" (per second), "bytes"
    how: str = "last"  # "last" value in a second, or the "max" of the second's values


SPECS: tuple[SeriesSpec, ...] = (
    SeriesSpec("token_usage", "token usage", "ratio"),
    SeriesSpec("running", "running reqs", "count"),
    SeriesSpec("queued", "queued reqs", "count"),
    SeriesSpec("cache_hit_rate", "cache hit rate", "ratio"),
    SeriesSpec("evicted_tokens", "evicted tok/s", "rate"),
    SeriesSpec("retracted", "retractions", "count", "max"),
    SeriesSpec("gpu_memory", "GPU memory", "ratio"),
)
SPEC_BY_KEY = {s.key: s for s in SPECS}


class Series:
    """One value per whole second, the newest HISTORY_S seconds."""

    __slots__ = ("how", "points", "source", "updated")

    def __init__(self, how: str = "last", history_s: int = HISTORY_S) -> None:
        self.how = how
        self.points: deque[list[float]] = deque(maxlen=history_s)  # [second, value]
        self.source = ""  # "metrics", "log", "radix", "nvml"
        self.updated = -math.inf  # time.time() of the newest value

    def add(self, t: float, value: float, source: str) -> None:
        if not math.isfinite(value) or not math.isfinite(t):
            return
        second = float(int(t))
        pts = self.points
        if pts and pts[-1][0] == second:
            pts[-1][1] = max(pts[-1][1], value) if self.how == "max" else value
        elif pts and second < pts[-1][0]:
            # late (a log line read after a newer sample): fold it into its second if kept
            for p in reversed(pts):
                if p[0] == second:
                    p[1] = max(p[1], value) if self.how == "max" else value
                    break
                if p[0] < second:
                    break
        else:
            pts.append([second, value])
        self.source = source
        self.updated = max(self.updated, t)

    @property
    def last(self) -> float | None:
        return self.points[-1][1] if self.points else None

    def window(self, end: float, columns: int, seconds_per_column: int = 1, fill_s: float = 0.0) -> list[float | None]:
        """Values for `columns` columns ending at `end` (one column per seconds_per_column);
        None where nothing was recorded. A column shows its last value (or the max). Gaps between
        two recorded columns up to fill_s seconds long carry the value before them (a source polled
        every 2 s leaves every other second empty); nothing is invented after the last value."""
        out: list[float | None] = [None] * columns
        if columns <= 0 or not self.points:
            return out
        step = max(1, seconds_per_column)
        last_col_start = int(end) - (int(end) % step)
        first = last_col_start - (columns - 1) * step
        for second, value in reversed(self.points):
            if second < first:
                break
            col = (int(second) - first) // step
            if 0 <= col < columns:
                seen = out[col]
                if seen is None:
                    out[col] = value  # walking backwards: the first seen is the column's last
                elif self.how == "max":
                    out[col] = max(seen, value)
        if fill_s > 0:
            limit = int(fill_s // step)
            last_i: int | None = None
            for i, v in enumerate(out):
                if v is None:
                    continue
                if last_i is not None and 1 < i - last_i <= limit + 1:
                    for j in range(last_i + 1, i):
                        out[j] = out[last_i]
                last_i = i
        return out


@dataclass(frozen=True, slots=True)
class Observation:
    """One value read from a log line."""

    time: float
    key: str
    value: float
    rank: str | None = None


class Vitals:
    def __init__(self, history_s: int = HISTORY_S) -> None:
        self.series: dict[str, Series] = {s.key: Series(s.how, history_s) for s in SPECS}
        self.marks: list[tuple[float, str]] = []  # (time.time(), label) of first signatures
        self.version = 0
        self.gpu_bytes: tuple[int, int] | None = None  # (used, total) latest, for the label
        self._counters: dict[str, tuple[float, float]] = {}  # counter name -> (time, value)
        self._metrics_at: dict[str, float] = {}

    # -- feeds ------------------------------------------------------------------------------

    def _put(self, key: str, t: float, value: float | None, source: str) -> None:
        if value is None:
            return
        if source == "log" and t - self._metrics_at.get(key, -math.inf) < METRICS_PRECEDENCE_S:
            return
        if source == "metrics":
            self._metrics_at[key] = t
        self.series[key].add(t, float(value), source)
        self.version += 1

    def _delta(self, name: str, t: float, value: float | None, per_second: bool = False) -> float | None:
        """Increase of a counter since its previous reading (per second if asked); None the first
        time, or after a reset (a restarted server starts its counters again)."""
        if value is None:
            return None
        prev = self._counters.get(name)
        self._counters[name] = (t, value)
        if prev is None or value < prev[1] or t <= prev[0]:
            return None
        return (value - prev[1]) / (t - prev[0]) if per_second else value - prev[1]

    def feed_metrics(self, metrics: Any, t: float | None = None) -> None:
        """A radixtop.probes.sglang.ServerMetrics."""
        t = time.time() if t is None else t
        get = metrics.get
        for key in ("token_usage", "running", "queued"):
            self._put(key, t, get(key), "metrics")
        if get("cache_hit_rate") is not None:
            self._put("cache_hit_rate", t, get("cache_hit_rate"), "metrics")
        else:  # vLLM V1: hits / queries over the interval
            dq = self._delta("prefix_queries", t, get("prefix_queries_total"))
            dh = self._delta("prefix_hits", t, get("prefix_hits_total"))
            if dq and dh is not None:
                self._put("cache_hit_rate", t, dh / dq, "metrics")
        evicted = self._delta("evicted_tokens", t, get("evicted_tokens_total"), per_second=True)
        if evicted is not None:
            self._put("evicted_tokens", t, evicted, "metrics")
        if get("retracted") is not None:
            self._put("retracted", t, get("retracted"), "metrics")
        else:
            preempted = self._delta("preemptions", t, get("preemptions_total"))
            if preempted is not None:
                self._put("retracted", t, preempted, "metrics")

    def feed_log(self, observations: Iterable[Observation]) -> None:
        for ob in observations:
            self._put(ob.key, ob.time, ob.value, "log")

    def feed_radix(self, snapshot: Any, t: float | None = None) -> None:
        """Evicted tokens from the debug endpoint's counters (rank 0 stands for its TP group)."""
        t = snapshot.time if t is None else t
        evicted = self._delta(
            f"radix_evicted/{snapshot.instance}", t, snapshot.counters.evicted_tokens, per_second=True
        )
        if evicted is not None and t - self._metrics_at.get("evicted_tokens", -math.inf) >= METRICS_PRECEDENCE_S:
            self.series["evicted_tokens"].add(t, float(evicted), "radix")
            self.version += 1

    def feed_gpu(self, sample: Any, pids: Sequence[int] | None = None) -> None:
        """A radixtop.probes.gpu.GpuSample: the memory in use on every GPU (or, given the server's
        pids, the memory those processes hold), as a fraction of the GPUs' total."""
        gpus = [g for g in sample.gpus if g.memory_total]
        if not gpus:
            return
        total = sum(g.memory_total for g in gpus)
        if pids:
            wanted = set(pids)
            used = sum(p.used_bytes or 0 for g in gpus for p in g.processes if p.pid in wanted)
        else:
            used = sum(g.memory_used or 0 for g in gpus)
        self.gpu_bytes = (used, total)
        self._put("gpu_memory", sample.time, used / total, "nvml")

    def mark(self, t: float, label: str) -> None:
        """The moment a signature first appeared (drawn on every plot)."""
        if all(abs(t - m) > 0.5 or lab != label for m, lab in self.marks):
            self.marks.append((t, label))
            self.marks.sort()
            del self.marks[:-8]
            self.version += 1

    @property
    def first_mark(self) -> tuple[float, str] | None:
        return self.marks[0] if self.marks else None


# ----------------------------------------------------------------------------------------------
# Log lines -> observations

_RETRACT = re.compile(r"#retracted_reqs: (\d+)")
_VLLM_STATS = re.compile(
    r"Running: (\d+) reqs,.*?(?:Waiting|Pending): (\d+) reqs,.*?GPU KV cache usage: ([\d.]+)%"
    r"(?:.*?Prefix cache hit rate: ([\d.]+)%)?"
)


LIVE_TAIL_LINES = 500  # of a live batch, the lines read for the per-second series



def live_lines(texts: Sequence[str], rare: Sequence[int] | None = None) -> Sequence[str]:
    """The lines of a live batch worth reading: the last LIVE_TAIL_LINES and, before them, only
    retraction and vLLM stats lines. The last lines hold the newest value of each per-second
    series, while a flood of SGLang batch lines (one per scheduler step and rank) earlier adds
    nothing; a retraction counts wherever it is, and vLLM writes its stats line only every few
    seconds. `rare`: the lines holding RARE_NEEDLES, ascending, when the caller's own pass over
    the batch found them (the log pane's ingest does); else one pass here."""
    if len(texts) <= LIVE_TAIL_LINES:
        return texts
    lines = LiveLines()
    lines.add(texts, rare)
    return lines.take()


class LiveLines:
    """The lines of every batch since the last take(), by live_lines' rule (the last
    LIVE_TAIL_LINES and, before them, the lines holding RARE_NEEDLES), kept as the batches come:
    take() is live_lines of the batches joined. The series keep one value a second, so they are
    read a few times a second rather than once per batch; a retraction anywhere still counts."""

    def __init__(self) -> None:
        self._seen = 0  # lines added since the last take
        self._rare: list[tuple[int, str]] = []  # (position since the last take, line)
        self._tail: deque[str] = deque(maxlen=LIVE_TAIL_LINES)

    def __len__(self) -> int:
        return self._seen

    def add(self, texts: Sequence[str], rare: Sequence[int] | None = None) -> None:
        """A batch; `rare` as for live_lines (its own lines, ascending), else found here."""
        if rare is None:
            rare = sorted({line for line, _ in _rare_lines().line_hits(texts)}) if texts else []
        start = self._seen
        self._rare.extend((start + i, texts[i]) for i in rare)
        self._tail.extend(texts[-LIVE_TAIL_LINES:])  # the deque keeps no more: copy no more
        self._seen += len(texts)

    def take(self) -> list[str]:
        head_len = self._seen - len(self._tail)
        lines = [text for at, text in self._rare if at < head_len]
        lines.extend(self._tail)
        self._seen, self._rare = 0, []
        self._tail.clear()
        return lines


@cache
def _rare_lines() -> Matcher:
    return Matcher.of_literals(RARE_NEEDLES)


def log_observations(texts: Iterable[str], now: float | None = None, *, latest_only: bool = False) -> list[Observation]:
    """Observations from a batch of log lines. Lines are tested with substring checks first: only
    batch, retract and vLLM stats lines are parsed. With latest_only, only the last prefill, decode
    and vLLM stats line of each second are parsed (a series keeps one value a second anyway), so
    a backlog of thousands of lines still gives a point a second."""
    out: list[Observation] = []
    fallback = time.time() if now is None else now
    seen: set[str] = set()
    if latest_only:
        texts = reversed(list(texts))
    for text in texts:
        if "batch" in text:
            kind = "Prefill batch" if "Prefill batch" in text else ("Decode batch" if "Decode batch" in text else None)
            if kind is None:
                continue
            if latest_only:  # the last line of each kind in each second (the stamp's text is enough)
                key = kind + text[:21]
                if key in seen:
                    continue
                seen.add(key)
            line = parse_line(text)
            b = line.batch
            if b is None:
                continue
            t = line.epoch or fallback
            if b.token_usage is not None:
                out.append(Observation(t, "token_usage", b.token_usage, line.rank))
            if b.running_req is not None:
                out.append(Observation(t, "running", b.running_req, line.rank))
            if b.queue_req is not None:
                out.append(Observation(t, "queued", b.queue_req, line.rank))
            if b.kind == "prefill" and b.new_token is not None and b.cached_token is not None:
                looked_up = b.new_token + b.cached_token
                if looked_up:
                    out.append(Observation(t, "cache_hit_rate", b.cached_token / looked_up, line.rank))
        elif "etract" in text:
            m = _RETRACT.search(text)
            if m is not None:
                line = parse_line(text)
                out.append(Observation(line.epoch or fallback, "retracted", float(m.group(1)), line.rank))
        elif "KV cache usage" in text and ("vllm" + text[:24]) not in seen:
            m = _VLLM_STATS.search(text)
            if m is not None:
                if latest_only:
                    seen.add("vllm" + text[:24])
                line = parse_line(text)
                t = line.epoch or fallback
                out.append(Observation(t, "running", float(m.group(1)), line.rank))
                out.append(Observation(t, "queued", float(m.group(2)), line.rank))
                out.append(Observation(t, "token_usage", float(m.group(3)) / 100.0, line.rank))
                if m.group(4) is not None:
                    out.append(Observation(t, "cache_hit_rate", float(m.group(4)) / 100.0, line.rank))
    if latest_only:
        out.reverse()  # oldest first, as the lines came
    return out
