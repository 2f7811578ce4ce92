"""`radixtop scan`: scan logs headless for known failure signatures.

Three outputs: a short human report (default), one JSON object (`--json`), or every matching line
as `FILE:LINE:SIGNATURE:TEXT` (`--matches`, like `grep -n`). Exit status 0 when the scan ran,
findings or not; 2 with one line on stderr when an input or a catalog cannot be used.

`--found` scans the log of each server discovery finds on this node. `--node HOST` adds other
nodes' scans, run there through the user's ssh (radixtop.probes.node_scan) and merged here
(radixtop.diagnosis.node_findings): each finding tagged with its node, on this node's clock. A node
that gives none is one line on stderr; the exit status is 1 only when no node gave a scan.

It must start like grep: only the catalog, the matcher, the scanner and the findings are
imported (no textual, no httpx); `json` only for --json. RADIXTOP_SCAN_ENGINE=hyperscan|re2|re
forces a matching engine (the benchmark uses it to time the fallbacks). RADIXTOP_SCAN_THREADS=0|1
turns the scan worker thread off or on; by default it runs on a big input when a core is idle.
"""

from __future__ import annotations

import os
import sys
from argparse import Namespace
from typing import TYPE_CHECKING, TextIO

from radixtop.errors import ExitStatus, UsageError

if TYPE_CHECKING:
    from radixtop.diagnosis.catalog import Catalog
    from radixtop.diagnosis.findings import Occurrence, Report
    from radixtop.diagnosis.matcher import Matcher
    from radixtop.probes.logscan import FileSummary

ENGINE_ENV = "RADIXTOP_SCAN_ENGINE"
THREADS_ENV = "RADIXTOP_SCAN_THREADS"
_TEXT_WIDTH = 160
_ID_WIDTH = 28
_ellipsis = "…"  # "..." on a stdout that cannot encode it (see _fit_stdout)


def _fit_stdout() -> bool:
    """Whether stdout can encode Unicode. One that cannot (PYTHONIOENCODING=ascii, a C locale
    without Python's UTF-8 mode) then writes "?" for what it cannot show, "..." for the report's
    ellipsis, and --json escapes non-ASCII, instead of a UnicodeEncodeError half-way."""
    global _ellipsis
    try:
        "…\u2502".encode(getattr(sys.stdout, "encoding", None) or "ascii")
        return True
    except (UnicodeEncodeError, LookupError):
        pass
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="replace")
    _ellipsis = "..."
    return False


def run_scan(args: Namespace) -> int:
    try:
        return _run(args)
    except BrokenPipeError:
        # `radixtop scan --matches ... | head`: the reader left; say nothing more, like grep.
        _silence_stdout()
        return ExitStatus.OK


def _run(args: Namespace) -> int:
    from radixtop.diagnosis.catalog import CatalogError, load_catalog
    from radixtop.probes.logscan import ScanInputError, check_input

    if args.json and args.matches:
        raise UsageError("--json and --matches cannot be combined; choose one output")
    if args.node and args.matches:
        raise UsageError("--matches prints this node's lines: drop --node, or --matches for the report")
    if args.node_log and not args.node:
        raise UsageError("--node-log names a log on a --node: add --node HOST")
    paths = list(args.logs)
    if args.found:
        paths += _found_logs()
    if not paths and not args.node:
        raise UsageError("scan: name the LOG files (or - for stdin), or pass --found or --node HOST")
    if paths.count("-") > 1:
        raise UsageError("stdin (-) is named more than once; name it once")
    try:
        for path in paths:
            check_input(path)
        catalog = load_catalog(args.signatures)
    except (ScanInputError, CatalogError) as exc:
        raise UsageError(str(exc)) from None
    threads = _threads_choice()
    unicode_ok = _fit_stdout()
    matcher = _make_matcher(catalog)
    targets = _node_targets(args) if args.node else []
    try:
        if args.matches:
            return _print_matches(paths, matcher, sys.stdout, threads)
        report, summaries = _build_report(paths, catalog, matcher, args.context, threads)
    except ScanInputError as exc:
        raise UsageError(str(exc)) from None
    notes = _notes(catalog, matcher, summaries)
    if targets:
        return _across_nodes(report.to_json() if paths else None, targets, args, unicode_ok)
    if args.json:
        import json

        doc = report.to_json()
        doc["engine"] = matcher.engine
        doc["fallback_note"] = matcher.fallback_note
        doc["notes"] = notes
        json.dump(doc, sys.stdout, indent=2, ensure_ascii=not unicode_ok)
        sys.stdout.write("\n")
    else:
        _print_report(report, summaries, matcher, notes, sys.stdout)
    sys.stdout.flush()
    return ExitStatus.OK


