"""Quantized drafters: mappings/quantization.json and each engine release's ``quantization`` rules,
read into frozen types, and the questions fix-keys, verify and the card ask of them (no torch).

* :func:`read_quant_config`: which producer, method and scheme a drafter's config (or its
  ``hf_quant_config.json``) names (an unknown method is an error, nothing is guessed);
* :func:`split_name`: ``midlayer.mlp.up_proj.weight_scale`` -> (``midlayer.mlp.up_proj``, ``weight_scale``);
* :func:`check_module`: one module's tensors against its scheme (which must be there, dtypes, shapes, packed
  shapes, ``weight_shape``);
* :func:`engine_quant`: what a release does with each quantized module (quantized, read as raw codes,
  skipped, never), the runtime names it builds, the draft quantization option it must be told;
* :func:`exclusions`: the exclusion list normalised to the drafter's module names, and the list rewritten
  in every engine's runtime names.

docs/facts.md §14 states every fact used here with its source.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache

from eagle3conv.errors import InvalidCheckpointError, MappingFileError
from eagle3conv.io.data import data_path

QUANT_FILE = "quantization.json"


@dataclass(frozen=True)
class Companion:
    """A tensor a quantized module carries beside its weight (``weight_scale``, ``input_scale`` ...)."""

    name: str
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[str, ...], ...]  # any one of these
    required: bool
    role: str  # scale | global_multiplier | global_divisor | input_scale | zero_point | shape | g_idx


@dataclass(frozen=True)
class Scheme:
    name: str
    title: str
    weight_name: str  # weight | weight_packed
    weight_dtypes: tuple[str, ...]
    weight_shape: tuple[str, ...]
    packed: str | None  # fp4x2 | int32 | None
    companions: tuple[Companion, ...]
    dequant: str  # scaled | fp4 | int_packed
    activation: str  # fp8_static_if_input_scale | not_emulated | none
    why: str

    def companion(self, name: str) -> Companion | None:
        return next((c for c in self.companions if c.name == name), None)

    def names(self) -> tuple[str, ...]:
        return (self.weight_name, *(c.name for c in self.companions))


@dataclass(frozen=True)
class QuantConfig:
    """What a drafter's quantization config says, interpreted."""

    method: str  # modelopt | compressed-tensors | quark
    algo: str  # the producer's own name: FP8, NVFP4, float-quantized ...
    scheme: Scheme
    symbols: dict = field(hash=False, compare=False)  # G (group size), BO/BI (block), B (bits)
    exclude: tuple[str, ...] = ()
    exclude_field: str | None = None  # the config field the list was read from
    where: str = "config.json quantization_config"
    form: str = "flat"  # flat | nested | compressed-tensors | quark
    static_input: bool = False  # the config asks for static activation scales
    targets: tuple[str, ...] = ("Linear",)  # compressed-tensors config_groups targets: which modules it quantizes

    def targets_module(self, module: str) -> bool:
        """Whether the config's targets name this module (``Linear``: every linear one; ``re:`` patterns
        matched against its name with and without the engines' ``model.`` prefix)."""
        if "Linear" in self.targets:
            return True
        for t in self.targets:
            if t.startswith("re:"):
                if any(re.match(t[3:], n) for n in (module, "model." + module)):
                    return True
            elif module == t or module.endswith("." + t):
                return True
        return False

    @property
    def label(self) -> str:
        return f"{self.method} {self.algo} ({self.scheme.title})"


@dataclass(frozen=True)
class QuantData:
    companions: frozenset[str]
    methods: dict = field(hash=False, compare=False)
    schemes: tuple[Scheme, ...] = ()
    selects: tuple[tuple[dict, str], ...] = ()  # (select entry, scheme name), in file order
    roles: tuple[tuple[re.Pattern, str], ...] = ()
    fused: dict = field(default_factory=dict, hash=False, compare=False)
    prefixes: tuple[str, ...] = ()
    hf_quant_file: str = "hf_quant_config.json"
    unschemed: frozenset[str] = frozenset()  # companions no scheme carries (KV-cache scales): tolerated beside any

    def scheme(self, name: str) -> Scheme:
        return next(s for s in self.schemes if s.name == name)


