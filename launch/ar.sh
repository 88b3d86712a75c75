#!/usr/bin/env bash
# AR baseline (no speculation). Extra arguments go to the launcher and through it to SGLang, e.g.
#   MODEL=Qwen/Qwen3.6-27B TP=2 bash launch/ar.sh --port 30000
# With MODEL unset, the embedded SmolLM2 demo model is served.
set -euo pipefail
exec python -m sglang_ddtree.launch --algo ar ${MODEL:+--model-path "$MODEL"} --tp "${TP:-1}" "$@"
