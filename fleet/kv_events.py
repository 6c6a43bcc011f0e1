"""The wire format of vLLM's KV-cache events, with our own types.

An engine started with `--kv-events-config` publishes on a ZMQ PUB socket one multipart
message per engine step that changed its prefix cache: (topic, 8-byte big-endian sequence
number, msgpack payload). The payload is an event batch, a msgpack array
`[ts, events, data_parallel_rank]`; each event is tagged with its kind under `type`:
- `BlockStored`: full blocks newly cached, their engine hashes in order, the hash of the block
  before the first one (None at the start of a prompt), their token ids and the block size;
- `BlockRemoved`: blocks evicted;
- `AllBlocksCleared`: the whole prefix cache was reset.

vLLM 0.32 writes events as maps (`{"type": "BlockStored", ...}`); earlier versions wrote them
as arrays (`["BlockStored", hashes, parent, ...]`). Both decode here, and fields a newer
version adds (a map key we do not know, an array element past ours) are ignored. A block hash
is an int or bytes, depending on the engine's hash function.

A ROUTER socket beside the PUB one (the replay endpoint) answers a request for the batches
from a sequence number on: the subscriber sends (empty frame, 8-byte start), and gets
(empty, topic, seq, payload) per batch still buffered, then (empty, empty, END_SEQ, empty).
"""

from __future__ import annotations

from typing import Any

import msgspec

EngineHash = int | bytes

# The sequence number that ends a replay: -1 as 8 signed big-endian bytes.
END_SEQ = (-1).to_bytes(8, "big", signed=True)
MEDIUM_GPU = "GPU"


class BlockStored(msgspec.Struct, tag="BlockStored", frozen=True):
    block_hashes: list[EngineHash]
    parent_block_hash: EngineHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    # Per block, what else went into its hash (LoRA name, multimodal items, cache salt).
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class BlockRemoved(msgspec.Struct, tag="BlockRemoved", frozen=True):
    block_hashes: list[EngineHash]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", frozen=True):
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, array_like=True, frozen=True):
    ts: float  # wall-clock seconds when the engine step ended
    events: list[KvEvent]
    data_parallel_rank: int | None = None


# The same events as arrays, the tag first: what vLLM wrote before 0.32.
class _BlockStoredArray(BlockStored, array_like=True, frozen=True):
    pass


class _BlockRemovedArray(BlockRemoved, array_like=True, frozen=True):
    pass


class _AllBlocksClearedArray(AllBlocksCleared, array_like=True, frozen=True):
    pass


class _RawBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[msgspec.Raw]  # decoded one by one: maps and arrays need different decoders
    data_parallel_rank: int | None = None


class DecodeError(ValueError):
    """A payload that is not an event batch."""


class BatchCodec:
    """Decoders and an encoder built once; reused for every batch (msgspec's fast path)."""

    def __init__(self) -> None:
        self._batch = msgspec.msgpack.Decoder(_RawBatch)
        self._map_event = msgspec.msgpack.Decoder(BlockStored | BlockRemoved | AllBlocksCleared)
        self._array_event = msgspec.msgpack.Decoder(
            _BlockStoredArray | _BlockRemovedArray | _AllBlocksClearedArray
        )
        self._encoder = msgspec.msgpack.Encoder()

    def decode(self, payload: bytes) -> EventBatch:
        try:
            raw = self._batch.decode(payload)
            events: list[KvEvent] = [self._event(e) for e in raw.events]
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise DecodeError(f"not a KV event batch: {e}") from None
        return EventBatch(raw.ts, events, raw.data_parallel_rank)

    def _event(self, raw: msgspec.Raw) -> KvEvent:
        head = bytes(memoryview(raw)[:1])
        # msgpack arrays: fixarray 0x90-0x9f, array16 0xdc, array32 0xdd.
        if head and (0x90 <= head[0] <= 0x9F or head[0] in (0xDC, 0xDD)):
            return _from_array(self._array_event.decode(raw))
        mapped: KvEvent = self._map_event.decode(raw)
        return mapped

    def encode(self, batch: EventBatch, *, events_as_arrays: bool = False) -> bytes:
        """The payload vLLM 0.32 writes (events as maps), or with `events_as_arrays` what
        earlier versions wrote."""
        if events_as_arrays:
            batch = EventBatch(
                batch.ts, [_as_array(e) for e in batch.events], batch.data_parallel_rank
            )
        return self._encoder.encode(batch)


# Each event type and its array form, both ways.
_TO_ARRAY: dict[type, type] = {
    BlockStored: _BlockStoredArray,
    BlockRemoved: _BlockRemovedArray,
    AllBlocksCleared: _AllBlocksClearedArray,
}
_FROM_ARRAY: dict[type, type] = {v: k for k, v in _TO_ARRAY.items()}


def _as_array(event: KvEvent) -> KvEvent:
    form: type[KvEvent] = _TO_ARRAY[type(event)]
    return form(**msgspec.structs.asdict(event))


def _from_array(event: KvEvent) -> KvEvent:
    """The public type of an event decoded from its array form."""
    form: type[KvEvent] = _FROM_ARRAY[type(event)]
    return form(**msgspec.structs.asdict(event))


def decode_batch(payload: bytes) -> EventBatch:
    """One payload; a codec kept by the caller decodes many for less."""
    return BatchCodec().decode(payload)


def encode_batch(batch: EventBatch, *, events_as_arrays: bool = False) -> bytes:
    return BatchCodec().encode(batch, events_as_arrays=events_as_arrays)


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def seq_of(frame: bytes) -> int:
    """A sequence frame as vLLM writes it; END_SEQ reads as -1."""
    if len(frame) != 8:
        raise DecodeError(f"a sequence number is 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


def is_bind_endpoint(endpoint: str) -> bool:
    """The rule vLLM's publisher follows: a wildcard host (`tcp://*:5557`, `tcp://[::]:...`)
    or an ipc/inproc address is bound; any other address is connected to."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))
