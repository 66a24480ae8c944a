"""The wiring screen's oracle (issue 30): a sample of wirings scored on every position, then
screening rules replayed on those scores, to count the work each would spend and what it keeps.

    # 1. score (the real screen with NO_DROP: every wiring of the sample on every log-scored position)
    PYTHONPATH=TREE python bench/smollm2/screen_oracle.py score DRAFTER STATES --trained 1,14,26 \
        --sample 250 --out oracle.pt
    # 2. replay rules on it (seconds, no forward)
    PYTHONPATH=TREE python bench/smollm2/screen_oracle.py simulate oracle.pt

The sample: the trained wiring, its single-slot neighbours (the wirings a search must tell from
it) and ``--sample`` wirings drawn at random (seed 0) from every ascending wiring of the layers
the states hold. Replayed: the screen's stages of doubling positions in file order (what
``evaluate.screen`` reads), with its block rule (``paired_bound``: sequences once 20 are read,
else runs of positions widened for what a sequence shares) and

* ``leader``: the leader test alone at 1% (the screen before issue 30);
* ``leader+reference``: the leader test at 0.5% and, after ``--pilot`` stages, the reference
  test at 0.5% on the sequences after the pilot's (the screen after issue 30; docs/facts.md §12).

Work (wiring-positions) and the survivors per stage are estimated for the whole population: the
random sample's surviving fraction times the wirings, plus the neighbours that survive. The
neighbours and the trained wiring are followed exactly.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path


def score(a) -> int:
    import torch

    from eagle3conv.spec.layers import LayerRef
    from eagle3conv.states.readers import open_states
    from eagle3conv.verify import build_drafter, load_drafter_weights
    from eagle3conv.verify.evaluate import NO_DROP, screen
    from eagle3conv.verify.search import all_wirings, neighbours

    config, tensors = load_drafter_weights(Path(a.drafter))
    drafter, target_embeds = build_drafter(config, tensors, "cpu", torch.bfloat16)
    states = open_states(Path(a.states))
    avail = list(states.layers)
    sets = all_wirings(avail, len(a.trained))
    trained = tuple(LayerRef(i) for i in a.trained)
    pick = torch.randperm(len(sets), generator=torch.Generator().manual_seed(0))[:a.sample].tolist()
    chosen = list(dict.fromkeys([trained] + neighbours(trained, avail)))
    n_near = len(chosen)
    extra = [tuple(LayerRef(i) for i in x) for x in a.extra]  # scored too, counted in no population
    chosen += [sets[i] for i in pick]  # a random wiring may be a neighbour too: kept twice, counted apart
    chosen += extra
    c0, t0 = time.process_time(), time.perf_counter()
    res, _ = screen(drafter, states, chosen, rows=states.num_sequences, target_embeds=target_embeds, bound=NO_DROP)
    print(f"scored {len(chosen)} wirings x {res.stages[-1]['positions']} positions: {res.work:,} wiring-positions, "
          f"{time.process_time() - c0:.1f} CPU s, {time.perf_counter() - t0:.1f} s wall", file=sys.stderr)
    torch.save({"sets": [[r.output_of for r in s] for s in chosen], "near": n_near, "sample": len(pick),
                "extra": len(extra),
                "wirings": len(sets), "vectors": torch.stack([res.vectors[i] for i in range(len(chosen))]),
                "pos_row": res.pos_row}, a.out)
    return 0


class Oracle:
    def __init__(self, path: str) -> None:
        import torch

        d = torch.load(path)
        self.V = d["vectors"].double()
        self.rows = torch.tensor(d["pos_row"], dtype=torch.long)
        self.sets, self.near, self.N = d["sets"], d["near"], d["wirings"]
        self.extra = d.get("extra", 0)  # the last rows: wirings scored for the rules (priors), in no population
        self.n, self.P = self.V.shape
        R = int(self.rows.max()) + 1
        per = torch.bincount(self.rows, minlength=R)
        first = torch.zeros(R + 1, dtype=torch.long)
        first[1:] = per.cumsum(0)
        self.first = first
        self.rank = torch.arange(self.P) - first[self.rows]

    def bound(self, idx, lead):
        """The screen's paired bound (evaluate.paired_bound's rule) on positions ``idx`` against ``lead``."""
        V = self.V[:, idx]
        return self.bound_of(idx, V[lead][None, :] - V)

    def sizes(self, first: int, growth: float) -> list[int]:
        """The positions read by each stage: ``first * growth**j``, the last one every position."""
        out, p = [], first
        while p < self.P:
            out.append(int(p))
            p = max(p + 1, int(math.ceil(p * growth)))
        return out + [self.P]

    def bound_of(self, idx, d):
        """The screen's paired bound on positions ``idx`` for differences ``d`` [wirings, len(idx)]
        (a reference's score minus each wiring's, position by position)."""
        import torch

        r = self.rows[idx]
        nseq = len(set(r.tolist()))
        infl = 1.0
        if nseq >= 20:
            blk = r
        else:
            b = max(1, min(16, len(idx) // 64))
            blk = r * 100000 + self.rank[idx] // b
            infl = math.sqrt(1 + (len(idx) / nseq - 1) * 0.01)
        _, inv = torch.unique(blk, return_inverse=True)
        m = int(inv.max()) + 1
        X = torch.zeros(d.shape[0], m, dtype=torch.float64).index_add_(1, inv, d)
        C = torch.bincount(inv, minlength=m).double()
        N = float(C.sum())
        D = X.sum(1) / N
        res = X - D[:, None] * C[None, :]
        se = (res.pow(2).sum(1) * m / max(1, m - 1)).sqrt() / N * infl
        return D, se, m

    def population(self, alive) -> float:
        """Wirings of the whole population still in: the sample's fraction times all, plus the neighbours."""
        sample = alive[self.near:self.n - self.extra]
        return float(sample.double().mean()) * self.N + int(alive[1:self.near].sum())

    def replay(self, pilot: int | None, alpha: float = 0.01, refs: tuple[tuple[int, float], ...] | None = None,
               first: int = 64, growth: float = 2.0, priors: tuple[int, ...] = (), prior_share: float = 0.2) -> dict:
        """The screen's rule in file order: stages of ``first * growth**j`` positions; the leader
        test, and a reference test after ``pilot`` stages (half of ``alpha`` each), or one per
        ``(pilot, share)`` of ``refs`` (each reference the leader after its pilot, tested on the
        sequences after it at ``share * alpha`` over its later stages; the leader test the rest).
        ``priors``: rows of wirings known before the data (a search's evidence), each a reference
        from the first stage on, over every position read, at ``prior_share * alpha`` over the
        priors and stages (the other tests share the rest as above)."""
        import torch

        from eagle3conv.verify.stats import t_quantile

        sizes = self.sizes(first, growth)
        s = len(sizes)
        if refs is None:
            refs = () if pilot is None or s <= pilot else ((pilot, 0.5),)
        refs = tuple((k, sh) for k, sh in refs if k < s)
        a_prior = alpha * prior_share if priors else 0.0
        rest = alpha - a_prior
        refs = tuple((k, sh * rest / alpha) for k, sh in refs)
        a_lead = rest - alpha * sum(sh for _, sh in refs)
        alive = torch.ones(self.n, dtype=torch.bool)
        work, prev, trail, fixed = 0.0, 0, [], []  # fixed: (reference, its pilot's last row, its alpha per stage)
        for k, want in enumerate(sizes):
            work += self.population(alive) * (want - prev)
            prev = want
            idx = torch.arange(want)
            means = torch.where(alive, self.V[:, idx].mean(1), torch.tensor(-1e30, dtype=torch.float64))
            lead = int(means.argmax())
            D, se, m = self.bound(idx, lead)
            q = t_quantile(1 - a_lead / (self.population(alive) * s), m - 1)
            drop = D - q * se > 0
            for pr in priors:  # always in: a prior is confirmed whatever the screen does
                Dp, sep, mp = self.bound(idx, pr)
                drop |= Dp - t_quantile(1 - a_prior / (len(priors) * s), mp - 1) * sep > 0
            drop[list(priors)] = False
            for ref, last_row, a_ref in fixed:
                start = int(self.first[last_row + 1])
                if bool(alive[ref]) and want - start >= 2:
                    Dr, ser, mr = self.bound(torch.arange(start, want), ref)
                    drop |= Dr - t_quantile(1 - a_ref, mr - 1) * ser > 0
            alive &= ~drop
            trail.append({"positions": want, "wirings": round(self.population(alive)),
                          "neighbours": int(alive[1:self.near].sum()), "trained_in": bool(alive[0])})
            for pk, sh in refs:
                if k + 1 == pk:
                    kept = torch.where(alive, self.V[:, idx].mean(1), torch.tensor(-1e30, dtype=torch.float64))
                    fixed.append((int(kept.argmax()), int(self.rows[want - 1]), alpha * sh / (s - pk)))
                    trail[-1].setdefault("reference", []).append(self.sets[fixed[-1][0]])
        return {"work": round(work), "stages": trail}

    def rolling(self, alpha: float = 0.01, shares: tuple[float, float, float] = (0.4, 0.4, 0.2),
                priors: tuple[int, ...] = (), first: int = 64, growth: float = 2.0, start: int = 1) -> dict:
        """The leader test, the priors' test and a *rolling reference* test: each sequence's reference
        is the leader after the last stage before the sequence's first position is read (chosen on
        earlier sequences only), and wiring i leaves when the mean over every position with a
        reference of (its reference's score minus i's) exceeds q_r times its standard error, q_r at
        ``1 - alpha_r / (stages after stage start)``: no Bonferroni over the wirings.
        ``shares``: of alpha, to the leader, rolling and priors' tests (the priors' share moves to
        the others without priors)."""
        import torch

        from eagle3conv.verify.stats import t_quantile

        sizes = self.sizes(first, growth)
        s = len(sizes)
        lead_sh, roll_sh, prior_sh = shares if priors else (shares[0], shares[1], 0.0)
        total = lead_sh + roll_sh + prior_sh
        a_lead, a_roll, a_prior = (alpha * x / total for x in (lead_sh, roll_sh, prior_sh))
        ref_of_row = torch.full((int(self.rows.max()) + 1,), -1, dtype=torch.long)
        alive = torch.ones(self.n, dtype=torch.bool)
        work, prev, trail = 0.0, 0, []
        for k, want in enumerate(sizes):
            work += self.population(alive) * (want - prev)
            prev = want
            idx = torch.arange(want)
            means = torch.where(alive, self.V[:, idx].mean(1), torch.tensor(-1e30, dtype=torch.float64))
            lead = int(means.argmax())
            drop = torch.zeros(self.n, dtype=torch.bool)
            if a_lead > 0:
                D, se, m = self.bound(idx, lead)
                drop |= D - t_quantile(1 - a_lead / (self.population(alive) * s), m - 1) * se > 0
            for pr in priors if a_prior > 0 else ():
                Dp, sep, mp = self.bound(idx, pr)
                drop |= Dp - t_quantile(1 - a_prior / (len(priors) * s), mp - 1) * sep > 0
            by_roll = 0
            ref = ref_of_row[self.rows[idx]]
            at = torch.nonzero(ref >= 0).flatten()
            if a_roll > 0 and len(at) >= 2 and k >= start:
                d = self.V[ref[at], at][None, :] - self.V[:, at]
                Dr, ser, mr = self.bound_of(at, d)
                rd = Dr - t_quantile(1 - a_roll / max(1, s - start), mr - 1) * ser > 0
                by_roll = int((rd & alive & ~drop).sum())
                drop |= rd
            drop[list(priors)] = False
            alive &= ~drop
            # the rows not yet begun take the leader now as their reference
            rows_begun = int(self.rows[want - 1])
            kept = torch.where(alive, self.V[:, idx].mean(1), torch.tensor(-1e30, dtype=torch.float64))
            ref_of_row[rows_begun + 1:] = int(kept.argmax())
            trail.append({"positions": want, "wirings": round(self.population(alive)),
                          "neighbours": int(alive[1:self.near].sum()), "trained_in": bool(alive[0]),
                          "by_rolling_only": by_roll, "reference_positions": len(at)})
        return {"work": round(work), "stages": trail}

    def floor(self, schedules=((64, 2.0), (64, 1.5), (32, 1.5), (64, 1.25))) -> dict:
        """What a screen with this bound would spend if it knew the best wiring before the data:
        that wiring as the one reference, from the first stage, over every position, with all of
        the 1% (Bonferroni over the stages only: no leader test, no other prior). No real screen
        can know it, so this is a floor for screens of this bound and reading order, not a rule.
        The best: the wiring of the highest mean on every position (the data's own leader: in
        its favour), and the trained wiring, each under a few stage schedules."""
        out = {}
        best = int(self.V.mean(1).argmax())
        for name, ref in (("data's leader", best), ("trained", 0)) if best else (("data's leader = trained", 0),):
            for first, growth in schedules:
                r = self.rolling(shares=(0.0, 0.0, 1.0), priors=(ref,), first=first, growth=growth)
                out[f"floor: {name} {self.sets[ref]} known, stages {first} x {growth}"] = r
        return out

    def interleaved(self, first: int = 2, growth: float = 2.0, alpha: float = 0.01) -> dict:
        """Another reading order, replayed: stage j reads the first ``first * growth**j`` scored
        positions of every sequence, the leader test alone with sequences as its blocks (every
        sequence is read from the first stage: no unit is widened by a model). The work counts
        scored wiring-positions only: the keys of the columns before them (each sequence's prompt
        from the first stage on) are not in the oracle, and cost a wiring more there than in file
        order."""
        import torch

        from eagle3conv.verify.evaluate import ScreenBound, paired_bound
        from eagle3conv.verify.stats import t_quantile

        by_sequence = ScreenBound(unit=1 << 30, min_units=1)  # the screen's bound, every block one whole sequence
        R = int(self.rows.max()) + 1
        longest = int(torch.bincount(self.rows, minlength=R).max())
        ns, n = [], first
        while n < longest:
            ns.append(int(n))
            n = max(n + 1, int(math.ceil(n * growth)))
        ns.append(longest)
        alive = torch.ones(self.n, dtype=torch.bool)
        work, prev, trail = 0.0, 0, []
        for n in ns:
            sel = torch.nonzero(self.rank < n).flatten()
            work += self.population(alive) * (len(sel) - prev)
            prev = len(sel)
            lead = int(torch.where(alive, self.V[:, sel].mean(1), torch.tensor(-1e30, dtype=torch.float64)).argmax())
            D, se, m = paired_bound(self.V[:, sel], lead, self.rows[sel].tolist(), by_sequence)
            alive &= ~(D - t_quantile(1 - alpha / (self.population(alive) * len(ns)), m - 1) * se > 0)
            trail.append({"positions": len(sel), "wirings": round(self.population(alive)),
                          "neighbours": int(alive[1:self.near].sum()), "trained_in": bool(alive[0])})
        return {"work": round(work), "stages": trail}


