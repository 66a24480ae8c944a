"""The verify report: :class:`VerifyResult` (in memory) and :class:`VerifyReport` (the file contract).

``verify`` saves ``eagle3conv-verify.json`` (:data:`REPORT_FILE`) in the
checkpoint folder; ``push`` uploads it and the model card
(:mod:`eagle3conv.hub.card`) shows its figures. Both sides go through
:class:`VerifyReport`: the writer with :meth:`VerifyReport.save`, the card with
:meth:`VerifyReport.load`, which refuses a file that is not a verify report
eagle3conv can read (another format, another version, a field missing or of the
wrong type) with a message naming the file and the field. The card never
guesses key names and never recomputes a figure.

The document (a JSON object; version 1)::

    format                 "eagle3conv-verify"
    version                1 (a reader refuses other versions)
    checkpoint             the checkpoint folder's name (no local paths: the report is pushed)
    states                 what was scored: path (a name), source, sequences, tokens, target, notes…
    device, dtype, steps   where and how it ran; steps = draft steps per chain
    reference              "target": drafts compared with the target's greedy next tokens;
                           "data": with the data's next tokens (states without target predictions)
    statistic              the same, in words
    wiring, acceptance_per_position, acceptance_ci95, accept_length, accept_length_ci95
                           the scored wiring's figures (= results[0])
    min_accept, passed     the --min-accept threshold on step-1 acceptance, and its outcome
    results                one object per scored wiring, the config's (or --layers') first:
                           layers [{"output_of": i}], described, why, acceptance_per_position,
                           acceptance_ci95, conditional_acceptance, accept_length (greedy chain
                           decoding replayed: tokens per target forward), accept_length_ci95,
                           rounds, accept_length_all_starts(_ci95), positions_scored, chains,
                           sequences, ci_method, norms, norm_comparison, seconds
    verdict                :class:`eagle3conv.verify.search.Verdict` (``status`` decides, never the text)
    per_category           optional (states whose sequences carry a category): per category,
                           sequences, positions_scored, rounds, acceptance_per_position,
                           acceptance_ci95, accept_length, accept_length_ci95, ci_method and
                           the profile's chain rates (:mod:`eagle3conv.verify.profile`), for
                           the main wiring
    wiring_check, seconds, saved, save_error, profile (where speculation_profile.json was written)

Intervals are 95% ``[low, high]``; acceptance is a fraction (0..1).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from eagle3conv.errors import CheckpointReadError
from eagle3conv.spec.drafter import NORM_BEFORE_RESIDUAL
from eagle3conv.spec.engines import Run
from eagle3conv.spec.variants import switches
from eagle3conv.verify.evaluate import Score
from eagle3conv.verify.profile import category_figures
from eagle3conv.verify.search import Verdict

if TYPE_CHECKING:
    from eagle3conv.wiring.apply import Wiring

REPORT_FILE = "eagle3conv-verify.json"
REPORT_FORMAT = "eagle3conv-verify"
REPORT_VERSION = 1
REFERENCES = ("target", "data")
Reference = Literal["target", "data"]


# --------------------------------------------------------------------------- the file contract


@dataclass(frozen=True)
class WiringFigures:
    """One scored wiring's figures, exactly as the report states them."""

    name: str
    layers: tuple[int, ...]  # output-of-layer ids, slot order (-1: the embedding output)
    described: str
    acceptance: tuple[float, ...]  # per draft position
    acceptance_ci95: tuple[tuple[float, float], ...]
    accept_length: float  # tokens per target forward of greedy chain decoding (replayed)
    accept_length_ci95: tuple[float, float]
    positions_scored: int
    sequences: int
    rounds: int
    # shown by verify's text (None: not stated; a report the card reads need not state them)
    why: str | None = None  # why this wiring was scored
    accept_length_all_starts: float | None = None  # over every chain start (the figure wirings are ranked by)
    accept_length_all_starts_ci95: tuple[float, float] | None = None
    chains: int | None = None
    ci_method: str | None = None


@dataclass(frozen=True)
class CategoryFigures:
    """One prompt category's figures (the main wiring), exactly as the report states them."""

    name: str
    sequences: int
    positions_scored: int
    acceptance: tuple[float, ...]
    acceptance_ci95: tuple[tuple[float, float], ...]
    accept_length: float
    accept_length_ci95: tuple[float, float]


