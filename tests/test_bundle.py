"""Evidence bundles against real simulator processes: complete, verifiable, redacted, atomic."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import sys
import tarfile
import threading
from pathlib import Path

import httpx
import pytest
from incident_helpers import all_bytes, lock_race_bundle, radixtop, start_sim, wait_for, write_lines

from radixtop.diagnosis.catalog import ORDINARY_LINES, load_catalog
from radixtop.incident.bundle.bundle import AutoBundler, take_bundle, verify_bundle
from radixtop.incident.bundle.evidence import find_tool
from radixtop.incident.common.redact import REDACTED, Redactor
from radixtop.incident.confirm.logwindow import LogWindow
from radixtop.incident.replay.replay import replay_once
from radixtop.incident.replay.trace import plan_requests
from radixtop.incident.replay.workloads import pressure_trace
from radixtop.schema import FlightRecord

HF = "hf_PlantedTokenAbcdefghijklmnopq"
PASSWORD = "planted-pa55word-xyz"
API_KEY = "sk-plantedkey0123456789abcdef"
BEARER = "plantedBearerValue98765"
SECRETS = (HF, PASSWORD, API_KEY, BEARER)
SECRET_ENV = {"HF_TOKEN": HF, "MY_DB_PASSWORD": PASSWORD, "OPENAI_API_KEY": API_KEY}
SIGNATURE_LINE = (
    "[2026-12-02 14:00:03 TP0] sglang.srt.mem_cache.radix_cache.RadixCacheError: "
    "Failed to lock memory page during dynamic prefix eviction"
)


def _planted_log(path: Path, before: int = 150, after: int = 30) -> None:
    """A log with secrets in it and a signature preceded by `before` lines."""
    lines = [f"[2026-12-02 14:00:01 TP0] filler line {i}" for i in range(before - 3)]
    lines += [
        f"[2026-12-02 14:00:02] curl -H 'Authorization: Bearer {BEARER}' http://127.0.0.1/generate",
        f"[2026-12-02 14:00:02] launch: python -m sglang.launch_server --api-key {API_KEY} --port 30000",
        f"[2026-12-02 14:00:02] HF_TOKEN={HF} password={PASSWORD}",
        SIGNATURE_LINE,
    ]
    lines += [f"[2026-12-02 14:00:04 TP0] after line {i}" for i in range(after)]
    write_lines(path, lines)


def _assert_no_secret(root: Path) -> None:
    for name, data in all_bytes(root):
        for secret in SECRETS:
            assert secret.encode() not in data, f"{secret} leaked into {name}"
        if name.endswith(".tar.gz"):
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                for member in tar.getmembers():
                    handle = tar.extractfile(member)
                    content = handle.read() if handle else b""
                    for secret in SECRETS:
                        assert secret.encode() not in content, f"{secret} leaked into {name}:{member.name}"


# -- redaction ------------------------------------------------------------------------------------


def test_redactor_removes_secret_shapes_names_and_known_values_but_keeps_sglang_lines() -> None:
    r = Redactor(["a-known-value-123"])
    for line in ORDINARY_LINES:
        assert r.text(line) == line
    cases = {
        f"Authorization: Bearer {BEARER}": "Authorization: Bearer [REDACTED]",
        f"--api-key {API_KEY} --port 1": "--api-key [REDACTED] --port 1",
        "--api-key=zzzz99999 --max-new-tokens 32": "--api-key=[REDACTED] --max-new-tokens 32",
        f"x {HF} y": "x [REDACTED] y",
        "password: hunter22x, token usage: 0.93, #new-token: 64":
            "password: [REDACTED], token usage: 0.93, #new-token: 64",
        "https://user:pa55w0rd@example/x": "https://user:[REDACTED]@example/x",
        "echo a-known-value-123": "echo [REDACTED]",
        "TOKENIZERS_PARALLELISM=false max_new_tokens=32": "TOKENIZERS_PARALLELISM=false max_new_tokens=32",
        "a\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1r\n-----END OPENSSH PRIVATE KEY-----\nb":
            "a\n[REDACTED]\nb",
        "cut: -----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\nzzz": "cut: [REDACTED]",
    }
    for text, want in cases.items():
        assert r.text(text) == want
    assert r.argv(["python", "--api-key", "k1234567", "--max-total-tokens", "2048", f"--hf-token={HF}"]) == [
        "python", "--api-key", REDACTED, "--max-total-tokens", "2048", f"--hf-token={REDACTED}",
    ]
    assert r.env({"HF_TOKEN": HF, "PATH": "/usr/bin"}) == {"HF_TOKEN": REDACTED, "PATH": "/usr/bin"}
    doc = r.json({"api_key": "abc", "max_new_tokens": 3, "launch_command": f"--api-key {API_KEY}"})
    assert doc == {"api_key": REDACTED, "max_new_tokens": 3, "launch_command": "--api-key [REDACTED]"}


def test_redactor_learns_values_from_environments_and_argv() -> None:
    r = Redactor()
    r.learn_env({"MY_SERVICE_SECRET_VALUE": "opaque-value-77", "HOME": "/root", "SHORT_TOKEN": "x"})
    r.learn_argv(["python", "--admin-api-key", "opaque-admin-88"])
    assert r.text("a opaque-value-77 b opaque-admin-88 /root x") == f"a {REDACTED} b {REDACTED} /root x"


# -- a bundle of a live server --------------------------------------------------------------------


def test_bundle_of_a_live_sim_is_complete_verifiable_redacted_and_atomic(tmp_path: Path) -> None:
    sim = start_sim(tmp_path / "sim", env=SECRET_ENV)
    planted = tmp_path / "server.log"
    _planted_log(planted)
    events = []
    try:
        result = take_bundle(tmp_path / "out", url=sim.url, logs=[str(sim.log), str(planted)], reason="test",
                             on_progress=events.append)
    finally:
        sim.stop()
    root = result.path
    assert root.parent == tmp_path / "out" and root.name.startswith("radixtop-bundle-") and root.is_dir()
    assert result.archive is not None and result.archive.is_file()
    # atomic: nothing half-written is left beside it
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([root.name, result.archive.name])
    assert verify_bundle(root) == [] and verify_bundle(result.archive) == []
    assert events[0].step == "start" and events[-1].step == "done"
    # Each step counted once: the bar says "(11/11)" at the end, never "(11/9)".
    assert all(e.done <= e.total for e in events) and events[-1].done == events[-1].total, events

    # the first occurrence with >= 100 lines before it and the lines after
    evidence = next(root.glob("evidence/*radix-page-lock-eviction.log")).read_text()
    before, _, after = evidence.partition(">>> ")
    assert len([x for x in before.splitlines() if not x.startswith("#") and x]) >= 100
    assert "after line 0" in after and "after line 19" in after
    findings = json.loads((root / "findings.json").read_text())
    assert "radix-page-lock-eviction" in {f["signature"] for f in findings["findings"]}

    # the server and the machine
    info = json.loads((root / "server/server_info.json").read_text())
    assert info["version"].endswith("radixtop-sim")
    assert "sglang:" in (root / "server/metrics.txt").read_text()
    snapshot = json.loads((root / "radix/rank0-snapshot.json").read_text())
    assert snapshot["schema_version"] == 1
    procs = json.loads((root / "procs/processes.json").read_text())
    assert procs["root_pid"] == sim.pid
    env = procs["processes"][0]["environ"]
    assert env["HF_TOKEN"] == REDACTED and env["MY_DB_PASSWORD"] == REDACTED
    assert (root / "gpu/nvml.json").exists() or (root / "gpu/nvml.json.note.txt").exists()
    assert (root / "gpu/nvidia-smi.txt").exists() or "nvidia-smi" in (root / "gpu/nvidia-smi.txt.note.txt").read_text()
    if find_tool("py-spy"):  # a dependency: found on PATH or beside this interpreter
        assert "Thread" in (root / f"stacks/py-spy-{sim.pid}.txt").read_text()
    else:
        assert "py-spy is not installed" in (root / "stacks/py-spy.txt.note.txt").read_text()
    # collect_env ran with the server's own interpreter (here without torch: its note names it)
    collect_env = root / "env/collect_env.txt"
    assert collect_env.exists() or f"{sys.executable} -I -m torch.utils.collect_env" in (
        root / "env/collect_env.txt.note.txt").read_text()
    ran = {c["for"]: c for c in json.loads((root / "MANIFEST.json").read_text())["commands"]}
    assert ran["env/collect_env.txt"]["argv"] == [sys.executable, "-I", "-m", "torch.utils.collect_env"]
    assert f"process {sim.pid} runs" in ran["env/collect_env.txt"]["why"]

    # every file is in the manifest with its hash; tampering is caught; no secret anywhere
    manifest = json.loads((root / "MANIFEST.json").read_text())
    listed = {e["path"] for e in manifest["files"]}
    assert listed == {
        p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()
    } - {"MANIFEST.json", "SHA256SUMS"}
    _assert_no_secret(tmp_path / "out")
    (root / "findings.json").write_text("{}")
    assert verify_bundle(root) == ["findings.json: SHA-256 differs from the manifest"]


def test_bundle_taken_while_the_server_is_killed_is_complete(tmp_path: Path) -> None:
    sim = start_sim(tmp_path / "sim")
    planted = tmp_path / "server.log"
    _planted_log(planted)
    killed = threading.Event()

    def kill_midway(progress) -> None:  # dies halfway: /server_info read, the other sources racing
        if progress.step == "server" and not killed.is_set():
            os.kill(sim.pid, signal.SIGKILL)
            killed.set()

    box = {}
    worker = threading.Thread(target=lambda: box.update(result=take_bundle(
        tmp_path / "out", url=sim.url, logs=[str(planted)], pid=sim.pid, on_progress=kill_midway)))
    worker.start()
    worker.join(60)
    sim.stop()
    assert killed.is_set()
    result = box["result"]
    root = result.path
    assert verify_bundle(root) == []
    assert json.loads((root / "server" / "server_info.json").read_text())  # read while it was alive
    assert next(root.glob("evidence/*radix-page-lock-eviction.log")).is_file()
    # every source is there, or a note says why not
    for rel in ("server/server_info.json", "server/metrics.txt", "procs/processes.json", "gpu/nvml.json",
                "env/collect_env.txt"):
        assert (root / rel).exists() or (root / f"{rel}.note.txt").exists(), rel

    # and once it is certainly gone: the notes say what could not be had, the log evidence stands
    again = take_bundle(tmp_path / "out", url=sim.url, logs=[str(tmp_path / "serv*.log")], pid=sim.pid)  # a glob
    assert "failed" in again.notes["server/server_info.json"]
    assert "gone" in again.notes["procs/processes.json"]
    assert next(again.path.glob("evidence/*radix-page-lock-eviction.log")).is_file()
    assert verify_bundle(again.path) == []


def test_auto_bundle_fires_at_the_first_error_while_the_lock_race_kills_the_server(tmp_path: Path) -> None:
    flags = ("--max-total-tokens", "1024", "--page-size", "16", "--max-running-requests", "8", "--fault", "lock-race:7")
    sim = start_sim(tmp_path / "sim", *flags)
    window = LogWindow([str(sim.log)], load_catalog())
    window.start()
    done = threading.Event()
    auto = AutoBundler(tmp_path / "auto", url=sim.url, logs=[str(sim.log)], pid=sim.pid,
                       on_done=lambda result, error: done.set())
    planned = plan_requests(pressure_trace(1024, 8, page_size=16))

    async def load() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            for _ in range(3):
                if auto.state != "armed":
                    break
                await replay_once(client, sim.url, planned)

    def fed_and_fired() -> bool:
        window.poll()  # the log as the UI sees it, line by line
        auto.observe(window.report())
        return auto.state != "armed"

    loader = threading.Thread(target=lambda: asyncio.run(load()))
    loader.start()
    try:
        assert wait_for(fed_and_fired, 30), "no error signature appeared under pressure"
        assert not auto.observe(window.report()), "a second bundle must not start while one runs"
        assert done.wait(60), "the auto bundle did not finish"
    finally:
        loader.join(60)
        sim.stop()
    assert auto.state == "done", auto.error
    # the highest severity seen when it fired: the crash's sigquit when it came in the same poll
    assert auto.trigger in ("radix-page-lock-eviction", "scheduler-exception", "child-sigquit")
    result = auto.result
    assert result.reason == f"auto-{auto.trigger}"
    assert next(result.path.glob(f"evidence/*{auto.trigger}.log")).is_file()
    assert (result.path / "findings-live.json").is_file()
    assert verify_bundle(result.path) == []


def test_nvml_snapshot_through_the_pynvml_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML faked at its narrowest seam (the pynvml functions): there is no GPU on this machine.
    The bundle reads it through the probes' choke point, as the GPU pane does."""
    from test_probe_gpu import FakeNvml

    from radixtop.incident.bundle.bundle import BundleWriter
    from radixtop.incident.bundle.evidence import collect_nvml

    nvml = FakeNvml(monkeypatch, layout=[(60, [(4242, 50)])])
    nvml.fail("nvmlDeviceGetPowerUsage", 999)  # one failing query: a problem of its GPU, not a failed snapshot
    collect_nvml(BundleWriter(tmp_path, Redactor()))
    doc = json.loads((tmp_path / "gpu/nvml.json").read_text())
    device = doc["devices"][0]
    assert (
        device["name"] == "NVIDIA H200" and device["memory_used"] == 60 << 30 and doc["driver_version"] == "550.54.15"
    )
    assert device["power_w"] is None and any(p.startswith("power: unknown NVML error") for p in device["problems"])
    assert device["processes"] == [{"pid": 4242, "used_bytes": 50 << 30}]

    nvml.fail("nvmlInit", 9)
    collect_nvml(BundleWriter(tmp_path / "nodriver", Redactor()))
    assert "NVIDIA driver not loaded" in (tmp_path / "nodriver/gpu/nvml.json.note.txt").read_text()


