"""``python -m sglang_ddtree.training.train_drafter``: train a DFlash drafter for a target by self-distillation.

    python -m sglang_ddtree.training.train_drafter --target PATH --out DIR (--prompts FILE | --answers-in FILE...) \
        [--generator {hf,sglang}] [--steps N] [--time-budget-minutes M] [--init-from DRAFTER] ...

1. Data: the target answers a pool of training prompts (chat prompts through its chat template when it has
   one, raw completion prompts as they are), greedily and by sampling (``--answers-per-prompt``: more samples
   of each prompt in one run); the drafter learns its own continuations. ``--generator sglang`` writes the
   answers with an offline SGLang engine (the fast path on a GPU; transformers' generate is the default and
   needs no engine). ``--answers-out`` keeps the answers, ``--answers-in`` trains on kept ones (several
   files, e.g. more samples of the same pool: the held-out split is by prompt).
2. Training (DFlash recipe, anchors.md §2): frozen target; its hidden states after ``--num-features`` layers
   (upstream's layer choice) are the drafter's context; random anchors in the answers; blocks of
   ``--block-size`` = anchor + mask tokens; block-wise cross-entropy with weights ``exp(-(k-1)/gamma)``
   whose labels are the target's own top-1 next tokens (the same pass: exact also inside sampled answers),
   mixed with ``--soft-label-weight`` of a KL divergence to the target's whole next-token distribution (at
   ``--soft-label-temperature``, over its ``--soft-label-top-k`` tokens when that is set): a tree verifies the
   drafter's whole top-K at every depth, which hard top-1 labels do not calibrate;
   AdamW, warm-up then cosine decay (fitted to ``--time-budget-minutes`` when that ends training first),
   gradient clipping; the target's embedding and LM head are shared. ``--init-from`` continues a drafter.
3. Output: ``DIR`` in the upstream ``DFlashDraftModel`` format, with the mask token resolved for the
   target's tokenizer, plus ``training.json``: losses, held-out per-position agreement with the target, and
   the held-out greedy tau of DFLASH and of DDTree at ``--eval-budgets`` (``drafter_acceptance``: decoding
   replayed along the held-out answers' greedy paths, what a T = 0 server reports).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sglang_ddtree.cli import OneLineArgumentParser, int_list
from sglang_ddtree.training.drafter_acceptance import greedy_acceptance, tau
from sglang_ddtree.training.drafter_model import (DFlashDrafter, DrafterShape, block_logits, target_forward,
                                                 target_layer_ids)

UPSTREAM_MASK_TOKEN = "<|MASK|>"
DECAY_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}  # DFlash's loss decay per block size


class TrainDrafterError(ValueError):
    """Bad arguments or inputs; printed as one line."""


@dataclass
class DistilledAnswer:
    """A prompt and the target's own answer to it, as token ids."""

    ids: list[int]
    answer_start: int  # first generated position


def resolve_mask_token(tokenizer, vocab_size: int) -> tuple[str, int]:
    """The mask token the drafter is trained with, and the id SGLang will resolve for it.

    A tokenizer that knows ``<|MASK|>`` (or declares a mask token) keeps it; otherwise the first embedding
    row past the tokenizer (SGLang adds ``<|MASK|>`` to the tokenizer at that id); otherwise the unknown
    token, which chat text does not produce.
    """
    vocab = tokenizer.get_vocab()
    if UPSTREAM_MASK_TOKEN in vocab:
        return UPSTREAM_MASK_TOKEN, int(vocab[UPSTREAM_MASK_TOKEN])
    if tokenizer.mask_token is not None:
        return tokenizer.mask_token, int(tokenizer.mask_token_id)
    if len(tokenizer) < vocab_size:
        return UPSTREAM_MASK_TOKEN, len(tokenizer)
    if tokenizer.unk_token is not None and tokenizer.unk_token_id not in (tokenizer.eos_token_id, tokenizer.bos_token_id):
        return tokenizer.unk_token, int(tokenizer.unk_token_id)
    raise TrainDrafterError("cannot choose a mask token: the tokenizer has no spare or unknown token")


