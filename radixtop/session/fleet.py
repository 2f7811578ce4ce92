"""Which of the fleet's ranks stand out, and why, from Prometheus's figures (probes/fleet.py); and
the state the fleet view and `radixtop fleet` show. Pure: no I/O, no Textual.

A rank stands out for what is wrong on it alone (a lock anomaly, a scrape that is down, radixtop's
hooks off) or for being far from the fleet's median (token usage, locked tokens), the comparison
made only with at least MIN_PEERS ranks to compare, since two ranks have no majority.
"""

from __future__ import annotations

import shlex
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from radixtop.probes.fleet import FleetSample, RankFigures
from radixtop.textsafe import printable

__all__ = ["HEADER", "FleetState", "FleetView", "Standout", "open_command", "rank_row", "standouts"]

MIN_PEERS = 3
USAGE_GAP = 0.30  # token usage this far (absolute, 0-1) from the median: a rank serving another load
LOCKED_GAP = 0.20  # locked tokens this share of the pool above the median's: requests held, or leaked locks

# The weight that orders the list: what breaks the cache first, then what hides a rank.
ANOMALY, DOWN, HOOKS_OFF, FAR = 3, 2, 1, 0


@dataclass(frozen=True, slots=True)
class Standout:
    rank: RankFigures
    reasons: tuple[str, ...]  # each one line; label text inside is made printable
    weight: int

    @property
    def command(self) -> str:
        return open_command(self.rank.node)


def open_command(node: str) -> str:
    """The command that opens a node in the TUI; the node is label text from outside, so it is
    quoted for the shell it will be pasted into and made printable."""
    return f"radixtop --node {shlex.quote(printable(node))}"


def _count(value: float | None) -> int:
    return int(value) if value is not None and value > 0 else 0


def _plural(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"


def _anomalies(r: RankFigures) -> list[str]:
    said = []
    if n := _count(r.negative_lock_ref):
        said.append(_plural(n, "unlock left lock_ref below zero", "unlocks left lock_ref below zero"))
    if n := _count(r.nodes_below_zero):
        said.append(_plural(n, "tree node with lock_ref < 0", "tree nodes with lock_ref < 0"))
    if n := _count(r.lock_failures):
        said.append(_plural(n, "lock call raised", "lock calls raised"))
    if n := _count(r.unlock_failures):
        said.append(_plural(n, "unlock call raised", "unlock calls raised"))
    return said


def _locked_share(r: RankFigures) -> float | None:
    if r.locked is None or r.capacity is None or r.capacity <= 0:
        return None
    return r.locked / r.capacity


def _median_of(ranks: Sequence[RankFigures], figure: Callable[[RankFigures], float | None]) -> float | None:
    values = [v for r in ranks if r.scrape == "up" and (v := figure(r)) is not None]
    return statistics.median(values) if len(values) >= MIN_PEERS else None


def standouts(ranks: Sequence[RankFigures]) -> tuple[Standout, ...]:
    """The ranks that stand out, the heaviest reason first, then by node and rank."""
    usage_median = _median_of(ranks, lambda r: r.usage)
    locked_median = _median_of(ranks, _locked_share)
    out = []
    for r in ranks:
        reasons: list[str] = []
        weight = -1
        anomalies = _anomalies(r)
        if anomalies:
            reasons += anomalies
            weight = ANOMALY
        if r.scrape == "down":
            reasons.append(f"Prometheus's scrape of {printable(r.instance)} is down (up == 0)")
            weight = max(weight, DOWN)
        elif r.scrape == "gone":
            reasons.append(f"Prometheus no longer scrapes {printable(r.instance)} (seen within the hour)")
            weight = max(weight, DOWN)
        if r.hooks_active == 0 and r.scrape == "up":
            reasons.append("radixtop's hooks are off on it: its lock figures are not counted")
            weight = max(weight, HOOKS_OFF)
        usage = r.usage if r.scrape == "up" else None
        if usage_median is not None and usage is not None and abs(usage - usage_median) >= USAGE_GAP:
            reasons.append(f"token usage {usage:.2f}, the fleet's median {usage_median:.2f}")
            weight = max(weight, FAR)
        share = _locked_share(r) if r.scrape == "up" else None
        if locked_median is not None and share is not None and share - locked_median >= LOCKED_GAP:
            reasons.append(f"{r.locked:,.0f} tokens locked ({share:.0%} of the pool), the fleet's median "
                           f"{locked_median:.0%}")
            weight = max(weight, FAR)
        if reasons:
            out.append(Standout(r, tuple(reasons), weight))
    return tuple(sorted(out, key=lambda s: (-s.weight, s.rank.sort_key)))


@dataclass(frozen=True, slots=True)
class FleetView:
    """What the fleet view shows at one moment: the last ranks Prometheus gave (kept while it is
    down) and which stand out."""

    url: str
    sample: FleetSample | None  # the latest poll's
    ranks: tuple[RankFigures, ...]  # the latest good poll's
    ranks_time: float | None  # when those were read
    standouts: tuple[Standout, ...]

    @property
    def nodes(self) -> int:
        return len({r.node for r in self.ranks})


class FleetState:
    """The fleet's samples folded: a poll that failed keeps the last ranks, marked by its status."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.version = 0
        self._view = FleetView(url, None, (), None, ())

    def apply(self, sample: FleetSample) -> None:
        view = self._view
        if sample.status.state in ("ok", "degraded"):
            view = FleetView(self.url, sample, sample.ranks, sample.time, standouts(sample.ranks))
        else:
            view = FleetView(self.url, sample, view.ranks, view.ranks_time, view.standouts)
        self._view = view
        self.version += 1

    @property
    def view(self) -> FleetView:
        return self._view


# The table both `radixtop fleet` and the fleet view print, one row per rank.
NODE_WIDTH = 24
HEADER = (f"{'NODE':<{NODE_WIDTH}} {'RANK':>5} {'SCRAPE':<6} {'USAGE':>6} {'LOCKED':>10} {'EVICTIONS':>10} "
          f"{'LOCK ANOMALIES':>14} {'NODES LOCK<0':>12}")


def _figure(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def rank_row(r: RankFigures) -> str:
    """One table row; label text made printable and cut to its column."""
    usage = "—" if r.usage is None else f"{r.usage:.2f}"
    return (f"{_cut(printable(r.node), NODE_WIDTH):<{NODE_WIDTH}} {_cut(printable(r.rank), 5):>5} {r.scrape:<6} "
            f"{usage:>6} {_figure(r.locked):>10} {_figure(r.evictions):>10} {_figure(r.lock_anomalies):>14} "
            f"{_figure(r.nodes_below_zero):>12}")
