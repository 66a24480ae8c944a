"""The wiring check: config.json vs training records vs weights vs target, per engine release.

:func:`check_wiring` answers "will each engine release asked feed this drafter the target
states it was trained on?" in four named steps, each adding :class:`~eagle3conv.findings.Finding` s
to a :class:`WiringReport`:

1. :func:`fc_slots` -- how many aux states ``fc`` reads (its in-features / T);
2. :func:`training_record` -- the layers the most authoritative record names, and whether
   the records agree, fit the target and match ``fc``;
3. :func:`id_lists` -- each id list the config declares: repeats, depth order, count vs ``fc``;
4. :func:`engine_rows` -- per release asked, what it captures from this config by the engine
   rules (:mod:`eagle3conv.spec.engines`, the one engine model), as an
   :class:`~eagle3conv.spec.engines.EngineRow`, beside the record; then :func:`summary` says
   what the rows together mean (no ids anywhere, a field the config leaves out, ids no record
   confirms).

Every statement about an engine comes from its rows; nothing here knows a release, a field
name or an id shift (docs/facts.md §5, §9).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eagle3conv.errors import UsageError, WiringError
from eagle3conv.findings import (
    AUX_LAYERS,
    BAD_EAGLE_CONFIG,
    DEFAULT_CANNOT_CAPTURE,
    DEFAULT_USED,
    DEFAULTS_DISAGREE,
    DISAGREES_WITH_TRAINING,
    DUPLICATE_IDS,
    ENGINE_CAPTURES_OTHER,
    ENGINE_NEEDS_OTHER_IDS,
    ENGINE_UNSUPPORTED,
    FC_WIDTH,
    ID_COUNT,
    IDS_AS_TRAINED,
    NO_IDS,
    RECORD_COUNT,
    RECORD_RANGE,
    RECORDS_DISAGREE,
    SPECFORGE_WINDOW,
    TRAINED_ON_EMBEDDING,
    UNSORTED_IDS,
    UNVERIFIED_IDS,
    Finding,
)
from eagle3conv.spec.alike import alike
from eagle3conv.spec.drafter import aux_ids
from eagle3conv.spec.engines import (
    KIND_WORDS,
    EngineRelease,
    EngineRow,
    IdsPlan,
    capture,
    default_engines,
    serve_finding,
    id_field,
    plan_ids,
)
from eagle3conv.spec.layers import LayerSet, describe, is_ascending, validate_refs
from eagle3conv.wiring.metadata import TrainingRecord

_SPECFORGE_FORMATS = ("specforge", "specforge-runtime")
RECORD_COMMAND = "eagle3conv config CKPT --target TARGET --trained-on IDS --captured-at input|output"


def _f(level: str, code: str, message: str, fix: str | None = None, subject: str | None = None) -> Finding:
    """A finding of the wiring check (area ``aux-layers``)."""
    return Finding(level, AUX_LAYERS, code, message, fix, subject)  # type: ignore[arg-type]


@dataclass(frozen=True)
class WiringReport:
    """The result of :func:`check_wiring` (its findings completed once, by
    :func:`eagle3conv.wiring.apply.assembled`)."""

    layers: LayerSet | None
    """What the drafter was trained on (the first training record naming layers)."""
    record: TrainingRecord | None
    num_aux: int | None
    """``fc``'s in-features / T, when the weights are known."""
    num_layers: int | None
    target: str | None
    findings: tuple[Finding, ...] = ()
    rows: tuple[EngineRow, ...] = ()
    """Per engine release asked: what it captures from this config (see :func:`engine_rows`)."""

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

    def reads(self) -> dict[str, dict[str, str]]:
        """Per config field: what each release reading it captures, in words (from the rows)."""
        out: dict[str, dict[str, str]] = {}
        for row in self.rows:
            cap = row.capture
            if cap.field is not None and cap.field.in_config:
                out.setdefault(cap.field.name, {})[str(row.release)] = (
                    describe(cap.layers) if cap.layers is not None else
                    f"fails: {cap.error.message}" if cap.error else f"not known: {cap.unknown}")
        return out

    def row_groups(self) -> list[tuple[EngineRow, ...]]:
        """The rows in groups that read alike (neighbouring releases of one engine whose rows are the
        same but for the release's name), in order: the text shows each group as one row."""
        rows = [(r, r.to_dict()) for r in self.rows]

        def body(x) -> str:  # every field but the release's name (an error's leading name set aside)
            d = x[1]
            return json.dumps({**{k: v for k, v in d.items() if k not in ("engine", "release")},
                               "error": d["error"] and d["error"].removeprefix(f"{d['release']} ")},
                              sort_keys=True, default=str)

        return [tuple(r for r, _ in group) for group in alike(rows, lambda x: x[0].release.engine, body)]

    def engine_rows(self) -> list[dict]:
        """The rows for the report, each with ``releases``: the releases whose rows read alike with it
        (:meth:`row_groups`; itself included)."""
        out = []
        for group in self.row_groups():
            names = [str(r.release) for r in group]
            out += [dict(r.to_dict(), releases=names) for r in group]
        return out

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
            "config_reads": self.reads(),
            "engines": self.engine_rows(),
            "findings": [{"level": f.level, "code": f.code, "message": f.message, "fix": f.fix,
                          "subject": f.subject} for f in self.findings],
        }


