"""``bench.gdn_tree_kernel``'s launch sweep (issue 17: which launch of the WY kernels fits 128-dim heads): its
argument and its table. The measurement itself needs a CUDA GPU."""

from __future__ import annotations

import argparse

import pytest
import torch

from bench import gdn_tree_kernel


def test_launch_configs_read_value_columns_by_warps_and_precision_and_refuse_the_rest():
    assert gdn_tree_kernel.launch_configs("32x4,16x8:tf32x3,128x16:ieee") == [
        (32, 4, "ieee"), (16, 8, "tf32x3"), (128, 16, "ieee")]
    for bad in ("32", "32x3", "24x4", "8x4", "x", "", "32x4:tf32", "32x4:"):
        with pytest.raises(argparse.ArgumentTypeError):
            gdn_tree_kernel.launch_configs(bad)


def test_the_report_gives_each_launch_its_verify_and_commit_times_or_says_it_does_not_launch():
    row = {"bs": 1, "T": 33, "tree": "bushy", "tp": 1,
           "ms": {"sglang_verify": 0.08, "sglang_commit": 0.01, "ours_verify": 2.0, "ours_factor": 1.5,
                  "ours_commit": 0.16},
           "scratch_mib_per_request": {"sglang": 105.6, "ours": 4.9},
           "max_abs_diff": {"output": 1e-3, "committed_state": 1e-5},
           "launch_ms": {"32x4": {"verify": 2.0, "commit": 0.16},  # a report from before the differences
                         "16x8:tf32x3": {"verify": 0.9, "commit": 0.1, "max_abs_diff_output": 2e-4,
                                         "max_abs_diff_state": 3e-6},
                         "64x8:tf32x3": {"error": "out of resource: shared memory, Required: 262144"}}}  # fmt: skip
    text = gdn_tree_kernel.markdown({"meta": {"date": "d", "commit": "c", "gpu": "g", "tp": 1}, "rows": [row]})
    assert "| bushy | 1 | 33 | 0.080 | 0.010 | 2.000 | 1.500 | 0.160 | 0.04x |" in text
    assert "| 1.00e-03 / 1.00e-05 | – |" in text  # not timed with the root in the rows: a report from before
    row["ms"]["ours_verify_root_in_rows"] = 2.5
    assert "| 1.00e-03 / 1.00e-05 | 2.500 |" in gdn_tree_kernel.markdown({"meta": {"date": "d", "commit": "c",
                                                                                  "gpu": "g", "tp": 1},
                                                                         "rows": [row]})  # fmt: skip
    assert "| tree | bs | T | 32x4 | 16x8:tf32x3 | 64x8:tf32x3 |" in text
    assert "| bushy | 1 | 33 | 2.000 / 0.160 | 0.900 / 0.100 (2.0e-04 / 3.0e-06) | does not launch |" in text
    assert "per launch" not in gdn_tree_kernel.markdown({"meta": {"date": "d", "commit": "c", "gpu": "g", "tp": 1},
                                                        "rows": [{**row, "launch_ms": {}}]})  # fmt: skip


def test_bushy_trees_are_at_most_as_deep_as_a_block_of_16_drafts_and_chains_are_chains():
    """Past 15 levels below the root a tree is not one a DDTree of block 16 builds; a random tree that stays
    shallower than the cap is the same with it."""
    from sglang_ddtree.tree.gdn_tree_reference import random_parents

    def depth(parents: list[int]) -> int:
        out = [0]
        for parent in parents[1:]:
            out.append(out[parent] + 1)
        return max(out)

    for T in (33, 65):
        for seed in range(8):
            tree = gdn_tree_kernel.random_tree(T, "bushy", torch.Generator().manual_seed(seed))
            uncapped = random_parents(T, torch.Generator().manual_seed(seed))
            assert depth(tree) <= gdn_tree_kernel.DDTREE_MAX_DEPTH
            assert all(0 <= parent < node for node, parent in enumerate(tree) if node)
            if depth(uncapped) < gdn_tree_kernel.DDTREE_MAX_DEPTH:  # no node the cap forbids as a parent
                assert tree == uncapped
    assert gdn_tree_kernel.random_tree(5, "chain", torch.Generator()) == [-1, 0, 1, 2, 3]


def test_the_report_gives_the_conv_its_own_table_when_the_rows_have_it():
    row = {"bs": 8, "T": 33, "tree": "bushy", "tp": 1,
           "ms": {"sglang_verify": 0.3, "sglang_commit": 0.08, "ours_verify": 0.28, "ours_commit": 0.08},
           "scratch_mib_per_request": {"sglang": 99.0, "ours": 4.55},
           "max_abs_diff": {"output": 1e-4, "committed_state": 1e-6},
           "conv": {"ms": {"sglang_conv": 0.04, "sglang_conv_commit": 0.01, "ours_conv": 0.03,
                           "ours_conv_commit": 0.02},
                    "scratch_mib_per_request": {"sglang": 1.93, "ours": 0.64},
                    "max_abs_diff": {"output": 7.8e-3, "committed_window": 0.0}}}  # fmt: skip
    meta = {"date": "d", "commit": "c", "gpu": "g", "tp": 1}
    text = gdn_tree_kernel.markdown({"meta": meta, "rows": [row]})
    assert "| bushy | 8 | 33 | 0.040 | 0.010 | 0.030 | 0.020 | 1.00x | 1.93 / 0.64 | 7.80e-03 / 0.00e+00 |" in text
    without = {k: v for k, v in row.items() if k != "conv"}  # a report from before the conv was timed
    assert "The conv before it" not in gdn_tree_kernel.markdown({"meta": meta, "rows": [without]})
