"""SGLang's crash dumps read as a workload, without ever running what a pickle asks for.

SGLang (``--crash-dump-folder DIR``, or ``POST /configure_logging {"crash_dump_folder": DIR}``)
writes ``DIR/<host>/crash_dump_<time>.pkl`` when a child dies and logs ``Dumped N finished and M
unfinished requests before crash to FILE``; ``dump_requests_folder`` writes the same records every
K finished requests. A dump is a pickle of a dict: ``server_args``, ``launch_command``, and
``requests``, tuples ``(GenerateReqInput, output dict, created_ts, finished_ts)``; an unfinished
request's output is ``{}``.

SGLang's JSON request log (``--log-requests --log-requests-level 3 --log-requests-format json``)
holds the same records, a ``request.received`` and a ``request.finished`` line per request:
``read_request_log`` reads it into the same CrashDump.

A pickle is a program: loading one with ``pickle.load`` runs whatever callables it names. Here a
dump is loaded by an unpickler whose every global is either a harmless builtin (``set``,
``frozenset``, ``complex``, ``OrderedDict``, dates) or, for names under SGLang, transformers,
torch and numpy, an inert stand-in that keeps the arguments and state it is given and does
nothing else: no module is imported and no real code runs. Any other global (``os.system``,
``builtins.eval``, ``subprocess.Popen``) is refused in one line naming it. The file must be a
regular file (not a link) of this user's or root's, at most MAX_DUMP_BYTES.
"""

from __future__ import annotations

import collections
import datetime
import io
import json
import os
import pickle
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixtop.incident.replay.record import RecordedCall, build_trace
from radixtop.incident.replay.trace import Trace

__all__ = [
    "MAX_DUMP_BYTES", "CrashDump", "DumpError", "DumpedRequest", "arm", "arm_request", "crash_workload", "dump_folder",
    "dump_named_in", "dump_trace_of", "find_dumps", "is_request_log", "merge_dumps", "read_dump", "read_request_log",
    "shape_of", "workload_shape",
]

MAX_DUMP_BYTES = 512 << 20
MAX_REQUESTS = 200_000
CRASH_SPREAD_S = 600.0  # crash dumps of one incident: every host's, written within this of the newest
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's, when a request does not say
# Packages whose names become inert stand-ins; anything else a dump asks for is refused.
INERT_PACKAGES = frozenset({"sglang", "transformers", "torch", "numpy"})
SAFE_GLOBALS: dict[tuple[str, str], Any] = {
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("datetime", "datetime"): datetime.datetime,
    ("datetime", "date"): datetime.date,
    ("datetime", "timedelta"): datetime.timedelta,
}


class DumpError(ValueError):
    """One line: what is wrong with the dump and what to do."""


class Inert:
    """What an allowed SGLang, transformers, torch or numpy name becomes: it records the arguments
    and the state it is given, and does nothing with them."""

    qualified = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> Inert:
        obj = object.__new__(cls)
        obj.__dict__["_args"] = args
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        dicts = state if isinstance(state, tuple) else (state,)
        for part in dicts:
            if isinstance(part, dict):  # never a dunder: an instance's __setstate__ would be called
                self.__dict__.update((k, v) for k, v in part.items() if isinstance(k, str) and not k.startswith("__"))
            elif part is not None:
                self.__dict__["_state"] = part



def _attr(obj: Any, name: str) -> Any:
    """A stand-in's recorded attribute (its instance dict only: nothing a pickle set can run)."""
    return obj.__dict__.get(name) if isinstance(obj, Inert) else None


_STAND_INS: dict[tuple[str, str], type[Inert]] = {}


def _stand_in(module: str, name: str) -> type[Inert]:
    key = (module, name)
    if key not in _STAND_INS:
        _STAND_INS[key] = type(name.replace(".", "_") or "Inert", (Inert,), {"qualified": f"{module}.{name}"})
    return _STAND_INS[key]


class _InertUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        safe = SAFE_GLOBALS.get((module, name))
        if safe is not None:
            return safe
        if module.split(".", 1)[0] in INERT_PACKAGES:
            return _stand_in(module, name)
        raise DumpError(f"refused: it asks for {module}.{name}, which radixtop never loads from a dump")

    def persistent_load(self, pid: Any) -> Any:
        raise DumpError("refused: it holds persistent references (a torch.save file, not an SGLang crash dump)")


