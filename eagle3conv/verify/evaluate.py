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

import bisect
import math
import time
from dataclasses import asdict, dataclass, field

from eagle3conv.io.progress import Progress
from eagle3conv.verify.stats import bootstrap, excluded_at, replay_histogram, t_quantile, wilson
from eagle3conv.spec.layers import LayerSet, describe

@dataclass
class Candidate:
    name: str
    layers: LayerSet
    why: str
    record: bool = False  # the wiring the training record names: decisions read this, never the name

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
    replay_hist: list[list[int]] = field(default_factory=list)  # per sequence: rounds by accept length 1..K+1
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

class _Tally:
    """One wiring's counts over the batches of :func:`evaluate` (or :func:`evaluate_many`): per
    batch :meth:`add` the norms of its slots and its guesses against the references, then
    :meth:`score`. The per-position figures stay on the device until :meth:`score`."""

    def __init__(self, candidate: Candidate, steps: int, device) -> None:
        import torch

        self.candidate, self.steps = candidate, steps
        k_slots = len(candidate.layers)
        self.acc: dict[str, list] = {"matched": [], "counted": [], "chain_acc": [], "chains": [], "cond_m": [],
                                     "cond_n": []}
        self.norm_vals: list[list] = [[] for _ in range(k_slots)]
        self.finite = torch.ones(k_slots + 1, dtype=torch.bool, device=device)  # per slot, then the embeddings
        self.keeps: list = []
        self.starts_a: list = []  # [B, S] leading matches of the chain started at each position
        self.starts_full: list = []  # [B, S] chain has a reference for every draft

    def add(self, batch: _Batch, norms: list, finite, guesses) -> None:
        """One batch: its slots' per-token norms (``[B, S]`` each), whether each slot's values are
        finite at the real tokens (``finite`` ``[k]``, or None unchecked), and the guesses ``[K, B, S]``
        (target vocab, -1: a chain not drafted)."""
        import torch

        steps, (B, S) = self.steps, batch.ids.shape
        dev = guesses.device
        self.keeps.append(batch.keep)
        for s, v in enumerate(norms):
            self.norm_vals[s].append(v)
        if finite is not None:
            self.finite[:len(norms)] &= finite
            if batch.emb_finite is not None:
                self.finite[len(norms):] &= batch.emb_finite
        scored, tnext = batch.scored, batch.tnext
        hit = torch.zeros(steps, B, S, dtype=torch.bool, device=dev)
        for k in range(1, steps + 1):
            if k < S:
                hit[k - 1, :, : S - k] = scored[k - 1, :, : S - k] & (guesses[k - 1, :, : S - k] == tnext[:, k:])
        acc = self.acc
        acc["matched"].append(hit.sum(2))  # [K, B]
        acc["counted"].append(scored.sum(2))
        full = batch.full  # chains whose K drafts all have a reference
        lead = hit.long().cumprod(0)
        acc["chain_acc"].append(((lead.sum(0) + 1) * full).sum(1))
        self.starts_a.append(lead.sum(0).to(torch.int16))
        self.starts_full.append(full)
        acc["chains"].append(full.sum(1))
        prev = torch.cat([torch.ones(1, B, S, dtype=torch.bool, device=dev), lead[:-1].bool()])
        acc["cond_m"].append((hit & prev & full).sum((1, 2)))
        acc["cond_n"].append((prev & full).sum((1, 2)))

    def score(self, states, t0: float) -> Score:
        """The wiring's :class:`Score` (states refused where a value read was not finite)."""
        import torch

        steps, acc = self.steps, self.acc
        _refuse_non_finite_states(self.finite.cpu().tolist(), self.candidate, states)  # reduced once, at the end
        got = {k: (torch.cat(v, dim=-1).cpu() if k in ("matched", "counted", "chain_acc", "chains")
                   else torch.stack(v).sum(0).cpu()) if v else None for k, v in acc.items()}
        matched = got["matched"].tolist() if got["matched"] is not None else [[] for _ in range(steps)]
        counted = got["counted"].tolist() if got["counted"] is not None else [[] for _ in range(steps)]
        norms = []
        keep_all = torch.cat(self.keeps) if self.keeps else None
        for vals in self.norm_vals:
            v = torch.cat(vals)[keep_all].double().cpu() if vals else torch.zeros(0)
            if v.numel() == 0:
                norms.append({"median": None, "p10": None, "p90": None, "tokens": 0})
                continue
            q = torch.quantile(v[:16_000_000], torch.tensor([0.1, 0.5, 0.9], dtype=torch.double))
            norms.append({"median": float(q[1]), "p10": float(q[0]), "p90": float(q[2]), "tokens": int(v.numel())})
        hist = (replay_histogram(torch.cat(self.starts_a).cpu().numpy(), torch.cat(self.starts_full).cpu().numpy(),
                                 steps) if self.starts_a else [])  # the greedy replay's rounds by length (replay())
        replay_acc = [sum((n + 1) * c for n, c in enumerate(h)) for h in hist]
        replay_rounds = [sum(h) for h in hist]
        score = Score(self.candidate, steps, matched, counted,
                      got["chain_acc"].tolist() if got["chain_acc"] is not None else [],
                      got["chains"].tolist() if got["chains"] is not None else [],
                      got["cond_m"].tolist() if got["cond_m"] is not None else [0] * steps,
                      got["cond_n"].tolist() if got["cond_n"] is not None else [0] * steps, norms,
                      replay_acc, replay_rounds, hist)
        score.seconds = time.perf_counter() - t0
        return score.finish()


@dataclass
class _Batch:
    """What every wiring shares of one batch of sequences: ids, masks and references on the device,
    the positions scored per draft step, the chain starts to draft (None: all), the table the ids
    index (the captured embeddings, else None) and the ids the drafter reads."""

    ids: object
    mask: object
    tnext: object
    keep: object  # [B, S] the tokens whose norms count: real ones, position 0 excluded
    scored: object  # [K, B, S] draft k at chain start t has a reference to be compared with
    full: object  # [B, S] the chain started at t has a reference for every draft
    starts: object  # the chain starts drafted on a CPU (None: every one)
    table: object
    run_ids: object
    emb_finite: object = None  # [1] whether the embeddings read are finite at the real tokens (None: unchecked)


def _batch(drafter, states, rows: slice, emb_b, *, steps: int, target_embeds: bool, labels, check_finite: bool,
           dev, dt) -> _Batch:
    """The shared part of one batch (:class:`_Batch`)."""
    import torch

    all_next = states.target_next if labels is None else labels  # -1: no reference token
    ids = states.input_ids[rows].to(dev, non_blocking=True)
    mask = states.attention_mask[rows].to(dev, non_blocking=True).bool()
    loss = states.loss_mask[rows].to(dev, non_blocking=True).bool() & mask
    tnext = all_next[rows].to(dev, non_blocking=True)
    B, S = ids.shape
    keep = mask.clone()  # norms: real tokens, position 0 excluded (selected once, at the end)
    keep[:, 0] = False
    emb_finite = None
    if target_embeds:
        # The captured embedding output at position p *is* embed(x_p). Index it by position:
        # the drafter's id at (b, t) is b*S + t, so the ids it reads k steps ahead (the same row
        # shifted) land on embed(x_{t+k}). No vocabulary table, no unique(), no device sync.
        emb = emb_b[:B].to(dev, non_blocking=True).to(dt)
        if check_finite:  # a token's sum is NaN or Inf when one of its values is: one reduction
            emb_finite = _finite_at(emb.sum(-1, dtype=torch.float32)[..., None, None], mask)
        table = emb.reshape(B * S, -1)
        run_ids = torch.arange(B * S, device=dev).view(B, S)
    else:
        table, run_ids = None, ids
    scored = torch.zeros(steps, B, S, dtype=torch.bool, device=dev)
    for k in range(1, steps + 1):  # draft k at chain start t guesses target_next[t+k]
        if k < S:
            scored[k - 1, :, : S - k] = loss[:, k:] & mask[:, k:] & (tnext[:, k:] >= 0)
    # on a CPU, the chains to draft: the starts where some draft is scored in some row (the prompt's
    # are not); step 1's keys are still computed everywhere (on a GPU every chain: no read-back)
    starts = scored.any(0).any(0).nonzero().flatten() if drafter.drafts_columns and dev.type == "cpu" else None
    if starts is not None and starts.numel() == S:
        starts = None
    return _Batch(ids, mask, tnext, keep, scored, scored.all(0), starts, table, run_ids, emb_finite)


def _slot_norms(aux, k_slots: int, T: int, mask, check_finite: bool):
    """Per slot of ``aux`` ``[B, S, k*T]``: each token's L2 norm (fp32 accumulation, no upcast copy
    of the states), and whether every value read is finite at the real tokens (None unchecked)."""
    import torch

    acc = torch.promote_types(aux.dtype, torch.float32)  # fp32 (fp64 states stay fp64)
    vals = [torch.linalg.vector_norm(aux[..., s * T:(s + 1) * T], dim=-1, dtype=acc) for s in range(k_slots)]
    # a NaN or Inf makes its token's norm one: on the device, no sync
    finite = _finite_at(torch.stack(vals, -1)[..., None], mask) if check_finite else None
    return vals, finite


