"""vLLM's hidden-states files, as speculators' data generation keeps them: :class:`VllmStates`.

What vLLM 0.33.0 writes (its ``extract_hidden_states`` speculative method with
``ExampleHiddenStatesConnector``; docs/states-formats.md has the sources, file:line): one
safetensors file per request, no metadata, two tensors::

    hidden_states  [S, n, T]  float  the n hidden states vLLM was asked for, stacked in
                                     layer order (whatever order the ids were given in)
    token_ids      [S]        int64  the request's tokens (the prompt; with
                                     include_output_tokens, prompt + output minus the last)

speculators 0.9.0's ``generate-offline-data`` moves each to ``hs_{i}.safetensors``, ``i`` the row
of its preprocessed dataset, by default into ``{preprocessed_data}/hidden_states``. That dataset
(``datasets``' ``save_to_disk`` folder: ``*.arrow``, ``dataset_info.json``, ``state.json``) holds
``input_ids`` and ``loss_mask`` per row; speculators trains on the file's states with the
dataset row's ``loss_mask`` and refuses a file whose ``token_ids`` differ from the row's
``input_ids``. This reader does the same: the folder's parent is read as that dataset when it is
one (pyarrow, which ``datasets`` depends on), else every token is scored and the report says so.

The files record **no layer ids**. The ids are vLLM's (the aux layer ids vLLM was launched with): id ``i`` is the output of decoder layer ``i-1`` (0 the embedding output, N the
last layer's output before the final norm), so ``vllm_ids`` are read in that numbering, sorted
(vLLM stacks in layer order). Without them the slots are unnamed (``layers`` None). When the
last id is N, the last slot is the target's final hidden state before its norm:
``final_state`` says so, and verify computes the target's own next tokens from it given the
target's final norm and lm_head.

With ``eagle3conv-capture.json`` beside the files (``capture --engine vllm``'s record, read by
:func:`~eagle3conv.states.vllm_capture.read_capture_record`), the ids, the target, each
sequence's loss mask (its response), category and, where vLLM generated every response, the
target's own next tokens come from it; a ``--states-layers`` that disagrees is refused.

Opening reads every file's header and its ``token_ids`` (small); states are read only for the
sequences asked for, one file at a time (memory constant in the number of files).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3conv.errors import CheckpointReadError, UsageError, WiringError
from eagle3conv.io.safetensors import read_safetensors_header
from eagle3conv.spec.layers import LayerRef, LayerSet, describe
from eagle3conv.states.format import USER_STATED, CapturedStates, as_layer_refs, known_categories

if TYPE_CHECKING:
    from torch import Tensor

    from eagle3conv.io.safetensors import TensorInfo
    from eagle3conv.states.vllm_capture import CaptureRecord

HS_FILE = re.compile(r"^hs_(\d+)\.safetensors$")
VLLM_KEYS = frozenset({"hidden_states", "token_ids"})
_FLOATS = ("BF16", "F16", "F32")
_INTS = ("I64", "I32")


def is_vllm_file(path: Path) -> bool:
    """A safetensors file holding exactly vLLM's two tensors (its header only is read)."""
    try:
        header, _ = read_safetensors_header(path)
    except CheckpointReadError:
        return False
    return set(header) == VLLM_KEYS


def hs_files(folder: Path) -> list[tuple[int, Path]]:
    """``(i, path)`` of every ``hs_{i}.safetensors`` in ``folder``, by ``i``."""
    return sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := HS_FILE.match(p.name)) and p.is_file())


def _dataset_folder(folder: Path) -> Path | None:
    """speculators' preprocessed dataset beside the hidden states: the parent of a folder named
    ``hidden_states`` (generate-offline-data's default output) when it is a saved dataset."""
    parent = folder.parent
    if folder.name == "hidden_states" and (parent / "state.json").is_file() and any(parent.glob("*.arrow")):
        return parent
    return None


