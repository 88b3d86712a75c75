#!/usr/bin/env bash
# Run the GPU suite on the H200 machine (no network there). From the repository root:
#   bash tests/gpu/run_suite.sh [pytest args...]        e.g.  -k flashinfer
# Expects .whl/wheelhouse.tar.xz (built on a networked machine by shared/device/build_wheelhouse.sh --xz).
# Optional: .gpu/jitcache_*.txz (restored before, re-packed after), SGLANG_DDTREE_DEMO_GGUF (SmolLM2 GGUF pieces),
# GPU_SUITE_BACKENDS (flashinfer,triton), GPU_SUITE_PREFILL_GRAPHS=0 (servers start without SGLang's prefill graphs:
# minutes less per call, tests/gpu/suite_servers.py). A -k selection starts only the selected tests' servers.
# Writes $OUT/gpu_suite.log, $OUT/gpu_suite.jsonl (timings; each failure's reason as it happens), $OUT/server_logs.tgz
# and $OUT/jitcache_*.txz.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu_suite_out}
source tests/gpu/env.sh || exit 1
echo "setup: $(( $(date +%s) - T0 ))s" | tee "$OUT/gpu_suite.log"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/gpu_suite.log"

export GPU_SUITE_MODELS=/tmp/tiny_models GPU_SUITE_REPORT="$OUT/gpu_suite.jsonl"
[ -d "$GPU_SUITE_MODELS/qwen3" ] || python3 tests/tiny_models.py --out "$GPU_SUITE_MODELS" >>"$OUT/gpu_suite.log" 2>&1
# A deadline inside the script, so the JIT cache is still packed when a run is cut short.
# The whole suite unless the arguments name test files of their own (a -k selection alone still means all of them).
targets=(tests/gpu)
for arg in "$@"; do [[ "$arg" == tests/gpu/* ]] && targets=(); done
timeout "${GPU_SUITE_TIMEOUT:-3000}" python3 -m pytest -m gpu -p no:cacheprovider -v -rA "${targets[@]}" "$@" 2>&1 \
  | tee -a "$OUT/gpu_suite.log"
rc=${PIPESTATUS[0]}
tar -czf "$OUT/server_logs.tgz" -C "${TMPDIR:-/tmp}" $(cd "${TMPDIR:-/tmp}" && ls sglang_ddtree_server_*.log 2>/dev/null) 2>/dev/null
pack_jit_cache "$OUT"
echo "suite exit $rc after $(( $(date +%s) - T0 ))s" | tee -a "$OUT/gpu_suite.log"
exit "$rc"
