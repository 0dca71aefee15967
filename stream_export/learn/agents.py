"""The live loop's agents: unmodified OpenAI SDK clients playing the task's prompts
through the gateway, one group of rollouts per prompt.

Each rollout starts an episode (the gateway's session API: ``group_id``,
``group_size``), asks the model once on the episode's ``base_url`` with
``AsyncOpenAI``, scores the answer with the task's reward function and ends the
episode with that reward (none: an outside verifier scores it). The SDK's own
retries wait out the gateway's refusals (429 while the trainer lags, 503 while a
weight fence holds calls) and a gateway's restart; starts and ends are retried the
same way until ``deadline``. Needs the ``openai`` package (the ``learn`` extra).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from stream_export.errors import AgentError
from stream_export.learn.tasks import Episode, Reward

#: The OpenAI SDK's own retries of one call, then ours until CALL_WAIT_S passed (a
#: trainer restarting holds every call with 429 for that long).
SDK_RETRIES = 5
CALL_WAIT_S = 600.0


@dataclass
class Agents:
    gateway: str  # e.g. http://127.0.0.1:9180
    model: str
    tasks: Iterator[dict[str, Any]]
    reward: Reward
    group_size: int = 8
    max_tokens: int = 12
    temperature: float = 1.0
    #: Rollouts played so far, and their rewards (None: left to a verifier).
    played: int = 0

    async def run(self, groups_at_once: int, stop: asyncio.Event) -> None:
        """Play groups, ``groups_at_once`` at a time, until ``stop`` is set."""
        timeout = aiohttp.ClientTimeout(total=30)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            DefaultAsyncHttpxClient() as http,
        ):
            players = (self._player(session, http, stop) for _ in range(groups_at_once))
            await asyncio.gather(*players)

    async def _player(
        self, session: aiohttp.ClientSession, http: DefaultAsyncHttpxClient, stop: asyncio.Event
    ) -> None:
        while not stop.is_set():
            task = next(self.tasks)
            group = f"learn-{uuid.uuid4().hex}"
            await asyncio.gather(
                *(self.rollout(session, http, task, group) for _ in range(self.group_size))
            )

    async def rollout(
        self,
        session: aiohttp.ClientSession,
        http: DefaultAsyncHttpxClient,
        task: dict[str, Any],
        group: str,
    ) -> None:
        started = await self._post(
            session,
            "/v1/episodes",
            {
                "agent_id": "stream-export-learn",
                "prompt": task["prompt"],
                "group_id": group,
                "group_size": self.group_size,
            },
        )
        # the agents' one HTTP client: an SDK client of its own builds a TLS context,
        # 0.1 s of CPU a rollout (not closed here: closing it closes the shared one)
        client = AsyncOpenAI(
            base_url=started["base_url"],
            api_key="unused",
            max_retries=SDK_RETRIES,
            http_client=http,
        )
        messages: list[dict[str, Any]] = [{"role": "user", "content": task["prompt"]}]
        deadline = time.monotonic() + CALL_WAIT_S
        while True:
            try:
                answer = await client.chat.completions.create(
                    model=self.model,
                    messages=messages,  # type: ignore[arg-type]
                    max_tokens=self.max_tokens,
                    temperature=self.temperature,
                    logprobs=True,
                )
                break
            except (
                openai.RateLimitError,
                openai.APIConnectionError,
                openai.InternalServerError,
            ):
                # the trainer is away (429), a fence holds (503), a gateway restarts
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1.0)
        choice = answer.choices[0]
        text = choice.message.content or ""
        tokens = [t.token for t in (choice.logprobs.content or [])] if choice.logprobs else []
        messages.append({"role": "assistant", "content": text})
        reward = self.reward(Episode(task, messages, text, tokens))
        end: dict[str, Any] = {"outcome": "success" if reward else "failure"}
        if reward is not None:
            end["reward"] = float(reward)
        else:
            end["outcome"] = "other"
        await self._post(session, f"/v1/episodes/{started['episode_id']}/end", end)
        self.played += 1

    async def _post(
        self, session: aiohttp.ClientSession, path: str, body: dict[str, Any], wait_s: float = 120
    ) -> dict[str, Any]:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                async with session.post(self.gateway + path, json=body) as answer:
                    if answer.status == 200:
                        decoded: dict[str, Any] = await answer.json()
                        return decoded
                    retry = float(answer.headers.get("Retry-After", "0.5"))
                    why = f"{answer.status} {await answer.text()}"
                    if answer.status not in (429, 503):
                        raise AgentError(f"{path}: {why}")
            except (aiohttp.ClientError, TimeoutError) as error:
                retry, why = 0.5, repr(error)
            if time.monotonic() > deadline:
                raise AgentError(f"{path}: still refused after {wait_s:.0f} s: {why}")
            await asyncio.sleep(retry)
