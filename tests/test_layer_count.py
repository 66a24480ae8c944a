"""num_hidden_layers against the decoder layers the weights hold, in a converted (SGLang-named) folder.

The engines build num_hidden_layers layers whatever the weights hold (docs/facts.md §11): more in the
config and SGLang and vLLM serve the extra layers uninitialised; fewer and SGLang drops the later layers'
weights silently while vLLM refuses to start. Every command that judges the folder refuses it (exit 3)
with the same words; fix-keys rewrites the count.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import NEWEST_VLLM, OLDEST_SGLANG, NEWEST_SGLANG, run

from eagle3conv import api
from eagle3conv.example import write_example
from eagle3conv.publish import default_gate

SGLANG = f"sglang {OLDEST_SGLANG}-{NEWEST_SGLANG}"
VLLM = f"vllm {NEWEST_VLLM}"
# what each engine does, written from the wheels (docs/facts.md §11), not from mappings/engines
CASES = {
    # (trainer format, layers the weights hold, num_hidden_layers written): the words each engine's part says
    "more": ("sglang", 1, 3, [
        f"{SGLANG} builds 3 decoder layers and loads nothing into layers 1-2: it serves them with the "
        "uninitialised memory", f"{VLLM} builds 3 decoder layers and loads nothing into layers 1-2"]),
    "fewer": ("speculators-3.1", 2, 1, [
        f"{SGLANG} builds 1 decoder layer and skips the weights of layer 1 silently",
        f"{VLLM} refuses to load the weights of layer 1"]),
}


def _converted(tmp_path: Path, case: str) -> tuple[Path, int, int, list[str]]:
    """A drafter fix-keys wrote (real safetensors), then its config.json edited to the wrong count."""
    fmt, held, said, words = CASES[case]
    src = write_example(tmp_path / "src", fmt)
    out = tmp_path / "drafter"
    api.fix_keys(src, out=out)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    assert cfg["num_hidden_layers"] == held
    cfg["num_hidden_layers"] = said
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return out, held, said, words


def _says_it_all(text: str, held: int, said: int, words: list[str]) -> None:
    assert f"num_hidden_layers is {said}, but the weights hold {held} decoder layer" in text
    for w in words:
        assert w in text, (w, text)


@pytest.mark.parametrize("case", sorted(CASES))
def test_config_refuses_the_count_until_fix_keys_rewrites_it(tmp_path, case):
    ckpt, held, said, words = _converted(tmp_path, case)
    before = (ckpt / "config.json").read_bytes()
    for args in (["--check"], ["--dry-run"], []):
        res = run("config", ckpt, *args, ok=3)
        _says_it_all(res.stderr, held, said, words)
        assert f"eagle3conv fix-keys {ckpt} rewrites num_hidden_layers to {held}" in res.stderr
        assert f'"num_hidden_layers": {held}' in res.stderr  # the exact edit, for those who edit by hand
    assert (ckpt / "config.json").read_bytes() == before  # nothing written
    # the fix the error names: fix-keys in place rewrites the count, and every judge then passes
    run("fix-keys", ckpt)
    assert json.loads((ckpt / "config.json").read_text())["num_hidden_layers"] == held
    assert "check: passed" in run("config", ckpt, "--check").stdout
    run("inspect", ckpt)
    run("verify", ckpt)
    assert all(c.level == "ok" for c in default_gate(ckpt)), default_gate(ckpt)


@pytest.mark.parametrize("case", sorted(CASES))
def test_inspect_refuses_the_count_and_says_fix_keys_rewrites_it(tmp_path, case):
    ckpt, held, said, words = _converted(tmp_path, case)
    res = run("inspect", ckpt, ok=3)
    _says_it_all(res.stdout, held, said, words)
    assert "fix-keys would refuse" not in res.stdout  # it would not: its config edit is the fix
    assert f"fix: eagle3conv fix-keys {ckpt} rewrites num_hidden_layers to {held}" in res.stdout
    doc = json.loads(run("inspect", ckpt, "--json", ok=3).stdout)
    assert [f["code"] for f in doc["plan"]["findings"] if f["level"] == "error"] == ["layer-count"]
    # fix-keys itself still plans the rewrite, and no error
    dry = json.loads(run("fix-keys", ckpt, "--dry-run", "--json").stdout)
    assert [f for f in dry["plan"]["findings"] if f["level"] == "error"] == []
    assert {"field": "num_hidden_layers", "new": held} .items() <= next(
        e for e in dry["plan"]["config_edits"] if e["field"] == "num_hidden_layers").items()


@pytest.mark.parametrize("case", sorted(CASES))
def test_verify_and_the_push_gate_name_the_count(tmp_path, case):
    ckpt, held, said, words = _converted(tmp_path, case)
    res = run("verify", ckpt, ok=3)  # the smoke test (no states): the drafter's strict loading
    _says_it_all(res.stderr, held, said, words)
    assert "missing:" not in res.stderr and "unexpected:" not in res.stderr  # one error, not a key list
    checks = {c.subject: c for c in default_gate(ckpt)}
    for name in ("canonical", "smoke-test"):
        assert checks[name].level == "error"
        _says_it_all(checks[name].message, held, said, words)
    assert f"rewrites num_hidden_layers to {held}" in checks["canonical"].message


def test_mla_sglang_refuses_more_than_one_layer():
    """SGLang's MLA drafter builds one layer and raises for any other count (kimi_k25_eagle3.py:243-244)."""
    from eagle3conv.spec.engines import layer_count_outcomes

    more = layer_count_outcomes(2, 1, "mla")
    assert f"{SGLANG} refuses num_hidden_layers 2 at load" in more
    assert any(t.startswith(f"{VLLM} builds 2 decoder layers and loads nothing into layer 1") for t in more)
    fewer = layer_count_outcomes(1, 2, "mla")
    assert any(t.startswith(f"{SGLANG} builds 1 decoder layer and skips the weights of layer 1") for t in fewer)


@pytest.mark.parametrize("edit, match", [
    ({"layers_source": None}, "'layers_source' must name where"),
    ({"layers_without_weights": "zeros"}, "'layers_without_weights' must be one of"),
    ({"weights_past_layers": "loaded"}, "'weights_past_layers' must be one of"),
])
def test_the_loader_refuses_a_layer_rule_it_cannot_act_on(tmp_path, edit, match):
    from eagle3conv.errors import MappingFileError
    from eagle3conv.spec.engines import load_engine_file, load_families_file

    root = Path(__file__).resolve().parents[1] / "mappings" / "engines"
    raw = json.loads((root / "sglang.json").read_text())
    entry = next(f for f in raw["forward"] if f["drafters"] == ["llama"])
    for k, v in edit.items():
        if v is None:
            entry.pop(k)
        else:
            entry[k] = v
    bad = tmp_path / "sglang.json"
    bad.write_text(json.dumps(raw))
    with pytest.raises(MappingFileError, match=match):
        load_engine_file(bad, load_families_file(root / "families.json"))
