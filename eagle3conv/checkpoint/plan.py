"""The plan: every source key's fate, the tensors to write, the config to write.

Built from a :class:`CheckpointIndex` and the mapping data. It reads no tensor
bytes except the small vocab maps (`d2t`, `t2d`). ``inspect`` and
``fix-keys --dry-run`` stop here; ``fix-keys`` hands the plan to the writer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Protocol

import numpy as np

from eagle3conv.io import dtypes
from eagle3conv.spec.config_check import layer_count_problem, validate_drafter_config
from eagle3conv.spec.canonical import (
    D2T,
    EMBED,
    FC,
    LM_HEAD,
    T2D,
    VOCAB_MAPS,
    Architecture,
    architecture_for,
    drafter_uses_own_embedding,
    eval_dim,
    expected,
    layer_of,
    shape_matches,
)
from eagle3conv.spec.drafter import LATER_LAYER_NORMS as LATER_NORMS
from eagle3conv.spec.drafter import PARALLEL_DRAFTING, SWITCH_FIELDS, DrafterSpec
from eagle3conv.spec.variants import Switch, switch, switches
from eagle3conv.spec.quant import is_companion
from eagle3conv.spec.formats import DetectContext, Format, FormatMatch, detect, get_format, load_formats
from eagle3conv.checkpoint.index import CheckpointIndex
from eagle3conv.checkpoint.vocab import check_vocab
from eagle3conv.errors import InvalidCheckpointError, UsageError
from eagle3conv.findings import (
    AUX_LAYERS,
    LAYER_COUNT,
    CONFIG,
    CONFIG_REPLACED,
    EMBED_DROPPED,
    EMBED_KEPT,
    MISSING_EMBEDDING,
    EXTRACTED,
    FUSED_AND_UNFUSED,
    KEY_COLLISION,
    KEYS,
    LATER_NORMS_DIFFER,
    LAYER_MISSING,
    O_BIAS_ZEROS,
    FULL_VOCAB_D2T,
    MISSING_KEY,
    MLA_NO_Q_LORA,
    NO_VOCAB_SIZE,
    REFUSED_KEY,
    SHAPE_MISMATCH,
    SHAPES,
    SPLIT_SHAPE,
    UNMAPPED_KEY,
    MOE_DRAFTER,
    VOCAB,
    VOCAB_MAP_DTYPE,
    WEIGHT_DTYPE,
    Finding,
)
from eagle3conv.checkpoint import config as cfgmod
from eagle3conv.findings import QUANT_ENGINE, QUANT_EXCLUSION, QUANT_DEQUANTIZED

QUANT_CODES = (QUANT_ENGINE, QUANT_EXCLUSION, QUANT_DEQUANTIZED)

# a mixture-of-experts MLP's tensors: a router (mlp.gate / mlp.router) and experts, one by one or stacked
_MOE_KEY = re.compile(r"\.(mlp|block_sparse_moe)\.(experts\.|shared_experts?\.|gate\.|router\.|"
                      r"(gate|up|down|gate_up)_(weight|proj)s?$|w[123]$)")


@dataclass(frozen=True)
class Decision:
    """What happens to one source key."""

    source: str
    action: str  # kept | renamed | split | dropped | unmapped | refused
    targets: tuple[str, ...]
    why: str

    def to_dict(self) -> dict:
        return {"source": self.source, "action": self.action, "targets": list(self.targets), "why": self.why}


@dataclass(frozen=True)
class Output:
    """One tensor of the output checkpoint and where its bytes come from."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    source: str | None  # source key; None for rebuilt tensors
    source_dtype: str | None = None
    row_start: int = 0  # for splits: rows [row_start, row_end) of the source
    row_end: int | None = None
    data: np.ndarray | None = None  # repaired or rebuilt tensors (d2t, t2d): the bytes to write
    dequant: object | None = None  # fix-keys --dequantize: how the writer computes it (checkpoint/quantized.Dequant)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * dtypes.itemsize(self.dtype)

    @property
    def cast_from(self) -> str | None:
        """The source's dtype when the tensor is written in another (None: written as stored)."""
        return self.source_dtype if self.source_dtype and self.source_dtype != self.dtype else None

    def to_dict(self) -> dict:
        d = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "source": self.source}
        if self.row_end is not None:
            d["rows"] = [self.row_start, self.row_end]
        if self.cast_from:
            d["cast_from"] = self.cast_from
        if self.data is not None:
            d["rewritten"] = True
        if self.dequant is not None:
            d["dequantized"] = self.dequant.scheme.name
        return d


class WiringReportLike(Protocol):
    """The wiring step's report as the plan holds it (a :class:`eagle3conv.wiring.apply.Wiring`, which this
    level does not import): its document for a drafter folder's launch lines."""

    def to_dict(self, drafter: str | None = None) -> dict: ...


@dataclass(frozen=True)
class WiringOutcome:
    """What the wiring step (:mod:`eagle3conv.wiring`) brings to a plan: the config with every engine's
    aux ids (None: unchanged) and the edits that made it, its findings, the hint for its errors, and
    its report (the typed ``Wiring``, which ``inspect``'s text renders; ``report.to_dict(served)`` is
    the plan document's ``wiring``, its launch lines naming the folder ``served``)."""

    config: dict | None
    config_edits: tuple
    findings: tuple[Finding, ...]
    hint: str | None
    report: WiringReportLike
    record_known: bool
    """Whether a training record named the layers (the check compared the config against it)."""
    served: str | None = None
    """The folder the report's launch lines name."""


class PlanOutcome(str, Enum):
    """What fix-keys does (or would do) to a checkpoint: :class:`PlanVerdict`'s code."""

    LAYER_COUNT = "layer-count"  # no engine serves it as it is; fix-keys' config edit repairs the layer count
    REFUSED = "refused"  # fix-keys would refuse it (``first_error``)
    READY = "ready"  # already SGLang-ready: fix-keys would change nothing
    REWRITE = "rewrite"  # keys renamed, split or dropped, config fields edited (or only the vocab maps)
    CANNOT_PLAN = "cannot-plan"  # inspect: no plan could be made (the result's ``plan_error`` says why)


