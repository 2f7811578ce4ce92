"""The simulator beside a real SGLang 0.5.23 server: the same assertions on both, wherever radixtop
depends on what the server does (what /server_info says, /health generating, the batch lines, the
order and timing of a death).

The real server comes from the real-SGLang environment (`bash .ci/sglang-tests --build-only`);
without it the real half is skipped (under RADIXTOP_REQUIRE_SGLANG_SERVER=1, as in .ci/run, it
fails instead) and the simulator's half still runs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from incident_helpers import start_sim
from sglang_gate import why_no_server

from radixtop.probes.sglang import parse_server_info

_WHY = why_no_server()
KINDS = ["sim", pytest.param("real", marks=[pytest.mark.slow, pytest.mark.skipif(_WHY is not None, reason=_WHY or "")])]
# The real recipe's settings (tests/real_sglang.BASE_FLAGS), given to the simulator as SGLang flags.
SETTINGS = ("--page-size", "16", "--max-total-tokens", "4096", "--max-running-requests", "8", "--device", "cpu")
# SGLang's defaults: five seconds before crash diagnostics (tests/conftest.py turns them off).
DIAGNOSTICS_ON = {"SGLANG_PYSPY_DUMP_BEFORE_CRASH": "1", "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "1"}
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")


@dataclass
class Served:
    kind: str
    url: str
    log: Path
    proc: subprocess.Popen
    stop: Callable[[], None]

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def serve(kind: str, workdir: Path, *, fault: bool = False, flags: tuple[str, ...] = (),
          env: dict[str, str] | None = None) -> Served:
    """A server of the kind; ``flags`` are SGLang flags both take, ``env`` SGLang switches."""
    if kind == "real":
        from real_sglang import start_server

        real_env = {**DIAGNOSTICS_ON, **({"SGLANG_TEST_EVICT_FAULT": "1"} if fault else {}), **(env or {})}
        real = start_server(workdir, env=real_env, flags=flags)
        assert real.proc is not None
        return Served(kind, real.url, real.log, real.proc, real.stop)
    faults = ("--fault", "lock-race:1:threshold=0.5,probability=1.0") if fault else ()
    sim = start_sim(workdir, *SETTINGS, *faults, *flags, env={**DIAGNOSTICS_ON, **(env or {})})
    return Served(kind, sim.url, sim.log, sim.proc, sim.stop)


@pytest.fixture(scope="module", params=KINDS)
def healthy(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = serve(request.param, tmp_path_factory.mktemp(request.param))
    try:
        yield served
    finally:
        served.stop()


def test_server_info_says_what_radixtop_reads(healthy: Served) -> None:
    raw = httpx.get(f"{healthy.url}/server_info", timeout=10)
    info = parse_server_info(healthy.url, raw.content)
    assert info.version.startswith("0.5.23") and info.model, info
    assert (info.page_size, info.max_total_num_tokens, info.tp_size, info.dp_size) == (16, 4096, 1, 1), info
    assert info.enable_metrics is True and isinstance(info.launch_command, str) and info.launch_command
    doc = raw.json()
    assert doc["max_running_requests"] == 8 and doc["disable_radix_cache"] is False and doc["kv_events_config"] is None
    assert doc["internal_states"][0]["effective_max_running_requests_per_dp"] == 8
    assert isinstance(doc["model_path"], str) and isinstance(doc["tokenizer_path"], str)


def test_health_puts_a_one_token_batch_through_the_scheduler(healthy: Served) -> None:
    """Why radixtop never asks /health while watching: in 0.5.23 it generates."""
    before = healthy.text().count("Prefill batch")
    assert httpx.get(f"{healthy.url}/health", timeout=30).status_code == 200
    began = time.monotonic()
    while healthy.text().count("Prefill batch") == before and time.monotonic() - began < 10:
        time.sleep(0.1)
    added = [line for line in healthy.text().splitlines() if "Prefill batch" in line][before:]
    assert len(added) == 1 and "#new-token: 1," in added[0], added
    assert "cpu graph: False" in added[0], added[0]


def test_a_start_up_and_traffic_raise_no_alarm_in_radixtop_scan(healthy: Served) -> None:
    for i in range(3):
        body = {"input_ids": list(range(100, 164)) + [300 + i] * 8, "sampling_params": {"max_new_tokens": 4}}
        assert httpx.post(f"{healthy.url}/generate", json=body, timeout=60).status_code == 200
    found = scan(healthy.log)
    severities = {f["signature"]: f["severity"] for f in found["findings"]}
    assert severities.get("server-ready") == "info", severities
    assert not [s for s, sev in severities.items() if sev in ("error", "critical")], severities


def test_configure_logging_takes_a_crash_dump_folder_as_sglang(healthy: Served, tmp_path: Path) -> None:
    url = f"{healthy.url}/configure_logging"
    refused = httpx.post(url, json={"crash_dump_folder": 5}, timeout=30)
    assert refused.status_code == 400 and refused.json()["object"] == "error", refused.text
    assert "validation error" in refused.json()["message"] and "string_type" in refused.json()["message"]
    assert httpx.get(url, timeout=30).status_code == 400  # a body is required
    folder = str(tmp_path / "later")
    armed = httpx.post(url, json={"crash_dump_folder": folder, "dump_requests_threshold": "5"}, timeout=30)
    assert (armed.status_code, armed.content) == (200, b"")
    began = time.monotonic()
    while f"crash_dump_folder={folder!r}" not in healthy.text() and time.monotonic() - began < 10:
        time.sleep(0.1)
    line = next(line for line in healthy.text().splitlines() if f"crash_dump_folder={folder!r}" in line)
    assert "Config logging: obj=ConfigureLoggingReq(rid=None, http_worker_ipc=None, log_requests=None," in line
    assert "dump_requests_threshold=5," in line  # taken as FastAPI takes it
    assert httpx.get(f"{healthy.url}/server_info", timeout=30).json()["crash_dump_folder"] is None  # the launch's


def scan(log: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "radixtop", "scan", str(log), "--json"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def pressure(served: Served) -> set[tuple[int, ...]]:
    """400-token prompts with nothing in common, eight in flight: the pool fills with locked
    prompts and the next prefill evicts under pressure. The prompts it may have sent."""

    def prompt(i: int) -> list[int]:
        return [(i * 37 + k) % 2000 + 10 for k in range(400)]

    def one(i: int) -> None:
        if served.proc.poll() is not None:
            return
        body = {"input_ids": prompt(i), "sampling_params": {"max_new_tokens": 8 + (i % 4) * 8, "ignore_eos": True}}
        try:
            client.post(f"{served.url}/generate", json=body)
        except httpx.HTTPError:
            pass  # the server dying mid-call is the point

    # One client, its connections kept: a client made per call (its TLS context and pool) slowed
    # the eight senders enough on a loaded machine that three calls at most were in flight, the
    # pool never filled and the fault never fired.
    with httpx.Client(timeout=60, limits=httpx.Limits(max_connections=8)) as client, ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(64)))
    return {tuple(prompt(i)) for i in range(64)}


def stamp(line: str) -> datetime:
    m = STAMP.match(line)
    assert m, line
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")


@pytest.mark.parametrize("kind", KINDS)
def test_a_cache_fault_under_pressure_dies_in_sglangs_order_and_time(kind: str, tmp_path: Path) -> None:
    """The scheduler's exception, the parent's SIGQUIT line, five seconds before crash diagnostics,
    then kill_process_tree: the incident's time is the first line's, seconds before the exit."""
    served = serve(kind, tmp_path, fault=True)
    try:
        pressure(served)
        try:
            code = served.proc.wait(60)
        except subprocess.TimeoutExpired:
            raise AssertionError("the fault never fired:\n" + served.text()[-2000:]) from None
    finally:
        served.stop()
    assert code != 0
    lines = served.text().splitlines()

    def first(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    order = ["Scheduler hit an exception", "Failed to lock memory page during dynamic prefix eviction",
             "SIGQUIT received. signum=None, frame=None. It usually means one child failed.",
             "Sleeping 5 seconds before crash diagnostics", "kill_process_tree called"]
    at = [first(text) for text in order]
    assert at == sorted(at), list(zip(order, at, strict=True))
    failed, killed = stamp(lines[at[0]]), stamp(lines[at[-1]])
    assert 4 <= (killed - failed).total_seconds() <= 15, (lines[at[0]][:40], lines[at[-1]][:40])
    found = scan(served.log)
    assert found["initiating"]["signature"] == "radix-page-lock-eviction", found["initiating"]
    times = {f["signature"]: f["first"]["time"] for f in found["findings"]}
    assert times["radix-page-lock-eviction"][:19] == failed.strftime("%Y-%m-%d %H:%M:%S"), times
    assert "child-sigquit" in times, times


@pytest.mark.parametrize("kind", KINDS)
def test_a_death_with_a_crash_dump_folder_dumps_the_requests_radixtop_replays(kind: str, tmp_path: Path) -> None:
    """With --crash-dump-folder, the parent dumps the requests before its crash diagnostics and
    logs the line radixtop follows to the file; radixtop reads it as the crash's own workload."""
    from radixtop.incident.replay.crash_dump import DUMPED, read_dump

    folder = tmp_path / "dumps"
    served = serve(kind, tmp_path, fault=True, flags=("--crash-dump-folder", str(folder)))
    try:
        sent = pressure(served)
        try:
            code = served.proc.wait(60)
        except subprocess.TimeoutExpired:
            raise AssertionError("the fault never fired:\n" + served.text()[-2000:]) from None
    finally:
        served.stop()
    assert code != 0
    text = served.text()
    named = DUMPED.findall(text)
    assert len(named) == 1, text[-3000:]
    order = ["SIGQUIT received", "Dumped ", "Sleeping 5 seconds before crash diagnostics", "kill_process_tree called"]
    at = [text.index(line) for line in order]
    assert at == sorted(at), list(zip(order, at, strict=True))
    path = Path(named[0])
    assert path.parent.parent == folder and path.name.startswith("crash_dump_")
    dump = read_dump(path)
    assert dump.requests and all(r.input_ids in sent for r in dump.requests), dump.summary()
    assert dump.page_size == 16 and dump.launch_command


