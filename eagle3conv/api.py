"""The library's front door: every command's operation, each returning a result object.

The CLI is a thin layer over these; a Python user gets the same behaviour::

    from eagle3conv import fix_keys
    result = fix_keys("ckpt/", out="ckpt-sglang/")
    print(result.plan.format.name, result.written.files)

``configure`` writes (or checks) the aux-layer wiring of a fixed drafter; ``launch`` and
``check_launch`` print or judge its launch lines; ``capture`` saves a target's hidden states,
``verify`` scores the drafter on them and ``smoke`` runs its forward on random inputs (``verify``
and ``smoke`` are :mod:`eagle3conv.verify`'s, re-exported here); ``push`` is
:func:`eagle3conv.publish.push`.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3conv.io.progress import Progress
from eagle3conv.checkpoint.index import CheckpointIndex, open_checkpoint
from eagle3conv.checkpoint.links import following
from eagle3conv.checkpoint.plan import Plan, PlanOutcome, PlanVerdict, WiringOutcome, build_plan, load_config_file
from eagle3conv.checkpoint.writer import (
    WriteResult,
    parse_size,
    plan_shards,
    prepared,
    write_in_place,
    write_out,
)
from eagle3conv.errors import Eagle3ConvError, InvalidCheckpointError, UsageError, WiringError
from eagle3conv.findings import AUDIT_D2T_MISSING, AUX_LAYERS, EVIDENCE_NOTE, NO_D2T, Finding
from eagle3conv.spec.canonical import D2T, FC, in_canonical_names
from eagle3conv.spec.engines import EngineRelease
from eagle3conv.spec.layers import LayerSet, describe
from eagle3conv.spec.targets import TargetProfile
from eagle3conv.wiring import apply as wiring
from eagle3conv.wiring.apply import WiringOptions
from eagle3conv.checkpoint.options import FixOptions

if TYPE_CHECKING:  # the launch result's parts (imported where launch lines are made: the CLI loads fast)
    from eagle3conv.spec.launch import LaunchLine
    from eagle3conv.spec.launch_check import LaunchCheck


@dataclass
class InspectResult:
    index: CheckpointIndex
    plan: Plan | None
    plan_error: Exception | None  # a plan that could not even be built (e.g. no config)
    recovered: str | None

    def verdict(self) -> PlanVerdict:
        """What fix-keys would do to this checkpoint (or that it cannot plan it)."""
        return self.plan.verdict() if self.plan is not None else PlanVerdict(PlanOutcome.CANNOT_PLAN, 1)

    def shards(self) -> list:
        """The files fix-keys would write (like the source's) and each one's outputs; none without a plan."""
        return [] if self.plan is None else plan_shards(self.plan)

    def config_summary(self) -> dict | None:
        """The config's fields inspect shows (None: the checkpoint has no config)."""
        return _config_summary(self.index.config)

    def to_dict(self) -> dict:
        idx = self.index
        d = {
            "checkpoint": str(idx.root),
            "layout": idx.layout,
            "weight_files": [str(p) for p in idx.weight_files],
            "wrapper": idx.wrapper,
            "tensors": [
                {"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "bytes": t.nbytes}
                for t in sorted(idx.tensors.values(), key=lambda t: t.name)
            ],
            "total_bytes": idx.total_bytes,
            "config": self.config_summary(),
            "other_files": [p.name for p in idx.other_files],
            "recovered": self.recovered,
            "verdict": self.verdict().to_dict(),
        }
        if self.plan is not None:
            d["plan"] = self.plan.to_dict()
            d["plan"]["shards"] = [{"file": f, "tensors": [o.name for o in outs]} for f, outs in self.shards()]
        if self.plan_error is not None:  # the error leads the document, as it leads the text
            d = {"plan_error": getattr(self.plan_error, "to_dict", lambda: {"message": str(self.plan_error)})(), **d}
        return d


@dataclass
class FixResult:
    plan: Plan
    mode: str  # in-place | out | dry-run
    output: Path | None
    unchanged: bool
    written: WriteResult | None
    recovered: str | None
    shards: list
    followed_symlinks: list = field(default_factory=list)  # (link, target) read through --follow-symlinks

    def verdict(self) -> PlanVerdict:
        """What fix-keys does to this checkpoint (``mode`` and ``unchanged`` say whether it wrote)."""
        return self.plan.verdict()

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "output": str(self.output) if self.output else None,
            "unchanged": self.unchanged,
            "recovered": self.recovered,
            "files": self.written.files if self.written else [],
            "bytes_written": self.written.bytes_written if self.written else 0,
            "tensors_verified": self.written.verified if self.written else 0,
            "shards": [{"file": f, "tensors": [o.name for o in outs]} for f, outs in self.shards],
            "plan": self.plan.to_dict(),
            "followed_symlinks": [{"path": a, "target": b} for a, b in self.followed_symlinks],
            "verdict": self.verdict().to_dict(),
        }


def _config_summary(cfg: dict | None) -> dict | None:
    if cfg is None:
        return None
    keys = (
        "architectures", "model_type", "hidden_size", "target_hidden_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
        "draft_vocab_size", "rope_theta", "rope_scaling", "tie_word_embeddings", "torch_dtype",
        "speculators_model_type",
    )
    from eagle3conv.spec.drafter import AUX_KEY, aux_ids

    out = {k: cfg[k] for k in keys if k in cfg}
    if isinstance(cfg.get("eagle_config"), dict):
        out["eagle_config"] = cfg["eagle_config"]
    if aux_ids(cfg).top_level is not None:
        out[AUX_KEY] = aux_ids(cfg).top_level
    return out


def _in_hf_cache(root: Path) -> bool:
    return root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--")


def _wired(plan: Plan, opts: WiringOptions, ckpt: str, served: str | None = None) -> Plan:
    """The plan with the trained aux layers written into its config (for every engine release) and
    the wiring check's errors, warnings and notices (:meth:`Plan.with_wiring`); ``served``: the folder
    the launch lines name (fix-keys' output; default the checkpoint's)."""
    fc = next((o for o in plan.outputs if o.name == FC), None)
    fc_in = int(fc.shape[1]) if fc is not None and len(fc.shape) == 2 else None
    if fc_in is not None and plan.quantization is not None and fc.dequant is None and fc.source in plan.index.tensors:
        from eagle3conv.checkpoint.quantized import logical_columns

        fc_in = logical_columns(plan.index, plan.index.tensors[fc.source], plan.config)  # a packed FP4 fc holds two per byte
    t = plan.symbols.get("T") or plan.symbols.get("H")
    ev = wiring.gather(plan.index.root, plan.index.extras, plan.index.config, opts, plan.format)
    flags = replace(opts, rewire=False).flags("fix-keys")
    fix = f"eagle3conv fix-keys {ckpt}{' ' + flags if flags else ''} --rewire"
    outs = {o.name: o for o in plan.outputs}
    d2t = outs.get(D2T)
    said = frozenset({AUDIT_D2T_MISSING} if NO_D2T in {f.code for f in plan.findings} else ())  # the vocab check
    w = wiring.wire(plan.config, ev, opts, fc_in=fc_in, target_hidden=t,  # named the missing d2t: no second message
                    source_format=plan.format.name, fix_command=fix, tensor_names=set(outs),
                    read_d2t=None if d2t is None else (
                        lambda: d2t.data if d2t.data is not None else plan.index.read_array(d2t.source)), said=said)
    config, edits, hint = None, (), None
    if w.conflicts:
        found = list(w.conflicts)
        hint = f"the training record is what the drafter learned from; to write its layers: {fix} (or correct the record)"
    else:
        if w.edits is not None:
            config, edits = w.config, tuple(w.edits.config_edits)
        found = list(w.report.errors)
        hint = next((f.fix for f in found if f.fix), None)
    found += w.report.warnings + [Finding("notice", AUX_LAYERS, EVIDENCE_NOTE, n) for n in ev.notes]
    return plan.with_wiring(WiringOutcome(config, edits, tuple(found), hint, w, record_known=w.report.layers is not None,
                                          served=served or str(plan.index.root)))


def _plan(index: CheckpointIndex, *, source_format: str | None, config: str | Path | None, keep_embed: bool,
          dtype: str | None, later_norm: str | None = None, wiring_options: WiringOptions | None = None,
          dequantize: tuple[str, ...] = ()) -> Plan:
    return build_plan(index, source_format=source_format, config_override=load_config_file(config) if config else None,
                      keep_embed=keep_embed, dtype=dtype, later_norm=later_norm,
                      releases=(wiring_options or WiringOptions()).releases(), dequantize=dequantize)


def inspect(path: str | Path, options: FixOptions | None = None, *, wiring_options: WiringOptions | None = None,
            **fields) -> InspectResult:
    """Index a checkpoint and plan its fix without writing anything but a crash recovery.

    ``options`` (or its fields as keywords: ``source_format``, ``config``, ``keep_embed``, ``dtype``,
    ``later_norm``) say how to plan, as for :func:`fix_keys`."""
    o = replace(options or FixOptions(), **fields)
    with prepared(path, "inspect", write=False) as recovered:
        return _inspect(path, recovered, source_format=o.source_format, config=o.config, keep_embed=o.keep_embed,
                        dtype=o.dtype, wiring_options=wiring_options, later_norm=o.later_norm)


def _inspect(path, recovered: str | None, *, source_format, config, keep_embed, dtype,
             wiring_options, later_norm=None) -> InspectResult:
    p = Path(path)
    index = open_checkpoint(p)
    plan, err = None, None
    try:
        plan = _plan(index, source_format=source_format, config=config, keep_embed=keep_embed, dtype=dtype,
                     later_norm=later_norm, wiring_options=wiring_options)
        plan = _wired(plan, wiring_options or WiringOptions(), str(path)).judged()
    except Eagle3ConvError as e:  # inspect shows why planning failed, and no plan half-made (unwired)
        plan, err = None, e
    return InspectResult(index, plan, err, recovered)


def fix_keys(path: str | Path, options: FixOptions | None = None, *, progress: Progress | None = None,
             wiring_options: WiringOptions | None = None, **fields) -> FixResult:
    """Rename a drafter checkpoint to the names SGLang loads, strictly, and prove the result.

    ``options`` (or its fields as keywords: ``fix_keys(d, out=o, dtype="bf16")``) say how
    (:class:`~eagle3conv.checkpoint.options.FixOptions`); in place unless ``out`` is given.
    A file of the folder that is a symlink leaving it is refused
    (:class:`eagle3conv.checkpoint.links.UnsafeLinkError`) unless ``follow_symlinks``;
    then it is read through the link and listed in ``FixResult.followed_symlinks``.
    """
    o = replace(options or FixOptions(), **fields)
    with following() if o.follow_symlinks else nullcontext() as followed:
        result = _fix_keys_locked(path, out=o.out, source_format=o.source_format, config=o.config,
                                  keep_embed=o.keep_embed, dtype=o.dtype, max_shard_size=o.max_shard_size,
                                  dry_run=o.dry_run, progress=progress, wiring_options=wiring_options,
                                  later_norm=o.later_norm, accept_journal=o.accept_journal,
                                  dequantize=tuple(o.dequantize))
    result.followed_symlinks = list(followed or [])
    return result


def _fix_keys_locked(
    path: str | Path,
    *,
    out: str | Path | None = None,
    source_format: str | None = None,
    config: str | Path | None = None,
    keep_embed: bool = False,
    dtype: str | None = None,
    max_shard_size: str | int | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
    wiring_options: WiringOptions | None = None,
    later_norm: str | None = None,
    accept_journal: bool = False,
    dequantize: tuple[str, ...] = (),
) -> FixResult:
    """Rename a drafter checkpoint to the names SGLang loads, strictly, and prove the result.

    In place unless ``out`` is given. Raises :class:`InvalidCheckpointError`
    (exit 3) listing every unmapped, missing or colliding key; nothing is written then.
    ``accept_journal``: finish an interrupted in-place write from a journal whose signature
    cannot be checked (the user's own, after its key changed), after every other check.
    """
    in_place = out is None and not dry_run
    command = "fix-keys" + (" --dry-run" if dry_run else " --out" if out is not None else "")
    with prepared(path, command, write=in_place, accept_journal=accept_journal) as recovered:
        return _fix_keys(path, recovered, out=out, source_format=source_format, config=config,
                         keep_embed=keep_embed, dtype=dtype, max_shard_size=max_shard_size, dry_run=dry_run,
                         progress=progress, wiring_options=wiring_options, later_norm=later_norm,
                         dequantize=tuple(dequantize))


def _fix_keys(path, recovered: str | None, *, out, source_format, config, keep_embed, dtype, max_shard_size,
              dry_run, progress, wiring_options, later_norm=None, dequantize=()) -> FixResult:
    p = Path(path)
    index = open_checkpoint(p)
    plan = _wired(_plan(index, source_format=source_format, config=config, keep_embed=keep_embed, dtype=dtype,
                        later_norm=later_norm, wiring_options=wiring_options, dequantize=dequantize),
                  wiring_options or WiringOptions(), str(path), str(out) if out else None)
    errs = [f for f in plan.findings if f.level == "error"]
    if errs and all(f.area == AUX_LAYERS for f in errs):
        first, *rest = (f.message for f in errs)
        raise WiringError(f"{index.root}: {first}; nothing was written", details=rest, hint=plan.wiring and plan.wiring.hint)
    plan.raise_for_errors()
    size = parse_size(max_shard_size) if isinstance(max_shard_size, str) else max_shard_size
    shards = plan_shards(plan, size)
    if dry_run:
        return FixResult(plan, "dry-run", Path(out) if out else index.root, plan.is_identity() and out is None, None, None, shards)
    if out is not None:
        result = write_out(plan, Path(out), max_shard_size=size, progress=progress)
        return FixResult(plan, "out", Path(out), False, result, recovered, shards)
    if plan.is_identity() and size is None:
        return FixResult(plan, "in-place", index.root, True, None, recovered, shards)
    if plan.format.extracts:
        dropped = sum(1 for d in plan.decisions if d.action == "dropped")
        raise UsageError(
            f"{index.root}: a whole-model {plan.format.name} checkpoint; fixing it in place would delete "
            f"{dropped} base-model tensors",
            hint=f"write the drafter to a new folder: eagle3conv fix-keys {path} --out DIR",
        )
    if _in_hf_cache(index.root):
        raise UsageError(
            f"{index.root}: a Hugging Face cache snapshot; eagle3conv does not rewrite the cache",
            hint=f"eagle3conv fix-keys {path} --out DIR",
        )
    if index.root != p and p.is_file() and len(index.weight_files) == 1 and p.name != index.weight_files[0].name:
        raise UsageError(f"{p}: unexpected file")
    result = write_in_place(plan, max_shard_size=size, progress=progress)
    return FixResult(plan, "in-place", index.root, False, result, recovered, shards)


class ConfigOutcome(str, Enum):
    """What ``config`` did (or, with ``--check``, found): :class:`ConfigVerdict`'s code."""

    PASSED = "passed"  # --check: no error
    FAILED = "failed"  # --check: errors
    REFUSED = "refused"  # the config's ids contradict the training record: nothing written
    ALREADY_WIRED = "already-wired"  # the record's layers are already written: no changes
    WROTE = "wrote"  # the record's layers written into config.json (with --dry-run: would be)
    NO_RECORD = "no-record"  # no training record names the layers: nothing to write


@dataclass(frozen=True)
class ConfigVerdict:
    """``config``'s verdict in codes and values (the text's first line and ``--json``'s ``verdict``):
    ``layers``, the wiring written (described); ``except_releases``, the releases checked that read
    the written field otherwise, so one id list cannot serve them as trained (see their rows)."""

    outcome: ConfigOutcome
    mode: str
    errors: int
    warnings: int
    layers: str | None = None
    except_releases: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.outcome is not ConfigOutcome.FAILED

    def to_dict(self) -> dict:
        return {"outcome": self.outcome.value, "ok": self.ok, "errors": self.errors, "warnings": self.warnings,
                "layers": self.layers, "except_releases": list(self.except_releases)}


@dataclass
class ConfigResult:
    checkpoint: Path
    mode: str  # check | write | dry-run
    wiring: wiring.Wiring
    evidence: wiring.Evidence
    written: list[str]
    config_before: dict
    recovered: str | None

    def verdict(self) -> ConfigVerdict:
        """What ``config`` did, or with ``--check`` found (codes and counts; render says it)."""
        w, rep = self.wiring, self.wiring.report
        counts = dict(mode=self.mode, errors=len(rep.errors), warnings=len(rep.warnings))
        edits = w.edits
        layers = None if edits is None else describe(edits.layers)
        if self.mode == "check":
            return ConfigVerdict(ConfigOutcome.PASSED if rep.ok else ConfigOutcome.FAILED, **counts)
        if w.conflicts:
            return ConfigVerdict(ConfigOutcome.REFUSED, **counts)
        if edits is not None and not edits.config_edits:
            return ConfigVerdict(ConfigOutcome.ALREADY_WIRED, layers=layers, **counts)
        if edits is not None:
            # releases that read the same field otherwise (one id list cannot serve both numberings)
            miss = tuple(str(r.release) for r in rep.rows if r.as_trained is False)
            return ConfigVerdict(ConfigOutcome.WROTE, layers=layers, except_releases=miss, **counts)
        return ConfigVerdict(ConfigOutcome.NO_RECORD, **counts)

    def to_dict(self) -> dict:
        ev = self.evidence
        return {
            "checkpoint": str(self.checkpoint),
            "mode": self.mode,
            "target": None if ev.target is None else {
                "name": ev.target.name, "num_hidden_layers": ev.target.num_hidden_layers,
                "hidden_size": ev.target.hidden_size, "hf_repo": ev.target.hf_repo},
            "records": [{"source": r.source, "described": r.describe(),
                         "layers": None if r.layers is None else [{"output_of": x.output_of} for x in r.layers]}
                        for r in ev.records],
            "wiring": self.wiring.to_dict(str(self.checkpoint)),
            "written": self.written,
            "recovered": self.recovered,
            "verdict": self.verdict().to_dict(),
        }


def configure(path: str | Path, *, options: WiringOptions | None = None, check: bool = False,
              dry_run: bool = False, write_metadata: bool = True) -> ConfigResult:
    """Write (or with ``check``, only check) the aux-layer wiring of a fixed drafter.

    The layers come from the most authoritative training record (the user's
    flags, ``--metadata``, ``training_metadata.json``, eagle3conv's provenance,
    SpecForge's, the config's own ids in a known numbering). Writes config.json
    (nested SGLang ids, top-level vLLM ids, the provenance block) atomically, and
    ``training_metadata.json`` when there is none. Raises :class:`WiringError`
    (exit 3) when the check fails; nothing is written then.
    """
    command = "config" + (" --check" if check else " --dry-run" if dry_run else "")
    with prepared(path, command, write=not (check or dry_run)) as recovered:
        return _configure(path, recovered, options=options, check=check, dry_run=dry_run,
                          write_metadata=write_metadata)


def _configure(path, recovered: str | None, *, options, check, dry_run, write_metadata) -> ConfigResult:
    from eagle3conv.checkpoint.writer import count_step
    from eagle3conv.io.files import atomic_write_json
    from eagle3conv.wiring.metadata import METADATA_FILE, TrainingRecord, write_metadata_file

    p = Path(path)
    opts = options or WiringOptions()
    index = open_checkpoint(p)
    root = index.root
    if index.config is None:
        raise UsageError(f"{root}: no config.json", hint=f"eagle3conv fix-keys {path} writes a loadable one")
    if not (check or dry_run) and os.path.lexists(root / ".config.json.eagle3conv-tmp"):
        (root / ".config.json.eagle3conv-tmp").unlink()  # left by a killed run of an older version
    plan = build_plan(index, releases=opts.releases())
    if plan.layer_count is not None:  # no engine serves the folder as it is; fix-keys rewrites the count
        raise InvalidCheckpointError(f"{root}: {plan.layer_count.message}", hint=plan.layer_count.fix)
    canonical = in_canonical_names(index.config, index.tensors)
    if canonical and not plan.ok:
        plan.raise_for_errors()  # shapes or vocab maps disagree with the config: exit 3, named
    if not canonical and check:
        return _check_unconverted(path, root, plan, opts, recovered)
    if not canonical:
        raise UsageError(
            f"{root}: not yet in SGLang's layout ({plan.format.name} format); "
            "config edits a fixed drafter's config.json",
            hint=f"eagle3conv fix-keys {path} {opts.flags('fix-keys')} (it takes the same wiring options)".replace("  ", " "))
    fc_in = wiring.fc_width(index.tensors)
    if fc_in is not None:
        from eagle3conv.checkpoint.quantized import logical_columns

        fc_in = logical_columns(index, index.tensors[FC], index.config)  # a packed NVFP4 fc: two per byte
    t = plan.symbols.get("T") or plan.symbols.get("H")
    ev = wiring.gather(root, index.extras, index.config, opts)
    flags = opts.flags("config")
    fix = f"eagle3conv config {path}{' ' + flags if flags else ''}"
    kw = dict(fc_in=fc_in, target_hidden=t, source_format="sglang", fix_command=fix)
    if check:
        w = wiring.check_fixed(index.config, index.tensors, opts, ev=ev, path=path,
                               read_d2t=lambda: index.read_array(D2T), **kw)
        return ConfigResult(root, "check", w, ev, [], index.config, recovered)
    if ev.truth is None:
        raise UsageError(
            f"{root}: no training record names the layers this drafter was trained on",
            hint="give them: --trained-on 3,31,59 --captured-at input (or output), --metadata FILE, or --dumps DIR",
        )
    w = wiring.wire(index.config, ev, opts, force_write=True, tensor_names=set(index.tensors),
                    read_d2t=lambda: index.read_array(D2T), **kw)
    if w.report.errors:
        first, *rest = w.report.errors
        raise WiringError(f"{root}: {first.message}; nothing was written", details=[f.message for f in rest],
                          hint=first.fix if first.fix != fix else None)
    written: list[str] = []
    if not dry_run:
        # config.json first: it carries the provenance block, so a kill before the metadata
        # file is written leaves a complete, self-describing config
        truth = ev.truth
        if w.config != index.config:
            try:
                keep_mode = (root / "config.json").stat().st_mode & 0o7777
                atomic_write_json(root / "config.json", w.config, mode=keep_mode, before_replace=count_step)
            except OSError as e:
                from eagle3conv.errors import WriteError

                raise WriteError(f"{root / 'config.json'}: cannot write: {e.strerror or e}") from e
            written.append("config.json")
        if write_metadata and not (root / METADATA_FILE).exists():
            rec = TrainingRecord(**{**truth.__dict__, "target": truth.target or (
                ev.target.hf_repo or ev.target.name if ev.target else None)})
            write_metadata_file(root, rec)
            written.append(METADATA_FILE)
    return ConfigResult(root, "dry-run" if dry_run else "write", w, ev, written, index.config, recovered)


def _check_unconverted(path, root: Path, plan: Plan, opts: WiringOptions, recovered: str | None) -> ConfigResult:
    """``config --check`` on a checkpoint not yet in SGLang's names: the check runs on what ``fix-keys`` would
    write (the plan's config and tensor names, the trainer's numbering of its ids); nothing is written."""
    index = plan.index
    outputs = {o.name: o for o in plan.outputs}
    fc = outputs.get(FC)
    fc_in = int(fc.shape[1]) if fc is not None and len(fc.shape) == 2 else None
    t = plan.symbols.get("T") or plan.symbols.get("H")
    ev = wiring.gather(root, index.extras, plan.config, opts, plan.format)
    flags = opts.flags("fix-keys")
    fix = f"eagle3conv fix-keys {path}{' ' + flags if flags else ''}"
    read_d2t = (lambda: outputs[D2T].data if outputs[D2T].data is not None else index.read_array(
        outputs[D2T].source)) if D2T in outputs else None
    note = Finding("notice", AUX_LAYERS, EVIDENCE_NOTE,
                   f"{root} is not yet in SGLang's names ({plan.format.name} format): checked as fix-keys would "
                   "write it (its config and tensor names); nothing was written", fix)
    w = wiring.check_fixed(plan.config, outputs, opts, ev=ev, path=path, read_d2t=read_d2t, fc_in=fc_in,
                           target_hidden=t, source_format=plan.format.name, fix_command=fix, before=(note,),
                           extra=[f for f in plan.findings if f.level == "error"])  # what fix-keys would refuse
    return ConfigResult(root, "check", w, ev, [], index.config, recovered)


class DefaultsOutcome(str, Enum):
    """What a target's engine releases checked by default capture from a config that names no layers
    (:class:`TargetVerdict`'s code)."""

    ALIKE = "alike"  # every release captures the same layers with its default ids
    DIFFER = "differ"  # they capture different layers: a drafter's config must name its layers
    CANNOT = "cannot"  # a release cannot capture with its default ids (its entry's error says why)


_WORST = (DefaultsOutcome.ALIKE, DefaultsOutcome.DIFFER, DefaultsOutcome.CANNOT)


@dataclass(frozen=True)
class DefaultCapture:
    """What one engine release captures from a config that names no aux layers, on one target."""

    release: EngineRelease
    ids: tuple[int, ...] | None
    layers: LayerSet | None  # None: it cannot capture (``error`` says why)
    error: Finding | None

    def to_dict(self) -> dict:
        rel = self.release
        return {"engine": rel.spec, "release": str(rel), "default_ids": None if self.ids is None else list(self.ids),
                "captures": None if self.layers is None else describe(self.layers),
                "layers": None if self.layers is None else [r.output_of for r in self.layers],
                "error": None if self.error is None else self.error.message}


@dataclass(frozen=True)
class TargetVerdict:
    """``targets``' verdict on one target, in codes and values: whether the releases checked by default
    capture alike with their default ids; ``layer_sets``, the distinct sets they capture (output-of ids,
    ascending); ``cannot``, the releases whose default cannot capture."""

    outcome: DefaultsOutcome
    layer_sets: tuple[tuple[int, ...], ...]
    cannot: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"outcome": self.outcome.value, "layer_sets": [list(x) for x in self.layer_sets],
                "cannot": list(self.cannot)}