@dataclass(frozen=True)
class DumpedRequest:
    """One request as the dump holds it."""

    rid: str
    input_ids: tuple[int, ...] | None
    """The exact prompt the server saw, when it was given as token ids (else None)."""
    text: str | None
    """The prompt text (OpenAI routes' chat template already applied), when there are no ids."""
    max_new_tokens: int
    created: float
    """Epoch seconds the server received it."""
    finished: float | None
    """Epoch seconds it finished; None for one still in flight at the crash."""
    extra_key: str | None
    """Its cache namespace: extra_key, else cache_salt, else its LoRA adapter."""
    ignore_eos: bool
    stop: tuple[str, ...]
    """Its stop strings."""
    prompt_tokens: int | None
    """From the server's answer (meta_info), when it finished."""
    cached_tokens: int | None


@dataclass(frozen=True)
class CrashDump:
    """What a dump file holds that a replay can use, and what it could not."""

    path: Path
    requests: tuple[DumpedRequest, ...]
    launch_command: str | None
    server_args: Mapping[str, Any] = field(default_factory=dict)
    """The dead server's arguments as plain values (its resolved config), where the dump has them."""
    skipped: Mapping[str, int] = field(default_factory=dict)
    """Why requests were left out (a health check, a batch, multimodal input), with counts."""
    parts: int = 1
    """How many dump files it was read from (hosts, or request dumps over time)."""

    @property
    def page_size(self) -> int | None:
        return _int(self.server_args.get("page_size")) or None

    @property
    def in_flight(self) -> int:
        return sum(1 for r in self.requests if r.finished is None)

    @property
    def span_s(self) -> float:
        if not self.requests:
            return 0.0
        return max(r.finished or r.created for r in self.requests) - min(r.created for r in self.requests)

    def summary(self) -> str:
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
        where = f"{self.path} ({self.parts} dumps)" if self.parts > 1 else str(self.path)
        return (f"{where}: {len(self.requests):,} requests over {self.span_s:.1f} s, {self.in_flight} in flight at "
                f"the crash" + (f"; left out: {skipped}" if skipped else ""))


