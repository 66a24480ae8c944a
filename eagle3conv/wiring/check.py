"""The wiring check: config.json vs training records vs weights vs target.

One function, :func:`check_wiring`, answers "will each engine feed this drafter
the target states it was trained on?" and returns a :class:`WiringReport` of
findings, each an error or a warning in explicit terms ("config includes the
embedding output; training captured the outputs of layers 2, 30, 58") with the
command that fixes it. ``fix-keys``, ``config --check`` (and later ``verify``
and ``push``) run it.

What is checked (docs/facts.md §3 and §5):

* the number of aux layers in every id list equals ``fc``'s in-features / T;
* ids are integers, in range for the target's layer count, ascending (engines
  concatenate captured states in layer order, whatever the list order) and
  distinct; no embedding id where SGLang reads them (it cannot capture it);
* the SGLang ids (nested ``eagle_config``) mean the training layers in old
  and new SGLang, or in one of them (a warning naming the other's ids);
* the vLLM ids (top-level, input-of-layer) mean the training layers;
* training records that disagree with each other;
* no ids anywhere: each engine's default and which tensors that means (an
  error when the training record says otherwise); a SpecForge drafter without
  ids may come from the 2025-09-01..2025-10-20 window (different middle layer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eagle3conv.errors import UsageError, WiringError
from eagle3conv.findings import (
    AUX_LAYERS,
    BAD_EAGLE_CONFIG,
    BAD_IDS,
    DEFAULTS_DISAGREE,
    DISAGREES_WITH_TRAINING,
    DUPLICATE_IDS,
    EMBEDDING_FOR_SGLANG,
    ENGINE_CANNOT_CAPTURE,
    ENGINE_CAPTURES_OTHER,
    ENGINE_NEEDS_OTHER_IDS,
    FC_WIDTH,
    ID_COUNT,
    IDS_UNREADABLE,
    NO_IDS,
    RECORD_COUNT,
    RECORD_RANGE,
    RECORDS_DISAGREE,
    SGLANG_DEFAULT,
    SGLANG_IDS,
    SGLANG_VERSION,
    SPECFORGE_WINDOW,
    TRAINED_ON_EMBEDDING,
    UNSORTED_IDS,
    UNVERIFIED_IDS,
    VLLM_DEFAULT,
    Finding,
)
from eagle3conv.spec.layers import (
    LayerSet,
    describe,
    engine_defaults,
    is_ascending,
    to_ids,
    to_refs,
    validate_refs,
)
from eagle3conv.spec.engines import KIND_WORDS
from eagle3conv.wiring.metadata import TrainingRecord
from eagle3conv.spec.drafter import aux_ids

SGLANG_FIELD = "eagle_config.eagle_aux_hidden_state_layer_ids"
VLLM_FIELD = "eagle_aux_hidden_state_layer_ids"
SGLANG_VERSIONS = {
    "sglang-old": "SGLang before PR #25454",
    "sglang-new": "SGLang after PR #25454 (DeepSeek/Kimi targets)",
}
_SPECFORGE_FORMATS = ("specforge", "specforge-runtime")


def _f(level: str, code: str, message: str, fix: str | None = None) -> Finding:
    """A finding of the wiring check (area ``aux-layers``)."""
    return Finding(level, AUX_LAYERS, code, message, fix)  # type: ignore[arg-type]


@dataclass
class WiringReport:
    """The result of :func:`check_wiring`."""

    layers: LayerSet | None
    """What the drafter was trained on (the first training record naming layers)."""
    record: TrainingRecord | None
    num_aux: int | None
    """``fc``'s in-features / T, when the weights are known."""
    num_layers: int | None
    target: str | None
    reads: dict[str, dict[str, str]] = field(default_factory=dict)
    """Per config field: what each engine reads its ids as, in plain words."""
    findings: list[Finding] = field(default_factory=list)
    engines: list[dict] = field(default_factory=list)
    """Per engine release asked: the layers it captures from this config (see :func:`engine_rows`)."""

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def raise_for_errors(self, what: str = "the aux-layer wiring is wrong") -> None:
        if self.errors:
            first = self.errors[0]
            raise WiringError(
                f"{what}: {first.message}",
                details=[f.message for f in self.errors[1:]],
                hint=first.fix or next((f.fix for f in self.errors if f.fix), None),
            )

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "trained_on": None if self.layers is None else {
                "layers": [{"output_of": r.output_of} for r in self.layers],
                "described": describe(self.layers),
                "source": self.record.source if self.record else None,
            },
            "num_aux_layers_from_fc": self.num_aux,
            "target": self.target,
            "target_num_layers": self.num_layers,
            "config_reads": self.reads,
            "engines": self.engines,
            "findings": [{"level": f.level, "code": f.code, "message": f.message, "fix": f.fix}
                         for f in self.findings],
        }


