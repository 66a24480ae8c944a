"""Small file-system helpers shared by the commands that write files."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def umask() -> int:
    """The process umask (read without changing it for longer than a call)."""
    old = os.umask(0o022)
    os.umask(old)
    return old


def atomic_write_text(path: str | os.PathLike, text: str, *, durable: bool = True) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a
    rename: readers see the old file or the new one, never half of one. The file
    gets the mode any new file would (``0666 & ~umask``; mkstemp alone gives 0600).
    ``durable`` fsyncs before the rename. Raises :class:`OSError`; the temporary
    file never outlives a failure."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p
