"""The trainers of 2026 as formats (docs/facts.md §6): NeMo Automodel 0.7.0, speculators 0.9.0,
SpecForge 0.2.0 and Model Optimizer 0.47.0, each variant written by eagle3conv.example as its trainer
writes it (real safetensors and pickles), put through ``eagle3conv fix-keys`` and checked against an
expectation written here, independently of the mapping files:

- the detected format and why;
- the output keys are exactly the contract (``canonical.expected`` of the written config), every source
  tensor is accounted for, a later layer's trained norm is written under both engines' names;
- every output tensor's bytes are its source tensor's bytes (renames never change bytes);
- the config fields each trainer's variant needs, the aux ids from each trainer's record;
- the output loads with the strict loader (:func:`eagle3conv.model.build_drafter`);
- bad input (a layer missing in the middle, ``mask_hidden`` of the wrong size, a switch without its
  tensors, k ids that do not match fc's width, a broken record file) is a clear error, not a traceback.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import PICO, load_st, save_st
from helpers import plan_errors, plan_notices, run
from eagle3conv.example import EXAMPLE_FORMATS, FIVE_AUX, MASK_TOKEN_ID, VARIANTS, config_beside, write_example
from eagle3conv.model import build_drafter
from eagle3conv.spec.canonical import expected
from eagle3conv.spec.drafter import DrafterSpec
from eagle3conv.spec.formats import DetectContext, evaluate_condition, load_format_file

VARIANTS_2026 = [f for f in EXAMPLE_FORMATS if f in VARIANTS]
TARGET_LAYERS = 30  # the examples' target: SmolLM2-135M's depth, which their aux ids (1, 14, 26) fit

# --- what each trainer writes, and what its keys become: written out here, not read from mappings/ ----


def trainer_files(ckpt: Path) -> dict[str, torch.Tensor]:
    """The source tensors as the trainer saved them (safetensors, or SpecForge's training_state.pt)."""
    if (ckpt / "model.safetensors").is_file():
        return load_file(str(ckpt / "model.safetensors"))
    return torch.load(ckpt / "training_state.pt", weights_only=True)["draft_state_dict"]


def served_name(fmt: str, key: str) -> str:
    """The name a trainer's key has in SGLang's single-layer spelling (layer 0 midlayer.*, later layers.N.*)."""
    if fmt.startswith("automodel"):
        if key.startswith("model.layers.0."):
            return "midlayer." + key[len("model.layers.0."):]
        return key[len("model."):] if key.startswith("model.") else key
    if key.startswith("layers.0."):
        return "midlayer." + key[len("layers.0."):]
    return key


def expected_outputs(fmt: str, source: dict) -> dict[str, str]:
    """Output name -> source key: every source key renamed, the embedding dropped unless the drafter is
    P-EAGLE (it trained its embedding), a later layer's input_layernorm also written as hidden_norm."""
    peagle = VARIANTS[fmt].get("mask_hidden", False)
    out = {}
    for key in source:
        name = served_name(fmt, key)
        if name == "embed_tokens.weight" and not peagle:
            continue
        out[name] = key
        if name.startswith("layers.") and name.endswith(".input_layernorm.weight"):
            out[name.replace(".input_layernorm.", ".hidden_norm.")] = key
    return out


def as_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def make(tmp_path: Path, fmt: str, **kw) -> Path:
    return write_example(tmp_path / fmt, fmt, PICO, **kw)


def fix(ckpt: Path, out: Path, *flags) -> dict:
    res = run("fix-keys", ckpt, "--out", out, *flags, "--json")
    return json.loads(res.stdout)


def load_out(out: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    return json.loads((out / "config.json").read_text()), load_file(str(out / "model.safetensors"))


def strict_load(config: dict, state: dict):
    embed = state.get("embed_tokens.weight")
    if embed is None:
        embed = torch.randn(config["vocab_size"], config["hidden_size"]) * 0.02  # the target's, in serving
    return build_drafter(config, state, dtype=torch.float32, embed_tokens=embed)


# --- detection ----------------------------------------------------------------------------------------

REASONS = {
    "automodel": ["config.json architectures is ['LlamaEagle3DraftModel']", "keys start with model.layers.0."],
    "speculators-3.1": ["config.json has speculators_model_type"],
    "specforge-peagle": ["config.json architectures is ['PEagleDraftModel']", "config.json has no speculators_model_type",
                         "keys start with layers.0."],
    "specforge-runtime-peagle": ["weights are under draft_state_dict"],
    "modelopt-export-0.47": ["keys start with layers.0.", "config.json has no speculators_model_type"],
    "specforge-export": ["keys start with midlayer."],
}


@pytest.mark.parametrize("fmt", sorted(REASONS))
def test_each_trainer_is_detected_with_its_reasons(tmp_path, fmt):
    plan = json.loads(run("inspect", make(tmp_path, fmt), "--json").stdout)["plan"]
    assert plan["format_reasons"] == REASONS[fmt]


def test_specforge_export_is_named_as_an_other_match_and_chosen_only_with_from(tmp_path):
    ck = make(tmp_path, "specforge-export")
    plan = json.loads(run("inspect", ck, "--json").stdout)["plan"]
    assert plan["format"] == "sglang" and plan["other_matching_formats"] == ["specforge-export"]
    forced = json.loads(run("inspect", ck, "--from", "specforge-export", "--json").stdout)["plan"]
    assert forced["format"] == "specforge-export" and forced["format_forced"]


def test_config_value_condition(tmp_path):
    ctx = DetectContext(frozenset(), {"norm_output": True, "n": 1, "eagle_config": {"next_layer_regular": True}},
                        "safetensors", None, tmp_path)
    hit = lambda c: evaluate_condition(c, ctx)[0]  # noqa: E731
    assert hit({"config_value": {"field": "norm_output", "equals": True}})
    assert not hit({"config_value": {"field": "norm_output", "equals": False}})
    assert not hit({"config_value": {"field": "n", "equals": True}})  # 1 is not true
    assert not hit({"config_value": {"field": "absent", "equals": None}})
    assert hit({"config_field": "eagle_config.next_layer_regular"})  # dotted paths reach nested fields
    assert not hit({"no_config_field": "eagle_config.next_layer_regular"})
    assert evaluate_condition({"config_value": {"field": "norm_output", "equals": True}}, ctx)[1] == \
        "config.json has norm_output: true"


# --- every variant: keys, bytes, config, strict load -------------------------------------------------


@pytest.mark.parametrize("fmt", VARIANTS_2026)
def test_fix_keys_writes_exactly_the_contract_with_the_trained_bytes(tmp_path, fmt):
    ck = make(tmp_path, fmt)
    source = trainer_files(ck)
    out = tmp_path / "out"
    result = fix(ck, out)
    config, state = load_out(out)

    want = expected_outputs(fmt, source)
    if "t2d" not in want:  # Model Optimizer writes no t2d: rebuilt from d2t
        want["t2d"] = None
    assert sorted(state) == sorted(want)
    # exactly the contract the written config implies: nothing missing, nothing the loaders would skip
    table = expected(DrafterSpec.from_config(config))
    assert set(state) <= set(table)
    assert {n for n, e in table.items() if e.required} <= set(state)
    # renames never change bytes; the later layers' second norm name carries the trained norm
    for name, key in want.items():
        if key is not None:
            assert as_bytes(state[name]) == as_bytes(source[key]), name
    for i in range(1, VARIANTS[fmt].get("layers", 1)):
        assert as_bytes(state[f"layers.{i}.hidden_norm.weight"]) == as_bytes(state[f"layers.{i}.input_layernorm.weight"])
    # every source key has one fate: none dropped silently
    decisions = {d["source"]: d for d in result["plan"]["decisions"]}
    assert set(decisions) == set(source)
    for key, d in decisions.items():
        assert d["action"] in ("renamed", "kept", "copied", "dropped"), (key, d)
        assert d["why"]
    strict_load(config, state)


# (num_hidden_layers, architecture, switches written) per variant; None: the field must be absent or false
CONFIGS = {
    "automodel": (1, "LlamaForCausalLMEagle3", {"fc_norm": False, "norm_output": False, "parallel_drafting": False}),
    "automodel-3.1": (1, "LlamaForCausalLMEagle3", {"fc_norm": True, "norm_output": True,
                                                    "layer_types": ["full_attention"], "model_type": "qwen3"}),
    "automodel-peagle": (2, "LlamaForCausalLMEagle3", {"parallel_drafting": True, "mask_token_id": MASK_TOKEN_ID}),
    "speculators-3.1": (2, "LlamaForCausalLMEagle3", {"norm_before_fc": True, "norm_output": True,
                                                      "norm_before_residual": True, "fc_norm": False,
                                                      "layer_types": ["sliding_attention"] * 2,
                                                      "sliding_window": 2048}),
    "speculators-qwen3": (1, "Eagle3Qwen3ForCausalLM", {"model_type": "qwen3", "head_dim": PICO.head_dim}),
    "speculators-peagle": (2, "Eagle3Qwen3ForCausalLM", {"parallel_drafting": True, "mask_token_id": MASK_TOKEN_ID,
                                                         "model_type": "qwen3"}),
    "speculators-k5": (1, "LlamaForCausalLMEagle3", {"num_aux_hidden_states": 5}),
    "specforge-export": (1, "LlamaForCausalLMEagle3", {"norm_output": True}),
    "specforge-peagle": (2, "LlamaForCausalLMEagle3", {"parallel_drafting": True}),
    "specforge-runtime-peagle": (2, "LlamaForCausalLMEagle3", {"parallel_drafting": True, "norm_output": False}),
    "modelopt-export-0.47": (2, "LlamaForCausalLMEagle3", {}),
}


@pytest.mark.parametrize("fmt", VARIANTS_2026)
def test_the_config_fields_each_variant_needs(tmp_path, fmt):
    layers, arch, fields = CONFIGS[fmt]
    out = tmp_path / "out"
    fix(make(tmp_path, fmt), out)
    config, _ = load_out(out)
    assert config["num_hidden_layers"] == layers
    assert config["architectures"] == [arch]
    for name, value in fields.items():
        assert config.get(name) == value, (name, config.get(name))
    if "num_aux_hidden_states" not in fields:
        assert "num_aux_hidden_states" not in config  # written only when k != 3
    spec = DrafterSpec.from_config(config)
    assert spec.L == layers and spec.on("parallel_drafting") == ("mask_hidden" in VARIANTS[fmt])


# aux ids written for every engine: the record each trainer keeps, in output-of-layer terms
AUX_SOURCES = {
    "automodel": "config.yaml recipe_args.aux_layer_ids (automodel: output-of-layer numbering)",
    "automodel-3.1": "automodel's default [1, N//2-1, N-4] for N = 30 (config.json num_hidden_layers, the target's): "
                     "assumed, not recorded",
    "speculators-3.1": "config.json eagle_aux_hidden_state_layer_ids (speculators: input-of-layer numbering)",
    "speculators-k5": "config.json eagle_aux_hidden_state_layer_ids (speculators: input-of-layer numbering)",
    "specforge-runtime-peagle": "training_state.pt specforge_model_provenance.capture_layers",
    "modelopt-export-0.47": "config.json eagle_config.eagle_aux_hidden_state_layer_ids (Model Optimizer export",
}


@pytest.mark.parametrize("fmt", sorted(AUX_SOURCES))
def test_aux_ids_come_from_each_trainers_record(tmp_path, fmt):
    out = tmp_path / "out"
    result = fix(make(tmp_path, fmt), out)
    trained = result["plan"]["wiring"]["trained_on"]
    assert AUX_SOURCES[fmt] in trained["source"]
    ids = list(FIVE_AUX if fmt == "speculators-k5" else PICO.aux_ids)
    assert [r["output_of"] for r in trained["layers"]] == ids
    config, _ = load_out(out)
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ids  # SGLang: +1 = outputs of ids
    assert config["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in ids]  # vLLM: inputs of layers


# --- NeMo Automodel ------------------------------------------------------------------------------------


def automodel_run_folder(tmp_path: Path, fmt: str = "automodel", ids=(2, 13, 25)) -> Path:
    """Automodel's real layout: epoch_E_step_S/config.yaml beside model/consolidated/ (the weights)."""
    flat = make(tmp_path, fmt)
    run_dir = tmp_path / "run" / "epoch_0_step_100"
    weights = run_dir / "model" / "consolidated"
    shutil.copytree(flat, weights)
    (weights / "config.yaml").rename(run_dir / "config.yaml")
    text = (run_dir / "config.yaml").read_text().replace(json.dumps(list(PICO.aux_ids)), json.dumps(list(ids)))
    (run_dir / "config.yaml").write_text(text)
    return weights


def test_automodel_reads_the_recipe_snapshot_two_folders_up(tmp_path):
    weights = automodel_run_folder(tmp_path, ids=(2, 13, 25))
    result = fix(weights, tmp_path / "out")
    trained = result["plan"]["wiring"]["trained_on"]
    assert [r["output_of"] for r in trained["layers"]] == [2, 13, 25]
    assert trained["source"].startswith(str(weights.parent.parent / "config.yaml"))
    config, _ = load_out(tmp_path / "out")
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 13, 25]


def test_automodel_recipe_snapshot_is_read_only_in_its_own_layout(tmp_path):
    """A config.yaml two folders up of a folder that is not model/consolidated is not Automodel's."""
    flat = make(tmp_path, "automodel")
    (flat / "config.yaml").rename(tmp_path / "config.yaml")
    nested = tmp_path / "a" / "b"
    shutil.copytree(flat, nested)
    (tmp_path / "a" / "config.yaml").write_text((tmp_path / "config.yaml").read_text())
    result = fix(nested, tmp_path / "out")
    assert "assumed, not recorded" in result["plan"]["wiring"]["trained_on"]["source"]


def test_automodel_config_fields_of_the_target_are_the_drafters_in_the_output(tmp_path):
    ck = make(tmp_path, "automodel-3.1")
    source_cfg = json.loads((ck / "config.json").read_text())
    assert source_cfg["num_hidden_layers"] == TARGET_LAYERS and len(source_cfg["layer_types"]) == TARGET_LAYERS
    source_cfg["quantization_config"] = {"quant_method": "mxfp4"}  # a gpt-oss target's, copied by Automodel
    (ck / "config.json").write_text(json.dumps(source_cfg))
    result = fix(ck, tmp_path / "out")
    config, _ = load_out(tmp_path / "out")
    assert config["num_hidden_layers"] == 1 and config["layer_types"] == ["full_attention"]
    assert "quantization_config" not in config
    notices = plan_notices(result["plan"])
    assert any(n.startswith("num_hidden_layers 30 is the target's") for n in notices)
    assert any(n.startswith("layer_types (30 entries") and "llama.py:185-204" in n for n in notices)
    assert any(n.startswith("quantization_config dropped") for n in notices)
    # transformers reads the written config as the engines do (layer_types must match the layer count)
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(str(tmp_path / "out"))
    assert hf.num_hidden_layers == 1 and hf.layer_types == ["full_attention"]


def test_automodel_peagle_default_needs_the_target(tmp_path):
    """A P-EAGLE config's num_hidden_layers is the drafter's, not the target's: no default without --target."""
    ck = make(tmp_path, "automodel-peagle")
    (ck / "config.yaml").unlink()
    result = fix(ck, tmp_path / "out")
    assert result["plan"]["wiring"]["trained_on"] is None
    assert any("no training record" in n for n in plan_notices(result["plan"]))
    target = tmp_path / "target" / "config.json"  # the pico target: PICO's width, SmolLM2's depth
    target.parent.mkdir()
    target.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                  "hidden_size": PICO.target_hidden, "num_hidden_layers": TARGET_LAYERS,
                                  "num_attention_heads": 4, "vocab_size": PICO.vocab}))
    with_target = fix(ck, tmp_path / "out2", "--target", target)
    trained = with_target["plan"]["wiring"]["trained_on"]
    assert [r["output_of"] for r in trained["layers"]] == [1, 14, 26]
    assert "(the target's profile): assumed, not recorded" in trained["source"]