@dataclass(frozen=True)
class TrainingPrompt:
    """A pool prompt and how the server will see it: through the chat template, or as a raw completion
    prompt (HumanEval's form; pool rows with ``"format": "raw"``)."""

    text: str
    chat: bool = True


def load_prompts(path: str) -> list[TrainingPrompt]:
    """One chat prompt per line of a text file, or one row per JSON line of a ``.jsonl`` file (``prompt``,
    and ``format``: ``chat``, the default, or ``raw``)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.rstrip("\n") for line in f if line.strip()]
    except OSError as e:
        raise TrainDrafterError(f"cannot read prompts '{path}': {e.strerror}") from None
    if not path.endswith(".jsonl"):
        return [TrainingPrompt(line) for line in lines]
    prompts = []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
            text, form = row["prompt"], row.get("format", "chat")
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise TrainDrafterError(f"prompts '{path}' line {number}: not a JSON object with 'prompt' ({e})") from None
        if not isinstance(text, str) or form not in ("chat", "raw"):
            raise TrainDrafterError(f"prompts '{path}' line {number}: 'prompt' must be text and 'format' chat or raw")
        prompts.append(TrainingPrompt(text, chat=form == "chat"))
    return prompts


def encode_prompts(tokenizer, prompts: list[TrainingPrompt]) -> list[list[int]]:
    """Prompt token ids as the server would see them: chat prompts through the target's chat template (when
    it has one), raw prompts tokenized as they are (what ``bench.side_by_side`` does for HumanEval)."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    encoded = []
    for prompt in prompts:
        if prompt.chat and has_template:
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}], add_generation_prompt=True,
                                                 tokenize=False)  # fmt: skip
            encoded.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        else:
            encoded.append(tokenizer(prompt.text)["input_ids"])
    return encoded


def choose_sampled(count: int, sampled_fraction: float, seed: int) -> list[bool]:
    """Which prompts are answered by temperature-1 sampling (the others greedily)."""
    rng = random.Random(seed)
    return [rng.random() < sampled_fraction for _ in range(count)]


def repeat_answers(prompt_ids: list[list[int]], sampled: list[bool],
                   answers_per_prompt: int) -> tuple[list[list[int]], list[bool]]:
    """Every prompt ``answers_per_prompt`` times: its first answer as ``sampled`` says, the others sampled
    (a second greedy answer would repeat the first)."""
    extra = answers_per_prompt - 1
    return prompt_ids + prompt_ids * extra, sampled + [True] * (len(prompt_ids) * extra)


def cut_at_eos(generated: list[int], eos_token_id: int | None) -> list[int]:
    """The answer up to and including its end-of-sequence token."""
    if eos_token_id is not None and eos_token_id in generated:
        return generated[: generated.index(eos_token_id) + 1]
    return generated


@torch.no_grad()
def self_distill_hf(model, tokenizer, prompt_ids: list[list[int]], sampled: list[bool], max_new_tokens: int,
                    batch_size: int, ignore_eos: bool = False) -> list[DistilledAnswer]:  # fmt: skip
    """The target's own answers by ``transformers`` generation: needs no engine, slow at scale.

    Greedy and sampled prompts go in separate batches, each batch of similar lengths (left padding costs
    compute, and prompt pools mix one-liners with pages); answers come back in the order of ``prompt_ids``.
    ``ignore_eos``: every answer runs ``max_new_tokens`` past its end-of-sequence tokens, as a server's
    ``ignore_eos`` requests do.
    """
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos_token_id = None if ignore_eos else tokenizer.eos_token_id
    by_length = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    groups = [[i for i in by_length if sampled[i] == mode] for mode in (False, True)]
    batches = [group[start : start + batch_size] for group in groups for start in range(0, len(group), batch_size)]
    answers: dict[int, DistilledAnswer] = {}
    for batch in batches:
        encoded = [prompt_ids[i] for i in batch]
        width = max(len(ids) for ids in encoded)
        input_ids = torch.tensor([[pad_id] * (width - len(ids)) + ids for ids in encoded], device=device)
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded], device=device)
        sample = sampled[batch[0]]
        config = copy.deepcopy(model.generation_config)
        config.update(max_new_tokens=max_new_tokens, do_sample=sample, temperature=1.0 if sample else None,
                      top_p=None, top_k=None, pad_token_id=pad_id)  # fmt: skip
        if ignore_eos:
            config.eos_token_id = None  # the model's own config would stop it there
        out = model.generate(input_ids=input_ids, attention_mask=attention, generation_config=config)
        for index, ids, generated in zip(batch, encoded, out[:, width:].tolist()):
            answers[index] = DistilledAnswer(ids=ids + cut_at_eos(generated, eos_token_id),
                                             answer_start=len(ids))  # fmt: skip
    return [answers[i] for i in range(len(prompt_ids))]


