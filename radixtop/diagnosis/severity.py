"""Severity: the one ordered type every part compares and names (catalog, findings, the log pane,
the scan, the bundle's trigger, the confirmation run's threshold)."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["NAMES", "Severity", "rank", "severity_rank"]


class Severity(IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    CRITICAL = 3

    @property
    def label(self) -> str:
        return self.name.lower()


NAMES: tuple[str, ...] = tuple(s.label for s in Severity)  # lowest first, as the catalog writes them
_BY_NAME = {s.label: s for s in Severity}


def severity_rank(name: str) -> Severity:
    """The severity a catalog name stands for; KeyError for a name that is none."""
    return _BY_NAME[name]


def rank(name: str | None) -> int:
    """Order of a severity name, -1 for a line that matched nothing (every severity outranks it)."""
    found = _BY_NAME.get(name) if name is not None else None
    return -1 if found is None else int(found)
