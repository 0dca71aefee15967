"""Run by tests/unit/trainers/test_adapters.py in the ``trainers`` environment: the
collator's tensors, TRL's GRPOTrainer stepping on FeedRolloutFunc, TRL's async-GRPO
data path drawing from FeedRolloutWorker, verl's agent loop replaying rows checked
with verl's own core_algos, the reference trainer learning the toy task, and the
plain-PyTorch Llama against transformers' (with the loop trainer's build of it).

argv[1]: JSON {"root", "site", "model", "rows", "out", "configs"} (the worktree, the
project's site-packages appended for the package's own dependencies, the tiny model, a
JSON file of groups of tokens rows, a scratch folder, configs for trainers.llama.refusal)."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ARGS = json.loads(sys.argv[1])
sys.path.insert(0, ARGS["root"])
sys.path.append(ARGS["site"])  # after the environment's own: its torch, TRL, numpy win

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)
GROUPS: list[list[dict[str, Any]]] = json.loads(Path(ARGS["rows"]).read_text())
OUT = Path(ARGS["out"])
found: dict[str, Any] = {}


class ListBatch:
    """A feed batch held in memory: its items, and whether it was acknowledged."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self.acked = 0

    def ack(self) -> None:
        self.acked += 1


def batches(per: int) -> list[ListBatch]:
    return [ListBatch(GROUPS[i : i + per]) for i in range(0, len(GROUPS), per)]


def collator() -> None:
    from stream_export.trainers.collate import Collator, collate

    lists = collate(GROUPS, max_length=9)
    tensors = Collator(max_length=9)(GROUPS)
    found["collator"] = {
        "dtypes": {k: str(v.dtype) for k, v in tensors.items() if isinstance(v, torch.Tensor)},
        "same": all(
            torch.allclose(v.double(), torch.tensor(lists[k], dtype=torch.float64), atol=1e-6)
            for k, v in tensors.items()
            if isinstance(v, torch.Tensor)
        ),
        "shape": list(tensors["input_ids"].shape),
    }


def trl_rollout_func() -> None:
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from stream_export.trainers.trl_rollouts import FeedRolloutFunc, recorded_reward

    feed = batches(1)
    func = FeedRolloutFunc(feed, num_generations=4)
    seen: list[int] = []

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        seen.append(len(prompts))
        return func(prompts, trainer)

    args = GRPOConfig(
        output_dir=str(OUT / "trl"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_steps=2,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        learning_rate=1e-2,
        max_completion_length=16,
    )
    tokenizer = AutoTokenizer.from_pretrained(ARGS["model"])
    trainer = GRPOTrainer(
        model=ARGS["model"],
        reward_funcs=recorded_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["(recorded)"] * 8}),
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    acked_in_training = [b.acked for b in feed]
    func.ack()
    after = list(trainer.model.parameters())
    logs = [e for e in trainer.state.log_history if "reward" in e]
    found["trl"] = {
        "prompts_per_call": seen,
        "steps": trainer.state.global_step,
        "rewards": [e["reward"] for e in logs],
        "changed": any(not torch.equal(a, b) for a, b in zip(before, after, strict=True)),
        "acked_in_training": acked_in_training,
        "acked": [b.acked for b in feed],
        "skipped": dict(func.skipped),
    }


