"""`radixtop scan --json` names the cause, its first line and its rank, on logs built from the
messages mined from SGLang and vLLM (tools/mined/messages.jsonl), for each radix-cache failure kind
and each way a line names its rank. Notices before the cause and consequences after it (NCCL
aborts, the SIGQUIT notice, a subprocess crash) must not be named instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
with open(ROOT / "tools" / "mined" / "messages.jsonl", encoding="utf-8") as _f:
    MINED = {json.loads(line)["message"] for line in _f}


def mined(message: str, *values: str) -> str:
    """A mined message with its placeholders filled in order (it must be in the table as written)."""
    assert message in MINED, f"not a mined message: {message}"
    parts = message.split("{}")
    assert len(parts) == len(values) + 1, message
    return parts[0] + "".join(v + p for v, p in zip(values, parts[1:]))


def scan_json(tmp_path: Path, lines: list[str]) -> dict:
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    env = dict(os.environ, RADIXTOP_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run(
        [sys.executable, "-m", "radixtop", "scan", "--json", str(log)],
        capture_output=True,
        check=False,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


def traceback(opener: str, last: str, frames: tuple[str, ...] = ()) -> list[str]:
    """A scheduler's traceback as SGLang writes it: the opener, frames (no prefix), the error."""
    body = [
        "Traceback (most recent call last):",
        '  File "/usr/local/lib/python3.11/dist-packages/sglang/srt/managers/scheduler.py", line 2612, '
        "in run_scheduler_process",
        "    scheduler.event_loop_overlap()",
    ]
    for frame in frames:
        body += [frame, "    self.tree_cache.cache_finished_req(req)"]
    return [opener + " Scheduler hit an exception: " + body[0], *body[1:], last]


def incident(prefix, cause_rank: int, last: str, frames: tuple[str, ...] = ()) -> list[str]:
    """Startup, a retraction on rank 0 (a notice, earlier), the cause on cause_rank, then the
    consequences on the other ranks and the main process. prefix(rank, second) writes a prefix."""
    lines = [
        "[2026-12-02 14:00:00] The server is fired up and ready to roll!",
        prefix(0, 10) + " Decode batch, #running-req: 31, #token: 9000, token usage: 0.97, #queue-req: 4, ",
        prefix(0, 11) + " " + mined("KV cache pool is full. Retract requests. ") + "#retracted_reqs: 2",
    ]
    lines += traceback(prefix(cause_rank, 12), last, frames)
    lines += [
        prefix(1, 13) + " torch.distributed.DistBackendError: NCCL communicator was aborted on rank 1.",
        "[2026-12-02 14:00:14] " + mined(
            "Subprocess {} (pid={}) crashed with exit code {}. Triggering SIGQUIT for cleanup...",
            "scheduler_3", "4242", "-6",
        ),
        "[2026-12-02 14:00:14] " + mined("Received sigquit from a child process. It usually means the child failed."),
    ]
    return lines


def sglang_prefix(rank: int, second: int) -> str:
    return f"[2026-12-02 14:00:{second:02d} TP{rank}]"


FRAME = (
    '  File "/usr/local/lib/python3.11/dist-packages/sglang/srt/mem_cache/swa_radix_cache.py", line 402, '
    "in cache_finished_req"
)

KINDS = [
    (
        "radix-tree-sanity-check-failed",
        "Exception: " + mined(
            "SWA Radix tree sanity check failed, ping @hanming-lu: {}",
            "evictable size: 64 != lru list evictable size: 32",
        ),
        (),
    ),
    ("radix-evict-locked-node", "AssertionError: " + mined("node is in use, x.id={}", "77"), ()),
    (
        "lock-ref-release-underflow",
        "AssertionError: " + mined("dec_lock_ref on node with node.swa_lock_ref={}, node.id={}", "0", "381"),
        (),
    ),
    (
        "radix-lock-invariant",
        "AssertionError: "
        + mined(
            "tombstone swa_lock_ref should always be 0, node.full_lock_ref={}, node.swa_lock_ref={}, node.id={}",
            "1", "1", "9",
        ),
        (),
    ),
    # A crash inside cache_finished_req with an error no signature knows: the frame names it ...
    (
        "radix-cache-finished-req-crash",
        "IndexError: index 4096 is out of bounds for dimension 0 with size 4096",
        (FRAME,),
    ),
    # ... and with one it knows, the error line names it (the last cause of the record).
    (
        "lock-ref-release-underflow",
        "AssertionError: " + mined("FULL segment release hit lock_ref=0 on node {}", "42"),
        (FRAME,),
    ),
    ("cuda-illegal-memory-access", "RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered", ()),
    ("nccl-error", "RuntimeError: " + mined("NCCL error: {}", "unhandled system error"), ()),
]