def simulate(a) -> int:
    import json

    o = Oracle(a.oracle)
    print(f"{o.n} wirings scored ({o.near - 1} neighbours of {o.sets[0]}, the rest a random sample of {o.N}), "
          f"{o.P} positions, {int(o.rows.max()) + 1} sequences")
    out = {"leader": o.replay(None)}
    for p in a.pilot:
        out[f"leader+reference, pilot {p}"] = o.replay(p)
    for spec in a.refs:  # "1:0.25,3:0.25": a reference after stage 1 and one after stage 3, a quarter of alpha each
        refs = tuple((int(k), float(sh)) for k, sh in (x.split(":") for x in spec.split(",")))
        out[f"leader+references {spec}"] = o.replay(None, refs=refs)
    if a.priors:  # the wirings known before the data, as references from the first stage on
        rows = [o.sets.index(x) for x in a.priors]
        out[f"leader+reference, pilot 3, priors {a.priors}"] = o.replay(3, priors=tuple(rows))
    for spec in a.rolling:  # "0.4,0.4,0.2": the leader, rolling and priors' shares of alpha
        sh = tuple(float(x) for x in spec.split(","))
        rows = tuple(o.sets.index(x) for x in a.priors)
        out[f"leader+rolling+priors {spec}"] = o.rolling(shares=sh, priors=rows)
    if a.floor:
        out.update(o.floor())
    if a.interleaved:
        for f in a.interleaved:
            out[f"interleaved, first {f} per sequence"] = o.interleaved(first=f)
    for name, r in out.items():
        print(f"{name}: {r['work'] / 1e6:.3f}M wiring-positions; " + ", ".join(
            f"{x['positions']}: {x['wirings']} ({x['neighbours']} nb{'' if x['trained_in'] else ', TRAINED OUT'})"
            for x in r["stages"]))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("score")
    s.add_argument("drafter")
    s.add_argument("states")
    s.add_argument("--trained", type=lambda x: [int(v) for v in x.split(",")], required=True)
    s.add_argument("--sample", type=int, default=250)
    s.add_argument("--extra", action="append", default=[], type=lambda x: [int(v) for v in x.split(",")],
                   help="a wiring scored besides (e.g. the evidence a search starts from, as a prior; "
                        "--extra=-1,1,14 for one naming the embedding output), once per wiring")
    s.add_argument("--out", required=True)
    m = sub.add_parser("simulate")
    m.add_argument("oracle")
    m.add_argument("--pilot", type=int, nargs="*", default=[3, 4])
    m.add_argument("--refs", nargs="*", default=[], metavar="PILOT:SHARE,...",
                   help="references fixed after these stages, each with its share of alpha")
    m.add_argument("--priors", action="append", default=[], type=lambda x: [int(v) for v in x.split(",")],
                   help="a wiring scored in the oracle (--extra, the trained one or a neighbour) used as a prior "
                        "reference, once per wiring")
    m.add_argument("--rolling", nargs="*", default=[], metavar="LEAD,ROLL,PRIORS",
                   help="the rolling reference test with these shares of alpha")
    m.add_argument("--floor", action="store_true",
                   help="the work of a screen that knew the best wiring before the data (a floor, not a rule)")
    m.add_argument("--interleaved", type=int, nargs="*", metavar="FIRST",
                   help="replay reading the first FIRST (then doubling) scored positions of every sequence per stage")
    m.add_argument("--out")
    a = ap.parse_args()
    return score(a) if a.cmd == "score" else simulate(a)


if __name__ == "__main__":
    sys.exit(main())
