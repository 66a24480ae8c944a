"""Result objects → text for people. (JSON is each result's ``to_dict``; a result's verdict is typed
data, its ``verdict()``, which both use: the words for it are made here.)"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the result types, imported where their codes are read (render loads fast for --help)
    from eagle3conv.api import (ConfigResult, ConfigVerdict, FixResult, FormatsResult, InspectResult, TargetsResult,
                                TargetVerdict)
    from eagle3conv.checkpoint.plan import Plan, PlanVerdict
    from eagle3conv.states.capture import CaptureVerdict


from eagle3conv.findings import CANNOT_SERVE
from eagle3conv.spec.alike import alike, releases_label


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _plan_lines(plan: dict, typed: Plan, *, verbose: bool = True) -> list[str]:
    """The plan (its ``to_dict``, and the :class:`~eagle3conv.checkpoint.plan.Plan` for its findings'
    lines) key by key."""
    lines = []
    why = "; ".join(plan["format_reasons"])
    lines.append(f"format:   {plan['format']} — {plan['format_title']}")
    lines.append(f"          because {why}")
    if plan["other_matching_formats"]:
        lines.append(f"          (also matched, lower priority: {', '.join(plan['other_matching_formats'])})")
    lines.append(f"writes:   {plan['architecture']}")
    counts: dict[str, int] = {}
    for d in plan["decisions"]:
        counts[d["action"]] = counts.get(d["action"], 0) + 1
    lines.append("keys:     " + ", ".join(f"{n} {a}" for a, n in sorted(counts.items())))
    shown_drops = 0
    seen_why: set[str] = set()
    for d in plan["decisions"]:
        a = d["action"]
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
        target = ", ".join(d["targets"])
        why = ""
        if a != "kept":
            why = f"   ({d['why']})" if d["why"] not in seen_why else "   (same rule)"
            seen_why.add(d["why"])
        lines.append(f"  {arrow:2} {d['source']}" + (f"  -> {target}" if target and target != d["source"] else "") + why)
    if shown_drops > 8:
        lines.append(f"  x  … and {shown_drops - 8} more dropped by the same rules")
    rewritten = [o for o in plan["outputs"] if o.get("rewritten") or o.get("cast_from")]
    for o in rewritten:
        how = f"cast from {o['cast_from']}" if o.get("cast_from") else "rewritten (vocab map repaired or rebuilt)"
        lines.append(f"  *  {o['name']}: {how}")
    if plan["config_edits"]:
        lines.append("config.json:")
        for e in plan["config_edits"]:
            lines.append("  " + edit_line(e))
    else:
        lines.append("config.json: no changes")
    if plan.get("shards"):
        lines.append("output files:")
        for s in plan["shards"]:
            lines.append(f"  {s['file']}: {len(s['tensors'])} tensors")
    lines.append(f"output:   {len(plan['outputs'])} tensors, {human_bytes(plan['output_bytes'])}")
    for n in typed.notices:
        lines.append(f"note:     {n}")
    for e in typed.errors:
        lines.append(f"ERROR:    {e}")
    return lines


def edit_line(e: dict) -> str:
    """One config edit; nested objects shown by what changed in them."""
    old, new = e["old"], e["new"]
    if isinstance(new, dict) and (isinstance(old, dict) or old is None):
        changed = [k for k in new if (old or {}).get(k) != new[k]] + [k for k in (old or {}) if k not in new]
        if changed and not any(isinstance(new.get(k), dict) for k in changed):
            parts = [f"{e['field']}.{k}: {(old or {}).get(k)!r} -> {new.get(k)!r}" for k in changed]
            return f"{'; '.join(parts)}   ({e['why']})"
        return f"{e['field']}: block written   ({e['why']})"
    return f"{e['field']}: {old!r} -> {new!r}   ({e['why']})"


_MARK = {"error": "BAD ", "warning": "warn", None: "ok  "}


def _row_line(r: dict, label: str | None = None) -> str:
    """One engine release's row (``label``: the releases sharing it): what it reads and captures from
    this config."""
    if r.get("unknown"):
        what = r["unknown"]
    elif r.get("error"):
        what = r["error"].removeprefix(f"{r['release']} ")
        if r.get("needs") is not None:
            what += f"; needs {r['needs']}"
    elif r["field"]["kind"] == "launch_option":
        what = (f"{r['reads']}: launch with {r['needs']}" if r.get("needs") is not None
                else f"{r['reads']} not given: captures {r['captures']} (its default)")
    else:
        src = "no ids: its default" if r["fell_back"] else r["reads"]
        what = f"reads {src} {r['ids']} ({r['rule']}) -> captures {r['captures']}"
        if r.get("as_trained") is False and r.get("needs") is not None:
            what += f"; needs {r['needs']}"
    levels = {(r.get(k) or {}).get("level") for k in ("finding", "serve")}
    worst = next((lv for lv in ("error", "warning") if lv in levels), None)
    mark = "?   " if r.get("unknown") and worst is None else _MARK.get(worst, "ok  ")
    return f"{mark} {label or r['release']}: {what}"


def wiring_lines(w: dict | None, *, verbose: bool = False) -> list[str]:
    """The aux-layer wiring (a Wiring.to_dict()) in plain words: what it was trained on, what was
    written, one row per engine release (its problem and fix under it), then the other findings."""
    if not w:
        return []
    lines = []
    t = w.get("trained_on")
    lines.append(f"trained on: {t['described']} ({t['source']})" if t else "trained on: not recorded")
    wr = w.get("written")
    if wr:
        lines.append("written:")
        for f in wr["ids"]:
            where = f["field"] if f["kind"] == "config" else f"launch option {f['field']}"
            lines.append(f"  {where} = {f['ids']}   (read by {', '.join(f['read_by'])})")
    rows = w.get("engines") or []
    specs = {r["engine"] for r in rows}
    fixes = [(r.get("finding") or {}).get("fix") for r in rows]
    shared_fix = fixes[0] if len({f for f in fixes if f}) == 1 and sum(bool(f) for f in fixes) > 1 else None
    if rows:
        lines.append("per engine release (what each captures from this config):")
    shared = [r for r in rows if r["release"] == (r.get("releases") or [r["release"]])[0]]  # one row per group
    for r, fix in zip(rows, fixes):
        if r not in shared:
            continue
        lines.append("  " + _row_line(r, releases_label(r.get("releases") or [r["release"]])))
        if r.get("release_note"):
            lines.append(f"       note: {r['release_note']}")
        if r.get("runner_assumed") and verbose:
            lines.append(f"       runner: {r['runner_assumed']}")
        if fix and not shared_fix:
            lines.append(f"       fix: {fix}")
        serve = r.get("serve")
        if serve:
            lines.append(f"       {'CANNOT SERVE' if serve['code'] == CANNOT_SERVE else 'serves'}: {serve['message']}"
                         + (f" ({serve['fix']})" if serve.get("fix") else ""))
        if verbose:
            for note in r.get("notes") or []:
                lines.append(f"       ({note})")
    if shared_fix:
        lines.append(f"  fix (every BAD row): {next(f for f in fixes if f)}")
    for f in w.get("findings", []):
        if f.get("subject") in specs or (rows and f["level"] == "ok"):
            continue  # said on its row (a release's problem, or that its ids are as trained)
        tag = {"ok": "ok", "notice": "note", "warning": "warning", "error": "ERROR"}[f["level"]]
        lines.append(f"{tag}: {f['message']}")
        if f.get("fix") and f["level"] != "ok":
            lines.append(f"  fix: {f['fix']}")
    for r in w.get("refused") or []:
        lines.append(f"REFUSED: {r}")
    return lines


def smoke_text(r) -> str:
    """``verify`` without states (an :class:`eagle3conv.verify.run.SmokeResult`): the smoke test's
    fields, then the wiring report."""
    f = r.forward
    ok = str(r.ok)
    if not r.ok:
        why = [what for what, good in (("the forward", r.forward_ok), ("the wiring", r.wiring_ok)) if good is False]
        clean = "; the forward itself ran clean" if r.forward_ok is not False else ""
        ok = f"False ({' and '.join(why)} failed{clean})"
    lines = [f"checkpoint: {r.checkpoint}", f"ok: {ok}",
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


def _count(findings: list[dict]) -> str:
    return _counted(sum(f["level"] == "error" for f in findings), sum(f["level"] == "warning" for f in findings))


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
    d = res.to_dict()
    w = d["wiring"]
    wr = w.get("written")
    lines = [config_verdict_words(res.verdict()), f"checkpoint: {d['checkpoint']}"]
    if d.get("recovered"):
        lines.append(f"recovered:  {d['recovered']}")
    t = d.get("target")
    lines.append(f"target:     {t['name']} ({t['num_hidden_layers']} layers, hidden {t['hidden_size']})" if t
                 else "target:     not given (--target): layer ranges and engine defaults not checked")
    if verbose:
        for r in d["records"]:
            lines.append(f"record:     {r['described']}")
    lines += wiring_lines(w, verbose=verbose)
    if d["mode"] == "check":
        return "\n".join(lines)
    if wr:
        for e in wr["config_edits"]:
            lines.append("config.json: " + edit_line(e))
        launch = wr.get("launch") or {}
        if launch:
            lines.append("launch:")
            for name, key in (("SGLang", "sglang"), ("vLLM", "vllm"), ("TensorRT-LLM", "tensorrt_llm")):
                if key in launch:
                    lines.append(f"  {name + ':':<14} {launch[key]}")
                elif f"{key}_refused" in launch:
                    lines.append(f"  {name + ':':<14} no line: {launch[key + '_refused']}")
    if d["mode"] == "dry-run":
        lines.append("dry run: nothing written")
    else:
        lines.append("wrote: " + (", ".join(d["written"]) if d["written"] else "nothing (no changes)"))
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


def inspect_text(res: InspectResult, *, verbose: bool = False) -> str:
    """``inspect`` (an :class:`~eagle3conv.api.InspectResult`) for people."""
    d = res.to_dict()
    plan = d.get("plan")
    if "plan_error" in d:  # the error leads the report, whatever else was read
        verdict = f"inspect: fix-keys cannot plan: {d['plan_error'].get('message')}"
    elif plan is not None:
        verdict = (f"inspect: a {plan['format']} checkpoint ({plan['format_title']}); "
                   f"{plan_verdict_words(res.verdict())}")
    else:
        verdict = "inspect: read"
    lines = [verdict, f"checkpoint: {d['checkpoint']}",
             f"layout:     {d['layout']} ({len(d['weight_files'])} weight file(s))"]
    if d.get("recovered"):
        lines.append(f"recovered:  {d['recovered']}")
    if d["wrapper"]:
        lines.append(f"wrapper:    weights under '{d['wrapper']}'")
    lines.append(f"tensors:    {len(d['tensors'])}, {human_bytes(d['total_bytes'])}")
    shown = d["tensors"] if verbose else d["tensors"][:200]
    width = max((len(t["name"]) for t in shown), default=10)
    for t in shown:
        lines.append(f"  {t['name']:<{width}}  {t['dtype']:>5}  {str(t['shape']):<18} {human_bytes(t['bytes']):>10}")
    if len(shown) < len(d["tensors"]):
        lines.append(f"  … {len(d['tensors']) - len(shown)} more (--verbose or --json for all)")
    cfg = d["config"]
    if cfg is None:
        lines.append("config:     none")
    else:
        lines.append("config:     " + ", ".join(f"{k}={v}" for k, v in cfg.items() if k not in ("eagle_config",)))
        if "eagle_config" in cfg:
            lines.append(f"            eagle_config={cfg['eagle_config']}")
    if d["other_files"]:
        lines.append("other files: " + ", ".join(d["other_files"]))
    if plan is not None:
        lines.append("")
        lines.append("aux layers:")
        lines += ["  " + line for line in wiring_lines(plan.get("wiring"), verbose=verbose)]
        lines.append("")
        lines.append("what fix-keys would do:")
        lines += ["  " + line for line in _plan_lines(plan, res.plan, verbose=verbose)]
    if "plan_error" in d:
        pe = d["plan_error"]
        if pe.get("hint"):
            lines.append(f"hint: {pe['hint']}")
    return "\n".join(lines)


def quantization_lines(q: dict | None) -> list[str]:
    """A quantized drafter: the scheme, and per release whether it serves it as stored and the draft
    quantization option to launch it with."""
    if not q:
        return []
    left = ", ".join(q["quantized"]) or "none"
    lines = [f"quantized: {q['title']} ({q['method']} {q['algo']}): {left}"
             + (f"; written in bf16: {', '.join(q['dequantized'])}" if q["dequantized"] else "")]
    for r in q["releases"]:
        tell = f"launch with {r['option']} {r['value']}" if r["option"] and r["value"] else "no option to set"
        lines.append(f"           {r['release']}: {'serves it as stored' if r['serves_as_defined'] else 'CANNOT serve it as stored'}"
                     f"; {tell}")
    return lines


def fix_text(res: FixResult, *, verbose: bool = False) -> str:
    """fix-keys (a :class:`~eagle3conv.api.FixResult`): what it did in one line, then the summary; the
    per-key plan with --verbose or --dry-run (inspect shows it before)."""
    d = res.to_dict()
    plan = dict(d["plan"], shards=d["shards"])
    if d["mode"] == "dry-run":
        lines = [f"fix-keys (dry run, nothing written): "
                 f"{plan_verdict_words(res.verdict()).removeprefix('fix-keys ')}"]
        if d.get("recovered"):
            lines.append(f"recovered: {d['recovered']}")
        lines += _plan_lines(plan, res.plan)
        return "\n".join(lines)
    if d["unchanged"]:
        lines = [f"fix-keys: {d['output']} is already SGLang-ready; left byte-for-byte unchanged"]
    else:
        lines = [f"fix-keys: wrote {d['output']}: {len(d['files'])} files, {human_bytes(d['bytes_written'])}; "
                 f"{d['tensors_verified']} tensors re-read and proven equal to their source"]
    if d.get("recovered"):
        lines.append(f"recovered: {d['recovered']}")
    if verbose:
        lines += _plan_lines(plan, res.plan)
        return "\n".join(lines)
    lines.append(f"format:   {plan['format']} — {plan['format_title']}")
    counts: dict[str, int] = {}
    for dec in plan["decisions"]:
        counts[dec["action"]] = counts.get(dec["action"], 0) + 1
    lines.append("keys:     " + ", ".join(f"{n} {a}" for a, n in sorted(counts.items()))
                 + "  (--verbose lists them)")
    written = (plan.get("wiring") or {}).get("written")
    for f in (written or {}).get("ids", []):
        where = f["field"] if f["kind"] == "config" else f"launch option {f['field']}"
        lines.append(f"aux ids:  {where} = {f['ids']}   (read by {', '.join(f['read_by'])})")
    for e in plan["config_edits"]:
        lines.append("config.json: " + edit_line(e))
    lines += quantization_lines(plan.get("quantization"))
    for n in res.plan.notices:
        lines.append(f"note:     {n}")
    return "\n".join(lines)


def confidence_set_lines(v: dict) -> list[str]:
    """The verdict's confidence set for people: the first 12 members, then how many more (the
    report lists the screen's unconfirmed survivors up to a cap and counts them all)."""
    members = v.get("confidence_set") or []
    lines = [f"not excluded at 95% against the best ({v.get('set_statistic')}, paired over sequences):"]
    for c in members[:12]:
        lines.append(f"  {c['layers']}" + (f": accept length {c['accept_length_all_starts']:.4f} over every chain "
                                           "start" if c.get("confirmed") else ": kept by the screen, not confirmed"))
    total = max(len(members), int((v.get("to_separate") or {}).get("members") or 0))
    if total > 12:
        unlisted = total - len(members)
        lines.append(f"  ... and {total - 12} more" + (f" ({unlisted} of them kept by the screen or refinement, "
                                                      "counted but not listed)" if unlisted else ""))
    return lines