def _read_bytes(path: Path, limit: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        why = "it is a symbolic link" if os.path.islink(path) else (exc.strerror or str(exc))
        raise DumpError(f"{path}: cannot read the dump: {why}") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise DumpError(f"{path}: not a regular file")
        if info.st_uid not in (os.geteuid(), 0):
            raise DumpError(
                f"{path}: owned by uid {info.st_uid}, not you or root: copy it somewhere of yours to read it"
            )
        if info.st_size > limit:
            raise DumpError(f"{path}: {info.st_size:,} bytes, more than the {limit:,} radixtop reads")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise DumpError(f"{path}: more than the {limit:,} bytes radixtop reads")
    return data


def _load(path: Path, data: bytes) -> Any:
    try:
        return _InertUnpickler(io.BytesIO(data)).load()
    except DumpError as exc:
        raise DumpError(f"{path}: {exc}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            OverflowError, MemoryError, RecursionError) as exc:
        raise DumpError(f"{path}: not a complete pickle ({type(exc).__name__}: {str(exc)[:120]}); "
                        "was it copied while being written?") from None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _stop_strings(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,) if value else ()
    return tuple(v for v in value if isinstance(v, str) and v) if isinstance(value, (list, tuple)) else ()


def _token_ids(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, (list, tuple)) and value and all(type(t) is int and t >= 0 for t in value):
        return tuple(value)
    return None


def _request(entry: Any) -> DumpedRequest | str:
    """A request of the dump, or why it is left out."""
    if not isinstance(entry, (tuple, list)) or len(entry) < 3:
        return "not a request record"
    req, out = entry[0], entry[1]
    created = _number(entry[2])
    finished = _number(entry[3]) if len(entry) > 3 else None
    if not isinstance(req, Inert) or created is None:
        return "not a request record"
    done = isinstance(out, dict) and bool(out)
    return _from_fields(req.__dict__, out if done else None, created, (finished or created) if done else None)


def _from_fields(req: Mapping[str, Any], out: Any, created: float, finished: float | None) -> DumpedRequest | str:
    """A request from GenerateReqInput's fields and its final output (None: still in flight), or
    why it is left out. A crash dump's and a JSON request log's records alike."""
    rid = req.get("rid")
    if isinstance(rid, str) and rid.startswith("HEALTH_CHECK"):
        return "health checks"
    if not isinstance(rid, str) or not rid:
        return "without a request id"
    if any(req.get(k) is not None for k in ("input_embeds", "image_data", "video_data", "audio_data")):
        return "with embeddings or media"
    ids, text = _token_ids(req.get("input_ids")), req.get("text")
    if ids is None and not (isinstance(text, str) and text):
        return "batches or prompts without ids or text"
    params = req.get("sampling_params")
    params = params if isinstance(params, dict) else {}
    namespace = next((v for v in (req.get("extra_key"), req.get("cache_salt")) if isinstance(v, str) and v), None)
    lora = req.get("lora_path")
    if namespace is None and isinstance(lora, str) and lora:
        namespace = f"lora:{lora}"
    meta = out.get("meta_info") if isinstance(out, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    prompt_tokens = _int(meta.get("prompt_tokens"))
    if ids is not None and prompt_tokens is not None and prompt_tokens > len(ids):
        return "prompts cut short (a request log below level 3)"
    return DumpedRequest(
        rid=rid, input_ids=ids, text=None if ids is not None else text,
        max_new_tokens=_int(params.get("max_new_tokens")) or DEFAULT_MAX_NEW_TOKENS,
        created=created, finished=finished, extra_key=namespace,
        ignore_eos=params.get("ignore_eos") is True, stop=_stop_strings(params.get("stop")),
        prompt_tokens=prompt_tokens,
        cached_tokens=_int(meta.get("cached_tokens")),
    )


# A JSON request log's line: `[time] {"timestamp": ISO, "event": ..., "rid": ..., "obj": {...}, "out": {...}}`.
REQUEST_LOG_LINE = re.compile(r'^\[[^\]]*\] (\{"timestamp": .*)$')


def is_request_log(path: str | Path) -> bool:
    """Whether ``path`` starts like SGLang's JSON request log (--log-requests-format json)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096).decode("utf-8", "replace")
    except OSError:
        return False
    return REQUEST_LOG_LINE.match(head.split("\n", 1)[0]) is not None


def read_request_log(path: str | Path, *, limit: int = MAX_DUMP_BYTES) -> CrashDump:
    """SGLang's JSON request log (`--log-requests --log-requests-level 3 --log-requests-format
    json`) as a dump: each rid's request.received line, and its request.finished line where there is
    one (a request without one was in flight when the log ends)."""
    path = Path(path)
    text = _read_bytes(path, limit).decode("utf-8", "replace")
    received: dict[str, tuple[Mapping[str, Any], float]] = {}
    finished: dict[str, tuple[Any, float]] = {}
    skipped: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        match = REQUEST_LOG_LINE.match(line)
        if match is None:
            continue
        try:
            record = json.loads(match.group(1))
            when = datetime.datetime.fromisoformat(record["timestamp"]).timestamp()
        except (ValueError, KeyError, TypeError, RecursionError):
            raise DumpError(f"{path}:{number}: not a request log record; is the file whole?") from None
        rid, obj = record.get("rid"), record.get("obj")
        if not isinstance(rid, str) or not isinstance(obj, dict):
            continue  # request.received.openai: its internal request follows with the rid
        if record.get("event") == "request.received":
            received.setdefault(rid, (obj, when))
        elif record.get("event") == "request.finished":
            finished[rid] = (record.get("out"), when)
        if len(received) > MAX_REQUESTS:
            raise DumpError(f"{path}: more than the {MAX_REQUESTS:,} requests radixtop converts")
    requests: list[DumpedRequest] = []
    for rid, (obj, created) in received.items():
        out, done = finished.get(rid, (None, None))
        got = _from_fields(obj, out if isinstance(out, dict) else None, created, done)
        if isinstance(got, str):
            skipped[got] = skipped.get(got, 0) + 1
        else:
            requests.append(got)
    requests.sort(key=lambda r: r.created)
    return CrashDump(path, tuple(requests), None, {}, skipped)


def read_dump(path: str | Path, *, limit: int = MAX_DUMP_BYTES) -> CrashDump:
    """The dump at ``path``; DumpError (one line) for anything that is not a readable SGLang dump."""
    path = Path(path)
    doc = _load(path, _read_bytes(path, limit))
    if not isinstance(doc, dict) or not isinstance(doc.get("requests"), (list, tuple)):
        raise DumpError(f"{path}: not an SGLang crash or request dump (no 'requests' list)")
    entries: Sequence[Any] = doc["requests"]
    if len(entries) > MAX_REQUESTS:
        raise DumpError(f"{path}: {len(entries):,} requests, more than the {MAX_REQUESTS:,} radixtop converts")
    requests: list[DumpedRequest] = []
    skipped: dict[str, int] = {}
    for entry in entries:
        got = _request(entry)
        if isinstance(got, str):
            skipped[got] = skipped.get(got, 0) + 1
        else:
            requests.append(got)
    requests.sort(key=lambda r: r.created)
    command = doc.get("launch_command")
    return CrashDump(path, tuple(requests), command if isinstance(command, str) else None, _server_args(doc), skipped)


def _server_args(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved config (a plain dict), else the plain dict SGLang rebuilds ServerArgs from."""
    plain = (str, int, float, bool, type(None))
    candidates = [doc.get("resolved_config"), *(_attr(doc.get("server_args"), "_args") or ())]
    for candidate in candidates:
        if isinstance(candidate, dict) and "page_size" in candidate:
            return {k: v for k, v in candidate.items() if isinstance(k, str) and isinstance(v, plain)}
    return {}


# SGLang's line when it has written a dump: the file named is the crash's own workload.
DUMPED = re.compile(r"Dumped \d+ finished and \d+ unfinished requests before crash to (\S*/crash_dump_[^/\s]*\.pkl)")
LOG_TAIL_BYTES = 8 << 20


def dump_named_in(logs: Sequence[str]) -> Path | None:
    """The newest dump a server's log says it wrote (the last such line in the logs' tails)."""
    newest: tuple[float, Path] | None = None
    for log in logs:
        try:
            with open(log, "rb") as fh:
                fh.seek(max(0, os.fstat(fh.fileno()).st_size - LOG_TAIL_BYTES))
                tail = fh.read(LOG_TAIL_BYTES).decode("utf-8", "replace")
        except OSError:
            continue
        for match in DUMPED.finditer(tail):
            path = Path(match.group(1))
            try:
                when = path.lstat().st_mtime
            except OSError:
                continue
            if newest is None or when >= newest[0]:
                newest = (when, path)
    return newest[1] if newest else None


def crash_workload(logs: Sequence[str], server_args: Mapping[str, Any] | None,
                   armed: str | None = None) -> tuple[Trace, CrashDump] | None:
    """The crash's own workload, where the server left one: the dump its log names, else the newest
    in its --crash-dump-folder or the folder radixtop armed (``armed``, every host's), else its JSON request log
    (level 3: whole prompts). None when there is none; DumpError when the one there is unreadable."""
    args = server_args or {}
    named = dump_named_in(logs)
    if named is not None:
        dump = read_dump(named)
        return dump_trace_of(dump), dump
    for folder in (args.get("crash_dump_folder"), armed):
        if isinstance(folder, str) and folder and os.path.isdir(folder):
            try:
                paths = find_dumps(folder)
            except DumpError:
                continue
            dump = merge_dumps(Path(folder), [read_dump(path) for path in paths])
            return dump_trace_of(dump), dump
    logged = _request_log_of(logs, args)
    if logged is None:
        return None
    dump = read_request_log(logged)
    return (dump_trace_of(dump), dump) if dump.requests else None


def workload_shape(logs: Sequence[str], server_args: Mapping[str, Any] | None = None,
                   armed: str | None = None) -> tuple[str, dict[str, Any]] | None:
    """The crash's own workload for a bundle: its summary, and the trace without its prompts (the
    shape: lengths, offsets, what is shared, as `radixtop record` writes without --keep-prompts)."""
    return shape_of(crash_workload(logs, server_args, armed))


def shape_of(found: tuple[Trace, CrashDump] | None) -> tuple[str, dict[str, Any]] | None:
    """What crash_workload found, as a bundle keeps it: its summary, and the trace without prompts."""
    from dataclasses import replace

    from radixtop.incident.replay.trace import dump_trace

    if found is None:
        return None
    trace, dump = found
    shape = replace(trace, requests=tuple(replace(r, input_ids=None, text=None) for r in trace.requests))
    return dump.summary(), dump_trace(shape)


def _request_log_of(logs: Sequence[str], args: Mapping[str, Any]) -> Path | None:
    """Where a server logging whole requests as JSON writes them: the newest file of its
    --log-requests-target folder, else its own log (the lines go to stdout)."""
    level = args.get("log_requests_level")
    if not (args.get("log_requests") is True and args.get("log_requests_format") == "json"
            and isinstance(level, int) and level >= 3):
        return None
    target = args.get("log_requests_target")
    folders = [t for t in (target if isinstance(target, list) else [target]) if isinstance(t, str) and os.path.isdir(t)]
    files = [f for folder in folders for f in Path(folder).glob("*.log*") if f.is_file() and not f.is_symlink()]
    if files:
        return max(files, key=lambda f: f.stat().st_mtime)
    return next((Path(log) for log in logs if os.path.isfile(log)), None) if not folders else None


def find_dumps(source: str | Path) -> list[Path]:
    """The dumps of one incident in a folder: each host's newest crash dump, of those written
    within CRASH_SPREAD_S of the newest (a crash across nodes dumps on every node); with no crash
    dump, every request dump (--dump-requests-folder writes one per K finished requests)."""
    path = Path(source)
    if not path.is_dir():
        return [path]
    found = _dumps_in(path)
    crashes = [p for p in found if p.name.startswith("crash_dump_")]
    if not crashes:
        return sorted(found, key=lambda p: (p.stat().st_mtime, p.name))
    newest_per_host: dict[Path, Path] = {}
    for dump in sorted(crashes, key=lambda p: (p.stat().st_mtime, p.name)):
        newest_per_host[dump.parent] = dump
    last = max(p.stat().st_mtime for p in newest_per_host.values())
    return sorted(p for p in newest_per_host.values() if last - p.stat().st_mtime <= CRASH_SPREAD_S)


def _dumps_in(path: Path) -> list[Path]:
    if path.is_symlink():
        raise DumpError(f"{path}: the dump folder is a symbolic link; pass the folder it points to, if you trust it")
    owner = path.stat().st_uid
    if owner not in (os.geteuid(), 0):
        raise DumpError(f"{path}: the dump folder belongs to uid {owner}, not you or root")
    found = [p for pattern in ("*.pkl", "*/*.pkl") for p in path.glob(pattern) if p.is_file() and not p.is_symlink()]
    if not found:
        raise DumpError(f"{path}: no dump (*.pkl) in it or in its host folders; SGLang writes one when a child dies")
    return found


def merge_dumps(source: Path, dumps: Sequence[CrashDump]) -> CrashDump:
    """Several dumps as one (hosts, or request dumps over time), by time; a request in several
    (a request dump, then the crash's) counted once, finished where any says so."""
    if len(dumps) == 1:
        return dumps[0]
    by_rid: dict[str, DumpedRequest] = {}
    skipped: dict[str, int] = {}
    for dump in dumps:
        for why, n in dump.skipped.items():
            skipped[why] = skipped.get(why, 0) + n
        for req in dump.requests:
            kept = by_rid.get(req.rid)
            if kept is None or (kept.finished is None and req.finished is not None):
                by_rid[req.rid] = req
    requests = tuple(sorted(by_rid.values(), key=lambda r: r.created))
    first = dumps[0]
    return CrashDump(source, requests, first.launch_command, first.server_args, skipped, parts=len(dumps))


def dump_folder() -> Path:
    """Where radixtop asks a server to dump: a folder of radixtop's private runtime directory."""
    from radixtop.rundir import runtime_dir

    return runtime_dir("crash-dumps")


def arm_request(url: str, folder: Path) -> tuple[str, dict[str, str]]:
    """What arming sends, as the plan shows it: POST url/configure_logging with this body alone."""
    return f"{url.rstrip('/')}/configure_logging", {"crash_dump_folder": str(folder)}


def arm(url: str, folder: Path, *, timeout_s: float = 10.0) -> None:
    """Tell a live SGLang server to dump its requests into ``folder`` when a child dies, until it
    restarts: only ``crash_dump_folder`` is sent (SGLang leaves every other setting as it is).
    DumpError (one line) when the server does not take it."""
    import httpx

    from radixtop.incident.common.server import auth_headers

    target, body = arm_request(url, folder)
    try:
        answer = httpx.post(target, json=body, headers=auth_headers(), timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise DumpError(f"POST {target}: {type(exc).__name__}: {exc}") from None
    if answer.status_code != 200:
        hint = "; it needs the admin key: set SGLANG_API_KEY" if answer.status_code in (401, 403) else ""
        raise DumpError(f"POST {target} answered HTTP {answer.status_code}{hint}")


def dump_trace_of(dump: CrashDump, *, name: str | None = None) -> Trace:
    """The dump's requests as a trace: their exact prompts and ids, sent at the offsets they were
    received at, with the sharing among them as prefix_of/prefix_len."""
    if not dump.requests:
        raise DumpError(f"{dump.path}: no request a replay can send ({dump.summary()})")
    t0 = dump.requests[0].created
    calls = [
        RecordedCall((r.created - t0) * 1000.0, "/generate", list(r.input_ids) if r.input_ids is not None else None,
                     r.text, r.max_new_tokens, 1, prompt_tokens=r.prompt_tokens, extra_key=r.extra_key,
                     request_id=r.rid, ignore_eos=r.ignore_eos, stop=r.stop, in_flight=r.finished is None)
        for r in dump.requests
    ]
    return build_trace(calls, name=name or dump.path.stem, keep_prompts=True, page_size_hint=dump.page_size or 1,
                       source=f"SGLang dump {dump.path}: {len(calls):,} requests, {dump.in_flight} in flight")
