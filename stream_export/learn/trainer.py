"""The live loop's trainer process: closed groups from the feed -> one reference GRPO
step -> new weights saved, fenced and loaded into vLLM -> the batch acknowledged.

Run by ``stream-export learn`` (which finds a Python with torch) or directly::

    python -m stream_export.learn.trainer --model DIR --vllm URL --state-dir DIR

Each step, in this order, so that a kill -9 anywhere loses nothing and trains
nothing twice:

1. take a batch of closed groups (``Feed``, the ``groups`` source);
2. leave out the groups the ledger already holds (delivered again after a crash
   between step 4 and step 6), and the ones with nothing to train (logged); when
   the batch's rollouts take a version to the target, record the batch in the
   ledger unstepped, acknowledge it and end: the version that reached the target
   keeps serving (a step on the batch would only make a version nobody tried);
3. step (``ReferenceTrainer``) and save ``weights/v<N>`` (``model.safetensors``,
   ``optimizer.pt``, then ``trained.json``: the step's ledger entry, written last,
   so a checkpoint without it is a torn one and is removed at start);
4. append the entry to ``ledger.jsonl`` (fsync);
5. fence the gateways for version N and load ``weights/v<N>`` into vLLM;
6. acknowledge the batch.

At start the trainer takes up the newest whole checkpoint (weights and optimizer),
appends its entry to the ledger if the crash came before step 4, and, when the
fence serves another version, loads it (version 0 is the model's own weights), so
every call after that is served, and recorded, by the version the trainer holds;
then it writes the version to ``serving`` in the state folder.

With ``--vllm-restart COMMAND``, a reload that fails (vLLM's dev-mode reload left it
paused or dead) restarts vLLM with COMMAND and loads the checkpoint that served
before as its version again; the fence is aborted, so calls flow under that version,
and the trainer ends (exit 4). ``stream-export learn`` starts it again: the failed
version's checkpoint and ledger entry are written (steps 3-4), so it takes that
checkpoint up, loads it behind a new fence, and leaves out the batch delivered again
(its records are in the ledger). Ending rather than retrying in the process reuses
that start, the path a kill -9 during a fence already takes, and the supervisor's
``--restarts`` bounds a reload that keeps failing. The restart needs a version that
served before (one the fence committed) with its checkpoint still here (version 0:
``--model``); without one, or without ``--vllm-restart``, a failed reload leaves vLLM
paused and the fence closed until it expires (``weights.on_fence_timeout``).
It ends (exit 0) once the rollouts one version served reach ``--target`` mean reward
over at least ``--window`` of them, or (exit 3) after ``--max-steps`` versions.
One JSON line per step on stdout: version, loss, staleness, the batch's mean reward,
seconds waiting for the feed, stepping, fencing (holding the gateways, loading,
committing) and acknowledging, the median seconds from a group's close to the trainer, the
process's CPU seconds so far and the time (``at``, Unix seconds); before them one
line with the times its checkpoint served (``serving_at``) and its model was built
(``built_at``).

Needs torch and safetensors (the ``trainers`` extra); transformers too for a model
that is not a Llama checkpoint (see ``trainers.llama``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stream_export.contract.calls import WeightVersion
from stream_export.contract.groups import GroupRecord, rollout_reward
from stream_export.errors import ServerRestartedError, TrainerInputError
from stream_export.feed import Batch, Feed
from stream_export.learn.ledger import Ledger
from stream_export.settings import Settings, load
from stream_export.trainers.collate import Collator, collate, version_number
from stream_export.weights import WeightFence
from stream_export.weights import vllm as vllm_weights

if TYPE_CHECKING:
    from stream_export.trainers.reference import ReferenceTrainer

EXIT_MAX_STEPS = 3
#: A reload failed and vLLM was restarted on the version before (see the module doc).
EXIT_VLLM_RESTARTED = 4
#: Checkpoints kept besides the newest (older ones are removed).
KEEP = 1


def checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """Whole checkpoints (with ``trained.json``), oldest first; torn ones removed."""
    found = []
    for path in folder.glob("v*") if folder.exists() else []:
        if not path.name[1:].isdigit():
            continue  # a save's staging folder (.v<N>.*)
        if (path / "trained.json").exists():
            found.append((int(path.name[1:]), path))
        else:
            shutil.rmtree(path)
    return sorted(found)


def rollouts(group: GroupRecord) -> list[list[float]]:
    """Each rollout's [oldest serving version, reward]."""
    out = []
    for episode in group.rollouts:
        low = episode.tokens.weight_version_min if episode.tokens is not None else None
        out.append([version_number(low), rollout_reward(episode)])
    return out


def trainable(groups: Sequence[GroupRecord]) -> tuple[list[GroupRecord], list[str]]:
    """The groups the collator takes, and why each other one was left out."""
    kept, refused = [], []
    for group in groups:
        try:
            if collate([group])["input_ids"]:
                kept.append(group)
            else:
                refused.append(f"{group.record_id}: no sampled token")
        except TrainerInputError as error:
            refused.append(f"{group.record_id}: {error}")
    return kept, refused


