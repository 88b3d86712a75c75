"""How far SGLang's speculative top-k renormalisation is from exact top-k at bf16 logit ties (H200).

SGLang's EAGLE-family sampled verify (``eagle_utils.eagle_sample``, which DDTREE and NEXTN share) renormalises
the target's probabilities with ``sgl_kernel.top_k_renorm_prob``; AR with ``--sampling-backend pytorch`` keeps
exactly the k largest (a sort). Softmax rows of bfloat16 logits hold exact ties, and a kernel that keeps every
token tied with the k-th one keeps more than k. Prints, for random rows shaped like the tiny GPU-suite models'
(64 tokens, logits ~N(0, sigma)) and like a real vocabulary: the fraction of rows whose kept support is not
exactly k, and the mean total-variation distance to exact top-k.

    python3 tests/gpu/topk_renorm_ties.py
"""

import torch
from sgl_kernel import top_k_renorm_prob


def exact_top_k(probs: torch.Tensor, k: int) -> torch.Tensor:
    kept = torch.zeros_like(probs).scatter_(1, probs.topk(k, dim=-1).indices, 1.0)
    masked = probs * kept
    return masked / masked.sum(-1, keepdim=True)


def compare(rows: int, vocab: int, sigma: float, k: int, dtype: torch.dtype) -> str:
    torch.manual_seed(0)
    logits = (torch.randn(rows, vocab, device="cuda") * sigma).to(dtype).float()
    probs = torch.softmax(logits, dim=-1)
    renormed = top_k_renorm_prob(probs, torch.full((rows,), k, device="cuda", dtype=torch.int32))
    exact = exact_top_k(probs, k)
    support = (renormed > 0).sum(-1)
    tv = 0.5 * (renormed - exact).abs().sum(-1)
    return (f"vocab {vocab:>6} sigma {sigma:<4} k {k:<3} {str(dtype):<15} rows with support != k: "
            f"{(support != k).float().mean().item():.4f} (max support {support.max().item()}), "
            f"mean TV to exact top-k {tv.mean().item():.5f}, max TV {tv.max().item():.4f}")  # fmt: skip


if __name__ == "__main__":
    for vocab, sigma, k in [(64, 0.15, 8), (64, 1.0, 8), (248320, 1.0, 8), (248320, 3.0, 20)]:
        for dtype in (torch.bfloat16, torch.float32):
            print(compare(20000 if vocab == 64 else 256, vocab, sigma, k, dtype), flush=True)
