"""`radixtop record`: a loopback proxy that turns live traffic into a replayable trace."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from incident_helpers import start_sim, wait_for

from radixtop.incident.replay.record import RecordedCall, RecordingProxy, build_trace
from radixtop.incident.replay.replay import replay_series
from radixtop.incident.replay.trace import load_trace, parse_trace, plan_requests

BASE = list(range(1000, 1040))  # a 40-token "system prompt"


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory):
    server = start_sim(tmp_path_factory.mktemp("rec"), "--page-size", "16", "--max-total-tokens", "8192")
    yield server
    server.stop()


async def _traffic(url: str) -> list[str]:
    """Three token prompts (two share the 40-token base) and one text completion; their outputs."""
    texts = []
    async with httpx.AsyncClient(timeout=30) as client:
        for ids in (BASE + list(range(5000, 5020)), BASE + list(range(6000, 6030)), list(range(7000, 7025))):
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
            response = await client.post(f"{url}/generate", json=body)
            assert response.status_code == 200, response.text
            texts.append(response.json()["text"])
            await asyncio.sleep(0.02)
        response = await client.post(
            f"{url}/v1/completions",
            json={"model": "m", "prompt": "hello there radix", "max_tokens": 5, "temperature": 0},
        )
        assert response.status_code == 200, response.text
        texts.append(response.json()["choices"][0]["text"])
        batch = {"input_ids": [[1, 2, 3], [4, 5, 6]], "sampling_params": {"max_new_tokens": 2}}
        assert (await client.post(f"{url}/generate", json=batch)).status_code == 200  # forwarded, not recorded
    return texts


async def _record(upstream: str, keep: bool) -> tuple[RecordingProxy, list[str]]:
    proxy = RecordingProxy(upstream, keep_prompts=keep)
    port = await proxy.start()
    try:
        texts = await _traffic(f"http://127.0.0.1:{port}")
    finally:
        await proxy.stop()
    return proxy, texts


def test_recorded_trace_has_shape_offsets_and_shared_prefixes_but_no_prompts(sim) -> None:
    direct = asyncio.run(_traffic(sim.url))
    proxy, texts = asyncio.run(_record(sim.url, keep=False))
    assert texts == direct  # the proxy forwards answers unchanged
    trace = proxy.trace(name="live")
    a, b, c, d = trace.requests
    assert [r.offset_ms for r in trace.requests] == sorted(r.offset_ms for r in trace.requests) and a.offset_ms == 0
    assert (a.prompt_len, b.prompt_len, c.prompt_len) == (60, 70, 25)
    # the second prompt starts with the first one's first 40 tokens
    assert a.group == b.group and (a.prefix_len, a.prefix_of) == (0, None) and (b.prefix_len, b.prefix_of) == (40, a.id)
    assert trace.page_size_hint == 16  # the server's, from its /server_info
    assert c.group not in (a.group, d.group) and c.prefix_len == 0
    assert d.prompt_len == 3 and d.max_tokens == 5  # the sim's token count for the text prompt
    assert proxy.skipped == 1
    dumped = json.dumps(trace.__dict__, default=str)
    assert "hello there" not in dumped and all(r.input_ids is None and r.text is None for r in trace.requests)
    # the synthesized replay shares exactly what was shared
    planned = {p.request_id: p.input_ids for p in plan_requests(trace)}
    assert planned["q0000"][:40] == planned["q0001"][:40] and planned["q0000"][40] != planned["q0001"][40]


def test_kept_prompts_replay_the_same_input_and_get_the_same_output(sim) -> None:
    proxy, texts = asyncio.run(_record(sim.url, keep=True))
    trace = proxy.trace(name="live")
    assert trace.requests[0].input_ids == tuple(BASE + list(range(5000, 5020)))
    assert trace.requests[3].text == "hello there radix"
    series = asyncio.run(replay_series(sim.url, plan_requests(trace), 1))
    replayed = [o.text for o in series.runs[0].outcomes]
    # /v1/completions' max_tokens became /generate's max_new_tokens: the same text comes back
    assert replayed == texts
    assert parse_trace(json.loads(json.dumps(_dump(trace))), "again").requests == trace.requests


def _dump(trace):
    from radixtop.incident.replay.trace import dump_trace

    return dump_trace(trace)


def test_text_prefix_is_estimated_in_proportion_to_token_counts() -> None:
    calls = [
        RecordedCall(0.0, "/v1/completions", None, "SYSTEM PROMPT. question one", 8, 1, prompt_tokens=28),
        RecordedCall(5.0, "/v1/completions", None, "SYSTEM PROMPT. another question", 8, 2, prompt_tokens=32),
        RecordedCall(9.0, "/v1/chat/completions", None, "<user>hi", 8, 1, prompt_tokens=3, chat=True),
    ]
    trace = build_trace(calls, name="t", keep_prompts=True)
    a, b, c = trace.requests
    assert a.group == b.group and b.prefix_len == 15 and b.prefix_of == a.id and a.prefix_len == 0 and b.n == 2
    assert c.text is None  # a chat call's flattened messages are never replayed as a prompt
    with pytest.raises(ValueError, match="no generate call was recorded"):
        build_trace([], name="t", keep_prompts=False)


def test_sharing_that_is_a_tree_is_recorded_as_one_and_replays_as_the_same_tree() -> None:
    """A system prompt, then two conversations whose turns each extend their own history: every
    prompt shares with another exactly what it shared when recorded, not the longest share of its
    group (which would have every conversation share the longest one's history)."""
    system = list(range(100, 148))
    one, two = system + list(range(200, 232)), system + list(range(300, 316))
    prompts = [one, two, one + list(range(400, 420)), two + list(range(500, 540)), one + list(range(400, 420)) + [7, 8]]
    calls = [RecordedCall(10.0 * i, "/generate", ids, None, 4, 1) for i, ids in enumerate(prompts)]
    trace = build_trace(calls, name="chat", keep_prompts=False, page_size_hint=16)
    assert [(r.prefix_of, r.prefix_len) for r in trace.requests] == [
        (None, 0), ("q0000", 48), ("q0000", 80), ("q0001", 64), ("q0002", 100)]
    planned = [p.input_ids for p in plan_requests(trace)]
    for i, a in enumerate(prompts):
        for j in range(i):
            b = prompts[j]
            shared = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            made = next((k for k, (x, y) in enumerate(zip(planned[i], planned[j], strict=False)) if x != y),
                        min(len(planned[i]), len(planned[j])))
            assert made == shared, (i, j, made, shared)
    assert [len(p) for p in planned] == [len(p) for p in prompts]


def test_record_cli_writes_the_trace_after_max_requests(sim, tmp_path: Path) -> None:
    out = tmp_path / "live.json"
    ready = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixtop", "record", "--url", sim.url, "--out", str(out), "--max-requests", "2",
         "--ready-file", str(ready)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert wait_for(lambda: ready.exists() and ready.read_text().strip(), 20), proc.stderr
        port = int(ready.read_text())
        for ids in (BASE + [1, 2], BASE + [3]):
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 3}}
            assert httpx.post(f"http://127.0.0.1:{port}/generate", json=body, timeout=10).status_code == 200
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "point clients at http://127.0.0.1:" in err and "prompts are not kept" in err
    trace = load_trace(out)
    assert [r.prompt_len for r in trace.requests] == [42, 41] and trace.requests[1].prefix_len == 40


