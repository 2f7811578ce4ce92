"""radixtop inside a real SGLang scheduler process: configuration, cache detection, the safe point.

Standard library only, and sglang is never imported from here: the plugin (plugin.py) and the
launcher (launcher.py) call in once SGLang's own modules are loaded, and the tests call attach()
on a cache they built themselves.

- InstrumentConfig.from_env() (config.py): the RADIXTOP_INSTRUMENT* variables, bad values logged and replaced.
- describe_cache(cache): which cache this is (RadixCache, UnifiedRadixCache on the Python or the
  Rust TreeCore, disabled, unknown) and what radixtop can see of it.
- attach(cache, rank=...): counting hooks on that cache instance + the debug endpoint on
  127.0.0.1:(base port + rank). The plugin, the launcher and the tests all go through it.
- around_process_input_requests: an AROUND hook (HookRegistry's shape) for
  Scheduler.process_input_requests, which every SGLang scheduler loop (normal, overlap, PP,
  disaggregated; 0.4 to 0.5.23) calls once per iteration, on the scheduler thread, before any
  request is handled: no tree operation is half done there, so it is the safe point. The first
  call attaches to scheduler.tree_cache; every call offers the endpoint a (rate-limited) snapshot.

Nothing here raises into SGLang: failures are logged (first few, then every hundredth), counted,
and after MAX_SAFE_POINT_ERRORS the safe point stops doing anything and the hooks come off.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from radixtop.instrument.config import (  # noqa: F401 - ENV_* are this module's interface too
    ENV_BUDGET,
    ENV_ENABLE,
    ENV_HOST,
    ENV_INTERVAL,
    ENV_PORT,
    ENV_TOKEN,
    InstrumentConfig,
)
from radixtop.instrument.endpoint import Instrumentation, is_loopback
from radixtop.instrument.hooks import HOOKED_METHODS, OPTIONAL_METHODS
from radixtop.instrument.snapshot import SnapshotConfig, find_root, rust_core

log = logging.getLogger("radixtop.instrument")

SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
SAFE_POINT_METHOD = "process_input_requests"
SAFE_POINT_TARGET = f"{SCHEDULER_MODULE}.Scheduler.{SAFE_POINT_METHOD}"
MAX_SAFE_POINT_ERRORS = 20
_MARK = "__radixtop_safe_point__"  # on a scheduler method radixtop has wrapped (either route)
_RUST_HINT = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python"
SCHEDULER_EXCEPTION = "Scheduler hit an exception"  # run_scheduler_process's handler, 0.3 to 0.5.23


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get(ENV_ENABLE) == "1"


# ----------------------------------------------------------------------------------------------
# What kind of cache is this?


@dataclass(frozen=True)
class CacheInfo:
    cache_class: str
    kind: str  # "radix", "unified-python", "unified-rust", "disabled", "unknown"
    walkable: bool
    hooked_methods: tuple[str, ...]  # the counting methods this cache has
    note: str  # one line for the log: what radixtop can and cannot see

    @property
    def summary(self) -> str:
        return f"{self.cache_class} ({self.kind}): {self.note}"


def describe_cache(cache: Any) -> CacheInfo:
    """Never raises. Reads no tensors; the only call into the cache is its root_node lookup."""
    cls = type(cache).__name__
    methods = tuple(name for name in HOOKED_METHODS + OPTIONAL_METHODS if callable(getattr(type(cache), name, None)))
    root, reason = find_root(cache)
    core = type(getattr(cache, "tree_core", None)).__name__
    counters = "counters for " + ", ".join(methods) if methods else "no lock/evict methods to count"
    if root is not None:
        kind = "unified-python" if hasattr(cache, "tree_core") else "radix"
        return CacheInfo(cls, kind, True, methods, f"tree walkable, {counters}")
    if "disabled" in reason:
        return CacheInfo(cls, "disabled", False, methods, reason)
    if "Rust" in reason:
        if rust_core(cache) is not None:
            return CacheInfo(
                cls, "unified-rust", True, methods,
                f"tree rebuilt from {core}'s KV-canary walk (locked or not, no lock counts, hits or token ids), "
                f"{counters}",
            )
        return CacheInfo(
            cls, "unified-rust", False, methods,
            f"sizes and {counters} only: the tree lives in {core}; restart with {_RUST_HINT} to see it",
        )
    if not set(HOOKED_METHODS) & set(methods):
        return CacheInfo(cls, "unknown", False, methods, f"unknown cache class {cls}: {counters}; {reason}")
    return CacheInfo(cls, "unknown", False, methods, f"{counters}; {reason}")


# ----------------------------------------------------------------------------------------------
# Attaching to one cache


def attach(cache: Any, *, rank: int = 0, config: InstrumentConfig | None = None) -> Instrumentation | None:
    """Hooks on this cache instance + its endpoint, started. None (and one log line) when the
    endpoint cannot serve (port in use, no token off loopback): the hooks are taken off again so
    an unreadable instrument costs the host nothing. Never raises."""
    cfg = config or InstrumentConfig.from_env()
    try:
        info = describe_cache(cache)
        inst = Instrumentation(
            cache,
            rank=rank,
            host=cfg.host,
            **cfg.endpoint_ports(),
            token=cfg.token,
            config=SnapshotConfig(max_nodes=cfg.budget),
            min_interval_s=cfg.interval_s,
        )
    except Exception as exc:
        log.error("radixtop: rank %d not instrumented: %s: %s; the server keeps serving", rank, type(exc).__name__, exc)
        return None
    if not inst.start():
        why, cause = inst.endpoint.disabled_reason, inst.endpoint.refused_for  # before close() says "stopped"
        inst.close()
        advice = {
            "token": f"set {ENV_TOKEN}, or {ENV_HOST}=127.0.0.1, to get the endpoint",
            "port": f"set {ENV_PORT} to a free base port to get the endpoint",
        }.get(cause or "", "the server keeps serving")
        log.error("radixtop: rank %d not instrumented (%s); %s", rank, why, advice)
        return None
    level = logging.WARNING if info.kind in ("unknown", "unified-rust", "disabled") else logging.INFO
    log.log(level, "radixtop: rank %d instrumented: %s; endpoint %s", rank, info.summary, inst.endpoint.url)
    if not is_loopback(cfg.host):
        log.warning(
            "radixtop: rank %d endpoint is reachable off this machine (%s); bearer token required", rank, cfg.host
        )
    return inst


# ----------------------------------------------------------------------------------------------
# The scheduler's safe point


def scheduler_rank(scheduler: Any) -> int:
    """A rank unique per scheduler process on a node: tp_rank + tp_size * pp_rank, and separate
    DP replicas (not attention DP, which splits the TP group) after that. Older SGLang keeps the
    ranks on the scheduler; 0.5.23 in runtime_context.get_parallel()."""
    args = getattr(scheduler, "server_args", None)
    parallel = None
    context = sys.modules.get("sglang.srt.runtime_context")
    if context is not None:
        try:
            parallel = context.get_parallel()
        except Exception:
            parallel = None

    def read(name: str, *, default: int) -> int:
        for source in (scheduler, parallel, args):
            if source is None:
                continue
            try:
                value = getattr(source, name, None)
            except Exception:  # ParallelContext raises for what was never published
                value = None
            if type(value) is int:
                return value
        return default

    tp_rank, pp_rank, dp_rank = read("tp_rank", default=0), read("pp_rank", default=0), read("dp_rank", default=0)
    tp_size, pp_size, dp_size = read("tp_size", default=1), read("pp_size", default=1), read("dp_size", default=1)
    rank = tp_rank + max(tp_size, 1) * pp_rank
    if dp_size > 1 and not getattr(args, "enable_dp_attention", False):
        rank += dp_rank * max(tp_size, 1) * max(pp_size, 1)
    return max(rank, 0)


class _Slot:
    """One scheduler's instrumentation; inst is None when attaching failed (not retried)."""

    __slots__ = ("cache", "inst", "rank", "scheduler")

    def __init__(self, scheduler: Any, cache: Any, inst: Instrumentation | None, rank: int) -> None:
        try:
            self.scheduler: Callable[[], Any] = weakref.ref(scheduler)
        except TypeError:
            self.scheduler = lambda: scheduler
        self.cache, self.inst, self.rank = cache, inst, rank


