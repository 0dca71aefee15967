"""Every error this package raises on purpose derives from StreamExportError.

Errors that describe bad data carry a short machine-readable ``reason`` (used as a
metric label and as the dead-letter header) and a human ``detail``.
"""

from __future__ import annotations

from stream_export.contract.reasons import DeadLetterReason


class StreamExportError(Exception):
    """Root of all stream-export errors."""

    reason: str = "error"
    #: True when retrying the same operation later may succeed (e.g. broker down).
    retriable: bool = False

    def __init__(self, detail: str, *, reason: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if reason is not None:
            self.reason = reason

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


class ConfigError(StreamExportError):
    """A setting is missing, malformed or inconsistent."""

    reason = "config"


class DecodeError(StreamExportError):
    """A message on a topic is not a valid event.

    ``reason`` is one of the decoding reasons of
    :class:`~stream_export.contract.reasons.DeadLetterReason` (not_json, invalid,
    out_of_range, too_large, ...).
    """

    reason = DeadLetterReason.INVALID


class EpisodeError(StreamExportError):
    """An event is valid on its own but conflicts with its episode's state
    (conflicting duplicate step, event for a closed episode)."""

    reason = "episode"


class FormatError(StreamExportError):
    """A formatter failed or returned something that is not a record."""

    reason = DeadLetterReason.FORMAT_ERROR


class SinkError(StreamExportError):
    """Writing output files failed (disk full, I/O error, permission)."""

    reason = "sink_io"
    retriable = True


class FeedError(StreamExportError):
    """The trainer feed cannot do what was asked (see stream_export.feed)."""

    reason = "feed"


class KafkaUnavailableError(StreamExportError):
    """The broker could not be reached in time."""

    reason = "kafka_unavailable"
    retriable = True


class AuthenticationError(StreamExportError):
    """The broker rejected the configured credentials (SASL or TLS client certificate).

    Not retriable: the same credentials will keep failing until someone fixes them.
    """

    reason = "kafka_authentication"


class GapError(StreamExportError):
    """Steps-topic messages Faust's consumer skipped could not be read back in time."""

    reason = "gap_unreadable"


class TopicResetError(StreamExportError):
    """A topic is not the one whose offsets were kept (recreated, or the broker's
    data wiped); the worker stops instead of skipping its records."""

    reason = "topic_reset"


class IncompatibleDependencyError(StreamExportError):
    """An installed faust-streaming or aiokafka lacks, or has changed, a name the
    worker relies on (see stream_export.runtime.compat)."""

    reason = "incompatible_dependency"


class StartupError(StreamExportError):
    """The command cannot run here until someone fixes a folder, a lock or a port."""

    reason = "startup"


class TopicError(StreamExportError):
    """The broker refused to describe or create a topic."""

    reason = "topics"


class TopicDriftError(ConfigError):
    """A topic differs from its spec in a way the worker cannot run with."""

    reason = "topic_drift"


class ProduceError(StreamExportError):
    """Kafka refused events (authorisation, unknown topic, message too large)."""

    reason = "produce_failed"


class RecorderError(StreamExportError):
    """The recorder was used out of order (a step before start or after end)."""

    reason = "recorder"


class RewardError(StreamExportError):
    """verl asked stream-export's reward function for a score it has no ground for: a
    task without a ground truth and a response the fleet never recorded."""

    reason = "unscorable"


class GatewayRequestError(StreamExportError):
    """A client's request the gateway cannot record as one call (several choices, a
    message the contract has no role for, a body that is not JSON); answered 400."""

    reason = "gateway_request"


class UpstreamError(StreamExportError):
    """An inference server's answer the gateway cannot record (no token ids or logprobs,
    too large, not JSON); answered 502 and recorded as nothing."""

    reason = "upstream"


class JsonTooDeepError(StreamExportError, ValueError):
    """JSON nested deeper than Python's recursion limit lets a decoder go (about a
    thousand levels): a ValueError, like any other text that is not JSON."""

    reason = "too_deep"


class GatewayRefusal(StreamExportError):
    """A gateway request answered with an HTTP error instead (``status``; ``reason`` is
    the OpenAI-shaped error's code): no API key, no episode, a body that is not JSON."""

    reason = "gateway_refused"

    def __init__(self, status: int, detail: str, *, reason: str) -> None:
        super().__init__(detail, reason=reason)
        self.status = status


class JudgeError(StreamExportError):
    """One failed attempt of the group judge: an HTTP error, a timeout, or an answer
    that is not one score from 0 to 10 per rollout (retried; see groups.judge_*)."""

    reason = "judge"


class TrainerInputError(StreamExportError):
    """A row a trainer adapter cannot train on as it is: no token ids, arrays of
    different lengths, no advantage, a group of the wrong size."""

    reason = "trainer_input"


class FenceError(StreamExportError):
    """A weight fence that cannot go on (``stream_export.weights``): ``reason`` says
    why (version_not_newer, no_open_fence, fence_expired, fence_not_acknowledged,
    control_unavailable)."""

    reason = "fence"


class WeightLoadError(StreamExportError):
    """New weights not loaded into an inference server: ``reason`` checkpoint_mismatch
    (refused before the server was touched), server_error (its pause or resume
    failed: the old weights, maybe still paused), reload_failed (the server's
    weights are undefined: restart it before the fence is lifted) or restarted
    (ServerRestartedError)."""

    reason = "weight_load"


class ServerRestartedError(WeightLoadError):
    """A reload failed, and the loader restarted the inference server on the weights
    that served before the update: ``serving`` is their version, which serves (and
    is recorded) again."""

    reason = "restarted"

    def __init__(self, detail: str, *, serving: int | str) -> None:
        super().__init__(detail)
        self.serving = serving


class AgentError(StreamExportError):
    """A live-loop agent's episode start or end the gateway did not take before the
    deadline (``stream-export learn``)."""

    reason = "agent"
