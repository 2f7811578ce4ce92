"""What an LLM server's command line launches: SGLang, vLLM or radixtop's simulator, whatever form
started it. Pure: reads an argv list, runs nothing.

The forms (as the projects document them, and as /proc/PID/cmdline then shows them):
- a module: `python3 -m sglang.launch_server --model-path M` (SGLang's quick start and its docker
  image's command), `python -m vllm.entrypoints.openai.api_server --model M` (vLLM's older docs),
  `python -m radixtop sim`; interpreter options before `-m` (`-u`, `-X dev`, `-W ignore`) are read
  as Python reads them;
- a console script: `sglang serve` (sglang.cli.main), `vllm serve M`, `radixtop sim`. Started
  through its shebang, the kernel runs the interpreter with the script's path as argv[1]:
  `/venv/bin/python3 /venv/bin/vllm serve M`; started by pip's /bin/sh trampoline (long paths) the
  same; argv[0] is the script itself only where something rewrote it;
- a script path: `python /src/sglang/python/sglang/launch_server.py --model-path M`, or a copy of it
  (`launch_server.py` with SGLang's `--model-path`);
- wrappers: `nohup`, `env VAR=... cmd`, `numactl --cpunodebind=0 cmd`, `taskset -c 0-7 cmd`,
  `timeout`, `stdbuf`, `nice`, `srun`, `uv run [opts] cmd`, `conda run -n ENV cmd`, `torchrun
  [opts] script.py|-m module`, `python -m torch.distributed.run ...`. Most exec the command (the
  process then shows it alone); those that stay as its parent (torchrun, uv run, conda run,
  timeout) are recognised too, and discovery keeps the innermost process as the server;
- titles set with setproctitle: SGLang's children (`sglang::scheduler_TP0`), vLLM's
  (`VLLM::EngineCore`), and Ray actors that run a server (`ray::_InternalHttpServerActor`, SGLang's
  Ray entry point; `ray::...VLLM...` deployments).
A shell running a string (`bash -c "python -m sglang.launch_server"`) is not read: its child is.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

ServerKind = Literal["sglang", "vllm", "sim"]
# A titled child process of a server (a scheduler, or an offline engine's).
LaunchKind = Literal[ServerKind, "sglang-child", "vllm-child"]

_PYTHON = re.compile(r"^(?:python|pypy)(?:\d+(?:\.\d+)*)?[dmu]?$")
_PY_VALUE_FLAGS = frozenset("WX")  # -W ignore, -X dev: a value follows (attached or next)
_MODULES: dict[str, ServerKind] = {  # module -> kind, for `python -m MODULE`
    "sglang.launch_server": "sglang",
    "sglang_router.launch_server": "sglang",  # sgl-router starting its SGLang workers
    "vllm.entrypoints.openai.api_server": "vllm",
    "vllm.entrypoints.api_server": "vllm",
}
_SUBCOMMANDS: dict[tuple[str, str], ServerKind] = {  # (program or module, its first argument) -> kind
    ("sglang", "serve"): "sglang",
    ("sglang", "launch_server"): "sglang",
    ("sglang.cli.main", "serve"): "sglang",
    ("vllm", "serve"): "vllm",
    ("vllm.entrypoints.cli.main", "serve"): "vllm",
    ("radixtop", "sim"): "sim",
    ("radixtop.cli", "sim"): "sim",
}
_SCRIPTS: dict[str, ServerKind] = {  # a script path's tail -> kind
    "sglang/launch_server.py": "sglang",
    "vllm/entrypoints/openai/api_server.py": "vllm",
    "vllm/entrypoints/api_server.py": "vllm",
}
# Programs that run the command given after their own options (and, for some, a subcommand).
_WRAPPERS = {
    "nohup": None, "env": None, "numactl": None, "taskset": None, "timeout": None, "stdbuf": None,
    "nice": None, "ionice": None, "chrt": None, "setsid": None, "time": None, "srun": None,
    "mpirun": None, "sudo": None, "runuser": None, "torchrun": None, "uv": "run", "conda": "run",
    "mamba": "run", "micromamba": "run", "pixi": "run", "poetry": "run", "pipenv": "run",
}
_LAUNCHER_MODULES = {"torch.distributed.run": "torchrun", "torch.distributed.launch": "torchrun"}
_MAX_DEPTH = 6  # wrappers inside wrappers (nohup numactl uv run ...), at most
_MAX_ARGS = 256  # a command line longer than this is read this far


@dataclass(frozen=True, slots=True)
class Launch:
    kind: LaunchKind
    args: tuple[str, ...] = ()  # the server's own arguments (after its program, module or script)


def launch_of(cmdline: Sequence[str]) -> Launch | None:
    """The server a command line starts, or None when it starts none we know."""
    return _read(list(cmdline[:_MAX_ARGS]), 0)


def classify(cmdline: Sequence[str]) -> LaunchKind | None:
    """'sglang', 'vllm', 'sim', 'sglang-child' / 'vllm-child' (a titled process) or None."""
    found = launch_of(cmdline)
    return found.kind if found is not None else None


def _read(argv: list[str], depth: int) -> Launch | None:
    if not argv or depth > _MAX_DEPTH:
        return None
    first = argv[0]
    title = _title(first)
    if title is not None:
        return title
    base = os.path.basename(first)
    rest = argv[1:]
    if _PYTHON.match(base):
        return _python(rest, depth)
    kind = _SUBCOMMANDS.get((base, rest[0] if rest else ""))
    if kind is not None:
        return Launch(kind, tuple(rest[1:]))
    if base in _WRAPPERS:
        return _wrapped(base, rest, depth)
    return None


def _title(first: str) -> Launch | None:
    """A process title (setproctitle), as SGLang, vLLM and Ray set them."""
    if first.startswith("sglang::"):
        return Launch("sglang-child")
    if first.startswith(("VLLM::", "vllm::")):
        return Launch("vllm-child")
    if first.startswith("ray::"):
        name = first.lower()
        if "sglang" in name or "httpserveractor" in name:
            return Launch("sglang")
        if "vllm" in name:
            return Launch("vllm")
    return None


def _python(args: list[str], depth: int) -> Launch | None:
    """`python [options] -m MODULE args`, `python [options] SCRIPT args`."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            if arg == "--":
                i += 1
            break
        if arg.startswith("--"):  # --check-hash-based-pycs MODE; others take no value
            i += 2 if arg == "--check-hash-based-pycs" else 1
            continue
        for j, flag in enumerate(arg[1:], start=1):
            value = arg[j + 1 :]
            if flag == "c":
                return None  # a command string: its children show what it starts
            if flag == "m":
                module = value or (args[i + 1] if i + 1 < len(args) else "")
                return _module(module, args[i + (1 if value else 2) :], depth)
            if flag in _PY_VALUE_FLAGS:
                i += 0 if value else 1
                break
        i += 1
    if i >= len(args):
        return None
    return _script(args[i], args[i + 1 :], depth)


