#!/usr/bin/env bash
# Issue 30's CPU budget, side by side: per drafter, a plain `verify` of one wiring and the global
# `verify --search-wiring`, for each tree given, interleaved (tree A plain, tree A search, tree B
# plain, tree B search, next drafter ...), so the two trees see the same load. A benchmark, not a
# test: wall seconds by /usr/bin/time, peak RSS, load average around each command, and the verdict.
#
# Usage: bash bench/smollm2/search_side_by_side.sh STATES OUTDIR TREE [TREE ...]
#   STATES  states from `eagle3conv capture --generate 96` on the first 50 held-out prompts (bench/README.md)
#   OUTDIR  one JSON report per (tree, drafter, mode) and a summary.tsv
#   TREE    an eagle3conv source tree (PYTHONPATH for it; python -P, so the folder this runs in never
#           shadows it), e.g. /tmp/base (git archive 8455a44) and .
# Environment: PYTHON (default /work/main/.venv/bin/python); DRAFTERS: "name=folder:plain-layers ..."
#   (default: the three lost-wiring cases, made under OUTDIR/drafters by this script from tests/data);
#   NO_NATIVE_BF16=1: every command as on a CPU without native bf16 matmul, as far as this VM can
#   play one (AVX2 kernels only, the search in fp32: bench/smollm2/no_native_bf16/sitecustomize.py)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
states=$1; outdir=$2; shift 2
py=${PYTHON:-/work/main/.venv/bin/python}
mkdir -p "$outdir/drafters"
d=$outdir/drafters
if [ -z "${DRAFTERS:-}" ]; then
  # incident: trained on outputs 1, 14, 26; config ids set to the seed incident's -1, 1, 14 (embedding
  # included), no training record. lost: trained on 4, 11, 21, ids null. lostrec: the same with its record.
  rm -rf "$d/incident" "$d/lost" "$d/lostrec"
  cp -r "$repo/tests/data/smollm2-drafter" "$d/incident"; rm -f "$d/incident/training_metadata.json"
  "$py" - "$d/incident/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [-1, 1, 14]
json.dump(c, open(sys.argv[1], "w"), indent=2)
PY
  cp -r "$repo/tests/data/smollm2-drafter-lost" "$d/lost"
  cp -r "$repo/tests/data/smollm2-drafter-lost" "$d/lostrec"
  cp "$repo/tests/data/smollm2-drafter-lost-record/training_metadata.json" "$d/lostrec/"
  DRAFTERS="incident=$d/incident:-1,1,14 lost=$d/lost:4,11,21 lostrec=$d/lostrec:4,11,21"
fi
shim=
if [ -n "${NO_NATIVE_BF16:-}" ]; then
  export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
  shim="$repo/bench/smollm2/no_native_bf16:"
fi
echo -e "tree\tdrafter\tmode\twall_s\tmax_rss_kb\tload_before\tload_after\tstatus\tset_size\tbest" > "$outdir/summary.tsv"
for spec in $DRAFTERS; do
  name=${spec%%=*}; rest=${spec#*=}; folder=${rest%%:*}; layers=${rest#*:}
  for tree in "$@"; do
    tag=$(basename "$(cd "$tree" && pwd)")
    for mode in plain search; do
      extra=(--layers "$layers"); [ "$mode" = search ] && extra=(--search-wiring)
      out="$outdir/$tag-$name-$mode.json"
      lb=$(cut -d' ' -f1-3 /proc/loadavg)
      EAGLE3CONV_PHASES=1 PYTHONPATH=$shim$tree /usr/bin/time -v -o "$out.time" "$py" -P -m eagle3conv verify "$folder" \
          --states "$states" "${extra[@]}" --no-save --json > "$out" 2> "$out.err" || true
      la=$(cut -d' ' -f1-3 /proc/loadavg)
      wall=$(grep "Elapsed (wall" "$out.time" | awk '{print $NF}')
      rss=$(grep "Maximum resident" "$out.time" | awk '{print $NF}')
      verdict=$("$py" - "$out" <<'PY'
import json, sys
try:
    v = json.load(open(sys.argv[1]))["verdict"]
except Exception as e:  # noqa: BLE001 -- a failed run is recorded, not fatal
    print(f"failed\t\t{e}"); sys.exit()
size = (v.get("to_separate") or {}).get("members") or (1 if v.get("best_layers") else None)
print(f"{v.get('status')}\t{size}\t{v.get('best_layers') or v.get('best_found')}")
PY
)
      echo -e "$tag\t$name\t$mode\t$wall\t$rss\t$lb\t$la\t$verdict" | tee -a "$outdir/summary.tsv"
    done
  done
done
