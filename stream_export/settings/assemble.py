"""The ``assemble.*`` settings section (``Settings.assemble``): how step events become
episodes (timeouts, bounds, batches, the open-episodes table), and the largest
record that follows from them."""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec
from msgspec import Meta

from stream_export.contract.widths import INT32_MAX
from stream_export.errors import ConfigError
from stream_export.settings.values import DAY, GIB, YEAR

#: What a published record may add to an episode's events (its own fields, the
#: source offsets of its steps), and again what a Kafka record adds to that.
RECORD_ENVELOPE: Final = 32 * 1024


class AssembleSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: An episode with no event for this long (event time) times out: > 0, at most 30 days.
    idle_timeout_s: Annotated[float, Meta(gt=0, le=30 * DAY)] = 300.0
    #: Extra event time allowed for stragglers after the idle timeout: 0 to 30 days.
    grace_s: Annotated[float, Meta(ge=0, le=30 * DAY)] = 30.0
    #: A partition with no new events closes its due episodes on the wall clock
    #: after this many seconds of silence: > 0, at most 1 day.
    quiet_partition_s: Annotated[float, Meta(gt=0, le=DAY)] = 60.0
    #: What to do with a timed-out episode: emit it marked truncated, or drop it.
    timeout_policy: Literal["emit", "drop"] = "emit"
    #: An episode with more steps (a step seq at or beyond this, or an end event
    #: announcing more) is emitted truncated ("max_steps"): 1 to 2**31 - 1.
    max_steps: Annotated[int, Meta(ge=1, le=INT32_MAX)] = 10_000
    #: An episode whose events add up to more bytes is emitted truncated
    #: ("max_bytes"): 1 byte to 1 GiB, and at least max_event_bytes.
    max_episode_bytes: Annotated[int, Meta(ge=1, le=GIB)] = 16 * 1024 * 1024
    #: Largest accepted step-event message; larger ones go to the dead-letter
    #: topic: 1 byte to 1 GiB.
    max_event_bytes: Annotated[int, Meta(ge=1, le=GIB)] = 1_048_576
    #: How long closed-episode ids are remembered to detect late events: > 0, at
    #: most 10 years, and at least window_expires_s.
    closed_retention_s: Annotated[float, Meta(gt=0, le=10 * YEAR)] = 7 * 24 * 3600.0
    #: The open-episodes table is a Faust tumbling-window table. An episode's state
    #: is filed under the window (of this size, on the wall clock) of its first
    #: write. Faust deletes a window's state window_expires_s after it ends. That
    #: expiry is only a backstop for abandoned state, long after any episode has
    #: closed; closing is our own logic. Both > 0 and at most 10 years;
    #: window_s <= window_expires_s.
    window_s: Annotated[float, Meta(gt=0, le=10 * YEAR)] = 3600.0
    window_expires_s: Annotated[float, Meta(gt=0, le=10 * YEAR)] = 3 * 24 * 3600.0
    #: An episode whose events span more event time than this is closed truncated
    #: (keeps every open episode well inside window_expires_s): > idle_timeout_s,
    #: at most 10 years.
    max_duration_s: Annotated[float, Meta(gt=0, le=10 * YEAR)] = 24 * 3600.0
    #: Events stamped further ahead of the worker's clock are dead-lettered, so one
    #: bad agent clock cannot time out a whole partition: > 0, at most 30 days.
    max_future_s: Annotated[float, Meta(gt=0, le=30 * DAY)] = 3600.0
    #: Events handled together: one chunk write per episode per batch (1 to 1,000,000).
    batch_max_events: Annotated[int, Meta(ge=1, le=1_000_000)] = 2000
    #: Longest wait to fill a batch (adds at most this latency): > 0, at most 60 s.
    batch_max_wait_s: Annotated[float, Meta(gt=0, le=60)] = 0.1
    #: New events of still-open episodes are written to the open-episodes table
    #: (one chunk per episode) at most this long after they arrive; only then are
    #: their offsets committed. Episodes that finish sooner are never written.
    #: > 0, at most 3600 s.
    persist_interval_s: Annotated[float, Meta(gt=0, le=3600)] = 1.0

    @property
    def max_record_bytes(self) -> int:
        """The largest value the worker publishes (an episode, a group record, a dead
        letter's value): an episode's events plus room for what the record adds."""
        return self.max_episode_bytes + RECORD_ENVELOPE

    @property
    def max_message_bytes(self) -> int:
        """The ``max.message.bytes`` every topic the worker writes needs (and the
        producer's request size): a record of :attr:`max_record_bytes`, its key,
        headers and framing."""
        return self.max_episode_bytes + 2 * RECORD_ENVELOPE

    def __post_init__(self) -> None:
        if self.max_episode_bytes < self.max_event_bytes:
            raise ConfigError(
                f"invalid setting assemble.max_episode_bytes={self.max_episode_bytes}: must be >= "
                f"assemble.max_event_bytes ({self.max_event_bytes})"
            )
        if self.max_duration_s <= self.idle_timeout_s:
            raise ConfigError(
                f"invalid setting assemble.max_duration_s={self.max_duration_s:g}: must be > "
                f"assemble.idle_timeout_s ({self.idle_timeout_s:g})"
            )
        lifetime = self.max_duration_s + self.idle_timeout_s + self.grace_s
        floor = 2 * (lifetime + self.quiet_partition_s)
        if self.window_expires_s < floor:
            raise ConfigError(
                f"invalid setting assemble.window_expires_s={self.window_expires_s:g}: "
                f"must be >= {floor:g}, twice max_duration_s + idle_timeout_s + grace_s + "
                "quiet_partition_s (it is only a backstop)"
            )
        if self.window_s > self.window_expires_s:
            raise ConfigError(
                f"invalid setting assemble.window_s={self.window_s:g}: must be <= "
                f"assemble.window_expires_s ({self.window_expires_s:g})"
            )
        if self.closed_retention_s < self.window_expires_s:
            raise ConfigError(
                f"invalid setting assemble.closed_retention_s={self.closed_retention_s:g}: "
                f"must be >= assemble.window_expires_s ({self.window_expires_s:g})"
            )
