"""Gateway replicas that follow one weight-fence control topic, and an agent's calls
through them (aiohttp, so a test can hold several in flight while a trainer fences):
each call in an episode of its own, so the steps topic tells which version each
one was recorded under."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp

from stream_export import settings as config
from stream_export.contract.calls import LlmCall
from stream_export.contract.decoding import decode_event
from stream_export.contract.events import Step
from stream_export.settings import Settings
from tests.support.gateway_agent import base
from tests.support.monitoring import free_port, get
from tests.support.processes import Gateway
from tests.support.topic_reader import read_topic
from tests.support.waiting import wait_for

Json = dict[str, Any]

#: A planted partition: while the file ``{flag}`` exists, every request of the
#: process's Kafka clients fails as if the broker were unreachable.
PARTITION: Final = """
import os
import aiokafka.conn
from aiokafka.errors import KafkaConnectionError
_send = aiokafka.conn.AIOKafkaConnection.send
def _partitioned(self, *args, **kwargs):
    if os.path.exists({flag!r}):
        raise KafkaConnectionError("partitioned from Kafka (a test's planted fault)")
    return _send(self, *args, **kwargs)
aiokafka.conn.AIOKafkaConnection.send = _partitioned
"""


def replica_settings(upstream: str, kafka: str, state: Path, *more: str) -> Settings:
    """One fenced gateway replica's (and its trainer's) settings, in front of the
    server at ``upstream`` (its base URL), on topics of their own."""
    token = uuid.uuid4().hex[:10]
    return config.load(
        env={},
        overrides=[
            f"kafka.bootstrap_servers={kafka}",
            f"topics.steps=t-{token}-steps",
            f"weights.control_topic=t-{token}-weights",
            "weights.enabled=true",
            "weights.lease_s=2",
            f"weights.replica=r-{token}",
            f"gateway.upstreams={upstream}/v1",
            f"gateway.port={free_port()}",
            f"gateway.state_dir={state}",
            *more,
        ],
    )


@dataclass
class Replica:
    name: str
    settings: Settings
    log: Path
    prelude: str | None = None
    process: Gateway | None = None

    @property
    def url(self) -> str:
        return base(self.settings)

    def start(self) -> Replica:
        self.process = Gateway(self.settings, self.log, prelude=self.prelude)
        self.process.start()
        wait_for(
            lambda: get(self.url + "/healthz")[0] == 200 or not self.process.alive(),  # type: ignore[union-attr]
            timeout=60,
            what=lambda: self.process.log()[-3000:],  # type: ignore[union-attr]
        )
        assert self.process.alive(), self.process.log()[-3000:]
        return self

    def metric(self, name: str) -> float | None:
        """A sample of the replica's /metrics (``name`` with its labels), if shown."""
        status, body = get(self.url + "/metrics")
        if status != 200:
            return None
        found = re.search(rf"^{re.escape(name)} (\S+)$", body.decode(), flags=re.M)
        return float(found.group(1)) if found else None

    def wait_metric(self, name: str, check: Callable[[float], bool], timeout: float = 20) -> None:
        wait_for(
            lambda: (v := self.metric(name)) is not None and check(v),
            timeout=timeout,
            what=lambda: f"{self.name}: {name} = {self.metric(name)}",
        )


@dataclass
class Answer:
    status: int
    episode_id: str
    body: bytes
    headers: dict[str, str]


async def call(
    http: aiohttp.ClientSession,
    replica: Replica,
    model: str,
    *,
    stream: bool = False,
    max_tokens: int = 4,
    streaming: asyncio.Event | None = None,
) -> Answer:
    """One call in an episode of its own (``streaming`` is set at its first chunk)."""
    async with http.post(replica.url + "/v1/episodes", json={"agent_id": "a"}) as started:
        assert started.status == 200, await started.text()
        episode_id = (await started.json())["episode_id"]
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "max_tokens": max_tokens,
        "seed": 1,
        "stream": stream,
    }
    url = f"{replica.url}/episodes/{episode_id}/v1/chat/completions"
    async with http.post(url, json=body) as answer:
        parts = []
        async for chunk in answer.content.iter_any():
            if streaming is not None:
                streaming.set()
            parts.append(chunk)
        return Answer(answer.status, episode_id, b"".join(parts), dict(answer.headers))


def recorded_calls(settings: Settings, episodes: list[str]) -> dict[str, LlmCall]:
    """episode id -> its llm_call, once every one of them is on the steps topic."""
    found: dict[str, LlmCall] = {}

    def read() -> bool:
        records = read_topic(
            settings.kafka.bootstrap_servers, settings.topics.steps, count=1, timeout=30, settle=0.3
        )
        for record in records:
            event = decode_event(record.value)
            if isinstance(event, Step) and event.call is not None:
                found[event.episode_id] = event.call
        return all(e in found for e in episodes)

    wait_for(read, timeout=30, interval=0.5, what=lambda: f"llm_calls of {episodes}: {found}")
    return {e: found[e] for e in episodes}


def recorded_versions(settings: Settings, episodes: list[str]) -> dict[str, Any]:
    """episode id -> the weight_version of its llm_call."""
    return {e: call.weight_version for e, call in recorded_calls(settings, episodes).items()}


def error_code(answer: Answer) -> str:
    return str(json.loads(answer.body)["error"]["code"])
