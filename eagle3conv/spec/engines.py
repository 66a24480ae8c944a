"""The one model of the serving engines: which target states a release captures, which ids
make it capture a set, how it runs the drafter.

Everything here interprets the engine rules (``mappings/engines/*.json``, read into frozen
types by :mod:`eagle3conv.spec.engine_rules`; docs/facts.md §9 states them in words). No
release, field name or id shift is written in code.

Every engine captures the residual stream at a *boundary* ``b`` between decoder layers:
boundary ``b`` is the input of layer ``b``, i.e. the output of layer ``b-1``; boundary 0 is
the embedding output and boundary ``N`` the last layer's output. A rule says how the ids a
release reads become boundaries, and whether boundaries 0 and ``N`` are reachable.

Main entry points: :func:`parse_engine` and :func:`default_engines` (releases, typed),
:func:`capture` (config -> what a release captures, and why; the target's layer count may be
unknown, and then the result says what cannot be known), :func:`ids_for` (layers -> the ids
that make a release capture them), :func:`plan_ids` (layers -> the id list each config
field should hold so that every release asked captures them), :class:`EngineRow` (one
release's reading of one config, the row every report shows) and :func:`serving` (how a
release runs the drafter: one frozen :class:`Run`). Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from eagle3conv.errors import MappingFileError, UsageError
from eagle3conv.findings import (
    AUX_LAYERS,
    BAD_IDS,
    CANNOT_SERVE,
    CAPTURE_SWITCHED_OFF,
    CONFIG,
    DEFAULT_CANNOT_CAPTURE,
    ENGINE_CANNOT_CAPTURE,
    ENGINE_UNSUPPORTED,
    FC_WIDTH,
    SERVED_WITHOUT,
    Finding,
)
from eagle3conv.spec.canonical import EMBED, LM_HEAD
from eagle3conv.spec.drafter import LATER_LAYER_NORMS, architecture_key, read_field
from eagle3conv.spec.engine_rules import (  # noqa: F401 (re-exported: the rules' public types)
    ANY,
    DEFAULT_KINDS,
    DRAFTER_KINDS,
    ENGINE_FILES,
    EXPLICIT_KINDS,
    FAMILIES_FILE,
    FORWARD_VALUES,
    KIND_WORDS,
    SCHEMA,
    Engine,
    Family,
    FcWidth,
    Forward,
    IdField,
    IdRead,
    IdsSource,
    ReleaseRange,
    Rule,
    Version,
    check_family,
    default_term,
    engines,
    families,
    family_for,
    load_engine_file,
    load_families_file,
    load_rules_folder,
    parse_range,
    parse_version,
    shown,
)
from eagle3conv.spec.variants import Handling, Switch, switch, switches
from eagle3conv.spec.layers import LayerRef, LayerSet, check_num_layers, describe, validate_refs

# --------------------------------------------------------------------------- releases


@dataclass(frozen=True)
class EngineRelease:
    """One engine at one release. ``version`` is () and ``release`` None for an engine whose
    rules are not pinned to releases (TensorRT-LLM). ``release`` is the release as the data
    names it, or as asked when it was not read (``note`` says how it is read then)."""

    engine: str
    version: Version
    release: str | None
    note: str | None = field(default=None, compare=False)
    runner: str | None = None
    """The runner asked for (``vllm==0.33.0:runner=v1``); None: the engine's default."""

    @property
    def label(self) -> str:
        """``sglang 0.5.12``: how reports name it."""
        return f"{self.engine} {self.release}" if self.release else self.engine

    @property
    def spec(self) -> str:
        """``sglang==0.5.12``, ``vllm==0.33.0:runner=v1``: how to ask for it with ``--engine``."""
        text = f"{self.engine}=={self.release}" if self.release else self.engine
        return f"{text}{RUNNER_SUFFIX}{self.runner}" if self.runner else text

    def __str__(self) -> str:
        return f"{self.label} ({self.runner} runner)" if self.runner else self.label

    def to_dict(self) -> dict:
        return {"engine": self.engine, "release": self.release, "spec": self.spec, "label": str(self),
                "runner": self.runner, "note": self.note}


def _engine_named(name: str) -> Engine:
    from eagle3conv.spec.engine_rules import rules_data

    table = rules_data()
    key = table[2].get(name.strip().lower())
    if key is None:
        raise UsageError(
            f"unknown engine '{shown(name)}'; known: {', '.join(sorted(table[2]))}",
            hint="write ENGINE or ENGINE==RELEASE, e.g. sglang==0.5.23",
        )
    return table[1][key]


RUNNER_SUFFIX = ":runner="


def parse_engine(text: str) -> EngineRelease:
    """``"sglang==0.5.23"``, ``"vllm==0.33"``, ``"sglang"`` (newest release read),
    ``"trtllm"``, ``"vllm==0.33.0:runner=v1"`` (a runner other than the engine's
    default). A release that was not read gets a ``note``: newer than every release
    read -> read as the newest, older -> as the oldest, in between -> the rules of its
    range apply. Raises :class:`UsageError` for an unknown engine, release or runner."""
    if not isinstance(text, str) or not text.strip():
        raise UsageError("an engine must be written ENGINE or ENGINE==RELEASE, e.g. sglang==0.5.23")
    body, has_runner, runner = text.strip().partition(RUNNER_SUFFIX)
    rel = _parse_release(body if has_runner else text.strip())
    if not has_runner:
        return rel
    eng = engines()[rel.engine]
    if not runner.strip():
        raise UsageError(f"'{shown(text)}': no runner after '{RUNNER_SUFFIX}'",
                         hint=f"e.g. vllm==0.33.0{RUNNER_SUFFIX}v1")
    return replace(rel, runner=_runner(eng, runner.strip()))


