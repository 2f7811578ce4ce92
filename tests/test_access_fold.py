"""HTTP access lines fold into one counted row per second; signatures and other lines stay."""

from __future__ import annotations

import random

import pytest

from radixtop.diagnosis.catalog import load_catalog
from radixtop.diagnosis.findings import FindingsBuilder
from radixtop.diagnosis.logline import access_key
from radixtop.diagnosis.matcher import Matcher
from radixtop.probes.logbatch import LogBatch, LogRecord
from radixtop.session.access_fold import second_of
from radixtop.session.incident_state import IncidentState
from radixtop.session.ingest import Ingestor

SEED = "[2026-12-03 11:54:35 TP1] RadixCacheError: Failed to lock memory page during dynamic prefix eviction"


def access(second: int, method: str = "POST", path: str = "/generate", status: int = 503) -> str:
    return (
        f'[2026-12-03 11:54:{second:02d}] INFO:     127.0.0.1:37568 - "{method} {path} HTTP/1.1" '
        f"{status} Service Unavailable"
    )


def feed(state: IncidentState, texts: list[str], ingestor: Ingestor | None = None, start: int = 1) -> None:
    records = tuple(LogRecord("sim.log", start + i, t, 0, 0.0) for i, t in enumerate(texts))
    if ingestor is None:
        from radixtop.session.ingest import IngestResult

        state.apply(IngestResult(records, lines=len(texts), max_len=max(map(len, texts))))
        return
    state.apply(ingestor.process(LogBatch(records, ())))


def view(state: IncidentState) -> list[str]:
    return [state.entry(state.view_seq(r)).text for r in range(state.view_len)]


def test_access_key_reads_uvicorns_access_format():
    assert access_key(access(1)) == ("POST", "/generate", "503")
    assert access_key('INFO:     127.0.0.1:1 - "GET /metrics?x=1 HTTP/1.1" 200 OK') == ("GET", "/metrics", "200")
    assert access_key("[2026-12-03 11:54:35 TP0] Decode batch, #running-req: 3") is None
    assert access_key("see HTTP/1.1 spec") is None


def test_a_second_of_access_lines_is_one_counted_row_and_other_lines_stay():
    state = IncidentState(capacity=1000)
    lines = ["[2026-12-03 11:54:34] server up", *[access(35) for _ in range(30)],
             *[access(35, "GET", "/health") for _ in range(7)], "Traceback (most recent call last):",
             *[access(35) for _ in range(5)], *[access(36) for _ in range(4)], "the end"]
    feed(state, lines)
    shown = view(state)
    assert shown == [
        "[2026-12-03 11:54:34] server up",
        "[2026-12-03 11:54:35] 37 HTTP access lines: POST /generate 503 ×30, GET /health 503 ×7 (a shows them)",
        "Traceback (most recent call last):",
        "[2026-12-03 11:54:35] 5 HTTP access lines: POST /generate 503 ×5 (a shows them)",
        "[2026-12-03 11:54:36] 4 HTTP access lines: POST /generate 503 ×4 (a shows them)",
        "the end",
    ]
    assert state.entry(state.view_seq(1)).kind == "fold"
    # Every row maps back to itself; the hidden lines have no row.
    for row in range(state.view_len):
        assert state.row_of(state.view_seq(row)) == row
    assert sum(state.row_of(s) is None for s in range(state.first_seq, state.next_seq)) == len(lines) - 6
    state.set_fold_access(False)
    assert view(state) == lines


def test_a_run_split_across_batches_keeps_counting_into_the_same_row():
    state = IncidentState(capacity=100)
    feed(state, [access(35) for _ in range(3)])
    feed(state, [access(35) for _ in range(2)], start=4)
    assert view(state) == ["[2026-12-03 11:54:35] 5 HTTP access lines: POST /generate 503 ×5 (a shows them)"]
    assert state.folds.changed  # the log pane redraws the grown row
    state.add_notice("sim.log", "rotated", "rotated")
    feed(state, [access(35)], start=6)
    assert len(view(state)) == 3  # a notice ends the run: the next access line starts a row


def test_a_signature_on_an_access_like_line_is_never_folded():
    catalog = load_catalog()
    ingestor = Ingestor(FindingsBuilder(catalog, matcher=Matcher(catalog.signatures), context=10), catalog)
    state = IncidentState(capacity=100)
    crash = f'{access(35)} {SEED[26:]}'  # an access line that also carries the seed's message
    feed(state, [access(35), access(35), crash, access(35)], ingestor)
    shown = view(state)
    assert crash in shown
    assert state.entry(state.view_seq(shown.index(crash))).severity is not None


