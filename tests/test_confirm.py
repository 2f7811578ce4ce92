"""The confirmation run end to end: real simulators as the live server and as the control."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
from incident_helpers import HEALTHY_FLAGS, LOCK_RACE_FLAGS, gone, radixtop, small_trace, start_sim, wait_for

from radixtop.incident.common.redact import REDACTED, Redactor
from radixtop.incident.confirm.confirm import (
    ConfirmOptions,
    PlanError,
    prepare,
)
from radixtop.incident.confirm.confirm_run import ConfirmationRun
from radixtop.incident.confirm.control_server import (
    build_control_argv,
    flag_value,
    parse_launch_command,
)
from radixtop.incident.replay.trace import builtin_trace, save_trace

LOCK_RACE = LOCK_RACE_FLAGS
HEALTHY = HEALTHY_FLAGS


def _confirm(options: ConfirmOptions):
    events = []
    plan = asyncio.run(prepare(options, events.append))
    run = ConfirmationRun(plan, events.append)
    verdict = asyncio.run(run.run())
    return plan, run, verdict, events


def test_lock_race_needs_pressure_and_the_caches_eviction_path_and_leaves_nothing_running(tmp_path: Path) -> None:
    sim = start_sim(tmp_path / "live", *LOCK_RACE)
    try:
        plan, run, verdict, events = _confirm(
            # a divisor of 2 keeps the test short: 4 in flight still use well under 90 % of the pool
            ConfirmOptions(
                url=sim.url, workdir=tmp_path / "confirm", runs=2, control_timeout_s=20, concurrency_divisor=2
            )
        )
    finally:
        sim.stop()
    assert verdict.verdict == "pressure-dependent", verdict.format()
    c = verdict.conditions
    assert (c.pressure.state, c.reuse.state, c.cache.state) == ("needed", "not-needed", "needed"), verdict.format()
    assert c.pressure.fails_at >= 0.9 and c.pressure.clean_at < c.pressure.fails_at
    assert "persists with reuse off, gone with the cache disabled" in c.cache.why
    # The ladder from the lowest load up on the live server; the race killed it as recorded.
    kinds = [(s.step, s.role, s.max_in_flight) for s in verdict.steps]
    assert kinds == [("lower-pressure", "baseline", 4), ("as-run", "baseline", None),
                     ("reuse-off", "reproduction", None), ("cache-off", "control", None)]
    lower, as_run, reuse_off, cache_off = verdict.steps
    assert lower.signatures == () and "radix-page-lock-eviction" in as_run.signatures
    assert as_run.alive_after is False  # the run killed it: that is the evidence
    # Reuse off on a restarted reproduction (SGLang's own switch): no prefix hit, the race still fires.
    assert reuse_off.reuse_off == "SGLANG_RADIX_FORCE_MISS=1" and reuse_off.cached_tokens["cached_tokens"] == 0
    assert "radix-page-lock-eviction" in reuse_off.signatures
    assert cache_off.healthy and cache_off.signatures == () and cache_off.diverged == ()
    # the plan: evidence first, the live argv from psutil, the servers it starts on loopback
    phases = [e.phase for e in events]
    assert phases.index("evidence") < phases.index("plan") < phases.index("baseline") < phases.index(
        "reproduction-start") < phases.index("control-start")
    written = [e for e in events if e.message.startswith("bundle written")]
    assert len(written) == 1 and written[0].data["bundle"] == str(plan.bundle.path)  # said once, with the path
    assert plan.live.source == "psutil" and plan.live.kind == "radixtop-sim"
    assert flag_value(plan.control_argv, "--max-running-requests") == "8"  # its load is the steps' to set
    assert flag_value(plan.control_argv, "--disable-radix-cache") == ""
    assert flag_value(plan.control_argv, "--host") == "127.0.0.1"
    assert flag_value(plan.control_argv, "--fault") == "lock-race:7"  # other flags kept
    assert flag_value(plan.control_argv, "--log-file") == str(tmp_path / "confirm" / "control.log")
    assert "SGLANG_RADIX_FORCE_MISS" not in (plan.restart.env or {})  # only the step with reuse off has it
    # evidence first: the bundle was taken before anything was replayed
    assert plan.bundle is not None and (plan.bundle.path / "MANIFEST.json").is_file()
    assert next(plan.bundle.path.glob("evidence/*radix-page-lock-eviction.log"), None) is None
    # the verdict's evidence and the command to repeat it are on disk
    saved = json.loads((tmp_path / "confirm" / "verdict.json").read_text())
    assert saved["verdict"] == "pressure-dependent" and saved["repeat"][:2] == ["radixtop", "confirm"]
    assert saved["conditions"]["reuse"]["state"] == "not-needed"
    assert [r["failed"] for r in saved["ladder"]] == [False, True]
    assert "--trace" in saved["repeat"] and Path(saved["repeat"][saved["repeat"].index("--trace") + 1]).is_file()
    assert len(run.servers) == 2 and all(gone(server.pid) for server in run.servers)
    # The bundle taken first holds the outcome too, its evidence's hashes as they were.
    from radixtop.incident.bundle.bundle import verify_bundle

    kept = json.loads((plan.bundle.path / "experiment" / "verdict.json").read_text())
    assert kept["conditions"] == saved["conditions"]
    picture = (plan.bundle.path / "experiment" / "ladder.html").read_text()
    assert "The pressure ladder" in picture and picture.count('<tr class="fail">') >= 2 and "<script" not in picture
    assert verify_bundle(plan.bundle.path) == [] and verify_bundle(plan.bundle.archive) == []
    manifest = json.loads((plan.bundle.path / "MANIFEST.json").read_text())
    assert {"experiment/verdict.json", "experiment/ladder.html"} <= {f["path"] for f in manifest["files"]}


@pytest.mark.parametrize("page_size", [64, 16])
def test_the_stale_page_at_a_block_boundary_needs_reuse_not_pressure(tmp_path: Path, page_size: int) -> None:
    sim = start_sim(tmp_path / "live", "--page-size", str(page_size), "--max-total-tokens", "65536",
                    "--fault", "block-boundary:7")
    try:
        done = radixtop("confirm", "--url", sim.url, "--trace", "finding_03330", "--runs", "3", "--yes", "--json",
                        "--workdir", str(tmp_path / "confirm"), "--health-timeout", "20", timeout_s=120)
        assert sim.proc.poll() is None  # every step ran on the live server, and it lives
    finally:
        sim.stop()
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    # No capacity pressure in a 65,536-token pool; gone with a namespace per request at the same load.
    assert doc["verdict"] == "cache-dependent", doc["reason"]
    conditions = doc["conditions"]
    assert [conditions[k]["state"] for k in ("pressure", "reuse", "cache")] == ["not-needed", "needed", "needed"]
    assert conditions["pressure"]["fails_at"] < 0.85 and "below pressure" in conditions["pressure"]["why"]
    failing, reuse_off = doc["steps"]
    assert failing["step"] == "lower-pressure" and failing["role"] == "baseline" and not failing["retractions"]
    assert failing["diverged"] == ["r02"] and failing["signatures"] == []
    r02 = next(r for r in builtin_trace("finding_03330").requests if r.id == "r02")
    assert r02.prefix_len == 64  # exactly one page as written (rescaled to the server's page size)
    assert any(f"rescaled to the server's {page_size}" in n for n in doc["plan"]["notes"]) or page_size == 64
    assert reuse_off["reuse_off"] == "a namespace per request" and reuse_off["max_in_flight"] == failing[
        "max_in_flight"]
    assert reuse_off["diverged"] == [] and reuse_off["cached_tokens"]["cached_tokens"] == 0
    assert Path(doc["bundle"]).is_dir()
    assert "approved with --yes" in done.stderr and "[baseline]" in done.stderr and "[control]" not in done.stderr


def test_healthy_server_is_not_reproduced_and_stop_original_is_honoured(tmp_path: Path) -> None:
    sim = start_sim(tmp_path / "live", *HEALTHY)
    try:
        options = ConfirmOptions(
            url=sim.url, workdir=tmp_path / "confirm", trace=small_trace(), runs=2, control_timeout_s=20,
            stop_original=True,
        )
        plan, run, verdict, events = _confirm(options)
        assert verdict.verdict == "not-reproduced", verdict.format()
        # Asked to stop the original: it did, first; then the ladder on a reproduction of it, and no more.
        assert any(e.phase == "stop-original" and e.message.startswith(f"stopped pid {sim.pid}") for e in events)
        assert sim.proc.wait(10) is not None
        assert [(s.step, s.role, s.max_in_flight) for s in verdict.steps] == [
            ("lower-pressure", "reproduction", 2), ("lower-pressure", "reproduction", 4),
            ("as-run", "reproduction", None)]
        assert all(s.answered_calls == 8 for s in verdict.steps)
        assert len(run.servers) == 1  # one start for every rung; no control once the answer was known
    finally:
        sim.stop()
    assert plan.mode == "relaunch" and "STOPPED FIRST" in "\n".join(plan.describe())
    assert gone(run.servers[0].pid)


def test_a_control_that_cannot_start_leaves_the_cache_open_with_its_stderr(tmp_path: Path) -> None:
    sim = start_sim(tmp_path / "live", *LOCK_RACE)
    try:
        options = ConfirmOptions(
            url=sim.url, workdir=tmp_path / "confirm", runs=2, control_timeout_s=20, concurrency_divisor=2,
            control_args=("--page-size", "-3"), bundle=False,
        )
        _, run, verdict, _ = _confirm(options)
    finally:
        sim.stop()
    cache_off = verdict.step("cache-off")
    assert verdict.conditions.cache.state == "open" and "could not run" in verdict.conditions.cache.why
    assert "exited with status 2" in cache_off.error
    assert "--page-size must be" in cache_off.output_tail
    assert "--page-size must be" in verdict.format()
    assert verdict.verdict == "pressure-dependent" and "open: cache" in verdict.reason
    assert all(gone(server.pid) for server in run.servers)


def test_ctrl_c_cancels_the_run_stops_the_control_and_leaves_the_live_server(tmp_path: Path) -> None:
    """SIGINT reaches ConfirmationRun.cancel() (what a UI calls): the control goes, nothing is left."""
    # A leak needs neither pressure nor reuse: the live server survives every step, and the control runs.
    sim = start_sim(tmp_path / "live", *HEALTHY, "--fault", "leak")
    trace = tmp_path / "small.json"
    save_trace(small_trace(), trace)
    lines: list[str] = []
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixtop", "confirm", "--url", sim.url, "--trace", str(trace), "--runs", "30",
         "--yes", "--no-bundle", "--workdir", str(tmp_path / "c"), "--health-timeout", "20",
         "--concurrency-divisor", "2"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        assert wait_for(lambda: any("[control] run 2/" in line for line in lines), 90), "".join(lines)
        children = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        assert children, "the control server should be running"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 130
        reader.join(5)
        assert all(gone(pid) for pid in children)
        assert sim.proc.poll() is None  # the live server is untouched
    finally:
        if proc.poll() is None:
            proc.kill()
        sim.stop()
    assert any("cancelled; the servers radixtop started were stopped" in line for line in lines)
    assert not (tmp_path / "c" / "verdict.json").exists()


def test_confirm_cli_shows_the_plan_on_a_terminal_and_starts_nothing_when_declined(tmp_path: Path) -> None:
    sim = start_sim(tmp_path / "live", *HEALTHY)
    primary, secondary = pty.openpty()  # stdin is a terminal: the CLI asks
    try:
        os.write(primary, b"n\n")
        done = radixtop("confirm", "--url", sim.url, "--trace", "finding_03330", "--workdir", str(tmp_path / "c"),
                        stdin=secondary)
        assert sim.proc.poll() is None
    finally:
        os.close(primary)
        os.close(secondary)
        sim.stop()
    assert done.returncode == 1, done.stderr
    assert "Start the confirmation run as planned? [y/N]" in done.stderr and done.stdout == ""
    assert "the server without the cache: " in done.stderr and "--disable-radix-cache" in done.stderr
    assert "Experiment" in done.stderr and "not approved" in done.stderr
    assert not (tmp_path / "c" / "control.out").exists() and not (tmp_path / "c" / "verdict.json").exists()
    assert (tmp_path / "c" / "plan.json").is_file()


def test_confirm_cli_asks_and_refuses_without_a_terminal(tmp_path: Path) -> None:
    done = radixtop("confirm", "--url", "http://127.0.0.1:9", "--workdir", str(tmp_path / "w"))
    assert done.returncode == 2 and "pass --yes" in done.stderr and not (tmp_path / "w").exists()
    refused = radixtop("--readonly", "confirm", "--url", "http://127.0.0.1:9", "--yes")
    assert refused.returncode == 2 and "--readonly" in refused.stderr
    nothing = radixtop("confirm", "--url", "http://127.0.0.1:9", "--yes", "--workdir", str(tmp_path / "w2"))
    assert nothing.returncode == 2 and "--launch-command" in nothing.stderr and nothing.stderr.count("\n") == 1


def test_control_argv_for_sglang_launch_commands() -> None:
    text = (
        "python3 -m sglang.launch_server --model-path Qwen/Qwen2.5-0.5B-Instruct --host 0.0.0.0 --port 8000 "
        "--api-key 'sk-live key 123' --nccl-port 5000 --max-running-requests 64 --enable-deterministic-inference"
    )
    live = parse_launch_command(text, source="given")  # the user's own --launch-command: taken as written
    assert live.kind == "sglang" and live.program == ("python3", "-m", "sglang.launch_server")
    reported = parse_launch_command(text, python="/srv/venv/bin/python")  # /server_info: flags only
    assert reported.program == ("/srv/venv/bin/python", "-m", "sglang.launch_server") and reported.notes
    assert reported.flags == live.flags
    argv, changes = build_control_argv(live, port=40001, extra=("--mem-fraction-static", "0.3"))
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert flag_value(argv, "--host") == "127.0.0.1" and flag_value(argv, "--port") == "40001"
    # One condition changes: the cache; the load is the experiment's, by calls in flight.
    assert flag_value(argv, "--max-running-requests") == "64" and flag_value(argv, "--disable-radix-cache") == ""
    assert flag_value(argv, "--api-key") is None and flag_value(argv, "--nccl-port") is None
    assert (
        flag_value(argv, "--enable-deterministic-inference") == ""
        and flag_value(argv, "--mem-fraction-static") == "0.3"
    )
    assert "added --disable-radix-cache" in changes
    # the string is split like a shell would, never run by one; its secret never shown
    shown = shlex.join(Redactor().argv(live.argv))
    assert "sk-live" not in shown and REDACTED in shown
    # SGLang's sys.argv form and the simulator's flags-only form
    assert parse_launch_command("/x/sglang/launch_server.py --port 1").program[1:] == ("-m", "sglang.launch_server")
    sim = parse_launch_command("--port 0 --fault lock-race:7", version="0.5.23-radixtop-sim")
    assert sim.kind == "radixtop-sim" and sim.program[1:] == ("-m", "radixtop", "sim") and sim.notes


# A server whose /server_info names a hostile program, code-loading flags and a private file as its
# log. It runs as `python -c ...` (no --flags), so confirm has only /server_info to go by.
_HOSTILE_SERVER = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
info = {"version": "0.5.23", "page_size": 16, "max_total_num_tokens": 4096, "launch_command":
        "/bin/sh -c 'touch " + sys.argv[2] + "' --model-path evil/model --trust-remote-code "
        "--custom-weight-loader evil.loader --log-file " + sys.argv[3] + " --max-running-requests 8"}
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps(info).encode() if self.path.startswith("/server_info") else b"{}"
        self.send_response(200 if self.path.startswith(("/server_info", "/health")) else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
server = HTTPServer(("127.0.0.1", 0), H)
open(sys.argv[1], "w").write(str(server.server_address[1]))
server.serve_forever()
"""


