"""Findings across nodes (radixtop.diagnosis.node_findings): a node's `scan --json` read as hostile
(one line naming the field), its times put on this clock, and the initiating finding across nodes:
the first role in ROLES, then the earliest, so a notice on one node never outranks a cause on
another."""

from __future__ import annotations

import pytest

from radixtop.diagnosis.node_findings import across_nodes, initiating_across, read_scan, report_lines


def finding(sig: str, epoch: float | None, role: str = "cause", severity: str = "error", rank: str = "TP0") -> dict:
    return {"signature": sig, "severity": severity, "count": 1, "title": sig.replace("-", " "), "role": role,
            "subsystem": "x", "context_before": [], "context_after": [],
            "first": {"file": "/var/log/s.log", "line": 7, "time": "t", "epoch": epoch, "rank": rank, "text": "msg"}}


def doc(*findings: dict, initiating: str | None = None) -> dict:
    init = None if initiating is None else {"signature": initiating, "rank": "TP0", "file": "/var/log/s.log", "line": 7}
    return {"lines": 100, "findings": list(findings), "initiating": init, "notes": []}


def test_the_earliest_cause_across_nodes_is_initiating_on_this_nodes_clock() -> None:
    here = read_scan(doc(finding("radix-page-lock-eviction", 1_000.0), initiating="radix-page-lock-eviction"), "local")
    # node2's clock runs 100 s ahead: its cause at its 1_099.5 is this clock's 999.5, before ours.
    there = read_scan(doc(finding("kv-pool-retract", 1_099.0, role="notice", severity="warning"),
                          finding("radix-page-lock-eviction", 1_099.5), initiating="radix-page-lock-eviction"),
                      "node2", correction_s=100.0)
    first = initiating_across([here, there])
    assert first is not None and (first.node, first.epoch) == ("node2", 999.5)
    assert [(f.node, f.epoch) for f in across_nodes([here, there])] == [
        ("node2", 999.0), ("node2", 999.5), ("local", 1_000.0)]
    text = "\n".join(report_lines([here, there], {"node2": (100.0, 0.2, 100.0)}))
    assert "Initiating: node2 TP0  radix-page-lock-eviction (error)" in text
    assert "node node2: clock +100.000 s ± 0.200 s against this one, its times moved by -100.000 s" in text


def test_a_notice_on_one_node_never_outranks_a_cause_on_another() -> None:
    early_notice = read_scan(doc(finding("child-sigquit", 10.0, role="notice"), initiating="child-sigquit"), "a")
    later_cause = read_scan(doc(finding("cuda-illegal-memory-access", 20.0), initiating="cuda-illegal-memory-access"),
                            "b")
    first = initiating_across([early_notice, later_cause])
    assert first is not None and first.node == "b"
    assert initiating_across([read_scan(doc(finding("x", None)), "a")]) is None


@pytest.mark.parametrize(("bad", "says"), [
    ([], "not a JSON object"),
    ({"findings": {}}, "findings: not a list"),
    (doc(finding("x", "soon")), r"findings\[0\].first.epoch: not a time"),
    (doc(finding("x", 1.0, severity="fatal")), r"findings\[0\].severity: 'fatal' is no severity"),
    (doc(finding("x", 1.0, role="villain")), r"findings\[0\].role: 'villain' is no role"),
    (doc(finding("x", 1.0), initiating="y"), "initiating: 'y' is none of its findings"),
    ({**doc(), "lines": -1}, "lines: not a count"),
    (doc(*[finding("x", 1.0)] * 2_001), "findings: more than 2000"),
])
def test_a_node_answer_that_is_not_a_scan_is_one_line(bad: object, says: str) -> None:
    with pytest.raises(ValueError, match=f"^{says}"):
        read_scan(bad, "node2")


def test_text_from_a_node_is_printable_and_cut() -> None:
    f = finding("x", 1.0)
    f["first"]["text"] = "\x1b]0;owned\x07" + "a" * 1_000
    scan = read_scan(doc(f), "node2")
    text = scan.findings[0].text
    assert "\x1b" not in text and "\x07" not in text and len(text) <= 400
