"""``python -m sglang_ddtree.training.train_drafter``: a drafter trained by self-distillation is served by SGLang as is,
and it predicts its target: served acceptance rises well above an untrained drafter's.

The tiny random target (6 layers, 64-token vocabulary) answers greedily in repetitive patterns that a
one-layer drafter learns in a couple hundred CPU steps; if the trainer's conventions (context strictly before
the anchor, feature of layer i = its output, block position k predicts the token k after the anchor, mask
token, weight names) differed from what SGLang serves, the served acceptance would stay at the untrained level.
"""

import json
import math
import os
import random
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from sglang_ddtree.training.train_drafter import (DistilledAnswer, TrainDrafterError, TrainingPrompt, encode_prompts,
                                         learning_rate_scale, load_prompts, repeat_answers, split_by_prompt,
                                         self_distill_hf, training_progress)
from support import CPU_ENGINE_ARGS, run_engine_generate
from tiny_models import EOS_TOKEN_ID, MASK_TOKEN_ID, TinyShape, make_dflash_drafter, make_qwen3_target

# One worker runs this module, so the drafter is trained once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("train_drafter")]  # one worker trains the module's drafter

TARGET_LAYERS = 6
VOCAB = 64
BLOCK = 4


def chat_prompts(rng: random.Random, count: int) -> list[str]:
    return [" ".join(f"t{rng.randint(4, VOCAB - 1)}" for _ in range(rng.randint(2, 12))) for _ in range(count)]


def train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sglang_ddtree.training.train_drafter", *args],
                          capture_output=True, text=True, timeout=600)  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("train_drafter")
    # At a random init's attention scale (not the sharper default, tiny_models.ATTENTION_QK_NORM_GAIN): continuations
    # repetitive enough for 200 CPU steps, which the acceptance bars below are set for.
    target = make_qwen3_target(str(root / "target"), TinyShape(num_layers=TARGET_LAYERS, vocab_size=VOCAB),
                               qk_norm_gain=1.0)  # fmt: skip
    (root / "prompts.txt").write_text("\n".join(chat_prompts(random.Random(0), 96)) + "\n")
    out = str(root / "drafter")
    result = train("--target", target, "--out", out, "--prompts", str(root / "prompts.txt"), "--max-new-tokens", "48",
                   "--sampled-fraction", "0", "--answers-out", str(root / "answers.jsonl"), "--block-size", str(BLOCK),
                   "--num-features", "2", "--steps", "200", "--batch-size", "8", "--anchors", "16", "--lr", "2e-3")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    with open(os.path.join(out, "training.json")) as f:
        report = json.load(f)
    return {"root": root, "target": target, "drafter": out, "report": report}


def read_answers(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_training_lowers_the_block_loss_and_predicts_held_out_answers(trained):
    report = trained["report"]
    first, last = report["first_losses"], report["last_losses"]
    assert sum(last) / len(last) < sum(first) / len(first) - 1.0
    assert len(report["held_out_top1_by_position"]) == BLOCK - 1
    assert report["held_out_greedy_tau"]["dflash"] > 1.5 and report["held_out_greedy_verifies"] > 0
    assert set(report["held_out_greedy_tau"]) == {"dflash", "ddtree B=16", "ddtree B=32", "ddtree B=64"}


def test_checkpoint_is_in_the_upstream_dflash_format(trained, tmp_path):
    with open(os.path.join(trained["drafter"], "config.json")) as f:
        config = json.load(f)
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["block_size"] == BLOCK and config["num_target_layers"] == TARGET_LAYERS
    # Two features, upstream's choice for 6 layers: evenly from layer 1 to layer L-3.
    assert config["dflash_config"] == {"mask_token": "<|MASK|>", "mask_token_id": MASK_TOKEN_ID, "target_layer_ids": [1, 3]}
    reference = make_dflash_drafter(str(tmp_path / "reference"), target_num_layers=TARGET_LAYERS,
                                    shape=TinyShape(num_layers=1, vocab_size=VOCAB), target_layer_ids=[1, 3])  # fmt: skip

    def weights(folder):
        with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}

    assert weights(trained["drafter"]) == weights(reference)


