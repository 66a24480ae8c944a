"""Disk helpers the GPU benchmarks share, torch-free (``fresh_cold.py``'s driver never imports torch)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def drop_caches() -> bool:
    """Drop the whole page cache (root only); False where the kernel refuses."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def read_loop(files: list[Path], buf_mb: int = 16) -> tuple[float, int]:
    """A plain read of ``files`` in ``buf_mb`` MiB ``readinto`` calls: (seconds, bytes)."""
    buf = bytearray(buf_mb << 20)
    mv = memoryview(buf)
    total = 0
    t = time.perf_counter()
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(mv):
                total += n
    return time.perf_counter() - t, total
