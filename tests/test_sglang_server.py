"""radixtop against a real SGLang 0.5.23 server (`python -m sglang.launch_server` on the CPU engine,
the tiny random-weight model of sglang/tiny_model.py), each flow the way a user meets it.

The server comes from the real-SGLang environment (`bash .ci/sglang-tests --build-only`); where it
is missing these tests are skipped, and under RADIXTOP_REQUIRE_SGLANG=1 (.ci/run) they fail instead.
A server starts in about 20-40 s here, so the tests that only watch share one (`live`), and each
crash has its own.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sglang_gate import why_no_server
from tmux_helpers import Tmux

from radixtop.probes.sglang import IDLE_AFTER_S
from radixtop.schema import Snapshot

_WHY = why_no_server()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_WHY is not None, reason=_WHY or ""),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

if _WHY is None:
    from real_sglang import RealServer, start_server

SHARED = list(range(100, 164))  # a 64-token prefix: four pages of 16
# The bar and the log pane say "auto bundle: ... preserving" when it starts; this once it is on disk.
AUTO_BUNDLE_WRITTEN = re.compile(r"auto bundle \(on [^)]*\) written")


def shared_prefix_traffic(server: RealServer, requests: int = 6) -> list[dict]:
    """Requests sharing a 64-token prefix, each with its own tail: the radix cache's bread and butter."""
    return [server.generate(SHARED + [300 + i] * 20, max_new_tokens=8) for i in range(requests)]


def batches(server: RealServer) -> int:
    """The scheduler's batch lines in the server's log: one per batch it ran."""
    text = server.text()
    return text.count("Prefill batch") + text.count("Decode batch")


