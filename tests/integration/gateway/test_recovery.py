"""The gateway recovering from faults, with real parts (its own broker, the real
vLLM): a broker restart while 16 agents call (capture resumes within seconds, and
every answered call and every accepted end is on the steps topic once), a
delivery Kafka refuses (the producer takes a new producer id, so the partition's
next deliveries go through), and an upstream that dies mid-stream (the tokens
streamed are recorded as an aborted call)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from stream_export.client import Producer
from stream_export.contract.decoding import decode_event
from stream_export.contract.events import EpisodeEnd, EpisodeStart, Step
from stream_export.settings import Settings
from tests.support import relay
from tests.support.gateway_agent import (
    base,
    ended_records,
    events,
    gateway_for,
    post,
    running,
    start_episode,
)
from tests.support.gateway_fleet import Fleet, FleetAgent
from tests.support.monitoring import get
from tests.support.own_broker import Broker
from tests.support.vllm_server import VllmServer

pytestmark = pytest.mark.integration
__all__ = ["gateway_for"]  # the fixture, shared

AGENTS = 16
#: Longer than the gateway's ack timeout (3 s here): aiokafka then gives up the
#: batches it holds for partitions without a leader, which broke its producer.
OUTAGE_S = 10.0
#: Calls each agent has answered before the broker stops (the load at full pace).
BEFORE = 10


def test_a_broker_restart_under_16_agents_records_every_answered_call_and_end_once(
    gateway_for: Callable[..., Settings],
    vllm_server: VllmServer,
    own_broker: Broker,
    tmp_path: Path,
) -> None:
    settings = gateway_for(f"kafka.bootstrap_servers={own_broker.address}")
    with running(settings, tmp_path / "gateway.log") as gateway:
        agents, resumed_s = asyncio.run(
            restart_under_load(base(settings), vllm_server.model, own_broker)
        )
        log = gateway.log()
    found = ended_records(settings, [a.key for a in agents])
    print(f"capture resumed {resumed_s:.1f} s after the broker was back")
    assert resumed_s < 30, resumed_s  # the bar is seconds; loose for a loaded machine
    assert sum(a.refused[503] for a in agents) >= AGENTS // 2  # refused while down
    suppressed = [int(n) for n in re.findall(r"suppressed=(\d+)", log)]
    assert max(suppressed, default=0) < 2000, suppressed  # no hot reconnect loop
    for agent in agents:
        check_recorded_once(agent, found[agent.key])


def test_a_delivery_kafka_refuses_leaves_the_next_ones_of_its_partition_acknowledged(
    kafka_bootstrap: str, unique: Callable[[str], str]
) -> None:
    """A failed delivery consumed sequence numbers the broker never saw (aiokafka gives
    up a batch whose partition has had no leader for the ack timeout, as while the
    broker restarts under load; here the broker refuses a record too large for the
    topic): aiokafka then sent every later batch of that partition out of sequence,
    refused for good, so the gateway answered nothing after a broker restart. The
    producer is replaced after such a failure: the next deliveries are acknowledged."""
    topic = unique("small")

    async def run() -> list[bool]:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            config = {"max.message.bytes": "2000"}
            await admin.create_topics([NewTopic(topic, 1, 1, topic_configs=config)])
        finally:
            await admin.close()
        async with Producer(kafka_bootstrap, topic=topic, timeout_s=5) as producer:
            small, large = [b"x" * 100], [b"x" * 5000]
            return [await producer.deliver(b"k", v, 5) for v in (small, large, small, small)]

    assert asyncio.run(run()) == [True, False, True, True]


async def restart_under_load(
    base_url: str, model: str, broker: Broker
) -> tuple[list[FleetAgent], float]:
    """16 agents calling; the broker stopped for OUTAGE_S and started again. Half of
    the agents end their episode during the outage (refused, then sent again until
    accepted); the others keep calling through it and make 3 more answered calls
    after it, then end. Returns the agents and how soon after the broker was back a
    call was answered."""
    deadline = time.monotonic() + 240
    down, up = asyncio.Event(), asyncio.Event()
    async with Fleet(base_url, model, AGENTS) as fleet:

        async def agent_life(agent: FleetAgent) -> None:
            await fleet.start(agent, deadline)
            seed = 0
            while not down.is_set() or not agent.answered:
                seed += 1
                await fleet.call(agent, seed)
            if agent.number % 2 == 0:
                await fleet.end(agent, deadline)
                return
            while not up.is_set():
                seed += 1
                await fleet.call(agent, seed)
            after = len(agent.answered) + 3
            while len(agent.answered) < after:
                assert time.monotonic() < deadline, f"agent {agent.number}: {agent.refused}"
                seed += 1
                await fleet.call(agent, seed)
            await fleet.end(agent, deadline)

        lives = asyncio.gather(*(agent_life(a) for a in fleet.agents))
        while not all(len(a.answered) >= BEFORE for a in fleet.agents):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        await asyncio.to_thread(broker.stop)
        down.set()
        await asyncio.sleep(OUTAGE_S)
        await asyncio.to_thread(broker.start)
        back = time.monotonic()
        up.set()
        await lives
    resumed = min(t for t in fleet.answer_times if t > back) - back
    return fleet.agents, resumed


def check_recorded_once(agent: FleetAgent, records: list[bytes]) -> None:
    """Each event of the episode is on the topic as identical copies only (which the
    worker drops), its steps numbered without a gap, every call the agent saw
    answered recorded at exactly one seq, and its end as the agent sent it."""
    by_event: dict[tuple[str, int], set[bytes]] = defaultdict(set)
    for value in records:
        event = decode_event(value)
        seq = event.seq if isinstance(event, Step) else -1
        by_event[(type(event).__name__, seq)].add(value)
    assert all(len(copies) == 1 for copies in by_event.values()), agent.number
    events = {k: decode_event(next(iter(v))) for k, v in by_event.items()}
    assert isinstance(events.pop(("EpisodeStart", -1)), EpisodeStart)
    end = events.pop(("EpisodeEnd", -1))
    assert isinstance(end, EpisodeEnd) and agent.ended is not None
    assert (end.outcome, end.reward, end.steps) == ("success", agent.number, agent.ended["steps"])
    steps = [e for e in events.values() if isinstance(e, Step)]
    assert sorted(s.seq for s in steps) == list(range(end.steps)), agent.number
    recorded = [s.call.request_id for s in steps if s.call is not None]
    assert len(recorded) == len(set(recorded)) == len(steps)  # no call twice
    assert set(agent.answered) <= set(recorded), agent.number


def test_a_stream_whose_upstream_dies_is_recorded_as_an_aborted_call(
    gateway_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> None:
    """The tokens streamed before the upstream died were sampled and reached the
    agent: they are recorded, as a call the client left is (finish_reason
    "aborted"), and the agent's stream ends with the error instead of [DONE]."""
    body = {
        "model": vllm_server.model,
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "max_tokens": 150,
        "seed": 5,
        "stream": True,
        "return_token_ids": True,
    }
    with relay.running(vllm_server.url) as (url, kill):
        settings = gateway_for(f"gateway.upstreams={url}/v1")
        with running(settings, tmp_path / "gateway.log"):
            key = start_episode(settings)["episode_id"]
            request = urllib.request.Request(
                f"{base(settings)}/episodes/{key}/v1/chat/completions",
                json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )
            chunks = []
            with urllib.request.urlopen(request, timeout=60) as answer:
                for line in answer:
                    if line.startswith(b"data: "):
                        chunks.append(json.loads(line[6:]))
                    if len(chunks) == 4:
                        kill()  # the upstream dies mid-stream
            metrics = get(base(settings) + "/metrics")[1].decode()
            post(f"{base(settings)}/v1/episodes/{key}/end", {"outcome": "failure"})
    *streamed, last = chunks
    assert "error" in last and all("choices" in c for c in streamed)
    seen = [i for c in streamed for choice in c["choices"] for i in choice.get("token_ids") or []]
    assert 'stream_export_gateway_calls_total{endpoint="chat",outcome="aborted"} 1.0' in metrics
    (step,) = [e for e in events(settings, count=3, episode_id=key) if isinstance(e, Step)]
    assert step.call is not None and step.call.finish_reason == "aborted"
    assert step.call.completion_token_ids == seen  # what reached the agent, no more
    direct = vllm_server.post("/v1/chat/completions", {**body, "stream": False, "logprobs": True})
    sampled = direct["choices"][0]["token_ids"]
    assert 2 <= len(seen) < len(sampled) == 150 and seen == sampled[: len(seen)]
    assert step.call.prompt_token_ids == direct["prompt_token_ids"]
