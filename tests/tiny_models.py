"""Tiny random-weight models for tests: a Qwen3 target, a DFlash drafter for it, an MTP-carrying target, and the
hybrid family of the reference user's model (Qwen3.5/3.6: Gated DeltaNet + gated full attention + one MTP layer)
with a sliding-window DFlash drafter like z-lab's Qwen3.6 drafter.

Used by the CPU tests (through ``conftest.py``) and, as a script, by the GPU suite, which has no model hub:
``python tests/tiny_models.py --out DIR`` writes ``DIR/{qwen3,dflash,mtp,qwen3_v64,dflash_v64,qwen35,qwen35_text,
dflash_swa}`` and prints a digest of each model's weights. Weights are seeded; whether two machines (other torch
or transformers versions) build the same models, their digests say.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import math
import os
import random
import subprocess
import sys
from dataclasses import dataclass

import torch

VOCAB_SIZE = 512
EOS_TOKEN_ID = 2
MASK_TOKEN_ID = 3
_SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|MASK|>"]
# Words for ``write_tokenizer(words=...)`` that let a grammar spell a JSON object such as {"a": true}.
JSON_WORDS = {4: "{", 5: "}", 6: '"a"', 7: ":", 8: "true", 9: "false"}
BOOLEAN_SCHEMA = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
                  "additionalProperties": False}  # fmt: skip


@dataclass(frozen=True)
class TinyShape:
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 256
    # Speculation tests use a small vocabulary: a random drafter's top-K lists then hold the target's
    # choice often enough that trees get accepted (with 512 tokens almost nothing is).
    vocab_size: int = VOCAB_SIZE


def write_tokenizer(out_dir: str, vocab_size: int = VOCAB_SIZE, words: dict[int, str] | None = None) -> None:
    """A word-level tokenizer over ``t4 .. t{vocab_size - 1}`` so text requests and detokenisation work offline;
    ``words`` replaces some ids' words (e.g. JSON pieces, so that a grammar can spell JSON)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(_SPECIAL_TOKENS)}
    vocab.update({(words or {}).get(i, f"t{i}"): i for i in range(len(_SPECIAL_TOKENS), vocab_size)})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<unk>"
    )
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}t5{% endif %}"
    )
    tokenizer.save_pretrained(out_dir)


def _qwen3_config(shape: TinyShape, **extra):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=EOS_TOKEN_ID,
        tie_word_embeddings=False,
        torch_dtype="float32",
        **extra,
    )


# The dense target's QK-norm weights are scaled by this, so that its next token depends on its context. At a
# random init's scale attention is near uniform: on the exactness tests' 4-layer target (8 prompts, 24 greedy
# tokens, float32) hiding one context entry changed the next argmax in 23 of 96 cases and a position one too far
# in 12; its continuations held 2-8 distinct tokens. x3: 48 and 59 of 96, 11-16 distinct tokens.
ATTENTION_QK_NORM_GAIN = 3.0


