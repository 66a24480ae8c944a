"""Gluing the wiring pieces to a checkpoint: gather evidence, wire a plan, check it.

``fix-keys``, ``inspect`` and ``config`` call :func:`gather` (every training
record, most authoritative first, and the target) and :func:`wire` (write
the trained layers into the config in every engine's numbering, or
refuse with both sides in plain words, then run :func:`~eagle3conv.wiring.check.check_wiring`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from eagle3conv.errors import UsageError
from eagle3conv.findings import AUX_LAYERS, CONFLICTS, TARGET_HIDDEN, Finding
from eagle3conv.wiring import metadata as meta
from eagle3conv.wiring.check import WiringReport, check_wiring
from eagle3conv.checkpoint.config import apply_edits
from eagle3conv.wiring.config_ids import WiringEdits, provenance_record, wiring_edits
from eagle3conv.spec.canonical import FC
from eagle3conv.wiring.options import WiringOptions
from eagle3conv.spec.layers import describe
from eagle3conv.spec.targets import TargetProfile, get_target, target_from_config


@dataclass
class Evidence:
    records: list[meta.TrainingRecord]
    config_record: meta.TrainingRecord | None
    """The record read from the config's own ids (not independent of them)."""
    target: TargetProfile | None
    notes: list[str] = field(default_factory=list)

    @property
    def truth(self) -> meta.TrainingRecord | None:
        return next((r for r in self.records if r.layers is not None), None)


def resolve_target(arg: str | None) -> TargetProfile | None:
    """``--target``: a built-in profile name/alias/repo id, or a path to a config.json or model folder."""
    if not arg:
        return None
    p = Path(arg)
    if p.exists():
        return target_from_config(p)
    return get_target(arg)


def _quiet_target(name: Any) -> TargetProfile | None:
    if not isinstance(name, str) or not name:
        return None
    try:
        return get_target(name)
    except UsageError:
        return None


def gather(root: Path | None, extras: dict | None, config: dict | None, opts: WiringOptions,
           source_format: Any = None) -> Evidence:
    """Every training record for a checkpoint, most authoritative first: the user's
    flags, ``--metadata``, ``training_metadata.json`` beside the weights, eagle3conv's
    provenance block in config.json, SpecForge provenance/args, the trainer's own record file
    (the format's ``record``), the config's own ids, ``--dumps``; when none names layers, the
    trainer's default (assumed, said so). Also the target: ``--target``, else one a record names."""
    target = resolve_target(opts.target)
    n = target.num_hidden_layers if target else None
    records: list[meta.TrainingRecord] = []
    if opts.trained_on is not None:
        if not opts.captured_at:
            raise UsageError(
                "--trained-on needs --captured-at input|output: say whether the ids are layer inputs "
                "(vLLM, dump file names: 3 = output of layer 2) or layer outputs (SpecForge, TensorRT-LLM)")
        records.append(meta.from_user(opts.trained_on, opts.captured_at, n))
    elif opts.captured_at:
        raise UsageError("--captured-at goes with --trained-on IDS")
    if opts.metadata:
        rec = meta.from_metadata_file(opts.metadata)
        if rec is None:
            raise UsageError(f"--metadata {opts.metadata}: no {meta.METADATA_FILE} there")
        records.append(rec)
    if root is not None:
        folder = root if root.is_dir() else root.parent
        rec = meta.from_metadata_file(folder)
        if rec is not None and not (opts.metadata and Path(opts.metadata).resolve() in
                                    (folder.resolve(), (folder / meta.METADATA_FILE).resolve())):
            records.append(rec)
    prov = provenance_record(config)
    if prov is not None:
        records.append(prov)
    sf = meta.from_specforge_state(extras) if extras else None
    if sf is not None:
        records.append(sf)
    record_spec = getattr(source_format, "record", None)  # where the trainer records its layers (mappings/formats)
    trainer = meta.from_trainer_file(root, record_spec, getattr(source_format, "name", ""), config)
    if trainer is not None:
        records.append(trainer)
    config_record = None if prov is not None else meta.from_config(config)
    numbering = getattr(source_format, "aux_numbering", None)
    if (config_record is not None and config_record.layers is None and config_record.raw_ids and numbering):
        # the trainer is known from the weights' names, and with it the numbering of its ids
        n_cfg = target.num_hidden_layers if target else None
        field_name = f"config.json {config_record.config_field}"
        config_record = meta.TrainingRecord(
            **{**config_record.__dict__,
               "layers": meta.decode_ids(list(config_record.raw_ids), numbering, n_cfg, field_name),
               "convention": numbering,
               "includes_embedding": None,
               "source": f"{field_name}, {numbering}-of-layer numbering ({source_format.name})"})
        config_record = meta.TrainingRecord(
            **{**config_record.__dict__,
               "includes_embedding": any(r.is_embedding for r in config_record.layers)})
    if config_record is not None:
        records.append(config_record)
    if opts.dumps:
        rec = meta.from_dump_manifest(opts.dumps)
        if rec is None:
            raise UsageError(f"--dumps {opts.dumps}: no aux_<slot>.pt files or manifest.json there")
        records.append(rec)
    if not any(r.layers is not None for r in records):  # the trainer's default, said as assumed, yields to any record
        default = meta.trainer_default(record_spec, config, getattr(source_format, "name", ""), n)
        if default is not None:
            records.append(default)
    ev = Evidence(records, config_record, target)
    if target is None:
        for rec in records:
            found = _quiet_target(rec.target)
            if found is not None:
                ev.target = found
                ev.notes.append(f"target {found.name} taken from {rec.source}")
                break
    return ev


