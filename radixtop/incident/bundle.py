"""Evidence bundles: everything needed to explain an incident later, taken before anything restarts.

``take_bundle`` collects (see ``radixtop.incident.evidence``) the first occurrence of each signature
with its context, the findings, ``/server_info``, ``/metrics``, radix snapshots, NVML, the process
tree, Python stacks, ``nvidia-smi`` and ``collect_env``; then it writes a manifest with the SHA-256
of every file. The bundle is built in a hidden temporary directory beside its final place and
renamed into place whole (a reader never sees half a bundle), with a ``.tar.gz`` beside it.
Everything written passes through one :class:`Redactor`.

The volatile sources (processes, stacks, HTTP) are collected first and in parallel, the logs
last, so that a server that is dying is caught as early as possible while the log evidence (which
only needs files) is always there. Each source is bounded by a timeout.

For a UI: ``take_bundle`` blocks (run it in a thread worker); ``on_progress`` receives
:class:`BundleProgress` events from worker threads; setting the ``cancel`` event stops it and
removes the partial directory. :class:`AutoBundler` takes one bundle, in a background thread, the
first time it is shown a finding of error severity or worse.
"""

from __future__ import annotations

import concurrent.futures
import glob
import hashlib
import json
import os
import re
import shutil
import tarfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from radixtop.incident.redact import Redactor

__all__ = [
    "AutoBundler",
    "BundleCancelled",
    "BundleError",
    "BundleProgress",
    "BundleResult",
    "BundleWriter",
    "take_bundle",
    "verify_bundle",
]

MANIFEST = "MANIFEST.json"
SUMS = "SHA256SUMS"
FORMAT = "radixtop-bundle"
FORMAT_VERSION = 1
NOTE_SUFFIX = ".note.txt"


class BundleError(Exception):
    """The bundle could not be written at all (the output directory); one line."""


class BundleCancelled(BundleError):
    pass


@dataclass(frozen=True)
class BundleProgress:
    step: str  # "start", a collector's name, "manifest", "archive", "done"
    message: str
    done: int
    total: int


@dataclass(frozen=True)
class BundleResult:
    path: Path
    archive: Path | None
    files: tuple[str, ...]
    notes: dict[str, str]
    reason: str
    duration_s: float
    findings: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "archive": None if self.archive is None else str(self.archive),
            "files": list(self.files),
            "notes": dict(self.notes),
            "reason": self.reason,
            "findings": self.findings,
            "duration_s": round(self.duration_s, 3),
        }


class BundleWriter:
    """Files under one directory, redacted on the way in; notes for what could not be had."""

    def __init__(self, root: Path, redactor: Redactor) -> None:
        self.root = root
        self.redactor = redactor
        self.notes: dict[str, str] = {}
        self._lock = threading.Lock()

    def _path(self, rel: str) -> Path:
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise ValueError(f"bundle path {rel!r} escapes the bundle")
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def text(self, rel: str, text: str) -> None:
        self._path(rel).write_text(self.redactor.text(text), encoding="utf-8")

    def json(self, rel: str, obj: Any) -> None:
        data = json.dumps(self.redactor.json(obj), indent=2, ensure_ascii=False, default=str)
        self._path(rel).write_text(data + "\n", encoding="utf-8")

    def note(self, rel: str, why: str) -> None:
        why = self.redactor.text(why.strip())
        with self._lock:
            self.notes[rel] = why
        self._path(rel + NOTE_SUFFIX).write_text(why + "\n", encoding="utf-8")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "manual"


def _final_name(out_dir: Path, reason: str) -> str:
    stem = f"radixtop-bundle-{datetime.now():%Y%m%d-%H%M%S}-{_slug(reason)}"
    name, n = stem, 1
    while (out_dir / name).exists() or (out_dir / f"{name}.tar.gz").exists():
        n += 1
        name = f"{stem}-{n}"
    return name


def _learn_secrets(redactor: Redactor, pid: int | None) -> None:
    from radixtop.incident.server import process_argv, process_environ, process_tree

    redactor.learn_env(os.environ)
    for proc in process_tree(pid)[:64]:
        redactor.learn_env(process_environ(proc.pid))
        redactor.learn_argv(process_argv(proc.pid))


