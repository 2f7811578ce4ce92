"""The simulator's deterministic "model" and a tiny deterministic tokenizer.

The model never sees the prompt directly: like attention, it reads what the KV slots hold. Each
request folds the (token id, position) pairs it reads from its slots, in position order, into a
running digest; the next token is a hash of that digest and the position. So:

* identical requests that read correct KV produce byte-identical outputs at temperature 0,
  whatever the batch, the cache hits or the retractions they went through;
* a request that reads a stale or misassigned slot folds different contents and its output
  changes from the first token on, exactly as corrupted KV does on a GPU.

The digest is a polynomial hash mod the Mersenne prime 2**61-1 (cheap per token, so a 2,000-token
prompt costs well under a millisecond); output tokens are mixed through BLAKE2b. Token ids are
24-bit; an output id is ``hi << 11 | lo`` where ``hi`` depends only on the prompt's last token and
``lo`` on the digest, so outputs read as `` u7892_1146 u7892_1086 ...`` like the seed's, and a
corrupted read changes the ``_lo`` parts while the ``u7892`` stem stays, as in issue #22819.
"""

from __future__ import annotations

import hashlib
import operator
import re
import struct
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import NamedTuple

from radixtop.sim.pool import TokenToKVPoolAllocator

__all__ = ["VOCAB_SIZE", "PromptFolds", "SimModel", "SimTokenizer"]

VOCAB_SIZE = 1 << 24
_LO_BITS = 11
_LO_MASK = (1 << _LO_BITS) - 1
_HI_RANGE = VOCAB_SIZE >> _LO_BITS  # 8192
_MOD = (1 << 61) - 1
_BASE = 0x5BD1E995_3C6EF372 % _MOD
_WORD = re.compile(r"u(\d{1,4})_(\d{1,4})")


@lru_cache(maxsize=8)
def _packer(count: int) -> struct.Struct:
    return struct.Struct(f"<{count}q")


def _hash64(*parts: int) -> int:
    data = _packer(len(parts)).pack(*parts)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


# _hash64's bytes for (seed, 2, state, position, noise), packed without looking the packer up:
# one per output token.
_pack_token_parts = struct.Struct("<5q").pack


@lru_cache(maxsize=4096)
def _stem(seed: int, stem_token: int) -> int:
    return _hash64(seed, 1, stem_token) % _HI_RANGE


class _FoldTables(NamedTuple):
    powers: list[int]  # B**j for j in 0..chunk
    descending: list[int]  # B**(chunk-1) .. B**0: its last n are a chunk of n's weights
    power_sums: list[int]  # sum of B**j for j < n: a position offset's weight
    count_sums: list[int]  # sum of (i + 1) * B**(n-1-i) for i < n: Horner's rule over 1..n


@lru_cache(maxsize=1)
def _fold_tables(chunk: int = 1024) -> _FoldTables:
    powers, power_sums, count_sums = [1], [0], [0]
    for n in range(1, chunk + 1):
        powers.append(powers[-1] * _BASE % _MOD)
        power_sums.append((power_sums[-1] + powers[n - 1]) % _MOD)
        count_sums.append((count_sums[-1] * _BASE + n) % _MOD)
    return _FoldTables(powers, powers[chunk - 1 :: -1], power_sums, count_sums)


class SimTokenizer:
    """Word-level and reversible for the model's own words (`` u<hi>_<lo>``).

    ``decode`` writes each id as `` u{id >> 11}_{id & 2047}``; ``encode`` splits on whitespace,
    maps such words back to their id and any other word to a stable hash id, so ``encode(decode(ids))
    == ids`` for every valid id list, and any text gets ids without error.
    """

    vocab_size = VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in text.split():
            m = _WORD.fullmatch(word)
            if m and int(m.group(1)) < _HI_RANGE and int(m.group(2)) <= _LO_MASK:
                ids.append(int(m.group(1)) << _LO_BITS | int(m.group(2)))
            else:
                digest = hashlib.blake2b(word.encode("utf-8", "surrogatepass"), digest_size=8).digest()
                ids.append(int.from_bytes(digest, "little") % VOCAB_SIZE)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(f" u{t >> _LO_BITS}_{t & _LO_MASK}" for t in ids)


