"""The confirmation run at the moment it matters: after the server died, under pressure, with bad
input, and with a second engineer asking for one while another runs. Real simulators on loopback,
real `radixtop confirm` processes."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from incident_helpers import HEALTHY_FLAGS, gone, radixtop, small_trace, start_sim, wait_for

from radixtop.incident.common.sighting import load_sighting, observe, save_sighting
from radixtop.incident.confirm.confirm import ConfirmOptions, PlanError, prepare
from radixtop.incident.confirm.confirm_run import ConfirmationRun
from radixtop.incident.replay.trace import Trace, TraceRequest, save_trace

# The race fires at the first eviction at 0.90 token usage or more: every run of the workload reaches it.
# (The default 2 ms scheduler step: at the helpers' 1 ms, requests finish before the pool fills.)
PRESSURE_SIM = ("--page-size", "16", "--max-total-tokens", "16384", "--max-running-requests", "64", "--step-ms", "2",
                "--fault", "lock-race:seed=3,probability=1")


def pressure_trace_file(path: Path) -> Path:
    """120 requests of 1,024-1,536 prompt tokens sharing 0/256/512-token prefixes."""
    rng = random.Random(3)
    requests = []
    for i in range(120):
        prefix = rng.choice((0, 256, 512))
        requests.append(TraceRequest(f"q{i:03d}", offset_ms=i * 15.0, prompt_len=rng.randint(1024, 1536),
                                     prefix_len=prefix, group=f"g{prefix}", max_tokens=64))
    save_trace(Trace("pressure120", 16, tuple(requests)), path)
    return path


def confirm_json(tmp_path: Path, *args: str, timeout_s: float = 240) -> tuple[dict, subprocess.CompletedProcess]:
    done = radixtop("confirm", "--json", "--yes", "--workdir", str(tmp_path / "c"), "--control-timeout", "30", *args,
                    timeout_s=timeout_s)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout), done


def test_under_pressure_the_lock_race_is_pressure_dependent_and_the_steps_are_side_by_side(tmp_path: Path) -> None:
    sim = start_sim(tmp_path / "live", *PRESSURE_SIM)
    try:
        trace = pressure_trace_file(tmp_path / "t.json")
        doc, done = confirm_json(tmp_path, "--url", sim.url, "--log", str(sim.log), "--runs", "1",
                                 "--concurrency-divisor", "16", "--trace", str(trace))
    finally:
        sim.stop()
    assert doc["verdict"] == "pressure-dependent", doc["reason"]
    ladder = doc["ladder"]
    assert ladder[0]["max_in_flight"] == 4 and not ladder[0]["failed"] and ladder[-1]["failed"]
    # The pressure ladder: each rung's peak token usage higher than the one below, up to the failure.
    usages = [r["peak_token_usage"] for r in ladder]
    assert usages == sorted(usages) and usages[-1] >= 0.85, ladder
    fails = doc["conditions"]["pressure"]
    assert fails["state"] == "needed" and fails["fails_at"] == usages[-1] and fails["clean_at"] == usages[-2]
    failing = next(s for s in doc["steps"] if s["signatures"])
    lock = next(d for d in failing["signature_detail"] if d["id"] == "radix-page-lock-eviction")
    assert lock["count"] >= 1 and lock["first_time"]
    # The simulator, as SGLang, cannot race a radix tree it does not have: the control is clean.
    control = doc["steps"][-1]
    assert control["step"] == "cache-off" and control["signatures"] == [] and "--disable-radix-cache" in control[
        "argv"]
    assert control["answered_calls"] == 120 and control["evicted_tokens_per_s"] is not None
    assert control["max_in_flight"] == failing["max_in_flight"]  # at the load it failed at
    table = "\n".join(doc["table"])
    for column in ("change", "in flight", "result", "peak", "evict/s", "retr", "cached"):
        assert column in table
    assert "radix-page-lock-eviction" in done.stderr and "VERDICT" not in done.stdout  # --json: one object


def test_a_healthy_server_is_not_reproduced(tmp_path: Path) -> None:
    sim = start_sim(
        tmp_path / "live", "--page-size", "16", "--max-total-tokens", "16384", "--max-running-requests", "64"
    )
    try:
        doc, _ = confirm_json(tmp_path, "--url", sim.url, "--log", str(sim.log), "--runs", "1",
                              "--trace", str(pressure_trace_file(tmp_path / "t.json")))
    finally:
        sim.stop()
    assert doc["verdict"] == "not-reproduced", doc["reason"]


def test_after_the_server_died_confirm_plans_from_what_was_seen_and_runs_two_arms(tmp_path: Path) -> None:
    sim = start_sim(tmp_path / "live", *PRESSURE_SIM, env={"SGLANG_TEST_FLAG": "7", "HF_TOKEN": "hf_" + "a" * 30})
    try:
        # What the TUI (or a first confirm) keeps while the server lives.
        seen = observe(sim.url, sim.pid, logs=[str(sim.log)])
        written = save_sighting(seen)
    finally:
        sim.proc.send_signal(signal.SIGKILL)
        sim.proc.wait(10)
    assert seen.env["SGLANG_TEST_FLAG"] == "7" and "HF_TOKEN" in seen.secret_keys
    assert "hf_aaaa" not in written.read_text() and "HF_TOKEN" in written.read_text()  # name kept, value never
    doc, done = confirm_json(tmp_path, "--url", sim.url, "--runs", "1", "--concurrency-divisor", "16",
                             "--trace", str(pressure_trace_file(tmp_path / "t.json")))
    assert doc["mode"] == "relaunch" and "planned from what was seen at" in doc["planned_from"]
    first = doc["steps"][0]
    assert first["role"] == "reproduction" and first["healthy"]
    assert doc["verdict"] == "pressure-dependent", doc["reason"]
    repro = first["argv"]
    assert "--fault" in repro and PRESSURE_SIM[-1] in repro and "--disable-radix-cache" not in repro
    assert "--disable-radix-cache" in doc["steps"][-1]["argv"]
    plan = doc["plan"]
    assert [a["role"] for a in plan["arms"]] == ["reproduction", "control"]
    assert "DOWN: the server is down; planned from what was seen" in done.stderr
    # The reproduction got the environment the server had (what was kept: secret values are not).
    out = Path(tmp_path / "c" / "reproduction.out")
    assert out.is_file() and all(gone(s["pid"]) for s in doc["steps"] if s.get("pid"))


def test_no_reproduction_takes_the_crash_log_as_the_baseline_and_says_what_that_assumes(tmp_path: Path) -> None:
    sim = start_sim(tmp_path / "live", *PRESSURE_SIM)
    try:
        save_sighting(observe(sim.url, sim.pid, logs=[str(sim.log)]))
        trace = pressure_trace_file(tmp_path / "t.json")
        assert radixtop("replay", str(trace), "--url", sim.url, "--runs", "1", timeout_s=60).returncode == 0  # crash it
        assert wait_for(lambda: sim.proc.poll() is not None, 10)
    finally:
        sim.stop()
    # No ladder above it (a divisor of 1): the crash log stands for the workload as run, and decides first.
    doc, _ = confirm_json(tmp_path, "--url", sim.url, "--runs", "1", "--trace", str(trace), "--no-reproduction",
                          "--concurrency-divisor", "1")
    assert doc["mode"] == "crash-log" and "may have differed" in doc["assumption"]
    crash_log, *rest = doc["steps"]
    assert crash_log["role"] == "crash-log" and crash_log["step"] == "as-run"
    assert "radix-page-lock-eviction" in crash_log["signatures"] and crash_log["peak_token_usage"] >= 0.85
    # It failed under pressure: the ladder goes down by halves, on a server started with its flags,
    # until a rung is clean; the questions after it run at the least load it failed at.
    rungs = [s for s in rest if s["step"] == "lower-pressure"]
    assert rungs and all(s["role"] == "reproduction" for s in rungs) and not rungs[-1]["signatures"]
    assert [s["max_in_flight"] for s in rungs] == sorted((s["max_in_flight"] for s in rungs), reverse=True)
    conditions = {k: v["state"] for k, v in doc["conditions"].items()}
    assert conditions == {"pressure": "needed", "reuse": "not-needed", "cache": "needed"}, doc["conditions"]
    assert doc["conditions"]["pressure"]["clean_at"] == rungs[-1]["peak_token_usage"]
    assert doc["verdict"] == "pressure-dependent"
    assert [a["role"] for a in doc["plan"]["arms"]] == ["reproduction", "control"]


def test_a_dead_server_never_seen_is_one_line_naming_what_to_pass(tmp_path: Path) -> None:
    done = radixtop("confirm", "--url", "http://127.0.0.1:9", "--yes", "--workdir", str(tmp_path / "w"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "never saw it alive" in done.stderr and "--launch-command" in done.stderr


def test_a_launch_command_that_does_not_parse_is_one_line(tmp_path: Path) -> None:
    done = radixtop("confirm", "--url", "http://127.0.0.1:9", "--yes", "--workdir", str(tmp_path / "w"),
                    "--launch-command", "python -m sglang.launch_server --model-path 'unterminated")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "cannot be split" in done.stderr


def _options(tmp_path: Path, url: str, **kw) -> ConfirmOptions:
    return ConfirmOptions(**{"url": url, "workdir": tmp_path / "c", "trace": small_trace(), "bundle": False,
                             "control_timeout_s": 20, **kw})


def test_a_server_that_dies_while_the_evidence_is_taken_is_planned_as_down(tmp_path: Path) -> None:
    """`c` pressed as the server dies: alive when asked, gone by the time the plan reads its
    environment. The plan relaunches from what was seen, with the server's environment as seen."""
    sim = start_sim(tmp_path / "live", *HEALTHY_FLAGS, env={"SGLANG_TEST_FLAG": "7"})

    def die_at_the_evidence(event) -> None:
        if event.phase == "evidence" and sim.proc.poll() is None:
            sim.proc.send_signal(signal.SIGKILL)
            sim.proc.wait(10)

    try:
        plan = asyncio.run(prepare(_options(tmp_path, sim.url, runs=1, bundle=True), on_event=die_at_the_evidence))
    finally:
        sim.stop()
    assert not plan.blockers, plan.blockers
    assert plan.mode == "relaunch" and plan.planned_from is not None
    assert plan.planned_from.startswith("the server died while the evidence was taken")
    assert plan.restart is not None and plan.restart.env["SGLANG_TEST_FLAG"] == "7"


