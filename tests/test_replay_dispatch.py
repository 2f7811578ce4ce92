"""The replay's dispatcher process against real servers on loopback: every call written once, at or
after its due time, answered, in plan order; stop, cancel and a dying server leave nothing behind
and raise nothing; headers go out; a dead keep-alive connection costs a reconnect, not a call."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest
from hardening_helpers import start_standin
from incident_helpers import start_sim, wait_for

from radixtop.incident.replay.dispatch import Dispatcher, Plan
from radixtop.incident.replay.http1 import Answer, Call, new_connection
from radixtop.incident.replay.replay import ReplayRun, dispatch_plan, replay_once, replay_series
from radixtop.incident.replay.trace import PlannedRequest, Trace, TraceRequest, plan_requests

SIM_FLAGS = ("--max-running-requests", "256", "--max-total-tokens", "65536", "--page-size", "16")
DISPATCHER = "radixtop.incident.replay.dispatch"


def irregular_trace(calls: int, span_s: float, seed: int = 3) -> Trace:
    """Calls at seeded random offsets within span_s, a few with copies sent at the same instant."""
    rng = random.Random(seed)
    offsets = sorted(rng.uniform(0, span_s * 1000.0) for _ in range(calls))
    return Trace("irregular", 16, tuple(
        TraceRequest(f"r{i}", offset_ms=round(at, 3), prompt_len=40, prefix_len=16, group=f"g{i % 3}", max_tokens=3,
                     n=2 if i % 7 == 0 else 1)
        for i, at in enumerate(offsets)
    ))


def prompt_name(planned: PlannedRequest) -> str:
    """How the stand-in server names a prompt in its answer (tests/standin_server.py)."""
    return hashlib.sha1(json.dumps(planned.input_ids).encode()).hexdigest()[:12]


def dispatchers() -> list[psutil.Process]:
    """This process's dispatcher children still running."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if DISPATCHER in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                out.append(child)
        except psutil.NoSuchProcess:
            pass
    return out


def nothing_left(threads_before: set[threading.Thread]) -> bool:
    extra = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    return not dispatchers() and not extra


async def replay(url: str, planned: list[PlannedRequest], *, timeout: float = 30.0, **kwargs) -> ReplayRun:
    async with httpx.AsyncClient(timeout=timeout, headers=kwargs.pop("headers", None)) as client:
        return await replay_once(client, url, planned, **kwargs)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory):
    server = start_sim(tmp_path_factory.mktemp("dispatch-sim"), *SIM_FLAGS)
    yield server
    server.stop()


def test_every_call_is_written_once_at_or_after_its_due_time_and_answered_in_plan_order(sim) -> None:
    planned = plan_requests(irregular_trace(60, 0.6))
    before = sim.log.read_text().count('"POST /generate HTTP/1.1"')
    run = asyncio.run(replay(sim.url, planned))
    assert [(o.request_id, o.copy) for o in run.outcomes] == [(p.request_id, p.copy) for p in planned]
    assert run.errors == 0, [o.error for o in run.outcomes if o.error]
    assert all(o.text and o.output_ids for o in run.outcomes)
    assert run.started_at > 0
    for item, outcome in zip(planned, run.outcomes, strict=True):
        assert outcome.lateness_ms >= 0
        # sent_at and started_at come from one clock: written at or after the due time, never before
        assert outcome.sent_at >= run.started_at + item.offset_s - 1e-6, item
        assert outcome.answered_at >= outcome.sent_at
    sent = [o.sent_at for o in run.outcomes]
    assert sent == sorted(sent)  # written in plan order
    # the server saw each call once (its access lines are written as it answers)
    assert wait_for(lambda: sim.log.read_text().count('"POST /generate HTTP/1.1"') - before >= len(planned), 10)
    assert sim.log.read_text().count('"POST /generate HTTP/1.1"') - before == len(planned)


