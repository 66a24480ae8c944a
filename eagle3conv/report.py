"""Result objects → text for people. (JSON is each result's ``to_dict``.)"""

from __future__ import annotations


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _plan_lines(plan: dict, *, verbose: bool = True) -> list[str]:
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
            lines.append(f"  {e['field']}: {e['old']!r} -> {e['new']!r}   ({e['why']})")
    else:
        lines.append("config.json: no changes")
    if plan.get("shards"):
        lines.append("output files:")
        for s in plan["shards"]:
            lines.append(f"  {s['file']}: {len(s['tensors'])} tensors")
    lines.append(f"output:   {len(plan['outputs'])} tensors, {human_bytes(plan['output_bytes'])}")
    for n in plan["notices"]:
        lines.append(f"note:     {n}")
    for e in plan["errors"]:
        lines.append(f"ERROR:    {e}")
    return lines


def inspect_text(d: dict) -> str:
    lines = [f"checkpoint: {d['checkpoint']}", f"layout:     {d['layout']} ({len(d['weight_files'])} weight file(s))"]
    if d.get("recovered"):
        lines.append(f"recovered:  {d['recovered']}")
    if d["wrapper"]:
        lines.append(f"wrapper:    weights under '{d['wrapper']}'")
    lines.append(f"tensors:    {len(d['tensors'])}, {human_bytes(d['total_bytes'])}")
    width = max((len(t["name"]) for t in d["tensors"]), default=10)
    for t in d["tensors"][:200]:
        lines.append(f"  {t['name']:<{width}}  {t['dtype']:>5}  {str(t['shape']):<18} {human_bytes(t['bytes']):>10}")
    if len(d["tensors"]) > 200:
        lines.append(f"  … {len(d['tensors']) - 200} more (use --json for all)")
    cfg = d["config"]
    if cfg is None:
        lines.append("config:     none")
    else:
        lines.append("config:     " + ", ".join(f"{k}={v}" for k, v in cfg.items() if k not in ("eagle_config",)))
        if "eagle_config" in cfg:
            lines.append(f"            eagle_config={cfg['eagle_config']}")
    if d["other_files"]:
        lines.append("other files: " + ", ".join(d["other_files"]))
    if "plan" in d:
        lines.append("")
        lines.append("what fix-keys would do:")
        lines += ["  " + line for line in _plan_lines(d["plan"])]
        if d["plan"]["identity"]:
            lines.append("  already SGLang-ready: fix-keys would change nothing")
    if "plan_error" in d:
        pe = d["plan_error"]
        lines.append(f"fix-keys cannot plan: {pe.get('message')}")
        if pe.get("hint"):
            lines.append(f"hint: {pe['hint']}")
    return "\n".join(lines)


def fix_text(d: dict) -> str:
    lines = []
    if d.get("recovered"):
        lines.append(f"recovered: {d['recovered']}")
    if d["mode"] == "dry-run":
        lines.append("dry run: nothing written")
        plan = dict(d["plan"], shards=d["shards"])
        lines += _plan_lines(plan)
        if d["unchanged"]:
            lines.append("already SGLang-ready: fix-keys would change nothing")
        return "\n".join(lines)
    plan = dict(d["plan"], shards=d["shards"])
    lines += _plan_lines(plan, verbose=False)
    if d["unchanged"]:
        lines.append(f"already SGLang-ready: {d['output']} left byte-for-byte unchanged")
    else:
        lines.append(
            f"wrote {d['output']}: {len(d['files'])} files, {human_bytes(d['bytes_written'])}; "
            f"{d['tensors_verified']} tensors re-read and proven equal to their source"
        )
    return "\n".join(lines)
