"""The model card ``push`` publishes: README.md that records how the drafter is wired.

The card is built with huggingface_hub's :class:`~huggingface_hub.ModelCard` /
``ModelCardData``. Its metadata carries ``base_model`` (the target, when known),
``tags`` (:data:`TAGS`, merged with the user's) and ``library_name``. Its body is
one generated block between :data:`BEGIN` and :data:`END`:

- what the drafter is (architecture, sizes, target; for MLA drafters the latent
  attention dims and the RoPE type, factor and layout, docs/facts.md §10);
- the aux-layer set in explicit terms ("outputs of layers 1, 14, 26") and each
  engine's ids for it (SGLang ``eagle_config`` ids, vLLM input-of-layer ids,
  TensorRT-LLM ``eagle3_layers_to_capture``), with what config.json holds;
- the training record (``training_metadata.json`` or trainer metadata);
- the figures ``eagle3conv verify`` reported for this wiring (``eagle3conv-verify.json``, read through
  :class:`eagle3conv.verify.VerifyReport`), or why none are shown;
- the pre-push checks (and, with ``--force``, which ones failed);
- launch lines for SGLang, vLLM and TensorRT-LLM.

Text the user wrote is kept: a README that already has the markers gets only
the block between them replaced; one without them gets the block appended.
User front-matter keys are kept; ours (``base_model`` when known, ``tags``
merged, ``library_name`` when the user set none) are updated. The card is
rendered deterministically (no dates, no commit ids), so pushing an unchanged
folder renders the same bytes and creates no commit.

``push`` uploads the rendered card from memory; the local README.md is never
rewritten.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3conv.findings import GATE, GATE_FAILED, GATE_PASSED, Finding
from eagle3conv.verify.profile import PROFILE_FILE, ProfileView, read_profile
from eagle3conv.verify.report import REPORT_FILE, VerifyReport, WiringFigures
from eagle3conv.spec.drafter import architecture_key
from eagle3conv.spec.alike import alike, releases_label

BEGIN = "<!-- eagle3conv:begin -->"
END = "<!-- eagle3conv:end -->"
TAGS = ("eagle3", "speculative-decoding", "sglang", "vllm", "tensorrt-llm", "eagle3conv")
LIBRARY_NAME = "sglang"  # the weights use SGLang's names; transformers cannot load this class


# --------------------------------------------------------------------------- verify reports


@dataclass(frozen=True)
class VerifySummary:
    """What the card shows of ``eagle3conv-verify.json`` (read through
    :class:`eagle3conv.verify.VerifyReport`, the one report contract): the figures
    verify reported for the card's wiring, or why none are shown."""

    report: VerifyReport | None = None
    figures: WiringFigures | None = None  # the report's own figures for the card's wiring
    problem: str | None = None  # the file is not a verify report this eagle3conv reads
    other_layers: tuple[int, ...] | None = None  # the report scored only other wirings (this one first)


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def read_verify_report(folder: str | Path) -> VerifySummary | None:
    """The verify report of ``folder``: None when it has none; a summary with
    ``problem`` set (never an exception) when the file is not a report this
    eagle3conv reads (another format or version, malformed); else the report and
    its main figures."""
    from eagle3conv.errors import Eagle3ConvError

    from eagle3conv.checkpoint.links import safe_member

    p = Path(folder) / REPORT_FILE
    if not p.is_file():
        return None
    try:
        report = VerifyReport.load(safe_member(Path(folder), p))  # a link leaving the folder is not read
    except Eagle3ConvError as err:
        return VerifySummary(problem=err.message)
    return VerifySummary(report=report, figures=report.main)


def verify_for_layers(summary: VerifySummary | None, layers) -> VerifySummary | None:
    """The report's figures for the card's own wiring (``layers``, LayerRefs): the main
    result when it was measured with them, else a matching entry of a wiring search;
    otherwise no figures, and ``other_layers`` says which wiring was scored."""
    import dataclasses

    if summary is None or summary.report is None or layers is None:
        return summary
    figures = summary.report.figures_for(tuple(r.output_of for r in layers))
    if figures is None:
        return dataclasses.replace(summary, figures=None, other_layers=summary.report.main.layers)
    return dataclasses.replace(summary, figures=figures)


