"""The wiring search: which wirings to score, how scores compare with training, and the verdict.

:func:`config_candidate` is the wiring an engine would use with the config;
:func:`candidates` adds the wirings worth scoring around it (the training
record's, each shifted by one, the embedding-included variant, each engine's
default, per-slot moves of 1 and 2), among the layers the states hold.
:func:`norm_comparison` puts a score's per-slot norms next to training's.
:func:`decide` turns the scores into a :class:`Verdict`, whose ``status`` says
what the search concluded (callers branch on it, never on the wording):

``named``      acceptance separates a leader from every other wiring, or, where it
               cannot, the log score (:mod:`eagle3conv.verify.logscore`) separates one of
               the leaders from every wiring acceptance leaves tied with it, or the norm
               fingerprint picks the one leader clearly in line
``stands``     acceptance cannot separate the leaders; the training record's or the
               config's wiring is among them (norms not out of line), so it stands
``ambiguous``  neither acceptance nor the norms decide: nothing is named
``undecided``  fewer than :data:`MIN_SEARCH_SEQUENCES` sequences: no search verdict
``None``       no search was run (one wiring scored)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from eagle3conv.errors import UsageError, WiringError
from eagle3conv.verify.evaluate import Candidate, Score
from eagle3conv.verify.stats import paired_difference, paired_mean_difference
from eagle3conv.spec.layers import EMBEDDING, LayerRef, LayerSet, describe, to_ids, to_refs
from eagle3conv.spec.drafter import aux_ids

MIN_SEARCH_SEQUENCES = 10  # below this, sequence-bootstrap intervals are not worth naming a wiring on
LOG_SCORE_STEP = 0  # the log score that separates wirings acceptance ties: draft step 1's (0-based index)
NORM_FLAG_RATIO = 2.0

Status = Literal["named", "stands", "ambiguous", "undecided"]
STATUSES: tuple[str, ...] = ("named", "stands", "ambiguous", "undecided")


# --------------------------------------------------------------------------- candidates


def config_candidate(config: dict, num_layers: int | None, family: str | None, rows=()) -> Candidate:
    """The wiring an engine would use with this config: eagle3conv's provenance if written, else
    what the first release of the wiring check that reads ids from config.json captures from them
    (its :class:`~eagle3conv.spec.engines.EngineRow`), else every engine's default."""
    prov = ((config.get("eagle3conv") or {}).get("aux_layers") or {}).get("layers")
    if isinstance(prov, list) and prov:
        return Candidate("config", tuple(LayerRef(x["output_of"]) for x in prov),
                         "config.json's eagle3conv.aux_layers (as written for every engine)")
    declared = aux_ids(config).fields()
    for fld, ids in declared.items():
        if isinstance(ids, list) and -1 in ids:  # eagle3conv's output numbering: -1 = the embedding output
            return Candidate("config", to_refs(ids, "output", num_layers),
                             f"config.json {fld} {ids}, -1 read as the embedding output (no engine release "
                             "read captures it this way)")
    reading = [r for r in rows if r.capture.field is not None and r.capture.field.in_config and r.layers]
    if reading:  # the first engine's newest release reading config.json (the check's priority)
        first = {name: i for i, name in enumerate(dict.fromkeys(r.release.engine for r in rows))}
        r = min(reading, key=lambda x: (first[x.release.engine], tuple(-v for v in x.release.version)))
        return Candidate("config", r.layers, f"config.json {r.capture.field} {list(r.capture.ids or ())}, as "
                                             f"{r.release} reads them")
    if declared:
        failed = next((r.capture for r in rows if r.capture.error is not None), None)
        why = failed.error.message if failed is not None else "no engine release read them"
        raise WiringError(f"config.json's aux ids name no layers an engine captures: {why}",
                          hint="score a wiring explicitly with --layers, or fix it with eagle3conv config")
    if num_layers is None:
        raise UsageError("config.json names no aux layers and the target's layer count is unknown",
                         hint="pass --target, or write the wiring with eagle3conv config")
    return Candidate("config", _default_layers(family, num_layers), "no ids in config.json: every engine's default")