KEY_ACTIONS = ("dropped", "renamed", "split")  # the key fates a verdict counts


@dataclass(frozen=True)
class PlanVerdict:
    """A plan's verdict in codes and values (``inspect``'s and ``fix-keys``' first line, ``--json``'s
    ``verdict``): ``keys``, per key fate of :data:`KEY_ACTIONS`, how many keys; ``first_error``,
    the finding that leads a refusal (or the layer count)."""

    outcome: PlanOutcome
    errors: int
    keys: tuple[tuple[str, int], ...] = ()
    config_edits: int = 0
    first_error: Finding | None = None

    def to_dict(self) -> dict:
        return {"outcome": self.outcome.value, "errors": self.errors, "keys": dict(self.keys),
                "config_edits": self.config_edits,
                "first_error": None if self.first_error is None else self.first_error.to_dict()}


@dataclass
class Plan:
    index: CheckpointIndex
    format: Format
    detection: FormatMatch
    """Why ``format`` was chosen (its reasons, or ``--from``)."""
    candidates: list[FormatMatch]
    architecture: Architecture
    decisions: list[Decision]
    outputs: list[Output]
    config_before: dict | None
    config: dict
    config_edits: list[cfgmod.ConfigEdit]
    symbols: dict
    findings: list[Finding] = field(default_factory=list)
    """Every problem (level ``error``) and notice (``warning``/``notice``) about keys, shapes,
    vocab maps, config and aux layers (the last added by :mod:`eagle3conv.api`)."""
    aux_ids: dict = field(default_factory=dict)
    out_dtype: str | None = None
    wiring: WiringOutcome | None = None
    """Set by :meth:`with_wiring` (``api.inspect`` / ``api.fix_keys``); None when not wired."""
    quantization: object | None = None
    """A quantized drafter's :class:`eagle3conv.checkpoint.quantized.DraftQuantization` (the scheme, the
    modules stored quantized, what each release must be told); None for a bf16 drafter."""
    layer_count: Finding | None = None
    """The source config's ``num_hidden_layers`` against the layers the weights hold
    (:func:`eagle3conv.spec.config_check.layer_count_problem`): fix-keys' edit rewrites it, so it is an
    error only of the folder as it stands (:meth:`judged`)."""

    def with_wiring(self, w: WiringOutcome) -> Plan:
        """This plan completed by the wiring step: the plan sets its own fields."""
        config = self.config if w.config is None else w.config
        return replace(self, config=config, config_edits=[*self.config_edits, *w.config_edits],
                       aux_ids=cfgmod.aux_ids_in(config), findings=[*self.findings, *w.findings],
                       wiring=w)

    def judged(self) -> Plan:
        """This plan as a judgement of the folder as it stands (``inspect``, ``config``, push's gate): what
        fix-keys would only rewrite but no engine serves as it is, ``layer_count``, is an error too."""
        return self if self.layer_count is None else replace(self, findings=[self.layer_count, *self.findings])

    @property
    def errors(self) -> list[str]:
        """The errors as printed (``details`` of the error raised, ``errors`` in ``--json``)."""
        return [line(f) for f in self.findings if f.level == "error"]

    @property
    def notices(self) -> list[str]:
        return [line(f) for f in self.findings if f.level in ("warning", "notice")]

    @property
    def ok(self) -> bool:
        return not any(f.level == "error" for f in self.findings)

    @property
    def output_bytes(self) -> int:
        return sum(o.nbytes for o in self.outputs)

    @property
    def written_architecture(self) -> str:
        """The architecture the written config names (its first ``architectures`` entry, else the layout's)."""
        return (self.config.get("architectures") or [self.architecture.architecture])[0]

    @property
    def other_formats(self) -> list[str]:
        """The other formats whose detection matched too (lower priority)."""
        return [m.format.name for m in self.candidates if m.format is not self.format]

    def raise_for_errors(self) -> None:
        if self.errors:
            raise InvalidCheckpointError(
                f"{self.index.root}: cannot produce a correct SGLang checkpoint ({len(self.errors)} problem"
                f"{'s' if len(self.errors) != 1 else ''}); nothing was written",
                details=self.errors,
                hint=_hint(self),
            )

    def is_identity(self) -> bool:
        """True when the source already is exactly what we would write."""
        if self.config_edits or self.index.layout not in ("safetensors", "safetensors-sharded"):
            return False
        if self.config_before is None or self.config_before != self.config:
            return False
        if any(m.get("format") != "pt" for m in self.index.source_metadata.values()):
            return False
        by_src = {o.source: o for o in self.outputs}
        if len(by_src) != len(self.outputs) or set(by_src) != set(self.index.tensors):
            return False
        return all(
            o.name == o.source and o.data is None and o.row_end is None and o.dtype == o.source_dtype
            for o in self.outputs
        )

    def verdict(self) -> PlanVerdict:
        """What fix-keys does (or would do) to this checkpoint."""
        errors = [f for f in self.findings if f.level == "error"]
        if len(errors) == 1 and errors[0].code == LAYER_COUNT:  # the one error, which fix-keys' config edit repairs
            return PlanVerdict(PlanOutcome.LAYER_COUNT, 1, first_error=errors[0])
        if errors:
            return PlanVerdict(PlanOutcome.REFUSED, len(errors), first_error=errors[0])
        if self.is_identity():
            return PlanVerdict(PlanOutcome.READY, 0)
        counts: dict[str, int] = {}
        for d in self.decisions:
            if d.action in KEY_ACTIONS:
                counts[d.action] = counts.get(d.action, 0) + 1
        return PlanVerdict(PlanOutcome.REWRITE, 0, tuple(sorted(counts.items())), len(self.config_edits))

    def to_dict(self) -> dict:
        """The plan for ``--json``: its findings once (each with its level, code, message and fix; the
        text's ``ERROR:``/``note:`` lines are :attr:`errors` and :attr:`notices` of them)."""
        return {
            "checkpoint": str(self.index.root),
            "layout": self.index.layout,
            "format": self.format.name,
            "format_title": self.format.title,
            "format_reasons": list(self.detection.reasons),
            "format_forced": self.detection.forced,
            "other_matching_formats": self.other_formats,
            "architecture": self.written_architecture,
            "ok": self.ok,
            "findings": [f.to_dict() for f in self.findings],
            "decisions": [d.to_dict() for d in self.decisions],
            "outputs": [o.to_dict() for o in self.outputs],
            "output_bytes": self.output_bytes,
            "config_edits": [e.to_dict() for e in self.config_edits],
            "aux_layer_ids": self.aux_ids,
            "wiring": None if self.wiring is None else self.wiring.report.to_dict(self.wiring.served),
            "symbols": self.symbols,
            "quantization": None if self.quantization is None else self.quantization.to_dict(),
            "identity": self.ok and self.is_identity(),
        }


