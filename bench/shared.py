"""Helpers the GPU benchmarks share, torch-free (``fresh_cold.py``'s driver never imports torch)."""

from __future__ import annotations

import json
import os
import subprocess
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


def timed_verify(cmd: list[str], env: dict, timeout: float) -> dict:
    """Run a fresh ``eagle3conv verify ... --json`` process: its wall time, exit code, the report's
    seconds, acceptance and accept length, and the console's phases line (EAGLE3CONV_PHASES);
    the output's tails where it failed."""
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    run: dict = {"wall_s": round(time.perf_counter() - t, 3), "exit_code": p.returncode}
    try:
        doc = json.loads(p.stdout)
        run["verify_seconds"] = doc.get("seconds")
        run["acceptance"] = doc.get("acceptance_per_position")
        run["accept_length"] = doc.get("accept_length")
    except (ValueError, AttributeError):
        run["stdout_tail"] = p.stdout[-500:]
    phases = [ln for ln in p.stderr.splitlines() if ln.startswith("eagle3conv phases:")]
    if phases:
        run["phases"] = json.loads(phases[-1].split(":", 1)[1])
    if p.returncode not in (0, 4):
        run["stderr_tail"] = p.stderr[-1500:]
    return run
