"""A search's confirmations, one wiring at a time (``evaluate``) against all together
(``evaluate_many``), alternated in one process over rounds, on real states: the ratio of the two,
and how far each one's hit counts are from fp32's one-at-a-time ones.

Usage: PYTHONPATH=TREE python bench/smollm2/confirm_many.py DRAFTER STATES --report SEARCH.json
       [--rounds 3] [--dtype fp32|bf16] [--against-fp32] [--out JSON]

The wirings are those a ``verify --search-wiring --json`` report (``--report``) confirmed, less the
first (the config's, which a search scores alone), so the work is what a search's confirmations do.
Run it as bench/smollm2/search_side_by_side.sh does for a CPU without native bf16 (its environment
and ``bench/smollm2/no_native_bf16`` first on PYTHONPATH) to measure that CPU's kernels.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("drafter")
    ap.add_argument("states")
    ap.add_argument("--report", required=True, help="a verify --search-wiring --json report: its confirmed wirings")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--out")
    ap.add_argument("--against-fp32", action="store_true",
                    help="also score each wiring alone in fp32: how far each path's hit counts are from those")
    a = ap.parse_args()
    import torch

    from eagle3conv.spec.layers import LayerRef
    from eagle3conv.states.readers import open_states
    from eagle3conv.verify import build_drafter, load_drafter_weights
    from eagle3conv.verify.evaluate import Candidate, evaluate, evaluate_many

    rep = json.loads(Path(a.report).read_text())
    wirings = [tuple(int(x["output_of"]) for x in r["layers"]) for r in rep["results"]][1:]
    config, tensors = load_drafter_weights(Path(a.drafter))
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    drafter, te = build_drafter(config, tensors, "cpu", dt)
    states = open_states(Path(a.states))
    cands = [Candidate(str(w), tuple(LayerRef(o) for o in w), "bench") for w in wirings]
    kw = dict(steps=rep.get("steps", 3), batch_size=8, target_embeds=te)
    rounds = []
    one = many = None
    for r in range(a.rounds):
        t = time.perf_counter()
        one = [evaluate(drafter, states, c, **kw) for c in cands]
        t_one = time.perf_counter() - t
        t = time.perf_counter()
        many = evaluate_many(drafter, states, cands, **kw)
        t_many = time.perf_counter() - t
        rounds.append({"one_at_a_time_s": round(t_one, 2), "together_s": round(t_many, 2),
                       "ratio": round(t_many / t_one, 3), "loadavg": open("/proc/loadavg").read().split()[:3]})
        print(json.dumps(rounds[-1]), flush=True)
    flips = [sum(abs(x - y) for x, y in zip(sa, sb, strict=True))
             for p, q in zip(one, many, strict=True) for sa, sb in zip(p.matched, q.matched, strict=True)]
    out = {"drafter": a.drafter, "wirings": len(cands), "dtype": a.dtype, "threads": torch.get_num_threads(),
           "rounds": rounds, "ratios": [x["ratio"] for x in rounds],
           "hit_counts_differing": {"per_sequence_and_step_summed": sum(flips), "wiring_steps": len(flips),
                                    "positions_per_step": sum(one[0].counted[0])}}
    if a.against_fp32:  # per (wiring, step): |hits - fp32's hits|, for each path, on average and at most
        ref_drafter, _ = build_drafter(config, tensors, "cpu", torch.float32)
        ref = [evaluate(ref_drafter, states, c, **kw) for c in cands]

        def off(scores):
            d = [abs(sum(x) - sum(y)) for p, q in zip(ref, scores, strict=True)
                 for x, y in zip(p.matched, q.matched, strict=True)]
            return {"mean": round(sum(d) / len(d), 3), "max": max(d)}
        out["hits_from_fp32_one_at_a_time"] = {"one_at_a_time": off(one), "together": off(many)}
    print(json.dumps({k: v for k, v in out.items() if k != "rounds"}))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
