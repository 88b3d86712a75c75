"""Hybrid Gated-DeltaNet targets (the Qwen3.5/3.6 family): their recurrent state under tree verification, and the
DFlash hidden-state capture SGLang's text-only wrapper lacks.

A hybrid target keeps, per request, one recurrent state per GDN layer (an SSM matrix and a conv window) instead of a
KV cache. SGLang 0.5.17 verifies a tree through those layers by writing every node's state into a per-request
scratch buffer (``MambaPool.SpeculativeState``: ``intermediate_ssm`` ``[gdn_layers, slots + 1, N, HV, K, V]`` in the
SSM dtype and, for trees, dense ``intermediate_conv_window`` ``[gdn_layers, slots + 1, N, conv_dim, kernel - 1]``
in the conv dtype), then copies the last accepted node's state into the request's own. That scratch is reserved for
every running request at the full verify width N, so it, not the KV cache, caps a DDTree server's concurrency on a
large hybrid model: Qwen3.6-27B at TP=2 needs ~73 MiB per node per request slot (fp32 SSM state); DDTREE's
snapshot-free verify (the default; ``SGLANG_DDTREE_GDN_WY_VERIFY=0`` turns it off) needs only a workspace of a few
SSM states, which also holds every node's conv input (``gdn_workspace_pool``): one state per GDN layer up to 45
nodes at that shape.

The sizes here are computed from ``config.json`` alone, without importing SGLang, so the launcher can refuse (or
size) a configuration in a second instead of failing after the weights load.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from sglang_ddtree.kernels.gdn_workspace import workspace_slots
from sglang_ddtree.model_configs import text_config

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# SGLang 0.5.17 keeps GDN conv windows in bfloat16 unless SGLANG_MAMBA_CONV_DTYPE says otherwise.
CONV_STATE_DTYPE = "bfloat16"
# SSM state dtype when neither --mamba-ssm-dtype nor the config's mamba_ssm_dtype says (SGLang's default).
DEFAULT_SSM_DTYPE = "float32"


@dataclass(frozen=True)
class GdnStateSize:
    """One request's recurrent state of a hybrid target on one TP rank, per GDN layer."""

    gdn_layers: int
    ssm_bytes: int  # HV/tp x K x V in the SSM dtype
    conv_window_bytes: int  # conv_dim/tp x (kernel - 1) in the conv dtype
    conv_input_bytes: int  # conv_dim/tp in the conv dtype: one token of the window
    ssm_heads: tuple[int, int, int]  # HV/tp, K, V
    ssm_float32: bool

    @property
    def per_node_bytes(self) -> int:
        """What verifying one tree node costs in scratch state, all GDN layers together."""
        return self.gdn_layers * (self.ssm_bytes + self.conv_window_bytes)

    def verify_scratch_bytes(self, verify_width: int, running_requests: int, snapshot_free: bool = False) -> int:
        """The per-node verify scratch: ``running_requests + 1`` slots (one is padding) of ``verify_width`` nodes
        each; ``snapshot_free`` (DDTREE's WY verify on float32 states, ``gdn_workspace_pool``): the workspace's
        SSM states, which hold every node's conv input too."""
        per_request = verify_width * (self.conv_window_bytes + self.ssm_bytes)
        if snapshot_free and self.ssm_float32:
            per_request = workspace_slots(verify_width, *self.ssm_heads, self.conv_input_bytes) * self.ssm_bytes
        return (running_requests + 1) * self.gdn_layers * per_request


def conv_state_dtype() -> str:
    return os.environ.get("SGLANG_MAMBA_CONV_DTYPE") or CONV_STATE_DTYPE


def gdn_layer_count(config: dict[str, Any]) -> int:
    """Number of Gated DeltaNet layers; SGLang 0.5.17 reads the pattern from ``full_attention_interval`` (every
    interval-th layer is full attention), falling back here to ``layer_types``."""
    cfg = text_config(config)
    num_layers = int(cfg.get("num_hidden_layers") or 0)
    interval = cfg.get("full_attention_interval")
    if isinstance(interval, int) and interval > 0:
        return sum(1 for layer in range(num_layers) if (layer + 1) % interval)
    return sum(1 for kind in cfg.get("layer_types") or [] if kind == "linear_attention")


