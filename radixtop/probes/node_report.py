"""What `radixtop discover --json` prints about one node, as a typed record: its servers (URL,
ports, log, the ranks' debug endpoints, processes), its GPUs, its hostname and its wall-clock time.

The same record crosses machines: `radixtop --node HOST` reads another node's over ssh, so
`NodeReport.from_dict` treats its input as hostile. It is decoded by radixtop.bounded (a size cap,
nesting cut), every field is checked for its type and size, every list is capped, every string is
cut and made printable (no escape sequence from another machine reaches the terminal), and each
failure is one ValueError line naming the field. Fields it does not know are ignored: a newer
radixtop on the node may add some; a newer format number is refused, with what to do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from radixtop.bounded import load_json
from radixtop.textsafe import printable

__all__ = ["FORMAT", "MAX_REPORT_BYTES", "GpuReport", "NodeReport", "ProcessReport", "ServerReport",
           "parse_node_report"]

FORMAT = 1  # the "radixtop_node_report" field: bumped when a field changes meaning
FORMAT_KEY = "radixtop_node_report"
MAX_REPORT_BYTES = 2 * 1024 * 1024  # a node with 32 servers of 256 processes each stays well under
MAX_TEXT = 4096  # a path, a URL, a problem line
MAX_SERVERS = 32  # as discovery's MAX_CANDIDATES
MAX_PROCESSES = 256  # as the process probe's MAX_PROCS
MAX_GPUS = 64
MAX_LINES = 64  # problems, notes, ranks, URLs, ports


@dataclass(frozen=True, slots=True)
class ProcessReport:
    pid: int
    ppid: int | None
    role: str  # "server", "scheduler", "detokenizer", ..., "other"
    rank: str | None  # "TP3", "DP0 TP3"
    name: str  # the process title (sglang::scheduler_TP0), else only the executable's name
    status: str  # psutil's: running, sleeping, zombie, ...


@dataclass(frozen=True, slots=True)
class ServerReport:
    pid: int
    kind: str  # "sglang", "vllm", "sim"
    name: str  # "SGLang", "vLLM", "radixtop sim"
    started: float  # its start time (epoch, the node's clock)
    url: str | None = None
    ports: tuple[int, ...] = ()
    log_path: str | None = None
    log_how: str = ""  # "--log-file", "stdout", "stderr"
    log_elsewhere: str = ""  # where its output goes when it is no file ("tmux pane %3 (work:1.0)")
    instrument_urls: tuple[str, ...] = ()
    ranks: tuple[str, ...] = ()
    version: str = ""
    model: str = ""
    problems: tuple[str, ...] = ()
    processes: tuple[ProcessReport, ...] = ()

    @property
    def port(self) -> int | None:
        return int(self.url.rsplit(":", 1)[1]) if self.url and self.url.rsplit(":", 1)[1].isdigit() else None


@dataclass(frozen=True, slots=True)
class GpuReport:
    index: int
    name: str = ""
    uuid: str = ""
    state: str = "ok"  # "ok", "lost", "error"
    memory_used: int | None = None  # bytes
    memory_total: int | None = None
    util_percent: int | None = None
    pids: tuple[int, ...] = ()  # the processes NVML says use it
    problems: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeReport:
    hostname: str
    time: float  # the node's wall clock when the report was made (clock skew is measured on it)
    radixtop_version: str = ""
    servers: tuple[ServerReport, ...] = ()
    notes: tuple[str, ...] = ()  # about the search itself
    gpus: tuple[GpuReport, ...] = ()
    gpus_unavailable: str = ""  # why no GPU could be read ("no NVIDIA driver ..."); "" when NVML answered

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape: objects and arrays (lists, never tuples), as from_dict reads them."""
        return {FORMAT_KEY: FORMAT, **_plain(asdict(self))}

    @classmethod
    def from_dict(cls, data: Any) -> NodeReport:
        """The record from a decoded JSON value from anywhere; ValueError (one line) when it is not one."""
        doc = _Fields(data, "")
        fmt = doc.get(FORMAT_KEY)
        if fmt is None:
            raise ValueError(f"not a radixtop node report (no {FORMAT_KEY} field)")
        if type(fmt) is not int or fmt < 1:
            raise ValueError(f"node report: {FORMAT_KEY}: expected a format number, got {_shown(fmt)}")
        if fmt > FORMAT:
            raise ValueError(
                f"node report format {fmt} is newer than this radixtop's ({FORMAT}): upgrade radixtop here"
            )
        return cls(
            hostname=doc.text("hostname", required=True),
            time=doc.number("time", required=True),
            radixtop_version=doc.text("radixtop_version"),
            servers=doc.records("servers", MAX_SERVERS, _server),
            notes=doc.lines("notes"),
            gpus=doc.records("gpus", MAX_GPUS, _gpu),
            gpus_unavailable=doc.text("gpus_unavailable"),
        )


def parse_node_report(raw: bytes | str, what: str = "node report") -> NodeReport:
    """A node report from its JSON text, within MAX_REPORT_BYTES; ValueError (one line) otherwise."""
    return NodeReport.from_dict(load_json(raw, what, max_bytes=MAX_REPORT_BYTES))


