#!/usr/bin/env bash
# MTP baseline (SGLang NEXTN: 3 steps, topk 1, 4 draft tokens); the target must ship MTP layers, e.g.
#   MODEL=Qwen/Qwen3.6-27B TP=2 bash launch/mtp.sh --port 30000
set -euo pipefail
exec python -m sglang_ddtree.launch --algo mtp --model-path "${MODEL:?set MODEL}" --tp "${TP:-1}" "$@"
