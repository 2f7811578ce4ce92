"""Findings across nodes (`radixtop scan --node HOST`): each node's `radixtop scan --json`, read as
hostile, its findings tagged with the node and their times put on this node's clock, and the
initiating finding across nodes.

A node's answer came from another machine: every field read here has its type and size checked
(one ValueError line naming the field), strings are made printable and cut, and only what the
merged report shows is kept. The initiating finding follows the single-node rule across nodes:
each node names its own (the earliest cause, else consequence, else notice: diagnosis/findings.py),
and of those the one whose role comes first in ROLES wins, then the earliest on this node's clock,
so a notice on one node is never named over a cause logged on another. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from radixtop.diagnosis.catalog import ROLES
from radixtop.diagnosis.severity import NAMES as SEVERITIES
from radixtop.textsafe import printable_line

__all__ = ["LOCAL", "NodeFinding", "NodeScan", "across_nodes", "initiating_across", "read_scan", "report_lines"]

LOCAL = "local"  # this node's name among the nodes
MAX_FINDINGS = 2_000  # per node; the catalog has far fewer signatures
MAX_TEXT = 400


class NodeFinding(NamedTuple):
    node: str
    signature: str
    severity: str
    title: str
    role: str
    count: int  # type: ignore[assignment]  # shadows tuple.count, which nothing here calls
    file: str
    line: int
    time: str | None  # as the node's log wrote it
    epoch: float | None  # on this node's clock: the node's epoch minus its clock correction
    rank: str | None
    text: str

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node, "signature": self.signature, "severity": self.severity, "title": self.title,
            "role": self.role, "count": self.count,
            "first": {"file": self.file, "line": self.line, "time": self.time, "epoch": self.epoch,
                      "rank": self.rank, "text": self.text},
        }


class NodeScan(NamedTuple):
    node: str
    lines: int
    findings: tuple[NodeFinding, ...]
    initiating: NodeFinding | None  # the node's own
    notes: tuple[str, ...]


def read_scan(doc: Any, node: str, correction_s: float = 0.0) -> NodeScan:
    """A node's `radixtop scan --json` (bounded.load_json's value); ValueError (one line) when it is
    not one. `correction_s` is subtracted from every epoch (the node's clock minus this one's)."""
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    findings_doc = doc.get("findings")
    if not isinstance(findings_doc, list):
        raise ValueError("findings: not a list")
    if len(findings_doc) > MAX_FINDINGS:
        raise ValueError(f"findings: more than {MAX_FINDINGS}")
    findings = tuple(_finding(f, node, correction_s, i) for i, f in enumerate(findings_doc))
    initiating = None
    init = doc.get("initiating")
    if init is not None:
        if not isinstance(init, dict):
            raise ValueError("initiating: not an object")
        sig = _text(init.get("signature"), "initiating.signature")
        initiating = next((f for f in findings if f.signature == sig), None)
        if initiating is None:
            raise ValueError(f"initiating: {sig!r} is none of its findings")
    notes = doc.get("notes", [])
    if not isinstance(notes, list):
        raise ValueError("notes: not a list")
    lines = doc.get("lines", 0)
    if isinstance(lines, bool) or not isinstance(lines, int) or lines < 0:
        raise ValueError("lines: not a count")
    return NodeScan(node, lines, findings, initiating,
                    tuple(_text(n, "notes") for n in notes[:64]))


def _finding(doc: Any, node: str, correction_s: float, i: int) -> NodeFinding:
    where = f"findings[{i}]"
    if not isinstance(doc, dict) or not isinstance(doc.get("first"), dict):
        raise ValueError(f"{where}: not a finding")
    first = doc["first"]
    severity = _text(doc.get("severity"), f"{where}.severity")
    if severity not in SEVERITIES:
        raise ValueError(f"{where}.severity: {severity!r} is no severity")
    role = _text(doc.get("role", "cause"), f"{where}.role")
    if role not in ROLES:
        raise ValueError(f"{where}.role: {role!r} is no role")
    epoch = first.get("epoch")
    if epoch is not None:
        if isinstance(epoch, bool) or not isinstance(epoch, (int, float)) or not 0 <= epoch < 1e11:
            raise ValueError(f"{where}.first.epoch: not a time")
        epoch = float(epoch) - correction_s
    return NodeFinding(
        node=node,
        signature=_text(doc.get("signature"), f"{where}.signature"),
        severity=severity,
        title=_text(doc.get("title", ""), f"{where}.title"),
        role=role,
        count=_count(doc.get("count"), f"{where}.count"),
        file=_text(first.get("file"), f"{where}.first.file"),
        line=_count(first.get("line"), f"{where}.first.line"),
        time=None if first.get("time") is None else _text(first.get("time"), f"{where}.first.time"),
        epoch=epoch,
        rank=None if first.get("rank") is None else _text(first.get("rank"), f"{where}.first.rank"),
        text=_text(first.get("text", ""), f"{where}.first.text"),
    )


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what}: not a string")
    return printable_line(value, MAX_TEXT)


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 53:
        raise ValueError(f"{what}: not a count")
    return value


def _when(f: NodeFinding) -> tuple[bool, float, str, str, int]:
    """Earliest first on this node's clock; a finding with no time after every timed one."""
    return (f.epoch is None, f.epoch or 0.0, f.node, f.file, f.line)


