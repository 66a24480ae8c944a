"""The drafter variants (switches), read: ``mappings/variants.json`` into frozen, validated types.

A switch is one way a drafter differs from plain EAGLE-3 (EAGLE-3.1's ``fc_norm``, a Qwen3 drafter's
q/k norms, P-EAGLE, fc by width, ...). Each is declared once, as a row of the table: what turns it
on in a config, the canonical tensors it gates, its words, its stage, whether a run may leave it out,
and how the engine rules record a release's reading of it (a :class:`Handling` per forward entry,
:class:`eagle3conv.spec.engine_rules.Forward`). Every list of switches in the package is derived
from here; the forward's maths stays in :mod:`eagle3conv.model`. docs/extending.md, "A new drafter
variant".

Pure Python, no torch.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType

from eagle3conv.errors import MappingFileError
from eagle3conv.io.jsonfile import object_fields
from eagle3conv.io.data import data_path

__all__ = ["COMPUTED", "STAGES", "EngineReading", "Handling", "OnWhen", "Switch", "load_switches",
           "switch", "switches"]

STAGES = ("step1", "attention", "layer", "head")
#: the properties of a drafter's dimensions a row may name in ``on_when.computed``
#: (computed by :meth:`eagle3conv.spec.drafter.DrafterSpec.from_config`)
COMPUTED = ("aux_states_as_wide_as_hidden", "more_than_one_layer", "sliding_window")


class Handling(enum.Enum):
    """How one engine release reads a switch that is on (docs/facts.md §9, §11)."""

    HONOURED = "honoured"
    """It runs the drafter as the switch says."""
    IGNORED = "ignored"
    """It skips the switch and its tensors silently: the drafter is served without them."""
    REFUSED = "refused"
    """It cannot load the drafter."""
    LAUNCH_OPTION = "launch_option"
    """It honours the switch only when launched with an option (the forward entry names it)."""
    NOT_READ = "not read"
    """The engine rules do not record it (the data's null)."""


@dataclass(frozen=True)
class OnWhen:
    """What turns a switch on in a drafter's config.json."""

    flags: tuple[str, ...] = ()
    """Boolean fields read at the top level, then in ``eagle_config`` (any true)."""
    fields: tuple[str, ...] = ()
    """Fields read at the top level only (any truthy)."""
    architectures: tuple[str, ...] = ()
    """Architecture names (any in ``architectures``)."""
    speculators_model_type: str | None = None
    any_of: tuple[str, ...] = ()
    """Other switches, any of which turns this one on ..."""
    unless: str | None = None
    """... unless this switch is on."""
    computed: str | None = None
    """A property of the dimensions (:data:`COMPUTED`)."""

    @property
    def config_fields(self) -> tuple[str, ...]:
        """The boolean config fields that set the switch."""
        return self.flags + self.fields


@dataclass(frozen=True)
class EngineReading:
    """How the engine files record a release's reading of a switch: the forward field and what each of
    its values means, and the sentences that name an outcome (``{rel}``, ``{who}``, ``{words}``)."""

    field: str
    values: Mapping[str, Handling]
    not_read: str | None = None
    refused: str | None = None
    ignored: str | None = None
    """A sentence of its own for a release that ignores it (else it is listed by its words)."""

    def handling(self, value: str | None) -> Handling:
        """The Handling of a forward entry's value (null: not read)."""
        return Handling.NOT_READ if value is None else self.values[value]


@dataclass(frozen=True)
class Switch:
    """One drafter variant (a row of mappings/variants.json)."""

    name: str
    on_when: OnWhen
    tensors: tuple[str, ...]
    stage: str
    skippable: bool
    """verify's run may leave it out, as a release that ignores it does (``Eagle3Drafter(without=...)``)."""
    words: str
    card: str | None
    fix_keys_field: str | None
    """The config field fix-keys writes true when the weights reveal the switch (None: not written)."""
    fix_keys_why: str | None
    zeros_when_missing: bool
    """fix-keys writes its tensors as zeros when the switch is on and the source has none."""
    engine: EngineReading | None
    """None: no engine file records it (``engine_why`` says why every release reads it as the config says)."""
    engine_why: str | None
    source: str

    @property
    def revealed_by_weights(self) -> bool:
        """Whether a gated tensor in a source turns the switch on (fix-keys then writes it)."""
        return self.fix_keys_why is not None and not self.zeros_when_missing

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Switch({self.name!r})"

    def __hash__(self) -> int:  # a switch is its name (the table holds each once)
        return hash(self.name)


def _fail(path, message: str) -> MappingFileError:
    return MappingFileError(f"variant table {path}: {message}")


def _strings(path, value, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(path, f"{where} must be a list of non-empty strings")
    return tuple(value)


def _text(path, raw: Mapping, key: str, where: str, *, optional: bool = False) -> str | None:
    value = raw.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _fail(path, f"{where}: '{key}' must be a non-empty string" + (" or null" if optional else ""))
    return value


def _keys(path, raw, where: str, required: set[str], optional: set[str] = frozenset()) -> dict:
    return object_fields(raw, where, required, optional, fail=lambda message: _fail(path, message))


def _on_when(path, raw, where: str) -> OnWhen:
    raw = _keys(path, raw, f"{where} 'on_when'", set(),
                {"flags", "fields", "architectures", "speculators_model_type", "any_of", "unless", "computed"})
    if not raw:
        raise _fail(path, f"{where} 'on_when' names nothing that turns the switch on")
    lists = {k: _strings(path, raw[k], f"{where} on_when '{k}'") for k in ("flags", "fields", "architectures", "any_of")
             if k in raw}
    computed = _text(path, raw, "computed", where, optional=True)
    if computed is not None and computed not in COMPUTED:
        raise _fail(path, f"{where}: on_when 'computed' must be one of {list(COMPUTED)}")
    if "unless" in raw and "any_of" not in raw:
        raise _fail(path, f"{where}: on_when 'unless' goes with 'any_of'")
    return OnWhen(speculators_model_type=_text(path, raw, "speculators_model_type", where, optional=True),
                  unless=_text(path, raw, "unless", where, optional=True), computed=computed, **lists)


def _engine(path, raw, where: str) -> EngineReading:
    raw = _keys(path, raw, f"{where} 'engine'", {"field", "values"}, {"not_read", "refused", "ignored"})
    values = raw["values"]
    if not isinstance(values, dict) or not values:
        raise _fail(path, f"{where}: engine 'values' must map the engine files' values to a handling")
    try:
        handling = {k: Handling(v) for k, v in values.items()}
    except ValueError:
        raise _fail(path, f"{where}: engine 'values' must be among {[h.value for h in Handling if h is not Handling.NOT_READ]}"
                    ) from None
    if Handling.NOT_READ in handling.values():
        raise _fail(path, f"{where}: 'not read' is the engine files' null, not a value")
    texts = {k: _text(path, raw, k, where, optional=True) for k in ("not_read", "refused", "ignored")}
    if texts["refused"] is None and Handling.REFUSED in handling.values():
        raise _fail(path, f"{where}: a switch a release may refuse needs its 'refused' sentence")
    return EngineReading(_text(path, raw, "field", where), MappingProxyType(handling), **texts)


def _switch(path, i: int, raw) -> Switch:
    where = f"switch {i}"
    raw = _keys(path, raw, where, {"name", "on_when", "tensors", "stage", "skippable", "words", "card", "fix_keys",
                                   "engine", "source"}, {"engine_why"})
    name = _text(path, raw, "name", where)
    where = f"switch {name!r}"
    if raw["stage"] not in STAGES:
        raise _fail(path, f"{where}: 'stage' must be one of {list(STAGES)}")
    if not isinstance(raw["skippable"], bool):
        raise _fail(path, f"{where}: 'skippable' must be true or false")
    fix = raw["fix_keys"]
    if fix is not None:
        fix = _keys(path, fix, f"{where} 'fix_keys'", {"field", "why"}, {"zeros_when_missing"})
        if not isinstance(fix.get("zeros_when_missing", False), bool) or (fix.get("zeros_when_missing")
                                                                            and fix["field"] is not None):
            raise _fail(path, f"{where}: fix_keys 'zeros_when_missing' is true or false, and writes no field")
        if fix["field"] is not None and fix["field"] not in _on_when(path, raw["on_when"], where).config_fields:
            raise _fail(path, f"{where}: fix_keys 'field' must be one of the config fields in on_when (or null)")
    engine = None if raw["engine"] is None else _engine(path, raw["engine"], where)
    engine_why = _text(path, raw, "engine_why", where, optional=True)
    if (engine is None) == (engine_why is None):
        raise _fail(path, f"{where}: give 'engine' (how the engine files record it) or, when none does, 'engine_why'")
    return Switch(name, _on_when(path, raw["on_when"], where), _strings(path, raw["tensors"], f"{where} 'tensors'"),
                  raw["stage"], raw["skippable"], _text(path, raw, "words", where),
                  _text(path, raw, "card", where, optional=True),
                  None if fix is None else fix["field"], None if fix is None else _text(path, fix, "why", where),
                  bool(fix and fix.get("zeros_when_missing")), engine, engine_why, _text(path, raw, "source", where))


def load_switches(path=None) -> tuple[Switch, ...]:
    """Load and validate a variant table (the shipped one by default). Raises :class:`MappingFileError`."""
    path = Path(path) if path is not None else data_path("variants.json")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _fail(path, f"cannot be read as JSON: {err}") from None
    raw = _keys(path, raw, "the file", {"schema", "description", "switches"})
    if raw["schema"] != 1:
        raise _fail(path, "'schema' must be 1")
    if not isinstance(raw["switches"], list) or not raw["switches"]:
        raise _fail(path, "'switches' must be a non-empty list")
    out = tuple(_switch(path, i, s) for i, s in enumerate(raw["switches"]))
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise _fail(path, f"a switch is declared twice: {sorted({n for n in names if names.count(n) > 1})}")
    fields = [s.engine.field for s in out if s.engine is not None]
    if len(set(fields)) != len(fields):
        raise _fail(path, "two switches name the same engine forward field")
    for s in out:
        bad = [n for n in (*s.on_when.any_of, *([s.on_when.unless] if s.on_when.unless else [])) if n not in names]
        if bad:
            raise _fail(path, f"switch {s.name!r}: on_when names switches the table lacks: {bad}")
    gated = [t for s in out for t in s.tensors]
    if len(set(gated)) != len(gated):
        raise _fail(path, "a tensor is gated by two switches")
    return out


@cache
def switches() -> tuple[Switch, ...]:
    """The shipped table, in its order (messages list switches in this order)."""
    return load_switches()


@cache
def _by_name() -> Mapping[str, Switch]:
    return MappingProxyType({s.name: s for s in switches()})


def switch(name: str) -> Switch:
    """The switch of that name (KeyError for a name the table lacks: a code error)."""
    return _by_name()[name]