def read_dataset_columns(folder: Path, rows: Sequence[int]) -> dict[int, tuple[list, list]]:
    """``input_ids`` and ``loss_mask`` of ``rows`` of a ``datasets`` save_to_disk folder (its
    ``state.json`` lists the Arrow stream files in order)."""
    from eagle3conv.io.jsonfile import read_json_file

    try:
        import pyarrow as pa
    except ImportError:
        raise CheckpointReadError(
            f"{folder}: speculators' preprocessed dataset is beside the hidden states, but pyarrow is not "
            "installed to read its loss_mask", hint="pip install pyarrow (datasets installs it)") from None
    state = read_json_file(folder / "state.json", "dataset state.json")
    files = [folder / f["filename"] for f in state.get("_data_files") or [] if isinstance(f, dict)
             and isinstance(f.get("filename"), str)]
    if not files:
        raise CheckpointReadError(f"{folder / 'state.json'}: lists no data files ('_data_files')")
    want = set(rows)
    out: dict[int, tuple[list, list]] = {}
    base = 0
    for f in files:
        try:
            with pa.memory_map(str(f)) as src:
                table = pa.ipc.open_stream(src).read_all()
        except (OSError, pa.ArrowInvalid) as e:
            raise CheckpointReadError(f"{f}: not a readable Arrow file of the dataset ({e})") from None
        missing = [c for c in ("input_ids", "loss_mask") if c not in table.column_names]
        if missing:
            raise CheckpointReadError(f"{f}: the dataset has no column {', '.join(missing)}")
        n = table.num_rows
        local = sorted(i - base for i in want if base <= i < base + n)
        if local:
            ids, lm = table.column("input_ids"), table.column("loss_mask")
            for i in local:
                out[base + i] = (ids[i].as_py(), lm[i].as_py())
        base += n
    absent = sorted(want - set(out))
    if absent:
        raise CheckpointReadError(
            f"{folder}: the dataset has {base} rows, but hs_{absent[0]}.safetensors names row {absent[0]}: "
            "these hidden states were generated from another dataset")
    return out


