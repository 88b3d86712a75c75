"""``python -m bench.hybrid_verify_cost``: its configurations pass the launcher, its report says what it measured."""

import gzip
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import hybrid_verify_cost as cost  # noqa: E402
from support import with_fake_gpu  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("cost_models")
    cost.write_model_folders(root)
    return root


def launch_args(config: cost.Config, models, running: int) -> list[str]:
    return [*config.launcher_args(models), "--attention-backend", "flashinfer", "--tokenizer-path", str(models),
            *cost.SERVER_FLAGS, "--max-running-requests", str(running)]  # fmt: skip


def test_every_configuration_is_accepted_by_the_launcher(models):
    """Run before any GPU time is spent: a typo in a configuration would cost a server start."""
    configs = cost.default_configs()
    assert {c.width for c in configs if c.algo == "ddtree"} == set(cost.WIDTHS)
    for config in configs:
        assert cost.launcher_refusal(launch_args(config, models, 1), config.env) is None, config.name


def test_only_runs_the_named_configurations_in_the_order_given_and_refuses_an_unknown_name():
    """A GPU call cut by its deadline keeps the first configurations, so the caller's order decides what is measured;
    a misspelt name would otherwise be skipped silently after a server start's worth of GPU time."""
    named = ["ddtree N=65 wy", "dflash", "ddtree N=33 wy"]
    assert [config.name for config in cost.select_configs(named)] == named
    assert [config.name for config in cost.select_configs([])] == [c.name for c in cost.default_configs()]
    with pytest.raises(SystemExit, match="unknown configuration 'ddtree N=33 WY'"):
        cost.select_configs(["dflash", "ddtree N=33 WY"])


def test_on_an_h200_the_widest_fp32_tree_fits_one_request_but_not_eight(models, tmp_path, monkeypatch):
    """65 nodes x 146.8 MiB per request slot: 9 slots (8 requests + padding) need 83.9 GiB, more than the
    ~75.5 GiB the 50.9 GiB of weights leave at --mem-fraction-static 0.9; bf16 states halve that."""
    monkeypatch.setenv("PATH", with_fake_gpu(tmp_path, 143771)["PATH"])  # an H200
    widest = next(c for c in cost.default_configs() if c.name == "ddtree N=65")
    assert "needs 83.9 GiB" in cost.launcher_refusal(launch_args(widest, models, 8), widest.env)
    assert cost.launcher_refusal(launch_args(widest, models, 1), widest.env) is None
    bf16 = next(c for c in cost.default_configs() if c.name == "ddtree N=65 ssm bf16")
    assert cost.launcher_refusal(launch_args(bf16, models, 8), bf16.env) is None


def test_the_wy_configurations_are_checked_with_their_smaller_state(models, tmp_path, monkeypatch):
    """The dry run sees the configuration's environment, as its server's launcher does: on an H100 SGLang's
    per-node states of N = 33 fit one request, not eight (42.6 GiB), and the WY verify's fit eight (RESULTS run
    73 recorded the WY server at bs 8 as refused before)."""
    monkeypatch.setenv("PATH", with_fake_gpu(tmp_path, 81559)["PATH"])  # an H100
    by_name = {c.name: c for c in cost.default_configs()}
    snapshots, wy = by_name["ddtree N=33"], by_name["ddtree N=33 wy"]
    assert "needs 42.6 GiB" in cost.launcher_refusal(launch_args(snapshots, models, 8), snapshots.env)
    assert cost.launcher_refusal(launch_args(wy, models, 8), wy.env) is None


