"""The engine rules, read: ``mappings/engines/*.json`` into frozen, validated types.

This module loads and checks the data (schema, ``why`` and ``source`` on every
rule, release ranges that neither overlap nor leave gaps, families that
exist); :mod:`eagle3conv.spec.engines` interprets it (which states a release
captures for a config, which ids to write, how it runs the drafter).

The rules are data, in ``mappings/engines/``: one file per engine (``sglang.json``,
``vllm.json``, ``tensorrt-llm.json``) plus ``families.json``, the table that says
which engine model file ("family") serves a target, from its ``architectures`` or
``model_type``. Every rule carries a ``why`` and the upstream ``source`` it was read
from; docs/facts.md §9 states them in words.

Every engine captures the residual stream at a *boundary* ``b`` between decoder
layers: boundary ``b`` is the input of layer ``b``, i.e. the output of layer
``b-1``; boundary 0 is the embedding output and boundary ``N`` the last layer's
output. An engine rule says how the ids it reads become boundaries (one small
interpreter per rule kind, :data:`EXPLICIT_KINDS`), and whether boundaries 0
and ``N`` are reachable at all.

Pure Python, no torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType

from eagle3conv.io.data import data_path
from eagle3conv.errors import MappingFileError, UsageError
from eagle3conv.io.jsonfile import object_fields
from eagle3conv.spec.variants import Handling, Switch, switch, switches

SCHEMA = 1
ENGINE_FILES = ("sglang", "vllm", "tensorrt-llm")
FAMILIES_FILE = "families"
ANY = "*"

Version = tuple[int, ...]

# --------------------------------------------------------------------------- rule kinds

Interpret = Callable[[tuple[int, ...], "int | None"], "tuple[int, ...] | None"]
"""ids and the target's layer count (None: unknown) -> capture boundaries, or None when
the rule cannot tell without the layer count."""


def _plus_one(ids: tuple[int, ...], n: int | None) -> tuple[int, ...]:
    return tuple(i + 1 for i in ids)


def _raw(ids: tuple[int, ...], n: int | None) -> tuple[int, ...]:
    return tuple(ids)


def _plus_one_if_first_is_1(ids: tuple[int, ...], n: int | None) -> tuple[int, ...]:
    return _plus_one(ids, n) if ids and ids[0] == 1 else _raw(ids, n)


def _raw_if_max_is_n(ids: tuple[int, ...], n: int | None) -> tuple[int, ...] | None:
    if n is None:
        return None  # whether the largest id is the layer count cannot be told
    return _raw(ids, n) if ids and max(ids) == n else _plus_one(ids, n)


EXPLICIT_KINDS: Mapping[str, Interpret] = MappingProxyType(
    {
        "plus_one": _plus_one,
        "raw": _raw,
        "plus_one_if_first_is_1": _plus_one_if_first_is_1,
        "raw_if_max_equals_num_layers_else_plus_one": _raw_if_max_is_n,
    }
)
"""How ids become capture boundaries (boundary b = output of layer b-1)."""

DEFAULT_KINDS = ("plus_one", "raw")
KIND_WORDS: Mapping[str, str] = MappingProxyType(
    {
        "plus_one": "+1: id i = output of layer i",
        "raw": "used raw: id i = input of layer i = output of layer i-1",
        "plus_one_if_first_is_1": "+1 when the first id is 1, else used raw",
        "raw_if_max_equals_num_layers_else_plus_one": "used raw when the largest id equals "
        "the layer count, else +1",
    }
)

DRAFTER_KINDS = ("llama", "mla")

# --------------------------------------------------------------------------- versions


_VERSION = re.compile(r"^(\d{1,9}(?:\.\d{1,9})*)(?:\.?post(\d{1,9}))?$")  # 9 digits a number, at most


def shown(text: str, limit: int = 40) -> str:
    """``text`` cut to ``limit`` characters for a message (a 5,000-digit release stays readable)."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def parse_version(text: str) -> Version:
    """``"0.5.13"`` -> (0, 5, 13, 0); ``"0.33"`` -> (0, 33, 0, 0); ``"0.5.12.post1"``
    -> (0, 5, 12, 1). Three release numbers (padded) and a post number."""
    m = _VERSION.match(text.strip())
    if not m:
        raise UsageError(f"'{shown(text)}' is not a release number such as 0.5.23 or 0.5.12.post1 "
                         "(at most 9 digits a number)")
    base = tuple(int(p) for p in m.group(1).split("."))
    if len(base) > 3:
        raise UsageError(f"'{shown(text)}' has more than three release numbers")
    return base + (0,) * (3 - len(base)) + (int(m.group(2) or 0),)


