"""Captured target states from other tools, as the same :class:`CapturedStates` view.

:func:`open_states` takes any of these inputs and tells them apart by their own marks
(:func:`detect_states`; docs/states-formats.md describes each with its upstream source):

eagle3conv ``states.safetensors``
    :class:`~eagle3conv.states.format.StatesFile` (a file, or a folder holding
    ``states.safetensors``). Everything ``verify`` needs, every layer named.

vLLM hidden-states files (``hs_{i}.safetensors``), :class:`~eagle3conv.states.vllm.VllmStates`
    What vLLM's ``extract_hidden_states`` writes and speculators' ``generate-offline-data`` keeps.

NeMo Automodel's EAGLE-3 cache (``manifest.json`` + ``shard-*.safetensors``), :class:`~eagle3conv.states.nemo.NemoStates`
    What ``precompute_eagle3`` writes.

Per-slot aux dumps (a folder), :class:`DumpStates`
    The layout of patched-server dump pipelines (like the one that found the seed
    incident): no SGLang release writes hidden-state files (0.5.23's
    ``return_hidden_states`` returns JSON), so a pipeline that dumps ``aux_<slot>.pt``
    writes this layout itself, manifest included. One tensor file per aux slot, plus
    the files that give ``verify`` tokens to score. All positions of all
    requests are concatenated along the token axis::

        aux_0.pt, aux_1.pt, ...   [tokens, T] float   required: aux slot k
        manifest.json                                  optional, see below
        input_ids.pt              [tokens] int        token x_t at position t
        target_next.pt            [tokens] int        the target's greedy next token
                                                      after x_t (argmax of its logits
                                                      at t, prefill included)
        loss_mask.pt              [tokens] 0/1        optional: 1 = score this token
        embeddings.pt             [tokens, T] float   optional: the embedding output

    ``manifest.json``::

        {"captured_at_input_of": [3, 31, 59],   # slot k was captured at the INPUT
                                                # of that layer = output of layer L-1
         "target": "moonshotai/Kimi-K2.5",      # optional
         "num_layers": 61,                      # optional: the target's N
         "vocab_size": 163840,                  # optional
         "sequence_lengths": [812, 1204, ...]}  # optional: how the tokens split into
                                                # requests (must sum to tokens);
                                                # absent = one sequence

    The layer record is read by
    :func:`eagle3conv.wiring.metadata.from_dump_manifest`. Dumps hold only the
    aux slots (and the embedding output when ``embeddings.pt`` is there), so a
    wiring search can only choose among those. Without a manifest the layers
    are unknown: ``aux(None)`` gives the slots as stored, ``aux(refs)`` refuses.
    Files are loaded weights-only and memory-mapped; sequences are cut out of
    the flat tensors only when a row range is read.

SpecForge offline features (a ``.ckpt`` / ``.ckpt.gz`` file or a folder of them, searched recursively), :class:`SpecForgeStates`
    One torch-saved dict per sequence::

        input_ids         [S] (or [1, S]) int
        loss_mask         [S] (or [1, S]) 0/1: 1 = assistant tokens
        hidden_state      [1, S, T] (or [S, T])  the final hidden state, after the
                                                 target's final norm (lm_head input)
        aux_hidden_state  [1, S, k*T] (or [S, k*T])  the aux slots, concatenated

    Other keys (``rid``, ``metadata``, ...) are ignored. The records do **not**
    say which layers the aux slots are: pass ``layers=`` (slot order) when you
    know, otherwise only ``aux(None)`` works. They hold no next-token ids either:
    SpecForge trains teacher-forced on the data tokens, so the label at t is
    ``input_ids[t+1]``, the data's token, not necessarily the target's own guess.
    ``verify`` can still score a drafter against the data tokens (a lower bound
    on acceptance when the data is not the target's own output), or compute the
    target's next tokens as ``argmax(lm_head(hidden_state))`` given the target's
    ``lm_head`` weights: ``final_hidden(rows)`` returns ``hidden_state`` for that.
    Opening reads every record once (ids and masks kept, states dropped);
    reading a row range loads those records again (``.ckpt`` files are
    memory-mapped; ``.ckpt.gz`` are decompressed each time).
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import re
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3conv.io.jsonfile import read_json_file
from eagle3conv.io.pickle import load_pickle
from eagle3conv.errors import CheckpointReadError, UnsafePickleError, UsageError, WiringError
from eagle3conv.states.format import STATES_FILE, CapturedStates, StatesFile, as_layer_refs
from eagle3conv.spec.layers import EMBEDDING, LayerRef, LayerSet, describe, validate_refs
from eagle3conv.wiring.metadata import MANIFEST_FILE, from_dump_manifest

if TYPE_CHECKING:
    from torch import Tensor

_AUX_FILE = re.compile(r"^aux_(\d+)\.pt$")
_CKPT_SUFFIXES = (".ckpt", ".ckpt.gz")


def pad_rows(pieces: list[Tensor], seq_len: int, fill: Any = 0) -> Tensor:
    """Right-pad 1-D or 2-D per-sequence pieces into ``[b, seq_len, ...]``."""
    import torch

    first = pieces[0]
    out = torch.full((len(pieces), seq_len, *first.shape[1:]), fill, dtype=first.dtype)
    for i, p in enumerate(pieces):
        out[i, : p.shape[0]] = p
    return out


def lengths_mask(lengths: Sequence[int]) -> Tensor:
    import torch

    n = torch.tensor(list(lengths))
    return torch.arange(int(n.max())).unsqueeze(0) < n.unsqueeze(1)


# --------------------------------------------------------------------------- per-slot aux dumps (patched servers)


class DumpStates(CapturedStates):
    """Per-slot aux dumps, the layout of patched-server dump pipelines (see the module docstring)."""

    source = "aux-dump"

    def __init__(self, folder: str | os.PathLike, *, layers: Sequence[LayerRef | int] | None = None):
        import torch

        self.path = root = Path(folder)
        record = from_dump_manifest(root)
        if record is None:
            raise CheckpointReadError(f"{root}: no aux_<slot>.pt files and no {MANIFEST_FILE}: not an aux dump")
        slots = sorted((int(m.group(1)), p) for p in root.iterdir()
                       if (m := _AUX_FILE.match(p.name)) and p.is_file())
        if not slots:
            raise CheckpointReadError(f"{root}: {MANIFEST_FILE} but no aux_0.pt ... files")
        manifest: dict = {}
        if (root / MANIFEST_FILE).is_file():
            manifest = read_json_file(root / MANIFEST_FILE, "dump manifest")
        self._aux = [self._tensor(p, 2, "aux") for _, p in slots]
        self._aux_paths = [p for _, p in slots]
        tokens, width = self._aux[0].shape
        for (slot, p), t in zip(slots, self._aux):
            if tuple(t.shape) != (tokens, width):
                raise CheckpointReadError(
                    f"{p}: shape {list(t.shape)}, but aux_0.pt is {[tokens, width]}: "
                    "every slot must hold the same tokens and hidden size")
            if not t.is_floating_point():
                raise CheckpointReadError(f"{p}: hidden states must be floating point, got {t.dtype}")
        if tokens < 1:
            raise CheckpointReadError(f"{slots[0][1]}: holds no tokens")
        self.hidden_size = int(width)
        self.target = record.target
        self.num_layers = self._opt_int(manifest, "num_layers")
        self.vocab_size = self._opt_int(manifest, "vocab_size")

        aux_layers: LayerSet | None = record.layers
        if layers is not None:
            declared = validate_refs(as_layer_refs(layers), self.num_layers)
            if aux_layers is not None and declared != aux_layers:
                raise WiringError(
                    f"{root}: layers given ({describe(declared)}) disagree with {MANIFEST_FILE} "
                    f"({describe(aux_layers)})")
            if len(declared) != len(slots):
                raise WiringError(f"{root}: {len(declared)} layers given for {len(slots)} aux slots")
            aux_layers = declared
        self._aux_layers = aux_layers

        def optional(name: str, ndim: int) -> Tensor | None:
            p = root / name
            if not p.is_file():
                return None
            t = self._tensor(p, ndim, name)
            want = [tokens] if ndim == 1 else [tokens, width]
            if list(t.shape) != want:
                raise CheckpointReadError(f"{p}: shape {list(t.shape)}, expected {want} like the aux slots")
            return t

        ids = optional("input_ids.pt", 1)
        nxt = optional("target_next.pt", 1)
        lm = optional("loss_mask.pt", 1)
        self._emb = optional("embeddings.pt", 2)
        for name, t in (("input_ids.pt", ids), ("target_next.pt", nxt)):
            if t is None:
                continue
            if t.is_floating_point() or t.dtype == torch.bool:
                raise CheckpointReadError(f"{root / name}: token ids must be integers, got {t.dtype}")
            if int(t.min()) < 0 or (self.vocab_size is not None and int(t.max()) >= self.vocab_size):
                raise CheckpointReadError(f"{root / name}: token ids outside 0..vocab_size-1")
        if lm is not None and not bool(((lm == 0) | (lm == 1)).all()):
            raise CheckpointReadError(f"{root / 'loss_mask.pt'}: must hold only 0 and 1")
        if self._emb is not None and not self._emb.is_floating_point():
            raise CheckpointReadError(f"{root / 'embeddings.pt'}: must be floating point, got {self._emb.dtype}")

        lengths = manifest.get("sequence_lengths")
        if lengths is None:
            lengths = [int(tokens)]
        elif (not isinstance(lengths, list) or not lengths
              or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in lengths)):
            raise CheckpointReadError(
                f"{root / MANIFEST_FILE}: field 'sequence_lengths' must be a list of positive integers")
        elif sum(lengths) != tokens:
            raise CheckpointReadError(
                f"{root / MANIFEST_FILE}: field 'sequence_lengths' sums to {sum(lengths)} "
                f"but the dumps hold {tokens} tokens")
        self._offsets = [0]
        for n in lengths:
            self._offsets.append(self._offsets[-1] + n)
        self.attention_mask = lengths_mask(lengths)
        self.input_ids = None if ids is None else self._gather(ids.long(), 0, len(lengths))
        self.target_next = None if nxt is None else self._gather(nxt.long(), 0, len(lengths))
        self._loss_mask = None if lm is None else self._gather(lm.bool(), 0, len(lengths))
        if record.layers is not None:
            self.layers_from = f"{MANIFEST_FILE} captured_at_input_of (the dump pipeline's own record)"
        if aux_layers is None:
            self.layers = None
        else:
            self.layers = aux_layers + ((EMBEDDING,) if self._emb is not None and EMBEDDING not in aux_layers else ())
        notes = []
        if aux_layers is None:
            notes.append(f"no {MANIFEST_FILE}: the layers of the aux slots are not recorded")
        if ids is None:
            notes.append("no input_ids.pt: no tokens to score, only norm statistics")
        if nxt is None:
            notes.append("no target_next.pt: the target's own next tokens are not recorded")
        self.notes = tuple(notes)

    @staticmethod
    def _opt_int(manifest: dict, key: str) -> int | None:
        v = manifest.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise CheckpointReadError(f"{MANIFEST_FILE}: field '{key}' must be a positive integer, got {v!r}")
        return v

    @staticmethod
    def _tensor(path: Path, ndim: int, what: str) -> Tensor:
        import torch

        obj = load_pickle(path)
        if not isinstance(obj, torch.Tensor):
            raise CheckpointReadError(f"{path}: expected one tensor, got {type(obj).__name__}")
        if obj.ndim == ndim + 1 and obj.shape[0] == 1:
            obj = obj[0]
        if obj.ndim != ndim:
            shape = "[tokens]" if ndim == 1 else "[tokens, T]"
            raise CheckpointReadError(f"{path}: {what} must be {shape}, got shape {list(obj.shape)}")
        return obj

    def _gather(self, flat: Tensor, start: int, stop: int, fill: Any = 0) -> Tensor:
        pieces = [flat[self._offsets[i]: self._offsets[i + 1]] for i in range(start, stop)]
        return pad_rows(pieces, self.seq_len, fill)

    def _no_layers_hint(self) -> str:
        return (f"add {MANIFEST_FILE} with {{\"captured_at_input_of\": [...]}} to the dump folder, "
                "or pass the layers you know it holds")

    def _aux_rows(self, refs: LayerSet, start: int, stop: int) -> Tensor:
        import torch

        parts = []
        for r in refs:
            if self._aux_layers is not None and r in self._aux_layers:
                flat = self._aux[self._aux_layers.index(r)]
            else:
                flat = self._emb
            parts.append(self._gather(flat, start, stop))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def _stored_aux_rows(self, start: int, stop: int) -> Tensor:
        import torch

        return torch.cat([self._gather(a, start, stop) for a in self._aux], dim=-1)

    def find_non_finite(self, refs) -> Path | None:
        import torch

        return next((p for p, a in zip(self._aux_paths, self._aux) if not bool(torch.isfinite(a).all())), None)

    def _embed_rows(self, start: int, stop: int) -> Tensor:
        return self._gather(self._emb, start, stop)


# --------------------------------------------------------------------------- SpecForge records


def _load_gz(path: Path) -> Any:
    """A gzipped torch file, loaded weights-only from memory (as load_pickle, which
    needs a path to memory-map)."""
    import pickle

    import torch

    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as e:
        raise CheckpointReadError(f"{path}: not a readable gzip file ({type(e).__name__}: {e})") from None
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()
        raise UnsafePickleError(
            f"{path}: refused to unpickle: it asks for more than tensors ({(first[0] if first else '')[:200]}). "
            "eagle3conv loads pickles weights-only, so nothing in it was run.") from None
    except (EOFError, OSError, ValueError, RuntimeError, KeyError, IndexError, TypeError, AttributeError) as e:
        raise CheckpointReadError(f"{path}: not a readable torch file ({type(e).__name__}: {e})") from None


def _is_ckpt(p: Path) -> bool:
    return p.name.endswith(_CKPT_SUFFIXES)


def _natural_key(p: Path) -> list:
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", str(p))]


class SpecForgeStates(CapturedStates):
    """SpecForge offline feature records (see the module docstring)."""

    source = "specforge"

    def __init__(self, path: str | os.PathLike, *, layers: Sequence[LayerRef | int] | None = None,
                 num_layers: int | None = None, vocab_size: int | None = None, target: str | None = None):
        self.path = root = Path(path)
        if root.is_dir():
            files = sorted((p for p in root.rglob("*") if p.is_file() and _is_ckpt(p)), key=_natural_key)
            if not files:
                raise CheckpointReadError(f"{root}: no .ckpt or .ckpt.gz SpecForge records in this folder")
        elif root.is_file():
            if not _is_ckpt(root):
                raise CheckpointReadError(f"{root}: a SpecForge record ends in .ckpt or .ckpt.gz")
            files = [root]
        else:
            raise CheckpointReadError(f"{root}: no such file or folder")
        self._files = files
        self.num_layers = num_layers
        self.vocab_size = vocab_size
        self.target = target
        ids, masks, lengths = [], [], []
        self.hidden_size = self._aux_width = None
        self._dtype = None
        for p in files:
            rec = self._load(p)
            ids.append(rec["input_ids"])
            masks.append(rec["loss_mask"])
            lengths.append(int(rec["input_ids"].shape[0]))
        self._k = self._aux_width // self.hidden_size
        declared = None
        if layers is not None:
            declared = validate_refs(as_layer_refs(layers), num_layers)
            if len(declared) != self._k:
                raise WiringError(
                    f"{root}: the records hold {self._k} aux slots ({self._aux_width} = {self._k} x "
                    f"{self.hidden_size}) but {len(declared)} layers were given ({describe(declared)})")
        self.layers = declared
        self.final_state = ("post-norm", None)  # hidden_state: SGLang's last hidden state, after the final norm
        self.attention_mask = lengths_mask(lengths)
        self.input_ids = pad_rows(ids, self.seq_len)
        self._loss_mask = pad_rows(masks, self.seq_len, False)
        self.target_next = None
        self.notes = (
            "SpecForge records hold no next-token ids: SpecForge trains on the data tokens "
            "(label at t = input_ids[t+1]); the target's own next tokens need its lm_head "
            "over hidden_state (final_hidden)",
        ) + (() if declared is not None else
             ("SpecForge records do not say which layers the aux slots are; pass layers to name them",))

    def _load(self, p: Path) -> dict:
        import torch

        obj = _load_gz(p) if p.name.endswith(".gz") else load_pickle(p)
        if not isinstance(obj, dict):
            raise CheckpointReadError(f"{p}: a SpecForge record is a dict, got {type(obj).__name__}")
        missing = [k for k in ("input_ids", "loss_mask", "hidden_state", "aux_hidden_state")
                   if not isinstance(obj.get(k), torch.Tensor)]
        if missing:
            raise CheckpointReadError(
                f"{p}: not a SpecForge record: missing tensor{'s' if len(missing) > 1 else ''} "
                f"{', '.join(missing)}")
        out = {}
        for key, ndim in (("input_ids", 1), ("loss_mask", 1), ("hidden_state", 2), ("aux_hidden_state", 2)):
            t = obj[key]
            while t.ndim > ndim and t.shape[0] == 1:
                t = t[0]
            if t.ndim != ndim:
                want = "[S]" if ndim == 1 else "[1, S, width]"
                raise CheckpointReadError(f"{p}: field '{key}' must be {want}, got shape {list(obj[key].shape)}")
            out[key] = t
        s = out["input_ids"].shape[0]
        if s < 1:
            raise CheckpointReadError(f"{p}: field 'input_ids' holds no tokens")
        ids = out["input_ids"]
        if ids.is_floating_point() or ids.dtype == torch.bool or int(ids.min()) < 0:
            raise CheckpointReadError(f"{p}: field 'input_ids' must hold token ids (integers >= 0)")
        if self.vocab_size is not None and int(ids.max()) >= self.vocab_size:
            raise CheckpointReadError(f"{p}: field 'input_ids' holds ids >= vocab_size {self.vocab_size}")
        out["input_ids"] = ids.long()
        lm = out["loss_mask"]
        if lm.shape[0] != s:
            raise CheckpointReadError(f"{p}: field 'loss_mask' has {lm.shape[0]} positions, input_ids {s}")
        if not bool(((lm == 0) | (lm == 1)).all()):
            raise CheckpointReadError(f"{p}: field 'loss_mask' must hold only 0 and 1")
        out["loss_mask"] = lm.bool()
        out["saved"] = [v for v in obj.values() if isinstance(v, torch.Tensor)]  # as loaded: the file's storages
        h, a = out["hidden_state"], out["aux_hidden_state"]
        for key, t in (("hidden_state", h), ("aux_hidden_state", a)):
            if t.shape[0] != s:
                raise CheckpointReadError(f"{p}: field '{key}' has {t.shape[0]} positions, input_ids {s}")
            if not t.is_floating_point():
                raise CheckpointReadError(f"{p}: field '{key}' must be floating point, got {t.dtype}")
        if self.hidden_size is None:
            if a.shape[1] % h.shape[1]:
                raise CheckpointReadError(
                    f"{p}: field 'aux_hidden_state' is {a.shape[1]} wide, not a multiple of "
                    f"hidden_state's {h.shape[1]}")
            self.hidden_size, self._aux_width = int(h.shape[1]), int(a.shape[1])
            self._dtype = a.dtype  # the first record's: pad_rows casts the others' to it
        elif (h.shape[1], a.shape[1]) != (self.hidden_size, self._aux_width):
            raise CheckpointReadError(
                f"{p}: widths hidden_state {h.shape[1]}, aux_hidden_state {a.shape[1]} differ from "
                f"{self._files[0].name}'s {self.hidden_size}, {self._aux_width}")
        return out

    @property
    def num_aux(self) -> int:
        """k: the number of aux slots each record holds."""
        return self._k

    def _no_layers_hint(self) -> str:
        return "pass the layers the features were captured at (SpecForge numbers them output-of-layer)"

    def _records(self, start: int, stop: int) -> list[dict]:
        return [self._load(p) for p in self._files[start:stop]]

    def _stored_aux_rows(self, start: int, stop: int) -> Tensor:
        return pad_rows([r["aux_hidden_state"] for r in self._records(start, stop)], self.seq_len)

    def _aux_rows(self, refs: LayerSet, start: int, stop: int) -> Tensor:
        import torch

        stored = self._stored_aux_rows(start, stop)
        if tuple(refs) == tuple(self.layers):
            return stored  # the slots as stored: no second copy
        t = self.hidden_size
        parts = [stored[..., self.layers.index(r) * t: (self.layers.index(r) + 1) * t] for r in refs]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def row_reader(self, refs: LayerSet | None, with_embeddings: bool = False) -> SpecForgeRows | None:
        """What copies record ``i``'s aux slots ``refs`` (None: as stored) straight from its memory
        map into the caller's buffers (:class:`SpecForgeRows`); None for the embedding output, which
        the records do not hold."""
        if with_embeddings:
            return None
        cols = None if refs is None or tuple(refs) == tuple(self.layers or ()) else [self.layers.index(r) for r in refs]
        return SpecForgeRows(self, cols, self._dtype)  # the first record's dtype, noted when opening

    def find_non_finite(self, refs) -> Path | None:
        import torch

        for p in self._files:
            rec = self._load(p)
            if not (bool(torch.isfinite(rec["aux_hidden_state"]).all()) and bool(torch.isfinite(rec["hidden_state"]).all())):
                return p
        return None

    def final_hidden(self, rows: slice | None = None) -> Tensor:
        """``hidden_state`` ``[b, S, T]``: the target's final (post-norm) hidden state."""
        start, stop = self._rows(rows)
        return pad_rows([r["hidden_state"] for r in self._records(start, stop)], self.seq_len)


