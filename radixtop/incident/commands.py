"""The headless incident commands: `radixtop bundle`, `replay`, `record`, `confirm` and `analyze`.

Each takes the argparse Namespace built in radixtop/cli.py, whose type= functions have checked
each option alone, and returns an ExitStatus. Progress goes to stderr, results to stdout (one JSON
object with --json). Bad input is one line on stderr and exit status USAGE (raised as UsageError).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import signal
import sys
import threading
import time
from argparse import Namespace
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from radixtop.errors import ExitStatus, UsageError
from radixtop.textsafe import printable_line

if TYPE_CHECKING:
    from radixtop.incident.confirm.confirm import ConfirmEvent, Plan
    from radixtop.incident.confirm.verdict import Verdict
    from radixtop.incident.replay.record import RecordedCall
    from radixtop.incident.replay.replay import ReplaySeries
    from radixtop.incident.replay.trace import Trace
    from radixtop.incident.replay.vocab import Vocabulary

__all__ = ["load_trace_arg", "run_analyze", "run_bundle", "run_confirm", "run_record", "run_replay", "run_trace"]


def _progress(prefix: str, quiet: bool = False) -> Callable[[str], None]:
    def say(message: str) -> None:
        if not quiet:
            print(f"radixtop {prefix}: {message}", file=sys.stderr, flush=True)

    return say


def _per_source(parts: Sequence[Any]) -> str:
    """One line per file read, when there were several."""
    return "".join(f"\n  {part.summary()}" for part in parts) if len(parts) > 1 else ""


def load_trace_arg(text: str, block_size: int | None = None) -> tuple[Trace, str]:
    """A trace file, a built-in trace's name (finding_03330, demo_pressure), SGLang's crash or
    request dumps (a .pkl, a dump folder: its incident, or a glob of them) or its JSON request logs
    (one, or a glob: several hosts'), merged by time, as the trace of the requests they hold, or a
    Mooncake trace (JSON Lines with hash_ids) of ``block_size`` tokens a hash id (default 512)."""
    from radixtop.incident.replay.crash_dump import (
        DumpError,
        dump_trace_of,
        find_dumps,
        is_request_log,
        merge_dumps,
        read_dump,
        read_request_log,
    )
    from radixtop.incident.replay.mooncake import MOONCAKE_BLOCK_SIZE, is_mooncake, read_mooncake
    from radixtop.incident.replay.trace import TraceError, builtin_trace, load_trace

    try:
        sources = sorted(glob.glob(text)) if glob.has_magic(text) else [text]
        if not sources:
            raise DumpError(f"{text}: matches no file")
        if all(s.endswith(".pkl") or os.path.isdir(s) for s in sources):
            parts = [read_dump(path) for source in sources for path in find_dumps(source)]
            dump = merge_dumps(Path(text), parts)
            return dump_trace_of(dump), f"the crash's own workload: {dump.summary()}" + _per_source(parts)
        if all(os.path.isfile(s) and is_request_log(s) for s in sources):
            parts = [read_request_log(s) for s in sources]  # several hosts' request logs, merged by time
            dump = merge_dumps(Path(text), parts)
            return dump_trace_of(dump), f"the logged requests: {dump.summary()}" + _per_source(parts)
    except DumpError as exc:
        raise UsageError(str(exc)) from None
    if text.endswith(".jsonl") or (os.path.isfile(text) and is_mooncake(text)):
        try:
            return read_mooncake(text, block_size or MOONCAKE_BLOCK_SIZE)
        except TraceError as exc:
            raise UsageError(str(exc)) from None
    try:
        if os.path.exists(text) or os.sep in text or text.endswith(".json"):
            return load_trace(text), str(Path(text))
        return builtin_trace(text), f"built-in {text}"
    except TraceError as exc:
        raise UsageError(f"{exc}; pass a trace file or a built-in name (finding_03330, demo_pressure)") from None


def _server_info(url: str) -> dict[str, Any] | None:
    """The server's /server_info, or None when it does not answer one."""
    from radixtop.incident.common.server import auth_headers
    from radixtop.probes.server_info import read_server_info_now

    return read_server_info_now(url, auth_headers())


def _page_size(info: dict[str, Any] | None, url: str, value: int | str | None) -> int | None:
    """--page-size: None (as written), a number, or auto (the server's, from /server_info)."""
    from radixtop.probes.server_info import LimitError, ServerLimits

    if value is None or isinstance(value, int):
        return value
    try:
        size = ServerLimits.read(info, f"{url}/server_info").page_size
    except LimitError as exc:
        raise UsageError(f"--page-size auto: {exc}") from None
    if size is None:
        raise UsageError(f"--page-size auto: {url}/server_info did not say its page_size; pass a number")
    return size


def _longer_than_the_server_takes(info: dict[str, Any] | None, url: str, trace: Trace) -> str | None:
    """A line when some of the trace's prompts are longer than the server's max_req_input_len
    (it refuses those calls), or when its /server_info's numbers are not a server's."""
    from radixtop.probes.server_info import LimitError, ServerLimits

    try:
        longest = ServerLimits.read(info, f"{url}/server_info").max_req_input_len
    except LimitError as exc:
        return f"{exc}; its limits are not checked"
    over = [r for r in trace.requests if longest is not None and r.prompt_len > longest]
    if not over:
        return None
    return (f"{len(over):,} of the trace's requests (first {over[0].id}) have prompts longer than the server's "
            f"max_req_input_len of {longest:,} tokens: it refuses those calls")


def _vocabulary(info: dict[str, Any] | None, given: int | None, trace: Trace) -> Vocabulary:
    """The served model's vocabulary (radixtop.incident.replay.vocab), from --vocab-size or its files."""
    from radixtop.incident.replay.vocab import VocabError, Vocabulary, for_server

    if given is not None:
        return Vocabulary(given, (), "--vocab-size")
    try:
        return for_server(info)
    except VocabError as exc:
        if all(r.input_ids is not None or r.text is not None for r in trace.requests):
            return Vocabulary(1 << 31, (), "the trace's recorded prompts")  # nothing is made up
        raise UsageError(str(exc)) from None


# -- bundle -------------------------------------------------------------------------------------


def run_bundle(args: Namespace) -> int:
    from radixtop.incident.bundle.bundle import BundleError, take_bundle, verify_bundle
    from radixtop.incident.common.server import ServerError
    from radixtop.incident.replay.crash_dump import workload_shape

    if args.verify:
        problems = verify_bundle(args.verify)
        for problem in problems:
            print(f"radixtop bundle: {problem}", file=sys.stderr)
        if not problems:
            print(f"{args.verify}: verified, every file matches the manifest")
        return ExitStatus.ERROR if problems else ExitStatus.OK
    nodes = _node_bundles(args)
    if args.stream:
        if nodes is not None or args.out or args.json:
            raise UsageError("bundle --stream writes this node's bundle to stdout: drop --out, --json and --node")
        if sys.stdout.isatty():
            raise UsageError("bundle --stream writes a .tar.gz to stdout: redirect it (> bundle.tar.gz)")
    elif not args.out:
        raise UsageError("bundle: pass --out DIR (where the bundle and its .tar.gz are written)")
    say = _progress("bundle")
    url, logs, pid, instruments = _bundle_target(args, found=args.stream or nodes is not None, say=say)
    out = args.out
    if args.stream:
        import tempfile

        out = tempfile.mkdtemp(prefix="radixtop-stream-")
    cancel = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: cancel.set())
    try:
        result = take_bundle(
            out, url=url, logs=logs, pid=pid, instruments=instruments, reason=args.reason,
            signature_files=args.signatures, context=args.context, cancel=cancel,
            on_progress=lambda p: say(p.message), workload=workload_shape, nodes=nodes,
        )
        if args.stream:
            return _stream_archive(result.archive)
    except ServerError as exc:
        raise UsageError(str(exc)) from None
    except BundleError as exc:
        if cancel.is_set():
            print("radixtop bundle: cancelled; nothing was written", file=sys.stderr)
            return ExitStatus.INTERRUPTED
        raise UsageError(str(exc)) from None
    finally:
        signal.signal(signal.SIGINT, previous)
        if args.stream:
            import shutil

            shutil.rmtree(out, ignore_errors=True)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
        return ExitStatus.OK
    print(f"bundle: {result.path}")
    if result.archive is not None:
        print(f"archive: {result.archive}")
    print(f"{len(result.files)} files, {result.findings} signatures with evidence, in {result.duration_s:.1f} s")
    for part in result.nodes:
        if part.ok:
            print(f"  node {part.summary()}")
    for rel, why in sorted(result.notes.items()):
        print(f"  not collected: {rel}: {why}")
    return ExitStatus.OK


