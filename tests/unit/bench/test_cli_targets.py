"""`fleet-proxy bench --target`: a URL, or NAME=URL where the name may itself hold '='."""

from __future__ import annotations

import pytest

from bench.cli import parse_targets


def test_targets_are_named_or_lettered() -> None:
    assert parse_targets(["http://127.0.0.1:8000"]) == [("run", "http://127.0.0.1:8000")]
    assert parse_targets(["http://a:1", "http://b:2/v1?x=1"]) == [
        ("A", "http://a:1"),
        ("B", "http://b:2/v1?x=1"),
    ]
    assert parse_targets(["rr=http://a:1", "lm=https://b:2"]) == [
        ("rr", "http://a:1"),
        ("lm", "https://b:2"),
    ]


def test_a_name_may_hold_an_equals_sign() -> None:
    spec = "fleet-proxy:unified/overload_factor=1.5=http://127.0.0.1:9000"
    assert parse_targets([spec]) == [
        ("fleet-proxy:unified/overload_factor=1.5", "http://127.0.0.1:9000")
    ]


def test_names_must_be_unique() -> None:
    with pytest.raises(ValueError, match="unique"):
        parse_targets(["a=http://x:1", "a=http://y:2"])
