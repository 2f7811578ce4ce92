"""The token ids a synthesized prompt may use: the model's own vocabulary, never a guess.

A prompt radixtop makes up (a trace without recorded prompts) is a list of token ids sent as
`input_ids`. An id outside the model's embedding table crashes SGLang's scheduler (`IndexError:
index out of range in self` on a CPU, a device-side assert on a GPU), and a special token (BOS,
EOS, padding, chat markers) changes what the model does. So the ids come from the model's own
files: `config.json`'s `vocab_size` (or its `text_config`'s), cut to the tokenizer's size where
`tokenizer.json` is there, without the special tokens that the tokenizer and the config name.

The model's folder is `/server_info`'s `model_path` (or `tokenizer_path`) when it is a folder on
this machine, else the Hugging Face cache's snapshot of that model id. Nothing is downloaded.
"""

from __future__ import annotations

import bisect
import json
import os
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

__all__ = ["SIM_VOCABULARY", "VocabError", "Vocabulary", "for_server", "from_model_dir"]

MAX_JSON_BYTES = 64 * 1024 * 1024  # a tokenizer.json of a 256k vocabulary is ~20 MB
TABLE_MAX = 1 << 20


class VocabError(ValueError):
    """The vocabulary cannot be known; str() is one line saying what to do."""


@dataclass(frozen=True)
class Vocabulary:
    """Ids 0..size-1 less `special`; `usable` of them, numbered 0..usable-1 by `nth`."""

    size: int
    """The number of ids the model accepts (its embedding rows, cut to the tokenizer's size)."""
    special: tuple[int, ...] = ()
    """The ids a made-up prompt never uses (sorted): BOS, EOS, padding, the tokenizer's added specials."""
    source: str = ""
    """Where `size` was read, for the plan ("/models/x/config.json")."""

    def __post_init__(self) -> None:
        special = tuple(sorted({t for t in self.special if 0 <= t < self.size}))
        object.__setattr__(self, "special", special)
        if self.size - len(special) < 2:
            raise VocabError(f"a vocabulary of {self.size} ids with {len(special)} special leaves nothing to use")

    @cached_property
    def usable(self) -> int:  # read once per synthesized prompt, like size and special: kept
        return self.size - len(self.special)

    @cached_property
    def _table(self) -> Sequence[int] | None:
        """Every usable id in order, for vocabularies small enough to list (real models' are)."""
        if not self.special or self.size > TABLE_MAX:
            return None
        return array("l", (t for t in range(self.size) if t not in set(self.special)))

    def nth(self, i: int) -> int:
        """The i-th usable id (0 <= i < usable), skipping the special ones."""
        if not 0 <= i < self.usable:
            raise IndexError(f"usable id {i} is outside 0..{self.usable - 1}")
        if not self.special:
            return i
        table = self._table
        if table is not None:
            return table[i]
        x = i
        while True:  # x - (specials <= x) == i, and x itself not special
            nxt = i + bisect.bisect_right(self.special, x)
            if nxt == x:
                return x
            x = nxt

    def nth_many(self, indices: list[int]) -> list[int]:
        """``[self.nth(i) for i in indices]``, by C loops where the vocabulary allows."""
        if indices and not (0 <= min(indices) and max(indices) < self.usable):
            bad = next(i for i in indices if not 0 <= i < self.usable)
            raise IndexError(f"usable id {bad} is outside 0..{self.usable - 1}")
        if not self.special:
            return list(indices)
        return self.nth_many_in_range(indices)

    def nth_many_in_range(self, indices: list[int]) -> list[int]:
        """``nth_many`` of indices the caller knows are within 0..usable-1 (drawn below it): no
        pass over them to check. Without special ids the ids are the indices: the list itself."""
        if not self.special:
            return indices
        table = self._table
        if table is not None:
            return list(map(table.__getitem__, indices))
        return [self.nth(i) for i in indices]

    def describe(self) -> str:
        special = f", {len(self.special)} special ids left out" if self.special else ""
        return f"{self.size:,} token ids ({self.source}){special}"


SIM_VOCABULARY = Vocabulary(1 << 24, (), "radixtop's simulator")


def _read_json(path: Path) -> Any:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_JSON_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_JSON_BYTES:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _ids(value: Any) -> Iterable[int]:
    if isinstance(value, bool):
        return ()
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return ()


def _config_vocab(config: Mapping[str, Any]) -> int | None:
    for where in (config, config.get("text_config"), config.get("llm_config")):
        if isinstance(where, Mapping):
            size = where.get("vocab_size")
            if isinstance(size, int) and not isinstance(size, bool) and size > 0:
                return size
    return None


