"""What the assembler sends: closed episodes to the episodes topic, rejected
messages and unpublishable episodes to the dead-letter topic, with their metrics."""

from __future__ import annotations

import logging
from typing import Final

from stream_export.assemble.episode import Finished, build_episode, fitted, token_outcome
from stream_export.assemble.scoring import joined
from stream_export.assemble.verdicts import INTERNAL
from stream_export.contract.reasons import DeadLetterReason
from stream_export.errors import EpisodeError, StreamExportError
from stream_export.runtime import dlq
from stream_export.runtime.metrics import Metrics
from stream_export.runtime.stage import Send
from stream_export.settings import Settings

log = logging.getLogger(__name__)

_TIMEOUTS: Final = frozenset({"timeout", "max_duration"})
MAX_BYTES: Final = DeadLetterReason.MAX_BYTES
#: The assembly counters in the summary logged when the worker stops.
SUMMARY: Final = (
    "steps_accepted",
    "steps_duplicate",
    "steps_conflicting",
    "events_late",
    "events_replayed",
    "events_invalid",
    "episodes_emitted",
    "episodes_timed_out",
    "episodes_truncated",
    "scores_joined",
    "scores_late",
    "score_hold_timeouts",
)


class Publisher:
    def __init__(
        self, settings: Settings, metrics: Metrics, episodes: Send, dead_letters: Send, steps: str
    ) -> None:
        self.settings, self.metrics = settings, metrics
        self.episodes, self.dead_letters, self.steps = episodes, dead_letters, steps

    async def publish(self, partition: int, item: Finished) -> None:
        """Publish one closed episode (or dead-letter it, or drop it by policy)."""
        ep, m = item.episode, self.metrics
        timed_out = ep.close_reason in _TIMEOUTS
        if timed_out and self.settings.assemble.timeout_policy == "drop":
            m.episodes_timed_out.labels("drop").inc()
            return
        limit = self.settings.assemble.max_record_bytes
        try:
            built = build_episode(partition, item)
            if built is not None:
                built = joined(built, item.parts, self.settings.scores)
            record = None if built is None else fitted(built, limit)
        except Exception as exc:  # a bug must cost one episode, never the worker
            log.exception("assemble: partition %d: building episode %r", partition, ep.eid)
            detail = f"episode {ep.eid!r} could not be built: {type(exc).__name__}: {exc}"
            await self._dead_letter_parts(partition, item, EpisodeError(detail, reason=INTERNAL))
            return
        if record is None:
            if timed_out:
                m.episodes_timed_out.labels("dead_letter").inc()
            if built is None:
                detail = f"episode {ep.eid!r} closed ({ep.close_reason}) without its start event"
                error = EpisodeError(detail, reason=DeadLetterReason.MISSING_START)
            else:
                detail = f"episode {ep.eid!r} does not fit {limit} bytes even without its steps"
                error = EpisodeError(detail, reason=MAX_BYTES)
            await self._dead_letter_parts(partition, item, error)
            return
        episode, value = record
        await self.episodes.send(key=ep.key, value=value)
        m.episodes_emitted.labels(episode.outcome).inc()
        m.scores_joined.inc(len(episode.scores))
        if ep.held and episode.scores_missing:
            m.score_hold_timeouts.inc()
        if timed_out:
            m.episodes_timed_out.labels("emit").inc()
        if episode.truncated_reason is not None:
            m.episodes_truncated.labels(episode.truncated_reason).inc()
        m.episode_steps.observe(len(episode.steps))
        m.episode_duration_seconds.observe(episode.duration)
        breaks, rejects = token_outcome(item, episode)
        for reason in breaks:
            m.token_breaks.labels(reason).inc()
        for rejected, error in rejects:
            await self._dead_letter_parts(partition, rejected, error)

    async def dead_letter(
        self,
        partition: int,
        offset: int,
        key: bytes | None,
        raw: bytes | None,
        error: StreamExportError,
        stage: str,
    ) -> None:
        """Dead-letter the steps message at ``partition``/``offset`` unchanged."""
        source = dlq.Source(self.steps, partition, offset)
        await dlq.send(
            self.dead_letters,
            self.metrics,
            key=key,
            value=raw,
            error=error,
            source=source,
            stage=stage,
        )

    async def _dead_letter_parts(self, partition: int, item: Finished, error: EpisodeError) -> None:
        for part in item.parts:
            await self.dead_letter(
                partition, part.offset, item.episode.key, part.raw, error, "assemble"
            )

    def summary(self) -> str:
        """One line with this worker's assembly counters (logged at shutdown)."""
        totals: dict[str, float] = {}
        for family in self.metrics.registry.collect():
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    name = sample.name.removeprefix("stream_export_").removesuffix("_total")
                    totals[name] = totals.get(name, 0) + sample.value
        return " ".join(f"{name}={int(totals.get(name, 0))}" for name in SUMMARY)
