"""A call over a lag bound waits for the lag to drop (gateway.retry_after_s at most)
before the gateway refuses it: answered 429 at once, the live loop's agents came
back only after Retry-After, a second or more after the trainer acknowledged."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
import openai
import pytest

from stream_export.contract.topics import topic_names
from stream_export.feed import Feed
from stream_export.kafka import topics
from stream_export.settings import Settings
from tests.support.gateway_agent import base, gateway_for, key_bound_agent, metric, running
from tests.support.group_records import group, rollout
from tests.support.monitoring import get, get_json
from tests.support.producer import produce
from tests.support.vllm_server import VllmServer
from tests.support.waiting import wait_for

__all__ = ["gateway_for"]  # the fixture

THROTTLED = 'stream_export_gateway_calls_total{endpoint="chat",outcome="throttled"}'
GROUP_CALLS = "stream_export_gateway_group_calls_total"


def lag_bound_gateway(
    gateway_for: Callable[..., Settings], max_feed_lag: int = 2, retry_after_s: int = 30
) -> Settings:
    """A gateway bounding the trainer feed's lag at 2 groups, with a long Retry-After:
    measured every 30 s only, a lag would stay where it was for a whole call."""
    settings = gateway_for(
        "groups.enabled=true",
        "gateway.feed_group=trainer",
        f"gateway.max_feed_lag={max_feed_lag}",
        f"gateway.retry_after_s={retry_after_s}",
    )
    asyncio.run(topics.ensure(settings))
    return settings


def publish_groups(settings: Settings, prefix: str) -> None:
    """Four closed groups of two rollouts on the groups topic: a feed lag of 4."""
    records = [
        group(f"{prefix}{i}", [rollout(f"{i}a", 1.0), rollout(f"{i}b", 0.0)]) for i in range(4)
    ]
    messages = [(r.group_id.encode(), msgspec.json.encode(r)) for r in records]
    groups_topic = topic_names(settings.worker.app_id)[1]
    asyncio.run(produce(settings.kafka.bootstrap_servers, groups_topic, messages))


def test_a_call_over_the_feed_lag_goes_through_once_the_trainer_acknowledges(
    gateway_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> None:
    # the lag would stay over its bound for the whole call unless the held call
    # has it measured again
    settings = lag_bound_gateway(gateway_for)
    publish_groups(settings, "g")
    with (
        running(settings, tmp_path / "gateway.log"),
        Feed(settings, group_id="trainer", batch_size=4) as feed,
        ThreadPoolExecutor(1) as pool,
    ):
        wait_for(
            lambda: get_json(base(settings) + "/healthz")["throttled"],
            timeout=30,
            what="the gateway to see the trainer's lag",
        )
        batch = feed.next_batch(timeout_s=30)
        _, agent = key_bound_agent(settings, vllm_server)
        call = pool.submit(agent.call, seed=1, tool_choice="none", max_tokens=2)
        batch.ack()  # the lag drops to 0 while the call waits
        call.result(timeout=60)  # answered, not refused
        metrics = get(base(settings) + "/metrics")[1].decode()
        assert f"{THROTTLED} 0.0" in metrics or THROTTLED not in metrics


def test_a_call_has_the_lag_measured_again_at_once(
    gateway_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> None:
    """Measured every retry_after_s only, a lag that grew let the agents' calls through
    for seconds past the bound (the live loop's staleness)."""
    settings = lag_bound_gateway(gateway_for)
    with running(settings, tmp_path / "gateway.log"):
        wait_for(
            lambda: get_json(base(settings) + "/healthz")["feed_lag"] == 0,
            timeout=30,
            what="the gateway's first measurement",
        )
        publish_groups(settings, "h")
        _, agent = key_bound_agent(settings, vllm_server)
        agent.call(seed=1, tool_choice="none", max_tokens=2)  # before the next measurement
        wait_for(  # not 30 s later
            lambda: get_json(base(settings) + "/healthz")["throttled"],
            timeout=10,
            what="the gateway to measure the lag again after a call",
        )


def test_a_lag_holds_the_start_of_a_group_never_the_rest_of_one(
    gateway_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> None:
    """Held per call, a group was cut in two: with max_feed_lag=0 its first rollouts
    went through, the others waited for the trainer, which waited for that group."""
    settings = lag_bound_gateway(gateway_for, max_feed_lag=0, retry_after_s=2)
    with running(settings, tmp_path / "gateway.log"), ThreadPoolExecutor(3) as pool:
        wait_for(
            lambda: get_json(base(settings) + "/healthz")["feed_lag"] == 0,
            timeout=30,
            what="the gateway's first measurement",
        )
        group = {"group_id": "admitted", "group_size": 3}
        agents = [key_bound_agent(settings, vllm_server, **group)[1] for _ in range(4)]
        agents[0].call(seed=1, tool_choice="none", max_tokens=2)  # under the bound
        publish_groups(settings, "w")  # the trainer's lag: 4 groups over a bound of 0
        wait_for(
            lambda: get_json(base(settings) + "/healthz")["throttled"],
            timeout=30,
            what="the gateway to see the trainer's lag",
        )
        # the admitted group's other episodes, and a second call of its first one
        for agent in (agents[1], agents[2], agents[0]):
            agent.call(seed=3, tool_choice="none", max_tokens=2)
        # over the bound: a new group's first call, an ungrouped episode's call and
        # the call of a fourth episode of the group of three are held, then refused
        held = [
            key_bound_agent(settings, vllm_server, group_id="new", group_size=3)[1],
            key_bound_agent(settings, vllm_server)[1],
            agents[3],
        ]
        refused = [pool.submit(a.call, seed=2, tool_choice="none", max_tokens=2) for a in held]
        for call in refused:
            with pytest.raises(openai.RateLimitError):
                call.result(timeout=60)
        assert get_json(base(settings) + "/healthz")["throttled"]  # all the while
        assert metric(settings, GROUP_CALLS) == 3
        assert metric(settings, THROTTLED) == 3
