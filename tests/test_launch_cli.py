"""``python -m sglang_ddtree.launch``: argument resolution (``--dry-run``) and its one-line errors."""

import json
import os
import shlex
import subprocess
import sys

import pytest

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
    result = launch(*args, "--dry-run")
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout.strip())
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


def test_ddtree_budget_defaults_to_32(models):
    argv = dry_run_argv("--algo", "ddtree", "--model-path", models["target"], "--draft-model-path", models["drafter"])
    assert flag(argv, "--speculative-num-draft-tokens") == "33"


def test_unknown_flags_pass_through_unchanged_and_last(models):
    extra = ["--attention-backend", "triton", "--mem-fraction-static", "0.5", "--some-future-flag=x"]
    argv = dry_run_argv("--algo", "ar", "--model-path", models["target"], *extra, "--tp", "2", "--host", "0.0.0.0")
    assert argv[-len(extra) :] == extra
    assert flag(argv, "--tp-size") == "2"
    assert flag(argv, "--host") == "0.0.0.0"


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
