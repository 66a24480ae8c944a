"""NeMo Automodel 0.7.0's EAGLE-3 offline cache: :class:`NemoStates`.

What ``nemo_automodel/components/speculative/precompute_eagle3.py`` writes, through
``components/datasets/llm/eagle3_cache.py`` (docs/states-formats.md has the file:line)::

    manifest.json                   format_version 2; aux_layer_ids (hooks on layers[i]: the
                                    OUTPUT of layer i), num_samples, shard_size, seq_length,
                                    target_model, target_vocab_size, draft_vocab_size,
                                    selected_token_ids (the draft vocabulary), target_probs_topk, ...
    shard-000000.safetensors, ...   samples [k*shard_size, (k+1)*shard_size), stacked on dim 0:
        input_ids          [n, S]     int64   SHIFTED LEFT by one (x_{t+1} at t, 0 at the end)
        attention_mask     [n, S]     int64   not shifted
        loss_mask          [n, S]     int64   shifted left like input_ids
        aux_hidden_states  [n, S, kT] float   not shifted: the aux layers at position t
        position_mask      [n, S, 1]  bool    shifted loss_mask AND the target's argmax is in the
                                              draft vocabulary
        target_probs       [n, S, Vd] float   softmax over the draft vocabulary of the target's
                                              logits, shifted left (its distribution after x_{t+1});
                                              or, with target_probs_topk, target_probs_values
                                              [n, S, k] + target_probs_indices [n, S, k] int32
    target_embeddings.safetensors   one tensor, ``weight`` [V, H] fp32: the target's embedding table

The reader puts it in verify's layout (token x_t and the target's next token after x_t at t):
``input_ids[t] = cache input_ids[t-1]`` (x_0 is not stored; no draft reads or is scored on it),
``loss_mask[t] = cache loss_mask[t-1]``, and the target's own next token at t is
``selected_token_ids[argmax target_probs[t-1]]``. Where the cache's ``position_mask`` says the
target's argmax lies outside the draft vocabulary, the token is unknown but no drafter with that
vocabulary can propose it: it is set to the first target id outside the vocabulary (a miss), and a
note says how many positions that is. The layers are the manifest's own record.

Opening reads the manifest and, shard by shard, the small tensors and the argmax of the target
distribution (in blocks of rows); aux states are read only for the rows asked for.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3conv.errors import CheckpointReadError
from eagle3conv.io.jsonfile import read_json_file
from eagle3conv.io.safetensors import read_safetensors_header
from eagle3conv.spec.layers import LayerRef, LayerSet
from eagle3conv.states.format import CapturedStates, check_right_padded

if TYPE_CHECKING:
    from torch import Tensor

MANIFEST = "manifest.json"
EMBEDDINGS_FILE = "target_embeddings.safetensors"
SHARD_FILE = re.compile(r"^shard-(\d{6})\.safetensors$")
FORMAT_VERSION = 2
_REQUIRED = ("format_version", "aux_layer_ids", "num_samples", "shard_size", "seq_length", "draft_vocab_size",
             "selected_token_ids", "target_vocab_size")
_COMMON = ("input_ids", "attention_mask", "loss_mask", "aux_hidden_states", "position_mask")
_ARGMAX_ROWS = 4  # rows of target_probs read at a time for the argmax


def is_nemo_manifest(manifest: Any) -> bool:
    """NeMo's EAGLE-3 manifest marks: format_version and aux_layer_ids, shard_size, num_samples."""
    return isinstance(manifest, dict) and all(k in manifest for k in ("format_version", "aux_layer_ids",
                                                                        "shard_size", "num_samples"))


def _pos_int(manifest: dict, key: str, where: Path) -> int:
    v = manifest.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise CheckpointReadError(f"{where}: field '{key}' must be a positive integer, got {v!r}")
    return v


