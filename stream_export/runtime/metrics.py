"""Every metric the worker exposes, built against a registry that is passed in.

Names follow Prometheus conventions: ``stream_export_`` prefix, base units
(seconds, bytes) in the name, ``_total`` once on counters (prometheus-client adds
it to Counter names, so the names below omit it). The process's own resident
memory, CPU time and open files are the standard ``process_*`` metrics.

Every labelled counter is created at 0 for each label value in ``LABELS``
(:mod:`stream_export.telemetry.metrics`); tests/unit/runtime/test_metrics.py
checks that the code uses no label value missing here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    Summary,
)

from stream_export import __version__
from stream_export.contract.calls import BREAK_REASONS
from stream_export.contract.reasons import DeadLetterReason
from stream_export.telemetry.metrics import IO_BUCKETS, LATENCY_BUCKETS, start_at_zero

_STEP_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
_DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200)
#: The largest reward spread a group is observed with: the histogram's sum stays
#: finite (and its mean meaningful) however large the rewards.
SPREAD_CAP: Final = 1e12
#: Weight versions the learning curve (group_rollout_reward) keeps a series of.
CURVE_VERSIONS: Final = 100

_DECODE_REASONS: Final = (
    DeadLetterReason.NOT_JSON,
    DeadLetterReason.INVALID,
    DeadLetterReason.TOO_LARGE,
    DeadLetterReason.TOO_DEEP,
    DeadLetterReason.UNKNOWN_TYPE,
    DeadLetterReason.UNSUPPORTED_VERSION,
    DeadLetterReason.CALL_TOO_LARGE,
    DeadLetterReason.TOKEN_LENGTH_MISMATCH,
    DeadLetterReason.OUT_OF_RANGE,
    DeadLetterReason.NON_FINITE,
    DeadLetterReason.SCORE_TOO_LARGE,
)
#: Valid events the assembler rejects (besides late and conflicting ones, which
#: have counters of their own).
_ASSEMBLE_REASONS: Final = (
    DeadLetterReason.FUTURE_TIME,
    DeadLetterReason.KEY_MISMATCH,
    DeadLetterReason.SEQ_OUT_OF_RANGE,
    DeadLetterReason.MAX_STEPS,
    DeadLetterReason.MAX_BYTES,
    DeadLetterReason.MAX_DURATION,
    DeadLetterReason.STATE_EXPIRED,
    DeadLetterReason.INTERNAL_ERROR,
    DeadLetterReason.UNKNOWN_EPISODE,
    DeadLetterReason.TOO_MANY_SCORES,
)
_INVALID_REASONS: Final = _DECODE_REASONS + _ASSEMBLE_REASONS
#: Label values each labelled counter starts with, at 0 (one tuple per series).
LABELS: Final[dict[str, tuple[tuple[str, ...], ...]]] = {
    "events_consumed": (("start",), ("step",), ("end",), ("score",)),
    "events_invalid": tuple((r,) for r in _INVALID_REASONS),
    "dead_letters": tuple((r,) for r in DeadLetterReason),
    "topic_resets": tuple(
        (stage, action) for stage in ("sink", "assemble") for action in ("stop", "new_epoch")
    ),
    "episodes_emitted": (("success",), ("failure",), ("other",)),
    "episodes_timed_out": (("emit",), ("drop",), ("dead_letter",)),
    "episodes_truncated": tuple(
        (r,) for r in ("timeout", "max_duration", "max_steps", "max_bytes", "state_expired")
    ),
    "episodes_filtered": tuple(
        (r,)
        for r in (
            "not_success",
            "too_few_steps",
            "too_many_steps",
            "no_reward",
            "low_reward",
            "domain",
            "empty",
            "custom",
        )
    ),
    "files_rotated": tuple(
        (r,) for r in ("size", "records", "age", "final", "adopted", "topic_reset", "evicted")
    ),
    "sink_errors": (("no_space",), ("permission",), ("io",), ("short_file",), ("misplaced",)),
    "service_errors": (("status",), ("kafka_probe",)),
    "token_breaks": tuple((r,) for r in BREAK_REASONS),
    "groups_closed": (("size",), ("timeout",)),
    "groups_dropped": (("too_small",), ("zero_variance",), ("too_large",)),
    "group_judge_calls": (("ok",), ("failed",), ("gave_up",)),
    "group_verdicts": (("scored",), ("failed",), ("ignored",)),
}


class Metrics:
    """All metrics of one worker process (or one test), on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry()
        p = "stream_export"
        # intake
        self.events_consumed = Counter(
            f"{p}_events_consumed", "Step events consumed, by event type.", ["type"], registry=r
        )
        self.events_invalid = Counter(
            f"{p}_events_invalid",
            "Messages rejected as invalid, by reason.",
            ["reason"],
            registry=r,
        )
        self.dead_letters = Counter(
            f"{p}_dead_letters",
            "Messages sent to the dead-letter topic, by reason.",
            ["reason"],
            registry=r,
        )
        # assembly
        self.steps_accepted = Counter(f"{p}_steps_accepted", "Step events accepted.", registry=r)
        self.steps_duplicate = Counter(
            f"{p}_steps_duplicate", "Identical duplicate step events ignored.", registry=r
        )
        self.steps_conflicting = Counter(
            f"{p}_steps_conflicting", "Duplicate steps with different content.", registry=r
        )
        self.events_late = Counter(
            f"{p}_events_late", "Events for episodes that had already closed.", registry=r
        )
        self.events_replayed = Counter(
            f"{p}_events_replayed",
            "Events seen again after a crash or rebalance whose effect was already applied.",
            registry=r,
        )
        self.events_refetched = Counter(
            f"{p}_events_refetched",
            "Steps-topic messages Faust's consumer skipped around a rebalance, read again"
            " directly.",
            registry=r,
        )
        self.state_expired = Counter(
            f"{p}_state_expired",
            "Open-episode chunks found past the window expiry when rebuilding (abandoned"
            " state, deleted).",
            registry=r,
        )
        self.topic_resets = Counter(
            f"{p}_topic_resets",
            "Topics found recreated or wiped under kept offsets, by stage (sink, assemble)"
            " and action (stop, new_epoch).",
            ["stage", "action"],
            registry=r,
        )
        self.reset_episodes_lost = Counter(
            f"{p}_reset_episodes_lost",
            "Open episodes discarded with stale local table state after a topic reset.",
            registry=r,
        )
        self.open_episodes = Gauge(
            f"{p}_open_episodes",
            "Episodes currently open, by partition.",
            ["partition"],
            registry=r,
        )
        self.held_episodes = Gauge(
            f"{p}_held_episodes",
            "Ended episodes waiting for their required scores (scores.hold_s), per partition.",
            ["partition"],
            registry=r,
        )
        self.scores_joined = Counter(
            f"{p}_scores_joined", "Scores published in their episode's record.", registry=r
        )
        self.scores_late = Counter(
            f"{p}_scores_late",
            "Scores that arrived after their episode was published (scores output or"
            " dead letter late_score).",
            registry=r,
        )
        self.score_hold_timeouts = Counter(
            f"{p}_score_hold_timeouts",
            "Held episodes published at the end of scores.hold_s without every required score.",
            registry=r,
        )
        self.episodes_emitted = Counter(
            f"{p}_episodes_emitted",
            "Episodes emitted to the episodes topic, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.episodes_timed_out = Counter(
            f"{p}_episodes_timed_out",
            "Episodes closed by the idle timeout, by policy action.",
            ["action"],
            registry=r,
        )
        self.episodes_truncated = Counter(
            f"{p}_episodes_truncated",
            "Episodes emitted truncated, by reason.",
            ["reason"],
            registry=r,
        )
        self.token_breaks = Counter(
            f"{p}_token_breaks",
            "Token segments of published episodes started by a call that does not continue"
            " the previous call's tokens, by reason.",
            ["reason"],
            registry=r,
        )
        self.episode_steps = Histogram(
            f"{p}_episode_steps", "Steps per emitted episode.", buckets=_STEP_BUCKETS, registry=r
        )
        self.episode_duration_seconds = Histogram(
            f"{p}_episode_duration_seconds",
            "Event-time duration of emitted episodes.",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        # formatting and sink
        self.episodes_filtered = Counter(
            f"{p}_episodes_filtered",
            "Episodes not written because a filter dropped them.",
            ["reason"],
            registry=r,
        )
        self.episodes_repeated = Counter(
            f"{p}_episodes_repeated", "Re-emitted episodes dropped by the sink.", registry=r
        )
        self.format_errors = Counter(
            f"{p}_format_errors", "Episodes a formatter failed on.", registry=r
        )
        self.records_written = Counter(
            f"{p}_records_written", "Records appended to output files.", registry=r
        )
        self.bytes_written = Counter(
            f"{p}_bytes_written", "Bytes appended to output files.", registry=r
        )
        self.files_rotated = Counter(
            f"{p}_files_rotated", "Output files sealed, by reason.", ["reason"], registry=r
        )
        self.write_seconds = Histogram(
            f"{p}_write_seconds",
            "Time to write one batch of lines.",
            buckets=IO_BUCKETS,
            registry=r,
        )
        self.fsync_seconds = Histogram(
            f"{p}_fsync_seconds", "Time of one fsync.", buckets=IO_BUCKETS, registry=r
        )
        self.end_to_end_seconds = Histogram(
            f"{p}_end_to_end_seconds",
            "From an episode's end event time to its line being written.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.sink_errors = Counter(
            f"{p}_sink_errors",
            "Output I/O errors (the sink pauses and retries), by kind.",
            ["kind"],
            registry=r,
        )
        self.service_errors = Counter(
            f"{p}_service_errors",
            "Failures of a worker's auxiliary service (the status page's reads, the "
            "broker probe), which reports them and goes on.",
            ["service"],
            registry=r,
        )
        self.paths_rejected = Counter(
            f"{p}_paths_rejected", "Partition values rejected as unsafe path names.", registry=r
        )
        self.last_write_timestamp_seconds = Gauge(
            f"{p}_last_write_timestamp_seconds",
            "Unix time of the last successful write.",
            registry=r,
        )
        self.sink_paused = Gauge(
            f"{p}_sink_paused",
            "1 while a sink is paused by an output error, by output (its file prefix).",
            ["output"],
            registry=r,
        )
        # uploads (sink.upload_url)
        self.upload_files = Counter(
            f"{p}_upload_files", "Sealed files uploaded with their manifest entry.", registry=r
        )
        self.upload_bytes = Counter(f"{p}_upload_bytes", "Bytes of files uploaded.", registry=r)
        self.upload_errors = Counter(
            f"{p}_upload_errors",
            "Failed upload attempts, by kind (the storage's error code).",
            ["kind"],
            registry=r,
        )
        self.upload_paused = Gauge(
            f"{p}_upload_paused",
            "1 while an output's uploads fail and wait to be retried, by output.",
            ["output"],
            registry=r,
        )
        self.upload_pending_files = Gauge(
            f"{p}_upload_pending_files",
            "Sealed files not uploaded yet, by output.",
            ["output"],
            registry=r,
        )
        # kafka
        self.kafka_reachable = Gauge(
            f"{p}_kafka_reachable",
            "1 while the broker has answered the worker's probe recently (see /readyz).",
            registry=r,
        )
        self.consumer_lag = Gauge(
            f"{p}_consumer_lag_messages",
            "Messages not processed yet per topic partition: the assembler's on the steps"
            " topic, the sink's on the episodes topic.",
            ["topic", "partition"],
            registry=r,
        )
        self.build_info = Info(f"{p}_build", "Version of the running worker.", registry=r)
        self.build_info.info({"version": __version__})
        # groups (stream_export.groups.stage)
        self.groups_open = Gauge(
            f"{p}_groups_open", "Open GRPO groups per groups partition.", ["partition"], registry=r
        )
        self.groups_closed = Counter(
            f"{p}_groups_closed", "GRPO groups emitted, by close reason.", ["reason"], registry=r
        )
        self.groups_incomplete = Counter(
            f"{p}_groups_incomplete", "Groups emitted before all rollouts arrived.", registry=r
        )
        self.groups_dropped = Counter(
            f"{p}_groups_dropped", "Groups dropped, by reason.", ["reason"], registry=r
        )
        self.groups_zero_variance = Counter(
            f"{p}_groups_zero_variance", "Groups emitted whose rewards are all equal.", registry=r
        )
        self.group_rollouts = Counter(
            f"{p}_group_rollouts", "Rollouts the groups stage received.", registry=r
        )
        self.group_rollouts_late = Counter(
            f"{p}_group_rollouts_late", "Rollouts of groups that had closed.", registry=r
        )
        self.group_rollouts_mismatched = Counter(
            f"{p}_group_rollouts_mismatched",
            "Rollouts left out of their group: another prompt than its first rollout's.",
            registry=r,
        )
        self.group_rollouts_duplicate = Counter(
            f"{p}_group_rollouts_duplicate", "Rollouts seen again (counted once).", registry=r
        )
        self.group_rollouts_truncated = Counter(
            f"{p}_group_rollouts_truncated",
            "Truncated rollouts (left out of group statistics).",
            registry=r,
        )
        self.group_rollouts_stale = Counter(
            f"{p}_group_rollouts_stale",
            "Stale rollouts (groups.max_weight_lag) in the group records the rollouts "
            "output read, by groups.stale_policy.",
            ["policy"],
            registry=r,
        )
        self.group_size = Histogram(
            f"{p}_group_size_rollouts",
            "Rollouts per emitted group.",
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        self.group_reward_spread = Histogram(
            f"{p}_group_reward_spread",
            "Max minus min reward of an emitted group's scored rollouts (at most 1e12).",
            buckets=(0, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 100),
            registry=r,
        )
        # the group judge (stream_export.groups.judging)
        self.group_rollout_reward = Summary(
            f"{p}_group_rollout_reward",
            "Rewards of the scored rollouts of the groups emitted, by the weight version"
            " that served them (their oldest): the learning curve.",
            ["weight_version"],
            registry=r,
        )
        #: The weight versions group_rollout_reward has a series of (the newest kept).
        self.reward_versions: set[int] = set()
        self.group_judge_calls = Counter(
            f"{p}_group_judge_calls",
            "Group judge requests: ok, failed (an attempt; retried), gave_up (a group's last).",
            ["result"],
            registry=r,
        )
        self.group_judge_seconds = Histogram(
            f"{p}_group_judge_seconds", "Time one group judge request took.", registry=r
        )
        self.groups_judging = Gauge(
            f"{p}_groups_judging",
            "Groups being judged per groups partition.",
            ["partition"],
            registry=r,
        )
        self.group_verdicts = Counter(
            f"{p}_group_verdicts",
            "Judge verdicts the groups stage read: scored, failed (published without the "
            "judge's score), ignored (the group was not being judged: a verdict again).",
            ["result"],
            registry=r,
        )
        ProcessCollector(registry=r)
        start_at_zero(self, LABELS)

    def observe_version_rewards(self, rewards: dict[int, list[float]]) -> None:
        """Observe a group's rewards by serving version (``records.rewards_by_version``),
        keeping the series of the newest :data:`CURVE_VERSIONS` versions only (a reward
        is observed within +-:data:`SPREAD_CAP`, so the sums stay finite)."""
        for version, values in rewards.items():
            if version not in self.reward_versions:
                if len(self.reward_versions) >= CURVE_VERSIONS:
                    if version < min(self.reward_versions):
                        continue  # older than every version kept
                    oldest = min(self.reward_versions)
                    self.group_rollout_reward.remove(str(oldest))
                    self.reward_versions.discard(oldest)
                self.reward_versions.add(version)
            series = self.group_rollout_reward.labels(str(version))
            for value in values:
                series.observe(min(max(value, -SPREAD_CAP), SPREAD_CAP))

    def observe_reward_spread(self, rewards: Sequence[float]) -> None:
        """Observe an emitted group's max minus min reward, capped at :data:`SPREAD_CAP`
        (the difference of two rewards can overflow to infinity)."""
        self.group_reward_spread.observe(min(max(rewards) - min(rewards), SPREAD_CAP))
