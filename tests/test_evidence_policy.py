"""One evidence policy for every path that makes a finding: the whole-file scan, the live log
pane's ingestor and the builder's own line feed give the same finding the same opener (its time
and rank) and the same context, however deep inside a traceback the failure line sits."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixtop.diagnosis.catalog import load_catalog
from radixtop.diagnosis.evidence_policy import CONTEXT_BEFORE, OPENER_LOOKBACK, find_opener
from radixtop.diagnosis.findings import FindingsBuilder
from radixtop.diagnosis.matcher import Matcher
from radixtop.probes.logbatch import LogBatch, LogRecord
from radixtop.probes.logscan import scan_into
from radixtop.session.ingest import Ingestor

OPENER = "[2026-12-03 11:54:35.502 TP3] Scheduler hit an exception: Traceback (most recent call last):"
FAILURE = "sglang.srt.mem_cache.radix_cache.RadixCacheError: Failed to lock memory page during dynamic prefix eviction"


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def lines(depth: int) -> list[str]:
    before = [f"[2026-12-03 11:54:{i % 60:02d}.000 TP0] Decode batch, #running-req: 3, token usage: 0.5{i % 10}"
              for i in range(150)]
    body = [f'  File "/srv/sglang/frame_{i}.py", line {i}, in step' for i in range(depth)]
    return [*before, OPENER, *body, FAILURE]


def first_of(report, sig_id: str):
    return next(f for f in report.findings if f.signature.id == sig_id)


@pytest.mark.parametrize("depth", [10, 300, OPENER_LOOKBACK - 1, OPENER_LOOKBACK, OPENER_LOOKBACK + 20])
def test_the_scan_the_live_pane_and_the_feed_agree_on_a_findings_evidence(tmp_path: Path, catalog, depth: int):
    log = tmp_path / "server.log"
    text = lines(depth)
    log.write_text("\n".join(text) + "\n", encoding="utf-8")
    matcher = Matcher(catalog.signatures)

    scanned = FindingsBuilder(catalog, matcher=matcher)
    scan_into(scanned, [str(log)], matcher)

    fed = FindingsBuilder(catalog, matcher=matcher)
    for i, line in enumerate(text, 1):
        fed.feed(str(log), i, line)

    live = FindingsBuilder(catalog, matcher=matcher)
    ingestor = Ingestor(live, catalog)
    ingestor.process(LogBatch(tuple(LogRecord(str(log), i, t, 0, 0.0) for i, t in enumerate(text, 1)), ()))
    ingestor.flush(0)

    found = [first_of(b.report(), "radix-page-lock-eviction") for b in (scanned, fed, live)]
    within = depth + 1 <= OPENER_LOOKBACK
    for finding in found:
        assert finding.first.line == len(text)
        # Within the lookback the opener gives the failure its rank and time; beyond it, none.
        assert (finding.first.rank, finding.first.time) == (
            ("TP3", "2026-12-03 11:54:35.502") if within else (None, None)
        )
        assert len(finding.context_before) == CONTEXT_BEFORE
    assert len({(f.first.rank, f.first.time, f.context_before) for f in found}) == 1


def test_find_opener_stops_at_the_lookback():
    body = ["  continuation"] * (OPENER_LOOKBACK - 1)
    assert find_opener(reversed([OPENER, *body])) == (OPENER_LOOKBACK, OPENER)
    assert find_opener(reversed([OPENER, *body, "  one more"])) is None


def test_batch_stats_are_kept_per_rank_whatever_the_prefix_shape():
    from radixtop.diagnosis.evidence_policy import batch_stats_before

    window = "\n".join(
        f"{prefix} Decode batch, #running-req: {n}, token usage: 0.{n}0"
        for n, prefix in enumerate(
            ["[2026-12-02 14:00:00.100 DP0 TP1]", "[14:00:00 TP2]", "[TP3 EP3]", "[2026-12-02 14:00:01 TP0]"], 1
        )
    ).encode()
    found = batch_stats_before(window)
    assert {rank: stats.running_req for rank, stats in found.items()} == {
        "DP0 TP1": 1,
        "TP2": 2,
        "TP3 EP3": 3,
        "TP0": 4,
    }
