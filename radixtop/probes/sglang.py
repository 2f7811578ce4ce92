"""The server itself (SGLang, or vLLM where it fits): health, /server_info, /metrics.

`ServerProbe.poll()` returns a `ServerSample` and never raises. A route the HTTP front answers
alone (`probes.http.liveness_path`: never SGLang's /health, which generates a token through the
scheduler) decides up or down; a refused connection is DOWN (with the time it went down, kept by
the status); /server_info is read
on first contact, after every restart and every few minutes (it names the instrument endpoints and
the launch command); /metrics is read when the server has it (`--enable-metrics`; vLLM always),
parsed with prometheus_client's parser after dropping every line we do not use (SGLang's /metrics
is mostly histograms), and folded into `ServerMetrics` under one set of names for both servers.
Watching must not fill an idle server's log with its own access lines: while the server is idle
and its log is followed (`log_spoke`), it is asked every IDLE_EVERY_S, and at once when the log
shows a line other than an access line.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radixtop.probes.http import ANSWERING, PolledProbe, fetch, liveness_path
from radixtop.probes.radix import instrument_urls
from radixtop.probes.status import SourceState, StateClock, one_line

if TYPE_CHECKING:  # imported when first used: httpx costs ~70 ms of start-up
    import httpx

DEFAULT_INTERVAL_S = 2.0
INFO_EVERY_S = 300.0
METRICS_RETRY_S = 60.0  # after a 404 on /metrics, look again this much later
HEALTH_EVERY_S = 6.0  # while /metrics answers, the liveness route is asked this often
# Every request radixtop makes is a line in the server's access log. While the server is idle
# (no request running or queued, and nothing but access lines in its log) and its log is followed,
# it is asked only this often, and again at once when its log speaks.
IDLE_EVERY_S = 300.0
IDLE_AFTER_S = 10.0  # quiet this long, and idle by /metrics where the server has it
MAX_INFO_BYTES = 2 * 1024 * 1024
MAX_METRICS_BYTES = 8 * 1024 * 1024

# Our name -> the server's metric names, first found wins. SGLang 0.5.x; vLLM V1 (and V0's names).
SGLANG_METRICS = {
    "token_usage": ("sglang:token_usage",),
    "running": ("sglang:num_running_reqs",),
    "queued": ("sglang:num_queue_reqs",),
    "cache_hit_rate": ("sglang:cache_hit_rate",),
    "available_tokens": ("sglang:kv_available_tokens",),
    "evictable_tokens": ("sglang:kv_evictable_tokens",),
    "evicted_tokens_total": ("sglang:evicted_tokens_total",),
    "retracted": ("sglang:num_retracted_reqs",),
    "gen_throughput": ("sglang:gen_throughput",),
}
VLLM_METRICS = {
    "token_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "running": ("vllm:num_requests_running",),
    "queued": ("vllm:num_requests_waiting",),
    "cache_hit_rate": ("vllm:gpu_prefix_cache_hit_rate",),  # V0; V1 gives the two counters below
    "prefix_queries_total": ("vllm:prefix_cache_queries_total",),
    "prefix_hits_total": ("vllm:prefix_cache_hits_total",),
    "preemptions_total": ("vllm:num_preemptions_total",),
}
# How series of one metric combine: TP ranks replicate (take one), DP ranks partition (sum counts,
# average ratios).
RATIOS = frozenset({"token_usage", "cache_hit_rate"})
_ALL_NAMES = {n: key for table in (SGLANG_METRICS, VLLM_METRICS) for key, names in table.items() for n in names}
_WANTED_PREFIXES = tuple(sorted({n.rsplit("_total", 1)[0] if n.endswith("_total") else n for n in _ALL_NAMES}))


@dataclass(frozen=True, slots=True)
class ServerInfo:
    url: str
    kind: str  # "sglang" | "vllm" | "unknown"
    version: str = ""
    model: str = ""
    launch_command: str = ""
    max_total_num_tokens: int | None = None
    page_size: int | None = None
    tp_size: int = 1
    dp_size: int = 1
    enable_metrics: bool | None = None
    instrument_urls: tuple[str, ...] = ()
    port: int | None = None
    # The whole answer, for what radixtop remembers of the server (its launch command and server
    # args, should it die): see radixtop.incident.common.sighting.
    raw: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class ServerMetrics:
    kind: str  # "sglang" | "vllm"
    values: Mapping[str, float] = field(default_factory=dict)  # our names (see SGLANG_METRICS)

    def get(self, name: str) -> float | None:
        return self.values.get(name)


@dataclass(frozen=True, slots=True)
class ServerSample:
    url: str
    status: SourceState
    time: float
    info: ServerInfo | None = None  # the latest known (kept across polls)
    metrics: ServerMetrics | None = None  # this poll's, None when not read or failed
    metrics_note: str = ""  # why there are no metrics ("start it with --enable-metrics", ...)
    restarted: bool = False  # came back after being down, or a new startup_time
    latency_s: float | None = None  # the liveness route's round trip


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def parse_server_info(url: str, data: bytes) -> ServerInfo:
    """/server_info (SGLang) -> ServerInfo; ValueError with one line when it is not that."""
    from radixtop.probes.server_info import decode_server_info

    obj = decode_server_info(data)
    version = obj.get("version")
    return ServerInfo(
        url=url,
        kind="sglang",
        version=version if isinstance(version, str) else "",
        model=str(obj.get("served_model_name") or obj.get("model_path") or "")[:200],
        launch_command=str(obj.get("launch_command") or "")[:4000],
        max_total_num_tokens=_int(obj.get("max_total_num_tokens")),
        page_size=_int(obj.get("page_size")),
        tp_size=_int(obj.get("tp_size")) or 1,
        dp_size=_int(obj.get("dp_size")) or 1,
        enable_metrics=obj.get("enable_metrics") if isinstance(obj.get("enable_metrics"), bool) else None,
        instrument_urls=tuple(instrument_urls(obj.get("radixtop_instrument") or ()))
        if isinstance(obj.get("radixtop_instrument"), list)
        else (),
        port=_int(obj.get("port")),
        raw=obj,
    )


def _keep(text: str) -> str:
    """Only the lines of the metrics we use (and their # TYPE lines): the parser is pure Python."""
    keep = []
    for line in text.splitlines():
        if line.startswith(_WANTED_PREFIXES) or (line.startswith("# TYPE ") and line[7:].startswith(_WANTED_PREFIXES)):
            keep.append(line)
    return "\n".join(keep) + "\n"


def _label_int(labels: Mapping[str, str], name: str) -> int:
    try:
        return int(labels.get(name, "0"))
    except ValueError:
        return 0


def parse_metrics(text: str) -> ServerMetrics:
    """Prometheus text -> ServerMetrics. ValueError (one line) when the text does not parse."""
    from prometheus_client.parser import (
        text_string_to_metric_families,  # ~45 ms to import: when first needed
    )

    per_name: dict[str, dict[int, tuple[int, float]]] = {}  # our name -> dp group -> (tp rank, value)
    kind = "unknown"
    try:
        for family in text_string_to_metric_families(_keep(text)):
            for s in family.samples:
                key = _ALL_NAMES.get(s.name)
                if key is None:
                    continue
                kind = "vllm" if s.name.startswith("vllm:") else "sglang"
                dp = _label_int(s.labels, "dp_rank")
                tp = _label_int(s.labels, "tp_rank")
                groups = per_name.setdefault(key, {})
                if dp not in groups or tp < groups[dp][0]:  # one TP rank stands for its group
                    groups[dp] = (tp, float(s.value))
    except Exception as exc:  # the parser raises ValueError, and others on odd input
        raise ValueError(f"/metrics does not parse as Prometheus text ({one_line(str(exc), 100)})") from None
    values: dict[str, float] = {}
    for key, groups in per_name.items():
        nums = [v for _, v in groups.values()]
        values[key] = sum(nums) / len(nums) if key in RATIOS else sum(nums)
    return ServerMetrics(kind, values)


class ServerProbe(PolledProbe):
    """Polls one server at `url` (e.g. http://127.0.0.1:30000)."""

    def __init__(
        self,
        url: str,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        timeout_s: float = 3.0,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url.rstrip("/")
        self._interval_s = interval_s
        self.waker = asyncio.Event()  # set when an idle server's log speaks: poll_forever asks at once
        self._log_followed = False
        self._spoke_at = time.monotonic()
        self._busy = False  # requests running or queued at the last /metrics
        self._answering = False  # the last poll found it up
        self.timeout_s = timeout_s
        self._client = client
        self._own_client = client is None
        self._clock = clock
        self._state = StateClock(clock)
        self.info: ServerInfo | None = None
        self._info_at = -float("inf")
        self._metrics_off_until = -float("inf")
        self._metrics_note = ""
        self._was_down = False
        self._health_ok_at = -float("inf")
        self._metrics_ok = False

    @property
    def interval_s(self) -> float:
        return IDLE_EVERY_S if self.idle() else self._interval_s

    def idle(self) -> bool:
        """Up, nothing running or queued, and its followed log quiet but for access lines."""
        return (self._log_followed and self._answering and not self._busy
                and time.monotonic() - self._spoke_at >= IDLE_AFTER_S)

    def log_spoke(self, lines: Iterable[str]) -> None:
        """New lines of the server's log: a line other than an access line (the server's own, not
        our requests') ends an idle spell, and the next poll is now."""
        self._log_followed = True
        if any("HTTP/" not in line for line in lines):  # the first line decides, almost always
            was_idle = self.idle()
            self._spoke_at = time.monotonic()
            if was_idle:
                self.waker.set()

    def _sample(self, state: str, message: str = "", **kw: Any) -> ServerSample:
        self._answering = state == "ok"
        metrics = kw.get("metrics")
        if metrics is not None:
            self._busy = bool(metrics.get("running") or metrics.get("queued"))
        return ServerSample(self.url, self._state.update(state, message), self._clock(), info=self.info, **kw)

    async def _poll(self) -> ServerSample:
        now = time.monotonic()
        if self._metrics_carry_health(now):
            # /metrics answered last time and the front answered lately: one request instead of two
            # (SGLang's whole server exits when its scheduler dies, so a refused /metrics says it).
            metrics = await self._read_metrics(now)
            if metrics is not None:
                return self._sample("ok", metrics=metrics, metrics_note=self._metrics_note, latency_s=None)
        path = liveness_path(self.info.kind if self.info is not None else "unknown")
        health = await fetch(self.client, self.url + path, max_bytes=256 * 1024)
        if health.error is not None:
            self._was_down = True
            self._health_ok_at = -float("inf")
            state = "down" if health.refused else "error"
            return self._sample(state, f"{self.url}: {health.error}")
        restarted = self._was_down and self.info is not None
        self._was_down = False
        if health.status in ANSWERING:
            self._health_ok_at = now
        if self.info is None or restarted or now - self._info_at >= INFO_EVERY_S:
            await self._read_info(now)
        if health.status in ANSWERING:
            state, message = "ok", ""
        elif health.status == 503:
            state, message = "starting", f"{self.url}{path} answers 503 (starting, or the scheduler died)"
        else:
            state, message = "error", f"{self.url}{path} answers HTTP {health.status}"
        metrics = None
        if self._metrics_wanted(now):
            metrics = await self._read_metrics(now)
        return self._sample(
            state,
            message,
            metrics=metrics,
            metrics_note=self._metrics_note,
            restarted=restarted,
            latency_s=health.seconds,
        )

    async def _read_info(self, now: float) -> None:
        self._info_at = now
        got = await fetch(self.client, self.url + "/server_info", max_bytes=MAX_INFO_BYTES)
        if got.ok:
            try:
                self.info = parse_server_info(self.url, got.body)
                return
            except ValueError:
                pass
        if got.status == 404 or (got.ok and self.info is None):
            self.info = await self._identify_other()

    async def _identify_other(self) -> ServerInfo:
        """No SGLang /server_info: vLLM answers /version and lists models with owned_by "vllm"."""
        kind, version, model = "unknown", "", ""
        got = await fetch(self.client, self.url + "/version", max_bytes=64 * 1024)
        if got.ok:
            try:
                obj = json.loads(got.body)
                if isinstance(obj, dict) and isinstance(obj.get("version"), str):
                    version = obj["version"][:60]
            except ValueError:
                pass
        got = await fetch(self.client, self.url + "/v1/models", max_bytes=256 * 1024)
        if got.ok:
            try:
                data = json.loads(got.body).get("data") or []
                if data and isinstance(data[0], dict):
                    model = str(data[0].get("id", ""))[:200]
                    if data[0].get("owned_by") == "vllm":
                        kind = "vllm"
            except (ValueError, AttributeError):
                pass
        return ServerInfo(self.url, kind, version=version, model=model, enable_metrics=True if kind == "vllm" else None)

    def _metrics_carry_health(self, now: float) -> bool:
        return self._metrics_ok and now - self._health_ok_at < HEALTH_EVERY_S and self._metrics_wanted(now)

    def _metrics_wanted(self, now: float) -> bool:
        if now < self._metrics_off_until:
            return False
        info = self.info
        if info is not None and info.enable_metrics is False:
            self._metrics_note = (
                "no /metrics: start the server with --enable-metrics (vitals come from the log meanwhile)"
            )
            return False
        return True

    async def _read_metrics(self, now: float) -> ServerMetrics | None:
        got = await fetch(self.client, self.url + "/metrics", max_bytes=MAX_METRICS_BYTES)
        self._metrics_ok = False
        if got.status == 404:
            self._metrics_off_until = now + METRICS_RETRY_S
            self._metrics_note = "no /metrics (HTTP 404): start the server with --enable-metrics"
            return None
        if not got.ok:
            self._metrics_note = f"/metrics: {got.error or f'HTTP {got.status}'}"
            return None
        text = got.body.decode("utf-8", "replace")
        try:
            if len(text) > 256 * 1024:
                metrics = await asyncio.to_thread(parse_metrics, text)
            else:
                metrics = parse_metrics(text)
        except ValueError as exc:
            self._metrics_note = one_line(str(exc))
            return None
        self._metrics_note = "" if metrics.values else "/metrics has none of the SGLang or vLLM gauges radixtop reads"
        self._metrics_ok = True
        return metrics
