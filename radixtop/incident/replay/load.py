"""A looping load generator: replays a trace against a server, a new seed every cycle.

`radixtop demo` runs it as its own process (``python -m radixtop.incident.replay.load --url URL``)
so that the load never competes with the UI's event loop, and so that quitting the demo can stop it
like any other child. Each cycle uses fresh private tokens (the seed changes) while groups keep
sharing their prefixes, so the radix cache keeps growing, evicting and locking as under real traffic.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable

import httpx

from radixtop.incident.replay.replay import replay_once
from radixtop.incident.replay.trace import Trace, TraceError, builtin_trace, load_trace, plan_requests

DEFAULT_TRACE = "demo_pressure"


def _trace(name: str) -> Trace:
    return load_trace(name) if os.path.sep in name or name.endswith(".json") else builtin_trace(name)


async def run_load(url: str, trace_name: str, *, duration_s: float, max_cycles: int,
                   report: Callable[[str], object] = print) -> int:
    """Replay the trace in cycles until the duration or cycle count runs out, or the server dies."""
    trace = _trace(trace_name)
    deadline = time.monotonic() + duration_s
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    # Expire idle connections before the server (keep-alive 5 s) closes them under us.
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64, keepalive_expiry=1.0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=5.0), limits=limits) as client:
        for cycle in range(max_cycles):
            if stopping.is_set() or time.monotonic() >= deadline:
                break
            run = await replay_once(
                client, url, plan_requests(trace, seed=cycle), should_stop=stopping.is_set
            )
            report(f"cycle {cycle}: {len(run.outcomes)} requests, {run.errors} failed, {run.duration_s:.1f} s")
            if run.outcomes and run.errors == len(run.outcomes):
                report("every request failed; the server is down, stopping the load")
                return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m radixtop.incident.replay.load", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    parser.add_argument("--trace", default=DEFAULT_TRACE, help="built-in trace name or a trace file")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds to run at most")
    parser.add_argument("--cycles", type=int, default=10_000, help="replay cycles at most")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(
            run_load(args.url, args.trace, duration_s=args.duration, max_cycles=args.cycles,
                     report=lambda line: print(line, flush=True))
        )
    except TraceError as exc:
        print(f"radixtop load: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