def _fail(msg: str) -> MappingFileError:
    return MappingFileError(f"{data_path(QUANT_FILE)}: {msg}")


@lru_cache(maxsize=1)
def load_quant_data() -> QuantData:
    """mappings/quantization.json, validated (a malformed file is refused with its path)."""
    path = data_path(QUANT_FILE)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise _fail(f"unreadable: {e}") from e
    if raw.get("schema") != 1:
        raise _fail("schema must be 1")
    schemes, selects = [], []
    for s in raw["schemes"]:
        comps = []
        for c in s["tensors"]:
            for shape in c["shapes"]:
                for d in shape:
                    eval_shape(str(d), {"O": 1, "I": 1, "G": 1, "BO": 1, "BI": 1, "B": 1}, check=False)
            comps.append(Companion(c["name"], tuple(c["dtype"]), tuple(tuple(str(d) for d in x) for x in c["shapes"]),
                                   bool(c["required"]), c["role"]))
        w = s["weight"]
        scheme = Scheme(s["name"], s["title"], w["name"], tuple(w["dtype"]), tuple(w["shape"]), w.get("packed"),
                        tuple(comps), s["dequant"], s["activation"], s["why"])
        if scheme.dequant not in ("scaled", "fp4", "int_packed"):
            raise _fail(f"scheme {scheme.name}: unknown dequant {scheme.dequant!r}")
        unknown = set(scheme.names()) - set(raw["companions"]) - {"weight"}
        if unknown:
            raise _fail(f"scheme {scheme.name}: tensors {sorted(unknown)} are not in 'companions'")
        schemes.append(scheme)
        for sel in s["select"]:
            if sel.get("method") not in raw["methods"]:
                raise _fail(f"scheme {scheme.name}: select names unknown method {sel.get('method')!r}")
            selects.append((sel, scheme.name))
    roles = tuple((re.compile(r["pattern"]), r["role"]) for r in raw["module_roles"])
    hq = raw["hf_quant_config"]
    return QuantData(frozenset(raw["companions"]), raw["methods"], tuple(schemes), tuple(selects), roles,
                     raw["fused_aliases"], tuple(raw["exclusion_prefixes"]), hq["file"],
                     frozenset(raw["companions"]) - {n for s in schemes for n in s.names()})


# --------------------------------------------------------------------------- shapes

def eval_shape(expr: str, sym: dict, *, check: bool = True) -> int | None:
    """A dimension such as ``I/2``, ``ceil(O/BO)``, ``ceil(I*B/32)``, ``1``: '/' must divide exactly
    (None when it does not, or a symbol is unknown)."""
    tree = ast.parse(expr, mode="eval").body

    def ev(n):
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.Name):
            v = sym.get(n.id)
            if v is None and check:
                raise KeyError(n.id)
            return 1 if v is None else int(v)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "ceil" and len(n.args) == 1:
            a = n.args[0]
            if not (isinstance(a, ast.BinOp) and isinstance(a.op, ast.Div)):
                raise ValueError(expr)
            return math.ceil(ev(a.left) / ev(a.right))
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Mult, ast.Div, ast.Add)):
            a, b = ev(n.left), ev(n.right)
            if isinstance(n.op, ast.Mult):
                return a * b
            if isinstance(n.op, ast.Add):
                return a + b
            if b == 0 or a % b:
                raise ArithmeticError(expr)
            return a // b
        raise ValueError(expr)

    try:
        return ev(tree)
    except KeyError:
        return None
    except ArithmeticError:
        return None if check else 1
    except ValueError:
        raise _fail(f"bad shape expression {expr!r}") from None


