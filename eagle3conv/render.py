"""Result objects → text for people. (JSON is each result's ``to_dict``; a result's verdict is typed
data, its ``verdict()``, which both use: the words for it are made here.)"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the result types, imported where their codes are read (render loads fast for --help)
    from eagle3conv.api import (ConfigResult, ConfigVerdict, ExampleResult, FixResult, FormatsResult, InspectResult,
                                LaunchResult, LaunchVerdict, TargetsResult, TargetVerdict)
    from eagle3conv.checkpoint.config import ConfigEdit
    from eagle3conv.checkpoint.plan import Output, Plan, PlanVerdict
    from eagle3conv.checkpoint.quantized import DraftQuantization
    from eagle3conv.hub.push import PushResult, PushVerdict
    from eagle3conv.spec.engines import EngineRow
    from eagle3conv.spec.launch import LaunchLine
    from eagle3conv.spec.launch_check import LaunchCheck
    from eagle3conv.states.capture import CaptureVerdict
    from eagle3conv.verify.report import CategoryFigures, EngineScore, ScoredStates, VerifyReport, VerifyResult
    from eagle3conv.verify.search import Verdict
    from eagle3conv.verify.run import SmokeResult, SmokeVerdict
    from eagle3conv.wiring.apply import Wiring


from eagle3conv.findings import CANNOT_SERVE
from eagle3conv.spec.alike import alike, releases_label


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _plan_lines(plan: Plan, shards: Sequence[tuple[str, Sequence[Output]]], *, verbose: bool = True) -> list[str]:
    """The plan (a :class:`~eagle3conv.checkpoint.plan.Plan`, and the files it writes, ``shards``) part by part."""
    lines = []
    why = "; ".join(plan.detection.reasons)
    lines.append(f"format:   {plan.format.name} — {plan.format.title}")
    lines.append(f"          because {why}")
    if plan.other_formats:
        lines.append(f"          (also matched, lower priority: {', '.join(plan.other_formats)})")
    lines.append(f"writes:   {plan.written_architecture}")
    lines.append("keys:     " + _key_counts(plan))
    shown_drops = 0
    seen_why: set[str] = set()
    for d in plan.decisions:
        a = d.action
        if a == "kept" and not verbose:
            continue
        if a == "dropped":
            shown_drops += 1
            if shown_drops > 8:
                continue
        arrow = {
            "kept": "=",
            "renamed": "~",
            "split": "/",
            "dropped": "x",
            "unmapped": "!!",
            "refused": "!!",
            "copied": "+",
        }[a]
        target = ", ".join(d.targets)
        why = ""
        if a != "kept":
            why = f"   ({d.why})" if d.why not in seen_why else "   (same rule)"
            seen_why.add(d.why)
        lines.append(f"  {arrow:2} {d.source}" + (f"  -> {target}" if target and target != d.source else "") + why)
    if shown_drops > 8:
        lines.append(f"  x  … and {shown_drops - 8} more dropped by the same rules")
    for o in plan.outputs:
        if o.data is not None or o.cast_from:
            how = f"cast from {o.cast_from}" if o.cast_from else "rewritten (vocab map repaired or rebuilt)"
            lines.append(f"  *  {o.name}: {how}")
    if plan.config_edits:
        lines.append("config.json:")
        for e in plan.config_edits:
            lines.append("  " + edit_line(e))
    else:
        lines.append("config.json: no changes")
    if shards:
        lines.append("output files:")
        for file, outs in shards:
            lines.append(f"  {file}: {len(outs)} tensors")
    lines.append(f"output:   {len(plan.outputs)} tensors, {human_bytes(plan.output_bytes)}")
    for n in plan.notices:
        lines.append(f"note:     {n}")
    for e in plan.errors:
        lines.append(f"ERROR:    {e}")
    return lines


def _key_counts(plan: Plan) -> str:
    """How many keys meet each fate, fates in alphabetical order."""
    counts: dict[str, int] = {}
    for d in plan.decisions:
        counts[d.action] = counts.get(d.action, 0) + 1
    return ", ".join(f"{n} {a}" for a, n in sorted(counts.items()))


def edit_line(e: ConfigEdit) -> str:
    """One config edit (a :class:`~eagle3conv.checkpoint.config.ConfigEdit`); nested objects shown by what
    changed in them."""
    old, new = e.old, e.new
    if isinstance(new, dict) and (isinstance(old, dict) or old is None):
        changed = [k for k in new if (old or {}).get(k) != new[k]] + [k for k in (old or {}) if k not in new]
        if changed and not any(isinstance(new.get(k), dict) for k in changed):
            parts = [f"{e.field}.{k}: {(old or {}).get(k)!r} -> {new.get(k)!r}" for k in changed]
            return f"{'; '.join(parts)}   ({e.why})"
        return f"{e.field}: block written   ({e.why})"
    return f"{e.field}: {old!r} -> {new!r}   ({e.why})"


_MARK = {"error": "BAD ", "warning": "warn", None: "ok  "}


def _row_line(row: EngineRow, label: str | None = None) -> str:
    """One engine release's row (an :class:`~eagle3conv.spec.engines.EngineRow`; ``label``: the releases
    sharing it): what it reads and captures from this config."""
    from eagle3conv.spec.engine_rules import KIND_WORDS
    from eagle3conv.spec.layers import describe

    cap, release = row.capture, str(row.release)
    needs = None if row.needs is None else list(row.needs)
    captures = None if cap.layers is None else describe(cap.layers)
    if cap.unknown:
        what = cap.unknown
    elif cap.error:
        what = cap.error.message.removeprefix(f"{release} ")
        if needs is not None:
            what += f"; needs {needs}"
    elif not row.field.in_config:
        what = (f"{cap.reads}: launch with {needs}" if needs is not None
                else f"{cap.reads} not given: captures {captures} (its default)")
    else:
        src = "no ids: its default" if cap.fell_back else cap.reads
        rule = None if cap.kind is None else KIND_WORDS[cap.kind]
        what = f"reads {src} {None if cap.ids is None else list(cap.ids)} ({rule}) -> captures {captures}"
        if row.as_trained is False and needs is not None:
            what += f"; needs {needs}"
    levels = {f.level for f in (row.finding, row.serve) if f is not None}
    worst = next((lv for lv in ("error", "warning") if lv in levels), None)
    mark = "?   " if cap.unknown and worst is None else _MARK.get(worst, "ok  ")
    return f"{mark} {label or release}: {what}"


def _runner_line(row: EngineRow) -> str:
    """A row whose runner is the engine's default, not one asked for: which, and how to ask for another."""
    from eagle3conv.spec.engines import RUNNER_SUFFIX

    rel = row.release
    return (f"{row.capture.runner}, {rel.engine}'s default runner (ask for another with --engine "
            f"{rel.spec}{RUNNER_SUFFIX}NAME)")


