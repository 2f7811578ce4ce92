"""SGLang's kv-events wire format (`--kv-events-config`), as sglang.srt.disaggregation.kv_events
sends it: the mirror (probes/kv_events.py) reads it and the simulator (sim/kv_events.py) writes it.

A message on the PUB socket is three frames: topic, the sequence number (8 bytes, big-endian) and
a msgpack `EventBatch`, a positional array [ts, events, attn_dp_rank] whose events are maps tagged
by `type`. The replay ROUTER answers a request (an empty frame and the first wanted sequence
number) with the same three frames per kept batch, then an empty topic, END_SEQ and an empty
payload. Needs msgspec (the `kv-events` extra).
"""

from __future__ import annotations

from typing import Any

import msgspec

SEQ_BYTES = 8
END_SEQ = (-1).to_bytes(SEQ_BYTES, "big", signed=True)
MAX_BATCH_BYTES = 16 * 1024 * 1024  # a batch is one scheduler step's events: far less than this


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[Any]  # ints; pairs for bigram (EAGLE) keys
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[KvEvent]
    attn_dp_rank: int | None = None


_decoder = msgspec.msgpack.Decoder(EventBatch)
_encoder = msgspec.msgpack.Encoder()


def decode_batch(payload: bytes) -> EventBatch:
    """One batch; ValueError with one line when it is not SGLang's format."""
    if len(payload) > MAX_BATCH_BYTES:
        raise ValueError(f"a batch of {len(payload):,} bytes is more than {MAX_BATCH_BYTES:,}")
    try:
        return _decoder.decode(payload)
    except msgspec.MsgspecError as exc:
        raise ValueError(f"not an SGLang kv-event batch: {str(exc)[:160]}") from None


def encode_batch(batch: EventBatch) -> bytes:
    return _encoder.encode(batch)


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(SEQ_BYTES, "big", signed=True)


def seq_of(frame: bytes) -> int | None:
    """The sequence number of a frame; None when the frame is not 8 bytes."""
    if len(frame) != SEQ_BYTES:
        return None
    return int.from_bytes(frame, "big", signed=True)
