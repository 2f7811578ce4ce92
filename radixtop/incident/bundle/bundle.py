"""Evidence bundles: everything needed to explain an incident later, taken before anything restarts.

``take_bundle`` collects (see ``radixtop.incident.bundle.evidence``) the first occurrence of each signature
with its context, the findings, ``/server_info``, ``/metrics``, radix snapshots, NVML, the process
tree, Python stacks, ``nvidia-smi`` and ``collect_env``; then it writes a manifest with the SHA-256
of every file. The bundle is built in a hidden temporary directory beside its final place and
renamed into place whole (a reader never sees half a bundle), with a ``.tar.gz`` beside it.
Everything written passes through one :class:`Redactor`.

The volatile sources (processes, stacks, HTTP) are collected first and in parallel, the logs
last, so that a server that is dying is caught as early as possible while the log evidence (which
only needs files) is always there. Each source is bounded by a timeout.

Every network step shares one total deadline (``network_deadline_s``), every tool has a timeout,
and the ``cancel`` event stops all of them at once: the collectors run in daemon threads that are
not waited for once cancelled, so a server that answers a byte at a time never holds a bundle or
the process that takes it. The partial directory is removed on every way out: an exception,
cancel, Ctrl-C, and SIGTERM/SIGHUP (which, on the main thread, cancel the bundle and are then
delivered as before); a partial directory left by a process that was killed outright is removed by
the next bundle in the same directory.

With ``nodes`` (radixtop.incident.bundle.nodes.NodeBundles), other nodes' own bundles come back
through the user's ssh into ``nodes/<host>/`` while this node's evidence is collected, and the
timeline shows every node's figures on this node's clock; the manifest covers them all.

For a UI: ``take_bundle`` blocks (run it in a thread worker); ``on_progress`` receives
:class:`BundleProgress` events from worker threads; setting the ``cancel`` event stops it and
removes the partial directory. :class:`AutoBundler` takes one bundle, in a background thread, the
first time it is shown a finding of error severity or worse.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import signal
import tarfile
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypedDict

from radixtop.diagnosis.evidence_policy import CONTEXT_AFTER, CONTEXT_BEFORE
from radixtop.incident.common.redact import Redactor

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
LOCAL = "local"  # this node, in a bundle across nodes
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
    nodes: tuple[Any, ...] = ()  # radixtop.incident.bundle.nodes.NodePart, with --node

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "archive": None if self.archive is None else str(self.archive),
            "files": list(self.files),
            "notes": dict(self.notes),
            "reason": self.reason,
            "findings": self.findings,
            "duration_s": round(self.duration_s, 3),
            **({"nodes": [part.to_json() for part in self.nodes]} if self.nodes else {}),
        }


class BundleWriter:
    """Files under one directory, redacted on the way in; notes for what could not be had.

    Once closed (the bundle was cancelled) it writes nothing: a collector still running cannot
    recreate the directory that is being removed."""

    def __init__(self, root: Path, redactor: Redactor) -> None:
        self.root = root
        self.redactor = redactor
        self.notes: dict[str, str] = {}
        self.commands: list[dict[str, Any]] = []  # every program run for the bundle, and why
        self.closed = False
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self.closed = True

    def _write(self, rel: str, data: str) -> None:
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise ValueError(f"bundle path {rel!r} escapes the bundle")
        path = self.root / self.redactor.name(rel)  # a log named after a token names no file
        with self._lock:
            if self.closed:
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(data, encoding="utf-8")

    def ran(self, rel: str, argv: Sequence[str], why: str) -> None:
        """Record a program run for ``rel`` (listed in MANIFEST.json and README.txt)."""
        entry = {"for": self.redactor.name(rel), "argv": self.redactor.argv(list(argv)), "why": self.redactor.text(why)}
        with self._lock:
            self.commands.append(entry)

    def text(self, rel: str, text: str) -> None:
        self._write(rel, self.redactor.text(text))

    def generated(self, rel: str, text: str) -> None:
        """A page radixtop generated whole (the timeline: a library's code, and values the caller
        redacted): written as it is, since redacting a JavaScript library can only break it."""
        self._write(rel, text)

    def json(self, rel: str, obj: Any) -> None:
        from radixtop.bounded import prune_depth

        obj = prune_depth(obj)  # redacting and dumping recurse: a hostile document nests thousands deep
        self._write(rel, json.dumps(self.redactor.json(obj), indent=2, ensure_ascii=False, default=str) + "\n")

    def note(self, rel: str, why: str) -> None:
        why = self.redactor.text(why.strip())
        with self._lock:
            self.notes[self.redactor.name(rel)] = why
        self._write(rel + NOTE_SUFFIX, why + "\n")


class _FileEntry(TypedDict):
    """One file of the bundle, as the manifest lists it."""

    path: str
    sha256: str
    bytes: int


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
    from radixtop.incident.common.server import process_argv, process_environ, process_tree

    redactor.learn_env(os.environ)
    for proc in process_tree(pid)[:64]:
        redactor.learn_env(process_environ(proc.pid))
        redactor.learn_argv(process_argv(proc.pid))


_PARTIAL = re.compile(r"\.radixtop-bundle-.*\.partial-(\d+)$")


def _remove_stale_partials(out: Path) -> None:
    """Partial directories and archives left in ``out`` by bundle processes that were killed
    outright (SIGKILL, a power cut): nothing else can remove them."""
    import psutil

    try:
        entries = list(out.iterdir())
    except OSError:
        return
    for entry in entries:
        m = _PARTIAL.match(entry.name)
        if m is None or int(m.group(1)) == os.getpid() or psutil.pid_exists(int(m.group(1))):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


class _Signals:
    """On the main thread, SIGTERM and SIGHUP cancel the bundle (so that its partial directory is
    removed) and are delivered to their previous handlers afterwards."""

    WATCHED = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self, cancel: threading.Event) -> None:
        self.cancel = cancel
        self.received: list[int] = []
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.WATCHED:
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: Any) -> None:
        self.received.append(signum)
        self.cancel.set()

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(self.received):
            signal.raise_signal(sig)  # as it would have been without the bundle in the way


def take_bundle(
    out_dir: str | Path,
    *,
    url: str | None = None,
    logs: Sequence[str] = (),
    pid: int | None = None,
    instruments: Sequence[str] = (),
    reason: str = "manual",
    signature_files: Sequence[str] = (),
    context: int = CONTEXT_BEFORE,
    after: int = CONTEXT_AFTER,
    live_report: Any = None,
    seen: Any = None,
    flight_dirs: Sequence[str] = (),
    http_timeout_s: float = 3.0,
    network_deadline_s: float = 20.0,
    tool_timeout_s: float = 15.0,
    torch_env_timeout_s: float = 60.0,
    archive: bool = True,
    on_progress: Callable[[BundleProgress], None] | None = None,
    cancel: threading.Event | None = None,
    redactor: Redactor | None = None,
    workload: Callable[[Sequence[str]], tuple[str, Mapping[str, Any]] | None] | None = None,
    nodes: Any = None,
) -> BundleResult:
    """Collect everything, write it under ``out_dir/<name>`` atomically, and return where.

    ``pid`` defaults to the process listening on the URL's port (on this machine);
    ``instruments``, the ranks' debug endpoints, to those /server_info lists or the pid's tree
    serves (see :func:`radixtop.incident.bundle.evidence.collect_server`). ``seen``
    (radixtop.incident.bundle.seen.SeenState) is what the TUI saw before: written under ``seen/``, it
    keeps the tree and its locks of ranks that died before the bundle could ask; so do the ranks'
    flight records (``flight/``), looked for in ``flight_dirs`` (where the endpoints said they
    write) and the default places. Each HTTP GET ends within
    ``http_timeout_s`` and all of them within ``network_deadline_s`` of the start. Raises
    :class:`BundleError` only when nothing can be written (:class:`BundleCancelled` when
    cancelled); every unreadable source is a note, every node that gave no bundle too.
    """
    cancel = cancel or threading.Event()
    with _Signals(cancel):
        return _take_bundle(
            out_dir, url=url, logs=logs, pid=pid, instruments=instruments, reason=reason,
            signature_files=signature_files, context=context, after=after, live_report=live_report, seen=seen,
            flight_dirs=flight_dirs, http_timeout_s=http_timeout_s, network_deadline_s=network_deadline_s,
            tool_timeout_s=tool_timeout_s, torch_env_timeout_s=torch_env_timeout_s, archive=archive,
            on_progress=on_progress, cancel=cancel, redactor=redactor, workload=workload, nodes=nodes,
        )


def _take_bundle(
    out_dir: str | Path, *, url: str | None, logs: Sequence[str], pid: int | None, instruments: Sequence[str],
    reason: str, signature_files: Sequence[str], context: int, after: int, live_report: Any, seen: Any,
    flight_dirs: Sequence[str], http_timeout_s: float, network_deadline_s: float, tool_timeout_s: float,
    torch_env_timeout_s: float,
    archive: bool, on_progress: Callable[[BundleProgress], None] | None, cancel: threading.Event,
    redactor: Redactor | None, workload: Callable[[Sequence[str]], tuple[str, Mapping[str, Any]] | None] | None,
    nodes: Any,
) -> BundleResult:
    from radixtop.incident.bundle import evidence
    from radixtop.incident.common.server import base_url, listening_pid, server_interpreter, url_port
    from radixtop.probes.http import is_loopback_url

    began = time.monotonic()
    net_deadline = began + network_deadline_s
    url = base_url(url) if url else None
    logs = _expand(logs)
    if pid is None and url and is_loopback_url(url):
        pid = listening_pid(url_port(url))
    out = Path(out_dir)
    redactor = redactor or Redactor()
    try:
        out.mkdir(parents=True, exist_ok=True)
        _remove_stale_partials(out)
        name = _final_name(out, redactor.name(reason))
        tmp = out / f".{name}.partial-{os.getpid()}"
        tmp.mkdir()
    except OSError as exc:
        raise BundleError(f"cannot write a bundle in {out}: {exc.strerror or exc}; pass a writable --out") from None
    # Every step that ends in finished(): the progress counts them.
    steps = [
        "processes+stacks", "server", "metrics", *_node_steps(nodes),
        *(["what radixtop saw"] if seen is not None else []), "crash workload", "flight records", "nvml",
        "nvidia-smi", "collect_env", "logs", "timeline",
    ]
    state = {"done": 0}
    lock = threading.Lock()

    def progress(step: str, message: str) -> None:
        if on_progress is not None and not cancel.is_set():
            with lock:
                on_progress(BundleProgress(step, message, state["done"], len(steps)))

    writer = BundleWriter(tmp, redactor)
    try:
        _learn_secrets(redactor, pid)

        def finished(step: str) -> None:
            with lock:
                state["done"] += 1
            progress(step, f"{step} collected")

        def guarded(step: str, call: Callable[[], Any]) -> Callable[[], None]:
            def run() -> None:
                try:
                    call()
                except Exception as exc:  # noqa: BLE001 - a collector's own bug must not lose the rest of the bundle
                    if not cancel.is_set():
                        writer.note(f"errors/{step}", f"collecting {step} failed: {type(exc).__name__}: {exc}")
                finally:
                    finished(step)

            return run

        def procs_and_stacks() -> None:
            tree = evidence.collect_processes(writer, pid)
            evidence.collect_stacks(writer, tree, timeout_s=tool_timeout_s, cancel=cancel)

        def torch_env() -> None:
            python, why = server_interpreter(pid) if pid is not None else (None, "the server's pid is unknown")
            evidence.collect_torch_env(writer, python, why, timeout_s=torch_env_timeout_s, cancel=cancel)

        report_box: dict[str, Any] = {}

        def logs_step() -> None:
            report_box["report"] = evidence.collect_logs(
                writer, list(logs), signature_files=signature_files, context=context, after=after,
                live_report=live_report,
            )

        progress("start", f"bundle {name}: collecting")
        volatile = [
            _start(guarded("processes+stacks", procs_and_stacks)),
            _start(guarded("server", lambda: evidence.collect_server(
                writer, url, pid=pid, instruments=instruments, timeout_s=http_timeout_s, deadline=net_deadline,
                cancel=cancel))),
            _start(guarded("metrics", lambda: evidence.collect_metrics(
                writer, url, timeout_s=http_timeout_s, deadline=net_deadline, cancel=cancel))),
        ]
        flight_box: dict[str, Any] = {}

        def flight() -> None:
            given = [*flight_dirs, *(seen.flight_dirs if seen is not None else ())]
            flight_box["records"] = evidence.collect_flight(writer, *evidence.flight_sources(url, pid, given))

        def timeline() -> None:
            from radixtop.incident.bundle.timeline import gather

            data = gather(seen, flight_box.get("records", ()), logs, report_box.get("report"))
            _draw_timeline(writer, data, nodes, f"radixtop bundle {name}: {reason}")

        def other_nodes() -> None:
            _collect_nodes(writer, nodes, tmp, cancel)

        slow = [
            *(_start(guarded(step, other_nodes)) for step in _node_steps(nodes)),
            *([_start(guarded("what radixtop saw", lambda: seen.write(writer)))] if seen is not None else []),
            _start(guarded("crash workload", lambda: _crash_workload(writer, workload, logs))),
            _start(guarded("flight records", flight)),
            _start(guarded("nvml", lambda: evidence.collect_nvml(writer))),
            _start(guarded(
                "nvidia-smi",
                lambda: evidence.collect_nvidia_smi(writer, timeout_s=tool_timeout_s, cancel=cancel),
            )),
            _start(guarded("collect_env", torch_env)),
        ]
        _wait(volatile, cancel)
        slow.append(_start(guarded("logs", logs_step)))
        _wait(slow, cancel)
        if not cancel.is_set():
            progress("timeline", "drawing the timeline")
            guarded("timeline", timeline)()
        if cancel.is_set():
            raise BundleCancelled("bundle cancelled")
        progress("manifest", "writing the manifest")
        node_parts = _node_parts(nodes)
        files = _write_manifest(tmp, writer, reason=reason, url=url, pid=pid, logs=logs, began=began,
                                nodes=node_parts)
        final = out / name
        os.rename(tmp, final)
    except BaseException:
        cancel.set()  # collectors still running stop
        writer.close()  # and write nothing more
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    archive_path = None
    if archive:
        progress("archive", "writing the tar.gz")
        archive_path = _write_archive(final, out, name, cancel)
    report = report_box.get("report")
    result = BundleResult(
        final, archive_path, tuple(files), dict(writer.notes), reason, time.monotonic() - began,
        findings=0 if report is None else len(report.findings),
        nodes=tuple(node_parts or ()),
    )
    progress("done", f"bundle written: {final}")
    return result


def _node_steps(nodes: Any) -> list[str]:
    return [] if nodes is None else ["nodes"]


def _node_parts(nodes: Any) -> list[Any] | None:
    return None if nodes is None else list(nodes.parts)


def _collect_nodes(writer: BundleWriter, nodes: Any, root: Path, cancel: threading.Event) -> None:
    """The other nodes' bundles into nodes/; each node that gave none is a note (one line)."""
    for part in nodes.collect(root, cancel):
        if not part.ok:
            writer.note(part.folder, part.error)


