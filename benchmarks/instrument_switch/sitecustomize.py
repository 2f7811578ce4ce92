"""For benchmarks/server_cost_bench.py --switch: in an SGLang scheduler process started with
RADIXTOP_INSTRUMENT=1, the instrument is on while the file RADIXTOP_BENCH_SWITCH names exists
and off otherwise, switched at the scheduler's safe point (on its own thread, between two loop
iterations, as the instrument attaches). Off is what SafePoints.close() leaves: no hooks on the
cache, no endpoint, no census; only this check, once a quarter second, stays in the loop.

Each switch is acknowledged in the file's name + ".ack" ("1" on, "0" off), so that the benchmark
measures only once the scheduler has switched. Python imports this file at start-up from
PYTHONPATH in every process of the server; it waits (bounded) for radixtop's safe point, which
only a scheduler process loads."""

import os
import sys
import threading
import time

_FLAG = os.environ.get("RADIXTOP_BENCH_SWITCH")
_CHECK_EVERY_S = 0.25


def _install() -> None:
    for _ in range(1200):  # 5 minutes: a scheduler loads the plugin while the server starts
        glue = sys.modules.get("radixtop.instrument.sglang")
        if glue is not None and hasattr(glue, "SAFE_POINTS"):
            break
        time.sleep(0.25)
    else:
        return
    safe_points = glue.SAFE_POINTS
    at = safe_points.at
    state = {"on": True, "checked": 0.0, "unsaid": True}

    def switched_at(scheduler: object) -> None:
        now = time.monotonic()
        if now - state["checked"] >= _CHECK_EVERY_S:
            state["checked"] = now
            want = os.path.exists(_FLAG)
            if want != state["on"]:
                state["on"], state["unsaid"] = want, True
                if want:
                    safe_points.disabled = False  # the next call attaches afresh
                else:
                    safe_points.close()
                    safe_points.disabled = True
        if state["on"]:
            at(scheduler)
        if state["unsaid"]:
            state["unsaid"] = False
            # On means attached again: hooks on the cache and the endpoint serving.
            _acknowledge("0" if not state["on"] else "1" if safe_points.instruments() else "not attached")

    safe_points.at = switched_at


def _acknowledge(what: str) -> None:
    with open(_FLAG + ".ack", "w") as f:
        f.write(what)


if _FLAG:
    threading.Thread(target=_install, name="radixtop-bench-switch", daemon=True).start()
