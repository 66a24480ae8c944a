"""Aux-layer sets: one explicit representation, and the numberings training records use.

An EAGLE-3 drafter reads ``k`` hidden states of its target ("aux states"),
concatenated in a fixed slot order. Trainers record them as integer ids, in
one of a few numberings; engines read config ids by their own rules, per
release and target family. This module names each tensor explicitly, as
:class:`LayerRef` ("output of layer i", 0-based, or "the embedding output"),
and converts between those and the ids of a training record's numbering.
How an *engine* reads ids is not here: :mod:`eagle3conv.spec.engines` (the
engine rules, ``mappings/engines/``) is the one model of that.

Numberings of records (``id`` as a record or dump holds it; ``N`` is the
target's layer count; see docs/facts.md §5):

``output``
    TensorRT-LLM, SpecForge, Model Optimizer, AngelSlim. id ``i`` = output of
    layer ``i``, for ``0 <= i <= N-1``. eagle3conv reads id ``-1`` as the
    embedding output (the input of layer 0), so that a set such as
    ``[-1, 2, 30]`` has one meaning.
``input``
    vLLM, speculators, the original EAGLE code. id ``i`` = input of layer
    ``i`` = output of layer ``i-1``; id 0 = the embedding output; id ``N`` =
    output of the last layer.
``captured-at-input``
    Dump files named "captured at the input of layer L": L = output of layer
    ``L-1``; L = 0 is the embedding output; ``0 <= L <= N-1``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from types import MappingProxyType

from eagle3conv.errors import UsageError, WiringError

# The most layers (a target's layer count, a drafter's decoder layers, its aux slots) eagle3conv takes
# from a file: every range built from such a count stays this small. The deepest targets of
# mappings/targets have 94 layers (Qwen3-235B-A22B) and a drafter has a few; 65,536 is far past any
# model, and a count past it (10^18 in a weight name, 2^31-1 in a config) is an error, never a loop.
MAX_LAYERS = 65_536


@dataclass(frozen=True, order=True)
class LayerRef:
    """One target hidden state: the output of layer ``output_of`` (0-based).

    ``output_of == -1`` is the embedding output, i.e. the input of layer 0.
    """

    output_of: int

    def __post_init__(self) -> None:
        if isinstance(self.output_of, bool) or not isinstance(self.output_of, int):
            raise UsageError(f"a layer index must be an integer, got {self.output_of!r}")
        if self.output_of < -1:
            raise UsageError(
                f"a layer index must be -1 (the embedding output) or a layer number, "
                f"got {self.output_of}"
            )

    @property
    def is_embedding(self) -> bool:
        return self.output_of == -1

    def __str__(self) -> str:
        return "embedding output" if self.is_embedding else f"output of layer {self.output_of}"


EMBEDDING = LayerRef(-1)

LayerSet = tuple[LayerRef, ...]
"""Aux states in slot order (the order of ``fc``'s input chunks)."""


def outputs(*layers: int) -> LayerSet:
    """``outputs(2, 30, 58)``: the outputs of those layers, in that slot order."""
    return tuple(LayerRef(i) for i in layers)


# --------------------------------------------------------------------------- conventions

Decode = Callable[[tuple[int, ...], int | None], LayerSet]
Encode = Callable[[LayerSet, int | None], tuple[int, ...]]


@dataclass(frozen=True)
class Convention:
    """A numbering of aux states in a training record (``decode``/``encode`` see the whole id list)."""

    name: str
    description: str
    used_by: tuple[str, ...]
    decode: Decode
    encode: Encode


def _check_id_range(
    ids: tuple[int, ...], convention: str, low: int, high: int | None, why: str
) -> None:
    for slot, i in enumerate(ids):
        if i < low or (high is not None and i > high):
            span = f"{low}..{high}" if high is not None else f">= {low}"
            raise WiringError(f"{convention} id {i} (slot {slot}) is out of range {span}: {why}")


def _check_ref_range(refs: LayerSet, convention: str, last: int | None, why: str) -> None:
    """``last`` is the last ``output_of`` the convention can name (None: unbounded)."""
    for slot, ref in enumerate(refs):
        if last is not None and ref.output_of > last:
            raise WiringError(
                f"the {ref} (slot {slot}) cannot be expressed in {convention} ids: {why}"
            )


def _last(num_layers: int | None, offset: int) -> int | None:
    return None if num_layers is None else num_layers - 1 + offset


def _output_decode(ids: tuple[int, ...], n: int | None) -> LayerSet:
    _check_id_range(ids, "output", -1, _last(n, 0), "the target has no such layer")
    return tuple(LayerRef(i) for i in ids)


def _output_encode(refs: LayerSet, n: int | None) -> tuple[int, ...]:
    return tuple(r.output_of for r in refs)


def _input_decode(ids: tuple[int, ...], n: int | None) -> LayerSet:
    _check_id_range(ids, "input", 0, n, "the target has no such layer")
    return tuple(LayerRef(i - 1) for i in ids)


def _input_encode(refs: LayerSet, n: int | None) -> tuple[int, ...]:
    return tuple(r.output_of + 1 for r in refs)


def _captured_decode(ids: tuple[int, ...], n: int | None) -> LayerSet:
    _check_id_range(ids, "captured-at-input", 0, _last(n, 0), "the target has no such layer")
    return tuple(LayerRef(i - 1) for i in ids)


def _captured_encode(refs: LayerSet, n: int | None) -> tuple[int, ...]:
    _check_ref_range(refs, "captured-at-input", _last(n, -1), "no layer takes it as input")
    return tuple(r.output_of + 1 for r in refs)


def _registry(*conventions: Convention) -> Mapping[str, Convention]:
    return MappingProxyType({c.name: c for c in conventions})


CONVENTIONS: Mapping[str, Convention] = _registry(
    Convention(
        "output",
        "id i = output of layer i (0-based); -1 = the embedding output",
        ("TensorRT-LLM", "SpecForge", "Model Optimizer", "AngelSlim"),
        _output_decode,
        _output_encode,
    ),
    Convention(
        "input",
        "id i = input of layer i = output of layer i-1; 0 = the embedding output",
        ("vLLM", "speculators", "original EAGLE code"),
        _input_decode,
        _input_encode,
    ),
    Convention(
        "captured-at-input",
        "dumps named 'captured at the input of layer L': L = output of layer L-1",
        ("SGLang-style aux dumps",),
        _captured_decode,
        _captured_encode,
    ),
)

def convention_names() -> tuple[str, ...]:
    """Every numbering :func:`get_convention` accepts."""
    return tuple(CONVENTIONS)


def get_convention(name: str | Convention) -> Convention:
    """Look up a record numbering by name (case and ``_``/``-`` insensitive)."""
    if isinstance(name, Convention):
        return name
    key = name.strip().lower().replace("_", "-")
    if key not in CONVENTIONS:
        raise UsageError(
            f"unknown layer numbering '{name}'; known: {', '.join(convention_names())} (how an engine reads "
            "ids depends on its release and the target: --engine ENGINE==RELEASE with --target)"
        )
    return CONVENTIONS[key]


# --------------------------------------------------------------------------- conversions


def _as_ids(ids: Iterable[int]) -> tuple[int, ...]:
    out = tuple(ids)
    for i in out:
        if isinstance(i, bool) or not isinstance(i, int):
            raise UsageError(f"layer ids must be integers, got {i!r} in {list(out)}")
    return out


def check_num_layers(num_layers: int | None) -> None:
    """A target layer count is a positive integer (or None: unknown)."""
    if num_layers is None:
        return
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise UsageError(f"the target's layer count must be a positive integer, got {num_layers!r}")
    if num_layers > MAX_LAYERS:
        raise UsageError(f"the target's layer count is {num_layers}; eagle3conv takes at most {MAX_LAYERS}")


def _check_distinct(items: Sequence[object], what: str) -> None:
    for slot, item in enumerate(items):
        if item in items[:slot]:
            raise WiringError(f"{what} repeat {item} (slot {slot}): each slot needs its own state")


def validate_refs(refs: Iterable[LayerRef], num_layers: int | None = None) -> LayerSet:
    """Return ``refs`` as a LayerSet after checking each exists in an ``num_layers``-layer
    target and none repeats. Raises :class:`WiringError`."""
    check_num_layers(num_layers)
    out = tuple(refs)
    for slot, ref in enumerate(out):
        if not isinstance(ref, LayerRef):
            raise UsageError(f"slot {slot} is not a LayerRef: {ref!r}")
        if num_layers is not None and ref.output_of >= num_layers:
            raise WiringError(
                f"slot {slot} names the output of layer {ref.output_of}, "
                f"but the target has {num_layers} layers (0..{num_layers - 1})"
            )
    _check_distinct([f"the {r}" for r in out], f"the aux layers ({describe(out)})")
    return out


def to_refs(
    ids: Iterable[int], convention: str | Convention, num_layers: int | None = None
) -> LayerSet:
    """Read ``ids`` in ``convention`` as explicit tensors of an ``num_layers``-layer target.

    ``num_layers=None`` skips the upper-bound checks. Raises :class:`WiringError`
    for ids out of range, ids the engine cannot capture, or repeated states, and
    :class:`UsageError` for an unknown convention or non-integer ids.
    """
    conv = get_convention(convention)
    check_num_layers(num_layers)
    id_tuple = _as_ids(ids)
    _check_distinct([f"id {i}" for i in id_tuple], f"the {conv.name} ids {list(id_tuple)}")
    return validate_refs(conv.decode(id_tuple, num_layers), num_layers)


def to_ids(
    refs: Iterable[LayerRef], convention: str | Convention, num_layers: int | None = None
) -> tuple[int, ...]:
    """Write explicit tensors as ids of ``convention``; the inverse of :func:`to_refs`.

    Raises :class:`WiringError`, in plain words, when the set cannot be expressed
    (the last layer's output as a captured-at-input id, ...).
    """
    conv = get_convention(convention)
    ref_tuple = validate_refs(refs, num_layers)
    return conv.encode(ref_tuple, num_layers)


def convert(
    ids: Iterable[int],
    source: str | Convention,
    dest: str | Convention,
    num_layers: int | None = None,
) -> tuple[int, ...]:
    """Renumber ``ids`` from ``source`` to ``dest`` (same tensors)."""
    return to_ids(to_refs(ids, source, num_layers), dest, num_layers)


def is_ascending(items: Iterable[int] | Iterable[LayerRef]) -> bool:
    """True when ids (or refs, by depth) strictly increase: the usual shallow-to-deep order."""
    keys = [x.output_of if isinstance(x, LayerRef) else x for x in items]
    return all(a < b for a, b in pairwise(keys))


def parse_ids(text: str) -> tuple[int, ...]:
    """Parse ``"2,30,58"``, ``"[2, 30, 58]"`` or ``"2 30 58"`` into ids."""
    body = text.strip().removeprefix("[").removesuffix("]").strip()
    if not body:
        return ()
    parts = re.split(r"\s*,\s*|\s+", body)
    if any(p == "" for p in parts):
        raise UsageError(f"layer ids must be integers separated by commas, got '{text}' (an empty entry)")
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(f"layer ids must be integers separated by commas, got '{text}'") from None


def describe(refs: Iterable[LayerRef]) -> str:
    """Plain words: ``"outputs of layers 2, 30, 58"``,
    ``"the embedding output and outputs of layers 2, 30"``."""
    items = tuple(refs)
    if not items:
        return "no layers"
    if any(r.is_embedding for r in items[1:]):
        return ", ".join("the embedding output" if r.is_embedding else str(r) for r in items)
    layers = [r.output_of for r in items if not r.is_embedding]
    parts = []
    if items[0].is_embedding:
        parts.append("the embedding output")
    if len(layers) == 1:
        parts.append(f"output of layer {layers[0]}")
    elif layers:
        parts.append("outputs of layers " + ", ".join(map(str, layers)))
    return " and ".join(parts)