# --------------------------------------------------------------------------- facts


class Check(Finding):
    """One pre-push check and its outcome: a :class:`~eagle3conv.findings.Finding` of area
    ``gate``, code ``passed`` or ``failed``, the check's name as its subject
    (``.name``, ``.ok`` and ``.detail`` read them back)."""

    def __init__(self, name: str, ok: bool, detail: str = "") -> None:
        super().__init__("ok" if ok else "error", GATE, GATE_PASSED if ok else GATE_FAILED, detail, subject=name)


@dataclass
class CardFacts:
    """Everything the card states, gathered from the checkpoint folder."""

    repo_id: str
    config: dict = field(default_factory=dict)
    target: str | None = None
    target_layers: int | None = None
    target_family: str | None = None  # the engine model-file family (docs/facts.md §9): whose id rules apply
    layers: tuple | None = None  # LayerRefs in slot order
    layers_source: str | None = None
    layers_trained: bool = False  # True: from a training record; False: as SGLang reads config.json
    raw_config_ids: dict = field(default_factory=dict)
    records: list = field(default_factory=list)  # TrainingRecords
    verify: VerifySummary | None = None
    checks: list = field(default_factory=list)  # Checks
    checks_run: bool = True
    forced: bool = False
    plot: str | None = None  # the wiring-search figure uploaded next to README.md (its path in the repo)
    profile: ProfileView | None = None  # speculation_profile.json, when the folder has one that reads
    profile_problem: str | None = None  # the folder's speculation_profile.json does not read
    quantization: dict | None = None  # a quantized drafter's precision facts (hub/card_quant.py); None: bf16


def _target_layers(target: str | None, config: Mapping) -> int | None:
    if target:
        try:
            from eagle3conv.errors import UsageError
            from eagle3conv.spec.targets import get_target

            return get_target(target).num_hidden_layers
        except UsageError:  # not a built-in profile: no layer count from it
            pass
    spec = config.get("speculators_config") or {}
    verifier = spec.get("verifier") if isinstance(spec, Mapping) else None
    if isinstance(verifier, Mapping) and isinstance(verifier.get("num_hidden_layers"), int):
        return verifier["num_hidden_layers"]
    return None


def _target_family(target: str | None) -> str | None:
    if target:
        try:
            from eagle3conv.errors import UsageError
            from eagle3conv.spec.targets import get_target

            return get_target(target).family
        except UsageError:  # not a built-in profile: the rules for most families apply
            pass
    return None


def _hub_id(target: str | None) -> str | None:
    """A built-in profile's name or alias (``smollm2-135m``) → its Hub repo id; else unchanged."""
    if not target:
        return target
    from eagle3conv.errors import UsageError
    from eagle3conv.spec.targets import get_target

    try:
        return get_target(target).hf_repo or target
    except UsageError:  # not a built-in profile: keep what the user or trainer wrote
        return target


def _config_target(config: Mapping) -> str | None:
    spec = config.get("speculators_config") or {}
    verifier = spec.get("verifier") if isinstance(spec, Mapping) else None
    if isinstance(verifier, Mapping) and isinstance(verifier.get("name_or_path"), str):
        return verifier["name_or_path"]
    for key in ("target_model", "base_model", "target_model_name_or_path"):
        if isinstance(config.get(key), str):
            return config[key]
    return None


