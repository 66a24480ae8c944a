"""The wiring search: which wirings to score, how scores compare with training, and the verdict.

:func:`config_candidate` is the wiring an engine would use with the config;
:func:`candidates` adds the wirings worth scoring around it (the training
record's, each shifted by one, the embedding-included variant, each engine's
default, per-slot moves of 1 and 2), among the layers the states hold.
:func:`global_search` screens every wiring of the layers the states hold, :func:`refine`
tries the single-slot changes of the leaders (docs/facts.md §12).
:func:`norm_comparison` puts a score's per-slot norms next to training's.
:func:`decide` turns the scores into a :class:`Verdict`, whose ``status`` says
what the search concluded (callers branch on it, never on the wording):

``named``      the verdict's set (every wiring not excluded at 95% against the best: by
               acceptance, then by the log score (:mod:`eagle3conv.verify.logscore`) among
               what acceptance leaves, then by the norm fingerprint) has one member, in a
               search that covered every layer
``stands``     the training record's or the config's wiring is in the set (norms not out
               of line), so it stands
``ambiguous``  the set has several members: nothing is named; the set and what would
               separate it are reported
``undecided``  fewer than :data:`MIN_SEARCH_SEQUENCES` sequences: no search verdict
``None``       no search was run (one wiring scored)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from enum import Enum
from typing import Literal

from eagle3conv.errors import UsageError, WiringError
from eagle3conv.verify.evaluate import Candidate, Score, ScreenBound
from eagle3conv.verify.stats import (
    excluded_at,
    paired_difference,
    paired_mean_difference,
    paired_ratio_bound,
    t_quantile,
)
from eagle3conv.spec.layers import EMBEDDING, LayerRef, LayerSet, describe, to_ids, to_refs
from eagle3conv.spec.drafter import aux_ids
from eagle3conv.verify.words import SEPARATION_WHY, coverage_summary, norm_flag_words, statistic_words, verdict_words

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

    def add(name: str, layers: Sequence[LayerRef], why: str, record: bool = False) -> None:
        layers = tuple(layers)
        if (layers in seen or len(set(layers)) != len(layers) or not all(r in have for r in layers)
                or len(layers) != len(base.layers)  # the engines' 3-layer defaults do not fit a k-slot fc
                or any(a.output_of >= b.output_of for a, b in zip(layers, layers[1:]))):
            return
        seen.add(layers)
        out.append(Candidate(name, layers, why, record))

    base_layers = base.layers
    add(base.name, base_layers, base.why)
    if trained is not None:
        add("training record", trained, "the layers the training record names", record=True)
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

SCREEN_BOUND = ScreenBound()  # when the screen drops a wiring: docs/facts.md §12
GPU_SCREEN_SECONDS = 15.0  # the screen's time budget on a GPU unless --search-budget says otherwise (§12)


def screen_bound(device: str, seconds: float | None) -> ScreenBound:
    """The screen's bound for a search on ``device``: the user's time budget, else on a GPU
    :data:`GPU_SCREEN_SECONDS` (a work cap there would stop a 61-layer search at seconds that
    depend on the GPU), else the work cap (the same work on every CPU)."""
    if seconds is None and str(device).startswith("cuda"):
        seconds = GPU_SCREEN_SECONDS
    return replace(SCREEN_BOUND, seconds=seconds)
MAX_CONFIRM = 24  # screen survivors confirmed on every position at most; the rest stay in the verdict's set
SET_ALPHA = 0.05  # the verdict's set holds the best with 95%: half to acceptance, half to the log score
LISTED = 50  # unconfirmed survivors named in the report (all are counted)
REFINE_ROUNDS = 4  # local refinement rounds at most (each: the single-slot neighbours of the leaders)
REFINE_CONFIRM = 16  # wirings local refinement confirms at most, over all its rounds
REFINE_OPEN = 64  # wirings one round screens again at most (best screen score first)


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
    (the screen only ranks wirings). With ``--dtype auto`` the whole search runs in it there, as
    on a GPU; an explicit ``--dtype fp32`` confirms the finalists in fp32."""
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
                  progress=None, bound: ScreenBound = SCREEN_BOUND) -> tuple[list[Candidate], ScreenSearch, object]:
    """Screen every ascending wiring of the layers the states hold on the step-1 log score
    (:func:`eagle3conv.verify.evaluate.screen`: a wiring leaves only when the data excludes
    it against the leader, docs/facts.md §12), and return the wirings to confirm on every
    position -- ``near`` (the evidence: the config's, the record's, the engine defaults)
    then the screen's survivors, best first, at most :data:`MAX_CONFIRM` -- what the screen
    found (:class:`ScreenSearch`; ``unconfirmed``: survivors past that cap, which the verdict
    keeps in its set; :meth:`Coverage.of` makes the report's coverage of it), and the
    :class:`~eagle3conv.verify.evaluate.ScreenResult` (for :func:`refine`)."""
    from eagle3conv.verify.evaluate import screen

    sets = all_wirings(available, slots)
    total = states.num_sequences if max_sequences is None else min(max_sequences, states.num_sequences)
    cb = None
    if progress:
        def cb(done, tot):
            progress(f"screening {len(sets)} wirings", done, tot)
    # the evidence is named before any data is read: each is a reference from the first stage (a prior)
    at = {ls: i for i, ls in enumerate(sets)}
    priors = tuple(at[c.layers] for c in near if c.layers in at)
    res, kept = screen(drafter, states, sets, rows=total, target_embeds=target_embeds, labels=labels,
                       bound=bound, priors=priors, progress=cb)
    out = list(near)
    seen = {c.layers for c in out}
    confirm = [i for i in kept if sets[i] not in seen]
    for j, i in enumerate(confirm[:MAX_CONFIRM]):
        seen.add(sets[i])
        out.append(Candidate(f"search #{j + 1}", sets[i], f"not excluded by the screen (step-1 log score "
                             f"{res.logp[i]:.4f}, acceptance {res.acceptance(i):.3f} on {res.reached[i]} positions)"))
    have = {r.output_of for r in available}
    missing = [] if num_layers is None else [i for i in range(-1, num_layers) if i not in have]
    found = ScreenSearch(res=res, bound=bound, slots=slots, kept=tuple(kept), layers=len(have),
                         missing_layers=tuple(missing), confirmed=len(out),
                         unconfirmed=tuple(sets[i] for i in confirm[MAX_CONFIRM:]))
    return out, found, res


