"""Small, deterministic EAGLE-3 drafter checkpoints in every trainer's naming.

``write_example`` backs ``eagle3conv example`` (the README's first command) and
the test suite's fixtures: the same weights, laid out the way each trainer
writes them, so a test can prove that every format converts to the same
SGLang checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from eagle3conv.spec.drafter import AUX_KEY, NESTED_AUX_FIELD, with_field

EXAMPLE_FORMATS = (
    "sglang", "sglang-fused", "specforge", "specforge-runtime", "eagle", "modelopt-train",
    "modelopt-export", "modelopt-export-old", "speculators", "angelslim", "draft-model-prefixed",
    # the trainers of 2026 (docs/facts.md §6), each variant as its trainer writes it
    "automodel", "automodel-3.1", "automodel-peagle",
    "speculators-3.1", "speculators-qwen3", "speculators-peagle", "speculators-k5",
    "specforge-export", "specforge-peagle", "specforge-runtime-peagle", "modelopt-export-0.47",
)
# examples whose config is not in the folder, as their trainer leaves it: the draft config lies beside
# the folder (:func:`config_beside`), to be passed with --config
EXAMPLE_CONFIG_BESIDE = ("specforge-runtime-0.2",)

# the switches of each 2026 variant: decoder layers, EAGLE-3.1's per-slot fc_norm, norm_before_fc's
# input_norm, Qwen3's per-head q/k norms, P-EAGLE's mask_hidden; k aux states
VARIANTS = {
    "automodel": {},
    "automodel-3.1": {"fc_norm": True},
    "automodel-peagle": {"layers": 2, "mask_hidden": True},
    "speculators-3.1": {"layers": 2, "input_norm": True},
    "speculators-qwen3": {"qk_norm": True},
    "speculators-peagle": {"layers": 2, "qk_norm": True, "mask_hidden": True},
    "speculators-k5": {"k": 5},
    "specforge-export": {},
    "specforge-peagle": {"layers": 2, "mask_hidden": True},
    "specforge-runtime-peagle": {"layers": 2, "mask_hidden": True},
    "specforge-runtime-0.2": {"fc_norm": True},
    "modelopt-export-0.47": {"layers": 2},
}
FIVE_AUX = (1, 7, 14, 20, 26)  # output-of-layer ids of a 30-layer target (SmolLM2-135M), k = 5
MASK_TOKEN_ID = 2  # the P-EAGLE examples' mask token: an id every example vocab holds


@dataclass(frozen=True)
class Dims:
    hidden: int = 64
    target_hidden: int = 576  # SmolLM2-135M, the target the example claims
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    intermediate: int = 128
    vocab: int = 49152
    draft_vocab: int = 2048
    aux_ids: tuple[int, ...] = (1, 14, 26)  # output-of-layer ids for a 30-layer target (SmolLM2-135M)
    seed: int = 0


def _target_name(d: Dims) -> str:
    """The target the example names in its trainer records: SmolLM2 when the dims fit it."""
    return "HuggingFaceTB/SmolLM2-135M-Instruct" if (d.target_hidden, d.vocab) == (576, 49152) else "example/pico-target"


def llama_config(d: Dims, *, architecture: str = "LlamaForCausalLMEagle3", with_ids: bool = True) -> dict:
    cfg = {
        "architectures": [architecture],
        "model_type": "llama",
        "hidden_size": d.hidden,
        "intermediate_size": d.intermediate,
        "num_attention_heads": d.heads,
        "num_key_value_heads": d.kv_heads,
        "head_dim": d.head_dim,
        "num_hidden_layers": 1,
        "vocab_size": d.vocab,
        "draft_vocab_size": d.draft_vocab,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    if d.target_hidden != d.hidden:
        cfg["target_hidden_size"] = d.target_hidden
    if with_ids:
        cfg = with_field(with_field(cfg, NESTED_AUX_FIELD, list(d.aux_ids)), "eagle_config.use_aux_hidden_state", True)
    return cfg


def canonical_tensors(d: Dims) -> dict:
    """The drafter in SGLang's names (bf16 weights, int64 d2t, bool t2d), seeded."""
    import torch

    g = torch.Generator().manual_seed(d.seed)
    H, T, k = d.hidden, d.target_hidden, len(d.aux_ids)

    def w(*shape, scale=0.02):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)

    def norm(n):
        return (1.0 + 0.1 * torch.randn(n, generator=g)).to(torch.bfloat16)

    t = {
        "fc.weight": w(H, k * T),
        "midlayer.self_attn.q_proj.weight": w(d.heads * d.head_dim, 2 * H),
        "midlayer.self_attn.k_proj.weight": w(d.kv_heads * d.head_dim, 2 * H),
        "midlayer.self_attn.v_proj.weight": w(d.kv_heads * d.head_dim, 2 * H),
        "midlayer.self_attn.o_proj.weight": w(H, d.heads * d.head_dim),
        "midlayer.mlp.gate_proj.weight": w(d.intermediate, H),
        "midlayer.mlp.up_proj.weight": w(d.intermediate, H),
        "midlayer.mlp.down_proj.weight": w(H, d.intermediate),
        "midlayer.input_layernorm.weight": norm(H),
        "midlayer.hidden_norm.weight": norm(H),
        "midlayer.post_attention_layernorm.weight": norm(H),
        "norm.weight": norm(H),
        "lm_head.weight": w(d.draft_vocab, H),
    }
    # the draft vocab: the first ids (bytes, specials) plus a seeded sorted sample of the rest
    head = min(256, d.draft_vocab // 2)
    rest = torch.randperm(d.vocab - head, generator=g)[: d.draft_vocab - head] + head
    tids = torch.cat([torch.arange(head), rest.sort().values])
    t["d2t"] = (tids - torch.arange(d.draft_vocab)).to(torch.int64)
    t2d = torch.zeros(d.vocab, dtype=torch.bool)
    t2d[tids] = True
    t["t2d"] = t2d
    t["embed_tokens.weight"] = w(d.vocab, H)
    return t


def variant_tensors(d: Dims, *, layers: int = 1, fc_norm: bool = False, input_norm: bool = False,
                    qk_norm: bool = False, mask_hidden: bool = False, **_) -> dict:
    """:func:`canonical_tensors` plus what a 2026 variant adds, in SGLang's names for layer 0
    (``midlayer.*``) and the trainers' for later layers (``layers.N.*`` with ``input_layernorm``
    only: speculators, Model Optimizer, SpecForge and Automodel write no later ``hidden_norm``).
    The added tensors come from their own seeded generator, so the base tensors stay the same."""
    import torch

    t = canonical_tensors(d)
    g = torch.Generator().manual_seed(d.seed + 1000)
    H, T, k, hd = d.hidden, d.target_hidden, len(d.aux_ids), d.head_dim

    def w(*shape, scale=0.02):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)

    def norm(n):
        return (1.0 + 0.1 * torch.randn(n, generator=g)).to(torch.bfloat16)

    for i in range(1, layers):
        p = f"layers.{i}."
        t |= {
            p + "self_attn.q_proj.weight": w(d.heads * hd, H),
            p + "self_attn.k_proj.weight": w(d.kv_heads * hd, H),
            p + "self_attn.v_proj.weight": w(d.kv_heads * hd, H),
            p + "self_attn.o_proj.weight": w(H, d.heads * hd),
            p + "mlp.gate_proj.weight": w(d.intermediate, H),
            p + "mlp.up_proj.weight": w(d.intermediate, H),
            p + "mlp.down_proj.weight": w(H, d.intermediate),
            p + "input_layernorm.weight": norm(H),
            p + "post_attention_layernorm.weight": norm(H),
        }
    if fc_norm:
        t |= {f"fc_norm.{j}.weight": norm(T) for j in range(k)}
    if input_norm:
        t["input_norm.weight"] = norm(k * T)
    if qk_norm:
        for p in ["midlayer."] + [f"layers.{i}." for i in range(1, layers)]:
            t[p + "self_attn.q_norm.weight"] = norm(hd)
            t[p + "self_attn.k_norm.weight"] = norm(hd)
    if mask_hidden:
        t["mask_hidden"] = torch.randn(1, 1, k * T, generator=g).to(torch.bfloat16)
    return t


