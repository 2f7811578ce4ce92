"""The fleet probe against answers no Prometheus should give: a real HTTP server on loopback that
answers every query with what the test sets (a body past the cap, with or without its length,
NaN and text for values, labels holding escape sequences, JSON that is not JSON or not
Prometheus's, an error page, no answer at all). Each is one line or typed values, never a raise,
a hang or a control character on the terminal."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from radixtop.fleet import describe
from radixtop.probes.fleet_probe import FleetProbe
from radixtop.probes.http import make_client
from radixtop.probes.prometheus import MAX_ANSWER_BYTES, MAX_LABEL_CHARS, instant_query
from radixtop.session.fleet import FleetState

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    length: bool = True  # send Content-Length (else the body ends when the connection closes)
    stream: Callable[[Callable[[bytes], None]], None] | None = None  # writes the body itself
    hold: threading.Event = field(default_factory=threading.Event)  # a stalled answer waits on it
    stall: bool = False
    claimed_length: int | None = None  # a Content-Length other than the body's


class Junk:
    """A loopback HTTP server answering every request with `answer`."""

    def __init__(self) -> None:
        self.answer = Answer()
        self.paths: list[str] = []
        junk = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                junk.paths.append(self.path)
                a = junk.answer
                if a.stall:
                    a.hold.wait(30)  # bounded; the test sets it when it is done
                    return
                try:
                    self.send_response(a.status)
                    self.send_header("Content-Type", a.content_type)
                    if a.length:
                        length = a.claimed_length if a.claimed_length is not None else len(a.body)
                        self.send_header("Content-Length", str(length))
                    self.end_headers()
                    if a.stream is not None:
                        a.stream(self.wfile.write)
                    else:
                        self.wfile.write(a.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client stopped reading: what a cap does

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def set(self, **kw: object) -> None:
        self.answer = Answer(**kw)  # type: ignore[arg-type]

    def close(self) -> None:
        self.answer.hold.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def junk() -> Iterator[Junk]:
    server = Junk()
    try:
        yield server
    finally:
        server.close()


def vector(series: list[object]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": series}}).encode()


async def ask(url: str, query: str = "up", timeout_s: float = 5.0):
    client = make_client(timeout_s)
    try:
        return await instant_query(client, url, query, timeout_s=timeout_s)
    finally:
        await client.aclose()


async def poll(url: str, timeout_s: float = 5.0):
    probe = FleetProbe(url, timeout_s=timeout_s)
    try:
        return await probe.poll()
    finally:
        await probe.aclose()


def one_line(text: str | None) -> str:
    assert text is not None and "\n" not in text and len(text) < 400, text
    return text


async def test_the_query_reaches_the_api_with_its_deadline(junk: Junk) -> None:
    junk.set(body=vector([]))
    answer = await ask(junk.url, "up", timeout_s=4)
    assert answer.ok and answer.series == ()
    assert junk.paths[0].startswith("/api/v1/query?") and "query=up" in junk.paths[0] and "timeout=4s" in junk.paths[0]


async def test_an_answer_past_the_cap_is_abandoned_while_reading(junk: Junk) -> None:
    def huge(write: Callable[[bytes], None]) -> None:
        chunk = b" " * (1 << 20)
        for _ in range(MAX_ANSWER_BYTES // len(chunk) + 2):  # bounded: just past the cap
            write(chunk)

    junk.set(stream=huge, length=False)  # no Content-Length: the body ends when the connection closes
    answer = await ask(junk.url)
    assert "larger than the 16 MiB radixtop accepts; stopped reading it" in one_line(answer.error)


async def test_a_content_length_past_the_cap_is_refused_before_reading(junk: Junk) -> None:
    junk.set(body=b"{}", claimed_length=MAX_ANSWER_BYTES + 10)  # two bytes sent, the rest never waited for
    answer = await ask(junk.url, timeout_s=3)
    assert "larger than the 16 MiB radixtop accepts; refused it" in one_line(answer.error)


@pytest.mark.parametrize(("answer", "says"), [
    (Answer(body=b"<html>hello</html>"), "not Prometheus's JSON"),
    (Answer(status=404, body=b"404 page not found", content_type="text/plain"), "no Prometheus API there"),
    (Answer(status=503, body=b"<html><h1>Service Unavailable</h1></html>", content_type="text/html"), "HTTP 503"),
    (Answer(status=400, body=json.dumps({"status": "error", "errorType": "bad_data",
                                         "error": "parse error\x1b[31m at char 3"}).encode()),
     "refused the query (HTTP 400: parse error\ufffd[31m at char 3)"),
    (Answer(status=401, body=b"Unauthorized", content_type="text/plain"), "it wants credentials"),
    (Answer(body=b"[1, 2]"), "not an object"),
    (Answer(body=b'{"status": "success", "data": {"resultType": "matrix", "result": []}}'), "not an instant vector"),
    (Answer(body=b'{"status": "success", "data": []}'), "not an instant vector"),
    (Answer(body=b"[" * 200_000 + b"]" * 200_000), "nested too deeply"),
    (Answer(body=b"\xff\xfe garbage"), "not Prometheus's JSON"),
])
async def test_an_answer_that_is_not_prometheuss_is_one_line(junk: Junk, answer: Answer, says: str) -> None:
    junk.answer = answer
    got = await ask(junk.url)
    assert not got.ok and got.series == ()
    assert says in one_line(got.error)
    sample = await poll(junk.url)
    assert sample.status.state == "down" and says in one_line(sample.status.message)


async def test_values_that_are_no_numbers_are_unknown_and_malformed_series_are_skipped(junk: Junk) -> None:
    values = ["NaN", "+Inf", "-Inf", "abc", "1e999", True, {"a": 1}, None, 10 ** 400, "7", 3.5, "x" * 100]
    series: list[object] = [{"metric": {"__name__": "radixtop_capacity_tokens", "job": "j", "instance": f"h:{i}",
                                        "rank": "0"}, "value": [1, v]} for i, v in enumerate(values)]
    series += ["not a series", {"metric": [], "value": [1, "1"]}, {"metric": {}, "value": [1]}, 5]
    junk.set(body=vector(series))
    got = await ask(junk.url)
    assert got.ok and got.note == "4 malformed series skipped"
    assert [s.value for s in got.series] == [None] * 9 + [7.0, 3.5, None]


async def test_hostile_labels_are_bounded_and_never_reach_the_terminal_raw(junk: Junk) -> None:
    evil = "\x1b]52;c;ZXZpbA==\x07\x1b[2J\u202enode\nx"
    metric = {"__name__": "radixtop_negative_lock_ref_total", "job": "j", "instance": "10.0.0.1:1",
              "node": evil, "rank": "1\x1b[31m", "big": "v" * 100_000, "n": 5, **{f"l{i}": "x" for i in range(500)}}
    junk.set(body=vector([{"metric": metric, "value": [1, "2"]}]))
    got = await ask(junk.url)
    labels = got.series[0].labels
    assert len(labels.pairs) == 64 and all(len(v) <= MAX_LABEL_CHARS for _, v in labels.pairs)
    assert labels.get("n") == ""  # not text: dropped
    sample = await poll(junk.url)
    assert sample.status.ok
    state = FleetState(junk.url)
    state.apply(sample)
    (standout,) = state.view.standouts
    assert standout.rank.node == evil  # kept as given: made safe where it is shown
    text = "\n".join(describe(state.view))
    assert not any(ch in text for ch in ("\x1b", "\x07", "\u202e", "\r")), repr(text)
    assert "2 unlocks left lock_ref below zero" in text
    # The command is pasted into a shell: quoted, and printable.
    assert standout.command == "radixtop --node '\ufffd]52;c;ZXZpbA==\ufffd\ufffd[2J\ufffdnode\ufffdx'"


async def test_prometheus_that_never_answers_is_cut_off_at_the_deadline(junk: Junk) -> None:
    import time

    junk.set(stall=True)
    started = time.monotonic()
    sample = await poll(junk.url, timeout_s=1.0)
    assert time.monotonic() - started < 5
    assert sample.status.state == "down" and "within 1 s" in one_line(sample.status.message)


def test_the_command_prints_hostile_labels_safely(junk: Junk) -> None:
    metric = {"__name__": "radixtop_unlock_failures_total", "job": "j", "instance": "h:1", "node": "a\x1b[31mb",
              "rank": "0"}
    junk.set(body=vector([{"metric": metric, "value": [1, "NaN"]}, {"metric": {**metric, "rank": "1"},
                                                                  "value": [1, "4"]}]))
    done = subprocess.run([sys.executable, "-m", "radixtop", "fleet", "--prometheus", junk.url, "--timeout", "5"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "a\ufffd[31mb" in done.stdout
    assert "4 unlock calls raised" in done.stdout and "radixtop --node 'a\ufffd[31mb'" in done.stdout