@pytest.mark.parametrize("kind", KINDS)
def test_force_miss_turns_reuse_off_while_the_tree_still_fills_and_evicts(kind: str, tmp_path: Path) -> None:
    """SGLANG_RADIX_FORCE_MISS=1: every match finds nothing (0 cached tokens for a repeated prompt)
    while the tree's inserts and evictions run on: reuse off, the cache's machinery on."""
    import asyncio

    from radixtop.probes.discovery import discover
    from radixtop.probes.radix import RadixProbe

    served = serve(kind, tmp_path, env={"SGLANG_RADIX_FORCE_MISS": "1"})
    try:
        prompt = list(range(100, 164)) + [7] * 20
        cached = []
        for _ in range(3):
            body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
            answer = httpx.post(f"{served.url}/generate", json=body, timeout=60).json()
            cached.append(answer["meta_info"]["cached_tokens"])
        assert cached == [0, 0, 0], cached
        pressure(served)

        async def snapshot() -> object:
            """The endpoint's capture after the traffic. A reader waits at most a second for the
            scheduler's next safe point and is otherwise given the older capture (here the one
            taken at start), so it asks again, as the radix pane does, for at most 20 s."""
            found = await discover(port=int(served.url.rsplit(":", 1)[1]))
            urls = [u for s in found.servers if s.url == served.url for u in s.instrument_urls]
            assert urls, found
            probe = RadixProbe(urls[0])
            try:
                deadline = time.monotonic() + 20
                while True:
                    snap = getattr(await probe.poll(), "snapshot", None)
                    if (snap is not None and snap.counters.lock_ops > 0) or time.monotonic() > deadline:
                        return snap
                    await asyncio.sleep(0.5)
            finally:
                await probe.aclose()

        snap = asyncio.run(snapshot())
        assert snap is not None and snap.counters.evictions > 0, snap  # the tree filled, and evicted
    finally:
        served.stop()