def shape_text(shape: tuple[str, ...], sym: dict) -> str:
    return "[" + ", ".join(f"{d}={eval_shape(d, sym)}" if not d.isdigit() else d for d in shape) + "]"


# --------------------------------------------------------------------------- the config

def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def _bad(where: str, msg: str, hint: str | None = None) -> InvalidCheckpointError:
    return InvalidCheckpointError(f"{where}: {msg}; nothing was written", hint=hint)


def read_quant_config(config: dict | None, hf_quant: dict | None, *, root: str = "") -> QuantConfig | None:
    """The drafter's quantization: config.json ``quantization_config`` first (flat Model Optimizer,
    nested Model Optimizer, compressed-tensors, Quark), else ``hf_quant_config.json``. None when neither
    names a method (a method-less hf_quant_config.json is :func:`hf_quant_finding`'s to report).
    Raises :class:`InvalidCheckpointError` for a method or algorithm eagle3conv does not know."""
    data = load_quant_data()
    qc = (config or {}).get("quantization_config")
    where = f"{root}/config.json quantization_config" if root else "config.json quantization_config"
    if qc is None:
        if not hf_quant or not _get(hf_quant, "quantization.quant_algo"):
            return None
        qc, where = hf_quant, f"{root}/{data.hf_quant_file}" if root else data.hf_quant_file
    if not isinstance(qc, dict):
        raise _bad(where, "must be an object")
    method = qc.get("quant_method")
    if method is None and _get(qc, "producer.name") == "modelopt":
        method = "modelopt"
    known = {v: m for m, spec in data.methods.items() for v in spec["config_values"]}
    if method not in known:
        shown = "no quant_method" if method is None else f"quant_method {method!r}"
        raise _bad(where, f"{shown}: eagle3conv reads {', '.join(sorted(known))} (docs/facts.md §14)",
                   hint="a drafter quantized by another tool: convert it to one of these, or dequantize it to bf16 "
                        "with that tool first")
    method = known[method]
    if method == "modelopt":
        return _modelopt(qc, where, data)
    if method == "compressed-tensors":
        return _compressed_tensors(qc, where, data)
    return _quark(qc, where, data)


def _pick(data: QuantData, method: str, where: str, what: str, **keys) -> Scheme:
    for sel, name in data.selects:
        if sel["method"] != method:
            continue
        ok = True
        for k, v in keys.items():
            want = sel.get(k)
            if want is None:
                continue
            if isinstance(want, list) and k != "block":
                ok &= v in want
            else:
                ok &= want == v
        if ok:
            return data.scheme(name)
    raise _bad(where, f"{what}: not a scheme eagle3conv reads (it reads {', '.join(s.title for s in data.schemes)})",
               hint="see docs/facts.md §14 for the layouts read")


def _modelopt(qc: dict, where: str, data: QuantData) -> QuantConfig:
    nested = isinstance(qc.get("quantization"), dict)
    body = qc["quantization"] if nested else qc
    algo = body.get("quant_algo")
    if not isinstance(algo, str) or not algo:
        raise _bad(where, "Model Optimizer config without quant_algo (vLLM 0.33.0 raises 'Missing quant_algo')")
    algo = algo.upper()
    scheme = _pick(data, "modelopt", where, f"quant_algo {algo}", algo=algo)
    excl_field = next((f for f in ("ignore", "exclude_modules") if isinstance(body.get(f), list)), None)
    exclude = tuple(body.get(excl_field) or ()) if excl_field else ()
    if excl_field and not all(isinstance(x, str) for x in exclude):
        raise _bad(where, f"{excl_field} must be a list of module names")
    sym = {"G": int(body.get("group_size") or 16), "BO": 128, "BI": 128, "B": 4 if "FP4" in algo else 8}
    return QuantConfig("modelopt", algo, scheme, sym, exclude, ("quantization." if nested else "") + (excl_field or "ignore"),
                       where, "nested" if nested else "flat", static_input=algo in ("FP8", "NVFP4"))