def file_offset_of(path: Path, tensors: list, t: Tensor) -> int | None:
    """Where the bytes of ``t`` (a tensor of a record torch.load memory-mapped) lie in ``path``, or
    None when that cannot be proven. torch maps the whole file and slices each storage out of it at
    its zip member's data offset, so the storages' addresses differ exactly as the members' offsets
    do: when the record's distinct storages match the zip's ``data/N`` members one to one (sizes, and
    every difference of address equal to the difference of offset), the map's base is known."""
    import struct
    import zipfile

    if not t.is_contiguous() or t.device.type != "cpu":
        return None
    storages = sorted({(x.untyped_storage().data_ptr(), x.untyped_storage().nbytes()) for x in tensors})
    try:
        with zipfile.ZipFile(path) as z, open(path, "rb") as f:
            members = []
            for info in z.infolist():
                if re.search(r"(^|/)data/\d+$", info.filename):
                    f.seek(info.header_offset)
                    head = f.read(30)
                    if len(head) < 30 or head[:4] != b"PK\x03\x04":
                        return None
                    name_len, extra_len = struct.unpack("<HH", head[26:30])
                    members.append((info.header_offset + 30 + name_len + extra_len, info.file_size))
    except (OSError, zipfile.BadZipFile, ValueError):
        return None
    members.sort()
    if not storages or len(storages) != len(members) or any(p == 0 for p, _ in storages):
        return None
    base = storages[0][0] - members[0][0]
    if any(p - base != off or n != size for (p, n), (off, size) in zip(storages, members)):
        return None
    start = t.data_ptr() - base
    return start if members[0][0] <= start and start + t.numel() * t.element_size() <= members[-1][0] + members[-1][1] else None


