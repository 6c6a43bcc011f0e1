"""Loading a thread from the store: `previous_response_id`, then its previous one, back to the
thread's first response, read in one store call and then checked whole."""

from __future__ import annotations

from proxy.errors import ProxyError
from proxy.request.responses.store import ResponseStore, StoredResponse

# Turns one thread may chain; a bound on the records one request reads.
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
    return checked_thread(await store.chain(response_id, owner, MAX_TURNS + 1), response_id)


def checked_thread(found: list[StoredResponse], response_id: str) -> list[StoredResponse]:
    """`found` (a store's `chain`, oldest first) when it is a whole thread of finished
    responses; otherwise the error a walk from the newest back would meet first."""
    if not found:
        raise not_found(response_id)
    for turns, record in enumerate(reversed(found), 1):
        if record.status in UNFINISHED:
            raise ProxyError(
                400,
                f"Response with id '{record.id}' is still {record.status}: a thread continues "
                "from a finished response",
                param="previous_response_id",
            )
        if turns > MAX_TURNS:
            raise ProxyError(
                400, f"the thread is over {MAX_TURNS} responses long", param="previous_response_id"
            )
    missing = found[0].previous_id
    if missing is not None:  # the walk stopped at a link the owner cannot read
        raise not_found(missing)
    return found
