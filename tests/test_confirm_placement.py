"""Where the confirmation run's servers go: NVML faked at the pynvml functions (no GPU here)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from incident_helpers import HEALTHY_FLAGS, small_trace, start_sim
from test_probe_gpu import FakeNvml

from radixtop.incident.common.sighting import load_sighting
from radixtop.incident.confirm.confirm import ConfirmOptions, PlanError, prepare
from radixtop.incident.confirm.confirm_run import ConfirmationRun
from radixtop.incident.confirm.placement import gpus_needed, place
from radixtop.probes.gpu import GpuReader

LIVE = 4242  # the live server's pid in the fake layouts
SGLANG = ("--model-path", "m", "--tp-size", "2", "--mem-fraction-static", "0.85")


def read(monkeypatch, layout) -> object:
    FakeNvml(monkeypatch, layout=layout)
    reader = GpuReader()
    try:
        return reader.read()
    finally:
        reader.close()


def test_gpus_needed_follow_sglangs_parallel_flags():
    assert gpus_needed(["--tp-size", "4"]) == 4
    assert gpus_needed(["--tp", "2", "--dp-size", "2"]) == 4
    assert gpus_needed(["--tp", "2", "--dp-size", "4", "--enable-dp-attention"]) == 2
    assert gpus_needed(["--tp-size", "2", "--pp-size", "2"]) == 4
    assert gpus_needed([]) == 1


def test_eight_gpus_two_idle_places_the_control_on_the_idle_two_by_uuid(monkeypatch):
    layout = [(120, [(LIVE, 118)])] * 2 + [(130, [(777, 128)])] * 4 + [(0.5, [])] * 2
    sample = read(monkeypatch, layout)
    placed = place("sglang", SGLANG, sample, original_pids={LIVE})
    assert placed.status == "placed" and placed.chosen == (6, 7)
    assert placed.visible == "GPU-0006,GPU-0007"
    flags, env, changes = placed.apply([*SGLANG, "--base-gpu-id", "2"], {"PATH": "/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-0006,GPU-0007" and "--base-gpu-id" not in flags
    assert any("CUDA_VISIBLE_DEVICES" in c for c in changes)


def test_every_gpu_busy_needs_the_original_stopped_and_never_fits_a_control_beside_it(monkeypatch):
    layout = [(120, [(LIVE, 118)])] * 2 + [(130, [(777, 128)])] * 6
    sample = read(monkeypatch, layout)
    busy = place("sglang", SGLANG, sample, original_pids={LIVE})
    assert busy.status == "no-room" and busy.room_if_stopped and not busy.can_start
    assert "--stop-original stops the live server first" in busy.lines[0]
    assert any("GPU 0" in line and "the live server" in line for line in busy.lines)
    # Stopping it frees its two GPUs: exactly what the control needs.
    after = place("sglang", SGLANG, sample, original_pids={LIVE}, will_stop=True)
    assert after.status == "placed" and after.chosen == (0, 1)
    # Others hold everything: nothing the user can approve here.
    full = place("sglang", SGLANG, read(monkeypatch, [(130, [(777, 128)])] * 8), original_pids={LIVE})
    assert full.status == "no-room" and not full.room_if_stopped


def test_a_gpu_with_too_little_free_memory_does_not_count_as_idle(monkeypatch):
    # The live server held 100 GiB per GPU; an idle GPU with 60 GiB free cannot take a copy of it.
    layout = [(101, [(LIVE, 100)])] * 2 + [(80, [])] * 2
    placed = place("sglang", SGLANG, read(monkeypatch, layout), original_pids={LIVE})
    assert placed.status == "no-room"


def test_without_nvml_the_placement_is_unknown_and_says_what_to_pass(monkeypatch):
    nvml = FakeNvml(monkeypatch)
    nvml.fail("nvmlInit", 12)  # the library is not there
    reader = GpuReader()
    sample = reader.read()
    placed = place("sglang", SGLANG, sample, original_pids={LIVE})
    assert placed.status == "unknown" and placed.can_start
    assert "no NVIDIA driver" in placed.lines[0] and "--gpus" in placed.lines[0]
    assert place("radixtop-sim", [], None).status == "not-needed"


def test_a_server_on_the_cpu_needs_no_gpu_even_where_every_gpu_is_taken(monkeypatch):
    full = read(monkeypatch, [(130, [(777, 128)])] * 2)  # both GPUs held by another process
    assert place("sglang", SGLANG, full, original_pids={LIVE}).status == "no-room"
    for flags in ((*SGLANG, "--device", "cpu"), (*SGLANG, "--device=cpu")):
        for sample in (full, None):
            placed = place("sglang", flags, sample, original_pids={LIVE})
            assert placed.status == "not-needed" and placed.visible is None
            assert "--device cpu" in placed.lines[0]
    assert place("sglang", SGLANG, None, given="1,2").visible == "1,2"


def _options(tmp_path: Path, url: str, **kw) -> ConfirmOptions:
    return ConfirmOptions(url=url, workdir=tmp_path / "c", trace=small_trace(), runs=1, bundle=False,
                          control_timeout_s=20, **kw)


def test_a_node_whose_gpus_others_hold_keeps_every_step_on_the_live_server(tmp_path: Path, monkeypatch):
    """An SGLang launch (given) on a node whose GPUs others hold: no server is started, the steps
    run on the live one, and the plan says the cache question stays open."""
    sim = start_sim(tmp_path / "live", *HEALTHY_FLAGS)
    try:
        FakeNvml(monkeypatch, layout=[(130, [(777, 128)])] * 8)
        options = _options(tmp_path, sim.url, launch_command="python -m sglang.launch_server " + " ".join(SGLANG))
        plan = asyncio.run(prepare(options))
        assert not plan.blockers and plan.mode == "live-only" and plan.restart is None and plan.control is None
        text = "\n".join(plan.describe())
        assert "no room for a server radixtop starts" in text and "open: cache: no GPU is free" in text
        run = ConfirmationRun(plan)
        verdict = asyncio.run(run.run())
        assert run.servers == [] and {s.role for s in verdict.steps} == {"baseline"}
        assert verdict.verdict == "not-reproduced"
        assert sim.proc.poll() is None
    finally:
        sim.stop()
    # With the original gone and no GPU free, nothing can run: one line says why.
    FakeNvml(monkeypatch, layout=[(130, [(777, 128)])] * 8)
    gone = asyncio.run(prepare(options))
    assert gone.blockers and "no room for a server radixtop starts" in gone.blockers[0]
    with pytest.raises(PlanError, match="no room"):
        asyncio.run(ConfirmationRun(gone).run())


def test_a_plan_that_needs_the_originals_gpus_keeps_to_it_unless_asked_to_stop_it(tmp_path: Path, monkeypatch):
    sim = start_sim(tmp_path / "live", *HEALTHY_FLAGS)
    try:
        FakeNvml(monkeypatch, layout=[(120, [(sim.pid, 118)])] * 2 + [(130, [(777, 128)])] * 6)
        options = _options(tmp_path, sim.url, launch_command="python -m sglang.launch_server " + " ".join(SGLANG))
        plan = asyncio.run(prepare(options))
        stopping = asyncio.run(prepare(replace(options, stop_original=True)))
    finally:
        sim.stop()
    assert plan.mode == "live-only" and not plan.blockers and [a.role for a in plan.arms] == ["baseline"]
    assert "--stop-original stops the live server first" in "\n".join(plan.describe())
    # What was seen of it includes the GPUs its process held (for a plan made after it dies).
    seen = load_sighting(sim.url)
    assert seen is not None and [g.index for g in seen.gpus] == [0, 1] and seen.gpus[0].used_bytes == 118 << 30
    # Asked to stop it: the experiment runs on its GPUs, on a reproduction and a control.
    assert stopping.mode == "relaunch" and stopping.stops_original and not stopping.blockers
    assert [a.role for a in stopping.arms] == ["reproduction", "control"]
    assert all(a.env["CUDA_VISIBLE_DEVICES"] == "GPU-0000,GPU-0001" for a in stopping.arms)
    assert "STOPPED FIRST" in "\n".join(stopping.describe())


def test_a_sighting_with_impossible_numbers_is_read_without_them(monkeypatch):
    """A sighting is a file in the runtime directory, read back, not trusted: a time past any clock
    and a GPU's memory as text are left out, not an OverflowError or a TypeError in the plan."""
    import json

    from radixtop.incident.common.sighting import observe, save_sighting
    from radixtop.rundir import write_file

    url = "http://127.0.0.1:31999"
    path = save_sighting(observe(url, None, server_info={"version": "x"}))
    doc = json.loads(path.read_text())
    doc["last_seen"] = 1e300
    doc["died_at"] = float("inf")
    doc["gpus"] = [{"index": 0, "uuid": "GPU-0000", "used_bytes": "lots", "total_bytes": [1]}]
    write_file(path, json.dumps(doc).encode())
    seen = load_sighting(url)
    assert seen is not None and seen.last_seen == 0.0 and seen.died_at is None
    assert "planned from what was seen at" in seen.describe_age() or "found" in seen.describe_age()
    assert seen.gpus[0].used_bytes is None and seen.gpus[0].total_bytes is None
    sample = read(monkeypatch, [(0.5, [])] * 2)
    placed = place("sglang", SGLANG, sample, original_pids=set(),
                   original_use={g.uuid: g.used_bytes for g in seen.gpus}, original_gone=True)
    assert placed.status == "placed"
