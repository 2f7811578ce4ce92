"""The incident state behind the log pane: ring bound, findings wiring, pause, filter, search."""

from __future__ import annotations

import random

import pytest

from radixtop.diagnosis.catalog import load_catalog
from radixtop.diagnosis.findings import FindingsBuilder
from radixtop.diagnosis.matcher import Matcher
from radixtop.probes.logbatch import LogBatch, LogNotice, LogRecord, SourceHealth
from radixtop.session.incident_state import IncidentState, short_labels
from radixtop.session.ingest import AFTER_WAIT, Ingestor, IngestResult

SEED = "[2026-12-02 14:03:14.942 TP1] RadixCacheError: Failed to lock memory page during dynamic prefix eviction"
SIGQUIT = "[2026-12-02 14:03:14.964] Received sigquit from a child process. It usually means the child failed."
RETRACT = "[2026-12-02 14:03:13.007 TP1] KV cache pool is full. Retract requests. #retracted_reqs: 2"
DECODE = (
    "[2026-12-02 14:{s:02d}:00.000 TP0] Decode batch, #running-req: 61, #token: 395851, token usage: 0.96, "
    "cuda graph: True, gen throughput (token/s): 1644.05, #queue-req: {i}"
)


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.fixture(scope="module")
def matcher(catalog):
    return Matcher(catalog.signatures)  # compiled once: hyperscan compiles take a while


def batch(texts, source="server.log", start=1, generation=0, notices=()):
    records = tuple(LogRecord(source, start + i, t, generation, 0.0) for i, t in enumerate(texts))
    return LogBatch(records, tuple(notices))


def plain(texts):
    records = [LogRecord("server.log", i + 1, t, 0, 0.0) for i, t in enumerate(texts)]
    return IngestResult(records, lines=len(texts), max_len=max(map(len, texts)))


def ingest(state, ingestor, b, *, wait=False):
    """Process a batch; unless wait, report first occurrences now instead of after AFTER_WAIT."""
    state.apply(ingestor.process(b))
    if not wait:
        flushed = ingestor.flush(0)
        if flushed is not None:
            state.apply(flushed)


def texts_in_view(state):
    return [state.entry(state.view_seq(r)).text for r in range(state.view_len)]


def test_ring_keeps_only_the_newest_capacity_entries():
    state = IncidentState(capacity=5)
    state.apply(plain([f"line {i}" for i in range(1, 13)]))
    assert len(state) == 5
    assert state.total_lines == 12
    assert (state.first_seq, state.next_seq) == (7, 12)
    assert state.entry(6) is None
    assert texts_in_view(state) == [f"line {i}" for i in range(8, 13)]
    assert state.row_of(7) == 0 and state.row_of(6) is None


def test_one_batch_larger_than_the_ring_keeps_its_tail():
    state = IncidentState(capacity=3)
    state.apply(plain([f"l{i}" for i in range(10)]))
    assert texts_in_view(state) == ["l7", "l8", "l9"]
    assert state.total_lines == 10


def test_matched_lines_carry_severity_and_span_and_feed_the_findings(catalog, matcher):
    state = IncidentState(capacity=100)
    ingestor = Ingestor(FindingsBuilder(catalog, matcher=matcher, context=10), catalog)
    ingest(state, ingestor, batch(["[2026-12-02 14:03:14.000 TP1] ordinary", SEED, SIGQUIT, RETRACT]))
    entries = [state.entry(s) for s in range(state.first_seq, state.next_seq)]
    assert [e.severity for e in entries] == [None, "error", "critical", "warning"]
    seed = entries[1]
    assert seed.sig_ids == ("radix-page-lock-eviction",)
    start, end = seed.span
    assert seed.text[start:end].startswith("RadixCacheError")
    ids = [f.signature.id for f in state.report.findings]
    assert {"radix-page-lock-eviction", "child-sigquit", "kv-pool-retract"} <= set(ids)
    assert state.hit_count == 3


def test_dropping_lines_from_the_ring_keeps_a_findings_context(catalog, matcher):
    state = IncidentState(capacity=4)
    ingestor = Ingestor(FindingsBuilder(catalog, matcher=matcher, context=5), catalog)
    before = [DECODE.format(s=s, i=s) for s in range(5)]
    ingest(state, ingestor, batch(before + [SEED]))
    ingest(state, ingestor, batch([DECODE.format(s=30 + i, i=i) for i in range(20)], start=7))
    assert state.entry(5) is None  # the seed line has left the ring ...
    finding = next(f for f in state.report.findings if f.signature.id == "radix-page-lock-eviction")
    assert finding.context_before == tuple(before)  # ... its evidence has not
    assert finding.first.line == 6 and finding.first.rank == "TP1"