def line(f: Finding) -> str:
    """A plan finding as one line of ``errors``/``notices`` (aux-layer ones are labelled,
    and a warning or notice carries its fix, as does the ``layer-count`` error)."""
    label = "aux layers: " if f.area == AUX_LAYERS else ""
    fixed = f.level != "error" or f.code == LAYER_COUNT  # an error fix-keys itself repairs names its fix
    return label + f.message + (f" (fix: {f.fix})" if f.fix and fixed else "")


def _hint(plan: Plan) -> str:
    # the wiring's fix (rewrite the ids) only when the ids are all that is wrong: it fixes no key or shape
    if plan.wiring and plan.wiring.hint and all(f.area == AUX_LAYERS for f in plan.findings if f.level == "error"):
        return plan.wiring.hint
    quant_fix = next((f.fix for f in plan.findings if f.level == "error" and f.fix and f.code in QUANT_CODES), None)
    if quant_fix:
        return quant_fix
    if any(d.action == "unmapped" for d in plan.decisions):
        return (
            "run `eagle3conv inspect` to see every key's fate; if the format was guessed wrong, "
            f"pass --from (one of: {', '.join(sorted(load_formats()[0]))})"
        )
    return "run `eagle3conv inspect` on the checkpoint for the full picture"


def choose_format(index: CheckpointIndex, forced: str | None) -> tuple[FormatMatch, list[FormatMatch]]:
    ctx = DetectContext(frozenset(index.tensors), index.config, index.layout, index.wrapper, index.root)
    found = detect(ctx)
    if forced:
        fmt = get_format(forced)
        return FormatMatch(fmt, ("chosen with --from",), forced=True), found
    if not found:
        sample = ", ".join(sorted(index.tensors)[:6])
        raise InvalidCheckpointError(
            f"{index.root}: cannot tell which trainer wrote this checkpoint (keys like {sample})",
            hint=f"pass --from with one of: {', '.join(sorted(load_formats()[0]))}",
        )
    return found[0], found


def _map_key(name: str, rules, common) -> tuple[str, str | None, str]:
    """(action, new name, why) for one source key.

    The first matching rule decides; a renamed key then meets the common drop
    and refuse rules once more (a rotary buffer under a renamed prefix is
    still a rotary buffer).
    """
    for rule in rules:
        m = rule.match(name)
        if m is None:
            continue
        kind, new = m
        if kind == "rename":
            for c in common:
                if c.kind in ("drop", "refuse") and c.match(new):
                    return ("dropped" if c.kind == "drop" else "refused"), None, c.why
            return ("renamed" if new != name else "kept"), new, rule.why
        if kind == "drop":
            return "dropped", None, rule.why
        return "refused", None, rule.why
    return "kept", name, "already SGLang's name"


def build_plan(
    index: CheckpointIndex,
    *,
    source_format: str | None = None,
    config_override: dict | None = None,
    keep_embed: bool = False,
    dtype: str | None = None,
    later_norm: str | None = None,
    releases=None,
    dequantize: tuple[str, ...] = (),
) -> Plan:
    """Every source key's fate, the tensors to write and the config to write, in named steps
    (:class:`_Planner`): the format and the drafter config, each key's fate, the contract the config
    and the weights imply, the outputs (splits expanded, the embedding kept or dropped), the later
    layers' input norms under both engines' names, their shapes, the vocab maps, the cast, the config
    edits. ``later_norm``: which norm a multi-layer drafter's later layers were trained with
    (``input_layernorm`` or ``hidden_norm``; default: the trainer format's, when it says)."""
    if later_norm is not None and later_norm not in LATER_NORMS:
        raise UsageError(f"--later-norm {later_norm}: expected one of {', '.join(LATER_NORMS)}")
    p = _Planner(index, source_format, config_override, keep_embed, dtype)
    p.key_fates()
    p.contract()
    p.classify()
    p.outputs()
    p.quantization(releases, dequantize)
    p.later_norms(later_norm)
    p.zero_biases()
    p.embedding()
    p.shapes()
    p.vocab_maps()
    p.moe()
    return p.plan()