class SafePoints:
    """The process's scheduler instrumentation: one slot per scheduler (one in SGLang)."""

    def __init__(self, config_source: Callable[[], InstrumentConfig] = InstrumentConfig.from_env) -> None:
        self._config_source = config_source
        self._slots: dict[int, _Slot] = {}
        self._lock = threading.Lock()
        self.errors = 0
        self.disabled = False
        self._watch: _ExceptionWatch | None = None  # on SGLang's scheduler logger while attached

    def at(self, scheduler: Any) -> None:
        """Called on the scheduler thread at the top of each loop iteration. Never raises."""
        if self.disabled:
            return
        try:
            slot = self._slots.get(id(scheduler))
            if slot is None or slot.scheduler() is not scheduler:
                slot = self._first_visit(scheduler)
            inst = slot.inst
            if inst is None:
                return
            cache = scheduler.tree_cache
            if cache is not slot.cache:
                self._cache_replaced(slot, cache)
            inst.endpoint.safe_point(cache, scheduler)
        except Exception as exc:
            self._failed(exc)

    def _first_visit(self, scheduler: Any) -> _Slot:
        rank = scheduler_rank(scheduler)
        cache = getattr(scheduler, "tree_cache", None)
        inst = None
        if cache is None:
            log.warning("radixtop: the rank %d scheduler has no tree_cache; nothing to instrument", rank)
        else:
            inst = attach(cache, rank=rank, config=self._config_source())
        if inst is not None:
            self._watch_exceptions()
        slot = _Slot(scheduler, cache, inst, rank)
        with self._lock:
            self._slots[id(scheduler)] = slot
        return slot

    def _watch_exceptions(self) -> None:
        if self._watch is None:
            self._watch = _ExceptionWatch(self)
            logging.getLogger(SCHEDULER_MODULE).addHandler(self._watch)

    def _cache_replaced(self, slot: _Slot, cache: Any) -> None:
        # The scheduler swapped its tree cache (a role switch, say): count on the new one. The
        # old one's hooks leave when it is collected (hooks.py), or stay harmlessly on a live one.
        inst = slot.inst
        assert inst is not None
        log.warning("radixtop: rank %d tree cache replaced by a %s; following it", slot.rank, type(cache).__name__)
        inst.follow(cache)
        slot.cache = cache

    def _failed(self, exc: BaseException) -> None:
        try:
            self.errors += 1
            if self.errors <= 3 or self.errors % 100 == 0:
                log.warning("radixtop safe point error #%d: %s: %s", self.errors, type(exc).__name__, exc)
            for inst in self.instruments():  # health and /metrics say so while they still serve
                inst.endpoint.note_safe_point_error(self.errors, exc)
            if self.errors >= MAX_SAFE_POINT_ERRORS and not self.disabled:
                log.error(
                    "radixtop: %d safe point errors; instrumentation switched off, the server keeps serving",
                    self.errors,
                )
                self.disabled = True
                self.close()
        except Exception:
            pass

    def instruments(self) -> list[Instrumentation]:
        with self._lock:
            return [slot.inst for slot in self._slots.values() if slot.inst is not None]

    def close(self) -> None:
        """Stop every endpoint and take every hook off (a scheduler seen again is attached
        again, unless too many errors switched the safe point off). Idempotent; never raises."""
        with self._lock:
            slots, self._slots = list(self._slots.values()), {}
            watch, self._watch = self._watch, None
        if watch is not None:
            logging.getLogger(SCHEDULER_MODULE).removeHandler(watch)
        for slot in slots:
            if slot.inst is not None:
                try:
                    slot.inst.close()
                except Exception:
                    pass


