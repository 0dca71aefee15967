"""Topics declared on a broker from their specs (:mod:`stream_export.contract.topics`).

``apply`` creates what is missing and reports drift (partition count, replication,
configs) without changing or deleting anything; ``check`` only reports. Names come
from the settings (``topics.steps`` ...), partition count and replication factor
from the settings where a spec says "setting", everything else from the spec.

A Faust table's changelog must have its source topic's partition count, so on a
"copartitioned" topic a partition count other than ``topics.partitions`` is fatal:
``ensure`` (run before the worker starts) raises instead of letting Faust crash-loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from stream_export.contract.topics import Role, TopicSpec, load_specs, scores_topic, topic_names
from stream_export.errors import (
    ConfigError,
    KafkaUnavailableError,
    TopicDriftError,
    TopicError,
)
from stream_export.kafka.connection import kafka_options
from stream_export.settings import Settings
from stream_export.settings.assemble import RECORD_ENVELOPE

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES: Final = "max.message.bytes"
SEGMENT_BYTES: Final = "segment.bytes"
_SIZES: Final = (MAX_MESSAGE_BYTES, SEGMENT_BYTES)
#: Log segments of the topics stream-export creates: at least 64 MiB.
MIN_SEGMENT_BYTES: Final = 64 * 1024 * 1024
#: The repartition topic keeps rollouts 7 days, as the steps topic keeps events.
REPARTITION_RETENTION_MS: Final = "604800000"
#: Kafka error codes in admin answers.
_UNKNOWN_TOPIC: Final = 3
_LEADER_NOT_AVAILABLE: Final = 5
_TOPIC_EXISTS: Final = 36
#: Between two descriptions of a topic just created, until its partitions have leaders.
_NOT_READY_WAIT_S: Final = 0.2


@dataclass(frozen=True)
class Wanted:
    """A spec resolved against the settings: what the topic should look like."""

    role: Role
    name: str
    partitions: int
    replication_factor: int
    copartitioned: bool
    config: dict[str, str]


@dataclass(frozen=True)
class Actual:
    partitions: int
    replication_factor: int
    config: dict[str, str]


@dataclass(frozen=True)
class Drift:
    setting: str
    want: str
    have: str
    #: The worker cannot run with it.
    fatal: bool = False

    def __str__(self) -> str:
        return f"{self.setting} is {self.have}, spec wants {self.want}"


@dataclass
class TopicStatus:
    role: Role
    name: str
    state: Literal["ok", "created", "missing", "drift"]
    drift: list[Drift] = field(default_factory=list)


def wanted(settings: Settings, specs: list[TopicSpec]) -> list[Wanted]:
    """The specs resolved against the settings (names, partitions, replication, and
    a ``max.message.bytes`` that takes the largest record the settings allow)."""
    t = settings.topics
    names = [getattr(t, s.role) for s in specs]
    if len(set(names)) < len(names):
        raise ConfigError(f"topics.steps, .episodes and .dead_letters must differ: {names}")
    return (
        [
            Wanted(
                role=s.role,
                name=getattr(t, s.role),
                partitions=t.partitions if s.partitions == "setting" else s.partitions,
                replication_factor=(
                    t.replication_factor
                    if s.replication_factor == "setting"
                    else s.replication_factor
                ),
                copartitioned=s.copartitioned,
                config=_sized(settings, s.role, s.config),
            )
            for s in specs
        ]
        + _group_topics(settings, specs)
        + _score_topics(settings, specs)
    )


def needed_message_bytes(settings: Settings, role: Role) -> int:
    """The ``max.message.bytes`` a topic needs for the largest legal record: a step
    event on the steps topic, else anything the worker publishes."""
    a = settings.assemble
    if role == "steps":
        return a.max_event_bytes + RECORD_ENVELOPE
    return a.max_message_bytes


def _sized(settings: Settings, role: Role, config: dict[str, str]) -> dict[str, str]:
    """``config`` with room for the largest record: a ``max.message.bytes`` of at
    least what it needs, and log segments that hold several such records (a broker
    refuses a batch larger than a segment, whatever max.message.bytes says)."""
    need = needed_message_bytes(settings, role)
    message = max(int(config.get(MAX_MESSAGE_BYTES, "0")), need)
    segment = max(int(config.get(SEGMENT_BYTES, "0")), MIN_SEGMENT_BYTES, 4 * message)
    return {**config, MAX_MESSAGE_BYTES: str(message), SEGMENT_BYTES: str(segment)}


def _group_topics(settings: Settings, specs: list[TopicSpec]) -> list[Wanted]:
    if not settings.groups.enabled:
        return []
    t = settings.topics
    like = next(s for s in specs if s.role == "episodes")
    by_group, groups = topic_names(settings.worker.app_id)
    # Rollouts wait on the repartition topic until the groups stage acknowledges
    # them: deleted by time like the steps, never compacted by group id.
    repartition = {"cleanup.policy": "delete", "retention.ms": REPARTITION_RETENTION_MS}
    return [
        Wanted(
            "groups_by_group",
            by_group,
            t.partitions,
            t.replication_factor,
            True,
            _sized(settings, "groups_by_group", repartition),
        ),
        Wanted(
            "groups",
            groups,
            t.partitions,
            t.replication_factor,
            False,
            _sized(settings, "groups", like.config),
        ),
    ]


def _score_topics(settings: Settings, specs: list[TopicSpec]) -> list[Wanted]:
    """Late scores, keyed by episode and score id: kept, compacted, like the episodes."""
    if not settings.scores.enabled:
        return []
    t = settings.topics
    like = next(s for s in specs if s.role == "episodes")
    name = scores_topic(settings.worker.app_id)
    config = _sized(settings, "scores", like.config)
    return [Wanted("scores", name, t.partitions, t.replication_factor, False, config)]


def compare(want: Wanted, have: Actual) -> list[Drift]:
    """How an existing topic differs from what its spec wants (pure)."""
    drift = []
    if have.partitions != want.partitions:
        drift.append(
            Drift("partitions", str(want.partitions), str(have.partitions), want.copartitioned)
        )
    if have.replication_factor != want.replication_factor:
        drift.append(
            Drift("replication_factor", str(want.replication_factor), str(have.replication_factor))
        )
    for key, value in want.config.items():
        found = have.config.get(key)
        if found == value:
            continue
        if key in _SIZES and found is not None and found.isdigit():
            if int(found) >= int(value):
                continue  # room for larger records than needed is no drift
            # too small for a record the worker may write: the first would stop it
            drift.append(Drift(key, value, found, want.role != "steps"))
        else:
            drift.append(Drift(key, value, found or "(unset)"))
    return drift


@asynccontextmanager
async def _admin(settings: Settings, timeout_s: float) -> AsyncIterator[Any]:
    servers = settings.kafka.bootstrap_servers
    admin = AIOKafkaAdminClient(
        request_timeout_ms=int(timeout_s * 1000),
        **kafka_options(settings),
    )
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
    except (KafkaError, OSError, TimeoutError) as exc:
        await admin.close()
        raise KafkaUnavailableError(
            f"cannot reach Kafka at {servers} within {timeout_s:g}s: {exc!r}"
        ) from None
    try:
        yield admin
    finally:
        await admin.close()


async def _describe(admin: Any, names: list[str], *, created: bool = False) -> dict[str, Actual]:
    """The topics of ``names`` that exist (``created``: all of them, just created),
    each once its partitions all have a leader: a topic just created (by this call
    or another worker) reads as unknown, or with no or leaderless partitions, for a
    moment, which is waited for (the caller's deadline bounds it), never taken for
    a misconfigured topic."""
    while True:
        found, pending = await _describe_once(admin, names, created)
        if not pending:
            return found
        log.info("topics %s have no partitions with a leader yet; waiting", sorted(pending))
        await asyncio.sleep(_NOT_READY_WAIT_S)


async def _describe_once(
    admin: Any, names: list[str], created: bool
) -> tuple[dict[str, Actual], set[str]]:
    """(the existing topics of ``names`` that are ready, the names of those not yet)."""
    found, pending = {}, set()
    for topic in await admin.describe_topics(names):
        code, parts = topic["error_code"], topic["partitions"]
        if code == _UNKNOWN_TOPIC:
            if created:
                pending.add(topic["topic"])
            continue
        if code == _LEADER_NOT_AVAILABLE or not parts or any(p["leader"] < 0 for p in parts):
            pending.add(topic["topic"])
        elif code:
            raise TopicError(f"cannot describe topic {topic['topic']!r}: error {code}")
        else:
            found[topic["topic"]] = parts
    if not found:
        return {}, pending
    answers = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, name) for name in found]
    )
    configs: dict[str, dict[str, str]] = {}
    for answer in answers:
        for resource in answer.to_object()["resources"]:
            if resource["error_code"]:
                raise TopicError(
                    f"cannot read configs of {resource['resource_name']!r}: "
                    f"{resource['error_message']}"
                )
            configs[resource["resource_name"]] = {
                entry["config_names"]: entry["config_value"] for entry in resource["config_entries"]
            }
    actual = {
        name: Actual(len(parts), len(parts[0]["replicas"]), configs.get(name, {}))
        for name, parts in found.items()
    }
    return actual, pending


async def _create(admin: Any, topics: list[Wanted]) -> list[str]:
    """Create ``topics``; return the names another client created first."""
    answer = await admin.create_topics(
        [
            NewTopic(w.name, w.partitions, w.replication_factor, topic_configs=w.config)
            for w in topics
        ]
    )
    raced = []
    for name, code, message in answer.topic_errors:
        if code == _TOPIC_EXISTS:
            raced.append(name)
        elif code:
            raise TopicError(f"cannot create topic {name!r}: error {code}: {message}")
    return raced


async def apply(
    settings: Settings,
    *,
    create: bool = True,
    specs: list[TopicSpec] | None = None,
    timeout_s: float = 30.0,
) -> list[TopicStatus]:
    """Create missing topics (unless ``create`` is false) and report drift of the rest.

    Never alters or deletes a topic.
    """
    want = wanted(settings, specs if specs is not None else load_specs())
    names = [w.name for w in want]
    try:
        async with _admin(settings, timeout_s) as admin, asyncio.timeout(2 * timeout_s):
            actual = await _describe(admin, names)
            missing = [w for w in want if w.name not in actual]
            created = set()
            if create and missing:
                raced = await _create(admin, missing)
                created = {w.name for w in missing} - set(raced)
                # Described (and so waited for) as well: a worker starts only once
                # the topics it subscribes to have their partitions.
                actual.update(await _describe(admin, [w.name for w in missing], created=True))
    except TimeoutError:
        raise KafkaUnavailableError(
            f"Kafka at {settings.kafka.bootstrap_servers} did not answer within {timeout_s:g}s"
        ) from None
    except KafkaError as exc:
        raise TopicError(f"topic administration failed: {exc!r}") from None
    statuses = []
    for w in want:
        have = actual.get(w.name)
        if w.name in created:
            statuses.append(TopicStatus(w.role, w.name, "created"))
        elif have is None:
            statuses.append(TopicStatus(w.role, w.name, "missing"))
        else:
            drift = compare(w, have)
            statuses.append(TopicStatus(w.role, w.name, "drift" if drift else "ok", drift))
    return statuses


async def check(settings: Settings, *, timeout_s: float = 30.0) -> list[TopicStatus]:
    """Report missing topics and drift; change nothing."""
    return await apply(settings, create=False, timeout_s=timeout_s)


async def ensure(settings: Settings) -> list[str]:
    """Before the worker starts: apply the specs, log drift, refuse fatal drift.

    Returns the names of the topics it created.
    """
    statuses = await apply(settings)
    fatal = [f"{s.name}: {d}" for s in statuses for d in s.drift if d.fatal]
    if fatal:
        raise TopicDriftError(
            "; ".join(fatal) + " (Faust tables need the same partition count as their source "
            "topic: set topics.partitions to match, or recreate the topic; a topic the worker "
            "writes must take records of assemble.max_episode_bytes plus "
            f"{2 * RECORD_ENVELOPE} bytes in segments of 4 such records: raise its "
            "max.message.bytes and segment.bytes with kafka-configs, or lower "
            "assemble.max_episode_bytes)"
        )
    for s in statuses:
        for d in s.drift:
            log.warning("topic %s drifted from its spec: %s", s.name, d)
    return [s.name for s in statuses if s.state == "created"]


def render(statuses: list[TopicStatus]) -> str:
    """One line per topic, then one indented line per drift."""
    lines = []
    for s in statuses:
        lines.append(f"{s.name} ({s.role}): {s.state}")
        lines += [f"  {d}{' (fatal for the worker)' if d.fatal else ''}" for d in s.drift]
    return "\n".join(lines)
