"""``python -m sglang_ddtree.launch``: argument resolution (``--dry-run``) and its one-line errors."""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from support import with_fake_gpu
from tiny_models import TinyShape, make_dflash_drafter, make_mtp_target, make_qwen3_target


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("launch_models")
    return {
        "target": make_qwen3_target(str(root / "qwen3"), TinyShape(num_heads=4, num_kv_heads=2)),
        "drafter": make_dflash_drafter(str(root / "dflash"), target_num_layers=2, block_size=6),
        "mtp": make_mtp_target(str(root / "mtp")),
        "root": root,
    }


def launch(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sglang_ddtree.launch", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def dry_run_argv(*args: str) -> list[str]:
    """SGLang's argument list from the launcher's ``--dry-run`` line (after the server's variables, if any)."""
    result = launch(*args, "--dry-run")
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout.strip())
    while re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):
        argv = argv[1:]
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    return argv[3:]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("sglang_ddtree.launch: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


def test_ar_serves_the_target_without_speculation_on_loopback(models):
    argv = dry_run_argv("--algo", "ar", "--model-path", models["target"])
    assert flag(argv, "--model-path") == models["target"]
    assert flag(argv, "--tp-size") == "1"
    assert flag(argv, "--host") == "127.0.0.1"
    assert not any(a.startswith("--speculative") for a in argv)


def test_mtp_uses_nextn_with_three_steps_topk_one_and_four_draft_tokens(models):
    argv = dry_run_argv("--algo", "mtp", "--model-path", models["mtp"])
    assert flag(argv, "--speculative-algorithm") == "NEXTN"
    assert flag(argv, "--speculative-num-steps") == "3"
    assert flag(argv, "--speculative-eagle-topk") == "1"
    assert flag(argv, "--speculative-num-draft-tokens") == "4"


def test_dflash_uses_builtin_worker_with_the_drafters_block_size(models):
    argv = dry_run_argv("--algo", "dflash", "--model-path", models["target"], "--draft-model-path", models["drafter"])
    assert flag(argv, "--speculative-algorithm") == "DFLASH"
    assert flag(argv, "--speculative-draft-model-path") == models["drafter"]
    assert flag(argv, "--speculative-num-draft-tokens") == "6"


def test_ddtree_verifies_budget_plus_root_tree_nodes_with_the_drafters_block(models):
    argv = dry_run_argv("--algo", "ddtree", "--model-path", models["target"], "--draft-model-path", models["drafter"],
                        "--budget", "16")  # fmt: skip
    assert flag(argv, "--speculative-algorithm") == "DDTREE"
    assert flag(argv, "--speculative-draft-model-path") == models["drafter"]
    assert flag(argv, "--speculative-num-draft-tokens") == "17"
    assert flag(argv, "--speculative-dflash-block-size") == "6"
    assert "--cuda-graph-backend-decode" not in argv and "--disable-cuda-graph" not in argv  # graphs stay on


def test_ddtree_runs_tensor_parallel(models):
    argv = dry_run_argv("--algo", "ddtree", "--model-path", models["target"], "--draft-model-path", models["drafter"],
                        "--tp", "2")  # fmt: skip
    assert flag(argv, "--tp-size") == "2" and flag(argv, "--speculative-algorithm") == "DDTREE"


@pytest.mark.parametrize(
    "scale_out",
    [
        ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:5000"],  # TP across two nodes
        ["--dp-size", "2"],  # data-parallel replicas behind SGLang's own balancer
    ],
)
def test_ddtree_passes_sglangs_multi_node_and_data_parallel_flags_through_unchanged(models, scale_out):
    argv = dry_run_argv("--algo", "ddtree", "--model-path", models["target"], "--draft-model-path", models["drafter"],
                        "--tp", "2", *scale_out)  # fmt: skip
    assert argv[-len(scale_out) :] == scale_out
    assert flag(argv, "--tp-size") == "2" and flag(argv, "--speculative-algorithm") == "DDTREE"


HISTOGRAM, BY_WIDTH = "SGLANG_DDTREE_SIMULATE_ACC_HISTOGRAM", "SGLANG_DDTREE_SIMULATE_ACC_BY_WIDTH"


@pytest.mark.parametrize(
    "variable, value, mean, fragments",
    [
        (HISTOGRAM, "[1, 3, 1]", None, [f"{HISTOGRAM} needs SGLANG_SIMULATE_ACC_LEN > 0"]),
        (HISTOGRAM, "[1, -3]", "2", [f"{HISTOGRAM}=", "non-negative weights"]),
        (None, None, "two", ["SGLANG_SIMULATE_ACC_LEN='two' is not a number"]),
        (BY_WIDTH, "9:12", "2", [f"{BY_WIDTH}='9:12'", "between 1 and the width"]),
        (BY_WIDTH, "9:3", None, [f"{BY_WIDTH} needs SGLANG_SIMULATE_ACC_LEN > 0"]),
    ],
)
def test_a_cost_only_simulation_set_up_wrong_is_one_line(models, tmp_path, variable, value, mean, fragments):
    """``value``: the histogram file's content, or the width table itself."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_SIMULATE", "SGLANG_DDTREE_SIMULATE"))}
    if variable == HISTOGRAM:
        (tmp_path / "h.json").write_text(value)
        env[HISTOGRAM] = str(tmp_path / "h.json")
    elif variable == BY_WIDTH:
        env[BY_WIDTH] = value
    if mean is not None:
        env["SGLANG_SIMULATE_ACC_LEN"] = mean
    result = launch("--algo", "ddtree", "--model-path", models["target"], "--draft-model-path", models["drafter"],
                    "--dry-run", env=env)  # fmt: skip
    assert_one_line_error(result, *fragments)


def test_ddtree_budget_defaults_to_auto_on_a_dense_target_and_to_16_on_a_hybrid_one(models, hybrid):
    """``auto`` on a hybrid target is lossless on the GPU but lost at Qwen3.6-27B's shape, where B = 16 served more
    than B = 32 at every concurrency measured (``launch.HYBRID_DEFAULT_BUDGET``)."""
    result = launch("--algo", "ddtree", "--model-path", models["target"], "--draft-model-path", models["drafter"],
                    "--dry-run")  # fmt: skip
    command = shlex.split(result.stdout.strip())
    assert command[0] == "SGLANG_DDTREE_BUDGET_AUTO=1" and flag(command, "--speculative-num-draft-tokens") == "33"
    result = launch("--algo", "ddtree", "--model-path", hybrid["target"], "--draft-model-path", hybrid["drafter"],
                    "--dry-run")  # fmt: skip
    command = shlex.split(result.stdout.strip())
    assert "SGLANG_DDTREE_BUDGET_AUTO=1" not in command and flag(command, "--speculative-num-draft-tokens") == "17"


def step_time_table(path, widths=(1, 2, 4, 8, 17)) -> str:
    rows = [[1.0 + 0.01 * bs * w for w in widths] for bs in (1, 8)]
    path.write_text(json.dumps({"widths": list(widths), "batch_sizes": [1, 8], "step_ms": rows}))
    return str(path)


def test_ddtree_budget_auto_drafts_the_tables_widest_tree_and_hands_the_server_its_table(models, tmp_path):
    table = step_time_table(tmp_path / "steps.json")
    result = launch("--algo", "ddtree", "--model-path", models["target"], "--draft-model-path", models["drafter"],
                    "--budget", "auto", "--step-time-table", table, "--dry-run")  # fmt: skip
    assert result.returncode == 0, result.stderr
    command = shlex.split(result.stdout.strip())
    assert command[0] == f"SGLANG_DDTREE_STEP_TIME_TABLE={table}" and command[2:4] == ["-m", "sglang.launch_server"]
    assert flag(command, "--speculative-num-draft-tokens") == "17" and flag(command, "--speculative-algorithm") == "DDTREE"


def test_ddtree_budget_auto_without_a_table_drafts_a_32_node_tree_and_has_the_server_measure_its_steps(models):
    result = launch("--algo", "ddtree", "--model-path", models["target"], "--draft-model-path", models["drafter"],
                    "--budget", "auto", "--dry-run")  # fmt: skip
    assert result.returncode == 0, result.stderr
    command = shlex.split(result.stdout.strip())
    assert command[0] == "SGLANG_DDTREE_BUDGET_AUTO=1" and command[2:4] == ["-m", "sglang.launch_server"]
    assert flag(command, "--speculative-num-draft-tokens") == "33"


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--budget", "wide"], ["--budget must be a number of tree nodes or 'auto', got 'wide'"]),
        (["--budget", "8", "--step-time-table", "{table}"], ["--step-time-table only applies to --algo ddtree --budget auto"]),
        (["--budget", "auto", "--step-time-table", "{bad}"], ["step time table", "'widths' must be verify widths ascending from 1"]),
        (["--budget", "auto", "--step-time-table", "{narrow}"], ["--budget 1 is too small for the drafter's block size 6"]),
    ],
)
def test_budget_auto_set_up_wrong_is_one_line(models, tmp_path, args, fragments):
    paths = {"table": step_time_table(tmp_path / "t.json"), "bad": step_time_table(tmp_path / "b.json", (2, 4)),
             "narrow": step_time_table(tmp_path / "n.json", (1, 2))}  # fmt: skip
    args = [arg.format(**paths) for arg in args]
    result = launch("--algo", "ddtree", "--model-path", models["target"], "--draft-model-path", models["drafter"],
                    *args, "--dry-run")  # fmt: skip
    assert_one_line_error(result, *fragments)


@pytest.mark.parametrize("variable", ["SGLANG_DDTREE_STEP_TIME_TABLE", "SGLANG_DDTREE_BUDGET_AUTO"])
def test_an_auto_budget_variable_in_the_environment_is_not_silently_an_auto_budget(models, tmp_path, variable):
    value = step_time_table(tmp_path / "t.json") if variable == "SGLANG_DDTREE_STEP_TIME_TABLE" else "1"
    result = launch("--algo", "ddtree", "--model-path", models["target"], "--draft-model-path", models["drafter"],
                    "--budget", "8", "--dry-run", env={**os.environ, variable: value})  # fmt: skip
    assert_one_line_error(result, f"{variable} is set in the environment", "--budget auto")


def test_unknown_flags_pass_through_unchanged_and_last(models):
    extra = ["--attention-backend", "triton", "--mem-fraction-static", "0.5", "--some-future-flag=x"]
    argv = dry_run_argv("--algo", "ar", "--model-path", models["target"], *extra, "--tp", "2", "--host", "0.0.0.0")
    assert argv[-len(extra) :] == extra
    assert flag(argv, "--tp-size") == "2"
    assert flag(argv, "--host") == "0.0.0.0"


def test_a_network_bind_without_api_key_warns_in_one_line_and_still_starts(models):
    """Anyone who reaches a server bound beyond loopback without --api-key can use every endpoint: the launcher
    says so on stderr (one line, naming the risk and the fix) and still serves, since that can be intended."""
    result = launch("--algo", "ar", "--model-path", models["target"], "--host", "0.0.0.0", "--dry-run")
    assert result.returncode == 0
    assert flag(shlex.split(result.stdout.strip()), "--host") == "0.0.0.0"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("sglang_ddtree.launch: warning: --host 0.0.0.0 ")
    assert "without authentication" in lines[0] and "--api-key" in lines[0]


@pytest.mark.parametrize("host_args", [[], ["--host", "127.0.0.1"], ["--host", "0.0.0.0", "--api-key", "k"]])
def test_loopback_or_an_api_key_starts_without_a_warning(models, host_args):
    result = launch("--algo", "ar", "--model-path", models["target"], *host_args, "--dry-run")
    assert result.returncode == 0 and result.stderr == ""


def test_without_model_path_the_embedded_demo_model_is_served(models, tmp_path):
    env = {**os.environ, "SGLANG_DDTREE_CACHE_DIR": str(tmp_path)}
    result = launch("--algo", "ar", "--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    model_path = flag(shlex.split(result.stdout)[3:], "--model-path")
    assert model_path.startswith(str(tmp_path)) and "smollm2" in model_path


@pytest.mark.parametrize("algo", ["dflash", "ddtree"])
def test_without_paths_the_demo_model_is_served_with_its_shipped_drafter(tmp_path, algo):
    """The shipped drafter passes the launcher's drafter-vs-target checks against the demo model."""
    from sglang_ddtree.demo_model import DEMO_DRAFTER_PATH

    env = {**os.environ, "SGLANG_DDTREE_CACHE_DIR": str(tmp_path)}
    result = launch("--algo", algo, "--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout)[3:]
    assert flag(argv, "--model-path").startswith(str(tmp_path))
    assert flag(argv, "--speculative-draft-model-path") == DEMO_DRAFTER_PATH
    with open(os.path.join(DEMO_DRAFTER_PATH, "config.json")) as f:
        assert json.load(f)["block_size"] == 16
    assert flag(argv, "--speculative-num-draft-tokens") == ("16" if algo == "dflash" else "33")


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--algo", "beam"], ["unknown --algo 'beam'", "ar, mtp, dflash, ddtree"]),
        (["--algo", "dflash"], ["--algo dflash needs a DFlash drafter", "--draft-model-path"]),
        (["--algo", "ddtree"], ["--algo ddtree needs a DFlash drafter"]),
        (["--algo", "ar", "--tp", "3"], ["--tp 3 does not divide num_attention_heads=4"]),
        (["--algo", "ar", "--tp", "0"], ["--tp must be a positive integer"]),
        (["--algo", "mtp"], ["--algo mtp needs a target that ships MTP layers", "num_nextn_predict_layers"]),
        (["--algo", "ar", "--budget", "8"], ["--budget only applies to --algo ddtree"]),
        (["--algo", "ddtree", "--draft-model-path", "{drafter}", "--budget", "0"], ["--budget must be at least 1"]),
        (["--algo", "ddtree", "--draft-model-path", "{drafter}", "--budget", "1"],
         ["--budget 1 is too small for the drafter's block size 6", "at least 2"]),
        (["--algo", "ar", "--speculative-algorithm", "EAGLE"], ["use the launcher's --algo"]),
        (["--algo", "ar", "--tp-size=2"], ["use the launcher's --tp"]),
    ],
)
def test_bad_requests_fail_with_one_readable_line(models, args, fragments):
    args = [arg.format(drafter=models["drafter"]) for arg in args]
    assert_one_line_error(launch("--model-path", models["target"], *args, "--dry-run"), *fragments)


