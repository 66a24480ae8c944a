"""Pickled torch checkpoints, loaded weights-only and bounded before they are opened.

``torch.load(weights_only=True, mmap=True)`` refuses a pickle that asks for
anything but tensors and plain containers, so a malicious file is refused
before any of it runs; :func:`check_pickle_bounds` first refuses files whose
records could make the load use unbounded memory.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from eagle3conv.errors import CheckpointReadError, UnsafePickleError

MAX_PICKLE_RECORD = 16 * 1024 * 1024  # data.pkl of a zip checkpoint: tensor metadata only, never this large
MAX_LEGACY_PICKLE = 1024 * 1024 * 1024  # a pre-zip torch.save is read whole into memory


def check_pickle_bounds(path: Path) -> None:
    """Refuse, before ``torch.load``, a pickle whose loading could take memory out of
    proportion to the file: non-regular files, zip records that are compressed
    (torch writes them stored) or claim more bytes than the file holds, an outsized
    pickle record, and old-style (non-zip) pickles larger than ``MAX_LEGACY_PICKLE``."""
    import zipfile

    from eagle3conv.io.jsonfile import regular_file_size

    size = regular_file_size(path, "checkpoint file")
    resave = ("if you trust this file, re-save its state dict as safetensors where it was made "
              "(safetensors.torch.save_file), then run eagle3conv on that")
    if not zipfile.is_zipfile(path):
        if size > MAX_LEGACY_PICKLE:
            raise CheckpointReadError(
                f"{path}: an old-style (non-zip) torch pickle of {size} bytes; it would be read whole into "
                f"memory, and eagle3conv reads these only up to {MAX_LEGACY_PICKLE} bytes", hint=resave)
        return
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise CheckpointReadError(f"{path}: not a readable torch checkpoint (broken zip: {e})") from None
    total = 0
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
            raise CheckpointReadError(
                f"{path}: zip record {info.filename!r} is compressed; torch.save stores records uncompressed, "
                "and a compressed one could expand without bound (a zip bomb), so it is not loaded", hint=resave)
        if info.filename.endswith(".pkl") and info.file_size > MAX_PICKLE_RECORD:
            raise CheckpointReadError(
                f"{path}: pickle record {info.filename!r} is {info.file_size} bytes; a state dict's is far "
                f"smaller (limit {MAX_PICKLE_RECORD}), so it is not loaded", hint=resave)
        total += info.file_size
    if total > size:
        raise CheckpointReadError(
            f"{path}: its zip records claim {total} bytes but the file has {size}; not loaded", hint=resave)


def load_pickle(path: Path) -> Any:
    """torch.load, weights only. A pickle asking for anything else is refused unrun."""
    import pickle

    import torch

    # argparse.Namespace is how SpecForge and DeepSpeed store training args;
    # building one runs no code beyond setting attributes.
    safe = [argparse.Namespace]
    check_pickle_bounds(path)
    try:
        with torch.serialization.safe_globals(safe):
            try:
                return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:
                if "mmap" not in str(e) and "zip" not in str(e):
                    raise
                # legacy (non-zip) serialization cannot be memory-mapped
                return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()
        reason = next((line for line in first if "Unsupported" in line or "global" in line.lower()), first[0] if first else "")
        raise UnsafePickleError(
            f"{path}: refused to unpickle: it asks for more than tensors ({reason.strip()[:200]}). "
            "eagle3conv loads pickles weights-only, so nothing in it was run.",
            hint="if you trust this file, re-save its state dict as safetensors where it was made "
            "(safetensors.torch.save_file), then run eagle3conv on that",
        ) from None
    except (EOFError, OSError, ValueError, RuntimeError, KeyError, IndexError, TypeError, AttributeError) as e:
        raise CheckpointReadError(f"{path}: not a readable torch checkpoint ({type(e).__name__}: {e})") from None