def test_a_program_flags_and_files_named_by_server_info_are_never_run_or_read(tmp_path: Path) -> None:
    port_file, pwned, private = tmp_path / "port", tmp_path / "pwned", tmp_path / "id_key"
    private.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1r\n-----END OPENSSH PRIVATE KEY-----\n")
    proc = subprocess.Popen([sys.executable, "-c", _HOSTILE_SERVER, str(port_file), str(pwned), str(private)])
    try:
        assert wait_for(
            lambda: port_file.exists() and port_file.read_text().strip(), 20
        ), "the fake server did not start"
        options = ConfirmOptions(url=f"http://127.0.0.1:{port_file.read_text()}", workdir=tmp_path / "c",
                                 trace=small_trace(), runs=1, bundle=False)
        plan = asyncio.run(prepare(options))
    finally:
        proc.kill()
        proc.wait(10)
    assert plan.live.source == "server_info"
    # the program is the server's own interpreter running SGLang's module, never the claimed /bin/sh
    assert plan.control_argv[1:3] == ["-m", "sglang.launch_server"]
    assert plan.control_argv[0] == sys.executable  # the interpreter psutil saw the server run
    assert not any("/bin/sh" in a or "touch" in a for a in plan.control_argv)
    assert any("never run" in n for n in plan.live.notes + tuple(plan.notes))
    # code-loading flags named by the network are dropped, and the plan says how to add them back
    assert flag_value(plan.control_argv, "--trust-remote-code") is None
    assert flag_value(plan.control_argv, "--custom-weight-loader") is None
    assert any("--control-arg=--trust-remote-code" in c for c in plan.control.changes)
    assert flag_value(plan.control_argv, "--model-path") == "evil/model"  # other flags kept
    # a log path named by /server_info is not read into the evidence
    assert str(private) not in plan.baseline_logs
    assert not pwned.exists()


