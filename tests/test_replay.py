"""`radixtop replay` against the block-boundary simulator, and the divergence report's rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from incident_helpers import radixtop, start_sim

from radixtop.incident.divergence import compare_runs, format_report
from radixtop.incident.replay import Outcome, ReplayRun, ReplaySeries
from radixtop.incident.trace import Trace, TraceRequest, builtin_trace

BLOCK_BOUNDARY = ("--page-size", "64", "--max-total-tokens", "65536", "--fault", "block-boundary:7",
                  "--enable-deterministic-inference")  # fmt: skip


@pytest.fixture(scope="module")
def block_boundary_sim(tmp_path_factory: pytest.TempPathFactory):
    sim = start_sim(tmp_path_factory.mktemp("bb"), *BLOCK_BOUNDARY)
    yield sim
    sim.stop()


def test_replay_json_reports_r02_diverged_and_the_rest_stable(block_boundary_sim) -> None:
    done = radixtop("replay", "finding_03330", "--url", block_boundary_sim.url, "--runs", "3", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["runs"] == 3
    by_id = {r["id"]: r for r in doc["requests"]}
    assert set(by_id) == {r.id for r in builtin_trace("finding_03330").requests}
    for rid, item in by_id.items():
        assert isinstance(item["diverged"], bool) and isinstance(item["variants"], int)
        assert all(isinstance(s, str) for s in item["samples"]) and len(item["samples"]) == item["variants"]
        assert item["diverged"] == (rid == "r02"), rid
    assert by_id["r02"]["variants"] >= 2
    assert len(by_id["r02"]["copies"]) == 4  # each of the n copies is reported on its own
    assert all(c["variants"] == 1 for c in by_id["r03"]["copies"])
    jitter = doc["dispatch_jitter_ms"]
    assert isinstance(jitter["p50"], float) and isinstance(jitter["p99"], float) and jitter["p50"] <= jitter["p99"]
    assert jitter["calls"] == 3 * 44
    per_run = doc["dispatch_jitter_per_run_ms"]
    assert [j["run"] for j in per_run] == [1, 2, 3] and all(j["calls"] == 44 for j in per_run)
    assert all(0 <= j["p50"] <= j["p99"] <= j["max"] for j in per_run)
    assert doc["result"] == "CONFIRMED" and doc["flushed_between_runs"] is True
    assert "flushed (POST /flush_cache) before each run" in done.stderr


def test_replay_text_report_follows_the_seed_and_says_when_it_does_not_flush(block_boundary_sim, tmp_path: Path) -> None:
    trace = builtin_trace("finding_03330")
    small = Trace(trace.name, trace.page_size_hint, trace.requests[:3], expect_diverged=("r02",))
    path = tmp_path / "three.json"
    from radixtop.incident.trace import save_trace

    save_trace(small, path)
    done = radixtop("replay", str(path), "--url", block_boundary_sim.url, "--runs", "2", "--no-flush")
    assert done.returncode == 0, done.stderr
    assert "cache NOT flushed between runs (--no-flush)" in done.stdout
    assert "NOT flushed between runs" in done.stderr
    assert "[STABLE —" in done.stdout and "Dispatch jitter: p50" in done.stdout and "RESULT:" in done.stdout
    assert "    run 1: p50" in done.stdout and "    run 2: p50" in done.stdout  # the jitter of each run


def test_replay_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1}')
    for args in (
        ("replay", "no_such_trace", "--url", "http://127.0.0.1:9"),
        ("replay", str(bad), "--url", "http://127.0.0.1:9"),
        ("replay", "finding_03330", "--url", "ftp://x"),
        ("--readonly", "replay", "finding_03330", "--url", "http://127.0.0.1:9"),
    ):
        done = radixtop(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.startswith("radixtop: ") and done.stderr.count("\n") == 1, done.stderr


def test_replay_of_a_dead_server_reports_failures_and_stops_early() -> None:
    refused = radixtop("replay", "finding_03330", "--url", "http://127.0.0.1:9", "--runs", "4")
    assert refused.returncode == 2 and "no /server_info answered" in refused.stderr and "--vocab-size N" in refused.stderr
    done = radixtop("replay", "finding_03330", "--url", "http://127.0.0.1:9", "--runs", "4", "--json", "--vocab-size", "32000")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["runs"] == 1 and doc["requested_runs"] == 4
    assert "stopped answering" in doc["stopped_early"]
    assert doc["failed_calls"] == 44 and not doc["diverged"]
    assert doc["result"] == "NOT REPRODUCED"


def _run(*outcomes: tuple[str, int, str | None]) -> ReplayRun:
    return ReplayRun(
        tuple(Outcome(rid, copy, text, (), None, None if text else "HTTP 503: dead", 1.0) for rid, copy, text in outcomes),
        0.1,
    )


def test_variants_are_counted_per_copy_and_failures_are_not_variants() -> None:
    trace = Trace("t", 1, (TraceRequest("a", 0, 4, 0, "a", 4, n=2), TraceRequest("b", 0, 4, 0, "b", 4)),
                  expect_diverged=("a", "b"))  # fmt: skip
    series = ReplaySeries(
        "http://x", (
            _run(("a", 0, "x"), ("a", 1, "y"), ("b", 0, "k")),
            _run(("a", 0, "x"), ("a", 1, "z"), ("b", 0, None)),
            _run(("a", 0, "x"), ("a", 1, "y"), ("b", 0, "k")),
        ), 3, True,
    )  # fmt: skip
    report = compare_runs(series, trace)
    a, b = report.requests
    # copies of one request have different prompts: their outputs differ and that is not divergence
    assert [c.diverged for c in a.copies] == [False, True]
    assert a.diverged and a.variants == 2 and a.worst.counts == (2, 1)
    assert not b.diverged and b.failed == 1 and b.variants == 1
    assert report.result == "PARTIAL"
    text = format_report(report)
    assert "[DIVERGED — 1/2 requests non-deterministic]" in text and "RESULT: PARTIAL" in text
    assert "[FAILED — 1 requests" in text
    assert report.jitter == {"p50": 1.0, "p99": 1.0, "max": 1.0, "calls": 9}
    assert report.jitter_runs == ({"p50": 1.0, "p99": 1.0, "max": 1.0, "calls": 3},) * 3


def test_a_single_run_says_divergence_cannot_be_seen() -> None:
    trace = Trace("t", 1, (TraceRequest("a", 0, 4, 0, "a", 4),))
    report = compare_runs(ReplaySeries("http://x", (_run(("a", 0, "x")),), 1, True), trace)
    assert "divergence needs at least 2 runs" in format_report(report)
    assert report.result is None and "RESULT" not in format_report(report)
