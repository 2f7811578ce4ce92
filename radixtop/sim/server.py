"""SGLang's HTTP API over the simulator's Engine, as a Starlette app.

Shapes follow sglang 0.5.23's `entrypoints/http_server.py` and its OpenAI layer:
- native routes (`/generate`, ...) answer bad input with SGLang's `{"error": {"message": ...}}`
  (we add `type`, `param` and `code` beside `message`, so one parser reads both);
- OpenAI routes (`/v1/...`) answer with SGLang's flat `ErrorResponse`
  (`{"object": "error", "message", "type": "BadRequestError", "param", "code": 400}`);
- a dead engine answers 503 everywhere a request needs it, never a hang.
Nothing here blocks the event loop: the engine is async and every handler awaits it.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from radixtop.sim.engine import EngineDead
from radixtop.sim.request_log import GenerateReqInput, RequestLog

# SGLang's defaults where a request leaves a field out.
GENERATE_DEFAULT_MAX_NEW_TOKENS = 128  # SamplingParams.max_new_tokens
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # CompletionRequest.max_tokens
DEFAULT_TEMPERATURE = 1.0
HEALTH_CHECK_TIMEOUT_S = 20.0  # SGLANG_HEALTH_CHECK_TIMEOUT

# Bounds that keep one request from tying the simulator up; SGLang has none, but a sim that
# hangs on `n: 10**9` helps nobody.
MAX_N = 128
MAX_BATCH = 4096
MAX_BODY_BYTES = 16 * 1024 * 1024  # far above any prompt the pool can hold; keeps memory bounded

FLUSH_OK_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)
FLUSH_FAILED_TEXT = "Flush cache failed.\n"


class BadRequest(Exception):
    """Input the server refuses: 400 (or `status`) with this message."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param = param
        self.status = status


@dataclass
class SimState:
    """Everything the routes read; built by radixtop.sim.cli."""

    engine: Any  # radixtop.sim.engine.Engine
    server_args: dict[str, Any]  # SGLang field names -> values, as /server_info reports them
    launch_command: str  # the argv as launched, joined by spaces (SGLang's own form)
    served_model_name: str
    context_len: int
    version: str
    metrics: Any = None  # radixtop.sim.metrics.SimMetrics when --enable-metrics
    instrument_urls: list[str] = field(default_factory=list)
    enable_cache_report: bool = False
    log_error: Callable[[str], None] = lambda message: None
    log_info: Callable[[str], None] = lambda message: None
    # What a crash dump holds: the requests in flight, and with a crash dump folder set those
    # finished in the last 300 s (radixtop.sim.request_log).
    request_log: RequestLog = field(default_factory=RequestLog)
    startup_time: float = field(default_factory=time.time)
    ready: bool = False

    @property
    def alive(self) -> bool:
        return self.engine.dead_reason is None


# ----------------------------------------------------------------------------------------------
# Request parsing (shared by /generate and /v1/completions)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int
    temperature: float
    n: int


@dataclass(frozen=True)
class Prompt:
    input_ids: list[int]
    rid: str | None
    sampling: Sampling
    extra_key: str | None = None  # SGLang's cache namespace (a request's cache salt)
    text: str | None = None  # the prompt as sent, when it was text (input_ids are then its tokens)
    params: dict[str, Any] = field(default_factory=dict)  # its sampling_params as SGLang holds them


async def _body(request: Request) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BadRequest(
                f"The request body is larger than {MAX_BODY_BYTES} bytes; send a smaller prompt.", status=413
            )
        chunks.append(chunk)
    return b"".join(chunks)


async def _json_object(request: Request) -> dict[str, Any]:
    body = await _body(request)
    if not body:
        raise BadRequest("The request body is empty; send a JSON object.")
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"The request body is not valid JSON: {exc}") from None
    except RecursionError:  # the parser's own bound on nesting: a client error, as SGLang answers it
        raise BadRequest("The request body is nested too deeply; send a flat JSON object.") from None
    if not isinstance(payload, dict):
        raise BadRequest(f"The request body must be a JSON object, got {type(payload).__name__}.")
    return payload


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_field(obj: dict[str, Any], name: str, default: int, *, minimum: int) -> int:
    value = obj.get(name, default)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not _is_int(value):
        raise BadRequest(f"{name} must be an integer, got {value!r}.", name)
    if value < minimum:
        raise BadRequest(f"{name} must be at least {minimum}, got {value}.", name)
    return value


