"""Secrets out of everything radixtop writes to a bundle or prints in a plan.

Four layers, applied together by :class:`Redactor`:

* key blocks: PEM and PGP private keys are redacted as whole blocks, also when the text starts or
  ends inside one (a log window cut through a key keeps none of it), and base64 body lines of a
  key with neither edge in view;
* known values: the values of secret-looking environment variables (ours and the server's, read
  with psutil) and of secret flags in the server's argv are replaced wherever they appear, in any
  text, whatever surrounds them (a token echoed in a traceback is caught too);
* shapes: every regex-based detector of Yelp's detect-secrets (GitHub, GitLab, Slack tokens and
  webhooks, AWS, JWTs, Stripe, npm, PyPI, passwords in URLs, ...) except its public-IP one, plus the
  shapes it lacks (Hugging Face ``hf_``, OpenAI-style ``sk-``, Google ``AIza``, bare ``npm_``,
  ``Authorization``/``Bearer``/``Basic`` credentials, ``scheme://:password@host``);
* names: ``NAME=value`` / ``"name": "value"`` / ``--name value`` / ``password value`` where the
  name looks secret (token, secret, password, ``*_PWD``, api key, credential, authorization).
  Plain numbers are left alone, so SGLang's ``#new-token: 64`` or ``token usage: 0.93`` survive.

A redacted value becomes ``[REDACTED]``. Nothing here is clever about false negatives: a secret with
none of these shapes, in a variable with an innocent name, passes. The bundle's README says so.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["REDACTED", "Redactor", "is_secret_name"]

REDACTED = "[REDACTED]"
_MIN_LITERAL = 6  # shorter known values would wreck ordinary text ("SECRET=1")

_SECRET_NAME = re.compile(
    r"token(?!iz|s)|secret|passw(?:or)?d|passphrase|[_-]pwd(?:$|[_-])|api[_-]?key|apikey|access[_-]?key|"
    r"private[_-]?key|credential|authorization|(?:^|[_-])auth(?:$|[_-])|(?:^|[_-])key$|cookie|session[_-]?id",
    re.IGNORECASE,
)
# Values that are never secrets even under a secret-looking name.
_TRIVIAL = re.compile(
    r"[-+]?\d[\d._:]*(?:e[-+]?\d+)?|null|none|true|false|bearer|basic|\[REDACTED\]|", re.IGNORECASE
)

# Shapes detect-secrets has no detector for (or matches only in one context, as npm's .npmrc line).
_OWN_SHAPES = (
    re.compile(r"\bhf_[A-Za-z0-9]{16,}"),
    re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bgl[a-z]{2,4}-[A-Za-z0-9_-]{20,}"),
    re.compile(r"\bxox[abposre]-[A-Za-z0-9-]{10,}"),
    re.compile(r"\bAIza[0-9A-Za-z_-]{30,}"),
    re.compile(r"\bnpm_[A-Za-z0-9]{30,}"),
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
)
# detect-secrets detectors that find things that are not secrets (a public IP), or that the block
# rule below handles better (its private-key detector sees only the BEGIN line).
_LIBRARY_SKIPPED = frozenset({"IPPublicDetector", "PrivateKeyDetector"})

# Private-key armour: PEM (RSA, EC, OPENSSH, ENCRYPTED, ...) and PGP ("... PRIVATE KEY BLOCK").
_KEY_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
_KEY_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
# A line of a key's body or armour header, for a block whose BEGIN line is out of view.
_KEY_BODY = re.compile(r"\s*(?:[A-Za-z0-9+/=]{16,}|=[A-Za-z0-9+/]{4}|[A-Za-z-]+: .*|)\s*")
# A base64 line as long as a key's, on its own: a key body with neither edge in view.
# Mixed case, so that a hex digest (a manifest's SHA-256) is not taken for one.
_KEY_BODY_ALONE = re.compile(r"\s*(?=[^a-z]*[a-z])(?=[^A-Z]*[A-Z])[A-Za-z0-9+/]{40,}={0,2}\s*")

# "Bearer <token>", "Basic <b64>" (the scheme kept, the credential dropped).
_SCHEME = re.compile(r"(?i)\b(bearer|basic)(\s+)([A-Za-z0-9._~+/=-]{6,})")
# scheme://user:password@host and scheme://:password@host (Redis has no user).
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]*:)([^@\s/]+)(@)")
# name = value, name: value, "name": "value", name="value" (the name checked by _SECRET_NAME).
_KEY_VALUE = re.compile(
    r"""(?P<key>[A-Za-z_][\w.-]*)(?P<sep>["']?\s*[:=]\s*)(?P<quote>["']?)(?!\[REDACTED\])(?P<value>[^\s"',;}\]\)]+)"""
)
# --flag value / --flag=value on a command line.
_FLAG_VALUE = re.compile(
    r"(?P<flag>--[A-Za-z][\w-]*)(?P<sep>=|\s+)(?!\[REDACTED\])(?P<value>[^\s\"']+|\"[^\"]*\"|'[^']*')"
)
# "password hunter2": a password word, blanks, then the value (words that start a sentence stay).
_PASSWORD_WORD = re.compile(
    r"(?i)\b(?P<key>pass(?:word|wd|phrase))(?P<sep>[ \t]+)(?!\[REDACTED\])"
    r"(?!(?:is|was|for|of|the|a|an|and|or|to|not|must|should|has|had|have|will|required|authentication|"
    r"auth|changed|reset|incorrect|invalid|expired|missing|empty|set|policy|prompt|file|length|manager|"
    r"from|in|on|with|without|via|by|cannot|can|did|does|do)\b)(?P<value>[^\s\"',;]+)"
)


@functools.lru_cache(maxsize=1)
def _library_shapes() -> tuple[re.Pattern[str], ...]:
    """detect-secrets' regex-based detectors' patterns (loaded once, on the first redaction)."""
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.base import BasePlugin, RegexBasedDetector

    shapes: list[re.Pattern[str]] = []
    detectors: Mapping[str, type[BasePlugin]] = get_mapping_from_secret_type_to_class()
    for cls in detectors.values():
        if issubclass(cls, RegexBasedDetector) and cls.__name__ not in _LIBRARY_SKIPPED:
            # detect-secrets declares denylist an abstract property; each detector class sets it
            # as a class attribute, a tuple of compiled patterns.
            shapes.extend(cls.denylist)  # type: ignore[arg-type]
    return tuple(shapes)


def _sub_shape(shape: re.Pattern[str], text: str) -> str:
    """Like detect-secrets: a pattern's groups are the secret, else the whole match (less the
    blank, quote or separator some patterns take either side)."""

    def sub(m: re.Match[str]) -> str:
        spans = [m.span(g) for g in range(1, (m.re.groups or 0) + 1) if m.group(g)]
        if not spans:
            whole = m.group(0)
            lead = len(whole) - len(whole.lstrip(" \t\"'=:"))
            core = whole.strip(" \t\"'=:")
            if not core or core == REDACTED:
                return whole
            return whole[:lead] + REDACTED + whole[lead + len(core) :]
        out, pos = [], m.start()
        for start, end in sorted(spans):
            if start < pos:
                continue
            out.append(text[pos:start])
            out.append(REDACTED)
            pos = end
        out.append(text[pos : m.end()])
        return "".join(out)

    return shape.sub(sub, text)


def is_secret_name(name: str) -> bool:
    """Does a variable, JSON key or flag name look like it holds a secret?"""
    return bool(_SECRET_NAME.search(name.lstrip("-")))


def _trivial(value: str) -> bool:
    return _TRIVIAL.fullmatch(value.strip("\"'")) is not None


def _key_block_lines(lines: Sequence[str]) -> dict[int, tuple[int, int]]:
    """The lines inside private-key blocks: {index: (start, end) of what to drop in that line}.

    A block runs from its BEGIN line to its END line; with no END in view it runs to the last
    line; an END with no BEGIN in view takes the key-body lines just above it.
    """
    marked: dict[int, tuple[int, int]] = {}
    open_at: tuple[int, int] | None = None  # (line, column) of an unclosed BEGIN
    for i, line in enumerate(lines):
        pos = 0
        while True:
            if open_at is None:
                begin, end = _KEY_BEGIN.search(line, pos), _KEY_END.search(line, pos)
                if end is not None and (begin is None or end.start() < begin.start()):
                    j = i - 1  # an END whose BEGIN is out of view: its body is just above
                    while j >= 0 and j not in marked and _KEY_BODY.fullmatch(lines[j]):
                        marked[j] = (0, len(lines[j]))
                        j -= 1
                    marked[i] = (0, end.end()) if i not in marked else (marked[i][0], end.end())
                    pos = end.end()
                    continue
                if begin is None:
                    break
                open_at = (i, begin.start())
                pos = begin.end()
                continue
            end = _KEY_END.search(line, pos)
            start_col = open_at[1] if open_at[0] == i else 0
            if end is None:
                marked[i] = (start_col, len(line))
                break
            marked[i] = (start_col, end.end())
            for j in range(open_at[0] + 1, i):
                marked[j] = (0, len(lines[j]))
            if open_at[0] != i:
                first = open_at[0]
                marked[first] = (marked.get(first, (open_at[1], 0))[0], len(lines[first]))
            open_at = None
            pos = end.end()
    if open_at is not None:  # no END in view: the block runs to the last line
        first = open_at[0]
        marked[first] = (open_at[1], len(lines[first]))
        for j in range(first + 1, len(lines)):
            marked[j] = (0, len(lines[j]))
    for i, line in enumerate(lines):
        if i not in marked and _KEY_BODY_ALONE.fullmatch(line):
            marked[i] = (0, len(line))
    return marked


class Redactor:
    """Collects known secret values and redacts text, argv, environments and JSON with them."""

    def __init__(self, literals: Iterable[str] = ()) -> None:
        self._literals: set[str] = set()
        self._literal_re: re.Pattern[str] | None = None
        for value in literals:
            self.add_literal(value)

    # -- learning secrets ---------------------------------------------------------------------

    def add_literal(self, value: str | None) -> None:
        if value and len(value) >= _MIN_LITERAL and not _trivial(value) and value not in self._literals:
            self._literals.add(value)
            self._literal_re = None

    def learn_env(self, env: Mapping[str, str] | None) -> None:
        """Remember the values of an environment's secret-looking variables."""
        for name, value in (env or {}).items():
            if is_secret_name(name):
                self.add_literal(value)

    def learn_argv(self, argv: Sequence[str] | None) -> None:
        """Remember the values of secret flags (``--api-key X``, ``--hf-token=X``) in an argv."""
        argv = list(argv or ())
        for i, token in enumerate(argv):
            if not token.startswith("--"):
                continue
            name, eq, value = token.partition("=")
            if not is_secret_name(name):
                continue
            if eq:
                self.add_literal(value)
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                self.add_literal(argv[i + 1])

    # -- redacting ----------------------------------------------------------------------------

    def text(self, text: str) -> str:
        """Text with every secret replaced; a private-key block becomes one ``[REDACTED]``."""
        if not text:
            return text
        lines = text.split("\n")
        marked = _key_block_lines(lines)
        if marked:
            out: list[str] = []
            for i, line in enumerate(lines):
                if i not in marked:
                    out.append(line)
                    continue
                start, end = marked[i]
                if i - 1 in marked and out and out[-1].endswith(REDACTED) and start == 0:
                    out[-1] += line[end:]  # the same block goes on: one [REDACTED] for all of it
                else:
                    out.append(line[:start] + REDACTED + line[end:])
            text = "\n".join(out)
        return self._line_text(text)

    def lines(self, lines: Sequence[str]) -> list[str]:
        """A list of lines (a log window) redacted as one text, line for line: a key block's
        lines each become ``[REDACTED]`` so that the list keeps its length."""
        marked = _key_block_lines(lines)
        out = []
        for i, line in enumerate(lines):
            if i in marked:
                start, end = marked[i]
                line = line[:start] + REDACTED + line[end:]
            out.append(self._line_text(line))
        return out

    def _line_text(self, text: str) -> str:
        if self._literals:
            if self._literal_re is None:
                # Longest first, so a value that contains another is replaced whole.
                ordered = sorted(self._literals, key=len, reverse=True)
                self._literal_re = re.compile("|".join(map(re.escape, ordered)))
            text = self._literal_re.sub(REDACTED, text)
        text = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{REDACTED}{m.group(3)}", text)
        for shape in (*_OWN_SHAPES, *_library_shapes()):
            text = _sub_shape(shape, text)
        text = _SCHEME.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
        text = _FLAG_VALUE.sub(self._flag_sub, text)
        text = _PASSWORD_WORD.sub(self._key_sub, text)
        return _KEY_VALUE.sub(self._key_sub, text)

    def name(self, rel: str) -> str:
        """A file name or relative path with any secret in it replaced (a log named after a token)."""
        return "/".join(self._line_text(part).replace("/", "_") for part in rel.split("/"))

    @staticmethod
    def _flag_sub(m: re.Match[str]) -> str:
        if is_secret_name(m.group("flag")) and not _trivial(m.group("value")):
            return f"{m.group('flag')}{m.group('sep')}{REDACTED}"
        return m.group(0)

    @staticmethod
    def _key_sub(m: re.Match[str]) -> str:
        if is_secret_name(m.group("key")) and not _trivial(m.group("value")):
            quote = m.groupdict().get("quote") or ""
            return f"{m.group('key')}{m.group('sep')}{quote}{REDACTED}"
        return m.group(0)

    def argv(self, argv: Sequence[str]) -> list[str]:
        """An argv for display: secret flag values replaced, every token redacted as text."""
        out: list[str] = []
        secret_flag = False  # the previous token was a secret flag awaiting its value
        for token in argv:
            if secret_flag and not token.startswith("--"):
                out.append(token if _trivial(token) else REDACTED)
                secret_flag = False
                continue
            secret_flag = False
            if token.startswith("--"):
                name, eq, value = token.partition("=")
                if is_secret_name(name):
                    if eq:
                        out.append(token if _trivial(value) else f"{name}={REDACTED}")
                    else:
                        out.append(token)
                        secret_flag = True
                    continue
            out.append(self.text(token))
        return out

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {
            name: (REDACTED if is_secret_name(name) and value else self.text(value))
            for name, value in env.items()
        }

    def json(self, obj: Any) -> Any:
        """A JSON-like value with secret-named string fields and every string redacted; a list
        of strings (a log window, an argv) is redacted as lines and as an argv, so a key block
        split over its items and ``["--api-key", "X"]`` are caught."""
        if isinstance(obj, Mapping):
            out: dict[Any, Any] = {}
            for key, value in obj.items():
                safe_key = self._line_text(key) if isinstance(key, str) else key
                if isinstance(key, str) and is_secret_name(key) and isinstance(value, str) and value:
                    out[safe_key] = REDACTED
                elif isinstance(key, str) and is_secret_name(key) and isinstance(value, list):
                    out[safe_key] = [REDACTED if isinstance(v, str) and v else self.json(v) for v in value]
                else:
                    out[safe_key] = self.json(value)
            return out
        if isinstance(obj, (list, tuple)):
            if obj and all(isinstance(v, str) for v in obj):
                return self.argv(self.lines(obj))
            return [self.json(v) for v in obj]
        if isinstance(obj, str):
            return self.text(obj)
        return obj