@dataclass(frozen=True)
class TargetSummary:
    """A target profile as `eagle3conv targets` shows it: its numbers, and what each engine release
    checked by default captures with no ids (``defaults``); ``detail``: with its sources."""

    profile: TargetProfile
    defaults: tuple[DefaultCapture, ...]
    detail: bool = False

    def verdict(self) -> TargetVerdict:
        sets = tuple(sorted({tuple(r.output_of for r in d.layers) for d in self.defaults if d.layers}))
        cannot = tuple(str(d.release) for d in self.defaults if d.layers is None)
        outcome = (DefaultsOutcome.CANNOT if cannot else DefaultsOutcome.DIFFER if len(sets) > 1
                   else DefaultsOutcome.ALIKE)
        return TargetVerdict(outcome, sets, cannot)

    def to_dict(self) -> dict:
        p = self.profile
        d = {
            "name": p.name, "aliases": list(p.aliases), "hf_repo": p.hf_repo, "architectures": list(p.architectures),
            "hidden_size": p.hidden_size, "num_hidden_layers": p.num_hidden_layers, "vocab_size": p.vocab_size,
            "num_attention_heads": p.num_attention_heads, "num_key_value_heads": p.num_key_value_heads,
            "head_dim": p.head_dim, "intermediate_size": p.intermediate_size, "family": p.family,
            "description": p.description,
        }
        d["default_aux_layers"] = [c.to_dict() for c in self.defaults]
        if self.detail:
            d["sources"] = dict(p.sources)
        d["verdict"] = self.verdict().to_dict()
        return d