def config_beside(dest: str | Path) -> Path:
    """Where an :data:`EXAMPLE_CONFIG_BESIDE` example puts its config: beside the folder."""
    dest = Path(dest)
    return dest.parent / f"{dest.name}.draft-config.json"


def _save(tensors: dict, path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def _rename(t: dict, old: str, new: str) -> dict:
    return {(new + k[len(old):] if k.startswith(old) else k): v for k, v in t.items()}


def example_formats() -> tuple[str, ...]:
    """Every naming ``write_example`` writes (``eagle3conv example --format`` offers these)."""
    return EXAMPLE_FORMATS + EXAMPLE_CONFIG_BESIDE


def write_example(dest: str | Path, fmt: str = "modelopt-export", dims: Dims | None = None) -> Path:
    """Write the example drafter to ``dest`` in the naming of ``fmt``. Returns the checkpoint path."""
    import torch

    from eagle3conv.errors import UsageError

    if fmt not in example_formats():
        raise UsageError(f"no example for format {fmt!r}", hint="one of: " + ", ".join(example_formats()))
    d = dims or Dims()
    if VARIANTS.get(fmt, {}).get("k") == 5 and len(d.aux_ids) != 5:
        d = dataclasses.replace(d, aux_ids=FIVE_AUX)
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise UsageError(f"{dest}: already exists and is not empty", hint="choose another folder")
    dest.mkdir(parents=True, exist_ok=True)
    from eagle3conv.spec.canonical import drafter_uses_own_embedding

    t = canonical_tensors(d)
    # SGLang embeds with the drafter's own table when the target is wider: keep it then
    own_embed = drafter_uses_own_embedding(d.hidden, d.target_hidden)
    embed = t["embed_tokens.weight"] if own_embed else t.pop("embed_tokens.weight")
    cfg = llama_config(d)

    def write_cfg(c):
        (dest / "config.json").write_text(json.dumps(c, indent=2))

    if fmt == "sglang":
        _save(t, dest / "model.safetensors")
        write_cfg(cfg)
    elif fmt == "sglang-fused":
        f = dict(t)
        f["midlayer.self_attn.qkv_proj.weight"] = torch.cat([f.pop(f"midlayer.self_attn.{p}_proj.weight") for p in "qkv"])
        f["midlayer.mlp.gate_up_proj.weight"] = torch.cat([f.pop("midlayer.mlp.gate_proj.weight"), f.pop("midlayer.mlp.up_proj.weight")])
        _save(_rename(f, "", "model."), dest / "model.safetensors")
        write_cfg(cfg)
    elif fmt == "specforge":
        _save(t, dest / "model.safetensors")
        write_cfg(cfg)
        torch.save({"epoch": 1, "global_step": 100, "args": argparse.Namespace(lr=1e-4, target_model_path=_target_name(d))},
                   dest / "training_state.pt")
    elif fmt == "specforge-runtime":
        torch.save({
            "draft_state_dict": t,
            "global_step": 100,
            "epoch": 1,
            "args": argparse.Namespace(lr=1e-4),
            "specforge_model_provenance": [["target_model", _target_name(d)],
                                           ["capture_layers", list(d.aux_ids)], ["torch_dtype", "bfloat16"]],
        }, dest / "training_state.pt")
        write_cfg(cfg)
    elif fmt == "eagle":
        torch.save(t, dest / "pytorch_model.bin")
        c = llama_config(d, architecture="LlamaForCausalLM", with_ids=False)
        (dest.parent / f"{dest.name}.config.json").write_text(json.dumps(c, indent=2))
    elif fmt == "modelopt-train":
        base = torch.Generator().manual_seed(d.seed + 1)
        tiny = {
            "model.embed_tokens.weight": torch.randn(d.vocab, d.target_hidden, generator=base).to(torch.bfloat16),
            "lm_head.weight": torch.randn(d.vocab, d.target_hidden, generator=base).to(torch.bfloat16),
            "model.norm.weight": torch.ones(d.target_hidden, dtype=torch.bfloat16),
        }
        for i in range(2):
            tiny[f"model.layers.{i}.self_attn.q_proj.weight"] = torch.randn(d.target_hidden, d.target_hidden, generator=base).to(torch.bfloat16)
            tiny[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(d.target_hidden, dtype=torch.bfloat16)
        eagle = _rename(_rename(t, "midlayer.", "eagle_module.layers.0."), "", "")
        eagle = {("eagle_module." + k if not k.startswith("eagle_module.") else k): v for k, v in eagle.items() if k != "t2d"}
        _save(tiny, dest / "model-00001-of-00002.safetensors")
        _save(eagle, dest / "model-00002-of-00002.safetensors")
        wm = {k: "model-00001-of-00002.safetensors" for k in tiny} | {k: "model-00002-of-00002.safetensors" for k in eagle}
        (dest / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}, indent=2))
        base_cfg = {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": d.target_hidden,
            "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
            "vocab_size": d.vocab, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
            "eagle_config": {
                "hidden_size": d.hidden, "num_hidden_layers": 1, "num_attention_heads": d.heads,
                "num_key_value_heads": d.kv_heads, "head_dim": d.head_dim, "intermediate_size": d.intermediate,
                "draft_vocab_size": d.draft_vocab, AUX_KEY: list(d.aux_ids),
                "use_aux_hidden_state": True, "use_last_layernorm": True,
            },
        }
        write_cfg(base_cfg)
    elif fmt in ("modelopt-export", "modelopt-export-old"):
        out = {k: v for k, v in t.items() if k != "t2d"}
        if fmt == "modelopt-export":
            out = _rename(out, "midlayer.", "layers.0.")
        _save(out, dest / "model.safetensors")
        write_cfg(cfg)
    elif fmt == "speculators":
        s = _rename(dict(t), "midlayer.", "layers.0.")
        s["embed_tokens.weight"] = embed
        _save(s, dest / "model.safetensors")
        layer = {k: v for k, v in llama_config(d, with_ids=False).items() if k not in ("architectures", "draft_vocab_size", "target_hidden_size")}
        layer["architectures"] = ["LlamaForCausalLM"]
        write_cfg({
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_version": "0.9.0",
            "transformer_layer_config": layer,
            "draft_vocab_size": d.draft_vocab,
            "norm_before_residual": False,
            "target_hidden_size": d.target_hidden if d.target_hidden != d.hidden else None,
            AUX_KEY: [i + 1 for i in d.aux_ids],  # input-of-layer numbering
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": _target_name(d), "architectures": ["LlamaForCausalLM"]},
            },
        })
    elif fmt == "angelslim":
        a = dict(t)
        a["embed_tokens.weight"] = embed
        _save(a, dest / "model.safetensors")
        c = llama_config(d, architecture="Eagle3LlamaForCausalLM", with_ids=False)
        write_cfg(c)
    elif fmt == "draft-model-prefixed":
        p = _rename(dict(t), "", "draft_model.")
        p = {("draft_model." + k if not k.startswith("draft_model.") else k): v for k, v in t.items()}
        torch.save({"state_dict": p}, dest / "model.pt")
        write_cfg(cfg)
    elif fmt in VARIANTS:
        _write_2026(dest, fmt, d, embed, write_cfg)
    (dest / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 2048}))
    return dest