@dataclass(frozen=True)
class ScreenSearch:
    """What :func:`global_search` found, before refinement: the screen's result and bound,
    the wirings it kept (indices into ``res.sets``, best first), the layers the states hold,
    the target's layers they lack, how many wirings go to be confirmed, and the survivors
    past :data:`MAX_CONFIRM` (kept in the verdict's set unconfirmed)."""

    res: object  # the ScreenResult
    bound: ScreenBound
    slots: int
    kept: tuple[int, ...]
    layers: int
    missing_layers: tuple[int, ...]
    confirmed: int
    unconfirmed: tuple[LayerSet, ...]

    @property
    def is_global(self) -> bool:
        return not self.missing_layers


@dataclass(frozen=True)
class Coverage:
    """What a wiring search covered (the report's ``verdict.coverage``), assembled once by
    :meth:`of`. ``is_global``: the states hold every layer of the target; ``unconfirmed``:
    the screen's (and refinement's) survivors verify did not confirm, which stay in the
    verdict's set (``unconfirmed_count`` of them, the first :data:`LISTED` named).
    ``screen``, ``screen_set`` and ``refinement`` are the records of
    :func:`screen_record`, :func:`screen_ranking` and local refinement."""

    is_global: bool
    layers: int
    missing_layers: tuple[int, ...] = ()
    screened: int = 0
    screen_sequences: int = 0
    screen_positions: int = 0
    confirmed: int = 0
    screen: dict | None = None
    screen_kept: int = 0
    unconfirmed_count: int = 0
    unconfirmed: tuple[str, ...] = ()
    screen_best: tuple[dict, ...] = ()
    screen_seconds: float = 0.0
    slot_profile: tuple = ()
    screen_set: dict | None = None
    refinement: dict | None = None

    @property
    def capped(self) -> bool:
        """The screen stopped at its work cap (or time budget) before the data decided."""
        return self.screen is not None and not self.screen.get("complete", True)

    @property
    def refined(self) -> int:
        """Wirings local refinement confirmed."""
        return int((self.refinement or {}).get("confirmed") or 0)

    @classmethod
    def of(cls, found: ScreenSearch, refinement: dict | None = None,
           pending: Sequence[LayerSet] | None = None) -> Coverage:
        """The coverage of a global search (``found``) and its local refinement (its record,
        and the wirings it and the screen left unconfirmed: ``pending``)."""
        res, kept = found.res, list(found.kept)
        left = found.unconfirmed if pending is None else tuple(pending)
        return cls(
            is_global=found.is_global, layers=found.layers, missing_layers=found.missing_layers,
            screened=len(res.sets), screen_sequences=res.sequences, screen_positions=res.positions,
            confirmed=found.confirmed, screen=screen_record(res, found.bound), screen_kept=len(kept),
            unconfirmed_count=len(left), unconfirmed=tuple(describe(x) for x in left[:LISTED]),
            screen_best=tuple({"layers": describe(res.sets[i]), "step1_acceptance": round(res.acceptance(i), 4),
                               "step1_log_score": round(res.logp[i], 5), "positions": res.reached[i]}
                              for i in kept[:8]),
            screen_seconds=round(res.seconds, 3), slot_profile=tuple(slot_profile(res, found.slots)),
            screen_set=screen_ranking(res, kept, found.bound), refinement=refinement)

    def to_dict(self, summary: str | None = None) -> dict:
        out = {"global": self.is_global, "layers": self.layers, "missing_layers": list(self.missing_layers),
               "screened": self.screened, "screen_sequences": self.screen_sequences,
               "screen_positions": self.screen_positions, "confirmed": self.confirmed,
               "screen_ranked_by": "step-1 log-score", "screen": self.screen, "screen_kept": self.screen_kept,
               "unconfirmed_count": self.unconfirmed_count, "unconfirmed": list(self.unconfirmed),
               "screen_best": list(self.screen_best), "screen_seconds": self.screen_seconds,
               "slot_profile": list(self.slot_profile)}
        for key in ("screen_set", "refinement"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if summary is not None:
            out["summary"] = summary
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Coverage:
        """A report's coverage read back (its ``summary``, words, is made again from the fields)."""
        names = set(cls.__dataclass_fields__) - {"is_global"}
        kw = {k: v for k, v in d.items() if k in names}
        for k in ("missing_layers", "unconfirmed", "screen_best", "slot_profile"):
            kw[k] = tuple(kw.get(k) or ())
        return cls(is_global=bool(d.get("global")), **kw)


class SeparationReason(str, Enum):
    """What would separate the verdict's set (:class:`Separation`): the words are
    :data:`eagle3conv.verify.words.SEPARATION_WHY`."""

    FACTOR = "factor"  # more data like this, ``factor`` times what was read
    NO_GAP = "no-gap"  # some member shows no gap to the best at all: no amount of such data
    UNCONFIRMED = "unconfirmed"  # the screen kept wirings verify did not confirm
    CAPPED = "capped"  # the screen stopped at its work cap (or time budget) before the data excluded them


@dataclass(frozen=True)
class Separation:
    """What would separate a set of several wirings: ``reason``; with FACTOR, the positions and
    sequences like these that would (``factor`` times the data read)."""

    members: int
    reason: SeparationReason
    sequences_now: int
    statistic: str
    factor: float | None = None
    positions: int | None = None
    sequences: int | None = None

    def to_dict(self) -> dict:
        if self.reason is SeparationReason.FACTOR:
            return {"members": self.members, "factor": self.factor, "positions": self.positions,
                    "sequences": self.sequences, "sequences_now": self.sequences_now, "statistic": self.statistic,
                    "reason": self.reason.value}
        return {"members": self.members, "factor": None, "sequences_now": self.sequences_now,
                "statistic": self.statistic, "why": SEPARATION_WHY[self.reason.value], "reason": self.reason.value}

    @classmethod
    def from_dict(cls, d: dict) -> Separation:
        """A report's ``to_separate`` read back (a report without ``reason``: FACTOR where it
        gives one, else NO_GAP)."""
        reason = d.get("reason") or ("factor" if d.get("factor") is not None else "no-gap")
        return cls(members=int(d["members"]), reason=SeparationReason(reason),
                   sequences_now=int(d.get("sequences_now") or 0), statistic=str(d.get("statistic") or ""),
                   factor=d.get("factor"), positions=d.get("positions"), sequences=d.get("sequences"))


SET_LEADERS = 5  # members of a large set named as leading it (the rest are counted)


def screen_ranking(res, kept: list[int], bound: ScreenBound) -> dict | None:
    """The screen's survivors ranked by their step-1 log score on every position the screen
    read, with, per member, its gap to the leader and how many sequences like these the screen's
    own bound (the same quantile, Bonferroni over every comparison) would need to exclude it at
    that gap and variance: ``(q * se / gap)^2`` times the sequences read. ``to_leave[k]``: the
    sequences that would leave at most k members (None where some member shows no gap)."""
    import torch

    from eagle3conv.verify.evaluate import paired_bound

    vecs = [res.vectors[i] for i in kept]
    if len(kept) < 2 or any(v is None for v in vecs) or len({len(v) for v in vecs}) != 1 or not len(vecs[0]):
        return None
    n = len(vecs[0])
    D, se, m = paired_bound(torch.stack(vecs), 0, res.pos_row[:n], bound)
    q = bound.quantile(res.tests, m)
    seqs = len(set(res.pos_row[:n]))
    need = [None] + [((q * float(se[j]) / float(D[j])) ** 2 * seqs) if float(D[j]) > 0 and math.isfinite(q)
                     else None for j in range(1, len(kept))]
    hardest = sorted((x if x is not None else math.inf for x in need[1:]), reverse=True)

    def leave(k: int):  # at most k members left: every member but the leader and the k - 1 hardest excluded
        if k > len(hardest):
            return None
        x = hardest[k - 1]
        return None if not math.isfinite(x) else int(math.ceil(max(x, seqs)))

    rows = [{"layers": describe(res.sets[i]), "step1_log_score": round(res.logp[i], 5),
             "gap": round(float(D[j]), 5), "se": round(float(se[j]), 5),
             "sequences_to_exclude": None if need[j] is None else int(math.ceil(max(need[j], seqs)))}
            for j, i in enumerate(kept[:SET_LEADERS * 2])]
    return {"size": len(kept), "positions": n, "sequences": seqs, "ranked": rows,
            "to_leave": {str(k): leave(k) for k in (1, 3, 10) if k < len(kept)},
            "rule": "members ranked by the step-1 log score on every position the screen read; gap: the leader's "
                    "mean minus the member's (nats per position), se its standard error over the screen's blocks; "
                    "sequences_to_exclude: (q * se / gap)^2 x the sequences read, q the screen's own quantile"}


def screen_record(res, bound: ScreenBound) -> dict:
    """What a screen did, for the report: its bound, its stages, whether the data (not the
    work cap) decided what it kept."""
    read = res.stages[-1]["positions"] if res.stages else 0
    referenced = any("reference" in st for st in res.stages)  # the reference test ran (evaluate.ScreenReference)
    priors = next((st["priors"]["wirings"] for st in res.stages if "priors" in st), 0)  # the priors' test ran
    others = []
    if referenced:
        others.append("after the pilot's stages, the reference's did on the later sequences (the reference was "
                      "chosen on other sequences)")
    if priors:
        others.append(f"one of the {priors} wirings named before the data (the config's, the record's, the engine "
                      "defaults) did on every position read")
    out = {"bound": bound.to_dict(), "stages": res.stages, "complete": res.complete, "work": res.work,
           "cap": res.cap, "read": {"positions": read, "of": res.total,
                                    "fraction": round(read / res.total, 4) if res.total else None},
           "guarantee": (f"a wiring left the screen only when the leader's step-1 log score exceeded its own by "
                         f"more than the bound (paired, Bonferroni over every comparison"
                         + (") or " + " or ".join(others) + " (no correction over the wirings; " if others else ", ")
                         + f"family-wise {bound.alpha:g}); docs/facts.md §12")}
    if not res.complete:
        what = (f"its time budget ({bound.seconds:g} s, verify --search-budget)" if res.stopped_by == "seconds" else
                f"its work cap ({bound.max_work:g} passes of every wiring over the first stage and "
                f"{bound.max_tail:g} wirings over every position: {res.cap:,.0f} wiring-positions)")
        out["stopped_by"] = res.stopped_by
        out["to_finish"] = res.to_finish
        fin = res.to_finish or {}
        out["guarantee"] = (f"the screen stopped at {what} after {read} of {res.total} positions, with "
                            f"{len(res.alive)} wirings the data had not excluded: all stay in the verdict's set; "
                            f"reading every position for them would take about {fin.get('seconds')} s more "
                            f"({fin.get('work', 0):,} wiring-positions) at this run's rate")
    return out


def neighbours(layers: LayerSet, available: Sequence[LayerRef]) -> list[LayerSet]:
    """Every wiring one slot away from ``layers``: each slot moved to every other layer the
    states hold that keeps the slots ascending."""
    refs = sorted(set(available), key=lambda r: r.output_of)
    out: list[LayerSet] = []
    for slot in range(len(layers)):
        lo = layers[slot - 1].output_of if slot else -2
        hi = layers[slot + 1].output_of if slot + 1 < len(layers) else 1 << 30
        for r in refs:
            if lo < r.output_of < hi and r != layers[slot]:
                out.append(tuple(layers[:slot]) + (r,) + tuple(layers[slot + 1:]))
    return out


def acceptance_set(scores: list[Score]) -> tuple[list[int], dict[int, tuple[float, float, float]], dict]:
    """The wirings acceptance cannot exclude against the best (every-chain-start accept length,
    paired over sequences, one-sided at ``SET_ALPHA / 2`` shared by every comparison:
    Bonferroni): their indices, the best first; the best's paired difference with every other
    wiring (difference, 95% low, high: :func:`paired_difference`, what the report shows); and
    the bound's own figures per wiring (difference, standard error, sequences, excluded)."""
    ranked = sorted(range(len(scores)), key=lambda i: -scores[i].accept_length_all)
    best = scores[ranked[0]]
    diffs = {i: paired_difference(best, scores[i]) for i in ranked[1:]}
    bounds = {}
    for i in ranked[1:]:
        d, se, n = paired_ratio_bound(best.chain_accepted, best.chains, scores[i].chain_accepted, scores[i].chains)
        bounds[i] = (d, se, n, excluded_at(d, se, n, SET_ALPHA / 2, len(scores) - 1))
    return [ranked[0]] + [i for i in ranked[1:] if not bounds[i][3]], diffs, bounds


def set_members(scores: list[Score], log_score=None) -> tuple[list[int], int]:
    """The confirmed wirings the verdict's first two statistics leave (:func:`decide`):
    acceptance against the best, then, where it leaves several and ``log_score`` is given,
    the log score against its leader; and the wiring to compare others with on the log
    score (that leader, else the best by acceptance)."""
    tied, _, _ = acceptance_set(scores)
    if log_score is None or len(tied) < 2:
        return tied, tied[0]
    lead, _, _, gone, _ = log_score_exclusions(scores, tied, log_score)
    return [i for i in tied if i not in gone], lead


def refine(drafter, states, res, reference: LayerSet, leaders: Sequence[LayerSet], done: set[LayerSet],
           available: Sequence[LayerRef], *, target_embeds: bool, labels=None, max_sequences: int | None = None,
           bound: ScreenBound = SCREEN_BOUND, progress=None) -> tuple[list[LayerSet], dict, object]:
    """One round of local refinement: every single-slot change of each leader not in ``done``
    is compared with ``reference`` (the best confirmed wiring) with the screen's bound --
    first on the positions the global screen (``res``) already scored both on; those that
    data does not exclude are screened again against ``reference`` (never dropped) on all
    the data. Returns the wirings still not excluded (to confirm), best first, the round's
    record, and its screen's :class:`~eagle3conv.verify.evaluate.ScreenResult` (None when
    nothing was screened again). ``done`` gains every wiring tried."""
    import dataclasses

    from eagle3conv.verify.evaluate import screen

    index = {ls: i for i, ls in enumerate(res.sets)}
    tried: list[LayerSet] = []
    for ls in leaders:
        for n in neighbours(ls, available):
            if n not in done:
                done.add(n)
                tried.append(n)
    ref = index.get(reference)
    # a family of its own: the neighbours tried this round, each against the reference once
    open_ = [n for n in tried if ref is None or n not in index or not res.excluded(index[n], ref, len(tried))]
    open_.sort(key=lambda n: -res.logp[index[n]] if n in index else 0.0)
    # where the screen read both on every position, its data is all the data: not excluded there,
    # a neighbour is kept without a second screen (the same positions again)
    whole = [n for n in open_ if ref is not None and n in index and _read_everywhere(res, ref)
             and _read_everywhere(res, index[n])]
    excluded = len(tried) - len(open_)
    open_ = [n for n in open_ if n not in set(whole)]
    rec = {"leaders": [describe(x) for x in leaders], "reference": describe(reference), "tried": len(tried),
           "excluded_by_the_screen": excluded, "kept_on_the_screens_data": [describe(x) for x in whole],
           "screened_again": [describe(x) for x in open_[:REFINE_OPEN]],
           "not_screened_again": len(open_[REFINE_OPEN:]), "kept": [describe(x) for x in whole]}
    rec["_not_screened_again"] = open_[REFINE_OPEN:]  # the caller keeps them in the verdict's set
    open_ = open_[:REFINE_OPEN]  # the best by the screen's score first
    if not open_:
        return whole, rec, None
    total = states.num_sequences if max_sequences is None else min(max_sequences, states.num_sequences)
    sets = [reference] + open_
    cb = None
    if progress:
        def cb(d, t):
            progress(f"refining: {len(open_)} wirings one slot from a leader", d, t)
    # where the global screen scored a wiring on a stage's positions, its scores are taken (the same
    # rows and stages: the same positions in the same order)
    again, kept = screen(drafter, states, sets, rows=total, target_embeds=target_embeds, labels=labels,
                         bound=dataclasses.replace(bound, max_work=math.inf, max_tail=math.inf), keep=(0,),
                         progress=cb, known=(res, [index.get(ls) for ls in sets]))
    out = whole + [sets[i] for i in kept if i != 0]
    rec.update({"kept": [describe(x) for x in out], "screen": screen_record(again, bound),
                "seconds": round(again.seconds, 3)})
    return out, rec, again


def _read_everywhere(res, i: int) -> bool:
    """Whether the screen ``res`` read wiring ``i`` on every position of its rows."""
    v = res.vectors[i] if i < len(res.vectors) else None
    return v is not None and bool(res.total) and len(v) == res.total


def _finite(x: float, digits: int) -> float | None:
    """A number for the JSON report: rounded, or None where it is not finite (no data left)."""
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


@dataclass(frozen=True)
class Grounds:
    """What decided a verdict, as codes and values; :func:`eagle3conv.verify.words.verdict_words`
    makes its sentences (``decided_by``, ``advice``) from them and the verdict's own fields.

    ``by``: the statistics that narrowed the set, in order; ``size``: its members (``unconfirmed``
    of them kept by the screen, not confirmed); ``standing``: ``training-record`` or ``config``
    where that wiring stands (``standing_in_line``: its norms match training); ``chosen``: the
    wiring the data points at (``chosen_ids`` its output ids); ``best``: the best by acceptance;
    ``config``: the config's (or given) wiring, ``config_gap`` the best's paired difference with
    it; ``neighbourhood``: one wiring separated, but the search was not global."""

    path: str
    target: str | None
    sequences: int  # of the main wiring, with full chains
    min_sequences: int = MIN_SEARCH_SEQUENCES
    log_step: int = LOG_SCORE_STEP
    leaders: int = SET_LEADERS
    by: tuple[str, ...] = ()
    size: int = 0
    unconfirmed: int = 0
    tied: int = 0
    standing: str | None = None
    standing_in_line: bool = False
    statistic: str | None = None
    chosen: str | None = None
    chosen_ids: tuple[int, ...] = ()
    best: str | None = None
    best_ids: tuple[int, ...] = ()
    config: str | None = None
    config_gap: tuple[float, float, float] | None = None
    config_names_layers: bool = True
    chosen_is_config: bool = False
    neighbourhood: bool = False
    capture: dict | None = None


@dataclass(frozen=True)
class PairedDifference:
    """The best by acceptance against one other confirmed wiring: the every-chain-start accept-length
    gap (best minus it), its paired 95% interval, and whether the set's bound excluded it."""

    wiring: str  # the candidate's name
    layers: str
    accept_length_gap: float
    ci95: tuple[float, float]
    excluded: bool

    def to_dict(self) -> dict:
        return {"wiring": self.wiring, "layers": self.layers, "accept_length_gap": self.accept_length_gap,
                "ci95": list(self.ci95), "excluded": self.excluded}

    @classmethod
    def from_dict(cls, d: dict) -> PairedDifference:
        return cls(d["wiring"], d["layers"], d["accept_length_gap"], tuple(d["ci95"]), bool(d["excluded"]))


@dataclass(frozen=True)
class SetMember:
    """One member of the verdict's confidence set: a confirmed wiring with its every-chain-start
    accept length and its gaps to the leaders (accept length, and the log score where consulted:
    each a (gap, low, high) triple), or a wiring the screen or refinement kept unconfirmed."""

    layers: str
    confirmed: bool
    wiring: str | None = None  # the candidate's name (confirmed members)
    accept_length_all_starts: float | None = None
    accept_length_gap: tuple[float, ...] | None = None
    log_score_gap: tuple[float | None, ...] | None = None

    def to_dict(self) -> dict:
        if not self.confirmed:
            return {"layers": self.layers, "confirmed": False}
        out: dict = {"wiring": self.wiring, "layers": self.layers, "confirmed": True,
                     "accept_length_all_starts": self.accept_length_all_starts}
        if self.accept_length_gap is not None:
            out["accept_length_gap"] = list(self.accept_length_gap)
        if self.log_score_gap is not None:
            out["log_score_gap"] = list(self.log_score_gap)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> SetMember:
        gap, log = d.get("accept_length_gap"), d.get("log_score_gap")
        return cls(d["layers"], bool(d.get("confirmed")), d.get("wiring"), d.get("accept_length_all_starts"),
                   None if gap is None else tuple(gap), None if log is None else tuple(log))


@dataclass(frozen=True)
class Verdict:
    """What the scores say about the wiring. ``status``: see the module docstring."""

    config_accept_length: float
    status: Status | None = None
    norm_flags: list[str] = field(default_factory=list)  # the config's slots whose norms are out of line
    config_is_best: bool | None = None
    paired_differences: tuple[PairedDifference, ...] = ()  # the leader vs every other wiring
    best: str | None = None  # the wiring named (None unless named or stands)
    best_layers: str | None = None
    best_accept_length: float | None = None
    tied: int | None = None  # wirings acceptance cannot separate from the leader (itself included)
    separated: bool | None = None
    runner_up: str | None = None
    coverage: Coverage | None = None  # what the search covered, None: no global search
    best_found: str | None = None  # the leader on acceptance, named or not
    tied_set: list[str] = field(default_factory=list)  # the wirings acceptance cannot separate (leader first)
    positions_to_separate: int | None = None  # estimated positions that would separate the leader from the rest
    config_worse: bool | None = None  # the config's wiring is clearly (paired interval) below the best found
    statistic: str | None = None  # what decided: acceptance | log-score | norm-fingerprint | training-record | config
    log_score: dict | None = None  # the log-score comparison, where acceptance left wirings tied
    confidence_set: tuple[SetMember, ...] = ()  # every wiring not excluded at 95% vs the best
    set_statistic: str | None = None  # the statistics that narrowed the set, in order
    to_separate: Separation | None = None  # what would separate the set (its reason, factor, sequences)
    positions: int | None = None  # the positions every confirmed wiring was scored on (coverage's summary)
    grounds: Grounds | None = None  # what decided, as values (the words are made from them)
    said: tuple[str | None, str | None] = (None, None)  # decided_by and advice of a report read back

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in STATUSES:
            raise ValueError(f"verdict status {self.status!r} is not one of {STATUSES}")

    @cached_property
    def _words(self) -> tuple[str | None, str | None]:
        """``decided_by`` and ``advice``, made once (the verdict is frozen)."""
        return verdict_words(self) if self.grounds is not None else self.said

    @property
    def decided_by(self) -> str | None:
        """For people: which evidence decided (:func:`eagle3conv.verify.words.verdict_words`; never parsed)."""
        return self._words[0]

    @property
    def advice(self) -> str | None:
        """For people: what to do (the command that writes the named wiring, when it is not the config's;
        what to capture to separate a set)."""
        return self._words[1]

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
        out["paired_differences"] = [p.to_dict() for p in self.paired_differences]
        out.update({
            "best": self.best, "best_layers": self.best_layers, "best_accept_length": self.best_accept_length,
            "decided_by": self.decided_by, "tied": self.tied, "separated": self.separated,
            "runner_up": self.runner_up, "config_is_best": self.config_is_best,
        })
        if self.advice is not None:
            out["advice"] = self.advice
        if self.coverage is not None:
            out["coverage"] = self.coverage.to_dict(coverage_summary(self))
        for key in ("best_found", "positions_to_separate", "config_worse", "statistic", "log_score",
                    "set_statistic"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.to_separate is not None:
            out["to_separate"] = self.to_separate.to_dict()
        if self.tied_set:
            out["tied_set"] = list(self.tied_set)
        if self.confidence_set:
            out["confidence_set"] = [m.to_dict() for m in self.confidence_set]
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Verdict:
        """The inverse of :meth:`to_dict` (unknown keys are ignored)."""
        names = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in names}
        kw["norm_flags"] = list(kw.get("norm_flags") or [])
        kw["paired_differences"] = tuple(PairedDifference.from_dict(p) for p in kw.get("paired_differences") or ())
        kw["tied_set"] = list(kw.get("tied_set") or [])
        kw["confidence_set"] = tuple(SetMember.from_dict(m) for m in kw.get("confidence_set") or ())
        kw.pop("grounds", None)
        kw["said"] = (d.get("decided_by"), d.get("advice"))
        if kw.get("coverage") is not None:
            kw["coverage"] = Coverage.from_dict(kw["coverage"])
        if kw.get("to_separate") is not None:
            kw["to_separate"] = Separation.from_dict(kw["to_separate"])
        return cls(**kw)


def log_score_exclusions(scores: list[Score], tied: list[int], log_score
                         ) -> tuple[int, dict[int, tuple[float, float, float]], dict, list[int], dict]:
    """Among ``tied`` (wirings acceptance cannot exclude), the leader on the step-1 log score,
    its paired difference (difference, 95% low, high) with every wiring acceptance does not
    separate it from (bootstrap, for the report), the bound's figures (difference, standard
    error, sequences), and which of those the log score excludes (one-sided at
    ``SET_ALPHA / 2`` shared by those comparisons) -- never one whose acceptance is clearly
    above the leader's: a clear acceptance difference is never overridden. Returns (leader,
    differences, bounds, excluded, the comparison for the verdict). ``log_score(indices)``: their
    :class:`~eagle3conv.verify.logscore.LogScore`."""
    k = LOG_SCORE_STEP
    got = dict(zip(tied, log_score(list(tied))))
    lead = max(tied, key=lambda i: got[i].mean(k))
    acc = {}
    for j in range(len(scores)):
        if j != lead:
            d, se, n = paired_ratio_bound(scores[j].chain_accepted, scores[j].chains, scores[lead].chain_accepted,
                                          scores[lead].chains)
            acc[j] = (excluded_at(d, se, n, SET_ALPHA / 2, len(scores) - 1),  # j clearly above the leader
                      excluded_at(-d, se, n, SET_ALPHA / 2, len(scores) - 1))  # the leader clearly above j
    above = [j for j, (up, _) in acc.items() if up]
    close = [j for j, (up, down) in acc.items() if not up and not down]
    missing = [j for j in close if j not in got]
    got.update(zip(missing, log_score(missing)))
    diffs: dict[int, tuple[float, float, float]] = {}
    bounds: dict[int, tuple[float, float, int]] = {}
    rows, excluded = [], []
    for j in close:
        diffs[j] = paired_mean_difference(got[lead].logp[k], got[lead].counted[k], got[j].logp[k],
                                          got[j].counted[k])
        d, se, n = bounds[j] = paired_ratio_bound(got[lead].logp[k], got[lead].counted[k], got[j].logp[k],
                                                  got[j].counted[k])
        out_ = excluded_at(d, se, n, SET_ALPHA / 2, len(close))
        if out_:
            excluded.append(j)
        d0, lo, hi = diffs[j]
        rows.append({"wiring": scores[j].candidate.name, "layers": describe(scores[j].candidate.layers),
                     "log_score_gap": _finite(d0, 5), "ci95": [_finite(lo, 5), _finite(hi, 5)],
                     "excluded": out_})
    rows.sort(key=lambda r: (r["log_score_gap"] is None, r["log_score_gap"] or 0.0))
    out = {"statistic": f"mean log-probability (nats) the drafter gives the target's token at draft step {k + 1}, "
                        "on the positions whose token is in the draft vocabulary; paired over sequences (ci95: "
                        "bootstrap; excluded: one-sided bound shared by the comparisons, docs/facts.md §12)",
           "leader": describe(scores[lead].candidate.layers), "leader_mean": round(got[lead].mean(k), 5),
           "positions": sum(got[lead].counted[k]),
           "separated": bool(rows) and not above and len(excluded) == len(close),
           "differences": rows}
    if above:
        out["acceptance_above"] = [describe(scores[j].candidate.layers) for j in above]
    return lead, diffs, bounds, excluded, out


def _separation(members: list[int], lead: int, acc: dict, logs: dict, comparisons: int) -> float | None:
    """How many times the data at hand would separate ``lead`` from every other member at the
    gaps and variance seen: per member, the fewer of what acceptance and the log score need
    ((q * standard error / gap) squared, q the set's one-sided quantile for ``comparisons``);
    None where some member shows no gap to ``lead`` in either."""
    need = []
    for j in members:
        if j == lead:
            continue
        best = math.inf
        for d, se, n in [x[:3] for x in (acc.get(j), logs.get(j)) if x is not None]:
            if d > 0 and n >= 2 and math.isfinite(se):
                q = t_quantile(1.0 - SET_ALPHA / 2 / max(1, comparisons), n - 1)
                best = min(best, (q * se / d) ** 2)
        need.append(best)
    if not need or not all(math.isfinite(x) for x in need):
        return None
    return max(1.0, max(need))


def decide(scores: list[Score], comparisons: Sequence[list[dict] | None], search: bool, path,
           target: str | None, *, coverage: Coverage | None = None, config_names_layers: bool = True,
           log_score=None, capture: dict | None = None, log_dtype: str | None = None) -> Verdict:
    """The verdict on ``scores`` (``scores[0]``: the config's or the given wiring;
    ``comparisons[i]``: :func:`norm_comparison` of ``scores[i]``, or None).

    The verdict is a confidence set: the wirings not excluded at 95% against the best,
    paired over sequences -- first by acceptance (every-chain-start accept length); in a
    global search, then by the step-1 log score among what acceptance leaves (never
    against a clear acceptance difference); then by the norm fingerprint (a member whose
    norms are out of line with training, where another member's are in line); plus the
    wirings the screen kept but verify did not confirm (``coverage.unconfirmed``).
    One wiring is named only when the set has one member (``named``), or when the
    training record's or the config's wiring is in it (``stands``); else the set is
    reported (``ambiguous``) with what would separate it.

    ``path`` and ``target`` go into the advice's commands. ``coverage``: what
    :func:`global_search` screened (None: only the wirings scored); a wiring is named only
    when the search covered every layer of the target. ``config_names_layers``: False when
    config.json names no aux layers (``scores[0]`` is then the engines' default, which
    never "stands" on its own). ``log_score(indices)``: the
    :class:`~eagle3conv.verify.logscore.LogScore` of those scores (computed only where
    acceptance leaves a global search's leaders tied). ``capture``: how the states were
    captured (``generate_tokens``, ``prompts``), for the advice on what to capture.
    ``log_dtype``: the dtype the log score was computed in (the screen's), for the report."""
    main = scores[0]
    kw: dict = {"config_accept_length": round(main.accept_length, 4), "coverage": coverage}  # the frozen Verdict's fields
    flagged = [c for c in (comparisons[0] or []) if c["flagged"]]
    kw["norm_flags"] = norm_flag_words(flagged)
    if not search or len(scores) < 2:
        return Verdict(**kw)
    if main.effective_sequences < MIN_SEARCH_SEQUENCES:
        kw["status"] = "undecided"
        kw["grounds"] = Grounds(str(path), target, main.effective_sequences)
        return Verdict(**kw)
    complete = bool(coverage is not None and coverage.is_global)
    names = [describe(s.candidate.layers) for s in scores]
    # acceptance: every-chain-start accept length, the same positions for every wiring
    tied, diffs, acc_bounds = acceptance_set(scores)
    ranked = [tied[0]] + sorted(diffs, key=lambda i: -scores[i].accept_length_all)
    best, second = scores[ranked[0]], scores[ranked[1]]
    kw["positions"] = main.tokens
    kw["paired_differences"] = tuple(
        PairedDifference(scores[i].candidate.name, names[i], round(d, 4), (round(lo, 4), round(hi, 4)),
                         acc_bounds[i][3]) for i, (d, lo, hi) in diffs.items())
    kw["best_found"] = names[ranked[0]]
    if 0 in acc_bounds and acc_bounds[0][3]:
        kw["config_worse"] = True
    elif ranked[0] != 0 or 0 in tied:
        kw["config_worse"] = False
    kw["tied"], kw["separated"] = len(tied), len(tied) == 1
    if len(tied) > 1:
        kw["tied_set"] = [names[i] for i in tied]

    # the confidence set, narrowed statistic by statistic
    members, by = list(tied), ["acceptance"]
    lead = ranked[0]
    log_diffs: dict = {}
    log_bounds: dict = {}
    lead_ls = None
    if complete and log_score is not None and len(members) > 1:
        lead_ls, log_diffs, log_bounds, gone, kw["log_score"] = log_score_exclusions(scores, members, log_score)
        if log_dtype is not None:
            kw["log_score"]["dtype"] = log_dtype
        by.append("log-score")  # consulted, whether or not it excluded any
        if gone:
            members, lead = [i for i in members if i not in gone], lead_ls

    def in_line(i: int) -> bool | None:
        cmp = comparisons[i]
        return None if cmp is None else not any(c["flagged"] for c in cmp)

    def clearly_in_line(i: int) -> bool:
        cmp = comparisons[i]
        return bool(cmp) and all(c["ratio"] and 0.8 <= c["ratio"] <= 1.25 for c in cmp)

    # The norm fingerprint tells an embedding output from a deep layer, not layer 13 from 14
    # (adjacent layers' norms differ by less than two datasets' medians do): it only drops a
    # member whose norms are out of line with training while another member's are clearly in line.
    off = [i for i in members if in_line(i) is False]
    if complete and off and len(members) > 1 and any(clearly_in_line(i) for i in members if i not in off):
        members = [i for i in members if i not in off]
        by.append("norm-fingerprint")
        if lead not in members:
            lead = max(members, key=lambda i: scores[i].accept_length_all)
    # the screen's survivors not confirmed stay in the set, global search or not (never dropped unexcluded)
    unconfirmed = list(coverage.unconfirmed) if coverage is not None else []
    n_unconfirmed = coverage.unconfirmed_count if coverage is not None else 0
    capped = coverage is not None and coverage.capped
    anchors = [i for i in members if scores[i].candidate.record] + (
        [0] if 0 in members and config_names_layers else [])
    anchor = next((i for i in anchors if in_line(i) is not False), None)
    how = statistic_words(by, LOG_SCORE_STEP)
    kw["set_statistic"] = how
    kw["confidence_set"] = tuple(
        SetMember(names[i], True, scores[i].candidate.name, round(scores[i].accept_length_all, 4),
                  tuple(round(x, 4) for x in diffs[i]) if i in diffs else None,
                  tuple(_finite(x, 5) for x in log_diffs[i]) if i in log_diffs else None)
        for i in members) + tuple(SetMember(u, False) for u in unconfirmed)
    size = len(members) + n_unconfirmed
    chosen, status, statistic, standing = lead, "ambiguous", None, None
    if anchor is not None:
        chosen, status = anchor, "stands"
        statistic = standing = "training-record" if scores[anchor].candidate.record else "config"
    elif size == 1:
        status, statistic = "named", by[-1]
    # what would separate the set: from the log-score leader where the log score was consulted (it is
    # the finer statistic), else from the best by acceptance
    sep_lead = lead_ls if log_bounds and lead_ls in members else ranked[0]
    sep_acc = acc_bounds if sep_lead == ranked[0] else {
        j: paired_ratio_bound(scores[sep_lead].chain_accepted, scores[sep_lead].chains, scores[j].chain_accepted,
                              scores[j].chains) for j in members if j != sep_lead}
    factor = _separation(members, sep_lead, sep_acc, log_bounds if sep_lead == lead_ls else {},
                         len(scores) - 1)
    if size > 1:
        if factor is not None and not n_unconfirmed:
            seqs = main.effective_sequences
            kw["positions_to_separate"] = int(math.ceil(main.tokens * factor))
            kw["to_separate"] = Separation(size, SeparationReason.FACTOR, seqs, how, factor=round(factor, 2),
                                         positions=kw["positions_to_separate"],
                                         sequences=int(math.ceil(seqs * factor)))
        else:
            kw["to_separate"] = Separation(size, SeparationReason.CAPPED if capped and n_unconfirmed else
                                         SeparationReason.UNCONFIRMED if n_unconfirmed else SeparationReason.NO_GAP,
                                         main.effective_sequences, how)
    neighbourhood = status == "named" and not complete
    if neighbourhood:
        status = "ambiguous"
    win = scores[chosen]
    kw["status"], kw["statistic"] = status, statistic if status != "ambiguous" else None
    kw["best"], kw["best_layers"] = win.candidate.name, names[chosen]
    kw["best_accept_length"] = round(win.accept_length, 4)
    kw["runner_up"] = second.candidate.name if chosen == ranked[0] else best.candidate.name
    kw["config_is_best"] = win is main
    if status == "ambiguous":
        kw["best"] = kw["best_layers"] = None
    kw["grounds"] = Grounds(
        str(path), target, main.effective_sequences, by=tuple(by), size=size, unconfirmed=n_unconfirmed,
        tied=len(tied), standing=standing, standing_in_line=bool(anchor is not None and in_line(anchor)),
        statistic=statistic, chosen=names[chosen], chosen_ids=tuple(to_ids(win.candidate.layers, "output")),
        best=names[ranked[0]], best_ids=tuple(to_ids(best.candidate.layers, "output")), config=names[0],
        config_gap=diffs.get(0), config_names_layers=config_names_layers, chosen_is_config=win is main,
        neighbourhood=neighbourhood, capture=capture)
    return Verdict(**kw)


__all__ = [
    "Coverage", "LISTED", "LOG_SCORE_STEP", "MAX_CONFIRM", "MIN_SEARCH_SEQUENCES", "NORM_FLAG_RATIO", "REFINE_CONFIRM",
    "GPU_SCREEN_SECONDS", "PairedDifference", "REFINE_OPEN", "REFINE_ROUNDS", "SET_ALPHA", "SET_LEADERS", "ScreenSearch",
    "Separation", "SeparationReason", "SetMember", "screen_bound",
    "SCREEN_BOUND", "STATUSES", "Status", "Verdict", "Grounds", "acceptance_set", "all_wirings", "candidates", "config_candidate",
    "decide", "global_search", "log_score_exclusions", "names_layers", "neighbours",
    "norm_comparison", "norm_mismatch", "refine", "screen_dtype", "screen_ranking", "screen_record", "set_members",
]