def take_bundle(
    out_dir: str | Path,
    *,
    url: str | None = None,
    logs: Sequence[str] = (),
    pid: int | None = None,
    instruments: Sequence[str] = (),
    reason: str = "manual",
    signature_files: Sequence[str] = (),
    context: int = 100,
    after: int = 50,
    live_report: Any = None,
    http_timeout_s: float = 3.0,
    tool_timeout_s: float = 15.0,
    torch_env_timeout_s: float = 60.0,
    archive: bool = True,
    on_progress: Callable[[BundleProgress], None] | None = None,
    cancel: threading.Event | None = None,
    redactor: Redactor | None = None,
) -> BundleResult:
    """Collect everything, write it under ``out_dir/<name>`` atomically, and return where.

    ``pid`` defaults to the process listening on the URL's port (on this machine);
    ``instruments``, the ranks' debug endpoints, to those /server_info lists or the pid's tree
    serves (see :func:`radixtop.incident.evidence.collect_server`). Raises
    :class:`BundleError` only when nothing can be written; every unreadable source is a note.
    """
    from radixtop.incident import evidence
    from radixtop.incident.server import (
        base_url,
        is_loopback_url,
        listening_pid,
        process_python,
        url_port,
    )

    began = time.monotonic()
    cancel = cancel or threading.Event()
    url = base_url(url) if url else None
    logs = _expand(logs)
    if pid is None and url and is_loopback_url(url):
        pid = listening_pid(url_port(url))
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        name = _final_name(out, reason)
        tmp = out / f".{name}.partial-{os.getpid()}"
        tmp.mkdir()
    except OSError as exc:
        raise BundleError(f"cannot write a bundle in {out}: {exc.strerror or exc}; pass a writable --out") from None
    redactor = redactor or Redactor()
    _learn_secrets(redactor, pid)
    writer = BundleWriter(tmp, redactor)
    steps = ["processes+stacks", "server", "metrics", "nvml", "nvidia-smi", "collect_env", "logs"]
    state = {"done": 0}
    lock = threading.Lock()

    def progress(step: str, message: str) -> None:
        if on_progress is not None:
            with lock:
                on_progress(BundleProgress(step, message, state["done"], len(steps)))

    def finished(step: str) -> None:
        with lock:
            state["done"] += 1
        progress(step, f"{step} collected")

    def guarded(step: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - a collector's own bug must not lose the rest of the bundle
            writer.note(f"errors/{step}", f"collecting {step} failed: {type(exc).__name__}: {exc}")
            return None
        finally:
            finished(step)

    def procs_and_stacks() -> None:
        tree = evidence.collect_processes(writer, pid)
        evidence.collect_stacks(writer, tree, timeout_s=tool_timeout_s)

    report_box: dict[str, Any] = {}

    def logs_step() -> None:
        report_box["report"] = evidence.collect_logs(
            writer, list(logs), signature_files=signature_files, context=context, after=after,
            live_report=live_report,
        )  # fmt: skip

    progress("start", f"bundle {name}: collecting")
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=6, thread_name_prefix="radixtop-bundle") as pool:
            volatile = [
                pool.submit(guarded, "processes+stacks", procs_and_stacks),
                pool.submit(guarded, "server", lambda: evidence.collect_server(
                    writer, url, pid=pid, instruments=instruments, timeout_s=http_timeout_s)),
                pool.submit(guarded, "metrics", lambda: evidence.collect_metrics(writer, url, timeout_s=http_timeout_s)),
            ]
            slow = [
                pool.submit(guarded, "nvml", lambda: evidence.collect_nvml(writer)),
                pool.submit(guarded, "nvidia-smi", lambda: evidence.collect_nvidia_smi(writer, timeout_s=tool_timeout_s)),
                pool.submit(
                    guarded, "collect_env",
                    lambda: evidence.collect_torch_env(writer, process_python(pid), timeout_s=torch_env_timeout_s),
                ),
            ]  # fmt: skip
            _wait(volatile, cancel)
            slow.append(pool.submit(guarded, "logs", logs_step))
            _wait(slow, cancel)
        if cancel.is_set():
            raise BundleCancelled("bundle cancelled")
        progress("manifest", "writing the manifest")
        files = _write_manifest(tmp, writer, reason=reason, url=url, pid=pid, logs=logs, began=began)
        final = out / name
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    archive_path = None
    if archive:
        progress("archive", "writing the tar.gz")
        archive_path = _write_archive(final, out, name)
    report = report_box.get("report")
    result = BundleResult(
        final, archive_path, tuple(files), dict(writer.notes), reason, time.monotonic() - began,
        findings=0 if report is None else len(report.findings),
    )  # fmt: skip
    progress("done", f"bundle written: {final}")
    return result