def _write_2026(dest: Path, fmt: str, d: Dims, embed, write_cfg) -> None:
    """The trainers of 2026 (docs/facts.md §6), each in its own names, config and record files."""
    import torch

    from eagle3conv.spec.canonical import drafter_uses_own_embedding

    v = VARIANTS[fmt]
    t = variant_tensors(d, **v)
    layers = v.get("layers", 1)
    t.pop("embed_tokens.weight")  # each trainer saves its embedding (or not) under its own name
    if drafter_uses_own_embedding(d.hidden, d.target_hidden) and fmt in (
            "specforge-export", "specforge-runtime-0.2", "modelopt-export-0.47"):
        t["embed_tokens.weight"] = embed  # a drafter wider than its target needs its own (docs/facts.md §4)
    trainer = fmt.split("-")[0]
    if trainer == "automodel":
        _automodel(dest, fmt, d, t, embed, v, write_cfg)
    elif trainer == "speculators":
        _speculators(dest, fmt, d, t, embed, v, write_cfg)
    elif fmt == "specforge-export":
        # export --to sglang: SGLang's names, no embedding, the user's draft config (which says norm_output true)
        _save(t, dest / "model.safetensors")
        write_cfg(llama_config(d) | {"norm_output": True})
    elif fmt in ("specforge-peagle", "specforge-runtime-peagle"):
        s = _rename(dict(t), "midlayer.", "layers.0.")
        s["embed_tokens.weight"] = embed  # P-EAGLE trains and persists its embedding
        cfg = llama_config(d) | {"architectures": ["PEagleDraftModel"], "num_hidden_layers": layers,
                                 "norm_before_residual": False}
        if fmt == "specforge-peagle":  # export --to hf: save_pretrained of PEagleDraftModel
            _save(s, dest / "model.safetensors")
        else:
            torch.save(_specforge_state(d, s, "peagle"), dest / "training_state.pt")
        write_cfg(cfg)
    elif fmt == "specforge-runtime-0.2":
        # SpecForge 0.2.0 writes no config.json: the draft config is the user's, beside the run
        state = _specforge_state(d, t, "eagle3")
        state["specforge_model_provenance"] = [
            *state["specforge_model_provenance"],
            ["draft_config", ["file-stat-v2", str(config_beside(dest)), ["draft-config.json", 0, 0]]]]
        torch.save(state, dest / "training_state.pt")
        # SpecForge's EAGLE-3.1 config: fc_norm and norm_output true (configs/qwen3-30B-A3B-eagle3.1.json)
        config_beside(dest).write_text(json.dumps(llama_config(d) | {"fc_norm": True, "norm_output": True}, indent=2))
    elif fmt == "modelopt-export-0.47":
        out = _rename({k: x for k, x in t.items() if k != "t2d"}, "midlayer.", "layers.0.")
        _save(out, dest / "model.safetensors")
        cfg = llama_config(d, with_ids=False) | {"num_hidden_layers": layers}
        cfg["eagle_config"] = {  # the export template's nested block (hf_spec_configs.py:47-56)
            AUX_KEY: list(d.aux_ids), "use_aux_hidden_state": True, "use_input_layernorm_in_first_layer": True,
            "use_last_layernorm": True, "use_mtp_layernorm": False, "next_layer_regular": True,
            "parallel_draft_step": 1, "parallel_draft_heads_num_layers": 1,
        }
        write_cfg(cfg)


