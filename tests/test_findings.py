"""Findings: first occurrence, counts and context, traceback grouping, the initiating rank across
files (interleaving, clock skew), the INFO -> WARN -> ERROR fingerprint, batch stats at the failure,
the JSON schema, and the bundled sample incident."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixtop.diagnosis.catalog import Catalog, load_catalog
from radixtop.diagnosis.findings import FindingsBuilder
from radixtop.diagnosis.logline import BatchStats, is_continuation
from radixtop.diagnosis.matcher import Matcher

SAMPLE = Path(__file__).resolve().parents[1] / "radixtop" / "data" / "sample_incident.log"

READY = "The server is fired up and ready to roll!"
RETRACT = "KV cache pool is full. Retract requests. #retracted_reqs: 2, #new_token_ratio: 0.4000 -> 0.5000"
CONTENDED = "WARNING: radix cache eviction contended with a page lock on node 7 (token usage 0.93); retrying"
RADIX = "RadixCacheError: Failed to lock memory page during dynamic prefix eviction"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


@pytest.fixture(scope="module")
def matcher(catalog: Catalog) -> Matcher:
    return Matcher(catalog.signatures)


def rec(clock: str, message: str, rank: str | None = None) -> str:
    return f"[2026-12-02 {clock}{' ' + rank if rank else ''}] {message}"


def decode(clock: str, usage: float, rank: str = "TP0", running: int = 8) -> str:
    return rec(
        clock,
        f"Decode batch, #running-req: {running}, #token: {int(usage * 1000)}, token usage: {usage:.2f}, "
        "cuda graph: True, gen throughput (token/s): 1000.00, #queue-req: 0",
        rank,
    )


def traceback(clock: str, rank: str, error: str = RADIX) -> list[str]:
    return [
        rec(clock, "Scheduler hit an exception: Traceback (most recent call last):", rank),
        '  File "/x/sglang/srt/managers/scheduler.py", line 6366, in run_scheduler_process',
        "    scheduler.run_event_loop()",
        '  File "/x/sglang/srt/mem_cache/radix_cache.py", line 731, in evict',
        '    raise RadixCacheError("Failed to lock memory page during dynamic prefix eviction")',
        error,
        "",
    ]


def feed(builder: FindingsBuilder, name: str, lines: Iterable[str], start: int = 1) -> None:
    for n, line in enumerate(lines, start):
        builder.feed(name, n, line)


def filler(count: int, minute: int = 0) -> list[str]:
    return [
        rec(f"14:{minute:02d}:{i % 60:02d}.{i % 1000:03d}", f"filler line {i}", "TP0")
        for i in range(count)
    ]


def finding(report, sig_id: str):
    return next(f for f in report.findings if f.signature.id == sig_id)


# -- first occurrence, count, context ----------------------------------------------------------


def test_first_occurrence_count_and_context(catalog: Catalog, matcher: Matcher) -> None:
    builder = FindingsBuilder(catalog, matcher=matcher)
    lines = (
        filler(150)
        + [rec("14:05:00.000", RETRACT, "TP0")]
        + filler(30, 6)
        + [rec("14:07:00", RETRACT, "TP1")]
    )
    feed(builder, "a.log", lines)
    report = builder.report()
    assert report.lines == len(lines)
    f = finding(report, "kv-pool-retract")
    assert f.count == 2
    assert (f.first.file, f.first.line, f.first.time, f.first.rank) == (
        "a.log",
        151,
        "2026-12-02 14:05:00.000",
        "TP0",
    )
    assert f.first.text == lines[150]
    assert f.context_before == tuple(lines[50:150])  # exactly the 100 lines before it
    assert f.context_after == tuple(lines[151:171])  # 20 lines after it by default


def test_context_sizes_are_configurable(catalog: Catalog, matcher: Matcher) -> None:
    builder = FindingsBuilder(catalog, matcher=matcher, context=250, after=3)
    lines = filler(300) + [rec("14:05:00", RETRACT, "TP0")] + filler(2, 6)
    feed(builder, "a.log", lines)
    f = finding(builder.report(), "kv-pool-retract")
    assert f.context_before == tuple(lines[50:300])
    assert f.context_after == tuple(
        lines[301:303]
    )  # only 2 lines arrived so far: filled as lines arrive
    builder.feed("a.log", len(lines) + 1, "one more")
    builder.feed("a.log", len(lines) + 2, "and one too many")
    assert finding(builder.report(), "kv-pool-retract").context_after == (
        *lines[301:303],
        "one more",
    )

    none = FindingsBuilder(catalog, matcher=matcher, context=0, after=0)
    feed(none, "a.log", lines)
    f = finding(none.report(), "kv-pool-retract")
    assert (f.context_before, f.context_after) == ((), ())


def test_feed_returns_ids_and_strips_ansi_and_crlf(catalog: Catalog, matcher: Matcher) -> None:
    builder = FindingsBuilder(catalog, matcher=matcher)
    assert builder.feed("a.log", 1, rec("14:00:00", "hello") + "\r\n") == ()
    ids = builder.feed("a.log", 2, "\x1b[31m" + rec("14:00:01", RETRACT, "TP2") + "\x1b[0m\r\n")
    assert ids == ("kv-pool-retract",)
    f = finding(builder.report(), "kv-pool-retract")
    assert f.first.text == rec("14:00:01", RETRACT, "TP2")
    assert f.first.rank == "TP2"
    assert f.context_before == (rec("14:00:00", "hello"),)


def test_default_matcher_is_built_from_the_catalog(catalog: Catalog) -> None:
    builder = FindingsBuilder(catalog)
    assert builder.feed("a.log", 1, rec("14:00:00", READY)) == ("server-ready",)


# -- traceback grouping ------------------------------------------------------------------------


def test_traceback_hit_takes_time_and_rank_of_its_opening_line(
    catalog: Catalog, matcher: Matcher
) -> None:
    builder = FindingsBuilder(catalog, matcher=matcher)
    lines = filler(3) + traceback("14:03:12.118", "TP1") + [rec("14:03:13", "later", "TP0")]
    feed(builder, "a.log", lines)
    report = builder.report()
    radix = finding(report, "radix-page-lock-eviction")
    assert is_continuation(radix.first.text)
    assert radix.first.line == 3 + 6
    assert (radix.first.time, radix.first.rank) == ("2026-12-02 14:03:12.118", "TP1")
    wrapper = finding(report, "scheduler-exception")
    assert wrapper.first.line == 4
    assert wrapper.first.epoch == radix.first.epoch
    # The wrapper and the error its traceback ends with are one record: the fingerprint names the cause.
    assert report.fingerprint is not None
    assert report.fingerprint.error_signature == "radix-page-lock-eviction"
    assert report.fingerprint.error == radix.first
    # Findings are ordered by (epoch, file order, line): the wrapper line comes first.
    assert [f.signature.id for f in report.findings] == [
        "scheduler-exception",
        "radix-page-lock-eviction",
    ]


def test_torch_rank_tag_inside_a_record_keeps_the_record_time(
    catalog: Catalog, matcher: Matcher
) -> None:
    builder = FindingsBuilder(catalog, matcher=matcher)
    feed(
        builder,
        "a.log",
        [
            rec("14:00:00.500", "Scheduler hit an exception: Traceback (most recent call last):"),
            "[rank3]: RuntimeError: CUDA error: an illegal memory access was encountered",
        ],
    )
    f = finding(builder.report(), "cuda-illegal-memory-access")
    assert (f.first.time, f.first.rank) == ("2026-12-02 14:00:00.500", "rank3")


def scanned(catalog: Catalog, matcher: Matcher, name: str, lines: list[str]) -> FindingsBuilder:
    """add_hit as a scanner calls it: context before and after for a file's first hit of a signature."""
    builder = FindingsBuilder(catalog, matcher=matcher)
    first_seen: set[int] = set()
    for n, line in enumerate(lines, 1):
        for index in matcher.match(line):
            before: tuple[str, ...] = ()
            after: tuple[str, ...] = ()
            if index not in first_seen:
                first_seen.add(index)
                before, after = tuple(lines[max(0, n - 101) : n - 1]), tuple(lines[n : n + 20])
            builder.add_hit(name, n, line, index, before, {}, context_after=after)
    builder.add_lines(len(lines))
    return builder