@dataclass(frozen=True)
class TargetsVerdict:
    """``targets``' verdict over the targets shown: the worst of theirs, and the targets of each other outcome."""

    outcome: DefaultsOutcome
    targets: int
    differ: tuple[str, ...] = ()
    cannot: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"outcome": self.outcome.value, "targets": self.targets, "differ": list(self.differ),
                "cannot": list(self.cannot)}


@dataclass(frozen=True)
class TargetsResult:
    """``eagle3conv targets [NAME]``: the profiles shown, each a :class:`TargetSummary`."""

    targets: tuple[TargetSummary, ...]
    detail: bool = False

    def verdict(self) -> TargetsVerdict:
        by = [(t.profile.name, t.verdict().outcome) for t in self.targets]
        worst = max((o for _, o in by), key=_WORST.index, default=DefaultsOutcome.ALIKE)
        return TargetsVerdict(worst, len(by), tuple(n for n, o in by if o is DefaultsOutcome.DIFFER),
                              tuple(n for n, o in by if o is DefaultsOutcome.CANNOT))

    def to_dict(self) -> dict:
        return {"targets": [t.to_dict() for t in self.targets], "verdict": self.verdict().to_dict()}


def target_summary(profile, *, detail: bool = False) -> TargetSummary:
    """A target profile as `eagle3conv targets` shows it: its numbers, and what each engine release
    checked by default captures with no ids (the engine rules, for its family)."""
    from eagle3conv.spec.engines import default_capture, default_engines

    defaults = []
    for rel in default_engines():
        cap = default_capture(rel, profile.family, profile.num_hidden_layers)
        defaults.append(DefaultCapture(rel, None if cap.ids is None else tuple(cap.ids), cap.layers, cap.error))
    return TargetSummary(profile, tuple(defaults), detail)


