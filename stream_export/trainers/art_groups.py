"""OpenPipe ART's ``TrajectoryGroup``s from recorded rollouts (ART 0.5: ``art``).

ART trains only on the ``Choice`` objects of a trajectory that carry vLLM's
``prompt_token_ids`` and ``token_ids`` (and logprobs): one ``Choice`` per model call,
cut from a ``tokens`` row at the call's ``call_starts`` / ``call_ends`` (its prompt is
every token before it, its completion the tokens it sampled, with their logprobs).
ART joins a rollout's choices back into sequences where each prompt extends the last
(as the segments do). A trajectory's reward is the rollout's; a group is a closed
group's scored rollouts. Token strings are not recorded: each logprob's ``token`` is
vLLM's ``token_id:<id>`` form and the message content is empty.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import art
from openai.types.chat.chat_completion import Choice

from stream_export.trainers.collate import Row, call_spans, groups_of, rows_of


def choices(row: Row) -> list[Choice]:
    """One ``Choice`` per call of a row."""
    ids, logprobs = row["input_ids"], row["logprobs"]
    made = []
    for start, end, _ in call_spans(row):
        made.append(
            Choice.model_validate(
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": ""},
                    "logprobs": {
                        "content": [
                            {"token": f"token_id:{t}", "logprob": lp, "top_logprobs": []}
                            for t, lp in zip(ids[start:end], logprobs[start:end], strict=True)
                        ]
                    },
                    "prompt_token_ids": list(ids[:start]),
                    "token_ids": list(ids[start:end]),
                }
            )
        )
    return made


def trajectory_groups(items: Iterable[Any]) -> list[art.TrajectoryGroup]:
    """A ``TrajectoryGroup`` per group of the items (feed items or rows): one
    ``Trajectory`` per rollout, its segments' choices in order."""
    rows = [row for item in items for row in rows_of(item)]
    out = []
    for group in groups_of(rows):
        by_episode: dict[str, list[Row]] = {}
        for row in group:
            by_episode.setdefault(str(row.get("episode_id")), []).append(row)
        out.append(
            art.TrajectoryGroup(
                [
                    art.Trajectory(
                        messages_and_choices=[c for row in segments for c in choices(row)],
                        reward=float(segments[0]["reward"]),
                        metadata={"episode_id": episode},
                    )
                    for episode, segments in by_episode.items()
                ]
            )
        )
    return out