def self_distill_sglang(target: str, prompt_ids: list[list[int]], sampled: list[bool], max_new_tokens: int,
                        eos_token_id: int | None, seed: int, engine_args: dict,
                        ignore_eos: bool = False) -> list[DistilledAnswer]:  # fmt: skip
    """The target's own answers from an offline SGLang engine (continuous batching, CUDA graphs): the fast
    path for real pools and large targets. ``engine_args`` are extra ``sglang.Engine`` arguments. Token ids
    go in and come out, so the engine skips its tokenizer and detokenizer work (the stop token comes from
    the model's config). ``ignore_eos`` as in :func:`self_distill_hf`."""
    import sglang

    engine = sglang.Engine(model_path=target, random_seed=seed,
                           **{"log_level": "error", "skip_tokenizer_init": True, **engine_args})  # fmt: skip
    try:
        params = [{"max_new_tokens": max_new_tokens, "temperature": 1.0 if s else 0.0, "top_p": 1.0, "top_k": -1,
                   "ignore_eos": ignore_eos} for s in sampled]  # fmt: skip
        outputs = engine.generate(input_ids=prompt_ids, sampling_params=params)
    finally:
        engine.shutdown()
    return [DistilledAnswer(ids=ids + cut_at_eos(out["output_ids"], None if ignore_eos else eos_token_id),
                            answer_start=len(ids))
            for ids, out in zip(prompt_ids, outputs)]  # fmt: skip


