"""The one drafter contract: a drafter config parsed once into dimensions, architecture and aux ids.

:class:`DrafterSpec` is what every part of eagle3conv asks about a drafter config: fix-keys' plan
(shape symbols), the model's strict loaders (``Eagle3Drafter``, ``Eagle3MLADrafter``), verify and
push's gate. Which tensors a spec implies is decided by mappings/canonical.json through
:func:`eagle3conv.spec.canonical.expected`; this module only reads the config.

Parsing is lenient (a missing dimension is None: fix-keys infers some from the weights); the model
loaders then require what they need. Types and ranges are checked once, by
:func:`eagle3conv.spec.config_check.validate_drafter_config`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from eagle3conv.spec.variants import Switch, switch, switches

__all__ = ["AUX_KEY", "DIMENSIONAL_CONDITIONS", "LATER_LAYER_NORMS", "MLA_ARCHITECTURES", "NESTED_AUX_FIELD",
           "NORM_BEFORE_FC", "NORM_BEFORE_RESIDUAL", "PARALLEL_DRAFTING", "PEAGLE_ARCHITECTURES", "SWITCH_FIELDS", "AuxIds",
           "DrafterSpec", "architecture_key", "aux_ids", "flag", "read_field", "rope_settings", "switches_set_by",
           "with_field"]

#: the two norms a decoder layer after the first may normalise its input with: vLLM 0.33.0 reads
#: ``input_layernorm``, SGLang 0.5.12-0.5.23 ``hidden_norm`` (docs/facts.md §11)
LATER_LAYER_NORMS = ("input_layernorm", "hidden_norm")

# SGLang registers Eagle3DeepseekV2ForCausalLM (kimi_k25_eagle3.py); V3 is the same class under a later name
MLA_ARCHITECTURES = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")
AUX_KEY = "eagle_aux_hidden_state_layer_ids"
NESTED_AUX_FIELD = f"eagle_config.{AUX_KEY}"
# the switches fix-keys turns on when the weights reveal them -> the config field it writes
# (mappings/variants.json's fix_keys; a Qwen3 drafter's is its architecture name, not a field)
SWITCH_FIELDS = {s.name: s.fix_keys_field for s in switches() if s.fix_keys_field}
# the switches code outside spec/ and model/ asks about by name (the checks written for one of them)
PARALLEL_DRAFTING = switch("parallel_drafting")
NORM_BEFORE_RESIDUAL = switch("norm_before_residual")
NORM_BEFORE_FC = switch("norm_before_fc")
# P-EAGLE drafters: the architecture names vLLM 0.33.0 and the trainers give them (mappings/variants.json)
PEAGLE_ARCHITECTURES = PARALLEL_DRAFTING.on_when.architectures


@dataclass(frozen=True)
class AuxIds:
    """The aux-layer ids a config declares, in both places configs store them, as read.

    ``nested`` is ``eagle_config.eagle_aux_hidden_state_layer_ids`` (SGLang reads this one),
    ``top_level`` is ``eagle_aux_hidden_state_layer_ids`` (vLLM's and speculators'). None when absent.
    """

    nested: Any = None
    top_level: Any = None

    @property
    def ids(self) -> list[int] | None:
        """The ids the drafter runs with: SGLang's nested field first, else the top-level one."""
        ids = self.nested if self.nested is not None else self.top_level
        return None if ids is None else list(ids)

    def fields(self) -> dict[str, Any]:
        """Every place the config stores ids, by dotted field name (absent places left out)."""
        out: dict[str, Any] = {}
        if self.nested is not None:
            out[NESTED_AUX_FIELD] = self.nested
        if self.top_level is not None:
            out[AUX_KEY] = self.top_level
        return out


def aux_ids(config: Mapping[str, Any] | None) -> AuxIds:
    """The aux-layer ids of a drafter config (both places, as read; see :class:`AuxIds`): the one
    reader of the aux-id fields."""
    if not config:
        return AuxIds()
    return AuxIds(read_field(config, NESTED_AUX_FIELD)[1], read_field(config, AUX_KEY)[1])