def _parse_release(text: str) -> EngineRelease:
    name, sep, release = text.strip().partition("==")
    engine = _engine_named(name)
    if sep and not release.strip():
        raise UsageError(f"'{shown(text)}': no release after '=='", hint="e.g. sglang==0.5.23")
    if not engine.releases:
        note = None
        if sep:
            parse_version(release)
            note = (f"{engine.title} rules are not pinned to releases; {release.strip()} is read "
                    "with the same rules (docs/facts.md §9)")
        return EngineRelease(engine.name, (), None, note)
    if not sep:
        version, label = engine.releases[-1]
        return EngineRelease(engine.name, version, label)
    wanted = parse_version(release)
    for version, label in engine.releases:
        if version == wanted:
            return EngineRelease(engine.name, version, label)
    newest, oldest = engine.releases[-1], engine.releases[0]
    asked = f"{engine.name} {release.strip()}"
    if wanted > newest[0]:
        return EngineRelease(engine.name, newest[0], newest[1],
                             f"{asked} is not known; read as {newest[1]}, the newest known")
    if wanted < oldest[0]:
        return EngineRelease(engine.name, oldest[0], oldest[1],
                             f"{asked} is not known; read as {oldest[1]}, the oldest known "
                             "(older releases were not read)")
    return EngineRelease(engine.name, wanted, release.strip(),
                         f"{asked} was not read; the rules of its release range apply")


def default_engines() -> tuple[EngineRelease, ...]:
    """The releases a check covers when none is asked for: each engine's ``check_by_default``
    (mappings/engines/*.json), in file order."""
    out = []
    for name in ENGINE_FILES:
        eng = engines()[name]
        for label in eng.check_by_default:
            out.append(parse_engine(name if label == "newest" else f"{name}=={label}"))
    return tuple(out)


def edge_release(engine: str, which: str) -> EngineRelease:
    """The ``oldest`` or ``newest`` release read of ``engine`` (``--sglang-version old|new``)."""
    eng = engines()[engine]
    label = eng.oldest if which == "oldest" else eng.newest
    return parse_engine(f"{engine}=={label}" if label else engine)


def as_release(engine: EngineRelease | str) -> EngineRelease:
    return engine if isinstance(engine, EngineRelease) else parse_engine(engine)


def _pick(items: Iterable[Any], version: Version, what: str, engine: Engine) -> Any:
    for item in items:
        if not version or version in item.releases:
            return item
    raise MappingFileError(f"engine rules {engine.path}: no {what} covers this release")  # validated at load


def rule_for(engine: EngineRelease | str, family: str | None) -> Rule:
    """The rule an engine release applies to a target family (None: the rule for
    families the table does not single out)."""
    rel = as_release(engine)
    eng = engines()[rel.engine]
    if family is not None:
        check_family(family)
        own = [r for r in eng.rules if r.family == family]
        for r in own:
            if not rel.version or rel.version in r.releases:
                return r
    return _pick([r for r in eng.rules if r.family == ANY], rel.version, "rule for '*'", eng)


def _source(eng: Engine, rel: EngineRelease, runner: str | None) -> IdsSource:
    return _pick([s for s in eng.capture_ids if s.runners is None or runner in s.runners],
                 rel.version, "capture_ids", eng)


def _runner(eng: Engine, runner: str | None) -> str | None:
    if not eng.runners:
        if runner is not None:
            raise UsageError(f"{eng.title} has no runner choice; got runner '{shown(runner)}'")
        return None
    if runner is None:
        return eng.default_runner
    if runner not in eng.runners:
        raise UsageError(f"unknown {eng.title} runner '{shown(runner)}'; known: {', '.join(eng.runners)}")
    return runner


def id_field(engine: EngineRelease | str, runner: str | None = None) -> IdField:
    """Where the ids a release reads first live: a config field or a launch option."""
    rel = as_release(engine)
    eng = engines()[rel.engine]
    return _source(eng, rel, _runner(eng, runner if runner is not None else rel.runner)).read[0].where


# --------------------------------------------------------------------------- capture


@dataclass(frozen=True)
class Capture:
    """What one engine release captures for one drafter config on one target."""

    engine: EngineRelease
    family: str | None
    runner: str | None
    field: IdField | None
    """Where the ids were read from; None when none were found (the release's default)."""
    ids: tuple[int, ...] | None
    """The ids as read (after a field's own shift), or the default list; None when unreadable."""
    fell_back: bool
    fallback_why: str | None
    kind: str | None
    """The rule kind applied to ``ids`` (see :data:`KIND_WORDS`)."""
    layers: LayerSet | None
    """The captured states in the order the drafter's fc receives them (depth order); None when
    they cannot be captured (:attr:`error`) or cannot be known (:attr:`unknown`)."""
    fc_field: str | None
    """What sizes the drafter's fc: a config field, ``"default (3)"``, or None when not known."""
    fc_slots: int | None
    error: Finding | None
    """Why the release cannot capture what the config asks (area aux-layers, level error)."""
    unknown: str | None
    """What cannot be told without the target's layer count (its default, a rule that compares
    ids with the layer count), in words; None when the answer is known."""
    why: str
    source: str
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def reads(self) -> str:
        """The field read, in words: ``eagle_config.eagle_aux_hidden_state_layer_ids``, ``launch option
        eagle3_layers_to_capture`` or ``default``."""
        return "default" if self.field is None else str(self.field)


def _int_list(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, (list, tuple)):
        return None
    if any(isinstance(i, bool) or not isinstance(i, int) for i in value):
        return None
    return tuple(value)


