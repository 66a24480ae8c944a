"""`eagle3conv verify` on one GPU: a Kimi-K2.5-size drafter, side by side with bf16 matmul.

One run measures, on the machine it runs on (meant for one H200):

1. A Llama-style drafter of Kimi-K2.5 size with random bf16 weights (hidden 7168,
   target hidden 7168, 3 aux states so fc is [7168, 21504], 64 heads x 128, 8 kv
   heads, intermediate 18432, vocab 163840, draft vocab 32000, d2t zeros, no
   embed_tokens: target and drafter widths agree, so SGLang and verify embed with
   the target's table), saved as a canonical safetensors folder under --workdir.
   Then the time to read its bytes with a plain read loop next to
   ``load_drafter_weights`` + ``build_drafter`` (to cuda, bf16), with the page
   cache dropped first when the kernel allows it (else "warm"), and warm too.
2. ``Eagle3Drafter.draft_chain(aux, ids, steps)`` on synthetic states on the GPU
   ([B, S, 3*7168] bf16), timed with CUDA events after warm-ups: draft-token-steps/s
   = B*S*steps / time. Next to it the plain forward (``forward`` per step, causal
   SDPA, no training-time-test attention), the issue's reference.
3. bf16 matmul throughput (8192^3 torch.mm), before and after, and the drafter's
   FLOPs per token-step, to express both as a fraction of matmul throughput.
   A short torch.profiler breakdown of one draft_chain call, and monkeypatched
   variants of draft_chain's pieces (chunk size, RMSNorm through torch's fused
   F.rms_norm, no cat in _qkv, attention through flash + log-sum-exp, compiled
   RMSNorm/RoPE), each checked against the original (share of equal target ids).
   ``evaluate`` alone over --eval-seqs sequences, with a cProfile of one pass.
5. (``global_search_bench``) ``verify --search-wiring`` over all 61 layers on 16k tokens
   (``--only-search`` runs just this after writing the drafter; budget 60 s): the screen's
   stages (each wiring read until the data excludes it, docs/facts.md §12), its work, the
   confirmations and local refinement, and the verdict's set.
4. ``eagle3conv.verify.verify`` on a states file (``write_states``) of a few
   S=2048 sequences holding the embedding output and outputs 2, 30, 58 of a
   61-layer target: ``result.seconds`` (time to first result), cold and warm.

FLOPs per token-step (useful work, multiply-add = 2):
  qkv 2*(2H)*(nh+2*nkv)*hd, o 2*nh*hd*H, mlp 3*2*H*I, lm_head 2*H*Vd,
  attention 4*nh*hd*(keys per query: (S+1)/2 causal, + (k-1) own drafts at step k),
  fc 2*H*(3T) at step 1 only (averaged over the steps).

6. (``--sections mla``) the same for a Kimi-K2.5-size MLA drafter (``Eagle3DeepseekV2ForCausalLM``,
   docs/facts.md §10; FLOPs of the expanded path eagle3conv runs): load vs read, draft_chain vs
   matmul with a profile, evaluate over a shared 96 x 2048 states file.
7. (``--sections fresh``) ``python3 -m eagle3conv verify`` in a fresh process for both families, cold
   (every cache dropped, or only the inputs evicted) and warm, with and without the console's
   read-ahead, next to a plain read loop of the same files and the chain's compute.

8. (``--sections multi``) the chain of the same drafter with 1 and with ``--multi-layers`` decoder
   layers (issue 22), each against bf16 matmul with every layer's FLOPs counted.

``--sections`` picks among llama (1-4), mla, fresh, search (5) and multi (8); the default runs the first four.

Everything is printed as one JSON line at the end and written to
``$OUT/verify_gpu.json`` (or --out). ``--small`` runs tiny shapes (CPU smoke test).

    PYTHONUNBUFFERED=1 PYTHONPATH=. python bench/bench_verify_gpu.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shared import drop_caches, read_loop, timed_verify  # noqa: E402  (shared with fresh_cold.py)

RESULT: dict = {}
OUT_PATH: Path | None = None


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def dump() -> None:
    """Write what we have so far (a timeout still leaves the finished sections)."""
    if OUT_PATH is not None:
        OUT_PATH.parent.mkdir(parents=True, exist_ok=True)
        OUT_PATH.write_text(json.dumps(RESULT, indent=1) + "\n")


def sync(dev: str) -> None:
    if dev.startswith("cuda"):
        torch.cuda.synchronize()


def time_gpu(fn, dev: str, warmup: int, reps: int) -> list[float]:
    """Per-call seconds: CUDA events on a GPU, perf_counter on CPU."""
    for _ in range(warmup):
        fn()
    sync(dev)
    out = []
    for _ in range(reps):
        if dev.startswith("cuda"):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    return out


def kernel_category(name: str, reductions: str = "reductions") -> str:
    """The profile bucket of one CUDA kernel, by its name (the two profiles share it)."""
    low = name.lower()
    if any(x in low for x in ("gemm", "nvjet", "xmma", "cutlass", "sm90", "cublas")) and "fmha" not in low:
        return "matmul"
    if any(x in low for x in ("fmha", "flash", "attention", "efficient")):
        return "attention"
    if "reduce" in low or "argmax" in low or "norm" in low:
        return reductions
    if "cat" in low or "copy" in low or "index" in low or "gather" in low:
        return "copies/cat/index"
    return "elementwise"


def matmul_tflops(dev: str, n: int) -> dict:
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    ts = time_gpu(lambda: torch.mm(a, b), dev, 3, 10)
    del a, b
    mean = statistics.mean(ts)
    return {"n": n, "mean_ms": round(mean * 1e3, 3), "tflops": round(2 * n ** 3 / mean / 1e12, 1)}


# --------------------------------------------------------------------------- the drafter


def make_dims(small: bool) -> dict:
    if small:
        return dict(H=64, T=64, k=3, NH=4, NKV=2, HD=16, I=128, V=1000, Vd=256, L=61)
    return dict(H=7168, T=7168, k=3, NH=64, NKV=8, HD=128, I=18432, V=163840, Vd=32000, L=61)


def save_drafter(folder: Path, t: dict, cfg: dict, ids) -> dict:
    """A canonical drafter folder (model.safetensors + config.json); what was written."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return {"bytes": sum(x.numel() * x.element_size() for x in t.values()), "eagle_config_ids": list(ids),
            "tensors": len(t)}


def write_drafter(folder: Path, d: dict, aux_outputs: tuple[int, ...], dev: str) -> dict:
    """A canonical safetensors drafter folder with random bf16 weights, made on ``dev``."""
    from eagle3conv.example import Dims, llama_config
    from eagle3conv.spec.layers import LayerRef, to_ids

    H, T, k, NH, NKV, HD, I, V, Vd, L = (d[x] for x in ("H", "T", "k", "NH", "NKV", "HD", "I", "V", "Vd", "L"))
    g = torch.Generator(device=dev).manual_seed(0)

    def w(*shape, scale=0.02):
        return (torch.randn(*shape, generator=g, device=dev, dtype=torch.float32) * scale).to(torch.bfloat16).cpu()

    def norm(n):
        return (1.0 + 0.1 * torch.randn(n, generator=g, device=dev)).to(torch.bfloat16).cpu()

    t = {
        "fc.weight": w(H, k * T),
        "midlayer.self_attn.q_proj.weight": w(NH * HD, 2 * H),
        "midlayer.self_attn.k_proj.weight": w(NKV * HD, 2 * H),
        "midlayer.self_attn.v_proj.weight": w(NKV * HD, 2 * H),
        "midlayer.self_attn.o_proj.weight": w(H, NH * HD),
        "midlayer.mlp.gate_proj.weight": w(I, H),
        "midlayer.mlp.up_proj.weight": w(I, H),
        "midlayer.mlp.down_proj.weight": w(H, I),
        "midlayer.input_layernorm.weight": norm(H),
        "midlayer.hidden_norm.weight": norm(H),
        "midlayer.post_attention_layernorm.weight": norm(H),
        "norm.weight": norm(H),
        "lm_head.weight": w(Vd, H),
        "d2t": torch.zeros(Vd, dtype=torch.int64),
    }
    # verify builds its Candidate from the ids the way the newest SGLang reads them for an unnamed
    # target (id i = output of layer i); write the ids that mean outputs 2, 30, 58
    ids = to_ids(tuple(LayerRef(o) for o in aux_outputs), "output", L)
    cfg = llama_config(Dims(hidden=H, target_hidden=T, heads=NH, kv_heads=NKV, head_dim=HD, intermediate=I,
                            vocab=V, draft_vocab=Vd, aux_ids=tuple(ids)))
    layers = d.get("layers", 1)
    for i in range(1, layers):  # later decoder layers (issue 22): read H, their own input norm
        p = f"layers.{i}."
        t.update({f"{p}self_attn.q_proj.weight": w(NH * HD, H), f"{p}self_attn.k_proj.weight": w(NKV * HD, H),
                  f"{p}self_attn.v_proj.weight": w(NKV * HD, H), f"{p}self_attn.o_proj.weight": w(H, NH * HD),
                  f"{p}mlp.gate_proj.weight": w(I, H), f"{p}mlp.up_proj.weight": w(I, H),
                  f"{p}mlp.down_proj.weight": w(H, I), f"{p}input_layernorm.weight": norm(H),
                  f"{p}post_attention_layernorm.weight": norm(H)})
        t[f"{p}hidden_norm.weight"] = t[f"{p}input_layernorm.weight"].clone()
    cfg["num_hidden_layers"] = layers
    return save_drafter(folder, t, cfg, ids)


