"""The requests SGLang keeps for a crash dump, and the dump the simulator writes as SGLang's.

SGLang 0.5.23 started with ``--crash-dump-folder DIR`` (or armed later with ``POST
/configure_logging {"crash_dump_folder": DIR}``) keeps every request it finished in the last 300 s
(by finish time) and knows every one in flight. When a child dies, the parent writes them once,
before its crash diagnostics, to ``DIR/<host>/crash_dump_<YYYY-mm-dd_HH-MM-SS>.pkl`` and logs
``Dumped N finished and M unfinished requests before crash to FILE``. The file is a pickle of a
dict: ``server_args`` (a ServerArgs), ``config_updates``, ``resolved_config`` (the arguments as a
plain dict), ``requests`` and ``launch_command``; each request is a tuple ``(GenerateReqInput, the
output dict it was answered with ({} while in flight), created, finished)`` in epoch seconds, the
finished ones first. Health checks are kept only while in flight (SGLang's ``log_metrics=False``).

The simulator writes the same pickle. Its GenerateReqInput (SGLang's fields, in SGLang's order)
and ServerArgs (with SGLang's ``_rebuild_server_args``) are its own, under SGLang's module paths
(``sglang.srt.managers.io_struct``, ``sglang.srt.server_args``): pickle saves classes and functions
by reference, so those module names are put in ``sys.modules`` as module objects holding them only
while the dump is pickled, then taken out again. sglang is never imported.
The file is written whole under a temporary name and renamed into place, mode 0600 (it holds
prompts).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import sys
import tempfile
import time
import types
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from radixtop.rundir import make_private_dirs

__all__ = ["FINISHED_WINDOW_S", "GenerateReqInput", "RequestLog", "ServerArgs", "dump_path"]

FINISHED_WINDOW_S = 300.0  # SGLang keeps the requests finished this recently (by finish time)
IO_STRUCT = "sglang.srt.managers.io_struct"
SERVER_ARGS = "sglang.srt.server_args"
_PACKAGES = ("sglang", "sglang.srt", "sglang.srt.managers")


# SGLang 0.5.23's GenerateReqInput as its tokenizer manager holds one normalized single request:
# every field in its order with its default (a dump pickles the instance dict as it is), then
# the three that normalizing sets.
_REQUEST_FIELDS: tuple[tuple[str, Any], ...] = (
    ("text", None), ("input_ids", None), ("input_embeds", None), ("image_data", None), ("video_data", None),
    ("audio_data", None), ("mm_hashes", None), ("mm_content_hashes", None), ("use_audio_in_video", False),
    ("video_config", None), ("sampling_params", None), ("watermark", None), ("return_logprob", False),
    ("logprob_start_len", -1), ("top_logprobs_num", 0), ("token_ids_logprob", None), ("return_sampling_mask", False),
    ("sampling_logprobs_mode", None), ("return_text_in_logprobs", False), ("return_flat_raw_top_logprobs", False),
    ("return_flat_raw_output_top_logprobs", False), ("return_flat_raw_top_logprobs_b64", False), ("stream", False),
    ("log_metrics", True), ("return_hidden_states", False), ("return_routed_experts", False),
    ("routed_experts_start_len", 0), ("return_indexer_topk", False), ("modalities", None), ("session_params", None),
    ("lora_path", None), ("lora_id", None), ("custom_logit_processor", None), ("positional_embed_overrides", None),
    ("bootstrap_host", None), ("bootstrap_port", None), ("bootstrap_room", None), ("bootstrap_pair_key", None),
    ("decode_tp_size", None), ("routed_dp_rank", None), ("data_parallel_rank", None), ("disagg_prefill_dp_rank", None),
    ("routing_key", None), ("conversation_id", None), ("background", False), ("require_reasoning", False),
    ("max_thinking_tokens", None), ("priority", None), ("extra_key", None), ("no_logs", False), ("custom_labels", None),
    ("return_bytes", False), ("return_entropy", False), ("return_prompt_token_ids", False),
    ("external_trace_header", None), ("received_time", None), ("need_wait_for_mm_inputs", None),
    ("num_items_assigned", None), ("encoder_urls", None), ("max_dynamic_patch", None), ("min_dynamic_patch", None),
    ("image_max_dynamic_patch", None), ("video_max_dynamic_patch", None), ("images_config", None),
    ("mm_processor_kwargs", None), ("multi_item_delimiter_indices", None), ("token_indices_to_pool", None),
    ("cache_salt", None), ("kv_hints", None), ("rid", None), ("session_id", None), ("http_worker_ipc", None),
    ("is_single", True), ("batch_size", 1), ("parallel_sample_num", 1),
)
_REQUEST_DEFAULTS = dict(_REQUEST_FIELDS)


class GenerateReqInput:
    """SGLang's io_struct.GenerateReqInput for one prompt, as a crash dump holds it. The simulator
    sets what it knows; every other field keeps SGLang's default."""

    text: str | None
    input_ids: list[int] | None  # the ids as sent; None for a text prompt (SGLang keeps no tokens here)
    sampling_params: dict[str, Any]  # as sent ({} when none were)
    stream: bool
    log_metrics: bool  # False for health checks: never kept once finished
    extra_key: str | None  # the cache namespace
    rid: str | None

    def __init__(self, **fields: Any) -> None:
        unknown = set(fields) - _REQUEST_DEFAULTS.keys()
        if unknown:
            raise TypeError(f"GenerateReqInput has no field {', '.join(sorted(unknown))}")
        self.__dict__.update(_REQUEST_DEFAULTS)
        self.__dict__.update(fields)
        if self.sampling_params is None:
            self.sampling_params = {}

    def __repr__(self) -> str:
        return f"GenerateReqInput(rid={self.rid!r}, input_ids={self.input_ids!r}, text={self.text!r})"