def drafter_kind(config: Mapping[str, Any] | None) -> str:
    """``mla`` for the MLA drafter architecture, else ``llama``."""
    return architecture_key(config)


def _fc(eng: Engine, rel: EngineRelease, config: Mapping[str, Any] | None) -> tuple[str | None, int | None]:
    kind = drafter_kind(config)
    entries = [f for f in eng.fc_width if kind in f.drafters]
    if not entries:
        return None, None
    fc = _pick(entries, rel.version, "fc_width", eng)
    for read in fc.read:
        found, value = read_field(config, read.field)
        if read.as_ == "count" and found and isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return read.field, value
        if read.as_ == "length" and found and isinstance(value, list) and value:
            return read.field, len(value)
    return f"default ({fc.fallback})", fc.fallback


def fc_fix(engine: EngineRelease | str, config: Mapping[str, Any] | None, k: int) -> str | None:
    """The config field that would make ``engine`` size the drafter's fc for ``k`` aux states, when
    the config as it is sizes it otherwise (its ``fc_width`` rule's first count field); None when it
    already sizes it for ``k`` or reads no count field."""
    rel = as_release(engine)
    eng = engines()[rel.engine]
    _, slots = _fc(eng, rel, config)
    if slots is None or slots == k:
        return None
    entries = [f for f in eng.fc_width if drafter_kind(config) in f.drafters]
    fc = _pick(entries, rel.version, "fc_width", eng)
    return next((r.field for r in fc.read if r.as_ == "count"), None)


def _boundary_problem(rule: Rule, boundaries: tuple[int, ...], n: int | None, eng: Engine) -> str | None:
    for slot, b in enumerate(boundaries):
        if b == 0 and not rule.embedding:
            return (f"slot {slot} would be the embedding output (before layer 0), which "
                    f"{eng.title} cannot capture for this target")
        if n is not None and b == n and not rule.final_output:
            return (f"slot {slot} would be the output of the last layer ({n - 1}), which "
                    f"{eng.title} never captures for this target (it captures only at a layer's entry)")
        if b < 0 or (n is not None and b > n):
            return (f"slot {slot} would be captured before layer {b}, which "
                    f"{'the target' if n is None else f'a {n}-layer target'} does not have: that state is "
                    "never captured")
    seen = [b for i, b in enumerate(boundaries) if b in boundaries[:i]]
    if seen:
        return f"the state before layer {seen[0]} is named twice: the engine captures it once"
    return None


def _problem(code: str, message: str) -> Finding:
    return Finding("error", AUX_LAYERS, code, message)  # type: ignore[arg-type]


def capture(
    engine: EngineRelease | str,
    config: Mapping[str, Any] | None,
    family: str | None,
    num_layers: int | None,
    runner: str | None = None,
    *,
    launch_ids: Sequence[int] | None = None,
) -> Capture:
    """The target states ``engine`` captures for a drafter with ``config`` (its
    config.json as a dict) on an ``num_layers``-layer target of ``family``.

    ``num_layers=None``: the target's layer count is unknown; explicit ids are read all the
    same (no range check), and what depends on the count (the default list, a rule that
    compares ids with it) is :attr:`Capture.unknown`. ``family=None``: the target's family
    is unknown; the rule for the families the table does not single out applies, with a
    note. ``runner``: vLLM's ``mrv2`` (default) or ``v1``. ``launch_ids``: TensorRT-LLM's
    ``eagle3_layers_to_capture``. Never raises for a bad config: the problem is in
    :attr:`Capture.error`. Raises :class:`UsageError` for an unknown engine, family or runner.
    """
    rel = as_release(engine)
    eng = engines()[rel.engine]
    check_num_layers(num_layers)
    n = num_layers
    run = _runner(eng, runner if runner is not None else rel.runner)
    rule = rule_for(rel, family)
    notes = [rel.note] if rel.note else []
    if family is None:
        notes.append("the target's family is not known; read with the rules for most targets")
    fc_field, fc_slots = _fc(eng, rel, config)
    base = dict(engine=rel, family=family, runner=run, fc_field=fc_field, fc_slots=fc_slots,
                why=rule.why, source=rule.source)

    def result(**kw: Any) -> Capture:
        kw.setdefault("unknown", None)
        return Capture(**base, **kw, notes=tuple(notes))

    nothing = dict(field=None, ids=None, fell_back=False, fallback_why=None, kind=None, layers=None)
    if not rule.supported:
        return result(**nothing, error=_problem(
            ENGINE_UNSUPPORTED, f"{rel} cannot serve an EAGLE-3 drafter on this target: {rule.why}"))
    src = _source(eng, rel, run)
    if src.switch:
        found, value = read_field(config, src.switch)
        if found and value is False:
            return result(**nothing, error=_problem(
                CAPTURE_SWITCHED_OFF, f"{src.switch} is false: {rel} captures no aux states and the drafter "
                                      "gets none"))
    read_ids: tuple[int, ...] | None = None
    used: IdRead | None = None
    for read in src.read:
        if not read.where.in_config:
            found, value = launch_ids is not None, list(launch_ids) if launch_ids is not None else None
        else:
            found, value = read_field(config, read.where.name)
        if not found or value is None or (src.empty_is_absent and value == []):
            continue
        ids = _int_list(value)
        if ids is None:
            return result(**{**nothing, "field": read.where}, error=_problem(
                BAD_IDS, f"{read.where} is {shown(repr(value), 60)}, not a list of integer ids"))
        read_ids, used = tuple(i + read.add for i in ids), read
        if read.add:
            notes.append(f"{read.where} ids are shifted by {read.add:+d} when read")
        break
    looked = ", ".join(r.name for r in src.read)
    if used is None:
        terms = f"[{', '.join(eng.default_ids)}]"
        if n is None:
            return result(field=None, ids=None, fell_back=True, fallback_why=f"no ids in {looked}", kind=None,
                          layers=None, error=None,
                          unknown=f"{rel} finds no ids in {looked}; its default {terms} ({eng.default_why}) "
                                  "names layers only for a known target: pass --target")
        ids = tuple(default_term(t, n) for t in eng.default_ids)
        kind, where, fell_back = rule.default, None, True
        fallback_why = f"no ids in {looked}: {rel} uses its default {list(ids)} ({eng.default_why})"
    else:
        ids, kind, where, fell_back, fallback_why = read_ids, rule.explicit, used.where, False, None
    assert kind is not None and ids is not None
    common = dict(field=where, ids=ids, fell_back=fell_back, fallback_why=fallback_why, kind=kind)
    if not ids:
        return result(**common, layers=None, error=_problem(
            BAD_IDS, f"{where} is an empty list: {rel} captures nothing"))
    boundaries = EXPLICIT_KINDS[kind](ids, n)
    if boundaries is None:
        return result(**common, layers=None, error=None,
                      unknown=f"{rel} reads {where} {list(ids)} {KIND_WORDS[kind]}: which layers that names depends "
                              "on the target's layer count: pass --target")
    problem = _boundary_problem(rule, boundaries, n, eng)
    if problem:
        return result(**common, layers=None, error=_problem(
            DEFAULT_CANNOT_CAPTURE if fell_back else ENGINE_CANNOT_CAPTURE,
            f"{rel} reads {'its default ' if fell_back else f'{where} '}{list(ids)} ({KIND_WORDS[kind]}): {problem}"))
    order = sorted(boundaries)
    if list(boundaries) != order:
        notes.append(f"the ids are not in depth order; {rel} captures the states in depth order, "
                     "so the drafter's fc chunks follow depth, not the order written")
    if n is None:
        notes.append("the target's layer count is not known: the ids were not checked against it")
    layers = tuple(LayerRef(b - 1) for b in order)
    if fc_slots is not None and fc_slots != len(layers):
        return result(**common, layers=None, error=_problem(
            FC_WIDTH, f"{rel} captures {len(layers)} states but sizes the drafter's fc for {fc_slots} "
                      f"(from {fc_field})"))
    return result(**common, layers=layers, error=None)


