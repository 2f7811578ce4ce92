"""Match many signature patterns at once: hyperscan, else RE2, else the standard library's `re`.

All three engines work on bytes with the same semantics: patterns are UTF-8 encoded and matched
byte by byte (RE2 in Latin-1 mode, `re` with bytes patterns, hyperscan without HS_FLAG_UTF8), case
sensitive, `^`/`$` at line boundaries. A hit belongs to a line only when the pattern matches inside
that line alone (as grep and rg see it): a pattern such as `a\\s+b` that could run across a newline
is re-checked on the line, so every engine reports the same (line, signature) pairs.

How each engine scans a buffer of many lines:
- hyperscan: one block-mode database over all patterns, every match end reported (no
  SINGLEMATCH: `scan` needs every line), mapped to its line with a find of b"\\n". The compiled
  database is cached on disk (see _HyperscanEngine), because compiling costs 50-100 ms here and
  `radixtop scan` must start like grep; for the same reason no Python regex is compiled until a
  hit needs its line re-checked.
- re2: an RE2::Set pass says which patterns occur in the buffer at all; only those are searched,
  on the lines holding their required literal (below) where they have one. A pattern RE2 cannot
  compile (a counted repeat over 1,000) runs alone on `re`, the others stay on RE2.
- re: each pattern's required literal (e.g. "Failed to lock memory page") is found with bytes.find,
  and the regex runs only on the lines holding it; a pattern without one is searched in full.

`re` backtracks: a repeat inside a repeat (`(\\w+\\s?)+X`, `(.*)*X`) can take it longer than the
universe's age on one line. `re` never runs such a pattern: hyperscan's re-checks of such hits, a
catalog's validation (`line_search`) and the log pane's mark of a hit (`span_search`) search with
RE2, and a pattern no other engine takes is refused (`backtracking_risk`).

This module is imported by `radixtop scan` before any output, so it imports its engines lazily and
nothing else heavy.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from radixtop.diagnosis import diskcache
from radixtop.textsafe import printable

if TYPE_CHECKING:
    from radixtop.diagnosis.catalog import Signature

ENGINES = ("hyperscan", "re2", "re")
CACHE_ENV = diskcache.CACHE_ENV  # where compiled hyperscan databases are kept; "" turns it off

# Escapes and constructs that can match a newline; a pattern with none of them cannot cross lines,
# so its hits need no re-check. Conservative: a false "may cross" only costs a re-check per hit.
_MAY_CROSS_LINES = re.compile(r"\\[sWDvnxcpPhHNRXV0-7]|\[\^|\(\?[a-zA-Z]*s|[\x00-\x1f]")
_MIN_LITERAL = 3  # shorter required literals would find too many candidate lines to help
# A repeat allowing more than this many rounds counts as unbounded for backtracking_risk: nested in
# another such repeat, the ways to split a line grow beyond any time bound.
_WIDE_REPEAT = 10
_GROUP_REPEAT = re.compile(r"\)[*+?{]")  # a group with a quantifier (or a literal paren: parsed to tell)


class MatcherError(ValueError):
    """An engine asked for by name cannot be used, or a pattern compiles in no engine."""


def _may_cross_lines(pattern: str) -> bool:
    return _MAY_CROSS_LINES.search(pattern) is not None


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "replace")


def _on_hyperscan_match(pattern_id: int, start: int, end: int, flags: int, hits: list[tuple[int, int]]) -> None:
    # A named function, not a lambda: hyperscan 0.9.1 crashed here with an inline lambda.
    hits.append((end, pattern_id))


class _EngineUnavailable(Exception):
    """The engine's module cannot be imported."""


class _PatternRejected(Exception):
    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index
        self.message = message


def _one_line(exc: BaseException) -> str:
    text = exc.args[0] if exc.args else exc
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return " ".join(str(text).split()) or type(exc).__name__


# -- hyperscan ------------------------------------------------------------------------------------


