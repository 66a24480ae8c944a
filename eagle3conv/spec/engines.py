"""Which target hidden states each serving engine captures for an EAGLE-3 drafter.

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

Main entry points: :func:`parse_engine`, :func:`default_engines`, :func:`capture`
(config -> the layers an engine captures, and why) and :func:`ids_for` (layers ->
the ids to write so that an engine captures them). Pure Python, no torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from eagle3conv.io.data import data_path
from eagle3conv.errors import MappingFileError, UsageError
from eagle3conv.spec.layers import LayerRef, LayerSet, describe, validate_refs
from eagle3conv.spec.drafter import architecture_key

SCHEMA = 1
ENGINE_FILES = ("sglang", "vllm", "tensorrt-llm")
FAMILIES_FILE = "families"
ANY = "*"

Version = tuple[int, ...]

# --------------------------------------------------------------------------- rule kinds

Interpret = Callable[[tuple[int, ...], int], tuple[int, ...]]


def _plus_one(ids: tuple[int, ...], n: int) -> tuple[int, ...]:
    return tuple(i + 1 for i in ids)


def _raw(ids: tuple[int, ...], n: int) -> tuple[int, ...]:
    return tuple(ids)


def _plus_one_if_first_is_1(ids: tuple[int, ...], n: int) -> tuple[int, ...]:
    return _plus_one(ids, n) if ids and ids[0] == 1 else _raw(ids, n)


def _raw_if_max_is_n(ids: tuple[int, ...], n: int) -> tuple[int, ...]:
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


def _shown(text: str, limit: int = 40) -> str:
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def parse_version(text: str) -> Version:
    """``"0.5.13"`` -> (0, 5, 13, 0); ``"0.33"`` -> (0, 33, 0, 0); ``"0.5.12.post1"``
    -> (0, 5, 12, 1). Three release numbers (padded) and a post number."""
    m = _VERSION.match(text.strip())
    if not m:
        raise UsageError(f"'{_shown(text)}' is not a release number such as 0.5.23 or 0.5.12.post1 "
                         "(at most 9 digits a number)")
    base = tuple(int(p) for p in m.group(1).split("."))
    if len(base) > 3:
        raise UsageError(f"'{_shown(text)}' has more than three release numbers")
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
class IdRead:
    """One place an engine looks for ids: a config field (dotted path into nested
    objects) or a launch option; ``add`` is added to each id read there."""

    field: str | None = None
    launch_option: str | None = None
    add: int = 0

    @property
    def name(self) -> str:
        return self.field if self.field is not None else f"launch option {self.launch_option}"


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


FORWARD_VALUES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "rope_interleave": ("config", "always"),
        "norm_before_residual": ("config", "ignored"),
        "embedding": ("target", "own_unless_equal"),
        "head_without_draft_vocab_size": ("target", "own"),
    }
)
"""How an engine runs the drafter where engines differ (null in the data: not applicable
or not read, and the drafter runs as its config says): ``rope_interleave`` "config"
(honoured) or "always" (interleaved whatever the flag); ``norm_before_residual``
"config" or "ignored" (the residual is the un-normed state); ``embedding`` "target"
(the target's table, unless the drafter's hidden size differs from the target's) or
"own_unless_equal" (the drafter's own ``embed_tokens`` when it has one that is not
identical to the target's); ``head_without_draft_vocab_size`` "target" or "own"."""


@dataclass(frozen=True)
class Forward:
    """How one engine runs one kind of drafter (see :data:`FORWARD_VALUES`)."""

    releases: ReleaseRange
    drafters: tuple[str, ...]
    rope_interleave: str | None
    norm_before_residual: str | None
    embedding: str | None
    head_without_draft_vocab_size: str | None
    why: str
    source: str


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


def _fail(path: Path, message: str) -> MappingFileError:
    return MappingFileError(f"engine rules {path}: {message}")


def _keys(path: Path, raw: object, where: str, required: set[str], optional: set[str] = frozenset()) -> dict:
    if not isinstance(raw, dict):
        raise _fail(path, f"{where} must be an object")
    unknown, missing = set(raw) - required - optional, required - set(raw)
    if unknown or missing:
        raise _fail(path, f"{where}: unknown fields {sorted(unknown)}, missing fields {sorted(missing)}")
    return raw


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


def _default_term(term: str, n: int) -> int:
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
        reads.append(IdRead(**{kind: item[kind]}, add=add))
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


def _parse_forward(path: Path, i: int, raw: object) -> Forward:
    where = f"forward {i}"
    raw = _keys(path, raw, where, {"releases", "drafters", "why", "source", *FORWARD_VALUES})
    drafters = _strings(path, raw["drafters"], f"{where} 'drafters'", empty=False)
    if not set(drafters) <= set(DRAFTER_KINDS):
        raise _fail(path, f"{where}: drafters must be among {list(DRAFTER_KINDS)}")
    for key, allowed in FORWARD_VALUES.items():
        if raw[key] is not None and raw[key] not in allowed:
            raise _fail(path, f"{where}: '{key}' must be one of {list(allowed)} or null (not read)")
    return Forward(_range(path, raw, where), drafters, raw["rope_interleave"], raw["norm_before_residual"],
                   raw["embedding"], raw["head_without_draft_vocab_size"],
                   _text(path, raw, "why", where), _text(path, raw, "source", where))


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


def load_engine_file(path: str | Path, families: Mapping[str, Family]) -> Engine:
    """Load and validate one engine's rules against the family table.
    Raises :class:`MappingFileError`."""
    path = Path(path)
    raw = _keys(
        path,
        _load_json(path),
        "the file",
        {"schema", "engine", "title", "aliases", "releases", "releases_why", "runners",
         "capture_ids", "fc_width", "default_ids", "rules", "forward"},
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
    forward = tuple(_parse_forward(path, i, f) for i, f in enumerate(raw["forward"]))
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
    )


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


def _data() -> tuple[Mapping[str, Family], Mapping[str, Engine], Mapping[str, str]]:
    return load_rules_folder(data_path("engines"))


def families() -> Mapping[str, Family]:
    """The family table (mappings/engines/families.json), by name."""
    return _data()[0]


def engines() -> Mapping[str, Engine]:
    """Every engine's rules, by name."""
    return _data()[1]


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


# --------------------------------------------------------------------------- releases


@dataclass(frozen=True)
class EngineRelease:
    """One engine at one release. ``version`` is () for an engine whose rules are not
    pinned to releases (TensorRT-LLM). ``note`` says how an unknown version was read."""

    engine: str
    version: Version
    label: str
    note: str | None = field(default=None, compare=False)
    runner: str | None = None
    """The runner asked for (``vllm==0.33.0:runner=v1``); None: the engine's default."""

    def __str__(self) -> str:
        return f"{self.label} ({self.runner} runner)" if self.runner else self.label


def _label(engine: Engine, release: str | None) -> str:
    return f"{engine.name} {release}" if release else engine.name


def _engine_named(name: str) -> Engine:
    table = _data()
    key = table[2].get(name.strip().lower())
    if key is None:
        raise UsageError(
            f"unknown engine '{_shown(name)}'; known: {', '.join(sorted(table[2]))}",
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
        raise UsageError(f"'{_shown(text)}': no runner after '{RUNNER_SUFFIX}'",
                         hint=f"e.g. vllm==0.33.0{RUNNER_SUFFIX}v1")
    return replace(rel, runner=_runner(eng, runner.strip()))


def _parse_release(text: str) -> EngineRelease:
    name, sep, release = text.strip().partition("==")
    engine = _engine_named(name)
    if sep and not release.strip():
        raise UsageError(f"'{_shown(text)}': no release after '=='", hint="e.g. sglang==0.5.23")
    if not engine.releases:
        note = None
        if sep:
            parse_version(release)
            note = (f"{engine.title} rules are not pinned to releases; {release.strip()} is read "
                    "with the same rules (docs/facts.md §9)")
        return EngineRelease(engine.name, (), engine.name, note)
    if not sep:
        version, label = engine.releases[-1]
        return EngineRelease(engine.name, version, _label(engine, label))
    wanted = parse_version(release)
    for version, label in engine.releases:
        if version == wanted:
            return EngineRelease(engine.name, version, _label(engine, label))
    newest, oldest = engine.releases[-1], engine.releases[0]
    asked = f"{engine.name} {release.strip()}"
    if wanted > newest[0]:
        return EngineRelease(engine.name, newest[0], _label(engine, newest[1]),
                             f"{asked} is not known; read as {newest[1]}, the newest known")
    if wanted < oldest[0]:
        return EngineRelease(engine.name, oldest[0], _label(engine, oldest[1]),
                             f"{asked} is not known; read as {oldest[1]}, the oldest known "
                             "(older releases were not read)")
    return EngineRelease(engine.name, wanted, asked,
                         f"{asked} was not read; the rules of its release range apply")


def default_engines() -> tuple[EngineRelease, ...]:
    """The releases a check covers by default: every engine's newest, plus SGLang 0.5.12
    (the last release before SGLang's first-id rule for DeepSeek-family targets)."""
    out = [parse_engine("sglang==0.5.12")]
    out += [parse_engine(name) for name in ENGINE_FILES]
    return tuple(out)


def _as_release(engine: EngineRelease | str) -> EngineRelease:
    return engine if isinstance(engine, EngineRelease) else parse_engine(engine)


def _pick(items: Iterable[Any], version: Version, what: str, engine: Engine) -> Any:
    for item in items:
        if not version or version in item.releases:
            return item
    raise MappingFileError(f"engine rules {engine.path}: no {what} covers this release")  # validated at load


def rule_for(engine: EngineRelease | str, family: str | None) -> Rule:
    """The rule an engine release applies to a target family (None: the rule for
    families the table does not single out)."""
    rel = _as_release(engine)
    eng = engines()[rel.engine]
    if family is not None:
        check_family(family)
        own = [r for r in eng.rules if r.family == family]
        for r in own:
            if not rel.version or rel.version in r.releases:
                return r
    return _pick([r for r in eng.rules if r.family == ANY], rel.version, "rule for '*'", eng)


# --------------------------------------------------------------------------- capture


@dataclass(frozen=True)
class Capture:
    """What one engine release captures for one drafter config on one target."""

    engine: EngineRelease
    family: str | None
    runner: str | None
    field: str
    """The config field (or launch option) the ids were read from, or ``"default"``."""
    ids: tuple[int, ...] | None
    """The ids as read (after a field's own shift), or the default list; None when unreadable."""
    fell_back: bool
    fallback_why: str | None
    kind: str | None
    """The rule kind applied to ``ids`` (see :data:`KIND_WORDS`)."""
    layers: LayerSet | None
    """The captured states in the order the drafter's fc receives them (depth order); None on error."""
    fc_field: str | None
    """What sizes the drafter's fc: a config field, ``"default (3)"``, or None when not known."""
    fc_slots: int | None
    error: str | None
    why: str
    source: str
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None

    def summary(self) -> str:
        where = "no ids, its default" if self.fell_back else f"{self.field} {list(self.ids or ())}"
        who = f"{self.engine}{f' ({self.runner} runner)' if self.runner else ''}"
        if self.error:
            return f"{who}: {self.error}"
        return f"{who} reads {where} ({KIND_WORDS[self.kind]}) -> {describe(self.layers or ())}"


def _lookup(config: Mapping[str, Any] | None, path: str) -> tuple[bool, Any]:
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


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
        found, value = _lookup(config, read.field)
        if read.as_ == "count" and found and isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return read.field, value
        if read.as_ == "length" and found and isinstance(value, list) and value:
            return read.field, len(value)
    return f"default ({fc.fallback})", fc.fallback


def _runner(eng: Engine, runner: str | None) -> str | None:
    if not eng.runners:
        if runner is not None:
            raise UsageError(f"{eng.title} has no runner choice; got runner '{_shown(runner)}'")
        return None
    if runner is None:
        return eng.default_runner
    if runner not in eng.runners:
        raise UsageError(f"unknown {eng.title} runner '{_shown(runner)}'; known: {', '.join(eng.runners)}")
    return runner


def _boundary_errors(rule: Rule, boundaries: tuple[int, ...], n: int, eng: Engine) -> str | None:
    for slot, b in enumerate(boundaries):
        if b == 0 and not rule.embedding:
            return (f"slot {slot} would be the embedding output (before layer 0), which "
                    f"{eng.title} cannot capture for this target")
        if b == n and not rule.final_output:
            return (f"slot {slot} would be the output of the last layer ({n - 1}), which "
                    f"{eng.title} never captures for this target (it captures only at a layer's entry)")
        if b < 0 or b > n:
            return (f"slot {slot} would be captured before layer {b}, which a {n}-layer target "
                    "does not have: that state is never captured")
    seen = [b for i, b in enumerate(boundaries) if b in boundaries[:i]]
    if seen:
        return f"the state before layer {seen[0]} is named twice: the engine captures it once"
    return None


def capture(
    engine: EngineRelease | str,
    config: Mapping[str, Any] | None,
    family: str | None,
    num_layers: int,
    runner: str | None = None,
    *,
    launch_ids: Sequence[int] | None = None,
) -> Capture:
    """The target states ``engine`` captures for a drafter with ``config`` (its
    config.json as a dict) on an ``num_layers``-layer target of ``family``.

    ``family=None``: the target's family is unknown; the rule for the families the
    table does not single out applies, with a note. ``runner``: vLLM's ``mrv2``
    (default) or ``v1``. ``launch_ids``: TensorRT-LLM's ``eagle3_layers_to_capture``.
    Never raises for a bad config: the problem is in :attr:`Capture.error`.
    Raises :class:`UsageError` for an unknown engine, family or runner.
    """
    rel = _as_release(engine)
    eng = engines()[rel.engine]
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise UsageError(f"the target's layer count must be a positive integer, got {num_layers!r}")
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
        return Capture(**base, **kw, notes=tuple(notes))

    if not rule.supported:
        return result(field="default", ids=None, fell_back=False, fallback_why=None, kind=None,
                      layers=None, error=f"{rel} cannot serve an EAGLE-3 drafter on this target: {rule.why}")
    src = _pick([s for s in eng.capture_ids if s.runners is None or run in s.runners],
                rel.version, "capture_ids", eng)
    if src.switch:
        found, value = _lookup(config, src.switch)
        if found and value is False:
            return result(field=src.switch, ids=None, fell_back=False, fallback_why=None, kind=None,
                          layers=None, error=f"{src.switch} is false: {rel} captures no aux states "
                          "and the drafter gets none")
    read_ids: tuple[int, ...] | None = None
    used: IdRead | None = None
    for read in src.read:
        if read.launch_option is not None:
            found, value = launch_ids is not None, list(launch_ids) if launch_ids is not None else None
        else:
            found, value = _lookup(config, read.field)
        if not found or value is None or (src.empty_is_absent and value == []):
            continue
        ids = _int_list(value)
        if ids is None:
            return result(field=read.name, ids=None, fell_back=False, fallback_why=None, kind=None,
                          layers=None, error=f"{read.name} is {value!r}, not a list of integer ids")
        read_ids, used = tuple(i + read.add for i in ids), read
        if read.add:
            notes.append(f"{read.name} ids are shifted by {read.add:+d} when read")
        break
    if used is None:
        ids = tuple(_default_term(t, n) for t in eng.default_ids)
        kind = rule.default
        looked = ", ".join(r.name for r in src.read)
        field_name, fell_back = "default", True
        fallback_why = f"no ids in {looked}: {rel} uses its default {list(ids)} ({eng.default_why})"
    else:
        ids, kind, field_name, fell_back, fallback_why = read_ids, rule.explicit, used.name, False, None
    assert kind is not None and ids is not None
    common = dict(field=field_name, ids=ids, fell_back=fell_back, fallback_why=fallback_why, kind=kind)
    if not ids:
        return result(**common, layers=None,
                      error=f"{field_name} is an empty list: {rel} captures nothing")
    boundaries = EXPLICIT_KINDS[kind](ids, n)
    problem = _boundary_errors(rule, boundaries, n, eng)
    if problem:
        return result(**common, layers=None, error=f"{field_name} {list(ids)} ({KIND_WORDS[kind]}): {problem}")
    order = sorted(boundaries)
    if list(boundaries) != order:
        notes.append(f"the ids are not in depth order; {rel} captures the states in depth order, "
                     "so the drafter's fc chunks follow depth, not the order written")
    layers = tuple(LayerRef(b - 1) for b in order)
    if fc_slots is not None and fc_slots != len(layers):
        return result(**common, layers=None,
                      error=f"{rel} captures {len(layers)} states but sizes the drafter's fc for "
                            f"{fc_slots} (from {fc_field})")
    return result(**common, layers=layers, error=None)


def id_field(engine: EngineRelease | str, runner: str | None = None) -> str:
    """Where the ids an engine reads first live: a config field (dotted) or
    ``"launch option NAME"``."""
    rel = _as_release(engine)
    eng = engines()[rel.engine]
    run = _runner(eng, runner if runner is not None else rel.runner)
    src = _pick([s for s in eng.capture_ids if s.runners is None or run in s.runners],
                rel.version, "capture_ids", eng)
    return src.read[0].name


def ids_for(
    engine: EngineRelease | str,
    family: str | None,
    num_layers: int,
    layers: Iterable[LayerRef],
    runner: str | None = None,
) -> tuple[int, ...] | None:
    """The ids to write (in :func:`id_field`) so that ``engine`` captures ``layers``
    on an ``num_layers``-layer target of ``family``; None when no id list can (the
    engine cannot reach a state, or the states are not in depth order, which is
    the only order engines deliver). Ids of the form "output of layer i" are
    preferred when both forms work: older releases read them the same way more often.
    """
    rel = _as_release(engine)
    eng = engines()[rel.engine]
    runner = _runner(eng, runner if runner is not None else rel.runner)
    wanted = validate_refs(layers, num_layers)
    rule = rule_for(rel, family)
    if not wanted or not rule.supported:
        return None
    boundaries = tuple(r.output_of + 1 for r in wanted)
    if list(boundaries) != sorted(boundaries):
        return None
    assert rule.explicit is not None
    add = _first_add(eng, rel, runner)
    for candidate in (tuple(b - 1 for b in boundaries), boundaries):
        got = EXPLICIT_KINDS[rule.explicit](candidate, num_layers)
        if got == boundaries and _boundary_errors(rule, got, num_layers, eng) is None:
            return tuple(i - add for i in candidate)
    return None


def _first_add(eng: Engine, rel: EngineRelease, runner: str | None) -> int:
    run = _runner(eng, runner)
    src = _pick([s for s in eng.capture_ids if s.runners is None or run in s.runners],
                rel.version, "capture_ids", eng)
    return src.read[0].add


# --------------------------------------------------------------------------- forward


def forward_rule(engine: EngineRelease | str, drafter: str) -> Forward:
    """How ``engine`` runs a ``drafter`` ("llama" or "mla") drafter (the "forward" rows of
    mappings/engines/*.json)."""
    rel = _as_release(engine)
    eng = engines()[rel.engine]
    return _pick([f for f in eng.forward if drafter in f.drafters], rel.version, "forward", eng)


@dataclass(frozen=True)
class Serving:
    """How one engine release runs one drafter config, where engines differ (docs/facts.md §9).

    ``rope_interleave``: the RoPE layout it runs (MLA drafters; None for Llama drafters,
    whose RoPE no engine changes). ``norm_before_residual``: whether it norms the
    residual. ``own_embedding``: "never" (the target's table), or "unless_equal" (the
    drafter's own ``embed_tokens``, which it ships, unless identical to the target's: the
    caller compares). ``differences``: where it runs the drafter otherwise than its
    config.json says; ``not_emulated``: differences a run on captured states cannot show;
    ``not_read``: what the rules do not record for this engine (run as SGLang does).
    ``target_head``: it replaces the drafter's ``lm_head`` with the target's (no
    ``draft_vocab_size`` in config.json) and the target's head is at hand, so the run
    uses it."""

    engine: EngineRelease
    drafter: str
    rope_interleave: bool | None
    norm_before_residual: bool
    own_embedding: str
    differences: tuple[str, ...]
    not_emulated: tuple[str, ...]
    not_read: tuple[str, ...]
    why: str
    source: str
    target_head: bool = False


def serving(engine: EngineRelease | str, config: Mapping[str, Any] | None,
            tensor_names: Iterable[str] = (), *, target_head_at_hand: bool = False) -> Serving:
    """How ``engine`` runs the drafter with ``config`` and tensors ``tensor_names``.
    ``target_head_at_hand``: the target's ``lm_head`` was given (verify ``--embeddings``),
    so an engine that would use it instead of the drafter's is run with it."""
    rel = _as_release(engine)
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
    if fw.norm_before_residual == "config":
        nbr = nbr_declared
    else:
        nbr = False
        if fw.norm_before_residual == "ignored" and nbr_declared:
            diffs.append(f"norm_before_residual is true in config.json, but {who} ignores it (the residual is "
                         "the un-normed state)")
        elif fw.norm_before_residual is None:
            not_read.append(f"whether {who} honours norm_before_residual")
    own = "never"
    if fw.embedding == "own_unless_equal" and "embed_tokens.weight" in names:
        own = "unless_equal"
    elif fw.embedding is None:
        not_read.append(f"which embedding {who} uses")
    target_head = False
    if cfg.get("draft_vocab_size") is None and "lm_head.weight" in names:
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
    return Serving(rel, kind, rope, nbr, own, tuple(diffs), tuple(missing), tuple(not_read), fw.why, fw.source,
                   target_head)


# --------------------------------------------------------------------------- the SGLang ids to write

SGLANG_NUMBERINGS: Mapping[str, str] = MappingProxyType(
    {"sglang-old": "sglang==0.5.12", "sglang-new": "sglang"}
)
"""The two SGLang readings a written id list is judged against: ``sglang-old`` is the last
release before the first-id rule (0.5.12), ``sglang-new`` the newest release read. For a
family whose model file never changed its rule they read ids alike."""


@dataclass(frozen=True)
class SglangIds:
    """Ids to write in ``eagle_config.eagle_aux_hidden_state_layer_ids`` for SGLang."""

    ids: tuple[int, ...]
    right_for: tuple[str, ...]
    """The numberings (:data:`SGLANG_NUMBERINGS`) that capture the layers from ``ids``."""
    by_version: Mapping[str, tuple[int, ...] | None]
    """The right ids per numbering (None: that release cannot capture the set)."""
    note: str

    @property
    def portable(self) -> bool:
        return len(self.right_for) == len(SGLANG_NUMBERINGS)


def _nested(ids: Sequence[int]) -> dict:
    return {"eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ids)}}


def sglang_ids(layers: Iterable[LayerRef], family: str | None, num_layers: int, *,
               prefer: str = "sglang-new") -> SglangIds:
    """The SGLang ids that make ``layers`` captured on an ``num_layers``-layer target of
    ``family``, by the engine rules: ids old and new SGLang read alike when they exist
    (always, for families whose rule never changed), else the ``prefer`` numbering's
    (falling back to the other). Raises :class:`WiringError` when no SGLang release can
    capture the set."""
    from eagle3conv.errors import WiringError

    if prefer not in SGLANG_NUMBERINGS:
        raise UsageError(f"prefer must be one of {', '.join(SGLANG_NUMBERINGS)}, got '{prefer}'")
    wanted = validate_refs(layers, num_layers)
    rels = {k: parse_engine(v) for k, v in SGLANG_NUMBERINGS.items()}
    found = {k: ids_for(r, family, num_layers, wanted) for k, r in rels.items()}
    what = describe(wanted)
    if all(v is None for v in found.values()):
        reasons = []
        for k, r in rels.items():  # say why, in the engine's own words
            cap = capture(r, _nested(to_boundary_ids(wanted)), family, num_layers)
            reasons.append(f"{r}: {cap.error or 'the states are not in depth order'}")
        raise WiringError(f"no SGLang release can capture {what}: {reasons[0]}", details=reasons)

    def right(ids: Sequence[int]) -> tuple[str, ...]:
        return tuple(k for k, r in rels.items()
                     if capture(r, _nested(ids), family, num_layers).layers == wanted)

    other = next(k for k in SGLANG_NUMBERINGS if k != prefer)
    for ids in (found[prefer], found[other]):
        if ids is not None and len(right(ids)) == len(rels):
            return SglangIds(ids, right(ids), MappingProxyType(found),
                             f"old and new SGLang both read {list(ids)} as {what}")
    chosen, rest = (prefer, other) if found[prefer] is not None else (other, prefer)
    ids = found[chosen]
    assert ids is not None
    alt = found[rest]
    tail = f"{rest} needs {list(alt)}" if alt is not None else f"{rest} cannot capture it"
    return SglangIds(ids, right(ids), MappingProxyType(found), f"{list(ids)} means {what} only in {chosen}; {tail}")


def to_boundary_ids(layers: Iterable[LayerRef]) -> tuple[int, ...]:
    """Output-of-layer ids of ``layers`` (-1 for the embedding output)."""
    return tuple(r.output_of for r in layers)
