"""What a server radixtop starts runs with: a clean environment over the live server's behaviour
keys, code-loading directories and the working directory held to the ownership rule, no `-c`, and
a module run with -m vouched for where it would load from. Another user is uid 65534 (nobody),
reached with setpriv, since root runs these tests here."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from radixtop.demo import stop_process
from radixtop.incident.common.redact import Redactor
from radixtop.incident.confirm.confirm import PlanError, _trusted_program
from radixtop.incident.confirm.launch_env import launch_env, untrusted_module

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another user")


def _nobodys(path: Path) -> Path:
    for p in [path, *path.rglob("*")]:
        os.chown(p, NOBODY, NOBODY)
    return path


def test_the_clean_environment_keeps_behaviour_keys_and_drops_what_loads_code(tmp_path: Path) -> None:
    server = {"SGLANG_USE_CPU_ENGINE": "1", "CUDA_VISIBLE_DEVICES": "0,1", "LD_PRELOAD": "/tmp/evil.so",
              "PYTHONSTARTUP": "/tmp/evil.py", "PATH": "/usr/bin:relative/bin", "SECRET_THING": "x"}
    got = launch_env(server, {"HOME": "/root", "PATH": "/bin", "EDITOR": "vi"}, server_cwd=None, run_dir=str(tmp_path))
    assert got.env == {"HOME": "/root", "PATH": "/usr/bin", "SGLANG_USE_CPU_ENGINE": "1", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert got.cwd == str(tmp_path) and not got.inherited
    assert any("relative/bin" in d for d in got.dropped), got.dropped
    text = "\n".join(got.describe(Redactor()))
    assert "SGLANG_USE_CPU_ENGINE=1" in text and "LD_PRELOAD" not in text and f"working directory: {tmp_path}" in text


def test_inherit_env_gives_the_servers_whole_environment_and_says_so(tmp_path: Path) -> None:
    server = {"SGLANG_X": "1", "LD_PRELOAD": "/opt/profiler.so"}
    got = launch_env(server, {"HOME": "/root"}, server_cwd=str(tmp_path), run_dir="/nonexistent", inherit=True)
    assert got.env == server and got.cwd == str(tmp_path) and got.inherited
    assert "whole environment, 2 keys (--inherit-env)" in got.describe(Redactor())[0]


@as_root
def test_another_users_directories_are_left_out_of_paths_and_as_working_directory(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    _nobodys(theirs)
    ours = tmp_path / "ours"
    ours.mkdir()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    server = {"PYTHONPATH": f"{theirs}:{ours}:{shared}", "LD_LIBRARY_PATH": str(theirs)}
    got = launch_env(server, {}, server_cwd=str(theirs), run_dir=str(ours))
    assert got.env == {"PYTHONPATH": str(ours)}, got.env
    assert got.cwd == str(ours)
    dropped = "\n".join(got.dropped)
    assert f"PYTHONPATH entry {theirs}: " in dropped and "uid 65534" in dropped
    assert f"PYTHONPATH entry {shared}: " in dropped and "writable by group or others" in dropped
    assert f"LD_LIBRARY_PATH entry {theirs}" in dropped
    assert f"the server's working directory {theirs}" in dropped


@as_root
def test_a_module_planted_under_a_trusted_root_is_refused(tmp_path: Path) -> None:
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("")
    (tmp_path / "sglang" / "launch_server.py").write_text("print('planted')\n")
    assert untrusted_module("sglang.launch_server", [str(tmp_path)]) is None
    os.chown(tmp_path / "sglang" / "launch_server.py", NOBODY, NOBODY)
    why = untrusted_module("sglang.launch_server", [str(tmp_path)])
    assert why is not None and "launch_server.py" in why and "uid 65534" in why


@pytest.mark.parametrize("program", [["python3", "-c", "import os", "sglang"], ["python3", "-uc", "import os"],
                                     ["python3", "-Bc", "x"]])
def test_code_given_on_the_command_line_is_never_run(program: list[str]) -> None:
    with pytest.raises(PlanError, match="python -c"):
        _trusted_program(program, sys.executable, "", None)


def test_interpreter_options_that_run_no_inline_code_pass() -> None:
    got = _trusted_program(
        ["python3", "-u", "-X", "importtime", "-W", "ignore::DeprecationWarning", "-m", "sglang.launch_server"],
        sys.executable,
        "",
        None,
    )
    assert got[0] == sys.executable and got[-2:] == ("-m", "sglang.launch_server")


ATTACKER = '''import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
if os.getuid() == 0:
    open(os.environ.get("PWNED_AT", "/nonexistent"), "w").write("ran as uid 0")
    raise SystemExit(7)
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"ok" if self.path == "/health" else json.dumps({"version": "0.5.23", "max_total_num_tokens": 4096,
            "page_size": 1, "max_running_requests": 16}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


@as_root
@pytest.mark.skipif(shutil.which("setpriv") is None or not os.path.exists("/usr/bin/python3"),
                    reason="needs setpriv and a system python3")
@pytest.mark.parametrize("inherit", [False, True])
def test_confirm_never_runs_a_module_another_user_planted_in_the_servers_directory(
    tmp_path: Path, inherit: bool
) -> None:
    """Another user's server runs `python3 -m sglang.launch_server` from a directory of theirs
    holding their own sglang/launch_server.py, with PYTHONPATH and LD_PRELOAD of theirs: the
    confirmation run starts its servers elsewhere, with none of that, and the plan says so; asked
    to inherit the server's environment and directory, it refuses to run that module at all."""
    top = Path(tempfile.mkdtemp(prefix="radixtop-att-", dir="/tmp"))  # pytest's folders are root's alone
    top.chmod(0o755)
    home = top / "att"
    (home / "live" / "sglang").mkdir(parents=True)
    (home / "live" / "sglang" / "__init__.py").write_text("")
    (home / "live" / "sglang" / "launch_server.py").write_text(ATTACKER)
    _nobodys(home)
    pwned = home / "PWNED"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(home / "live"), "LD_PRELOAD": str(home / "evil.so"),
           "PWNED_AT": str(pwned)}
    server = subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "/usr/bin/python3", "-m",
         "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B", "--port", str(port)],
        cwd=home / "live", env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "the other user's server did not start"
                time.sleep(0.1)
        work = tmp_path / "wd"
        done = subprocess.run(
            [sys.executable, "-m", "radixtop", "confirm", "--url", f"http://127.0.0.1:{port}", "--no-bundle",
             "--trace", "finding_03330", "--runs", "1", "--workdir", str(work), "--yes", "--json",
             "--control-timeout", "60", "--vocab-size", "1000", *(["--inherit-env"] if inherit else [])],
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )
        ran_as_root = pwned.exists()
    finally:
        stop_process(server)
        shutil.rmtree(top, ignore_errors=True)
    assert not ran_as_root, "the planted module ran as root"
    if inherit:
        assert done.returncode != 0 and "would load" in done.stderr and "uid 65534" in done.stderr, done.stderr
        return
    environment = json.loads((work / "plan.json").read_text())["environment"]
    assert environment["cwd"] == str(work) and "LD_PRELOAD" not in environment["carried"], environment
    said = "\n".join(environment["left_out"])
    assert (
        f"the server's working directory {home / 'live'}" in said and f"PYTHONPATH entry {home / 'live'}" in said
    ), said
    assert "left out: the server's working directory" in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize("flag", ["--trust-remote-cod", "--trust-remote-code", "--custom-weight-load m.f",
                                  "--enable-custom-logit-proc", "--dist-init-addr 10.1.2.3:5000",
                                  "--dist-init=10.1.2.3:5000", "--otlp-traces-endpoint h:4317",
                                  "--crash-dump-folder /etc/cron.d", "--log-requests-targ /root/x"])
def test_code_loading_and_destination_flags_from_server_info_are_dropped_abbreviated_too(flag: str) -> None:
    """SGLang's argparse takes an unambiguous prefix for the flag: what /server_info says is
    network text, so a prefix of a code-loading or destination flag is dropped like the flag."""
    from radixtop.incident.confirm.control_server import build_control_argv, parse_launch_command

    live = parse_launch_command(f"python -m sglang.launch_server --model-path x {flag} --page-size 16",
                                python="/usr/bin/python3")
    argv, changes = build_control_argv(live, port=1)
    kept = argv[3:]
    assert flag.split()[0].split("=")[0] not in " ".join(kept), kept
    assert "--page-size" in kept and any("named by /server_info" in c for c in changes), changes


def test_the_users_own_flags_are_kept_as_given() -> None:
    from radixtop.incident.confirm.control_server import build_control_argv, launch_from_argv

    live = launch_from_argv(["python3", "-m", "sglang.launch_server", "--model-path", "x", "--trust-remote-code"],
                            source="psutil")
    argv, _ = build_control_argv(live, port=1)
    assert "--trust-remote-code" in argv