class _HyperscanEngine:
    """hyperscan block-mode databases: one for `scan` (every match), one for `match` (built on the
    first `match` call: SINGLEMATCH, so a line stops costing once each pattern has hit).

    The scan database is cached as hyperscan's own serialization under ~/.cache/radixtop (or
    $RADIXTOP_CACHE_DIR; empty disables; see diskcache), keyed on the hyperscan version, the
    machine, the flags and the patterns. A cached database that does not load or scan (another CPU on a
    shared home directory, a damaged file) is recompiled and rewritten; cache I/O errors are
    ignored.
    """

    name = "hyperscan"

    def __init__(self, patterns: Sequence[bytes]) -> None:
        try:
            import hyperscan
        except ImportError as exc:  # includes a wheel whose shared library does not load
            raise _EngineUnavailable(_one_line(exc)) from exc
        self._hs = hyperscan
        self._patterns = list(patterns)
        self._scan_db, self._scan_scratch = self._database(hyperscan.HS_FLAG_MULTILINE)
        self._match_db: Any = None
        self._match_scratch: Any = None

    def _database(self, flags: int, cached: bool = True) -> tuple[Any, Any]:
        hs = self._hs
        key = self._cache_key(flags) if cached else b""
        path = diskcache.cache_path("hs", key, ".db") if cached else None
        stored = diskcache.read(path, key)
        if stored is not None:
            try:
                db = hs.loadb(stored, hs.HS_MODE_BLOCK)
                scratch = hs.Scratch(db)
                db.scan(b"\n", match_event_handler=_on_hyperscan_match, context=[], scratch=scratch)
                return db, scratch
            except (hs.error, ValueError, TypeError):
                pass  # unusable here (another CPU on a shared home directory): compile below
        db = self._compile(flags)
        if path is not None:
            diskcache.write(path, key, hs.dumpb(db))
        return db, hs.Scratch(db)

    def _cache_key(self, flags: int) -> bytes:
        # Everything the compiled database depends on, compared byte for byte when it is loaded.
        version = getattr(self._hs, "__version__", "?")
        parts = [f"hyperscan {version} {os.uname().machine} block flags={flags}\n".encode()]
        for pattern in self._patterns:
            parts.append(len(pattern).to_bytes(4, "little") + pattern)
        return b"".join(parts)

    def _compile(self, flags: int) -> Any:
        hs = self._hs
        patterns = self._patterns
        db = hs.Database(mode=hs.HS_MODE_BLOCK)
        try:
            db.compile(
                expressions=patterns,
                ids=list(range(len(patterns))),
                elements=len(patterns),
                flags=[flags] * len(patterns),
            )
        except hs.error as exc:
            # Find the culprit by compiling one at a time (only on this failure path).
            for i, pattern in enumerate(patterns):
                one = hs.Database(mode=hs.HS_MODE_BLOCK)
                try:
                    one.compile(expressions=[pattern], ids=[0], elements=1, flags=[flags])
                except hs.error as one_exc:
                    raise _PatternRejected(i, _one_line(one_exc)) from exc
            raise _PatternRejected(0, _one_line(exc)) from exc
        return db

    def match_ids(self, data: bytes) -> set[int]:
        if self._match_db is None:
            hs = self._hs
            flags = hs.HS_FLAG_MULTILINE | hs.HS_FLAG_SINGLEMATCH
            self._match_db, self._match_scratch = self._database(flags, cached=False)
        hits: list[tuple[int, int]] = []
        self._match_db.scan(
            data, match_event_handler=_on_hyperscan_match, context=hits, scratch=self._match_scratch
        )
        return {pattern_id for _, pattern_id in hits}

    def raw_hits(self, data: Any) -> list[tuple[int, int]]:
        """(match end, pattern index) for every match end hyperscan reports (unsorted, repeated)."""
        hits: list[tuple[int, int]] = []
        self._scan_db.scan(
            data, match_event_handler=_on_hyperscan_match, context=hits, scratch=self._scan_scratch
        )
        return hits


# -- RE2 and re -----------------------------------------------------------------------------------


def _re2_options() -> Any:
    import re2

    options = re2.Options()
    options.encoding = re2.Options.Encoding.LATIN1  # byte semantics, like hyperscan and re
    options.log_errors = False
    return options


