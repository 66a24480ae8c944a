"""The acceptance profile (``speculation_profile.json``) and the per-category figures.

``verify`` writes :data:`PROFILE_FILE` beside ``eagle3conv-verify.json``: Model
Optimizer's portable acceptance profile, schema "1.0" (docs/acceptance-profile.md
says where the schema comes from and what each field means). Its figures are the
main wiring's greedy replay (:func:`eagle3conv.verify.stats.replay_histogram`):
every round of greedy chain decoding emits ``L`` tokens, ``L`` = 1 .. K+1, and

* ``acceptance_length_histogram[L]`` counts those rounds;
* ``marginal_accept_rates[i]`` = P(L >= i + 2): the first i + 1 drafts all accepted;
* ``conditional_accept_rates[i]`` = marginal[i] / marginal[i - 1] (marginal[-1] = 1);
* ``mean_accept_length`` = tokens per round = 1 + sum(marginal), exactly, because all
  three come from the same rounds (``validation`` checks it, and that the marginals
  never increase, as the schema asks);
* ``mean_accept_length_per_request``: each sequence's tokens per round, averaged over
  sequences (a short sequence weighs as much as a long one).

What the schema does not carry, which layers the drafter read and whether that is
the wiring it was trained on, is under the extension key :data:`EXTENSION_KEY`.

Per category (prompts that carried a ``category``, kept in the states file): the
same figures on that category's sequences, with the main score's intervals
(bootstrap over sequences, Wilson with fewer than 5), by :func:`category_scores`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eagle3conv.verify.evaluate import Score

PROFILE_FILE = "speculation_profile.json"
SCHEMA_VERSION = "1.0"
EXTENSION_KEY = "x_eagle3conv"  # not in the schema: the wiring behind the figures (docs/acceptance-profile.md)
NO_CATEGORY = "(none)"  # sequences whose prompt named no category, when others did
CONSISTENCY_TOLERANCE = 0.02  # the schema's own tolerance on |1 + sum(marginal) - mean|


# --------------------------------------------------------------------------- per category


def category_scores(score: Score, categories: Sequence[str | None]) -> dict[str, Score]:
    """``score`` restricted to each category's sequences (``categories[i]`` is sequence i's;
    sequences beyond ``score``'s, e.g. left out by ``--max-sequences``, are not scored),
    each finished with the same intervals as the whole. Sequences without a category
    are grouped under :data:`NO_CATEGORY`. Sorted by name."""
    n = len(score.chains)
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(list(categories)[:n]):
        groups.setdefault(NO_CATEGORY if c is None else c, []).append(i)
    out = {}
    for name in sorted(groups):
        idx = groups[name]

        def pick(values: list) -> list:
            return [values[i] for i in idx] if values else []

        out[name] = Score(score.candidate, score.steps, [pick(m) for m in score.matched],
                          [pick(c) for c in score.counted], pick(score.chain_accepted), pick(score.chains),
                          [0] * score.steps, [0] * score.steps, [], pick(score.replay_accepted),
                          pick(score.replay_rounds), pick(score.replay_hist)).finish()
    return out


def category_figures(score: Score, categories: Sequence[str | None] | None) -> dict[str, dict] | None:
    """The report's ``per_category`` object: per category, its sequences and positions, the
    acceptance per draft position and the accept length with their 95% intervals, and the
    chain rates of the profile. None when the states record no categories."""
    if categories is None:
        return None
    out = {}
    for name, s in category_scores(score, categories).items():
        out[name] = {
            "sequences": len(s.chains),
            "positions_scored": s.tokens,
            "rounds": sum(s.replay_rounds),
            "acceptance_per_position": [round(a, 5) for a in s.acceptance],
            "acceptance_ci95": [[round(lo, 5), round(hi, 5)] for lo, hi in s.acceptance_ci],
            "accept_length": round(s.accept_length, 4),
            "accept_length_ci95": [round(x, 4) for x in s.accept_length_ci],
            "ci_method": s.ci_method,
            **chain_rates(s),
        }
    return out


# --------------------------------------------------------------------------- the schema's figures


def total_histogram(score: Score) -> list[int]:
    """Rounds by accept length 1 .. K+1, summed over the sequences."""
    total = [0] * (score.steps + 1)
    for h in score.replay_hist:
        for i, c in enumerate(h):
            total[i] += c
    return total


def chain_rates(score: Score) -> dict:
    """The schema's per-step figures of ``score``'s greedy replay (module docstring)."""
    hist = total_histogram(score)
    rounds = sum(hist)
    marginal = [sum(hist[i + 1:]) / rounds if rounds else 0.0 for i in range(score.steps)]
    conditional = []
    for i, m in enumerate(marginal):
        before = 1.0 if i == 0 else marginal[i - 1]
        conditional.append(m / before if before > 0 else 0.0)
    per_request = [a / r for a, r in zip(score.replay_accepted, score.replay_rounds) if r > 0]
    return {
        "conditional_accept_rates": [round(x, 6) for x in conditional],
        "marginal_accept_rates": [round(x, 6) for x in marginal],
        "mean_accept_length": round(score.accept_length, 6) if rounds else None,  # the replay's, as finish() sums it
        "mean_accept_length_per_request": round(sum(per_request) / len(per_request), 6) if per_request else None,
        "acceptance_length_histogram": {str(n + 1): c for n, c in enumerate(hist)},
    }


def validation(mean_accept_length: float | None, marginal: Sequence[float]) -> dict:
    """The schema's ``validation`` object: the mean against 1 + sum(marginal), and the
    marginals' monotonicity (each checked, never assumed)."""
    implied = 1.0 + sum(marginal)
    mean = implied if mean_accept_length is None else mean_accept_length
    delta = abs(implied - mean)
    violations = [{"position": i, "value": marginal[i], "previous": marginal[i - 1]}
                  for i in range(1, len(marginal)) if marginal[i] > marginal[i - 1] + 1e-9]
    return {
        "mean_consistency": {"implied_mean_accept_length": round(implied, 6),
                             "reported_mean_accept_length": round(mean, 6), "abs_delta": round(delta, 6),
                             "tolerance": CONSISTENCY_TOLERANCE, "passed": delta <= CONSISTENCY_TOLERANCE},
        "marginal_monotonicity": {"passed": not violations, "violations": violations},
    }


