"""LogFollower on real files: appended, renamed, recreated, truncated, deleted, while it follows."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixtop.probes.follow import LogFollower
from radixtop.probes.logbatch import LogBatch, LogNotice, LogRecord, SourceHealth
from radixtop.probes.tailer import Tailer as _Tailer
from radixtop.probes.tailer import _Generation

TIMEOUT = 5.0


class Collector:
    """Consumes follower.batches() in a task; until() waits (bounded) for a condition on what came."""

    def __init__(self, follower: LogFollower) -> None:
        self.follower = follower
        self.records: list[LogRecord] = []
        self.notices: list[LogNotice] = []
        self.batches: list[LogBatch] = []
        self.task = asyncio.create_task(self._consume())

    async def _consume(self) -> None:
        async for batch in self.follower.batches():
            self.batches.append(batch)
            self.records.extend(batch.records)
            self.notices.extend(batch.notices)

    def texts(self, source: str | Path | None = None) -> list[str]:
        return [r.text for r in self.records if source is None or r.source == str(source)]

    def kinds(self) -> list[str]:
        return [n.kind for n in self.notices]

    async def until(self, condition, what: str, timeout: float = TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.task.done():
                self.task.result()  # surface an exception from batches()
                raise AssertionError(f"batches() ended while waiting for {what}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out waiting for {what}; got {len(self.records)} records "
                    f"(last: {self.texts()[-3:]!r}) and notices {self.kinds()}"
                )
            await asyncio.sleep(0.005)

    async def lines(self, n: int, source: str | Path | None = None) -> list[str]:
        await self.until(lambda: len(self.texts(source)) >= n, f"{n} lines")
        return self.texts(source)

    async def close(self) -> None:
        self.follower.stop()
        async with asyncio.timeout(TIMEOUT):
            await self.task


@pytest.fixture
async def follow():
    collectors: list[Collector] = []

    def start(patterns, **kwargs) -> Collector:
        collector = Collector(LogFollower([str(p) for p in patterns], **kwargs))
        collectors.append(collector)
        return collector

    yield start
    for collector in collectors:
        await collector.close()


@pytest.fixture(params=["inotify", "poll"])
async def follow_each(request, monkeypatch):
    """`follow` once sleeping on inotify when idle (with the fallback poll pushed out of reach, so
    only inotify can wake the reader) and once polling (where inotify cannot be had)."""
    import radixtop.probes.follow as logs_module

    if request.param == "inotify":
        from radixtop.probes.fswait import FileWaiter

        probe = FileWaiter.create()
        if probe is None:
            pytest.skip("inotify is not available here")
        probe.close()
        monkeypatch.setattr(logs_module, "_INOTIFY_FALLBACK_S", 60.0)
    collectors: list[Collector] = []

    def start(patterns, **kwargs) -> Collector:
        kwargs.setdefault("idle_wait", "auto" if request.param == "inotify" else "poll")
        collector = Collector(LogFollower([str(p) for p in patterns], **kwargs))
        collectors.append(collector)
        return collector

    yield start
    for collector in collectors:
        await collector.close()


def append(path: Path, data: str | bytes) -> None:
    with open(path, "ab") as f:
        f.write(data.encode() if isinstance(data, str) else data)


# -- starting point -----------------------------------------------------------------------------------


async def test_from_end_skips_existing_lines_and_keeps_true_line_numbers(tmp_path, follow):
    log = tmp_path / "server.log"
    log.write_text("".join(f"old {i}\n" for i in range(5)) + "half-writ")
    c = follow([log])
    append(log, "ten\nnew 1\n")
    assert await c.lines(2) == ["half-written", "new 1"]  # the unfinished line is delivered whole
    assert [r.lineno for r in c.records] == [6, 7]
    assert {r.generation for r in c.records} == {0}
    assert c.notices == []


async def test_from_start_reads_existing_then_appended(tmp_path, follow):
    log = tmp_path / "server.log"
    log.write_text("a\nb\n")
    c = follow([log], from_start=True)
    assert await c.lines(2) == ["a", "b"]
    append(log, "c\n")
    assert await c.lines(3) == ["a", "b", "c"]
    assert [r.lineno for r in c.records] == [1, 2, 3]
    assert all(r.source == str(log) for r in c.records)


async def test_backlog_starts_n_whole_lines_before_the_end_with_true_line_numbers(tmp_path, follow):
    log = tmp_path / "server.log"
    log.write_text("".join(f"old {i}\n" for i in range(1, 1001)) + "half-writ")
    c = follow([log], backlog_lines=3)
    assert await c.lines(3) == ["old 998", "old 999", "old 1000"]  # the unfinished line is not one
    append(log, "ten\nnew 1\n")
    assert await c.lines(5) == ["old 998", "old 999", "old 1000", "half-written", "new 1"]
    assert [r.lineno for r in c.records] == [998, 999, 1000, 1001, 1002]


async def test_a_backlog_longer_than_the_file_reads_it_all(tmp_path, follow):
    log = tmp_path / "server.log"
    log.write_text("a\nb\n")
    c = follow([log], backlog_lines=10, history=True)
    assert await c.lines(2) == ["a", "b"]
    assert [r.lineno for r in c.records] == [1, 2]
    assert all(not b.skipped for b in c.batches)  # nothing before the first line to report


async def test_the_tail_is_delivered_before_the_lines_above_are_counted(tmp_path, monkeypatch):
    from radixtop.probes import backlog as logs

    gate = threading.Event()
    counting = logs._count_lines

    def slow_count(fd, end, stopping):
        assert gate.wait(TIMEOUT)  # a huge file: the count takes a while
        return counting(fd, end, stopping)

    monkeypatch.setattr(logs, "_count_lines", slow_count)
    log = tmp_path / "server.log"
    log.write_text("".join(f"line {i}\n" for i in range(1, 101)))
    async with LogFollower([str(log)], backlog_lines=2, history=True) as f:
        assert f.wait_caught_up(TIMEOUT)
        batch = f.take()  # no event loop needed for this
        (run,) = batch.records.runs
        assert run.texts == ["line 99", "line 100"]
        assert not run.numbered and run.lineno_or_none is None  # shown now, numbered later
        (part,) = batch.skipped
        assert (part.source, part.generation, part.end) == (
            str(log), 0, log.stat().st_size - len("line 99\nline 100\n")
        )
        assert not part.wait(0.05)
        gate.set()
        assert part.wait(TIMEOUT) and part.lines == 98
        assert run.numbered and run.first_lineno == 99
        assert [(r.lineno, r.text) for r in batch.records] == [(99, "line 99"), (100, "line 100")]
        # The part keeps its own descriptor on the same inode, whatever happens to the path.
        os.rename(log, tmp_path / "server.log.1")
        assert os.pread(part.fd, 7, 0) == b"line 1\n"
        part.close()
        part.close()
        append(tmp_path / "server.log.1", "line 101\n")  # the renamed file is still read out
        while (more := f.take()) is None or not len(more.records):
            await asyncio.sleep(0.01)
        assert [(r.lineno, r.text) for r in more.records] == [(101, "line 101")]


@contextlib.asynccontextmanager
async def fifty_lines_from_the_45th(tmp_path):
    """A 50-line log followed from its last 5 lines, the count held back until start_counting():
    (the follower, its first batch, the part before)."""
    log = tmp_path / "server.log"
    log.write_text("".join(f"line {i}\n" for i in range(1, 51)))
    async with LogFollower([str(log)], backlog_lines=5, history=True, count_delay=60) as f:
        assert f.wait_caught_up(TIMEOUT)
        batch = f.take()
        (part,) = batch.skipped
        yield f, batch, part


async def test_the_count_can_wait_until_the_caller_starts_it(tmp_path):
    async with fifty_lines_from_the_45th(tmp_path) as (f, batch, part):
        assert not part.wait(0.2)  # held back: the caller is still drawing its first screen
        f.start_counting()
        assert part.wait(TIMEOUT) and part.lines == 45
        assert [r.lineno for r in batch.records] == [46, 47, 48, 49, 50]
        part.close()


def _ingestor():
    from radixtop.diagnosis.catalog import load_catalog
    from radixtop.diagnosis.findings import FindingsBuilder
    from radixtop.diagnosis.matcher import Matcher
    from radixtop.session.ingest import Ingestor

    catalog = load_catalog(())
    return Ingestor(FindingsBuilder(catalog, matcher=Matcher(catalog.signatures), context=5), catalog), catalog


def _counters_done(timeout: float = TIMEOUT) -> bool:
    deadline = time.monotonic() + timeout
    while any(t.name == "radixtop-line-count" for t in threading.enumerate()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


async def test_a_history_scan_that_claims_the_count_reads_the_lines_once(tmp_path, monkeypatch):
    """The scan of the part before where following began counts its lines on the way: the counter
    thread leaves them, and the live lines get their numbers from the scan."""
    from radixtop.probes import backlog
    from radixtop.session.history import start_history_scan

    counted_by_counter: list[int] = []
    count_lines = backlog._count_lines
    monkeypatch.setattr(backlog, "_count_lines",
                        lambda fd, end, stopping: counted_by_counter.append(end) or count_lines(fd, end, stopping))
    ingestor, catalog = _ingestor()
    results = []
    async with fifty_lines_from_the_45th(tmp_path) as (f, batch, part):
        scan = start_history_scan([part], ingestor, catalog.signatures, context=5, after=2,
                                  stopping=threading.Event(), deliver=results.append)
        f.start_counting()  # after the claim, as the app does: the counter finds it taken
        assert part.wait(TIMEOUT) and part.lines == 45
        assert [r.lineno for r in batch.records] == [46, 47, 48, 49, 50]
        scan.join(TIMEOUT)
        assert [r.report.lines for r in results] == [45]
        assert _counters_done()
        assert counted_by_counter == [], "the counter read the lines the scan had counted"


async def test_a_count_the_counter_began_first_is_the_scans_too(tmp_path):
    from radixtop.session.history import scan_skipped

    ingestor, catalog = _ingestor()
    async with fifty_lines_from_the_45th(tmp_path) as (f, _, part):
        f.start_counting()
        assert part.wait(TIMEOUT)
        assert not part.claim()  # the counter has it
        result = scan_skipped(part, ingestor, catalog.signatures, context=5, after=2, stopping=threading.Event())
        assert part.fd is None and result.report.lines == 45


async def test_a_claimed_count_left_unfinished_is_counted_when_the_part_is_closed(tmp_path):
    async with fifty_lines_from_the_45th(tmp_path) as (_, batch, part):
        assert part.claim()
        part.close()  # a scan that never ran: the live lines' numbers must not wait forever
        assert part.wait(TIMEOUT) and part.lines == 45
        assert [r.lineno for r in batch.records] == [46, 47, 48, 49, 50]


def test_log_lines_index_and_slice_across_runs():
    from radixtop.probes.logbatch import LogLines, LogRun

    lines = LogLines([LogRun("a.log", 0, 5, ["a5", "a6"], 1.0), LogRun("b.log", 2, 1, ["b1", "b2", "b3"], 2.0)])
    assert len(lines) == 5
    assert lines[0] == LogRecord("a.log", 5, "a5", 0, 1.0) and lines[-1] == LogRecord("b.log", 3, "b3", 2, 2.0)
    assert [(r.source, r.lineno) for r in lines[1:4]] == [("a.log", 6), ("b.log", 1), ("b.log", 2)]
    assert [r.text for r in lines] == ["a5", "a6", "b1", "b2", "b3"]
    with pytest.raises(IndexError):
        lines[5]


@pytest.mark.parametrize(
    ("content", "lines", "expected"),
    [
        (b"a\nb\nc\n", 2, b"b\nc\n"),
        (b"a\nb\nc\npartial", 2, b"b\nc\npartial"),  # an unfinished last line is not counted
        (b"a\nb\n", 5, b"a\nb\n"),  # fewer lines than asked: from the start
        (b"a\nb\nc\n", 0, b""),  # plain tail -f: at the end
        (b"a\nb\npartial", 0, b"partial"),  # ... or at the start of a line being written
        (b"no newline at all", 3, b"no newline at all"),
    ],
)
def test_start_of_backlog(tmp_path, content, lines, expected):
    from radixtop.probes.backlog import start_of_backlog as _start_of_backlog

    path = tmp_path / "x.log"
    path.write_bytes(content)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert content[_start_of_backlog(fd, len(content), lines, 1000) :] == expected
    finally:
        os.close(fd)


def test_backlog_start_over_many_read_blocks(tmp_path):
    from radixtop.probes.backlog import start_of_backlog as _start_of_backlog

    path = tmp_path / "x.log"
    path.write_bytes(b"".join(b"%06d %s\n" % (i, b"y" * 200) for i in range(20_000)))  # ~4 MB
    fd = os.open(path, os.O_RDONLY)
    try:
        start = _start_of_backlog(fd, path.stat().st_size, 12_345, 1000)
        assert os.pread(fd, 6, start) == b"%06d" % (20_000 - 12_345)
    finally:
        os.close(fd)


# -- rotation and truncation ----------------------------------------------------------------------------


async def test_rotation_drains_the_renamed_file_then_follows_the_new_one(tmp_path, follow_each):
    log = tmp_path / "server.log"
    log.write_text("")
    c = follow_each([log])
    old = open(log, "a")  # a writer that keeps its fd across the rename, as real ones do briefly
    old.write("one\ntwo\n")
    old.flush()
    await c.lines(2)
    os.rename(log, tmp_path / "server.log.1")
    old.write("three\n")  # written to the renamed file after the rename
    old.flush()
    append(log, "new one\nnew two\n")
    old.write("four (late)\n")  # a writer that reopens late: the old fd is still being read
    old.close()
    texts = await c.lines(6)
    gen0 = [(r.lineno, r.text) for r in c.records if r.generation == 0]
    gen1 = [(r.lineno, r.text) for r in c.records if r.generation == 1]
    assert gen0 == [(1, "one"), (2, "two"), (3, "three"), (4, "four (late)")]
    assert gen1 == [(1, "new one"), (2, "new two")]
    assert texts.index("three") < texts.index("new one")  # the backlog of the old file comes first
    assert "rotated" in c.kinds()
    # Once the old file has been quiet for the grace period it is closed (no fd leak per rotation).
    await c.until(lambda: str(tmp_path / "server.log.1") not in open_files(), "the old fd to close")
    assert str(log) in open_files()
    assert len(c.records) == 6  # nothing duplicated


def open_files() -> set[str]:
    fds = "/proc/self/fd"
    out = set()
    for fd in os.listdir(fds):
        try:
            out.add(os.readlink(os.path.join(fds, fd)))
        except OSError:
            pass
    return out


def test_a_rotated_backlog_is_read_out_before_the_new_file(tmp_path):
    # Deterministic: the synchronous core polled by hand. 6 MiB left in the old file is more than
    # one poll reads from a file, so the new file must wait for the next polls.
    log = tmp_path / "server.log"
    log.write_text("")
    tailer = _Tailer([str(log)], from_start=False, max_line=4096)
    tailer.start()
    append(log, "".join(f"old {i:05d} {'x' * 1000}\n" for i in range(6000)))
    os.rename(log, tmp_path / "server.log.1")
    log.write_text("new 1\n")
    texts = []
    for _ in range(10):
        tailer.poll(time.monotonic())
        texts += [r.text[:9] for r in tailer.take()[0]]
    tailer.close()
    assert texts == [f"old {i:05d}" for i in range(6000)] + ["new 1"]


async def test_rotating_file_handler_in_another_process_loses_and_duplicates_nothing(tmp_path, follow):
    log = tmp_path / "server.log"
    log.write_text("")
    # The glob also matches the rotated names (server.log.1, ...): those are files already being
    # read under their old name and must not be read a second time.
    c = follow([str(tmp_path / "server.log*")])
    await asyncio.sleep(0.05)
    writer = textwrap.dedent(
        f"""
        import logging, logging.handlers, time
        h = logging.handlers.RotatingFileHandler({str(log)!r}, maxBytes=40_000, backupCount=50)
        h.setFormatter(logging.Formatter("%(message)s"))
        lg = logging.getLogger("w"); lg.addHandler(h); lg.setLevel(logging.INFO)
        for i in range(20_000):
            lg.info("line %06d %s", i, "x" * 20)
            if i % 400 == 0:
                time.sleep(0.01)  # ~13 KB between pauses, ~3 pauses per 40 KB file
        """
    )
    subprocess.run([sys.executable, "-c", writer], check=True, timeout=30)
    await c.until(lambda: len(c.records) >= 20_000, "20000 lines")
    await asyncio.sleep(0.2)
    numbers = [int(t.split()[1]) for t in c.texts()]
    assert sorted(numbers) == list(range(20_000))  # none lost, none twice
    assert len(list(tmp_path.glob("server.log.*"))) >= 10  # it really rotated, many times
    assert max(r.generation for r in c.records if r.source == str(log)) >= 5
    # On a loaded machine two rotations can fall within one poll; the file in between is then read
    # through the glob under its rotated name, from its start. Either way each file reads whole.
    for key in {(r.source, r.generation) for r in c.records}:
        lines = [r for r in c.records if (r.source, r.generation) == key]
        assert [r.lineno for r in lines] == list(range(1, len(lines) + 1))


def test_glob_does_not_reread_rotated_files_under_their_new_names(tmp_path):
    # Deterministic: the synchronous core, with `now` moved forward by hand past the grace period.
    log = tmp_path / "server.log"
    log.write_text("")
    tailer = _Tailer([str(tmp_path / "server.log*")], from_start=False, max_line=1000)
    tailer.start()
    now = time.monotonic()
    texts = []

    def poll(seconds_later: float) -> None:
        tailer.poll(now + seconds_later)
        texts.extend(r.text for r in tailer.take()[0])

    append(log, "a\n")
    poll(0.01)
    os.rename(log, tmp_path / "server.log.1")
    log.write_text("b\n")
    poll(0.02)  # rotation seen; the old file is drained, then kept open for the grace period
    poll(0.03)
    poll(5)  # grace over: the old file is closed; the glob now sees server.log.1
    os.rename(tmp_path / "server.log.1", tmp_path / "server.log.2")  # the next rotation shifts it
    poll(10)
    assert texts == ["a", "b"]
    # Same inode but different first bytes: not the file we read, so it is read as new.
    with open(tmp_path / "server.log.2", "r+b") as f:
        f.write(b"z")
    poll(15)
    tailer.close()
    assert texts == ["a", "b", "z"]


async def test_copytruncate_restarts_from_zero_with_a_notice(tmp_path, follow_each):
    log = tmp_path / "server.log"
    log.write_text("")
    c = follow_each([log])
    append(log, "before 1\nbefore 2\n")
    await c.lines(2)
    shutil.copy(log, tmp_path / "server.log.1")
    with open(log, "r+") as f:
        f.truncate(0)
    await c.until(lambda: "truncated" in c.kinds(), "a truncated notice")
    append(log, "after 1\n")
    await c.lines(3)
    last = c.records[-1]
    assert (last.text, last.lineno, last.generation) == ("after 1", 1, 1)


def test_truncate_and_refill_past_the_old_offset_between_two_polls(tmp_path):
    # Deterministic: the synchronous core polled by hand, nothing in between the two polls.
    log = tmp_path / "server.log"
    log.write_text("first 1\nfirst 2\n")
    tailer = _Tailer([str(log)], from_start=True, max_line=1000)
    tailer.start()
    tailer.poll(time.monotonic())
    assert [r.text for r in tailer.take()[0]] == ["first 1", "first 2"]
    with open(log, "w") as f:  # truncate, then write more than was there before
        f.write("second 1 is longer\nsecond 2 is longer\n")
    tailer.poll(time.monotonic())
    records, notices = tailer.take()
    tailer.close()
    assert [n.kind for n in notices] == ["truncated"]
    assert [(r.text, r.lineno, r.generation) for r in records] == [
        ("second 1 is longer", 1, 1),
        ("second 2 is longer", 2, 1),
    ]


# -- files that come and go ------------------------------------------------------------------------------


async def test_file_that_appears_later_is_read_from_its_start(tmp_path, follow_each):
    log = tmp_path / "late.log"
    c = follow_each([log])
    await c.until(lambda: "waiting" in c.kinds(), "a waiting notice")
    assert c.follower.health()[0].state == "waiting"
    log.write_text("hello\nworld\n")
    assert await c.lines(2) == ["hello", "world"]
    assert [r.generation for r in c.records] == [0, 0]
    assert "created" in c.kinds()
    health = c.follower.health()[0]
    assert (health.state, health.lines) == ("ok", 2)
    assert health.last_line_at is not None


async def test_deleted_file_is_reported_and_followed_again_when_recreated(tmp_path, follow_each):
    log = tmp_path / "server.log"
    log.write_text("")
    c = follow_each([log])
    append(log, "one\n")
    await c.lines(1)
    log.unlink()
    await c.until(lambda: "deleted" in c.kinds(), "a deleted notice")
    assert c.follower.health()[0].state == "deleted"
    log.write_text("reborn\n")
    await c.lines(2)
    assert (c.records[-1].text, c.records[-1].generation, c.records[-1].lineno) == ("reborn", 1, 1)
    assert c.kinds()[-1] == "created"
    assert c.follower.health()[0].state == "ok"


async def test_glob_picks_up_files_that_appear_later_and_interleaves_ranks(tmp_path, follow_each):
    (tmp_path / "rank0.log").write_text("")
    (tmp_path / "rank1.log").write_text("")
    c = follow_each([tmp_path / "rank*.log"])
    for i in range(50):
        append(tmp_path / f"rank{i % 2}.log", f"r{i % 2} {i}\n")
    (tmp_path / "rank2.log").write_text("r2 was here before we saw it\n")
    await c.until(lambda: len(c.records) >= 51, "51 lines")
    assert c.texts(tmp_path / "rank0.log") == [f"r0 {i}" for i in range(0, 50, 2)]
    assert c.texts(tmp_path / "rank1.log") == [f"r1 {i}" for i in range(1, 50, 2)]
    assert c.texts(tmp_path / "rank2.log") == ["r2 was here before we saw it"]
    assert {h.source for h in c.follower.health()} == {str(tmp_path / f"rank{i}.log") for i in range(3)}


async def test_glob_matching_nothing_yet_waits(tmp_path, follow):
    c = follow([tmp_path / "*.log"])
    await c.until(lambda: "waiting" in c.kinds(), "a waiting notice")
    assert [(h.source, h.state) for h in c.follower.health()] == [(str(tmp_path / "*.log"), "waiting")]
    (tmp_path / "a.log").write_text("found\n")
    assert await c.lines(1) == ["found"]


# -- line contents ------------------------------------------------------------------------------------


async def test_partial_line_is_held_until_its_newline_and_dropped_at_stop(tmp_path, follow):
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("")
    b.write_text("")
    c = follow([a, b])
    append(a, "abc")
    append(b, "tick 1\n")
    await c.lines(1, b)
    append(b, "tick 2\n")  # read in a later poll than the partial line was: it had its chance
    await c.lines(2, b)
    assert c.texts(a) == []
    append(a, "def\nghi")
    assert await c.lines(1, a) == ["abcdef"]
    await c.close()
    assert c.texts(a) == ["abcdef"]  # "ghi" may be half-written: not emitted at stop


async def test_bad_bytes_crlf_and_ansi(tmp_path, follow):
    log = tmp_path / "server.log"
    log.write_text("")
    c = follow([log])
    append(log, b"bad \xff\xfe utf8 \xe2\x82\n")
    append(log, b"windows\r\n")
    append(log, b"\x1b[1;31mERROR\x1b[0m red \x1b]0;title\x07tail \x1b(Bplain\n")
    append(log, os.urandom(100_000))
    append(log, b"\nstill alive\n")
    await c.until(lambda: "still alive" in c.texts(), "the line after the garbage")
    texts = c.texts()
    assert texts[0] == "bad \ufffd\ufffd utf8 \ufffd"
    assert texts[1] == "windows"
    assert texts[2] == "ERROR red tail plain"
    assert texts[-1] == "still alive"
    assert all("\n" not in t for t in texts)


async def test_ten_mib_line_is_capped_with_a_marker_without_buffering_it(tmp_path, follow):
    log = tmp_path / "server.log"
    log.write_text("")
    c = follow([log], max_line=1000)
    tracemalloc.start()
    try:
        with open(log, "ab") as f:
            for _ in range(10):
                f.write(b"\xc3\xa9" * (512 * 1024))  # 1 MiB of "é" per write: 10 MiB, one line
                f.flush()
            f.write(b"\nnext\n")
        await c.lines(2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    long, nxt = c.texts()
    assert long == "é" * 1000 + f" …[line truncated: {10 * 1024 * 1024} bytes]"
    assert nxt == "next"
    assert peak < 8 * 1024 * 1024  # never held the 10 MiB line
    assert "capped" in c.kinds()


async def test_long_lines_inside_one_read_are_capped_too(tmp_path, follow):
    log = tmp_path / "server.log"
    log.write_text("")
    c = follow([log], max_line=10)
    append(log, "short\n" + "y" * 25 + "\r\n" + "é" * 11 + "\nok\n")
    assert await c.lines(4) == [
        "short",
        "yyyyyyyyyy …[line truncated: 26 bytes]",
        "éééééééééé …[line truncated: 22 bytes]",
        "ok",
    ]
    # The reader measures each run's longest line as it splits (the pane's width): after the cut.
    runs = [run for batch in c.batches for run in batch.records.runs]
    assert all(run._widest == max(map(len, run.texts)) for run in runs)
    assert max(run.widest for run in runs) == len("yyyyyyyyyy …[line truncated: 26 bytes]")


# -- errors -----------------------------------------------------------------------------------------


async def test_directory_and_symlink_loop_are_error_notices_not_exceptions(tmp_path, follow):
    good = tmp_path / "good.log"
    good.write_text("")
    loop_a, loop_b = tmp_path / "loop_a", tmp_path / "loop_b"
    loop_a.symlink_to(loop_b)
    loop_b.symlink_to(loop_a)
    c = follow([tmp_path, loop_a, good])
    append(good, "fine\n")
    assert await c.lines(1) == ["fine"]
    errors = {n.source: n.message for n in c.notices if n.kind == "error"}
    assert "is a directory" in errors[str(tmp_path)]
    assert "symbolic links" in errors[str(loop_a)]
    states = {h.source: h.state for h in c.follower.health()}
    assert states == {str(tmp_path): "error", str(loop_a): "error", str(good): "ok"}


def _permission_probe(path: str) -> tuple[list[str], list[str]]:
    async def main():
        async with LogFollower([path]) as f:
            async for batch in f.batches():
                return [n.kind for n in batch.notices], [h.state for h in f.health()]

    return asyncio.run(main())


def test_unreadable_file_is_an_error_notice(tmp_path):
    log = tmp_path / "secret.log"
    log.write_text("x\n")
    log.chmod(0)
    if os.geteuid() != 0:
        kinds, states = _permission_probe(str(log))
    else:  # root reads anything: check it from a forked child that drops to nobody
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                os.close(read_end)
                os.setgid(65534)
                os.setuid(65534)
                os.write(write_end, repr(_permission_probe(str(log))).encode())
                status = 0
            finally:
                os._exit(status)
        os.close(write_end)
        with os.fdopen(read_end) as pipe:
            out = pipe.read()
        _, status = os.waitpid(pid, 0)
        assert status == 0, out
        kinds, states = eval(out)  # a repr of two lists of short strings we wrote ourselves
    assert kinds == ["error"]
    assert states == ["error"]


# -- plumbing ---------------------------------------------------------------------------------------


async def test_slow_consumer_gets_bounded_coalesced_batches_in_order(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("".join(f"{i}\n" for i in range(1000)))
    seen: list[int] = []
    async with LogFollower([str(log)], from_start=True, max_batch=100) as f:
        async for batch in f.batches():
            assert len(batch.records) <= 100
            seen += [int(r.text) for r in batch.records]
            await asyncio.sleep(0.01)  # slow consumer
            if len(seen) >= 1000:
                break
    assert seen == list(range(1000))


async def test_records_are_genuine_frozen_log_records(tmp_path, follow):
    log = tmp_path / "server.log"
    log.write_text("")
    c = follow([log])
    append(log, "x\n")
    await c.lines(1)
    record = c.records[0]
    assert type(record) is LogRecord
    assert record == LogRecord(str(log), 1, "x", 0, record.received)
    assert 0 < time.monotonic() - record.received < TIMEOUT
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.text = "changed"  # type: ignore[misc]
    assert isinstance(c.follower.health()[0], SourceHealth)


@pytest.mark.parametrize("enabled", [True, False])
async def test_the_garbage_collector_is_left_as_it_was_found(tmp_path, enabled):
    # The reader pauses the cyclic GC while it builds a chunk's records; it must restore the
    # state, and never turn on a GC that the application turned off.
    log = tmp_path / "server.log"
    log.write_text("".join(f"{i}\n" for i in range(5000)))
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        async with LogFollower([str(log)], from_start=True) as f:
            got = 0
            async for batch in f.batches():
                got += len(batch.records)
                if got >= 5000:
                    break
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


async def test_stop_is_idempotent_and_ends_batches(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("")
    follower = LogFollower([str(log)])
    got = []

    async def consume():
        async for batch in follower.batches():
            got.append(batch)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    follower.stop()
    follower.stop()
    async with asyncio.timeout(TIMEOUT):
        await task
    assert task.done() and got == []
    assert follower._thread is not None and not follower._thread.is_alive()


async def test_stop_before_iterating_still_ends(tmp_path):
    follower = LogFollower([str(tmp_path / "missing.log")])
    follower.stop()
    batches = [b async for b in follower.batches()]
    assert [n.kind for b in batches for n in b.notices] == ["waiting"]


def test_bad_arguments_are_clear_errors():
    with pytest.raises(TypeError, match="sequence of paths"):
        LogFollower("server.log")
    with pytest.raises(ValueError, match="poll_interval"):
        LogFollower(["x"], poll_interval=0)


# -- sleeping on inotify while the files are quiet ---------------------------------------------------


def _waiter():
    from radixtop.probes.fswait import FileWaiter

    waiter = FileWaiter.create()
    if waiter is None:
        pytest.skip("inotify is not available here")
    return waiter


def test_file_waiter_wakes_for_its_names_only(tmp_path):
    waiter = _waiter()
    try:
        waiter.watch({str(tmp_path): {"server.log", "rank*.log"}})
        append(tmp_path / "sim.out", "a neighbour's write\n")
        assert waiter.wait(0.2) is False, "a write to another file in the directory woke it"
        append(tmp_path / "server.log", "ours\n")
        assert waiter.wait(30) is True
        (tmp_path / "rank3.log").write_text("")
        assert waiter.wait(30) is True, "a file matching the glob pattern appeared"
        os.rename(tmp_path / "server.log", tmp_path / "server.log.1")
        assert waiter.wait(30) is True, "the name moved away (rotation)"
        waiter.wake()
        assert waiter.wait(30) is True, "wake() (stop) returns at once"
    finally:
        waiter.close()
    waiter.wake()  # after close: no write to a file descriptor that may belong to someone else now


def test_file_waiter_missing_directory_and_removed_directory(tmp_path):
    waiter = _waiter()
    try:
        later = tmp_path / "later"
        waiter.watch({str(later): {"x.log"}})
        assert waiter.missing == {str(later)}, "a directory that is not there yet is left to the fallback poll"
        later.mkdir()
        waiter.watch({str(later): {"x.log"}})
        assert waiter.missing == set()
        later.rmdir()
        assert waiter.wait(30) is True, "the watched directory went away"
    finally:
        waiter.close()


async def test_an_idle_follower_sleeps_on_inotify_and_wakes_for_a_line(tmp_path, follow, monkeypatch):
    import radixtop.probes.follow as logs_module

    _waiter().close()
    monkeypatch.setattr(logs_module, "_INOTIFY_FALLBACK_S", 60.0)  # only inotify can wake it
    log = tmp_path / "server.log"
    log.write_text("")
    (tmp_path / "other.out").write_text("")
    c = follow([log])
    await c.until(lambda: c.follower.wait_mode == "inotify", "the reader to sleep on inotify")
    polls = c.follower.polls
    for i in range(20):  # a neighbour writing does not make the reader poll
        append(tmp_path / "other.out", f"noise {i}\n")
    await asyncio.sleep(0.3)
    assert c.follower.polls - polls <= 1, "the reader polled while its file was quiet"
    append(log, "after a quiet spell\n")
    assert await c.lines(1) == ["after a quiet spell"]


async def test_idle_wait_poll_keeps_polling(tmp_path, follow):
    log = tmp_path / "server.log"
    log.write_text("")
    c = follow([log], idle_wait="poll")
    append(log, "one\n")
    await c.lines(1)
    assert c.follower.wait_mode == "poll"
    with pytest.raises(ValueError, match="idle_wait"):
        LogFollower([str(log)], idle_wait="sometimes")


def test_the_reader_does_not_poll_while_the_caller_reads_the_files_itself(tmp_path):
    """A flood's frames read the files themselves (read_now) more often than the reader polls:
    its polls then wait, and every line still comes once, in order; once the caller stops
    reading, the reader polls again."""
    log = tmp_path / "server.log"
    log.write_text("")
    follower = LogFollower([str(log)], poll_interval=0.05, idle_wait="poll")
    follower.start()
    texts: list[str] = []

    def take_all() -> None:
        for _ in range(100):
            batch = follower.take()
            if batch is None:
                return
            texts.extend(r.text for r in batch.records)

    try:
        assert follower.wait_caught_up(5)
        time.sleep(0.2)
        polls = follower.polls
        with open(log, "a") as f:
            for i in range(40):  # 0.4 s, the caller reading every 10 ms
                f.write(f"line {i}\n")
                f.flush()
                follower.read_now()
                take_all()
                time.sleep(0.01)
        assert follower.polls - polls <= 2, "the reader polled while the caller read"
        assert texts == [f"line {i}" for i in range(40)]
        polls = follower.polls
        with open(log, "a") as f:
            f.write("after\n")
        deadline = time.monotonic() + 5
        while "after" not in texts and time.monotonic() < deadline:
            time.sleep(0.02)
            take_all()
        assert texts[-1] == "after" and follower.polls > polls
    finally:
        follower.stop()


def test_read_now_reads_in_the_callers_thread_what_the_reader_would_read_next(tmp_path):
    """A frame about to be drawn asks for the lines written up to it (read_now), not those of the
    reader's last poll: with the reader polling once in 30 s, only read_now can have read them.
    A file whose reads have been slow is left to the reader thread."""
    log = tmp_path / "server.log"
    log.write_text("before\n")
    follower = LogFollower([str(log)], poll_interval=30.0, idle_wait="poll")
    follower.start()
    try:
        assert follower.wait_caught_up(5)
        time.sleep(0.2)  # the reader's first pass is done; its next is 30 s away
        while follower.take() is not None:
            pass
        with open(log, "a") as f:
            f.write("one\ntwo\n")
        assert follower.take() is None  # nothing read yet: the reader sleeps
        follower.read_now()
        batch = follower.take()
        assert batch is not None and [r.text for r in batch.records] == ["one", "two"]
        follower._poll_s = 1.0  # as after a slow read (a network filesystem): not on the UI's thread
        with open(log, "a") as f:
            f.write("three\n")
        follower.read_now()
        assert follower.take() is None
    finally:
        follower.stop()


_PIECES = [b"decode batch", b" ", b"\n", b"\r\n", b"\x1b[31m", b"\xff", "é".encode(), b"\xe2\x82", b"x" * 30]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_PIECES), max_size=12).map(b"".join), min_size=1, max_size=6))
def test_the_bytes_a_read_keeps_are_its_lines_as_utf8_or_none(reads):
    """The reader keeps a read's bytes for the matcher (LogRun.raw) only where they are its lines
    exactly: joined by newlines they are the bytes, UTF-8. Escapes, CRs, bad bytes, cut lines and
    a line begun in an earlier read make it None."""
    gen = _Generation(0, os.stat(__file__), 0, 0)
    for data in reads:
        split = gen.split(data, 40)
        if split.raw is not None:
            assert split.raw == "\n".join(split.texts).encode("utf-8")
            assert split.texts


def test_a_plain_read_keeps_its_bytes():
    gen = _Generation(0, os.stat(__file__), 0, 0)
    assert gen.split(b"one\ntwo\nthree", 40).raw == b"one\ntwo"
    assert gen.split(b" more\nfour\n", 40).raw is None, "its first line began in the read before"
    assert gen.split(b"five\nsix\n", 40).raw == b"five\nsix"
