"""Unmodified agents through the gateway into training rows, end to end: agents on
the official OpenAI SDKs (Python, and TypeScript with the `openai` npm package)
run multi-turn tool-calling loops through `stream-export gateway` in front of the
real vLLM; a real worker writes `tokens` rows, and `stream-export export` the
conversational ones. Every row's token ids and logprobs equal what vLLM returned
to those calls, read from vLLM's own answers as a pass-through owned by the test
saw them (tests/support/upstream_recorder.py), never from the gateway's view; the
conversational rows equal the conversation the agent held."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from stream_export.kafka import topics
from stream_export.output.follow import Follower
from stream_export.settings import Settings
from tests.support.gateway_agent import Agent, base, post, running, start_episode
from tests.support.monitoring import exposed_names, free_port, get, referenced_names
from tests.support.processes import Worker, export
from tests.support.token_calls import reference
from tests.support.upstream_recorder import UpstreamRecorder, recording
from tests.support.vllm_server import WEATHER, VllmServer
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

Json = dict[str, Any]
ROOT = Path(__file__).resolve().parents[3]
TS_AGENT = ROOT / "tests" / "agents" / "ts"
MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id")


@dataclass(frozen=True)
class Ran:
    """One agent's episode as the agent saw it: what it sent, the conversation it
    held, and how it ended the episode."""

    episode_id: str
    sent: list[Json]
    messages: list[Json]
    reward: float
    group_id: str


@dataclass(frozen=True)
class Pipeline:
    settings: Settings
    upstream: UpstreamRecorder


@contextmanager
def pipeline(
    settings_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> Iterator[Pipeline]:
    """vLLM behind the test's recorder, the gateway in front of it, and a worker
    writing tokens rows from the steps the gateway produces."""
    with recording(vllm_server.url) as upstream:
        settings = settings_for(
            "format.format=tokens",
            "sink.flush_interval_ms=20",
            f"gateway.upstreams={upstream.url}",
            f"gateway.port={free_port()}",
            f"gateway.state_dir={tmp_path / 'gateway'}",
        )
        asyncio.run(topics.ensure(settings))
        with Worker(settings, tmp_path / "worker.log"), running(settings, tmp_path / "gw.log"):
            yield Pipeline(settings, upstream)


def expected_rows(ran: Ran, upstream: UpstreamRecorder) -> list[Json]:
    """The tokens rows of ``ran`` built from what vLLM returned to each of its calls."""
    calls = []
    for body in ran.sent:
        sampled = upstream.answer_to(body["messages"]).sampled()
        calls.append(
            {"prompt": sampled.prompt, "completion": sampled.completion, "lp": sampled.logprobs}
        )
        calls[-1]["v"] = "tiny"  # the weight version the gateway records: the model's name
    rows = reference(ran.episode_id, calls)
    return [{**row, "reward": ran.reward, "group_id": ran.group_id} for row in rows]


def message(fields: Json) -> Json:
    """A message as the conversational rows spell it: every key, null when absent,
    except an answer's content (a tool-calling answer without text has "")."""
    return {key: fields.get(key) for key in MESSAGE_KEYS} | {"content": fields.get("content") or ""}