def flops_per_token_step(d: dict, S: int, steps: int) -> dict:
    H, T, k, NH, NKV, HD, I, Vd = (d[x] for x in ("H", "T", "k", "NH", "NKV", "HD", "I", "Vd"))
    extra = d.get("layers", 1) - 1  # later decoder layers: q/k/v read H, and each attends over its own keys
    parts = {
        "qkv": 2 * (2 * H) * (NH + 2 * NKV) * HD + extra * 2 * H * (NH + 2 * NKV) * HD,
        "o": (1 + extra) * 2 * NH * HD * H,
        "mlp": (1 + extra) * 3 * 2 * H * I,
        "lm_head": 2 * H * Vd,
    }
    attn = [(1 + extra) * 4 * NH * HD * ((S + 1) / 2 + s) for s in range(steps)]  # step s+1: + s own drafts
    fc = 2 * H * k * T
    per_chain = steps * sum(parts.values()) + sum(attn) + fc
    return {"per_step_parts": parts, "attention_avg": sum(attn) / steps, "fc_step1": fc,
            "avg_per_token_step": per_chain / steps}


# --------------------------------------------------------------------------- variants


def ttt_attention_flash_lse(self, q, keys, values, chunk_size):
    """Exact TTT attention: causal flash over step 1's keys (with its log-sum-exp),
    then the diagonal keys of steps 2..k merged in by log-sum-exp. No mask, no chunks."""
    nh, nkv = q.shape[1], keys[0].shape[1]
    rep = nh // nkv

    def full(x):
        return x.repeat_interleave(rep, dim=1) if rep > 1 else x

    out0, lse0 = torch.ops.aten._scaled_dot_product_flash_attention(q, full(keys[0]), full(values[0]), 0.0, True)[:2]
    scale = q.shape[-1] ** -0.5
    qf = q.float()
    scores = [lse0.float()]
    vals = []
    for kj, vj in zip(keys[1:], values[1:]):
        kj, vj = full(kj), full(vj)
        scores.append((qf * kj.float()).sum(-1) * scale)
        vals.append(vj)
    s = torch.stack(scores)  # [n, B, nh, S]
    wts = torch.softmax(s, dim=0)
    out = out0.float() * wts[0].unsqueeze(-1)
    for i, vj in enumerate(vals, 1):
        out = out + wts[i].unsqueeze(-1) * vj.float()
    return out.to(q.dtype)


def mla_qkv_with_cat(self, g, input_ids, position_offset, embeddings=None):
    """The MLA step's q/k/v as eagle3conv built them before 2026-12-01 (kept here to time the change
    side by side): q = cat(q_nope, q_pe), k = cat(k_nope, k_pe expanded), v made contiguous."""
    from eagle3conv.model.mla import mla_rotate
    from eagle3conv.model.ops import rms_norm

    c = self.config
    eps = c.rms_norm_eps
    residual, x = self._layer_input(g, input_ids, embeddings)
    b, s, _ = x.shape
    nh, nope, rope = c.num_heads, c.qk_nope_head_dim, c.qk_rope_head_dim
    c_q = rms_norm(F.linear(x, self.q_a_proj), self.q_a_layernorm, eps)
    q = F.linear(c_q, self.q_b_proj).view(b, s, nh, nope + rope).transpose(1, 2)
    q_nope, q_pe = q.split([nope, rope], dim=-1)
    c_kv, k_pe = F.linear(x, self.kv_a_proj_with_mqa).split([c.kv_lora_rank, rope], dim=-1)
    kv = F.linear(rms_norm(c_kv, self.kv_a_layernorm, eps), self.kv_b_proj)
    kv = kv.view(b, s, nh, nope + c.v_head_dim).transpose(1, 2)
    k_nope, v = kv.split([nope, c.v_head_dim], dim=-1)
    cos, sin = self._rope(torch.arange(position_offset, position_offset + s, device=self.device))
    q_pe = mla_rotate(q_pe, cos, sin, c.rope_interleave)
    k_pe = mla_rotate(k_pe, cos, sin, c.rope_interleave)[:, None]
    q = torch.cat((q_nope, q_pe), dim=-1)
    k = torch.cat((k_nope, k_pe.expand(b, nh, s, rope)), dim=-1)
    return residual, q, k, v.contiguous()


class CatChainKeys:
    """The training-time-test attention as eagle3conv ran it before 2026-12-01: per query chunk,
    cat(keys_1[:b], keys_2[a:b], ...) and the same for values (same interface as ChainKeys)."""

    def __init__(self, k0, v0, extra_steps, chunk_size):
        self.keys, self.values, self.chunk = [k0], [v0], chunk_size

    def add(self, k, v):
        self.keys.append(k)
        self.values.append(v)

    def attention(self, q, *, enable_gqa, scale):
        seq, n_extra, keys, values = q.shape[2], len(self.keys) - 1, self.keys, self.values
        out = q.new_empty(*q.shape[:-1], values[0].shape[-1])
        for a in range(0, seq, self.chunk):
            b = min(a + self.chunk, seq)
            size = b - a
            k = torch.cat([keys[0][:, :, :b]] + [kj[:, :, a:b] for kj in keys[1:]], dim=2)
            v = torch.cat([values[0][:, :, :b]] + [vj[:, :, a:b] for vj in values[1:]], dim=2)
            eye = torch.eye(size, dtype=torch.bool, device=q.device)
            mask = torch.cat([torch.ones(size, a, dtype=torch.bool, device=q.device),
                              torch.ones(size, size, dtype=torch.bool, device=q.device).tril(),
                              eye.repeat(1, n_extra)], dim=1)
            out[:, :, a:b] = F.scaled_dot_product_attention(q[:, :, a:b], k, v, attn_mask=mask,
                                                            enable_gqa=enable_gqa, scale=scale)
        return out


def rms_norm_fused(x, weight, eps, *, out=None):
    """LlamaRMSNorm through torch's fused kernel: fp32 inside, one rounding to x's dtype,
    then the weight in x's dtype, as the original (since 2026-11-29 the package's own)."""
    normed = F.rms_norm(x, (x.shape[-1],), eps=eps)
    return weight * normed if out is None else torch.mul(weight, normed, out=out)


def flash_lse_chain_keys():
    """A ChainKeys whose attention is ttt_attention_flash_lse (draft_chain builds a ChainKeys)."""
    from eagle3conv.model.drafter import ChainKeys

    class FlashLseChainKeys(ChainKeys):
        def attention(self, q, *, enable_gqa, scale):
            keys = [self.k[:, self.pad:].transpose(1, 2), *self.extra_k]
            values = [self.v[:, self.pad:].transpose(1, 2), *self.extra_v]
            return ttt_attention_flash_lse(None, q, keys, values, self.chunk)

    return FlashLseChainKeys