def sglang_numbering(family: str | None, engine: str = "sglang") -> str:
    """Which of spec/layers.py's SGLang numberings an SGLang release applies to a target
    family, read from the engine rules (mappings/engines/sglang.json): ``sglang-new`` where
    the first-id rule applies (``+1`` only when the first id is 1), else ``sglang-old``."""
    from eagle3conv.spec.engines import rule_for

    rule = rule_for(engine, family)
    return "sglang-new" if rule.explicit == "plus_one_if_first_is_1" else "sglang-old"


def sglang_preference(target_arch: Sequence[str] | None, model_type: str | None) -> str:
    """The SGLang numbering the newest SGLang release applies to the target whose
    ``architectures``/``model_type`` are given (the family table decides, docs/facts.md §9)."""
    from eagle3conv.spec.engines import family_for

    return sglang_numbering(family_for(list(target_arch or ()), model_type))


def engine_spec(rel: Any) -> str:
    """How to write an engine release on the command line: ``sglang==0.5.12``,
    ``vllm==0.33.0:runner=v1`` when a runner was asked for."""
    spec = rel.label.replace(" ", "==", 1)
    return f"{spec}:runner={rel.runner}" if getattr(rel, "runner", None) else spec


def priority_releases(engines: Sequence[Any], explicit: bool) -> dict[str, Any]:
    """Per engine, the release whose reading wins when no single id list serves every
    asked release: the first one asked (``--engine``), else the newest of the default set."""
    out: dict[str, Any] = {}
    for rel in engines:
        if rel.engine not in out:
            out[rel.engine] = rel
        elif not explicit and rel.version > out[rel.engine].version:
            out[rel.engine] = rel
    return out


def shared_ids_exist(engines: Sequence[Any], family: str | None, n: int, layers: LayerSet) -> bool:
    """Whether one id list in each engine's field makes every release in ``engines`` of
    that engine capture ``layers`` (checked with the engine rules)."""
    from eagle3conv.spec.engines import capture, id_field, ids_for

    rels = list(engines)
    if len(rels) < 2:
        return True
    for rel in rels:
        try:
            ids = ids_for(rel, family, n, layers)
        except (WiringError, UsageError):
            return True  # the record does not fit the target: reported on its own
        if ids is None:
            continue
        fld = id_field(rel)
        if fld.startswith("launch option"):
            return True
        cfg = _config_with(fld, ids)
        if all(capture(o, cfg, family, n).layers == tuple(layers) for o in rels if id_field(o) == fld):
            return True
    return False


def _config_with(fld: str, ids: Sequence[int]) -> dict:
    node: dict = {}
    root = node
    parts = fld.split(".")
    for part in parts[:-1]:
        node[part] = {}
        node = node[part]
    node[parts[-1]] = list(ids)
    return root