def fc_width(tensors: Mapping, name: str = FC) -> int | None:
    t = tensors.get(name)
    shape = getattr(t, "shape", None)
    return int(shape[1]) if shape is not None and len(shape) == 2 else None


@dataclass(frozen=True)
class Wiring:
    """The outcome of wiring one config: the edits made (if any) and the final check."""

    config: dict
    edits: WiringEdits | None
    report: WiringReport
    conflicts: tuple[Finding, ...] = ()
    """The findings (codes in :data:`~eagle3conv.findings.CONFLICTS`) when the config's ids
    contradict the training record and --rewire was not given: nothing was written then."""
    tensor_names: frozenset = frozenset()  # the drafter's tensors (its launch lines read its quantized modules)

    @property
    def refused(self) -> list[str]:
        return [f.message for f in self.conflicts]

    def launch_rows(self, drafter: str) -> dict:
        """The launch line per engine for the drafter folder ``drafter`` as written
        (:meth:`~eagle3conv.wiring.config_ids.WiringEdits.launch_rows`); none when nothing was written."""
        return {} if self.edits is None else self.edits.launch_rows(drafter, self.config, self.tensor_names)

    def to_dict(self, drafter: str | None = None) -> dict:
        d = self.report.to_dict()
        d["written"] = None if self.edits is None else self.edits.to_dict(drafter, self.config, self.tensor_names)
        d["refused"] = self.refused
        return d


