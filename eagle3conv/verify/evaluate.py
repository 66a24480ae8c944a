"""Scoring one wiring: :class:`Candidate`, :class:`Score` and :func:`evaluate`.

For a wiring (the aux layers fed to ``fc``, in slot order) :func:`evaluate` runs
the drafter's chain over every batch of states and counts, per draft position
and per sequence, the positions scored and the drafts that match the reference
token; the chain starts' leading matches feed the greedy replay
(:func:`eagle3conv.verify.stats.replay`); per aux slot, the per-token L2 norms
(position 0 excluded). :meth:`Score.finish` turns the counts into acceptance,
accept length and their intervals (:mod:`eagle3conv.verify.stats`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from eagle3conv.io.progress import Progress
from eagle3conv.verify.stats import bootstrap, replay, wilson
from eagle3conv.spec.layers import LayerSet, describe

@dataclass
class Candidate:
    name: str
    layers: LayerSet
    why: str

@dataclass
class Score:
    candidate: Candidate
    steps: int
    matched: list[list[int]]  # [K][sequences]
    counted: list[list[int]]  # [K][sequences]
    chain_accepted: list[int]  # per sequence: sum over full chains of (1 + leading matches)
    chains: list[int]  # per sequence: full chains
    cond_matched: list[int]  # [K]: draft k matched given 1..k-1 matched
    cond_counted: list[int]
    norms: list[dict]  # per slot: median, p10, p90, tokens
    replay_accepted: list[int] = field(default_factory=list)  # per sequence: sum over greedy rounds of 1 + A
    replay_rounds: list[int] = field(default_factory=list)  # per sequence: greedy verification rounds
    seconds: float = 0.0
    ci_method: str = ""
    acceptance: list[float] = field(default_factory=list)
    acceptance_ci: list[tuple[float, float]] = field(default_factory=list)
    accept_length: float = 0.0  # tokens per target forward of greedy chain decoding (round-boundary replay)
    accept_length_ci: tuple[float, float] = (1.0, 1.0)
    accept_length_all: float = 0.0  # the same, averaged over every chain start (ranks wirings; lower variance)
    accept_length_all_ci: tuple[float, float] = (1.0, 1.0)

    @property
    def effective_sequences(self) -> int:
        """Sequences with at least one full chain: the units the intervals resample."""
        return sum(1 for c in self.chains if c > 0)

    def finish(self) -> Score:
        boot = self.effective_sequences >= 5
        self.ci_method = ("bootstrap over sequences, 95%" if boot
                          else "Wilson over positions, 95% (fewer than 5 sequences with full chains: positions "
                               "treated as independent, so the interval is too narrow)")
        self.acceptance, self.acceptance_ci = [], []
        for k in range(self.steps):
            m, n = sum(self.matched[k]), sum(self.counted[k])
            self.acceptance.append(m / n if n else 0.0)
            self.acceptance_ci.append(bootstrap(self.matched[k], self.counted[k]) if boot else wilson(m, n))

        def length(acc: list[int], den: list[int]) -> tuple[float, tuple[float, float]]:
            total, n = sum(acc), sum(den)
            if not n:
                return 1.0, (1.0, 1.0)
            if boot:
                return total / n, bootstrap(acc, den)
            lo, hi = wilson(total - n, n * self.steps)  # on the accepted-draft fraction
            return total / n, (1 + lo * self.steps, 1 + hi * self.steps)

        self.accept_length_all, self.accept_length_all_ci = length(self.chain_accepted, self.chains)
        if self.replay_rounds:
            self.accept_length, self.accept_length_ci = length(self.replay_accepted, self.replay_rounds)
        else:
            self.accept_length, self.accept_length_ci = self.accept_length_all, self.accept_length_all_ci
        return self

    @property
    def tokens(self) -> int:
        return sum(self.counted[0]) if self.counted else 0

    def to_dict(self) -> dict:
        return {
            "wiring": self.candidate.name,
            "layers": [{"output_of": r.output_of} for r in self.candidate.layers],
            "described": describe(self.candidate.layers),
            "why": self.candidate.why,
            "acceptance_per_position": [round(a, 5) for a in self.acceptance],
            "acceptance_ci95": [[round(lo, 5), round(hi, 5)] for lo, hi in self.acceptance_ci],
            "conditional_acceptance": [round(m / n, 5) if n else None
                                       for m, n in zip(self.cond_matched, self.cond_counted)],
            "accept_length": round(self.accept_length, 4),
            "accept_length_ci95": [round(x, 4) for x in self.accept_length_ci],
            "accept_length_definition": "tokens per target forward of greedy chain decoding: chains replayed "
                                        "from the first full chain of each sequence, each next round starting "
                                        "after the accepted drafts and the target's token",
            "rounds": sum(self.replay_rounds),
            "accept_length_all_starts": round(self.accept_length_all, 4),
            "accept_length_all_starts_ci95": [round(x, 4) for x in self.accept_length_all_ci],
            "positions_scored": self.tokens,
            "chains": sum(self.chains),
            "sequences": len(self.chains),
            "ci_method": self.ci_method,
            "norms": self.norms,
            "seconds": round(self.seconds, 3),
        }

def evaluate(drafter, states, candidate: Candidate, *, steps: int, batch_size: int, target_embeds: bool,
             max_sequences: int | None = None, progress: Progress | None = None, labels=None,
             feeder: bool = True) -> Score:
    """Score one wiring over the states (see the module docstring).

    Everything per position (norms, hits, chain lengths) is computed on the
    drafter's device and kept there; the host only reads batches (in a prefetch
    thread) and collects small per-sequence sums once at the end. ``feeder=False``
    reads through the plain batch path even on CUDA (the same numbers, slower).
    """
    import torch

    from eagle3conv.verify.feed import batches

    t0 = time.perf_counter()
    dev, dt = drafter.device, drafter.dtype
    k_slots = len(candidate.layers)
    T = states.hidden_size
    total = states.num_sequences if max_sequences is None else min(max_sequences, states.num_sequences)
    acc: dict[str, list] = {"matched": [], "counted": [], "chain_acc": [], "chains": [], "cond_m": [],
                            "cond_n": []}
    norm_vals: list[list] = [[] for _ in range(k_slots)]
    keeps: list = []
    starts_a: list = []  # [B, S] leading matches of the chain started at each position
    starts_full: list = []  # [B, S] chain has a reference for every draft
    done = 0
    source = batches(states, candidate.layers, total=total, batch_size=batch_size, with_embeddings=target_embeds,
                     device=dev, dtype=dt, feeder=feeder)
    all_ids, all_mask, all_loss = states.input_ids, states.attention_mask, states.loss_mask
    all_next = states.target_next if labels is None else labels  # -1: no reference token
    for start, stop, aux_b, emb_b in source:
        if done >= total:
            break
        take = min(stop - start, total - done)
        rows = slice(start, start + take)
        ids = all_ids[rows].to(dev, non_blocking=True)
        mask = all_mask[rows].to(dev, non_blocking=True).bool()
        loss = all_loss[rows].to(dev, non_blocking=True).bool() & mask
        tnext = all_next[rows].to(dev, non_blocking=True)
        aux = aux_b[:take].to(dev, non_blocking=True).to(dt)
        B, S = ids.shape
        keep = mask.clone()  # norms: real tokens, position 0 excluded (selected once, at the end)
        keep[:, 0] = False
        keeps.append(keep)
        for s in range(k_slots):  # fp32 accumulation, no upcast copy of the states
            norm_vals[s].append(torch.linalg.vector_norm(aux[..., s * T:(s + 1) * T], dim=-1,
                                                         dtype=torch.float32))
        if target_embeds:
            # The captured embedding output at position p *is* embed(x_p). Index it by position:
            # the drafter's id at (b, t) is b*S + t, so the ids it reads k steps ahead (the same row
            # shifted) land on embed(x_{t+k}). No vocabulary table, no unique(), no device sync.
            emb = emb_b[:take].to(dev, non_blocking=True).to(dt)
            drafter.embed_tokens = emb.reshape(B * S, T)
            run_ids = torch.arange(B * S, device=dev).view(B, S)
        else:
            run_ids = ids
        with torch.inference_mode():
            chain = drafter.draft_chain(aux, run_ids, steps)
        guesses = chain.target_ids  # [K, B, S] target vocab, on the device
        scored = torch.zeros(steps, B, S, dtype=torch.bool, device=dev)
        hit = torch.zeros(steps, B, S, dtype=torch.bool, device=dev)
        for k in range(1, steps + 1):  # draft k at chain start t guesses target_next[t+k]
            if k >= S:
                continue
            ok = loss[:, k:] & mask[:, k:] & (tnext[:, k:] >= 0)
            scored[k - 1, :, : S - k] = ok
            hit[k - 1, :, : S - k] = ok & (guesses[k - 1, :, : S - k] == tnext[:, k:])
        acc["matched"].append(hit.sum(2))  # [K, B]
        acc["counted"].append(scored.sum(2))
        full = scored.all(0)  # chains whose K drafts all have a reference
        lead = hit.long().cumprod(0)
        acc["chain_acc"].append(((lead.sum(0) + 1) * full).sum(1))
        starts_a.append(lead.sum(0).to(torch.int16))
        starts_full.append(full)
        acc["chains"].append(full.sum(1))
        prev = torch.cat([torch.ones(1, B, S, dtype=torch.bool, device=dev), lead[:-1].bool()])
        acc["cond_m"].append((hit & prev & full).sum((1, 2)))
        acc["cond_n"].append((prev & full).sum((1, 2)))
        done += take
        if progress:
            progress(candidate.name, done, total)
    got = {k: (torch.cat(v, dim=-1).cpu() if k in ("matched", "counted", "chain_acc", "chains")
               else torch.stack(v).sum(0).cpu()) if v else None for k, v in acc.items()}
    matched = got["matched"].tolist() if got["matched"] is not None else [[] for _ in range(steps)]
    counted = got["counted"].tolist() if got["counted"] is not None else [[] for _ in range(steps)]
    norms = []
    keep_all = torch.cat(keeps) if keeps else None
    for s in range(k_slots):
        v = torch.cat(norm_vals[s])[keep_all].double().cpu() if norm_vals[s] else torch.zeros(0)
        if v.numel() == 0:
            norms.append({"median": None, "p10": None, "p90": None, "tokens": 0})
            continue
        q = torch.quantile(v[:16_000_000], torch.tensor([0.1, 0.5, 0.9], dtype=torch.double))
        norms.append({"median": float(q[1]), "p10": float(q[0]), "p90": float(q[2]), "tokens": int(v.numel())})
    replay_acc, replay_rounds = (replay(torch.cat(starts_a).cpu().numpy(), torch.cat(starts_full).cpu().numpy())
                                 if starts_a else ([], []))
    score = Score(candidate, steps, matched, counted,
                  got["chain_acc"].tolist() if got["chain_acc"] is not None else [],
                  got["chains"].tolist() if got["chains"] is not None else [],
                  got["cond_m"].tolist() if got["cond_m"] is not None else [0] * steps,
                  got["cond_n"].tolist() if got["cond_n"] is not None else [0] * steps, norms,
                  replay_acc, replay_rounds)
    score.seconds = time.perf_counter() - t0
    return score.finish()

@dataclass
class ScreenResult:
    """Step-1 hits of many wirings on the same screening positions.

    ``hits[i]`` / ``counted``: per screening sequence, the step-1 drafts of wiring
    ``sets[i]`` that match the reference, and the positions scored (the same for
    every wiring: they depend on the tokens only)."""

    sets: list[LayerSet]
    hits: list[list[int]]
    counted: list[int]
    sequences: int
    seconds: float = 0.0
    step1: list[float] = field(default_factory=list)  # per wiring: acceptance on the rows of its last stage
    logp: list[float] = field(default_factory=list)  # per wiring: mean step-1 log-probability of the reference
    # token (in the draft vocab) on the positions of its last stage (ranks the stages with rank_by="log-score")

    positions: int = 0  # positions the last stage scored
    phase_seconds: dict = field(default_factory=dict)  # "project" (fc per slot and layer), then per stage

    def acceptance(self, i: int) -> float:
        """Wiring ``i``'s step-1 acceptance on the positions of the last stage it was scored in."""
        return self.step1[i]