def ids_for(
    engine: EngineRelease | str,
    family: str | None,
    num_layers: int | None,
    layers: Iterable[LayerRef],
    runner: str | None = None,
) -> tuple[int, ...] | None:
    """The ids to write (in :func:`id_field`) so that ``engine`` captures ``layers`` on an
    ``num_layers``-layer target of ``family`` (None: unknown, no range check); None when no
    id list can (the engine cannot reach a state, the states are not in depth order -- the
    only order engines deliver --, or the rule needs the layer count). Ids of the form
    "output of layer i" are preferred when both forms work: older releases read them the
    same way more often."""
    rel = as_release(engine)
    eng = engines()[rel.engine]
    check_num_layers(num_layers)
    run = _runner(eng, runner if runner is not None else rel.runner)
    wanted = validate_refs(layers, num_layers)
    rule = rule_for(rel, family)
    if not wanted or not rule.supported:
        return None
    boundaries = tuple(r.output_of + 1 for r in wanted)
    if list(boundaries) != sorted(boundaries):
        return None
    assert rule.explicit is not None
    add = _source(eng, rel, run).read[0].add
    for candidate in (tuple(b - 1 for b in boundaries), boundaries):
        got = EXPLICIT_KINDS[rule.explicit](candidate, num_layers)
        if got == boundaries and _boundary_problem(rule, got, num_layers, eng) is None:
            return tuple(i - add for i in candidate)
    return None


def default_capture(engine: EngineRelease | str, family: str | None, num_layers: int) -> Capture:
    """What a release captures from a config that names no layers (its default)."""
    return capture(engine, {}, family, num_layers)


# --------------------------------------------------------------------------- which ids each field holds


@dataclass(frozen=True)
class IdsPlan:
    """The id list each config field should hold so that the releases served capture a layer set
    (:func:`plan_ids`): ``fields`` in the order first read; ``needs`` per release (None: no list
    in its field can make it capture the set); ``launch``: per launch option, the ids to pass."""

    layers: LayerSet
    fields: tuple[tuple[IdField, tuple[int, ...]], ...]
    needs: tuple[tuple[EngineRelease, tuple[int, ...] | None], ...]
    launch: tuple[tuple[IdField, tuple[int, ...]], ...]

    def ids(self, where: IdField) -> tuple[int, ...] | None:
        return dict(self.fields).get(where) or dict(self.launch).get(where)

    def need(self, release: EngineRelease) -> tuple[int, ...] | None:
        return next((ids for r, ids in self.needs if r == release), None)


def _config_with(where: IdField, ids: Sequence[int]) -> dict:
    from eagle3conv.spec.drafter import with_field

    return with_field({}, where.name, list(ids))


