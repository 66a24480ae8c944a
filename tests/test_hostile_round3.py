"""Hostile folders, round three (issue 25, items 3-7 and 9-11): the code added since round two.

Real files, real links, real subprocesses. Each case grew memory without bound, ran forever, read a
file outside the folder, echoed its lines, gave an internal error, scored what it should refuse or
printed a healthy report over an error before.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from conftest import PICO
from eagle3conv.errors import CheckpointReadError, InvalidCheckpointError
from eagle3conv.example import Dims, write_example
from eagle3conv.states.format import hidden_key

REPO = Path(__file__).resolve().parents[1]
TINY = Dims(hidden=64, target_hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512,
            draft_vocab=300, aux_ids=(1, 3, 4))
SECRET = "aws_secret_access_key = AKIAIOSFODNN7EXAMPLESECRET\ntoken: hf_SECRETSECRETSECRET\n"


def _bounded():
    """The child may use at most 3 GiB of address space: a command that grows without bound fails
    with a MemoryError within seconds instead of taking the machine."""
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def run_cli(*args, timeout=90):
    """The CLI in a fresh, memory-bounded process; a hang is a failure (TimeoutExpired)."""
    return subprocess.run([sys.executable, "-m", "eagle3conv", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ), preexec_fn=_bounded)


def clean(r) -> None:
    assert "Traceback" not in r.stderr + r.stdout and "internal error" not in r.stderr, r.stderr[-2000:]


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def with_tensor(folder: Path, name: str) -> Path:
    """``folder``'s weights plus one small tensor named ``name`` (a valid safetensors file)."""
    f = folder / "model.safetensors"
    tensors = load_file(str(f))
    tensors[name] = torch.ones(folder_hidden(tensors), dtype=next(iter(tensors.values())).dtype)
    save_file(tensors, str(f))
    return folder


def folder_hidden(tensors: dict) -> int:
    return next(t.shape[0] for n, t in tensors.items() if n.endswith("input_layernorm.weight"))


@pytest.fixture
def drafter(tmp_path):
    return write_example(tmp_path / "drafter", "sglang", TINY)


@pytest.fixture
def automodel(tmp_path):
    return write_example(tmp_path / "automodel", "automodel", PICO)


# --------------------------------------------------------------------------- 3, 7. numbers from names and files


@pytest.mark.parametrize("index", ["1000000000000000000", "9" * 5000])
def test_a_huge_layer_index_in_a_weight_name_is_refused_at_once(drafter, tmp_path, index):
    """layers.10^18.* made every planning command grow ~350 MB/s (set(range(10^18 + 1))); 5,000 digits
    were an internal error (Python's 4,300-digit limit). Both: exit 3 naming the tensor, nothing written."""
    with_tensor(drafter, f"layers.{index}.input_layernorm.weight")
    count = len(load_file(str(drafter / "model.safetensors")))
    before = digest(drafter)
    for args in (("inspect", drafter), ("fix-keys", drafter, "--dry-run"), ("fix-keys", drafter),
                 ("fix-keys", drafter, "--out", tmp_path / "out")):
        r = run_cli(*args)
        clean(r)
        assert r.returncode == 3, (args, r.stdout[-500:], r.stderr[-500:])
        assert "layer index" in r.stdout + r.stderr and f"holds {count} tensors" in r.stdout + r.stderr
        error = r.stdout.splitlines()[0] if args[0] == "inspect" else r.stderr.splitlines()[0]
        assert len(error) < 400  # the 5,000-digit name is shortened in the error (inspect lists it whole)
    assert digest(drafter) == before and not (tmp_path / "out").exists()
    # an index within the tensor count is still the named gap it always was
    shutil.rmtree(drafter)
    with_tensor(write_example(drafter, "sglang", TINY), "layers.3.input_layernorm.weight")
    r = run_cli("inspect", drafter)
    assert r.returncode == 3 and "layers.1, layers.2 is missing" in r.stdout, r.stdout[-800:]


