"""`radixtop sim`: the simulator as an SGLang-compatible HTTP server on loopback.

Takes SGLang's own flags (so a real launch command can be replayed against it; flags it does not
model are accepted and named in one log line), plus radixtop's `--fault`, `--step-ms`,
`--instrument-port` and `--ready-file`. Logs are SGLang's format, one flushed line at a time, to
`--log-file` or stdout. When the engine dies (the lock-race fault), the process dies as SGLang
0.5.23 does: the scheduler's exception, the parent's `SIGQUIT received...`, with a crash dump folder
(`--crash-dump-folder`, or `POST /configure_logging`) the dump of its requests and `Dumped N finished
and M unfinished requests before crash to FILE` (radixtop.sim.request_log), five seconds "before crash
diagnostics" (none when SGLANG_PYSPY_DUMP_BEFORE_CRASH and SGLANG_CUDA_COREDUMP_BEFORE_CRASH are both
off, as SGLang), `kill_process_tree called...`, then a non-zero exit.

With `--nnodes N --node-rank R` it is node R of a TP group spread over N machines: it runs, logs
and serves the debug endpoints of that node's TP ranks only (node 1 of 2 at `--tp-size 4`: TP2
and TP3, on BASE+2 and BASE+3). Unlike SGLang's nodes past the first, which serve only a health
check, it serves the whole API: nodes make no connection to each other, so a driver sends each
node the same requests, standing in for node 0's scheduler handing them on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

VERSION = "0.5.23-radixtop-sim"  # the SGLang release whose API and logs the simulator follows
DEFAULT_MODEL = "radixtop/sim-model"  # the served name; the model path is the folder below
MODEL_DIR = Path(__file__).resolve().parent / "sim-model"  # its config.json gives the vocabulary
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# After the death lines, give in-flight requests this long to receive their 5xx, then exit.
DEATH_GRACE_S = 0.3
CRASH_DIAGNOSTICS_WAIT_S = 5.0  # SGLang's sleep "to let GPU activity settle" before py-spy and coredumps
CRASH_DIAGNOSTICS_SWITCHES = ("SGLANG_PYSPY_DUMP_BEFORE_CRASH", "SGLANG_CUDA_COREDUMP_BEFORE_CRASH")
SHUTDOWN_TIMEOUT_S = 2.0


from radixtop.argcheck import Parser, within  # noqa: E402 - after the constants it documents
from radixtop.errors import ExitStatus, UsageError  # noqa: E402
from radixtop.netbind import bind_socket  # noqa: E402
from radixtop.sim.logfmt import SIGQUIT_LINE  # noqa: E402

# ----------------------------------------------------------------------------------------------
# Flags
# ----------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="radixtop sim",
        description="An SGLang-compatible server over a simulated radix cache. Takes SGLang's flags; "
        "SGLang flags it does not model are accepted and ignored (named in one log line).",
        allow_abbrev=False,
    )
    g = p.add_argument_group("SGLang flags (same names and meaning)")
    g.add_argument(
        "--model-path",
        "--model",
        dest="model_path",
        default=str(MODEL_DIR),
        help="echoed in /server_info (default: the simulator's own model folder, whose config.json "
        "holds its vocabulary)",
    )
    g.add_argument(
        "--served-model-name",
        default=None,
        help="name in /v1/models and metric labels (default: the model path)",
    )
    g.add_argument(
        "--host", default=None, help="bind address (default 127.0.0.1; anything else prints a warning)"
    )
    g.add_argument(
        "--port",
        type=within(0, 65535),
        default=30000,
        help="HTTP port (default 30000; 0 picks a free port and logs it)",
    )
    g.add_argument("--page-size", type=int, default=None, help="tokens per KV page (default 1)")
    g.add_argument(
        "--max-running-requests", type=int, default=None, help="scheduler batch bound (default 32)"
    )
    g.add_argument(
        "--max-total-tokens", type=int, default=None, help="KV pool size in tokens (default 16384)"
    )
    g.add_argument("--disable-radix-cache", action="store_true")
    g.add_argument(
        "--radix-eviction-policy", default="lru", help="lru (default) or another policy the cache knows"
    )
    g.add_argument("--enable-metrics", action="store_true", help="serve /metrics (Prometheus text)")
    g.add_argument("--enable-cache-report", action="store_true", help="report cached tokens in /v1 usage")
    g.add_argument("--enable-deterministic-inference", action="store_true")
    g.add_argument("--tp-size", "--tensor-parallel-size", "--tp", dest="tp_size", type=int, default=1)
    g.add_argument("--dp-size", "--data-parallel-size", "--dp", dest="dp_size", type=int, default=1)
    g.add_argument(
        "--nnodes",
        type=within(1, 64),
        default=1,
        help="machines the TP group spans (default 1); this simulator runs one node's share of the ranks",
    )
    g.add_argument(
        "--node-rank",
        type=within(0, 63),
        default=0,
        help="which node this is (default 0): node R of N runs TP ranks R*tp/N .. (R+1)*tp/N - 1",
    )
    g.add_argument(
        "--dist-init-addr",
        "--nccl-init-addr",
        dest="dist_init_addr",
        default=None,
        metavar="HOST:PORT",
        help="accepted and echoed; no connection is made (each node's simulator schedules on its own)",
    )
    g.add_argument(
        "--kv-events-config",
        default=None,
        metavar="JSON",
        help='publish KV cache events, e.g. {"publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557"}',
    )
    g.add_argument("--decode-log-interval", type=int, default=40)
    g.add_argument("--log-level", default="info", type=str.lower, choices=LOG_LEVELS)
    g.add_argument("--mem-fraction-static", type=float, default=None, help="accepted and echoed")
    g.add_argument("--attention-backend", default=None, help="accepted and echoed")
    g.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="the device batch lines name (cuda graph / cpu graph)")
    g.add_argument("--disable-overlap-schedule", action="store_true", help="accepted and echoed")
    g.add_argument("--crash-dump-folder", default=None, metavar="DIR",
                   help="when the server dies, dump its recent and in-flight requests to "
                   "DIR/<host>/crash_dump_<time>.pkl, as SGLang does (also set by POST /configure_logging)")
    r = p.add_argument_group("radixtop flags")
    r.add_argument(
        "--log-file", default=None, metavar="PATH", help="append logs here, flushed per line (default stdout)"
    )
    r.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME[:SEED][:K=V,...]",
help="inject a fault: lock-race, block-boundary, leak, double-unlock (repeatable); "
        "lock-race's rank=N names the TP rank it fires on",
    )
    r.add_argument(
        "--step-ms", type=within(0, 10_000, float), default=2.0, help="simulated scheduler step time (default 2 ms)"
    )
    r.add_argument(
        "--instrument-port",
        type=within(1, 65535 - 128),  # rank r serves on BASE+r: room for 128 ranks
        default=None,
        metavar="BASE",
        help="debug endpoint of rank r on 127.0.0.1:BASE+r (default: free ports, listed in /server_info)",
    )
    r.add_argument(
        "--no-instrument", action="store_true", help="serve no debug endpoint (SGLang without radixtop's plugin)"
    )
    r.add_argument("--ready-file", default=None, metavar="PATH", help="write the bound port here once ready")
    return p


@dataclass
class SimOptions:
    args: argparse.Namespace
    argv: list[str]
    ignored: list[str] = field(default_factory=list)  # SGLang flags (with their values) not modelled
    faults: list[Any] = field(default_factory=list)  # radixtop.sim.faults.FaultSpec
    config: Any = None  # radixtop.sim.engine.SimConfig, validated

    @property
    def host(self) -> str:
        return self.args.host or "127.0.0.1"


def _group_unknown(tokens: Sequence[str]) -> list[str]:
    """Each unknown flag with the values after it: ['--context-length', '32768', '--trust-remote-code']
    -> ['--context-length 32768', '--trust-remote-code']."""
    groups: list[str] = []
    for token in tokens:
        if token.startswith("-") or not groups:
            groups.append(token)
        else:
            groups[-1] += f" {token}"
    return groups


def fault_text(text: str) -> str:
    """Accept `name:SEED[:k=v,...]` as well as FaultSpec's own `name:seed=SEED,k=v`."""
    name, _, rest = text.partition(":")
    first, _, more = rest.partition(":")
    if first.strip().lstrip("-").isdigit():
        rest = ",".join(part for part in (f"seed={first.strip()}", more) if part)
    return f"{name}:{rest}" if rest else name