def _across_nodes(here: dict | None, targets: list[tuple[str, list[str]]], args: Namespace, unicode_ok: bool) -> int:
    """This node's report (None: no log here) and each node's, merged: printed, or one JSON object."""
    import asyncio
    import json

    from radixtop.diagnosis.node_findings import LOCAL, across_nodes, initiating_across, read_scan, report_lines
    from radixtop.probes.node_scan import scan_nodes

    answers = asyncio.run(scan_nodes(targets, ssh_config=args.ssh_config, timeout_s=args.timeout,
                                     command=args.remote_radixtop))
    scans = ([read_scan(here, LOCAL)] if here is not None else []) + [a.scan for a in answers if a.scan is not None]
    clocks = {a.host: a.skew for a in answers if a.skew is not None}
    if args.json:
        nodes: list[dict] = [{"node": LOCAL, "ok": True, "lines": scans[0].lines}] if here is not None else []
        for a in answers:
            entry: dict = {"node": a.host, "ok": a.scan is not None}
            if a.scan is not None:
                entry["lines"] = a.scan.lines
            if a.error:
                entry["error"] = a.error
            if a.skew is not None:
                entry.update(clock_skew_s=round(a.skew.offset_s, 6),
                             clock_skew_uncertainty_s=round(a.skew.uncertainty_s, 6),
                             clock_correction_s=round(a.skew.correction_s, 6))
            nodes.append(entry)
        initiating = initiating_across(scans)
        doc = {"nodes": nodes, "initiating": None if initiating is None else initiating.to_json(),
               "findings": [f.to_json() for f in across_nodes(scans)]}
        json.dump(doc, sys.stdout, indent=2, ensure_ascii=not unicode_ok)
        sys.stdout.write("\n")
    else:
        skews = {host: (s.offset_s, s.uncertainty_s, s.correction_s) for host, s in clocks.items()}
        sys.stdout.write("".join(f"{line}\n" for line in report_lines(scans, skews, _ellipsis)))
    sys.stdout.flush()
    for a in answers:
        if a.error:
            print(f"radixtop: {a.error}", file=sys.stderr)
    return ExitStatus.OK if scans else ExitStatus.ERROR


def _found_logs() -> list[str]:
    """The log file of each server discovery finds on this node (`--found`)."""
    import asyncio

    from radixtop.probes.discovery import discover

    found = asyncio.run(discover())
    logs = list(dict.fromkeys(s.log_path for s in found.servers if s.log_path))
    if not logs:
        raise UsageError("--found: no server with a log file found on this node; name the LOG files instead")
    return logs


def _node_targets(args: Namespace) -> list[tuple[str, list[str]]]:
    """(host, logs named there) per --node; bad input is one line."""
    from radixtop.probes.remote import check_host, check_remote_command

    hosts = list(dict.fromkeys(args.node))
    try:
        for host in hosts:
            check_host(host)
        check_remote_command(args.remote_radixtop)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.ssh_config is not None and not os.path.isfile(args.ssh_config):
        raise UsageError(f"--ssh-config: {args.ssh_config}: no such file; give the ssh config file to use")
    logs: dict[str, list[str]] = {h: [] for h in hosts}
    for spec in args.node_log:
        host, sep, path = spec.partition("=")
        if not sep or host not in logs or not path:
            raise UsageError(f"--node-log {spec[:80]!r}: give HOST=PATH for a host given with --node")
        logs[host].append(path)
    return list(logs.items())


def _make_matcher(catalog: Catalog) -> Matcher:
    from radixtop.diagnosis.matcher import ENGINES, Matcher, MatcherError

    engine = os.environ.get(ENGINE_ENV) or None
    if engine is not None and engine not in ENGINES:
        raise UsageError(f"{ENGINE_ENV}={engine} is not an engine; use one of {', '.join(ENGINES)}")
    try:
        return Matcher(catalog.signatures, engine=engine)
    except MatcherError as exc:
        raise UsageError(f"{exc}; unset {ENGINE_ENV} to use the best available engine") from None


def _threads_choice() -> bool | None:
    value = os.environ.get(THREADS_ENV, "")
    if value in ("", "auto"):
        return None  # LogScanner decides per input
    if value in ("0", "1"):
        return value == "1"
    raise UsageError(f"{THREADS_ENV}={value} is not 0, 1 or auto; unset it to let radixtop choose")


