"""Mine the messages SGLang and vLLM really print, across releases, into tools/mined/messages.jsonl.

    python tools/mine_strings.py --work /tmp/radixtop-mine      # fetch, extract, write the table
    python tools/mine_strings.py --work /tmp/radixtop-mine --offline   # rebuild from what is there

Each release is fetched with `pip download --no-deps` (a wheel, else the sdist), only the .py files
under the packages that hold the memory cache, scheduler, allocator, model runner and distributed
code are extracted into the work directory, and the archive is deleted (vLLM wheels are 300-400
MB). Every `raise`, `assert`, `logger.error/warning/...` and `print` message in those files is
read with `ast`: an f-string, a `%` or `.format` template becomes the text with `{}` where a
value goes; an `assert` without a message keeps its condition, which is what a traceback shows.

One row per (package, message): the releases it appears in ("a..b" for a run of mined releases,
runs joined by ","), the files, and how it is printed (raise X, assert, logger.warning ..., or
"message variable" for a string assigned to a msg/message/error name and printed later). The
table is what tests/test_catalog_mined.py holds the signature catalog to; tests never download.
Its messages are SGLang's and vLLM's own words, verbatim: data to match, not radixtop's prose.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

# The releases mined, oldest first. Where a named release is not on PyPI the nearest one is taken
# (sglang 0.5.0 was never published: 0.5.1).
RELEASES: dict[str, tuple[str, ...]] = {
    "sglang": ("0.3.6.post3", "0.4.0", "0.4.6", "0.4.10", "0.5.1", "0.5.6", "0.5.12", "0.5.23"),
    "vllm": ("0.6.0", "0.8.0", "0.10.0", "0.34.0"),
}

# Where the memory cache, scheduler, allocator, model runner and distributed code live (prefixes
# of paths inside the package), plus the files that print the process-level notices (sigquit).
SCOPES: dict[str, tuple[str, ...]] = {
    "sglang": (
        "sglang/srt/mem_cache/",
        "sglang/srt/managers/",
        "sglang/srt/model_executor/",
        "sglang/srt/distributed/",
        "sglang/srt/entrypoints/engine.py",
        "sglang/srt/entrypoints/http_server.py",
        "sglang/srt/server.py",
        "sglang/srt/utils.py",
        "sglang/srt/utils/common.py",
        "sglang/srt/utils/watchdog.py",
    ),
    "vllm": (
        "vllm/core/",
        "vllm/engine/",
        "vllm/worker/",
        "vllm/executor/",
        "vllm/distributed/",
        "vllm/v1/core/",
        "vllm/v1/engine/",
        "vllm/v1/worker/",
        "vllm/v1/executor/",
    ),
}

# info too: SGLang prints its retraction notice at info level.
LOG_METHODS = frozenset(
    {"info", "error", "warning", "warn", "exception", "critical", "fatal", "warning_once", "error_once"}
)
# A message built in a variable first ("msg = ...", "error_message = ..."), then logged or raised.
MESSAGE_NAME = re.compile(r"(?:^|_)(?:msg|message|error|err)(?:_|$)", re.IGNORECASE)
PLACEHOLDER = "{}"
TABLE = Path(__file__).resolve().parent / "mined" / "messages.jsonl"


# -- fetching -------------------------------------------------------------------------------------


def fetch(package: str, version: str, work: Path, offline: bool) -> Path | None:
    """The directory holding this release's in-scope .py files, fetched once; None if unavailable."""
    dest = work / f"{package}-{version}"
    done = dest / ".complete"
    if done.exists():
        return dest
    if offline:
        return None
    download = work / "download"
    shutil.rmtree(download, ignore_errors=True)
    download.mkdir(parents=True)
    for extra in ((), ("--no-binary", ":all:")):
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(download)]
        argv += [*extra, f"{package}=={version}"]
        if subprocess.run(argv, check=False).returncode == 0:
            break
    archives = list(download.iterdir())
    if not archives:
        return None
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for archive in archives:
        _extract(archive, package, dest)
        archive.unlink()
    done.write_text(archives[0].name + "\n")
    return dest


def _in_scope(package: str, path: str) -> bool:
    return path.endswith(".py") and any(path.startswith(s) for s in SCOPES[package])


def _extract(archive: Path, package: str, dest: Path) -> None:
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as z:
            for name in z.namelist():
                if _in_scope(package, name):
                    _write(dest / name, z.read(name))
        return
    with tarfile.open(archive) as t:  # an sdist: "<name>-<version>/[python/]<package>/..."
        for member in t.getmembers():
            parts = member.name.split("/")
            inner = next(("/".join(parts[i:]) for i, p in enumerate(parts) if p == package), None)
            if member.isfile() and inner and _in_scope(package, inner):
                f = t.extractfile(member)
                if f is not None:
                    _write(dest / inner, f.read())


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


