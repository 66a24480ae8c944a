"""Race in-place fix-keys against a second command on the same folder, N times each.

    python bench/race_stress.py --trials 40 [--pairs inspect,config,push,fix-keys] [--json]

Each trial copies a fresh checkpoint, starts ``fix-keys`` in place and, after a
random delay of 0-300 ms, the other command; no test hooks, real timing. A
trial is counted "ok" when neither command hit an internal error, every
non-zero exit is a clear refusal (FolderBusyError, exit 1) and the folder ends
fully converted and self-consistent (``eagle3conv fix-keys --dry-run`` plans no
change; config's edit and the re-shard both present where they ran) or, where
fix-keys refused, exactly as it was. Prints a table of outcomes.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eagle3conv.example import Dims, write_example

DIMS = Dims(hidden=256, target_hidden=256, heads=8, kv_heads=2, head_dim=32, intermediate=1024, vocab=4096,
            draft_vocab=1024)
WIRING = ["--trained-on", "2,15,27", "--captured-at", "input"]


def cli(args, **env):
    return subprocess.Popen([sys.executable, "-m", "eagle3conv", *args], env=dict(os.environ, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def trial(kind: str, base: Path, work: Path, rng: random.Random) -> tuple[str, str, str]:
    shutil.rmtree(work, ignore_errors=True)
    # config edits a fixed folder: race it against a re-sharding fix-keys; the others against a conversion
    shutil.copytree(base / ("sglang" if kind == "config" else "fused"), work)
    fix = ["fix-keys", str(work)] + (["--max-shard-size", "300KB"] if kind == "config" else [])
    other = {"inspect": ["inspect", str(work)], "config": ["config", str(work), *WIRING],
             "push": ["push", str(work), "--dry-run", "--repo-id", "a/b"], "fix-keys": ["fix-keys", str(work)]}[kind]
    a = cli(fix)
    time.sleep(rng.uniform(0, 0.3))
    b = cli(other)
    (_, ea), (_, eb) = a.communicate(), b.communicate()

    def outcome(p, err):
        if p.returncode == 0:
            return "0"
        if "internal error" in err:
            return f"{p.returncode} internal"
        if "another eagle3conv" in err:
            return f"{p.returncode} busy"
        msg = next((ln for ln in err.splitlines() if ln.startswith("error:")), err.strip()[:80])
        return f"{p.returncode} {msg.replace(str(work), 'DIR')[:90]}"

    oa, ob = outcome(a, ea), outcome(b, eb)
    check = subprocess.run([sys.executable, "-m", "eagle3conv", "fix-keys", str(work), "--dry-run", "--json"],
                           capture_output=True, text=True)
    converted = check.returncode == 0 and json.loads(check.stdout)["unchanged"]
    if kind == "config" and converted:
        cfg = json.loads((work / "config.json").read_text())
        if b.returncode == 0 and cfg.get("eagle_aux_hidden_state_layer_ids") != [2, 15, 27]:
            converted = False  # config's edit was lost
        if a.returncode == 0 and not (work / "model.safetensors.index.json").exists():
            converted = False  # fix-keys claimed a re-shard that is not there
    leftovers = [p.name for p in work.iterdir() if p.name.startswith(".eagle3conv")]
    if leftovers:
        return oa, ob, f"INCONSISTENT: left {leftovers}"
    if converted:
        return oa, ob, "converted"
    if a.returncode != 0 and not check.returncode and not json.loads(check.stdout)["unchanged"] \
            and not (kind == "fix-keys" and b.returncode == 0):
        return oa, ob, "not converted (fix-keys refused; the folder is as it was)"
    return oa, ob, "INCONSISTENT"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--pairs", default="inspect,config,push,fix-keys")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="race-"))
    write_example(tmp / "fused", "sglang-fused", DIMS)
    write_example(tmp / "sglang", "sglang", DIMS)
    table = {}
    for kind in args.pairs.split(","):
        counts = collections.Counter()
        for i in range(args.trials):
            oa, ob, state = trial(kind, tmp, tmp / "work", rng)
            counts[f"fix-keys {oa} | {kind} {ob} | {state}"] += 1
        table[kind] = dict(counts)
        if not args.json:
            print(f"fix-keys in place + {kind}: {args.trials} trials")
            for k, v in sorted(counts.items(), key=lambda kv: -kv[1]):
                print(f"  {v:3d}  {k}")
    if args.json:
        print(json.dumps(table, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
