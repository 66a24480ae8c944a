#!/usr/bin/env bash
# The main job on the embedded example: a small drafter in Model Optimizer's export
# naming (layers.0.*: silently skipped by SGLang), inspected, then fixed into ./example-out/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
E=.venv/bin/eagle3conv
rm -rf example-out && mkdir -p example-out
$E example example-out/modelopt-export-drafter --format modelopt-export
$E inspect example-out/modelopt-export-drafter
echo
$E fix-keys example-out/modelopt-export-drafter --out example-out/sglang-drafter
echo
$E inspect example-out/sglang-drafter | tail -n 4
