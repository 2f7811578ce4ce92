"""The node report as it crosses machines: to_dict and from_dict agree, and from_dict takes
another machine's answer as hostile (wrong types, huge lists, deep nesting, escape sequences, a
newer format: one line naming the field). The ssh line radixtop runs, the hosts it refuses, and
the one line each ssh failure becomes."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import pytest

from radixtop.probes.node_local import local_report
from radixtop.probes.node_report import (
    MAX_REPORT_BYTES,
    GpuReport,
    NodeReport,
    ProcessReport,
    ServerReport,
    parse_node_report,
)
from radixtop.probes.remote import check_host, check_remote_command, reach, ssh_argv
from radixtop.probes.ssh_failure import explain_failure

REPORT = NodeReport(
    hostname="gpu-7", time=1_800_000_000.25, radixtop_version="0.1.0",
    servers=(ServerReport(
        pid=4242, kind="sglang", name="SGLang", started=1_799_999_000.0, url="http://127.0.0.1:30000",
        ports=(30000, 30400), log_path="/var/log/sglang.log", log_how="--log-file",
        instrument_urls=("http://127.0.0.1:30400",), ranks=("TP0",), version="0.5.23", model="m",
        problems=("a problem",),
        processes=(ProcessReport(4242, 1, "server", None, "python3", "sleeping"),
                   ProcessReport(4250, 4242, "scheduler", "TP0", "sglang::scheduler_TP0", "running")),
    ),),
    notes=("a note",),
    gpus=(GpuReport(0, "NVIDIA H100", "GPU-1", "ok", 10, 80, 5, (4250,), ()),),
)


def test_a_report_comes_back_as_it_went() -> None:
    assert NodeReport.from_dict(json.loads(json.dumps(REPORT.to_dict()))) == REPORT
    assert parse_node_report(json.dumps(REPORT.to_dict())) == REPORT


def test_this_nodes_report_round_trips() -> None:
    report = asyncio.run(local_report(timeout_s=0.5))
    assert report.hostname and report.time > 0 and (report.gpus or report.gpus_unavailable)
    assert parse_node_report(json.dumps(report.to_dict())) == report


def bad(**changes: object) -> dict:
    doc = REPORT.to_dict()
    for path, value in changes.items():
        where = doc
        *parents, last = path.split("__")
        for p in parents:
            where = where[int(p)] if p.isdigit() else where[p]
        where[last] = value
    return doc


@pytest.mark.parametrize(("doc", "says"), [
    ([], "node report: expected an object, got an array"),
    ({"hostname": "x", "time": 1}, "not a radixtop node report (no radixtop_node_report field)"),
    (bad(radixtop_node_report=2), "node report format 2 is newer than this radixtop's (1): upgrade radixtop here"),
    (bad(radixtop_node_report="1"), "node report: radixtop_node_report: expected a format number, got '1'"),
    (bad(hostname=None), "node report: hostname: missing"),
    (bad(time="now"), "node report: time: expected a finite number, got 'now'"),
    (bad(time=1e308), "node report: time: expected a finite number, got 1e+308"),
    (bad(servers={}), "node report: servers: expected an array, got an object"),
    (bad(servers=[REPORT.to_dict()["servers"][0]] * 33),
     "node report: servers: 33 entries is more than the limit of 32"),
    (bad(servers__0__pid=True), "node report: servers[0].pid: expected a whole number, got True"),
    (bad(servers__0__pid=-1), "node report: servers[0].pid: expected a number within 0.."),
    (bad(servers__0__ports=[70000]), "node report: servers[0].ports[0]: expected a whole number within 0..65535"),
    (bad(servers__0__processes=[7]), "node report: servers[0].processes[0]: expected an object, got 7"),
    (bad(servers__0__processes__0__name=["x"]), "node report: servers[0].processes[0].name: expected a string"),
    (bad(gpus__0__util_percent=101), "node report: gpus[0].util_percent: expected a number within 0..100"),
    (bad(notes=["x"] * 65), "node report: notes: 65 entries is more than the limit of 64"),
])
def test_a_bad_report_is_one_line_naming_the_field(doc: object, says: str) -> None:
    with pytest.raises(ValueError) as refused:
        NodeReport.from_dict(doc)
    assert str(refused.value).startswith(says) and "\n" not in str(refused.value)


def test_hostile_text_is_cut_and_made_printable_and_sizes_are_capped() -> None:
    doc = bad(hostname="evil\x1b]0;pwned\x07" + "x" * 10_000, servers__0__log_path="/a\x1b[2J")
    got = NodeReport.from_dict(doc)
    assert "\x1b" not in got.hostname and "\x07" not in got.hostname and len(got.hostname) == 4096
    assert got.servers[0].log_path == "/a\ufffd[2J"
    with pytest.raises(ValueError, match=r"^the answer: \d+ bytes is more than the limit of"):
        parse_node_report(b" " * (MAX_REPORT_BYTES + 1), "the answer")
    deep = '{"radixtop_node_report": 1, "hostname": "h", "time": 1, "notes": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(ValueError) as refused:
        parse_node_report(deep)
    assert "\n" not in str(refused.value)
    unknown = {**REPORT.to_dict(), "from_a_newer_radixtop": {"x": 1}}
    assert NodeReport.from_dict(unknown) == REPORT


def test_the_ssh_line_is_an_argv_in_batch_mode() -> None:
    argv = ssh_argv("me@gpu-7", ssh_config="/tmp/cfg", connect_timeout_s=4)
    assert argv[0] == "ssh" and "BatchMode=yes" in argv and "ConnectTimeout=4" in argv
    assert argv[argv.index("-F") + 1] == "/tmp/cfg"
    assert argv[-5:] == ["me@gpu-7", "--", "radixtop", "discover", "--json"]


@pytest.mark.parametrize("host", ["-oProxyCommand=touch x", "gpu 7", "gpu\n7", "gpu\x1b7", "", "a" * 256])
def test_a_host_ssh_would_misread_is_refused_in_one_line(host: str) -> None:
    with pytest.raises(ValueError) as refused:
        check_host(host)
    assert str(refused.value).startswith("--node: ") and "\n" not in str(refused.value)
    with pytest.raises(ValueError):
        ssh_argv(host)


@pytest.mark.parametrize("command", ["radixtop; rm -rf ~", "$(x)", "a b", "-x", "`x`"])
def test_a_remote_command_a_shell_would_read_is_refused(command: str) -> None:
    with pytest.raises(ValueError, match="^--remote-radixtop: "):
        check_remote_command(command)
    assert check_remote_command("~/venv/bin/radixtop") == "~/venv/bin/radixtop"


@pytest.mark.parametrize(("code", "stderr", "says"), [
    (255, "ssh: Could not resolve hostname gpu-9: Name or service not known\n", "gpu-9: unknown host name"),
    (255, "ssh: connect to host 10.0.0.9 port 22: Connection timed out\n", "gpu-9: unreachable: the ssh connection"),
    (255, "ssh: connect to host 10.0.0.9 port 22: No route to host\n", "gpu-9: unreachable: no route"),
    (255, "kex_exchange_identification: Connection closed by remote host\n", "gpu-9: the ssh connection was closed"),
    (255, "/home/me/.ssh/config: line 3: Bad configuration option: foo\n", "gpu-9: your ssh config could not be used: "
          "/home/me/.ssh/config: line 3: Bad configuration option: foo"),
    (255, "something new\x1b[31m\n", "gpu-9: ssh failed (exit 255): something new\ufffd[31m; run `ssh gpu-9`"),
    (2, "radixtop: argument COMMAND: invalid choice: 'discover' (choose from ...)\n",
     "gpu-9: the radixtop there has no `discover`"),
    (1, "Traceback ...\nRuntimeError: boom\n",
     "gpu-9: `radixtop discover --json` failed there (exit 1): RuntimeError: boom"),
])
def test_each_ssh_failure_is_one_line_with_what_to_do(code: int, stderr: str, says: str) -> None:
    line = explain_failure("gpu-9", code, stderr)
    assert line.startswith(says) and "\n" not in line and "\x1b" not in line


def fake_ssh(folder, python: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An `ssh` first on PATH that runs `python` (this interpreter) whatever it is asked."""
    folder.mkdir()
    script = folder / "ssh"
    script.write_text(f"#!{sys.executable}\nimport json, sys, time\n{python}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")