def _bundle_target(args: Namespace, *, found: bool,
                   say: Callable[[str], None]) -> tuple[str | None, list[str], int | None, list[str]]:
    """(URL, logs, pid, debug endpoints) to bundle here: as given, or with `found` and no log or
    pid given, the server discovery finds on this node (at the URL given, if any)."""
    if not found or args.log or args.pid is not None:
        return args.url, args.log, args.pid, args.instrument
    from radixtop.incident.bundle.here import find_here
    from radixtop.incident.common.server import ServerError, base_url

    try:
        here = find_here(base_url(args.url) if args.url else None)
    except ServerError as exc:
        raise UsageError(str(exc)) from None
    say(here.said)
    return here.url, list(here.logs), here.pid, args.instrument or list(here.instruments)


def _node_bundles(args: Namespace) -> Any:
    """The other nodes to bundle (--node, with --node-url and --node-log naming what to take
    there), or None without --node; bad input is one line."""
    from radixtop.incident.bundle.nodes import NodeBundles, NodeOptions

    targets = node_targets(args.node, args.node_url, args.node_log, args.ssh_config, args.remote_radixtop)
    if not targets:
        return None
    options = NodeOptions(ssh_config=args.ssh_config, timeout_s=args.node_timeout, command=args.remote_radixtop,
                          max_bytes=args.node_max_bytes, reason=args.reason)
    return NodeBundles(targets, options)


