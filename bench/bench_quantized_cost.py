"""What quantization costs the trained SmolLM2 drafter, on real captured SmolLM2 states.

The fixture (tests/data/smollm2-drafter) quantized by compressed-tensors' own presets
(tests/quant_producer.py: FP8_DYNAMIC, NVFP4; lm_head kept in bf16), converted by fix-keys, then
``verify --reference tests/data/smollm2-drafter`` on the first N held-out conversations
(tests/data/smollm2-heldout.jsonl, teacher-forced, captured fresh): the accept-length difference
with its paired 95% interval. Also SGLang 0.5.23's fc (a plain bf16 Linear) as it would load the FP8
drafter: codes unscaled. CPU only; prints a table and writes the figures as JSON.

    python bench/bench_quantized_cost.py --conversations 40 --json bench/results/quantized_cost_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=40)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    from quant_producer import quantize_drafter

    from eagle3conv.api import fix_keys
    from eagle3conv.states.capture import capture_states
    from eagle3conv.states.target_model import load_target_model
    from eagle3conv.verify import verify
    from eagle3conv.wiring.apply import WiringOptions

    fixture = ROOT / "tests" / "data" / "smollm2-drafter"
    chats = [json.loads(x) for x in (ROOT / "tests" / "data" / "smollm2-heldout.jsonl").read_text().splitlines() if x]
    work = Path(tempfile.mkdtemp(prefix="e3c-qcost-"))
    target = load_target_model("smollm2-135m")
    states = work / "states.safetensors"
    capture_states(target.model, target.tokenizer, chats[:a.conversations], states, layers=[1, 14, 26],
                   batch_size=10, dtype="bf16", target=target.name)
    vllm = WiringOptions(engines=("vllm==0.33.0",))
    from quant_producer import input_amax

    amax = input_amax(fixture, states)
    rows = {}
    for name, preset, raw, act in (
            ("FP8 (per-row weights, dynamic activations)", "FP8_DYNAMIC", (), None),
            ("NVFP4", "NVFP4", (), None),
            ("FP8 as SGLang 0.5.23 loads fc (codes unscaled)", "FP8_DYNAMIC", ("fc",), None),
            ("FP8 static (per-tensor weights and input_scale, calibrated)", "FP8", (), amax),
            ("FP8 static, input_scale 30x too small", "FP8", (), {k: v / 30 for k, v in amax.items()})):
        tag = f"{preset}-{'bad' if act is not None and act is not amax else 'ok'}"
        src = work / f"{tag}-src"
        if not src.exists():
            quantize_drafter(fixture, src, preset, input_amax=act)
            fix_keys(src, out=work / tag, wiring_options=vllm)
        res = verify(work / tag, states, reference_drafter=fixture, wiring_options=vllm, save=False,
                     raw_modules=raw)
        rows[name] = res.quantization
    print(f"states: {a.conversations} conversations, {res.main.positions} positions scored" if hasattr(res.main, "positions")
          else f"states: {a.conversations} conversations")
    print("| drafter | accept length | bf16 reference | difference [paired 95%] |\n|---|---|---|---|")
    for name, c in rows.items():
        lo, hi = c["ci95"]
        print(f"| {name} | {c['accept_length']:.3f} | {c['reference_accept_length']:.3f} | "
              f"{c['difference']:+.4f} [{lo:+.4f}, {hi:+.4f}] |")
    if a.json:
        a.json.write_text(json.dumps({"conversations": a.conversations, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
