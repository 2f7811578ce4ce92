"""What goes into an evidence bundle: one collector per source, each writing files or a note.

Every collector takes a ``sink`` (``radixtop.incident.bundle.bundle.BundleWriter``: it redacts what it
writes) and never raises for an unreadable source: a dead server, a missing driver, a tool that is
not installed or that hangs each become a ``<name>.note.txt`` saying why, so a bundle taken while
the server dies is still complete. External tools run as argv lists with bounded timeouts; nothing
from a log or the network is ever run, and no program that another process names (its argv, its
environment): the server's interpreter runs only as ``radixtop.incident.common.server.server_interpreter``
allows. Each command run is recorded with why (``Sink.ran``), so the bundle says what ran.

Every HTTP GET has one total deadline (``Http``), every tool a timeout, and both stop at once
when the bundle's ``cancel`` event is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import httpx
import psutil

from radixtop.diagnosis.evidence_policy import CONTEXT_AFTER, CONTEXT_BEFORE
from radixtop.incident.common.server import auth_headers, snapshot_process
from radixtop.probes.http import LIVENESS_PATH

if TYPE_CHECKING:
    from radixtop.diagnosis.findings import Report

__all__ = [
    "collect_flight",
    "collect_logs",
    "collect_metrics",
    "collect_nvidia_smi",
    "collect_nvml",
    "collect_processes",
    "collect_server",
    "collect_stacks",
    "collect_torch_env",
]

MAX_HTTP_BYTES = 32 << 20
LOG_TAIL_BYTES = 4 << 20
MAX_PRINTED_TREES = 16  # per log: a print per rank and failure
MAX_PRINTED_NODES = 50_000
MAX_STACK_PROCESSES = 16
RADIX_SNAPSHOT_BUDGET = 5_000
RADIX_EVENTS_LIMIT = 2_000
MIN_CONTEXT = CONTEXT_BEFORE  # the seed's checklist: at least 100 lines before the first occurrence


class Sink(Protocol):
    def text(self, rel: str, text: str) -> None: ...
    def json(self, rel: str, obj: Any) -> None: ...
    def note(self, rel: str, why: str) -> None: ...
    def ran(self, rel: str, argv: Sequence[str], why: str) -> None: ...


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _tail_text(data: bytes | str, lines: int = 20) -> str:
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    return "\n".join(data.strip().splitlines()[-lines:])


# -- HTTP ---------------------------------------------------------------------------------------


class HttpFailed(Exception):
    """A GET with no usable answer: too large, past its deadline, or cancelled; one line."""


class Cancelled(HttpFailed):
    pass


_HTTP_ERRORS = (httpx.HTTPError, HttpFailed)
_CANCEL_POLL_S = 0.05


class Http:
    """GETs on one event loop, each bounded by a total deadline: ``timeout_s`` per GET and the
    step's ``deadline`` (a ``time.monotonic()`` value) for all of them. httpx's own timeout
    applies to each read, so a server that sends a byte every second would hold a plain GET for
    ever; here the whole exchange is a task that is dropped when its time is up or ``cancel``
    is set (checked every 50 ms)."""

    def __init__(
        self, timeout_s: float, *, deadline: float | None = None, cancel: threading.Event | None = None
    ) -> None:
        self.timeout_s = timeout_s
        self.deadline = deadline
        self.cancel = cancel or threading.Event()
        self._loop = asyncio.new_event_loop()
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 2.0)), headers=auth_headers()
        )

    def __enter__(self) -> Http:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._loop.run_until_complete(self._close_client())
        self._loop.close()

    async def _close_client(self) -> None:
        async with asyncio.timeout(1.0):
            await self._client.aclose()

    def get(self, url: str, params: dict[str, Any] | None = None) -> tuple[int, bytes]:
        if self.cancel.is_set():
            raise Cancelled("cancelled")
        budget = self.timeout_s
        if self.deadline is not None:
            budget = min(budget, self.deadline - time.monotonic())
            if budget <= 0:
                raise HttpFailed("not tried: the bundle's network deadline had passed")
        return self._loop.run_until_complete(self._bounded(self._read(url, params), budget))

    async def _bounded(self, coro: Coroutine[Any, Any, tuple[int, bytes]], budget: float) -> tuple[int, bytes]:
        task = asyncio.ensure_future(coro)
        end = time.monotonic() + budget
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=max(0.0, min(_CANCEL_POLL_S, end - time.monotonic())))
                if done:
                    return task.result()
                if self.cancel.is_set():
                    raise Cancelled("cancelled")
                if time.monotonic() >= end:
                    raise HttpFailed(f"no complete answer within {budget:.1f} s")
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def _read(self, url: str, params: dict[str, Any] | None) -> tuple[int, bytes]:
        async with self._client.stream("GET", url, params=params) as response:
            data = bytearray()
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > MAX_HTTP_BYTES:
                    raise HttpFailed(f"answer larger than {MAX_HTTP_BYTES >> 20} MiB")
            return response.status_code, bytes(data)


def collect_server(
    sink: Sink, url: str | None, *, pid: int | None = None, instruments: Sequence[str] = (), timeout_s: float = 3.0,
    deadline: float | None = None, cancel: threading.Event | None = None,
) -> dict[str, Any] | None:
    """Whether the HTTP front answers and /server_info, then the radix snapshots and events of the ranks' debug
    endpoints: those given, else those /server_info lists (the simulator), else those found among
    the server's listening ports (a real SGLang's /server_info does not know them)."""
    if not url:
        sink.note("server/server_info.json", "no server URL given (--url); server state not fetched")
        if instruments:
            with Http(timeout_s, deadline=deadline, cancel=cancel) as client:
                _collect_radix(sink, client, None, list(instruments))
        return None
    info: dict[str, Any] | None = None
    with Http(timeout_s, deadline=deadline, cancel=cancel) as client:
        try:  # never SGLang's /health: it runs a generation through the scheduler under investigation
            status, body = client.get(f"{url}{LIVENESS_PATH}")
            sink.text("server/health.txt", f"GET {url}{LIVENESS_PATH} -> HTTP {status} (the HTTP front; /health is "
                      "not asked, as it generates through the scheduler)\n")
        except _HTTP_ERRORS as exc:
            sink.note("server/health.txt", f"GET {url}{LIVENESS_PATH} failed: {_one_line(exc)}")
        try:
            status, body = client.get(f"{url}/server_info")
            if status == 404:  # older releases only have the get_ alias
                status, body = client.get(f"{url}/get_server_info")
            if status != 200:
                sink.note("server/server_info.json", f"GET /server_info answered HTTP {status}: {_tail_text(body, 3)}")
            else:
                try:
                    info = json.loads(body)
                    sink.json("server/server_info.json", info)
                except (ValueError, RecursionError) as exc:
                    info = None
                    why = "is nested too deeply to parse" if isinstance(exc, RecursionError) else "is not JSON"
                    sink.text("server/server_info.txt", body.decode("utf-8", "replace"))
                    sink.note("server/server_info.json", f"/server_info's answer {why}; its text is in server_info.txt")
        except _HTTP_ERRORS as exc:
            sink.note("server/server_info.json", f"GET {url}/server_info failed: {_one_line(exc)}")
        urls = list(instruments) or _listed_instruments(sink, info) or _found_instruments(client, pid)
        _collect_radix(sink, client, info, urls)
    return info if isinstance(info, dict) else None


def _listed_instruments(sink: Sink, info: Any) -> list[str]:
    """The endpoints /server_info lists, under the rule for addresses from the network
    (``radixtop.probes.radix.instrument_urls``: loopback only); a note names any left out."""
    from radixtop.probes.radix import instrument_urls

    listed = info.get("radixtop_instrument") if isinstance(info, dict) else None
    if not isinstance(listed, list):
        return []
    dropped: list[str] = []
    urls = instrument_urls(listed, dropped)
    if dropped:
        sink.note(
            "radix/listed-instruments",
            f"/server_info lists debug endpoints that were not contacted: {', '.join(map(repr, dropped[:8]))}. "
            "radixtop contacts an address from the network only on loopback; pass --instrument URL to "
            "read one elsewhere",
        )
    return urls


def _found_instruments(client: Http, pid: int | None) -> list[str]:
    """The endpoints among the server's listening ports (as discovery finds them), in rank order."""
    from radixtop.probes.discovery import instrument_candidates, rank_of_health
    from radixtop.schema import HEALTH_PATH

    if pid is None:
        return []
    found = []
    for url in instrument_candidates(pid):
        try:
            status, body = client.get(url + HEALTH_PATH)
        except _HTTP_ERRORS:
            continue
        rank = rank_of_health(status, body)
        if rank is not None:
            found.append((rank, url))
    return [url for _, url in sorted(found)]


