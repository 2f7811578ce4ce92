"""Cached tokens per call in replay (against a real `radixtop sim` on loopback) and `radixtop analyze`
(the simulator in-process): the seed's one-page prefix, each shortfall's reason, the same hit rate
both ways, the sweep, a recorded trace as input, and one-line errors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from incident_helpers import start_sim

from radixtop.cli import main
from radixtop.incident.analyze.analyze import analyze
from radixtop.incident.replay.divergence import compare_runs
from radixtop.incident.replay.record import RecordedCall, build_trace
from radixtop.incident.replay.replay import replay_series
from radixtop.incident.replay.trace import Trace, TraceRequest, builtin_trace, plan_requests, save_trace, scale_offsets
from radixtop.sim.engine import SimConfig

SEED_FLAGS = ("--page-size", "64", "--max-total-tokens", "65536", "--max-running-requests", "8")
# FAST's 1 ms step
SEED_CONFIG = SimConfig(page_size=64, max_total_tokens=65536, max_running_requests=8, step_time_s=0.001)


@pytest.fixture(scope="module")
def sim64(tmp_path_factory):
    sim = start_sim(tmp_path_factory.mktemp("sim64"), *SEED_FLAGS)
    try:
        yield sim
    finally:
        sim.stop()


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def rows_by_call(doc: dict) -> dict[tuple[str, int], dict]:
    return {(r["id"], r["copy"]): r for r in doc["calls"]}


def edge_trace() -> Trace:
    """At page 64: a prefix of page - 1 tokens, one not page-aligned, one shared across namespaces, and
    one page evicted by a prompt that needs the whole pool before its second use."""
    def r(
        rid: str, offset: float, prefix: int, group: str, extra_key: str | None = None, prompt: int = 256
    ) -> TraceRequest:
        return TraceRequest(rid, offset, prompt, prefix, group, 4, 1, extra_key=extra_key)

    return Trace("edges", 64, (
        r("short-a", 0, 63, "short"), r("short-b", 100, 63, "short"),
        r("tail-a", 0, 100, "tail"), r("tail-b", 100, 100, "tail"),
        r("ns-a", 0, 64, "ns", "tenant-a"), r("ns-b", 100, 64, "ns", "tenant-b"), r("ns-c", 200, 64, "ns", "tenant-a"),
        r("evict-a", 400, 64, "evict"), r("flood", 600, 0, "flood", prompt=65_500), r("evict-b", 900, 64, "evict"),
    ))


def test_replay_reports_the_seeds_one_page_prefix_with_its_cached_tokens_and_reason(sim64, capsys) -> None:
    code, out, _ = run_cli(capsys, "replay", "finding_03330", "--url", sim64.url, "--runs", "1", "--json")
    assert code == 0
    cache = json.loads(out)["cached_tokens"]
    assert cache["page_size"] == 64 and cache["page_size_from"] == "server" and cache["evictions_seen"] is True
    rows = rows_by_call(cache)
    # r02 (prefix_len == one page): its four copies are sent at once; the one the server took first
    # computes the page, the other three get it from the cache.
    copies = [rows["r02", copy] for copy in range(4)]
    first = [r for r in copies if r["cached_tokens"] == [0]]
    assert len(first) == 1 and first[0]["reason"] == "first-of-group" and first[0]["why"] == "first of its group"
    assert all(r["cached_tokens"] == [64] and r["reason"] is None for r in copies if r is not first[0])
    assert rows["r02", 1]["expected_cached_tokens"] == 64 and rows["r02", 0]["expected_cached_tokens"] == 0
    assert rows["r02_b_s_b_s_s_s", 0]["cached_tokens"] == [64]
    assert rows["r02_b_s_s_s_s", 0]["cached_tokens"] == [64] and cache["missed"] == {
        "first-of-group": {"calls": 1, "tokens": 64}
    }
    assert cache["cached_tokens"] == sum(sum(r["cached_tokens"]) for r in cache["calls"])
    code, text, _ = run_cli(capsys, "replay", "finding_03330", "--url", sim64.url, "--runs", "1")
    assert "Page size 64 (the server's)" in text and "hit rate" in text
    line = next(x for x in text.splitlines() if x.strip().startswith("r02 ") and "first of its group" in x)
    assert [line.split()[i] for i in (2, 3, 5)] == ["256", "64", "0"]  # prompt, prefix, cached


def test_replay_names_shorter_than_a_page_the_page_tail_and_another_namespace(sim64, tmp_path: Path, capsys) -> None:
    path = tmp_path / "edges.json"
    save_trace(edge_trace(), path)
    code, out, _ = run_cli(capsys, "replay", str(path), "--url", sim64.url, "--runs", "1", "--json")
    assert code == 0
    rows = rows_by_call(json.loads(out)["cached_tokens"])
    assert rows["short-b", 0]["cached_tokens"] == [0] and rows["short-b", 0]["reason"] == "shorter-than-page"
    assert rows["short-b", 0]["why"] == "shorter than a page"
    assert rows["tail-b", 0]["cached_tokens"] == [64] and rows["tail-b", 0]["reason"] == "page-tail"
    # The simulator keys its tree by extra_key, as SGLang: tenant b shares nothing with tenant a ...
    assert rows["ns-b", 0]["cached_tokens"] == [0] and rows["ns-b", 0]["reason"] == "namespace"
    # ... and tenant a's second call gets tenant a's page.
    assert rows["ns-c", 0]["cached_tokens"] == [64] and rows["ns-c", 0]["reason"] is None
    # The debug endpoint's events saw the flood evict the page between its two uses.
    assert rows["evict-b", 0]["cached_tokens"] == [0] and rows["evict-b", 0]["reason"] == "evicted"
    # analyze tells the same story without a server.
    offline = {(r.exp.request_id, r.exp.copy): r for r in analyze(edge_trace(), SEED_CONFIG).rows}
    assert {k: (list(r.cached), r.reason) for k, r in offline.items()} == {
        k: (r["cached_tokens"], r["reason"]) for k, r in rows.items()
    }


def replayed_hit_rate(url: str, trace: Trace) -> float:
    series = asyncio.run(replay_series(url, plan_requests(trace), 1))
    account = compare_runs(series, trace).cache
    assert account is not None and account.summary.calls == len(plan_requests(trace))
    return account.summary.hit_rate


def test_analyze_gives_the_hit_rate_of_a_replay_against_the_simulator_with_the_same_flags(
    sim64, tmp_path: Path, capsys
) -> None:
    seed = builtin_trace("finding_03330")
    code, out, _ = run_cli(capsys, "analyze", "finding_03330", *SEED_FLAGS, "--step-ms", "1", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["hit_rate"] > 0
    assert doc["hit_rate"] == round(replayed_hit_rate(sim64.url, seed), 6)
    # The demo's workload (offsets at a quarter, so the test takes 9 s, not 34) at page 16.
    flags = ("--page-size", "16", "--max-total-tokens", "8192", "--max-running-requests", "8")
    pressure = scale_offsets(builtin_trace("demo_pressure"), 0.25)
    sim = start_sim(tmp_path / "sim16", *flags)
    try:
        replayed = replayed_hit_rate(sim.url, pressure)
    finally:
        sim.stop()
    offline = analyze(
        pressure, SimConfig(page_size=16, max_total_tokens=8192, max_running_requests=8, step_time_s=0.001)
    )
    assert offline.evicted_tokens > 0 and offline.summary.hit_rate == pytest.approx(replayed, abs=1e-9)


def test_sweep_prints_one_row_per_setting_and_shows_where_the_cache_stops_helping(capsys) -> None:
    code, out, _ = run_cli(
        capsys, "analyze", "finding_03330", "--max-total-tokens", "65536", "--sweep", "page-size=1,64,128"
    )
    assert code == 0
    rows = {int(line.split()[0].replace(",", "")): line for line in out.splitlines()[2:] if line.strip()}
    assert sorted(rows) == [1, 64, 128]
    assert rows[64].split()[1] == "1.8%" and rows[1].split()[1] == "1.8%"  # the one-page prefix is reused
    assert rows[128].split()[1] == "0.0%" and "shorter than a page 11" in rows[128]  # a 64-token prefix at page 128
    code, out, _ = run_cli(
        capsys, "analyze", "demo_pressure", "--page-size", "16", "--json", "--sweep", "max-total-tokens=2048,65536"
    )
    doc = json.loads(out)
    small, large = doc["rows"]
    assert small["setting"]["max_total_tokens"] == 2048 and small["missed"]["evicted"]["calls"] > 100
    assert large["evicted_tokens"] == 0 and large["hit_rate"] > small["hit_rate"]


def test_a_recorded_trace_is_analyzed(tmp_path: Path, capsys) -> None:
    system = list(range(1, 129))
    calls = [
        RecordedCall(
            0.0, "/generate", system + [1000 + i] * 40, None, 8, 1, prompt_tokens=None, status=200, extra_key=key
        )
        for i, key in enumerate((None, None, "lora:x"))
    ]
    calls = [
        RecordedCall(i * 50.0, c.path, c.input_ids, None, 8, 1, status=200, extra_key=c.extra_key)
        for i, c in enumerate(calls)
    ]
    path = tmp_path / "recorded.json"
    save_trace(build_trace(calls, name="recorded", keep_prompts=True), path)
    code, out, _ = run_cli(capsys, "analyze", str(path), "--page-size", "16", "--json")
    rows = rows_by_call(json.loads(out))
    # The first shares nothing with an earlier prompt: nothing to reuse, nothing missed.
    assert code == 0 and rows["q0000", 0]["prefix_len"] == 0 and rows["q0000", 0]["reason"] is None
    assert rows["q0001", 0]["cached_tokens"] == [128] and rows["q0001", 0]["reason"] is None
    assert rows["q0002", 0]["cached_tokens"] == [0] and rows["q0002", 0]["reason"] == "namespace"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--sweep", "page=1,2"), "--sweep 'page=1,2': write FLAG=V1,V2,... with FLAG one of page-size"),
        (("--sweep", "page-size=1,x"), "the values must be whole numbers"),
        (("--radix-eviction-policy", "slru"), "SGLang has it, the simulator does not yet"),
        (("--page-size", "0"), "--page-size must be >= 1"),
    ],
)
def test_bad_settings_are_one_line(capsys, argv: tuple[str, ...], says: str) -> None:
    code, out, err = run_cli(capsys, "analyze", "finding_03330", *argv)
    assert code == 2 and out == "" and says in err and len(err.strip().splitlines()) == 1


def test_a_malformed_trace_is_one_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"version": 1, "name": "x", "page_size_hint": 16, "requests": [{"id": "a"}]}')
    code, out, err = run_cli(capsys, "analyze", str(path))
    assert code == 2 and out == "" and "requests[0].offset_ms is missing" in err and len(err.strip().splitlines()) == 1
