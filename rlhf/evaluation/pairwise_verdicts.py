"""The win rate from a pairwise judge's verdicts, each pair judged twice with the answers' positions
swapped (docs/algorithms.md §33); per pair, `first` has the policy's answer shown as A, `swapped` as B:

    win      both verdicts prefer the policy's answer;  loss  both prefer the baseline's
    tie      anything else: a tie in either order, or the two orders contradicting each other
             (`inconsistent`: each prefers the answer in the same position)
    dropped  either verdict unparsable (None): the pair is left out of n

win rate = (wins + ties / 2) / n, with the Wilson interval of that count (as `compare_scores`).
"""

from __future__ import annotations

from collections.abc import Sequence

from rlhf.evaluation.judging import wilson_interval

# the policy's outcome of one verdict: its answer was A in the first order, B in the swapped one
_FIRST = {"A": "policy", "B": "baseline", "tie": "tie"}
_SWAPPED = {"A": "baseline", "B": "policy", "tie": "tie"}


def pair_outcome(first: str | None, swapped: str | None) -> str | None:
    """ "policy", "baseline" or "tie" of one pair; None when either verdict is unparsable."""
    if first is None or swapped is None:
        return None
    a, b = _FIRST[first], _SWAPPED[swapped]
    return a if a == b and a != "tie" else "tie"


def swapped_win_rate(first: Sequence[str | None], swapped: Sequence[str | None]) -> dict:
    """The policy's win rate (ties half) over the pairs with both verdicts, its Wilson 95% interval,
    the counts, and the judge's position preference (`prefers_first`: the share of its decisive
    verdicts, both orders, that chose response A; 0.5 for a judge without position bias)."""
    if len(first) != len(swapped):
        raise ValueError(f"{len(first)} verdicts in the first order, {len(swapped)} swapped")
    outcomes = [pair_outcome(a, b) for a, b in zip(first, swapped)]
    counted = [o for o in outcomes if o is not None]
    n = len(counted)
    wins, losses = counted.count("policy"), counted.count("baseline")
    ties = n - wins - losses
    inconsistent = sum(
        1 for a, b in zip(first, swapped) if a is not None and b is not None and a == b and a != "tie"
    )
    decisive = [v for v in (*first, *swapped) if v in ("A", "B")]
    return {
        "n": n,
        "wins": wins,
        "ties": ties,
        "losses": losses,
        "inconsistent": inconsistent,
        "dropped": len(outcomes) - n,
        "win_rate": (wins + 0.5 * ties) / n if n else None,
        "win_rate_ci95": wilson_interval(wins + 0.5 * ties, n),
        "prefers_first": decisive.count("A") / len(decisive) if decisive else None,
        "outcomes": outcomes,
    }
