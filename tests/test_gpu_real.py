"""radixtop's NVML reads against a real NVIDIA GPU and driver (everywhere else they meet FakeNvml in
tests/test_probe_gpu.py): what the GPU pane and a confirmation run's placement see of a real GPU,
of a real process holding N GiB of it, and of a node whose GPU another process has taken.

Skipped where NVML finds no GPU (here, CI) or python has no torch; with RADIXTOP_REQUIRE_GPU=1 (what
the run on a GPU machine sets) either is a failure instead, so that run cannot pass by skipping.
The memory is taken by child processes (plain torch allocations through cudaMalloc, never managed
memory, never more than the GPU has free), each stopped by its pid in a `finally`; this process
itself never opens a CUDA context, so every byte NVML shows moving is a child's.

With RADIXTOP_GPU_EVIDENCE=DIR, what a person would see is written there: gpu_evidence.jsonl (every
figure compared, the fields this GPU does not support, the placement's lines), gpu_panes.txt (the
pane's text) and gpu_pane_*.svg (its screenshots).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from textual.app import App, ComposeResult

from radixtop.incident.confirm.placement import place
from radixtop.probes.gpu import GpuInfo, GpuProbe, GpuReader, GpuSample
from radixtop.widgets.fmt import size
from radixtop.widgets.gpu import GpuPane, render_gpus

GiB = 1 << 30
MiB = 1 << 20
HOLD_GIB = 8  # what the one-holder test allocates
LEAVE_GIB = 2  # what the taken-node test leaves free
CONTEXT_SLACK = 2 * GiB  # a CUDA context's own memory, counted to its process by NVML (about 0.5 GiB on an H100)
READY_TIMEOUT_S = 120.0  # a child's torch import and CUDA start, on a cold machine
SETTLE_TIMEOUT_S = 20.0  # NVML catching up with a process that started or died
SGLANG_FLAGS = ("--model-path", "m", "--tp-size", "1")  # a one-GPU server for the placement

# The child: start CUDA, report what torch sees, take memory (hold: N GiB in one tensor; fill: 1 GiB,
# then smaller, pieces while more than LEAVE GiB would stay free), report again, then wait on stdin.
CHILD = r"""
import json, sys, torch
mode, arg = sys.argv[1], float(sys.argv[2])
GiB = 1 << 30
dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
torch.zeros(1, device=dev)
torch.ones(1, dtype=torch.uint8, device=dev)  # the fill kernel loaded before the memory is counted
torch.cuda.synchronize()
props = torch.cuda.get_device_properties(dev)
free0, total = torch.cuda.mem_get_info(dev)
held = []
if mode == "hold":
    want = int(arg * GiB)
    if want > free0 - GiB:
        print(json.dumps({"error": f"asked {want} bytes with {free0} free"}), flush=True)
        sys.exit(3)
    held.append(torch.empty(want, dtype=torch.uint8, device=dev))
elif mode == "fill":
    leave = int(arg * GiB)
    for chunk in (GiB, 256 << 20, 32 << 20):
        for _ in range(100000):
            free, _t = torch.cuda.mem_get_info(dev)
            if free - chunk < leave:
                break
            held.append(torch.empty(chunk, dtype=torch.uint8, device=dev))
for t in held:
    t.fill_(1)
torch.cuda.synchronize()
free1, _t = torch.cuda.mem_get_info(dev)
print(json.dumps({
    "name": torch.cuda.get_device_name(dev), "uuid": str(getattr(props, "uuid", "")),
    "total": total, "free_before": free0, "free_after": free1,
    "held": sum(t.numel() for t in held), "pieces": len(held), "torch": torch.__version__,
}), flush=True)
if mode != "facts":
    sys.stdin.read()
