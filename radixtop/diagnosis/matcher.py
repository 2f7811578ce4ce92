"""Match many signature patterns at once: hyperscan, else RE2, else the standard library's `re`.

All three engines work on bytes with the same semantics: patterns are UTF-8 encoded and matched
byte by byte (RE2 in Latin-1 mode, `re` with bytes patterns, hyperscan without HS_FLAG_UTF8), case
sensitive, `^`/`$` at line boundaries. A hit belongs to a line only when the pattern matches inside
that line alone (as grep and rg see it): a pattern such as `a\\s+b` that could run across a newline
is re-checked on the line, so every engine reports the same (line, signature) pairs.

This module is imported by `radixtop scan` before any output, so it imports its engines lazily and
nothing else heavy.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixtop.diagnosis.catalog import Signature

ENGINES = ("hyperscan", "re2", "re")

# Escapes and constructs that can match a newline; a pattern with none of them cannot cross lines,
# so its hits need no re-check. Conservative: a false "may cross" only costs a re-check per hit.
_MAY_CROSS_LINES = re.compile(r"\\[sWDvnxcpPhHNRXV0-7]|\[\^|\(\?[a-zA-Z]*s|[\x00-\x1f]")


class MatcherError(ValueError):
    """An engine asked for by name cannot be used, or a pattern compiles in no engine."""


def _may_cross_lines(pattern: str) -> bool:
    return _MAY_CROSS_LINES.search(pattern) is not None


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "replace")


def _on_hyperscan_match(pattern_id: int, start: int, end: int, flags: int, hits: list) -> None:
    # A named function, not a lambda: hyperscan 0.9.1 crashed here with an inline lambda.
    hits.append((end, pattern_id))


class _EngineUnavailable(Exception):
    """The engine's module cannot be imported."""


class _PatternRejected(Exception):
    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index
        self.message = message


class _HyperscanEngine:
    name = "hyperscan"

    def __init__(self, patterns: Sequence[bytes]) -> None:
        try:
            import hyperscan
        except ImportError as exc:  # includes a wheel whose shared library does not load
            raise _EngineUnavailable(str(exc) or type(exc).__name__) from exc
        self._hs = hyperscan
        n = len(patterns)
        ids = list(range(n))
        multiline = hyperscan.HS_FLAG_MULTILINE
        self._scan_db = self._compile(patterns, ids, [multiline] * n)
        self._match_db = self._compile(
            patterns, ids, [multiline | hyperscan.HS_FLAG_SINGLEMATCH] * n
        )

    def _compile(self, patterns: Sequence[bytes], ids: list[int], flags: list[int]) -> Any:
        hs = self._hs
        db = hs.Database(mode=hs.HS_MODE_BLOCK)
        try:
            db.compile(expressions=list(patterns), ids=ids, elements=len(patterns), flags=flags)
        except hs.error as exc:
            # Find the culprit by compiling one at a time (only on this failure path).
            for i, pattern in enumerate(patterns):
                one = hs.Database(mode=hs.HS_MODE_BLOCK)
                try:
                    one.compile(expressions=[pattern], ids=[0], elements=1, flags=[flags[i]])
                except hs.error as one_exc:
                    raise _PatternRejected(i, str(one_exc)) from exc
            raise _PatternRejected(0, str(exc)) from exc
        return db

    def match_ids(self, data: bytes) -> set[int]:
        hits: list[tuple[int, int]] = []
        self._match_db.scan(data, match_event_handler=_on_hyperscan_match, context=hits)
        return {pattern_id for _, pattern_id in hits}

    def raw_hits(self, data: Any) -> list[tuple[int, int]]:
        """(match end, pattern index) for every match end hyperscan reports (unsorted, repeated)."""
        hits: list[tuple[int, int]] = []
        self._scan_db.scan(data, match_event_handler=_on_hyperscan_match, context=hits)
        return hits


class _Re2Engine:
    name = "re2"

    def __init__(self, patterns: Sequence[bytes]) -> None:
        try:
            import re2
        except ImportError as exc:
            raise _EngineUnavailable(str(exc) or type(exc).__name__) from exc
        options = re2.Options()
        options.encoding = re2.Options.Encoding.LATIN1  # byte semantics, like hyperscan and re
        options.log_errors = False
        compiled = []
        for i, pattern in enumerate(patterns):
            try:
                compiled.append(re2.compile(b"(?m)" + pattern, options))
            except re2.error as exc:
                raise _PatternRejected(i, _one_line(exc)) from exc
        self.compiled = compiled
        self._set = re2.Set.SearchSet(options)
        for pattern in patterns:
            self._set.Add(b"(?m)" + pattern)
        self._set.Compile()

    def candidates(self, data: Any) -> Sequence[int]:
        """Indices of patterns matching somewhere in data (one pass over it for all patterns)."""
        return self._set.Match(data) or ()