def screen(drafter, states, sets: list[LayerSet], *, rows: int, target_embeds: bool, labels=None,
           stages: tuple[tuple[int, int], ...] = ((256, 160), (4096, 16)), chunk_tokens: int | None = None,
           progress: Progress | None = None, rank_by: str = "acceptance") -> tuple[ScreenResult, list[int]]:
    """Step-1 acceptance of every wiring in ``sets`` on the first ``rows`` sequences,
    by successive halving: stage ``(tokens, keep)`` scores the wirings still in on
    the first ``tokens`` real tokens (whole sequences, or the first ``tokens``
    positions of the first sequence when it is longer: attention is causal, so a
    prefix is exact) and keeps the best ``keep`` (with ties at the cut). Returns the result (hits on every row for the wirings of the last stage)
    and the indices of the wirings kept by the last stage, best first.

    Step 1's ``fc`` is linear in each slot (``fc_norm``, if configured, acts per
    slot): each slot's projection of each layer is computed once, and a wiring's
    ``fc`` output is their sum. Only the rest of step 1 (attention, MLP, head) runs
    per wiring, many wirings to a forward. ``rank_by="log-score"`` ranks each stage by the
    mean log-probability the drafter gives the reference token (positions whose token is in
    the draft vocabulary; :mod:`eagle3conv.verify.logscore`), far less noisy than step-1
    hits on the same positions, so a stage can read fewer tokens."""
    import torch
    import torch.nn.functional as F

    t0 = time.perf_counter()
    c = drafter.config
    dev, dt = drafter.device, drafter.dtype
    k_slots = len(sets[0])
    T = states.hidden_size
    refs = sorted({r for s in sets for r in s}, key=lambda r: r.output_of)
    rows = max(1, min(rows, states.num_sequences))
    ids = states.input_ids[:rows].to(dev)
    mask = states.attention_mask[:rows].to(dev).bool()
    loss = states.loss_mask[:rows].to(dev).bool() & mask
    tnext = (states.target_next if labels is None else labels)[:rows].to(dev)
    lens = mask.sum(1)
    S = int(lens.max()) if rows else 0
    ids, mask, loss, tnext = ids[:, :S], mask[:, :S], loss[:, :S], tnext[:, :S]
    B = ids.shape[0]
    ok = torch.zeros(B, S, dtype=torch.bool, device=dev)  # step 1 at t guesses target_next[t+1]
    ok[:, :S - 1] = loss[:, 1:] & mask[:, 1:] & (tnext[:, 1:] >= 0)
    ref_next = torch.zeros(B, S, dtype=tnext.dtype, device=dev)
    ref_next[:, :S - 1] = tnext[:, 1:]
    counted = ok.sum(1).cpu().tolist()
    by_log = rank_by == "log-score"
    if by_log:  # the reference token's draft id (-1: outside the draft vocab, never scored)
        d2t = drafter.d2t.long().to(dev)
        tgt = torch.arange(d2t.numel(), device=dev) + d2t
        t2d = torch.full((int(max(int(tgt.max()), int(ref_next.max()))) + 1,), -1, dtype=torch.long, device=dev)
        t2d[tgt] = torch.arange(d2t.numel(), device=dev)
        ref_draft = t2d[ref_next.long().clamp(min=0)]
        ok_lp = ok & (ref_draft >= 0)
        ref_draft = ref_draft.clamp(min=0)
    # each slot's projection of each layer: [B, S, H], in the drafter's dtype
    # (one tensor [slots, layers, B, S, H]; a wiring's fc output is a sum of one entry per slot)
    w = drafter.fc_weight
    col = {r: j for j, r in enumerate(refs)}
    proj = torch.empty(k_slots, len(refs), B, S, w.shape[0], dtype=dt, device=dev)
    emb = None
    for r in refs:
        batch = next(iter(states.batches([r], batch_size=rows, with_embeddings=target_embeds and emb is None)))
        h = batch.aux[:rows, :S].to(dev).to(dt)
        if batch.embeddings is not None:
            emb = batch.embeddings[:rows, :S].to(dev).to(dt)
        for s in range(k_slots):
            x = h
            if drafter.fc_norm:
                x = drafter.fc_norm[s] * F.rms_norm(x, (T,), eps=c.rms_norm_eps)
            torch.matmul(x, w[:, s * T:(s + 1) * T].t(), out=proj[s, col[r]])
        del h
    wiring_cols = torch.tensor([[col[r] for r in ls] for ls in sets], dtype=torch.long, device=dev)
    phases = {}
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    phases["project"] = round(time.perf_counter() - t0, 3)
    if target_embeds:  # the captured embedding output at (b, t) is embed(x_t): index it by position
        drafter.embed_tokens = emb.reshape(B * S, T)
        run_ids = torch.arange(B * S, device=dev).view(B, S)
    else:
        run_ids = ids
    # tokens read at step 1: x_{t+1} at index t (0 past the end), as draft_chain does
    tokens = torch.zeros_like(run_ids)
    tokens[:, :S - 1] = run_ids[:, 1:]
    hits: list[list[int] | None] = [None] * len(sets)
    step1 = [0.0] * len(sets)
    logp = [0.0] * len(sets)
    alive = list(range(len(sets)))
    total_work = sum(len(sets) if j == 0 else keep for j, (_, keep) in enumerate(stages))
    done = 0
    if chunk_tokens is None:
        chunk_tokens = 65536 if dev.type == "cuda" else 8192
    cum = lens.cumsum(0).tolist()
    for want, keep in stages:
        n = next((j + 1 for j, c in enumerate(cum) if c >= want), B)
        Sj = min(S, want) if n == 1 else S
        per = max(1, chunk_tokens // max(1, n * Sj))
        got: dict[int, list[int]] = {}
        lps: dict[int, float] = {}
        for a in range(0, len(alive), per):
            part = alive[a:a + per]
            cols = wiring_cols[part]  # [P, slots]: each slot's layer; sum in slot order (as sum() did)
            g = proj[0, cols[:, 0], :n, :Sj]
            for s in range(1, k_slots):
                g = g + proj[s, cols[:, s], :n, :Sj]
            if drafter.fc_bias is not None:
                g = g + drafter.fc_bias
            g = g.reshape(len(part) * n, Sj, -1)
            with torch.inference_mode():
                out = drafter.forward(g, tokens[:n, :Sj].repeat(len(part), 1))
            hit = (out.target_ids.view(len(part), n, Sj) == ref_next[:n, :Sj]) & ok[:n, :Sj]
            for i, row in zip(part, hit.sum(2).cpu().tolist()):
                got[i] = row
            if by_log:
                lg = out.logits.view(len(part), n, Sj, -1).float()
                lp = lg.gather(-1, ref_draft[:n, :Sj].expand(len(part), n, Sj).unsqueeze(-1)).squeeze(-1)
                lp = torch.where(ok_lp[:n, :Sj], lp - torch.logsumexp(lg, -1), 0.0)  # no inf * 0 at padding
                for i, v in zip(part, lp.sum((1, 2)).tolist()):
                    lps[i] = v
            done += len(part)
            if progress:
                progress(min(done, total_work), total_work)
        den = int(ok[:n, :Sj].sum())
        phases[f"stage {len(phases)}: {len(got)} wirings x {n * Sj} positions"] = round(
            time.perf_counter() - t0 - sum(phases.values()), 3)
        den_lp = int(ok_lp[:n, :Sj].sum()) if by_log else 0
        for i, row in got.items():
            hits[i] = row
            step1[i] = sum(row) / den if den else 0.0
            if by_log:
                logp[i] = lps[i] / den_lp if den_lp else 0.0

        def stat(i: int) -> float:
            return lps[i] if by_log else sum(got[i])

        ranked = sorted(alive, key=lambda i: -stat(i))
        if len(ranked) > keep:
            cut = stat(ranked[keep - 1])
            ranked = [i for i in ranked if stat(i) >= cut]
        alive = ranked
    full = [h if h is not None and len(h) == B else [0] * B for h in hits]  # last-stage rows only
    res = ScreenResult(sets=list(sets), hits=full, counted=counted, sequences=B,
                       seconds=time.perf_counter() - t0, step1=step1, positions=den, phase_seconds=phases,
                       logp=logp)
    return res, alive

__all__ = ["Candidate", "Score", "ScreenResult", "evaluate", "screen"]
