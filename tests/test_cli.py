"""The command line: one table of subcommands, one subcommand's parser for speed with the same
answers as the whole parser, options before a subcommand taken or refused (never dropped), one
wording per option check, the exit statuses, and `radixtop scan` importing only what scanning needs."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from radixtop.cli import SUBCOMMANDS, TUI_OPTIONS, TUI_RUNNER, build_parser, main
from radixtop.errors import ExitStatus, UsageError
from radixtop.sim.cli import parse_options

ROOT = Path(__file__).resolve().parent.parent

ARGVS = [
    ["scan", "a.log", "--json", "--signatures", "x.toml", "--context", "5"],
    ["scan", "-", "--matches"],
    ["discover", "--json", "--node", "gpu-7", "--node", "me@gpu-8", "--ssh-config", "cfg", "--timeout", "5",
     "--no-local", "--remote-radixtop", "/opt/venv/bin/radixtop"],
    ["fleet", "--prometheus", "http://127.0.0.1:9090", "--json", "--timeout", "3"],
    ["follow", "--json", "--url", "http://127.0.0.1:1", "--log", "s.log", "--backlog", "10"],
    ["demo", "--fault", "leak", "--seed", "3", "--theme", "light"],
    ["bundle", "--url", "http://127.0.0.1:1", "--log", "s.log", "--reason", "r", "--json"],
    ["replay", "finding_03330", "--url", "http://127.0.0.1:1", "--runs", "2", "--no-flush", "--max-in-flight", "4",
     "--namespace-per-request"],
    ["record", "--url", "http://127.0.0.1:1", "--out", "t.json", "--duration", "3"],
    ["trace", "convert", "dumps/", "-o", "t.jsonl", "--format", "mooncake", "--block-size", "16"],
    ["analyze", "demo_pressure", "--sweep", "page-size=1,16", "--json"],
    ["confirm", "--url", "http://127.0.0.1:1", "--yes", "--control-cache", "keep", "--runs", "1"],
    ["sim"],
]


@pytest.mark.parametrize("argv", ARGVS, ids=lambda argv: argv[0])
def test_one_subcommands_parser_answers_as_the_whole_parser_does(argv: list[str]) -> None:
    assert vars(build_parser(argv[0]).parse_args(argv)) == vars(build_parser().parse_args(argv))


def test_one_subcommands_parser_holds_that_subcommand_only() -> None:
    assert set(SUBCOMMANDS) == {
        "scan", "discover", "fleet", "follow", "demo", "bundle", "replay", "record", "trace", "analyze", "confirm",
        "sim",
    }
    for name in SUBCOMMANDS:
        with pytest.raises(UsageError, match="invalid choice"):
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
    )
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


def test_every_runner_in_the_table_names_a_function() -> None:
    for runner in [TUI_RUNNER, *(command.runner for command in SUBCOMMANDS.values())]:
        module, _, function = runner.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), runner


def refusal(capsys: pytest.CaptureFixture, *argv: str) -> str:
    """What main says for argv that must be refused: one line, exit status USAGE, nothing run."""
    assert main(list(argv)) == ExitStatus.USAGE
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("radixtop: ") and out.err.count("\n") == 1, out.err
    return out.err


def test_the_tuis_url_and_log_before_bundle_are_refused_not_dropped(capsys: pytest.CaptureFixture) -> None:
    """bundle has --url and --log of its own: given before it, they once parsed to url=None."""
    argv = ["--url", "http://10.0.0.1:30000", "--log", "s.log", "bundle"]
    with pytest.raises(
        UsageError, match=r"^--url before `bundle` is the TUI's; give it after the subcommand: radixtop bundle --url"
    ):
        build_parser().parse_args(argv)
    assert "radixtop bundle --url" in refusal(capsys, *argv)
    args = build_parser().parse_args(["bundle", "--url", "http://10.0.0.1:30000", "--log", "s.log"])
    assert args.url == "http://10.0.0.1:30000" and args.log == ["s.log"]


def test_a_tui_option_before_scan_is_refused(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("[2026-12-02 14:00:00] nothing\n")
    err = refusal(capsys, "--theme", "light", "scan", str(log))
    assert err == (
        "radixtop: --theme applies only to the TUI (radixtop with no subcommand); drop it from `radixtop scan`\n"
    )


SAMPLE = {"--log": ["x.log"], "--theme": ["light"], "--url": ["http://127.0.0.1:1"], "--instrument": ["http://127.0.0.1:2"],
          "--prometheus": ["http://127.0.0.1:3"], "--node": ["gpu-9"], "--node-url": ["gpu-9=http://127.0.0.1:4"],
          "--ssh-config": ["cfg"], "--remote-radixtop": ["/opt/radixtop"]}
VALID = {a[0]: a[1:] for a in ARGVS}  # each subcommand's own argv that parses


def _parses(argv: list[str]) -> bool:
    try:
        build_parser().parse_args(argv)
    except UsageError:
        return False
    return True


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_every_tui_option_before_every_subcommand_is_refused_by_name(name: str) -> None:
    parser = build_parser()
    for flag in TUI_OPTIONS:
        argv = [flag, *SAMPLE.get(flag, []), name, *VALID[name]]
        with pytest.raises(UsageError) as refused:
            parser.parse_args(argv)
        says = str(refused.value)
        assert says.startswith(f"{flag} ") and "\n" not in says
        takes = _parses([name, *VALID[name], flag, *SAMPLE.get(flag, [])])
        assert (f"give it after the subcommand: radixtop {name} {flag}" in says) is takes, says
        assert ("applies only to the TUI" in says) is not takes, says


def test_the_tuis_options_after_demo_reach_it() -> None:
    args = build_parser().parse_args(
        ["demo", "--no-panes", "--no-gpu", "--no-discover", "--theme", "light", "--readonly"]
    )
    assert (args.no_panes, args.no_gpu, args.no_discover, args.theme, args.readonly) == (
        True, True, True, "light", True
    )


def test_global_options_before_a_subcommand_are_taken_where_it_has_them(capsys: pytest.CaptureFixture) -> None:
    parse = build_parser().parse_args
    both = parse(["--signatures", "a.toml", "scan", "--signatures", "b.toml", "x.log"])
    assert both.signatures == ["a.toml", "b.toml"]  # both places count
    assert parse(["--context", "5", "scan", "x.log"]).context == 5
    assert parse(["--context", "5", "scan", "--context", "7", "x.log"]).context == 7  # the later one
    assert parse(["scan", "x.log"]).context == 100
    assert parse(["--readonly", "scan", "x.log"]).readonly is True  # no action: nothing to refuse
    assert parse(["--readonly", "demo"]).readonly is True
    with pytest.raises(UsageError, match=r"^`radixtop replay` does not take --signatures; drop it"):
        parse(["--signatures", "a.toml", "replay", "t", "--url", "http://127.0.0.1:1"])
    assert "`radixtop sim` does not take --readonly" in refusal(capsys, "--readonly", "sim", "--port", "0")
    assert "--readonly: `bundle` is an action" in refusal(capsys, "--readonly", "bundle", "--out", "x")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["scan", "--context", "-1", "x.log"], "--context: must be at least 0, got -1"),
        (["--context", "x", "--log", "x.log"], "--context: must be a whole number, got 'x'"),
        (["replay", "t", "--url", "u", "--runs", "0"], "--runs: must be at least 1, got 0"),
        (["confirm", "--url", "u", "--runs", "0"], "--runs: must be at least 1, got 0"),
        (["confirm", "--url", "u", "--concurrency-divisor", "0"], "--concurrency-divisor: must be at least 1, got 0"),
        (["replay", "t", "--url", "u", "--vocab-size", "8"], "--vocab-size: must be at least 16, got 8"),
        (
            ["replay", "t", "--url", "u", "--page-size", "0"],
            "--page-size: must be a number of tokens (at least 1) or auto, got '0'",
        ),
        (["replay", "t", "--url", "u", "--max-in-flight", "-1"], "--max-in-flight: must be at least 0, got -1"),
        (["analyze", "t", "--step-ms", "20000"], "--step-ms: must be within 0..10000, got 20000"),
        (["analyze", "t", "--step-ms", "nan"], "--step-ms: must be within 0..10000, got nan"),
        (
            ["record", "--url", "u", "--out", "t.json", "--listen-port", "70000"],
            "--listen-port: must be within 0..65535, got 70000",
        ),
    ],
)
def test_option_checks_are_one_line_in_one_wording(capsys: pytest.CaptureFixture, argv: list[str], says: str) -> None:
    err = refusal(capsys, *argv)
    assert err.startswith(f"radixtop: {says} (see `radixtop"), err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--port", "70000"], "--port: must be within 0..65535, got 70000"),
        (["--step-ms", "20000"], "--step-ms: must be within 0..10000, got 20000"),
        (["--instrument-port", "0"], "--instrument-port: must be within 1..65407, got 0"),
    ],
)
def test_the_simulator_words_the_same_checks_the_same_way(argv: list[str], says: str) -> None:
    with pytest.raises(UsageError) as refused:
        parse_options(argv)
    assert str(refused.value).startswith(says)


def test_exit_statuses_keep_their_numbers() -> None:
    assert [(s.name, int(s)) for s in ExitStatus] == [("OK", 0), ("ERROR", 1), ("USAGE", 2), ("INTERRUPTED", 130),
                                                      ("PIPE_CLOSED", 141)]


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path) -> None:
    """`radixtop analyze big.json --json | head`: the pipe closes under a long answer."""
    import json as json_module
    import subprocess
    import sys

    requests = [{"id": f"r{i}", "offset_ms": i, "prompt_len": 32, "prefix_len": 0, "group": f"g{i}", "max_tokens": 1}
                for i in range(3000)]
    trace = tmp_path / "big.json"
    trace.write_text(json_module.dumps({"version": 1, "name": "big", "page_size_hint": 1, "requests": requests}))
    proc = subprocess.Popen([sys.executable, "-m", "radixtop", "analyze", str(trace), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(60) in (0, 141) and "Traceback" not in err and "BrokenPipe" not in err, err
