"""The served model's tokenizer, read from this node's disk, so the radix pane can show a prefix as
text: "You are a helpful assistant…" instead of [12567198 6918629 …].

Where: the folder /server_info names (`tokenizer_path`, else `model_path`), or, for a hub name such
as "org/model", that model's snapshot in the Hugging Face cache on this node. Only `tokenizer.json`
in that folder is read, with the `tokenizers` library's `Tokenizer.from_str`: nothing is fetched,
nothing else of the model is opened. The file must be a regular file (a link to one is fine: the
hub's cache is made of them) of at most MAX_TOKENIZER_BYTES; a FIFO or a device is refused without
being read. `load_for_server` blocks (a big tokenizer.json takes a second to parse): the live
sources run it on a worker thread.

A server that is not on this node is not matched against this node's files: the same path here may
hold another model.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from radixtop.textsafe import printable_line

__all__ = ["MAX_TOKENIZER_BYTES", "TokenText", "find_tokenizer", "load_for_server", "load_tokenizer"]

MAX_TOKENIZER_BYTES = 64 << 20  # the largest common tokenizer.json (Gemma 3's) is about 33 MB
MAX_CACHED = 4096  # decoded heads kept (the rows on screen and around them)
FILE = "tokenizer.json"


class TokenText:
    """Token ids -> text with one model's tokenizer; `decode` is None for ids it does not have
    (another model's ids: the row keeps its ids rather than show wrong text)."""

    def __init__(self, tokenizer: Any, path: Path) -> None:
        self._tok = tokenizer
        self.path = path
        self.vocab = int(tokenizer.get_vocab_size(with_added_tokens=True))
        self._cache: dict[tuple[int, ...], str | None] = {}

    def decode(self, ids: Sequence[int]) -> str | None:
        key = tuple(ids)
        if key in self._cache:
            return self._cache[key]
        text: str | None = None
        if key and all(type(t) is int and 0 <= t < self.vocab for t in key):
            try:  # special tokens kept: a chat template's <|im_start|> is part of what was cached
                text = self._tok.decode(list(key), skip_special_tokens=False)
            except Exception:  # the library's own refusal of an id: show the ids
                text = None
        if len(self._cache) >= MAX_CACHED:
            self._cache.clear()
        self._cache[key] = text
        return text


def _hub_snapshot(name: str) -> Path | None:
    """The folder of a hub model's newest snapshot in this node's Hugging Face cache, or None."""
    if name.count("/") != 1 or name.startswith((".", "/")) or ".." in name:
        return None
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    cache = Path(os.environ.get("HF_HUB_CACHE") or os.path.join(home, "hub"))
    repo = cache / ("models--" + name.replace("/", "--"))
    try:
        ref = (repo / "refs" / "main").read_text(encoding="ascii", errors="replace")[:100].strip()
    except OSError:
        ref = ""
    if ref and "/" not in ref and (repo / "snapshots" / ref / FILE).exists():
        return repo / "snapshots" / ref
    try:
        found = [p for p in (repo / "snapshots").iterdir() if (p / FILE).exists()]
    except OSError:
        return None
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def find_tokenizer(info: Mapping[str, Any]) -> tuple[Path | None, str]:
    """(the tokenizer.json to read, "") or (None, why there is none) from /server_info's fields."""
    named = [v for v in (info.get("tokenizer_path"), info.get("model_path")) if isinstance(v, str) and v.strip()]
    if not named:
        return None, "/server_info names no model_path"
    for given in dict.fromkeys(named):
        folder = Path(given).expanduser()
        if folder.is_dir():
            return folder / FILE, ""
        hub = _hub_snapshot(given)
        if hub is not None:
            return hub / FILE, ""
    shown = printable_line(named[0], 120)
    return None, f"{shown} is no folder on this node (nor in its Hugging Face cache)"


def load_tokenizer(path: Path, max_bytes: int = MAX_TOKENIZER_BYTES) -> tuple[TokenText | None, str]:
    """(the tokenizer, "") or (None, one line saying why not). Blocks: run it off the UI thread."""
    shown = printable_line(str(path), 160)
    try:
        # O_NONBLOCK: a FIFO put there opens at once and is refused below, never waited on.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None, f"no {FILE} in {printable_line(str(path.parent), 160)}"
    except OSError as exc:
        return None, f"{shown} not read ({exc.strerror or type(exc).__name__})"
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, f"{shown} is not a regular file"
        if st.st_size > max_bytes:
            return None, f"{shown} is {st.st_size / (1 << 20):.0f} MiB, over radixtop's {max_bytes >> 20} MiB cap"
        try:
            body = fh.read(max_bytes + 1)
        except OSError as exc:
            return None, f"{shown} not read ({exc.strerror or type(exc).__name__})"
    if len(body) > max_bytes:  # it grew while being read
        return None, f"{shown} is over radixtop's {max_bytes >> 20} MiB cap"
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None, "the tokenizers package is not installed (pip install tokenizers)"
    try:
        tok = Tokenizer.from_str(body.decode("utf-8"))
    except Exception as exc:  # UnicodeDecodeError, or the library's own (serde) error
        return None, f"{shown} is no tokenizer the tokenizers library reads ({printable_line(str(exc), 80)})"
    return TokenText(tok, path), ""


def load_for_server(info: Mapping[str, Any], *, local: bool = True) -> tuple[TokenText | None, str]:
    """The tokenizer of the server whose /server_info is `info`; `local`: the server runs on this
    node (else this node's files are not its model's)."""
    if not local:
        return None, "the server is not on this node, so its tokenizer.json is not either"
    path, why = find_tokenizer(info)
    if path is None:
        return None, why
    return load_tokenizer(path)