def test_an_unreadable_environment_blocks_the_plan_unless_own_env(tmp_path: Path, monkeypatch) -> None:
    # Root reads every process's environ here; another user's server is unreadable on a real node.
    monkeypatch.setattr("radixtop.incident.common.server.process_environ", lambda pid: None)
    sim = start_sim(tmp_path / "live", *HEALTHY_FLAGS)
    try:
        plan = asyncio.run(prepare(_options(tmp_path, sim.url, runs=1)))
        assert plan.blockers and "--own-env" in plan.blockers[0]
        run = ConfirmationRun(plan)
        with pytest.raises(PlanError, match="not readable"):
            asyncio.run(run.run())
        assert run.servers == []
        allowed = asyncio.run(prepare(_options(tmp_path, sim.url, runs=1, own_env=True)))
        assert not allowed.blockers
    finally:
        sim.stop()


def test_a_port_taken_between_plan_and_start_starts_nothing(tmp_path: Path) -> None:
    sim = start_sim(tmp_path / "live", *HEALTHY_FLAGS)
    squatter = socket.socket()
    try:
        plan = asyncio.run(prepare(_options(tmp_path, sim.url, runs=1, stop_original=True)))
        squatter.bind(("127.0.0.1", plan.restart.port))
        squatter.listen()
        run = ConfirmationRun(plan)
        verdict = asyncio.run(run.run())
    finally:
        squatter.close()
        sim.stop()
    assert verdict.verdict == "inconclusive"
    assert f"port {plan.restart.port} was taken between the plan and the start" in verdict.steps[0].error
    assert run.servers == [] and not (tmp_path / "c" / "reproduction.out").exists()


