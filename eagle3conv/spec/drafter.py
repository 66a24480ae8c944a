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

__all__ = ["AUX_KEY", "LATER_LAYER_NORMS", "NESTED_AUX_FIELD", "AuxIds", "DrafterSpec", "MLA_ARCHITECTURES", "PEAGLE_ARCHITECTURES",
           "QWEN3_ARCHITECTURES", "SWITCH_FIELDS", "architecture_key", "aux_ids", "flag",
           "read_field", "rope_settings", "with_field"]

#: the two norms a decoder layer after the first may normalise its input with: vLLM 0.33.0 reads
#: ``input_layernorm``, SGLang 0.5.12-0.5.23 ``hidden_norm`` (docs/facts.md §11)
LATER_LAYER_NORMS = ("input_layernorm", "hidden_norm")

# SGLang registers Eagle3DeepseekV2ForCausalLM (kimi_k25_eagle3.py); V3 is the same class under a later name
MLA_ARCHITECTURES = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")
AUX_KEY = "eagle_aux_hidden_state_layer_ids"
NESTED_AUX_FIELD = f"eagle_config.{AUX_KEY}"
# Qwen3-architecture drafters (per-head q/k norms): vLLM 0.33.0 registry.py; P-EAGLE drafters: the names
# vLLM 0.33.0 and the trainers (speculators 0.9.0, SpecForge 0.2.0) give them (docs/facts.md §11)
QWEN3_ARCHITECTURES = ("Eagle3Qwen3ForCausalLM", "PeagleQwen3ForCausalLM")
PEAGLE_ARCHITECTURES = ("PEagleDraftModel", "PeagleLlamaForCausalLM", "PeagleQwen3ForCausalLM")
# the switches canonical.json's "when" may name (DrafterSpec.flags) -> the config field that sets each
SWITCH_FIELDS = {"fc_bias": "bias", "fc_norm": "fc_norm", "attention_bias": "attention_bias",
                 "norm_before_fc": "norm_before_fc", "parallel_drafting": "parallel_drafting"}


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
    fc_bias: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    attention_bias: bool = False
    rope_interleave: bool = True
    tie_word_embeddings: bool = False
    num_hidden_layers: Any = 1
    L: int = 1
    """Decoder layers (``num_hidden_layers``; layer 0 reads cat(embedding, state), later layers the state)."""
    qk_norm: bool = False
    """A Qwen3-architecture drafter: per-head RMSNorm on queries and keys before RoPE."""
    parallel_drafting: bool = False
    """A P-EAGLE drafter (vLLM's parallel drafting): carries ``mask_hidden``."""
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
        archs = c.get("architectures") if isinstance(c.get("architectures"), list) else []
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
            fc_bias=bool(c.get("bias", False)),
            fc_norm=flag(c, "fc_norm") or flag(c, "use_aux_norm"),
            norm_output=flag(c, "norm_output"),
            norm_before_residual=flag(c, "norm_before_residual"),
            norm_before_fc=flag(c, "norm_before_fc"),
            attention_bias=bool(c.get("attention_bias", False)),
            rope_interleave=bool(c.get("rope_interleave", True)),
            tie_word_embeddings=bool(c.get("tie_word_embeddings")),
            num_hidden_layers=layers,
            L=layers if isinstance(layers, int) and not isinstance(layers, bool) and layers > 0 else 1,
            qk_norm=any(a in QWEN3_ARCHITECTURES for a in archs),
            parallel_drafting=(flag(c, "parallel_drafting") or c.get("speculators_model_type") == "peagle"
                               or any(a in PEAGLE_ARCHITECTURES for a in archs)),
            hidden_act=str(c.get("hidden_act") or "silu"),
            rms_norm_eps=float(c.get("rms_norm_eps") or 1e-6),
            draft_vocab_declared=draft_vocab is not None,
            target_hidden_declared=bool(c.get("target_hidden_size")),
            **mla,
        )

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

    def flags(self) -> dict[str, bool]:
        """The switches canonical.json's ``when`` conditions may name."""
        return {"fc_bias": self.fc_bias, "fc_norm": self.fc_norm, "attention_bias": self.attention_bias,
                "norm_before_fc": self.norm_before_fc, "qk_norm": self.qk_norm,
                "parallel_drafting": self.parallel_drafting,
                "o_bias": (self.attention_bias or self.fc_bias) and not self.qk_norm}

    def with_(self, **changes: Any) -> DrafterSpec:
        """A copy with some fields replaced (fix-keys fills in what the weights reveal)."""
        return replace(self, **changes)

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