def assert_rows_equal_what_vllm_sampled(pipe: Pipeline, runs: list[Ran], tmp_path: Path) -> None:
    upstream, settings = pipe.upstream, pipe.settings
    assert len(upstream.exchanges) == sum(len(ran.sent) for ran in runs)  # nothing else sampled
    want = sorted(
        (row for ran in runs for row in expected_rows(ran, upstream)),
        key=lambda row: (row["episode_id"], row["segment"]),
    )
    out = Path(settings.sink.output_dir)

    def written() -> list[Json]:
        if not out.exists():
            return []
        rows = [json.loads(line) for line in Follower(out, settings.sink.prefix, wait=False)]
        return rows if len(rows) >= len(want) else []

    got = wait_for(written, timeout=60, what=f"{len(want)} tokens rows in {out}")
    assert sorted(got, key=lambda row: (row["episode_id"], row["segment"])) == want

    target = tmp_path / "conversational.jsonl"
    done = export(
        settings,
        "--to",
        str(target),
        "--format",
        "conversational",
        "--set",
        "format.metadata_mode=columns",
        "--set",
        "format.metadata_fields=episode_id,reward",
    )
    assert done.returncode == 0, done.stderr
    records = {r["episode_id"]: r for r in map(json.loads, target.read_text().splitlines())}
    assert sorted(records) == sorted(ran.episode_id for ran in runs)
    for ran in runs:
        record = records[ran.episode_id]
        assert record["prompt"] == [message(m) for m in ran.messages[:2]]
        assert record["completion"] == [message(m) for m in ran.messages[2:]]
        assert json.loads(record["tools"]) == [WEATHER]
        assert record["reward"] == ran.reward


def python_agent(pipe: Pipeline, model: str, number: int, stream: bool) -> Ran:
    """One episode of a Python SDK agent: two tool-calling turns, then an answer."""
    group = "weather-py"
    episode = start_episode(pipe.settings, group_id=group, group_size=3)
    client = OpenAI(base_url=episode["base_url"], api_key="unused", max_retries=0)
    agent = Agent(client, model, stream=stream)
    agent.messages[1]["content"] += f" (agent {number})"  # each conversation its own
    agent.loop(turns=2)
    reward = number / 2
    url = f"{base(pipe.settings)}/v1/episodes/{episode['episode_id']}/end"
    status, ended, _ = post(url, {"outcome": "success", "reward": reward})
    assert status == 200 and ended["steps"] == 5, ended
    return Ran(episode["episode_id"], agent.sent, agent.messages, reward, group)


def test_python_sdk_agents_become_rows_equal_to_what_vllm_sampled(
    settings_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> None:
    with pipeline(settings_for, vllm_server, tmp_path) as pipe:
        with ThreadPoolExecutor(3) as pool:
            runs = list(
                pool.map(
                    lambda n: python_agent(pipe, vllm_server.model, n, stream=n == 2), range(3)
                )
            )
        assert_rows_equal_what_vllm_sampled(pipe, runs, tmp_path)
        live = exposed_names(get(base(pipe.settings) + "/metrics")[1].decode())
    missing = referenced_names(gateway=True) - live
    assert not missing, f"the dashboard queries what the gateway does not expose: {missing}"


def test_a_typescript_agent_on_the_openai_npm_package_becomes_rows_equal_to_what_vllm_sampled(
    settings_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> None:
    tsx = TS_AGENT / "node_modules" / ".bin" / "tsx"
    assert tsx.exists(), "the TypeScript agent's packages are missing: run dev/setup --dev"
    with pipeline(settings_for, vllm_server, tmp_path) as pipe:
        specs = [
            {
                "gateway": base(pipe.settings),
                "model": vllm_server.model,
                "tool": WEATHER,
                "messages": [
                    {"role": "system", "content": "Use the tools."},
                    {"role": "user", "content": f"Weather in Paris? (agent {n})"},
                ],
                "turns": 2,
                "group_id": "weather-ts",
                "group_size": 2,
            }
            for n in range(2)
        ]
        agents = [
            subprocess.Popen(
                [str(tsx), "agent.ts", json.dumps(spec)],
                cwd=TS_AGENT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for spec in specs
        ]
        runs = []
        for agent in agents:
            out, err = agent.communicate(timeout=120)
            assert agent.returncode == 0, err
            said = json.loads(out)
            assert said["ended"]["steps"] == 5, said
            runs.append(Ran(said["episode_id"], said["sent"], said["messages"], 0.5, "weather-ts"))
        assert_rows_equal_what_vllm_sampled(pipe, runs, tmp_path)
