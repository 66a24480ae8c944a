"""eagle3conv's captured-target-states file, ``states.safetensors``, and the view
every captured-states reader gives ``verify``.

One file holds what ``verify`` needs to run a drafter over real target
activations: the token ids, the target's own greedy next token at every
position, and the target's hidden states per explicitly named layer.

``states.safetensors``, version 1
---------------------------------

A safetensors file. ``__metadata__`` (string values, as safetensors requires)::

    format       "eagle3conv-states"               required, exactly this
    version      "1"                                required; newer versions are refused
    target       "HuggingFaceTB/SmolLM2-135M-Instruct"   name or path of the target
    num_layers   "30"                               N, the target's decoder layer count
    hidden_size  "576"                              T, the target's hidden size
    vocab_size   "49152"                            V, the target's vocab size
    layers       "[-1, 0, 1, ..., 29]"              JSON list of the hidden states stored,
                                                    as output-of-layer ints (0-based;
                                                    -1 = the embedding output, always
                                                    present), ascending
    capture      "{...}"                            JSON object, free form: how the file
                                                    was made (prompts file, generated
                                                    tokens, dtype, tool and version, ...)
    categories   "[\"code\", null, ...]"            optional: JSON list, one entry per
                                                    sequence (row order), a string or
                                                    null: the prompt's category
                                                    (``capture --prompts`` jsonl
                                                    ``category``). Absent = none known.

Tensors (``B`` sequences, ``S`` positions, right padding)::

    input_ids            [B, S]    int64    token x_t at position t; 0 at padding
    target_next          [B, S]    int64    the target's greedy next token after x_t
                                            (argmax of its logits at t); 0 at padding
    hidden.embedding     [B, S, T] float    the embedding output (input of layer 0)
    hidden.output_of.{i} [B, S, T] float    the output of decoder layer i, pre-norm
                                            (the residual stream after layer i; for
                                            the last layer, before the final norm)
    attention_mask       [B, S]    bool     1 = a real token; right padding: each row
                                            is ones then zeros, at least one token
                                            (int8/uint8 accepted on read)
    loss_mask            [B, S]    bool     optional; 1 = a token to score (the
                                            assistant's response). Absent: every real
                                            token counts. Must be 0 at padding.

All hidden tensors share one float dtype (bf16 by default; fp16, fp32 allowed)
and are zero at padding. Row ``b`` of every tensor is the same sequence, so
``hidden.output_of.{i}[b, t]`` and ``target_next[b, t]`` come from one target
forward over ``input_ids[b, :t+1]``. That is the layout
:meth:`eagle3conv.model.drafter.Eagle3Drafter.draft_chain` expects: its
``aux[:, t]`` and ``input_ids[:, t]`` are position ``t``; a draft at step k from
t is right when it equals the target's own greedy token there.

The tensors are laid out int64 first, then the hidden states, then the masks,
so every tensor starts at an offset aligned to its item size. The file is
written in place-order by :class:`StatesWriter`: the header is fixed first
(all shapes are known), then rows are written batch by batch at their byte
offsets, so a capture never holds more than one batch of states in memory.
Readers open it lazily (``safe_open``) and read row ranges.

Changing the meaning of any field above needs a new version; adding optional
tensors or metadata keys does not (readers ignore unknown metadata keys and
refuse unknown tensors, so a file is never half-understood).

The common view
---------------

:class:`CapturedStates` is what ``verify`` reads, whatever the source:
:class:`StatesFile` (this format), and, in :mod:`eagle3conv.states.readers`,
vLLM hidden-states files, NeMo Automodel caches, SpecForge offline features and
per-slot aux dumps (patched-server pipelines). Each has
``layers`` (the :class:`~eagle3conv.spec.layers.LayerRef` s it can give, or
None when the source does not record them), ``aux(refs)``, ``embeddings()``,
``input_ids``, ``attention_mask``, ``target_next`` (None when the source has
none), ``loss_mask``, ``categories`` (one per sequence, or None when the source
records none) and :meth:`CapturedStates.batches`.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3conv.errors import CheckpointReadError, UsageError, WiringError, WriteError
from eagle3conv.io import dtypes
from eagle3conv.io.devices import FLOAT_CHOICES, resolve_dtype
from eagle3conv.io.files import remove_stale_temps, umask
from eagle3conv.io.safetensors import header_layout, pwrite_all
from eagle3conv.spec.layers import EMBEDDING, MAX_LAYERS, LayerRef, LayerSet, describe

if TYPE_CHECKING:
    from torch import Tensor

STATES_FORMAT = "eagle3conv-states"
STATES_VERSION = 1
STATES_FILE = "states.safetensors"
NO_NEXT_TOKENS = "hold no next-token ids"  # the words of a reader's note that verify drops once it computed them
USER_STATED = "--states-layers (the user's statement: the files do not record their layers)"

EMBEDDING_KEY = "hidden.embedding"
_HIDDEN_PREFIX = "hidden.output_of."
_TOKEN_KEYS = ("input_ids", "target_next")
_MASK_KEYS = ("attention_mask", "loss_mask")
_META_REQUIRED = ("format", "version", "target", "num_layers", "hidden_size", "vocab_size", "layers", "capture")

# the safetensors dtypes this format allows (eagle3conv.io.dtypes has the names and sizes)
_FLOAT_DTYPES = FLOAT_CHOICES  # hidden states
_MASK_DTYPES = ("BOOL", "I8", "U8")


def hidden_key(ref: LayerRef | int) -> str:
    """The tensor name of one hidden state: ``hidden.embedding`` or ``hidden.output_of.{i}``."""
    i = ref.output_of if isinstance(ref, LayerRef) else int(ref)
    return EMBEDDING_KEY if i == -1 else f"{_HIDDEN_PREFIX}{i}"


def as_layer_refs(refs: Iterable[LayerRef | int]) -> LayerSet:
    """Layer refs from refs or plain ``output_of`` ints, in the given order (not validated)."""
    out = []
    for r in refs:
        out.append(r if isinstance(r, LayerRef) else LayerRef(r))
    return tuple(out)


# --------------------------------------------------------------------------- the common view


@dataclass(frozen=True)
class StatesBatch:
    """Sequences ``start:stop`` of a :class:`CapturedStates`. ``aux`` is
    ``[b, S, k*T]`` in the requested slot order (None when no refs were asked
    for); ``embeddings`` is ``[b, S, T]`` when asked for."""

    start: int
    stop: int
    input_ids: Tensor | None
    attention_mask: Tensor
    target_next: Tensor | None
    loss_mask: Tensor
    aux: Tensor | None = None
    embeddings: Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())


class CapturedStates:
    """Captured target states, however they were stored. Subclasses set the
    attributes below and implement :meth:`_aux_rows` / :meth:`_embed_rows`.

    * ``source``: ``"eagle3conv"``, ``"vllm"``, ``"nemo"``, ``"specforge"`` or ``"aux-dump"``;
      ``path``: where it was read from.
    * ``layers``: the states it holds, as LayerRefs in the order stored, or None
      when the source does not record which layers it holds (then only
      ``aux(None)``, "as stored", works).
    * ``num_layers`` / ``vocab_size``: the target's, when recorded, else None.
    * ``hidden_size``: T.
    * ``input_ids`` ``[B, S]`` int64 (None when the source stores no ids),
      ``attention_mask`` ``[B, S]`` bool, right padded; ``target_next`` ``[B, S]``
      int64 or None; ``loss_mask`` ``[B, S]`` bool (= ``attention_mask`` when the
      source has none).
    * ``categories``: one entry per sequence (a string, or None for a sequence without
      one), or None when the source records no categories at all.
    * ``notes``: plain-words caveats for a report (what the source cannot give).
    """

    source: str
    path: Path
    layers: LayerSet | None
    num_layers: int | None
    hidden_size: int
    vocab_size: int | None
    target: str | None
    input_ids: Tensor | None
    attention_mask: Tensor
    target_next: Tensor | None
    categories: tuple[str | None, ...] | None = None
    notes: tuple[str, ...] = ()
    _loss_mask: Tensor | None = None
    # where ``layers`` comes from: the source's own record (words naming it), ``USER_STATED`` (the
    # user's --states-layers), or None when nothing names them (then verify labels the slots with the
    # wiring it scores, and says these states cannot check the wiring)
    layers_from: str | None = None
    # the target's last hidden state, when the source holds it: ``("pre-norm", ref)`` (a stored layer
    # output, before the final norm) or ``("post-norm", None)`` (the lm_head input, read by
    # ``final_hidden(rows)``); None when it holds neither
    final_state: tuple[str, Any] | None = None

    # -- shape
    @property
    def num_sequences(self) -> int:
        return int(self.attention_mask.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.attention_mask.shape[1])

    @property
    def shape(self) -> tuple[int, int]:
        return (self.num_sequences, self.seq_len)

    @property
    def num_tokens(self) -> int:
        """Real (unpadded) tokens."""
        return int(self.attention_mask.sum())

    @property
    def lengths(self) -> list[int]:
        return [int(n) for n in self.attention_mask.sum(dim=1)]

    @property
    def loss_mask(self) -> Tensor:
        return self.attention_mask if self._loss_mask is None else self._loss_mask

    @property
    def has_loss_mask(self) -> bool:
        return self._loss_mask is not None

    @property
    def has_embeddings(self) -> bool:
        return self.layers is not None and EMBEDDING in self.layers

    # -- states
    def check_refs(self, refs: Iterable[LayerRef | int]) -> LayerSet:
        """``refs`` as a LayerSet, after checking this source holds every one.
        Raises :class:`WiringError` naming what is missing and what is there."""
        wanted = as_layer_refs(refs)
        if not wanted:
            raise UsageError("name at least one layer to read")
        if len(set(wanted)) != len(wanted):
            raise WiringError(f"the aux layers repeat a state: {describe(wanted)}")
        if self.layers is None:
            raise WiringError(
                f"{self.path}: {self._source_words()} does not record which target layers it holds, "
                f"so {describe(wanted)} cannot be looked up in it",
                hint=self._no_layers_hint(),
            )
        missing = [r for r in wanted if r not in self.layers]
        if missing:
            raise WiringError(
                f"{self.path}: the {', the '.join(map(str, missing))} "
                f"{'was' if len(missing) == 1 else 'were'} not captured; "
                f"this {self._source_words()} holds {describe(sorted(self.layers))}",
                hint="capture again with those layers (eagle3conv capture --layers ...), "
                "or pick a wiring among the layers available",
            )
        return wanted

    def aux(self, refs: Sequence[LayerRef | int] | None, rows: slice | None = None,
            *, dtype: Any = None) -> Tensor:
        """The aux input ``[b, S, k*T]``: the named states concatenated in slot order.

        ``refs=None`` means "as stored" (SpecForge records and dumps without a
        manifest hold one fixed set). ``rows`` picks sequences (default all).
        """
        start, stop = self._rows(rows)
        if refs is None:
            out = self._stored_aux_rows(start, stop)
        else:
            wanted = self.check_refs(refs)
            out = self._aux_rows(wanted, start, stop)
        return out if dtype is None else out.to(resolve_dtype(dtype, what="states dtype"))

    def embeddings(self, rows: slice | None = None, *, dtype: Any = None) -> Tensor:
        """The embedding output ``[b, S, T]`` (the drafter embeds the same tokens
        with the target's table; verify uses this when it has no table)."""
        if not self.has_embeddings:
            raise WiringError(
                f"{self.path}: this {self._source_words()} holds no embedding output",
                hint="use the target's embed_tokens weights to embed input_ids instead",
            )
        start, stop = self._rows(rows)
        out = self._embed_rows(start, stop)
        return out if dtype is None else out.to(resolve_dtype(dtype, what="states dtype"))

    def batches(self, refs: Sequence[LayerRef | int] | None = (), *, batch_size: int = 8,
                with_embeddings: bool = False, dtype: Any = None) -> Iterator[StatesBatch]:
        """Sequences in chunks of ``batch_size``: only one chunk's states are read
        at a time. ``refs=()`` reads no aux states, ``None`` the stored set."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise UsageError(f"batch_size must be a positive integer, got {batch_size!r}")
        if refs is not None and len(refs) > 0:
            refs = self.check_refs(refs)
        if with_embeddings and not self.has_embeddings:
            self.embeddings(slice(0, 0))  # raises the explanation
        for start in range(0, self.num_sequences, batch_size):
            rows = slice(start, min(start + batch_size, self.num_sequences))
            aux = None if refs is not None and len(refs) == 0 else self.aux(refs, rows, dtype=dtype)
            emb = self.embeddings(rows, dtype=dtype) if with_embeddings else None
            yield StatesBatch(
                start=rows.start, stop=rows.stop,
                input_ids=None if self.input_ids is None else self.input_ids[rows],
                attention_mask=self.attention_mask[rows],
                target_next=None if self.target_next is None else self.target_next[rows],
                loss_mask=self.loss_mask[rows], aux=aux, embeddings=emb,
            )

    def summary(self) -> dict:
        """A JSON-ready description for reports."""
        return {
            "source": self.source,
            "path": str(self.path),
            "target": self.target,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "layers": None if self.layers is None else [r.output_of for r in self.layers],
            "sequences": self.num_sequences,
            "seq_len": self.seq_len,
            "tokens": self.num_tokens,
            "has_input_ids": self.input_ids is not None,
            "has_target_next": self.target_next is not None,
            "has_loss_mask": self.has_loss_mask,
            "categories": category_counts(self.categories),
            "layers_from": self.layers_from,
            "notes": list(self.notes),
        }

    # -- for subclasses
    def _rows(self, rows: slice | None) -> tuple[int, int]:
        if rows is None:
            return 0, self.num_sequences
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise UsageError(f"rows must be a contiguous slice of sequences, got {rows!r}")
        start, stop, _ = rows.indices(self.num_sequences)
        return start, max(start, stop)

    def _source_words(self) -> str:
        return {"eagle3conv": "states file", "aux-dump": "aux dump",
                "specforge": "SpecForge feature set", "vllm": "vLLM hidden-states folder",
                "nemo": "NeMo Automodel EAGLE-3 cache"}.get(self.source, "states source")

    def find_non_finite(self, refs: Sequence[LayerRef | int] | None) -> Path | None:
        """The first file holding a NaN or Inf among ``refs`` (None: the stored slots), or None.
        Readers of one file per sequence override it; the default names :attr:`path`."""
        return self.path

    def _no_layers_hint(self) -> str | None:
        return None

    def _aux_rows(self, refs: LayerSet, start: int, stop: int) -> Tensor:
        raise NotImplementedError

    def _stored_aux_rows(self, start: int, stop: int) -> Tensor:
        if self.layers is None:
            raise NotImplementedError
        return self._aux_rows(tuple(r for r in self.layers if not r.is_embedding), start, stop)

    def _embed_rows(self, start: int, stop: int) -> Tensor:
        raise NotImplementedError


# --------------------------------------------------------------------------- categories


def is_category(c: Any) -> bool:
    """A prompt category as the states formats keep it: a non-empty string."""
    return isinstance(c, str) and bool(c.strip())


def category_problem(categories: Any, sequences: int) -> str | None:
    """What is wrong with ``categories`` as one string-or-None per sequence, or None when
    nothing is: a list of exactly ``sequences`` entries, each a non-empty string or null."""
    if not isinstance(categories, (list, tuple)):
        return f"must be a list, one entry per sequence, got {type(categories).__name__}"
    if len(categories) != sequences:
        return f"holds {len(categories)} entries for {sequences} sequences (one per sequence)"
    for i, c in enumerate(categories):
        if c is not None and not is_category(c):
            return f"entry {i} must be a non-empty string or null, got {c!r}"
    return None


def known_categories(categories: Iterable[str | None]) -> tuple[str | None, ...] | None:
    """``categories`` (one per sequence) as a tuple, or None when no sequence has one."""
    cats = tuple(categories)
    return None if all(c is None for c in cats) else cats


def category_counts(categories: Sequence[str | None] | None) -> dict[str, int] | None:
    """Sequences per category (None: the source records no categories), for summaries;
    sequences without one are counted under ``"(none)"``."""
    if categories is None:
        return None
    out: dict[str, int] = {}
    for c in categories:
        key = "(none)" if c is None else c
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


# --------------------------------------------------------------------------- mask checks


def check_right_padded(mask: Tensor, where: str) -> None:
    """Every row of ``mask`` [B, S] is ones then zeros, with at least one one."""
    import torch

    m = mask.to(torch.int8)
    if m.numel() and (int(m.min()) < 0 or int(m.max()) > 1):
        raise CheckpointReadError(f"{where}: attention_mask must hold only 0 and 1")
    lengths = m.sum(dim=1)
    if m.shape[0] and int(lengths.min()) < 1:
        row = int(torch.nonzero(lengths < 1)[0])
        raise CheckpointReadError(f"{where}: attention_mask row {row} has no real token")
    expect = torch.arange(m.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    bad = (m.bool() != expect).any(dim=1)
    if bool(bad.any()):
        row = int(torch.nonzero(bad)[0])
        raise CheckpointReadError(
            f"{where}: attention_mask row {row} is not right padded (ones, then zeros)"
        )


# --------------------------------------------------------------------------- reader


class StatesFile(CapturedStates):
    """An eagle3conv ``states.safetensors``, opened lazily and validated.

    Opening reads the header and the small ``[B, S]`` tensors (ids and masks) and
    checks every field; hidden states are read only when asked for, row range by
    row range. Malformed files raise :class:`CheckpointReadError` naming the field.
    Use as a context manager, or call :meth:`close`.
    """

    source = "eagle3conv"

    def __init__(self, path: str | os.PathLike):
        from safetensors import safe_open

        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointReadError(f"{self.path}: no such states file")
        try:
            self._f = safe_open(str(self.path), framework="pt")
        except Exception as e:  # safetensors raises its own error types for bad headers
            raise CheckpointReadError(
                f"{self.path}: not a readable safetensors file ({type(e).__name__}: {e})"
            ) from None
        try:
            self._validate()
        except BaseException:
            self.close()
            raise

    # -- open/close
    def close(self) -> None:
        self._f = None

    def __enter__(self) -> StatesFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"StatesFile({str(self.path)!r}, sequences={self.num_sequences}, "
                f"seq_len={self.seq_len}, layers={[r.output_of for r in self.layers]})")

    # -- validation
    def _err(self, field: str, why: str) -> CheckpointReadError:
        return CheckpointReadError(f"{self.path}: field '{field}' {why}")

    def _meta_int(self, meta: dict, key: str, most: int | None = None) -> int:
        raw = meta[key]
        shown = repr(raw) if len(raw) <= 24 else f"a string of {len(raw)} characters"
        try:
            v = int(raw) if len(raw) <= 24 else -1  # no count has 24 digits; longer is never parsed
        except ValueError:
            raise self._err(key, f"must be a positive integer, got {shown}") from None
        if v < 1:
            raise self._err(key, f"must be a positive integer, got {shown}")
        if most is not None and v > most:
            raise self._err(key, f"is {v}; eagle3conv takes at most {most}")
        return v

    def _meta_json(self, meta: dict, key: str) -> Any:
        try:
            return json.loads(meta[key])
        except json.JSONDecodeError as e:
            raise self._err(key, f"is not valid JSON ({e})") from None

    def _validate(self) -> None:
        import torch

        f = self._f
        meta = f.metadata() or {}
        missing = [k for k in _META_REQUIRED if k not in meta]
        if meta.get("format") != STATES_FORMAT:
            raise self._err("format", f"must be {STATES_FORMAT!r}, got {meta.get('format')!r}: "
                            "not an eagle3conv states file")
        if missing:
            raise CheckpointReadError(
                f"{self.path}: metadata lacks field{'s' if len(missing) > 1 else ''} "
                f"{', '.join(repr(m) for m in missing)}")
        try:
            version = int(meta["version"])
        except ValueError:
            raise self._err("version", f"must be an integer, got {meta['version']!r}") from None
        if version > STATES_VERSION:
            raise CheckpointReadError(
                f"{self.path}: field 'version' is {version}; this eagle3conv reads states version "
                f"{STATES_VERSION}", hint="upgrade eagle3conv")
        if version < 1:
            raise self._err("version", f"must be >= 1, got {version}")
        self.version = version
        self.target = meta["target"] or None
        self.num_layers = self._meta_int(meta, "num_layers", MAX_LAYERS)
        self.hidden_size = self._meta_int(meta, "hidden_size")
        self.vocab_size = self._meta_int(meta, "vocab_size")
        layers = self._meta_json(meta, "layers")
        if not isinstance(layers, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in layers):
            raise self._err("layers", f"must be a JSON list of integers, got {meta['layers']!r}")
        if -1 not in layers:
            raise self._err("layers", "must include -1: the embedding output is always stored")
        if layers != sorted(set(layers)):
            raise self._err("layers", f"must be ascending without repeats, got {layers}")
        bad = [i for i in layers if i < -1 or i >= self.num_layers]
        if bad:
            raise self._err("layers", f"names {bad}, outside -1..{self.num_layers - 1} "
                            f"(num_layers is {self.num_layers})")
        self.layers = tuple(LayerRef(i) for i in layers)
        capture = self._meta_json(meta, "capture")
        if not isinstance(capture, dict):
            raise self._err("capture", f"must be a JSON object, got {meta['capture']!r}")
        self.capture = capture
        self.metadata = dict(meta)
        cats = self._meta_json(meta, "categories") if "categories" in meta else None

        names = set(f.keys())
        expected = set(_TOKEN_KEYS) | {"attention_mask"} | {hidden_key(r) for r in self.layers}
        absent = sorted(expected - names)
        if absent:
            raise CheckpointReadError(
                f"{self.path}: missing tensor{'s' if len(absent) > 1 else ''} {', '.join(absent)}"
                + (" (named in field 'layers')" if any(a.startswith("hidden.") for a in absent) else ""))
        extra = sorted(names - expected - {"loss_mask"})
        if extra:
            raise CheckpointReadError(
                f"{self.path}: unexpected tensor{'s' if len(extra) > 1 else ''} {', '.join(extra)} "
                f"(hidden states must be listed in field 'layers', which is {layers})")

        def info(name: str) -> tuple[str, list[int]]:
            sl = f.get_slice(name)
            return sl.get_dtype(), list(sl.get_shape())

        dt, shape = info("input_ids")
        if dt != "I64" or len(shape) != 2:
            raise self._err("input_ids", f"must be int64 [B, S], got {dt} {shape}")
        b, s = shape
        if b < 1 or s < 1:
            raise self._err("input_ids", f"must hold at least one token, got shape {shape}")
        for name in ("target_next",):
            dt, shp = info(name)
            if dt != "I64" or shp != [b, s]:
                raise self._err(name, f"must be int64 {[b, s]} like input_ids, got {dt} {shp}")
        for name in _MASK_KEYS:
            if name not in names:
                continue
            dt, shp = info(name)
            if dt not in _MASK_DTYPES or shp != [b, s]:
                raise self._err(name, f"must be bool/int8/uint8 {[b, s]}, got {dt} {shp}")
        hidden_dtype = None
        for ref in self.layers:
            name = hidden_key(ref)
            dt, shp = info(name)
            if dt not in _FLOAT_DTYPES:
                raise self._err(name, f"must be bf16, fp16 or fp32, got {dt}")
            if shp != [b, s, self.hidden_size]:
                raise self._err(name, f"must be {[b, s, self.hidden_size]} (B, S, hidden_size), got {shp}")
            if hidden_dtype is None:
                hidden_dtype = dt
            elif dt != hidden_dtype:
                raise self._err(name, f"is {dt} but the other hidden states are {hidden_dtype}")
        self.dtype = dtypes.torch_dtype(hidden_dtype)

        mask = f.get_tensor("attention_mask")
        check_right_padded(mask, str(self.path))
        self.attention_mask = mask.bool()
        self._loss_mask = None
        if "loss_mask" in names:
            lm = f.get_tensor("loss_mask").to(torch.int8)
            if lm.numel() and (int(lm.min()) < 0 or int(lm.max()) > 1):
                raise self._err("loss_mask", "must hold only 0 and 1")
            if bool((lm.bool() & ~self.attention_mask).any()):
                raise self._err("loss_mask", "is 1 at a padding position (attention_mask 0)")
            self._loss_mask = lm.bool()
        for name in _TOKEN_KEYS:
            t = f.get_tensor(name)
            real = t[self.attention_mask]
            if real.numel() and (int(real.min()) < 0 or int(real.max()) >= self.vocab_size):
                raise self._err(name, f"holds ids outside 0..{self.vocab_size - 1} (vocab_size)")
            setattr(self, name, t)
        self.categories = None
        if cats is not None:
            problem = category_problem(cats, b)
            if problem:
                raise self._err("categories", problem)
            self.categories = tuple(cats)
        self.notes = ()
        self.layers_from = "the states file's own 'layers' field"
        last = LayerRef(self.num_layers - 1)
        self.final_state = ("pre-norm", last) if last in self.layers else None

    # -- reads
    def _live(self):
        if self._f is None:
            raise UsageError(f"{self.path}: the states file was closed")
        return self._f

    def _read(self, name: str, start: int, stop: int) -> Tensor:
        return self._live().get_slice(name)[start:stop]

    def hidden(self, ref: LayerRef | int, rows: slice | None = None) -> Tensor:
        """One stored state ``[b, S, T]``."""
        (r,) = self.check_refs([ref])
        start, stop = self._rows(rows)
        return self._read(hidden_key(r), start, stop)

    def _aux_rows(self, refs: LayerSet, start: int, stop: int) -> Tensor:
        import torch

        parts = [self._read(hidden_key(r), start, stop) for r in refs]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def _stored_aux_rows(self, start: int, stop: int) -> Tensor:
        raise UsageError(
            f"{self.path}: a states file holds {describe(self.layers)}; name the aux layers to read "
            "(aux(refs) with LayerRefs in slot order)")

    def _embed_rows(self, start: int, stop: int) -> Tensor:
        return self._read(EMBEDDING_KEY, start, stop)


# --------------------------------------------------------------------------- writer


class StatesWriter:
    """Streams a ``states.safetensors`` to disk, batch by batch.

    The header is fixed at construction (every shape is known), so each call to
    :meth:`write` puts its rows at their byte offsets in a temp file beside
    ``path``. :meth:`commit` checks every row was written, flushes, re-opens the
    temp file as a :class:`StatesFile` (full validation) and renames it to
    ``path``. Any failure, or leaving a ``with`` block by an exception, removes
    the temp file; ``path`` is never left half written.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        num_sequences: int,
        seq_len: int,
        hidden_size: int,
        num_layers: int,
        vocab_size: int,
        layers: Iterable[LayerRef | int],
        target: str | None = None,
        dtype: Any = "bf16",
        with_loss_mask: bool = False,
        capture: Mapping | None = None,
        categories: Sequence[str | None] | None = None,
    ):
        import torch

        for name, v in (("num_sequences", num_sequences), ("seq_len", seq_len),
                        ("hidden_size", hidden_size), ("num_layers", num_layers),
                        ("vocab_size", vocab_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UsageError(f"{name} must be a positive integer, got {v!r}")
        ids = sorted({r.output_of for r in as_layer_refs(layers)} | {-1})
        bad = [i for i in ids if i >= num_layers]
        if bad:
            raise UsageError(f"layers {bad} do not exist in a {num_layers}-layer target (0..{num_layers - 1})")
        self.path = Path(path)
        self.dtype = resolve_dtype(dtype, what="states dtype")
        self.layers = tuple(LayerRef(i) for i in ids)
        self.shape = (num_sequences, seq_len)
        self.hidden_size = hidden_size
        self._vocab_size = vocab_size
        try:
            capture_json = json.dumps(dict(capture or {}), sort_keys=True)
        except (TypeError, ValueError) as e:
            raise UsageError(f"capture info must be JSON-serialisable: {e}") from None
        meta = {
            "format": STATES_FORMAT,
            "version": str(STATES_VERSION),
            "target": "" if target is None else str(target),
            "num_layers": str(num_layers),
            "hidden_size": str(hidden_size),
            "vocab_size": str(vocab_size),
            "layers": json.dumps(ids),
            "capture": capture_json,
        }
        self.categories = None if categories is None else tuple(categories)
        if categories is not None:
            problem = category_problem(categories, num_sequences)
            if problem:
                raise UsageError(f"{path}: categories {problem}")
            meta["categories"] = json.dumps(list(categories))
        b, s, t = num_sequences, seq_len, hidden_size
        specs: list[tuple[str, torch.dtype, list[int]]] = [
            ("input_ids", torch.int64, [b, s]),
            ("target_next", torch.int64, [b, s]),
            *[(hidden_key(r), self.dtype, [b, s, t]) for r in self.layers],
            ("attention_mask", torch.bool, [b, s]),
        ]
        if with_loss_mask:
            specs.append(("loss_mask", torch.bool, [b, s]))
        entries = [(name, dtypes.from_torch(dt), shape) for name, dt, shape in specs]
        raw, placed = header_layout(entries, meta)  # in the given order: rows land at fixed offsets
        self._layout: dict[str, tuple[torch.dtype, list[int], int, int]] = {
            name: (dt, shape, offset, nbytes) for (name, dt, shape), (offset, nbytes) in zip(specs, placed, strict=True)
        }
        offset = sum(nbytes for _, nbytes in placed)
        self._data_start = len(raw)
        self._total = self._data_start + offset
        self._written: dict[str, list[bool]] = {name: [False] * b for name in self._layout}
        self._fd: int | None = None
        self._tmp: str | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_temps(self.path)
            fd, self._tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp",
                                             dir=self.path.parent)
            self._fd = fd
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held while writing: marks the temp as live
            os.fchmod(fd, 0o666 & ~umask())  # mkstemp makes 0600; honour the user's umask like any file
            pwrite_all(fd, raw, 0)
            os.ftruncate(fd, self._total)  # sparse until written
        except OSError as e:
            self.abort()
            raise WriteError(f"{self.path}: cannot create the states file: {e.strerror or e}") from e

    def __enter__(self) -> StatesWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif self._fd is not None:
            self.commit()

    def write(self, start: int, *, input_ids: Tensor, attention_mask: Tensor, target_next: Tensor,
              hidden: Mapping[LayerRef | int, Tensor], loss_mask: Tensor | None = None) -> None:
        """Write sequences ``start : start + b``. ``hidden`` maps each layer of
        ``layers`` (the embedding output included) to ``[b, S, T]``; all tensors
        have ``S = seq_len`` columns. Hidden states are cast to the file's dtype."""
        import torch

        if self._fd is None:
            raise UsageError(f"{self.path}: the states writer was already committed or aborted")
        b = int(input_ids.shape[0])
        s = self.shape[1]
        if start < 0 or start + b > self.shape[0]:
            raise UsageError(f"rows {start}..{start + b} fall outside 0..{self.shape[0]}")
        given = {(r if isinstance(r, LayerRef) else LayerRef(int(r))): v for r, v in hidden.items()}
        if set(given) != set(self.layers):
            missing = sorted(set(self.layers) - set(given))
            extra = sorted(set(given) - set(self.layers))
            raise UsageError(
                "hidden states must be given for exactly the writer's layers"
                + (f"; missing {describe(missing)}" if missing else "")
                + (f"; not in the file: {describe(extra)}" if extra else ""))
        parts: dict[str, Tensor] = {
            "input_ids": input_ids.to(torch.int64),
            "target_next": target_next.to(torch.int64),
            "attention_mask": attention_mask.to(torch.bool),
        }
        if "loss_mask" in self._layout:
            if loss_mask is None:
                raise UsageError("this writer stores a loss_mask: pass loss_mask")
            parts["loss_mask"] = loss_mask.to(torch.bool)
        elif loss_mask is not None:
            raise UsageError("the writer was made without with_loss_mask=True; loss_mask not stored")
        for ref, v in given.items():
            parts[hidden_key(ref)] = v.to(self.dtype)
        for name, t in parts.items():
            want = [b, s] + self._layout[name][1][2:]
            if list(t.shape) != want:
                raise UsageError(f"{name}: expected shape {want}, got {list(t.shape)}")
        try:
            check_right_padded(parts["attention_mask"], f"rows {start}..{start + b}")
        except CheckpointReadError as e:
            raise UsageError(f"{self.path}: {e.message}") from None
        real = parts["attention_mask"]
        for name in _TOKEN_KEYS:
            ids = parts[name][real]
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self._vocab_size):
                raise UsageError(f"{self.path}: {name} holds ids outside 0..{self._vocab_size - 1} (vocab_size)")
        if "loss_mask" in parts and bool((parts["loss_mask"] & ~real).any()):
            raise UsageError(f"{self.path}: loss_mask is 1 at a padding position")
        for name, t in parts.items():
            dt, shape, offset, _ = self._layout[name]
            row_bytes = t[0].numel() * dt.itemsize if b else 0
            buf = t.detach().cpu().contiguous().view(torch.uint8).numpy()
            try:
                pwrite_all(self._fd, buf, self._data_start + offset + start * row_bytes)
            except OSError as e:
                self.abort()
                raise WriteError(f"{self.path}: writing {name} failed: {e.strerror or e}") from e
            for row in range(start, start + b):
                self._written[name][row] = True

    def abort(self) -> None:
        """Remove the temp file; ``path`` is untouched."""
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
        if self._tmp is not None:
            Path(self._tmp).unlink(missing_ok=True)
            self._tmp = None

    def commit(self) -> Path:
        """Check, flush, validate and rename into place. Returns the final path."""
        if self._fd is None:
            raise UsageError(f"{self.path}: the states writer was already committed or aborted")
        for name, rows in self._written.items():
            if not all(rows):
                first = rows.index(False)
                self.abort()
                raise UsageError(f"{self.path}: {name} row {first} was never written; nothing was saved")
        try:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
            try:
                with StatesFile(self._tmp) as check:
                    ok = (check.layers == self.layers and check.shape == self.shape
                          and check.categories == self.categories)
            except CheckpointReadError as e:
                raise WriteError(f"{self.path}: the written file does not read back: "
                                 f"{e.message.replace(str(self._tmp), 'temp file')}") from None
            if not ok:
                raise WriteError(f"{self.path}: the written file does not read back as written")
            os.replace(self._tmp, self.path)
            self._tmp = None
        except OSError as e:
            self.abort()
            raise WriteError(f"{self.path}: cannot save the states file: {e.strerror or e}") from e
        except BaseException:
            self.abort()
            raise
        return self.path


