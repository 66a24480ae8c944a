"""The canonical tensor table (mappings/canonical.json) and the shapes a config implies."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from functools import lru_cache

from eagle3conv.io.data import data_path
from eagle3conv.errors import InvalidCheckpointError, MappingFileError
from eagle3conv.spec.layers import MAX_LAYERS
from eagle3conv.spec.variants import switches
from eagle3conv.spec.drafter import MLA_ARCHITECTURES, DrafterSpec, architecture_key  # noqa: F401 (re-exported)

_TERM = re.compile(r"^[A-Za-z][A-Za-z0-9]*$|^[0-9]+$")
# the shape symbols a "when" may name besides a switch of mappings/variants.json (DrafterSpec.symbols)
SYMBOLS = ("H", "T", "k", "NH", "NKV", "HD", "I", "V", "Vd", "L", "QL", "KL", "QR", "VH", "QK", "NV")

# The canonical names the code itself spells (everything else it reads from mappings/canonical.json).
# Each is checked against the table's rows when it loads (:func:`_check_named`): a rename in the data
# without one here fails loudly instead of leaving the code looking for a name no row has.
FC = "fc.weight"
FC_BIAS = "fc.bias"
EMBED = "embed_tokens.weight"
LM_HEAD = "lm_head.weight"
NORM = "norm.weight"
D2T = "d2t"
T2D = "t2d"
VOCAB_MAPS = (D2T, T2D)  # the integer (d2t) and boolean (t2d) vocab maps: no weights
MASK_HIDDEN = "mask_hidden"
FIRST_LAYER = "midlayer."  # the prefix of the first decoder layer's tensors (later ones: layers.{i}.)
# name -> the architectures whose rows must hold it (a prefix: some row starts with it)
NAMED = {FC: ("llama", "mla"), FC_BIAS: ("llama", "mla"), EMBED: ("llama", "mla"), LM_HEAD: ("llama", "mla"),
         NORM: ("llama", "mla"), D2T: ("llama", "mla"), T2D: ("llama", "mla"), MASK_HIDDEN: ("llama",),
         FIRST_LAYER: ("llama", "mla")}


@dataclass(frozen=True)
class CanonicalTensor:
    name: str
    shape: tuple[str, ...]
    required: bool
    why: str
    when: str | None = None  # condition for the tensor to belong: "SYM" set/true, "!SYM" unset/false
    required_if: str | None = None  # condition ("A!=B", "SYM") that makes an optional tensor required by the loader
    any_view: bool = False  # the engine reads any shape of this many elements (the shape's product)

    def named(self, name: str) -> CanonicalTensor:
        return replace(self, name=name)


@dataclass(frozen=True)
class Fused:
    name: str
    into: tuple[str, ...]
    rows: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class ConfigDefault:
    """What the engines assume for a config field the drafter's config.json leaves out."""

    field: str
    assumed: str | None  # None: the engines' default was not read (the finding says so)
    level: str  # the audit finding's level: warning or notice
    why: str
    source: str


@dataclass(frozen=True)
class Architecture:
    key: str  # llama | mla
    architecture: str
    tensors: tuple[CanonicalTensor, ...]
    fused: tuple[Fused, ...]
    templated: tuple[CanonicalTensor, ...]  # names with {slot} (one per aux state) or {layer} (one per later layer)
    config_defaults: tuple[ConfigDefault, ...] = ()
    variant_architectures: tuple[tuple[str, str], ...] = ()  # (switch, architecture name written when it is on)

    def name_for(self, flags: dict) -> str:
        """The architecture name fix-keys writes for a drafter with these switches."""
        return next((name for when, name in self.variant_architectures if flags.get(when)), self.architecture)

    def expand(self, symbols: dict, flags: dict | None = None) -> dict[str, CanonicalTensor]:
        """Canonical tensors for a concrete config (`when` applied; ``{slot}`` expanded for the k aux
        states, ``{layer}`` for the later decoder layers 1..L-1).

        ``flags`` are the config's switches (:meth:`DrafterSpec.flags`) that `when` may name."""
        values = {**symbols, **(flags or {})}
        out = {}
        for t in self.tensors:
            if t.when and not holds(t.when, values):
                continue
            out[t.name] = t
        for t in self.templated:
            if t.when and not holds(t.when, values):
                continue
            for name in _instances(t.name, symbols):
                out[name] = t.named(name)
        return out

    def fused_rows(self, symbols: dict) -> list[Fused]:
        """The fused names with ``{layer}`` expanded for the later layers."""
        out = []
        for f in self.fused:
            for i in _indices(f.name, symbols):
                out.append(Fused(_at(f.name, i), tuple(_at(n, i) for n in f.into), f.rows, f.why))
        return out

    def gated(self, name: str) -> CanonicalTensor | None:
        """The row of a tensor name whose `when` condition names a switch (None if no such row)."""
        for t in self.tensors + self.templated:
            if t.when and re.fullmatch(_pattern(t.name), name):
                return t
        return None


