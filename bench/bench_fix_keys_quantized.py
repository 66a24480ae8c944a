"""fix-keys on a quantized Kimi-K2.5-size drafter, side by side with ``cp``.

The drafter: bench_fix_keys.py's shapes (hidden 7168, intermediate 18432, 64 heads x 128, 8 kv
heads, draft vocab 32000), every linear module but lm_head stored as Model Optimizer FP8 (E4M3
codes, a per-tensor fp32 weight_scale and input_scale; quant_method modelopt, quant_algo FP8,
lm_head in ignore), no embed_tokens; one safetensors file. Each round runs, interleaved:

* ``cp`` of the file;
* ``fix-keys --out --engine vllm==0.33.0``: every tensor carried byte for byte (and proven);
* ``fix-keys --out --engine sglang==0.5.23 --dequantize fc``: the same, with fc (7168 x 21504)
  written in bf16, dequantized a block of rows at a time.

Reports medians, the ratio to cp, and peak RSS (GNU time).

    python bench/bench_fix_keys_quantized.py --rounds 3            # full size (about 1.9 GB)
    python bench/bench_fix_keys_quantized.py --rounds 2 --scale 0.25
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fix_keys import KIMI, timed  # noqa: E402


def write_fp8_drafter(folder: Path, scale: float = 1.0) -> int:
    """The FP8 drafter, streamed (never all in memory)."""
    import numpy as np

    d = dict(KIMI)
    if scale != 1.0:
        d["V"], d["I"], d["Vd"] = int(d["V"] * scale), int(d["I"] * scale), int(d["Vd"] * scale)
    H, I, NH, NKV, HD, Vd, V, k = (d[x] for x in ("H", "I", "NH", "NKV", "HD", "Vd", "V", "k"))
    linear = {"fc": [H, k * H], "midlayer.self_attn.q_proj": [NH * HD, 2 * H],
              "midlayer.self_attn.k_proj": [NKV * HD, 2 * H], "midlayer.self_attn.v_proj": [NKV * HD, 2 * H],
              "midlayer.self_attn.o_proj": [H, NH * HD], "midlayer.mlp.gate_proj": [I, H],
              "midlayer.mlp.up_proj": [I, H], "midlayer.mlp.down_proj": [H, I]}
    specs = {f"{m}.weight": ("F8_E4M3", s) for m, s in linear.items()}
    specs.update({f"{m}.{x}": ("F32", []) for m in linear for x in ("weight_scale", "input_scale")})
    specs.update({"midlayer.input_layernorm.weight": ("BF16", [H]), "midlayer.hidden_norm.weight": ("BF16", [H]),
                  "midlayer.post_attention_layernorm.weight": ("BF16", [H]), "norm.weight": ("BF16", [H]),
                  "lm_head.weight": ("BF16", [Vd, H]), "d2t": ("I64", [Vd])})
    size = {"F8_E4M3": 1, "BF16": 2, "F32": 4, "I64": 8}
    header = {"__metadata__": {"format": "pt"}}
    pos = 0
    order = sorted(specs, key=lambda n: (-size[specs[n][0]], n))
    for n in order:
        dt, shape = specs[n]
        nb = int(np.prod(shape, dtype=np.int64)) * size[dt]
        header[n] = {"dtype": dt, "shape": shape, "data_offsets": [pos, pos + nb]}
        pos += nb
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    rng = np.random.default_rng(0)
    fp8 = rng.integers(0, 0x7E, 8 << 20, dtype=np.uint8)  # finite E4M3 codes, both signs below
    fp8[::2] |= 0x80
    bf16 = ((rng.standard_normal(4 << 20, dtype=np.float32) * 0.02).view(np.uint32) >> 16).astype(np.uint16)
    tids = np.sort(rng.choice(V, Vd, replace=False))
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for n in order:
            dt, shape = specs[n]
            if n == "d2t":
                f.write((tids - np.arange(Vd)).astype(np.int64).tobytes())
                continue
            if dt == "F32":
                f.write(np.float32(0.0123 if n.endswith("weight_scale") else 0.05).tobytes())
                continue
            left = int(np.prod(shape, dtype=np.int64)) * size[dt]
            block = (fp8 if dt == "F8_E4M3" else bf16).tobytes()
            while left:
                chunk = block[: min(left, len(block))]
                f.write(chunk)
                left -= len(chunk)
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": I, "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD,
           "num_hidden_layers": 1, "vocab_size": V, "draft_vocab_size": Vd, "rms_norm_eps": 1e-5,
           "rope_theta": 50000.0, "torch_dtype": "bfloat16",
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57], "use_aux_hidden_state": True},
           "quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["lm_head"],
                                   "producer": {"name": "modelopt"}}}
    (folder / "config.json").write_text(json.dumps(cfg))
    return pos


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--json", type=Path, help="also write the medians here")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="e3c-q-"))
    src = work / "src"
    src.mkdir()
    nbytes = write_fp8_drafter(src, a.scale)
    print(f"drafter: {nbytes / 1e9:.2f} GB", file=sys.stderr)
    py = [sys.executable, "-m", "eagle3conv", "fix-keys", str(src)]
    cases = {"cp": None,
             "fix-keys --out (vllm, carried)": ["--engine", "vllm==0.33.0"],
             "fix-keys --out --dequantize fc (sglang)": ["--engine", "sglang==0.5.23", "--dequantize", "fc"]}
    res: dict[str, list[tuple[float, int]]] = {c: [] for c in cases}
    try:
        for r in range(a.rounds):
            names = list(cases) if r % 2 == 0 else [list(cases)[0], *list(cases)[:0:-1]]
            for case in names:
                d = work / "run"
                shutil.rmtree(d, ignore_errors=True)
                d.mkdir()
                subprocess.run(["sync"])
                extra = cases[case]
                cmd = ["cp", str(src / "model.safetensors"), str(d / "copy")] if extra is None else \
                    [*py, "--out", str(d / "o"), *extra]
                res[case].append(timed(cmd))
                w, rss = res[case][-1]
                print(f"round {r + 1} {case}: {w:.2f} s, {rss / 2**20:.0f} MiB", file=sys.stderr)
    finally:
        shutil.rmtree(work)
    cp = statistics.median(w for w, _ in res["cp"])
    out = {}
    print(f"| case | median s | x cp | peak RSS |\n|---|---|---|---|")
    for case, runs in res.items():
        med = statistics.median(w for w, _ in runs)
        rss = max(m for _, m in runs)
        out[case] = {"median_s": round(med, 3), "x_cp": round(med / cp, 3), "peak_rss_mib": round(rss / 2**20)}
        print(f"| `{case}` | {med:.2f} | {med / cp:.2f} | {rss / 2**20:.0f} MiB |")
    if a.json:
        a.json.write_text(json.dumps({"bytes": nbytes, "rounds": a.rounds, "scale": a.scale, "cases": out}, indent=2))


if __name__ == "__main__":
    main()
