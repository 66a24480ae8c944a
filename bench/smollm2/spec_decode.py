"""Greedy speculative decoding on CPU: SmolLM2-135M-Instruct + the trained EAGLE-3 drafter.

A real chain-drafting loop, as SGLang runs EAGLE-3 with topk 1:

* prefill: the target runs the prompt, keeps its KV cache, emits the first token
  and the aux states (outputs of layers 1, 14, 26) of every prompt position;
* each round, with ``t`` the last position whose aux states exist and ``x_{t+1}``
  the token the target emitted last: the drafter extends its own step-1 KV cache
  over the new positions (aux states of position p with token ``x_{p+1}``), then
  drafts K tokens in a chain (step 1 from the target's aux states at t, steps
  2+ from its own pre-norm state and its own previous draft);
* the target verifies with one forward over ``[x_{t+1}, d_1 .. d_K]`` on its KV
  cache; the longest prefix of drafts equal to the target's greedy tokens is
  accepted, plus the target's next token (the bonus); the target's KV cache is
  cropped to the accepted tokens and their aux states are kept.

Every output is asserted identical to plain greedy decoding of the target.
The drafter is eagle3conv's ``Eagle3Drafter``, or ``Eagle3MLADrafter`` for the
MLA fixture (``--fixture tests/data/smollm2-drafter-mla``; the class follows
the config, ``eagle3conv.model.build_drafter``), loaded strictly from the
fixture and driven incrementally through its step pieces; for the first
``--check-rounds`` rounds its drafts are also checked against
``Eagle3Drafter.draft_chain(teacher_forcing=False)`` over the whole sequence.

Measured accept length = tokens emitted per verification forward (accepted
drafts + 1), averaged over rounds. It is compared with the teacher-forced
prediction on the same generated tokens: for every chain start t in the
response, ``A_t`` = number of leading drafts that match the target's greedy
tokens, and ``E = 1 + mean_t A_t = 1 + sum_k prod_{j<=k} p_j`` (p_j = P(draft j
right | drafts 1..j-1 right)). Real decoding starts chains only at round
boundaries (right after a rejection, often at harder positions), so the two
need not agree exactly. The replay check closes the loop: starting at the
prompt's last position and jumping ``A_t + 1`` positions each round, the
teacher-forced ``A_t`` must reproduce the measured rounds one for one
(``replayed_rounds_equal``; the last round can differ where the end-of-turn
token cuts it).

    .venv/bin/python bench/smollm2/spec_decode.py [--prompts 12] [--max-new-tokens 128] [-K 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import common  # noqa: E402
from common import TRAINED_ON  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class IncrementalDrafter:
    """Eagle3Drafter (or Eagle3MLADrafter) run as SGLang runs it: a step-1 KV cache over
    verified positions, and a chain of K steps at the last one. Uses the drafter's own step
    pieces (``attention_inputs``, ``finish``, and its softmax scale ``attn_scale``, which MLA's
    yarn mscale changes) so the math is eagle3conv's."""

    def __init__(self, drafter):
        self.d = drafter
        self.keys = None
        self.values = None
        self.length = 0

    @torch.inference_mode()
    def extend(self, aux_rows: torch.Tensor, next_tokens: torch.Tensor):
        """Step 1 at positions ``length .. length+m-1``: aux states ``[m, k*T]``, tokens ``[m]``
        (the token after each position). Returns the StepOutput of those rows."""
        d = self.d
        m = aux_rows.shape[0]
        res, q, k, v = d.attention_inputs(aux_rows[None], next_tokens[None], position_offset=self.length)
        self.keys = k if self.keys is None else torch.cat((self.keys, k), dim=2)
        self.values = v if self.values is None else torch.cat((self.values, v), dim=2)
        total = self.length + m
        mask = torch.arange(total)[None, :] <= (self.length + torch.arange(m))[:, None]
        attn = F.scaled_dot_product_attention(q, self.keys, self.values, attn_mask=mask, enable_gqa=d.gqa,
                                              scale=d.attn_scale)
        self.length = total
        return d.finish(res, attn)

    @torch.inference_mode()
    def draft(self, aux_rows: torch.Tensor, next_tokens: torch.Tensor, num: int) -> list[int]:
        d = self.d
        out = self.extend(aux_rows, next_tokens)
        t = self.length - 1
        drafts = [int(out.target_ids[0, -1])]
        h = out.hidden[:, -1:]
        ks, vs = [], []
        for step in range(2, num + 1):
            res, q, k, v = d.attention_inputs(h, torch.tensor([[drafts[-1]]]), position_offset=t + step - 1)
            ks.append(k)
            vs.append(v)
            attn = F.scaled_dot_product_attention(
                q, torch.cat([self.keys, *ks], dim=2), torch.cat([self.values, *vs], dim=2),
                enable_gqa=d.gqa, scale=d.attn_scale)
            o = d.finish(res, attn)
            drafts.append(int(o.target_ids[0, 0]))
            h = o.hidden
        return drafts


def aux_of(rec: common.StateRecorder) -> torch.Tensor:
    return torch.cat([rec.states[i][0] for i in TRAINED_ON], dim=-1)


