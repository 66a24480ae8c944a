"""Real published drafter configs judged right (issue 28): no false alarm, no miss.

Each config below is a trainer's own published file, copied field for field (the path is cited), with
weights of exactly the shapes it implies. The weight files are sparse: the safetensors header is real,
the bytes are zeros except the vocab maps (d2t, t2d), which hold a real mapping -- the checks read only
headers and the maps, so a 70B drafter costs a few kilobytes of disk."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from eagle3conv.wiring.audit import audit_config
from helpers import run

SIZES = {"BF16": 2, "F16": 2, "I64": 8, "BOOL": 1}

# sgl-project/SpecForge configs/qwen3-32b-eagle3.json
QWEN3_32B = {"architectures": ["LlamaForCausalLMEagle3"], "attention_bias": False, "attention_dropout": 0.0,
             "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 80, "hidden_act": "silu", "hidden_size": 5120,
             "initializer_range": 0.02, "intermediate_size": 25600, "max_position_embeddings": 40960,
             "max_window_layers": 64, "model_type": "llama", "num_attention_heads": 64, "num_hidden_layers": 1,
             "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
             "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
             "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
             "draft_vocab_size": 32000}
# sgl-project/SpecForge configs/llama3-70B-ealge3.json
LLAMA3_70B = {"architectures": ["LlamaForCausalLMEagle3"], "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
              "head_dim": 128, "hidden_act": "silu", "hidden_size": 8192, "initializer_range": 0.02,
              "intermediate_size": 28672, "max_position_embeddings": 4096, "model_type": "llama",
              "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 1, "pad_token_id": 0,
              "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                                      "original_max_position_embeddings": 4096, "rope_type": "llama3"},
              "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "float16",
              "transformers_version": "4.28.1", "use_cache": True, "vocab_size": 128256, "draft_vocab_size": 32000}
# sgl-project/SpecForge configs/gpt-oss-120B-eagle3.json (read from the fork yilian49/SpecForge@c8b47c64)
GPT_OSS_120B = {"architectures": ["LlamaForCausalLMEagle3"],
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17, 33]}, "head_dim": 128,
                "hidden_act": "silu", "hidden_size": 2880, "initializer_range": 0.02, "intermediate_size": 16384,
                "eos_token_id": 200002, "max_position_embeddings": 131072, "model_type": "llama",
                "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 1, "pad_token_id": 199999,
                "rms_norm_eps": 1e-05, "rope_theta": 150000, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                "transformers_version": "4.52.3", "use_cache": True, "vocab_size": 201088, "draft_vocab_size": 32000}
# sgl-project/SpecForge configs/deepseek-v3-671b-eagle3.json
DEEPSEEK_V3 = {"architectures": ["LlamaForCausalLMEagle3"],
               "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57], "use_aux_hidden_state": True},
               "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 7168,
               "initializer_range": 0.02, "intermediate_size": 40960, "max_position_embeddings": 163840,
               "model_type": "llama", "num_attention_heads": 56, "num_key_value_heads": 8, "num_hidden_layers": 1,
               "pad_token_id": 0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "float16",
               "transformers_version": "4.28.1", "use_cache": True, "vocab_size": 129280, "draft_vocab_size": 32000}
# sgl-project/SpecForge configs/qwen3-30B-A3B-eagle3-moe-draft.json
QWEN3_MOE_DRAFT = {"architectures": ["Qwen3MoEForCausalLMEagle3"], "attention_bias": False, "attention_dropout": 0.0,
                   "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
                   "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
                   "max_position_embeddings": 262144, "max_window_layers": 1, "mlp_only_layers": [],
                   "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": True,
                   "num_attention_heads": 32, "num_hidden_layers": 1, "num_experts": 128, "num_experts_per_tok": 8,
                   "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
                   "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.1, "sliding_window": None,
                   "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.53.2",
                   "use_cache": True, "use_sliding_window": False, "vocab_size": 151936, "draft_vocab_size": 32000,
                   "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 23, 44]}}


def llama_shapes(cfg: dict) -> dict[str, list[int]]:
    """The tensors an SGLang-named Llama EAGLE-3 drafter of ``cfg`` holds (as SpecForge saves it)."""
    h, i, v, vd = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["draft_vocab_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    return {"fc.weight": [h, 3 * h], "midlayer.hidden_norm.weight": [h], "midlayer.input_layernorm.weight": [h],
            "midlayer.post_attention_layernorm.weight": [h], "midlayer.self_attn.q_proj.weight": [q, 2 * h],
            "midlayer.self_attn.k_proj.weight": [kv, 2 * h], "midlayer.self_attn.v_proj.weight": [kv, 2 * h],
            "midlayer.self_attn.o_proj.weight": [h, q], "midlayer.mlp.gate_proj.weight": [i, h],
            "midlayer.mlp.up_proj.weight": [i, h], "midlayer.mlp.down_proj.weight": [h, i], "norm.weight": [h],
            "lm_head.weight": [vd, h], "d2t": [vd], "t2d": [v]}


def sparse_drafter(folder: Path, cfg: dict, shapes: dict[str, list[int]]) -> Path:
    """config.json and a sparse model.safetensors of ``shapes``; d2t/t2d hold a real map (draft id i ->
    target id 2i: offsets i, every other target id kept)."""
    folder.mkdir(parents=True, exist_ok=True)
    dtype = "F16" if cfg.get("torch_dtype") == "float16" else "BF16"
    kinds = {"d2t": "I64", "t2d": "BOOL"}
    vd, v = cfg["draft_vocab_size"], cfg["vocab_size"]
    t2d = np.zeros(v, bool)
    t2d[np.arange(vd) * 2] = True
    values = {"d2t": np.arange(vd, dtype=np.int64).tobytes(), "t2d": t2d.tobytes()}
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes.items():
        kind = kinds.get(name, dtype)
        n = int(np.prod(shape)) * SIZES[kind]
        header[name] = {"dtype": kind, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        base = f.tell()
        for name, data in values.items():
            if name in header:
                f.seek(base + header[name]["data_offsets"][0])
                f.write(data)
        f.truncate(base + off)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def rope_codes(cfg: dict) -> list[str]:
    names = set(llama_shapes(cfg))
    return [f.code for f in audit_config(cfg, names) if f.code == "audit-rope-fields"]


# --- the RoPE false alarm -------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [QWEN3_32B, LLAMA3_70B], ids=["rope_scaling-null", "llama3-rope_scaling"])
def test_no_rope_alarm_on_specforges_configs(cfg, tmp_path):
    """Nothing to warn about: transformers 5.24's config reads a rope_scaling object into rope_parameters
    itself (modeling_rope_utils.py convert_rope_params_to_dict), rope_theta with it; null is plain RoPE."""
    from transformers import LlamaConfig

    assert rope_codes(cfg) == []
    read = LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"}).rope_parameters
    assert read["rope_type"] == (cfg["rope_scaling"] or {}).get("rope_type", "default")
    assert read["rope_theta"] == cfg["rope_theta"]
    target = "qwen3-32b" if cfg is QWEN3_32B else "llama-3.3-70b"
    ck = sparse_drafter(tmp_path / "d", cfg, llama_shapes(cfg))
    text = run("config", ck, "--check", "--target", target, ok=None).stdout
    assert "rope_parameters" not in text and "plain RoPE" not in text
    # where it matters it still warns: rope_parameters alone, rope_theta only inside it
    only = {k: v for k, v in cfg.items() if k not in ("rope_scaling", "rope_theta")}
    only["rope_parameters"] = {**(cfg["rope_scaling"] or {"rope_type": "default"}), "rope_theta": cfg["rope_theta"]}
    assert rope_codes(only) == ["audit-rope-fields"]


# --- SpecForge's nested ids as a training record ---------------------------------------------------------


def test_specforge_gpt_oss_ids_are_its_training_record_so_vllms_ids_get_written(tmp_path):
    ck = sparse_drafter(tmp_path / "run" / "epoch_0_step_1000", GPT_OSS_120B, llama_shapes(GPT_OSS_120B))
    d = json.loads(run("inspect", ck, "--target", "gpt-oss-120b", "--json").stdout)
    plan = d["plan"]
    assert plan["format"] == "specforge"
    edits = {e["field"]: e["new"] for e in plan["config_edits"]}
    assert edits["eagle_aux_hidden_state_layer_ids"] == [2, 18, 34]  # vLLM: inputs of 2, 18, 34 = outputs 1, 17, 33
    rows = {r["engine"]: r for r in plan["wiring"]["engines"]}
    assert all(r.get("as_trained") is not False for r in rows.values()), rows
    assert "trained on: outputs of layers 1, 17, 33" in run("inspect", ck, "--target", "gpt-oss-120b").stdout


# --- target checks --------------------------------------------------------------------------------------


def test_a_deepseek_v3_drafter_fails_against_kimi_k2(tmp_path):
    ck = sparse_drafter(tmp_path / "d", DEEPSEEK_V3, llama_shapes(DEEPSEEK_V3))
    res = run("config", ck, "--check", "--target", "kimi-k2", "--json", ok=3)
    codes = {f["code"] for f in json.loads(res.stdout)["wiring"]["findings"] if f["level"] == "error"}
    assert "target-vocab" in codes
    res = run("config", ck, "--check", "--target", "deepseek-v3", "--json", ok=None)
    assert "target-vocab" not in {f["code"] for f in json.loads(res.stdout)["wiring"]["findings"]}


def test_a_recorded_target_layer_count_is_checked(tmp_path):
    cfg = {**GPT_OSS_120B, "eagle3conv": {"aux_layers": {"layers": [{"output_of": 1}, {"output_of": 17},
                                                                    {"output_of": 33}], "target_num_layers": 36}}}
    ck = sparse_drafter(tmp_path / "d", cfg, llama_shapes(cfg))
    assert "target-layers" not in run("config", ck, "--check", "--target", "gpt-oss-120b", ok=None).stdout
    res = run("config", ck, "--check", "--target", "llama-3.3-70b", "--json", ok=3)
    assert "target-layers" in {f["code"] for f in json.loads(res.stdout)["wiring"]["findings"]}


# --- config --check before fix-keys, MoE drafters, max positions ------------------------------------------


def test_config_check_on_a_checkpoint_not_yet_in_sglang_names_works_and_writes_nothing(tmp_path):
    """Model Optimizer's export names (layers.0.*), as eagle3conv example writes them."""
    ck = tmp_path / "mo"
    run("example", ck, "--format", "modelopt-export")
    before = {p.name: p.read_bytes() for p in ck.iterdir()}
    res = run("config", ck, "--check", "--target", "smollm2-135m")
    assert res.stdout.startswith("check: passed") and "not yet in SGLang's names (modelopt-export" in res.stdout
    assert {p.name: p.read_bytes() for p in ck.iterdir()} == before


