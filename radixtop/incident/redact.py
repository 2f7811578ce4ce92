"""Secrets out of everything radixtop writes to a bundle or prints in a plan.

Three layers, applied together by :class:`Redactor`:

* known values: the values of secret-looking environment variables (ours and the server's, read
  with psutil) and of secret flags in the server's argv are replaced wherever they appear, in any
  text, whatever surrounds them (a token echoed in a traceback is caught too);
* shapes: Hugging Face tokens (``hf_...``), OpenAI-style keys (``sk-...``), GitHub tokens, AWS
  access key ids, JWTs, PEM private-key blocks, ``Authorization:``/``Bearer``/``Basic`` credentials, passwords in URLs;
* names: ``NAME=value`` / ``"name": "value"`` / ``--name value`` where the name looks secret
  (token, secret, password, api key, credential, authorization). Plain numbers are left alone, so
  SGLang's ``#new-token: 64`` or ``token usage: 0.93`` survive.

A redacted value becomes ``[REDACTED]``. Nothing here is clever about false negatives: a secret with
none of these shapes, in a variable with an innocent name, passes. The bundle's README says so.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["REDACTED", "Redactor", "is_secret_name"]

REDACTED = "[REDACTED]"
_MIN_LITERAL = 6  # shorter known values would wreck ordinary text ("SECRET=1")

_SECRET_NAME = re.compile(
    r"token(?!iz|s)|secret|passw(?:or)?d|api[_-]?key|apikey|access[_-]?key|private[_-]?key|"
    r"credential|authorization|(?:^|[_-])auth(?:$|[_-])|(?:^|[_-])key$|cookie|session[_-]?id",
    re.IGNORECASE,
)
# Values that are never secrets even under a secret-looking name.
_TRIVIAL = re.compile(
    r"[-+]?\d[\d._:]*(?:e[-+]?\d+)?|null|none|true|false|bearer|basic|\[REDACTED\]|", re.IGNORECASE
)

_SHAPES = (
    re.compile(r"\bhf_[A-Za-z0-9]{16,}"),
    re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    # PEM private keys, whole blocks; a block cut off before its END line is redacted to the end.
    re.compile(r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----(?:.*?-----END \1PRIVATE KEY-----|.*\Z)", re.DOTALL),
)
# "Bearer <token>", "Basic <b64>" (the scheme kept, the credential dropped).
_SCHEME = re.compile(r"(?i)\b(bearer|basic)(\s+)([A-Za-z0-9._~+/=-]{6,})")
# scheme://user:password@host
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]+:)([^@\s/]+)(@)")
# name = value, name: value, "name": "value", name="value" (the name checked by _SECRET_NAME).
_KEY_VALUE = re.compile(
    r"""(?P<key>[A-Za-z_][\w.-]*)(?P<sep>["']?\s*[:=]\s*)(?P<quote>["']?)(?!\[REDACTED\])(?P<value>[^\s"',;}\]\)]+)"""
)
# --flag value / --flag=value on a command line.
_FLAG_VALUE = re.compile(r"(?P<flag>--[A-Za-z][\w-]*)(?P<sep>=|\s+)(?!\[REDACTED\])(?P<value>[^\s\"']+|\"[^\"]*\"|'[^']*')")


def is_secret_name(name: str) -> bool:
    """Does a variable, JSON key or flag name look like it holds a secret?"""
    return bool(_SECRET_NAME.search(name.lstrip("-")))


def _trivial(value: str) -> bool:
    return _TRIVIAL.fullmatch(value.strip("\"'")) is not None


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
        if not text:
            return text
        if self._literals:
            if self._literal_re is None:
                # Longest first, so a value that contains another is replaced whole.
                ordered = sorted(self._literals, key=len, reverse=True)
                self._literal_re = re.compile("|".join(map(re.escape, ordered)))
            text = self._literal_re.sub(REDACTED, text)
        for shape in _SHAPES:
            text = shape.sub(REDACTED, text)
        text = _SCHEME.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
        text = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{REDACTED}{m.group(3)}", text)
        text = _FLAG_VALUE.sub(self._flag_sub, text)
        return _KEY_VALUE.sub(self._key_sub, text)

    @staticmethod
    def _flag_sub(m: re.Match[str]) -> str:
        if is_secret_name(m.group("flag")) and not _trivial(m.group("value")):
            return f"{m.group('flag')}{m.group('sep')}{REDACTED}"
        return m.group(0)

    @staticmethod
    def _key_sub(m: re.Match[str]) -> str:
        if is_secret_name(m.group("key")) and not _trivial(m.group("value")):
            return f"{m.group('key')}{m.group('sep')}{m.group('quote')}{REDACTED}"
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
        """A JSON-like value with secret-named string fields and every string redacted."""
        if isinstance(obj, Mapping):
            out = {}
            for key, value in obj.items():
                if isinstance(key, str) and is_secret_name(key) and isinstance(value, str) and value:
                    out[key] = REDACTED
                elif isinstance(key, str) and is_secret_name(key) and isinstance(value, list):
                    out[key] = [REDACTED if isinstance(v, str) and v else self.json(v) for v in value]
                else:
                    out[key] = self.json(value)
            return out
        if isinstance(obj, (list, tuple)):
            return [self.json(v) for v in obj]
        if isinstance(obj, str):
            return self.text(obj)
        return obj
