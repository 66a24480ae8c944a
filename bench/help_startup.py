"""`eagle3conv --help` and `eagle3conv verify --help` start-up, two trees side by side (ABBA).

    python bench/help_startup.py --a . --b /path/to/other/tree [--runs 30]

Each run is a fresh ``python -m eagle3conv ... --help`` with PYTHONPATH at one tree; the two trees run
alternately (A B B A ...), and the ratio A/B is taken pair by pair, so a machine whose speed drifts still
gives a fair ratio. Prints the median wall and CPU (user+sys of the child) seconds of each tree and the
median of the per-pair ratios. Whole-process figures, as a user sees them.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time


def one(tree: str, args: list[str]) -> tuple[float, float]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "eagle3conv", *args], env=env, stdout=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, help="the tree measured (PYTHONPATH)")
    p.add_argument("--b", required=True, help="the tree compared against")
    p.add_argument("--runs", type=int, default=30)
    args = p.parse_args()
    for command in (["--help"], ["verify", "--help"]):
        one(args.a, command), one(args.b, command)  # warm-up: the page cache holds both trees
        a_runs, b_runs = [], []
        for i in range(args.runs):
            order = ((args.a, a_runs), (args.b, b_runs)) if i % 2 == 0 else ((args.b, b_runs), (args.a, a_runs))
            for tree, out in order:
                out.append(one(tree, command))
        label = "eagle3conv " + " ".join(command)
        for what, k in (("wall", 0), ("cpu", 1)):
            a = [r[k] for r in a_runs]
            b = [r[k] for r in b_runs]
            ratio = statistics.median(x / y for x, y in zip(a, b))
            print(f"{label:<24} {what:<4} A {statistics.median(a):.3f} s  B {statistics.median(b):.3f} s  "
                  f"A/B {ratio:.3f} (median of {args.runs} pairs)")


if __name__ == "__main__":
    main()
