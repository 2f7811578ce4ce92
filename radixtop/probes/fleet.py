"""The fleet as the fleet's own Prometheus sees it: every rank whose radixtop debug endpoint it
scrapes (the instrument's /metrics, schema.py's names), with the figures the fleet view compares:
the queries, and the typed records their answers fold into (probes/fleet_probe.py asks them).

Three instant queries per poll, within one deadline: the ranks seen in the last hour (so a rank
whose scrape is down still has its row), the scrape health (`up`) of every target in their jobs,
and the current series of the figures. A rank is one (job, instance, rank label); its node is the
target's `node` label (or hostname, host, nodename, kubernetes_node), else the instance's host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from radixtop.probes.status import SourceState
from radixtop.schema import METRIC_NAMES, STATE_METRIC_NAMES

if TYPE_CHECKING:  # the records only: the widgets import this module, and no HTTP through it
    from radixtop.probes.prometheus import Labels, QueryAnswer

__all__ = ["DEFAULT_INTERVAL_S", "DEFAULT_TIMEOUT_S", "QUERIES", "FleetSample", "RankFigures", "Scrape", "fold"]

DEFAULT_INTERVAL_S = 5.0  # Prometheus scrapes every 15 s or so; a poll more often shows nothing new
DEFAULT_TIMEOUT_S = 10.0  # the whole poll, all three queries
LOOKBACK = "1h"  # a rank seen this recently keeps its row after its scrape went down
NODE_LABELS = ("node", "hostname", "host", "nodename", "kubernetes_node")
BELOW_ZERO = "<0"  # radixtop_lock_ref_nodes' bucket of nodes unlocked once too often

Scrape = Literal["up", "down", "gone"]  # up == 1, up == 0, no `up` series (no longer a target)

# The figures read, by the metric that carries each (schema.py names them for the instrument).
_FIGURES = {
    STATE_METRIC_NAMES["capacity_tokens"]: "capacity",
    STATE_METRIC_NAMES["available_tokens"]: "available",
    STATE_METRIC_NAMES["evictable_tokens"]: "evictable",
    STATE_METRIC_NAMES["protected_tokens"]: "locked",
    STATE_METRIC_NAMES["hooks_active"]: "hooks_active",
    METRIC_NAMES["evictions"]: "evictions",
    METRIC_NAMES["negative_lock_ref"]: "negative_lock_ref",
    METRIC_NAMES["lock_failures"]: "lock_failures",
    METRIC_NAMES["unlock_failures"]: "unlock_failures",
}
_BELOW_ZERO_METRIC = STATE_METRIC_NAMES["lock_ref_nodes"]
_SELECTOR = "{__name__=~\"" + "|".join(sorted([*_FIGURES, _BELOW_ZERO_METRIC])) + "\"}"
_KNOWN = f"last_over_time({STATE_METRIC_NAMES['hooks_active']}[{LOOKBACK}])"
QUERIES = {
    "known": _KNOWN,
    "up": f"up and on(job) {_KNOWN}",  # every target of a job that has radixtop ranks
    "figures": _SELECTOR,
}


@dataclass(frozen=True, slots=True)
class RankFigures:
    """One rank as Prometheus last scraped it; a figure is None when Prometheus has none now."""

    node: str  # label text from outside: made printable where it is shown
    rank: str
    instance: str
    job: str
    scrape: Scrape
    capacity: float | None = None
    available: float | None = None
    evictable: float | None = None
    locked: float | None = None  # tokens held by running requests (protected)
    evictions: float | None = None  # evict calls that freed something, since the server started
    negative_lock_ref: float | None = None  # unlocks that left lock_ref below zero
    lock_failures: float | None = None
    unlock_failures: float | None = None
    nodes_below_zero: float | None = None  # tree nodes with lock_ref < 0 at the last census
    hooks_active: float | None = None

    @property
    def usage(self) -> float | None:
        """Token usage as SGLang reports it: used over capacity, evictable tokens counted free."""
        if self.capacity is None or self.available is None or self.capacity <= 0:
            return None
        used = self.capacity - self.available - (self.evictable or 0.0)
        return min(1.0, max(0.0, used / self.capacity))

    @property
    def lock_anomalies(self) -> float | None:
        """Lock and unlock calls that went wrong (below zero, or raised), since the server started;
        None when none of those counters is known. Nodes below zero are a census, counted apart."""
        known = [v for v in (self.negative_lock_ref, self.lock_failures, self.unlock_failures) if v is not None]
        return sum(known) if known else None

    @property
    def sort_key(self) -> tuple[str, int, str, str]:
        rank = int(self.rank) if self.rank.isdigit() and len(self.rank) < 9 else 1 << 30
        return (self.node, rank, self.rank, self.instance)


@dataclass(frozen=True, slots=True)
class FleetSample:
    url: str  # as shown: a password in it masked
    status: SourceState
    time: float  # time.time() of this poll
    ranks: tuple[RankFigures, ...] = ()
    notes: tuple[str, ...] = ()  # what the answers left out


def node_of(labels: Labels) -> str:
    for name in NODE_LABELS:
        value = labels.get(name)
        if value:
            return value
    instance = labels.get("instance")
    try:
        host = urlsplit(f"//{instance}").hostname
    except ValueError:
        host = None
    return host or instance or "?"


def _key(labels: Labels) -> tuple[str, str]:
    return (labels.get("job"), labels.get("instance"))


def fold(known: QueryAnswer, up: QueryAnswer, figures: QueryAnswer) -> tuple[RankFigures, ...]:
    """The answers of QUERIES as one row per rank, ordered by node and rank."""
    health: dict[tuple[str, str], Scrape] = {}
    target_labels: dict[tuple[str, str], Labels] = {}
    for s in up.series:
        health[_key(s.labels)] = "up" if s.value == 1 else "down"
        target_labels[_key(s.labels)] = s.labels
    rows: dict[tuple[str, str, str], dict[str, float | None]] = {}
    labels_of: dict[tuple[str, str, str], Labels] = {}
    for s in known.series:
        key = (*_key(s.labels), s.labels.get("rank", "?"))
        rows.setdefault(key, {})
        labels_of.setdefault(key, s.labels)
    for s in figures.series:
        name = s.labels.get("__name__")
        key = (*_key(s.labels), s.labels.get("rank", "?"))
        row = rows.setdefault(key, {})
        labels_of.setdefault(key, s.labels)
        if name == _BELOW_ZERO_METRIC:
            if s.labels.get("lock_ref") == BELOW_ZERO:
                row["nodes_below_zero"] = s.value
        elif name in _FIGURES:
            row[_FIGURES[name]] = s.value
    seen_targets = {(job, instance) for job, instance, _ in rows}
    for target, labels in target_labels.items():  # a target that never answered with a rank
        if target not in seen_targets:
            rows[(*target, "?")] = {}
            labels_of[(*target, "?")] = labels
    out = [
        RankFigures(node=node_of(labels_of[key]), rank=key[2], instance=key[1], job=key[0],
                    scrape=health.get(key[:2], "gone"), **row)  # the keys are field names
        for key, row in rows.items()
    ]
    return tuple(sorted(out, key=lambda r: r.sort_key))
