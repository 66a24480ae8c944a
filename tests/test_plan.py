"""The plan: every key's fate, shapes against the config, config edits, and what gets written."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import pytest
import torch

from conftest import (
    PICO,
    assert_sglang_checkpoint,
    eagle_config_path,
    load_sglang_tensors,
    load_st,
    save_st,
)
from eagle3conv.api import fix_keys
from eagle3conv.checkpoint.index import open_checkpoint
from eagle3conv.checkpoint.plan import build_plan, load_config_file
from eagle3conv.errors import CheckpointReadError, InvalidCheckpointError, UsageError
from eagle3conv.example import canonical_tensors

def edit_st(ckpt: Path, fn, name="model.safetensors") -> None:
    t = load_st(ckpt / name)
    t = fn(t) or t
    save_st(t, ckpt / name)


def edit_cfg(ckpt: Path, fn) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg = fn(cfg) or cfg
    (ckpt / "config.json").write_text(json.dumps(cfg))


def plan_of(ckpt: Path, **kw):
    return build_plan(open_checkpoint(ckpt), **kw)


def fates(plan) -> dict[str, str]:
    return {d.source: d.action for d in plan.decisions}


# --- every key lands in one bucket --------------------------------------------------------


def test_unmapped_keys_are_errors_listing_them(make_ckpt, tmp_path):
    ck = make_ckpt("sglang")

    def add(t):
        t["layers.0.self_attn.rotary_emb.foo"] = torch.ones(4)
        t["extra.weight"] = torch.ones(2, 2)

    edit_st(ck, add)
    plan = plan_of(ck)
    assert not plan.ok
    assert fates(plan)["extra.weight"] == "unmapped"
    assert fates(plan)["layers.0.self_attn.rotary_emb.foo"] == "unmapped"
    assert "extra.weight: unmapped: SGLang would skip it silently" in plan.errors
    assert any(e.startswith("layers.0.self_attn.rotary_emb.foo: unmapped") for e in plan.errors)
    with pytest.raises(InvalidCheckpointError) as e:
        fix_keys(ck, out=tmp_path / "out")
    assert e.value.exit_code == 3
    assert "2 problems" in e.value.message and "nothing was written" in e.value.message
    assert set(e.value.details) == set(plan.errors)
    assert not (tmp_path / "out").exists()


def test_unmapped_after_rename_names_the_target(make_ckpt):
    ck = make_ckpt("modelopt-export")
    edit_st(ck, lambda t: t.__setitem__("layers.0.mlp.experts.weight", torch.ones(2)))
    plan = plan_of(ck)
    assert "layers.0.mlp.experts.weight: unmapped (maps to midlayer.mlp.experts.weight): SGLang would skip it silently" in plan.errors


@pytest.mark.parametrize("fmt,key", [("sglang", "midlayer.1.mlp.up_proj.weight"),
                                     ("sglang", "additional_layers.0.mlp.up_proj.weight")])
def test_later_layers_in_no_engine_spelling_are_refused(make_ckpt, fmt, key):
    ck = make_ckpt(fmt)
    edit_st(ck, lambda t: t.__setitem__(key, torch.ones(4, 4)))
    plan = plan_of(ck)
    assert fates(plan)[key] == "refused"
    assert any(e.startswith(f"{key}: midlayer.N.* and additional_layers.* name later decoder layers") for e in plan.errors)


def test_a_lone_later_layer_tensor_is_a_layer_with_everything_else_missing(make_ckpt):
    ck = make_ckpt("modelopt-export")
    edit_st(ck, lambda t: t.__setitem__("layers.1.mlp.up_proj.weight", torch.ones(4, 4)))
    plan = plan_of(ck)
    assert fates(plan)["layers.1.mlp.up_proj.weight"] == "kept"
    assert any(e.startswith("layers.1.self_attn.q_proj.weight: required but missing") for e in plan.errors)
    assert any(e.startswith("layers.1.mlp.up_proj.weight: shape [4, 4] but the config implies") for e in plan.errors)


def test_a_layer_missing_in_the_middle_is_named(make_ckpt):
    ck = make_ckpt("speculators")
    edit_st(ck, lambda t: t.__setitem__("layers.2.self_attn.q_proj.weight", torch.ones(4, 4)))
    plan = plan_of(ck)
    (gap,) = [e for e in plan.errors if "are present but" in e]
    assert gap.startswith("decoder layers 0, 2 are present but layers.1 is missing")


def test_missing_required_key(make_ckpt):
    ck = make_ckpt("sglang")
    edit_st(ck, lambda t: {k: v for k, v in t.items() if k != "norm.weight"})
    plan = plan_of(ck)
    assert plan.errors == ["norm.weight: required but missing (final norm)"]


def test_collision_prefixed_and_unprefixed(make_ckpt):
    ck = make_ckpt("sglang")
    edit_st(ck, lambda t: t.__setitem__("model.midlayer.hidden_norm.weight", t["midlayer.hidden_norm.weight"].clone()))
    plan = plan_of(ck)
    assert "midlayer.hidden_norm.weight: 2 source keys map to it: midlayer.hidden_norm.weight, model.midlayer.hidden_norm.weight" in plan.errors


def test_fused_and_unfused_both_present(make_ckpt):
    ck = make_ckpt("sglang")
    edit_st(ck, lambda t: t.__setitem__("midlayer.mlp.gate_up_proj.weight",
                                         torch.cat([t["midlayer.mlp.gate_proj.weight"], t["midlayer.mlp.up_proj.weight"]])))
    plan = plan_of(ck)
    assert "midlayer.mlp.gate_proj.weight: both a fused and an unfused source provide it" in plan.errors
    assert "midlayer.mlp.up_proj.weight: both a fused and an unfused source provide it" in plan.errors


def test_plan_reads_no_weight_bytes(make_ckpt):
    """Only the vocab maps are read while planning: zeroed weights plan the same."""
    ck = make_ckpt("modelopt-export")
    plan = plan_of(ck)
    assert plan.ok
    assert all(o.data is None for o in plan.outputs if o.name != "t2d")


# --- shapes against the config ------------------------------------------------------------


def test_fc_with_wrong_in_features(make_ckpt):
    ck = make_ckpt("sglang")
    edit_st(ck, lambda t: t.__setitem__("fc.weight", t["fc.weight"][:, :95].contiguous()))
    plan = plan_of(ck)
    assert "fc.weight: shape [32, 95] but the config implies [H=32, k*T=96]" in plan.errors


def test_fc_against_explicit_target_hidden_size(make_ckpt):
    ck = make_ckpt("sglang")
    edit_cfg(ck, lambda c: c.__setitem__("target_hidden_size", 48))
    plan = plan_of(ck)
    # 96 = 2 * 48: k is taken from the config's 3 aux ids, so fc must be 3*48 wide
    assert "fc.weight: shape [32, 96] but the config implies [H=32, k*T=144]" in plan.errors


def test_q_proj_with_wrong_shape(make_ckpt):
    ck = make_ckpt("sglang")
    edit_st(ck, lambda t: t.__setitem__("midlayer.self_attn.q_proj.weight", t["midlayer.self_attn.q_proj.weight"][:, :32].contiguous()))
    plan = plan_of(ck)
    assert plan.errors == ["midlayer.self_attn.q_proj.weight: shape [32, 32] but the config implies [NH*HD=32, 2*H=64]"]


def test_shapes_follow_the_config_not_the_weights(make_ckpt):
    ck = make_ckpt("sglang")
    edit_cfg(ck, lambda c: c.__setitem__("num_key_value_heads", 4))
    plan = plan_of(ck)
    assert "midlayer.self_attn.k_proj.weight: shape [16, 64] but the config implies [NKV*HD=32, 2*H=64]" in plan.errors
    assert "midlayer.self_attn.v_proj.weight: shape [16, 64] but the config implies [NKV*HD=32, 2*H=64]" in plan.errors


def test_lm_head_against_draft_vocab_size(make_ckpt):
    ck = make_ckpt("sglang")
    edit_cfg(ck, lambda c: c.__setitem__("draft_vocab_size", 300))
    plan = plan_of(ck)
    assert "lm_head.weight: shape [320, 32] but the config implies [Vd=300, H=32]" in plan.errors


def test_integer_weight_refused(make_ckpt):
    ck = make_ckpt("sglang")
    edit_st(ck, lambda t: t.__setitem__("norm.weight", torch.ones(32, dtype=torch.int32)))
    assert "norm.weight: dtype I32, expected a floating-point weight" in plan_of(ck).errors


def test_no_vocab_size(make_ckpt):
    ck = make_ckpt("sglang")
    edit_cfg(ck, lambda c: c.pop("vocab_size") and None)
    plan = plan_of(ck)
    assert "config.json has no vocab_size (the target's vocab)" in plan.errors


# --- fused tensors --------------------------------------------------------------------------


def test_fused_qkv_and_gate_up_split_byte_exact(make_ckpt, tmp_path):
    ck = make_ckpt("sglang-fused")
    plan = plan_of(ck)
    assert plan.ok, plan.errors
    assert fates(plan)["model.midlayer.self_attn.qkv_proj.weight"] == "split"
    assert fates(plan)["model.midlayer.mlp.gate_up_proj.weight"] == "split"
    rows = {o.name: (o.row_start, o.row_end) for o in plan.outputs if o.row_end is not None}
    assert rows == {
        "midlayer.self_attn.q_proj.weight": (0, 32),
        "midlayer.self_attn.k_proj.weight": (32, 48),
        "midlayer.self_attn.v_proj.weight": (48, 64),
        "midlayer.mlp.gate_proj.weight": (0, 64),
        "midlayer.mlp.up_proj.weight": (64, 128),
    }
    out = tmp_path / "out"
    fix_keys(ck, out=out)
    assert_sglang_checkpoint(out)
    src = load_st(ck / "model.safetensors")
    got, _ = load_sglang_tensors(out)
    qkv = src["model.midlayer.self_attn.qkv_proj.weight"]
    gu = src["model.midlayer.mlp.gate_up_proj.weight"]

    def raw(t):
        return t.contiguous().view(torch.uint8).numpy().tobytes()

    assert raw(got["midlayer.self_attn.q_proj.weight"]) == raw(qkv[:32])
    assert raw(got["midlayer.self_attn.k_proj.weight"]) == raw(qkv[32:48])
    assert raw(got["midlayer.self_attn.v_proj.weight"]) == raw(qkv[48:])
    assert raw(got["midlayer.mlp.gate_proj.weight"]) == raw(gu[:64])
    assert raw(got["midlayer.mlp.up_proj.weight"]) == raw(gu[64:])


def test_fused_split_disagreeing_with_config(make_ckpt):
    ck = make_ckpt("sglang-fused")
    edit_cfg(ck, lambda c: c.__setitem__("num_key_value_heads", 1))
    plan = plan_of(ck)
    assert any(e.startswith("model.midlayer.self_attn.qkv_proj.weight: cannot split [64, 64]") for e in plan.errors)


def test_fused_split_from_pickle(tmp_path, make_ckpt):
    src = make_ckpt("sglang-fused")
    ck = tmp_path / "pickled"
    ck.mkdir()
    torch.save(load_st(src / "model.safetensors"), ck / "pytorch_model.bin")
    (ck / "config.json").write_text((src / "config.json").read_text())
    out = tmp_path / "out"
    fix_keys(ck, out=out)
    assert_sglang_checkpoint(out)


# --- embed_tokens ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["speculators", "angelslim"])
def test_embed_dropped_by_default_with_notice(make_ckpt, tmp_path, fmt):
    ck = make_ckpt(fmt)
    plan = plan_of(ck)
    assert fates(plan)["embed_tokens.weight"] == "dropped"
    assert "embed_tokens.weight" not in {o.name for o in plan.outputs}
    assert any(n.startswith("embed_tokens.weight dropped") and "--keep-embed" in n for n in plan.notices)
    out = tmp_path / "out"
    fix_keys(ck, out=out)
    assert_sglang_checkpoint(out)


@pytest.mark.parametrize("fmt", ["speculators", "angelslim"])
def test_embed_kept_with_keep_embed(make_ckpt, tmp_path, fmt):
    ck = make_ckpt(fmt)
    plan = plan_of(ck, keep_embed=True)
    assert fates(plan)["embed_tokens.weight"] == "kept"
    assert not any("embed_tokens.weight dropped" in n for n in plan.notices)
    out = tmp_path / "out"
    fix_keys(ck, out=out, keep_embed=True)
    assert_sglang_checkpoint(out, keep_embed=True)


def test_embed_with_wrong_shape_is_checked_only_when_kept(make_ckpt):
    ck = make_ckpt("angelslim")
    edit_st(ck, lambda t: t.__setitem__("embed_tokens.weight", t["embed_tokens.weight"][:1000].contiguous()))
    assert plan_of(ck).ok
    assert "embed_tokens.weight: shape [1000, 32] but the config implies [V=1024, H=32]" in plan_of(ck, keep_embed=True).errors


# --- dtype ------------------------------------------------------------------------------------


def test_dtype_cast_plan_and_write(make_ckpt, tmp_path):
    ck = make_ckpt("modelopt-export")
    plan = plan_of(ck, dtype="fp32")
    assert plan.out_dtype == "F32"
    by = {o.name: o for o in plan.outputs}
    for name, o in by.items():
        if name == "d2t":
            assert o.dtype == "I64"
        elif name == "t2d":
            assert o.dtype == "BOOL"
        else:
            assert (o.dtype, o.source_dtype) == ("F32", "BF16"), name
            assert o.to_dict()["cast_from"] == "BF16"
    assert [(e.field, e.old, e.new) for e in plan.config_edits] == [("torch_dtype", "bfloat16", "float32")]
    out = tmp_path / "out"
    fix_keys(ck, out=out, dtype="fp32")
    cfg = assert_sglang_checkpoint(out, dtype=torch.float32)
    assert cfg["torch_dtype"] == "float32"


def test_dtype_same_as_source_is_no_cast(make_ckpt):
    plan = plan_of(make_ckpt("sglang"), dtype="bfloat16")
    assert all("cast_from" not in o.to_dict() for o in plan.outputs)
    assert plan.config_edits == [] and plan.is_identity()


def test_downcast_to_fp16(make_ckpt, tmp_path):
    ck = make_ckpt("sglang")
    out = tmp_path / "out"
    fix_keys(ck, out=out, dtype="fp16")
    assert_sglang_checkpoint(out, dtype=torch.float16)


def test_unknown_dtype(make_ckpt):
    with pytest.raises(UsageError, match="--dtype int4"):
        plan_of(make_ckpt("sglang"), dtype="int4")


def test_multi_chunk_copies_and_splits(make_ckpt, tmp_path, monkeypatch):
    """With 4 KiB chunks every pico weight moves in several chunks; splits and copies stay exact."""
    from eagle3conv.checkpoint import writer

    monkeypatch.setattr(writer, "CHUNK", 4096)
    for fmt in ("sglang-fused", "specforge-runtime", "speculators"):
        out = tmp_path / f"out-{fmt}"
        res = fix_keys(make_ckpt(fmt), out=out, keep_embed=fmt == "speculators", dtype="bf16")
        assert res.written.verified == len(res.plan.outputs)
        assert_sglang_checkpoint(out, keep_embed=fmt == "speculators")


def test_upcast_larger_than_one_chunk(make_ckpt, tmp_path):
    from eagle3conv.checkpoint import writer

    vd = writer.CHUNK // (2 * PICO.hidden) + 64  # a bf16 lm_head just over CHUNK/2 bytes: its fp32 copy spans 2 chunks
    dims = dataclasses.replace(PICO, vocab=2 * vd, draft_vocab=vd)
    out = tmp_path / "out"
    fix_keys(make_ckpt("sglang", vocab=2 * vd, draft_vocab=vd), out=out, dtype="fp32")
    assert_sglang_checkpoint(out, dims, dtype=torch.float32)


# --- config edits ------------------------------------------------------------------------------


def _edits(plan) -> dict:
    return {e.field: (e.old, e.new) for e in plan.config_edits}


def test_config_edits_plain_llama(make_ckpt, tmp_path):
    ck = make_ckpt("sglang")

    def mess(c):
        c["architectures"] = ["LlamaForCausalLM"]
        del c["draft_vocab_size"]
        del c["model_type"]
        c["tie_word_embeddings"] = True
        c["num_hidden_layers"] = 2

    edit_cfg(ck, mess)
    plan = plan_of(ck)
    assert plan.ok, plan.errors
    assert _edits(plan) == {
        "architectures": (["LlamaForCausalLM"], ["LlamaForCausalLMEagle3"]),
        "model_type": (None, "llama"),
        "num_hidden_layers": (2, 1),
        "draft_vocab_size": (None, 320),
        "tie_word_embeddings": (True, False),
    }
    for e in plan.config_edits:
        assert e.why
    assert not plan.is_identity()
    out = tmp_path / "out"
    fix_keys(ck, out=out)
    assert_sglang_checkpoint(out)


def test_no_draft_vocab_size_when_head_is_not_pruned(make_ckpt):
    ck = make_ckpt("sglang")
    edit_cfg(ck, lambda c: c.pop("draft_vocab_size") and None)
    edit_st(ck, lambda t: {k: v for k, v in t.items() if k not in ("d2t", "t2d")} | {"lm_head.weight": torch.zeros(1024, 32, dtype=torch.bfloat16)})
    plan = plan_of(ck)
    assert plan.ok, plan.errors
    assert "draft_vocab_size" not in _edits(plan)


def test_target_hidden_size_written_when_t_differs(make_ckpt, tmp_path):
    d = {"target_hidden": 64}
    ck = make_ckpt("sglang", **d)
    edit_cfg(ck, lambda c: c.pop("target_hidden_size") and None)
    # T != H: SGLang embeds with the drafter's own table, so the drafter must carry one
    embed = canonical_tensors(dataclasses.replace(PICO, **d))["embed_tokens.weight"]
    edit_st(ck, lambda t: t | {"embed_tokens.weight": embed})
    plan = plan_of(ck)
    assert plan.ok, plan.errors
    assert _edits(plan) == {"target_hidden_size": (None, 64)}
    assert (plan.symbols["k"], plan.symbols["T"]) == (3, 64)
    out = tmp_path / "out"
    fix_keys(ck, out=out)
    assert_sglang_checkpoint(out, dataclasses.replace(PICO, **d), keep_embed=True)


def test_target_hidden_size_kept_when_present(make_ckpt):
    ck = make_ckpt("sglang", target_hidden=64)
    plan = plan_of(ck)
    assert plan.ok and plan.config_edits == [] and plan.is_identity()


def test_target_hidden_size_inferred_without_aux_ids(make_ckpt):
    ck = make_ckpt("sglang", target_hidden=64)

    def strip(c):
        del c["target_hidden_size"]
        del c["eagle_config"]

    edit_cfg(ck, strip)
    plan = plan_of(ck)
    assert not plan.ok or _edits(plan).get("target_hidden_size") == (None, 64)


def test_training_config_fields_survive(make_ckpt):
    ck = make_ckpt("sglang")
    edit_cfg(ck, lambda c: c.update(rope_scaling={"rope_type": "llama3", "factor": 8.0}, custom_field=[1, 2]))
    plan = plan_of(ck)
    assert plan.config["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0}
    assert plan.config["custom_field"] == [1, 2]


# --- aux-layer ids ---------------------------------------------------------------------------------


def test_modelopt_ids_converted_for_every_engine(make_ckpt, tmp_path):
    ck = make_ckpt("modelopt-export")  # nested output-of-layer ids [1, 14, 26]
    plan = plan_of(ck)
    assert plan.aux_ids == {"eagle_config.eagle_aux_hidden_state_layer_ids": [1, 14, 26]}
    out = tmp_path / "out"
    fix_keys(ck, out=out)
    cfg = assert_sglang_checkpoint(out, expect_aux={"eagle_config.eagle_aux_hidden_state_layer_ids": [1, 14, 26],
                                                    "eagle_aux_hidden_state_layer_ids": [2, 15, 27]})
    assert cfg["eagle_config"]["use_aux_hidden_state"] is True
    aux = cfg["eagle3conv"]["aux_layers"]
    assert aux["layers"] == [{"output_of": 1}, {"output_of": 14}, {"output_of": 26}]
    ids = {f["field"]: f for f in aux["ids"]}
    assert len(ids["eagle_config.eagle_aux_hidden_state_layer_ids"]["read_by"]) == 2  # both SGLang releases
    assert ids["eagle3_layers_to_capture"]["kind"] == "launch_option"
    assert "modelopt-export" in aux["source"] and "output-of-layer numbering" in aux["source"]


def test_aux_ids_both_places_carried_over(make_ckpt, tmp_path):
    ck = make_ckpt("sglang")
    edit_cfg(ck, lambda c: c.__setitem__("eagle_aux_hidden_state_layer_ids", [2, 15, 27]))
    out = tmp_path / "out"
    fix_keys(ck, out=out)
    assert_sglang_checkpoint(out, expect_aux={
        "eagle_config.eagle_aux_hidden_state_layer_ids": [1, 14, 26],
        "eagle_aux_hidden_state_layer_ids": [2, 15, 27],
    })


def test_speculators_config_rebuilt_from_transformer_layer_config(make_ckpt, tmp_path):
    ck = make_ckpt("speculators")
    plan = plan_of(ck)
    assert plan.ok, plan.errors
    assert plan.aux_ids == {"eagle_aux_hidden_state_layer_ids": [2, 15, 27]}
    assert any("rebuilt from speculators' transformer_layer_config" in n for n in plan.notices)
    assert not any("norm_before_residual" in n for n in plan.notices)
    out = tmp_path / "out"
    fix_keys(ck, out=out)
    # speculators' input-of-layer ids [2, 15, 27] = outputs 1, 14, 26: converted for SGLang, kept for vLLM
    cfg = assert_sglang_checkpoint(out, expect_aux={"eagle_config.eagle_aux_hidden_state_layer_ids": [1, 14, 26],
                                                    "eagle_aux_hidden_state_layer_ids": [2, 15, 27]})
    assert "speculators" in cfg["eagle3conv"]["aux_layers"]["source"]
    assert "speculators_model_type" not in cfg and "transformer_layer_config" not in cfg
    assert cfg["eagle3conv"]["source"] == {
        "format": "speculators", "speculators_model_type": "eagle3",
        "verifier": "example/pico-target",  # the pico fixture does not claim a real target
    }
    assert cfg["norm_before_residual"] is False
    assert cfg["intermediate_size"] == PICO.intermediate and cfg["rope_theta"] == 10000.0


def test_speculators_norm_before_residual_notice(make_ckpt):
    ck = make_ckpt("speculators")
    edit_cfg(ck, lambda c: c.__setitem__("norm_before_residual", True))
    assert any("norm_before_residual is true" in n for n in plan_of(ck).notices)


def test_speculators_without_layer_config(make_ckpt):
    ck = make_ckpt("speculators")
    edit_cfg(ck, lambda c: c.pop("transformer_layer_config") and None)
    with pytest.raises(InvalidCheckpointError, match="no transformer_layer_config"):
        plan_of(ck)


def test_speculators_input_norm_kept_and_switched_on(make_ckpt):
    """speculators 0.9.0 trains with norm_before_fc (input_norm) by default; SGLang (from 0.5.17) and
    vLLM 0.33.0 load it (docs/facts.md §6): kept, and the switch written (it used to be refused)."""
    ck = make_ckpt("speculators")
    edit_st(ck, lambda t: t.__setitem__("input_norm.weight", torch.ones(96)))
    plan = plan_of(ck)
    assert plan.ok, plan.errors
    assert fates(plan)["input_norm.weight"] == "kept"
    assert plan.config["norm_before_fc"] is True


def test_speculators_verifier_copies_dropped(make_ckpt, tmp_path):
    ck = make_ckpt("speculators")
    edit_st(ck, lambda t: t.update({"verifier_lm_head.weight": torch.ones(4, 4), "verifier_norm.weight": torch.ones(4)}))
    plan = plan_of(ck)
    assert fates(plan)["verifier_lm_head.weight"] == "dropped"
    assert fates(plan)["verifier_norm.weight"] == "dropped"
    assert plan.ok


def test_no_aux_ids_notice(make_ckpt):
    ck = make_ckpt("sglang")
    edit_cfg(ck, lambda c: c.pop("eagle_config") and None)
    plan = fix_keys(ck, dry_run=True).plan
    assert plan.ok and plan.aux_ids == {}
    assert any(n.startswith("aux layers: config has no aux-layer ids: every engine uses its default")
               for n in plan.notices)


# --- Model Optimizer training folder ------------------------------------------------------------


def _data_start(path: Path) -> int:
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def test_modelopt_train_base_weights_dropped_and_never_read(make_ckpt, tmp_path):
    ck = make_ckpt("modelopt-train")
    base = ck / "model-00001-of-00002.safetensors"
    start = _data_start(base)
    size = base.stat().st_size
    with open(base, "r+b") as f:  # trash every data byte, keep the header
        f.seek(start)
        f.write(b"\xff" * (size - start))
    plan = plan_of(ck)
    assert plan.ok, plan.errors
    dropped = sorted(d.source for d in plan.decisions if d.action == "dropped")
    assert dropped == [
        "lm_head.weight",
        "model.embed_tokens.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.input_layernorm.weight",
        "model.layers.1.self_attn.q_proj.weight",
        "model.norm.weight",
    ]
    assert all(d.why.startswith("base-model weight") for d in plan.decisions if d.action == "dropped")
    assert any("extracted from a whole-model checkpoint; 7 tensors dropped unread" in n for n in plan.notices)
    out = tmp_path / "out"
    res = fix_keys(ck, out=out)
    cfg = assert_sglang_checkpoint(out, expect_aux={"eagle_config.eagle_aux_hidden_state_layer_ids": [1, 14, 26],
                                                    "eagle_aux_hidden_state_layer_ids": [2, 15, 27]})
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 14, 26], "use_aux_hidden_state": True,
                                   "use_last_layernorm": True}
    assert [f for f, _ in res.shards] == ["model.safetensors"]
    # in place would delete the base model: refused
    with pytest.raises(UsageError, match="whole-model modelopt-train checkpoint"):
        fix_keys(ck)


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
def test_modelopt_train_big_base_is_not_read(make_ckpt, tmp_path):
    """A 1 GiB (sparse) base shard costs nothing: its bytes are never read."""
    ck = make_ckpt("modelopt-train")
    fix_keys(make_ckpt("sglang"), out=tmp_path / "warm")  # lazy imports
    base = ck / "model-00001-of-00002.safetensors"
    n = 1 << 29
    header = {"__metadata__": {"format": "pt"},
              "model.embed_tokens.weight": {"dtype": "BF16", "shape": [n // 32, 32], "data_offsets": [0, 2 * n]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(base, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + 2 * n)
    idx_path = ck / "model.safetensors.index.json"
    idx = json.loads(idx_path.read_text())
    idx["weight_map"] = {k: v for k, v in idx["weight_map"].items() if not v.startswith("model-00001")}
    idx["weight_map"]["model.embed_tokens.weight"] = "model-00001-of-00002.safetensors"
    idx_path.write_text(json.dumps(idx))

    def rchar():
        return int(next(l for l in Path("/proc/self/io").read_text().splitlines() if l.startswith("rchar:")).split()[1])

    before = rchar()
    fix_keys(ck, out=tmp_path / "out")
    assert rchar() - before < 16 << 20
    assert_sglang_checkpoint(tmp_path / "out")


def test_modelopt_train_without_eagle_config(make_ckpt):
    ck = make_ckpt("modelopt-train")
    edit_cfg(ck, lambda c: c.pop("eagle_config") and None)
    with pytest.raises(InvalidCheckpointError, match="has no eagle_config"):
        plan_of(ck)


def test_modelopt_train_old_names(make_ckpt, tmp_path):
    ck = make_ckpt("modelopt-train")
    shard = "model-00002-of-00002.safetensors"

    def old(t):
        t["eagle_module.hidden_norm.weight"] = t.pop("eagle_module.layers.0.hidden_norm.weight")
        t["eagle_module.input_embeds_norm.weight"] = t.pop("eagle_module.layers.0.input_layernorm.weight")
        t["eagle_module.eagle_lm_head.weight"] = t.pop("eagle_module.lm_head.weight")

    edit_st(ck, old, shard)
    idx_path = ck / "model.safetensors.index.json"
    idx = json.loads(idx_path.read_text())
    for a, b in [("eagle_module.layers.0.hidden_norm.weight", "eagle_module.hidden_norm.weight"),
                 ("eagle_module.layers.0.input_layernorm.weight", "eagle_module.input_embeds_norm.weight"),
                 ("eagle_module.lm_head.weight", "eagle_module.eagle_lm_head.weight")]:
        idx["weight_map"][b] = idx["weight_map"].pop(a)
    idx_path.write_text(json.dumps(idx))
    out = tmp_path / "out"
    fix_keys(ck, out=out)
    assert_sglang_checkpoint(out)


# --- original EAGLE ---------------------------------------------------------------------------------


def test_original_eagle_needs_config(make_ckpt, tmp_path):
    ck = make_ckpt("eagle")
    assert not (ck / "config.json").exists()
    with pytest.raises(UsageError) as e:
        plan_of(ck)
    assert "no config.json for this eagle checkpoint" in e.value.message
    assert "--config" in e.value.hint
    plan = plan_of(ck, config_override=load_config_file(eagle_config_path(ck)))
    assert plan.ok, plan.errors
    assert _edits(plan) == {"architectures": (["LlamaForCausalLM"], ["LlamaForCausalLMEagle3"])}
    out = tmp_path / "out"
    fix_keys(ck, out=out, config=eagle_config_path(ck))
    assert_sglang_checkpoint(out, expect_aux={})


def _module_prefixed_eagle(make_ckpt):
    ck = make_ckpt("eagle")
    t = torch.load(ck / "pytorch_model.bin")
    torch.save({f"module.{k}": v for k, v in t.items()}, ck / "pytorch_model.bin")
    return ck


def test_eagle_deepspeed_module_prefix_with_from(make_ckpt, tmp_path):
    ck = _module_prefixed_eagle(make_ckpt)
    out = tmp_path / "out"
    res = fix_keys(ck, out=out, config=eagle_config_path(ck), source_format="eagle")
    assert res.plan.format.name == "eagle"
    assert_sglang_checkpoint(out)


def test_eagle_deepspeed_module_prefix_detected(make_ckpt, tmp_path):
    ck = _module_prefixed_eagle(make_ckpt)
    out = tmp_path / "out"
    res = fix_keys(ck, out=out, config=eagle_config_path(ck))
    assert res.plan.format.name == "eagle"
    assert_sglang_checkpoint(out)


def test_config_file_override(make_ckpt, tmp_path):
    ck = make_ckpt("sglang")
    other = tmp_path / "cfgdir"
    other.mkdir()
    cfg = json.loads((ck / "config.json").read_text())
    cfg["rope_theta"] = 500000.0
    (other / "config.json").write_text(json.dumps(cfg))
    plan = plan_of(ck, config_override=load_config_file(other))  # a folder works too
    assert plan.config["rope_theta"] == 500000.0
    assert "config.json in the checkpoint replaced by --config" in plan.notices
    with pytest.raises(CheckpointReadError, match="not valid JSON"):
        (other / "config.json").write_text("{x")
        load_config_file(other / "config.json")
    with pytest.raises(CheckpointReadError, match="cannot read"):
        load_config_file(tmp_path / "missing.json")


# --- rules dropping buffers ----------------------------------------------------------------------


def test_rotary_inv_freq_dropped_by_rule(make_ckpt, tmp_path):
    ck = make_ckpt("sglang")
    edit_st(ck, lambda t: t.update({"midlayer.self_attn.rotary_emb.inv_freq": torch.ones(4),
                                     "midlayer.mlp._extra_state": torch.ones(1)}))
    plan = plan_of(ck)
    assert fates(plan)["midlayer.self_attn.rotary_emb.inv_freq"] == "dropped"
    assert fates(plan)["midlayer.mlp._extra_state"] == "dropped"
    out = tmp_path / "out"
    fix_keys(ck, out=out)
    assert_sglang_checkpoint(out)


@pytest.mark.parametrize("fmt,key", [("modelopt-export", "layers.0.self_attn.rotary_emb.inv_freq"),
                                     ("speculators", "layers.0.self_attn.rotary_emb.inv_freq"),
                                     ("sglang", "model.midlayer.self_attn.rotary_emb.inv_freq"),
                                     ("modelopt-export", "layers.0.mlp._extra_state")])
def test_rotary_inv_freq_dropped_under_a_renamed_prefix(make_ckpt, fmt, key):
    ck = make_ckpt(fmt)
    edit_st(ck, lambda t: t.__setitem__(key, torch.ones(4)))
    plan = plan_of(ck)
    assert fates(plan)[key] == "dropped"
    assert plan.ok, plan.errors


def test_bf16_d2t_is_a_plan_error(make_ckpt):
    ck = make_ckpt("sglang")
    edit_st(ck, lambda t: t.__setitem__("d2t", t["d2t"].to(torch.bfloat16)))
    plan = plan_of(ck)
    assert any(e.startswith("d2t has dtype") for e in plan.errors)


def test_float_d2t_is_a_plan_error(make_ckpt):
    ck = make_ckpt("sglang")
    edit_st(ck, lambda t: t.__setitem__("d2t", t["d2t"].to(torch.float32)))
    assert plan_of(ck).errors == ["d2t has dtype F32; it must hold integer offsets"]


# --- identity ---------------------------------------------------------------------------------------


def test_identity(make_ckpt):
    assert plan_of(make_ckpt("sglang")).is_identity()
    assert plan_of(make_ckpt("specforge")).is_identity()
    assert not plan_of(make_ckpt("modelopt-export")).is_identity()  # renames + rebuilt t2d
    assert not plan_of(make_ckpt("sglang-fused")).is_identity()
    assert not plan_of(make_ckpt("specforge-runtime")).is_identity()  # a pickle


def test_identity_needs_format_pt_metadata(make_ckpt):
    ck = make_ckpt("sglang")
    from safetensors.torch import save_file

    t = load_st(ck / "model.safetensors")
    save_file(t, str(ck / "model.safetensors"))  # no __metadata__
    plan = plan_of(ck)
    assert plan.ok and not plan.is_identity()


def test_plan_to_dict_is_json(make_ckpt):
    plan = plan_of(make_ckpt("sglang-fused"), dtype="fp32")
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["format"] == "sglang" and d["ok"] and d["identity"] is False
    assert {o["name"] for o in d["outputs"]} == {o.name for o in plan.outputs}
    q = next(o for o in d["outputs"] if o["name"] == "midlayer.self_attn.q_proj.weight")
    assert q["rows"] == [0, 32] and q["cast_from"] == "BF16"
    assert d["output_bytes"] == sum(o.nbytes for o in plan.outputs)


def test_fc_norm_kept_and_switched_on(make_ckpt):
    ck = make_ckpt("sglang")
    t = load_st(ck / "model.safetensors")
    T = PICO.target_hidden
    for slot in range(3):
        t[f"fc_norm.{slot}.weight"] = torch.ones(T, dtype=torch.bfloat16)
    save_st(t, ck / "model.safetensors")
    edit_cfg(ck, lambda c: c.__setitem__("norm_output", True))
    plan = plan_of(ck)
    assert plan.ok, plan.errors
    assert {o.name for o in plan.outputs} >= {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"}
    assert plan.config["fc_norm"] is True and plan.config["norm_output"] is True
    # SGLang 0.5.12-0.5.23 and vLLM 0.33.0 both read fc_norm and norm_output on Llama drafters (the
    # engine rules): no notice claims otherwise; the wiring check's rows say per release what is served.
    # What is said is sglang.json's warning that norm_output true is SpecForge 0.2.0's plain EAGLE-3
    assert not any("fc_norm" in f.message or "norm_output" in f.message for f in plan.findings
                   if f.code != "config-source")
    assert [f.level for f in plan.findings if f.code == "config-source" and "norm_output" in f.message] == ["warning"]