"""


# ------------------------------------------------------------------------------------------------
# evidence


def _evidence_dir() -> Path | None:
    where = os.environ.get("RADIXTOP_GPU_EVIDENCE")
    if not where:
        return None
    path = Path(where)
    path.mkdir(parents=True, exist_ok=True)
    return path


def record(what: str, **data) -> None:
    """One line of gpu_evidence.jsonl (and stdout, shown by pytest -rA)."""
    line = json.dumps({"what": what, "time": round(time.time(), 3), **data}, default=str)
    print(line)
    where = _evidence_dir()
    if where is not None:
        with open(where / "gpu_evidence.jsonl", "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def keep_text(title: str, text: str) -> None:
    print(f"--- {title}\n{text}")
    where = _evidence_dir()
    if where is not None:
        with open(where / "gpu_panes.txt", "a", encoding="utf-8") as fh:
            fh.write(f"=== {title}\n{text}\n\n")


def _gpu_dict(gpu: GpuInfo) -> dict:
    return asdict(gpu)


# ------------------------------------------------------------------------------------------------
# children that hold GPU memory


class Holder:
    """A child process holding GPU memory through torch until killed by its pid."""

    def __init__(self, mode: str, arg: float) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the machine's own torch
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, mode, str(arg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, env=env, text=True,
        )
        self.pid = self.proc.pid
        self.facts: dict = {}

    def ready(self, timeout_s: float = READY_TIMEOUT_S) -> dict:
        """The child's one JSON line, once its memory is taken."""
        assert self.proc.stdout is not None
        readable, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if readable else ""
        if not line:
            self.err.seek(0)
            err = self.err.read()[-2000:]
            self.stop()
            pytest.fail(f"child {self.pid} said nothing in {timeout_s:.0f} s (exit {self.proc.returncode}): {err}")
        self.facts = {**json.loads(line), "pid": self.pid}
        assert "error" not in self.facts, self.facts
        return self.facts

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)
        for stream in (self.proc.stdin, self.proc.stdout, self.err):
            if stream is not None:
                stream.close()


def torch_facts() -> dict:
    """What torch says of device 0, from a child that exits (this process keeps no CUDA context)."""
    child = Holder("facts", 0)
    try:
        return child.ready()
    finally:
        child.stop()


# ------------------------------------------------------------------------------------------------
# reading through radixtop


def _why_not_here(sample: GpuSample) -> str | None:
    if not sample.status.ok or not sample.gpus:
        return f"NVML finds no GPU here ({sample.status.state}: {sample.status.message or 'no GPU listed'})"
    if importlib.util.find_spec("torch") is None:
        return "a GPU is here, but this python has no torch to allocate GPU memory with"
    return None


@pytest.fixture(scope="module")
def reader():
    """radixtop's NVML reader, one for the module; skips (or, with RADIXTOP_REQUIRE_GPU=1, fails)
    where there is no GPU to read."""
    gpu_reader = GpuReader()
    try:
        first = gpu_reader.read()
        why = _why_not_here(first)
        if why is not None:
            if os.environ.get("RADIXTOP_REQUIRE_GPU") == "1":
                pytest.fail(f"RADIXTOP_REQUIRE_GPU=1 but {why}")
            pytest.skip(why)
        yield gpu_reader
    finally:
        gpu_reader.close()


@pytest.fixture(scope="module")
def facts(reader) -> dict:
    return torch_facts()


def our_gpu(sample: GpuSample, facts: dict) -> GpuInfo:
    """The GPU torch calls device 0: by UUID (NVML's and CUDA's orders may differ), else the only one."""
    uuid = facts.get("uuid", "")
    for gpu in sample.gpus:
        if uuid and gpu.uuid.removeprefix("GPU-").removeprefix("MIG-") == uuid:
            return gpu
    assert len(sample.gpus) == 1, f"torch's device 0 ({uuid!r}) is none of NVML's {[g.uuid for g in sample.gpus]}"
    return sample.gpus[0]


def read_until(reader: GpuReader, facts: dict, done, what: str, timeout_s: float = SETTLE_TIMEOUT_S):
    """Read until done(gpu) or timeout; returns (sample, gpu, met)."""
    deadline = time.monotonic() + timeout_s
    while True:
        sample = reader.read()
        assert sample.status.ok, f"NVML read failed while waiting for {what}: {sample.status.message}"
        gpu = our_gpu(sample, facts)
        if done(gpu):
            return sample, gpu, True
        if time.monotonic() >= deadline:
            return sample, gpu, False
        time.sleep(0.25)


def held_by(gpu: GpuInfo, pid: int):
    return next((p for p in gpu.processes if p.pid == pid), None)


def settled_baseline(reader: GpuReader, facts: dict, gone: tuple[int, ...] = ()) -> GpuInfo:
    """The GPU once no process of `gone` is listed (a child just killed takes NVML a moment)."""
    _, gpu, met = read_until(reader, facts, lambda g: not any(held_by(g, pid) for pid in gone), "children to go")
    assert met, f"pids {gone} still listed on GPU {gpu.index} after {SETTLE_TIMEOUT_S:.0f} s: {gpu.processes}"
    return gpu