class _Re2Engine:
    """RE2 for every pattern it compiles; a pattern it refuses runs alone on `re` (listed in
    `on_re` with RE2's reason), unless `re` could backtrack on it without end."""

    name = "re2"

    def __init__(self, patterns: Sequence[bytes], sources: Sequence[str]) -> None:
        try:
            import re2
        except ImportError as exc:
            raise _EngineUnavailable(_one_line(exc)) from exc
        options = _re2_options()
        compiled: list[Any] = []
        self.on_re: list[tuple[int, str]] = []
        self._set = re2.Set.SearchSet(options)
        self._set_index: list[int] = []  # the set's pattern number -> the pattern's index
        for i, pattern in enumerate(patterns):
            try:
                compiled.append(re2.compile(b"(?m)" + pattern, options))
            except re2.error as exc:
                reason = _one_line(exc)
                compiled.append(_compile_re(i, pattern, sources[i], f"RE2 cannot run it either ({reason})"))
                self.on_re.append((i, reason))
                continue
            self._set.Add(b"(?m)" + pattern)
            self._set_index.append(i)
        self.compiled = compiled
        self.literals = [required_literals(source) for source in sources]
        self._set.Compile()

    def scan_into(self, data: Any, size: int, hits: list[tuple[int, int]]) -> None:
        # RE2 does not treat endpos as the end of the text for `$`: search a view that ends there.
        view = data if size == len(data) else memoryview(data)[:size]
        # One RE2::Set pass names the patterns present anywhere in the buffer (hits are rare);
        # each of those is searched only on the lines holding its literal, when it has one.
        present = [self._set_index[k] for k in self._set.Match(view) or ()] if self._set_index else []
        for i in sorted(present):
            self._search(i, data, size, hits, view)
        for i, _ in self.on_re:
            self._search(i, data, size, hits, None)

    def _search(self, i: int, data: Any, size: int, hits: list[tuple[int, int]], view: Any) -> None:
        literals = self.literals[i]
        if literals is None:
            _line_hits(self.compiled[i], data, hits, i, size, view)
        else:
            _literal_line_hits(self.compiled[i], literals, data, hits, i, size, view)


def _compile_re(index: int, pattern: bytes, source: str, why_re: str) -> re.Pattern[bytes]:
    """`re`'s compiled pattern, or _PatternRejected when `re` cannot compile it or could backtrack
    on it without end (`why_re`: why no other engine runs it)."""
    risk = backtracking_risk(source)
    if risk is not None:
        raise _PatternRejected(index, f"{risk}; {why_re}")
    try:
        return re.compile(b"(?m)" + pattern)
    except re.error as exc:
        raise _PatternRejected(index, _one_line(exc)) from exc


class _ReEngine:
    name = "re"

    def __init__(self, patterns: Sequence[bytes], sources: Sequence[str]) -> None:
        self.compiled = [
            _compile_re(i, pattern, sources[i], "install google-re2, which runs it in linear time")
            for i, pattern in enumerate(patterns)
        ]
        self.literals = [required_literals(source) for source in sources]

    def scan_into(self, data: Any, size: int, hits: list[tuple[int, int]]) -> None:
        for i, pattern in enumerate(self.compiled):
            literals = self.literals[i]
            if literals is None:
                _line_hits(pattern, data, hits, i, size)
            else:
                _literal_line_hits(pattern, literals, data, hits, i, size)


def backtracking_risk(pattern: str) -> str | None:
    """Why Python's backtracking `re` could run without end on some line with `pattern` (one
    line, naming the pattern and what to do), or None: a repeat of many rounds inside another
    (`(\\w+\\s?)+`, `(.*)*`), where a failing line has exponentially many ways to be split."""
    if _GROUP_REPEAT.search(pattern) is None:  # only a group can hold a repeat: none is repeated
        return None
    try:
        from re import _constants as c  # type: ignore[attr-defined]  # CPython's private parser: no stubs
        from re import _parser  # type: ignore[attr-defined]

        nested = _nested_wide_repeat(list(_parser.parse(pattern)), c, inside=False)
    except Exception:  # noqa: BLE001 - a pattern the parser refuses fails to compile and says so there
        return None
    if not nested:
        return None
    shown = printable(pattern if len(pattern) <= 80 else pattern[:79] + "…")
    return (f'"{shown}" has a repeat inside a repeat, on which Python\'s re can run without end; '
            "rewrite it without the nested repeat (e.g. (\\w+\\s?)+X as [\\w\\s]+X)")


def _nested_wide_repeat(items: list[tuple[Any, Any]], c: Any, *, inside: bool) -> bool:
    for op, arg in items:
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None)):
            wide = arg[1] > _WIDE_REPEAT
            if (wide and inside) or _nested_wide_repeat(list(arg[2]), c, inside=inside or wide):
                return True
        elif op is c.SUBPATTERN:
            if _nested_wide_repeat(list(arg[3]), c, inside=inside):
                return True
        elif op is c.BRANCH:
            if any(_nested_wide_repeat(list(b), c, inside=inside) for b in arg[1]):
                return True
        elif op in (c.ASSERT, c.ASSERT_NOT) and _nested_wide_repeat(list(arg[1]), c, inside=inside):
            return True
    return False


