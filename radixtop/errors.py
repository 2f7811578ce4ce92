"""The one error every command turns into a single line on stderr and exit status 2."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(Exception):
    """Bad input from the user (a flag, a file, a URL): printed as one line saying what to do."""