def _collect_radix(sink: Sink, client: Http, info: Any, urls: list[Any]) -> None:
    from radixtop.schema import BUDGET_PARAM, EVENTS_PATH, LIMIT_PARAM, SNAPSHOT_PATH

    if not urls:
        why = (
            "no radixtop debug endpoint: /server_info lists none and none answers on the server's ports; "
            "the radix instrument is not loaded in this server (RADIXTOP_INSTRUMENT=1, see radixtop's "
            "docs/instrument.md), or pass --instrument URL, so no tree snapshot was taken"
            if isinstance(info, dict)
            else "no /server_info and no --instrument, so the radix debug endpoints are unknown"
        )
        sink.note("radix/snapshots.json", why)
        return
    for rank, endpoint in enumerate(urls[:64]):  # given by the user, or filtered by instrument_urls
        if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
            sink.note(f"radix/rank{rank}-snapshot.json", f"instrument URL {endpoint!r} is not an http URL; not fetched")
            continue
        base = endpoint.rstrip("/")
        for kind, path, params in (
            ("snapshot", SNAPSHOT_PATH, {BUDGET_PARAM: RADIX_SNAPSHOT_BUDGET}),
            ("events", EVENTS_PATH, {LIMIT_PARAM: RADIX_EVENTS_LIMIT}),
        ):
            rel = f"radix/rank{rank}-{kind}.json"
            try:
                status, body = client.get(f"{base}{path}", params)
            except _HTTP_ERRORS as exc:
                sink.note(rel, f"GET {base}{path} failed: {_one_line(exc)}")
                continue
            if status != 200:
                sink.note(rel, f"GET {base}{path} answered HTTP {status}: {_tail_text(body, 3)}")
                continue
            try:
                sink.json(rel, json.loads(body))
            except (ValueError, RecursionError) as exc:
                why = "an answer nested too deeply to parse" if isinstance(exc, RecursionError) else "no JSON"
                sink.text(rel.replace(".json", ".txt"), body.decode("utf-8", "replace"))
                sink.note(rel, f"GET {base}{path} gave {why}; its text is kept beside")