def parse_options(argv: Sequence[str]) -> SimOptions:
    from radixtop.sim.faults import FaultSpec

    args, unknown = build_parser().parse_known_args(list(argv))
    ignored = _group_unknown(unknown)
    if ignored and not ignored[0].startswith("-"):
        raise UsageError(f"unexpected argument {ignored[0]!r}; flags start with --")
    # The sizes (page, pool, batch, ranks) are the engine's: SimConfig.validate() checks them below.
    if args.kv_events_config:
        from radixtop.sim.kv_events import parse_config

        try:
            parse_config(args.kv_events_config)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    faults = []
    for text in args.fault:
        try:
            faults.append(FaultSpec.parse(fault_text(text)))
        except ValueError as exc:
            raise UsageError(f"--fault {text}: {exc}") from None
    opts = SimOptions(args=args, argv=list(argv), ignored=ignored, faults=faults)
    opts.config = sim_config(opts)
    try:
        opts.config.validate()
    except ValueError as exc:  # e.g. a policy the cache does not know, a pool smaller than a page
        # The engine names its field ("page_size must ..."); the user typed the flag.
        raise UsageError(
            re.sub(r"^[a-z_]+", lambda m: "--" + m.group(0).replace("_", "-"), str(exc))
        ) from None
    return opts


