"""Check a ``capture --engine vllm`` folder against the same target run by transformers (GPU).

For every ``hs_{i}.safetensors`` of the folder, its ``token_ids`` are run through the
transformers target (teacher-forced, one forward, ``output_hidden_states``; the last
layer's output taken pre-norm by a hook, as ``capture`` does), and each slot of
``hidden_states`` is compared with the state eagle3conv's sidecar says it is
(``eagle3conv-capture.json`` ``layers``): cosine similarity and relative L2 error per
slot over every position. At the response positions the target's greedy argmax is
compared with the file's next token (the response vLLM generated greedily). Prints one
JSON object; writes it to ``--json`` too.

    python bench/vllm_capture/compare.py --states DIR --target MODEL_FOLDER [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors import safe_open


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--states", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--json")
    ap.add_argument("--dtype", default="bfloat16")
    a = ap.parse_args()

    from transformers import AutoModelForCausalLM

    folder = Path(a.states)
    side = json.loads((folder / "eagle3conv-capture.json").read_text())
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(a.target, dtype=getattr(torch, a.dtype)).to(dev).eval()
    last = {}
    model.model.layers[-1].register_forward_hook(lambda m, i, o: last.__setitem__("h", o[0] if isinstance(o, tuple) else o))
    n_layers = model.config.num_hidden_layers
    slots = [x["output_of"] for x in side["layers"]]
    cos = [[] for _ in slots]
    rel = [[] for _ in slots]
    agree = total = 0
    for seq in side["sequences"]:
        with safe_open(str(folder / seq["file"]), framework="pt") as f:
            hs, ids = f.get_tensor("hidden_states").float(), f.get_tensor("token_ids")
        with torch.inference_mode():
            out = model(input_ids=ids[None].to(dev), output_hidden_states=True, use_cache=False)
        for k, o in enumerate(slots):
            ref = (last["h"] if o == n_layers - 1 else out.hidden_states[o + 1])[0].float().cpu()
            got = hs[:, k]
            cos[k].append(torch.nn.functional.cosine_similarity(got, ref, dim=-1))
            rel[k].append((got - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-6))
        start, n = seq["prompt_tokens"], seq["tokens"]
        if start < n:
            nxt = torch.cat([ids[1:], torch.tensor([seq["next_token"]])])
            pred = out.logits[0].argmax(-1).cpu()
            sl = slice(max(start - 1, 0), n)
            agree += int((pred[sl] == nxt[sl]).sum())
            total += n - sl.start
    res = {
        "sequences": len(side["sequences"]), "vllm_layer_ids": side["vllm_layer_ids"],
        "slots": [{"output_of": o, "cosine_min": round(float(torch.cat(c).min()), 5),
                   "cosine_median": round(float(torch.cat(c).median()), 5),
                   "relative_error_median": round(float(torch.cat(r).median()), 5)}
                  for o, c, r in zip(slots, cos, rel)],
        "greedy_agreement_on_responses": round(agree / total, 5) if total else None,
        "response_positions": total, "transformers_dtype": a.dtype,
    }
    print(json.dumps(res, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