def _specforge_state(d: Dims, draft: dict, strategy: str) -> dict:
    return {
        "draft_state_dict": draft,
        "global_step": 100,
        "epoch": 1,
        "strategy": strategy,
        "run_id": "example",
        "specforge_model_provenance": [["target_model", ["reference", _target_name(d)]],
                                       ["capture_layers", list(d.aux_ids)], ["torch_dtype", "bfloat16"]],
    }


def _automodel(dest: Path, fmt: str, d: Dims, t: dict, embed, v: dict, write_cfg) -> None:
    """NeMo Automodel 0.7.0: the drafter wrapped as model.* (lm_head, d2t, t2d, mask_hidden unprefixed), the
    target's text config with the drafter's fields on top, the recipe snapshot config.yaml beside it."""
    peagle = v.get("mask_hidden", False)
    s = _rename(_rename(dict(t), "midlayer.", "model.layers.0."), "layers.", "model.layers.")
    s = {("model." + k if k.split(".")[0] in ("fc", "fc_norm", "norm") else k): x for k, x in s.items()}
    s["model.embed_tokens.weight"] = embed  # a frozen copy of the target's (trained with P-EAGLE)
    _save(s, dest / "model.safetensors")
    target_layers = 30
    cfg = {
        "architectures": ["LlamaEagle3DraftModel"], "model_type": "llama", "hidden_size": d.hidden,
        "intermediate_size": d.intermediate, "num_attention_heads": d.heads, "num_key_value_heads": d.kv_heads,
        "head_dim": d.head_dim, "num_hidden_layers": target_layers, "vocab_size": d.vocab,
        "max_position_embeddings": 2048, "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "attention_bias": False, "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2, "dtype": "bfloat16",
        "draft_vocab_size": d.draft_vocab, "target_hidden_size": d.target_hidden, "tie_word_embeddings": False,
        "attn_implementation": "eager", "fc_norm": v.get("fc_norm", False), "norm_output": v.get("fc_norm", False),
        "parallel_drafting": peagle,
    }
    if fmt == "automodel-3.1":  # a Qwen3 target: its config carries the target's per-layer attention layout
        cfg |= {"model_type": "qwen3", "layer_types": ["full_attention"] * target_layers, "use_sliding_window": False,
                "sliding_window": None, "max_window_layers": 28}
    if peagle:  # recipes/llm/peagle_recipe.py:71-83: the drafter's layer count, the mask token, COD settings
        cfg |= {"num_hidden_layers": v["layers"], "mask_token_id": MASK_TOKEN_ID, "num_depths": 8,
                "down_sample_ratio": 0.7, "down_sample_ratio_min": 0.2}
    write_cfg(cfg)
    if fmt != "automodel-3.1":  # the 3.1 example has no recipe snapshot: the default layers apply
        recipe = {"recipe_args": {"target_model_name_or_path": _target_name(d), "aux_layer_ids": list(d.aux_ids),
                                  "fc_norm": v.get("fc_norm", False), "parallel_drafting": peagle}}
        (dest / "config.yaml").write_text(_yaml(recipe))


