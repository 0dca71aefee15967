"""The trainer environments (dev/trainers; locks dev/trainers.lock and dev/art.lock):
each imports, on CPU, what the live loop's adapters hand rows to, and builds those
objects from token ids and logprobs as a tokens row carries them. The probes run in
the environments' own interpreters (neither is a dependency of the package)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.support.processes import trainer_pythons

#: TRL's token-level row and drift kinds, verl's agent-loop output and its GRPO
#: advantages (one group of four rollouts, rewards 1, 0, 0, 1).
TRAINERS_PROBE = """
import json, sys
import numpy as np
import torch
from trl import GRPOTrainer
from trl.experimental.async_grpo import AsyncGRPOTrainer
from trl.experimental.async_grpo.async_rollout_worker import DriftKind, TrainingSequence
from verl.experimental.agent_loop import AgentLoopBase, AgentLoopOutput
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics
from verl.trainer.ppo import core_algos

row = TrainingSequence(
    input_ids=[5, 6, 7, 8], completion_mask=[0, 0, 1, 1],
    old_log_probs=[0.0, 0.0, -0.5, -0.25], rollout_id="episode-1",
)
out = AgentLoopOutput(
    prompt_ids=[5, 6], response_ids=[7, 8], response_mask=[1, 1],
    response_logprobs=[-0.5, -0.25], num_turns=2, metrics=AgentLoopMetrics(),
)
rewards = torch.zeros(4, 2)
rewards[:, -1] = torch.tensor([1.0, 0.0, 0.0, 1.0])
advantages, _ = core_algos.compute_grpo_outcome_advantage(
    token_level_rewards=rewards, response_mask=torch.ones(4, 2), index=np.array(["g"] * 4)
)
print(json.dumps({
    "python": list(sys.version_info[:2]),
    "cuda": torch.cuda.is_available(),
    "trainers": [GRPOTrainer.__name__, AsyncGRPOTrainer.__name__, AgentLoopBase.__name__],
    "drift": sorted(kind.value for kind in DriftKind),
    "row": row.input_ids,
    "verl": {k: v.tolist() for k, v in out.as_dict().items() if k in ("prompts", "responses")},
    "advantages": [round(float(a), 4) for a in advantages[:, 0]],
}))
"""

#: ART's trajectories of openai Choice objects carrying vLLM's token ids, without torch.
ART_PROBE = """
import json, sys
import art
from openai.types.chat.chat_completion import Choice

choice = Choice.model_validate({
    "index": 0, "finish_reason": "length",
    "message": {"role": "assistant", "content": "hi"},
    "logprobs": {"content": [{"token": "hi", "logprob": -0.5, "bytes": [104, 105],
                              "top_logprobs": []}]},
    "token_ids": [7, 8],
})
group = art.TrajectoryGroup([
    art.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, choice], reward=r)
    for r in (1.0, 0.0)
])
kept = group.trajectories[0].messages_and_choices[1]
print(json.dumps({
    "python": list(sys.version_info[:2]),
    "rewards": [t.reward for t in group.trajectories],
    "choice": type(kept).__name__,
    "token_ids": kept.token_ids,
    "torch": "torch" in sys.modules,
}))
"""


@pytest.fixture(scope="module")
def probed() -> dict[str, subprocess.CompletedProcess[str]]:
    """Each environment's probe, run at once (importing torch, TRL and verl takes most of
    the time); fails saying how to build the environments when they are missing."""
    pythons = trainer_pythons()
    probes = {"trainers": TRAINERS_PROBE, "art": ART_PROBE}
    running = {
        name: subprocess.Popen(
            [pythons[name], "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for name, code in probes.items()
    }
    done = {}
    try:
        for name, process in running.items():
            out, err = process.communicate(timeout=300)
            done[name] = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    finally:
        for process in running.values():
            process.kill()
            process.wait()
    return done


def result(probed: dict[str, subprocess.CompletedProcess[str]], name: str) -> dict[str, Any]:
    ran = probed[name]
    assert ran.returncode == 0, ran.stderr[-4000:]
    got: dict[str, Any] = json.loads(ran.stdout.splitlines()[-1])
    return got


def test_trl_and_verl_build_their_rows_on_cpu(
    probed: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    got = result(probed, "trainers")
    assert got["python"] == [3, 11]
    assert got["cuda"] is False
    assert got["trainers"] == ["GRPOTrainer", "AsyncGRPOTrainer", "AgentLoopBase"]
    assert got["drift"] == ["clean", "fork", "realign"]
    assert got["row"] == [5, 6, 7, 8]
    assert got["verl"] == {"prompts": [5, 6], "responses": [7, 8]}
    # (r - mean) / std over the group: mean 0.5, sample std 0.5774.
    assert got["advantages"] == [0.866, -0.866, -0.866, 0.866]


def test_art_groups_trajectories_of_vllm_choices_without_torch(
    probed: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    got = result(probed, "art")
    assert got["python"] == [3, 12]
    assert got["rewards"] == [1.0, 0.0]
    assert got["choice"] == "Choice"
    assert got["token_ids"] == [7, 8]
    assert got["torch"] is False
