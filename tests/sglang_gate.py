"""Whether the real-SGLang tests can run here: sglang 0.5.23 on a CPU torch, the environment
.ci/sglang-tests builds. Where it is missing they are skipped; with RADIXTOP_REQUIRE_SGLANG=1 (what
.ci/sglang-tests sets) a missing piece is an error instead, so CI cannot pass by skipping them."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

HELPERS = Path(__file__).resolve().parent / "sglang"  # real_cache, scheduler_child, launch_target
if str(HELPERS) not in sys.path:
    sys.path.insert(0, str(HELPERS))


def why_not(*modules: str) -> str | None:
    """None when sglang, torch and `modules` import; else why not, in one line."""
    try:
        for name in ("sglang.srt.mem_cache.radix_cache", "torch", *modules):
            importlib.import_module(name)
    except ImportError as exc:
        why = f"needs sglang==0.5.23 on a CPU torch (the environment .ci/sglang-tests builds): {exc}"
        if os.environ.get("RADIXTOP_REQUIRE_SGLANG") == "1":
            raise RuntimeError(f"RADIXTOP_REQUIRE_SGLANG=1 but {why}") from None
        return why
    return None
