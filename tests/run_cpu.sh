#!/usr/bin/env bash
# The CPU test command (README.md, "Tests"): SGLang's CPU engine, Triton under its interpreter, the CPU-CI
# shims on PYTHONPATH (they reach SGLang's spawned processes through it), GPU tests deselected.
set -uo pipefail
cd "$(dirname "$0")/.."
export SGLANG_USE_CPU_ENGINE=1 TRITON_INTERPRET=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
export PYTHONPATH="$PWD/tests/cpu_shims${PYTHONPATH:+:$PYTHONPATH}"
python -m pytest -m "not gpu" -p no:cacheprovider --timeout 900 -q -n 2 --dist loadgroup --durations=12 tests "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
