"""The log-line parser: every prefix shape SGLang (and vLLM, Python logging) writes, batch stats,
continuation lines, and garbage that must never raise."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixtop.diagnosis.logline import (
    RANK_LOOKAHEAD,
    BatchStats,
    is_continuation,
    opens_record,
    parse_batch,
    parse_line,
    rank_ahead,
    strip_ansi,
)

STAMP = "2026-12-02 14:00:00"
EPOCH = time.mktime((2026, 12, 2, 14, 0, 0, 0, 0, -1))


@pytest.mark.parametrize(
    ("prefix", "rank"),
    [
        ("", None),  # every parallel size is 1
        (" TP3", "TP3"),
        (" DP0", "DP0"),
        (" DP0 TP3", "DP0 TP3"),
        (" PP1 TP2", "PP1 TP2"),
        (" DP1 PP0 TP2 EP1", "DP1 PP0 TP2 EP1"),
        (" DP0 ATTN_CP1 MOE_DP0 TP1 EP3", "DP0 ATTN_CP1 MOE_DP0 TP1 EP3"),
    ],
)
@pytest.mark.parametrize("ms", [None, "123"])
def test_sglang_prefix_shapes(prefix: str, rank: str | None, ms: str | None) -> None:
    stamp = STAMP + (f".{ms}" if ms else "")
    parsed = parse_line(f"[{stamp}{prefix}] Load weight begin. avail mem=78.43 GB")
    assert parsed.time == stamp
    assert parsed.epoch == pytest.approx(EPOCH + (0.123 if ms else 0.0))
    assert parsed.rank == rank
    assert parsed.message == "Load weight begin. avail mem=78.43 GB"
    assert parsed.level is None  # SGLang's default format writes no level name
    assert parsed.batch is None


def test_non_rank_words_in_the_prefix_are_tolerated() -> None:
    parsed = parse_line(f"[{STAMP} encode_server] started")
    assert (parsed.time, parsed.rank, parsed.message) == (STAMP, None, "started")


def test_levels_written_in_the_message() -> None:
    assert parse_line(f"[{STAMP} TP1] WARNING: radix cache eviction contended").level == "WARNING"
    assert parse_line(f"[{STAMP}] WARN: something").level == "WARNING"
    assert parse_line(f'[{STAMP}] INFO:     127.0.0.1:1 - "GET / HTTP/1.1" 200 OK').level == "INFO"
    assert parse_line(f"[{STAMP}] ERROR failed").level == "ERROR"
    assert parse_line(f"[{STAMP}] CRITICAL: down").level == "CRITICAL"
    assert parse_line(f"[{STAMP}] DEBUG x").level == "DEBUG"
    # A word that merely starts like a level is not one.
    assert parse_line(f"[{STAMP}] INFOrmation").level is None
    assert parse_line(f"[{STAMP}] Errors: 0").level is None


def test_vllm_format_with_process_tags() -> None:
    parsed = parse_line("INFO 12-02 14:00:00 [core.py:123] Engine started")
    assert parsed.level == "INFO"
    assert parsed.time == "12-02 14:00:00"
    assert parsed.epoch is not None and time.localtime(parsed.epoch)[1:6] == (12, 2, 14, 0, 0)
    assert parsed.message == "Engine started"
    assert parsed.rank is None

    parsed = parse_line(
        "(VllmWorker rank=1 pid=4242) WARNING 12-02 14:00:01 [shm_broadcast.py:386] No available block"
    )
    assert (parsed.rank, parsed.level, parsed.message) == ("rank1", "WARNING", "No available block")

    parsed = parse_line("(Worker_DP0_TP1_EP1 pid=7) ERROR 12-02 14:00:02.250 [core.py:868] boom")
    assert parsed.rank == "DP0 TP1 EP1"
    assert parsed.time == "12-02 14:00:02.250"

    # vLLM releases before the bracketed file:line
    parsed = parse_line("WARNING 05-09 00:49:33 scheduler.py:1057 Sequence group 0 is preempted")
    assert parsed.level == "WARNING"
    assert parsed.message.endswith("Sequence group 0 is preempted")


def test_python_logging_format() -> None:
    parsed = parse_line(f"{STAMP},123 - sglang.srt.managers.scheduler - WARNING - pool is full")
    assert parsed.time == f"{STAMP},123"
    assert parsed.epoch == pytest.approx(EPOCH + 0.123)
    assert (parsed.level, parsed.message) == ("WARNING", "pool is full")
    parsed = parse_line(f"{STAMP} [ERROR] worker died")
    assert (parsed.time, parsed.level, parsed.message) == (STAMP, "ERROR", "[ERROR] worker died")
    assert parse_line(f"[{STAMP}] [Elastic EP] Scale completed").level is None


def test_ray_and_torch_rank_tags() -> None:
    parsed = parse_line(
        f"(SGLangEngine pid=23902) [{STAMP} TP1] Scheduler hit an exception: Traceback"
    )
    assert (parsed.time, parsed.rank) == (STAMP, "TP1")
    parsed = parse_line(
        "[rank2]: RuntimeError: CUDA error: an illegal memory access was encountered"
    )
    assert parsed.time is None
    assert parsed.rank == "rank2"
    assert parsed.message.startswith("RuntimeError")


def test_prefill_batch_current_wording() -> None:
    parsed = parse_line(
        f"[{STAMP} TP0] Prefill batch, #new-seq: 1, #new-token: 64, #cached-token: 0, token usage: 0.01, "
        "#running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 0.00"
    )
    assert parsed.batch == BatchStats(
        kind="prefill",
        token_usage=0.01,
        running_req=0,
        queue_req=0,
        cached_token=0,
        new_token=64,
        new_seq=1,
    )


def test_prefill_batch_older_wording() -> None:
    batch = parse_line(
        f"[{STAMP}] Prefill batch. #new-seq: 2, #new-token: 2048, #cached-token: 512, token usage: 0.42, "
        "#running-req: 7, #queue-req: 3"
    ).batch
    assert batch is not None
    assert (batch.kind, batch.new_seq, batch.new_token, batch.cached_token) == (
        "prefill",
        2,
        2048,
        512,
    )
    assert (batch.token_usage, batch.running_req, batch.queue_req) == (0.42, 7, 3)


def test_decode_batch() -> None:
    batch = parse_line(
        f"[{STAMP} TP0] Decode batch, #running-req: 3, #token: 640, token usage: 0.04, cuda graph: True, "
        "gen throughput (token/s): 1234.56, #queue-req: 0, "
    ).batch
    assert batch == BatchStats(
        kind="decode",
        token_usage=0.04,
        running_req=3,
        queue_req=0,
        num_token=640,
        gen_throughput=1234.56,
    )


def test_batch_fields_by_key_missing_or_reordered() -> None:
    batch = parse_batch("Decode batch, #queue-req: 5, token usage: 0.90")
    assert batch == BatchStats(kind="decode", token_usage=0.9, queue_req=5)
    assert parse_batch("Decode batch, #running-req: many, token usage: ?") == BatchStats(
        kind="decode"
    )
    assert parse_batch("Prefill batch") == BatchStats(kind="prefill")
    # Forward-iteration numbers and hybrid (SWA) pools
    batch = parse_batch(
        "Decode batch [812], #running-req: 9, #full token: 100, full token usage: 0.31, #swa token: 50, "
        "swa token usage: 0.20, cuda graph: True, gen throughput (token/s): 10.00, #queue-req: 1"
    )
    assert batch is not None and (batch.running_req, batch.token_usage, batch.queue_req) == (
        9,
        0.31,
        1,
    )
    assert parse_batch("Prefilled the batch") is None
    assert (
        parse_line(f"[{STAMP}] Decode out of memory. Try to lower your batch size.").batch is None
    )


def test_crlf_and_ansi_are_removed() -> None:
    parsed = parse_line(f"\x1b[32m[{STAMP} TP0]\x1b[0m \x1b[1;33mWARNING\x1b[0m: hot\r\n")
    assert (parsed.time, parsed.rank, parsed.level, parsed.message) == (
        STAMP,
        "TP0",
        "WARNING",
        "WARNING: hot",
    )
    assert strip_ansi("\x1b]0;title\x07plain \x1b[0Kend") == "plain end"
    assert strip_ansi("no escapes") == "no escapes"
    batch = parse_line(f"[{STAMP}] Decode batch, #running-req: 3, token usage: 0.5\r\n").batch
    assert batch is not None and batch.token_usage == 0.5


def test_continuation_lines() -> None:
    assert not is_continuation(
        f"[{STAMP} TP1] Scheduler hit an exception: Traceback (most recent call last):"
    )
    for line in [
        "Traceback (most recent call last):",
        '  File "/x/scheduler.py", line 10, in run',
        "    scheduler.run_event_loop()",
        "RadixCacheError: Failed to lock memory page during dynamic prefix eviction",
        "During handling of the above exception, another exception occurred:",
        "The above exception was the direct cause of the following exception:",
        "",
        "Try to allocate 64 tokens.",
        "[rank0]: RuntimeError: CUDA error",
        '(SGLangEngine pid=1)   File "x.py", line 1, in f',
    ]:
        assert is_continuation(line), line
        assert not opens_record(line)
    assert opens_record("INFO 12-02 14:00:00 [a.py:1] x")
    assert opens_record(f"{STAMP},5 - a - INFO - x")
    assert opens_record("(VllmWorker rank=0 pid=1) INFO 12-02 14:00:00 [a.py:1] x")


@pytest.mark.parametrize(
    "line",
    [
        "",
        "\x00\x01\x02",
        "[",
        "[]",
        "[2026-13-45 99:99:99 TP0] impossible date",
        "[9999-99-99 00:00:00] x",
        "\ud800 lone surrogate",
        "\ufffd\ufffd binary \x7f",
        "(",
        "(x pid=) y",
        "INFO 99-99 99:99:99 x",
        "Prefill batch, #new-seq: 1e400, token usage: nan, #token: inf",
        "[" * 10000,
    ],
)
def test_garbage_never_raises(line: str) -> None:
    parsed = parse_line(line)
    assert isinstance(parsed.message, str)
    assert isinstance(is_continuation(line), bool)


def test_impossible_dates_have_no_epoch_but_keep_the_text() -> None:
    parsed = parse_line("[2026-13-45 99:99:99 TP0] impossible date")
    assert parsed.epoch is None
    assert parsed.time == "2026-13-45 99:99:99"
    assert parsed.rank == "TP0"
    assert parsed.message == "impossible date"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_never_raises(text: str) -> None:
    parsed = parse_line(text)
    assert isinstance(parsed.message, str)
    is_continuation(text)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_decoded_binary_never_raises(data: bytes) -> None:
    text = data.decode("utf-8", "surrogateescape")
    parse_line(text)
    parse_line("[2026-12-02 14:00:00 TP0] " + text)
    parse_batch("Decode batch, " + text)


@pytest.mark.parametrize(
    ("line", "time", "rank", "message"),
    [
        ("[TP5 EP5] Scheduler hit an exception: x", None, "TP5 EP5", "Scheduler hit an exception: x"),
        ("[DP1 TP3] x", None, "DP1 TP3", "x"),
        ("[14:00:01 TP0] KV cache pool is full.", "14:00:01", "TP0", "KV cache pool is full."),
        ("[14:00:01.250 DP1 TP3] x", "14:00:01.250", "DP1 TP3", "x"),
        ("[rank2]:[E323 21:33:26.170490902 ProcessGroupNCCL.cpp:1896] [PG ID 2 PG GUID 3 Rank 2] boom",
         "03-23 21:33:26.170490", "rank2", "boom"),
        ("[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught",
         "12-18 20:27:21.426415", "rank0", "Watchdog caught"),
        ("[PG ID 0 PG GUID 0(default_pg) Rank 3] x", None, "rank3", "x"),
        ("(RayWorkerWrapper pid=123, ip=10.0.0.1) [2026-12-02 14:00:00 TP4] y", STAMP, "TP4", "y"),
        ("(pid=5) [TP2] z", None, "TP2", "z"),
        ("[default3]: RuntimeError: x", None, "rank3", "RuntimeError: x"),
        ("2026-12-02T14:00:00.123456789Z [2026-12-02 14:00:00 TP4] y", STAMP, "TP4", "y"),
        ("[pod/sglang-0/server] [2026-12-02 14:00:00 TP6] z", STAMP, "TP6", "z"),
        ("│ [2026-12-02 14:00:00 TP7] w                │", STAMP, "TP7", "w"),
        ("| [TP1] q |", None, "TP1", "q"),
    ],
)
def test_rank_forms_and_wrappers(line: str, time: str | None, rank: str, message: str) -> None:
    parsed = parse_line(line)
    assert (parsed.time, parsed.rank, parsed.message) == (time, rank, message)
    # A time or an SGLang rank prefix opens a record: a traceback after it belongs to this rank.
    # A rank tag alone (torchrun's, PyTorch's process group's) is written on every line instead.
    assert opens_record(line) == (time is not None or "[TP" in line or "[DP" in line)


def test_pytorch_glog_level_and_a_time_without_a_date() -> None:
    assert parse_line("[E1218 20:27:21.4 ProcessGroupNCCL.cpp:629] [Rank 0] x").level == "ERROR"
    assert parse_line("[W1218 20:27:21.4 ProcessGroupNCCL.cpp:629] x").level == "WARNING"
    assert parse_line("[14:00:01 TP0] x").epoch is None  # no date: no place on the time line
    # torchrun's tag alone still continues the record before it.
    assert not opens_record("[rank3]: RuntimeError: CUDA error")
    assert not opens_record("[default3]:   File \"x.py\", line 1, in f")


def test_level_number_and_ranks_in_the_file_bracket() -> None:
    # A logging config that writes the level, a number, then SGLang's rank prefix (its leading
    # space kept) in front of the file and line; every line ends with a carriage return.
    line = "ERROR 499 [ TP4 scheduler.py:2982] Scheduler hit an exception: Traceback (most recent call last):\r"
    parsed = parse_line(line)
    assert (parsed.time, parsed.epoch, parsed.rank, parsed.level, parsed.message) == (
        None,
        None,
        "TP4",
        "ERROR",
        "Scheduler hit an exception: Traceback (most recent call last):",
    )
    assert opens_record(line)  # the traceback after it is TP4's
    assert is_continuation('  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2982, in f\r')
    several = parse_line("WARNING 7 [ DP0 TP4 EP2 scheduler.py:1] slow\r")
    assert (several.rank, several.level, several.message) == ("DP0 TP4 EP2", "WARNING", "slow")
    single = parse_line("INFO 12 [ scheduler.py:88] ready\r")  # every parallel size 1: no rank
    assert (single.rank, single.level, single.message) == (None, "INFO", "ready")
    assert opens_record("INFO 12 [ scheduler.py:88] ready\r")
    batch = parse_line("INFO 499 [ TP4 scheduler.py:2100] Decode batch, #running-req: 3, token usage: 0.50\r")
    assert batch.rank == "TP4" and batch.batch is not None and batch.batch.token_usage == 0.5
    # vLLM's level-date prefix is still read as vLLM's.
    assert parse_line("ERROR 12-02 14:00:00 [a.py:1] x\r").time == "12-02 14:00:00"


def test_process_group_tag_inside_a_line_names_its_rank() -> None:
    thrown = "terminate called after throwing an instance of 'c10::DistBackendError'"
    what = (
        "  what():  [PG ID 2 PG GUID 3 Rank 1] Process group watchdog thread terminated with exception: "
        "CUDA error: an illegal memory access was encountered"
    )
    assert parse_line(thrown).rank is None
    parsed = parse_line(what)
    assert (parsed.rank, parsed.message) == ("rank1", what)  # the tag stays where it was written
    assert not opens_record(what)
    # At the start of a line the tag is a prefix: taken off the message, as before.
    start = parse_line("[PG ID 2 PG GUID 3 Rank 2] Process group watchdog thread terminated")
    assert (start.rank, start.message) == ("rank2", "Process group watchdog thread terminated")
    # A rankless record's message holding the tag.
    assert parse_line(f"[{STAMP}] [PG ID 0 PG GUID 0(default_pg) Rank 3] x").rank == "rank3"
    # A prefix that names a rank is kept over a tag further in.
    assert parse_line("[rank0]:   what():  [PG ID 2 PG GUID 3 Rank 1] x").rank == "rank0"
    assert parse_line(f"[{STAMP} TP3] [Rank 1] x").rank == "TP3"
    assert parse_line("Rank 1 of 8 is not a tag").rank is None


PG_LINE = (
    "[rank0]:[E1205 10:00:00.123456 123 ProcessGroupNCCL.cpp:1234] [PG ID 2 PG GUID 3 Rank 0] "
    "Process group watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered"
)


def test_rank_ahead_takes_pytorch_tags_within_the_record() -> None:
    # PyTorch's glog line with its process-group tag, with or without torchrun's tag in front.
    assert rank_ahead([PG_LINE]) == "rank0"
    assert rank_ahead([PG_LINE.removeprefix("[rank0]:")]) == "rank0"
    # torchrun's tag on the traceback that follows.
    assert rank_ahead(["[rank1]: Traceback (most recent call last):", "[rank1]:   File \"x.py\""]) == "rank1"
    # The tag inside a C++ exception's what().
    assert rank_ahead(["  what():  [PG ID 2 PG GUID 3 Rank 1] Process group watchdog thread terminated"]) == "rank1"
    # Past a CUDA error's hint lines and a blank line, with carriage returns.
    hints = [
        "CUDA kernel errors might be asynchronously reported at any other API call, so the stacktrace below "
        "might be incorrect.\r",
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\r",
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\r",
        "\r",
    ]
    assert rank_ahead([*hints, PG_LINE]) == "rank0"
    assert rank_ahead([""] * RANK_LOOKAHEAD + [PG_LINE]) is None  # too far
    # Another record before any tag: the look stops, whatever that record's rank.
    assert rank_ahead(["[2026-12-05 10:00:00 TP0] Scheduler hit an exception: Traceback", PG_LINE]) is None
    assert rank_ahead(["[2026-12-05 10:00:00] x", PG_LINE]) is None
    assert rank_ahead(["ERROR 499 [ TP4 scheduler.py:2982] x", PG_LINE]) is None
    assert rank_ahead(["[E1205 10:00:00.123456 123 ProcessGroupNCCL.cpp:1234] no tag", PG_LINE]) is None
    assert rank_ahead([]) is None