def _module(module: str, args: list[str], depth: int) -> Launch | None:
    kind = _MODULES.get(module)
    if kind is not None:
        return Launch(kind, tuple(args))
    kind = _SUBCOMMANDS.get((module, args[0] if args else ""))
    if kind is not None:
        return Launch(kind, tuple(args[1:]))
    if module in _LAUNCHER_MODULES:
        return _read([_LAUNCHER_MODULES[module], *args], depth + 1)
    return None


def _script(path: str, args: list[str], depth: int) -> Launch | None:
    for tail, kind in _SCRIPTS.items():
        if path.endswith("/" + tail) or path == tail:
            return Launch(kind, tuple(args))
    base = os.path.basename(path)
    if base == "launch_server.py" and any(a == "--model-path" or a.startswith("--model-path=") for a in args):
        return Launch("sglang", tuple(args))  # a copy of SGLang's script: SGLang's flag says so
    # A console script run through its shebang: the script's name is the program's.
    return _read([base, *args], depth + 1)


def _wrapped(wrapper: str, args: list[str], depth: int) -> Launch | None:
    """The command a wrapper runs: after `--` when it has one, else the first suffix of its
    arguments that reads as a launch (its options and values before it are skipped)."""
    sub = _WRAPPERS[wrapper]
    if sub is not None:
        if not args or args[0] != sub:
            return None  # `uv pip ...`, `conda list`: not running a command
        args = args[1:]
    if "--" in args:
        return _inner(args[args.index("--") + 1 :], depth)
    for i, arg in enumerate(args):
        if wrapper == "torchrun" and arg in ("-m", "--module") and i + 1 < len(args):
            return _module(args[i + 1], args[i + 2 :], depth + 1)
        found = _inner(args[i:], depth)
        if found is not None:
            return found
    return None


def _inner(argv: list[str], depth: int) -> Launch | None:
    if not argv or argv[0].startswith("-") or ("=" in argv[0] and not argv[0].startswith("/")):
        return None  # an option, or env's VAR=value
    if argv[0].endswith(".py"):  # torchrun script.py: run with its own interpreter
        return _script(argv[0], argv[1:], depth + 1)
    return _read(argv, depth + 1)


def flag(args: Sequence[str], name: str) -> str | None:
    """The value of `--name V` or `--name=V` among a command line's arguments."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None
