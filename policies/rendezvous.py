"""Rendezvous (highest-random-weight) hashing: a key's home backend, with no table.

A key's home among some candidates is the one whose id gives the highest weight(key, id).
Every process computes the same home from the key and the candidates' ids alone, so the
workers of one proxy and the replicas behind one Service agree with nothing shared. When a
backend leaves, only the keys homed on it move, each to its next-ranked backend (spread evenly
over the rest, where a hash ring piles them on one neighbour); when one joins, only the keys
that now rank it first move: about 1/(n+1) of them, all to it.

The weight is xxh3-64 of the backend id seeded with xxh3-64 of the key: stable across
processes, machines and versions of Python (never the salted built-in `hash()`), one short
hash per candidate and no concatenated string. Ids, not URLs: a pod keeps its name when its IP
changes, and every replica discovers the same names.
"""

from __future__ import annotations

from collections.abc import Sequence

from xxhash import xxh3_64_intdigest

from fleet.types import Backend


def _utf8(text: str) -> bytes:
    # surrogatepass: a session id from a JSON body may hold a lone surrogate.
    return text.encode("utf-8", "surrogatepass")


def key_seed(key: str) -> int:
    return xxh3_64_intdigest(_utf8(key))


def weight(seed: int, backend_id: str) -> int:
    """The backend's 64-bit weight for the key whose `key_seed` is `seed`."""
    return xxh3_64_intdigest(_utf8(backend_id), seed)


def home(key: str, candidates: Sequence[Backend]) -> Backend:
    """The candidate with the highest weight for `key` (equal weights: the smaller id), whatever
    the order of `candidates`; raises ValueError when there is none."""
    if not candidates:
        raise ValueError("no candidates to home a key on")
    seed = key_seed(key)
    best, best_id, best_w = candidates[0], "", -1  # every weight beats -1
    for b in candidates:
        bid = b.spec.id
        # `weight`, written out: a call per candidate was most of a pick's cost.
        w = xxh3_64_intdigest(bid.encode("utf-8", "surrogatepass"), seed)
        if w > best_w or (w == best_w and bid < best_id):
            best, best_id, best_w = b, bid, w
    return best


def ranked(key: str, candidates: Sequence[Backend]) -> list[Backend]:
    """Every candidate, home first: removing the home makes the second one the home."""
    seed = key_seed(key)
    return sorted(candidates, key=lambda b: (-weight(seed, b.spec.id), b.spec.id))