def test_the_same_prompts_give_the_same_answers_as_before(sim) -> None:
    """The dispatcher sends what httpx sent: input_ids at temperature 0, one answer per copy."""
    planned = plan_requests(irregular_trace(8, 0.05))
    run = asyncio.run(replay(sim.url, planned))

    async def by_httpx() -> list[str]:
        from radixtop.incident.replay.replay import generate_payload

        async with httpx.AsyncClient(timeout=30) as client:
            return [
                (await client.post(f"{sim.url}/generate", json=generate_payload(p, 0.0))).json()["text"]
                for p in planned
            ]

    assert [o.text for o in run.outcomes] == asyncio.run(by_httpx())


def test_should_stop_mid_run_stops_dispatching_and_leaves_no_dispatcher(sim) -> None:
    planned = plan_requests(irregular_trace(200, 4.0))
    threads = set(threading.enumerate())
    asked: list[float] = []

    def should_stop() -> bool:
        asked.append(time.monotonic())
        return asked[-1] - asked[0] > 0.5

    run = asyncio.run(replay(sim.url, planned, should_stop=should_stop))
    assert len(run.outcomes) < len(planned)  # the calls due after the stop were never written
    assert run.errors == 0  # those in flight were still answered
    assert [(o.request_id, o.copy) for o in run.outcomes] == [
        (p.request_id, p.copy) for p in planned[: len(run.outcomes)]
    ]
    assert wait_for(lambda: nothing_left(threads), 10), (dispatchers(), threading.enumerate())


def test_a_cancelled_replay_kills_its_dispatcher(sim) -> None:
    """The confirmation run abandons a replay by cancelling its task (ConfirmationRun._guard)."""
    planned = plan_requests(irregular_trace(200, 4.0))
    threads = set(threading.enumerate())

    async def go() -> None:
        task = asyncio.ensure_future(replay(sim.url, planned))
        deadline = time.monotonic() + 20
        while not dispatchers() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert dispatchers(), "no dispatcher started"
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert wait_for(lambda: nothing_left(threads), 10), (dispatchers(), threading.enumerate())


def test_a_server_that_dies_mid_run_gives_failed_outcomes_within_the_deadline(tmp_path: Path) -> None:
    server = start_sim(tmp_path / "dying", *SIM_FLAGS)
    planned = plan_requests(irregular_trace(150, 3.0))
    threads = set(threading.enumerate())

    async def go() -> ReplayRun:
        async def kill_soon() -> None:
            await asyncio.sleep(0.5)
            server.proc.kill()

        killer = asyncio.ensure_future(kill_soon())
        try:
            return await replay(server.url, planned, timeout=5.0)
        finally:
            await killer

    try:
        began = time.monotonic()
        run = asyncio.run(go())
        took = time.monotonic() - began
    finally:
        server.stop()
    assert len(run.outcomes) == len(planned)  # every call is accounted for, none raised
    assert run.errors > 0
    failed = [o for o in run.outcomes if o.error]
    assert all(o.text is None for o in failed)
    assert failed[-1].error.startswith(("ConnectionRefusedError", "OSError"))  # the server is gone
    assert took < 3.0 + 5.0 + 20.0  # the trace, one call's deadline, and start-up: no hang
    assert wait_for(lambda: nothing_left(threads), 10)


def test_headers_reach_the_server_and_the_answer_is_not_compressed(tmp_path: Path) -> None:
    record = tmp_path / "seen.jsonl"
    server = start_standin(tmp_path / "srv", "--mode", "generate", "--record", str(record))
    planned = plan_requests(irregular_trace(6, 0.05))
    try:
        series = asyncio.run(
            replay_series(server.url, planned, 1, flush=False, headers={"Authorization": "Bearer s3cret"})
        )
    finally:
        server.stop()
    assert series.runs[0].errors == 0
    seen = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(seen) == len(planned)
    for request in seen:
        headers = {k.lower(): v for k, v in request["headers"].items()}
        assert headers["authorization"] == "Bearer s3cret"
        assert headers["content-type"] == "application/json" and "accept-encoding" not in headers
        assert headers["host"] == server.url.split("//")[1]