def test_pause_buffers_lines_and_resume_shows_them_in_order(catalog, matcher):
    state = IncidentState(capacity=100)
    ingestor = Ingestor(FindingsBuilder(catalog, matcher=matcher), catalog)
    state.apply(plain(["a", "b"]))
    state.set_paused(True)
    ingest(state, ingestor, batch(["c", SEED, "e"], start=3))
    assert texts_in_view(state) == ["a", "b"]  # the view is frozen
    assert state.pending_count == 3
    assert state.total_lines == 5
    assert state.report.findings[0].signature.id == "radix-page-lock-eviction"  # findings are not paused
    assert state.set_paused(False) == 0
    assert texts_in_view(state) == ["a", "b", "c", SEED, "e"]
    assert state.pending_count == 0


def test_pause_buffer_longer_than_the_ring_reports_what_left_the_view():
    state = IncidentState(capacity=3)
    state.set_paused(True)
    state.apply(plain([f"l{i}" for i in range(5)]))
    assert state.pending_count == 3
    assert state.set_paused(False) == 2
    assert texts_in_view(state) == ["l2", "l3", "l4"]


def test_filter_index_follows_appends_and_evictions():
    state = IncidentState(capacity=6)
    state.apply(plain(["alpha 1", "beta", "Alpha 2", "gamma"]))
    state.set_filter("alpha")  # smart case: lower-case query ignores case
    assert texts_in_view(state) == ["alpha 1", "Alpha 2"]
    state.set_filter("Alpha")  # an upper-case letter makes it exact
    assert texts_in_view(state) == ["Alpha 2"]
    state.set_filter("alpha")
    state.apply(plain(["x", "alpha 3", "y", "z"]))  # the ring drops "alpha 1" and "beta"
    assert texts_in_view(state) == ["Alpha 2", "alpha 3"]
    assert state.view_seq(0) == 2 and state.row_of(5) == 1 and state.row_of(3) is None
    state.set_filter(None)
    assert state.view_len == 6


def test_search_finds_next_and_previous_with_wraparound():
    state = IncidentState(capacity=10)
    state.apply(plain(["a", "needle 1", "b", "needle 2", "c"]))
    state.set_search("needle")
    assert state.find_search(-1, forward=True) == 1
    assert state.find_search(1, forward=True) == 3
    assert state.find_search(3, forward=True) == 1  # wraps
    assert state.find_search(5, forward=False) == 3
    assert state.find_search(1, forward=False) == 3  # wraps backwards
    state.set_search("absent")
    assert state.find_search(0) is None


def test_next_hit_walks_signature_lines(catalog, matcher):
    state = IncidentState(capacity=50)
    ingestor = Ingestor(FindingsBuilder(catalog, matcher=matcher), catalog)
    ingest(state, ingestor, batch(["x", SEED, "y", SIGQUIT, "z"]))
    assert state.find_hit(-1, True) == 1
    assert state.find_hit(1, True) == 3
    assert state.find_hit(3, True) == 1
    assert state.find_hit(state.view_len, False) == 3
    state.set_filter("Received")  # in a filtered view the rows differ from the sequence numbers
    assert state.find_hit(-1, True) == 0


def test_probe_notices_become_marked_lines_and_colour_the_health():
    state = IncidentState(capacity=10)
    state.set_health([SourceHealth("/var/log/a/server.log", "ok", "following generation 1", 3, None)])
    notice = LogNotice(
        "/var/log/a/server.log", "rotated", "/var/log/a/server.log was rotated; following the new file", 0.0
    )
    state.apply(IngestResult([], notices=(notice,), errors=("diagnosis failed on x:1: boom",)))
    kinds = [(e.kind, e.text) for e in (state.entry(s) for s in range(state.first_seq, state.next_seq))]
    assert kinds[0] == ("notice", "[rotated] /var/log/a/server.log was rotated; following the new file")
    assert kinds[1][0] == "notice" and "boom" in kinds[1][1]
    (view,) = state.sources()
    assert (view.label, view.state) == ("server.log", "rotated")
    assert "rotated" in view.detail


def test_lines_the_follower_could_not_read_colour_the_health_as_lost():
    state = IncidentState(capacity=10)
    state.set_health([SourceHealth("/var/log/a/server.log", "ok", "following generation 1", 3, None)])
    lost = LogNotice("/var/log/a/server.log", "lost", "2 rotated files (1,234 bytes) were never read", 0.0)
    state.apply(IngestResult([], notices=(lost,)))
    (view,) = state.sources()
    assert view.state == "lost" and "never read" in view.detail


