"""Live alarms for what must be back to zero once the server is idle: a lock never released (the
instrument's locked tokens), slots held by nothing (free + evictable + locked short of the pool),
and, without the instrument, /metrics' tokens in use. Held to the real server: its pool gauges
stay stale for 30 s after it turns idle, which must not raise an alarm."""

from __future__ import annotations

import re
import shutil
import sys
import time
from pathlib import Path

import httpx
import pytest
from pane_helpers import make_snapshot
from sglang_gate import why_no_server

from radixtop.probes.sglang import ServerInfo, ServerMetrics, ServerSample, parse_metrics
from radixtop.probes.status import SourceState
from radixtop.session.idle_watch import HOLD_S, METRICS_HOLD_S, IdleWatch
from radixtop.session.live import LiveState

OK = SourceState("ok")
INFO = ServerInfo("http://127.0.0.1:1", "sglang", max_total_num_tokens=4096)


def server(t: float, running: float, queued: float = 0, **values: float) -> ServerSample:
    metrics = ServerMetrics("sglang", {"running": running, "queued": queued, **values})
    return ServerSample(INFO.url, OK, t, INFO, metrics)


def test_a_lock_held_while_nothing_runs_is_raised_once_after_the_hold() -> None:
    watch = IdleWatch()
    locked = make_snapshot(protected_tokens=48, available_tokens=2000, evictable_tokens=2048)
    assert watch.server(server(0, running=3)) == [] and watch.snapshot(0, locked, 0) == []  # working: locks are held
    watch.server(server(1, running=0))
    assert watch.snapshot(0, locked, 1) == []
    assert watch.snapshot(0, locked, 1 + HOLD_S - 1) == []  # a request finishing between polls is no leak
    (alarm,) = watch.snapshot(0, locked, 1 + HOLD_S)
    assert (alarm.kind, alarm.rank, alarm.tokens, alarm.time) == ("leaked-lock", 0, 48, 1)
    assert "48 tokens locked while nothing runs or waits: a lock was not released" in alarm.message
    assert watch.snapshot(0, locked, 100) == []  # once per episode
    watch.server(server(101, running=1))  # the server works again: a leak after it is a new one
    watch.server(server(102, running=0))
    assert watch.snapshot(0, locked, 102) == []
    assert [a.kind for a in watch.snapshot(0, locked, 102 + HOLD_S)] == ["leaked-lock"]


def test_slots_held_by_nothing_while_idle_are_a_pool_short_of_its_size() -> None:
    watch = IdleWatch()
    watch.server(server(0, running=0))
    short = make_snapshot(protected_tokens=0, available_tokens=2000, evictable_tokens=2080)  # 16 of 4,096 missing
    assert watch.snapshot(1, short, 0) == []
    (alarm,) = watch.snapshot(1, short, HOLD_S)
    assert alarm.kind == "pool-short" and alarm.tokens == 16
    assert "16 of 4,096 tokens neither free nor in the tree" in alarm.message
    whole = make_snapshot(protected_tokens=0, available_tokens=2016, evictable_tokens=2080)
    assert watch.snapshot(1, whole, HOLD_S + 1) == []  # back to its size: the episode ends
    assert watch.snapshot(1, short, HOLD_S + 2) == []
    assert [a.kind for a in watch.snapshot(1, short, 2 * HOLD_S + 2)] == ["pool-short"]


def test_without_the_instrument_metrics_in_use_while_idle_wait_out_sglangs_stale_gauges() -> None:
    watch = IdleWatch()
    stale = {"available_tokens": 3872.0, "evictable_tokens": 112.0, "token_usage": 0.03}
    assert watch.server(server(0, running=0, **stale)) == []
    assert watch.server(server(30, running=0, **stale)) == []
    # the real server's refresh, 30 s into idleness: the figure is back to zero and nothing is raised
    assert watch.server(server(32, running=0, available_tokens=3872.0, evictable_tokens=224.0)) == []
    assert watch.server(server(32 + METRICS_HOLD_S, running=0, available_tokens=3872.0, evictable_tokens=224.0)) == []
    leaking = {"available_tokens": 3872.0, "evictable_tokens": 200.0}
    assert watch.server(server(100, running=0, **leaking)) == []
    (alarm,) = watch.server(server(100 + METRICS_HOLD_S, running=0, **leaking))
    assert alarm.kind == "used-while-idle" and alarm.rank is None and alarm.tokens == 24
    assert watch.server(server(200, running=0, queued=2, **leaking)) == []  # waiting requests: not idle
    assert IdleWatch().server(ServerSample(INFO.url, OK, 0, INFO, None)) == []  # no metrics: nothing guessed