@dataclass(frozen=True)
class VerifyReport:
    """A verify report document, validated. ``document`` is the JSON object itself;
    the other fields are typed views of it."""

    document: dict
    results: tuple[WiringFigures, ...]
    steps: int
    statistic: str
    reference: Reference | None  # None: written before the field existed
    passed: bool
    min_accept: float | None
    sequences: int | None  # of the states
    tokens: int | None  # real tokens in the states
    verdict: Verdict
    per_category: tuple[CategoryFigures, ...] | None = None  # None: the states named no categories

    @property
    def main(self) -> WiringFigures:
        """The wiring verify was asked to score (the config's, or ``--layers``)."""
        return self.results[0]

    def figures_for(self, layers: Sequence[int] | None) -> WiringFigures | None:
        """The figures measured with ``layers`` (output-of ids): the main result when it
        matches, else a wiring search's entry; None when the report scored no such wiring.
        ``layers`` None: the main result."""
        if layers is None:
            return self.main
        want = tuple(int(i) for i in layers)
        return next((r for r in self.results if r.layers == want), None)

    # -- (de)serialisation
    def to_dict(self) -> dict:
        return json.loads(json.dumps(self.document))

    def to_json(self) -> str:
        return json.dumps(self.document, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = REPORT_FILE) -> VerifyReport:
        try:
            obj = json.loads(text)
        except ValueError as err:
            raise CheckpointReadError(f"{source}: not valid JSON ({err})", hint=_RERUN) from None
        return cls.from_dict(obj, source)

    @classmethod
    def from_dict(cls, obj: Any, source: str = REPORT_FILE) -> VerifyReport:
        """Validate a report document; :class:`CheckpointReadError` names the field that is wrong."""
        if not isinstance(obj, dict):
            raise CheckpointReadError(f"{source}: not a verify report (a JSON {type(obj).__name__}, not an object)",
                                      hint=_RERUN)
        if obj.get("format") != REPORT_FORMAT:
            raise CheckpointReadError(f"{source}: not an eagle3conv verify report (its 'format' is "
                                      f"{obj.get('format')!r}, not {REPORT_FORMAT!r})", hint=_RERUN)
        version = obj.get("version")
        if version != REPORT_VERSION or isinstance(version, bool):
            raise CheckpointReadError(f"{source}: report version {version!r}; this eagle3conv reads version "
                                      f"{REPORT_VERSION}", hint="upgrade eagle3conv, or " + _RERUN)
        f = _Fields(source)
        results = f.get(obj, "results", list)
        if not results:
            raise CheckpointReadError(f"{source}: 'results' is empty: no wiring was scored", hint=_RERUN)
        states = f.get(obj, "states", dict)
        reference = obj.get("reference")
        if reference is not None and reference not in REFERENCES:
            raise CheckpointReadError(f"{source}: 'reference' is {reference!r}, not one of {REFERENCES}",
                                      hint=_RERUN)
        verdict = f.get(obj, "verdict", dict)
        status = verdict.get("status")
        try:
            parsed_verdict = Verdict.from_dict(verdict)
        except (TypeError, ValueError) as err:
            raise CheckpointReadError(f"{source}: 'verdict' is malformed ({err}; status {status!r})",
                                      hint=_RERUN) from None
        return cls(
            document=obj,
            results=tuple(f.figures(r, i) for i, r in enumerate(results)),
            steps=f.get(obj, "steps", int),
            statistic=f.get(obj, "statistic", str),
            reference=reference,
            passed=f.get(obj, "passed", bool),
            min_accept=f.number(obj, "min_accept", optional=True),
            sequences=f.get(states, "sequences", int, optional=True, where="states."),
            tokens=f.get(states, "tokens", int, optional=True, where="states."),
            verdict=parsed_verdict,
            per_category=f.categories(obj.get("per_category")),
        )

    # -- files
    @classmethod
    def load(cls, path: str | os.PathLike) -> VerifyReport:
        """Read ``path`` (a report file, or a folder holding :data:`REPORT_FILE`)."""
        p = Path(path)
        if p.is_dir():
            p = p / REPORT_FILE
        from eagle3conv.io.jsonfile import MAX_JSON_BYTES, read_small_file

        if not os.path.lexists(p):
            raise CheckpointReadError(f"{p}: no verify report there", hint=_RERUN)
        try:  # a regular file, bounded, read once
            text = read_small_file(p, "verify report", MAX_JSON_BYTES).decode("utf-8")
        except UnicodeDecodeError:
            raise CheckpointReadError(f"{p}: cannot read: not UTF-8 text") from None
        return cls.from_json(text, p.name)

    def save(self, folder: str | os.PathLike, *, local_paths: Sequence[str] = ()) -> Path:
        """Write :data:`REPORT_FILE` into ``folder`` atomically; every string of
        ``local_paths`` in the text is replaced by the folder's name (a pushed report
        carries no local paths). Raises OSError when the folder cannot be written."""
        from eagle3conv.io.files import atomic_write_text

        root = Path(folder)
        text = self.to_json()
        for local in set(local_paths) - {"", "."}:
            text = text.replace(json.dumps(local)[1:-1], root.name)
        return atomic_write_text(root / REPORT_FILE, text, durable=False)