def category_lines(per: dict | None) -> list[str]:
    """verify's per-category figures (the main wiring), one line per prompt category."""
    if not per:
        return []
    out = ["  per prompt category (accept length, then acceptance per draft position; 95% intervals):"]
    width = max(len(name) for name in per)
    for name, c in per.items():
        lo, hi = c["accept_length_ci95"]
        acc = ", ".join(f"{a:.3f} [{alo:.3f}, {ahi:.3f}]" for a, (alo, ahi) in zip(c["acceptance_per_position"],
                                                                                  c["acceptance_ci95"]))
        out.append(f"    {name:<{width}}  {c['accept_length']:.3f} [{lo:.3f}, {hi:.3f}]  {acc}  "
                   f"({c['sequences']} sequences, {c['positions_scored']} positions)")
    return out


def _scored_block(r: dict, row: dict, unchecked: bool) -> list[str]:
    """One engine release's scored row (its label a placeholder, the NUL character) and the lines under it."""
    mark = _MARK.get((row.get("finding") or {}).get("level"), "ok  ")
    if unchecked and mark == "ok  ":
        mark = "n/a "  # the slots were labelled with the config's own ids: nothing here checks them
    if "accept_length" in r:
        lines = [f"  {mark} \0: {row.get('captures')}: accept length {r['accept_length']:.3f}, "
                 f"step-1 acceptance {r['acceptance'][0]:.3f}"]
    else:  # not scored: its config row may be fine, but these states say nothing of how it serves
        mark = mark if mark != "ok  " else "?   "
        lines = [f"  {mark} \0: not scored: {r['not_scored']}"]
    for e in r.get("emulated") or []:
        lines.append(f"    runs differently: {e}")
    for e in r.get("not_emulated") or []:
        lines.append(f"    not emulated: {e}")
    if r.get("not_read"):
        lines.append(f"    not in the engine rules ({'; '.join(r['not_read'])}): run as SGLang does")
    return lines