@pytest.mark.parametrize(
    "heads, tp, fragment",
    [
        ({"num_attention_heads": 6, "num_key_value_heads": 4}, 3, "--tp 3 and num_key_value_heads=4"),
        ({"text_config": {"num_attention_heads": 24, "linear_num_value_heads": 48, "linear_num_key_heads": 16,
                          "num_key_value_heads": 4}}, 3, "--tp 3 does not divide linear_num_key_heads=16"),
    ],
)  # fmt: skip
def test_tp_must_split_every_head_group(tmp_path, heads, tp, fragment):
    (tmp_path / "config.json").write_text(json.dumps(heads))
    result = launch("--algo", "ar", "--model-path", str(tmp_path), "--tp", str(tp), "--dry-run")
    assert_one_line_error(result, fragment)


def test_kv_heads_fewer_than_tp_are_replicated_not_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 4, "num_key_value_heads": 2}))
    assert flag(dry_run_argv("--algo", "ar", "--model-path", str(tmp_path), "--tp", "4"), "--tp-size") == "4"


def test_missing_model_path_is_named(models):
    missing = str(models["root"] / "no-such-model")
    assert_one_line_error(launch("--algo", "ar", "--model-path", missing, "--dry-run"), missing, "does not exist")


def test_unreadable_model_config_is_named(models):
    broken = models["root"] / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    assert_one_line_error(launch("--algo", "ar", "--model-path", str(broken), "--dry-run"), "not valid JSON")
    empty = models["root"] / "empty"
    empty.mkdir()
    assert_one_line_error(launch("--algo", "ar", "--model-path", str(empty), "--dry-run"), "cannot read model config")


