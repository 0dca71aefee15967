"""Group-relative advantages against hand-computed values, and their invariants."""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from stream_export.contract.groups import Estimator
from stream_export.groups.advantages import ESTIMATORS, GroupScore, score
from tests.support import rewards as reward_groups

EPS = 1e-6


def test_grpo_on_hand_computed_rewards() -> None:
    # mean 1; sample std sqrt((1 + 0 + 1) / 2) = 1
    got = score([0.0, 1.0, 2.0])
    assert got.mean == 1.0
    assert got.std == 1.0
    assert got.advantages == (-1 / (1 + EPS), 0.0, 1 / (1 + EPS))
    assert not got.zero_variance


def test_grpo_with_population_std() -> None:
    # ddof 0: std sqrt(2 / 3)
    got = score([0.0, 1.0, 2.0], ddof=0)
    assert got.std == pytest.approx(math.sqrt(2 / 3), rel=1e-15)
    assert got.advantages[2] == pytest.approx(1 / (math.sqrt(2 / 3) + EPS), rel=1e-15)


def test_grpo_one_success_in_four() -> None:
    # mean 0.25; sample variance (0.75² + 3 · 0.25²) / 3 = 0.25, std 0.5
    got = score([1.0, 0.0, 0.0, 0.0], eps=0.0)
    assert got.mean == 0.25
    assert got.std == 0.5
    assert got.advantages == (1.5, -0.5, -0.5, -0.5)


def test_dr_grpo_does_not_divide_by_std() -> None:
    got = score([0.0, 1.0, 2.0], estimator="dr_grpo")
    assert got.advantages == (-1.0, 0.0, 1.0)
    assert got.std == 1.0


def test_rloo_leave_one_out_baseline() -> None:
    # 1 - mean(0, 0, 0) = 1; 0 - mean(1, 0, 0) = -1/3
    got = score([1.0, 0.0, 0.0, 0.0], estimator="rloo")
    assert got.advantages == pytest.approx((1.0, -1 / 3, -1 / 3, -1 / 3), rel=1e-15)
    assert score([0.0, 1.0, 2.0], estimator="rloo").advantages == (-1.5, 0.0, 1.5)


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("rewards", [[0.7], [0.5, 0.5, 0.5], [-2.0, -2.0]])
def test_group_of_one_or_equal_rewards_is_zero_variance(
    estimator: Estimator, rewards: list[float]
) -> None:
    got = score(rewards, estimator=estimator)
    assert got.zero_variance
    assert got.advantages == (0.0,) * len(rewards)
    assert got.std == 0.0
    assert got.mean == rewards[0]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="at least one"):
        score([])
    with pytest.raises(ValueError, match="ddof"):
        score([1.0, 2.0], ddof=2)


rewards = st.lists(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=1, max_size=32
)


@given(rewards, st.sampled_from(["grpo", "rloo"]), st.sampled_from([0, 1]))
def test_grpo_and_rloo_sum_to_zero(values: list[float], estimator: Estimator, ddof: int) -> None:
    got = score(values, estimator=estimator, ddof=ddof)
    spread = max(values) - min(values)
    # each advantage is at most spread / std (grpo) or about spread (rloo) in size
    bound = max(1.0, spread) * len(values)
    assert abs(math.fsum(got.advantages)) <= 1e-9 * bound


@given(
    rewards.filter(lambda v: max(v) - min(v) > 1e-3),
    st.floats(min_value=-1e3, max_value=1e3, allow_nan=False),
    st.floats(min_value=1e-2, max_value=1e2),
)
def test_grpo_invariant_under_shift_and_positive_scale(
    values: list[float], shift: float, scale: float
) -> None:
    base = score(values)
    moved = score([scale * v + shift for v in values])
    # exact up to rounding, and up to eps relative to std (std + eps scales as std)
    tolerance = 1e-6 + 4 * EPS / min(base.std, moved.std)
    for a, b in zip(base.advantages, moved.advantages, strict=True):
        assert b == pytest.approx(a, rel=tolerance, abs=tolerance)
    assert moved.zero_variance == base.zero_variance


def exact(
    values: list[float], estimator: Estimator, eps: float, ddof: int
) -> tuple[Decimal, Decimal, list[Decimal]]:
    """Mean, std and advantages in exact arithmetic (the std and GRPO's division to
    60 digits), clamped to the finite floats as ``score`` documents."""
    n = len(values)
    mean = sum(map(Fraction, values), Fraction(0)) / n
    centred = [Fraction(v) - mean for v in values]
    with localcontext(prec=60):

        def dec(x: Fraction) -> Decimal:
            return Decimal(x.numerator) / Decimal(x.denominator)

        if not any(centred):
            return dec(mean), Decimal(0), [Decimal(0)] * n
        std = dec(sum((c * c for c in centred), Fraction(0)) / (n - ddof)).sqrt()
        if estimator == "grpo":
            advantages = [dec(c) / (std + Decimal(eps)) for c in centred]
        elif estimator == "dr_grpo":
            advantages = [dec(c) for c in centred]
        else:
            advantages = [dec(c * n / (n - 1)) for c in centred]
        clamp = Decimal(reward_groups.FLOAT_MAX)
        return dec(mean), min(std, clamp), [max(-clamp, min(a, clamp)) for a in advantages]


#: Allowed error: relative (to the value itself, or for advantages to the largest of
#: them) plus the spacing of subnormals, where no float has more precision.
REL, TINY = Decimal("1e-12"), Decimal(math.ulp(0.0))


def close(got: float, want: Decimal, scale: Decimal) -> bool:
    return math.isfinite(got) and abs(Decimal(got) - want) <= REL * scale + TINY


@settings(max_examples=400, deadline=None)
@given(
    reward_groups.rewards,
    st.sampled_from(ESTIMATORS),
    st.sampled_from([0.0, 1e-6, 1.0]),
    st.sampled_from([0, 1]),
)
@example([1e308, 1e308, -1e308], "grpo", 1e-6, 1)  # fsum overflowed: OverflowError
@example([1e308, -1e308], "rloo", 1e-6, 1)  # std and advantages were inf
@example([1.0, 1.0, 1.0 + 2**-52], "grpo", 1e-6, 1)  # lost to the mean's rounding
@example([5e-324, 1e-323, 0.0], "dr_grpo", 1e-6, 1)  # std 0.0 though not zero_variance
def test_any_finite_rewards_score_finite_and_as_exact_arithmetic_does(
    values: list[float], estimator: Estimator, eps: float, ddof: int
) -> None:
    got: GroupScore = score(values, estimator=estimator, eps=eps, ddof=ddof)
    mean, std, advantages = exact(values, estimator, eps, ddof)
    assert close(got.mean, mean, abs(mean)), (got.mean, mean)
    assert close(got.std, std, std), (got.std, std)
    assert got.zero_variance == (std == 0)
    largest = max(abs(a) for a in advantages)
    assert len(got.advantages) == len(values)
    for a, want in zip(got.advantages, advantages, strict=True):
        assert close(a, want, largest), (got.advantages, advantages)
