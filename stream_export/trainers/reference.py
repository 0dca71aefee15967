"""A small reference online GRPO trainer in plain PyTorch: one step from a collated
batch, and the new weights written as a safetensors directory.

The step is PPO-clipped policy gradient over the tokens the calls sampled, with
importance ratios against the logprobs the inference server recorded (the policy
that actually sampled, which may be a version or two behind)::

    ratio_t = exp(logp_new_t - logp_old_t)
    loss    = token-mean over loss_mask of -min(ratio_t * A, clip(ratio_t, 1-e, 1+e) * A)

no KL term, AdamW (``trainers.adamw``: torch's update, without importing
``torch._dynamo``), gradient norm clipped. ``A`` is the group's advantage of the
rollout (``collate``'s ``advantages``).

With ``loss="decoupled"`` (AReaL's decoupled PPO objective, the trainer's weights
before the step as the proximal policy) stale rollouts still learn: a step is one
update, so the ratio against the proximal policy is 1 and its clip never bites; each
token is weighted instead by the truncated importance weight of the policy that
sampled it::

    w_t  = min(exp(logp_prox_t - logp_old_t), cap)        (no gradient)
    loss = token-mean over loss_mask of -w_t * exp(logp_new_t - logp_prox_t) * A

On fresh rollouts ``w_t`` is 1 and both losses give the same gradient; one version
behind, the PPO clip against the recorded logprobs cuts most tokens (the design
notes measured 17-33 steps to the toy task's reward, against 6-13 fresh).

A step counts one weight version; ``save``
writes ``model.safetensors`` (all the model's tensors, as the server loads them) into
a new directory, atomically (a temporary name renamed), so a weight fence never sees
half a file.

Needs torch and safetensors (the ``trainers`` extra); the model is any causal LM that
takes ``input_ids``, ``attention_mask`` and ``position_ids`` and answers ``.logits``
(a transformers ``AutoModelForCausalLM``, or ``trainers.llama``'s plain-PyTorch Llama).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import save_file

from stream_export.errors import TrainerInputError
from stream_export.trainers.adamw import AdamW


@dataclass(frozen=True)
class StepResult:
    """What one step did: its loss, how often the clip bit (decoupled: the importance
    weight's truncation), the mean ratio (decoupled: importance weight), and the
    staleness it saw (the trainer's version minus the oldest version that sampled a
    token of the batch; -1 when no token has an integer version)."""

    version: int
    loss: float
    clipped: float
    ratio: float
    tokens: int
    staleness: int


def token_logprobs(
    model: torch.nn.Module, batch: Mapping[str, Any], temperature: float = 1.0
) -> torch.Tensor:
    """Each token's logprob under ``model`` given the tokens before it, aligned with
    ``input_ids`` (0.0 at position 0, which nothing predicts)."""
    ids = batch["input_ids"]
    logits = (
        model(
            input_ids=ids,
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        )
        .logits[:, :-1]
        .float()
    )
    picked = torch.log_softmax(logits / temperature, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    return torch.nn.functional.pad(picked, (1, 0))


def clipped_loss(
    new: torch.Tensor, batch: Mapping[str, Any], clip: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The token-mean PPO-clip loss, the share of tokens clipped and the mean ratio."""
    mask = batch["loss_mask"].float()
    count = mask.sum().clamp(min=1.0)
    ratio = torch.exp(new - batch["old_logprobs"]) * mask + (1.0 - mask)
    advantages = batch["advantages"]
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip, 1.0 + clip) * advantages
    loss = (-torch.minimum(unclipped, clipped) * mask).sum() / count
    bit = ((unclipped != clipped).float() * mask).sum() / count
    return loss, bit, (ratio * mask).sum() / count


def decoupled_loss(
    new: torch.Tensor, batch: Mapping[str, Any], cap: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The token-mean decoupled loss (see the module doc), the share of tokens whose
    importance weight was truncated at ``cap`` and the mean weight before truncation."""
    mask = batch["loss_mask"].float()
    count = mask.sum().clamp(min=1.0)
    weight = torch.exp(new.detach() - batch["old_logprobs"]) * mask + (1.0 - mask)
    ratio = torch.exp(new - new.detach())  # 1, with the policy's gradient
    loss = (-weight.clamp(max=cap) * ratio * batch["advantages"] * mask).sum() / count
    truncated = ((weight > cap).float() * mask).sum() / count
    return loss, truncated, (weight * mask).sum() / count


class ReferenceTrainer:
    """Steps ``model`` on collated batches (``collate.Collator``) and saves it."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        lr: float = 3e-2,
        clip: float = 0.2,
        max_grad_norm: float = 1.0,
        temperature: float = 1.0,
        version: int = 0,
        loss: Literal["ppo", "decoupled"] = "ppo",
        cap: float = 2.0,
    ) -> None:
        self.model = model
        self.clip, self.max_grad_norm, self.temperature = clip, max_grad_norm, temperature
        self.loss, self.cap = loss, cap
        self.optimizer = AdamW(model.parameters(), lr=lr)
        self.version = version

    def step(self, batch: Mapping[str, Any]) -> StepResult:
        """One optimizer step on ``batch``; the weights become version ``version + 1``."""
        tokens = int(batch["loss_mask"].sum())
        if tokens == 0:
            raise TrainerInputError("a batch without a sampled token trains nothing")
        self.model.train()
        new = token_logprobs(self.model, batch, self.temperature)
        if self.loss == "decoupled":
            loss, clipped, ratio = decoupled_loss(new, batch, self.cap)
        else:
            loss, clipped, ratio = clipped_loss(new, batch, self.clip)
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        versions = batch["weight_versions"][batch["weight_versions"] >= 0]
        stale = self.version - int(versions.min()) if versions.numel() else -1
        self.version += 1
        return StepResult(self.version, loss.item(), clipped.item(), ratio.item(), tokens, stale)

    def save(self, directory: str | Path) -> Path:
        """Write the weights to ``directory``/model.safetensors; ``directory`` must not
        exist yet (a server reloading from it must see one version only)."""
        target = Path(directory)
        if target.exists():
            raise FileExistsError(f"{target} exists: write each version to a new directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            state = {k: v.detach().contiguous().clone() for k, v in self.model.state_dict().items()}
            save_file(state, staging / "model.safetensors", metadata={"version": str(self.version)})
            os.replace(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return target