def test_a_config_of_two_billion_layers_is_refused_not_expanded(drafter, tmp_path):
    """config --check expanded num_hidden_layers 2^31-1 into canonical names: 4.2 GB in 30 s."""
    run_cli("fix-keys", drafter)
    cfg = json.loads((drafter / "config.json").read_text())
    cfg["num_hidden_layers"] = 2**31 - 1
    (drafter / "config.json").write_text(json.dumps(cfg))
    for args in (("config", drafter, "--check"), ("inspect", drafter)):
        r = run_cli(*args)
        clean(r)
        assert r.returncode == 3 and "num_hidden_layers is 2147483647; expected an integer from 1 to 65536" in (
            r.stdout + r.stderr), (args, r.stdout[-500:], r.stderr[-500:])


CANONICAL_CHECK = """
import json, sys
from safetensors import safe_open
from eagle3conv.spec.canonical import in_canonical_names
folder = sys.argv[1]
config = json.load(open(folder + "/config.json"))
config["num_hidden_layers"] = 2**31 - 1
with safe_open(folder + "/model.safetensors", framework="pt") as f:
    names = set(f.keys())
print(in_canonical_names(config, names), in_canonical_names(config, names | {"layers.5.input_layernorm.weight"}))
"""


def test_the_canonical_names_never_expand_past_the_names_given(drafter):
    """Whether a folder is in SGLang's names, under a config of 2^31-1 layers: answered from the layers
    named, at once (a bounded child process: before, it expanded every layer's names)."""
    r = subprocess.run([sys.executable, "-c", CANONICAL_CHECK, str(drafter)], capture_output=True, text=True,
                       timeout=90, preexec_fn=_bounded)
    assert r.returncode == 0 and r.stdout.split() == ["True", "True"], r.stderr[-800:]


TEMPLATE_CHECK = """
import json, sys
from eagle3conv.errors import InvalidCheckpointError
from eagle3conv.spec.canonical import expected
from eagle3conv.spec.drafter import DrafterSpec
base = json.load(open(sys.argv[1] + "/config.json"))
for field, value in (("num_hidden_layers", 2**31 - 1), ("num_aux_hidden_states", 10**18)):
    try:
        expected(DrafterSpec.from_config({**base, field: value, "fc_norm": True}, validate=False))
    except InvalidCheckpointError as e:
        print("refused:", e.message)
print(len(expected(DrafterSpec.from_config({**base, "num_hidden_layers": 4}, validate=False))))
"""


def test_no_template_expands_past_max_layers(drafter):
    """The backstop under the validators: the contract is never expanded past 65,536 layers or slots
    (a bounded child process: before, it expanded all 2^31-1)."""
    r = subprocess.run([sys.executable, "-c", TEMPLATE_CHECK, str(drafter)], capture_output=True, text=True,
                       timeout=90, preexec_fn=_bounded)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 3, r.stderr[-800:]
    assert lines[0] == "refused: 2147483647 decoder layers (num_hidden_layers): eagle3conv takes at most 65536 " \
                       "(no drafter has more)"
    assert lines[1].startswith("refused: 1000000000000000000 aux slots") and int(lines[2]) > 0


def test_a_states_file_claiming_a_huge_target_is_refused(tmp_path, drafter_and_states):
    """A states file's num_layers bounds ranges over the target's layers (the search's coverage)."""
    from eagle3conv.states.format import StatesFile

    src = drafter_and_states[1]
    with safe_open(str(src), framework="pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    for value, message in (("1000000000000000000", "is 1000000000000000000; eagle3conv takes at most 65536"),
                           ("9" * 5000, "got a string of 5000 characters")):
        bad = tmp_path / f"states-{len(value)}.safetensors"
        save_file(tensors, str(bad), metadata={**meta, "num_layers": value})
        with pytest.raises(CheckpointReadError, match=message):
            StatesFile(bad)


def test_a_target_of_a_billion_layers_is_refused(tmp_path):
    from eagle3conv.spec.targets import target_from_config

    cfg = tmp_path / "target" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                               "num_hidden_layers": 10**9, "num_attention_heads": 4, "vocab_size": 512}))
    with pytest.raises(CheckpointReadError, match="at most 65536 layers"):
        target_from_config(cfg)