def wiring_lines(w: Wiring | None, *, verbose: bool = False) -> list[str]:
    """The aux-layer wiring (a :class:`~eagle3conv.wiring.apply.Wiring`) in plain words: what it was
    trained on, what was written, one row per engine release (its problem and fix under it), then the
    other findings."""
    if w is None:
        return []
    from eagle3conv.spec.layers import describe

    rep = w.report
    lines = []
    lines.append(f"trained on: {describe(rep.layers)} ({rep.record.source if rep.record else None})"
                 if rep.layers is not None else "trained on: not recorded")
    if w.edits is not None:
        lines.append("written:")
        for where, ids, read_by in w.edits.written_ids():
            lines.append(f"  {where} = {list(ids)}   (read by {', '.join(str(r) for r in read_by)})")
    rows = rep.rows
    specs = {r.release.spec for r in rows}
    fixes = [r.finding.fix if r.finding is not None else None for r in rows]
    shared_fix = fixes[0] if len({f for f in fixes if f}) == 1 and sum(bool(f) for f in fixes) > 1 else None
    if rows:
        lines.append("per engine release (what each captures from this config):")
    for group in rep.row_groups():  # one row per group of releases that read alike
        r = group[0]
        fix = r.finding.fix if r.finding is not None else None
        lines.append("  " + _row_line(r, releases_label([str(x.release) for x in group])))
        if r.release.note:
            lines.append(f"       note: {r.release.note}")
        if r.runner_assumed and verbose:
            lines.append(f"       runner: {_runner_line(r)}")
        if fix and not shared_fix:
            lines.append(f"       fix: {fix}")
        serve = r.serve
        if serve is not None:
            lines.append(f"       {'CANNOT SERVE' if serve.code == CANNOT_SERVE else 'serves'}: {serve.message}"
                         + (f" ({serve.fix})" if serve.fix else ""))
        if verbose:
            for note in (*r.capture.notes, *([r.capture.fallback_why] if r.capture.fallback_why else [])):
                lines.append(f"       ({note})")
    if shared_fix:
        lines.append(f"  fix (every BAD row): {next(f for f in fixes if f)}")
    for f in rep.findings:
        if f.subject in specs or (rows and f.level == "ok"):
            continue  # said on its row (a release's problem, or that its ids are as trained)
        tag = {"ok": "ok", "notice": "note", "warning": "warning", "error": "ERROR"}[f.level]
        lines.append(f"{tag}: {f.message}")
        if f.fix and f.level != "ok":
            lines.append(f"  fix: {f.fix}")
    for r in w.refused:
        lines.append(f"REFUSED: {r}")
    return lines


def smoke_verdict_words(v: SmokeVerdict) -> str:
    """The smoke test's verdict for its ``ok:`` line: True, or False with what failed."""
    from eagle3conv.verify.run import SmokeOutcome

    failed = {SmokeOutcome.RUNS: None, SmokeOutcome.FORWARD_FAILED: "the forward failed",
              SmokeOutcome.WIRING_FAILED: "the wiring failed; the forward itself ran clean",
              SmokeOutcome.BOTH_FAILED: "the forward and the wiring failed"}[v.outcome]
    return "True" if failed is None else f"False ({failed})"


def smoke_text(r: SmokeResult) -> str:
    """``verify`` without states (an :class:`eagle3conv.verify.run.SmokeResult`): the smoke test's
    fields, then the wiring report."""
    f = r.forward
    lines = [f"checkpoint: {r.checkpoint}", f"ok: {smoke_verdict_words(r.verdict())}",
             f"forward problems: {', '.join(f.problems) if f.problems else 'none'}", f"device: {r.device}",
             f"dtype: {r.dtype}", f"step1_input_width: {f.step1_input_width}",
             f"step2_input_width: {f.step2_input_width}", f"logits_width: {f.logits_width}",
             f"vocab_size: {f.vocab_size}", f"embedding: {f.embedding_source}", f"seconds: {round(r.seconds, 3)}"]
    if r.kind:
        lines += [f"kind: {r.kind}", f"engine_notes: {list(f.engine_notes)}"]
    if r.wiring:
        lines.append("wiring:")
        lines += ["  " + line for line in wiring_lines(r.wiring)]
    return "\n".join(lines)


def _counted(errors: int, warnings: int) -> str:
    return f"{errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}"


