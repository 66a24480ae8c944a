"""safetensors files: the one validated header reader, the one header-layout writer, pwrite_all.

Every reader of a safetensors header in the package goes through
:func:`read_safetensors_header` (bounded, validated, nothing echoed from a bad
file); every writer lays its header out with :func:`header_layout` and writes
bytes with :func:`pwrite_all`.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3conv.errors import CheckpointReadError
from eagle3conv.io import dtypes

__all__ = ["MAX_HEADER", "TensorInfo", "header_layout", "pwrite_all", "read_safetensors_header"]

MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the source: where its bytes are, never the bytes."""

    name: str
    dtype: str  # safetensors spelling: BF16, F32, I64, BOOL...
    shape: tuple[int, ...]
    file: Path  # the file as the user sees it (may be a symlink into a cache)
    start: int | None = None  # absolute byte offsets for safetensors files
    end: int | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtypes.itemsize(self.dtype)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_safetensors_header(path: Path, *, max_header: int = MAX_HEADER) -> tuple[dict[str, TensorInfo], dict]:
    """Parse and validate one safetensors header (at most ``max_header`` bytes of JSON). Reads
    len(header)+8 bytes.

    Nothing read from a file that fails validation is echoed back (a link to a
    secret file must not leak its first bytes through an error message)."""
    import stat

    from eagle3conv.io.jsonfile import loads_strict, regular_file_size

    size = regular_file_size(path, "safetensors file")
    try:
        # never blocks: a FIFO swapped in after the check gives no data instead of a hang
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise CheckpointReadError(f"{path}: not a regular safetensors file")
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointReadError(f"{path}: not a safetensors file (only {size} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > max_header or n + 8 > size:
                raise CheckpointReadError(
                    f"{path}: not a safetensors file, or truncated: its first 8 bytes are not a header "
                    f"length that fits the file ({size} bytes)",
                    hint="if it was cut off during download or copy, fetch it again",
                )
            raw = f.read(n)
    except OSError as e:
        raise CheckpointReadError(f"{path}: cannot read: {e.strerror}") from e
    try:
        header = loads_strict(raw, path)
    except CheckpointReadError:
        raise CheckpointReadError(f"{path}: not a safetensors file: its header is not valid JSON") from None
    if not isinstance(header, dict):
        raise CheckpointReadError(f"{path}: safetensors header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointReadError(
            f"{path}: safetensors __metadata__ must be an object of strings, got a {type(metadata).__name__}"
            + ("" if not isinstance(metadata, dict) else " with non-string values"))
    base = 8 + n
    tensors: dict[str, TensorInfo] = {}
    spans = []
    for name, entry in header.items():
        if not isinstance(entry, dict):
            raise CheckpointReadError(f"{path}: malformed header entry for {name!r}: not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in dtypes.DTYPES:
            raise CheckpointReadError(
                f"{path}: tensor {name!r} has an unknown dtype (expected one of {', '.join(dtypes.DTYPES)})")
        if isinstance(shape, list) and any(_is_int(d) and d < 0 for d in shape):
            raise CheckpointReadError(f"{path}: tensor {name!r} has a negative dimension")
        if not isinstance(shape, list) or not all(_is_int(d) and d < 2**63 for d in shape):
            raise CheckpointReadError(
                f"{path}: malformed header entry for {name!r}: shape must be a list of integers from 0 to 2^63-1")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(_is_int(x) and 0 <= x <= size for x in offsets)):
            raise CheckpointReadError(
                f"{path}: malformed header entry for {name!r}: data_offsets must be two integers within the "
                f"file ({size} bytes)")
        s, e = offsets
        shape = tuple(shape)
        need = math.prod(shape) * dtypes.itemsize(dtype)  # Python ints: no overflow
        if e < s or e - s != need:
            raise CheckpointReadError(
                f"{path}: tensor {name!r} spans {e - s} bytes but {dtype}{list(shape)} needs {need}"
            )
        tensors[name] = TensorInfo(name, dtype, shape, path, base + s, base + e)
        spans.append((s, e, name))
    spans.sort()
    pos = 0
    for s, e, name in spans:
        if s != pos:
            raise CheckpointReadError(f"{path}: tensor {name!r} overlaps or leaves a hole (offset {s}, expected {pos})")
        pos = e
    if base + pos != size:
        raise CheckpointReadError(
            f"{path}: truncated or padded: header describes {base + pos} bytes, the file has {size}",
            hint="the file was probably cut off during download or copy; fetch it again",
        )
    return tensors, metadata


# --- writing -------------------------------------------------------------------


def header_layout(
    entries: Iterable[tuple[str, str, Sequence[int]]], metadata: dict[str, str] | None = None
) -> tuple[bytes, list[tuple[int, int]]]:
    """The header bytes (8-byte length prefix included) for tensors placed in the given order.

    ``entries`` are ``(name, safetensors dtype, shape)``; returns the header and each
    tensor's ``(data offset, nbytes)`` relative to the end of the header, in order.
    The header is padded with spaces to a multiple of 8 bytes, as safetensors does.
    """
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata is not None else {}
    pos = 0
    placed = []
    for name, dtype, shape in entries:
        nbytes = math.prod(shape) * dtypes.itemsize(dtype)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
        placed.append((pos, nbytes))
        pos += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, placed


def pwrite_all(
    fd: int, data: Any, offset: int, *, chunk: int = 64 << 20, after_chunk: Callable[[], None] | None = None
) -> None:
    """Write all of ``data`` (any buffer) at ``offset``, in pieces of at most ``chunk`` bytes.

    Raises :class:`OSError` on a short write. ``after_chunk`` runs after each chunk
    (the checkpoint writer counts its crash-test steps there).
    """
    mv = memoryview(data).cast("B")
    while mv:
        n = os.pwrite(fd, mv[:chunk], offset)
        if n <= 0:
            raise OSError("short write")
        mv, offset = mv[n:], offset + n
        if after_chunk is not None:
            after_chunk()