def collect_metrics(
    sink: Sink, url: str | None, *, timeout_s: float = 3.0, deadline: float | None = None,
    cancel: threading.Event | None = None,
) -> None:
    if not url:
        sink.note("server/metrics.txt", "no server URL given (--url)")
        return
    with Http(timeout_s, deadline=deadline, cancel=cancel) as client:
        try:
            status, body = client.get(f"{url}/metrics")
        except _HTTP_ERRORS as exc:
            sink.note("server/metrics.txt", f"GET {url}/metrics failed: {_one_line(exc)}")
            return
    if status == 404:
        sink.note("server/metrics.txt", "no /metrics: the server runs without --enable-metrics")
    elif status != 200:
        sink.note("server/metrics.txt", f"GET /metrics answered HTTP {status}")
    else:
        sink.text("server/metrics.txt", body.decode("utf-8", "replace"))


# -- the machine ----------------------------------------------------------------------------------


def collect_nvml(sink: Sink) -> None:
    """Per-GPU memory, utilisation, temperature, power and processes, through the probes' NVML
    choke point (radixtop.probes.gpu): a query that fails is a problem of its GPU, NVML that
    cannot start is a note."""
    import dataclasses

    from radixtop.probes.gpu import read_once

    sample = read_once()
    if sample.status.state not in ("ok", "degraded"):
        sink.note(
            "gpu/nvml.json",
            f"NVML {sample.status.state}: {sample.status.message} (no NVIDIA driver on this machine?)",
        )
        return
    sink.json("gpu/nvml.json", {
        "driver_version": sample.driver,
        "state": sample.status.state,
        "devices": [dataclasses.asdict(gpu) for gpu in sample.gpus],
        "xid_note": sample.xid_note,
    })