def both_paths(catalog: Catalog, matcher: Matcher, lines: list[str]) -> list[FindingsBuilder]:
    live = FindingsBuilder(catalog, matcher=matcher)
    feed(live, "a.log", lines)
    return [live, scanned(catalog, matcher, "a.log", lines)]


CUDA_IMA = "CUDA error: an illegal memory access was encountered"
PG_LINE = (
    "[rank0]:[E1205 10:00:00.123456 123 ProcessGroupNCCL.cpp:1234] [PG ID 2 PG GUID 3 Rank 0] "
    "Process group watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered"
)


def test_rankless_line_takes_the_rank_of_the_pytorch_line_after_it(catalog: Catalog, matcher: Matcher) -> None:
    for builder in both_paths(catalog, matcher, [CUDA_IMA, PG_LINE]):
        report = builder.report()
        f = finding(report, "cuda-illegal-memory-access")
        assert (f.first.line, f.first.rank, f.first.text) == (1, "rank0", CUDA_IMA)
        assert report.initiating is not None
        assert (report.initiating[0], report.initiating[1].line, report.initiating[1].rank) == (
            "cuda-illegal-memory-access",
            1,
            "rank0",
        )
        assert list(report.first_by_rank) == ["rank0"]  # no rankless entry left behind
        assert report.first_by_rank["rank0"][1].line == 1
    # The parent's line, then the child's own record: TP0 is not the parent's rank.
    lines = [
        "SIGQUIT received. signum=None, frame=None. It usually means one child failed.",
        "[2026-12-05 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        "ValueError: boom",
    ]
    for builder in both_paths(catalog, matcher, lines):
        assert finding(builder.report(), "child-sigquit").first.rank is None
    # A line that names no rank and opens its record (a rankless process's own record) keeps none.
    lines = ["[2026-12-05 10:00:00] " + CUDA_IMA, PG_LINE]
    for builder in both_paths(catalog, matcher, lines):
        assert builder.report().first_by_rank[""][1].line == 1
    # Its record's rank, when it names one, is kept over any rank after it.
    lines = [
        "[2026-12-05 10:00:00 TP3] Scheduler hit an exception: Traceback (most recent call last):",
        CUDA_IMA,
        PG_LINE,
    ]
    for builder in both_paths(catalog, matcher, lines):
        assert finding(builder.report(), "cuda-illegal-memory-access").first.rank == "TP3"


