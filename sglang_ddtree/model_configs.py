"""Reading Hugging Face ``config.json`` files without importing SGLang or transformers.

The launcher validates a model before SGLang starts (a wrong TP size or a drafter without a block size should
fail in a second with one readable line, not after minutes of loading with a traceback), so it needs the raw
config of local folders and, for hub ids, of whatever the local Hugging Face cache or hub can provide.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any


class ModelConfigError(ValueError):
    """A model or drafter cannot be used; the message names the path and the problem."""


def load_config(model_path: str, role: str = "model") -> dict[str, Any]:
    """Return the parsed ``config.json`` of a local folder or a Hugging Face hub id.

    ``role`` ("model", "drafter") only words the error message.
    """
    if os.path.isdir(model_path):
        config_path = os.path.join(model_path, "config.json")
    elif os.path.exists(model_path) or model_path.startswith((".", "/", "~")) or model_path.count("/") != 1:
        raise ModelConfigError(f"{role} path '{model_path}' does not exist or is not a folder")
    else:
        config_path = _hub_config_path(model_path, role)
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except OSError as e:
        raise ModelConfigError(f"cannot read {role} config '{config_path}': {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{role} config '{config_path}' is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ModelConfigError(f"{role} config '{config_path}' is not a JSON object")
    return config


def _hub_config_path(repo_id: str, role: str) -> str:
    from huggingface_hub import hf_hub_download

    hub_logger = logging.getLogger("huggingface_hub")
    level = hub_logger.level
    hub_logger.setLevel(logging.ERROR)  # its retry warnings would bury the one line the user needs
    try:
        return hf_hub_download(repo_id, "config.json")
    except Exception as e:  # offline, unknown repo, gated repo: all mean "cannot use it"
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelConfigError(
            f"{role} path '{repo_id}' is not a local folder and its config could not be fetched from the "
            f"Hugging Face hub ({reason})"
        ) from None
    finally:
        hub_logger.setLevel(level)


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language-model part of a config (multimodal models such as Qwen3.6 nest it in ``text_config``)."""
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) else config


def check_tensor_parallel_size(config: dict[str, Any], tp_size: int, model_path: str) -> None:
    """Refuse a TP size that SGLang cannot shard this model's heads over.

    Query heads and linear-attention (GDN) heads are split across ranks, so ``tp_size`` must divide them;
    KV heads are split when there are at least ``tp_size`` of them and replicated otherwise, so one count
    must divide the other.
    """
    if tp_size < 1:
        raise ModelConfigError(f"--tp must be a positive integer, got {tp_size}")
    cfg = text_config(config)
    for field in ("num_attention_heads", "linear_num_key_heads", "linear_num_value_heads"):
        heads = cfg.get(field)
        if isinstance(heads, int) and heads % tp_size:
            raise ModelConfigError(
                f"--tp {tp_size} does not divide {field}={heads} of '{model_path}'"
            )
    kv_heads = cfg.get("num_key_value_heads")
    if isinstance(kv_heads, int) and kv_heads % tp_size and tp_size % kv_heads:
        raise ModelConfigError(
            f"--tp {tp_size} and num_key_value_heads={kv_heads} of '{model_path}' do not divide one another"
        )


def auto_dtype(config: dict[str, Any]) -> str:
    """The dtype SGLang's ``--dtype auto`` gives a checkpoint (``configs/model_config._get_and_verify_dtype``, on
    its language-model config): the config's own, except that float32 (or none) is loaded as float16, as
    bfloat16 for Gemma."""
    cfg = text_config(config)
    dtype = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    if dtype != "float32":
        return str(dtype)
    return "bfloat16" if str(cfg.get("model_type", "")).startswith("gemma") else "float16"