def trl_async_worker() -> None:
    from trl.experimental.async_grpo.async_grpo_trainer import (
        DataCollatorForRollout,
        FixedCountBatcher,
        RolloutQueueDataset,
        RolloutWorkerProtocol,
    )

    from stream_export.trainers.trl_rollouts import FeedRolloutWorker

    feed = batches(1)
    worker = FeedRolloutWorker(feed)
    protocol = [n for n in dir(RolloutWorkerProtocol) if not n.startswith("_")]
    protocol += list(RolloutWorkerProtocol.__annotations__)
    worker.start()
    dataset = RolloutQueueDataset(
        rollout_queue=worker.rollout_buffer,
        model_version_fn=lambda: worker.model_version,
        check_health_fn=worker.check_health,
        stale_after_s=60.0,
        metrics=defaultdict(list),
        max_staleness=100,
        poll_interval_s=0.5,
    )
    planner = iter(FixedCountBatcher(dataset, num_processes=1, microbatch_size=4))
    collate = DataCollatorForRollout(pad_token_id=0)
    packed, acks = [], []
    for version in (1, 2, 3):
        batch = collate([next(planner)])
        packed.append(
            {
                "trained_tokens": int(batch["global_n_tokens"][0]),
                "forward_tokens": int(batch["global_n_forward_tokens"][0]),
            }
        )
        worker.update_model_version(version)
        acks.append([b.acked for b in feed])
    worker.stop()
    found["trl_async"] = {
        "protocol": sorted(n for n in set(protocol) if not hasattr(worker, n)),
        "packed": packed,
        "acks": acks,
        "groups_trained": sorted(collate.groups_trained),
    }


def verl_agent_loop() -> None:
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry
    from verl.trainer.ppo import core_algos

    from stream_export.trainers.verl_loop import NAME, REPLAY, ReplayAgentLoop

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"response_length": 32}}})
    loop = ReplayAgentLoop(
        trainer_config=DictConfigWrap(config),
        server_manager=None,
        tokenizer=AutoTokenizer.from_pretrained(ARGS["model"]),
        processor=None,
        dataset_cls=None,
        data_config=DictConfigWrap(OmegaConf.create({})),
    )
    REPLAY.add(GROUPS)
    outputs, uids = [], []
    for group in GROUPS:
        for _ in group:
            extra = {"group_id": group[0]["group_id"]}
            outputs.append(asyncio.run(loop.run({}, raw_prompt=[], extra_info=extra)))
            uids.append(extra["group_id"])
    width = max(len(o.response_ids) for o in outputs)

    def pad(key: str, dtype: torch.dtype) -> torch.Tensor:
        rows = [o.as_dict()[key].tolist() for o in outputs]
        return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=dtype)

    mask = pad("response_mask", torch.int64)
    rewards = torch.zeros(len(outputs), width)
    for i, o in enumerate(outputs):
        rewards[i, int(mask[i].nonzero().max())] = o.reward_score
    data = DataProto.from_dict(
        tensors={
            "responses": pad("responses", torch.int64),
            "response_mask": mask,
            "rollout_log_probs": pad("rollout_log_probs", torch.float32),
            "token_level_rewards": rewards,
        },
        non_tensors={"uid": np.array(uids, dtype=object)},
    )
    advantages, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=data.batch["token_level_rewards"],
        response_mask=data.batch["response_mask"].float(),
        index=data.non_tensor_batch["uid"],
    )
    logprobs = data.batch["rollout_log_probs"]
    found["verl"] = {
        "registered": NAME in _agent_loop_registry,
        "left": len(REPLAY),
        "advantages": [float(advantages[i][mask[i].bool()][0]) for i in range(len(outputs))],
        "recorded": [o.extra_fields["advantage"] for o in outputs],
        "logprob_sum": float(core_algos.agg_loss(logprobs, mask.float(), "token-mean")),
        "fields": outputs[0].model_dump(include={"prompt_ids", "response_ids", "response_mask"}),
        "num_turns": outputs[0].num_turns,
    }