def config_verdict_words(v: ConfigVerdict) -> str:
    """``config``'s verdict (:meth:`~eagle3conv.api.ConfigResult.verdict`) in one line."""
    from eagle3conv.api import ConfigOutcome

    if v.outcome in (ConfigOutcome.PASSED, ConfigOutcome.FAILED):
        return f"check: {'passed' if v.ok else 'FAILED'} ({_counted(v.errors, v.warnings)})"
    if v.outcome is ConfigOutcome.REFUSED:
        return "config: refused: the config's ids contradict the training record; nothing written"
    if v.outcome is ConfigOutcome.ALREADY_WIRED:
        return f"config: already wired for {v.layers}; no changes"
    if v.outcome is ConfigOutcome.WROTE:
        miss = v.except_releases
        return (f"config: {'would write' if v.mode == 'dry-run' else 'wrote'} {v.layers} into config.json "
                + (f"for every engine release checked except {', '.join(miss)} (see "
                   f"{'its row' if len(miss) == 1 else 'their rows'})" if miss else "for every engine"))
    return "config: no training record names the layers; nothing to write"


def config_text(res: ConfigResult, *, verbose: bool = False) -> str:
    """``config`` (a :class:`~eagle3conv.api.ConfigResult`) for people: its verdict, then the wiring."""
    lines = [config_verdict_words(res.verdict()), f"checkpoint: {res.checkpoint}"]
    if res.recovered:
        lines.append(f"recovered:  {res.recovered}")
    t = res.evidence.target
    lines.append(f"target:     {t.name} ({t.num_hidden_layers} layers, hidden {t.hidden_size})" if t
                 else "target:     not given (--target): layer ranges and engine defaults not checked")
    if verbose:
        for r in res.evidence.records:
            lines.append(f"record:     {r.describe()}")
    lines += wiring_lines(res.wiring, verbose=verbose)
    if res.mode == "check":
        return "\n".join(lines)
    edits = res.wiring.edits
    if edits is not None:
        for e in edits.config_edits:
            lines.append("config.json: " + edit_line(e))
        rows = res.wiring.launch_rows(str(res.checkpoint))
        if rows:
            lines.append("launch:")
            for name, engine in (("SGLang", "sglang"), ("vLLM", "vllm"), ("TensorRT-LLM", "tensorrt-llm")):
                row = rows.get(engine)
                if row is not None:
                    lines.append(f"  {name + ':':<14} " + (row.one_line if row.text is not None
                                                            else f"no line: {'; '.join(row.refused)}"))
    if res.mode == "dry-run":
        lines.append("dry run: nothing written")
    else:
        lines.append("wrote: " + (", ".join(res.written) if res.written else "nothing (no changes)"))
    return "\n".join(lines)


def targets_verdict_words(v: TargetVerdict) -> str:
    """Whether a target's releases checked by default capture alike from a config naming no layers."""
    from eagle3conv.api import DefaultsOutcome

    if v.outcome is DefaultsOutcome.CANNOT:
        return (f"{', '.join(v.cannot)} cannot capture with {'its' if len(v.cannot) == 1 else 'their'} default ids: "
                "a drafter's config.json must name its layers for them")
    if v.outcome is DefaultsOutcome.DIFFER:
        return ("the releases capture different layers with their defaults: a drafter's config.json must name "
                "its layers")
    return "every release captures the same layers with its default ids"


