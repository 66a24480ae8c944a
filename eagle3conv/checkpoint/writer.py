"""Streaming safetensors writer, proof by re-reading, and crash-safe commits.

Bytes move in cache-sized chunks by byte range (no tensor is decoded unless
it is cast), including row slices of fused tensors. Each chunk is read back
from the output right after it is written and compared with what it must hold
(see :class:`_Mover`), so the proof costs little more than the copy. Memory
stays bounded by two chunk buffers, whatever the checkpoint's size.

Commits
-------
``--out DIR``: everything is written to a hidden sibling folder, proven, synced,
then renamed to DIR in one step.

In place: new files go to ``CKPT/.eagle3conv-staging``; once proven and synced,
a journal (``CKPT/.eagle3conv-journal.json``, written by atomic rename) records
what replaces what: that is the commit point. Old files then move to
``.eagle3conv-backup``, new ones move in, and the backup, staging and journal are
removed. :func:`recover` runs before any later command touches the folder: with
a journal it rolls forward (every step is idempotent), without one it removes
an unfinished staging folder. Killed at any instant, the folder therefore holds
the old checkpoint, the new one, or a state the next run completes.

Two commands on one folder: every command takes an flock on the folder
(:func:`prepared`): an in-place write exclusively for its whole run (plan, write,
commit), readers shared. Recovery runs only under the exclusive lock, so it never
removes what a live writer owns; a command that cannot get the lock within
``EAGLE3CONV_LOCK_WAIT`` seconds refuses, naming the other process.

The journal is signed, and checked before recovery acts on it (:func:`read_journal`):
only plain names of the kinds fix-keys writes, each new file present with the size and
digest recorded, each replaced one as recorded. A journal that fails a check is refused
and nothing is touched. An in-place write that cannot sign refuses before it writes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import glob
import hashlib
import os
import re
import shutil
import signal
import stat
import struct
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from eagle3conv.io import dtypes
from eagle3conv.checkpoint.index import BIN_INDEX, SAFETENSORS_INDEX, CheckpointIndex
from eagle3conv.checkpoint.links import safe_member
from eagle3conv.checkpoint.plan import Output, Plan
from eagle3conv.spec.canonical import D2T
from eagle3conv.io.progress import Progress
from eagle3conv.io import testhooks
from eagle3conv.io.files import folder_lock, umask, write_json_file
from eagle3conv.io.testhooks import stall
from eagle3conv.io.safetensors import header_layout, pwrite_all
from eagle3conv.errors import FolderBusyError, JournalError, UsageError, WriteError

JOURNAL = ".eagle3conv-journal.json"
STAGING = ".eagle3conv-staging"
BACKUP = ".eagle3conv-backup"
CHUNK = testhooks.chunk_bytes(2 << 20)  # cache-sized: the proof re-reads it while hot


_libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
_memcmp = _libc.memcmp
_memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_memcmp.restype = ctypes.c_int


_step = testhooks.StepCounter()  # the crash tests' SIGKILL hook (io/testhooks.py)


def count_step() -> None:
    """One filesystem step of a write (the crash tests kill at the N-th, io/testhooks.py);
    ``config`` counts one before replacing config.json."""
    _step()


def steps_taken() -> int:
    return _step.count


# --- shards -------------------------------------------------------------------------

def parse_size(text: str) -> int:
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    t = text.strip().upper().replace(" ", "")
    num = t.rstrip("KMGIB")
    unit = t[len(num):]
    try:
        value = float(num)
    except ValueError:
        raise UsageError(f"--max-shard-size {text!r}: expected a size like 5GB or 500MiB") from None
    if unit not in units or value <= 0:
        raise UsageError(f"--max-shard-size {text!r}: expected a size like 5GB or 500MiB")
    return int(value * units[unit])


def plan_shards(plan: Plan, max_shard_size: int | None = None) -> list[tuple[str, list[Output]]]:
    """Group outputs into files: like the source by default, or packed to a size."""
    outs = plan.outputs
    groups: list[list[Output]] = []
    if max_shard_size:
        cur: list[Output] = []
        size = 0
        for o in outs:
            if cur and size + o.nbytes > max_shard_size:
                groups.append(cur)
                cur, size = [], 0
            cur.append(o)
            size += o.nbytes
        if cur:
            groups.append(cur)
    else:
        order = {f: i for i, f in enumerate(plan.index.weight_files)}
        by_file: dict[int, list[Output]] = {}
        homeless = []  # rebuilt tensors (t2d) join the shard of the vocab map they came from
        for o in outs:
            src = plan.index.tensors.get(o.source) if o.source else None
            if src is None:
                homeless.append(o)
            else:
                by_file.setdefault(order.get(src.file, 0), []).append(o)
        d2t = plan.index.tensors.get(next((o.source for o in outs if o.name == D2T), None) or "")
        home = order.get(d2t.file, 0) if d2t else min(by_file, default=0)
        by_file.setdefault(home, []).extend(homeless)
        groups = [by_file[k] for k in sorted(by_file)]
    if len(groups) <= 1:
        return [("model.safetensors", groups[0] if groups else [])]
    n = len(groups)
    return [(f"model-{i + 1:05d}-of-{n:05d}.safetensors", g) for i, g in enumerate(groups)]


def _layout(outputs: list[Output]) -> tuple[bytes, list[tuple[Output, int]]]:
    """Header bytes and each tensor's data offset. Largest items first keeps every tensor aligned."""
    ordered = sorted(outputs, key=lambda o: (-dtypes.itemsize(o.dtype), o.name))
    header, offsets = header_layout(((o.name, o.dtype, o.shape) for o in ordered), {"format": "pt"})
    return header, [(o, pos) for o, (pos, _) in zip(ordered, offsets, strict=True)]