_RERUN = "run eagle3conv verify CKPT --states STATES again to write a report this eagle3conv reads"


class _Fields:
    """Typed field reads that raise :class:`CheckpointReadError` naming ``source`` and the field."""

    def __init__(self, source: str):
        self.source = source

    def _bad(self, where: str, key: str, want: str, got: Any) -> CheckpointReadError:
        return CheckpointReadError(f"{self.source}: '{where}{key}' must be {want}, it is {got!r}"[:400],
                                   hint=_RERUN)

    def get(self, obj: dict, key: str, kind: type, *, optional: bool = False, where: str = "") -> Any:
        v = obj.get(key)
        if v is None and optional:
            return None
        ok = isinstance(v, kind) and (kind is bool or not isinstance(v, bool))
        if not ok:
            raise self._bad(where, key, f"a JSON {_KIND_NAMES[kind]}", v)
        return v

    def number(self, obj: dict, key: str, *, optional: bool = False, where: str = "") -> float | None:
        v = obj.get(key)
        if v is None and optional:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self._bad(where, key, "a finite number", v)
        return float(v)

    def numbers(self, obj: dict, key: str, *, where: str = "", fraction: bool = False) -> tuple[float, ...]:
        v = obj.get(key)
        if not isinstance(v, list):
            raise self._bad(where, key, "a list of numbers", v)
        out = tuple(self.number({key: x}, key, where=where) for x in v)
        if fraction and not all(0.0 <= x <= 1.0 for x in out):
            raise self._bad(where, key, "fractions between 0 and 1", v)
        return out

    def loose(self, obj: dict, key: str, *, where: str = "", pair: bool = False, kind: type | None = None) -> Any:
        """A value only the text shows, as it is (a number; with ``pair`` two; with ``kind`` str or int,
        one of those), or None when the field is absent or null: a report is never refused for it."""
        v = obj.get(key)
        if v is None:
            return None
        if kind is not None:
            if isinstance(v, bool) or not isinstance(v, kind):
                raise self._bad(where, key, f"a JSON {_KIND_NAMES[kind]} or null", v)
            return v
        if pair:
            ok = isinstance(v, list) and len(v) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                             for x in v)
            if not ok:
                raise self._bad(where, key, "two numbers [low, high]", v)
            return (float(v[0]), float(v[1]))
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self._bad(where, key, "a number", v)
        return float(v)

    def interval(self, obj: dict, key: str, *, where: str = "") -> tuple[float, float]:
        v = self.numbers(obj, key, where=where)
        if len(v) != 2 or v[0] > v[1]:
            raise self._bad(where, key, "an interval [low, high]", obj.get(key))
        return (v[0], v[1])

    def figures(self, r: Any, i: int) -> WiringFigures:
        where = f"results[{i}]."
        if not isinstance(r, dict):
            raise self._bad("", f"results[{i}]", "an object", r)
        layers = self.get(r, "layers", list, where=where)
        ids = []
        for x in layers:
            o = x.get("output_of") if isinstance(x, dict) else None
            if isinstance(o, bool) or not isinstance(o, int) or o < -1:
                raise self._bad(where, "layers", 'a list of {"output_of": id >= -1}', layers)
            ids.append(o)
        acceptance = self.numbers(r, "acceptance_per_position", where=where, fraction=True)
        cis = r.get("acceptance_ci95")
        if not isinstance(cis, list) or len(cis) != len(acceptance):
            raise self._bad(where, "acceptance_ci95", f"{len(acceptance)} intervals, one per position", cis)
        return WiringFigures(
            name=self.get(r, "wiring", str, where=where),
            layers=tuple(ids),
            described=self.get(r, "described", str, where=where),
            acceptance=acceptance,
            acceptance_ci95=tuple(self.interval({"acceptance_ci95": c}, "acceptance_ci95", where=where)
                                  for c in cis),
            accept_length=self.number(r, "accept_length", where=where),
            accept_length_ci95=self.interval(r, "accept_length_ci95", where=where),
            positions_scored=self.get(r, "positions_scored", int, where=where),
            sequences=self.get(r, "sequences", int, where=where),
            rounds=self.get(r, "rounds", int, where=where),
            # what only the text shows: optional (None: not stated), and not judged (the card never reads them)
            why=self.loose(r, "why", where=where, kind=str),
            accept_length_all_starts=self.loose(r, "accept_length_all_starts", where=where),
            accept_length_all_starts_ci95=self.loose(r, "accept_length_all_starts_ci95", where=where, pair=True),
            chains=self.loose(r, "chains", where=where, kind=int),
            ci_method=self.loose(r, "ci_method", where=where, kind=str),
        )


    def categories(self, per: Any) -> tuple[CategoryFigures, ...] | None:
        if per is None:
            return None
        if not isinstance(per, dict):
            raise self._bad("", "per_category", "an object (category -> figures)", per)
        out = []
        for name, c in per.items():
            where = f"per_category.{name}."
            if not isinstance(c, dict):
                raise self._bad("per_category.", name, "an object", c)
            acceptance = self.numbers(c, "acceptance_per_position", where=where, fraction=True)
            cis = c.get("acceptance_ci95")
            if not isinstance(cis, list) or len(cis) != len(acceptance):
                raise self._bad(where, "acceptance_ci95", f"{len(acceptance)} intervals, one per position", cis)
            out.append(CategoryFigures(
                name=name, sequences=self.get(c, "sequences", int, where=where),
                positions_scored=self.get(c, "positions_scored", int, where=where), acceptance=acceptance,
                acceptance_ci95=tuple(self.interval({"acceptance_ci95": x}, "acceptance_ci95", where=where)
                                      for x in cis),
                accept_length=self.number(c, "accept_length", where=where),
                accept_length_ci95=self.interval(c, "accept_length_ci95", where=where)))
        return tuple(out)


