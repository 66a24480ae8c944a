"""Reading the real formats against eagle3conv's own states file, on the same states (issue 26).

One set of random bf16 states (``--sequences`` x ``--seq-len`` tokens, hidden ``--hidden``, ``--slots``
stored layers: the aux slots plus the last layer) is written as:

* eagle3conv ``states.safetensors`` (StatesWriter; the embedding output too, as capture writes it),
* vLLM hidden-states files ``hs_<i>.safetensors`` (safetensors ``save_file`` of ``hidden_states
  [S, n, T]`` + ``token_ids``, as vLLM 0.33.0's connector writes them: docs/states-formats.md),
* a NeMo Automodel 0.7.0 EAGLE-3 cache (manifest + shards via ``save_file``, what its ``write_shard``
  does; ``target_probs`` as top-``--topk`` of a ``--draft-vocab`` distribution),
* SpecForge 0.2.0 records (``torch.save`` of its dict per sample).

Each round reads every format once, in a rotated order: open it and stream the aux slots of every
sequence through ``eagle3conv.verify.feed.batches`` exactly as verify does (on CUDA the states file goes
through verify's GpuFeeder, the other formats through their readers in the prefetch thread; on CUDA each
batch is waited for). The figure is the median over rounds of each format's seconds divided by the
states file's in the same round. On CPU every page of each batch is touched (a reader may return a
lazy view of a memory-mapped file); on CUDA the upload reads it. Run:

    python bench/bench_states_formats.py --out bench/results/states_formats_cpu.json          # CPU, small
    python bench/bench_states_formats.py --device cuda --hidden 7168 --slots 4 --sequences 8 \\
        --seq-len 2048 --rounds 5 --out bench/results/states_formats_h200.json                 # Kimi-size
"""

from __future__ import annotations

import argparse
import io
import json
import math
import platform
import statistics
import tempfile
import time
from pathlib import Path


