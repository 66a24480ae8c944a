"""Aux-layer sets: one explicit representation, every engine's numbering.

An EAGLE-3 drafter reads ``k`` hidden states of its target ("aux states"),
concatenated in a fixed slot order. Engines and trainers name those states by
integer ids, but the same id means different tensors to different tools.
This module names each tensor explicitly, as :class:`LayerRef` ("output of
layer i", 0-based, or "the embedding output"), and converts between those and
the ids of each numbering convention.

Conventions (``id`` is what a config or a launch flag holds; ``N`` is the
target's layer count; see docs/facts.md §5):

``output``
    TensorRT-LLM, SpecForge, Model Optimizer, AngelSlim. id ``i`` = output of
    layer ``i``, for ``0 <= i <= N-1``. eagle3conv reads id ``-1`` as the
    embedding output (the input of layer 0), so that a set such as
    ``[-1, 2, 30]`` has one meaning; no engine is known to capture it that way.
``input``
    vLLM, speculators, the original EAGLE code. id ``i`` = input of layer
    ``i`` = output of layer ``i-1``; id 0 = the embedding output; id ``N`` =
    output of the last layer (newer vLLM capture code reaches it).
``sglang-old``
    SGLang before PR #25454: explicit ids always get ``+1`` and the capture
    fires before that layer, so id ``i`` = output of layer ``i``, for
    ``0 <= i <= N-2``. The embedding output (id -1) fails (no residual before
    layer 0) and the last layer's output (id ``N-1``) is never reached.
``sglang-new``
    SGLang after PR #25454 (DeepSeek/Kimi path): ``+1`` only when the first id
    is 1. First id 1: ids read as in ``sglang-old``. Any other first id: ids are
    used raw as "capture before layer i", so id ``i`` = output of layer
    ``i-1``, for ``1 <= i <= N-1``; raw id 0 (the embedding) fails as above.
    Writing ids, eagle3conv prefers the first-id-1 form when it exists (old
    SGLang reads it the same way). The facts doc places the PR on the DeepSeek
    path; other model files may still read ids as ``sglang-old``.
``captured-at-input``
    Dump files named "captured at the input of layer L": L = output of layer
    ``L-1``; L = 0 is the embedding output; ``0 <= L <= N-1``.

The ``sglang-old``/``sglang-new`` conventions here read a list of ids as one of
SGLang's two numberings (the DeepSeek path before and after PR #25454). Which ids to
*write* for SGLang, per target family and release, comes from the engine rules
(:func:`eagle3conv.spec.engines.sglang_ids`), not from this module.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from types import MappingProxyType

from eagle3conv.errors import UsageError, WiringError


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
    """A numbering of aux states. ``decode``/``encode`` see the whole id list,
    because one convention (``sglang-new``) depends on the first id."""

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


_SGLANG_EMBEDDING = (
    "SGLang captures the residual stream before a layer runs, and before layer 0 "
    "there is no residual, so it cannot capture the embedding output"
)
_SGLANG_LAST = (
    "SGLang captures before a layer runs, so it reaches neither the embedding output "
    "nor the last layer's output"
)


def _reject_embedding_for_sglang(refs: LayerSet, convention: str) -> None:
    for slot, ref in enumerate(refs):
        if ref.is_embedding:
            raise WiringError(
                f"the embedding output (slot {slot}) cannot be expressed in {convention} ids: "
                f"{_SGLANG_EMBEDDING}"
            )


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


def _sglang_old_decode(ids: tuple[int, ...], n: int | None) -> LayerSet:
    for slot, i in enumerate(ids):
        if i == -1:
            raise WiringError(f"sglang-old id -1 (slot {slot}) fails: {_SGLANG_EMBEDDING}")
    _check_id_range(ids, "sglang-old", 0, _last(n, -1), _SGLANG_LAST)
    return tuple(LayerRef(i) for i in ids)


def _sglang_old_encode(refs: LayerSet, n: int | None) -> tuple[int, ...]:
    _reject_embedding_for_sglang(refs, "sglang-old")
    _check_ref_range(refs, "sglang-old", _last(n, -1), _SGLANG_LAST)
    return tuple(r.output_of for r in refs)


def _sglang_new_decode(ids: tuple[int, ...], n: int | None) -> LayerSet:
    if ids and ids[0] == 1:
        _check_id_range(ids, "sglang-new (first id 1)", 0, _last(n, -1), _SGLANG_LAST)
        return tuple(LayerRef(i) for i in ids)
    for slot, i in enumerate(ids):
        if i == 0:
            raise WiringError(
                f"sglang-new id 0 (slot {slot}) is used raw as 'before layer 0' and fails: "
                f"{_SGLANG_EMBEDDING}"
            )
    _check_id_range(ids, "sglang-new (raw ids)", 1, _last(n, 0), _SGLANG_LAST)
    return tuple(LayerRef(i - 1) for i in ids)


def _sglang_new_encode(refs: LayerSet, n: int | None) -> tuple[int, ...]:
    _reject_embedding_for_sglang(refs, "sglang-new")
    _check_ref_range(refs, "sglang-new", _last(n, -1), _SGLANG_LAST)
    if refs and refs[0] == LayerRef(1):
        return tuple(r.output_of for r in refs)  # first id 1: same ids as old SGLang
    if refs and refs[0] == LayerRef(0):
        raise WiringError(
            "the output of layer 0 in the first slot cannot be expressed in sglang-new ids: "
            "its raw id would be 1, and a first id of 1 switches new SGLang to "
            "'output of layer i', where it means the output of layer 1"
        )
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
        "sglang-old",
        "SGLang before PR #25454: always adds 1, so id i = output of layer i",
        ("SGLang before PR #25454",),
        _sglang_old_decode,
        _sglang_old_encode,
    ),
    Convention(
        "sglang-new",
        "SGLang after PR #25454: first id 1 -> id i = output of layer i; "
        "otherwise ids used raw, id i = output of layer i-1",
        ("SGLang after PR #25454 (DeepSeek/Kimi path)",),
        _sglang_new_decode,
        _sglang_new_encode,
    ),
    Convention(
        "captured-at-input",
        "dumps named 'captured at the input of layer L': L = output of layer L-1",
        ("SGLang-style aux dumps",),
        _captured_decode,
        _captured_encode,
    ),
)

ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "trtllm": "output",
        "tensorrt-llm": "output",
        "specforge": "output",
        "modelopt": "output",
        "angelslim": "output",
        "vllm": "input",
        "speculators": "input",
        "eagle": "input",
    }
)

# Names that sound like a convention but are not one.
_AMBIGUOUS: Mapping[str, str] = MappingProxyType(
    {
        "sglang": "SGLang changed its numbering in PR #25454: say 'sglang-old' or "
        "'sglang-new', or give the target (--target) so the engine rules pick the ids",
    }
)


def convention_names(*, with_aliases: bool = True) -> tuple[str, ...]:
    """Every name :func:`get_convention` accepts (for CLI choices)."""
    return tuple(CONVENTIONS) + (tuple(ALIASES) if with_aliases else ())


def get_convention(name: str | Convention) -> Convention:
    """Look up a convention by name or alias (case and ``_``/``-`` insensitive)."""
    if isinstance(name, Convention):
        return name
    key = name.strip().lower().replace("_", "-")
    if key in _AMBIGUOUS:
        raise UsageError(f"'{name}' is ambiguous: {_AMBIGUOUS[key]}")
    key = ALIASES.get(key, key)
    if key not in CONVENTIONS:
        raise UsageError(
            f"unknown layer numbering '{name}'; known: {', '.join(convention_names())}"
        )
    return CONVENTIONS[key]


# --------------------------------------------------------------------------- conversions


def _as_ids(ids: Iterable[int]) -> tuple[int, ...]:
    out = tuple(ids)
    for i in out:
        if isinstance(i, bool) or not isinstance(i, int):
            raise UsageError(f"layer ids must be integers, got {i!r} in {list(out)}")
    return out


def _check_num_layers(num_layers: int | None) -> None:
    if num_layers is None:
        return
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise UsageError(f"the target's layer count must be a positive integer, got {num_layers!r}")


def _check_distinct(items: Sequence[object], what: str) -> None:
    for slot, item in enumerate(items):
        if item in items[:slot]:
            raise WiringError(f"{what} repeat {item} (slot {slot}): each slot needs its own state")


def validate_refs(refs: Iterable[LayerRef], num_layers: int | None = None) -> LayerSet:
    """Return ``refs`` as a LayerSet after checking each exists in an ``num_layers``-layer
    target and none repeats. Raises :class:`WiringError`."""
    _check_num_layers(num_layers)
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
    _check_num_layers(num_layers)
    id_tuple = _as_ids(ids)
    _check_distinct([f"id {i}" for i in id_tuple], f"the {conv.name} ids {list(id_tuple)}")
    return validate_refs(conv.decode(id_tuple, num_layers), num_layers)


def to_ids(
    refs: Iterable[LayerRef], convention: str | Convention, num_layers: int | None = None
) -> tuple[int, ...]:
    """Write explicit tensors as ids of ``convention``; the inverse of :func:`to_refs`.

    Raises :class:`WiringError`, in plain words, when the set cannot be expressed
    (the embedding output in SGLang, the last layer's output in SGLang, ...).
    ``sglang-new`` prefers ids old SGLang reads the same way.
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


# --------------------------------------------------------------------------- defaults


@dataclass(frozen=True)
class EngineDefault:
    """What a tool captures when no ids are configured."""

    key: str
    who: str
    convention: str
    ids: tuple[int, ...]
    refs: LayerSet
    note: str


def engine_defaults(num_layers: int) -> Mapping[str, EngineDefault]:
    """Each engine's/trainer's default aux ids for an ``num_layers``-layer target.

    Keys: ``output`` (TensorRT-LLM, SpecForge, Model Optimizer, AngelSlim),
    ``input`` (vLLM, speculators, EAGLE), ``sglang`` (SGLang's fallback, loop
    indices used raw), ``specforge-2025-09`` (SpecForge online runs between
    2025-09-01 and 2025-10-20, SpecForge #240). The first three name the same
    tensors: outputs of layers 1, N//2-1, N-4. Below 9 layers some defaults
    repeat a layer, as the tools themselves would.
    """
    _check_num_layers(num_layers)
    n = num_layers
    if n < 4:
        raise UsageError(
            f"the engines' default aux layers need a target of at least 4 layers, got {n}; "
            "give the aux ids explicitly"
        )
    rows = (
        (
            "output",
            "TensorRT-LLM, SpecForge, Model Optimizer, AngelSlim",
            "output",
            (1, n // 2 - 1, n - 4),
            "ids are outputs of layers",
        ),
        (
            "input",
            "vLLM, speculators, original EAGLE code",
            "input",
            (2, n // 2, n - 3),
            "ids are inputs of layers",
        ),
        (
            "sglang",
            "SGLang (no ids configured)",
            "input",
            (2, n // 2, n - 3),
            f"SGLang's fallback uses loop indices [2, {n // 2}, {n - 3}] raw (capture before "
            f"layer i); as explicit SGLang ids, old or new, that is [1, {n // 2 - 1}, {n - 4}]",
        ),
        (
            "specforge-2025-09",
            "SpecForge online, 2025-09-01..2025-10-20 (SpecForge #240)",
            "output",
            (1, n // 2, n - 4),
            "middle layer N//2 instead of N//2-1: matches no engine default",
        ),
    )
    # decode() directly: small targets repeat layers, which to_refs() would refuse.
    return MappingProxyType(
        {
            key: EngineDefault(key, who, conv, ids, CONVENTIONS[conv].decode(ids, n), note)
            for key, who, conv, ids, note in rows
        }
    )