def test_bundle_cli_writes_verifies_and_refuses_under_readonly(tmp_path: Path) -> None:
    planted = tmp_path / "server.log"
    _planted_log(planted)
    done = radixtop("bundle", "--out", str(tmp_path / "out"), "--log", str(planted), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert "server/server_info.json" in result["notes"]  # no --url: a note, not a failure
    check = radixtop("bundle", "--verify", result["archive"])
    assert check.returncode == 0 and "verified" in check.stdout
    refused = radixtop("--readonly", "bundle", "--out", str(tmp_path / "ro"))
    assert refused.returncode == 2 and "--readonly" in refused.stderr and not (tmp_path / "ro").exists()
    bad = radixtop("bundle", "--out", str(tmp_path / "x"), "--url", "ftp://nope")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    _assert_no_secret(tmp_path / "out")


def test_auto_bundle_takes_one_more_when_a_higher_severity_follows(tmp_path: Path) -> None:
    """An error fires the first bundle; the critical crash it leads to fires a second (the first
    could not hold the crash's lines); nothing fires a third, and nothing fires while one runs."""
    from types import SimpleNamespace

    from radixtop.diagnosis.severity import severity_rank

    log = tmp_path / "server.log"
    log.write_text("".join(f"[2026-12-03 07:00:{i % 60:02d}] INFO line {i}\n" for i in range(200)))

    def finding(sig_id: str, severity: str) -> SimpleNamespace:
        return SimpleNamespace(signature=SimpleNamespace(id=sig_id, level=severity_rank(severity)))

    done = threading.Event()
    auto = AutoBundler(tmp_path / "auto", logs=[str(log)], on_done=lambda result, error: done.set())
    warning = [finding("kv-pool-retract", "warning")]
    assert not auto.observe(warning) and auto.state == "armed"  # below the threshold
    error = warning + [finding("radix-page-lock-eviction", "error")]
    assert auto.observe(error) and auto.trigger == "radix-page-lock-eviction"
    assert not auto.observe(error + [finding("child-sigquit", "critical")])  # one at a time
    assert done.wait(60) and auto.state == "done", auto.error
    first = auto.result.path
    assert not auto.observe(error)  # the same severity again: nothing new
    done.clear()
    crash = error + [finding("child-sigquit", "critical")]
    assert auto.observe(crash) and auto.trigger == "child-sigquit"
    assert done.wait(60) and auto.state == "done", auto.error
    assert auto.result.path != first and first.is_dir() and auto.result.reason == "auto-child-sigquit"
    assert auto.exhausted and not auto.observe(crash)


def test_a_cancelled_bundle_leaves_nothing_behind(tmp_path: Path) -> None:
    """Cancelled halfway (the TUI's x, Ctrl-C in confirm): BundleCancelled, and neither the
    hidden partial directory nor a bundle remains."""
    from radixtop.incident.bundle.bundle import BundleCancelled

    planted = tmp_path / "server.log"
    _planted_log(planted)
    cancel = threading.Event()

    def cancel_midway(progress) -> None:
        if progress.step not in ("start", "done"):
            cancel.set()

    out = tmp_path / "out"
    with pytest.raises(BundleCancelled):
        take_bundle(out, logs=[str(planted)], cancel=cancel, on_progress=cancel_midway)
    assert cancel.is_set() and list(out.iterdir()) == []


def test_instrument_endpoints_given_are_read_without_a_server_url(tmp_path: Path) -> None:
    """--instrument (or the TUI's known endpoints) is enough for the tree's evidence, even when
    the server's HTTP side is unknown or dead."""
    sim = start_sim(tmp_path / "sim")
    try:
        info = httpx.get(sim.url + "/server_info", timeout=10).json()
        endpoint = info["radixtop_instrument"][0]
        result = take_bundle(tmp_path / "out", instruments=[endpoint], logs=[str(sim.log)], archive=False)
    finally:
        sim.stop()
    snapshot = json.loads((result.path / "radix" / "rank0-snapshot.json").read_text())
    assert snapshot["rank"] == 0 and snapshot["schema_version"] == 1
    assert "no server URL given" in result.notes["server/server_info.json"]


def test_a_bundle_after_the_lock_race_keeps_every_ranks_flight_record(tmp_path: Path) -> None:
    """The ranks died before the bundle could ask their endpoints: their flight records, written
    inside the server as it died, carry the cache at that moment into the bundle."""
    sim, bundle = lock_race_bundle(tmp_path)
    for rank in (0, 1):
        record = FlightRecord.from_dict(json.loads((bundle / f"flight/rank{rank}-pid{sim.pid}.json").read_text()))
        assert record.triggers[0].message.endswith(
            "RadixCacheError: Failed to lock memory page during dynamic prefix eviction"
        )
        assert record.snapshot.rank == rank and record.snapshot.census.complete
    assert "flight/" in (bundle / "README.txt").read_text()
    assert verify_bundle(bundle) == []
    # Without the pid, the records of the last hour are taken, and the bundle says how they were chosen.
    done = radixtop("bundle", "--out", str(tmp_path / "out2"), "--log", str(sim.log), "--json")
    bundle = Path(json.loads(done.stdout)["path"])
    assert (bundle / f"flight/rank1-pid{sim.pid}.json").is_file()
    assert "pid is unknown" in (bundle / "flight/matched-by-time.note.txt").read_text()