class _Planner:
    """The state of one :func:`build_plan`, one method per step; findings accumulate in
    ``errors`` and ``notices``."""

    def __init__(self, index: CheckpointIndex, source_format, config_override, keep_embed: bool, dtype) -> None:
        for raw in (config_override, index.config):  # format detection reads these before the drafter config
            if raw is not None:
                validate_drafter_config(raw, only=("architectures",))
        self.index, self.keep_embed = index, keep_embed
        self.match, self.candidates = choose_format(index, source_format)
        self.fmt = self.match.format
        self.errors: list[Finding] = []
        self.notices: list[Finding] = []
        self.out_dtype = None
        if dtype:
            if dtype.lower() not in dtypes.USER_DTYPES:
                raise UsageError(f"--dtype {dtype}: expected one of {', '.join(sorted(dtypes.USER_DTYPES))}")
            self.out_dtype = dtypes.USER_DTYPES[dtype.lower()]
        src_config = config_override if config_override is not None else index.config
        if config_override is not None and index.config is not None:
            self.notices.append(Finding("notice", CONFIG, CONFIG_REPLACED,
                                        "config.json in the checkpoint replaced by --config"))
        self.config, cfg_found = cfgmod.source_drafter_config(
            self.fmt, src_config, from_override=config_override is not None, index=index)
        self.notices += cfg_found
        validate_drafter_config(self.config)

    def key_fates(self) -> None:
        """Step 1: each source key renamed, kept, dropped or refused by the format's rules."""
        _, common = load_formats()
        rules = self.fmt.rules + common.rules
        self.decisions: list[Decision] = []
        self.mapped: dict[str, str] = {}  # canonical-or-fused name -> source
        self.collisions: dict[str, list[str]] = {}
        self.quant_keys: dict[str, str] = {}  # a quantized module's scales etc., renamed with its weight
        self.quantized_weights: set[str] = set()
        for name in sorted(self.index.tensors):
            if is_companion(name):
                module, leaf = name.rsplit(".", 1)
                action, new, why = _map_key(module + ".weight", rules, common.rules)
                if action in ("kept", "renamed"):
                    new = new.removesuffix(".weight") + "." + leaf
                    why = f"carried with its weight ({why})"
                    self.quant_keys[new] = name
                    self.decisions.append(Decision(name, action, (new,), why))
                    continue
                self.decisions.append(Decision(name, action, (), why))
                continue
            action, new, why = _map_key(name, rules, common.rules)
            if action in ("dropped", "refused"):
                self.decisions.append(Decision(name, action, (), why))
                continue
            if new in self.mapped:
                self.collisions.setdefault(new, [self.mapped[new]]).append(name)
            self.mapped[new] = name
            self.decisions.append(Decision(name, action, (new,), why))

    def contract(self) -> None:
        """Step 2: the architecture and the tensors the config implies, with what the config leaves
        out inferred from the weights themselves (switches, k from fc, the draft vocab from lm_head)."""
        index, mapped = self.index, self.mapped
        self.arch = architecture_for(self.config, mapped)
        spec = DrafterSpec.from_config(self.config, mapped, validate=False, architecture=self.arch.key)
        self.layers = self._layer_count(spec)
        spec = spec.with_(L=self.layers)
        self.fused = {f.name: f for f in self.arch.fused_rows({"L": self.layers})}
        self.switched = _switches_from_weights(self.arch, spec, [n for n in mapped if n not in self.fused])
        spec = spec.with_switches(self.switched)
        self.parallel = PARALLEL_DRAFTING in spec.switches
        fc = index.tensors.get(mapped.get(FC, ""))
        if fc is not None and len(fc.shape) == 2:
            from eagle3conv.checkpoint.quantized import logical_columns

            spec = spec.inferred_from_fc(logical_columns(index, fc, self.config))
        self.sym = spec.symbols()
        head = index.tensors.get(mapped.get(LM_HEAD, ""))
        if head is not None and len(head.shape) == 2 and not self.config.get("draft_vocab_size"):
            self.sym["Vd"] = head.shape[0]
        if self.arch.key == "mla":
            _mla_q_lora_rank(self.sym, index, mapped, self.errors)
        self.canon = {name: e.row for name, e in expected(spec, self.sym).items()}

    def _layer_count(self, spec: DrafterSpec) -> int:
        """The decoder layers the weights hold (layer 0 = midlayer.*, then layers.1.* ...); a gap is
        an error. A config that says otherwise is fix-keys' edit (it writes the weights' count) and the
        error of every command that judges the folder as it stands (``layer_count``, :meth:`Plan.judged`)."""
        found = sorted({i for n in self.mapped if (i := layer_of(n)) is not None})
        self.missing_layers: list[int] = []
        self.layer_count: Finding | None = None
        if not found:
            return spec.L
        self._bound_layers(found[-1])
        self.layer_count = layer_count_problem(self.config, self.mapped, ckpt=str(self.index.root))
        missing = self.missing_layers = sorted(set(range(found[-1] + 1)) - set(found))
        if missing:
            shown = ", ".join(f"layers.{i}" if i else "layer 0 (midlayer.* / layers.0.*)" for i in missing)
            self.errors.append(Finding(
                "error", KEYS, LAYER_MISSING,
                f"decoder layers {', '.join(str(i) for i in found)} are present but {shown} is missing (all of its "
                "tensors): the engines run the layers in order and would serve the gap uninitialised", subject=shown))
        return found[-1] + 1

    def _bound_layers(self, deepest: int) -> None:
        """A layer index past the tensor count cannot be a complete drafter's (layers 0..i each hold a
        tensor): refused at once, exit 3, before any range is built from it."""
        count = len(self.index.tensors)
        if deepest < count:
            return
        source = next(self.mapped[n] for n in sorted(self.mapped) if layer_of(n) == deepest)
        m = re.search(r"layers\.([0-9]+)\.", source)
        shown = source if len(source) <= 80 else f"{source[:40]}…{source[-30:]} ({len(source)} characters)"
        index = m.group(1) if m and len(m.group(1)) <= 20 else f"of {len(m.group(1))} digits" if m else str(deepest)
        raise InvalidCheckpointError(
            f"{shown}: layer index {index}, but the checkpoint holds {count} tensors: a drafter's decoder "
            "layers are numbered 0, 1, 2, ... with tensors in each, so this layer cannot be one of them",
            hint="rename the tensor to its layer's index (or remove it); eagle3conv inspect lists every tensor")

    def classify(self) -> None:
        """Step 3: each mapped name is canonical, a fused tensor to split, or unmapped (an error)."""
        out: list[Decision] = []
        for d in self.decisions:
            if d.action in ("dropped", "refused"):
                out.append(d)
                if d.action == "refused":
                    self.errors.append(Finding("error", KEYS, REFUSED_KEY, f"{d.source}: {d.why}", subject=d.source))
                continue
            new = d.targets[0]
            if new in self.quant_keys:
                out.append(d)  # checked by the quantization step against its scheme
            elif new in self.fused:
                out.append(Decision(d.source, "split", self.fused[new].into, self.fused[new].why))
            elif new in self.canon:
                out.append(d)
            else:
                shown = f" (maps to {new})" if new != d.source else ""
                out.append(Decision(d.source, "unmapped", (), f"no engine loads this name{shown}"))
                self.errors.append(Finding("error", KEYS, UNMAPPED_KEY,
                                           f"{d.source}: unmapped{shown}: SGLang would skip it silently",
                                           subject=d.source))
        for target, sources in sorted(self.collisions.items()):
            self.errors.append(Finding("error", KEYS, KEY_COLLISION,
                                       f"{target}: {len(sources)} source keys map to it: {', '.join(sources)}",
                                       subject=target))
        self.decisions = out

    def moe(self) -> None:
        """Last step: a drafter with a mixture-of-experts MLP (router and expert weights among its unmapped
        keys, e.g. SpecForge's Qwen3MoEForCausalLMEagle3) is one error, not one per expert key plus the
        dense MLP it lacks: no engine serves an MoE EAGLE-3 drafter (docs/facts.md §13)."""
        unmapped = {d.source for d in self.decisions if d.action == "unmapped"}
        moe = sorted(n for n in unmapped if _MOE_KEY.search(n))
        if len(moe) < 2:  # a router and its experts: one stray name is just unmapped
            return
        self.errors = [Finding(  # the other problems of a drafter no engine serves are moot
            "error", KEYS, MOE_DRAFTER,
            f"the drafter has a mixture-of-experts MLP ({len(moe)} router/expert tensors, e.g. {moe[0]}): MoE "
            "drafters are not supported -- SGLang's and vLLM's EAGLE-3 drafter classes build a dense SwiGLU MLP "
            "(gate_proj, up_proj, down_proj) and would skip these weights or refuse them",
            "serve it with the trainer's own engine plugin, or train a dense-MLP drafter", subject="mlp")]

    def outputs(self) -> None:
        """Step 4: the output tensors, fused ones split into their rows."""
        self.wanted: dict[str, Output] = {}
        for d in self.decisions:
            if d.action == "split":
                self._split(d)
            elif d.action in ("kept", "renamed") and d.targets[0] not in self.quant_keys:
                src = self.index.tensors[d.source]
                self._want(Output(d.targets[0], src.dtype, src.shape, d.source, src.dtype))

    def quantization(self, releases, dequantize) -> None:
        """Step 4a: a quantized drafter's scales carried with their weights and checked against the
        scheme, the exclusion list and each release's handling (checkpoint/quantized.py)."""
        from eagle3conv.checkpoint.quantized import QuantStep
        from eagle3conv.spec.engines import default_engines

        self.quant = QuantStep(self, tuple(releases) if releases else tuple(default_engines()), dequantize)
        self.quant.run()  # it marks the quantized weights (packed ones too) in quantized_weights

    def rename_module(self, module: str) -> str:
        """A module name as the format's rules rename its ``.weight`` (exclusion lists are spelled in the
        trainer's names)."""
        _, common = load_formats()
        action, new, _ = _map_key(module + ".weight", self.fmt.rules + common.rules, common.rules)
        return new.removesuffix(".weight") if new and action in ("kept", "renamed") else module

    def _want(self, o: Output) -> None:
        if o.name in self.wanted:
            self.errors.append(Finding("error", KEYS, FUSED_AND_UNFUSED,
                                       f"{o.name}: both a fused and an unfused source provide it", subject=o.name))
        self.wanted[o.name] = o

    def _split(self, d: Decision) -> None:
        src = self.index.tensors[d.source]
        f = self.fused[mapped_name(d, self.mapped)]
        rows = [eval_dim(r, self.sym) for r in f.rows]
        if any(r is None for r in rows) or len(src.shape) != 2 or sum(rows) != src.shape[0]:
            self.errors.append(Finding(
                "error", SHAPES, SPLIT_SHAPE,
                f"{d.source}: cannot split {list(src.shape)} into {', '.join(f.into)} "
                f"(rows {f.rows} = {rows} from the config)", subject=d.source))
            return
        start = 0
        for part, r in zip(f.into, rows):
            self._want(Output(part, src.dtype, (r, src.shape[1]), d.source, src.dtype, start, start + r))
            start += r

    def later_norms(self, asked: str | None) -> None:
        """Step 4b: each later decoder layer's input norm written under both names the engines read
        (docs/facts.md §11: vLLM input_layernorm, SGLang hidden_norm), with the trained weights."""
        from eagle3conv.spec.engines import later_norm_readers

        readers = later_norm_readers()
        trained = asked or self.fmt.later_layer_norm
        for i in range(1, self.layers):
            if i in self.missing_layers:
                continue  # the whole layer is missing: one error says so
            names = {n: f"layers.{i}.{n}.weight" for n in LATER_NORMS}
            have = [n for n in LATER_NORMS if names[n] in self.wanted]
            if not have:
                self.errors.append(Finding(
                    "error", KEYS, MISSING_KEY, f"layers.{i}: neither {names['input_layernorm']} nor "
                    f"{names['hidden_norm']}: the layer's input norm is missing ({readers_text(readers)})",
                    subject=f"layers.{i}"))
                continue
            if len(have) == 2:
                a, b = (self.wanted[names[n]] for n in LATER_NORMS)
                if self._same_bytes(a, b):
                    continue
                if trained is None:
                    self.notices.append(Finding(
                        "warning", KEYS, LATER_NORMS_DIFFER,
                        f"layers.{i}: input_layernorm and hidden_norm differ, and nothing says which one was trained: "
                        f"{readers_text(readers)}, so the engines serve this layer differently",
                        fix="run eagle3conv verify on captured states to see which serves better, then fix-keys "
                            "--later-norm input_layernorm|hidden_norm", subject=f"layers.{i}"))
                    continue
                source = trained
            else:
                source = have[0]
            other = next(n for n in LATER_NORMS if n != source)
            src = self.wanted[names[source]]
            self.wanted[names[other]] = replace(src, name=names[other])
            why = (f"a later layer's input norm ({source}, "
                   + ("as --later-norm says" if asked else f"as {self.fmt.name} trains" if len(have) == 2
                      and trained == self.fmt.later_layer_norm else "the one the checkpoint has")
                   + f") written under both names: {readers_text(readers)}")
            self.decisions = [Decision(d.source, "copied", (names[source], names[other]), why)
                              if d.source == src.source and names[source] in d.targets else
                              (Decision(d.source, "dropped", (), f"replaced by {names[source]} ({why})")
                               if len(have) == 2 and names[other] in d.targets else d)
                              for d in self.decisions]

    def zero_biases(self) -> None:
        """Step 4c: o_proj's bias, which both engines build when attention_bias or bias is set, written as
        zeros when the source has none (what the drafter was trained with; the engines would serve
        uninitialised memory, docs/facts.md §1)."""
        zeroed = {s.name: s for s in switches() if s.zeros_when_missing}
        for name, row in self.canon.items():
            if row.when not in zeroed or name in self.wanted:
                continue
            weight = self.wanted.get(name.replace(".bias", ".weight"))
            dtype = weight.dtype if weight is not None else "F32"
            h = eval_dim(row.shape[0], self.sym)
            if h is None:
                continue
            self.wanted[name] = Output(name, dtype, (h,), None, None,
                                       data=np.zeros(h * dtypes.itemsize(dtype), dtype=np.uint8)
                                       if dtypes.DTYPES[dtype][1] is None else np.zeros(h))
            self.notices.append(Finding(
                "notice", KEYS, O_BIAS_ZEROS,
                f"{name} written as zeros: config.json sets {_setting(zeroed[row.when], self.config)}, "
                "so SGLang and vLLM build o_proj with a bias, and the checkpoint has none (they would serve "
                "uninitialised memory)", subject=name))

    def _same_bytes(self, a: Output, b: Output) -> bool:
        return (a.source_dtype == b.source_dtype and a.shape == b.shape
                and self.index.read_bytes(a.source) == self.index.read_bytes(b.source))

    def embedding(self) -> None:
        """Step 5: the drafter's own embed_tokens, kept only where an engine embeds with it."""
        sym, wanted = self.sym, self.wanted
        own_embed = drafter_uses_own_embedding(sym["H"], sym["T"])
        if own_embed and EMBED not in wanted:
            self.errors.append(Finding(
                "error", KEYS, MISSING_EMBEDDING,
                f"{EMBED}: required but missing: target_hidden_size {sym['T']} differs from hidden_size {sym['H']}, "
                "so SGLang embeds tokens with the drafter's own embed_tokens instead of the target's, and this "
                "checkpoint has none", subject=EMBED))
        elif own_embed and not self.keep_embed:
            self.notices.append(Finding(
                "notice", KEYS, EMBED_KEPT,
                f"{EMBED} kept: target_hidden_size {sym['T']} differs from hidden_size {sym['H']}, so "
                "SGLang embeds tokens with the drafter's own table, not the target's", subject=EMBED))
        if EMBED in wanted and not self.keep_embed and not own_embed and self.parallel:
            self.notices.append(Finding(
                "notice", KEYS, EMBED_KEPT,
                f"{EMBED} kept: a P-EAGLE drafter trains its embedding (speculators, SpecForge and NeMo Automodel "
                "all do by default) and vLLM, the engine that serves P-EAGLE, embeds with the drafter's own copy "
                "(docs/facts.md §4, §6)", subject=EMBED))
        elif EMBED in wanted and not self.keep_embed and not own_embed:
            src = wanted.pop(EMBED).source
            self.decisions = [
                Decision(d.source, "dropped", (), "embed_tokens dropped: SGLang replaces it with the target's, and "
                         "vLLM would use a stale copy; --keep-embed keeps it")
                if d.source == src else d for d in self.decisions
            ]
            self.notices.append(Finding(
                "notice", KEYS, EMBED_DROPPED,
                f"{src} dropped: SGLang overwrites the drafter's embedding with the target's, vLLM would serve this "
                "copy if it differs from the target's; pass --keep-embed to keep it", subject=src))

    def shapes(self) -> None:
        """Step 6: every required tensor present, every shape the config's, every weight a float."""
        gone = set(self.missing_layers)
        for name, ct in self.canon.items():
            if ct.required and name not in self.wanted and layer_of(name) not in gone \
                    and name not in self.quantized_weights:
                self.errors.append(Finding("error", KEYS, MISSING_KEY, f"{name}: required but missing ({ct.why})",
                                           subject=name))
        for name, o in self.wanted.items():
            if name in self.quantized_weights:
                continue  # checked against its scheme (packed shapes, codes' dtype) by the quantization step
            ct = self.canon[name]
            if not shape_matches(ct, o.shape, self.sym):
                expect = [eval_dim(d, self.sym) for d in ct.shape]
                shown = "[" + ", ".join(f"{d}={e}" for d, e in zip(ct.shape, expect)) + "]"
                self.errors.append(Finding("error", SHAPES, SHAPE_MISMATCH,
                                           f"{name}: shape {list(o.shape)} but the config implies {shown}",
                                           subject=name))
            if name not in VOCAB_MAPS and o.dtype not in dtypes.FLOAT_DTYPES:
                self.errors.append(Finding("error", SHAPES, WEIGHT_DTYPE,
                                           f"{name}: dtype {o.dtype}, expected a floating-point weight", subject=name))

    def vocab_maps(self) -> None:
        """Step 7: d2t and t2d checked, repaired or rebuilt (the only tensor bytes a plan reads)."""
        wanted, index = self.wanted, self.index
        vocab = self.config.get("vocab_size")
        d2t = None
        if LM_HEAD in wanted:
            vd = wanted[LM_HEAD].shape[0]
            bad = [(n, wanted[n].dtype) for n in VOCAB_MAPS if n in wanted
                   and wanted[n].dtype not in dtypes.INT_DTYPES | ({"BOOL"} if n == T2D else set())]
            for n, dt in bad:
                self.errors.append(Finding("error", VOCAB, VOCAB_MAP_DTYPE,
                                           f"{n} has dtype {dt}; it must hold integer "
                                           f"{'offsets' if n == D2T else 'flags'}", subject=n))
                wanted.pop(n)
            d2t = index.read_array(wanted[D2T].source) if D2T in wanted else None
            t2d = index.read_array(wanted[T2D].source) if T2D in wanted else None
            vr = check_vocab(d2t, t2d, vocab, vd) if not bad else check_vocab(None, None, None, vd)
            self.errors += [f for f in vr.findings if f.level == "error"]
            self.notices += [f for f in vr.findings if f.level != "error"]
            if vr.d2t is not None and vr.d2t_changed:
                src = wanted[D2T].source
                wanted[D2T] = Output(D2T, "I64", vr.d2t.shape, src, wanted[D2T].source_dtype, data=vr.d2t)
            if vr.t2d is not None and (vr.t2d_changed or T2D not in wanted):
                src = wanted[T2D].source if T2D in wanted else None
                wanted[T2D] = Output(T2D, "BOOL", vr.t2d.shape, src, wanted[T2D].source_dtype if src else None,
                                       data=vr.t2d)
        if self.arch.key == "mla" and vocab is not None and LM_HEAD in wanted \
                and wanted[LM_HEAD].shape[0] == vocab:
            self.decisions = _mla_full_vocab_maps(wanted, self.decisions, d2t, self.errors, self.notices)
        if vocab is None:
            self.errors.append(Finding("error", CONFIG, NO_VOCAB_SIZE, "config.json has no vocab_size (the target's vocab)"))

    def _cast(self) -> list[Output]:
        """Step 8: floating-point outputs cast to --dtype (rewritten tensors keep their own)."""
        outputs = []
        for name in sorted(self.wanted):
            o = self.wanted[name]
            if self.out_dtype and o.dtype in dtypes.FLOAT_DTYPES and o.dtype != self.out_dtype and o.data is None \
                    and o.dequant is None and name not in self.quantized_weights:
                o = Output(o.name, self.out_dtype, o.shape, o.source, o.source_dtype, o.row_start, o.row_end)
            outputs.append(o)
        return outputs

    def _config_edits(self) -> tuple[list, dict]:
        """Step 9: the config edits that make every engine load the drafter, and the notes on switches."""
        cfg, sym, wanted = self.config, self.sym, self.wanted
        flags = {**DrafterSpec.from_config(cfg, self.mapped, validate=False, architecture=self.arch.key).flags(),
                  **self.switched}
        edits = cfgmod.loadable_edits(
            cfg,
            architecture=self.arch.name_for(flags),
            layers=self.layers,
            num_aux=sym.get("k"),
            draft_vocab=wanted[LM_HEAD].shape[0] if LM_HEAD in wanted else (sym["Vd"] or 0),
            vocab=cfg.get("vocab_size"),
            target_hidden=sym["T"] or sym["H"],
            has_lm_head=LM_HEAD in wanted,
            out_dtype=self.out_dtype,
        )
        for name, value in self.switched.items():
            if name in SWITCH_FIELDS:  # a Qwen3 drafter's is the architecture name, written above
                edits.append(cfgmod.ConfigEdit(SWITCH_FIELDS[name], cfg.get(SWITCH_FIELDS[name]), value,
                                               switch(name).fix_keys_why))
        if self.arch.key == "mla":
            edits += _mla_config_edits(cfg, sym, edits, wanted)
        new_config = cfgmod.apply_edits(cfg, edits)
        if self.fmt.extracts:
            dropped = sum(1 for d in self.decisions if d.action == "dropped")
            self.notices.append(Finding("notice", KEYS, EXTRACTED, f"drafter extracted from a whole-model checkpoint; "
                                                                   f"{dropped} tensors dropped unread"))
        return edits, new_config

    def plan(self) -> Plan:
        outputs = self._cast() + sorted(self.quant.carried.values(), key=lambda o: o.name)
        edits, new_config = self._config_edits()
        if self.quant.config_edit is not None:
            edits.append(self.quant.config_edit)
            new_config = cfgmod.apply_edits(new_config, [self.quant.config_edit])
            if new_config["quantization_config"] is None:
                new_config.pop("quantization_config")
        return Plan(
            index=self.index,
            format=self.match.format,
            detection=self.match,
            candidates=self.candidates,
            architecture=self.arch,
            decisions=self.decisions,
            outputs=outputs,
            config_before=self.index.config,
            config=new_config,
            config_edits=edits,
            symbols=self.sym,
            findings=self.errors + self.notices,
            aux_ids=cfgmod.aux_ids_in(new_config),
            out_dtype=self.out_dtype,
            quantization=self.quant.result,
            layer_count=self.layer_count,
        )


