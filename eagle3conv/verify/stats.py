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


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(ln) * _betacf(a, b, x) / a
    return 1.0 - math.exp(ln) * _betacf(b, a, 1.0 - x) / b


def t_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom, t >= 0."""
    return 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile at ``p`` (0.5 <= p < 1) with ``df`` >= 1 degrees of freedom:
    bisection on :func:`t_tail`, to 1e-10 relative. Far tails (p = 1 - 1e-9) are exact
    here, where a normal quantile would be far too small for few degrees of freedom."""
    if not 0.5 <= p < 1.0 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and df >= 1, got p={p}, df={df}")
    tail = 1.0 - p
    if tail == 0.5:
        return 0.0
    lo, hi = 0.0, 1.0
    while t_tail(hi, df) > tail:
        lo, hi = hi, hi * 2.0
        if hi > 1e300:
            return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_tail(mid, df) > tail:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-10 * hi:
            break
    return hi


def paired_ratio_bound(num_a, den_a, num_b, den_b) -> tuple[float, float, int]:
    """sum(num_a)/sum(den_a) minus sum(num_b)/sum(den_b), two ratios measured on the same rows
    (sequences): (difference, its standard error, rows). The standard error is the delta
    method's over rows (each row's linearised contribution; rows resampled, as
    :func:`paired_mean_difference` does), so ``difference - q * se`` is a one-sided bound for
    any quantile ``q``, far in the tail where a bootstrap's few thousand rounds say nothing.
    Rows where either ``den`` is 0 say nothing and are dropped; with fewer than 2 rows left
    the error is infinite."""
    import numpy as np

    xa, na = np.asarray(num_a, float), np.asarray(den_a, float)
    xb, nb = np.asarray(num_b, float), np.asarray(den_b, float)
    keep = (na > 0) & (nb > 0) if len(na) == len(nb) else np.zeros(0, bool)
    xa, na, xb, nb = xa[keep], na[keep], xb[keep], nb[keep]
    n = int(keep.sum())
    if n == 0:
        return 0.0, math.inf, 0
    ra, rb = xa.sum() / na.sum(), xb.sum() / nb.sum()
    if n < 2:
        return float(ra - rb), math.inf, n
    lin = (xa - ra * na) / na.sum() - (xb - rb * nb) / nb.sum()
    se = math.sqrt(float((lin ** 2).sum()) * n / (n - 1))
    return float(ra - rb), se, n


def excluded_at(d: float, se: float, rows: int, alpha: float, comparisons: int = 1) -> bool:
    """Whether a paired difference ``d`` (standard error ``se`` over ``rows`` rows) is above 0
    at one-sided level ``alpha / comparisons`` (Student t, rows - 1 degrees of freedom)."""
    if rows < 2 or not math.isfinite(se) or alpha <= 0:
        return False
    if se == 0:
        return d > 0
    return d - t_quantile(1.0 - alpha / max(1, comparisons), rows - 1) * se > 0


def _rounds(a, f):
    """The drafts accepted in each greedy round of one sequence (see :func:`replay`)."""
    import numpy as np

    where = np.flatnonzero(f)
    if not where.size:
        return
    t, S = int(where[0]), len(f)
    while t < S and f[t]:
        yield int(a[t])
        t += int(a[t]) + 1


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

    accepted, rounds = [], []
    for a, f in zip(np.asarray(leading), np.asarray(full, dtype=bool)):
        got = list(_rounds(a, f))
        accepted.append(sum(got) + len(got))
        rounds.append(len(got))
    return accepted, rounds


def replay_histogram(leading, full, steps: int) -> list[list[int]]:
    """The rounds of :func:`replay` by accept length, per sequence: entry ``L - 1`` counts
    the rounds that emitted ``L`` tokens (``L - 1`` drafts accepted plus the target's own),
    ``L`` = 1 .. ``steps`` + 1. Summed over lengths, ``L * count`` gives replay's accepted
    tokens and ``count`` its rounds."""
    import numpy as np

    out = []
    for a, f in zip(np.asarray(leading), np.asarray(full, dtype=bool)):
        hist = [0] * (steps + 1)
        for acc in _rounds(a, f):
            hist[acc] += 1
        out.append(hist)
    return out


__all__ = [
    "bootstrap", "excluded_at", "paired_difference", "paired_mean_difference", "paired_ratio_bound",
    "replay", "replay_histogram", "t_quantile", "t_tail", "wilson",
]
