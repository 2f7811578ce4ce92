"""Find the LLM servers on this node: SGLang (and vLLM, and radixtop's simulator), their HTTP port,
their log file and their ranks' debug endpoints; and say what could not be found, and why.

What counts as a server process: radixtop.probes.server_cmdline reads each command line (modules, console
scripts started through their shebang, script paths, wrappers, Ray actors, setproctitle titles).
Processes titled `sglang::scheduler_TP3` belong to the nearest SGLang launcher above them (or, for an
offline `sgl.Engine` script, to their parent). A wrapper that stays as the launcher's parent
(`timeout 600 python ...`, torchrun, `uv run`) is not a second server: the innermost matching
process is the server.

The port: among the TCP ports the process tree listens on, the one its `--port` names, else the
server's default (30000 / 8000), else the first whose HTTP front answers /v1/models. The log: `--log-file` when the
command line has one, else the file its stdout (then stderr) goes to (/proc/<pid>/fd/1); a pipe, a
terminal or /dev/null is said as such. The ranks' debug endpoints: /server_info's radixtop_instrument
(the simulator), else those of the tree's listening ports in the instrument's range (base + rank,
the base from the server's RADIXTOP_INSTRUMENT_PORT) that answer radixtop's health path.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import psutil

from radixtop.probes.container import container_of, container_ports
from radixtop.probes.http import ANSWERING, LIVENESS_PATH, fetch, make_client
from radixtop.probes.journal import read_cgroup
from radixtop.probes.procs import role_and_rank
from radixtop.probes.server_cmdline import LaunchKind, ServerKind, flag, launch_of
from radixtop.probes.serverlog import LogElsewhere, find_log, log_elsewhere
from radixtop.probes.sglang import parse_server_info
from radixtop.schema import HEALTH_PATH, INSTRUMENT_PORT_SPAN, parse_health

if TYPE_CHECKING:  # imported when first used: httpx costs ~70 ms of start-up
    import httpx

DEFAULT_PORTS = {"sglang": 30000, "vllm": 8000, "sim": 30000}
MAX_CANDIDATES = 32
MAX_INSTRUMENT_RANKS = INSTRUMENT_PORT_SPAN  # ranks' endpoints looked for from the base port on


@dataclass(frozen=True, slots=True)
class FoundServer:
    pid: int
    kind: ServerKind
    cmdline: tuple[str, ...]
    started: float
    url: str | None = None
    ports: tuple[int, ...] = ()  # TCP ports the process tree listens on
    log_path: str | None = None
    log_how: str = ""  # "--log-file", "stdout", "stderr"
    instrument_urls: tuple[str, ...] = ()
    ranks: tuple[str, ...] = ()  # scheduler ranks seen in process titles
    version: str = ""
    problems: tuple[str, ...] = ()  # what could not be found, one line each, with what to do
    log_elsewhere: LogElsewhere | None = None  # when log_path is None: where its output goes instead
    model: str = ""

    @property
    def port(self) -> int | None:
        return int(self.url.rsplit(":", 1)[1]) if self.url else None

    @property
    def name(self) -> str:
        return {"sglang": "SGLang", "vllm": "vLLM", "sim": "radixtop sim"}.get(self.kind, self.kind)


@dataclass(frozen=True)
class Discovery:
    servers: tuple[FoundServer, ...] = ()
    notes: tuple[str, ...] = ()  # about the search itself (processes we could not read, ...)

    def describe(self) -> list[str]:
        """What was found and what was not, as lines for a person."""
        if not self.servers:
            lines = ["No SGLang or vLLM server found on this node."]
            lines += list(self.notes)
            lines += [
                "Point radixtop at one:  radixtop --url http://127.0.0.1:30000 --log /path/to/server.log",
                "Or watch a simulated SGLang server fail:  radixtop demo",
            ]
            return lines
        lines = []
        for s in self.servers:
            head = f"{s.name} pid {s.pid}"
            if s.version:
                head += f" ({s.version})"
            lines.append(head + (f" at {s.url}" if s.url else ", no HTTP port found"))
            if s.log_path:
                lines.append(f"  log: {s.log_path} (its {s.log_how})")
            elif s.log_elsewhere is not None:
                lines.append(f"  log: {s.log_elsewhere.name} (its {s.log_how or 'output'})")
            if s.instrument_urls:
                lines.append(f"  debug endpoints: {', '.join(s.instrument_urls)}")
            if s.ranks:
                lines.append(f"  scheduler ranks: {', '.join(s.ranks)}")
            lines += [f"  {p}" for p in s.problems]
        lines += list(self.notes)
        return lines


@dataclass
class _Candidate:
    proc: psutil.Process
    kind: ServerKind
    cmdline: list[str]
    started: float
    ranks: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)  # the server's own (past wrappers and interpreter)


def _model(kind: str, args: Sequence[str]) -> str:
    """The model its command line names (--model-path, --model, vLLM's positional MODEL)."""
    for name in ("--model-path", "--model"):
        value = flag(args, name)
        if value:
            return value
    if kind == "vllm" and args and not args[0].startswith("-"):
        return args[0]
    return ""


def _listening(procs: Iterable[psutil.Process]) -> tuple[list[tuple[str, int]], list[str]]:
    addrs: list[tuple[str, int]] = []
    problems: list[str] = []
    for proc in procs:
        try:
            conns = proc.net_connections(kind="tcp")
        except psutil.AccessDenied:
            problems.append(
                f"cannot see the ports of pid {proc.pid} (another user's process: run radixtop as that user "
                "or root, or pass --url)"
            )
            continue
        except psutil.Error:
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN and c.laddr:
                addrs.append((c.laddr.ip, c.laddr.port))
    return sorted(set(addrs), key=lambda a: a[1]), problems


def _host(ip: str) -> str:
    if ip in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{ip}]" if ":" in ip else ip


