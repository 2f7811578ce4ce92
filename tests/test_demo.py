"""`radixtop demo`'s moving parts on real processes: the simulator, the load, the replay core."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import httpx
import psutil
import pytest

from radixtop.demo import DemoError, start_demo
from radixtop.incident.replay.crash_dump import crash_workload
from radixtop.incident.replay.replay import replay_once
from radixtop.incident.replay.trace import builtin_trace, plan_requests, rescale_prefixes


def _wait_for(predicate, timeout_s: float, step_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return predicate()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
def test_demo_lock_race_happens_within_a_minute_and_stop_leaves_nothing(tmp_path: Path) -> None:
    demo = start_demo("lock-race", workdir=tmp_path)
    try:
        log = demo.log_file
        assert _wait_for(lambda: "RadixCacheError" in log.read_text(errors="replace"), 60), (
            "the lock-race fault did not fire within 60 s under the demo workload"
        )
        text = log.read_text(errors="replace")
        # The seed's fingerprint: an early warning, then the error, then the server going down.
        assert text.index("eviction contended with a page lock") < text.index("RadixCacheError")
        assert "SIGQUIT received. signum=None, frame=None. It usually means one child failed." in text
        # It dies as SGLang does, and the demo reaps it at once (no poll() here: that would reap
        # it itself): no zombie of the demo's own making in the processes pane.
        # The reaper thread's wait() records the status just after the kernel lets the pid go.
        assert _wait_for(lambda: not psutil.pid_exists(demo.sim.pid) and demo.sim.returncode is not None, 10), (
            "the simulator did not die, or is a zombie"
        )
        assert demo.sim.returncode != 0
    finally:
        demo.stop()
    assert _gone(demo.sim.pid)
    assert demo.load is not None and _gone(demo.load.pid)
    # Before its crash diagnostics it dumped the requests it saw, as SGLang with --crash-dump-folder:
    # what the confirmation run (the UI's c) replays as the crash's own workload.
    text = log.read_text(errors="replace")
    assert text.index("SIGQUIT received") < text.index("Dumped ") < text.index("kill_process_tree")
    own = crash_workload([str(log)], None)
    assert own is not None, "no crash dump named in the demo's log"
    trace, dump = own
    assert dump.path.parent.parent == demo.crash_dump_folder.absolute()
    assert dump.page_size == 16 and len(trace.requests) == len(dump.requests) > dump.in_flight >= 1  # finished ones too
    assert sum(r.in_flight for r in trace.requests) == dump.in_flight


def test_demo_without_fault_serves_until_stopped(tmp_path: Path) -> None:
    demo = start_demo("none", workdir=tmp_path, with_load=False)
    try:
        assert httpx.get(f"{demo.url}/health", timeout=5).status_code == 200
        assert demo.url.startswith("http://127.0.0.1:")
    finally:
        demo.stop()
    assert _gone(demo.sim.pid)
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{demo.url}/health", timeout=2)


def test_demo_rejects_an_unknown_fault(tmp_path: Path) -> None:
    with pytest.raises(DemoError, match="unknown fault 'nope'; choose one of"):
        start_demo("nope", workdir=tmp_path)


def test_demo_reports_a_simulator_that_cannot_start(tmp_path: Path) -> None:
    with pytest.raises(DemoError, match="the simulator exited"):
        start_demo("none", workdir=tmp_path, with_load=False, extra_flags=["--page-size", "-3"])


def _replay(url: str, trace, runs: int, flush: bool = True) -> dict[tuple[str, int], set[str]]:
    """Each call's (request id, copy) -> the distinct outputs it got across the runs."""

    async def go() -> dict[tuple[str, int], set[str]]:
        variants: dict[tuple[str, int], set[str]] = {}
        async with httpx.AsyncClient(timeout=30) as client:
            for _ in range(runs):
                if flush:
                    assert (await client.post(f"{url}/flush_cache")).status_code == 200
                run = await replay_once(client, url, plan_requests(trace))
                assert run.errors == 0, [o.error for o in run.outcomes if o.error]
                for outcome in run.outcomes:
                    variants.setdefault((outcome.request_id, outcome.copy), set()).add(outcome.text)
        return variants

    return asyncio.run(go())


@pytest.mark.parametrize("page_size", [64, 16])
def test_block_boundary_replayed_over_http_diverges_only_on_the_one_page_prefix(tmp_path: Path, page_size: int) -> None:
    trace = rescale_prefixes(builtin_trace("finding_03330"), page_size)
    demo = start_demo(
        "block-boundary", workdir=tmp_path, with_load=False,
        extra_flags=["--page-size", str(page_size), "--max-total-tokens", "65536"],
    )
    try:
        variants = _replay(demo.url, trace, runs=4)
    finally:
        demo.stop()
    diverged = {rid for (rid, _copy), texts in variants.items() if len(texts) > 1}
    assert diverged == {"r02"}, variants


def test_block_boundary_is_gone_with_the_radix_cache_disabled(tmp_path: Path) -> None:
    trace = builtin_trace("finding_03330")
    demo = start_demo(
        "block-boundary", workdir=tmp_path, with_load=False,
        extra_flags=["--page-size", "64", "--max-total-tokens", "65536", "--disable-radix-cache"],
    )
    try:
        variants = _replay(demo.url, trace, runs=4)
    finally:
        demo.stop()
    assert all(len(texts) == 1 for texts in variants.values()), variants
    assert len(variants) == sum(r.n for r in trace.requests)


@pytest.mark.slow
def test_demo_lock_race_stays_away_when_running_requests_are_bounded(tmp_path: Path) -> None:
    """The same demo workload with --max-running-requests 2 never reaches the fault's token usage."""
    demo = start_demo("lock-race", workdir=tmp_path, extra_flags=["--max-running-requests", "2"])
    try:
        time.sleep(25)  # the unbounded demo dies within ~15 s of this workload
        text = demo.log_file.read_text(errors="replace")
        assert demo.sim.poll() is None, "the bounded simulator died"
    finally:
        demo.stop()
    assert "RadixCacheError" not in text and "contended with a page lock" not in text
    usages = [float(u) for u in re.findall(r"token usage: ([0-9.]+)", text)]
    assert len(usages) > 20, "the workload did not run"
    assert max(usages) < 0.9