# --------------------------------------------------------------------------- steps 1-3


def fc_slots(fc_in: int | None, target_hidden: int | None, found: list[Finding]) -> int | None:
    """Step 1: how many aux states ``fc`` reads."""
    if fc_in is None or not target_hidden:
        return None
    if fc_in % target_hidden:
        found.append(_f("error", FC_WIDTH,
                        f"fc reads {fc_in} features, not a multiple of the target hidden size {target_hidden}"))
        return None
    return fc_in // target_hidden


def training_record(records: Sequence[TrainingRecord], num_layers: int | None, num_aux: int | None,
                    fc_in: int | None, target_hidden: int | None,
                    found: list[Finding]) -> TrainingRecord | None:
    """Step 2: the most authoritative record naming layers, checked against the others, the
    target's layer count and ``fc``."""
    named = [r for r in records if r.layers is not None]
    if not named:
        return None
    first, truth = named[0], named[0].layers
    assert truth is not None
    for other in named[1:]:
        if other.layers != truth:
            found.append(_f("error", RECORDS_DISAGREE,
                            f"training records disagree: {first.describe()} but {other.describe()}",
                            "remove or correct the wrong record (training_metadata.json is read first)"))
    if num_layers is not None:
        try:
            validate_refs(truth, num_layers)
        except WiringError as err:
            found.append(_f("error", RECORD_RANGE, f"the training record does not fit the target: {err.message}"))
    if num_aux is not None and len(truth) != num_aux:
        found.append(_f("error", RECORD_COUNT,
                        f"training captured {len(truth)} layers ({describe(truth)}) but fc reads {num_aux} "
                        f"({fc_in} in-features / T {target_hidden}): the record belongs to another drafter"))
    if any(r.is_embedding for r in truth):
        found.append(_f("warning", TRAINED_ON_EMBEDDING,
                        f"training captured {describe(truth)}, the embedding output included: only engines that "
                        "capture before layer 0 can serve this drafter as trained (the rows below say which)",
                        "serve it on an engine whose row is ok, or retrain on layer outputs"))
    return first