def test_missing_drafter_path_and_non_dflash_drafter_are_named(models):
    missing = str(models["root"] / "no-such-drafter")
    result = launch("--algo", "dflash", "--model-path", models["target"], "--draft-model-path", missing, "--dry-run")
    assert_one_line_error(result, "drafter path", missing)
    result = launch("--algo", "dflash", "--model-path", models["target"], "--draft-model-path", models["target"],
                    "--dry-run")  # fmt: skip
    assert_one_line_error(result, "is not a DFlash drafter")


def test_hub_id_that_cannot_be_fetched_is_one_line(models):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = launch("--algo", "ar", "--model-path", "no-such-org/no-such-model", "--dry-run", env=env)
    assert_one_line_error(result, "'no-such-org/no-such-model' is not a local folder")



@pytest.mark.parametrize("algo", ["dflash", "ddtree"])
@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"hidden_size": 64}, "has hidden_size=64 but the target has hidden_size=128"),
        ({"vocab_size": 1000}, "has vocab_size=1000 but the target has vocab_size="),
        ({"num_target_layers": 36}, "has num_target_layers=36 but the target has num_hidden_layers=2"),
        ({"dflash_config": {"mask_token_id": 3, "target_layer_ids": [0, 5]}}, "target_layer_ids=[0, 5]"),
        ({"dflash_config": {"mask_token_id": 10**6, "target_layer_ids": [0]}}, "mask_token_id=1000000, outside"),
    ],
)
def test_drafter_built_for_another_target_is_refused_naming_the_field(models, tmp_path, algo, change, fragment):
    with open(os.path.join(models["drafter"], "config.json")) as f:
        config = json.load(f)
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    result = launch("--algo", algo, "--model-path", models["target"], "--draft-model-path", str(tmp_path), "--dry-run")
    assert_one_line_error(result, fragment)