def sim_config(opts: SimOptions) -> Any:
    from radixtop.sim.engine import SimConfig

    a = opts.args
    values: dict[str, Any] = {
        "disable_radix_cache": a.disable_radix_cache,
        "radix_eviction_policy": a.radix_eviction_policy,
        "tp_size": a.tp_size,
        "dp_size": a.dp_size,
        "nnodes": a.nnodes,
        "node_rank": a.node_rank,
        "decode_log_interval": a.decode_log_interval,
        "enable_deterministic_inference": a.enable_deterministic_inference,
        "faults": tuple(opts.faults),
        "step_time_s": a.step_ms / 1000.0,
        "device": a.device,
    }
    for name in ("page_size", "max_running_requests", "max_total_tokens"):
        if getattr(a, name) is not None:
            values[name] = getattr(a, name)
    values["force_miss"] = os.environ.get("SGLANG_RADIX_FORCE_MISS", "").strip().lower() in ("true", "1", "yes", "y")
    log_ms = os.environ.get("SGLANG_LOG_MS")
    if log_ms is not None:  # SGLang's switch for the .mmm in timestamps
        values["log_ms"] = log_ms.strip().lower() in ("1", "true", "yes", "on")
    return SimConfig(**values)


def server_args_dict(opts: SimOptions, config: Any, port: int) -> dict[str, Any]:
    """/server_info's flat dict: SGLang field names, resolved values."""
    a = opts.args
    return {
        "model_path": a.model_path,
        "tokenizer_path": a.model_path,
        "served_model_name": a.served_model_name or (DEFAULT_MODEL if a.model_path == str(MODEL_DIR) else a.model_path),
        "host": opts.host,
        "port": port,
        "page_size": config.page_size,
        "max_running_requests": config.max_running_requests,
        "max_total_tokens": config.max_total_tokens,
        "disable_radix_cache": config.disable_radix_cache,
        "radix_eviction_policy": config.radix_eviction_policy,
        "enable_metrics": a.enable_metrics,
        "enable_cache_report": a.enable_cache_report,
        "enable_deterministic_inference": config.enable_deterministic_inference,
        "tp_size": config.tp_size,
        "dp_size": config.dp_size,
        "pp_size": 1,
        "nnodes": config.nnodes,
        "node_rank": config.node_rank,
        "dist_init_addr": a.dist_init_addr,
        "decode_log_interval": config.decode_log_interval,
        "log_level": a.log_level,
        "mem_fraction_static": a.mem_fraction_static,
        "attention_backend": a.attention_backend,
        "device": a.device,
        "disable_overlap_schedule": a.disable_overlap_schedule,
        "weight_version": "default",
        "radixtop_faults": [{"name": f.name, "seed": f.seed, "params": dict(f.params)} for f in opts.faults],
        "radixtop_step_ms": a.step_ms,
        "kv_events_config": a.kv_events_config,
        "crash_dump_folder": a.crash_dump_folder,
    }