class SpecForgeRows:
    """Copies one record's aux slots into the consumer's ``[S, k*T]`` buffer: the record is loaded
    as verify always loads it (weights-only, memory-mapped, checked), and its ``aux_hidden_state``
    copied from the map in one pass (the slots ``cols``, in that order, or all as stored), with no
    padded batch or second copy in between. The bytes are those :meth:`SpecForgeStates.aux` gives."""

    def __init__(self, states: SpecForgeStates, cols: list[int] | None, dtype: Any):
        self.states, self.cols, self.dtype = states, cols, dtype
        self.hidden, self.seq_len = states.hidden_size, states.seq_len
        self.width = self.hidden * (states.num_aux if cols is None else len(cols))

    def fill(self, i: int, aux: Tensor, emb: Tensor | None = None) -> None:
        """Record ``i``'s slots into ``aux`` ``[S', width]``, zero past its end (``emb`` is unused)."""
        import torch

        from eagle3conv.io.pread import pread_into

        path = self.states._files[i]
        rec = self.states._load(path)
        a = rec["aux_hidden_state"]
        s, t = a.shape[0], self.hidden
        off = file_offset_of(path, rec["saved"], a) if self.cols is None and a.dtype == aux.dtype else None
        if off is not None:  # the slots as stored, one contiguous range of the file: read, not faulted in
            fd = os.open(path, os.O_RDONLY)
            try:
                pread_into(fd, aux[:s].view(-1).view(torch.uint8).numpy(), off, path)
            finally:
                os.close(fd)
        elif self.cols is None:
            aux[:s] = a
        else:
            for j, c in enumerate(self.cols):
                aux[:s, j * t:(j + 1) * t] = a[:, c * t:(c + 1) * t]
        aux[s:] = 0


