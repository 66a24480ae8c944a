"""Dequantization as each scheme defines it (mappings/quantization.json, docs/facts.md §14), written
from the schemes' definitions and pinned in tests against compressed-tensors' own decompressors; used
by fix-keys --dequantize (the writer) and verify.

* :func:`dequantize`: one module's stored tensors -> its float weight (FP8 per tensor / row / block,
  INT8 with zero points, INT4/INT8 packed into int32, NVFP4 packed two per byte);
* :func:`raw_codes`: what a release that builds the module unquantized loads instead (the stored
  values copied into a bf16 parameter, the scale dropped).
"""

from __future__ import annotations

import torch

# E2M1 (FP4) code -> value: sign bit 3, exponent bits 2-1, mantissa bit 0 (OCP MX / NVFP4)
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def _expand(scale: torch.Tensor, shape: tuple[int, int], sym: dict | None = None) -> torch.Tensor:
    """A per-tensor, per-row, per-group or per-block scale broadcast to ``[O, I]``: each scale row
    covers O/rows rows (BO when that does not divide: the last block is partial), each column I/columns
    columns (BI likewise)."""
    o, i = shape
    s = scale.float()
    if s.numel() == 1:
        return s.reshape(1, 1)
    if s.ndim == 1:
        s = s.reshape(-1, 1)
    ro, ci = s.shape
    sym = sym or {}
    fo = o // ro if o % ro == 0 else int(sym.get("BO") or -(-o // ro))
    fi = i // ci if i % ci == 0 else int(sym.get("BI") or -(-i // ci))
    s = s.repeat_interleave(fo, dim=0)[:o] if ro != o else s
    return s.repeat_interleave(fi, dim=1)[:, :i] if ci != i else s


def unpack_fp4(packed: torch.Tensor, columns: int) -> torch.Tensor:
    """uint8 ``[O, I/2]`` -> E2M1 values ``[O, I]``: element 2j in the low nibble of byte j."""
    table = torch.tensor(E2M1, dtype=torch.float32)
    p = packed.to(torch.uint8)
    lo, hi = (p & 0x0F).long(), (p >> 4).long()
    out = torch.stack([table[lo], table[hi]], dim=-1).reshape(p.shape[0], -1)
    return out[:, :columns]


def unpack_int32(packed: torch.Tensor, bits: int, columns: int) -> torch.Tensor:
    """int32 words ``[O, ceil(I*B/32)]`` -> signed codes ``[O, I]``: lowest bits first, stored
    unsigned (code + 2^(B-1))."""
    per = 32 // bits
    words = packed.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(per, dtype=torch.int64) * bits
    vals = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    vals = vals.reshape(packed.shape[0], -1)[:, :columns]
    return vals - (1 << (bits - 1))


def dequantize(scheme, parts: dict[str, torch.Tensor], shape: tuple[int, int], sym: dict) -> torch.Tensor:
    """The float32 weight ``[O, I]`` of one quantized module (``parts``: its stored tensors by leaf name)."""
    o, i = shape
    if scheme.dequant == "fp4":
        codes = unpack_fp4(parts[scheme.weight_name], i)
        scale = parts["weight_scale"].float()  # the block scale first combined with the global one, as both define it
        if "weight_scale_2" in parts:  # Model Optimizer: per_block_scale = scale * weight_scale_2
            scale = scale * parts["weight_scale_2"].float().reshape(())
        if "weight_global_scale" in parts:  # compressed-tensors: scale / global_scale
            scale = scale / parts["weight_global_scale"].float().reshape(())
        return codes * _expand(scale, shape)
    if scheme.dequant == "int_packed":
        codes = unpack_int32(parts[scheme.weight_name], int(sym["B"]), i).float()
        if "weight_zero_point" in parts:
            zp = unpack_int32(parts["weight_zero_point"].t().contiguous(), int(sym["B"]), o).t().float()
            codes = codes - _expand(zp, shape)
        return codes * _expand(parts["weight_scale"], shape)
    codes = parts[scheme.weight_name].float()
    if "weight_zero_point" in parts:
        codes = codes - _expand(parts["weight_zero_point"].float(), shape, sym)
    return codes * _expand(parts["weight_scale"], shape, sym)


def raw_codes(scheme, parts: dict[str, torch.Tensor], shape: tuple[int, int]) -> torch.Tensor | None:
    """What a release that builds the module as a plain bf16 Linear loads: the stored values copied
    (FP8 / INT8 codes, unscaled), or None when it skips the tensor (a packed weight_packed)."""
    if scheme.weight_name != "weight" or scheme.packed:
        return None
    return parts["weight"].float()


__all__ = ["E2M1", "dequantize", "raw_codes", "unpack_fp4", "unpack_int32"]