def write_answers(path: str, answers: list[DistilledAnswer]) -> None:
    """The distilled data as JSON lines (``ids``, ``answer_start``), in prompt order, for inspection or reuse."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        for answer in answers:
            f.write(json.dumps({"ids": answer.ids, "answer_start": answer.answer_start}) + "\n")


def read_answers(path: str) -> list[DistilledAnswer]:
    """Distilled data written by ``--answers-out`` (the order, and so the held-out split, is kept)."""
    try:
        with open(path) as f:
            return [DistilledAnswer(**json.loads(line)) for line in f if line.strip()]
    except OSError as e:
        raise TrainDrafterError(f"cannot read answers '{path}': {e.strerror}") from None
    except (json.JSONDecodeError, TypeError) as e:
        raise TrainDrafterError(f"answers '{path}': every line must be {{\"ids\": [...], \"answer_start\": N}} ({e})") from None


def split_by_prompt(answers: list[DistilledAnswer], held_out_fraction: float) -> tuple[list, list]:
    """Held-out and training answers. The first ``held_out_fraction`` of the distinct prompts (at least one),
    in order of first appearance, are held out with every answer to them: several answer files for the same
    pool (e.g. more samples) never put a held-out prompt into training."""
    prompts = list(dict.fromkeys(tuple(a.ids[: a.answer_start]) for a in answers))
    held_out = set(prompts[: max(1, int(len(prompts) * held_out_fraction))])
    evaluation = [a for a in answers if tuple(a.ids[: a.answer_start]) in held_out]
    return evaluation, [a for a in answers if tuple(a.ids[: a.answer_start]) not in held_out]


def load_drafter(drafter: DFlashDrafter, folder: str) -> None:
    """Continue from a drafter in the upstream format, which must have the shape being trained."""
    from safetensors.torch import load_file

    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    shape = drafter.shape
    expected = {"hidden_size": shape.hidden_size, "num_hidden_layers": shape.num_layers,
                "block_size": shape.block_size, "target_layer_ids": list(shape.target_layer_ids)}  # fmt: skip
    found = {**{field: config.get(field) for field in expected},
             "target_layer_ids": config.get("dflash_config", {}).get("target_layer_ids")}  # fmt: skip
    for field, value in expected.items():
        if found[field] != value:
            raise TrainDrafterError(f"--init-from '{folder}' has {field}={found[field]}, this training {value}")
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    drafter.load_upstream_state_dict({name: t.to(drafter.fc.weight.dtype) for name, t in tensors.items()})


def make_batch(sequences: list[DistilledAnswer], anchors: int, block: int, pad_id: int, rng: random.Random, device):
    """Right-padded ids ``[S, T]`` and anchor positions ``[S, A]`` inside the answers."""
    width = max(len(s.ids) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    anchor_pos = torch.zeros((len(sequences), anchors), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq.ids)] = torch.tensor(seq.ids)
        # Anchors are answer tokens (the first one is the token the prefill produces), with the whole block
        # inside the sequence; the caller keeps only answers longer than a block.
        first, last = seq.answer_start, len(seq.ids) - block
        anchor_pos[row] = torch.tensor([rng.randint(first, last) for _ in range(anchors)])
    return ids.to(device), anchor_pos.to(device)


@dataclass(frozen=True)
class SoftLabels:
    """How much of the block loss is distillation against the target's distribution, and its form."""

    weight: float = 0.0  # 0: the target's top-1 labels only; 1: its distribution only
    temperature: float = 1.0
    top_k: int = 0  # 0: the whole vocabulary; else the target's top-k tokens, renormalised


def soft_label_loss(logits: torch.Tensor, teacher_logits: torch.Tensor, soft: SoftLabels) -> torch.Tensor:
    """Per-position KL(target || drafter) at ``soft.temperature``, times its square (Hinton et al.: the
    gradient keeps the scale of the hard loss's as the temperature changes). With ``soft.top_k`` the target's
    distribution is renormalised over its top-k tokens and compared with the drafter's probabilities of those
    tokens (the full ``[.., V]`` teacher softmax costs 4 bytes per vocabulary entry per position: 248k for
    Qwen3.6)."""
    t = soft.temperature
    drafter_log_probs = F.log_softmax(logits.float() / t, dim=-1)
    if soft.top_k:
        top_logits, top_ids = teacher_logits.float().topk(min(soft.top_k, teacher_logits.shape[-1]), dim=-1)
        target_log_probs = F.log_softmax(top_logits / t, dim=-1)
        drafter_log_probs = drafter_log_probs.gather(-1, top_ids)
    else:
        target_log_probs = F.log_softmax(teacher_logits.float() / t, dim=-1)
    return (target_log_probs.exp() * (target_log_probs - drafter_log_probs)).sum(-1) * (t * t)