def test_on_an_h100_dflash_at_eight_requests_is_refused_counting_its_drafters_weights(models, tmp_path, monkeypatch):
    """RESULTS run 73: DFLASH's chain of 16 with 8 requests (20.6 GiB of per-node states) passed the launcher's
    check against the 20.8 GiB the target's weights leave at --mem-fraction-static 0.9, and SGLang, which counts
    the drafter's 3.4 GB too, failed at start. With the drafter's 3.2 GiB counted the dry run refuses it, so the
    bench serves DFLASH at batch 1 there."""
    monkeypatch.setenv("PATH", with_fake_gpu(tmp_path, 81559)["PATH"])  # an H100
    dflash = next(c for c in cost.default_configs() if c.name == "dflash")
    refusal = cost.launcher_refusal(launch_args(dflash, models, 8), dflash.env)
    assert "needs 20.6 GiB" in refusal and "54.1 GiB of weights" in refusal, refusal
    assert cost.launcher_refusal(launch_args(dflash, models, 1), dflash.env) is None


def test_server_log_gives_the_gdn_state_sglang_allocated():
    line = ("Mamba Cache is allocated. max_mamba_cache_size: 9, conv_state size: 0.01GB, ssm_state size: 0.28GB "
            "intermediate_ssm_state_cache size: 9.28GB intermediate_conv_window_cache size: 0.19GB ")  # fmt: skip
    state = cost.gdn_state_gb("noise\n" + line)
    assert state == {
        "conv_state": 0.01, "ssm_state": 0.28, "intermediate_ssm_state_cache": 9.28, "intermediate_conv_window_cache": 0.19,
        "mamba_slots": 9,
    }  # fmt: skip
    assert cost.verify_state_cell(state) == "9.47 (970)"  # GB in all, MiB per request (10 rows: 9 slots + 1)
    assert cost.verify_state_cell({"intermediate_ssm_state_cache": 2.53}) == "2.53"  # an older report's row
    # Under the WY verify SGLang's line counts the conv windows before the pool gives every node its own: the
    # package's line after it has the buffers per request.
    wy = cost.gdn_state_gb(line.replace("9.28GB", "0.56GB").replace("0.19GB", "0.01GB") + "\n[x] DDTREE GDN verify "
                           "from the root state: 2 SSM states per request and layer (the workspace) instead of 33, "
                           "per-node buffers of 380.8 MiB per request slot")  # fmt: skip
    assert wy["workspace_mib_per_request"] == 380.8
    assert cost.verify_state_cell(wy) == "3.72 (381)"


