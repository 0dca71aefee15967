"""A gateway for a test and an agent driving it with the official OpenAI SDK: a
multi-turn tool-calling loop (named tool choice: a random model never calls a tool
on ``auto``), streaming or not, which keeps every request it made so the test can
send the same requests to vLLM directly and compare what vLLM sampled with what
the steps topic holds."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from openai import OpenAI

from stream_export.contract.decoding import decode_event
from stream_export.contract.events import EpisodeEnd, Step, StepEvent
from stream_export.settings import Settings
from tests.support.monitoring import free_port, get
from tests.support.processes import Gateway
from tests.support.topic_reader import read_topic
from tests.support.vllm_server import WEATHER, VllmServer
from tests.support.waiting import wait_for

Json = dict[str, Any]
NAMED: Json = {"type": "function", "function": {"name": "get_weather"}}


def base(settings: Settings) -> str:
    return f"http://{settings.gateway.host}:{settings.gateway.port}"


@contextmanager
def running(settings: Settings, log: Path, prelude: str | None = None) -> Iterator[Gateway]:
    """The gateway as a child process (``prelude``: Python its process runs first),
    answering; stopped afterwards."""
    gateway = Gateway(settings, log, prelude=prelude)
    gateway.start()
    try:
        wait_for(
            lambda: get(base(settings) + "/healthz")[0] == 200 or not gateway.alive(),
            timeout=60,
            what=gateway.log,
        )
        assert gateway.alive(), gateway.log()
        yield gateway
    finally:
        gateway.stop()


def post(url: str, body: Json, key: str | None = None) -> tuple[int, Json, dict[str, str]]:
    """(status, decoded body, headers) of a JSON POST."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.load(answer), dict(answer.headers)
    except urllib.error.HTTPError as failed:
        return failed.code, json.loads(failed.read() or b"{}"), dict(failed.headers)


def start_episode(settings: Settings, **fields: Any) -> Json:
    status, body, _ = post(
        base(settings) + "/v1/episodes",
        {"agent_id": "weather-agent", "prompt": "Weather?", **fields},
    )
    assert status == 200, body
    return body


@dataclass
class Agent:
    """A tool-calling agent on the OpenAI SDK; ``sent`` holds each request's body."""

    client: OpenAI
    model: str
    stream: bool = False
    sent: list[Json] = field(default_factory=list)
    messages: list[Json] = field(
        default_factory=lambda: [
            {"role": "system", "content": "Use the tools."},
            {"role": "user", "content": "Weather in Oslo and Lima?"},
        ]
    )

    def call(self, seed: int, tool_choice: Any, max_tokens: int) -> Json:
        """One call; the assistant message it answered, appended to the conversation."""
        body = {
            "model": self.model,
            "messages": [dict(m) for m in self.messages],
            "tools": [WEATHER],
            "tool_choice": tool_choice,
            "max_tokens": max_tokens,
            "seed": seed,
        }
        self.sent.append(body)
        if self.stream:
            message = _streamed(self.client.chat.completions.create(**body, stream=True))
        else:
            answer = self.client.chat.completions.create(**body)
            assert answer.choices[0].logprobs is None  # the gateway stripped what it added
            assert "prompt_token_ids" not in (answer.model_extra or {})
            message = answer.choices[0].message.model_dump(exclude_none=True)
        message = {k: v for k, v in message.items() if k in ("role", "content", "tool_calls")}
        self.messages.append(message)
        return message

    def loop(self, turns: int) -> None:
        """``turns`` calls that must call the tool, each answered, then one plain call."""
        for turn in range(turns):
            message = self.call(seed=turn + 1, tool_choice=NAMED, max_tokens=60)
            for tool_call in message["tool_calls"]:
                city = json.loads(tool_call["function"]["arguments"])["city"]
                self.messages.append(
                    {"role": "tool", "tool_call_id": tool_call["id"], "content": f"{city}: sun"}
                )
        self.call(seed=99, tool_choice="none", max_tokens=8)


def _streamed(chunks: Any) -> Json:
    """The assistant message a stream of chunks spells."""
    content: list[str] = []
    calls: dict[int, Json] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            content.append(delta.content or "")
            for part in delta.tool_calls or []:
                call = calls.setdefault(
                    part.index,
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] = part.id or call["id"]
                if part.function is not None:
                    call["function"]["name"] += part.function.name or ""
                    call["function"]["arguments"] += part.function.arguments or ""
    message: Json = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return {k: v for k, v in message.items() if v is not None}