def test_a_keep_alive_connection_the_server_closed_is_reopened_and_the_call_answered(tmp_path: Path) -> None:
    record = tmp_path / "seen.jsonl"
    server = start_standin(tmp_path / "srv", "--mode", "generate", "--record", str(record), "--drop", "1")
    planned = plan_requests(irregular_trace(5, 0.05))
    try:
        run = asyncio.run(replay(server.url, planned))
    finally:
        server.stop()
    assert run.errors == 0, [o.error for o in run.outcomes]
    seen = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(seen) == len(planned) + 1 and seen[0]["dropped"] and not any(s["dropped"] for s in seen[1:])
    again = [s for s in seen[1:] if s["prompt"] == seen[0]["prompt"]]
    assert len(again) == 1 and again[0]["port"] != seen[0]["port"]  # the same call, on a new connection
    # each outcome's text names its own prompt: no answer went to another call
    assert [o.text for o in run.outcomes] == [f"answer to {prompt_name(p)}" for p in planned]
    assert all(o.lateness_ms >= 0 for o in run.outcomes)


def test_connections_the_server_closes_after_each_answer_cost_no_call(tmp_path: Path) -> None:
    record = tmp_path / "seen.jsonl"
    server = start_standin(tmp_path / "srv", "--mode", "generate", "--record", str(record), "--close-after-answer")
    planned = plan_requests(irregular_trace(30, 0.3))
    try:
        run = asyncio.run(replay(server.url, planned))
    finally:
        server.stop()
    assert run.errors == 0, [o.error for o in run.outcomes if o.error]
    assert [o.text for o in run.outcomes] == [f"answer to {prompt_name(p)}" for p in planned]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for a certificate")
def test_an_https_server_is_replayed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the dispatcher trusts it as a system certificate
    server = start_standin(tmp_path / "srv", "--mode", "generate", "--tls", str(cert), str(key))
    planned = plan_requests(irregular_trace(6, 0.1))
    try:
        run = asyncio.run(replay(server.url.replace("http://", "https://"), planned))
    finally:
        server.stop()
    assert run.errors == 0, [o.error for o in run.outcomes if o.error]
    assert [o.text for o in run.outcomes] == [f"answer to {prompt_name(p)}" for p in planned]


def test_a_header_that_would_inject_lines_fails_the_calls_not_the_caller(sim) -> None:
    planned = plan_requests(irregular_trace(3, 0.01))
    run = asyncio.run(replay(sim.url, planned, headers={"X-Note": "a\r\nX-Evil: 1"}))
    assert len(run.outcomes) == len(planned)
    assert all("line break" in (o.error or "") for o in run.outcomes)


# -- the seam: lateness is measured after the write ------------------------------------------------


def test_lateness_is_stamped_after_the_bytes_are_written(sim) -> None:
    """A write that takes 50 ms (a full socket buffer) shows in the call's lateness: it is measured
    when the bytes are out, not when the call was scheduled."""
    planned = plan_requests(irregular_trace(4, 0.05))

    async def plan_doc() -> dict:
        async with httpx.AsyncClient(timeout=30) as client:
            return dispatch_plan(client, sim.url, planned, 0.0)

    slow_first: list[int] = []

    def send(sock, data) -> int:
        if not slow_first:
            slow_first.append(1)
            time.sleep(0.05)
        return sock.send(data)

    results: list[dict] = []
    Dispatcher(Plan.from_json(asyncio.run(plan_doc())), results.append, send=send).run()
    calls = {r["i"]: r for r in results if "i" in r}
    assert sorted(calls) == list(range(len(planned))) and all("error" not in r for r in calls.values())
    assert calls[0]["late_ms"] >= 50.0
    assert all(r["late_ms"] >= 0 for r in calls.values())


# -- the client-side cap (max_in_flight) -----------------------------------------------------------


def burst_trace(calls: int) -> Trace:
    """Calls all due at once."""
    return Trace("burst", 16, tuple(TraceRequest(f"b{i}", 0.0, 40, 16, "g", 3) for i in range(calls)))