def qkv_no_cat(self, g, input_ids, position_offset, embeddings=None):
    """_qkv with fused RMSNorms written straight into the two halves of x (no cat)."""
    from eagle3conv.model.ops import apply_rope

    c = self.config
    eps = c.rms_norm_eps
    b, s, h = g.shape
    x = torch.empty(b, s, 2 * h, device=g.device, dtype=g.dtype)
    embeds = self.embed(input_ids, embeddings)
    torch.mul(F.rms_norm(embeds, (h,), eps=eps), self.input_layernorm, out=x[..., :h])
    torch.mul(F.rms_norm(g, (h,), eps=eps), self.hidden_norm, out=x[..., h:])
    normed_g = x[..., h:]
    residual = normed_g if c.norm_before_residual else g
    q = F.linear(x, self.q_proj).view(b, s, c.num_heads, c.head_dim).transpose(1, 2)
    k = F.linear(x, self.k_proj).view(b, s, c.num_kv_heads, c.head_dim).transpose(1, 2)
    v = F.linear(x, self.v_proj).view(b, s, c.num_kv_heads, c.head_dim).transpose(1, 2)
    positions = torch.arange(position_offset, position_offset + s, device=self.device)
    cos, sin = self._rope(positions)
    return residual, apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def global_search_bench(folder: Path, d: dict, dev: str, work: Path, seqs: int, S: int, steps: int,
                        runs: int = 2, screen_max_work: float | None = None,
                        search_budget: float | None = None) -> dict:
    """5. ``verify --search-wiring`` over every layer of the 61-layer target: states holding the
    embedding output and all 61 layer outputs of ``seqs`` x ``S`` tokens (16k by default), written
    once; the budget is 60 s on one H200 (issue 13). The weights are random, so every wiring
    scores alike: this measures the search's cost, not its answer. Per run: load, build, the
    config's wiring (first result), the screen's phases (each slot's fc projection of each
    layer, stage 1, stage 2: ``ScreenResult.phase_seconds``), and the confirmation of the
    finalists (what is left of the total)."""
    from eagle3conv.states.format import write_states
    import eagle3conv.verify.evaluate  # noqa: F401
    from eagle3conv.verify import verify

    evaluate_mod = sys.modules["eagle3conv.verify.evaluate"]

    T, V = d["T"], d["V"]
    path = work / "states_all_layers.safetensors"
    out = {"sequences": seqs, "S": S, "tokens": seqs * S, "screen_max_work": screen_max_work,
           "search_budget": search_budget}
    if not path.exists():
        # Layer outputs that drift like a residual stream (a shared part plus a random walk over the
        # layers, so neighbouring layers are alike), and reference tokens planted from the drafter's
        # own step-1 guesses with outputs 2, 30, 58: that wiring scores 1.0 at step 1 and its
        # neighbours score less the further they are. (With independent random states and tokens every
        # wiring scores 0, all tie at the screen's cut, and every stage keeps all 37,820 wirings.)
        from eagle3conv.verify import build_drafter, load_drafter_weights

        gen = torch.Generator(device=dev).manual_seed(5)
        t = time.perf_counter()
        base = torch.randn(seqs, S, T, generator=gen, device=dev)
        walk = torch.zeros_like(base)
        hidden = {-1: (torch.randn(seqs, S, T, generator=gen, device=dev) * 0.5).to(torch.bfloat16).cpu()}
        for o in range(d["L"]):
            walk += torch.randn(seqs, S, T, generator=gen, device=dev) * 0.04
            hidden[o] = ((base + walk) * (0.5 + o / 8)).to(torch.bfloat16).cpu()
        del base, walk
        input_ids = torch.randint(0, V, (seqs, S), generator=gen, device=dev).cpu()
        config, tensors = load_drafter_weights(folder)
        drafter, _ = build_drafter(config, tensors, dev, torch.bfloat16)
        del tensors
        target_next = torch.randint(0, V, (seqs, S), generator=gen, device=dev)
        for a in range(0, seqs, 2):
            b = min(a + 2, seqs)
            aux = torch.cat([hidden[o][a:b].to(dev) for o in (2, 30, 58)], dim=-1)
            emb = hidden[-1][a:b].to(dev)
            n = b - a
            ids = torch.arange(n * S, device=dev).view(n, S)  # the embedding outputs, by position
            tokens = torch.zeros_like(ids)
            tokens[:, :S - 1] = ids[:, 1:]
            guess = drafter.forward(aux, tokens, embeddings=emb.reshape(n * S, T)).target_ids  # step 1 at t guesses target_next[t+1]
            target_next[a:b, 1:] = guess[:, :-1]
        del drafter, aux, emb
        if dev == "cuda":
            torch.cuda.empty_cache()
        out["make_hidden_s"] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()
        write_states(path, input_ids=input_ids, attention_mask=torch.ones(seqs, S, dtype=torch.bool),
                     target_next=target_next.cpu(), hidden=hidden, num_layers=d["L"], vocab_size=V,
                     target="bench/kimi-size")
        del hidden
        out["write_states_s"] = round(time.perf_counter() - t, 2)
    out["states_bytes"] = path.stat().st_size
    log("global search states", out)
    RESULT["global_search"] = out
    dump()
    real_screen = evaluate_mod.screen
    seen: list = []

    def screen(*a, **k):  # the real screen, its result kept for the per-phase times
        t0 = time.perf_counter()
        if screen_max_work is not None:  # --screen-max-work: the work cap under test
            import dataclasses

            k["bound"] = dataclasses.replace(k.get("bound") or evaluate_mod.ScreenBound(), max_work=screen_max_work)
        cb = k.get("progress")

        last = [0.0]

        def progress(done, tot):
            if cb:
                cb(done, tot)
            now = time.perf_counter() - t0
            if now - last[0] > 5:
                last[0] = now
                log(f"  screen {done}/{tot} wirings at {now:.1f} s")

        k["progress"] = progress
        r = real_screen(*a, **k)
        seen.append(r)
        return r

    evaluate_mod.screen = screen
    try:
        for i in range(runs):
            label = ("first", "second", "third")[i] if i < 3 else f"run{i}"
            seen.clear()
            t = time.perf_counter()
            budget = {} if search_budget is None else {"search_budget": search_budget}
            res = verify(folder, path, steps=steps, device=dev, save=False, search=True, **budget)
            wall = time.perf_counter() - t
            cov = res.verdict.coverage.to_dict() if res.verdict.coverage is not None else {}  # undecided too
            cov.pop("slot_profile", None)
            cov["screen_best"] = (cov.get("screen_best") or [])[:3]
            sr = seen[0][0] if seen else None  # the global screen; later calls are local refinement's
            secs = dict(res.seconds)
            screen_s = sr.seconds if sr is not None else None
            refine_s = sum(r[0].seconds for r in seen[1:])
            out[label] = {"wall_s": round(wall, 2), "seconds": secs, "coverage": cov, "status": res.verdict.status,
                          "confirmed": len(res.scores),
                          "screen_phase_seconds": getattr(sr, "phase_seconds", None),
                          "screen_work": getattr(sr, "work", None), "screen_complete": getattr(sr, "complete", None),
                          "screen_kept": len(getattr(sr, "alive", []) or []),
                          "refinement_screen_s": round(refine_s, 2),
                          "confidence_set": [c.layers for c in res.verdict.confidence_set][:10],
                          "evaluations_s": round(secs["total"] - secs["load_drafter"] - secs["build"] - screen_s
                                                 - refine_s, 2) if screen_s is not None else None,
                          "within_60s_budget": wall <= 60, "within_30s_budget": wall <= 30}
            log("global search", label, out[label])
            RESULT["global_search"] = out
            dump()
            del res
            if dev == "cuda":
                torch.cuda.empty_cache()
    finally:
        evaluate_mod.screen = real_screen
    return out


# --------------------------------------------------------------------------- MLA (issue 12)


KIMI_YARN = {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "beta_fast": 1.0,
             "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}


def make_mla_dims(small: bool) -> dict:
    """Kimi-K2.5's MLA drafter (docs/facts.md §10): draft vocab = full vocab, no d2t."""
    if small:
        return dict(H=64, T=64, k=3, NH=4, QL=32, KL=16, NOPE=16, ROPE=8, VH=16, I=128, V=1000, Vd=1000, L=61)
    return dict(H=7168, T=7168, k=3, NH=64, QL=1536, KL=512, NOPE=128, ROPE=64, VH=128, I=18432, V=163840,
                Vd=163840, L=61)


def mla_config(d: dict, ids: list[int]) -> dict:
    return {
        "architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "kimi_k2",
        "hidden_size": d["H"], "num_attention_heads": d["NH"], "q_lora_rank": d["QL"], "kv_lora_rank": d["KL"],
        "qk_nope_head_dim": d["NOPE"], "qk_rope_head_dim": d["ROPE"], "v_head_dim": d["VH"],
        "intermediate_size": d["I"], "vocab_size": d["V"], "draft_vocab_size": d["Vd"], "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5, "hidden_act": "silu", "rope_theta": 50000.0, "rope_scaling": dict(KIMI_YARN),
        "max_position_embeddings": 262144, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ids)},
    }


