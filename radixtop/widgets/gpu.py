"""The GPU pane: per GPU memory, utilisation, temperature, power; the processes holding GPU
memory, named when they are the server's; Xid errors with their times; or why NVML is unavailable.

The app hands in the latest GpuSample (kept while NVML fails later: last values stay, marked) and
the server's processes by pid; nothing here does I/O.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Static

from radixtop.widgets.fmt import bar, clock, frozen_banner, size, update_text

MAX_XIDS_SHOWN = 5
NODE_GPUS_OLD_S = 15.0  # another node's GPUs come every 5 s; past this they are marked old


def render_gpus(
    sample: Any,
    *,
    server_pids: Mapping[int, str] | None = None,
    xids: Sequence[Any] = (),
    last_good: Any = None,
    width: int = 80,
    now: float | None = None,
) -> Text:
    """The pane's body. `sample` is the latest GpuSample; `last_good` the last one with GPUs in it,
    shown (marked as old) when the latest has none; `xids` every Xid seen so far."""
    now = time.time() if now is None else now
    out = Text()
    if sample is None:
        out.append("waiting for the first NVML read…", style="italic")
        return out
    shown = sample if sample.gpus else last_good
    if not sample.status.ok:
        if shown is not None and shown is not sample:
            out.append(frozen_banner(sample.status.state, sample.status.since, shown.time) + "\n", style="bold red")
        out.append(f"{sample.status.state}: {sample.status.message}\n", style="red" if shown is None else "yellow")
        if shown is None:
            out.append(
                "GPU figures need the NVIDIA driver on this node; radixtop keeps running without them.",
                style="dim italic",
            )
            return out
    names = server_pids or {}
    bar_width = max(6, min(30, width - 66))
    for g in shown.gpus:
        _gpu_line(out, f"GPU {g.index}", g, bar_width)
        if g.state != "ok" or g.problems:
            out.append(
                f"  {g.state.upper() if g.state != 'ok' else 'note'}: {'; '.join(g.problems[:3])}\n", style="red"
            )
        procs = sorted(g.processes, key=lambda p: (p.pid not in names, -(p.used_bytes or 0)))
        for p in procs[:8]:
            who = names.get(p.pid)
            out.append(f"  pid {p.pid:<8} ", style="bold" if who else "dim")
            out.append(f"{(who or 'not the server'):<24} ", style="cyan" if who else "dim")
            out.append(f"{size(p.used_bytes) if p.used_bytes is not None else 'n/a':>10}\n")
        if len(procs) > 8:
            out.append(f"  … {len(procs) - 8} more processes\n", style="dim")
        if names and g.processes and not any(p.pid in names for p in g.processes):
            out.append("  none of the server's pids is on this GPU (another pid namespace?)\n", style="dim")
    if xids:
        for x in list(xids)[-MAX_XIDS_SHOWN:][::-1]:
            gpu = f"GPU {x.gpu_index}" if x.gpu_index is not None else "GPU ?"
            out.append(f"Xid {x.xid} {clock(x.time)} {gpu}: {x.meaning}\n", style="bold red")
    elif shown.xid_note:
        out.append(shown.xid_note + "\n", style="dim")
    if shown.driver:
        out.append(f"driver {shown.driver} · read in {shown.seconds * 1000:.0f} ms", style="dim")
    out.rstrip()
    return out


def _gpu_line(out: Text, label: str, g: Any, bar_width: int, *, here: bool = True) -> None:
    """One GPU's line: its name, memory bar, utilisation, and for a GPU read here (a GpuInfo) its
    temperature and power, which another node's report (a GpuReport) does not carry."""
    out.append(f"{label} ", style="bold red" if g.state != "ok" else "bold")
    out.append(f"{g.name.removeprefix('NVIDIA ')[:12]:<12} ", style="dim")
    frac = g.memory_used / g.memory_total if g.memory_used is not None and g.memory_total else None
    if frac is not None:
        colour = "red" if frac >= 0.95 else ("yellow" if frac >= 0.85 else "green")
        for ch, n in bar([frac], bar_width, ("█", "░")):
            out.append(ch * n, style=colour if ch == "█" else "dim")
        out.append(f" {size(g.memory_used)}/{size(g.memory_total)}")
    else:
        out.append("memory —")
    out.append(f"  util {g.util_percent if g.util_percent is not None else '—'}%")
    if here:
        out.append(f"  {g.temperature_c if g.temperature_c is not None else '—'}°C")
        if g.power_w is not None:
            limit = f"/{g.power_limit_w:.0f}" if g.power_limit_w else ""
            out.append(f"  {g.power_w:.0f}{limit} W")
    out.append("\n")


def render_node_gpus(nodes: Sequence[Any], *, width: int = 80, now: float | None = None) -> Text:
    """Other nodes' GPUs as their streams last reported them (probes/node_link.py NodeGpus), each
    line named by its node; its age where it is old."""
    now = time.time() if now is None else now
    out = Text()
    bar_width = max(6, min(30, width - 66))
    for node in nodes:
        age = now - node.at
        old = f" (as of {age:.0f}s ago)" if age > NODE_GPUS_OLD_S else ""
        if not node.gpus:
            out.append(f"{node.node}: {node.unavailable or 'no GPU'}{old}\n", style="dim")
        for g in node.gpus:
            _gpu_line(out, f"{node.node} GPU {g.index}", g, bar_width, here=False)
            if g.pids:
                out.append(f"  pids {', '.join(str(p) for p in g.pids[:8])}{old}\n", style="dim")
    out.rstrip()
    return out


class GpuPane(Vertical):
    DEFAULT_CSS = """
    GpuPane { height: 1fr; }
    GpuPane > #gpu-title { height: 1; background: $panel; text-style: bold; padding: 0 1; }
    GpuPane > VerticalScroll { height: 1fr; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield Static("GPU", id="gpu-title")
        with VerticalScroll():
            yield Static("waiting for the first NVML read…", id="gpu-body")

    _last: tuple[Any, ...] | None = None

    def on_resize(self) -> None:
        if self._last is not None:  # the bars' width is the pane's
            self.show(self._last[0], **self._last[1])

    def show(
        self,
        sample: Any,
        *,
        server_pids: Mapping[int, str] | None = None,
        xids: Sequence[Any] = (),
        last_good: Any = None,
        now: float | None = None,
        nodes: Sequence[Any] = (),
    ) -> None:
        self._last = (sample, {"server_pids": server_pids, "xids": xids, "last_good": last_good, "now": now,
                               "nodes": nodes})
        title = Text("GPU", style="bold")
        if sample is not None:
            state = sample.status.state
            title.append(f"  {state}", style="green" if state == "ok" else "red")
            if sample.gpus:
                title.append(f"  {len(sample.gpus)} GPU{'s' if len(sample.gpus) != 1 else ''}", style="dim")
        update_text(self.query_one("#gpu-title", Static), title)
        body = render_gpus(
            sample, server_pids=server_pids, xids=xids, last_good=last_good, width=self.size.width or 80, now=now
        )
        if nodes:
            body.append("\n")
            body.append_text(render_node_gpus(nodes, width=self.size.width or 80, now=now))
        update_text(self.query_one("#gpu-body", Static), body)