def test_a_listener_that_is_not_sglang_is_refused_without_a_launch_command(tmp_path: Path) -> None:
    """A proxy or wrapper on the port (its argv has --flags but is not SGLang): relaunching it
    would confirm nothing; the plan stops with a line that says to pass --launch-command."""
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, "-c", _HOSTILE_SERVER, str(port_file), str(tmp_path / "p"),
                             str(tmp_path / "l"), "--proxy-mode", "on"])
    try:
        assert wait_for(lambda: port_file.exists() and port_file.read_text().strip(), 20)
        options = ConfirmOptions(url=f"http://127.0.0.1:{port_file.read_text()}", workdir=tmp_path / "c",
                                 trace=small_trace(), runs=1, bundle=False)
        with pytest.raises(PlanError, match="neither SGLang nor radixtop's simulator; pass --launch-command"):
            asyncio.run(prepare(options))
    finally:
        proc.kill()
        proc.wait(10)


def test_a_trace_written_for_another_page_size_is_rescaled_to_the_servers(tmp_path: Path) -> None:
    """finding_03330 is written for page size 64: against a server with 16-token pages its
    one-page prefix must become 16 tokens, or the boundary case tests nothing."""
    sim = start_sim(tmp_path / "live", "--page-size", "16", "--max-total-tokens", "65536")
    try:
        options = ConfirmOptions(url=sim.url, workdir=tmp_path / "c", trace=builtin_trace("finding_03330"),
                                 runs=1, bundle=False)
        plan = asyncio.run(prepare(options))
    finally:
        sim.stop()
    assert plan.trace.page_size_hint == 16
    assert next(r for r in plan.trace.requests if r.id == "r02").prefix_len == 16
    assert any("rescaled to the server's 16" in n for n in plan.notes)


