"""A fleet of agents calling one gateway at once (asyncio, raw HTTP), each keeping
what the gateway answered: the ids of its answered calls and its end, so a test
can check every one of them against the steps topic. Refusals (503) are waited
out with their Retry-After, as the OpenAI SDKs do."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

Json = dict[str, Any]


@dataclass
class FleetAgent:
    number: int
    stream: bool
    key: str = ""
    #: The ids of the calls answered in full (200 and, streamed, through [DONE]).
    answered: list[str] = field(default_factory=list)
    #: Calls and ends refused: status (0: no answer) -> count.
    refused: Counter[int] = field(default_factory=Counter)
    #: The accepted end's answer ({"episode_id", "steps"}).
    ended: Json | None = None


class Fleet:
    """``size`` agents on the gateway at ``base`` (every fourth one streams)."""

    def __init__(self, base: str, model: str, size: int) -> None:
        self.base, self.model = base, model
        self.agents = [FleetAgent(n, stream=n % 4 == 3) for n in range(size)]
        self.session: aiohttp.ClientSession | None = None
        #: When each call was answered (time.monotonic()), in order.
        self.answer_times: list[float] = []

    async def __aenter__(self) -> Fleet:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.session is not None
        await self.session.close()

    async def start(self, agent: FleetAgent, deadline: float) -> None:
        body = {"agent_id": f"fleet-{agent.number}", "prompt": "Weather?"}
        status, answer, wait = await self._post("/v1/episodes", body)
        while status != 200:
            self._refused(agent, status, deadline)
            await asyncio.sleep(wait)
            status, answer, wait = await self._post("/v1/episodes", body)
        agent.key = answer["episode_id"]

    async def call(self, agent: FleetAgent, seed: int) -> bool:
        """One call (the same request each time but its seed); whether it was answered."""
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": f"Weather in Oslo? ({agent.number})"}],
            "max_tokens": 4,
            "seed": seed,
            "stream": agent.stream,
        }
        url = f"{self.base}/episodes/{agent.key}/v1/chat/completions"
        assert self.session is not None
        try:
            async with self.session.post(url, json=body) as answer:
                raw = await answer.read()
                status = answer.status
                wait = float(answer.headers.get("Retry-After", "0.2"))
        except (aiohttp.ClientError, TimeoutError):
            status, raw, wait = 0, b"", 0.2
        found = _answered_id(raw, agent.stream) if status == 200 else None
        if found is None:
            agent.refused[status] += 1
            await asyncio.sleep(wait)
            return False
        agent.answered.append(found)
        self.answer_times.append(time.monotonic())
        return True

    async def end(self, agent: FleetAgent, deadline: float) -> None:
        """End the episode (outcome success, reward its number), again after each
        refusal until it is accepted or ``deadline`` (time.monotonic()) passes."""
        url = f"/v1/episodes/{agent.key}/end"
        body = {"outcome": "success", "reward": float(agent.number)}
        status, answer, wait = await self._post(url, body)
        while status != 200:
            self._refused(agent, status, deadline)
            await asyncio.sleep(wait)
            status, answer, wait = await self._post(url, body)
        agent.ended = answer

    def _refused(self, agent: FleetAgent, status: int, deadline: float) -> None:
        assert status in (0, 503), status
        agent.refused[status] += 1
        assert time.monotonic() < deadline, f"agent {agent.number}: still refused ({status})"

    async def _post(self, path: str, body: Json) -> tuple[int, Json, float]:
        assert self.session is not None
        try:
            async with self.session.post(self.base + path, json=body) as answer:
                decoded = json.loads(await answer.read() or b"{}")
                return answer.status, decoded, float(answer.headers.get("Retry-After", "0.2"))
        except (aiohttp.ClientError, TimeoutError):
            return 0, {}, 0.2


def _answered_id(raw: bytes, stream: bool) -> str | None:
    """The answer's id when it is whole: a completion, or a stream through [DONE]."""
    if not stream:
        found: str = json.loads(raw)["id"]
        return found
    lines = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
    if not lines or lines[-1] != b"[DONE]":
        return None  # ended by an error event: refused
    first: str = json.loads(lines[0])["id"]
    return first