def radixtop(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "radixtop", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def watch(cwd: Path, *args: str) -> Tmux:
    """radixtop in a real terminal, started in cwd with no arguments but `args`."""
    tmux = Tmux(160, 48)
    tmux.start([sys.executable, "-m", "radixtop", *args], cwd)
    return tmux


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    server = start_server(tmp_path_factory.mktemp("live"), name="server")
    try:
        yield server
    finally:
        server.stop()


def test_radixtop_finds_the_server_by_itself_and_an_idle_minute_of_watching_adds_no_batch(live: RealServer) -> None:
    shared_prefix_traffic(live, 2)
    before = batches(live)
    first = watch(live.log.parent)
    second = watch(live.log.parent)  # a colleague on the same node
    try:
        for tmux in (first, second):
            # The status line names each source as it answers; the panes draw what it read a moment later.
            tmux.wait_for(lambda s: all(w in s for w in ("server.log ok", "server ok", "r0 ok", "procs ok",
                                                         "Rust core walk · UnifiedRadixCache", "scheduler",
                                                         "detokenizer")),
                          "discovery of the server, its log, its rank's endpoint and its processes", 90)
        # Settled (the server idle past IDLE_AFTER_S), watching asks it nothing: not a batch, not a
        # line of its access log.
        time.sleep(IDLE_AFTER_S + 5)
        settled = live.text()
        began = time.monotonic()
        while time.monotonic() - began < 60:
            time.sleep(5)
            assert batches(live) == before, "watching put a generation through the scheduler:\n" + live.text()[-2000:]
        assert "GET /health" not in live.text(), "SGLang's /health generates: it is never asked while watching"
        assert live.text() == settled, "an idle minute of watching added lines:\n" + live.text()[len(settled):]
        assert "r0 ok" in first.capture() and "r0 ok" in second.capture(), "both watchers kept the endpoint"
    finally:
        first.kill()
        second.kill()


def test_a_flush_of_an_idle_server_reaches_the_radix_pane_with_the_snapshots_true_age(live: RealServer) -> None:
    """With --sleep-on-idle the idle scheduler reaches a safe point about once a second: the pane
    shows the flushed tree within seconds, and the age it gives is the capture's, never older."""
    shared_prefix_traffic(live, 2)
    tmux = watch(live.log.parent, "--no-gpu", "--url", live.url)
    try:
        tmux.wait_for(lambda s: re.search(r"root · [1-9]\d* nodes", s) is not None, "the tree with the traffic", 90)
        time.sleep(IDLE_AFTER_S + 2)  # the server idle, radixtop settled
        flushed = time.time()
        httpx.post(f"{live.url}/flush_cache", timeout=30).raise_for_status()
        screen = tmux.wait_for(lambda s: "root · 0 nodes" in s, "the flushed tree in the pane", 15)
        shown = re.search(r"snapshot #\d+ ([\d.]+)(s|m|h) old", screen)
        assert shown and shown.group(2) == "s", screen
        assert float(shown.group(1)) <= time.time() - flushed + 0.5, (shown.group(0), time.time() - flushed)
    finally:
        tmux.kill()


def test_scan_of_a_real_servers_log_raises_no_alarm_for_its_start_up_and_traffic(live: RealServer) -> None:
    shared_prefix_traffic(live, 3)
    done = radixtop("scan", str(live.log), "--json", cwd=live.log.parent)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    found = {f["signature"]: f["severity"] for f in doc["findings"]}
    assert found.get("server-ready") == "info", found
    assert not [s for s, sev in found.items() if sev in ("error", "critical")], found
    # SGLang's own gc freeze races its HTTP server's start under --skip-server-warmup: where it was
    # refused, the log says so and the scan names it.
    assert ("gc-not-frozen" in found) == ("post-warmup freeze_gc failed" in live.text()), found


def test_replay_of_the_seed_trace_sends_only_ids_the_model_has_and_hits_what_the_trace_shares(live: RealServer) -> None:
    done = radixtop("replay", "finding_03330", "--url", live.url, "--page-size", "auto", "--runs", "2", "--json",
                    cwd=live.log.parent, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "2,048 token ids" in done.stderr and "tiny-llama/config.json" in done.stderr, done.stderr
    report = json.loads(done.stdout)
    assert report["failed_calls"] == 0, report
    cache = report["cached_tokens"]
    assert cache["page_size"] == 16 and cache["evictions_seen"], cache
    assert 0 < cache["cached_tokens"] <= cache["expected_cached_tokens"], cache
    # Every call short of its prefix is explained: the instrument found among the server's ports
    # names the evictions; copies sent together are prefilled together, before any of them is cached.
    assert set(cache["missed"]) <= {"first-of-group", "evicted"}, cache["missed"]
    assert "IndexError" not in live.text() and live.proc is not None and live.proc.poll() is None


def test_replay_rungs_lower_the_peak_token_usage_and_a_namespace_per_request_turns_reuse_off(live: RealServer) -> None:
    """The rungs of a confirmation run on a server that is already up, its flags untouched: the
    pressure workload sized to its pool, replayed at --max-in-flight 8, 4 and 2, holds fewer KV
    tokens rung by rung (the batch lines of its log, found by itself, and sglang:token_usage, read
    from its /metrics while each run goes); with
    --namespace-per-request (an extra_key per call) at the lowest rung's pressure, no call is
    served from another's pages."""
    from radixtop.incident.replay.trace import save_trace
    from radixtop.incident.replay.workloads import pressure_trace

    info = httpx.get(f"{live.url}/server_info", timeout=10).json()
    # One burst of 2 x 8 calls of 128 + 128 tokens: eight in flight hold half the 4,096-token pool.
    trace = pressure_trace(info["max_total_num_tokens"], info["max_running_requests"], page_size=info["page_size"],
                           max_input_len=info.get("max_req_input_len"), overflow=0.5, bursts=1)
    work = live.log.parent / "rungs"
    work.mkdir()
    path = work / "pressure.json"
    save_trace(trace, path)

    def rung(*flags: str) -> dict:
        done = radixtop("replay", str(path), "--url", live.url, "--page-size", "auto", "--runs", "1", "--json", *flags,
                        cwd=work, timeout=600)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["failed_calls"] == 0, report
        return report

    peaks = {}
    for k in (8, 4, 2):  # as the experiment goes: each run starts with the gauge the rung above left
        report = rung("--max-in-flight", str(k))
        assert report["max_in_flight"] == k and report["namespace_per_request"] is False, report
        (run,) = report["per_run"]
        assert run["token_usage_samples"] >= 1 and run["token_usage_lines"] >= 2, run
        peaks[k] = run["peak_token_usage"]
    assert peaks[8] > peaks[4] > peaks[2], peaks
    plain = report["cached_tokens"]  # the lowest rung: four groups share a two-page prefix
    assert plain["cached_tokens"] > 0, plain
    report = rung("--max-in-flight", "2", "--namespace-per-request")
    assert report["namespace_per_request"] is True and report["max_in_flight"] == 2, report
    cache = report["cached_tokens"]
    assert cache["page_size"] == 16 and len(cache["calls"]) == len(trace.requests), cache
    assert cache["cached_tokens"] == 0 and cache["expected_cached_tokens"] == 0, cache
    assert set(cache["missed"]) <= {"first-of-group", "namespace"} and "namespace" in cache["missed"], cache["missed"]
    assert "IndexError" not in live.text() and live.proc is not None and live.proc.poll() is None


def test_recorded_traffic_replays_with_the_live_reuse_and_analyze_predicts_it(live: RealServer) -> None:
    """Conversations on a shared system prompt, recorded through `radixtop record`: the trace keeps
    the sharing's tree, so a replay on the real server (prompts made up, `--page-size auto`) gets the
    cached tokens the live traffic got, and `radixtop analyze` at the server's settings predicts them."""
    import random

    rnd = random.Random(7)
    system = [rnd.randrange(10, 2000) for _ in range(48)]
    chats = [[rnd.randrange(10, 2000) for _ in range(32)] for _ in range(3)]
    work = live.log.parent / "recorded"
    work.mkdir()
    trace, ready = work / "trace.json", work / "port"
    httpx.post(f"{live.url}/flush_cache", timeout=30).raise_for_status()
    recorder = subprocess.Popen([sys.executable, "-m", "radixtop", "record", "--url", live.url, "--out", str(trace),
                                 "--max-requests", "18", "--ready-file", str(ready)], cwd=work,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        began = time.monotonic()
        while not (ready.exists() and ready.read_text().strip()) and time.monotonic() - began < 30:
            time.sleep(0.1)
        proxy = f"http://127.0.0.1:{int(ready.read_text())}"
        live_cached = []
        for i in range(18):  # one turn at a time: what each call reuses does not hang on timing
            ids = system + chats[i % 3] + [rnd.randrange(10, 2000) for _ in range(10 + i)]
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
            live_cached.append(
                httpx.post(f"{proxy}/generate", json=body, timeout=120).json()["meta_info"]["cached_tokens"]
            )
        _, err = recorder.communicate(timeout=30)
    finally:
        if recorder.poll() is None:
            recorder.kill()
    assert recorder.returncode == 0, err
    assert live_cached[:4] == [0, 48, 48, 80], live_cached  # the system prompt's 3 pages, then a chat's 5
    info = httpx.get(f"{live.url}/server_info", timeout=10).json()
    settings = ["--page-size", str(info["page_size"]), "--max-total-tokens", str(info["max_total_num_tokens"]),
                "--max-running-requests", str(info["max_running_requests"])]
    done = radixtop("analyze", str(trace), *settings, "--json", cwd=work)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cached_tokens"] == sum(live_cached), done.stdout[:2000]
    done = radixtop("replay", str(trace), "--url", live.url, "--page-size", "auto", "--runs", "2", "--json",
                    cwd=work, timeout=300)
    assert done.returncode == 0, done.stderr
    reuse = json.loads(done.stdout)["cached_tokens"]
    assert reuse["expected_cached_tokens"] == 2 * sum(live_cached), reuse
    assert reuse["cached_tokens"] == reuse["expected_cached_tokens"] or set(reuse["missed"]) <= {"evicted"}, reuse


def test_a_bundle_of_the_live_server_holds_its_info_and_tree_and_asks_nothing_that_generates(live: RealServer) -> None:
    shared_prefix_traffic(live, 2)
    before = batches(live)
    out = live.log.parent / "bundle"
    done = radixtop(
        "bundle", "--url", live.url, "--log", str(live.log), "--out", str(out), "--json", cwd=live.log.parent
    )
    assert done.returncode == 0, done.stderr
    bundle = Path(json.loads(done.stdout)["path"])
    info = json.loads((bundle / "server" / "server_info.json").read_text())
    assert info["page_size"] == 16 and info["version"] == "0.5.23"
    assert "/v1/models -> HTTP 200" in (bundle / "server" / "health.txt").read_text()
    snapshots = list(bundle.rglob("*snapshot*.json"))
    assert snapshots, sorted(str(p.relative_to(bundle)) for p in bundle.rglob("*"))
    assert batches(live) == before


@pytest.fixture(scope="module")
def python_core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    server = start_server(tmp_path_factory.mktemp("python-core"), core="python", name="python-core")
    try:
        yield server
    finally:
        server.stop()


HELD = list(range(1000, 1100))  # a prompt of 100 ids: six pages of 16 in the tree while it runs


def _snapshot(port: int) -> Snapshot:
    return Snapshot.from_dict(httpx.get(f"http://127.0.0.1:{port}/radixtop/v1/snapshot", timeout=10).json())


def held_while_generating(server: RealServer, rid: str) -> tuple[Snapshot, Snapshot]:
    """A long generation of HELD with our own rid: (a snapshot taken while it ran that has it among
    the lock holders, None if none had; one taken once it finished and holders were ())."""
    port = _instrument_port(server)
    during = None
    sampling = {"max_new_tokens": 300, "temperature": 0.0, "ignore_eos": True}
    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(server.generate, HELD, rid=rid, sampling_params=sampling)
        while not done.done() and during is None:
            snap = _snapshot(port)
            if any(h.rid == rid for h in snap.holders or ()):
                during = snap
            time.sleep(0.2)
        assert done.result()["meta_info"]["completion_tokens"] == 300
    deadline = time.monotonic() + 30
    after = _snapshot(port)
    while after.holders != () and time.monotonic() < deadline:
        time.sleep(0.3)
        after = _snapshot(port)
    assert during is not None, "no snapshot showed the running request among the lock holders"
    return during, after


def assert_holds_its_path(snap: Snapshot, rid: str) -> None:
    """The holder's node is a row; every row from the root to it is locked and starts with the
    prompt's ids at its position (the Rust core's rows carry them only because a request holds them)."""
    (holder,) = [h for h in snap.holders or () if h.rid == rid]
    assert holder.state == "running" and holder.prompt_tokens == len(HELD) and holder.held_s >= 0, holder
    assert snap.tree is not None
    rows = snap.tree.nodes
    index = next(i for i, row in enumerate(rows) if row.id == holder.node and i > 0)
    path = []
    while index > 0:
        path.append(rows[index])
        index = rows[index].parent
    position = 0
    for row in reversed(path):
        assert row.lock_ref > 0, (row, rows)
        assert row.head == tuple(HELD[position : position + min(row.tokens, 32)]), (position, row)
        position += row.tokens
    assert position == len(HELD) // 16 * 16, path  # the prompt's whole pages, locked while it runs
    # The pane's reading of the same snapshot: the holder placed, no lock flagged as held by nobody
    # or as released twice (a real server's locks are all its requests').
    from radixtop.session.lock_holders import LockHolders

    placed = LockHolders.of(snap)
    assert placed.known and placed.unplaced == 0 and placed.unheld == () and placed.overheld == (), placed
    assert [h.rid for h in placed.deepest[next(i for i, r in enumerate(rows) if r.id == holder.node and i)]] == [rid]


def used_path(snap: Snapshot, rid: str) -> list[int]:
    """The rows from the root to the node an earlier request let go of (snap.sharers), each
    unlocked now and starting with the prompt's ids at its position, and each naming the request
    in the pane's reading (LockHolders.used_by)."""
    from radixtop.session.lock_holders import LockHolders

    (used,) = [u for u in snap.sharers or () if u.rid == rid]
    assert used.prompt_tokens == len(HELD) and used.released_s >= 0, used
    assert snap.tree is not None
    rows = snap.tree.nodes
    index = next(i for i, row in enumerate(rows) if row.id == used.node and i > 0)
    path = []
    while index > 0:
        path.append(index)
        index = rows[index].parent
    path.reverse()
    placed = LockHolders.of(snap)
    position = 0
    for index in path:
        row = rows[index]
        assert row.lock_ref == 0 and rid in [u.rid for u in placed.used_by[index]], (row, placed.used_by)
        if position + row.tokens <= len(HELD):  # the prompt's part (the output's ids are the model's)
            assert row.head == tuple(HELD[position : position + min(row.tokens, 32)]), (position, row)
        position += row.tokens
    assert position >= len(HELD) // 16 * 16, path
    return path


def test_the_rust_cores_snapshot_names_a_running_requests_lock_and_its_prompt(live: RealServer) -> None:
    during, after = held_while_generating(live, "radixtop-held-rust")
    assert during.lock_detail == "locked-only" and during.cache_class == "UnifiedRadixCache"
    assert_holds_its_path(during, "radixtop-held-rust")
    assert after.holders == ()
    # Finished, it holds no lock; the nodes it used stay cached and still name it, with its ids.
    used_path(after, "radixtop-held-rust")
    # A second request sharing the first four pages: the node they share names both.
    sampling = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
    live.generate(HELD[:64] + list(range(2000, 2040)), rid="radixtop-second", sampling_params=sampling)
    port, deadline = _instrument_port(live), time.monotonic() + 30
    snap = _snapshot(port)
    while not {"radixtop-held-rust", "radixtop-second"} <= {u.rid for u in snap.sharers or ()}:
        assert time.monotonic() < deadline, snap.sharers
        time.sleep(0.3)
        snap = _snapshot(port)
    first = used_path(snap, "radixtop-held-rust")
    rows = snap.tree.nodes
    shared = [i for i in first if sum(rows[j].tokens for j in first[: first.index(i) + 1]) <= 64]
    assert shared, first  # the split at the fourth page ends a node there
    from radixtop.session.lock_holders import LockHolders

    used_by = LockHolders.of(snap).used_by
    assert {u.rid for u in used_by[shared[0]]} >= {"radixtop-held-rust", "radixtop-second"}, used_by
    below = first[len(shared)]  # the first one's own continuation: not the second's
    assert "radixtop-second" not in {u.rid for u in used_by[below]}


def test_the_python_cores_snapshot_names_a_running_requests_lock(python_core: RealServer) -> None:
    during, after = held_while_generating(python_core, "radixtop-held-python")
    assert during.lock_detail == "counts"
    assert_holds_its_path(during, "radixtop-held-python")
    assert after.holders == ()


def test_the_radix_pane_reads_the_python_core_with_its_token_ids(python_core: RealServer) -> None:
    shared_prefix_traffic(python_core, 4)
    from radixtop.probes.radix import RadixProbe

    def shows_the_prefix(sample: object) -> bool:
        tree = getattr(getattr(sample, "snapshot", None), "tree", None)
        return tree is not None and any(tuple(r.head) and tuple(r.head) == tuple(SHARED[: len(r.head)])
                                        for r in tree.nodes)

    async def read() -> object:
        """Polls as the pane does: the endpoint answers with its latest snapshot and takes a
        fresh one because a reader asked, so the first answers can predate the traffic (and
        hold only what the module's earlier tests left in the tree)."""
        probe = RadixProbe(f"http://127.0.0.1:{_instrument_port(python_core)}")
        try:
            for _ in range(30):  # bounded: 15 s
                sample = await probe.poll()
                if shows_the_prefix(sample):
                    break
                await asyncio.sleep(0.5)
            return sample
        finally:
            await probe.aclose()

    import asyncio

    sample = asyncio.run(read())
    snap = getattr(sample, "snapshot", None)
    assert snap is not None and snap.tree is not None, sample
    assert snap.cache_class == "UnifiedRadixCache" and snap.page_size == 16
    # The shared prefix's node starts with the prefix's own ids (the Python core's tree carries them).
    assert shows_the_prefix(sample), [tuple(row.head) for row in snap.tree.nodes]


def test_the_servers_own_kv_events_feed_the_radix_pane_without_the_instrument(tmp_path: Path) -> None:
    """SGLang publishing kv-events (`--kv-events-config`, its ZMQ publisher and replay endpoint),
    radixtop's plugin off: the radix pane mirrors the real cache's blocks from what it publishes."""
    from real_sglang import free_port

    config = {"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{free_port()}",
              "replay_endpoint": f"tcp://127.0.0.1:{free_port()}"}
    server = start_server(tmp_path, plugin=False, flags=("--kv-events-config", json.dumps(config)), name="kv")
    tmux = None
    try:
        shared_prefix_traffic(server, 2)  # before radixtop subscribes: the replay endpoint brings these
        tmux = watch(tmp_path, "--no-gpu", "--url", server.url)
        tmux.wait_for(lambda s: "kv-events: blocks, no locks" in s, "the kv-events rank in the radix pane", 90)
        # Two 84-token prompts sharing 64: four shared pages and one page of each tail (the rest of
        # a page is not cached): six blocks, exactly what the real cache holds.
        screen = tmux.wait_for(lambda s: "6 blocks · 96 tokens" in s, "the mirrored blocks", 30)
        root = next(line for line in screen.splitlines() if "root ·" in line)
        assert " ? " in root, root  # kv-events carry no locks: unknown, never 0
        for i in range(2):  # two new tails on the shared prefix: a page each
            server.generate(SHARED + [700 + i] * 20, max_new_tokens=8)
        tmux.wait_for(lambda s: "8 blocks · 128 tokens" in s, "the live events of new traffic", 30)
    finally:
        if tmux is not None:
            tmux.kill()
        server.stop()


def _instrument_port(server: RealServer) -> int:
    """The rank-0 debug endpoint among the server's listening ports (radixtop's health answers there)."""
    import psutil

    for proc in server.tree():
        try:
            conns = proc.net_connections(kind="tcp")
        except psutil.Error:
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN and c.laddr.port != server.port:
                try:
                    if httpx.get(f"http://127.0.0.1:{c.laddr.port}/radixtop/v1/health", timeout=2).status_code == 200:
                        return c.laddr.port
                except httpx.HTTPError:
                    continue
    raise AssertionError("no radixtop debug endpoint among the server's ports")


def test_scheduler_sigkilled_then_c_y_confirms_a_not_reproduced_with_real_arms(tmp_path: Path) -> None:
    """The headline flow: a real server under shared-prefix traffic, its scheduler SIGKILLed from
    outside; radixtop names the kill, keeps the evidence, and `c`, `y` replays the pressure
    workload up the ladder on a real reproduction that answers every call: not reproduced."""
    server = start_server(tmp_path, name="server")
    tmux = None
    try:
        tmux = watch(tmp_path, "--no-gpu", "--url", server.url)  # the module's shared server runs too
        tmux.wait_for(lambda s: "server ok" in s and "r0 ok" in s, "radixtop to find the server", 90)
        shared_prefix_traffic(server, 4)
        scheduler = server.scheduler()
        scheduler.kill()
        tmux.wait_for(lambda s: "killed by SIGKILL" in s, "the kill named on screen", 10)
        tmux.wait_for(lambda s: "server DOWN" in s or "procs DOWN" in s, "the server's death", 30)
        assert server.proc is not None and server.proc.wait(30) is not None
        tmux.wait_for(lambda s: AUTO_BUNDLE_WRITTEN.search(s), "the automatic bundle written", 30)
        # The processes pane: the killed scheduler is one row, gone, however many reads saw it go.
        rows = [line for line in tmux.capture().splitlines() if re.search(rf"▏\s+{scheduler.pid}\s", line)]
        assert len(rows) == 1 and "gone" in rows[0], rows
        tmux.send("c")
        plan = tmux.wait_for(lambda s: "as planned?" in s, "the plan", 120)
        assert "died at" in plan and "scheduler" in plan, plan
        assert "2,048 token ids" in plan, plan
        tmux.send("y")
        final = tmux.wait_for(lambda s: "VERDICT:" in s, "the verdict", 600, step=1.0)
        verdict = json.loads(next(tmp_path.glob("radixtop-confirm-*/verdict.json")).read_text())
        assert verdict["verdict"] == "not-reproduced", (verdict["reason"], final)
        steps = verdict["steps"]
        assert [s["step"] for s in steps][-1] == "as-run" and {s["role"] for s in steps} == {"reproduction"}
        for step in steps:
            assert step["healthy"] and step["failed_calls"] == 0 and step["answered_calls"] == step["calls"], step
        usages = [r["peak_token_usage"] for r in verdict["ladder"]]
        assert None not in usages and usages == sorted(usages), verdict["ladder"]  # lower load, lower usage
        work = next(tmp_path.glob("radixtop-confirm-*"))
        assert "IndexError" not in (work / "reproduction.out").read_text(errors="replace")
    finally:
        if tmux is not None:
            tmux.kill()
        server.stop()


def test_a_workload_outside_the_models_vocabulary_fails_every_step_alike_and_is_inconclusive(tmp_path: Path) -> None:
    """What radixtop used to send (token ids up to 2**24 against a 2,048-id model): every server dies
    at once in F.embedding, whatever the step changes, which says nothing about the failure."""
    server = start_server(tmp_path, name="server")
    try:
        env_url = server.url
        done = radixtop("confirm", "--url", env_url, "--stop-original", "--yes", "--runs", "1", "--no-bundle",
                        "--vocab-size", "1000000", "--json", "--workdir", str(tmp_path / "work"),
                        cwd=tmp_path, timeout=600)
    finally:
        server.stop()
    verdict = json.loads(done.stdout)
    assert verdict["verdict"] == "inconclusive", verdict["reason"]
    assert "steps failed the same way" in verdict["reason"], verdict["reason"]
    assert [s["step"] for s in verdict["steps"]] == ["lower-pressure", "reuse-off", "cache-off"], verdict["steps"]
    assert "IndexError" in (tmp_path / "work" / "reproduction.out").read_text(errors="replace")



def test_detectors_run_inside_a_real_reproduction_and_raise_no_false_alarm(tmp_path: Path) -> None:
    """--detectors on the CPU engine: the reproduction runs with SGLang's page invariants and busy
    memory check (its own environment says so while it serves), the KV canary is left out (Triton
    kernels), and a healthy server stays clean up the whole ladder: no check misreads the CPU
    engine's accounting."""
    import psutil

    from radixtop.incident.common.server import listening_pid

    server = start_server(tmp_path, name="server")
    work = tmp_path / "work"
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixtop", "confirm", "--url", server.url, "--stop-original", "--detectors", "--yes",
         "--runs", "1", "--no-bundle", "--json", "--workdir", str(work)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    seen: dict[str, str] = {}
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and not seen:
            plan = work / "plan.json"
            if plan.is_file():
                arm = next(a for a in json.loads(plan.read_text())["arms"] if a["role"] == "reproduction")
                pid = listening_pid(int(arm["url"].rsplit(":", 1)[1]))
                if pid is not None:
                    try:
                        seen = psutil.Process(pid).environ()
                    except psutil.Error:
                        pass
            time.sleep(0.5)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()
    assert seen.get("SGLANG_CHECK_KV_PAGE_INVARIANTS") == "1", sorted(seen)
    assert seen.get("SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY") == "1"
    verdict = json.loads(out)
    assert verdict["verdict"] == "not-reproduced", (verdict["reason"], err[-3000:])
    assert {s["role"] for s in verdict["steps"]} == {"reproduction"} and all(
        s["signatures"] == [] for s in verdict["steps"]), verdict["steps"]
    repro = next(a for a in verdict["plan"]["arms"] if a["role"] == "reproduction")
    assert any("left out on the CPU" in c for c in repro["changes"]) and "--kv-canary" not in repro["argv"]


def pressure_traffic(server: RealServer, requests: int = 64) -> None:
    """400-token prompts with nothing in common, eight in flight at all times: while some decode
    (their prompts locked in the tree), the next ones' prefill needs the finished ones' pages, so
    the allocator evicts with most of the 4,096-token pool locked."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> None:
        if server.proc is not None and server.proc.poll() is not None:
            return
        ids = [(i * 37 + k) % 2000 + 10 for k in range(400)]
        try:
            server.generate(ids, max_new_tokens=8 + (i % 4) * 8, ignore_eos=True)
        except httpx.HTTPError:
            pass  # the server dying mid-call is the point

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, range(requests)))


def test_a_fault_inside_the_real_cache_is_found_kept_and_confirmed_pressure_dependent(tmp_path: Path) -> None:
    """The seed's failure inside the real UnifiedRadixCache (tests/sglang/fault_plugin: its evict
    raises while running requests lock half the pool): radixtop names the signature, the rank's
    flight record is written, the automatic bundle keeps both, and `c`, `y` runs the experiment on
    real servers (the fault's switch carried, an SGLANG_ key): clean lower on the ladder, failing
    as recorded and again with SGLANG_RADIX_FORCE_MISS=1, clean with --disable-radix-cache: it needs
    the pressure and the cache's eviction path, not reuse."""
    server = start_server(tmp_path, name="server", env={"SGLANG_TEST_EVICT_FAULT": "1"})
    tmux = None
    try:
        tmux = watch(tmp_path, "--no-gpu", "--url", server.url)  # the module's shared server runs too
        tmux.wait_for(lambda s: "server ok" in s and "r0 ok" in s, "radixtop to find the server", 90)
        pressure_traffic(server)
        try:
            assert server.proc is not None and server.proc.wait(60) is not None
        except subprocess.TimeoutExpired:
            raise AssertionError("the fault never fired:\n" + server.text()[-2000:]) from None
        tmux.wait_for(lambda s: "page lock failed during prefix eviction" in s, "the signature's finding on screen", 30)
        tmux.wait_for(lambda s: AUTO_BUNDLE_WRITTEN.search(s), "the automatic bundle written", 60)
        bundle = next(p for p in tmp_path.glob("radixtop-bundle-*") if p.is_dir())
        flights = list(bundle.rglob("flight/*.json"))
        assert flights, sorted(str(p.relative_to(bundle)) for p in bundle.rglob("*"))
        record = json.loads(flights[0].read_text())
        assert "Failed to lock memory page" in json.dumps(record), record.keys()
        tmux.send("c")
        plan = tmux.wait_for(lambda s: "as planned?" in s, "the plan", 120)
        assert "SGLANG_TEST_EVICT_FAULT" in plan, plan
        tmux.send("y")
        final = tmux.wait_for(lambda s: "VERDICT:" in s, "the verdict", 900, step=1.0)
        verdict = json.loads(next(tmp_path.glob("radixtop-confirm-*/verdict.json")).read_text())
        assert verdict["verdict"] == "pressure-dependent", (verdict["reason"], final)
        states = {k: v["state"] for k, v in verdict["conditions"].items()}
        assert states == {"pressure": "needed", "reuse": "not-needed", "cache": "needed"}, verdict["conditions"]
        reuse_off = next(s for s in verdict["steps"] if s["step"] == "reuse-off")
        assert reuse_off["reuse_off"] == "SGLANG_RADIX_FORCE_MISS=1", reuse_off
        assert reuse_off["cached_tokens"]["cached_tokens"] == 0, reuse_off
        control = verdict["steps"][-1]
        assert control["step"] == "cache-off" and control["healthy"] and control["failed_calls"] == 0, control
        assert "Needs: pressure needed · reuse not-needed · cache needed" in final
        work = next(tmp_path.glob("radixtop-confirm-*"))
        assert "Failed to lock memory page" in (work / "reproduction.out").read_text(errors="replace")
    finally:
        if tmux is not None:
            tmux.kill()
        server.stop()


def test_a_crash_dump_armed_live_makes_c_replay_the_crashs_own_requests(tmp_path: Path, runtime_dir: Path) -> None:
    """D arms SGLang's crash dump on the live server (POST /configure_logging, shown first, sent on
    y); the scheduler SIGKILLed under shared-prefix traffic leaves the dump; c's plan replays the
    crash's own requests, and the reproduction receives exactly their token ids (its own request
    log says so: the server logs requests at level 3, and the reproduction runs with its flags)."""
    server = start_server(tmp_path, name="server", flags=("--log-requests", "--log-requests-level", "3"))
    tmux = None
    try:
        tmux = watch(tmp_path, "--no-gpu", "--url", server.url)  # the module's shared server runs too
        tmux.wait_for(lambda s: "server ok" in s and "r0 ok" in s, "radixtop to find the server", 90)
        tmux.send("D")
        dialog = tmux.wait_for(lambda s: "Arm the crash dump?" in s, "the arming dialog", 15)
        assert "/configure_logging" in dialog and '"crash_dump_folder"' in dialog, dialog
        tmux.send("y")
        tmux.wait_for(lambda s: "crash dump armed" in s, "the server armed", 15)
        assert "Config logging" in server.text() and str(runtime_dir / "crash-dumps") in server.text()
        prompts = [SHARED + [500 + i] * (12 + i) for i in range(4)]
        for ids in prompts:
            server.generate(ids, max_new_tokens=8)
        server.scheduler().kill()
        assert server.proc is not None and server.proc.wait(60) is not None
        assert "Dumped 4 finished and 0 unfinished requests before crash to" in server.text(), server.text()[-2000:]
        # The dump SGLang's own code wrote converts exactly: each request's token ids as sent.
        converted = tmp_path / "crash.trace.json"
        done = radixtop("trace", "convert", str(runtime_dir / "crash-dumps"), "-o", str(converted), cwd=tmp_path)
        assert done.returncode == 0 and "4 requests" in done.stderr, done.stderr
        assert [r["input_ids"] for r in json.loads(converted.read_text())["requests"]] == prompts
        tmux.wait_for(lambda s: AUTO_BUNDLE_WRITTEN.search(s), "the automatic bundle written", 60)
        tmux.send("c")
        plan = tmux.wait_for(lambda s: "as planned?" in s, "the plan", 120)
        assert "the crash's own: " in plan and "4 requests" in plan, plan
        tmux.send("y")
        tmux.wait_for(lambda s: "VERDICT:" in s, "the verdict", 600, step=1.0)
        work = next(tmp_path.glob("radixtop-confirm-*"))
        received = (work / "reproduction.out").read_text(errors="replace")
        for ids in prompts:
            assert str(ids)[1:-1] in received, f"{ids[-1]}'s prompt never reached the reproduction"
    finally:
        if tmux is not None:
            tmux.kill()
        server.stop()


def test_a_servers_json_request_log_is_the_confirmation_runs_workload(tmp_path: Path) -> None:
    """A server logging whole requests as JSON (level 3, to its own log): with no --trace, confirm
    replays those requests, and the reproduction receives exactly their token ids."""
    server = start_server(tmp_path, name="server",
                          flags=("--log-requests", "--log-requests-level", "3", "--log-requests-format", "json"))
    prompts = [SHARED + [600 + i] * (8 + i) for i in range(3)]
    try:
        for ids in prompts:
            server.generate(ids, max_new_tokens=6)
        done = radixtop("confirm", "--url", server.url, "--stop-original", "--yes", "--runs", "1", "--no-bundle",
                        "--json", "--log", str(server.log), "--workdir", str(tmp_path / "work"),
                        cwd=tmp_path, timeout=600)
    finally:
        server.stop()
    assert done.returncode in (0, 1), done.stderr
    plan = json.loads((tmp_path / "work" / "plan.json").read_text())
    assert plan["workload"]["origin"].startswith("the server's logged requests: "), plan["workload"]
    assert plan["workload"]["requests"] == 3, plan["workload"]
    received = (tmp_path / "work" / "reproduction.out").read_text(errors="replace")
    for ids in prompts:
        assert json.dumps(ids)[1:-1] in received, f"{ids[-1]}'s prompt never reached the reproduction"
