"""The failure-signature catalog: built-in TOML (package data) plus user files merged over it.

Each ``[[signature]]`` table has id, title, pattern, severity, subsystem, meaning, first_checks and
competing, and may have a role (ROLES; "cause" when absent): what the line is to an incident. A
cause names a failure where it starts; a consequence follows from a failure logged before it (the
SIGQUIT notice, a wrapper around a traceback, NCCL aborts); a notice is context (startup warnings,
retractions). The initiating finding is the earliest cause (diagnosis/findings.py). Patterns must
run unchanged on Python ``re``, RE2 and hyperscan (the matcher picks the fastest engine
available), so constructs only Python supports are refused at load time with a one-line error
that names the file and line: ``<file>:<line>: <what is wrong>; <what to do>``.

`radixtop scan` must start like a grep, and parsing and validating the built-in catalog (tomllib,
a regex compile per pattern) cost more than the rest of its start-up, so the validated built-in
signatures are cached (see _builtin_signatures); tomllib, pathlib and the validation regexes are
imported or compiled only when a catalog is really parsed. User catalogs are always parsed.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from radixtop import __version__
from radixtop.diagnosis import diskcache
from radixtop.diagnosis.severity import NAMES, Severity, severity_rank

if TYPE_CHECKING:
    import tomllib
    from pathlib import Path

__all__ = [
    "ROLES",
    "SEVERITIES",
    "Signature",
    "Catalog",
    "CatalogError",
    "load_catalog",
    "parse_catalog",
]

SEVERITIES = NAMES  # ordered, lowest first
ROLES = ("cause", "consequence", "notice")  # the order in which findings are named initiating

_REQUIRED = (
    "id",
    "title",
    "pattern",
    "severity",
    "subsystem",
    "meaning",
    "first_checks",
    "competing",
)
_OPTIONAL = ("role",)
MAX_CATALOG_BYTES = 16 << 20  # a user catalog of 20,000 signatures is a few MB
_ID = r"[a-z0-9]+(?:-[a-z0-9]+)*\Z"
_TABLE_HEADER = r"^\s*\[\[\s*signature\s*\]\]"

# Constructs Python's re accepts but RE2 or hyperscan do not (or read differently). Compiled by
# `re` (which caches them) only when a catalog is validated.
_FORBIDDEN: tuple[tuple[str, str], ...] = (
    (r"\(\?<?[=!]", "a lookaround"),
    (r"\(\?P=|\\[1-9]|\\g<|\\k<", "a backreference"),
    (r"\(\?P?<[A-Za-z_]", "a named group"),
    (r"\(\?>", "an atomic group"),
    (r"\(\?\(", "a conditional group"),
    (r"\(\?#", "a comment group"),
    (r"[*+?}]\+", "a possessive quantifier"),
    (r"\\[ZGuUN]", "an escape only Python knows (\\Z, \\G, \\u, \\U or \\N)"),
    (r"\{,", "an open-start repeat {,n}"),
)

# Ordinary scheduler lines: no signature may match them (they arrive several times a second).
ORDINARY_LINES = (
    "[2026-12-02 14:00:01 TP0] Prefill batch, #new-seq: 1, #new-token: 64, #cached-token: 0, "
    "token usage: 0.01, #running-req: 0, #queue-req: 0, ",
    "[2026-12-02 14:00:01.250 TP0] Prefill batch. #new-seq: 4, #new-token: 2048, #cached-token: 512, "
    "token usage: 0.97, #running-req: 31, #queue-req: 9, #pending-token: 0, cuda graph: False, "
    "input throughput (token/s): 8123.40",
    "[2026-12-02 14:00:02 DP0 TP1] Decode batch, #running-req: 3, #token: 640, token usage: 0.04, "
    "cuda graph: True, gen throughput (token/s): 1234.56, #queue-req: 0, ",
    '[2026-12-02 14:00:02] INFO:     127.0.0.1:51234 - "POST /generate HTTP/1.1" 200 OK',
)


class CatalogError(ValueError):
    """A catalog that cannot be used. ``str()`` is one line: ``<file>:<line>: <what>; <what to do>``."""


# A NamedTuple, not a dataclass: `radixtop scan` starts without importing dataclasses (and inspect).
class Signature(NamedTuple):
    id: str
    title: str
    pattern: str
    severity: str
    subsystem: str
    meaning: str
    first_checks: tuple[str, ...]
    competing: tuple[str, ...]
    role: str = "cause"
    origin: str = "builtin"

    @property
    def level(self) -> Severity:
        return severity_rank(self.severity)


class Catalog(NamedTuple):
    signatures: tuple[Signature, ...]
    notes: tuple[str, ...] = ()  # e.g. which user signature replaced which built-in one

    def get(self, sig_id: str) -> Signature:
        for sig in self.signatures:
            if sig.id == sig_id:
                return sig
        raise KeyError(sig_id)

    def index(self, sig_id: str) -> int:  # type: ignore[override]  # by id: tuple.index is never called on it
        for i, sig in enumerate(self.signatures):
            if sig.id == sig_id:
                return i
        raise KeyError(sig_id)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(sig.id for sig in self.signatures)


def load_catalog(extra_files: Sequence[str | Path] = ()) -> Catalog:
    """The built-in catalog with each user file merged over it in order (same id replaces, noted)."""
    merged: dict[str, Signature] = {sig.id: sig for sig in _builtin_signatures()}
    notes: list[str] = []
    if extra_files:
        from pathlib import Path
    for extra in extra_files:
        path = Path(extra)
        for sig in parse_catalog(_read_text(path), str(path), origin=str(path)):
            previous = merged.get(sig.id)
            if previous is not None:
                where = "built-in" if previous.origin == "builtin" else previous.origin
                notes.append(f'signature "{sig.id}" from {path} replaces the {where} one')
            merged[sig.id] = sig  # a replaced id keeps its place; new ones go last
    return Catalog(tuple(merged.values()), tuple(notes))


# -- the built-in catalog and its cache ------------------------------------------------------------

_BUILTIN_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "signatures.toml")
_BUILTIN_SOURCE = "signatures.toml (built-in)"
_FIELDS = ("id", "title", "pattern", "severity", "subsystem", "meaning", "first_checks", "competing", "role")


def _builtin_signatures(path: str | None = None) -> tuple[Signature, ...]:
    """The validated built-in signatures, from the cache when it was built from these exact bytes.

    The cache key is the TOML file's whole content plus what could change how it is validated
    (radixtop's version, this module's own size and mtime, the Python version, whose `marshal`
    format the cache uses); the file is otherwise parsed and validated, then the cache rewritten.
    `path` is for tests; by default the TOML next to this module, or the package's resource
    when radixtop runs from a zip (never cached then).
    """
    packaged = path is None
    file = _BUILTIN_FILE if path is None else path
    try:
        with open(file, "rb") as f:
            data = f.read()
        key = _cache_key(file, data)
    except OSError:
        if not packaged:
            raise
        from importlib import resources

        text = resources.files("radixtop.diagnosis").joinpath("signatures.toml").read_text("utf-8")
        return parse_catalog(text, _BUILTIN_SOURCE, origin="builtin")
    # Named by the TOML's path only: a stale cache is overwritten, not left beside the new one.
    cache_file = diskcache.cache_path("catalog", file.encode(), ".marshal")
    cached = _from_cache(diskcache.read(cache_file, key))
    if cached is not None:
        return cached
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = _read_text_as_user_file(file)  # raises the usual one-line CatalogError
    signatures = parse_catalog(text, _BUILTIN_SOURCE, origin="builtin")
    import marshal

    rows = tuple(tuple(getattr(sig, name) for name in _FIELDS) for sig in signatures)
    diskcache.write(cache_file, key, marshal.dumps(rows))
    return signatures


def _cache_key(path: str, data: bytes) -> bytes:
    me = os.stat(__file__)  # this module validates: an edited one must not trust old results
    head = (
        f"builtin catalog {path}\nradixtop {__version__}\npython {sys.version_info[:2]}\n"
        f"validator {me.st_size} {me.st_mtime_ns}\n"
    )
    return head.encode() + data


def _from_cache(payload: bytes | None) -> tuple[Signature, ...] | None:
    """Signatures from a cached payload, or None when it is absent or not what this code wrote."""
    if payload is None:
        return None
    import marshal

    try:
        rows = marshal.loads(payload)
    except (ValueError, EOFError, TypeError):
        return None
    if not isinstance(rows, tuple) or not rows:
        return None
    out = []
    for row in rows:
        if not (
            isinstance(row, tuple)
            and len(row) == len(_FIELDS)
            and all(isinstance(v, str) for v in row[:6])
            and all(isinstance(v, tuple) and all(isinstance(x, str) for x in v) for v in row[6:8])
            and row[3] in SEVERITIES
            and row[8] in ROLES
        ):
            return None
        out.append(Signature._make((*row, "builtin")))  # row: every field but origin
    return tuple(out)


def _read_text_as_user_file(path: str) -> str:
    from pathlib import Path

    return _read_text(Path(path))


def _read_text(path: Path) -> str:
    from radixtop.bounded import read_user_file

    try:
        data = read_user_file(str(path), MAX_CATALOG_BYTES)  # a FIFO or /dev/zero is refused, never read
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise CatalogError(
            f"{path}:1: cannot read the signature file ({reason}); check the path"
        ) from None
    except ValueError as exc:
        raise CatalogError(f"{path}:1: {str(exc).removeprefix(f'{path}: ')}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise CatalogError(
            f"{path}:{line}: the file is not UTF-8 text (byte {data[exc.start]:#04x}); save it as UTF-8"
        ) from None


def parse_catalog(text: str, source: str, *, origin: str) -> tuple[Signature, ...]:
    """Parse and validate one catalog's TOML text; ``source`` names it in errors."""
    import tomllib

    from radixtop.bounded import load_toml

    try:
        doc = load_toml(text, source, max_bytes=MAX_CATALOG_BYTES)
    except tomllib.TOMLDecodeError as exc:
        line, column, what = _decode_error_position(exc, text)
        raise CatalogError(
            f"{source}:{line}: invalid TOML ({what}, column {column}); fix the syntax there"
        ) from None
    except ValueError as exc:  # too big, or nested too deeply to read
        raise CatalogError(f"{exc}; a catalog holds flat [[signature]] tables") from None

    lines = text.splitlines()
    header = re.compile(_TABLE_HEADER)
    headers = [i + 1 for i, line in enumerate(lines) if header.match(line)]
    for key in doc:
        if key != "signature":
            line = _find_top_key(lines, key)
            raise CatalogError(
                f'{source}:{line}: unknown top-level key "{key}"; a catalog holds only [[signature]] tables'
            )
    tables = doc.get("signature")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise CatalogError(
            f"{source}:1: no [[signature]] tables found; write each signature as a [[signature]] table"
        )

    seen: dict[str, int] = {}
    out: list[Signature] = []
    for i, table in enumerate(tables):
        start = headers[i] if i < len(headers) else 1
        end = headers[i + 1] if i + 1 < len(headers) else len(lines) + 1
        span = (start, end)
        sig = _validate(table, source, lines, span, origin)
        if sig.id in seen:
            raise CatalogError(
                f'{source}:{start}: signature "{sig.id}" is defined twice (first at line {seen[sig.id]}); '
                "give each signature its own id"
            )
        seen[sig.id] = start
        out.append(sig)
    return tuple(out)