def node_targets(nodes: Sequence[str], node_urls: Sequence[str], node_logs: Sequence[str] = (),
                 ssh_config: str | None = None, command: str = "radixtop") -> list[Any]:
    """--node HOST, each with what --node-url HOST=URL and --node-log HOST=PATH name there, as
    NodeTargets ([] without --node); bad input is one line (UsageError)."""
    from radixtop.incident.bundle.nodes import MAX_NODES, NodeTarget
    from radixtop.incident.common.server import ServerError, base_url
    from radixtop.probes.remote import check_host, check_remote_command

    hosts = list(dict.fromkeys(nodes))
    named = {"--node-url": node_urls, "--node-log": node_logs}
    if not hosts:
        for flag, given in named.items():
            if given:
                raise UsageError(f"{flag} names what to take on a --node: add --node HOST")
        return []
    if len(hosts) > MAX_NODES:
        raise UsageError(f"--node: {len(hosts)} nodes is more than {MAX_NODES}; give fewer")
    try:
        for host in hosts:
            check_host(host)
        check_remote_command(command)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if ssh_config is not None and not os.path.isfile(ssh_config):
        raise UsageError(f"--ssh-config: {ssh_config}: no such file; give the ssh config file to use")
    urls: dict[str, str] = {}
    logs: dict[str, list[str]] = {}
    for flag, given in named.items():
        for spec in given:
            host, sep, value = spec.partition("=")
            if not sep or host not in hosts or not value:
                raise UsageError(f"{flag} {spec[:80]!r}: give HOST=VALUE for a host given with --node")
            if flag == "--node-url":
                try:
                    urls[host] = base_url(value)
                except ServerError as exc:
                    raise UsageError(f"{flag} {host}: {exc}") from None
            else:
                logs.setdefault(host, []).append(value)
    return [NodeTarget(h, urls.get(h), tuple(logs.get(h, ()))) for h in hosts]


def _stream_archive(archive: Path | None) -> int:
    """The bundle's .tar.gz on stdout (`bundle --stream`: another node's radixtop reads it over ssh)."""
    import shutil

    if archive is None:
        print("radixtop bundle: the bundle's .tar.gz could not be written", file=sys.stderr)
        return ExitStatus.ERROR
    with open(archive, "rb") as fh:
        shutil.copyfileobj(fh, sys.stdout.buffer, 1 << 20)
    sys.stdout.buffer.flush()
    return ExitStatus.OK


