"""The statistics of ``verify``: intervals, the paired wiring comparison, and the greedy replay.

Pure numpy on plain numbers and arrays: nothing here knows about drafters,
states or torch. Every interval is 95%.
"""

from __future__ import annotations

import math
from typing import Any


def wilson(k: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of ``k`` successes in ``n`` trials; (0, 1) when ``n`` is 0."""
    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def bootstrap(num, den, rounds: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95% interval of sum(num)/sum(den) resampling sequences (rows)."""
    import numpy as np

    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(num), size=(rounds, len(num)))
    n, d = num[idx].sum(1), den[idx].sum(1)
    ratio = np.where(d > 0, n / np.maximum(d, 1e-12), np.nan)
    ratio = ratio[~np.isnan(ratio)]
    if ratio.size == 0:
        return (0.0, 1.0)
    lo, hi = np.percentile(ratio, [2.5, 97.5])
    return (float(lo), float(hi))


def paired_difference(a: Any, b: Any, rounds: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Accept length of ``a`` minus ``b`` on the same sequences: (difference, 95% low, high),
    resampling sequences jointly. Far more sensitive than comparing two separate
    intervals, because both wirings are scored on the very same positions.

    ``a`` and ``b`` are scores (:class:`eagle3conv.verify.evaluate.Score`): per-sequence
    ``chain_accepted`` and ``chains``, and ``accept_length_all``."""
    import numpy as np

    xa, na = np.asarray(a.chain_accepted, float), np.asarray(a.chains, float)
    xb, nb = np.asarray(b.chain_accepted, float), np.asarray(b.chains, float)
    if len(xa) != len(xb) or not len(xa):
        return (a.accept_length_all - b.accept_length_all, -math.inf, math.inf)
    keep = (na > 0) & (nb > 0)  # sequences without a full chain say nothing
    xa, na, xb, nb = xa[keep], na[keep], xb[keep], nb[keep]
    if not len(xa):
        return (a.accept_length_all - b.accept_length_all, -math.inf, math.inf)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(xa), size=(rounds, len(xa)))
    da = xa[idx].sum(1) / na[idx].sum(1)
    db = xb[idx].sum(1) / nb[idx].sum(1)
    lo, hi = np.percentile(da - db, [2.5, 97.5])
    return (a.accept_length_all - b.accept_length_all, float(lo), float(hi))


def paired_mean_difference(num_a, den_a, num_b, den_b, rounds: int = 2000,
                           seed: int = 0) -> tuple[float, float, float]:
    """sum(num_a)/sum(den_a) minus sum(num_b)/sum(den_b), two statistics measured on the same
    sequences (rows): (difference, 95% low, high), resampling sequences jointly, as
    :func:`paired_difference` does for accept lengths. Rows where either ``den`` is 0 say
    nothing and are dropped; with no row left the interval is unbounded."""
    import numpy as np

    xa, na = np.asarray(num_a, float), np.asarray(den_a, float)
    xb, nb = np.asarray(num_b, float), np.asarray(den_b, float)
    keep = (na > 0) & (nb > 0) if len(na) == len(nb) else np.zeros(0, bool)
    if not keep.any():
        d = (xa.sum() / na.sum() if na.sum() else 0.0) - (xb.sum() / nb.sum() if nb.sum() else 0.0)
        return (float(d), -math.inf, math.inf)
    xa, na, xb, nb = xa[keep], na[keep], xb[keep], nb[keep]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(xa), size=(rounds, len(xa)))
    d = xa[idx].sum(1) / na[idx].sum(1) - xb[idx].sum(1) / nb[idx].sum(1)
    lo, hi = np.percentile(d, [2.5, 97.5])
    return (float(xa.sum() / na.sum() - xb.sum() / nb.sum()), float(lo), float(hi))


def replay(leading, full) -> tuple[list[int], list[int]]:
    """Greedy chain decoding replayed on teacher-forced results, per sequence.

    ``leading[b, t]``: drafts accepted in a row by the chain started at position t
    of sequence b; ``full[b, t]``: that chain has a reference for every draft.
    From the first full chain of each sequence, a round accepts ``leading[t]``
    drafts plus the target's own token and the next round starts
    ``leading[t] + 1`` positions later (exact where the sequence is the target's
    own greedy output, as generated responses are). Returns (accepted tokens,
    rounds) per sequence."""
    import numpy as np

    a_all, f_all = np.asarray(leading), np.asarray(full, dtype=bool)
    accepted, rounds = [], []
    for a, f in zip(a_all, f_all):
        where = np.flatnonzero(f)
        acc = n = 0
        if where.size:
            t, S = int(where[0]), len(f)
            while t < S and f[t]:
                acc += 1 + int(a[t])
                n += 1
                t += int(a[t]) + 1
        accepted.append(acc)
        rounds.append(n)
    return accepted, rounds


__all__ = ["bootstrap", "paired_difference", "paired_mean_difference", "replay", "wilson"]
