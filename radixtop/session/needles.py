"""The plain strings the radix pane and the vitals look for in a batch, found in the ingest's pass.

Besides the catalog's signatures, two readers look at only a few lines of a busy log: the printed
radix tree reader (a tree's rows and what announces one) and the vitals (retractions and vLLM's
stats line); their needles are in `diagnosis/needles.py`. Each found its lines in a pass of its
own over the batch, joining, encoding and scanning it again. `Ingestor` scans once for the
signatures and these needles together, and hands the readers the lines that hold their needles,
as `NeedleLines`. The HTTP access folds keep their own test: an access line is a tenth of a
busy log, and a hit costs more in the matcher than the folds' test of a line.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from radixtop.diagnosis.needles import PRINTED_TREE_NEEDLES, RARE_NEEDLES

NEEDLES: tuple[str, ...] = tuple(dict.fromkeys((*PRINTED_TREE_NEEDLES, *RARE_NEEDLES)))


@dataclass(frozen=True, slots=True)
class NeedleLines:
    """Which lines of a batch hold each needle: indexes into the batch's lines in order (its runs'
    texts one after the other), ascending. A needle no line holds is absent."""

    lines: Mapping[str, Sequence[int]] = field(default_factory=dict)

    def of(self, needles: Iterable[str], start: int = 0, stop: int | None = None) -> list[int]:
        """The lines in [start, stop) holding any of `needles`, ascending, counted from `start`."""
        found: set[int] = set()
        for needle in needles:
            lines = self.lines.get(needle, ())
            lo = bisect_left(lines, start)
            hi = len(lines) if stop is None else bisect_left(lines, stop, lo)
            found.update(lines[lo:hi])
        return sorted(line - start for line in found)

    def found(self, start: int, stop: int) -> frozenset[str]:
        """The needles some line in [start, stop) holds."""
        out = []
        for needle, lines in self.lines.items():
            i = bisect_left(lines, start)
            if i < len(lines) and lines[i] < stop:
                out.append(needle)
        return frozenset(out)