def _decode_error_position(exc: tomllib.TOMLDecodeError, text: str) -> tuple[int, int, str]:
    # Python 3.14 gives lineno/colno/msg; older ones only write "(at line L, column C)" in the message.
    line = getattr(exc, "lineno", None)
    column = getattr(exc, "colno", None)
    what = getattr(exc, "msg", None) or str(exc)
    m = re.search(r"\s*\(at line (\d+), column (\d+)\)", str(exc))
    if m is not None:
        line = line or int(m.group(1))
        column = column or int(m.group(2))
        what = what.replace(m.group(0), "")
    elif "(at end of document)" in what:
        what = what.replace(" (at end of document)", " at the end of the file")
        lines = text.splitlines() or [""]
        line, column = line or len(lines), column or len(lines[-1]) + 1
    return line or 1, column or 1, what.strip() or "syntax error"


def _find_top_key(lines: list[str], key: str) -> int:
    pat = re.compile(r"^\s*\[*\s*" + re.escape(key) + r"\b")
    for n, line in enumerate(lines, 1):
        if pat.match(line):
            return n
    return 1


def _key_line(lines: list[str], span: tuple[int, int], key: str) -> int:
    """The line where ``key = ...`` is written inside the table spanning lines [start, end)."""
    start, end = span
    pat = re.compile(r"^\s*[\"']?" + re.escape(key) + r"[\"']?\s*=")
    for n in range(start, min(end, len(lines) + 1)):
        if pat.match(lines[n - 1]):
            return n
    return start