def verify_text(d: dict) -> str:
    """A verify report (VerifyResult.to_dict()) for people."""
    st = d["states"]
    m = d["results"][0]
    lo_, hi_ = m["accept_length_ci95"]
    unchecked = st.get("wiring_checked") is False
    lines = [("verify: these states cannot check the wiring (they do not record their slots' layers: pass "
              "--states-layers); " if unchecked else "verify: ")
             + f"accept length {m['accept_length']:.3f} [{lo_:.3f}, {hi_:.3f}], step-1 acceptance "
             f"{m['acceptance_per_position'][0]:.3f}, on {m['described']}"
             + ("" if d.get("passed", True) else f" -- below --min-accept {d['min_accept']}")
             + ("" if d["wiring_check"].get("ok", True) else "; the wiring check FAILED (below)"),
             f"checkpoint: {d['checkpoint']}",
             f"states:     {st.get('path')} ({st.get('source')}; {st.get('sequences')} sequences, "
             f"{st.get('tokens')} tokens; " + (f"target {st['target']})" if st.get("target") else
                                               "the states name no target)"),
             f"ran on:     {d['device']}, {d['dtype']}, {d['steps']} draft steps; {d['statistic']}"]
    if st.get("layers_from"):
        lines.append(f"layers:     from {st['layers_from']}"
                     + ("; the wiring check rests on that statement" if "--states-layers" in st["layers_from"] else ""))
    qz = d.get("quantization")
    if qz:
        ci = qz.get("ci95")
        lines.append(f"quantized:  accept length {qz['accept_length']:.3f} vs {qz['reference_accept_length']:.3f} for "
                     f"the bf16 reference {qz['reference']}: {qz['difference']:+.4f}"
                     + (f" [{ci[0]:+.4f}, {ci[1]:+.4f}] (paired 95%)" if ci else ""))
    for n in st.get("verify_notes") or []:
        lines.append(f"note:       {n}")
    for n in st.get("notes") or []:
        lines.append(f"note:       {n}")
    w = d["wiring_check"]
    rows = {r["engine"]: r for r in w.get("engines") or []}
    scored = w.get("engine_scores") or []
    if scored:
        lines.append("per engine release (what each captures from this config, scored on these states):")
    blocks = [_scored_block(r, rows.get(r["engine"]) or {}, unchecked) for r in scored]
    for group in alike(zip(scored, blocks), lambda x: x[0]["release"].split(" ")[0],
                       lambda x: (tuple((rows.get(x[0]["engine"]) or {}).get("releases") or ()) or x[0]["release"],
                                  x[1])):
        head, *rest = group[0][1]
        lines.append(head.replace("\0", releases_label([x[0]["release"] for x in group]), 1))
        lines += rest
    for f in w.get("findings", []):
        if f["level"] != "ok":
            lines.append(f"wiring {f['level']}: {f['message']}")
            if f.get("fix"):
                lines.append(f"  fix: {f['fix']}")
    for i, r in enumerate(d["results"]):
        head = "wiring" if i == 0 else "candidate"
        acc = ", ".join(f"{a:.3f} [{lo:.3f}, {hi:.3f}]" for a, (lo, hi) in zip(r["acceptance_per_position"],
                                                                              r["acceptance_ci95"]))
        lo, hi = r["accept_length_ci95"]
        if i == 1:
            lines.append("")
            lines.append("wiring search (accept length over every chain start, the figure wirings are ranked by):")
        if i == 0:
            lines.append("")
            lines.append(f"{head}: {r['described']} — {r['why']}")
            lines.append(f"  acceptance per draft position: {acc}")
            alo, ahi = r["accept_length_all_starts_ci95"]
            lines.append(f"  accept length: {r['accept_length']:.3f} [{lo:.3f}, {hi:.3f}] tokens per target forward "
                         f"(greedy chain decoding replayed: {r['rounds']} rounds)")
            lines.append(f"  over every chain start: {r['accept_length_all_starts']:.3f} [{alo:.3f}, {ahi:.3f}] "
                         f"({r['chains']} chains, {r['positions_scored']} positions, {r['sequences']} sequences; "
                         f"{r['ci_method']})")
            for s, nm in enumerate(r["norms"]):
                if nm.get("median") is not None:
                    lines.append(f"  slot {s} ({r['layers'][s]['output_of']}): norm median {nm['median']:.4g} "
                                 f"(p10 {nm['p10']:.4g}, p90 {nm['p90']:.4g})")
            for c in r.get("norm_comparison") or []:
                mark = "  <-- out of line" if c["flagged"] else ""
                lines.append(f"  slot {c['slot']} vs training: {c['inference_median']:.4g} vs "
                             f"{c['training_median']:.4g} ({c['ratio']}x){mark}")
            lines += category_lines(d.get("per_category"))
        else:
            alo, ahi = r["accept_length_all_starts_ci95"]
            lines.append(f"  {r['accept_length_all_starts']:.3f} [{alo:.3f}, {ahi:.3f}]  step-1 "
                         f"{r['acceptance_per_position'][0]:.3f}  {r['wiring']}: {r['described']}")
    v = d["verdict"]
    lines.append("")
    for f in v.get("norm_flags", []):
        lines.append(f"norm flag: {f}")
    for pd in (v.get("paired_differences") or [])[:4]:
        lo, hi = pd["ci95"]
        lines.append(f"best vs {pd['wiring']} ({pd['layers']}): accept length +{pd['accept_length_gap']:.3f} "
                     f"[{lo:+.3f}, {hi:+.3f}] (paired)")
    status = v.get("status")  # eagle3conv.verify.search.Verdict: named / stands / ambiguous / undecided / None
    cov = v.get("coverage")
    if cov:
        lines.append(cov.get("summary") or (f"search: {cov['screened']} wirings screened, {cov['confirmed']} "
                                            f"confirmed (not global: the states lack layers "
                                            f"{', '.join(map(str, cov['missing_layers'][:8]))})"))
    if cov and cov.get("screen"):
        sc = cov["screen"]
        stages = sc.get("stages") or []
        lines.append(f"screen: {cov.get('screen_kept', '?')} of {cov['screened']} wirings not excluded after "
                     + " -> ".join(f"{st['kept']} at {st['positions']}" for st in stages[:8])
                     + " positions; " + sc.get("guarantee", ""))
    ref = (cov or {}).get("refinement")
    if ref:
        tried = sum(r.get("tried", 0) for r in ref.get("rounds", []))
        lines.append(f"local refinement: {tried} wirings one slot from a leader compared with the best, "
                     f"{ref.get('confirmed', 0)} confirmed"
                     + (f", {len(ref['not_confirmed'])} kept but not confirmed" if ref.get("not_confirmed") else ""))
    members = v.get("confidence_set") or []
    if len(members) > 1:
        lines += confidence_set_lines(v)
    elif v.get("tied_set"):
        lines.append(f"tied (acceptance cannot separate): {'; '.join(v['tied_set'][:6])}")
    if status == "named" or (status == "stands" and len(members) <= 1):
        lines.append(f"trained on (most likely): {v['best_layers']} — decided by {v['decided_by']}")
    elif status == "stands":  # in a set of several: not excluded, which is not "most likely"
        lines.append(f"stands (in the set, not singled out by the data): {v['best_layers']} — {v['decided_by']}")
    elif status in ("ambiguous", "undecided"):
        lines.append(f"wiring search: {v['decided_by']}")
    if status in ("named", "stands", "ambiguous", "undecided") and v.get("advice"):
        lines.append(f"fix: {v['advice']}")
    if d["min_accept"] is not None:
        lines.append(f"threshold: step-1 acceptance >= {d['min_accept']}: {'passed' if d['passed'] else 'FAILED'}")
    if d.get("profile"):
        lines.append(f"acceptance profile: {d['profile']} (speculation_profile.json, schema 1.0)")
    s = d["seconds"]
    lines.append(f"time: first result {s['first_result']:.2f} s, total {s['total']:.2f} s")
    return "\n".join(lines)


