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
from dataclasses import dataclass
from typing import Any

from eagle3conv.errors import InvalidCheckpointError, UsageError
from eagle3conv.spec.drafter import AUX_KEY, aux_ids
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


def source_drafter_config(format_name: str, config_from: str | None, config: dict | None, required_why: str | None) -> tuple[dict, list[str]]:
    """The drafter's own config as the source describes it (before loadability edits)."""
    notices: list[str] = []
    if config is None:
        raise UsageError(
            f"no config.json for this {format_name} checkpoint"
            + (f": {required_why}" if required_why else ""),
            hint="pass the drafter's config with --config path/to/config.json",
        )
    if config_from == "speculators":
        layer = config.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise InvalidCheckpointError("speculators config.json has no transformer_layer_config object")
        out = copy.deepcopy(layer)
        for f in ("draft_vocab_size", "target_hidden_size", "norm_before_residual", AUX_KEY):
            if config.get(f) is not None:
                out[f] = copy.deepcopy(config[f])
        verifier = (config.get("speculators_config") or {}).get("verifier") or {}
        out.setdefault("eagle3conv", {})["source"] = {
            "format": "speculators",
            "speculators_model_type": config.get("speculators_model_type"),
            "verifier": verifier.get("name_or_path"),
        }
        notices.append("config.json rebuilt from speculators' transformer_layer_config (the Llama layer settings)")
        if config.get("norm_before_residual"):
            notices.append(
                "norm_before_residual is true: vLLM honours it, SGLang behaves as false; acceptance on SGLang may differ"
            )
        return out, notices
    if config_from == "eagle_config":
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
        notices.append("drafter config built from the training config's eagle_config over the base model's settings")
        return out, notices
    return copy.deepcopy(config), notices


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
        }.get((config.get("architectures") or [None])[0], "the architecture every engine maps to its EAGLE-3 drafter class")
        want("architectures", [architecture], why)
    if architecture == LLAMA_EAGLE3 and not config.get("model_type"):
        want("model_type", "llama", "transformers needs model_type to parse the config")
    want("num_hidden_layers", layers, f"the weights hold {layers} decoder layer{'s' if layers != 1 else ''} "
         "(the engines build num_hidden_layers layers)")
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