def plan_ids(layers: Iterable[LayerRef], family: str | None, num_layers: int | None,
             releases: Sequence[EngineRelease]) -> IdsPlan:
    """For each field the ``releases`` read first, the one id list that makes the most of them
    capture ``layers``; when no list serves all of them, the one the earliest release in
    ``releases`` (the priority) needs. Raises :class:`UsageError` for an unknown family."""
    wanted = validate_refs(layers, num_layers)
    needs = []
    by_field: dict[IdField, list[EngineRelease]] = {}
    for rel in releases:
        need = ids_for(rel, family, num_layers, wanted)
        needs.append((rel, need))
        by_field.setdefault(id_field(rel), []).append(rel)
    fields, launch = [], []
    for where, rels in by_field.items():
        options = []
        for rel in rels:
            need = dict(needs)[rel]
            if need is not None and need not in options:
                options.append(need)
        if not options:
            continue
        if not where.in_config:
            launch.append((where, options[0]))
            continue

        def served(ids: tuple[int, ...], rels=rels, where=where) -> int:
            cfg = _config_with(where, ids)
            return sum(capture(r, cfg, family, num_layers).layers == wanted for r in rels)

        best = max(options, key=lambda ids: (served(ids), -options.index(ids)))
        fields.append((where, best))
    return IdsPlan(wanted, tuple(fields), tuple(needs), tuple(launch))


# --------------------------------------------------------------------------- the row every report shows


@dataclass(frozen=True)
class EngineRow:
    """One engine release's reading of one drafter config, beside what training captured: the
    row `inspect`, `fix-keys`, `config`, `verify`, `push` and the card all show.

    ``finding``: what is wrong with this release's reading, in its own words (None: as trained,
    or nothing to compare with); ``needs``: the ids it needs in its field for the trained
    layers (None: no record, or no list can); ``as_trained``: None when no record names layers
    or the layers captured cannot be known."""

    release: EngineRelease
    capture: Capture
    needs: tuple[int, ...] | None
    finding: Finding | None
    as_trained: bool | None
    runner_assumed: bool = False
    """The runner is the engine's default, not one asked for."""
    serve: Finding | None = None
    """Whether this release can serve the drafter as its config describes it (None: as configured):
    it cannot load it at all, or it serves it without a switch it ignores (docs/facts.md §11)."""

    @property
    def field(self) -> IdField:
        """The field this release reads its ids from first (where to write them)."""
        return id_field(self.release)

    @property
    def layers(self) -> LayerSet | None:
        return self.capture.layers

    @property
    def ok(self) -> bool:
        return all(f is None or f.level != "error" for f in (self.finding, self.serve))

    def to_dict(self) -> dict:
        cap = self.capture
        return {
            "engine": self.release.spec,
            "release": str(self.release),
            "release_note": self.release.note,
            "runner": cap.runner,
            "runner_assumed": None if not self.runner_assumed else
            f"{cap.runner}, {self.release.engine}'s default runner (ask for another with --engine "
            f"{self.release.spec}{RUNNER_SUFFIX}NAME)",
            "family": cap.family,
            "field": {"kind": self.field.kind, "name": self.field.name},
            "reads": cap.reads,
            "ids": None if cap.ids is None else list(cap.ids),
            "fell_back": cap.fell_back,
            "rule": None if cap.kind is None else KIND_WORDS[cap.kind],
            "captures": None if cap.layers is None else describe(cap.layers),
            "layers": None if cap.layers is None else [{"output_of": r.output_of} for r in cap.layers],
            "as_trained": self.as_trained,
            "ok": self.ok,
            "error": None if cap.error is None else cap.error.message,
            "unknown": cap.unknown,
            "finding": None if self.finding is None else self.finding.to_dict(),
            "serve": None if self.serve is None else self.serve.to_dict(),
            "needs": None if self.needs is None else list(self.needs),
            "notes": list(cap.notes) + ([cap.fallback_why] if cap.fallback_why else []),
            "source": cap.source,
        }


# --------------------------------------------------------------------------- forward


def forward_rule(engine: EngineRelease | str, drafter: str) -> Forward:
    """How ``engine`` runs a ``drafter`` ("llama" or "mla") drafter (the "forward" rows of
    mappings/engines/*.json)."""
    rel = as_release(engine)
    eng = engines()[rel.engine]
    return _pick([f for f in eng.forward if drafter in f.drafters], rel.version, "forward", eng)


def _release_spans(eng: Engine, keep) -> list[str]:
    """The engine's releases for which ``keep(release)`` holds, as spans ("sglang 0.5.12-0.5.23")."""
    spans: list[list[str]] = []
    last = False
    for version, label in eng.releases or (((), None),):
        ok = keep(EngineRelease(eng.name, version, label))
        if ok and last:
            spans[-1][1] = label
        elif ok:
            spans.append([label, label])
        last = ok
    return [eng.name if a is None else f"{eng.name} {a}" if a == b else f"{eng.name} {a}-{b}" for a, b in spans]


def later_norm_readers(drafter: str = "llama") -> dict[str, list[str]]:
    """Which norm each engine's releases apply to a later decoder layer's input, from the forward
    rules: ``{"input_layernorm": ["vllm 0.33.0"], "hidden_norm": ["sglang 0.5.12-0.5.23"]}``."""
    out: dict[str, list[str]] = {}
    for eng in engines().values():
        for norm in LATER_LAYER_NORMS:
            spans = _release_spans(eng, lambda r, n=norm: forward_rule(r, drafter).later_layer_norm == n)
            if spans:
                out.setdefault(norm, []).extend(spans)
    return out


def layers_span(first: int, last: int) -> str:
    """'layer 1' or 'layers 1-2' (never a list: an index may be huge)."""
    return f"layer {first}" if first == last else f"layers {first}-{last}"