# -- reading messages -----------------------------------------------------------------------------


def template(node: ast.AST) -> str | None:
    """The text a string expression prints, with {} for each value; None when it is no string."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        out = []
        for part in node.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                out.append(part.value)
            else:
                out.append(PLACEHOLDER)
        return "".join(out)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = template(node.left), template(node.right)
        if left is None and right is None:
            return None
        return (left if left is not None else PLACEHOLDER) + (right if right is not None else PLACEHOLDER)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return template(node.left)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
    ):
        return template(node.func.value)
    return None


def alternatives(node: ast.AST) -> list[ast.AST]:
    """The branches of a conditional expression ("a" if x else "b"), else the node itself."""
    if isinstance(node, ast.IfExp):
        return alternatives(node.body) + alternatives(node.orelse)
    return [node]


def _target_name(target: ast.AST) -> str:
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    return ""


def _call_name(func: ast.AST) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _logger_call(node: ast.Call) -> str | None:
    """'logger.warning' for a call on a logger (logger, self.logger, logging, ...), else None."""
    func = node.func
    if not isinstance(func, ast.Attribute) or func.attr not in LOG_METHODS:
        return None
    owner = func.value
    name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
    if name == "logging" or name.lower().endswith("logger"):
        return f"logger.{func.attr}"
    return None


def messages(source: str) -> list[tuple[str, str]]:
    """(how it is printed, message) for every raise / assert / logger / print in a module."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found: list[tuple[str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            text = template(node.exc.args[0])
            if text is not None:
                found.append((f"raise {_call_name(node.exc.func)}", text))
        elif isinstance(node, ast.Assert):
            text = template(node.msg) if node.msg is not None else None
            if text is not None:
                found.append(("assert", text))
            else:  # a bare assert: the traceback shows its line, then "AssertionError"
                found.append(("assert-condition", f"assert {ast.unparse(node.test)}"))
        elif isinstance(node, ast.Call) and node.args:
            how = _logger_call(node)
            if how is None and isinstance(node.func, ast.Name) and node.func.id == "print":
                how = "print"
            if how is not None:
                text = template(node.args[0])
                if text is not None:
                    found.append((how, text))
        elif isinstance(node, ast.Assign) and any(MESSAGE_NAME.search(_target_name(t)) for t in node.targets):
            for branch in alternatives(node.value):
                text = template(branch)
                if text is not None:
                    found.append(("message variable", text))
    return [(how, " ".join(text.split()) if "\n" in text else text) for how, text in found if text.strip()]


# -- the table ------------------------------------------------------------------------------------


def release_ranges(present: list[str], mined: tuple[str, ...]) -> str:
    """'0.4.6..0.5.23' for a run of consecutive mined releases; runs joined by ','."""
    runs: list[list[str]] = []
    previous = -2
    for version in present:
        index = mined.index(version)
        if index == previous + 1:
            runs[-1].append(version)
        else:
            runs.append([version])
        previous = index
    return ",".join(run[0] if len(run) == 1 else f"{run[0]}..{run[-1]}" for run in runs)


def build(work: Path, offline: bool) -> tuple[list[dict], list[str]]:
    rows: dict[tuple[str, str], dict] = {}
    missing: list[str] = []
    for package, versions in RELEASES.items():
        for version in versions:
            root = fetch(package, version, work, offline)
            if root is None:
                missing.append(f"{package}=={version}")
                continue
            for path in sorted(root.rglob("*.py")):
                rel = path.relative_to(root).as_posix()
                text = path.read_text("utf-8", "replace")
                for how, message in messages(text):
                    row = rows.setdefault(
                        (package, message),
                        {"package": package, "message": message, "how": set(), "files": set(), "in": []},
                    )
                    row["how"].add(how)
                    row["files"].add(rel)
                    if version not in row["in"]:
                        row["in"].append(version)
    table = []
    for (package, message), row in sorted(rows.items()):
        table.append(
            {
                "package": package,
                "message": message,
                "releases": release_ranges(row["in"], RELEASES[package]),
                "how": sorted(row["how"]),
                "files": sorted(row["files"]),
            }
        )
    return table, missing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--work", type=Path, required=True, help="where releases are fetched and extracted")
    parser.add_argument("--out", type=Path, default=TABLE)
    parser.add_argument("--offline", action="store_true", help="use only releases already extracted")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    table, missing = build(args.work, args.offline)
    if missing:
        print(f"not available: {', '.join(missing)}", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for row in table:
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    print(f"{len(table)} messages from {sum(map(len, RELEASES.values())) - len(missing)} releases -> {args.out}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