def id_lists(config: Mapping, num_aux: int | None, fc_in: int | None, target_hidden: int | None,
             fix_command: str, found: list[Finding]) -> None:
    """Step 3: each id list the config declares, as a list (what each release makes of it is
    step 4's): no repeats, depth order, as many ids as ``fc`` reads."""
    nested = config.get("eagle_config")
    if nested is not None and not isinstance(nested, Mapping):
        found.append(_f("error", BAD_EAGLE_CONFIG,
                        f"eagle_config must be an object holding the aux ids, got {nested!r}: engines that read "
                        "their ids there cannot read them", fix_command))
    for fld, ids in aux_ids(config).fields().items():
        if not isinstance(ids, list) or not ids or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
            continue  # the rows say it, per release reading the field
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            found.append(_f("error", DUPLICATE_IDS,
                            f"{fld} = {ids} repeats id {dup[0]}: each slot needs its own state", fix_command))
        elif not is_ascending(ids):
            found.append(_f("error", UNSORTED_IDS,
                            f"{fld} = {ids} is not ascending: the engines concatenate the captured states in layer "
                            "order, so the slots would not be the order fc was trained on", fix_command))
        if num_aux is not None and len(ids) != num_aux:
            found.append(_f("error", ID_COUNT, f"{fld} names {len(ids)} layers but fc reads {num_aux} "
                                               f"({fc_in} in-features / T {target_hidden})", fix_command))


# --------------------------------------------------------------------------- step 4: the rows


def priority_releases(releases: Sequence[EngineRelease], explicit: bool) -> dict[str, EngineRelease]:
    """Per engine, the release whose reading wins when no single id list serves every asked
    release: the first one asked (``--engine``), else the newest of the default set."""
    out: dict[str, EngineRelease] = {}
    for rel in releases:
        if rel.engine not in out:
            out[rel.engine] = rel
        elif not explicit and rel.version > out[rel.engine].version:
            out[rel.engine] = rel
    return out


def _shared(plan: IdsPlan, releases: Sequence[EngineRelease], engine: str, family: str | None,
            n: int | None) -> bool:
    """Whether the id list planned for each field serves every asked release of ``engine``."""
    from eagle3conv.spec.drafter import with_field

    for rel in (r for r in releases if r.engine == engine):
        where = id_field(rel)
        ids = plan.ids(where)
        if not where.in_config:
            continue
        if ids is None or capture(rel, with_field({}, where.name, list(ids)), family, n).layers != plan.layers:
            return False
    return True


def _judge(rel: EngineRelease, row_capture, truth: LayerSet | None, source: str | None, need,
           *, explicit: bool, shared: bool, priority: bool, fix: str,
           field_right: bool) -> tuple[Finding | None, bool | None]:
    """One row's finding (None: as trained, or nothing to say) and whether it is as trained.
    ``field_right``: some release reading the same field captures the trained layers from it; when
    none does, the config's ids contradict the record (:data:`DISAGREES_WITH_TRAINING`, which
    fix-keys refuses to overwrite without --rewire) rather than serve one release and not another."""
    cap = row_capture
    subject = rel.spec
    told = f"; training captured {describe(truth)} ({source})" if truth is not None else ""
    contradicts = truth is not None and not cap.fell_back and not field_right
    if cap.error is not None:
        lenient = cap.error.code in (ENGINE_UNSUPPORTED, DEFAULT_CANNOT_CAPTURE) and not explicit
        code = DISAGREES_WITH_TRAINING if contradicts and cap.error.code != ENGINE_UNSUPPORTED else cap.error.code
        return _f("warning" if lenient else "error", code, cap.error.message + told,
                  None if cap.error.code == ENGINE_UNSUPPORTED else fix, subject), (False if truth else None)
    if truth is None or cap.layers is None:
        return None, None
    if cap.layers == truth:
        return None, True
    if cap.fell_back:
        words = (f"{rel} finds no ids ({cap.fallback_why}) and captures {describe(cap.layers)}; training "
                 f"captured {describe(truth)} ({source})")
    else:
        words = (f"{rel} reads {cap.field} {list(cap.ids or ())} ({KIND_WORDS[cap.kind or 'raw']}) and captures "
                 f"{describe(cap.layers)}; training captured {describe(truth)} ({source})")
    where = id_field(rel)
    if not shared and not priority:
        own = fix if "--engine" in fix else f"{fix} --engine {rel.spec}"
        return _f("warning", ENGINE_NEEDS_OTHER_IDS,
                  f"{words}. No single {where} list is right for every {rel.engine} release asked; for {rel} "
                  f"write {list(need) if need else 'nothing: it cannot capture them'}", own, subject), False
    tail = f"; {rel} needs {where} = {list(need)}" if need else f"; {rel} cannot capture them"
    code = DEFAULTS_DISAGREE if cap.fell_back else DISAGREES_WITH_TRAINING if contradicts else ENGINE_CAPTURES_OTHER
    return _f("error", code, words + tail, fix, subject), False


