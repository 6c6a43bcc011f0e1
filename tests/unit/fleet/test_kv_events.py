"""The KV-event wire format: our encoding decodes back, vLLM 0.32's map-tagged events and
earlier array-tagged ones both decode, and fields a newer engine adds are ignored."""

from __future__ import annotations

import msgspec
import pytest

from fleet.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BatchCodec,
    BlockRemoved,
    BlockStored,
    DecodeError,
    EventBatch,
    decode_batch,
    encode_batch,
    is_bind_endpoint,
    seq_bytes,
    seq_of,
)

BATCH = EventBatch(
    ts=1_700_000_000.25,
    events=[
        BlockStored([11, b"\x01\x02", -7], None, list(range(12)), 4, medium="GPU"),
        BlockRemoved([11], medium="GPU"),
        AllBlocksCleared(),
    ],
    data_parallel_rank=0,
)


@pytest.mark.parametrize("as_arrays", [False, True])
def test_round_trip_in_both_event_forms(as_arrays: bool) -> None:
    payload = encode_batch(BATCH, events_as_arrays=as_arrays)
    decoded = decode_batch(payload)
    assert decoded == BATCH
    assert [type(e) for e in decoded.events] == [BlockStored, BlockRemoved, AllBlocksCleared]


def test_map_form_is_vllm_032s_layout() -> None:
    raw = msgspec.msgpack.decode(encode_batch(BATCH))
    ts, events, rank = raw
    assert (ts, rank) == (BATCH.ts, 0)
    stored = events[0]
    assert stored["type"] == "BlockStored"
    # vLLM's own decoder needs these keys present, even when None.
    assert {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
            "medium", "lora_name"} <= stored.keys()  # fmt: skip
    assert events[2] == {"type": "AllBlocksCleared"}


def test_fields_a_newer_engine_adds_are_ignored() -> None:
    # A map event with keys we do not know, an array event with elements past ours, and a
    # batch with an element past data_parallel_rank.
    payload = msgspec.msgpack.encode(
        [
            2.5,
            [
                {"type": "BlockStored", "block_hashes": [b"h"], "parent_block_hash": None,
                 "token_ids": [1, 2], "block_size": 2, "lora_id": None, "medium": "GPU",
                 "lora_name": None, "kv_cache_spec_kind": "full", "session_id": "s"},
                ["BlockRemoved", [b"h"], "GPU", 0, "LOCAL", "owner", "more", 42],
            ],
            3,
            "something new",
        ]
    )  # fmt: skip
    batch = decode_batch(payload)
    assert batch.data_parallel_rank == 3
    assert batch.events == [
        BlockStored([b"h"], None, [1, 2], 2, medium="GPU"),
        BlockRemoved([b"h"], medium="GPU", group_idx=0),
    ]


def test_an_earlier_engines_shorter_array_event_decodes() -> None:
    payload = msgspec.msgpack.encode(
        [1.0, [["BlockStored", [5, 6], 4, [1, 2, 3, 4], 2, None, None]]]
    )
    (event,) = decode_batch(payload).events
    assert event == BlockStored([5, 6], 4, [1, 2, 3, 4], 2)
    assert event.lora_name is None and event.extra_keys is None


@pytest.mark.parametrize(
    "payload",
    [b"", b"\xc1", msgspec.msgpack.encode({"ts": 1}), msgspec.msgpack.encode([1.0, [["Nope"]]])],
)
def test_garbage_is_a_decode_error(payload: bytes) -> None:
    with pytest.raises(DecodeError):
        BatchCodec().decode(payload)


def test_sequence_frames() -> None:
    assert seq_of(seq_bytes(0)) == 0
    assert seq_of(seq_bytes(2**40 + 3)) == 2**40 + 3
    assert seq_of(END_SEQ) == -1
    with pytest.raises(DecodeError):
        seq_of(b"\x00")


@pytest.mark.parametrize(
    ("endpoint", "binds"),
    [
        ("tcp://*:5557", True),
        ("tcp://[::]:5557", True),
        ("ipc:///tmp/kv", True),
        ("inproc://kv", True),
        ("tcp://127.0.0.1:5557", False),
        ("tcp://engine-0.vllm:5557", False),
    ],
)
def test_bind_or_connect(endpoint: str, binds: bool) -> None:
    assert is_bind_endpoint(endpoint) is binds
