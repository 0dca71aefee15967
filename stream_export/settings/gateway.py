"""The ``gateway.*`` settings section (``Settings.gateway``): the OpenAI-compatible
capture gateway that ``stream-export gateway`` runs."""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec
from msgspec import Meta

from stream_export.errors import ConfigError
from stream_export.settings.values import NonEmpty, Secret

_MIB: Final = 1 << 20
#: An OpenAI-compatible base URL, as its clients take it (``http://host:port/v1``).
UpstreamUrl = Annotated[
    str,
    Meta(
        pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$",
        max_length=2048,
        description="an http:// or https:// base URL (e.g. http://vllm:8000/v1)",
    ),
]


#: A Host name the gateway answers to (gateway.allowed_hosts); ``*``: any.
HostName = Annotated[
    str,
    Meta(
        pattern=r"^(\*|[A-Za-z0-9]([A-Za-z0-9.-]{0,252}[A-Za-z0-9])?)$",
        description="a host name (letters, digits, '.', '-') or *",
    ),
]


class GatewaySettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: The address the gateway listens on (its OpenAI API, session API and /metrics).
    #: Beyond loopback (e.g. 0.0.0.0) it refuses to start without api_keys_file,
    #: unless allow_without_keys is true.
    host: NonEmpty = "127.0.0.1"
    #: 1 to 65535.
    port: Annotated[int, Meta(ge=1, le=65_535)] = 9180
    #: OpenAI-compatible base URLs of the inference servers (vLLM first; a
    #: comma-separated list in the environment). An episode's calls all go to one of them,
    #: chosen by its id, so the server's prefix cache sees the whole conversation.
    upstreams: list[UpstreamUrl] = msgspec.field(
        default_factory=lambda: ["http://127.0.0.1:8000/v1"]
    )
    #: The API key the gateway sends upstream (Bearer); never shown anywhere.
    upstream_api_key: Secret | None = None
    #: Longest wait for an upstream's whole answer (a stream: between two chunks):
    #: > 0, at most 3600 s. The upstream's error or a 504 reaches the client.
    upstream_timeout_s: Annotated[float, Meta(gt=0, le=3600)] = 300.0
    #: How often a call is sent again (0 to 10), to the next upstream of the list
    #: after a backoff (0.1 s doubling, at most 2 s). A retry follows an upstream
    #: that could not be reached or answered 502, 503 or 504. It always happens
    #: before any answer reached the client and before anything was recorded.
    upstream_retries: Annotated[int, Meta(ge=0, le=10)] = 2
    #: Whether the gateway asks the upstream for token ids and logprobs. false (or
    #: an upstream that returns none, e.g. a hosted model): calls are recorded
    #: text-only (request and answer, no token arrays; left out of the tokens rows).
    capture_tokens: bool = True
    #: A file with one client API key per line (blank lines and lines starting
    #: with # ignored), read at start: the session API and unbound calls need one
    #: as Bearer token. Empty: no client key is checked (a trusted network only).
    api_keys_file: NonEmpty | None = None
    #: true: listen beyond loopback (host) without api_keys_file, so anyone who
    #: reaches the port samples under the upstream's key (a trusted network only).
    allow_without_keys: bool = False
    #: Without client keys, the Host names the gateway answers to besides IP
    #: addresses, localhost and public_url's host (a comma-separated list in the
    #: environment; * for any): another Host is refused (421), which closes DNS
    #: rebinding. List the names clients use, e.g. a Service's.
    allowed_hosts: list[HostName] = msgspec.field(default_factory=list)
    #: Largest request body a client may send (413 beyond, before it is read):
    #: 1 KiB to 1 GiB; empty: assemble.max_event_bytes (a call larger than that
    #: cannot be recorded).
    max_request_bytes: Annotated[int, Meta(ge=1024, le=1 << 30)] | None = None
    #: The most request-body bytes held at once, over all requests being read or
    #: served, 1 KiB to 64 GiB. A request counts its Content-Length (else
    #: max_request_bytes) until it is answered. Beyond the limit a request is
    #: refused with 503 and Retry-After before its body is read.
    max_inflight_request_bytes: Annotated[int, Meta(ge=1024, le=1 << 36)] = 64 * _MIB
    #: Longest a connection may take to send a request's line and headers, from its
    #: opening or from the previous answer (so also how long an idle kept-alive
    #: connection stays open): > 0, at most 3600 s. Behind a proxy that keeps idle
    #: connections longer (nginx, a cloud load balancer: 60 s), set it above that.
    header_timeout_s: Annotated[float, Meta(gt=0, le=3600)] = 10.0
    #: Longest a request's body may take to arrive, once its headers did (408 and
    #: the connection closed beyond): > 0, at most 3600 s.
    body_timeout_s: Annotated[float, Meta(gt=0, le=3600)] = 30.0
    #: Quota: the largest max_tokens (or max_completion_tokens) a call may ask for
    #: (400 beyond); a call that asks none is sent upstream with this. Empty: none.
    max_tokens_per_call: Annotated[int, Meta(ge=1, le=1 << 31)] | None = None
    #: Quota: model calls a minute per client key (all callers together without
    #: api_keys_file), a token bucket as large as a minute's calls; a call over it
    #: is refused with 429 and Retry-After before the upstream is asked. Empty: none.
    calls_per_minute: Annotated[int, Meta(ge=1, le=1_000_000)] | None = None
    #: Largest answer the gateway takes from an upstream (a stream: in total):
    #: 1 KiB to 1 GiB; a larger one is a 502 and nothing is recorded.
    max_response_bytes: Annotated[int, Meta(ge=1024, le=1 << 30)] = 16 * _MIB
    #: Longest wait for Kafka to acknowledge a call's events before on_kafka_down
    #: applies: > 0, at most 300 s.
    ack_timeout_s: Annotated[float, Meta(gt=0, le=300)] = 10.0
    #: When Kafka does not acknowledge a call's events in time. "refuse" answers
    #: 503 with Retry-After (nothing answered is unrecorded). "answer" answers
    #: anyway, counted in stream_export_gateway_unrecorded_calls_total. Its
    #: events stay in the state directory and are sent again before the
    #: episode's next event.
    on_kafka_down: Literal["refuse", "answer"] = "refuse"
    #: Retry-After (seconds) of a refused or throttled call, how long a call over a
    #: lag waits before it is throttled, and how often the outboxes are sent again
    #: and the lags are measured: 1 to 3600.
    retry_after_s: Annotated[int, Meta(ge=1, le=3600)] = 5
    #: The most bytes of events waiting for Kafka's acknowledgement, over all
    #: episodes (in memory and the state directory, during an outage): 1 KiB to 64
    #: GiB. While it is reached, calls and episode starts are refused (503
    #: outbox_full), on_kafka_down=answer too.
    max_outbox_bytes: Annotated[int, Meta(ge=1024, le=1 << 36)] = 256 * _MIB
    #: Backpressure: while the worker group (worker.app_id) lags more than this
    #: many steps events behind (summed over topics.steps' partitions, measured
    #: every retry_after_s), a call waits up to retry_after_s for it to drop, then
    #: answers 429 with Retry-After. Empty: never.
    max_consumer_lag: Annotated[int, Meta(ge=0, le=1 << 62)] | None = None
    #: Backpressure on the trainer: while the trainer feed's consumer group
    #: (feed_group) lags more than max_feed_lag messages behind on the topic it
    #: reads (the groups topic with groups.enabled, else topics.episodes), calls
    #: wait and answer 429 too. Empty: never.
    feed_group: NonEmpty | None = None
    max_feed_lag: Annotated[int, Meta(ge=0, le=1 << 62)] | None = None
    #: Where the gateway keeps its write-ahead log of open episodes (next seq, a
    #: digest of the last call's tokens, events not yet acknowledged), fsync'd
    #: before a call's events are produced, so a restarted gateway continues them.
    state_dir: NonEmpty = ".stream-export-gateway"
    #: An open episode without a call for this long (and nothing waiting for
    #: Kafka) is closed by the gateway, which then answers its calls 409
    #: episode_expired: > 0, at most 30 days. Empty: the worker's
    #: assemble.idle_timeout_s + assemble.grace_s, after which the worker has
    #: closed it too. Closed episodes are remembered as long (a retried end
    #: answers as the first did).
    idle_timeout_s: Annotated[float, Meta(gt=0, le=30 * 86_400)] | None = None
    #: The most episodes open at once, and the most closed ones remembered: 1 to
    #: 10,000,000. A start beyond it answers 503 too_many_episodes with Retry-After.
    max_open_episodes: Annotated[int, Meta(ge=1, le=10_000_000)] = 50_000
    #: The most episodes open at once per client key (the key that started them;
    #: without gateway.api_keys_file, not checked): 1 to 10,000,000. Beyond it:
    #: 503 too_many_episodes_for_key.
    max_open_episodes_per_key: Annotated[int, Meta(ge=1, le=10_000_000)] = 10_000
    #: The public base URL the session API hands out (``{public_url}/episodes/{id}/v1``);
    #: empty: the scheme and host the client used.
    public_url: UpstreamUrl | None = None

    def __post_init__(self) -> None:
        if not self.upstreams:
            raise ConfigError("invalid setting gateway.upstreams: must name at least one URL")
