"""Optional quotas on model calls, off by default (pure: the clock is passed in):
``gateway.max_tokens_per_call`` caps what one call may sample, and
``gateway.calls_per_minute`` how often each client key may call (one budget for
all callers without client keys)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from stream_export.errors import GatewayRequestError
from stream_export.gateway.mapping import Json

#: The fields that bound how many tokens a call samples (chat has both spellings).
MAX_TOKENS_FIELDS = ("max_tokens", "max_completion_tokens")


def capped(body: Json, cap: int | None) -> Json:
    """The body to send upstream: without a cap as it is; with one, GatewayRequestError
    when it asks for more tokens than ``cap`` (or not as an integer), and the cap
    as ``max_tokens`` when it asks for no bound."""
    if cap is None:
        return body
    asked = [body.get(name) for name in MAX_TOKENS_FIELDS if body.get(name) is not None]
    for value in asked:
        if type(value) is not int or value > cap:
            raise GatewayRequestError(
                f"max_tokens must be an integer of at most {cap} (gateway.max_tokens_per_call)",
                reason="max_tokens_too_large",
            )
    return body if asked else {**body, "max_tokens": cap}


@dataclass
class _Bucket:
    tokens: float
    at: float


class CallRate:
    """A token bucket per client key: ``per_minute`` calls, refilled evenly, at most
    a minute's worth saved up."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.size = float(per_minute)
        self.per_s = per_minute / 60
        self.clock = clock
        #: One per client key seen (the keys file bounds them).
        self.buckets: dict[str, _Bucket] = {}

    def wait_s(self, key: str) -> int:
        """0 and one call taken from ``key``'s budget, or the whole seconds until
        the next call fits (nothing taken)."""
        now = self.clock()
        bucket = self.buckets.setdefault(key, _Bucket(self.size, now))
        bucket.tokens = min(self.size, bucket.tokens + (now - bucket.at) * self.per_s)
        bucket.at = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return 0
        return max(1, math.ceil((1 - bucket.tokens) / self.per_s))