def evaluate(drafter, states, candidate: Candidate, *, steps: int, batch_size: int, target_embeds: bool,
             max_sequences: int | None = None, progress: Progress | None = None, labels=None,
             feeder: bool = True, check_finite: bool = True) -> Score:
    """Score one wiring over the states (see the module docstring).

    Everything per position (norms, hits, chain lengths) is computed on the
    drafter's device and kept there; the host only reads batches (in a prefetch
    thread) and collects small per-sequence sums once at the end. ``feeder=False``
    reads through the plain batch path even on CUDA (the same numbers, slower).
    ``check_finite``: refuse the states when one value read is NaN or infinite (off only to
    measure what the check costs, bench/finite_check.py).
    """
    import torch

    from eagle3conv.verify.feed import batches

    t0 = time.perf_counter()
    dev, dt = drafter.device, drafter.dtype
    k_slots = len(candidate.layers)
    T = states.hidden_size
    total = states.num_sequences if max_sequences is None else min(max_sequences, states.num_sequences)
    tally = _Tally(candidate, steps, dev)
    done = 0
    source = batches(states, candidate.layers, total=total, batch_size=batch_size, with_embeddings=target_embeds,
                     device=dev, dtype=dt, feeder=feeder)
    for start, stop, aux_b, emb_b in source:
        if done >= total:
            break
        take = min(stop - start, total - done)
        b = _batch(drafter, states, slice(start, start + take), emb_b, steps=steps, target_embeds=target_embeds,
                   labels=labels, check_finite=check_finite, dev=dev, dt=dt)
        aux = aux_b[:take].to(dev, non_blocking=True).to(dt)
        norms, finite = _slot_norms(aux, k_slots, T, b.mask, check_finite)
        B, S = b.ids.shape
        if b.starts is not None and b.starts.numel() == 0:  # nothing scored in this batch: nothing to draft
            guesses = torch.full((steps, B, S), -1, dtype=torch.long, device=dev)
        else:
            with torch.inference_mode():
                chain = drafter.draft_chain(aux, b.run_ids, steps, embeddings=b.table, columns=b.starts)
            guesses = _at_starts(chain.target_ids, b.starts, S)
        tally.add(b, norms, finite, guesses)
        done += take
        if progress:
            progress(candidate.name, done, total)
    return tally.score(states, t0)


def evaluate_many(drafter, states, candidates: list[Candidate], *, steps: int, batch_size: int, target_embeds: bool,
                  max_sequences: int | None = None, progress: Progress | None = None, labels=None,
                  check_finite: bool = True, memory_bytes: int | None = None) -> list[Score]:
    """Score several wirings (of one slot count) in one pass over the states: per wiring what
    :func:`evaluate` gives, up to rounding (fc's and the attention input's sums reassociated;
    tests/test_evaluate_many.py holds the two together).

    What no wiring changes is done once per batch: reading it, the positions scored, every layer's
    norms, each slot's fc projection of each layer read, the embedding half of q, k, v at every step
    (teacher forcing: the chains read the reference tokens) and, while more wirings than slot-layer
    pairs are in, each pair's share of the hidden half at step 1 (:class:`_SplitStep`). Per wiring:
    the sums, attention, o_proj, the MLP and the head, as :meth:`_SplitStep.chain`. Where that split
    is not the drafter's step (MLA, later layers, per-head norms, parallel drafting), off a CPU
    (measured there only: bench/README.md, issue 30 sixth round) or for one wiring, each is
    :func:`evaluate`'d in turn. ``memory_bytes`` (default 1 GiB) bounds the projections one pass holds
    (each slot's of each layer its wirings read): the wirings are taken in passes that fit. A score's ``seconds`` is its share
    of its pass."""
    kw = dict(steps=steps, batch_size=batch_size, target_embeds=target_embeds, max_sequences=max_sequences,
              progress=progress, labels=labels, check_finite=check_finite)
    k_slots = len(candidates[0].layers) if candidates else 0
    split = _SplitStep.of(drafter)
    if (len(candidates) < 2 or split is None or not drafter.drafts_columns or drafter.device.type != "cpu"
            or not drafter.step1_factors or any(len(c.layers) != k_slots for c in candidates)):
        return [evaluate(drafter, states, c, **kw) for c in candidates]
    import torch

    memory_bytes = (1 << 30) if memory_bytes is None else memory_bytes
    elt = torch.empty(0, dtype=drafter.dtype).element_size()
    # one slot's projection of one layer (and its share of the hidden half) for a batch
    per_entry = batch_size * states.input_ids.shape[1] * (drafter.config.hidden_size + split.width) * elt
    passes: list[list[Candidate]] = [[]]
    layers: set = set()
    for c in candidates:  # in order, a pass taking wirings while k x their layers' projections fit
        more = layers | set(c.layers)
        if passes[-1] and k_slots * len(more) * per_entry > memory_bytes:
            passes.append([])
            more = set(c.layers)
        passes[-1].append(c)
        layers = more
    out: list[Score] = []
    for group in passes:  # consecutive: the scores come back in the order given
        out += (_evaluate_pass(drafter, split, states, group, **kw) if len(group) > 1
                else [evaluate(drafter, states, group[0], **kw)])
    return out


def _evaluate_pass(drafter, split: _SplitStep, states, candidates: list[Candidate], *, steps: int, batch_size: int,
                   target_embeds: bool, max_sequences: int | None, progress, labels, check_finite: bool) -> list[Score]:
    """:func:`evaluate_many`'s one pass over the states for ``candidates``."""
    import torch
    import torch.nn.functional as F

    from eagle3conv.verify.feed import batches

    t0 = time.perf_counter()
    dev, dt = drafter.device, drafter.dtype
    k_slots = len(candidates[0].layers)
    T = states.hidden_size
    total = states.num_sequences if max_sequences is None else min(max_sequences, states.num_sequences)
    refs = sorted({r for c in candidates for r in c.layers}, key=lambda r: r.output_of)
    col = {r: j for j, r in enumerate(refs)}
    wirings = [[col[r] for r in c.layers] for c in candidates]
    slot_used = [{w[s] for w in wirings} for s in range(k_slots)]
    pre = len(candidates) > sum(len(x) for x in slot_used)  # each pair through W_h w: less work than per wiring
    tallies = [_Tally(c, steps, dev) for c in candidates]
    label = f"{len(candidates)} wirings"
    done = 0
    for start, stop, aux_b, emb_b in batches(states, tuple(refs), total=total, batch_size=batch_size,
                                             with_embeddings=target_embeds, device=dev, dtype=dt):
        if done >= total:
            break
        take = min(stop - start, total - done)
        b = _batch(drafter, states, slice(start, start + take), emb_b, steps=steps, target_embeds=target_embeds,
                   labels=labels, check_finite=check_finite, dev=dev, dt=dt)
        B, S = b.ids.shape
        nothing = b.starts is not None and b.starts.numel() == 0  # nothing scored in this batch: nothing to draft
        if not nothing:
            split.positions(drafter, S, dev)
        norms, finite, msq = {}, {}, {}
        # each slot's projection of each layer (and its share of the hidden half): one table, so that a
        # wiring's sum is one gather-and-sum in fp32 (slot_sum), rounded once as fc's matmul rounds it
        proj = None if nothing else torch.empty(k_slots, len(refs), B, S, drafter.config.hidden_size, dtype=dt,
                                                 device=dev)
        lins = torch.empty(k_slots, len(refs), B, S, split.width, dtype=dt, device=dev) if pre and not nothing else None
        for j, ref in enumerate(refs):  # each layer read once: its norms, and each slot's projection of it
            h = aux_b[:take, :, j * T:(j + 1) * T].to(dev, non_blocking=True).to(dt)
            norms[j] = torch.linalg.vector_norm(h, dim=-1, dtype=torch.promote_types(h.dtype, torch.float32))
            if check_finite:
                finite[j] = _finite_at(norms[j][..., None, None], b.mask)
            if nothing:
                continue
            msq[j] = drafter.slot_sq_mean(h)
            for s in range(k_slots):
                if j in slot_used[s]:
                    drafter.slot_projection(h, s, out=proj[s, j])
                    if pre:  # and its share of the attention input's hidden half, RoPE'd
                        torch.matmul(proj[s, j], split.w_hid.t(), out=lins[s, j])
                        split.rope(lins[s, j])
            del h
        later = None
        if not nothing:
            tokens = torch.zeros_like(b.run_ids)  # tokens read at step 1: x_{t+1} at index t
            tokens[:, :S - 1] = b.run_ids[:, 1:]
            qi = b.starts if b.starts is not None else torch.arange(S, device=dev)
            split.begin(drafter, tokens, qi, roped=pre, embeddings=b.table)
            later = split.later_halves(drafter, b.run_ids, steps, b.table)
        for w, tally in zip(wirings, tallies, strict=True):
            if nothing:
                guesses = torch.full((steps, B, S), -1, dtype=torch.long, device=dev)
            else:
                sq = None if msq[w[0]] is None else [msq[w[s]] for s in range(k_slots)]
                part = torch.tensor([w], dtype=torch.long, device=dev)
                g = drafter.combine([slot_sum(proj, part)[0]], sq)
                lin = (drafter.combine([slot_sum(lins, part)[0]], sq, bias=split.fc_bias_at) if pre
                       else F.linear(g, split.w_hid))
                with torch.inference_mode():
                    guesses = _at_starts(split.chain(drafter, g, lin, steps, later), b.starts, S)
                del g, lin
            fin = torch.cat([finite[w[s]] for s in range(k_slots)]) if check_finite else None
            tally.add(b, [norms[w[s]] for s in range(k_slots)], fin, guesses)
        del proj, lins, later
        done += take
        if progress:
            progress(label, done, total)
    scores = [t.score(states, t0) for t in tallies]
    share = (time.perf_counter() - t0) / len(scores)
    for sc in scores:
        sc.seconds = share
    return scores