def make_qwen3_target(out_dir: str, shape: TinyShape = TinyShape(), seed: int = 0,
                      qk_norm_gain: float = ATTENTION_QK_NORM_GAIN) -> str:  # fmt: skip
    """A random ``Qwen3ForCausalLM`` with real safetensors weights and a tokenizer (``qk_norm_gain``: see
    ``ATTENTION_QK_NORM_GAIN``)."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(_qwen3_config(shape)).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.mul_(qk_norm_gain)
            layer.self_attn.k_norm.weight.mul_(qk_norm_gain)
    model.save_pretrained(out_dir, safe_serialization=True)
    write_tokenizer(out_dir)
    return out_dir


def make_dflash_drafter(
    out_dir: str,
    target_num_layers: int,
    shape: TinyShape = TinyShape(num_layers=1),
    block_size: int = 4,
    target_layer_ids: list[int] | None = None,
    seed: int = 1,
    layer_types: list[str] | None = None,
    sliding_window: int | None = None,
) -> str:
    """A random drafter in the upstream ``DFlashDraftModel`` format that SGLang loads.

    Its decoder layers have Qwen3's parameter names; ``fc`` projects the concatenated target features
    (one per entry of ``target_layer_ids``) and ``hidden_norm`` normalises them. SGLang captures the
    feature of target layer ``i`` *before* layer ``i + 1``, so ids must stay below ``target_num_layers - 1``.
    ``layer_types`` (one per drafter layer, ``"sliding_attention"`` or ``"full_attention"``) with
    ``sliding_window`` gives the layout of z-lab's Qwen3.6 drafters: causal sliding-window layers, then
    one bidirectional full-attention layer.
    """
    from safetensors.torch import save_file
    from transformers import Qwen3ForCausalLM

    if target_layer_ids is None:
        target_layer_ids = [0]
    torch.manual_seed(seed)
    layers = Qwen3ForCausalLM(_qwen3_config(shape)).model
    weights = {
        name: tensor.contiguous()
        for name, tensor in layers.state_dict().items()
        if name.startswith("layers.") or name == "norm.weight"
    }
    weights["fc.weight"] = torch.randn(shape.hidden_size, len(target_layer_ids) * shape.hidden_size) * 0.02
    weights["hidden_norm.weight"] = torch.ones(shape.hidden_size)
    os.makedirs(out_dir, exist_ok=True)
    save_file(weights, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})

    config = _qwen3_config(shape).to_dict()
    config.update(
        architectures=["DFlashDraftModel"],
        block_size=block_size,
        num_target_layers=target_num_layers,
        dflash_config={"mask_token_id": MASK_TOKEN_ID, "target_layer_ids": target_layer_ids},
    )
    if layer_types is not None:
        if len(layer_types) != shape.num_layers:
            raise ValueError(f"layer_types has {len(layer_types)} entries for {shape.num_layers} drafter layers")
        config.update(layer_types=list(layer_types), sliding_window=sliding_window,
                      use_sliding_window=sliding_window is not None)  # fmt: skip
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return out_dir


def fit_dflash_drafter(target_dir: str, out_dir: str, prompts: list[list[int]], block_size: int,
                       new_tokens: int = 24, steps: int = 300, random_prompts: int = 48, lr: float = 2e-3,
                       num_features: int = 1) -> str:  # fmt: skip
    """A one-layer drafter trained by the package's trainer on the target's greedy continuations of ``prompts``
    (token ids, sent raw) and of ``random_prompts`` random ones (~20 s on the CPU for the dense tests' defaults),
    reading ``num_features`` target layers.

    A random drafter's trees are accepted past their first draft almost never (the 4-layer exactness target,
    budget 8, its 8 prompts, with the QK-norm gain: accept histogram [75, 7, 0, 0] over the verifies; [62, 13, 0, 0]
    without it), so a verify's faults at depth 2 and deeper (positions, mask rows, the KV move) could not change an
    output; this drafter's trees are accepted at every depth ([9, 24, 10, 2]). Trained on the 8 prompts alone it
    overfits ([34, 8, 0, 10]). The tiny hybrid's (tests/test_hybrid_cpu.py) takes 600 steps at a higher rate over
    fewer random prompts to go past its first draft. The first prompts of the trainer's pool are held out: 8 more
    random ones go first.
    """
    rng, vocab_size = random.Random(0), _vocab_size(target_dir)
    held_out, others = ([[rng.randint(len(_SPECIAL_TOKENS), vocab_size - 1) for _ in range(rng.randint(1, 30))]
                         for _ in range(count)] for count in (8, random_prompts))  # fmt: skip
    os.makedirs(out_dir, exist_ok=True)
    pool = os.path.join(out_dir, "prompts.jsonl")
    with open(pool, "w") as f:
        for ids in held_out + others + list(prompts):
            f.write(json.dumps({"prompt": " ".join(f"t{i}" for i in ids), "format": "raw"}) + "\n")
    command = [sys.executable, "-m", "sglang_ddtree.training.train_drafter", "--target", target_dir, "--out", out_dir,
               "--prompts", pool, "--max-new-tokens", str(new_tokens), "--sampled-fraction", "0",
               "--held-out-fraction", str(len(held_out) / (len(held_out) + len(others) + len(prompts))),
               "--block-size", str(block_size), "--num-features", str(num_features), "--steps", str(steps),
               "--batch-size", "8", "--anchors", "16", "--lr", str(lr), "--eval-budgets", "8", "--device", "cpu", "--dtype", "float32"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"training the test drafter failed:\n{result.stderr[-3000:]}")
    return out_dir


def _vocab_size(model_dir: str) -> int:
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)["vocab_size"]


def make_mtp_target(out_dir: str, shape: TinyShape = TinyShape()) -> str:
    """A config for a target that carries one MTP layer (SGLang's ``MiMoForCausalLM`` -> ``MiMoMTP``).

    Only the config is written: serve it with ``--load-format dummy`` (random weights for target and MTP)
    and ``--skip-tokenizer-init`` (for a ``qwen2`` config, transformers loads its own tokenizer class, which
    turns the word-level test vocabulary into empty prompts).
    """
    config = _qwen3_config(shape).to_dict()
    config.update(model_type="qwen2", architectures=["MiMoForCausalLM"], num_nextn_predict_layers=1)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return out_dir


HYBRID_ARCHS = ("Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM")


@dataclass(frozen=True)
class HybridShape:
    """Qwen3.6-27B's text model scaled down, its ratios kept.

    The real model (its config.json, revision 6a9e13bd): 64 layers = 16 x (3 Gated DeltaNet + 1 gated full
    attention), GDN value heads 48 / key heads 16 (3 value heads per key head) of dim 128, conv kernel 4,
    attention 24 query / 4 KV heads of dim 256 with an output gate, partial rotary 0.25 with interleaved
    mRoPE, one MTP layer, untied LM head, fp32 SSM state. Here: 2 x (3 + 1) layers, narrow projections and a
    64-token vocabulary (random drafts then often hold the target's choice, so trees get accepted); head dims
    are the real ones, so attention and GDN kernels run at their real head shapes.
    """

    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 8
    full_attention_interval: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 256
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 6
    linear_head_dim: int = 128
    vocab_size: int = 64


def _qwen35_text_config(shape: HybridShape) -> dict:
    return {
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "linear_num_key_heads": shape.linear_num_key_heads,
        "linear_num_value_heads": shape.linear_num_value_heads,
        "linear_key_head_dim": shape.linear_head_dim,
        "linear_value_head_dim": shape.linear_head_dim,
        "linear_conv_kernel_dim": 4,
        # SGLang 0.5.17 reads the layer pattern from this key (transformers writes layer_types only).
        "full_attention_interval": shape.full_attention_interval,
        "attn_output_gate": True,
        "output_gate_type": "swish",
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "partial_rotary_factor": 0.25,
        # mRoPE sections sum to rotary_dim / 2 = head_dim * 0.25 / 2.
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},  # fmt: skip
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": EOS_TOKEN_ID,
        # As the real checkpoint says (weights are saved in float32): --dtype auto then gives bfloat16, the only
        # dtype beside SGLang's bfloat16 GDN conv states besides float32 (which the CPU tests ask for).
        "dtype": "bfloat16",
    }


def _mtp_weights(state_dict: dict[str, torch.Tensor], layer_prefix: str, hidden_size: int) -> dict[str, torch.Tensor]:
    """Weights of one Qwen3.5 MTP layer (checkpoint names ``mtp.*``): a full-attention decoder layer, copied from
    the target's first one (random either way), behind ``fc`` over ``[embedding; hidden]``."""
    attention_layer = next(
        name.split(".self_attn.")[0] for name in state_dict if name.startswith(layer_prefix) and ".self_attn." in name
    )
    weights = {
        "mtp.layers.0" + name[len(attention_layer) :]: tensor.clone()
        for name, tensor in state_dict.items()
        if name.startswith(attention_layer + ".")
    }
    weights["mtp.fc.weight"] = torch.randn(hidden_size, 2 * hidden_size) * 0.02
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        weights[f"mtp.{norm}.weight"] = torch.zeros(hidden_size)  # Gemma-style RMSNorm: scale 1 + w
    return weights


# A random init's GDN layers barely move the logits: zeroing their outputs flipped 0-2 of 24 greedy tokens of the
# CPU tests' prompts (largest logit change 0.04), so a verify that committed a wrong GDN state still gave AR's tokens
# (a prefix-cache hit continued from a tracked state of x10 noise). Their output projections are scaled up so the
# tokens depend on them: zeroing them then flips 18-20 of 24 (tests/test_hybrid_cpu.py checks it).
GDN_OUTPUT_GAIN = 30.0
# The init's dt_bias (1: softplus 1.31) with A = exp(A_log) ~ U(1, 16) decays a GDN state by exp(-A dt) ~ e^-17 per
# token: the state held the last token alone, so a commit of the wrong node's state (or of the root's) changed no
# output. As Mamba2 initialises it (dt log-uniform in [1e-3, 1e-1]) and trained GDN layers keep it, the state then
# remembers tens of tokens (tests/test_hybrid_cpu.py checks that the tokens depend on that memory).
GDN_DT_RANGE = (1e-3, 1e-1)


def _memory_keeping_dt_bias(shape: torch.Size, generator: torch.Generator) -> torch.Tensor:
    """softplus^-1 of dt drawn log-uniform in :data:`GDN_DT_RANGE`."""
    low, high = (math.log(bound) for bound in GDN_DT_RANGE)
    dt = torch.exp(low + (high - low) * torch.rand(shape, generator=generator))
    return dt + torch.log(-torch.expm1(-dt))


def make_qwen35_hybrid_target(
    out_dir: str,
    shape: HybridShape = HybridShape(),
    arch: str = "Qwen3_5ForConditionalGeneration",
    seed: int = 0,
) -> str:
    """A random Qwen3.5/3.6-family target with real safetensors weights, its MTP layer and a tokenizer.

    ``arch`` is the real multimodal checkpoint's ``Qwen3_5ForConditionalGeneration`` (a one-block vision tower
    beside the text model; requests stay text-only) or the text-only ``Qwen3_5ForCausalLM``. With the same
    ``seed`` both archs hold the same language model (weights and MTP layer), so they must generate alike.
    """
    from safetensors.torch import save_file
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    if arch not in HYBRID_ARCHS:
        raise ValueError(f"arch must be one of {HYBRID_ARCHS}, got {arch!r}")
    text = _qwen35_text_config(shape)
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
              "out_hidden_size": shape.hidden_size, "num_position_embeddings": 64}  # fmt: skip
    config = Qwen3_5Config(text_config=dict(text), vision_config=vision, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(config).eval()
    weights = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    generator = torch.Generator().manual_seed(seed)
    for name in sorted(weights):
        if name.endswith(".linear_attn.out_proj.weight"):
            weights[name] = weights[name] * GDN_OUTPUT_GAIN
        elif name.endswith(".linear_attn.dt_bias"):
            weights[name] = _memory_keeping_dt_bias(weights[name].shape, generator).to(weights[name].dtype)
    if arch == "Qwen3_5ForCausalLM":  # the text checkpoint's names: model.layers.*, model.embed_tokens, lm_head
        weights = {name.replace("model.language_model.", "model."): tensor for name, tensor in weights.items()
                   if not name.startswith("model.visual.")}  # fmt: skip
        saved = {**text, "model_type": "qwen3_5_text"}
    else:
        saved = {**config.to_dict(), "text_config": {**config.text_config.to_dict(), **text}}
    layer_prefix = "model.layers." if arch == "Qwen3_5ForCausalLM" else "model.language_model.layers."
    weights.update(_mtp_weights(weights, layer_prefix, shape.hidden_size))
    os.makedirs(out_dir, exist_ok=True)
    save_file(weights, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump({**saved, "architectures": [arch]}, f, indent=2)
    write_tokenizer(out_dir, vocab_size=shape.vocab_size)
    if arch == "Qwen3_5ForConditionalGeneration":
        _write_image_processor_config(out_dir)
    return out_dir


def _write_image_processor_config(out_dir: str) -> None:
    """SGLang's tokenizer manager builds the multimodal processor of a multimodal arch even for text-only requests
    (and with --skip-tokenizer-init): Qwen3-VL's processor, the real checkpoint's, needs this file."""
    config = {"processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast",
              "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
              "image_std": [0.5, 0.5, 0.5], "size": {"longest_edge": 16777216, "shortest_edge": 65536}}  # fmt: skip
    with open(os.path.join(out_dir, "preprocessor_config.json"), "w") as f:
        json.dump(config, f, indent=2)


def make_swa_dflash_drafter(out_dir: str, target_num_layers: int = HybridShape().num_layers,
                            hidden_size: int = HybridShape().hidden_size, vocab_size: int = HybridShape().vocab_size,
                            block_size: int = 8) -> str:  # fmt: skip
    """A drafter with z-lab Qwen3.6-27B-DFlash's layout (4 causal sliding-window layers of window 2048, then one
    full-attention layer; target layers [1, 16, 31, 46, 61] of 64), scaled down: one sliding-window layer of
    window 16 (shorter than the tests' sequences, so the window cuts) and one full-attention layer, reading
    three target layers spread like upstream's."""
    return make_dflash_drafter(
        out_dir,
        target_num_layers=target_num_layers,
        shape=TinyShape(hidden_size=hidden_size, num_layers=2, num_heads=4, num_kv_heads=1, head_dim=128,
                        vocab_size=vocab_size),  # z-lab's head dim, 4 query heads per KV head
        block_size=block_size,
        target_layer_ids=[1, target_num_layers // 2 - 1, target_num_layers - 3],
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=16,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="parent folder of the models (see the module docstring)")
    parser.add_argument("--num-layers", type=int, default=4)
    args = parser.parse_args()
    shape = TinyShape(num_layers=args.num_layers)
    # The GPU suite's dense targets keep a random init's attention scale: the sharper default
    # (ATTENTION_QK_NORM_GAIN) has not yet run there, where bfloat16 near-ties are judged by margin.
    make_qwen3_target(os.path.join(args.out, "qwen3"), shape, qk_norm_gain=1.0)
    make_dflash_drafter(
        os.path.join(args.out, "dflash"),
        target_num_layers=args.num_layers,
        block_size=8,
        target_layer_ids=list(range(0, args.num_layers - 1, 2)),
    )
    make_mtp_target(os.path.join(args.out, "mtp"), shape)
    # DDTree's exactness tests: a 64-token vocabulary, so that random drafts get accepted (see TinyShape).
    make_qwen3_target(os.path.join(args.out, "qwen3_v64"), TinyShape(num_layers=args.num_layers, vocab_size=64),
                      qk_norm_gain=1.0)  # fmt: skip
    make_dflash_drafter(
        os.path.join(args.out, "dflash_v64"),
        target_num_layers=args.num_layers,
        shape=TinyShape(num_layers=1, vocab_size=64),
        block_size=8,
        target_layer_ids=list(range(0, args.num_layers - 1, 2)),
    )
    # The reference user's model family (Qwen3.5/3.6 hybrid), both archs, and a sliding-window drafter. Their GDN
    # states keep tens of tokens (GDN_DT_RANGE) since 2026-12-06, as on the CPU; the GPU suite has not yet run them.
    make_qwen35_hybrid_target(os.path.join(args.out, "qwen35"))
    make_qwen35_hybrid_target(os.path.join(args.out, "qwen35_text"), arch="Qwen3_5ForCausalLM")
    make_swa_dflash_drafter(os.path.join(args.out, "dflash_swa"))
    for name in sorted(os.listdir(args.out)):
        print(f"{name}: weights {weights_digest(os.path.join(args.out, name))}")


def weights_digest(model_dir: str) -> str:
    """sha256 (first 12 hex digits) of the model's tensors by name, independent of the files' layout; ``none``
    for a config-only model."""
    from safetensors.torch import load_file

    tensors = {}
    for file in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        tensors.update(load_file(file))
    if not tensors:
        return "none"
    digest = hashlib.sha256()
    for key in sorted(tensors):
        digest.update(key.encode())
        digest.update(tensors[key].contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:12]


if __name__ == "__main__":
    main()
