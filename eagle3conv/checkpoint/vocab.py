"""The draft-vocab maps `d2t` and `t2d`: checks and repairs.

Engine contract (SGLang llama_eagle3.py: ``hot_token_id = d2t + arange``):
``target_id = draft_id + d2t[draft_id]``. Trainers build the draft vocab from
the sorted set of frequent target ids, so valid target ids are strictly
increasing and, as offsets, ``d2t`` is non-decreasing and non-negative.

An *absolute* ``d2t`` (target ids stored directly) is the classic mistake: it
is strictly increasing, and read as offsets it maps most draft ids to the
wrong token (often past the vocab). We tell the two apart by what each reading
implies, and refuse to guess when both are plausible and nothing else decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from eagle3conv.findings import (
    D2T_ABSOLUTE,
    D2T_AMBIGUOUS,
    D2T_CAST,
    D2T_DTYPE,
    D2T_NOT_INCREASING,
    D2T_OUT_OF_VOCAB,
    D2T_SHAPE,
    D2T_UNCHECKED,
    NO_D2T,
    T2D_DISAGREES,
    T2D_REBUILT,
    T2D_SHAPE,
    VOCAB,
    Finding,
)


@dataclass
class VocabResult:
    d2t: np.ndarray | None  # offsets to write (int64), None when no d2t is written
    t2d: np.ndarray | None  # bool [V] to write, None when none is written
    d2t_changed: bool = False
    t2d_changed: bool = False
    findings: list[Finding] = field(default_factory=list)
    reading: str | None = None  # offsets | absolute | identity
    target_ids: np.ndarray | None = None

    @property
    def errors(self) -> list[str]:
        return [f.message for f in self.findings if f.level == "error"]

    @property
    def notices(self) -> list[str]:
        return [f.message for f in self.findings if f.level != "error"]

    def _add(self, level: str, code: str, message: str) -> None:
        self.findings.append(Finding(level, VOCAB, code, message))  # type: ignore[arg-type]


def _strictly_increasing(a: np.ndarray) -> bool:
    return a.size < 2 or bool(np.all(a[1:] > a[:-1]))


def _in_range(a: np.ndarray, v: int) -> bool:
    return a.size == 0 or (int(a.min()) >= 0 and int(a.max()) < v)


def check_vocab(d2t: np.ndarray | None, t2d: np.ndarray | None, vocab_size: int | None, draft_vocab_size: int) -> VocabResult:
    """Decide what d2t and t2d to write for a head of ``draft_vocab_size`` rows."""
    res = VocabResult(d2t=None, t2d=None)
    V, Vd = vocab_size, draft_vocab_size
    pruned = V is not None and Vd != V
    if d2t is None:
        if pruned:
            res._add(
                "error", NO_D2T,
                f"lm_head has {Vd} rows but vocab_size is {V} and there is no d2t: "
                "engines cannot map draft ids to target ids"
            )
        if t2d is not None and V is not None:
            if t2d.shape != (V,):
                res._add("error", T2D_SHAPE, f"t2d has shape {list(t2d.shape)}, expected [{V}] (vocab_size)")
            else:
                res.t2d = t2d.astype(bool)
        return res
    if d2t.ndim != 1 or d2t.shape[0] != Vd:
        res._add("error", D2T_SHAPE, f"d2t has shape {list(d2t.shape)}, expected [{Vd}] (lm_head rows)")
        return res
    if not np.issubdtype(d2t.dtype, np.integer):
        res._add("error", D2T_DTYPE, f"d2t has dtype {d2t.dtype}; it must hold integer offsets")
        return res
    if d2t.dtype != np.int64:
        res._add("notice", D2T_CAST, f"d2t converted from {d2t.dtype} to int64 (what SGLang and vLLM index with)")
        res.d2t_changed = True
    d = d2t.astype(np.int64)
    if V is None:
        res._add("error", D2T_UNCHECKED, "config.json has no vocab_size: cannot check d2t against the target vocab")
        return res
    ar = np.arange(Vd, dtype=np.int64)
    as_offsets = ar + d
    off_ok = _in_range(as_offsets, V) and _strictly_increasing(as_offsets)
    abs_ok = _in_range(d, V) and _strictly_increasing(d) and bool(np.any(d != as_offsets))
    t2d_bool = None
    if t2d is not None:
        if t2d.shape != (V,):
            res._add("error", T2D_SHAPE, f"t2d has shape {list(t2d.shape)}, expected [{V}] (vocab_size)")
            t2d = None
        else:
            t2d_bool = t2d.astype(bool)

    def agrees(ids):
        return t2d_bool is not None and int(t2d_bool.sum()) == Vd and bool(t2d_bool[ids].all())

    if off_ok and abs_ok:
        if t2d_bool is not None and agrees(d) and not agrees(as_offsets):
            off_ok = False
        elif t2d_bool is not None and agrees(as_offsets):
            abs_ok = False
        else:
            res._add(
                "error", D2T_AMBIGUOUS,
                "d2t reads as valid offsets and as valid absolute target ids, and no t2d decides between them",
                )
            return res
    if off_ok:
        res.reading = "offsets" if np.any(d) else "identity"
        tids = as_offsets
    elif abs_ok:
        res.reading = "absolute"
        tids = d
        d = tids - ar
        res.d2t_changed = True
        res._add(
            "notice", D2T_ABSOLUTE,
            "d2t held absolute target ids, not offsets: converted to offsets "
            "(target_id = draft_id + d2t[draft_id], as SGLang and vLLM read it)"
        )
    else:
        bad = np.nonzero((as_offsets < 0) | (as_offsets >= V))[0]
        if bad.size:
            res._add(
                "error", D2T_OUT_OF_VOCAB,
                f"d2t maps draft id {int(bad[0])} to target id {int(as_offsets[bad[0]])}, outside the vocab [0, {V})"
                f" ({bad.size} such ids)"
            )
        else:
            i = int(np.nonzero(as_offsets[1:] <= as_offsets[:-1])[0][0])
            res._add(
                "error", D2T_NOT_INCREASING,
                f"d2t target ids are not strictly increasing (draft ids {i} and {i + 1} map to "
                f"{int(as_offsets[i])} and {int(as_offsets[i + 1])}): two draft ids share a token or the map is scrambled"
            )
        return res
    res.d2t = d
    res.target_ids = tids
    expected = np.zeros(V, dtype=bool)
    expected[tids] = True
    if t2d_bool is None:
        if pruned:
            res.t2d = expected
            res.t2d_changed = True
            res._add("notice", T2D_REBUILT, "t2d was missing: rebuilt from d2t (engines ignore it, trainers and vLLM's converter read it)")
    elif not np.array_equal(t2d_bool, expected):
        diff = int(np.count_nonzero(t2d_bool != expected))
        res._add(
            "error", T2D_DISAGREES,
            f"t2d disagrees with d2t at {diff} target ids (t2d marks {int(t2d_bool.sum())} ids, d2t maps to {Vd})"
        )
    else:
        res.t2d = t2d_bool
        res.t2d_changed = t2d.dtype != np.bool_
    return res
