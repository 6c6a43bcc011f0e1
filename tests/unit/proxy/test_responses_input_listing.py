"""A stored response's input items as OpenAI lists them: pages, order, ids made stable."""

from __future__ import annotations

import pytest

from proxy.errors import ProxyError
from proxy.request.responses.input_listing import Page, listed, page_of

ITEMS = [
    {"role": "user", "content": "a"},
    {"type": "message", "role": "assistant", "content": "b", "id": "msg_own"},
    {"type": "function_call_output", "call_id": "c1", "output": "42"},
]


def test_the_query_names_the_page() -> None:
    assert page_of(b"") == Page(None, 20, "desc")
    assert page_of(b"after=x&limit=5&order=asc&include=y") == Page("x", 5, "asc")
    for bad in (b"limit=0", b"limit=101", b"limit=two", b"order=up"):
        with pytest.raises(ProxyError) as refused:
            page_of(bad)
        assert refused.value.status == 400


def test_items_get_ids_and_text_parts_the_same_on_every_page() -> None:
    whole = listed("resp_abc", ITEMS, Page(order="asc"))
    first, second, third = whole["data"]
    assert first == {
        "type": "message", "role": "user", "id": "msg_abc_0", "status": "completed",
        "content": [{"type": "input_text", "text": "a"}],
    }  # fmt: skip
    assert second["id"] == "msg_own" and second["content"][0]["type"] == "output_text"
    assert third["id"] == "item_abc_2" and third["output"] == "42"
    assert (whole["first_id"], whole["last_id"], whole["has_more"]) == (
        "msg_abc_0", "item_abc_2", False,
    )  # fmt: skip
    newest = listed("resp_abc", ITEMS, Page(limit=1))
    assert [i["id"] for i in newest["data"]] == ["item_abc_2"] and newest["has_more"]
    after = listed("resp_abc", ITEMS, Page(after="item_abc_2", limit=1))
    assert [i["id"] for i in after["data"]] == ["msg_own"]
    with pytest.raises(ProxyError):
        listed("resp_abc", ITEMS, Page(after="nope"))
    empty = listed("resp_abc", ITEMS, Page(after="msg_abc_0"))
    assert empty["data"] == [] and empty["first_id"] is None and not empty["has_more"]
