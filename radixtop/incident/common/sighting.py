"""What was seen of a server while it lived: enough to relaunch it after it died.

The confirmation run matters most right after the server crashed, when its process, its
``/server_info`` and its GPUs are gone. So from the first moment a server is seen, radixtop keeps a
:class:`Sighting`: its argv, working directory and interpreter (psutil), its ``/server_info``
(launch command, server args, internal states), the environment keys that change SGLang's
behaviour (read from /proc/PID/environ), the GPUs its process tree holds (NVML, per process) and
its logs. The TUI refreshes it while the server lives; ``radixtop confirm`` takes one itself.

It is written to the user's runtime directory (``servers/<host>-<port>.json``) so that a later
``radixtop confirm`` for the same URL, or a second radixtop, can plan from it. What is written
holds no secret: secret-named environment keys are kept in memory only (a control started from
this process gets them; one planned from the file is told which are missing), and /server_info is
redacted.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

__all__ = ["BEHAVIOUR_ENV_KEYS", "BEHAVIOUR_ENV_PREFIXES", "GpuUse", "Sighting", "behaviour_env", "load_sighting",
           "observe", "save_sighting", "server_gpus"]

SCHEMA = 1
# Environment keys that change what SGLang does, or where it finds its code and weights.
BEHAVIOUR_ENV_PREFIXES = (
    "SGLANG_", "SGL_", "CUDA_", "NCCL_", "TORCH_", "TORCHINDUCTOR_", "PYTORCH_", "HF_", "HUGGING_FACE_",
    "TRANSFORMERS_", "FLASHINFER_", "TRITON_", "VLLM_", "NVIDIA_", "OMP_", "MKL_", "RADIXTOP_", "GLOO_",
    "MASTER_",
)
BEHAVIOUR_ENV_KEYS = (
    "PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "HOME", "TMPDIR",
    "XDG_RUNTIME_DIR",  # where its instrument writes its flight records
)
MAX_FILE_BYTES = 1 << 20
MAX_WALL_TIME = 95_617_584_000.0  # 5000-01-01 UTC: a later "time" is no time radixtop wrote


def behaviour_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k in BEHAVIOUR_ENV_KEYS or k.startswith(BEHAVIOUR_ENV_PREFIXES)}


@dataclass(frozen=True)
class GpuUse:
    """One GPU the server's process tree held memory on."""

    index: int
    uuid: str
    used_bytes: int | None  # by the server's processes; None where the driver does not say
    total_bytes: int | None

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "uuid": self.uuid, "used_bytes": self.used_bytes, "total_bytes": self.total_bytes}


