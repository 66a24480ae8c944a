"""Small file-system helpers shared by the commands that write files."""

from __future__ import annotations

import errno
import fcntl
import glob
import json
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path


def umask() -> int:
    """The process umask (read without changing it for longer than a call)."""
    old = os.umask(0o022)
    os.umask(old)
    return old


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, durable: bool = True, mode: int | None = None,
                       before_replace: Callable[[], None] | None = None) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a
    rename: readers see the old file or the new one, never half of one. The file
    gets ``mode``, else the mode any new file would (``0666 & ~umask``; mkstemp alone
    gives 0600). ``durable`` fsyncs before the rename. Raises :class:`OSError`; the
    temporary file never outlives a failure, and one a killed writer left is removed
    by the next write of the same file. ``before_replace`` runs once the temporary file
    is complete, just before the rename (the crash tests count a step there). Nothing
    here opens an existing name: the temporary file is new (``O_EXCL``), and a FIFO or
    link in ``path``'s place is replaced, never written through."""
    p = Path(path)
    remove_stale_temps(p)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # marks the temp as live (see remove_stale_temps)
        os.fchmod(fd, (0o666 & ~umask()) if mode is None else mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def atomic_write_text(path: str | os.PathLike, text: str, *, durable: bool = True, mode: int | None = None,
                      before_replace: Callable[[], None] | None = None) -> Path:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8"), durable=durable, mode=mode, before_replace=before_replace)


def json_text(data: object) -> str:
    """The one JSON spelling of files eagle3conv writes: indent 2, no NaN/Infinity, newline-terminated."""
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def atomic_write_json(path: str | os.PathLike, data: object, *, durable: bool = True,
                      mode: int | None = None, before_replace: Callable[[], None] | None = None) -> Path:
    """:func:`atomic_write_text` of :func:`json_text` (raises ValueError for NaN/Infinity
    before anything is written)."""
    return atomic_write_text(path, json_text(data), durable=durable, mode=mode, before_replace=before_replace)


def write_json_file(path: str | os.PathLike, data: object, *, durable: bool = True) -> None:
    """Write :func:`json_text` into ``path`` directly (created or truncated), then fsync
    it when ``durable``. For files nobody reads until the writer is done with them: a
    journal, or a file in a staging folder that is renamed into place as a whole."""
    raw = json_text(data).encode()
    # never through a link, never waiting on a FIFO (O_NONBLOCK: ENXIO instead), only into a regular file
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
                 | getattr(os, "O_NOCTTY", 0), 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        view = memoryview(raw)
        while view:
            n = os.write(fd, view)
            if n <= 0:
                raise OSError("short write")
            view = view[n:]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


# --- folder locks ---------------------------------------------------------------------------
#
# Every command that reads or writes a checkpoint folder takes an flock on the folder's own
# directory descriptor: writers (in-place fix-keys, config, recovery) exclusively, readers
# (inspect, checks, dry runs, --out sources, verify, push) shared. Locking the directory itself
# leaves no file behind in the user's folder and works on read-only folders and mounts. The
# kernel drops the lock when its holder dies, so a killed run never leaves the folder locked.

LOCK_WAIT = 10.0  # seconds a command waits for another one before it refuses; EAGLE3CONV_LOCK_WAIT overrides


def lock_wait() -> float:
    raw = os.environ.get("EAGLE3CONV_LOCK_WAIT")
    try:
        return max(0.0, float(raw)) if raw else LOCK_WAIT
    except ValueError:
        return LOCK_WAIT


def _proc_command(pid: int) -> str | None:
    """'fix-keys', 'inspect', ... for an eagle3conv process; else its program name."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    args = [a.decode(errors="replace") for a in argv if a]
    for i, a in enumerate(args):
        if a == "eagle3conv" or a.endswith("/eagle3conv") or a.endswith("eagle3conv/__main__.py"):
            rest = [x for x in args[i + 1:] if not x.startswith("-")]
            return rest[0] if rest else "eagle3conv"
    return Path(args[0]).name if args else None


def lock_holders(root: str | os.PathLike) -> list[tuple[int, str | None, bool]]:
    """Other processes holding an flock on the folder ``root``: (pid, command, exclusive)."""
    try:
        st = os.stat(root)
        text = Path("/proc/locks").read_text()
    except OSError:
        return []
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    out = []
    for line in text.splitlines():
        parts = line.split()
        if "->" in parts or len(parts) < 6 or parts[1] != "FLOCK":
            continue
        try:
            pid = int(parts[4])
        except ValueError:
            continue
        if parts[5] == want and pid != os.getpid():
            out.append((pid, _proc_command(pid), parts[3] == "WRITE"))
    return out


def describe_holders(root: str | os.PathLike) -> str:
    """'another eagle3conv (pid 123, fix-keys) is writing FOLDER' or a general sentence."""
    held = lock_holders(root)
    if not held:
        return f"another eagle3conv command is using {root}"
    held.sort(key=lambda h: not h[2])
    pid, cmd, exclusive = held[0]
    who = f"pid {pid}, {cmd}" if cmd else f"pid {pid}"
    more = f" (and {len(held) - 1} more)" if len(held) > 1 else ""
    return f"another eagle3conv ({who}){more} is {'writing' if exclusive else 'reading'} {root}"


_held: dict[tuple[int, int], list] = {}  # (dev, inode) → [fd, exclusive, depth]: locks this process holds


class FolderLock:
    """An flock on a folder (see :func:`folder_lock`); :meth:`upgrade` / :meth:`downgrade` switch modes."""

    def __init__(self, root: Path, key, command: str, wait: float):
        self.root, self.key, self.command, self.wait = root, key, command, wait

    @property
    def exclusive(self) -> bool:
        return _held[self.key][1]

    def _take(self, fd: int, exclusive: bool) -> None:
        from eagle3conv.errors import FolderBusyError

        op = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
        deadline = time.monotonic() + self.wait
        while True:
            try:
                fcntl.flock(fd, op)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    who = describe_holders(self.root)
                    raise FolderBusyError(
                        f"{who}; {self.command} waited {self.wait:g} s and stopped without touching anything",
                        hint=f"rerun `eagle3conv {self.command}` when it finishes "
                             "(EAGLE3CONV_LOCK_WAIT=SECONDS waits longer)") from None
                time.sleep(0.05)

    def upgrade(self) -> None:
        entry = _held[self.key]
        if not entry[1]:
            self._take(entry[0], True)
            entry[1] = True

    def downgrade(self) -> None:
        entry = _held[self.key]
        if entry[1]:
            fcntl.flock(entry[0], fcntl.LOCK_SH)
            entry[1] = False


@contextmanager
def folder_lock(root: str | os.PathLike, *, exclusive: bool, command: str, wait: float | None = None):
    """Hold an flock on the folder ``root`` (its directory descriptor) for the ``with`` block.

    Waits up to ``wait`` seconds (default :func:`lock_wait`) for another process,
    then raises :class:`~eagle3conv.errors.FolderBusyError` naming it. Re-entrant
    within a process: a nested request reuses the held lock (upgrading it to
    exclusive if asked, and restoring the mode on exit)."""
    from eagle3conv.errors import CheckpointReadError

    root = Path(root)
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise CheckpointReadError(f"{root}: cannot open the folder: {e.strerror or e}") from None
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino)
    lock = FolderLock(root, key, command, lock_wait() if wait is None else wait)
    if key in _held:
        os.close(fd)
        entry = _held[key]
        was = entry[1]
        entry[2] += 1
        try:
            if exclusive:
                lock.upgrade()
            yield lock
        finally:
            entry[2] -= 1
            if not was and entry[1]:
                lock.downgrade()
        return
    _held[key] = [fd, exclusive, 1]
    try:
        lock._take(fd, exclusive)
        yield lock
    finally:
        del _held[key]
        os.close(fd)  # closing the only descriptor releases the flock


# --- stale temporary files ------------------------------------------------------------------

_TEMP_TAIL = re.compile(r"[a-z0-9_]{8}\.tmp")  # what tempfile.mkstemp puts after our prefix


def remove_stale_temps(path: str | os.PathLike) -> list[Path]:
    """Remove ``.NAME.XXXXXXXX.tmp`` files beside ``path`` left by killed writers of it (nobody
    holds their flock); a live writer's temp is left alone.

    Only regular files of the exact shape :func:`atomic_write_text` creates are touched: each
    name is checked with ``lstat`` first, so a FIFO, device, socket, folder or link of that
    name is never opened (opening a FIFO would wait for a writer forever) and never removed.
    The flock that tells a live writer's temp is taken on a non-blocking descriptor of the
    very file ``lstat`` saw."""
    p = Path(path)
    prefix = f".{p.name}."
    removed = []
    for tmp in p.parent.glob(f"{glob.escape(prefix)}*.tmp"):
        if not _TEMP_TAIL.fullmatch(tmp.name[len(prefix):]):
            continue
        try:
            st = os.lstat(tmp)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            continue
        try:
            fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
        except OSError:
            continue
        try:
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(now.st_mode):
                continue  # swapped since lstat
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            again = os.lstat(tmp)
            if (again.st_dev, again.st_ino) == (st.st_dev, st.st_ino):
                tmp.unlink()
                removed.append(tmp)
        except OSError:
            pass  # a live writer holds it, or the folder is read-only
        finally:
            os.close(fd)
    return removed