# --------------------------------------------------------------------------- the document


def _public_name(name: str | None) -> str | None:
    """A target's name without a local folder: its last two path parts (a Hub id stays as it is)."""
    if not name:
        return None
    parts = [p for p in str(name).replace("\\", "/").split("/") if p]
    return "/".join(parts[-2:]) if parts else None


def build_profile(result: Any) -> dict:
    """The ``speculation_profile.json`` document of a verify run (its main wiring); ``result``
    is a :class:`~eagle3conv.verify.report.VerifyResult` (report.py imports this module)."""
    from eagle3conv.spec.layers import describe
    from eagle3conv.version import __version__

    s = result.main
    rates = chain_rates(s)
    per_category = None
    if result.per_category is not None:  # the report's figures (computed once), in the schema's names
        per_category = {name: dict({k: f[k] for k in (*rates, "sequences", "positions_scored")},
                                   mean_accept_length_ci95=f["accept_length_ci95"],
                                   acceptance_per_position=f["acceptance_per_position"],
                                   acceptance_ci95=f["acceptance_ci95"])
                        for name, f in result.per_category.items()}
    states = result.states
    wc = result.wiring_check
    return {
        "schema_version": SCHEMA_VERSION,
        "measured": True,
        "method": "eagle3",
        "draft_checkpoint": {"name": result.checkpoint.name},
        "target_model": {"name": _public_name(states.get("target")), "num_layers": states.get("num_layers")},
        "num_speculative_tokens": s.steps,
        "block_size": None,
        "max_supported_k": s.steps,
        "verification_method": "longest_prefix",
        "conditional_accept_rates": rates["conditional_accept_rates"],
        "marginal_accept_rates": rates["marginal_accept_rates"],
        "mean_accept_length": rates["mean_accept_length"],
        "mean_accept_length_per_request": rates["mean_accept_length_per_request"],
        "accept_length_model": "chain_analytic",
        "accept_length_by_k": {str(s.steps): rates["mean_accept_length"]},
        "acceptance_length_histogram": rates["acceptance_length_histogram"],
        "per_category": per_category,
        "measurement_conditions": {
            "tool": f"eagle3conv {__version__} verify",
            "measurement": "offline: the drafter run teacher-forced on captured target states, greedy chain "
                           "decoding replayed from each sequence's first full chain (not an engine benchmark)",
            "reference": ("the data's next tokens (the states hold no target predictions)"
                          if result.reference == "data" else "the target's greedy next tokens"),
            "temperature": 0.0,
            "states_source": states.get("source"),
            "sequences": len(s.chains),
            "positions_scored": s.tokens,
            "rounds": sum(s.replay_rounds),
            "device": result.device,
            "dtype": result.dtype,
        },
        "validation": validation(rates["mean_accept_length"], rates["marginal_accept_rates"]),
        EXTENSION_KEY: {
            "what": "eagle3conv's wiring provenance: which target layers the drafter read for these figures",
            "report": "eagle3conv-verify.json",
            "numbering": "output of decoder layer i, 0-based; -1 is the embedding output",
            "wiring": {"layers": [{"output_of": r.output_of} for r in s.candidate.layers],
                       "described": describe(s.candidate.layers), "why": s.candidate.why},
            "trained_on": wc.get("trained_on"),
            "wiring_check_ok": bool(wc.get("ok", True)),
            "verdict": result.verdict.status,
            "config_is_best": result.verdict.config_is_best,
            "engines": [{"release": e.release, "accept_length": round(e.score.accept_length, 4)}
                        if e.score is not None else {"release": e.release, "not_scored": e.not_scored}
                        for e in result.engine_scores],
        },
    }