def is_hybrid_gdn(config: dict[str, Any]) -> bool:
    cfg = text_config(config)
    return isinstance(cfg.get("linear_num_value_heads"), int) and gdn_layer_count(config) > 0


def ssm_dtype_of(config: dict[str, Any], override: Optional[str] = None) -> str:
    """The SSM state dtype SGLang will use: ``--mamba-ssm-dtype``, else the config's ``mamba_ssm_dtype``."""
    dtype = override or text_config(config).get("mamba_ssm_dtype") or DEFAULT_SSM_DTYPE
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown mamba SSM dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}")
    return dtype


def gdn_state_size(config: dict[str, Any], tp_size: int, ssm_dtype: Optional[str] = None) -> Optional[GdnStateSize]:
    """The per-layer state of one request on one TP rank, or None for a target without GDN layers."""
    if not is_hybrid_gdn(config):
        return None
    cfg = text_config(config)
    value_heads, key_heads = int(cfg["linear_num_value_heads"]), int(cfg["linear_num_key_heads"])
    key_dim, value_dim = int(cfg["linear_key_head_dim"]), int(cfg["linear_value_head_dim"])
    conv_dim = 2 * key_heads * key_dim + value_heads * value_dim  # conv over [q; k; v]
    kernel = int(cfg.get("linear_conv_kernel_dim", 4))
    state_dtype = ssm_dtype_of(config, ssm_dtype)
    return GdnStateSize(
        gdn_layers=gdn_layer_count(config),
        ssm_bytes=value_heads // tp_size * key_dim * value_dim * DTYPE_BYTES[state_dtype],
        conv_window_bytes=conv_dim // tp_size * (kernel - 1) * DTYPE_BYTES[conv_state_dtype()],
        conv_input_bytes=conv_dim // tp_size * DTYPE_BYTES[conv_state_dtype()],
        ssm_heads=(value_heads // tp_size, key_dim, value_dim),
        ssm_float32=state_dtype == "float32",
    )


def capture_dflash_layers_of_text_only_qwen35(original, *args: Any, **kwargs: Any) -> None:
    """AROUND hook on ``attention_backend_setup.configure_aux_hidden_state_capture``.

    DFlash-family drafters read hidden states of chosen target layers. SGLang 0.5.17's multimodal Qwen3.5/3.6
    wrapper (``Qwen3VLForConditionalGeneration.set_dflash_layers_to_capture``) asks its body to capture the output
    of each layer (the input of layer ``id + 1``), but the text-only ``Qwen3_5ForCausalLM`` and
    ``Qwen3_5MoeForCausalLM`` (``models/qwen3_5_text.py``) have no such method, so DFLASH and DDTREE refused every text-only checkpoint at
    start-up. Its body (``models/qwen3_5.py``) does capture; this does for the text wrapper what the multimodal one
    does, and leaves every other model to SGLang.
    """
    model = kwargs["model"]
    if kwargs.get("dflash_use_aux_hidden_state") and _is_text_only_qwen35(model):
        model.capture_aux_hidden_states = True
        model.model.set_dflash_layers_to_capture([layer + 1 for layer in kwargs["dflash_target_layer_ids"]])
        kwargs = {**kwargs, "dflash_use_aux_hidden_state": False}
    return original(*args, **kwargs)


_TEXT_ONLY_QWEN35_WRAPPERS = {
    ("sglang.srt.models.qwen3_5_text", "Qwen3_5ForCausalLM"),
    ("sglang.srt.models.qwen3_5_text", "Qwen3_5MoeForCausalLM"),
}


def _is_text_only_qwen35(model: Any) -> bool:
    """By name, so that serving any other model never imports the Qwen3.5 modules."""
    cls = type(model)
    return (cls.__module__, cls.__qualname__) in _TEXT_ONLY_QWEN35_WRAPPERS and not hasattr(
        model, "set_dflash_layers_to_capture"
    )
