"""The ``weights.*`` settings section (``Settings.weights``): the weight fence a
trainer drives through a control topic that every gateway replica follows
(``stream_export.weights``; the page docs/weights.md)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from stream_export.settings.values import TopicName

Replica = Annotated[
    str,
    Meta(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$",
        description="1-128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit",
    ),
]


class WeightSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: Whether the gateway follows the control topic: it holds calls while a
    #: trainer's fence is open and stamps every llm_call with the committed
    #: version. false: the weight version recorded is the model name the server
    #: answered with (unless the upstream reports its own).
    enabled: bool = False
    #: The compacted one-partition topic of fences, leases and acknowledgements
    #: (created on first use). Whoever may write to it may fence the gateways:
    #: grant that with Kafka's ACLs, as for the other topics.
    control_topic: TopicName = "stream-export-weights"
    #: This gateway replica's name on the control topic; empty: host:gateway.port.
    replica: Replica | None = None
    #: A replica's lease, renewed every quarter of it: 0.5 to 3600 s. A replica that
    #: has not renewed for this long counts as gone, and a fence stops waiting for
    #: it. One that could not renew for half of it holds new calls itself.
    lease_s: Annotated[float, Meta(ge=0.5, le=3600)] = 10.0
    #: Longest a new call waits while fenced; then 503 fenced with Retry-After
    #: (gateway.retry_after_s): 0 to 3600 s.
    max_hold_s: Annotated[float, Meta(ge=0, le=3600)] = 30.0
    #: Longest a trainer's begin waits for every live replica's acknowledgement
    #: (their calls in flight to finish); then the fence is aborted and begin
    #: raises FenceError fence_not_acknowledged: > 0, at most 86400 s.
    ack_timeout_s: Annotated[float, Meta(gt=0, le=86_400)] = 300.0
    #: A fence not committed (nor aborted) this long after its begin has expired
    #: (a trainer died between begin and commit): > 0, at most 86400 s. A trainer
    #: may pass its own to begin().
    fence_timeout_s: Annotated[float, Meta(gt=0, le=86_400)] = 600.0
    #: What a fence's begin does to the calls in flight on a replica. "finish"
    #: lets them end under the version that admitted them (begin waits for them).
    #: "abort" stops them at once: a stream ends with an error event (code
    #: fenced), its llm_call recorded aborted with the tokens sampled so far. A
    #: stopped call that was not streamed answers 503 fenced, unrecorded.
    in_flight: Literal["finish", "abort"] = "finish"
    #: What an expired fence does. "refuse" answers new calls 503 fence_expired
    #: until a trainer begins or aborts a fence: the weights may be half-loaded,
    #: and nothing is recorded under a version that may not be the one serving.
    #: "resume" lets calls flow under the last committed version (for trainers
    #: whose weights load only once a commit cannot fail).
    on_fence_timeout: Literal["refuse", "resume"] = "refuse"
