"""config.json: the drafter config a source implies, and the edits that make it loadable.

Engines read (docs/facts.md §3): ``architectures``
(``LlamaForCausalLMEagle3`` or ``Eagle3DeepseekV2ForCausalLM``),
``num_hidden_layers`` (the layers the weights hold), ``draft_vocab_size`` whenever the head is pruned
(without it SGLang and TensorRT-LLM replace the drafter's head with the
target's), ``target_hidden_size`` when the aux states are wider than H, and
``tie_word_embeddings`` false (true makes SGLang use the embedding as head).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from eagle3conv.errors import InvalidCheckpointError, UsageError
from eagle3conv.findings import CANNOT_SERVE, CONFIG, CONFIG_SOURCE, Finding
from eagle3conv.spec.drafter import (
    NORM_BEFORE_RESIDUAL,
    PARALLEL_DRAFTING,
    PEAGLE_ARCHITECTURES,
    SWITCH_FIELDS,
    aux_ids,
    flag,
    read_field,
    with_field,
)
from eagle3conv.io import dtypes

LLAMA_EAGLE3 = "LlamaForCausalLMEagle3"
# fields of a base (target) config that a Model Optimizer eagle_config inherits
INHERITED = (
    "hidden_size", "vocab_size", "rms_norm_eps", "rope_theta", "rope_scaling", "max_position_embeddings",
    "hidden_act", "head_dim", "num_attention_heads", "num_key_value_heads", "intermediate_size", "torch_dtype",
)


@dataclass(frozen=True)
class ConfigEdit:
    field: str
    old: Any
    new: Any
    why: str

    def to_dict(self) -> dict:
        return {"field": self.field, "old": self.old, "new": self.new, "why": self.why}


def aux_ids_in(config: dict | None) -> dict[str, list]:
    """Every place a config stores aux-layer ids, by dotted field name
    (:func:`eagle3conv.spec.drafter.aux_ids`)."""
    return aux_ids(config).fields()


# the config field that turns on parallel drafting (mappings/variants.json)
_PARALLEL = SWITCH_FIELDS[PARALLEL_DRAFTING.name]
# the mask-token fields vLLM 0.33.0 reads for parallel drafting, in its order
# (v1/spec_decode/llm_base_proposer.py:355-385; docs/facts.md §6)
def source_drafter_config(fmt, config: dict | None, *, from_override: bool = False,
                          index=None) -> tuple[dict, list[Finding]]:
    """The drafter's own config as the source describes it (before loadability edits), and what
    was found building it: the format's builder (``config_from``; skipped when the user gave the
    config with --config, ``from_override``), the fields it writes whatever the source says
    (``config_set``), its findings whose conditions hold on the checkpoint (``index``)."""
    notes: list[Finding] = []
    if config is None:
        raise UsageError(
            f"no config.json for this {fmt.name} checkpoint"
            + (f": {fmt.config_required}" if fmt.config_required else ""),
            hint="pass the drafter's config with --config path/to/config.json" + _named_config(index),
        )
    builder = None if from_override else fmt.config_from
    out, said = CONFIG_BUILDERS[builder](config, fmt) if builder is not None else (copy.deepcopy(config), [])
    notes += [Finding("notice", CONFIG, CONFIG_SOURCE, n) for n in said]
    for setting in fmt.config_set:
        out, found = _forced(setting, out)
        notes += found
    notes += _mask_token(out)
    if index is not None and fmt.findings:  # on the checkpoint, with the config it is converted with
        from eagle3conv.spec.formats import DetectContext, holds

        ctx = DetectContext(frozenset(index.tensors), config, index.layout, index.wrapper, index.root)
        notes += [_declared(f.level, f.code, f.message, f.fix) for f in fmt.findings if holds(f.when, ctx)]
    return out, notes


def _declared(level: str, code: str, message: str, fix: str | None = None) -> Finding:
    """A finding a format file declares (``findings``, ``config_set.source_warning``): its code was checked
    against eagle3conv.findings when the file was loaded (spec/formats.py)."""
    return Finding(level, CONFIG, code, message, fix)  # type: ignore[arg-type]


def _named_config(index) -> str:
    """A SpecForge run names its draft config in its provenance (``draft_config``: (kind, path, ...))."""
    prov = (getattr(index, "extras", None) or {}).get("specforge_model_provenance")
    try:
        pairs = dict(prov) if prov is not None else {}
    except (TypeError, ValueError):
        return ""
    ident = pairs.get("draft_config")
    if isinstance(ident, (list, tuple)) and len(ident) >= 2 and isinstance(ident[1], str):
        return f" (the run's draft config was {ident[1]}, training_state.pt specforge_model_provenance draft_config)"
    return ""


def _from_speculators(config: dict, fmt) -> tuple[dict, list[str]]:
    """speculators: transformer_layer_config with the top-level fields the format file names
    (``config_top_level``) carried over."""
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise InvalidCheckpointError("speculators config.json has no transformer_layer_config object")
    out = copy.deepcopy(layer)
    for f in fmt.config_top_level:
        if config.get(f) is not None:
            out[f] = copy.deepcopy(config[f])
    said = ["config.json rebuilt from speculators' transformer_layer_config (the decoder layers' settings: "
            "num_hidden_layers, head_dim, model_type) with its top-level switches"]
    if config.get("speculators_model_type") == PARALLEL_DRAFTING.on_when.speculators_model_type:
        out[_PARALLEL] = True
        said.append("parallel_drafting set: speculators_model_type is peagle (a P-EAGLE drafter; speculators 0.9.0 "
                    "models/peagle/config.py:14-33)")
    verifier = (config.get("speculators_config") or {}).get("verifier") or {}
    out.setdefault("eagle3conv", {})["source"] = {
        "format": "speculators",
        "speculators_model_type": config.get("speculators_model_type"),
        "verifier": verifier.get("name_or_path"),
    }
    if config.get(NORM_BEFORE_RESIDUAL.on_when.flags[0]):
        said.append("norm_before_residual is true: vLLM honours it, SGLang behaves as false; acceptance on SGLang "
                    "may differ")
    return out, said


def _from_eagle_config(config: dict, fmt) -> tuple[dict, list[str]]:
    """Model Optimizer's training config: the drafter's fields from its eagle_config over the base model's."""
    nested = config.get("eagle_config")
    if not isinstance(nested, dict):
        raise InvalidCheckpointError(
            "Model Optimizer training config.json has no eagle_config: cannot tell the drafter's architecture"
        )
    base = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    out = {k: copy.deepcopy(base[k]) for k in INHERITED if k in base}
    arch_fields = {k: v for k, v in nested.items() if not k.startswith(("eagle_aux", "use_", "parallel_", "next_layer"))}
    out.update(copy.deepcopy(arch_fields))
    out["eagle_config"] = {k: copy.deepcopy(v) for k, v in nested.items() if k not in arch_fields}
    return out, ["drafter config built from the training config's eagle_config over the base model's settings"]