def test_the_ring_dropping_old_lines_keeps_the_mapping_exact():
    rng = random.Random(5)
    state = IncidentState(capacity=300)
    everything: list[str] = []
    for _ in range(40):
        texts = []
        for _ in range(rng.randint(1, 40)):
            texts.append(access(rng.choice((1, 2))) if rng.random() < 0.8 else f"other {len(everything) + len(texts)}")
        feed(state, texts, start=len(everything) + 1)
        everything += texts
        rows = [state.view_seq(r) for r in range(state.view_len)]
        assert rows == sorted(set(rows)) and all(s is not None for s in rows)
        assert [state.row_of(s) for s in rows] == list(range(len(rows)))
        # Every non-access line still in the ring is in the view.
        kept = {s for s in range(state.first_seq, state.next_seq) if access_key(state.text(s) or "") is None}
        assert kept <= set(rows)
        state.set_fold_access(False)
        assert state.view_len == len(state)
        state.set_fold_access(True)


@pytest.mark.parametrize("flag", [True, False])
def test_a_filter_shows_every_matching_line_whatever_the_fold(flag):
    state = IncidentState(capacity=100)
    state.set_fold_access(flag)
    feed(state, [access(35) for _ in range(6)])
    state.set_filter("POST")
    assert state.view_len == 6


def test_the_fold_is_the_same_however_the_lines_are_split_into_batches():
    """Runs end at any other line, also at a batch's edge, and the rows count alike whether the
    lines came in one batch or in many."""
    rng = random.Random(11)
    texts = []
    for _ in range(600):
        roll = rng.random()
        if roll < 0.6:
            texts.append(access(rng.randrange(3), rng.choice(["GET", "POST"]), rng.choice(["/health", "/generate"])))
        elif roll < 0.95:
            texts.append(f"[2026-12-03 11:54:0{rng.randrange(3)} TP0] Decode batch, #running-req: 3")
        else:
            texts.append('plain "GET /x HTTP/1.1" mentioned in a message without a method-path-status triple HTTP/')
    whole = IncidentState(capacity=10_000)
    feed(whole, texts)
    expected = view(whole)  # a counted row's text names its count and kinds
    assert whole.view_len < len(texts) and any("HTTP access lines" in t for t in expected)
    for trial in range(5):
        split = IncidentState(capacity=10_000)
        i = 0
        while i < len(texts):
            n = rng.randrange(1, 40)
            feed(split, texts[i : i + n], start=1 + i)
            i += n
        assert view(split) == expected, trial


def test_the_rows_are_the_runs_of_access_lines_of_one_second_and_nothing_else_folds():
    """Against a plain model of the rule: consecutive access lines of the same second (a line that
    is not one, or names HTTP/ without being one, or matched a signature, ends a run) are one row,
    its first line's, counting them all; mostly lone access lines, as in a busy server's log."""
    rng = random.Random(23)
    catalog = load_catalog()
    ingestor = Ingestor(FindingsBuilder(catalog, matcher=Matcher(catalog.signatures), context=10), catalog)
    texts = []
    for _ in range(3000):
        roll = rng.random()
        if roll < 0.3:
            texts.append(access(rng.randrange(2), rng.choice(["GET", "POST"])))
        elif roll < 0.33:
            texts.append('INFO:     127.0.0.1:9 - "GET /health HTTP/1.1" 200 OK')  # no time of its own
        elif roll < 0.36:
            texts.append("see HTTP/1.1 in a message")  # names HTTP/, not an access line
        elif roll < 0.38:
            texts.append(SEED.replace("RadixCacheError", 'RadixCacheError "POST /generate HTTP/1.1" 503'))
        else:
            texts.append(f"[2026-12-03 11:54:0{rng.randrange(2)} TP0] Decode batch, #running-req: 3")
    state = IncidentState(capacity=10_000, clock=lambda: 1_764_762_876.0)
    i = 0
    while i < len(texts):
        n = rng.randrange(1, 50)
        feed(state, texts[i : i + n], ingestor, start=1 + i)
        i += n
    expected: list[tuple[int, int]] = []  # (seq of the row's line, lines it stands for)
    run_second = None
    for seq, text in enumerate(texts):
        key = None if text.startswith(SEED[:20]) else access_key(text)
        second = (second_of(text) or "1764762876") if key is not None else None
        if key is not None and second == run_second:
            expected[-1] = (expected[-1][0], expected[-1][1] + 1)
            continue
        run_second = second
        expected.append((seq, 1))
    got = []
    for row in range(state.view_len):
        seq = state.view_seq(row)
        summary = state.folds.summary(seq)
        got.append((seq - state.first_seq, int(summary.split()[0]) if summary else 1))
    assert got == expected
    assert sum(1 for _, n in expected if n > 1) > 50  # rows that count several lines were made