def targets_text(res: TargetsResult) -> str:
    """``targets`` (a :class:`~eagle3conv.api.TargetsResult`): the table of profiles, or one with its sources."""
    if not res.detail:
        lines = [f"{'name':<18} {'layers':>6} {'hidden':>6} {'vocab':>7}  default aux layers (outputs of)   architectures"]
        for t in res.targets:
            p = t.profile
            aux = ", ".join(str(list(x)) for x in t.verdict().layer_sets) or "-"
            lines.append(f"{p.name:<18} {p.num_hidden_layers:>6} {p.hidden_size:>6} {p.vocab_size:>7}  "
                         f"{aux:<31}  {', '.join(p.architectures)}")
        return "\n".join(lines)
    from eagle3conv.spec.layers import describe

    lines = []
    for t in res.targets:
        p = t.profile
        lines.append(f"{p.name}: {p.description}")
        for k in ("hf_repo", "architectures", "family", "hidden_size", "num_hidden_layers", "vocab_size",
                  "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "aliases"):
            value = getattr(p, k)
            lines.append(f"  {k}: {list(value) if isinstance(value, tuple) else value}")
        if t.defaults:
            lines.append("  with no aux ids in config.json, each engine release captures:")
            for a in t.defaults:
                what = describe(a.layers) if a.layers else f"nothing: {None if a.error is None else a.error.message}"
                lines.append(f"    {a.release}: its default {None if a.ids is None else list(a.ids)} -> {what}")
            lines.append(f"  so {targets_verdict_words(t.verdict())}")
        src = p.sources or {}
        if src.get("upstream"):
            lines.append(f"  source: {src['upstream']}")
        for ref, what in (src.get("references") or {}).items():
            lines.append(f"    [{ref}] {what}")
        if src.get("unchecked"):
            lines.append(f"  single-source numbers: {', '.join(src['unchecked'])}")
    return "\n".join(lines)


def formats_text(res: FormatsResult) -> str:
    """``formats`` (a :class:`~eagle3conv.api.FormatsResult`): one line per format. It decides nothing
    (its verdict is ``listed``), so no verdict line leads it."""
    return "\n".join(f"{f.name:<22} {f.title}" for f in res.formats)


def capture_verdict_words(v: CaptureVerdict) -> str:
    """What ``capture`` wrote (or, planned, would run), in one clause."""
    from eagle3conv.states.capture import CaptureOutcome

    kept = ("every layer's output" if v.every_layer else
            f"the outputs of layer{'s' * (sum(i >= 0 for i in v.layers) != 1)} "
            f"{', '.join(str(i) for i in v.layers if i >= 0)}")
    what = f"the embedding output and {kept} of the target's {v.num_layers} layers"
    if v.outcome is CaptureOutcome.PLANNED:
        return f"dry run: nothing was run; it would capture {what} for {v.sequences} prompts"
    generated = f", {v.generated_tokens} of them generated" if v.generate else ""
    return (f"wrote {v.sequences} sequence{'s' * (v.sequences != 1)} ({v.tokens} tokens{generated}) with {what}")


def capture_note_words(v: CaptureVerdict) -> list[str]:
    """The capture's notes (:class:`~eagle3conv.states.capture.CaptureNote`), one line each."""
    from eagle3conv.states.capture import CaptureNote

    words = {
        CaptureNote.NO_CHAT_TEMPLATE: "the tokenizer has no chat template: the prompts were tokenized as plain text",
        CaptureNote.AT_MAX_LENGTH: f"{v.at_max_length} sequence{'s' * (v.at_max_length != 1)} reached --max-length "
                                   f"{v.max_length} (cut there, or exactly that long)",
        CaptureNote.CHOSEN_LAYERS: "only the layers asked for were kept: verify can score and search wirings of "
                                   "these layers only",
    }
    return [f"note: {words[n]}" for n in v.notes]


def capture_text(d: dict, v: CaptureVerdict) -> str:
    """``capture`` (its ``--json`` document ``d`` and verdict ``v``): the verdict, its notes, then every field."""
    return "\n".join([f"capture: {capture_verdict_words(v)}", *capture_note_words(v),
                      *(f"{k}: {x}" for k, x in d.items() if k != "verdict")])


def capture_plan_text(d: dict, v: CaptureVerdict) -> str:
    """``capture --engine vllm --dry-run`` (the plan's document ``d``, its verdict ``v``): the exact invocation."""
    import json

    return "\n".join([
        f"capture --engine vllm, dry run: nothing was run ({v.sequences} prompts from {d['prompts_file']})",
        f"vllm layer ids (vLLM numbering: id i = output of layer i-1, 0 = embedding): {d['vllm_layer_ids']}",
        f"the same as eagle3conv output-of ids: {d['layers']['output_of']}",
        "",
        "vllm.LLM(**" + json.dumps(d["llm_kwargs"], indent=2) + ")",
        "vllm.SamplingParams(**" + json.dumps(d["sampling_params"]) + ")  # one per prompt",
        f"prompts: {d['prompts']}",
        "",
        "the same engine as a server (speculators generate-offline-data --endpoint ... --output DIR moves "
        "its files to DIR/hs_{i}; it writes no eagle3conv-capture.json: give verify --states-layers):",
        "  " + d["serve"],
        "",
        f"writes: {d['out']}/{d['files'][0]} per prompt and {d['out']}/{d['files'][1]}",
    ])


def plan_verdict_words(v: PlanVerdict) -> str:
    """What fix-keys does (or would do) to this checkpoint (:meth:`~eagle3conv.checkpoint.plan.Plan.verdict`),
    in one clause."""
    from eagle3conv.checkpoint.plan import PlanOutcome, line

    if v.outcome is PlanOutcome.LAYER_COUNT:  # the folder's one error, which fix-keys' config edit repairs
        return (f"no engine serves it as it is: {v.first_error.message}; fix-keys would rewrite "
                "num_hidden_layers")
    if v.outcome is PlanOutcome.REFUSED:
        return f"fix-keys would refuse it: {line(v.first_error)}"
    if v.outcome is PlanOutcome.READY:
        return "already SGLang-ready: fix-keys would change nothing"
    verbs = {"renamed": "rename", "split": "split", "dropped": "drop"}
    keys = ", ".join(f"{verbs[a]} {n}" for a, n in v.keys)
    what = [f"{keys} key{'s' * (sum(n for _, n in v.keys) != 1)}"] if keys else []
    if v.config_edits:
        what.append(f"edit {v.config_edits} config.json field{'s' * (v.config_edits != 1)}")
    return f"fix-keys would {' and '.join(what) or 'rewrite the vocab maps only'}"


def _error_words(e: Exception) -> tuple[str, str | None]:
    """An error's message and hint (an :class:`~eagle3conv.errors.Eagle3ConvError`'s own; another's text)."""
    from eagle3conv.errors import Eagle3ConvError

    return (e.message, e.hint) if isinstance(e, Eagle3ConvError) else (str(e), None)


def inspect_text(res: InspectResult, *, verbose: bool = False) -> str:
    """``inspect`` (an :class:`~eagle3conv.api.InspectResult`) for people."""
    idx, plan = res.index, res.plan
    if res.plan_error is not None:  # the error leads the report, whatever else was read
        verdict = f"inspect: fix-keys cannot plan: {_error_words(res.plan_error)[0]}"
    elif plan is not None:
        verdict = f"inspect: a {plan.format.name} checkpoint ({plan.format.title}); {plan_verdict_words(res.verdict())}"
    else:
        verdict = "inspect: read"
    lines = [verdict, f"checkpoint: {idx.root}", f"layout:     {idx.layout} ({len(idx.weight_files)} weight file(s))"]
    if res.recovered:
        lines.append(f"recovered:  {res.recovered}")
    if idx.wrapper:
        lines.append(f"wrapper:    weights under '{idx.wrapper}'")
    tensors = sorted(idx.tensors.values(), key=lambda t: t.name)
    lines.append(f"tensors:    {len(tensors)}, {human_bytes(idx.total_bytes)}")
    shown = tensors if verbose else tensors[:200]
    width = max((len(t.name) for t in shown), default=10)
    for t in shown:
        lines.append(f"  {t.name:<{width}}  {t.dtype:>5}  {str(list(t.shape)):<18} {human_bytes(t.nbytes):>10}")
    if len(shown) < len(tensors):
        lines.append(f"  … {len(tensors) - len(shown)} more (--verbose or --json for all)")
    cfg = res.config_summary()
    if cfg is None:
        lines.append("config:     none")
    else:
        lines.append("config:     " + ", ".join(f"{k}={v}" for k, v in cfg.items() if k not in ("eagle_config",)))
        if "eagle_config" in cfg:
            lines.append(f"            eagle_config={cfg['eagle_config']}")
    if idx.other_files:
        lines.append("other files: " + ", ".join(p.name for p in idx.other_files))
    if plan is not None:
        lines.append("")
        lines.append("aux layers:")
        lines += ["  " + line for line in wiring_lines(plan.wiring.report if plan.wiring else None, verbose=verbose)]
        lines.append("")
        lines.append("what fix-keys would do:")
        lines += ["  " + line for line in _plan_lines(plan, res.shards(), verbose=verbose)]
    if res.plan_error is not None:
        hint = _error_words(res.plan_error)[1]
        if hint:
            lines.append(f"hint: {hint}")
    return "\n".join(lines)


def quantization_lines(q: DraftQuantization | None) -> list[str]:
    """A quantized drafter (a :class:`~eagle3conv.checkpoint.quantized.DraftQuantization`): the scheme, and
    per release whether it serves it as stored and the draft quantization option to launch it with."""
    if not q:
        return []
    left = ", ".join(q.quantized) or "none"
    lines = [f"quantized: {q.title} ({q.method} {q.algo}): {left}"
             + (f"; written in bf16: {', '.join(q.dequantized)}" if q.dequantized else "")]
    for r in q.releases:
        tell = f"launch with {r.option} {r.value}" if r.option and r.value else "no option to set"
        lines.append(f"           {r.release}: {'serves it as stored' if r.serves_as_defined else 'CANNOT serve it as stored'}"
                     f"; {tell}")
    return lines


def fix_text(res: FixResult, *, verbose: bool = False) -> str:
    """fix-keys (a :class:`~eagle3conv.api.FixResult`): what it did in one line, then the summary; the
    per-key plan with --verbose or --dry-run (inspect shows it before)."""
    plan = res.plan
    if res.mode == "dry-run":
        lines = [f"fix-keys (dry run, nothing written): "
                 f"{plan_verdict_words(res.verdict()).removeprefix('fix-keys ')}"]
        if res.recovered:
            lines.append(f"recovered: {res.recovered}")
        lines += _plan_lines(plan, res.shards)
        return "\n".join(lines)
    output = str(res.output) if res.output else None
    if res.unchanged:
        lines = [f"fix-keys: {output} is already SGLang-ready; left byte-for-byte unchanged"]
    else:
        w = res.written
        lines = [f"fix-keys: wrote {output}: {len(w.files) if w else 0} files, {human_bytes(w.bytes_written if w else 0)}; "
                 f"{w.verified if w else 0} tensors re-read and proven equal to their source"]
    if res.recovered:
        lines.append(f"recovered: {res.recovered}")
    if verbose:
        lines += _plan_lines(plan, res.shards)
        return "\n".join(lines)
    lines.append(f"format:   {plan.format.name} — {plan.format.title}")
    lines.append("keys:     " + _key_counts(plan) + "  (--verbose lists them)")
    edits = plan.wiring.report.edits if plan.wiring is not None else None  # the typed Wiring's edits
    for where, ids, read_by in edits.written_ids() if edits is not None else ():
        lines.append(f"aux ids:  {where} = {list(ids)}   (read by {', '.join(str(r) for r in read_by)})")
    for e in plan.config_edits:
        lines.append("config.json: " + edit_line(e))
    lines += quantization_lines(plan.quantization)
    for n in plan.notices:
        lines.append(f"note:     {n}")
    return "\n".join(lines)


def confidence_set_lines(v: Verdict) -> list[str]:
    """The verdict's confidence set for people: the first 12 members, then how many more (the
    report lists the screen's unconfirmed survivors up to a cap and counts them all)."""
    members = v.confidence_set
    lines = [f"not excluded at 95% against the best ({v.set_statistic}, paired over sequences):"]
    for c in members[:12]:
        lines.append(f"  {c.layers}" + (f": accept length {c.accept_length_all_starts:.4f} over every chain "
                                        "start" if c.confirmed else ": kept by the screen, not confirmed"))
    total = max(len(members), int(v.to_separate.members if v.to_separate is not None else 0))
    if total > 12:
        unlisted = total - len(members)
        lines.append(f"  ... and {total - 12} more" + (f" ({unlisted} of them kept by the screen or refinement, "
                                                      "counted but not listed)" if unlisted else ""))
    return lines


def category_lines(per: Sequence[CategoryFigures] | None) -> list[str]:
    """verify's per-category figures (the main wiring, as the report states them), one line per prompt
    category."""
    if not per:
        return []
    out = ["  per prompt category (accept length, then acceptance per draft position; 95% intervals):"]
    width = max(len(c.name) for c in per)
    for c in per:
        lo, hi = c.accept_length_ci95
        acc = ", ".join(f"{a:.3f} [{alo:.3f}, {ahi:.3f}]" for a, (alo, ahi) in zip(c.acceptance, c.acceptance_ci95))
        out.append(f"    {c.name:<{width}}  {c.accept_length:.3f} [{lo:.3f}, {hi:.3f}]  {acc}  "
                   f"({c.sequences} sequences, {c.positions_scored} positions)")
    return out


def _scored_block(e: EngineScore, row: EngineRow | None, unchecked: bool) -> list[str]:
    """One engine release's scored row (``e``, beside its wiring row; its label a placeholder, the NUL
    character) and the lines under it."""
    from eagle3conv.spec.layers import describe

    mark = _MARK.get(row.finding.level if row is not None and row.finding is not None else None, "ok  ")
    if unchecked and mark == "ok  ":
        mark = "n/a "  # the slots were labelled with the config's own ids: nothing here checks them
    if e.score is not None:
        captures = None if row is None or row.layers is None else describe(row.layers)
        lines = [f"  {mark} \0: {captures}: accept length {e.accept_length:.3f}, "
                 f"step-1 acceptance {e.acceptance[0]:.3f}"]
    else:  # not scored: its config row may be fine, but these states say nothing of how it serves
        mark = mark if mark != "ok  " else "?   "
        lines = [f"  {mark} \0: not scored: {e.not_scored}"]
    for x in e.emulated:
        lines.append(f"    runs differently: {x}")
    for x in e.not_emulated:
        lines.append(f"    not emulated: {x}")
    if e.not_read:
        lines.append(f"    not in the engine rules ({'; '.join(e.not_read)}): run as SGLang does")
    return lines


def _decided(v: Verdict) -> bool:
    """Whether the verdict weighed a search (the report's verdict carries its figures then)."""
    return v.status is not None and v.status != "undecided"


def _verify_head(res: VerifyResult, rep: VerifyReport, st: ScoredStates) -> list[str]:
    """The verdict line, and what was scored on what."""
    from eagle3conv.verify.report import QuantizationCost

    m = rep.main
    lo_, hi_ = m.accept_length_ci95
    unchecked = st.wiring_checked is False
    lines = [("verify: these states cannot check the wiring (they do not record their slots' layers: pass "
              "--states-layers); " if unchecked else "verify: ")
             + f"accept length {m.accept_length:.3f} [{lo_:.3f}, {hi_:.3f}], step-1 acceptance "
             f"{m.acceptance[0]:.3f}, on {m.described}"
             + ("" if res.passed else f" -- below --min-accept {res.min_accept}")
             + ("" if res.wiring_check_ok else "; the wiring check FAILED (below)"),
             f"checkpoint: {res.checkpoint.name}",
             f"states:     {st.path} ({st.source}; {st.sequences} sequences, "
             f"{st.tokens} tokens; " + (f"target {st.target})" if st.target else "the states name no target)"),
             f"ran on:     {res.device}, {res.dtype}, {res.steps} draft steps; {rep.statistic}"]
    if st.layers_from:
        lines.append(f"layers:     from {st.layers_from}"
                     + ("; the wiring check rests on that statement" if "--states-layers" in st.layers_from else ""))
    if res.quantization is not None:
        qz = QuantizationCost.of(res.quantization)
        ci = qz.ci95
        lines.append(f"quantized:  accept length {qz.accept_length:.3f} vs {qz.reference_accept_length:.3f} for "
                     f"the bf16 reference {qz.reference}: {qz.difference:+.4f}"
                     + (f" [{ci[0]:+.4f}, {ci[1]:+.4f}] (paired 95%)" if ci else ""))
    for n in (*st.verify_notes, *st.notes):
        lines.append(f"note:       {n}")
    return lines


def _engine_lines(res: VerifyResult, unchecked: bool) -> list[str]:
    """Each engine release scored as it serves this config (releases that read alike in one row), then the
    wiring check's findings."""
    rep = res.wiring.report
    rows = {r.release.spec: r for r in rep.rows}
    groups = {r.release.spec: tuple(str(x.release) for x in g) for g in rep.row_groups() for r in g}
    scored = res.engine_scores
    lines = []
    if scored:
        lines.append("per engine release (what each captures from this config, scored on these states):")
    blocks = [_scored_block(e, rows.get(e.engine), unchecked) for e in scored]
    for group in alike(zip(scored, blocks), lambda x: x[0].release.split(" ")[0],
                       lambda x: (groups.get(x[0].engine) or x[0].release, x[1])):
        head, *rest = group[0][1]
        lines.append(head.replace("\0", releases_label([x[0].release for x in group]), 1))
        lines += rest
    for f in rep.findings:
        if f.level != "ok":
            lines.append(f"wiring {f.level}: {f.message}")
            if f.fix:
                lines.append(f"  fix: {f.fix}")
    return lines


def _wiring_result_lines(res: VerifyResult, rep: VerifyReport) -> list[str]:
    """The main wiring's figures (its norms, per prompt category), then the search's other wirings."""
    from eagle3conv.verify.report import NormComparison, SlotNorms

    lines = []
    for i, (r, score) in enumerate(zip(rep.results, res.scores)):
        missing = [k for k in ("accept_length_all_starts", "accept_length_all_starts_ci95", "chains", "ci_method")
                   if getattr(r, k) is None]
        if missing:  # a fresh result states them all: one missing is a renamed field, never a blank in the text
            raise ValueError(f"verify's result states no {', '.join(missing)} for {r.name}")
        acc = ", ".join(f"{a:.3f} [{lo:.3f}, {hi:.3f}]" for a, (lo, hi) in zip(r.acceptance, r.acceptance_ci95))
        lo, hi = r.accept_length_ci95
        alo, ahi = r.accept_length_all_starts_ci95
        if i == 1:
            lines.append("")
            lines.append("wiring search (accept length over every chain start, the figure wirings are ranked by):")
        if i > 0:
            lines.append(f"  {r.accept_length_all_starts:.3f} [{alo:.3f}, {ahi:.3f}]  step-1 "
                         f"{r.acceptance[0]:.3f}  {r.name}: {r.described}")
            continue
        lines.append("")
        lines.append(f"wiring: {r.described} — {r.why}")
        lines.append(f"  acceptance per draft position: {acc}")
        lines.append(f"  accept length: {r.accept_length:.3f} [{lo:.3f}, {hi:.3f}] tokens per target forward "
                     f"(greedy chain decoding replayed: {r.rounds} rounds)")
        lines.append(f"  over every chain start: {r.accept_length_all_starts:.3f} [{alo:.3f}, {ahi:.3f}] "
                     f"({r.chains} chains, {r.positions_scored} positions, {r.sequences} sequences; "
                     f"{r.ci_method})")
        for slot, nm in enumerate(SlotNorms.of(x) for x in score.norms):
            if nm.median is not None:
                lines.append(f"  slot {slot} ({r.layers[slot]}): norm median {nm.median:.4g} "
                             f"(p10 {nm.p10:.4g}, p90 {nm.p90:.4g})")
        for c in (NormComparison.of(x) for x in res.comparisons[i] or ()):
            mark = "  <-- out of line" if c.flagged else ""
            lines.append(f"  slot {c.slot} vs training: {c.inference_median:.4g} vs "
                         f"{c.training_median:.4g} ({c.ratio}x){mark}")
        lines += category_lines(rep.per_category)
    return lines


def _search_lines(v: Verdict) -> list[str]:
    """What the search covered: the coverage's summary, the screen's stages, local refinement."""
    from eagle3conv.verify.words import coverage_summary

    cov = v.coverage if _decided(v) else None  # the report states a coverage with a weighed verdict only
    if cov is None:
        return []
    lines = [coverage_summary(v) or (f"search: {cov.screened} wirings screened, {cov.confirmed} confirmed (not "
                                     f"global: the states lack layers {', '.join(map(str, cov.missing_layers[:8]))})")]
    if cov.screen:  # search.py's screen record (a dict)
        sc = cov.screen
        stages = sc.get("stages") or []
        lines.append(f"screen: {cov.screen_kept} of {cov.screened} wirings not excluded after "
                     + " -> ".join(f"{st['kept']} at {st['positions']}" for st in stages[:8])
                     + " positions; " + sc.get("guarantee", ""))
    ref = cov.refinement  # local refinement's record (a dict)
    if ref:
        tried = sum(r.get("tried", 0) for r in ref.get("rounds", []))
        lines.append(f"local refinement: {tried} wirings one slot from a leader compared with the best, "
                     f"{ref.get('confirmed', 0)} confirmed"
                     + (f", {len(ref['not_confirmed'])} kept but not confirmed" if ref.get("not_confirmed") else ""))
    return lines


def _verdict_lines(v: Verdict) -> list[str]:
    """The verdict: norm flags, the leader against the others, the coverage, the set, what decided, the fix."""
    decided = _decided(v)
    lines = [f"norm flag: {f}" for f in v.norm_flags]
    for pd in (v.paired_differences if decided else ())[:4]:
        lo, hi = pd.ci95
        lines.append(f"best vs {pd.wiring} ({pd.layers}): accept length +{pd.accept_length_gap:.3f} "
                     f"[{lo:+.3f}, {hi:+.3f}] (paired)")
    lines += _search_lines(v)
    members = v.confidence_set if decided else ()
    if len(members) > 1:
        lines += confidence_set_lines(v)
    elif decided and v.tied_set:
        lines.append(f"tied (acceptance cannot separate): {'; '.join(v.tied_set[:6])}")
    status = v.status  # eagle3conv.verify.search.Verdict: named / stands / ambiguous / undecided / None
    if status == "named" or (status == "stands" and len(members) <= 1):
        lines.append(f"trained on (most likely): {v.best_layers} — decided by {v.decided_by}")
    elif status == "stands":  # in a set of several: not excluded, which is not "most likely"
        lines.append(f"stands (in the set, not singled out by the data): {v.best_layers} — {v.decided_by}")
    elif status in ("ambiguous", "undecided"):
        lines.append(f"wiring search: {v.decided_by}")
    if decided and v.advice:
        lines.append(f"fix: {v.advice}")
    return lines


def verify_text(res: VerifyResult) -> str:
    """A verify result (a :class:`~eagle3conv.verify.report.VerifyResult`) for people: its figures as the
    report states them (:meth:`~eagle3conv.verify.report.VerifyResult.report`, validated), the rest from
    the typed result."""
    from eagle3conv.verify.report import Timings

    rep, st = res.report(), res.scored_states
    lines = _verify_head(res, rep, st)
    lines += _engine_lines(res, st.wiring_checked is False)
    lines += _wiring_result_lines(res, rep)
    lines.append("")
    lines += _verdict_lines(res.verdict)
    if res.min_accept is not None:
        lines.append(f"threshold: step-1 acceptance >= {res.min_accept}: {'passed' if res.passed else 'FAILED'}")
    if res.profile is not None:
        lines.append(f"acceptance profile: {res.profile} (speculation_profile.json, schema 1.0)")
    t = Timings.of(res.seconds)
    lines.append(f"time: first result {t.first_result:.2f} s, total {t.total:.2f} s")
    return "\n".join(lines)


def _check_head(release: str, ok: bool, errors: int, warnings: int) -> str:
    """A checked launch line's verdict (``launch --check``'s first line, ``verify --launch``'s tail)."""
    return f"launch check for {release}: {'passed' if ok else 'FAILED'} ({_counted(errors, warnings)})"


def launch_verdict_words(v: LaunchVerdict) -> str:
    """``launch``'s verdict (:meth:`~eagle3conv.api.LaunchResult.verdict`) in one line."""
    from eagle3conv.api import LaunchOutcome

    if v.outcome in (LaunchOutcome.CHECK_PASSED, LaunchOutcome.CHECK_FAILED):
        return _check_head(v.checked, v.ok, len(v.errors), v.warnings)
    return f"launch: {v.releases - len(v.cannot)} of {v.releases} engine releases serve this drafter"


def launch_check_lines(c: LaunchCheck) -> list[str]:
    """A checked launch line (a :class:`~eagle3conv.spec.launch_check.LaunchCheck`): its verdict, each
    finding with its fix, the corrected line."""
    label = str(c.release)
    errors, warnings = (sum(f.level == lv for f in c.findings) for lv in ("error", "warning"))
    lines = [_check_head(label, not errors, errors, warnings)]
    if c.names_note:
        lines.append(f"note: {c.names_note}")
    for f in c.findings:
        tag = {"error": "ERROR", "warning": "warning", "notice": "note", "ok": "ok"}[f.level]
        lines.append(f"{tag}: {f.message.removeprefix(label + ': ')}")
        if f.fix:
            lines.append(f"  fix: {f.fix}")
    if not c.findings:
        lines.append("no problem found")
    lines.append("checked: " + "; ".join(c.checked))
    if c.corrected:
        lines.append(f"corrected: {c.corrected}")
    return lines


def alike_rows(rows: Sequence[LaunchLine]) -> list[tuple[str, LaunchLine, tuple[str, ...]]]:
    """Launch rows (:class:`~eagle3conv.spec.launch.LaunchLine`) with neighbouring releases of one engine
    that print the same line (and the same needs, file and refusal) merged into one row: per row, its
    label (every release: ``sglang 0.5.12, 0.5.23``), its first line, and its refusals without the
    release's name."""

    def refused(r: LaunchLine) -> tuple[str, ...]:
        return tuple(x.removeprefix(f"{r.release} ") for x in r.refused)

    groups = alike(rows, lambda r: str(r.release).split()[0],
                   lambda r: (refused(r), r.text, tuple(r.needs), r.extra_name, r.extra_file))
    return [(releases_label([str(r.release) for r in g]), g[0], refused(g[0])) for g in groups]


def launch_text(res: LaunchResult) -> str:
    """``eagle3conv launch`` (a :class:`~eagle3conv.api.LaunchResult`): the check's verdict first (with
    --check), then one row per engine release (its line, or why it cannot serve the drafter), then the
    check's findings."""
    rows = res.rows
    checked = launch_check_lines(res.check) if res.check is not None else None
    lines = [launch_verdict_words(res.verdict()), f"checkpoint: {res.checkpoint}",
             f"target:     {res.target or 'not given (--target): TARGET in the lines'}"]
    for n in res.notes:
        lines.append(f"note:       {n}")
    lines.append("per engine release:")
    for label, r, refused in alike_rows(rows):
        if r.text is None:
            lines.append(f"  BAD  {label}: cannot serve it: " + "; ".join(refused))
            continue
        lines.append(f"  ok   {label}: {r.text}")
        for need in r.needs:
            lines.append(f"       needs {need}")
        if r.extra_file:  # TensorRT-LLM: the YAML file the line names, and its text
            lines.append(f"       {r.extra_name}:")
            lines += [f"         {x}" for x in r.extra_file.splitlines()]
    if checked:
        lines += checked[1:]
    return "\n".join(lines)


def push_verdict_words(v: PushVerdict) -> str:
    """``push``'s verdict (:meth:`~eagle3conv.hub.push.PushResult.verdict`) in one line, its text's first: what
    was sent where, and what the gate said. (A push the gate refused is an error: its message names the checks.)"""
    from eagle3conv.hub.push import GateOutcome, PushOutcome

    what = {PushOutcome.DRY_RUN: f"dry run for {v.repo_id}, nothing sent",
            PushOutcome.UNCHANGED: f"{v.repo_id} already holds these files, no commit made",
            PushOutcome.PULL_REQUEST: f"opened a pull request on {v.repo_id}",
            PushOutcome.COMMITTED: f"committed to {v.repo_id}@{v.revision or 'main'}"}[v.outcome]
    gate = {GateOutcome.PASSED: "every check passed", GateOutcome.NO_CHECKS: "no checks ran",
            GateOutcome.FORCED: f"forced past the failed check{'s' * (len(v.failed) != 1)} {', '.join(v.failed)}",
            }[v.gate]
    return f"push: {what}; {gate}"


def push_done_words(v: PushVerdict) -> str:
    """What ``push`` did, with where to find it (the commit, the pull request): its text's last line."""
    from eagle3conv.hub.push import PushOutcome

    if v.outcome is PushOutcome.DRY_RUN:
        return "dry run: nothing sent"
    if v.outcome is PushOutcome.UNCHANGED:
        return f"unchanged: {v.repo_id} already holds these files; no commit made"
    if v.outcome is PushOutcome.PULL_REQUEST:
        return f"opened {v.pr_url} ({v.pr_revision}, commit {v.commit})"
    return f"committed {v.commit} to {v.repo_id}@{v.revision or 'main'} ({v.commit_url})"


def push_text(res: PushResult) -> str:
    """``push`` (a :class:`~eagle3conv.hub.push.PushResult`): its verdict, the checks, the files sent (with a
    dry run, the card), then what it did."""
    from eagle3conv.hub.push import GateOutcome, PushOutcome

    v = res.verdict()
    lines = [push_verdict_words(v)]
    lines += [f"check {c.name}: {'ok' if c.ok else 'FAILED'} — {c.detail}" for c in res.checks]
    if v.gate is GateOutcome.FORCED:
        lines.append("forced: pushed despite failed checks (the card says so)")
    for link, target in res.followed_symlinks or []:
        lines.append(f"followed symlink {link} -> {target} (--follow-symlinks)")
    lines.append(f"files ({len(res.files)}, {human_bytes(res.total_bytes)}):")
    tags = {"generated": "  (generated card)", "plot": "  (wiring plot, shown in the card)"}
    for f in res.files:
        lines.append(f"  {f.path}  {human_bytes(f.size)}" + tags.get(f.source, ""))
    if v.outcome is PushOutcome.DRY_RUN:
        lines += ["", res.card or "(no card)"]
    lines.append(push_done_words(v))
    return "\n".join(lines)


def example_text(res: ExampleResult) -> str:
    """``example`` (an :class:`~eagle3conv.api.ExampleResult`): its verdict, the one line."""
    v = res.verdict()
    return f"wrote an example {v.format} drafter to {v.path}"
