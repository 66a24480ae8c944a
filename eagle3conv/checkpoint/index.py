"""A lazy index over a checkpoint: names, dtypes, shapes and byte ranges.

Building the index reads safetensors *headers* only; tensor bytes are read
when something asks for them (`read_array`, `iter_chunks`). Pickled files
(`.bin`, `.pt`, `.pth`, SpecForge `training_state.pt`) are loaded with
``torch.load(weights_only=True, mmap=True)`` so a malicious pickle is refused
before it runs and the storages stay on disk until copied.

What is accepted (see README "Reading checkpoints"):
- a folder with `model.safetensors`, a sharded set with
  `model.safetensors.index.json`, or several `.safetensors` files;
- `pytorch_model.bin` (and `pytorch_model.bin.index.json`), `.pt`, `.pth`;
- SpecForge `training_state.pt` (weights under `draft_state_dict`);
- `state_dict` / `module` / `model` wrappers;
- a Hugging Face cache repo folder (`models--org--name`) or one of its
  snapshots (symlinked blobs).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

import numpy as np

from eagle3conv.io import dtypes
from eagle3conv.checkpoint.links import present, safe_member
from eagle3conv.errors import CheckpointReadError, UsageError
from eagle3conv.io.pickle import load_pickle
from eagle3conv.io.safetensors import TensorInfo, read_safetensors_header

SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
# wrappers trainers put around a state dict, outermost first
WRAPPER_KEYS = ("draft_state_dict", "state_dict", "model_state_dict", "module", "model")


@dataclass
class CheckpointIndex:
    root: Path  # the folder that holds the checkpoint
    layout: str  # safetensors | safetensors-sharded | pickle | pickle-sharded | training-state
    weight_files: list[Path]
    tensors: dict[str, TensorInfo]
    config: dict | None
    config_path: Path | None
    other_files: list[Path]  # non-weight files beside the weights (tokenizer, card...)
    wrapper: str | None = None  # e.g. "draft_state_dict", "module"
    extras: dict[str, Any] = field(default_factory=dict)  # training args, provenance...
    skipped: list[str] = field(default_factory=list)  # non-tensor entries in pickles
    source_metadata: dict[str, dict] = field(default_factory=dict)  # safetensors __metadata__ per file
    _pickles: dict[Path, dict] = field(default_factory=dict, repr=False)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    # --- reading tensor bytes -------------------------------------------------
    def _torch_tensor(self, info: TensorInfo):
        return self._pickles[info.file][info.name]

    def read_array(self, name: str) -> np.ndarray:
        """Read a (small) tensor as a numpy array: vocab maps, norms."""
        info = self.tensors[name]
        if info.start is None:
            t = self._torch_tensor(info)
            if info.dtype == "BF16":
                t = t.float()
            return t.detach().cpu().numpy().copy()
        np_dtype = dtypes.numpy_dtype(info.dtype)
        return np.frombuffer(self.read_bytes(name), dtype=np_dtype).reshape(info.shape).copy()

    def read_bytes(self, name: str) -> bytes:
        """A (small) tensor's raw little-endian bytes, whatever its dtype (norms compared byte for byte)."""
        info = self.tensors[name]
        if info.start is None:
            return bytes(self.raw_bytes_of_pickled(name))
        with open(info.file, "rb") as f:
            f.seek(info.start)
            data = f.read(info.end - info.start)
        if len(data) != info.end - info.start:
            raise CheckpointReadError(f"{info.file}: truncated while reading {name}")
        return data

    def read_torch(self, name: str):
        """Read one tensor as a torch tensor (used by verify and casts)."""
        import torch

        info = self.tensors[name]
        if info.start is None:
            return self._torch_tensor(info)
        with open(info.file, "rb") as f:
            f.seek(info.start)
            buf = bytearray(info.end - info.start)
            if f.readinto(buf) != len(buf):
                raise CheckpointReadError(f"{info.file}: truncated while reading {name}")
        if not buf:
            return torch.empty(info.shape, dtype=dtypes.torch_dtype(info.dtype))
        return torch.frombuffer(buf, dtype=dtypes.torch_dtype(info.dtype)).reshape(info.shape)

    def raw_bytes_of_pickled(self, name: str) -> memoryview:
        """The raw little-endian bytes of a pickled tensor (no copy when contiguous)."""
        import torch

        t = self._torch_tensor(self.tensors[name]).detach().contiguous()
        if t.numel() == 0:
            return memoryview(b"")
        return memoryview(t.reshape(-1).view(torch.uint8).numpy())


