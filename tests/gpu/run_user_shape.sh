#!/usr/bin/env bash
# Issue 18's side-by-side at the reference user's shape in one call on the GPU machine (no network there):
# Qwen3.6-27B's config with random weights (bench.hybrid_verify_cost --write-models-only), the z-lab-shaped drafter,
# simulated acceptance (cost only), 1,024-token random prompts, 256 tokens each, greedy. From the repository root:
#   [ALGOS=ar,mtp,ddtree] [BUDGETS=16,32,auto] [CONCURRENCY=16,32] [ROUNDS=1] [GRAPH_BS="16 32"] bash tests/gpu/run_user_shape.sh
# DFLASH's 16 GDN snapshots per request fit 13 running requests at TP 1 on a 141 GB card and 1 on an 80 GB one (the
# launcher's sizing): above that the launcher refuses it and the bench stops before measuring anything, so it is
# not in the default list. MTP at 16 requests on an 80 GB card runs 6 at once (KV cache, RESULTS run 75).
# The taus are those of bench/results/side_by_side/qwen36_27b_shape_2026-12-04/README.md (MTP published, DFLASH the
# user's, DDTree the user's DFLASH tau times our real pair's tree/chain ratio: an assumption, said so in the report).
# BUDGETS may include auto (`--budget auto`, widths from the server's own step times), whose simulated mean depends on
# the verify width (AUTO_TAUS, SGLANG_DDTREE_SIMULATE_ACC_BY_WIDTH; linear between the widths named): by default the
# fixed budgets' taus at widths 17 / 33 / 65 and, at widths 2 / 4 / 8, what a chain of 1 / 3 / 7 drafts commits at
# the per-token acceptance (0.678) that gives the user's DFLASH tau of 3.1 over 15 drafts (a tree commits at least
# that much: an assumption again, said so in the report).
# Expects .whl/wheelhouse.tar.xz; optional .gpu/jitcache_*.txz. GPU_RUN_DEADLINE_S (default 570) bounds the whole call:
# the bench keeps every finished configuration (--resume), so what ran before the deadline comes back; a carried
# .gpu/side_by_side.json (an earlier call's report, same kind of card: the bench refuses another's) is resumed.
# Writes into $OUT: user_shape.log, sbs.tgz (the bench's folder), server_logs.tgz, the JIT cache pieces.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/user_shape_out}
source tests/gpu/env.sh || exit 1
LOG="$OUT/user_shape.log"
unset PYTHONSAFEPATH  # it drops the checkout from sys.path: `python3 -m bench.*` is then not found (RESULTS run 66)
ALGOS=${ALGOS:-ar,mtp,ddtree} BUDGETS=${BUDGETS:-16,32} CONCURRENCY=${CONCURRENCY:-16,32} ROUNDS=${ROUNDS:-1}
TAUS=$(python3 -c "import sys; algos = sys.argv[1].split(','); print(','.join(t for t in ('mtp=3.556', 'dflash=3.1', 'ddtree B=16=4.06', 'ddtree B=32=4.39', 'ddtree B=64=4.67') if t.split('=')[0].split()[0] in algos))" "$ALGOS")
AUTO_TAUS=${AUTO_TAUS:-2:1.68,4:2.45,8:2.97,17:4.06,33:4.39,65:4.67}
BY_WIDTH=(); [[ ",$BUDGETS," == *",auto,"* ]] && BY_WIDTH=(--simulate-tau-by-width "ddtree auto=$AUTO_TAUS")
MAX_RUNNING=$(tr ',' '\n' <<<"$CONCURRENCY" | sort -n | tail -1)
# Decode graph batch sizes: SGLang's ladder up to the largest concurrency unless GRAPH_BS names them ("16 32": a
# cell's requests start and end together, so smaller batches pad up to the next graph; fewer captures, faster start).
GRAPH_BS=${GRAPH_BS:-$(python3 -c "import sys; m = int(sys.argv[1]); print(*sorted({b for b in (1, 2, 4, 8, 16, 24, 32, 48, 64) if b <= m} | {m}))" "$MAX_RUNNING")}

echo "setup: $(( $(date +%s) - T0 ))s, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')" | tee "$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$LOG"
[ -d /tmp/tiny_models/qwen35 ] || python3 tests/tiny_models.py --out /tmp/tiny_models >>"$LOG" 2>&1
python3 -m bench.hybrid_verify_cost --tokenizer-path /tmp/tiny_models/qwen35 --out /tmp/q27 --write-models-only >>"$LOG" 2>&1
mkdir -p "$OUT/sbs" && { [ ! -f .gpu/side_by_side.json ] || cp .gpu/side_by_side.json "$OUT/sbs/"; }
echo "== side_by_side (up to $(left)s): algos $ALGOS, budgets $BUDGETS, concurrency $CONCURRENCY" | tee -a "$LOG"
start=$(date +%s)
timeout "$(left)" python3 -m bench.side_by_side \
  --model-path /tmp/q27/models/qwen36_27b --draft-model-path /tmp/q27/models/zlab_drafter \
  --tokenizer-path /tmp/tiny_models/qwen35 --algos "$ALGOS" --budgets "$BUDGETS" --concurrency "$CONCURRENCY" \
  --temperatures 0 --datasets random --num-prompts 64 --random-prompt-len 1024 --max-new-tokens 256 --ignore-eos \
  --rounds "$ROUNDS" --simulate-tau "$TAUS" "${BY_WIDTH[@]}" \
  --profile-steps --out "$OUT/sbs" --resume -- --load-format dummy --skip-tokenizer-init \
  --tokenizer-path /tmp/tiny_models/qwen35 --attention-backend flashinfer --context-length 4096 \
  --mem-fraction-static 0.9 --disable-radix-cache --cuda-graph-backend-prefill disabled --sampling-backend pytorch \
  --grammar-backend none --max-running-requests "$MAX_RUNNING" --cuda-graph-bs-decode $GRAPH_BS >>"$LOG" 2>&1
echo "== side_by_side: exit $? after $(( $(date +%s) - start ))s" | tee -a "$LOG"
[ -d "$OUT/sbs" ] && tar -czf "$OUT/sbs.tgz" -C "$OUT" sbs && rm -r "$OUT/sbs"
tar -czf "$OUT/server_logs.tgz" -C "${TMPDIR:-/tmp}" $(cd "${TMPDIR:-/tmp}" && ls sglang_ddtree_server_*.log 2>/dev/null) \
  2>/dev/null
pack_jit_cache "$OUT"
echo "done after $(( $(date +%s) - T0 ))s" | tee -a "$LOG"
