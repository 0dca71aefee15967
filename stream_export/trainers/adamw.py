"""``torch.optim.AdamW``'s update in plain tensor ops, for the reference trainer.

Any ``torch.optim`` optimizer imports ``torch._dynamo`` on its first call (torch 2.13
wraps its methods in ``torch._disable_dynamo``): 1.1 CPU s more at each start of the
loop's trainer, restarts after a kill -9 included. This one does what
``torch.optim.AdamW`` does on CPU for one group of parameters (its single-tensor
path, without amsgrad or maximize)::

    p     <- p * (1 - lr * weight_decay)                 (decoupled weight decay)
    m     <- m + (1 - beta1) * (g - m)
    v     <- beta2 * v + (1 - beta2) * g * g
    p     <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

Its ``state_dict`` has torch's layout (``state``: for each parameter's index, ``step``,
``exp_avg`` and ``exp_avg_sq`` tensors; ``param_groups``: the settings and the
indices), plain tensors and numbers that ``torch.load(weights_only=True)`` reads. So it
resumes from an ``optimizer.pt`` that ``torch.optim.AdamW`` wrote, and torch's from its.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from stream_export.errors import TrainerInputError

#: The moments, besides ``step``, that the state holds for each parameter.
MOMENTS = ("exp_avg", "exp_avg_sq")


class AdamW:
    """``torch.optim.AdamW(params, lr, betas, eps, weight_decay)`` (torch's defaults)."""

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        *,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        self.params = list(params)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        #: For each index of a parameter that had a gradient: step, exp_avg, exp_avg_sq.
        self.state: dict[int, dict[str, torch.Tensor]] = {}

    def zero_grad(self) -> None:
        """Drop the gradients (``set_to_none``, torch's default)."""
        for param in self.params:
            param.grad = None

    @torch.no_grad()  # type: ignore[untyped-decorator]
    def step(self) -> None:
        """One update of each parameter that has a gradient."""
        beta1, beta2 = self.betas
        for i, param in enumerate(self.params):
            grad = param.grad
            if grad is None:
                continue
            state = self.state.get(i)
            if state is None:  # step on the CPU in float32, as torch keeps it
                zeros = torch.zeros_like(param, memory_format=torch.preserve_format)
                state = {"step": torch.tensor(0.0), "exp_avg": zeros, "exp_avg_sq": zeros.clone()}
                self.state[i] = state
            state["step"] += 1
            t = state["step"].item()
            param.mul_(1 - self.lr * self.weight_decay)
            state["exp_avg"].lerp_(grad, 1 - beta1)
            state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (state["exp_avg_sq"].sqrt() / (1 - beta2**t) ** 0.5).add_(self.eps)
            param.addcdiv_(state["exp_avg"], denom, value=-self.lr / (1 - beta1**t))

    def state_dict(self) -> dict[str, Any]:
        """The moments and settings, in ``torch.optim.AdamW``'s layout."""
        group = {
            "lr": self.lr,
            "betas": self.betas,
            "eps": self.eps,
            "weight_decay": self.weight_decay,
            "amsgrad": False,
            "maximize": False,
            "params": list(range(len(self.params))),
        }
        return {"state": {i: dict(s) for i, s in self.state.items()}, "param_groups": [group]}

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        """Take up ``saved`` (this class's or ``torch.optim.AdamW``'s): its moments and,
        as torch does, its settings. A state that does not fit the parameters is refused."""
        try:
            (group,) = saved["param_groups"]
            settings = group["lr"], tuple(group["betas"]), group["eps"], group["weight_decay"]
            if group.get("amsgrad") or group.get("maximize"):
                raise TrainerInputError("an AdamW state with amsgrad or maximize")
            n = len(self.params)
            if list(group["params"]) != list(range(n)) or not set(saved["state"]) <= set(range(n)):
                raise TrainerInputError(
                    f"an AdamW state of {len(group['params'])} parameters, not {n}"
                )
            state = {i: self._moments(self.params[i], s) for i, s in saved["state"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            detail = f"not an AdamW state of one group of parameters: {error!r}"
            raise TrainerInputError(detail) from error
        self.lr, self.betas, self.eps, self.weight_decay = settings
        self.state = state

    @staticmethod
    def _moments(param: torch.Tensor, saved: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One parameter's saved state, copied as the parameter's dtype and device (the
        step in float32)."""
        if any(saved[k].shape != param.shape for k in MOMENTS):
            raise TrainerInputError(f"AdamW moments of another shape than {tuple(param.shape)}")
        step = saved["step"].detach().float().cpu().clone()
        return {"step": step} | {k: saved[k].detach().to(param).clone() for k in MOMENTS}