def write_mla_drafter(folder: Path, d: dict, aux_outputs: tuple[int, ...], dev: str) -> dict:
    """A canonical safetensors MLA drafter folder (Kimi-K2.5 dims), random bf16 weights, no d2t."""
    from eagle3conv.model.mla import MLAConfig, expected_mla_tensors
    from eagle3conv.spec.layers import LayerRef, to_ids

    ids = to_ids(tuple(LayerRef(o) for o in aux_outputs), "output", d["L"])
    cfg = mla_config(d, list(ids))
    g = torch.Generator(device=dev).manual_seed(10)
    t = {}
    for key, shape in expected_mla_tensors(MLAConfig.from_config(cfg)).items():
        if key in ("d2t", "t2d") or key.startswith(("fc_norm", "fc.bias", "embed_tokens")):
            continue
        if len(shape) == 1:
            t[key] = (1.0 + 0.1 * torch.randn(shape, generator=g, device=dev)).to(torch.bfloat16).cpu()
        else:
            t[key] = (torch.randn(shape, generator=g, device=dev) / shape[1] ** 0.5).to(torch.bfloat16).cpu()
    return save_drafter(folder, t, cfg, ids)


def mla_flops_per_token_step(d: dict, S: int, steps: int) -> dict:
    """The expanded (MHA) path eagle3conv.model.mla runs: kv_b_proj applied to every key, keys and
    values materialised per head, attention over nope+rope (q.k) and v_head (p.v) dims."""
    H, T, k, NH, QL, KL, NOPE, ROPE, VH, I, Vd = (d[x] for x in ("H", "T", "k", "NH", "QL", "KL", "NOPE", "ROPE",
                                                                  "VH", "I", "Vd"))
    parts = {
        "q_a": 2 * (2 * H) * QL, "q_b": 2 * QL * NH * (NOPE + ROPE),
        "kv_a": 2 * (2 * H) * (KL + ROPE), "kv_b": 2 * KL * NH * (NOPE + VH),
        "o": 2 * NH * VH * H, "mlp": 3 * 2 * H * I, "lm_head": 2 * H * Vd,
    }
    attn = [2 * NH * (NOPE + ROPE + VH) * ((S + 1) / 2 + s) for s in range(steps)]
    fc = 2 * H * k * T
    per_chain = steps * sum(parts.values()) + sum(attn) + fc
    return {"per_step_parts": parts, "attention_avg": sum(attn) / steps, "fc_step1": fc,
            "avg_per_token_step": per_chain / steps, "path": "expanded MHA (kv_b_proj on every key)"}


def evict(files: list[Path], only_these: bool = False) -> str:
    """Drop files from the page cache: /proc/sys/vm/drop_caches when writable (everything: Python's
    and torch's libraries too), else -- or with ``only_these`` -- posix_fadvise(DONTNEED) per file
    (only these files). Returns which."""
    if not only_these and drop_caches():
        return "drop_caches"
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
        except OSError:
            pass
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    return "fadvise_dontneed"


def load_vs_read(folder: Path, dev: str) -> tuple[object, dict]:
    """load_drafter_weights + build_drafter against a plain read loop of the same files, cold and warm."""
    from eagle3conv.verify import build_drafter, load_drafter_weights

    files = sorted(folder.glob("*.safetensors")) + [folder / "config.json"]
    out: dict = {}
    drafter = None
    for label in ("cold", "warm"):
        how = evict(files) if label == "cold" else None
        rs, nbytes = read_loop(files)
        if label == "cold":
            evict(files)
        drafter = None
        if dev == "cuda":
            torch.cuda.empty_cache()
        t0 = time.perf_counter()
        config, tensors = load_drafter_weights(folder)
        t1 = time.perf_counter()
        drafter, _ = build_drafter(config, tensors, dev, torch.bfloat16)
        sync(dev)
        t2 = time.perf_counter()
        del tensors
        out[label] = {"evicted_by": how, "read_loop_s": round(rs, 3), "read_GBps": round(nbytes / rs / 1e9, 2),
                      "load_drafter_weights_s": round(t1 - t0, 3), "build_drafter_s": round(t2 - t1, 3),
                      "load_plus_build_s": round(t2 - t0, 3), "ratio_to_read": round((t2 - t0) / rs, 3)}
        log("load", folder.name, label, out[label])
        out["bytes"] = nbytes
    return drafter, out


def profile_chain(drafter, aux, ids, steps: int, *, reductions: str = "reductions", top: int = 12,
                  name_len: int = 100) -> dict:
    """One draft_chain call under torch.profiler: GPU kernel time by category and the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        drafter.draft_chain(aux, ids, steps)
        torch.cuda.synchronize()
    cats: dict[str, float] = {}
    kern = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if not us or e.key.startswith("aten::") or e.key.startswith("cuda"):
            continue
        cat = kernel_category(e.key, reductions=reductions)
        cats[cat] = cats.get(cat, 0.0) + us / 1e3
        kern.append((us / 1e3, e.count, cat, e.key[:name_len]))
    kern.sort(reverse=True)
    total = sum(cats.values())
    return {"gpu_ms_total": round(total, 2),
            "by_category_ms": {c: round(v, 2) for c, v in sorted(cats.items(), key=lambda x: -x[1])},
            "by_category_frac": {c: round(v / total, 3) for c, v in cats.items()} if total else {},
            "top_kernels": [{"ms": round(a, 2), "calls": n, "cat": c, "name": nm} for a, n, c, nm in kern[:top]]}


def write_shared_states(path: Path, d: dict, dev: str, seqs: int, S: int, outputs=(-1, 2, 30, 58)) -> dict:
    """A states file holding the embedding output and outputs 2, 30, 58 (per-layer scales, so a slot
    mix-up would show in the norms), written once and used by every evaluate / fresh-process run."""
    from eagle3conv.states.format import write_states

    T, V = d["T"], d["V"]
    gen = torch.Generator(device=dev).manual_seed(2)
    scale = {-1: 0.5, 2: 3.0, 30: 4.0, 58: 5.0}
    t = time.perf_counter()
    hidden = {o: (torch.randn(seqs, S, T, generator=gen, device=dev) * scale.get(o, 0.5 + o / 8))
              .to(torch.bfloat16).cpu() for o in outputs}
    write_states(path, input_ids=torch.randint(0, V, (seqs, S), generator=gen, device=dev).cpu(),
                 attention_mask=torch.ones(seqs, S, dtype=torch.bool),
                 target_next=torch.randint(0, V, (seqs, S), generator=gen, device=dev).cpu(), hidden=hidden,
                 num_layers=d["L"], vocab_size=V, target="bench/kimi-size")
    del hidden
    return {"sequences": seqs, "S": S, "layers": list(outputs), "bytes": path.stat().st_size,
            "write_s": round(time.perf_counter() - t, 2)}


def chain_rate(drafter, d: dict, fl: dict, S: int, steps: int, B: int, dev: str, reps: int, mm: float) -> dict:
    gen = torch.Generator(device=dev).manual_seed(1)
    aux = torch.randn(B, S, d["k"] * d["T"], generator=gen, device=dev).to(torch.bfloat16)
    ids = torch.randint(0, d["V"], (B, S), generator=gen, device=dev)
    ts = time_gpu(lambda: drafter.draft_chain(aux, ids, steps), dev, 2, reps)
    sec = statistics.median(ts)
    tps = B * S * steps / sec
    tf = tps * fl["avg_per_token_step"] / 1e12
    out = {"B": B, "ms": round(sec * 1e3, 2), "ms_all": [round(x * 1e3, 2) for x in ts],
           "token_steps_per_s": round(tps), "tflops": round(tf, 1), "frac_of_matmul": round(tf / mm, 4)}
    if dev == "cuda":
        out["peak_mem_GiB"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 1)
        out["profile"] = profile_chain(drafter, aux, ids, steps)
    return out


def multi_layer_bench(args, d: dict, dev: str, work: Path, S: int, steps: int, mm: float) -> dict:
    """draft_chain of the same Kimi-size drafter with 1 and with --multi-layers decoder layers, each as a
    fraction of bf16 matmul (FLOPs of every layer counted), at each --batches size."""
    from eagle3conv.verify import build_drafter, load_drafter_weights

    out: dict = {}
    for layers in (1, args.multi_layers):
        dd = {**d, "layers": layers}
        folder = work / f"drafter-{layers}l"
        info = write_drafter(folder, dd, (2, 30, 58), dev)
        config, tensors = load_drafter_weights(folder)
        drafter, _ = build_drafter(config, tensors, dev, torch.bfloat16)
        del tensors
        gen = torch.Generator(device=dev).manual_seed(1)
        drafter.embed_tokens = (torch.randn(d["V"], d["H"], generator=gen, device=dev) * 0.02).to(torch.bfloat16)
        fl = flops_per_token_step(dd, S, steps)
        res = {"bytes": info["bytes"], "avg_flops_per_token_step": round(fl["avg_per_token_step"])}
        for B in [int(x) for x in args.batches.split(",")]:
            r = chain_rate(drafter, dd, fl, S, steps, B, dev, args.reps, mm)
            r.pop("profile", None)
            res[B] = r
            log(f"multi-layer {layers}: B {B}", r)
        out[layers] = res
        del drafter
        if dev == "cuda":
            torch.cuda.empty_cache()
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    return out


def first_call_probe(drafter, d: dict, S: int, steps: int, dev: str, states_path: Path) -> dict:
    """What a process pays the first time: one draft_chain call on new shapes, twice (the first loads
    kernels and plans), and the GPU feeder's pinned buffers."""
    from eagle3conv.spec.layers import LayerRef
    from eagle3conv.states.readers import open_states
    from eagle3conv.verify.feed import GpuFeeder, mapped_states

    out = {}
    gen = torch.Generator(device=dev).manual_seed(3)
    aux = torch.randn(8, S, d["k"] * d["T"], generator=gen, device=dev).to(torch.bfloat16)
    ids = torch.randint(0, d["V"], (8, S), generator=gen, device=dev)
    for label in ("chain_first", "chain_second"):
        sync(dev)
        t = time.perf_counter()
        drafter.draft_chain(aux, ids, steps)
        sync(dev)
        out[label] = round(time.perf_counter() - t, 3)
    del aux, ids
    if dev == "cuda":
        views = mapped_states(open_states(states_path))
        for label in ("feeder_buffers_first", "feeder_buffers_second"):
            t = time.perf_counter()
            f = GpuFeeder(views, tuple(LayerRef(o) for o in (2, 30, 58)), 8, 8, True, torch.device(dev),
                          torch.bfloat16)
            out[label] = round(time.perf_counter() - t, 3)
            del f
    return out


