"""What a process pays the first time it runs the draft chain, and what could cut it.

A fresh ``eagle3conv verify`` on a GPU spends ~1.4-1.9 s in its first ``draft_chain`` call (0.15 s
the second time, bench/README.md). This runs the first call and five more in fresh processes, one per
(family, variant), two rounds in alternating order, for Kimi-K2.5-size drafters (random bf16):

- ``as shipped``: the package's chain;
- ``cuDNN SDPA off``: ``torch.backends.cuda.enable_cudnn_sdp(False)``, to see what cuDNN's per-shape
  set-up costs;
- ``one key length per step``: the training-time-test attention of steps 2+ attends every chunk to
  all of step 1's keys, masked past the chunk (one SDPA shape per step instead of one per chunk).

Each variant is checked against the package's chain in the same process (share of equal argmax ids
and the largest logit difference). One JSON document to $OUT/first_call.json (or --out).

    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 bench/first_call.py
    PYTHONPATH=. .venv/bin/python bench/first_call.py --small --out /tmp/first_call.json   # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = ("as shipped", "cuDNN SDPA off", "one key length per step")


def fixed_length_attention(self, q, *, enable_gqa, scale):
    """ChainKeys.attention with every chunk of a step attending all of step 1's keys (masked from
    the chunk's end on): the same result, one SDPA shape per step (but a shorter last chunk)."""
    import torch
    import torch.nn.functional as F

    seq, n = self.seq, len(self.extra_k)
    out = q.new_empty(*q.shape[:-1], self.v.shape[-1])
    device = q.device
    for a in range(0, seq, self.chunk):
        b = min(a + self.chunk, seq)
        size = b - a
        lo = self.pad - n * size
        for j, (kj, vj) in enumerate(zip(self.extra_k, self.extra_v, strict=True)):
            rows = slice(lo + j * size, lo + (j + 1) * size)
            self.k[:, rows].copy_(kj[:, :, a:b].transpose(1, 2))
            self.v[:, rows].copy_(vj[:, :, a:b].transpose(1, 2))
        k = self.k[:, lo:].transpose(1, 2)
        v = self.v[:, lo:].transpose(1, 2)
        eye = torch.eye(size, dtype=torch.bool, device=device)
        mask = torch.cat([eye.repeat(1, n), torch.ones(size, a, dtype=torch.bool, device=device),
                          torch.ones(size, size, dtype=torch.bool, device=device).tril(),
                          torch.zeros(size, seq - b, dtype=torch.bool, device=device)], dim=1)
        out[:, :, a:b] = F.scaled_dot_product_attention(q[:, :, a:b], k, v, attn_mask=mask, enable_gqa=enable_gqa,
                                                        scale=scale)
    return out


def child(folder: Path, variant: str, small: bool) -> dict:
    t_start = time.perf_counter()
    import torch

    sys.path.insert(0, str(HERE))
    import bench_verify_gpu as b
    from eagle3conv.model import drafter as drafter_mod
    from eagle3conv.verify import build_drafter, load_drafter_weights

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    config, tensors = load_drafter_weights(folder)
    drafter, _ = build_drafter(config, tensors, dev, torch.bfloat16)
    del tensors
    mla = "mla" in folder.name
    d = b.make_mla_dims(small) if mla else b.make_dims(small)
    S, B = (64, 2) if small else (2048, 8)
    gen = torch.Generator(device=dev).manual_seed(1)
    drafter.embed_tokens = (torch.randn(d["V"], d["H"], generator=gen, device=dev) * 0.02).to(torch.bfloat16)
    aux = torch.randn(B, S, d["k"] * d["T"], generator=gen, device=dev).to(torch.bfloat16)
    ids = torch.randint(0, d["V"], (B, S), generator=gen, device=dev)
    b.sync(dev)
    res: dict = {"import_and_load_s": round(time.perf_counter() - t_start, 3)}
    own = drafter_mod.ChainKeys.attention
    if variant == "cuDNN SDPA off":
        torch.backends.cuda.enable_cudnn_sdp(False)
    elif variant == "one key length per step":
        drafter_mod.ChainKeys.attention = fixed_length_attention
    t = time.perf_counter()
    first = drafter.draft_chain(aux, ids, 3)
    b.sync(dev)
    res["first_call_s"] = round(time.perf_counter() - t, 3)
    ts = sorted(b.time_gpu(lambda: drafter.draft_chain(aux, ids, 3), dev, 0, 5))
    res["steady_ms"] = round(ts[len(ts) // 2] * 1e3, 2)
    res["steady_ms_all"] = [round(x * 1e3, 2) for x in ts]
    # the same numbers as the package's chain?
    drafter_mod.ChainKeys.attention = own
    torch.backends.cuda.enable_cudnn_sdp(True)
    ref = drafter.draft_chain(aux, ids, 3)

    res["equal_ids_share_per_step"] = [round(float((a == r).float().mean()), 5)
                                       for a, r in zip(first.target_ids, ref.target_ids)]
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--workdir", default="/tmp/eagle3conv-bench-first-call")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", nargs=2, metavar=("FOLDER", "VARIANT"), help=argparse.SUPPRESS)
    ap.add_argument("--make", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    work = Path(args.workdir)
    if args.child:
        print(json.dumps(child(Path(args.child[0]), args.child[1], args.small)))
        return 0
    if args.make:
        import torch

        sys.path.insert(0, str(HERE))
        import bench_verify_gpu as b

        dev = "cuda" if torch.cuda.is_available() else "cpu"
        b.write_drafter(work / "drafter", b.make_dims(args.small), (2, 30, 58), dev)
        b.write_mla_drafter(work / "drafter-mla", b.make_mla_dims(args.small), (2, 30, 58), dev)
        return 0
    out_path = Path(args.out or os.path.join(os.environ.get("OUT", "/tmp"), "first_call.json"))
    small = ["--small"] if args.small else []
    me = str(Path(__file__).resolve())
    subprocess.run([sys.executable, me, "--make", "--workdir", str(work), *small], check=True)
    res: dict = {"runs": []}
    for rnd in range(args.rounds):
        order = [(fam, v) for fam in ("llama", "mla") for v in VARIANTS]
        if rnd % 2:
            order.reverse()
        for fam, v in order:
            folder = work / ("drafter-mla" if fam == "mla" else "drafter")
            t = time.perf_counter()
            p = subprocess.run([sys.executable, me, "--child", str(folder), v, *small], capture_output=True, text=True)
            row = {"family": fam, "variant": v, "round": rnd, "process_s": round(time.perf_counter() - t, 3)}
            if p.returncode:
                row["error"] = p.stderr[-1500:]
            else:
                row.update(json.loads(p.stdout.strip().splitlines()[-1]))
            res["runs"].append(row)
            print("[first_call]", row, file=sys.stderr, flush=True)
            out_path.write_text(json.dumps(res, indent=1))
    import statistics

    summary: dict = {}
    for fam in ("llama", "mla"):
        for v in VARIANTS:
            rows = [r for r in res["runs"] if r["family"] == fam and r["variant"] == v and "first_call_s" in r]
            if rows:
                summary[f"{fam}: {v}"] = {
                    "first_call_s": statistics.median(r["first_call_s"] for r in rows),
                    "steady_ms": statistics.median(r["steady_ms"] for r in rows),
                    "equal_ids_share_per_step": [r["equal_ids_share_per_step"] for r in rows]}
    res["summary"] = summary
    out_path.write_text(json.dumps(res, indent=1))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
