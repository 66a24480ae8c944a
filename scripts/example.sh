#!/usr/bin/env bash
# The main job on the embedded examples, no downloads:
#  1. a small drafter in Model Optimizer's export naming (layers.0.*: silently skipped by
#     SGLang) is inspected, fixed into ./example-out/ and its aux-layer wiring checked, then its
#     launch line for each engine release printed, and a typical wrong SGLang line checked
#     (EAGLE for EAGLE3, the draft inheriting --quantization fp8: exit 3, with the corrected command);
#  2. the real drafter trained on SmolLM2-135M-Instruct (tests/data/smollm2-drafter) is run
#     on states captured from SmolLM2 itself (the GGUF installed from PyPI by setup.sh):
#     acceptance per draft position, and which wiring it was trained on.
set -euo pipefail
cd "$(dirname "$0")/.."
# EAGLE3CONV=/path/to/bin/eagle3conv runs an installed eagle3conv instead (scripts/readme_commands.py does)
if [ -z "${EAGLE3CONV:-}" ]; then
  bash scripts/setup.sh
fi
E=${EAGLE3CONV:-.venv/bin/eagle3conv}
rm -rf example-out && mkdir -p example-out
$E example example-out/modelopt-export-drafter --format modelopt-export
$E inspect example-out/modelopt-export-drafter
echo
$E fix-keys example-out/modelopt-export-drafter --out example-out/sglang-drafter --target smollm2-135m
echo
$E config example-out/sglang-drafter --target smollm2-135m --check
echo
$E launch example-out/sglang-drafter --target smollm2-135m
echo
rc=0
$E launch example-out/sglang-drafter --check "python -m sglang.launch_server \
    --model-path HuggingFaceTB/SmolLM2-135M-Instruct --speculative-algorithm EAGLE \
    --speculative-draft-model-path example-out/sglang-drafter --quantization fp8 --context-length 2048" || rc=$?
[ "$rc" = 3 ] || { echo "launch --check: expected exit 3 (the line has errors), got $rc" >&2; exit 1; }
echo
cp -r tests/data/smollm2-drafter example-out/smollm2-drafter
$E capture --target smollm2-135m --prompts scripts/smollm2-prompts.txt --generate 64 --batch-size 10 \
    --out example-out/smollm2-states.safetensors
echo
$E verify example-out/smollm2-drafter --states example-out/smollm2-states.safetensors --search-wiring
