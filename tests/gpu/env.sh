# Sourced by the GPU scripts (the H200 machine has no network): SGLang from the wheelhouse, this package beside
# it, and the JIT caches restored. Expects .whl/wheelhouse.tar.xz (shared/device/build_wheelhouse.sh --xz) and
# optionally .gpu/jitcache_*.txz. Defines pack_jit_cache DIR (writes DIR/jitcache_{flashinfer,triton}.txz).
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
if [ ! -f "$JIT/.restored" ]; then
  for pack in .gpu/jitcache_*.txz; do
    [ -f "$pack" ] && tar -xJf "$pack" -C "$JIT"
  done
  touch "$JIT/.restored"
fi
# FlashInfer rebuilds its JIT modules even when they sit in its cache folder (run 4 of RESULTS.md), but loads
# prebuilt modules from flashinfer/data/aot/NAME/NAME.so as they are.
for so in "$JIT"/.cache/flashinfer/*/*/cached_ops/*/*.so; do
  [ -f "$so" ] || continue
  aot="$SITE/flashinfer/data/aot/$(basename "$(dirname "$so")")"
  [ -f "$aot/$(basename "$so")" ] || { mkdir -p "$aot" && cp "$so" "$aot/"; }
done

pack_jit_cache() {
  # Packs small enough to travel beside the 36 MiB wheelhouse and the tracked tree (~23 MiB) in a call's 64 MiB,
  # written to $1 (carry them as .gpu/jitcache_*.txz, both or the first): jitcache_flashinfer.txz, FlashInfer's
  # built modules, stripped (nvcc builds: a cold hybrid server took 187 s to start, RESULTS run 74), and
  # jitcache_triton.txz, Triton's compiled kernels as cubins and metadata (Triton loads a cached kernel from those;
  # its IR files are 59 of the cache's 60 MB). After run 74's exactness tests and hybrid suite: 4.3 and 1.0 MB with
  # xz -9e (the whole cache as .tgz was 18 MiB).
  local staging; staging=$(mktemp -d)
  (cd "$JIT" && find .cache/flashinfer -path '*cached_ops*' -name '*.so' 2>/dev/null; \
   find triton -type f \( -name '*.json' -o -name '*.cubin' \) 2>/dev/null) | while read -r file; do
    mkdir -p "$staging/$(dirname "$file")" && cp "$JIT/$file" "$staging/$file"
  done
  find "$staging" -name '*.so' -exec strip --strip-unneeded {} \; 2>/dev/null
  [ -d "$staging/.cache" ] && tar -cf - -C "$staging" .cache | xz -9e -T0 > "$1/jitcache_flashinfer.txz"
  [ -d "$staging/triton" ] && tar -cf - -C "$staging" triton | xz -9e -T0 > "$1/jitcache_triton.txz"
  rm -rf "$staging"
  ls -l "$1"/jitcache_*.txz 2>/dev/null
  return 0
}