def test_live_report_counts_a_waiting_line_as_it_stands(catalog: Catalog, matcher: Matcher) -> None:
    builder = FindingsBuilder(catalog, matcher=matcher)
    builder.feed("a.log", 1, CUDA_IMA)
    report = builder.report()  # the line after it has not arrived
    assert finding(report, "cuda-illegal-memory-access").first.rank is None
    assert list(report.first_by_rank) == [""]
    builder.feed("a.log", 2, "")
    builder.feed("a.log", 3, PG_LINE.removeprefix("[rank0]:"))  # the process-group tag alone
    report = builder.report()
    assert finding(report, "cuda-illegal-memory-access").first.rank == "rank0"
    assert list(report.first_by_rank) == ["rank0"]


def test_torchrun_traceback_after_a_rankless_line_names_its_rank(catalog: Catalog, matcher: Matcher) -> None:
    lines = [
        "CUDA error: device-side assert triggered",
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "/sgl/python/sglang/srt/managers/scheduler.py", line 2612, in run_scheduler_process',
        "[rank1]:     scheduler.event_loop_overlap()",
        "[rank1]: RuntimeError: CUDA error: device-side assert triggered",
    ]
    for builder in both_paths(catalog, matcher, lines):
        report = builder.report()
        assert report.initiating is not None
        sig_id, occ = report.initiating
        assert (occ.line, occ.rank) == (1, "rank1"), sig_id
        assert list(report.first_by_rank) == ["rank1"]


# -- initiating rank across files ---------------------------------------------------------------

TP0_LOG = [
    rec("14:00:01.000", READY),
    decode("14:00:04.000", 0.90),
    rec("14:00:05.300", RETRACT, "TP0"),
    decode("14:00:05.400", 0.95),
    *traceback("14:00:06.000", "TP0"),
]
TP1_LOG = [
    rec("14:00:04.500", "Init done", "TP1"),
    rec("14:00:05.100", CONTENDED, "TP1"),
    rec("14:00:05.900", RETRACT, "TP1"),
    *traceback("14:00:05.950", "TP1"),
]