def evaluate_rate(drafter, states_path: Path, fl: dict, steps: int, mm: float, target_embeds: bool,
                  outputs=(2, 30, 58)) -> dict:
    from eagle3conv.spec.layers import LayerRef
    from eagle3conv.states.readers import open_states
    from eagle3conv.verify import Candidate, evaluate

    cand = Candidate("bench", tuple(LayerRef(o) for o in outputs), "bench")
    out = {}
    for label in ("first", "second"):
        sc = evaluate(drafter, open_states(states_path), cand, steps=steps, batch_size=8, target_embeds=target_embeds)
        tps = sc.tokens * steps / sc.seconds
        out[label] = {"seconds": round(sc.seconds, 3), "token_steps_per_s": round(tps),
                      "frac_of_matmul": round(tps * fl["avg_per_token_step"] / 1e12 / mm, 4),
                      "acceptance": [round(a, 5) for a in sc.acceptance]}
    out["tokens_scored"] = sc.tokens
    return out


def mla_bench(args, dev: str, work: Path, mm: float, S: int, steps: int, states_path: Path | None) -> dict:
    """Issue 12's GPU bullet for the MLA family: load vs read, the chain and evaluate vs matmul."""
    d = make_mla_dims(args.small)
    folder = work / "drafter-mla"
    res: dict = {"dims": d}
    t = time.perf_counter()
    res["checkpoint"] = write_mla_drafter(folder, d, (2, 30, 58), dev)
    res["checkpoint"]["write_seconds"] = round(time.perf_counter() - t, 2)
    log("mla checkpoint", res["checkpoint"])
    drafter, res["load"] = load_vs_read(folder, dev)
    fl = mla_flops_per_token_step(d, S, steps)
    res["flops"] = {k: (round(v) if isinstance(v, float) else v) for k, v in fl.items()}
    gen = torch.Generator(device=dev).manual_seed(1)
    drafter.embed_tokens = (torch.randn(d["V"], d["H"], generator=gen, device=dev) * 0.02).to(torch.bfloat16)
    res["draft_chain"] = {}
    for B in [int(x) for x in args.batches.split(",")]:
        res["draft_chain"][B] = chain_rate(drafter, d, fl, S, steps, B, dev, args.reps, mm)
        log("mla draft_chain", B, {k: v for k, v in res["draft_chain"][B].items() if k != "profile"})
        RESULT["mla"] = res
        dump()
    if dev == "cuda" and not args.mla_light:  # side by side: the code before the no-cat change, cuDNN's SDPA off
        from eagle3conv.model import drafter as drafter_mod
        from eagle3conv.model.mla import Eagle3MLADrafter

        B = max(int(x) for x in args.batches.split(","))
        variants = {}
        from safetensors import safe_open

        own_qkv, own_keys = Eagle3MLADrafter._qkv, drafter_mod.ChainKeys
        # the previous code reads kv_b_proj as stored; the package keeps only its padded layout
        with safe_open(str(folder / "model.safetensors"), framework="pt", device=dev) as st:
            drafter.kv_b_proj = st.get_tensor("midlayer.self_attn.kv_b_proj.weight")
        try:
            Eagle3MLADrafter._qkv, drafter_mod.ChainKeys = mla_qkv_with_cat, CatChainKeys
            variants["previous code (q/k cat, per-chunk key cat)"] = chain_rate(
                drafter, d, fl, S, steps, B, dev, args.reps, mm)
        finally:
            Eagle3MLADrafter._qkv, drafter_mod.ChainKeys = own_qkv, own_keys
        try:
            torch.backends.cuda.enable_cudnn_sdp(False)
            variants["cuDNN SDPA off"] = chain_rate(drafter, d, fl, S, steps, B, dev, args.reps, mm)
        finally:
            torch.backends.cuda.enable_cudnn_sdp(True)
        res["draft_chain_variants"] = variants
        log("mla variants", {n: {k: v for k, v in r.items() if k != "profile"} for n, r in variants.items()})
        dump()
    if dev == "cuda":
        torch.cuda.empty_cache()
    if states_path is not None and not args.mla_light:
        from eagle3conv.verify import build_drafter, load_drafter_weights

        config, tensors = load_drafter_weights(folder)
        drafter, target_embeds = build_drafter(config, tensors, dev, torch.bfloat16)
        del tensors
        res["evaluate"] = evaluate_rate(drafter, states_path, fl, steps, mm, target_embeds)
        log("mla evaluate", res["evaluate"])
    del drafter
    if dev == "cuda":
        torch.cuda.empty_cache()
    res["folder"] = str(folder)
    return res


# --------------------------------------------------------------------------- fresh-process verify (issue 12)


