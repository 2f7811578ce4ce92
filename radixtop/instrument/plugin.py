"""SGLang's plugin entry point (group `sglang.srt.plugins`, declared in radixtop's pyproject).

SGLang >= 0.5.12 calls `register()` with no arguments from `sglang.srt.plugins.load_plugins()`
in every process it starts (the server, the detokenizer, each scheduler), then applies what was
registered with HookRegistry. radixtop does nothing unless RADIXTOP_INSTRUMENT=1 is set in the
server's environment: then, in a process that holds SGLang's scheduler, it registers one AROUND
hook on `Scheduler.process_input_requests` (the scheduler loop's safe point, see sglang.py),
which attaches to the scheduler's tree cache on the first loop iteration.

Off, register() costs one environment lookup. It imports nothing heavy: not sglang (the
registry it needs is already loaded by the caller), not the rest of radixtop until enabled.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("radixtop.instrument")


def register() -> None:
    """The entry point. Never raises: SGLang logs and carries on, but so do we."""
    if os.environ.get("RADIXTOP_INSTRUMENT") != "1":
        return
    try:
        _register()
    except Exception as exc:
        log.error(
            "radixtop: plugin registration failed (%s: %s); the server runs uninstrumented", type(exc).__name__, exc
        )


def _register() -> bool:
    from radixtop.instrument import sglang as glue

    module = sys.modules.get(glue.SCHEDULER_MODULE)
    if module is None:
        # The server, the detokenizer, the tokenizer: no scheduler loop here, nothing to hook
        # (registering would make HookRegistry import the scheduler module into this process).
        log.debug("radixtop: no SGLang scheduler in process %d; nothing to hook here", os.getpid())
        return False
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except ImportError as exc:
        log.error(
            "radixtop: this SGLang has no plugin hook registry (%s; it arrived in 0.5.12): start the server "
            "with `python -m radixtop.instrument.launcher <sglang.launch_server args>` instead",
            exc,
        )
        return False
    scheduler_cls = getattr(module, "Scheduler", None)
    current = getattr(scheduler_cls, glue.SAFE_POINT_METHOD, None)
    if current is None:
        log.error(
            "radixtop: %s has no %s; this SGLang is not supported, the server runs uninstrumented",
            glue.SCHEDULER_MODULE + ".Scheduler", glue.SAFE_POINT_METHOD,
        )
        return False
    if glue.is_instrumented(current):
        log.info("radixtop: the scheduler is already instrumented (radixtop.instrument.launcher); plugin route skipped")
        return False
    HookRegistry.register(glue.SAFE_POINT_TARGET, glue.around_process_input_requests, HookType.AROUND)
    log.info("radixtop: instrumentation registered on %s (pid %d)", glue.SAFE_POINT_TARGET, os.getpid())
    return True