def test_an_arms_port_is_outside_the_ephemeral_range_and_a_servers_own_time_wait_does_not_take_it() -> None:
    """A replay's client connections take source ports from the ephemeral range (and such a port
    stays unbindable while its connection lingers): an arm's port comes from below it. A port a
    server closed connections on is left in TIME_WAIT, which a server binding with SO_REUSEADDR
    (uvicorn, SGLang) ignores: the check before an arm starts asks as that server would."""
    from radixtop.incident.confirm.control_server import _ephemeral_low, free_loopback_port, port_free

    low = _ephemeral_low()
    assert all(free_loopback_port() < low for _ in range(20))
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    assert client.getsockname()[1] >= low  # where outgoing connections take their ports
    accepted, _ = listener.accept()
    accepted.close()  # the server closes first: its side is left in TIME_WAIT
    time.sleep(0.05)
    client.close()
    listener.close()
    plain = socket.socket()
    try:
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))  # a bind without SO_REUSEADDR calls it taken
    finally:
        plain.close()
    assert port_free(port)
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    try:
        assert not port_free(port)  # a listener is taken
    finally:
        squatter.close()


def test_a_started_server_killed_mid_run_is_inconclusive_with_its_death(tmp_path: Path) -> None:
    sim = start_sim(tmp_path / "live", *HEALTHY_FLAGS)
    try:
        plan = asyncio.run(prepare(_options(tmp_path, sim.url, runs=40, stop_original=True)))
        run: ConfirmationRun

        def on_event(event) -> None:
            if event.phase == "reproduction" and "run 2/" in event.message and run.control is not None:
                os.kill(run.control.pid, signal.SIGKILL)

        run = ConfirmationRun(plan, on_event)
        verdict = asyncio.run(run.run())
    finally:
        sim.stop()
    assert verdict.verdict == "inconclusive", verdict.format()
    assert "was killed by signal 9 (SIGKILL) during the replay" in verdict.steps[0].error
    assert "killed by signal 9" in verdict.reason and len(verdict.steps) == 1