def test_initiating_rank_is_earliest_in_time_not_in_feed_order(
    catalog: Catalog, matcher: Matcher
) -> None:
    builder = FindingsBuilder(catalog, matcher=matcher)
    feed(builder, "tp0.log", TP0_LOG)  # the whole of TP0 first (as a file-by-file scan does)
    feed(builder, "tp1.log", TP1_LOG)
    report = builder.report()
    assert report.initiating is not None
    sig_id, occ = report.initiating
    # The earliest cause (TP1's RadixCacheError, fed second), not the earlier notices before it.
    assert (sig_id, occ.file, occ.line, occ.rank) == (
        "radix-page-lock-eviction",
        "tp1.log",
        9,
        "TP1",
    )
    # Per-rank first warning-or-worse is what a reader needs to judge clock skew.
    assert list(report.first_by_rank) == ["TP1", "TP0"]
    assert report.first_by_rank["TP0"][0] == "kv-pool-retract"
    # kv-pool-retract: TP0 at 05.300 is earlier than TP1 at 05.900, and both are counted.
    retract = finding(report, "kv-pool-retract")
    assert (retract.first.file, retract.count) == ("tp0.log", 2)
    # The first error: TP1's traceback at 05.950, before TP0's at 06.000.
    assert report.fingerprint is not None and report.fingerprint.error.rank == "TP1"


def test_interleaved_feed_gives_the_same_answer(catalog: Catalog, matcher: Matcher) -> None:
    builder = FindingsBuilder(catalog, matcher=matcher)
    for i in range(max(len(TP0_LOG), len(TP1_LOG))):
        if i < len(TP1_LOG):
            builder.feed("tp1.log", i + 1, TP1_LOG[i])
        if i < len(TP0_LOG):
            builder.feed("tp0.log", i + 1, TP0_LOG[i])
    report = builder.report()
    assert report.initiating is not None
    assert (report.initiating[0], report.initiating[1].rank) == (
        "radix-page-lock-eviction",
        "TP1",
    )
    assert report.fingerprint is not None and report.fingerprint.complete


def test_earlier_occurrence_in_a_later_file_becomes_the_first(
    catalog: Catalog, matcher: Matcher
) -> None:
    builder = FindingsBuilder(catalog, matcher=matcher)
    late = filler(5) + [rec("14:10:00", RETRACT, "TP0")]
    early = filler(7) + [rec("14:09:00", RETRACT, "TP1")] + ["after"]
    feed(builder, "late.log", late)
    feed(builder, "early.log", early)
    f = finding(builder.report(), "kv-pool-retract")
    assert (f.first.file, f.first.line, f.first.rank, f.count) == ("early.log", 8, "TP1", 2)
    assert f.context_before == tuple(early[:7])  # the context of the file it happened in
    assert f.context_after == ("after",)


def test_clock_skew_rule_and_offsets(catalog: Catalog, matcher: Matcher) -> None:
    # TP1's host clock runs 0.5 s fast: as written, TP0 warns first.
    skewed = [rec("14:00:05.600", CONTENDED, "TP1")]
    tp0 = [rec("14:00:05.300", RETRACT, "TP0")]
    plain = FindingsBuilder(catalog, matcher=matcher)
    feed(plain, "tp1.log", skewed)
    feed(plain, "tp0.log", tp0)
    assert plain.report().initiating[1].rank == "TP0"  # type: ignore[index]
    # A known offset corrects it: times of tp1.log are shifted by -0.5 s before ordering.
    fixed = FindingsBuilder(catalog, matcher=matcher, clock_offsets={"tp1.log": -0.5})
    feed(fixed, "tp1.log", skewed)
    feed(fixed, "tp0.log", tp0)
    sig_id, occ = fixed.report().initiating  # type: ignore[misc]
    assert (sig_id, occ.rank, occ.time) == (
        "radix-eviction-lock-contention",
        "TP1",
        "2026-12-02 14:00:05.600",
    )


