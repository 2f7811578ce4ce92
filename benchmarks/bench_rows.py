"""A benchmark's headline figures as rows of the summary table that run_all.py prints.

Each benchmark prints its own report as before and also hands each headline figure to `row`:
when RADIXTOP_BENCH_ROWS names a file (run_all.py sets it), the row is appended there as one
JSON line; otherwise `row` does nothing.
"""

from __future__ import annotations

import json
import os

ENV = "RADIXTOP_BENCH_ROWS"


def row(what: str, radixtop: str, peer: str, target: str = "none", met: bool | None = None) -> None:
    """One figure: what is measured, radixtop's figure, the peer's figure (named) in the same run,
    the target, and whether this run met it (None: no target)."""
    path = os.environ.get(ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"what": what, "radixtop": radixtop, "peer": peer, "target": target, "met": met}) + "\n")
