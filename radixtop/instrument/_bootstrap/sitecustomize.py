"""radixtop's launcher bootstrap: Python runs this at start-up in every process of a server started
with `python -m radixtop.instrument.launcher` (the launcher puts this folder first on PYTHONPATH, and
SGLang's spawned scheduler processes inherit it). It first runs the sitecustomize it shadows, if
any, then, with RADIXTOP_INSTRUMENT=1, arms radixtop's watch for SGLang's scheduler module.
Standard library only until that module is imported; it never raises.
"""

import os
import sys


def _radixtop_bootstrap() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        import importlib.machinery
        import importlib.util

        rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is not None and spec.loader is not None:
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except Exception as exc:
        sys.stderr.write(f"radixtop: the shadowed sitecustomize failed: {type(exc).__name__}: {exc}\n")
    if os.environ.get("RADIXTOP_INSTRUMENT") != "1":
        return
    try:
        from radixtop.instrument.launcher import arm
    except ImportError as exc:
        sys.stderr.write(f"radixtop: not importable by {sys.executable} ({exc}); this process runs uninstrumented\n")
        return
    arm()


_radixtop_bootstrap()
del _radixtop_bootstrap