def parameter_count(config: dict[str, Any]) -> int | None:
    """Parameters of a Qwen-style dense or hybrid (Gated DeltaNet) language model with its MTP layers, from its
    config alone (vision towers are not counted); None when the config lacks the fields.

    For launch-time memory estimates of checkpoints without weight files (``--load-format dummy``, hub ids):
    Qwen3.6-27B's config gives 27.3e9, its published size 27.8e9 with the vision tower.
    """
    cfg = text_config(config)
    try:
        hidden, layers, vocab = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["vocab_size"])
        heads, head_dim = int(cfg["num_attention_heads"]), int(cfg.get("head_dim") or hidden // cfg["num_attention_heads"])
        kv_heads, intermediate = int(cfg.get("num_key_value_heads", heads)), int(cfg["intermediate_size"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    attention, mlp = _attention_and_mlp(hidden, heads, head_dim, kv_heads, intermediate, cfg.get("attn_output_gate"))
    from sglang_ddtree.speculative.hybrid_targets import gdn_layer_count

    gdn_layers = gdn_layer_count(config) if isinstance(cfg.get("linear_num_value_heads"), int) else 0
    gdn = 0
    if gdn_layers:
        value_heads, key_heads = int(cfg["linear_num_value_heads"]), int(cfg["linear_num_key_heads"])
        key_dim, value_dim = key_heads * int(cfg["linear_key_head_dim"]), value_heads * int(cfg["linear_value_head_dim"])
        conv = (2 * key_dim + value_dim) * int(cfg.get("linear_conv_kernel_dim", 4))
        gdn = hidden * (2 * key_dim + 2 * value_dim) + 2 * hidden * value_heads + conv + value_dim * hidden
    mtp = num_mtp_layers(config) * (attention + mlp + 2 * hidden * hidden)
    embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings", config.get("tie_word_embeddings")) else 2)
    return embeddings + gdn_layers * gdn + (layers - gdn_layers) * attention + layers * mlp + mtp


def dflash_drafter_parameter_count(config: dict[str, Any]) -> int | None:
    """Parameters a DFlash drafter loads of its own: its layers and the projection of the target's features (one
    hidden state per target layer it reads) into its hidden size. Its embeddings and LM head are the target's
    (SGLang shares them). z-lab/Qwen3.6-27B-DFlash's layout: 1.73e9, 3.22 GiB in bf16 (SGLang reported 3.38 GB
    loaded, RESULTS run 73); None when the config lacks the fields."""
    try:
        hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or hidden // heads)
        kv_heads, intermediate = int(config.get("num_key_value_heads", heads)), int(config["intermediate_size"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    layer_ids = (config.get("dflash_config") or {}).get("target_layer_ids", config.get("target_layer_ids")) or []
    attention, mlp = _attention_and_mlp(hidden, heads, head_dim, kv_heads, intermediate, False)
    return layers * (attention + mlp) + len(layer_ids) * hidden * hidden


def _attention_and_mlp(hidden: int, heads: int, head_dim: int, kv_heads: int, intermediate: int,
                       output_gate: Any) -> tuple[int, int]:  # fmt: skip
    """One layer's attention (q with its output gate where there is one, k, v, o) and gated MLP parameters."""
    query_width = heads * head_dim * (2 if output_gate else 1)
    attention = hidden * query_width + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    return attention, 3 * hidden * intermediate


MTP_LAYER_FIELDS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers")


def num_mtp_layers(config: dict[str, Any]) -> int:
    """Number of multi-token-prediction layers a checkpoint ships (0 when it has none)."""
    for cfg in (config, text_config(config)):
        for field in MTP_LAYER_FIELDS:
            value = cfg.get(field)
            if isinstance(value, int) and value > 0:
                return value
    return 0


def dflash_block_size(config: dict[str, Any], drafter_path: str) -> int:
    """The block size a DFlash drafter was trained with (top level or ``dflash_config``), as SGLang reads it."""
    if "DFlashDraftModel" not in (config.get("architectures") or []) and "dflash_config" not in config:
        raise ModelConfigError(
            f"drafter '{drafter_path}' is not a DFlash drafter (architectures={config.get('architectures')})"
        )
    dflash_config = config.get("dflash_config") or {}
    block_size = config.get("block_size", dflash_config.get("block_size", 16))
    if not isinstance(block_size, int) or block_size < 2:
        raise ModelConfigError(f"drafter '{drafter_path}' has an invalid block_size={block_size!r}")
    return block_size


def check_dflash_drafter_matches_target(target: dict[str, Any], drafter: dict[str, Any], drafter_path: str) -> None:
    """Refuse a DFlash drafter that was not built for this target, naming the field that differs.

    The drafter shares the target's embeddings and LM head (so hidden size and vocabulary must agree), reads
    the hidden states of the target layers it lists, and fills its block with a mask token of the target's
    vocabulary. SGLang would otherwise fail minutes later inside a scheduler, or not at all (a drafter of
    another target of the same shape just never gets accepted).
    """
    target_cfg, drafter_cfg = text_config(target), text_config(drafter)
    dflash_cfg = drafter_cfg.get("dflash_config") or {}
    for field in ("hidden_size", "vocab_size"):
        want, got = target_cfg.get(field), drafter_cfg.get(field)
        if isinstance(want, int) and isinstance(got, int) and want != got:
            raise ModelConfigError(f"drafter '{drafter_path}' has {field}={got} but the target has {field}={want}")
    num_layers = target_cfg.get("num_hidden_layers")
    trained_for = drafter_cfg.get("num_target_layers", dflash_cfg.get("num_target_layers"))
    if isinstance(num_layers, int) and isinstance(trained_for, int) and trained_for != num_layers:
        raise ModelConfigError(
            f"drafter '{drafter_path}' has num_target_layers={trained_for} but the target has "
            f"num_hidden_layers={num_layers}"
        )
    layer_ids = dflash_cfg.get("target_layer_ids", drafter_cfg.get("target_layer_ids"))
    if layer_ids is not None and isinstance(num_layers, int):
        if not isinstance(layer_ids, list) or not layer_ids or not all(isinstance(i, int) for i in layer_ids):
            raise ModelConfigError(f"drafter '{drafter_path}' has an invalid target_layer_ids={layer_ids!r}")
        outside = [i for i in layer_ids if not 0 <= i < num_layers]
        if outside:
            raise ModelConfigError(
                f"drafter '{drafter_path}' has target_layer_ids={layer_ids} but the target has only "
                f"{num_layers} layers (ids {outside} do not exist)"
            )
    mask_token_id = dflash_cfg.get("mask_token_id")
    vocab_size = target_cfg.get("vocab_size")
    if mask_token_id is not None and isinstance(vocab_size, int):
        if not isinstance(mask_token_id, int) or not 0 <= mask_token_id < vocab_size:
            raise ModelConfigError(
                f"drafter '{drafter_path}' has mask_token_id={mask_token_id!r}, outside the target's "
                f"vocabulary (vocab_size={vocab_size})"
            )