@pytest.mark.parametrize(("sig_id", "last", "frames"), KINDS, ids=[f"{k[0]}-{i}" for i, k in enumerate(KINDS)])
def test_scan_names_the_cause_of_each_kind(tmp_path: Path, sig_id: str, last: str, frames: tuple[str, ...]) -> None:
    lines = incident(sglang_prefix, 3, last, frames)
    doc = scan_json(tmp_path, lines)
    init = doc["initiating"]
    assert init["signature"] == sig_id
    assert init["rank"] == "TP3"
    named_by_frame = sig_id == "radix-cache-finished-req-crash"
    assert lines[init["line"] - 1] == (FRAME if named_by_frame else last)
    found = {f["signature"] for f in doc["findings"]}
    assert {"kv-pool-retract", "child-sigquit", "subprocess-crashed", "nccl-aborted", "scheduler-exception"} <= found


def test_without_a_cause_the_first_consequence_is_named(tmp_path: Path) -> None:
    # Killed from outside: the scheduler wrote nothing; the watcher's line comes before SIGQUIT's.
    lines = [
        "[2026-12-02 14:00:10 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 1",
        "[2026-12-02 14:00:14] " + mined(
            "Subprocess {} (pid={}) crashed with exit code {}. Triggering SIGQUIT for cleanup...",
            "scheduler_0", "7", "-6",
        ),
        "[2026-12-02 14:00:14] " + mined(
            "SIGQUIT received. signum={}, frame={}. It usually means one child failed.", "3", "None"
        ),
    ]
    init = scan_json(tmp_path, lines)["initiating"]
    assert (init["signature"], init["line"]) == ("subprocess-crashed", 2)


@pytest.mark.parametrize(("code", "sig_id", "initiating"), [
    ("-9", "subprocess-killed", "subprocess-killed"),  # SIGKILL from outside: the first word of the failure
    ("-15", "subprocess-terminated", "child-sigquit"),  # a stop: a notice, never the cause
    ("-6", "subprocess-crashed", "subprocess-crashed"),
])
def test_a_childs_exit_by_signal_is_named_by_its_signal(
    tmp_path: Path, code: str, sig_id: str, initiating: str
) -> None:
    """SGLang 0.5.23's own sequence, as its watchdog and SIGQUIT handler print it."""
    lines = [
        "[2026-12-04 21:27:01] " + mined(
            "Subprocess {} (pid={}) crashed with exit code {}. Triggering SIGQUIT for cleanup...",
            "scheduler_0", "6489", code,
        ),
        "[2026-12-04 21:27:01] " + mined(
            "SIGQUIT received. signum={}, frame={}. It usually means one child failed.", "None", "None"
        ),
    ]
    doc = scan_json(tmp_path, lines)
    found = {f["signature"] for f in doc["findings"]}
    assert (
        sig_id in found
        and not ({"subprocess-killed", "subprocess-terminated", "subprocess-crashed"} - {sig_id}) & found
    )
    assert doc["initiating"]["signature"] == initiating


def test_older_wordings_are_the_same_signatures(tmp_path: Path) -> None:
    lines = [
        "[2024-11-02 14:00:11 TP0] " + mined(
            "Decode out of memory happened. #retracted_reqs: {}, #new_token_ratio: {} -> {}", "3", "0.4000", "0.5000"
        ),
        "[2024-11-02 14:00:12 TP0] " + mined("Watchdog timeout (self.watchdog_timeout={})", "300"),
        "[2024-11-02 14:00:13] " + mined(
            "SIGQUIT received. signum={}, frame={}. It usually means one child failed.", "3", "None"
        ),
    ]
    doc = scan_json(tmp_path, lines)
    assert {f["signature"] for f in doc["findings"]} == {"kv-pool-retract", "watchdog-timeout", "child-sigquit"}
    assert doc["initiating"]["signature"] == "watchdog-timeout"


