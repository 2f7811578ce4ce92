"""Answers and inputs that would eat memory without end are refused in one line: a replay's
/flush_cache answer is read within the cap every answer has, and a trace's or /server_info's
sizes are held to sane limits before anything is built from them. Each runs `radixtop` as a real
process and reads its peak memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hardening_helpers import radixtop_peak, start_standin


def test_a_huge_flush_cache_answer_is_refused_within_the_cap(tmp_path: Path) -> None:
    flood_mib = 512
    standin = start_standin(tmp_path, "--mode", "generate", "--flush-bytes", str(flood_mib << 20))
    try:
        done, peak_mib = radixtop_peak("replay", "finding_03330", "--url", standin.url, "--runs", "1",
                                       "--vocab-size", "1000")
    finally:
        standin.stop()
    assert "Traceback" not in done.stderr, done.stderr
    note = next((line for line in done.stdout.splitlines() if "could not be flushed" in line), "")
    assert "radixtop accepts" in note, done.stdout[-2000:]
    assert peak_mib < flood_mib // 2, f"replay peaked at {peak_mib} MiB"


def _trace(tmp_path: Path, name: str, **request: object) -> Path:
    doc = {"version": 1, "name": name, "page_size_hint": 1, "requests": [
        {"id": "r0", "offset_ms": 0, "prompt_len": 8, "prefix_len": 0, "group": "g", "max_tokens": 4, **request}]}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(("request_fields", "said"), [
    ({"prompt_len": 10**12}, "prompt_len must be within 1..2,097,152"),
    ({"n": 10**9}, "n must be within 1..1,024"),
    ({"max_tokens": 10**12}, "max_tokens must be within 0..2,097,152"),
    ({"offset_ms": 1e300}, "offset_ms must be within 0..604,800,000"),
], ids=["prompt_len", "n", "max_tokens", "offset_ms"])
def test_analyze_refuses_a_trace_too_big_to_build_in_one_line(tmp_path: Path, request_fields, said) -> None:
    path = _trace(tmp_path, "huge", **request_fields)
    done, peak_mib = radixtop_peak("analyze", str(path), timeout_s=60, limit_mib=1024)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and said in done.stderr and str(path) in done.stderr, done.stderr
    assert peak_mib < 200, f"analyze peaked at {peak_mib} MiB"


@pytest.mark.parametrize("body", [
    b'{"version": 1, "name": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"version": 1, "name": "caf\xe9"}',
    b'{"version": 1, "name": "x", "page_size_hint": 1, "requests": [{"id": "r0", "offset_ms": Infinity, '
    b'"prompt_len": 8, "prefix_len": 0, "group": "g", "max_tokens": 4}]}',
], ids=["nested", "latin-1", "infinity"])
def test_analyze_of_a_malformed_trace_is_one_line(tmp_path: Path, body: bytes) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(body)
    done, _ = radixtop_peak("analyze", str(path), timeout_s=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"radixtop: {path}") and "Traceback" not in done.stderr, done.stderr


HOSTILE_INFO = {
    "tokens-text": ({"max_total_num_tokens": "lots"}, "max_total_num_tokens is 'lots'"),
    "tokens-negative": ({"max_total_num_tokens": -5}, "max_total_num_tokens is -5"),
    "tokens-true": ({"max_total_num_tokens": True}, "max_total_num_tokens is True"),
    "tokens-list": ({"max_total_num_tokens": [1]}, "max_total_num_tokens is [1]"),
    "tokens-1e15": ({"max_total_num_tokens": 10**15}, "max_total_num_tokens is 1000000000000000"),
    "tokens-1e308": ({"max_total_num_tokens": 1e308}, "max_total_num_tokens is 1e+308"),
    "page-text": ({"max_total_num_tokens": 4096, "page_size": "x"}, "page_size is 'x'"),
    "input-len-text": ({"max_total_num_tokens": 4096, "max_req_input_len": "x"}, "max_req_input_len is 'x'"),
    "effective-negative": ({"max_total_num_tokens": 4096,
                            "internal_states": [{"effective_max_running_requests_per_dp": -3}]},
                           "effective_max_running_requests_per_dp is -3"),
    # A number a server could give, whose pressure workload is more than one replay builds.
    "pool-2e27": ({"max_total_num_tokens": 1 << 27}, "more than the 33,554,432 radixtop builds"),
}


@pytest.mark.parametrize("case", list(HOSTILE_INFO))
def test_confirm_against_a_hostile_server_info_is_one_line(tmp_path: Path, case: str) -> None:
    extra, said = HOSTILE_INFO[case]
    info = tmp_path / "info.json"
    info.write_text(json.dumps({"version": "0.5.23", **extra}))
    standin = start_standin(tmp_path / "srv", "--info", str(info))
    try:
        done, peak_mib = radixtop_peak(
            "confirm", "--url", standin.url, "--no-bundle", "--runs", "1", "--workdir", str(tmp_path / "wd"),
            "--yes", "--launch-command", "python3 -m sglang.launch_server --model-path m --port 31980",
            timeout_s=90, limit_mib=2048, cwd=tmp_path,
        )
    finally:
        standin.stop()
    assert done.returncode == 2, done.stdout[-500:] + done.stderr
    assert done.stderr.count("\n") == 1 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert peak_mib < 300, f"confirm peaked at {peak_mib} MiB"


def test_replay_against_a_deeply_nested_server_info_replays(tmp_path: Path) -> None:
    info = tmp_path / "info.json"
    info.write_bytes(b'{"version": "0.5.23", "page_size": 1, "deep": ' + b"[" * 50_000 + b"]" * 50_000 + b"}")
    standin = start_standin(tmp_path / "srv", "--mode", "generate", "--info", str(info))
    try:
        done, _ = radixtop_peak("replay", "finding_03330", "--url", standin.url, "--runs", "1", "--no-flush",
                                "--vocab-size", "1000", timeout_s=90)
    finally:
        standin.stop()
    assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr, done.stderr
    assert done.returncode in (0, 1), done.stderr
    assert "44 answered, 0 failed" in done.stderr


def test_replay_says_which_prompts_the_server_takes_as_too_long(tmp_path: Path) -> None:
    info = tmp_path / "info.json"
    info.write_text(json.dumps({"version": "0.5.23", "page_size": 64, "max_req_input_len": 300}))
    standin = start_standin(tmp_path / "srv", "--mode", "generate", "--info", str(info))
    try:
        done, _ = radixtop_peak("replay", "finding_03330", "--url", standin.url, "--runs", "1", "--no-flush",
                                "--vocab-size", "1000", timeout_s=90)
    finally:
        standin.stop()
    line = next((x for x in done.stderr.splitlines() if "max_req_input_len" in x), "")
    assert "have prompts longer than the server's max_req_input_len of 300 tokens" in line, done.stderr