def collect_processes(sink: Sink, pid: int | None) -> list[psutil.Process]:
    """psutil's view of the server's process tree (environment redacted by the sink)."""
    from radixtop.incident.common.server import process_tree

    if pid is None:
        sink.note(
            "procs/processes.json",
            "the server's pid is unknown (nothing local listens on the URL's port, or it is not ours "
            "to see); pass --pid",
        )
        return []
    tree = process_tree(pid)
    if not tree:
        sink.note("procs/processes.json", f"process {pid} is gone or not readable")
        return []
    sink.json("procs/processes.json", {"root_pid": pid, "processes": [snapshot_process(p) for p in tree]})
    return tree


# -- the flight recorder's files ---------------------------------------------------------------


def flight_sources(url: str | None, pid: int | None, given: Sequence[str] = ()) -> tuple[int | None, list[Path]]:
    """The server's pid (as last seen, when it is gone) and where its flight recorder may have
    written: the directories its endpoints named (the TUI saw them in /health), the one its
    environment chooses (as last seen), and radixtop's own default."""
    from radixtop.incident.common.sighting import load_sighting
    from radixtop.instrument.flight import flight_dir

    dirs = [Path(d) for d in given if d]
    sighting = load_sighting(url) if url else None
    if sighting is not None:
        pid = pid if pid is not None else sighting.pid
        if sighting.env:
            dirs.append(flight_dir(sighting.env))
    dirs.append(flight_dir())
    return pid, list(dict.fromkeys(dirs))


def collect_flight(sink: Sink, pid: int | None, dirs: Sequence[Path]) -> list[Any]:
    """The flight records of the server's ranks (probes/flight.py), written by its scheduler
    processes as the cache failed: those whose process is ``pid`` or a child of it, or, with no
    pid known, those written in the last hour (said in a note). Returns them parsed."""
    from radixtop.probes.flight import read_flight_records

    read = read_flight_records(dirs, pid)
    for found in read.records:
        sink.json(f"flight/{found.path.name}", found.record.to_dict())
    where = ", ".join(str(d) for d in dirs)
    if not read.records:
        whose = f"process {pid} or its children" if pid is not None else "any server in the last hour"
        sink.note(
            "flight/records",
            f"no flight record of {whose} in {where}: no rank's cache failed through radixtop's instrument",
        )
    elif pid is None:
        sink.note(
            "flight/matched-by-time",
            f"the server's pid is unknown: these are the records written in the last hour in {where}",
        )
    if read.skipped:
        sink.note("flight/unreadable", "; ".join(read.skipped[:20]))
    return [found.record for found in read.records]


def _is_python(proc: psutil.Process) -> bool:
    try:
        return "python" in proc.name().lower() or any("python" in Path(a).name for a in proc.cmdline()[:1])
    except (psutil.Error, OSError):
        return False


def find_tool(name: str) -> str | None:
    """A command on PATH, else beside radixtop's own interpreter: installed with radixtop (its
    venv, pipx) but not on PATH when radixtop is run as /path/to/venv/bin/radixtop. Relative PATH
    entries (a log directory that happens to be the current one) are not searched; never a path
    from the server's argv or environment."""
    search = os.pathsep.join(d for d in os.environ.get("PATH", os.defpath).split(os.pathsep) if os.path.isabs(d))
    found = shutil.which(name, path=search)
    if found is None:
        beside = Path(sys.executable).parent / name
        if beside.is_file() and os.access(beside, os.X_OK):
            found = str(beside)
    return found