class SimModel:
    """next token = f(digest of the KV actually read, position[, sampling noise])."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    @staticmethod
    def read_kv(state: int, pool: TokenToKVPoolAllocator, slots: Sequence[int]) -> int:
        """Fold the contents of ``slots`` (in position order) into the digest."""
        kt, kp = pool.kv_token, pool.kv_pos
        base, mod = _BASE, _MOD
        for s in slots:
            state = (state * base + (kt[s] << 32) + kp[s] + 1) % mod
        return state

    @staticmethod
    def fold(state: int, tokens: Sequence[int], first_position: int) -> int:
        """What :meth:`read_kv` gives for slots holding ``tokens`` at consecutive positions from
        ``first_position``, from the tokens themselves: for a reader that knows what its slots hold.

        Horner's rule over n tokens is ``state * B**n + sum(c_i * B**(n-1-i))`` with ``c_i = (t_i
        << 32) + position_i + 1``: one C loop multiplies the tokens by the powers, and the
        positions' part comes from two tables, so no Python step runs per token. A token or two
        (a decode step's) cost less by the rule itself.
        """
        if len(tokens) <= 2:
            for i, token in enumerate(tokens):
                state = (state * _BASE + (token << 32) + first_position + i + 1) % _MOD
            return state
        tables = _fold_tables()
        chunk = len(tables.powers) - 1
        for start in range(0, len(tokens), chunk):
            part = tokens[start : start + chunk]
            n = len(part)
            weighted = sum(map(operator.mul, part, tables.descending[chunk - n :]))
            state = (
                state * tables.powers[n]
                + (weighted << 32)
                + (first_position + start) * tables.power_sums[n]
                + tables.count_sums[n]
            ) % _MOD
        return state

    @staticmethod
    def fold_token(state: int, token: int, position: int) -> int:
        """``fold(state, (token,), position)``: the one token a decode step writes."""
        return (state * _BASE + (token << 32) + position + 1) % _MOD

    def next_token(self, state: int, position: int, stem_token: int, noise: int = 0) -> int:
        """The token at ``position``; ``stem_token`` (the prompt's last token) picks the ``u<hi>`` stem."""
        hi = _stem(self.seed, stem_token)
        digest = hashlib.blake2b(_pack_token_parts(self.seed, 2, state, position, noise), digest_size=8).digest()
        return hi << _LO_BITS | int.from_bytes(digest, "little") & _LO_MASK


class PromptFolds:
    """Prompts' digests from their first position, each started where a remembered head ends.

    A prompt's digest over its first ``head`` tokens depends on those tokens alone, so requests
    that matched the same cached prefix share it: it is kept by the tokens themselves (the most
    recently used heads, ``max_tokens`` of them in all) and only the rest of each prompt is folded.
    """

    def __init__(self, max_tokens: int = 1 << 20) -> None:
        self._max_tokens = max_tokens
        self._held = 0
        self._heads: OrderedDict[tuple[int, ...], int] = OrderedDict()

    def fold(self, tokens: list[int], head: int) -> int:
        """``SimModel.fold(0, tokens, 0)``, by way of the digest of ``tokens[:head]``."""
        if head <= 0:
            return SimModel.fold(0, tokens, 0)
        key = tuple(tokens[:head])
        state = self._heads.get(key)
        if state is None:
            state = self._heads[key] = SimModel.fold(0, key, 0)
            self._held += head
            while self._held > self._max_tokens:  # each turn lets the oldest head go
                oldest, _ = self._heads.popitem(last=False)
                self._held -= len(oldest)
        else:
            self._heads.move_to_end(key)
        return SimModel.fold(state, tokens[head:], head)