def _compressed_tensors(qc: dict, where: str, data: QuantData) -> QuantConfig:
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise _bad(where, "compressed-tensors config without config_groups")
    schemes, targets = [], []
    for gname, g in groups.items():
        targets += [x for x in (g or {}).get("targets") or () if isinstance(x, str)]
        w = (g or {}).get("weights") or {}
        fmt = g.get("format") or qc.get("format")
        strategy = w.get("strategy")
        scheme = _pick(data, "compressed-tensors", where,
                       f"config_groups.{gname}: format {fmt}, {w.get('type')} {w.get('num_bits')}-bit {strategy}",
                       type=w.get("type"), num_bits=w.get("num_bits"), strategy=strategy, format=fmt)
        block = w.get("block_structure") or [128, 128]
        bits = int(w.get("num_bits") or 8)
        act = g.get("input_activations") or {}
        schemes.append((scheme, {"G": int(w.get("group_size") or (16 if bits == 4 else 1)), "BO": int(block[0]),
                                 "BI": int(block[1]), "B": bits}, bool(act) and act.get("dynamic") is False, fmt))
    if len({s[0].name for s in schemes}) > 1:
        raise _bad(where, f"config_groups mix schemes ({', '.join(s[0].title for s in schemes)}): eagle3conv reads one "
                          "scheme per drafter")
    scheme, sym, static, fmt = schemes[0]
    ignore = qc.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(x, str) for x in ignore):
        raise _bad(where, "ignore must be a list of module names")
    return QuantConfig("compressed-tensors", str(fmt), scheme, sym, tuple(ignore), "ignore", where, "compressed-tensors",
                       static_input=static, targets=tuple(targets) or ("Linear",))


def _quark(qc: dict, where: str, data: QuantData) -> QuantConfig:
    g = qc.get("global_quant_config") or {}
    w = g.get("weight") or {}
    if isinstance(w, list):
        w = w[0] if w else {}
    dtype, qscheme = w.get("dtype"), w.get("qscheme")
    scheme = _pick(data, "quark", where, f"global_quant_config.weight {dtype} {qscheme}", algo=dtype, qscheme=qscheme)
    act = g.get("input_tensors") or {}
    exclude = qc.get("exclude") or []
    if not isinstance(exclude, list) or not all(isinstance(x, str) for x in exclude):
        raise _bad(where, "exclude must be a list of module names")
    return QuantConfig("quark", f"{dtype} {qscheme}", scheme, {"G": 1, "BO": 128, "BI": 128, "B": 8}, tuple(exclude),
                       "exclude", where, "quark", static_input=bool(act) and not act.get("is_dynamic", False))


def hf_quant_method_missing(hf_quant: dict | None) -> bool:
    """An hf_quant_config.json that names no quantization algorithm (the bf16 drafter's trap)."""
    return isinstance(hf_quant, dict) and not _get(hf_quant, "quantization.quant_algo")


# --------------------------------------------------------------------------- tensors

def split_name(name: str) -> tuple[str, str]:
    """(module, last component): ``fc.weight_scale`` -> (``fc``, ``weight_scale``)."""
    module, _, leaf = name.rpartition(".")
    return module, leaf


def is_companion(name: str) -> bool:
    return split_name(name)[1] in load_quant_data().companions


def role_of(module: str) -> str | None:
    for pattern, role in load_quant_data().roles:
        if pattern.search(module):
            return role
    return None


@dataclass(frozen=True)
class TensorMeta:
    dtype: str
    shape: tuple[int, ...]


