"""safetensors dtype names, their sizes, and their numpy / torch equivalents."""

from __future__ import annotations

import numpy as np

# name -> (itemsize, numpy dtype or None when numpy has none, torch dtype attribute name)
DTYPES: dict[str, tuple[int, np.dtype | None, str]] = {
    "BOOL": (1, np.dtype(np.bool_), "bool"),
    "U8": (1, np.dtype(np.uint8), "uint8"),
    "I8": (1, np.dtype(np.int8), "int8"),
    "U16": (2, np.dtype(np.uint16), "uint16"),
    "I16": (2, np.dtype(np.int16), "int16"),
    "F16": (2, np.dtype(np.float16), "float16"),
    "BF16": (2, None, "bfloat16"),
    "U32": (4, np.dtype(np.uint32), "uint32"),
    "I32": (4, np.dtype(np.int32), "int32"),
    "F32": (4, np.dtype(np.float32), "float32"),
    "U64": (8, np.dtype(np.uint64), "uint64"),
    "I64": (8, np.dtype(np.int64), "int64"),
    "F64": (8, np.dtype(np.float64), "float64"),
    "F8_E4M3": (1, None, "float8_e4m3fn"),
    "F8_E5M2": (1, None, "float8_e5m2"),
}

FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2"})
INT_DTYPES = frozenset({"U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64"})

# what users type for --dtype
USER_DTYPES = {"bf16": "BF16", "bfloat16": "BF16", "fp16": "F16", "float16": "F16", "half": "F16",
               "fp32": "F32", "float32": "F32", "float": "F32"}


def itemsize(dtype: str) -> int:
    return DTYPES[dtype][0]


def torch_name(dtype: str) -> str:
    """The torch (and config.json ``torch_dtype``) spelling: ``BF16`` -> ``bfloat16``."""
    return DTYPES[dtype][2]


def storage_view(dtype: str) -> tuple[np.dtype, str | None]:
    """A numpy dtype to map the raw bytes with, and the torch dtype name to view them as
    afterwards (None when numpy's own dtype is the right one): ``BF16`` -> (uint16, "bfloat16")."""
    np_dtype = DTYPES[dtype][1]
    if np_dtype is not None:
        return np_dtype, None
    return np.dtype(f"u{itemsize(dtype)}"), torch_name(dtype)


def numpy_dtype(dtype: str) -> np.dtype:
    np_dtype = DTYPES[dtype][1]
    if np_dtype is None:
        raise TypeError(f"{dtype} has no numpy equivalent")
    return np_dtype


def torch_dtype(dtype: str):
    import torch

    return getattr(torch, DTYPES[dtype][2])


def from_torch(tdtype) -> str:
    name = str(tdtype).removeprefix("torch.")
    for key, (_, _, tname) in DTYPES.items():
        if tname == name:
            return key
    raise TypeError(f"unsupported tensor dtype {tdtype}")