def _trusted_tool(sink: Sink, rel: str, name: str, missing: str) -> str | None:
    """``find_tool(name)`` when it passes the same ownership rule as the server's interpreter."""
    from radixtop.incident.common.server import executable_trust

    found = find_tool(name)
    if found is None:
        sink.note(rel, missing)
        return None
    why = executable_trust(found)
    if why is not None:
        sink.note(rel, f"{found} was not run: {why}")
        return None
    return found


def collect_stacks(
    sink: Sink, processes: Sequence[psutil.Process], *, timeout_s: float = 10.0, cancel: threading.Event | None = None
) -> None:
    """``py-spy dump`` of every Python process in the tree (the scheduler's stack is the one that
    matters when it hangs). py-spy pauses each process for a moment; locals are never dumped.

    py-spy is radixtop's own (PATH or beside radixtop's interpreter, owned by you or root); it
    reads the server's memory by pid and runs nothing the server chose."""
    if not processes:
        sink.note("stacks/py-spy.txt", "no server process known, so no stacks were taken")
        return
    py_spy = _trusted_tool(
        sink, "stacks/py-spy.txt", "py-spy",
        "py-spy is not installed, so the server's Python stacks were not captured "
        "(pip install py-spy, then take the bundle again while the server still runs)",
    )
    if py_spy is None:
        return
    pythons = [p for p in processes if _is_python(p)][:MAX_STACK_PROCESSES]
    if not pythons:
        sink.note("stacks/py-spy.txt", "no Python process in the server's tree")
        return
    for proc in pythons:
        if cancel is not None and cancel.is_set():
            return
        _run_tool(
            sink, f"stacks/py-spy-{proc.pid}.txt", [py_spy, "dump", "--pid", str(proc.pid)], timeout_s,
            f"py-spy dump --pid {proc.pid}",
            why=f"Python stacks of server process {proc.pid} (radixtop's py-spy: {py_spy})",
            cancel=cancel, partial=False,
        )


def _run(argv: list[str], timeout_s: float, cancel: threading.Event | None) -> tuple[int | None, bytes, bytes, str]:
    """Run argv (its own session, so that its children stop with it); (exit status or None,
    stdout, stderr, why it was stopped). Stopped at ``timeout_s`` or at once on ``cancel``."""
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )
    end = time.monotonic() + timeout_s
    while True:
        try:
            out, err = proc.communicate(timeout=_CANCEL_POLL_S * 2)
            return proc.returncode, out, err, ""
        except subprocess.TimeoutExpired:
            if cancel is not None and cancel.is_set():
                why = "cancelled"
            elif time.monotonic() >= end:
                why = f"did not finish within {timeout_s:.0f} s"
            else:
                continue
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            proc.communicate(timeout=2)
        except subprocess.TimeoutExpired:  # a grandchild that left the group holds the pipes
            proc.kill()
            proc.wait()
        return None, b"", b"", why


def _run_tool(
    sink: Sink, rel: str, argv: list[str], timeout_s: float, what: str, *, why: str = "",
    cancel: threading.Event | None = None, partial: bool = True,
) -> None:
    sink.ran(rel, argv, why or what)
    try:
        code, out_bytes, err, stopped = _run(argv, timeout_s, cancel)
    except OSError as exc:
        sink.note(rel, f"{what} could not run: {_one_line(exc)}")
        return
    if code is None:
        sink.note(rel, f"{what} {stopped}")
        return
    out = out_bytes.decode("utf-8", "replace")
    if code != 0:
        sink.note(rel, f"{what} failed (exit {code}): {_tail_text(err or out_bytes, 8)}")
        if partial and out.strip():
            sink.text(rel.replace(".txt", ".partial.txt"), out)
        return
    sink.text(rel, out)


def collect_nvidia_smi(sink: Sink, *, timeout_s: float = 15.0, cancel: threading.Event | None = None) -> None:
    exe = _trusted_tool(sink, "gpu/nvidia-smi.txt", "nvidia-smi",
                        "nvidia-smi is not on PATH (no NVIDIA driver on this machine?)")
    if exe is None:
        return
    _run_tool(sink, "gpu/nvidia-smi.txt", [exe], timeout_s, "nvidia-smi", why="GPU state", cancel=cancel)
    if cancel is None or not cancel.is_set():
        _run_tool(
            sink, "gpu/nvidia-smi-q.txt", [exe, "-q"], timeout_s, "nvidia-smi -q", why="GPU details", cancel=cancel
        )


