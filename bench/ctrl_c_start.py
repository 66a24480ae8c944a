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

``--with-pip-launcher`` also times, run for run alternately, the launcher pip generates for a
``[project.scripts]`` entry point (what eagle3conv shipped before its own ``bin/eagle3conv``).
"""

from __future__ import annotations

import argparse
import json
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--max-ms", type=float, default=40)
    ap.add_argument("--step", type=float, default=2)
    ap.add_argument("--script", default=str(Path(sys.executable).parent / "eagle3conv"))
    ap.add_argument("--with-pip-launcher", action="store_true")
    ap.add_argument("--out", help="write the table as JSON here")
    a = ap.parse_args()
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