def _default_layers(family: str | None, num_layers: int) -> LayerSet:
    """What the newest SGLang release captures with no ids (the engine rules; the other engines'
    defaults name the same states for most families)."""
    from eagle3conv.spec.engines import default_capture

    cap = default_capture("sglang", family, num_layers)
    if cap.layers is None:
        raise WiringError(f"no engine default fits this target: {cap.error.message if cap.error else cap.unknown}")
    return cap.layers


def candidates(base: Candidate, trained: LayerSet | None, available: Sequence[LayerRef], num_layers: int | None,
               *, wide: bool = True, family: str | None = None) -> list[Candidate]:
    """The wirings worth scoring, among the layers the states hold."""
    have = set(available)
    out: list[Candidate] = []
    seen: set[LayerSet] = set()

    def add(name: str, layers: Sequence[LayerRef], why: str) -> None:
        layers = tuple(layers)
        if (layers in seen or len(set(layers)) != len(layers) or not all(r in have for r in layers)
                or any(a.output_of >= b.output_of for a, b in zip(layers, layers[1:]))):
            return
        seen.add(layers)
        out.append(Candidate(name, layers, why))

    base_layers = base.layers
    add(base.name, base_layers, base.why)
    if trained is not None:
        add("training record", trained, "the layers the training record names")
    for shift in (-1, 1):
        shifted = [LayerRef(r.output_of + shift) for r in base_layers if r.output_of + shift >= -1]
        if len(shifted) == len(base_layers):
            add(f"config shifted by {shift:+d}", shifted,
                "the off-by-one of engines numbering layer inputs vs outputs")
    emb = (EMBEDDING, *base_layers[:-1])
    add("with the embedding output", emb, "in case training included the embedding output (docs/facts.md §5)")
    if num_layers is not None and num_layers >= 4:
        from eagle3conv.spec.engines import default_capture, default_engines

        for rel in default_engines():  # each distinct default, by the engine rules
            cap = default_capture(rel, family, num_layers)
            if cap.layers is not None:
                add("engine default", cap.layers, f"what {rel} captures with no ids")
        n = num_layers  # SpecForge #240: online runs of 2025-09-01..2025-10-20 captured middle layer N//2
        add("SpecForge 2025-09 default", (LayerRef(1), LayerRef(n // 2), LayerRef(n - 4)),
            "SpecForge online runs between 2025-09-01 and 2025-10-20 captured the outputs of layers 1, N//2, N-4 "
            "(SpecForge #240), which no engine default matches")
    if wide:
        for slot in range(len(base_layers)):
            for delta in (-2, -1, 1, 2):
                moved = list(base_layers)
                o = moved[slot].output_of + delta
                if o < -1:
                    continue
                moved[slot] = LayerRef(o)
                add(f"slot {slot} moved {delta:+d}", moved, "a wider search around the config's wiring")
    return out


# --------------------------------------------------------------------------- the global search

SCREEN_TOKENS = 4096  # real tokens the screen reads (whole sequences from the start of the states)
# (real tokens screened, wirings kept), ranked by the step-1 log score: far less noisy than step-1 hits
# on as many positions (the lost-wiring drafter's trained set ranks first of 4,495 on the first 64 tokens
# of the held-out states, where hits rank it 33rd in a 64-way tie), so the first stages read few tokens
SCREEN_STAGES = ((64, 320), (512, 40), (SCREEN_TOKENS, 16))
SCREEN_RANK = "log-score"
FINALISTS = 8  # screened wirings confirmed on every position (the evidence wirings are confirmed too)


def names_layers(config: dict) -> bool:
    """Whether config.json names the aux layers (eagle3conv's provenance, SGLang's or vLLM's ids)."""
    prov = ((config.get("eagle3conv") or {}).get("aux_layers") or {}).get("layers")
    return any(isinstance(x, list) and len(x) > 0 for x in (prov, *aux_ids(config).fields().values()))


def all_wirings(available: Sequence[LayerRef], slots: int) -> list[LayerSet]:
    """Every ascending set of ``slots`` layers among ``available`` (embedding output included)."""
    import itertools

    refs = sorted(set(available), key=lambda r: r.output_of)
    return [tuple(c) for c in itertools.combinations(refs, slots)]


def screen_dtype(device: str, dtype):
    """The dtype the screen runs in: the verify dtype, or bf16 on a CPU with native bf16 matmul
    (the screen only ranks wirings; the finalists are confirmed in the verify dtype)."""
    import torch

    if not str(device).startswith("cpu") or dtype is not torch.float32:
        return dtype
    try:
        fast = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        fast = False
    return torch.bfloat16 if fast else dtype


def global_search(drafter, states, near: list[Candidate], available: Sequence[LayerRef], slots: int,
                  num_layers: int | None, *, target_embeds: bool, labels=None, max_sequences: int | None = None,
                  progress=None) -> tuple[list[Candidate], dict]:
    """Screen every ascending wiring of the layers the states hold with the step-1 log score on
    the first sequences (:func:`eagle3conv.verify.evaluate.screen`), and return the wirings
    to confirm on every position -- ``near`` (the evidence: the config's, the record's,
    the engine defaults) then the screen's finalists -- and the search's coverage."""
    from eagle3conv.verify.evaluate import screen

    sets = all_wirings(available, slots)
    total = states.num_sequences if max_sequences is None else min(max_sequences, states.num_sequences)
    lens = states.attention_mask[:total].sum(1).tolist()
    rows, tokens = 0, 0
    for n in lens:
        if tokens >= SCREEN_TOKENS:
            break
        rows, tokens = rows + 1, tokens + int(n)
    cb = None
    if progress:
        def cb(done, tot):
            progress(f"screening {len(sets)} wirings", done, tot)
    res, kept = screen(drafter, states, sets, rows=rows, target_embeds=target_embeds, labels=labels,
                       stages=SCREEN_STAGES, progress=cb, rank_by=SCREEN_RANK)
    out = list(near)
    seen = {c.layers for c in out}
    finalists = [sets[i] for i in kept[:FINALISTS]]
    for j, ls in enumerate(finalists):
        if ls not in seen:
            seen.add(ls)
            out.append(Candidate(f"search #{j + 1}", ls, f"global search finalist (step-1 log score "
                                 f"{res.logp[kept[j]]:.4f}, acceptance {res.acceptance(kept[j]):.3f} on the screen)"))
    have = {r.output_of for r in available}
    missing = [] if num_layers is None else [i for i in range(-1, num_layers) if i not in have]
    coverage = {
        "global": not missing,
        "layers": len(have),
        "missing_layers": missing,
        "screened": len(sets),
        "screen_sequences": res.sequences,
        "screen_positions": res.positions,
        "confirmed": len(out),
        "screen_ranked_by": f"step-1 {SCREEN_RANK}",
        "screen_stages": [list(x) for x in SCREEN_STAGES],
        "screen_best": [{"layers": describe(sets[i]), "step1_acceptance": round(res.acceptance(i), 4),
                         "step1_log_score": round(res.logp[i], 5)} for i in kept[:FINALISTS]],
        "screen_seconds": round(res.seconds, 3),
        "slot_profile": slot_profile(res, slots),
    }
    return out, coverage


def _finite(x: float, digits: int) -> float | None:
    """A number for the JSON report: rounded, or None where it is not finite (no data left)."""
    import math

    return round(x, digits) if math.isfinite(x) else None


def slot_profile(res, slots: int) -> list[list[dict]]:
    """Per aux slot, per layer: the best screen acceptance of any wiring reading that layer
    in that slot (what ``verify --plot`` draws)."""
    best: list[dict[int, float]] = [{} for _ in range(slots)]
    for ls, a in zip(res.sets, res.step1):
        for s, r in enumerate(ls):
            if a > best[s].get(r.output_of, -1.0):
                best[s][r.output_of] = a
    return [[{"output_of": o, "step1_acceptance": round(a, 4)} for o, a in sorted(b.items())] for b in best]


# --------------------------------------------------------------------------- norms


def norm_comparison(score: Score, training_norms: dict | None) -> list[dict] | None:
    """Slot by slot: inference median next to training median; flagged beyond 2x."""
    if not training_norms or not training_norms.get("slots"):
        return None
    slots = training_norms["slots"]
    if len(slots) != len(score.norms):
        return None
    out = []
    for i, (inf, tr) in enumerate(zip(score.norms, slots)):
        a, b = inf.get("median"), tr.get("median")
        ratio = (a / b) if a and b else None
        flagged = ratio is not None and (ratio > NORM_FLAG_RATIO or ratio < 1 / NORM_FLAG_RATIO)
        out.append({"slot": i, "layer": str(score.candidate.layers[i]), "inference_median": a,
                    "training_median": b, "ratio": None if ratio is None else round(ratio, 4), "flagged": flagged})
    return out


def norm_mismatch(cmp: list[dict] | None) -> float | None:
    if not cmp:
        return None
    vals = [abs(math.log(c["ratio"])) for c in cmp if c["ratio"]]
    return sum(vals) / len(vals) if vals else None



# --------------------------------------------------------------------------- the verdict


@dataclass
class Verdict:
    """What the scores say about the wiring. ``status``: see the module docstring."""

    config_accept_length: float
    status: Status | None = None
    norm_flags: list[str] = field(default_factory=list)  # the config's slots whose norms are out of line
    decided_by: str | None = None  # for people: which evidence decided (never parsed)
    config_is_best: bool | None = None
    paired_differences: list[dict] = field(default_factory=list)  # the leader vs every other wiring
    best: str | None = None  # the wiring named (None unless named or stands)
    best_layers: str | None = None
    best_accept_length: float | None = None
    tied: int | None = None  # wirings acceptance cannot separate from the leader (itself included)
    separated: bool | None = None
    runner_up: str | None = None
    advice: str | None = None  # the command that writes the named wiring, when it is not the config's
    coverage: dict | None = None  # what the search covered (global_search's coverage), None: no global search
    best_found: str | None = None  # the leader on acceptance, named or not
    tied_set: list[str] = field(default_factory=list)  # the wirings acceptance cannot separate (leader first)
    positions_to_separate: int | None = None  # estimated positions that would separate the leader from the rest
    config_worse: bool | None = None  # the config's wiring is clearly (paired interval) below the best found
    statistic: str | None = None  # what decided: acceptance | log-score | norm-fingerprint | training-record | config
    log_score: dict | None = None  # the log-score comparison, where acceptance left wirings tied

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in STATUSES:
            raise ValueError(f"verdict status {self.status!r} is not one of {STATUSES}")

    @property
    def names_a_wiring(self) -> bool:
        return self.status in ("named", "stands")

    def to_dict(self) -> dict:
        """The report's ``verdict`` object (keys present only where they apply)."""
        out: dict = {"config_accept_length": self.config_accept_length, "status": self.status}
        if self.norm_flags:
            out["norm_flags"] = list(self.norm_flags)
        if self.status is None:
            return out
        if self.status == "undecided":
            out.update({"decided_by": self.decided_by, "config_is_best": self.config_is_best})
            return out
        out["paired_differences"] = list(self.paired_differences)
        out.update({
            "best": self.best, "best_layers": self.best_layers, "best_accept_length": self.best_accept_length,
            "decided_by": self.decided_by, "tied": self.tied, "separated": self.separated,
            "runner_up": self.runner_up, "config_is_best": self.config_is_best,
        })
        if self.advice is not None:
            out["advice"] = self.advice
        for key in ("coverage", "best_found", "positions_to_separate", "config_worse", "statistic", "log_score"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.tied_set:
            out["tied_set"] = list(self.tied_set)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Verdict:
        """The inverse of :meth:`to_dict` (unknown keys are ignored)."""
        names = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in names}
        kw["norm_flags"] = list(kw.get("norm_flags") or [])
        kw["paired_differences"] = list(kw.get("paired_differences") or [])
        kw["tied_set"] = list(kw.get("tied_set") or [])
        return cls(**kw)


def log_score_leader(scores: list[Score], tied: list[int], log_score) -> tuple[int | None, dict]:
    """Among ``tied`` (wirings acceptance cannot separate), the leader on the step-1 log score
    and whether it is separated: its paired interval against every wiring acceptance does not
    separate it from excludes 0. Returns (the leader, or None when it is not separated or a
    wiring's acceptance is clearly above it -- a clear acceptance difference is never
    overridden -- , the comparison for the verdict). ``log_score(indices)``: their
    :class:`~eagle3conv.verify.logscore.LogScore`."""
    k = LOG_SCORE_STEP
    got = dict(zip(tied, log_score(list(tied))))
    lead = max(tied, key=lambda i: got[i].mean(k))
    acc = {j: paired_difference(scores[lead], scores[j]) for j in range(len(scores)) if j != lead}
    above = [j for j, (_, _, hi) in acc.items() if hi < 0]
    close = [j for j, (_, lo, _) in acc.items() if lo <= 0 and j not in above]
    missing = [j for j in close if j not in got]
    got.update(zip(missing, log_score(missing)))
    rows, separated = [], not above
    for j in close:
        d, lo, hi = paired_mean_difference(got[lead].logp[k], got[lead].counted[k], got[j].logp[k],
                                           got[j].counted[k])
        separated = separated and lo > 0
        rows.append({"wiring": scores[j].candidate.name, "layers": describe(scores[j].candidate.layers),
                     "log_score_gap": _finite(d, 5), "ci95": [_finite(lo, 5), _finite(hi, 5)]})
    rows.sort(key=lambda r: (r["log_score_gap"] is None, r["log_score_gap"] or 0.0))
    out = {"statistic": f"mean log-probability (nats) the drafter gives the target's token at draft step {k + 1}, "
                        "on the positions whose token is in the draft vocabulary; paired 95% bootstrap over "
                        "sequences",
           "leader": describe(scores[lead].candidate.layers), "leader_mean": round(got[lead].mean(k), 5),
           "positions": sum(got[lead].counted[k]), "separated": bool(separated and rows),
           "differences": rows}
    if above:
        out["acceptance_above"] = [describe(scores[j].candidate.layers) for j in above]
    return (lead if out["separated"] else None), out


def decide(scores: list[Score], comparisons: Sequence[list[dict] | None], search: bool, path,
           target: str | None, *, coverage: dict | None = None, config_names_layers: bool = True,
           log_score=None) -> Verdict:
    """The verdict on ``scores`` (``scores[0]``: the config's or the given wiring;
    ``comparisons[i]``: :func:`norm_comparison` of ``scores[i]``, or None).
    ``path`` and ``target`` go into the advice's ``eagle3conv config`` command.
    ``coverage``: what :func:`global_search` screened (None: only the wirings scored);
    a wiring is named only when the search covered every layer of the target.
    ``config_names_layers``: False when config.json names no aux layers (``scores[0]``
    is then the engines' default, which never "stands" on its own).
    ``log_score(indices)``: the :class:`~eagle3conv.verify.logscore.LogScore` of those scores
    (computed only when acceptance leaves a global search's leaders tied)."""
    main = scores[0]
    out = Verdict(config_accept_length=round(main.accept_length, 4), coverage=coverage)
    flagged = [c for c in (comparisons[0] or []) if c["flagged"]]
    out.norm_flags = [f"slot {c['slot']} ({c['layer']}): inference median {c['inference_median']:.3g} vs "
                      f"training {c['training_median']:.3g} ({c['ratio']:.2f}x)" for c in flagged]
    if not search or len(scores) < 2:
        return out
    if main.effective_sequences < MIN_SEARCH_SEQUENCES:
        out.status = "undecided"
        out.decided_by = (f"not decided: a wiring search needs at least {MIN_SEARCH_SEQUENCES} "
                          f"sequences with full chains (these states have {main.effective_sequences}); capture more")
        return out
    complete = coverage is not None and coverage.get("global")
    # rank by the every-chain-start accept length: same positions for every wiring, lowest variance
    ranked = sorted(range(len(scores)), key=lambda i: -scores[i].accept_length_all)
    best, second = scores[ranked[0]], scores[ranked[1]]
    diffs = {i: paired_difference(best, scores[i]) for i in ranked[1:]}
    tied = [ranked[0]] + [i for i in ranked[1:] if diffs[i][1] <= 0]
    separated = len(tied) == 1  # the leader's paired interval excludes 0 against every other wiring
    chosen, status = ranked[0], "named"
    decided_by, statistic = "acceptance", "acceptance"
    if complete:
        coverage["summary"] = (f"global search: {coverage['screened']} wirings screened (every ascending set of the "
                               f"{coverage['layers']} layers the states hold) on {coverage['screen_positions']} "
                               f"positions, {coverage['confirmed']} confirmed on all {main.tokens}")
    out.paired_differences = [
        {"wiring": scores[i].candidate.name, "layers": describe(scores[i].candidate.layers),
         "accept_length_gap": round(d, 4), "ci95": [round(lo, 4), round(hi, 4)]}
        for i, (d, lo, hi) in diffs.items()]
    out.best_found = describe(best.candidate.layers)
    if 0 in diffs and diffs[0][1] > 0:
        out.config_worse = True
    elif ranked[0] != 0 or 0 in tied:
        out.config_worse = False
    if not separated:
        out.tied_set = [describe(scores[i].candidate.layers) for i in tied]
        # positions that would separate the leader from the closest tied wiring, at the variance seen
        gaps = [(diffs[i][0], (diffs[i][2] - diffs[i][1]) / 2) for i in tied[1:]]
        need = [main.tokens * (w / g) ** 2 for g, w in gaps if g > 0 and math.isfinite(w)]
        if need and len(need) == len(gaps):
            out.positions_to_separate = int(math.ceil(max(need)))
        # Acceptance cannot tell the leaders apart. The norm fingerprint tells an embedding
        # output from a deep layer, not layer 13 from 14 (adjacent layers' norms differ by
        # less than two datasets' medians do), so it only overturns the config's (or the
        # training record's) wiring when that one's norms are out of line and another
        # leader's are clearly in line.

        def in_line(i: int) -> bool | None:
            cmp = comparisons[i]
            return None if cmp is None else not any(c["flagged"] for c in cmp)

        def clearly_in_line(i: int) -> bool:
            cmp = comparisons[i]
            return bool(cmp) and all(c["ratio"] and 0.8 <= c["ratio"] <= 1.25 for c in cmp)

        anchors = [i for i in tied if scores[i].candidate.name == "training record"] + (
            [0] if 0 in tied and config_names_layers else [])
        anchor = next((i for i in anchors if in_line(i) is not False), None)
        ok = [i for i in tied if clearly_in_line(i)]
        by_log = None
        if complete and log_score is not None:
            by_log, out.log_score = log_score_leader(scores, tied, log_score)
        if anchor is not None:
            chosen, status = anchor, "stands"
            rec = scores[anchor].candidate.name == "training record"
            who = "the training record's" if rec else "the config's"
            statistic = "training-record" if rec else "config"
            decided_by = (f"acceptance cannot separate {len(tied)} wirings; {who} wiring is among them"
                          + (" and its norms match training" if in_line(anchor) else "") + ", so it stands")
            if by_log is not None and by_log != anchor:
                decided_by += (f" (the log score prefers {describe(scores[by_log].candidate.layers)}: see "
                               "verdict.log_score)")
        elif by_log is not None:
            chosen, statistic = by_log, "log-score"
            nxt = out.log_score["differences"][0]
            decided_by = (f"log score: acceptance cannot separate {len(tied)} wirings; the log-probability the "
                          f"drafter gives the target's token at draft step {LOG_SCORE_STEP + 1} (a proper scoring "
                          f"rule, on {out.log_score['positions']} positions) separates this one from every wiring "
                          f"acceptance leaves tied with it (closest: {nxt['layers']}, "
                          f"{nxt['log_score_gap']:+.4f} nats [{nxt['ci95'][0]:+.4f}, {nxt['ci95'][1]:+.4f}] paired)")
        elif ok and complete and len(ok) == 1:
            chosen, statistic = ok[0], "norm-fingerprint"
            decided_by = ("norm fingerprint (acceptance cannot separate the leaders; of them, only this wiring's "
                          "norms are within 25% of training)")
        else:
            statistic = None
            status = "ambiguous"
            more = (f"; about {out.positions_to_separate - main.tokens} more positions would separate them at the "
                    f"variance seen" if out.positions_to_separate and out.positions_to_separate > main.tokens else
                    "; no number of positions separates them at the gaps seen")
            decided_by = (f"ambiguous: acceptance cannot separate {len(tied)} wirings ("
                          + "; ".join(out.tied_set[:4]) + (" ..." if len(tied) > 4 else "")
                          + ") and " + ("neither the log score nor " if out.log_score else "")
                          + "the norms do not decide" + more + ": capture more tokens")
    if status == "named" and not complete:
        status = "ambiguous"
        where = ("only the wirings near the evidence were scored" if coverage is None else
                 f"the states hold {coverage['layers']} of the target's layers (missing: "
                 + ", ".join(map(str, coverage["missing_layers"][:8]))
                 + (" ..." if len(coverage["missing_layers"]) > 8 else "") + ")")
        decided_by = (f"best in the searched neighbourhood: {describe(best.candidate.layers)}, separated from the "
                      f"wirings scored, but not a global search ({where}); capture every layer "
                      "(eagle3conv capture without --layers) and search again")
    win = scores[chosen]
    out.status, out.decided_by, out.statistic = status, decided_by, statistic if status != "ambiguous" else None
    out.best, out.best_layers = win.candidate.name, describe(win.candidate.layers)
    out.best_accept_length, out.tied, out.separated = round(win.accept_length, 4), len(tied), separated
    out.runner_up = second.candidate.name if chosen == ranked[0] else best.candidate.name
    out.config_is_best = win is main
    tgt = f" --target {target}" if target else ""

    def command(layers) -> str:
        return (f"eagle3conv config {path}{tgt} --trained-on {','.join(map(str, to_ids(layers, 'output')))} "
                "--captured-at output")

    if status == "ambiguous":
        out.best = out.best_layers = None
    elif win is not main or not config_names_layers:
        out.advice = (f"the drafter was most likely trained on {describe(win.candidate.layers)}; write it: "
                      f"{command(win.candidate.layers)}")
    if out.config_worse:  # said first, whether or not a wiring is named
        d, lo, hi = diffs[0]
        what = "the config's wiring" if config_names_layers else "the engines' default (config.json names no layers)"
        lead = (f"{what} ({describe(main.candidate.layers)}) is clearly worse than the best found "
                f"({describe(best.candidate.layers)}: accept length +{d:.3f} [{lo:+.3f}, {hi:+.3f}] paired)")
        if out.advice is None:
            out.advice = (f"{lead}; the best found is not named (see the verdict); to write it: "
                          f"{command(best.candidate.layers)}")
        else:
            out.advice = f"{lead}; {out.advice}"
    elif status == "ambiguous" and not config_names_layers:
        out.advice = (f"config.json names no aux layers and the search names none; the best found: "
                      f"{describe(best.candidate.layers)}, to write it: {command(best.candidate.layers)}")
    return out


__all__ = [
    "FINALISTS", "LOG_SCORE_STEP", "SCREEN_STAGES", "log_score_leader", "SCREEN_TOKENS", "all_wirings", "global_search", "names_layers", "screen_dtype",
    "MIN_SEARCH_SEQUENCES", "NORM_FLAG_RATIO", "STATUSES", "Status", "Verdict", "candidates", "config_candidate",
    "decide", "norm_comparison", "norm_mismatch",
]