@dataclass(frozen=True)
class ReleaseRange:
    """``lo <= version < hi``; None = unbounded. Text: ``*``, ``>=A``, ``<B``, ``>=A,<B``."""

    text: str
    lo: Version | None
    hi: Version | None

    def __contains__(self, version: Version) -> bool:
        return (self.lo is None or version >= self.lo) and (self.hi is None or version < self.hi)

    def overlaps(self, other: ReleaseRange) -> bool:
        lo = max((v for v in (self.lo, other.lo) if v is not None), default=None)
        hi = min((v for v in (self.hi, other.hi) if v is not None), default=None)
        return lo is None or hi is None or lo < hi


def parse_range(text: str) -> ReleaseRange:
    if not isinstance(text, str):
        raise ValueError(f"a release range must be a string, got {text!r}")
    if text.strip() == ANY:
        return ReleaseRange(ANY, None, None)
    lo = hi = None
    for part in text.split(","):
        part = part.strip()
        try:
            if part.startswith(">=") and lo is None:
                lo = parse_version(part[2:])
            elif part.startswith("<") and not part.startswith("<=") and hi is None:
                hi = parse_version(part[1:])
            else:
                raise ValueError
        except (UsageError, ValueError):
            raise ValueError(
                f"bad release range '{text}': write '*', '>=A', '<B' or '>=A,<B'"
            ) from None
    if lo is not None and hi is not None and not lo < hi:
        raise ValueError(f"release range '{text}' is empty")
    return ReleaseRange(text, lo, hi)


# --------------------------------------------------------------------------- the data


@dataclass(frozen=True)
class Family:
    name: str
    title: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    why: str
    source: str


@dataclass(frozen=True)
class IdField:
    """Where an engine reads aux ids: a config.json field (``kind`` "config", ``name`` a dotted
    path into nested objects) or a launch option (``kind`` "launch_option")."""

    kind: str  # config | launch_option
    name: str

    def __post_init__(self) -> None:
        if self.kind not in ("config", "launch_option"):
            raise ValueError(f"IdField kind must be config or launch_option, got {self.kind!r}")

    @property
    def in_config(self) -> bool:
        return self.kind == "config"

    def __str__(self) -> str:
        return self.name if self.in_config else f"launch option {self.name}"


@dataclass(frozen=True)
class IdRead:
    """One place an engine looks for ids; ``add`` is added to each id read there."""

    where: IdField
    add: int = 0

    @property
    def name(self) -> str:
        return str(self.where)


@dataclass(frozen=True)
class IdsSource:
    releases: ReleaseRange
    runners: tuple[str, ...] | None  # None: every runner
    read: tuple[IdRead, ...]
    switch: str | None  # a boolean config field that turns aux capture off when false
    empty_is_absent: bool
    why: str
    source: str


@dataclass(frozen=True)
class FcRead:
    field: str
    as_: str  # count | length


@dataclass(frozen=True)
class FcWidth:
    releases: ReleaseRange
    drafters: tuple[str, ...]
    read: tuple[FcRead, ...]
    fallback: int
    why: str
    source: str


_SETTINGS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "rope_interleave": ("config", "always"),
        "embedding": ("target", "own_unless_equal"),
        "head_without_draft_vocab_size": ("target", "own"),
        "later_layer_norm": ("input_layernorm", "hidden_norm"),
        "layers_without_weights": ("uninitialised", "refused"),
        "weights_past_layers": ("skipped", "refused"),
    }
)
# the forward fields that record a switch (mappings/variants.json's engine field), read as a Handling
def _switch_fields(table: Sequence[Switch]) -> Mapping[str, Switch]:
    return MappingProxyType({s.engine.field: s for s in table if s.engine})


