"""What the scores join's integration tests send: the judge every score names, scored episodes."""

from __future__ import annotations

from typing import Any

from stream_export.client import Producer

JUDGE: dict[str, Any] = {"evaluator": "judge", "evaluator_version": "v1"}


async def record(producer: Producer, eid: str, *, before: list[str]) -> None:
    """An episode of one step, scored ``before`` its end with those names."""
    async with producer.episode(episode_id=eid, agent_id="a", prompt=f"task {eid}") as ep:
        await ep.thought("thinking")
        for name in before:
            await ep.score(name, 0.5, **JUDGE)
        await ep.end("success", reward=0.25)
