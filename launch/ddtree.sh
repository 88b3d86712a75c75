#!/usr/bin/env bash
# DDTree: DFlash drafter + draft tree of BUDGET nodes per request, e.g.
#   MODEL=Qwen/Qwen3.6-27B DRAFTER=z-lab/Qwen3.6-27B-DFlash TP=2 BUDGET=32 bash launch/ddtree.sh --port 30000
set -euo pipefail
exec python -m sglang_ddtree.launch --algo ddtree --model-path "${MODEL:?set MODEL}" \
  --draft-model-path "${DRAFTER:?set DRAFTER}" --tp "${TP:-1}" ${BUDGET:+--budget "$BUDGET"} "$@"
