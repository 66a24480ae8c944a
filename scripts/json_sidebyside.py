#!/usr/bin/env python3
"""Side-by-side JSON check: every command's ``--json`` from two trees, field by field.

Runs each command that has ``--json`` (example, inspect, fix-keys and its --dry-run, config with
--check / --dry-run / writing, verify's smoke test, scores and --search-wiring, launch and
launch --check, push --dry-run, capture, formats, targets) on the bundled fixtures (``eagle3conv
example --format X`` for every format, tests/data's drafters, the bench's SmolLM2 drafters) once
with ``PYTHONPATH=<before tree>`` and once with ``PYTHONPATH=<after tree>``. Each command runs in a
fresh temporary copy of its inputs, so commands that write never touch the fixtures. Compared: the
exit code, the JSON document on stdout, and every file the command leaves in its folder (JSON files
field by field, others by sha256). Timings (keys such as seconds / elapsed / wall / time / duration /
when) and the temporary folders' paths are normalised away.

``--mode text`` (or ``both``) runs each of those commands once more without ``--json`` and compares
what people read: the exit code, stdout line by line (the same temporary paths replaced, and the
wall-clock figures: "0.12 s", "seconds: 0.123", a timing key's "target_load_seconds: 22.1") and the
files it leaves.

The inputs (example checkpoints, a tiny random states file, SmolLM2 states captured with the real
target) are made once with the *before* tree and kept in the cache, so both sides read the same
bytes; the before side's results are cached too (``--cache``, default
/tmp/json-sidebyside-cache/<before commit>), so a re-run only runs the after side.

    python scripts/json_sidebyside.py --before /work/wt/base --after /work/wt/mine [--only REGEX] [-j 2] \
        [--mode json|text|both]

Exit 0 when every command is the same on both sides, 1 when anything differs, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import difflib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HARNESS_VERSION = "2"  # bump when the inputs or the normalisation change: the cache is keyed by it
PYTHON = os.environ.get("JSB_PYTHON") or ("/work/main/.venv/bin/python" if Path("/work/main/.venv/bin/python").exists()
                                          else sys.executable)
TIMEOUT = 600
TARGET = "smollm2-135m"
# key words whose values are wall-clock figures: never compared (the key itself still is)
TIMING_WORDS = {"seconds", "elapsed", "wall", "time", "times", "timing", "timings", "duration", "when", "timestamp",
                "took", "date", "ms", "s"}
# prose that quotes a wall-clock figure, e.g. "(12.3 s)" or "took 0.4s"
TIMING_PROSE = re.compile(r"\b\d+(?:\.\d+)?\s?(?:s|ms|seconds?|min)\b")
# a text line that names a timing, then its figure: "seconds: 0.123" (verify's smoke test)
TIMING_FIELD = re.compile(r"\b(seconds|elapsed|wall|time|took|duration)(:\s*)\d+(?:\.\d+)?")
# a "key: figure" line (capture's text prints its JSON keys so: "target_load_seconds: 22.1"), normalised
# when the key is a timing key, as in the JSON mode
KEY_FIGURE = re.compile(r"^(\s*)([A-Za-z_][\w.\-]*)(:\s*)-?\d+(?:\.\d+)?\s*$")
TEXT_SUFFIX = " [text]"  # a text case's name: its JSON case's name and this
WRONG_LAUNCH = ("python -m sglang.launch_server --model-path HuggingFaceTB/SmolLM2-135M-Instruct "
                "--speculative-algorithm EAGLE --speculative-draft-model-path drafter --quantization fp8 "
                "--context-length 2048")
GOOD_LAUNCH = ("python -m sglang.launch_server --model-path HuggingFaceTB/SmolLM2-135M-Instruct "
               "--speculative-algorithm EAGLE3 --speculative-draft-model-path drafter "
               "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4")


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]
    inputs: tuple[tuple[str, str], ...]  # (path under the inputs folder, name in the work folder)
    env: tuple[tuple[str, str], ...] = ()

    def key(self) -> str:
        blob = json.dumps([HARNESS_VERSION, self.name, self.argv, self.inputs, self.env])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class Result:
    rc: int
    json: object
    files: dict
    stderr_tail: str = ""
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)
    text: str | None = None  # stdout as it was, for a text case (its ``json`` is then None)


# --- running ------------------------------------------------------------------------------------


def _env(tree: Path, extra=()) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE3CONV", "HF_"))}
    env.update(PYTHONPATH=str(tree), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONHASHSEED="0",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               HF_HUB_DISABLE_TELEMETRY="1", TQDM_DISABLE="1", COLUMNS="100")
    env.update(dict(extra))
    return env


def _eagle3conv(tree: Path, argv, cwd: Path, extra_env=(), timeout=TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "eagle3conv", *argv], cwd=cwd, env=_env(tree, extra_env),
                          capture_output=True, text=True, timeout=timeout)


def run_case(case: Case, tree: Path, inputs: Path) -> Result:
    top = Path(tempfile.mkdtemp(prefix="jsb-"))
    work = top / "work"
    work.mkdir()
    home = top / "home"  # HF_HOME and the user's cache: outside the compared folder
    home.mkdir()
    try:
        for src, dst in case.inputs:
            s = inputs / src
            (shutil.copytree if s.is_dir() else shutil.copy2)(s, work / dst)
        env = (("HF_HOME", str(home / "hf")), ("XDG_CACHE_HOME", str(home / "cache")),
               ("HOME", str(home)), *case.env)
        t0 = time.monotonic()
        try:
            p = _eagle3conv(tree, case.argv, work, env)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = -999, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout"
        dt = time.monotonic() - t0
        subs = [(str(p_), "<work>") for p_ in {str(work.resolve()), str(work)}]
        subs += [(str(p_), "<home>") for p_ in {str(home.resolve()), str(home)}]
        subs += [(str(tree.resolve()), "<tree>"), (str(tree), "<tree>")]
        text = None
        if "--json" not in case.argv:
            doc, text = None, substitute(out, subs)
        else:
            try:
                doc = json.loads(out) if out.strip() else None
            except json.JSONDecodeError:
                doc = {"<stdout, not JSON>": out}
        files = _digest(work)
        # the folders' paths replaced now; timings at comparison time (the cache keeps the figures)
        return Result(rc=rc, json=substitute(doc, subs), files=substitute(files, subs),
                      stderr_tail=substitute(err[-1500:], subs), seconds=round(dt, 2), text=text)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _digest(work: Path) -> dict:
    out = {}
    for root, dirs, files in os.walk(work):
        dirs.sort()
        for f in sorted(files):
            p = Path(root) / f
            rel = str(p.relative_to(work))
            if p.is_symlink():
                out[rel] = {"symlink": os.readlink(p)}
            elif p.suffix == ".json":
                try:
                    out[rel] = json.loads(p.read_text())
                except (ValueError, UnicodeDecodeError):
                    out[rel] = _sha(p)
            else:
                out[rel] = _sha(p)
        for d in dirs:
            out[str((Path(root) / d).relative_to(work)) + "/"] = "dir"
    return out


def _sha(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


# --- normalising and comparing -----------------------------------------------------------------


def _is_timing_key(k: str) -> bool:
    words = [w for w in re.split(r"[_\-\s.]+", k.lower()) if w]
    return bool(words) and (words[-1] in TIMING_WORDS or any(w in TIMING_WORDS - {"s", "ms"} for w in words))


def substitute(x, subs):
    """The temporary folders' paths in every string replaced by placeholders."""
    if isinstance(x, dict):
        return {substitute(k, subs): substitute(v, subs) for k, v in x.items()}
    if isinstance(x, list):
        return [substitute(v, subs) for v in x]
    if isinstance(x, str):
        for a, b in sorted(subs, key=lambda s: -len(s[0])):
            if a:
                x = x.replace(a, b)
        return re.sub(r"/tmp/jsb-[A-Za-z0-9_]+", "<tmp>", x)
    return x


