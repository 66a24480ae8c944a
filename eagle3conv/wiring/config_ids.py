"""Writing the aux-layer wiring into config.json, in every engine's numbering.

Given the explicit layers a drafter was trained on, :func:`wiring_edits` makes
the config edits each engine needs and the launch lines for each:

* SGLang reads nested ``eagle_config.eagle_aux_hidden_state_layer_ids`` (and
  ``eagle_config.use_aux_hidden_state``). Ids that old and new SGLang read the
  same way are chosen when they exist (first slot = output of layer 1);
  otherwise the chosen version's ids, and the provenance says which versions
  they are right for.
* vLLM reads the top-level ``eagle_aux_hidden_state_layer_ids`` (input-of-layer).
* TensorRT-LLM takes ``eagle3_layers_to_capture`` (output-of-layer) at launch:
  printed, not written.
* ``eagle3conv.aux_layers``: the provenance block, the explicit layer set, where
  it came from, every engine's ids, the tool version. Later checks read the
  layers from here rather than guessing a numbering.
"""

from __future__ import annotations

import copy
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from eagle3conv.version import __version__
from eagle3conv.errors import WiringError
from eagle3conv.checkpoint.config import ConfigEdit
from eagle3conv.spec.engines import SglangIds, sglang_ids
from eagle3conv.spec.layers import (
    LayerRef,
    LayerSet,
    describe,
    to_ids,
    validate_refs,
)
from eagle3conv.wiring.metadata import TrainingRecord, make_record

PROVENANCE_KEY = "eagle3conv"
AUX_KEY = "aux_layers"


@dataclass
class WiringEdits:
    """The trained layers in every engine's numbering, and the config.json edits that write them."""

    layers: LayerSet
    record: TrainingRecord
    num_layers: int | None
    target: str | None
    target_repo: str | None
    sglang: SglangIds
    vllm_ids: tuple[int, ...]
    trtllm_ids: tuple[int, ...]
    config_edits: list[ConfigEdit] = field(default_factory=list)
    engines: list[dict] = field(default_factory=list)
    """Per engine release asked: the field it reads and the ids it needs (:func:`per_engine_ids`)."""

    def provenance(self) -> dict:
        return {
            "layers": [{"output_of": r.output_of} for r in self.layers],
            "described": describe(self.layers),
            "source": self.record.source,
            "target": self.target,
            "target_num_layers": self.num_layers,
            "ids": {
                "sglang": list(self.sglang.ids),
                "sglang_right_for": list(self.sglang.right_for),
                "sglang_by_version": {k: (None if v is None else list(v)) for k, v in self.sglang.by_version.items()},
                "vllm": list(self.vllm_ids),
                "tensorrt_llm_eagle3_layers_to_capture": list(self.trtllm_ids),
            },
            "written_by": f"eagle3conv {__version__}",
        }

    def launch(self, drafter: str) -> dict[str, str]:
        """Ready-to-paste launch lines (the target path is the profile's repo or a placeholder)."""
        tgt = shlex.quote(self.target_repo or self.target or "TARGET")
        d = shlex.quote(drafter)
        spec = json.dumps({"method": "eagle3", "model": drafter, "num_speculative_tokens": 3})
        trt = {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model_dir": drafter,
               "eagle3_layers_to_capture": list(self.trtllm_ids)}
        return {
            "sglang": (f"python -m sglang.launch_server --model-path {tgt} --speculative-algorithm EAGLE3 "
                       f"--speculative-draft-model-path {d} --speculative-num-steps 3 "
                       f"--speculative-eagle-topk 1 --speculative-num-draft-tokens 4"),
            "vllm": f"vllm serve {tgt} --speculative-config {shlex.quote(spec)}",
            "tensorrt_llm": f"trtllm-serve {tgt} --extra_llm_api_options extra.yaml  "
                            f"# extra.yaml: speculative_config: {json.dumps(trt)}",
            "tensorrt_llm_layers": f"eagle3_layers_to_capture: {sorted(self.trtllm_ids)}",
        }

    def to_dict(self, drafter: str | None = None) -> dict:
        d = {
            "layers": [{"output_of": r.output_of} for r in self.layers],
            "described": describe(self.layers),
            "source": self.record.source,
            "target": self.target,
            "target_num_layers": self.num_layers,
            "sglang_ids": list(self.sglang.ids),
            "sglang_right_for": list(self.sglang.right_for),
            "sglang_note": self.sglang.note,
            "vllm_ids": list(self.vllm_ids),
            "tensorrt_llm_ids": list(self.trtllm_ids),
            "config_edits": [e.to_dict() for e in self.config_edits],
            "per_engine": self.engines,
        }
        if drafter is not None:
            d["launch"] = self.launch(drafter)
        return d