def test_an_moe_drafter_is_one_clear_error(tmp_path):
    """SpecForge's Qwen3MoEForCausalLMEagle3: its MLP is Qwen3MoeSparseMoeBlock with the experts stacked
    (mlp.gate.weight, mlp.gate_weight / up_weight / down_weight: specforge/modeling/draft/qwen3_moe_eagle.py)."""
    c = QWEN3_MOE_DRAFT
    h, hd, e, im = c["hidden_size"], c["head_dim"], c["num_experts"], c["moe_intermediate_size"]
    shapes = {k: v for k, v in llama_shapes({**c, "intermediate_size": 1}).items() if ".mlp." not in k}
    shapes |= {"midlayer.self_attn.q_norm.weight": [hd], "midlayer.self_attn.k_norm.weight": [hd],
               "midlayer.mlp.gate.weight": [e, h], "midlayer.mlp.gate_weight": [e, im, h],
               "midlayer.mlp.up_weight": [e, im, h], "midlayer.mlp.down_weight": [e, h, im]}
    ck = sparse_drafter(tmp_path / "moe", c, shapes)
    res = run("fix-keys", ck, "--out", tmp_path / "out", "--json", ok=3)
    d = json.loads(res.stdout)
    assert "(1 problem)" in d["message"] and len(d["details"]) == 1
    assert "MoE drafters are not supported" in d["details"][0] and "4 router/expert tensors" in d["details"][0]
    text = run("inspect", ck, ok=3).stdout
    assert text.count("ERROR") == 1 and "MoE drafters are not supported" in text
    plan = json.loads(run("inspect", ck, "--json", ok=3).stdout)["plan"]
    assert [f["code"] for f in plan["findings"] if f["level"] == "error"] == ["moe-drafter"]