def engine_rows(
    config: Mapping,
    truth: LayerSet | None,
    truth_source: str | None,
    family: str | None,
    n: int,
    engines: Sequence[Any],
    *,
    explicit: bool,
    fix_command: str,
) -> tuple[list[dict], list[Finding]]:
    """What each engine release captures from ``config`` on an ``n``-layer target of
    ``family`` (the engine rules, docs/facts.md §9), one row each, and the findings:
    an error when an engine cannot capture what the config names, or captures other
    layers than the training record's. When no single id list can serve every asked
    release of an engine, only its priority release (:func:`priority_releases`) is an
    error; the others are warnings naming the ids they need."""
    from eagle3conv.spec.engines import capture, id_field, ids_for, rule_for

    rows: list[dict] = []
    found: list[Finding] = []
    prio = priority_releases(engines, explicit)
    shared = {e: shared_ids_exist([r for r in engines if r.engine == e], family, n, truth)
              for e in prio} if truth is not None else {}
    for rel in engines:
        fld = id_field(rel)
        launch = fld.startswith("launch option")
        try:
            need = ids_for(rel, family, n, truth) if truth is not None else None
        except (WiringError, UsageError):
            need = None
        cap = capture(rel, config, family, n, launch_ids=need if launch else None)
        row = {
            "engine": engine_spec(rel),
            "release": str(rel),
            "release_note": rel.note,
            "runner": cap.runner,
            "runner_assumed": None if cap.runner is None or rel.runner else
            f"{cap.runner}, {rel.engine}'s default runner (ask for another with --engine "
            f"{engine_spec(rel)}:runner=NAME)",
            "family": family,
            "reads": cap.field,
            "ids": None if cap.ids is None else list(cap.ids),
            "fell_back": cap.fell_back,
            "rule": None if cap.kind is None else KIND_WORDS[cap.kind],
            "captures": None if cap.layers is None else describe(cap.layers),
            "layers": None if cap.layers is None else [{"output_of": r.output_of} for r in cap.layers],
            "ok": cap.ok and (truth is None or cap.layers == tuple(truth)),
            "error": cap.error,
            "needs": None if need is None else list(need),
            "notes": list(cap.notes) + ([cap.fallback_why] if cap.fallback_why else []),
            "source": cap.source,
        }
        rows.append(row)
        if launch:
            continue  # the ids are a launch option: printed with the launch lines, never wrong in the config
        spec = engine_spec(rel)
        fix = fix_command if "--engine" in fix_command else f"{fix_command} --engine {spec}"
        if cap.error:
            unsupported = not rule_for(rel, family).supported
            # an engine that cannot serve the family, or whose default does not fit a small target,
            # matters only when asked for by name
            level = "warning" if (unsupported or cap.fell_back) and not explicit else "error"
            found.append(_f(level, ENGINE_CANNOT_CAPTURE, f"{rel}: {cap.error}",
                            None if unsupported else fix))
            continue
        if truth is None or cap.layers == tuple(truth):
            continue
        words = (f"{rel} reads {cap.field} {list(cap.ids or ())} ({KIND_WORDS[cap.kind or 'raw']}) and captures "
                 f"{describe(cap.layers or ())}; training captured {describe(truth)} ({truth_source})")
        if cap.fell_back:
            words = f"{rel} finds no ids ({cap.fallback_why}) and captures {describe(cap.layers or ())}; " \
                    f"training captured {describe(truth)} ({truth_source})"
        if not shared.get(rel.engine, True) and prio[rel.engine] != rel:
            found.append(_f(
                "warning", ENGINE_NEEDS_OTHER_IDS,
                f"{words}. No single {fld} list is right for every {rel.engine} release asked; it is written "
                f"for {prio[rel.engine]}; for {rel} write {list(need) if need else 'nothing: it cannot capture them'}",
                fix))
        else:
            found.append(_f("error", ENGINE_CAPTURES_OTHER, words + (
                f"; {rel} needs {fld} = {list(need)}" if need else f"; {rel} cannot capture them"), fix))
    return rows, found


def _int_ids(value: Any) -> list[int] | None:
    if not isinstance(value, (list, tuple)):
        return None
    if any(isinstance(i, bool) or not isinstance(i, int) for i in value):
        return None
    return list(value)


