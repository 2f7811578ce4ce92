"""GPUs through NVML (pynvml, from the nvidia-ml-py distribution).

Every NVML call goes through one choke point, `Nvml.call`, which turns every NVMLError (and a missing
library, and a binding that returns something odd) into `NvmlFailure` carrying a one-line reason:
"no NVIDIA driver", "no permission", "GPU lost", ... A failure of one query costs that field only;
a failure to initialise makes the whole sample "unavailable: <reason>", and initialisation is tried
again now and then (a driver can come back after a reset). Nothing here prints.

Reads are blocking C calls, so `GpuProbe.poll()` runs them in a thread, and never more often than
`min_interval_s` (a caller polling faster gets the previous sample again). Xid errors come from an
NVML event set polled with a zero timeout: the driver reports them only where it supports it
(not in most containers), and the sample says so.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from radixtop.probes.status import SourceState, StateClock

DEFAULT_INTERVAL_S = 2.0
MIN_INTERVAL_S = 1.0
REINIT_EVERY_S = 30.0
MAX_XIDS_PER_READ = 32
MAX_PROCESSES_PER_GPU = 256

# Errors by pynvml's NVML_ERROR_* value: what an on-call engineer should read.
_REASONS = {
    1: "NVML not initialised",
    2: "invalid argument to NVML",
    3: "not supported on this GPU",
    4: "no permission to query the GPU (run as root or the server's user; check /dev/nvidia* permissions)",
    6: "not found",
    7: "insufficient size",
    8: "insufficient power (check the GPU's power cables)",
    9: "NVIDIA driver not loaded",
    10: "NVML timed out",
    11: "IRQ issue (check the GPU's interrupts)",
    12: "no NVIDIA driver (libnvidia-ml.so not found)",
    13: "driver too old for this query",
    14: "corrupted inforom",
    15: "GPU lost (fallen off the bus; the kernel log has Xid 79)",
    16: "GPU needs a reset",
    17: "GPU operating system call failed",
    18: "driver/library version mismatch (reload the driver or reboot)",
    19: "in use",
    20: "out of memory in NVML",
    21: "no data",
    22: "ECC is not enabled",
    999: "unknown NVML error",
}
_GPU_LOST = 15
_TIMEOUT = 10
_NOT_SUPPORTED = 3

# The Xids an incident usually shows (NVIDIA's Xid catalog); others print as their number.
XID_MEANINGS = {
    13: "graphics engine exception (often an illegal memory access in a kernel)",
    31: "GPU memory page fault (illegal address)",
    43: "GPU stopped processing (application fault)",
    45: "preemptive cleanup (a process was killed)",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remap",
    64: "row remap failure",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


class NvmlFailure(Exception):
    def __init__(self, reason: str, code: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code

    @property
    def gpu_lost(self) -> bool:
        return self.code == _GPU_LOST


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used_bytes: int | None  # None where the driver does not say (e.g. under MIG or without permission)


GpuState = Literal["ok", "lost", "error"]


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    name: str = ""
    uuid: str = ""
    memory_used: int | None = None  # bytes
    memory_total: int | None = None
    util_percent: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    processes: tuple[GpuProcess, ...] = ()
    state: GpuState = "ok"
    problems: tuple[str, ...] = ()  # one line per query that failed

    @property
    def memory_fraction(self) -> float | None:
        if self.memory_used is None or not self.memory_total:
            return None
        return self.memory_used / self.memory_total


@dataclass(frozen=True, slots=True)
class XidEvent:
    time: float  # time.time() when radixtop saw it
    gpu_index: int | None
    xid: int

    @property
    def meaning(self) -> str:
        return XID_MEANINGS.get(self.xid, "see NVIDIA's Xid catalog")


@dataclass(frozen=True, slots=True)
class GpuSample:
    status: SourceState
    time: float
    gpus: tuple[GpuInfo, ...] = ()
    xids: tuple[XidEvent, ...] = ()  # new since the previous read
    xid_note: str = ""  # why Xid events are not watched, when they are not
    driver: str = ""
    seconds: float = 0.0  # what the read cost


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class Nvml:
    """The choke point. `call(name, *args)` looks the function up on pynvml at call time (so tests
    can replace one function) and turns every failure into NvmlFailure."""

    def __init__(self) -> None:
        self._mod: Any = None
        self.ready = False
        self.reason = "not initialised"

    def _module(self) -> Any:
        if self._mod is None:
            try:
                import pynvml
            except ImportError:
                raise NvmlFailure("NVML bindings not installed (pip install nvidia-ml-py)") from None
            except Exception as exc:  # a broken install
                raise NvmlFailure(f"NVML bindings failed to import ({type(exc).__name__})") from None
            self._mod = pynvml
        return self._mod

    def const(self, name: str, default: Any = None) -> Any:
        try:
            return getattr(self._module(), name, default)
        except NvmlFailure:
            return default

    def call(self, name: str, *args: Any, read: Callable[[Any], Any] | None = None) -> Any:
        """pynvml.<name>(*args), with `read` applied to the result inside the guard."""
        mod = self._module()
        try:
            fn = getattr(mod, name)
            result = fn(*args)
            return read(result) if read is not None else result
        except NvmlFailure:
            raise
        except Exception as exc:
            raise self._failure(mod, exc) from None

    @staticmethod
    def _failure(mod: Any, exc: Exception) -> NvmlFailure:
        error_type = getattr(mod, "NVMLError", None)
        if error_type is not None and isinstance(exc, error_type):
            code = getattr(exc, "value", None)
            reason = _REASONS.get(code) if isinstance(code, int) else None
            if reason is None:
                try:
                    reason = f"NVML error: {exc}"
                except Exception:
                    reason = f"NVML error {code}"
            return NvmlFailure(reason, code if isinstance(code, int) else None)
        if isinstance(exc, AttributeError):
            return NvmlFailure(f"this nvidia-ml-py lacks a function or field radixtop uses ({exc})")
        return NvmlFailure(f"NVML binding failed: {type(exc).__name__}: {exc}")

    def init(self) -> bool:
        try:
            self.call("nvmlInit")
        except NvmlFailure as exc:
            self.ready, self.reason = False, exc.reason
            return False
        self.ready, self.reason = True, ""
        return True

    def shutdown(self) -> None:
        if self.ready:
            self.ready = False
            try:
                self.call("nvmlShutdown")
            except NvmlFailure:
                pass


class GpuReader:
    """Synchronous NVML reads (run it in a thread). One per process: NVML's init is process-wide."""

    def __init__(self, *, clock: Callable[[], float] = time.time, reinit_every_s: float = REINIT_EVERY_S) -> None:
        self.nvml = Nvml()
        self._clock = clock
        self._state = StateClock(clock)
        self._reinit_every_s = reinit_every_s
        self._init_at = -float("inf")
        self._driver = ""
        self._events: Any = None
        self._xid_note = ""
        self._lock = threading.Lock()

    def read(self) -> GpuSample:
        with self._lock:  # one read at a time, whoever calls
            started = time.monotonic()
            try:
                sample = self._read()
            except NvmlFailure as exc:
                sample = GpuSample(self._state.update("unavailable", exc.reason), self._clock())
            except Exception as exc:  # never into the app
                sample = GpuSample(
                    self._state.update("error", f"GPU read failed: {type(exc).__name__}: {exc}"), self._clock()
                )
            return _with_seconds(sample, time.monotonic() - started)

    def _read(self) -> GpuSample:
        nvml = self.nvml
        if not nvml.ready:
            now = time.monotonic()
            if now - self._init_at < self._reinit_every_s:
                return GpuSample(self._state.update("unavailable", nvml.reason), self._clock())
            self._init_at = now
            if not nvml.init():
                return GpuSample(self._state.update("unavailable", nvml.reason), self._clock())
            self._driver = self._try(lambda: nvml.call("nvmlSystemGetDriverVersion", read=_text), "")
            self._watch_xids()
        try:
            count = nvml.call("nvmlDeviceGetCount", read=int)
        except NvmlFailure as exc:
            if exc.code in (1, 9, 12, 18):  # uninitialised, driver gone, library gone, mismatch
                nvml.ready = False
                nvml.reason = exc.reason
                self._events = None
            return GpuSample(self._state.update("unavailable", exc.reason), self._clock(), driver=self._driver)
        gpus = tuple(self._gpu(i) for i in range(max(0, min(count, 64))))
        xids = self._read_xids()
        bad = [g for g in gpus if g.state != "ok"]
        if not gpus:
            status = self._state.update("unavailable", "NVML sees no GPU")
        elif bad:
            g = bad[0]
            status = self._state.update("degraded", f"GPU {g.index}: {g.problems[0] if g.problems else g.state}")
        else:
            status = self._state.update("ok")
        return GpuSample(status, self._clock(), gpus, xids, self._xid_note, self._driver)

    @staticmethod
    def _try(fn: Callable[[], Any], default: Any) -> Any:
        try:
            return fn()
        except NvmlFailure:
            return default

    def _gpu(self, index: int) -> GpuInfo:
        nvml = self.nvml
        try:
            handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
        except NvmlFailure as exc:
            return GpuInfo(index, state="lost" if exc.gpu_lost else "error", problems=(exc.reason,))
        problems: list[str] = []
        values: dict[str, Any] = {}
        lost = False

        def field(key: str, what: str, name: str, *args: Any, read: Callable[[Any], Any] | None = None) -> None:
            nonlocal lost
            if lost:
                return
            try:
                values[key] = nvml.call(name, *args, read=read)
            except NvmlFailure as exc:
                if exc.gpu_lost:
                    lost = True
                if exc.code != _NOT_SUPPORTED or exc.gpu_lost:
                    problems.append(f"{what}: {exc.reason}")

        field("name", "name", "nvmlDeviceGetName", handle, read=_text)
        field("uuid", "uuid", "nvmlDeviceGetUUID", handle, read=_text)
        field("memory", "memory", "nvmlDeviceGetMemoryInfo", handle, read=lambda m: (int(m.used), int(m.total)))
        field("util", "utilisation", "nvmlDeviceGetUtilizationRates", handle, read=lambda u: int(u.gpu))
        temp_sensor = nvml.const("NVML_TEMPERATURE_GPU", 0)
        field("temp", "temperature", "nvmlDeviceGetTemperature", handle, temp_sensor, read=int)
        field("power", "power", "nvmlDeviceGetPowerUsage", handle, read=lambda mw: int(mw) / 1000.0)
        field("limit", "power limit", "nvmlDeviceGetEnforcedPowerLimit", handle, read=lambda mw: int(mw) / 1000.0)
        procs: dict[int, GpuProcess] = {}
        for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            field("procs", "processes", name, handle, read=_processes)
            for p in values.pop("procs", ()):
                known = procs.get(p.pid)
                if known is None or (known.used_bytes is None and p.used_bytes is not None):
                    procs[p.pid] = p
        used, total = values.get("memory", (None, None))
        return GpuInfo(
            index=index,
            name=values.get("name", ""),
            uuid=values.get("uuid", ""),
            memory_used=used,
            memory_total=total,
            util_percent=values.get("util"),
            temperature_c=values.get("temp"),
            power_w=values.get("power"),
            power_limit_w=values.get("limit"),
            processes=tuple(sorted(procs.values(), key=lambda p: p.pid))[:MAX_PROCESSES_PER_GPU],
            state="lost" if lost else "ok",
            problems=tuple(problems),
        )

    # -- Xid events ---------------------------------------------------------------------------

    def _watch_xids(self) -> None:
        nvml = self.nvml
        self._events = None
        try:
            events = nvml.call("nvmlEventSetCreate")
            count = nvml.call("nvmlDeviceGetCount", read=int)
            xid_type = nvml.const("nvmlEventTypeXidCriticalError", 8)
            registered = 0
            reasons = []
            for i in range(count):
                try:
                    handle = nvml.call("nvmlDeviceGetHandleByIndex", i)
                    nvml.call("nvmlDeviceRegisterEvents", handle, xid_type, events)
                    registered += 1
                except NvmlFailure as exc:
                    reasons.append(exc.reason)
        except NvmlFailure as exc:
            self._xid_note = f"Xid events not watched: {exc.reason} (dmesg | grep -i xid shows them)"
            return
        if not registered:
            why = reasons[0] if reasons else "no GPU"
            self._xid_note = f"Xid events not watched: {why} (dmesg | grep -i xid shows them)"
            return
        self._events = events
        self._xid_note = "" if not reasons else f"Xid events watched on {registered} of {count} GPUs"

    def _read_xids(self) -> tuple[XidEvent, ...]:
        if self._events is None:
            return ()
        nvml = self.nvml
        out = []
        for _ in range(MAX_XIDS_PER_READ):
            try:
                data = nvml.call("nvmlEventSetWait_v2", self._events, 0)
            except NvmlFailure as exc:
                if exc.code != _TIMEOUT:  # TIMEOUT is "no event": the usual answer
                    self._xid_note = f"Xid events: {exc.reason}"
                break
            try:
                xid = int(data.eventData)
                device = data.device
            except Exception:
                continue
            index = self._try(functools.partial(nvml.call, "nvmlDeviceGetIndex", device, read=int), None)
            out.append(XidEvent(self._clock(), index, xid))
        return tuple(out)

    def close(self) -> None:
        with self._lock:
            if self._events is not None:
                self._try(lambda: self.nvml.call("nvmlEventSetFree", self._events), None)
                self._events = None
            self.nvml.shutdown()


