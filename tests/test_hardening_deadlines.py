"""A server that answers one byte every 2 s holds neither `radixtop bundle` nor the process that
takes it: every network step ends within its total deadline, Ctrl-C / SIGTERM / the UI's cancel
stop at once, and no partial directory survives. A real slow stand-in server on loopback and real
`radixtop bundle` processes receiving real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from hardening_helpers import start_standin
from incident_helpers import wait_for, write_lines

from radixtop.incident.bundle.bundle import BundleCancelled, take_bundle

LOG_LINES = [f"[2026-12-02 14:00:01 TP0] line {i}" for i in range(200)]


@pytest.fixture
def slow(tmp_path: Path):
    server = start_standin(tmp_path / "slow", "--mode", "slow", "--drip", "2")
    yield server
    server.stop()


def _bundle_proc(tmp_path: Path, url: str) -> subprocess.Popen:
    log = tmp_path / "server.log"
    write_lines(log, LOG_LINES)
    return subprocess.Popen(
        [sys.executable, "-m", "radixtop", "bundle", "--url", url, "--log", str(log), "--out", str(tmp_path / "out"),
         "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )


def _partials(out: Path) -> list[str]:
    return [p.name for p in out.iterdir() if ".partial-" in p.name] if out.exists() else []


def _collecting(proc: subprocess.Popen, out: Path) -> bool:
    return bool(_partials(out)) or proc.poll() is not None


def test_bundle_against_a_server_that_drips_ends_within_its_deadline(tmp_path: Path, slow) -> None:
    began = time.monotonic()
    proc = _bundle_proc(tmp_path, slow.url)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    took = time.monotonic() - began
    assert proc.returncode == 0, err
    assert took < 30, f"the bundle took {took:.1f} s against a dripping server (deadline 20 s + startup)"
    notes = json.loads(out)["notes"]
    assert "no complete answer within" in notes["server/server_info.json"]
    assert "no complete answer within" in notes["server/metrics.txt"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_a_bundle_at_once_and_leaves_no_partial_directory(tmp_path: Path, slow, sig) -> None:
    out = tmp_path / "out"
    proc = _bundle_proc(tmp_path, slow.url)
    try:
        assert wait_for(lambda: _collecting(proc, out), 30), "the bundle did not start"
        assert proc.poll() is None and _partials(out)
        time.sleep(0.5)  # in the middle of the slow GETs
        sent = time.monotonic()
        proc.send_signal(sig)
        proc.wait(timeout=10)
        took = time.monotonic() - sent
    finally:
        proc.kill()
        proc.communicate()
    assert took < 2.0, f"{sig.name} took {took:.1f} s to stop the bundle"
    assert proc.returncode == (130 if sig == signal.SIGINT else -sig)
    assert list(out.iterdir()) == [], "a partial directory or a bundle was left behind"


def test_cancel_stops_a_bundle_within_a_second(tmp_path: Path, slow) -> None:
    """The UI sets the cancel event on quit: take_bundle must return at once, whatever it waits for."""
    log = tmp_path / "server.log"
    write_lines(log, LOG_LINES)
    cancel = threading.Event()
    box: dict = {}

    def run() -> None:
        try:
            take_bundle(tmp_path / "out", url=slow.url, logs=[str(log)], cancel=cancel, http_timeout_s=60,
                        network_deadline_s=120)
        except BaseException as exc:  # noqa: BLE001 - inspected below
            box["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    assert wait_for(lambda: _partials(tmp_path / "out"), 20)
    time.sleep(1.0)
    cancel.set()
    began = time.monotonic()
    worker.join(5)
    took = time.monotonic() - began
    assert not worker.is_alive() and took < 1.0, f"take_bundle returned {took:.1f} s after cancel"
    assert isinstance(box.get("error"), BundleCancelled)
    assert list((tmp_path / "out").iterdir()) == []


def test_a_tool_is_killed_with_its_children_when_cancelled(tmp_path: Path) -> None:
    from radixtop.incident.bundle.evidence import _run

    pidfile = tmp_path / "child.pid"
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    began = time.monotonic()
    code, _, _, why = _run(["sh", "-c", f"sleep 30 & echo $! > {pidfile}; wait"], 60, cancel)
    assert code is None and why == "cancelled" and time.monotonic() - began < 2
    child = int(pidfile.read_text())
    assert wait_for(lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE, 5)


def test_a_partial_directory_of_a_killed_bundle_is_removed_by_the_next(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = out / f".radixtop-bundle-20261202-140000-manual.partial-{dead.pid}"
    (stale / "server").mkdir(parents=True)
    alive = out / f".radixtop-bundle-20261202-140000-other.partial-{os.getppid()}"  # a live process's
    alive.mkdir()
    log = tmp_path / "server.log"
    write_lines(log, LOG_LINES)
    result = take_bundle(out, logs=[str(log)], archive=False)
    assert not stale.exists() and alive.is_dir() and result.path.is_dir()


def test_replay_and_confirms_network_steps_end_within_their_deadlines_against_a_dripping_server(tmp_path: Path) -> None:
    """A server that sends one byte every 2 s: httpx's timeout is per read and never fires; every
    call the replay and the confirmation run make has a whole-call deadline instead."""
    import asyncio
    import time

    import httpx
    from incident_helpers import small_trace

    from radixtop.incident.confirm.confirm import _server_info
    from radixtop.incident.replay.cache_watch import READ_DEADLINE_S
    from radixtop.incident.replay.replay import HEALTH_DEADLINE_S, flush_cache, replay_series, server_alive
    from radixtop.incident.replay.trace import plan_requests
    from radixtop.probes.http import fetch

    slow = start_standin(tmp_path, "--mode", "slow", "--drip", "2")
    try:
        async def go():
            began = time.monotonic()
            series = await replay_series(slow.url, plan_requests(small_trace(requests=2)), 1, flush=False,
                                         request_timeout_s=3)
            replayed = time.monotonic() - began
            began = time.monotonic()
            info = await _server_info(slow.url, timeout_s=2)
            informed = time.monotonic() - began
            async with httpx.AsyncClient(timeout=3) as client:
                began = time.monotonic()
                alive = await server_alive(client, slow.url)
                flushed = await flush_cache(client, slow.url)
                checked = time.monotonic() - began
                began = time.monotonic()
                fetched = await fetch(client, f"{slow.url}/metrics", timeout_s=1.5)  # what they all call
                fetched_in = time.monotonic() - began
            return series, replayed, info, informed, alive, flushed, checked, fetched, fetched_in

        series, replayed, info, informed, alive, flushed, checked, fetched, fetched_in = asyncio.run(go())
    finally:
        slow.stop()
    # The replay's deadlines add up: the cache setting's read, two calls of 3 s, the health check
    # after an all-failed run; a dripped answer without them takes up to 120 s.
    budget = READ_DEADLINE_S + 2 * 3 + HEALTH_DEADLINE_S
    assert replayed < budget + 2, f"the replay took {replayed:.1f} s; its deadlines add up to {budget:.0f} s"
    assert all("no whole answer within 3 s" in (o.error or "") for o in series.runs[0].outcomes)
    assert info is None and informed < 6  # two paths, 2 s each
    assert alive is False and flushed and "no whole answer" in flushed and checked < 20
    assert fetched.status is None and fetched.error == "no whole answer within 1.5 s" and fetched_in < 3