def _from_automodel(config: dict, fmt) -> tuple[dict, list[str]]:
    """NeMo Automodel 0.7.0 writes the target's text config with the drafter's fields on top
    (recipes/llm/train_eagle3.py:610-648): the target's depth and attention layout would mislead the
    engines. docs/facts.md §6."""
    out = copy.deepcopy(config)
    said = ["config.json is the target's text config with NeMo Automodel's drafter fields on top "
            "(recipes/llm/train_eagle3.py:610-648)"]
    n = out.get("num_hidden_layers")
    if not flag(out, _PARALLEL) and n != 1:
        out["num_hidden_layers"] = 1
        said.append(f"num_hidden_layers {n} is the target's: Automodel's EAGLE-3 drafter has one decoder layer "
                    "whatever it says (components/speculative/eagle/draft_llama.py:760-764); the engines would build "
                    f"{n} layers and serve all but one uninitialised")
    layers = out.get("num_hidden_layers")
    types = out.get("layer_types")
    if isinstance(types, list) and isinstance(layers, int) and layers > 0 \
            and types != ["full_attention"] * layers:
        out["layer_types"] = ["full_attention"] * layers
        said.append(f"layer_types ({len(types)} entries, the target's attention layout) written as full attention for "
                    f"the drafter's {layers} layer{'s' if layers != 1 else ''}: Automodel's draft attention has no "
                    "sliding window (draft_llama.py Eagle3LlamaAttention; draft_gpt_oss.py:15-23), vLLM 0.33.0 gives a "
                    "drafter layer the config's sliding_window when layer_types says sliding_attention at its index "
                    "(model_executor/models/llama.py:185-204), and transformers refuses layer_types whose length is "
                    "not num_hidden_layers")
    if out.pop("quantization_config", None) is not None:
        said.append("quantization_config dropped: it is the target's (Automodel copies the target's config); the "
                    "drafter's weights are not quantized, and vLLM 0.33.0 builds a drafter with the drafter config's "
                    "quantization (model_executor/models/llama_eagle3.py:106-108)")
    return out, said


# a format's ``config_from`` (spec/formats.py CONFIG_FROM) -> the builder of the drafter config it implies
# (called with the source's config and the Format; it returns that config and what it said)
CONFIG_BUILDERS = {"speculators": _from_speculators, "eagle_config": _from_eagle_config, "automodel": _from_automodel}


def _forced(setting, config: dict) -> tuple[dict, list[Finding]]:
    """A ``config_set`` entry applied: the field written whatever the source says, with a notice
    when that changes it, and the format's warning when the source holds its ``source_warning`` value."""
    found, old = read_field(config, setting.field)
    out = with_field(config, setting.field, copy.deepcopy(setting.value))
    notes: list[Finding] = []
    warn = setting.source_warning
    if warn is not None and found and old == warn["equals"] and type(old) is type(warn["equals"]):
        notes.append(_declared("warning", warn["code"], warn["message"]))
    elif not found or old != setting.value or type(old) is not type(setting.value):
        shown = json.dumps(old) if found else "absent"
        notes.append(Finding("notice", CONFIG, CONFIG_SOURCE,
                             f"{setting.field} written {json.dumps(setting.value)} (was {shown}): {setting.why}"))
    return out, notes