@torch.inference_mode()
def greedy(model, prompt: list[int], max_new: int, eos: int) -> tuple[list[int], int]:
    """Plain greedy decoding with a KV cache. Returns (new tokens, target forwards)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    out = model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
    new = [int(out.logits[0, -1].argmax())]
    forwards = 1
    while len(new) < max_new and new[-1] != eos:
        out = model(input_ids=torch.tensor([[new[-1]]]), cache=cache, use_cache=True)
        new.append(int(out.logits[0, -1].argmax()))
        forwards += 1
    return new, forwards


@torch.inference_mode()
def speculative(model, drafter, prompt: list[int], max_new: int, eos: int, num_drafts: int,
                check: int) -> dict:
    from transformers import DynamicCache

    rec = common.StateRecorder(model, TRAINED_ON)
    try:
        cache = DynamicCache()
        t0 = time.perf_counter()
        out = model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
        target_s = time.perf_counter() - t0
        tokens = list(prompt) + [int(out.logits[0, -1].argmax())]
        inc = IncrementalDrafter(drafter)
        pending_aux = aux_of(rec)  # aux rows not yet in the drafter's cache: positions inc.length ..
        aux_all = pending_aux
        accepted, draft_s, checked = [], 0.0, 0
        while len(tokens) - len(prompt) < max_new and tokens[-1] != eos:
            t = len(tokens) - 2  # last position with aux states; tokens[t+1] is the newest token
            t1 = time.perf_counter()
            drafts = inc.draft(pending_aux, torch.tensor(tokens[inc.length + 1 : t + 2]), num_drafts)
            draft_s += time.perf_counter() - t1
            if checked < check:  # same drafts from draft_chain over the whole sequence
                aux_pad = torch.cat([aux_all, torch.zeros(1, aux_all.shape[1])])
                chain = drafter.draft_chain(aux_pad[None], torch.tensor([tokens]), num_drafts,
                                            teacher_forcing=False)
                assert chain.target_ids[:, 0, t].tolist() == drafts, (chain.target_ids[:, 0, t], drafts)
                checked += 1
            t1 = time.perf_counter()
            out = model(input_ids=torch.tensor([[tokens[-1], *drafts]]), cache=cache,
                        use_cache=True)
            target_s += time.perf_counter() - t1
            g = out.logits[0].argmax(-1).tolist()
            n = 0
            while n < num_drafts and drafts[n] == g[n]:
                n += 1
            new = drafts[:n] + [g[n]]
            if eos in new:  # the end-of-turn token ends generation
                new = new[: new.index(eos) + 1]
            pending_aux = aux_of(rec)[: n + 1]  # positions t+1 .. t+1+n
            aux_all = torch.cat([aux_all, pending_aux])
            extra = cache.get_seq_length() - (t + 2 + n)  # rejected drafts' entries
            if extra > 0:
                cache.crop(-extra)  # transformers 5.24: a negative count removes that many
            tokens += new
            accepted.append(len(new))
    finally:
        rec.close()
    gen = tokens[len(prompt):]
    if eos in gen:
        gen = gen[: gen.index(eos) + 1]
    return {"tokens": gen[:max_new], "accepted": accepted, "target_s": target_s, "draft_s": draft_s,
            "checked_rounds": checked}


@torch.inference_mode()
def teacher_forced(model, drafter, prompt: list[int], gen: list[int], num_drafts: int) -> dict[int, int]:
    """``{t: A_t}`` for every chain start t whose drafts all have reference tokens in ``gen``."""
    rec = common.StateRecorder(model, TRAINED_ON)
    try:
        seq = torch.tensor([prompt + gen])
        logits = model(input_ids=seq).logits
        aux = aux_of(rec)
    finally:
        rec.close()
    nxt = logits[0].argmax(-1)
    chain = drafter.draft_chain(aux[None], seq, num_drafts)
    p = len(prompt)
    s = seq.shape[1]
    starts = range(p - 1, s - num_drafts - 1)  # x_{t+1} generated and target_next[t+K] exists
    out = {}
    for t in starts:
        a = 0
        while a < num_drafts and int(chain.target_ids[a, 0, t]) == int(nxt[t + a + 1]):
            a += 1
        out[t] = a
    return out


def replay(tf: dict[int, int], first: int) -> list[int]:
    """Accept lengths that real decoding would see if it accepted exactly the teacher-forced
    ``A_t``: chains start at ``first`` and then right after each round's bonus token."""
    out, t = [], first
    while t in tf:
        out.append(tf[t] + 1)
        t += tf[t] + 1
    return out