def collect_torch_env(
    sink: Sink, python: str | None, why: str = "", *, timeout_s: float = 60.0, cancel: threading.Event | None = None
) -> None:
    """``<the server's python> -I -m torch.utils.collect_env``: versions of torch, CUDA, drivers.

    ``python`` is what :func:`radixtop.incident.common.server.server_interpreter` allows, ``why`` its
    reason (or why there is none). ``-I``: neither the current directory nor PYTHON* variables
    add code to what runs.
    """
    if not python:
        sink.note(
            "env/collect_env.txt",
            f"collect_env was not run: {why or 'the server interpreter is unknown'}. If you trust the "
            "server's interpreter, run `<its python> -m torch.utils.collect_env` yourself",
        )
        return
    _run_tool(sink, "env/collect_env.txt", [python, "-I", "-m", "torch.utils.collect_env"], timeout_s,
              f"{python} -I -m torch.utils.collect_env", why=why, cancel=cancel)


# -- logs -----------------------------------------------------------------------------------------


def collect_logs(
    sink: Sink,
    logs: Sequence[str],
    *,
    signature_files: Sequence[str] = (),
    context: int = MIN_CONTEXT,
    after: int = CONTEXT_AFTER,
    live_report: Report | None = None,
) -> Report | None:
    """Findings over the logs, each signature's first occurrence with its context, and each log's
    tail. This reads only files, so it works whatever state the server is in."""
    from radixtop.diagnosis.catalog import CatalogError, load_catalog
    from radixtop.diagnosis.findings import FindingsBuilder
    from radixtop.diagnosis.matcher import Matcher
    from radixtop.probes.logscan import ScanInputError, check_input, scan_into

    if live_report is not None:
        sink.json("findings-live.json", live_report.to_json())
    if not logs:
        sink.note(
            "findings.json",
            "no log given (--log), so no log evidence; findings-live.json has the UI's view if present",
        )
        return None
    usable: list[str] = []
    for path in logs:
        try:
            check_input(path)
            usable.append(path)
        except ScanInputError as exc:
            sink.note(f"logs/{_safe_name(path)}", str(exc))
    if not usable:
        sink.note("findings.json", "none of the logs could be read (see logs/*.note.txt)")
        return None
    try:
        catalog = load_catalog(list(signature_files))
    except CatalogError as exc:
        sink.note("findings.json", f"signature catalog unusable: {exc}")
        return None
    context = max(MIN_CONTEXT, context)
    matcher = Matcher(catalog.signatures)
    builder = FindingsBuilder(catalog, matcher=matcher, context=context, after=after)
    try:
        summaries = scan_into(builder, usable, matcher, context=context, after=after)
    except ScanInputError as exc:
        sink.note("findings.json", f"scanning stopped: {exc}")
        return None
    report = builder.report()
    doc = report.to_json()
    doc["logs"] = [{"file": s.file, "lines": s.lines, "hits": s.hits, "note": s.note} for s in summaries]
    doc["engine"] = matcher.engine
    sink.json("findings.json", doc)
    if not report.findings:
        sink.note("evidence/first-occurrences.log", "no known failure signature in the logs")
    for i, finding in enumerate(report.findings, 1):
        sink.text(f"evidence/{i:02d}-{finding.signature.id}.log", _evidence_text(finding))
    for i, path in enumerate(usable, 1):
        _copy_tail(sink, path, f"logs/{i:02d}-{_safe_name(path)}.tail.log")
    return report