# -- replay -------------------------------------------------------------------------------------


def _replay_logs(given: list[str], url: str) -> tuple[str, ...]:
    """The logs whose batch lines give each run's peak token usage: those named, else the log of
    the server that listens at a loopback ``url`` (another host's port is no process here)."""
    from radixtop.incident.bundle.here import find_here
    from radixtop.probes.http import is_loopback_url

    if given:
        for path in given:
            if not os.path.isfile(path):
                raise UsageError(f"replay: --log {printable_line(path)} is not a file: name the server's log file")
        return tuple(given)
    if not is_loopback_url(url):
        return ()
    here = find_here(url)
    return here.logs if here.pid is not None else ()


def run_replay(args: Namespace) -> int:
    from radixtop.incident.common.server import ServerError, auth_headers, base_url
    from radixtop.incident.replay.divergence import compare_runs, format_report
    from radixtop.incident.replay.replay import format_pressure, pressure_json, replay_series
    from radixtop.incident.replay.trace import TraceError, plan_requests, rescale_prefixes

    try:
        url = base_url(args.url)
    except ServerError as exc:
        raise UsageError(str(exc)) from None
    trace, label = load_trace_arg(args.trace)
    logs = _replay_logs(args.log, url)
    info = _server_info(url)
    size = _page_size(info, url, args.page_size)
    if size is not None and size != trace.page_size_hint and trace.prefix_unit == "tokens":
        label += f"; its prefixes are what the prompts shared, not rescaled to page size {size}"
    elif size is not None and size != trace.page_size_hint:
        try:
            trace = rescale_prefixes(trace, size)
        except TraceError as exc:
            raise UsageError(str(exc)) from None
        label += f", prefixes rescaled to page size {size}"
    say = _progress("replay")
    too_long = _longer_than_the_server_takes(info, url, trace)
    if too_long:
        say(too_long)
    if args.no_flush:
        say("--no-flush: the cache is NOT flushed between runs, so later runs may hit what earlier ones cached")
    else:
        say("the server's cache is flushed (POST /flush_cache) before each run")
    if args.max_in_flight:
        say(f"--max-in-flight {args.max_in_flight}: at most {args.max_in_flight} calls out at once; "
            "a call due while they are out waits for an answer")
    if args.namespace_per_request:
        say("--namespace-per-request: every call has a cache namespace of its own (extra_key), "
            "so none reuses another's pages")
    vocab = _vocabulary(info, args.vocab_size, trace)
    try:
        planned = plan_requests(trace, seed=args.seed, vocab=vocab)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    say(f"prompts made up from the model's vocabulary: {vocab.describe()}")
    if logs:  # a path found on the server's stdout is the launcher's text: printable, one line
        say(f"peak token usage also from the batch lines of {', '.join(printable_line(p) for p in logs)}")

    async def go() -> tuple[ReplaySeries, bool]:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        series = await replay_series(
            url, planned, args.runs, flush=not args.no_flush, headers=auth_headers(),
            on_event=lambda e: say(e.message) if e.kind != "flush" else None, should_stop=stop.is_set,
            max_in_flight=args.max_in_flight or None, namespace_per_request=args.namespace_per_request,
            sample_token_usage=True, logs=logs,
        )
        return series, stop.is_set()

    series, stopped = asyncio.run(go())
    report = compare_runs(series, trace)
    if args.json:
        doc = report.to_json()
        doc["source"] = label
        doc.update(pressure_json(series))
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        sys.stdout.write(format_report(report, source=label, extra=format_pressure(series)))
    return ExitStatus.INTERRUPTED if stopped else ExitStatus.OK


# -- analyze ------------------------------------------------------------------------------------

# SGLang's eviction policies that the simulator's cache does not implement.
_UNSIMULATED_POLICIES = ("slru", "tlru")


