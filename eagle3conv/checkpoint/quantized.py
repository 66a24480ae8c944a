"""The plan's quantization step: a quantized drafter's tensors carried with their weights, checked
against their scheme and the contract, its exclusion list against the modules each release builds,
what each release does with each quantized module, and ``--dequantize``'s bf16 outputs.

Called by :mod:`eagle3conv.checkpoint.plan` (one step of ``build_plan``); the facts are
mappings/quantization.json and each engine file's ``quantization`` entries (:mod:`eagle3conv.spec.quant`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eagle3conv.findings import (
    CONFIG,
    KEYS,
    QUANT_CONFIG,
    QUANT_DEQUANTIZED,
    QUANT_ENGINE,
    QUANT_EXCLUSION,
    QUANT_TENSOR,
    SHAPES,
    Finding,
)
from eagle3conv.errors import Eagle3ConvError
from eagle3conv.spec import quant as q
from eagle3conv.spec.canonical import eval_dim


@dataclass(frozen=True)
class Dequant:
    """How the writer computes one dequantized output: the scheme, the source key of each stored
    part (by leaf name), the contract's ``[O, I]`` and the scheme's symbols."""

    scheme: q.Scheme
    parts: tuple[tuple[str, str], ...]
    shape: tuple[int, int]
    symbols: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class ReleaseQuant:
    """What one engine release does with this drafter's quantization, and what it must be told."""

    release: str  # the --engine spelling, e.g. sglang==0.5.23
    label: str
    option: str | None  # the launch option (SGLang --speculative-draft-model-quantization, vLLM speculative_config.quantization)
    value: str | None  # its value for this drafter (None: leave it unset)
    modules: dict = field(default_factory=dict, hash=False)  # canonical module -> quantized | raw_codes | never | bf16_only | not_read
    serves_as_defined: bool = True


@dataclass(frozen=True)
class DraftQuantization:
    """The drafter's quantization as fix-keys wrote it (``Plan.quantization``; the launch-line builder
    and the card read it)."""

    method: str | None
    algo: str | None
    scheme: str | None
    title: str | None
    quantized: tuple[str, ...]  # canonical modules stored quantized
    dequantized: tuple[str, ...]  # modules --dequantize wrote in bf16
    static_input: tuple[str, ...]  # modules with a stored input_scale (static activations)
    releases: tuple[ReleaseQuant, ...] = ()
    exclude_written: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"method": self.method, "algo": self.algo, "scheme": self.scheme, "title": self.title,
                "quantized": list(self.quantized), "dequantized": list(self.dequantized),
                "static_input": list(self.static_input), "exclude_written": list(self.exclude_written),
                "releases": [{"release": r.release, "option": r.option, "value": r.value,
                              "serves_as_defined": r.serves_as_defined, "modules": dict(r.modules)}
                             for r in self.releases]}


def hf_quant_of(index) -> dict | None:
    """The drafter folder's hf_quant_config.json, read (None: there is none)."""
    from eagle3conv.io.jsonfile import read_json_file

    path = index.root / q.load_quant_data().hf_quant_file
    if not path.is_file():
        return None
    raw = read_json_file(path, q.load_quant_data().hf_quant_file, want_object=False)
    return raw if isinstance(raw, dict) else {}


def logical_columns(index, info, config: dict | None = None) -> int:
    """A 2-D weight's in-features: its columns, or twice them for a weight an FP4 scheme packs two per
    byte under its own name (Model Optimizer's NVFP4 X.weight)."""
    cols = int(info.shape[1])
    if info.dtype != "U8":
        return cols
    try:
        qc = q.read_quant_config(index.config if config is None else config, hf_quant_of(index))
    except Eagle3ConvError:  # the quantization step reports a bad config with its own error
        return cols
    return cols * 2 if qc is not None and qc.scheme.packed == "fp4x2" else cols


