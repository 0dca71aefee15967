"""Run by tests/unit/trainers/test_adapters.py in the ``art`` environment (CPython
3.12, no torch): ART's trajectory groups built from the rows, read back with ART's own
vLLM token readers. argv[1]: JSON {"root", "rows"}."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ARGS = json.loads(sys.argv[1])
sys.path.insert(0, ARGS["root"])

import art  # noqa: E402
from art.preprocessing.vllm_tokens import choice_vllm_token_metadata  # noqa: E402
from openai.types.chat.chat_completion import Choice  # noqa: E402

from stream_export.trainers.art_groups import trajectory_groups  # noqa: E402

groups = trajectory_groups(json.loads(Path(ARGS["rows"]).read_text()))
found = []
for group in groups:
    assert isinstance(group, art.TrajectoryGroup)
    trajectories = []
    for trajectory in group.trajectories:
        calls = []
        for choice in trajectory.messages_and_choices:
            assert isinstance(choice, Choice)
            metadata = choice_vllm_token_metadata(choice)
            assert metadata is not None and choice.logprobs is not None
            logprobs = [t.logprob for t in choice.logprobs.content or []]
            calls.append({"prompt": metadata[0], "sampled": metadata[1], "logprobs": logprobs})
        trajectories.append(
            {
                "reward": trajectory.reward,
                "episode": trajectory.metadata["episode_id"],
                "calls": calls,
            }
        )
    found.append(trajectories)
print(
    json.dumps(
        {"groups": found, "torch": "torch" in sys.modules, "msgspec": "msgspec" in sys.modules}
    )
)