def layer_count_outcomes(built: int, held: int, drafter: str = "llama") -> list[str]:
    """What each engine release does with a drafter whose config says ``built`` decoder layers
    (``num_hidden_layers``) while its weights hold ``held``: from the forward rules'
    ``layers_without_weights`` / ``weights_past_layers`` (docs/facts.md §11); releases alike share one line."""
    out: list[str] = []
    for eng in engines().values():
        if built > held:
            field, gap = "layers_without_weights", layers_span(held, built - 1)
            them, they = ("them", "they were") if built - held > 1 else ("it", "it was")
            words = {"uninitialised": f"builds {built} decoder layers and loads nothing into {gap}: it serves "
                                      f"{them} with the uninitialised memory {they} allocated with",
                     "refused": f"refuses num_hidden_layers {built} at load"}
        else:
            field, gap = "weights_past_layers", layers_span(built, held - 1)
            words = {"skipped": f"builds {built} decoder layer{'s' if built != 1 else ''} and skips the weights of "
                                f"{gap} silently: it serves the drafter without them",
                     "refused": f"refuses to load the weights of {gap} (it builds no such layer)"}
        for value, text in words.items():
            spans = _release_spans(eng, lambda r, v=value: getattr(forward_rule(r, drafter), field) == v)
            out += [f"{span} {text}" for span in spans]
    return out


def _layers(cfg: Mapping[str, Any]) -> int:
    n = cfg.get("num_hidden_layers", 1)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1


def _switches_on(cfg: Mapping[str, Any], names: Iterable[str] = ()) -> frozenset[Switch]:
    """The switches on for this drafter (:attr:`DrafterSpec.switches`; k aux states as wide as the drafter
    turn on ``fc``: an engine that dispatches on width skips it)."""
    from eagle3conv.spec.drafter import DrafterSpec

    return DrafterSpec.from_config(cfg, names, validate=False).switches


def _read(fw: Forward, on: frozenset[Switch], handling: Handling) -> list[Switch]:
    """The switches on that ``fw`` reads with ``handling``, in the table's order."""
    return [s for s in switches() if s in on and s.engine is not None and fw.switches[s] is handling]


def draft_window(cfg: Mapping[str, Any] | None) -> tuple[int, tuple[int, ...]] | None:
    """The sliding window the drafter's config gives its decoder layers, as its trainer and the
    transformers config class read it: ``(window, the layer indices with it)``, or None.
    ``layer_types`` "sliding_attention" at a layer's index with a positive ``sliding_window``; a
    Qwen3 config has one only with ``use_sliding_window`` true (transformers' Qwen3Config drops it
    otherwise, and speculators trains with that config: docs/facts.md §11)."""
    cfg = cfg or {}
    types, win = cfg.get("layer_types"), cfg.get("sliding_window")
    if cfg.get("model_type") == "qwen3" and cfg.get("use_sliding_window") is not True:
        win = None
    if not isinstance(types, list) or not isinstance(win, int) or isinstance(win, bool) or win <= 0:
        return None
    layers = tuple(i for i, t in enumerate(types[:_layers(cfg)]) if t == "sliding_attention")
    return (win, layers) if layers else None


def window_launch_option(engine: EngineRelease | str, config: Mapping[str, Any] | None) -> str | None:
    """The launch option (with its value) ``engine`` needs to serve the drafter with the sliding window
    its config gives it, where the release reads the window only from a launch option; else None."""
    rel = as_release(engine)
    fw = forward_rule(rel, drafter_kind(config or {}))
    win = draft_window(config)
    if win is None or fw.handling("sliding_window") is not Handling.LAUNCH_OPTION:
        return None
    return f"{fw.sliding_window_option} {win[0]}"


def _window_words(win: tuple[int, tuple[int, ...]]) -> str:
    n, layers = win
    which = "its layer" if len(layers) == 1 else "its layers"
    return f"sliding window of {n} tokens on {which} {', '.join(map(str, layers))} (layer_types, sliding_window)"


def window_note(engine: EngineRelease | str, config: Mapping[str, Any] | None) -> str | None:
    """What ``engine`` does otherwise than the config's sliding window says, or None (no window, or
    the release applies it as written)."""
    rel = as_release(engine)
    cfg = config or {}
    fw = forward_rule(rel, drafter_kind(cfg))
    win = draft_window(cfg)
    reading = fw.handling("sliding_window")
    if win is None or reading in (Handling.NOT_READ, Handling.HONOURED):
        return None
    if reading is Handling.IGNORED:
        return (f"config.json gives the drafter a {_window_words(win)}, but {rel} ignores it and attends over the "
                "whole context")
    every = "" if len(win[1]) == _layers(cfg) else " (the option windows every draft layer)"
    return (f"config.json gives the drafter a {_window_words(win)}, but {rel} reads the window only from the launch "
            f"option {fw.sliding_window_option} and attends over the whole context without it{every}")


def _ignored_sentence(s: Switch, rel: EngineRelease) -> str | None:
    """The sentence of its own a switch has for a release that ignores it (None: it is listed by its words)."""
    return s.engine.ignored.format(rel=rel) if s.engine and s.engine.ignored else None


def cannot_load(engine: EngineRelease | str, config: Mapping[str, Any] | None,
                tensor_names: Iterable[str] = ()) -> tuple[str, ...]:
    """Why ``engine`` cannot load this drafter at all (empty: it can, or the rules do not say): more
    decoder layers than it builds, a variant it refuses, an architecture name it does not register."""
    rel = as_release(engine)
    eng = engines()[rel.engine]
    cfg = config or {}
    fw = forward_rule(rel, drafter_kind(cfg))
    on = _switches_on(cfg, tensor_names)
    out = [s.engine.refused.format(rel=rel, words=s.words, num_hidden_layers=cfg.get("num_hidden_layers"))
           for s in _read(fw, on, Handling.REFUSED)]  # type: ignore[union-attr]
    parallel = switch("parallel_drafting")  # a release that drafts it in parallel needs its mask token
    if parallel in on and fw.switches[parallel] is Handling.HONOURED and fw.mask_token_fields \
            and _mask_token(fw, cfg) is None:
        out.append(f"{rel} drafts a P-EAGLE drafter in parallel and needs its mask token id in config.json "
                   f"({' or '.join(fw.mask_token_fields)}); there is none")
    archs = cfg.get("architectures")
    name = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if fw.architectures is not None and name is not None and name not in fw.architectures and not out:
        out.append(f"{rel} registers no drafter class named {name} (it loads this kind of drafter as "
                   f"{' or '.join(fw.architectures[:3])}{', ...' if len(fw.architectures) > 3 else ''})")
    del eng
    return tuple(out)


