"""Another node watched live through the user's OpenSSH: its logs streamed into local spool files,
its ranks' debug endpoints and its server's URL forwarded to loopback ports here.

`NodeLink` starts from the node's report (probes/remote.py `reach`: what radixtop found there, and
the clock skew). Two ssh sessions, both argv lists with BatchMode (nothing prompts):
- the stream: `ssh HOST -- radixtop follow --json` (incident/follow.py). Each record is decoded as
  hostile (a size cap per record, the shape checked, a line kept one line) and its lines appended
  to a spool file (probes/spool.py: cut back past its cap, which the follower reads as a
  truncation), `<node>/<log's name>@<node>.log`, the log pane's label for it; the log pane follows
  it as it follows any file (rotation-safe, its findings' context and evidence included). When the
  stream ends it is started again (1, 2, 4 ... 30 s apart), sending only new lines;
- the forwards: `ssh -N -o ExitOnForwardFailure=yes -L 127.0.0.1:LOCAL:127.0.0.1:REMOTE ...` for
  every endpoint the report names on the node's loopback (a URL naming any other host is not
  forwarded: the report is the node's word, and radixtop reaches nothing it names beyond that
  node's own loopback). Both ends stay on loopback.
Every failure is one line in `health()`; nothing here raises into the UI.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

from radixtop.bounded import load_json
from radixtop.diagnosis.findings import NodeClock
from radixtop.probes.flight import FLIGHT_MAX_BYTES
from radixtop.probes.node_report import GpuReport, NodeReport, ServerReport
from radixtop.probes.remote import NodeAnswer, check_host, ssh_argv, ssh_options
from radixtop.probes.spool import Spool, spool_name
from radixtop.probes.ssh_failure import explain_failure
from radixtop.rundir import write_file
from radixtop.schema import FlightRecord, encode_json

__all__ = ["LinkHealth", "NodeGpus", "NodeLink", "node_name"]

# A record of follow's: MAX_RUN lines of at most 64 KiB, or a flight record (at most FLIGHT_MAX_BYTES).
MAX_RECORD_BYTES = FLIGHT_MAX_BYTES + (1 << 20)
_FLIGHT_NAME = re.compile(r"rank\d{1,6}-pid\d{1,10}\.json")
MAX_LINE_CHARS = 65_536
MAX_FORWARDS = 64
RETRY_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def node_name(host: str) -> str:
    """The node's name in tags and folders: the host as ssh was given it, without a user@."""
    return host.rsplit("@", 1)[-1]


@dataclass(frozen=True, slots=True)
class LinkHealth:
    node: str
    state: str  # "connecting", "streaming", "retrying", "stopped"
    detail: str  # one line: what went wrong and what to do, or ""
    lines: int  # lines received
    forwards: int  # endpoints forwarded
    clock: str  # its clock against this one, as measured when it was reached


@dataclass(frozen=True, slots=True)
class NodeGpus:
    node: str
    gpus: tuple[GpuReport, ...]
    unavailable: str  # why there are none, when there are none
    at: float  # time.time() here when it came


@dataclass
class _Forward:
    remote: str  # the URL on the node
    local: str  # the URL here
    remote_port: int
    local_port: int