def gather_facts(folder: str | Path, repo_id: str, *, base_model: str | None = None,
                 checks: Sequence[Check] = (), checks_run: bool = True, forced: bool = False,
                 plot: str | None = None) -> CardFacts:
    """Read config.json, the training records and the verify report of ``folder``
    (``plot``: the wiring-search figure's path in the repo, embedded in the wiring section)."""
    from eagle3conv.errors import Eagle3ConvError
    from eagle3conv.checkpoint.config import aux_ids_in
    from eagle3conv.spec.engines import capture, default_engines
    from eagle3conv.wiring.metadata import find_training_record

    root = Path(folder)
    config: dict = {}
    cfg_path = root / "config.json"
    if cfg_path.is_file():
        from eagle3conv.errors import CheckpointReadError
        from eagle3conv.io.jsonfile import read_json_file

        from eagle3conv.checkpoint.links import safe_member

        try:  # a link leaving the folder is not read (checkpoint/links.py)
            config = read_json_file(safe_member(root, cfg_path), "config.json")
        except CheckpointReadError:
            config = {}
    from eagle3conv.wiring.config_ids import provenance_record

    try:
        records = find_training_record(root, None, config or None)
        prov = provenance_record(config or None)
        if prov is not None:  # eagle3conv's own record of the layers, above the config's raw ids
            records = [r for r in records if r.kind != "config"]
            records.insert(1 if records and records[0].kind == "metadata" else 0, prov)
    except Eagle3ConvError:
        records = []
    target = base_model or next((r.target for r in records if r.target), None) or _config_target(config)
    target = _hub_id(target)
    n = _target_layers(target, config)
    family = _target_family(target)
    facts = CardFacts(repo_id=repo_id, config=config, target=target, target_layers=n, target_family=family,
                      records=list(records),
                      verify=read_verify_report(root), checks=list(checks), checks_run=checks_run, forced=forced,
                      plot=plot)
    facts.raw_config_ids = aux_ids_in(config) if config else {}
    from eagle3conv.hub.card_quant import quantization_facts

    facts.quantization = quantization_facts(root, config) if config else None
    trained = next((r for r in records if r.layers), None)
    if trained is not None:
        facts.layers, facts.layers_source, facts.layers_trained = trained.layers, trained.source, True
    else:  # what the config's own ids name, where every engine release checked reads them alike
        readings = set()
        for rel in default_engines():
            try:
                cap = capture(rel, config, family, n)
            except Eagle3ConvError:
                continue
            if cap.field is not None and cap.field.in_config and cap.layers is not None:
                readings.add(cap.layers)
        if len(readings) == 1:
            facts.layers = readings.pop()
            facts.layers_source = "config.json's ids, as every engine release checked reads them"
    facts.verify = verify_for_layers(facts.verify, facts.layers)
    if (root / PROFILE_FILE).is_file():
        try:
            facts.profile = read_profile(root / PROFILE_FILE)
        except Eagle3ConvError as err:
            facts.profile_problem = err.message
    return facts


# --------------------------------------------------------------------------- rendering


def _ids(ids) -> str:
    return "[" + ", ".join(str(i) for i in ids) + "]"


def _engine_rows(facts: CardFacts) -> list[tuple[str, str, str]]:
    """Per engine release served: where it reads its ids, and the ids that name the drafter's layers
    (the engine rules, the same plan `eagle3conv config` writes)."""
    from eagle3conv.errors import Eagle3ConvError
    from eagle3conv.spec.engines import id_field, plan_ids
    from eagle3conv.wiring.config_ids import served_releases

    try:
        plan = plan_ids(facts.layers, facts.target_family, facts.target_layers, served_releases(()))
    except Eagle3ConvError as e:
        return [("every engine", "-", f"cannot be expressed: {e.message}")]
    rows = []
    for rel, need in plan.needs:
        where = id_field(rel)
        place = f"`{where.name}` in config.json" if where.in_config else f"`{where.name}` launch option"
        rows.append((rel, place, f"`{_ids(need)}`" if need is not None else "cannot capture these layers"))
    return [(releases_label([str(r[0]) for r in sorted(g, key=lambda r: r[0].version)]), *g[0][1:])
            for g in alike(rows, lambda r: r[0].engine, lambda r: r[1:])]  # releases that read alike share a row


