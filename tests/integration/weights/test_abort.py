"""weights.in_flight = "abort" on the real broker, a real gateway and the real vLLM
(through a slow relay, so a streamed call stays in flight for seconds): a fence's
begin stops the stream in flight instead of waiting for it. The client's stream
ends with an error event (code fenced), the llm_call is recorded aborted with what
was streamed, under the version that sampled it; the next call carries the new one."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from stream_export.gateway.call import STOPPED
from stream_export.weights import WeightFence
from tests.support import relay
from tests.support.vllm_server import VllmServer
from tests.support.weight_fleet import Replica, call, recorded_calls, replica_settings

pytestmark = pytest.mark.integration
#: At the relay's pace (a line per 0.05 s) this stream takes 20 s: a begin that
#: waited for it would see every token recorded.
MAX_TOKENS = 400


async def test_begin_aborts_a_stream_in_flight_and_records_what_it_sampled(
    kafka_bootstrap: str, vllm_server: VllmServer, tmp_path: Path
) -> None:
    with relay.running(vllm_server.url) as (slow, _):
        state = tmp_path / "gateway"
        settings = replica_settings(slow, kafka_bootstrap, state, "weights.in_flight=abort")
        gateway = Replica("r", settings, tmp_path / "gateway.log").start()
        try:
            async with WeightFence(settings) as fence, aiohttp.ClientSession() as http:
                await fence.begin(1)
                await fence.commit(1)
                streaming = asyncio.Event()
                stream = asyncio.create_task(_stream(http, gateway, vllm_server.model, streaming))
                await asyncio.wait_for(streaming.wait(), 30)
                await asyncio.wait_for(fence.begin(2), 30)
                seen, ended = await asyncio.wait_for(stream, 10)
                await fence.commit(2)
                after = await call(http, gateway, vllm_server.model)
            aborted = gateway.metric(
                'stream_export_gateway_calls_total{endpoint="chat",outcome="aborted"}'
            )
        finally:
            assert gateway.process is not None
            gateway.process.stop()

    episode, text, chunks = seen
    assert ended == {"message": STOPPED, "type": "fenced", "code": "fenced"}
    assert aborted == 1
    calls = await asyncio.to_thread(recorded_calls, settings, [episode, after.episode_id])
    stopped, next_call = calls.values()
    assert stopped.finish_reason == "aborted"
    assert stopped.weight_version == 1
    assert 0 < len(stopped.completion_token_ids) < MAX_TOKENS
    assert stopped.response.content == text  # what the client saw, no more
    assert len(stopped.logprobs or []) == len(stopped.completion_token_ids) >= chunks - 1
    assert (after.status, next_call.weight_version) == (200, 2)
    assert next_call.finish_reason != "aborted"


async def _stream(
    http: aiohttp.ClientSession, gateway: Replica, model: str, streaming: asyncio.Event
) -> tuple[tuple[str, str, int], dict[str, str]]:
    """A long streamed chat call: (its episode, the text the client got, content
    chunks), and the error its stream ended with; ``streaming`` is set once three
    chunks of text arrived."""
    async with http.post(gateway.url + "/v1/episodes", json={"agent_id": "a"}) as started:
        episode = (await started.json())["episode_id"]
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "seed": 1,
        "stream": True,
    }
    url = f"{gateway.url}/episodes/{episode}/v1/chat/completions"
    text, chunks, ended = "", 0, {}
    async with http.post(url, json=body) as answer:
        assert answer.status == 200, await answer.text()
        async for raw in answer.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            assert line != "data: [DONE]", "the stream finished: it was not stopped"
            event = json.loads(line.removeprefix("data: "))
            if "error" in event:
                ended = event["error"]
                continue
            for choice in event["choices"]:
                delta = choice["delta"].get("content") or ""
                text, chunks = text + delta, chunks + bool(delta)
            if chunks >= 3:
                streaming.set()
    return (episode, text, chunks), ended
