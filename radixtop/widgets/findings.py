"""The findings list (one row per signature seen) and the evidence screen behind it.

Both render a diagnosis Report the app hands them; neither reads anything. Enter on a finding asks
the app to jump the log pane to its first occurrence (`OptionList.OptionSelected`); `d` opens the
evidence kept by the FindingsBuilder, which still exists when the line itself has left the ring.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from rich.style import Style
from rich.text import Text
from textual.binding import BindingType
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from radixtop.textsafe import printable_text
from radixtop.themes import SEVERITY_MARKERS
from radixtop.widgets.keys import EVIDENCE, EVIDENCE_CLOSE, TO_LOG, binding
from radixtop.widgets.text_screen import TextScreen


def _when(occurrence: Any) -> str:
    """Rank and time of day ("TP1 14:03:13.007"); the evidence screen has the full stamp."""
    parts = []
    if occurrence.rank:
        parts.append(occurrence.rank)
    if occurrence.time:
        written = occurrence.time
        parts.append(written[11:] if len(written) >= 19 and written[4] == "-" else written)
    return " ".join(parts)


def _where(occurrence: Any, label: Callable[[str], str]) -> str:
    return " ".join(p for p in (_when(occurrence), f"{label(occurrence.file)}:{occurrence.line}") if p)


class FindingsList(OptionList):
    """Signatures seen so far, in order of first occurrence; the initiating one is marked."""

    COMPONENT_CLASSES: ClassVar[set[str]] = OptionList.COMPONENT_CLASSES | {
        "findings--critical",
        "findings--error",
        "findings--warning",
        "findings--info",
        "findings--dim",
    }
    DEFAULT_CSS = """
    FindingsList { background: $surface; }
    FindingsList > .findings--critical { color: $sev-critical; text-style: bold reverse; }
    FindingsList > .findings--error { color: $sev-error; text-style: bold; }
    FindingsList > .findings--warning { color: $sev-warning; text-style: underline; }
    FindingsList > .findings--info { color: $sev-info; }
    FindingsList > .findings--dim { color: $log-dim; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        binding(TO_LOG),
        binding(EVIDENCE),
    ]

    class DetailsRequested(Message):
        def __init__(self, finding: Any) -> None:
            super().__init__()
            self.finding = finding

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._findings: tuple[Any, ...] = ()
        self._key: tuple = ()
        self._report: Any = None
        self._label: Callable[[str], str] = lambda s: s
        self.show_empty()

    def show_empty(self) -> None:
        self.set_options([Option("No known failure signature yet.", disabled=True)])

    def notify_style_update(self) -> None:
        super().notify_style_update()
        if self._report is not None and self._key:
            self._key = ()
            self.call_later(self.show_report, self._report, self._label)

    def _sev_style(self, severity: str) -> Style:
        try:
            return self.get_component_rich_style(f"findings--{severity}", partial=True)
        except KeyError:
            return Style()

    def show_report(self, report: Any, label: Callable[[str], str] = lambda s: s) -> None:
        """Show the report's findings; does nothing when they did not change."""
        findings = tuple(report.findings) if report is not None else ()
        initiating = report.initiating[0] if report is not None and report.initiating else None
        rows = tuple(
            (f.signature.id, f.count, f.first.file, f.first.line, f.signature.id == initiating) for f in findings
        )
        if rows == self._key:
            return
        old_rows, self._key, self._report, self._label = self._key, rows, report, label
        if not findings:
            self._findings = ()
            self.show_empty()
            return
        if old_rows and [r[0] for r in old_rows] == [r[0] for r in rows]:
            # Same findings, new counts: change those prompts in place. Rebuilding the list
            # would lay out the whole screen again, once a second while a failure repeats.
            self._findings = findings
            for i, (old, new) in enumerate(zip(old_rows, rows)):
                if old != new:
                    self.replace_option_prompt_at_index(i, self._prompt(findings[i], new[4], label))
            return
        highlighted = self.highlighted
        keep = (
            self._findings[highlighted].signature.id
            if highlighted is not None and highlighted < len(self._findings)
            else None
        )
        self._findings = findings
        self.set_options([Option(self._prompt(f, r[4], label), id=r[0]) for f, r in zip(findings, rows)])
        if keep is not None:
            for i, finding in enumerate(findings):
                if finding.signature.id == keep:
                    self.highlighted = i
                    break
        elif self.highlighted is None:
            self.highlighted = 0

    def _prompt(self, finding: Any, first: bool, label: Callable[[str], str]) -> Text:
        sig = finding.signature
        sev_style = self._sev_style(sig.severity)
        dim = self._sev_style("dim")
        prompt = Text(no_wrap=True, overflow="ellipsis")
        prompt.append(SEVERITY_MARKERS.get(sig.severity, "  "), sev_style)
        prompt.append(" ")
        prompt.append(sig.title, Style(bold=True))
        prompt.append("\n   ")
        if first:
            prompt.append("FIRST ", Style(bold=True, reverse=True))
            prompt.append(" ")
        prompt.append(sig.severity, sev_style)
        prompt.append(f" x{finding.count} ", Style(bold=True))
        prompt.append(_when(finding.first), dim)
        prompt.append(f"\n   {label(finding.first.file)}:{finding.first.line}", dim)
        return printable_text(prompt)  # the file's name is the watched process's choice

    def finding_at(self, index: int | None) -> Any | None:
        if index is None or not 0 <= index < len(self._findings):
            return None
        return self._findings[index]

    @property
    def findings(self) -> tuple[Any, ...]:
        return self._findings

    def action_details(self) -> None:
        finding = self.finding_at(self.highlighted)
        if finding is not None:
            self.post_message(self.DetailsRequested(finding))


