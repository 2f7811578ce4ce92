"""The bundle's picture for the post-mortem: one self-contained HTML timeline (timeline.html) of
the server's vital signs and each rank's locked tokens, with every first signature marked.

What it plots, best source first:
- the vital signs radixtop held (a bundle from the UI: seen/vitals.json's series, from /metrics or
  the log), else the same series read back from the logs' tails (session/vitals.py parses them:
  token usage, running and queued requests, cache hit rate, retractions);
- locked tokens and evictions per rank from the radix snapshots radixtop kept (seen/) and from the
  ranks' flight records (flight/: the cache as it failed, and the safe point before);
- the first signatures as vertical lines with their labels, from the findings (else the UI's marks),
  shown as written (no markup in them is read).

Plotly draws it (a maintained library; the chart is interactive: zoom to the seconds before the
crash, hover for values) with plotly.js inlined, so it opens offline in any browser: a GPU node's
post-mortem is often read far from any network.

The same figures go into timeline.json (`to_json`), so that a bundle across nodes can draw every
node's on one page: `from_json` reads another node's as hostile (bounded, every value checked),
`shifted` moves a node's times onto this node's clock (minus the measured skew) and tags it, and
`render_html` draws several nodes' parts together, each series and mark named by its node.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from radixtop.textsafe import printable, printable_line

__all__ = ["Timeline", "events", "from_json", "gather", "render_html", "shifted", "to_json"]

MAX_MARKS = 12
FORMAT = "radixtop_timeline"
MAX_SERIES = 64  # per kind of figure, in a node's timeline.json
MAX_POINTS = 20_000  # per series
MAX_LABEL = 200


@dataclass
class Timeline:
    vitals: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # series key -> (epoch, value)
    sources: dict[str, str] = field(default_factory=dict)  # series key -> "metrics" / "log" / ...
    locked: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # "rank 0" -> (epoch, locked tokens)
    # "rank 0" -> (epoch, evictions so far)
    evictions: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    marks: list[tuple[float, str]] = field(default_factory=list)  # (epoch, first signature)
    node: str = ""  # whose figures, in a bundle across nodes ("" alone)

    @property
    def empty(self) -> bool:
        return not (any(self.vitals.values()) or any(self.locked.values()) or self.marks)


def gather(seen: Any = None, flight: Sequence[Any] = (), logs: Sequence[str] = (), report: Any = None) -> Timeline:
    """What the timeline shows, from what the bundle holds: ``seen`` (incident.seen.SeenState),
    ``flight`` (schema.FlightRecord), the log paths and the findings (diagnosis Report)."""
    timeline = Timeline()
    if seen is not None and seen.vitals:
        for key, doc in seen.vitals.items():
            timeline.vitals[key] = [(float(t), float(v)) for t, v in doc["points"]]
            timeline.sources[key] = doc["source"]
    else:
        _vitals_from_logs(timeline, logs)
    for rank in seen.ranks if seen is not None else ():
        for fetched, snap in rank.snapshots:
            _radix_point(timeline, _rank_label(snap.rank), snap.time or fetched, snap)
    for record in flight:
        for snap in (record.before, record.snapshot):
            if snap is not None:
                _radix_point(timeline, _rank_label(record.rank), snap.time, snap)
    for points in (*timeline.locked.values(), *timeline.evictions.values()):
        points.sort()
    # The findings name every first signature; the UI's marks are the ones its plots showed.
    marks = _marks_of(report) or (list(seen.marks) if seen is not None else [])
    timeline.marks = sorted(marks)[:MAX_MARKS]
    return timeline


def _rank_label(rank: int) -> str:
    return f"rank {rank}"


def _radix_point(timeline: Timeline, label: str, t: float, snap: Any) -> None:
    if snap.protected_tokens is not None:
        timeline.locked.setdefault(label, []).append((t, float(snap.protected_tokens)))
    timeline.evictions.setdefault(label, []).append((t, float(snap.counters.evictions)))


def _vitals_from_logs(timeline: Timeline, logs: Sequence[str]) -> None:
    from radixtop.session.vitals import HISTORY_S, Vitals, log_observations

    vitals = Vitals(history_s=HISTORY_S * 4)
    for path in logs:
        vitals.feed_log(log_observations(_tail_lines(path)))
    for key, series in vitals.series.items():
        if series.points:
            timeline.vitals[key] = [(float(t), float(v)) for t, v in series.points]
            timeline.sources[key] = "log"


def _tail_lines(path: str) -> list[str]:
    """The lines of the tail the bundle keeps of the log (none of a FIFO, stdin or a .gz)."""
    from radixtop.incident.bundle.evidence import read_tail

    try:
        return read_tail(path)[0].decode("utf-8", "replace").splitlines()
    except (OSError, ValueError):
        return []


def _marks_of(report: Any) -> list[tuple[float, str]]:
    if report is None:
        return []
    return [(f.first.epoch, f.signature.title) for f in report.findings if f.first.epoch is not None]


# -- across nodes ---------------------------------------------------------------------------------


def to_json(timeline: Timeline) -> dict[str, Any]:
    """The figures as timeline.json holds them (epoch seconds on the clock of the node that wrote them)."""
    return {
        FORMAT: 1,
        "vitals": {k: [list(p) for p in pts] for k, pts in timeline.vitals.items()},
        "sources": dict(timeline.sources),
        "locked": {k: [list(p) for p in pts] for k, pts in timeline.locked.items()},
        "evictions": {k: [list(p) for p in pts] for k, pts in timeline.evictions.items()},
        "marks": [[t, label] for t, label in timeline.marks],
    }


def from_json(doc: Any) -> Timeline:
    """Another node's timeline.json (bounded.load_json's value), every field checked; ValueError
    (one line naming the field) for what is not one."""
    if not isinstance(doc, dict) or doc.get(FORMAT) != 1:
        raise ValueError(f"not a timeline (no {FORMAT}: 1)")
    timeline = Timeline()
    for kind in ("vitals", "locked", "evictions"):
        setattr(timeline, kind, _series(doc.get(kind, {}), kind))
    sources = doc.get("sources", {})
    if not isinstance(sources, dict):
        raise ValueError("sources: not an object")
    timeline.sources = {_label(k, "sources"): _label(v, "sources") for k, v in list(sources.items())[:MAX_SERIES]}
    marks = doc.get("marks", [])
    if not isinstance(marks, list):
        raise ValueError("marks: not a list")
    for mark in marks[:MAX_POINTS]:
        if not (isinstance(mark, list) and len(mark) == 2):
            raise ValueError("marks: each is [time, label]")
        timeline.marks.append((_number(mark[0], "marks"), _label(mark[1], "marks")))
    timeline.marks.sort()
    return timeline


def _series(value: Any, kind: str) -> dict[str, list[tuple[float, float]]]:
    if not isinstance(value, dict):
        raise ValueError(f"{kind}: not an object")
    if len(value) > MAX_SERIES:
        raise ValueError(f"{kind}: more than {MAX_SERIES} series")
    out: dict[str, list[tuple[float, float]]] = {}
    for key, points in value.items():
        if not isinstance(points, list) or len(points) > MAX_POINTS:
            raise ValueError(f"{kind}: a series is a list of at most {MAX_POINTS} points")
        pairs = []
        for point in points:
            if not (isinstance(point, list) and len(point) == 2):
                raise ValueError(f"{kind}: each point is [time, value]")
            pairs.append((_number(point[0], kind), _number(point[1], kind)))
        out[_label(key, kind)] = sorted(pairs)
    return out


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) > 1e15:
        raise ValueError(f"{what}: {printable_line(repr(value), 40)} is not a number")
    return float(value)


def _label(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what}: a name is not a string")
    return printable_line(value, MAX_LABEL)


def shifted(timeline: Timeline, offset_s: float, node: str) -> Timeline:
    """A node's figures on this node's clock: its times minus `offset_s` (its clock minus this
    one's), tagged with `node`."""
    def move(series: dict[str, list[tuple[float, float]]]) -> dict[str, list[tuple[float, float]]]:
        return {k: [(t - offset_s, v) for t, v in pts] for k, pts in series.items()}

    return replace(timeline, vitals=move(timeline.vitals), sources=dict(timeline.sources),
                   locked=move(timeline.locked), evictions=move(timeline.evictions),
                   marks=[(t - offset_s, label) for t, label in timeline.marks], node=node)


def events(parts: Sequence[Timeline]) -> list[dict[str, Any]]:
    """Every node's first signatures, earliest first, each with its node: the order of events
    across nodes once each node's clock is corrected."""
    found = [{"time": round(t, 6), "when": _when(t), "node": part.node, "event": label}
             for part in parts for t, label in part.marks]
    return sorted(found, key=lambda e: (e["time"], e["node"]))


# -- drawing --------------------------------------------------------------------------------------

# (row title, [(series key, legend name)]); a row without data is left out.
_ROWS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("token usage", (("token_usage", "token usage"), ("gpu_memory", "GPU memory"))),
    ("requests", (("running", "running requests"), ("queued", "queued requests"))),
    ("evicted tokens/s", (("evicted_tokens", "evicted tokens/s"),)),
    ("retractions", (("retracted", "retracted requests"),)),
    ("cache hit rate", (("cache_hit_rate", "cache hit rate"),)),
)


