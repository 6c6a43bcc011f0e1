"""A failed health check's detail names the system's reason under httpx's own words."""

from __future__ import annotations

import errno

import httpx

from fleet.health import failure_detail


def test_the_oserror_under_a_connect_error_names_the_reason() -> None:
    try:
        try:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed")
        except OSError as refused:
            raise httpx.ConnectError("All connection attempts failed") from refused
    except httpx.ConnectError as e:
        said = failure_detail(e)
    assert said == "ConnectError: All connection attempts failed (connection refused)"


def test_an_error_with_no_system_cause_is_said_as_it_is() -> None:
    assert failure_detail(httpx.ReadTimeout("slow")) == "ReadTimeout: slow"