def line_search(pattern: str, compiled: re.Pattern[str] | None = None) -> Callable[[str], bool]:
    """Whether `pattern` matches in one line, by an engine that cannot run without end: `re` when
    backtracking_risk finds nothing (`compiled`, when the caller has it), else RE2 as the Matcher
    runs it (UTF-8 bytes). MatcherError (one line) for a pattern neither runs."""
    risk = backtracking_risk(pattern)
    if risk is None and compiled is not None:
        return lambda line: compiled.search(line) is not None
    data = b"(?m)" + _encode(pattern)
    try:
        if risk is None:
            regex: Any = re.compile(data)
        else:
            import re2

            regex = re2.compile(data, _re2_options())
    except ImportError:
        raise MatcherError(f"{risk}; install google-re2, which runs it in linear time") from None
    except Exception as exc:  # noqa: BLE001 - re.error, or re2.error (not importable without re2)
        raise MatcherError(f"{risk}; RE2 cannot run it either ({_one_line(exc)})" if risk
                           else f"does not compile ({_one_line(exc)})") from None
    search = regex.search
    return lambda line: search(_encode(line)) is not None


def span_search(pattern: str) -> Callable[[str], tuple[int, int] | None] | None:
    """Where `pattern` first matches in one line of text (character offsets, to mark the match):
    by `re`, or by RE2 where `re` could backtrack without end; None when neither compiles it."""
    try:
        if backtracking_risk(pattern) is None:
            regex: Any = re.compile(pattern)
        else:
            import re2

            regex = re2.compile(pattern)
    except Exception:  # noqa: BLE001 - re.error, a missing re2, or re2.error
        return None
    search = regex.search

    def span(text: str) -> tuple[int, int] | None:
        m = search(text)
        return m.span() if m else None

    return span


def required_literals(pattern: str) -> tuple[bytes, ...] | None:
    """Literals (UTF-8) of which every match of `pattern` contains at least one, or None.

    Read from Python's own parse tree (re._parser; a Python without it, or any surprise there,
    just means no prefilter). Used by the `re` engine to skip lines with bytes.find, the way rg and
    hyperscan prefilter on literals.
    """
    try:
        # CPython's private parser modules: typeshed has no stubs for them.
        from re import _constants as c  # type: ignore[attr-defined]
        from re import _parser  # type: ignore[attr-defined]

        tree = _parser.parse(pattern)
        if tree.state.flags & c.SRE_FLAG_IGNORECASE:
            return None
        found = _best(_candidates(list(tree), c))
    except Exception:  # noqa: BLE001 - the prefilter is an optimisation: never let it break matching
        return None
    if found is None or min(len(x) for x in found) < _MIN_LITERAL:
        return None
    return tuple(sorted({_encode(x) for x in found}))


def _best(candidates: list[tuple[str, ...]]) -> tuple[str, ...] | None:
    if not candidates:
        return None
    return max(candidates, key=lambda alts: (min(len(x) for x in alts), -len(alts)))


def _candidates(items: list[tuple[Any, Any]], c: Any) -> list[tuple[str, ...]]:
    """Sets of alternatives, each set required in every match of the sequence `items`."""
    found: list[tuple[str, ...]] = []
    run: list[str] = []
    for op, arg in items:
        if op is c.LITERAL:
            run.append(chr(arg))
            continue
        if run:
            found.append(("".join(run),))
            run = []
        sub: tuple[str, ...] | None = None
        if op is c.SUBPATTERN:
            _group, add_flags, _del_flags, body = arg
            if not add_flags & c.SRE_FLAG_IGNORECASE:
                sub = _best(_candidates(list(body), c))
        elif op is c.BRANCH:
            branches = [_best(_candidates(list(b), c)) for b in arg[1]]
            known = [b for b in branches if b is not None]
            if known and len(known) == len(branches):
                sub = tuple(x for b in known for x in b)
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT) and arg[0] >= 1:
            sub = _best(_candidates(list(arg[2]), c))
        if sub is not None:
            found.append(sub)
    if run:
        found.append(("".join(run),))
    return found


