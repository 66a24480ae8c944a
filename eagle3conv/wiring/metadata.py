"""What trainers recorded about the target layers a drafter was trained on.

A drafter only works when the engine feeds it the same target hidden states it
was trained on (docs/facts.md §5, §6, §8). Trainers rarely write
those layers down, and when they do each uses its own numbering. The readers
here turn every record that exists into one :class:`TrainingRecord`, whose
``layers`` are explicit :class:`~eagle3conv.spec.layers.LayerRef` s, so the
numbering question is answered once, here:

==================================  =================================================  ============
reader                              where                                              numbering
==================================  =================================================  ============
:func:`from_metadata_file`          eagle3conv's ``training_metadata.json``            explicit
:func:`from_specforge_state`        ``training_state.pt`` ``specforge_model_provenance``  ``output``
                                    ``capture_layers``; ``args`` fields
:func:`from_config`                 Model Optimizer nested ``eagle_config``            ``output``
                                    speculators top-level ids                          ``input``
                                    any other nested ``eagle_config`` ids              unknown
:func:`from_dump_manifest`          patched-server ``aux_<slot>.pt`` dumps with        ``captured-at-input``
                                    ``manifest.json``
:func:`from_user`                   ``--trained-on 3,31,59 --captured-at input``       ``input``/``output``
==================================  =================================================  ============

:func:`find_training_record` collects all of them, the metadata file first.

``training_metadata.json``, version 1
--------------------------------------

Written by :func:`write_metadata_file`, read (and validated) by
:func:`from_metadata_file`. A JSON object::

    {
      "format": "eagle3conv-training-metadata",   # required, exactly this
      "version": 1,                               # required; newer versions are refused
      "target": "moonshotai/Kimi-K2.5",           # str or null: the target model
      "layers": [{"output_of": 2}, {"output_of": 30}, {"output_of": 58}],
                                                  # required, non-empty, in slot order
                                                  # (the order of fc's input chunks);
                                                  # output_of is 0-based, -1 = the
                                                  # embedding output
      "convention": "captured-at-input",          # str or null: the numbering the layers
                                                  # were first written in (any name
                                                  # eagle3conv.spec.layers knows)
      "raw_ids": [3, 31, 59],                     # list of int or null: the ids as first
                                                  # written; with a convention they must
                                                  # decode to "layers"
      "includes_embedding": false,                # bool or null; must agree with layers
      "norms": {                                  # object or null: hidden-state statistics
        "statistic": "per-token L2 norm, position 0 excluded",
        "slots": [                                # one per layer, same order
          {"median": 41.2, "p10": 30.5, "p90": 55.0}, ...
        ]
      },
      "tokens": 1048576,                          # int >= 0 or null: tokens the statistics
                                                  # (or the training) covered
      "draft_vocab_size": 32000,                  # int >= 1 or null
      "source": "..."                             # optional free text: who wrote it
    }

The norm statistics are over per-token L2 norms of each slot's hidden state,
**excluding position 0** of every sequence (the first token's states are
outliers, attention-sink style, on most targets). They let a later check
compare training states with inference states slot by slot: an embedding
output configured in place of a deep layer shows that way (docs/facts.md §5),
its norm is far below a deep layer's. Unknown keys are ignored so that later minor additions stay
readable; malformed values raise :class:`CheckpointReadError` naming the
field, values that contradict each other raise :class:`WiringError`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from eagle3conv.io.files import atomic_write_text
from eagle3conv.errors import CheckpointReadError, UsageError, WiringError, WriteError
from eagle3conv.spec.drafter import AUX_KEY, NESTED_AUX_FIELD, aux_ids, read_field
from eagle3conv.spec.layers import (
    MAX_LAYERS,
    LayerRef,
    LayerSet,
    describe,
    get_convention,
    parse_ids,
    to_ids,
    to_refs,
    validate_refs,
)

METADATA_FILE = "training_metadata.json"
METADATA_FORMAT = "eagle3conv-training-metadata"
METADATA_VERSION = 1
MANIFEST_FILE = "manifest.json"
NORM_STATISTIC = "per-token L2 norm, position 0 excluded"

_AUX_FILE = re.compile(r"^aux_(\d+)\.pt$")
# numbering names that training_metadata.json files written by earlier eagle3conv releases (or by hand) may
# hold: the layers in the file are explicit, and these name the numbering of its raw_ids
_LEGACY_NUMBERINGS = {"sglang-old": "output", "tensorrt-llm": "output", "trtllm": "output", "specforge": "output",
                      "modelopt": "output", "angelslim": "output", "vllm": "input", "speculators": "input",
                      "eagle": "input"}

RecordKind = Literal["user", "metadata", "provenance", "specforge", "config", "dumps", "trainer", "default"]


@dataclass(frozen=True)
class TrainingRecord:
    """One record of the target states a drafter was trained on.

    ``layers`` is None when the source names no layers, or names ids in a
    numbering eagle3conv cannot tell (then ``raw_ids`` holds them and
    ``convention`` is None; ``source`` says why).
    """

    layers: LayerSet | None
    source: str
    convention: str | None = None
    raw_ids: list | None = None
    target: str | None = None
    draft_vocab_size: int | None = None
    norms: dict | None = None
    tokens: int | None = None
    includes_embedding: bool | None = None
    kind: RecordKind | None = None
    """Where the record comes from: ``user`` (--trained-on), ``metadata`` (training_metadata.json),
    ``provenance`` (eagle3conv's block in config.json), ``specforge`` (training_state.pt),
    ``config`` (the config's own ids), ``dumps`` (aux dumps), ``trainer`` (a trainer's own record
    file beside the weights, as its format names it: NeMo Automodel's config.yaml), ``default``
    (no record: the trainer's default layers, assumed). Branch on this, not on ``source``."""
    config_field: str | None = None
    """``kind == "config"``: the config field the ids were read from."""

    def describe(self) -> str:
        """Plain words, e.g. ``"outputs of layers 2, 30, 58 (captured-at-input ids
        [3, 31, 59], from training_metadata.json)"``."""
        if self.layers is not None:
            what = describe(self.layers)
        elif self.raw_ids is not None:
            what = f"ids {list(self.raw_ids)} in an unknown numbering"
        else:
            what = "layers not recorded"
        ids = ""
        if self.layers is not None and self.convention and self.raw_ids is not None:
            ids = f"{self.convention} ids {list(self.raw_ids)}, "
        return f"{what} ({ids}from {self.source})"


def make_record(
    layers: LayerSet | None,
    source: str,
    *,
    convention: str | None = None,
    raw_ids: Iterable[int] | None = None,
    **rest: Any,
) -> TrainingRecord:
    """A :class:`TrainingRecord`; ``includes_embedding`` defaults to whether ``layers`` has it."""
    includes = rest.pop("includes_embedding", None)
    if includes is None and layers is not None:
        includes = any(r.is_embedding for r in layers)
    return TrainingRecord(
        layers=layers,
        source=source,
        convention=convention,
        raw_ids=None if raw_ids is None else list(raw_ids),
        includes_embedding=includes,
        **rest,
    )


def _int_list(value: Any, where: str) -> list[int]:
    if not isinstance(value, (list, tuple)):
        raise CheckpointReadError(f"{where}: expected a list of layer ids, got {_shown(value)}")
    out = list(value)
    for n, i in enumerate(out):
        if isinstance(i, bool) or not isinstance(i, int):
            raise CheckpointReadError(f"{where}: layer ids must be integers, got {_shown(i)} at position {n}")
    if not out:
        raise CheckpointReadError(f"{where}: the list of layer ids is empty")
    return out


def decode_ids(ids: list[int], convention: str, num_layers: int | None, where: str) -> LayerSet:
    """``to_refs`` whose error names ``where`` the ids were read from."""
    try:
        return to_refs(ids, convention, num_layers)
    except WiringError as err:
        raise WiringError(f"{where}: {err.message}", hint=err.hint, details=err.details) from err


# --------------------------------------------------------------------------- SpecForge


def _pairs(value: Any, where: str) -> dict:
    """SpecForge provenance: a dict, or a list of ``[key, value]`` pairs."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (list, tuple)):
        out = {}
        for item in value:
            if not isinstance(item, (list, tuple)) or len(item) != 2 or not isinstance(item[0], str):
                raise CheckpointReadError(f"{where}: expected [key, value] pairs, got {_shown(item)}")
            out[item[0]] = item[1]
        return out
    raise CheckpointReadError(f"{where}: expected a dict or a list of [key, value] pairs, got {type(value).__name__}")


def _args_dict(args: Any) -> dict:
    if isinstance(args, argparse.Namespace):
        return vars(args)
    if isinstance(args, Mapping):
        return dict(args)
    return {}


_ARGS_LAYER_FIELDS = ("capture_layers", "aux_hidden_states_layers", "aux_hidden_state_layer_ids", AUX_KEY)
_ARGS_TARGET_FIELDS = ("target_model", "target_model_path", "target_model_name_or_path")


def _from_provenance(extras: Mapping) -> TrainingRecord | None:
    where = "training_state.pt specforge_model_provenance"
    prov = extras.get("specforge_model_provenance")
    if prov is None:
        return None
    p = _pairs(prov, where)
    target = p.get("target_model")
    vocab = p.get("draft_vocab_size")
    ids = p.get("capture_layers")
    if ids is None:
        if target is None:
            return None
        return make_record(None, f"{where} (no capture_layers: an offline run, layers not recorded)", kind="specforge",
                       target=str(target), draft_vocab_size=vocab if isinstance(vocab, int) else None)
    raw = _int_list(ids, f"{where}.capture_layers")
    return make_record(
        decode_ids(raw, "output", None, f"{where}.capture_layers"),
        f"{where}.capture_layers",
        kind="specforge",
        convention="output",
        raw_ids=raw,
        target=None if target is None else str(target),
        draft_vocab_size=vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None,
    )


def _from_args(extras: Mapping) -> TrainingRecord | None:
    args = _args_dict(extras.get("args"))
    if not args:
        return None
    for name in _ARGS_LAYER_FIELDS:
        if args.get(name) is not None:
            where = f"training_state.pt args.{name}"
            raw = _int_list(args[name], where)
            target = next((args[t] for t in _ARGS_TARGET_FIELDS if args.get(t)), None)
            vocab = args.get("draft_vocab_size")
            return make_record(
                decode_ids(raw, "output", None, where),
                f"{where} (SpecForge numbering: output of layer)",
                kind="specforge",
                convention="output",
                raw_ids=raw,
                target=None if target is None else str(target),
                draft_vocab_size=vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None,
            )
    return None


def from_specforge_state(extras: Mapping | None) -> TrainingRecord | None:
    """Read a SpecForge ``training_state.pt``'s non-tensor entries (``index.extras``).

    ``specforge_model_provenance.capture_layers`` (output-of-layer numbering,
    online runs only) wins; else an ``args`` field naming aux layers
    (``capture_layers``, ``aux_hidden_states_layers``, ...). A provenance with a
    target and no layers gives a record with ``layers=None``.
    """
    if not extras:
        return None
    prov = _from_provenance(extras)
    if prov is not None and prov.layers is not None:
        return prov
    args = _from_args(extras)
    if args is not None:
        if prov is not None and args.target is None and prov.target is not None:
            return TrainingRecord(**{**args.__dict__, "target": prov.target})
        return args
    return prov


# --------------------------------------------------------------------------- a trainer's record file


def _record_file(root: Path, spec) -> Path | None:
    """The first of the format's record files that exists (``record.dirs``, relative to the weights),
    checked like every file read from a folder (:func:`~eagle3conv.checkpoint.links.safe_member`): it
    must resolve to a regular file inside the folder it is named in (the weights' folder, or for
    Automodel's ``model/consolidated`` the run folder two up that holds it); a link leaving it, a
    dangling link or a FIFO is refused by name, without opening it."""
    from eagle3conv.checkpoint.links import safe_member

    folder = root if root.is_dir() else root.parent
    for d in spec.dirs:
        if "when_path" in d and not re.search(d["when_path"], folder.as_posix()):
            continue
        base = Path(os.path.normpath(folder / d["dir"]))  # the folder named, as the trainer lays it out
        path = base / spec.file
        if _entry(path):
            return safe_member(base, path)
    return None


def _entry(path: Path) -> bool:
    """Whatever sits at ``path`` but a folder (a file, a link of any kind, a FIFO): present, for
    :func:`~eagle3conv.checkpoint.links.safe_member` to judge."""
    return os.path.lexists(path) and not (path.is_dir() and not path.is_symlink())


def _read_yaml(path: Path) -> Any:
    """A trainer's YAML record (:func:`eagle3conv.io.yamlfile.read_yaml_file`: small, plain data, no
    aliases); errors name the file and quote none of it."""
    from eagle3conv.io.yamlfile import read_yaml_file

    return read_yaml_file(path, "recipe snapshot")


def _shown(value: Any) -> str:
    """A value read from a record file, in an error: a small integer as itself, anything else by its
    type only (the file may hold anything; its bytes are not echoed)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**12:
        return str(value)
    if isinstance(value, float) and len(repr(value)) <= 24:
        return repr(value)
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    return {str: "a string", bool: "a boolean", float: "a number", dict: "a mapping",
            type(None): "null"}.get(type(value), f"a {type(value).__name__}")


def _target_layers(spec, config: Mapping | None) -> int | None:
    """The target's layer count the source config holds (``record.target_layers``), if it does."""
    cfg = config or {}
    value = cfg.get(spec.layers_field)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
            and not (spec.layers_unless and cfg.get(spec.layers_unless)):
        return value
    return None


def from_trainer_file(root: str | os.PathLike | None, spec, trainer: str,
                      config: Mapping | None = None) -> TrainingRecord | None:
    """The aux layers a trainer records in a file of its own beside the weights (a format's
    ``record``: NeMo Automodel's ``config.yaml`` ``recipe_args.aux_layer_ids``), checked against the
    target's layer count where the source ``config`` holds it. None when the file is absent or does
    not name them (then :func:`trainer_default` may apply)."""
    if root is None or spec is None:
        return None
    path = _record_file(Path(root), spec)
    if path is None:
        return None
    data = _read_yaml(path) if path.suffix in (".yaml", ".yml") else _read_json_object(path)
    _check_shape(data, spec.field, path)
    found, ids = read_field(data, spec.field)
    if not found or ids is None:
        return None
    where = f"{path} {spec.field}"
    raw = _int_list(ids, where)
    target = read_field(data, spec.target_field)[1] if spec.target_field else None
    return make_record(decode_ids(raw, spec.numbering, _target_layers(spec, config), where),
                       f"{where} ({trainer}: {spec.numbering}-of-layer numbering)", kind="trainer",
                       convention=spec.numbering, raw_ids=raw, target=target if isinstance(target, str) else None)


def _check_shape(data: Any, field: str, path: Path) -> None:
    """The record is a mapping, and each object on the field's dotted path is one where present."""
    if data is None:
        raise CheckpointReadError(f"{path}: empty (no YAML document); expected {field} in it")
    node, seen = data, []
    for part in field.split("."):
        if not isinstance(node, Mapping):
            where = ".".join(seen) or "the file"
            raise CheckpointReadError(f"{path}: {where} is {_shown(node)}, not a mapping; expected {field} in it",
                                      hint=f"the trainer writes {field} as a list of layer ids")
        if part not in node:
            return
        node = node[part]
        seen.append(part)


def trainer_default(spec, config: Mapping | None, trainer: str, num_layers: int | None = None) -> TrainingRecord | None:
    """No record file: the layers the trainer captures by default, assumed and said so. Its N is the
    source config's ``record.target_layers`` field (the target's layer count there), else
    ``num_layers`` (the target's profile); None when neither is known."""
    if spec is None:
        return None
    n, why_n = _target_layers(spec, config), f"config.json {spec.layers_field}, the target's"
    if n is None and num_layers:
        n, why_n = num_layers, "the target's profile"
    if n is None:
        return None
    from eagle3conv.spec.engine_rules import default_term

    raw = [default_term(t, n) for t in spec.default_ids]
    where = f"{trainer}'s default [{', '.join(spec.default_ids)}] for N = {n} ({why_n})"
    try:
        layers = decode_ids(raw, spec.numbering, n, where)
    except WiringError:
        return None  # the target is too shallow for the default: the trainer refuses it too
    looked = ", ".join("beside the weights" if d["dir"] in (".", "") else f"{d['dir']} of them" for d in spec.dirs)
    return make_record(layers, f"{where}: assumed, not recorded (no {spec.file} naming {spec.field}; looked "
                               f"{looked})", kind="default", convention=spec.numbering, raw_ids=raw)


# --------------------------------------------------------------------------- config.json

# eagle_config flags only Model Optimizer writes (SGLang/SpecForge configs carry at most
# eagle_aux_hidden_state_layer_ids and use_aux_hidden_state)
_MODELOPT_FLAGS = ("use_last_layernorm", "use_input_layernorm_in_first_layer", "use_mtp_layernorm",
                   "eagle_decoder_type", "parallel_draft_step")


def _is_modelopt_training(config: Mapping, nested: Mapping) -> bool:
    """A Model Optimizer training dir's config.json is the *target's* config with the
    drafter's architecture nested in ``eagle_config``."""
    archs = config.get("architectures") or []
    eagle_arch = any("eagle" in str(a).lower() for a in archs)
    layers = config.get("num_hidden_layers")
    return (not eagle_arch and isinstance(layers, int) and layers > 1
            and any(k in nested for k in ("hidden_size", "num_hidden_layers", "intermediate_size")))


def from_config(config: Mapping | None) -> TrainingRecord | None:
    """Aux ids a drafter's ``config.json`` records.

    - speculators (``speculators_model_type`` present): top-level
      ``eagle_aux_hidden_state_layer_ids``, input-of-layer numbering.
    - nested ``eagle_config.eagle_aux_hidden_state_layer_ids``: output-of-layer
      when the config is recognisably Model Optimizer's, i.e. either a training
      config (a multi-layer target config, non-EAGLE architecture, with the
      drafter's dimensions nested in ``eagle_config``; its ``num_hidden_layers``
      then bounds the ids) or an export whose ``eagle_config`` holds a flag only
      Model Optimizer writes (``use_last_layernorm``, ...). Any other nested ids
      (SGLang-style drafters, SpecForge drafts, hand edits) may be in any
      numbering: the record keeps ``raw_ids`` with ``convention=None`` and
      ``layers=None`` and says so in ``source``.
    - top-level ids without ``speculators_model_type``: numbering unknown, as above.
    """
    if not config:
        return None
    vocab = config.get("draft_vocab_size")
    vocab = vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None
    nested = config.get("eagle_config")
    declared = aux_ids(config)
    if config.get("speculators_model_type") is not None and declared.top_level is not None:
        fld = AUX_KEY
        where = f"config.json {fld}"
        raw = _int_list(declared.top_level, where)
        verifier = ((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
        return make_record(
            decode_ids(raw, "input", None, where),
            f"{where} (speculators: input-of-layer numbering)",
            convention="input", raw_ids=raw, target=verifier, draft_vocab_size=vocab, kind="config", config_field=fld,
        )
    if declared.nested is not None:
        fld = NESTED_AUX_FIELD
        where = f"config.json {fld}"
        raw = _int_list(declared.nested, where)
        nvocab = nested.get("draft_vocab_size")
        if vocab is None and isinstance(nvocab, int) and not isinstance(nvocab, bool):
            vocab = nvocab
        if _is_modelopt_training(config, nested):
            n = config["num_hidden_layers"]
            return make_record(
                decode_ids(raw, "output", n, where),
                f"{where} (Model Optimizer training config: output-of-layer numbering)",
                convention="output", raw_ids=raw, target=config.get("_name_or_path") or None,
                draft_vocab_size=vocab, kind="config", config_field=fld,
            )
        flag = next((f for f in _MODELOPT_FLAGS if f in nested), None)
        if flag is not None:
            return make_record(
                decode_ids(raw, "output", None, where),
                f"{where} (Model Optimizer export, eagle_config.{flag} present: output-of-layer numbering)",
                convention="output", raw_ids=raw, draft_vocab_size=vocab, kind="config", config_field=fld,
            )
        return make_record(
            None,
            f"{where} (numbering unknown: the config does not say which trainer wrote it; "
            "SGLang, SpecForge and Model Optimizer exports all use this field)",
            raw_ids=raw, draft_vocab_size=vocab, kind="config", config_field=fld,
        )
    if declared.top_level is not None:
        fld = AUX_KEY
        where = f"config.json {fld}"
        raw = _int_list(declared.top_level, where)
        return make_record(None, f"{where} (numbering unknown: no speculators_model_type beside it)",
                       raw_ids=raw, draft_vocab_size=vocab, kind="config", config_field=fld)
    return None


# --------------------------------------------------------------------------- dumps


def norm_stats(states: Any, *, skip_first: int = 1) -> dict:
    """Per-token L2-norm statistics of one slot's states ``[tokens, T]`` (numpy or
    torch), excluding the first ``skip_first`` positions (position 0 by default).

    Returns ``{"median", "p10", "p90", "tokens"}``.
    """
    import numpy as np

    if hasattr(states, "detach"):
        states = states.detach().float().cpu().numpy()
    a = np.asarray(states, dtype=np.float64)
    if a.ndim == 3:  # [batch, seq, T]: drop position 0 of every sequence
        a = a[:, skip_first:, :].reshape(-1, a.shape[-1])
    elif a.ndim == 2:
        a = a[skip_first:]
    else:
        raise UsageError(f"hidden states must be [tokens, T] or [batch, seq, T], got shape {a.shape}")
    if a.shape[0] == 0:
        raise UsageError("no tokens left after excluding position 0: need at least 2 positions")
    n = np.linalg.norm(a, axis=-1)
    p10, med, p90 = np.percentile(n, [10, 50, 90])
    return {"median": float(med), "p10": float(p10), "p90": float(p90), "tokens": int(n.shape[0])}


def from_dump_manifest(folder: str | os.PathLike, *, with_norms: bool = False) -> TrainingRecord | None:
    """Patched-server aux dumps: ``aux_0.pt``, ``aux_1.pt``, ... (one ``[tokens, T]`` tensor per
    slot) and an optional ``manifest.json``::

        {"captured_at_input_of": [3, 31, 59], "target": "kimi-k2.5"}

    naming the layer each file was captured at the INPUT of (``captured-at-input``
    numbering: 3 = output of layer 2). Without a manifest the record has
    ``layers=None``. ``with_norms`` loads the dumps (weights-only) and fills
    ``norms``/``tokens`` (see :func:`norm_stats`). None when the folder holds
    neither dumps nor a manifest.
    """
    root = Path(folder)
    if not root.is_dir():
        raise CheckpointReadError(f"{root}: not a folder of aux dumps")
    slots = {}
    for p in root.iterdir():
        m = _AUX_FILE.match(p.name)
        if m and p.is_file():
            slots[int(m.group(1))] = p
    manifest_path = root / MANIFEST_FILE
    if _entry(manifest_path):  # it must resolve inside the dump folder (checkpoint/links.py)
        from eagle3conv.checkpoint.links import safe_member

        safe_member(root, manifest_path)
    if not slots and not manifest_path.is_file():
        return None
    if slots and sorted(slots) != list(range(len(slots))):
        raise CheckpointReadError(
            f"{root}: aux dump files must be aux_0.pt .. aux_{len(slots) - 1}.pt, "
            f"found slots {sorted(slots)}"
        )
    layers = raw = target = None
    source = f"{root} aux dumps (no {MANIFEST_FILE}: capture layers not recorded)"
    if manifest_path.is_file():
        manifest = _read_json_object(manifest_path)
        where = f"{manifest_path} captured_at_input_of"
        if "captured_at_input_of" not in manifest:
            raise CheckpointReadError(f"{manifest_path}: missing field 'captured_at_input_of'")
        raw = _int_list(manifest["captured_at_input_of"], where)
        n = manifest.get("num_layers")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_LAYERS):
            raise CheckpointReadError(f"{manifest_path}: field 'num_layers' must be an integer from 1 to {MAX_LAYERS}, got {_shown(n)}")
        layers = decode_ids(raw, "captured-at-input", n, where)
        if slots and len(slots) != len(raw):
            raise WiringError(
                f"{manifest_path}: captured_at_input_of names {len(raw)} layers "
                f"but the folder holds {len(slots)} aux_<slot>.pt files"
            )
        t = manifest.get("target")
        target = None if t is None else str(t)
        source = f"{manifest_path} captured_at_input_of"
    norms = tokens = None
    if with_norms and slots:
        from eagle3conv.io.pickle import load_pickle

        stats = []
        for slot in range(len(slots)):
            obj = load_pickle(slots[slot])
            if not hasattr(obj, "shape"):
                raise CheckpointReadError(f"{slots[slot]}: expected one tensor, got {type(obj).__name__}")
            stats.append(norm_stats(obj))
        tokens = min(s["tokens"] for s in stats)
        norms = {"statistic": NORM_STATISTIC,
                 "slots": [{k: s[k] for k in ("median", "p10", "p90")} for s in stats]}
    return make_record(layers, source, convention="captured-at-input" if raw is not None else None,
                   raw_ids=raw, target=target, norms=norms, tokens=tokens, kind="dumps")


# --------------------------------------------------------------------------- metadata file


def _read_json_object(path: Path) -> dict:
    from eagle3conv.io.jsonfile import read_json_file

    return read_json_file(path)


def _opt(obj: dict, key: str, kinds: tuple[type, ...], what: str, path: Path) -> Any:
    v = obj.get(key)
    if v is None:
        return None
    if (isinstance(v, bool) and bool not in kinds) or not isinstance(v, kinds):
        raise CheckpointReadError(f"{path}: field '{key}' must be {what} or null, got {_shown(v)}")
    return v


def _number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and v >= 0


def _check_norms(norms: Any, nslots: int, where: str, error: type) -> dict:
    if not isinstance(norms, Mapping):
        raise error(f"{where}: field 'norms' must be an object, got {_shown(norms)}")
    slots = norms.get("slots")
    if not isinstance(slots, list):
        raise error(f"{where}: field 'norms.slots' must be a list (one entry per layer)")
    if len(slots) != nslots:
        raise WiringError(f"{where}: field 'norms.slots' has {len(slots)} entries but 'layers' has {nslots}")
    for i, s in enumerate(slots):
        if not isinstance(s, Mapping):
            raise error(f"{where}: field 'norms.slots[{i}]' must be an object with median, p10, p90")
        for k in ("median", "p10", "p90"):
            if not _number(s.get(k)):
                raise error(f"{where}: field 'norms.slots[{i}].{k}' must be a finite number >= 0, got {_shown(s.get(k))}")
        if not s["p10"] <= s["median"] <= s["p90"]:
            raise error(f"{where}: field 'norms.slots[{i}]' needs p10 <= median <= p90, got "
                        f"{s['p10']}, {s['median']}, {s['p90']}")
    return {"statistic": norms.get("statistic", NORM_STATISTIC),
            "slots": [{k: float(s[k]) for k in ("median", "p10", "p90")} for s in slots]}


def _check_consistent(layers: LayerSet, convention: str | None, raw_ids: list | None,
                      includes: bool | None, where: str) -> None:
    if convention is not None and raw_ids is not None:
        decoded = decode_ids(list(raw_ids), convention, None, f"{where}: field 'raw_ids'")
        if tuple(decoded) != tuple(layers):
            raise WiringError(
                f"{where}: field 'raw_ids' {list(raw_ids)} in {convention} numbering means "
                f"{describe(decoded)}, but field 'layers' says {describe(layers)}"
            )
    if includes is not None and includes != any(r.is_embedding for r in layers):
        raise WiringError(
            f"{where}: field 'includes_embedding' is {str(includes).lower()} but 'layers' are {describe(layers)}"
        )


def from_metadata_file(path: str | os.PathLike) -> TrainingRecord | None:
    """Read eagle3conv's ``training_metadata.json`` (schema in the module docstring).

    ``path`` may be the file or the folder holding it; None when a folder has
    none. Raises :class:`CheckpointReadError` for malformed fields and
    :class:`WiringError` for fields that contradict each other.
    """
    p = Path(path)
    if p.is_dir():  # the folder's own file: it must resolve inside the folder (checkpoint/links.py)
        from eagle3conv.checkpoint.links import safe_member

        folder, p = p, p / METADATA_FILE
        if not _entry(p):
            return None
        safe_member(folder, p)
    obj = _read_json_object(p)
    if obj.get("format") != METADATA_FORMAT:
        raise CheckpointReadError(
            f"{p}: field 'format' must be {METADATA_FORMAT!r}, got {_shown(obj.get('format'))}"
        )
    version = obj.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise CheckpointReadError(f"{p}: field 'version' must be an integer, got {_shown(version)}")
    if version > METADATA_VERSION:
        raise CheckpointReadError(
            f"{p}: field 'version' is {version}; this eagle3conv reads version {METADATA_VERSION}",
            hint="upgrade eagle3conv",
        )
    if version < 1:
        raise CheckpointReadError(f"{p}: field 'version' must be >= 1, got {version}")
    raw_layers = obj.get("layers")
    if not isinstance(raw_layers, list) or not raw_layers:
        raise CheckpointReadError(
            f"{p}: field 'layers' must be a non-empty list like [{{\"output_of\": 2}}, ...], got {_shown(raw_layers)}"
        )
    refs = []
    for i, item in enumerate(raw_layers):
        v = item.get("output_of") if isinstance(item, dict) else None
        if isinstance(v, bool) or not isinstance(v, int) or v < -1:
            raise CheckpointReadError(
                f"{p}: field 'layers[{i}]' must be {{\"output_of\": <layer, 0-based, or -1 for the "
                f"embedding output>}}, got {_shown(item)}"
            )
        refs.append(LayerRef(v))
    try:
        layers = validate_refs(refs)
    except WiringError as err:
        raise WiringError(f"{p}: field 'layers': {err.message}") from err
    convention = _opt(obj, "convention", (str,), "a layer numbering name", p)
    if convention is not None:
        try:
            convention = get_convention(_LEGACY_NUMBERINGS.get(convention, convention)).name
        except UsageError as err:
            raise CheckpointReadError(f"{p}: field 'convention': {err.message}") from err
    raw_ids = obj.get("raw_ids")
    if raw_ids is not None:
        raw_ids = _int_list(raw_ids, f"{p}: field 'raw_ids'") if isinstance(raw_ids, list) else None
        if raw_ids is None:
            raise CheckpointReadError(f"{p}: field 'raw_ids' must be a list of integers or null")
        if len(raw_ids) != len(layers):
            raise WiringError(f"{p}: field 'raw_ids' has {len(raw_ids)} ids but 'layers' has {len(layers)}")
    includes = _opt(obj, "includes_embedding", (bool,), "true or false", p)
    _check_consistent(layers, convention, raw_ids, includes, str(p))
    tokens = _opt(obj, "tokens", (int,), "a whole number >= 0", p)
    if tokens is not None and tokens < 0:
        raise CheckpointReadError(f"{p}: field 'tokens' must be >= 0, got {tokens}")
    vocab = _opt(obj, "draft_vocab_size", (int,), "a positive integer", p)
    if vocab is not None and vocab < 1:
        raise CheckpointReadError(f"{p}: field 'draft_vocab_size' must be >= 1, got {vocab}")
    target = _opt(obj, "target", (str,), "a string", p)
    norms = obj.get("norms")
    if norms is not None:
        norms = _check_norms(norms, len(layers), str(p), CheckpointReadError)
    note = obj.get("source")
    source = f"{p.name}" + (f", {note}" if isinstance(note, str) and note else "")
    return make_record(layers, source, convention=convention, raw_ids=raw_ids, target=target,
                   draft_vocab_size=vocab, norms=norms, tokens=tokens, includes_embedding=includes, kind="metadata")


def metadata_dict(record: TrainingRecord) -> dict:
    """The ``training_metadata.json`` object for ``record`` (validated)."""
    if not record.layers:
        raise UsageError("cannot write training metadata without layers: the record names none")
    layers = validate_refs(record.layers)
    raw_ids = None if record.raw_ids is None else list(record.raw_ids)
    convention = None if record.convention is None else get_convention(record.convention).name
    if convention is not None and raw_ids is None:
        raw_ids = list(to_ids(layers, convention))
    if raw_ids is not None and len(raw_ids) != len(layers):
        raise WiringError(f"record raw_ids {raw_ids} has {len(raw_ids)} ids but layers has {len(layers)}")
    includes = record.includes_embedding
    _check_consistent(layers, convention, raw_ids, includes, "record")
    if includes is None:
        includes = any(r.is_embedding for r in layers)
    norms = None
    if record.norms is not None:
        norms = _check_norms(record.norms, len(layers), "record", UsageError)
    for name in ("tokens", "draft_vocab_size"):
        v = getattr(record, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise UsageError(f"record field '{name}' must be a whole number, got {v!r}")
    return {
        "format": METADATA_FORMAT,
        "version": METADATA_VERSION,
        "target": record.target,
        "layers": [{"output_of": r.output_of} for r in layers],
        "convention": convention,
        "raw_ids": raw_ids,
        "includes_embedding": includes,
        "norms": norms,
        "tokens": record.tokens,
        "draft_vocab_size": record.draft_vocab_size,
        "source": record.source,
    }


def write_metadata_file(path: str | os.PathLike, record: TrainingRecord) -> Path:
    """Write ``record`` as ``training_metadata.json`` (atomically). ``path`` may be a
    folder (the file goes inside it). Returns the file's path."""
    p = Path(path)
    if p.is_dir():
        p = p / METADATA_FILE
    text = json.dumps(metadata_dict(record), indent=2, allow_nan=False) + "\n"
    try:
        atomic_write_text(p, text)
    except OSError as e:
        raise WriteError(f"{p}: cannot write training metadata: {e.strerror or e}") from e
    return p


# --------------------------------------------------------------------------- user


def from_user(ids: str, captured_at: str, num_layers: int | None = None) -> TrainingRecord:
    """``--trained-on 3,31,59 --captured-at input``: the user's own word.

    ``captured_at="input"``: id ``i`` is the input of layer ``i`` = the output of
    layer ``i-1`` (0 = the embedding output; ``N`` = the last layer's output, as
    vLLM reads it). ``captured_at="output"``: id ``i`` is the output of layer ``i``
    (-1 = the embedding output).
    """
    key = str(captured_at).strip().lower()
    if key not in ("input", "output"):
        raise UsageError(f"--captured-at must be 'input' or 'output', got '{captured_at}'")
    raw = parse_ids(ids)
    if not raw:
        raise UsageError("--trained-on needs at least one layer id, e.g. --trained-on 3,31,59")
    layers = to_refs(raw, key, num_layers)
    return make_record(layers, f"--trained-on {','.join(map(str, raw))} --captured-at {key}",
                   convention=key, raw_ids=raw, kind="user")


# --------------------------------------------------------------------------- all of them


def find_training_record(
    checkpoint_root: str | os.PathLike | None,
    index_extras: Mapping | None,
    config: Mapping | None,
    *,
    dumps: str | os.PathLike | None = None,
) -> list[TrainingRecord]:
    """Every training record available, most authoritative first: eagle3conv's
    ``training_metadata.json`` beside the checkpoint, SpecForge provenance, SpecForge
    args (when they name other layers), the config, and ``dumps`` when given."""
    found: list[TrainingRecord] = []
    if checkpoint_root is not None:
        root = Path(checkpoint_root)
        if root.is_file():
            root = root.parent
        rec = from_metadata_file(root) if root.is_dir() else None
        if rec is not None:
            found.append(rec)
    if index_extras:
        prov = _from_provenance(index_extras)
        args = _from_args(index_extras)
        if prov is not None:
            found.append(prov)
        if args is not None and (prov is None or prov.layers != args.layers):
            found.append(args)
    rec = from_config(config)
    if rec is not None:
        found.append(rec)
    if dumps is not None:
        rec = from_dump_manifest(dumps)
        if rec is not None:
            found.append(rec)
    return found