class ServerArgs:
    """SGLang's server_args.ServerArgs as a dump holds it: pickled, as SGLang's, as a call of
    _rebuild_server_args with its class, its fields and its other attributes."""

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.__dict__.update(fields)

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild_server_args, (ServerArgs, dict(self.__dict__), {})


def _rebuild_server_args(cls: type[ServerArgs], fields: dict[str, Any], bookkeeping: dict[str, Any]) -> ServerArgs:
    record = cls(fields)
    record.__dict__.update(bookkeeping)
    return record


# Saved by reference under SGLang's names.
GenerateReqInput.__module__ = IO_STRUCT
ServerArgs.__module__ = _rebuild_server_args.__module__ = SERVER_ARGS


@contextlib.contextmanager
def _sglang_names() -> Iterator[None]:
    """SGLang's module paths in sys.modules, holding what a dump names, while one is pickled;
    whatever was there before (nothing, in the simulator) is put back after."""
    modules = {name: types.ModuleType(name) for name in (*_PACKAGES, IO_STRUCT, SERVER_ARGS)}
    modules[IO_STRUCT].GenerateReqInput = GenerateReqInput  # type: ignore[attr-defined]
    modules[SERVER_ARGS].ServerArgs = ServerArgs  # type: ignore[attr-defined]
    modules[SERVER_ARGS]._rebuild_server_args = _rebuild_server_args  # type: ignore[attr-defined]
    before = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, module in before.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _host() -> str:
    """SGLang's host folder: $HOSTNAME, else the host name (one path component, never a path)."""
    name = os.environ.get("HOSTNAME", "")
    if not name or "/" in name or name in (".", ".."):
        name = socket.gethostname() or "localhost"
    return name


def dump_path(folder: str, when: datetime | None = None) -> str:
    """Where SGLang writes a crash dump: DIR/<host>/crash_dump_<local time to the second>.pkl."""
    stamp = (when or datetime.now()).strftime("%Y-%m-%d_%H-%M-%S")
    return os.path.join(folder, _host(), f"crash_dump_{stamp}.pkl")


@dataclass
class _InFlight:
    req: GenerateReqInput
    created: float


class RequestLog:
    """The tokenizer manager's view of requests for a crash dump: those in flight, always, and
    those finished in the last FINISHED_WINDOW_S, kept while a crash dump folder is set."""

    def __init__(self, crash_dump_folder: str | None = None, *, clock: Callable[[], float] = time.time) -> None:
        self.crash_dump_folder = crash_dump_folder or ""  # "" is off, as SGLang's
        self._clock = clock
        self._finished: deque[tuple[GenerateReqInput, dict[str, Any], float, float]] = deque()
        self._in_flight: dict[int, _InFlight] = {}
        self._next_key = 0
        self.dump_performed = False

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def start(self, req: GenerateReqInput) -> int:
        """A request received now; the key finishes or drops it."""
        self._next_key += 1
        self._in_flight[self._next_key] = _InFlight(req, self._clock())
        return self._next_key

    def finish(self, key: int, out: dict[str, Any]) -> None:
        """Answered with ``out``: kept (with a crash dump folder set) for FINISHED_WINDOW_S."""
        entry = self._in_flight.pop(key, None)
        if entry is None or not (self.crash_dump_folder and entry.req.log_metrics):
            return
        now = self._clock()
        self._finished.append((entry.req, out, entry.created, now))
        while self._finished and now - self._finished[0][3] >= FINISHED_WINDOW_S:
            self._finished.popleft()

    def drop(self, key: int) -> None:
        """Gone without an answer while the server lives (a client that left, a refused input)."""
        self._in_flight.pop(key, None)

    def dump_before_crash(self, server_args: Mapping[str, Any], launch_command: str,
                          log_error: Callable[[str], None]) -> Path | None:
        """Write the dump once, as SGLang's parent does when a child dies; its path, or None when
        no folder is set, it was written already, or there was nothing to write."""
        folder = self.crash_dump_folder
        if not folder or self.dump_performed:
            return None
        self.dump_performed = True
        log_error(f"Dumping requests before crash. self.crash_dump_folder={folder!r}")
        now = self._clock()
        finished = [entry for entry in self._finished if now - entry[3] < FINISHED_WINDOW_S]
        unfinished: list[tuple[Any, dict[str, Any], float, float]] = [
            (entry.req, {}, entry.created, now) for entry in self._in_flight.values()
        ]
        if not finished and not unfinished:
            return None
        doc = {
            "server_args": ServerArgs(server_args),
            "config_updates": [],
            "resolved_config": dict(server_args),
            "requests": [*finished, *unfinished],
            "launch_command": launch_command,
        }
        filename = dump_path(folder)
        try:
            with _sglang_names():
                data = pickle.dumps(doc, protocol=pickle.DEFAULT_PROTOCOL)
            _write_private(Path(filename), data)
        except (OSError, pickle.PicklingError) as exc:
            log_error(f"Failed to dump requests before crash to {filename}: {exc}")
            return None
        log_error(
            f"Dumped {len(finished)} finished and {len(unfinished)} unfinished requests before crash to {filename}"
        )
        return Path(filename)


def _write_private(path: Path, data: bytes) -> None:
    """``data`` at ``path``, mode 0600, whole or not at all (a temporary file renamed into place);
    folders it creates are 0700."""
    make_private_dirs(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