def run_analyze(args: Namespace) -> int:
    from dataclasses import replace

    from radixtop.incident.analyze.analyze import analyze, format_analysis, format_sweep, parse_sweep, sweep
    from radixtop.sim.engine import SimConfig
    from radixtop.sim.radix import EVICTION_POLICIES

    trace, label = load_trace_arg(args.trace)
    policy = args.eviction_policy.lower()
    if policy in _UNSIMULATED_POLICIES:
        raise UsageError(f"--radix-eviction-policy {policy}: SGLang has it, the simulator does not yet; "
                     f"use one of {', '.join(EVICTION_POLICIES)}")
    config = SimConfig(radix_eviction_policy=policy, disable_radix_cache=args.disable_radix_cache,
                       step_time_s=args.step_ms / 1000.0)
    for name in ("page_size", "max_total_tokens", "max_running_requests"):
        if getattr(args, name) is not None:
            config = replace(config, **{name: getattr(args, name)})
    try:
        if args.sweep:
            field, values = parse_sweep(args.sweep)
            results = sweep(trace, config, field, values, seed=args.seed)
        else:
            field, results = "", [analyze(trace, config, seed=args.seed)]
    except ValueError as exc:  # a setting the engine refuses names its field: say the flag
        import re

        raise UsageError(re.sub(r"^[a-z_]+", lambda m: "--" + m.group(0).replace("_", "-"), str(exc))) from None
    if args.json:
        docs = [{**a.to_json(), "source": label} for a in results]
        print(json.dumps({"sweep": args.sweep, "rows": docs} if args.sweep else docs[0], indent=2, ensure_ascii=False))
    elif args.sweep:
        sys.stdout.write(format_sweep(results, field))
    else:
        sys.stdout.write(format_analysis(results[0], source=label))
    return ExitStatus.OK


# -- record -------------------------------------------------------------------------------------


def run_trace(args: Namespace) -> int:
    """`radixtop trace convert SRC -o OUT [--format radixtop|mooncake]`: a dump, a Mooncake trace
    or any trace radixtop reads, as a trace file or as a Mooncake trace, written 0600: a dump's
    prompts are the users' own."""
    from radixtop.incident.replay.mooncake import dump_mooncake
    from radixtop.incident.replay.trace import TraceError, dump_trace
    from radixtop.rundir import write_file

    trace, label = load_trace_arg(args.source, args.block_size)
    mooncake = args.format == "mooncake"
    out = Path(args.out) if args.out else Path(f"{trace.name}.{'mooncake.jsonl' if mooncake else 'trace.json'}")
    if not out.parent.is_dir():
        raise UsageError(f"-o {out}: its directory does not exist")
    prompts = any(r.input_ids is not None or r.text is not None for r in trace.requests)
    if mooncake:
        block = args.block_size or trace.page_size_hint
        try:
            data = dump_mooncake(trace, block)
        except TraceError as exc:
            raise UsageError(str(exc)) from None
        lines = data.count(b"\n")
        whence = "--block-size" if args.block_size else "the trace's page_size_hint"
        note = (f"{lines:,} Mooncake requests (one a copy), {block} tokens a hash id ({whence}): tell the reader, "
                f"as AIPerf's --isl-block-size {block} or vLLM's --timed-trace-chunk-hash-size {block}")
        namespaces = {r.extra_key for r in trace.requests}
        if len(namespaces) > 1:
            note += "; cache namespaces (extra_key) are not written: their requests share no hash ids"
        prompts = False  # a Mooncake trace holds lengths and hash ids only
    else:
        data = (json.dumps(dump_trace(trace), indent=1) + "\n").encode()
        note = ""
    try:
        write_file(out, data)
    except OSError as exc:
        raise UsageError(f"-o {out}: cannot write it: {exc.strerror or exc}") from None
    mode = "mode 0600: it holds the prompts" if prompts else "mode 0600"
    _progress("trace", False)(f"{label}\nwrote {out} ({mode})" + (f": {note}" if note else ""))
    return ExitStatus.OK


