"""How dependent are the positions of one sequence, for the screen's bound? (docs/facts.md §12)

For the lost-wiring drafter (tests/data/smollm2-drafter-lost) on captured states holding every
layer: every wiring's step-1 log score on the first few sequences, the --top best of them on
every position (the screen's own code: ``evaluate.screen`` with ``NO_DROP``), then, for each of
the --compare wirings closest to the leader, the paired standard error of (leader - wiring) over
blocks of 4, 16, 64 consecutive positions of one sequence and over whole sequences, as a ratio
to the one over single positions. A ratio above 1 is dependence the smaller blocks miss.

    PYTHONPATH=. .venv/bin/python bench/smollm2/screen_variance.py STATES [--out JSON]

Slow on a CPU (minutes): it scores --top wirings on every position.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def se_ratio(lead, other, rows, block: int | None) -> float:
    """Paired standard error of mean(lead - other) over blocks (None: whole sequences)."""
    d = (lead - other).double()
    keys, first = [], {}
    for i, r in enumerate(rows):
        first.setdefault(r, i)
        keys.append((r, 0 if block is None else (i - first[r]) // block))
    uniq = {k: j for j, k in enumerate(dict.fromkeys(keys))}
    idx = torch.tensor([uniq[k] for k in keys])
    X = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, idx, d)
    C = torch.bincount(idx, minlength=len(uniq)).double()
    D = X.sum() / C.sum()
    r = X - D * C
    m = len(uniq)
    return math.sqrt(float((r ** 2).sum()) * m / (m - 1)) / float(C.sum())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("states")
    ap.add_argument("--drafter", default=str(ROOT / "tests/data/smollm2-drafter-lost"))
    ap.add_argument("--first-rows", type=int, default=4, help="sequences every wiring is scored on")
    ap.add_argument("--top", type=int, default=200, help="wirings scored on every position")
    ap.add_argument("--compare", type=int, default=40, help="wirings closest to the leader compared")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from eagle3conv.spec.layers import describe
    from eagle3conv.states.readers import open_states
    from eagle3conv.verify import build_drafter, load_drafter_weights
    from eagle3conv.verify.evaluate import NO_DROP, screen
    from eagle3conv.verify.search import all_wirings, screen_dtype

    config, tensors = load_drafter_weights(args.drafter)
    drafter, target_embeds = build_drafter(config, tensors, "cpu", screen_dtype("cpu", torch.float32))
    states = open_states(args.states)
    sets = all_wirings(states.layers, 3)
    t0 = time.perf_counter()
    first, _ = screen(drafter, states, sets, rows=args.first_rows, target_embeds=target_embeds, bound=NO_DROP)
    top = sorted(range(len(sets)), key=lambda i: -first.logp[i])[:args.top]
    full, _ = screen(drafter, states, [sets[i] for i in top], rows=states.num_sequences,
                     target_embeds=target_embeds, bound=NO_DROP)
    order = sorted(range(len(top)), key=lambda i: -full.logp[i])
    lead = order[0]
    rows = full.pos_row
    ratios: dict[str, list[float]] = {"4": [], "16": [], "64": [], "sequence": []}
    for i in order[1:args.compare + 1]:
        base = se_ratio(full.vectors[lead], full.vectors[i], rows, 1)
        for key, b in (("4", 4), ("16", 16), ("64", 64), ("sequence", None)):
            ratios[key].append(se_ratio(full.vectors[lead], full.vectors[i], rows, b) / base)
    out = {"states": Path(args.states).name, "positions": len(rows), "sequences": len(set(rows)),
           "leader": describe(full.sets[lead]), "compared": len(ratios["4"]), "seconds": round(time.perf_counter() - t0, 1),
           "se_ratio_to_single_positions": {k: {"median": round(statistics.median(v), 3), "min": round(min(v), 3),
                                                "max": round(max(v), 3)} for k, v in ratios.items()}}
    print(json.dumps(out, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