def find_candidates(exclude: Iterable[int] = ()) -> tuple[list[_Candidate], list[str]]:
    """Server processes on this node (sync: reads /proc)."""
    skip = set(exclude)
    roots, children, denied = _launchers(skip)
    _keep_innermost(roots)
    orphans = _adopt_children(roots, children, skip)
    notes = []
    if orphans:
        shown = ", ".join(str(p) for p in sorted(orphans)[:8])
        notes.append(f"orphaned SGLang processes (pids {shown}) outlived their server; they may hold GPU memory")
    if denied:
        notes.append(f"{denied} processes could not be read (other users'); run as root to see every server")
    found = sorted(roots.values(), key=lambda c: c.started)[:MAX_CANDIDATES]
    return found, notes


_Child = tuple[psutil.Process, LaunchKind, list[str]]


def _launchers(skip: set[int]) -> tuple[dict[int, _Candidate], list[_Child], int]:
    """Every server launcher on the node by pid, the server children seen, and how many processes
    could not be read."""
    roots: dict[int, _Candidate] = {}
    children: list[_Child] = []
    denied = 0
    for proc in psutil.process_iter(["pid", "cmdline", "create_time"]):
        try:
            if proc.pid in skip:
                continue
            cmdline = proc.info.get("cmdline")
            if cmdline is None:
                denied += _unreadable(proc)
                continue
            launch = launch_of(cmdline)
            if launch is None:
                continue
            kind = launch.kind
            if kind == "sglang-child" or kind == "vllm-child":  # this form narrows kind for mypy
                children.append((proc, kind, cmdline))
            else:
                started = proc.info.get("create_time") or 0.0
                roots[proc.pid] = _Candidate(proc, kind, list(cmdline), started, args=list(launch.args))
        except psutil.Error:
            continue
    return roots, children, denied


def _unreadable(proc: psutil.Process) -> bool:
    """Its command line is another user's to read; a zombie (no command line left) or a process
    gone meanwhile hides no server."""
    try:
        proc.cmdline()
    except psutil.AccessDenied:
        return True
    except psutil.Error:
        return False
    return False


def _keep_innermost(roots: dict[int, _Candidate]) -> None:
    """The innermost launcher is the server: drop a candidate that has another one below it. A
    child with its parent's very command line is a fork (not yet exec'd, or a multiprocessing
    fork): the parent stays the server."""
    for pid, cand in list(roots.items()):
        if pid not in roots:
            continue
        try:
            parents = cand.proc.parents()
        except psutil.Error:
            continue
        for parent in parents:
            above = roots.get(parent.pid)
            if above is None:
                continue
            if above.cmdline == cand.cmdline:
                roots.pop(pid, None)
                break
            roots.pop(parent.pid, None)


def _adopt_children(roots: dict[int, _Candidate], children: list[_Child], skip: set[int]) -> list[int]:
    """Each server child's rank on its server (an offline sgl.Engine's parent becomes one); the
    pids of children whose server died without them."""
    orphans: list[int] = []
    for proc, kind, cmdline in children:
        owner = None
        try:
            owner = next((roots[p.pid] for p in proc.parents() if p.pid in roots), None)
            if owner is None and kind == "sglang-child":  # an offline sgl.Engine: its parent is the server
                server = proc.parent()
                if server is not None and server.pid == 1:  # orphaned: its server died without it
                    orphans.append(proc.pid)
                    continue
                if server is not None and server.pid not in skip:
                    argv = server.cmdline()
                    owner = roots.setdefault(
                        server.pid, _Candidate(server, "sglang", argv, server.create_time(), args=argv[1:])
                    )
        except psutil.Error:
            continue
        if owner is not None:
            _, rank = role_and_rank(cmdline)
            if rank and rank not in owner.ranks:
                owner.ranks.append(rank)
    return orphans