def test_ties_break_by_file_order_then_line(catalog: Catalog, matcher: Matcher) -> None:
    builder = FindingsBuilder(catalog, matcher=matcher)
    feed(builder, "first.log", ["x", rec("14:00:05", CONTENDED, "TP3")])
    feed(builder, "second.log", [rec("14:00:05", RETRACT, "TP2")])
    sig_id, occ = builder.report().initiating  # type: ignore[misc]
    assert (occ.file, occ.rank) == ("first.log", "TP3")


def test_lines_without_time_sort_first_within_the_rules(catalog: Catalog, matcher: Matcher) -> None:
    builder = FindingsBuilder(catalog, matcher=matcher)
    feed(builder, "a.log", [rec("14:00:00", "start"), rec("14:00:01", RETRACT)])
    feed(builder, "b.log", [CONTENDED])  # no timestamp anywhere in b.log
    sig_id, occ = builder.report().initiating  # type: ignore[misc]
    assert (sig_id, occ.file, occ.time) == ("radix-eviction-lock-contention", "b.log", None)


def test_the_child_that_names_its_rank_is_initiating_not_the_rankless_parent(
    catalog: Catalog, matcher: Matcher
) -> None:
    sigquit = "SIGQUIT received. signum=None, frame=None. It usually means one child failed."
    for parent in ("[2026-12-05 10:00:00] " + sigquit, sigquit):
        # Only consequences logged, the parent's SIGQUIT line written before the child's exception.
        lines = [
            parent,
            "[2026-12-05 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
            '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2612, in run_scheduler_process',
            "    scheduler.event_loop_overlap()",
            "ValueError: no signature knows this one",
        ]
        for builder in both_paths(catalog, matcher, lines):
            report = builder.report()
            assert report.initiating is not None
            sig_id, occ = report.initiating
            assert (sig_id, occ.rank, occ.line) == ("scheduler-exception", "TP0", 2)
            # The parent's line is still a finding, and the first warning-or-worse without a rank.
            assert finding(report, "child-sigquit").first.rank is None
            assert report.first_by_rank[""][0] == "child-sigquit"
    # With no consequence that names a rank, the rankless one is named.
    alone = FindingsBuilder(catalog, matcher=matcher)
    alone.feed("a.log", 1, "[2026-12-05 10:00:00] " + sigquit)
    sig_id, occ = alone.report().initiating  # type: ignore[misc]
    assert (sig_id, occ.rank) == ("child-sigquit", None)
    # Causes keep the earliest, rankless or not: which rank failed first is not known.
    causes = FindingsBuilder(catalog, matcher=matcher)
    feed(
        causes,
        "a.log",
        [
            "[2026-12-05 10:00:00] " + CUDA_IMA,
            "[2026-12-05 10:00:01 TP1] NCCL error in: /x/ProcessGroupNCCL.cpp:1, unhandled cuda error",
        ],
    )
    sig_id, occ = causes.report().initiating  # type: ignore[misc]
    assert (sig_id, occ.rank, occ.line) == ("cuda-illegal-memory-access", None, 1)


# -- fingerprint -------------------------------------------------------------------------------


def test_fingerprint_complete(catalog: Catalog, matcher: Matcher) -> None:
    builder = FindingsBuilder(catalog, matcher=matcher)
    feed(
        builder,
        "a.log",
        [rec("14:00:00", READY), rec("14:01:00", RETRACT, "TP1"), *traceback("14:02:00", "TP1")],
    )
    fp = builder.report().fingerprint
    assert fp is not None and fp.complete
    assert (fp.info_signature, fp.warn_signature, fp.error_signature) == (
        "server-ready",
        "kv-pool-retract",
        "radix-page-lock-eviction",
    )
    assert fp.info.line == 1 and fp.warn.line == 2 and fp.error.line == 8  # type: ignore[union-attr]