def _mask_token(config: dict) -> list[Finding]:
    """A P-EAGLE drafter without a mask token id: vLLM refuses to serve it."""
    archs = config.get("architectures") if isinstance(config.get("architectures"), list) else []
    parallel = flag(config, _PARALLEL) or any(a in PEAGLE_ARCHITECTURES for a in archs)
    from eagle3conv.spec.engines import mask_token

    if not parallel or mask_token("vllm", config) is not None:  # where vLLM reads it (the engine rules)
        return []
    return [Finding(
        "warning", CONFIG, CANNOT_SERVE,
        "a P-EAGLE drafter (parallel_drafting) with no mask_token_id: vLLM 0.33.0 fills the parallel slots with "
        "that token and refuses to start without one (v1/spec_decode/llm_base_proposer.py:355-385)",
        "add \"mask_token_id\": ID (the token the run masked the parallel slots with) to the config and pass it "
        "with --config")]


def loadable_edits(config: dict, *, architecture: str, draft_vocab: int, vocab: int | None,
                   target_hidden: int, has_lm_head: bool, out_dtype: str | None, layers: int = 1,
                   num_aux: int | None = None) -> list[ConfigEdit]:
    """Edits that make ``config`` loadable by SGLang, vLLM and TensorRT-LLM."""
    edits: list[ConfigEdit] = []

    def want(field, value, why):
        if config.get(field) != value:
            edits.append(ConfigEdit(field, config.get(field), value, why))

    if config.get("architectures") != [architecture]:
        why = {
            "LlamaForCausalLM": "a plain LlamaForCausalLM (original EAGLE, old Model Optimizer exports) is routed to the target loader by SGLang and fails",
            "Eagle3LlamaForCausalLM": "AngelSlim's name; SGLang registers the drafter as LlamaForCausalLMEagle3",
            "DeepseekV3ForCausalLMEagle3": "SpecForge's MLA trainer class; SGLang registers the MLA drafter as "
                                           "Eagle3DeepseekV2ForCausalLM (docs/facts.md §6)",
            "LlamaEagle3DraftModel": "NeMo Automodel's training class (recipes/llm/train_eagle3.py:613), which no "
                                     "engine registers; Automodel's own serving helpers rewrite it the same way "
                                     "(components/speculative/serve_sglang.py:93-95, serve_vllm.py:132)",
            "PEagleDraftModel": "the P-EAGLE training class of SpecForge 0.2.0 (modeling/draft/peagle.py:196) and "
                                "speculators 0.9.0; vLLM 0.33.0 serves P-EAGLE with an EAGLE-3 architecture name and "
                                "parallel drafting on (docs/facts.md §6)",
        }.get((config.get("architectures") or [None])[0], "the architecture every engine maps to its EAGLE-3 drafter class")
        want("architectures", [architecture], why)
    if architecture == LLAMA_EAGLE3 and not config.get("model_type"):
        want("model_type", "llama", "transformers needs model_type to parse the config")
    want("num_hidden_layers", layers, f"the weights hold {layers} decoder layer{'s' if layers != 1 else ''} "
         "(the engines build num_hidden_layers layers)")
    archs = config.get("architectures") if isinstance(config.get("architectures"), list) else []
    peagle = next((a for a in archs if a in PEAGLE_ARCHITECTURES), None)
    if peagle and architecture not in PEAGLE_ARCHITECTURES and not flag(config, _PARALLEL):
        want(_PARALLEL, True, f"{peagle} names a P-EAGLE drafter; under the architecture written here only "
             "parallel_drafting says so (vLLM 0.33.0 serves P-EAGLE as an EAGLE-3 architecture with parallel "
             "drafting on, docs/facts.md §6)")
    if num_aux is not None and num_aux != 3 and config.get("num_aux_hidden_states") != num_aux:
        want("num_aux_hidden_states", num_aux,
             f"fc reads {num_aux} aux states; SGLang's and vLLM's Llama drafters size fc from num_aux_hidden_states, "
             "else from the nested ids, else 3 (docs/facts.md §11)")
    if vocab is not None and draft_vocab != vocab:
        want("draft_vocab_size", draft_vocab,
             "the head is pruned; without draft_vocab_size SGLang and TensorRT-LLM replace it with the target's head")
    if target_hidden != config.get("hidden_size") and config.get("target_hidden_size") != target_hidden:
        want("target_hidden_size", target_hidden, "fc reads aux states of this width, which differs from hidden_size")
    if has_lm_head and config.get("tie_word_embeddings"):
        want("tie_word_embeddings", False, "the drafter has its own lm_head; tied, SGLang would use the embedding as the head")
    if out_dtype:
        name = dtypes.torch_name(out_dtype)
        for field in ("torch_dtype", "dtype"):
            if field in config and config[field] != name:
                want(field, name, "--dtype changed the weights' dtype")
    return edits


def apply_edits(config: dict, edits: list[ConfigEdit]) -> dict:
    out = copy.deepcopy(config)
    for e in edits:
        out[e.field] = copy.deepcopy(e.new)
    return out