class QuantStep:
    """One plan's quantization step (``planner``: the plan's :class:`_Planner` after its outputs step)."""

    def __init__(self, planner, releases, dequantize: tuple[str, ...]) -> None:
        self.p = planner
        self.releases = releases
        self.dequantize = tuple(dequantize)
        self.carried: dict = {}  # canonical companion name -> Output
        self.result: DraftQuantization | None = None
        self.config_edit = None

    # ---------------------------------------------------------------- steps
    def run(self) -> None:
        p = self.p
        hf = hf_quant_of(p.index)
        # the drafter's config as the format reads it: a target's quantization_config that a trainer copied
        # (NeMo Automodel) is already dropped there
        qc = q.read_quant_config(p.config, hf, root=str(p.index.root))
        if q.hf_quant_method_missing(hf) and qc is None:
            p.notices.append(Finding(
                "warning", CONFIG, QUANT_CONFIG,
                f"{q.load_quant_data().hf_quant_file}: names no quantization algorithm, and the weights are not "
                "quantized: SGLang reads this file from the draft folder (an earlier release defaulted it to fp8)",
                fix=f"delete {p.index.root}/{q.load_quant_data().hf_quant_file} (fix-keys --out does not copy it), "
                    "or launch SGLang with --speculative-draft-model-quantization unquant", subject="hf_quant_config.json"))
        modules = self._modules()
        if qc is None and not modules:
            return
        if qc is None:
            names = ", ".join(sorted(modules)[:4])
            p.errors.append(Finding("error", CONFIG, QUANT_CONFIG,
                                    f"{names}: quantized tensors (scales), but config.json has no quantization_config "
                                    "and there is no hf_quant_config.json: no engine knows how to read them",
                                    subject="quantization_config"))
            return
        self.qc = qc
        quantized = self._check(modules)
        self._embedding(quantized)
        self._exclusions(quantized)
        served = self._engines(quantized)
        self._apply_dequantize(quantized)
        static = tuple(sorted(m for m in quantized if "input_scale" in modules.get(m, {})
                              and m not in self.dequantize))
        left = tuple(sorted(m for m in quantized if m not in self.dequantize))
        written = self._config(left)
        self.result = DraftQuantization(qc.method, qc.algo, qc.scheme.name, qc.scheme.title, left,
                                        tuple(sorted(self.dequantize)), static, served, written)

    def _modules(self) -> dict[str, dict]:
        """canonical module -> {leaf: source key} for every module holding a companion (renamed with its
        weight by the format's rules: the planner mapped ``M.weight`` and the companions follow)."""
        out: dict[str, dict] = {}
        for canon, src in self.p.quant_keys.items():
            module, leaf = q.split_name(canon)
            out.setdefault(module, {})[leaf] = src
        for module in out:
            w = self.p.mapped.get(module + ".weight")
            if w is not None:
                out[module]["weight"] = w
        return out

    def _contract(self, module: str) -> tuple[int, int] | None:
        row = self.p.canon.get(module + ".weight")
        if row is None or len(row.shape) != 2:
            return None
        o, i = (eval_dim(d, self.p.sym) for d in row.shape)
        return None if o is None or i is None else (o, i)

    def _check(self, modules: dict) -> list[str]:
        from eagle3conv.checkpoint.plan import Output

        p, qc = self.p, self.qc
        quantized = []
        for module, parts in sorted(modules.items()):
            metas = {leaf: q.TensorMeta(p.index.tensors[src].dtype, tuple(p.index.tensors[src].shape))
                     for leaf, src in parts.items()}
            shape_val = None
            if "weight_shape" in parts and metas["weight_shape"].dtype in ("I64", "I32") and \
                    metas["weight_shape"].shape == (2,):
                shape_val = tuple(int(x) for x in p.index.read_array(parts["weight_shape"]))
            problems = q.check_module(module, qc.scheme, metas, self._contract(module), qc.symbols, shape_val)
            for msg in problems:
                p.errors.append(Finding("error", SHAPES, QUANT_TENSOR, f"{msg} ({qc.label}, read from {qc.where})",
                                        subject=module))
            quantized.append(module)
            for leaf, src in parts.items():
                if leaf == "weight":
                    continue
                name = f"{module}.{leaf}"
                info = p.index.tensors[src]
                self.carried[name] = Output(name, info.dtype, tuple(info.shape), src, info.dtype)
            p.quantized_weights.add(module + ".weight")
        # a weight stored in the scheme's dtype with no companion at all: its scale is missing
        self.scaleless = set()
        for name, o in p.wanted.items():
            module = name.removesuffix(".weight")
            if name.endswith(".weight") and module not in modules and o.dtype in qc.scheme.weight_dtypes \
                    and o.dtype not in ("BF16", "F16", "F32"):
                p.errors.append(Finding("error", SHAPES, QUANT_TENSOR,
                                        f"{module}.weight: stored as {o.dtype} ({qc.scheme.title}) but "
                                        f"{module}.weight_scale is missing: the weight cannot be dequantized",
                                        subject=module))
                self.scaleless.add(module)
                p.quantized_weights.add(name)
        return quantized

    def _embedding(self, quantized: list[str]) -> None:
        if "embed_tokens" in quantized:
            self.p.errors.append(Finding(
                "error", KEYS, QUANT_ENGINE,
                "embed_tokens is quantized: no engine quantizes the drafter's embedding (vLLM 0.33.0 builds it "
                "without a quant config and fails with KeyError 'embed_tokens.weight_scale'); Model Optimizer's "
                "drafter PTQ always excludes it", fix="quantize the drafter again with embed_tokens excluded",
                subject="embed_tokens"))

    def _drafter_modules(self) -> set[str]:
        return {n.removesuffix(".weight") for n in self.p.canon if n.endswith(".weight")}

    def _exclusions(self, quantized: list[str]) -> None:
        """The exclusion list in the drafter's module names: a pattern naming nothing the drafter has is
        a warning, a quantized module it excludes (or a bf16 one it leaves quantizable) an error."""
        p, qc = self.p, self.qc
        mine = self._drafter_modules()
        linear = {m for m in mine if q.role_of(m) not in (None, "embed_tokens")}
        normal = {pat: q.normalise_exclusion(pat, self.p.rename_module) for pat in qc.exclude}
        self.excluded: set[str] = set()
        stray = []
        for pat, forms in normal.items():
            hit = {m for m in mine for f in forms if q.matches(f, m)}
            if not hit:
                stray.append(pat)
            self.excluded |= hit
        if stray:
            p.notices.append(Finding(
                "warning", CONFIG, QUANT_EXCLUSION,
                f"{qc.where} {qc.exclude_field}: {len(stray)} entr{'y names' if len(stray) == 1 else 'ies name'} "
                f"no module of the drafter ({', '.join(stray[:6])}{' ...' if len(stray) > 6 else ''}): "
                "Model Optimizer lists the whole base + drafter model; fix-keys writes the list in the names the "
                "engines build", subject="quantization_config"))
        for m in sorted(set(quantized) & self.excluded):
            if m not in self.dequantize:
                p.errors.append(Finding("error", CONFIG, QUANT_EXCLUSION,
                                        f"{m}: stored quantized but {qc.where} {qc.exclude_field} excludes it: the "
                                        "engines would build it in bf16 and load its codes unscaled", subject=m))
        self.bf16 = sorted(linear - set(quantized) - self.scaleless)
        for m in self.bf16:
            if m not in self.excluded and qc.targets_module(m):
                p.errors.append(Finding(
                    "error", CONFIG, QUANT_EXCLUSION,
                    f"{m}: held in bf16, but {qc.where} does not exclude it: vLLM 0.33.0 would build it "
                    f"quantized ({qc.scheme.title}) and find no scale", subject=m,
                    fix=f"add {m} to {qc.exclude_field}, or quantize it with the rest"))

    def _engines(self, quantized: list[str]) -> tuple[ReleaseQuant, ...]:
        p, qc = self.p, self.qc
        out = []
        for rel in self.releases:
            eq = q.engine_quant(rel.engine, rel.version, p.arch.key)
            if eq is None or eq.modules is None:
                p.notices.append(Finding("notice", CONFIG, QUANT_ENGINE,
                                         f"{rel}: how it loads a quantized drafter was not read; check its serving "
                                         "by hand", subject=rel.spec))
                out.append(ReleaseQuant(rel.spec, str(rel), None, None, {}, serves_as_defined=False))
                continue
            handled, ok = {}, True
            for m in quantized:
                how = eq.handles(q.role_of(m)) or "not_read"
                if m in self.dequantize:
                    how = "dequantized"
                handled[m] = how
                if how == "quantized" or how == "dequantized":
                    continue
                ok = False
                if how == "raw_codes":
                    raw = "its unscaled codes are loaded into a bf16 parameter" if qc.scheme.weight_name == "weight" \
                        else f"{m}.{qc.scheme.weight_name} is skipped and {m} keeps its random init"
                    p.errors.append(Finding(
                        "error", KEYS, QUANT_ENGINE,
                        f"{m}: {rel} builds it as a plain bf16 Linear, so {raw} and its scales are skipped silently "
                        "(docs/facts.md §14)", subject=m,
                        fix=f"eagle3conv fix-keys {p.index.root} --dequantize {m} --out DIR (writes {m} in bf16, "
                            "dequantized exactly), or serve with a release that quantizes it (--engine vllm==0.33.0)"))
                elif how == "bf16_only":
                    p.errors.append(Finding("error", KEYS, QUANT_ENGINE,
                                            f"{m}: {rel} requires it in bf16/fp16/fp32 and refuses to start otherwise",
                                            subject=m, fix=f"eagle3conv fix-keys {p.index.root} --dequantize {m} --out DIR"))
                elif how != "never":
                    p.notices.append(Finding("notice", KEYS, QUANT_ENGINE,
                                             f"{m}: how {rel} serves a quantized {m} was not read", subject=m))
            out.append(ReleaseQuant(rel.spec, str(rel), (eq.option or {}).get("flag"),
                                    eq.option_value(qc if [m for m in quantized if m not in self.dequantize] else None),
                                    handled, ok))
        return tuple(out)

    def _apply_dequantize(self, quantized: list[str]) -> None:
        p, qc = self.p, self.qc
        from eagle3conv.checkpoint.plan import Output

        for m in self.dequantize:
            if m not in quantized:
                p.errors.append(Finding("error", KEYS, QUANT_DEQUANTIZED,
                                        f"--dequantize {m}: not a quantized module of this drafter (quantized: "
                                        f"{', '.join(quantized) or 'none'})", subject=m))
                continue
            shape = self._contract(m)
            parts = tuple((n.rsplit(".", 1)[1], o.source) for n, o in self.carried.items() if n.startswith(m + ".")
                          and n.rsplit(".", 1)[0] == m)
            wsrc = p.mapped.get(m + ".weight")
            if wsrc is not None:
                parts = (("weight", wsrc), *parts)
            if shape is None or not any(leaf == qc.scheme.weight_name for leaf, _ in parts):
                continue  # the check step named what is missing
            for n in [n for n in self.carried if n.rsplit(".", 1)[0] == m]:
                del self.carried[n]
            sym = tuple(sorted(qc.symbols.items()))
            p.wanted[m + ".weight"] = Output(m + ".weight", "BF16", shape, dict(parts)[qc.scheme.weight_name], None,
                                             dequant=Dequant(qc.scheme, parts, shape, sym))
            p.quantized_weights.discard(m + ".weight")
            p.notices.append(Finding("notice", KEYS, QUANT_DEQUANTIZED,
                                     f"{m}.weight written in bf16, dequantized as {qc.scheme.title} defines it "
                                     f"(its scales are not written)", subject=m))

    def _config(self, left: tuple[str, ...]) -> tuple[str, ...]:
        """quantization_config rewritten: its exclusion list names the modules held in bf16 in every
        engine's runtime spelling (docs/facts.md §14); nothing left quantized: the config is dropped."""
        from eagle3conv.checkpoint.config import ConfigEdit

        cfg = self.p.config
        old = cfg.get("quantization_config")
        if not left:
            self.config_edit = ConfigEdit("quantization_config", old, None,
                                          "every quantized module was written in bf16 (--dequantize)")
            return ()
        if old is None:  # read from hf_quant_config.json: written into config.json, which vLLM reads
            old = {"quant_method": self._modelopt_method(), "quant_algo": self.qc.algo, "producer": {"name": "modelopt"}, "ignore": []}
        bf16 = sorted(set(self.bf16) | set(self.dequantize))
        names: list[str] = []
        for m in bf16:
            names.append(m)
            for rel in self.releases:
                eq = q.engine_quant(rel.engine, rel.version, self.p.arch.key)
                rn = q.runtime_name(eq, m, None) if eq is not None and eq.modules is not None else None
                if rn:
                    names.append(rn)
        names = list(dict.fromkeys(names))
        new = dict(old)
        if self.qc.form == "nested" and "quantization" in old:
            new["quantization"] = {**old["quantization"], "exclude_modules": names}
        elif self.qc.form == "quark":
            new["exclude"] = names
        elif self.qc.form == "compressed-tensors":
            new["ignore"] = names
        else:
            new["ignore"] = names
            if "exclude_modules" in new:
                new["exclude_modules"] = names
        why = ("its exclusion list names the modules held in bf16 as the drafter and each engine build them "
               "(prefixes stripped, layer names mapped)")
        if self.qc.method == "modelopt" and "quant_method" not in new:
            # Model Optimizer 0.47.0's export writes none; vLLM reads a config without it as unquantized
            new["quant_method"] = self._modelopt_method()
            why += f"; quant_method {new['quant_method']} added (vLLM reads a config without it as unquantized)"
        if new != old:
            self.config_edit = ConfigEdit("quantization_config", old, new, why)
        return tuple(names)

    def _modelopt_method(self) -> str:
        """The quant_method vLLM reads a Model Optimizer config by (modelopt_fp4 for an FP4 algorithm)."""
        return "modelopt_fp4" if "FP4" in self.qc.algo else "modelopt"


__all__ = ["Dequant", "DraftQuantization", "QuantStep", "ReleaseQuant", "hf_quant_of"]