def test_fingerprint_incomplete_without_info_or_warning(catalog: Catalog, matcher: Matcher) -> None:
    no_info = FindingsBuilder(catalog, matcher=matcher)
    feed(no_info, "a.log", [rec("14:01:00", RETRACT), *traceback("14:02:00", "TP0")])
    fp = no_info.report().fingerprint
    assert fp is not None and not fp.complete
    assert fp.info is None and fp.warn is not None and fp.error is not None

    no_warn = FindingsBuilder(catalog, matcher=matcher)
    feed(no_warn, "a.log", [rec("14:00:00", READY), *traceback("14:02:00", "TP0")])
    fp = no_warn.report().fingerprint
    assert fp is not None and not fp.complete and fp.warn is None and fp.info is not None

    no_error = FindingsBuilder(catalog, matcher=matcher)
    feed(no_error, "a.log", [rec("14:00:00", READY), rec("14:01:00", RETRACT)])
    report = no_error.report()
    assert report.fingerprint is None
    assert report.batch_at_failure == {}
    assert report.initiating is not None and report.initiating[0] == "kv-pool-retract"


def test_fingerprint_uses_last_info_and_first_warning_after_it(
    catalog: Catalog, matcher: Matcher
) -> None:
    builder = FindingsBuilder(catalog, matcher=matcher)
    feed(
        builder,
        "a.log",
        [
            rec(
                "14:00:00",
                "Using FP8 KV cache but no scaling factors provided. Defaulting to scaling factors of 1.0.",
            ),
            rec("14:00:10", READY),  # first start
            rec("14:30:00", READY),  # a restart: the last info before the error counts
            rec("14:31:00", RETRACT, "TP0"),
            *traceback("14:32:00", "TP0"),
            rec("14:40:00", READY),  # after the error: not part of its fingerprint
        ],
    )
    fp = builder.report().fingerprint
    assert fp is not None and fp.complete
    assert (fp.info.line, fp.warn.line) == (3, 4)  # type: ignore[union-attr]

    # Only a warning from before the info: reported, but the order is wrong, so incomplete.
    early = FindingsBuilder(catalog, matcher=matcher)
    feed(
        early,
        "a.log",
        [rec("14:00:00", RETRACT), rec("14:00:10", READY), *traceback("14:01:00", "TP0")],
    )
    fp = early.report().fingerprint
    assert fp is not None and not fp.complete and fp.warn.line == 1  # type: ignore[union-attr]


# -- batch stats at the failure ----------------------------------------------------------------


def test_batch_at_failure_per_rank(catalog: Catalog, matcher: Matcher) -> None:
    builder = FindingsBuilder(catalog, matcher=matcher)
    feed(
        builder,
        "dp.log",
        [
            decode("14:00:01", 0.50, "DP0 TP0"),
            decode("14:00:01", 0.40, "DP1 TP0"),
            decode("14:00:02", 0.91, "DP0 TP0", running=31),
            rec(
                "14:00:02",
                "Prefill batch, #new-seq: 2, #new-token: 1024, #cached-token: 64, token usage: 0.88, "
                "#running-req: 12, #queue-req: 4,",
                "DP1 TP0",
            ),
            *traceback("14:00:03", "DP0 TP0"),
            decode("14:00:04", 0.99, "DP1 TP0"),  # after the failure: ignored
        ],
    )
    batch = builder.report().batch_at_failure
    assert set(batch) == {"DP0 TP0", "DP1 TP0"}
    assert batch["DP0 TP0"] == BatchStats(
        kind="decode",
        token_usage=0.91,
        running_req=31,
        queue_req=0,
        num_token=910,
        gen_throughput=1000.0,
    )
    assert batch["DP1 TP0"] == BatchStats(
        kind="prefill",
        token_usage=0.88,
        running_req=12,
        queue_req=4,
        cached_token=64,
        new_token=1024,
        new_seq=2,
    )


def test_batch_at_failure_across_files_uses_time(catalog: Catalog, matcher: Matcher) -> None:
    builder = FindingsBuilder(catalog, matcher=matcher)
    feed(
        builder, "b.log", [decode("14:00:01", 0.30, ""), decode("14:00:09", 0.99, "")]
    )  # no rank (TP=1)
    feed(builder, "a.log", [decode("14:00:02", 0.50, "TP0"), *traceback("14:00:05", "TP0")])
    batch = builder.report().batch_at_failure
    assert batch[""].token_usage == 0.30  # b.log's 14:00:09 line came after the failure
    assert batch["TP0"].token_usage == 0.50


# -- JSON -------------------------------------------------------------------------------------


