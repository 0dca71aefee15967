"""Groups of rewards for property tests: any finite floats, with the hard cases
drawn often (the float limit, subnormals, nearly equal rewards, mixtures)."""

from __future__ import annotations

import math
import sys

from hypothesis import strategies as st

FLOAT_MAX = sys.float_info.max
#: Values at the edges of the floats, mixed into groups of ordinary ones.
EDGES = (
    FLOAT_MAX,
    -FLOAT_MAX,
    1e308,
    -1e308,
    5e-324,
    -5e-324,
    sys.float_info.min,
    2.5e-320,
    0.0,
    -0.0,
    1.0,
)

one_reward = st.one_of(st.sampled_from(EDGES), st.floats(allow_nan=False, allow_infinity=False))


def _towards_zero(value: float, steps: int) -> float:
    for _ in range(steps):
        value = math.nextafter(value, 0.0)
    return value


#: Rewards one to a few units in the last place apart (around any finite float).
nearly_equal = st.tuples(
    one_reward, st.lists(st.integers(min_value=0, max_value=3), min_size=2, max_size=16)
).map(lambda drawn: [_towards_zero(drawn[0], k) for k in drawn[1]])

#: A group's rewards: arbitrary finite floats, or nearly equal ones.
rewards = st.one_of(st.lists(one_reward, min_size=1, max_size=24), nearly_equal)