def held_server(tmp_path: Path, hold_s: float):
    """The stand-in server answering each generate call after hold_s, recording each arrival."""
    record = tmp_path / "seen.jsonl"
    return start_standin(tmp_path / "srv", "--mode", "generate", "--record", str(record), "--answer-after",
                         str(hold_s)), record


def test_at_most_k_calls_are_in_flight_and_a_held_call_goes_when_one_is_answered(tmp_path: Path) -> None:
    server, record = held_server(tmp_path, 0.3)
    planned = plan_requests(burst_trace(6))
    try:
        run = asyncio.run(replay(server.url, planned, max_in_flight=2))
    finally:
        server.stop()
    assert run.errors == 0, [o.error for o in run.outcomes if o.error]
    assert [o.text for o in run.outcomes] == [f"answer to {prompt_name(p)}" for p in planned]
    seen = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(seen) == 6 and max(s["in_flight"] for s in seen) == 2, seen  # the server never served more than 2
    # By answer timing too: the k-th call written (k >= 2) went after the (k-1)-th answer of the run.
    sent = sorted(o.sent_at for o in run.outcomes)
    answered = sorted(o.answered_at for o in run.outcomes)
    for k in range(2, 6):
        assert sent[k] >= answered[k - 2], (k, sent, answered)
    held = [o.held_ms for o in run.outcomes]
    assert held[:2] == [0.0, 0.0] and all(h > 0 for h in held[2:]), held
    assert 250 < held[2] < 1000 and 550 < held[4] < 2000, held  # one answer's wait, then two
    # The wait is the cap's, not the dispatcher's: lateness counts only the write after the answer.
    assert all(o.lateness_ms < 100 for o in run.outcomes), [o.lateness_ms for o in run.outcomes]
    for o in run.outcomes:  # held and late together: how long after its due time the call was written
        assert o.sent_at - run.started_at == pytest.approx((o.held_ms + o.lateness_ms) / 1000.0, abs=0.005)


def test_without_a_cap_every_due_call_goes_at_once(tmp_path: Path) -> None:
    server, record = held_server(tmp_path, 0.3)
    planned = plan_requests(burst_trace(6))
    try:
        run = asyncio.run(replay(server.url, planned, max_in_flight=None))
    finally:
        server.stop()
    assert run.errors == 0, [o.error for o in run.outcomes if o.error]
    seen = [json.loads(line) for line in record.read_text().splitlines()]
    assert max(s["in_flight"] for s in seen) == 6, seen  # the measure above would see more than 2
    assert all(o.held_ms == 0.0 for o in run.outcomes)
    assert max(o.sent_at for o in run.outcomes) < min(o.answered_at for o in run.outcomes)


def test_a_capped_dispatcher_waits_for_answers_without_spinning(tmp_path: Path) -> None:
    server, _ = held_server(tmp_path, 0.4)
    planned = plan_requests(burst_trace(6))

    async def plan_doc() -> dict:
        async with httpx.AsyncClient(timeout=30) as client:
            return dispatch_plan(client, server.url, planned, 0.0, max_in_flight=2)

    doc = asyncio.run(plan_doc())
    assert doc["max_in_flight"] == 2
    results: list[dict] = []
    try:
        wall, cpu = time.monotonic(), time.process_time()
        Dispatcher(Plan.from_json(doc), results.append).run()
        wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    finally:
        server.stop()
    calls = {r["i"]: r for r in results if "i" in r}
    assert sorted(calls) == list(range(6)) and all(r["status"] == 200 for r in calls.values())
    assert wall >= 3 * 0.4  # three waves of two
    assert cpu < 0.25 * wall, (cpu, wall)  # waiting on the selector, not spinning