# --- pickles -------------------------------------------------------------------

def _unwrap(obj: Any, path: Path) -> tuple[dict, str | None, dict]:
    """Find the state dict inside a pickled object. Returns (state, wrapper, extras)."""
    import torch

    extras: dict[str, Any] = {}
    wrapper = None
    if not isinstance(obj, dict):
        raise CheckpointReadError(f"{path}: holds a {type(obj).__name__}, not a state dict")
    for key in WRAPPER_KEYS:
        inner = obj.get(key)
        if isinstance(inner, dict) and inner and any(isinstance(v, torch.Tensor) for v in inner.values()):
            wrapper = key
            for k, v in obj.items():
                if k != key and not isinstance(v, torch.Tensor) and k not in ("optimizer", "optimizer_state_dict", "scheduler"):
                    extras[k] = v
            obj = inner
            break
    return obj, wrapper, extras


def _index_pickle(path: Path, index_names: set[str] | None = None):
    import torch

    obj = load_pickle(path)
    state, wrapper, extras = _unwrap(obj, path)
    tensors: dict[str, TensorInfo] = {}
    keep: dict[str, Any] = {}
    skipped = []
    for name, value in state.items():
        if not isinstance(name, str):
            skipped.append(repr(name))
            continue
        if isinstance(value, torch.Tensor):
            try:
                dt = dtypes.from_torch(value.dtype)
            except TypeError:
                raise CheckpointReadError(f"{path}: tensor {name!r} has unsupported dtype {value.dtype}") from None
            tensors[name] = TensorInfo(name, dt, tuple(value.shape), path)
            keep[name] = value
        else:
            skipped.append(name)
    if not tensors:
        raise CheckpointReadError(f"{path}: no tensors found (top-level keys: {sorted(map(str, obj))[:10]})")
    return tensors, keep, wrapper, extras, skipped


# --- locating the checkpoint -----------------------------------------------------

