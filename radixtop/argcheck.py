"""What radixtop's command line and the simulator's share: option checks as argparse ``type=``
functions, each rule worded once, and a parser whose errors are one line.

Standard library only: `radixtop scan` imports this on its way to a grep-fast start.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn

from radixtop.errors import UsageError

__all__ = ["AUTO", "Parser", "at_least", "page_size_or_auto", "within"]

AUTO = "auto"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are a UsageError: one line, the caller prints it."""

    def error(self, message: str) -> NoReturn:
        # argparse says "argument --runs: ..."; the flag alone reads as the user typed it.
        raise UsageError(f"{message.removeprefix('argument ')} (see `{self.prog} --help`)")


def _parse(text: str, kind: type[int] | type[float]) -> int | float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a {'whole ' if kind is int else ''}number, got {text!r}") from None


def _shown(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def at_least(minimum: int) -> Callable[[str], int]:
    """A whole number no smaller than ``minimum``."""

    def check(text: str) -> int:
        value = int(_parse(text, int))
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return check


def within(low: int, high: int, kind: type[int] | type[float] = int) -> Callable[[str], float]:
    """A number of ``kind`` in ``low..high``, both included."""

    def check(text: str) -> float:
        value = _parse(text, kind)
        if not low <= value <= high:  # NaN is never within
            raise argparse.ArgumentTypeError(f"must be within {low}..{high}, got {_shown(value)}")
        return value

    return check


def page_size_or_auto(text: str) -> int | str:
    """A page size in tokens, or ``auto`` (the server's, asked for later)."""
    if text == AUTO:
        return AUTO
    try:
        return at_least(1)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be a number of tokens (at least 1) or auto, got {text!r}") from None
