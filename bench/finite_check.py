"""What verify's finiteness check costs (issue 25 item 10): one NaN or +-Inf anywhere the drafter
reads refuses the states; the check is ``isfinite`` on each batch already on the device, reduced into
one flag per slot, read back once at the end (``verify/evaluate.py`` ``_finite_at``).

This scores the SmolLM2 drafter (tests/data/smollm2-drafter) on SmolLM2-135M states of the 10 held-out
prompts of tests/test_e2e_smollm2.py (captured here with every layer, fp32, 64 generated tokens, as
that test does; or --states FILE), running ``evaluate`` on the config's wiring with the check as
shipped and without it (``check_finite=False``), interleaved, --rounds times each, in one process. One JSON
document on stdout (or --out).

    PYTHONPATH=. .venv/bin/python bench/finite_check.py                    # CPU
    PYTHONPATH=. .venv/bin/python bench/finite_check.py --device cuda      # GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def capture(out: Path) -> Path:
    from test_e2e_smollm2 import HELDOUT

    from eagle3conv.states.capture import capture_states
    from eagle3conv.states.target_model import load_target_model

    target = load_target_model("smollm2-135m")
    capture_states(target.model, target.tokenizer, HELDOUT, out, layers=None, generate_tokens=64, batch_size=10,
                   dtype="fp32", target=target.name)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--states", type=Path)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    import torch

    from eagle3conv.spec.layers import outputs
    from eagle3conv.states.readers import open_states
    from eagle3conv.verify import evaluate as ev
    from eagle3conv.verify.inputs import build_drafter, load_drafter_weights

    states_path = a.states or capture(Path(tempfile.mkdtemp()) / "states.safetensors")
    states = open_states(states_path)
    config, tensors = load_drafter_weights(REPO / "tests" / "data" / "smollm2-drafter")
    drafter, target_embeds = build_drafter(config, tensors, a.device, torch.float32)
    cand = ev.Candidate("config", outputs(1, 14, 26), "bench")
    times: dict[str, list[float]] = {"check": [], "no check": []}
    for r in range(a.rounds + 1):  # round 0 warms up
        for name in (("check", "no check") if r % 2 else ("no check", "check")):
            if a.device.startswith("cuda"):
                torch.cuda.synchronize()
            t = time.perf_counter()
            score = ev.evaluate(drafter, states, cand, steps=3, batch_size=16, target_embeds=target_embeds,
                                check_finite=name == "check")
            if a.device.startswith("cuda"):
                torch.cuda.synchronize()
            if r:
                times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    doc = {"device": a.device, "states": str(states_path), "sequences": states.num_sequences,
           "positions": states.num_tokens, "scored": score.tokens, "rounds": a.rounds,
           "seconds": times, "median_s": med, "check_share": round(med["check"] / med["no check"] - 1, 4)}
    text = json.dumps(doc, indent=2)
    if a.out:
        a.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