def _evidence_text(finding: Any) -> str:
    sig, occ = finding.signature, finding.first
    head = [
        f"# signature: {sig.id} ({sig.severity}): {sig.title}",
        f"# first occurrence: {occ.file}:{occ.line}"
        + (f"  time {occ.time}" if occ.time else "")
        + (f"  rank {occ.rank}" if occ.rank else ""),
        f"# occurrences: {finding.count}",
        (
            f"# {len(finding.context_before)} lines before, the line itself (>>>), "
            f"{len(finding.context_after)} lines after"
        ),
        "",
    ]
    body = [*finding.context_before, f">>> {occ.text}", *finding.context_after]
    return "\n".join(head + body) + "\n"


def _safe_name(path: str) -> str:
    name = Path(path).name or "log"
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:80]


def read_tail(path: str) -> tuple[bytes, int, bool]:
    """The last LOG_TAIL_BYTES of a log file, from a whole line: (the bytes, the file's size,
    whether it was cut). ValueError (one line, the path first) for stdin, a compressed file or a FIFO, whose
    tail cannot be read again; OSError as the system raises it."""
    if path == "-" or path.endswith(".gz"):
        raise ValueError(f"{path}: a compressed file or stdin; its evidence is in evidence/, its tail is not copied")
    # a FIFO was read once by the scan; opening it again would wait for a writer
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError(f"{path}: not a regular file (a FIFO?); its evidence is in evidence/, its tail is not copied")
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        start = max(0, size - LOG_TAIL_BYTES)
        fh.seek(start)
        data = fh.read(LOG_TAIL_BYTES)
    if start > 0:  # start at a whole line
        cut = data.find(b"\n")
        data = data[cut + 1 :] if cut >= 0 else data
    return data, size, start > 0


def _copy_tail(sink: Sink, path: str, rel: str) -> None:
    try:
        data, size, cut = read_tail(path)
    except ValueError as exc:
        sink.note(rel, str(exc))
        return
    except OSError as exc:
        sink.note(rel, f"{path}: {_one_line(exc)}")
        return
    header = f"# last {len(data):,} bytes of {path} ({size:,} bytes)\n" if cut else ""
    text = data.decode("utf-8", "replace")
    sink.text(rel, header + text)
    _keep_printed_trees(sink, path, text, rel.removesuffix(".tail.log"))
    _keep_pyspy_dumps(sink, path, text, rel.removesuffix(".tail.log"))


def _keep_pyspy_dumps(sink: Sink, path: str, tail: str, stem: str) -> None:
    """SGLang's own py-spy dumps of its schedulers in the log's tail: where each one was."""
    if "Pyspy dump for PID" not in tail:
        return
    from radixtop.diagnosis.pyspy import read_dumps, where

    stacks = read_dumps(tail.splitlines())
    if not stacks:
        return
    lines = [f"# SGLang's py-spy dumps in the tail of {path}: where each process was (innermost frame first)",
             *where(stacks), ""]
    for s in stacks:
        name = f' "{s.name}"' if s.name else ""
        lines += [f"PID {s.pid} thread {s.thread}{name} ({s.state})", *(f"    {f}" for f in s.frames), ""]
    sink.text(f"stacks/sglang-pyspy-{stem.removeprefix('logs/')}.txt", "\n".join(lines))


def _keep_printed_trees(sink: Sink, path: str, tail: str, stem: str) -> None:
    """The trees SGLang printed at a failure (diagnosis/printed_tree.py), read from the log's tail
    (where a failure's print is), each as a snapshot in the debug endpoint's shape."""
    from radixtop.diagnosis.printed_tree import printed_snapshot, read_printed_trees

    for k, tree in enumerate(read_printed_trees(tail.splitlines())[:MAX_PRINTED_TREES], 1):
        t = tree.trigger
        sink.json(f"radix/printed/{stem.removeprefix('logs/')}-{k}.json", {
            "log": path,
            "tail_lines": [tree.first_line, tree.last_line],  # line numbers in the copied tail
            "what": tree.describe(),
            "after": None if t is None else {
                "line": t.text, "rank": t.rank, "time": t.epoch, "tokens_asked": t.requested,
                "available": t.available, "evictable": t.evictable,
            },
            "snapshot": printed_snapshot(tree, rank=tree.rank_number, seq=k, budget=MAX_PRINTED_NODES).to_dict(),
        })