class _ReEngine:
    name = "re"

    def __init__(self, patterns: Sequence[bytes]) -> None:
        compiled = []
        for i, pattern in enumerate(patterns):
            try:
                compiled.append(re.compile(b"(?m)" + pattern))
            except re.error as exc:
                raise _PatternRejected(i, _one_line(exc)) from exc
        self.compiled = compiled

    def candidates(self, data: Any) -> Sequence[int]:
        # No multi-pattern pass in `re`: the per-pattern search loop is the filter.
        return range(len(self.compiled))


def _one_line(exc: BaseException) -> str:
    text = exc.args[0] if exc.args else exc
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return " ".join(str(text).split())


def _line_hits(
    pattern: Any, data: Any, hits: list[tuple[int, int]], index: int, size: int
) -> None:
    """Append (line end, index) once per line of data[:size] where pattern matches in the line."""
    pos = 0
    while pos <= size:
        m = pattern.search(data, pos, size)
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
            if pattern.search(data, line_start, line_end) is not None:
                hits.append((line_end, index))
        pos = line_end + 1


class Matcher:
    """Match a signature catalog against single lines (`match`) or buffers of lines (`scan`)."""

    def __init__(self, signatures: Sequence[Signature], engine: str | None = None) -> None:
        if engine is not None and engine not in ENGINES:
            raise MatcherError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
        self.signatures = tuple(signatures)
        self._patterns = [_encode(sig.pattern) for sig in self.signatures]
        # Checked with `re` on the line itself when hyperscan reports them (see module docstring).
        self._recheck: dict[int, re.Pattern[bytes]] = {}
        for i, sig in enumerate(self.signatures):
            if _may_cross_lines(sig.pattern):
                try:
                    self._recheck[i] = re.compile(b"(?m)" + self._patterns[i])
                except re.error:
                    pass  # hyperscan or RE2 accepted what `re` does not: trust the engine
        self.fallback_note: str | None = None
        self._engine: Any = None
        if not self._patterns:
            self.engine = engine or "re"
            return
        notes: list[str] = []
        for name in (engine,) if engine else ENGINES:
            try:
                self._engine = _ENGINE_CLASSES[name](self._patterns)
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
        if notes:
            self.fallback_note = "; ".join(notes) + f"; using {self.engine}"

    def match(self, text: str) -> tuple[int, ...]:
        """Indices of the signatures matching one line (already ANSI-stripped), ascending."""
        if self._engine is None:
            return ()
        data = _encode(text)
        engine = self._engine
        if engine.name == "hyperscan":
            found = engine.match_ids(data)
            if "\n" in text:
                # Same rule as scan: a pattern must match within one line.
                found = {i for i in found if self._any_line_matches(i, data)}
            return tuple(sorted(found))
        hits: list[tuple[int, int]] = []
        for i in engine.candidates(data):
            _line_hits(engine.compiled[i], data, hits, i, len(data))
        return tuple(sorted({i for _, i in hits}))

    def _any_line_matches(self, index: int, data: bytes) -> bool:
        pattern = self._recheck.get(index)
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
        """
        engine = self._engine
        size = len(data) if end is None else end
        if engine is None or size <= 0:
            return []
        view = data if size == len(data) else memoryview(data)[:size]
        if engine.name == "hyperscan":
            return self._hyperscan_hits(engine.raw_hits(view), data, size)
        hits: list[tuple[int, int]] = []
        for i in engine.candidates(view):
            _line_hits(engine.compiled[i], data, hits, i, size)
        hits.sort()
        return hits

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
        if not self._recheck:
            return hits
        kept = []
        for line_end, index in hits:
            pattern = self._recheck.get(index)
            if pattern is not None:
                line_start = data.rfind(b"\n", 0, line_end) + 1
                if pattern.search(data, line_start, line_end) is None:
                    continue
            kept.append((line_end, index))
        return kept


_ENGINE_CLASSES = {"hyperscan": _HyperscanEngine, "re2": _Re2Engine, "re": _ReEngine}
