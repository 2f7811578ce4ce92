"""Whether the real-SGLang tests can run here: sglang 0.5.23 on a CPU torch, the environment
.ci/sglang-tests builds. Where it is missing they are skipped; with RADIXTOP_REQUIRE_SGLANG=1 (what
.ci/sglang-tests sets) a missing piece is an error instead, so CI cannot pass by skipping them."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from functools import cache
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


REPO = Path(__file__).resolve().parent.parent
# What .ci/sglang-tests hashes into its environment's key, in its order.
_KEYED = ("requirements/sglang-cpu.txt", "tests/sglang/torchvision_stub.py", "tests/sglang/sgl_kernel_standin.py")


def sglang_python() -> str | None:
    """The real-SGLang environment's interpreter: $RADIXTOP_SGLANG_PYTHON, else the one
    .ci/sglang-tests built for this checkout's pins (found by the same key); None when neither."""
    given = os.environ.get("RADIXTOP_SGLANG_PYTHON")
    if given:
        return given
    import hashlib

    key = hashlib.sha256(b"".join((REPO / p).read_bytes() for p in _KEYED)).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "radixtop-ci"
    venv = cache / f"sglang-py{sys.version_info[0]}.{sys.version_info[1]}-{key}"
    return str(venv / "bin" / "python") if (venv / ".complete").is_file() else None


@cache
def _radixtop_in(python: str) -> str:
    """Where the environment's interpreter imports radixtop from ("" when it cannot)."""
    code = "import radixtop, sys; sys.stdout.write(radixtop.__path__[0])"
    # From /, as a server starts elsewhere: `python -c` would otherwise find this checkout in the cwd.
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, check=False, cwd="/")
    return out.stdout.strip() if out.returncode == 0 else ""


def why_no_server() -> str | None:
    """None when a real SGLang server can be started here; else why not, in one line (an error
    under RADIXTOP_REQUIRE_SGLANG=1 or RADIXTOP_REQUIRE_SGLANG_SERVER=1, so CI cannot pass by
    skipping; the second is for the default environment, which has no sglang of its own).
    The environment's radixtop must be this checkout's: its plugin is the code under test, and the
    cached environment is shared by every checkout on the machine (the last build points it)."""
    python = sglang_python()
    if python is None:
        why = ("needs the real-SGLang environment: run `bash .ci/sglang-tests --build-only` "
               "(or set RADIXTOP_SGLANG_PYTHON)")
    else:
        found = _radixtop_in(python)
        if found and Path(found).resolve() == (REPO / "radixtop").resolve():
            return None
        why = (f"the real-SGLang environment imports radixtop from {found or 'nowhere'}, not from this checkout: "
               "run `bash .ci/sglang-tests --build-only` here")
    if "1" in (os.environ.get("RADIXTOP_REQUIRE_SGLANG"), os.environ.get("RADIXTOP_REQUIRE_SGLANG_SERVER")):
        raise RuntimeError(f"RADIXTOP_REQUIRE_SGLANG=1 but the suite {why}")
    return why
