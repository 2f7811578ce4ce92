"""docs/screenshot.svg: `radixtop demo` (lock-race, seed 7) at the crash, 160x48, through run_test.

    python tools/screenshot.py docs/screenshot.svg

Runs what `radixtop demo` runs (radixtop.demo.start_demo and the same TUI options), headless,
and saves the screen once the status line says the server is DOWN."""

import asyncio
import sys
import time
from dataclasses import replace
from pathlib import Path

from radixtop.demo import start_demo
from radixtop.diagnosis.catalog import load_catalog
from radixtop.options import TuiOptions
from radixtop.tui.app import RadixtopApp, action_settings, live_options

OUT = Path(sys.argv[1])


async def main() -> None:
    from radixtop.cli import build_parser

    args = build_parser().parse_args(["demo"])
    demo = start_demo(args.fault, seed=args.seed)  # a /tmp/radixtop-demo-* directory, as the demo's
    try:
        options = replace(
            TuiOptions.from_args(args), logs=(str(demo.log_file),), from_start=True, url=demo.url,
            actions_dir=str(demo.workdir),
            banner=(f"demo: simulated SGLang at {demo.url}, fault {demo.fault}; logs, bundles (b) and "
                    f"confirmation runs (c) in {demo.workdir}"),
        )
        app = RadixtopApp(log_patterns=list(options.logs), from_start=options.from_start, theme=options.theme,
                          catalog=load_catalog(options.signatures), context=options.context, banner=options.banner,
                          live=live_options(options), readonly=options.readonly, actions=action_settings(options))
        async with app.run_test(size=(160, 48)) as pilot:
            deadline = time.monotonic() + 120
            while "DOWN since" not in str(app.status_line.render()):
                assert time.monotonic() < deadline, "no crash within 120 s"
                await pilot.pause(0.5)
            await pilot.pause(4)
            print(str(app.status_line.render()))
            app.save_screenshot(OUT.name, str(OUT.parent))
            await pilot.press("q")
    finally:
        demo.stop()
        print(demo.workdir)


asyncio.run(main())
