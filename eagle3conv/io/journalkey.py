"""The per-user key that signs eagle3conv's in-place write journals.

A journal left in a checkpoint folder tells the next command how to finish an
interrupted in-place ``fix-keys``, and finishing it moves and removes files. A
folder downloaded from a stranger can carry a journal too, and its digests are
values anyone can compute from the folder's own files. So the writer signs its
journal with HMAC-SHA256 under a random key only this user's eagle3conv holds,
and recovery acts only on a journal whose signature it can check: one written
by this user, on this machine, for this very folder (docs/architecture.md,
"Crash safety").

The key lives in ``$EAGLE3CONV_STATE_DIR``, else ``$XDG_STATE_HOME/eagle3conv``,
else ``~/.local/state/eagle3conv``, as ``journal.key`` (64 hex digits, mode
0600, in a folder nobody else can write). It is created on the first in-place
write; a key that is not this user's own regular file with those modes is not
used.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import secrets
import stat
import tempfile
from pathlib import Path

KEY_FILE = "journal.key"
_KEY_BYTES = 32


def state_dir() -> Path:
    explicit = os.environ.get("EAGLE3CONV_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "eagle3conv"
    return Path.home() / ".local" / "state" / "eagle3conv"


def key_path() -> Path:
    return state_dir() / KEY_FILE


def _private_dir(d: Path) -> bool:
    try:
        st = os.lstat(d)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _read_key(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077 or st.st_size > 256:
            return None
        raw = os.read(fd, 256).strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    return key if len(key) == _KEY_BYTES else None


def load_key(*, create: bool) -> bytes | None:
    """This user's journal key, or None when there is none to be had (``create``: make one)."""
    d = state_dir()
    if not _private_dir(d):
        if not create:
            return None
        try:
            d.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return None
        if not _private_dir(d):
            return None
    path = d / KEY_FILE
    key = _read_key(path)
    if key is not None or not create:
        return key
    try:
        fd, tmp = tempfile.mkstemp(prefix=".journal.key.", dir=d)  # 0600
    except OSError:
        return None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_bytes(_KEY_BYTES).hex() + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # never over a key another process made meanwhile
        except OSError as e:
            if e.errno != errno.EEXIST:
                return None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return _read_key(path)


def signature(key: bytes, payload: dict) -> str:
    """HMAC-SHA256 of the payload's canonical JSON."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def same_signature(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
