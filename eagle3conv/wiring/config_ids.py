"""Writing the aux-layer wiring into config.json, for every engine release served.

Given the explicit layers a drafter was trained on, :func:`wiring_edits` asks the engine rules
(:func:`eagle3conv.spec.engines.plan_ids`) which id list each config field must hold so that
the releases served capture those layers -- the releases asked first (their reading wins where
no single list serves every release reading a field), then every engine's default releases --
and makes the config edits:

* each config field a release reads its ids from (for SGLang the nested
  ``eagle_config`` list, for vLLM the top-level one: whatever the rules say), written through
  the one writer of config fields (:func:`eagle3conv.spec.drafter.with_field`), and the switch
  fields that turn capture on;
* ids read from a launch option (TensorRT-LLM) are printed in the launch lines, not written;
* ``eagle3conv.aux_layers``: the provenance block, the explicit layer set, where it came from,
  every field's ids, the tool version. Later checks read the layers from here rather than
  guessing a numbering.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from eagle3conv.version import __version__
from eagle3conv.errors import UsageError, WiringError
from eagle3conv.checkpoint.config import ConfigEdit
from eagle3conv.spec.drafter import read_field, with_field
from eagle3conv.spec.engines import (
    EngineRelease,
    IdField,
    IdsPlan,
    default_engines,
    engines,
    fc_fix,
    id_field,
    plan_ids,
)
from eagle3conv.spec.layers import LayerRef, LayerSet, describe, validate_refs
from eagle3conv.wiring.metadata import TrainingRecord, make_record

if TYPE_CHECKING:  # the launch lines' type (spec/launch.py is imported where the lines are made)
    from eagle3conv.spec.launch import LaunchLine

PROVENANCE_KEY = "eagle3conv"
PROVENANCE_LAYERS = "aux_layers"


def served_releases(asked: Sequence[EngineRelease]) -> tuple[EngineRelease, ...]:
    """The releases ids are written for, in priority order: those asked, then the default releases
    of every engine not asked for (newest first: where no single list serves them all, the newest
    release's reading wins, as the check's priority says), so that the config serves on every engine."""
    engines_asked = {r.engine for r in asked}
    rest = [r for r in default_engines() if r.engine not in engines_asked]
    order = {name: i for i, name in enumerate(dict.fromkeys(r.engine for r in rest))}
    return tuple(asked) + tuple(sorted(rest, key=lambda r: (order[r.engine], tuple(-x for x in r.version))))


@dataclass
class WiringEdits:
    """The trained layers, the id list each field holds for them, and the config.json edits."""

    layers: LayerSet
    record: TrainingRecord
    num_layers: int | None
    target: str | None
    target_repo: str | None
    plan: IdsPlan
    readers: dict[IdField, list[EngineRelease]] = field(default_factory=dict)
    """Per field: the releases that read their ids there first."""
    config_edits: list[ConfigEdit] = field(default_factory=list)
    asked: tuple[EngineRelease, ...] = ()
    """The releases asked for (``--engine``); the launch lines are for them first."""

    def launch_ids(self, engine: str) -> tuple[int, ...] | None:
        """The ids the launch line of ``engine`` passes (a launch option), if it reads them there."""
        for where, rels in self.readers.items():
            if not where.in_config and any(r.engine == engine for r in rels):
                return self.plan.ids(where)
        return None

    def written_ids(self) -> list[tuple[IdField, tuple[int, ...], list[EngineRelease]]]:
        """Each field written (config fields first, then launch options), its ids, and the releases that
        read their ids there first."""
        return [(where, ids, self.readers.get(where, [])) for where, ids in (*self.plan.fields, *self.plan.launch)]

    def fields(self) -> list[dict]:
        return [{"field": where.name, "kind": where.kind, "ids": list(ids), "read_by": [str(r) for r in read_by]}
                for where, ids, read_by in self.written_ids()]

    def provenance(self) -> dict:
        return {
            "layers": [{"output_of": r.output_of} for r in self.layers],
            "described": describe(self.layers),
            "source": self.record.source,
            "target": self.target,
            "target_num_layers": self.num_layers,
            "ids": self.fields(),
            "written_by": f"eagle3conv {__version__}",
        }

    def launch_rows(self, drafter: str, config: Mapping | None = None, tensor_names=()) -> dict[str, LaunchLine]:
        """The launch line of each engine's release served first, by engine, from the one builder
        (:func:`eagle3conv.spec.launch.launch_lines`; the target is the profile's repo or a placeholder);
        a line with no ``text`` (its ``refused`` says why) where that release cannot load the drafter."""
        from eagle3conv.spec.launch import launch_lines

        return launch_lines(served_releases(self.asked), config, drafter=drafter,
                            target=self.target_repo or self.target, capture_ids=self.launch_ids("tensorrt-llm"),
                            tensor_names=tensor_names)

    def launch(self, drafter: str, config: Mapping | None = None, tensor_names=()) -> dict[str, str]:
        """Ready-to-paste launch lines, one per engine (:meth:`launch_rows`): ``sglang``, ``vllm``,
        ``tensorrt_llm`` (and ``tensorrt_llm_layers``), or ``ENGINE_refused`` with why, for an engine whose
        release served first cannot load the drafter (``config``)."""
        trt_ids = self.launch_ids("tensorrt-llm")
        out: dict[str, str] = {}
        for engine, line in self.launch_rows(drafter, config, tensor_names).items():
            key = engine.replace("-", "_")
            if line.text is None:
                out[f"{key}_refused"] = "; ".join(line.refused)
            else:
                out[key] = line.one_line
        if trt_ids is not None and "tensorrt_llm" in out:
            out["tensorrt_llm_layers"] = f"eagle3_layers_to_capture: {sorted(trt_ids)}"
        return out

    def to_dict(self, drafter: str | None = None, config: Mapping | None = None, tensor_names=()) -> dict:
        d = {
            "layers": [{"output_of": r.output_of} for r in self.layers],
            "described": describe(self.layers),
            "source": self.record.source,
            "target": self.target,
            "target_num_layers": self.num_layers,
            "ids": self.fields(),
            "config_edits": [e.to_dict() for e in self.config_edits],
            "per_engine": [{"engine": r.spec, "field": str(id_field(r)), "ids": None if ids is None else list(ids)}
                           for r, ids in self.plan.needs],
        }
        if drafter is not None:
            d["launch"] = self.launch(drafter, config, tensor_names)
        return d


def provenance_record(config: Mapping | None) -> TrainingRecord | None:
    """The layers an earlier ``eagle3conv config``/``fix-keys`` wrote into ``config.json``."""
    found, aux = read_field(config, f"{PROVENANCE_KEY}.{PROVENANCE_LAYERS}")
    if not found or not isinstance(aux, Mapping):
        return None
    layers = aux.get("layers")
    where = f"config.json {PROVENANCE_KEY}.{PROVENANCE_LAYERS}.layers"
    if not isinstance(layers, list) or not all(isinstance(x, Mapping) and "output_of" in x for x in layers):
        raise WiringError(f"{where} is malformed (expected a list of {{\"output_of\": N}} objects)")
    try:
        refs = validate_refs(LayerRef(item["output_of"]) for item in layers)
    except (WiringError, UsageError) as err:  # LayerRef refuses a non-integer, validate_refs a repeat
        raise WiringError(f"{where} is malformed ({err.message})") from None
    if not refs:
        raise WiringError(f"{where} is empty")
    return make_record(refs, f"config.json {PROVENANCE_KEY}.{PROVENANCE_LAYERS}",
                       target=aux.get("target") if isinstance(aux.get("target"), str) else None, kind="provenance")


def wiring_edits(
    config: Mapping,
    record: TrainingRecord,
    *,
    num_layers: int | None,
    target: str | None,
    target_repo: str | None = None,
    family: str | None = None,
    releases: Sequence[EngineRelease] = (),
) -> WiringEdits:
    """The config edits that wire ``record.layers`` for every release served
    (:func:`served_releases` of ``releases``, the ones asked). Raises :class:`WiringError`
    when a layer is out of range, or when no release of an engine reading config.json can
    capture the set."""
    if record.layers is None:
        raise WiringError(f"the training record names no layers ({record.source})")
    layers = validate_refs(record.layers, num_layers)
    served = served_releases(releases)
    plan = plan_ids(layers, family, num_layers, served)
    readers: dict[IdField, list[EngineRelease]] = {}
    for rel, _ in plan.needs:
        readers.setdefault(id_field(rel), []).append(rel)
    written = {where for where, _ in plan.fields}
    must = set(releases) or set(served)  # the releases asked (else the default set) must be served
    lost = [w for w in readers if w.in_config and w not in written and must & set(readers[w])]
    if lost:
        who = ", ".join(str(r) for w in lost for r in readers[w] if r in must)
        raise WiringError(f"no id list in {', '.join(map(str, lost))} makes {who} capture {describe(layers)}",
                          hint="serve the drafter on another engine (--engine), or retrain on layers it can capture")
    out = WiringEdits(layers, record, num_layers, target, target_repo, plan, readers, asked=tuple(releases))
    new = dict(config)
    for where, ids in plan.fields:
        new = with_field(new, where.name, list(ids))
    switches = _switches(served, plan)
    for switch in switches:
        new = with_field(new, switch, True)
    counts = []
    for rel in served:  # a release that would size fc for another number of aux states is told k
        count = fc_fix(rel, new, len(layers))
        if count is not None and count not in counts:
            counts.append(count)
            new = with_field(new, count, len(layers))
    for key in dict.fromkeys(k.split(".")[0] for k in [w.name for w, _ in plan.fields] + switches + counts):
        if new.get(key) != config.get(key):
            readers_here = [r for w, rs in readers.items() if w.in_config and w.name.split(".")[0] == key for r in rs]
            ids = next((list(i) for w, i in plan.fields if w.name.split(".")[0] == key), None)
            why = (f"{', '.join(sorted({str(r) for r in readers_here}))} read the aux ids here: {ids} = "
                   f"{describe(layers)}" if ids is not None else
                   f"the number of aux states ({len(layers)}), which sizes the drafter's fc where no id list does")
            out.config_edits.append(ConfigEdit(key, config.get(key), new[key], why))
    block_old = config.get(PROVENANCE_KEY) if isinstance(config.get(PROVENANCE_KEY), Mapping) else None
    block = json.loads(json.dumps(block_old)) if block_old else {}
    old_aux = block.get(PROVENANCE_LAYERS)
    block[PROVENANCE_LAYERS] = out.provenance()
    comparable = dict(old_aux) if isinstance(old_aux, Mapping) else None
    if comparable is not None:
        comparable["written_by"] = block[PROVENANCE_LAYERS]["written_by"]
        if comparable.get("layers") == block[PROVENANCE_LAYERS]["layers"]:
            # same layers: keep where they were first learned from (idempotent re-runs)
            block[PROVENANCE_LAYERS]["source"] = comparable.get("source", block[PROVENANCE_LAYERS]["source"])
    if comparable != block[PROVENANCE_LAYERS]:
        out.config_edits.append(ConfigEdit(PROVENANCE_KEY, block_old, block,
                                           "provenance: the explicit layer set and where it came from"))
    return out


def _switches(served: Sequence[EngineRelease], plan: IdsPlan) -> list[str]:
    """The config switches that turn aux capture on for the releases whose field is written."""
    written = {w for w, _ in plan.fields}
    out: list[str] = []
    for rel in served:
        eng = engines()[rel.engine]
        for src in eng.capture_ids:
            if src.switch and (not rel.version or rel.version in src.releases) and id_field(rel) in written \
                    and src.switch not in out:
                out.append(src.switch)
    return out
