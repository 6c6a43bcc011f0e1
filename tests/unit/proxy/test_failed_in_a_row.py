"""Which failures count toward a request's run of backends failed in a row."""

from __future__ import annotations

from proxy.request.upstream_failures import failed_in_a_row, failed_in_a_row_error


def test_failures_while_the_backend_served_the_request_count() -> None:
    assert failed_in_a_row(0, "io", None) == 1
    assert failed_in_a_row(1, "status", 500) == 2
    assert failed_in_a_row(1, "status", 502) == 2
    assert failed_in_a_row(1, "status", 504) == 2
    assert failed_in_a_row(1, "mid_stream", None) == 2
    assert failed_in_a_row(1, "stalled", None) == 2


def test_a_backend_down_or_full_before_it_saw_the_request_leaves_the_run_as_it_was() -> None:
    assert failed_in_a_row(1, "connect", None) == 1
    assert failed_in_a_row(1, "connect_timeout", None) == 1
    assert failed_in_a_row(1, "status", 503) == 1


def test_the_error_is_openai_shaped_and_says_why() -> None:
    e = failed_in_a_row_error(2, None)
    assert e.status == 502
    assert e.type == "upstream_error"
    assert "2 backends in a row" in e.message
    assert "b1" not in e.message
    assert failed_in_a_row_error(2, "b1: reset").message.endswith("; last error: b1: reset")