def _temperature(obj: dict[str, Any]) -> float:
    value = obj.get("temperature", DEFAULT_TEMPERATURE)
    if value is None:
        return DEFAULT_TEMPERATURE
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"temperature must be a number, got {value!r}.", "temperature")
    if not math.isfinite(value) or value < 0:
        # SamplingParams.verify's wording.
        raise BadRequest(f"temperature must be a non-negative finite number, got {value}.", "temperature")
    return float(value)


def _sampling(obj: Any, *, max_tokens_key: str, default_max: int, where: str) -> Sampling:
    """The fields the simulator uses; SGLang's others (top_p, stop, ...) are accepted and ignored."""
    if obj is None:
        obj = {}
    if not isinstance(obj, dict):
        raise BadRequest(f"{where} must be a JSON object, got {type(obj).__name__}.", where)
    max_new = _int_field(obj, max_tokens_key, default_max, minimum=0)
    n = _int_field(obj, "n", 1, minimum=1)
    if n > MAX_N:
        raise BadRequest(f"n must be at most {MAX_N} in the simulator, got {n}.", "n")
    return Sampling(max_new_tokens=max_new, temperature=_temperature(obj), n=n)


def _per_prompt(params: Any, count: int, **kwargs: Any) -> list[Sampling]:
    """One Sampling per prompt: SGLang takes one sampling_params object for all, or a list of one
    per prompt (with the same n in each)."""
    if not isinstance(params, list):
        return [_sampling(params, **kwargs)] * count
    if len(params) != count:
        raise BadRequest(
            f"sampling_params is a list of {len(params)}; give one per prompt ({count}) or one object.",
            "sampling_params",
        )
    samplings = [_sampling(p, **kwargs) for p in params]
    if len({s.n for s in samplings}) > 1:
        raise BadRequest(
            "The parallel_sample_num should be the same for all samples in sample params.", "sampling_params"
        )
    return samplings


def _openai_sampling_params(body: dict[str, Any], sampling: Sampling) -> dict[str, Any]:
    """The sampling_params SGLang's OpenAI layer hands its tokenizer manager for a completion:
    OpenAI's names mapped to SGLang's (max_tokens is max_new_tokens), SGLang's defaults filled in."""
    return {
        "temperature": sampling.temperature,
        "max_new_tokens": sampling.max_new_tokens,
        "stop": body.get("stop"),
        "n": sampling.n,
        "ignore_eos": body.get("ignore_eos") is True,
    }


def _token_list(value: Any, param: str) -> list[int]:
    if not isinstance(value, list) or not all(_is_int(t) for t in value):
        raise BadRequest(f"{param} must be a list of integer token ids.", param)
    if not value:
        raise BadRequest("input_ids cannot be empty.", param)  # io_struct's wording
    return value  # the engine checks each id against its vocabulary