class LoopTrainer:
    """The loop's trainer. It imports torch and builds the model in a thread while it
    serves its newest checkpoint (fence and load) and takes its first batch, so the
    agents play while it does (seconds)."""

    trainer: ReferenceTrainer  # built in run()

    def __init__(self, args: argparse.Namespace, settings: Settings) -> None:
        self.args, self.settings = args, settings
        self.state = Path(args.state_dir)
        self.weights = self.state / "weights"
        self.weights.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger.open(self.state / "ledger.jsonl")
        self.collator = Collator()
        self.version, self.serving_dir = 0, Path(args.model)
        found = checkpoints(self.weights)
        if found:
            self.version, self.serving_dir = found[-1]
            entry = json.loads((self.serving_dir / "trained.json").read_text())
            if self.version > self.ledger.version:  # killed between the save and the ledger
                self.ledger.append(entry)

    def _build(self) -> ReferenceTrainer:
        """The model at the served version, with its optimizer (imports torch). A Llama
        checkpoint builds as the plain-PyTorch module, without importing transformers
        (~1.5 s); any other through transformers."""
        import torch
        from safetensors.torch import load_file

        from stream_export.trainers import llama
        from stream_export.trainers.reference import ReferenceTrainer

        torch.set_num_threads(self.args.threads)
        model = llama.load(self.args.model, torch.float32)
        if isinstance(model, str):
            print(f"trainer: {model}: building through transformers", file=sys.stderr, flush=True)
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(self.args.model, dtype=torch.float32)
        a = self.args
        trainer = ReferenceTrainer(model, lr=a.lr, clip=a.clip, loss=a.loss, cap=a.cap)
        if self.version:
            model.load_state_dict(load_file(str(self.serving_dir / "model.safetensors")))
            saved = torch.load(self.serving_dir / "optimizer.pt", weights_only=True)
            trainer.optimizer.load_state_dict(saved)  # torch.optim.AdamW's too (older runs)
            trainer.version = self.version
        return trainer

    async def run(self) -> int:
        # torch and the model load in a thread from the start, while the fence serves
        # the checkpoint and the feed joins its group and takes the first batch: importing
        # torch (about 1.5 CPU s) is the longest wait of the loop's start
        building = asyncio.ensure_future(asyncio.to_thread(self._build))
        async with WeightFence(self.settings) as fence:
            await self._serve(fence, self.version, self.serving_dir)
            (self.state / "serving").write_text(str(self.version))
            serving = time.time()
            with Feed(
                self.settings,
                "groups",
                group_id=self.args.feed_group,
                batch_size=self.args.groups_per_step,
                max_wait_s=self.args.max_wait_s,
            ) as feed:
                first = None
                if not self._done() and self.version < self.args.max_steps:
                    first = asyncio.ensure_future(asyncio.to_thread(feed.next_batch))
                self.trainer = await building
                print(json.dumps({"serving_at": serving, "built_at": time.time()}), flush=True)
                while not self._done():
                    if self.trainer.version >= self.args.max_steps:
                        return EXIT_MAX_STEPS
                    await self._step(feed, fence, first)
                    first = None
        return 0

    def _done(self, pending: Sequence[list[float]] = ()) -> bool:
        return self.ledger.reached(self.args.target, self.args.window, pending)

    async def _serve(self, fence: WeightFence, version: int, directory: Path) -> dict[str, float]:
        """Fence and load ``directory`` as ``version`` unless it serves already; the
        seconds holding the gateways (until no call is in flight), loading into vLLM
        and lifting the fence."""
        serving = await fence.serving()
        if serving == version:
            return {}
        restart = self._restart(serving)
        began = time.monotonic()
        async with fence.update(version):
            held = time.monotonic()
            await vllm_weights.load(self.args.vllm, directory, version, restart=restart)
            loaded = time.monotonic()
        return {
            "hold_s": round(held - began, 3),
            "load_s": round(loaded - held, 3),
            "commit_s": round(time.monotonic() - loaded, 3),
        }

    def _restart(self, serving: WeightVersion | None) -> vllm_weights.Restart | None:
        """How to bring vLLM back on ``serving`` (the version the fence serves) when a
        reload fails: ``--vllm-restart``, then its checkpoint (version 0: ``--model``);
        None without the option, or when that checkpoint is not here."""
        if not self.args.vllm_restart or not isinstance(serving, int):
            return None
        directory = Path(self.args.model) if serving == 0 else self.weights / f"v{serving}"
        if not directory.is_dir():
            print(
                f"trainer: version {serving} serves, but its checkpoint {directory} is gone: "
                "a failed reload will not restart vLLM",
                file=sys.stderr,
                flush=True,
            )
            return None
        command = shlex.split(self.args.vllm_restart)
        timeout_s = self.args.vllm_restart_timeout_s
        return vllm_weights.Restart(command, directory, serving, timeout_s=timeout_s)

    async def _step(self, feed: Feed, fence: WeightFence, taking: Awaitable[Batch] | None) -> None:
        """One step on the batch ``taking`` brings (taken while the model loaded), else
        on the feed's next one."""
        waited = time.monotonic()
        batch = await (taking or asyncio.to_thread(feed.next_batch))
        began = time.monotonic()
        fresh = [g for g in batch.items if g.record_id not in self.ledger.trained]
        groups, refused = trainable(fresh)
        for reason in refused:
            print(f"trainer: left out {reason}", file=sys.stderr, flush=True)
        entry: dict[str, Any] = {
            "version": self.trainer.version,
            "records": [g.record_id for g in fresh],
            "stepped": False,
            "rollouts": [r for g in groups for r in rollouts(g)],
        }
        line: dict[str, Any] = {"waited_s": round(began - waited, 3)}
        if batch.items:  # seconds from the worker closing a group to the trainer having it
            ages = sorted(time.time() - g.closed_at for g in batch.items)
            line["age_s"] = round(ages[len(ages) // 2], 3)
        if groups and not self._done(entry["rollouts"]):
            result = self.trainer.step(self.collator(groups))
            entry |= {"version": result.version, "stepped": True, "staleness": result.staleness}
            line |= {"loss": round(result.loss, 5), "clipped": round(result.clipped, 4)}
            path = self._save(entry)
            self.ledger.append(entry)
            stepped = time.monotonic()
            phases = await self._serve(fence, result.version, path)
            line |= {"step_s": round(stepped - began, 3), "fence_s": time.monotonic() - stepped}
            line |= phases
        elif fresh:  # nothing to train, or the target reached: the serving version stays
            self.ledger.append(entry)
        acking = time.monotonic()
        await asyncio.to_thread(batch.ack)
        line["ack_s"] = round(time.monotonic() - acking, 3)
        rewards = [r for _, r in entry["rollouts"]]
        line |= {
            "version": entry["version"],
            "groups": len(batch.items),
            "fresh": len(fresh),
            "staleness": entry.get("staleness"),
            "reward": sum(rewards) / len(rewards) if rewards else None,
            "cpu_s": round(time.process_time(), 3),
            "at": round(time.time(), 3),
        }
        print(json.dumps(line), flush=True)

    def _save(self, entry: dict[str, Any]) -> Path:
        import torch

        path = self.trainer.save(self.weights / f"v{self.trainer.version}")
        torch.save(self.trainer.optimizer.state_dict(), path / "optimizer.pt")
        staging = path / "trained.json.tmp"
        staging.write_text(json.dumps(entry))
        staging.replace(path / "trained.json")
        for _, old in checkpoints(self.weights)[: -(KEEP + 1)]:
            shutil.rmtree(old)
        return path


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m stream_export.learn.trainer", description=__doc__)
    p.add_argument("--model", required=True, help="the served model's folder (transformers)")
    p.add_argument("--vllm", required=True, help="the vLLM server's URL (dev mode)")
    p.add_argument("--state-dir", required=True, help="checkpoints and the ledger")
    p.add_argument(
        "--vllm-restart",
        metavar="COMMAND",
        help="a command (split like a shell's) that restarts vLLM at the same URL, "
        "run when a reload fails (see the module doc)",
    )
    p.add_argument(
        "--vllm-restart-timeout-s",
        type=float,
        default=vllm_weights.Restart.timeout_s,
        help="for the restart command and vLLM to answer again",
    )
    p.add_argument("--feed-group", default="trainer", help="the feed's consumer group")
    p.add_argument("--groups-per-step", type=int, default=4)
    p.add_argument(
        "--max-wait-s", type=float, default=10.0, help="for a batch to fill (then fewer groups)"
    )
    p.add_argument("--lr", type=float, default=3e-2)
    p.add_argument("--clip", type=float, default=0.2, help="PPO clip (--loss ppo)")
    p.add_argument(
        "--loss",
        choices=("decoupled", "ppo"),
        default="decoupled",
        help="decoupled: stale rollouts weighted by their truncated importance weight; "
        "ppo: clipped against the recorded logprobs (see trainers.reference)",
    )
    p.add_argument("--cap", type=float, default=2.0, help="importance weight cap (decoupled)")
    p.add_argument("--target", type=float, default=0.8, help="mean reward that ends the loop")
    p.add_argument("--window", type=int, default=32, help="rollouts of one version to count")
    p.add_argument("--max-steps", type=int, default=40, help="versions before giving up")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--config", help="TOML settings file")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    trainer = LoopTrainer(args, load(file=args.config, overrides=args.set))
    try:
        return asyncio.run(trainer.run())
    except ServerRestartedError as error:
        print(f"trainer: {error}; ending, to load it again at start", file=sys.stderr, flush=True)
        return EXIT_VLLM_RESTARTED


if __name__ == "__main__":
    code = main()
    # everything is written (the ledger fsync'd, the checkpoints renamed into place)
    # and closed: skip the interpreter's teardown of torch, seconds on a loaded machine
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