def wire(config: dict, ev: Evidence, opts: WiringOptions, *, fc_in: int | None, target_hidden: int | None,
         source_format: str | None, fix_command: str, force_write: bool = False,
         tensor_names: set[str] | None = None, read_d2t=None, said: frozenset[str] = frozenset()) -> Wiring:
    """Write the training record's layers into ``config`` in every engine's numbering
    (when a record names them) and check the result.

    The config's own ids are replaced silently only when they are the record
    (a trainer's ids in its known numbering: that is the conversion). When an
    independent record contradicts them, nothing is changed and ``refused`` says
    why, unless ``opts.rewire`` or ``force_write`` (the ``config`` command). ``said``: codes
    of the config audit the caller's own checks already reported (:func:`assembled`).
    """
    target = ev.target
    n = target.num_hidden_layers if target else None
    tname = target.name if target else None
    kw = _check_kw(ev, opts, fc_in=fc_in, target_hidden=target_hidden, source_format=source_format,
                   fix_command=fix_command)
    family = kw["family"]
    truth = ev.truth
    edits = None
    if truth is not None:
        independent = truth is not ev.config_record
        if independent and not (opts.rewire or force_write):
            pre = check_wiring(config, records=ev.records, **kw)
            conflicts = tuple(f for f in pre.errors if f.code in CONFLICTS)
            if conflicts:
                return Wiring(config, None, pre, conflicts)
        edits = wiring_edits(config, truth, num_layers=n, target=tname,
                             target_repo=target.hf_repo if target else None, family=family,
                             releases=kw["engines"] if kw["explicit_engines"] else ())
        config = apply_edits(config, edits.config_edits)
    report = assembled(check_wiring(config, records=ev.records, **kw), config, ev, target_hidden,
                       audit=_audit(config, ev, opts, tensor_names, read_d2t, said))
    return Wiring(config, edits, report, tensor_names=frozenset(tensor_names or ()))


def _audit(config: dict, ev: Evidence, opts: WiringOptions | None, tensor_names: set[str] | None, read_d2t,
           said: frozenset[str] = frozenset()) -> tuple[Finding, ...]:
    """The config audit (:mod:`eagle3conv.wiring.audit`) where the tensors' names are known, less
    the codes ``said`` elsewhere."""
    if tensor_names is None:
        return ()
    from eagle3conv.wiring.audit import audit_config

    return tuple(f for f in audit_config(config, tensor_names, read_d2t=read_d2t,
                                         target_vocab=ev.target.vocab_size if ev.target else None,
                                         **served_context(opts, ev.target)) if f.code not in said)


def served_context(opts: WiringOptions | None, target) -> dict:
    """The context the audit checks ``max_position_embeddings`` against: ``--max-context``,
    else the target's own ``max_position_embeddings`` (its profile, with its source), else
    none, with why (audit_config's ``max_context`` / ``max_context_from`` / ``context_unknown``)."""
    if opts is not None and opts.max_context is not None:
        return {"max_context": opts.max_context, "max_context_from": "--max-context"}
    if target is None:
        return {}
    mpe = getattr(target, "max_position_embeddings", None)
    if mpe:
        return {"max_context": mpe, "max_context_from": f"{target.name}'s max_position_embeddings, the default "
                                                        "of --max-context"}
    return {"context_unknown": f"the profile of {target.name} names no max_position_embeddings and no "
                               "--max-context was given"}


def assembled(report: WiringReport, config: dict, ev: Evidence, target_hidden: int | None, *,
              audit: Sequence[Finding] = (), before: Sequence[Finding] = (),
              extra: Sequence[Finding] = ()) -> WiringReport:
    """The one place a wiring report's findings are put together, in the order they are shown:
    ``before`` (what the caller says first), the drafter against the target (its numbers, then
    the width of the states it reads), the check's own, the config ``audit``, then ``extra``
    (the caller's audits: verify's embedding comparison, what fix-keys would refuse)."""
    target = ev.target
    head: list[Finding] = list(before)
    if target is not None:
        head += target_mismatches(config, target)
    if target is not None and target_hidden and target.hidden_size != target_hidden:
        head.append(Finding(
            "error", AUX_LAYERS, TARGET_HIDDEN,
            f"the drafter reads target states of width {target_hidden}, but {target.name}'s hidden size is "
            f"{target.hidden_size}: this drafter belongs to another target"))
    return replace(report, findings=(*head, *report.findings, *audit, *extra))


def completed(w: Wiring, extra: Sequence[Finding]) -> Wiring:
    """``w``, a check assembled without ``extra``, with the caller's audits ``extra`` after its findings (where
    :func:`assembled` puts them): what :func:`check_fixed` gives with ``extra``, without checking again."""
    return replace(w, report=replace(w.report, findings=(*w.report.findings, *extra)))