def test_kernel_time_is_split_by_kind_per_step(tmp_path):
    events = [{"cat": "kernel", "name": n, "dur": d} for n, d in [
        ("fused_sigmoid_gating_delta_rule_update_kernel", 600), ("_causal_conv1d_update_kernel", 200),
        ("_gdn_tree_verify_kernel", 150), ("_gdn_tree_commit_kernel", 50),
        ("BatchPrefillWithPagedKVCacheKernel", 400), ("nvjet_tst_128x64_64x6_1x1_v_bz_TNN", 1200),
        ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>", 400)]]
    events += [{"cat": "cpu_op", "name": "aten::mm", "dur": 5000}]  # host time: not GPU kernel time
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    assert cost.kernel_time_by_class(str(path), steps=2) == {"gdn": 0.5, "attention": 0.2, "gemm": 0.6, "other": 0.2}
    assert [k["class"] for k in cost.top_kernels(str(path), steps=2, count=3)] == ["gemm", "gdn", "attention"]


def test_report_only_resplits_a_trace_recorded_under_the_gpu_machines_out_folder(tmp_path):
    """A report copied off the GPU machine names its traces by that machine's paths; --report-only finds them
    under its own --out and re-splits them."""
    trace = tmp_path / "traces" / "mtp" / "bs1" / "t.trace.json.gz"
    trace.parent.mkdir(parents=True)
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": [{"cat": "kernel", "name": "_causal_conv1d_update_kernel", "dur": 300}]}, f)
    cell = {"kernels": {"trace": "/tmp/hvc/traces/mtp/bs1/t.trace.json.gz", "steps": 1, "kernel_ms": {}}}
    report = {"rows": [{"config": "mtp", "cells": {"1": cell}}]}
    cost.reclassify_kernels(report, tmp_path)
    assert cell["kernels"]["trace"] == "traces/mtp/bs1/t.trace.json.gz"
    assert cell["kernels"]["kernel_ms"] == {"gdn": 0.3, "attention": 0.0, "gemm": 0.0, "other": 0.0}


def report_with(step_ms: dict[str, dict[int, float]]) -> dict:
    configs = {c.name: c for c in cost.default_configs()}
    rows = []
    for name, cells in step_ms.items():
        c = configs[name]
        rows.append({"config": name, "model": c.model, "algo": c.algo, "width": c.width,
                     "ssm_dtype": c.ssm_dtype or "float32", "cells": {str(bs): {"step_ms": ms} for bs, ms in cells.items()}})  # fmt: skip
    return {"meta": {"date": "d", "commit": "c", "gpu": "g", "attention_backend": "flashinfer", "prompt_len": 512,
                     "new_tokens": 96, "repeats": 2}, "rows": rows}  # fmt: skip


def test_break_even_tau_scales_the_baselines_tau_by_the_step_ratio():
    report = report_with({"mtp": {1: 20.0}, "dflash": {1: 25.0}, "ddtree N=33": {1: 30.0}})
    (entry,) = cost.break_even(report["rows"], {"mtp": 3.5, "dflash": 3.1}, bs=1)
    assert entry["tau_to_beat_mtp"] == pytest.approx(3.5 * 30 / 20)
    assert entry["tau_to_beat_dflash"] == pytest.approx(3.1 * 30 / 25)


def test_report_marks_refused_cells_and_writes_a_plot(tmp_path):
    report = report_with({"ar": {1: 18.0, 8: 19.0}, "mtp": {1: 21.0, 8: 24.0}, "ddtree N=65": {1: 33.0}})
    report["rows"][-1]["cells"]["8"] = {"refused": "--budget 64 (65 verify tokens) with 8 running requests needs ..."}
    text = cost.markdown(report, {"mtp": 3.5})
    assert "| ddtree N=65 | 65 | float32 | 33.00 | does not fit |" in text
    assert "ddtree N=65, bs 8: --budget 64" in text
    cost.plot(report, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 0


USER_SCALE_SHARED_FLAGS = ["--load-format", "dummy", "--skip-tokenizer-init", "--mem-fraction-static", "0.9",
                           "--disable-radix-cache", "--cuda-graph-backend-prefill", "disabled", "--sampling-backend",
                           "pytorch", "--grammar-backend", "none", "--attention-backend", "flashinfer"]  # fmt: skip


def test_the_user_scale_side_by_side_starts_from_written_model_folders_the_launcher_accepts(tmp_path):
    """Issue 18's comparison: ``--write-models-only`` writes the Qwen3.6-27B-shaped folders, and every
    configuration of ``bench.side_by_side`` on them (AR, MTP, DFLASH, DDTree B=16/32/64) passes the launcher."""
    from bench import side_by_side

    cost.main(["--out", str(tmp_path), "--tokenizer-path", "unused", "--write-models-only"])
    models = tmp_path / "models"
    assert json.loads((models / "qwen36_27b" / "config.json").read_text()) == cost.MODELS["qwen36_27b"]
    args, shared = side_by_side.parse_args([
        "--model-path", str(models / "qwen36_27b"), "--draft-model-path", str(models / "zlab_drafter"),
        "--algos", "ar,mtp,dflash,ddtree", "--budgets", "16,32,64", "--simulate-tau", "mtp=3.56,dflash=3.1,ddtree=4.15",
        "--out", str(tmp_path / "sbs"), "--", *USER_SCALE_SHARED_FLAGS])  # fmt: skip
    configs = side_by_side.configurations(args)
    assert list(configs) == ["ar", "mtp", "dflash", "ddtree B=16", "ddtree B=32", "ddtree B=64"]
    assert side_by_side.refused_configuration(configs, shared) is None
