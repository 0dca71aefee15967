"""The adapters against the real libraries at their pinned releases, on CPU, each in
its dev/trainers environment (one probe per environment, run at once: importing
torch, TRL and verl is most of the cost). The rows are closed groups of the tool
episode (two calls, a tool result between them), made by the package's own groups
code; the probes replay them through TRL's GRPOTrainer and async-GRPO data path,
verl's agent loop and core_algos, and ART's trajectory types; the reference trainer
learns the toy task of the design notes; the plain-PyTorch Llama computes what
transformers' does, and the loop trainer builds with it without importing transformers."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import msgspec
import pytest

from stream_export.rows.groups import group_token_records
from tests.support.call_episodes import tool_episode
from tests.support.group_records import record
from tests.support.processes import dev_tool, trainer_pythons

ROOT = Path(__file__).resolve().parents[3]
PROBES = ROOT / "tests" / "support" / "trainer_probes"
REWARDS = [(1.0, 0.0, 0.0, 1.0), (0.0, 0.5, 1.0, 0.0), (1.0, 1.0, 0.0, 0.0)]
#: A Llama config as transformers 5 writes it (the tiny model's, tied) and as 4 did.
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 1028,
    "hidden_act": "silu",
    "attention_dropout": 0.0,
    "tie_word_embeddings": True,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
}
OLD_LLAMA = {k: v for k, v in LLAMA.items() if k != "rope_parameters"}
OLD_LLAMA |= {"rope_theta": 500000.0, "rope_scaling": None}
#: trainers.llama.refusal's cases: None where the plain module builds the model.
CONFIGS: dict[str, dict[str, Any]] = {
    "llama": LLAMA,
    "llama_transformers_4": OLD_LLAMA,
    "llama3_rope": LLAMA | {"rope_parameters": {"rope_type": "llama3", "factor": 8.0}},
    "linear_rope_4": OLD_LLAMA | {"rope_scaling": {"type": "linear", "factor": 2.0}},
    "mistral": LLAMA | {"architectures": ["MistralForCausalLM"], "sliding_window": 4096},
    "sliding": LLAMA | {"sliding_window": 4096},
    "layer_types": LLAMA | {"layer_types": ["full_attention", "sliding_attention"]},
    "gelu": LLAMA | {"hidden_act": "gelu"},
    "dropout": LLAMA | {"attention_dropout": 0.1},
    "quantized": LLAMA | {"quantization_config": {"quant_method": "bitsandbytes"}},
    "no_layers": {k: v for k, v in LLAMA.items() if k != "num_hidden_layers"},
    "no_architectures": {k: v for k, v in LLAMA.items() if k != "architectures"},
}


def recorded_groups() -> list[list[dict[str, Any]]]:
    """Three closed groups of four rollouts (GRPO advantages), versions g and g + 1."""
    groups = []
    for g, rewards in enumerate(REWARDS):
        versions = (g, g + 1)
        rollouts = [
            tool_episode(
                f"g{g}-{i}", group_id=f"g{g}", reward=r, offset=10 * i + g, versions=versions
            )
            for i, r in enumerate(rewards)
        ]
        made = record(rollouts, 4, estimator="grpo")
        groups.append(group_token_records(msgspec.structs.replace(made, group_id=f"g{g}")))
    return groups


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pythons = trainer_pythons()
    model = dev_tool("vllm", "paths", timeout=60)
    if model.returncode != 0:
        pytest.fail(model.stderr, pytrace=False)
    tmp = tmp_path_factory.mktemp("trainers")
    rows = tmp / "groups.json"
    rows.write_text(json.dumps(recorded_groups()))
    args = {
        "in_trainers": {
            "root": str(ROOT),
            "site": sysconfig.get_paths()["purelib"],
            "model": json.loads(model.stdout)["model"],
            "rows": str(rows),
            "out": str(tmp),
            "configs": CONFIGS,
        },
        "in_art": {"root": str(ROOT), "rows": str(rows)},
    }
    env = {"in_trainers": "trainers", "in_art": "art"}
    running = {
        name: subprocess.Popen(
            [pythons[env[name]], str(PROBES / f"{name}.py"), json.dumps(arg)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp,
        )
        for name, arg in args.items()
    }
    done: dict[str, Any] = {}
    try:
        for name, process in running.items():
            out, err = process.communicate(timeout=300)
            assert process.returncode == 0, err[-4000:]
            done[name] = json.loads(out.splitlines()[-1])
    finally:
        for process in running.values():
            process.kill()
            process.wait()
    return done


def test_the_collators_tensors_are_its_lists(probed: dict[str, Any]) -> None:
    got = probed["in_trainers"]["collator"]
    assert got["same"] is True
    assert got["shape"] == [12, 9]
    floats = {"old_logprobs", "advantages"}
    assert got["dtypes"] == {
        k: "torch.float32" if k in floats else "torch.int64"
        for k in (
            "input_ids",
            "attention_mask",
            "position_ids",
            "loss_mask",
            "old_logprobs",
            "advantages",
            "weight_versions",
        )
    }


def test_trls_grpo_trainer_steps_on_recorded_groups_and_they_are_acked_after(
    probed: dict[str, Any],
) -> None:
    got = probed["in_trainers"]["trl"]
    # TRL repeats each prompt num_generations times: one group per call here
    assert got["prompts_per_call"] == [4, 4]
    assert got["steps"] == 2 and got["changed"] is True
    assert got["rewards"] == [sum(r) / 4 for r in REWARDS[:2]]
    # the first group's batch is acknowledged when TRL asks again, the second after
    # train(); the third was never handed out
    assert got["acked_in_training"] == [1, 0, 0]
    assert got["acked"] == [1, 1, 0]
    assert got["skipped"] == {}


def test_trls_async_grpo_packs_the_feed_workers_samples(probed: dict[str, Any]) -> None:
    got = probed["in_trainers"]["trl_async"]
    assert got["protocol"] == []  # every name of RolloutWorkerProtocol
    # 4 rows of 12 tokens a micro-batch, 5 sampled each (TRL predicts 4 of them: the
    # first sampled token of a row is predicted by the prompt's last, counted once)
    assert [p["forward_tokens"] for p in got["packed"]] == [48, 48, 48]
    assert all(p["trained_tokens"] == 20 for p in got["packed"])
    assert got["groups_trained"] == [0, 1, 2]
    # a batch is acknowledged at the second version update after its samples were taken
    assert got["acks"] == [[0, 0, 0], [1, 0, 0], [1, 1, 0]]


def test_verls_agent_loop_replays_rows_and_core_algos_agrees_with_the_advantages(
    probed: dict[str, Any],
) -> None:
    got = probed["in_trainers"]["verl"]
    assert got["registered"] is True and got["left"] == 0
    assert got["advantages"] == pytest.approx(got["recorded"], abs=1e-6)
    assert got["fields"] == {
        "prompt_ids": [1, 2, 3, 4],
        "response_ids": [10, 11, 12, 20, 21, 22, 30, 31],
        "response_mask": [1, 1, 1, 0, 0, 0, 1, 1],
    }
    assert got["num_turns"] == 4
    # token-mean of the recorded logprobs: (-0.25 - 0.5 - 0.75 - 0.25 - 0.5) / 5
    assert got["logprob_sum"] == pytest.approx(-0.45, abs=1e-6)


def test_art_gets_one_vllm_choice_per_call_without_torch(probed: dict[str, Any]) -> None:
    got = probed["in_art"]
    assert got["torch"] is False and got["msgspec"] is False
    groups = recorded_groups()
    assert [[t["reward"] for t in g] for g in got["groups"]] == [list(r) for r in REWARDS]
    for trajectories, rows in zip(got["groups"], groups, strict=True):
        for trajectory, row in zip(trajectories, rows, strict=True):
            assert trajectory["episode"] == row["episode_id"]
            ids, logprobs = row["input_ids"], row["logprobs"]
            spans = zip(row["call_starts"], row["call_ends"], strict=True)
            assert trajectory["calls"] == [
                {"prompt": ids[:s], "sampled": ids[s:e], "logprobs": logprobs[s:e]}
                for s, e in spans
            ]


def test_the_reference_trainer_learns_the_toy_task_and_writes_loadable_weights(
    probed: dict[str, Any],
) -> None:
    got = probed["in_trainers"]["reference"]
    curve = got["curve"]
    print("held-out reward by version:", curve, f"{got['seconds']:.1f} s", file=sys.stderr)
    assert curve[0] <= 0.2
    assert curve[-1] >= 0.8, curve
    # on-policy steps: the ratio is 1, nothing clipped, staleness 0
    assert all(s == [0, 1.0, 0.0] for s in got["steps"])
    # a batch sampled by version 0 stepped on at the end: the ratio moved, the clip bit
    assert got["late"]["staleness"] == len(curve) - 1
    assert got["late"]["clipped"] > 0 and got["late"]["ratio"] != pytest.approx(1.0)
    # the saved weights: the served model's tensor names and shapes, its version, the
    # same logprobs once loaded; a version's directory is never written twice
    assert got["files"] == ["model.safetensors"]
    assert got["same_header"] is True and got["reloaded_equal"] is True
    assert got["version"] == str(len(curve))
    assert got["refused_overwrite"] is True


def test_the_decoupled_loss_is_ppo_on_fresh_rollouts_and_still_learns_from_stale_ones(
    probed: dict[str, Any],
) -> None:
    got = probed["in_trainers"]["decoupled"]
    print("decoupled loss:", got, file=sys.stderr)
    # sampled by the weights being trained: the same gradient as the PPO loss
    assert got["fresh_same_gradient"] is True and got["fresh_gradient_norm"] > 0
    # sampled by version 0, versions ago: importance weights away from 1, some cut at
    # the cap, and still a gradient (the PPO clip cuts most of it, see above)
    assert got["late_weight"] != pytest.approx(1.0, abs=1e-3)
    assert 0 < got["late_truncated"] < 1
    assert got["late_gradient_norm"] > 0


def test_the_loop_trainer_builds_a_llama_without_transformers_and_others_with_it(
    probed: dict[str, Any],
) -> None:
    got = probed["in_trainers"]["llama"]
    assert got["built"] == {
        "class": "stream_export.trainers.llama",
        "transformers_imported": False,
        "dynamo_imported": False,  # built, stepped, saved and resumed without torch._dynamo
    }
    # restarted on its checkpoint: version 1, the saved weights, the optimizer's state
    assert got["checkpoint"] == "v1"
    assert got["resumed"] == {"version": 1, "class": "stream_export.trainers.llama"}
    assert got["resumed_apart"] == 0.0 and got["optimizer_resumed"] is True
    # rope scaling is not implemented: transformers builds it, as before
    assert got["fallback"]["class"].startswith("transformers.models.llama")
    assert got["fallback"]["refusal"] == "rope type ['linear']"


def test_which_configs_the_plain_llama_implements(probed: dict[str, Any]) -> None:
    assert probed["in_trainers"]["llama"]["refusals"] == {
        "llama": None,
        "llama_transformers_4": None,
        "llama3_rope": "rope type ['llama3']",
        "linear_rope_4": "rope type ['linear']",
        "mistral": "architectures ['MistralForCausalLM']",
        "sliding": "sliding-window attention",
        "layer_types": "sliding-window attention",
        "gelu": "activation 'gelu'",
        "dropout": "attention dropout or quantization",
        "quantized": "attention dropout or quantization",
        "no_layers": "no num_hidden_layers in the config",
        "no_architectures": "architectures None",
    }


@pytest.mark.parametrize("model", ["tiny", "variant"])
def test_the_plain_llama_computes_what_transformers_does(
    probed: dict[str, Any], model: str
) -> None:
    """The tiny model, and a variant with grouped KV heads, a head_dim apart from
    hidden / heads, biases, tied embeddings and a top-level rope_theta."""
    got = probed["in_trainers"]["llama"][model]
    print(f"plain llama against transformers ({model}):", got, file=sys.stderr)
    assert len(set(probed["in_trainers"]["llama"]["padded_rows"])) > 1  # so padding
    # logits on the tokens, right-padded (the collator) and left-padded; no NaN where a
    # left-padded row has no key to attend
    assert max(got["apart"].values()) <= 1e-5 and got["left_nan"] is False
    # the same tensors: names, shapes, dtypes, and the file the reference trainer saves
    assert got["same"]["state_dict"] is True and got["same"]["saved"] is True
    # the tiny model's file as the reference trainer saves it (the variant's leaves
    # its tied head out)
    assert got["same"]["checkpoint"] is (model == "tiny")
    assert got["state_dict_keys"] == {"tiny": 21, "variant": 35}[model]
    # two reference steps on the same batch: the same losses, the same weights after
    plain, reference = got["steps"]["plain"], got["steps"]["transformers"]
    assert plain["loss"] == pytest.approx(reference["loss"], abs=1e-5)
    assert plain["loss"][0] != pytest.approx(plain["loss"][1], abs=1e-3)  # the step moved it
    assert got["weights_apart_after_steps"] <= 1e-5


def test_the_reference_trainers_adamw_is_torchs(probed: dict[str, Any]) -> None:
    got = probed["in_trainers"]["adamw"]
    print("adamw against torch.optim.AdamW:", got, file=sys.stderr)
    # the settings the trainer had from torch.optim.AdamW's defaults
    ours, torchs = got["settings"]
    assert ours == {"lr": 3e-2, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}
    assert torchs == ours
    # five reference steps (weight decay, the gradient's norm clipped to 1) from the same
    # weights on the same batch: the same weights, and they moved
    assert got["moved"] > 1e-3 and got["clipped_norm"] == pytest.approx(1.0, abs=1e-5)
    assert got["apart_after_3"] <= 1e-7 and got["apart_after_5"] <= 1e-7
    # restarted after three steps from optimizer.pt (torch.save, torch.load with
    # weights_only): ours from ours and from torch's (an older run's), torch's from ours
    assert all(v <= 1e-7 for v in got["resumed_apart"].values()), got["resumed_apart"]
    # a state for other parameters, or not an AdamW state: a typed error saying so
    refused = got["refused"]
    assert refused["other_model"] == "trainer_input: an AdamW state of 21 parameters, not 2"
    for name in ("two_groups", "not_a_state"):
        assert refused[name].startswith("trainer_input: not an AdamW state"), refused[name]
