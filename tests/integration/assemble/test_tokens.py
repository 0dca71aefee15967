"""The token plane on the real broker: a foreign producer (raw aiokafka, hand-built
JSON) sends llm_call episodes with prompt deltas, out of order and repeated; the
episodes topic carries the segments, and the bad calls are dead letters."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stream_export.contract.decoding import decode_episode
from stream_export.kafka import topics
from stream_export.settings import Settings
from tests.support.monitoring import free_port, get
from tests.support.processes import Worker
from tests.support.producer import produce
from tests.support.topic_reader import header, read_topic

pytestmark = pytest.mark.integration

NOW = time.time()
#: Short timeouts, so the episode that lost its only step closes soon after the load.
TIMEOUTS = ("assemble.idle_timeout_s=2.5", "assemble.grace_s=0.5", "assemble.quiet_partition_s=1")


def event(eid: str, seq: int | None, **fields: Any) -> dict[str, Any]:
    base = {"type": "step", "v": 1, "episode_id": eid, "time": NOW + (seq or 0), "seq": seq}
    return {**base, **fields}


def call(eid: str, seq: int, sent: list[int], completion: list[int], **more: Any) -> dict[str, Any]:
    fields = {
        "request": {
            "messages": [{"role": "user", "content": f"turn {seq}"}],
            "tools": [{"type": "function", "function": {"name": "open_door"}}],
        },
        "response": {"content": f"answer {seq}", "reasoning": "because"},
        "prompt_token_ids": sent,
        "completion_token_ids": completion,
        "logprobs": [-0.125 * (i + 1) for i in range(len(completion))],
        "model": "tiny",
        "weight_version": 3,
        "finish_reason": "stop",
        "request_id": f"{eid}-{seq}",
        **more,
    }
    return event(eid, seq, kind="llm_call", call=fields)


def episode(eid: str, steps: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    start = {"type": "start", "episode_id": eid, "time": NOW - 1, "agent_id": "a", "prompt": "p"}
    end = {"type": "end", "episode_id": eid, "time": NOW + 9, "steps": count, "outcome": "success"}
    return [start, *steps, end]


EPISODES = {
    # three calls, each a delta against the one before: one segment
    "tok-a": episode(
        "tok-a",
        [
            call("tok-a", 0, [1, 2, 3, 4, 5], [6, 7]),
            event("tok-a", 1, kind="action_result", content="open", id="call_1"),
            call("tok-a", 2, [8, 9], [10], prompt_base=0),
            call("tok-a", 3, [11], [12, 13], prompt_base=2, weight_version=4),
        ],
        4,
    ),
    # a re-rendered history sent whole breaks the run; a delta against it continues it
    "tok-b": episode(
        "tok-b",
        [
            call("tok-b", 0, [1, 2], [3]),
            call("tok-b", 1, [1, 2, 99], [4], weight_version="7"),
            call("tok-b", 2, [5], [6], prompt_base=1),
        ],
        3,
    ),
    # a delta against a thought: no base, so the call is a dead letter
    "tok-c": episode(
        "tok-c",
        [
            event("tok-c", 0, kind="thought", content="hm"),
            call("tok-c", 1, [5], [6], prompt_base=0),
            call("tok-c", 2, [7], [8]),
        ],
        3,
    ),
    # logprobs not one per completion token: a dead letter at once; the episode
    # then lacks its only step and is published truncated by the timeout
    "tok-d": episode("tok-d", [call("tok-d", 0, [1], [2, 3], logprobs=[-1.0])], 1),
}


def segments(eid: str, found: dict[str, Any]) -> list[tuple[Any, ...]]:
    tokens = found[eid].tokens
    return [
        (s.input_ids, s.loss_mask(), s.aligned_logprobs(), s.break_reason, [c.seq for c in s.calls])
        for s in tokens.segments
    ]


def test_llm_call_episodes_from_a_foreign_producer_carry_their_token_segments(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    port = free_port()
    settings = settings_for(*TIMEOUTS, "http.enabled=true", f"http.port={port}")
    bootstrap, t = settings.kafka.bootstrap_servers, settings.topics
    asyncio.run(topics.ensure(settings))
    messages = []
    for eid, events in EPISODES.items():
        values = [json.dumps(e).encode() for e in reversed(events)]  # end first
        messages += [(eid.encode(), v) for v in values]
    repeat = json.dumps(EPISODES["tok-a"][3]).encode()
    messages.insert(1, (b"tok-a", repeat))  # a repeat, before the start completes tok-a
    bad_call = json.dumps(EPISODES["tok-c"][2]).encode()
    short_logprobs = json.dumps(EPISODES["tok-d"][1]).encode()

    with Worker(settings, tmp_path / "worker.log") as worker:
        asyncio.run(produce(bootstrap, t.steps, messages))
        records = read_topic(bootstrap, t.episodes, count=4, timeout=90, settle=2.0)
        dead = read_topic(bootstrap, t.dead_letters, count=2, timeout=30)
        metrics = get(f"http://127.0.0.1:{port}/metrics")[1].decode()
        assert worker.alive(), worker.log()[-3000:]

    found = {e.episode_id: e for e in (decode_episode(r.value) for r in records)}
    assert len(records) == len(found) == 4, "each episode exactly once"
    lp = [-0.125, -0.25]
    assert segments("tok-a", found) == [
        (
            list(range(1, 14)),
            [0, 0, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1],
            [0.0] * 5 + lp + [0.0, 0.0, lp[0], 0.0, *lp],
            None,
            [0, 2, 3],
        )
    ]
    a = found["tok-a"]
    assert a.tokens is not None
    assert (a.tokens.weight_version_min, a.tokens.weight_version_max) == (3, 4)
    assert [s.id for s in a.steps] == [None, "call_1", None, None]
    for step in a.steps:
        if step.call is not None:  # the tokens are in the segments, the text stays
            assert step.call.prompt_token_ids == step.call.logprobs == []
            assert step.call.response.content == f"answer {step.seq}"
    assert segments("tok-b", found) == [
        ([1, 2, 3], [0, 0, 1], [0.0, 0.0, lp[0]], None, [0]),
        (
            [1, 2, 99, 4, 5, 6],
            [0, 0, 0, 1, 0, 1],
            [0.0, 0.0, 0.0, lp[0], 0.0, lp[0]],
            "prefix_mismatch",
            [1, 2],
        ),
    ]
    b = found["tok-b"]
    assert b.tokens is not None
    assert (b.tokens.weight_version_min, b.tokens.weight_version_max) == (3, "7")
    assert segments("tok-c", found) == [([7, 8], [0, 1], [0.0, lp[0]], None, [2])]
    c = found["tok-c"]
    assert c.tokens is not None and c.tokens.base_missing == [1]
    assert [s.seq for s in c.steps] == [0, 2] and len(c.sources) == 4
    d = found["tok-d"]
    assert (d.truncated_reason, d.steps, d.tokens) == ("timeout", [], None)

    letters = sorted((header(r, "x-reason"), r.key, r.value, header(r, "x-stage")) for r in dead)
    assert letters == [
        ("token_base_missing", b"tok-c", bad_call, "assemble"),
        ("token_length_mismatch", b"tok-d", short_logprobs, "decode"),
    ]
    samples = {
        (s.name, s.labels.get("reason")): s.value
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
    }
    assert samples[("stream_export_token_breaks_total", "prefix_mismatch")] == 1
    assert samples[("stream_export_token_breaks_total", "repeated_prompt")] == 0
    assert samples[("stream_export_dead_letters_total", "token_base_missing")] == 1
    assert samples[("stream_export_events_invalid_total", "token_length_mismatch")] == 1
