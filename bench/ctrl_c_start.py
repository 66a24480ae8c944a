"""Ctrl-C in the first milliseconds of ``eagle3conv``: what the user sees, by delay.

Starts the installed console script (``.venv/bin/eagle3conv inspect DIR --json`` on the
bundled example) many times, sends SIGINT a fixed delay after the spawn, and classifies
the outcome: ``clean`` (exit 130, one line, one JSON document), ``silent`` (killed by the
signal before Python installed its handler: no output at all), ``traceback`` (a Python
traceback or "KeyboardInterrupt"), ``fatal`` ("Fatal Python error" during interpreter
start-up) or ``finished`` (the command ended before the signal). Figures and how they
were taken: bench/README.md, "Ctrl-C at start-up".

    python bench/ctrl_c_start.py [--runs 20] [--max-ms 40] [--step 2] [--script .venv/bin/eagle3conv]
                                 [--with-pip-launcher] [--out results.json]
    python bench/ctrl_c_start.py --first-statement 200 [--out results.json]

``--with-pip-launcher`` also times, run for run alternately, the launcher pip generates for a
``[project.scripts]`` entry point (what eagle3conv shipped before its own ``bin/eagle3conv``).

``--first-statement N`` measures the window itself: N spawns of a script whose first statement
(the one where the launcher takes Ctrl-C) prints the monotonic clock, against the clock read just
before the spawn; as the launcher runs (Python with ``site``), and for comparison with ``-S`` (no
``site``) and ``-I`` (isolated: no user site, no environment), the three alternating run for run.
Installers rewrite the launcher's ``#!python`` line to their interpreter and drop any flags on it
(pip's ``fix_script``), so ``-S``/``-I`` are what the window would be if they could be kept.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path


def classify(rc: int, out: str, err: str) -> str:
    if "Fatal Python error" in err:
        return "fatal"
    if "Traceback" in err or "KeyboardInterrupt" in err:
        return "traceback"
    if rc == -signal.SIGINT and not out and not err:
        return "silent"
    if rc == 130 and err.strip().startswith("interrupted"):
        try:
            json.loads(out)
            return "clean"
        except ValueError:
            return "clean-no-json"
    if rc == 0:
        return "finished"
    return f"other(rc={rc})"


PROBE = "import time, sys\nsys.stdout.write(repr(time.monotonic()))\n"  # both built in: nothing imported first


def first_statement(n: int) -> dict:
    """Milliseconds from the spawn to a script's first statement, per interpreter variant."""
    work = Path(tempfile.mkdtemp())
    probe = work / "probe.py"
    probe.write_text(PROBE)
    variants = {"python (as the launcher runs)": [], "python -S": ["-S"], "python -I": ["-I"]}
    got: dict = {name: [] for name in variants}
    for _ in range(n):
        for name, flags in variants.items():  # alternately, so each meets the same machine state
            t0 = time.monotonic()
            out = subprocess.run([sys.executable, *flags, str(probe)], capture_output=True, check=True).stdout
            got[name].append((float(out) - t0) * 1000)
    table = {}
    for name, ms in got.items():
        ms.sort()
        pick = {f"p{q}": round(ms[min(len(ms) - 1, int(len(ms) * q / 100))], 1) for q in (50, 90, 99)}
        table[name] = dict(pick, max=round(ms[-1], 1), runs=len(ms))
        print(f"{name:>30}  " + "  ".join(f"{k} {v}" for k, v in table[name].items()), flush=True)
    return table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--max-ms", type=float, default=40)
    ap.add_argument("--step", type=float, default=2)
    ap.add_argument("--script", default=str(Path(sys.executable).parent / "eagle3conv"))
    ap.add_argument("--with-pip-launcher", action="store_true")
    ap.add_argument("--out", help="write the table as JSON here")
    ap.add_argument("--first-statement", type=int, metavar="N",
                    help="measure the spawn-to-first-statement window over N spawns per variant instead")
    a = ap.parse_args()
    # started in the background of a non-interactive shell, SIGINT is ignored, and every launcher
    # started from here would inherit that and never see the Ctrl-C: give them a terminal's default
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if a.first_statement:
        table = first_statement(a.first_statement)
        if a.out:
            Path(a.out).write_text(json.dumps({"python": sys.executable, "first_statement_ms": table,
                                               "load_average": list(os.getloadavg())}, indent=2) + "\n")
        return
    work = Path(tempfile.mkdtemp())
    subprocess.run([a.script, "example", str(work / "ex")], check=True, capture_output=True)
    scripts = {"eagle3conv launcher": a.script}
    if a.with_pip_launcher:  # pip's template for a console_scripts entry point, as installed before
        pip = work / "eagle3conv-pip"
        python = Path(a.script).read_text().splitlines()[0]
        pip.write_text(f"{python}\n# -*- coding: utf-8 -*-\nimport re\nimport sys\nfrom eagle3conv.console import run\n"
                       "if __name__ == '__main__':\n"
                       "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
                       "    sys.exit(run())\n")
        pip.chmod(0o755)
        scripts["pip launcher"] = str(pip)
    table: dict = {name: {} for name in scripts}
    delay = 0.0
    while delay <= a.max_ms + 1e-9:
        seen = {name: Counter() for name in scripts}
        for _ in range(a.runs):
            for name, script in scripts.items():  # alternately, so both meet the same machine state
                p = subprocess.Popen([script, "inspect", str(work / "ex"), "--json"], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < delay / 1000:
                    pass
                p.send_signal(signal.SIGINT)
                out, err = p.communicate(timeout=120)
                seen[name][classify(p.returncode, out, err)] += 1
        for name in scripts:
            table[name][f"{delay:g}"] = dict(seen[name])
            print(f"{name:>20} {delay:5.1f} ms  " + "  ".join(f"{k} {v}" for k, v in sorted(seen[name].items())),
                  flush=True)
        delay += a.step
    if a.out:
        Path(a.out).write_text(json.dumps({"runs_per_delay": a.runs, "scripts": scripts, "table": table},
                                          indent=2) + "\n")


if __name__ == "__main__":
    main()