def write_all(root: Path, a) -> dict[str, Path]:
    import torch
    from safetensors.torch import save_file

    from eagle3conv.states.format import StatesWriter

    g = torch.Generator().manual_seed(0)
    b, s, t, k = a.sequences, a.seq_len, a.hidden, a.slots
    n_layers = a.num_layers
    layers = list(range(n_layers - k, n_layers))  # k stored layers, the last one included
    ids = torch.randint(0, a.vocab, (b, s), generator=g)
    lengths = [s - (i * 7) % max(1, s // 8) for i in range(b)]
    mask = torch.arange(s).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    out = {"eagle3conv": root / "states.safetensors"}
    with StatesWriter(out["eagle3conv"], num_sequences=b, seq_len=s, hidden_size=t, num_layers=n_layers,
                      vocab_size=a.vocab, layers=layers, dtype="bf16", with_loss_mask=True) as w:
        for i in range(b):
            hid = {r: (torch.randn(1, s, t, generator=g) * mask[i, None, :, None]).bfloat16() for r in [-1, *layers]}
            w.write(i, input_ids=(ids[i:i + 1] * mask[i]), attention_mask=mask[i:i + 1], target_next=ids[i:i + 1] * mask[i],
                    hidden=hid, loss_mask=mask[i:i + 1])
            n = lengths[i]
            vdir = root / "vllm"
            vdir.mkdir(exist_ok=True)
            save_file({"hidden_states": torch.stack([hid[r][0, :n] for r in layers], dim=1).contiguous(),
                       "token_ids": ids[i, :n].clone()}, str(vdir / f"hs_{i}.safetensors"))
            sdir = root / "specforge" / "rows_0-2000"
            sdir.mkdir(parents=True, exist_ok=True)
            buf = io.BytesIO()
            torch.save({"input_ids": ids[i, :n].clone(), "loss_mask": torch.ones(n, dtype=torch.long),
                        "hidden_state": hid[layers[-1]][:, :n].clone(),
                        "aux_hidden_state": torch.cat([hid[r][:, :n] for r in layers[:-1]], dim=-1)}, buf)
            (sdir / f"data_{i}.ckpt").write_bytes(buf.getvalue())
    out["vllm"], out["specforge"] = root / "vllm", root / "specforge"
    # NeMo: aux = the first k-1 layers; shards of --shard-size samples
    ndir = root / "nemo"
    ndir.mkdir()
    with __import__("eagle3conv.states.format", fromlist=["StatesFile"]).StatesFile(out["eagle3conv"]) as st:
        aux = [st.aux(layers[:-1], slice(i, i + 1)) for i in range(b)]
    sel = list(range(a.draft_vocab))
    for sh, start in enumerate(range(0, b, a.shard_size)):
        rows = slice(start, min(b, start + a.shard_size))
        n = rows.stop - rows.start
        shifted = torch.cat([ids[rows, 1:], torch.zeros(n, 1, dtype=torch.long)], dim=1)
        vals = torch.rand(n, s, a.topk, generator=g).sort(-1, descending=True).values.bfloat16()
        save_file({"input_ids": shifted, "attention_mask": mask[rows].long(), "loss_mask": mask[rows].long(),
                   "aux_hidden_states": torch.cat(aux[rows], dim=0), "position_mask": mask[rows].unsqueeze(-1),
                   "target_probs_values": vals,
                   "target_probs_indices": torch.randint(0, a.draft_vocab, (n, s, a.topk), generator=g,
                                                         dtype=torch.int32)},
                  str(ndir / f"shard-{sh:06d}.safetensors"))
    (ndir / "manifest.json").write_text(json.dumps({
        "format_version": 2, "aux_layer_ids": layers[:-1], "num_samples": b, "shard_size": a.shard_size,
        "seq_length": s, "draft_vocab_size": a.draft_vocab, "selected_token_ids": sel,
        "target_vocab_size": a.vocab, "target_probs_topk": a.topk, "dtype": "bf16", "target_model": "bench"}))
    out["nemo"] = ndir
    return out, layers


def read_once(kind: str, path: Path, layers, a, device) -> float:
    import torch

    from eagle3conv.spec.layers import LayerRef
    from eagle3conv.states.readers import open_states
    from eagle3conv.verify.feed import batches, feeder_for

    refs = tuple(LayerRef(i) for i in layers[:-1])  # the aux slots a drafter reads
    t0 = time.perf_counter()
    opened = {}
    if kind == "vllm":
        st = open_states(path, stated=[i + 1 for i in layers], num_layers=a.num_layers)
    elif kind == "specforge":
        st = open_states(path, stated=list(layers[:-1]), num_layers=a.num_layers)
    else:
        st = open_states(path)
    opened["s"] = time.perf_counter() - t0
    got = 0
    if a.feeder and device.type == "cpu":  # the CUDA path's own code, without pinned memory or streams
        source = feeder_for(st, refs, total=st.num_sequences, batch_size=a.batch_size, with_embeddings=False,
                            device=device, dtype=torch.bfloat16)
        if source is None:  # (NeMo: no feeder, its plain path as on CUDA)
            source = batches(st, refs, total=st.num_sequences, batch_size=a.batch_size, with_embeddings=False,
                             device=device, dtype=torch.bfloat16)
    else:
        source = batches(st, refs, total=st.num_sequences, batch_size=a.batch_size, with_embeddings=False,
                         device=device, dtype=torch.bfloat16)
    for _, _, aux, _ in source:
        got += aux.shape[0]
        if aux.device != device:  # the readers' batches arrive pinned on the host: evaluate uploads them
            aux = aux.to(device, non_blocking=True)
        if device.type != "cuda":  # touch every page: a reader may hand out a lazy view of its file's map
            flat = aux.reshape(-1)
            float(flat[::4096 // flat.element_size()].sum())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    assert got == a.sequences
    return time.perf_counter() - t0, opened["s"]


def main() -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--slots", type=int, default=4, help="stored layers: the aux slots plus the last layer")
    p.add_argument("--sequences", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--num-layers", type=int, default=30)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--draft-vocab", type=int, default=32000)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--shard-size", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--feeder", action="store_true",
                   help="on CPU, read through the feeder verify uses on CUDA (feeder_for), minus pinning and upload")
    p.add_argument("--dir", default=None, help="where to write the files (default: a temp folder)")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    a = p.parse_args()
    device = torch.device(a.device)
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        t0 = time.perf_counter()
        paths, layers = write_all(Path(tmp), a)
        written = time.perf_counter() - t0
        kinds = list(paths)
        for k in kinds:  # warm the page cache and every import once
            read_once(k, paths[k], layers, a, device)
        secs: dict[str, list[float]] = {k: [] for k in kinds}
        opens: dict[str, list[float]] = {k: [] for k in kinds}
        for r in range(a.rounds):
            order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
            for k in order:
                total, opened = read_once(k, paths[k], layers, a, device)
                secs[k].append(total)
                opens[k].append(opened)
        ratios = {k: statistics.median(x / y for x, y in zip(secs[k], secs["eagle3conv"])) for k in kinds}
    tokens = a.sequences * a.seq_len
    res = {"what": "open + stream every sequence's aux slots as verify does, median over rounds; ratio to the "
                   "eagle3conv states file in the same round", "device": str(device),
           "path": "feeder (CUDA's code on the CPU)" if a.feeder and device.type == "cpu" else "verify's",
           "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
           "shape": {"hidden": a.hidden, "slots": a.slots, "sequences": a.sequences, "seq_len": a.seq_len,
                     "tokens": tokens, "batch_size": a.batch_size, "nemo_topk": a.topk, "shard_size": a.shard_size},
           "rounds": a.rounds, "write_seconds": round(written, 2),
           "median_seconds": {k: round(statistics.median(v), 4) for k, v in secs.items()},
           "median_open_seconds": {k: round(statistics.median(v), 4) for k, v in opens.items()},
           "ratio_to_states_file": {k: round(v, 3) for k, v in ratios.items()},
           "within_1_25x": {k: bool(v <= 1.25) for k, v in ratios.items()}}
    print(json.dumps(res, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    if not all(math.isfinite(v) for v in ratios.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
