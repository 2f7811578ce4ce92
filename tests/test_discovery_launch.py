"""Every launch form: the command-line reader on each form the projects document, and discovery on
real processes started in each form (console scripts written by pip, wrappers, Ray's process title),
all running at once on this node, each found with its port and its log."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from launch_helpers import ROOT, build_venv, die_with_parent, stop_group, wait_ready

from radixtop.probes.discovery import discover
from radixtop.probes.server_cmdline import classify, launch_of

# (argv, kind): each form as /proc/PID/cmdline shows it. Sources: SGLang's quick start and docker
# command (`python3 -m sglang.launch_server --model-path M --host 0.0.0.0 --port 30000`), its CLI
# (sglang.cli.main: `sglang serve`), vLLM's quickstart (`vllm serve M`) and older docs (`python -m
# vllm.entrypoints.openai.api_server --model M`), vLLM's multi-node example (`srun --overlap
# --nodes=1 vllm serve M --distributed-executor-backend ray`), SGLang's Ray entry point
# (sglang.srt.entrypoints.http_server_actor: actor `_InternalHttpServerActor`), setproctitle names.
FORMS = [
    (["python3", "-m", "sglang.launch_server", "--model-path", "meta-llama/Llama-3.1-8B-Instruct",
      "--port", "30000"], "sglang"),
    (["/usr/bin/python", "-u", "-m", "sglang.launch_server"], "sglang"),
    (["python3", "-um", "sglang.launch_server", "--tp", "2"], "sglang"),
    (["python3", "-X", "faulthandler", "-W", "ignore", "-m", "sglang.launch_server"], "sglang"),
    (["python3", "-Wignore", "-m", "sglang_router.launch_server", "--dp-size", "2"], "sglang"),
    (["/venv/bin/python3", "/venv/bin/sglang", "serve", "--model-path", "m"], "sglang"),
    (["sglang", "serve", "--model-path", "m"], "sglang"),
    (["/usr/bin/python3", "/opt/venv/bin/vllm", "serve", "m"], "vllm"),
    (["/opt/venv/bin/vllm", "serve", "m"], "vllm"),
    (["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], "vllm"),
    (["python", "-m", "vllm.entrypoints.api_server", "--model", "m"], "vllm"),
    (["/usr/bin/python3", "/venv/bin/radixtop", "sim", "--port", "30000"], "sim"),
    (["python", "-m", "radixtop", "sim", "--port", "0"], "sim"),
    (["python3", "/src/sglang/python/sglang/launch_server.py", "--model-path", "m"], "sglang"),
    (["python3", "launch_server.py", "--model-path", "m"], "sglang"),
    (["python3", "/src/vllm/vllm/entrypoints/openai/api_server.py", "--model", "m"], "vllm"),
    # wrappers
    (["nohup", "python3", "-m", "sglang.launch_server", "--model-path", "m"], "sglang"),
    (["env", "CUDA_VISIBLE_DEVICES=0,1", "NCCL_DEBUG=INFO", "vllm", "serve", "m"], "vllm"),
    (["numactl", "--cpunodebind=0", "--membind=0", "python3", "-m", "sglang.launch_server"], "sglang"),
    (["numactl", "-N", "0", "-m", "0", "/venv/bin/python3", "/venv/bin/sglang", "serve"], "sglang"),
    (["taskset", "-c", "0-15", "vllm", "serve", "m"], "vllm"),
    (["timeout", "600", "python", "-m", "sglang.launch_server"], "sglang"),
    (["stdbuf", "-oL", "-eL", "radixtop", "sim"], "sim"),
    (["/venv/bin/python", "/venv/bin/torchrun", "--nproc-per-node", "8", "-m", "sglang.launch_server",
      "--port", "30000"], "sglang"),
    (["torchrun", "--nnodes=1", "--standalone", "/src/sglang/python/sglang/launch_server.py",
      "--model-path", "m"], "sglang"),
    (["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "sglang.launch_server"], "sglang"),
    (["uv", "run", "--with", "sglang", "python", "-m", "sglang.launch_server"], "sglang"),
    (["uv", "run", "--python", "3.11", "--", "vllm", "serve", "m"], "vllm"),
    (["/opt/conda/bin/python", "/opt/conda/bin/conda", "run", "-n", "vllm", "--no-capture-output",
      "vllm", "serve", "m"], "vllm"),
    (["srun", "--overlap", "--nodes=1", "--gpus=4", "vllm", "serve", "m",
      "--distributed-executor-backend", "ray"], "vllm"),
    (["nohup", "numactl", "-N", "0", "env", "X=1", "uv", "run", "sglang", "serve"], "sglang"),
    # titles
    (["ray::_InternalHttpServerActor"], "sglang"),
    (["ray::_InternalHttpServerActor.wait_until_ready"], "sglang"),
    (["sglang::scheduler_TP3"], "sglang-child"),
    (["sglang::scheduler_DP1_TP3"], "sglang-child"),
    (["VLLM::EngineCore"], "vllm-child"),
    # not servers
    (["bash", "-c", "python -m sglang.launch_server"], None),
    (["python", "-m", "pytest", "sglang"], None),
    (["python", "-m", "sglang.bench_serving", "--port", "30000"], None),
    (["python3", "-c", "import sglang"], None),
    (["grep", "sglang.launch_server"], None),
    (["vim", "/src/sglang/python/sglang/launch_server.py"], None),
    (["python3", "launch_server.py", "--port", "8080"], None),
    (["uv", "pip", "install", "sglang"], None),
    (["/venv/bin/python", "/venv/bin/ray", "job", "submit", "--", "python", "-m", "sglang.launch_server"], None),
    (["ray::IDLE"], None),
    (["radixtop", "--log", "sglang.log"], None),
    (["/venv/bin/python3", "/venv/bin/radixtop"], None),
    (["tail", "-f", "vllm", "serve"], None),
]


@pytest.mark.parametrize(("argv", "kind"), FORMS, ids=[" ".join(a)[:60] for a, _ in FORMS])
def test_each_documented_launch_form_is_read(argv: list[str], kind: str | None) -> None:
    assert classify(argv) == kind


def test_the_servers_own_arguments_are_told_from_the_wrappers() -> None:
    """--port and --log-file are read from the server's arguments, not a wrapper's."""
    got = launch_of(["torchrun", "--master-port", "29500", "-m", "sglang.launch_server", "--port", "30001"])
    assert got is not None and got.args == ("--port", "30001")
    got = launch_of(["/venv/bin/python3", "/venv/bin/vllm", "serve", "m", "--port", "8001"])
    assert got is not None and got.args == ("m", "--port", "8001")


# -- real processes, every form at once ----------------------------------------------------------


@dataclass
class Started:
    name: str
    kind: str
    proc: subprocess.Popen
    workdir: Path
    log: Path  # where its lines go
    how: str  # "--log-file" | "stdout"
    url: str = ""
    extra: list[str] = field(default_factory=list)


RAY_ACTOR = textwrap.dedent(
    """
    # Started as `ray::_InternalHttpServerActor`, Ray's title for SGLang's actor: the server runs in a
    # spawned child, as sglang.srt.entrypoints.http_server_actor starts it.
    import multiprocessing as mp, os, sys

    def serve(args):
        from radixtop.sim.cli import main
        main(args)

    if __name__ == "__main__":
        # A retitled argv[0] hides the interpreter from Python (sys.executable is empty): name it.
        mp.set_executable(os.environ["RAY_ACTOR_PYTHON"])
        child = mp.get_context("spawn").Process(target=serve, args=(sys.argv[1:],))
        child.start()
        child.join()
    """
)


@pytest.fixture(scope="module")
def venv_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_venv(tmp_path_factory.mktemp("launch-venv"))


def _start_all(bin_dir: Path, root: Path) -> list[Started]:
    py = str(bin_dir / "python")
    launchers = bin_dir.parent.parent / "launchers"
    forms: list[tuple[str, str, list[str], str]] = [
        # name, kind, argv (the simulator's flags follow), how its log is found
        ("console radixtop", "sim", [str(bin_dir / "radixtop"), "sim"], "--log-file"),
        ("console sglang", "sglang", [str(bin_dir / "sglang"), "serve", "--model-path", "m"], "stdout"),
        ("console vllm", "vllm", [str(bin_dir / "vllm"), "serve", "org/m"], "stdout"),
        ("python -m sglang", "sglang", [py, "-u", "-m", "sglang.launch_server", "--model-path", "m"], "stdout"),
        ("python -m vllm", "vllm", [py, "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], "stdout"),
        (
            "script path",
            "sglang",
            [py, str(launchers / "sglang" / "launch_server.py"), "--model-path", "m"],
            "--log-file",
        ),
        ("nohup env", "sim", ["nohup", "env", "RADIXTOP_FORM=1", str(bin_dir / "radixtop"), "sim"], "stdout"),
        ("taskset", "sglang", ["taskset", "-c", "0", str(bin_dir / "sglang"), "serve", "--model-path", "m"], "stdout"),
        ("timeout", "vllm", ["timeout", "300", str(bin_dir / "vllm"), "serve", "m"], "stdout"),
        ("torchrun", "sglang", [str(bin_dir / "torchrun"), "--nproc-per-node", "1", "--standalone", "-m",
                                "sglang.launch_server", "--model-path", "m"], "stdout"),
        ("conda run", "vllm", [str(bin_dir / "conda"), "run", "-n", "vllm", "--no-capture-output",
                               str(bin_dir / "vllm"), "serve", "m"], "stdout"),
    ]
    if shutil.which("numactl") and subprocess.run(["numactl", "-N", "0", "true"], capture_output=True).returncode == 0:
        forms.append(
            ("numactl", "sim", ["numactl", "--cpunodebind=0", "--membind=0", py, "-m", "radixtop", "sim"], "stdout")
        )
    uv = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv:
        forms.append(("uv run", "sglang", [uv, "run", "--no-project", "--python", py, "--", str(bin_dir / "sglang"),
                                           "serve", "--model-path", "m"], "stdout"))
    ray_script = root / "ray_actor.py"
    ray_script.write_text(RAY_ACTOR)
    forms.append(("ray actor", "sglang", ["ray::_InternalHttpServerActor", str(ray_script)], "stdout"))
    env = {k: v for k, v in os.environ.items() if k not in ("TMUX",)}
    env["UV_NO_CACHE"] = "1"
    env["UV_OFFLINE"] = "1"
    env["RAY_ACTOR_PYTHON"] = py
    ray_env = {**env, "PYTHONPATH": os.pathsep.join([str(ROOT), sysconfig.get_paths()["purelib"]])}
    started = []
    for name, kind, argv, how in forms:
        workdir = root / name.replace(" ", "_")
        workdir.mkdir()
        ready = workdir / "ready"
        flags = ["--port", "0", "--ready-file", str(ready), "--step-ms", "1"]
        log = workdir / ("server.log" if how == "--log-file" else "out.txt")
        if how == "--log-file":
            flags += ["--log-file", "server.log"]  # relative: read against the server's cwd
        out = open(workdir / "out.txt", "ab")  # noqa: SIM115 - the child holds it
        # Ray retitles its worker: an argv[0] of its own hides the venv from Python, hence the path.
        titled = argv[0].startswith("ray::")
        proc = subprocess.Popen([*argv, *flags], executable=py if titled else None, cwd=workdir, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=ray_env if titled else env,
                                start_new_session=True, preexec_fn=die_with_parent)
        out.close()
        started.append(Started(name, kind, proc, workdir, log, how))
    return started


def _tree(proc: subprocess.Popen) -> set[int]:
    try:
        return {proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))}
    except psutil.Error:
        return {proc.pid}


def test_discovery_finds_a_server_started_in_every_form(venv_bin: Path, tmp_path: Path) -> None:
    started = _start_all(venv_bin, tmp_path)
    try:
        for s in started:
            s.url = f"http://127.0.0.1:{wait_ready(s.workdir / 'ready', s.proc, s.workdir / 'out.txt')}"
        found = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            servers = asyncio.run(discover(exclude={os.getpid()})).servers
            found = {s.url: s for s in servers if s.url}
            if all(s.url in found for s in started):
                break
            time.sleep(0.5)
        for s in started:
            got = found.get(s.url)
            assert got is not None, f"{s.name}: not found at {s.url}; found {sorted(found)}"
            assert got.kind == s.kind, (s.name, got.kind)
            assert got.pid in _tree(s.proc), f"{s.name}: pid {got.pid} is not in the launched tree"
            assert got.log_path == str(s.log) and got.log_how == s.how, (
                s.name, got.log_path, got.log_how, got.problems
            )
        # A wrapper that stays as the server's parent (timeout, torchrun, conda run, uv run) is not
        # listed as a second server.
        pids = {s.pid for s in found.values()}
        for s in started:
            assert len(_tree(s.proc) & pids) == 1, f"{s.name}: listed twice"
    finally:
        for s in started:
            stop_group(s.proc)
