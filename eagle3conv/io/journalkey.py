"""The per-user key that signs eagle3conv's in-place write journals.

A journal left in a checkpoint folder tells the next command how to finish an
interrupted in-place ``fix-keys``, and finishing it moves and removes files. A
folder downloaded from a stranger can carry a journal too, and its digests are
values anyone can compute from the folder's own files. So the writer signs its
journal with HMAC-SHA256 under a random key only this user's eagle3conv holds,
and recovery acts only on a journal whose signature it can check: one written
with this key for the very files it replaces (docs/architecture.md, "Crash safety").

The key lives in ``$EAGLE3CONV_STATE_DIR`` (an absolute path), else
``$XDG_STATE_HOME/eagle3conv``, else ``~/.local/state/eagle3conv``, as ``journal.key``
(64 hex digits and a newline, mode 0600). The folder (a symlink to one is followed) must be this
user's own and writable by nobody else; the key must be this user's own regular file (never a
link), readable by nobody else. It is created on the first in-place write. When there is no key
to be had, :func:`obtain` raises :class:`NoKey` saying which and why, and in-place ``fix-keys``
refuses before it writes anything: an unsigned journal could never be finished.
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
_MAX_KEY_FILE = 256


class NoKey(Exception):
    """No usable journal key: ``where`` (the state folder or key file), ``why`` (what is wrong with
    it), ``fix`` (what makes it usable)."""

    def __init__(self, where: str, why: str, fix: str):
        super().__init__(f"{where}: {why}")
        self.where, self.why, self.fix = where, why, fix


def state_dir() -> Path:
    """Where the key lives (raises :class:`NoKey` when there is no such place)."""
    explicit = os.environ.get("EAGLE3CONV_STATE_DIR")
    if explicit:
        if not os.path.isabs(explicit):
            raise NoKey(f"EAGLE3CONV_STATE_DIR={explicit}", "is not an absolute path",
                        "give EAGLE3CONV_STATE_DIR as an absolute path")
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "eagle3conv"
    try:
        home = Path.home()
    except (RuntimeError, KeyError):
        raise NoKey("~/.local/state/eagle3conv", "this user has no home folder ($HOME is not set)",
                    "set EAGLE3CONV_STATE_DIR to a folder of your own") from None
    return home / ".local" / "state" / "eagle3conv"


def key_path() -> Path:
    return state_dir() / KEY_FILE


_OWN_FOLDER = "set EAGLE3CONV_STATE_DIR to a folder of your own that nobody else can write (created 0700 if missing)"


def _check_dir(d: Path) -> None:
    """``d`` (a link to it is followed) is a folder of this user's that nobody else can write."""
    st = os.stat(d)
    if not stat.S_ISDIR(st.st_mode):
        raise NoKey(str(d), "is not a folder", _OWN_FOLDER)
    if st.st_uid != os.geteuid():
        raise NoKey(str(d), f"belongs to another user (uid {st.st_uid}): they could replace the key",
                    _OWN_FOLDER)
    if st.st_mode & 0o022:
        raise NoKey(str(d), f"can be written by other users (mode {stat.S_IMODE(st.st_mode):04o}): they could "
                            "replace the key", f"chmod 700 {d} and remove {d / KEY_FILE} if you did not make it; or "
                                               f"{_OWN_FOLDER}")


def _make_dir(d: Path) -> None:
    try:
        os.stat(d)
        return
    except FileNotFoundError:
        pass
    except OSError:
        return  # a file where a folder should be, a folder we may not enter: _check_dir says which
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        where = e.filename if e.filename else d
        raise NoKey(str(d), f"cannot be created ({e.strerror or e}: {where})", _OWN_FOLDER) from None


def _read_key(path: Path) -> bytes:
    """The key in ``path``; raises :class:`NoKey` (``FileNotFoundError`` when there is none)."""
    fix = f"remove it (rm {path}): a new key is made on the next in-place fix-keys"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise NoKey(str(path), f"cannot be read ({e.strerror or e})", _OWN_FOLDER) from None
    kinds = {stat.S_ISLNK: "a symbolic link (the key is read only from a regular file)",
             stat.S_ISDIR: "a folder", stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket",
             stat.S_ISCHR: "a device", stat.S_ISBLK: "a device"}
    for test, what in kinds.items():
        if test(st.st_mode):
            raise NoKey(str(path), f"is {what}, not a key file", f"remove it and let eagle3conv make its key; or "
                                                                 f"{_OWN_FOLDER}")
    if st.st_uid != os.geteuid():
        raise NoKey(str(path), f"belongs to another user (uid {st.st_uid})", _OWN_FOLDER)
    if st.st_mode & 0o077:
        raise NoKey(str(path), f"can be read by other users (mode {stat.S_IMODE(st.st_mode):04o}): a journal "
                               "signed with it proves nothing", fix)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise NoKey(str(path), f"cannot be read ({e.strerror or e})", _OWN_FOLDER) from None
    try:
        fst = os.fstat(fd)
        if (fst.st_ino, fst.st_dev) != (st.st_ino, st.st_dev):
            raise NoKey(str(path), "changed while it was read", "run the command again")
        raw = os.read(fd, _MAX_KEY_FILE + 1)
    finally:
        os.close(fd)
    if not raw.strip():
        raise NoKey(str(path), "is empty", fix)
    if len(raw) > _MAX_KEY_FILE:
        raise NoKey(str(path), f"is longer than a key ({_KEY_BYTES * 2} hex digits)", fix)
    try:
        key = bytes.fromhex(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != _KEY_BYTES:
        raise NoKey(str(path), f"does not hold a key ({_KEY_BYTES * 2} hex digits)", fix)
    return key


def _create_key(d: Path) -> None:
    try:
        fd, tmp = tempfile.mkstemp(prefix=".journal.key.", dir=d)  # 0600
    except OSError as e:
        raise NoKey(str(d / KEY_FILE), f"cannot be created ({e.strerror or e})", _OWN_FOLDER) from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_bytes(_KEY_BYTES).hex() + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, d / KEY_FILE)  # never over a key another process made meanwhile
        except OSError as e:
            if e.errno != errno.EEXIST:
                raise NoKey(str(d / KEY_FILE), f"cannot be created ({e.strerror or e})", _OWN_FOLDER) from None
    finally:
        Path(tmp).unlink(missing_ok=True)


def obtain(*, create: bool) -> bytes:
    """This user's journal key (``create``: make the folder and the key when missing). Raises
    :class:`NoKey` saying why there is none to be had."""
    d = state_dir()
    if create:
        _make_dir(d)
    try:
        _check_dir(d)
    except FileNotFoundError:
        raise NoKey(str(d), "does not exist (no in-place fix-keys has made a key here)", _OWN_FOLDER) from None
    except OSError as e:
        raise NoKey(str(d), f"cannot be used ({e.strerror or e})", _OWN_FOLDER) from None
    try:
        return _read_key(d / KEY_FILE)
    except FileNotFoundError:
        if not create:
            raise NoKey(str(d / KEY_FILE), "does not exist (no in-place fix-keys has made a key here)",
                        _OWN_FOLDER) from None
    _create_key(d)
    try:
        return _read_key(d / KEY_FILE)
    except FileNotFoundError:
        raise NoKey(str(d / KEY_FILE), "vanished after it was made", "run the command again") from None


def load_key(*, create: bool) -> bytes | None:
    """This user's journal key, or None when there is none to be had (``create``: make one)."""
    try:
        return obtain(create=create)
    except NoKey:
        return None


def signature(key: bytes, payload: dict) -> str:
    """HMAC-SHA256 of the payload's canonical JSON."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def same_signature(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
