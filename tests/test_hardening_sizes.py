"""Answers and inputs that would eat memory without end are refused in one line: a replay's
/flush_cache answer is read within the cap every answer has, and a trace's or /server_info's
sizes are held to sane limits before anything is built from them. Each runs `radixtop` as a real
process and reads its peak memory."""

from __future__ import annotations

from pathlib import Path

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
