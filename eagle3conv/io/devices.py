"""``--device`` and ``--dtype`` as users type them, checked against this machine.

The one resolver of both: ``capture``, ``verify`` and the states files use it.
"""

from __future__ import annotations

import re
from typing import Any

from eagle3conv.errors import UsageError
from eagle3conv.io import dtypes

__all__ = ["FLOAT_CHOICES", "resolve_device", "resolve_dtype"]

FLOAT_CHOICES = ("BF16", "F16", "F32")  # the compute / storage float dtypes a user may ask for


def resolve_device(choice: str | None) -> str:
    """``auto`` (or None), ``cpu``, ``cuda`` or ``cuda:N``, checked against this machine."""
    import torch

    choice = (choice or "auto").strip().lower()
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cpu":
        return "cpu"
    m = re.fullmatch(r"cuda(?::(\d+))?", choice)
    if not m:
        raise UsageError(f"--device {choice!r}: use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise UsageError(f"--device {choice}: no CUDA device here", hint="use --device cpu or auto")
    if m.group(1) is not None and int(m.group(1)) >= torch.cuda.device_count():
        raise UsageError(f"--device {choice}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return choice


def resolve_dtype(choice: Any, device: str | None = None, *, what: str = "--dtype") -> Any:
    """``bf16`` / ``fp16`` / ``fp32`` (any spelling of :data:`eagle3conv.io.dtypes.USER_DTYPES`)
    or a torch float dtype -> the torch dtype. ``auto`` is accepted when ``device`` is
    given: bf16 on CUDA, fp32 on CPU. ``what`` names the setting in the error message."""
    import torch

    allowed = "auto, bf16, fp16 or fp32" if device is not None else "bf16, fp16 or fp32"
    if isinstance(choice, torch.dtype):
        if choice not in tuple(dtypes.torch_dtype(d) for d in FLOAT_CHOICES):
            raise UsageError(f"{what} must be {allowed}, got {choice}")
        return choice
    name = str(choice).strip().lower()
    if name == "auto" and device is not None:
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    st = dtypes.USER_DTYPES.get(name)
    if st is None:
        raise UsageError(f"{what} must be {allowed}, got {choice!r}")
    return dtypes.torch_dtype(st)