def launch_check_lines(c: dict) -> list[str]:
    """A checked launch line (LaunchCheck.to_dict()): its verdict, each finding with its fix, the corrected line."""
    lines = [f"launch check for {c['label']}: {'passed' if c['ok'] else 'FAILED'} ({_count(c['findings'])})"]
    if c.get("option_names_note"):
        lines.append(f"note: {c['option_names_note']}")
    for f in c["findings"]:
        tag = {"error": "ERROR", "warning": "warning", "notice": "note", "ok": "ok"}[f["level"]]
        lines.append(f"{tag}: {f['message'].removeprefix(c['label'] + ': ')}")
        if f.get("fix"):
            lines.append(f"  fix: {f['fix']}")
    if not c["findings"]:
        lines.append("no problem found")
    lines.append("checked: " + "; ".join(c["checked"]))
    if c.get("corrected"):
        lines.append(f"corrected: {c['corrected']}")
    return lines


def alike_rows(rows: list[dict]) -> list[dict]:
    """Launch rows with neighbouring releases of one engine that print the same line (and the same needs,
    file and refusal) merged into one row labelled with every release: ``sglang 0.5.12, 0.5.23``."""
    out: list[dict] = []

    def same(a: dict, b: dict) -> bool:
        strip = [[x.removeprefix(r["label"] + " ") for x in r["refused"]] for r in (a, b)]
        return (a["label"].split()[0] == b["label"].split()[0] and strip[0] == strip[1]
                and all(a[k] == b[k] for k in ("line", "needs", "extra_file", "extra_text")))

    for r in rows:
        if out and same(out[-1]["_last"], r):
            out[-1]["label"] += ", " + r["label"].split(" ", 1)[-1]
            out[-1]["_last"] = r
            continue
        out.append(dict(r, refused=[x.removeprefix(r["label"] + " ") for x in r["refused"]], _last=r))
    return out