def serve_finding(engine: EngineRelease | str, config: Mapping[str, Any] | None, *, asked: bool,
                  tensor_names: Iterable[str] = ()) -> Finding | None:
    """The row's word on serving this drafter: it cannot load it (an error when the release was asked
    for by name, else a warning), or it serves it without switches it ignores (a warning), or None."""
    rel = as_release(engine)
    refused = cannot_load(rel, config, tensor_names)
    if refused:
        other = [r.label for r in default_engines() if r.engine != rel.engine and not cannot_load(r, config, tensor_names)]
        return Finding("error" if asked else "warning", CONFIG, CANNOT_SERVE, "; ".join(refused),
                       fix=f"serve it with {', '.join(other)}" if other else None, subject=rel.spec)
    ignored = [s for s in switches() if s.name in served_without(rel, config, tensor_names)]
    parts = [own + " (verify's row for this release scores what that costs)"
             for s in ignored if (own := _ignored_sentence(s, rel))]
    listed = [s.words for s in ignored if not _ignored_sentence(s, rel)]
    if listed:
        parts.append(f"{rel} ignores {', '.join(listed)} and serves the drafter without "
                     "it (verify's row for this release scores what that costs)")
    window = window_note(rel, config)
    if window:
        parts.append(window)
    if parts:
        option = window_launch_option(rel, config)
        return Finding("warning", CONFIG, SERVED_WITHOUT, "; ".join(parts),
                       fix=f"launch {rel.engine} with {option}" if option else None, subject=rel.spec)
    return None


def served_without(engine: EngineRelease | str, config: Mapping[str, Any] | None,
                   tensor_names: Iterable[str] = ()) -> tuple[str, ...]:
    """The config switches ``engine`` ignores on this drafter (its tensors skipped silently): it serves
    the drafter without them."""
    rel = as_release(engine)
    cfg = config or {}
    fw = forward_rule(rel, drafter_kind(cfg))
    on = _switches_on(cfg, tensor_names)
    return tuple(s.name for s in _read(fw, on, Handling.IGNORED) if s.skippable)


@dataclass(frozen=True)
class Run:
    """How one engine release runs one drafter, where engines differ (docs/facts.md §9): the one
    value the forward reads at construction (:func:`eagle3conv.model.build_drafter`'s ``run``).

    The fields before ``engine`` are what the forward runs: two Runs that are equal run the drafter
    alike (the rest is the report's and does not compare), so a Run is its own cache key.
    ``Run()`` runs the drafter as its config.json says, with the caller's embedding table."""

    rope_interleave: bool | None = None
    """The RoPE layout an MLA drafter runs (None: its config's; Llama drafters: no engine changes it)."""
    norm_before_residual: bool | None = None
    """Whether layer 0 norms the residual (None: as config.json says)."""
    own_embedding: str = "never"
    """Whose token embedding it uses: "never" (the target's, the caller's table), "always" (the drafter's
    own ``embed_tokens``, where it ships one) or "unless_equal" (its own unless identical to the target's,
    as vLLM compares them: verify settles it with :meth:`settled`)."""
    target_head: bool = False
    """It replaces the drafter's ``lm_head`` with the target's (no ``draft_vocab_size`` in config.json)
    and the target's head is at hand, so the run uses it."""
    later_layer_norm: str = "hidden_norm"
    """The norm a later decoder layer applies to its input (``input_layernorm`` or ``hidden_norm``)."""
    without: frozenset[str] = frozenset()
    """The config switches this release ignores on this drafter: the run leaves them out."""
    parallel_mask_token: int | None = None
    """A P-EAGLE drafter this release drafts in parallel: the mask token id it reads (None: chained)."""
    raw_modules: tuple[str, ...] = ()
    """A quantized drafter's modules this release loads as plain Linears, their codes unscaled
    (docs/facts.md §14; set by the caller, who holds the stored tensors: :meth:`settled`)."""
    engine: EngineRelease | None = field(default=None, compare=False)
    drafter: str = field(default="", compare=False)
    differences: tuple[str, ...] = field(default=(), compare=False)
    """Where it runs the drafter otherwise than its config.json says."""
    not_emulated: tuple[str, ...] = field(default=(), compare=False)
    """Differences a run on captured states cannot show."""
    not_read: tuple[str, ...] = field(default=(), compare=False)
    """What the rules do not record for this engine (run as SGLang does)."""
    why: str = field(default="", compare=False)
    source: str = field(default="", compare=False)
    refused: tuple[str, ...] = field(default=(), compare=False)
    """Why this release cannot load the drafter at all (then nothing is scored for it)."""

    def settled(self, *, own: bool | None = None, raw_modules: tuple[str, ...] | None = None) -> Run:
        """This run with what only the caller can tell: whether the drafter's own embedding is used
        (``own``: "always" or "never") and the quantized modules it loads unscaled."""
        out = self if own is None else replace(self, own_embedding="always" if own else "never")
        return out if raw_modules is None else replace(out, raw_modules=tuple(raw_modules))