_RATIO_ROWS = frozenset({"token usage", "cache hit rate"})


def _shown(text: str) -> str:
    """`text` as plotly shows it literally: plotly reads a subset of HTML in every text it draws
    (links, styled spans, line breaks), so <, > and & become entities, and controls and bidi
    overrides are replaced (textsafe). Signature titles and the bundle's reason are the user's."""
    return html.escape(printable(text), quote=False)


def _when(t: float) -> str:
    return dt.datetime.fromtimestamp(t).isoformat(timespec="milliseconds")


def render_html(timeline: Timeline | Sequence[Timeline], title: str) -> str:
    """The page: plotly.js inlined (no network needed), one row per kind of figure; with several
    nodes' parts, each series and mark is named by its node."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    parts = [timeline] if isinstance(timeline, Timeline) else list(timeline)
    rows: list[tuple[str, list[tuple[str, list[tuple[float, float]]]]]] = []
    for row_title, members in _ROWS:
        traces = []
        for part in parts:
            for key, name in members:
                if part.vitals.get(key):
                    source = part.sources.get(key, "")
                    shown = f"{name} ({source})" if source else name
                    traces.append((_tagged(part.node, shown, ", "), part.vitals[key]))
        if traces:
            rows.append((row_title, traces))
    if any(pts for part in parts for pts in part.locked.values()):
        rows.append(("locked tokens", [
            (f"locked tokens, {_tagged(part.node, label, ' ')}", pts)
            for part in parts for label, pts in sorted(part.locked.items())
        ]))
    if any(len(pts) > 1 for part in parts for pts in part.evictions.values()):
        rows.append(("evictions", [
            (f"evictions, {_tagged(part.node, label, ' ')}", pts)
            for part in parts for label, pts in sorted(part.evictions.items())
        ]))
    marks = sorted((t, _tagged(part.node, label, ": ", first=True)) for part in parts for t, label in part.marks)
    marks = marks[:MAX_MARKS]
    count = max(1, len(rows))
    fig = make_subplots(rows=count, cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        subplot_titles=[r[0] for r in rows] or ["nothing to plot"])
    for i, (_, traces) in enumerate(rows, 1):
        for name, points in traces:
            fig.add_trace(
                go.Scatter(x=[_when(t) for t, _ in points], y=[v for _, v in points], name=name,
                           mode="lines+markers" if len(points) < 3 else "lines"),
                row=i, col=1,
            )
    for n, (t, label) in enumerate(marks):
        fig.add_vline(x=_when(t), line_dash="dash", line_color="firebrick", row="all", col=1)
        # Labels stack above the plot, one line each: first signatures come seconds apart.
        fig.add_annotation(
            x=_when(t), y=1.0, yref="paper", xanchor="left", yanchor="bottom", showarrow=False,
            text=f"{_when(t)[11:]} {_shown(label)}", font={"color": "firebrick", "size": 11},
            yshift=4 + 15 * (len(marks) - 1 - n),
        )
    for i, (row_title, _) in enumerate(rows, 1):
        if row_title in _RATIO_ROWS:
            fig.update_yaxes(range=[0, 1.05], row=i, col=1)
    fig.update_layout(
        title={"text": _shown(title), "y": 0.995, "yanchor": "top"},
        height=200 * count + 120 + 15 * len(marks),
        template="plotly_white", legend={"orientation": "h", "y": -0.04},
        margin={"t": 90 + 15 * len(marks)},
    )
    page: str = fig.to_html(include_plotlyjs=True, full_html=True, config={"displaylogo": False})  # plotly is untyped
    return page


def _tagged(node: str, text: str, sep: str, *, first: bool = False) -> str:
    """`text` named by its node (in a bundle across nodes), node first for a mark, last for a series."""
    if not node:
        return text
    return f"{node}{sep}{text}" if first else f"{text}{sep}{node}"