def _instrument_base_port(proc: psutil.Process) -> int | None:
    """The base port the server's instrument binds (rank r on base + r), read from the server's
    environment as the instrument itself reads it; None for 0 (any free port: not guessable)."""
    from radixtop.instrument.config import InstrumentConfig  # light: the standard library and the schema

    try:
        env = proc.environ()
    except (psutil.Error, OSError):
        env = {}
    return InstrumentConfig.from_env(env, warn=False).base_port or None


def _instrument_candidates(addrs: Sequence[tuple[str, int]], base: int | None) -> list[str]:
    """Where the ranks' debug endpoints may be: the listening ports in the instrument's range.
    SGLang's own /server_info does not list them (radixtop runs inside its schedulers, not its
    HTTP server). Only these are asked, and only radixtop's health path: a GET to some other
    listener of the server (a torch store, NCCL) could upset it."""
    if base is None:
        return []
    urls = [f"http://{_host(ip)}:{port}" for ip, port in addrs if base <= port < base + MAX_INSTRUMENT_RANKS]
    return list(dict.fromkeys(urls))[:MAX_INSTRUMENT_RANKS]


def instrument_candidates(pid: int) -> list[str]:
    """The candidate endpoint URLs of the server with this pid (its whole process tree)."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    addrs, _ = _listening(tree)
    return _instrument_candidates(addrs, _instrument_base_port(root))


def rank_of_health(status: int | None, body: bytes) -> int | None:
    """The rank a radixtop health answer names; None when it is not one."""
    if status != 200:
        return None
    try:
        return parse_health(body).rank
    except ValueError:
        return None


async def _find_instruments(
    client: httpx.AsyncClient, addrs: Sequence[tuple[str, int]], base: int | None, timeout_s: float
) -> tuple[str, ...]:
    """The ranks' debug endpoints among the server's listening ports, in rank order."""

    async def rank_of(url: str) -> tuple[int, str] | None:
        got = await fetch(client, url + HEALTH_PATH, max_bytes=64 * 1024, timeout_s=timeout_s)
        rank = rank_of_health(got.status if got.error is None else None, got.body)
        return None if rank is None else (rank, url)

    found = await asyncio.gather(*(rank_of(u) for u in _instrument_candidates(addrs, base)))
    return tuple(url for _, url in sorted(f for f in found if f is not None))


async def _probe_port(client: httpx.AsyncClient, host: str, port: int, timeout_s: float) -> bool:
    """Whether an LLM server's HTTP front answers on the port (without entering its scheduler)."""
    got = await fetch(client, f"http://{host}:{port}{LIVENESS_PATH}", max_bytes=256 * 1024, timeout_s=timeout_s)
    return got.error is None and (got.status in ANSWERING or got.status == 503)


async def _describe(client: httpx.AsyncClient, cand: _Candidate, timeout_s: float) -> FoundServer:
    proc = cand.proc
    problems: list[str] = []
    try:
        tree = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        tree = [proc]
    addrs, port_problems = await asyncio.to_thread(_listening, tree)
    problems += port_problems
    container = await asyncio.to_thread(lambda: container_of(proc.pid, read_cgroup(proc.pid)))
    if container is not None and container.own_net and not addrs:
        addrs, port_problems = await asyncio.to_thread(container_ports, container)
        problems += port_problems
    log_path, log_how, log_problems = await asyncio.to_thread(find_log, proc, cand.args, container)
    elsewhere = None
    if log_path is None:
        elsewhere, log_how, log_problems = await asyncio.to_thread(log_elsewhere, proc, log_problems, container)
    problems += log_problems
    url = None
    port_flag = flag(cand.args, "--port")
    wanted = int(port_flag) if port_flag and port_flag.isdigit() else DEFAULT_PORTS.get(cand.kind)
    ordered = sorted(addrs, key=lambda a: (a[1] != wanted, a[1]))
    for ip, port in ordered[:8]:
        host = _host(ip)
        if await _probe_port(client, host, port, timeout_s):
            url = f"http://{host}:{port}"
            break
    if url is None:
        if addrs:
            shown = ", ".join(str(p) for _, p in addrs[:6])
            problems.append(f"none of its listening ports ({shown}) answers /v1/models; pass --url")
        elif not port_problems:
            problems.append("it listens on no TCP port yet (still loading the model?)")
    instrument: tuple[str, ...] = ()
    version = ""
    model = _model(cand.kind, cand.args)
    if url is not None and cand.kind in ("sglang", "sim"):
        got = await fetch(client, url + "/server_info", max_bytes=2 * 1024 * 1024, timeout_s=timeout_s)
        if got.ok:
            try:
                info = parse_server_info(url, got.body)
                instrument, version = info.instrument_urls, info.version
                model = info.model or model
            except ValueError as exc:
                problems.append(str(exc))
        else:
            problems.append(f"/server_info: {got.error or f'HTTP {got.status}'}")
        base: int | None = None  # looked up only when /server_info lists none
        if not instrument:
            base = await asyncio.to_thread(_instrument_base_port, proc)
            instrument = await _find_instruments(client, addrs, base, timeout_s)
        if not instrument and base is None:
            problems.append(
                "its instrument binds any free port (RADIXTOP_INSTRUMENT_PORT=0): pass --instrument URL per rank "
                "(each rank logs its endpoint's URL)"
            )
        elif not instrument:
            problems.append(
                "no radixtop debug endpoint: start SGLang with RADIXTOP_INSTRUMENT=1 (radixtop installed in its "
                "environment), or pass --instrument URL; the radix pane stays empty meanwhile"
            )
    return FoundServer(
        pid=proc.pid,
        kind=cand.kind,
        cmdline=tuple(cand.cmdline),
        started=cand.started,
        url=url,
        ports=tuple(p for _, p in addrs),
        log_path=log_path,
        log_how=log_how,
        log_elsewhere=elsewhere,
        model=model,
        instrument_urls=instrument,
        ranks=tuple(sorted(cand.ranks)),
        version=version,
        problems=tuple(problems),
    )


