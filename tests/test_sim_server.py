"""`radixtop sim` over real loopback HTTP.

Two harnesses: `inproc` runs the whole SimServer (engine, debug endpoints, uvicorn on a bound
127.0.0.1 socket) as a task in the test's event loop, for the API shapes; `launch` starts
`python -m radixtop sim ...` as a real subprocess, for what only a process shows (flags, logs,
exit status, death). Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixtop.diagnosis.logline import is_continuation, parse_line
from radixtop.instrument.flight import flight_dir, record_name
from radixtop.netbind import bind_socket
from radixtop.schema import HEALTH_PATH, SNAPSHOT_PATH, FlightRecord, parse_health, parse_snapshot
from radixtop.sim.cli import LogSink, SimServer, UsageError, fault_text, parse_options, sim_argv
from radixtop.sim.model import SimTokenizer

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 20.0


# ----------------------------------------------------------------------------------------------
# Harnesses
# ----------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def inproc(tmp_path: Path, *flags: str) -> AsyncIterator[tuple[SimServer, httpx.AsyncClient]]:
    opts = parse_options(["--port", "0", "--step-ms", "0", *flags])
    sock = bind_socket("127.0.0.1", 0)
    sink = LogSink(str(tmp_path / "inproc.log"))
    sim = SimServer(opts, sock, sink)
    task = asyncio.create_task(sim.run())
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (sim.server is not None and sim.server.started) and time.monotonic() < deadline:
            assert not task.done(), task.exception()
            await asyncio.sleep(0.01)
        assert sim.server is not None and sim.server.started, "the in-process sim did not start"
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{sim.port}", timeout=10.0) as client:
            yield sim, client
    finally:
        if sim.server is not None:
            sim.server.should_exit = True
        with contextlib.suppress(Exception):
            async with asyncio.timeout(10.0):
                await task
        sink.close()
        sock.close()


class Launched:
    def __init__(self, proc: subprocess.Popen, port: int, log: Path):
        self.proc, self.port, self.log = proc, port, log
        self.url = f"http://127.0.0.1:{port}"

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8")


def _start(tmp_path: Path, *flags: str, name: str = "sim") -> tuple[subprocess.Popen, Path, Path]:
    ready, log = tmp_path / f"{name}.port", tmp_path / f"{name}.log"
    cmd = sim_argv(*flags, ready_file=ready, log_file=log)
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, ready, log


@contextlib.contextmanager
def launch(tmp_path: Path, *flags: str) -> Iterator[Launched]:
    proc, ready, log = _start(tmp_path, *flags)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                out, err = proc.communicate(timeout=5)
                pytest.fail(f"sim did not become ready (rc={proc.returncode}): {err[-2000:]}")
            time.sleep(0.02)
        yield Launched(proc, int(ready.read_text()), log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _prompt(i: int, words: int) -> str:
    return " ".join(f"w{i}_{j}" for j in range(words))


# ----------------------------------------------------------------------------------------------
# API shapes (in-process)
# ----------------------------------------------------------------------------------------------


def _free_port_pair() -> int:
    """A base port with base and base + 1 free right now (the OS picks the base)."""
    return _free_base(0, 1)


def _free_base(*offsets: int) -> int:
    """A base port with base + each offset free right now (the OS picks the first of them)."""
    for _ in range(50):
        with contextlib.ExitStack() as held:
            first = held.enter_context(socket.socket())
            first.bind(("127.0.0.1", 0))
            base = first.getsockname()[1] - offsets[0]
            if base < 1 or base + max(offsets) > 65535:
                continue
            try:
                for offset in offsets[1:]:
                    held.enter_context(socket.socket()).bind(("127.0.0.1", base + offset))
            except OSError:
                continue
            return base
    pytest.skip(f"no free ports at base + {offsets} found")


async def test_health_server_info_and_models(tmp_path: Path) -> None:
    async with inproc(
        tmp_path, "--model-path", "Qwen/Qwen2.5-0.5B-Instruct", "--max-total-tokens", "4096"
    ) as (sim, c):
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/health_generate")).status_code == 200
        info = (await c.get("/server_info")).json()
        assert info == {
            **info,
            "model_path": "Qwen/Qwen2.5-0.5B-Instruct",
            "max_total_num_tokens": 4096,
            "page_size": 1,
        }
        # SGLang's launch_command is the argv after the program, joined by spaces.
        assert info["launch_command"] == " ".join(sim.opts.argv)
        assert info["version"].endswith("-radixtop-sim")
        assert isinstance(info["internal_states"], list) and len(info["internal_states"]) == 1
        state = info["internal_states"][0]
        assert {
            "token_usage",
            "num_running_reqs",
            "num_queue_reqs",
            "cache_hit_rate",
            "evictable_tokens",
        } <= set(state)
        assert len(info["radixtop_instrument"]) == 1
        legacy = (await c.get("/get_server_info")).json()
        assert legacy["launch_command"] == info["launch_command"]
        models = (await c.get("/v1/models")).json()
        assert models["object"] == "list"
        assert [m["id"] for m in models["data"]] == ["Qwen/Qwen2.5-0.5B-Instruct"]
        assert (await c.get("/v1/models/Qwen/Qwen2.5-0.5B-Instruct")).json()[
            "id"
        ] == "Qwen/Qwen2.5-0.5B-Instruct"
        missing = await c.get("/v1/models/nope")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


async def test_instrument_port_base_plus_rank(tmp_path: Path) -> None:
    base = _free_port_pair()
    async with inproc(tmp_path, "--tp-size", "2", "--instrument-port", str(base)) as (_, c):
        urls = (await c.get("/server_info")).json()["radixtop_instrument"]
        assert urls == [f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"]
        for rank, url in enumerate(urls):
            health = parse_health((await c.get(url + HEALTH_PATH)).content)
            assert health.rank == rank


async def test_generate_shape_and_determinism(tmp_path: Path) -> None:
    async with inproc(tmp_path) as (_, c):
        body = {"text": _prompt(0, 30), "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
        first = (await c.post("/generate", json=body)).json()
        assert set(first) == {"text", "output_ids", "meta_info"}
        meta = first["meta_info"]
        assert {"id", "prompt_tokens", "cached_tokens", "completion_tokens", "finish_reason"} <= set(meta)
        assert meta["prompt_tokens"] == 30 and meta["completion_tokens"] == 8 == len(first["output_ids"])
        assert meta["finish_reason"] == {"type": "length", "length": 8}
        assert first["text"] == SimTokenizer().decode(first["output_ids"])
        second = (await c.post("/generate", json=body)).json()
        assert second["output_ids"] == first["output_ids"] and second["text"] == first["text"]
        assert second["meta_info"]["cached_tokens"] > 0  # the prompt came from the radix cache
        by_ids = (
            await c.post(
                "/generate",
                json={
                    "input_ids": SimTokenizer().encode(body["text"]),
                    "sampling_params": body["sampling_params"],
                },
            )
        ).json()
        assert by_ids["output_ids"] == first["output_ids"]
        rid = (await c.post("/generate", json={**body, "rid": "my-request"})).json()
        assert rid["meta_info"]["id"] == "my-request"


async def test_n_and_batch_are_lists_grouped_per_prompt(tmp_path: Path) -> None:
    async with inproc(tmp_path) as (_, c):
        params = {"max_new_tokens": 4, "temperature": 0, "n": 2}
        out = (
            await c.post(
                "/generate", json={"text": [_prompt(1, 10), _prompt(2, 10)], "sampling_params": params}
            )
        ).json()
        assert isinstance(out, list) and len(out) == 4
        ids = [item["output_ids"] for item in out]
        assert ids[0] == ids[1] and ids[2] == ids[3] and ids[0] != ids[2]  # SGLang's order: i * n + j
        single_n = (
            await c.post("/generate", json={"input_ids": [5, 6, 7], "sampling_params": {**params, "n": 3}})
        ).json()
        assert isinstance(single_n, list) and len(single_n) == 3
        batch = (
            await c.post(
                "/generate", json={"input_ids": [[5, 6, 7], [8, 9]], "sampling_params": {"max_new_tokens": 2}}
            )
        ).json()
        assert [item["meta_info"]["prompt_tokens"] for item in batch] == [3, 2]
        # sampling_params may also be a list, one per prompt (the same n in each), as in SGLang.
        per_prompt = [{"max_new_tokens": 2}, {"max_new_tokens": 5}]
        mixed = (
            await c.post("/generate", json={"input_ids": [[5, 6], [8, 9]], "sampling_params": per_prompt})
        ).json()
        assert [item["meta_info"]["completion_tokens"] for item in mixed] == [2, 5]
        for bad, expected in (
            ([{"n": 1}, {"n": 2}], "parallel_sample_num should be the same"),
            ([{"max_new_tokens": 2}], "give one per prompt (2)"),
        ):
            r = await c.post("/generate", json={"input_ids": [[5, 6], [8, 9]], "sampling_params": bad})
            assert r.status_code == 400 and expected in r.json()["error"]["message"]


async def test_v1_completions_shape(tmp_path: Path) -> None:
    async with inproc(tmp_path, "--enable-cache-report") as (_, c):
        req = {"model": "whatever", "prompt": _prompt(3, 12), "max_tokens": 5, "temperature": 0, "n": 2}
        out = (await c.post("/v1/completions", json=req)).json()
        assert out["object"] == "text_completion" and out["id"].startswith("cmpl-")
        assert [ch["index"] for ch in out["choices"]] == [0, 1]
        assert all(ch["finish_reason"] == "length" and ch["text"].strip() for ch in out["choices"])
        assert out["usage"]["prompt_tokens"] == 12 and out["usage"]["completion_tokens"] == 10
        assert out["usage"]["total_tokens"] == 22
        again = (await c.post("/v1/completions", json={**req, "n": 1})).json()
        assert again["choices"][0]["text"] == out["choices"][0]["text"]
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        tokens = (await c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2})).json()
        assert tokens["usage"]["prompt_tokens"] == 3 and len(tokens["choices"]) == 1


async def test_streaming_sends_sse_and_done(tmp_path: Path) -> None:
    async with inproc(tmp_path) as (_, c):
        for path, body in (
            ("/generate", {"text": "a b c", "stream": True, "sampling_params": {"max_new_tokens": 3}}),
            ("/v1/completions", {"prompt": "a b c", "stream": True, "max_tokens": 3}),
        ):
            r = await c.post(path, json=body)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = [line[len("data: ") :] for line in r.text.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            assert json.loads(events[0])  # a JSON chunk before [DONE]


async def test_flush_cache_get_and_post(tmp_path: Path) -> None:
    async with inproc(tmp_path) as (_, c):
        body = {"text": _prompt(4, 20), "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
        await c.post("/generate", json=body)
        for method in ("GET", "POST"):
            r = await c.request(method, "/flush_cache")
            assert r.status_code == 200 and r.text.startswith("Cache flushed.")
        after = (await c.post("/generate", json=body)).json()
        assert after["meta_info"]["cached_tokens"] == 0


NATIVE_BAD = [
    pytest.param(b'{"text": ', "not valid JSON", id="malformed-json"),
    pytest.param(b"[1, 2]", "must be a JSON object", id="not-an-object"),
    pytest.param(b"{}", "Either text, input_ids", id="missing-input"),
    pytest.param(b'{"text": "a", "input_ids": [1]}', "Either text, input_ids", id="both-inputs"),
    pytest.param(b'{"text": 5}', "text must be", id="text-wrong-type"),
    pytest.param(b'{"input_ids": ["a"]}', "list of integer token ids", id="ids-wrong-type"),
    pytest.param(b'{"input_ids": []}', "cannot be empty", id="ids-empty"),
    pytest.param(b'{"input_ids": [1073741824]}', "outside the vocabulary", id="id-out-of-vocab"),
    pytest.param(b'{"input_ids": [[1], [-1]]}', "outside the vocabulary", id="id-negative"),
    pytest.param(
        b'{"text": "a", "sampling_params": "x"}',
        "sampling_params must be a JSON object",
        id="params-wrong-type",
    ),
    pytest.param(
        b'{"text": "a", "sampling_params": {"max_new_tokens": "10"}}',
        "max_new_tokens must be an integer",
        id="max-new-str",
    ),
    pytest.param(
        b'{"text": "a", "sampling_params": {"max_new_tokens": -1}}',
        "max_new_tokens must be at least 0",
        id="max-new-negative",
    ),
    pytest.param(
        b'{"text": "a", "sampling_params": {"max_new_tokens": 1000000000}}',
        "exceeds the model's maximum context length",
        id="max-new-absurd",
    ),
    pytest.param(
        b'{"text": "a", "sampling_params": {"temperature": -1}}',
        "non-negative finite",
        id="temperature-negative",
    ),
    pytest.param(
        b'{"text": "a", "sampling_params": {"temperature": "hot"}}',
        "temperature must be a number",
        id="temperature-str",
    ),
    pytest.param(b'{"text": "a", "sampling_params": {"n": 0}}', "n must be at least 1", id="n-zero"),
    pytest.param(b'{"text": "a", "stream": "yes"}', "stream must be", id="stream-str"),
    pytest.param(b'{"text": "a", "rid": 7}', "rid must be", id="rid-wrong-type"),
    pytest.param(
        json.dumps({"input_ids": list(range(1, 600))}).encode(),
        "longer than the model's context length",
        id="prompt-longer-than-pool",
    ),
]


async def test_bad_generate_requests_get_400_and_the_server_lives(tmp_path: Path) -> None:
    async with inproc(tmp_path, "--max-total-tokens", "512") as (_, c):
        for case in NATIVE_BAD:
            raw, expected = case.values
            r = await c.post("/generate", content=raw, headers={"content-type": "application/json"})
            assert r.status_code == 400, (case.id, r.text)
            error = r.json()["error"]
            assert expected in error["message"], (case.id, error)
            assert error["type"] == "BadRequestError" and error["code"] == 400
        assert (await c.get("/health")).status_code == 200
        ok = await c.post("/generate", json={"text": "still here", "sampling_params": {"max_new_tokens": 2}})
        assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 2


async def test_bad_completions_requests_get_openai_errors(tmp_path: Path) -> None:
    async with inproc(tmp_path) as (_, c):
        cases = [
            (
                {"content": b'{"max_tokens": 3}', "headers": {"content-type": "application/json"}},
                "prompt is required",
            ),
            (
                {"content": b'{"prompt": "a"}', "headers": {"content-type": "text/plain"}},
                "Only 'application/json'",
            ),
            ({"json": {"prompt": "a", "max_tokens": -5}}, "max_tokens must be at least 0"),
            ({"json": {"prompt": [[]]}}, "cannot be empty"),
            ({"content": b"{oops", "headers": {"content-type": "application/json"}}, "not valid JSON"),
        ]
        for kwargs, expected in cases:
            r = await c.post("/v1/completions", **kwargs)
            assert r.status_code == 400, r.text
            body = r.json()  # SGLang's OpenAI ErrorResponse: flat, object "error"
            assert body["object"] == "error" and body["type"] == "BadRequestError" and body["code"] == 400
            assert expected in body["message"]
        huge = await c.post(
            "/v1/completions",
            content=b" " * (16 * 1024 * 1024 + 1),
            headers={"content-type": "application/json"},
        )
        assert huge.status_code == 413 and huge.json()["object"] == "error"
        assert (await c.post("/v1/completions", json={"prompt": "fine", "max_tokens": 1})).status_code == 200


async def test_metrics_only_with_enable_metrics(tmp_path: Path) -> None:
    async with inproc(tmp_path) as (_, c):
        off = await c.get("/metrics")
        assert off.status_code == 404 and off.json() == {"detail": "Not Found"}  # FastAPI's shape, as SGLang
        assert (await c.get("/generate")).json() == {"detail": "Method Not Allowed"}
    async with inproc(
        tmp_path, "--enable-metrics", "--served-model-name", "sim-model", "--max-total-tokens", "256"
    ) as (_, c):
        # Enough distinct prompts to overflow the 256-token pool, so eviction runs and is counted.
        for i in range(12):
            r = await c.post(
                "/generate",
                json={
                    "text": _prompt(10 + i, 40),
                    "sampling_params": {"max_new_tokens": 4, "temperature": 0},
                },
            )
            assert r.status_code == 200
        text = (await c.get("/metrics")).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    expected = {
        "sglang:token_usage",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:cache_hit_rate",
        "sglang:kv_available_tokens",
        "sglang:kv_evictable_tokens",
        "sglang:num_retracted_reqs",
        "sglang:eviction_duration_seconds",
        "sglang:gen_throughput",
        # counters: the parser names the family without _total; the samples keep it
        "sglang:evicted_tokens",
        "sglang:prompt_tokens",
        "sglang:generation_tokens",
    }
    assert expected <= set(families)
    usage = families["sglang:token_usage"].samples[0]
    assert usage.labels["model_name"] == "sim-model" and usage.labels["engine_type"] == "unified"
    prompt = {
        s.labels["is_streaming"]: s.value
        for s in families["sglang:prompt_tokens"].samples
        if s.name == "sglang:prompt_tokens_total"
    }
    assert prompt["false"] == 12 * 40
    evicted = [
        s for s in families["sglang:evicted_tokens"].samples if s.name == "sglang:evicted_tokens_total"
    ]
    assert evicted and evicted[0].value > 0 and evicted[0].labels["cache_type"] == "RadixCache"
    count = [s for s in families["sglang:eviction_duration_seconds"].samples if s.name.endswith("_count")]
    assert count[0].value > 0
    assert not any(name.endswith("_created") for name in families)


# ----------------------------------------------------------------------------------------------
# Flags (unit) and the CLI as a process
# ----------------------------------------------------------------------------------------------


def test_flag_parsing_aliases_unknown_and_faults() -> None:
    opts = parse_options(
        ["--tp", "2", "--model", "m", "--context-length", "32768", "--trust-remote-code", "--page-size", "4"]
    )
    assert opts.args.tp_size == 2 and opts.args.model_path == "m" and opts.args.page_size == 4
    assert opts.ignored == ["--context-length 32768", "--trust-remote-code"]
    assert fault_text("lock-race:7:threshold=0.8") == "lock-race:seed=7,threshold=0.8"
    assert fault_text("lock-race:7") == "lock-race:seed=7"
    assert fault_text("leak:probability=1") == "leak:probability=1"
    (spec,) = parse_options(["--fault", "lock-race:7:probability=1"]).faults
    assert spec.name == "lock-race" and spec.seed == 7
    bad_flags = (
        ["--page-size", "0"],
        ["--port", "70000"],
        ["--fault", "nope"],
        ["--page-size", "x"],
        ["stray"],
        ["--radix-eviction-policy", "nope"],
        ["--page-size", "64", "--max-total-tokens", "16"],
    )
    for bad in bad_flags:
        with pytest.raises(UsageError):
            parse_options(bad)


def test_bad_flag_is_one_line_and_exit_2() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "radixtop", "sim", "--max-running-requests", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["radixtop sim: --max-running-requests must be >= 1, got 0"]


def test_port_in_use_is_one_line_and_exit_2() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-m", "radixtop", "sim", "--port", str(port)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert r.returncode == 2
    assert r.stderr.strip() == f"radixtop sim: port {port} on 127.0.0.1 is in use; pick another with --port"


def test_unknown_flags_noted_tp2_prefixes_debug_endpoints_and_log_format(tmp_path: Path) -> None:
    with launch(
        tmp_path, "--tp-size", "2", "--context-length", "32768", "--trust-remote-code", "--step-ms", "0"
    ) as sim:
        info = httpx.get(f"{sim.url}/server_info", timeout=10).json()
        assert info["tp_size"] == 2
        r = httpx.post(
            f"{sim.url}/generate",
            json={"text": _prompt(5, 20), "sampling_params": {"max_new_tokens": 3}},
            timeout=10,
        )
        assert r.status_code == 200
        urls = info["radixtop_instrument"]
        assert len(urls) == 2
        for rank, url in enumerate(urls):
            deadline = time.monotonic() + 10
            while True:  # 503 until the scheduler's first safe point
                resp = httpx.get(url + SNAPSHOT_PATH, timeout=5)
                if resp.status_code == 200 or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert resp.status_code == 200, resp.text
            snap = parse_snapshot(resp.content)
            assert snap.rank == rank
            assert parse_health(httpx.get(url + HEALTH_PATH, timeout=5).content).rank == rank
        sim.proc.send_signal(signal.SIGTERM)
        assert sim.proc.wait(timeout=10) == 0
        log = sim.log_text()
        stdout = sim.proc.stdout.read()
    # --port 0: the bound port is printed (logs go to the file) and logged as uvicorn does.
    assert f"serving http://127.0.0.1:{sim.port} " in stdout
    assert f"INFO:     Uvicorn running on http://127.0.0.1:{sim.port} (Press CTRL+C to quit)" in log
    assert re.search(r"accepted and ignored SGLang flags .*--context-length 32768, --trust-remote-code", log)
    for rank in ("TP0", "TP1"):
        assert re.search(
            rf"^\[\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{{3}} {rank}\] KV Cache is allocated\. #tokens: \d+",
            log,
            re.M,
        )
    assert re.search(r"^\[[^\]]+ TP0\] Prefill batch, #new-seq: 1, ", log, re.M)
    assert "The server is fired up and ready to roll!" in log
    # Every line is an SGLang record radixtop's own parser reads, or a continuation of one.
    lines = log.splitlines()
    assert lines
    for line in lines:
        assert parse_line(line).time is not None or is_continuation(line), line


async def _pressure(url: str) -> list[int | str]:
    """48 distinct 60-word prompts at once: a 1024-token pool runs full and evicts."""
    async with httpx.AsyncClient(base_url=url, timeout=15.0) as c:

        async def one(i: int) -> int | str:
            try:
                body = {"text": _prompt(100 + i, 60), "sampling_params": {"max_new_tokens": 40}}
                return (await c.post("/generate", json=body)).status_code
            except httpx.HTTPError as exc:  # the process may be gone before a late request lands
                return type(exc).__name__

        return await asyncio.gather(*(one(i) for i in range(48)))


def test_lock_race_under_pressure_dies_like_sglang(tmp_path: Path) -> None:
    flags = ("--max-total-tokens", "1024", "--fault", "lock-race:1:probability=1", "--step-ms", "1")
    with launch(tmp_path, *flags) as sim:
        statuses = asyncio.run(_pressure(sim.url))
        rc = sim.proc.wait(timeout=10)
        log = sim.log_text()
    assert rc != 0
    assert 503 in statuses and all(s in (200, 503) or isinstance(s, str) for s in statuses)
    error = log.index("Scheduler hit an exception: Traceback (most recent call last):")
    assert "RadixCacheError: Failed to lock memory page during dynamic prefix eviction" in log[error:]
    assert log.index("SIGQUIT received. signum=None, frame=None. It usually means one child failed.") > error
    assert "WARNING: radix cache eviction contended with a page lock" in log[:error]
    # Its flight recorder wrote the rank's cache as it died (the instrument's code, as in SGLang).
    record = FlightRecord.from_dict(json.loads((flight_dir() / record_name(0, sim.proc.pid)).read_bytes()))
    assert [t.kind for t in record.triggers] == ["scheduler_exception"]
    assert record.triggers[0].message.endswith(
        "RadixCacheError: Failed to lock memory page during dynamic prefix eviction"
    )
    assert record.snapshot.walkable and record.snapshot.census.complete and record.snapshot.counters.lock_ops > 0
    # Its trigger names the node the warning said the eviction contended with.
    contended = re.search(r"contended with a page lock on node (\d+)", log)
    assert contended and record.triggers[0].node == int(contended.group(1))


def _snapshot(url: str) -> bytes:
    deadline = time.monotonic() + 10
    while True:  # 503 until the scheduler's first safe point
        resp = httpx.get(url + SNAPSHOT_PATH, timeout=5)
        if resp.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert resp.status_code == 200, resp.text
    return resp.content


def test_node_1_of_2_runs_serves_and_fails_as_tp2_and_tp3(tmp_path: Path) -> None:
    base = _free_base(2, 3)
    flags = (
        "--tp-size", "4", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:5000",
        "--instrument-port", str(base), "--enable-metrics", "--max-total-tokens", "1024",
        "--fault", "lock-race:1:probability=1,rank=3", "--step-ms", "1",
    )
    with launch(tmp_path, *flags) as sim:
        info = httpx.get(f"{sim.url}/server_info", timeout=10).json()
        assert (info["tp_size"], info["nnodes"], info["node_rank"]) == (4, 2, 1)
        assert info["dist_init_addr"] == "10.0.0.1:5000"  # echoed: nodes make no connection
        urls = info["radixtop_instrument"]
        assert urls == [f"http://127.0.0.1:{base + 2}", f"http://127.0.0.1:{base + 3}"]
        body = {"text": _prompt(6, 20), "sampling_params": {"max_new_tokens": 3}}
        assert httpx.post(f"{sim.url}/generate", json=body, timeout=10).status_code == 200
        for rank, url in zip((2, 3), urls, strict=True):
            assert parse_snapshot(_snapshot(url)).rank == rank
            assert parse_health(httpx.get(url + HEALTH_PATH, timeout=5).content).rank == rank
        families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{sim.url}/metrics").text)}
        labelled = {s.labels["tp_rank"] for f in families.values() for s in f.samples if "tp_rank" in s.labels}
        assert labelled == {"2", "3"}
        assert "sglang:token_usage" not in families  # SGLang's TP0, on node 0, sets the scheduler gauges
        asyncio.run(_pressure(sim.url))
        rc = sim.proc.wait(timeout=15)
        log = sim.log_text()
    assert rc != 0
    assert set(re.findall(r"^\[[^\]]* (TP\d+)\]", log, re.M)) == {"TP2", "TP3"}
    assert "Prefill batch" not in log and "Decode batch" not in log  # TP0's lines
    # The lock race fires on the rank named: its warning, then its scheduler's exception.
    assert re.search(r"^\[[^\]]* TP3\] WARNING: radix cache eviction contended with a page lock", log, re.M)
    failure = re.search(r"^\[[^\]]*?( TP\d+)?\] Scheduler hit an exception: Traceback", log, re.M)
    assert failure and failure.group(1) == " TP3"
    record = FlightRecord.from_dict(json.loads((flight_dir() / record_name(3, sim.proc.pid)).read_bytes()))
    assert [t.kind for t in record.triggers] == ["scheduler_exception"]


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--nnodes", "0"], "--nnodes: must be within 1..64, got 0 (see `radixtop sim --help`)"),
        (
            ["--tp-size", "4", "--nnodes", "2", "--node-rank", "2"],
            "--node-rank must be below the number of nodes (2), got 2",
        ),
        (["--node-rank", "1"], "--node-rank must be below the number of nodes (1), got 1"),
        (
            ["--tp-size", "3", "--nnodes", "2"],
            "--tp-size must be a multiple of the number of nodes (2), each node running an equal share "
            "of the TP ranks; got 3",
        ),
        (
            ["--tp-size", "4", "--nnodes", "2", "--dp-size", "2"],
            "--dp-size must be 1 when the TP group spans several nodes, got 2",
        ),
        (["--fault", "lock-race:rank=1"], "--fault 'lock-race': rank=1 is not a TP rank this node runs (0)"),
    ],
)
def test_bad_node_flags_are_one_line(flags: list[str], line: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_options(flags)
    assert str(caught.value) == line


def test_a_rank_off_this_node_is_one_line_and_exit_2() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "radixtop", "sim", "--tp-size", "4", "--nnodes", "2", "--node-rank", "1",
         "--fault", "lock-race:1:rank=1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "radixtop sim: --fault 'lock-race': rank=1 is not a TP rank this node runs (2, 3)"
    ]


def test_log_level_warning_drops_info_lines_of_the_http_server(tmp_path: Path) -> None:
    with launch(tmp_path, "--log-level", "warning", "--context-length", "8192", "--step-ms", "0") as sim:
        r = httpx.post(f"{sim.url}/generate", json={"text": "a b", "sampling_params": {"max_new_tokens": 1}})
        assert r.status_code == 200
        bad = httpx.post(f"{sim.url}/generate", json={"text": 5})
        assert bad.status_code == 400
        sim.proc.send_signal(signal.SIGTERM)
        assert sim.proc.wait(timeout=10) == 0
        log = sim.log_text()
    assert "server_args=" not in log and "POST /generate" not in log  # INFO, as SGLang would drop them
    assert "accepted and ignored SGLang flags it does not model: --context-length 8192" in log  # WARNING
    assert "[http_server] Error: text must be a string" in log  # ERROR
