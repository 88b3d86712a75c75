# Sourced by the GPU scripts (the H200 machine has no network): SGLang from the wheelhouse, this package beside
# it, and the JIT caches restored. Expects .whl/wheelhouse.tar.xz (shared/device/build_wheelhouse.sh --xz) and
# optionally .gpu/jitcache_*.txz (tests/gpu/jit_cache.sh, which also defines pack_jit_cache OUT_DIR).
# The sourcing script sets OUT (its output folder); T0 starts its clock.
T0=$(date +%s)
# Seconds this call may still spend on measuring: GPU_RUN_DEADLINE_S (default 570, under the call's 600 s) from T0,
# less GPU_RUN_RESERVE_S (default 45) kept for packing the reports, logs and JIT caches that must come back.
left() { echo $(( T0 + ${GPU_RUN_DEADLINE_S:-570} - ${GPU_RUN_RESERVE_S:-45} - $(date +%s) )); }
# A call cut by its time limit leaves its servers holding the GPU on a machine kept warm for the next call (RESULTS
# run 63: 132 GiB, the next server out of memory): end every process on the GPU first (by PID: a pattern would
# match the calling shell's own command line). Once per call: a script that sourced this file and then runs another
# that sources it again (run_suite.sh) may already have servers up.
if [ -z "${DDTREE_GPU_ENV:-}" ]; then
  nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | xargs -r kill -9 2>/dev/null
fi
export DDTREE_GPU_ENV=1
SITE=/tmp/site JIT=/tmp/jit
mkdir -p "$OUT" "$JIT"
if [ ! -d "$SITE/sglang" ]; then
  python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" \
    .whl/wheelhouse.tar.xz /tmp/wheelhouse || return 1
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" /tmp/wheelhouse/*.whl || return 1
fi
# The package itself (with its sglang.srt.plugins entry point), beside SGLang.
python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target "$SITE" . || return 1
export PYTHONPATH=$SITE PYTHONUNBUFFERED=1
export SGLANG_ENABLE_JIT_DEEPGEMM=0 FLASHINFER_WORKSPACE_BASE=$JIT TVM_FFI_CACHE_DIR=$JIT/tvm-ffi TRITON_CACHE_DIR=$JIT/triton
source tests/gpu/jit_cache.sh
restore_jit_cache .gpu "$JIT"
# FlashInfer rebuilds its JIT modules even when they sit in its cache folder (run 4 of RESULTS.md), but loads
# prebuilt modules from flashinfer/data/aot/NAME/NAME.so as they are.
for so in "$JIT"/.cache/flashinfer/*/*/cached_ops/*/*.so; do
  [ -f "$so" ] || continue
  aot="$SITE/flashinfer/data/aot/$(basename "$(dirname "$so")")"
  [ -f "$aot/$(basename "$so")" ] || { mkdir -p "$aot" && cp "$so" "$aot/"; }
done
