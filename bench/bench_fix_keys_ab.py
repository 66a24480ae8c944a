"""fix-keys --out of two source trees side by side on the same drafter (bench_fix_keys.py's).

Runs ``cp``, then ``fix-keys --out`` and ``fix-keys --out --keep-embed`` once per
tree each round, alternating which tree goes first (ABBA: the run right after a
large write is slower on a busy disk). Each tree runs as
``PYTHONPATH=TREE python -m eagle3conv``. Reports medians, the ratio to cp, and
the ratio of the second tree to the first.

    python bench/bench_fix_keys_ab.py --rounds 4 --scale 0.5 A=/path/to/main B=/path/to/branch
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fix_keys import timed, write_drafter  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs=2, metavar="NAME=PATH")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--scale", type=float, default=1.0)
    a = ap.parse_args()
    trees = dict(t.split("=", 1) for t in a.trees)
    work = Path(tempfile.mkdtemp(prefix="e3c-ab-"))
    src = work / "src"
    src.mkdir()
    nbytes = write_drafter(src / "model.safetensors", a.scale)
    print(f"drafter: {nbytes / 1e9:.2f} GB", file=sys.stderr)
    cases = {"cp": None, "fix-keys --out": [], "fix-keys --out --keep-embed": ["--keep-embed"]}
    res: dict[tuple[str, str], list[tuple[float, int]]] = {}
    try:
        for r in range(a.rounds):
            order = list(trees.items()) if r % 2 == 0 else list(trees.items())[::-1]
            for case, extra in cases.items():
                for tree, path in (order if extra is not None else [("-", "")]):
                    d = work / "run"
                    shutil.rmtree(d, ignore_errors=True)
                    d.mkdir()
                    subprocess.run(["sync"])
                    if extra is None:
                        cmd = ["cp", str(src / "model.safetensors"), str(d / "copy")]
                    else:
                        os.environ["PYTHONPATH"] = path
                        cmd = [sys.executable, "-m", "eagle3conv", "fix-keys", str(src), "--out", str(d / "o"), *extra]
                    res.setdefault((case, tree), []).append(timed(cmd))
                    w, rss = res[(case, tree)][-1]
                    print(f"round {r + 1} {case} {tree}: {w:.2f} s, {rss / 2**20:.0f} MiB", file=sys.stderr)
    finally:
        shutil.rmtree(work)
    cp = statistics.median(w for w, _ in res[("cp", "-")])
    print(f"{'case':30} {'tree':8} {'median s':>9} {'x cp':>6} {'peak MiB':>9}")
    for (case, tree), v in res.items():
        m = statistics.median(w for w, _ in v)
        print(f"{case:30} {tree:8} {m:9.2f} {m / cp:6.2f} {max(x for _, x in v) / 2**20:9.0f}")
    first, second = list(trees)
    for case in list(cases)[1:]:
        ma = statistics.median(w for w, _ in res[(case, first)])
        mb = statistics.median(w for w, _ in res[(case, second)])
        print(f"{case}: {second}/{first} = {mb / ma:.3f}")


if __name__ == "__main__":
    main()
