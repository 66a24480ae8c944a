"""Which files of a checkpoint folder eagle3conv may read, copy or upload.

A file inside a checkpoint folder may be a symlink. :func:`safe_member` allows it
when it resolves (``os.path.realpath``) to a regular file inside the folder --
or, for a Hugging Face cache snapshot (``models--org--name/snapshots/<rev>/``,
whose files are links into ``../../blobs/``), inside the repo's ``models--*``
folder. Anything else -- a link leaving the folder (say, ``tokenizer.json`` ->
``~/.cache/huggingface/token``), a link to a FIFO, device or folder, a dangling
link -- is refused with :class:`UnsafeLinkError`, naming the file and where it
points, never a byte of what it points to.

When the user asks for it (``--follow-symlinks`` on ``push`` and ``fix-keys``),
links that leave the folder are followed as long as they end at a regular file;
each one is recorded (:func:`followed`) so the command can say so.
"""

from __future__ import annotations

import os
import stat
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from eagle3conv.errors import CheckpointReadError

# (path as given, where it resolves) for every link followed past the folder while following
_FOLLOW: ContextVar[list[tuple[str, str]] | None] = ContextVar("eagle3conv_follow_symlinks", default=None)


class UnsafeLinkError(CheckpointReadError):
    """A file of the checkpoint folder is a link eagle3conv refuses to read."""


@contextmanager
def following():
    """Within this block links leaving the folder are followed (to regular files only) and recorded."""
    token = _FOLLOW.set([])
    try:
        yield _FOLLOW.get()
    finally:
        _FOLLOW.reset(token)


def is_following() -> bool:
    return _FOLLOW.get() is not None


def boundary(root: Path) -> Path:
    """The folder a file of ``root`` must resolve into: ``root``, or the ``models--*`` repo
    folder when ``root`` is one of its snapshots."""
    root = Path(root)
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith(("models--", "datasets--")):
        return root.parent.parent
    return root


def _inside(real: str, folder: str) -> bool:
    return real == folder or real.startswith(folder.rstrip(os.sep) + os.sep)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def safe_member(root: Path, path: Path, *, follow: bool | None = None) -> Path:
    """``path`` (a file in the checkpoint folder ``root``) if it is safe to read, else raise.

    Safe: it resolves to a regular file inside :func:`boundary` (``root``). ``follow``
    (default: whether a :func:`following` block is active) also allows a regular file
    outside it, and records the link. A FIFO, device, folder or dangling link is refused
    either way. Never opens the file.
    """
    path = Path(path)
    if follow is None:
        follow = is_following()
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError as e:
        where = os.readlink(path) if path.is_symlink() else real
        raise UnsafeLinkError(
            f"{path}: a link to {where}, which does not exist (dangling link)" if path.is_symlink()
            else f"{path}: cannot read: {e.strerror}",
            hint="restore the file it points to, or replace the link with the file itself",
        ) from None
    if not stat.S_ISREG(st.st_mode):
        what = _kind(st.st_mode)
        raise UnsafeLinkError(
            f"{path}: points to {real}, {what}; eagle3conv reads only regular files" if real != os.path.abspath(path)
            else f"{path}: {what}; eagle3conv reads only regular files",
            hint="replace it with a regular file, or move it out of the checkpoint folder",
        )
    fence = os.path.realpath(boundary(root))
    if _inside(real, fence):
        return path
    if follow:
        log = _FOLLOW.get()
        if log is not None and (str(path), real) not in log:
            log.append((str(path), real))
        return path
    raise UnsafeLinkError(
        f"{path}: a symlink to {real}, outside the checkpoint folder {fence}; refused to read it "
        "(a link can expose any file of this machine, such as a stored token)",
        hint="copy the file into the folder if it belongs to the checkpoint, or pass --follow-symlinks "
             "to read it through the link (push and fix-keys say which links they followed)",
    )


def present(path: Path) -> bool:
    """True for a regular file, a link to one, or a link to something that is not a folder
    (dangling, FIFO, device): an entry :func:`safe_member` has to judge."""
    path = Path(path)
    return path.is_file() or (path.is_symlink() and not path.is_dir())
