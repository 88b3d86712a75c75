# Sourced by the GPU scripts (the H200 machine has no network): SGLang from the wheelhouse, this package beside
# it, and the JIT caches restored. Expects .whl/wheelhouse.tar.xz (shared/device/build_wheelhouse.sh --xz) and
# optionally .gpu/jitcache.tgz.part*. Defines pack_jit_cache DIR (pieces that fit the 16 MiB return limit).
# The sourcing script sets OUT (its output folder); T0 starts its clock.
T0=$(date +%s)
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
if ls .gpu/jitcache.tgz.part* >/dev/null 2>&1 && [ ! -f "$JIT/.restored" ]; then
  cat .gpu/jitcache.tgz.part* | tar -xzf - -C "$JIT" && touch "$JIT/.restored"
elif [ -f .gpu/jitcache_flashinfer.txz ] && [ ! -f "$JIT/.restored" ]; then
  # FlashInfer's modules alone, recompressed with xz -9e (6.3 -> 4.2 MiB for the hybrids' head dims 128 and 256):
  # small enough to travel beside the wheelhouse and the tracked tree.
  tar -xJf .gpu/jitcache_flashinfer.txz -C "$JIT" && touch "$JIT/.restored"
fi
# FlashInfer rebuilds its JIT modules even when they sit in its cache folder (run 4 of RESULTS.md), but loads
# prebuilt modules from flashinfer/data/aot/NAME/NAME.so as they are.
for so in "$JIT"/.cache/flashinfer/*/*/cached_ops/*/*.so; do
  [ -f "$so" ] || continue
  aot="$SITE/flashinfer/data/aot/$(basename "$(dirname "$so")")"
  [ -f "$aot/$(basename "$so")" ] || { mkdir -p "$aot" && cp "$so" "$aot/"; }
done

pack_jit_cache() {
  # Built modules only (FlashInfer's generated sources, objects and ninja files would double the size), in
  # pieces of 15 MiB: files that come back from the GPU machine are limited to 16 MiB each. Beside them
  # jitcache_flashinfer.tgz, FlashInfer's modules alone (~4.5 MiB for one model's head dims): the full pieces do
  # not fit beside the 36 MiB wheelhouse and the tracked tree in a call's 64 MiB, this does, and FlashInfer's
  # modules are nvcc builds (the first servers of RESULTS.md runs 43 and 46 took minutes to start without them).
  # Carry either as .gpu/jitcache.tgz.part* (a whole .tgz is a one-piece part).
  tar -czf - -C "$JIT" --exclude=.restored --exclude=generated --exclude='*.o' --exclude='*.ninja' . 2>/dev/null \
    | split -b 15M -d - "$1/jitcache.tgz.part"
  [ -d "$JIT/.cache/flashinfer" ] && tar -czf "$1/jitcache_flashinfer.tgz" -C "$JIT" --exclude=generated \
    --exclude='*.o' --exclude='*.ninja' --exclude='*.lock' --exclude='.ninja_*' .cache/flashinfer 2>/dev/null
  return 0
}
