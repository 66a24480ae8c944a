"""The drafter's tensor operations, public for the MLA forward, tests and benchmarks.

RMSNorm as ``LlamaRMSNorm`` computes it, and rotary position embeddings
(inverse frequencies from config.json, rotate-half application).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from eagle3conv.errors import InvalidCheckpointError

if TYPE_CHECKING:
    from eagle3conv.model.drafter import DrafterConfig

__all__ = ["SUPPORTED_ROPE", "apply_rope", "argmax", "rms_norm", "rope_inv_freq", "rope_params", "rotate_half"]

SUPPORTED_ROPE = ("default", "linear", "llama3", "yarn")


def rope_params(config: Mapping[str, Any]) -> dict[str, Any]:
    """The RoPE settings (:func:`eagle3conv.spec.drafter.rope_settings`, the one reader, one
    precedence for every path); a malformed one is the checkpoint's error."""
    from eagle3conv.spec.drafter import rope_settings

    try:
        return rope_settings(config)
    except ValueError as e:
        raise InvalidCheckpointError(f"config.json: {e}") from None


def rope_inv_freq(config: Mapping[str, Any], c: DrafterConfig) -> tuple[Tensor, float]:
    """Inverse frequencies and cos/sin scale, via transformers' ROPE_INIT_FUNCTIONS.

    Accepts old (``rope_theta`` + ``rope_scaling``) and new (``rope_parameters``)
    spellings; transformers' LlamaConfig standardizes them. Qwen2.5-VL style
    ``mrope_section`` falls back to default RoPE, as SGLang does.
    """
    scaling0 = rope_params(config)
    if "mrope_section" not in scaling0 and scaling0.get("rope_type", scaling0.get("type", "default")) == "default":
        # plain RoPE: no need to import transformers (seconds of start-up)
        theta = float(scaling0["rope_theta"])
        exponent = torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim
        return 1.0 / (theta ** exponent), 1.0
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kwargs: dict[str, Any] = {"rope_parameters": dict(scaling0)}
    if config.get("max_position_embeddings") is not None:
        kwargs["max_position_embeddings"] = config["max_position_embeddings"]
    if "mrope_section" in scaling0:
        kwargs = {"rope_parameters": {"rope_type": "default", "rope_theta": scaling0["rope_theta"]}}
    try:
        cfg = LlamaConfig(
            hidden_size=c.hidden_size,
            num_attention_heads=c.num_heads,
            num_key_value_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            **kwargs,
        )
        params: dict[str, Any] = dict(cfg.rope_parameters or {})
        rope_type = params.get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE:
            raise InvalidCheckpointError(
                f"config.json: rope type {rope_type!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_ROPE)})"
            )
        if rope_type == "default":
            exponent = torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim
            return 1.0 / (float(params["rope_theta"]) ** exponent), 1.0
        inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](cfg, device=torch.device("cpu"))
        return inv_freq.float(), float(scale)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidCheckpointError(f"config.json: cannot build RoPE: {exc}") from exc


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [B, heads, S, hd]; cos/sin: [S, hd] in x's dtype."""
    return x * cos + rotate_half(x) * sin


def argmax(x: Tensor, rows: int = 256) -> Tensor:
    """``x.argmax(-1)``, the same indices (the first of equal largest values; NaN counts as the
    largest, as :func:`torch.argmax` takes it). On a CPU a bf16 or fp16 ``x`` is taken ``rows``
    rows at a time, each block upcast to fp32 (exact: every bf16 and fp16 value is an fp32 value)
    and reduced there: torch's CPU argmax over bf16 is several times slower than over fp32, and a
    block that stays in cache costs less than the copy of every row (bench/README.md, issue 30
    fifth round). Elsewhere, or for fp32, ``x.argmax(-1)`` itself."""
    if x.device.type != "cpu" or x.dtype not in (torch.bfloat16, torch.float16) or x.dim() == 0 or not x.numel():
        return x.argmax(-1)
    flat = x.reshape(-1, x.shape[-1])
    out = torch.empty(flat.shape[0], dtype=torch.long)
    for a in range(0, flat.shape[0], rows):
        torch.argmax(flat[a:a + rows].float(), -1, out=out[a:a + rows])
    return out.view(x.shape[:-1])


def rms_norm(x: Tensor, weight: Tensor, eps: float, *, out: Tensor | None = None) -> Tensor:
    """LlamaRMSNorm: normalize in fp32, cast back, then scale by the weight.

    ``out``: a tensor (a view, such as one half of a wider buffer) to write the
    result into instead of a new one; the same numbers either way.

    ``F.rms_norm`` computes the normalization in fp32 and returns x's dtype: on
    CPU it equals the spelled-out formula bit for bit; on CUDA it is one fused
    kernel (bench/README.md: 0.7056 -> 0.755 of matmul throughput for a
    Kimi-size drafter), like the fused norm SGLang itself runs.
    """
    normed = F.rms_norm(x, (x.shape[-1],), eps=eps)
    if out is None:
        return weight * normed
    return torch.mul(weight, normed, out=out)
