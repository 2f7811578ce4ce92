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
import re
import struct
from collections.abc import Iterable, Sequence
from functools import lru_cache

from radixtop.sim.pool import TokenToKVPoolAllocator

__all__ = ["VOCAB_SIZE", "SimModel", "SimTokenizer"]

VOCAB_SIZE = 1 << 24
_LO_BITS = 11
_LO_MASK = (1 << _LO_BITS) - 1
_HI_RANGE = VOCAB_SIZE >> _LO_BITS  # 8192
_MOD = (1 << 61) - 1
_BASE = 0x5BD1E995_3C6EF372 % _MOD
_WORD = re.compile(r"u(\d{1,4})_(\d{1,4})")


def _hash64(*parts: int) -> int:
    data = struct.pack(f"<{len(parts)}q", *parts)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@lru_cache(maxsize=4096)
def _stem(seed: int, stem_token: int) -> int:
    return _hash64(seed, 1, stem_token) % _HI_RANGE


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

    def next_token(self, state: int, position: int, stem_token: int, noise: int = 0) -> int:
        """The token at ``position``; ``stem_token`` (the prompt's last token) picks the ``u<hi>`` stem."""
        hi = _stem(self.seed, stem_token)
        lo = _hash64(self.seed, 2, state, position, noise) & _LO_MASK
        return hi << _LO_BITS | lo