def evidence_text(finding: Any, label: Callable[[str], str] = lambda s: s) -> Text:
    """Everything the FindingsBuilder kept about a finding, as one block of text."""
    sig = finding.signature
    first = finding.first
    out = Text()
    out.append(
        f"{SEVERITY_MARKERS.get(sig.severity, '  ')} {sig.severity.upper()}  ",
        Style(bold=True, reverse=sig.severity == "critical"),
    )
    out.append(f"{sig.title}", Style(bold=True))
    out.append(f"   [{sig.id}, {sig.subsystem}]\n")
    out.append(f"{finding.count} occurrence(s); first at {_where(first, label)}\n\n")
    out.append("Meaning: ", Style(bold=True))
    out.append(f"{sig.meaning}\n")
    if sig.first_checks:
        out.append("First checks:\n", Style(bold=True))
        for check in sig.first_checks:
            out.append(f"  • {check}\n")
    if sig.competing:
        out.append("Competing hypotheses (not ruled out by this line):\n", Style(bold=True))
        for other in sig.competing:
            out.append(f"  • {other}\n")
    if "Pyspy dump for PID" in first.text:
        from radixtop.diagnosis.pyspy import read_dumps, where

        places = where(read_dumps([first.text, *finding.context_after]))
        if places:
            out.append("Where each process was (SGLang's py-spy dump, innermost frame first):\n", Style(bold=True))
            for place in places:
                out.append(f"  • {place}\n")
    out.append(
        f"\nEvidence: {len(finding.context_before)} line(s) before, {len(finding.context_after)} after, "
        f"from {first.file}\n",
        Style(bold=True),
    )
    for line in finding.context_before:
        out.append(f"   {line}\n")
    out.append(f">> {first.text}\n", Style(bold=True, reverse=True))
    for line in finding.context_after:
        out.append(f"   {line}\n")
    return printable_text(out)  # log lines and file names from outside


class EvidenceScreen(TextScreen):
    """A finding's signature, first checks and the context kept around its first occurrence."""

    TEXT_ID = "evidence"
    TITLE_TEXT = "Finding"
    BINDINGS: ClassVar[list[BindingType]] = [binding(EVIDENCE_CLOSE)]

    def __init__(self, finding: Any, label: Callable[[str], str] = lambda s: s) -> None:
        super().__init__(evidence_text(finding, label))
        self.finding = finding

    def on_mount(self) -> None:
        super().on_mount()
        scroller = self.query_one(VerticalScroll)
        # Start at the first occurrence, not at the top of a hundred lines of context.
        self.call_after_refresh(
            lambda: scroller.scroll_to(y=max(0, len(self.finding.context_before) - 3 + 12), animate=False)
        )
