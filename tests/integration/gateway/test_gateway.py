"""The gateway with real parts: the official OpenAI SDK running a tool-calling agent
through it, real vLLM behind it, the real broker; what lands on the steps topic is
compared with what vLLM samples for the same requests asked directly (not with the
gateway's own view). Faults: the broker away (503, then recovery), the upstream
failing (its error reaches the client, nothing is recorded), kill -9 mid-episode
(the restarted gateway continues with the next seq)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import openai
import pytest
from openai import OpenAI

from stream_export.contract.events import EpisodeEnd, EpisodeStart, Step
from stream_export.settings import Settings
from tests.support.gateway_agent import (
    Agent,
    assert_vllm_sampled_what_was_recorded,
    base,
    events,
    events_of,
    gateway_for,
    post,
    running,
    start_episode,
)
from tests.support.monitoring import free_port, get
from tests.support.own_broker import Broker
from tests.support.vllm_server import VllmServer
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration
__all__ = ["gateway_for"]  # the fixture, shared


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_sdk_agent_is_recorded_token_for_token(
    gateway_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path, stream: bool
) -> None:
    settings = gateway_for()
    with running(settings, tmp_path / "gateway.log") as gateway:
        assert "gateway.listening" in gateway.log() and "loop=uvloop" in gateway.log()
        episode = start_episode(settings, group_id="weather", group_size=2)
        client = OpenAI(base_url=episode["base_url"], api_key="unused", max_retries=0)
        agent = Agent(client, vllm_server.model, stream=stream)
        agent.loop(turns=2)
        status, ended, _ = post(
            f"{base(settings)}/v1/episodes/{episode['episode_id']}/end",
            {"outcome": "success", "reward": 1.0},
        )
        assert status == 200 and ended["steps"] == 5, ended
        metrics = get(base(settings) + "/metrics")[1].decode()
        assert gateway.stop() == 0, gateway.log()[-3000:]  # a clean stop, on uvloop too
    found = events(settings, count=7, episode_id=episode["episode_id"])
    start, *middle, end = found
    assert isinstance(start, EpisodeStart) and start.group_id == "weather"
    assert isinstance(end, EpisodeEnd) and (end.steps, end.reward) == (5, 1.0)
    steps = [s for s in middle if isinstance(s, Step)]
    assert len(steps) == len(middle)
    assert [(s.seq, s.kind) for s in steps] == [
        (0, "llm_call"),
        (1, "action_result"),
        (2, "llm_call"),
        (3, "action_result"),
        (4, "llm_call"),
    ]
    tool_messages = [m for m in agent.messages if m["role"] == "tool"]
    assert [(s.id, s.content) for s in steps if s.kind == "action_result"] == [
        (m["tool_call_id"], m["content"]) for m in tool_messages
    ]
    for step, message in zip(steps[:4:2], agent.messages[2:6:2], strict=True):
        assert step.call is not None and step.call.response.tool_calls is not None
        assert step.call.response.tool_calls[0].id == message["tool_calls"][0]["id"]
    assert_vllm_sampled_what_was_recorded(vllm_server, agent.sent, steps)
    assert 'stream_export_gateway_calls_total{endpoint="chat",outcome="recorded"} 3.0' in metrics


def test_the_episode_key_binds_plain_base_urls_and_completions_are_recorded(
    gateway_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> None:
    settings = gateway_for()
    with running(settings, tmp_path / "gateway.log"):
        key = start_episode(settings)["episode_id"]
        client = OpenAI(base_url=base(settings) + "/v1", api_key=key, max_retries=0)
        answer = client.completions.create(
            model=vllm_server.model, prompt="Once upon", max_tokens=6, seed=4
        )
        assert answer.choices[0].logprobs is None
        unbound = OpenAI(base_url=base(settings) + "/v1", api_key="nobody", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="bind the call to an episode"):
            unbound.completions.create(model=vllm_server.model, prompt="x", max_tokens=2)
    _, step = events(settings, count=2, episode_id=key)
    direct = vllm_server.post(
        "/v1/completions",
        {
            "model": vllm_server.model,
            "prompt": "Once upon",
            "max_tokens": 6,
            "seed": 4,
            "logprobs": 1,
            "return_token_ids": True,
        },
    )
    (choice,) = direct["choices"]
    assert isinstance(step, Step) and step.call is not None
    assert step.call.prompt_token_ids == choice["prompt_token_ids"]
    assert step.call.completion_token_ids == choice["token_ids"]
    assert step.call.logprobs == choice["logprobs"]["token_logprobs"]
    assert step.call.response.content == answer.choices[0].text


def test_upstream_errors_reach_the_client_and_nothing_is_recorded(
    gateway_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> None:
    down = f"http://127.0.0.1:{free_port()}/v1"
    settings = gateway_for(f"gateway.upstreams={down}")
    with running(settings, tmp_path / "down.log"):
        key = start_episode(settings)["episode_id"]
        client = OpenAI(base_url=base(settings) + "/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.InternalServerError) as refused:
            client.chat.completions.create(
                model=vllm_server.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        assert refused.value.status_code == 502 and "cannot reach the upstream" in str(
            refused.value
        )
        metrics = get(base(settings) + "/metrics")[1].decode()
    assert 'outcome="upstream_error"} 1.0' in metrics
    settings = gateway_for()
    with running(settings, tmp_path / "up.log"):
        other = start_episode(settings)["episode_id"]
        client = OpenAI(base_url=base(settings) + "/v1", api_key=other, max_retries=0)
        with pytest.raises(openai.NotFoundError, match="nope"):  # vLLM's own answer
            client.chat.completions.create(
                model="nope", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        status, _, _ = post(f"{base(settings)}/v1/episodes/{other}/end", {"outcome": "failure"})
        assert status == 200
    _, end = events(settings, count=2, episode_id=other)
    assert isinstance(end, EpisodeEnd) and end.steps == 0  # nothing recorded as a call


def test_kill_9_mid_episode_then_restart_continues_with_the_next_seq(
    gateway_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> None:
    settings = gateway_for()
    with running(settings, tmp_path / "first.log") as gateway:
        episode = start_episode(settings)
        client = OpenAI(base_url=episode["base_url"], api_key="unused", max_retries=0)
        agent = Agent(client, vllm_server.model)
        agent.call(seed=1, tool_choice="none", max_tokens=5)
        agent.messages.append({"role": "user", "content": "And then?"})
        agent.call(seed=2, tool_choice="none", max_tokens=5)
        gateway.kill9()
    with running(settings, tmp_path / "second.log"):
        agent.messages.append({"role": "user", "content": "Last?"})
        agent.call(seed=3, tool_choice="none", max_tokens=5)
        status, ended, _ = post(
            f"{base(settings)}/v1/episodes/{episode['episode_id']}/end", {"outcome": "success"}
        )
        assert (status, ended["steps"]) == (200, 3)
    found = events_of(settings, episode["episode_id"])
    copies: dict[int, list[Step]] = {}
    for step in (e for e in found if isinstance(e, Step)):
        copies.setdefault(step.seq, []).append(step)
    # Nothing renumbered: seqs 0, 1, 2 in order. The kill may land between an
    # event's delivery and the log's (unsynced) "acked" line, so a restarted gateway
    # may send an event again; the copy must be the same event, which the worker
    # drops (wal.py's promise).
    assert list(copies) == [0, 1, 2]
    assert all(all(c == same[0] for c in same) for same in copies.values())
    steps = [same[0] for same in copies.values()]
    assert_vllm_sampled_what_was_recorded(vllm_server, agent.sent, steps)


def test_a_broker_outage_refuses_calls_with_503_then_recovery_records_them(
    gateway_for: Callable[..., Settings],
    vllm_server: VllmServer,
    own_broker: Broker,
    tmp_path: Path,
) -> None:
    settings = gateway_for(f"kafka.bootstrap_servers={own_broker.address}")
    with running(settings, tmp_path / "gateway.log"):
        episode = start_episode(settings)
        client = OpenAI(base_url=episode["base_url"], api_key="unused", max_retries=0)
        agent = Agent(client, vllm_server.model)
        agent.call(seed=1, tool_choice="none", max_tokens=4)
        own_broker.stop()
        with pytest.raises(openai.APIStatusError) as refused:
            agent.call(seed=2, tool_choice="none", max_tokens=4)
        assert refused.value.status_code == 503
        assert refused.value.response.headers["Retry-After"] == "1"
        metrics = get(base(settings) + "/metrics")[1].decode()
        assert 'outcome="refused"} 1.0' in metrics
        own_broker.start()
        agent.sent.pop()
        wait_for(answers(agent), timeout=90, what="a call after the broker is back")
        status, ended, _ = post(
            f"{base(settings)}/v1/episodes/{episode['episode_id']}/end", {"outcome": "success"}
        )
        assert status == 200, ended
    found = events(settings, count=2 + ended["steps"], episode_id=episode["episode_id"])
    steps = [e for e in found if isinstance(e, Step)]
    seqs = [s.seq for s in steps]
    assert sorted(set(seqs)) == list(range(ended["steps"]))  # no gap; copies are identical
    answered = {s.call.request_id for s in steps if s.call is not None}
    assert len(answered) == ended["steps"]


def answers(agent: Agent) -> Callable[[], bool]:
    """Whether the agent's next call is answered (a 503 is not; anything else fails)."""

    def check() -> bool:
        try:
            agent.call(seed=3, tool_choice="none", max_tokens=4)
        except openai.APIStatusError as exc:
            assert exc.status_code == 503, exc
            agent.sent.pop()
            return False
        return True

    return check