class ListOutcome(str, Enum):
    """The verdict of a command that decides nothing about the user's files: it lists what eagle3conv
    knows (``formats``); the data were validated when read (a malformed file is an error, not a verdict)."""

    LISTED = "listed"


@dataclass(frozen=True)
class FormatsVerdict:
    """``formats``' verdict: it decides nothing (``LISTED``); ``formats``, how many it lists."""

    outcome: ListOutcome
    formats: int

    def to_dict(self) -> dict:
        return {"outcome": self.outcome.value, "formats": self.formats}


@dataclass(frozen=True)
class FormatsResult:
    """``eagle3conv formats``: the source formats fix-keys understands (``load_formats()``), highest
    detection priority first, each with the rules every format shares (``common``)."""

    formats: tuple  # spec.formats.Format
    common: object  # spec.formats.Format: the rules every format applies too

    @classmethod
    def of(cls, loaded) -> FormatsResult:
        formats, common = loaded
        return cls(tuple(sorted(formats.values(), key=lambda f: -f.priority)), common)

    def verdict(self) -> FormatsVerdict:
        return FormatsVerdict(ListOutcome.LISTED, len(self.formats))

    def to_dict(self) -> dict:
        data = [
            {
                "name": f.name,
                "title": f.title,
                "priority": f.priority,
                "rules": [{"rule": r.describe(), "why": r.why} for r in f.rules + self.common.rules],
                "aux_ids_numbering": f.aux_numbering,
                "later_layer_norm": f.later_layer_norm,
                "config_set": [{"field": c.field, "value": c.value, "why": c.why} for c in f.config_set],
                "findings": [{"level": x.level, "code": x.code, "message": x.message} for x in f.findings],
                "record": None if f.record is None else {"file": f.record.file, "field": f.record.field,
                                                         "numbering": f.record.numbering, "why": f.record.why},
            }
            for f in self.formats
        ]
        return {"formats": data, "verdict": self.verdict().to_dict()}


