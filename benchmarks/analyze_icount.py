"""One `radixtop analyze` run of analyze_bench.py's trace, for counting instructions under valgrind.

The trace of N requests is made, analyzed with the cyclic collector off, and the process leaves
with ``os._exit``, so that neither the collector's passes over the trace nor the interpreter's
teardown count. Two counts, 1,400 and 400 requests: their difference over 1,000 is the
instructions per request, without the interpreter's start-up and the imports::

    for n in 400 1400; do
        PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$n.out \\
            python benchmarks/analyze_icount.py $n 2>&1 | grep Collected
    done

Making the trace (about 24,000 instructions a request) is in both counts; analyze_bench.py makes
it outside its timing.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analyze_bench import CONFIG, make_trace  # noqa: E402  (benchmarks/ is the script's own directory)

from radixtop.incident.analyze.analyze import analyze  # noqa: E402


def main() -> None:
    gc.disable()
    result = analyze(make_trace(int(sys.argv[1])), CONFIG)
    print(f"hit rate {result.summary.hit_rate:.6f}", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