def _line_hits(
    pattern: Any, data: Any, hits: list[tuple[int, int]], index: int, size: int, text: Any = None
) -> None:
    """Append (line end, index) once per line of data[:size] where pattern matches in the line.

    `text` is what the regex searches when it is not data itself (a view of data[:size])."""
    search = pattern.search
    subject = data if text is None else text
    pos = 0
    while pos <= size:
        m = search(subject, pos, size)
        if m is None:
            return
        start, end = m.span()
        line_end = data.find(b"\n", start, size)
        if line_end < 0:
            line_end = size
        if end <= line_end:
            hits.append((line_end, index))
        else:
            # The match ran past this line's end: the line counts only if it matches by itself.
            line_start = data.rfind(b"\n", 0, start) + 1
            if search(subject, line_start, line_end) is not None:
                hits.append((line_end, index))
        pos = line_end + 1


def _literal_line_hits(
    pattern: Any,
    literals: tuple[bytes, ...],
    data: Any,
    hits: list[tuple[int, int]],
    index: int,
    size: int,
    text: Any = None,
) -> None:
    """Like _line_hits, searching the regex only on lines that hold one of the literals."""
    lines: set[tuple[int, int]] = set()
    find = data.find
    for literal in literals:
        pos = find(literal, 0, size)
        while pos >= 0:
            line_end = find(b"\n", pos, size)
            if line_end < 0:
                line_end = size
            lines.add((data.rfind(b"\n", 0, pos) + 1, line_end))
            pos = find(literal, line_end + 1, size)
    subject = data if text is None else text
    for line_start, line_end in sorted(lines):
        if pattern.search(subject, line_start, line_end) is not None:
            hits.append((line_end, index))


# -- the matcher ----------------------------------------------------------------------------------


def literal_signatures(literals: Sequence[str]) -> list[Signature]:
    """Plain strings as signatures named by themselves, for a matcher that also finds where they
    occur: one pass over the lines for them and the catalog's signatures together."""
    from radixtop.diagnosis.catalog import Signature

    return [Signature(text, text, re.escape(text), "info", "", "", (), ()) for text in literals]