def test_to_json_schema(catalog: Catalog, matcher: Matcher) -> None:
    builder = FindingsBuilder(catalog, matcher=matcher)
    feed(
        builder,
        "a.log",
        [
            rec("14:00:00", READY),
            decode("14:00:01", 0.9),
            rec("14:00:02", RETRACT, "TP1"),
            *traceback("14:00:03", "TP1"),
        ],
    )
    data = builder.report().to_json()
    json.loads(json.dumps(data))  # plain JSON types only
    assert set(data) == {
        "lines",
        "findings",
        "initiating",
        "fingerprint",
        "batch_at_failure",
        "first_by_rank",
        "notes",
    }
    assert data["lines"] == 10
    for f in data["findings"]:
        assert set(f) == {
            "signature",
            "severity",
            "count",
            "first",
            "context_before",
            "title",
            "subsystem",
            "role",
            "context_after",
        }
        assert set(f["first"]) == {"file", "line", "time", "epoch", "rank", "text"}
        assert isinstance(f["count"], int) and isinstance(f["first"]["line"], int)
        assert all(isinstance(x, str) for x in f["context_before"])
    assert data["initiating"] == {
        "signature": "radix-page-lock-eviction",
        "rank": "TP1",
        "file": "a.log",
        "line": 9,
    }
    roles = {f["signature"]: f["role"] for f in data["findings"]}
    assert roles["kv-pool-retract"] == "notice" and roles["scheduler-exception"] == "consequence"
    assert data["fingerprint"]["complete"] is True
    assert set(data["fingerprint"]) == {"complete", "info", "warn", "error"}
    assert set(data["fingerprint"]["error"]) == {
        "signature",
        "file",
        "line",
        "time",
        "epoch",
        "rank",
        "text",
    }
    assert data["batch_at_failure"]["TP0"]["token_usage"] == 0.9
    assert data["findings"][0]["first"]["rank"] is None  # server-ready: main process, no rank

    empty = FindingsBuilder(catalog, matcher=matcher)
    empty.feed("a.log", 1, "nothing here")
    assert empty.report().to_json()["initiating"] is None
    assert empty.report().to_json()["findings"] == []


# -- the bundled sample ------------------------------------------------------------------------


def sample_lines() -> list[str]:
    return SAMPLE.read_text("utf-8").splitlines()


def check_sample_report(report, name: str) -> None:
    lines = sample_lines()
    cause = lines.index(next(x for x in lines if x.startswith("RadixCacheError"))) + 1
    assert report.initiating is not None
    sig_id, occ = report.initiating
    # The cause, not the retraction notices and the contention warning before it.
    assert (sig_id, occ.rank, occ.file, occ.line) == ("radix-page-lock-eviction", "TP1", name, cause)
    fp = report.fingerprint
    assert fp is not None and fp.complete
    assert (fp.info_signature, fp.warn_signature, fp.error_signature) == (
        "server-ready",
        "kv-pool-retract",
        "radix-page-lock-eviction",
    )
    assert fp.error.rank == "TP1"  # type: ignore[union-attr]
    radix = finding(report, "radix-page-lock-eviction")
    assert radix.count == 2
    assert radix.first.rank == "TP1"
    assert radix.first.text == RADIX
    opener = next(x for x in lines if "TP1] Scheduler hit an exception" in x)
    assert radix.first.time == opener[1:24]
    assert len(radix.context_before) == 100
    assert radix.context_before == tuple(lines[radix.first.line - 101 : radix.first.line - 1])
    assert finding(report, "child-sigquit").first.rank is None
    assert report.batch_at_failure["TP0"].kind == "decode"
    assert report.batch_at_failure["TP0"].token_usage == 0.97
    assert set(report.batch_at_failure) == {"TP0"}  # only the first TP rank logs batch stats
    assert list(report.first_by_rank)[:2] == ["TP1", "TP0"]


def test_sample_incident_live_path(catalog: Catalog, matcher: Matcher) -> None:
    builder = FindingsBuilder(catalog, matcher=matcher)
    lines = sample_lines()
    assert 350 <= len(lines) <= 450
    feed(builder, "sample_incident.log", lines)
    report = builder.report()
    assert report.lines == len(lines)
    check_sample_report(report, "sample_incident.log")
    assert [f.signature.id for f in report.findings] == [
        "server-ready",
        "kv-pool-retract",
        "radix-eviction-lock-contention",
        "scheduler-exception",
        "radix-page-lock-eviction",
        "child-sigquit",
    ]


