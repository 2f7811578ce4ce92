"""The bundle's timeline: what it gathers from what a bundle holds, and the page itself opened in a
real headless Chromium (Debian's package, driven by Playwright) with the network cut off."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from incident_helpers import lock_race_bundle
from pane_helpers import make_snapshot

from radixtop.incident.bundle.seen import RankSeen, SeenState
from radixtop.incident.bundle.timeline import gather, render_html
from radixtop.schema import FlightRecord, Trigger

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
URL = "http://127.0.0.1:39100"


def test_gather_takes_the_ui_vitals_the_ranks_locked_tokens_and_the_marks():
    seen = SeenState(
        ranks=(RankSeen("rank0", URL, "down", ((1_000.0, make_snapshot(seq=1, protected_tokens=64)),
                                                (1_001.0, make_snapshot(seq=2, protected_tokens=96))), ()),),
        vitals={"token_usage": {"source": "metrics", "points": [[999.0, 0.80], [1_000.0, 0.93]]}},
        marks=((1_000.5, "Radix cache page lock failed"),),
    )
    record = FlightRecord(1, 1, 4242, 4241, 1_002.0, (Trigger("scheduler_exception", "x", 1_002.0),),
                          make_snapshot(seq=9, rank=1, protected_tokens=128), (), 0)
    timeline = gather(seen, [record])
    assert (
        timeline.vitals == {"token_usage": [(999.0, 0.80), (1_000.0, 0.93)]}
        and timeline.sources["token_usage"] == "metrics"
    )
    assert [v for _, v in timeline.locked["rank 0"]] == [64.0, 96.0]
    assert [v for _, v in timeline.locked["rank 1"]] == [128.0]
    assert timeline.marks == [(1_000.5, "Radix cache page lock failed")]
    page = render_html(timeline, "t")
    assert "locked tokens, rank 1" in page and "token usage (metrics)" in page


def test_without_the_ui_the_vitals_come_from_the_logs_and_the_marks_from_the_findings(tmp_path: Path):
    log = tmp_path / "server.log"
    log.write_text(
        "[2026-12-02 14:03:13] Decode batch, #running-req: 6, #token: 3876, token usage: 0.24, cuda graph: True, "
        "gen throughput (token/s): 1782.15, #queue-req: 2\n"
        "[2026-12-02 14:03:14] Decode batch, #running-req: 7, #token: 3976, token usage: 0.91, cuda graph: True, "
        "gen throughput (token/s): 1782.15, #queue-req: 0\n"
    )
    timeline = gather(logs=[str(log)])
    assert [v for _, v in timeline.vitals["token_usage"]] == [0.24, 0.91]
    assert [v for _, v in timeline.vitals["queued"]] == [2.0, 0.0] and timeline.sources["running"] == "log"
    assert gather(logs=[str(tmp_path / "missing.log")]).empty


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium package (.ci/run installs it)")
def test_the_bundles_timeline_opens_offline_in_chromium_with_every_series_and_marker(tmp_path: Path):
    from playwright.sync_api import sync_playwright

    _, bundle = lock_race_bundle(tmp_path)
    page_file = bundle / "timeline.html"
    assert "timeline.html" in (bundle / "README.txt").read_text()
    findings = json.loads((bundle / "findings.json").read_text())["findings"]
    expected_marks = {f["title"] for f in findings if f["first"]["time"]}
    assert any("lock" in title.lower() for title in expected_marks)
    requested: list[str] = []
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = browser.new_context(offline=True, viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            page.on("request", lambda r: requested.append(r.url))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_file.as_uri())
            page.wait_for_selector(".js-plotly-plot .legendtext", timeout=20_000)
            legend = page.eval_on_selector_all(".legendtext", "els => els.map(e => e.textContent)")
            notes = page.eval_on_selector_all(".annotation-text", "els => els.map(e => e.textContent)")
            traces = page.evaluate("document.querySelector('.js-plotly-plot').data.map(t => [t.name, t.x.length])")
        finally:
            browser.close()
    assert errors == [] and all(url.startswith("file://") for url in requested), (errors, requested)
    names = {name for name, _ in traces}
    assert {"token usage (metrics)", "running requests (metrics)", "queued requests (metrics)"} <= names or {
        "token usage (log)", "running requests (log)", "queued requests (log)"} <= names, names
    assert {"locked tokens, rank 0", "locked tokens, rank 1"} <= names
    assert all(count > 0 for _, count in traces)
    assert names <= set(legend)  # every series is drawn and named in the legend
    assert all(any(note.endswith(f" {title}") for note in notes) for title in expected_marks), (expected_marks, notes)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium package (.ci/run installs it)")
def test_markup_in_a_signature_title_and_the_reason_is_shown_as_text(tmp_path: Path):
    # Plotly reads a subset of HTML in its texts: a title in a user catalog, or --reason, made a
    # clickable link, a 90 px span, and bidi overrides were drawn raw.
    from playwright.sync_api import sync_playwright

    from radixtop.incident.bundle.timeline import Timeline

    label = '<a href="https://example.com/x">open</a> <span style="font-size:90px">BIG</span> a&amp;b \u202eevil'
    reason = "<b>bold</b> <i>reason</i>"
    timeline = Timeline(vitals={"token_usage": [(1_000.0, 0.5), (1_001.0, 0.9)]}, marks=[(1_000.5, label)])
    page_file = tmp_path / "timeline.html"
    page_file.write_text(render_html(timeline, reason), encoding="utf-8")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_context(offline=True).new_page()
            page.goto(page_file.as_uri())
            page.wait_for_selector(".js-plotly-plot .annotation-text", timeout=20_000)
            notes = page.eval_on_selector_all(".annotation-text", "els => els.map(e => e.textContent)")
            title = page.eval_on_selector(".gtitle", "e => e.textContent")
            links = page.eval_on_selector_all(".js-plotly-plot a", "els => els.length")
            styled = page.eval_on_selector_all(".js-plotly-plot tspan[style*='font-size:90px']", "els => els.length")
        finally:
            browser.close()
    shown = label.replace("\u202e", "\ufffd")
    assert any(note.endswith(f" {shown}") for note in notes), notes
    assert title == reason and links == 0 and styled == 0


def test_a_nodes_timeline_json_comes_back_as_it_went_and_hostile_ones_are_one_line():
    from radixtop.incident.bundle.timeline import Timeline, from_json, to_json

    timeline = Timeline(vitals={"token_usage": [(1.0, 0.5), (2.0, 0.9)]}, sources={"token_usage": "log"},
                        locked={"rank 3": [(2.0, 64.0)]}, evictions={"rank 3": [(2.0, 1.0)]},
                        marks=[(2.5, "Radix cache page lock failed")])
    assert from_json(json.loads(json.dumps(to_json(timeline)))) == timeline
    doc = to_json(timeline)
    for field, value, says in [
        ("vitals", {"token_usage": [["1", 0.5]]}, "vitals: '1' is not a number"),
        ("locked", {"rank 0": [[1.0, float("nan")]]}, "locked: nan is not a number"),
        ("marks", [[1.0, 7]], "marks: a name is not a string"),
        ("evictions", {f"r{i}": [] for i in range(65)}, "evictions: more than 64 series"),
        ("radixtop_timeline", 2, "not a timeline"),
    ]:
        with pytest.raises(ValueError, match=f"^{says}"):
            from_json({**doc, field: value})
    shown = from_json({**doc, "marks": [[3.0, "\x1b[31mred\nline"]]})
    assert shown.marks == [(3.0, "\ufffd[31mred line")]  # printable, one line


def test_nodes_shifted_onto_this_clock_are_tagged_and_ordered_across_nodes():
    from radixtop.incident.bundle.timeline import Timeline, events, shifted
    from radixtop.probes.remote import ClockSkew

    here = Timeline(marks=[(1_000.0, "Radix cache page lock failed")], node="local")
    # The other node's clock runs 100 s ahead, measured within ± 0.25 s: its race, at its 1_099.5,
    # came half a second before this node's failure.
    skew = ClockSkew(100.0, 0.5)
    assert skew.correction_s == 100.0 and ClockSkew(0.2, 0.5).correction_s == 0.0  # within its ± 0.25 s: not applied
    there = shifted(Timeline(vitals={"token_usage": [(1_099.0, 0.97)]}, locked={"rank 3": [(1_099.5, 96.0)]},
                             marks=[(1_099.5, "Radix cache eviction contended with a page lock")]),
                    skew.correction_s, "node2")
    assert there.node == "node2" and there.vitals["token_usage"] == [(999.0, 0.97)]
    assert there.locked["rank 3"] == [(999.5, 96.0)]
    assert [(e["node"], e["time"]) for e in events([here, there])] == [("node2", 999.5), ("local", 1_000.0)]
    page = render_html([here, there], "across nodes")
    assert "node2: Radix cache eviction contended" in page and "local: Radix cache page lock failed" in page
    assert "locked tokens, rank 3 node2" in page and "token usage, node2" in page
