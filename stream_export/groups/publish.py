"""What the groups stage sends for each result of a book (:mod:`.state`): closed
groups and late rollouts to the groups topic, dead letters, and their metrics."""

from __future__ import annotations

import logging
from typing import Any, Final

import msgspec

from stream_export.contract.episode import Episode
from stream_export.contract.groups import GroupRecord
from stream_export.contract.reasons import DeadLetterReason
from stream_export.errors import EpisodeError
from stream_export.groups import judge
from stream_export.groups.records import closed_record, rewards_by_version
from stream_export.groups.state import (
    Dropped,
    Duplicate,
    Emitted,
    Ignored,
    Late,
    Mismatch,
    OpenGroup,
    Result,
)
from stream_export.rows.groups import dropped_for_variance
from stream_export.runtime import dlq
from stream_export.runtime.metrics import Metrics
from stream_export.runtime.stage import Send
from stream_export.settings import Settings

log = logging.getLogger(__name__)

#: Rollout ids a too-large group's dead letter names at most (its summary stays small).
MAX_LISTED_IDS: Final = 1000

_json: Final = msgspec.json.Encoder()


class GroupPublisher:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        records: Send,
        dead_letters: Send,
        topic: str,
        steps: Send | None = None,
    ) -> None:
        self.settings, self.metrics = settings, metrics
        self.records, self.dead_letters = records, dead_letters
        #: The steps topic, for the judge's score events.
        self.steps = steps
        #: The repartition topic (the source of dead letters).
        self.topic = topic
        #: The largest group record the groups topic takes (kafka.topics.wanted).
        self.max_record_bytes = settings.assemble.max_record_bytes

    async def handle(
        self, result: Result, partition: int, offset: int, verdict: judge.Verdict | None = None
    ) -> None:
        """Send and count what one result of the book at ``partition`` asks for
        (``offset``: the message that caused it, ``verdict`` if it was one)."""
        m, g = self.metrics, self.settings.groups
        where = (partition, offset)
        if isinstance(result, Ignored):
            m.group_verdicts.labels("ignored").inc()
        elif isinstance(result, Duplicate):
            m.group_rollouts_duplicate.inc()
        elif isinstance(result, Dropped):
            m.groups_dropped.labels(result.reason).inc()
        elif isinstance(result, Mismatch):
            m.group_rollouts_mismatched.inc()
            error = EpisodeError(
                f"rollout {result.member.episode_id!r} has another prompt than group "
                f"{result.group_id!r}'s first rollout; left out of the group",
                reason=DeadLetterReason.GROUP_PROMPT_MISMATCH,
            )
            await self._dead_letter(result.group_id, result.member.record, error, where)
        elif isinstance(result, Late):
            m.group_rollouts_late.inc()
            if g.late_policy == "dead_letter":
                error = EpisodeError(
                    f"rollout {result.member.episode_id!r} arrived after group "
                    f"{result.group_id!r} closed",
                    reason=DeadLetterReason.LATE_ROLLOUT,
                )
                await self._dead_letter(result.group_id, result.member.record, error, where)
            if not result.member.truncated:  # exported on its own, with no statistics
                member = result.member
                alone = OpenGroup(result.group_id, member.time, None, [member])
                await self._publish(alone, "late", False, None, member.time, where)
        elif isinstance(result, Emitted):
            if verdict is not None:
                m.group_verdicts.labels("failed" if verdict.scores is None else "scored").inc()
            await self._publish(
                result.group,
                result.reason,
                result.complete,
                result.missing,
                result.closed_at,
                where,
                verdict,
            )

    async def _publish(
        self,
        group: OpenGroup,
        reason: Any,
        complete: bool,
        missing: int | None,
        closed_at: float,
        where: tuple[int, int],
        verdict: judge.Verdict | None = None,
    ) -> None:
        g, m = self.settings.groups, self.metrics
        try:
            rollouts: list[Episode] | None = None
            events: list[tuple[str, bytes]] = []
            if verdict is not None:
                group, rollouts, events = judge.apply(group, verdict, self.settings)
            record = closed_record(group, reason, complete, missing, closed_at, g, rollouts)
        except Exception as exc:  # a bug must cost one group, never the worker, nor vanish
            log.exception("groups: building the record of group %r", group.group_id)
            error = EpisodeError(
                f"group {group.group_id!r} could not be built: {type(exc).__name__}: {exc}",
                reason=DeadLetterReason.INTERNAL_ERROR,
            )
            ids = [x.episode_id for x in group.members[:MAX_LISTED_IDS]]
            summary = _json.encode({"group_id": group.group_id, "episode_ids": ids})
            await self._dead_letter(group.group_id, summary, error, where)
            return
        if verdict is not None and self.steps is not None:
            for rollout, event in events:
                await self.steps.send(key=rollout.encode(), value=event)
        if reason != "late":  # every rollout a version served, trained on or not
            m.observe_version_rewards(rewards_by_version(record.rollouts))
        if dropped_for_variance(record, g.drop_zero_variance):
            m.groups_dropped.labels("zero_variance").inc()
            return
        value = _json.encode(record)
        if len(value) > self.max_record_bytes:
            await self._too_large(record, len(value), where)
            return
        await self.records.send(key=record.record_id.encode(), value=value)
        if reason == "late":
            return
        m.groups_closed.labels(reason).inc()
        if not complete:
            m.groups_incomplete.inc()
        if record.zero_variance:
            m.groups_zero_variance.inc()
        if any(record.stale):
            m.group_rollouts_stale.labels(record.stale_policy).inc(sum(record.stale))
        m.group_size.observe(record.size)
        m.observe_reward_spread([x.reward for x in group.members if not x.truncated])

    async def _too_large(self, record: GroupRecord, size: int, where: tuple[int, int]) -> None:
        """A group record the groups topic cannot take (its rollouts together exceed
        assemble.max_episode_bytes): dead-lettered as a summary naming its rollouts,
        which the episode sink still writes one by one, and counted as dropped."""
        error = EpisodeError(
            f"group {record.group_id!r}: its record is {size} bytes, over "
            f"assemble.max_episode_bytes plus its envelope ({self.max_record_bytes})",
            reason=DeadLetterReason.GROUP_TOO_LARGE,
        )
        summary = {
            "group_id": record.group_id,
            "record_bytes": size,
            "size": record.size,
            "episode_ids": [r.episode_id for r in record.rollouts[:MAX_LISTED_IDS]],
        }
        await self._dead_letter(record.group_id, _json.encode(summary), error, where)
        self.metrics.groups_dropped.labels("too_large").inc()

    async def _dead_letter(
        self, group_id: str, value: bytes, error: EpisodeError, where: tuple[int, int]
    ) -> None:
        await dlq.send(
            self.dead_letters,
            self.metrics,
            key=group_id.encode(),
            value=value,
            error=error,
            source=dlq.Source(self.topic, *where),
            stage="groups",
        )

    def summary(self) -> str:
        """One line with this worker's group counters (logged at shutdown)."""
        m = self.metrics
        counters = {
            "rollouts": m.group_rollouts,
            "duplicate": m.group_rollouts_duplicate,
            "late": m.group_rollouts_late,
            "truncated": m.group_rollouts_truncated,
            "incomplete": m.groups_incomplete,
            "zero_variance": m.groups_zero_variance,
        }
        parts = [f"{name}={int(sum(s.value for s in _samples(c)))}" for name, c in counters.items()]
        closed = {s.labels["reason"]: int(s.value) for s in _samples(m.groups_closed)}
        dropped = {s.labels["reason"]: int(s.value) for s in _samples(m.groups_dropped)}
        return " ".join([*parts, f"closed={closed}", f"dropped={dropped}"])


def _samples(counter: Any) -> list[Any]:
    return [s for f in counter.collect() for s in f.samples if s.name.endswith("_total")]
