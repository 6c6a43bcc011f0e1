"""How the bench reads fleet-proxy's `x-fleet-decision` routing receipt into a record."""

from __future__ import annotations

from bench.client import decision_of
from bench.records import RequestRecord


def test_a_receipt_is_kept_as_its_object_and_its_absence_as_none() -> None:
    header = '{"backend":"127.0.0.1:8001","reason":"least_prefill: cached","scores":{}}'
    assert decision_of(header) == {
        "backend": "127.0.0.1:8001",
        "reason": "least_prefill: cached",
        "scores": {},
    }
    assert decision_of(None) is None


def test_a_receipt_that_is_not_a_json_object_keeps_its_text() -> None:
    assert decision_of("not json") == {"unparsed": "not json"}
    assert decision_of("[1, 2]") == {"unparsed": "[1, 2]"}


def test_a_record_written_before_receipts_reads_back_without_one() -> None:
    old = {
        "setting": "A",
        "repeat": 0,
        "session_id": "s",
        "turn": 0,
        "call": 0,
        "scheduled_s": 0.0,
        "sent_s": 0.0,
        "est_prompt_tokens": 10,
        "backend": "b",
    }
    record = RequestRecord.from_json(old)
    assert record.decision is None
    assert record.to_json()["decision"] is None