class Matcher:
    """Match a signature catalog against single lines (`match`) or buffers of lines (`scan`)."""

    def __init__(self, signatures: Sequence[Signature], engine: str | None = None) -> None:
        if engine is not None and engine not in ENGINES:
            raise MatcherError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
        self.signatures = tuple(signatures)
        self._patterns = [_encode(sig.pattern) for sig in self.signatures]
        # Checked with `re` on the line itself when hyperscan reports them (see module docstring);
        # compiled on the first hit that needs it: most runs need none, and start-up counts.
        self._may_cross = frozenset(
            i for i, sig in enumerate(self.signatures) if _may_cross_lines(sig.pattern)
        )
        self._recheck: dict[int, Any] = {}
        self.fallback_note: str | None = None
        self._engine: Any = None
        if not self._patterns:
            self.engine = engine or "re"
            return
        notes: list[str] = []
        for name in (engine,) if engine else ENGINES:
            try:
                if name == "hyperscan":
                    self._engine = _HyperscanEngine(self._patterns)
                elif name == "re2":
                    self._engine = _Re2Engine(self._patterns, [s.pattern for s in self.signatures])
                else:
                    self._engine = _ReEngine(self._patterns, [s.pattern for s in self.signatures])
            except _EngineUnavailable as exc:
                if engine:
                    raise MatcherError(f"{name} unavailable: {exc}") from exc
                notes.append(f"{name} unavailable: {exc}")
                continue
            except _PatternRejected as exc:
                sig_id = self.signatures[exc.index].id
                message = f"{name} cannot compile signature {sig_id!r}: {exc.message}"
                if engine or name == "re":
                    raise MatcherError(message) from exc
                notes.append(message)
                continue
            break
        self.engine = self._engine.name
        for index, reason in getattr(self._engine, "on_re", ()):
            notes.append(f"re2 cannot compile signature {self.signatures[index].id!r} ({reason}): it runs on re")
        if notes:
            self.fallback_note = "; ".join(notes) + f"; using {self.engine}"

    def match(self, text: str) -> tuple[int, ...]:
        """Indices of the signatures matching one line (already ANSI-stripped), ascending."""
        engine = self._engine
        if engine is None:
            return ()
        data = _encode(text)
        if engine.name != "hyperscan":
            hits: list[tuple[int, int]] = []
            engine.scan_into(data, len(data), hits)
            return tuple(sorted({i for _, i in hits}))
        found = engine.match_ids(data)
        if found and "\n" in text:
            # Same rule as scan: a pattern must match within one line.
            found = {i for i in found if self._any_line_matches(i, data)}
        return tuple(sorted(found))

    def _recheck_pattern(self, index: int) -> Any:
        """The regex that re-checks hits of signature `index` on their line (`re`, or RE2 where
        `re` could backtrack without end), or None when its hits need no re-check."""
        if index not in self._may_cross:
            return None
        try:
            return self._recheck[index]
        except KeyError:
            pass
        pattern: Any = None  # hyperscan accepted what neither takes: trust the engine
        source = self.signatures[index].pattern
        try:
            if backtracking_risk(source) is None:
                pattern = re.compile(b"(?m)" + self._patterns[index])
            else:
                import re2

                pattern = re2.compile(b"(?m)" + self._patterns[index], _re2_options())
        except Exception:  # noqa: BLE001 - re.error, a missing re2, or re2.error
            pattern = None
        self._recheck[index] = pattern
        return pattern

    def _any_line_matches(self, index: int, data: bytes) -> bool:
        pattern = self._recheck_pattern(index)
        if pattern is None:
            return True
        hits: list[tuple[int, int]] = []
        _line_hits(pattern, data, hits, index, len(data))
        return bool(hits)

    def scan(self, data: bytes | bytearray, end: int | None = None) -> list[tuple[int, int]]:
        """Hits over a buffer of whole lines, data[:end] (the last line may lack its newline).

        Returns (end_offset, signature_index) once per matching line per signature, sorted by
        offset then index. end_offset is the END OF THE MATCHING LINE (the offset of its b"\\n",
        or `end` for a last line without one), not of the match: it is the same for every engine,
        and the line is data[data.rfind(b"\\n", 0, end_offset) + 1 : end_offset]. `end` lets a
        caller scan the whole-line part of a reused read buffer without copying it.
        Safe to call from one other thread at a time while no other scan runs.
        """
        engine = self._engine
        size = len(data) if end is None else end
        if engine is None or size <= 0:
            return []
        if engine.name == "hyperscan":
            view = data if size == len(data) else memoryview(data)[:size]
            return self._hyperscan_hits(engine.raw_hits(view), data, size)
        hits: list[tuple[int, int]] = []
        engine.scan_into(data, size, hits)
        hits.sort()
        return hits

    def line_hits(self, texts: Sequence[str], raw: bytes | None = None) -> list[tuple[int, int]]:
        """(line index, signature index) for each line of ``texts`` a signature matches, once per
        pair, in line order: one scan of the lines joined. `raw`: the texts joined by newlines as
        UTF-8 already, where the caller has them (then `texts` is not read)."""
        data = raw if raw is not None else "\n".join(texts).encode("utf-8", "replace")
        out: list[tuple[int, int]] = []
        line, pos = 0, 0
        for end, index in self.scan(data):  # sorted by offset: count the newlines in between
            line += data.count(b"\n", pos, end)
            pos = end
            out.append((line, index))
        return out

    @classmethod
    def of_literals(cls, literals: Sequence[str]) -> Matcher:
        """A matcher for a few plain strings, each its own signature (named by itself): which lines
        hold them, in one pass where ``in`` would take one a string."""
        return cls(literal_signatures(literals))

    def _hyperscan_hits(
        self, raw: list[tuple[int, int]], data: Any, size: int
    ) -> list[tuple[int, int]]:
        if not raw:
            return []
        seen: set[tuple[int, int]] = set()
        find = data.find
        for end, index in raw:
            # end is exclusive: the match's last byte is end - 1, which lies on the line ending at
            # the next newline (or is that newline, for a match that consumed it).
            line_end = find(b"\n", end - 1, size)
            seen.add((size if line_end < 0 else line_end, index))
        hits = sorted(seen)
        if not self._may_cross:
            return hits
        kept = []
        subject = data if size == len(data) else memoryview(data)[:size]  # RE2's `$` at endpos: see scan_into
        for line_end, index in hits:
            pattern = self._recheck_pattern(index)
            if pattern is not None:
                line_start = data.rfind(b"\n", 0, line_end) + 1
                if pattern.search(subject, line_start, line_end) is None:
                    continue
            kept.append((line_end, index))
        return kept