def target_mismatches(config: dict, target: TargetProfile) -> list[Finding]:
    """The drafter's config against the target's numbers beyond the hidden size: its ``vocab_size`` (token ids
    and d2t index the target's vocabulary) and the target layer count its config records (eagle3conv's
    provenance, speculators' verifier). The drafter's heads, head_dim and MLA ranks are deliberately not
    compared: neither engine requires them to equal the target's (docs/facts.md §13, "The drafter's geometry
    against the target"); SpecForge's DeepSeek-V3 drafter has 56 heads, 8 KV heads, against the target's 128."""
    from eagle3conv.findings import TARGET_LAYERS, TARGET_VOCAB
    from eagle3conv.spec.drafter import read_field

    out = []
    vocab = config.get("vocab_size")
    if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab != target.vocab_size:
        out.append(Finding("error", AUX_LAYERS, TARGET_VOCAB,
                           f"config.json vocab_size is {vocab}, but {target.name}'s vocabulary has "
                           f"{target.vocab_size} tokens: the drafter's token ids (and its d2t) index another "
                           "vocabulary, so it belongs to another target",
                           "serve it with the target it was trained for (--target), or retrain it on this one"))
    for where in ("eagle3conv.aux_layers.target_num_layers", "speculators_config.verifier.num_hidden_layers"):
        found, n = read_field(config, where)
        if found and isinstance(n, int) and not isinstance(n, bool) and n != target.num_hidden_layers:
            out.append(Finding("error", AUX_LAYERS, TARGET_LAYERS,
                               f"config.json {where} says the target has {n} layers, but {target.name} has "
                               f"{target.num_hidden_layers}: the drafter was wired (or trained) for another target",
                               "give the target it was trained for (--target)"))
    return out


def _check_kw(ev: Evidence, opts: WiringOptions | None, *, fc_in: int | None, target_hidden: int | None,
              source_format: str | None, fix_command: str) -> dict:
    target = ev.target
    opts = opts or WiringOptions()
    return dict(fc_in=fc_in, target_hidden=target_hidden, num_layers=target.num_hidden_layers if target else None,
                target=target.name if target else None, source_format=source_format, fix_command=fix_command,
                family=target.family if target else None, engines=opts.releases(),
                explicit_engines=bool(opts.asked()))


def check_fixed(config: dict, tensors: Mapping, opts: WiringOptions | None, *, ev: Evidence, path,
                target_hidden: int | None, fc_in: int | None = None, fix_command: str | None = None,
                source_format: str | None = "sglang", audit: bool = True, read_d2t=None,
                before: Sequence[Finding] = (), extra: Sequence[Finding] = ()) -> Wiring:
    """The check alone, on a drafter's ``config`` as it is (``config --check``, ``verify``, the smoke
    test): ``target_hidden`` is the width of the target states the drafter reads (T), ``fc_in``
    defaults to the width of ``tensors``' 2-D ``fc.weight``, ``fix_command`` to ``eagle3conv config
    PATH``; with ``audit``, the config audit of the tensors' names too (:mod:`eagle3conv.wiring.audit`);
    ``before`` and ``extra``: the caller's own findings (:func:`assembled`)."""
    if fc_in is None:
        fc_in = fc_width(tensors)
    fix_command = fix_command or f"eagle3conv config {path}"
    kw = _check_kw(ev, opts, fc_in=fc_in, target_hidden=target_hidden, source_format=source_format,
                   fix_command=fix_command)
    names = set(tensors) if audit else None
    report = assembled(check_wiring(config, records=ev.records, **kw), config, ev, target_hidden,
                       audit=_audit(config, ev, opts, names, read_d2t), before=before, extra=extra)
    return Wiring(config, None, report)


__all__ = ["Evidence", "WiringOptions", "Wiring", "gather", "wire", "resolve_target", "fc_width",
           "check_fixed", "assembled", "completed", "CONFLICTS", "describe"]