def _server(doc: _Fields) -> ServerReport:
    return ServerReport(
        pid=doc.integer("pid", required=True, low=0),
        kind=doc.text("kind", required=True),
        name=doc.text("name"),
        started=doc.number("started"),
        url=doc.text("url", optional=True),
        ports=doc.integers("ports", low=0, high=65535),
        log_path=doc.text("log_path", optional=True),
        log_how=doc.text("log_how"),
        log_elsewhere=doc.text("log_elsewhere"),
        instrument_urls=doc.lines("instrument_urls"),
        ranks=doc.lines("ranks"),
        version=doc.text("version"),
        model=doc.text("model"),
        problems=doc.lines("problems"),
        processes=doc.records("processes", MAX_PROCESSES, _process),
    )


def _process(doc: _Fields) -> ProcessReport:
    return ProcessReport(
        pid=doc.integer("pid", required=True, low=0),
        ppid=doc.integer("ppid", optional=True, low=0),
        role=doc.text("role"),
        rank=doc.text("rank", optional=True),
        name=doc.text("name"),
        status=doc.text("status"),
    )


def _gpu(doc: _Fields) -> GpuReport:
    return GpuReport(
        index=doc.integer("index", required=True, low=0),
        name=doc.text("name"),
        uuid=doc.text("uuid"),
        state=doc.text("state") or "ok",
        memory_used=doc.integer("memory_used", optional=True, low=0),
        memory_total=doc.integer("memory_total", optional=True, low=0),
        util_percent=doc.integer("util_percent", optional=True, low=0, high=100),
        pids=doc.integers("pids", low=0),
        problems=doc.lines("problems"),
    )


def _plain(value: Any) -> Any:
    """asdict's tuples as lists (the record is three levels deep: this recursion is bounded)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _shown(value: Any) -> str:
    """A bad value, named short and printable in an error line."""
    if isinstance(value, (dict, list)):
        return "an object" if isinstance(value, dict) else "an array"
    text = repr(value)
    return printable(text[:40] + ("…" if len(text) > 40 else ""))


_R = TypeVar("_R")


class _Fields:
    """One JSON object's fields, read with checks; `where` names it in errors ("servers[2].")."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, Mapping):
            raise ValueError(f"node report{': ' + where.rstrip('.') if where else ''}: expected an object, "
                             f"got {_shown(data)}")
        self.data = data
        self.where = where

    def get(self, key: str) -> Any:
        return self.data.get(key)

    def _fail(self, key: str, expected: str, value: Any) -> ValueError:
        return ValueError(f"node report: {self.where}{key}: expected {expected}, got {_shown(value)}")

    def _missing(self, key: str, required: bool) -> bool:
        value = self.data.get(key)
        if value is None and required:
            raise ValueError(f"node report: {self.where}{key}: missing")
        return value is None

    def text(self, key: str, *, required: bool = False, optional: bool = False) -> Any:
        """A string cut to MAX_TEXT and made printable; "" (None when `optional`) where absent."""
        if self._missing(key, required):
            return None if optional else ""
        value = self.data[key]
        if not isinstance(value, str):
            raise self._fail(key, "a string", value)
        return printable(value[:MAX_TEXT])

    def integer(self, key: str, *, required: bool = False, optional: bool = False, low: int | None = None,
                high: int | None = None) -> Any:
        if self._missing(key, required):
            return None if optional else 0
        value = self.data[key]
        if type(value) is not int:  # bool is an int to Python, not to JSON
            raise self._fail(key, "a whole number", value)
        if (low is not None and value < low) or (high is not None and value > high) or abs(value) > 2**63:
            raise self._fail(key, f"a number within {low}..{high if high is not None else 2**63}", value)
        return value

    def number(self, key: str, *, required: bool = False) -> float:
        if self._missing(key, required):
            return 0.0
        value = self.data[key]
        if type(value) not in (int, float) or not math.isfinite(value) or abs(value) > 1e12:
            raise self._fail(key, "a finite number", value)
        return float(value)

    def _array(self, key: str, cap: int) -> list[Any]:
        if self._missing(key, False):
            return []
        value = self.data[key]
        if not isinstance(value, list):
            raise self._fail(key, "an array", value)
        if len(value) > cap:
            raise ValueError(f"node report: {self.where}{key}: {len(value)} entries is more than the limit of {cap}")
        return value

    def lines(self, key: str) -> tuple[str, ...]:
        out = []
        for i, item in enumerate(self._array(key, MAX_LINES)):
            if not isinstance(item, str):
                raise self._fail(f"{key}[{i}]", "a string", item)
            out.append(printable(item[:MAX_TEXT]))
        return tuple(out)

    def integers(self, key: str, *, low: int = 0, high: int = 2**63) -> tuple[int, ...]:
        out = []
        for i, item in enumerate(self._array(key, MAX_PROCESSES)):
            if type(item) is not int or not low <= item <= high:
                raise self._fail(f"{key}[{i}]", f"a whole number within {low}..{high}", item)
            out.append(item)
        return tuple(out)

    def records(self, key: str, cap: int, build: Callable[[_Fields], _R]) -> tuple[_R, ...]:
        items = self._array(key, cap)
        return tuple(build(_Fields(item, f"{self.where}{key}[{i}].")) for i, item in enumerate(items))