LAST = "AssertionError: " + mined("node is in use, x.id={}", "77")

RANK_FORMS = [
    # (prefix for a rank at a second, the rank the cause's line names)
    ("ranks only", lambda r, s: f"[TP{r} EP{r}]", "TP3 EP3"),
    ("time only", lambda r, s: f"[14:00:{s:02d} TP{r}]", "TP3"),
    ("data parallel", lambda r, s: f"[2026-12-02 14:00:{s:02d} DP1 TP{r}]", "DP1 TP3"),
    ("ray actor", lambda r, s: f"(SGLangEngine pid={100 + r}, ip=10.0.0.{r}) [2026-12-02 14:00:{s:02d} TP{r}]", "TP3"),
    ("kubernetes", lambda r, s: f"2026-12-02T14:00:{s:02d}.123456789Z [2026-12-02 14:00:{s:02d} TP{r}]", "TP3"),
    ("kubectl prefix", lambda r, s: f"[pod/sglang-0/sglang] [2026-12-02 14:00:{s:02d} TP{r}]", "TP3"),
    ("box border", lambda r, s: f"│ [2026-12-02 14:00:{s:02d} TP{r}]", "TP3"),
]


@pytest.mark.parametrize(("name", "prefix", "rank"), RANK_FORMS, ids=[f[0] for f in RANK_FORMS])
def test_scan_names_the_rank_in_each_form(tmp_path: Path, name: str, prefix, rank: str) -> None:
    lines = incident(prefix, 3, LAST)
    if name == "box border":
        lines = [f"{line:<200} │" if line.startswith("│") else f"│ {line:<198} │" for line in lines]
    init = scan_json(tmp_path, lines)["initiating"]
    assert init["signature"] == "radix-evict-locked-node"
    assert init["rank"] == rank
    assert "node is in use, x.id=77" in lines[init["line"] - 1]


def test_torchrun_and_process_group_ranks(tmp_path: Path) -> None:
    lines = [
        "[rank0]:[W1202 14:00:10.000000000 ProcessGroupNCCL.cpp:1000] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
        "Warning: something slow",
        "[rank3]: Traceback (most recent call last):",
        '[rank3]:   File "/sgl/python/sglang/srt/managers/scheduler.py", line 2612, in run_scheduler_process',
        "[rank3]: RuntimeError: CUDA error: an illegal memory access was encountered",
        "[rank1]:[E1202 14:00:13.000000000 ProcessGroupNCCL.cpp:1834] [PG ID 0 PG GUID 0(default_pg) Rank 1] "
        "To avoid data inconsistency, we are taking the entire process down.",
    ]
    doc = scan_json(tmp_path, lines)
    assert (doc["initiating"]["signature"], doc["initiating"]["rank"], doc["initiating"]["line"]) == (
        "cuda-illegal-memory-access",
        "rank3",
        4,
    )
    aborted = next(f for f in doc["findings"] if f["signature"] == "nccl-aborted")
    assert aborted["first"]["rank"] == "rank1"


def test_process_group_rank_without_torchrun_prefix(tmp_path: Path) -> None:
    lines = [
        "[E1202 14:00:12.500000000 ProcessGroupNCCL.cpp:1896] [PG ID 2 PG GUID 3 Rank 2] Process group watchdog "
        "thread terminated with exception: CUDA error: an illegal memory access was encountered",
    ]
    init = scan_json(tmp_path, lines)["initiating"]
    assert (init["signature"], init["rank"]) == ("cuda-illegal-memory-access", "rank2")


def test_a_wrapped_line_keeps_the_rank_of_its_first_part(tmp_path: Path) -> None:
    # A terminal wrapped the traceback's last line mid-word: the rest is a continuation of TP3's record.
    lines = incident(sglang_prefix, 3, LAST[:-1])
    at = lines.index(LAST[:-1])
    lines.insert(at + 1, "7")
    lines[at] = "AssertionError: node is in use, x.id=7"
    init = scan_json(tmp_path, lines)["initiating"]
    assert (init["signature"], init["rank"], init["line"]) == ("radix-evict-locked-node", "TP3", at + 1)