# the switches a tensor in the source turns on (fix-keys writes them; mappings/variants.json's fix_keys)
REVEALED = tuple(s.name for s in switches() if s.revealed_by_weights)


def _setting(sw: Switch, config: dict) -> str:
    """The config field that turns on a switch implied by others (o_proj's bias: attention_bias, else bias)."""
    fields = [f for n in sw.on_when.any_of for f in switch(n).on_when.config_fields]
    return next((f for f in fields if config.get(f)), fields[-1])


def readers_text(readers: dict[str, list[str]]) -> str:
    """'vllm 0.33.0 normalises a later layer's input with input_layernorm, sglang 0.5.12-0.5.23 with hidden_norm'."""
    parts = [f"{', '.join(who)} with {norm}" for norm, who in readers.items()]
    return "a later layer's input is normalised by " + "; ".join(parts)


def _switches_from_weights(arch: Architecture, spec: DrafterSpec, names) -> dict[str, bool]:
    """Config switches the weights reveal: a tensor gated on a switch the config leaves off turns
    it on (fix-keys then writes the switch into config.json, so every engine loads the tensor)."""
    flags = spec.flags()
    out: dict[str, bool] = {}
    for name in names:
        row = arch.gated(name)
        if row is not None and row.when in REVEALED and not flags[row.when]:
            out[row.when] = True
    return out