# ------------------------------------------------------------------------------------------------
# the pane, headless


class PaneApp(App):
    def compose(self) -> ComposeResult:
        yield GpuPane(id="pane")


def screen_text(app: App) -> str:
    """The screen as plain text (trailing blanks dropped)."""
    return "\n".join(strip.text.rstrip() for strip in app.screen._compositor.render_strips()).rstrip()


async def _render_pane(sample: GpuSample, server_pids: dict[int, str], shot: str) -> str:
    app = PaneApp()
    async with app.run_test(size=(120, 20)) as pilot:
        app.query_one(GpuPane).show(sample, server_pids=server_pids, now=time.time())
        await pilot.pause()
        text = screen_text(app)
        where = _evidence_dir()
        if where is not None:
            app.save_screenshot(filename=f"{shot}.svg", path=str(where))
    return text


def render_pane(sample: GpuSample, server_pids: dict[int, str], shot: str) -> str:
    return asyncio.run(_render_pane(sample, server_pids, shot))


# ------------------------------------------------------------------------------------------------
# 1. the GPU as it is


def _direct(name: str, *args):
    """pynvml itself, for what radixtop left out: the value, or the NVMLError's code (or the
    exception's name where the binding itself fails)."""
    import pynvml

    try:
        return getattr(pynvml, name)(*args), None
    except pynvml.NVMLError as exc:
        return None, exc.value
    except Exception as exc:
        return None, type(exc).__name__