def _validate(
    table: dict[str, Any], source: str, lines: list[str], span: tuple[int, int], origin: str
) -> Signature:
    start = span[0]
    raw_id = table.get("id")
    if not isinstance(raw_id, str) or not raw_id.strip():
        if "id" in table:
            raise CatalogError(
                f"{_at(source, lines, span, 'id')}: a signature id must be a non-empty string; "
                'write id = "kebab-case-name"'
            )
        raise CatalogError(
            f'{source}:{start}: a [[signature]] table has no id; add id = "kebab-case-name"'
        )
    sig_id = raw_id
    name = f'signature "{sig_id}"'
    if not re.match(_ID, sig_id):
        raise CatalogError(
            f"{_at(source, lines, span, 'id')}: {name} id is not kebab-case; use lowercase letters, "
            'digits and single dashes, e.g. "radix-page-lock-eviction"'
        )
    for key in table:
        if key not in _REQUIRED and key not in _OPTIONAL:
            raise CatalogError(
                f'{_at(source, lines, span, key)}: {name} has unknown key "{key}"; '
                f"use only {', '.join(_REQUIRED + _OPTIONAL)}"
            )
    for key in _REQUIRED:
        if key not in table:
            example = '["...", "..."]' if key in ("first_checks", "competing") else '"..."'
            raise CatalogError(f"{source}:{start}: {name} has no {key}; add {key} = {example}")
    for key in ("title", "pattern", "severity", "subsystem", "meaning"):
        value = table[key]
        if not isinstance(value, str) or not value.strip():
            raise CatalogError(
                f'{_at(source, lines, span, key)}: {name} {key} must be a non-empty string; write {key} = "..."'
            )
    for key in ("first_checks", "competing"):
        value = table[key]
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise CatalogError(
                f"{_at(source, lines, span, key)}: {name} {key} must be a list of non-empty strings; "
                f'write {key} = ["...", "..."]'
            )
    severity = table["severity"]
    if severity not in SEVERITIES:
        raise CatalogError(
            f'{_at(source, lines, span, "severity")}: {name} has severity "{severity}"; '
            f"use one of {', '.join(SEVERITIES)}"
        )
    role = table.get("role", "cause")
    if role not in ROLES:
        raise CatalogError(
            f'{_at(source, lines, span, "role")}: {name} has role "{role}"; use one of {", ".join(ROLES)}'
        )
    pattern = table["pattern"]
    problem = pattern_problem(pattern)
    if problem is not None:
        raise CatalogError(f"{_at(source, lines, span, 'pattern')}: {name} pattern {problem}")
    return Signature(
        id=sig_id,
        title=table["title"].strip(),
        pattern=pattern,
        severity=severity,
        subsystem=table["subsystem"].strip(),
        meaning=" ".join(table["meaning"].split()),
        first_checks=tuple(table["first_checks"]),
        competing=tuple(table["competing"]),
        role=role,
        origin=origin,
    )


