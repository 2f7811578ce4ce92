"""Stands in for `sglang.launch_server` under `python -m radixtop.instrument.launcher --module launch_target`.

Like SGLang's server, it starts a scheduler process with multiprocessing's spawn context (see
scheduler_child.py); it prints the child's report as one JSON line on stdout, keeps the child
serving until its own stdin closes, then stops it. The launcher's environment (PYTHONPATH with
radixtop's bootstrap, RADIXTOP_INSTRUMENT=1) reaches the child the way it reaches SGLang's.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys

import scheduler_child


def main() -> None:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=scheduler_child.run, args=(child, "launch", int(sys.argv[1]) if len(sys.argv) > 1 else 0))
    proc.start()
    report = parent.recv() if parent.poll(240) else {"error": "the scheduler child sent nothing in 240 s"}
    report["launcher_env"] = {k: os.environ.get(k, "") for k in ("RADIXTOP_INSTRUMENT", "PYTHONPATH")}
    report["launcher_pid"] = os.getpid()
    print(json.dumps(report), flush=True)
    sys.stdin.read()  # until the test closes our stdin
    parent.send("stop")
    proc.join(30)
    if proc.is_alive():
        proc.kill()


if __name__ == "__main__":
    main()