def across_nodes(scans: Sequence[NodeScan]) -> list[NodeFinding]:
    """Every node's findings, by first occurrence on this node's clock."""
    return sorted((f for scan in scans for f in scan.findings), key=_when)


def initiating_across(scans: Sequence[NodeScan]) -> NodeFinding | None:
    """Of each node's initiating finding, the one whose role comes first, then the earliest."""
    named = [s.initiating for s in scans if s.initiating is not None]
    return min(named, key=lambda f: (ROLES.index(f.role), *_when(f)), default=None)


def report_lines(scans: Sequence[NodeScan], skews: dict[str, tuple[float, float, float]],
                 ellipsis: str = "…") -> list[str]:
    """The merged report for a person. `skews`: node -> (offset, uncertainty, correction) in seconds."""
    findings = across_nodes(scans)
    lines = [f"radixtop scan: {len(scans)} node{'s' if len(scans) != 1 else ''} "
             f"({', '.join(s.node for s in scans) or 'none'}), {sum(s.lines for s in scans):,} lines, "
             f"{len(findings)} first occurrence{'s' if len(findings) != 1 else ''} found"]
    for node, (offset, uncertainty, correction) in skews.items():
        moved = f"its times moved by {-correction:+.3f} s" if correction else "not corrected"
        lines.append(f"node {node}: clock {offset:+.3f} s ± {uncertainty:.3f} s against this one, {moved}")
    lines += [f"note: {s.node}: {note}" for s in scans for note in s.notes]
    if not findings:
        return [*lines, "No known failure signature matched."]
    first = initiating_across(scans)
    if first is not None:
        lines += ["", f"Initiating: {first.node} {first.rank or '(no rank)'}  {first.signature} ({first.severity})  "
                      f"{_where(first, rank=False)}", f"  > {_clip(first.text, ellipsis)}"]
    lines += ["", "Findings by first occurrence, across nodes (on this node's clock):"]
    node_w = max(len(f.node) for f in findings)
    sig_w = max(len(f.signature) for f in findings)
    for f in findings:
        lines.append(f"  {f.severity:<8} {f.count:>7,}x  {f.node:<{node_w}}  {f.signature:<{sig_w}}  first {_where(f)}")
        lines.append(f"      {f.title}")
        lines.append(f"      > {_clip(f.text, ellipsis)}")
    return lines


def _where(f: NodeFinding, rank: bool = True) -> str:
    parts = [f"{f.file}:{f.line}"]
    if f.time:
        parts.append(f.time)
    if rank and f.rank:
        parts.append(f.rank)
    return "  ".join(parts)


def _clip(text: str, ellipsis: str, width: int = 160) -> str:
    text = text.strip()
    return text if len(text) <= width else text[: width - len(ellipsis)] + ellipsis
