"""Bad input as one error type, and what radixtop's exit statuses mean."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["ExitStatus", "UsageError"]


class UsageError(Exception):
    """Bad input from the user (a flag, a file, a URL): printed as one line saying what to do,
    then exit status USAGE."""


class ExitStatus(IntEnum):
    """Every command's exit status; scripts read these numbers, so they never change."""

    OK = 0
    # The command ran and the answer is no: a bundle fails its manifest, a plan is not approved,
    # a verdict is inconclusive, the simulated server died.
    ERROR = 1
    USAGE = 2  # a UsageError: one line on stderr says what to do
    INTERRUPTED = 130  # Ctrl-C or SIGTERM stopped it cleanly (128 + SIGINT, as a shell reports)
    PIPE_CLOSED = 141  # whoever read the output stopped (`| head`): 128 + SIGPIPE, as a shell reports