def _print_matches(paths: list[str], matcher: Matcher, out: TextIO, threads: bool | None) -> int:
    from radixtop.probes.logscan import LogScanner, ScanHit

    ids = [sig.id.encode() for sig in matcher.signatures]
    sink = out.buffer  # raw bytes: the line exactly as stored, like grep
    scanner = LogScanner(matcher, details=False, threads=threads)

    names: dict[str, bytes] = {}

    def emit(hit: ScanHit) -> None:
        name = names.get(hit.file)
        if name is None:
            name = names[hit.file] = os.fsencode(hit.file)  # a path's own bytes, as grep prints
        sink.write(b"%s:%d:%s:%s\n" % (name, hit.line, ids[hit.signature_index], hit.raw))

    out.flush()
    for path in paths:
        summary = scanner.scan(path, emit)
        if summary.note:
            sink.flush()
            print(f"radixtop: note: {summary.note}", file=sys.stderr)
    sink.flush()
    return ExitStatus.OK


def _build_report(
    paths: list[str], catalog: Catalog, matcher: Matcher, context: int, threads: bool | None
) -> tuple[Report, list[FileSummary]]:
    from radixtop.diagnosis.findings import FindingsBuilder
    from radixtop.probes.logscan import scan_into

    builder = FindingsBuilder(catalog, matcher=matcher, context=context)
    summaries = scan_into(builder, paths, matcher, context=context, threads=threads)
    return builder.report(), summaries


def _notes(catalog: Catalog, matcher: Matcher, summaries: list[FileSummary]) -> list[str]:
    notes = list(getattr(catalog, "notes", ()))
    if matcher.fallback_note:
        notes.append(matcher.fallback_note)
    notes.extend(s.note for s in summaries if s.note)
    return notes


# -- the human report ----------------------------------------------------------------------------


def _where(occ: Occurrence, rank: bool = True) -> str:
    parts = [f"{occ.file}:{occ.line}"]
    if occ.time:
        parts.append(occ.time)
    if rank and occ.rank:
        parts.append(occ.rank)
    return "  ".join(parts)


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _TEXT_WIDTH else text[: _TEXT_WIDTH - len(_ellipsis)] + _ellipsis


def _print_report(
    report: Report,
    summaries: list[FileSummary],
    matcher: Matcher,
    notes: list[str],
    out: TextIO,
) -> None:
    w = out.write
    files = len(summaries)
    w(
        f"radixtop scan: {files} input{'s' if files != 1 else ''}, {report.lines:,} lines, "
        f"{len(report.findings)} signature{'s' if len(report.findings) != 1 else ''} found "
        f"(engine: {matcher.engine})\n"
    )
    for note in notes:
        w(f"note: {note}\n")
    if not report.findings:
        w("No known failure signature matched.\n")
        return

    if report.initiating is not None:
        sig_id, occ = report.initiating
        severity = next((s.severity for s in matcher.signatures if s.id == sig_id), "?")
        w(
            f"\nInitiating rank: {occ.rank or '(no rank)'}  {sig_id} ({severity})  "
            f"{_where(occ, rank=False)}\n"
        )
        w(f"  > {_clip(occ.text)}\n")
    first_by_rank = getattr(report, "first_by_rank", None) or {}
    if len(first_by_rank) > 1:
        ranks = ", ".join(
            f"{rank or 'no rank'} {occ.time or '?'} ({sig_id})"
            for rank, (sig_id, occ) in first_by_rank.items()
        )
        w(f"First warning-or-worse per rank: {ranks}\n")

    fp = report.fingerprint
    if fp is not None:
        w(f"Fingerprint INFO -> WARN -> ERROR ({'complete' if fp.complete else 'incomplete'}):\n")
        for label, step, step_sig in (
            ("INFO", fp.info, fp.info_signature),
            ("WARN", fp.warn, fp.warn_signature),
            ("ERROR", fp.error, fp.error_signature),
        ):
            if step is None:
                w(f"  {label:<5}  (none)\n")
            else:
                w(f"  {label:<5}  {step_sig or '':<{_ID_WIDTH}}  {_where(step)}\n")

    w("\nFindings by first occurrence:\n")
    width = max(len(f.signature.id) for f in report.findings)
    for finding in report.findings:
        sig = finding.signature
        w(f"  {sig.severity:<8} {finding.count:>7,}x  {sig.id:<{width}}  first {_where(finding.first)}\n")
        w(f"      {sig.title}\n")
        w(f"      > {_clip(finding.first.text)}\n")

    if report.batch_at_failure:
        w("\nToken usage at failure (last batch line per rank before the first error):\n")
        for rank in sorted(report.batch_at_failure, key=_rank_order):
            b = report.batch_at_failure[rank]
            usage = "-" if b.token_usage is None else f"{b.token_usage:.2f}"
            running = "-" if b.running_req is None else str(b.running_req)
            queued = "-" if b.queue_req is None else str(b.queue_req)
            w(
                f"  {rank or '(no rank)':<10} {b.kind:<8} token usage {usage}  "
                f"running {running}  queued {queued}\n"
            )


def _rank_order(rank: str) -> tuple:
    # "TP10" after "TP9": compare the digits as numbers.
    import re

    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", rank))


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