def engine_rows(config: Mapping, truth: LayerSet | None, source: str | None, family: str | None,
                num_layers: int | None, releases: Sequence[EngineRelease], *, explicit: bool,
                fix_command: str, num_aux: int | None = None) -> tuple[EngineRow, ...]:
    """Step 4: what each release captures from ``config`` on a target of ``family`` (its layer
    count may be unknown), one typed row each, with its finding: an error when a release
    cannot capture what the config names, or captures other layers than the record's. When no
    single id list serves every asked release of an engine, only its priority release
    (:func:`priority_releases`) is an error; the others are warnings naming the ids they need."""
    prio = priority_releases(releases, explicit)
    plan = None
    if truth is not None:
        try:
            plan = plan_ids(truth, family, num_layers, releases)
        except (WiringError, UsageError):
            plan = None  # the record does not fit the target: step 2 says so
    caps = []
    for rel in releases:
        where = id_field(rel)
        need = plan.need(rel) if plan is not None else None
        caps.append((rel, where, need, capture(rel, config, family, num_layers,
                                               launch_ids=None if where.in_config else need)))
    right_fields = {cap.field for _, _, _, cap in caps if cap.field is not None and cap.layers == truth}
    rows = []
    for rel, where, need, cap in caps:
        fix = fix_command
        finding, as_trained = None, None
        if where.in_config:
            finding, as_trained = _judge(
                rel, cap, truth, source, need, explicit=explicit, priority=prio[rel.engine] == rel, fix=fix,
                shared=plan is None or _shared(plan, releases, rel.engine, family, num_layers),
                field_right=cap.field in right_fields)
        elif truth is not None and cap.layers is not None:
            as_trained = cap.layers == truth  # a launch option: the launch line passes what it needs
        if (not where.in_config and need is None and cap.layers is not None and num_aux
                and len(cap.layers) != num_aux):
            finding = Finding("warning", AUX_LAYERS, FC_WIDTH,
                              f"{rel} captures {len(cap.layers)} states by default ({describe(cap.layers)}) but the "
                              f"drafter's fc reads {num_aux}: launch it with {num_aux} layers in {where.name}",
                              fix=RECORD_COMMAND, subject=rel.spec)
        rows.append(EngineRow(rel, cap, need, finding, as_trained,
                              runner_assumed=cap.runner is not None and rel.runner is None,
                              serve=serve_finding(rel, config, asked=explicit)))
    return tuple(rows)