def test_a_server_that_does_not_say_its_page_size_gets_a_trace_in_tokens_and_a_warning(tmp_path: Path) -> None:
    from hardening_helpers import start_standin

    standin = start_standin(tmp_path, "--mode", "generate", "--record", str(tmp_path / "calls.jsonl"))
    out, ready = tmp_path / "t.json", tmp_path / "port"
    proc = subprocess.Popen([sys.executable, "-m", "radixtop", "record", "--url", standin.url, "--out", str(out),
                             "--max-requests", "1", "--ready-file", str(ready)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: ready.exists() and ready.read_text().strip(), 20)
        body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2}}
        assert (
            httpx.post(f"http://127.0.0.1:{int(ready.read_text())}/generate", json=body, timeout=10).status_code == 200
        )
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
        standin.stop()
    assert proc.returncode == 0, err
    assert "/server_info did not say its page_size: the trace's page_size_hint is 1" in err
    assert load_trace(out).page_size_hint == 1


class _Recorder:
    """`radixtop record` as a child process in front of the stand-in server; its stderr lines
    collected on a thread, so a test can wait for one."""

    def __init__(self, tmp_path: Path, upstream: str, *extra: str) -> None:
        import threading

        self.out, ready = tmp_path / "rec.json", tmp_path / "rec.port"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "radixtop", "record", "--url", upstream, "--out", str(self.out),
             "--ready-file", str(ready), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stderr.readline, "")), daemon=True).start()
        assert wait_for(lambda: ready.exists() and ready.read_text().strip(), 20), self.lines
        self.url = f"http://127.0.0.1:{int(ready.read_text())}"

    def said(self, text: str, timeout_s: float = 30) -> bool:
        return wait_for(lambda: any(text in line for line in self.lines), timeout_s)

    def peak_rss_kib(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(status.split("VmHWM:")[1].split()[0])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def test_a_huge_body_is_streamed_upstream_and_the_proxy_holds_at_most_its_cap(tmp_path: Path) -> None:
    from hardening_helpers import start_standin

    standin = start_standin(tmp_path, "--mode", "generate")
    rec = _Recorder(tmp_path, standin.url)
    size = 256 << 20  # held whole (the old way), it cost the proxy twice this much
    try:
        with socket.create_connection(("127.0.0.1", int(rec.url.rsplit(":", 1)[1])), timeout=60) as conn:
            conn.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % size)
            chunk = b"\0" * (1 << 20)
            for _ in range(size // len(chunk)):
                conn.sendall(chunk)
            answer = conn.recv(64)
        assert answer.startswith(b"HTTP/1.1 413"), answer  # the server's own answer, after the whole body
        peak_mib = rec.peak_rss_kib() >> 10
        assert peak_mib < 200, f"the proxy peaked at {peak_mib} MiB for a {size >> 20} MiB body"
        body = {"input_ids": BASE, "sampling_params": {"max_new_tokens": 2}}
        assert httpx.post(f"{rec.url}/generate", json=body, timeout=10).status_code == 200
        rec.proc.send_signal(signal.SIGINT)
        assert rec.proc.wait(30) == 0, rec.lines
    finally:
        rec.stop()
        standin.stop()
    assert [r.prompt_len for r in load_trace(rec.out).requests] == [len(BASE)]  # the huge one is not recorded


def test_a_second_ctrl_c_while_the_trace_is_written_loses_nothing(tmp_path: Path) -> None:
    from hardening_helpers import start_standin

    standin = start_standin(tmp_path, "--mode", "generate")
    rec = _Recorder(tmp_path, standin.url)
    calls = 60
    try:
        with httpx.Client(timeout=10) as client:
            for i in range(calls):
                body = {"input_ids": [*range(1, 2001), i], "sampling_params": {"max_new_tokens": 1}}
                assert client.post(f"{rec.url}/generate", json=body).status_code == 200
        rec.proc.send_signal(signal.SIGINT)
        assert rec.said("stopping: 60 calls recorded"), rec.lines
        rec.proc.send_signal(signal.SIGINT)
        assert rec.said("writing"), rec.lines
        rec.proc.send_signal(signal.SIGINT)
        assert rec.proc.wait(30) == 0, rec.lines
    finally:
        rec.stop()
        standin.stop()
    assert rec.said("still writing", 5), rec.lines
    assert rec.said(f"wrote {rec.out}", 5), rec.lines
    trace = load_trace(rec.out)
    assert len(trace.requests) == calls and trace.requests[-1].prefix_len == 2000