def test_the_live_max_running_requests_comes_from_the_flag_else_server_info_else_what_sglang_settled_on() -> None:
    """SGLang sizes max_running_requests from its KV pool when the flag is absent (the usual case):
    0.5.23's /server_info then says None for the argument and the effective figure per DP rank in
    internal_states; the pressure ladder must still start below that."""
    from radixtop.incident.confirm.confirm import _max_running
    from radixtop.probes.server_info import LimitError, ServerLimits

    bare = parse_launch_command("python -m sglang.launch_server --model-path m", source="given")
    flagged = parse_launch_command("python -m sglang.launch_server --max-running-requests 64", source="given")
    info = {"max_running_requests": None, "internal_states": [{"effective_max_running_requests_per_dp": 512}]}
    assert _max_running(bare, ServerLimits.read(info)) == 512
    assert _max_running(flagged, ServerLimits.read(info)) == 64
    assert _max_running(bare, ServerLimits.read({**info, "max_running_requests": 128})) == 128
    assert _max_running(bare, ServerLimits.read({"internal_states": []})) is None
    assert _max_running(bare, ServerLimits.read(None)) is None
    # A value no server gives is one line naming it, not a number the ladder is built from.
    with pytest.raises(LimitError, match="effective_max_running_requests_per_dp is 'x'"):
        ServerLimits.read({"internal_states": [{"effective_max_running_requests_per_dp": "x"}]})


