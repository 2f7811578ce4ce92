"""SGLang's own corruption detectors, for the servers a confirmation run starts (``--detectors``).

A corruption found at the end (a divergence, a crash) is caught at its cause when the server
checks itself while it runs; SGLang 0.5.23 has three such checks, each with a line of its own that
the catalog knows (``kv-page-use-after-free``, ``kv-double-free``, ``kv-pool-memory-leak``,
``kv-canary-violation``):

* ``SGLANG_CHECK_KV_PAGE_INVARIANTS=1``: every page a request owns is checked against the free
  pool (a use after free, a double free) at each busy check;
* ``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY=1``: the pool's accounting is checked while
  requests run, not only when idle, and a leak fails at once (quietly otherwise);
* ``--kv-canary log --kv-canary-sweep-interval N``: a canary in every KV slot, verified per forward
  and swept over the whole pool every N steps; Triton kernels, so only on a GPU.

They cost time per step, which may move a race: the plan lists them, and they are off by default.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DETECTOR_ENV", "SWEEP_INTERVAL", "detectors"]

DETECTOR_ENV = {"SGLANG_CHECK_KV_PAGE_INVARIANTS": "1", "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1"}
SWEEP_INTERVAL = 64  # forward steps between full-pool canary sweeps


def _on_cpu(flags: Sequence[str], env: dict[str, str]) -> bool:
    from radixtop.incident.confirm.control_server import flag_value

    return flag_value(flags, "--device") == "cpu" or env.get("SGLANG_USE_CPU_ENGINE", "") not in ("", "0")


def detectors(kind: str, flags: Sequence[str], env: dict[str, str]) -> tuple[list[str], dict[str, str], list[str]]:
    """(flags, env, changes) of a started server with SGLang's detectors on, where its kind has them."""
    from radixtop.incident.confirm.control_server import flag_value, set_flag

    if kind != "sglang":
        return list(flags), env, ["--detectors: the simulator has none of SGLang's detectors; none added"]
    out, changes = list(flags), [f"detectors: {k}={v}" for k, v in DETECTOR_ENV.items()]
    if _on_cpu(flags, env):
        changes.append("detectors: the KV canary runs Triton kernels (a GPU): left out on the CPU")
    elif flag_value(out, "--kv-canary") in (None, "none"):
        out = set_flag(set_flag(out, "--kv-canary", "log"), "--kv-canary-sweep-interval", str(SWEEP_INTERVAL))
        changes.append(f"detectors: --kv-canary log --kv-canary-sweep-interval {SWEEP_INTERVAL}")
    return out, {**env, **DETECTOR_ENV}, changes
