"""radixtop scan on hostile inputs: huge lines with hits, more log files than open files allowed,
a FIFO, a stdout that cannot encode Unicode. Real files, FIFOs and subprocesses."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

SIGNATURES = (
    "[2026-12-02 14:00:03 TP0] sglang.srt.mem_cache.radix_cache.RadixCacheError: "
    "Failed to lock memory page during dynamic prefix eviction",
    "[2026-12-02 14:03:14.964] Received sigquit from a child process. It usually means the child failed.",
)
HUGE = 2 << 20  # bytes in each huge line: small enough for a test, 32 times the evidence cap


def _scan(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:  # noqa: D103
    return subprocess.run([sys.executable, "-m", "radixtop", "scan", *args], capture_output=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False, **kw)


def test_huge_lines_around_hits_are_cut_in_the_evidence_with_a_marker(tmp_path: Path) -> None:
    log = tmp_path / "huge.log"
    with open(log, "wb") as f:
        for _ in range(6):
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


FOLLOW_MANY = """
import asyncio, sys
from radixtop.probes.follow import LogFollower

async def main():
    async with LogFollower([sys.argv[1]], history=True) as follower:  # as the UI: from the end
        for _ in range(100):
            batch = follower.take()
            if batch is not None and batch.notices:
                break
            await asyncio.sleep(0.05)
        for notice in batch.notices:
            print(notice.kind, notice.message)
        followed = sorted(h.source for h in follower.health() if h.state == "ok")
        print("followed", len(followed), followed[0], followed[-1])

asyncio.run(main())
"""


def _nofile(limit: int):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def test_a_glob_past_the_open_file_limit_follows_the_newest_files_with_a_notice(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    for i in range(2000):
        path = logs / f"r{i:04d}.log"
        path.write_text(f"[2026-12-02 14:00:01 TP{i}] line\n")
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # r1999 is the newest
    done = subprocess.run([sys.executable, "-c", FOLLOW_MANY, str(logs / "*.log")], capture_output=True, text=True,
                          timeout=120, preexec_fn=_nofile(1024), check=False)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-800:]
    capped = [line for line in done.stdout.splitlines() if line.startswith("capped ")]
    assert len(capped) == 1 and "2,000 files" in capped[0] and "ulimit -n) is 1024" in capped[0], done.stdout
    followed = next(line for line in done.stdout.splitlines() if line.startswith("followed ")).split()
    count = int(followed[1])
    assert 100 < count < 1024 // 3 and followed[3].endswith("r1999.log")
    assert followed[2].endswith(f"r{2000 - count:04d}.log")  # the newest ones
    scan = _scan(*map(str, sorted(logs.glob("r0*.log"))), preexec_fn=_nofile(64))  # one file at a time
    assert scan.returncode == 0 and b"Traceback" not in scan.stderr


def test_scan_reads_a_fifo_as_a_stream_and_its_writer_finishes(tmp_path: Path) -> None:
    good = tmp_path / "good.log"
    good.write_text("".join(f"[2026-12-02 14:00:01 TP0] line {i}\n" for i in range(5000)) + SIGNATURES[0] + "\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", 'cat "$0" > "$1"', str(good), str(fifo)])
    try:
        done = _scan("--json", str(fifo), timeout=30)
        assert writer.wait(timeout=10) == 0, "the writer got SIGPIPE"
    finally:
        writer.kill()
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["lines"] == 5001 and [f["signature"] for f in doc["findings"]] == ["radix-page-lock-eviction"]


ASCII_ENVS = ({"PYTHONIOENCODING": "ascii"}, {"LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"})


def test_scan_on_a_stdout_that_cannot_encode_unicode_prints_ascii(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(SIGNATURES[0] + " " + "é" * 300 + "\n", encoding="utf-8")
    for extra in ASCII_ENVS:
        env = {k: v for k, v in os.environ.items() if k not in ("LANG", "LC_CTYPE", "PYTHONUTF8")}
        for args in ((str(log),), ("--json", str(log))):
            done = _scan(*args, env={**env, **extra})
            assert done.returncode == 0 and b"Traceback" not in done.stderr, (extra, done.stderr[-400:])
            done.stdout.decode("ascii")  # nothing but ASCII
            if args[0] == "--json":
                assert json.loads(done.stdout)["findings"][0]["first"]["text"].endswith("é" * 300)
            else:
                assert b"radix-page-lock-eviction" in done.stdout and b"..." in done.stdout
