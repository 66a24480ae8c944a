"""safetensors dtype names, their sizes, and their numpy / torch equivalents.

Importing this module imports neither numpy nor torch (the console's read-ahead
validates headers before either is loaded); the functions that return their
dtypes import them.
"""

from __future__ import annotations

# name -> (itemsize, numpy dtype name or None when numpy has none, torch dtype attribute name)
DTYPES: dict[str, tuple[int, str | None, str]] = {
    "BOOL": (1, "bool", "bool"),
    "U8": (1, "uint8", "uint8"),
    "I8": (1, "int8", "int8"),
    "U16": (2, "uint16", "uint16"),
    "I16": (2, "int16", "int16"),
    "F16": (2, "float16", "float16"),
    "BF16": (2, None, "bfloat16"),
    "U32": (4, "uint32", "uint32"),
    "I32": (4, "int32", "int32"),
    "F32": (4, "float32", "float32"),
    "U64": (8, "uint64", "uint64"),
    "I64": (8, "int64", "int64"),
    "F64": (8, "float64", "float64"),
    "F8_E4M3": (1, None, "float8_e4m3fn"),
    "F8_E5M2": (1, None, "float8_e5m2"),
}

FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2"})
INT_DTYPES = frozenset({"U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64"})

# what users type for --dtype
USER_DTYPES = {"bf16": "BF16", "bfloat16": "BF16", "fp16": "F16", "float16": "F16", "half": "F16",
               "fp32": "F32", "float32": "F32", "float": "F32"}
# the choices --dtype offers: the first spelling of each dtype above (bf16, fp16, fp32)
DTYPE_CHOICES = tuple(name for i, (name, dt) in enumerate(USER_DTYPES.items())
                      if dt not in list(USER_DTYPES.values())[:i])


def itemsize(dtype: str) -> int:
    return DTYPES[dtype][0]


def torch_name(dtype: str) -> str:
    """The torch (and config.json ``torch_dtype``) spelling: ``BF16`` -> ``bfloat16``."""
    return DTYPES[dtype][2]


def storage_view(dtype: str):
    """A numpy dtype to map the raw bytes with, and the torch dtype name to view them as
    afterwards (None when numpy's own dtype is the right one): ``BF16`` -> (uint16, "bfloat16")."""
    import numpy as np

    np_name = DTYPES[dtype][1]
    if np_name is not None:
        return np.dtype(np_name), None
    return np.dtype(f"u{itemsize(dtype)}"), torch_name(dtype)


def numpy_dtype(dtype: str):
    import numpy as np

    np_name = DTYPES[dtype][1]
    if np_name is None:
        raise TypeError(f"{dtype} has no numpy equivalent")
    return np.dtype(np_name)


def torch_dtype(dtype: str):
    import torch

    return getattr(torch, DTYPES[dtype][2])


def from_torch(tdtype) -> str:
    name = str(tdtype).removeprefix("torch.")
    for key, (_, _, tname) in DTYPES.items():
        if tname == name:
            return key
    raise TypeError(f"unsupported tensor dtype {tdtype}")
