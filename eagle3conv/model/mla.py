"""The MLA EAGLE-3 drafter forward (``Eagle3DeepseekV2ForCausalLM``), as SGLang runs it.

Kimi-K2.5/K2.6 "eagle3-mla" drafters pair the EAGLE-3 layout (fc over the aux
states, ``cat(embedding, hidden)`` into one decoder layer, a dense SwiGLU MLP)
with DeepSeek-V2 multi-head latent attention. Everything that is not attention
is shared with the Llama drafter (:class:`~eagle3conv.model.drafter.Eagle3Drafter`):
fc and fc_norm, the MLP, the head, d2t, the causal and training-time-test
attention and :meth:`draft_chain`. The facts this module relies on are in
docs/facts.md §10 (upstream: SGLang ``kimi_k25_eagle3.py``, ``deepseek_v2.py``,
``layers/rotary_embedding.py``; vLLM ``deepseek_eagle3.py``).

One step (``u`` is the 2H-wide ``cat(input_layernorm(embed), hidden_norm(g))``)::

    c_q            = q_a_proj(u)                       # [QL]   (q_proj(u) without q_lora_rank)
    c_kv, k_pe     = split(kv_a_proj_with_mqa(u), [KL, QR])
    q              = q_b_proj(q_a_layernorm(c_q))      # per head [nope | rope]
    k_nope, v      = split(kv_b_proj(kv_a_layernorm(c_kv)), [nope, VH]) per head
    q_pe, k_pe     = DeepSeek-yarn RoPE (interleaved unless rope_interleave: false); k_pe shared
    attn           = softmax(scale * q.k) v
    scale          = (nope+rope)^-0.5 * yarn_mscale(factor, mscale_all_dim)^2
    h1 = o_proj(attn) + g;  h2 = h1 + mlp(post_attention_layernorm(h1));  logits = lm_head(norm(h2))

Strict loading uses the "mla" table of mappings/canonical.json.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from eagle3conv.errors import InvalidCheckpointError
from eagle3conv.spec.canonical import FIRST_LAYER
from eagle3conv.spec.drafter import NORM_BEFORE_FC, switches_set_by
from eagle3conv.spec.engines import Run
from eagle3conv.model.drafter import (
    DrafterConfig,
    Eagle3Drafter,
    check_tensors,
    expected_shapes,
    require_int,
)
from eagle3conv.model.ops import rms_norm, rope_params

__all__ = [
    "MLAConfig",
    "Eagle3MLADrafter",
    "expected_mla_tensors",
    "mla_rope",
    "MLARope",
    "mla_rotate",
    "yarn_get_mscale",
]

_YARN_TYPES = ("yarn", "deepseek_yarn")
_FUSED_QKV_A = "midlayer.self_attn.fused_qkv_a_proj_with_mqa.weight"


# --------------------------------------------------------------------------- config


@dataclass(frozen=True, kw_only=True)
class MLAConfig(DrafterConfig):
    """A :class:`DrafterConfig` plus MLA's dimensions.

    ``head_dim`` is the query/key head dim ``qk_nope_head_dim + qk_rope_head_dim``
    and ``num_kv_heads == num_heads`` (MLA expands keys and values per head).
    ``q_lora_rank`` is None for the variant with a direct ``q_proj``.
    """

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> MLAConfig:
        if NORM_BEFORE_FC in switches_set_by(config):
            raise InvalidCheckpointError(
                f"config.json: {NORM_BEFORE_FC} (one RMSNorm over the concatenated aux states) is "
                "applied by neither SGLang's nor vLLM's MLA drafter and is not supported here "
                "(docs/facts.md §10)"
            )
        # Llama-side rules that hold for the MLA drafter too (untied head);
        # head_dim is meaningless for MLA, so give the base parser a harmless one.
        base = DrafterConfig.from_config({**config, "head_dim": 1}, architecture="mla")
        spec = base.spec  # the config as eagle3conv.spec.drafter read it, MLA dims included
        nope = require_int(config, "qk_nope_head_dim")
        rope = require_int(config, "qk_rope_head_dim")
        if rope % 2:
            raise InvalidCheckpointError(
                f"config.json: qk_rope_head_dim is {rope}; RoPE needs an even number of dims"
            )
        require_int(config, "kv_lora_rank")
        require_int(config, "v_head_dim")
        values = {f.name: getattr(base, f.name) for f in fields(base)}
        values.update(head_dim=nope + rope, num_kv_heads=base.num_heads)
        return cls(
            **values,
            q_lora_rank=spec.QL,
            kv_lora_rank=int(spec.KL),  # type: ignore[arg-type]
            qk_nope_head_dim=int(spec.QN),  # type: ignore[arg-type]
            qk_rope_head_dim=int(spec.QR),  # type: ignore[arg-type]
            v_head_dim=int(spec.VH),  # type: ignore[arg-type]
            rope_interleave=spec.rope_interleave,
        )

    def engine_notes(self) -> list[str]:
        """Where SGLang and vLLM would run this config differently from each other."""
        notes = []
        if self.q_lora_rank is None:
            notes.append(
                "q_lora_rank is null: SGLang refuses this drafter ('Eagle3 MLA layer requires "
                "q_lora_rank in the draft config'); vLLM builds a direct q_proj"
            )
        if not self.rope_interleave:
            notes.append(
                "rope_interleave is false: SGLang uses half-split (neox) RoPE, vLLM ignores the "
                "flag and uses interleaved RoPE"
            )
        if self.norm_before_residual:
            notes.append(
                "norm_before_residual is true: vLLM honours it, SGLang's MLA layer ignores it"
            )
        return notes


def expected_mla_tensors(c: MLAConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor an MLA drafter with this config can hold, canonical name -> shape.

    mappings/canonical.json's "mla" rows (:func:`eagle3conv.spec.canonical.expected`); fc.bias
    and fc_norm.* belong only when the config asks for them (otherwise they are unexpected:
    the engines would not use them).
    """
    return expected_shapes(c)