def _at(source: str, lines: list[str], span: tuple[int, int], key: str) -> str:
    return f"{source}:{_key_line(lines, span, key)}"


def pattern_problem(pattern: str) -> str | None:
    """Why a pattern cannot be used (``"<what>; <what to do>"``), or None when it is fine."""
    for finder, what in _FORBIDDEN:
        for m in re.finditer(finder, pattern):
            if _escaped(pattern, m.start()):
                continue
            return (
                f'uses {what} at "{m.group(0)}", which RE2 and hyperscan cannot run; '
                "rewrite it with plain literals, classes, groups (?:...) and repeats"
            )
    import warnings

    with warnings.catch_warnings():
        # Python's re reads "[[:alpha:]]" as a set of ":alph[" (and warns), RE2 and hyperscan as a
        # POSIX class: one pattern, two meanings.
        warnings.simplefilter("error", FutureWarning)
        try:
            compiled = re.compile(pattern)
        except FutureWarning as exc:
            return (f"has a set that Python's re reads otherwise than RE2 and hyperscan ({exc}); "
                    "write the class out, e.g. [A-Za-z] for [[:alpha:]]")
        except re.error as exc:
            return f"does not compile ({exc.msg} at position {exc.pos}); fix the regular expression"
    from radixtop.diagnosis.matcher import MatcherError, line_search

    try:
        search = line_search(pattern, compiled)  # never `re` where it could backtrack without end
    except MatcherError as exc:
        return str(exc)
    if search(""):
        return "matches an empty line; anchor it on a distinctive literal"
    for line in ORDINARY_LINES:
        if search(line):
            return (
                "matches an ordinary Prefill/Decode batch line; anchor it on a distinctive literal"
            )
    return None


def _escaped(pattern: str, pos: int) -> bool:
    """True when the character at pos is escaped by an odd number of backslashes (e.g. literal "\\(?=")."""
    n = 0
    while pos - n - 1 >= 0 and pattern[pos - n - 1] == "\\":
        n += 1
    return n % 2 == 1
