"""The Llama architecture in plain PyTorch, so that the live loop's trainer builds its
model without importing transformers (about 1.5 s of every start and restart: the rest
of that import's ~2.5 s is torch._dynamo, which torch's optimizers import anyway).

``LlamaForCausalLM`` has transformers' parameter names, shapes and dtypes: its
``state_dict()`` is what ``ReferenceTrainer.save`` writes and vLLM loads. It computes
what transformers' ``LlamaForCausalLM`` does for training (no KV cache, no generation
helpers): causal attention over the padding mask, RoPE at ``position_ids``, grouped
KV heads, RMSNorm in float32 and a SwiGLU MLP.

``load(folder, dtype)`` builds it from ``config.json`` and ``model.safetensors``, or
answers why not (``refusal``, a pure function of the config): another architecture,
RoPE scaling, sliding windows, a sharded checkpoint. Then build through transformers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn import functional

#: What a config must say; the rest has transformers' ``LlamaConfig`` defaults.
REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


def _rope_kinds(config: Mapping[str, Any]) -> set[str]:
    kinds = set()
    for key in ("rope_parameters", "rope_scaling"):  # transformers 5 and 4 spell it so
        rope = config.get(key) or {}
        kinds.add(str(rope.get("rope_type", rope.get("type", "default"))))
    return kinds


def refusal(config: Mapping[str, Any]) -> str | None:
    """Why this module does not implement ``config`` (a ``config.json``); None when it does."""
    if config.get("architectures") != ["LlamaForCausalLM"]:
        return f"architectures {config.get('architectures')}"
    missing = [k for k in REQUIRED if k not in config]
    if missing:
        return f"no {', '.join(missing)} in the config"
    if _rope_kinds(config) != {"default"}:
        return f"rope type {sorted(_rope_kinds(config) - {'default'})}"
    if config.get("sliding_window") or set(config.get("layer_types") or []) - {"full_attention"}:
        return "sliding-window attention"
    if config.get("hidden_act", "silu") != "silu":
        return f"activation {config['hidden_act']!r}"
    if config.get("attention_dropout") or config.get("quantization_config"):
        return "attention dropout or quantization"
    return None


@dataclass(frozen=True)
class Shape:
    """The numbers of a supported config."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    theta: float
    attention_bias: bool
    mlp_bias: bool
    tied: bool
    pad_id: int | None

    @classmethod
    def of(cls, c: Mapping[str, Any]) -> Shape:
        vocab, hidden, intermediate, layers, heads = (int(c[k]) for k in REQUIRED)
        rope = c.get("rope_parameters") or {}
        return cls(
            vocab,
            hidden,
            intermediate,
            layers,
            heads,
            int(c.get("num_key_value_heads") or heads),
            int(c.get("head_dim") or hidden // heads),
            float(c.get("rms_norm_eps", 1e-6)),
            float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
            bool(c.get("attention_bias", False)),
            bool(c.get("mlp_bias", False)),
            bool(c.get("tie_word_embeddings", False)),
            c.get("pad_token_id"),
        )


class Output(NamedTuple):
    logits: torch.Tensor


class RMSNorm(nn.Module):  # type: ignore[misc]
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Attention(nn.Module):  # type: ignore[misc]
    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.head_dim, self.groups = s.head_dim, s.heads // s.kv_heads
        self.q_proj = nn.Linear(s.hidden, s.heads * s.head_dim, bias=s.attention_bias)
        self.k_proj = nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=s.attention_bias)
        self.v_proj = nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=s.attention_bias)
        self.o_proj = nn.Linear(s.heads * s.head_dim, s.hidden, bias=s.attention_bias)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        b, t, _ = x.shape
        projections = (self.q_proj, self.k_proj, self.v_proj)
        q, k, v = (p(x).view(b, t, -1, self.head_dim).transpose(1, 2) for p in projections)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(self.groups, dim=1), v.repeat_interleave(self.groups, dim=1)
        out = functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):  # type: ignore[misc]
    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden, s.intermediate, bias=s.mlp_bias)
        self.up_proj = nn.Linear(s.hidden, s.intermediate, bias=s.mlp_bias)
        self.down_proj = nn.Linear(s.intermediate, s.hidden, bias=s.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):  # type: ignore[misc]
    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.self_attn, self.mlp = Attention(s), MLP(s)
        self.input_layernorm = RMSNorm(s.hidden, s.eps)
        self.post_attention_layernorm = RMSNorm(s.hidden, s.eps)

    def forward(self, x: torch.Tensor, *rope_and_mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), *rope_and_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):  # type: ignore[misc]
    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.shape = s
        # padding_idx as transformers sets it: the pad token's row gets no gradient. An
        # empty weight, not initialised: load() assigns the checkpoint's (normal_ on the
        # meta device imports torch._dynamo, 1.1 CPU s of the trainer's start)
        empty = torch.empty(s.vocab, s.hidden)
        self.embed_tokens = nn.Embedding(s.vocab, s.hidden, padding_idx=s.pad_id, _weight=empty)
        self.layers = nn.ModuleList(DecoderLayer(s) for _ in range(s.layers))
        self.norm = RMSNorm(s.hidden, s.eps)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        # RoPE in float32 (transformers' default type and rotate-half layout)
        dim = self.shape.head_dim
        inv_freq = 1.0 / self.shape.theta ** (torch.arange(0, dim, 2).float() / dim)
        angles = position_ids[..., None].float() * inv_freq.to(x.device)
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # [B, 1, T, head_dim]
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        # additive, with the dtype's min rather than -inf: a row with no key to attend
        # (left padding) then averages instead of giving NaN
        t = input_ids.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        allowed = causal & attention_mask.bool()[:, None, None, :]
        mask = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device)
        mask = mask.masked_fill(~allowed, torch.finfo(x.dtype).min)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):  # type: ignore[misc]
    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.model = LlamaModel(s)
        self.lm_head = nn.Linear(s.hidden, s.vocab, bias=False)
        if s.tied:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> Output:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        return Output(self.lm_head(self.model(input_ids, attention_mask, position_ids)))


def load(folder: str | Path, dtype: torch.dtype) -> LlamaForCausalLM | str:
    """The checkpoint in ``folder`` as the plain module in ``dtype`` (in eval mode, as
    transformers' ``from_pretrained`` leaves it), or why it cannot be (a sentence)."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    why = refusal(config)
    if why is None and not (folder / "model.safetensors").exists():
        why = "no single model.safetensors (a sharded or .bin checkpoint)"
    if why is not None:
        return why
    shape = Shape.of(config)
    tensors = {k: v.to(dtype) for k, v in load_file(str(folder / "model.safetensors")).items()}
    if shape.tied:  # transformers leaves the tied head out of the file
        tensors.setdefault("lm_head.weight", tensors["model.embed_tokens.weight"])
    with torch.device("meta"):  # no random init of weights about to be replaced
        module = LlamaForCausalLM(shape)
    module.load_state_dict(tensors, assign=True)
    if shape.tied:  # assign gave the head its own parameter: share it again
        module.lm_head.weight = module.model.embed_tokens.weight
    module.eval()
    return module