# --------------------------------------------------------------------------- rope


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """DeepSeek's yarn magnitude factor: 1 for scale <= 1, else 0.1 * mscale * ln(scale) + 1."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class MLARope:
    """RoPE of the rope dims and the attention scale, as SGLang computes them.

    ``inv_freq`` has ``qk_rope_head_dim / 2`` entries; cos/sin are multiplied by
    ``cos_sin_scale``; ``softmax_scale`` multiplies ``q.k``.
    """

    rope_type: str  # "default" or "yarn"
    inv_freq: Tensor
    cos_sin_scale: float
    softmax_scale: float


def mla_rope(config: Mapping[str, Any], c: MLAConfig) -> MLARope:
    """The rope dims' inverse frequencies, cos/sin factor and softmax scale.

    SGLang (``kimi_k25_eagle3.py`` -> ``DeepseekV2AttentionMLA``) runs any non-default
    rope scaling of an MLA drafter as DeepSeek yarn (``DeepseekScalingRotaryEmbedding``)
    over ``original_max_position_embeddings``; only ``yarn``/``deepseek_yarn`` are
    accepted here. Defaults as SGLang's: beta_fast 32, beta_slow 1, mscale 1,
    mscale_all_dim 0, attn_factor 1, extrapolation_factor 1.
    """
    params = rope_params(config)
    dim = c.qk_rope_head_dim
    base = float(params["rope_theta"])
    exponents = torch.arange(0, dim, 2, dtype=torch.float32) / dim
    pos_freqs = base**exponents
    plain = c.head_dim**-0.5
    rope_type = str(params.get("rope_type") or params.get("type") or "default")
    if rope_type == "default":
        return MLARope("default", 1.0 / pos_freqs, 1.0, plain)
    if rope_type not in _YARN_TYPES:
        raise InvalidCheckpointError(
            f"config.json: rope type {rope_type!r} is not supported for MLA drafters "
            "(SGLang runs every rope scaling of an MLA drafter as DeepSeek yarn; use "
            "rope_type 'yarn' with factor and original_max_position_embeddings)"
        )
    try:
        factor = float(params["factor"])
        original = int(params["original_max_position_embeddings"])
    except KeyError as exc:
        raise InvalidCheckpointError(
            f"config.json: yarn rope scaling needs {exc.args[0]!r} "
            "(SGLang reads it unconditionally)"
        ) from None
    beta_fast = float(params.get("beta_fast", 32))
    beta_slow = float(params.get("beta_slow", 1))
    mscale = float(params.get("mscale", 1))
    mscale_all_dim = float(params.get("mscale_all_dim") or 0)
    attn_factor = float(params.get("attn_factor", 1))
    extrapolation = float(params.get("extrapolation_factor", 1))

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # as SGLang's _yarn_linear_ramp_mask: no division by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolate = (1 - ramp) * extrapolation  # 1 for the fast (high-frequency) dims
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate
    cos_sin_scale = (
        yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim) * attn_factor
    )
    softmax_scale = plain * yarn_get_mscale(factor, mscale_all_dim) ** 2
    return MLARope("yarn", inv_freq, cos_sin_scale, softmax_scale)


def mla_rotate(x: Tensor, cos: Tensor, sin: Tensor, interleave: bool) -> Tensor:
    """Rotate the last dim of x by the angles in cos/sin (``[S, d/2]``), layout kept.

    Interleaved (GPT-J, DeepSeek's default): pairs ``(x0, x1), (x2, x3), ...``.
    Otherwise (neox): pairs ``(x_i, x_{i+d/2})``.
    """
    if interleave:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


# --------------------------------------------------------------------------- drafter


class Eagle3MLADrafter(Eagle3Drafter):
    """An MLA EAGLE-3 drafter (``Eagle3DeepseekV2ForCausalLM``) with strict weight loading.

    Same arguments, entry points and outputs as :class:`Eagle3Drafter`; tensors use
    the canonical names of mappings/canonical.json's "mla" table. A config with
    ``q_lora_rank: null`` loads (vLLM runs it with ``q_proj``), but SGLang refuses
    it: :attr:`engine_notes` says so.
    """

    config: MLAConfig

    def __init__(self, config: Mapping[str, Any], state_dict: Mapping[str, Tensor], **kwargs: Any):
        super().__init__(config, state_dict, **kwargs)
        #: where SGLang and vLLM differ on this config (SGLang refuses q_lora_rank: null);
        #: read from the config itself, whatever the run overrides
        self.engine_notes: list[str] = MLAConfig.from_config(config).engine_notes()

    @staticmethod
    def _parse_config(config: Mapping[str, Any]) -> MLAConfig:
        return MLAConfig.from_config(config)

    def _run_config(self, c: DrafterConfig, run: Run) -> DrafterConfig:
        c = super()._run_config(c, run)
        return c if run.rope_interleave is None else replace(c, rope_interleave=run.rope_interleave)

    def _check_state(self, state_dict: Mapping[str, Tensor], c: DrafterConfig) -> None:
        assert isinstance(c, MLAConfig)
        try:
            check_tensors(state_dict, c.expected(), c.spec.symbols(), "MLA drafter checkpoint")
        except InvalidCheckpointError as err:
            if _FUSED_QKV_A not in state_dict:
                raise
            q_rows = c.q_lora_rank if c.q_lora_rank is not None else "q_lora_rank"
            raise InvalidCheckpointError(
                err.message + f". {_FUSED_QKV_A} is pre-fused: SGLang's loader caches it and "
                "then drops it, so the engine would serve uninitialised q_a/kv_a weights",
                hint=f"split it by rows: the first {q_rows} into "
                "midlayer.self_attn.q_a_proj.weight, the remaining "
                f"{c.kv_lora_rank + c.qk_rope_head_dim} (kv_lora_rank + qk_rope_head_dim) into "
                "midlayer.self_attn.kv_a_proj_with_mqa.weight",
                details=err.details,
            ) from None

    def _load_attention(self, w: Any) -> None:
        att = self._load_mla_attention(w, FIRST_LAYER)
        self.q_proj, self.q_a_proj, self.q_a_layernorm, self.q_b_proj = (
            att[n] for n in ("q_proj", "q_a_proj", "q_a_layernorm", "q_b_proj"))
        self.kv_a_proj_with_mqa, self.kv_a_layernorm = att["kv_a_proj_with_mqa"], att["kv_a_layernorm"]
        self._kv_b = att["kv_b"]  # kv_b_proj itself is not kept
        self.o_proj = att["o"]

    def _load_mla_attention(self, w: Any, prefix: str) -> dict[str, Any]:
        c = self.config
        p = f"{prefix}self_attn."
        att: dict[str, Any] = dict.fromkeys(("q_proj", "q_a_proj", "q_a_layernorm", "q_b_proj"))
        if c.q_lora_rank is None:
            att["q_proj"] = w(f"{p}q_proj.weight")
        else:
            att.update(q_a_proj=w(f"{p}q_a_proj.weight"), q_a_layernorm=w(f"{p}q_a_layernorm.weight"),
                       q_b_proj=w(f"{p}q_b_proj.weight"))
        att["kv_a_proj_with_mqa"] = w(f"{p}kv_a_proj_with_mqa.weight")
        att["kv_a_layernorm"] = w(f"{p}kv_a_layernorm.weight")
        att["kv_b"] = self._kv_b_weight(w(f"{p}kv_b_proj.weight"))
        att["o"] = w(f"{p}o_proj.weight")
        return att

    def _load_later_attention(self, w: Any, prefix: str) -> dict[str, Any]:
        return self._load_mla_attention(w, prefix)

    def _init_rope(self, config: Mapping[str, Any]) -> None:
        rope = mla_rope(config, self.config)
        self.rope = rope
        self._inv_freq = rope.inv_freq.to(self.device)
        self._rope_scale = rope.cos_sin_scale
        self._attn_scale = rope.softmax_scale

    def _rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos/sin ``[S, qk_rope_head_dim / 2]``, computed in fp32 (as SGLang's cache)."""
        freqs = positions.float()[:, None] * self._inv_freq[None, :]
        cos = (freqs.cos() * self._rope_scale).to(self.dtype)
        sin = (freqs.sin() * self._rope_scale).to(self.dtype)
        return cos, sin

    def _qkv(
        self, g: Tensor, input_ids: Tensor, position_offset: int, embeddings: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Residual, q and k ``[B, nh, S, nope+rope]``, v ``[B, nh, S, v_head_dim]`` of layer 0."""
        residual, x = self._layer_input(g, input_ids, embeddings)
        att = {"q_proj": self.q_proj, "q_a_proj": self.q_a_proj, "q_a_layernorm": self.q_a_layernorm,
               "q_b_proj": self.q_b_proj, "kv_a_proj_with_mqa": self.kv_a_proj_with_mqa,
               "kv_a_layernorm": self.kv_a_layernorm, "kv_b": self._kv_b}
        return (residual, *self._project(x, att, position_offset))

    def _project(self, x: Tensor, att: Mapping[str, Any], position_offset: int) -> tuple[Tensor, Tensor, Tensor]:
        """q and k ``[B, nh, S, nope+rope]``, v ``[B, nh, S, v_head_dim]`` of one MLA attention over ``x``.

        No concatenation: RoPE is written in place into q's rope dims, and the keys are
        built by ``kv_b_proj`` itself, its weight laid out per head as ``[nope | rope | v]``
        with zero rows in the rope slots (:meth:`_kv_b_weight`), into which the shared
        rotated ``k_pe`` is then written. q, k and v are strided views (last dim contiguous).
        """
        c = self.config
        eps = c.rms_norm_eps
        b, s, _ = x.shape
        nh, nope, rope, vh = c.num_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        if att["q_proj"] is not None:
            q = F.linear(x, att["q_proj"])
        else:
            c_q = rms_norm(F.linear(x, att["q_a_proj"]), att["q_a_layernorm"], eps)
            q = F.linear(c_q, att["q_b_proj"])
        q = q.view(b, s, nh, nope + rope)
        c_kv, k_pe = F.linear(x, att["kv_a_proj_with_mqa"]).split([c.kv_lora_rank, rope], dim=-1)
        kv = F.linear(rms_norm(c_kv, att["kv_a_layernorm"], eps), att["kv_b"])
        kv = kv.view(b, s, nh, nope + rope + vh)
        positions = torch.arange(position_offset, position_offset + s, device=self.device)
        cos, sin = self._rope(positions)
        q[..., nope:] = mla_rotate(q[..., nope:], cos[:, None], sin[:, None], c.rope_interleave)
        kv[..., nope : nope + rope] = mla_rotate(k_pe, cos, sin, c.rope_interleave)[:, :, None]
        k, v = kv.split([nope + rope, vh], dim=-1)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def _kv_b_weight(self, kv_b_proj: Tensor) -> Tensor:
        """``kv_b_proj`` with ``qk_rope_head_dim`` zero rows after each head's nope rows:
        its output per head is ``[k_nope | 0 | v]``, the keys' layout, once the rope slots
        are filled."""
        c = self.config
        w = kv_b_proj.view(c.num_heads, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank)
        nope, vrows = w.split([c.qk_nope_head_dim, c.v_head_dim], dim=1)
        zeros = w.new_zeros(c.num_heads, c.qk_rope_head_dim, c.kv_lora_rank)
        return torch.cat((nope, zeros, vrows), dim=1).reshape(-1, c.kv_lora_rank)
