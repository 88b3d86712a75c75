"""Soft-label distillation in ``train_drafter``: the block loss against the target's whole distribution."""

import json
import os
import random

import pytest
import torch
import torch.nn.functional as F

from sglang_ddtree.training.train_drafter import SoftLabels, block_loss, parse_args, soft_label_loss


def kl_reference(drafter_logits: torch.Tensor, target_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    drafter_log_probs = F.log_softmax(drafter_logits / temperature, dim=-1)
    target_log_probs = F.log_softmax(target_logits / temperature, dim=-1)
    return F.kl_div(drafter_log_probs, target_log_probs, log_target=True, reduction="none").sum(-1) * temperature**2


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_the_soft_loss_is_the_kl_from_the_targets_distribution_scaled_by_the_squared_temperature(temperature):
    generator = torch.Generator().manual_seed(0)
    drafter, target = torch.randn(3, 5, 64, generator=generator), torch.randn(3, 5, 64, generator=generator)
    loss = soft_label_loss(drafter, target, SoftLabels(weight=1.0, temperature=temperature))
    assert torch.allclose(loss, kl_reference(drafter, target, temperature), atol=1e-5)
    assert (loss > 0).all()
    assert torch.allclose(soft_label_loss(target, target, SoftLabels(1.0, temperature)), torch.zeros(3, 5), atol=1e-5)


def test_top_k_truncation_keeps_the_targets_top_tokens_renormalised():
    generator = torch.Generator().manual_seed(1)
    drafter, target = torch.randn(4, 64, generator=generator), torch.randn(4, 64, generator=generator)
    full = soft_label_loss(drafter, target, SoftLabels(1.0))
    assert torch.allclose(soft_label_loss(drafter, target, SoftLabels(1.0, top_k=64)), full, atol=1e-5)
    # Top-1 at temperature 1 is the hard label: the drafter's cross-entropy at the target's argmax.
    hard = F.cross_entropy(drafter, target.argmax(-1), reduction="none")
    assert torch.allclose(soft_label_loss(drafter, target, SoftLabels(1.0, top_k=1)), hard, atol=1e-5)


def test_a_block_loss_mixing_in_top_1_soft_labels_is_the_hard_block_loss(tmp_path):
    """The mixed loss goes through the same positions and weights as the hard one: with soft labels that are
    the hard labels (top-1, temperature 1) every mixing weight gives the hard loss."""
    from transformers import AutoModelForCausalLM

    from sglang_ddtree.training.drafter_model import DFlashDrafter, DrafterShape
    from tiny_models import MASK_TOKEN_ID, TinyShape, make_qwen3_target

    target = make_qwen3_target(str(tmp_path / "target"), TinyShape(num_layers=5, vocab_size=64))
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with open(os.path.join(target, "config.json")) as f:
        drafter = DFlashDrafter(DrafterShape.for_target(json.load(f), num_layers=1, num_features=2, block_size=4))
    torch.manual_seed(0)
    for parameter in drafter.parameters():
        torch.nn.init.normal_(parameter, std=0.05)
    rng = random.Random(0)
    ids = torch.tensor([[rng.randint(4, 63) for _ in range(24)] for _ in range(2)])
    anchors = torch.tensor([[3, 9, 15], [5, 11, 19]])
    with torch.no_grad():
        hard, hits = block_loss(drafter, model, ids, anchors, MASK_TOKEN_ID, gamma=2.0)
        for weight in (0.3, 1.0):
            mixed, mixed_hits = block_loss(drafter, model, ids, anchors, MASK_TOKEN_ID, 2.0, SoftLabels(weight, top_k=1))
            assert torch.allclose(mixed, hard, atol=1e-5) and torch.equal(mixed_hits, hits)
        soft, _ = block_loss(drafter, model, ids, anchors, MASK_TOKEN_ID, 2.0, SoftLabels(1.0))
    assert not torch.allclose(soft, hard)


@pytest.mark.parametrize(
    "flags",
    [["--soft-label-weight", "1.5"], ["--soft-label-weight", "-0.1"], ["--soft-label-temperature", "0"],
     ["--soft-label-top-k", "-1"]],
)  # fmt: skip
def test_bad_soft_label_settings_are_refused_in_one_line(flags, tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--target", str(tmp_path), "--out", str(tmp_path / "out"), "--prompts", "p.txt", *flags])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "--soft-label-weight must be in [0, 1]" in error