def _resolve_hf_cache(path: Path) -> Path:
    """`models--org--name` → its snapshot for refs/main (or the only snapshot)."""
    snaps = path / "snapshots"
    if not (path.name.startswith(("models--", "datasets--")) and snaps.is_dir()):
        return path
    ref = path / "refs" / "main"
    if ref.is_file():
        try:  # a commit hash, read without waiting (a FIFO swapped in gives nothing) and bounded
            with os.fdopen(os.open(ref, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
                commit = f.read(128).decode("ascii", "replace").strip()
        except OSError:
            commit = ""
        cand = snaps / commit
        if re.fullmatch(r"[0-9a-fA-F]{7,64}", commit) and cand.is_dir():
            return cand
    choices = sorted(p for p in snaps.iterdir() if p.is_dir())
    if len(choices) == 1:
        return choices[0]
    raise UsageError(
        f"{path}: a Hugging Face cache folder with {len(choices)} snapshots and no refs/main",
        hint="pass one of: " + ", ".join(str(c) for c in choices[:5]),
    )


def _safe_member(root: Path, name: str, index_file: Path) -> Path:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or not name or "\\" in name:
        raise CheckpointReadError(
            f"{index_file}: refuses shard name {name!r}: it points outside the checkpoint folder"
        )
    return root / p


def _read_json(path: Path) -> dict:
    from eagle3conv.io.jsonfile import read_json_file

    return read_json_file(path)


WEIGHT_SUFFIXES = (".safetensors",) + PICKLE_SUFFIXES + (".ckpt", ".distcp")
COMPANION = re.compile(
    r"^(tokenizer.*|special_tokens_map\.json|generation_config\.json|chat_template.*|vocab\..*|merges\.txt"
    r"|added_tokens\.json|README\.md|training_metadata\.json|eagle3conv_.*\.json)$"
)
NEVER_COPY = {"config.json", SAFETENSORS_INDEX, BIN_INDEX, "training_state.pt", "latest", "zero_to_fp32.py"}


def _find_weights(root: Path) -> tuple[str, list[Path], Path | None]:
    """Decide which files hold the weights. Returns (layout, files, index_json)."""
    if present(root / SAFETENSORS_INDEX):
        return "safetensors-sharded", [], root / SAFETENSORS_INDEX
    st = sorted(p for p in root.glob("*.safetensors") if present(p))
    if st:
        return ("safetensors" if len(st) == 1 else "safetensors-multi"), st, None
    if present(root / BIN_INDEX):
        return "pickle-sharded", [], root / BIN_INDEX
    for name in ("pytorch_model.bin", "model.pt", "model.pth"):
        if present(root / name):
            return "pickle", [root / name], None
    pickles = sorted(p for p in root.iterdir() if p.is_file() and p.suffix in PICKLE_SUFFIXES and p.name != "training_state.pt")
    if len(pickles) == 1:
        return "pickle", pickles, None
    if (root / "training_state.pt").is_file():
        return "training-state", [root / "training_state.pt"], None
    if pickles:
        raise UsageError(
            f"{root}: holds several pickled files and no index: {', '.join(p.name for p in pickles)}",
            hint="pass the one that holds the drafter's weights",
        )
    states = sorted(p.name for p in root.iterdir() if p.is_dir() and any(
        (p / n).is_file() for n in ("pytorch_model.bin", "model.safetensors", SAFETENSORS_INDEX, "training_state.pt")))
    if states:
        raise UsageError(
            f"{root}: holds {len(states)} training checkpoints ({', '.join(states[:6])}) and no weights of its own",
            hint=f"pass one of them, e.g. {root / states[-1]}",
        )
    if any(p.suffix == ".distcp" for p in root.iterdir()):
        raise CheckpointReadError(
            f"{root}: a torch.distributed (DCP/FSDP) checkpoint; its .metadata is an unrestricted pickle that eagle3conv will not load",
            hint="consolidate it first (torch.distributed.checkpoint.format_utils.dcp_to_torch_save) where you trust it",
        )
    raise CheckpointReadError(
        f"{root}: no weights found (looked for *.safetensors, {SAFETENSORS_INDEX}, pytorch_model.bin, *.pt, *.pth, training_state.pt)"
    )


def open_checkpoint(path: str | os.PathLike) -> CheckpointIndex:
    """Index a checkpoint folder or file. Reads headers and configs only.

    Every file it reads (weights, index, config.json, training_metadata.json) must pass
    :func:`eagle3conv.checkpoint.links.safe_member`: a link leaving the folder is refused
    unless the caller runs inside ``links.following()``.
    """
    path = Path(path)
    if path.is_symlink() and not path.exists():
        safe_member(path.parent, path)  # a dangling link: says so
    if not path.exists():
        raise CheckpointReadError(f"{path}: no such file or folder")
    if not path.is_file() and not path.is_dir():
        from eagle3conv.io.jsonfile import regular_file_size

        regular_file_size(path, "checkpoint file or folder")  # names what it is instead
    single: Path | None = None
    if path.is_file():
        if path.name in (SAFETENSORS_INDEX, BIN_INDEX):
            root = path.parent
        else:
            root, single = path.parent, path
    else:
        root = _resolve_hf_cache(path)

    index_json = None
    if single is not None:
        if single.suffix == ".safetensors":
            layout, files = "safetensors", [single]
        elif single.suffix in PICKLE_SUFFIXES:
            layout, files = ("training-state" if single.name == "training_state.pt" else "pickle"), [single]
        else:
            raise UsageError(f"{single}: not a checkpoint file (expected .safetensors, .bin, .pt or .pth)")
    else:
        layout, files, index_json = _find_weights(root)
    for fpath in files + ([index_json] if index_json is not None else []):
        safe_member(root, fpath)

    tensors: dict[str, TensorInfo] = {}
    pickles: dict[Path, dict] = {}
    wrapper = None
    extras: dict[str, Any] = {}
    skipped: list[str] = []
    source_metadata: dict[str, dict] = {}

    def add(found: dict[str, TensorInfo], where: Path):
        dup = sorted(set(found) & set(tensors))
        if dup:
            raise CheckpointReadError(
                f"{where}: tensors also present in another file: {', '.join(dup[:10])}"
                + (f" (+{len(dup) - 10} more)" if len(dup) > 10 else "")
            )
        tensors.update(found)

    if index_json is not None:
        data = _read_json(index_json)
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointReadError(f"{index_json}: has no weight_map")
        by_file: dict[str, set[str]] = {}
        for name, fname in weight_map.items():
            if not isinstance(fname, str):
                raise CheckpointReadError(f"{index_json}: weight_map[{name!r}] is not a file name")
            _safe_member(root, fname, index_json)
            by_file.setdefault(fname, set()).add(name)
        for fname in sorted(by_file):
            fpath = _safe_member(root, fname, index_json)
            if not present(fpath):
                raise CheckpointReadError(f"{index_json}: lists shard {fname}, which does not exist in {root}")
            safe_member(root, fpath)
            files.append(fpath)
            if layout == "safetensors-sharded":
                found, meta = read_safetensors_header(fpath)
                source_metadata[fname] = meta
            else:
                found, keep, w, ex, sk = _index_pickle(fpath)
                pickles[fpath] = keep
                wrapper = wrapper or w
                extras.update(ex)
                skipped += sk
            missing = sorted(by_file[fname] - set(found))
            extra = sorted(set(found) - by_file[fname])
            if missing or extra:
                details = [f"listed for {fname} but not in it: {n}" for n in missing[:20]]
                details += [f"in {fname} but the index does not list it there: {n}" for n in extra[:20]]
                raise CheckpointReadError(
                    f"{index_json}: weight_map disagrees with what {fname} holds "
                    f"({len(missing)} listed but absent, {len(extra)} present but unlisted)",
                    details=details,
                    hint="the index and the shards come from different saves; re-download or re-export",
                )
            add(found, fpath)
        layout = "safetensors-sharded" if layout == "safetensors-sharded" else "pickle-sharded"
    else:
        for fpath in files:
            if fpath.suffix == ".safetensors":
                found, meta = read_safetensors_header(fpath)
                source_metadata[fpath.name] = meta
            else:
                found, keep, w, ex, sk = _index_pickle(fpath)
                pickles[fpath] = keep
                wrapper = wrapper or w
                extras.update(ex)
                skipped += sk
            add(found, fpath)
    if layout == "training-state" and wrapper != "draft_state_dict":
        # a training_state.pt without draft weights is optimizer state only
        if not tensors:
            raise CheckpointReadError(f"{files[0]}: a training state with no draft_state_dict")

    config_path = root / "config.json"
    for known in (config_path, root / "training_metadata.json"):
        if present(known):
            safe_member(root, known)
    if config_path.is_file():
        from eagle3conv.io.jsonfile import read_json_file

        config = read_json_file(config_path, "config.json", allow_nonfinite=True)  # NaN: named by the validator
    else:
        config = None
    if config is None:
        config_path = None

    weight_names = {f.name for f in files}
    other = []
    if root.is_dir():
        for p in sorted(root.iterdir()):
            # links are kept whatever they point to: the writer refuses the unsafe ones by name
            if p.name.startswith(".") or not present(p) or p.name in weight_names or p.name in NEVER_COPY:
                continue
            if p.suffix in WEIGHT_SUFFIXES or p.name.endswith(".index.json"):
                continue
            if single is not None and not COMPANION.match(p.name):
                continue  # a file was named: take only its known companions, not the whole folder
            other.append(p)

    return CheckpointIndex(
        root=root,
        layout=layout,
        weight_files=files,
        tensors=tensors,
        config=config,
        config_path=config_path,
        other_files=other,
        wrapper=wrapper,
        extras=extras,
        skipped=skipped,
        source_metadata=source_metadata,
        _pickles=pickles,
    )


def iter_chunks(index: CheckpointIndex, name: str, chunk: int = 64 << 20) -> Iterator[memoryview]:
    """The raw bytes of one tensor, in bounded chunks."""
    info = index.tensors[name]
    if info.start is None:
        mv = index.raw_bytes_of_pickled(name)
        for s in range(0, len(mv), chunk):
            yield mv[s : s + chunk]
        return
    buf = bytearray(min(chunk, max(info.nbytes, 1)))
    with open(info.file, "rb", buffering=0) as f:
        pos = info.start
        while pos < info.end:
            n = os.preadv(f.fileno(), [memoryview(buf)[: min(len(buf), info.end - pos)]], pos)
            if n <= 0:
                raise CheckpointReadError(f"{info.file}: truncated while reading {name}")
            yield memoryview(buf)[:n]
            pos += n