def test_a_rotation_keeps_colouring_the_health_when_the_new_file_is_reported_created_after_it():
    state = IncidentState(capacity=10)
    state.set_health([SourceHealth("/var/log/a/server.log", "ok", "following generation 1", 3, None)])
    rotated = LogNotice("/var/log/a/server.log", "rotated", "/var/log/a/server.log moved away", 0.0)
    created = LogNotice("/var/log/a/server.log", "created", "/var/log/a/server.log appeared; following it", 0.0)
    state.apply(IngestResult([], notices=(rotated,)))
    state.apply(IngestResult([], notices=(created,)))
    (view,) = state.sources()
    assert view.state == "rotated" and "moved away" in view.detail
    truncated = LogNotice("/var/log/a/server.log", "truncated", "/var/log/a/server.log was truncated", 0.0)
    state.apply(IngestResult([], notices=(truncated,)))  # a later health notice still replaces it
    assert state.sources()[0].state == "truncated"


def test_a_hit_the_builder_fails_on_is_shown_with_a_notice(catalog, matcher):
    class Exploding(FindingsBuilder):
        def add_hit(self, file, lineno, text, *args, **kwargs):
            if "boom" in text:
                raise RuntimeError("boom")
            return super().add_hit(file, lineno, text, *args, **kwargs)

    state = IncidentState(capacity=10)
    ingestor = Ingestor(Exploding(catalog, matcher=matcher), catalog)
    ingest(state, ingestor, batch(["ok", SEED + " boom", SIGQUIT]))
    entries = [state.entry(s) for s in range(state.first_seq, state.next_seq)]
    assert [e.text for e in entries if e.kind == "line"] == ["ok", SEED + " boom", SIGQUIT]
    assert entries[1].severity == "error"  # still marked in the pane
    (notice,) = [e for e in entries if e.kind == "notice"]
    assert "diagnosis failed on server.log:2" in notice.text and "boom" in notice.text
    ingest(state, ingestor, batch([SIGQUIT], start=4))  # and the pane goes on
    assert [f.signature.id for f in state.report.findings] == ["child-sigquit"]


def test_a_first_occurrence_waits_for_the_lines_after_it(catalog, matcher):
    now = [0.0]
    state = IncidentState(capacity=100)
    ingestor = Ingestor(FindingsBuilder(catalog, matcher=matcher, context=3, after=4), catalog, clock=lambda: now[0])
    assert not ingestor.has_waiting()  # the app's timer then starts no flush
    ingest(state, ingestor, batch(["a", "b", SEED, "c"]), wait=True)
    assert state.report is None and ingestor.waiting == 1  # the line is marked, the finding waits
    assert ingestor.has_waiting()
    assert state.entry(2).severity == "error"
    ingest(state, ingestor, batch(["d", "e", "f", "g"], start=5), wait=True)
    (finding,) = state.report.findings
    assert finding.context_before == ("a", "b") and finding.context_after == ("c", "d", "e", "f")
    # A writer that stops right after its failure line: reported after AFTER_WAIT with what came.
    ingest(state, ingestor, batch([SIGQUIT, "h"], start=9), wait=True)
    assert len(state.report.findings) == 1
    assert ingestor.flush() is None
    now[0] += AFTER_WAIT
    flushed = ingestor.flush()
    sig = next(f for f in flushed.report.findings if f.signature.id == "child-sigquit")
    assert sig.context_after == ("h",) and sig.context_before == ("e", "f", "g")
    assert not ingestor.has_waiting()


def test_batch_path_reports_what_the_line_by_line_path_reports(catalog, matcher):
    """The Ingestor feeds the builder through add_hit; the result must equal FindingsBuilder.feed."""
    from importlib import resources

    lines = (resources.files("radixtop") / "data" / "sample_incident.log").read_text(encoding="utf-8").splitlines()
    one_by_one = FindingsBuilder(catalog, matcher=matcher)
    for i, text in enumerate(lines, 1):
        one_by_one.feed("sample.log", i, text)
    expected = one_by_one.report()
    ingestor = Ingestor(FindingsBuilder(catalog, matcher=matcher), catalog)
    state = IncidentState(capacity=1000)
    for start in range(0, len(lines), 37):  # batches cut anywhere, tracebacks included
        chunk = lines[start : start + 37]
        ingest(state, ingestor, batch(chunk, source="sample.log", start=start + 1), wait=True)
    state.apply(ingestor.flush(0))
    got = state.report
    assert got.to_json() == expected.to_json()
    assert got.lines == len(lines)