def _wiring_section(facts: CardFacts) -> list[str]:
    from eagle3conv.spec.layers import describe

    out = ["### Target layers it reads", ""]
    n = facts.target_layers
    of_target = f" of its {n}-layer target" if n else " of its target"
    if facts.layers:
        slot = "in that slot order (the order of `fc`'s input chunks)"
        if facts.layers_trained:
            out.append(f"This drafter was trained on the hidden states **{describe(facts.layers)}**{of_target} "
                       f"(0-based), {slot}. Source: {facts.layers_source}.")
        else:
            out.append(f"No training record names the layers this drafter was trained on. As the engines read its "
                       f"config.json, it is fed the hidden states **{describe(facts.layers)}**{of_target} "
                       f"(0-based), {slot}. Check that this matches the training run.")
        out += ["", "The same tensors as each engine release reads its ids:", "",
                "| engine | where | ids |", "|---|---|---|"]
        out += [f"| {e} | {w} | {i} |" for e, w, i in _engine_rows(facts)]
    else:
        out.append("The aux-layer set is not recorded explicitly"
                   + (f" (config.json ids: {facts.raw_config_ids})" if facts.raw_config_ids else "")
                   + "; the engines fall back to their defaults, which may not match training.")
    if facts.raw_config_ids:
        held = "; ".join(f"`{k}` = `{v}`" for k, v in sorted(facts.raw_config_ids.items()))
        out += ["", f"config.json holds: {held}."]
    return out


def _plot_lines(facts: CardFacts) -> list[str]:
    """The wiring-search figure ``push --plot`` uploads, embedded under the wiring section."""
    if not facts.plot:
        return []
    from urllib.parse import quote

    return ["", f"![The wiring search: acceptance per aux slot and candidate layer]({quote(facts.plot)})", "",
            "Drawn by `eagle3conv verify --plot`: per aux slot, the step-1 acceptance of each candidate layer "
            "in the wiring search (the chosen layer marked), and each slot's hidden-state norm next to the "
            "training record's."]


def _training_section(facts: CardFacts) -> list[str]:
    out = ["### Training", ""]
    records = facts.records
    if any(r.layers for r in records):  # an explicit record makes "ids in an unknown numbering" noise
        records = [r for r in records if r.layers or r.target or r.tokens]
    if not records:
        return out + ["No training record was found (no `training_metadata.json`, no trainer metadata)."]
    for r in records:
        line = f"- {r.describe()}"
        extra = []
        if r.target:
            extra.append(f"target `{r.target}`")
        if r.draft_vocab_size:
            extra.append(f"draft vocab {r.draft_vocab_size}")
        if r.tokens:
            extra.append(f"{r.tokens:,} tokens")
        if extra:
            line += "; " + ", ".join(extra)
        out.append(line)
        if r.norms and isinstance(r.norms.get("slots"), list):
            medians = [s.get("median") for s in r.norms["slots"] if isinstance(s, Mapping)]
            if all(_number(m) is not None for m in medians):
                out.append(f"  - hidden-state norms per slot (median, {r.norms.get('statistic', 'per token')}): "
                           + ", ".join(f"{m:.3g}" for m in medians))
    return out


