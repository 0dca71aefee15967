"""Kafka topic ids (KIP-516, Kafka 2.8+): what tells a recreated topic from the old one.

A topic deleted and created again under the same name (or on a broker whose data
was wiped) gets a new id, while its name and partition count may be the same.
aiokafka 0.14 speaks Metadata only up to v5, which has no topic id, so this
module adds Metadata v12 (Kafka 3.0+; the first version with ids is v10) on top
of aiokafka's wire-protocol classes (``aiokafka.protocol``: public modules, not
documented as API; issue 12 will move this next to the other framework adapters).
"""

from __future__ import annotations

import base64
from io import BytesIO
from typing import Any

from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError
from aiokafka.protocol.abstract import AbstractType
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    Boolean,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)

from stream_export.kafka.connection import kafka_options
from stream_export.settings import Settings


class _Uuid(AbstractType[bytes]):  # type: ignore[misc]
    """Kafka's UUID: 16 raw bytes."""

    @classmethod
    def encode(cls, value: bytes) -> bytes:
        return value

    @classmethod
    def decode(cls, data: BytesIO) -> bytes:
        value = data.read(16)
        if len(value) != 16:
            raise ValueError("Buffer underrun decoding a UUID")
        return value


_NULL_ID = bytes(16)


class _MetadataResponse_v12(Response):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 12
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            CompactArray(
                ("node_id", Int32),
                ("host", CompactString("utf-8")),
                ("port", Int32),
                ("rack", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("cluster_id", CompactString("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            CompactArray(
                ("error_code", Int16),
                ("name", CompactString("utf-8")),
                ("topic_id", _Uuid),
                ("is_internal", Boolean),
                (
                    "partitions",
                    CompactArray(
                        ("error_code", Int16),
                        ("partition_index", Int32),
                        ("leader_id", Int32),
                        ("leader_epoch", Int32),
                        ("replica_nodes", CompactArray(Int32)),
                        ("isr_nodes", CompactArray(Int32)),
                        ("offline_replicas", CompactArray(Int32)),
                        ("tags", TaggedFields),
                    ),
                ),
                ("topic_authorized_operations", Int32),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _MetadataRequest_v12(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 3
    API_VERSION = 12
    RESPONSE_TYPE = _MetadataResponse_v12
    SCHEMA = Schema(
        (
            "topics",
            CompactArray(
                ("topic_id", _Uuid), ("name", CompactString("utf-8")), ("tags", TaggedFields)
            ),
        ),
        ("allow_auto_topic_creation", Boolean),
        ("include_topic_authorized_operations", Boolean),
        ("tags", TaggedFields),
    )


class _TopicIdsRequest(Request[_MetadataRequest_v12]):  # type: ignore[misc]
    API_KEY = 3

    def __init__(self, topics: list[str]) -> None:
        self.topics = topics

    def build(self, request_struct_class: type[_MetadataRequest_v12]) -> _MetadataRequest_v12:
        return request_struct_class(
            [(_NULL_ID, name, {}) for name in self.topics], False, False, {}
        )


def text(topic_id: bytes) -> str:
    """A topic id as Kafka prints it (``kafka-topics.sh --describe``: URL-safe base64)."""
    return base64.urlsafe_b64encode(topic_id).rstrip(b"=").decode()


def parse(response: Any) -> dict[str, str]:
    """Topic name -> id (as Kafka prints it) for the topics that exist."""
    return {
        name: text(topic_id)
        for error, name, topic_id, *_ in response.topics
        if error == 0 and topic_id != _NULL_ID
    }


async def fetch(settings: Settings, topics: list[str]) -> dict[str, str] | None:
    """The ids of ``topics`` that exist, or None when the broker cannot say (older
    than Kafka 3.0, or unreachable): then only offsets can tell a reset."""
    client = AIOKafkaClient(**kafka_options(settings))
    try:
        await client.bootstrap()
        node = client.get_random_node()
        response = await client.send(node, _TopicIdsRequest(topics))
    except (KafkaError, NotImplementedError, OSError):
        return None
    finally:
        await client.close()
    return parse(response)
