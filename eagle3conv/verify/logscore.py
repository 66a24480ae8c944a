"""The log score: how much probability a wiring's drafts give the target's token.

Acceptance counts whether the drafter's *argmax* is the target's token: a 0/1
outcome per position, so two good wirings that differ a little need many
thousands of positions before their acceptance separates. The log-probability
the drafter gives the target's token (the logarithmic scoring rule, a proper
scoring rule: it is best in expectation exactly for the distribution training
fits) measures the same fit on every position, with far less noise.
:func:`log_scores` computes it per wiring, per draft step and per sequence, on
the positions whose reference token is in the draft vocabulary (the same
positions for every wiring: they depend on the tokens only; a token outside the
draft vocabulary is never accepted, whatever the wiring).
``verify --search-wiring`` uses it only among wirings acceptance cannot
separate (:func:`eagle3conv.verify.search.decide`), and says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from eagle3conv.spec.layers import LayerSet


@dataclass
class LogScore:
    """Per draft step ``k`` and per sequence: the summed log-probability (nats) of the
    reference token and the positions summed (reference inside the draft vocabulary)."""

    layers: LayerSet
    logp: list[list[float]]  # [K][sequences]
    counted: list[list[int]]  # [K][sequences]
    seconds: float = 0.0

    def mean(self, step: int = 0) -> float:
        n = sum(self.counted[step])
        return sum(self.logp[step]) / n if n else 0.0


def log_scores(drafter, states, sets: list[LayerSet], *, steps: int, batch_size: int, target_embeds: bool,
               labels=None, max_sequences: int | None = None, progress=None) -> list[LogScore]:
    """The log score of each wiring in ``sets`` on the same positions :func:`evaluate` scores
    (draft step k at chain start t is scored against the reference at t+k, teacher-forced as
    :meth:`draft_chain` runs)."""
    import torch

    from eagle3conv.verify.feed import batches

    dev, dt = drafter.device, drafter.dtype
    d2t = drafter.d2t.long()
    vd = d2t.numel()
    all_ids, all_mask, all_loss = states.input_ids, states.attention_mask, states.loss_mask
    all_next = states.target_next if labels is None else labels
    vt = int(max(int(all_next.max()) + 1, int((torch.arange(vd, device=d2t.device) + d2t).max()) + 1, 1))
    t2d = torch.full((vt,), -1, dtype=torch.long, device=dev)
    t2d[(torch.arange(vd, device=d2t.device) + d2t).to(dev)] = torch.arange(vd, device=dev)
    total = states.num_sequences if max_sequences is None else min(max_sequences, states.num_sequences)
    out: list[LogScore] = []
    for j, layers in enumerate(sets):
        t0 = time.perf_counter()
        logp: list = []
        cnt: list = []
        done = 0
        for start, stop, aux_b, emb_b in batches(states, layers, total=total, batch_size=batch_size,
                                                 with_embeddings=target_embeds, device=dev, dtype=dt):
            if done >= total:
                break
            take = min(stop - start, total - done)
            rows = slice(start, start + take)
            ids = all_ids[rows].to(dev)
            mask = all_mask[rows].to(dev).bool()
            loss = all_loss[rows].to(dev).bool() & mask
            tnext = all_next[rows].to(dev).long()
            aux = aux_b[:take].to(dev).to(dt)
            B, S = ids.shape
            if target_embeds:
                emb = emb_b[:take].to(dev).to(dt)
                table = emb.reshape(B * S, -1)  # the captured embedding output, indexed by position
                run_ids = torch.arange(B * S, device=dev).view(B, S)
            else:
                table, run_ids = None, ids
            with torch.inference_mode():
                chain = drafter.draft_chain(aux, run_ids, steps, return_logits=True, embeddings=table)
                lp_b = torch.zeros(steps, B, dtype=torch.float64, device=dev)
                n_b = torch.zeros(steps, B, dtype=torch.long, device=dev)
                for k in range(1, steps + 1):
                    if k >= S:
                        continue
                    ref = tnext[:, k:]
                    draft = torch.where(ref >= 0, t2d[ref.clamp(min=0, max=vt - 1)], -1)
                    ok = loss[:, k:] & mask[:, k:] & (ref >= 0) & (draft >= 0)
                    lg = chain.logits[k - 1, :, : S - k].float()  # one fp32 copy; no full log-softmax tensor
                    got = lg.gather(-1, draft.clamp(min=0).unsqueeze(-1)).squeeze(-1) - lg.logsumexp(-1)
                    lp_b[k - 1] = torch.where(ok, got, torch.zeros_like(got)).double().sum(1)
                    n_b[k - 1] = ok.sum(1)
            logp.append(lp_b.cpu())
            cnt.append(n_b.cpu())
            done += take
        lp = torch.cat(logp, dim=1).tolist() if logp else [[] for _ in range(steps)]
        n = torch.cat(cnt, dim=1).tolist() if cnt else [[] for _ in range(steps)]
        out.append(LogScore(tuple(layers), lp, n, seconds=time.perf_counter() - t0))
        if progress:
            progress(j + 1, len(sets))
    return out


__all__ = ["LogScore", "log_scores"]