_KIND_NAMES = {list: "list", dict: "object", int: "integer", str: "string", bool: "true/false"}


# --------------------------------------------------------------------------- the result in memory


@dataclass(frozen=True)
class ScoredStates:
    """What was scored (:attr:`VerifyResult.states`, the report's ``states``), as the text reads it:
    :meth:`of` reads each field by its name, so a field renamed where the summary is made fails here."""

    path: str  # the file's name (the report carries no local paths)
    source: str
    sequences: int
    tokens: int
    target: str | None
    layers_from: str | None  # what the slots' layers rest on (None: the states do not record them)
    wiring_checked: bool  # False: the slots were labelled with the wiring scored, so nothing checks it
    notes: tuple[str, ...]  # the states' own notes
    verify_notes: tuple[str, ...]  # verify's notes on them

    @classmethod
    def of(cls, states: dict) -> ScoredStates:
        return cls(path=Path(str(states["path"])).name, source=states["source"], sequences=states["sequences"],
                   tokens=states["tokens"], target=states["target"], layers_from=states["layers_from"],
                   wiring_checked=states["wiring_checked"], notes=tuple(states["notes"]),
                   verify_notes=tuple(states["verify_notes"]))


@dataclass(frozen=True)
class Timings:
    """:attr:`VerifyResult.seconds` as the text reads it (wall-clock seconds from the start)."""

    first_result: float
    total: float

    @classmethod
    def of(cls, seconds: dict) -> Timings:
        return cls(first_result=seconds["first_result"], total=seconds["total"])


