"""Start an SGLang server with radixtop's instrumentation, for releases without the plugin API.

    python -m radixtop.instrument.launcher [--module sglang.launch_server] <sglang.launch_server args>

SGLang before 0.5.12 loads no plugins, so radixtop needs another way into the scheduler
processes, which SGLang starts with multiprocessing's spawn (fresh interpreters). The launcher
sets RADIXTOP_INSTRUMENT=1, puts radixtop/instrument/_bootstrap first on PYTHONPATH (its
sitecustomize.py runs at every interpreter start in the server's process tree, and runs the
sitecustomize it shadows first), and replaces itself with `python -m sglang.launch_server <args>`:
the server's own command line, unchanged. In each process the bootstrap calls arm(), which
watches for the import of sglang.srt.managers.scheduler and then wraps
Scheduler.process_input_requests with the same safe point the plugin registers (sglang.py).
On SGLang >= 0.5.12 the launcher works too; the plugin then sees the wrapper and stands aside.

Everything after the optional `--module NAME` goes to that module untouched (so `--help` is
SGLang's). This module imports only the standard library until the scheduler module loads.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Sequence
from typing import Any

ENV_ENABLE = "RADIXTOP_INSTRUMENT"
SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
DEFAULT_MODULE = "sglang.launch_server"
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")


def _say(message: str) -> None:
    # Before SGLang configures logging, stderr is the one place a line is sure to be seen.
    sys.stderr.write(f"radixtop: {message}\n")


class _SchedulerWatch(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when the scheduler module is being imported it asks the other finders
    for its spec and wraps that loader's exec_module, so the Scheduler class is patched as soon as
    the module has run, before any scheduler can start its loop."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != SCHEDULER_MODULE:
            return None
        try:
            spec = None
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
            loader = getattr(spec, "loader", None)
            exec_module = getattr(loader, "exec_module", None)
            if loader is None or exec_module is None:
                _say(f"cannot watch {fullname} (no loader to wrap); this process runs uninstrumented")
                return spec

            def exec_and_patch(module: Any) -> None:
                exec_module(module)
                _patch(module)

            loader.exec_module = exec_and_patch  # this spec's own loader instance only
            return spec
        except Exception as exc:
            _say(f"watching {fullname} failed ({type(exc).__name__}: {exc}); this process runs uninstrumented")
            return None


def _patch(module: Any) -> None:
    _disarm()
    try:
        from radixtop.instrument.sglang import patch_scheduler_class

        scheduler = getattr(module, "Scheduler", None)
        if scheduler is None:
            _say(
                f"{SCHEDULER_MODULE} has no Scheduler class; this SGLang is not supported, "
                "the server runs uninstrumented"
            )
        else:
            patch_scheduler_class(scheduler)
    except Exception as exc:
        _say(f"patching the scheduler failed ({type(exc).__name__}: {exc}); the server runs uninstrumented")


def _disarm() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _SchedulerWatch)]


def arm() -> bool:
    """Patch the scheduler now if its module is loaded, else when it is. Idempotent; never raises."""
    try:
        module = sys.modules.get(SCHEDULER_MODULE)
        if module is not None:
            _patch(module)
        elif not any(isinstance(f, _SchedulerWatch) for f in sys.meta_path):
            sys.meta_path.insert(0, _SchedulerWatch())
        return True
    except Exception as exc:
        _say(f"arming failed ({type(exc).__name__}: {exc}); this process runs uninstrumented")
        return False


def child_environment(environ: dict[str, str]) -> dict[str, str]:
    """The server's environment: instrumentation on, the bootstrap first on PYTHONPATH."""
    env = dict(environ)
    env[ENV_ENABLE] = "1"
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *parts])
    return env


def command(argv: Sequence[str]) -> list[str]:
    """The server's argv: `python -m <module> <args>`, with an optional leading `--module NAME`."""
    args = list(argv)
    module = DEFAULT_MODULE
    if args[:1] == ["--module"]:
        if len(args) < 2 or args[1].startswith("-"):
            raise SystemExit("radixtop launch: --module needs a module name, e.g. --module sglang.launch_server")
        module, args = args[1], args[2:]
    elif args and args[0].startswith("--module="):
        module, args = args[0].split("=", 1)[1], args[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    return [sys.executable, "-m", module, *args]


def main(argv: Sequence[str] | None = None) -> None:
    argv = command(sys.argv[1:] if argv is None else argv)
    env = child_environment(dict(os.environ))
    if env.get("RADIXTOP_INSTRUMENT_PORT") is None:
        from radixtop.schema import DEFAULT_BASE_PORT

        _say(f"debug endpoint per rank on 127.0.0.1:{DEFAULT_BASE_PORT}+rank (set RADIXTOP_INSTRUMENT_PORT to move it)")
    try:
        os.execve(sys.executable, argv, env)  # the server takes this process over: same pid, same signals
    except OSError as exc:
        raise SystemExit(f"radixtop launch: could not start {' '.join(argv[:3])}: {exc}") from None


if __name__ == "__main__":
    main()
