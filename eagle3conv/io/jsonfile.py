"""Reading small JSON files the user hands us (config.json, training_metadata.json,
index files): regular files only, bounded in size, read once, strict JSON.

A FIFO, a device (``/dev/zero``) or a socket is refused before it is opened, so a
read can neither hang nor fill memory; NaN and Infinity (which Python's json
accepts but no engine's parser does) and nesting too deep for the parser are
clear errors, not crashes.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from eagle3conv.errors import CheckpointReadError

MAX_JSON_BYTES = 64 * 1024 * 1024


def regular_file_size(path: Path, what: str = "file", *, error: type = CheckpointReadError) -> int:
    """The size of ``path`` after checking it is a regular file (symlinks followed).
    Raises ``error`` naming the path for anything else."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise error(f"{path}: cannot read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode)
                else "a character device" if stat.S_ISCHR(st.st_mode) else "a block device"
                if stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise error(f"{path}: {kind}, not a regular {what}", hint=f"pass the path of a regular {what}")
    return st.st_size


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")


def loads_strict(raw: bytes | str, path: Path, *, error: type = CheckpointReadError, allow_nonfinite: bool = False):
    """``json.loads`` that refuses NaN/Infinity (unless ``allow_nonfinite``: a config
    validator then names the field) and survives hostile nesting."""
    try:
        if isinstance(raw, bytes):
            raw = raw.decode("utf-8")
        if allow_nonfinite:
            return json.loads(raw)
        return json.loads(raw, parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e})") from None
    except ValueError as e:  # parse_constant
        raise error(f"{path}: not valid JSON ({e}; write a number or null)") from None
    except RecursionError:
        raise error(f"{path}: not valid JSON (nested too deeply to parse)") from None


def read_json_file(path: str | os.PathLike, what: str = "JSON file", *, max_bytes: int | None = None,
                   error: type = CheckpointReadError, want_object: bool = True, allow_nonfinite: bool = False):
    """Read and parse one JSON file: regular file only, at most ``max_bytes``, read once."""
    p = Path(path)
    raw = read_small_file(p, what, MAX_JSON_BYTES if max_bytes is None else max_bytes, error=error)
    data = loads_strict(raw, p, error=error, allow_nonfinite=allow_nonfinite)
    if want_object and not isinstance(data, dict):
        raise error(f"{p}: expected a JSON object, got {type(data).__name__}")
    return data


def read_small_file(p: Path, what: str, max_bytes: int, *, error: type = CheckpointReadError) -> bytes:
    """The bytes of one regular file of at most ``max_bytes``, read once through one descriptor (a
    FIFO or device is refused before it is opened, a file swapped for one after the check refused)."""
    size = regular_file_size(p, what, error=error)
    if size > max_bytes:
        raise error(f"{p}: {size} bytes; a {what} is at most {max_bytes} bytes")
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise error(f"{p}: cannot read: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped between stat and open
            raise error(f"{p}: not a regular {what}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise error(f"{p}: cannot read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(raw) > max_bytes:
        raise error(f"{p}: more than {max_bytes} bytes; a {what} is not that large")
    return raw


def object_fields(raw: object, where: str, required: set[str], optional: set[str] = frozenset(), *,
                  fail) -> dict:
    """``raw`` as a JSON object holding every ``required`` field and nothing outside ``required`` and
    ``optional``; else ``fail(message)`` is raised (the caller's error, naming its file)."""
    if not isinstance(raw, dict):
        raise fail(f"{where} must be an object")
    unknown, missing = set(raw) - required - optional, required - set(raw)
    if unknown or missing:
        raise fail(f"{where}: unknown fields {sorted(unknown)}, missing fields {sorted(missing)}")
    return raw