def mapped_name(d: Decision, mapped: dict[str, str]) -> str:
    for k, v in mapped.items():
        if v == d.source:
            return k
    raise AssertionError(d.source)


def load_config_file(path: str | Path) -> dict:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    from eagle3conv.io.jsonfile import read_json_file

    return read_json_file(p, "config.json", allow_nonfinite=True)  # NaN: named by the config validator


# --------------------------------------------------------------------------- MLA (docs/facts.md §10)

_Q_A = "midlayer.self_attn.q_a_proj.weight"
_FUSED_QKV_A = "midlayer.self_attn.fused_qkv_a_proj_with_mqa.weight"


def _mla_q_lora_rank(sym: dict, index: CheckpointIndex, mapped: dict, errors: list) -> None:
    """SGLang's Eagle3 MLA layer requires q_lora_rank: read it off q_a_proj (or the fused
    q_a/kv_a rows) when the config leaves it out; refuse a direct q_proj (vLLM only)."""
    if sym.get("QL") is not None:
        return
    qa = index.tensors.get(mapped.get(_Q_A, ""))
    fused = index.tensors.get(mapped.get(_FUSED_QKV_A, ""))
    if qa is not None and len(qa.shape) == 2:
        sym["QL"] = qa.shape[0]
    elif fused is not None and len(fused.shape) == 2 and sym.get("KL") and sym.get("QR"):
        sym["QL"] = fused.shape[0] - sym["KL"] - sym["QR"]
    if sym.get("QL") is None or sym["QL"] <= 0:
        sym["QL"] = None
        errors.append(Finding(
            "error", CONFIG, MLA_NO_Q_LORA,
            "config.json: q_lora_rank is null and the drafter has no q_a_proj: SGLang's Eagle3 MLA layer "
            "refuses it ('requires q_lora_rank in the draft config'); only vLLM builds a direct q_proj",
            subject="q_lora_rank"))


