"""Many values below n at once, fixed by a key: the private tokens of a synthesized prompt.

The values are SHAKE-128's output for the key read as little-endian lanes of 4 bytes (of as many
bytes as n's bit width needs above 2^32), each lane cut to that width; those below n are kept, in
order. Where n is a power of two every lane is kept. So one hash call gives a prompt its tokens,
the same for the same key on any machine, and asking for more values gives the same values first
(a group's shared base made longer starts with the shorter one): SHAKE's longer output starts
with its shorter one.

The 4-byte lanes go through a 32-bit array: the cut is a byte translation of the lanes' bytes at
and above the width, and the values come out of one ``tolist``, in C loops with no Python step per
value. (Lanes of fewer bytes would hash less but cost more to spread into 32-bit lanes.)
"""

from __future__ import annotations

import hashlib
import sys
from array import array

__all__ = ["draws_below"]

_TYPECODE = next(code for code in "IL" if array(code).itemsize == 4)
_LANE_BYTES = 4
# Each pass keeps at least half its lanes on average: running out after this many doublings of the
# output would take a run of rejections with odds far below any hardware fault's.
_MAX_DOUBLINGS = 16


def _byte_cuts(bits: int) -> tuple[tuple[int, bytes], ...]:
    """The bytes of a 4-byte lane that a cut to ``bits`` bits changes: each one's place in the
    lane and its translation table."""
    masks = (((1 << bits) - 1) >> (8 * j) & 0xFF for j in range(_LANE_BYTES))
    return tuple((j, bytes(value & mask for value in range(256))) for j, mask in enumerate(masks) if mask != 0xFF)


_CUTS = [_byte_cuts(bits) for bits in range(8 * _LANE_BYTES + 1)]


def draws_below(key: bytes, n: int, count: int) -> list[int]:
    """``count`` values in 0..n-1 drawn uniformly, fixed by ``key``."""
    if n < 1:
        raise ValueError(f"empty range for draws_below: n = {n}")
    if count <= 0:
        return []
    bits = (n - 1).bit_length()  # below 2**bits; n itself when n is a power of two
    width = max(_LANE_BYTES, -(-bits // 8))
    # Below n: at least half the lanes (every lane for a power of two). Draw for that, with a
    # margin, and again twice as long in the rare case a run of rejections leaves too few.
    lanes = count if n == 1 << bits else 2 * count + 16
    for _ in range(_MAX_DOUBLINGS):
        raw = hashlib.shake_128(key).digest(lanes * width)
        if width > _LANE_BYTES:
            mask = (1 << bits) - 1
            out = [int.from_bytes(raw[i : i + width], "little") & mask for i in range(0, len(raw), width)]
        else:
            out = _lanes32(raw, bits)
        if n != 1 << bits:
            out = [value for value in out if value < n]
        if len(out) >= count:
            del out[count:]
            return out
        lanes *= 2
    raise RuntimeError(f"{_MAX_DOUBLINGS} doublings of SHAKE-128's output left fewer than {count} values below {n}")


def _lanes32(raw: bytes, bits: int) -> list[int]:
    """``raw`` cut into little-endian 32-bit lanes, each lane's value cut to ``bits`` bits."""
    lanes = bytearray(raw)
    for j, table in _CUTS[bits]:
        lanes[j::_LANE_BYTES] = lanes[j::_LANE_BYTES].translate(table)
    values = array(_TYPECODE)
    values.frombytes(lanes)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()