def launch_text(d: dict) -> str:
    """``eagle3conv launch`` (LaunchResult.to_dict()): the check's verdict first (with --check), then one
    row per engine release (its line, or why it cannot serve the drafter), then the check's findings."""
    rows = d["rows"]
    served = [r for r in rows if r["line"]]
    checked = launch_check_lines(d["check"]) if d.get("check") else None
    head = checked[0] if checked else f"launch: {len(served)} of {len(rows)} engine releases serve this drafter"
    lines = [head, f"checkpoint: {d['checkpoint']}",
             f"target:     {d['target'] or 'not given (--target): TARGET in the lines'}"]
    for n in d.get("notes") or []:
        lines.append(f"note:       {n}")
    lines.append("per engine release:")
    for r in alike_rows(rows):
        if r["line"] is None:
            lines.append(f"  BAD  {r['label']}: cannot serve it: " + "; ".join(r["refused"]))
            continue
        lines.append(f"  ok   {r['label']}: {r['line']}")
        for need in r["needs"]:
            lines.append(f"       needs {need}")
        if r.get("extra_text"):
            lines.append(f"       {r['extra_file']}:")
            lines += [f"         {x}" for x in r["extra_text"].splitlines()]
    if checked:
        lines += checked[1:]
    return "\n".join(lines)