def forward_values(table: Sequence[Switch]) -> Mapping[str, tuple[str, ...]]:
    """Every forward field and its values: the settings, and each switch's engine field (``table``)."""
    return MappingProxyType({**_SETTINGS, **{f: tuple(s.engine.values)  # type: ignore[union-attr]
                                             for f, s in _switch_fields(table).items()}})


FORWARD_VALUES: Mapping[str, tuple[str, ...]] = forward_values(switches())
"""How an engine runs the drafter where engines differ (null in the data: not applicable
or not read, and the drafter runs as its config says): ``rope_interleave`` "config"
(honoured) or "always" (interleaved whatever the flag); ``norm_before_residual``
"config" or "ignored" (the residual is the un-normed state); ``embedding`` "target"
(the target's table, unless the drafter's hidden size differs from the target's) or
"own_unless_equal" (the drafter's own ``embed_tokens`` when it has one that is not
identical to the target's); ``head_without_draft_vocab_size`` "target" or "own";
``later_layer_norm``: the norm a decoder layer after the first applies to its input
("input_layernorm" or "hidden_norm"); ``layers`` (the switch ``later_layers``): "any" number of decoder layers or
"one" (more is refused at load); ``layers_without_weights``: what a release does with a
layer it builds (``num_hidden_layers``) that the weights do not hold, "uninitialised" (served with
the values it was allocated with) or "refused", and ``weights_past_layers``: what it does with the
weights of a layer past ``num_hidden_layers``, "skipped" (silently: the drafter is served without
them) or "refused" (``layers_source``: where both were read); each switch of mappings/variants.json
with an engine field (``fc_norm``, ``norm_output``, ...): the values that table maps to a
:class:`~eagle3conv.spec.variants.Handling`, "config" (honoured), "ignored" (the flag and its tensors are
skipped silently: the drafter is served without them) or "refused" (the release cannot load
the drafter). ``sliding_window``: what the release does with a drafter whose config gives
layers a sliding window (``layer_types`` "sliding_attention" with ``sliding_window``):
"config" (applied to those layers), "launch_option" (only from the launch option named in
``sliding_window_option``, to every layer; the config's is not read) or "ignored".
``fc``: "always" (the aux states go through ``fc`` at step 1 whatever their width) or
"width_differs" (``fc`` only when the input is not ``hidden_size`` wide: a drafter whose k aux
states of ``target_hidden_size`` add up to ``hidden_size`` is served without ``fc``).
``architectures`` lists the config architecture names the release loads this kind of drafter
under."""


@dataclass(frozen=True)
class Forward:
    """How one engine runs one kind of drafter (see :data:`FORWARD_VALUES`); ``switches``: its reading of
    every switch the engine files record, keyed by switch (mappings/variants.json), ``norm_before_residual``,
    ``layers`` (the switch ``later_layers``) and ``sliding_window`` among them."""

    releases: ReleaseRange
    drafters: tuple[str, ...]
    rope_interleave: str | None
    embedding: str | None
    head_without_draft_vocab_size: str | None
    why: str
    source: str
    later_layer_norm: str | None = None
    layers_without_weights: str | None = None
    weights_past_layers: str | None = None
    layers_source: str | None = None
    architectures: tuple[str, ...] | None = None
    mask_token_fields: tuple[str, ...] | None = None
    """Where a release that drafts in parallel reads the mask token id, in order (None: not read)."""
    sliding_window_option: str | None = None
    """The launch option that sets the drafter's window where the switch ``sliding_window`` is
    :attr:`~eagle3conv.spec.variants.Handling.LAUNCH_OPTION`."""
    readings: tuple[tuple[Switch, Handling], ...] = ()
    """(switch, how this release reads it) for every switch the engine files record, in the table's order."""

    @property
    def switches(self) -> Mapping[Switch, Handling]:
        """This release's reading of each switch, keyed by switch."""
        return MappingProxyType(dict(self.readings))

    def handling(self, name: str) -> Handling:
        """How this release reads the switch of that name when it is on."""
        return self.switches[switch(name)]