# --------------------------------------------------------------------------- detection


def _folder_kinds(p: Path) -> dict[str, list[str]]:
    """The formats whose own marks a folder's top level carries, each with the files that mark it."""
    from eagle3conv.states.nemo import SHARD_FILE, is_nemo_manifest
    from eagle3conv.states.vllm import HS_FILE

    names = sorted(q.name for q in p.iterdir())
    kinds: dict[str, list[str]] = {}

    def mark(kind: str, found: list[str]) -> None:
        if found:
            kinds.setdefault(kind, []).extend(found)

    mark("vllm", [n for n in names if HS_FILE.match(n)][:2])
    mark("aux-dump", [n for n in names if _AUX_FILE.match(n)][:2])
    mark("specforge", [n for n in names if n.endswith(_CKPT_SUFFIXES)][:2])
    mark("eagle3conv", [n for n in names if n == STATES_FILE])
    if MANIFEST_FILE in names and any(SHARD_FILE.match(n) for n in names):
        mark("nemo", [MANIFEST_FILE] + [n for n in names if SHARD_FILE.match(n)][:1])  # the reader checks the rest
    elif MANIFEST_FILE in names:
        try:
            manifest = read_json_file(p / MANIFEST_FILE, "manifest.json")
        except CheckpointReadError:
            manifest = None
        if is_nemo_manifest(manifest):
            mark("nemo", [MANIFEST_FILE] + [n for n in names if SHARD_FILE.match(n)][:1])
        else:
            mark("aux-dump", [MANIFEST_FILE])
    elif any(SHARD_FILE.match(n) for n in names):
        mark("nemo", [n for n in names if SHARD_FILE.match(n)][:1])
    return kinds