def test_automodel_default_yields_to_any_record_and_its_record_is_one(tmp_path):
    ck = make(tmp_path, "automodel")
    # the run's own record contradicting the user's word: both named, nothing written
    res = run("fix-keys", ck, "--out", tmp_path / "out", "--trained-on", "3,10,20", "--captured-at", "output", ok=3)
    assert "training records disagree" in res.stderr and "config.yaml recipe_args.aux_layer_ids" in res.stderr
    # without config.yaml, Automodel's default is an assumption: the user's word replaces it, no disagreement
    (ck / "config.yaml").unlink()
    user = fix(ck, tmp_path / "out2", "--trained-on", "3,10,20", "--captured-at", "output")
    assert [r["output_of"] for r in user["plan"]["wiring"]["trained_on"]["layers"]] == [3, 10, 20]
    assert not plan_errors(user["plan"]) and not any("assumed" in n for n in plan_notices(user["plan"]))


@pytest.mark.parametrize("yaml_text,message", [
    ("recipe_args: [unclosed\n", "config.yaml: not valid YAML"),
    ("recipe_args:\n  aux_layer_ids: 3\n", "config.yaml recipe_args.aux_layer_ids: expected a list of layer ids, got 3"),
    ("recipe_args:\n  aux_layer_ids: [1, 14, 40]\n",
     "config.yaml recipe_args.aux_layer_ids: output id 40 (slot 2) is out of range -1..29"),
])
def test_automodel_bad_record_file_is_a_clear_error(tmp_path, yaml_text, message):
    ck = make(tmp_path, "automodel")
    (ck / "config.yaml").write_text(yaml_text)
    res = run("fix-keys", ck, "--out", tmp_path / "out", ok=None)
    assert res.exit_code in (1, 3) and message in res.stderr, res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    assert not (tmp_path / "out").exists()


