"""The model card's precision section for a quantized drafter: the scheme stored, how each checked
release serves it (and the option to tell it), and the cost verify measured against a bf16 reference
(docs/facts.md §14). Empty for a bf16 drafter."""

from __future__ import annotations

from pathlib import Path


def quantization_facts(folder: str | Path, config: dict) -> dict | None:
    """What the section states, read from config.json and the weights' names (headers only)."""
    from eagle3conv.errors import Eagle3ConvError
    from eagle3conv.spec import quant as q
    from eagle3conv.spec.drafter import architecture_key
    from eagle3conv.spec.engines import default_engines

    try:
        qc = q.read_quant_config(config, None)
    except Eagle3ConvError as err:
        return {"problem": err.message}
    if qc is None:
        return None
    from eagle3conv.checkpoint.index import open_checkpoint

    try:
        names = set(open_checkpoint(Path(folder)).tensors)
    except Eagle3ConvError:
        names = set()
    modules = sorted({q.split_name(n)[0] for n in names if q.is_companion(n)})
    bf16 = sorted({n.removesuffix(".weight") for n in names if n.endswith(".weight")} - set(modules)
                  - {"embed_tokens"})
    arch = architecture_key(config, names)
    rows = []
    for rel in default_engines():
        eq = q.engine_quant(rel.engine, rel.version, arch)
        if eq is None or eq.modules is None:
            rows.append((str(rel), "not read", "-"))
            continue
        raw = [m for m in modules if eq.handles(q.role_of(m)) == "raw_codes"]
        serves = ("as stored" if not raw else
                  f"**no**: it builds {', '.join(raw)} unquantized (run `eagle3conv fix-keys --dequantize "
                  f"{','.join(raw)}` for it)")
        value = eq.option_value(qc)
        option = f"`{eq.option['flag']} {value}`" if eq.option and value else "-"
        rows.append((str(rel), serves, option))
    return {"label": qc.label, "modules": modules, "bf16": bf16, "rows": rows,
            "companions": sorted(n for n in names if q.is_companion(n))}  # the launch lines read them


def quantization_section(quant: dict | None, report_document: dict | None) -> list[str]:
    if quant is None:
        return []
    out = ["### Precision", ""]
    if "problem" in quant:
        return out + [f"Quantized, in a layout eagle3conv does not read: {quant['problem']}."]
    out += [f"Weights stored as {quant['label']}: {', '.join(f'`{m}`' for m in quant['modules'])}; held in bf16: "
            f"{', '.join(f'`{m}`' for m in quant['bf16']) or 'none'}.", "",
            "| release | serves it | draft quantization option |", "|---|---|---|"]
    out += [f"| {r} | {s} | {o} |" for r, s, o in quant["rows"]]
    cost = (report_document or {}).get("quantization")
    out.append("")
    if cost:
        ci = cost.get("ci95")
        out.append(f"Cost of quantization (`eagle3conv verify --reference {cost['reference']}`): accept length "
                   f"{cost['accept_length']:.3f} vs {cost['reference_accept_length']:.3f} for the bf16 original, "
                   f"{cost['difference']:+.3f}" + (f" (paired 95% interval {ci[0]:+.3f} to {ci[1]:+.3f})" if ci else "")
                   + ".")
    else:
        out.append("Cost of quantization: not measured (run `eagle3conv verify --reference BF16_DRAFTER` on "
                   "captured states before pushing).")
    return out


__all__ = ["quantization_facts", "quantization_section"]
