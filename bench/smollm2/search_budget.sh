#!/usr/bin/env bash
# Issues 13 and 21's CPU budget: the global wiring search of the lost-wiring SmolLM2-135M drafter
# (tests/data/smollm2-drafter-lost, config ids null, trained on outputs 4, 11, 21) on the 60
# held-out sequences, on this machine's CPU. A benchmark, not a timed test: it prints the wall
# time, the peak RSS, the load average before and after (other work on the machine slows it),
# and the verdict.
#
# Usage: bash bench/smollm2/search_budget.sh [STATES] [OUT_JSON]
#   STATES    the held-out states, every layer (default bench/out/smollm2/states-heldout.eagle3conv.safetensors,
#             written by: .venv/bin/python bench/smollm2/train_drafter.py --device cpu --eval-only)
#   OUT_JSON  where verify's --json report goes (default /tmp/search-budget.json)
# Environment: PYTHON (default .venv/bin/python), DRAFTER (default tests/data/smollm2-drafter-lost),
#   PYTHONPATH (which eagle3conv: run it once per tree to compare two versions side by side).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
states=${1:-$repo/bench/out/smollm2/states-heldout.eagle3conv.safetensors}
out=${2:-/tmp/search-budget.json}
py=${PYTHON:-$repo/.venv/bin/python}
drafter=${DRAFTER:-$repo/tests/data/smollm2-drafter-lost}
[ -f "$states" ] || { echo "no states at $states: run bench/smollm2/train_drafter.py --device cpu --eval-only" >&2; exit 2; }
echo "cpu: $(nproc) cores, torch threads $("$py" -c 'import torch; print(torch.get_num_threads())')"
echo "loadavg before: $(cat /proc/loadavg)"
start=$(date +%s%N)
/usr/bin/time -v -o /tmp/search-budget.time "$py" -m eagle3conv verify "$drafter" --states "$states" \
    --search-wiring --no-save --json > "$out" || true
end=$(date +%s%N)
echo "loadavg after:  $(cat /proc/loadavg)"
echo "wall: $(( (end - start) / 1000000 )) ms"
grep -E "Maximum resident|Elapsed" /tmp/search-budget.time
"$py" - "$out" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
v = d["verdict"]
c = v.get("coverage") or {}
print(f"states: {d['states']['sequences']} sequences, {d['states']['tokens']} tokens; "
      f"scored positions {d['results'][0]['positions_scored']}")
print(f"screened {c.get('screened')} wirings on up to {c.get('screen_positions')} positions in {c.get('screen_seconds')} s; "
      f"kept {c.get('screen_kept')}; confirmed {c.get('confirmed')}")
for st in (c.get("screen") or {}).get("stages", []):
    print(f"  stage: {st['wirings']} wirings x {st['positions']} positions ({st['sequences']} sequences, "
          f"{st['blocks']} blocks, q {st['quantile']}): kept {st['kept']} in {st['seconds']} s")
ref = c.get("refinement") or {}
print(f"refinement: {[(r['tried'], r['excluded_by_the_screen'], len(r['screened_again']), len(r['confirmed'])) for r in ref.get('rounds', [])]} "
      "(tried, excluded by the screen's data, screened again, confirmed)")
print(f"seconds: {d.get('seconds')}")
print(f"verdict: {v['status']} ({v.get('statistic')}): {v.get('best_layers') or v.get('best_found')}")
print(f"set ({v.get('set_statistic')}): {[m['layers'] for m in v.get('confidence_set') or []]}")
print(f"decided by: {v['decided_by']}")
print(f"advice: {v.get('advice')}")
EOF
