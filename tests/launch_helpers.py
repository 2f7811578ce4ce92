"""Real console scripts for the launch-form tests: a temporary venv where pip installs radixtop
itself (`radixtop`) and a small package that stands in for SGLang and vLLM at their own entry points
(`sglang` = sglang.cli.main:main, `vllm` = vllm.entrypoints.cli.main:main, the modules
sglang.launch_server and vllm.entrypoints.openai.api_server), each running radixtop's simulator.
pip writes the scripts with their shebang, so a started script shows as
`/tmp/.../bin/python /tmp/.../bin/sglang serve ...` in /proc, as on a GPU node. torch and conda are
not installed here: `torchrun` and `conda` stand-ins start their command as a child the way the real
tools do (torchrun: `python -u SCRIPT|-m MODULE ...`; conda run: the command itself)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FILES = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools>=64"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "radixtop-test-launchers"
        version = "0"

        [project.scripts]
        sglang = "sglang.cli.main:main"
        vllm = "vllm.entrypoints.cli.main:main"
        torchrun = "standin_launchers:torchrun"
        conda = "standin_launchers:conda"

        [tool.setuptools]
        packages = ["sglang", "sglang.cli", "vllm", "vllm.entrypoints", "vllm.entrypoints.cli",
                    "vllm.entrypoints.openai"]
        py-modules = ["standin_launchers"]
    """,
    "sglang/__init__.py": "",
    "sglang/cli/__init__.py": "",
    "sglang/cli/main.py": """
        import sys

        from radixtop.sim.cli import main as _sim

        def main():
            if sys.argv[1:2] != ["serve"]:
                raise SystemExit("usage: sglang serve --model-path M ...")
            raise SystemExit(_sim(sys.argv[2:]))
    """,
    "sglang/launch_server.py": """
        import sys

        from radixtop.sim.cli import main as _sim

        if __name__ == "__main__":
            raise SystemExit(_sim(sys.argv[1:]))
    """,
    "vllm/__init__.py": "",
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/cli/__init__.py": "",
    "vllm/entrypoints/cli/main.py": """
        import sys

        from radixtop.sim.cli import main as _sim

        def main():  # vllm serve MODEL [flags]
            if sys.argv[1:2] != ["serve"] or len(sys.argv) < 3:
                raise SystemExit("usage: vllm serve MODEL ...")
            raise SystemExit(_sim(["--model-path", sys.argv[2], *sys.argv[3:]]))
    """,
    "vllm/entrypoints/openai/__init__.py": "",
    "vllm/entrypoints/openai/api_server.py": """
        import sys

        from radixtop.sim.cli import main as _sim

        if __name__ == "__main__":
            raise SystemExit(_sim(sys.argv[1:]))
    """,
    "standin_launchers.py": """
        import signal, subprocess, sys

        def _run(argv):
            child = subprocess.Popen(argv)
            signal.signal(signal.SIGTERM, lambda *_: child.terminate())
            raise SystemExit(child.wait())

        def torchrun():  # torchrun [--opt V | --opt=V ...] (-m MODULE | SCRIPT) ARGS
            args, i = sys.argv[1:], 0
            while i < len(args) and args[i].startswith("-") and args[i] not in ("-m", "--module"):
                i += 1 if "=" in args[i] or args[i] == "--standalone" else 2
            if args[i] in ("-m", "--module"):
                _run([sys.executable, "-u", "-m", *args[i + 1:]])
            _run([sys.executable, "-u", *args[i:]])

        def conda():  # conda run -n ENV [--no-capture-output] CMD ...
            args = sys.argv[1:]
            assert args[0] == "run" and args[1] == "-n", args
            rest = [a for a in args[3:] if a != "--no-capture-output"]
            _run(rest)
    """,
}


def build_venv(where: Path) -> Path:
    """A venv at `where` with radixtop (editable) and the stand-ins installed by pip; its bin/."""
    pkg = where / "launchers"
    for name, text in FILES.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    # radixtop's dependencies come from the test run's own environment.
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    )
    (site / "radixtop-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    got = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
         "-e", str(ROOT), str(pkg)],
        capture_output=True, text=True, timeout=300,
    )
    if got.returncode != 0:
        raise RuntimeError(f"pip install failed: {got.stderr[-2000:]}")
    return venv / "bin"


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM if the test process dies without its cleanup."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def stop_group(proc: subprocess.Popen, timeout_s: float = 5.0) -> None:
    """Stop a process started with start_new_session=True, and what it started (its group)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout_s)


def wait_ready(ready: Path, proc: subprocess.Popen, out: Path, timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + timeout_s
    while not (ready.exists() and ready.read_text().strip()):
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited: {out.read_text()[-800:] if out.exists() else ''}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.args} did not start in {timeout_s} s")
        time.sleep(0.05)
    return int(ready.read_text())


def wait_port(ready: Path, timeout_s: float = 30.0) -> int:
    """The port a simulator wrote to its --ready-file."""
    deadline = time.monotonic() + timeout_s
    while not (ready.exists() and ready.read_text().strip()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no port in {ready} after {timeout_s} s")
        time.sleep(0.05)
    return int(ready.read_text())