def normalise(x):
    """Timings replaced: a timing key's value, and a wall-clock figure quoted in prose."""
    if isinstance(x, dict):
        return {k: ("<timing>" if _is_timing_key(k) else normalise(v)) for k, v in x.items()}
    if isinstance(x, list):
        return [normalise(v) for v in x]
    if isinstance(x, str):
        return TIMING_PROSE.sub("<t>", x)
    return x


def diff(a, b, path="") -> list[tuple[str, object, object]]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in list(a) + [k for k in b if k not in a]:
            p = f"{path}.{k}" if path else str(k)
            if k not in b:
                out.append((p, a[k], "<absent>"))
            elif k not in a:
                out.append((p, "<absent>", b[k]))
            else:
                out += diff(a[k], b[k], p)
        return out
    if isinstance(a, list) and isinstance(b, list):
        out = []
        for i in range(max(len(a), len(b))):
            p = f"{path}[{i}]"
            if i >= len(b):
                out.append((p, a[i], "<absent>"))
            elif i >= len(a):
                out.append((p, "<absent>", b[i]))
            else:
                out += diff(a[i], b[i], p)
        return out
    return [] if a == b and type(a) is type(b) else [(path or "<document>", a, b)]


def _normalise_line(line: str) -> str:
    m = KEY_FIGURE.match(line)
    if m and _is_timing_key(m.group(2)):
        return f"{m.group(1)}{m.group(2)}{m.group(3)}<timing>"
    return TIMING_FIELD.sub(r"\1\2<t>", TIMING_PROSE.sub("<t>", line))