def run_record(args: Namespace) -> int:
    from radixtop.incident.common.server import ServerError, base_url
    from radixtop.incident.replay.record import RecordingProxy
    from radixtop.incident.replay.trace import save_trace

    try:
        url = base_url(args.url)
    except ServerError as exc:
        raise UsageError(str(exc)) from None
    out = Path(args.out)
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: its directory does not exist")
    say = _progress("record", False)

    signals = [0]

    def stopping(note: Callable[[], None]) -> None:
        signals[0] += 1
        if signals[0] > 1:  # the trace is still being written: a second Ctrl-C must not lose it
            say(f"still writing {out}; it takes a moment ({len(proxy.calls)} calls)")
        note()

    async def go() -> RecordingProxy:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping, stop.set)

        def seen(call: RecordedCall) -> None:
            if args.max_requests and len(proxy.calls) >= args.max_requests:
                stop.set()

        proxy.on_call = seen
        try:
            port = await proxy.start()
        except OSError as exc:
            raise UsageError(f"record: {exc}") from None
        say(f"recording: point clients at http://127.0.0.1:{port} (forwarding to {url}); "
            f"Ctrl-C writes {out}"
            + ("" if args.keep_prompts else "; prompts are not kept (--keep-prompts keeps them)"))
        if proxy.page_size is None:
            say(f"{url}/server_info did not say its page_size: the trace's page_size_hint is 1 "
                "(trace convert --format mooncake then needs --block-size)")
        if args.ready_file:
            Path(args.ready_file).write_text(f"{port}\n", encoding="utf-8")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(args.duration or None):
                await stop.wait()
        signals[0] = max(signals[0], 1)
        say(f"stopping: {len(proxy.calls)} calls recorded; the calls in flight get up to 5 s to end")
        await proxy.stop()
        return proxy

    proxy = RecordingProxy(url, keep_prompts=args.keep_prompts, port=args.listen_port)
    asyncio.run(go())
    # Until the trace is written, SIGINT and SIGTERM say so instead of ending the process (the
    # loop's handlers, gone with the loop, did the same while the proxy stopped).
    handlers = {sig: signal.signal(sig, lambda *_: stopping(lambda: None)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        started = time.monotonic()
        say(f"writing {out}: finding the shared prefixes of {len(proxy.calls)} calls")
        try:
            trace = proxy.trace(name=args.name or out.stem)
        except ValueError as exc:
            raise UsageError(f"record: {exc}") from None
        tmp = out.with_name(f".{out.name}.partial")
        save_trace(trace, tmp)
        os.replace(tmp, out)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    note = f"; {proxy.skipped} batch calls forwarded but not recorded" if proxy.skipped else ""
    say(f"wrote {out} in {time.monotonic() - started:.1f} s: {len(trace.requests)} requests over "
        f"{trace.requests[-1].offset_ms / 1000:.1f} s{note}")
    return ExitStatus.OK


# -- confirm ------------------------------------------------------------------------------------


def _ask(
    lines: list[str],
    question: str = "Start the confirmation run as planned? [y/N] ",
    yes: tuple[str, ...] = ("y", "yes"),
) -> bool:
    """The plan and the question on stderr (stdout stays for the result), the answer from the terminal."""
    print("\n".join(lines), file=sys.stderr)
    sys.stderr.write(question)
    sys.stderr.flush()
    answer = sys.stdin.readline()
    return answer.strip().lower() in yes


def watch_other_run(say: Callable[[str], None], poll_s: float = 1.0, limit_s: float = 24 * 3600) -> int:
    """Another radixtop holds the node's confirmation run: follow its progress, then its verdict."""
    from radixtop.incident.confirm.runlock import lock_held_by_other, read_status

    status = read_status()
    say(
        (status.summary() if status else "a confirmation run is in progress on this node")
        + "; watching it instead of starting another"
    )
    shown = 0  # lines noted by the run that this watcher has printed
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        status = read_status()
        lines = list(status.get("lines") or []) if status else []
        noted = int(status.get("noted") or 0) if status else 0
        for line in lines[len(lines) - min(len(lines), max(0, noted - shown)) :]:
            say(line)
        shown = max(shown, noted)
        if status is not None and status.done:
            print(status.get("headline", ""))
            if status.get("body"):
                print(status["body"])
            return ExitStatus.ERROR if status.get("verdict") in (None, "inconclusive") else ExitStatus.OK
        if not lock_held_by_other():
            say("the run's radixtop ended without a verdict (killed?); press c or run confirm again")
            return ExitStatus.ERROR
        time.sleep(poll_s)
    return ExitStatus.ERROR


def run_confirm(args: Namespace) -> int:
    from radixtop.incident.common.server import ServerError
    from radixtop.incident.confirm.confirm import (
        ConfirmCancelled,
        ConfirmOptions,
        PlanError,
        prepare,
    )
    from radixtop.incident.confirm.confirm_run import ConfirmationRun
    from radixtop.incident.confirm.runlock import RunLock
    from radixtop.rundir import RuntimeDirError

    if not args.yes and not sys.stdin.isatty():
        raise UsageError("confirm: stdin is not a terminal, so the plan cannot be approved here; "
                         "pass --yes to approve it")
    trace, label = load_trace_arg(args.trace) if args.trace else (None, None)
    workdir = Path(args.workdir) if args.workdir else Path(f"radixtop-confirm-{time.strftime('%Y%m%d-%H%M%S')}")
    options = ConfirmOptions(
        url=args.url, workdir=workdir.resolve(), trace=trace, trace_label=label, runs=args.runs,
        flush=not args.no_flush, logs=tuple(args.log), pid=args.pid, launch_command=args.launch_command,
        cache=args.control_cache, concurrency_divisor=args.concurrency_divisor,
        control_args=tuple(args.control_arg), stop_original=args.stop_original,
        reproduction=not args.no_reproduction, gpus=args.gpus, own_env=args.own_env, inherit_env=args.inherit_env,
        control_timeout_s=args.control_timeout, bundle=not args.no_bundle,
        signature_files=tuple(args.signatures), vocab_size=args.vocab_size, detectors=args.detectors,
    )
    say = _progress("confirm", False)
    lock = RunLock(args.url, options.workdir)
    try:
        if not lock.acquire():
            return watch_other_run(say)
    except RuntimeDirError as exc:
        raise UsageError(f"confirm: {exc}") from None

    def on_event(event: ConfirmEvent) -> None:
        if event.phase != "plan":
            say(f"[{event.phase}] {event.message}")
            lock.note(event.phase, event.message)

    cancel = threading.Event()

    async def plan_phase() -> Plan:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, cancel.set)
        return await prepare(options, on_event, cancel)

    try:
        try:
            plan = asyncio.run(plan_phase())
        except (PlanError, ServerError) as exc:
            lock.finish("no confirmation run: cannot make a plan", str(exc))
            raise UsageError(f"confirm: {exc}") from None
        except ConfirmCancelled:
            lock.finish("cancelled before anything was started")
            say("cancelled before anything was started")
            return ExitStatus.INTERRUPTED
        described = plan.describe()
        if plan.blockers:
            print("\n".join(described), file=sys.stderr)
            lock.finish("no confirmation run: the plan cannot start", plan.blockers[0])
            raise UsageError(f"confirm: {plan.blockers[0]}")
        if args.yes:
            print("\n".join(described), file=sys.stderr)
            say("approved with --yes")
        elif not _ask(described):
            lock.finish("not approved: nothing was started")
            say(
                "not approved; nothing was started. The evidence bundle is kept."
                if plan.bundle
                else "not approved; nothing was started"
            )
            return ExitStatus.ERROR

        run = ConfirmationRun(plan, on_event)

        async def run_phase() -> Verdict:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, run.cancel)
            return await run.run()

        try:
            verdict = asyncio.run(run_phase())
        except ConfirmCancelled:
            lock.finish("cancelled: the servers radixtop started were stopped")
            say("cancelled; the servers radixtop started were stopped and nothing is left running")
            return ExitStatus.INTERRUPTED
        lock.finish(f"VERDICT: {verdict.verdict}", verdict.format(), verdict.verdict)
    finally:
        lock.release()
    if args.json:
        doc = verdict.to_json()
        doc["plan"] = plan.to_json()
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        sys.stdout.write(verdict.format())
    return ExitStatus.ERROR if verdict.verdict == "inconclusive" else ExitStatus.OK
