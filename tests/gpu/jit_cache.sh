# The GPU machine's JIT caches carried between calls (sourced by tests/gpu/env.sh; tested by
# tests/test_gpu_jit_cache.py). A call carries at most 64 MiB, of which the xz wheelhouse takes 36 and the tracked
# tree ~23, so only what a server start needs travels: FlashInfer's built modules, stripped (nvcc builds: a cold
# hybrid server took 187 s to start, RESULTS run 74), and Triton's compiled kernels as cubins and metadata (Triton
# 3.x loads a cached kernel from its group's metadata json and binary; the IR files are 59 of the cache's 60 MB).
# After run 74's exactness tests and hybrid suite: 4.3 and 1.0 MB with xz -9e, where the whole cache as .tgz was
# 18 MiB.

pack_jit_cache() {  # pack_jit_cache OUT_DIR [JIT_DIR]: OUT_DIR/jitcache_flashinfer.txz and jitcache_triton.txz
  local out=$1 jit=${2:-$JIT} staging
  staging=$(mktemp -d)
  (cd "$jit" && find .cache/flashinfer -path '*cached_ops*' -name '*.so' 2>/dev/null; \
   find triton -type f \( -name '*.json' -o -name '*.cubin' \) 2>/dev/null) | while read -r file; do
    mkdir -p "$staging/$(dirname "$file")" && cp "$jit/$file" "$staging/$file"
  done
  find "$staging" -name '*.so' -exec strip --strip-unneeded {} \; 2>/dev/null
  [ -d "$staging/.cache" ] && tar -cf - -C "$staging" .cache | xz -9e -T0 > "$out/jitcache_flashinfer.txz"
  [ -d "$staging/triton" ] && tar -cf - -C "$staging" triton | xz -9e -T0 > "$out/jitcache_triton.txz"
  rm -rf "$staging"
  ls -l "$out"/jitcache_*.txz 2>/dev/null
  return 0
}

restore_jit_cache() {  # restore_jit_cache PACK_DIR JIT_DIR: unpack PACK_DIR/jitcache_*.txz once per machine
  local packs=$1 jit=$2 pack
  [ -f "$jit/.restored" ] && return 0
  mkdir -p "$jit"
  for pack in "$packs"/jitcache_*.txz; do
    [ -f "$pack" ] && tar -xJf "$pack" -C "$jit"
  done
  touch "$jit/.restored"
}