def test_sample_incident_fast_scan_path(catalog: Catalog, matcher: Matcher) -> None:
    """add_hit/add_lines as a scanner calls them: context for a file's first hit of a signature,
    batch stats for its first failure; the result matches the live path."""
    from radixtop.diagnosis.logline import parse_line

    builder = FindingsBuilder(catalog, matcher=matcher)
    lines = sample_lines()
    first_seen: set[int] = set()
    failure_seen = False
    batch: dict[str, BatchStats] = {}
    for n, line in enumerate(lines, 1):
        indices = matcher.match(line)
        for index in indices:
            context = tuple(lines[max(0, n - 101) : n - 1]) if index not in first_seen else ()
            first_seen.add(index)
            before: dict[str, BatchStats] = {}
            if catalog.signatures[index].level >= 2 and not failure_seen:
                failure_seen = True
                before = dict(batch)
            builder.add_hit("sample_incident.log", n, line, index, context, before)
        parsed = parse_line(line)
        if parsed.batch is not None:
            batch[parsed.rank or ""] = parsed.batch
    builder.add_lines(len(lines))
    report = builder.report()
    assert report.lines == len(lines)
    check_sample_report(report, "sample_incident.log")


def test_add_hit_with_explicit_opener(catalog: Catalog, matcher: Matcher) -> None:
    builder = FindingsBuilder(catalog, matcher=matcher)
    opener = rec(
        "14:03:12.118", "Scheduler hit an exception: Traceback (most recent call last):", "TP1"
    )
    index = catalog.index("radix-page-lock-eviction")
    builder.add_hit("a.log", 40, RADIX, index, (), {}, opener=opener, context_after=("", "next"))
    f = finding(builder.report(), "radix-page-lock-eviction")
    assert (f.first.time, f.first.rank, f.first.line) == ("2026-12-02 14:03:12.118", "TP1", 40)
    assert f.context_after == ("", "next")


# -- robustness ---------------------------------------------------------------------------------


FUZZ_CATALOG = load_catalog()
FUZZ_MATCHER = Matcher(FUZZ_CATALOG.signatures)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(max_size=80), max_size=40))
def test_feed_never_raises(lines: list[str]) -> None:
    builder = FindingsBuilder(FUZZ_CATALOG, matcher=FUZZ_MATCHER, context=5, after=2)
    for n, line in enumerate(lines, 1):
        builder.feed("fuzz.log", n, line)
    data = builder.report().to_json()
    assert data["lines"] == len(lines)


def test_memory_stays_bounded_on_a_long_log(catalog: Catalog, matcher: Matcher) -> None:
    builder = FindingsBuilder(catalog, matcher=matcher, context=10, after=3)
    for n in range(1, 5001):
        builder.feed("big.log", n, decode(f"14:{(n // 60) % 60:02d}:{n % 60:02d}", 0.5))
        if n % 1000 == 0:
            builder.feed("big.log", n, rec("14:00:00", RETRACT))
    report = builder.report()
    f = finding(report, "kv-pool-retract")
    assert f.count == 5
    assert len(f.context_before) == 10 and len(f.context_after) == 3
    assert report.lines == 5005


def test_idle_files_beyond_the_active_limit_drop_their_context(
    catalog: Catalog, matcher: Matcher
) -> None:
    # A followed log that rotates many times becomes many files: only recently fed ones keep a ring.
    builder = FindingsBuilder(catalog, matcher=matcher, context=5)
    feed(builder, "gen-0.log", ["old 1", "old 2"])
    for g in range(1, 70):
        builder.feed(f"gen-{g}.log", 1, "x")
    builder.feed("gen-0.log", 3, rec("14:00:00", RETRACT))
    assert finding(builder.report(), "kv-pool-retract").context_before == ()
    builder.feed("gen-69.log", 2, rec("14:00:01", CONTENDED))  # a recent one kept its ring
    assert finding(builder.report(), "radix-eviction-lock-contention").context_before == ("x",)