def test_max_positions_below_the_context_says_what_each_release_does():
    (f,) = [f for f in audit_config(LLAMA3_70B, set(llama_shapes(LLAMA3_70B)), max_context=131072)
            if f.code == "audit-max-positions"]
    assert "SGLang 0.5.12-0.5.23 refuses to start" in f.message and "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" in f.message
    assert "vLLM 0.33.0 raises the drafter's max_position_embeddings to 131072 (its RoPE, llama3" in f.message
    yarn = {**LLAMA3_70B, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}}
    (f,) = [f for f in audit_config(yarn, set(llama_shapes(yarn)), max_context=131072)
            if f.code == "audit-max-positions"]
    assert "vLLM 0.33.0 lowers the server's max_model_len to the drafter's 4096" in f.message


@pytest.mark.parametrize("cfg, target", [(QWEN3_32B, "qwen3-32b"), (GPT_OSS_120B, "gpt-oss-120b"),
                                         (DEEPSEEK_V3, "deepseek-v3")], ids=["qwen3-32b", "gpt-oss-120b", "deepseek-v3"])
def test_a_drafters_own_head_geometry_is_not_an_alarm(cfg, target, tmp_path):
    """SpecForge's published drafters have heads of their own: Qwen3-32B's head_dim 80 (target 128), gpt-oss-120B's
    32 heads of 128 (target 64 of 64), DeepSeek-V3's 56/8 heads (target 128/128). Neither engine requires them to
    match (docs/facts.md §13, the drafter's geometry against the target), so no finding speaks of them."""
    from eagle3conv.spec.targets import get_target

    t = get_target(target)
    assert (cfg["num_attention_heads"], cfg.get("head_dim")) != (t.num_attention_heads, t.head_dim)
    ck = sparse_drafter(tmp_path / "d", cfg, llama_shapes(cfg))
    res = run("config", ck, "--check", "--target", target, "--json", ok=None)
    findings = json.loads(res.stdout)["wiring"]["findings"]
    heads = r"head_dim|attention_heads|key_value_heads|\bheads?\b"
    assert not [f for f in findings if re.search(heads, f["message"]) and re.search(rf"target|{target}", f["message"])]
    assert not [f for f in findings if f["code"] in ("target-hidden", "target-vocab", "target-layers")]
