#!/usr/bin/env bash
# The main job on the embedded examples, no downloads:
#  1. a small drafter in Model Optimizer's export naming (layers.0.*: silently skipped by
#     SGLang) is inspected, fixed into ./example-out/ and its aux-layer wiring checked;
#  2. the real drafter trained on SmolLM2-135M-Instruct (tests/data/smollm2-drafter) is run
#     on states captured from SmolLM2 itself (the GGUF installed from PyPI by setup.sh):
#     acceptance per draft position, and which wiring it was trained on.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
E=.venv/bin/eagle3conv
rm -rf example-out && mkdir -p example-out
$E example example-out/modelopt-export-drafter --format modelopt-export
$E inspect example-out/modelopt-export-drafter
echo
$E fix-keys example-out/modelopt-export-drafter --out example-out/sglang-drafter --target smollm2-135m
echo
$E config example-out/sglang-drafter --target smollm2-135m --check
echo
cp -r tests/data/smollm2-drafter example-out/smollm2-drafter
$E capture --target smollm2-135m --prompts scripts/smollm2-prompts.txt --generate 64 --batch-size 10 \
    --out example-out/smollm2-states.safetensors
echo
$E verify example-out/smollm2-drafter --states example-out/smollm2-states.safetensors --search-wiring