def test_rotated_generation_gets_its_own_finding_file(catalog, matcher):
    state = IncidentState(capacity=10)
    ingestor = Ingestor(FindingsBuilder(catalog, matcher=matcher), catalog)
    ingest(state, ingestor, batch([SEED], start=7, generation=1))
    assert state.report.findings[0].first.file == "server.log (generation 1)"


def test_memory_stays_bounded_however_often_a_file_rotates(catalog, matcher):
    state = IncidentState(capacity=50)
    ingestor = Ingestor(FindingsBuilder(catalog, matcher=matcher, after=3), catalog)
    for generation in range(30):
        # A failure at the very end of each generation: its context_after never comes in that file.
        ingest(state, ingestor, batch([f"g{generation} line", SEED], generation=generation), wait=True)
    assert ingestor.files_tracked <= 2
    assert len(state) == 50
    state.apply(ingestor.flush(0))
    (finding,) = state.report.findings
    assert finding.count == 30 and finding.first.file == "server.log"


def test_short_labels_are_unique_and_short():
    labels = short_labels(["/logs/rank0/server.log", "/logs/rank1/server.log", "/tmp/other.log"])
    assert labels == {
        "/logs/rank0/server.log": "rank0/server.log",
        "/logs/rank1/server.log": "rank1/server.log",
        "/tmp/other.log": "other.log",
    }


def test_lines_per_second_uses_the_clock():
    now = [100.0]
    state = IncidentState(capacity=10, clock=lambda: now[0])
    assert state.lines_per_second() == 0.0
    state.apply(plain(["a"] * 5))
    assert state.lines_per_second() is None  # the clock has not moved: unknown, not infinite
    now[0] += 1.0
    state.apply(plain(["b"] * 5))
    now[0] += 1.0
    assert state.lines_per_second() == pytest.approx(5.0)
    now[0] += 60.0
    assert state.lines_per_second() == 0.0


def test_version_moves_only_on_change():
    state = IncidentState(capacity=10)
    v = state.version
    state.lines_per_second()
    state.sources()
    assert state.version == v
    state.apply(plain(["a"]))
    assert state.version > v


def test_held_file_reports_the_earlier_scan_first(catalog, matcher):
    """The live tail of a file starts mid-file: its hits wait until the part before is scanned, so
    the finding's first occurrence is the earlier one, with its own context."""
    state = IncidentState(capacity=100)
    ingestor = Ingestor(FindingsBuilder(catalog, matcher=matcher, context=3, after=2), catalog)
    ingestor.hold("server.log")
    ingest(state, ingestor, batch(["x", SEED, "y", "z"], start=5001))
    assert state.report is None or not state.report.findings  # the tail's hit waits ...
    assert state.entry(1).severity == "error"  # ... though the line is marked at once
    ingestor.add_history_hit(
        "server.log", 12, SEED, catalog.index("radix-page-lock-eviction"), ("a", "b"), {}, context_after=("c",)
    )
    state.apply(ingestor.release("server.log", 5000))
    (finding,) = state.report.findings
    assert (finding.first.line, finding.count) == (12, 2)
    assert finding.context_before == ("a", "b") and finding.context_after == ("c",)
    assert state.report.lines == 5004


def test_held_hits_are_bounded(catalog, matcher, monkeypatch):
    from radixtop.session import ingest as state_module

    monkeypatch.setattr(state_module, "HELD_HITS_MAX", 3)
    state = IncidentState(capacity=100)
    ingestor = Ingestor(FindingsBuilder(catalog, matcher=matcher, after=0), catalog)
    ingestor.hold("server.log")
    ingest(state, ingestor, batch([SEED] * 3))
    assert ingestor.waiting == 3
    ingest(state, ingestor, batch([SEED], start=4))  # one more than may wait: they all go
    assert ingestor.waiting == 0 and state.report.findings[0].count == 4
    assert any("still being scanned" in e.text for e in map(state.entry, range(state.first_seq, state.next_seq)))


def test_lines_whose_numbers_are_still_counted_show_and_wait_to_be_findings(catalog, matcher):
    from radixtop.probes.backlog import Numbering as _Numbering
    from radixtop.probes.logbatch import LogLines, LogRun

    numbering = _Numbering()
    state = IncidentState(capacity=100)
    ingestor = Ingestor(FindingsBuilder(catalog, matcher=matcher, after=1), catalog)
    run = LogRun("server.log", 0, 1, ["before", SEED, "after"], 0.0, numbering)  # lines 1.. after the count
    ingest(state, ingestor, LogBatch(LogLines([run]), ()))
    assert [state.entry(s).text for s in range(3)] == ["before", SEED, "after"]
    assert state.entry(1).lineno == 0 and state.entry(1).severity == "error"
    assert state.report is None and ingestor.waiting == 1
    numbering.finish(7000)  # 7000 lines above where following began
    assert state.entry(1).lineno == 7002
    state.apply(ingestor.flush(0))
    assert state.report.findings[0].first.line == 7002