def test_a_namespace_per_request_is_one_extra_key_per_call_and_run_keeping_the_requests_own(tmp_path: Path) -> None:
    server, record = held_server(tmp_path, 0.0)
    trace = Trace("keys", 16, (TraceRequest("a", 0.0, 40, 16, "g", 3, n=2), TraceRequest("b", 5.0, 40, 16, "g", 3),
                               TraceRequest("c", 10.0, 40, 16, "g", 3, extra_key="tenant-1")))
    planned = plan_requests(trace)
    try:
        series = asyncio.run(replay_series(server.url, planned, 2, flush=False, namespace_per_request=True))
        plain = asyncio.run(replay_series(server.url, planned, 1, flush=False))
    finally:
        server.stop()
    assert series.namespace_per_request and not plain.namespace_per_request
    assert all(run.errors == 0 for run in (*series.runs, *plain.runs))
    keys = [json.loads(line)["extra_key"] for line in record.read_text().splitlines()]
    spread, sent_plain = keys[:8], keys[8:]
    assert len(set(spread)) == 8, spread  # every call of every run its own namespace
    assert sent_plain == [None, None, None, "tenant-1"]  # without the setting: the trace's own keys
    assert sum(k.startswith("tenant-1-radixtop-") for k in spread) == 2, spread  # c's own key in front
    assert all(k.startswith(("radixtop-", "tenant-1-radixtop-")) for k in spread)
    assert {k.rsplit("-", 2)[1] for k in spread} == {"a", "b", "c"}  # ...-{request id}-{copy}


def test_a_plans_cap_is_a_whole_number_and_zero_or_none_is_no_cap() -> None:
    base = {"host": "127.0.0.1", "port": 9, "tls": False, "authority": "127.0.0.1:9", "path": "/generate",
            "headers": [], "deadline_s": 1, "connect_timeout_s": 1, "calls": [{"offset_s": 0, "body": "{}"}]}
    assert Plan.from_json(base).max_in_flight is None
    assert Plan.from_json({**base, "max_in_flight": 0}).max_in_flight is None
    assert Plan.from_json({**base, "max_in_flight": None}).max_in_flight is None
    assert Plan.from_json({**base, "max_in_flight": 3}).max_in_flight == 3
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(ValueError, match="max_in_flight"):
            Plan.from_json({**base, "max_in_flight": bad})


# -- the wire format ---------------------------------------------------------------------------------


def feed_all(*parts: bytes) -> Answer:
    conn = new_connection()
    Call("127.0.0.1:9", "/generate", [], b"{}").bytes_on(conn)  # a call went out: its answer is awaited
    answer = Answer(conn)
    for part in parts:
        answer.feed(part)
    return answer


def test_answers_are_read_by_length_by_chunks_and_to_the_close() -> None:
    a = feed_all(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel", b"lo")
    assert a.done and a.status == 200 and a.body == b"hello" and a.keep_alive
    c = feed_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", b"2;x=y\r\nde\r\n0\r\n\r\n")
    assert c.done and c.body == b"abcde" and c.keep_alive
    partial = feed_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
    assert not partial.done
    e = feed_all(b"HTTP/1.0 200 OK\r\n\r\nuntil the end", b"")
    assert e.done and e.body == b"until the end" and not e.keep_alive
    closing = feed_all(b"HTTP/1.1 503 Busy\r\nConnection: close\r\nContent-Length: 2\r\n\r\nno")
    assert closing.done and closing.status == 503 and not closing.keep_alive
    extra = feed_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokGARBAGE")
    assert extra.done and extra.body == b"ok" and not extra.keep_alive  # never reused for another call


def test_malformed_or_cut_answers_are_errors() -> None:
    for parts in ((b"SSH-2.0-nope\r\n\r\n",), (b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort", b""),
                  (b"HTTP/1.1 200 OK\r\n", b""), (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",)):
        with pytest.raises(ValueError):
            feed_all(*parts)
    assert not Answer(new_connection()).started


def test_a_request_is_one_post_with_its_length_and_refuses_line_breaks() -> None:
    raw = Call("127.0.0.1:9", "/generate", [("Authorization", "Bearer k")], b'{"a": 1}').bytes_on(new_connection())
    head, body = raw.split(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"POST /generate HTTP/1.1" and b"content-length: 8" in head.lower()
    assert b"authorization: bearer k" in head.lower() and body == b'{"a": 1}'
    for bad in (("X", "a\r\nb"), ("X:Y", "v"), ("", "v")):
        with pytest.raises(ValueError):
            Call("h", "/", [bad], b"")