# --- byte movers ------------------------------------------------------------------------

def _pwrite_all(fd: int, data, offset: int) -> None:
    pwrite_all(fd, data, offset, chunk=CHUNK, after_chunk=_step)


class _Mover:
    """Moves bytes source → output in chunks and proves each chunk right away.

    Each chunk is read from the source into a buffer, written to the output,
    then read back from the output through a separate descriptor (opened by
    path) and compared with memcmp while both are still in the CPU cache. The
    proof thus costs little more than the copy: memory traffic stays close to
    ``cp``'s, and memory use is two chunk buffers whatever the checkpoint's size.
    """

    def __init__(self, progress: Progress | None, total: int | None = None):
        self.buf = bytearray(CHUNK)
        self.back = bytearray(CHUNK)
        self._pa = ctypes.addressof((ctypes.c_char * CHUNK).from_buffer(self.buf))
        self._pb = ctypes.addressof((ctypes.c_char * CHUNK).from_buffer(self.back))
        self.progress = progress
        self.done = 0  # bytes written and proven, for progress("write", done, total)
        self.total = total
        self.errors: list[str] = []
        self.kernel_copy = hasattr(os, "copy_file_range")

    def _prove(self, chk_fd: int, data: memoryview, at: int, name: str) -> bool:
        n = len(data)
        got = os.preadv(chk_fd, [memoryview(self.back)[:n]], at)
        if data.obj is self.buf:
            same = got == n and _memcmp(self._pa, self._pb, n) == 0
        else:
            same = got == n and memoryview(self.back)[:n] == data
        if not same:
            self.errors.append(f"{name}: bytes read back at output offset {at} differ from the source")
        return same

    def copy(self, src_fd: int, src_off: int, dst_fd: int, chk_fd: int, dst_off: int, count: int, name: str) -> None:
        """Kernel copy (copy_file_range, as cp does), then both sides re-read while cache-hot."""
        mv = memoryview(self.buf)
        while count > 0:
            n = min(count, CHUNK)
            done = 0
            if self.kernel_copy:
                try:
                    done = os.copy_file_range(src_fd, dst_fd, n, src_off, dst_off)
                    _step()
                except OSError:
                    self.kernel_copy = False
            if done <= 0:
                done = os.preadv(src_fd, [mv[:n]], src_off)
                if done <= 0:
                    raise WriteError(f"source ended early while copying {name}")
                _pwrite_all(dst_fd, mv[:done], dst_off)
            elif os.preadv(src_fd, [mv[:done]], src_off) != done:
                raise WriteError(f"source ended early while copying {name}")
            if not self._prove(chk_fd, mv[:done], dst_off, name):
                return
            src_off, dst_off, count = src_off + done, dst_off + done, count - done
            self._advance(done)

    def write(self, chunks, dst_fd: int, chk_fd: int, dst_off: int, name: str) -> None:
        for whole in chunks:
            whole = memoryview(whole).cast("B")
            for s in range(0, len(whole), CHUNK):  # a cast may widen a chunk past CHUNK
                chunk = whole[s:s + CHUNK]
                _pwrite_all(dst_fd, chunk, dst_off)
                if not self._prove(chk_fd, chunk, dst_off, name):
                    return
                dst_off += len(chunk)
                self._advance(len(chunk))

    def _advance(self, n: int) -> None:
        self.done += n
        if self.progress:
            self.progress("write", self.done, self.total)