def rope_settings(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The RoPE settings of a drafter config, read once for every path (the Llama and MLA forwards,
    the card), as transformers 5.24 reads them (``convert_rope_params_to_dict``): ``rope_scaling``
    wins over ``rope_parameters`` when both are set; ``rope_theta`` comes from that object, else the
    top-level field, else 10000 (docs/facts.md §3). Raises :class:`ValueError` when the object is not
    an object."""
    cfg = config or {}
    for key in ("rope_scaling", "rope_parameters"):
        value = cfg.get(key)
        if value is not None and not isinstance(value, Mapping):
            raise ValueError(f"{key} must be an object, got {value!r}")
    params = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
    if params.get("rope_theta") is None:
        params["rope_theta"] = cfg.get("rope_theta") or 10000.0
    return params


def read_field(config: Mapping[str, Any] | None, dotted: str) -> tuple[bool, Any]:
    """(found, value) of a config field given as a dotted path into nested objects
    (``eagle_config.eagle_aux_hidden_state_layer_ids``); a path through a non-object is absent."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def with_field(config: Mapping[str, Any] | None, dotted: str, value: Any) -> dict:
    """A copy of ``config`` with the dotted field set to ``value`` (objects on the way created or
    copied; a non-object on the way is replaced): the one writer of config fields the engine rules
    name (the aux ids, nested and top level)."""
    import copy

    out = copy.deepcopy(dict(config or {}))
    node = out
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        node[part] = dict(child) if isinstance(child, Mapping) else {}
        node = node[part]
    node[parts[-1]] = value
    return out


def flag(config: Mapping[str, Any], name: str) -> bool:
    """A boolean drafter option: top level first (vLLM, speculators), then ``eagle_config``."""
    if config.get(name) is not None:
        return bool(config[name])
    eagle = config.get("eagle_config")
    return bool(eagle.get(name, False)) if isinstance(eagle, Mapping) else False


def architecture_key(config: Mapping[str, Any] | None, keys: Iterable[str] = ()) -> str:
    """``"mla"`` for an MLA drafter (an Eagle3DeepseekV2/V3 architecture, or MLA tensor names),
    else ``"llama"``. The one definition; docs/facts.md §3 and §10."""
    archs = (config or {}).get("architectures") or []
    if isinstance(archs, list) and any(a in MLA_ARCHITECTURES for a in archs):
        return "mla"
    return "mla" if any("kv_a_proj_with_mqa" in k for k in keys) else "llama"


# the on_when.computed properties of the dimensions (spec.variants.COMPUTED less the config's sliding
# window, read once from the config): recomputed whenever a dimension changes
DIMENSIONAL_CONDITIONS = ("aux_states_as_wide_as_hidden", "more_than_one_layer")


def switches_set_by(config: Mapping[str, Any]) -> frozenset[Switch]:
    """The switches a drafter config sets itself (mappings/variants.json's ``on_when``: flags at the top
    level or in ``eagle_config``, top-level fields, architecture names, speculators_model_type); those
    other switches or the dimensions imply are :meth:`DrafterSpec.from_config`'s."""
    archs = config.get("architectures") if isinstance(config.get("architectures"), list) else []
    out = set()
    for s in switches():
        w = s.on_when
        if (any(flag(config, f) for f in w.flags) or any(bool(config.get(f, False)) for f in w.fields)
                or any(a in w.architectures for a in archs)
                or (w.speculators_model_type is not None
                    and config.get("speculators_model_type") == w.speculators_model_type)):
            out.add(s)
    return frozenset(out)


def _window(config: Mapping[str, Any]) -> frozenset[Switch]:
    """The switches whose ``on_when.computed`` is the config's sliding window (spec.engines.draft_window)."""
    from eagle3conv.spec.engines import draft_window

    if draft_window(config) is None:
        return frozenset()
    return frozenset(s for s in switches() if s.on_when.computed == "sliding_window")


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class DrafterSpec:
    """A drafter config's dimensions, architecture, aux ids and switches (docs/facts.md §1, §10).

    Symbols as in mappings/canonical.json: H, T, k, NH, NKV, HD, I, V, Vd; MLA: QL, KL, QN
    (qk_nope_head_dim), QR, VH. ``k`` is the number of declared aux ids (None when undeclared).
    """

    architecture: str  # "llama" | "mla"
    H: int | None
    T: int | None
    k: int | None
    NH: int | None
    NKV: int | None
    HD: int | None
    I: int | None  # noqa: E741
    V: int | None
    Vd: int | None
    QL: int | None = None
    KL: int | None = None
    QN: int | None = None
    QR: int | None = None
    VH: int | None = None
    aux: AuxIds = AuxIds()
    switches: frozenset[Switch] = frozenset()
    """The switches on (mappings/variants.json): set by the config, and those its dimensions imply."""
    rope_interleave: bool = True
    tie_word_embeddings: bool = False
    num_hidden_layers: Any = 1
    L: int = 1
    """Decoder layers (``num_hidden_layers``; layer 0 reads cat(embedding, state), later layers the state)."""
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    draft_vocab_declared: bool = False
    target_hidden_declared: bool = False

    @classmethod
    def from_config(cls, config: Mapping[str, Any], keys: Iterable[str] = (), *, validate: bool = True,
                    architecture: str | None = None) -> DrafterSpec:
        """Parse a drafter config (``keys``: tensor names, which can reveal an MLA drafter;
        ``architecture`` overrides :func:`architecture_key`).

        With ``validate`` the config's field types and ranges are checked first
        (:func:`~eagle3conv.spec.config_check.validate_drafter_config`, InvalidCheckpointError)."""
        if validate:
            from eagle3conv.spec.config_check import validate_drafter_config

            validate_drafter_config(dict(config))
        c = config
        arch = architecture or architecture_key(c, keys)
        h, nh = _int(c.get("hidden_size")), _int(c.get("num_attention_heads"))
        ids = aux_ids(c)
        declared = ids.ids
        mla = {}
        if arch == "mla":
            mla = dict(
                QL=_int(c.get("q_lora_rank")),
                KL=_int(c.get("kv_lora_rank")),
                QN=_int(c.get("qk_nope_head_dim")),
                QR=_int(c.get("qk_rope_head_dim")),
                VH=_int(c.get("v_head_dim")),
            )
        draft_vocab = c.get("draft_vocab_size")
        layers = c.get("num_hidden_layers", 1)
        num_aux = c.get("num_aux_hidden_states")
        return cls(
            architecture=arch,
            H=h,
            T=_int(c.get("target_hidden_size")) or h,
            k=(num_aux if isinstance(num_aux, int) and not isinstance(num_aux, bool) and num_aux > 0
               else len(declared) if declared else None),
            NH=nh,
            NKV=_int(c.get("num_key_value_heads")) or nh,
            HD=_int(c.get("head_dim")) or (h // nh if h and nh else None),
            I=_int(c.get("intermediate_size")),
            V=_int(c.get("vocab_size")),
            Vd=_int(draft_vocab) or _int(c.get("vocab_size")),
            aux=ids,
            switches=switches_set_by(c) | _window(c),
            rope_interleave=bool(c.get("rope_interleave", True)),
            tie_word_embeddings=bool(c.get("tie_word_embeddings")),
            num_hidden_layers=layers,
            L=layers if isinstance(layers, int) and not isinstance(layers, bool) and layers > 0 else 1,
            hidden_act=str(c.get("hidden_act") or "silu"),
            rms_norm_eps=float(c.get("rms_norm_eps") or 1e-6),
            draft_vocab_declared=draft_vocab is not None,
            target_hidden_declared=bool(c.get("target_hidden_size")),
            **mla,
        )._derived()

    @property
    def is_mla(self) -> bool:
        return self.architecture == "mla"

    def symbols(self) -> dict[str, int | None]:
        """The shape symbols of mappings/canonical.json (MLA's only for an MLA spec)."""
        sym: dict[str, int | None] = {
            "H": self.H, "T": self.T, "NH": self.NH, "NKV": self.NKV, "HD": self.HD,
            "I": self.I, "V": self.V, "Vd": self.Vd, "k": self.k, "L": self.L,
        }
        if self.is_mla:
            qn, qr, vh = self.QN, self.QR, self.VH
            sym.update(
                QL=self.QL, KL=self.KL, QR=qr, VH=vh,
                QK=(qn + qr) if qn is not None and qr is not None else None,
                NV=(qn + vh) if qn is not None and vh is not None else None,
            )
        return sym

    def on(self, name: str) -> bool:
        """Whether the switch of that name is on (a name the table lacks is a KeyError)."""
        return switch(name) in self.switches

    def flags(self) -> dict[str, bool]:
        """The switches canonical.json's ``when`` conditions may name (those that gate tensors), on or off."""
        return {s.name: s in self.switches for s in switches() if s.tensors}

    def with_(self, **changes: Any) -> DrafterSpec:
        """A copy with some fields replaced (fix-keys fills in what the weights reveal); the switches
        the dimensions or other switches imply follow."""
        return replace(self, **changes)._derived()

    def with_switches(self, names: Iterable[str]) -> DrafterSpec:
        """A copy with these switches turned on as well (fix-keys: the switches the weights reveal)."""
        return self.with_(switches=self.switches | {switch(n) for n in names})

    def _derived(self) -> DrafterSpec:
        """The switches on: the config's own, then those other switches or the dimensions imply."""
        on = {s for s in self.switches if not (s.on_when.any_of or s.on_when.computed in DIMENSIONAL_CONDITIONS)}
        computed = {"aux_states_as_wide_as_hidden": bool(self.H and self.T and (self.k or 3) * self.T == self.H),
                    "more_than_one_layer": self.L > 1}
        on |= {s for s in switches() if computed.get(s.on_when.computed)}
        names = {s.name for s in on}
        on |= {s for s in switches() if s.on_when.any_of and any(n in names for n in s.on_when.any_of)
               and s.on_when.unless not in names}
        return replace(self, switches=frozenset(on))

    def inferred_from_fc(self, fc_in: int) -> DrafterSpec:
        """k and T from fc's input width, where the config leaves them out.

        target_hidden_size declared: k = width / T; ids declared: T = width / k; else k = 3
        (EAGLE-3 reads three aux layers almost always; SGLang builds fc as 3*T), else T = H."""
        k, t = self.k, self.T
        if self.target_hidden_declared:
            if fc_in % t == 0:  # type: ignore[operator]
                k = k or fc_in // t  # type: ignore[operator]
        elif k:
            if fc_in % k == 0:
                t = fc_in // k
        elif fc_in % 3 == 0:
            k, t = 3, fc_in // 3
        elif self.H and fc_in % self.H == 0:
            k, t = fc_in // self.H, self.H
        return replace(self, k=k, T=t)