def _listens_on(cand: _Candidate, port: int) -> bool:
    try:
        tree = [cand.proc, *cand.proc.children(recursive=True)]
    except psutil.Error:
        tree = [cand.proc]
    return any(p == port for _, p in _listening(tree)[0])


def _known_on(known: Mapping[tuple[int, float], FoundServer] | None, cand: _Candidate, port: int) -> bool:
    """Seen listening on `port` before (the same pid and start): its sockets are not read again,
    which took most of an idle radixtop's discovery (every socket on the node, every fd)."""
    seen = (known or {}).get((cand.proc.pid, cand.started))
    return seen is not None and port in seen.ports


def _complete(server: FoundServer) -> bool:
    """Described in full: asking it again would find nothing new (its url, log and endpoints)."""
    return bool(server.url and server.log_path and (server.instrument_urls or server.kind not in ("sglang", "sim")))


async def discover(
    *,
    client: httpx.AsyncClient | None = None,
    exclude: Iterable[int] | None = None,
    timeout_s: float = 1.0,
    known: Mapping[tuple[int, float], FoundServer] | None = None,
    port: int | None = None,
) -> Discovery:
    """Every server found on this node, described; never raises. A server in `known` (by pid and
    start time) that was described in full is not asked again. With `port` (the server the user
    named), only the servers listening on it are described: asking the others would put a line in
    their access logs for nothing; when none listens on it (a container's published port), all are."""
    own = client is None  # made at the first server to ask: a node with none needs no HTTP client
    skip = set(exclude) if exclude is not None else {os.getpid()}
    try:
        candidates, notes = await asyncio.to_thread(find_candidates, skip)
        if port is not None:
            named = [
                c for c in candidates if _known_on(known, c, port) or await asyncio.to_thread(_listens_on, c, port)
            ]
            candidates = named or candidates
        servers = []
        for cand in candidates:
            seen = (known or {}).get((cand.proc.pid, cand.started))
            if seen is not None and _complete(seen):
                servers.append(seen)
                continue
            client = client or make_client(timeout_s)
            try:
                servers.append(await _describe(client, cand, timeout_s))
            except psutil.NoSuchProcess:
                continue  # it exited while we looked
            except Exception as exc:
                notes.append(f"pid {cand.proc.pid}: could not be described ({type(exc).__name__}: {exc})")
        return Discovery(tuple(servers), tuple(notes))
    except Exception as exc:
        return Discovery((), (f"discovery failed: {type(exc).__name__}: {exc}",))
    finally:
        if own and client is not None:
            await client.aclose()


class Rediscovery:
    """discover() again and again (a restarted server, one started later) without asking a server
    it has described in full anything more: every request is a line in that server's access log."""

    def __init__(self, url: str | None = None) -> None:
        self._known: dict[tuple[int, float], FoundServer] = {}
        self._port = urlsplit(url).port if url else None  # the server the user named: only it is asked

    async def __call__(self) -> Discovery:
        found = await discover(known=self._known, port=self._port)
        self._known = {(s.pid, s.started): s for s in found.servers}
        return found