def test_live_state_puts_the_alarms_among_the_radix_panes_anomalies() -> None:
    from radixtop.probes.radix import RadixSample

    state = LiveState()
    state.apply(server(0, running=0))
    snap = make_snapshot(protected_tokens=32, available_tokens=2000, evictable_tokens=2064, when=0)
    for t in (0, HOLD_S):
        state.apply(RadixSample("http://127.0.0.1:39100", OK, t, rank=0, snapshot=snap))
    (anomaly,) = [a for a in state.board.anomalies if a.kind == "leaked-lock"]
    assert anomaly.rank == 0 and "32 tokens locked" in anomaly.message


NO_SERVER = why_no_server()
needs_server = pytest.mark.skipif(NO_SERVER is not None, reason=NO_SERVER or "")


@needs_server
@pytest.mark.slow
def test_a_healthy_real_server_raises_nothing_while_its_gauges_catch_up(tmp_path: Path) -> None:
    """The real server, idle after two requests: /metrics says 112 tokens in use for its first 30 s
    idle (measured), then 0; the instrument says nothing is locked. No alarm in 45 s of polling."""
    from real_sglang import start_server

    srv = start_server(tmp_path, plugin=False)
    try:
        for first in (1, 200):
            srv.generate(list(range(first, first + 100)), max_new_tokens=20)
        watch = IdleWatch()
        info = ServerInfo(srv.url, "sglang", max_total_num_tokens=4096)
        began = time.monotonic()
        seen_used = []
        alarms = []
        while time.monotonic() - began < METRICS_HOLD_S + 5:  # bounded: ~50 s
            metrics = parse_metrics(httpx.get(srv.url + "/metrics", timeout=10).text)
            seen_used.append(4096 - metrics.get("available_tokens") - metrics.get("evictable_tokens"))
            alarms += watch.server(ServerSample(srv.url, OK, time.time(), info, metrics))
            time.sleep(1.0)
    finally:
        srv.stop()
    assert alarms == [], alarms
    assert seen_used[-1] == 0  # the gauges caught up


@pytest.mark.tmux
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_slots_leaked_by_finished_requests_are_an_alarm_in_the_radix_pane(tmp_path: Path) -> None:
    """The simulator's leak fault drops a page of each finished request: once it is idle, the
    radix pane says how many tokens are neither free nor in the tree."""
    from incident_helpers import start_sim
    from tmux_helpers import Tmux

    sim = start_sim(tmp_path / "live", "--max-total-tokens", "4096", "--page-size", "16", "--fault", "leak")
    tmux = Tmux(160, 48)
    try:
        tmux.start([sys.executable, "-m", "radixtop", "--url", sim.url, "--log", str(sim.log), "--no-gpu"], tmp_path)
        tmux.wait_for(lambda s: "FOLLOW" in s and "snapshot #" in s, "radixtop and the radix pane", 30)
        for first in (1, 1000):
            body = {"input_ids": list(range(first, first + 100)), "sampling_params": {"max_new_tokens": 20}}
            assert httpx.post(sim.url + "/generate", json=body, timeout=30).status_code == 200
        # the simulator's gauges, as SGLang's, say idle within 30 s; then the hold
        screen = tmux.wait_for(lambda s: "pool-short" in s, "the pool-short alarm", 30 + HOLD_S + 30)
        line = r"! \d\d:\d\d:\d\d rank 0 pool-short \d+ of 4,096 tokens neither free nor in the tree"
        assert re.search(line, screen), screen
    finally:
        tmux.kill()
        sim.stop()