def fresh_verify_bench(folders: dict, states_path: Path, dev: str, compute_s: dict, timeout: float,
                       only_labels: str = "") -> dict:
    """``python3 -m eagle3conv verify DRAFTER --states FILE --json --no-save`` as a user runs it, in a fresh
    process, cold (the drafter's and the states' files evicted from the page cache first) and warm, next
    to a plain read loop of the same files, cold and warm, and the chain's compute (in-process)."""
    import subprocess

    res: dict = {"states_bytes": states_path.stat().st_size}
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    ref = {}
    code = "import torch; torch.zeros(1, device='cuda' if torch.cuda.is_available() else 'cpu')"
    for name in ("python_import_torch_cuda_init (cold, drop_caches)", "python_import_torch_cuda_init (warm)"):
        if "cold" in name:
            ref[name + " evicted_by"] = evict([])
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
        ref[name] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import eagle3conv.cli"], env=env, check=True)
    ref["python_import_eagle3conv_cli"] = round(time.perf_counter() - t, 3)
    res["reference_process_s"] = ref
    log("reference processes", ref)
    for fam, folder in folders.items():
        files = sorted(Path(folder).glob("*.safetensors")) + [Path(folder) / "config.json", states_path]
        r: dict = {}
        # (label, evict only these files, read-ahead threads): "cold" drops every cache (torch's
        # libraries too); "cold-files" only the drafter's and the states' files (torch warm)
        labels = [("cold", False, 4), ("warm", False, 4), ("cold, no read-ahead", False, 0),
                  ("cold-files", True, 4), ("cold-files, no read-ahead", True, 0), ("warm, no read-ahead", False, 0)]
        if only_labels:
            labels = [x for x in labels if x[0] in only_labels.split(";")]
        for label, only, threads in labels:
            cold = label.startswith("cold")
            if cold:  # before the read loop as well: its cold figure is part of the bound
                evict(files, only)
            if label in ("cold", "warm", "cold-files"):
                rs, nbytes = read_loop(files)
                r[f"read_loop_{label}_s"] = round(rs, 3)
                r["read_bytes"] = nbytes
            if cold:
                r[f"evicted_by ({label})"] = evict(files, only)
            cmd = [sys.executable, "-m", "eagle3conv", "verify", str(folder), "--states", str(states_path),
                   "--device", dev, "--no-save", "--json"]
            run = timed_verify(cmd, dict(env, EAGLE3CONV_PHASES="1", EAGLE3CONV_READ_AHEAD=str(threads)), timeout)
            r[label] = run
            log("fresh verify", fam, label, run)
        chain = compute_s.get(fam)
        r["chain_compute_s"] = chain
        for label, _, _ in labels:
            loop = r[f"read_loop_{label.split(',')[0]}_s"]
            bound = max(loop, chain or 0.0)
            r[f"{label}_ratio_to_bound"] = round(r[label]["wall_s"] / bound, 3) if bound else None
        res[fam] = r
        RESULT["fresh_verify"] = res
        dump()
    return res