def test_run_table_and_notices_stay_bounded_by_the_ring():
    from radixtop.probes.logbatch import LogLines, LogRun

    state = IncidentState(capacity=100)
    for i in range(3000):  # one short run per batch, a notice every tenth
        notices = (LogNotice("a.log", "rotated", f"n{i}", 0.0),) if i % 10 == 0 else ()
        state.apply(
            IngestResult(LogLines([LogRun("a.log", 0, 2 * i + 1, [f"x{i}", f"y{i}"], 0.0)]), notices=notices, lines=2)
        )
    assert len(state) == 100
    assert len(state._runs) <= 51 and len(state._special) <= 10
    assert texts_in_view(state)[-2:] == ["x2999", "y2999"]
    assert state.entry(state.next_seq - 1).lineno == 6000


def test_big_runs_that_left_the_ring_are_let_go():
    """A pruned run still in the run table keeps all its texts alive: a backlog read in 50,000-line
    runs once kept every line of a million-line log while the ring showed 100,000."""
    import gc
    import weakref

    from radixtop.probes.logbatch import LogLines, LogRun

    state = IncidentState(capacity=1000)

    class Texts(list):  # a list that can be watched for being freed
        pass

    refs = []
    for i in range(20):
        texts = Texts(f"line {i}.{k}" for k in range(5000))
        refs.append(weakref.ref(texts))
        state.apply(IngestResult(LogLines([LogRun("a.log", 0, 5000 * i + 1, texts, 0.0)]), lines=5000))
        del texts
    gc.collect()
    alive = sum(r() is not None for r in refs)
    assert alive <= 2, f"{alive} runs of 5,000 lines are still held for a 1,000-line ring"
    assert texts_in_view(state)[-1] == "line 19.4999"


def test_health_moving_does_not_redraw_the_log_pane_but_a_new_source_does():
    state = IncidentState(capacity=10)
    state.set_health([SourceHealth("/var/log/a/server.log", "ok", "following generation 1", 3, None)])
    version = state.version
    state.set_health([SourceHealth("/var/log/a/server.log", "ok", "following generation 1", 4, 12.0)])
    assert state.version == version, "a line count moving redrew the log pane"
    (view,) = state.sources()
    assert view.lines == 4, "the status line still gets the new figures"
    state.set_health([SourceHealth("/var/log/a/server.log", "deleted", "deleted; waiting", 4, 12.0)])
    assert state.sources()[0].state == "deleted" and state.version == version
    state.set_health([SourceHealth("/var/log/b/server.log", "ok", "following generation 1", 0, None)])
    assert state.version > version, "a new source changes the label column"
    assert [v.label for v in state.sources()] == ["a/server.log", "b/server.log"]


def test_texts_filter_and_search_read_the_runs_and_notices_in_order_as_the_ring_turns():
    """The ring keeps no copy of a line: each text comes from its run (or is the notice's own),
    also for a run the ring's start cuts through, with a filter set before or after lines come."""
    rng = random.Random(3)
    state = IncidentState(capacity=50)
    model: list[str] = []  # every entry's text, in order
    for i in range(80):
        if i == 40:
            state.set_filter("alpha")
        if rng.random() < 0.2:
            state.add_notice("radixtop", "error", f"notice {i} {'alpha' if i % 3 else ''}")
            model.append(f"[error] notice {i} {'alpha' if i % 3 else ''}")
        else:
            texts = [f"line {i}.{k} {'alpha' if rng.random() < 0.3 else 'beta'}" for k in range(rng.randrange(1, 12))]
            state.apply(plain(texts))
            model.extend(texts)
        kept = model[-50:]
        assert [state.text(seq) for seq in range(state.first_seq, state.next_seq)] == kept, i
        if i >= 40:
            assert texts_in_view(state) == [t for t in kept if "alpha" in t], i
    state.set_filter(None)
    state.set_filter("alpha")  # made again from the ring, not kept up as lines came
    assert texts_in_view(state) == [t for t in model[-50:] if "alpha" in t]
    state.set_filter(None)
    state.set_search("beta")
    first_beta = next(row for row, t in enumerate(model[-50:]) if "beta" in t)
    assert state.find_search(-1) == first_beta
