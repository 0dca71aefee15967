"""Which finished episodes are written at all: pure checks run before formatting.

``build`` turns the filter settings into one function that returns the reason an
episode is dropped (the ``reason`` label of ``episodes_filtered``) or None to keep
it. Reasons, checked in this order:

    not_success     only_success is set and the outcome is not "success"
    too_few_steps   fewer steps than min_steps
    too_many_steps  more steps than max_steps
    no_reward       min_reward is set and the episode has no reward
    low_reward      reward below min_reward
    domain          domains is set and metadata "domain" is not one of them
                    (a list-valued domain passes when any of its entries does)
"""

from __future__ import annotations

from collections.abc import Callable

from stream_export.contract.episode import Episode
from stream_export.settings.format import FormatSettings

Check = Callable[[Episode], str | None]


def build(settings: FormatSettings) -> Check:
    """One function applying every configured filter; the first failing one wins."""
    checks: list[Check] = []
    if settings.only_success:
        checks.append(lambda e: None if e.outcome == "success" else "not_success")
    min_steps, max_steps = settings.min_steps, settings.max_steps
    if min_steps is not None:
        checks.append(lambda e: "too_few_steps" if len(e.steps) < min_steps else None)
    if max_steps is not None:
        checks.append(lambda e: "too_many_steps" if len(e.steps) > max_steps else None)
    if settings.min_reward is not None:
        checks.append(_reward_check(settings.min_reward))
    if settings.domains:
        checks.append(_domain_check(frozenset(settings.domains)))

    def first_reason(episode: Episode) -> str | None:
        for check in checks:
            reason = check(episode)
            if reason is not None:
                return reason
        return None

    return first_reason


def _reward_check(threshold: float) -> Check:
    def check(episode: Episode) -> str | None:
        if episode.reward is None:
            return "no_reward"
        return "low_reward" if episode.reward < threshold else None

    return check


def _domain_check(allowed: frozenset[str]) -> Check:
    def check(episode: Episode) -> str | None:
        domain = episode.metadata.get("domain")
        values = domain if isinstance(domain, list) else [domain]
        return None if any(v in allowed for v in values if isinstance(v, str)) else "domain"

    return check