def _at_starts(target_ids, starts, S: int):
    """The guesses ``[K, B, S]`` of chains drafted at ``starts`` only (-1 elsewhere; None: every start)."""
    import torch

    if starts is None:
        return target_ids
    K, B = target_ids.shape[:2]
    return torch.full((K, B, S), -1, dtype=target_ids.dtype, device=target_ids.device).index_copy_(2, starts, target_ids)


@dataclass(frozen=True)
class ScreenBound:
    """When :func:`screen` drops a wiring, and how it spends positions (docs/facts.md §12).

    The screen's score is the step-1 log score: per scored position, the log-probability
    the drafter gives the reference token (positions whose token is in the draft
    vocabulary). Stage j reads the first ``first * growth**j`` scored positions (whole
    sequences from the start of the states; a prefix of the first sequence while it holds
    enough), every stage adding only new positions, up to ``max_positions``. After a stage,
    with L the wiring of the highest mean and, for wiring i, D the mean over the stage's
    positions of L's score minus i's, i leaves when

        D - q * se(D) > margin

    where se is the standard error of that paired mean over blocks (:func:`paired_bound`:
    runs of up to ``unit`` positions of one sequence once ``min_units`` of them are read;
    before that, runs of ``min(16, positions // 64)`` positions, the error widened for what
    the positions of a unit may share, ``rho``), and q the Student t quantile at
    ``1 - alpha_l / (w * stages)`` with (blocks - 1) degrees of freedom, w the wirings in the
    stage: Bonferroni over every comparison of this *leader test*. After the first ``pilot``
    stages, the leader then is the *reference* R, fixed; every later stage also drops i when
    R's mean minus i's, on the sequences after the pilot's last one only, exceeds its bound
    at ``1 - alpha_r / (later stages)``: R was chosen on other sequences, so no Bonferroni
    over the wirings is owed (this *reference test* is the one that excludes the many
    wirings a little below the best). ``alpha_r = ref_share * alpha``, ``alpha_l`` the rest
    (all of ``alpha`` when no stage follows the pilot). *Priors*, wirings named before any data
    is read (a search's evidence: the config's, the record's, the engine defaults), are
    references from the first stage on, over every position read, each stage at
    ``1 - alpha_p / (priors * stages)``: chosen before the data, they owe no Bonferroni over the
    wirings either; ``alpha_p = prior_share * alpha`` when there are priors, the two tests above
    sharing the rest as they share ``alpha`` without. A wiring whose expected score is the
    best is therefore dropped with probability at most ``alpha`` (under the t approximation
    for block means, sequences independent). The work cap: the screen stops (its survivors
    all kept) before a stage would take its work (wirings x positions scored) past
    ``max_work`` passes of every wiring over the first stage plus ``max_tail`` wirings over
    every position; the result says so."""

    alpha: float = 0.01
    margin: float = 0.0  # nats per position the leader must lead by beyond the bound
    unit: int = 256  # positions of one sequence taken together (a whole sequence when shorter)
    min_units: int = 20  # from this many units read, the blocks are units
    rho: float = 0.01  # before that: the correlation allowed for between positions of one unit
    first: int = 64  # scored positions of the first stage
    growth: float = 2.0
    max_positions: int = 32768  # scored positions the screen reads at most
    max_work: float = 4.0
    max_tail: float = 400.0
    seconds: float | None = None  # the screen's time budget (verify --search-budget); None: the work cap
    pilot: int = 3  # stages before the reference is fixed (the leader after them)
    ref_share: float = 0.5  # the share of alpha the reference test spends (the leader test the rest)
    prior_share: float = 0.2  # the share of alpha the priors' test spends, when a screen has priors

    def quantile(self, tests: int, blocks: int, alpha: float | None = None) -> float:
        """The bound's multiplier for ``tests`` comparisons over ``blocks`` blocks (at ``alpha``,
        default the bound's own)."""
        alpha = self.alpha if alpha is None else alpha
        if blocks < 2 or alpha <= 0:
            return math.inf
        return t_quantile(1.0 - alpha / max(1, tests), blocks - 1)

    def split(self, stages: int, priors: int = 0) -> tuple[float, float, float]:
        """The leader test's, the reference test's and the priors' test's alpha for a screen of
        ``stages`` stages with ``priors`` priors (no reference test when none follows the pilot,
        no priors' test without priors)."""
        a_prior = self.alpha * self.prior_share if priors else 0.0
        rest = self.alpha - a_prior
        if stages <= self.pilot:
            return rest, 0.0, a_prior
        return rest * (1.0 - self.ref_share), rest * self.ref_share, a_prior

    @staticmethod
    def block_size(positions: int) -> int:
        return max(1, min(16, positions // 64))

    def stages(self, total: int) -> list[int]:
        """Scored positions read by each stage, the last one all of ``total`` (capped)."""
        total = min(total, self.max_positions)
        out, p = [], max(1, self.first)
        while p < total:
            out.append(int(p))
            p = max(p + 1, int(math.ceil(p * self.growth)))
        out.append(total)
        return out

    def to_dict(self) -> dict:
        return asdict(self)


NO_DROP = ScreenBound(alpha=0.0, max_work=math.inf, max_tail=math.inf)  # every wiring scored on every position (tests, oracles)


@dataclass
class ScreenResult:
    """What :func:`screen` measured.

    Per wiring ``i`` of ``sets``: ``logp[i]`` (mean step-1 log score) and ``step1[i]``
    (step-1 acceptance) on the ``reached[i]`` positions it was scored on before it left
    (or on all the screen read, for ``alive``); ``hits[i]``: its step-1 hits per screened
    sequence (sequences it never reached: 0); ``counted``: the step-1 positions scored per
    sequence (the same for every wiring). ``alive``: the wirings the screen kept, best
    first; ``stages``: per stage, the positions, blocks, wirings in and kept, the bound's
    multiplier and the leader; ``complete``: False when ``max_work`` stopped the screen
    before the data excluded what it kept."""

    sets: list[LayerSet]
    hits: list[list[int]]
    counted: list[int]
    sequences: int
    seconds: float = 0.0
    step1: list[float] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    positions: int = 0  # step-1 positions the screen read
    phase_seconds: dict = field(default_factory=dict)  # "project" (fc per slot and layer), then per stage
    alive: list[int] = field(default_factory=list)
    reached: list[int] = field(default_factory=list)
    stages: list[dict] = field(default_factory=list)
    complete: bool = True
    work: int = 0  # wiring x scored positions
    bound: ScreenBound | None = None
    vectors: list = field(default_factory=list)  # per wiring: its log score per position scored (CPU)
    hit_vectors: list = field(default_factory=list)  # per wiring: its step-1 hit per position scored (CPU)
    pos_row: list[int] = field(default_factory=list)  # the sequence of each position, in the order read
    tests: int = 0  # the comparisons the bound allows for (wirings x stages)
    total: int = 0  # the log-scored positions of the rows screened (a vector this long is complete)
    stopped_by: str | None = None  # "work" (the work cap) or "seconds" (the time budget); None: the data decided
    cap: float = 0.0  # the work cap (wiring x positions)
    to_finish: dict | None = None  # when stopped: the work and seconds that reading every position would take

    def log_score(self, i: int):
        """Wiring ``i``'s step-1 log score per sequence (a
        :class:`~eagle3conv.verify.logscore.LogScore`) when the screen read it on every position
        of its rows, else None."""
        import torch

        from eagle3conv.verify.logscore import LogScore

        v = self.vectors[i] if i < len(self.vectors) else None
        if v is None or len(v) != self.total or not self.total:
            return None
        rows = torch.tensor(self.pos_row, dtype=torch.long)
        lp = torch.zeros(self.sequences, dtype=torch.float64).index_add_(0, rows, v.double())
        n = torch.bincount(rows, minlength=self.sequences)
        return LogScore(tuple(self.sets[i]), [lp.tolist()], [n.tolist()])

    def acceptance(self, i: int) -> float:
        """Wiring ``i``'s step-1 acceptance on the positions it was scored on."""
        return self.step1[i]

    def excluded(self, i: int, ref: int, tests: int | None = None) -> bool:
        """Whether the data the screen read excludes wiring ``i`` against wiring ``ref`` with the
        screen's bound, on the positions both were scored on (the screen reads positions in one
        order, so those are the first ``min(reached)`` of them). ``tests``: the comparisons of
        the family this one belongs to (default: the screen's own)."""
        import torch

        a, b = self.vectors[ref], self.vectors[i]
        if a is None or b is None or self.bound is None:
            return False
        n = min(len(a), len(b))
        if n < 2:
            return False
        D, se, m = paired_bound(torch.stack([a[:n], b[:n]]), 0, self.pos_row[:n], self.bound)
        return excluded_at(float(D[1]) - self.bound.margin, float(se[1]), m, self.bound.alpha,
                           self.tests if tests is None else tests)


def paired_bound(lp, lead, pos_row: list[int], bound: ScreenBound | None = None):
    """For log scores ``lp`` [wirings, positions] (positions in the order read, ``pos_row``
    their sequences): each wiring's mean difference from wiring ``lead`` (lead minus it), its
    standard error, and the number of blocks it was estimated over (a ratio estimator, blocks
    taken as independent). ``lead`` a sequence of wirings: the differences from each, ``[leads,
    wirings]``, over the same blocks (summed into blocks once). The blocks are *units* -- runs of up to ``bound.unit`` consecutive
    positions of one sequence, a whole sequence when shorter -- once ``bound.min_units`` of
    them are read; before that, runs of :meth:`ScreenBound.block_size` positions, the error
    multiplied by ``sqrt(1 + (n - 1) * bound.rho)`` (n the positions per unit read) for what
    the positions of one unit may share."""
    import torch

    bound = bound or ScreenBound()
    n_pos = lp.shape[1]
    rows_t = torch.tensor(pos_row, dtype=torch.long)
    nrows = int(rows_t.max()) + 1 if n_pos else 1
    per = torch.bincount(rows_t, minlength=nrows)
    first_of_row = torch.zeros(nrows + 1, dtype=torch.long)
    first_of_row[1:] = per.cumsum(0)
    rank = torch.arange(n_pos) - first_of_row[rows_t]

    def runs(b: int):
        nblk_row = (per + b - 1) // b
        off = torch.zeros(nrows, dtype=torch.long)
        off[1:] = nblk_row.cumsum(0)[:-1]
        return off[rows_t] + rank // b, int(nblk_row.sum())

    blk, m = runs(bound.unit)
    inflate = 1.0
    if int((torch.bincount(blk, minlength=m) > 0).sum()) < bound.min_units:
        inflate = math.sqrt(1.0 + (n_pos / max(1, int((torch.bincount(blk, minlength=m) > 0).sum())) - 1.0)
                            * bound.rho)
        blk, m = runs(ScreenBound.block_size(n_pos))
    X = torch.zeros(lp.shape[0], m, dtype=torch.float64).index_add_(1, blk, lp.double())
    C = torch.bincount(blk, minlength=m).double()
    X, C = X[:, C > 0], C[C > 0]
    m = int(C.numel())
    N = max(float(C.sum()), 1.0)
    one = isinstance(lead, int)
    d = X[[lead] if one else list(lead)][:, None, :] - X[None]  # [leads, wirings, blocks]
    D = d.sum(-1) / N
    r_ = d - D[..., None] * C
    se = (r_.pow(2).sum(-1) * (m / max(1, m - 1))).sqrt() / N * inflate
    return (D[0], se[0], m) if one else (D, se, m)



class ScreenReference:
    """The screen's reference test (:class:`ScreenBound`): wiring ``index`` (the leader after the
    pilot's stages, fixed), compared with every wiring still in on the sequences after ``last_row``
    (the pilot's last, partly read or not) only, each stage at ``alpha`` (the reference test's
    share over the stages after the pilot)."""

    def __init__(self, index: int, last_row: int, alpha: float, bound: ScreenBound) -> None:
        self.index, self.last_row, self.alpha, self.bound = index, last_row, alpha, bound

    def test(self, lp_store, alive: list[int], pos_row: list[int]) -> dict | None:
        """Per wiring in ``alive`` (rows of ``lp_store``, positions in read order, rows ascending),
        whether the reference's lead over it on the sequences after the pilot exceeds the bound;
        None while the reference is out or those sequences hold too little."""
        if self.index not in alive:
            return None
        start = bisect.bisect_right(pos_row, self.last_row)  # positions are read row after row
        if len(pos_row) - start < 2:
            return None
        D, se, m = paired_bound(lp_store[:, start:], alive.index(self.index), pos_row[start:], self.bound)
        q = self.bound.quantile(1, m, self.alpha)
        if not math.isfinite(q):
            return None
        drop = D - q * se > self.bound.margin
        return {"drop": drop, "positions": len(pos_row) - start, "sequences": len(set(pos_row[start:])),
                "blocks": m, "quantile": round(q, 3), "excluded": int(drop.sum())}


class _SplitStep:
    """Step 1 of a one-layer Llama-attention drafter, split at what a wiring changes.

    The attention input is ``cat(input_layernorm(embed), hidden_norm(g))`` and q, k, v one
    linear map of it, so ``[q; k; v] = W_e input_layernorm(embed) + r * (W_h hidden_norm.w) g``
    (+ bias), ``r`` the 1/rms of ``g`` (one scalar per position and wiring). The embedding
    half (``E``) is the same for every wiring: computed once per group; ``(W_h w) g`` is
    linear in ``g`` = the sum of the slots' fc projections, so it is the sum of each slot's
    projection of its layer through ``W_h w`` (computed once per layer and slot, like the fc
    projections). Per wiring: sums, one scalar per position, RoPE and attention; then o_proj,
    the MLP and the head (the drafter's own :meth:`finish`) on the positions scored only.
    The same numbers as the drafter's forward up to rounding (the sums are reassociated)."""

    def __init__(self, drafter) -> None:
        import torch

        c = drafter.config
        H = c.hidden_size
        w = torch.cat([drafter.q_proj, drafter.k_proj, drafter.v_proj])  # [q + k + v, 2H]: embedding half first
        self.dq, self.dk = drafter.q_proj.shape[0], drafter.k_proj.shape[0]
        self.width = w.shape[0]
        self.w_emb = w[:, :H].contiguous()
        self.w_hid = (w[:, H:].float() * drafter.hidden_norm.float()).to(w.dtype).contiguous()
        self.w_hid_raw = w[:, H:].contiguous()  # later steps: hidden_norm as the drafter applies it, then this
        self.bias = (torch.cat([drafter.q_bias, drafter.k_bias, drafter.v_bias])
                     if drafter.q_bias is not None else None)
        b = drafter.step1_bias  # step 1's bias through W_h w: the sums' share of it (combine's bias=)
        self.fc_bias = (b @ self.w_hid.t()) if b is not None else None
        self.fc_bias_at = None
        self.eps = c.rms_norm_eps
        self.config = c
        self.emb = self.cos = self.sin = self.qi = None
        self.roped = False

    @classmethod
    def of(cls, drafter) -> _SplitStep | None:
        """The split for this drafter, or None where step 1 is not that (MLA attention, later
        decoder layers, per-head q/k norms): the screen then runs the drafter's own pieces."""
        from eagle3conv.model.drafter import Eagle3Drafter

        if (type(drafter)._qkv is not Eagle3Drafter._qkv or type(drafter)._project is not Eagle3Drafter._project
                or type(drafter)._layer_input is not Eagle3Drafter._layer_input
                or getattr(drafter, "later", None) or getattr(drafter, "q_norm", None) is not None):
            return None
        return cls(drafter)

    def positions(self, drafter, seq: int, device) -> None:
        """A group of ``seq`` columns: RoPE's cos/sin at each (position 0 at column 0)."""
        import torch

        self.cos, self.sin = drafter.rope(torch.arange(seq, device=device))
        if self.fc_bias is not None:  # fc's bias through W_h w, RoPE'd at each column (the projections are)
            self.fc_bias_at = self.fc_bias.expand(seq, -1).clone()
            self.rope(self.fc_bias_at)

    def rope(self, lin) -> None:
        """RoPE on the q and k parts of ``lin`` [..., columns, q + k + v], in place. RoPE is linear
        per position, so it commutes with the sums and the per-position 1/rms: applied once to
        each slot-layer projection and to the embedding half, a wiring's sum is already rotated."""
        from eagle3conv.model.ops import apply_rope

        c = self.config
        lead = lin.shape[:-1]
        for a, b, heads in ((0, self.dq, c.num_heads), (self.dq, self.dq + self.dk, c.num_kv_heads)):
            part = lin[..., a:b].unflatten(-1, (heads, c.head_dim))
            part.copy_(apply_rope(part, self.cos[:lead[-1], None, :], self.sin[:lead[-1], None, :]))

    def begin(self, drafter, tokens, qi, roped: bool, embeddings=None) -> None:
        """A group: the embedding half of q, k, v at every column (``tokens``: the ids step 1
        reads, rows of ``embeddings`` where given; RoPE'd when the slot-layer projections are),
        for the columns ``qi`` scored."""
        import torch.nn.functional as F

        from eagle3conv.model.ops import rms_norm

        embeds = drafter.embed(tokens, embeddings)
        self.emb = F.linear(rms_norm(embeds, drafter.input_layernorm, self.eps), self.w_emb, self.bias)
        if roped:
            self.rope(self.emb)
        self.roped = roped
        self.qi = qi

    def finish(self, drafter, g, lin, qmask, flat, wirings: int):
        """Step 1 for ``g`` [wirings x rows, columns, H] (the fc output) and ``lin`` (its
        projection through ``W_h w``): the drafter's output at the ``flat`` positions scored
        (row-major over rows x scored columns), ``wirings`` rows of them."""
        import torch

        from eagle3conv.model.ops import apply_rope

        c = drafter.config
        B, S, H = g.shape
        nh, nkv, hd = c.num_heads, c.num_kv_heads, c.head_dim
        # the norm of g's fp32 copy: the same numbers as vector_norm(g, dtype=fp32), measured faster on a CPU
        r = torch.rsqrt(torch.linalg.vector_norm(g.float(), dim=-1).pow(2) / H + self.eps)
        rows = self.emb.shape[0]
        lin = torch.addcmul(self.emb.unsqueeze(0), lin.view(B // rows, rows, S, -1),
                            r.to(g.dtype).view(B // rows, rows, S, 1)).view(B, S, -1)
        qi = self.qi
        # q at the scored columns as [B, nh, Sq, hd], contiguous: one copy (the attention's view of
        # the heads that share a key head as one query block is then free)
        q = lin[..., :self.dq].unflatten(-1, (nh, hd)).transpose(1, 2).index_select(2, qi)
        k = lin[:, :, self.dq:self.dq + self.dk].reshape(B, S, nkv, hd).transpose(1, 2)
        v = lin[:, :, self.dq + self.dk:].reshape(B, S, nkv, -1).transpose(1, 2)
        if not self.roped:
            q = apply_rope(q, self.cos[qi], self.sin[qi])
            k = apply_rope(k, self.cos, self.sin)
        attn = drafter.attention(q, k, v, qmask)  # [B, nh, Sq, hd]
        residual = drafter.layer0_residual(g[:, qi]).reshape(wirings, -1, H)
        attn = attn.transpose(1, 2).reshape(wirings, -1, nh, attn.shape[-1])
        if flat.numel() != residual.shape[1]:  # some (row, column) pairs are not scored: the scored ones
            residual, attn = residual.index_select(1, flat), attn.index_select(1, flat)
        return drafter.finish(residual, attn.transpose(1, 2))


    def chain(self, drafter, g, lin, steps: int, later: list, chunk_size: int = 512):
        """The K-step chain (:meth:`~eagle3conv.model.drafter.Eagle3Drafter.draft_chain` with
        ``columns``, teacher forcing) of one wiring from its step-1 ``g`` [B, S, H] (the fc output)
        and ``lin`` (its projection through ``W_h w``, RoPE'd where :meth:`begin` was told so), the
        chains started at the columns ``qi`` of :meth:`begin`: ``[K, B, len(qi)]`` target ids. Later
        steps take their attention input's embedding half from ``later`` (:meth:`later_halves`:
        the same for every wiring) and add the hidden half of the previous step's state."""
        import torch

        from eagle3conv.model.drafter import ChainKeys
        from eagle3conv.model.ops import apply_rope, rms_norm

        c = drafter.config
        B, S, H = g.shape
        nh, nkv, hd = c.num_heads, c.num_kv_heads, c.head_dim
        dq, dk, qi = self.dq, self.dk, self.qi
        r = torch.rsqrt(torch.linalg.vector_norm(g.float(), dim=-1).pow(2) / H + self.eps)
        lin = torch.addcmul(self.emb, lin, r.to(g.dtype)[..., None])
        q = lin[..., :dq].unflatten(-1, (nh, hd)).transpose(1, 2).index_select(2, qi)
        k = lin[..., dq:dq + dk].reshape(B, S, nkv, hd).transpose(1, 2)
        v = lin[..., dq + dk:].reshape(B, S, nkv, -1).transpose(1, 2)
        if not self.roped:
            q = apply_rope(q, self.cos[qi], self.sin[qi])
            k = apply_rope(k, self.cos, self.sin)
        attn = drafter.attention(q, k, v, torch.arange(S, device=g.device)[None, :] <= qi[:, None])
        cache = ChainKeys(k, v, steps - 1, chunk_size, qi) if steps > 1 else None
        out = drafter.finish(drafter.layer0_residual(g[:, qi]), attn)
        ids = [out.target_ids]
        h = out.hidden
        for step in range(1, steps):  # step k + 1 at chain start t: RoPE position t + k
            x = rms_norm(h, drafter.hidden_norm, self.eps)
            n = x.shape[1]  # the embedding half added in the matmul (one rounding, as the drafter's one matmul)
            lin = torch.addmm(later[step - 1].reshape(B * n, -1), x.reshape(B * n, H), self.w_hid_raw.t()).view(B, n, -1)
            q = lin[..., :dq].reshape(B, n, nh, hd).transpose(1, 2)
            k = lin[..., dq:dq + dk].reshape(B, n, nkv, hd).transpose(1, 2)
            v = lin[..., dq + dk:].reshape(B, n, nkv, -1).transpose(1, 2)
            cos, sin = drafter.rope(qi + step)
            cache.add(apply_rope(k, cos, sin), v)
            attn = cache.attention(apply_rope(q, cos, sin), enable_gqa=drafter.gqa, scale=drafter.attn_scale)
            out = drafter.finish(drafter.layer0_residual(h), attn)
            ids.append(out.target_ids)
            h = out.hidden
        return torch.stack(ids)

    def later_halves(self, drafter, run_ids, steps: int, embeddings=None) -> list:
        """Per later step k + 1 (k = 1 .. K - 1): the embedding half of q, k, v (bias included, not
        RoPE'd) at the columns ``qi``, for the token each chain reads there (teacher forcing:
        ``x_{t+k+1}`` at start t, the same for every wiring)."""
        import torch
        import torch.nn.functional as F

        from eagle3conv.model.ops import rms_norm

        out = []
        S = run_ids.shape[1]
        for k in range(1, steps):
            tokens = torch.zeros_like(run_ids)
            if k + 1 < S:
                tokens[:, :S - k - 1] = run_ids[:, k + 1:]
            embeds = drafter.embed(tokens.index_select(1, self.qi), embeddings)
            out.append(F.linear(rms_norm(embeds, drafter.input_layernorm, self.eps), self.w_emb, self.bias))
        return out


def _reusable(known, alive: list[int], order: list[int], start: int) -> dict:
    """Per place ``j`` in ``alive`` whose wiring the earlier screen ``known`` scored on every position
    up to ``len(order)`` (read in the same ``order``, row by row), its log scores and hits on
    positions ``[start, len(order))``. Nothing where the orders differ."""
    if known is None:
        return {}
    res, index = known
    n = len(order)
    if res.pos_row[:n] != order:
        return {}
    out = {}
    for j, i in enumerate(alive):
        k = index[i]
        if k is None or k >= len(res.vectors) or k >= len(res.hit_vectors):
            continue
        v, h = res.vectors[k], res.hit_vectors[k]
        if v is not None and h is not None and len(v) >= n:
            out[j] = (v[start:n], h[start:n])
    return out


def slot_sum(table, part):
    """Per wiring (row of ``part`` ``[P, k]``: the place of each slot's layer), the sum over its slots
    of ``table[s, part[:, s]]`` (``table`` ``[k, layers, ...]``: each slot's projection of each layer):
    ``[P, ...]``. On a CPU one gather-and-sum pass (:func:`torch.nn.functional.embedding_bag`, which
    adds in fp32 and rounds once, so it is closer to the exact sum than adding bf16 parts in turn);
    elsewhere the parts gathered and added in place."""
    import torch
    import torch.nn.functional as F

    k, layers = table.shape[:2]
    if table.device.type == "cpu":
        idx = part + torch.arange(k, device=part.device)[None, :] * layers
        return F.embedding_bag(idx, table.view(k * layers, -1), mode="sum").view(part.shape[0], *table.shape[2:])
    out = torch.add(table[0, part[:, 0]], table[1, part[:, 1]]) if k > 1 else table[0, part[:, 0]]
    for s in range(2, k):
        out.add_(table[s, part[:, s]])
    return out


def log_score_at(logits, ref, rows: int | None = None):
    """Per row of ``logits`` ``[..., V]``: the log-probability (fp32) of column ``ref`` ``[...]``
    under the row's softmax, and whether ``ref`` is the row's argmax as :func:`torch.argmax` takes
    it (the first of equal largest values). The same numbers as a log-softmax over all the rows
    and an argmax; on a CPU (or given ``rows``) computed ``rows`` rows at a time (default 256: a
    log-softmax of a block that stays in cache is several times faster there than one over every
    row), the largest value found by ``amax``, and ties at it by a second ``amax`` over every column
    but ``ref``'s (an argmax of the rare rows where another column holds it too: argmax is several
    times slower than amax there); on a GPU the two over every row at once (measured faster there,
    bench/README.md)."""
    import torch
    import torch.nn.functional as F

    V = logits.shape[-1]
    x = logits.reshape(-1, V)
    r = ref.reshape(-1).to(x.device)
    n = x.shape[0]
    if rows is None and x.device.type != "cpu":  # a GPU: one log-softmax and argmax over every row is faster
        lp = F.log_softmax(x, -1, dtype=torch.float32).gather(-1, r[:, None]).squeeze(-1)
        return lp.view(ref.shape), (x.argmax(-1) == r).view(ref.shape)
    rows = rows or 256
    lp = torch.empty(n, dtype=torch.float32, device=x.device)
    first = torch.empty(n, dtype=torch.bool, device=x.device)
    for a in range(0, n, rows):
        b = min(n, a + rows)
        rb = r[a:b, None]
        ls = F.log_softmax(x[a:b], -1, dtype=torch.float32)  # upcast inside the kernel: no fp32 copy
        at = ls.gather(-1, rb).squeeze(-1)
        top = ls.amax(-1)
        hit = at == top  # ref holds the largest value (bf16 values that differ stay apart in fp32)
        ls.scatter_(-1, rb, -math.inf)  # every column but ref's: does another hold the largest value too?
        tied = (hit & (ls.amax(-1) == top)).nonzero().flatten()
        if tied.numel():  # then ref is argmax's pick (the first) only when it comes before the first other
            hit[tied] = ls.index_select(0, tied).argmax(-1) > rb[tied, 0]
        lp[a:b], first[a:b] = at, hit
    return lp.view(ref.shape), first.view(ref.shape)


def _finite_at(x, mask):
    """Per slot of ``x`` ``[B, S, k, T]``: every value finite at the real tokens (``mask``), on the
    device (one elementwise pass and a reduction; nothing read back). For the aux slots ``x`` is
    each token's L2 norm (``T`` = 1), which evaluate computes anyway, for the embedding outputs each
    token's sum: either is NaN or Inf whenever a value of the token is (and when finite values
    overflow fp32, past ~1e19 for the norm, ~1e34 for the sum: states as unusable)."""
    import torch

    return (torch.isfinite(x).all(-1) | ~mask[..., None]).all(0).all(0)


def _refuse_non_finite_states(finite: list[bool], candidate: Candidate, states) -> None:
    """One NaN or Inf anywhere the drafter read (an aux slot, or the target's embeddings) refuses the
    states: a score of such states is no score (a percentile of the norms misses one Inf)."""
    from eagle3conv.errors import CheckpointReadError

    if all(finite):
        return
    bad = finite.index(False)
    what = (f"the hidden states of slot {bad} ({candidate.layers[bad]})" if bad < len(candidate.layers)
            else "the embedding outputs (the target's embeddings)")
    find = getattr(states, "find_non_finite", None)  # the one file of a folder format that holds it
    where = (find(list(candidate.layers)) if find and bad < len(candidate.layers) else None) \
        or getattr(states, "path", "the states")
    raise CheckpointReadError(f"{where}: {what} are not finite (NaN or Inf) at a "
                              "real token: the capture went wrong",
                              hint="capture again (a bf16 overflow? try --dtype fp32)")


def _refuse_non_finite(means, wirings: list, states) -> None:
    """A wiring whose step-1 log score is NaN or infinite would lead every comparison (or none) and
    switch the screen off: refuse, naming the layer every such wiring reads where there is one."""
    import torch

    bad = (~torch.isfinite(means)).nonzero().flatten().tolist()
    if not bad:
        return
    from eagle3conv.errors import CheckpointReadError

    where = getattr(states, "path", "the states")
    common = set(wirings[bad[0]]).intersection(*(set(wirings[j]) for j in bad[1:]))
    if common and len(bad) < len(wirings):
        layer = describe(tuple(sorted(common, key=lambda r: r.output_of)))
        raise CheckpointReadError(f"{where}: the captured {layer} is not finite (NaN or Inf) where the screen read "
                                  f"it (the {len(bad)} of {len(wirings)} wirings reading it score NaN): the capture "
                                  "went wrong", hint="capture again (a bf16 overflow? try --dtype fp32)")
    raise CheckpointReadError(f"{where}: the drafter's step-1 log score is not finite (NaN or Inf) on {len(bad)} of "
                              f"{len(wirings)} wirings (e.g. {describe(wirings[bad[0]])})",
                              hint="check the drafter's weights (eagle3conv inspect) and the capture (try --dtype fp32)")


def screen(drafter, states, sets: list[LayerSet], *, rows: int, target_embeds: bool, labels=None,
           bound: ScreenBound | None = None, keep: tuple[int, ...] = (), priors: tuple[int, ...] = (),
           chunk_tokens: int | None = None,
           memory_bytes: int | None = None, progress: Progress | None = None,
           known: tuple[ScreenResult, list[int | None]] | None = None) -> tuple[ScreenResult, list[int]]:
    """The step-1 log score of every wiring in ``sets`` on the first ``rows`` sequences,
    each wiring read only until the data excludes it (:class:`ScreenBound`); returns the
    result and the wirings kept, best first. ``keep``: indices never dropped (a reference
    the others are compared with). ``priors``: indices of wirings named before the data (the
    search's evidence), each a reference for every stage (:class:`ScreenBound`): scored on every
    position the screen reads, and among the wirings kept only where the data did not exclude them.

    Step 1's ``fc`` is linear in each slot (``fc_norm``, if configured, acts per slot):
    each slot's projection of each layer is computed once per sequence, and a wiring's
    ``fc`` output is their sum. Only the rest of step 1 (attention, MLP, head) runs per
    wiring, many wirings to a forward. Attention is causal, so a stage that extends a
    sequence scores the new positions exactly.

    ``known``: an earlier screen of the same drafter, states and labels and, per wiring of
    ``sets``, its index there (or None): where that screen scored a wiring on every position a
    stage reads (positions are read row after row from the first, so any two screens of them
    read the same positions first; the order is checked),
    its scores are taken, not computed again (a position's score depends on the columns up to
    it only), and count as no work."""
    import torch
    import torch.nn.functional as F

    from eagle3conv.model.ops import argmax

    bound = bound or ScreenBound()
    t0 = time.perf_counter()
    c = drafter.config
    dev, dt = drafter.device, drafter.dtype
    k_slots = len(sets[0])
    T = states.hidden_size
    rows = max(1, min(rows, states.num_sequences))
    ids_all = states.input_ids[:rows]
    mask_all = states.attention_mask[:rows].bool()
    loss_all = states.loss_mask[:rows].bool() & mask_all
    tnext_all = (states.target_next if labels is None else labels)[:rows]
    lens = mask_all.sum(1)
    S = int(lens.max())
    ok_all = torch.zeros(rows, S, dtype=torch.bool)  # step 1 at t guesses target_next[t+1]
    ok_all[:, :S - 1] = loss_all[:, 1:S] & mask_all[:, 1:S] & (tnext_all[:, 1:S] >= 0)
    ref_all = torch.zeros(rows, S, dtype=torch.long)
    ref_all[:, :S - 1] = tnext_all[:, 1:S].long()
    # the reference token's draft id (-1: outside the draft vocab: never accepted, not log-scored)
    d2t = drafter.d2t.long().cpu()
    tgt = torch.arange(d2t.numel()) + d2t
    t2d = torch.full((int(max(int(tgt.max()), int(ref_all.max()))) + 1,), -1, dtype=torch.long)
    t2d[tgt] = torch.arange(d2t.numel())
    draft_all = t2d[ref_all.clamp(min=0)]
    one_to_one = int(tgt.unique().numel()) == int(tgt.numel())  # d2t maps no two draft ids to one token
    lp_ok_all = ok_all & (draft_all >= 0)
    counted = ok_all.sum(1).tolist()
    # positions: a stage reads the first P scored (log-scored) positions, row after row
    per_row = lp_ok_all.sum(1)
    cum_rows = per_row.cumsum(0).tolist()
    total = int(cum_rows[-1]) if cum_rows else 0
    plan = bound.stages(total) if total else [0]
    scored_at = [torch.nonzero(lp_ok_all[r]).flatten().tolist() for r in range(rows)]

    def region(want: int) -> list[int]:
        """Per row, the positions (stop index) a stage with ``want`` scored positions reads."""
        stops = [0] * rows
        for r in range(rows):
            before = cum_rows[r - 1] if r else 0
            if before >= want:
                break
            if per_row[r] == 0:
                continue
            idx = scored_at[r]  # up to its last scored position, or its (want - before)-th
            stops[r] = int(idx[min(len(idx), want - before) - 1]) + 1
        return stops

    refs = sorted({r for s in sets for r in s}, key=lambda r: r.output_of)
    col = {r: j for j, r in enumerate(refs)}
    wiring_cols = torch.tensor([[col[r] for r in ls] for ls in sets], dtype=torch.long)
    H = c.hidden_size
    # step 1 is linear per slot: the drafter's own pieces (slot_projection once per slot and layer;
    # combine per wiring: the sum, a scale per position and wiring where a norm spans the slots, the bias)
    if not drafter.step1_factors:
        from eagle3conv.errors import UsageError
        from eagle3conv.spec.drafter import NORM_BEFORE_FC

        raise UsageError(f"the global search cannot screen a drafter with both {NORM_BEFORE_FC.name} and fc_norm (the "
                         "concatenation's norm then does not factor through fc_norm)",
                         hint="score the wirings you suspect with --layers")
    split = _SplitStep.of(drafter)
    width = H + (split.width if split is not None else 0)  # per slot, layer and token: what a group holds
    if chunk_tokens is None:
        chunk_tokens = 65536 if dev.type == "cuda" else 8192
    if memory_bytes is None:
        memory_bytes = (8 << 30) if dev.type == "cuda" else (1 << 30)
    elt = torch.empty(0, dtype=dt).element_size()
    priors = tuple(dict.fromkeys(priors))
    prior_set = set(priors)
    outvoted: set[int] = set()  # priors the data excluded: still scored (references), not survivors
    protected = set(keep) | prior_set
    alive = list(range(len(sets)))
    n_sets = len(sets)
    # per wiring still in: its log score and hits at every position scored so far (in row order)
    lp_store = torch.zeros(n_sets, 0, dtype=torch.float32)
    hit_store = torch.zeros(n_sets, 0, dtype=torch.bool)
    pos_row: list[int] = []  # the row of each stored position
    done = [0] * rows  # positions of each row scored so far
    step1 = [0.0] * n_sets
    logp = [0.0] * n_sets
    reached = [0] * n_sets
    row_hits: list[list[int]] = [[0] * rows for _ in range(n_sets)]
    vectors: list = [None] * n_sets  # per wiring: its log score at each position it was scored on
    hit_vectors: list = [None] * n_sets
    stages: list[dict] = []
    phases: dict = {"project": 0.0}
    # the work cap, unless the user gave a time budget (which then replaces it)
    work, cap = 0, (math.inf if bound.seconds is not None else
                    bound.max_work * n_sets * max(1, plan[0]) + bound.max_tail * plan[-1])
    complete = True
    stopped: str | None = None  # what stopped the screen before the data decided: "work" (cap), "seconds"
    ok_positions = 0
    alpha_lead, alpha_ref, alpha_prior = bound.split(len(plan), len(priors))
    reference: ScreenReference | None = None  # fixed after the pilot's stages (ScreenBound)

    def settle(idx: list[int], where: torch.Tensor) -> None:
        """Record the figures of wirings ``idx`` (rows ``where`` of the stores)."""
        if not idx:
            return
        n_lp = max(1, lp_store.shape[1])
        rows_t = torch.tensor(pos_row, dtype=torch.long)
        lps = lp_store[where].double().sum(1).tolist()
        hs = hit_store[where]
        hsum = hs.sum(1).tolist()
        per = torch.zeros(len(idx), rows, dtype=torch.long)
        if hs.shape[1]:
            per.index_add_(1, rows_t, hs.long())
        den = max(1, ok_positions)
        kept_lp = lp_store[where]
        for j, i in enumerate(idx):
            vectors[i] = kept_lp[j].clone()
            hit_vectors[i] = hs[j].clone()
            logp[i] = lps[j] / n_lp if lp_store.shape[1] else 0.0
            step1[i] = hsum[j] / den
            reached[i] = lp_store.shape[1]
            row_hits[i] = per[j].tolist()

    for stage_no, want in enumerate(plan):
        ts = time.perf_counter()
        stops = region(want)
        todo = [r for r in range(rows) if stops[r] > done[r]]
        # the positions this stage adds, row after row (the order the stores keep)
        added = [r for r in todo for _ in range(int(lp_ok_all[r, done[r]:stops[r]].sum()))]
        reuse = _reusable(known, alive, pos_row + added, lp_store.shape[1])
        calc_at = [j for j in range(len(alive)) if j not in reuse]  # the places in `alive` this stage computes
        calc = [alive[j] for j in calc_at]  # and their wirings
        need = len(calc) * len(added)
        if todo and stage_no > 0:
            spent = time.perf_counter() - t0
            if work + need > cap:
                stopped = "work"
            elif bound.seconds is not None and spent + need * spent / max(1, work) > bound.seconds:
                stopped = "seconds"  # the next stage, at the rate measured so far, would pass the budget
            if stopped:
                complete = False
                break
        # the (slot, layer) pairs some wiring computed here reads: only those are projected (the
        # survivors of later stages share few layers per slot); the layers read in any slot
        slot_used = [set(wiring_cols[calc][:, s].tolist()) for s in range(k_slots)] if calc else []
        pairs = sum(len(x) for x in slot_used)
        used = sorted(set().union(*slot_used))
        ucol = {j: u for u, j in enumerate(used)}
        remap = torch.full((len(refs),), -1, dtype=torch.long)  # column of a layer -> its place in `used`
        remap[torch.tensor(used, dtype=torch.long)] = torch.arange(len(used))
        alive_cols = remap[wiring_cols[calc]].to(dev) if calc else None
        new_lp, new_hit = [], []
        # rows in groups of consecutive rows whose projections fit in memory_bytes and whose
        # padding (to the group's longest read) wastes little, a row joining a group only while the
        # wirings computed do not yet fill a forward (chunk_tokens) on the rows before it: a group's
        # attention runs every row over the union of their scored columns and the longest row's
        # keys, so one row to a forward wastes none (bench/README.md, issue 30 fifth round)
        groups, cur, cur_len, cur_read = [], [], 0, 0  # the group, its longest read, its reads summed
        for r in todo if calc else ():
            n, g_len, read = len(cur) + 1, max(cur_len, stops[r]), cur_read + stops[r]  # with r joined
            if cur and (r != cur[-1] + 1 or k_slots * len(used) * n * g_len * width * elt > memory_bytes
                        or n * g_len > 1.25 * read or len(calc) * len(cur) * cur_len >= chunk_tokens):
                groups.append(cur)
                cur, g_len, read = [], stops[r], stops[r]
            cur.append(r)
            cur_len, cur_read = g_len, read
        if cur:
            groups.append(cur)
        for grp in groups:
            Sg = min(S, max(stops[r] for r in grp) + 1)  # the last column scored reads the next column's token
            g = len(grp)
            tp = time.perf_counter()
            sel = torch.tensor(grp, dtype=torch.long)
            proj = torch.empty(k_slots, len(used), g, Sg, H, dtype=dt, device=dev)
            # each slot's projection of each layer through W_h too, where that is less work than one
            # projection of each wiring's sum (more wirings than slot-layer pairs read)
            pre = split is not None and len(calc) > pairs
            qkvp = torch.empty(k_slots, len(used), g, Sg, split.width, dtype=dt, device=dev) if pre else None
            if split is not None:
                split.positions(drafter, Sg, dev)
            msq = None
            lo, hi = grp[0], grp[-1] + 1  # rows are consecutive
            for j in used:
                hcap = states.aux([refs[j]], slice(lo, hi))[:, :Sg].to(dev).to(dt)
                m = drafter.slot_sq_mean(hcap)
                if m is not None:
                    if msq is None:
                        msq = torch.empty(len(used), g, Sg, dtype=torch.float32, device=dev)
                    msq[ucol[j]] = m
                for s in range(k_slots):
                    if j not in slot_used[s]:  # no wiring here reads layer j in slot s: never gathered
                        continue
                    drafter.slot_projection(hcap, s, out=proj[s, ucol[j]])
                    if pre:  # and its share of the attention input's hidden half, RoPE'd
                        torch.matmul(proj[s, ucol[j]], split.w_hid.t(), out=qkvp[s, ucol[j]])
                        split.rope(qkvp[s, ucol[j]])
                del hcap
            table = None
            if target_embeds:  # the captured embedding output at (b, t) is embed(x_t): index it by position
                table = states.embeddings(slice(lo, hi))[:, :Sg].to(dev).to(dt).reshape(g * Sg, T)
                run_ids = torch.arange(g * Sg, device=dev).view(g, Sg)
            else:
                run_ids = ids_all[sel, :Sg].to(dev)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            phases["project"] = round(phases["project"] + time.perf_counter() - tp, 3)
            tokens = torch.zeros_like(run_ids)  # tokens read at step 1: x_{t+1} at index t
            tokens[:, :Sg - 1] = run_ids[:, 1:]
            # the positions this group adds: [done, stop) of each row, log-scored ones only
            take = torch.zeros(g, Sg, dtype=torch.bool)
            for a, r in enumerate(grp):
                take[a, done[r]:stops[r]] = lp_ok_all[r, done[r]:stops[r]]
            # the columns scored: the rest of step 1 (o_proj, MLP, head) runs on those only; every
            # column before them is still attended to (its keys and values are computed)
            qcols = torch.nonzero(take.any(0)).flatten()
            if drafter.later:  # a later layer attends over every column's layer-0 output: run them all
                qcols = torch.arange(Sg)
            Sq = len(qcols)
            take = take[:, qcols]
            flat = torch.nonzero(take.flatten()).flatten().to(dev)
            ref_d = draft_all[sel][:, qcols].clamp(min=0).to(dev)
            ref_t = ref_all[sel][:, qcols].to(dev)
            qi = qcols.to(dev)
            qmask = torch.arange(Sg, device=dev)[None, :] <= qi[:, None]  # causal, for the columns scored
            per = max(1, chunk_tokens // max(1, g * Sg))
            # the same for every chunk of wirings: built once per group (the last chunk takes a slice)
            tokens_rep = tokens.repeat(min(per, len(calc)), 1)
            ref_d_flat, ref_t_flat = ref_d.flatten()[flat], ref_t.flatten()[flat]
            lp_parts, hit_parts = [], []
            if split is not None:  # what no wiring changes, once per group
                split.begin(drafter, tokens, qi, roped=pre, embeddings=table)
            for a in range(0, len(calc), per):
                part = alive_cols[a:a + per]
                P = part.shape[0]
                sq = None if msq is None else [msq[part[:, s]] for s in range(k_slots)]
                gg = drafter.combine([slot_sum(proj, part)], sq)
                lin = None
                if pre:  # the same through W_h w (and RoPE), its bias too
                    lin = drafter.combine([slot_sum(qkvp, part)], sq, bias=split.fc_bias_at)
                if split is not None and lin is None:
                    lin = F.linear(gg, split.w_hid)
                with torch.inference_mode():
                    if split is not None:  # one-layer Llama attention: the rest of step 1 on the positions scored
                        out = split.finish(drafter, gg.view(P * g, Sg, H), lin.view(P * g, Sg, -1), qmask, flat, P)
                        logits = out.logits
                    elif Sq == Sg:
                        out = drafter.forward(gg.reshape(P * g, Sg, -1), tokens_rep[:P * g], embeddings=table)
                    else:
                        residual, q, kk, vv = drafter.attention_inputs(gg.reshape(P * g, Sg, -1),
                                                                       tokens_rep[:P * g], embeddings=table)
                        attn = drafter.attention(q[:, :, qi], kk, vv, qmask)
                        out = drafter.finish(residual[:, qi], attn)
                        del residual, q, kk, vv, attn
                    if split is None:
                        logits = out.logits.view(P, g * Sq, -1).index_select(1, flat)
                lp, first = log_score_at(logits, ref_d_flat.expand(P, -1))
                if one_to_one:  # the guess is the reference token exactly when its draft id is the argmax
                    hit = first
                else:  # several draft ids map to one target token: compare the guesses themselves
                    guess = argmax(logits)
                    hit = (guess + drafter.d2t[guess]) == ref_t_flat
                lp_parts.append(lp.cpu())
                hit_parts.append(hit.cpu())
                del out, logits, gg, lin
                if progress:
                    progress(min(a + P, len(calc)), len(calc))
            new_lp.append(torch.cat(lp_parts) if lp_parts else torch.zeros(0, 0))
            new_hit.append(torch.cat(hit_parts) if hit_parts else torch.zeros(0, 0, dtype=torch.bool))
            del proj, qkvp
        for r in todo:  # step-1 positions: a row read to its last log-scored position counts to its end
            end = S if stops[r] == scored_at[r][-1] + 1 else stops[r]
            ok_positions += int(ok_all[r, done[r]:end].sum())
            done[r] = stops[r]
        if added:
            lp_new = torch.empty(len(alive), len(added), dtype=torch.float32)
            hit_new = torch.empty(len(alive), len(added), dtype=torch.bool)
            if calc:
                lp_new[calc_at] = torch.cat(new_lp, dim=1)
                hit_new[calc_at] = torch.cat(new_hit, dim=1)
            for j, (lv, hv) in reuse.items():
                lp_new[j], hit_new[j] = lv, hv
            lp_store = torch.cat([lp_store[:len(alive)], lp_new], dim=1)
            hit_store = torch.cat([hit_store[:len(alive)], hit_new], dim=1)
            pos_row.extend(added)
        n_pos = lp_store.shape[1]
        work += len(calc) * len(added)
        # the bound: paired differences against the leader, over blocks of one sequence's positions
        means = lp_store.double().sum(1) / max(1, n_pos)
        _refuse_non_finite(means, [sets[i] for i in alive], states)
        lead = int(means.argmax())
        # the leader's differences and each prior's (chosen before the data), over the same blocks
        Ds, ses, m = paired_bound(lp_store, [lead] + [alive.index(p) for p in priors], pos_row, bound)
        D, se = Ds[0], ses[0]
        q = bound.quantile(len(alive) * len(plan), m, alpha_lead)  # Bonferroni: the wirings here x the stages
        drop = (D - q * se > bound.margin) if math.isfinite(q) else torch.zeros(len(alive), dtype=torch.bool)
        against = reference.test(lp_store, alive, pos_row) if reference is not None else None
        if against is not None:
            drop |= against["drop"]
        by_priors = torch.zeros(len(alive), dtype=torch.bool)
        qp = bound.quantile(len(priors) * len(plan), m, alpha_prior) if priors else math.inf
        if math.isfinite(qp):  # each prior against every wiring, on every position read
            by_priors = (Ds[1:] - qp * ses[1:] > bound.margin).any(0)
        drop |= by_priors
        for j, i in enumerate(alive):
            if i in protected:
                if i in prior_set and drop[j]:
                    outvoted.add(i)  # excluded by the data: kept as a reference, not among the survivors
                drop[j] = False
        gone = [i for j, i in enumerate(alive) if drop[j]]
        settle(gone, drop)
        keepm = ~drop
        widest = float((D[keepm]).max()) if bool(keepm.any()) else 0.0
        stages.append({"positions": n_pos, "sequences": len(set(pos_row)), "blocks": m,
                       "wirings": len(alive),
                       "kept": len(alive) - len(gone), "quantile": round(q, 3) if math.isfinite(q) else None,
                       "leader": describe(sets[alive[lead]]), "leader_log_score": round(float(means[lead]), 5),
                       "widest_kept_gap": round(widest, 5), "seconds": round(time.perf_counter() - ts, 3)})
        if against is not None:
            stages[-1]["reference"] = {"wiring": describe(sets[reference.index]),
                                       **{k: v for k, v in against.items() if k != "drop"}}
        if priors:
            stages[-1]["priors"] = {"wirings": len(priors), "excluded": int(by_priors.sum())}
        phases[f"stage {len(stages)}: {len(alive)} wirings x {n_pos} positions"] = stages[-1]["seconds"]
        alive = [i for j, i in enumerate(alive) if not drop[j]]
        lp_store, hit_store = lp_store[keepm], hit_store[keepm]
        if reference is None and alpha_ref > 0 and len(stages) == bound.pilot and alive:
            # the leader now (best mean of the wirings kept) is the reference for every later stage
            kept_means = means[keepm]
            reference = ScreenReference(alive[int(kept_means.argmax())], max(pos_row) if pos_row else -1,
                                   alpha_ref / max(1, len(plan) - bound.pilot), bound)
        if len(alive) <= 1 or not (set(alive) - protected):
            break
    # the wirings still in: their figures on everything read, best first
    settle(alive, torch.ones(len(alive), dtype=torch.bool))
    scored = len(alive)  # what a next stage would score: the survivors and every prior (a reference)
    alive = sorted((i for i in alive if i not in outvoted), key=lambda i: -logp[i])
    res = ScreenResult(sets=list(sets), hits=row_hits, counted=counted, sequences=rows,
                       seconds=time.perf_counter() - t0, step1=step1, logp=logp, positions=ok_positions,
                       phase_seconds=phases, alive=alive, reached=reached, stages=stages, complete=complete,
                       work=work, bound=bound, vectors=vectors, hit_vectors=hit_vectors, pos_row=pos_row,
                       tests=n_sets * len(plan),
                       total=total, stopped_by=stopped, cap=cap)
    if stopped:  # what reading every position would take for the wirings still in (none excluded on the way)
        left = scored * (plan[-1] - lp_store.shape[1])
        rate = res.seconds / max(1, work)
        res.to_finish = {"work": int(left), "seconds": math.ceil(left * rate * 10) / 10,  # up: never "0.0 s more"
                         "seconds_per_million": round(rate * 1e6, 3),
                         "budget": int(math.ceil(res.seconds + left * rate))}
    return res, list(alive)


__all__ = ["NO_DROP", "Candidate", "Score", "ScreenBound", "ScreenReference", "ScreenResult", "evaluate",
           "evaluate_many", "log_score_at",
           "paired_bound", "screen", "slot_sum"]
