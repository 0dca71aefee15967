"""The ``topics.*`` settings section (``Settings.topics``): the names of the topics
in the topic specs, and how the worker creates topics."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from stream_export.settings.values import TopicName


class TopicSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: Topic names follow Kafka's rule: 1-249 of [A-Za-z0-9._-], not starting with '.'.
    steps: TopicName = "agent-steps"
    episodes: TopicName = "agent-episodes"
    dead_letters: TopicName = "agent-steps-dlq"
    #: Partitions for topics the worker creates (steps, episodes and tables): 1 to 10000.
    partitions: Annotated[int, Meta(ge=1, le=10_000)] = 4
    #: 1 to 32767 (Kafka's limit); no more than the brokers in the cluster.
    replication_factor: Annotated[int, Meta(ge=1, le=32_767)] = 1
