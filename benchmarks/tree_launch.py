"""Run radixtop from a chosen source tree, whichever radixtop the interpreter has installed.

An editable install (`pip install -e .`) puts a finder for its own tree ahead of `sys.path`, so
`PYTHONPATH=OTHER_TREE python -m radixtop` still runs the installed tree: a before/after run
would compare a tree with itself. The launcher drops that finder and puts the tree first.
"""

from __future__ import annotations

import compileall
import subprocess
import sys
from pathlib import Path

# Drops the editable finder and puts the tree (the first argument) first on sys.path.
SETUP = (
    "import runpy, sys\n"
    "sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith('__editable__')]\n"
    "sys.path.insert(0, sys.argv.pop(1))\n"
)
LAUNCHER = SETUP + "runpy.run_module('radixtop', run_name='__main__', alter_sys=True)\n"


def command(tree: Path, *args: str, python: str = sys.executable) -> list[str]:
    """argv that runs `radixtop ARGS` from `tree` (the directory holding the radixtop package)."""
    return [python, "-c", LAUNCHER, str(Path(tree).resolve()), *args]


def compile_tree(tree: Path) -> None:
    """Write the tree's bytecode, as an install does: pip compiles every module it installs, and
    an editable install writes each module's on its first import. Where PYTHONDONTWRITEBYTECODE
    is set (the development machine's shell sets it) nothing writes it, and each start of the
    tree compiles its modules again: some 0.3 s of CPU that no installed radixtop pays, and
    that a peer installed by pip does not pay either."""
    compileall.compile_dir(str(Path(tree) / "radixtop"), quiet=1)


def package_dir(tree: Path, python: str = sys.executable) -> Path:
    """Where the launcher's radixtop package comes from: the check that `tree` is what runs."""
    probe = SETUP + "import radixtop; print(radixtop.__path__[0])\n"
    out = subprocess.run([python, "-c", probe, str(Path(tree).resolve())], capture_output=True, text=True,
                         check=True, timeout=60)
    return Path(out.stdout.strip())