class VllmStates(CapturedStates):
    """A folder of vLLM hidden-states files (``hs_{i}.safetensors``, see the module docstring)."""

    source = "vllm"

    def __init__(self, path: str | os.PathLike, *, vllm_ids: Sequence[int] | None = None,
                 layers: Sequence[LayerRef | int] | None = None, num_layers: int | None = None,
                 dataset: str | os.PathLike | None = None):
        import torch

        self.path = root = Path(path)
        if root.is_file():
            files = [(0, root)]
        else:
            files = hs_files(root)
            if not files:
                raise CheckpointReadError(f"{root}: no hs_<i>.safetensors files (vLLM hidden states) in this folder")
        self._files = [p for _, p in files]
        self.num_layers, self.vocab_size, self.target = num_layers, None, None
        lengths, ids, shape, spans, toks = [], [], None, [], []
        for _, p in files:
            hs, tok_info = self._check_header(p, shape)
            shape = shape or hs.shape[1:]
            lengths.append(hs.shape[0])
            spans.append((hs.start, hs.dtype))
            toks.append(tok_info)
        self._n, self.hidden_size = shape
        # each file's hidden_states (first byte, dtype) from the header just checked; None when the
        # files' dtypes differ (then rows are read through safetensors and cast to the first's)
        self._spans = spans if len({d for _, d in spans}) == 1 else None
        self.dtype = None
        for p, info in zip(self._files, toks):
            tok = self._read_ids(info)
            if tok.numel() and int(tok.min()) < 0:
                raise CheckpointReadError(f"{p}: token_ids holds negative ids")
            ids.append(tok.long())
        record = self._record(root, files, lengths)
        if record is not None and dataset is not None:
            raise UsageError(f"{root}: eagle3conv's capture record ({record.path.name}) gives the loss mask; "
                             "do not name a dataset as well")
        ds = Path(dataset) if dataset is not None else (
            None if root.is_file() or record is not None else _dataset_folder(root))
        masks = None
        if ds is not None:
            cols = read_dataset_columns(ds, [i for i, _ in files])
            masks = []
            for (i, p), tok in zip(files, ids):
                want, lm = cols[i]
                if tok.tolist() != list(want):
                    raise CheckpointReadError(
                        f"{p}: token_ids differ from row {i}'s input_ids in the dataset {ds} "
                        "(speculators would skip this sample): the files and the dataset do not belong together")
                if len(lm) != len(want) or any(v not in (0, 1) for v in lm):
                    raise CheckpointReadError(f"{ds}: row {i}'s loss_mask must be 0/1, one per input id")
                masks.append(torch.tensor(lm, dtype=torch.bool))
        from eagle3conv.states.readers import lengths_mask, pad_rows

        self.attention_mask = lengths_mask(lengths)
        self.input_ids = pad_rows(ids, self.seq_len)
        self._loss_mask = None if masks is None else pad_rows(masks, self.seq_len, False)
        self.target_next = None
        if record is not None:
            self._from_record(record, vllm_ids, layers, ids)
            return
        self._label(vllm_ids, layers)
        notes = ["vLLM's hidden-states files hold no next-token ids: the target's own next tokens need its "
                 "final norm and lm_head over the last slot (verify computes them given the target's weights)"]
        if masks is None:
            notes.append("no speculators dataset beside the files (its loss_mask): every token is scored")
        self.notes = tuple(notes)

    def _record(self, root: Path, files: list[tuple[int, Path]], lengths: list[int]) -> CaptureRecord | None:
        """``capture --engine vllm``'s record beside the files (the folder's, or a single file's
        folder's), checked against them; ``self._seqs`` its entry per file."""
        from eagle3conv.states.vllm_capture import read_capture_record

        record = read_capture_record(root.parent if root.is_file() else root)
        if record is None:
            return None
        by_name = {s.file: s for s in record.sequences}
        if not root.is_file() and len(record.sequences) != len(files):
            raise CheckpointReadError(f"{record.path}: records {len(record.sequences)} sequences, but the folder "
                                      f"holds {len(files)} hs_<i>.safetensors files: the capture is incomplete")
        self._seqs = []
        for (_, p), s in zip(files, lengths):
            seq = by_name.get(p.name)
            if seq is None or seq.tokens != s:
                raise CheckpointReadError(
                    f"{p}: " + ("not in" if seq is None else f"holds {s} tokens, but {record.path.name} records "
                                f"{seq.tokens} in") + f" the capture record {record.path}: the files and the record "
                    "do not belong together")
            self._seqs.append(seq)
        if (self._n, self.hidden_size) != (len(record.vllm_ids), record.hidden_size):
            raise CheckpointReadError(
                f"{record.path}: records {len(record.vllm_ids)} states of width {record.hidden_size}, but the files "
                f"hold {self._n} of width {self.hidden_size}")
        return record

    def _from_record(self, record: CaptureRecord, vllm_ids: Sequence[int] | None,
                     layers: Sequence[LayerRef | int] | None, ids: list[Tensor]) -> None:
        """Layers, loss mask, categories and (where vLLM generated every response) the target's
        next tokens from the capture record; a conflicting ``--states-layers`` is refused."""
        import torch

        from eagle3conv.states.readers import pad_rows

        if vllm_ids is not None and sorted(int(i) for i in vllm_ids) != list(record.vllm_ids):
            raise WiringError(
                f"{self.path}: --states-layers {','.join(map(str, vllm_ids))} (vLLM's numbering) conflicts with the "
                f"ids this capture recorded in {record.path.name}: {','.join(map(str, record.vllm_ids))}",
                hint="leave --states-layers out: the capture's own record names the layers")
        if layers is not None and tuple(sorted(as_layer_refs(layers))) != tuple(map(LayerRef, record.output_of)):
            raise WiringError(f"{self.path}: the layers named conflict with {record.path.name}'s")
        if self.num_layers is not None and self.num_layers != record.num_layers:
            raise WiringError(f"{record.path}: records a target of {record.num_layers} layers, but the target "
                              f"named has {self.num_layers}: these states come from another target")
        self.num_layers, self.vocab_size, self.target = record.num_layers, record.vocab_size, record.target
        self._label(record.vllm_ids, None)
        self.layers_from = (f"{record.path.name} vllm_layer_ids (eagle3conv capture --engine vllm's record, "
                            "in vLLM's numbering: id i = output of layer i-1)")
        seqs = self._seqs
        self._loss_mask = pad_rows([torch.tensor(s.loss_mask(), dtype=torch.bool) for s in seqs], self.seq_len,
                                   False)
        self.categories = known_categories(s.category for s in seqs)
        notes = []
        if all(s.generated for s in seqs):  # every scored position has the target's own token
            nxt = [torch.tensor(s.target_next(t.tolist()), dtype=torch.long) for s, t in zip(seqs, ids)]
            self.target_next = pad_rows(nxt, self.seq_len, -1)
            notes.append(f"the target's own next tokens: its greedy response as vLLM decoded it ({record.path.name}); "
                         "the loss mask is that response")
        else:
            notes.append("vLLM's hidden-states files hold no next-token ids and this capture did not generate "
                         "every response (--generate): the target's own next tokens need its final norm and "
                         "lm_head over the last slot (verify computes them given the target's weights)")
        self.notes = tuple(notes)

    def _check_header(self, p: Path, shape: tuple[int, int] | None) -> tuple[TensorInfo, TensorInfo]:
        """The file's ``hidden_states`` and ``token_ids`` (where their bytes are), checked."""
        header, _ = read_safetensors_header(p)
        if set(header) != VLLM_KEYS:
            raise CheckpointReadError(
                f"{p}: not a vLLM hidden-states file: tensors {sorted(header)}, expected hidden_states and token_ids")
        hs, tok = header["hidden_states"], header["token_ids"]
        if hs.dtype not in _FLOATS or len(hs.shape) != 3:
            raise CheckpointReadError(f"{p}: hidden_states must be float [S, n, T], got {hs.dtype} {list(hs.shape)}")
        if tok.dtype not in _INTS or len(tok.shape) != 1:
            raise CheckpointReadError(f"{p}: token_ids must be int64 [S], got {tok.dtype} {list(tok.shape)}")
        s, n, t = hs.shape
        if tok.shape[0] != s:
            raise CheckpointReadError(f"{p}: hidden_states holds {s} positions but token_ids {tok.shape[0]}")
        if s < 1:
            raise CheckpointReadError(f"{p}: holds no tokens")
        if shape is not None and (n, t) != shape:
            raise CheckpointReadError(
                f"{p}: {n} states of width {t}, but {self._files[0].name} holds {shape[0]} of width {shape[1]}: "
                "the files come from different runs")
        return hs, tok

    def _label(self, vllm_ids: Sequence[int] | None, layers: Sequence[LayerRef | int] | None) -> None:
        """The slots' layers, from vLLM ids (sorted: vLLM stacks in layer order) or LayerRefs."""
        self._vllm_ids = None
        refs: LayerSet | None = None
        if vllm_ids is not None:
            ids = sorted(int(i) for i in vllm_ids)
            if len(set(ids)) != len(ids) or ids[0] < 0:
                raise WiringError(f"{self.path}: --states-layers {list(vllm_ids)}: vLLM ids are distinct and >= 0")
            if self.num_layers is not None and ids[-1] > self.num_layers:
                raise WiringError(f"{self.path}: --states-layers names vLLM id {ids[-1]}, but the target has "
                                  f"{self.num_layers} layers (vLLM ids 0..{self.num_layers})")
            self._vllm_ids = ids
            refs = tuple(LayerRef(i - 1) for i in ids)
            self.layers_from = USER_STATED + ", in vLLM's numbering (id i = output of layer i-1)"
        elif layers is not None:
            refs = tuple(sorted(as_layer_refs(layers)))
            last = None if self.num_layers is None else LayerRef(self.num_layers - 1)
            if len(refs) == self._n - 1 and last is not None and all(r < last for r in refs):
                refs += (last,)  # speculators' layout: the aux slots, then the last layer (train/data.py:323-333)
        if refs is not None and len(refs) != self._n:
            raise WiringError(f"{self.path}: the files hold {self._n} states per token, but {len(refs)} layers were "
                              f"named ({describe(refs)})")
        self.layers = refs
        last = LayerRef(self.num_layers - 1) if self.num_layers is not None else None
        self.final_state = ("pre-norm", last) if refs is not None and last in refs else None

    @property
    def vllm_ids(self) -> list[int] | None:
        return self._vllm_ids

    def _no_layers_hint(self) -> str:
        return ("pass the aux layer ids vLLM was launched with (its speculative config's, in vLLM's numbering) "
                "with --states-layers")

    @staticmethod
    def _read_ids(info: TensorInfo) -> Tensor:
        """``token_ids`` read at the bytes its checked header names (no second parse of the header)."""
        import torch

        from eagle3conv.io import dtypes
        from eagle3conv.io.pread import pread_into

        out = torch.empty(info.shape, dtype=dtypes.torch_dtype(info.dtype))
        fd = os.open(info.file, os.O_RDONLY)
        try:
            pread_into(fd, out.numpy(), info.start, info.file)
        finally:
            os.close(fd)
        return out

    @staticmethod
    def _read(p: Path, name: str) -> Tensor:
        from safetensors import safe_open

        try:
            with safe_open(str(p), framework="pt") as f:
                return f.get_tensor(name)
        except Exception as e:  # safetensors raises its own error types for damaged files
            raise CheckpointReadError(f"{p}: cannot read {name} ({type(e).__name__}: {e})") from None

    def row_reader(self, refs: LayerSet | None, with_embeddings: bool = False) -> VllmRows | None:
        """What reads sequence ``i``'s slots ``refs`` (None: as stored), and the embedding output when
        asked, straight from its file into the caller's buffers (:class:`VllmRows`); None when the
        files' dtypes differ."""
        spans = self._spans
        if spans is None:
            return None
        idx = list(range(self._n)) if refs is None else [self.layers.index(r) for r in refs]
        emb = self.layers.index(LayerRef(-1)) if with_embeddings else None
        return VllmRows(self._files, spans, self.lengths, self._n, self.hidden_size, idx, emb)

    def _slots(self, idx: list[int], start: int, stop: int) -> Tensor:
        """Stored slots ``idx`` of sequences start:stop, ``[b, S, len(idx)*T]``, zero past each end."""
        import torch

        t, k = self.hidden_size, len(idx)
        spans = self._spans
        if spans is not None:  # one scatter read per file, straight into the batch
            from eagle3conv.io import dtypes

            rows = VllmRows(self._files, spans, self.lengths, self._n, t, idx, None)
            out = torch.empty(stop - start, self.seq_len, k * t, dtype=dtypes.torch_dtype(spans[0][1]))
            for row in range(stop - start):
                rows.fill(start + row, out[row])
            return out
        out = None
        contiguous = idx == list(range(idx[0], idx[0] + k))
        for row, p in enumerate(self._files[start:stop]):
            hs = self._read(p, "hidden_states")
            if out is None:
                out = torch.zeros(stop - start, self.seq_len, k * t, dtype=hs.dtype)
            s = hs.shape[0]
            part = hs[:, idx[0]:idx[0] + k] if contiguous else hs[:, idx]
            out[row, :s] = part.reshape(s, k * t)
        return out

    def _aux_rows(self, refs: LayerSet, start: int, stop: int) -> Tensor:
        return self._slots([self.layers.index(r) for r in refs], start, stop)

    def _stored_aux_rows(self, start: int, stop: int) -> Tensor:
        return self._slots(list(range(self._n)), start, stop)

    def _embed_rows(self, start: int, stop: int) -> Tensor:
        return self._aux_rows((LayerRef(-1),), start, stop)

    def find_non_finite(self, refs) -> Path | None:
        import torch

        for p in self._files:
            if not bool(torch.isfinite(self._read(p, "hidden_states")).all()):
                return p
        return None