def check_module(module: str, scheme: Scheme, tensors: dict[str, TensorMeta], contract: tuple[int, int] | None,
                 sym: dict, weight_shape: tuple[int, ...] | None = None) -> list[str]:
    """What is wrong with one quantized module's tensors (``tensors``: leaf name -> dtype and shape)
    against its scheme and the contract's ``[O, I]`` (packed shapes included; ``weight_shape`` is the
    stored ``weight_shape`` tensor's value). Empty: it is right."""
    problems = []
    if contract is None:
        return [f"{module}: quantized, but the drafter's contract has no 2-D weight of that name"]
    o, i = contract
    s = {**sym, "O": o, "I": i}
    if weight_shape is not None and tuple(weight_shape) != (o, i):
        problems.append(f"{module}.weight_shape holds {list(weight_shape)} but the config implies [O={o}, I={i}]")
    w = tensors.get(scheme.weight_name)
    if w is None:
        problems.append(f"{module}.{scheme.weight_name}: missing ({scheme.title} stores the weight there)")
    else:
        want = tuple(eval_shape(d, s) for d in scheme.weight_shape)
        if w.dtype not in scheme.weight_dtypes:
            problems.append(f"{module}.{scheme.weight_name}: dtype {w.dtype}, {scheme.title} stores {'/'.join(scheme.weight_dtypes)}")
        if None in want or tuple(w.shape) != want:
            problems.append(f"{module}.{scheme.weight_name}: shape {list(w.shape)} but {scheme.title} of the "
                            f"contract's [O={o}, I={i}] is {shape_text(scheme.weight_shape, s)}")
    for c in scheme.companions:
        t = tensors.get(c.name)
        if t is None:
            if c.required:
                problems.append(f"{module}.{c.name}: missing; {scheme.title} needs it to dequantize {module}.weight")
            continue
        if t.dtype not in c.dtypes:
            problems.append(f"{module}.{c.name}: dtype {t.dtype}, expected {'/'.join(c.dtypes)}")
        shapes = [tuple(eval_shape(d, s) for d in x) for x in c.shapes]
        if tuple(t.shape) not in shapes:
            shown = " or ".join(shape_text(x, s) if x else "[] (one value)" for x in c.shapes)
            problems.append(f"{module}.{c.name}: shape {list(t.shape)}, expected {shown}")
    extra = set(tensors) - set(scheme.names()) - {"weight", "bias"}
    for leaf in sorted(extra):
        if leaf not in load_quant_data().unschemed:
            problems.append(f"{module}.{leaf}: not a tensor of {scheme.title}")
    if scheme.weight_name != "weight" and "weight" in tensors:
        problems.append(f"{module}: both weight and {scheme.weight_name}")
    return problems


# --------------------------------------------------------------------------- engines

@dataclass(frozen=True)
class EngineQuant:
    """One release's handling of quantized drafters of one architecture (None modules: not read)."""

    modules: dict | None = field(hash=False)
    runtime_names: dict = field(default_factory=dict, hash=False)
    layer_index: str = "none"  # none: every layer built under one prefix; start_layer_id: model.layers.{N+i}
    option: dict | None = field(default=None, hash=False)
    why: str = ""
    source: str = ""

    def handles(self, role: str | None) -> str | None:
        """quantized | raw_codes | never | bf16_only, or None (not read / not a role it names)."""
        if self.modules is None or role is None:
            return None
        return self.modules.get(role)

    def option_value(self, qc: QuantConfig | None) -> str | None:
        """The value to give the release's draft quantization option for this drafter."""
        if self.option is None:
            return None
        if qc is None:
            return self.option.get("bf16")
        by = self.option["by_method"].get(qc.method)
        if isinstance(by, dict):
            return by.get(qc.algo)
        return by


def engine_quant(engine_name: str, release_version, drafter: str) -> EngineQuant | None:
    """The release's ``quantization`` entry for a drafter architecture (None: the engine's file has
    none: how it loads quantized drafters was not read)."""
    from eagle3conv.spec.engine_rules import engines, parse_range

    for entry in engines()[engine_name].quantization:
        if drafter not in entry["drafters"]:
            continue
        rng = parse_range(entry["releases"])
        if release_version == () or release_version in rng:
            return EngineQuant(entry["modules"], entry.get("runtime_names", {}), entry.get("layer_index", "none"),
                               entry.get("option"), entry["why"], entry["source"])
    return None