class ExampleOutcome(str, Enum):
    """``example``'s verdict code: it decides nothing about the user's files, it writes the example drafter
    asked for (an unknown format or an unwritable folder is an error, not a verdict)."""

    WROTE = "wrote"


@dataclass(frozen=True)
class ExampleVerdict:
    """``example``'s verdict: ``WROTE``, the drafter's ``format`` and the folder ``path`` it wrote."""

    outcome: ExampleOutcome
    format: str
    path: str

    def to_dict(self) -> dict:
        return {"outcome": self.outcome.value, "format": self.format, "path": self.path}


@dataclass(frozen=True)
class ExampleResult:
    """``eagle3conv example``: the example drafter written (:func:`eagle3conv.example.write_example`'s folder)."""

    path: Path
    format: str

    def verdict(self) -> ExampleVerdict:
        return ExampleVerdict(ExampleOutcome.WROTE, self.format, str(self.path))

    def to_dict(self) -> dict:
        return {"path": str(self.path), "format": self.format, "verdict": self.verdict().to_dict()}


# --------------------------------------------------------------------------- launch lines


class LaunchOutcome(str, Enum):
    """What ``launch`` found: :class:`LaunchVerdict`'s code."""

    SERVED = "served"  # every release asked has a launch line
    CANNOT_SERVE = "cannot-serve"  # some release cannot serve the drafter (``cannot`` names them): no line
    CHECK_PASSED = "check-passed"  # --check: the user's line has no error (warnings perhaps)
    CHECK_FAILED = "check-failed"  # --check: the user's line has errors (``errors``: their codes); exit 3