_KIND_WORDS = {"vllm": "vLLM hidden-states files", "nemo": "a NeMo Automodel EAGLE-3 cache",
               "aux-dump": "per-slot aux dumps", "specforge": "SpecForge records", "eagle3conv": "an eagle3conv states file"}


def detect_states(path: str | os.PathLike) -> str:
    """Which kind of captured states ``path`` is: ``"eagle3conv"``, ``"vllm"``, ``"nemo"``,
    ``"specforge"`` or ``"aux-dump"``, by each format's own marks. Raises
    :class:`CheckpointReadError` when it is none of them, or a folder mixes several."""
    p = Path(path)
    if p.is_file():
        if p.name.endswith(".safetensors"):
            from eagle3conv.states.nemo import SHARD_FILE
            from eagle3conv.states.vllm import is_vllm_file

            if SHARD_FILE.match(p.name) and (p.parent / MANIFEST_FILE).is_file():
                raise CheckpointReadError(f"{p}: one shard of a NeMo Automodel cache",
                                          hint=f"pass the cache folder: --states {p.parent}")
            return "vllm" if is_vllm_file(p) else "eagle3conv"
        if _is_ckpt(p):
            return "specforge"
        raise CheckpointReadError(
            f"{p}: not captured states: expected a states .safetensors file, a vLLM hs_<i>.safetensors file, "
            "a SpecForge .ckpt/.ckpt.gz record, or a folder of them")
    if p.is_dir():
        kinds = _folder_kinds(p)
        if len(kinds) > 1:
            raise CheckpointReadError(
                f"{p}: this folder mixes formats: " + "; ".join(f"{_KIND_WORDS[k]} ({', '.join(v)})"
                                                              for k, v in kinds.items()),
                hint="put each tool's files in a folder of their own and pass that one")
        if kinds:
            return next(iter(kinds))
        if any(q.is_file() and _is_ckpt(q) for q in p.rglob("*")):
            return "specforge"  # SpecForge's rows_*/data_*.ckpt sub-folders
        raise CheckpointReadError(
            f"{p}: a folder with none of {STATES_FILE}, hs_<i>.safetensors (vLLM), manifest.json + "
            "shard-*.safetensors (NeMo Automodel), .ckpt/.ckpt.gz (SpecForge) or aux_0.pt (aux dumps)",
            hint="make a states file with: eagle3conv capture --target MODEL --prompts FILE --out states.safetensors")
    raise CheckpointReadError(f"{p}: no such file or folder")