def _draw_timeline(writer: BundleWriter, data: Any, nodes: Any, title: str) -> None:
    """timeline.json and timeline.html: this node's figures, and with `nodes` every other node's
    (on this node's clock, tagged) and the first signatures of all, earliest first."""
    from radixtop.incident.bundle.timeline import events, render_html, to_json

    redact = writer.redactor.text
    data.marks = [(t, redact(label)) for t, label in data.marks]
    doc = to_json(data)
    parts = [data]
    if nodes is not None:
        data.node = LOCAL
        parts += [p.timeline for p in nodes.parts if p.timeline is not None]
        for part in parts[1:]:
            part.marks = [(t, redact(label)) for t, label in part.marks]
        doc["nodes"] = [{"node": p.node, **to_json(p)} for p in parts[1:]]
        doc["events"] = events(parts)
    writer.json("timeline.json", doc)
    if all(p.empty for p in parts):
        writer.note(
            "timeline.html",
            "nothing to plot: no vital signs in the logs or from the UI, no radix snapshots, no signature",
        )
        return
    writer.generated("timeline.html", render_html(parts, redact(title)))


def _crash_workload(writer: Any, workload: Callable[[Sequence[str]], tuple[str, Mapping[str, Any]] | None] | None,
                    logs: Sequence[str]) -> None:
    """The crash's own workload's shape (its source line says what it is; no prompt)."""
    found = workload(list(logs)) if workload is not None else None
    if found is not None:
        writer.json("workload/crash.shape.json", found[1])