def normalise_text(text: str | None) -> list[str]:
    """A text output's lines, each with its wall-clock figures replaced."""
    return [_normalise_line(line) for line in (text or "").splitlines()]


def text_diff(a: str | None, b: str | None) -> list[tuple[str, object, object]]:
    """The lines that differ (a unified diff's hunks, one entry per hunk)."""
    la, lb = normalise_text(a), normalise_text(b)
    if la == lb:
        return []
    out = []
    sm = difflib.SequenceMatcher(a=la, b=lb, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag != "equal":
            out.append((f"stdout lines {i1 + 1}-{i2} / {j1 + 1}-{j2}", "\n".join(la[i1:i2]) or "<absent>",
                        "\n".join(lb[j1:j2]) or "<absent>"))
    return out


def compare(before: Result, after: Result) -> list[tuple[str, object, object]]:
    out = [("exit code", before.rc, after.rc)] if before.rc != after.rc else []
    if before.text is not None or after.text is not None:
        out += text_diff(before.text, after.text)
    else:
        out += diff(normalise(before.json), normalise(after.json), "json")
    out += diff(normalise(before.files), normalise(after.files), "files")
    return out


def _short(v, n=160) -> str:
    s = json.dumps(v, sort_keys=True) if not isinstance(v, str) else repr(v)
    return s if len(s) <= n else s[:n] + f"... ({len(s)} chars)"


# --- the inputs (made once, with the before tree) ----------------------------------------------

_FORMATS_PY = ("import json; from eagle3conv.example import EXAMPLE_FORMATS as F, EXAMPLE_CONFIG_BESIDE as B; "
               "print(json.dumps([list(F), list(B)]))")
_TINY_PY = r"""
import sys, torch
from pathlib import Path
from eagle3conv.example import Dims, write_example
from eagle3conv.states.format import write_states
root = Path(sys.argv[1])
d = Dims(hidden=64, target_hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512,
         draft_vocab=300, aux_ids=(1, 3, 4))
write_example(root / "tiny-drafter", "sglang", d)
g = torch.Generator().manual_seed(0)
B, S = 3, 40
write_states(root / "tiny-states.safetensors", input_ids=torch.randint(0, 512, (B, S), generator=g),
             attention_mask=torch.ones(B, S, dtype=torch.bool),
             target_next=torch.randint(0, 512, (B, S), generator=g),
             hidden={o: torch.randn(B, S, 64, generator=g) for o in (-1, 1, 3, 4)}, num_layers=6,
             vocab_size=512, target="tiny")
"""


def build_inputs(before: Path, inputs: Path, log) -> None:
    if (inputs / "READY").exists():
        return
    if inputs.exists():
        shutil.rmtree(inputs)
    tmp = inputs.with_name(inputs.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    log(f"making the inputs with {before} (once) ...")
    env = _env(before)

    def sh(argv, **kw):
        p = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, **kw)
        if p.returncode:
            raise SystemExit(f"making inputs failed: {argv}\n{p.stdout}\n{p.stderr}")
        return p.stdout

    formats, beside_formats = json.loads(sh([PYTHON, "-c", _FORMATS_PY]))
    formats += beside_formats
    for fmt in formats:
        sh([PYTHON, "-m", "eagle3conv", "example", f"examples/{fmt}", "--format", fmt])
    # the examples whose config lies beside the folder, as their trainer leaves it (example.py's
    # config_beside, and the original EAGLE code's NAME.config.json)
    beside = {fmt: f"examples/{fmt}{suffix}" for fmt in formats for suffix in (".draft-config.json", ".config.json")
              if (tmp / "examples" / f"{fmt}{suffix}").is_file()}
    # each example fixed once into SGLang's naming: the input of launch / config / verify / push
    for fmt in formats:
        cfg = ["--config", beside[fmt]] if fmt in beside else []
        p = subprocess.run([PYTHON, "-m", "eagle3conv", "fix-keys", f"examples/{fmt}", "--out", f"fixed/{fmt}",
                            "--target", TARGET, *cfg], cwd=tmp, env=env, capture_output=True, text=True)
        if p.returncode:
            log(f"  (fix-keys of example {fmt} exits {p.returncode}: no fixed/{fmt})")
    shutil.copytree(before / "tests" / "data", tmp / "data")
    sh([PYTHON, "-c", _TINY_PY, str(tmp)])
    prompts = (before / "scripts" / "smollm2-prompts.txt").read_text().splitlines()
    (tmp / "prompts4.txt").write_text("\n".join(prompts[:4]) + "\n")
    (tmp / "prompts2.txt").write_text("\n".join(prompts[4:6]) + "\n")
    sh([PYTHON, "-m", "eagle3conv", "capture", "--target", TARGET, "--prompts", "prompts4.txt", "--generate", "24",
        "--out", "smollm2-states.safetensors"], timeout=1200)
    (tmp / "VERSION").write_text(HARNESS_VERSION)
    (tmp / "READY").write_text(json.dumps({"formats": formats, "beside": beside}))
    tmp.rename(inputs)


# --- the cases --------------------------------------------------------------------------------


def cases(inputs: Path) -> list[Case]:
    spec = json.loads((inputs / "READY").read_text())
    formats, beside = spec["formats"], spec["beside"]
    # commands run on a few formats only (each is the same code for every format): keeps a run short
    same_fixed = _first_of_each_fixed(inputs, formats)
    few = ("sglang", "modelopt-export", "speculators-3.1", "specforge-runtime-0.2", "eagle", "automodel-peagle")
    out: list[Case] = [
        Case("formats", ("formats", "--json"), ()),
        Case("targets", ("targets", "--json"), ()),
        Case(f"targets {TARGET}", ("targets", TARGET, "--json"), ()),
        Case("targets kimi-k2.5", ("targets", "kimi-k2.5", "--json"), ()),
    ]
    for fmt in formats:
        ex = (("examples/" + fmt, "drafter"),)
        cfg: tuple[str, ...] = ()
        if fmt in beside:
            ex += ((beside[fmt], "draft-config.json"),)
            cfg = ("--config", "draft-config.json")
        out += [
            Case(f"example {fmt}", ("example", "drafter", "--format", fmt, "--json"), ()),
            Case(f"inspect {fmt}", ("inspect", "drafter", *cfg, "--json"), ex),
            Case(f"fix-keys {fmt} --out", ("fix-keys", "drafter", *cfg, "--out", "out", "--target", TARGET,
                                           "--json"), ex),
        ]
        if fmt in few:
            out += [
                Case(f"verify {fmt} (smoke, raw)", ("verify", "drafter", "--json"), ex),
                Case(f"fix-keys {fmt} --dry-run", ("fix-keys", "drafter", *cfg, "--target", TARGET, "--dry-run",
                                                   "--json"), ex),
                Case(f"inspect {fmt} --target", ("inspect", "drafter", *cfg, "--target", TARGET, "--json"), ex),
                Case(f"fix-keys {fmt} in place", ("fix-keys", "drafter", *cfg, "--json"), ex),
            ]
        if not (inputs / "fixed" / fmt).is_dir() or same_fixed.get(fmt, fmt) != fmt:
            continue  # no fixed output, or one byte-identical to an earlier format's (run once)
        fx = (("fixed/" + fmt, "drafter"),)
        out += [
            Case(f"config {fmt} --check", ("config", "drafter", "--target", TARGET, "--check", "--json"), fx),
            Case(f"launch {fmt}", ("launch", "drafter", "--target", TARGET, "--json"), fx),
            Case(f"verify {fmt} (smoke)", ("verify", "drafter", "--json"), fx),
        ]
        if fmt in few:
            out += [
                Case(f"config {fmt} --dry-run", ("config", "drafter", "--target", TARGET, "--dry-run", "--json"), fx),
                Case(f"push {fmt} --dry-run", ("push", "drafter", "--repo-id", "me/drafter", "--dry-run", "--json"), fx),
            ]
    for fmt in ("sglang", "modelopt-export", "speculators-3.1"):
        if (inputs / "fixed" / fmt).is_dir():
            fx = (("fixed/" + fmt, "drafter"),)
            out += [
                Case(f"config {fmt} write", ("config", "drafter", "--target", TARGET, "--trained-on", "1,14,26",
                                             "--captured-at", "output", "--json"), fx),
                Case(f"config {fmt} --check --trained-on", ("config", "drafter", "--target", TARGET, "--trained-on",
                                                            "2,15,27", "--captured-at", "output", "--check", "--json"),
                     fx),
                Case(f"launch {fmt} --check wrong", ("launch", "drafter", "--check", WRONG_LAUNCH, "--json"), fx),
                Case(f"launch {fmt} --check good", ("launch", "drafter", "--check", GOOD_LAUNCH, "--json"), fx),
                Case(f"launch {fmt} --engine vllm --tp 2", ("launch", "drafter", "--target", TARGET, "--engine", "vllm",
                                                            "--tp", "2", "--json"), fx),
            ]
            if fmt == "sglang":  # verify --launch: the launch check after the smoke test's report
                out.append(Case(f"verify {fmt} (smoke) --launch wrong", ("verify", "drafter", "--launch", WRONG_LAUNCH,
                                                                         "--json"), fx))
    # tests/data: the bench's SmolLM2 drafters
    states = (("smollm2-states.safetensors", "states.safetensors"),)
    data = ["smollm2-drafter", "smollm2-drafter-2layer", "smollm2-drafter-lost", "smollm2-drafter-mla"]
    for d in data:
        if not (inputs / "data" / d).is_dir():
            continue
        dd = (("data/" + d, "drafter"),)
        meta: tuple[str, ...] = ()
        if d == "smollm2-drafter-lost":
            dd += (("data/smollm2-drafter-lost-record/training_metadata.json", "record.json"),)
            meta = ("--metadata", "record.json")
        out += [
            Case(f"inspect {d}", ("inspect", "drafter", "--target", TARGET, *meta, "--json"), dd),
            Case(f"fix-keys {d} --dry-run", ("fix-keys", "drafter", "--target", TARGET, *meta, "--dry-run", "--json"),
                 dd),
            Case(f"fix-keys {d} --out", ("fix-keys", "drafter", "--target", TARGET, *meta, "--out", "out", "--json"),
                 dd),
            Case(f"config {d} --check", ("config", "drafter", "--target", TARGET, *meta, "--check", "--json"), dd),
            Case(f"config {d} --dry-run", ("config", "drafter", "--target", TARGET, *meta, "--dry-run", "--json"), dd),
            Case(f"launch {d}", ("launch", "drafter", "--target", TARGET, "--json"), dd),
            Case(f"launch {d} --check good", ("launch", "drafter", "--check", GOOD_LAUNCH, "--json"), dd),
            Case(f"verify {d} (smoke)", ("verify", "drafter", "--json"), dd),
            Case(f"verify {d} --states --layers", ("verify", "drafter", "--states", "states.safetensors", "--layers",
                                                  "2,15,27", "--min-accept", "0.9", "--json"), dd + states),
            Case(f"push {d} --dry-run", ("push", "drafter", "--repo-id", "me/drafter", "--dry-run", "--json"), dd),
        ]
        # the lost drafter's config names no layers: verify searches on its own (minutes on a loaded CPU)
        if d != "smollm2-drafter-lost":
            out.append(Case(f"verify {d} --states", ("verify", "drafter", "--states", "states.safetensors", *meta,
                                                     "--json"), dd + states))
    # the search over the 31 captured states: once, on the drafter the bench trained (about 2 min loaded)
    if (inputs / "data" / "smollm2-drafter").is_dir():
        out.append(Case("verify smollm2-drafter --search-wiring", ("verify", "drafter", "--states", "states.safetensors",
                                                                   "--search-wiring", "--json"),
                        (("data/smollm2-drafter", "drafter"),) + states))
    out.append(Case("config smollm2-drafter-lost write --metadata",
                    ("config", "drafter", "--target", TARGET, "--metadata", "record.json", "--json"),
                    (("data/smollm2-drafter-lost", "drafter"),
                     ("data/smollm2-drafter-lost-record/training_metadata.json", "record.json"))))
    out.append(Case("verify smollm2-drafter then push --dry-run (card with the report)",
                    ("push", "drafter", "--repo-id", "me/drafter", "--dry-run", "--json"),
                    (("verified/smollm2-drafter", "drafter"),)))
    tiny = (("tiny-drafter", "drafter"), ("tiny-states.safetensors", "states.safetensors"))
    out += [
        Case("verify tiny --states", ("verify", "drafter", "--states", "states.safetensors", "--json"), tiny),
        Case("verify tiny --states --steps 2 --batch-size 2", ("verify", "drafter", "--states", "states.safetensors",
                                                               "--steps", "2", "--batch-size", "2", "--json"), tiny),
        Case("verify tiny --search-wiring", ("verify", "drafter", "--states", "states.safetensors",
                                             "--search-wiring", "--json"), tiny),
        Case("verify tiny --states --launch wrong", ("verify", "drafter", "--states", "states.safetensors", "--launch",
                                                      WRONG_LAUNCH, "--json"), tiny),
        Case("verify tiny --layers bad", ("verify", "drafter", "--states", "states.safetensors", "--layers", "1,2",
                                          "--json"), tiny),
        Case("capture smollm2 (2 prompts, 8 tokens)", ("capture", "--target", TARGET, "--prompts", "prompts.txt",
                                                       "--generate", "8", "--layers", "1,14,26", "--out",
                                                       "states.safetensors", "--json"),
             (("prompts2.txt", "prompts.txt"),)),
        Case("capture --engine vllm --dry-run", ("capture", "--engine", "vllm", "--target", "some/model",
                                                 "--prompts", "prompts.txt", "--generate", "8", "--out", "states",
                                                 "--dry-run", "--json"), (("prompts2.txt", "prompts.txt"),)),
        Case("inspect missing folder", ("inspect", "no-such-folder", "--json"), ()),
        Case("verify missing states", ("verify", "drafter", "--states", "nope.safetensors", "--json"), tiny),
    ]
    return out


def text_cases(json_cases: list[Case]) -> list[Case]:
    """Each JSON case once more without ``--json``: the text people read."""
    return [Case(c.name + TEXT_SUFFIX, tuple(x for x in c.argv if x != "--json"), c.inputs, c.env)
            for c in json_cases if "--json" in c.argv]


def _first_of_each_fixed(inputs: Path, formats) -> dict[str, str]:
    """format -> the first format whose fixed output is byte-identical to its own (most trainers' naming
    of the same weights converts to one SGLang checkpoint: config, launch and verify read it once)."""
    first: dict[str, str] = {}
    out = {}
    for fmt in formats:
        folder = inputs / "fixed" / fmt
        if not folder.is_dir():
            continue
        key = json.dumps(_digest(folder), sort_keys=True)
        out[fmt] = first.setdefault(key, fmt)
    return out


def build_verified(before: Path, inputs: Path) -> None:
    """A copy of the SmolLM2 drafter with verify's report saved in it: push's card reads it."""
    dst = inputs / "verified" / "smollm2-drafter"
    if dst.is_dir():
        return
    tmp = inputs / "verified.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copytree(inputs / "data" / "smollm2-drafter", tmp / "smollm2-drafter")
    p = _eagle3conv(before, ["verify", str(tmp / "smollm2-drafter"), "--states",
                             str(inputs / "smollm2-states.safetensors")], tmp)
    if p.returncode:
        raise SystemExit(f"making inputs failed: verify\n{p.stdout}\n{p.stderr}")
    (inputs / "verified").mkdir(exist_ok=True)
    (tmp / "smollm2-drafter").rename(dst)
    shutil.rmtree(tmp, ignore_errors=True)


# --- main --------------------------------------------------------------------------------------


def _commit(tree: Path) -> str:
    p = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{tree}: not a git tree ({p.stderr.strip()})")
    return p.stdout.strip()


def _dirty(tree: Path) -> bool:
    p = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                       capture_output=True, text=True)
    return bool(p.stdout.strip())