def check_wiring(
    config: Mapping | None,
    *,
    records: Sequence[TrainingRecord] = (),
    fc_in: int | None = None,
    target_hidden: int | None = None,
    num_layers: int | None = None,
    target: str | None = None,
    source_format: str | None = None,
    fix_command: str = "eagle3conv config CKPT --target TARGET",
    family: str | None = None,
    engines: Sequence[Any] | None = None,
    explicit_engines: bool = False,
) -> WiringReport:
    """Check the aux-layer wiring of a (fixed) drafter config. Never raises for
    a wrong wiring: every problem is a :class:`Finding`; see :meth:`WiringReport.raise_for_errors`.

    ``records`` come most authoritative first (:func:`~eagle3conv.wiring.metadata.find_training_record`);
    ``fix_command`` is the command printed to fix a disagreement. With the target's
    layer count known, every release in ``engines`` (default:
    :func:`~eagle3conv.spec.engines.default_engines`; ``explicit_engines``: the user
    named them with --engine) gets a row in :attr:`WiringReport.engines` saying which
    layers it captures from this config on a target of ``family``.
    """
    config = config or {}
    rep = WiringReport(None, None, None, num_layers, target)
    add = rep.findings.append
    n = num_layers

    # 1. what fc reads
    if fc_in is not None and target_hidden:
        if fc_in % target_hidden:
            add(_f("error", FC_WIDTH,
                        f"fc reads {fc_in} features, not a multiple of the target hidden size {target_hidden}"))
        else:
            rep.num_aux = fc_in // target_hidden

    # 2. the training records
    named = [r for r in records if r.layers is not None]
    if named:
        rep.record, rep.layers = named[0], named[0].layers
        for other in named[1:]:
            if other.layers != rep.layers:
                add(_f(
                    "error", RECORDS_DISAGREE,
                    f"training records disagree: {rep.record.describe()} but {other.describe()}",
                    "remove or correct the wrong record (training_metadata.json is read first)",
                ))
        truth = rep.layers
        assert truth is not None
        if n is not None:
            try:
                validate_refs(truth, n)
            except WiringError as err:
                add(_f("error", RECORD_RANGE, f"the training record does not fit the target: {err.message}"))
        if rep.num_aux is not None and len(truth) != rep.num_aux:
            add(_f(
                "error", RECORD_COUNT,
                f"training captured {len(truth)} layers ({describe(truth)}) but fc reads {rep.num_aux} "
                f"({fc_in} in-features / T {target_hidden}): the record belongs to another drafter",
            ))
        if any(r.is_embedding for r in truth):
            add(_f(
                "error", TRAINED_ON_EMBEDDING,
                f"training captured {describe(truth)}: SGLang cannot capture the embedding output "
                "(no residual before layer 0), so SGLang cannot serve this drafter as trained",
                "serve it on vLLM (its ids count the embedding as 0) or retrain on layer outputs",
            ))
    truth = rep.layers

    if config.get("eagle_config") is not None and not isinstance(config.get("eagle_config"), Mapping):
        add(_f("error", BAD_EAGLE_CONFIG,
                    f"eagle_config must be an object holding eagle_aux_hidden_state_layer_ids, got "
                    f"{config['eagle_config']!r}: SGLang cannot read its aux ids from it", fix_command))
    declared = aux_ids(config)
    sg_raw, vl_raw = declared.nested, declared.top_level

    def list_checks(fld: str, ids: list[int], who: str) -> bool:
        ok = True
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            add(_f("error", DUPLICATE_IDS, f"{fld} = {ids} repeats id {dup[0]}: each slot needs its own state",
                        fix_command))
            ok = False
        elif not is_ascending(ids):
            add(_f(
                "error", UNSORTED_IDS,
                f"{fld} = {ids} is not ascending: {who} concatenates the captured states in layer order, "
                "so the slots would not be the order fc was trained on", fix_command))
            ok = False
        if rep.num_aux is not None and len(ids) != rep.num_aux:
            add(_f(
                "error", ID_COUNT,
                f"{fld} names {len(ids)} layers but fc reads {rep.num_aux} "
                f"({fc_in} in-features / T {target_hidden})", fix_command))
            ok = False
        return ok

    # every asked engine release, by its rules (docs/facts.md §9); attached in step 6
    rows: list = []
    found: list = []
    if n is not None:
        from eagle3conv.spec.engines import default_engines

        asked = tuple(engines) if engines else default_engines()
        rows, found = engine_rows(config, truth, rep.record.source if rep.record else None, family, n, asked,
                                  explicit=bool(engines) and explicit_engines, fix_command=fix_command)
    # what each asked SGLang release reads from the nested ids: these name the releases, where the two
    # generic numberings below (before/after PR #25454) can only name the change
    sg_rows = [r for r in rows if r["engine"].startswith("sglang") and r["reads"] == SGLANG_FIELD
               and not r["fell_back"]]

    # 3. SGLang's nested ids
    if sg_raw is not None:
        ids = _int_ids(sg_raw)
        if ids is None or not ids:
            add(_f("error", BAD_IDS, f"{SGLANG_FIELD} must be a non-empty list of integers, got {sg_raw!r}",
                        fix_command))
        else:
            list_checks(SGLANG_FIELD, ids, "SGLang")
            reads: dict[str, str] = {}
            means: dict[str, LayerSet] = {}
            for version in SGLANG_VERSIONS:
                try:
                    means[version] = to_refs(ids, version, n)
                    reads[version] = describe(means[version])
                except (WiringError, UsageError) as err:
                    reads[version] = f"fails: {err.message}"
            rep.reads[SGLANG_FIELD] = reads
            if -1 in ids:
                told = f"; training captured {describe(truth)} ({rep.record.source})" if truth else ""
                add(_f(
                    "error", EMBEDDING_FOR_SGLANG,
                    f"config includes the embedding output ({SGLANG_FIELD} = {ids}, id -1){told}. "
                    "SGLang cannot capture the embedding output (no residual before layer 0)",
                    fix_command))
            elif not means:
                add(_f("error", IDS_UNREADABLE,
                            f"{SGLANG_FIELD} = {ids}: no SGLang version can use these ids ({reads['sglang-old']})",
                            fix_command))
            elif sg_rows:
                words = "; ".join(f"{r['release']} reads {r['captures'] or 'nothing: ' + str(r['error'])}"
                                  for r in sg_rows)
                releases = ", ".join(r["release"] for r in sg_rows)
                if truth is None:
                    add(_f(
                        "warning", UNVERIFIED_IDS,
                        f"{SGLANG_FIELD} = {ids} ({words}); no training record says which layers the drafter "
                        "was trained on",
                        "record them: eagle3conv config CKPT --target TARGET --trained-on IDS "
                        "--captured-at input|output"))
                elif all(r["ok"] for r in sg_rows):
                    add(_f("ok", SGLANG_IDS, f"{SGLANG_FIELD} = {ids} means {describe(truth)} in {releases}, "
                                             "as trained"))
                elif not any(r["ok"] for r in sg_rows):
                    add(_f(
                        "error", DISAGREES_WITH_TRAINING,
                        f"config ids {SGLANG_FIELD} = {ids} do not mean the trained layers in any asked SGLang "
                        f"release: {words}; training captured {describe(truth)} ({rep.record.source})",
                        fix_command))
                # some releases right, some not: each wrong one has its own engine row error (step 6)
            elif truth is not None:
                right = [v for v, m in means.items() if m == truth]
                if len(right) == 2:
                    add(_f("ok", SGLANG_IDS,
                                f"{SGLANG_FIELD} = {ids} means {describe(truth)} in old and new SGLang, as trained"))
                elif right:
                    (good,) = right
                    bad = next(v for v in SGLANG_VERSIONS if v != good)
                    try:
                        need = f"needs {list(to_ids(truth, bad, n))}"
                    except WiringError:
                        need = "cannot capture them"
                    got = reads[bad] if bad in means else "nothing usable"
                    add(_f(
                        "warning", SGLANG_VERSION,
                        f"{SGLANG_FIELD} = {ids} means {describe(truth)} (as trained) only in "
                        f"{SGLANG_VERSIONS[good]}; {SGLANG_VERSIONS[bad]} reads {got} and {need}",
                        f"{fix_command} --sglang-version {bad.removeprefix('sglang-')}"))
                else:
                    words = "; ".join(f"{SGLANG_VERSIONS[v]} reads {reads[v]}" for v in SGLANG_VERSIONS)
                    add(_f(
                        "error", DISAGREES_WITH_TRAINING,
                        f"config ids {SGLANG_FIELD} = {ids} do not mean the trained layers: {words}; "
                        f"training captured {describe(truth)} ({rep.record.source})",
                        fix_command))
            else:
                add(_f(
                    "warning", UNVERIFIED_IDS,
                    f"{SGLANG_FIELD} = {ids} ({'; '.join(f'{SGLANG_VERSIONS[v]}: {reads[v]}' for v in reads)}); "
                    "no training record says which layers the drafter was trained on",
                    "record them: eagle3conv config CKPT --target TARGET --trained-on IDS --captured-at input|output"))

    # 4. vLLM's top-level ids
    if vl_raw is not None:
        ids = _int_ids(vl_raw)
        if ids is None or not ids:
            add(_f("error", BAD_IDS, f"{VLLM_FIELD} must be a non-empty list of integers, got {vl_raw!r}",
                        fix_command))
        else:
            list_checks(VLLM_FIELD, ids, "vLLM")
            try:
                meant = to_refs(ids, "input", n)
                rep.reads[VLLM_FIELD] = {"vllm": describe(meant)}
                if truth is not None and meant != truth:
                    add(_f(
                        "error", DISAGREES_WITH_TRAINING,
                        f"config ids {VLLM_FIELD} = {ids} mean {describe(meant)} to vLLM (input-of-layer ids); "
                        f"training captured {describe(truth)} ({rep.record.source})", fix_command))
            except (WiringError, UsageError) as err:
                rep.reads[VLLM_FIELD] = {"vllm": f"fails: {err.message}"}
                add(_f("error", IDS_UNREADABLE, f"{VLLM_FIELD} = {ids}: {err.message}", fix_command))

    # 5. engines falling back to their defaults
    defaults = None
    if n is not None and n >= 4:
        defaults = engine_defaults(n)
    default_refs = defaults["output"].refs if defaults else None
    default_words = (describe(default_refs) if default_refs else
                     "outputs of layers 1, N//2-1, N-4 of an N-layer target")
    if sg_raw is None and vl_raw is None:
        ids_line = ""
        if defaults:
            ids_line = (f" (SGLang's fallback {list(defaults['sglang'].ids)} used raw, vLLM "
                        f"{list(defaults['input'].ids)}, TensorRT-LLM {list(defaults['output'].ids)})")
        if truth is not None and default_refs is not None and truth != default_refs:
            add(_f(
                "error", DEFAULTS_DISAGREE,
                f"config has no aux-layer ids, so every engine uses its default, the {default_words}{ids_line}; "
                f"training captured {describe(truth)} ({rep.record.source})", fix_command))
        else:
            if truth is None:
                what = "no training record says whether that is what the drafter was trained on"
            elif default_refs is None:
                what = f"training captured {describe(truth)}; give --target to tell whether they agree"
            else:
                what = "that matches the training record, but write it down"
            add(_f(
                "warning", NO_IDS,
                f"config has no aux-layer ids: every engine will use its default, the {default_words}{ids_line}; {what}",
                fix_command if truth is not None else
                "eagle3conv config CKPT --target TARGET --trained-on IDS --captured-at input|output"))
            if source_format in _SPECFORGE_FORMATS and truth is None:
                mid = f"{n // 2}" if n else "N//2"
                add(_f(
                    "warning", SPECFORGE_WINDOW,
                    f"a SpecForge drafter with no recorded layers: online runs between 2025-09-01 and 2025-10-20 "
                    f"captured middle layer {mid} instead of {n // 2 - 1 if n else 'N//2-1'} (SpecForge #240), "
                    "which no engine default matches; check its training date or run verify --search-wiring"))
    elif sg_raw is None:
        if truth is not None and default_refs is not None and truth != default_refs:
            add(_f(
                "error", SGLANG_DEFAULT,
                f"SGLang reads aux ids only from {SGLANG_FIELD}, which is absent: SGLang will capture its default, "
                f"the {default_words}; training captured {describe(truth)} ({rep.record.source})", fix_command))
        else:
            add(_f("warning", SGLANG_DEFAULT,
                        f"SGLang reads aux ids only from {SGLANG_FIELD}, which is absent: it will use its default, "
                        f"the {default_words}", fix_command))
    elif vl_raw is None:
        add(_f("warning", VLLM_DEFAULT,
                    f"vLLM reads the top-level {VLLM_FIELD}, which is absent: vLLM will use its default, the "
                    f"{default_words}", fix_command))
    # 6. every asked engine release, by its rules (docs/facts.md §9), computed above
    if n is not None:
        rep.engines = rows
        # what each release reads, by its own rules (replaces the two generic SGLang numberings)
        rep.reads = {}
        for row in rows:
            if not row["fell_back"] and not row["reads"].startswith("launch option"):
                rep.reads.setdefault(row["reads"], {})[row["release"]] = row["captures"] or f"fails: {row['error']}"
        # the per-release rows replace the two-numbering SGLang verdict
        rep.findings = [f for f in rep.findings if f.code != SGLANG_VERSION] + found
    return rep
