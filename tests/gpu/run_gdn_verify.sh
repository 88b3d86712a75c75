#!/usr/bin/env bash
# Issue 17's GPU evidence in one call on the H200 machine (no network there), most needed first, each part cut off
# at the call's deadline so that what finished still comes back. From the repository root:
#   bash tests/gpu/run_gdn_verify.sh [PART ...]     PARTs (default: all, in this order):
#     exact   the GDN tree verify and tree conv at Qwen3.6-27B's shapes against SGLang's (tests/gpu/test_gpu_gdn_tree.py)
#     bench   one GDN layer's verify, conv and commit, ours against SGLang's, TP 1 and TP 2 heads (bench.gdn_tree_kernel)
#     specs   the CPU kernel specifications on CUDA (tests/test_gdn_tree_kernels.py, _conv.py, test_wy_commit_hook.py)
#     served  the hybrid suite's WY servers: greedy, graph replay == eager, prefix-cache hit, and greedy under
#             --budget auto with a verify graph per width
#     sampled the hybrid suite's sampling tests on the WY server (T 1, top-p 0.8; their own part: with the served
#             part's four servers they outran a 400 s call in RESULTS run 85)
#     table   the served step at Qwen3.6-27B's shape side by side: the WY verify, SGLang's snapshots, DFLASH's chain
#             (bench.hybrid_verify_cost with GDN kernel profiles; not in the default list: a call of its own;
#             TABLE_ONLY=NAME,... runs those configurations only, in that order, TABLE_BATCH_SIZES=1,8 at those
#             batch sizes, TABLE_PROFILE=NAME,... with GPU kernel profiles; a carried .gpu/hybrid_verify_cost.json, an
#             earlier call's report on the same kind of card, keeps its configurations)
# Expects .whl/wheelhouse.tar.xz (shared/device/build_wheelhouse.sh --xz); optional .gpu/jitcache_*.txz.
# GPU_RUN_DEADLINE_S (default 570) is the whole call's budget from the start of this script. Writes into $OUT:
# gdn_verify.log (every part's output), bench.tgz (the bench's reports), hvc.tgz (the table's), the suite's gpu_suite.log / .jsonl,
# server_logs.tgz, jitcache_flashinfer.txz and jitcache_triton.txz (a call returns at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gdn_verify_out}
source tests/gpu/env.sh || exit 1
LOG="$OUT/gdn_verify.log"
unset PYTHONSAFEPATH  # it drops the checkout from sys.path: `python3 -m bench.*` is then not found (RESULTS run 66)

part() {  # part NAME MIN_SECONDS COMMAND...: runs COMMAND under the time left, or says why it did not
  local name=$1 needs=$2; shift 2
  local budget; budget=$(left)
  if (( budget < needs )); then
    echo "== $name: not run, ${budget}s left of the ${needs}s it needs" | tee -a "$LOG"
    return 0
  fi
  echo "== $name (up to ${budget}s): $*" | tee -a "$LOG"
  local start; start=$(date +%s)
  timeout "$budget" "$@" >>"$LOG" 2>&1
  echo "== $name: exit $? after $(( $(date +%s) - start ))s" | tee -a "$LOG"
}

echo "setup: $(( $(date +%s) - T0 ))s, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')" | tee "$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$LOG"
parts=("$@")
(( ${#parts[@]} )) || parts=(exact bench specs served sampled)
for name in "${parts[@]}"; do
  [[ " exact bench specs served sampled table " == *" $name "* ]] \
    || { echo "unknown part '$name' (exact, bench, specs, served, sampled, table)" | tee -a "$LOG"; exit 2; }
done
for name in "${parts[@]}"; do
  case "$name" in
    exact) part exact 60 python3 -m pytest -m gpu -p no:cacheprovider -q -rA tests/gpu/test_gpu_gdn_tree.py ;;
    bench)
      for tp in 1 2; do
        part "bench tp$tp" 90 python3 -m bench.gdn_tree_kernel --out "$OUT/bench/tp$tp" --tp "$tp" \
          --batch-sizes 1,8 --widths 16,32,33,65
      done
      [ -d "$OUT/bench" ] && tar -czf "$OUT/bench.tgz" -C "$OUT" bench && rm -r "$OUT/bench" ;;
    specs) part specs 90 python3 -m pytest -p no:cacheprovider -q -rA tests/test_gdn_tree_kernels.py \
             tests/test_gdn_tree_conv.py tests/test_wy_commit_hook.py ;;
    served)
      GPU_SUITE_BACKENDS=flashinfer GPU_SUITE_PREFILL_GRAPHS=0 part served 240 bash tests/gpu/run_suite.sh tests/gpu/test_gpu_hybrid.py \
        -k "flashinfer and not sampled and (ddtree_wy or ddtree_wy_radix or (greedy and ddtree_auto))" ;;
    sampled)
      GPU_SUITE_BACKENDS=flashinfer GPU_SUITE_PREFILL_GRAPHS=0 part sampled 240 bash tests/gpu/run_suite.sh \
        tests/gpu/test_gpu_hybrid.py -k "flashinfer and sampled and ddtree_wy" ;;
    table)
      [ -d /tmp/tiny_models/qwen35 ] || python3 tests/tiny_models.py --out /tmp/tiny_models >>"$LOG" 2>&1
      mkdir -p "$OUT/hvc" && { [ ! -f .gpu/hybrid_verify_cost.json ] || cp .gpu/hybrid_verify_cost.json "$OUT/hvc/"; }
      part table 200 python3 -m bench.hybrid_verify_cost --tokenizer-path /tmp/tiny_models/qwen35 --out "$OUT/hvc" \
        --resume --deadline-s "$(( $(left) - 30 ))" --batch-sizes "${TABLE_BATCH_SIZES:-1,8}" \
        --only "${TABLE_ONLY:-ddtree N=33 wy,dflash,ddtree N=33,ddtree N=16 wy,ddtree N=65 wy}" \
        --kernel-profile "${TABLE_PROFILE:-ddtree N=33 wy,dflash,ddtree N=33}"
      [ -d "$OUT/hvc" ] && tar -czf "$OUT/hvc.tgz" -C "$OUT" hvc && rm -r "$OUT/hvc" ;;
  esac
done
tar -czf "$OUT/server_logs.tgz" -C "${TMPDIR:-/tmp}" $(cd "${TMPDIR:-/tmp}" && ls sglang_ddtree_server_*.log 2>/dev/null) \
  2>/dev/null
pack_jit_cache "$OUT"
echo "done after $(( $(date +%s) - T0 ))s" | tee -a "$LOG"