def serving(engine: EngineRelease | str, config: Mapping[str, Any] | None,
            tensor_names: Iterable[str] = (), *, target_head_at_hand: bool = False) -> Run:
    """How ``engine`` runs the drafter with ``config`` and tensors ``tensor_names``.
    ``target_head_at_hand``: the target's ``lm_head`` was given (verify ``--embeddings``),
    so an engine that would use it instead of the drafter's is run with it."""
    rel = as_release(engine)
    eng = engines()[rel.engine]
    cfg = config or {}
    names = set(tensor_names)
    kind = drafter_kind(cfg)
    fw = forward_rule(rel, kind)
    who = eng.title
    diffs: list[str] = []
    missing: list[str] = []
    not_read: list[str] = []
    rope: bool | None = None
    if kind == "mla":
        declared = cfg.get("rope_interleave", True) is not False
        if fw.rope_interleave == "always":
            rope = True
            if not declared:
                diffs.append(f"rope_interleave is false in config.json, but {who} always runs interleaved "
                             "RoPE on an MLA drafter")
        else:
            rope = declared
            if fw.rope_interleave is None:
                not_read.append(f"whether {who} honours rope_interleave")
    nbr_declared = cfg.get("norm_before_residual") is True
    nbr_reading = fw.handling("norm_before_residual")
    if nbr_reading is Handling.HONOURED:
        nbr = nbr_declared
    else:
        nbr = False
        if nbr_reading is Handling.IGNORED and nbr_declared:
            diffs.append(f"norm_before_residual is true in config.json, but {who} ignores it (the residual is "
                         "the un-normed state)")
        elif nbr_reading is Handling.NOT_READ:
            not_read.append(f"whether {who} honours norm_before_residual")
    own = "never"
    if fw.embedding == "own_unless_equal" and EMBED in names:
        own = "unless_equal"
    elif fw.embedding is None:
        not_read.append(f"which embedding {who} uses")
    target_head = False
    if cfg.get("draft_vocab_size") is None and LM_HEAD in names:
        if fw.head_without_draft_vocab_size == "target":
            if target_head_at_hand:
                target_head = True
                diffs.append(f"config.json has no draft_vocab_size, so {who} replaces the drafter's lm_head with "
                             "the target's (run here with the target's head from --embeddings)")
            else:
                missing.append(f"config.json has no draft_vocab_size, so {who} uses the target's lm_head instead "
                               "of the drafter's; the target's head is not in captured states, so verify scores "
                               "the drafter's own head (pass the target's weights with --embeddings to run it)")
        elif fw.head_without_draft_vocab_size is None:
            not_read.append(f"which head {who} uses without draft_vocab_size")
    on = _switches_on(cfg, names)
    later = fw.later_layer_norm or "hidden_norm"
    if names:
        for i in range(1, _layers(cfg)):
            if f"layers.{i}.{later}.weight" not in names:
                diffs.append(f"layers.{i}.{later}.weight is missing: {rel} normalises layer {i}'s input with it and "
                             "serves it untrained (weight 1)")
    if switch("later_layers") in on and fw.later_layer_norm is None \
            and fw.handling("later_layers") is not Handling.REFUSED:
        not_read.append(f"which norm {who} applies to a later decoder layer's input")
    without = served_without(rel, cfg, names)
    for sw in (s for s in switches() if s.name in without):
        diffs.append(_ignored_sentence(sw, rel) or f"{sw.words} is set in config.json, but {rel} ignores it and "
                     "serves the drafter without it")
    not_read += [s.engine.not_read.format(who=who, words=s.words)  # type: ignore[union-attr]
                 for s in _read(fw, on, Handling.NOT_READ) if s.engine.not_read]  # type: ignore[union-attr]
    win, win_reading = draft_window(cfg), fw.handling("sliding_window")
    if win is not None and win_reading is Handling.HONOURED:
        missing.append(f"{rel} applies the drafter's {_window_words(win)}; verify attends over the whole context, "
                       f"the same on sequences of up to {win[0]} tokens")
    elif win is not None and win_reading is Handling.LAUNCH_OPTION:
        missing.append(f"{rel} launched with {fw.sliding_window_option} {win[0]} windows every draft layer; verify "
                       "runs it as launched without (the whole context)")
    elif win is not None and win_reading is Handling.NOT_READ:
        not_read.append(f"whether {who} applies the drafter's sliding window")
    refused = cannot_load(rel, cfg, names)
    parallel = switch("parallel_drafting")
    mask = _mask_token(fw, cfg) if parallel in on and fw.switches[parallel] is Handling.HONOURED else None
    return Run(rope_interleave=rope, norm_before_residual=nbr, own_embedding=own, target_head=target_head,
               later_layer_norm=later, without=frozenset(without), parallel_mask_token=None if refused else mask,
               engine=rel, drafter=kind, differences=tuple(diffs), not_emulated=tuple(missing),
               not_read=tuple(not_read), why=fw.why, source=fw.source, refused=refused)


def _mask_token(fw: Forward, cfg: Mapping[str, Any]) -> int | None:
    for name in fw.mask_token_fields or ():
        value = read_field(cfg, name)[1]
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def mask_token(engine: EngineRelease | str, config: Mapping[str, Any] | None) -> int | None:
    """The mask token id ``engine`` drafts a P-EAGLE drafter's later positions with (None: none found,
    or the release reads none)."""
    cfg = config or {}
    return _mask_token(forward_rule(as_release(engine), drafter_kind(cfg)), cfg)