def _start(run: Callable[[], None]) -> threading.Thread:
    """A collector in a daemon thread: one stuck in a system call (NVML, /proc) cannot keep the
    process alive once the bundle is cancelled."""
    thread = threading.Thread(target=run, name="radixtop-bundle", daemon=True)
    thread.start()
    return thread


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


def _wait(threads: Iterable[threading.Thread], cancel: threading.Event) -> None:
    """Until the threads end, or at once when cancelled (they stop by themselves)."""
    for thread in threads:
        while thread.is_alive() and not cancel.is_set():
            thread.join(0.05)


def _write_manifest(
    root: Path, writer: BundleWriter, *, reason: str, url: str | None, pid: int | None,
    logs: Sequence[str], began: float, nodes: Sequence[Any] | None = None,
) -> list[str]:
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
        "seen/                         what radixtop saw before (a bundle from the UI): each rank's last radix",
        "                              snapshots and events, the vital signs, the screen (seen/screen.svg)",
        "timeline.html                 the picture: vital signs, locked tokens per rank, first signatures"
        " (offline in a browser)",
        "flight/                       the ranks' flight records: each cache as it failed, written inside the server",
        "experiment/                   a confirmation run's verdict and its pressure ladder (added when it ends)",
        "nodes/<host>/                 another node's own bundle (radixtop bundle --node), with its own manifest",
        "*.note.txt                    why something is not here",
        "",
        "Verify: sha256sum -c SHA256SUMS (or radixtop bundle --verify DIR).",
        "Secrets (tokens, API keys, Authorization headers, secret-named variables) are redacted as",
        "[REDACTED]; a secret with no recognisable shape in an innocently named variable is not.",
    ]
    if nodes is not None:
        readme += ["", "Nodes (timeline.html and timeline.json show every node's events on this node's clock:",
                   "each node's times minus its measured clock skew; the skew is known within ± half the",
                   "round trip of the ssh call that measured it):"]
        readme += [f"  {part.summary()}" for part in nodes] or ["  none"]
    readme += ["", "Programs run (no program that the server names is ever run):"]
    readme += [f"  {' '.join(c['argv'])}  ({c['why']})" for c in writer.commands] or ["  none"]
    if writer.notes:
        readme += ["", "Not collected:"] + [f"  {rel}: {why}" for rel, why in sorted(writer.notes.items())]
    writer.text("README.txt", "\n".join(readme) + "\n")
    entries: list[_FileEntry] = []
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
        "commands": list(writer.commands),
        **({"nodes": [part.to_json() for part in nodes]} if nodes is not None else {}),
        "files": entries,
    }
    (root / MANIFEST).write_text(json.dumps(writer.redactor.json(manifest), indent=2) + "\n", encoding="utf-8")
    (root / SUMS).write_text("".join(f"{e['sha256']}  {e['path']}\n" for e in entries), encoding="utf-8")
    return [e["path"] for e in entries]