def _expand(patterns: Sequence[str]) -> list[str]:
    """Globs (as the UI's --log takes them) to files; a pattern matching nothing stays, so its
    absence becomes a note rather than silence."""
    out: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else []
        for path in matches or [pattern]:
            if path not in out:
                out.append(path)
    return out


def _wait(futures: Iterable[concurrent.futures.Future], cancel: threading.Event) -> None:
    pending = set(futures)
    while pending and not cancel.is_set():
        _, pending = concurrent.futures.wait(pending, timeout=0.1)
    if cancel.is_set():
        for fut in pending:
            fut.cancel()


def _write_manifest(
    root: Path, writer: BundleWriter, *, reason: str, url: str | None, pid: int | None,
    logs: Sequence[str], began: float,
) -> list[str]:  # fmt: skip
    from radixtop import __version__

    readme = [
        "radixtop evidence bundle",
        f"reason: {reason}",
        f"created: {datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"server: {url or '(none)'}  pid: {pid if pid is not None else '(unknown)'}",
        f"logs: {', '.join(logs) or '(none)'}",
        "",
        "evidence/NN-<signature>.log  first occurrence of each signature, >= 100 lines before and the lines after",
        "findings.json                 the findings (radixtop scan --json over the logs)",
        "server/, radix/, gpu/, procs/, stacks/, env/: the server and the machine at bundle time",
        "*.note.txt                    why something is not here",
        "",
        "Verify: sha256sum -c SHA256SUMS (or radixtop bundle --verify DIR).",
        "Secrets (tokens, API keys, Authorization headers, secret-named variables) are redacted as",
        "[REDACTED]; a secret with no recognisable shape in an innocently named variable is not.",
    ]
    if writer.notes:
        readme += ["", "Not collected:"] + [f"  {rel}: {why}" for rel, why in sorted(writer.notes.items())]
    writer.text("README.txt", "\n".join(readme) + "\n")
    entries = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel in (MANIFEST, SUMS):
            continue
        entries.append({"path": rel, "sha256": _sha256(path), "bytes": path.stat().st_size})
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "radixtop": __version__,
        "reason": reason,
        "created": datetime.now().astimezone().isoformat(timespec="seconds"),
        "server": url,
        "pid": pid,
        "logs": list(logs),
        "duration_s": round(time.monotonic() - began, 3),
        "notes": dict(sorted(writer.notes.items())),
        "files": entries,
    }
    (root / MANIFEST).write_text(json.dumps(writer.redactor.json(manifest), indent=2) + "\n", encoding="utf-8")
    (root / SUMS).write_text("".join(f"{e['sha256']}  {e['path']}\n" for e in entries), encoding="utf-8")
    return [e["path"] for e in entries]


def _write_archive(final: Path, out: Path, name: str) -> Path | None:
    target = out / f"{name}.tar.gz"
    tmp = out / f".{name}.tar.gz.partial-{os.getpid()}"
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(final, arcname=name)
        os.replace(tmp, target)
        return target
    except OSError:
        tmp.unlink(missing_ok=True)
        return None  # the directory is the bundle; the archive is a convenience