def _verify_section(facts: CardFacts) -> list[str]:
    out = ["### Verification", ""]
    v = facts.verify
    if v is None:
        return out + [f"Not verified: the checkpoint had no `{REPORT_FILE}` when it was pushed."]
    if v.problem or v.report is None:
        return out + [f"Not verified: {v.problem}."]
    if v.figures is None:
        return out + [f"Not shown: the last `eagle3conv verify` scored another wiring "
                      f"(outputs of layers {', '.join(map(str, v.other_layers or ()))}) than the one this card "
                      "states; run verify on this wiring before publishing figures."]
    r, f = v.report, v.figures
    about = [x for x in (f"{r.sequences} sequences" if r.sequences is not None else None,
                         f"{r.tokens} tokens" if r.tokens is not None else None,
                         f"{f.positions_scored} positions scored") if x]
    out += [f"From `{REPORT_FILE}` ({', '.join(about)}):", "",
            f"Statistic: {r.statistic}. Acceptance at draft position k is per position "
            "(not conditional on the earlier drafts).", ""]
    states = r.document.get("states") if isinstance(r.document.get("states"), dict) else {}
    if states.get("wiring_checked") is False:  # the slots were labelled with the config's own ids
        out += ["> These states did not record which layers they hold: the figures below do not check "
                "the wiring (a wrong config would score the same).", ""]
    if f.acceptance:
        out += ["| draft position | " + " | ".join(str(i + 1) for i in range(len(f.acceptance))) + " |",
                "|---|" + "---|" * len(f.acceptance),
                "| acceptance | " + " | ".join(f"{a:.1%}" for a in f.acceptance) + " |", ""]
    lo, hi = f.accept_length_ci95
    out.append(f"Expected accept length: **{f.accept_length:.2f}** tokens per verification step "
               f"(95% interval {lo:.2f} to {hi:.2f}; greedy chain decoding replayed over {f.rounds} rounds).")
    if f is r.main:  # the threshold was checked on the main wiring's step-1 acceptance
        out.append(f"Verify verdict: {'passed' if r.passed else 'FAILED'}.")
        out += _category_lines(r)
    return out


def _category_lines(r: VerifyReport) -> list[str]:
    """The main wiring's figures per prompt category, as the report states them."""
    if not r.per_category:
        return []
    out = ["", "Per prompt category (95% intervals):", "",
           "| category | sequences | positions | accept length | step-1 acceptance |", "|---|---|---|---|---|"]
    for c in r.per_category:
        lo, hi = c.accept_length_ci95
        a_lo, a_hi = c.acceptance_ci95[0] if c.acceptance_ci95 else (0.0, 1.0)
        step1 = f"{c.acceptance[0]:.1%} ({a_lo:.1%} to {a_hi:.1%})" if c.acceptance else "n/a"
        name = c.name.replace("|", "\\|")
        out.append(f"| {name} | {c.sequences} | {c.positions_scored} | {c.accept_length:.2f} ({lo:.2f} to {hi:.2f}) "
                   f"| {step1} |")
    return out


def _profile_section(facts: CardFacts) -> list[str]:
    """``speculation_profile.json`` (Model Optimizer's schema 1.0), for the card's own wiring."""
    if facts.profile is None and facts.profile_problem is None:
        return []
    out = ["### Acceptance profile", ""]
    if facts.profile is None:
        return out + [f"Not shown: {facts.profile_problem}."]
    p = facts.profile
    want = None if facts.layers is None else tuple(r.output_of for r in facts.layers)
    if want is not None and p.layers != want:
        return out + [f"Not shown: `{PROFILE_FILE}` was measured on "
                      + (f"outputs of layers {', '.join(map(str, p.layers))}" if p.layers else "an unnamed wiring")
                      + ", not the wiring this card states; run verify on this wiring before publishing it."]
    per_req = ("" if p.mean_accept_length_per_request is None
               else f"; averaged per request: {p.mean_accept_length_per_request:.3f}")
    out += [f"`{PROFILE_FILE}` (Model Optimizer's portable acceptance profile, schema 1.0; the wiring it was "
            f"measured on is under its `x_eagle3conv` key):", "",
            "| draft position | " + " | ".join(str(i + 1) for i in range(p.steps)) + " |",
            "|---|" + "---|" * p.steps,
            "| marginal: drafts 1..k all accepted | " + " | ".join(f"{x:.3f}" for x in p.marginal) + " |",
            "| conditional: draft k, given 1..k-1 | " + " | ".join(f"{x:.3f}" for x in p.conditional) + " |", "",
            f"Mean accept length per step: **{p.mean_accept_length:.3f}**{per_req}. "
            f"Validation (1 + sum of marginals = mean; marginals non-increasing): "
            f"{'passed' if p.valid else 'FAILED'}."]
    return out


