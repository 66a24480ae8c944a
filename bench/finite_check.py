"""What verify's finiteness check costs (issue 25 item 10): one NaN or +-Inf anywhere the drafter
reads refuses the states; the check is ``isfinite`` on what each batch already has on the device (the
per-token norms of the aux slots, and each token's sum of the embedding outputs: NaN or Inf whenever
a value is), reduced into one flag per slot, read back once at the end (``verify/evaluate.py``).

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


def ops(states, cand, device: str, reps: int) -> dict:
    """The check's own work against the per-token norms evaluate already computes, on the same
    tensors (every sequence's aux slots, as evaluate reads them), interleaved, ``reps`` times each:
    the same expression as ``verify/evaluate.py`` ``_finite_at``."""
    import torch

    from eagle3conv.verify.feed import batches

    (_, _, aux, _), = list(batches(states, cand.layers, total=states.num_sequences, batch_size=states.num_sequences,
                                   with_embeddings=False, device=torch.device(device), dtype=torch.float32,
                                   feeder=False))
    mask = states.attention_mask.to(device).bool()
    B, S, kT = aux.shape
    k, T = len(cand.layers), kT // len(cand.layers)
    norms = [torch.linalg.vector_norm(aux[..., s * T:(s + 1) * T], dim=-1, dtype=torch.float32) for s in range(k)]
    emb = aux[..., :T].contiguous()  # an embedding-sized tensor: evaluate checks each token's sum
    work = {"check on the norms": lambda: (torch.isfinite(torch.stack(norms, -1)[..., None]).all(-1)
                                           | ~mask[..., None]).all(0).all(0),
            "check on the embeddings": lambda: (torch.isfinite(emb.sum(-1, dtype=torch.float32)[..., None, None])
                                                .all(-1) | ~mask[..., None]).all(0).all(0),
            "isfinite on every aux value": lambda: (torch.isfinite(aux.reshape(B, S, k, T)).all(-1)
                                                    | ~mask[..., None]).all(0).all(0),
            "norms (already done)": lambda: [torch.linalg.vector_norm(aux[..., s * T:(s + 1) * T], dim=-1,
                                                                      dtype=torch.float32) for s in range(k)]}
    out: dict[str, list[float]] = {n: [] for n in work}
    for r in range(reps + 1):
        for name in (list(work) if r % 2 else list(work)[::-1]):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t = time.perf_counter()
            work[name]()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            if r:
                out[name].append(time.perf_counter() - t)
    med = {n: statistics.median(v) for n, v in out.items()}
    return {"shape": [B, S, kT], "median_ms": {n: round(v * 1e3, 3) for n, v in med.items()},
            "shipped_check_over_norms": round((med["check on the norms"] + med["check on the embeddings"])
                                              / med["norms (already done)"], 3)}


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
    from eagle3conv.verify.evaluate import Candidate, evaluate
    from eagle3conv.verify.inputs import build_drafter, load_drafter_weights

    states_path = a.states or capture(Path(tempfile.mkdtemp()) / "states.safetensors")
    states = open_states(states_path)
    config, tensors = load_drafter_weights(REPO / "tests" / "data" / "smollm2-drafter")
    drafter, target_embeds = build_drafter(config, tensors, a.device, torch.float32)
    cand = Candidate("config", outputs(1, 14, 26), "bench")
    times: dict[str, list[float]] = {"check": [], "no check": []}
    for r in range(a.rounds + 1):  # round 0 warms up
        for name in (("check", "no check") if r % 2 else ("no check", "check")):
            if a.device.startswith("cuda"):
                torch.cuda.synchronize()
            t = time.perf_counter()
            score = evaluate(drafter, states, cand, steps=3, batch_size=16, target_embeds=target_embeds,
                            check_finite=name == "check")
            if a.device.startswith("cuda"):
                torch.cuda.synchronize()
            if r:
                times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    doc = {"device": a.device, "states": str(states_path), "sequences": states.num_sequences,
           "positions": states.num_tokens, "scored": score.tokens, "rounds": a.rounds,
           "seconds": times, "median_s": med, "check_share": round(med["check"] / med["no check"] - 1, 4),
           "ops": ops(states, cand, a.device, a.rounds * 4)}
    text = json.dumps(doc, indent=2)
    if a.out:
        a.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
