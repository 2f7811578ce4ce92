"""Other nodes' evidence in this node's bundle: `radixtop bundle --node HOST`.

For each node, through the user's own ssh (radixtop.probes.remote, the same way `radixtop discover
--node` goes): first `radixtop discover --json` there (what the node holds, and its clock against
this one's, within half the round trip), then `radixtop bundle --stream` there, which writes that
node's own bundle as a .tar.gz on stdout. The stream is written to a file up to a cap, unpacked
as hostile (radixtop.incident.bundle.untar) into `nodes/<host>/`, and checked against its own
manifest; its timeline.json, on this node's clock (minus the skew) and tagged with the host, joins
this node's on the bundle's one timeline.

The skew is the node's report's time minus the midpoint of the ssh round trip that fetched it, so
the truth lies within ± half that round trip; `ClockSkew.correction_s` says what is subtracted from
the node's times (nothing when the skew is within its uncertainty of zero).

A node that cannot be reached, has no radixtop, or sends something that is not a bundle is one
line (`nodes/<host>.note.txt`, the bundle's notes and README); the rest of the bundle is written.
Nothing from the node is ever run or read as code: its report and timeline are bounded JSON whose
every field is checked, and its files are stored as they came.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixtop.bounded import load_json
from radixtop.incident.bundle.bundle import verify_bundle
from radixtop.incident.bundle.timeline import Timeline, from_json, shifted
from radixtop.incident.bundle.untar import UnpackError, unpack_bundle
from radixtop.probes.remote import ClockSkew, at_most, reach, run_remote
from radixtop.textsafe import printable_line

__all__ = ["MAX_NODES", "MAX_STREAM_BYTES", "NodeBundles", "NodeOptions", "NodePart", "NodeTarget", "folder_names"]

MAX_STREAM_BYTES = 1 << 30  # a node's .tar.gz as it streams in
MAX_NODES = 64  # in one bundle
MAX_AT_ONCE = 8  # nodes bundled at once
MAX_TIMELINE_BYTES = 32 << 20
DISCOVER_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class NodeTarget:
    """A node to bundle, and what the user named there (else the node finds its server itself)."""

    host: str
    url: str | None = None
    logs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeOptions:
    ssh_config: str | None = None
    timeout_s: float = 300.0  # each node's bundle; its discover gets at most DISCOVER_TIMEOUT_S
    command: str = "radixtop"
    max_bytes: int = MAX_STREAM_BYTES
    reason: str = "manual"


@dataclass(frozen=True, slots=True)
class NodePart:
    """One node's part of the bundle: where its bundle lies, or the one line why it is not there."""

    host: str
    folder: str  # "nodes/<host>", relative to the bundle
    error: str = ""
    skew: ClockSkew | None = None
    hostname: str = ""
    radixtop_version: str = ""
    files: int = 0
    correction_s: float = 0.0  # subtracted from the node's times on the timeline
    problems: tuple[str, ...] = ()  # its own manifest's check
    seconds: float = 0.0
    timeline: Timeline | None = field(default=None, compare=False)  # on this node's clock, tagged

    @property
    def ok(self) -> bool:
        return not self.error

    def summary(self) -> str:
        """One line for the README and the command's output."""
        if not self.ok:
            return f"{self.host}: not collected: {self.error}"
        line = f"{self.host}: {self.folder}/ (hostname {self.hostname}, radixtop {self.radixtop_version or '?'}"
        if self.skew is not None:
            line += f"; clock {self.skew.offset_s:+.3f} s ± {self.skew.uncertainty_s:.3f} s against this one, "
            line += f"its times moved by {-self.correction_s:+.3f} s" if self.correction_s else "not corrected"
        line += f"; {self.files} files"
        if self.problems:
            line += f"; its manifest check: {self.problems[0]}"
        return line + ")"

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"node": self.host, "folder": self.folder, "ok": self.ok}
        if self.error:
            doc["error"] = self.error
        else:
            doc.update(hostname=self.hostname, radixtop=self.radixtop_version, files=self.files,
                       manifest_problems=list(self.problems))
        if self.skew is not None:
            doc["clock_skew_s"] = round(self.skew.offset_s, 6)
            doc["clock_skew_uncertainty_s"] = round(self.skew.uncertainty_s, 6)
            doc["clock_correction_s"] = round(self.correction_s, 6)
        doc["seconds"] = round(self.seconds, 3)
        return doc


