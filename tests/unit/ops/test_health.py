"""The broker counts as reachable while its last answer is recent."""

from __future__ import annotations

from stream_export.ops import health


def test_reachable_until_the_broker_has_been_silent_for_the_bound() -> None:
    after = health.UNREACHABLE_AFTER_S
    assert not health.reachable(None, 100.0)  # never answered
    assert health.reachable(100.0, 100.0)
    assert health.reachable(100.0, 100.0 + after - 0.1)
    assert not health.reachable(100.0, 100.0 + after)
    assert health.reachable(100.0, 130.0, after_s=60.0)


def test_the_bound_fits_the_probe() -> None:
    # a single lost probe never flips readiness; 503 comes within 30 s of silence
    assert health.UNREACHABLE_AFTER_S >= 2 * health.PROBE_INTERVAL_S
    assert health.UNREACHABLE_AFTER_S + health.PROBE_INTERVAL_S <= 30