def _write_archive(final: Path, out: Path, name: str, cancel: threading.Event | None = None) -> Path | None:
    target = out / f"{name}.tar.gz"
    tmp = out / f".{name}.tar.gz.partial-{os.getpid()}"

    def unless_cancelled(info: tarfile.TarInfo) -> tarfile.TarInfo:
        if cancel is not None and cancel.is_set():
            raise BundleCancelled("archive cancelled")
        return info

    try:
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(final, arcname=name, filter=unless_cancelled)
        os.replace(tmp, target)
        return target
    except (OSError, BundleCancelled):
        tmp.unlink(missing_ok=True)
        return None  # the directory is the bundle; the archive is a convenience
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


MAX_MEMBER_BYTES = 256 << 20  # far above any file a bundle writes (log tails 4 MiB, HTTP answers 32 MiB)
MAX_TOTAL_BYTES = 2 << 30
MAX_MANIFEST_BYTES = 16 << 20


def _hash_stream(handle: Any, limit: int) -> tuple[str, int]:
    """SHA-256 of a stream read in 1 MiB blocks, and its length; stops past ``limit``."""
    digest, size = hashlib.sha256(), 0
    for block in iter(lambda: handle.read(1 << 20), b""):
        size += len(block)
        if size > limit:
            break
        digest.update(block)
    return digest.hexdigest(), size