# --------------------------------------------------------------------------- launch lines

@dataclass(frozen=True)
class LaunchQuant:
    """What a release's launch line must say for a drafter's quantization: the draft option's
    ``value`` (None: nothing to say), or why the release does not serve it as defined (``refused``)."""

    value: str | None
    refused: tuple[str, ...] = ()


def launch_quant(engine_name: str, release_version, drafter: str, config: dict | None,
                 hf_quant: dict | None = None, tensor_names=()) -> LaunchQuant:
    """The draft quantization a release's launch line carries, read from the drafter's own config
    (``quantization_config``, else ``hf_quant_config.json``): the release's option value for its method
    (docs/facts.md §14), and a refusal for a quantized module (one with a scale among ``tensor_names``)
    the release loads as raw codes or requires in bf16. A bf16 drafter: no value."""
    try:
        qc = read_quant_config(config, hf_quant)
    except InvalidCheckpointError as e:
        return LaunchQuant(None, (f"its quantization config cannot be read ({e})",))
    if qc is None:
        return LaunchQuant(None)
    eq = engine_quant(engine_name, release_version, drafter)
    if eq is None or eq.modules is None:
        return LaunchQuant(None)
    modules = sorted({split_name(n)[0] for n in tensor_names if is_companion(n)})
    refused = []
    for m in modules:
        how = eq.handles(role_of(m))
        if how == "raw_codes":
            refused.append(f"loads the quantized {m} as a plain bf16 Linear (its scales skipped; docs/facts.md §14): "
                           f"eagle3conv fix-keys DIR --dequantize {m} writes it in bf16")
        elif how == "bf16_only":
            refused.append(f"requires {m} in bf16 (docs/facts.md §14): eagle3conv fix-keys DIR --dequantize {m}")
    return LaunchQuant(eq.option_value(qc), tuple(refused))


# --------------------------------------------------------------------------- exclusions

def normalise_exclusion(pattern: str, rename) -> list[str]:
    """An exclusion as the drafter's module names (wildcards kept): the whole-model prefixes stripped,
    ``layers.0.`` read as ``midlayer.`` (``rename``: the format's rename of a ``.weight`` name), fused
    aliases expanded into their parts."""
    data = load_quant_data()
    p = pattern
    changed = True
    while changed:
        changed = False
        for pre in data.prefixes:
            if p.startswith(pre):
                p, changed = p[len(pre):], True
    p = rename(p)
    out = [p]
    for fused, parts in data.fused.items():
        if p.endswith(fused) or fused + "." in p:
            out = [p.replace(fused, part) for part in parts]
    return out


def matches(pattern: str, module: str) -> bool:
    return module == pattern or fnmatch.fnmatchcase(module, pattern) or fnmatch.fnmatchcase(module, pattern + ".*")


def runtime_name(eq: EngineQuant, module: str, start_layer: int | None) -> str | None:
    """The name a release builds a drafter module under (None when it names no such module)."""
    from eagle3conv.spec.canonical import layer_of

    name = eq.runtime_names.get(role_of(module) or "")
    if name is None:
        return None
    if "{layer}" in name:
        layer = layer_of(module + ".weight")
        index = "*" if start_layer is None else str(start_layer + (layer or 0))
        name = name.replace("{layer}", index)
    return name


__all__ = ["Companion", "EngineQuant", "LaunchQuant", "launch_quant", "QuantConfig", "QuantData", "Scheme", "TensorMeta", "check_module",
           "engine_quant", "eval_shape", "hf_quant_method_missing", "is_companion", "load_quant_data", "matches",
           "normalise_exclusion", "read_quant_config", "role_of", "runtime_name", "split_name"]
