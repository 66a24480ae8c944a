"""Small, deterministic EAGLE-3 drafter checkpoints in every trainer's naming.

``write_example`` backs ``eagle3conv example`` (the README's first command) and
the test suite's fixtures: the same weights, laid out the way each trainer
writes them, so a test can prove that every format converts to the same
SGLang checkpoint.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from eagle3conv.spec.drafter import AUX_KEY, NESTED_AUX_FIELD, with_field

EXAMPLE_FORMATS = (
    "sglang", "sglang-fused", "specforge", "specforge-runtime", "eagle", "modelopt-train",
    "modelopt-export", "modelopt-export-old", "speculators", "angelslim", "draft-model-prefixed",
)


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


def _save(tensors: dict, path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def _rename(t: dict, old: str, new: str) -> dict:
    return {(new + k[len(old):] if k.startswith(old) else k): v for k, v in t.items()}


def write_example(dest: str | Path, fmt: str = "modelopt-export", dims: Dims | None = None) -> Path:
    """Write the example drafter to ``dest`` in the naming of ``fmt``. Returns the checkpoint path."""
    import torch

    from eagle3conv.errors import UsageError

    if fmt not in EXAMPLE_FORMATS:
        raise UsageError(f"no example for format {fmt!r}", hint="one of: " + ", ".join(EXAMPLE_FORMATS))
    d = dims or Dims()
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
    (dest / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 2048}))
    return dest
