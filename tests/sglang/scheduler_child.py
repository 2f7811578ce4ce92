"""A stand-in SGLang scheduler process, started the way SGLang starts one (multiprocessing spawn).

SGLang's own scheduler process (run_scheduler_process) needs a model and a GPU, so the child
does what that function does up to the loop, for real: the scheduler module is imported (spawn
unpickles the target from there), `sglang.srt.plugins.load_plugins()` runs, and then the loop's
per-iteration call `scheduler.process_input_requests(recv_reqs)` is made on a Scheduler object
(built without its __init__) whose tree_cache is a real RadixCache driven by a scheduler-shaped
workload. radixtop's safe point runs first; SGLang's body then fails on the bare object (an
AttributeError for an attribute __init__ would have set, raised in sglang's code), which is expected
and ignored; any other error surfaces in the report. The child reports what it saw over a pipe
and serves until told to stop.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from typing import Any


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _iteration(scheduler: Any) -> None:
    try:
        scheduler.process_input_requests([])
    except AttributeError as exc:
        # Expected only as SGLang's own body on a scheduler built without __init__: an attribute
        # missing on this scheduler, raised in sglang's code. Anything else is a failure to see.
        frames = traceback.extract_tb(exc.__traceback__)
        where = frames[-1].filename if frames else ""
        in_sglang = f"{os.sep}sglang{os.sep}" in where and f"{os.sep}radixtop{os.sep}" not in where
        if exc.obj is not scheduler or not in_sglang:
            raise


def _figures(cache: Any) -> dict:
    import real_cache

    f = real_cache.walk(cache)
    alloc = cache.token_to_kv_pool_allocator
    return {
        "evictable_size": cache.evictable_size(),
        "protected_size": cache.protected_size(),
        "available": alloc.available_size(),
        "capacity": alloc.size,
        "nodes": f.nodes,
        "tokens": f.tokens,
        "evictable": f.evictable,
        "protected": f.protected,
        "histogram": {str(k): v for k, v in f.histogram.items()},
    }


def run(conn: Any, route: str, tp_rank: int = 0, requests: int = 40) -> None:
    """route "plugin": SGLang >= 0.5.12 (load_plugins applies radixtop's entry point);
    route "launch": started under python -m radixtop.instrument.launcher (load_plugins runs as well,
    as it does in 0.5.23, and the plugin must stand aside)."""
    collect = _Collect()
    logging.getLogger("radixtop").addHandler(collect)
    logging.getLogger("radixtop").setLevel(logging.INFO)
    report: dict[str, Any] = {"route": route, "pid": os.getpid()}
    try:
        import sglang.srt.managers.scheduler as scheduler_module
        from sglang.srt.plugins import load_plugins
        from sglang.srt.plugins.hook_registry import HookRegistry

        import radixtop
        from radixtop.instrument import sglang as glue

        report["radixtop_file"] = radixtop.__file__  # which checkout this process runs
        report["watched_before_plugins"] = glue.is_instrumented(scheduler_module.Scheduler.process_input_requests)
        load_plugins()
        report["instrumented"] = glue.is_instrumented(scheduler_module.Scheduler.process_input_requests)
        report["registry_hooks"] = len(HookRegistry._hooks.get(glue.SAFE_POINT_TARGET, []))
        report["registry_applied"] = glue.SAFE_POINT_TARGET in HookRegistry._patched

        import real_cache

        scheduler = scheduler_module.Scheduler.__new__(scheduler_module.Scheduler)
        scheduler.tp_rank = tp_rank  # where SGLang before 0.5.23 keeps it
        scheduler.tree_cache = cache = real_cache.radix_cache(size=600)
        driver = real_cache.Driver(cache)
        for _ in range(requests):
            _iteration(scheduler)
            driver.request()
        # Unlock one running request twice: the classic double unlock.
        node, receipt = driver.running[0]
        driver.unlock(node, receipt)
        driver.unlock(node, receipt)
        driver.running.pop(0)
        changed = time.monotonic()
        report["double_unlocked_node"] = node.id
        inst = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # iterate until a snapshot with a census after the last change
            instruments = glue.SAFE_POINTS.instruments()
            if instruments:
                instruments[0].endpoint.want_capture()  # a reader asking (captures are on demand)
            _iteration(scheduler)
            instruments = glue.SAFE_POINTS.instruments()
            inst = instruments[0] if instruments else None
            snap = inst.endpoint.latest()[0] if inst is not None else None
            if (
                snap is not None
                and snap.census is not None
                and snap.census.complete
                and snap.monotonic - snap.census.age_s >= changed
            ):
                break
            time.sleep(0.02)
        report["port"] = inst.endpoint.port if inst is not None else None
        report["figures"] = _figures(cache)
        report["tally"] = vars(driver.tally)
    except Exception:
        report["error"] = traceback.format_exc()
    report["logs"] = collect.lines
    conn.send(report)
    # Keep serving until the parent has read the endpoint (bounded: never outlive a lost parent).
    conn.poll(120)
    sys.exit(0)
