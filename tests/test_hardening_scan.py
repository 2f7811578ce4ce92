"""radixtop scan on hostile inputs: huge lines with hits, more log files than open files allowed,
a FIFO, a stdout that cannot encode Unicode. Real files, FIFOs and subprocesses."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

SIGNATURES = (
    "[2026-12-02 14:00:03 TP0] sglang.srt.mem_cache.radix_cache.RadixCacheError: "
    "Failed to lock memory page during dynamic prefix eviction",
    "[2026-12-02 14:03:14.964] Received sigquit from a child process. It usually means the child failed.",
)
HUGE = 2 << 20  # bytes in each huge line: small enough for a test, 32 times the evidence cap


def _scan(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "radixtop", "scan", *args], capture_output=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False, **kw)  # fmt: skip


def test_huge_lines_around_hits_are_cut_in_the_evidence_with_a_marker(tmp_path: Path) -> None:
    log = tmp_path / "huge.log"
    with open(log, "wb") as f:
        for i in range(6):
            f.write(b"[2026-12-02 14:00:01 TP0] " + b"x" * HUGE + b"\n")  # before the hits
        for line in SIGNATURES * 3:
            f.write(line.encode() + b"\n")
        for i in range(20):
            f.write(b"[2026-12-02 14:00:04 TP0] " + bytes([97 + i % 26]) * HUGE + b"\n")  # after them
    done = _scan("--json", str(log))
    assert done.returncode == 0, done.stderr[-500:]
    # 2 findings x (100 lines before + 20 after) x 64 Ki characters at most, and the rest
    assert len(done.stdout) < 2 * 30 * (64 << 10) + (1 << 20), f"{len(done.stdout):,} bytes of JSON"
    doc = json.loads(done.stdout)
    assert len(doc["findings"]) == 2
    marker = f" …[line truncated: {HUGE + 26} bytes]"
    for finding in doc["findings"]:
        lines = finding["context_before"] + finding["context_after"]
        assert any(line.endswith(marker) for line in lines), "no truncation marker"
        assert all(len(line) <= (64 << 10) + len(marker) for line in lines)
