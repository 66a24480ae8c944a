"""Reading files ahead into the page cache with a few threads, so the disk works while Python imports
torch, CUDA initialises or a single-threaded copy walks a memory-mapped file.

Used by the console (``verify``'s weights and states, started before the CLI is imported) and by
``verify.inputs.load_drafter_weights`` (a cold drafter's weights, read in parallel while
``safetensors`` maps them and ``build_drafter`` copies them to the device). No imports beyond the
standard library: the console calls this before anything heavy is imported.

Nothing here follows a link it was not told to (``follow``), opens a file in a way that can block on
a FIFO, or keeps more than one descriptor per file that still has spans to read.
"""

import os
import threading
import time

_T0 = time.perf_counter()
_active: set[str] = set()  # files this process is reading ahead (or has): never read twice
_lock = threading.Lock()


def mem_available() -> int:
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


READ_CHUNK = 16 << 20


def read_plan(path: str, striped: bool) -> list[tuple[str, int, int]]:
    """(path, offset, length) reads covering the file. ``striped``: a safetensors file whose large
    tensors are read a slice of each at a time, in row order -- states are stored one [sequences,
    positions, width] tensor per layer, so slice j of every layer is the same sequences, and the
    first batches of every layer are in the page cache first, as the drafter reads them."""
    import json
    import struct

    size = os.path.getsize(path)
    if striped:
        try:
            with os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                if n > min(size - 8, 100 << 20):
                    raise ValueError("not a safetensors header")
                header = json.loads(f.read(n))
            base = 8 + n
            spans = sorted((base + v["data_offsets"][0], base + v["data_offsets"][1])
                           for k, v in header.items() if k != "__metadata__")
            small = [(a, b - a) for a, b in spans if b - a < 4 * READ_CHUNK]
            large = [(a, b - a) for a, b in spans if b - a >= 4 * READ_CHUNK]
            plan = [(path, 0, base)] + [(path, a, n) for a, n in small]
            if large:
                parts = max(1, min(256, max(n for _, n in large) // READ_CHUNK))
                for j in range(parts):
                    for a, n in large:
                        lo, hi = n * j // parts, n * (j + 1) // parts
                        plan.append((path, a + lo, hi - lo))
            return plan
        except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error):
            pass
    return [(path, off, min(4 * READ_CHUNK, size - off)) for off in range(0, size, 4 * READ_CHUNK)]


def read_ahead(plan: list[tuple[str, int, int]], info: dict, workers: int = 4,
               follow: frozenset | set = frozenset()) -> None:
    """Read the plan's spans once, in order, with a few threads (a disk serves several requests
    at once faster than one), discarding the bytes: the page cache holds them when the command
    reaches them, and the disk works while Python imports torch and initialises CUDA. Each file
    is closed after its last span."""
    lock = threading.Lock()
    nxt = [0]
    total = [0]
    fds: dict = {}
    left: dict = {}  # spans still to read per file: a file is closed after its last one
    for path, _, _ in plan:
        left[path] = left.get(path, 0) + 1

    def done_with(path: str) -> None:
        with lock:
            left[path] -= 1
            fd = fds.pop(path, -1) if not left[path] else -1
        if fd >= 0:
            os.close(fd)

    def work() -> None:
        buf = bytearray(READ_CHUNK)
        mv = memoryview(buf)
        while True:
            with lock:
                if nxt[0] >= len(plan):
                    return
                path, off, length = plan[nxt[0]]
                nxt[0] += 1
                fd = fds.get(path)
                if fd is None:
                    try:
                        fd = fds[path] = os.open(path, open_flags(path, follow))
                    except OSError:
                        fd = fds[path] = -1
            if fd < 0:
                done_with(path)
                continue
            end = off + length
            while off < end:
                try:
                    n = os.preadv(fd, [mv[: min(READ_CHUNK, end - off)]], off)
                except OSError:
                    break
                if not n:
                    break
                off += n
                with lock:
                    total[0] += n
            done_with(path)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for fd in fds.values():
        if fd >= 0:
            os.close(fd)
    info["read_ahead_bytes"] = total[0]
    info["read_ahead_done"] = round(time.perf_counter() - _T0, 3)  # since this module was imported


def open_flags(path: str, follow: frozenset | set = frozenset()) -> int:
    """Read-only, never blocking (a FIFO put in a file's place between the check and the open gives
    no data instead of a hang), and not through a link unless ``path`` is in ``follow`` (the console:
    only the states file the user named; the library: files its checkpoint index already vetted)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    if path not in follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    return flags


def cached(files: list[str], samples: int = 16, follow: frozenset | set | None = None) -> bool:
    """Whether the files look fully in the page cache: a one-page ``preadv(RWF_NOWAIT)`` at
    ``samples`` places in each succeeds (it fails instead of waiting for the disk). False when
    the kernel cannot say. Reading ahead files already cached only costs memory bandwidth."""
    nowait = getattr(os, "RWF_NOWAIT", None)
    if nowait is None or not files:
        return False
    if follow is None:  # the console's convention: only the last file (the states) through a link
        follow = {files[-1]}
    buf = bytearray(4096)
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                         | (getattr(os, "O_NOFOLLOW", 0) if path not in follow else 0))
        except OSError:
            return False
        try:
            size = os.fstat(fd).st_size
            for j in range(samples):
                os.preadv(fd, [buf], size * j // samples, nowait)
        except OSError:  # BlockingIOError: not cached; EOPNOTSUPP etc.: cannot tell
            return False
        finally:
            os.close(fd)
    return True


def prefetch(files: list[str], info: dict | None = None, workers: int = 4, striped_last: bool = False,
             follow: frozenset | set | None = None) -> bool:
    """Start reading ``files`` ahead in a daemon thread (``workers`` readers, in order; the last one
    striped by rows when ``striped_last``) unless it would not help: files this process already
    reads ahead, files already cached, or more bytes than half the available memory (reading them
    would evict what was read first before anyone gets there). Returns whether it started.
    ``info`` receives ``read_ahead_*`` figures (bytes, when done) and, when skipped, why."""
    info = {} if info is None else info
    with _lock:
        files = [p for p in files if os.path.realpath(p) not in _active]
    if not files or workers < 1:
        return False
    follow = {files[-1]} if follow is None else follow
    try:
        size = sum(os.path.getsize(p) for p in files)
    except OSError:
        return False
    if size > mem_available() // 2:
        info["read_ahead"] = "more than half the available memory"
        return False
    if cached(files, follow=follow):
        info["read_ahead"] = "inputs already cached"
        return False
    with _lock:
        _active.update(os.path.realpath(p) for p in files)
    plan = [span for i, p in enumerate(files)
            for span in read_plan(p, striped=striped_last and i == len(files) - 1)]
    threading.Thread(target=read_ahead, args=(plan, info, min(workers, 16), frozenset(follow)),
                     name="eagle3conv-read-ahead", daemon=True).start()
    info["read_ahead_files"] = len(files)
    info["read_ahead_threads"] = min(workers, 16)
    return True