def _run_all(todo, tree, inputs, jobs, log, label, keep: Path | None = None):
    results = {}
    if not todo:
        return results
    log(f"running {len(todo)} commands with the {label} tree ({tree}), {jobs} at a time ...")
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as ex:
        futs = {ex.submit(run_case, c, tree, inputs): c for c in todo}
        for i, f in enumerate(concurrent.futures.as_completed(futs), 1):
            c = futs[f]
            results[c.key()] = r = f.result()
            if keep is not None:  # kept as each one ends: an interrupted run loses nothing
                (keep / f"{c.key()}.json").write_text(json.dumps(r.__dict__, indent=1, sort_keys=True))
            log(f"  [{label} {i}/{len(todo)}] {c.name}: exit {r.rc} ({r.seconds:.1f} s)")
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--before", required=True, type=Path, help="the tree before (e.g. /work/wt/base)")
    ap.add_argument("--after", required=True, type=Path, help="the tree after (your worktree)")
    ap.add_argument("--cache", type=Path, help="where the inputs and the before side's results are kept "
                    "(default /tmp/json-sidebyside-cache/<before commit>)")
    ap.add_argument("--only", help="run only the commands whose name matches this regex (re.search)")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="commands run at a time (default 2)")
    ap.add_argument("--list", action="store_true", help="list the commands and exit")
    ap.add_argument("--rerun-before", action="store_true", help="ignore the cached before results")
    ap.add_argument("--max-diffs", type=int, default=40, help="differences shown per command (default 40)")
    ap.add_argument("--mode", choices=("json", "text", "both"), default="json",
                    help="compare each command's --json (default), its text output (the same command without "
                    "--json), or both")
    a = ap.parse_args(argv)
    before, after = a.before.resolve(), a.after.resolve()
    for t in (before, after):
        if not (t / "eagle3conv" / "__init__.py").is_file():
            ap.error(f"{t}: no eagle3conv package in it")
    commit = _commit(before)
    if _dirty(before):
        print(f"warning: {before} has uncommitted changes; the cache is keyed by commit {commit[:12]}",
              file=sys.stderr)
    cache = (a.cache or Path("/tmp/json-sidebyside-cache") / commit).resolve()
    cache.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    t0 = time.monotonic()
    inputs = cache / f"inputs-v{HARNESS_VERSION}"
    build_inputs(before, inputs, log)
    build_verified(before, inputs)
    todo = cases(inputs)
    todo = {"json": todo, "text": text_cases(todo), "both": todo + text_cases(todo)}[a.mode]
    if a.only:
        todo = [c for c in todo if re.search(a.only, c.name)]
    if a.list:
        for c in todo:
            print(f"{c.name}: eagle3conv {' '.join(c.argv)}")
        return 0
    results_dir = cache / "before"
    results_dir.mkdir(exist_ok=True)
    cached = {}
    for c in todo:
        f = results_dir / f"{c.key()}.json"
        if f.is_file() and not a.rerun_before:
            cached[c.key()] = Result(**json.loads(f.read_text()))
    fresh = _run_all([c for c in todo if c.key() not in cached], before, inputs, a.jobs, log, "before", results_dir)
    before_res = {**cached, **fresh}
    after_res = _run_all(todo, after, inputs, a.jobs, log, "after")

    differing = 0
    for c in todo:
        d = compare(before_res[c.key()], after_res[c.key()])
        if not d:
            print(f"same      {c.name}")
            continue
        differing += 1
        print(f"DIFFERENT {c.name}   (eagle3conv {' '.join(c.argv)})")
        for path, b, af in d[:a.max_diffs]:
            if path.startswith("stdout lines"):  # a text hunk: its lines as they read
                print(f"    {path}\n" + "".join(f"      - {x}\n" for x in b.splitlines())
                      + "".join(f"      + {x}\n" for x in af.splitlines()), end="")
                continue
            print(f"    {path}\n        before: {_short(b)}\n        after:  {_short(af)}")
        if len(d) > a.max_diffs:
            print(f"    ... and {len(d) - a.max_diffs} more differences")
        if before_res[c.key()].rc != after_res[c.key()].rc:
            print(f"    before stderr: {before_res[c.key()].stderr_tail[-400:]!r}")
            print(f"    after stderr:  {after_res[c.key()].stderr_tail[-400:]!r}")
    print(f"\n{len(todo) - differing} same, {differing} different, of {len(todo)} commands "
          f"(before {commit[:12]}, cache {cache}; {time.monotonic() - t0:.0f} s)")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