def test_the_clock_skew_is_the_nodes_time_against_the_round_trips_midpoint(tmp_path, monkeypatch) -> None:
    """A node 100 s ahead whose report is made at once and arrives 1 s later: the skew is read
    from the midpoint (100 - 0.5 s), and the truth (+100 s) lies within half the round trip."""
    fake_ssh(tmp_path / "bin", f"doc = {REPORT.to_dict()!r}\ndoc['time'] = time.time() + 100\n"
             "print(json.dumps(doc), flush=True)\ntime.sleep(1.0)", monkeypatch)
    answer = asyncio.run(reach("gpu-7", timeout_s=10))
    assert answer.ok and answer.skew is not None, answer.error
    assert answer.skew.round_trip_s == pytest.approx(answer.seconds) and answer.seconds >= 1.0
    assert abs(answer.skew.offset_s - 100) <= answer.skew.uncertainty_s
    assert answer.skew.offset_s < 99.8  # the midpoint, not the moment it was sent


def test_an_endless_answer_is_cut_at_the_cap_and_ssh_killed(tmp_path, monkeypatch) -> None:
    fake_ssh(tmp_path / "bin", "while True:\n    sys.stderr.write('x' * 4096)\n    sys.stdout.write('y' * 65536)",
             monkeypatch)
    started = time.monotonic()
    answer = asyncio.run(reach("gpu-7", timeout_s=20))
    assert not answer.ok and answer.error.startswith(f"gpu-7: its answer is over {MAX_REPORT_BYTES} bytes")
    assert time.monotonic() - started < 5
