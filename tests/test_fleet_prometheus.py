"""The fleet through its own Prometheus, end to end: two simulators (node1 healthy, node2 with the
double unlock), each a TP2 rank group, scraped by a real Prometheus (Debian's `prometheus`) on
loopback; `radixtop fleet` and the TUI's fleet view list the four ranks and flag node2's. A rank
whose server dies stands out as its scrape goes down; a Prometheus that is not there is one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from pane_helpers import start_sim, stop
from prometheus_helpers import Prometheus, query, require_prometheus, start_prometheus
from sshd_helpers import free_port

from radixtop.tui.app import RadixtopApp
from radixtop.widgets.fleet import FleetScreen

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Fleet:
    prometheus: Prometheus
    sims: dict[str, subprocess.Popen]


def _targets(sim_url: str) -> list[str]:
    """The sim's ranks' debug endpoints as Prometheus targets (host:port)."""
    info = httpx.get(f"{sim_url}/server_info", timeout=5, trust_env=False).json()
    return [urlsplit(u).netloc for u in info["radixtop_instrument"]]


def _generate(sim_url: str) -> None:
    body = {"input_ids": list(range(10, 40)), "sampling_params": {"max_new_tokens": 2}}
    assert httpx.post(f"{sim_url}/generate", json=body, timeout=10, trust_env=False).status_code == 200


def _wait_for(url: str, promql: str, count: int, timeout_s: float = 30.0) -> None:
    """Until Prometheus holds `count` series for `promql` (bounded in time)."""
    deadline = time.monotonic() + timeout_s
    while len(query(url, promql)) < count:
        assert time.monotonic() < deadline, f"Prometheus never held {count} series of {promql}"
        time.sleep(0.25)


def _start_fleet(work: Path, faults: dict[str, tuple[str, ...]]) -> Fleet:
    """One simulator (TP2) per node, a generate on each, and Prometheus scraping every rank."""
    sims: dict[str, subprocess.Popen] = {}
    prometheus = None
    try:
        targets = {}
        for node, flags in faults.items():
            proc, url, _ = start_sim(work / node, "--tp-size", "2", *flags)
            sims[node] = proc
            targets[node] = _targets(url)
            _generate(url)
        prometheus = start_prometheus(work / "prometheus", targets)
        _wait_for(prometheus.url, "radixtop_capacity_tokens", 2 * len(faults))
        return Fleet(prometheus, sims)
    except BaseException:
        if prometheus is not None:
            prometheus.stop()
        for proc in sims.values():
            stop(proc)
        raise


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    require_prometheus()
    started = _start_fleet(tmp_path_factory.mktemp("fleet"),
                           {"node1": (), "node2": ("--fault", "double-unlock:probability=1")})
    try:
        _wait_for(started.prometheus.url, "radixtop_negative_lock_ref_total > 0", 2)
        yield started
    finally:
        started.prometheus.stop()
        for proc in started.sims.values():
            stop(proc)


def radixtop(*args: str, timeout_s: float = 60.0) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "radixtop", *args], capture_output=True, text=True,
                          timeout=timeout_s, cwd=ROOT, stdin=subprocess.DEVNULL)
    return done, time.monotonic() - started


def test_fleet_lists_every_rank_and_flags_the_failing_node(fleet: Fleet) -> None:
    done, _ = radixtop("fleet", "--prometheus", fleet.prometheus.url)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "4 ranks on 2 nodes, 2 standing out" in out
    table = out[: out.index("Standing out:")]
    rows = [line.split() for line in table.splitlines() if line.startswith(("node1 ", "node2 "))]
    assert sorted((r[0], r[1], r[2]) for r in rows) == [
        ("node1", "0", "up"), ("node1", "1", "up"), ("node2", "0", "up"), ("node2", "1", "up")]
    standing = out[out.index("Standing out:"):]
    assert "node1" not in standing
    assert standing.count("unlock left lock_ref below zero") == 2
    assert "node2 rank 0" in standing and "node2 rank 1" in standing
    assert "open it: radixtop --node node2" in standing


def test_fleet_json_names_the_figures_and_the_standouts(fleet: Fleet) -> None:
    done, _ = radixtop("fleet", "--prometheus", fleet.prometheus.url, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["state"] == "ok"
    ranks = {(r["node"], r["rank"]): r for r in doc["ranks"]}
    assert set(ranks) == {("node1", "0"), ("node1", "1"), ("node2", "0"), ("node2", "1")}
    for (node, _), r in ranks.items():
        assert r["scrape"] == "up" and r["capacity_tokens"] == 16384 and 0 <= r["token_usage"] <= 1
        assert r["hooks_active"] == 1 and r["locked_tokens"] is not None and r["evictions"] is not None
        assert (r["negative_lock_ref"] > 0) == (node == "node2")
        assert (r["lock_anomalies"] > 0) == (node == "node2")
    assert {(s["node"], s["rank"]) for s in doc["standouts"]} == {("node2", "0"), ("node2", "1")}
    assert all(s["command"] == "radixtop --node node2" for s in doc["standouts"])
    assert all(any("below zero" in reason for reason in s["reasons"]) for s in doc["standouts"])


async def test_the_tuis_fleet_view_lists_the_ranks_and_flags_the_failing_node(fleet: Fleet) -> None:
    app = RadixtopApp(fleet=fleet.prometheus.url)
    app.fleet_interval_s = 0.5
    async with app.run_test(size=(140, 40)) as pilot:
        text = ""
        for _ in range(100):  # bounded: 10 s
            await pilot.pause(0.1)
            screen = app.screen
            if isinstance(screen, FleetScreen):
                text = str(screen.query_one("#fleet-body").render())
                if "radixtop --node node2" in text:
                    break
        assert isinstance(app.screen, FleetScreen), "the fleet view did not open at start-up"
        assert "4 ranks on 2 nodes · 2 standing out" in text
        table = text[: text.index("Standing out")]
        rows = [line.split() for line in table.splitlines() if line.startswith(("node1 ", "node2 "))]
        assert sorted((r[0], r[1]) for r in rows) == [("node1", "0"), ("node1", "1"), ("node2", "0"), ("node2", "1")]
        standing = text[text.index("Standing out"):]
        assert "node1" not in standing and "node2 rank 0" in standing and "node2 rank 1" in standing
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, FleetScreen)
        await pilot.press("F")  # shows it again
        await pilot.pause(0.1)
        assert isinstance(app.screen, FleetScreen)
        assert "radixtop --node node2" in str(app.screen.query_one("#fleet-body").render())


def test_a_rank_whose_server_dies_stands_out_as_its_scrape_goes_down(tmp_path: Path) -> None:
    require_prometheus()
    started = _start_fleet(tmp_path, {"node1": (), "node3": ()})
    try:
        done, _ = radixtop("fleet", "--prometheus", started.prometheus.url, "--json")
        assert json.loads(done.stdout)["standouts"] == []  # all alike: nothing stands out
        stop(started.sims["node3"])
        _wait_for(started.prometheus.url, "up == 0", 2)
        done, _ = radixtop("fleet", "--prometheus", started.prometheus.url, "--json")
        doc = json.loads(done.stdout)
        scrape = {(r["node"], r["rank"]): r["scrape"] for r in doc["ranks"]}
        assert scrape == {("node1", "0"): "up", ("node1", "1"): "up", ("node3", "0"): "down", ("node3", "1"): "down"}
        flagged = {(s["node"], s["rank"]): s["reasons"] for s in doc["standouts"]}
        assert set(flagged) == {("node3", "0"), ("node3", "1")}
        assert all("scrape" in reasons[0] and "is down" in reasons[0] for reasons in flagged.values())
    finally:
        started.prometheus.stop()
        for proc in started.sims.values():
            stop(proc)


def test_a_prometheus_that_is_not_there_is_one_line_and_nothing_hangs() -> None:
    url = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    done, seconds = radixtop("fleet", "--prometheus", url, "--timeout", "5")
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "connection refused" in lines[0] and "is it running" in lines[0], done.stderr
    assert seconds < 20


def test_a_password_in_the_url_is_never_printed() -> None:
    url = f"http://me:s3cret@127.0.0.1:{free_port('127.0.0.1')}"
    done, _ = radixtop("fleet", "--prometheus", url, "--timeout", "5")
    assert done.returncode == 1 and "s3cret" not in done.stderr
    assert done.stderr.startswith("radixtop: Prometheus at http://***@127.0.0.1:")
    assert "connection refused" in done.stderr


def test_a_url_that_is_no_url_is_one_line() -> None:
    done, _ = radixtop("fleet", "--prometheus", "prometheus:9090")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "radixtop: --prometheus: 'prometheus:9090' is not an http(s) URL; give Prometheus's address, "
        "e.g. http://prometheus:9090"]
    done, _ = radixtop("--prometheus", "ftp://x", "--no-panes")
    assert done.returncode == 2 and "--prometheus: 'ftp://x' is not an http(s) URL" in done.stderr


async def test_the_tuis_fleet_view_says_in_one_line_that_prometheus_is_not_there() -> None:
    url = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    app = RadixtopApp(fleet=url)
    app.fleet_interval_s = 0.5
    async with app.run_test(size=(140, 40)) as pilot:
        text = ""
        for _ in range(100):  # bounded: 10 s
            await pilot.pause(0.1)
            if isinstance(app.screen, FleetScreen):
                text = str(app.screen.query_one("#fleet-body").render())
                if "connection refused" in text:
                    break
        assert "connection refused; is it running" in text