@dataclass(frozen=True)
class Rule:
    family: str  # a family name or "*"
    releases: ReleaseRange
    supported: bool
    explicit: str | None
    default: str | None
    embedding: bool
    final_output: bool
    why: str
    source: str


@dataclass(frozen=True)
class Engine:
    name: str
    title: str
    aliases: tuple[str, ...]
    releases: tuple[tuple[Version, str], ...]  # (version, label), ascending
    default_runner: str | None
    runners: Mapping[str, str]
    capture_ids: tuple[IdsSource, ...]
    fc_width: tuple[FcWidth, ...]
    default_ids: tuple[str, ...]
    default_why: str
    default_source: str
    rules: tuple[Rule, ...]
    path: Path
    forward: tuple[Forward, ...] = ()
    check_by_default: tuple[str, ...] = ("newest",)
    """The releases a check covers when none is asked for: labels from ``releases``, or
    ``newest`` (the data file says why)."""
    quantization: tuple = ()
    """The file's ``quantization`` entries as written (interpreted by
    :func:`eagle3conv.spec.quant.engine_quant`; read with the rest of the file, once)."""

    @property
    def oldest(self) -> str | None:
        return self.releases[0][1] if self.releases else None

    @property
    def newest(self) -> str | None:
        return self.releases[-1][1] if self.releases else None


def _fail(path: Path, message: str) -> MappingFileError:
    return MappingFileError(f"engine rules {path}: {message}")


def _keys(path: Path, raw: object, where: str, required: set[str], optional: set[str] = frozenset()) -> dict:
    return object_fields(raw, where, required, optional, fail=lambda message: _fail(path, message))


def _text(path: Path, raw: dict, key: str, where: str) -> str:
    value = raw[key]
    if not isinstance(value, str) or not value.strip():
        raise _fail(path, f"{where}: '{key}' must be a non-empty string")
    return value


def _strings(path: Path, value: object, where: str, *, empty: bool = True) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value) or (not empty and not value):
        raise _fail(path, f"{where} must be a list of non-empty strings")
    return tuple(value)


def _range(path: Path, raw: dict, where: str) -> ReleaseRange:
    try:
        return parse_range(raw["releases"])
    except ValueError as err:
        raise _fail(path, f"{where}: {err}") from None


def _bool(path: Path, raw: dict, key: str, where: str) -> bool:
    if not isinstance(raw[key], bool):
        raise _fail(path, f"{where}: '{key}' must be true or false")
    return raw[key]


def _load_json(path: Path) -> dict:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _fail(path, f"cannot be read as JSON: {err}") from None
    if not isinstance(raw, dict):
        raise _fail(path, "the top level must be an object")
    if raw.get("schema") != SCHEMA:
        raise _fail(path, f"'schema' must be {SCHEMA}")
    return raw


def load_families_file(path: str | Path) -> Mapping[str, Family]:
    """Load and validate the family table. Raises :class:`MappingFileError`."""
    path = Path(path)
    raw = _keys(path, _load_json(path), "the file", {"schema", "description", "families"})
    if not isinstance(raw["families"], list) or not raw["families"]:
        raise _fail(path, "'families' must be a non-empty list")
    families: dict[str, Family] = {}
    claimed: dict[str, str] = {}
    keys = {"name", "title", "architectures", "model_types", "why", "source"}
    for i, item in enumerate(raw["families"]):
        where = f"family {i}"
        item = _keys(path, item, where, keys)
        name = _text(path, item, "name", where)
        if name == ANY or name in families:
            raise _fail(path, f"{where}: the name '{name}' is reserved or repeated")
        fam = Family(
            name,
            _text(path, item, "title", where),
            _strings(path, item["architectures"], f"{where} 'architectures'", empty=False),
            _strings(path, item["model_types"], f"{where} 'model_types'"),
            _text(path, item, "why", where),
            _text(path, item, "source", where),
        )
        for key in [f"arch:{a}" for a in fam.architectures] + [f"type:{t}" for t in fam.model_types]:
            if claimed.setdefault(key, name) != name:
                raise _fail(path, f"'{key.split(':', 1)[1]}' belongs to both {claimed[key]} and {name}")
        families[name] = fam
    return MappingProxyType(families)


