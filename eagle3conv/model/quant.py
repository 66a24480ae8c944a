"""The static FP8 activation quantization a release applies to a module with a stored
``input_scale`` (docs/facts.md §14), for verify's forward: :class:`StaticFP8Input`, a weight whose
``F.linear`` input is quantized to FP8 E4M3 with that scale first."""

from __future__ import annotations

import torch

FP8_MAX = 448.0


def fake_quant_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x quantized to FP8 E4M3 with a static per-tensor scale and back (saturating at 448)."""
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return (q.float() * scale).to(x.dtype)


class StaticFP8Input(torch.Tensor):
    """A weight whose F.linear input is first quantized to FP8 with the module's stored
    ``input_scale`` (static-scale formats: the release quantizes activations that way). Slicing and
    moving keep the scale; every other use of the tensor sees a plain weight."""

    input_scale: float

    @staticmethod
    def __new__(cls, data: torch.Tensor, input_scale: float):
        t = torch.Tensor._make_subclass(cls, data, False)
        t.input_scale = float(input_scale)
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear:
            x, w = args[0], args[1]
            scale = w.input_scale
            rest = list(args[2:])
            with torch._C.DisableTorchFunctionSubclass():
                plain = w.as_subclass(torch.Tensor)
                return torch.nn.functional.linear(fake_quant_fp8(x, scale), plain, *rest, **kwargs)
        scales = [a.input_scale for a in args if isinstance(a, StaticFP8Input)]
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if scales and isinstance(out, torch.Tensor) and out.ndim == 2 and func.__name__ in (
                "to", "__getitem__", "contiguous", "detach", "clone", "cuda", "cpu", "float", "bfloat16", "half"):
            return StaticFP8Input(out, scales[0])
        return out


__all__ = ["FP8_MAX", "StaticFP8Input", "fake_quant_fp8"]