def _pattern(template: str) -> str:
    return re.escape(template).replace(re.escape("{slot}"), "[0-9]+").replace(re.escape("{layer}"), "[1-9][0-9]*")


def _indices(template: str, symbols: dict) -> range:
    """The slots or later layers a template expands to; a count past MAX_LAYERS is refused (exit 3),
    never expanded (the validators refuse it first; this is the backstop)."""
    if "{slot}" in template:
        return range(_count(symbols, "k", 0, "aux slots (num_aux_hidden_states)"))
    if "{layer}" in template:
        return range(1, _count(symbols, "L", 1, "decoder layers (num_hidden_layers)"))
    return range(1)


def _count(symbols: dict, key: str, default: int, what: str) -> int:
    n = int(symbols.get(key) or default)
    if n > MAX_LAYERS:
        raise InvalidCheckpointError(f"{n} {what}: eagle3conv takes at most {MAX_LAYERS} (no drafter has more)")
    return n


def _at(template: str, i: int) -> str:
    return template.replace("{slot}", str(i)).replace("{layer}", str(i))


def _instances(template: str, symbols: dict) -> list[str]:
    return [_at(template, i) for i in _indices(template, symbols)]


def layer_of(name: str) -> int | None:
    """The decoder layer a canonical name belongs to: 0 for ``midlayer.*``, i for ``layers.{i}.*``,
    None for the rest (fc, norms around the layers, the head, vocab maps). An index of more than 18
    digits (past any count a file can hold, and past what Python reads from text at 4,300) is read
    as 10^18: callers bound indices by the tensor count long before."""
    if name.startswith(FIRST_LAYER):
        return 0
    m = re.match(r"layers\.([0-9]+)\.", name)
    if not m:
        return None
    digits = m.group(1).lstrip("0") or "0"
    return int(digits) if len(digits) <= 18 else 10**18


def holds(condition: str, values: dict) -> bool:
    """A canonical.json condition: "SYM" (set and not 0/false), "!SYM" (unset or 0/false), "A!=B"."""
    if "!=" in condition:
        a, b = (values.get(x.strip()) for x in condition.split("!="))
        return a is not None and b is not None and a != b
    present = values.get(condition.lstrip("!")) not in (None, 0, False)
    return present != condition.startswith("!")


def shape_matches(row: CanonicalTensor, shape, symbols: dict) -> bool:
    """Whether a tensor of ``shape`` fits its canonical row for a config's ``symbols``: the row's
    dimensions (one whose symbol the config leaves unknown matches any size), or, for an ``any_view``
    row whose size is known, any shape of that many elements. The one reading of the rule: the
    planner (fix-keys, inspect) and the strict loader (verify, push's gate) both ask here."""
    expect = [eval_dim(d, symbols) for d in row.shape]
    if row.any_view and None not in expect and math.prod(expect) == math.prod(shape):
        return True  # the engine reads any shape of this many elements (mask_hidden: [1, 1, k*T] or [k*T])
    return len(expect) == len(shape) and all(e is None or e == s for e, s in zip(expect, shape))


def eval_dim(expr: str, symbols: dict) -> int | None:
    """Evaluate a dimension like "NH*HD", "2*H" or "KL+QR". None if a symbol is unknown."""
    total = 0
    for term in expr.split("+"):
        prod = 1
        for factor in term.split("*"):
            factor = factor.strip()
            if not _TERM.match(factor):
                raise MappingFileError(f"bad dimension expression {expr!r}")
            if factor.isdigit():
                prod *= int(factor)
            else:
                v = symbols.get(factor)
                if v is None:
                    return None
                prod *= int(v)
        total += prod
    return total


