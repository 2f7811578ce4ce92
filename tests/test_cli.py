"""The command line: one subcommand's parser for speed, the same answers as the whole parser, and
`radixtop scan` importing only what scanning needs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from radixtop.cli import SUBCOMMANDS, build_parser

ROOT = Path(__file__).resolve().parent.parent

ARGVS = [
    ["scan", "a.log", "--json", "--signatures", "x.toml", "--context", "5"],
    ["scan", "-", "--matches"],
    ["demo", "--fault", "leak", "--seed", "3", "--theme", "light"],
    ["bundle", "--url", "http://127.0.0.1:1", "--log", "s.log", "--reason", "r", "--json"],
    ["replay", "finding_03330", "--url", "http://127.0.0.1:1", "--runs", "2", "--no-flush"],
    ["record", "--url", "http://127.0.0.1:1", "--out", "t.json", "--duration", "3"],
    ["analyze", "demo_pressure", "--sweep", "page-size=1,16", "--json"],
    ["confirm", "--url", "http://127.0.0.1:1", "--yes", "--control-cache", "keep", "--runs", "1"],
    ["sim"],
]


@pytest.mark.parametrize("argv", ARGVS, ids=lambda argv: argv[0])
def test_one_subcommands_parser_answers_as_the_whole_parser_does(argv: list[str]) -> None:
    assert vars(build_parser(argv[0]).parse_args(argv)) == vars(build_parser().parse_args(argv))


def test_one_subcommands_parser_holds_that_subcommand_only() -> None:
    assert set(SUBCOMMANDS) == {"scan", "demo", "bundle", "replay", "record", "analyze", "confirm", "sim"}
    for name in SUBCOMMANDS:
        with pytest.raises(SystemExit):
            build_parser(name).parse_args([next(other for other in SUBCOMMANDS if other != name)])
    full = build_parser()
    for name in SUBCOMMANDS:
        full.parse_args([name, *next(a[1:] for a in ARGVS if a[0] == name)])


def test_options_before_the_subcommand_still_reach_it(tmp_path: Path) -> None:
    """`radixtop --signatures F scan LOG` builds the whole parser, and F is used."""
    log = tmp_path / "x.log"
    log.write_text("[2026-12-02 14:00:00] zebra crossing failed\n")
    extra = tmp_path / "extra.toml"
    extra.write_text(
        '[[signature]]\nid = "zebra"\ntitle = "zebra"\npattern = "zebra crossing failed"\nseverity = "error"\n'
        'subsystem = "test"\nmeaning = "m"\nfirst_checks = ["c"]\ncompeting = []\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "radixtop", "--signatures", str(extra), "scan", str(log), "--json"],
        capture_output=True, text=True, check=False, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [f["signature"] for f in json.loads(done.stdout)["findings"]] == ["zebra"]


def test_scan_imports_only_what_scanning_needs(tmp_path: Path) -> None:
    """Start-up is imports: no UI, no HTTP, no dataclasses (which pull in inspect and ast), no
    JSON unless --json is asked for."""
    log = tmp_path / "x.log"
    log.write_text(
        "[2026-12-02 14:00:00 TP0] Decode batch, #running-req: 3, token usage: 0.91\n"
        "[2026-12-02 14:00:01 TP0] RadixCacheError: Failed to lock memory page during dynamic prefix eviction\n"
    )
    probe = (
        "import sys, io, contextlib\n"
        "from radixtop.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        f"    code = main(['scan', {str(log)!r}])\n"
        "assert 'radix-page-lock-eviction' in out.getvalue(), out.getvalue()\n"
        "print(code, ' '.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    code, modules = done.stdout.split(" ", 1)
    assert code == "0"
    loaded = set(modules.split())
    assert "radixtop.diagnosis.findings" in loaded  # the probe did scan
    heavy = {"dataclasses", "inspect", "ast", "textual", "rich", "httpx", "asyncio", "json", "tomllib", "psutil"}
    assert not heavy & loaded, sorted(heavy & loaded)
