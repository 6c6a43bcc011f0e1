"""How a moved request's KV reaches its target: the three kinds and the cost model that picks
one per move. Pure: no I/O, no clock.

- recompute: the target prefills prompt + generated tokens (its prefix cache may hold some);
- handover: after the cut the source, whose prefix cache still holds the aborted request's
  blocks, answers a 1-token `do_remote_decode` request over those tokens; the continuation on
  the target carries the returned `kv_transfer_params` and pulls the KV over NIXL;
- precopy: before the cut, while the source keeps decoding, the same source leg is followed by a
  1-token pull on the target that leaves the KV in the target's prefix cache; the ordinary
  continuation then recomputes only the tokens generated while that ran.

A backend transfers KV when its spec has the label `kv_connector: nixl` (vLLM started with a
NixlConnector `kv_both` transfer config); handover and pre-copy need it on both ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

MoveKind = Literal["recompute", "handover", "precopy"]
RequestedKind = Literal["auto", "recompute", "handover", "precopy"]
KINDS: tuple[MoveKind, ...] = ("recompute", "handover", "precopy")

KV_CONNECTOR_LABEL = "kv_connector"
NIXL = "nixl"


def transfers_kv(labels: Mapping[str, str]) -> bool:
    """Whether a backend with these spec labels can send and receive KV over NIXL."""
    return labels.get(KV_CONNECTOR_LABEL) == NIXL


@dataclass(frozen=True, slots=True)
class MoveCosts:
    """Per-token and fixed costs the choice weighs (seconds; settings `move_*`)."""

    recompute_s_per_token: float = 1e-4  # target prefill, ~10k tokens/s
    transfer_s_per_token: float = 1e-5  # NIXL pull, ~128 KiB/token at ~12 GB/s
    kv_leg_s: float = 0.02  # one extra 1-token request round trip
    # Pre-copy costs a staging round on both engines and delays the cut by it: only worth it
    # where the other kinds' downtime is largest.
    precopy_min_tokens: int = 2048


def predicted_downtime(kind: MoveKind, tokens: int, costs: MoveCosts) -> float:
    """The client's predicted wait for `tokens` (prompt + generated) moved by `kind`, beyond
    what every move pays (opening the continuation). Pre-copy's is the recompute of the tokens
    generated during staging, which the model takes as none."""
    if kind == "recompute":
        return tokens * costs.recompute_s_per_token
    if kind == "handover":
        return costs.kv_leg_s + tokens * costs.transfer_s_per_token
    return 0.0


def choose_kind(
    tokens: int,
    both_transfer: bool,
    costs: MoveCosts,
    requested: RequestedKind = "auto",
) -> MoveKind:
    """The kind for a move of `tokens` (prompt + generated). A forced kind that needs KV
    transfer falls back to recompute when an end cannot transfer."""
    if not both_transfer:
        return "recompute"
    if requested != "auto":
        return requested
    if tokens >= costs.precopy_min_tokens:
        return "precopy"
    handover = predicted_downtime("handover", tokens, costs)
    if handover < predicted_downtime("recompute", tokens, costs):
        return "handover"
    return "recompute"