@dataclass(frozen=True)
class ProfileView:
    """A ``speculation_profile.json``, validated: the fields the card shows, typed."""

    document: dict
    steps: int
    conditional: tuple[float, ...]
    marginal: tuple[float, ...]
    mean_accept_length: float
    mean_accept_length_per_request: float | None
    histogram: dict[str, int]
    valid: bool  # the document's own validation passed
    layers: tuple[int, ...] | None  # the extension's wiring (output-of ids), None without the extension


def read_profile(path) -> ProfileView:
    """Read and validate a profile (a file, or a folder holding :data:`PROFILE_FILE`);
    :class:`~eagle3conv.errors.CheckpointReadError` names the file and the field that is wrong."""
    import math
    from pathlib import Path

    from eagle3conv.errors import CheckpointReadError
    from eagle3conv.io.jsonfile import read_json_file

    p = Path(path)
    if p.is_dir():
        p = p / PROFILE_FILE
    rerun = "run eagle3conv verify CKPT --states STATES again to write it"
    if not p.exists():
        raise CheckpointReadError(f"{p}: no acceptance profile there", hint=rerun)
    try:  # the project's strict reader: a regular file, bounded, NaN/Infinity refused
        doc = read_json_file(p, PROFILE_FILE, want_object=False)
    except CheckpointReadError as err:  # its message starts with the path: the file's name only (cards travel)
        raise CheckpointReadError(f"{p.name}: not a readable JSON file ({err.message.removeprefix(f'{p}: ')})",
                                  hint=rerun) from None

    def bad(key: str, want: str) -> CheckpointReadError:
        got = doc.get(key) if isinstance(doc, dict) else doc
        return CheckpointReadError(f"{p.name}: '{key}' must be {want}, it is {got!r}"[:300], hint=rerun)

    def fractions(key: str, n: int) -> tuple[float, ...]:
        v = doc.get(key)
        if not isinstance(v, list) or len(v) != n or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 1 for x in v):
            raise bad(key, f"a list of {n} fractions (one per draft position)")
        return tuple(float(x) for x in v)

    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION:
        raise bad("schema_version", f"{SCHEMA_VERSION!r} (Model Optimizer's speculation profile schema)")
    k = doc.get("num_speculative_tokens")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise bad("num_speculative_tokens", "a positive integer")
    mean = doc.get("mean_accept_length")
    if isinstance(mean, bool) or not isinstance(mean, (int, float)) or not math.isfinite(mean) or mean < 1:
        raise bad("mean_accept_length", "a number >= 1")
    per_req = doc.get("mean_accept_length_per_request")
    if per_req is not None and (isinstance(per_req, bool) or not isinstance(per_req, (int, float))):
        raise bad("mean_accept_length_per_request", "a number or null")
    hist = doc.get("acceptance_length_histogram")
    if not isinstance(hist, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                             for v in hist.values()):
        raise bad("acceptance_length_histogram", "an object of round counts by accept length")
    val = doc.get("validation")
    valid = isinstance(val, dict) and all(isinstance(val.get(c), dict) and val[c].get("passed") is True
                                          for c in ("mean_consistency", "marginal_monotonicity"))
    ext = doc.get(EXTENSION_KEY)
    layers = None
    if isinstance(ext, dict) and isinstance(ext.get("wiring"), dict):
        ids = [x.get("output_of") if isinstance(x, dict) else None for x in ext["wiring"].get("layers") or []]
        if ids and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            layers = tuple(ids)
    return ProfileView(document=doc, steps=k, conditional=fractions("conditional_accept_rates", k),
                       marginal=fractions("marginal_accept_rates", k), mean_accept_length=float(mean),
                       mean_accept_length_per_request=None if per_req is None else float(per_req),
                       histogram=dict(hist), valid=valid, layers=layers)


def save_profile(result: Any, folder) -> str:
    """Write :data:`PROFILE_FILE` into ``folder`` atomically; returns its path."""
    import json
    from pathlib import Path

    from eagle3conv.io.files import atomic_write_text

    text = json.dumps(build_profile(result), indent=2) + "\n"
    return str(atomic_write_text(Path(folder) / PROFILE_FILE, text, durable=False))


__all__ = [
    "CONSISTENCY_TOLERANCE", "EXTENSION_KEY", "NO_CATEGORY", "PROFILE_FILE", "SCHEMA_VERSION", "ProfileView",
    "build_profile", "category_figures", "category_scores", "chain_rates", "read_profile", "save_profile",
    "total_histogram", "validation",
]
