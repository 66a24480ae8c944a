"""Gather runs of ``search_side_by_side.sh`` into one results file and print the README's table.

    python bench/smollm2/search_side_by_side_summary.py "WHAT" bench/results/NAME OUTDIR [OUTDIR ...]

Each OUTDIR is one run of the script (its summary.tsv and one report per tree, drafter and mode);
NAME.tsv gets every row of them, run by run, and NAME.json per command its wall seconds, peak
memory, load and the report's own figures (for a search: the screen's seconds per stage and work,
the confirmations, the set). The table printed: per run, drafter and tree, the plain verify, the
search, its screen and confirmations, the set and the ratio of the two wall times."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def wall_seconds(text: str) -> float:
    """``/usr/bin/time``'s ``m:ss.ss`` (or ``h:mm:ss``) as seconds."""
    parts = [float(p) for p in text.split(":")]
    return round(sum(p * 60 ** i for i, p in enumerate(reversed(parts))), 2)


def main(argv: list[str]) -> int:
    what, out, dirs = argv[0], Path(argv[1]), [Path(d) for d in argv[2:]]
    runs: dict[str, dict] = {}
    rows = ["run\ttree\tdrafter\tmode\twall_s\tmax_rss_kb\tload_before\tload_after\tstatus\tset_size\tbest"]
    for k, d in enumerate(dirs, 1):
        for line in (d / "summary.tsv").read_text().splitlines()[1:]:
            tree, drafter, mode, wall, rss, before, after, *_ = line.split("\t")
            rows.append(f"run{k}\t{line}")
            r = json.loads((d / f"{tree}-{drafter}-{mode}.json").read_text())
            e = {"wall_s": wall_seconds(wall), "max_rss_kb": int(rss), "load_before": before, "load_after": after,
                 "dtype": r.get("dtype"), "seconds": r.get("seconds"), "accept_length": r.get("accept_length")}
            v = r.get("verdict")
            if mode == "search" and v:
                c = v["coverage"]
                e.update({"status": v.get("status"), "set_size": (v.get("to_separate") or {}).get("members"),
                          "best_found": v.get("best_layers") or v.get("best_found"),
                          "screen_seconds": c.get("screen_seconds"), "screen_work": c["screen"].get("work"),
                          "screen_stage_seconds": [st["seconds"] for st in c["screen"]["stages"]],
                          "confirmed": len(r["results"]),
                          "confirm_seconds": round(sum(x["seconds"] for x in r["results"]), 2),
                          "set": [m.get("layers") for m in v.get("confidence_set") or []]})
            runs[f"run{k}-{tree}-{drafter}-{mode}"] = e
    out.with_suffix(".json").write_text(json.dumps({"what": what, "runs": runs}, indent=1))
    out.with_suffix(".tsv").write_text("\n".join(rows) + "\n")
    for key, s in runs.items():
        p = runs.get(key[:-len("search")] + "plain")
        if key.endswith("-search") and p and "screen_work" in s:
            k, tree, drafter = key.split("-")[:3]
            print(f"| {drafter} | {k[3:]} | {tree} | {p['wall_s']} s | {s['wall_s']} s | {s['screen_seconds']} s "
                  f"({s['screen_work'] / 1e6:.2f}M) | {s['confirmed']} in {s['confirm_seconds']} s | {s['set_size']} | "
                  f"{s['best_found']} | {s['wall_s'] / p['wall_s']:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
