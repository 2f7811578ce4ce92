"""Many ``Random.randrange(n)`` draws at once: the values that as many calls in a row give.

``randrange(n)`` takes ``getrandbits(k)`` (k: n's bit length; for k <= 32 that is the top k bits
of the generator's next 32-bit word) until a value falls below n. ``getrandbits(32 * m)`` hands out
the next m words in one call, the first in the lowest bits. Shifted right by 32 - k and masked to
k bits in every 32-bit lane, that number holds each word's top k bits in the word's own lane; cut
into lanes, those below n are the same values: one comprehension step per word instead of three
Python calls per value (``randrange``, ``_randbelow``, ``getrandbits``). Where n is a power of two
(n = 2**(k-1)), a value is below n when its top bit is clear: the lanes' bytes that hold that bit
pick the values in C loops, with no Python step per word.

A bulk draw reads past the last word it keeps, so the generator must serve nothing afterwards.
"""

from __future__ import annotations

import random
import sys
from array import array
from itertools import compress

__all__ = ["randrange_many"]

_WORD_BITS = 32
_TYPECODE = next(code for code in "IL" if array(code).itemsize == 4)
_ROUNDS = 8  # each round draws enough for what is left, with a margin: one round nearly always does
# Per bit of a byte: 1 for each byte value with that bit clear, 0 for the others (bytes.translate).
_BIT_CLEAR = [bytes(0 if value >> bit & 1 else 1 for value in range(256)) for bit in range(8)]
_lane_masks: dict[int, int] = {}  # k -> the low k bits of every 32-bit lane, as many lanes as drawn yet


def randrange_many(rng: random.Random, n: int, count: int) -> list[int]:
    """``[rng.randrange(n) for _ in range(count)]``, drawn in bulk; ``rng`` is spent afterwards."""
    if n < 1:
        raise ValueError(f"empty range for randrange_many: n = {n}")
    k = n.bit_length()
    if type(rng) is not random.Random or k > _WORD_BITS:  # another generator's bits, or wider than a word
        return [rng.randrange(n) for _ in range(count)]
    if count <= 0:
        return []
    out: list[int] = []
    for _ in range(_ROUNDS):
        need = count - len(out)
        # n / 2**k of the words are kept (at least half): draw for that, with a margin.
        words = need * (1 << k) // n + need // 8 + 16
        # The mask drops what the shift brings into a lane from the next word.
        lanes = ((rng.getrandbits(words * _WORD_BITS) >> (_WORD_BITS - k)) & _lane_mask(k, words)).to_bytes(
            words * 4, "little"
        )
        out += _below(lanes, n, k)
        if len(out) >= count:
            del out[count:]
            return out
    # Past the rounds (a run of rejections no real draw has), the calls themselves go on from
    # the next word, where the rounds stopped.
    out.extend(rng.randrange(n) for _ in range(count - len(out)))
    return out


def _lane_mask(k: int, words: int) -> int:
    """The low ``k`` bits of each of at least ``words`` 32-bit lanes (made again only for more lanes)."""
    mask = _lane_masks.get(k, 0)
    if mask.bit_length() < _WORD_BITS * (words - 1) + k:
        mask = _lane_masks[k] = int.from_bytes(((1 << k) - 1).to_bytes(4, "little") * words, "little")
    return mask


def _below(lanes: bytes, n: int, k: int) -> list[int]:
    """The little-endian 32-bit lanes' values below ``n`` (each lane holds at most ``k`` bits), in order."""
    values = array(_TYPECODE)
    values.frombytes(lanes)
    if sys.byteorder == "big":
        values.byteswap()
    if n == 1 << (k - 1):  # below n: bit k - 1 clear, in the lane's byte (k - 1) // 8
        return list(compress(values, lanes[(k - 1) // 8 :: 4].translate(_BIT_CLEAR[(k - 1) % 8])))
    return [value for value in values if value < n]