def _load_arch(key: str, raw: dict, path, table) -> Architecture:
    tensors, templated, fused = [], [], []
    names = set()
    for t in raw["tensors"]:
        missing = {"name", "shape", "required", "why"} - set(t)
        if missing:
            raise MappingFileError(f"{path}: {key} tensor {t.get('name')!r} lacks {sorted(missing)}")
        if t["name"] in names:
            raise MappingFileError(f"{path}: {key} lists {t['name']} twice")
        names.add(t["name"])
        for d in t["shape"]:
            eval_dim(d, {})  # syntax check
        unknown = set(t) - {"name", "shape", "required", "why", "when", "required_if", "slots", "any_view"}
        if unknown:
            raise MappingFileError(f"{path}: {key} tensor {t['name']!r} has unknown fields {sorted(unknown)}")
        _check_when(path, key, t["name"], t.get("when"), table)
        ct = CanonicalTensor(t["name"], tuple(t["shape"]), bool(t["required"]), t["why"], t.get("when"),
                             t.get("required_if"), bool(t.get("any_view", False)))
        (templated if "{slot}" in ct.name or "{layer}" in ct.name else tensors).append(ct)
    for f in raw.get("fused", []):
        if len(f["into"]) != len(f["rows"]) or not set(f["into"]) <= names:
            raise MappingFileError(f"{path}: fused {f['name']} must split into listed canonical tensors")
        fused.append(Fused(f["name"], tuple(f["into"]), tuple(f["rows"]), f["why"]))
    defaults = []
    for d in raw.get("config_defaults", []):
        if (not isinstance(d, dict) or set(d) != {"field", "assumed", "level", "why", "source"}
                or not all(isinstance(d[k], str) and d[k] for k in ("field", "level", "why", "source"))
                or not (d["assumed"] is None or isinstance(d["assumed"], str))
                or d["level"] not in ("warning", "notice")):
            raise MappingFileError(f"{path}: {key} config_defaults entries need field, assumed (text or null), "
                                   "level (warning or notice), why and source")
        defaults.append(ConfigDefault(d["field"], d["assumed"], d["level"], d["why"], d["source"]))
    variants = []
    for v in raw.get("variant_architectures", []):
        if not isinstance(v, dict) or set(v) != {"when", "architecture", "why"}:
            raise MappingFileError(f"{path}: {key} variant_architectures entries need when, architecture and why")
        if v["when"] not in {s.name for s in table}:
            raise MappingFileError(f"{path}: {key} variant_architectures 'when' {v['when']!r} is not a switch of "
                                   "mappings/variants.json")
        variants.append((v["when"], v["architecture"]))
    return Architecture(key, raw["architecture"], tuple(tensors), tuple(fused), tuple(templated), tuple(defaults),
                        tuple(variants))


def _check_when(path, key: str, name: str, when: str | None, table) -> None:
    """A row's ``when`` names a shape symbol (SYMBOLS) or a switch of mappings/variants.json that lists the
    row among the tensors it gates."""
    if when is None or when.lstrip("!") in SYMBOLS:
        return
    sw = {s.name: s for s in table}.get(when)
    if sw is None or name not in sw.tensors:
        raise MappingFileError(f"{path}: {key} tensor {name!r}: 'when' {when!r} must be a shape symbol or a switch of "
                               "mappings/variants.json whose 'tensors' list this tensor")


def _check_gated(path, archs: dict[str, Architecture], table) -> None:
    """Every tensor a switch of mappings/variants.json gates is a row of canonical.json gated on it."""
    rows = {(t.name, t.when) for a in archs.values() for t in a.tensors + a.templated}
    for s in table:
        missing = [t for t in s.tensors if (t, s.name) not in rows]
        if missing:
            raise MappingFileError(f"{path}: mappings/variants.json's switch {s.name!r} gates {missing}, which no row "
                                   f"of canonical.json gates on {s.name!r}")


@lru_cache(maxsize=1)
def load_canonical() -> dict[str, Architecture]:
    """The shipped table (mappings/canonical.json, checked against mappings/variants.json)."""
    return load_canonical_file(data_path("canonical.json"))


def load_canonical_file(path, table=None) -> dict[str, Architecture]:
    """Load and validate a canonical table against a variant table (``table``: the shipped one by
    default): a ``when`` names a shape symbol or a switch, and the switches' tensors are its rows.
    Raises :class:`MappingFileError`."""
    table = switches() if table is None else table
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise MappingFileError(f"{path}: unreadable: {e}") from e
    if raw.get("schema") != 1:
        raise MappingFileError(f"{path}: schema must be 1")
    _check_named(raw["architectures"], path)  # first: a renamed row fails as the rename it is
    archs = {k: _load_arch(k, v, path, table) for k, v in raw["architectures"].items()}
    _check_gated(path, archs, table)
    return archs