_DEFAULT_TERM = re.compile(r"^(N//2|N|\d+)([+-]\d+)?$")


def is_default_term(term: str) -> bool:
    """Whether ``term`` is a layer id written in the target's layer count N: INT, N or N//2,
    optionally +c or -c (what :func:`default_term` reads)."""
    return bool(_DEFAULT_TERM.match(term))


def default_term(term: str, n: int) -> int:
    m = _DEFAULT_TERM.match(term)
    assert m, term  # validated at load
    base = {"N": n, "N//2": n // 2}.get(m.group(1))
    return (int(m.group(1)) if base is None else base) + int(m.group(2) or 0)


def _check_cover(path: Path, ranges: Sequence[ReleaseRange], where: str, *, full: bool) -> None:
    for a_i, a in enumerate(ranges):
        for b in ranges[a_i + 1:]:
            if a.overlaps(b):
                raise _fail(path, f"{where}: release ranges '{a.text}' and '{b.text}' overlap")
    if full:
        ordered = sorted(ranges, key=lambda r: (r.lo is not None, r.lo or ()))
        edge: Version | None = None
        for i, r in enumerate(ordered):
            if (i == 0 and r.lo is not None) or (i > 0 and r.lo != edge):
                raise _fail(path, f"{where}: the release ranges leave a gap before '{r.text}'")
            edge = r.hi
        if not ordered or edge is not None:
            raise _fail(path, f"{where}: the release ranges must cover every release")


def _parse_ids_source(path: Path, i: int, raw: object, runners: Mapping[str, str]) -> IdsSource:
    where = f"capture_ids {i}"
    raw = _keys(path, raw, where, {"releases", "runners", "read", "switch", "why", "source"},
                {"empty_is_absent"})
    run = raw["runners"]
    if run == ANY:
        run_t = None
    else:
        run_t = _strings(path, run, f"{where} 'runners'", empty=False)
        if not set(run_t) <= set(runners):
            raise _fail(path, f"{where}: unknown runners {sorted(set(run_t) - set(runners))}")
    if not isinstance(raw["read"], list) or not raw["read"]:
        raise _fail(path, f"{where}: 'read' must be a non-empty list")
    reads = []
    for j, item in enumerate(raw["read"]):
        w = f"{where} read {j}"
        if not isinstance(item, dict) or len({"field", "launch_option"} & set(item)) != 1:
            raise _fail(path, f"{w} needs exactly one of 'field' or 'launch_option'")
        kind = "field" if "field" in item else "launch_option"
        item = _keys(path, item, w, {kind}, {"add"})
        add = item.get("add", 0)
        if isinstance(add, bool) or not isinstance(add, int):
            raise _fail(path, f"{w}: 'add' must be an integer")
        _text(path, item, kind, w)
        reads.append(IdRead(IdField("config" if kind == "field" else "launch_option", item[kind]), add))
    switch = raw["switch"]
    if switch is not None and (not isinstance(switch, str) or not switch):
        raise _fail(path, f"{where}: 'switch' must be a field name or null")
    empty = raw.get("empty_is_absent", True)
    if not isinstance(empty, bool):
        raise _fail(path, f"{where}: 'empty_is_absent' must be true or false")
    return IdsSource(_range(path, raw, where), run_t, tuple(reads), switch, empty,
                     _text(path, raw, "why", where), _text(path, raw, "source", where))


def _parse_fc(path: Path, i: int, raw: object) -> FcWidth:
    where = f"fc_width {i}"
    raw = _keys(path, raw, where, {"releases", "drafters", "read", "fallback", "why", "source"})
    drafters = _strings(path, raw["drafters"], f"{where} 'drafters'", empty=False)
    if not set(drafters) <= set(DRAFTER_KINDS):
        raise _fail(path, f"{where}: drafters must be among {list(DRAFTER_KINDS)}")
    if not isinstance(raw["read"], list):
        raise _fail(path, f"{where}: 'read' must be a list")
    reads = []
    for j, item in enumerate(raw["read"]):
        item = _keys(path, item, f"{where} read {j}", {"field", "as"})
        if item["as"] not in ("count", "length"):
            raise _fail(path, f"{where} read {j}: 'as' must be 'count' or 'length'")
        reads.append(FcRead(_text(path, item, "field", f"{where} read {j}"), item["as"]))
    fallback = raw["fallback"]
    if isinstance(fallback, bool) or not isinstance(fallback, int) or fallback < 1:
        raise _fail(path, f"{where}: 'fallback' must be a positive integer")
    return FcWidth(_range(path, raw, where), drafters, tuple(reads), fallback,
                   _text(path, raw, "why", where), _text(path, raw, "source", where))


def _parse_forward(path: Path, i: int, raw: object, table: Sequence[Switch]) -> Forward:
    where = f"forward {i}"
    values = forward_values(table)
    raw = _keys(path, raw, where, {"releases", "drafters", "why", "source", "architectures", *values},
                {"mask_token_fields", "sliding_window_option", "layers_source"})
    drafters = _strings(path, raw["drafters"], f"{where} 'drafters'", empty=False)
    if not set(drafters) <= set(DRAFTER_KINDS):
        raise _fail(path, f"{where}: drafters must be among {list(DRAFTER_KINDS)}")
    for key, allowed in values.items():
        if raw[key] is not None and raw[key] not in allowed:
            raise _fail(path, f"{where}: '{key}' must be one of {list(allowed)} or null (not read)")
    archs = None if raw["architectures"] is None else _strings(path, raw["architectures"],
                                                                 f"{where} 'architectures'", empty=False)
    option = raw.get("sliding_window_option")
    if (raw["sliding_window"] == "launch_option") != (option is not None):
        raise _fail(path, f"{where}: 'sliding_window_option' names the launch option exactly when 'sliding_window' "
                          "is \"launch_option\"")
    if option is not None and (not isinstance(option, str) or not option.startswith("--")):
        raise _fail(path, f"{where}: 'sliding_window_option' must be a launch option such as \"--name\"")
    return Forward(_range(path, raw, where), drafters, raw["rope_interleave"], raw["embedding"],
                   raw["head_without_draft_vocab_size"], _text(path, raw, "why", where),
                   _text(path, raw, "source", where),
                   **{k: raw[k] for k in _SETTINGS if k not in (
                       "rope_interleave", "embedding", "head_without_draft_vocab_size")},
                   readings=tuple((s, s.engine.handling(raw[f]))  # type: ignore[union-attr]
                                  for f, s in _switch_fields(table).items()),
                   architectures=archs,
                   mask_token_fields=None if raw.get("mask_token_fields") is None else _strings(
                       path, raw["mask_token_fields"], f"{where} 'mask_token_fields'", empty=False),
                   sliding_window_option=option, layers_source=_layers_source(path, raw, where))


def _layers_source(path: Path, raw: dict, where: str) -> str | None:
    """Where ``layers_without_weights`` / ``weights_past_layers`` were read: required when either is given."""
    if raw["layers_without_weights"] is None and raw["weights_past_layers"] is None:
        return None
    if not isinstance(raw.get("layers_source"), str) or not raw["layers_source"].strip():
        raise _fail(path, f"{where}: 'layers_source' must name where layers_without_weights and "
                          "weights_past_layers were read")
    return raw["layers_source"]


def _parse_rule(path: Path, i: int, raw: object, families: Mapping[str, Family]) -> Rule:
    where = f"rule {i}"
    if not isinstance(raw, dict):
        raise _fail(path, f"{where} must be an object")
    supported = raw.get("supported", True)
    base = {"family", "releases", "why", "source"}
    if supported is True:
        raw = _keys(path, raw, where, base | {"explicit", "default", "embedding", "final_output"}, {"supported"})
    else:
        raw = _keys(path, raw, where, base | {"supported"})
        if supported is not False:
            raise _fail(path, f"{where}: 'supported' must be true or false")
    family = _text(path, raw, "family", where)
    if family != ANY and family not in families:
        raise _fail(path, f"{where}: family '{family}' is not in {FAMILIES_FILE}.json")
    explicit = default = None
    embedding = final = False
    if supported:
        explicit, default = raw["explicit"], raw["default"]
        if not isinstance(explicit, str) or explicit not in EXPLICIT_KINDS:
            raise _fail(path, f"{where}: explicit '{explicit}' is not one of {sorted(EXPLICIT_KINDS)}")
        if not isinstance(default, str) or default not in DEFAULT_KINDS:
            raise _fail(path, f"{where}: default '{default}' is not one of {list(DEFAULT_KINDS)}")
        embedding = _bool(path, raw, "embedding", where)
        final = _bool(path, raw, "final_output", where)
    return Rule(family, _range(path, raw, where), supported, explicit, default, embedding, final,
                _text(path, raw, "why", where), _text(path, raw, "source", where))


def load_engine_file(path: str | Path, families: Mapping[str, Family],
                     table: Sequence[Switch] | None = None) -> Engine:
    """Load and validate one engine's rules against the family table and the variant table (``table``:
    mappings/variants.json's by default): every forward entry says how the release reads every switch.
    Raises :class:`MappingFileError`."""
    table = switches() if table is None else table
    path = Path(path)
    raw = _keys(
        path,
        _load_json(path),
        "the file",
        {"schema", "engine", "title", "aliases", "releases", "releases_why", "runners",
         "capture_ids", "fc_width", "default_ids", "rules", "forward", "check_by_default"},
        {"quantization"},  # read by spec/quant.py (quantized drafters)
    )
    name = _text(path, raw, "engine", "the file")
    if name != path.stem:
        raise _fail(path, f"'engine' is '{name}' but the file is named {path.name}")
    _text(path, raw, "releases_why", "the file")
    labels = _strings(path, raw["releases"], "'releases'")
    try:
        releases = tuple((parse_version(label), label) for label in labels)
    except UsageError as err:
        raise _fail(path, f"'releases': {err.message}") from None
    if [v for v, _ in releases] != sorted({v for v, _ in releases}):
        raise _fail(path, "'releases' must be ascending, without repeats")
    runners: Mapping[str, str] = MappingProxyType({})
    default_runner = None
    if raw["runners"] is not None:
        r = _keys(path, raw["runners"], "'runners'", {"default", "known", "why", "source"})
        _text(path, r, "why", "'runners'")
        _text(path, r, "source", "'runners'")
        if not isinstance(r["known"], dict) or not r["known"] or not all(
            isinstance(v, str) and v for v in r["known"].values()
        ):
            raise _fail(path, "'runners.known' must map runner names to descriptions")
        if not isinstance(r["default"], str) or r["default"] not in r["known"]:
            raise _fail(path, "'runners.default' must be one of 'runners.known'")
        runners, default_runner = MappingProxyType(dict(r["known"])), r["default"]
    for key in ("capture_ids", "fc_width", "rules", "forward"):
        if not isinstance(raw[key], list):
            raise _fail(path, f"'{key}' must be a list")
    sources = tuple(_parse_ids_source(path, i, s, runners) for i, s in enumerate(raw["capture_ids"]))
    fc = tuple(_parse_fc(path, i, f) for i, f in enumerate(raw["fc_width"]))
    rules = tuple(_parse_rule(path, i, r, families) for i, r in enumerate(raw["rules"]))
    forward = tuple(_parse_forward(path, i, f, table) for i, f in enumerate(raw["forward"]))
    if not releases and any(x.releases.text != ANY for x in (*rules, *sources, *fc, *forward)):
        raise _fail(path, "an engine with no releases read can only have '*' release ranges")
    for runner in tuple(runners) or (None,):
        picked = [s.releases for s in sources if s.runners is None or runner in s.runners]
        _check_cover(path, picked, f"capture_ids for runner {runner or 'any'}", full=True)
    for drafter in DRAFTER_KINDS:
        picked = [f.releases for f in fc if drafter in f.drafters]
        _check_cover(path, picked, f"fc_width for {drafter} drafters", full=bool(fc))
        picked = [f.releases for f in forward if drafter in f.drafters]
        _check_cover(path, picked, f"forward for {drafter} drafters", full=True)
    d = _keys(path, raw["default_ids"], "'default_ids'", {"ids", "why", "source"})
    default_ids = _strings(path, d["ids"], "'default_ids.ids'", empty=False)
    for term in default_ids:
        if not _DEFAULT_TERM.match(term):
            raise _fail(path, f"'default_ids.ids': '{term}' is not a number, N, N//2, or one of those +/- a number")
    for fam in {r.family for r in rules}:
        _check_cover(path, [r.releases for r in rules if r.family == fam], f"rules for family '{fam}'",
                     full=fam == ANY)
    c = _keys(path, raw["check_by_default"], "'check_by_default'", {"releases", "why"})
    checked = _strings(path, c["releases"], "'check_by_default.releases'", empty=False)
    unknown = [x for x in checked if x != "newest" and x not in labels]
    if unknown or len(set(checked)) != len(checked):
        raise _fail(path, f"'check_by_default.releases' must name releases of 'releases' (or 'newest'), once "
                          f"each; got {list(checked)}")
    return Engine(
        name=name,
        title=_text(path, raw, "title", "the file"),
        aliases=_strings(path, raw["aliases"], "'aliases'"),
        releases=releases,
        default_runner=default_runner,
        runners=runners,
        capture_ids=sources,
        fc_width=fc,
        default_ids=default_ids,
        default_why=_text(path, d, "why", "'default_ids'"),
        default_source=_text(path, d, "source", "'default_ids'"),
        rules=rules,
        path=path,
        forward=forward,
        check_by_default=checked,
        quantization=_quantization(path, raw.get("quantization")),
    )


def _quantization(path: Path, raw: object) -> tuple:
    """The file's ``quantization`` entries, kept as written for spec/quant.py (a list of objects)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(e, dict) for e in raw):
        raise _fail(path, "'quantization' must be a list of objects")
    return tuple(raw)


@cache
def load_rules_folder(folder: Path) -> tuple[Mapping[str, Family], Mapping[str, Engine], Mapping[str, str]]:
    """Families, engines by name, and lowercased name/alias -> engine name, from a folder of
    rule files (cached per folder)."""
    families = load_families_file(folder / f"{FAMILIES_FILE}.json")
    engines: dict[str, Engine] = {}
    names: dict[str, str] = {}
    for stem in ENGINE_FILES:
        engine = load_engine_file(folder / f"{stem}.json", families)
        engines[engine.name] = engine
        for key in (engine.name, *engine.aliases):
            if names.setdefault(key.lower(), engine.name) != engine.name:
                raise MappingFileError(f"engine name '{key}' is claimed twice in {folder}")
    return families, MappingProxyType(engines), MappingProxyType(names)


@cache
def rules_data() -> tuple[Mapping[str, Family], Mapping[str, Engine], Mapping[str, str]]:
    """The shipped rules: families, engines by name, name/alias -> engine name (found and loaded
    once per process; every engine question asks here)."""
    return load_rules_folder(data_path("engines"))


def families() -> Mapping[str, Family]:
    """The family table (mappings/engines/families.json), by name."""
    return rules_data()[0]


def engines() -> Mapping[str, Engine]:
    """Every engine's rules, by name."""
    return rules_data()[1]


def family_for(architectures: Iterable[str] | None, model_type: str | None = None,
               *more_model_types: str | None) -> str | None:
    """The family of a target from its config.json ``architectures`` (checked first)
    and ``model_type`` (then any nested model types, e.g. ``text_config``'s). None when
    the table does not know it."""
    table = families().values()
    for arch in architectures or ():
        for fam in table:
            if arch in fam.architectures:
                return fam.name
    for mt in (model_type, *more_model_types):
        for fam in table:
            if mt and mt in fam.model_types:
                return fam.name
    return None


def check_family(name: str) -> str:
    """``name`` if it is in the family table, else a :class:`UsageError`."""
    if name not in families():
        raise UsageError(f"unknown target family '{name}'; known: {', '.join(sorted(families()))}")
    return name