@dataclass(frozen=True)
class SlotNorms:
    """One aux slot's per-token L2 norms of the inference states (a :class:`~eagle3conv.verify.evaluate.Score`'s
    ``norms`` entry; None: no token to measure)."""

    median: float | None
    p10: float | None
    p90: float | None

    @classmethod
    def of(cls, norms: dict) -> SlotNorms:
        return cls(median=norms["median"], p10=norms["p10"], p90=norms["p90"])


@dataclass(frozen=True)
class NormComparison:
    """One slot's inference median beside training's (a :attr:`VerifyResult.comparisons` entry, made by
    :func:`eagle3conv.verify.search.norm_comparison`)."""

    slot: int
    inference_median: float | None
    training_median: float | None
    ratio: float | None
    flagged: bool

    @classmethod
    def of(cls, c: dict) -> NormComparison:
        return cls(slot=c["slot"], inference_median=c["inference_median"], training_median=c["training_median"],
                   ratio=c["ratio"], flagged=c["flagged"])


@dataclass(frozen=True)
class QuantizationCost:
    """A quantized drafter against its bf16 reference (:attr:`VerifyResult.quantization`): accept length
    over every chain start of each, the difference and its paired 95% interval (None: not finite)."""

    reference: str
    accept_length: float
    reference_accept_length: float
    difference: float
    ci95: tuple[float, float] | None

    @classmethod
    def of(cls, q: dict) -> QuantizationCost:
        ci = q["ci95"]
        return cls(reference=q["reference"], accept_length=q["accept_length"],
                   reference_accept_length=q["reference_accept_length"], difference=q["difference"],
                   ci95=None if ci is None else (ci[0], ci[1]))


def _forward(r: Run) -> dict:
    """A Run as the report shows it (``without`` in the variant table's order)."""
    return {"rope": None if r.rope_interleave is None else ("interleaved" if r.rope_interleave else "half-split (neox)"),
            NORM_BEFORE_RESIDUAL.name: r.norm_before_residual,  # the report's field is the switch's name
            "embedding": "drafter's own" if r.own_embedding == "always" else "target's",
            "head": "target's" if r.target_head else "drafter's own",
            "later_layer_norm": r.later_layer_norm,
            "without": [s.name for s in switches() if s.skippable and s.name in r.without],
            "parallel_mask_token": r.parallel_mask_token, "why": r.why, "source": r.source}


@dataclass(frozen=True)
class EngineScore:
    """One engine release's serving emulation: the layers its row says it captures, run the way
    that release runs the drafter (``run``: RoPE layout, norm_before_residual, whose embedding and
    head: docs/facts.md §9). ``score`` is None when it could not be scored (``not_scored`` says why);
    ``emulated``: the release's differences from config.json that were run (the run's
    ``not_emulated`` and ``not_read``: those captured states cannot show, those the rules do not record);
    ``paired_vs_main``: its accept length minus verify's main score's, with the paired 95%
    interval."""

    engine: str  # the release as --engine spells it
    release: str  # as reports name it
    run: Run | None  # how the release runs the drafter (None: not known)
    emulated: tuple[str, ...] = ()
    score: Score | None = None
    not_scored: str | None = None
    paired_vs_main: dict | None = None

    @property
    def accept_length(self) -> float | None:
        """The accept length as reported (4 decimals); None: not scored."""
        return None if self.score is None else round(self.score.accept_length, 4)

    @property
    def acceptance(self) -> tuple[float, ...] | None:
        """The acceptance per draft position as reported (4 decimals); None: not scored."""
        return None if self.score is None else tuple(round(a, 4) for a in self.score.acceptance)

    @property
    def not_emulated(self) -> tuple[str, ...]:
        return tuple(self.run.not_emulated) if self.run else ()

    @property
    def not_read(self) -> tuple[str, ...]:
        return tuple(self.run.not_read) if self.run else ()

    def to_dict(self) -> dict:
        r = self.run
        out: dict = {"engine": self.engine, "release": self.release, "forward": None if r is None else _forward(r),
                     "emulated": list(self.emulated), "not_emulated": list(self.not_emulated),
                     "not_read": list(self.not_read)}
        if self.score is None:
            out["not_scored"] = self.not_scored
            return out
        out.update({"accept_length": self.accept_length, "acceptance": list(self.acceptance),
                    "accept_length_ci95": [round(x, 4) for x in self.score.accept_length_ci],
                    "paired_vs_main": self.paired_vs_main})
        return out