def _checks_section(facts: CardFacts) -> list[str]:
    out = ["### Checks before publishing", ""]
    if not facts.checks_run:
        return out + ["No pre-push checks were run."]
    failed = [c for c in facts.checks if not c.ok]
    if facts.forced and failed:
        out += ["> **Warning: pushed with `--force`.** These checks failed and were overridden:", ">"]
        out += [f"> - {c.name}: {c.detail}" for c in failed]
        out.append("")
    for c in facts.checks:
        out.append(f"- {'passed' if c.ok else 'FAILED'}: {c.name}" + (f" ({c.detail})" if c.detail else ""))
    if not facts.checks:
        out.append("No checks were configured.")
    return out


def _launch_section(facts: CardFacts) -> list[str]:
    """The launch lines, one per engine, from the one builder (spec/launch.py): none for an engine whose
    release cannot load the drafter; then what a checked launch line (``push --launch``) was found."""
    from eagle3conv.spec.engine_rules import engines
    from eagle3conv.spec.launch import build_line, launch_lines, trtllm_capture_ids
    from eagle3conv.wiring.config_ids import served_releases

    repo = facts.repo_id
    out = ["### Launch", ""]
    if not facts.target:
        out += ["Replace `TARGET_MODEL` with the target model this drafter was trained for.", ""]
    kw = dict(target=facts.target or "TARGET_MODEL", tensor_names=(facts.quantization or {}).get("companions", ()),
              capture_ids=trtllm_capture_ids(facts.target_family, facts.target_layers, facts.layers))
    lines = launch_lines(served_releases(()), facts.config, drafter=repo, **kw)

    for engine, line in lines.items():
        title = engines()[engine].title
        if line.text is None:
            out += [f"{title}: not served ({'; '.join(line.refused)}).", ""]
            continue
        if line.extra_file:
            drafter_dir = "./drafter"  # the file names the downloaded folder, not the repo
            text = build_line(line.release, facts.config, drafter=drafter_dir, **kw).extra_file
            out += [f"{title} (`{line.argv[0]}`, with the drafter downloaded first: "
                    f"`hf download {repo} --local-dir {drafter_dir}`):", "", "```bash", line.text, "```", "",
                    "```yaml", f"# {line.extra_name}", text, "```", ""]
        else:
            out += [f"{title}:", "", "```bash", line.text, "```", ""]
    out += _launch_checked(facts.checks)
    while out and out[-1] == "":
        out.pop()
    return out


LAUNCH_CHECK = "launch-line"  # the gate check of the user's own launch line (push --launch)


def _launch_checked(checks: Sequence[Check]) -> list[str]:
    """What ``push --launch`` found in the user's own launch line (its gate check, spec/launch_check.py)."""
    found = [c for c in checks if c.name == LAUNCH_CHECK]
    if not found:
        return []
    c = found[-1]
    return [f"The launch line given to `eagle3conv push --launch` was checked: "
            f"{'no errors' if c.ok else '**errors found**'} ({c.detail}).", ""]


def _about(facts: CardFacts) -> list[str]:
    c = facts.config
    arch = ", ".join(c.get("architectures") or []) or "unknown architecture"
    target = f"[`{facts.target}`](https://huggingface.co/{facts.target})" if facts.target else "its target model"
    sizes = []
    if isinstance(c.get("hidden_size"), int):
        sizes.append(f"hidden size {c['hidden_size']}")
    if isinstance(c.get("draft_vocab_size"), int) and isinstance(c.get("vocab_size"), int):
        sizes.append(f"draft vocabulary {c['draft_vocab_size']:,} of {c['vocab_size']:,} tokens")
    dtype = c.get("torch_dtype") or c.get("dtype")
    if isinstance(dtype, str):
        sizes.append(dtype)
    return [
        "## EAGLE-3 drafter", "",
        f"An EAGLE-3 speculative-decoding drafter for {target} (`{arch}`"
        + (", " + ", ".join(sizes) if sizes else "") + "). Its weights use the names SGLang loads "
        "(`midlayer.*`, `fc`, `norm`, `lm_head`, `d2t`), which vLLM and TensorRT-LLM accept as well.",
    ] + _mla_section(c) + _serving_section(c)