@dataclass(frozen=True)
class LaunchVerdict:
    """``launch``'s verdict in codes and values (the text's first line, ``--json``'s ``verdict``):
    ``releases``, the rows; ``cannot``, the releases among them with no line; with ``--check``,
    ``checked``, the release the user's line was judged for, and its findings' ``errors`` (their codes,
    in order) and ``warnings`` (how many)."""

    outcome: LaunchOutcome
    releases: int
    cannot: tuple[str, ...] = ()
    checked: str | None = None
    errors: tuple[str, ...] = ()
    warnings: int = 0

    @property
    def ok(self) -> bool:
        return self.outcome is not LaunchOutcome.CHECK_FAILED

    def to_dict(self) -> dict:
        return {"outcome": self.outcome.value, "ok": self.ok, "releases": self.releases, "cannot": list(self.cannot),
                "checked": self.checked, "errors": list(self.errors), "warnings": self.warnings}


@dataclass
class LaunchResult:
    """``eagle3conv launch``: one launch line per engine release (or why it cannot serve the drafter),
    and, with ``check``, the user's own line judged (:class:`eagle3conv.spec.launch_check.LaunchCheck`)."""

    checkpoint: Path
    target: str | None
    rows: list[LaunchLine]  # one per release asked (default: each engine's default releases)
    check: LaunchCheck | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.verdict().ok

    def verdict(self) -> LaunchVerdict:
        """Whether every release serves the drafter, or (with ``check``) whether the user's line passed."""
        rows = dict(releases=len(self.rows), cannot=tuple(str(r.release) for r in self.rows if r.text is None))
        c = self.check
        if c is None:
            return LaunchVerdict(LaunchOutcome.CANNOT_SERVE if rows["cannot"] else LaunchOutcome.SERVED, **rows)
        errors = tuple(f.code for f in c.findings if f.level == "error")
        return LaunchVerdict(LaunchOutcome.CHECK_FAILED if errors else LaunchOutcome.CHECK_PASSED, **rows,
                             checked=str(c.release), errors=errors,
                             warnings=sum(f.level == "warning" for f in c.findings))

    def to_dict(self) -> dict:
        return {"checkpoint": str(self.checkpoint), "target": self.target, "ok": self.ok,
                "rows": [r.to_dict() for r in self.rows],
                "check": None if self.check is None else self.check.to_dict(), "notes": self.notes,
                "verdict": self.verdict().to_dict()}