def verify_bundle(path: str | Path) -> list[str]:
    """Problems found checking a bundle (directory or .tar.gz) against its manifest; [] if none."""
    path = Path(path)
    if path.is_dir():
        files = {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    elif path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
        files = {}
        try:
            with tarfile.open(path, "r:gz") as tar:
                for member in tar.getmembers():
                    if member.isfile():
                        rel = member.name.split("/", 1)[1] if "/" in member.name else member.name
                        handle = tar.extractfile(member)
                        files[rel] = handle.read() if handle else b""
        except (tarfile.TarError, OSError) as exc:
            return [f"{path}: not a readable tar.gz ({exc})"]
    else:
        return [f"{path}: neither a bundle directory nor a .tar.gz"]
    if MANIFEST not in files:
        return [f"{path}: no {MANIFEST}"]
    try:
        manifest = json.loads(files[MANIFEST])
        entries = {e["path"]: e for e in manifest["files"]}
    except (ValueError, KeyError, TypeError) as exc:
        return [f"{MANIFEST}: unreadable ({exc})"]
    problems = []
    if manifest.get("format") != FORMAT:
        problems.append(f"{MANIFEST}: format is {manifest.get('format')!r}, not {FORMAT!r}")
    for rel, entry in sorted(entries.items()):
        data = files.get(rel)
        if data is None:
            problems.append(f"{rel}: listed in the manifest but missing")
        elif hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            problems.append(f"{rel}: SHA-256 differs from the manifest")
    for rel in sorted(set(files) - set(entries) - {MANIFEST, SUMS}):
        problems.append(f"{rel}: present but not in the manifest")
    sums = files.get(SUMS, b"").decode("utf-8", "replace").splitlines()
    listed = {line[66:]: line[:64] for line in sums if len(line) > 66}
    if listed != {rel: e.get("sha256") for rel, e in entries.items()}:
        problems.append(f"{SUMS} does not match {MANIFEST}")
    return problems


@dataclass
class AutoBundler:
    """Takes one bundle, in the background, the first time it sees a finding at or above
    ``min_severity``: so the evidence is kept even when the server dies right after. One more
    each time a finding of a higher severity appears later (an error, then the critical crash it
    led to: the first bundle could not hold the crash's lines), so at most one per severity.

    ``observe`` is cheap and never blocks (call it whenever the findings change); ``on_done`` is
    called from the bundle's thread with the result, or with the error text.
    """

    out_dir: str | Path
    url: str | None = None
    logs: Sequence[str] = ()
    pid: int | None = None
    min_severity: str = "error"
    on_done: Callable[[BundleResult | None, str | None], None] | None = None
    options: dict[str, Any] = field(default_factory=dict)  # more take_bundle keyword arguments
    state: str = "armed"  # armed -> running -> done | failed
    trigger: str | None = None  # the signature id that fired the latest bundle
    fired_level: int = -1  # the severity rank of the latest bundle's trigger
    result: BundleResult | None = None
    error: str | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, findings: Any) -> bool:
        """``findings``: a diagnosis Report or an iterable of Findings. True if a bundle started now."""
        from radixtop.diagnosis.catalog import severity_rank

        if self.state == "running" or self.exhausted:
            return False
        floor = max(severity_rank(self.min_severity), self.fired_level + 1)
        items = getattr(findings, "findings", findings)
        hit = max((f for f in items if f.signature.level >= floor), key=lambda f: f.signature.level, default=None)
        if hit is None:
            return False
        with self._lock:
            if self.state == "running":
                return False
            self.state = "running"
            self.trigger, self.fired_level = hit.signature.id, hit.signature.level
        live = findings if hasattr(findings, "to_json") else None
        self._thread = threading.Thread(target=self._run, args=(live,), name="radixtop-autobundle", daemon=True)
        self._thread.start()
        return True

    @property
    def exhausted(self) -> bool:
        """A bundle was taken at the highest severity there is: nothing can fire it again."""
        from radixtop.diagnosis.catalog import SEVERITIES, severity_rank

        return self.fired_level >= severity_rank(SEVERITIES[-1])

    def _run(self, live_report: Any) -> None:
        try:
            self.result = take_bundle(
                self.out_dir, url=self.url, logs=self.logs, pid=self.pid,
                reason=f"auto-{self.trigger}", live_report=live_report, **self.options,
            )  # fmt: skip
            self.state = "done"
        except Exception as exc:  # noqa: BLE001 - reported through on_done and .error
            self.error = f"{type(exc).__name__}: {exc}"  # reported through on_done / error
            self.state = "failed"
        if self.on_done is not None:
            self.on_done(self.result, self.error)

    def wait(self, timeout_s: float | None = None) -> BundleResult | None:
        if self._thread is not None:
            self._thread.join(timeout_s)
        return self.result