def test_the_expected_load_time_is_the_originals_last_start_up_from_its_log(tmp_path: Path) -> None:
    from radixtop.incident.confirm.startup import startup_seconds

    log = tmp_path / "server.log"
    log.write_text(
        "[2026-12-05 09:00:00] server_args=ServerArgs(model_path='m', page_size=16)\n"
        "[2026-12-05 09:00:12] The server is fired up and ready to roll!\n"
        "[2026-12-05 10:00:00] server_args=ServerArgs(model_path='m', page_size=16)\n"
        "[2026-12-05 10:00:01] Load weight begin.\n"
        "[2026-12-05 10:01:30.500] The server is fired up and ready to roll!\n"
        "[2026-12-05 10:05:00] server_args=ServerArgs(model_path='m', page_size=16)\n",  # a start that never served
        encoding="utf-8",
    )
    assert startup_seconds([str(log)]) == 90.5  # the last start that reached "fired up"
    assert startup_seconds([str(tmp_path / "missing.log")]) is None
    # The simulator logs both lines too: a plan made against it says so.
    sim = start_sim(tmp_path / "live", *HEALTHY)
    try:
        plan = asyncio.run(prepare(ConfirmOptions(url=sim.url, workdir=tmp_path / "c", trace=small_trace(), runs=1,
                                                  bundle=False)))
    finally:
        sim.stop()
    assert plan.startup_s is not None and 0 <= plan.startup_s < 30
    assert "s to load, as the original took" in "\n".join(plan.describe())


