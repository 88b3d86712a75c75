"""A trainable DFlash drafter that computes exactly what SGLang's ``DFlashDraftModel`` serves.

Architecture (DFlash, anchors.md §2): a few Qwen3-style decoder layers with the target's hidden size. The
target's hidden states after the layers ``target_layer_ids`` are concatenated per token, projected by ``fc``
and normalised by ``hidden_norm``: that context feature enters every draft layer as extra keys and values
only (K/V projection, k-norm and RoPE at the context positions; no layer norm, query, MLP or residual).
The drafted block ``[anchor, MASK x (block-1)]`` is embedded with the target's (frozen) embedding, attends
bidirectionally inside the block and to the context strictly before the anchor, and its final-normed hidden
states go through the target's LM head; block position ``k >= 1`` predicts the token ``k`` places after the
anchor. At serving time SGLang holds the context K/V in the draft KV cache; here a training batch computes
them for whole sequences and masks per anchor.

Saved in the upstream ``DFlashDraftModel`` format (``layers.*`` with Qwen3 names, ``fc``, ``hidden_norm``,
``norm``; no embedding or LM head), which SGLang 0.5.17 loads unchanged.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class DrafterShape:
    """What a drafter needs to know about itself; attention/MLP shapes follow the target's."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    target_layer_ids: tuple[int, ...]
    block_size: int

    @classmethod
    def for_target(cls, target_config: dict, num_layers: int, num_features: int, block_size: int) -> DrafterShape:
        if target_config.get("rope_scaling"):
            raise ValueError("drafter training supports plain RoPE targets only (the target sets rope_scaling)")
        hidden = int(target_config["hidden_size"])
        heads = int(target_config["num_attention_heads"])
        return cls(
            hidden_size=hidden,
            intermediate_size=int(target_config["intermediate_size"]),
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=int(target_config.get("num_key_value_heads", heads)),
            head_dim=int(target_config.get("head_dim") or hidden // heads),
            rms_norm_eps=float(target_config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(target_config.get("rope_theta", 10000.0)),
            target_layer_ids=tuple(target_layer_ids(int(target_config["num_hidden_layers"]), num_features)),
            block_size=block_size,
        )


def target_layer_ids(num_target_layers: int, num_features: int) -> list[int]:
    """Upstream's choice (``build_target_layer_ids``): one feature from the middle layer, else evenly from
    layer 1 to layer L-3.

    A feature of layer ``i`` is that layer's output (HF ``hidden_states[i + 1]``); SGLang captures it before
    layer ``i + 1``, so the last layer cannot be used. Each layer is captured once, so features must come from
    distinct layers: a 4-layer target's two would both be layer 1, and SGLang would feed the drafter one.
    """
    if num_features == 1:
        return [num_target_layers // 2]
    if num_features > num_target_layers - 3:
        raise ValueError(f"{num_features} target features need a target of at least {num_features + 3} layers (one "
                         f"each from layers 1 to L-3), got {num_target_layers}")  # fmt: skip
    span = num_target_layers - 4
    return [round(1 + i * span / (num_features - 1)) for i in range(num_features)]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + eps)).to(x.dtype) * weight


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms_norm(x, self.weight, self.eps)


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE over the last dim of ``x [..., P, heads, d]`` at ``positions [..., P]``."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    angles = positions.float()[..., None] * inv_freq  # [..., P, d/2]
    cos = torch.cat([angles.cos(), angles.cos()], -1)[..., None, :]
    sin = torch.cat([angles.sin(), angles.sin()], -1)[..., None, :]
    half = d // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class DrafterLayer(nn.Module):
    def __init__(self, shape: DrafterShape) -> None:
        super().__init__()
        h, d = shape.hidden_size, shape.head_dim
        self.shape = shape
        self.input_layernorm = RMSNorm(h, shape.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, shape.rms_norm_eps)
        self.q_proj = nn.Linear(h, shape.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, shape.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, shape.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(shape.num_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, shape.rms_norm_eps)
        self.k_norm = RMSNorm(d, shape.rms_norm_eps)
        self.gate_proj = nn.Linear(h, shape.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, shape.intermediate_size, bias=False)
        self.down_proj = nn.Linear(shape.intermediate_size, h, bias=False)

    def _kv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.shape
        k = self.k_norm(self.k_proj(x).unflatten(-1, (s.num_kv_heads, s.head_dim)))
        v = self.v_proj(x).unflatten(-1, (s.num_kv_heads, s.head_dim))
        return _rope(k, positions, s.rope_theta), v

    def forward(
        self,
        block: torch.Tensor,
        block_positions: torch.Tensor,
        context: torch.Tensor,
        context_positions: torch.Tensor,
        context_visible: torch.Tensor,
    ) -> torch.Tensor:
        """``block [S, A, B, H]`` at ``block_positions [S, A, B]``; ``context [S, T, H]`` at
        ``context_positions [S, T]``; ``context_visible [S, A, T]`` says which context rows each anchor sees."""
        s = self.shape
        normed = self.input_layernorm(block)
        q = self.q_norm(self.q_proj(normed).unflatten(-1, (s.num_heads, s.head_dim)))
        q = _rope(q, block_positions, s.rope_theta)  # [S, A, B, nh, d]
        k_blk, v_blk = self._kv(normed, block_positions)  # [S, A, B, nkv, d]
        k_ctx, v_ctx = self._kv(context, context_positions)  # [S, T, nkv, d]
        group = s.num_heads // s.num_kv_heads
        k_ctx, v_ctx = (t.repeat_interleave(group, dim=-2) for t in (k_ctx, v_ctx))
        k_blk, v_blk = (t.repeat_interleave(group, dim=-2) for t in (k_blk, v_blk))
        scale = 1.0 / math.sqrt(s.head_dim)
        scores_ctx = torch.einsum("sabhd,sthd->sabht", q, k_ctx) * scale
        scores_ctx = scores_ctx.masked_fill(~context_visible[:, :, None, None, :], float("-inf"))
        scores_blk = torch.einsum("sabhd,sachd->sabhc", q, k_blk) * scale  # bidirectional inside the block
        probs = torch.softmax(torch.cat([scores_ctx, scores_blk], -1).float(), -1).to(q.dtype)
        t = k_ctx.shape[1]
        attn = torch.einsum("sabht,sthd->sabhd", probs[..., :t], v_ctx)
        attn = attn + torch.einsum("sabhc,sachd->sabhd", probs[..., t:], v_blk)
        block = block + self.o_proj(attn.flatten(-2))
        mlp_in = self.post_attention_layernorm(block)
        return block + self.down_proj(F.silu(self.gate_proj(mlp_in)) * self.up_proj(mlp_in))


_UPSTREAM_LAYER_NAMES = {
    "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj", "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm",
    "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "down_proj": "mlp.down_proj",
    "input_layernorm": "input_layernorm", "post_attention_layernorm": "post_attention_layernorm",
}  # fmt: skip


class DFlashDrafter(nn.Module):
    def __init__(self, shape: DrafterShape) -> None:
        super().__init__()
        self.shape = shape
        self.layers = nn.ModuleList(DrafterLayer(shape) for _ in range(shape.num_layers))
        self.fc = nn.Linear(len(shape.target_layer_ids) * shape.hidden_size, shape.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def forward(
        self,
        block_embeds: torch.Tensor,
        block_positions: torch.Tensor,
        target_features: torch.Tensor,
        context_visible: torch.Tensor,
    ) -> torch.Tensor:
        """Final-normed hidden states ``[S, A, B, H]`` of the blocks; ``target_features [S, T, F*H]``."""
        context = self.hidden_norm(self.fc(target_features))
        positions = torch.arange(context.shape[1], device=context.device).expand(context.shape[:2])
        hidden = block_embeds
        for layer in self.layers:
            hidden = layer(hidden, block_positions, context, positions, context_visible)
        return self.norm(hidden)

    def upstream_state_dict(self) -> dict[str, torch.Tensor]:
        """Weights under the names SGLang's ``DFlashDraftModel.load_weights`` reads."""
        out = {}
        for name, tensor in self.state_dict().items():
            parts = name.split(".")
            if parts[0] == "layers":
                parts[2] = _UPSTREAM_LAYER_NAMES[parts[2]]
            out[".".join(parts)] = tensor.detach().contiguous()
        return out

    def load_upstream_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        """The inverse of :meth:`upstream_state_dict` (strict: every weight present, shapes equal)."""
        own_names = {upstream: own for own, upstream in _UPSTREAM_LAYER_NAMES.items()}
        state = {}
        for name, tensor in tensors.items():
            if name.startswith("layers."):
                index, rest = name.split(".", 2)[1:]
                name = f"layers.{index}.{own_names[rest.rsplit('.', 1)[0]]}.{rest.rsplit('.', 1)[1]}"
            state[name] = tensor
        self.load_state_dict(state, strict=True)

    def save_pretrained(self, out_dir: str, target_config: dict, mask_token: str, mask_token_id: int) -> None:
        """Write ``model.safetensors`` + ``config.json`` in the upstream DFlash format."""
        from safetensors.torch import save_file

        s = self.shape
        os.makedirs(out_dir, exist_ok=True)
        save_file(self.upstream_state_dict(), os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
        config = {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": s.hidden_size,
            "intermediate_size": s.intermediate_size,
            "num_hidden_layers": s.num_layers,
            "num_attention_heads": s.num_heads,
            "num_key_value_heads": s.num_kv_heads,
            "head_dim": s.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": s.rms_norm_eps,
            "rope_theta": s.rope_theta,
            "max_position_embeddings": int(target_config.get("max_position_embeddings", 4096)),
            "vocab_size": int(target_config["vocab_size"]),
            "tie_word_embeddings": False,
            "attention_bias": False,
            "torch_dtype": "bfloat16",
            "block_size": s.block_size,
            "num_target_layers": int(target_config["num_hidden_layers"]),
            "dflash_config": {
                "mask_token": mask_token,
                "mask_token_id": mask_token_id,
                "target_layer_ids": list(s.target_layer_ids),
            },
        }
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(config, f, indent=2)


def target_forward(model, input_ids: torch.Tensor, layer_ids: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """One frozen pass of the (Hugging Face) target: the concatenated outputs of the layers ``layer_ids``
    (``hidden_states[i + 1]``) ``[S, T, F*H]``, the drafter's context, and the next-token logits ``[S, T, V]``."""
    with torch.no_grad():
        out = model(input_ids=input_ids, output_hidden_states=True)
    return torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1), out.logits


def block_logits(drafter: DFlashDrafter, model, ids: torch.Tensor, anchor_pos: torch.Tensor, features: torch.Tensor,
                 mask_token_id: int) -> torch.Tensor:  # fmt: skip
    """The drafter's logits ``[S, A, B-1, V]`` (float32) for the blocks ``[ids[anchor], MASK, ...]`` at
    ``anchor_pos [S, A]``, each seeing the target's ``features`` strictly before its anchor; entry ``k - 1``
    guesses the token ``k`` places after the anchor. The target's embedding and LM head are the drafter's."""
    positions = anchor_pos[..., None] + torch.arange(drafter.shape.block_size, device=ids.device)  # [S, A, B]
    block_ids = torch.full_like(positions, mask_token_id)
    block_ids[..., 0] = torch.gather(ids, 1, anchor_pos)
    visible = torch.arange(ids.shape[1], device=ids.device)[None, None, :] < anchor_pos[..., None]  # [S, A, T]
    embeds = model.get_input_embeddings()(block_ids).detach()
    hidden = drafter(embeds, positions, features.detach(), visible)
    return model.get_output_embeddings()(hidden[..., 1:, :]).float()
