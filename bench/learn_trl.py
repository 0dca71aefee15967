"""TRL's own in-process GRPOTrainer on the live loop's toy task, for bench.learn_loop
(never in CI). Runs in dev/trainers' environment (TRL 1.16, torch), on CPU:

    python bench/learn_trl.py --model DIR [--target 0.8] [--max-steps 40] [--seed N]

The same task as ``stream-export learn``'s default: a fresh five-word prompt for
every group (stream_export.learn.tasks.prompts), as a chat message; 8 completions
of 12 tokens at temperature 1.0 per prompt, 4 prompts a step; reward 1.0 when one
of the first four completion tokens is a digit; AdamW at lr 3e-2 (constant), PPO
clip 0.2, grad clip 1.0, no KL, one torch thread. Generation is TRL's own
(transformers ``generate`` on the training model, in process).

Prints one JSON line per step ({"step", "reward", "at_s"}: seconds since the
trainer was built) and stops at the first step whose batch's mean reward reaches
``--target``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from itertools import islice
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from datasets import Dataset
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from stream_export.learn.tasks import DIGITS, prompts

GROUP_SIZE, GROUPS_PER_STEP = 8, 4


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--target", type=float, default=0.8)
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True, help="a folder for TRL's own output")
    args = p.parse_args()
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(args.model)

    def digit(completion_ids: list[list[int]], **_: object) -> list[float]:
        return [
            float(any(tokenizer.decode([t]).strip() in DIGITS for t in ids[:4]))
            for ids in completion_ids
        ]

    tasks = islice(prompts(None, args.seed), args.max_steps * GROUPS_PER_STEP)
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": t["prompt"]}]} for t in tasks]
    )
    config = GRPOConfig(
        output_dir=args.out,
        use_cpu=True,
        seed=args.seed,
        per_device_train_batch_size=GROUP_SIZE * GROUPS_PER_STEP,
        gradient_accumulation_steps=1,
        num_generations=GROUP_SIZE,
        max_completion_length=12,
        temperature=1.0,
        learning_rate=3e-2,
        lr_scheduler_type="constant",
        epsilon=0.2,
        beta=0.0,
        max_grad_norm=1.0,
        max_steps=args.max_steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        shuffle_dataset=False,
        dataloader_num_workers=0,
    )

    class Stop(TrainerCallback):  # type: ignore[misc]
        def on_log(self, _a, state, control, logs=None, **_k):  # type: ignore[no-untyped-def]
            if logs and "reward" in logs:
                line = {"step": state.global_step, "reward": logs["reward"]}
                print(json.dumps(line | {"at_s": round(time.monotonic() - began, 3)}), flush=True)
                control.should_training_stop = logs["reward"] >= args.target

    trainer = GRPOTrainer(
        model=args.model,
        reward_funcs=digit,
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Stop()],
    )
    began = time.monotonic()
    trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