# ----------------------------------------------------------------------------------------------
# Logs
# ----------------------------------------------------------------------------------------------


class LogSink:
    """Whole lines to a file (appended, flushed per line so tailers see them at once) or stdout."""

    def __init__(self, path: str | None):
        self.path = path
        self._lock = threading.Lock()
        self._owned = path is not None
        # Held open for the server's life (closed in close()); line-buffered.
        self._stream: TextIO = open(path, "a", encoding="utf-8", buffering=1) if path else sys.stdout  # noqa: SIM115
        self.saw_sigquit = False

    def write(self, line: str) -> None:
        if SIGQUIT_LINE in line:
            self.saw_sigquit = True
        with self._lock:
            try:
                self._stream.write(line if line.endswith("\n") else line + "\n")
                self._stream.flush()
            except (OSError, ValueError):
                pass  # a closed stdout (the reader went away) must not take the server down

    def close(self) -> None:
        if self._owned:
            with self._lock:
                self._stream.close()


class _SinkHandler(logging.Handler):
    """Routes uvicorn's and the instrument's `logging` records into the sink."""

    def __init__(self, sink: LogSink, level: int):
        super().__init__(level)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.sink.write(self.format(record))
        except Exception:
            self.handleError(record)


def _configure_logging(
    sink: LogSink, level_name: str, log_ms: bool
) -> list[tuple[logging.Logger, logging.Handler]]:
    """uvicorn's lines as SGLang configures them (set_uvicorn_logging_configs); radixtop's own
    loggers (the debug endpoints, the engine's hook errors) in SGLang's main-process format."""
    from uvicorn.logging import AccessFormatter, DefaultFormatter

    level = getattr(logging, level_name.upper())
    installed: list[tuple[logging.Logger, logging.Handler]] = []

    def attach(name: str, formatter: logging.Formatter) -> None:
        logger = logging.getLogger(name)
        handler = _SinkHandler(sink, level)
        handler.setFormatter(formatter)
        logger.handlers = [handler]
        logger.setLevel(level)
        logger.propagate = False
        installed.append((logger, handler))

    datefmt = "%Y-%m-%d %H:%M:%S"
    attach(
        "uvicorn.error",
        DefaultFormatter("[%(asctime)s] %(levelprefix)s %(message)s", datefmt, use_colors=False),
    )
    attach(
        "uvicorn.access",
        AccessFormatter(
            '[%(asctime)s] %(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s',
            datefmt,
            use_colors=False,
        ),
    )
    ms = ".%(msecs)03d" if log_ms else ""
    attach("radixtop", logging.Formatter(f"[%(asctime)s{ms}] %(message)s", datefmt))
    return installed


# ----------------------------------------------------------------------------------------------
# Serving
# ----------------------------------------------------------------------------------------------