def read_once() -> GpuSample:
    """One NVML read, then NVML shut down: for a bundle or a plan, which look once."""
    reader = GpuReader()
    try:
        return reader.read()
    finally:
        reader.close()


def _processes(items: Any) -> list[GpuProcess]:
    out = []
    for p in list(items)[:MAX_PROCESSES_PER_GPU]:
        used = getattr(p, "usedGpuMemory", None)
        out.append(GpuProcess(int(p.pid), int(used) if isinstance(used, int) and used >= 0 else None))
    return out


def _with_seconds(sample: GpuSample, seconds: float) -> GpuSample:
    return GpuSample(sample.status, sample.time, sample.gpus, sample.xids, sample.xid_note, sample.driver, seconds)


class GpuProbe:
    """Async face of GpuReader: reads in a thread, at most once per min_interval_s."""

    def __init__(
        self,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        min_interval_s: float = MIN_INTERVAL_S,
        reader: GpuReader | None = None,
    ) -> None:
        self.interval_s = max(interval_s, min_interval_s)
        self.min_interval_s = min_interval_s
        self.reader = reader or GpuReader()
        self._last: GpuSample | None = None
        self._last_at = -float("inf")

    async def poll(self) -> GpuSample:
        now = time.monotonic()
        if self._last is not None and now - self._last_at < self.min_interval_s:
            return self._last
        self._last_at = now
        try:
            sample = await asyncio.to_thread(self.reader.read)
        except Exception as exc:  # e.g. the thread pool is shutting down
            sample = GpuSample(SourceState("error", f"GPU read failed: {type(exc).__name__}", time.time()), time.time())
        self._last = sample
        return sample

    async def aclose(self) -> None:
        try:
            await asyncio.to_thread(self.reader.close)
        except Exception:
            pass
