"""LeanHistogram exposes what prometheus_client's Histogram does for the same observations:
the same `_bucket`, `_count`, `_sum` and `_created` samples, text-format lines and all (the
creation times aside)."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleet.lean_histogram import LeanHistogram

BUCKETS = (0.0, 0.00001, 0.0005, 0.1, 1.0, 2.5)
# Values on, between, under and over the bounds.
VALUES = [0.0, 0.00001, 0.000011, 0.0004, 0.0005, 0.09, 0.1, 1.0, 2.4999, 2.5, 2.6, 100.0]


def samples(registry: CollectorRegistry) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")  # a creation time: compared by the lines below
    }


def exposition_lines(registry: CollectorRegistry) -> list[str]:
    """The text format, each `_created` value (a creation time) blanked."""
    text = generate_latest(registry).decode()
    return re.sub(r"^(\S+_created(\{[^}]*\})?) \S+$", r"\1", text, flags=re.M).splitlines()


def test_labelled_series_match_prometheus_client() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    ref = Histogram("h_seconds", "doc", ["endpoint"], buckets=BUCKETS, registry=theirs)
    lean = LeanHistogram("h_seconds", "doc", ["endpoint"], buckets=BUCKETS, registry=ours)
    for i, v in enumerate(VALUES):
        label = "a" if i % 3 else "b"
        ref.labels(label).observe(v)
        lean.labels(label).observe(v)
    assert samples(ours) == samples(theirs)
    lines = exposition_lines(ours)
    assert lines == exposition_lines(theirs)
    assert 'h_seconds_bucket{endpoint="a",le="1e-05"} 1.0' in lines  # bounds are inclusive
    assert 'h_seconds_created{endpoint="b"}' in lines


def test_an_unlabelled_histogram_shows_zeros_before_any_observation() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    ref = Histogram("e2e_seconds", "doc", buckets=BUCKETS, registry=theirs)
    lean = LeanHistogram("e2e_seconds", "doc", buckets=BUCKETS, registry=ours)
    assert samples(ours) == samples(theirs)
    for v in VALUES:
        ref.observe(v)
        lean.observe(v)
    assert samples(ours) == samples(theirs)
    assert ours.get_sample_value("e2e_seconds_count") == len(VALUES)
    assert ours.get_sample_value("e2e_seconds_bucket", {"le": "+Inf"}) == len(VALUES)


def test_misuse_is_refused() -> None:
    registry = CollectorRegistry()
    labelled = LeanHistogram("l", "doc", ["a"], buckets=BUCKETS, registry=registry)
    with pytest.raises(ValueError):
        labelled.observe(1.0)
    with pytest.raises(ValueError):
        labelled.labels("x", "y")
    with pytest.raises(ValueError):
        LeanHistogram("u", "doc", buckets=(1.0, 0.5), registry=registry)
    with pytest.raises(ValueError):  # the same name twice in one registry
        LeanHistogram("l", "doc", ["a"], buckets=BUCKETS, registry=registry)