def _serving_section(c: Mapping) -> list[str]:
    """The drafter's shape (layers, aux states, switches) and, per engine release checked by default,
    whether it serves it as configured (docs/facts.md §11: later layers' norms, switches a release
    ignores, drafters it cannot load)."""
    from eagle3conv.spec.drafter import DrafterSpec
    from eagle3conv.spec.variants import switches as variant_table
    from eagle3conv.spec.engines import (
        cannot_load,
        default_engines,
        draft_window,
        served_without,
        window_launch_option,
        window_note,
    )

    from eagle3conv.errors import Eagle3ConvError

    try:  # validated first (as fix-keys does): a config with a field of the wrong type is an error here
        spec = DrafterSpec.from_config(c)
    except Eagle3ConvError:  # a config the gate already reported: no table
        return []
    switches = [s.card for s in variant_table() if s.card and s in spec.switches]  # mappings/variants.json
    out = ["", "### Shape and serving", "",
           f"{spec.L} decoder layer{'s' if spec.L != 1 else ''}, {spec.k or 3} aux states into `fc`"
           + (f"; switches: {', '.join(f'`{s}`' for s in switches)}" if switches else "; no EAGLE-3.1 switches")
           + (f"; a sliding window of {win[0]} tokens on layer{'s' if len(win[1]) > 1 else ''} "
              f"{', '.join(map(str, win[1]))}" if (win := draft_window(c)) else "")
           + ".", "", "| engine release | serves this drafter |", "|---|---|"]
    served = []
    for rel in default_engines():
        refused = cannot_load(rel, c)
        without = served_without(rel, c)
        how = ("cannot load it: " + "; ".join(r.removeprefix(f"{rel} ") for r in refused) if refused else
               "as configured, but without " + ", ".join(f"`{w}`" for w in without) if without else
               "as configured")
        if not refused and (option := window_launch_option(rel, c)):
            how += f"; its sliding window only when launched with `{option}`"
        elif not refused and window_note(rel, c):
            how += "; without its sliding window"
        served.append((rel, how))
    for g in alike(served, lambda x: x[0].engine, lambda x: x[1]):  # releases that read alike share a row
        out.append(f"| {releases_label([str(rel) for rel, _ in g])} | {g[0][1]} |")
    return out


def _mla_section(c: Mapping) -> list[str]:
    """MLA drafters (docs/facts.md §10): the attention dims and the RoPE an engine must run."""
    if architecture_key(c) != "mla":  # the one MLA decision (spec.drafter)
        return []

    def num(key: str) -> str:
        v = c.get(key)
        return "null" if v is None else str(v)

    out = ["", "### Attention: multi-head latent attention (MLA)", "",
           "The decoder layer uses DeepSeek-V2 multi-head latent attention, as SGLang's "
           "`Eagle3DeepseekV2ForCausalLM` runs it:", "",
           "| | |", "|---|---|",
           f"| heads | {num('num_attention_heads')} |",
           f"| `q_lora_rank` | {num('q_lora_rank')} |",
           f"| `kv_lora_rank` | {num('kv_lora_rank')} |",
           f"| `qk_nope_head_dim` / `qk_rope_head_dim` | {num('qk_nope_head_dim')} / {num('qk_rope_head_dim')} |",
           f"| `v_head_dim` | {num('v_head_dim')} |"]
    from eagle3conv.spec.drafter import rope_settings

    try:
        params = rope_settings(c)  # the one reader of the RoPE settings, as the forwards read them
    except ValueError:
        params = {}
    theta = params.get("rope_theta")
    rope_type = str(params.get("rope_type") or params.get("type") or "default")
    interleave = c.get("rope_interleave", True) is not False
    out.append(f"| RoPE theta | {theta if theta is not None else '10000 (default)'} |")
    if rope_type == "default":
        out.append("| RoPE scaling | none |")
    else:
        out.append(f"| RoPE scaling | `{rope_type}` (run as DeepSeek yarn), factor {params.get('factor')}, "
                   f"original context {params.get('original_max_position_embeddings')}, "
                   f"mscale {params.get('mscale', 1)}, mscale_all_dim {params.get('mscale_all_dim', 0)} |")
    out.append("| RoPE layout | " + ("interleaved pairs (`rope_interleave: true`)" if interleave else
                                     "half-split (`rope_interleave: false`): SGLang honours it, vLLM always "
                                     "uses interleaved pairs, so the two engines run this drafter differently")
               + " |")
    if c.get("q_lora_rank") is None:
        out += ["", "`q_lora_rank` is null: SGLang refuses this drafter (its Eagle3 MLA layer requires "
                    "`q_lora_rank`); vLLM builds a direct `q_proj`."]
    return out