def _check_named(architectures: dict, path) -> None:
    """Every name the code spells (:data:`NAMED`) is a row of the architectures that must hold it."""
    for name, keys in NAMED.items():
        for key in keys:
            raw = architectures.get(key)
            rows = [t.get("name") for t in raw.get("tensors", []) if isinstance(t, dict)] if isinstance(raw, dict) else []
            rows = [r for r in rows if isinstance(r, str)]
            if not any(r == name or (name.endswith(".") and r.startswith(name)) for r in rows):
                raise MappingFileError(
                    f"{path}: the {key} architecture has no row {'starting with ' if name.endswith('.') else ''}"
                    f"{name!r}, a name eagle3conv's code spells (eagle3conv/spec/canonical.py NAMED); "
                    "rename it in both places")


def architecture_for(config: dict | None, keys) -> Architecture:
    """The table of a drafter's architecture (:func:`eagle3conv.spec.drafter.architecture_key`)."""
    return load_canonical()[architecture_key(config, keys)]


def symbols_from_config(config: dict, arch: Architecture) -> dict:
    """Shape symbols from a drafter config (:meth:`DrafterSpec.symbols`). Missing values stay None."""
    return DrafterSpec.from_config(config, validate=False, architecture=arch.key).symbols()


@dataclass(frozen=True)
class ExpectedTensor:
    """One tensor a drafter spec implies: its shape (None where a symbol is unknown), whether the
    strict loader requires it, and the canonical.json row it comes from."""

    shape: tuple[int | None, ...]
    required: bool
    row: CanonicalTensor


def expected(spec: DrafterSpec, symbols: dict | None = None) -> dict[str, ExpectedTensor]:
    """Every tensor a drafter with this spec may hold, canonical name -> :class:`ExpectedTensor`.

    Slots expanded, `when` applied, shapes from the spec's symbols (``symbols`` overrides them:
    fix-keys fills in what the weights reveal). ``required``: the row's, or its ``required_if``
    condition holds. Nothing else belongs: this is the strict loaders' contract and fix-keys'."""
    arch = load_canonical()[spec.architecture]
    sym = symbols if symbols is not None else spec.symbols()
    values = {**sym, **spec.flags()}
    out = {}
    for name, row in arch.expand(sym, spec.flags()).items():
        required = row.required or (row.required_if is not None and holds(row.required_if, values))
        out[name] = ExpectedTensor(tuple(eval_dim(d, sym) for d in row.shape), required, row)
    return out


def in_canonical_names(config: dict | None, tensor_names) -> bool:
    """Whether a checkpoint is already spelled in the names SGLang loads: every tensor is a canonical
    name of its architecture (mappings/canonical.json), ``fc`` among them. The one test of "already in
    SGLang's names" (``config`` edits only such checkpoints, ``verify`` runs only them); a required
    tensor missing is the plan's error to name, and whether fix-keys would change anything else
    (dtypes, shards, config) the plan's own question (:meth:`eagle3conv.checkpoint.plan.Plan.is_identity`)."""
    from eagle3conv.spec.quant import is_companion, split_name

    # a quantized drafter's scales (and a packed weight standing for X.weight) belong to their module
    names = {n if not is_companion(n) else split_name(n)[0] + ".weight" for n in tensor_names}
    arch = architecture_for(config or {}, names)
    spec = DrafterSpec.from_config(config or {}, validate=False, architecture=arch.key)
    # layers past the deepest one named add only names that are not there: the answer is the same with
    # the count clamped to the names' (a config's 2^31-1 layers are never expanded)
    deepest = max((i for n in names if (i := layer_of(n)) is not None), default=0)
    if isinstance(spec.L, int) and spec.L > deepest + 1:
        spec = spec.with_(L=deepest + 1)
    return FC in names and names <= set(expected(spec))


def drafter_uses_own_embedding(hidden_size: int | None, target_hidden_size: int | None) -> bool:
    """Which embedding table SGLang embeds the drafter's tokens with: the target's (False) or the
    drafter's own ``embed_tokens`` (True). SGLang shares the target's table with the drafter
    unless ``target_hidden_size`` differs from the drafter's ``hidden_size``: a table of the
    target's width cannot feed the drafter's layer. fix-keys, verify and push's gate all ask here."""
    return target_hidden_size is not None and hidden_size is not None and target_hidden_size != hidden_size


def embedding_source(config: dict) -> str:
    """``"drafter"`` or ``"target"``: :func:`drafter_uses_own_embedding` for a config."""
    h = config.get("hidden_size")
    t = config.get("target_hidden_size") or h
    return "drafter" if drafter_uses_own_embedding(h, t) else "target"
