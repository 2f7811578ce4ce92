"""tui/live on real processes: attach to a simulator by discovery, follow it through its death and
a restart on another pid (and other debug-endpoint ports), keeping the last values meanwhile."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from pane_helpers import start_sim, stop

from radixtop.probes.discovery import Discovery, FoundServer, discover
from radixtop.session.live import LiveSources, LiveState, choose, resolve_targets


def _discover_excluding_us():
    return discover(exclude={os.getpid()})


async def _until(predicate, timeout_s: float = 20.0, step_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(step_s)
    return predicate()


def test_choose_prefers_sglang_that_answers() -> None:
    sim = FoundServer(1, "sim", ("python",), 1.0, url="http://127.0.0.1:1")
    sgl_down = FoundServer(2, "sglang", ("python",), 2.0)
    sgl = FoundServer(3, "sglang", ("python",), 3.0, url="http://127.0.0.1:30000")
    vllm = FoundServer(4, "vllm", ("vllm",), 0.5, url="http://127.0.0.1:8000")
    assert choose([sim, sgl_down, vllm, sgl]) is sgl
    assert choose([sim, vllm]) is vllm
    assert choose([sim, sgl], "http://127.0.0.1:1/") is sim
    assert choose([sim], "http://127.0.0.1:9") is None
    logged = FoundServer(5, "sim", ("python",), 9.0, url="http://127.0.0.1:5", log_path="/tmp/demo/sim.log")
    assert choose([sgl, logged], logs=["/tmp/demo/../demo/sim.log"]) is logged, "the server writing the given log"


async def test_resolve_with_nothing_found_says_what_to_do() -> None:
    async def nothing() -> Discovery:
        return Discovery()

    targets = await resolve_targets(discover_fn=nothing)
    assert targets.url is None and targets.pid is None
    assert any("radixtop demo" in line for line in targets.lines)
    pinned = await resolve_targets(url="http://127.0.0.1:9/", logs=["/tmp/x.log"], discover_fn=nothing)
    assert pinned.url == "http://127.0.0.1:9" and pinned.logs == ["/tmp/x.log"] and pinned.pinned_url


async def test_follows_the_simulator_through_death_and_restart(tmp_path: Path) -> None:
    proc, url, log = start_sim(tmp_path / "a", "--tp-size", "2", "--enable-metrics")
    port = url.rsplit(":", 1)[1]
    sources = None
    task = None
    try:
        # Other simulators may run on this machine (other tests): name ours by its URL; discovery
        # still finds its pid, log and endpoints.
        targets = await resolve_targets(url=url, discover_fn=_discover_excluding_us)
        assert targets.url == url and targets.pid == proc.pid and targets.logs == [str(log)]
        assert len(targets.instruments) == 2
        assert any(f"radixtop sim pid {proc.pid}" in line for line in targets.lines), targets.lines
        state = LiveState()
        sources = LiveSources(targets, state, discover_fn=_discover_excluding_us, interval_s=0.2, rediscover_down_s=0.5)
        task = asyncio.create_task(sources.run())
        assert await _until(lambda: len([v for v in state.board.ranks.values() if v.snapshot]) == 2), state.sources()
        assert await _until(lambda: state.server is not None and state.server.status.ok and state.procs is not None)
        assert await _until(lambda: state.vitals.series["token_usage"].last is not None)
        assert state.gpu is not None and state.gpu.status.state in ("ok", "unavailable", "degraded")
        labels = [label for label, _ in state.sources()]
        assert labels[:3] == ["server", "r0", "r1"] and "procs" in labels and "gpu" in labels
        old_snapshots = {u: v.snapshot for u, v in state.board.ranks.items()}

        stop(proc)
        assert await _until(lambda: state.server.status.state == "down")
        assert await _until(lambda: all(v.status.state in ("down", "error") for v in state.board.ranks.values()))
        assert await _until(lambda: state.procs.status.state == "down")
        down_since = state.server.status.since
        assert all(state.board.ranks[u].snapshot is s for u, s in old_snapshots.items()), "last values kept"

        again, url2, _ = start_sim(tmp_path / "b", "--port", port, "--tp-size", "2", "--enable-metrics")
        try:
            assert url2 == url
            assert await _until(lambda: state.server.status.ok, 30)
            assert state.server.status.since > down_since
            assert await _until(lambda: sources.targets.pid == again.pid, 30), "the new pid is found"
            assert await _until(
                lambda: state.procs is not None and state.procs.status.ok and state.procs.root_pid == again.pid
            )
            assert await _until(lambda: set(state.board.ranks) != set(old_snapshots) and all(
                v.status.ok for v in state.board.ranks.values()), 30), "the new debug endpoints are followed"
        finally:
            stop(again)
    finally:
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        stop(proc)


async def test_instruments_given_on_the_command_line_win() -> None:
    found = FoundServer(7, "sglang", ("python",), 1.0, url="http://127.0.0.1:30000",
                        instrument_urls=("http://127.0.0.1:39100",), log_path="/var/log/s.log")

    async def one() -> Discovery:
        return Discovery((found,))

    targets = await resolve_targets(instruments=["http://10.0.0.2:39100/"], discover_fn=one)
    assert targets.instruments == ["http://10.0.0.2:39100"] and targets.pinned_instruments
    assert targets.url == "http://127.0.0.1:30000" and targets.pid == 7 and targets.logs == ["/var/log/s.log"]
    given_log = await resolve_targets(logs=["/tmp/mine.log"], discover_fn=one)
    assert given_log.logs == ["/tmp/mine.log"], "a log given with --log is not replaced"
