"""The metrics of ``stream-export gateway``, its own process and registry (the
conventions of :mod:`stream_export.telemetry.metrics`)."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, ProcessCollector

from stream_export import __version__
from stream_export.telemetry.metrics import IO_BUCKETS, LATENCY_BUCKETS, start_at_zero

#: What became of a gateway call: recorded (answered after Kafka acknowledged it),
#: aborted (a stream stopped early: the client left, or the upstream failed
#: mid-stream; recorded), unrecorded (answered without the acknowledgement,
#: gateway.on_kafka_down=answer), refused (503: Kafka did not acknowledge),
#: upstream_error (the upstream failed before answering; nothing recorded), rejected
#: (a request the gateway cannot record, or a call too large to record), throttled
#: (429: the workers lag more than gateway.max_consumer_lag), outbox_full (503:
#: gateway.max_outbox_bytes of events wait for Kafka), rate_limited (429: the key's
#: gateway.calls_per_minute are used up), fenced (503: held by a weight fence for
#: weights.max_hold_s, or the fence expired with weights.on_fence_timeout=refuse).
GATEWAY_OUTCOMES: Final = (
    "recorded",
    "aborted",
    "unrecorded",
    "refused",
    "upstream_error",
    "rejected",
    "throttled",
    "outbox_full",
    "rate_limited",
    "fenced",
)
#: What the weight fence did to a new call: held (it waited for a commit), then
#: released (it went on) or refused (503 past weights.max_hold_s, or expired).
FENCE_OUTCOMES: Final = ("held", "released", "refused")
GATEWAY_ENDPOINTS: Final = ("chat", "completions")
#: What became of an episode, or of a start refused: started, ended (its end
#: acknowledged), expired (idle past gateway.idle_timeout_s), refused (503: Kafka
#: did not acknowledge the start), outbox_full, too_many_episodes and
#: too_many_episodes_for_key (503: gateway.max_open_episodes[_per_key]).
EPISODE_OUTCOMES: Final = (
    "started",
    "ended",
    "expired",
    "refused",
    "outbox_full",
    "too_many_episodes",
    "too_many_episodes_for_key",
)
#: Why a request was refused before or instead of its work (the error's code):
#: the Host, the content type, the body (size, bytes in flight, read time, JSON,
#: nesting), the client key and the episode it names.
REFUSED_REASONS: Final = (
    "host_not_allowed",
    "not_json_type",
    "request_too_large",
    "requests_in_flight",
    "body_timeout",
    "invalid_json",
    "too_deep",
    "invalid_api_key",
    "wrong_api_key",
    "episode_required",
    "episode_not_found",
    "episode_ended",
    "episode_expired",
    "invalid_steps",
    "invalid_step",
    "batch_out_of_order",
    "batch_conflict",
    "unsupported_route",
)
#: What became of a batch of agent steps (POST /v1/episodes/{id}/steps).
STEPS_OUTCOMES: Final = ("recorded", "repeated", "refused", "rejected")
#: Why a call's tokens were not recorded (the call was, text only): the upstream
#: refused the fields the gateway adds (fields_refused), its logprobs were null or
#: not finite (null_logprobs), their count differed from the token ids'
#: (logprobs_mismatch), or its token ids were missing or unreadable (missing_ids).
TOKENS_LOST_REASONS: Final = ("fields_refused", "null_logprobs", "logprobs_mismatch", "missing_ids")
#: The gateway's labelled counters and the label values each starts with, at 0.
GATEWAY_LABELS: Final[dict[str, tuple[tuple[str, ...], ...]]] = {
    "calls": tuple((e, o) for e in GATEWAY_ENDPOINTS for o in GATEWAY_OUTCOMES),
    "tokens": (("prompt",), ("completion",)),
    "episodes": tuple((o,) for o in EPISODE_OUTCOMES),
    "refused_requests": tuple((r,) for r in REFUSED_REASONS),
    "steps": tuple((o,) for o in STEPS_OUTCOMES),
    "token_capture_lost": tuple((r,) for r in TOKENS_LOST_REASONS),
    "fence_calls": tuple((o,) for o in FENCE_OUTCOMES),
}


class GatewayMetrics:
    """The metrics of ``stream-export gateway`` (its own process and registry)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry()
        p = "stream_export_gateway"
        self.calls = Counter(
            f"{p}_calls",
            "Model calls through the gateway, by endpoint and outcome.",
            ["endpoint", "outcome"],
            registry=r,
        )
        self.refused_requests = Counter(
            f"{p}_refused_requests",
            "Requests refused by the gateway before their work, by reason (the error's code).",
            ["reason"],
            registry=r,
        )
        self.tokens = Counter(
            f"{p}_tokens",
            "Tokens of recorded calls: prompt (in) and completion (out).",
            ["kind"],
            registry=r,
        )
        self.unrecorded_calls = Counter(
            f"{p}_unrecorded_calls",
            "Calls answered before Kafka acknowledged their events (on_kafka_down=answer).",
            registry=r,
        )
        self.text_only_calls = Counter(
            f"{p}_text_only_calls",
            "Recorded calls without token ids (gateway.capture_tokens=false, or an"
            " upstream that returns none).",
            registry=r,
        )
        self.steps = Counter(
            f"{p}_steps",
            "Batches of agent steps (POST /v1/episodes/{id}/steps), by outcome: recorded,"
            " repeated (answered as before), refused (Kafka, outboxes), rejected (invalid).",
            ["outcome"],
            registry=r,
        )
        self.token_capture_lost = Counter(
            f"{p}_token_capture_lost",
            "Calls recorded text only although token capture is on, by reason.",
            ["reason"],
            registry=r,
        )
        self.upstream_retries = Counter(
            f"{p}_upstream_retries",
            "Calls sent upstream again: unreachable, or 502/503/504 before any answer.",
            registry=r,
        )
        self.outbox_bytes = Gauge(
            f"{p}_outbox_bytes",
            "Bytes of events waiting for Kafka's acknowledgement, over all episodes.",
            registry=r,
        )
        self.request_bytes_in_flight = Gauge(
            f"{p}_request_bytes_in_flight",
            "Request-body bytes held by the requests being served"
            " (bounded by gateway.max_inflight_request_bytes).",
            registry=r,
        )
        self.consumer_lag = Gauge(
            f"{p}_consumer_lag",
            "The worker group's lag on the steps topic as the gateway last measured it"
            " (gateway.max_consumer_lag set; -1 until measured).",
            registry=r,
        )
        self.consumer_lag.set(-1)
        self.feed_lag = Gauge(
            f"{p}_feed_lag",
            "The trainer feed's group lag as the gateway last measured it"
            " (gateway.max_feed_lag set; -1 until measured).",
            registry=r,
        )
        self.feed_lag.set(-1)
        self.admitted_groups = Gauge(
            f"{p}_admitted_groups",
            "Groups whose calls go through without waiting on a lag (a call of theirs"
            " went through under the lag bounds); this replica's.",
            registry=r,
        )
        self.admitted_groups_dropped = Counter(
            f"{p}_admitted_groups_dropped",
            "Admitted groups forgotten before their episodes ended or went idle, to"
            " remember at most gateway.max_open_episodes.",
            registry=r,
        )
        self.group_calls = Counter(
            f"{p}_group_calls",
            "Calls that went through while a lag was over its bound: their group was"
            " admitted before.",
            registry=r,
        )
        self.added_seconds = Histogram(
            f"{p}_added_seconds",
            "Time the gateway adds to a call: its whole time minus the upstream's"
            " (the Kafka acknowledgement included).",
            buckets=IO_BUCKETS,
            registry=r,
        )
        self.upstream_seconds = Histogram(
            f"{p}_upstream_seconds",
            "Time an upstream took to answer a call (a stream: to its last chunk).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.open_episodes = Gauge(
            f"{p}_open_episodes", "Episodes the gateway holds open.", registry=r
        )
        self.episodes = Counter(
            f"{p}_episodes",
            "Episodes started, ended and expired, and starts refused, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.weight_version = Gauge(
            f"{p}_weight_version",
            "The weight version this replica stamps on calls (weights.enabled; an"
            " integer version, else -1).",
            registry=r,
        )
        self.weight_version.set(-1)
        self.fenced = Gauge(
            f"{p}_fenced",
            "1 while this replica holds new calls: a weight fence is open, or its lease"
            " on the control topic is not renewed.",
            registry=r,
        )
        self.fence_calls = Counter(
            f"{p}_fence_calls",
            "New calls the weight fence held, then released or refused, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.fence_seconds = Histogram(
            f"{p}_fence_seconds",
            "Weight fences from their begin to their commit or abort, as this replica saw them.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.version_calls = Counter(
            f"{p}_version_calls",
            "Calls recorded, by the weight version stamped on them.",
            ["version"],
            registry=r,
        )
        self.build_info = Info(f"{p}_build", "Version of the running gateway.", registry=r)
        self.build_info.info({"version": __version__})
        ProcessCollector(registry=r)
        start_at_zero(self, GATEWAY_LABELS)
