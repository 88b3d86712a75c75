#!/usr/bin/env bash
# The SmolLM2-135M-Instruct demo pair on the H200 machine (no network there). From the repository root:
#   SGLANG_DDTREE_DEMO_GGUF=PIECE,PIECE,... bash tests/gpu/run_demo_pair.sh train [train_drafter arguments ...]
#       build SmolLM2 from the GGUF pieces, self-distill the prompt pool (.gpu/pool.jsonl, made by
#       python -m sglang_ddtree.training.prompt_pool) with an SGLang engine, or take ANSWERS (kept --answers-out
#       files, space-separated), and train the drafter for TRAIN_MINUTES (default 4), from INIT_FROM when set (a drafter to
#       continue) -> $OUT/demo_drafter, training log $OUT/train.log
#   bash tests/gpu/run_demo_pair.sh bench [python -m bench.side_by_side arguments ...]
#       the side-by-side benchmark on SmolLM2 with DRAFTER (default: the drafter trained by `train` on this
#       machine), prompts from the wheels in .gpu/benchwheels, report in /tmp/demo_pair_side_by_side (add
#       --resume to continue a sweep cut by the call's time limit) -> $OUT/side_by_side.tgz (one file: the
#       machine returns at most 8), log $OUT/bench.log
#   bash tests/gpu/run_demo_pair.sh profile [python -m bench.step_profile arguments ...]
#       where the step's wall time goes (host and GPU) for AR, DFLASH and DDTree on SmolLM2 with DRAFTER (default:
#       the shipped drafter), report and server logs -> $OUT/step_profile.tgz (the traces stay on the machine), log $OUT/profile.log
#   bash tests/gpu/run_demo_pair.sh client [python -m bench.sglang_client arguments ...]
#       SGLang's own serving client against AR and DDTree on SmolLM2 with DRAFTER (default: the shipped drafter),
#       report and server logs -> $OUT/sglang_client.tgz, log $OUT/client.log. Pass the server flags after `--`,
#       at least `--attention-backend flashinfer` (SGLang's default on Hopper is FA3, which the wheelhouse drops).
# Setup as tests/gpu/run_suite.sh (tests/gpu/env.sh); the JIT cache is re-packed into $OUT at the end. Each phase
# runs under GPU_RUN_DEADLINE_S (default 570: env.sh's `left`), so a phase cut by it still returns what it wrote
# (bench: every finished configuration; `--resume` on the warm machine continues).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/demo_pair_out}
source tests/gpu/env.sh || exit 1
export SGLANG_DDTREE_CACHE_DIR=/tmp/sglang_ddtree_cache
TARGET=$(python3 -c "from sglang_ddtree.demo_model import ensure_demo_model; print(ensure_demo_model())") || exit 1
echo "setup and target: $(( $(date +%s) - T0 ))s ($TARGET)" | tee -a "$OUT/demo_pair.log"
phase=${1:-}
shift || true
case "$phase" in
  train)
    data=(--prompts .gpu/pool.jsonl)
    if [ -n "${ANSWERS:-}" ]; then read -ra answer_files <<< "$ANSWERS"; data=(--answers-in "${answer_files[@]}"); fi
    [ -n "${INIT_FROM:-}" ] && data+=(--init-from "$INIT_FROM")
    timeout "$(left)" python3 -m sglang_ddtree.training.train_drafter --target "$TARGET" --out "$OUT/demo_drafter" "${data[@]}" \
      --generator sglang --sglang-engine-args '{"mem_fraction_static": 0.5, "sampling_backend": "pytorch", "attention_backend": "flashinfer"}' \
      --answers-out /tmp/demo_answers.jsonl --num-layers 2 --num-features 3 --block-size 16 --max-new-tokens 256 \
      --batch-size 16 --anchors 32 --lr 1e-3 --steps 0 --time-budget-minutes "${TRAIN_MINUTES:-4}" "$@" 2>&1 \
      | tee "$OUT/train.log"
    rc=${PIPESTATUS[0]}
    rm -rf /tmp/demo_drafter && cp -r "$OUT/demo_drafter" /tmp/demo_drafter
    ;;
  bench)
    timeout "$(left)" python3 -m bench.side_by_side --model-path "$TARGET" --draft-model-path "${DRAFTER:-/tmp/demo_drafter}" \
      --wheel-dir .gpu/benchwheels --out /tmp/demo_pair_side_by_side "$@" 2>&1 | tee "$OUT/bench.log"
    rc=${PIPESTATUS[0]}
    tar -czf "$OUT/side_by_side.tgz" -C /tmp demo_pair_side_by_side
    ;;
  profile)
    timeout "$(left)" python3 -m bench.step_profile --model-path "$TARGET" --draft-model-path "${DRAFTER:-$SITE/sglang_ddtree/demo_drafter}" \
      --wheel-dir .gpu/benchwheels --out /tmp/demo_pair_step_profile "$@" 2>&1 | tee "$OUT/profile.log"
    rc=${PIPESTATUS[0]}
    tar -czf "$OUT/step_profile.tgz" --exclude=traces -C /tmp demo_pair_step_profile  # traces: too big to return
    ;;
  client)
    timeout "$(left)" python3 -m bench.sglang_client --model-path "$TARGET" --draft-model-path "${DRAFTER:-$SITE/sglang_ddtree/demo_drafter}" \
      --out /tmp/demo_pair_sglang_client "$@" 2>&1 | tee "$OUT/client.log"
    rc=${PIPESTATUS[0]}
    tar -czf "$OUT/sglang_client.tgz" -C /tmp demo_pair_sglang_client
    ;;
  *)
    echo "usage: bash tests/gpu/run_demo_pair.sh {train|bench|profile|client} [arguments]" >&2
    exit 2
    ;;
esac
pack_jit_cache "$OUT"
echo "$phase exit $rc after $(( $(date +%s) - T0 ))s" | tee -a "$OUT/demo_pair.log"
exit "$rc"
