"""How long the server takes to load: its own last start-up, read from its log.

SGLang (and the simulator) logs ``server_args=ServerArgs(...)`` as it starts and ``The server is
fired up and ready to roll!`` once it serves; the time between the last pair is what a server
started with the same flags on the same node can be expected to take. The plan shows it for each
start it may make, so a user weighs a restart in minutes, not in steps.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from radixtop.diagnosis.logline import parse_line

__all__ = ["startup_seconds"]

TAIL_BYTES = 8 << 20  # a long-running server's start is usually near the end of what it has written
START_MARK = "server_args="
READY_MARK = "fired up and ready to roll"


def _tail_lines(path: str) -> list[str]:
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - TAIL_BYTES))
            data = fh.read(TAIL_BYTES)
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()


def startup_seconds(paths: Sequence[str]) -> float | None:
    """Seconds from the last start line to the ready line after it, over the given logs; None
    when no log holds both with timestamps."""
    best: float | None = None
    for path in paths:
        started: float | None = None
        found: float | None = None
        for text in _tail_lines(path):
            if START_MARK in text:
                started = parse_line(text).epoch
            elif READY_MARK in text and started is not None:
                ready = parse_line(text).epoch
                if ready is not None and ready >= started:
                    found = ready - started
                started = None
        if found is not None:
            best = found if best is None else max(best, found)
    return None if best is None else round(best, 1)