def _prompts(
    tokenize: Callable[[str], list[int]],
    text: Any,
    input_ids: Any,
    rid: Any,
    params: Any,
    *,
    text_key: str,
    **sampling: Any,
) -> tuple[list[Prompt], bool]:
    """The prompts (token lists with their sampling) and whether the request was a single one."""
    if (text is None) == (input_ids is None):
        raise BadRequest("Either text, input_ids or input_embeds should be provided.")
    if text is not None:
        single = isinstance(text, str)
        texts = [text] if single else text
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise BadRequest(f"{text_key} must be a string or a non-empty list of strings.", text_key)
        token_lists = [tokenize(t) for t in texts]
        if any(not ids for ids in token_lists):
            raise BadRequest(f"{text_key} must not be empty.", text_key)
    else:
        if not isinstance(input_ids, list) or not input_ids:
            raise BadRequest("input_ids cannot be empty.", "input_ids")
        single = not isinstance(input_ids[0], list)
        token_lists = (
            [_token_list(input_ids, "input_ids")]
            if single
            else [_token_list(ids, "input_ids") for ids in input_ids]
        )
    if len(token_lists) > MAX_BATCH:
        raise BadRequest(f"A batch holds at most {MAX_BATCH} prompts in the simulator.")
    rids = _rids(rid, len(token_lists), single)
    samplings = _per_prompt(params, len(token_lists), **sampling)
    as_sent = params if isinstance(params, list) else [params] * len(token_lists)
    prompt_texts = texts if text is not None else [None] * len(token_lists)
    return [
        Prompt(ids, r, s, text=t, params=dict(p or {}))
        for ids, r, s, t, p in zip(token_lists, rids, samplings, prompt_texts, as_sent, strict=True)
    ], single


def _rids(rid: Any, count: int, single: bool) -> list[str | None]:
    if rid is None:
        return [None] * count
    if single and isinstance(rid, str):
        return [rid]
    if isinstance(rid, list) and len(rid) == count and all(isinstance(r, str) for r in rid):
        return list(rid)
    raise BadRequest("rid must be a string for a single request, or a list of one string per prompt.", "rid")


def _check_lengths(prompts: Sequence[Prompt], context_len: int) -> None:
    # TokenizerManager._validate_one_request's checks and wording.
    for prompt in prompts:
        sampling = prompt.sampling
        n_in = len(prompt.input_ids)
        if n_in >= context_len:
            raise BadRequest(
                f"The input ({n_in} tokens) is longer than the model's context length ({context_len} tokens)."
            )
        total = n_in + sampling.max_new_tokens
        if total > context_len:
            raise BadRequest(
                "Requested token count exceeds the model's maximum context length "
                f"of {context_len} tokens. You requested a total of {total} tokens: {n_in} "
                f"tokens from the input messages and {sampling.max_new_tokens} tokens for the "
                "completion. Please reduce the number of tokens in the input messages or the "
                "completion to fit within the limit."
            )


# ----------------------------------------------------------------------------------------------
# Running requests on the engine
# ----------------------------------------------------------------------------------------------


def _finish_reason(result: Any) -> dict[str, Any] | None:
    """SGLang's meta_info finish_reason: {"type": "length", "length": n} or {"type": "stop", ...}."""
    reason = result.finish_reason
    if reason is None or isinstance(reason, dict):
        return reason
    if reason == "length":
        return {"type": "length", "length": result.completion_tokens}
    if reason == "stop":
        return {"type": "stop", "matched": result.output_ids[-1] if result.output_ids else None}
    return {"type": str(reason)}


def _rid(prompt: Prompt, sample: int) -> str:
    if prompt.rid is None:
        return uuid.uuid4().hex
    return prompt.rid if prompt.sampling.n == 1 else f"{prompt.rid}-{sample}"


def _request_input(prompt: Prompt, rid: str, stream: bool) -> GenerateReqInput:
    """The request as SGLang's tokenizer manager holds it (and a crash dump keeps it)."""
    return GenerateReqInput(
        text=prompt.text, input_ids=prompt.input_ids if prompt.text is None else None,
        sampling_params=prompt.params, stream=stream, rid=rid, extra_key=prompt.extra_key,
    )