def sim_argv(*flags: str, ready_file: str | Path, log_file: str | Path, port: int = 0) -> list[str]:
    """The argv that starts the simulator as a process of its own (tests, benchmarks, demos):
    it writes its bound port to `ready_file` once it serves, and its logs to `log_file`."""
    return [
        sys.executable, "-m", "radixtop", "sim", "--port", str(port),
        "--ready-file", str(ready_file), "--log-file", str(log_file), *flags,
    ]


def _write_ready_file(path: str, port: int) -> None:
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{port}\n", encoding="utf-8")
    os.replace(tmp, target)  # readers never see a half-written file


def _time_evictions(cache: Any, observe: Callable[[float], None]) -> None:
    """Time each evict() call on this cache for sglang:eviction_duration_seconds."""
    original = cache.evict

    def evict(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result = original(*args, **kwargs)
        freed = getattr(result, "num_tokens_evicted", None)
        if freed is None or freed > 0:  # SGLang observes only passes that evicted something
            observe(time.perf_counter() - started)
        return result

    cache.evict = evict


class SimServer:
    """Engine + debug endpoints + uvicorn, and the rules for how they end together."""

    def __init__(self, opts: SimOptions, sock: socket.socket, sink: LogSink):
        from radixtop.sim.engine import Engine
        from radixtop.sim.logfmt import format_line
        from radixtop.sim.request_log import RequestLog

        self.opts = opts
        self.sock = sock
        self.sink = sink
        self.port = sock.getsockname()[1]
        self.config = opts.config
        self._format_line = format_line
        self.engine = Engine(self.config, emit=sink.write)
        self.request_log = RequestLog(opts.args.crash_dump_folder)
        self.server_args: dict[str, Any] = {}
        self.instruments: list[Any] = []
        self.publishers: list[Any] = []
        self.server: Any = None
        self._level = getattr(logging, opts.args.log_level.upper())

    def on_sigterm(self, signum: int, frame: Any) -> None:
        """SIGTERM outside uvicorn's own handling (before it serves, or re-raised after): leave cleanly."""
        if self.server is None:
            raise SystemExit(128 + signum)
        self.server.should_exit = True

    def log(self, message: str, level: int = logging.INFO) -> None:
        """A main-process line (no rank prefix), as SGLang's http_server writes it; dropped below
        --log-level, as SGLang's logging would. (The engine's scheduler lines carry no level and
        are always written.)"""
        if level >= self._level:
            self.sink.write(self._format_line(message, when=time.time(), log_ms=self.config.log_ms))

    def log_error(self, message: str) -> None:
        self.log(message, logging.ERROR)

    def _start_instruments(self) -> list[str]:
        from radixtop.instrument.endpoint import Instrumentation

        base = self.opts.args.instrument_port
        urls = []
        for rank, cache in sorted(self.engine.caches.items()):
            inst = Instrumentation(cache, rank=rank, port=0 if base is None else base + rank)
            self.instruments.append(inst)
            if inst.start():
                url = inst.endpoint.url
                if url is not None:  # a started endpoint has its port
                    urls.append(url)
        engine = self.engine
        # Each rank's requests as its scheduler names them: the holders of its cache's locks.
        safe_points = [(inst.safe_point, engine.rank_requests(rank))
                       for inst, rank in zip(self.instruments, sorted(engine.caches))]

        def safe_point(*_: Any) -> None:
            for call, requests in safe_points:
                call(requests)

        self.engine.on_safe_point.append(safe_point)
        instruments = list(zip(self.instruments, sorted(engine.caches)))

        def record_flight(reason: str) -> None:  # every rank lives in this process: all are recorded
            for inst, rank in instruments:
                inst.flight_record(
                    "scheduler_exception", f"Scheduler hit an exception: {reason}", engine.dead_nodes.get(rank)
                )

        self.engine.on_death.append(record_flight)
        return urls

    async def run(self) -> int:
        import uvicorn

        from radixtop.instrument.endpoint import is_loopback
        from radixtop.sim.metrics import SimMetrics
        from radixtop.sim.server import SimState, build_app

        a = self.opts.args
        if not is_loopback(self.opts.host):
            warning = (
                f"WARNING: radixtop sim is serving on {a.host}:{self.port}, reachable beyond this machine; "
                "the simulator has no authentication. Use --host 127.0.0.1 unless you mean it."
            )
            print(f"radixtop sim: {warning}", file=sys.stderr)
            self.log(warning, logging.WARNING)
        if self.opts.ignored:
            self.log(
                "radixtop sim: accepted and ignored SGLang flags it does not model: "
                + ", ".join(self.opts.ignored),
                logging.WARNING,
            )
        server_args = self.server_args = server_args_dict(self.opts, self.config, self.port)
        self.log(f"server_args={server_args}")
        metrics = None
        if a.enable_metrics:
            metrics = SimMetrics(
                self.engine.stats,
                model_name=server_args["served_model_name"],
                tp_size=self.config.tp_size,
                dp_size=self.config.dp_size,
                tp_ranks=self.config.tp_ranks,
            )
            for rank, cache in self.engine.caches.items():
                _time_evictions(cache, functools.partial(metrics.observe_eviction, rank))
        urls = [] if a.no_instrument else self._start_instruments()
        if a.kv_events_config:
            from radixtop.sim.kv_events import parse_config, start_publishers

            self.publishers = start_publishers(
                self.engine.caches, self.config.tp_size, parse_config(a.kv_events_config)
            )
        stats = self.engine.stats()
        state = SimState(
            engine=self.engine,
            server_args=server_args,
            launch_command=" ".join(self.opts.argv),
            served_model_name=server_args["served_model_name"],
            context_len=stats.max_total_num_tokens,
            version=VERSION,
            metrics=metrics,
            instrument_urls=urls,
            enable_cache_report=a.enable_cache_report,
            log_error=self.log_error,
            log_info=self.log,
            request_log=self.request_log,
        )
        config = uvicorn.Config(
            build_app(state),
            host=self.opts.host,
            port=self.port,
            log_config=None,
            log_level=a.log_level,
            access_log=a.log_level in ("debug", "info"),
            lifespan="off",
            timeout_keep_alive=5,
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        engine_task = asyncio.create_task(self.engine.run(), name="sim-engine")
        server_task = asyncio.create_task(self.server.serve(sockets=[self.sock]), name="sim-http")
        try:
            await self._wait_started(server_task, engine_task)
            if self.server.started and self.engine.dead_reason is None and not engine_task.done():
                # uvicorn does not announce sockets it was handed; say where it listens (--port 0).
                logging.getLogger("uvicorn.error").info(
                    "Uvicorn running on http://%s:%d (Press CTRL+C to quit)", self.opts.host, self.port
                )
                state.ready = True
                if a.ready_file:
                    _write_ready_file(a.ready_file, self.port)
                if a.log_file or self._level > logging.INFO:  # else uvicorn's line above says it
                    logs = f" (logs: {a.log_file})" if a.log_file else ""
                    print(f"radixtop sim: serving http://{self.opts.host}:{self.port}{logs}", flush=True)
                self.engine.emit_ready()
            await asyncio.wait({engine_task, server_task}, return_when=asyncio.FIRST_COMPLETED)
            if server_task.done() and not engine_task.done():
                return await self._stop_engine(engine_task, server_task)
            return await self._die(engine_task, server_task)
        finally:
            for inst in self.instruments:
                inst.close()
            for pub in self.publishers:
                pub.close()

    async def _wait_started(self, server_task: asyncio.Task, engine_task: asyncio.Task) -> None:
        deadline = time.monotonic() + 30.0
        while not self.server.started and time.monotonic() < deadline:
            if server_task.done() or engine_task.done():
                return
            await asyncio.sleep(0.01)

    async def _stop_engine(self, engine_task: asyncio.Task, server_task: asyncio.Task) -> int:
        """uvicorn stopped (SIGINT/SIGTERM): stop the engine and leave cleanly."""
        self.engine.stop()
        with contextlib.suppress(Exception):  # TimeoutError among them
            async with asyncio.timeout(SHUTDOWN_TIMEOUT_S):
                await engine_task
        exc = server_task.exception() if not server_task.cancelled() else None
        if exc is not None:
            self.log_error(f"HTTP server stopped with an error: {type(exc).__name__}: {exc}")
            return ExitStatus.ERROR
        return ExitStatus.OK

    async def _die(self, engine_task: asyncio.Task, server_task: asyncio.Task) -> int:
        """The scheduler is gone: SGLang's parent gets SIGQUIT, logs it, and takes the server down."""
        reason = self.engine.dead_reason
        if reason is None:  # run() returned or raised without declaring death
            exc = engine_task.exception() if not engine_task.cancelled() else None
            reason = f"{type(exc).__name__}: {exc}" if exc is not None else "the engine stopped"
            self.log_error(f"Scheduler hit an exception: {reason}")
        await asyncio.sleep(DEATH_GRACE_S)  # in-flight requests receive their 5xx
        if not self.sink.saw_sigquit:
            self.log_error(SIGQUIT_LINE)
        # The parent's SIGQUIT handler dumps the requests first (with a crash dump folder set),
        # then sleeps before the crash diagnostics.
        self.request_log.dump_before_crash(self.server_args, " ".join(sys.argv), self.log_error)
        if crash_diagnostics_on(os.environ):
            self.log("Sleeping 5 seconds before crash diagnostics to let GPU activity settle.")
            await asyncio.sleep(CRASH_DIAGNOSTICS_WAIT_S)
            self.log_error("No live scheduler processes found; skipping py-spy and CUDA coredump.")
        pid = os.getpid()
        self.log(f"kill_process_tree called: parent_pid={pid}, include_parent=True, pid={pid}")
        self.server.should_exit = True
        try:
            async with asyncio.timeout(0.5):
                await asyncio.shield(server_task)
        except (TimeoutError, Exception):
            self.server.force_exit = True
        return ExitStatus.ERROR  # as SGLang's server exits after SIGQUIT


def crash_diagnostics_on(env: Mapping[str, str]) -> bool:
    """SGLang's EnvBool reading of its two switches (both default on): either on means the wait."""
    return any(env.get(name, "1").strip().lower() in ("true", "1", "yes", "y") for name in CRASH_DIAGNOSTICS_SWITCHES)


def main(argv: list[str]) -> int:
    try:
        opts = parse_options(argv)
    except UsageError as exc:
        print(f"radixtop sim: {exc}", file=sys.stderr)
        return ExitStatus.USAGE
    except SystemExit as exc:  # --help
        return int(exc.code or ExitStatus.OK)
    try:
        sock = bind_socket(opts.host, opts.args.port)
    except UsageError as exc:
        print(f"radixtop sim: {exc}", file=sys.stderr)
        return ExitStatus.USAGE
    try:
        sink = LogSink(opts.args.log_file)
    except OSError as exc:
        sock.close()
        print(
            f"radixtop sim: cannot open --log-file {opts.args.log_file}: {exc.strerror or exc}; "
            "pick a writable path",
            file=sys.stderr,
        )
        return ExitStatus.USAGE
    installed: list[tuple[logging.Logger, logging.Handler]] = []
    try:
        sim = SimServer(opts, sock, sink)
        installed = _configure_logging(sink, opts.args.log_level, sim.config.log_ms)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, sim.on_sigterm)
        try:
            return asyncio.run(sim.run())
        except KeyboardInterrupt:
            return ExitStatus.INTERRUPTED
    finally:
        for logger, handler in installed:
            logger.removeHandler(handler)
        with contextlib.suppress(OSError):
            sock.close()
        sink.close()
