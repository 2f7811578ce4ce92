"""`radixtop replay` against the block-boundary simulator, and the divergence report's rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from incident_helpers import HEALTHY_FLAGS, radixtop, start_sim

from radixtop.incident.replay.divergence import compare_runs, format_report
from radixtop.incident.replay.replay import Outcome, ReplayRun, ReplaySeries, UsageSampler
from radixtop.incident.replay.trace import Trace, TraceRequest, builtin_trace

BLOCK_BOUNDARY = ("--page-size", "64", "--max-total-tokens", "65536", "--fault", "block-boundary:7",
                  "--enable-deterministic-inference")


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


def test_replay_text_report_follows_the_seed_and_says_when_it_does_not_flush(
    block_boundary_sim, tmp_path: Path
) -> None:
    trace = builtin_trace("finding_03330")
    small = Trace(trace.name, trace.page_size_hint, trace.requests[:3], expect_diverged=("r02",))
    path = tmp_path / "three.json"
    from radixtop.incident.replay.trace import save_trace

    save_trace(small, path)
    done = radixtop("replay", str(path), "--url", block_boundary_sim.url, "--runs", "2", "--no-flush")
    assert done.returncode == 0, done.stderr
    assert "cache NOT flushed between runs (--no-flush)" in done.stdout
    assert "NOT flushed between runs" in done.stderr
    assert "[STABLE —" in done.stdout and "Dispatch jitter: p50" in done.stdout and "RESULT:" in done.stdout
    assert "    run 1: p50" in done.stdout and "    run 2: p50" in done.stdout  # the jitter of each run


@pytest.fixture(scope="module")
def healthy_sim(tmp_path_factory: pytest.TempPathFactory):
    sim = start_sim(tmp_path_factory.mktemp("healthy"), *HEALTHY_FLAGS)
    yield sim
    sim.stop()


def _replay_json(sim, trace: Trace, tmp_path: Path, *flags: str) -> dict:
    from radixtop.incident.replay.trace import save_trace

    path = tmp_path / f"{trace.name}.json"
    save_trace(trace, path)
    done = radixtop("replay", str(path), "--url", sim.url, "--runs", "1", "--json", *flags, timeout_s=180)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_namespace_per_request_gives_no_call_another_calls_pages(healthy_sim, tmp_path: Path) -> None:
    """Copies and requests sharing a two-page prefix, spaced so that each finds the prefix cached:
    a plain replay reuses it; with --namespace-per-request every call has an extra_key of its own,
    nothing is reused, and the account expects exactly that."""
    trace = Trace("shared", 16, tuple(
        TraceRequest(f"s{i}", offset_ms=i * 60.0, prompt_len=64, prefix_len=32, group="sys", max_tokens=4, n=2)
        for i in range(4)
    ))
    plain = _replay_json(healthy_sim, trace, tmp_path)
    assert plain["namespace_per_request"] is False and plain["max_in_flight"] is None
    assert plain["failed_calls"] == 0 and plain["cached_tokens"]["cached_tokens"] > 0, plain["cached_tokens"]
    apart = _replay_json(healthy_sim, trace, tmp_path, "--namespace-per-request")
    assert apart["namespace_per_request"] is True
    cache = apart["cached_tokens"]
    assert apart["failed_calls"] == 0 and len(cache["calls"]) == 8
    assert cache["cached_tokens"] == 0 and cache["expected_cached_tokens"] == 0, cache
    assert set(cache["missed"]) == {"first-of-group", "namespace"}, cache["missed"]  # the first call shares nothing
    assert all(c["reason"] == "namespace" for c in cache["calls"] if c["shared_with_earlier"]), cache["calls"]


def test_a_lower_max_in_flight_gives_a_lower_peak_token_usage(healthy_sim, tmp_path: Path) -> None:
    """The pressure workload sized to the simulator's pool: sent as it comes, the server's token
    usage nears the whole pool; two calls in flight at most keep it well below, on the same server."""
    from radixtop.incident.replay.workloads import pressure_trace

    trace = pressure_trace(4096, 8, page_size=16, bursts=1)
    free = _replay_json(healthy_sim, trace, tmp_path)
    capped = _replay_json(healthy_sim, trace, tmp_path, "--max-in-flight", "2")  # after it: the gauge starts high
    assert free["failed_calls"] == 0 and capped["failed_calls"] == 0
    assert capped["max_in_flight"] == 2
    (free_run,), (capped_run,) = free["per_run"], capped["per_run"]
    assert free_run["token_usage_samples"] >= 1 and capped_run["token_usage_samples"] >= 1, (free_run, capped_run)
    assert free_run["peak_token_usage"] > 0.7, free_run  # 16 calls of 768 tokens on a 4,096-token pool
    assert capped_run["peak_token_usage"] <= 0.4, (free_run, capped_run)  # two calls: at most 2 x 768 / 4,096
    assert free_run["held_by_cap_ms"]["calls"] == 0 and capped_run["held_by_cap_ms"]["calls"] == 14, capped_run
    # The cap's wait is not dispatch jitter.
    assert capped["dispatch_jitter_ms"]["max"] < capped_run["held_by_cap_ms"]["max"], capped


def test_the_text_report_says_the_cap_the_namespaces_and_the_peak_usage(healthy_sim, tmp_path: Path) -> None:
    from radixtop.incident.replay.trace import save_trace

    trace = Trace("burst", 16, tuple(TraceRequest(f"b{i}", 0.0, 48, 16, "sys", 64) for i in range(4)))
    path = tmp_path / "burst.json"
    save_trace(trace, path)
    done = radixtop("replay", str(path), "--url", healthy_sim.url, "--runs", "1", "--max-in-flight", "1",
                    "--namespace-per-request")
    assert done.returncode == 0, done.stderr
    assert "Max in flight: 1 calls" in done.stdout and "    run 1: 3 of 4 calls held" in done.stdout, done.stdout
    assert "Cache namespace: one per call" in done.stdout, done.stdout
    # The simulator runs here: its log, found by itself, gives every batch's usage as well.
    assert "Peak token usage (sglang:token_usage, read every 0.5 s and the logs' batch lines): run 1 0." in done.stdout
    assert f"peak token usage also from the batch lines of {healthy_sim.log}" in done.stderr, done.stderr
    assert "--max-in-flight 1" in done.stderr and "--namespace-per-request" in done.stderr


def test_a_log_that_is_not_a_file_is_one_line_that_says_what_to_name(tmp_path: Path) -> None:
    done = radixtop("replay", "demo_pressure", "--url", "http://127.0.0.1:9", "--log", str(tmp_path / "gone.log"))
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.strip().splitlines() == [
        f"radixtop: replay: --log {tmp_path / 'gone.log'} is not a file: name the server's log file"], done.stderr


def _sample(answers, log: Path | None = None,
            lines: tuple[str, ...] = ()) -> tuple[UsageSampler, ReplayRun, list[float]]:
    """A sampler against /metrics answered by ``answers(n)`` for the n-th read (1-based), over a
    run whose one call was answered 0.75 s in, finished at 1.2 s; ``lines`` are appended to
    ``log`` (the server's log) 0.1 s in."""
    import asyncio
    import time

    import httpx

    reads: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/metrics", request.url  # nothing else is asked
        reads.append(time.time())
        return answers(len(reads))

    async def go() -> tuple[UsageSampler, ReplayRun]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            sampler = UsageSampler(client, "http://127.0.0.1:9", (str(log),) if log else ())
            began = time.time()
            task = asyncio.create_task(sampler.run())
            await asyncio.sleep(0.1)
            if log is not None:
                with log.open("a") as fh:
                    fh.write("".join(lines))
            await asyncio.sleep(1.1)
            run = ReplayRun((Outcome("a", 0, "x", (), 0, None, 0.0, began, began + 0.75),), 1.2)
            return sampler, await sampler.finish(task, run)

    sampler, run = asyncio.run(go())
    return sampler, run, reads


def test_token_usage_is_read_every_half_second_and_counts_after_the_runs_first_answer() -> None:
    # SGLang's /metrics has no token_usage sample before its first batch: the reads go on.
    sampler, run, reads = _sample(lambda n: httpx_response("sglang:num_running_reqs 0\n" if n == 1 else
                                                            f"sglang:token_usage 0.{n}\n"))
    assert len(reads) == 4 and all(b - a >= 0.5 - 0.01 for a, b in zip(reads, reads[1:], strict=False)), reads
    assert sampler.missing is None
    # The reads at 1.0 s and 1.5 s (the last, after finish) count; the one at 0.5 s came before the answer.
    assert run.peak_token_usage == 0.4 and run.usage_samples == 2, run


def test_a_server_without_metrics_is_asked_once() -> None:
    sampler, run, reads = _sample(lambda n: httpx_response("not found", 404))
    assert len(reads) == 1 and "HTTP 404" in (sampler.missing or "") and "--enable-metrics" in sampler.missing
    assert run.peak_token_usage is None and run.usage_samples == 0


# SGLang 0.5.23's batch lines, as its scheduler writes them.
_DECODE = ("[2026-12-06 01:15:06] Decode batch, #running-req: 8, #token: {t}, token usage: {u}, cpu graph: False, "
           "gen throughput (token/s): 1992.21, #queue-req: 0\n")


def test_the_logs_batch_lines_give_the_peak_the_reads_missed(tmp_path: Path) -> None:
    # The gauge moved between reads: each read saw 0.12, the batch lines saw 0.44. A line written
    # before the run is not the run's; a line with no newline yet is not whole.
    log = tmp_path / "server.log"
    log.write_text(_DECODE.format(t=4000, u=0.98))
    lines = (_DECODE.format(t=1536, u=0.38), _DECODE.format(t=1808, u=0.44),
             "[2026-12-06 01:15:07] Prefill batch, #new-seq: 1, token usage: 0.03, #running-req: 0\n",
             _DECODE.format(t=3000, u=0.73).rstrip("\n"))
    sampler, run, reads = _sample(lambda n: httpx_response("sglang:token_usage 0.12\n"), log, lines)
    assert len(reads) == 4 and sampler.missing is None
    assert run.peak_token_usage == 0.44 and run.usage_lines == 3 and run.usage_samples == 2, run


def test_a_server_without_metrics_is_asked_once_and_its_log_still_counts(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.touch()
    sampler, run, reads = _sample(lambda n: httpx_response("not found", 404), log, (_DECODE.format(t=704, u=0.17),))
    assert len(reads) == 1 and "--enable-metrics" in (sampler.missing or "")
    assert run.peak_token_usage == 0.17 and run.usage_lines == 1 and run.usage_samples == 0, run


def httpx_response(text: str, status: int = 200):
    import httpx

    return httpx.Response(status, text=text)


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
    assert (
        refused.returncode == 2 and "no /server_info answered" in refused.stderr and "--vocab-size N" in refused.stderr
    )
    done = radixtop(
        "replay", "finding_03330", "--url", "http://127.0.0.1:9", "--runs", "4", "--json", "--vocab-size", "32000"
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["runs"] == 1 and doc["requested_runs"] == 4
    assert "stopped answering" in doc["stopped_early"]
    assert doc["failed_calls"] == 44 and not doc["diverged"]
    assert doc["result"] == "INCONCLUSIVE"  # every call failed: nothing could diverge


def _run(*outcomes: tuple[str, int, str | None]) -> ReplayRun:
    return ReplayRun(
        tuple(
            Outcome(rid, copy, text, (), None, None if text else "HTTP 503: dead", 1.0)
            for rid, copy, text in outcomes
        ),
        0.1,
    )


def test_variants_are_counted_per_copy_and_failures_are_not_variants() -> None:
    trace = Trace("t", 1, (TraceRequest("a", 0, 4, 0, "a", 4, n=2), TraceRequest("b", 0, 4, 0, "b", 4)),
                  expect_diverged=("a", "b"))
    series = ReplaySeries(
        "http://x", (
            _run(("a", 0, "x"), ("a", 1, "y"), ("b", 0, "k")),
            _run(("a", 0, "x"), ("a", 1, "z"), ("b", 0, None)),
            _run(("a", 0, "x"), ("a", 1, "y"), ("b", 0, "k")),
        ), 3, True,
    )
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


def test_a_replay_whose_expected_requests_never_answered_twice_is_inconclusive() -> None:
    trace = Trace("t", 1, (TraceRequest("a", 0, 4, 0, "a", 4), TraceRequest("b", 0, 4, 0, "b", 4)),
                  expect_diverged=("a",))
    series = ReplaySeries("http://x", (_run(("a", 0, "x"), ("b", 0, "k")), _run(("a", 0, None), ("b", 0, "k"))),
                          2, True)
    report = compare_runs(series, trace)
    assert report.result == "INCONCLUSIVE" and report.uncompared == ["a"]
    assert "RESULT: INCONCLUSIVE  (0/1 expected divergences reproduced; 1 of them never answered twice" in (
        format_report(report))
    answered = ReplaySeries("http://x", (_run(("a", 0, "x")), _run(("a", 0, "x"))), 2, True)
    assert compare_runs(answered, trace).result == "NOT REPRODUCED"


def test_a_flush_refused_with_an_html_error_page_is_one_printable_line(tmp_path: Path) -> None:
    import asyncio

    from hardening_helpers import start_standin
    from incident_helpers import small_trace

    from radixtop.incident.replay.replay import replay_series
    from radixtop.incident.replay.trace import plan_requests

    standin = start_standin(tmp_path, "--mode", "generate", "--flush-error-page")
    events = []
    try:
        series = asyncio.run(replay_series(standin.url, plan_requests(small_trace(requests=1)), 1, flush=True,
                                           on_event=events.append, request_timeout_s=10))
    finally:
        standin.stop()
    flush = [e.message for e in events if e.kind == "flush"]
    assert len(flush) == 1 and flush[0].startswith("cache NOT flushed: HTTP 502: <!DOCTYPE html> <html> <head>")
    assert "\n" not in flush[0] and "\x1b" not in flush[0] and len(flush[0]) < 260
    assert all("\n" not in note and "\x1b" not in note for note in series.notes)
