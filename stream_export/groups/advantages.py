"""Group-relative advantages: pure functions of one group's rewards, no I/O.

Three estimators, each scoring every rollout of a group against the others:

``grpo``     ``(r_i - mean) / (std + eps)`` (DeepSeekMath's GRPO; TRL's and verl's
             default). ``std`` divides by ``n - ddof``; ``ddof = 1`` (the default)
             is the sample standard deviation that ``torch.std`` computes.
``dr_grpo``  ``r_i - mean``: Dr. GRPO drops the division by the standard deviation,
             which otherwise weights groups with nearly equal rewards up.
``rloo``     ``r_i - mean(r_j for j != i)``: the leave-one-out baseline (RLOO),
             which is ``n / (n - 1) * (r_i - mean)``.

A group of one, or one whose rewards are all equal, carries no learning signal:
every advantage is 0.0 and ``zero_variance`` is true (the reported ``std`` is 0.0;
with one rollout and ``ddof = 1`` it is undefined, and 0.0 is what it means here).
GRPO and RLOO advantages sum to zero; GRPO is unchanged by adding a constant to
every reward and, up to ``eps``, by multiplying them by a positive one.

Any finite rewards give finite statistics, to within a few roundings: ``mean``
relative to itself, ``std`` relative to itself and the advantages relative to the
largest of them (the rewards are scaled by a power of two, which is exact, and
centred on one of them before anything is summed, so nothing overflows and nearly
equal rewards lose no digits). Only rewards near the float limit (about
``1.8e308``) have a sample ``std`` or ``dr_grpo`` / ``rloo`` advantages beyond it
(up to twice, resp. four times, the largest reward): those are clamped to
``±FLOAT64_MAX``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

from stream_export.contract.groups import Estimator
from stream_export.contract.widths import FLOAT64_MAX

ESTIMATORS: Final[tuple[Estimator, ...]] = ("grpo", "dr_grpo", "rloo")
DEFAULT_EPS: Final = 1e-6
DEFAULT_DDOF: Final = 1


@dataclass(frozen=True, slots=True)
class GroupScore:
    """One group's statistics and its rollouts' advantages (in reward order)."""

    mean: float
    std: float
    advantages: tuple[float, ...]
    zero_variance: bool


def score(
    rewards: Sequence[float],
    *,
    estimator: Estimator = "grpo",
    eps: float = DEFAULT_EPS,
    ddof: int = DEFAULT_DDOF,
) -> GroupScore:
    """The advantages of one group's ``rewards`` (finite numbers, at least one);
    ``ddof`` is 0 or 1."""
    n = len(rewards)
    if n == 0:
        raise ValueError("a group has at least one reward")
    if ddof not in (0, 1):
        raise ValueError(f"ddof must be 0 or 1, got {ddof}")
    low, high = min(rewards), max(rewards)
    if low == high:
        return GroupScore(mean=high, std=0.0, advantages=(0.0,) * n, zero_variance=True)
    # max |r| = m * 2**e with 0.5 <= m < 1: the scaled rewards lie in (-1, 1).
    e = math.frexp(max(-low, high))[1]
    scaled = [math.ldexp(r, -e) for r in rewards]
    # Centred on one of them first: each difference is off by at most a rounding
    # of the spread, however close the rewards are to each other.
    shifted = [x - scaled[0] for x in scaled]
    shift = math.fsum(shifted) / n
    centred = [d - shift for d in shifted]
    std = math.sqrt(math.fsum(c * c for c in centred) / (n - ddof))
    if estimator == "grpo":
        advantages = _grpo(centred, std, eps, e)
    elif estimator == "dr_grpo":
        advantages = tuple(_unscaled(c, e) for c in centred)
    else:
        factor = n / (n - 1)
        advantages = tuple(_unscaled(factor * c, e) for c in centred)
    return GroupScore(
        mean=_mean(rewards), std=_unscaled(std, e), advantages=advantages, zero_variance=False
    )


def _mean(rewards: Sequence[float]) -> float:
    try:
        return math.fsum(rewards) / len(rewards)
    except OverflowError:  # a sum beyond the float range: exactly, then rounded once
        return float(sum(map(Fraction, rewards)) / len(rewards))


def _grpo(centred: list[float], std: float, eps: float, e: int) -> tuple[float, ...]:
    """``c / (std + eps)`` for ``centred`` and ``std`` scaled by ``2**-e``."""
    try:
        denominator = std + math.ldexp(eps, -e)
    except OverflowError:  # rewards so small that std is nothing beside eps
        return tuple(math.ldexp(c / eps, e) for c in centred)
    return tuple(c / denominator for c in centred)


def _unscaled(value: float, e: int) -> float:
    """``value * 2**e``, clamped to the finite floats."""
    try:
        return math.ldexp(value, e)
    except OverflowError:
        return math.copysign(FLOAT64_MAX, value)