class _ExceptionWatch(logging.Handler):
    """SGLang's scheduler logs SCHEDULER_EXCEPTION with the traceback, then SIGQUITs its parent,
    which takes the process down: the last moment to record the rank's cache (flight.py). Runs
    on the failing thread, before the line reaches the log's own handlers. Never raises."""

    def __init__(self, safe_points: SafePoints) -> None:
        super().__init__(logging.ERROR)
        self.safe_points = safe_points

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if not message.startswith(SCHEDULER_EXCEPTION):
                return
            lines = [line for line in message.splitlines() if line.strip()]
            cause = lines[-1].strip() if len(lines) > 1 else ""  # a traceback ends with its exception
            for inst in self.safe_points.instruments():
                inst.flight_record("scheduler_exception", f"{SCHEDULER_EXCEPTION}: {cause}" if cause else message)
        except Exception:
            pass


SAFE_POINTS = SafePoints()
atexit.register(SAFE_POINTS.close)


def around_process_input_requests(original: Callable[..., Any], scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    """HookRegistry AROUND hook for Scheduler.process_input_requests: the safe point, then SGLang."""
    SAFE_POINTS.at(scheduler)
    return original(scheduler, *args, **kwargs)


def is_instrumented(function: Any) -> bool:
    """Whether radixtop already wraps this scheduler method (through any layer of wrappers)."""
    for _ in range(32):
        if function is None:
            return False
        if getattr(function, _MARK, False):
            return True
        function = getattr(function, "__wrapped__", None)
    return False


def mark(function: Callable[..., Any]) -> Callable[..., Any]:
    setattr(function, _MARK, True)
    return function


def patch_scheduler_class(cls: type) -> bool:
    """Wrap cls.process_input_requests directly (the launcher route, for SGLang without
    HookRegistry). True when it did; False when there is nothing to wrap or radixtop already has."""
    original = getattr(cls, SAFE_POINT_METHOD, None)
    if not callable(original):
        log.error(
            "radixtop: %s has no %s; this SGLang is not supported, the server keeps serving",
            cls.__qualname__, SAFE_POINT_METHOD,
        )
        return False
    if is_instrumented(original):
        return False

    @functools.wraps(original)
    def process_input_requests(self: Any, *args: Any, **kwargs: Any) -> Any:
        SAFE_POINTS.at(self)
        return original(self, *args, **kwargs)

    setattr(cls, SAFE_POINT_METHOD, mark(process_input_requests))
    return True