class VllmRows:
    """Reads one sequence's slots from its ``hs_{i}.safetensors`` straight into the consumer's layout.

    A file's ``hidden_states`` ``[S, n, T]`` is row-major: per position its n slots side by side. The
    consumer wants ``[S, len(idx)*T]`` (slots ``idx`` side by side, in ``idx`` order) and maybe the
    embedding slot ``[S, T]``. :meth:`fill` reads the whole tensor once, front to back, with
    ``preadv`` scattering each position's slots to where they go (the slots nobody asked for to a
    scratch buffer): one pass over the file, no intermediate tensor, no copy after. Byte offsets
    come from the validated safetensors header."""

    def __init__(self, files: list[Path], spans: list[tuple[int, str]], lengths: list[int], n: int, hidden: int,
                 idx: list[int], emb: int | None):
        from eagle3conv.io import dtypes

        self.files, self.lengths, self.idx, self.emb_slot = files, lengths, idx, emb
        self.offsets = [start for start, _ in spans]
        self.dtype = dtypes.torch_dtype(spans[0][1])
        self.slot_bytes = hidden * dtypes.itemsize(spans[0][1])
        self.row_bytes = n * self.slot_bytes
        self.aux_bytes = len(idx) * self.slot_bytes
        self.hidden, self.seq_len, self.width = hidden, max(lengths), len(idx) * hidden
        self.scratch = memoryview(bytearray(self.row_bytes))
        # per position: (where, byte offset in that row, bytes), consecutive slots merged
        plan: list[list] = []
        for j in range(n):
            where, off = ("aux", idx.index(j) * self.slot_bytes) if j in idx else (None, 0)
            if where is None and emb == j:
                where = "emb"
            last = plan[-1] if plan else None
            if last and last[0] == where and (where is None or last[1] + last[2] == off):
                last[2] += self.slot_bytes
            else:
                plan.append([where, off, self.slot_bytes])
        self.plan = [tuple(x) for x in plan]

    def fill(self, i: int, aux: Tensor, emb: Tensor | None = None) -> None:
        """Sequence ``i``'s rows into ``aux`` ``[S', len(idx)*T]`` (and the embedding output into
        ``emb`` ``[S', T]``), contiguous tensors of this reader's dtype; zero past the sequence's end."""
        import torch

        from eagle3conv.io.pread import pread_scatter

        s = self.lengths[i]
        a = memoryview(aux.view(-1).view(torch.uint8).numpy())
        e = None if emb is None else memoryview(emb.view(-1).view(torch.uint8).numpy())
        if self.plan == [("aux", 0, self.row_bytes)]:  # every slot, in stored order: one buffer
            bufs = [a[:s * self.row_bytes]]
        else:
            dest = {"aux": (a, self.aux_bytes), "emb": (e, self.slot_bytes)}
            bufs = [self.scratch[:nb] if where is None else dest[where][0][p * dest[where][1] + off:
                                                                          p * dest[where][1] + off + nb]
                    for p in range(s) for where, off, nb in self.plan]
        fd = os.open(self.files[i], os.O_RDONLY)
        try:
            pread_scatter(fd, bufs, self.offsets[i], self.files[i])
        finally:
            os.close(fd)
        aux[s:] = 0
        if emb is not None:
            if self.emb_slot in self.idx:  # the embedding is also an aux slot: one read, copied
                col = self.idx.index(self.emb_slot) * (emb.shape[-1])
                emb[:s] = aux[:s, col:col + emb.shape[-1]]
            emb[s:] = 0


__all__ = ["HS_FILE", "VllmRows", "VllmStates", "hs_files", "is_vllm_file", "read_dataset_columns"]