def open_states(path: str | os.PathLike, *, layers: Sequence[LayerRef | int] | None = None,
                stated: Sequence[int] | None = None, num_layers: int | None = None,
                **specforge: Any) -> CapturedStates:
    """Open captured states of any supported kind (see the module docstring).

    ``layers`` (LayerRefs, slot order) names the aux slots of sources that do not record them;
    ``stated`` is the user's ``--states-layers``, in the numbering of the run that wrote the
    states (vLLM's ids for vLLM files, output-of-layer ids otherwise). A source that records its
    own layers (a states file, a NeMo cache) refuses either; vLLM files with ``capture --engine
    vllm``'s record take their ids from it and refuse stated ids that differ. ``num_layers`` (the target's N)
    checks stated ids. ``specforge`` passes ``vocab_size``/``target`` to :class:`SpecForgeStates`.
    """
    from eagle3conv.states.format import USER_STATED

    kind = detect_states(path)
    p = Path(path)
    if kind in ("eagle3conv", "nemo"):
        if layers is not None or stated is not None:
            raise UsageError(f"{p}: {'a states file' if kind == 'eagle3conv' else 'a NeMo cache'} records its own "
                             "layers; do not pass --states-layers")
        if kind == "nemo":
            from eagle3conv.states.nemo import NemoStates

            return NemoStates(p)
        return StatesFile(p / STATES_FILE if p.is_dir() else p)
    if kind == "vllm":
        from eagle3conv.states.vllm import VllmStates

        return VllmStates(p, vllm_ids=stated, layers=layers, num_layers=num_layers)
    user = stated is not None
    if user:
        layers = validate_refs(as_layer_refs(stated), num_layers)
    st = DumpStates(p, layers=layers) if kind == "aux-dump" else SpecForgeStates(p, layers=layers,
                                                                                 num_layers=num_layers, **specforge)
    if user and st.layers_from is None:
        st.layers_from = USER_STATED
    return st