@dataclass
class NodeLink:
    answer: NodeAnswer
    spool: Spool
    url: str | None = None  # the server watched there, as its URL there (None: every one found)
    ssh_config: str | None = None
    command: str = "radixtop"
    backlog: int = 5_000
    forwards: list[_Forward] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _errs: dict[int, IO[bytes]] = field(default_factory=dict)  # pid -> its stderr's file
    _forwarder: subprocess.Popen[bytes] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _state: str = "connecting"
    _detail: str = ""
    _lines: int = 0
    _thread: threading.Thread | None = None
    _lost_forwards: str = ""
    _spools: dict[str, str] = field(default_factory=dict)  # spool file name -> the log's path there
    _gpus: NodeGpus | None = None

    def gpus(self) -> NodeGpus | None:
        """The node's GPUs as its stream last reported them (None: not yet)."""
        with self._lock:
            return self._gpus

    @property
    def host(self) -> str:
        return check_host(self.answer.host)

    @property
    def name(self) -> str:
        return node_name(self.answer.host)

    @property
    def spool_dir(self) -> Path:
        return Path(self.spool.dir) / spool_name(self.name)

    def spool_path(self, remote_path: str) -> Path:
        """The spool file of a log on the node: the log's name at the node's (the log pane's label),
        with a hash of its path where another log of the node has that name."""
        base = os.path.basename(remote_path).removesuffix(".log") or "log"
        path = self.spool_dir / f"{spool_name(base)}@{spool_name(self.name)}.log"
        taken = self._spools.setdefault(path.name, remote_path)
        if taken != remote_path:
            digest = hashlib.blake2b(remote_path.encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()
            path = path.with_name(f"{spool_name(base)}-{digest}@{spool_name(self.name)}.log")
        return path

    @property
    def spool_pattern(self) -> str:
        return str(self.spool_dir / "*.log")

    def clock(self) -> NodeClock:
        """The node's name and what to add to its log times to put them on this clock."""
        skew = self.answer.skew
        return NodeClock(self.name, -skew.correction_s if skew is not None else 0.0)

    def servers(self) -> list[ServerReport]:
        """The servers watched there: the one at `url`, else every one the report names."""
        report = self.answer.report
        found = list(report.servers) if report is not None else []
        return [s for s in found if self.url is None or (s.url or "").rstrip("/") == self.url.rstrip("/")]

    def logs(self) -> list[str]:
        return list(dict.fromkeys(s.log_path for s in self.servers() if s.log_path))

    def instrument_urls(self) -> list[str]:
        return list(dict.fromkeys(u for s in self.servers() for u in s.instrument_urls))

    def endpoints(self) -> list[str]:
        """The URLs on the node to forward: its servers' and their ranks' debug endpoints, those on
        its loopback only."""
        urls = [u for s in self.servers() for u in (s.url, *s.instrument_urls) if u]
        return [u for u in dict.fromkeys(urls) if _loopback_port(u) is not None][:MAX_FORWARDS]

    def local_url(self, remote: str) -> str | None:
        return next((f.local for f in self.forwards if f.remote == remote), None)

    def start(self) -> None:
        """The spool files of the logs the report names (so the follower finds them at once), the
        forwards, and the stream's thread."""
        self.spool_dir.mkdir(exist_ok=True, mode=0o700)
        for path in self.logs():
            self.spool_path(path).touch(mode=0o600)
        self._forward()
        self._thread = threading.Thread(target=self._stream_loop, name=f"radixtop-node-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            procs, self._procs = self._procs, []
        for proc in procs:
            _kill(proc)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._set("stopped", self._detail)

    def health(self) -> LinkHealth:
        """The stream's state, and the forwards' where their ssh has exited (the endpoints are gone)."""
        forwarder, forwards = self._forwarder, len(self.forwards)
        ended = forwarder is not None and forwarder.poll() is not None
        if forwarder is not None and ended and not self._lost_forwards and not self._stop.is_set():
            why = explain_failure(self.host, forwarder.returncode or 0, self._stderr(forwarder), "ssh")
            self._lost_forwards = f"its endpoints' forwards ended ({why})"
        with self._lock:
            detail = "; ".join(x for x in (self._detail, self._lost_forwards) if x)
            return LinkHealth(self.name, self._state, detail, self._lines, forwards if not self._lost_forwards else 0,
                              self.answer.skew.text() if self.answer.skew is not None else "clock unknown")

    # -- the forwards ------------------------------------------------------------------------------

    def _forward(self) -> None:
        wanted = []
        for url in self.endpoints():
            port = _loopback_port(url)
            if port is None:
                continue
            local_port = _free_port()
            split = urlsplit(url)
            local = f"{split.scheme}://127.0.0.1:{local_port}{split.path.rstrip('/')}"
            wanted.append(_Forward(url, local, port, local_port))
        if not wanted:
            return
        argv = ssh_options(ssh_config=self.ssh_config, forwarding=True) + ["-N", "-o", "ExitOnForwardFailure=yes"]
        for f in wanted:
            argv += ["-L", f"127.0.0.1:{f.local_port}:127.0.0.1:{f.remote_port}"]
        argv.append(self.host)
        self._forwarder = self._spawn(argv, stdout=subprocess.DEVNULL)
        if self._forwarder is not None:
            self.forwards = wanted

    # -- the stream --------------------------------------------------------------------------------

    def _stream_loop(self) -> None:
        attempt, backlog = 0, self.backlog
        while not self._stop.is_set():  # ends at stop(); each pass waits RETRY_S at least once failed
            started = time.monotonic()
            error = self._stream_once(backlog)
            if self._stop.is_set():
                return
            backlog = 0  # what was sent before is in the spool already
            attempt = 0 if time.monotonic() - started > 60 else attempt + 1
            wait = RETRY_S[min(attempt, len(RETRY_S) - 1)]
            self._set("retrying", f"{error}; trying again in {wait:.0f} s")
            self._stop.wait(wait)

    def _stream_once(self, backlog: int) -> str:
        """One session of the stream, until it ends; the one line saying why it ended."""
        args = ["follow", "--json", "--backlog", str(backlog)]
        if self.url is not None:  # what the user typed, never what the node said
            args += ["--url", self.url]
        argv = ssh_argv(self.host, ssh_config=self.ssh_config, command=self.command, args=args)
        proc = self._spawn(argv, stdout=subprocess.PIPE)
        if proc is None:
            return self._detail
        assert proc.stdout is not None
        self._set("connecting", "")
        spools: dict[str, Path] = {}
        bad = ""
        try:
            for raw in iter(lambda: proc.stdout.readline(MAX_RECORD_BYTES + 1), b""):  # type: ignore[union-attr]
                if len(raw) > MAX_RECORD_BYTES or not raw.endswith(b"\n"):
                    bad = f"{self.name}: a record of its log stream is over {MAX_RECORD_BYTES} bytes; stream stopped"
                    break
                problem = self._take(raw, spools)
                if problem:
                    bad = f"{self.name}: {problem}; stream stopped"
                    break
        finally:
            _kill(proc)
            code = proc.wait()
            proc.stdout.close()
            err = self._stderr(proc)
            with self._lock:
                if proc in self._procs:
                    self._procs.remove(proc)
        if bad:
            return bad
        if code in (0, -signal.SIGKILL) and not err.strip():
            return f"{self.name}: its log stream ended"
        return explain_failure(self.host, code, err, self.command, ("follow", "--json"))

    def _take(self, raw: bytes, spools: dict[str, Path]) -> str:
        """One record into the spool; "" or what was wrong with it."""
        try:
            record = load_json(raw, "its log stream", max_bytes=MAX_RECORD_BYTES)
        except ValueError:
            return "its log stream sent something that is not JSON (is `radixtop follow` there this version?)"
        if not isinstance(record, dict):
            return "its log stream sent a record that is not an object"
        if "flight" in record:
            return self._flight(record.get("flight"), record.get("record"))
        if "lines" not in record:
            if "report" in record:
                try:
                    report = NodeReport.from_dict(record["report"])
                except ValueError as exc:
                    return f"its GPU report: {exc}"
                with self._lock:
                    self._gpus = NodeGpus(self.name, report.gpus, report.gpus_unavailable, time.time())
            if "logs" in record or "time" in record:
                self._set("streaming", "")
                return ""
            return "its log stream sent a record of no known kind"
        log, lines = record.get("log"), record.get("lines")
        if not isinstance(log, str) or not isinstance(lines, list) or not all(isinstance(x, str) for x in lines):
            return "its log stream sent a malformed record"
        path = spools.get(log)
        if path is None:
            path = spools[log] = self.spool_path(log)
        self.spool.append(str(path), (line[:MAX_LINE_CHARS].replace("\n", " ").replace("\r", " ") for line in lines))
        with self._lock:
            self._lines += len(lines)
            self._state = "streaming"
            self._detail = ""
        return ""

    def _flight(self, name: object, record: object) -> str:
        """A rank's flight record from the node, checked against the schema, into the node's flight
        folder here (read by the radix pane's FlightProbe as another node's); "" or what was wrong."""
        if not isinstance(name, str) or not _FLIGHT_NAME.fullmatch(name):
            return "its log stream sent a flight record under a name that is not rankN-pidN.json"
        try:
            parsed = FlightRecord.from_dict(record)
        except ValueError as exc:
            return f"its flight record {name}: {str(exc).splitlines()[0] if str(exc) else 'malformed'}"
        self.flight_dir.mkdir(exist_ok=True, mode=0o700)
        write_file(self.flight_dir / name, encode_json(parsed.to_dict()))
        return ""

    @property
    def flight_dir(self) -> Path:
        return self.spool_dir / "flight"

    # -- processes ---------------------------------------------------------------------------------

    def _spawn(self, argv: Sequence[str], *, stdout: int) -> subprocess.Popen[bytes] | None:
        """ssh in its own process group, its stderr into an unnamed file (a pipe nobody reads while
        the stream runs would fill and stall it)."""
        err = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=stdout, stderr=err,
                                    start_new_session=True)
        except FileNotFoundError:
            err.close()
            self._set("retrying", "the OpenSSH client (ssh) is not installed here: install openssh-client")
            return None
        except OSError as exc:
            err.close()
            self._set("retrying", f"{self.name}: could not start ssh ({exc.strerror or exc})")
            return None
        with self._lock:
            self._procs.append(proc)
            self._errs[proc.pid] = err
        if self._stop.is_set():
            _kill(proc)
        return proc

    def _stderr(self, proc: subprocess.Popen[bytes]) -> str:
        """What ssh (and radixtop there) said on stderr, once it has exited; the file closed."""
        with self._lock:
            err = self._errs.pop(proc.pid, None)
        if err is None:
            return ""
        with err:
            err.seek(0)
            return err.read(64 * 1024).decode("utf-8", "replace")

    def _set(self, state: str, detail: str) -> None:
        with self._lock:
            self._state, self._detail = state, detail


def _loopback_port(url: str) -> int | None:
    try:
        split = urlsplit(url)
        port = split.port
    except ValueError:
        return None
    if split.scheme not in ("http", "https") or split.hostname not in _LOOPBACK or port is None:
        return None
    return port


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