def write_states(
    path: str | os.PathLike,
    *,
    input_ids: Tensor,
    attention_mask: Tensor,
    target_next: Tensor,
    hidden: Mapping[LayerRef | int, Tensor],
    num_layers: int,
    vocab_size: int,
    target: str | None = None,
    loss_mask: Tensor | None = None,
    dtype: Any = "bf16",
    capture: Mapping | None = None,
    categories: Sequence[str | None] | None = None,
) -> Path:
    """Write a whole ``states.safetensors`` from in-memory tensors (atomically;
    see :class:`StatesWriter`). ``hidden`` maps LayerRefs or output-of ints to
    ``[B, S, T]`` and must include the embedding output (-1)."""
    keys = {(r if isinstance(r, LayerRef) else LayerRef(int(r))) for r in hidden}
    if EMBEDDING not in keys:
        raise UsageError("hidden must include the embedding output (-1): verify embeds tokens with it")
    if input_ids.ndim != 2:
        raise UsageError(f"input_ids must be [B, S], got shape {list(input_ids.shape)}")
    emb = next(v for r, v in hidden.items() if (r.output_of if isinstance(r, LayerRef) else int(r)) == -1)
    if emb.ndim != 3:
        raise UsageError(f"hidden states must be [B, S, T], got shape {list(emb.shape)}")
    b, s = input_ids.shape
    with StatesWriter(path, num_sequences=int(b), seq_len=int(s), hidden_size=int(emb.shape[-1]),
                      num_layers=num_layers, vocab_size=vocab_size, layers=keys, target=target,
                      dtype=dtype, with_loss_mask=loss_mask is not None, capture=capture,
                      categories=categories) as w:
        w.write(0, input_ids=input_ids, attention_mask=attention_mask, target_next=target_next,
                hidden=hidden, loss_mask=loss_mask)
    return Path(path)