def _read_small(handle: Any, limit: int) -> bytes | None:
    data = handle.read(limit + 1)
    return None if len(data) > limit else data


def verify_bundle(path: str | Path) -> list[str]:
    """Problems found checking a bundle (directory or .tar.gz) against its manifest; [] if none.

    Every file is hashed as a stream in 1 MiB blocks; in an archive, a member whose header says
    it is larger than MAX_MEMBER_BYTES is refused unread (a compression bomb is not a bundle)."""
    path = Path(path)
    sums: dict[str, str] = {}  # relative path -> SHA-256
    small: dict[str, bytes | None] = {}  # MANIFEST.json and SHA256SUMS themselves
    if path.is_dir():
        _hash_directory(path, sums, small)
    elif path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
        refused = _hash_archive(path, sums, small)
        if refused is not None:
            return [refused]
    else:
        return [f"{path}: neither a bundle directory nor a .tar.gz"]
    if MANIFEST not in small:
        return [f"{path}: no {MANIFEST}"]
    manifest_bytes = small[MANIFEST]
    if manifest_bytes is None:
        return [f"{MANIFEST}: larger than {MAX_MANIFEST_BYTES >> 20} MiB; not a radixtop manifest"]
    try:
        manifest = json.loads(manifest_bytes)
        entries = {e["path"]: e for e in manifest["files"]}
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        return [f"{MANIFEST}: unreadable ({type(exc).__name__})"]
    problems = []
    if manifest.get("format") != FORMAT:
        problems.append(f"{MANIFEST}: format is {manifest.get('format')!r}, not {FORMAT!r}")
    for rel, entry in sorted(entries.items()):
        digest = sums.get(rel)
        if digest is None:
            problems.append(f"{rel}: listed in the manifest but missing")
        elif digest != entry.get("sha256"):
            problems.append(f"{rel}: SHA-256 differs from the manifest")
    for rel in sorted(set(sums) - set(entries)):
        problems.append(f"{rel}: present but not in the manifest")
    listed_sums = (small.get(SUMS) or b"").decode("utf-8", "replace").splitlines()
    listed = {line[66:]: line[:64] for line in listed_sums if len(line) > 66}
    if listed != {rel: e.get("sha256") for rel, e in entries.items()}:
        problems.append(f"{SUMS} does not match {MANIFEST}")
    return problems


