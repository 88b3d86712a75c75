#!/usr/bin/env bash
# Run the GPU suite on the H200 machine (no network there). From the repository root:
#   bash tests/gpu/run_suite.sh [pytest args...]        e.g.  -k flashinfer
# Expects .whl/wheelhouse.tar.xz (built on a networked machine by shared/device/build_wheelhouse.sh --xz).
# Optional: .gpu/jitcache.tgz.part* (restored before, re-packed after), SGLANG_DDTREE_DEMO_GGUF (SmolLM2 GGUF pieces).
# Writes $OUT/gpu_suite.log, $OUT/gpu_suite.jsonl (timings), $OUT/server_logs.tgz and $OUT/jitcache.tgz.part*.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu_suite_out}
SITE=/tmp/site JIT=/tmp/jit
mkdir -p "$OUT" "$JIT"
T0=$(date +%s)

if [ ! -d "$SITE/sglang" ]; then
  python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" \
    .whl/wheelhouse.tar.xz /tmp/wheelhouse || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" /tmp/wheelhouse/*.whl || exit 1
fi
# The package itself (with its sglang.srt.plugins entry point), beside SGLang.
python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target "$SITE" . || exit 1
export PYTHONPATH=$SITE PYTHONUNBUFFERED=1
export SGLANG_ENABLE_JIT_DEEPGEMM=0 FLASHINFER_WORKSPACE_BASE=$JIT TVM_FFI_CACHE_DIR=$JIT/tvm-ffi TRITON_CACHE_DIR=$JIT/triton
if ls .gpu/jitcache.tgz.part* >/dev/null 2>&1 && [ ! -f "$JIT/.restored" ]; then
  cat .gpu/jitcache.tgz.part* | tar -xzf - -C "$JIT" && touch "$JIT/.restored"
fi
# FlashInfer rebuilds its JIT modules even when they sit in its cache folder (run 4 of RESULTS.md), but loads
# prebuilt modules from flashinfer/data/aot/NAME/NAME.so as they are.
for so in "$JIT"/.cache/flashinfer/*/*/cached_ops/*/*.so; do
  [ -f "$so" ] || continue
  aot="$SITE/flashinfer/data/aot/$(basename "$(dirname "$so")")"
  [ -f "$aot/$(basename "$so")" ] || { mkdir -p "$aot" && cp "$so" "$aot/"; }
done
echo "setup: $(( $(date +%s) - T0 ))s" | tee "$OUT/gpu_suite.log"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/gpu_suite.log"

export GPU_SUITE_MODELS=/tmp/tiny_models GPU_SUITE_REPORT="$OUT/gpu_suite.jsonl"
[ -d "$GPU_SUITE_MODELS/qwen3" ] || python3 tests/tiny_models.py --out "$GPU_SUITE_MODELS" >>"$OUT/gpu_suite.log" 2>&1
# A deadline inside the script, so the JIT cache is still packed when a run is cut short.
timeout "${GPU_SUITE_TIMEOUT:-3000}" python3 -m pytest -m gpu -p no:cacheprovider -v -rA tests/gpu "$@" 2>&1 \
  | tee -a "$OUT/gpu_suite.log"
rc=${PIPESTATUS[0]}
tar -czf "$OUT/server_logs.tgz" -C "${TMPDIR:-/tmp}" $(cd "${TMPDIR:-/tmp}" && ls sglang_ddtree_server_*.log 2>/dev/null) 2>/dev/null
# Pieces of 15 MiB: files that come back from the GPU machine are limited to 16 MiB each.
# Built modules only (FlashInfer's generated sources, objects and ninja files would double the size).
tar -czf - -C "$JIT" --exclude=.restored --exclude=generated --exclude='*.o' --exclude='*.ninja' . 2>/dev/null \
  | split -b 15M -d - "$OUT/jitcache.tgz.part"
echo "suite exit $rc after $(( $(date +%s) - T0 ))s" | tee -a "$OUT/gpu_suite.log"
exit "$rc"
