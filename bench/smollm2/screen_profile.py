"""Where the global screen's time goes, on CPU: one screen of a subset of wirings over the
first positions of real states, under cProfile, with the screen's own phase seconds.

Usage: PYTHONPATH=TREE python bench/smollm2/screen_profile.py DRAFTER STATES [--wirings N]
       [--positions P] [--dtype bf16|fp32] [--out JSON] [--top 25] [--dump FILE.pt]

The wirings are the first N of ``search.all_wirings`` (every ascending 3-set of the layers the
states hold) taken with a stride, so they span the layers; the bound is ``NO_DROP`` with
``max_positions`` P (every wiring on every one of the first P scored positions: a fixed amount
of work, so two trees compare on the same work). Prints wiring-positions per second, the
phases and cProfile's top functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import json
import pstats
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("drafter")
    ap.add_argument("states")
    ap.add_argument("--wirings", type=int, default=300)
    ap.add_argument("--positions", type=int, default=1024)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--out")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--tree", default="", help="a label for the tree under test (PYTHONPATH)")
    ap.add_argument("--dump", help="save every wiring's log scores and hits per position (torch.save) to compare trees")
    a = ap.parse_args()
    import torch

    from eagle3conv.states.readers import open_states
    from eagle3conv.verify import build_drafter, load_drafter_weights
    from eagle3conv.verify.evaluate import NO_DROP, screen
    from eagle3conv.verify.search import all_wirings

    config, tensors = load_drafter_weights(Path(a.drafter))
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    drafter, target_embeds = build_drafter(config, tensors, "cpu", dt)
    states = open_states(Path(a.states))
    sets = all_wirings(list(states.layers), 3)
    stride = max(1, len(sets) // a.wirings)
    sets = sets[::stride][:a.wirings]
    bound = dataclasses.replace(NO_DROP, max_positions=a.positions)
    prof = cProfile.Profile()
    t0, c0 = time.perf_counter(), time.process_time()
    if not a.no_profile:
        prof.enable()
    res, kept = screen(drafter, states, sets, rows=states.num_sequences, target_embeds=target_embeds, bound=bound)
    if not a.no_profile:
        prof.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    work = res.work
    s = io.StringIO()
    if not a.no_profile:
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(a.top)
    out = {"tree": a.tree, "wirings": len(sets), "positions": res.positions, "log_scored": res.stages[-1]["positions"],
           "work": work, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
           "wiring_positions_per_s": round(work / wall, 1), "wiring_positions_per_cpu_s": round(work / cpu, 1),
           "threads": torch.get_num_threads(), "dtype": a.dtype, "phases": res.phase_seconds,
           "loadavg": open("/proc/loadavg").read().split()[:3]}
    print(json.dumps(out, indent=1))
    if not a.no_profile:
        print(s.getvalue())
    if a.dump:
        torch.save({"sets": [[r.output_of for r in ls] for ls in sets], "vectors": res.vectors,
                    "hits": res.hit_vectors, "pos_row": res.pos_row}, a.dump)
    if a.out:
        if not a.no_profile:
            out["profile_top"] = s.getvalue().splitlines()[:a.top + 12]
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
