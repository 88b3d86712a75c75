#!/usr/bin/env bash
# DFlash chain baseline (SGLang's built-in DFLASH worker), e.g.
#   MODEL=Qwen/Qwen3.6-27B DRAFTER=z-lab/Qwen3.6-27B-DFlash TP=2 bash launch/dflash.sh --port 30000
set -euo pipefail
exec python -m sglang_ddtree.launch --algo dflash --model-path "${MODEL:?set MODEL}" \
  --draft-model-path "${DRAFTER:?set DRAFTER}" --tp "${TP:-1}" "$@"