def _mla_full_vocab_maps(wanted: dict, decisions: list, d2t, errors: list, notices: list) -> list:
    """An MLA drafter whose draft vocab is the full vocab carries no d2t/t2d: SGLang turns d2t into
    hot-token ids and vLLM (from its code) refuses an identity d2t at load. An identity d2t (all
    offsets 0) and any t2d are dropped; a d2t that permutes the vocab is an error."""
    if d2t is not None and np.any(np.asarray(d2t) != 0):
        errors.append(Finding(
            "error", VOCAB, FULL_VOCAB_D2T,
            "d2t: the draft vocab is the full vocab but d2t moves tokens (non-zero offsets): no engine serves "
            "an MLA drafter with a permuted full vocab", subject=D2T))
        return decisions
    dropped = {}
    for name in VOCAB_MAPS:
        o = wanted.pop(name, None)
        if o is not None and o.source is not None:
            dropped[o.source] = name
    if dropped:
        notices.append(Finding(
            "notice", VOCAB, FULL_VOCAB_D2T,
            f"{', '.join(sorted(dropped.values()))} dropped: the draft vocab is the full vocab (d2t is the identity); "
            "SGLang would read d2t as hot-token ids and vLLM refuses an identity d2t", subject=D2T))
    why = "the draft vocab is the full vocab: d2t/t2d are written only when the vocab is reduced"
    return [Decision(d.source, "dropped", (), why) if d.source in dropped else d for d in decisions]


def _mla_config_edits(config: dict, sym: dict, edits: list, wanted: dict) -> list:
    """q_lora_rank and draft_vocab_size written explicitly: SGLang refuses a null q_lora_rank and,
    without draft_vocab_size, serves the MLA drafter with the target's lm_head."""
    out = []
    done = {e.field for e in edits}
    if config.get("q_lora_rank") is None and sym.get("QL"):
        out.append(cfgmod.ConfigEdit("q_lora_rank", config.get("q_lora_rank"), sym["QL"],
                                     "the rows of q_a_proj; SGLang's Eagle3 MLA layer requires q_lora_rank"))
    head = wanted.get(LM_HEAD)
    if head is not None and "draft_vocab_size" not in done and config.get("draft_vocab_size") != head.shape[0]:
        out.append(cfgmod.ConfigEdit("draft_vocab_size", config.get("draft_vocab_size"), head.shape[0],
                                     "without draft_vocab_size SGLang serves the MLA drafter with the target's "
                                     "lm_head instead of its own"))
    return out
