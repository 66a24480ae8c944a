"""Reading byte ranges of a file straight into memory the caller owns, with ``preadv``.

States readers use these to put a file's rows into (pinned) batch buffers with large reads and
no page faults: :func:`pread_into` fills one contiguous buffer, :func:`pread_scatter` reads one
contiguous range of the file into many buffers in order (parts nobody wants go to a scratch
buffer), so a file is read front to back once whatever layout the consumer wants.
"""

from __future__ import annotations

import os

from eagle3conv.errors import CheckpointReadError

# the most buffers one preadv call takes (Linux's IOV_MAX; os.sysconf says so where it can)
IOV_MAX = max(16, min(1024, os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024))


def _ended(path) -> CheckpointReadError:
    return CheckpointReadError(f"{path}: the file ended early (was it truncated while verify read it?)")


def pread_into(fd: int, dst, offset: int, path) -> None:
    """Fill the contiguous numpy array ``dst`` with the file's bytes from ``offset``."""
    mv = memoryview(dst).cast("B")
    got = 0
    while got < len(mv):
        n = os.preadv(fd, [mv[got:]], offset + got)
        if n <= 0:
            raise _ended(path)
        got += n


def pread_scatter(fd: int, buffers: list, offset: int, path) -> None:
    """Fill ``buffers`` (writable byte memoryviews, in order) with the file's bytes from ``offset``:
    the first ``len(buffers[0])`` bytes go to ``buffers[0]``, the next to ``buffers[1]``, ... At most
    :data:`IOV_MAX` buffers per system call; a short read resumes where it stopped."""
    i = 0
    pos = offset
    while i < len(buffers):
        chunk = buffers[i:i + IOV_MAX]
        want = sum(len(b) for b in chunk)
        n = os.preadv(fd, chunk, pos)
        if n <= 0:
            raise _ended(path)
        pos += n
        if n == want:
            i += len(chunk)
            continue
        for b in chunk:  # a short read: skip the buffers it filled, resume inside the one it stopped in
            if n < len(b):
                buffers = [b[n:]] + buffers[i + 1:]
                i = 0
                break
            n -= len(b)
            i += 1


__all__ = ["IOV_MAX", "pread_into", "pread_scatter"]