# --------------------------------------------------------------------------- 4, 5, 7. the YAML record


def alias_bomb(levels: int = 9) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]")
    lines.append(f"recipe_args:\n  aux_layer_ids: [{', '.join([f'*l{levels - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_in_the_recipe_snapshot_is_refused_before_anything_walks_it(automodel, tmp_path):
    text = alias_bomb()
    assert len(text) < 1000  # 650-odd bytes that stand for 9^10 strings
    (automodel / "config.yaml").write_text(text)
    before = digest(automodel)
    for args in (("inspect", automodel), ("inspect", automodel, "--json"), ("fix-keys", automodel),
                 ("fix-keys", automodel, "--out", tmp_path / "out")):
        r = run_cli(*args, timeout=60)
        clean(r)
        assert r.returncode == 1 and "uses a YAML alias (line 2, column" in r.stdout + r.stderr, (args, r.stderr)
    assert digest(automodel) == before and not (tmp_path / "out").exists()


def test_one_alias_anywhere_in_the_record_is_refused(automodel):
    from eagle3conv.io.yamlfile import read_yaml_file

    (automodel / "config.yaml").write_text("ids: &ids [1, 14, 26]\nrecipe_args:\n  aux_layer_ids: *ids\n")
    with pytest.raises(CheckpointReadError, match="alias"):
        read_yaml_file(automodel / "config.yaml")


def test_a_deep_recipe_snapshot_is_refused():
    from eagle3conv.io.yamlfile import MAX_DEPTH, read_yaml_file

    p = Path(os.environ["EAGLE3CONV_STATE_DIR"]) / "deep.yaml"
    p.write_text("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    with pytest.raises(CheckpointReadError, match=f"nested more than {MAX_DEPTH} levels"):
        read_yaml_file(p)
    p.write_text("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    assert read_yaml_file(p) is not None


def test_a_large_recipe_snapshot_is_refused_by_its_size(automodel):
    """5 MB of YAML took 111 s and 1.2 GB in pure-Python PyYAML."""
    from eagle3conv.io.yamlfile import MAX_YAML_BYTES

    (automodel / "config.yaml").write_text("recipe_args:\n  aux_layer_ids: [1, 14, 26]\n"
                                           + "".join(f"k{i}: [{i}, {i}, {i}]\n" for i in range(300_000)))
    assert (automodel / "config.yaml").stat().st_size > 5_000_000
    r = run_cli("inspect", automodel, timeout=60)
    clean(r)
    assert r.returncode == 1 and f"a recipe snapshot is at most {MAX_YAML_BYTES} bytes" in r.stdout, r.stdout[:500]


def test_pyyaml_is_a_declared_pinned_dependency():
    """The record reader imports yaml itself: the package must not rely on transformers pulling it in."""
    from importlib.metadata import version

    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"PyYAML=={version('PyYAML')}" in deps
    assert f"PyYAML=={version('PyYAML')}" in (REPO / "requirements.txt").read_text().splitlines()


def test_an_integer_of_5000_digits_in_the_recipe_snapshot_is_the_documented_error(automodel):
    (automodel / "config.yaml").write_text(f"recipe_args:\n  aux_layer_ids: [1, 14, {'9' * 5000}]\n")
    r = run_cli("inspect", automodel)
    clean(r)
    assert r.returncode == 1
    assert "config.yaml: not valid YAML: an integer of more than 4300 digits" in r.stdout.splitlines()[0]


# --------------------------------------------------------------------------- 6. record files outside the folder


def test_a_recipe_snapshot_linked_from_outside_is_refused_and_never_written_in(automodel, tmp_path):
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text("recipe_args:\n  aux_layer_ids: [3, 10, 20]\n")
    (automodel / "config.yaml").unlink()
    (automodel / "config.yaml").symlink_to(outside)
    before = digest(automodel)
    r = run_cli("fix-keys", automodel)  # in place: it wrote [3, 10, 20] into config.json before
    clean(r)
    assert r.returncode == 1 and "config.yaml: a symlink to" in r.stderr and "outside the checkpoint" in r.stderr
    assert digest(automodel) == before
    # the user's word: followed, and said so
    r = run_cli("fix-keys", automodel, "--out", tmp_path / "out", "--follow-symlinks", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {"path": str(automodel / "config.yaml"), "target": os.path.realpath(outside)} in doc["followed_symlinks"]
    assert json.loads((tmp_path / "out" / "config.json").read_text())["eagle_config"][
        "eagle_aux_hidden_state_layer_ids"] == [3, 10, 20]


@pytest.mark.parametrize("content", [SECRET, "recipe_args: [\n" + SECRET, "\x00" + SECRET])
def test_no_line_of_an_outside_or_broken_record_reaches_the_output(automodel, tmp_path, content):
    """inspect --json's plan_error quoted the parser's snippet of the outside file: a key line, a token."""
    outside = tmp_path / "credentials"
    outside.write_text(content)
    (automodel / "config.yaml").unlink()
    (automodel / "config.yaml").symlink_to(outside)
    for folder_state in ("linked", "copied in"):
        r = run_cli("inspect", automodel, "--json")
        clean(r)
        doc = json.loads(r.stdout)
        assert list(doc)[0] == "plan_error" and "plan" not in doc, folder_state
        assert "SECRET" not in r.stdout + r.stderr and "AKIA" not in r.stdout + r.stderr, folder_state
        (automodel / "config.yaml").unlink()
        shutil.copy(outside, automodel / "config.yaml")  # inside the folder: still no line of it echoed


def test_training_metadata_linked_from_outside_is_refused(drafter, tmp_path):
    outside = tmp_path / "meta.json"
    outside.write_text(json.dumps({"format": "eagle3conv-training-metadata", "version": 1,
                                   "layers": [{"output_of": 2}, {"output_of": 3}, {"output_of": 4}]}))
    (drafter / "training_metadata.json").symlink_to(outside)
    r = run_cli("inspect", drafter)  # the folder's index refuses it
    clean(r)
    assert r.returncode == 1 and "training_metadata.json: a symlink to" in r.stderr, r.stderr[:400]
    from eagle3conv.wiring.metadata import find_training_record, from_metadata_file

    for read in (from_metadata_file, lambda f: find_training_record(f, None, None)):  # the library's readers too
        with pytest.raises(CheckpointReadError, match="outside the checkpoint folder"):
            read(drafter)


def test_a_dump_manifest_linked_from_outside_is_refused(tmp_path):
    from eagle3conv.wiring.metadata import from_dump_manifest

    dumps = tmp_path / "dumps"
    dumps.mkdir()
    torch.save(torch.zeros(4, 8), dumps / "aux_0.pt")
    (tmp_path / "m.json").write_text(json.dumps({"captured_at_input_of": [3]}))
    (dumps / "manifest.json").symlink_to(tmp_path / "m.json")
    with pytest.raises(CheckpointReadError, match="outside the checkpoint folder"):
        from_dump_manifest(dumps)


@pytest.mark.parametrize("make", ["fifo", "dangling"])
def test_a_recipe_snapshot_that_is_no_file_is_named(automodel, tmp_path, make):
    (automodel / "config.yaml").unlink()
    if make == "fifo":
        os.mkfifo(automodel / "config.yaml")
    else:
        (automodel / "config.yaml").symlink_to(tmp_path / "gone.yaml")
    r = run_cli("inspect", automodel, timeout=60)
    clean(r)
    assert r.returncode == 1 and "config.yaml: " in r.stdout.splitlines()[0], r.stdout[:300]
    assert ("FIFO" if make == "fifo" else "dangling") in r.stdout.splitlines()[0]


# --------------------------------------------------------------------------- 9. the P-EAGLE mask token


def test_a_mask_token_past_the_vocabulary_is_refused(tmp_path):
    ck = write_example(tmp_path / "peagle", "automodel-peagle", PICO)
    run_cli("fix-keys", ck)
    cfg = json.loads((ck / "config.json").read_text())
    for mask, refused in ((cfg["vocab_size"], True), (cfg["vocab_size"] - 1, False)):  # the last row is a row
        (ck / "config.json").write_text(json.dumps({**cfg, "mask_token_id": mask}))
        for args in (("inspect", ck), ("fix-keys", ck, "--out", tmp_path / f"out{mask}"), ("verify", ck, "--no-save"),
                     ("config", ck, "--check")):
            r = run_cli(*args, timeout=180)
            clean(r)
            said = "the P-EAGLE mask token id is" in r.stdout + r.stderr
            if refused:
                assert r.returncode == 3 and said and f"has no row {mask}" in r.stdout + r.stderr, args
            else:
                assert not said, (args, r.stdout[-500:])


# --------------------------------------------------------------------------- 10. one Inf in a scored layer


@pytest.mark.parametrize("where", ["aux", "aux-position-0", "embeddings"])
def test_one_non_finite_value_read_refuses_the_states(drafter_and_states, tmp_path, where):
    """One +Inf was scored silently (the check read norm percentiles); one NaN was refused."""
    src = drafter_and_states[1]
    with safe_open(str(src), framework="pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k).clone() for k in f.keys()}
    key = hidden_key(-1 if where == "embeddings" else 3)
    for value in (float("inf"), float("-inf"), float("nan")):  # NaN was refused before, Inf scored
        tensors[key][1, 0 if where == "aux-position-0" else 7, 5] = value
        bad = tmp_path / "states.safetensors"
        save_file(tensors, str(bad), metadata=meta)
        r = run_cli("verify", drafter_and_states[0], "--states", bad, "--no-save", timeout=180)
        clean(r)
        assert r.returncode == 1 and "are not finite (NaN or Inf)" in r.stderr, (value, r.stdout[-500:], r.stderr)
        assert ("embedding outputs" if where == "embeddings" else "slot 1 (output of layer 3)") in r.stderr


# --------------------------------------------------------------------------- 11. inspect leads with the error


BROKEN_RECORDS = {
    "bad YAML": ("recipe_args: [unclosed\n", "not valid YAML: a structure YAML cannot parse at line 2"),
    "non-UTF-8": (b"recipe_args:\n  aux_layer_ids: [1, 2]\n\xff\xfe\n", "not UTF-8 text"),
    "NUL bytes": (b"recipe_args:\n  aux_layer_ids: [1, 2]\n\x00\n", "a character YAML does not allow"),
    "python object": ("recipe_args:\n  aux_layer_ids: !!python/object/apply:os.system ['true']\n",
                      "a tag or value the safe loader does not build"),
    "ids a string": ("recipe_args:\n  aux_layer_ids: '1, 14, 26'\n", "expected a list of layer ids, got a string"),
    "ids a mapping": ("recipe_args:\n  aux_layer_ids: {1: 2}\n", "expected a list of layer ids, got a mapping"),
    "ids booleans": ("recipe_args:\n  aux_layer_ids: [true, false]\n", "layer ids must be integers, got a boolean"),
    "recipe_args a number": ("recipe_args: 5\n", "recipe_args is 5, not a mapping"),
    "a list": ("- 1\n- 2\n", "the file is a list of 2, not a mapping"),
    "empty": ("", "empty (no YAML document)"),
    "two documents": ("a: 1\n---\nb: 2\n", "a document YAML cannot compose"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_RECORDS))
def test_inspect_leads_with_the_error_of_an_unusable_recipe_snapshot(automodel, case):
    content, message = BROKEN_RECORDS[case]
    p = automodel / "config.yaml"
    p.write_bytes(content) if isinstance(content, bytes) else p.write_text(content)
    r = run_cli("inspect", automodel)
    clean(r)
    first = r.stdout.splitlines()[0]
    assert r.returncode == 1 and first.startswith("inspect: fix-keys cannot plan: ") and message in first, first
    assert "fix-keys would" not in r.stdout  # no healthy-looking plan under it
    doc = json.loads(run_cli("inspect", automodel, "--json").stdout)
    assert list(doc)[0] == "plan_error" and message in doc["plan_error"]["message"] and "plan" not in doc