async def _run_all(state: SimState, prompts: Sequence[Prompt], *, stream: bool = False) -> list[tuple[str, Any, float]]:
    """Generate n samples per prompt; results grouped per prompt (SGLang's order: i * n + j), each
    with its own latency.

    With n > 1 SGLang first runs each prompt once with max_new_tokens=0 to cache its prefix; the
    simulator does the same, so the samples meet the cache the way they would in SGLang.

    Each sample is in the request log from now until it is answered; one that fails while the
    engine lives is dropped from it, one the engine's death failed stays there: it was in flight
    at the crash.
    """
    engine = state.engine
    log = state.request_log
    samples = [(prompt, _rid(prompt, j)) for prompt in prompts for j in range(prompt.sampling.n)]
    keys = [log.start(_request_input(prompt, rid, stream)) for prompt, rid in samples]

    async def one(prompt: Prompt, rid: str, key: int) -> tuple[str, Any, float]:
        sampling = prompt.sampling
        started = time.perf_counter()
        result = await engine.generate(prompt.input_ids, max_new_tokens=sampling.max_new_tokens,
                                       temperature=sampling.temperature, rid=rid, extra_key=prompt.extra_key)
        elapsed = time.perf_counter() - started
        log.finish(key, _generate_item(state, rid, result, elapsed))
        return rid, result, elapsed

    try:
        if prompts[0].sampling.n > 1:
            await asyncio.gather(
                *(
                    engine.generate(p.input_ids, max_new_tokens=0, temperature=0.0, extra_key=p.extra_key)
                    for p in prompts
                )
            )
        jobs = [one(prompt, rid, key) for (prompt, rid), key in zip(samples, keys, strict=True)]
        if len(jobs) == 1:  # the common case: no tasks to create
            return [await jobs[0]]
        tasks = [asyncio.ensure_future(job) for job in jobs]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            raise
    except BaseException:
        if state.alive:  # else in flight at the crash: the dump keeps it
            for key in keys:
                log.drop(key)
        raise


def _stream_flag(body: dict[str, Any]) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be true or false.", "stream")
    return stream


def _count_tokens(state: SimState, runs: Sequence[tuple[str, Any, float]], streaming: bool) -> None:
    if state.metrics is not None:
        for _, result, _ in runs:
            state.metrics.observe_request(result.prompt_tokens, result.completion_tokens, streaming)


def _generate_item(state: SimState, rid: str, result: Any, elapsed: float) -> dict[str, Any]:
    return {
        "text": result.text,
        "output_ids": list(result.output_ids),
        "meta_info": {
            "id": rid,
            "finish_reason": _finish_reason(result),
            "prompt_tokens": result.prompt_tokens,
            "weight_version": state.server_args.get("weight_version", "default"),
            "completion_tokens": result.completion_tokens,
            "cached_tokens": result.cached_tokens,
            "e2e_latency": round(elapsed, 6),
        },
    }


# ----------------------------------------------------------------------------------------------
# Responses
# ----------------------------------------------------------------------------------------------


_ERROR_TYPES = {400: "BadRequestError", 413: "RequestTooLargeError", 503: "ServiceUnavailableError"}


def native_error(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
    kind = _ERROR_TYPES.get(status, "InternalServerError")
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}, status_code=status
    )


