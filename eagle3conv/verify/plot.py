"""``verify --plot``: the wiring search drawn, per aux slot.

For each slot, the step-1 acceptance of every layer the search screened there
(the best screened wiring reading that layer in that slot; the verdict's
``coverage.slot_profile``), the winner's layer marked; then each slot's
inference norm median next to the training record's. SVG is written by
eagle3conv itself (no dependency); PNG needs matplotlib (``pip install
eagle3conv[plot]``). Both work from the ``verify`` report dictionary
(:meth:`eagle3conv.verify.report.VerifyResult.to_dict`).
"""

from __future__ import annotations

import io
import os
from html import escape
from pathlib import Path

from eagle3conv.errors import UsageError

FORMATS = (".svg", ".png")


def check_plot_path(path: str | os.PathLike) -> Path:
    """The plot's path, checked before any work: a known suffix, an existing folder, and
    matplotlib for PNG."""
    import stat
    import tempfile

    p = Path(path)
    if p.suffix.lower() not in FORMATS:
        raise UsageError(f"--plot {path}: the file must end in .svg or .png")
    if not p.parent.is_dir():
        raise UsageError(f"--plot {path}: the folder {p.parent} does not exist")
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise UsageError(f"--plot {path}: cannot use that path: {e.strerror}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a link" if stat.S_ISLNK(st.st_mode) else \
            "not a regular file"
        raise UsageError(f"--plot {path}: {kind}; the figure is written as a new regular file",
                         hint="give the path of a new .svg or .png file")
    try:  # can a file be made there at all (a read-only or virtual file system such as /proc)?
        fd, probe = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"--plot {path}: cannot write a file in {p.parent}: {e.strerror or e}",
                         hint="write the figure to a folder you can write") from None
    if p.suffix.lower() == ".png":
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError(f"--plot {path}: PNG needs matplotlib, which is not installed",
                             hint="pip install 'eagle3conv[plot]', or write an SVG (no dependency): "
                                  f"--plot {p.with_suffix('.svg')}") from None
    return p


def _panels(d: dict) -> tuple[list[list[tuple[int, float]]], list[int | None], list[tuple[float | None, float | None]]]:
    v = d.get("verdict") or {}
    profile = (v.get("coverage") or {}).get("slot_profile")
    if not profile:
        why = (v.get("decided_by") if v.get("status") == "undecided" else
               "the wiring search did not run (it needs states that name the layers of their slots)")
        raise UsageError(f"--plot: there is no wiring search to draw: {why}")
    chosen = v.get("best_layers") or v.get("best_found")
    res = next((r for r in d.get("results", []) if r.get("described") == chosen), None) or d["results"][0]
    winner = [x["output_of"] for x in res["layers"]]
    cmp = res.get("norm_comparison") or []
    norms = []
    for s in range(len(profile)):
        inf = res["norms"][s]["median"] if s < len(res["norms"]) else None
        tr = cmp[s]["training_median"] if s < len(cmp) else None
        norms.append((inf, tr))
    curves = [[(x["output_of"], x["step1_acceptance"]) for x in slot] for slot in profile]
    return curves, winner, norms


def svg(d: dict) -> str:
    """The plot as an SVG document."""
    curves, winner, norms = _panels(d)
    k = len(curves)
    W, ph, pad, top = 720, 170, 48, 34
    H = top + (k + 1) * (ph + 30) + 10
    xs = [x for c in curves for x, _ in c]
    x0, x1 = min(xs), max(max(xs), min(xs) + 1)
    ymax = max([a for c in curves for _, a in c] + [1e-9])
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           'font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{pad}" y="20" font-size="14">{escape("wiring search: step-1 acceptance per layer, per slot")}'
           '</text>']

    def px(x: float) -> float:
        return pad + (x - x0) / (x1 - x0) * (W - 2 * pad)

    for s, curve in enumerate(curves):
        y0 = top + s * (ph + 30)

        def py(a: float) -> float:
            return y0 + ph - a / ymax * (ph - 10)

        out.append(f'<rect x="{pad}" y="{y0}" width="{W - 2 * pad}" height="{ph}" fill="none" stroke="#999"/>')
        out.append(f'<text x="{pad}" y="{y0 - 4}">slot {s}: best step-1 acceptance of any screened wiring '
                   f'reading that layer (winner: {winner[s] if s < len(winner) else "?"})</text>')
        pts = " ".join(f"{px(x):.1f},{py(a):.1f}" for x, a in curve)
        out.append(f'<polyline points="{pts}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>')
        for x, a in curve:
            hot = s < len(winner) and x == winner[s]
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(a):.1f}" r="{4 if hot else 2}" '
                       f'fill="{"#d62728" if hot else "#1f77b4"}"><title>layer {x}: {a:.4f}</title></circle>')
        for x, _ in curve[:: max(1, len(curve) // 16)]:
            out.append(f'<text x="{px(x):.1f}" y="{y0 + ph + 12}" text-anchor="middle">{x}</text>')
        out.append(f'<text x="{pad - 4}" y="{py(ymax):.1f}" text-anchor="end">{ymax:.2f}</text>')
        out.append(f'<text x="{pad - 4}" y="{py(0):.1f}" text-anchor="end">0</text>')
    y0 = top + k * (ph + 30)
    nmax = max([v for pair in norms for v in pair if v] + [1e-9])
    out.append(f'<text x="{pad}" y="{y0 - 4}">per slot: inference norm median (blue) vs training record '
               '(orange, when recorded)</text>')
    bw = (W - 2 * pad) / max(1, k) / 3
    for s, (inf, tr) in enumerate(norms):
        bx = pad + s * 3 * bw + bw / 2
        for j, (val, col) in enumerate(((inf, "#1f77b4"), (tr, "#ff7f0e"))):
            if val:
                h = val / nmax * (ph - 10)
                out.append(f'<rect x="{bx + j * bw:.1f}" y="{y0 + ph - h:.1f}" width="{bw * 0.9:.1f}" '
                           f'height="{h:.1f}" fill="{col}"><title>{val:.4g}</title></rect>')
        out.append(f'<text x="{bx + bw:.1f}" y="{y0 + ph + 12}" text-anchor="middle">slot {s}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_plot(d: dict, path: str | os.PathLike) -> Path:
    """Draw the report ``d`` to ``path`` (.svg by eagle3conv, .png by matplotlib), atomically."""
    from eagle3conv.io.files import atomic_write_bytes, atomic_write_text

    p = check_plot_path(path)
    if p.suffix.lower() == ".svg":
        return atomic_write_text(p, svg(d))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves, winner, norms = _panels(d)
    fig, axes = plt.subplots(len(curves) + 1, 1, figsize=(8, 2.2 * (len(curves) + 1)))
    for s, (ax, curve) in enumerate(zip(axes, curves)):
        ax.plot([x for x, _ in curve], [a for _, a in curve], marker=".")
        if s < len(winner):
            ax.axvline(winner[s], color="red", lw=1)
        ax.set_title(f"slot {s}: best step-1 acceptance per layer", fontsize=9)
    ax = axes[-1]
    ax.bar([s - 0.2 for s in range(len(norms))], [a or 0 for a, _ in norms], 0.4, label="inference")
    ax.bar([s + 0.2 for s in range(len(norms))], [b or 0 for _, b in norms], 0.4, label="training")
    ax.legend(fontsize=8)
    ax.set_title("norm median per slot", fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return atomic_write_bytes(p, buf.getvalue())


__all__ = ["FORMATS", "check_plot_path", "svg", "write_plot"]