def _launch_inputs(path: str | Path, opts: WiringOptions):
    """The drafter's config, tensor names, evidence (target, trained layers) for its launch lines."""
    index = open_checkpoint(Path(path))
    if index.config is None:
        raise UsageError(f"{index.root}: no config.json", hint=f"eagle3conv fix-keys {path} writes a loadable one")
    try:
        ev = wiring.gather(index.root, index.extras, index.config, opts)
    except Eagle3ConvError:
        ev = wiring.Evidence([], None, wiring.resolve_target(opts.target))  # the lines need no record
    return index, ev


def launch(path: str | Path, *, options: WiringOptions | None = None, tp: int | None = None,
           check: str | None = None, drafter: str | None = None) -> LaunchResult:
    """The launch line of each engine release for the drafter at ``path`` (``options.target``, ``--engine``;
    ``drafter``: the path or repo the line names, default ``path``), from the one builder
    (:func:`eagle3conv.spec.launch.build_line`); with ``check``, the user's own launch line (an SGLang or
    ``vllm serve`` command, or vLLM's ``--speculative-config`` JSON) judged for its release."""
    from eagle3conv.checkpoint.quantized import hf_quant_of
    from eagle3conv.spec.launch import build_line, trtllm_capture_ids

    opts = options or WiringOptions()
    if tp is not None and tp < 1:
        raise UsageError(f"--tp {tp}: give a positive number of GPUs")
    index, ev = _launch_inputs(path, opts)
    target = ev.target.hf_repo or ev.target.name if ev.target else opts.target
    trained = ev.truth.layers if ev.truth is not None else None
    trt = None if ev.target is None else trtllm_capture_ids(ev.target.family, ev.target.num_hidden_layers, trained)
    name = drafter or str(path)
    names = set(index.tensors)
    hf_quant = hf_quant_of(index)
    checked = None if check is None else _judged(check, index, ev, opts, drafter=name, hf_quant=hf_quant)
    releases = opts.releases() if checked is None else (checked.release,)  # with --check: the line it should be
    target = target or (checked.target if checked is not None else None)
    if checked is not None and drafter is None and isinstance(checked.draft, str):
        name = checked.draft  # the row is the user's line as it should be: their drafter path
    rows = [build_line(rel, index.config, drafter=name, target=target, tp=tp, tensor_names=names, hf_quant=hf_quant,
                       capture_ids=trt) for rel in releases]
    notes = list(ev.notes)
    if not in_canonical_names(index.config, index.tensors):
        notes.append(f"{index.root} is not yet in SGLang's names: the engines load it only after "
                     f"`eagle3conv fix-keys {path} --out DIR`; launch DIR")
    return LaunchResult(index.root, target, rows, checked, notes=notes)