def folder_names(hosts: Sequence[str]) -> list[str]:
    """A folder name per host (`user@gpu-7:22` -> `user@gpu-7_22`), unique, never hidden."""
    names: list[str] = []
    for host in hosts:
        base = re.sub(r"[^A-Za-z0-9._@-]", "_", host).lstrip(".") or "node"
        name, n = base, 1
        while name in names or name == "local":
            n += 1
            name = f"{base}-{n}"
        names.append(name)
    return names


class NodeBundles:
    """Collects the nodes' bundles into `nodes/` of a bundle being written (take_bundle's `nodes`)."""

    def __init__(self, targets: Sequence[NodeTarget], options: NodeOptions) -> None:
        self.targets = list(targets)
        self.options = options
        self.parts: list[NodePart] = []

    def collect(self, root: Path, cancel: threading.Event) -> list[NodePart]:
        """Every node's part, written under `root` (the bundle's folder being written); blocks until
        each node answered, failed or ran out of time, or `cancel` is set."""
        self.parts = asyncio.run(self._all(root, cancel))
        return self.parts

    async def _all(self, root: Path, cancel: threading.Event) -> list[NodePart]:
        (root / "nodes").mkdir(exist_ok=True)  # not parents: a cancelled bundle's folder is gone
        names = folder_names([t.host for t in self.targets])
        work = asyncio.ensure_future(at_most(MAX_AT_ONCE, [
            functools.partial(self._one, t, root, n) for t, n in zip(self.targets, names, strict=True)
        ]))
        while not work.done():
            await asyncio.wait({work}, timeout=0.1)
            if cancel.is_set():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
                return []
        return list(work.result())

    async def _one(self, target: NodeTarget, root: Path, name: str) -> NodePart:
        opts = self.options
        folder = f"nodes/{name}"
        answer = await reach(target.host, ssh_config=opts.ssh_config, command=opts.command,
                             timeout_s=min(DISCOVER_TIMEOUT_S, opts.timeout_s))
        if answer.report is None:
            return NodePart(target.host, folder, error=answer.error, seconds=answer.seconds)
        report = answer.report
        args = ["bundle", "--stream", "--reason", opts.reason]
        if target.url:
            args += ["--url", target.url]
        for log in target.logs:
            args += ["--log", log]
        partial = root / "nodes" / f".{name}.tar.gz.partial"
        try:
            with open(partial, "xb") as sink:
                run = await run_remote(target.host, args, ssh_config=opts.ssh_config, timeout_s=opts.timeout_s,
                                       command=opts.command, max_bytes=opts.max_bytes, sink=sink)
            seconds = answer.seconds + run.seconds
            if not run.ok:
                return NodePart(target.host, folder, error=run.error, skew=answer.skew, seconds=seconds)
            try:
                files = await asyncio.to_thread(unpack_bundle, partial, root / folder)
            except UnpackError as exc:
                return NodePart(target.host, folder, skew=answer.skew, seconds=seconds,
                                error=f"{target.host}: its bundle stream is refused: {exc}; "
                                      f"is the radixtop there radixtop? try `ssh {target.host} {opts.command} "
                                      "bundle --stream > node.tar.gz`")
        except OSError as exc:
            return NodePart(target.host, folder, error=f"{target.host}: its bundle could not be stored here "
                                                       f"({exc.strerror or exc})", skew=answer.skew)
        finally:
            partial.unlink(missing_ok=True)
        problems = await asyncio.to_thread(_verified, root / folder)
        timeline, why = await asyncio.to_thread(_timeline, root / folder)
        if why:
            problems.append(f"timeline.json: {why}; its events are not on the timeline")
        offset = answer.skew.correction_s if answer.skew is not None else 0.0
        return NodePart(
            target.host, folder, skew=answer.skew, hostname=report.hostname,
            radixtop_version=report.radixtop_version, files=files, correction_s=offset, problems=tuple(problems),
            seconds=seconds, timeline=None if timeline is None else shifted(timeline, offset, target.host),
        )



def _verified(folder: Path) -> list[str]:
    return [printable_line(p, 200) for p in verify_bundle(folder)]


def _timeline(folder: Path) -> tuple[Timeline | None, str]:
    """The node's timeline.json, read as hostile; (None, why) where it has none or it is not one."""
    path = folder / "timeline.json"
    try:
        if not path.is_file():
            return None, "none (a radixtop there that writes none)"
        if path.stat().st_size > MAX_TIMELINE_BYTES:
            return None, f"over {MAX_TIMELINE_BYTES >> 20} MiB"
        return from_json(load_json(path.read_bytes(), "timeline.json", max_bytes=MAX_TIMELINE_BYTES)), ""
    except (OSError, ValueError) as exc:
        return None, printable_line(str(exc), 160)
