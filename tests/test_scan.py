"""`radixtop scan` and the chunked scanner behind it, on real files, real gzip, real stdin."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import zlib
from datetime import datetime
from pathlib import Path

import pytest

from radixtop.diagnosis.catalog import Signature, load_catalog
from radixtop.diagnosis.evidence_policy import batch_stats_before
from radixtop.diagnosis.matcher import ENGINES, Matcher, MatcherError
from radixtop.probes.logscan import LogScanner, ScanInputError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("RADIXTOP_CACHE_DIR", str(tmp_path_factory.mktemp("hs-cache")))


def radixtop(*args: str, stdin: bytes | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "radixtop", "scan", *args],
        input=stdin,
        capture_output=True,
        check=False,
        env=full_env,
        cwd=ROOT,
        timeout=60,
    )


def batch(t: str, rank: int, usage: float, running: int = 10) -> str:
    return (
        f"[2026-12-02 {t} TP{rank}] Decode batch, #running-req: {running}, #token: 5000, "
        f"token usage: {usage:.2f}, cuda graph: True, gen throughput (token/s): 900.00, #queue-req: 2, "
    )


def incident_lines() -> list[str]:
    """An SGLang incident across 4 ranks: ready (info), retract on TP3 (warning), TP3's traceback
    ending in an illegal memory access (error/critical), then more errors."""
    lines = []
    for i in range(40):
        lines.append(batch(f"14:00:{i:02d}.000", i % 4, 0.50 + i / 100))
    lines.insert(5, "[2026-12-02 14:00:05.500 TP0] The server is fired up and ready to roll!")
    lines += [
        "[2026-12-02 14:00:41.000 TP3] KV cache pool is full. Retract requests. #retracted_reqs: 2",
        batch("14:00:41.500", 1, 0.97, running=31),
        "[2026-12-02 14:00:42.000 TP3] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2612, in run_scheduler_process',
        "    scheduler.event_loop_overlap()",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "[2026-12-02 14:00:43.000 TP1] Prefill out of memory. Try to lower your batch size.",
        "[2026-12-02 14:00:44.000 TP2] KV cache pool is full. Retract requests. "
        "KV cache pool is full. Retract requests.",
        "[2026-12-02 14:00:45.000 TP0] Received sigquit from a child process. It usually means the child failed.",
    ]
    return lines


@pytest.fixture()
def incident_log(tmp_path) -> Path:
    path = tmp_path / "node0.log"
    path.write_text("\n".join(incident_lines()) + "\n", encoding="utf-8")
    return path


def line_of(lines: list[str], needle: str) -> int:
    return next(i for i, line in enumerate(lines, 1) if needle in line)


# -- the JSON report ------------------------------------------------------------------------------


def test_json_report_schema_and_values(incident_log):
    lines = incident_lines()
    done = radixtop("--json", "--context", "3", str(incident_log))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert isinstance(doc["lines"], int) and doc["lines"] == len(lines)
    assert doc["engine"] in ENGINES
    ids = [f["signature"] for f in doc["findings"]]
    assert ids == [
        "server-ready",
        "kv-pool-retract",
        "scheduler-exception",
        "cuda-illegal-memory-access",
        "prefill-oom",
        "child-sigquit",
    ]
    for finding in doc["findings"]:
        assert {"signature", "severity", "count", "first", "context_before"} <= finding.keys()
        assert set(finding["first"]) == {"file", "line", "time", "epoch", "rank", "text"}
        assert isinstance(finding["count"], int) and isinstance(finding["context_before"], list)
    by_id = {f["signature"]: f for f in doc["findings"]}

    retract = by_id["kv-pool-retract"]
    assert retract["severity"] == "warning"
    assert retract["count"] == 2  # two lines; the line with it twice counts once
    first_line = line_of(lines, "KV cache pool is full")
    assert retract["first"] == {
        "file": str(incident_log),
        "line": first_line,
        "time": "2026-12-02 14:00:41.000",
        "epoch": retract["first"]["epoch"],
        "rank": "TP3",
        "text": lines[first_line - 1],
    }
    assert retract["first"]["epoch"] == datetime(2026, 12, 2, 14, 0, 41).timestamp()  # this node's time zone
    assert retract["context_before"] == lines[first_line - 4 : first_line - 1]

    # The traceback's last line has no prefix: it takes its record's time and rank.
    cuda = by_id["cuda-illegal-memory-access"]
    assert cuda["severity"] == "critical"
    assert cuda["first"]["line"] == line_of(lines, "RuntimeError: CUDA error")
    assert (cuda["first"]["time"], cuda["first"]["rank"]) == ("2026-12-02 14:00:42.000", "TP3")
    assert cuda["first"]["text"] == "RuntimeError: CUDA error: an illegal memory access was encountered"

    # The cause, not the retraction notice before it or the SIGQUIT notice after it.
    assert doc["initiating"]["signature"] == "cuda-illegal-memory-access"
    assert doc["initiating"]["rank"] == "TP3"
    assert doc["initiating"]["line"] == line_of(lines, "RuntimeError: CUDA error")
    # Token usage per rank from the last batch line before the first error (the traceback).
    usage = {rank: stats["token_usage"] for rank, stats in doc["batch_at_failure"].items()}
    assert usage == {"TP0": 0.86, "TP1": 0.97, "TP2": 0.88, "TP3": 0.89}


def test_human_report_names_engine_initiating_rank_fingerprint_and_usage(incident_log):
    done = radixtop(str(incident_log))
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert re.search(
        rf"radixtop scan: 1 input, {len(incident_lines())} lines, 6 signatures found \(engine: (hyperscan|re2|re)\)",
        out,
    )
    assert "Initiating rank: TP3  cuda-illegal-memory-access (critical)" in out
    assert "Fingerprint INFO -> WARN -> ERROR (complete):" in out
    assert re.search(r"ERROR\s+cuda-illegal-memory-access\s+\S*node0.log:\d+", out)
    assert re.search(r"TP1\s+decode\s+token usage 0\.97\s+running 31", out)
    findings = out.split("Findings by first occurrence:")[1]
    order = [findings.index(x) for x in ("server-ready", "kv-pool-retract", "scheduler-exception", "prefill-oom")]
    assert order == sorted(order)


def test_no_findings_is_still_a_successful_run(tmp_path):
    quiet = tmp_path / "quiet.log"
    quiet.write_text(batch("14:00:00", 0, 0.1) + "\n")
    done = radixtop(str(quiet))
    assert done.returncode == 0
    assert "No known failure signature matched." in done.stdout.decode()
    doc = json.loads(radixtop("--json", str(quiet)).stdout)
    assert doc["lines"] == 1 and doc["findings"] == [] and doc["initiating"] is None


def test_fallback_engine_is_reported(incident_log):
    done = radixtop(str(incident_log), env={"RADIXTOP_SCAN_ENGINE": "re"})
    assert "(engine: re)" in done.stdout.decode()
    doc = json.loads(radixtop("--json", str(incident_log), env={"RADIXTOP_SCAN_ENGINE": "re"}).stdout)
    assert doc["engine"] == "re"


# -- --matches, gzip, stdin, rg -----------------------------------------------------------------


def matches_of(out: bytes, name: str) -> list[tuple[int, str, bytes]]:
    rows = []
    for row in out.splitlines():
        file, line, sig_id, text = row.split(b":", 3)
        assert file.decode() == name
        rows.append((int(line), sig_id.decode(), text))
    return rows


def test_matches_plain_gzip_and_stdin_agree(incident_log, tmp_path):
    lines = incident_lines()
    plain = radixtop("--matches", str(incident_log))
    assert plain.returncode == 0, plain.stderr
    rows = matches_of(plain.stdout, str(incident_log))
    assert (
        line_of(lines, "RuntimeError"),
        "cuda-illegal-memory-access",
        lines[line_of(lines, "RuntimeError") - 1].encode(),
    ) in rows
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)

    gz = tmp_path / "node0.log.gz"
    gz.write_bytes(gzip.compress(incident_log.read_bytes()))
    zipped = radixtop("--matches", str(gz))
    assert zipped.returncode == 0, zipped.stderr
    assert matches_of(zipped.stdout, str(gz)) == rows

    piped = radixtop("--matches", "-", stdin=incident_log.read_bytes())
    assert piped.returncode == 0, piped.stderr
    assert matches_of(piped.stdout, "<stdin>") == rows

    doc = json.loads(radixtop("--json", "-", stdin=gzip.decompress(gz.read_bytes())).stdout)
    assert doc["lines"] == len(lines) and doc["findings"][0]["first"]["file"] == "<stdin>"


@pytest.mark.parametrize("threads", ["0", "1"])
def test_truncated_gzip_reports_what_was_readable(incident_log, tmp_path, threads):
    data = gzip.compress(incident_log.read_bytes() * 50)
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(data[: len(data) * 2 // 3])
    done = radixtop("--matches", str(cut), env={"RADIXTOP_SCAN_THREADS": threads})
    assert done.returncode == 0
    assert done.stdout.count(b"kv-pool-retract") >= 10
    assert "compressed data ends early" in done.stderr.decode()
    # Every line before the break is there: the last match is from the last whole copy or later.
    rows = matches_of(done.stdout, str(cut))
    plain = incident_log.read_bytes() * 50
    readable = zlib.decompressobj(31).decompress(data[: len(data) * 2 // 3])
    assert plain.startswith(readable)
    assert max(r[0] for r in rows) >= readable.count(b"\n") - len(incident_lines())


def test_concatenated_gzip_members_are_all_read(incident_log, tmp_path):
    two = tmp_path / "two.log.gz"
    two.write_bytes(gzip.compress(incident_log.read_bytes()) * 2)
    doc = json.loads(radixtop("--json", str(two)).stdout)
    assert doc["lines"] == 2 * len(incident_lines())


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_prints_the_same_matches(incident_log, engine):
    expected = radixtop("--matches", str(incident_log), env={"RADIXTOP_SCAN_ENGINE": "re"}).stdout
    done = radixtop("--matches", str(incident_log), env={"RADIXTOP_SCAN_ENGINE": engine})
    if done.returncode == 2 and b"unavailable" in done.stderr:
        pytest.skip(done.stderr.decode())
    assert done.stdout == expected and expected


@pytest.mark.skipif(shutil.which("rg") is None, reason="ripgrep (rg) is not installed")
def test_matches_find_the_lines_rg_finds(tmp_path):
    catalog = load_catalog()
    samples = [
        "[2026-12-02 14:00:00 TP0] RadixCacheError: Failed to lock memory page during dynamic prefix eviction",
        "[2026-12-02 14:00:00 TP1] FULL segment release hit lock_ref=0 on node 77",
        "[2026-12-02 14:00:00 TP2] token_to_kv_pool_allocator memory leak detected! x",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
        "[rank3]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)",
        "NCCL error in: /pytorch/NCCLUtils.hpp:275, unhandled cuda error ncclUnhandledCudaError",
        "x EngineDeadError and AsyncEngineDeadError",
        "Rust TreeCore panicked: at src/lib.rs",
        "caf\u00e9 \u2192 Capture cuda graph failed: oops\r",
    ]
    body = []
    for i in range(3000):
        body.append(batch(f"14:{i // 60 % 60:02d}:{i % 60:02d}", i % 8, 0.5))
        if i % 331 == 7:
            body.append(samples[(i // 331) % len(samples)])
    log = tmp_path / "rg.log"
    log.write_text("\n".join(body) + "\n", encoding="utf-8")
    argv = ["rg", "--no-config", "-n"]
    for s in catalog.signatures:
        argv += ["-e", s.pattern]
    rg = subprocess.run([*argv, str(log)], capture_output=True, check=False, timeout=60)
    assert rg.returncode == 0, rg.stderr
    theirs = {(int(a), b) for a, b in (row.split(b":", 1) for row in rg.stdout.splitlines())}
    ours = {(line, text) for line, _, text in matches_of(radixtop("--matches", str(log)).stdout, str(log))}
    assert ours == theirs and len(ours) >= 9


# -- the chunked scanner ---------------------------------------------------------------------------

EDGE_SIGS = [
    Signature("oom", "oom", "out of memory", "error", "t", "m", (), ()),
    Signature("lock", "lock", r"lock\s+page", "warning", "t", "m", (), ()),
    Signature("end", "end", r"done$", "info", "t", "m", (), ()),
]


def reference(data: bytes) -> tuple[int, list[tuple[int, int, bytes]]]:
    compiled = [re.compile(s.pattern.encode(), re.MULTILINE) for s in EDGE_SIGS]
    lines = data.split(b"\n")
    if data.endswith(b"\n") or not data:
        lines.pop()
    hits = [(n, i, line) for n, line in enumerate(lines, 1) for i, p in enumerate(compiled) if p.search(line)]
    return len(lines), hits


EDGE_CASES = {
    "empty": b"",
    "one-line-no-newline": b"out of memory",
    "hit-first-and-last": b"out of memory\nx\ny\nz\nlock page done",
    "crlf": b"a\r\nout of memory\r\nlock  page\r\ndone\r\nnot done\n",
    "binary": b"\x00\xff\xfeout of memory\x00\n\x1b[31mlock page\x1b[0m\n\xc3\x28 done\n",
    "long-line": b"short\n" + b"x" * 300 + b" out of memory " + b"y" * 300 + b"\nlock\npage\nlock page\n",
    "blank-lines": b"\n\n\nout of memory\n\n\n",
}


def scan_hits(scanner: LogScanner, path: Path) -> tuple[int, list[tuple[int, int, bytes]]]:
    found = []
    summary = scanner.scan(str(path), lambda h: found.append((h.line, h.signature_index, h.raw)))
    return summary.lines, found


@pytest.mark.parametrize("case", sorted(EDGE_CASES))
@pytest.mark.parametrize("engine", ENGINES)
def test_chunk_boundaries_every_chunk_size(tmp_path, case, engine):
    try:
        matcher = Matcher(EDGE_SIGS, engine=engine)
    except MatcherError as exc:
        pytest.skip(str(exc))
    data = EDGE_CASES[case]
    path = tmp_path / "edge.log"
    path.write_bytes(data)
    expected = reference(data)
    sizes = sorted({1, 2, 3, 5, 7, 13, 64, 4 << 20} | {len(data), len(data) + 1} | set(range(1, min(len(data), 40))))
    for size in sizes:
        for threads in (False, True):
            got = scan_hits(LogScanner(matcher, chunk_size=size, threads=threads, details=False), path)
            assert got == expected, (size, threads)
    for threads in (False, True):  # details on
        assert scan_hits(LogScanner(matcher, context=2, chunk_size=7, threads=threads), path) == expected


def test_line_longer_than_max_line_is_scanned_in_pieces_and_counted_once(tmp_path):
    matcher = Matcher(EDGE_SIGS)
    data = b"a\n" + (b"out of memory " * 40) + b"\nlock page\nb"
    path = tmp_path / "long.log"
    path.write_bytes(data)
    lines, hits = scan_hits(LogScanner(matcher, chunk_size=16, max_line=64, details=False), path)
    assert lines == 4
    assert [(h[0], h[1]) for h in hits] == [(2, 0), (3, 1)]


@pytest.mark.parametrize("threads", [False, True])
def test_context_before_and_after_cross_chunks_on_files_and_stdin(tmp_path, threads):
    matcher = Matcher(EDGE_SIGS)
    body = [f"line {i}" for i in range(1, 200)]
    body[149] = "out of memory here"
    body[159] = "out of memory again"
    path = tmp_path / "ctx.log"
    path.write_text("\n".join(body) + "\n")
    hits = []
    LogScanner(matcher, context=30, after=25, chunk_size=64, threads=threads).scan(str(path), hits.append)
    assert [h.line for h in hits] == [150, 160]
    assert hits[0].context_before == tuple(body[119:149])  # re-read from the file (pread)
    assert hits[0].context_after == tuple(body[150:175])  # gathered from the next chunks
    assert hits[1].context_before == () and hits[1].context_after == ()  # only a first hit needs them

    # stdin cannot be re-read: the context is what the two buffers still hold, never wrong lines.
    proc = subprocess.run(
        [sys.executable, "-c", (
            "import sys; from radixtop.diagnosis.catalog import Signature;"
            "from radixtop.diagnosis.matcher import Matcher; from radixtop.probes.logscan import LogScanner;"
            "sigs=[Signature('oom','oom','out of memory','error','t','m',(),())];"
            f"LogScanner(Matcher(sigs), context=30, after=25, chunk_size=64, threads={threads}).scan('-', "
            "lambda h: print(repr((h.line, h.context_before, h.context_after))))"
        )],
        input=path.read_bytes(),
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    line, before, after = eval(proc.stdout.decode().splitlines()[0])  # our own repr output
    assert line == 150 and before and before == tuple(body[149 - len(before) : 149])
    assert after == tuple(body[150:175])


@pytest.mark.parametrize("threads", [False, True])
@pytest.mark.parametrize("chunk_size", [64, 1 << 20])
def test_a_scan_that_stops_at_a_line_start_counts_the_lines_before_it(tmp_path, threads, chunk_size):
    """A followed file's history: nothing from `stop_at` on is matched, the lines before it are
    counted, and a hit just before it still gets its lines after from beyond it."""
    matcher = Matcher(EDGE_SIGS)
    body = [f"line {i}" for i in range(1, 200)]
    body[49] = "out of memory at 50"
    body[148] = "lock page at 149"  # a first hit two lines before the stop: its lines after lie past it
    body[170] = "out of memory at 171"
    path = tmp_path / "history.log"
    path.write_text("\n".join(body) + "\n")
    stop = sum(len(line) + 1 for line in body[:150])  # where line 151 starts
    hits = []
    scanner = LogScanner(matcher, context=5, after=10, chunk_size=chunk_size, threads=threads)
    summary = scanner.scan(str(path), hits.append, stop_at=stop)
    assert summary.lines == 150 and summary.hits == 2
    assert [h.line for h in hits] == [50, 149]
    assert hits[0].context_after == tuple(body[50:60])
    assert hits[1].context_after == tuple(body[149:159])  # lines 150 to 159: past the stop
    whole = []
    LogScanner(matcher, context=5, after=10, chunk_size=chunk_size, threads=threads).scan(str(path), whole.append)
    assert [h.line for h in whole] == [50, 149, 171]
    assert hits == whole[:2]
    # A stop past the end (the file was cut short): the lines there are.
    assert scanner.scan(str(path), [].append, stop_at=10 * stop).lines == 199
    assert scanner.scan(str(path), [].append, stop_at=0).lines == 0


def test_batch_stats_before_keep_the_last_line_per_rank():
    window = "\n".join(
        [
            batch("14:00:00", 0, 0.10),
            batch("14:00:01", 1, 0.20),
            batch("14:00:02", 0, 0.30),
            (
                "[2026-12-02 14:00:03 TP1] Prefill batch, #new-seq: 1, #new-token: 5, "
                "#cached-token: 0, token usage: 0.40, #running-req: 3, #queue-req: 0, "
            ),
            "[2026-12-02 14:00:04 TP2] Prefill out of memory",
        ]
    ).encode()
    stats = batch_stats_before(window)
    assert {rank: (s.kind, s.token_usage) for rank, s in stats.items()} == {
        "TP0": ("decode", 0.30),
        "TP1": ("prefill", 0.40),
    }


# -- bad input ------------------------------------------------------------------------------------


def one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2
    err = done.stderr.decode()
    assert err.count("\n") == 1 and err.startswith("radixtop: "), err
    assert "Traceback" not in err
    return err


def test_missing_file_directory_and_fake_gzip_exit_2_with_one_line(tmp_path, incident_log):
    err = one_line_error(radixtop(str(incident_log), str(tmp_path / "nope.log")))
    assert "nope.log: no such file; check the path" in err
    err = one_line_error(radixtop(str(tmp_path)))
    assert f"{tmp_path}: is a directory; pass the log files in it" in err
    fake = tmp_path / "fake.log.gz"
    fake.write_text("plain text\n")
    err = one_line_error(radixtop("--matches", str(fake)))
    assert "fake.log.gz: not a gzip file" in err


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file_exit_2(tmp_path):
    locked = tmp_path / "locked.log"
    locked.write_text("x\n")
    locked.chmod(0)
    err = one_line_error(radixtop(str(locked)))
    assert "locked.log: permission denied" in err


def test_bad_catalog_engine_and_options_exit_2(tmp_path, incident_log):
    bad = tmp_path / "extra.toml"
    bad.write_text("[[signature]]\nid = \"x\"\npattern = \"(unclosed\"\n")
    err = one_line_error(radixtop("--signatures", str(bad), str(incident_log)))
    assert "extra.toml:" in err
    err = one_line_error(radixtop(str(incident_log), env={"RADIXTOP_SCAN_ENGINE": "pcre"}))
    assert "RADIXTOP_SCAN_ENGINE=pcre is not an engine" in err
    one_line_error(radixtop("--json", "--matches", str(incident_log)))
    one_line_error(radixtop("--context", "-1", str(incident_log)))


def test_user_catalog_adds_a_signature(tmp_path, incident_log):
    extra = tmp_path / "mine.toml"
    extra.write_text(
        '[[signature]]\nid = "my-ready"\ntitle = "Ready"\npattern = "fired up and ready"\n'
        'severity = "info"\nsubsystem = "server"\nmeaning = "up"\nfirst_checks = []\ncompeting = []\n'
    )
    done = radixtop("--matches", "--signatures", str(extra), str(incident_log))
    assert b":my-ready:" in done.stdout


def test_matches_into_a_closed_pipe_ends_quietly(tmp_path):
    log = tmp_path / "many.log"
    log.write_bytes(b"[2026-12-02 14:00:00 TP0] Prefill out of memory. Try to lower your batch size.\n" * 100_000)
    cmd = f"{sys.executable} -m radixtop scan --matches {log} | head -n 1"
    done = subprocess.run(["bash", "-c", cmd], capture_output=True, check=False, cwd=ROOT, timeout=60)
    assert done.stdout.count(b"\n") == 1
    assert b"Traceback" not in done.stderr and b"BrokenPipe" not in done.stderr


def test_scan_imports_nothing_heavy(incident_log):
    # Twice: the first run fills the caches (catalog, hyperscan database); the second is the
    # usual start, which must not parse TOML, hash, or look up package resources.
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "radixtop", "scan", "--matches", str(incident_log)],
            capture_output=True,
            check=False,
            cwd=ROOT,
            timeout=60,
        )
        assert done.returncode == 0
    modules = {row.split("|")[-1].strip() for row in done.stderr.decode().splitlines() if "|" in row}
    assert "radixtop.probes.logscan" in modules
    heavy = ("textual", "httpx", "asyncio", "concurrent.futures", "json", "tomllib", "hashlib")
    for name in heavy + ("importlib.resources",):
        assert name not in modules, name


def test_small_file_reads_into_small_buffers_then_a_big_file_is_whole(tmp_path):
    # Two 4 MiB buffers cost more to zero than a small file costs to scan: a small regular file
    # gets buffers its size; a bigger file after it grows them again and loses nothing.
    scanner = LogScanner(Matcher(EDGE_SIGS), details=False)
    small = tmp_path / "small.log"
    small.write_bytes(b"x\n" * 100 + b"out of memory\n")
    assert scan_hits(scanner, small) == (101, [(101, 0, b"out of memory")])
    assert max(len(buf) for buf in scanner._buffers) <= 128 << 10
    big = tmp_path / "big.log"
    line = b"y" * 99 + b"\n"
    with open(big, "wb") as f:
        f.write(line * 60_000 + b"lock  page\n" + line * 10_000 + b"out of memory")  # ~7 MiB
    assert scan_hits(scanner, big) == (70_002, [(60_001, 1, b"lock  page"), (70_002, 0, b"out of memory")])
    assert max(len(buf) for buf in scanner._buffers) >= 4 << 20
    assert scan_hits(scanner, small) == (101, [(101, 0, b"out of memory")])


def test_scanner_raises_input_error_for_a_missing_path(tmp_path):
    with pytest.raises(ScanInputError, match="no such file"):
        LogScanner(Matcher(EDGE_SIGS)).scan(str(tmp_path / "gone.log"), lambda h: None)


def test_one_scanner_over_several_files_keeps_them_apart(tmp_path):
    # Buffers are reused from file to file: nothing of a longer first file may leak into a second.
    scanner = LogScanner(Matcher(EDGE_SIGS), chunk_size=256)
    big = tmp_path / "big.log"
    big.write_bytes(b"x\n" * 500 + b"out of memory\n" + b"y\n" * 500)
    small = tmp_path / "small.log"
    small.write_bytes(b"z\nz")
    assert scan_hits(scanner, big) == (1001, [(501, 0, b"out of memory")])
    assert scan_hits(scanner, small) == (2, [])
    assert scan_hits(scanner, big) == (1001, [(501, 0, b"out of memory")])


def test_matches_over_several_files_name_each(tmp_path, incident_log):
    other = tmp_path / "node1.log"
    other.write_text("[2026-12-02 14:00:50 TP5] Prefill out of memory. Try to lower your batch size.\n")
    done = radixtop("--matches", str(incident_log), str(other))
    rows = done.stdout.decode().splitlines()
    assert rows[-1] == f"{other}:1:prefill-oom:" + other.read_text().rstrip("\n")
    assert all(row.startswith(str(incident_log)) for row in rows[:-1])
    doc = json.loads(radixtop("--json", str(incident_log), str(other)).stdout)
    assert doc["lines"] == len(incident_lines()) + 1


class _ReaderThatFails:
    """A reader whose device fails after `good` bytes: a disk error cannot be made on demand on a
    real file, so this is the one seam faked here."""

    def __init__(self, data: bytes, good: int) -> None:
        self.data = data
        self.pos = 0
        self.good = good

    def readinto(self, view) -> int:
        if self.pos >= self.good:
            raise OSError(5, "Input/output error")
        n = min(len(view), self.good - self.pos)
        view[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n


@pytest.mark.parametrize("threads", [False, True])
def test_read_error_reports_the_hits_before_it_then_a_one_line_error(threads):
    from radixtop.probes.logscan import _Source

    data = b"x\n" * 40 + b"out of memory\n" + b"y\n" * 200
    scanner = LogScanner(Matcher(EDGE_SIGS), chunk_size=64, threads=threads, details=False)
    hits = []
    source = _Source("disk.log", _ReaderThatFails(data, 150), None, owned=False)
    with pytest.raises(ScanInputError) as caught:
        scanner._scan_source(source, hits.append)
    assert [(h.line, h.raw) for h in hits] == [(41, b"out of memory")]
    assert str(caught.value) == "disk.log: cannot read (Input/output error); check the file and try again"


def test_thread_setting_from_the_environment(incident_log, tmp_path):
    big = tmp_path / "big.log"
    big.write_bytes(incident_log.read_bytes() * 3000)  # ~12 MiB: several chunks
    outputs = {
        value: radixtop("--matches", str(big), env={"RADIXTOP_SCAN_THREADS": value}) for value in ("0", "1", "auto")
    }
    assert all(done.returncode == 0 for done in outputs.values())
    assert outputs["0"].stdout == outputs["1"].stdout == outputs["auto"].stdout
    assert outputs["0"].stdout.count(b"\n") == 3000 * len(radixtop("--matches", str(incident_log)).stdout.splitlines())
    bad = radixtop("--matches", str(incident_log), env={"RADIXTOP_SCAN_THREADS": "yes"})
    assert bad.returncode == 2 and bad.stdout == b""
    assert bad.stderr.decode() == (
        "radixtop: RADIXTOP_SCAN_THREADS=yes is not 0, 1 or auto; unset it to let radixtop choose\n"
    )


def test_worker_only_for_big_inputs_with_an_idle_core(monkeypatch):
    from radixtop.probes import logscan

    monkeypatch.setattr(logscan.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(logscan.os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    assert logscan._worth_a_worker(None, 1 << 20)  # stdin, .gz: size unknown
    assert logscan._worth_a_worker(64 << 20, 1 << 20)
    assert not logscan._worth_a_worker(100_000, 1 << 20)  # a few chunks: not worth a thread
    monkeypatch.setattr(logscan.os, "getloadavg", lambda: (1.7, 1.0, 1.0))  # both cores busy
    assert not logscan._worth_a_worker(64 << 20, 1 << 20)
    monkeypatch.setattr(logscan.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(logscan.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert not logscan._worth_a_worker(64 << 20, 1 << 20)  # one core
