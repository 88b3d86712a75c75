"""Tiny random-weight models for tests: a Qwen3 target, a DFlash drafter for it, and an MTP-carrying target.

Used by the CPU tests (through ``conftest.py``) and, as a script, by the GPU suite, which has no model hub:
``python tests/tiny_models.py --out DIR`` writes ``DIR/{qwen3,dflash,mtp}``. Weights are seeded, so every
machine builds the same models.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass

import torch

VOCAB_SIZE = 512
EOS_TOKEN_ID = 2
MASK_TOKEN_ID = 3
_SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|MASK|>"]


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


def write_tokenizer(out_dir: str) -> None:
    """A word-level tokenizer over ``t4 .. t511`` so text requests and detokenisation work offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(_SPECIAL_TOKENS)}
    vocab.update({f"t{i}": i for i in range(len(_SPECIAL_TOKENS), VOCAB_SIZE)})
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


def make_qwen3_target(out_dir: str, shape: TinyShape = TinyShape(), seed: int = 0) -> str:
    """A random ``Qwen3ForCausalLM`` with real safetensors weights and a tokenizer."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(_qwen3_config(shape)).eval()
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
) -> str:
    """A random drafter in the upstream ``DFlashDraftModel`` format that SGLang loads.

    Its decoder layers have Qwen3's parameter names; ``fc`` projects the concatenated target features
    (one per entry of ``target_layer_ids``) and ``hidden_norm`` normalises them. SGLang captures the
    feature of target layer ``i`` *before* layer ``i + 1``, so ids must stay below ``target_num_layers - 1``.
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
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return out_dir


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="parent folder for qwen3/, dflash/, mtp/, qwen3_v64/, dflash_v64/")
    parser.add_argument("--num-layers", type=int, default=4)
    args = parser.parse_args()
    shape = TinyShape(num_layers=args.num_layers)
    make_qwen3_target(os.path.join(args.out, "qwen3"), shape)
    make_dflash_drafter(
        os.path.join(args.out, "dflash"),
        target_num_layers=args.num_layers,
        block_size=8,
        target_layer_ids=list(range(0, args.num_layers - 1, 2)),
    )
    make_mtp_target(os.path.join(args.out, "mtp"), shape)
    # DDTree's exactness tests: a 64-token vocabulary, so that random drafts get accepted (see TinyShape).
    make_qwen3_target(os.path.join(args.out, "qwen3_v64"), TinyShape(num_layers=args.num_layers, vocab_size=64))
    make_dflash_drafter(
        os.path.join(args.out, "dflash_v64"),
        target_num_layers=args.num_layers,
        shape=TinyShape(num_layers=1, vocab_size=64),
        block_size=8,
        target_layer_ids=list(range(0, args.num_layers - 1, 2)),
    )
    print(args.out)


if __name__ == "__main__":
    main()