def _hash_directory(path: Path, sums: dict[str, str], small: dict[str, bytes | None]) -> None:
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = file.relative_to(path).as_posix()
        with open(file, "rb") as fh:
            if rel in (MANIFEST, SUMS):
                small[rel] = _read_small(fh, MAX_MANIFEST_BYTES)
            else:
                sums[rel] = _hash_stream(fh, 1 << 62)[0]


def _hash_archive(path: Path, sums: dict[str, str], small: dict[str, bytes | None]) -> str | None:
    """Hash an archive's members as they stream past; why it is refused, or None."""
    try:
        total = 0
        with tarfile.open(path, "r|gz") as tar:  # a stream: members are read once, in order
            for member in tar:
                if not member.isfile():
                    continue
                rel = member.name.split("/", 1)[1] if "/" in member.name else member.name
                total += member.size
                if total > MAX_TOTAL_BYTES:
                    return f"{path}: its members hold more than {MAX_TOTAL_BYTES >> 30} GiB; not a radixtop bundle"
                if member.size > MAX_MEMBER_BYTES:
                    return (f"{path}: member {member.name} says it holds {member.size:,} bytes, more than a "
                            f"bundle ever writes ({MAX_MEMBER_BYTES >> 20} MiB); not checked further (not a "
                            "radixtop bundle, or a compression bomb)")
                handle = tar.extractfile(member)
                if handle is None:
                    continue
                if rel in (MANIFEST, SUMS):
                    small[rel] = _read_small(handle, MAX_MANIFEST_BYTES)
                else:
                    sums[rel] = _hash_stream(handle, MAX_MEMBER_BYTES)[0]
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        return f"{path}: not a readable tar.gz ({exc})"
    return None


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

    def observe(self, findings: Any, seen: Callable[[], Any] | None = None) -> bool:
        """``findings``: a diagnosis Report or an iterable of Findings. True if a bundle started now.
        ``seen``: called here, only when a bundle starts, for what the caller saw (take_bundle's
        ``seen``): a UI gathers it on its own thread, at that moment."""
        from radixtop.diagnosis.severity import severity_rank

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
        saw = seen() if seen is not None else None
        self._thread = threading.Thread(target=self._run, args=(live, saw), name="radixtop-autobundle", daemon=True)
        self._thread.start()
        return True

    @property
    def exhausted(self) -> bool:
        """A bundle was taken at the highest severity there is: nothing can fire it again."""
        from radixtop.diagnosis.severity import Severity

        return self.fired_level >= max(Severity)

    def _run(self, live_report: Any, seen: Any) -> None:
        try:
            self.result = take_bundle(
                self.out_dir, url=self.url, logs=self.logs, pid=self.pid,
                reason=f"auto-{self.trigger}", live_report=live_report, seen=seen, **self.options,
            )
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