def block_loss(drafter: DFlashDrafter, model, ids: torch.Tensor, anchor_pos: torch.Tensor, mask_token_id: int,
               gamma: float, soft: SoftLabels = SoftLabels()) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Weighted block loss and per-position hits ``[B-1]`` (the drafter's top-1 is the target's).

    The hard label of each position is the target's own top-1 next token after the answer's prefix: for a
    greedy answer that is the answer's next token; for a sampled answer the sampled token is one draw from the
    target's distribution (a noisy label for what greedy verification accepts), the top-1 is exact, and it
    comes from the same teacher-forced pass that gives the drafter its context. The soft label is that pass's
    whole distribution (``soft_label_loss``), mixed in with ``soft.weight``.
    """
    block = drafter.shape.block_size
    features, target_logits = target_forward(model, ids, drafter.shape.target_layer_ids)
    logits = block_logits(drafter, model, ids, anchor_pos, features, mask_token_id)  # [S, A, B-1, V]
    # Block position k >= 1 predicts the token k after the anchor, which the target predicts one position earlier.
    positions = anchor_pos[..., None] + torch.arange(block - 1, device=ids.device)  # [S, A, B-1]
    labels = torch.gather(target_logits.argmax(-1), 1, positions.flatten(1)).view_as(positions)
    losses = F.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="none").view(labels.shape)
    if soft.weight > 0:
        vocab = target_logits.shape[-1]
        teacher = torch.gather(target_logits, 1, positions.flatten(1)[..., None].expand(-1, -1, vocab))
        soft_losses = soft_label_loss(logits, teacher.view(*positions.shape, vocab), soft)
        losses = (1 - soft.weight) * losses + soft.weight * soft_losses
    weights = torch.exp(-torch.arange(block - 1, device=ids.device, dtype=torch.float32) / gamma)
    loss = (losses * weights).sum() / (weights.sum() * losses.shape[0] * losses.shape[1])
    hits = (logits.argmax(-1) == labels).float().mean(dim=(0, 1))
    return loss, hits


def training_progress(step: int, steps: int, elapsed_s: float, budget_s: float) -> float:
    """How far through training ``step`` is, in [0, 1]: by steps, or by wall-clock time when a time budget
    would end training first (then the schedule compresses to the budget instead of being cut short)."""
    by_time = elapsed_s / budget_s if budget_s else 0.0
    by_steps = step / steps if steps else 0.0
    return min(1.0, max(by_steps, by_time))


def learning_rate_scale(progress: float, warmup_fraction: float) -> float:
    """Linear warm-up over the first ``warmup_fraction`` of training, then cosine decay towards zero."""
    warm = min(1.0, (progress + 1e-3) / warmup_fraction) if warmup_fraction > 0 else 1.0
    return warm * 0.5 * (1.0 + math.cos(math.pi * progress))


def train(args: argparse.Namespace) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    with open(os.path.join(args.target, "config.json")) as f:
        target_config = json.load(f)
    mask_token, mask_token_id = resolve_mask_token(tokenizer, int(target_config["vocab_size"]))

    t0 = time.time()
    rng = random.Random(args.seed)
    if args.answers_in:
        sequences = [answer for path in args.answers_in for answer in read_answers(path)]
    else:
        prompts = load_prompts(args.prompts)
        if args.max_prompts:
            prompts = prompts[: args.max_prompts]
        rng.shuffle(prompts)
        prompt_ids, sampled = repeat_answers(encode_prompts(tokenizer, prompts),
                                             choose_sampled(len(prompts), args.sampled_fraction, args.seed),
                                             args.answers_per_prompt)  # fmt: skip
    if not args.answers_in and args.generator == "sglang":  # before the target is loaded: the engine has its own
        sequences = self_distill_sglang(args.target, prompt_ids, sampled, args.max_new_tokens, tokenizer.eos_token_id,
                                        args.seed, {"dtype": args.dtype, **args.sglang_engine_args},
                                        args.ignore_eos)  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(args.target, torch_dtype=dtype).to(device).eval()
    model.requires_grad_(False)
    if not args.answers_in and args.generator == "hf":
        sequences = self_distill_hf(model, tokenizer, prompt_ids, sampled, args.max_new_tokens, args.generate_batch_size,
                                    args.ignore_eos)  # fmt: skip
    if args.answers_out:
        write_answers(args.answers_out, sequences)
    usable = [s for s in sequences if len(s.ids) > s.answer_start + args.block_size]
    evaluation, training = split_by_prompt(usable, args.held_out_fraction)
    if not training:
        raise TrainDrafterError(f"only {len(usable)} usable answers (longer than a block): add prompts or tokens")
    data_seconds = time.time() - t0
    print(f"self-distillation: {len(training)} training / {len(evaluation)} held-out answers in {data_seconds:.0f}s",
          flush=True)  # fmt: skip

    shape = DrafterShape.for_target(target_config, args.num_layers, args.num_features, args.block_size)
    drafter = DFlashDrafter(shape).to(device)
    if args.init_from:
        load_drafter(drafter, args.init_from)
    else:
        for parameter in drafter.parameters():
            if parameter.dim() > 1:
                torch.nn.init.normal_(parameter, std=0.02)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gamma = DECAY_GAMMA.get(args.block_size, args.block_size / 2.3)
    soft = SoftLabels(args.soft_label_weight, args.soft_label_temperature, args.soft_label_top_k)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    losses = []
    budget_s = args.time_budget_minutes * 60
    t_train = time.time()
    while (not args.steps or len(losses) < args.steps) and not (budget_s and time.time() - t_train >= budget_s):
        step = len(losses)
        progress = training_progress(step, args.steps, time.time() - t_train, budget_s)
        for group in optimizer.param_groups:
            group["lr"] = args.lr * learning_rate_scale(progress, args.warmup_fraction)
        batch = [rng.choice(training) for _ in range(args.batch_size)]
        ids, anchors = make_batch(batch, args.anchors, args.block_size, pad_id, rng, device)
        with autocast:
            loss, _ = block_loss(drafter, model, ids, anchors, mask_token_id, gamma, soft)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.detach())  # read when logged: no host sync per step
        if step % args.log_every == 0:
            print(f"step {step:5d}  loss {losses[-1].item():.4f}  lr {optimizer.param_groups[0]['lr']:.2e}  "
                  f"{time.time() - t_train:.0f}s", flush=True)  # fmt: skip
    losses = [float(loss) for loss in losses]
    train_seconds = time.time() - t_train

    drafter.eval()
    hits = []
    with torch.no_grad(), autocast:
        for start in range(0, len(evaluation), args.batch_size):
            ids, anchors = make_batch(evaluation[start : start + args.batch_size], args.anchors, args.block_size,
                                      pad_id, rng, device)  # fmt: skip
            hits.append(block_loss(drafter, model, ids, anchors, mask_token_id, gamma)[1])
        accepted = greedy_acceptance(drafter, model, [(s.ids, s.answer_start) for s in evaluation], mask_token_id,
                                     args.eval_budgets)  # fmt: skip
    held_out_hits = torch.stack(hits).mean(0).cpu()
    drafter.to(torch.bfloat16).save_pretrained(args.out, target_config, mask_token, mask_token_id)
    report = {
        "target": args.target, "steps": len(losses), "seconds": round(time.time() - t0, 1),
        "data_seconds": round(data_seconds, 1), "train_seconds": round(train_seconds, 1), "training_answers": len(training), "held_out_answers": len(evaluation),
        "mask_token": mask_token, "mask_token_id": mask_token_id, "target_layer_ids": list(shape.target_layer_ids),
        "first_losses": losses[:5], "last_losses": losses[-5:],
        "held_out_top1_by_position": [round(float(h), 4) for h in held_out_hits],
        "held_out_greedy_tau": {name: round(tau(steps), 3) if steps else None for name, steps in accepted.items()},
        "held_out_greedy_verifies": len(accepted["dflash"]),
        "args": vars(args),
    }  # fmt: skip
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump(report, f, indent=1)
    return report


def json_object(text: str) -> dict:
    """argparse type: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineArgumentParser(prog="python -m sglang_ddtree.training.train_drafter",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="target model folder (Hugging Face format)")
    parser.add_argument("--out", required=True, help="output folder for the drafter")
    parser.add_argument("--prompts", help="training prompts: .txt (one per line) or .jsonl ('prompt')")
    parser.add_argument("--answers-in", nargs="+", default=[],
                        help="train on answers written by --answers-out instead of --prompts (several files: all "
                        "their answers; the held-out prompts are the first file's first ones)")  # fmt: skip
    parser.add_argument("--init-from", default="", help="continue training this drafter (upstream format, same shape)")
    parser.add_argument("--max-prompts", type=int, default=0, help="use only the first N prompts (0: all)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="answer length of the self-distillation")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="answers run --max-new-tokens past their end-of-sequence tokens (a drafter for traffic "
                        "served with ignore_eos, e.g. benchmarks and the GPU suites' tiny targets)")  # fmt: skip
    parser.add_argument("--sampled-fraction", type=float, default=0.5, help="share of answers sampled at T=1")
    parser.add_argument("--answers-per-prompt", type=int, default=1,
                        help="answers per prompt: the first as --sampled-fraction says, the others sampled")
    parser.add_argument("--held-out-fraction", type=float, default=0.05)
    parser.add_argument("--eval-budgets", type=int_list, default=[16, 32, 64],
                        help="DDTree budgets whose held-out greedy tau is reported beside DFLASH's")  # fmt: skip
    parser.add_argument("--num-layers", type=int, default=1, help="drafter decoder layers")
    parser.add_argument("--num-features", type=int, default=3, help="target layers feeding the drafter")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps (0: as many as the time budget allows)")
    parser.add_argument("--time-budget-minutes", type=float, default=0.0,
                        help="stop training after this long, with the schedule fitted to it (0: no limit)")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    parser.add_argument("--anchors", type=int, default=32, help="blocks per sequence per step")
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--soft-label-weight", type=float, default=0.0,
                        help="share of the block loss that is KL to the target's distribution (0: top-1 labels only)")
    parser.add_argument("--soft-label-temperature", type=float, default=1.0, help="temperature of that KL")
    parser.add_argument("--soft-label-top-k", type=int, default=0,
                        help="the KL over the target's top-k tokens (0: the whole vocabulary)")
    parser.add_argument("--warmup-fraction", type=float, default=0.04)
    parser.add_argument("--generator", choices=("hf", "sglang"), default="hf",
                        help="who writes the answers: transformers generate (no engine needed) or an offline SGLang "
                        "engine (much faster on a GPU)")  # fmt: skip
    parser.add_argument("--sglang-engine-args", type=json_object, default={},
                        help='extra sglang.Engine arguments as JSON, e.g. \'{"tp_size": 2}\'')
    parser.add_argument("--generate-batch-size", type=int, default=32, help="prompts per transformers generate call")
    parser.add_argument("--answers-out", default="", help="also write the distilled answers here (JSON lines)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16" if torch.cuda.is_available() else "float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=50)
    args = parser.parse_args(argv)
    if bool(args.prompts) == bool(args.answers_in):
        parser.error("give exactly one of --prompts and --answers-in")
    if args.init_from and not all(os.path.isfile(os.path.join(args.init_from, name))
                                  for name in ("config.json", "model.safetensors")):  # fmt: skip
        parser.error(f"--init-from '{args.init_from}' is not a drafter folder (config.json and model.safetensors)")
    if not os.path.isfile(os.path.join(args.target, "config.json")):
        parser.error(f"--target '{args.target}' is not a model folder (no config.json)")
    with open(os.path.join(args.target, "config.json")) as f:
        target_layers = json.load(f).get("num_hidden_layers")
    if isinstance(target_layers, int) and args.num_features >= 1:
        try:  # before the self-distillation, which may take hours
            target_layer_ids(target_layers, args.num_features)
        except ValueError as e:
            parser.error(f"--num-features {args.num_features}: {e}")
    if args.block_size < 2 or args.num_layers < 1 or args.num_features < 1 or args.answers_per_prompt < 1:
        parser.error("--block-size must be >= 2 and --num-layers, --num-features, --answers-per-prompt >= 1")
    if args.steps < 0 or args.time_budget_minutes < 0 or not (args.steps or args.time_budget_minutes):
        parser.error("give --steps >= 1 or --time-budget-minutes > 0 (or both)")
    if not 0 <= args.soft_label_weight <= 1 or args.soft_label_temperature <= 0 or args.soft_label_top_k < 0:
        parser.error("--soft-label-weight must be in [0, 1], --soft-label-temperature > 0, --soft-label-top-k >= 0")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        report = train(args)
    except TrainDrafterError as e:
        print(f"sglang_ddtree.training.train_drafter: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps({k: report[k] for k in ("last_losses", "held_out_greedy_tau")}))


if __name__ == "__main__":
    main()