def events(settings: Settings, count: int, episode_id: str) -> list[StepEvent]:
    """The episode's events on the steps topic, once ``count`` of them arrived."""
    records = read_topic(
        settings.kafka.bootstrap_servers, settings.topics.steps, count=count, timeout=60
    )
    found = [decode_event(r.value) for r in records if r.key == episode_id.encode()]
    return found


def full_prompts(steps: list[Step]) -> dict[int, list[int]]:
    """Each llm_call step's whole prompt, its delta put back together (seq -> ids)."""
    prompts: dict[int, list[int]] = {}
    for step in steps:
        call = step.call
        if call is None:
            continue
        if call.prompt_base is None:
            prompts[step.seq] = list(call.prompt_token_ids)
        else:
            base_call = next(s.call for s in steps if s.seq == call.prompt_base)
            assert base_call is not None
            prompts[step.seq] = (
                prompts[call.prompt_base]
                + list(base_call.completion_token_ids)
                + list(call.prompt_token_ids)
            )
    return prompts


@pytest.fixture
def gateway_for(
    settings_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> Callable[..., Settings]:
    """Settings of a gateway in front of the test vLLM, with these overrides."""

    def make(*overrides: str) -> Settings:
        return settings_for(
            f"gateway.upstreams={vllm_server.url}/v1",
            f"gateway.port={free_port()}",
            f"gateway.state_dir={tmp_path / 'gateway'}",
            "gateway.ack_timeout_s=3",
            "gateway.retry_after_s=1",
            *overrides,
        )

    return make


def assert_vllm_sampled_what_was_recorded(
    vllm_server: VllmServer, sent: list[dict[str, object]], steps: list[Step]
) -> None:
    """Each recorded call carries exactly the prompt ids, completion ids and logprobs
    vLLM gives for the same request (same seed) asked directly."""
    calls = [s for s in steps if s.kind == "llm_call"]
    prompts = full_prompts(steps)
    assert len(calls) == len(sent)
    for step, body in zip(calls, sent, strict=True):
        direct = vllm_server.post(
            "/v1/chat/completions", {**body, "logprobs": True, "return_token_ids": True}
        )
        (choice,) = direct["choices"]
        assert step.call is not None
        assert prompts[step.seq] == direct["prompt_token_ids"]
        assert step.call.completion_token_ids == choice["token_ids"]
        assert step.call.logprobs == [e["logprob"] for e in choice["logprobs"]["content"]]
        assert step.call.finish_reason == choice["finish_reason"]


def key_bound_agent(
    settings: Settings, vllm_server: VllmServer, **fields: Any
) -> tuple[str, Agent]:
    """A new episode (with these start fields) and an SDK agent whose API key binds
    its calls to it."""
    key: str = start_episode(settings, **fields)["episode_id"]
    client = OpenAI(base_url=base(settings) + "/v1", api_key=key, max_retries=0)
    return key, Agent(client, vllm_server.model)


def ended_records(settings: Settings, keys: list[str]) -> dict[str, list[bytes]]:
    """Every record of these episodes on the steps topic, once all their ends arrived."""

    async def read() -> dict[str, list[bytes]]:
        consumer = AIOKafkaConsumer(
            settings.topics.steps,
            bootstrap_servers=settings.kafka.bootstrap_servers,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        found: dict[str, list[bytes]] = defaultdict(list)
        ended: set[str] = set()
        try:
            async with asyncio.timeout(60):
                while not ended >= set(keys):
                    for batch in (await consumer.getmany(timeout_ms=500)).values():
                        for record in batch:
                            key = record.key.decode()
                            found[key].append(record.value)
                            if isinstance(decode_event(record.value), EpisodeEnd):
                                ended.add(key)
                for batch in (await consumer.getmany(timeout_ms=1000)).values():
                    for record in batch:  # copies sent after the ends, if any
                        found[record.key.decode()].append(record.value)
        finally:
            await consumer.stop()
        return found

    return asyncio.run(read())


def metric(settings: Settings, sample: str) -> float:
    """One sample's value on the gateway's /metrics (fails when it is not there)."""
    text = get(base(settings) + "/metrics")[1].decode()
    (line,) = [line for line in text.splitlines() if line.startswith(sample + " ")]
    return float(line.split()[-1])


def reaches(settings: Settings, sample: str, value: float) -> Callable[[], bool]:
    """Whether the sample has this value now (for wait_for)."""
    return lambda: metric(settings, sample) == value


def events_of(settings: Settings, key: str) -> list[object]:
    """Every event of one episode on the steps topic, its end included."""
    found: list[object] = []

    def ended() -> bool:
        found[:] = events(settings, count=1, episode_id=key)
        return any(isinstance(e, EpisodeEnd) for e in found)

    wait_for(ended, timeout=60, what=f"the end of {key} on the steps topic")
    return found
