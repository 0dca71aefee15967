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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

Estimator = Literal["grpo", "dr_grpo", "rloo"]
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
    mean = math.fsum(rewards) / n
    if n == 1 or min(rewards) == max(rewards):
        return GroupScore(mean=mean, std=0.0, advantages=(0.0,) * n, zero_variance=True)
    centred = [r - mean for r in rewards]
    std = math.sqrt(math.fsum(c * c for c in centred) / (n - ddof))
    if estimator == "grpo":
        advantages = tuple(c / (std + eps) for c in centred)
    elif estimator == "dr_grpo":
        advantages = tuple(centred)
    else:
        factor = n / (n - 1)
        advantages = tuple(factor * c for c in centred)
    return GroupScore(mean=mean, std=std, advantages=advantages, zero_variance=False)