def main() -> int:
    global OUT_PATH
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="tiny shapes (a smoke test, CPU is fine)")
    ap.add_argument("--workdir", default="/tmp/eagle3conv-bench-verify")
    ap.add_argument("--batches", default="8,4", help="batch sizes for draft_chain, comma separated")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--verify-seqs", type=int, default=8)
    ap.add_argument("--eval-seqs", type=int, default=32)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    ap.add_argument("--out", default=None)
    ap.add_argument("--search-seqs", type=int, default=8, help="sequences of --seq tokens for the global search")
    ap.add_argument("--only-search", action="store_true", help="write the drafter, then only the global search")
    ap.add_argument("--multi-layers", type=int, default=2, help="decoder layers of the multi section's drafter")
    ap.add_argument("--sections", default="llama,mla,fresh,search",
                    help="comma separated: llama (the Llama family's chain, variants, verify, evaluate), mla (the "
                         "Kimi-size MLA drafter), fresh (fresh-process `eagle3conv verify`, both families), search")
    ap.add_argument("--fresh-seqs", type=int, default=96, help="sequences of the shared states file (mla, fresh)")
    ap.add_argument("--search-runs", type=int, default=2, help="verify --search-wiring runs on the same states")
    ap.add_argument("--screen-max-work", type=float, default=None,
                    help="search: the screen's work cap (ScreenBound.max_work; default: eagle3conv's)")
    ap.add_argument("--search-budget", type=float, default=None,
                    help="search: verify --search-budget (default: eagle3conv's, 15 s on a GPU)")
    ap.add_argument("--keep", action="store_true", help="keep the states files")
    ap.add_argument("--fresh-labels", default="", help="only these fresh-process cases, ';' separated")
    ap.add_argument("--mla-light", action="store_true",
                    help="mla: the load and the chain at --batches only (no variants, no evaluate)")
    args = ap.parse_args()
    sections = {"search"} if args.only_search else set(args.sections.split(","))
    out_dir = args.out or (os.path.join(os.environ["OUT"], "verify_gpu.json") if os.environ.get("OUT") else None)
    OUT_PATH = Path(out_dir) if out_dir else None

    t_imp = time.perf_counter()
    import transformers.activations  # noqa: F401  (the drafter's imports, outside the timed loads)
    from transformers import LlamaConfig  # noqa: F401

    from eagle3conv.model import drafter as drafter_mod
    from eagle3conv.verify import build_drafter, load_drafter_weights
    import_s = time.perf_counter() - t_imp

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    d = make_dims(args.small)
    S, steps = (64 if args.small else args.seq), args.steps
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    RESULT["env"] = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
                     "python": sys.version.split()[0]}
    RESULT["dims"] = d
    RESULT["import_seconds"] = round(import_s, 2)
    log("env", RESULT["env"])

    # -- 3. matmul reference (before)
    mm_n = 1024 if args.small else 8192
    RESULT["matmul_before"] = matmul_tflops(dev, mm_n)
    log("matmul", RESULT["matmul_before"])
    dump()

    # -- 1. checkpoint, read, load
    folder = work / "drafter"
    t = time.perf_counter()
    info = write_drafter(folder, d, (2, 30, 58), dev)
    info["write_seconds"] = round(time.perf_counter() - t, 2)
    RESULT["checkpoint"] = info
    log("checkpoint", info)
    if "llama" in sections:  # the Llama family: load, chain, profile, variants, verify, evaluate
        drafter, RESULT["load"] = load_vs_read(folder, dev)
        dump()

        # -- 2. draft_chain on synthetic states
        H, T, k, V = d["H"], d["T"], d["k"], d["V"]
        gen = torch.Generator(device=dev).manual_seed(1)
        drafter.embed_tokens = (torch.randn(V, H, generator=gen, device=dev) * 0.02).to(torch.bfloat16)
        fl = flops_per_token_step(d, S, steps)
        RESULT["flops"] = {"per_step_parts": fl["per_step_parts"], "attention_avg": round(fl["attention_avg"]),
                           "fc_step1": fl["fc_step1"], "avg_per_token_step": round(fl["avg_per_token_step"]),
                           "S": S, "steps": steps}
        mm = RESULT["matmul_before"]["tflops"]

        def rate(sec, B):
            tps = B * S * steps / sec
            tf = tps * fl["avg_per_token_step"] / 1e12
            return {"ms": round(sec * 1e3, 2), "token_steps_per_s": round(tps), "tflops": round(tf, 1),
                    "frac_of_matmul": round(tf / mm, 4)}

        chain_res = {}
        inputs = {}
        for B in [int(x) for x in args.batches.split(",")]:
            aux = torch.randn(B, S, k * T, generator=gen, device=dev).to(torch.bfloat16)
            ids = torch.randint(0, V, (B, S), generator=gen, device=dev)
            inputs[B] = (aux, ids)
            ts = time_gpu(lambda: drafter.draft_chain(aux, ids, steps), dev, 2, args.reps)

            def plain():
                with torch.inference_mode():
                    st = aux
                    for s in range(steps):
                        o = drafter.forward(st, ids, position_offset=s)
                        st = o.hidden

            tp = time_gpu(plain, dev, 2, args.reps)
            chain_res[B] = {"draft_chain": rate(statistics.median(ts), B), "plain_forward": rate(statistics.median(tp), B),
                            "draft_chain_ms_all": [round(x * 1e3, 2) for x in ts]}
            if dev == "cuda":
                chain_res[B]["peak_mem_GiB"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 1)
            log("draft_chain B", B, chain_res[B])
            dump()
        RESULT["draft_chain"] = chain_res

        # -- profile one call at the largest batch
        Bp = max(inputs)
        aux, ids = inputs[Bp]
        if dev == "cuda":
            RESULT["profile"] = {"batch": Bp, **profile_chain(
                drafter, aux, ids, steps, reductions="reductions (rmsnorm mean, argmax)", top=15, name_len=120)}
            log("profile", json.dumps(RESULT["profile"], indent=1))
            dump()

        # -- variants (monkeypatched; drafter.py unchanged)
        variants = {}
        ref = drafter.draft_chain(aux, ids, steps).target_ids

        def try_variant(name, fn_call, setup=None, teardown=None):
            try:
                if setup:
                    setup()
                got = fn_call().target_ids
                agree = float((got == ref).float().mean())
                ts = time_gpu(fn_call, dev, 2, args.reps)
                variants[name] = dict(rate(statistics.median(ts), Bp), target_ids_agree=round(agree, 5))
            except Exception as exc:  # report, keep going
                variants[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            finally:
                if teardown:
                    teardown()
            log("variant", name, variants[name])
            dump()

        for cs in (256, 1024, 2048):
            try_variant(f"chunk_size={cs}", lambda cs=cs: drafter.draft_chain(aux, ids, steps, chunk_size=cs))
        orig_ttt = drafter_mod.Eagle3Drafter.ttt_attention
        orig_norm_fn, orig_qkv = drafter_mod.rms_norm, drafter_mod.Eagle3Drafter._qkv
        xn = torch.randn(4, 512, H, device=dev).to(torch.bfloat16) * 3
        wn = drafter.norm
        RESULT["fused_rmsnorm_bitwise_equal_frac"] = float(
            (orig_norm_fn(xn, wn, 1e-5) == rms_norm_fused(xn, wn, 1e-5)).float().mean())
        del xn

        def set_fused():
            drafter_mod.rms_norm = rms_norm_fused

        def unset_fused():
            drafter_mod.rms_norm = orig_norm_fn

        try_variant("fused rmsnorm (F.rms_norm)", lambda: drafter.draft_chain(aux, ids, steps), set_fused, unset_fused)

        def set_nocat():
            set_fused()
            drafter_mod.Eagle3Drafter._qkv = qkv_no_cat

        def unset_nocat():
            unset_fused()
            drafter_mod.Eagle3Drafter._qkv = orig_qkv

        try_variant("fused rmsnorm + no cat in _qkv", lambda: drafter.draft_chain(aux, ids, steps), set_nocat, unset_nocat)
        if dev == "cuda":
            # exactness of the flash+lse attention against the original, on step-2-like inputs
            try:
                B2, nh, nkv, hd = 1, d["NH"], d["NKV"], d["HD"]
                q = torch.randn(B2, nh, S, hd, device=dev, dtype=torch.bfloat16)
                ks = [torch.randn(B2, nkv, S, hd, device=dev, dtype=torch.bfloat16) for _ in range(3)]
                vs = [torch.randn(B2, nkv, S, hd, device=dev, dtype=torch.bfloat16) for _ in range(3)]
                a0 = orig_ttt(drafter, q, ks, vs, 512).float()
                a1 = ttt_attention_flash_lse(drafter, q, ks, vs, 512).float()
                RESULT["flash_lse_max_abs_diff"] = float((a0 - a1).abs().max())
                RESULT["flash_lse_ref_max_abs"] = float(a0.abs().max())
            except Exception as exc:
                RESULT["flash_lse_max_abs_diff"] = f"{type(exc).__name__}: {exc}"[:300]

            own_keys = drafter_mod.ChainKeys

            def set_flash():
                drafter_mod.ChainKeys = flash_lse_chain_keys()

            def unset():
                drafter_mod.ChainKeys = own_keys

            try_variant("ttt_attention=flash+lse", lambda: drafter.draft_chain(aux, ids, steps), set_flash, unset)

            if not args.no_compile:
                orig_norm, orig_rope = drafter_mod.rms_norm, drafter_mod.apply_rope

                def set_compiled():
                    drafter_mod.rms_norm = torch.compile(orig_norm, dynamic=False)
                    drafter_mod.apply_rope = torch.compile(orig_rope, dynamic=False)
                    t0 = time.perf_counter()
                    drafter.draft_chain(aux, ids, steps)
                    sync(dev)
                    RESULT["compile_seconds"] = round(time.perf_counter() - t0, 1)
                    from torch._dynamo.utils import counters

                    RESULT["dynamo_stats"] = {k: dict(v) for k, v in counters.items() if k in ("stats", "frames")}

                def unset_compiled():
                    drafter_mod.rms_norm, drafter_mod.apply_rope = orig_norm, orig_rope

                try_variant("compiled rmsnorm+rope", lambda: drafter.draft_chain(aux, ids, steps),
                            set_compiled, unset_compiled)

                def set_both():
                    set_compiled()
                    set_flash()

                def unset_both():
                    unset_compiled()
                    unset()

                try_variant("compiled rmsnorm+rope & flash+lse", lambda: drafter.draft_chain(aux, ids, steps),
                            set_both, unset_both)
        RESULT["variants"] = variants
        del inputs, aux, ids, ref
        del drafter
        if dev == "cuda":
            torch.cuda.empty_cache()

        # -- 4. verify end to end
        from eagle3conv.states.format import write_states
        from eagle3conv.verify import verify

        Bv = 2 if args.small else args.verify_seqs
        cpu_gen = torch.Generator(device=dev).manual_seed(2)
        hidden = {o: (torch.randn(Bv, S, T, generator=cpu_gen, device=dev) * (0.5 if o == -1 else 4.0))
                  .to(torch.bfloat16).cpu() for o in (-1, 2, 30, 58)}
        ids_v = torch.randint(0, V, (Bv, S), generator=cpu_gen, device=dev).cpu()
        tnext = torch.randint(0, V, (Bv, S), generator=cpu_gen, device=dev).cpu()
        states_path = work / "states.safetensors"
        t = time.perf_counter()
        write_states(states_path, input_ids=ids_v, attention_mask=torch.ones(Bv, S, dtype=torch.bool),
                     target_next=tnext, hidden=hidden, num_layers=d["L"], vocab_size=V, target="bench/kimi-size")
        del hidden
        ver = {"sequences": Bv, "S": S, "states_bytes": states_path.stat().st_size,
               "write_states_s": round(time.perf_counter() - t, 2)}
        for label in ("cold", "warm"):
            dropped = drop_caches() if label == "cold" else False
            t = time.perf_counter()
            res = verify(folder, states_path, steps=steps, device=dev, save=False)
            wall = time.perf_counter() - t
            ver[label] = {"page_cache_dropped": dropped, "seconds": res.seconds, "wall_s": round(wall, 3),
                          "wiring": res.main.to_dict()["described"],
                          "acceptance": res.main.to_dict()["acceptance_per_position"],
                          "positions_scored": res.main.tokens,
                          "evaluate_s": round(res.main.seconds, 3),
                          "evaluate_token_steps_per_s": round(res.main.tokens * steps / res.main.seconds)}
            log("verify", label, ver[label])
            del res
            if dev == "cuda":
                torch.cuda.empty_cache()
        RESULT["verify"] = ver
        dump()

        # evaluate() alone over more sequences (batch_size 8, as verify's default), and where its time goes
        import cProfile
        import io
        import pstats

        from eagle3conv.states.readers import open_states
        from eagle3conv.verify import Candidate, evaluate
        from eagle3conv.spec.layers import LayerRef

        Be = 4 if args.small else args.eval_seqs
        path_e = work / "states_eval.safetensors"
        scale = {-1: 0.5, 2: 3.0, 30: 4.0, 58: 5.0}  # distinct per layer: a slot mix-up shows in the norms
        hidden = {o: (torch.randn(Be, S, T, generator=cpu_gen, device=dev) * scale[o])
                  .to(torch.bfloat16).cpu() for o in (-1, 2, 30, 58)}
        write_states(path_e, input_ids=torch.randint(0, V, (Be, S)), attention_mask=torch.ones(Be, S, dtype=torch.bool),
                     target_next=torch.randint(0, V, (Be, S)), hidden=hidden, num_layers=d["L"], vocab_size=V)
        del hidden
        config, tensors = load_drafter_weights(folder)
        drafter, target_embeds = build_drafter(config, tensors, dev, torch.bfloat16)
        del tensors
        cand = Candidate("bench", tuple(LayerRef(o) for o in (2, 30, 58)), "bench")
        ev = {"sequences": Be}
        for label in ("first", "second"):
            sc = evaluate(drafter, open_states(path_e), cand, steps=steps, batch_size=8, target_embeds=target_embeds)
            ev[label] = {"seconds": round(sc.seconds, 3), "token_steps_per_s": round(sc.tokens * steps / sc.seconds)}
        # the pipelined GPU feeder (memory-mapped rows -> pinned buffers -> side-stream upload) against
        # the plain batch path: identical counts and norms, and how much faster
        fast = evaluate(drafter, open_states(path_e), cand, steps=steps, batch_size=8, target_embeds=target_embeds)
        plain = evaluate(drafter, open_states(path_e), cand, steps=steps, batch_size=8, target_embeds=target_embeds,
                         feeder=False)
        ev["feeder_vs_plain"] = {
            "feeder_s": round(fast.seconds, 3), "plain_s": round(plain.seconds, 3),
            "plain_token_steps_per_s": round(plain.tokens * steps / plain.seconds),
            "identical_counts": fast.matched == plain.matched and fast.counted == plain.counted
            and fast.chains == plain.chains and fast.chain_accepted == plain.chain_accepted,
            "identical_norms": fast.norms == plain.norms,
            "norm_medians": [n["median"] for n in fast.norms],
        }
        prof = cProfile.Profile()
        prof.enable()
        evaluate(drafter, open_states(path_e), cand, steps=steps, batch_size=8, target_embeds=target_embeds)
        sync(dev)
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
        ev["cprofile_tottime_top"] = [ln.strip() for ln in buf.getvalue().splitlines() if ln.strip()][-15:]
        best = max(ev["first"]["token_steps_per_s"], ev["second"]["token_steps_per_s"])
        ev["frac_of_matmul"] = round(best * fl["avg_per_token_step"] / 1e12 / mm, 4)
        RESULT["evaluate"] = ev
        log("evaluate", json.dumps(ev, indent=1))
        del drafter
        if dev == "cuda":
            torch.cuda.empty_cache()

    # -- the states file shared by the MLA evaluate and the fresh-process runs (written once)
    shared = None
    if sections & {"mla", "fresh", "feed"}:
        shared = work / "states_shared.safetensors"
        RESULT["shared_states"] = write_shared_states(shared, d, dev, 3 if args.small else args.fresh_seqs, S)
        log("shared states", RESULT["shared_states"])
        dump()
    mm = RESULT["matmul_before"]["tflops"]
    compute_s: dict = {}
    if "mla" in sections:
        RESULT["mla"] = mla_bench(args, dev, work, mm, S, steps, shared)
        dump()
        c8 = RESULT["mla"]["draft_chain"][max(RESULT["mla"]["draft_chain"])]
        compute_s["mla"] = round(c8["ms"] / 1e3 * -(-RESULT["shared_states"]["sequences"] // c8["B"]), 3)
    if sections & {"fresh", "feed"}:
        # the Llama family's chain and evaluate on the same shared states
        from eagle3conv.verify import build_drafter, load_drafter_weights

        config, tensors = load_drafter_weights(folder)
        drafter, target_embeds = build_drafter(config, tensors, dev, torch.bfloat16)
        del tensors
        fl = flops_per_token_step(d, S, steps)
        lres: dict = {"first_calls_s": first_call_probe(drafter, d, S, steps, dev, shared)}
        lres["evaluate"] = evaluate_rate(drafter, shared, fl, steps, mm, target_embeds)
        if dev == "cuda":  # the feeder (parallel host copies) against the plain batch path: same numbers
            from eagle3conv.spec.layers import LayerRef
            from eagle3conv.states.readers import open_states
            from eagle3conv.verify import Candidate, evaluate

            cand = Candidate("bench", tuple(LayerRef(o) for o in (2, 30, 58)), "bench")
            fast = evaluate(drafter, open_states(shared), cand, steps=steps, batch_size=8, target_embeds=target_embeds)
            plain = evaluate(drafter, open_states(shared), cand, steps=steps, batch_size=8,
                             target_embeds=target_embeds, feeder=False)
            lres["feeder_vs_plain"] = {
                "feeder_s": round(fast.seconds, 3), "plain_s": round(plain.seconds, 3),
                "identical_counts": fast.matched == plain.matched and fast.counted == plain.counted
                and fast.chains == plain.chains and fast.chain_accepted == plain.chain_accepted,
                "identical_norms": fast.norms == plain.norms}
        gen = torch.Generator(device=dev).manual_seed(1)
        drafter.embed_tokens = (torch.randn(d["V"], d["H"], generator=gen, device=dev) * 0.02).to(torch.bfloat16)
        Bc = max(int(x) for x in args.batches.split(","))
        lres["draft_chain"] = chain_rate(drafter, d, fl, S, steps, Bc, dev, args.reps, mm)
        lres["draft_chain"].pop("profile", None)
        RESULT["llama_shared"] = lres
        log("llama on shared states", lres)
        compute_s["llama"] = round(lres["draft_chain"]["ms"] / 1e3 * -(-RESULT["shared_states"]["sequences"] // Bc), 3)
        del drafter
        if dev == "cuda":
            torch.cuda.empty_cache()
        folders = {"llama": folder}
        if "mla" in sections:
            folders["mla"] = Path(RESULT["mla"]["folder"])
        if "fresh" in sections:
            RESULT["fresh_verify"] = fresh_verify_bench(folders, shared, dev, compute_s, timeout=240,
                                                        only_labels=args.fresh_labels)
        dump()
    if shared is not None and not args.keep:
        shared.unlink()

    # -- 8. multi-layer drafters (issue 22): the chain of a 2-layer Kimi-size drafter vs bf16 matmul,
    # side by side with the 1-layer drafter in the same process
    if "multi" in sections:
        RESULT["multi_layer"] = multi_layer_bench(args, d, dev, work, S, steps, RESULT["matmul_before"]["tflops"])
        dump()

    # -- 5. the global wiring search
    if "search" in sections:
        RESULT["global_search"] = global_search_bench(folder, d, dev, work, 2 if args.small else args.search_seqs,
                                                      S, steps, runs=args.search_runs,
                                                      screen_max_work=args.screen_max_work,
                                                      search_budget=args.search_budget)
        dump()
    if dev == "cuda":
        torch.cuda.empty_cache()

    # -- 3. matmul reference (after)
    RESULT["matmul_after"] = matmul_tflops(dev, mm_n)
    mm_max = max(RESULT["matmul_before"]["tflops"], RESULT["matmul_after"]["tflops"])
    summ = {"matmul_tflops_before_after": [RESULT["matmul_before"]["tflops"], RESULT["matmul_after"]["tflops"]]}
    if "llama" in sections:
        summ.update({
            "draft_chain_frac_of_max_matmul": {B: round(r["draft_chain"]["tflops"] / mm_max, 4)
                                               for B, r in chain_res.items()},
            "plain_forward_frac_of_max_matmul": {B: round(r["plain_forward"]["tflops"] / mm_max, 4)
                                                 for B, r in chain_res.items()},
            "evaluate_frac_of_max_matmul": round(RESULT["evaluate"]["frac_of_matmul"] * mm / mm_max, 4),
            "variants_frac_of_max_matmul": {n: round(v["tflops"] / mm_max, 4) for n, v in variants.items()
                                            if "tflops" in v},
        })
    if "mla" in sections:
        m = RESULT["mla"]
        summ["mla_draft_chain_frac_of_max_matmul"] = {B: round(r["tflops"] / mm_max, 4)
                                                      for B, r in m["draft_chain"].items()}
        if "evaluate" in m:
            summ["mla_evaluate_frac_of_max_matmul"] = round(
                max(m["evaluate"][x]["frac_of_matmul"] for x in ("first", "second")) * mm / mm_max, 4)
        summ["mla_load_ratio_to_read"] = {x: m["load"][x]["ratio_to_read"] for x in ("cold", "warm")}
    if "multi_layer" in RESULT:
        summ["multi_layer_draft_chain_frac_of_max_matmul"] = {
            layers: {B: round(r["tflops"] / mm_max, 4) for B, r in res.items() if isinstance(r, dict)}
            for layers, res in RESULT["multi_layer"].items()}
    if "llama_shared" in RESULT:
        summ["llama_shared_evaluate_frac_of_max_matmul"] = round(
            max(RESULT["llama_shared"]["evaluate"][x]["frac_of_matmul"] for x in ("first", "second")) * mm / mm_max, 4)
    if "fresh_verify" in RESULT:
        summ["fresh_verify_ratio_to_bound"] = {
            fam: {k[:-len("_ratio_to_bound")]: v for k, v in r.items() if k.endswith("_ratio_to_bound")}
            for fam, r in RESULT["fresh_verify"].items() if isinstance(r, dict) and "cold" in r}
    RESULT["summary"] = summ
    dump()
    print(json.dumps(RESULT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
