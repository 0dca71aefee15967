"""verl's agent loop, replaying recorded rollouts as ``AgentLoopOutput`` (verl 0.9:
``verl.experimental.agent_loop``): verl trains on what the fleet sampled instead of
generating.

A ``tokens`` row splits at ``prompt_len``: ``prompt_ids = input_ids[:prompt_len]``,
``response_ids = input_ids[prompt_len:]``, ``response_mask = loss_mask[prompt_len:]``
(0 on tool results), ``response_logprobs = logprobs[prompt_len:]`` (verl's
``rollout_log_probs``); the recorded reward is its ``reward_score``.

verl runs the loop named by a dataset row's ``agent_name`` once per rollout of the
row's task (``actor_rollout_ref.rollout.n`` times), passing the row's fields. Each run
takes the next recorded rollout of the row's group (``extra_info.group_id``, which
the exported verl rows carry) from :data:`REPLAY`, which the trainer's process fills
(``REPLAY.add(rows)``, from feed batches or files). Importing this module registers
the loop as ``stream-export-replay``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any, Final

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from stream_export.errors import TrainerInputError
from stream_export.trainers.collate import Row, call_spans, rows_of

NAME: Final = "stream-export-replay"


def output_fields(row: Row, response_length: int | None = None) -> dict[str, Any]:
    """``AgentLoopOutput``'s token fields of a row, the response cut to
    ``response_length`` (its mask and logprobs with it)."""
    cut = row["prompt_len"]
    end = None if response_length is None else cut + response_length
    return {
        "prompt_ids": list(row["input_ids"][:cut]),
        "response_ids": list(row["input_ids"][cut:end]),
        "response_mask": list(row["loss_mask"][cut:end]),
        "response_logprobs": list(row["logprobs"][cut:end]),
    }


class Replay:
    """Recorded rollouts by group, each handed out once, in order."""

    def __init__(self) -> None:
        self._groups: dict[str, deque[Row]] = {}

    def add(self, items: Iterable[Any]) -> None:
        """Feed items or rows (see ``collate.rows_of``)."""
        for item in items:
            for row in rows_of(item):
                group = str(row.get("group_id") or row.get("uid") or "")
                self._groups.setdefault(group, deque()).append(row)

    def take(self, group: str) -> Row:
        rollouts = self._groups.get(group)
        if not rollouts:
            raise TrainerInputError(f"no recorded rollout of group {group!r} left to replay")
        return rollouts.popleft()

    def __len__(self) -> int:
        return sum(len(rollouts) for rollouts in self._groups.values())


REPLAY: Final = Replay()


@register(NAME)
class ReplayAgentLoop(AgentLoopBase):  # type: ignore[misc]
    """Answers each run with the next recorded rollout of the row's group."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        extra = kwargs.get("extra_info") or {}
        row = REPLAY.take(str(extra.get("group_id", "")))
        length = self.rollout_config.response_length
        return AgentLoopOutput(
            **output_fields(row, length),
            reward_score=row.get("reward"),
            num_turns=2 * len(call_spans(row)),
            metrics=AgentLoopMetrics(),
            extra_fields={
                "episode_id": row.get("episode_id"),
                "advantage": row.get("advantage"),
            },
        )