def openai_error(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
    kind = _ERROR_TYPES.get(status, "InternalServerError")
    return JSONResponse(
        {"object": "error", "message": message, "type": kind, "param": param, "code": status},
        status_code=status,
    )


# SGLang's ConfigureLoggingReq: its fields (BaseReq's first) and their types.
CONFIGURE_LOGGING_FIELDS = {
    "rid": "string", "http_worker_ipc": "string", "log_requests": "bool", "log_requests_level": "int",
    "log_requests_format": "string", "log_level": "string", "dump_requests_folder": "string",
    "dump_requests_threshold": "int", "crash_dump_folder": "string", "dump_requests_exclude_meta_keys": "list",
}
_TRUE_WORDS = ("1", "true", "t", "yes", "y", "on")
_FALSE_WORDS = ("0", "false", "f", "no", "n", "off")


class _Invalid(ValueError):
    def __init__(self, kind: str, msg: str) -> None:
        super().__init__(msg)
        self.kind = kind


def _lax(value: Any, kind: str) -> Any:
    """A field's value as pydantic's lax mode takes it (FastAPI validates SGLang's bodies so)."""
    if value is None:
        return None
    if kind == "string":
        if isinstance(value, str):
            return value
        raise _Invalid("string_type", "Input should be a valid string")
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if _is_int(value) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE_WORDS + _FALSE_WORDS:
            return value.strip().lower() in _TRUE_WORDS
        raise _Invalid("bool_parsing", "Input should be a valid boolean")
    if kind == "int":
        if _is_int(value):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            return int(value.strip())
        raise _Invalid("int_parsing", "Input should be a valid integer")
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise _Invalid("list_type", "Input should be a valid list of strings")


def _validation_error(errors: list[dict[str, Any]]) -> JSONResponse:
    """SGLang's answer to a body FastAPI's validation refuses: 400 and its ErrorResponse."""
    count = f"{len(errors)} validation error{'s' if len(errors) != 1 else ''}"
    message = f"{count}:\n" + "\n".join(f"  {error!r}" for error in errors)
    body = {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}
    return JSONResponse(body, status_code=400)


def _dead_message(state: SimState) -> str:
    return f"The scheduler died: {state.engine.dead_reason or 'unknown reason'}. The server is shutting down."


async def _guarded(
    state: SimState, handler: Callable[[], Awaitable[Response]], error: Callable[..., JSONResponse]
) -> Response:
    """Map every failure of a request to a JSON error; nothing a client sends kills the server."""
    try:
        if not state.alive:
            return error(_dead_message(state), 503)
        return await handler()
    except BadRequest as exc:
        state.log_error(f"[http_server] Error: {exc}")
        return error(str(exc), exc.status, exc.param)
    except ValueError as exc:  # the engine's verdict on the input
        state.log_error(f"[http_server] Error: {exc}")
        return error(str(exc), 400)
    except EngineDead:
        return error(_dead_message(state), 503)


def _sse(chunks: Sequence[dict[str, Any]]) -> StreamingResponse:
    async def body():
        for chunk in chunks:
            yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


# ----------------------------------------------------------------------------------------------
# Routes
# ----------------------------------------------------------------------------------------------


class _Api:
    """SGLang's HTTP routes over the simulated engine, one method each."""

    def __init__(self, state: SimState) -> None:
        self.state = state
        self.engine = state.engine
        self.generating_health = (
            os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "1").strip().lower()
            not in ("0", "false", "no", "off")
        )

    async def health(self, request: Request) -> Response:
        # As SGLang 0.5.23: /health generates one token through the engine (a batch in the log)
        # unless SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is off, and answers 503 while starting.
        if not self.generating_health:
            return Response(status_code=200 if self.state.ready and self.state.alive else 503)
        return await self.health_generate(request)

    async def health_generate(self, request: Request) -> Response:
        if not (self.state.ready and self.state.alive):
            return Response(status_code=503)
        rid = f"HEALTH_CHECK_{uuid.uuid4().hex}"
        params = {"max_new_tokens": 1, "temperature": 0.0}
        # In SGLang's request log while in flight only (log_metrics=False).
        key = self.state.request_log.start(
            GenerateReqInput(input_ids=[0], sampling_params=params, log_metrics=False, rid=rid)
        )
        ok = False
        try:
            async with asyncio.timeout(HEALTH_CHECK_TIMEOUT_S):
                await self.engine.generate([0], max_new_tokens=1, temperature=0.0, rid=rid)
            ok = True
        except (TimeoutError, EngineDead, ValueError):
            pass
        finally:
            if ok:
                self.state.request_log.finish(key, {})
            elif self.state.alive:  # else in flight at the crash
                self.state.request_log.drop(key)
        return Response(status_code=200 if ok else 503)

    async def server_info(self, request: Request) -> Response:
        stats = self.engine.stats()
        # One entry, for the whole engine: SGLang lists one per DP rank, the Engine reports totals.
        internal = {
            "last_gen_throughput": stats.gen_throughput,
            "token_usage": stats.token_usage,
            "num_running_reqs": stats.num_running_reqs,
            "num_queue_reqs": stats.num_queue_reqs,
            "cache_hit_rate": stats.cache_hit_rate,
            "max_total_num_tokens": stats.max_total_num_tokens,
            "available_tokens": stats.available_tokens,
            "evictable_tokens": stats.evictable_tokens,
            "protected_tokens": stats.protected_tokens,
            "evicted_tokens_total": stats.evicted_tokens_total,
            "num_retracted_reqs": stats.num_retracted_reqs,
            "effective_max_running_requests_per_dp": self.engine.config.max_running_requests,
        }
        body = {
            **self.state.server_args,
            "launch_command": self.state.launch_command,
            "max_total_num_tokens": stats.max_total_num_tokens,
            "max_req_input_len": self.state.context_len - 1,
            "startup_time": self.state.startup_time,
            "internal_states": [internal],
            "version": self.state.version,
            "frontend": "python",
            "radixtop_instrument": list(self.state.instrument_urls),
        }
        return JSONResponse(body)

    async def model_info(self, request: Request) -> Response:
        return JSONResponse(
            {
                "model_path": self.state.server_args.get("model_path"),
                "served_model_name": self.state.served_model_name,
                "tokenizer_path": self.state.server_args.get("tokenizer_path"),
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": self.state.server_args.get("weight_version", "default"),
            }
        )

    async def flush_cache(self, request: Request) -> Response:
        if not self.state.alive:
            return PlainTextResponse(FLUSH_FAILED_TEXT, status_code=400)
        ok = self.engine.flush_cache()
        return PlainTextResponse(FLUSH_OK_TEXT if ok else FLUSH_FAILED_TEXT, status_code=200 if ok else 400)

    async def generate(self, request: Request) -> Response:
        async def handle() -> Response:
            body = await _json_object(request)
            stream = _stream_flag(body)
            prompts, single = _prompts(
                self.engine.tokenizer.encode,
                body.get("text"),
                body.get("input_ids"),
                body.get("rid"),
                body.get("sampling_params"),
                text_key="text",
                max_tokens_key="max_new_tokens",
                default_max=GENERATE_DEFAULT_MAX_NEW_TOKENS,
                where="sampling_params",
            )
            _check_lengths(prompts, self.state.context_len)
            extra_key = body.get("extra_key")
            if extra_key is not None and not isinstance(extra_key, str):
                raise BadRequest("extra_key must be a string.", "extra_key")
            prompts = [replace(p, extra_key=extra_key) for p in prompts]
            runs = await _run_all(self.state, prompts, stream=stream)
            _count_tokens(self.state, runs, stream)
            items = [_generate_item(self.state, *run) for run in runs]
            if stream:
                return _sse(items)
            return JSONResponse(items[0] if single and prompts[0].sampling.n == 1 else items)

        return await _guarded(self.state, handle, native_error)

    async def completions(self, request: Request) -> Response:
        async def handle() -> Response:
            media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if media != "application/json":
                raise BadRequest("Unsupported Media Type: Only 'application/json' is allowed", "content-type")
            body = await _json_object(request)
            if "prompt" not in body:
                raise BadRequest("prompt is required.", "prompt")
            prompt = body["prompt"]
            text, ids = (
                (None, prompt)
                if isinstance(prompt, list) and prompt and not isinstance(prompt[0], str)
                else (prompt, None)
            )
            stream = _stream_flag(body)
            prompts, _ = _prompts(
                self.engine.tokenizer.encode,
                text,
                ids,
                None,
                body,  # OpenAI puts max_tokens, temperature and n at the top level
                text_key="prompt",
                max_tokens_key="max_tokens",
                default_max=COMPLETIONS_DEFAULT_MAX_TOKENS,
                where="the request body",
            )
            _check_lengths(prompts, self.state.context_len)
            prompts = [replace(p, params=_openai_sampling_params(body, p.sampling)) for p in prompts]
            runs = await _run_all(self.state, prompts, stream=stream)
            n = prompts[0].sampling.n
            _count_tokens(self.state, runs, stream)
            created = int(time.time())
            response_id = f"cmpl-{uuid.uuid4().hex}"
            choices = []
            for index, (_, result, _) in enumerate(runs):
                reason = _finish_reason(result) or {}
                choices.append(
                    {
                        "index": index,
                        "text": result.text,
                        "logprobs": None,
                        "finish_reason": reason.get("type"),
                        "matched_stop": reason.get("matched"),
                    }
                )
            prompt_tokens = sum(r.prompt_tokens for i, (_, r, _) in enumerate(runs) if i % n == 0)
            completion_tokens = sum(r.completion_tokens for _, r, _ in runs)
            usage: dict[str, Any] = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": None,
            }
            cached = sum(r.cached_tokens for _, r, _ in runs)
            if self.state.enable_cache_report and cached:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            model = body.get("model") if isinstance(body.get("model"), str) else self.state.served_model_name
            payload = {
                "id": response_id,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": choices,
                "usage": usage,
            }
            if stream:
                chunks = [
                    {
                        "id": response_id,
                        "object": "text_completion",
                        "created": created,
                        "model": model,
                        "choices": [choice],
                    }
                    for choice in choices
                ]
                return _sse(chunks)
            return JSONResponse(payload)

        return await _guarded(self.state, handle, openai_error)

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.state.served_model_name,
            "object": "model",
            "created": int(self.state.startup_time),
            "owned_by": "sglang",
            "root": self.state.served_model_name,
            "parent": None,
            "max_model_len": self.state.context_len,
        }

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        name = request.path_params["model"]
        if name != self.state.served_model_name:
            return JSONResponse(
                {
                    "error": {
                        "message": f"The model '{name}' does not exist",
                        "type": "invalid_request_error",
                        "param": "model",
                        "code": "model_not_found",
                    }
                },
                status_code=404,
            )
        return JSONResponse(self._model_card())

    async def configure_logging(self, request: Request) -> Response:
        # SGLang's /configure_logging (GET or POST, a ConfigureLoggingReq as JSON, each field
        # optional; an empty string turns a dump off). The simulator acts on crash_dump_folder
        # and accepts the others. 200 with no body, and SGLang's line; 400 for a body that is not one.
        try:
            body = await _body(request)
        except BadRequest as exc:
            return native_error(str(exc), exc.status)
        if not body:
            return _validation_error([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
        try:
            obj = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            obj = body
        if not isinstance(obj, dict):
            return _validation_error([
                {"type": "dict_type", "loc": ("body",), "msg": "Input should be a valid dictionary", "input": obj}
            ])
        values: dict[str, Any] = {}
        errors = []
        for name, kind in CONFIGURE_LOGGING_FIELDS.items():
            try:
                values[name] = _lax(obj.get(name), kind)
            except _Invalid as exc:
                errors.append({"type": exc.kind, "loc": ("body", name), "msg": str(exc), "input": obj.get(name)})
        if errors:
            return _validation_error(errors)
        if values["crash_dump_folder"] is not None:
            self.state.request_log.crash_dump_folder = values["crash_dump_folder"]
        fields = ", ".join(f"{name}={value!r}" for name, value in values.items())
        self.state.log_info(f"Config logging: obj=ConfigureLoggingReq({fields})")
        return Response(status_code=200)

    async def metrics(self, request: Request) -> Response:
        body, content_type = self.state.metrics.render()
        return Response(body, media_type=content_type)


def build_app(state: SimState) -> Starlette:
    api = _Api(state)
    routes = [
        Route("/health", api.health, methods=["GET"]),
        Route("/health_generate", api.health_generate, methods=["GET"]),
        Route("/server_info", api.server_info, methods=["GET"]),
        Route("/get_server_info", api.server_info, methods=["GET"]),
        Route("/model_info", api.model_info, methods=["GET"]),
        Route("/get_model_info", api.model_info, methods=["GET"]),
        Route("/flush_cache", api.flush_cache, methods=["GET", "POST"]),
        Route("/configure_logging", api.configure_logging, methods=["GET", "POST"]),
        Route("/generate", api.generate, methods=["POST", "PUT"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/models/{model:path}", api.model, methods=["GET"]),
    ]
    if state.metrics is not None:  # SGLang mounts /metrics only with --enable-metrics
        routes.append(Route("/metrics", api.metrics, methods=["GET"]))

    async def http_error(request: Request, exc: Exception) -> Response:
        # FastAPI's shape for unknown routes and wrong methods, as SGLang answers them.
        assert isinstance(exc, HTTPException)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})
