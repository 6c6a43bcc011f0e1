"""Loading a thread from the store: `previous_response_id`, then its previous one, back to the
thread's first response."""

from __future__ import annotations

from proxy.errors import ProxyError
from proxy.request.responses.store import ResponseStore, StoredResponse

# Turns one thread may chain; a bound on the reads one request makes.
MAX_TURNS = 10_000
# A response still running has no output to continue from yet.
UNFINISHED = frozenset({"queued", "in_progress"})


def not_found(response_id: str) -> ProxyError:
    """OpenAI's answer for an id it does not know (nor for another key's id: no leak)."""
    return ProxyError(
        404,
        f"Response with id '{response_id}' not found.",
        type="invalid_request_error",
        param="response_id",
    )


async def load_chain(store: ResponseStore, response_id: str, owner: str) -> list[StoredResponse]:
    """The thread ending with `response_id`, oldest first. Raises ProxyError: 404 when a
    response of it is unknown (or expired, or not `owner`'s), 400 when it is unfinished."""
    chain: list[StoredResponse] = []
    rid: str | None = response_id
    while rid is not None:
        record = await store.get(rid, owner)
        if record is None:
            raise not_found(rid)
        if record.status in UNFINISHED:
            raise ProxyError(
                400,
                f"Response with id '{rid}' is still {record.status}: a thread continues from "
                "a finished response",
                param="previous_response_id",
            )
        chain.append(record)
        if len(chain) > MAX_TURNS:
            raise ProxyError(
                400, f"the thread is over {MAX_TURNS} responses long", param="previous_response_id"
            )
        rid = record.previous_id
    chain.reverse()
    return chain