@pytest.fixture(scope="module")
def served(trained):
    """DFLASH on SGLang's CPU engine (float32) with the trained and an untrained drafter: 6 greedy requests of 16
    tokens (served accept lengths 2.23 and 1.07 on 2026-12-02)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trained["target"])
    prompts = [
        tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=False), add_special_tokens=False)["input_ids"]
        for text in chat_prompts(random.Random(7), 6)
    ]  # fmt: skip
    untrained = make_dflash_drafter(str(trained["root"] / "untrained"), target_num_layers=TARGET_LAYERS, block_size=BLOCK,
                                    shape=TinyShape(num_layers=1, vocab_size=VOCAB), target_layer_ids=[1, 3])  # fmt: skip
    engine = {**CPU_ENGINE_ARGS, "model_path": trained["target"], "attention_backend": "triton", "dtype": "float32",
              "disable_radix_cache": True}  # fmt: skip
    greedy = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}

    def dflash(drafter: str) -> dict:
        return run_engine_generate({**engine, "speculative_algorithm": "DFLASH", "speculative_draft_model_path": drafter},
                                   prompts, greedy)["sequential"]  # fmt: skip

    return {"prompts": prompts, "trained": dflash(trained["drafter"]), "untrained": dflash(untrained)}


def accept_length(run: dict) -> float:
    return sum(m["completion_tokens"] for m in run["meta_info"]) / sum(m["spec_verify_ct"] for m in run["meta_info"])


def test_sglang_serves_the_trained_drafter_losslessly_with_higher_acceptance(served):
    # Lossless either way (DFLASH == AR is tests/test_engine_cpu.py's test): the drafter changes only the speed.
    assert served["trained"]["output_ids"] == served["untrained"]["output_ids"]
    trained_length, untrained_length = accept_length(served["trained"]), accept_length(served["untrained"])
    assert trained_length > 1.6 and trained_length > untrained_length + 0.5, (trained_length, untrained_length)


def test_the_trainers_replay_of_greedy_decoding_takes_the_servers_verify_steps(trained, served):
    """``drafter_acceptance`` replays DFLASH along the served outputs with the trainer's own drafter and target
    code: every request takes exactly the verify steps SGLang's CPU engine took (float32: no near-ties), so
    the held-out tau in ``training.json`` is what the server would report."""
    import torch
    from transformers import AutoModelForCausalLM

    from sglang_ddtree.training.drafter_acceptance import greedy_acceptance
    from sglang_ddtree.training.drafter_model import DFlashDrafter, DrafterShape
    from sglang_ddtree.training.train_drafter import load_drafter

    target = AutoModelForCausalLM.from_pretrained(trained["target"], dtype=torch.float32).eval()
    with open(os.path.join(trained["target"], "config.json")) as f:
        drafter = DFlashDrafter(DrafterShape.for_target(json.load(f), num_layers=1, num_features=2, block_size=BLOCK))
    load_drafter(drafter, trained["drafter"])
    run = served["trained"]
    replayed = [greedy_acceptance(drafter, target, [(prompt + output, len(prompt))], MASK_TOKEN_ID)["dflash"]
                for prompt, output in zip(served["prompts"], run["output_ids"])]  # fmt: skip
    assert [len(steps) for steps in replayed] == [m["spec_verify_ct"] for m in run["meta_info"]]


def test_an_sglang_engine_writes_the_same_greedy_answers_as_transformers(trained, tmp_path):
    """``--generator sglang`` (the fast path on a GPU) distills the same data: the target's own greedy answers,
    here the first 16 tokens of what transformers wrote (float32 on both sides). The engine's target stops at a
    token its first answer reaches at position 3 (its config's EOS moved there: the tiny target's own EOS comes
    later than 16 tokens in these answers), and with ``--ignore-eos`` every answer still runs all 16."""
    by_prompt = {tuple(a["ids"][: a["answer_start"]]): a["ids"] for a in read_answers(trained["root"] / "answers.jsonl")}
    tokenizer = AutoTokenizer.from_pretrained(trained["target"])
    first_prompt = encode_prompts(tokenizer, load_prompts(str(trained["root"] / "prompts.txt"))[:1])[0]
    stop_token = by_prompt[tuple(first_prompt)][len(first_prompt) + 3]
    target = tmp_path / "target"
    shutil.copytree(trained["target"], target)
    for name in ("config.json", "generation_config.json"):
        config = json.loads((target / name).read_text())
        (target / name).write_text(json.dumps({**config, "eos_token_id": stop_token}))
    engine_args = json.dumps({**CPU_ENGINE_ARGS, "attention_backend": "triton"})
    result = train("--target", str(target), "--out", str(tmp_path / "drafter"),
                   "--prompts", str(trained["root"] / "prompts.txt"), "--max-prompts", "4", "--max-new-tokens", "16",
                   "--sampled-fraction", "0", "--generator", "sglang", "--sglang-engine-args", engine_args,
                   "--answers-out", str(tmp_path / "answers.jsonl"), "--block-size", str(BLOCK), "--num-features", "2",
                   "--steps", "1", "--ignore-eos")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    by_sglang = read_answers(tmp_path / "answers.jsonl")
    [stopping] = [a["ids"] for a in by_sglang if a["ids"][: a["answer_start"]] == first_prompt]
    assert len(by_sglang) == 4 and stop_token in stopping[len(first_prompt) : len(first_prompt) + 4]  # at 3 or before
    for answer in by_sglang:
        assert len(answer["ids"]) - answer["answer_start"] == 16  # past the stop token: the first answer has it at 3
        by_transformers = by_prompt[tuple(answer["ids"][: answer["answer_start"]])]
        shared = min(len(by_transformers), len(answer["ids"]))  # transformers' answers stopped at their EOS
        assert by_transformers[:shared] == answer["ids"][:shared]


def test_answers_that_ignore_eos_run_past_it_to_their_length(tmp_path):
    """``--ignore-eos`` distills what a server's ``ignore_eos`` requests produce (benchmarks, the GPU suites' tiny
    targets, whose random heads emit their EOS about once in 64 tokens): each answer runs its whole length with its
    end-of-sequence tokens inside, and up to the first of them it is the answer that stopped there."""
    target = make_qwen3_target(str(tmp_path), TinyShape(num_layers=TARGET_LAYERS, vocab_size=VOCAB), qk_norm_gain=1.0)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(target)
    rng = random.Random(0)
    prompts = [[rng.randint(4, VOCAB - 1) for _ in range(rng.randint(2, 12))] for _ in range(96)]
    greedy = [False] * len(prompts)
    stopping = self_distill_hf(model, tokenizer, prompts, greedy, max_new_tokens=48, batch_size=32)
    ignoring = self_distill_hf(model, tokenizer, prompts, greedy, max_new_tokens=48, batch_size=32, ignore_eos=True)
    stopped = [i for i, a in enumerate(stopping) if len(a.ids) - a.answer_start < 48]
    assert stopped and all(stopping[i].ids[-1] == EOS_TOKEN_ID for i in stopped)  # the case exists
    for before, after in zip(stopping, ignoring):
        assert len(after.ids) - after.answer_start == 48
        assert after.ids[: len(before.ids)] == before.ids
    assert all(EOS_TOKEN_ID in ignoring[i].ids[ignoring[i].answer_start : -1] for i in stopped)


def test_training_continues_from_a_drafter_and_from_kept_answers(trained, tmp_path):
    """``--init-from`` loads every weight (with a zero learning rate the drafter comes back unchanged) and
    ``--answers-in`` trains on the answers ``--answers-out`` kept, without generating."""
    out = tmp_path / "continued"
    result = train("--target", trained["target"], "--out", str(out), "--answers-in", str(trained["root"] / "answers.jsonl"),
                   "--init-from", trained["drafter"], "--block-size", str(BLOCK), "--num-features", "2",
                   "--steps", "2", "--lr", "0")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    with safe_open(os.path.join(trained["drafter"], "model.safetensors"), "pt") as before, \
            safe_open(str(out / "model.safetensors"), "pt") as after:  # fmt: skip
        assert sorted(before.keys()) == sorted(after.keys())
        assert all(before.get_tensor(name).equal(after.get_tensor(name)) for name in before.keys())
    assert json.loads((out / "training.json").read_text())["held_out_greedy_tau"]["dflash"] > 1.5


def test_soft_labels_train_on_the_same_answers_and_are_recorded(trained, tmp_path):
    """``--soft-label-weight``: half of the block loss is KL to the target's distribution; the run lowers it on
    the answers the hard-label run kept, and ``training.json`` says how the drafter was trained."""
    out = tmp_path / "soft"
    result = train("--target", trained["target"], "--out", str(out), "--answers-in", str(trained["root"] / "answers.jsonl"),
                   "--block-size", str(BLOCK), "--num-features", "2", "--steps", "60", "--batch-size", "8",
                   "--anchors", "16", "--lr", "2e-3", "--soft-label-weight", "0.5", "--soft-label-top-k", "16")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "training.json").read_text())
    assert sum(report["last_losses"]) < sum(report["first_losses"])
    assert (report["args"]["soft_label_weight"], report["args"]["soft_label_top_k"]) == (0.5, 16)
    assert report["held_out_greedy_tau"]["dflash"] > 1.5  # as the hard-label run's floor (1.71 seen in 60 steps)


def test_a_time_budget_compresses_the_schedule_instead_of_cutting_it_short():
    assert training_progress(50, 100, elapsed_s=10.0, budget_s=0.0) == 0.5  # no budget: by steps
    assert training_progress(50, 100, elapsed_s=90.0, budget_s=100.0) == 0.9  # the clock runs out first
    assert training_progress(99, 100, elapsed_s=500.0, budget_s=100.0) == 1.0
    assert training_progress(50, 0, elapsed_s=25.0, budget_s=100.0) == 0.25  # --steps 0: the budget alone
    assert learning_rate_scale(0.02, warmup_fraction=0.04) == pytest.approx(0.5 * 0.525 * (1 + math.cos(0.02 * math.pi)))
    assert learning_rate_scale(0.5, warmup_fraction=0.04) == pytest.approx(0.5)
    assert learning_rate_scale(1.0, warmup_fraction=0.04) == pytest.approx(0.0, abs=1e-12)


def test_the_held_out_split_keeps_every_answer_to_a_prompt_on_one_side():
    """More answer files for the same pool (more samples) must not leak held-out prompts into training."""
    first_file = [DistilledAnswer(ids=[p, p, 9, i], answer_start=2) for i, p in enumerate([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])]
    more_samples = [DistilledAnswer(ids=[p, p, 8, 8], answer_start=2) for p in [10, 1, 5, 2]]
    held_out, training = split_by_prompt(first_file + more_samples, held_out_fraction=0.2)
    assert sorted(a.ids for a in held_out) == [[1, 1, 8, 8], [1, 1, 9, 0], [2, 2, 8, 8], [2, 2, 9, 1]]
    assert len(training) == 10 and not {a.ids[0] for a in training} & {1, 2}
    assert len(split_by_prompt(first_file[:3], held_out_fraction=0.05)[0]) == 1  # at least one prompt


def test_pool_rows_say_whether_the_prompt_goes_through_the_chat_template(trained, tmp_path):
    """Chat rows are encoded as the server's chat path sends them, raw rows (code completion, HumanEval's form)
    as they are; a row with another format is refused by line."""
    from transformers import AutoTokenizer

    pool = tmp_path / "pool.jsonl"
    pool.write_text('{"prompt": "t7 t8"}\n{"prompt": "t7 t8", "format": "raw"}\n{"prompt": "t9", "format": "chat"}\n')
    prompts = load_prompts(str(pool))
    assert prompts == [TrainingPrompt("t7 t8"), TrainingPrompt("t7 t8", chat=False), TrainingPrompt("t9")]
    tokenizer = AutoTokenizer.from_pretrained(trained["target"])
    template_generation_prompt = tokenizer.convert_tokens_to_ids("t5")
    chat, raw, _ = encode_prompts(tokenizer, prompts)
    assert chat == [7, 8, template_generation_prompt]
    assert raw == tokenizer("t7 t8")["input_ids"] and raw[-2:] == [7, 8]
    pool.write_text('{"prompt": "t7"}\n{"prompt": "t8", "format": "markdown"}\n')
    with pytest.raises(TrainDrafterError, match="line 2: 'prompt' must be text and 'format' chat or raw"):
        load_prompts(str(pool))


def test_more_answers_per_prompt_are_samples():
    prompt_ids, sampled = repeat_answers([[1], [2]], [False, True], answers_per_prompt=3)
    assert prompt_ids == [[1], [2], [1], [2], [1], [2]]
    assert sampled == [False, True, True, True, True, True]
    assert repeat_answers([[1]], [False], answers_per_prompt=1) == ([[1]], [False])


def test_bad_arguments_fail_with_one_line(tmp_path):
    result = train("--target", str(tmp_path), "--out", str(tmp_path / "out"), "--prompts", "p.txt")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"python -m sglang_ddtree.training.train_drafter: error: --target '{tmp_path}' is not a model folder "
        "(no config.json)"
    ]
    result = train("--target", str(tmp_path), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "python -m sglang_ddtree.training.train_drafter: error: give exactly one of --prompts and --answers-in"
    ]
    result = train("--target", str(tmp_path), "--out", str(tmp_path / "out"), "--prompts", "p.txt", "--init-from",
                   str(tmp_path))  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"python -m sglang_ddtree.training.train_drafter: error: --init-from '{tmp_path}' is not a drafter folder "
        "(config.json and model.safetensors)"
    ]
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 4}))
    result = train("--target", str(tmp_path), "--out", str(tmp_path / "out"), "--prompts", "p.txt",
                   "--num-features", "2")  # fmt: skip
    assert result.returncode == 2  # before any answer is generated: both features would be layer 1
    assert result.stderr.strip().splitlines() == [
        "python -m sglang_ddtree.training.train_drafter: error: --num-features 2: 2 target features need a target "
        "of at least 5 layers (one each from layers 1 to L-3), got 4"
    ]


def test_drafters_are_compared_on_benchmark_prompts_without_a_server(trained, tmp_path):
    """``python -m bench.drafter_replay``: the target answers HumanEval prompts (or the prompts the training held
    out) greedily and every drafter's DFLASH and DDTree tau along the same answers is reported; in distribution
    the trained drafter is well ahead of an untrained one."""
    untrained = make_dflash_drafter(str(tmp_path / "untrained"), target_num_layers=TARGET_LAYERS, block_size=BLOCK,
                                    shape=TinyShape(num_layers=1, vocab_size=VOCAB), target_layer_ids=[1, 3])  # fmt: skip
    out = tmp_path / "replay"
    result = subprocess.run([sys.executable, "-m", "bench.drafter_replay", "--target", trained["target"],
                             "--drafter", trained["drafter"], "--drafter", untrained, "--datasets", "humaneval",
                             "--num-prompts", "3", "--max-new-tokens", "24", "--budgets", "8,16", "--out", str(out)],
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(out.with_suffix(".json").read_text())["results"]
    assert [(r["drafter"], r["dataset"], r["paths"]) for r in rows] == [
        (trained["drafter"], "humaneval", 3), (untrained, "humaneval", 3)]
    assert all(set(row["tau"]) == {"dflash", "ddtree B=8", "ddtree B=16"} for row in rows)
    assert rows[0]["greedy_tokens"] == rows[1]["greedy_tokens"] > 0  # both drafters replayed along the same answers
    assert "| ddtree B=8 tau | ddtree B=16 tau |" in out.with_suffix(".md").read_text()
    # In distribution: the prompts the training held out (its split of the kept answers).
    result = subprocess.run([sys.executable, "-m", "bench.drafter_replay", "--target", trained["target"],
                             "--drafter", trained["drafter"], "--drafter", untrained,
                             "--held-out-of", str(trained["root"] / "answers.jsonl"), "--max-new-tokens", "24",
                             "--budgets", "8", "--out", str(out)],
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    trained_row, untrained_row = json.loads(out.with_suffix(".json").read_text())["results"]
    assert trained_row["dataset"] == "held-out" and trained_row["paths"] == trained["report"]["held_out_answers"]
    assert trained_row["tau"]["dflash"] > max(1.5, untrained_row["tau"]["dflash"] + 0.3), (trained_row, untrained_row)
