"""Selectors: given a policy's candidate sources and targets, which (source, target) pairs.

All ties are broken by instance id, ascending, so a cycle's plan is deterministic.

- `metric_balance_pairs`: sources by load descending, targets by load ascending, paired
  index by index (the i-th most loaded with the i-th least loaded) while
  source load - target load > min_gap (strictly: with min_gap 0.0 any positive difference
  pairs, equal loads never do). Both lists are sorted, so the difference only shrinks down
  the lists and pairing stops at the first pair that fails.
- `round_robin`: every source's requests are dealt one at a time over the targets (by id);
  the deal goes on from source to source instead of restarting, so a target is not favoured
  just for sorting first. One migration per (source, target) that got requests.
- `mitigation_pair`: the worst source (highest TPOT) that has something to move, and the
  target with the lowest TPOT.
- `consolidation_pair`: the least-loaded source (lowest TPOT) that has something to move and
  a target able to take it; among those targets the most loaded one (highest TPOT), so the
  fleet packs onto as few instances as it can.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Scored = tuple[str, float]  # (instance id, its load or TPOT)


def metric_balance_pairs(
    sources: Sequence[Scored], targets: Sequence[Scored], min_gap: float
) -> list[tuple[str, str]]:
    by_load_desc = sorted(sources, key=lambda s: (-s[1], s[0]))
    by_load_asc = sorted(targets, key=lambda t: (t[1], t[0]))
    pairs: list[tuple[str, str]] = []
    for (source, source_load), (target, target_load) in zip(
        by_load_desc, by_load_asc, strict=False
    ):
        if not source_load - target_load > min_gap:
            break
        pairs.append((source, target))
    return pairs


def round_robin(
    sources: Sequence[tuple[str, Sequence[str]]], targets: Sequence[str]
) -> list[tuple[str, str, tuple[str, ...]]]:
    """(source, target, request keys) for `sources` given as (id, keys in dealing order)."""
    if not targets:
        return []
    ordered_targets = sorted(targets)
    dealt: list[tuple[str, str, tuple[str, ...]]] = []
    turn = 0
    for source, keys in sorted(sources, key=lambda s: s[0]):
        hands: dict[str, list[str]] = {t: [] for t in ordered_targets}
        for key in keys:
            hands[ordered_targets[turn % len(ordered_targets)]].append(key)
            turn += 1
        dealt.extend((source, t, tuple(hands[t])) for t in ordered_targets if hands[t])
    return dealt


def mitigation_pair(
    sources: Sequence[Scored],
    targets: Sequence[Scored],
    has_requests: Callable[[str], bool],
) -> tuple[str, str] | None:
    for source, _ in sorted(sources, key=lambda s: (-s[1], s[0])):
        if not has_requests(source):
            continue
        for target, _ in sorted(targets, key=lambda t: (t[1], t[0])):
            if target != source:
                return source, target
        return None
    return None


def consolidation_pair(
    sources: Sequence[Scored],
    targets: Sequence[Scored],
    has_requests: Callable[[str], bool],
    fits: Callable[[str, str], bool],
) -> tuple[str, str] | None:
    """`fits(source, target)`: the target stays within its limit after taking the source's."""
    for source, _ in sorted(sources, key=lambda s: (s[1], s[0])):
        if not has_requests(source):
            continue
        for target, _ in sorted(targets, key=lambda t: (-t[1], t[0])):
            if target != source and fits(source, target):
                return source, target
    return None