def summary(config: Mapping, rows: Sequence[EngineRow], truth: LayerSet | None, source_format: str | None,
            num_layers: int | None, fix_command: str) -> list[Finding]:
    """What the rows mean together, said once: no ids anywhere; a field the config leaves out
    that some releases read; ids that no record confirms; ids right for every release reading
    them."""
    out: list[Finding] = []
    in_config = [r for r in rows if r.field.in_config]
    declared = aux_ids(config).fields()
    record_fix = fix_command if truth is not None else RECORD_COMMAND
    if not declared:
        known = [r for r in in_config if r.layers is not None]
        what = ("; ".join(sorted({f"{r.release} captures {describe(r.layers)}" for r in known}))
                or "which layers that is depends on the target's layer count (pass --target)")
        if truth is None:
            out.append(_f("warning", NO_IDS, f"config has no aux-layer ids: every engine uses its default ({what}); "
                                             "no training record says whether that is what the drafter was trained on",
                          RECORD_COMMAND))
            if source_format in _SPECFORGE_FORMATS:
                mid = f"{num_layers // 2}" if num_layers else "N//2"
                out.append(_f("warning", SPECFORGE_WINDOW,
                              f"a SpecForge drafter with no recorded layers: online runs between 2025-09-01 and "
                              f"2025-10-20 captured middle layer {mid} instead of "
                              f"{num_layers // 2 - 1 if num_layers else 'N//2-1'} (SpecForge #240), which no engine "
                              "default matches; check its training date or run verify --search-wiring"))
        elif all(r.as_trained for r in known) and known:
            out.append(_f("warning", NO_IDS, f"config has no aux-layer ids: every engine uses its default ({what}), "
                                             "which matches the training record, but write it down", record_fix))
        return out
    # a field the config leaves out, read by some releases: they use their default
    for fld in dict.fromkeys(r.field for r in in_config if r.capture.fell_back):
        readers = [r for r in in_config if r.field == fld and r.capture.fell_back and r.finding is None]
        if not readers or any(r.as_trained is False for r in readers):
            continue  # each such row already says what it captures instead, or what is wrong
        caps = "; ".join(f"{r.release} captures {describe(r.layers)}" if r.layers is not None else
                         f"{r.release}: {r.capture.unknown}" for r in readers)
        out.append(_f("warning", DEFAULT_USED, f"{fld} is absent, and {', '.join(str(r.release) for r in readers)} "
                                               f"read{'s' if len(readers) == 1 else ''} aux ids only there: the "
                                               f"default is used ({caps})", record_fix))
    # ids a release reads: confirmed by no record, or right for every release reading them
    for fld, ids in declared.items():
        readers = [r for r in in_config if r.field.name == fld and not r.capture.fell_back and r.capture.ok]
        if not readers:
            continue
        if truth is None:
            words = "; ".join(f"{r.release} reads {describe(r.layers)}" if r.layers is not None else
                              f"{r.release}: {r.capture.unknown}" for r in readers)
            out.append(_f("warning", UNVERIFIED_IDS, f"{fld} = {ids} ({words}); no training record says which "
                                                     "layers the drafter was trained on", RECORD_COMMAND))
        elif all(r.as_trained for r in readers):
            out.append(_f("ok", IDS_AS_TRAINED, f"{fld} = {ids} means {describe(truth)} in "
                                                f"{', '.join(str(r.release) for r in readers)}, as trained"))
    return out


# --------------------------------------------------------------------------- the check


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
    """Check the aux-layer wiring of a (fixed) drafter config. Never raises for a wrong wiring:
    every problem is a :class:`Finding`; see :meth:`WiringReport.raise_for_errors`.

    ``records`` come most authoritative first (:func:`~eagle3conv.wiring.metadata.find_training_record`);
    ``fix_command`` is the command printed to fix a disagreement. Every release in ``engines``
    (default: :func:`~eagle3conv.spec.engines.default_engines`; ``explicit_engines``: the user
    named them with --engine) gets a row, with or without the target's layer count."""
    config = config or {}
    found: list[Finding] = []
    num_aux = fc_slots(fc_in, target_hidden, found)
    record = training_record(records, num_layers, num_aux, fc_in, target_hidden, found)
    layers = record.layers if record else None
    id_lists(config, num_aux, fc_in, target_hidden, fix_command, found)
    releases = tuple(engines) if engines else default_engines()
    rows = engine_rows(config, layers, record.source if record else None, family, num_layers,
                       releases, explicit=bool(engines) and explicit_engines, fix_command=fix_command,
                       num_aux=num_aux)
    found += [f for r in rows for f in (r.finding, r.serve) if f is not None]
    found += summary(config, rows, layers, source_format, num_layers, fix_command)
    return WiringReport(layers, record, num_aux, num_layers, target, tuple(found), tuple(rows))