# Hybrid (Gated DeltaNet) targets: Qwen3.6-27B's published text config (revision 6a9e13bd), served with dummy
# weights, and a tiny random one of the same family.
QWEN36_27B_TEXT = {
    "model_type": "qwen3_5_text", "dtype": "bfloat16", "hidden_size": 5120, "intermediate_size": 17408,
    "num_hidden_layers": 64, "full_attention_interval": 4, "num_attention_heads": 24, "num_key_value_heads": 4,
    "head_dim": 256, "attn_output_gate": True, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "mtp_num_hidden_layers": 1, "mamba_ssm_dtype": "float32", "vocab_size": 248320, "tie_word_embeddings": False,
}  # fmt: skip
H200_MIB = 143771


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    from tiny_models import make_qwen35_hybrid_target, make_swa_dflash_drafter

    root = tmp_path_factory.mktemp("hybrid_models")
    big = root / "qwen36_27b"
    big.mkdir()
    (big / "config.json").write_text(json.dumps(
        {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "text_config": QWEN36_27B_TEXT}
    ))  # fmt: skip
    big_drafter = root / "qwen36_27b_dflash"
    big_drafter.mkdir()
    (big_drafter / "config.json").write_text(json.dumps(
        {"architectures": ["DFlashDraftModel"], "block_size": 16, "hidden_size": 5120, "vocab_size": 248320,
         "num_hidden_layers": 5, "num_target_layers": 64, "dtype": "bfloat16", "num_attention_heads": 32,
         "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 17408,  # z-lab's layout: 3.2 GiB in bf16
         "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]}}
    ))  # fmt: skip
    return {
        "target": make_qwen35_hybrid_target(str(root / "qwen35")),
        "text_target": make_qwen35_hybrid_target(str(root / "qwen35_text"), arch="Qwen3_5ForCausalLM"),
        "drafter": make_swa_dflash_drafter(str(root / "dflash_swa")),
        "big": str(big),
        "big_drafter": str(big_drafter),
    }


def test_ddtree_on_a_hybrid_target_keeps_gdn_states_in_the_prefix_cache_with_overlap(hybrid):
    argv = dry_run_argv("--algo", "ddtree", "--model-path", hybrid["target"], "--draft-model-path", hybrid["drafter"])
    assert flag(argv, "--mamba-radix-cache-strategy") == "extra_buffer"
    assert flag(argv, "--speculative-num-draft-tokens") == "17"  # the hybrid default budget, 16
    no_radix = dry_run_argv("--algo", "ddtree", "--model-path", hybrid["target"], "--draft-model-path",
                            hybrid["drafter"], "--disable-radix-cache")  # fmt: skip
    assert "--mamba-radix-cache-strategy" not in no_radix


def test_text_only_hybrid_arch_is_served_by_dflash_and_ddtree(hybrid):
    """SGLang supports no extra_buffer prefix cache for the text-only arch: the launcher leaves its strategy to
    SGLang (which then schedules without overlap)."""
    for algo in ("dflash", "ddtree"):
        argv = dry_run_argv("--algo", algo, "--model-path", hybrid["text_target"], "--draft-model-path", hybrid["drafter"])
        assert "--mamba-radix-cache-strategy" not in argv


@pytest.mark.parametrize(
    "extra, fragments",
    [
        (["--mamba-radix-cache-strategy", "no_buffer"], ["no_buffer does not run with overlap scheduling"]),
        (["--mamba-radix-cache-strategy", "extra_buffer_lazy"], ["extra_buffer_lazy does not support --algo ddtree"]),
        (["--budget", "300"], ["301 verify tokens per request exceed --mamba-track-interval 256"]),
        (["--budget", "64", "--mamba-track-interval", "32"], ["65 verify tokens per request exceed --mamba-track-interval 32"]),
    ],
)  # fmt: skip
def test_hybrid_prefix_cache_settings_sglang_would_assert_on_are_one_line(hybrid, extra, fragments):
    result = launch("--algo", "ddtree", "--model-path", hybrid["target"], "--draft-model-path", hybrid["drafter"],
                    *extra, "--dry-run")  # fmt: skip
    assert_one_line_error(result, *fragments)


def test_hybrid_target_in_another_dtype_than_its_conv_states_is_refused(hybrid, tmp_path):
    """H200 run 24: the tiny hybrid's float32 config became float16 under --dtype auto, and SGLang's conv kernel
    died at start-up beside its bfloat16 conv state."""
    float32 = tmp_path / "float32"
    float32.mkdir()
    config = json.loads(open(os.path.join(hybrid["target"], "config.json")).read())
    config["text_config"]["dtype"] = "float32"
    (float32 / "config.json").write_text(json.dumps(config))
    for algo in ("ar", "mtp"):
        assert_one_line_error(launch("--algo", algo, "--model-path", str(float32), "--dry-run"),
                              "--dtype auto (from the config) serves this hybrid target in float16",
                              "conv states in bfloat16", "pass --dtype bfloat16")  # fmt: skip
        assert_one_line_error(launch("--algo", algo, "--model-path", hybrid["big"], "--dtype", "float32", "--dry-run"),
                              "--dtype float32 serves this hybrid target in float32")  # fmt: skip
    assert flag(dry_run_argv("--algo", "ar", "--model-path", str(float32), "--dtype", "bfloat16"), "--dtype") == "bfloat16"
    exact = launch("--algo", "ar", "--model-path", hybrid["big"], "--dtype", "float32", "--dry-run",
                   env={**os.environ, "SGLANG_MAMBA_CONV_DTYPE": "float32"})  # fmt: skip
    assert exact.returncode == 0, exact.stderr


def test_no_buffer_runs_once_overlap_is_off(hybrid):
    argv = dry_run_argv("--algo", "ddtree", "--model-path", hybrid["target"], "--draft-model-path", hybrid["drafter"],
                        "--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule")  # fmt: skip
    assert argv.count("--mamba-radix-cache-strategy") == 1 and flag(argv, "--mamba-radix-cache-strategy") == "no_buffer"


def big_dry_run(hybrid, tmp_path, *args: str, gpu_mib: int = H200_MIB, snapshots: bool = True
                ) -> subprocess.CompletedProcess:  # fmt: skip
    """A dry run at Qwen3.6-27B's shape on a GPU of ``gpu_mib``; ``snapshots``: DDTREE with SGLang's per-node GDN
    states (``SGLANG_DDTREE_GDN_WY_VERIFY=0``), whose size the checks below are about, else the default."""
    drafter = ["--draft-model-path", hybrid["big_drafter"]] if "ddtree" in args else []
    env = {**with_fake_gpu(tmp_path, gpu_mib), **({"SGLANG_DDTREE_GDN_WY_VERIFY": "0"} if snapshots else {})}
    return launch("--model-path", hybrid["big"], *drafter, "--load-format", "dummy", *args, "--dry-run", env=env)


@pytest.mark.parametrize("tp, running", [("1", "5"), ("2", "18")])
def test_ddtree_at_qwen36_27b_shape_runs_as_many_requests_as_their_node_states_fit(hybrid, tmp_path, tp, running):
    """Per node and request: 48 GDN layers x (48/tp value heads x 128 x 128 fp32 SSM + conv window) = 146.8 MiB
    at TP=1; 33 nodes -> 4.73 GiB per request slot. Weights: 27.3e9 bf16 parameters = 50.9 GiB / tp, and the
    drafter's 1.73e9 = 3.2 GiB / tp. An H200 (140.4 GiB) at an assumed 0.85 static fraction leaves 65.2 GiB
    (TP=1), of which half goes to verify states: 5 requests + 1 padding slot. TP=2: 2.37 GiB per slot, 92.3 GiB
    left -> 18."""
    result = big_dry_run(hybrid, tmp_path, "--algo", "ddtree", "--budget", "32", "--tp", tp)
    assert result.returncode == 0, result.stderr
    assert flag(shlex.split(result.stdout)[3:], "--max-running-requests") == running


@pytest.mark.parametrize("gpu_mib, running", [(H200_MIB, None), (81559, "47")], ids=["h200", "h100"])
def test_the_default_snapshot_free_gdn_verify_runs_about_sglangs_48_requests(hybrid, tmp_path, gpu_mib, running):
    """By default a request slot holds only the workspace, one SSM state per GDN layer with every node's conv input
    in it (``gdn_workspace_pool``): 48 x 3 MiB = 144 MiB at TP=1 instead of 4.73 GiB, so 49 slots take 6.9 GiB of
    the 32.6 GiB half on an H200 and SGLang's own 48 requests stand; an 80 GB card, where the snapshots fit no
    request, has a 6.8 GiB half after 54.1 GiB of target and drafter weights: 47. 48 asked for explicitly are
    no longer refused on either."""
    for extra in ([], ["--max-running-requests", "48"]):
        result = big_dry_run(hybrid, tmp_path, "--algo", "ddtree", "--budget", "32", *extra, gpu_mib=gpu_mib,
                             snapshots=False)  # fmt: skip
        assert result.returncode == 0, result.stderr
        argv = shlex.split(result.stdout)[3:]
        given = flag(argv, "--max-running-requests") if "--max-running-requests" in argv else None  # None: SGLang's 48
        assert argv.count("--max-running-requests") <= 1 and given == ("48" if extra else running)


@pytest.mark.parametrize(
    "args",
    [["--algo", "mtp"], ["--algo", "ddtree", "--budget", "8", "--tp", "2", "--mem-fraction-static", "0.9"]],
    ids=["mtp-4-tokens", "ddtree-budget-8-tp2"],
)
def test_narrow_verifies_keep_sglangs_running_requests(hybrid, tmp_path, args):
    """MTP verifies 4 tokens (SGLang sizes its running requests itself); 9 nodes at TP=2 fit 48 requests."""
    result = big_dry_run(hybrid, tmp_path, *args)
    assert result.returncode == 0, result.stderr
    assert "--max-running-requests" not in shlex.split(result.stdout)


def test_running_requests_whose_node_states_cannot_fit_are_refused_with_both_numbers(hybrid, tmp_path):
    result = big_dry_run(hybrid, tmp_path, "--algo", "ddtree", "--budget", "32", "--max-running-requests", "48")
    assert_one_line_error(result, "--budget 32 (33 verify tokens) with 48 running requests needs 231.8 GiB",
                          "146.8 MiB per token and request", "about 65.2 GiB of the GPU's 140.4 GiB is left",
                          "54.1 GiB of weights", "at most 5 fit")  # fmt: skip


@pytest.mark.parametrize("flag", ["--max-running-requests", "--mem-fraction-static", "--mamba-track-interval"])
def test_malformed_numbers_the_hybrid_checks_read_are_one_line(hybrid, tmp_path, flag):
    result = big_dry_run(hybrid, tmp_path, "--algo", "ddtree", flag, "lots")
    assert_one_line_error(result, f"{flag} must be", "got 'lots'")


def test_a_gpu_too_small_for_one_request_is_refused(hybrid, tmp_path):
    result = big_dry_run(hybrid, tmp_path, "--algo", "ddtree", "--budget", "32", gpu_mib=81559)  # an 80 GB GPU
    assert_one_line_error(result, "with 1 running requests needs", "at most 0 fit")


def test_drafter_saved_in_another_dtype_is_loaded_in_the_targets(hybrid, tmp_path):
    """``--dtype auto`` would load a float32 drafter in float16 beside a bfloat16 target."""
    with open(os.path.join(hybrid["big_drafter"], "config.json")) as f:
        config = {**json.load(f), "dtype": "float32"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    for algo in ("dflash", "ddtree"):
        argv = dry_run_argv("--algo", algo, "--model-path", hybrid["big"], "--draft-model-path", str(tmp_path))
        assert flag(argv, "--dtype") == "bfloat16"
        argv = dry_run_argv("--algo", algo, "--model-path", hybrid["big"], "--draft-model-path", str(tmp_path),
                            "--dtype", "bfloat16")  # fmt: skip
        assert argv.count("--dtype") == 1  # the user's own, passed through