@dataclass
class VerifyResult:
    """What :func:`eagle3conv.verify.verify` returns: the scores themselves, and
    :meth:`to_dict` / :meth:`report`, the document the report file holds."""

    checkpoint: Path
    states: dict
    device: str
    dtype: str
    steps: int
    wiring: Wiring  # the wiring check of the drafter as it is (wiring.apply.Wiring)
    scores: list[Score]
    comparisons: list[list[dict] | None]
    verdict: Verdict
    training_norms: dict | None
    seconds: dict
    min_accept: float | None
    saved: Path | None = None
    save_error: str | None = None
    reference: Reference = "target"  # what drafts were compared with: the target's or the data's next tokens
    engine_scores: list[EngineScore] = field(default_factory=list)  # per engine release of the wiring check
    categories: tuple[str | None, ...] | None = None  # per sequence of the states (None: none recorded)
    profile: Path | None = None  # where speculation_profile.json was written
    quantization: dict | None = None  # a quantized drafter against --reference: the accept-length cost
    embedding_comparison: dict | None = None  # the drafter's embedding against the target's, where both were read

    @property
    def main(self) -> Score:
        return self.scores[0]

    @cached_property
    def per_category(self) -> dict[str, dict] | None:
        """The main wiring's figures per prompt category (the report's and the profile's, computed once)."""
        return category_figures(self.main, self.categories)

    @property
    def wiring_check(self) -> dict:
        """The report's ``wiring_check`` without its engine scores: the check's document, and the embedding
        comparison."""
        d = self.wiring.to_dict()
        if self.embedding_comparison is not None:
            d["embedding_comparison"] = self.embedding_comparison
        return d

    @property
    def wiring_check_ok(self) -> bool:
        return self.wiring.report.ok

    @property
    def scored_states(self) -> ScoredStates:
        return ScoredStates.of(self.states)

    @property
    def passed(self) -> bool:
        return self.min_accept is None or self.main.acceptance[0] >= self.min_accept

    def to_dict(self) -> dict:
        m = self.main.to_dict()
        return {
            "format": REPORT_FORMAT,
            "version": REPORT_VERSION,
            "checkpoint": self.checkpoint.name,  # no local paths: the report travels with pushes
            "states": dict(self.states, path=Path(str(self.states.get("path", ""))).name),
            "device": self.device,
            "dtype": self.dtype,
            "steps": self.steps,
            "wiring": m["described"],
            "acceptance_per_position": m["acceptance_per_position"],
            "acceptance_ci95": m["acceptance_ci95"],
            "accept_length": m["accept_length"],
            "accept_length_ci95": m["accept_length_ci95"],
            "min_accept": self.min_accept,
            "passed": self.passed,
            "reference": self.reference,
            "statistic": ("teacher-forced top-1 acceptance against the "
                          + ("data's next tokens (the states hold no target predictions)" if self.reference == "data"
                             else "target's greedy next tokens")
                          + "; norms: per-token L2, position 0 excluded"),
            "results": [dict(s.to_dict(), norm_comparison=c) for s, c in zip(self.scores, self.comparisons)],
            "verdict": self.verdict.to_dict(),
            "wiring_check": dict(self.wiring_check, engine_scores=[e.to_dict() for e in self.engine_scores]),
            "per_category": self.per_category,
            "seconds": self.seconds,
            "saved": None if self.saved is None else str(self.saved),
            "profile": None if self.profile is None else str(self.profile),
            "save_error": self.save_error,
            **({"quantization": self.quantization} if self.quantization is not None else {}),
        }

    def report(self) -> VerifyReport:
        """The report document, validated (what :meth:`VerifyReport.load` reads back)."""
        return VerifyReport.from_dict(self.to_dict())


__all__ = [
    "REFERENCES", "REPORT_FILE", "REPORT_FORMAT", "REPORT_VERSION", "CategoryFigures", "EngineScore", "NormComparison",
    "QuantizationCost", "Reference", "ScoredStates", "SlotNorms", "Timings", "VerifyReport", "VerifyResult",
    "WiringFigures",
]