def main(argv: list[str] | None = None) -> None:
    import train_drafter
    from safetensors.torch import load_file

    from eagle3conv.model import build_drafter

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixture", type=Path, default=REPO / "tests/data/smollm2-drafter")
    ap.add_argument("--prompts", type=int, default=12, help="held-out prompts to decode")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("-K", "--num-drafts", type=int, default=3)
    ap.add_argument("--check-rounds", type=int, default=40,
                    help="rounds per prompt whose drafts are re-checked with draft_chain")
    ap.add_argument("--seed", type=int, default=0, help="the seed train_drafter.py used (prompt order)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (one avoids thread thrashing on a shared machine; "
                         "greedy and speculative runs use the same)")
    ap.add_argument("--json", type=Path, default=REPO / "bench/out/smollm2/spec_decode.json")
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    t0 = time.time()
    model, tok = common.load_target()
    config = json.loads((args.fixture / "config.json").read_text())
    drafter = build_drafter(config, load_file(str(args.fixture / "model.safetensors")),
                            embed_tokens=model.model.embed_tokens.weight.detach(), dtype=torch.float32)
    log(f"target and {type(drafter).__name__} loaded in {time.time() - t0:.1f}s")
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    items = [it for it in train_drafter.prompts(args.seed) if it["split"] == "heldout"][: args.prompts]
    rows = []
    tot = {"greedy_s": 0.0, "spec_s": 0.0}
    for it in items:
        prompt = tok.apply_chat_template([{"role": "user", "content": it["prompt"]}],
                                         add_generation_prompt=True, tokenize=True, return_dict=False)
        prompt = list(prompt)
        t = time.perf_counter()
        ref, fwd = greedy(model, prompt, args.max_new_tokens, eos)
        g_s = time.perf_counter() - t
        t = time.perf_counter()
        spec = speculative(model, drafter, prompt, args.max_new_tokens, eos, args.num_drafts,
                           args.check_rounds)
        s_s = time.perf_counter() - t
        assert spec["tokens"] == ref, f"prompt {it['id']}: speculative output differs from greedy"
        tf_map = teacher_forced(model, drafter, prompt, ref, args.num_drafts)
        tf = list(tf_map.values())
        rep = replay(tf_map, len(prompt) - 1)
        same = sum(a == b for a, b in zip(rep, spec["accepted"]))
        rounds = len(spec["accepted"])
        row = {"id": it["id"], "prompt": it["prompt"], "new_tokens": len(ref), "greedy_forwards": fwd,
               "rounds": rounds, "measured_accept_length": sum(spec["accepted"]) / rounds,
               "predicted_accept_length": 1 + sum(tf) / max(1, len(tf)), "chain_starts": len(tf),
               "replayed_rounds": len(rep), "replayed_rounds_equal": same, "replayed": rep,
               "greedy_s": round(g_s, 2), "spec_s": round(s_s, 2),
               "spec_target_s": round(spec["target_s"], 2), "spec_draft_s": round(spec["draft_s"], 2),
               "checked_rounds": spec["checked_rounds"], "identical_to_greedy": True,
               "accepted": spec["accepted"], "tf_accepts": tf,
               "text": tok.decode(ref, skip_special_tokens=True)}
        rows.append(row)
        tot["greedy_s"] += g_s
        tot["spec_s"] += s_s
        log(f"prompt {it['id']}: {len(ref)} tokens identical to greedy; {rounds} rounds, accept length "
            f"{row['measured_accept_length']:.2f} measured vs {row['predicted_accept_length']:.2f} "
            f"teacher-forced; replay of A_t at round starts equals {same}/{len(rep)} rounds; greedy {g_s:.1f}s, spec {s_s:.1f}s")
    all_acc = [a for r in rows for a in r["accepted"]]
    all_tf = [a for r in rows for a in r["tf_accepts"]]
    hist = [sum(1 for a in all_acc if a == n) for n in range(1, args.num_drafts + 2)]
    summary = {
        "fixture": args.fixture.name, "drafter_class": type(drafter).__name__,
        "prompts": len(rows), "K": args.num_drafts, "max_new_tokens": args.max_new_tokens,
        "new_tokens": sum(r["new_tokens"] for r in rows),
        "rounds": len(all_acc),
        "measured_accept_length": round(sum(all_acc) / len(all_acc), 4),
        "accept_length_histogram_1..K+1": hist,
        "predicted_accept_length_teacher_forced": round(1 + sum(all_tf) / len(all_tf), 4),
        "teacher_forced_chain_starts": len(all_tf),
        "replayed_rounds": sum(r["replayed_rounds"] for r in rows),
        "replayed_rounds_equal": sum(r["replayed_rounds_equal"] for r in rows),
        "replayed_accept_length": round(sum(sum(r["replayed"]) for r in rows)
                                        / max(1, sum(len(r["replayed"]) for r in rows)), 4),
        "greedy_s": round(tot["greedy_s"], 1), "spec_s": round(tot["spec_s"], 1),
        "spec_target_s": round(sum(r["spec_target_s"] for r in rows), 1),
        "spec_draft_s": round(sum(r["spec_draft_s"] for r in rows), 1),
        "torch_threads": args.threads,
        "identical_to_greedy": True,
        "checked_rounds": sum(r["checked_rounds"] for r in rows),
    }
    print(json.dumps(summary, indent=2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"summary": summary, "prompts": rows}, indent=2) + "\n")
    if rows:
        log(f"sample (prompt {rows[0]['id']}): {rows[0]['prompt']!r} -> {rows[0]['text'][:300]!r}")


if __name__ == "__main__":
    main()