def provenance_record(config: Mapping | None) -> TrainingRecord | None:
    """The layers an earlier ``eagle3conv config``/``fix-keys`` wrote into ``config.json``."""
    block = ((config or {}).get(PROVENANCE_KEY) or {})
    aux = block.get(AUX_KEY) if isinstance(block, Mapping) else None
    if not isinstance(aux, Mapping):
        return None
    layers = aux.get("layers")
    try:
        refs = validate_refs(LayerRef(item["output_of"]) for item in layers)  # type: ignore[union-attr]
    except Exception as err:  # noqa: BLE001 - a hand-edited block: say so
        raise WiringError(f"config.json {PROVENANCE_KEY}.{AUX_KEY}.layers is malformed ({err})") from None
    if not refs:
        raise WiringError(f"config.json {PROVENANCE_KEY}.{AUX_KEY}.layers is empty")
    src = aux.get("source")
    return make_record(refs, f"config.json {PROVENANCE_KEY}.{AUX_KEY}" + (f" (first from {src})" if src else ""),
                   target=aux.get("target") if isinstance(aux.get("target"), str) else None, kind="provenance")


def sglang_version_for(config: Mapping | None, layers: LayerSet, num_layers: int | None, choice: str,
                       family_default: str) -> str:
    """``choice`` is ``old``/``new``/``auto``. Auto: the numbering of the SGLang release
    that wins for the target's family (see :func:`~eagle3conv.wiring.check.priority_releases`);
    ids both numberings read alike are written whenever they exist."""
    if choice in ("old", "new"):
        return f"sglang-{choice}"
    return family_default


def rules_layer_count(layers: LayerSet, num_layers: int | None) -> int:
    """The layer count to read the engine rules with: the target's, or, when it is not
    known, one past the deepest layer named (no range check is possible then)."""
    if num_layers is not None:
        return num_layers
    return max([r.output_of for r in layers] + [0]) + 2


def per_engine_ids(layers: LayerSet, family: str | None, num_layers: int, engines) -> list[dict]:
    """For each engine release: where it reads its ids and the ids that make it capture
    ``layers`` (engine rules, docs/facts.md §9); None when no id list can."""
    from eagle3conv.spec.engines import id_field, ids_for

    out = []
    for rel in engines:
        try:
            ids = ids_for(rel, family, num_layers, layers)
        except (WiringError, Exception):  # noqa: BLE001 - out of range: reported by the check
            ids = None
        out.append({"engine": rel.label.replace(" ", "==", 1), "field": id_field(rel),
                    "ids": None if ids is None else list(ids)})
    return out


def wiring_edits(
    config: Mapping,
    record: TrainingRecord,
    *,
    num_layers: int | None,
    target: str | None,
    target_repo: str | None = None,
    sglang_version: str = "sglang-old",
    family: str | None = None,
) -> WiringEdits:
    """The config edits that wire ``record.layers`` for every engine.

    The SGLang ids come from the engine rules for the target's ``family``
    (:func:`eagle3conv.spec.engines.sglang_ids`; ``sglang_version`` is the numbering
    preferred when old and new SGLang read no id list alike). Raises
    :class:`WiringError` when SGLang cannot capture the set (the embedding output,
    the last layer's output) or a layer is out of range.
    """
    if record.layers is None:
        raise WiringError(f"the training record names no layers ({record.source})")
    layers = validate_refs(record.layers, num_layers)
    sg = sglang_ids(layers, family, rules_layer_count(layers, num_layers), prefer=sglang_version)
    vllm = to_ids(layers, "input", num_layers)
    trt = to_ids(layers, "output", num_layers)
    out = WiringEdits(layers, record, num_layers, target, target_repo, sg, vllm, trt)

    nested_old = config.get("eagle_config") if isinstance(config.get("eagle_config"), Mapping) else None
    nested = copy.deepcopy(dict(nested_old)) if nested_old else {}
    nested["eagle_aux_hidden_state_layer_ids"] = list(sg.ids)
    nested["use_aux_hidden_state"] = True
    if nested != nested_old:
        out.config_edits.append(ConfigEdit(
            "eagle_config", nested_old, nested,
            f"SGLang reads the aux ids here: {list(sg.ids)} = {describe(layers)} ({sg.note})"))
    if config.get("eagle_aux_hidden_state_layer_ids") != list(vllm):
        out.config_edits.append(ConfigEdit(
            "eagle_aux_hidden_state_layer_ids", config.get("eagle_aux_hidden_state_layer_ids"), list(vllm),
            f"vLLM reads input-of-layer ids here: {list(vllm)} = {describe(layers)}"))
    block_old = config.get(PROVENANCE_KEY) if isinstance(config.get(PROVENANCE_KEY), Mapping) else None
    block = copy.deepcopy(dict(block_old)) if block_old else {}
    old_aux = block.get(AUX_KEY)
    block[AUX_KEY] = out.provenance()
    comparable = dict(old_aux) if isinstance(old_aux, Mapping) else None
    if comparable is not None:
        comparable["written_by"] = block[AUX_KEY]["written_by"]
        if comparable.get("layers") == block[AUX_KEY]["layers"]:
            # same layers: keep where they were first learned from (idempotent re-runs)
            block[AUX_KEY]["source"] = comparable.get("source", block[AUX_KEY]["source"])
    if comparable != block[AUX_KEY]:
        out.config_edits.append(ConfigEdit(PROVENANCE_KEY, block_old, block,
                                     "provenance: the explicit layer set and where it came from"))
    return out