def check_launch(path: str | Path, line: str, *, options: WiringOptions | None = None):
    """The user's launch line ``line`` judged for the drafter at ``path`` (``verify --launch``, ``push --launch``):
    :meth:`launch`'s check, without the lines."""
    from eagle3conv.checkpoint.quantized import hf_quant_of

    opts = options or WiringOptions()
    index, ev = _launch_inputs(path, opts)
    return _judged(line, index, ev, opts, drafter=str(path), hf_quant=hf_quant_of(index))


def _judged(text: str, index, ev, opts: WiringOptions, *, drafter: str, hf_quant):
    """``text`` judged against the drafter (``index``), and the target of its evidence ``ev``."""
    checked = check_launch_line(text, index.config, set(index.tensors), opts, ev.target, drafter=drafter,
                                hf_quant=hf_quant)
    return checked if ev.target is None else _other_target(checked, ev.target, ev.notes, given=bool(opts.target))


def _other_target(checked, target, notes, *, given: bool):
    """``checked`` with a warning when the line's model is a Hub repo other than ``target`` (the profile the
    drafter was checked against: --target, or the one its training record names), whose context and wiring
    the findings then speak of."""
    from dataclasses import replace

    from eagle3conv.findings import LAUNCH, LAUNCH_TARGET, Finding

    line = checked.target
    names = {str(x).lower() for x in (target.name, target.hf_repo, *target.aliases) if x}
    if not line or line.lower() in names or line.count("/") != 1 or Path(line).exists():
        return checked  # the same target, or a local path (whose model cannot be told from its name)
    where = "--target" if given else next((n.removeprefix(f"target {target.name} ") for n in notes
                                           if n.startswith(f"target {target.name} taken from")), "the training record")
    rel = checked.release
    warn = Finding("warning", LAUNCH, LAUNCH_TARGET,
                   f"{rel}: the line serves {line}, but the drafter was checked for {target.name} ({where}): "
                   f"a drafter reads the hidden states of the target it was trained on (the served context is "
                   f"checked as {target.name}'s)",
                   f"serve it with {target.hf_repo or target.name}, or give --target {line} if the drafter was "
                   "trained on it", subject=rel.spec)
    return replace(checked, findings=(warn, *checked.findings))


def check_launch_line(text: str, config: dict, tensor_names, opts: WiringOptions, target=None, *,
                      drafter: str | None = None, hf_quant: dict | None = None):
    """The user's launch line ``text`` judged for the release ``--engine`` names for its engine (default: the
    newest release read), against the drafter's ``config`` and tensors and the ``target`` profile's context."""
    from eagle3conv.spec.engines import edge_release
    from eagle3conv.spec.launch import parse_line, rule_for
    from eagle3conv.spec.launch_check import check_line

    parsed = parse_line(text)
    if not rule_for(parsed.engine).option_names:
        raise UsageError(f"checking a {parsed.engine} launch line is not supported: no release of it was read (its "
                         "speculative settings live in the file --extra_llm_api_options names)",
                         hint="check an SGLang or vLLM line; `eagle3conv launch CKPT` prints the TensorRT-LLM line "
                              "and its YAML")
    asked = [r for r in opts.releases() if r.engine == parsed.engine] if opts.asked() else []
    if opts.asked() and not asked:
        raise UsageError(f"the launch line is a {parsed.engine} line, and --engine asks only for "
                         f"{', '.join(opts.asked())}", hint=f"add --engine {parsed.engine}==RELEASE, or drop --engine")
    release = asked[0] if asked else edge_release(parsed.engine, "newest")
    mpe = getattr(target, "max_position_embeddings", None) if target is not None else None
    context = (opts.max_context, "--max-context") if opts.max_context else (
        (mpe, f"{target.name}'s max_position_embeddings") if mpe else None)
    return check_line(parsed, release, config, tensor_names=tensor_names, drafter=drafter, target_context=context,
                      hf_quant=hf_quant)


# verify's operations, re-exported lazily (importing the front door stays cheap for the CLI)
_VERIFY = ("verify", "smoke", "VerifyResult", "SmokeResult")


def __getattr__(name):
    if name in _VERIFY:
        from eagle3conv.verify import run

        return getattr(run, name)
    raise AttributeError(name)


def capture(target: str | os.PathLike, prompts, out: str | os.PathLike, *, layers=None, generate: int = 0,
            max_length: int = 512, batch_size: int = 4, chat_template: bool = True, dtype: str = "bf16",
            device: str | None = None, progress: Progress | None = None, on_size=None, capture_info=None):
    """``capture`` (transformers, one device): load ``target`` offline (a model folder, a ``.gguf`` file
    or a built-in name such as ``smollm2-135m``), run it on ``prompts`` (a .txt / .jsonl file, or the
    prompts themselves) and save its hidden states to ``out``
    (:func:`eagle3conv.states.capture.capture_states`, whose keywords these are;
    ``generate`` = ``generate_tokens``). Returns the :class:`~eagle3conv.states.capture.CaptureResult`,
    with ``target_load_seconds`` set."""
    from eagle3conv.states.capture import capture_states, read_prompts
    from eagle3conv.states.target_model import load_target_model

    items = read_prompts(prompts) if isinstance(prompts, (str, os.PathLike)) else prompts
    t = load_target_model(target, device=device)
    res = capture_states(t.model, t.tokenizer, items, out, layers=layers, max_length=max_length,
                         batch_size=batch_size, generate_tokens=generate, chat_template=chat_template,
                         dtype=dtype, device=device, target=t.name, progress=progress,
                         capture_info=capture_info, on_size=on_size)
    return replace(res, target_load_seconds=t.load_seconds)