def _yaml(obj: dict, indent: int = 0) -> str:
    """The small YAML Automodel's save_config writes (block mappings, flow lists; no PyYAML needed to write)."""
    lines = []
    for k, val in obj.items():
        if isinstance(val, dict):
            lines.append(" " * indent + f"{k}:")
            lines.append(_yaml(val, indent + 2).rstrip("\n"))
        else:
            lines.append(" " * indent + f"{k}: {json.dumps(val)}")
    return "\n".join(lines) + "\n"


def _speculators(dest: Path, fmt: str, d: Dims, t: dict, embed, v: dict, write_cfg) -> None:
    """speculators 0.9.0: layers.N.*, its config with transformer_layer_config and the switches at the top."""
    layers = v.get("layers", 1)
    peagle = v.get("mask_hidden", False)
    s = _rename(dict(t), "midlayer.", "layers.0.")
    s["embed_tokens.weight"] = embed
    _save(s, dest / "model.safetensors")
    layer = {k: x for k, x in llama_config(d, with_ids=False).items()
             if k not in ("architectures", "draft_vocab_size", "target_hidden_size")}
    layer["num_hidden_layers"] = layers
    if v.get("qk_norm"):  # draft_arch qwen3 (the P-EAGLE CLI's default, train/config/schema.py)
        layer["model_type"] = "qwen3"
        layer |= {"use_sliding_window": False, "max_window_layers": layers}
    else:
        layer["architectures"] = ["LlamaForCausalLM"]
    if fmt in ("speculators-3.1", "speculators-peagle"):  # the train CLI: sliding windows of 2048 (cli.py:212-231)
        layer |= {"layer_types": ["sliding_attention"] * layers, "sliding_window": 2048}
    cfg = {
        "architectures": ["PEagleDraftModel" if peagle else "Eagle3DraftModel"],
        "speculators_model_type": "peagle" if peagle else "eagle3",
        "speculators_version": "0.9.0",
        "transformer_layer_config": layer,
        "draft_vocab_size": d.draft_vocab,
        "target_hidden_size": d.target_hidden if d.target_hidden != d.hidden else None,
        AUX_KEY: [i + 1 for i in d.aux_ids],  # input-of-layer numbering
        "norm_before_residual": fmt in ("speculators-3.1", "speculators-peagle"),
        "norm_before_fc": v.get("input_norm", False),
        "fc_norm": v.get("fc_norm", False),
        "norm_output": fmt == "speculators-3.1",
        "embed_requires_grad": peagle,
        "speculators_config": {
            "algorithm": "peagle" if peagle else "eagle3",
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": _target_name(d), "architectures": ["LlamaForCausalLM"]},
        },
    }
    if peagle:
        cfg["mask_token_id"] = MASK_TOKEN_ID
    write_cfg(cfg)
