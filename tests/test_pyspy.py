"""SGLang's own py-spy dumps of its schedulers, read back from the log: where each process was.
The dumps here are py-spy's real output on a real process, inside the lines SGLang 0.5.23 logs
(`Pyspy dump for PID P (cmd):` then py-spy's stdout, unprefixed)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from radixtop.diagnosis.pyspy import read_dumps, where
from radixtop.incident.bundle.evidence import find_tool

STUCK = """\
import time

def wait_for_peer():
    time.sleep(60)

def event_loop():
    wait_for_peer()

open(__import__("sys").argv[1], "w").close()
event_loop()
"""


@pytest.fixture
def real_dump(tmp_path: Path) -> tuple[int, str]:
    """py-spy's dump of a process stuck in wait_for_peer (skipped where py-spy cannot attach)."""
    py_spy = find_tool("py-spy")
    if py_spy is None:
        pytest.skip("py-spy is not installed")
    script, ready = tmp_path / "stuck.py", tmp_path / "ready"
    script.write_text(STUCK)
    proc = subprocess.Popen([sys.executable, str(script), str(ready)])
    try:
        deadline = time.monotonic() + 10
        while not ready.exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        out = subprocess.run([py_spy, "dump", "--pid", str(proc.pid)], capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            pytest.skip(f"py-spy cannot attach here: {out.stderr.strip()[:200]}")
        return proc.pid, out.stdout
    finally:
        proc.kill()
        proc.wait(10)


def sglang_log(pid: int, dump: str) -> list[str]:
    return [
        "[2026-12-05 10:00:03] Sleeping 5 seconds before crash diagnostics to let GPU activity settle.",
        f"[2026-12-05 10:00:08] Pyspy dump for PID {pid} (py-spy dump --native --pid {pid}):",
        *dump.splitlines(),
        "[2026-12-05 10:00:10] kill_process_tree called: parent_pid=1, include_parent=True, pid=1",
        "    not_a_frame (after the dump: ignored)",
    ]


def test_a_real_dump_in_sglangs_lines_says_where_the_process_was(real_dump) -> None:
    pid, dump = real_dump
    stacks = read_dumps(sglang_log(pid, dump))
    (main,) = [s for s in stacks if s.pid == pid]
    assert main.frames[0].startswith("wait_for_peer (") and main.frames[1].startswith("event_loop (")
    (line,) = where(stacks)
    assert line.startswith(f"PID {pid} thread ") and "wait_for_peer (" in line and "<- event_loop (" in line


def test_two_schedulers_each_with_its_active_thread_and_its_other_threads_counted() -> None:
    lines = [
        "[2026-12-05 10:00:08] Pyspy dump for PID 11 (py-spy dump --native --pid 11):",
        "Process 11: sglang::scheduler_TP0",
        "Python v3.11.7 (/usr/bin/python3.11)",
        "",
        'Thread 11 (idle): "MainThread"',
        "    wait (threading.py:331)",
        'Thread 0x7F00AA (active): "Thread-3"',
        "    ncclGroupEnd (libnccl.so.2)",
        "    all_reduce (torch/distributed/distributed_c10d.py:2501)",
        "[2026-12-05 10:00:09] Pyspy dump for PID 12: Process 12: sglang::scheduler_TP1",
        "Thread 12 (idle)",
        "    event_loop_normal (sglang/srt/managers/scheduler.py:1080)",
    ]
    assert where(read_dumps(lines)) == [
        'PID 11 thread 0x7F00AA "Thread-3" active: ncclGroupEnd (libnccl.so.2) <- '
        "all_reduce (torch/distributed/distributed_c10d.py:2501) (1 other thread(s))",
        "PID 12 thread 12 idle: event_loop_normal (sglang/srt/managers/scheduler.py:1080)",
    ]


def test_the_finding_and_the_bundle_keep_where_each_scheduler_was(real_dump, tmp_path: Path) -> None:
    from radixtop.diagnosis.catalog import load_catalog
    from radixtop.diagnosis.findings import FindingsBuilder
    from radixtop.incident.bundle.bundle import take_bundle
    from radixtop.widgets.findings import evidence_text

    pid, dump = real_dump
    lines = sglang_log(pid, dump)
    builder = FindingsBuilder(load_catalog([]))
    for n, text in enumerate(lines, 1):
        builder.feed("server.log", n, text)
    (finding,) = [f for f in builder.report().findings if f.signature.id == "pyspy-dump"]
    shown = evidence_text(finding).plain
    assert "Where each process was (SGLang's py-spy dump, innermost frame first):" in shown
    assert f"• PID {pid} thread " in shown and "wait_for_peer (" in shown

    log = tmp_path / "server.log"
    log.write_text("\n".join(lines) + "\n")
    result = take_bundle(tmp_path / "out", logs=[str(log)], archive=False)
    (kept,) = (result.path / "stacks").glob("sglang-pyspy-*.txt")
    text = kept.read_text()
    assert f"PID {pid} thread " in text and "    wait_for_peer (" in text and "not_a_frame" not in text
