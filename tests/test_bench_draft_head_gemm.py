"""``python -m bench.draft_head_gemm``: every form of the tree head's LM-head product computes the same logits."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import draft_head_gemm  # noqa: E402


def test_every_form_gives_the_heads_logits_and_the_report_names_the_fastest(tmp_path):
    """On the CPU at a small shape (vocabulary rows not a multiple of the chunk count, tokens not of 128): the
    forms differ only in how the product is laid out, so their logits agree to float32 rounding."""
    draft_head_gemm.main(["--out", str(tmp_path), "--batch-sizes", "1,3", "--hidden", "24", "--vocab", "101",
                          "--vocab-chunks", "4", "--pad-tokens-to", "1,128"])  # fmt: skip
    report = json.loads((tmp_path / "draft_head_gemm.json").read_text())
    assert [row["tokens"] for row in report["rows"]] == [15, 45]
    for row in report["rows"]:
        assert set(row["forms"]) == {"matmul", "weight_first", "padded_1", "padded_128", "vocab_chunks_4"}
        for cell in row["forms"].values():
            assert cell["max_abs_diff"] < 1e-5 and cell["ms"] > 0
    assert "| 3 | 45 |" in (tmp_path / "draft_head_gemm.md").read_text()
