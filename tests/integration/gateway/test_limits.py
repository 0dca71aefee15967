"""The gateway's limits with real parts (the real broker, the real vLLM, the OpenAI
SDK): upstream retries that never record a call twice, 429 backpressure on the
workers' lag, text-only capture, the outbox bound during a broker outage, clients
that leave, client keys, size bounds and the upstream key never shown."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import openai
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from openai import OpenAI

from stream_export.contract.events import Step
from stream_export.gateway.upstream import pick
from stream_export.settings import Settings
from tests.support.gateway_agent import (
    Agent,
    assert_vllm_sampled_what_was_recorded,
    base,
    events_of,
    gateway_for,
    key_bound_agent,
    metric,
    post,
    reaches,
    running,
    start_episode,
)
from tests.support.monitoring import free_port, get, get_json
from tests.support.own_broker import Broker
from tests.support.topic_reader import read_topic
from tests.support.vllm_server import VllmServer
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration
__all__ = ["gateway_for"]  # the fixture, shared


def episodes_on(settings: Settings, urls: list[str], upstream: str) -> Iterator[str]:
    """Ids of new episodes whose calls go first to ``upstream``."""
    while True:
        key: str = start_episode(settings)["episode_id"]
        if pick(urls, key, 0) == upstream:
            yield key


def test_a_call_is_retried_on_the_next_upstream_and_recorded_once(
    gateway_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    settings = gateway_for(f"gateway.upstreams={dead},{vllm_server.url}/v1")
    with running(settings, tmp_path / "gateway.log"):
        key = next(episodes_on(settings, [dead, vllm_server.url + "/v1"], dead))
        client = OpenAI(base_url=f"{base(settings)}/episodes/{key}/v1", api_key="-", max_retries=0)
        agent = Agent(client, vllm_server.model)
        agent.call(seed=1, tool_choice="none", max_tokens=4)
        agent.stream = True
        agent.messages.append({"role": "user", "content": "More?"})
        agent.call(seed=2, tool_choice="none", max_tokens=4)
        raw = client.completions.with_raw_response.create(
            model=vllm_server.model, prompt="Once", max_tokens=3, seed=3
        )
        assert raw.status_code == 200
        request_id = raw.headers["x-request-id"]
        retries = metric(settings, "stream_export_gateway_upstream_retries_total")
        status, ended, _ = post(f"{base(settings)}/v1/episodes/{key}/end", {"outcome": "success"})
        assert (status, ended["steps"]) == (200, 3), ended
    assert retries == 3  # each call: the dead upstream once, then vLLM
    found = [e for e in events_of(settings, key) if isinstance(e, Step)]
    assert [(s.seq, s.kind) for s in found] == [(0, "llm_call"), (1, "llm_call"), (2, "llm_call")]
    assert_vllm_sampled_what_was_recorded(vllm_server, agent.sent, found[:2])
    assert found[2].call is not None and found[2].call.request_id == f"cmpl-{request_id}"


def commit_all(settings: Settings) -> None:
    """Commit the worker group's offsets at the steps topic's end (as a worker that
    caught up would)."""

    async def commit() -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.kafka.bootstrap_servers,
            group_id=settings.worker.app_id,
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            topic = settings.topics.steps
            partitions = [TopicPartition(topic, p) for p in range(settings.topics.partitions)]
            consumer.assign(partitions)
            ends = await consumer.end_offsets(partitions)
            await consumer.commit(dict(ends.items()))
        finally:
            await consumer.stop()

    asyncio.run(commit())


def test_calls_answer_429_while_the_workers_lag_too_far_and_resume_once_they_catch_up(
    gateway_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> None:
    settings = gateway_for("gateway.max_consumer_lag=3")
    with running(settings, tmp_path / "gateway.log"):
        key, agent = key_bound_agent(settings, vllm_server)
        for seed in range(3):  # no worker consumes: the start and 3 calls are 4 behind
            agent.call(seed=seed, tool_choice="none", max_tokens=2)
        health = wait_for(
            lambda: (h := get_json(base(settings) + "/healthz")) and h["throttled"] and h,
            timeout=30,
            what="the gateway to see the lag",
        )
        assert health["consumer_lag"] == 4
        with pytest.raises(openai.RateLimitError) as throttled:
            agent.call(seed=9, tool_choice="none", max_tokens=2)
        assert throttled.value.response.headers["Retry-After"] == "1"
        assert "lag 4 events behind" in str(throttled.value)
        agent.sent.pop()
        assert metric(settings, "stream_export_gateway_consumer_lag") == 4
        assert (
            metric(
                settings,
                'stream_export_gateway_calls_total{endpoint="chat",outcome="throttled"}',
            )
            == 1
        )
        commit_all(settings)
        wait_for(
            lambda: get_json(base(settings) + "/healthz")["consumer_lag"] == 0,
            timeout=30,
            what="the gateway to see the workers caught up",
        )
        agent.call(seed=9, tool_choice="none", max_tokens=2)
        post(f"{base(settings)}/v1/episodes/{key}/end", {"outcome": "success"})
    steps = [e for e in events_of(settings, key) if isinstance(e, Step)]
    assert [s.seq for s in steps] == [0, 1, 2, 3]  # the throttled call was never made
    assert_vllm_sampled_what_was_recorded(vllm_server, agent.sent, steps)


def test_an_upstream_without_token_ids_is_recorded_text_only(
    gateway_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> None:
    settings = gateway_for("gateway.capture_tokens=false")
    with running(settings, tmp_path / "gateway.log"):
        key, agent = key_bound_agent(settings, vllm_server)
        answers = [agent.call(seed=1, tool_choice="none", max_tokens=5)]
        agent.stream = True
        agent.messages.append({"role": "user", "content": "More?"})
        answers.append(agent.call(seed=2, tool_choice="none", max_tokens=5))
        text_only = metric(settings, "stream_export_gateway_text_only_calls_total")
        tokens = metric(settings, 'stream_export_gateway_tokens_total{kind="completion"}')
        post(f"{base(settings)}/v1/episodes/{key}/end", {"outcome": "success"})
    assert (text_only, tokens) == (2, 0)
    steps = [e for e in events_of(settings, key) if isinstance(e, Step)]
    assert [(s.seq, s.kind) for s in steps] == [(0, "llm_call"), (1, "llm_call")]
    for step, answer, sent in zip(steps, answers, agent.sent, strict=True):
        call = step.call
        assert call is not None
        assert (call.prompt_token_ids, call.completion_token_ids, call.logprobs) == ([], [], [])
        assert call.prompt_base is None and call.model == vllm_server.model
        assert call.response.content == answer["content"]
        assert [m.role for m in call.request.messages] == [m["role"] for m in sent["messages"]]
        direct = vllm_server.post("/v1/chat/completions", sent)
        assert direct["choices"][0]["message"]["content"] == answer["content"]


def raw_call(settings: Settings, key: str, body: dict[str, object], timeout: float) -> int:
    """POST a chat call as a client that leaves after ``timeout`` seconds: its status,
    or 0 when it left first."""
    request = urllib.request.Request(
        f"{base(settings)}/episodes/{key}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as failed:
        return failed.code
    except TimeoutError:
        return 0


def test_a_long_outage_fills_the_outbox_to_its_bound_and_a_client_that_left_is_recorded_once(
    gateway_for: Callable[..., Settings],
    vllm_server: VllmServer,
    own_broker: Broker,
    tmp_path: Path,
) -> None:
    """on_kafka_down=answer: calls are answered unrecorded until the outbox holds
    gateway.max_outbox_bytes, then refused (503 outbox_full). A client that leaves
    while the gateway waits for Kafka changes nothing: its call is recorded once,
    when the broker is back, like every call answered during the outage."""
    settings = gateway_for(
        f"kafka.bootstrap_servers={own_broker.address}",
        "gateway.on_kafka_down=answer",
        "gateway.max_outbox_bytes=1024",
    )
    with running(settings, tmp_path / "gateway.log"):
        key, agent = key_bound_agent(settings, vllm_server)
        agent.messages.append({"role": "user", "content": "A long question. " * 20})
        agent.call(seed=1, tool_choice="none", max_tokens=3)
        own_broker.stop()
        left = {**agent.sent[-1], "seed": 2}
        assert raw_call(settings, key, left, timeout=1.0) == 0  # the ack takes 3 s
        unrecorded = 'stream_export_gateway_calls_total{endpoint="chat",outcome="unrecorded"}'
        wait_for(reaches(settings, unrecorded, 1), timeout=30, what=unrecorded)
        assert metric(settings, "stream_export_gateway_unrecorded_calls_total") == 1
        assert metric(settings, "stream_export_gateway_outbox_bytes") > 1024
        with pytest.raises(openai.InternalServerError) as refused:
            agent.call(seed=3, tool_choice="none", max_tokens=3)
        agent.sent.pop()
        assert refused.value.status_code == 503
        assert refused.value.response.headers["Retry-After"] == "1"
        assert refused.value.code == "outbox_full"
        own_broker.start()
        wait_for(
            reaches(settings, "stream_export_gateway_outbox_bytes", 0),
            timeout=90,
            what="the outbox sent once the broker is back",
        )
        agent.call(seed=4, tool_choice="none", max_tokens=3)
        end = f"{base(settings)}/v1/episodes/{key}/end"
        status, ended, _ = post(end, {"outcome": "success"})
        assert (status, ended["steps"]) == (200, 3), ended
        full = 'stream_export_gateway_calls_total{endpoint="chat",outcome="outbox_full"}'
        assert metric(settings, full) == 1
    copies: dict[int, set[bytes]] = {}
    for event in events_of(settings, key):
        if isinstance(event, Step):
            copies.setdefault(event.seq, set()).add(msgspec.json.encode(event))
    assert sorted(copies) == [0, 1, 2]
    assert all(len(same) == 1 for same in copies.values())  # copies are identical
    steps = [msgspec.json.decode(next(iter(copies[seq])), type=Step) for seq in range(3)]
    recorded = [agent.sent[0], left, agent.sent[1]]
    assert_vllm_sampled_what_was_recorded(vllm_server, recorded, steps)


def test_a_stream_the_client_leaves_is_recorded_as_an_aborted_call(
    gateway_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> None:
    settings = gateway_for()
    body = {
        "model": vllm_server.model,
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "max_tokens": 150,
        "seed": 5,
        "stream": True,
    }
    with running(settings, tmp_path / "gateway.log"):
        key = start_episode(settings)["episode_id"]
        request = urllib.request.Request(
            f"{base(settings)}/episodes/{key}/v1/chat/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            chunks = [line for line in itertools.islice(answer, 6) if line.strip()]
        assert len(chunks) == 3 and all(c.startswith(b"data: {") for c in chunks)
        aborted = 'stream_export_gateway_calls_total{endpoint="chat",outcome="aborted"}'
        wait_for(reaches(settings, aborted, 1), timeout=30, what=aborted)
        post(f"{base(settings)}/v1/episodes/{key}/end", {"outcome": "failure"})
    (step,) = [e for e in events_of(settings, key) if isinstance(e, Step)]
    assert step.call is not None and step.call.finish_reason == "aborted"
    direct = vllm_server.post(
        "/v1/chat/completions",
        {**body, "stream": False, "logprobs": True, "return_token_ids": True},
    )
    sampled = direct["choices"][0]["token_ids"]
    got = step.call.completion_token_ids
    assert 2 <= len(got) < len(sampled) == 150  # as far as it went, not further
    assert got == sampled[: len(got)]
    assert step.call.prompt_token_ids == direct["prompt_token_ids"]


def test_client_keys_size_bounds_and_the_upstream_key_never_shown(
    gateway_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# the team's key\n\nteam-key-1\n")
    upstream_key = "sk-upstream-never-shown"
    settings = gateway_for(
        f"gateway.api_keys_file={keys}",
        f"gateway.upstream_api_key={upstream_key}",
        "gateway.max_request_bytes=2048",
        "gateway.max_response_bytes=1024",
    )
    seen: list[bytes] = []
    with running(settings, tmp_path / "gateway.log") as gateway:
        start = base(settings) + "/v1/episodes"
        assert post(start, {"agent_id": "a"})[0] == 401
        assert post(start, {"agent_id": "a"}, key="team-key-2")[0] == 401
        assert get(base(settings) + "/v1/models")[0] == 401
        ids = [post(start, {"agent_id": "a"}, key="team-key-1")[1]["episode_id"] for _ in range(2)]
        assert len(set(ids)) == 2
        assert all(re.fullmatch(r"ep-[A-Za-z0-9_-]{43}", key) for key in ids)  # 256 random bits
        key = ids[0]
        path_bound = OpenAI(base_url=f"{base(settings)}/episodes/{key}/v1", api_key="guess")
        with pytest.raises(openai.AuthenticationError):
            path_bound.models.list()
        status, body, _ = post(
            f"{base(settings)}/episodes/ep-{'A' * 43}/v1/chat/completions", {}, key="team-key-1"
        )
        assert (status, body["error"]["code"]) == (404, "episode_not_found")
        chat = f"{base(settings)}/episodes/{key}/v1/chat/completions"
        big = {"model": vllm_server.model, "messages": [{"role": "user", "content": "x" * 3000}]}
        status, body, _ = post(chat, big, key="team-key-1")
        assert (status, body["error"]["code"]) == (413, "request_too_large")
        small = {"model": vllm_server.model, "messages": [{"role": "user", "content": "hi"}]}
        status, body, _ = post(chat, {**small, "max_tokens": 60, "seed": 1}, key="team-key-1")
        assert status == 502 and "larger than 1024 bytes" in body["error"]["message"]
        seen.append(json.dumps(body).encode())
        listed = OpenAI(base_url=f"{base(settings)}/v1", api_key="team-key-1", max_retries=0)
        assert [m.id for m in listed.models.list().data] == [vllm_server.model]
        for path in ("/metrics", "/healthz"):
            seen.append(get(base(settings) + path)[1])
        end = f"{base(settings)}/v1/episodes/{key}/end"
        status, ended, _ = post(end, {}, key="team-key-1")
        assert (status, ended["steps"]) == (200, 0)  # the answer too large was not recorded
        seen.append(gateway.log().encode())
    steps = read_topic(settings.kafka.bootstrap_servers, settings.topics.steps, count=3, timeout=60)
    seen += [record.value for record in steps]
    assert all(upstream_key.encode() not in text for text in seen)
    assert any(b"stream_export_gateway_calls_total" in text for text in seen)


def test_the_metrics_count_calls_tokens_times_and_open_episodes(
    gateway_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> None:
    settings = gateway_for()
    with running(settings, tmp_path / "gateway.log"):
        key = start_episode(settings)["episode_id"]
        assert metric(settings, "stream_export_gateway_open_episodes") == 1
        client = OpenAI(base_url=base(settings) + "/v1", api_key=key, max_retries=0)
        chat = client.chat.completions.create(
            model=vllm_server.model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            seed=1,
        )
        text = client.completions.create(
            model=vllm_server.model, prompt="Once", max_tokens=4, seed=2
        )
        before_end = {
            name: metric(settings, f"stream_export_gateway_{name}")
            for name in (
                'calls_total{endpoint="chat",outcome="recorded"}',
                'calls_total{endpoint="completions",outcome="recorded"}',
                'tokens_total{kind="prompt"}',
                'tokens_total{kind="completion"}',
                "added_seconds_count",
                "upstream_seconds_count",
                "upstream_seconds_sum",
                "unrecorded_calls_total",
            )
        }
        post(f"{base(settings)}/v1/episodes/{key}/end", {"outcome": "success"})
        assert metric(settings, "stream_export_gateway_open_episodes") == 0
    assert chat.usage is not None and text.usage is not None
    prompt = chat.usage.prompt_tokens + text.usage.prompt_tokens
    completion = chat.usage.completion_tokens + text.usage.completion_tokens
    assert completion == 9
    upstream_s = before_end.pop("upstream_seconds_sum")
    assert before_end == {
        'calls_total{endpoint="chat",outcome="recorded"}': 1,
        'calls_total{endpoint="completions",outcome="recorded"}': 1,
        'tokens_total{kind="prompt"}': prompt,
        'tokens_total{kind="completion"}': completion,
        "added_seconds_count": 2,
        "upstream_seconds_count": 2,
        "unrecorded_calls_total": 0,
    }
    assert upstream_s > 0