class NemoStates(CapturedStates):
    """A NeMo Automodel EAGLE-3 cache folder (see the module docstring)."""

    source = "nemo"

    def __init__(self, folder: str | os.PathLike):
        import torch

        self.path = root = Path(folder)
        mpath = root / MANIFEST
        m = read_json_file(mpath, "NeMo EAGLE-3 manifest")
        missing = [k for k in _REQUIRED if k not in m]
        if missing:
            raise CheckpointReadError(f"{mpath}: missing field{'s' if len(missing) > 1 else ''} "
                                      f"{', '.join(repr(k) for k in missing)}: not a NeMo Automodel EAGLE-3 manifest")
        if m["format_version"] != FORMAT_VERSION:
            raise CheckpointReadError(f"{mpath}: format_version {m['format_version']!r}; this eagle3conv reads NeMo "
                                      f"Automodel's EAGLE-3 cache version {FORMAT_VERSION} (0.7.0)")
        self.num_samples, self.shard_size = _pos_int(m, "num_samples", mpath), _pos_int(m, "shard_size", mpath)
        seq = _pos_int(m, "seq_length", mpath)
        self.vocab_size = _pos_int(m, "target_vocab_size", mpath)
        ids = m["aux_layer_ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool)
                                                            and i >= 0 for i in ids):
            raise CheckpointReadError(f"{mpath}: field 'aux_layer_ids' must be a list of layer indices, got {ids!r}")
        sel = m["selected_token_ids"]
        try:
            sel_t = torch.tensor(sel, dtype=torch.long) if isinstance(sel, list) and sel else None
        except (TypeError, ValueError, RuntimeError, OverflowError):
            sel_t = None
        if (sel_t is None or sel_t.ndim != 1 or len(sel) != m["draft_vocab_size"] or int(sel_t.min()) < 0
                or int(sel_t.max()) >= self.vocab_size or any(isinstance(i, bool) for i in sel[:1])):
            raise CheckpointReadError(f"{mpath}: field 'selected_token_ids' must list draft_vocab_size target ids")
        self.layers: LayerSet = tuple(LayerRef(i) for i in ids)
        self.layers_from = f"{MANIFEST} aux_layer_ids (NeMo's record: the output of layers[i])"
        self.target = m.get("target_model") if isinstance(m.get("target_model"), str) else None
        self.num_layers = None
        topk = m.get("target_probs_topk") or 0
        self._topk = isinstance(topk, int) and 0 < topk < len(sel)
        self._shards = self._shard_files(root)
        emb = root / EMBEDDINGS_FILE
        self.embedding_table_path = emb if emb.is_file() else None
        self._read_small(seq, sel_t)
        self.final_state = None

    def _shard_files(self, root: Path) -> list[Path]:
        found = {int(mt.group(1)): p for p in root.iterdir() if (mt := SHARD_FILE.match(p.name))}
        want = math.ceil(self.num_samples / self.shard_size)
        absent = [i for i in range(want) if i not in found]
        if absent:
            raise CheckpointReadError(
                f"{root / f'shard-{absent[0]:06d}.safetensors'}: missing: {MANIFEST} declares {self.num_samples} "
                f"samples in {want} shards of {self.shard_size}", hint="the cache was not fully written; "
                "finish it (precompute_eagle3 --resume) or point verify at a complete one")
        extra = sorted(i for i in found if i >= want)
        if extra:
            raise CheckpointReadError(f"{found[extra[0]]}: beyond the {want} shards {MANIFEST} declares")
        return [found[i] for i in range(want)]

    def _check_shard(self, i: int, p: Path, seq: int) -> tuple[dict, int]:
        header, _ = read_safetensors_header(p)
        probs = ("target_probs_values", "target_probs_indices") if self._topk else ("target_probs",)
        missing = [k for k in _COMMON + probs if k not in header]
        if missing:
            raise CheckpointReadError(f"{p}: missing tensor{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
        n = min(self.shard_size, self.num_samples - i * self.shard_size)
        for k in _COMMON + probs:
            shp = header[k].shape
            if len(shp) < 2 or shp[0] != n or shp[1] != seq:
                raise CheckpointReadError(
                    f"{p}: {k} is {list(shp)}, but {MANIFEST} puts {n} samples of {seq} positions in this shard")
        width = header["aux_hidden_states"].shape
        if len(width) != 3 or width[2] % len(self.layers):
            raise CheckpointReadError(f"{p}: aux_hidden_states {list(width)} is not [n, S, {len(self.layers)} x T] "
                                      f"for aux_layer_ids {[r.output_of for r in self.layers]}")
        return header, n

    def _read_small(self, seq: int, sel: Tensor) -> None:
        import torch
        from safetensors import safe_open

        ids, att, loss, nxt = [], [], [], []
        outside = 0
        miss_id = None  # a target id no draft of this vocabulary makes (found when first needed)
        t = None
        for i, p in enumerate(self._shards):
            header, n = self._check_shard(i, p, seq)
            w = header["aux_hidden_states"].shape[2] // len(self.layers)
            if t is not None and w != t:
                raise CheckpointReadError(f"{p}: aux states {w} wide, the first shard's {t}")
            t = w
            with safe_open(str(p), framework="pt") as f:
                a = f.get_tensor("attention_mask")
                check_right_padded(a, str(p))
                x = f.get_tensor("input_ids").long()
                lm = f.get_tensor("loss_mask").long()
                pm = f.get_tensor("position_mask").reshape(n, seq).bool()
                top = torch.empty(n, seq, dtype=torch.long)
                for r in range(0, n, _ARGMAX_ROWS):
                    if self._topk:
                        v = f.get_slice("target_probs_values")[r:r + _ARGMAX_ROWS]
                        ix = f.get_slice("target_probs_indices")[r:r + _ARGMAX_ROWS].long()
                        top[r:r + _ARGMAX_ROWS] = ix.gather(-1, v.float().argmax(-1, keepdim=True)).squeeze(-1)
                    else:
                        top[r:r + _ARGMAX_ROWS] = f.get_slice("target_probs")[r:r + _ARGMAX_ROWS].float().argmax(-1)
            if int(top.min()) < 0 or int(top.max()) >= len(sel):
                raise CheckpointReadError(f"{p}: target_probs_indices outside the draft vocabulary")
            real = a.bool()
            o_ids, o_loss, o_next = (torch.zeros(n, seq, dtype=torch.long) for _ in range(3))
            o_ids[:, 1:], o_loss[:, 1:] = x[:, :-1], lm[:, :-1]
            tok = sel.index_select(0, top.reshape(-1)).view_as(top)  # (plain sel[top] is ~1000x slower on CPU)
            unknown = o_loss[:, 1:].bool() & ~pm[:, :-1]
            if miss_id is None and bool(unknown.any()):
                in_vocab = torch.zeros(self.vocab_size + 1, dtype=torch.bool)
                in_vocab[sel] = True
                miss_id = int(torch.nonzero(~in_vocab)[0])
            if miss_id is not None:
                tok[:, :-1].masked_fill_(unknown, miss_id)
            outside += int((unknown & real[:, 1:]).sum())
            o_next[:, 1:] = tok[:, :-1]
            o_loss &= real.long()
            if bool((((o_ids < 0) | (o_ids >= self.vocab_size)) & real).any()):
                raise CheckpointReadError(f"{p}: input_ids outside 0..{self.vocab_size - 1} (target_vocab_size)")
            ids.append(o_ids.masked_fill(~real, 0))
            att.append(real)
            loss.append(o_loss.bool())
            nxt.append(o_next.masked_fill(~real, 0))
        self.hidden_size = t
        self.input_ids, self.attention_mask = torch.cat(ids), torch.cat(att)
        self._loss_mask, self.target_next = torch.cat(loss), torch.cat(nxt)
        notes = ["NeMo's cache stores token ids shifted left (the first token is not stored: no draft reads it "
                 "or is scored on it); the target's own next tokens are the argmax of its cached distribution"
                 + (" (top-k)" if self._topk else "")]
        if outside:
            notes.append(f"{outside} scored positions have a target token outside the cache's draft vocabulary "
                         f"({len(sel)} of {self.vocab_size} ids): counted as misses")
        self.notes = tuple(notes)

    def _rows_of(self, start: int, stop: int):
        """``(shard path, first row, last row, offset in the output)`` covering sequences start:stop."""
        out, at = [], start
        while at < stop:
            i, r = divmod(at, self.shard_size)
            take = min(stop - at, self.shard_size - r)
            out.append((self._shards[i], r, r + take, at - start))
            at += take
        return out

    def _slots(self, idx: list[int], start: int, stop: int) -> Tensor:
        import torch
        from safetensors import safe_open

        t, k = self.hidden_size, len(idx)
        out = None
        contiguous = idx == list(range(idx[0], idx[0] + k))
        every = contiguous and k == len(self.layers)
        spans = self._rows_of(start, stop)
        for p, a, b, o in spans:
            try:
                with safe_open(str(p), framework="pt") as f:
                    sl = f.get_slice("aux_hidden_states")
                    part = (sl[a:b] if every else sl[a:b, :, idx[0] * t:(idx[0] + k) * t] if contiguous else
                            torch.cat([sl[a:b, :, j * t:(j + 1) * t] for j in idx], dim=-1))
            except Exception as e:  # safetensors' own error types
                raise CheckpointReadError(f"{p}: cannot read aux_hidden_states ({type(e).__name__}: {e})") from None
            if len(spans) == 1:
                return part  # one shard holds the rows: no second copy
            if out is None:
                out = torch.empty(stop - start, self.seq_len, k * t, dtype=part.dtype)
            out[o:o + (b - a)] = part
        return out

    def _aux_rows(self, refs: LayerSet, start: int, stop: int) -> Tensor:
        return self._slots([self.layers.index(r) for r in refs], start, stop)

    def _stored_aux_rows(self, start: int, stop: int) -> Tensor:
        return self._slots(list(range(len(self.layers))), start, stop)

    def _embed_rows(self, start: int, stop: int) -> Tensor:  # pragma: no cover - layers never hold -1
        raise CheckpointReadError(f"{self.path}: a NeMo cache holds no embedding output")

    def _no_layers_hint(self) -> str:  # pragma: no cover - the manifest always names them
        return f"{MANIFEST} names them in aux_layer_ids"

    def find_non_finite(self, refs) -> Path | None:
        import torch

        for i, p in enumerate(self._shards):
            n = min(self.shard_size, self.num_samples - i * self.shard_size)
            rows = self._stored_aux_rows(i * self.shard_size, i * self.shard_size + n)
            if not bool(torch.isfinite(rows).all()):
                return p
        return None


__all__ = ["EMBEDDINGS_FILE", "MANIFEST", "NemoStates", "is_nemo_manifest"]