def _profile_lines(facts: CardFacts) -> list[str]:
    section = _profile_section(facts)
    return [""] + section if section else []


def render_block(facts: CardFacts) -> str:
    """The generated part of the card, markers included."""
    lines = [BEGIN, "<!-- Written by `eagle3conv push`; this block is replaced on every push. "
                    "Text outside it is yours and is kept. -->", ""]
    from eagle3conv.hub.card_quant import quantization_section

    doc = facts.verify.report.document if facts.verify is not None and facts.verify.report is not None else None
    for section in (_about(facts), _wiring_section(facts) + _plot_lines(facts), _training_section(facts),
                    _verify_section(facts) + _profile_lines(facts), quantization_section(facts.quantization, doc),
                    _checks_section(facts), _launch_section(facts)):
        if section:  # a section with nothing to state (precision, for a bf16 drafter) is left out
            lines += section + [""]
    lines.append(END)
    return "\n".join(lines) + "\n"


def _split_front_matter(text: str) -> tuple[str, str]:
    """(front matter YAML including delimiters or "", body)."""
    from huggingface_hub.repocard import REGEX_YAML_BLOCK

    m = REGEX_YAML_BLOCK.search(text)
    return (text[: m.end()], text[m.end():]) if m else ("", text)


def merge_body(existing: str, block: str, title: str) -> str:
    """Replace the generated block in ``existing`` (a README body), or append it."""
    start, end = existing.find(BEGIN), existing.find(END)
    if start != -1 and end > start:
        return existing[:start] + block.rstrip("\n") + existing[end + len(END):]
    if not existing.strip():
        return f"\n# {title}\n\n{block}"
    return existing.rstrip("\n") + "\n\n" + block


def render_card(facts: CardFacts, existing: str | None = None) -> str:
    """The full README.md: ``existing`` (the user's README, or None) with our metadata and block."""
    from huggingface_hub import ModelCard

    existing = (existing or "").replace("\r\n", "\n")
    front, body = _split_front_matter(existing)
    card = ModelCard(front + body if front else "---\n{}\n---\n" + body)
    data = card.data
    if facts.target:
        data.base_model = facts.target
    user_tags = data.get("tags") or []
    if isinstance(user_tags, str):
        user_tags = [user_tags]
    data.tags = list(user_tags) + [t for t in TAGS if t not in user_tags]
    if not data.get("library_name"):
        data.library_name = LIBRARY_NAME
    card.text = merge_body(card.text, render_block(facts), facts.repo_id.split("/")[-1])
    text = str(card)
    return text if text.endswith("\n") else text + "\n"


__all__ = [
    "BEGIN", "END", "LIBRARY_NAME", "TAGS", "CardFacts", "Check", "VerifySummary",
    "gather_facts", "merge_body", "read_verify_report", "render_block", "render_card",
]