@dataclass(frozen=True)
class Sighting:
    url: str
    first_seen: float  # time.time()
    last_seen: float  # the last time it was seen alive
    pid: int | None = None
    argv: tuple[str, ...] | None = None
    cwd: str | None = None
    python: str | None = None  # the interpreter it runs (psutil), for relaunching it
    server_info: Mapping[str, Any] | None = None
    env: Mapping[str, str] = field(default_factory=dict, repr=False)  # behaviour keys (secrets in memory only)
    secret_keys: tuple[str, ...] = ()  # names of secret-looking keys among them (values never written)
    gpus: tuple[GpuUse, ...] = ()
    gpu_note: str = ""  # why the GPUs are not known, when they are not
    logs: tuple[str, ...] = ()
    died_at: float | None = None  # when it was seen go down after being alive: its first process's death
    died_first: str = ""  # which of its processes died first ("scheduler TP0 (pid 6489)"), when known
    notes: tuple[str, ...] = ()  # what could not be read, one line each

    def describe_age(self) -> str:
        """ "the server died at 11:54:37; planned from what was seen at 11:54:35" (or found down)."""
        seen = time.strftime("%H:%M:%S", time.localtime(self.last_seen))
        if self.died_at is not None:
            died = time.strftime("%H:%M:%S", time.localtime(self.died_at))
            who = f"its {self.died_first}" if self.died_first else "the server"
            return f"{who} died at {died}; planned from what was seen at {seen}"
        return f"the server is down; planned from what was seen at {seen}, its last sighting"

    def to_json(self) -> dict[str, Any]:
        """For the file: no secret value, /server_info redacted."""
        from radixtop.incident.common.redact import Redactor

        redactor = Redactor()
        redactor.learn_env(self.env)
        if self.argv:
            redactor.learn_argv(list(self.argv))
        return {
            "schema": SCHEMA,
            "url": self.url,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "died_at": self.died_at,
            "died_first": self.died_first,
            "pid": self.pid,
            "argv": redactor.argv(list(self.argv)) if self.argv else None,
            "cwd": self.cwd,
            "python": self.python,
            "server_info": _redacted_info(self, redactor) if self.server_info else None,
            "env": {k: v for k, v in self.env.items() if k not in self.secret_keys},
            "secret_keys": list(self.secret_keys),
            "gpus": [g.as_dict() for g in self.gpus],
            "gpu_note": self.gpu_note,
            "logs": list(self.logs),
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Sighting:
        if not isinstance(doc, Mapping) or doc.get("schema") != SCHEMA or not isinstance(doc.get("url"), str):
            raise ValueError("not a radixtop sighting of this version")

        def text(value: Any) -> str | None:
            return value if isinstance(value, str) else None

        def number(value: Any) -> float | None:
            """A wall-clock time: a number between the epoch and year 5000 (anything else cannot be
            one, and would overflow the clock's formatting)."""
            if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < MAX_WALL_TIME:
                return float(value)
            return None

        def size(value: Any) -> int | None:
            return value if type(value) is int and 0 <= value < 1 << 60 else None

        argv = doc.get("argv")
        env = doc.get("env")
        gpus = []
        for g in doc.get("gpus") or ():
            if isinstance(g, Mapping) and isinstance(g.get("index"), int):
                gpus.append(GpuUse(g["index"], str(g.get("uuid") or ""), size(g.get("used_bytes")),
                                   size(g.get("total_bytes"))))
        info = doc.get("server_info")
        return cls(
            url=doc["url"],
            first_seen=number(doc.get("first_seen")) or 0.0,
            last_seen=number(doc.get("last_seen")) or 0.0,
            died_at=number(doc.get("died_at")),
            died_first=text(doc.get("died_first")) or "",
            pid=doc["pid"] if isinstance(doc.get("pid"), int) else None,
            argv=tuple(str(a) for a in argv) if isinstance(argv, list) and argv else None,
            cwd=text(doc.get("cwd")),
            python=text(doc.get("python")),
            server_info=info if isinstance(info, Mapping) else None,
            # Only behaviour keys, whatever the file says: it is read back, not trusted.
            env=behaviour_env({str(k): str(v) for k, v in env.items()}) if isinstance(env, Mapping) else {},
            secret_keys=tuple(str(k) for k in doc.get("secret_keys") or ()),
            gpus=tuple(gpus),
            gpu_note=str(doc.get("gpu_note") or ""),
            logs=tuple(str(p) for p in doc.get("logs") or ()),
            notes=tuple(str(n) for n in doc.get("notes") or ()),
        )

    def died(self, at: float | None = None, first: str = "") -> Sighting:
        """The same sighting, marked down at `at` (the first death seen), `first` naming the
        process that died first when it was not the server itself."""
        return self if self.died_at is not None else replace(self, died_at=at or time.time(), died_first=first)



# The last /server_info redacted, and what its redaction learned from: a live server is sighted
# every few seconds and its /server_info (hundreds of fields) rarely changes, while redacting it
# took a third of an idle radixtop's CPU. One entry: a radixtop sights one server at a time.
_last_redacted: tuple[tuple[Any, ...], Any] | None = None


def _redacted_info(sighting: Sighting, redactor: Any) -> Any:
    """sighting.server_info redacted by `redactor` (which learned the sighting's env and argv)."""
    global _last_redacted
    key = (sighting.server_info, dict(sighting.env), sighting.argv)
    last = _last_redacted
    if last is not None and last[0] == key:
        return last[1]
    redacted = redactor.json(dict(sighting.server_info or {}))
    _last_redacted = (key, redacted)
    return redacted

def _tree_pids(pid: int) -> set[int]:
    import psutil

    try:
        proc = psutil.Process(pid)
        return {pid, *(c.pid for c in proc.children(recursive=True))}
    except psutil.Error:
        return {pid}


def server_gpus(sample: Any, pids: Iterable[int]) -> tuple[GpuUse, ...]:
    """The GPUs of an NVML sample (probes.gpu.GpuSample) on which any of pids holds memory."""
    wanted = set(pids)
    out = []
    for gpu in getattr(sample, "gpus", ()) or ():
        used = [p.used_bytes for p in gpu.processes if p.pid in wanted]
        if used:
            known = [u for u in used if u is not None]
            out.append(GpuUse(gpu.index, gpu.uuid, sum(known) if known else None, gpu.memory_total))
    return tuple(out)


def observe(
    url: str,
    pid: int | None,
    *,
    server_info: Mapping[str, Any] | None = None,
    gpu_sample: Any = None,
    logs: Iterable[str] = (),
    previous: Sighting | None = None,
    now: float | None = None,
) -> Sighting:
    """A fresh sighting of a live server; what cannot be read now is kept from `previous` (a
    process turning into a zombie, a /server_info that timed out once)."""
    from radixtop.incident.common.redact import is_secret_name
    from radixtop.incident.common.server import process_argv, process_cwd, process_environ, process_python

    now = time.time() if now is None else now
    prev = previous if previous is not None and previous.url == url else None
    same = prev is not None and prev.pid == pid
    notes: list[str] = []
    argv = process_argv(pid)
    if argv is None and pid is not None:
        notes.append(f"the argv of pid {pid} is not readable")
    environ = process_environ(pid)
    if environ is None and pid is not None:
        notes.append(f"the environment of pid {pid} is not readable (another user's process?)")
    env = behaviour_env(environ) if environ is not None else (dict(prev.env) if same and prev else {})
    gpus: tuple[GpuUse, ...] = ()
    gpu_note = ""
    state = getattr(getattr(gpu_sample, "status", None), "state", None)
    if gpu_sample is None:
        gpu_note = "GPUs not read"
    elif state not in ("ok", "degraded"):
        gpu_note = f"GPUs unknown: {getattr(gpu_sample.status, 'message', '') or state}"
    elif pid is not None:
        gpus = server_gpus(gpu_sample, _tree_pids(pid))
    if not gpus and same and prev is not None and prev.gpus:
        gpus = prev.gpus
    return Sighting(
        url=url,
        first_seen=prev.first_seen if prev is not None else now,
        last_seen=now,
        pid=pid,
        argv=tuple(argv) if argv else (prev.argv if same and prev else None),
        cwd=process_cwd(pid) or (prev.cwd if same and prev else None),
        python=process_python(pid) or (prev.python if same and prev else None),
        server_info=server_info if server_info is not None else (prev.server_info if prev else None),
        env=env,
        secret_keys=tuple(sorted(k for k in env if is_secret_name(k))),
        gpus=gpus,
        gpu_note="" if gpus else gpu_note,
        logs=tuple(dict.fromkeys([*(os.path.abspath(p) for p in logs), *(prev.logs if prev else ())])),
        notes=tuple(notes),
    )


def _path(url: str) -> Path:
    from radixtop.rundir import runtime_dir

    parts = urlsplit(url)
    host = (parts.hostname or "host").replace(":", "_")
    return runtime_dir("servers") / f"{host}-{parts.port or 80}.json"


def save_sighting(sighting: Sighting) -> Path:
    """Atomically, into the runtime directory; OSError (RuntimeDirError) when it cannot."""
    from radixtop.rundir import write_file

    path = _path(sighting.url)
    write_file(path, (json.dumps(sighting.to_json(), indent=1) + "\n").encode())
    return path


def load_sighting(url: str) -> Sighting | None:
    """The last sighting written for this URL, or None (none, unreadable, another version)."""
    from radixtop.bounded import load_json
    from radixtop.rundir import read_file

    try:
        data = read_file(_path(url), MAX_FILE_BYTES)  # a regular file of ours, or nothing
        if data is None:
            return None
        return Sighting.from_json(load_json(data, "sighting", max_bytes=MAX_FILE_BYTES))
    except (OSError, ValueError, TypeError, KeyError):
        return None