def test_the_probe_reads_the_gpu_torch_sees(reader, facts):
    """The pane's probe (GpuProbe, as the app polls it) reads the real GPU: torch's name, torch's
    total memory (NVML's total also counts the driver's reserve: within 1 GiB), state ok, and no
    problem lines; a field left empty is one the driver says it does not support."""

    async def poll() -> GpuSample:
        probe = GpuProbe()
        try:
            return await probe.poll()
        finally:
            await probe.aclose()

    settled_baseline(reader, facts, gone=(facts["pid"],))  # torch's child has just exited
    sample = asyncio.run(poll())
    assert sample.status.state == "ok", sample.status
    gpu = our_gpu(sample, facts)
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
        v2, _ = (_direct("nvmlDeviceGetMemoryInfo", handle, pynvml.nvmlMemory_v2)
                 if hasattr(pynvml, "nvmlMemory_v2") else (None, None))
        unsupported = {}
        direct = {
            "util_percent": ("nvmlDeviceGetUtilizationRates", (handle,)),
            "temperature_c": ("nvmlDeviceGetTemperature", (handle, pynvml.NVML_TEMPERATURE_GPU)),
            "power_w": ("nvmlDeviceGetPowerUsage", (handle,)),
            "power_limit_w": ("nvmlDeviceGetEnforcedPowerLimit", (handle,)),
        }
        for key, (fn, args) in direct.items():
            if getattr(gpu, key) is None:
                value, code = _direct(fn, *args)
                unsupported[key] = {"nvml": fn, "code": code, "value": str(value)}
    finally:
        pynvml.nvmlShutdown()
    record("gpu", gpu=_gpu_dict(gpu), driver=sample.driver, xid_note=sample.xid_note, read_s=sample.seconds,
           torch=facts, nvml_total_minus_torch_total=(gpu.memory_total or 0) - facts["total"],
           nvml_reserved=getattr(v2, "reserved", None), unsupported=unsupported)

    assert gpu.state == "ok" and gpu.problems == (), gpu.problems
    assert gpu.name == facts["name"], (gpu.name, facts["name"])
    assert gpu.uuid.startswith(("GPU-", "MIG-")), gpu.uuid
    assert sample.driver and re.fullmatch(r"\d+(\.\d+)+", sample.driver), sample.driver
    assert gpu.memory_total is not None and gpu.memory_used is not None
    tolerance = max(GiB, gpu.memory_total // 100)
    assert abs(gpu.memory_total - facts["total"]) <= tolerance, (
        f"NVML total {gpu.memory_total} vs torch total {facts['total']}")
    assert 0 <= gpu.memory_used <= gpu.memory_total
    # An empty field is the driver's "not supported" (code 3), never a swallowed error.
    for key, why in unsupported.items():
        assert why["code"] == pynvml.NVML_ERROR_NOT_SUPPORTED, f"{key} is empty, but NVML answers {why}"
    if gpu.util_percent is not None:
        assert 0 <= gpu.util_percent <= 100
    if gpu.temperature_c is not None:
        assert 5 <= gpu.temperature_c <= 110
    if gpu.power_limit_w is not None:
        assert 50 <= gpu.power_limit_w <= 2000
        if gpu.power_w is not None:
            assert 0 < gpu.power_w <= gpu.power_limit_w * 1.5
    # An idle GPU is one a confirmation run can use: the same placement that refuses a taken one.
    if not gpu.processes:
        placed = place("sglang", SGLANG_FLAGS, sample, original_pids=set())
        record("placement-idle", status=placed.status, lines=placed.lines, visible=placed.visible)
        assert placed.status == "placed" and placed.chosen == (gpu.index,), placed.lines
        assert placed.visible == (gpu.uuid or str(gpu.index))
    else:
        record("placement-idle-skipped", why="the GPU already had processes", processes=gpu.processes)


# ------------------------------------------------------------------------------------------------
# 2. one process holding N GiB


def test_a_process_holding_gib_is_listed_with_its_pid_and_size(reader, facts):
    """A child holding HOLD_GIB GiB: memory_used rises by that (plus its CUDA context), and the
    sample lists the child's pid with that much; where the driver does not attribute memory to
    pids, radixtop must say so rather than show another figure. Killed, it leaves the sample."""
    base = settled_baseline(reader, facts)
    child = Holder("hold", HOLD_GIB)
    try:
        told = child.ready()
        want = HOLD_GIB * GiB
        assert want <= told["held"] <= want + 2 * MiB and told["free_before"] - told["free_after"] >= want
        sample, gpu, listed = read_until(reader, facts, lambda g: held_by(g, child.pid) is not None, "the child's pid")
        rise = (gpu.memory_used or 0) - (base.memory_used or 0)
        proc = held_by(gpu, child.pid)
        pane = render_gpus(sample, server_pids={child.pid: "holder"}, width=120).plain
        record("hold", pid=child.pid, child=told, rise=rise, listed=listed, proc=proc,
               processes=gpu.processes, base_used=base.memory_used, used=gpu.memory_used)
        keep_text(f"render_gpus with {HOLD_GIB} GiB held by pid {child.pid} (named 'holder')", pane)

        assert want <= rise <= want + CONTEXT_SLACK, f"memory_used rose by {rise / GiB:.2f} GiB for {HOLD_GIB} GiB"
        if proc is not None and proc.used_bytes is not None:
            assert want <= proc.used_bytes <= want + CONTEXT_SLACK, f"pid {child.pid}: {proc.used_bytes / GiB:.2f} GiB"
            assert abs(proc.used_bytes - rise) <= GiB, (proc.used_bytes, rise)
            assert re.search(rf"pid {child.pid}\s+holder\s+{re.escape(size(proc.used_bytes))}", pane), pane
        elif proc is not None:  # listed, but the driver withholds the figure: "n/a", never a number
            record("attribution", outcome="pid listed without its memory", pane=pane)
            assert re.search(rf"pid {child.pid}\s+holder\s+n/a", pane), pane
        else:  # not listed by our pid (another pid namespace): the pane must say so
            record("attribution", outcome="pid not listed", processes=gpu.processes, pane=pane)
            assert gpu.processes, f"{rise / GiB:.1f} GiB in use and NVML lists no process; the pane says:\n{pane}"
            assert "none of the server's pids is on this GPU" in pane, pane
    finally:
        child.stop()
    _, after, met = read_until(
        reader, facts,
        lambda g: held_by(g, child.pid) is None and (g.memory_used or 0) <= (base.memory_used or 0) + 512 * MiB,
        "the memory to come back")
    record("released", pid=child.pid, met=met, used=after.memory_used, base_used=base.memory_used)
    assert met, f"after kill: pid {child.pid} listed={held_by(after, child.pid)}, used {after.memory_used}"


# ------------------------------------------------------------------------------------------------
# 3. a node whose GPU is taken


def test_a_taken_gpu_is_refused_for_a_confirmation_run_and_shown_full(reader, facts):
    """A child holding all but about LEAVE_GIB GiB: the confirmation run's placement (place(), as
    prepare() calls it on read_once()'s sample) refuses the GPU with its one-line reason naming the
    holder's pid and the free memory; the GPU pane shows the GPU nearly full (red bar) and the
    holder's pid with its size."""
    settled_baseline(reader, facts)
    child = Holder("fill", LEAVE_GIB)
    try:
        told = child.ready()
        assert LEAVE_GIB * GiB - 256 * MiB <= told["free_after"] <= LEAVE_GIB * GiB + 512 * MiB, told
        sample, gpu, listed = read_until(reader, facts, lambda g: held_by(g, child.pid) is not None, "the child's pid")
        proc = held_by(gpu, child.pid)
        free = (gpu.memory_total or 0) - (gpu.memory_used or 0)
        record("taken", pid=child.pid, child=told, listed=listed, proc=proc, free=free,
               fraction=gpu.memory_fraction, processes=gpu.processes)

        # radixtop's reading: nearly full, and the free memory torch sees (within 1 GiB).
        assert gpu.memory_fraction is not None and gpu.memory_fraction >= 0.95, gpu.memory_fraction
        assert abs(free - told["free_after"]) <= GiB, (free, told["free_after"])
        if proc is not None and proc.used_bytes is not None:
            assert told["held"] <= proc.used_bytes <= told["held"] + CONTEXT_SLACK, proc

        # The confirmation run: the live server elsewhere (alive: the plan keeps to it) or gone
        # (prepare() makes the first line its blocker). Both refuse this GPU, saying why.
        alive = place("sglang", SGLANG_FLAGS, sample, original_pids=set())
        gone = place("sglang", SGLANG_FLAGS, sample, original_gone=True)
        # What it says when the holder is the live server itself (recorded, not judged here).
        own = place("sglang", SGLANG_FLAGS, sample, original_pids={child.pid})
        blocker = gone.lines[0].removeprefix("GPUs").strip()
        record("placement-taken", alive=alive.lines, gone=gone.lines, blocker=blocker,
               holder_is_live_server={"status": own.status, "room_if_stopped": own.room_if_stopped,
                                      "lines": own.lines})
        keep_text("confirmation run placement, GPU taken", "\n".join(alive.lines))
        for placed in (alive, gone):
            assert placed.status == "no-room" and not placed.can_start and placed.visible is None, placed
            assert placed.lines[0].startswith("GPUs          no room for a server radixtop starts"), placed.lines
            assert "0 of" in placed.lines[0] and "qualify" in placed.lines[0], placed.lines[0]
        assert not alive.room_if_stopped
        busy = next((line for line in alive.lines[1:] if line.strip().startswith(f"GPU {gpu.index}:")), None)
        assert busy is not None, alive.lines
        said = re.search(r"([\d.]+) GiB free", busy)
        assert said is not None and abs(float(said.group(1)) * GiB - told["free_after"]) <= GiB, busy
        if proc is not None:
            assert f"held by pid {child.pid}" in busy, busy

        # The pane, as the app shows it when the holder is not the watched server, and when it is.
        foreign = render_pane(sample, {}, "gpu_pane_taken")
        as_server = render_pane(sample, {child.pid: "scheduler TP0"}, "gpu_pane_taken_by_server")
        keep_text(f"GPU pane, GPU taken by pid {child.pid} (not the server)", foreign)
        keep_text(f"GPU pane, GPU taken by pid {child.pid} (labelled as the server's scheduler)", as_server)
        row = next((line for line in foreign.splitlines() if f"GPU {gpu.index} " in line), "")
        assert f"{size(gpu.memory_used)}/{size(gpu.memory_total)}" in row, foreign
        assert row.count("█") >= 0.9 * (row.count("█") + row.count("░")) > 0, row
        text = render_gpus(sample, width=120)
        blocks = [s for s in text.spans if set(text.plain[s.start:s.end]) == {"█"}]
        assert blocks and all(str(s.style) == "red" for s in blocks), blocks
        if proc is not None:
            shown = size(proc.used_bytes) if proc.used_bytes is not None else "n/a"
            assert re.search(rf"pid {child.pid}\s+not the server\s+{re.escape(shown)}", foreign), foreign
            assert re.search(rf"pid {child.pid}\s+scheduler TP0\s+{re.escape(shown)}", as_server), as_server
        else:  # not listed by our pid: the pane must say so, not show another holder as the answer
            record("attribution", outcome="pid not listed while the GPU is taken", pane=as_server)
            assert gpu.processes, (f"{size(gpu.memory_used)} in use and NVML lists no process: the placement says "
                                   f"{busy.strip()!r}; the pane:\n{as_server}")
            assert "none of the server's pids is on this GPU" in as_server, as_server
    finally:
        child.stop()
    settled_baseline(reader, facts, gone=(child.pid,))
