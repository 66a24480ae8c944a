"""fix-keys --out against `cp` of the same file, side by side, on a Kimi-K2.5-size drafter.

The drafter: hidden 7168, intermediate 18432, 64 heads x 128, 8 kv heads, draft
vocab 32000, a 163840 x 7168 embed_tokens; bf16; one safetensors file in
Model Optimizer's export naming (layers.0.*): about 4.3 GB.

Each round runs, in turn: `cp`, `eagle3conv fix-keys --out` (default: drops
embed_tokens), `eagle3conv fix-keys --out --keep-embed` (moves every byte cp
moves) and, with --baseline, safetensors load_file + rename + save_file. Wall
time and peak RSS (from wait4's ru_maxrss) of each child process. Reports
medians and the ratio to cp's median.

    python bench/bench_fix_keys.py --rounds 3 [--scale 0.5] [--baseline]
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
import time
from pathlib import Path

KIMI = dict(H=7168, I=18432, NH=64, NKV=8, HD=128, Vd=32000, V=163840, k=3)


def write_drafter(path: Path, scale: float = 1.0) -> int:
    """A Kimi-size drafter as one safetensors file, streamed (never all in memory)."""
    import numpy as np

    d = dict(KIMI)
    if scale != 1.0:
        d["V"] = int(d["V"] * scale)
        d["I"] = int(d["I"] * scale)
        d["Vd"] = int(d["Vd"] * scale)
    H, I, NH, NKV, HD, Vd, V, k = (d[x] for x in ("H", "I", "NH", "NKV", "HD", "Vd", "V", "k"))
    specs = {
        "embed_tokens.weight": ("BF16", [V, H]),
        "fc.weight": ("BF16", [H, k * H]),
        "layers.0.self_attn.q_proj.weight": ("BF16", [NH * HD, 2 * H]),
        "layers.0.self_attn.k_proj.weight": ("BF16", [NKV * HD, 2 * H]),
        "layers.0.self_attn.v_proj.weight": ("BF16", [NKV * HD, 2 * H]),
        "layers.0.self_attn.o_proj.weight": ("BF16", [H, NH * HD]),
        "layers.0.mlp.gate_proj.weight": ("BF16", [I, H]),
        "layers.0.mlp.up_proj.weight": ("BF16", [I, H]),
        "layers.0.mlp.down_proj.weight": ("BF16", [H, I]),
        "layers.0.input_layernorm.weight": ("BF16", [H]),
        "layers.0.hidden_norm.weight": ("BF16", [H]),
        "layers.0.post_attention_layernorm.weight": ("BF16", [H]),
        "norm.weight": ("BF16", [H]),
        "lm_head.weight": ("BF16", [Vd, H]),
        "d2t": ("I64", [Vd]),
    }
    size = {"BF16": 2, "I64": 8}
    header = {"__metadata__": {"format": "pt"}}
    pos = 0
    order = sorted(specs, key=lambda n: (-size[specs[n][0]], n))
    for n in order:
        dt, shape = specs[n]
        nb = int(np.prod(shape)) * size[dt]
        header[n] = {"dtype": dt, "shape": shape, "data_offsets": [pos, pos + nb]}
        pos += nb
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    rng = np.random.default_rng(0)
    block = (rng.standard_normal(8 << 20, dtype=np.float32) * 0.02).astype(np.float32).view(np.uint32)
    block = (block >> 16).astype(np.uint16).tobytes()  # bf16 bit patterns
    tids = np.sort(rng.choice(V, Vd, replace=False))
    d2t = (tids - np.arange(Vd)).astype(np.int64)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for n in order:
            dt, shape = specs[n]
            if n == "d2t":
                f.write(d2t.tobytes())
                continue
            left = int(np.prod(shape)) * 2
            while left:
                chunk = block[: min(left, len(block))]
                f.write(chunk)
                left -= len(chunk)
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
        "intermediate_size": I, "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD,
        "num_hidden_layers": 1, "vocab_size": V, "draft_vocab_size": Vd, "rms_norm_eps": 1e-5,
        "rope_theta": 50000.0, "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57], "use_aux_hidden_state": True},
    }
    (path.parent / "config.json").write_text(json.dumps(cfg, indent=2))
    return path.stat().st_size


def timed(cmd: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one command.

    RSS comes from GNU time (a small process that forks and execs the command):
    a child forked from this Python process would inherit its max RSS.
    """
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        t = time.perf_counter()
        r = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss.name, *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wall = time.perf_counter() - t
        if r.returncode != 0:
            raise SystemExit(f"{cmd} failed: {r.stderr.decode()[-2000:]}")
        return wall, int(rss.read().strip().splitlines()[-1]) * 1024


BASELINE = """
import sys
from safetensors.torch import load_file, save_file
t = load_file(sys.argv[1])
t = {k.replace('layers.0.', 'midlayer.'): v for k, v in t.items()}
save_file(t, sys.argv[2], metadata={'format': 'pt'})
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0, help="shrink vocab/intermediate (memory-growth check)")
    ap.add_argument("--baseline", action="store_true", help="also time load_file+save_file")
    ap.add_argument("--dir", default=None, help="work folder (default: a temp folder on /tmp)")
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args()
    work = Path(a.dir or tempfile.mkdtemp(prefix="e3c-bench-"))
    src = work / "src"
    src.mkdir(parents=True, exist_ok=True)
    nbytes = write_drafter(src / "model.safetensors", a.scale)
    print(f"drafter: {nbytes / 1e9:.2f} GB at {src}", file=sys.stderr)
    exe = [sys.executable, "-m", "eagle3conv"]
    cases = {
        "cp": lambda d: ["cp", str(src / "model.safetensors"), str(d / "copy.safetensors")],
        "fix-keys --out": lambda d: exe + ["fix-keys", str(src), "--out", str(d / "o")],
        "fix-keys --out --keep-embed": lambda d: exe + ["fix-keys", str(src), "--out", str(d / "o"), "--keep-embed"],
    }
    if a.baseline:
        cases["load_file+save_file"] = lambda d: [sys.executable, "-c", BASELINE, str(src / "model.safetensors"), str(d / "b.safetensors")]
    results: dict[str, list[tuple[float, int]]] = {k: [] for k in cases}
    for r in range(a.rounds):
        for name, make in cases.items():
            d = work / "run"
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
            subprocess.run(["sync"])
            results[name].append(timed(make(d)))
            shutil.rmtree(d)
            print(f"round {r + 1} {name}: {results[name][-1][0]:.2f} s, {results[name][-1][1] / 2**20:.0f} MiB", file=sys.stderr)
    cp = statistics.median(w for w, _ in results["cp"])
    summary = {
        "bytes": nbytes,
        "rounds": a.rounds,
        "cases": {
            name: {
                "median_s": statistics.median(w for w, _ in v),
                "ratio_to_cp": statistics.median(w for w, _ in v) / cp,
                "peak_rss_mib": max(m for _, m in v) / 2**20,
                "all_s": [round(w, 3) for w, _ in v],
            }
            for name, v in results.items()
        },
    }
    print(f"{'case':32} {'median s':>9} {'x cp':>6} {'peak RSS MiB':>13}")
    for name, s in summary["cases"].items():
        print(f"{name:32} {s['median_s']:9.2f} {s['ratio_to_cp']:6.2f} {s['peak_rss_mib']:13.0f}")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(summary, indent=2))
    if not a.dir:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