def test_one_run_per_node_a_second_confirm_watches_the_first_and_shows_its_verdict(tmp_path: Path) -> None:
    sim = start_sim(tmp_path / "live", *HEALTHY_FLAGS)
    trace = tmp_path / "small.json"
    save_trace(small_trace(), trace)
    first_lines: list[str] = []
    first = subprocess.Popen(
        [sys.executable, "-m", "radixtop", "confirm", "--url", sim.url, "--trace", str(trace), "--runs", "25",
         "--yes", "--no-bundle", "--workdir", str(tmp_path / "a")],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    reader = threading.Thread(target=lambda: first_lines.extend(first.stderr), daemon=True)
    reader.start()
    try:
        assert wait_for(lambda: any("[baseline] run 1/" in line for line in first_lines), 60), "".join(first_lines)
        second = radixtop("confirm", "--url", sim.url, "--trace", str(trace), "--yes", "--no-bundle",
                          "--workdir", str(tmp_path / "b"), timeout_s=180)
        first_out, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
        sim.stop()
    assert "a confirmation run is in progress on this node" in second.stderr and "watching it" in second.stderr
    assert "[baseline] step 2" in second.stderr  # its phases, as they came
    assert "VERDICT: not-reproduced" in second.stdout and "VERDICT: not-reproduced" in first_out
    assert second.returncode == 0 and not (tmp_path / "b").exists()  # nothing of its own was started


def test_a_sighting_round_trips_and_keeps_no_secret_value(tmp_path: Path) -> None:
    sim = start_sim(tmp_path / "live", *HEALTHY_FLAGS, env={"SGLANG_X": "1", "HF_API_KEY": "k" * 20, "UNRELATED": "u"})
    try:
        seen = observe(sim.url, sim.pid, logs=[str(sim.log)])
    finally:
        sim.stop()
    path = save_sighting(seen)
    text = path.read_text()
    assert "k" * 20 not in text and "UNRELATED" not in text
    loaded = load_sighting(sim.url)
    assert loaded is not None and loaded.argv == seen.argv and loaded.env["SGLANG_X"] == "1"
    assert "HF_API_KEY" not in loaded.env and "HF_API_KEY" in loaded.secret_keys
    assert loaded.logs == (str(sim.log),) and loaded.python == seen.python
    assert os.stat(path.parent).st_mode & 0o077 == 0  # private to the user


SLOW_START = """
import os, sys, time
for i in range(6):  # what a real server prints while it loads a model
    print(f"Loading safetensors checkpoint shards: {(i + 1) * 100 // 6}% Completed | {i + 1}/6", flush=True)
    time.sleep(0.5)
print("\\x1b[1;33m'--disable-cuda-graph' is deprecated\\x1b[0m", flush=True)  # SGLang colours its warnings
time.sleep(1.5)
os.execv(sys.executable, [sys.executable, "-m", "radixtop", "sim", *sys.argv[1:]])
"""


def test_a_slow_server_start_shows_its_own_lines_and_the_timeout_is_the_users(tmp_path: Path) -> None:
    script = tmp_path / "slow_server.py"
    script.write_text(SLOW_START)
    sim = start_sim(tmp_path / "live", *HEALTHY_FLAGS)
    try:
        command = f"{sys.executable} {script} --page-size 16 --max-total-tokens 4096 --max-running-requests 8"
        events: list = []
        plan = asyncio.run(prepare(_options(tmp_path, sim.url, runs=1, launch_command=command, control_timeout_s=30,
                                            stop_original=True)))
        verdict = asyncio.run(ConfirmationRun(plan, events.append).run())
        assert verdict.steps[0].healthy and verdict.steps[0].start_s >= 2.5
        progress = [e.message for e in events if e.phase == "reproduction-start"]
        assert any("Loading safetensors checkpoint shards" in m for m in progress), progress
        assert any(m.endswith(" '--disable-cuda-graph' is deprecated") for m in progress), progress  # no colours
        # Too short a --control-timeout for the load: inconclusive, with the lines it got to.
        short = asyncio.run(prepare(_options(tmp_path / "short", sim.url, runs=1, launch_command=command,
                                             control_timeout_s=1)))
        late = asyncio.run(ConfirmationRun(short).run())
    finally:
        sim.stop()
    assert late.verdict == "inconclusive" and "not healthy within 1 s" in late.steps[0].error
    assert "Loading safetensors" in late.steps[0].output_tail


def test_a_program_the_server_names_in_its_argv_is_never_what_confirm_runs(tmp_path: Path) -> None:
    """`exec -a /some/dir/python`: argv[0] is the process's own choice; the plan runs the
    interpreter the kernel says it runs, and a script no one vouches for is refused."""
    evil = tmp_path / "evil"
    evil.mkdir()
    marker = tmp_path / "ran"
    fake = evil / "python"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\n")
    fake.chmod(0o755)
    ready = tmp_path / "port"
    proc = subprocess.Popen(
        [str(fake), "-m", "radixtop", "sim", "--port", "0", "--ready-file", str(ready), *HEALTHY_FLAGS],
        executable=sys.executable, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        # Python looks for its environment beside argv[0]: give it this one's packages.
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
    )
    try:
        assert wait_for(lambda: ready.exists() and ready.read_text().strip(), 20)
        url = f"http://127.0.0.1:{ready.read_text().strip()}"
        plan = asyncio.run(prepare(_options(tmp_path, url, runs=1)))
        assert plan.live.program[0] == os.path.realpath(sys.executable) != str(fake)
        assert all(str(evil) not in a for arm in plan.arms for a in arm.argv or ())
        # A world-writable directory holding the interpreter: nothing of it is run, one line says why.
        evil.chmod(0o777)
        os.symlink(os.path.realpath(sys.executable), evil / "python3")
        proc2 = subprocess.Popen([str(evil / "python3"), "-c", "import time; time.sleep(30)"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            from radixtop.incident.common.server import server_interpreter

            python, why = server_interpreter(proc2.pid)
            assert python == os.path.realpath(sys.executable) and "link" not in why  # not the writable link
        finally:
            proc2.kill()
            proc2.wait(5)
    finally:
        proc.kill()
        proc.wait(10)
    assert not marker.exists()


OOM_AT_START = """
import sys, time
print("Loading safetensors checkpoint shards: 100% Completed | 6/6", flush=True)
time.sleep(0.3)
print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
      "of 79.19 GiB of which 1.06 GiB is free.", flush=True)
sys.exit(1)
"""


def test_a_server_that_dies_at_start_is_inconclusive_with_its_last_lines_and_death_signature(tmp_path: Path) -> None:
    """What a server started on GPUs another process still holds does on a real node."""
    script = tmp_path / "oom_server.py"
    script.write_text(OOM_AT_START)
    sim = start_sim(tmp_path / "live", *HEALTHY_FLAGS)
    try:
        command = f"{sys.executable} {script} --page-size 16 --max-running-requests 8"
        plan = asyncio.run(prepare(_options(tmp_path, sim.url, runs=1, launch_command=command, stop_original=True)))
        verdict = asyncio.run(ConfirmationRun(plan).run())
    finally:
        sim.stop()
    assert verdict.verdict == "inconclusive" and "exited with status 1 before it was healthy" in verdict.reason
    assert "cuda-oom" in verdict.steps[0].death_signatures
    assert "CUDA out of memory" in verdict.steps[0].output_tail
    assert "Died, step 1 (lower load, 2 in flight, on the reproduction), with: cuda-oom" in verdict.format()


def test_nvml_failing_leaves_the_placement_unknown_in_the_plan_and_asks(tmp_path: Path, monkeypatch) -> None:
    from test_probe_gpu import FakeNvml

    nvml = FakeNvml(monkeypatch)
    nvml.fail("nvmlInit", 9)  # driver not loaded
    sim = start_sim(tmp_path / "live", *HEALTHY_FLAGS)
    try:
        plan = asyncio.run(prepare(_options(
            tmp_path, sim.url, runs=1, launch_command="python -m sglang.launch_server --model-path m --tp-size 2"
        )))
    finally:
        sim.stop()
    assert plan.placement.status == "unknown" and not plan.blockers  # it asks; nothing is decided for the user
    text = "\n".join(plan.describe())
    assert "placement unknown: NVML NVIDIA driver not loaded" in text and "--gpus" in text
