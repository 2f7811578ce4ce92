"""Record a live workload as a trace: a reverse proxy on loopback in front of the server.

Clients are pointed at the proxy (``http://127.0.0.1:PORT``) instead of the server; it forwards
every request unchanged, streaming bodies both ways (it keeps at most a request's first
``MAX_BODY_BYTES`` to read it; a longer one is forwarded, not recorded), and, for each generate
call (``/generate``, ``/v1/completions``, ``/v1/chat/completions``), writes down when it arrived
(``offset_ms`` from the first call), its prompt length, how much of its prompt it shares with an
earlier one, its ``max_tokens``, its ``n`` and its cache namespace (``extra_key``, else its LoRA
adapter). The result is a trace that ``radixtop replay`` and ``radixtop confirm`` take: "the same
input" can be the user's own traffic.

Prompts stay out of the trace unless ``keep_prompts`` (they may be sensitive); then each request
carries its exact ``input_ids`` or ``text`` and a replay sends exactly that (see
``radixtop.incident.replay.trace``). Without them, a replay synthesizes prompts of the same shape.

Shared prefixes. For token-id prompts, the longest common token prefix with every earlier prompt
is exact. For text prompts the proxy has no tokenizer: it takes the longest common prefix in
characters and converts it to tokens in proportion to the prompt's token count (from the server's
answer: ``meta_info.prompt_tokens`` or ``usage.prompt_tokens``; without one, about 4 characters a
token). Chat prompts are compared by their messages' text in order, and their text is never kept
(the server saw it through its chat template, which the proxy does not know), so they replay as
synthesized prompts of the same shape. A prompt that shares at least one token with an earlier
one names the earlier prompt it shares most with (``prefix_of``) and the length shared
(``prefix_len``), and joins its group: sharing that is a tree (a system prompt, then each
conversation's history) replays as the same tree.

Page size. The proxy asks the server's ``/server_info`` (which generates nothing) for its
``page_size`` and writes it as the trace's ``page_size_hint``, so a replay on a server of the same
page size shares exactly what was shared here, and one of another page size moves the prefixes
page for page.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from radixtop.incident.replay.sharing import longest_earlier_prefixes
from radixtop.incident.replay.trace import TRACE_VERSION, Trace, TraceRequest

if TYPE_CHECKING:
    import uvicorn

__all__ = ["RecordedCall", "RecordingProxy", "build_trace", "namespace_of"]

GENERATE_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
     "transfer-encoding", "upgrade", "host", "content-length"}
)
MAX_BODY_BYTES = 64 << 20
TAIL_BYTES = 64 << 10  # of a streamed answer, enough to find its usage/meta_info
CHARS_PER_TOKEN = 4
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')


@dataclass
class RecordedCall:
    offset_ms: float
    path: str
    input_ids: list[int] | None
    text: str | None
    max_tokens: int
    n: int
    prompt_tokens: int | None = None  # from the server's answer
    status: int | None = None
    chat: bool = False  # a chat call: its text is radixtop's flattening of the messages
    extra_key: str | None = None  # its cache namespace (see namespace_of)
    request_id: str | None = None  # the server's own id for it (a crash dump's rid), kept as the trace's id
    ignore_eos: bool = False  # generated its max_tokens whatever came
    stop: tuple[str, ...] = ()  # its stop strings
    in_flight: bool = False  # unfinished when the server died (a crash dump says)


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def parse_call(path: str, body: Any) -> tuple[list[int] | None, str | None, int, int] | None:
    """(input_ids, text, max_tokens, n) of one generate request, or None when it holds no single
    prompt (a batch of prompts, embeddings): those are forwarded but not recorded."""
    if not isinstance(body, dict):
        return None
    if path == "/generate":
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            params = {}
        max_tokens = _int(params.get("max_new_tokens"), 128)
        n = _int(params.get("n"), 1) or 1
        ids, text = body.get("input_ids"), body.get("text")
    elif path == "/v1/completions":
        max_tokens = _int(body.get("max_tokens"), 16)
        n = _int(body.get("n"), 1) or 1
        prompt = body.get("prompt")
        ids, text = (prompt, None) if isinstance(prompt, list) else (None, prompt)
    else:  # chat
        max_tokens = _int(body.get("max_tokens", body.get("max_completion_tokens")), 128)
        n = _int(body.get("n"), 1) or 1
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        parts = []
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
                content = "".join(c.get("text", "") for c in content if isinstance(c, dict))
            parts.append(f"<{m.get('role', '') if isinstance(m, dict) else ''}>{content or ''}")
        ids, text = None, "".join(parts)
    if isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        return list(ids), None, max_tokens, n
    if isinstance(text, str) and text:
        return None, text, max_tokens, n
    return None  # a batch, embeddings, or nothing usable


def namespace_of(body: Any) -> str | None:
    """The cache namespace a generate request asks for: SGLang's ``extra_key``, else its LoRA adapter
    (SGLang keys the radix tree by both, so requests in different namespaces share no pages)."""
    if not isinstance(body, dict):
        return None
    extra_key = body.get("extra_key")
    if isinstance(extra_key, str):
        return extra_key
    lora = body.get("lora_path", body.get("lora_id"))
    return f"lora:{lora}" if isinstance(lora, str) and lora else None


def build_trace(calls: Sequence[RecordedCall], *, name: str, keep_prompts: bool, page_size_hint: int = 1,
                source: str = "") -> Trace:
    """The recorded calls as a trace (see the module's docstring for groups and prefixes)."""
    usable = [c for c in calls if c.status is None or c.status == 200]
    if not usable:
        raise ValueError("no generate call was recorded; point a client at the proxy and send some traffic")
    t0 = min(c.offset_ms for c in usable)
    lengths = [
        len(c.input_ids) if c.input_ids is not None
        else c.prompt_tokens or max(1, len(c.text or "") // CHARS_PER_TOKEN)
        for c in usable
    ]
    parents = [-1] * len(usable)
    prefix = [0] * len(usable)
    for by_ids in (True, False):  # ids and text cannot be compared: each kind among its own
        members = [i for i, c in enumerate(usable) if (c.input_ids is not None) == by_ids]
        seqs: list[Sequence[Any]] = [usable[i].input_ids or [] if by_ids else usable[i].text or "" for i in members]
        for i, seq, (j, shared) in zip(members, seqs, longest_earlier_prefixes(seqs), strict=True):
            scale = 1.0 if by_ids else lengths[i] / max(1, len(seq))
            parent = members[j] if j >= 0 else -1
            tokens = min(lengths[i], lengths[parent], int(shared * scale)) if parent >= 0 else 0
            if tokens > 0:
                parents[i], prefix[i] = parent, tokens
    ids = _unique_ids(usable)
    groups: list[str] = []
    for i in range(len(usable)):
        groups.append(groups[parents[i]] if parents[i] >= 0 else f"g{i:04d}")
    requests = []
    for i, call in enumerate(usable):
        requests.append(
            TraceRequest(
                id=ids[i],
                offset_ms=round(call.offset_ms - t0, 3),
                prompt_len=lengths[i],
                prefix_len=prefix[i],
                group=groups[i],
                max_tokens=call.max_tokens,
                n=call.n,
                input_ids=tuple(call.input_ids) if keep_prompts and call.input_ids is not None else None,
                # A chat call's flattened messages are not what the server saw after its chat
                # template: replaying them as text would send another prompt, so they are not kept.
                text=call.text if keep_prompts and call.input_ids is None and not call.chat else None,
                extra_key=call.extra_key,
                prefix_of=ids[parents[i]] if parents[i] >= 0 else None,
                ignore_eos=call.ignore_eos,
                stop=call.stop,
                in_flight=call.in_flight,
            )
        )
    return Trace(name=name, page_size_hint=max(1, page_size_hint), requests=tuple(requests),
                 version=TRACE_VERSION, source=source, prefix_unit="tokens")


def _unique_ids(calls: Sequence[RecordedCall]) -> list[str]:
    """Each call's own id where it has one (a crash dump's rid), else qNNNN; a repeat gets a suffix."""
    seen: set[str] = set()
    out = []
    for i, call in enumerate(calls):
        base = call.request_id or f"q{i:04d}"
        rid, k = base, 1
        while rid in seen:
            rid, k = f"{base}.{k}", k + 1
        seen.add(rid)
        out.append(rid)
    return out


class _BodyTee:
    """A request body on its way upstream, chunk by chunk as it arrives (a proxy holding it whole
    needs its size in memory), keeping its first `keep` bytes for the trace: `whole` once it all
    went through within that, and `take()` gives them."""

    def __init__(self, stream: AsyncIterator[bytes], keep: int) -> None:
        self._stream = stream
        self._keep = keep
        self._kept = bytearray()
        self._over = keep <= 0
        self._done = False

    async def chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            if not self._over:
                if len(self._kept) + len(chunk) <= self._keep:
                    self._kept += chunk
                else:  # too long to record: forwarded, not kept
                    self._over = True
                    self._kept = bytearray()
            yield chunk
        self._done = True

    @property
    def whole(self) -> bool:
        return self._done and not self._over

    def take(self) -> bytes:
        data, self._kept = bytes(self._kept), bytearray()
        return data


def _server_leaving_signals(config: uvicorn.Config) -> uvicorn.Server:
    """A uvicorn server that leaves SIGINT and SIGTERM to its owner (run_record: stop, then write
    the trace): uvicorn's own capture ends the calls in flight on a second Ctrl-C and raises each
    signal again once it stops."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return Server(config)


@dataclass
class RecordingProxy:
    """``await start()`` -> the port clients use; ``await stop()``; ``trace()`` of what passed."""

    upstream: str
    keep_prompts: bool = False
    port: int = 0
    on_call: Callable[[RecordedCall], None] | None = None
    calls: list[RecordedCall] = field(default_factory=list)
    skipped: int = 0  # generate calls whose prompt could not be recorded (batches)
    page_size: int | None = None  # the server's, from its /server_info once started; None when it did not say
    _server: uvicorn.Server | None = None
    _task: asyncio.Task[None] | None = None
    _client: httpx.AsyncClient | None = None
    _t0: float | None = None

    async def start(self) -> int:
        import uvicorn
        from starlette.applications import Starlette
        from starlette.routing import Route

        from radixtop.errors import UsageError
        from radixtop.netbind import bind_socket  # one-line errors for a taken port

        self.upstream = self.upstream.rstrip("/")
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0),
                                         limits=httpx.Limits(max_connections=1024, keepalive_expiry=1.0))
        app = Starlette(
            routes=[Route("/{path:path}", self._forward, methods=["GET", "POST", "PUT", "DELETE", "PATCH"])]
        )
        try:
            sock = bind_socket("127.0.0.1", self.port)
        except UsageError as exc:
            await self._client.aclose()
            raise OSError(str(exc)) from None
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", timeout_keep_alive=5)
        self._server = _server_leaving_signals(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline and not self._task.done():
            await asyncio.sleep(0.02)
        if not self._server.started:
            await self.stop()
            raise OSError("the recording proxy did not start")
        self.page_size = await self._server_page_size()
        return self.port

    async def _server_page_size(self) -> int | None:
        assert self._client is not None
        try:
            info = (await self._client.get(f"{self.upstream}/server_info", timeout=5)).json()
        except (httpx.HTTPError, ValueError):
            return None
        size = info.get("page_size") if isinstance(info, dict) else None
        return size if type(size) is int and size >= 1 else None

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception):  # TimeoutError among them
                async with asyncio.timeout(5):
                    await self._task
        if self._client is not None:
            await self._client.aclose()

    def trace(self, name: str = "recorded") -> Trace:
        return build_trace(
            self.calls, name=name, keep_prompts=self.keep_prompts, page_size_hint=self.page_size or 1,
            source=f"radixtop record in front of {self.upstream}"
            + ("" if self.keep_prompts else " (prompts not kept: replays synthesize prompts of the same shape)"),
        )

    async def _forward(self, request: Any) -> Any:
        from starlette.responses import Response, StreamingResponse

        assert self._client is not None
        arrived = time.monotonic()
        path = request.url.path
        recording = request.method == "POST" and path in GENERATE_PATHS
        if recording and self._t0 is None:
            self._t0 = arrived
        body = _BodyTee(request.stream(), MAX_BODY_BYTES if recording else 0)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        length = request.headers.get("content-length")
        if length is not None:  # else httpx sends the stream chunked
            headers.append(("content-length", length))
        has_body = length is not None or "transfer-encoding" in request.headers
        url = f"{self.upstream}{path}" + (f"?{request.url.query}" if request.url.query else "")
        call = None
        try:
            upstream = await self._client.send(
                self._client.build_request(request.method, url, headers=headers,
                                           content=body.chunks() if has_body else None),
                stream=True,
            )
        except httpx.HTTPError as exc:
            if recording and body.whole:
                call = self._note_call(path, body.take(), arrived)
            if call is not None:
                call.status = 502
            return Response(
                f"radixtop record: upstream {self.upstream} failed: {type(exc).__name__}\n", status_code=502
            )
        if recording and (body.whole or not has_body):
            call = self._note_call(path, body.take(), arrived)
        if call is not None:
            call.status = upstream.status_code
        out_headers = {
            k: v
            for k, v in upstream.headers.items()
            if k.lower() not in HOP_BY_HOP and k.lower() != "content-encoding"
        }

        async def relay() -> AsyncIterator[bytes]:
            tail = b""
            try:
                async for chunk in upstream.aiter_bytes():
                    if call is not None:
                        tail = (tail + chunk)[-TAIL_BYTES:]
                    yield chunk
            finally:
                await upstream.aclose()
                if call is not None:
                    found = _PROMPT_TOKENS.findall(tail)
                    if found:
                        call.prompt_tokens = int(found[-1])

        return StreamingResponse(relay(), status_code=upstream.status_code, headers=out_headers)

    def _note_call(self, path: str, body: bytes, arrived: float) -> RecordedCall | None:
        try:
            decoded = json.loads(body)
        except ValueError:
            decoded = None
        parsed = parse_call(path, decoded)
        if parsed is None:
            self.skipped += 1
            return None
        ids, text, max_tokens, n = parsed
        t0 = arrived if self._t0 is None else self._t0
        call = RecordedCall((arrived - t0) * 1000.0, path, ids, text, max_tokens, n,
                            chat=path == "/v1/chat/completions", extra_key=namespace_of(decoded))
        # In order of arrival: a long body ends after a shorter one that came later.
        bisect.insort(self.calls, call, key=lambda c: c.offset_ms)
        if self.on_call is not None:
            self.on_call(call)
        return call