def test_detectors_put_sglangs_own_checks_on_every_started_server_and_say_so(tmp_path: Path) -> None:
    """--detectors: the page invariants and the busy memory check (environment keys) on every server
    the run starts, the KV canary (flags) where a GPU runs it; listed in the plan, kept in the repeat."""
    sim = start_sim(tmp_path / "live", *HEALTHY)
    try:
        def plan_for(command: str):
            return asyncio.run(prepare(ConfirmOptions(url=sim.url, workdir=tmp_path / "c", trace=small_trace(),
                                                      runs=1, bundle=False, detectors=True,
                                                      launch_command=command)))

        gpu = plan_for("python -m sglang.launch_server --model-path m")
        cpu = plan_for("python -m sglang.launch_server --model-path m --device cpu")
        own = asyncio.run(prepare(ConfirmOptions(url=sim.url, workdir=tmp_path / "s", trace=small_trace(), runs=1,
                                                 bundle=False, detectors=True)))
    finally:
        sim.stop()
    for arm in (gpu.restart, gpu.control):
        assert arm.env["SGLANG_CHECK_KV_PAGE_INVARIANTS"] == "1"
        assert arm.env["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY"] == "1"
        assert flag_value(arm.argv, "--kv-canary") == "log" and flag_value(arm.argv, "--kv-canary-sweep-interval")
    assert "detectors: --kv-canary log --kv-canary-sweep-interval 64" in "\n".join(gpu.describe())
    assert "--detectors" in gpu.repeat_command()
    assert flag_value(cpu.restart.argv, "--kv-canary") is None
    assert cpu.restart.env["SGLANG_CHECK_KV_PAGE_INVARIANTS"] == "1"
    assert any("left out on the CPU" in c for c in cpu.restart.changes)
    assert "SGLANG_CHECK_KV_PAGE_INVARIANTS" not in (own.restart.env or {})
    assert any("the simulator has none of SGLang's detectors" in c for c in own.restart.changes)