def reference_trainer() -> None:
    """The toy task of the design notes: reward 1 when a digit is among the first four
    completion tokens; 4 prompts x 8 completions of 12 tokens a step, sampled from the
    trainer's own weights at temperature 1 (as vLLM would), GRPO advantages from the
    package's own estimator."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stream_export.groups.advantages import score
    from stream_export.trainers.collate import Collator
    from stream_export.trainers.reference import (
        ReferenceTrainer,
        clipped_loss,
        decoupled_loss,
        token_logprobs,
    )

    torch.manual_seed(0)
    rnd = random.Random(7)
    tokenizer = AutoTokenizer.from_pretrained(ARGS["model"])
    model = AutoModelForCausalLM.from_pretrained(ARGS["model"], dtype=torch.float32)
    digits = {
        i for i in range(len(tokenizer)) if tokenizer.decode([i]).strip() in set("0123456789")
    }
    words = "paris oslo tokyo lima cairo sunny rain snow wind cold warm hot today tomorrow week"
    words += " city weather tool"
    prompts = [" ".join(rnd.sample(words.split(), 5)) for _ in range(24)]
    train, held_out = prompts[:16], prompts[16:]
    trainer = ReferenceTrainer(model)

    @torch.no_grad()
    def sample(batch: list[str], n: int = 8, length: int = 12) -> list[dict[str, Any]]:
        rows = []
        for prompt in batch:
            ids = tokenizer(prompt)["input_ids"]
            x = torch.tensor([ids] * n)
            picked = []
            for _ in range(length):
                logp = torch.log_softmax(model(input_ids=x).logits[:, -1].float(), -1)
                token = torch.multinomial(logp.exp(), 1)
                picked.append(logp.gather(-1, token)[:, 0])
                x = torch.cat([x, token], 1)
            logprobs = torch.stack(picked, 1)
            for j in range(n):
                sampled = x[j, len(ids) :].tolist()
                rows.append(
                    {
                        "input_ids": x[j].tolist(),
                        "loss_mask": [0] * len(ids) + [1] * length,
                        "logprobs": [0.0] * len(ids) + logprobs[j].tolist(),
                        "prompt_len": len(ids),
                        "call_starts": [len(ids)],
                        "call_ends": [len(ids) + length],
                        "call_weight_versions": [trainer.version],
                        "group_id": prompt,
                        "reward": float(any(t in digits for t in sampled[:4])),
                    }
                )
        return rows

    def with_advantages(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i in range(0, len(rows), 8):
            group = rows[i : i + 8]
            scored = score([r["reward"] for r in group], estimator="grpo")
            for row, advantage in zip(group, scored.advantages, strict=True):
                row["advantage"] = advantage
        return rows

    def held_out_reward() -> float:
        rows = sample(held_out)
        return sum(r["reward"] for r in rows) / len(rows)

    collate = Collator()
    curve, steps, started = [held_out_reward()], [], time.perf_counter()
    stale = with_advantages(sample(rnd.sample(train, 4)))  # sampled by version 0
    while curve[-1] < 0.8 and len(curve) <= 25:
        result = trainer.step(collate(with_advantages(sample(rnd.sample(train, 4)))))
        steps.append([result.staleness, round(result.ratio, 6), result.clipped])
        curve.append(held_out_reward())
    late = trainer.step(collate(stale))
    saved = trainer.save(OUT / f"v{trainer.version}")
    refused = False
    try:
        trainer.save(saved)
    except FileExistsError:
        refused = True
    original = Path(ARGS["model"]) / "model.safetensors"

    def header(path: Path) -> dict[str, list[int]]:
        with safe_open(str(path), "pt") as f:
            return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118

    reloaded = AutoModelForCausalLM.from_pretrained(ARGS["model"], dtype=torch.float32)
    with safe_open(str(saved / "model.safetensors"), "pt") as f:
        reloaded.load_state_dict({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118
        version = f.metadata()["version"]
    batch = collate(stale)
    model.eval()
    rows = sample(rnd.sample(train, 4))  # by the weights as they are; the reward is ~1
    for i, row in enumerate(rows):  # so advantages of both signs, made up
        row["advantage"] = 1.0 if i % 2 else -1.0
    fresh = collate(rows)

    def gradient(loss: Any, on: dict[str, Any]) -> torch.Tensor:
        model.zero_grad()
        loss(token_logprobs(model, on), on)[0].backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    ppo = gradient(lambda new, on: clipped_loss(new, on, 0.2), fresh)
    decoupled = gradient(lambda new, on: decoupled_loss(new, on, 2.0), fresh)
    late_gradient = gradient(lambda new, on: decoupled_loss(new, on, 2.0), batch)
    _, truncated, weight = decoupled_loss(token_logprobs(model, batch).detach(), batch, 2.0)
    found["decoupled"] = {
        "fresh_same_gradient": bool(torch.allclose(ppo, decoupled, atol=1e-5)),
        "fresh_gradient_norm": float(ppo.norm()),
        "late_gradient_norm": float(late_gradient.norm()),
        "late_weight": float(weight),
        "late_truncated": float(truncated),
    }
    found["reference"] = {
        "curve": curve,
        "steps": steps,
        "late": {"staleness": late.staleness, "clipped": late.clipped, "ratio": late.ratio},
        "seconds": time.perf_counter() - started,
        "same_header": header(saved / "model.safetensors") == header(original),
        "files": sorted(p.name for p in saved.iterdir()),
        "version": version,
        "refused_overwrite": refused,
        "reloaded_equal": bool(
            torch.allclose(token_logprobs(reloaded, batch), token_logprobs(model, batch), atol=1e-6)
        ),
    }


def llama_batch() -> dict[str, Any]:
    """Four rows of 5-12 random tokens of the tiny model's vocabulary, right-padded by
    the collator; advantages of both signs, old logprobs of -7."""
    from stream_export.trainers.collate import Collator

    gen = torch.Generator().manual_seed(3)
    rows = []
    for i, length in enumerate((5, 12, 9, 7)):
        ids = torch.randint(1, 1028, (length,), generator=gen).tolist()
        rows.append(
            {
                "input_ids": ids,
                "loss_mask": [0, 0, 0] + [1] * (length - 3),
                "logprobs": [0.0] * 3 + [-7.0] * (length - 3),
                "call_starts": [3],
                "call_ends": [length],
                "call_weight_versions": [0],
                "advantage": 1.0 if i % 2 else -1.0,
            }
        )
    return Collator()(rows)  # type: ignore[no-any-return]


def plain_llama() -> None:
    """trainers.llama against transformers' LlamaForCausalLM: the loop trainer's build
    (first, before any part imports transformers), its resume and its fallback; on the
    tiny model and on a variant with what it lacks, the logits of right- and left-padded
    rows, the tensors and two reference steps."""
    import argparse
    import shutil

    from safetensors import safe_open

    from stream_export.learn.trainer import LoopTrainer
    from stream_export.settings import load
    from stream_export.trainers import llama
    from stream_export.trainers.reference import ReferenceTrainer

    def args(model: str | Path, state: str) -> argparse.Namespace:
        return argparse.Namespace(
            model=str(model), state_dir=str(OUT / state), threads=1, lr=3e-2, clip=0.2,
            loss="decoupled", cap=2.0,
        )  # fmt: skip

    # the loop trainer as its process builds it, a step, a save, and its restart on
    # that checkpoint: the weights and the optimizer's state
    right = llama_batch()
    loop = LoopTrainer(args(ARGS["model"], "loop"), load())
    loop.trainer = loop._build()  # noqa: SLF001
    loop.trainer.step(right)
    path = loop._save({"version": 1, "records": [], "stepped": True, "rollouts": []})  # noqa: SLF001
    resumed = LoopTrainer(args(ARGS["model"], "loop"), load())._build()  # noqa: SLF001
    resumed_apart = max(
        float((v - loop.trainer.model.state_dict()[k]).abs().max())
        for k, v in resumed.model.state_dict().items()
    )
    built = {
        "class": type(loop.trainer.model).__module__,
        "transformers_imported": "transformers" in sys.modules,
        "dynamo_imported": "torch._dynamo" in sys.modules,  # 1.1 CPU s of the start
    }
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    # the same rows left-padded: each row's tokens moved to its end
    left = {k: torch.zeros_like(right[k]) for k in ("input_ids", "attention_mask", "position_ids")}
    lengths = right["attention_mask"].sum(1).tolist()
    for i, n in enumerate(lengths):
        for k in left:
            left[k][i, -n:] = right[k][i, :n]
    valid_right, valid_left = right["attention_mask"].bool(), left["attention_mask"].bool()

    def logits(model: Any, on: dict[str, Any]) -> torch.Tensor:
        with torch.no_grad():
            return model(
                input_ids=on["input_ids"],
                attention_mask=on["attention_mask"],
                position_ids=on["position_ids"],
            ).logits

    def signature(model: Any) -> list[list[Any]]:
        return sorted([k, list(v.shape), str(v.dtype)] for k, v in model.state_dict().items())

    def header(path: Path) -> dict[str, list[Any]]:
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            slices = {k: f.get_slice(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
            return {k: [list(v.get_shape()), v.get_dtype()] for k, v in slices.items()}

    def compare(folder: Path) -> dict[str, Any]:
        plain = llama.load(folder, torch.float32)
        reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        assert not isinstance(plain, str), plain
        plain_right, plain_left = logits(plain, right), logits(plain, left)
        apart = {  # before the steps below change both models
            "right": float((plain_right - logits(reference, right))[valid_right].abs().max()),
            "left": float((plain_left - logits(reference, left))[valid_left].abs().max()),
            "left_right": float((plain_left[valid_left] - plain_right[valid_right]).abs().max()),
        }
        saved = ReferenceTrainer(plain).save(OUT / f"plain-{folder.name}")
        same = {  # the file each one's reference trainer writes, and the checkpoint's
            "state_dict": signature(plain) == signature(reference),
            "saved": header(saved)
            == header(ReferenceTrainer(reference).save(OUT / f"transformers-{folder.name}")),
            "checkpoint": header(saved) == header(folder),
        }
        # one step of each on the same batch, then the loss of a second step on it
        steps = {}
        for name, model in (("plain", plain), ("transformers", reference)):
            trainer = ReferenceTrainer(model, loss="ppo")
            first, second = trainer.step(right), trainer.step(right)
            steps[name] = {"loss": [first.loss, second.loss], "clipped": second.clipped}
        after = {k: v.detach() for k, v in reference.state_dict().items()}
        return {
            "apart": apart,
            "left_nan": bool(plain_left.isnan().any()),
            "same": same,
            "state_dict_keys": len(signature(plain)),
            "steps": steps,
            "weights_apart_after_steps": max(
                float((v - after[k]).abs().max()) for k, v in plain.state_dict().items()
            ),
        }

    # what the tiny model lacks: grouped KV heads, a head_dim apart from hidden / heads,
    # biases, tied embeddings (left out of the file), a top-level rope_theta
    torch.manual_seed(5)
    variant = LlamaConfig(
        vocab_size=1028, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=24, attention_bias=True,
        mlp_bias=True, tie_word_embeddings=True, pad_token_id=0, rms_norm_eps=1e-5,
    )  # fmt: skip
    LlamaForCausalLM(variant).save_pretrained(OUT / "variant")
    config = json.loads((OUT / "variant" / "config.json").read_text())
    del config["rope_parameters"]  # as transformers 4 wrote it
    config["rope_theta"] = 5e5
    (OUT / "variant" / "config.json").write_text(json.dumps(config))

    tiny, varied = compare(Path(ARGS["model"])), compare(OUT / "variant")

    # a config the module does not implement builds through transformers
    scaled = OUT / "linear-rope"
    shutil.copytree(ARGS["model"], scaled)
    config = json.loads((scaled / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    (scaled / "config.json").write_text(json.dumps(config))
    fallback = LoopTrainer(args(scaled, "fallback"), load())._build()  # noqa: SLF001
    found["llama"] = {
        "built": built,
        "resumed": {"version": resumed.version, "class": type(resumed.model).__module__},
        "resumed_apart": resumed_apart,
        "optimizer_resumed": bool(resumed.optimizer.state_dict()["state"]),
        "checkpoint": path.name,
        "padded_rows": [int(n) for n in lengths],
        "tiny": tiny,
        "variant": varied,
        "fallback": {
            "class": type(fallback.model).__module__,
            "refusal": llama.load(scaled, torch.float32),
        },
        "refusals": {name: llama.refusal(c) for name, c in ARGS["configs"].items()},
    }


def adamw() -> None:
    """trainers.adamw against torch.optim.AdamW (which imports torch._dynamo, so after
    plain_llama): the reference trainer's steps with each, from the same weights on the
    same batch, and each resumed from the other's state saved as optimizer.pt."""
    import copy

    from stream_export.errors import TrainerInputError
    from stream_export.trainers import llama
    from stream_export.trainers.adamw import AdamW
    from stream_export.trainers.reference import ReferenceTrainer

    batch, model = llama_batch(), llama.load(ARGS["model"], torch.float32)
    assert not isinstance(model, str), model

    def trainer(torch_adamw: bool = False, like: ReferenceTrainer | None = None) -> Any:
        made = ReferenceTrainer(copy.deepcopy(like.model if like else model), loss="decoupled")
        if torch_adamw:
            made.optimizer = torch.optim.AdamW(made.model.parameters(), lr=3e-2)
        return made

    def steps(*trainers: Any, n: int) -> None:
        for _ in range(n):
            for each in trainers:
                each.step(batch)

    def apart(a: Any, b: Any) -> float:
        theirs = b.model.state_dict()
        return max(float((v - theirs[k]).abs().max()) for k, v in a.model.state_dict().items())

    def resumed(saved_by: Any, torch_adamw: bool = False) -> Any:
        """A new trainer on ``saved_by``'s weights and optimizer.pt, as a restart."""
        torch.save(saved_by.optimizer.state_dict(), OUT / "optimizer.pt")
        made = trainer(torch_adamw, like=saved_by)
        made.optimizer.load_state_dict(torch.load(OUT / "optimizer.pt", weights_only=True))
        return made

    plain, reference, untrained = trainer(), trainer(torch_adamw=True), trainer()
    steps(plain, reference, n=3)
    after_three = apart(plain, reference)
    plain_from_plain, plain_from_torch = resumed(plain), resumed(reference)
    torch_from_plain = resumed(plain, torch_adamw=True)
    steps(plain, reference, plain_from_plain, plain_from_torch, torch_from_plain, n=2)
    grads = [p.grad for p in plain.model.parameters() if p.grad is not None]  # of the last step
    refused = {}
    for name, state in {
        "other_model": plain.optimizer.state_dict(),
        "two_groups": {"state": {}, "param_groups": [{}, {}]},
        "not_a_state": {"exp_avg": []},
    }.items():
        try:
            AdamW(torch.nn.Linear(2, 2).parameters()).load_state_dict(state)
        except TrainerInputError as error:
            refused[name] = str(error)
    theirs = reference.optimizer.state_dict()["param_groups"][0]
    found["adamw"] = {
        "settings": [
            {k: group[k] for k in ("lr", "betas", "eps", "weight_decay")}
            for group in (plain.optimizer.state_dict()["param_groups"][0], theirs)
        ],
        "moved": apart(plain, untrained),
        "clipped_norm": float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))),
        "apart_after_3": after_three,
        "apart_after_5": apart(plain, reference),
        "resumed_apart": {
            "plain_from_plain": apart(plain_from_plain, plain),
            "plain_from_torch": apart(plain_from_torch, reference),
            "torch_from_plain": apart(torch_from_plain, plain),
        },
        "refused": refused,
    }


for part in (
    plain_llama,
    adamw,
    collator,
    trl_rollout_func,
    trl_async_worker,
    verl_agent_loop,
    reference_trainer,
):
    began = time.perf_counter()
    part()
    found.setdefault("seconds", {})[part.__name__] = round(time.perf_counter() - began, 2)
print(json.dumps(found))