# --- speculators ----------------------------------------------------------------------------------------


def test_speculators_default_training_output_converts_input_norm_included(tmp_path):
    """speculators' train CLI writes norm_before_fc (input_norm) by default: it used to be refused."""
    ck = make(tmp_path, "speculators-3.1")
    result = fix(ck, tmp_path / "out")
    fates = {d["source"]: d["action"] for d in result["plan"]["decisions"]}
    assert fates["input_norm.weight"] == "kept"
    assert fates["layers.1.input_layernorm.weight"] == "copied"
    why = next(d["why"] for d in result["plan"]["decisions"] if d["source"] == "layers.1.input_layernorm.weight")
    assert "the one the checkpoint has" in why


# --- SpecForge -----------------------------------------------------------------------------------------


def test_specforge_0_2_runtime_needs_its_draft_config_and_names_it(tmp_path):
    ck = write_example(tmp_path / "run-step100", "specforge-runtime-0.2", PICO)
    res = run("fix-keys", ck, "--out", tmp_path / "out", ok=2)
    assert "no config.json for this specforge-runtime checkpoint: SpecForge 0.2.0 writes no config.json" in res.stderr
    assert f"the run's draft config was {config_beside(ck)}" in res.stderr
    assert "Traceback" not in res.stderr


def test_specforge_runtime_writes_norm_output_false_whatever_the_config_says(tmp_path):
    ck = write_example(tmp_path / "run-step100", "specforge-runtime-0.2", PICO)
    draft = json.loads(config_beside(ck).read_text())
    assert draft["norm_output"] is True and draft["fc_norm"] is True  # SpecForge's EAGLE-3.1 config
    result = fix(ck, tmp_path / "out", "--config", config_beside(ck))
    config, state = load_out(tmp_path / "out")
    assert config["norm_output"] is False and config["fc_norm"] is True
    assert {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"} <= set(state)
    (note,) = [n for n in plan_notices(result["plan"]) if n.startswith("norm_output written false (was true)")]
    assert "SpecForge 0.2.0 and older read norm_output the other way round" in note and "llama3_eagle.py" in note
    assert not any(n.startswith("norm_output is false in a SpecForge") for n in plan_notices(result["plan"]))


def test_specforge_runtime_norm_output_false_is_a_warning(tmp_path):
    ck = write_example(tmp_path / "run-step100", "specforge-runtime-0.2", PICO)
    draft = json.loads(config_beside(ck).read_text()) | {"norm_output": False}
    config_beside(ck).write_text(json.dumps(draft))
    inspect = json.loads(run("inspect", ck, "--config", config_beside(ck), "--json").stdout)
    warnings = [f for f in plan_notices(inspect["plan"]) if f.startswith("norm_output is false in a SpecForge 0.2.0")]
    assert len(warnings) == 1 and "no engine computes" in warnings[0]


def test_midlayer_folder_with_norm_output_true_names_the_ambiguity_and_the_way_out(tmp_path):
    ck = make(tmp_path, "specforge-export")
    result = fix(ck, tmp_path / "out")
    (warning,) = [n for n in plan_notices(result["plan"]) if n.startswith("norm_output is true, which means")]
    assert "SpecForge 0.2.0 and older" in warning and "--from specforge-export" in warning
    assert load_out(tmp_path / "out")[0]["norm_output"] is True  # as written: EAGLE-3.1 for the engines
    forced = fix(ck, tmp_path / "out2", "--from", "specforge-export")
    assert load_out(tmp_path / "out2")[0]["norm_output"] is False
    assert not any(n.startswith("norm_output is true, which means") for n in plan_notices(forced["plan"]))


def test_a_plain_midlayer_folder_gets_no_norm_output_warning(tmp_path):
    result = fix(write_example(tmp_path / "s", "sglang", PICO), tmp_path / "o")
    assert not any("norm_output" in n for n in plan_notices(result["plan"]))


def test_peagle_without_mask_token_id_is_warned_about(tmp_path):
    result = fix(make(tmp_path, "specforge-peagle"), tmp_path / "out")
    (w,) = [n for n in plan_notices(result["plan"]) if "no mask_token_id" in n]
    assert "llm_base_proposer.py:355-385" in w and "add \"mask_token_id\"" in w
    ok = fix(make(tmp_path, "speculators-peagle"), tmp_path / "out2")
    assert not any("no mask_token_id" in n for n in plan_notices(ok["plan"]))


# --- Model Optimizer -------------------------------------------------------------------------------------


def test_modelopt_double_norm_is_said_once_with_its_source(tmp_path):
    result = fix(make(tmp_path, "modelopt-export-0.47"), tmp_path / "out")
    said = [n for n in plan_notices(result["plan"]) if "hidden_norm(input_layernorm(g))" in n]
    assert len(said) == 1
    assert "modeling_eagle.py:114-126" in said[0] and "no renaming can" in said[0]
    # a single-layer export without Model Optimizer's template (TorchSpec's) is not told so
    plain = fix(make(tmp_path, "modelopt-export"), tmp_path / "out2")
    assert not any("hidden_norm(input_layernorm(g))" in n for n in plan_notices(plain["plan"]))


# --- bad input: clear errors, never a traceback ---------------------------------------------------------


def _fails(tmp_path: Path, ck: Path, *wanted: str) -> str:
    res = run("fix-keys", ck, "--out", tmp_path / "bad-out", ok=3)
    text = res.stderr
    assert "Traceback" not in res.stdout + text
    for w in wanted:
        assert w in text, text
    assert not (tmp_path / "bad-out").exists()
    return text


def test_a_layer_missing_in_the_middle(tmp_path):
    ck = make(tmp_path, "speculators-3.1")
    t = load_st(ck / "model.safetensors")
    save_st({k.replace("layers.1.", "layers.2."): v for k, v in t.items()}, ck / "model.safetensors")
    text = _fails(tmp_path, ck, "decoder layers 0, 2 are present but layers.1 is missing")
    assert "layers.1." not in text.replace("layers.1 is missing", "")  # one error for the layer, not one per tensor


def test_mask_hidden_of_the_wrong_size(tmp_path):
    ck = make(tmp_path, "automodel-peagle")
    t = load_st(ck / "model.safetensors")
    k_t = 3 * PICO.target_hidden
    t["mask_hidden"] = torch.zeros(1, 1, k_t + 1, dtype=torch.bfloat16)
    save_st(t, ck / "model.safetensors")
    _fails(tmp_path, ck, f"mask_hidden: shape [1, 1, {k_t + 1}] but the config implies [k*T={k_t}]")


def test_mask_hidden_in_any_view_of_the_right_size_is_accepted(tmp_path):
    ck = make(tmp_path, "automodel-peagle")
    t = load_st(ck / "model.safetensors")
    t["mask_hidden"] = t["mask_hidden"].reshape(-1).clone()
    save_st(t, ck / "model.safetensors")
    fix(ck, tmp_path / "out")


@pytest.mark.parametrize("fmt,drop,field", [("speculators-3.1", "input_norm.weight", "norm_before_fc"),
                                            ("automodel-3.1", "model.fc_norm.1.weight", "fc_norm")])
def test_a_switch_without_its_tensors(tmp_path, fmt, drop, field):
    ck = make(tmp_path, fmt)
    t = load_st(ck / "model.safetensors")
    t.pop(drop)
    save_st(t, ck / "model.safetensors")
    served = drop.removeprefix("model.")
    _fails(tmp_path, ck, f"{served}: required but missing (config.json sets {field}")


def test_k_ids_that_do_not_match_fcs_width(tmp_path):
    ck = make(tmp_path, "speculators-k5")
    cfg = json.loads((ck / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [2, 15, 27]  # three ids, fc reads five states
    (ck / "config.json").write_text(json.dumps(cfg))
    T = PICO.target_hidden
    text = _fails(tmp_path, ck,
                  f"fc.weight: shape [{PICO.hidden}, {5 * T}] but the config implies [H={PICO.hidden}, k*T={3 * T}]",
                  f"names 3 layers but fc reads 5 ({5 * T} in-features / T {T})")
    assert "--rewire" not in text  # rewriting the ids fixes no shape: the hint is to inspect


def test_a_peagle_architecture_without_mask_hidden(tmp_path):
    ck = make(tmp_path, "specforge-peagle")
    t = load_st(ck / "model.safetensors")
    t.pop("mask_hidden")
    save_st(t, ck / "model.safetensors")
    _fails(tmp_path, ck, "mask_hidden: required but missing")


# --- the format files' new fields are validated -------------------------------------------------------

GOOD = {"schema": 1, "name": "fmt", "title": "A test format", "priority": 5,
        "detect": {"all": [{"any_key_prefix": ["x."]}]}, "rules": []}
RECORD = {"file": "config.yaml", "dirs": [{"dir": "."}], "field": "a.b", "numbering": "output",
          "default_ids": ["1", "N//2-1", "N-4"], "target_layers": {"field": "num_hidden_layers"}, "why": "w"}


@pytest.mark.parametrize("extra,message", [
    ({"config_set": [{"field": "norm_output", "value": False}]}, "config_set 0 must be"),
    ({"config_set": [{"field": "f", "value": 1, "why": " "}]}, "config_set 0 has no 'why'"),
    ({"config_set": [{"field": "f", "value": 1, "why": "w"}, {"field": "f", "value": 2, "why": "w"}]},
     "sets a field twice"),
    ({"config_set": [{"field": "f", "value": 1, "why": "w", "source_warning": {"equals": 1, "code": "nope",
                                                                               "message": "m"}}]},
     "a declared finding code"),
    ({"findings": [{"when": [{"layout": ["x"]}], "level": "error", "code": "config-source", "message": "m"}]},
     "level must be warning or notice"),
    ({"findings": [{"when": [{"layout": ["x"]}], "level": "warning", "code": "nope", "message": "m"}]},
     "is not declared in eagle3conv.findings"),
    ({"findings": [{"when": [{"nope": 1}], "level": "warning", "code": "config-source", "message": "m"}]},
     "unknown detect condition"),
    ({"detect": {"all": [{"config_value": {"field": "f"}}]}}, "config_value must be"),
    ({"record": {**RECORD, "default_ids": ["N/2"]}}, "term 'N/2' is not"),
    ({"record": {**RECORD, "numbering": "vllm"}}, "record.numbering must be output or input"),
    ({"record": {k: v for k, v in RECORD.items() if k != "why"}}, "record must have the fields"),
    ({"record": {**RECORD, "dirs": [{"dir": "..", "when_path": "("}]}}, "bad when_path"),
    ({"config_from": "yaml"}, "config_from 'yaml' is not known"),
])
def test_new_format_fields_are_validated(tmp_path, extra, message):
    from eagle3conv.errors import MappingFileError

    path = tmp_path / "fmt.json"
    path.write_text(json.dumps({**GOOD, **extra}))
    with pytest.raises(MappingFileError, match=message):
        load_format_file(path)


def test_good_new_fields_load(tmp_path):
    path = tmp_path / "fmt.json"
    path.write_text(json.dumps({**GOOD, "record": RECORD, "config_from": "automodel",
                                "config_set": [{"field": "norm_output", "value": False, "why": "w"}],
                                "findings": [{"when": [{"layout": ["x"]}], "level": "notice",
                                              "code": "config-source", "message": "m", "fix": "f"}]}))
    fmt = load_format_file(path)
    assert fmt.record.default_ids == ("1", "N//2-1", "N-4") and fmt.record.layers_unless is None
    assert fmt.config_set[0].field == "norm_output" and fmt.findings[0].fix == "f"
