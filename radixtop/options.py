"""The TUI's options, typed, built once from the command line (radixtop/cli.py) or by `radixtop
demo`, and handed to the app whole: nothing below reads an argparse Namespace."""

from __future__ import annotations

import os
from argparse import Namespace
from dataclasses import dataclass
from typing import Literal

__all__ = ["ThemeName", "TuiOptions"]

ThemeName = Literal["dark", "light", "high-contrast"]  # --theme's choices


@dataclass(frozen=True)
class TuiOptions:
    logs: tuple[str, ...] = ()  # --log patterns (files or globs)
    from_start: bool = False
    theme: ThemeName | None = None
    signatures: tuple[str, ...] = ()  # extra catalog files
    context: int = 100  # lines kept before a first occurrence (diagnosis/evidence_policy.py's default)
    banner: str | None = None  # a first line for the log pane (the demo says what it started)
    url: str | None = None
    instruments: tuple[str, ...] = ()
    discover: bool = True
    gpu: bool = True
    panes: bool = True  # False: the log pane alone (--no-panes, or RADIXTOP_PANES=0 for benchmarks)
    readonly: bool = False
    actions_dir: str | None = None  # where b and c write (default: the current directory)
    prometheus: str | None = None  # the fleet's Prometheus: the fleet view
    nodes: tuple[str, ...] = ()  # other nodes watched through ssh (--node)
    node_urls: tuple[str, ...] = ()  # --node-url HOST=URL: the server watched there
    ssh_config: str | None = None
    remote_radixtop: str = "radixtop"

    @classmethod
    def from_args(cls, args: Namespace) -> TuiOptions:
        """From the top-level parser's namespace (every subcommand's namespace carries it)."""
        return cls(
            logs=tuple(args.log),
            from_start=args.from_start,
            theme=args.theme,
            signatures=tuple(args.signatures),
            context=args.context,
            url=args.url,
            instruments=tuple(args.instrument),
            discover=not args.no_discover,
            gpu=not args.no_gpu,
            panes=not args.no_panes and os.environ.get("RADIXTOP_PANES") != "0",
            readonly=args.readonly,
            prometheus=args.prometheus,
            nodes=tuple(args.node),
            node_urls=tuple(args.node_url),
            ssh_config=args.ssh_config,
            remote_radixtop=args.remote_radixtop,
        )
