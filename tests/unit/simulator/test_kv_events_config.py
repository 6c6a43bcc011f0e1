"""`--kv-events-config` as vLLM reads it, each engine's endpoints, and the replay buffer's
numbering."""

from __future__ import annotations

import pytest

from simulator.kv_events_config import KvEventsConfig, parse_kv_events_config
from simulator.kv_publisher import ReplayBuffer


def test_vllms_keys_and_defaults() -> None:
    config = parse_kv_events_config(
        '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", '
        '"replay_endpoint": "tcp://*:5558", "topic": "kv", "buffer_steps": 3}'
    )
    assert config.publishes and config.topic == "kv" and config.buffer_steps == 3
    assert parse_kv_events_config('{"enable_kv_cache_events": true}').publishes
    assert not parse_kv_events_config("{}").publishes
    assert not KvEventsConfig(enable_kv_cache_events=True, publisher="null").publishes


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "not JSON"),
        ('{"enable_kv_cache_events": true, "endpoints": "x"}', "endpoints"),
        ('{"publisher": "kafka"}', "publisher"),
        ('{"buffer_steps": 0}', "buffer_steps"),
    ],
)
def test_bad_configs_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_kv_events_config(text)


def test_each_engine_takes_the_ports_plus_its_index_and_binds_wildcards_on_its_host() -> None:
    config = KvEventsConfig(
        enable_kv_cache_events=True, endpoint="tcp://*:5557", replay_endpoint="tcp://*:5558"
    )
    first, third = config.for_engine(0, "127.0.0.1"), config.for_engine(2, "127.0.0.1")
    assert (first.publish, first.publish_binds, first.replay) == (
        "tcp://127.0.0.1:5557",
        True,
        "tcp://127.0.0.1:5558",
    )
    assert (third.publish, third.replay) == ("tcp://127.0.0.1:5559", "tcp://127.0.0.1:5560")
    assert config.for_engine(1, "::1").publish == "tcp://[::1]:5558"
    # A host named without a wildcard is connected to, as vLLM does; port 0 stays 0.
    connect = KvEventsConfig(enable_kv_cache_events=True, endpoint="tcp://collector:7000")
    assert connect.for_engine(1, "127.0.0.1").publish == "tcp://collector:7001"
    assert not connect.for_engine(1, "127.0.0.1").publish_binds
    ephemeral = KvEventsConfig(enable_kv_cache_events=True, endpoint="tcp://*:0")
    assert ephemeral.for_engine(3, "127.0.0.1").publish == "tcp://127.0.0.1:0"


def test_replay_buffer_numbers_from_zero_keeps_the_last_and_restarts() -> None:
    buffer = ReplayBuffer(capacity=2)
    assert [buffer.record(p) for p in (b"a", b"b", b"c")] == [0, 1, 2]
    assert buffer.since(0) == [(1, b"b"), (2, b"c")]
    assert buffer.since(2) == [(2, b"c")]
    assert buffer.since(3) == []
    buffer.restart()
    assert buffer.since(0) == [] and buffer.record(b"d") == 0
