"""A real SGLang 0.5.23 server for the tests: `python -m sglang.launch_server` on the CPU engine.

The server runs from the real-SGLang environment (`.ci/sglang-tests --build-only` builds it;
`sglang_gate.sglang_python` finds it) over the tiny random-weight model of `sglang/tiny_model.py`,
on a free loopback port, with its log in a file the way users run it (`--log-file` is not a
0.5.23 flag: stdout and stderr go to the file). radixtop's plugin loads through SGLang's
`load_plugins()` when `plugin=True` (RADIXTOP_INSTRUMENT=1). `stop()` ends the whole process tree
it started, by pid.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from sglang_gate import REPO, sglang_python

# The recipe for this CPU: SGLang's CPU paths, torch-native attention and sampling, no CUDA graphs,
# the scheduler asleep while idle (else it spins a core), pages of 16, a 4,096-token pool.
BASE_FLAGS = (
    "--device", "cpu", "--attention-backend", "torch_native", "--sampling-backend", "pytorch",
    "--disable-cuda-graph", "--disable-overlap-schedule", "--sleep-on-idle", "--page-size", "16",
    "--max-total-tokens", "4096", "--max-running-requests", "8", "--enable-metrics",
    "--skip-server-warmup", "--load-format", "dummy",
)
START_TIMEOUT_S = 300.0
FIRED_UP = "The server is fired up and ready to roll!"
PLUGIN_FAILED = "Failed to load plugin radixtop"  # sglang.srt.plugins, when its radixtop cannot be imported


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_model(root: Path) -> Path:
    """The tiny model's folder under `root` (made once per folder)."""
    model = root / "tiny-llama"
    if not (model / "tokenizer.json").is_file():
        python = sglang_python()
        assert python is not None
        subprocess.run([python, str(REPO / "tests" / "sglang" / "tiny_model.py"), str(model)], check=True,
                       timeout=120, capture_output=True)
    return model


@dataclass
class RealServer:
    url: str
    port: int
    log: Path
    model: Path
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    pids: set[int] = field(default_factory=set)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tree(self) -> list[psutil.Process]:
        """The launcher and its children (the scheduler and detokenizer processes), remembered."""
        if self.proc is None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return []
        self.pids.update(p.pid for p in procs)
        return procs

    def scheduler(self) -> psutil.Process:
        for p in self.tree():
            try:
                if "scheduler" in p.name() or any("scheduler" in a for a in p.cmdline()[:1]):
                    return p
            except psutil.Error:
                continue
        raise AssertionError(f"no scheduler process under pid {self.proc.pid if self.proc else None}")

    def generate(self, input_ids: list[int], max_new_tokens: int = 4, **extra: object) -> dict:
        body = {"input_ids": input_ids, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0}}
        body.update(extra)
        r = httpx.post(self.url + "/generate", json=body, timeout=120)
        r.raise_for_status()
        return r.json()

    def stop(self) -> None:
        if self.proc is None:
            return
        self.tree()
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: the launcher's group
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        for pid in self.pids:  # whatever outlived the group's SIGTERM, by the pids seen
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def start_server(
    workdir: Path,
    *,
    plugin: bool = True,
    core: str = "rust",
    flags: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    name: str = "server",
    model: Path | None = None,
) -> RealServer:
    """Start a real server and wait until it says it is fired up; the caller stops it."""
    python = sglang_python()
    assert python is not None, "the real-SGLang environment is missing"
    workdir.mkdir(parents=True, exist_ok=True)
    model = model or tiny_model(workdir)
    port = free_port()
    argv = [python, "-m", "sglang.launch_server", "--model-path", str(model), "--host", "127.0.0.1",
            "--port", str(port), *BASE_FLAGS, *flags]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("RADIXTOP_", "SGLANG_"))}
    full_env.update({
        "SGLANG_USE_CPU_ENGINE": "1",
        "PYTHONUNBUFFERED": "1",
        "RADIXTOP_RUNTIME_DIR": os.environ.get("RADIXTOP_RUNTIME_DIR", ""),
    })
    if not full_env["RADIXTOP_RUNTIME_DIR"]:
        del full_env["RADIXTOP_RUNTIME_DIR"]
    if plugin:
        full_env["RADIXTOP_INSTRUMENT"] = "1"
    if core == "python":
        full_env["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = "python"
    full_env.update(env or {})
    log = workdir / f"{name}.log"
    server = RealServer(f"http://127.0.0.1:{port}", port, log, model, argv, full_env)
    out = log.open("wb")
    try:
        server.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=full_env, cwd=workdir, start_new_session=True)
    finally:
        out.close()
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                raise AssertionError(f"the server exited with {server.proc.returncode}:\n{server.text()[-3000:]}")
            text = server.text()
            if FIRED_UP in text:
                if plugin and PLUGIN_FAILED in text:  # it serves, uninstrumented: no test or figure of ours
                    raise AssertionError(f"the server could not load radixtop's plugin:\n{text[-3000:]}")
                server.tree()
                return server
            time.sleep(0.5)
        raise AssertionError(f"the server was not fired up within {START_TIMEOUT_S:.0f} s:\n{server.text()[-3000:]}")
    except BaseException:
        server.stop()
        raise