def _config_special(config: Mapping[str, Any]) -> set[int]:
    out: set[int] = set()
    for where in (config, config.get("text_config")):
        if isinstance(where, Mapping):
            for key in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
                out.update(_ids(where.get(key)))
    return out


def _tokenizer(root: Path) -> tuple[int | None, set[int]]:
    """tokenizer.json's size (its highest id + 1) and its special added tokens."""
    tok = _read_json(root / "tokenizer.json")
    if not isinstance(tok, Mapping):
        return None, set()
    top = -1
    special: set[int] = set()
    model = tok.get("model")
    vocab = model.get("vocab") if isinstance(model, Mapping) else None
    if isinstance(vocab, Mapping):
        top = max((v for v in vocab.values() if isinstance(v, int)), default=-1)
    elif isinstance(vocab, list):  # Unigram: a list of [piece, score]
        top = len(vocab) - 1
    for added in tok.get("added_tokens") or ():
        if isinstance(added, Mapping) and isinstance(added.get("id"), int):
            top = max(top, added["id"])
            if added.get("special"):
                special.add(added["id"])
    return (top + 1 if top >= 0 else None), special


def from_model_dir(root: Path) -> Vocabulary | None:
    """The vocabulary of the model in folder `root`; None when it has no readable config.json."""
    config = _read_json(root / "config.json")
    if not isinstance(config, Mapping):
        return None
    size = _config_vocab(config)
    if size is None:
        return None
    special = _config_special(config)
    generation = _read_json(root / "generation_config.json")
    if isinstance(generation, Mapping):
        special |= _config_special(generation)
    tok_size, tok_special = _tokenizer(root)
    source = str(root / "config.json")
    if tok_size is not None and tok_size < size:  # embedding rows past the tokenizer are padding
        size, source = tok_size, f"{root / 'tokenizer.json'}, inside config.json's {size:,}"
    return Vocabulary(size, tuple(special | tok_special), source)


def _hub_caches(env: Mapping[str, str]) -> list[Path]:
    roots: list[Path] = []
    for source in (env, os.environ):
        if source.get("HF_HUB_CACHE"):
            roots.append(Path(source["HF_HUB_CACHE"]))
        if source.get("HF_HOME"):
            roots.append(Path(source["HF_HOME"]) / "hub")
    roots.append(Path.home() / ".cache" / "huggingface" / "hub")
    return list(dict.fromkeys(roots))


def _snapshot_dirs(model_id: str, env: Mapping[str, str]) -> list[Path]:
    """The Hugging Face cache's snapshots of `model_id` ("org/name"), newest first."""
    if model_id.count("/") != 1 or ".." in model_id or model_id.startswith("/"):
        return []
    folder = "models--" + model_id.replace("/", "--")
    found: list[Path] = []
    for cache in _hub_caches(env):
        snaps = cache / folder / "snapshots"
        try:
            entries = sorted(snaps.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
        except OSError:
            continue
        found += [p for p in entries if p.is_dir()]
    return found


def for_server(
    info: Mapping[str, Any] | None, *, env: Mapping[str, str] | None = None, kind: str = "sglang"
) -> Vocabulary:
    """The vocabulary of the model a server serves, from its `/server_info` (live or remembered).

    The simulator's vocabulary is its own. VocabError (one line) when the model's files are not
    on this machine: a made-up prompt would then be a guess."""
    if kind == "radixtop-sim" and not _model_paths(info):
        return SIM_VOCABULARY
    tried: list[str] = []
    for path in _model_paths(info):
        candidates = [Path(path)] if Path(path).is_absolute() or Path(path).is_dir() else []
        candidates += _snapshot_dirs(path, env or {})
        for root in candidates:
            vocab = from_model_dir(root)
            if vocab is not None:
                return vocab
        tried.append(path)
    if kind == "radixtop-sim":
        return SIM_VOCABULARY
    if not tried:
        why = "no model_path in /server_info" if info else "no /server_info answered"
        raise VocabError(f"the server's model is unknown ({why}), so is its vocabulary: pass --vocab-size N, or "
                         "--trace with recorded prompts")
    raise VocabError(f"no config.json with vocab_size for the model {tried[0]!r} on this machine (its folder or the "
                     "Hugging Face cache): pass --vocab-size N, or --trace with recorded prompts")


def _model_paths(info: Mapping[str, Any] | None) -> Sequence[str]:
    if not info:
        return ()
    paths = [info.get(k) for k in ("model_path", "tokenizer_path")]
    return list(dict.fromkeys(p for p in paths if isinstance(p, str) and p and len(p) < 4096))