def _expected_chunks(index: CheckpointIndex, o: Output):
    """The bytes a rewritten, cast, dequantized or pickled output must hold, in bounded chunks."""
    if o.dequant is not None:
        yield from _dequantized_chunks(index, o)
        return
    if o.data is not None:
        if dtypes.DTYPES[o.dtype][1] is None:  # bf16, fp8: the data is the tensor's raw bytes (uint8)
            arr = np.ascontiguousarray(o.data, dtype=np.uint8)
        else:
            arr = np.ascontiguousarray(o.data.astype(dtypes.numpy_dtype(o.dtype), copy=False))
        mv = memoryview(arr.reshape(-1).view(np.uint8))
        for s in range(0, len(mv), CHUNK):
            yield mv[s:s + CHUNK]
        return
    src = index.tensors[o.source]
    rows = src.shape[0] if src.shape else 1
    row_bytes = src.nbytes // rows if rows else 0
    start_row = o.row_start
    end_row = o.row_end if o.row_end is not None else rows
    rows_per_chunk = max(1, CHUNK // max(row_bytes, 1))
    flat = index.raw_bytes_of_pickled(src.name) if src.start is None else None
    for r in range(start_row, end_row, rows_per_chunk):
        r2 = min(end_row, r + rows_per_chunk)
        if flat is not None:
            raw = flat[r * row_bytes: r2 * row_bytes]
        else:
            raw = bytearray((r2 - r) * row_bytes)
            with open(src.file, "rb", buffering=0) as f:
                if os.preadv(f.fileno(), [raw], src.start + r * row_bytes) != len(raw):
                    raise WriteError(f"{src.file}: source ended early while reading {src.name}")
        if o.dtype != src.dtype:
            import torch

            t = torch.frombuffer(bytearray(raw), dtype=dtypes.torch_dtype(src.dtype)).to(dtypes.torch_dtype(o.dtype))
            yield memoryview(t.view(torch.uint8).numpy())
        else:
            yield memoryview(raw)


def _dequantized_chunks(index: CheckpointIndex, o: Output):
    """fix-keys --dequantize: one module dequantized as its scheme defines (checkpoint/dequant.py) and
    written as bf16, a block of rows at a time: the weight's rows read for that block only (with the
    matching rows of a per-row, per-group or per-block scale), so memory stays a few chunks whatever the
    module's size. A packed-integer module (zero points packed across rows) is dequantized whole; a
    part that is not row-aligned (a per-tensor scale) is read once."""
    import torch

    from eagle3conv.checkpoint.dequant import dequantize

    d = o.dequant
    rows, cols = d.shape
    sym = dict(d.symbols)
    w_info = index.tensors[dict(d.parts)[d.scheme.weight_name]]
    block = int(sym.get("BO") or 1) if d.scheme.dequant == "scaled" else 1
    step = max(block, (CHUNK // max(1, cols * 4)) // block * block) if d.scheme.dequant != "int_packed" \
        and w_info.start is not None else rows
    spans = {leaf: _row_span(index.tensors[key], rows, block, leaf == d.scheme.weight_name) for leaf, key in d.parts}
    whole = {leaf: index.read_torch(key) for leaf, key in d.parts
             if spans[leaf] is None or index.tensors[key].start is None}
    for r in range(0, rows, step):
        r2 = min(rows, r + step)
        parts = {}
        for leaf, key in d.parts:
            if spans[leaf] is None:
                parts[leaf] = whole[leaf]
                continue
            lo, hi = spans[leaf](r, r2)
            parts[leaf] = whole[leaf][lo:hi] if leaf in whole else _read_rows(index.tensors[key], lo, hi)
        w = dequantize(d.scheme, parts, (r2 - r, cols), sym).to(torch.bfloat16).contiguous()
        flat = w.view(torch.uint8).reshape(-1).numpy()
        for s in range(0, len(flat), CHUNK):
            yield memoryview(flat[s:s + CHUNK])


def _row_span(info, rows: int, block: int, is_weight: bool):
    """Which rows of a module's stored tensor rows [r, r2) of the weight need, as a function of (r, r2):
    the same rows of the weight or a per-row scale, the block rows of a per-block scale; None for a
    tensor that is not row-aligned (a per-tensor scale, packed zero points): it is used whole."""
    if not info.shape:
        return None
    n = info.shape[0]
    if is_weight or n == rows:
        return lambda r, r2: (r, r2)
    if len(info.shape) == 2 and n == -(-rows // block) and block > 1:
        return lambda r, r2: (r // block, -(-r2 // block))
    return None


def _read_rows(info, lo: int, hi: int):
    """Rows [lo, hi) of a tensor stored in a safetensors file, read with one preadv."""
    import torch

    n = info.shape[0]
    row_bytes = info.nbytes // n
    raw = bytearray((hi - lo) * row_bytes)
    with open(info.file, "rb", buffering=0) as f:
        if os.preadv(f.fileno(), [raw], info.start + lo * row_bytes) != len(raw):
            raise WriteError(f"{info.file}: source ended early while reading {info.name}")
    return torch.frombuffer(raw, dtype=dtypes.torch_dtype(info.dtype)).reshape(hi - lo, *info.shape[1:])


# --- writing one folder --------------------------------------------------------------------------

@dataclass
class WriteResult:
    files: list[str]
    tensors: int
    bytes_written: int
    verified: int
    shards: list[tuple[str, list[str]]] = field(default_factory=list)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: Path, data: dict, durable: bool = True) -> None:
    write_json_file(path, data, durable=durable)
    _step()


def write_checkpoint(plan: Plan, folder: Path, *, max_shard_size: int | None = None,
                     progress: Progress | None = None, copy_other: bool = True, durable: bool = True) -> WriteResult:
    """Write the plan's tensors, index and config into ``folder`` (which must exist) and prove them.

    ``durable`` fsyncs every file before returning: needed in place, where old
    files are removed after the commit; ``--out`` leaves the source untouched,
    so it skips the flush to disk (as ``cp`` does) and survives SIGKILL all the same.
    """
    index = plan.index
    # every file copied beside the weights must stay inside the folder (links are judged first,
    # before a byte is written): a tokenizer.json linking to a stored token is refused by name
    copies = [safe_member(index.root, p) for p in index.other_files] if copy_other else []
    shards = plan_shards(plan, max_shard_size)
    mover = _Mover(progress, sum(o.nbytes for _, outs in shards for o in outs))
    written: list[str] = []
    total = 0
    src_fds: dict[Path, int] = {}
    try:
        for fname, outs in shards:
            header, placed = _layout(outs)
            path = folder / fname
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            chk = os.open(path, os.O_RDONLY)  # the proof reads through its own descriptor
            try:
                _pwrite_all(fd, header, 0)
                base = len(header)
                for o, off in placed:
                    src = index.tensors.get(o.source) if o.source else None
                    if o.data is None and o.dequant is None and src is not None and src.start is not None \
                            and o.dtype == src.dtype:
                        if src.file not in src_fds:
                            src_fds[src.file] = os.open(src.file, os.O_RDONLY)
                        rows = src.shape[0] if src.shape else 1
                        row_bytes = src.nbytes // rows if rows else 0
                        mover.copy(src_fds[src.file], src.start + o.row_start * row_bytes, fd, chk, base + off, o.nbytes, o.name)
                    else:
                        mover.write(_expected_chunks(index, o), fd, chk, base + off, o.name)
                    if mover.errors:
                        raise WriteError("the written checkpoint does not match its source; nothing was committed",
                                         details=mover.errors)
                    total += o.nbytes
                if durable:
                    os.fsync(fd)
                _step()
            finally:
                os.close(chk)
                os.close(fd)
            written.append(fname)
        if len(shards) > 1:
            weight_map = {o.name: fname for fname, outs in shards for o in outs}
            _write_json(folder / SAFETENSORS_INDEX, {
                "metadata": {"total_size": total},
                "weight_map": dict(sorted(weight_map.items())),
            }, durable)
            written.append(SAFETENSORS_INDEX)
        _write_json(folder / "config.json", plan.config, durable)
        written.append("config.json")
        if copy_other:
            for p in copies:
                shutil.copyfile(p, folder / p.name)
                _step()
                written.append(p.name)
    finally:
        for sfd in src_fds.values():
            os.close(sfd)
    _prove_headers(folder, shards)
    if durable:
        _fsync_dir(folder)
    return WriteResult(written, len(plan.outputs), total, len(plan.outputs),
                       [(f, [o.name for o in outs]) for f, outs in shards])


def _prove_headers(folder: Path, shards) -> None:
    """Re-open the output: every file parses, and its keys, shapes and dtypes are the plan's."""
    from eagle3conv.checkpoint.index import read_safetensors_header

    for fname, outs in shards:
        found, meta = read_safetensors_header(folder / fname)
        want = {o.name: (o.dtype, o.shape) for o in outs}
        got = {k: (v.dtype, v.shape) for k, v in found.items()}
        if want != got or meta.get("format") != "pt":
            diff = sorted(set(want.items()) ^ set(got.items()))
            raise WriteError(f"{fname}: written header differs from the plan: {diff[:5]}")


# --- commits ------------------------------------------------------------------------------------

def _staging_live(d: Path) -> bool:
    """Whether a live ``--out`` run holds the flock of its hidden staging folder ``d``."""
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def _out_busy(out: Path, mine: Path | None) -> None:
    for other in out.parent.glob(f".{glob.escape(out.name)}.eagle3conv-tmp-*"):
        if other == mine:
            continue
        if _staging_live(other):
            pid = other.name.rsplit("-", 1)[-1]
            raise FolderBusyError(f"{out}: another eagle3conv (pid {pid}, fix-keys --out) is writing it; "
                                  "nothing was written", hint="wait for it to finish, or choose another --out folder")
        shutil.rmtree(other, ignore_errors=True)  # left by a killed run


def write_out(plan: Plan, out: Path, **kw) -> WriteResult:
    """Write to a new folder ``out`` atomically.

    The hidden staging folder is flocked while it is written: a second run to the
    same ``out`` refuses at once, and a later run removes only the staging folders
    of dead runs."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out}: already exists and is not an empty folder", hint="choose a new --out folder, or remove it")
    if out.resolve() == plan.index.root.resolve():
        raise UsageError(f"{out}: is the source folder; leave out --out to fix in place")
    out.parent.mkdir(parents=True, exist_ok=True)
    _out_busy(out, None)
    staging = out.parent / f".{out.name}.eagle3conv-tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    lock_fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _out_busy(out, staging)  # another run that started at the same instant
        result = write_checkpoint(plan, staging, durable=False, **kw)
        stall("out-before-rename")
        try:
            os.replace(staging, out)
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise UsageError(f"{out}: already exists and is not an empty folder (written by another process "
                                 "meanwhile); nothing was written", hint="choose a new --out folder, or remove it") from None
            raise
        _step()
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        os.close(lock_fd)
    return result


# --- the journal ----------------------------------------------------------------------------------
#
# The journal is the commit point of an in-place write, and recovery moves and removes files on
# its word, so recovery acts only on a journal it can prove its own writer wrote for this folder,
# and only on steps it can check against what that writer stages:
#
# * the journal is signed (HMAC-SHA256, io/journalkey.py) with a key only this user's eagle3conv
#   holds, over its content, which names every file it replaces (size, mtime, first MiB's digest): the
#   folder's identity is the files the journal replaces, wherever they are (in the folder or moved to
#   the backup), not a device or inode number, so it survives a remount, a re-plugged disk or a
#   move. A journal that came with a download, was signed with another key, or was written for
#   other files is refused; an in-place write that cannot sign refuses before it writes anything;
# * a journal that cannot be checked (unsigned, an older version, another key) is finished only
#   when the user asks (`fix-keys --accept-journal`), after every check below;
# * every name is a plain file name of the kinds fix-keys writes (install) or replaces (replace),
#   short enough for the file system with the staging and backup folders' names in front;
# * every new file is in the staging folder or already moved in, with the size and digest recorded;
# * the folder is in a state the writer's own order of steps can leave: new files move in only
#   after every replaced file has moved to the backup folder, which holds nothing else;
# * removal happens only to what recovery itself moved into the backup folder (or the writer did,
#   at the same step of the same transaction).
#
# Anything else is refused before a single file is touched, naming the journal. A recovery that
# fails half-way (the file system said no) moves back what it moved and says so.

JOURNAL_VERSION = 4  # 3 signed the folder's device and inode, which a remount changes
WRITER_ID = "eagle3conv fix-keys"
MAX_JOURNAL_BYTES = 1 << 20
_INSTALL_RE = re.compile(r"(model\.safetensors|model-\d{5}-of-\d{5}\.safetensors|model\.safetensors\.index\.json|config\.json)")
_REPLACE_RE = re.compile(r"[^/\\\x00]+\.(safetensors|bin|pt|pth)|[^/\\\x00]+\.index\.json|config\.json")

committed: list[Path] = []  # folders this process committed an in-place write to (the CLI's Ctrl-C message)


def _digest(path: Path) -> str:
    """sha256 of a safetensors file's header (its keys, dtypes, shapes and offsets; the bytes were
    proven while written), or of a whole small file."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if path.name.endswith(".safetensors"):
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
            h.update(head + f.read(min(n, 100 << 20)))
        else:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _entry(path: Path) -> dict:
    return {"name": path.name, "size": path.stat().st_size, "sha256": _digest(path)}


_OLD_KEYS = {"name", "size", "mtime_ns", "sha256"}


def _old_entry(path: Path) -> dict:
    """A replaced file as the journal identifies it: size, modification time (kept by a rename, a
    remount, a copy-up) and the digest of its first MiB. A link is recorded by name only (recovery
    refuses a link in any case)."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise OSError
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {"name": path.name, "size": -1, "mtime_ns": -1, "sha256": "not a regular file"}
    with os.fdopen(fd, "rb") as f:
        head = f.read(1 << 20)
    return {"name": path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": hashlib.sha256(head).hexdigest()}


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _matches(path: Path, entry: dict) -> bool:
    try:
        st = os.lstat(path)
        return stat.S_ISREG(st.st_mode) and st.st_size == entry["size"] and _digest(path) == entry["sha256"]
    except OSError:
        return False


SIGNED_FIELDS = ("version", "writer", "install", "replace", "old")  # the signature covers exactly these


def signed_part(data: dict) -> dict:
    """What a journal's signature covers: its content, which names every replaced file with its
    size, modification time and first MiB's digest (the folder's identity; see above)."""
    return {k: data.get(k) for k in SIGNED_FIELDS}


def _leftovers(root: Path) -> str:
    return " ".join(str(root / n) for n in (JOURNAL, STAGING, BACKUP) if os.path.lexists(root / n)) or str(root / JOURNAL)


def _journal_refused(journal: Path, why: str) -> JournalError:
    """A journal whose steps do not match the folder: nothing here can say which files are whose."""
    root = journal.parent
    return JournalError(
        f"{journal}: not a journal eagle3conv can finish here ({why}); nothing was touched",
        hint=f"if no eagle3conv command is running on {root}: an interrupted fix-keys keeps its new files in "
             f"{root / STAGING} and the old ones it moved in {root / BACKUP}; move out of them what you want to "
             f"keep, then remove eagle3conv's leftovers (rm -r {_leftovers(root)}) and every command works "
             "on the folder again")


def _journal_unverified(journal: Path, why: str) -> JournalError:
    """A journal whose signature cannot be checked: the user's own interrupted run (its key changed or
    could not be read since) or one that came with the folder. Only the user can tell which."""
    root = journal.parent
    return JournalError(
        f"{journal}: eagle3conv cannot check this journal ({why}); nothing was touched",
        hint=f"if your own in-place fix-keys on {root} was interrupted, finish it: eagle3conv fix-keys {root} "
             "--accept-journal (every new file is still checked against the journal before anything moves); "
             f"if you never ran fix-keys on this folder, remove eagle3conv's leftovers that came with it: "
             f"rm -r {_leftovers(root)}")


def _name_limits(root: Path) -> tuple[int, int]:
    try:
        return os.pathconf(root, "PC_NAME_MAX"), os.pathconf(root, "PC_PATH_MAX")
    except (OSError, ValueError):
        return 255, 4096


def _listing(d: Path) -> list[str] | None:
    """The names in our own folder ``d`` (None when absent); raises OSError when unreadable."""
    if not os.path.lexists(d):
        return None
    return sorted(os.listdir(d))


def _entries_ok(entries, keys=frozenset({"name", "size", "sha256"})) -> bool:
    return isinstance(entries, list) and all(
        isinstance(e, dict) and set(e) == keys and isinstance(e["name"], str) and isinstance(e["sha256"], str)
        and all(isinstance(e[k], int) and not isinstance(e[k], bool) for k in keys - {"name", "sha256"})
        for e in entries)


def _parse_journal(journal: Path) -> dict:
    """The journal's JSON, checked for shape (:class:`JournalError` otherwise)."""
    from eagle3conv.errors import CheckpointReadError
    from eagle3conv.io.jsonfile import read_json_file

    if not _is_regular(journal):
        raise _journal_refused(journal, "not a regular file")
    try:
        data = read_json_file(journal, "journal", max_bytes=MAX_JOURNAL_BYTES, want_object=False)
    except CheckpointReadError as e:
        raise _journal_refused(journal, f"unreadable: {e.message}") from None
    if not isinstance(data, dict):
        raise _journal_refused(journal, "not a JSON object")
    if data.get("writer") != WRITER_ID:
        raise _journal_refused(journal, f"writer {str(data.get('writer'))[:40]!r}, not {WRITER_ID!r}")
    install, replace, old = data.get("install"), data.get("replace"), data.get("old")
    if not (_entries_ok(install) and isinstance(replace, list) and all(isinstance(n, str) for n in replace)
            and (old is None or (_entries_ok(old, _OLD_KEYS) and [e["name"] for e in old] == replace))):
        raise _journal_refused(journal, "'install' must list {name, size, sha256} objects, 'replace' names and "
                                        "'old' the identity of each file 'replace' names")
    return data


def _check_signature(journal: Path, data: dict) -> None:
    """Before the folder's files are looked at: nothing there is worth checking for a journal this
    writer did not sign."""
    from eagle3conv.io import journalkey

    if data.get("version") != JOURNAL_VERSION:
        raise _journal_unverified(journal, f"version {str(data.get('version'))[:20]!r}, expected "
                                           f"{JOURNAL_VERSION}: another version of eagle3conv wrote it")
    mac = data.get("signature")
    if not isinstance(mac, str) or data.get("old") is None:
        raise _journal_unverified(journal, "it carries no signature")
    try:
        key = journalkey.obtain(create=False)
    except journalkey.NoKey as e:
        raise _journal_unverified(journal, f"the journal key to check it with, {e.where}, {e.why}") from None
    if not journalkey.same_signature(mac, _signature(data, key)):
        raise _journal_unverified(journal, f"its signature does not match the journal key in "
                                           f"{journalkey.state_dir()}: it was signed with another key, or "
                                           "changed since")


def read_journal(root: Path, *, accept_unverified: bool = False) -> dict:
    """The journal of ``root``, checked against the folder (see above); raises :class:`JournalError`.
    ``accept_unverified``: the user asked to finish a journal whose signature cannot be checked
    (``fix-keys --accept-journal``); every other check still holds."""
    journal = root / JOURNAL
    data = _parse_journal(journal)
    install, replace = data["install"], data["replace"]
    names = [e["name"] for e in install]
    bad = [n for n in names if not _INSTALL_RE.fullmatch(n)] + \
          [n for n in replace if not _REPLACE_RE.fullmatch(n) or n.startswith(".")]
    if bad:
        raise _journal_refused(journal, f"names fix-keys never writes: {[b[:60] for b in bad[:5]]}")
    name_max, path_max = _name_limits(root)
    longest = max((len(os.fsencode(n)) for n in names + replace), default=0)
    deepest = max((len(os.fsencode(str(root / d / n))) for d in (STAGING, BACKUP) for n in names + replace),
                  default=0)
    if longest > name_max or deepest >= path_max:
        raise _journal_refused(journal, f"a name is longer than this file system allows ({name_max} bytes a "
                                        f"name, {path_max} a path)")
    if len(set(names)) != len(names) or len(set(replace)) != len(replace):
        raise _journal_refused(journal, "a name is listed twice")
    if "config.json" not in names or not any(n.endswith(".safetensors") for n in names):
        raise _journal_refused(journal, "it installs no weights and config")
    if not accept_unverified:
        _check_signature(journal, data)
    _check_state(root, journal, data)
    return {"install": names, "replace": replace, "entries": install}


def _check_state(root: Path, journal: Path, data: dict) -> None:
    """The folder is in a state the writer's order of steps leaves, with the very files the journal
    names: each new file staged or moved in as recorded, each replaced one (still in the folder or
    moved to the backup) as recorded when the journal was written."""
    install, replace = data["install"], data["replace"]
    names = [e["name"] for e in install]
    for d in (STAGING, BACKUP):
        if os.path.lexists(root / d) and not (stat.S_ISDIR(os.lstat(root / d).st_mode)):
            raise _journal_refused(journal, f"{d} is not a folder")
    try:
        staged_names, backed_up = _listing(root / STAGING) or [], _listing(root / BACKUP) or []
    except OSError as e:
        raise _journal_refused(journal, f"cannot list its folders: {e.strerror}") from None
    if set(staged_names) - set(names) or not all(_is_regular(root / STAGING / n) for n in staged_names):
        raise _journal_refused(journal, f"{STAGING} holds files the journal does not install")
    if set(backed_up) - set(replace) or not all(_is_regular(root / BACKUP / n) for n in backed_up):
        raise _journal_refused(journal, f"{BACKUP} holds files the journal does not replace")
    moved_in = set()
    for e in install:
        if e["name"] in staged_names:
            if not _matches(root / STAGING / e["name"], e):
                raise _journal_refused(journal, f"{STAGING}/{e['name']} is not the file the journal records")
        elif _matches(root / e["name"], e):
            moved_in.add(e["name"])
        else:
            raise _journal_refused(journal, f"{e['name']} is in neither {STAGING} nor the folder as recorded")
    old = {e["name"]: e for e in data.get("old") or []}
    for n in replace:  # the folder's identity: the very files the journal replaces, wherever they are now
        here = os.path.lexists(root / n)
        where = root / BACKUP / n if n in backed_up else root / n if here and n not in moved_in else None
        if n in old and where is not None and _old_entry(where) != old[n]:
            raise _journal_refused(journal, f"{where.relative_to(root)} is not the file the journal replaces (its "
                                            "size, time or first bytes differ): it was written for other files")
    for n in replace:
        here = os.path.lexists(root / n)
        if here and not _is_regular(root / n):
            raise _journal_refused(journal, f"{n} is not a regular file")
        if here and n in backed_up and n not in moved_in:
            raise _journal_refused(journal, f"{n} is both in the folder and in {BACKUP}")
        if moved_in and here and n not in moved_in:
            # the writer moves every replaced file to the backup before it moves any new one in
            raise _journal_refused(journal, f"{n} is still in the folder although new files were moved in")


def _signature(journal: dict, key: bytes) -> str:
    """The signature of a journal's :func:`signed_part` (written by :func:`_sign`, checked by
    :func:`_check_signature`)."""
    from eagle3conv.io import journalkey

    return journalkey.signature(key, signed_part(journal))


def _sign(journal: dict, key: bytes) -> dict:
    return dict(journal, signature=_signature(journal, key))


def _journal_key(root: Path) -> bytes:
    """The key the journal is signed with; :class:`JournalKeyError` before anything is written when
    there is none to be had (an unsigned journal could never be finished after a crash)."""
    from eagle3conv.errors import JournalKeyError
    from eagle3conv.io import journalkey

    try:
        return journalkey.obtain(create=True)
    except journalkey.NoKey as e:
        raise JournalKeyError(
            f"{root}: in-place fix-keys signs its crash journal with your journal key, and there is none to be "
            f"had: {e.where} {e.why}; nothing was written",
            hint=f"{e.fix} (the key is kept in $EAGLE3CONV_STATE_DIR, else $XDG_STATE_HOME/eagle3conv, else "
                 f"~/.local/state/eagle3conv); or write the fixed checkpoint elsewhere, which needs no "
                 f"journal: eagle3conv fix-keys {root} --out DIR") from None


def pending(root: Path) -> bool:
    """Whether ``root`` holds traces of an interrupted in-place write."""
    return any(os.path.lexists(root / n) for n in (JOURNAL, JOURNAL + ".tmp", STAGING, BACKUP))


def _remove_own_file(path: Path, journal: Path) -> None:
    """Remove our own leftover ``path`` (a regular file); anything else of that name is refused."""
    if not os.path.lexists(path):
        return
    if not _is_regular(path):
        raise _journal_refused(journal, f"{path.name} is not a regular file")
    path.unlink()


def recover(root: Path, *, accept_journal: bool = False) -> str | None:
    """Finish or roll back an interrupted in-place write. Returns what it did, if anything.

    The caller holds the folder's lock exclusively (see :func:`prepared`). A journal is
    checked against the folder before anything is touched (:func:`read_journal`; with
    ``accept_journal``, one whose signature cannot be checked too)."""
    root = Path(root)
    journal = root / JOURNAL
    staging = root / STAGING
    if not pending(root):
        return None
    if not os.access(root, os.W_OK):
        if os.path.lexists(journal):
            raise JournalError(
                f"{root} has an interrupted fix-keys but is read-only; it cannot be finished here",
                hint=f"make {root} writable and run `eagle3conv fix-keys {root}` to finish the interrupted "
                     "conversion")
        return None  # an unfinished staging folder only: the old checkpoint is intact; nothing to do read-only
    if os.path.lexists(journal):
        data = read_journal(root, accept_unverified=accept_journal)
        _remove_own_file(root / (JOURNAL + ".tmp"), journal)
        _roll_forward(root, data)
        return "completed an interrupted fix-keys (the new checkpoint is in place)"
    if os.path.lexists(root / BACKUP):
        raise _journal_refused(journal, f"{BACKUP} exists but the journal is missing")
    # no journal: an unfinished staging folder, before the commit point. It holds only files the
    # writer stages; anything else in it is not ours to remove.
    if staging.is_symlink():
        staging.unlink()  # never ours; removing the link loses nothing it points to
    elif os.path.lexists(staging):
        if not stat.S_ISDIR(os.lstat(staging).st_mode):
            raise _journal_refused(journal, f"{STAGING} is not a folder")
        leftover = os.listdir(staging)
        if not all(_INSTALL_RE.fullmatch(n) and _is_regular(staging / n) for n in leftover):
            raise _journal_refused(journal, f"{STAGING} holds files fix-keys never stages")
    _remove_own_file(root / (JOURNAL + ".tmp"), journal)
    if os.path.lexists(staging):
        shutil.rmtree(staging)
    return "removed an unfinished fix-keys staging folder (the old checkpoint was never touched)"


@contextmanager
def prepared(path: str | os.PathLike, command: str, *, write: bool, accept_journal: bool = False):
    """Lock a checkpoint folder for ``command`` (exclusively if ``write``, else shared) and
    finish or roll back an interrupted in-place write first (``accept_journal``: from a journal
    whose signature cannot be checked too, see :func:`read_journal`). Yields what recovery did.

    Readers wait (briefly) for a live writer and never remove what it owns: recovery
    runs only under the exclusive lock, that is when no other eagle3conv holds the folder."""
    p = Path(path)
    root = p if p.is_dir() else p.parent
    if not root.is_dir():
        yield None
        return
    with folder_lock(root, exclusive=write, command=command) as lock:
        recovered = None
        if pending(root) and (write or os.access(root, os.W_OK) or os.path.lexists(root / JOURNAL)):
            lock.upgrade()
            recovered = recover(root, accept_journal=accept_journal)
            if not write:
                lock.downgrade()
        yield recovered


def _roll_forward(root: Path, data: dict) -> None:
    """Move the replaced files to the backup folder, the new ones in, then remove the backup, the
    staging folder and the journal. Every step is idempotent. If the file system refuses a move,
    the moves made here are undone (the folder is as it was before this call) and
    :class:`JournalError` says so."""
    staging, backup = root / STAGING, root / BACKUP
    install, replace = data["install"], data["replace"]
    done: list[tuple[Path, Path]] = []
    try:
        backup.mkdir(exist_ok=True)
        for name in replace:
            cur = root / name
            if not os.path.lexists(cur):
                continue
            if name in install and not os.path.lexists(staging / name):
                continue  # already the new file
            os.replace(cur, backup / name)
            done.append((cur, backup / name))
            _step()
        for name in install:
            if os.path.lexists(staging / name):
                os.replace(staging / name, root / name)
                done.append((staging / name, root / name))
                _step()
        _fsync_dir(root)
    except OSError as e:
        for src, dst in reversed(done):
            try:
                os.replace(dst, src)
            except OSError:
                pass
        journal = root / JOURNAL
        raise JournalError(
            f"{root}: could not finish the interrupted fix-keys ({e.strerror or e}: {e.filename}); the moves "
            "made were undone",
            hint=f"fix the cause and run `eagle3conv fix-keys {root}` again (the journal {journal} says what is "
                 f"left to do: the new files are in {staging}, the old ones moved so far in {backup})") from None
    shutil.rmtree(backup)
    _step()
    shutil.rmtree(staging, ignore_errors=True)
    _step()
    (root / JOURNAL).unlink()
    _step()
    _fsync_dir(root)


def _modes(plan: Plan, files: list[str]) -> dict[str, int]:
    """The mode each new file gets: the file it replaces keeps its mode (a new weights file takes
    the old weights' mode), a brand-new file gets ``0666 & ~umask``."""
    root = plan.index.root
    old_weights = [p for p in plan.index.weight_files if p.exists()]
    out = {}
    for name in files:
        same = root / name
        if same.is_file():
            out[name] = same.stat().st_mode & 0o7777
        elif old_weights and (name.endswith(".safetensors") or name == SAFETENSORS_INDEX):
            out[name] = old_weights[0].stat().st_mode & 0o7777
        else:
            out[name] = 0o666 & ~umask()
    return out


def write_in_place(plan: Plan, **kw) -> WriteResult:
    """Write ``plan`` over its own folder through staging and a journal (see the module doc).

    The caller holds the folder's lock exclusively for the whole run (see :func:`prepared`)."""
    root = plan.index.root
    staging = root / STAGING
    if not os.access(root, os.W_OK):
        raise WriteError(f"{root}: the folder is read-only; nothing was written",
                         hint=f"write the fixed checkpoint elsewhere: eagle3conv fix-keys {root} --out DIR")
    key = _journal_key(root)  # before anything is written: a journal that cannot be signed is never written
    recover(root)
    staging.mkdir()
    try:
        result = write_checkpoint(plan, staging, copy_other=False, **kw)
        for name, mode in _modes(plan, result.files).items():
            os.chmod(staging / name, mode)
        entries = [_entry(staging / n) for n in result.files]
        replace = sorted(
            {p.name for p in plan.index.weight_files if p.name != "training_state.pt"}
            | {n for n in (SAFETENSORS_INDEX, BIN_INDEX, "config.json") if (root / n).exists()}
        )
        old = [_old_entry(root / n) for n in replace]  # the folder's identity (see "the journal" above)
        stall("before-journal")
    except BaseException:  # before the commit point: the old checkpoint stands, the staging goes
        shutil.rmtree(staging, ignore_errors=True)
        raise
    tmp = root / (JOURNAL + ".tmp")
    journal = _sign({"version": JOURNAL_VERSION, "writer": WRITER_ID, "install": entries, "replace": replace,
                     "old": old}, key)
    held: list[int] = []
    previous = None
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C from the commit point on is held until the new checkpoint is in place
        previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        _write_json(tmp, journal)
        os.replace(tmp, root / JOURNAL)  # the commit point
        _fsync_dir(root)
        committed.append(root)
        _step()
        stall("after-commit")
        _roll_forward(root, {"install": result.files, "replace": replace})
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    wrong = [e["name"] for e in entries if not _matches(root / e["name"], e)]
    if wrong:
        raise WriteError(f"{root}: after the commit, {', '.join(wrong)} in the folder differ from what was written",
                         hint="another program changed the folder meanwhile; run `eagle3conv inspect` on it")
    if held:
        raise KeyboardInterrupt
    return result
