"""The ingest's one pass finds the readers' needles: the lines it names are the lines that hold
them, and each reader does with them what its own search did."""

from __future__ import annotations

import random

from test_access_fold import SEED, access

from radixtop.diagnosis.catalog import load_catalog
from radixtop.diagnosis.findings import FindingsBuilder
from radixtop.diagnosis.matcher import Matcher
from radixtop.diagnosis.needles import PRINTED_TREE_NEEDLES, RARE_NEEDLES
from radixtop.diagnosis.printed_tree import PrintedTreeReader
from radixtop.probes.logbatch import LogBatch, LogLines, LogRecord, LogRun
from radixtop.session.ingest import Ingestor
from radixtop.session.needles import NEEDLES
from radixtop.session.vitals import live_lines

DECODE = "[2026-12-03 11:54:{s:02d} TP{r}] Decode batch, #running-req: 7, #token: 900, token usage: 0.55, #queue-req: 1"
RETRACT = "[2026-12-03 11:54:{s:02d} TP0] KV cache pool is full. Retract requests. #retracted_reqs: 3"
VLLM = "INFO 12-03 11:54:{s:02d} [loggers.py:116] Running: 3 reqs, Waiting: 0 reqs, GPU KV cache usage: 40.0%"
TREE = [
    "[2026-12-03 11:54:40 TP0] Scheduler hit an exception: RuntimeError: out of memory",
    " 4 [] r=0",
    "   2 [11, 12] r=1",
    "     2 [13, 14] r=1",
    "#tokens: 4",
]


def ingestor() -> Ingestor:
    catalog = load_catalog()
    return Ingestor(FindingsBuilder(catalog, matcher=Matcher(catalog.signatures), context=5), catalog)


def mixed_lines(rng: random.Random, n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        s = 30 + len(out) // 40
        pick = rng.random()
        if pick < 0.55:
            out.append(DECODE.format(s=s, r=rng.randrange(4)))
        elif pick < 0.85:
            out.extend(access(s % 60, rng.choice(["POST", "GET"]), rng.choice(["/generate", "/health"]))
                       for _ in range(rng.randint(1, 6)))
        elif pick < 0.9:
            out.append(RETRACT.format(s=s))
        elif pick < 0.93:
            out.append(VLLM.format(s=s % 60))
        elif pick < 0.96:
            out.extend(TREE)
        else:
            out.append(SEED)
    return out[:n]


def batches(lines: list[str], rng: random.Random, files: tuple[str, ...] = ("a.log",)) -> list[LogBatch]:
    """The lines in batches of a few runs each, the runs from `files` in turn (line numbers per file)."""
    out, numbers, i = [], dict.fromkeys(files, 1), 0
    while i < len(lines):
        records = []
        for _ in range(rng.randint(1, 3)):
            source = rng.choice(files)
            size = rng.randint(1, 60)
            for text in lines[i : i + size]:
                records.append(LogRecord(source, numbers[source], text, 0, 0.0))
                numbers[source] += 1
            i += size
        out.append(LogBatch(tuple(records), ()))
    return out


def test_the_ingest_names_the_lines_that_hold_each_needle_and_marks_only_signatures():
    rng = random.Random(3)
    ing, plain = ingestor(), ingestor()
    catalog_ids = {sig.id for sig in load_catalog().signatures}
    for batch in batches(mixed_lines(rng, 3000), rng, ("a.log", "b.log")):
        texts = [record.text for record in batch.records]
        result = ing.process(batch)
        assert result.needles is not None
        for needle in NEEDLES:
            assert list(result.needles.lines.get(needle, ())) == [i for i, t in enumerate(texts) if needle in t], needle
        assert {sig for mark in result.marks.values() for sig in mark.sig_ids} <= catalog_ids
        # The same marks as matching the catalog alone.
        assert result.marks == plain.process(batch).marks


def test_the_printed_tree_reader_and_the_vitals_read_the_same_lines_from_the_needles():
    rng = random.Random(5)
    lines = mixed_lines(rng, 3000)
    ing = ingestor()
    given, own = PrintedTreeReader(), PrintedTreeReader()
    trees_given, trees_own = [], []
    for batch in batches(lines, rng):
        texts = [record.text for record in batch.records]
        needles = ing.process(batch).needles
        assert needles is not None
        found = needles.found(0, len(texts))
        assert found >= {n for n in PRINTED_TREE_NEEDLES if any(n in t for t in texts)}
        trees_given += given.feed(texts, found)
        trees_own += own.feed(texts)
        assert live_lines(texts, needles.of(RARE_NEEDLES)) == live_lines(texts)
    assert trees_given == trees_own and len(trees_own) > 10
    long = lines[:2000]  # past live_lines' tail: only the rare lines of the head are read
    needles = ing.process(LogBatch(tuple(LogRecord("c.log", i + 1, t, 0, 0.0) for i, t in enumerate(long)), ())).needles
    assert needles is not None
    picked = live_lines(long, needles.of(RARE_NEEDLES))
    assert list(picked) == list(live_lines(long)) and len(picked) > 500


def test_the_ingest_finds_the_same_from_the_readers_bytes_as_from_the_texts():
    """A run the reader kept the bytes of (LogRun.raw) is scanned from them, not joined and
    encoded again: the marks and needles are the same as from its texts, and the bytes are let
    go once scanned (the ring keeps the texts alone)."""
    rng = random.Random(11)
    from_raw, from_texts = ingestor(), ingestor()
    lines = mixed_lines(rng, 3000)
    i, number = 0, 1
    while i < len(lines):
        size = rng.randint(1, 400)
        groups = []
        for _ in range(rng.randint(1, 2)):  # one file's lines read twice between frames, at times
            texts = lines[i : i + size]
            if texts:
                groups.append((number, texts))
                number += len(texts)
                i += len(texts)
        with_raw = [LogRun("a.log", 0, n, t, 0.0, raw="\n".join(t).encode()) for n, t in groups]
        plain = [LogRun("a.log", 0, n, t, 0.0) for n, t in groups]
        got = from_raw.process(LogBatch(LogLines(with_raw), ()))
        want = from_texts.process(LogBatch(LogLines(plain), ()))
        assert got.marks == want.marks
        assert got.needles == want.needles
        assert all(run.take_raw() is None for run in with_raw)
    assert from_raw.process(LogBatch(LogLines(), ())).marks == {}
    assert from_raw._builder.report().findings == from_texts._builder.report().findings
