"""probes/gpu: NVML faked at the narrowest seam (the pynvml functions themselves), since no GPU
exists here; every failure mode goes through the one choke point and becomes a status."""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace

import pynvml
import pytest

from radixtop.probes.gpu import GpuProbe, GpuReader

GiB = 1024**3


class FakeNvml:
    """Two GPUs; tests break one function at a time."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, gpus: int = 2, layout=None) -> None:
        """layout: per GPU (used GiB, [(pid, GiB), ...]) of 140 GiB, instead of the default two."""
        self.calls: dict[str, int] = {}
        self.xids: list[int] = []
        self.gpus = len(layout) if layout is not None else gpus
        self.layout = layout
        self.mp = monkeypatch
        fns = {
            "nvmlInit": lambda: None,
            "nvmlShutdown": lambda: None,
            "nvmlSystemGetDriverVersion": lambda: "550.54.15",
            "nvmlDeviceGetCount": lambda: self.gpus,
            "nvmlDeviceGetHandleByIndex": lambda i: ("handle", i),
            "nvmlDeviceGetIndex": lambda h: h[1],
            "nvmlDeviceGetName": lambda h: b"NVIDIA H200" if h[1] == 0 else "NVIDIA H200",
            "nvmlDeviceGetUUID": lambda h: f"GPU-{h[1]:04d}",
            "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(used=self._used(h[1]), total=140 * GiB, free=0),
            "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=97, memory=40),
            "nvmlDeviceGetTemperature": lambda h, sensor: 66,
            "nvmlDeviceGetPowerUsage": lambda h: 512_000,
            "nvmlDeviceGetEnforcedPowerLimit": lambda h: 700_000,
            "nvmlDeviceGetComputeRunningProcesses": self._processes,
            "nvmlDeviceGetGraphicsRunningProcesses": lambda h: [],
            "nvmlEventSetCreate": lambda: "event-set",
            "nvmlDeviceRegisterEvents": lambda h, kind, es: None,
            "nvmlEventSetWait_v2": self._wait,
            "nvmlEventSetFree": lambda es: None,
        }
        for name, fn in fns.items():
            self.set(name, fn)

    def _used(self, index: int) -> int:
        return int((self.layout[index][0] if self.layout is not None else 100 + index) * GiB)

    def _processes(self, handle) -> list:
        if self.layout is not None:
            return [SimpleNamespace(pid=pid, usedGpuMemory=int(gib * GiB)) for pid, gib in self.layout[handle[1]][1]]
        return [SimpleNamespace(pid=4242, usedGpuMemory=80 * GiB), SimpleNamespace(pid=999, usedGpuMemory=None)]

    def set(self, name: str, fn) -> None:
        def counted(*args, _fn=fn, _name=name):
            self.calls[_name] = self.calls.get(_name, 0) + 1
            return _fn(*args)

        self.mp.setattr(pynvml, name, counted)

    def fail(self, name: str, code: int, only_gpu: int | None = None) -> None:
        original = getattr(pynvml, name)

        def failing(*args):
            if only_gpu is None or (args and isinstance(args[0], tuple) and args[0][1] == only_gpu):
                raise pynvml.NVMLError(code)
            return original(*args)

        self.mp.setattr(pynvml, name, failing)

    def _wait(self, event_set, timeout_ms):
        assert timeout_ms == 0, "Xid polling must not block"
        if self.xids:
            return SimpleNamespace(eventData=self.xids.pop(0), device=("handle", 1), eventType=8)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)


@pytest.fixture
def nvml(monkeypatch):
    return FakeNvml(monkeypatch)


def test_reads_every_gpu(nvml, capsys) -> None:
    sample = GpuReader().read()
    assert sample.status.state == "ok"
    assert sample.driver == "550.54.15"
    g0, g1 = sample.gpus
    assert (g0.name, g1.name) == ("NVIDIA H200", "NVIDIA H200")  # bytes and str both decode
    assert g0.memory_used == 100 * GiB and g1.memory_used == 101 * GiB and g0.memory_total == 140 * GiB
    assert g0.util_percent == 97 and g0.temperature_c == 66
    assert g0.power_w == pytest.approx(512.0) and g0.power_limit_w == pytest.approx(700.0)
    assert [(p.pid, p.used_bytes) for p in g0.processes] == [(999, None), (4242, 80 * GiB)]
    assert sample.xids == () and sample.xid_note == ""
    assert capsys.readouterr() == ("", "")


def test_xid_events_are_read_without_blocking(nvml) -> None:
    reader = GpuReader()
    reader.read()
    nvml.xids = [79, 31]
    sample = reader.read()
    assert [(x.xid, x.gpu_index) for x in sample.xids] == [(79, 1), (31, 1)]
    assert "fallen off the bus" in sample.xids[0].meaning
    assert reader.read().xids == ()


def test_xid_registration_not_supported_is_said(nvml) -> None:
    nvml.fail("nvmlDeviceRegisterEvents", pynvml.NVML_ERROR_NOT_SUPPORTED)
    sample = GpuReader().read()
    assert sample.status.state == "ok"
    assert "Xid events not watched: not supported on this GPU" in sample.xid_note
    assert "dmesg" in sample.xid_note


def test_nvml_absent(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    sample = GpuReader().read()
    assert sample.status.state == "unavailable"
    assert sample.status.message == "NVML bindings not installed (pip install nvidia-ml-py)"
    assert sample.gpus == ()


@pytest.mark.parametrize(
    "code, expect",
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "no NVIDIA driver (libnvidia-ml.so not found)"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVIDIA driver not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission to query the GPU"),
    ],
)
def test_init_failures_are_unavailable_with_a_reason(nvml, code, expect, capsys) -> None:
    nvml.fail("nvmlInit", code)
    sample = GpuReader().read()
    assert sample.status.state == "unavailable"
    assert sample.status.message.startswith(expect)
    assert capsys.readouterr() == ("", "")


def test_one_failing_call_costs_only_its_field(nvml) -> None:
    nvml.fail("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_NO_PERMISSION)
    nvml.fail("nvmlDeviceGetTemperature", pynvml.NVML_ERROR_NOT_SUPPORTED)
    sample = GpuReader().read()
    g = sample.gpus[0]
    assert g.power_w is None and g.memory_used == 100 * GiB and g.util_percent == 97
    assert g.temperature_c is None
    assert g.problems == (
        "power: no permission to query the GPU (run as root or the server's user; check /dev/nvidia* permissions)",
    )
    assert g.state == "ok", "a field the driver will not give is a note, not a broken GPU"


def test_a_lost_gpu_is_marked_and_the_other_still_read(nvml) -> None:
    nvml.fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST, only_gpu=1)
    sample = GpuReader().read()
    assert sample.status.state == "degraded"
    assert "GPU 1: memory: GPU lost" in sample.status.message
    assert sample.gpus[0].state == "ok" and sample.gpus[0].memory_used == 100 * GiB
    assert sample.gpus[1].state == "lost" and sample.gpus[1].memory_used is None


def test_a_binding_returning_garbage_is_caught(nvml) -> None:
    nvml.set("nvmlDeviceGetMemoryInfo", lambda h: "not a struct")
    sample = GpuReader().read()
    assert sample.gpus[0].memory_used is None
    assert "this nvidia-ml-py lacks a function or field" in sample.gpus[0].problems[0]


def test_driver_gone_then_back_reinitialises(nvml) -> None:
    reader = GpuReader(reinit_every_s=0.0)
    assert reader.read().status.state == "ok"
    nvml.fail("nvmlDeviceGetCount", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    down = reader.read()
    assert down.status.state == "unavailable" and down.status.message == "NVIDIA driver not loaded"
    nvml.set("nvmlDeviceGetCount", lambda: 2)
    back = reader.read()
    assert back.status.state == "ok" and len(back.gpus) == 2
    assert nvml.calls["nvmlInit"] == 2


def test_probe_reads_in_a_thread_at_a_bounded_rate(nvml) -> None:
    async def go():
        probe = GpuProbe(interval_s=0.1, min_interval_s=60.0)
        first = await probe.poll()
        second = await probe.poll()
        await probe.aclose()
        return first, second

    first, second = asyncio.run(go())
    assert first is second, "a poll within min_interval_s returns the previous read"
    assert nvml.calls["nvmlDeviceGetCount"] == 2  # one read (+ the Xid registration's count)
