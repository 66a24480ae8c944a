"""``verify``: the drafter forward on captured target states, acceptance, and the wiring diagnosis.

Data flow::

    drafter folder ──load──▶ Eagle3Drafter (strict)          states (eagle3conv file, SGLang dumps,
    config + records ──gather/check──▶ the config's wiring    SpecForge records) ──batches──▶
    candidates (config, ±1, with embedding, defaults, …) ──evaluate each──▶ Score ──▶ report

What is measured, for a wiring (the aux layers fed to ``fc``, in slot order):

* **Teacher-forced top-1 acceptance per draft position.** The chain started at
  position t (after the target emitted token t+1) drafts tokens t+2, t+3, …
  exactly as SGLang runs it (step 1 from the aux states, steps 2+ from the
  drafter's own state, EAGLE-3 training-time-test attention, ``d2t`` mapping).
  Draft k is compared with ``target_next[t+k]``, the target's own greedy token
  at that position. A position counts when it is a real token and (when the
  states mark one) inside the loss mask, e.g. the target's generated response.
* **Accept length**: over chain starts whose K drafts all have a reference,
  ``1 + leading matches`` (the target's own token plus the drafts a greedy
  verifier accepts). Conditional acceptance of draft k given drafts 1..k-1 is
  reported too.
* **Confidence intervals**: 95%, by bootstrap over sequences (positions in one
  sequence are correlated); with fewer than 5 sequences, Wilson intervals over
  positions, and the report says so.
* **Norm fingerprint**: per aux slot, the per-token L2 norm of the inference
  states (median, p10, p90; **position 0 of every sequence excluded**, as its
  massive activations dominate plain means) next to the training statistics
  from ``training_metadata.json``; a slot whose median differs by more than 2x
  is flagged. The embedding output's norm is far from a deep layer's.
* **Wiring search** (``search=True``): scores the config's wiring, the training
  record's, each shifted by one either way, the embedding-included variant,
  each engine's default, and per-slot moves of 1 and 2, among the layers the
  states hold. The best by accept length is named when the paired 95% interval
  of its lead over the runner-up (both scored on the same sequences, resampled
  together) excludes zero. Otherwise the training record's or the config's
  wiring stands when it is among the leaders and its norms are in line; the
  norm fingerprint overturns it only when they are out of line (a coarse
  signal: embedding vs deep layer, not neighbours); else "ambiguous". Fewer than
  ``MIN_SEARCH_SEQUENCES`` sequences: nothing is named. The report says which
  evidence decided.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3conv.errors import CheckpointReadError, FolderBusyError, UsageError, VerifyFailedError, WiringError
from eagle3conv.wiring.layers import EMBEDDING, LayerRef, LayerSet, describe, engine_defaults, to_ids, to_refs

REPORT_FILE = "eagle3conv-verify.json"
MIN_SEARCH_SEQUENCES = 10  # below this, sequence-bootstrap intervals are not worth naming a wiring on
NORM_FLAG_RATIO = 2.0
Progress = Callable[[int, int], None]


# --------------------------------------------------------------------------- statistics


def wilson(k: float, n: float, z: float = 1.96) -> tuple[float, float]:
    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def paired_difference(a: Score, b: Score, rounds: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Accept length of ``a`` minus ``b`` on the same sequences: (difference, 95% low, high),
    resampling sequences jointly. Far more sensitive than comparing two separate
    intervals, because both wirings are scored on the very same positions."""
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


def _bootstrap(num, den, rounds: int = 1000, seed: int = 0) -> tuple[float, float]:
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


# --------------------------------------------------------------------------- results


@dataclass
class Candidate:
    name: str
    layers: LayerSet
    why: str


@dataclass
class Score:
    candidate: Candidate
    steps: int
    matched: list[list[int]]  # [K][sequences]
    counted: list[list[int]]  # [K][sequences]
    chain_accepted: list[int]  # per sequence: sum over full chains of (1 + leading matches)
    chains: list[int]  # per sequence: full chains
    cond_matched: list[int]  # [K]: draft k matched given 1..k-1 matched
    cond_counted: list[int]
    norms: list[dict]  # per slot: median, p10, p90, tokens
    replay_accepted: list[int] = field(default_factory=list)  # per sequence: sum over greedy rounds of 1 + A
    replay_rounds: list[int] = field(default_factory=list)  # per sequence: greedy verification rounds
    seconds: float = 0.0
    ci_method: str = ""
    acceptance: list[float] = field(default_factory=list)
    acceptance_ci: list[tuple[float, float]] = field(default_factory=list)
    accept_length: float = 0.0  # tokens per target forward of greedy chain decoding (round-boundary replay)
    accept_length_ci: tuple[float, float] = (1.0, 1.0)
    accept_length_all: float = 0.0  # the same, averaged over every chain start (ranks wirings; lower variance)
    accept_length_all_ci: tuple[float, float] = (1.0, 1.0)

    @property
    def effective_sequences(self) -> int:
        """Sequences with at least one full chain: the units the intervals resample."""
        return sum(1 for c in self.chains if c > 0)

    def finish(self) -> Score:
        boot = self.effective_sequences >= 5
        self.ci_method = ("bootstrap over sequences, 95%" if boot
                          else "Wilson over positions, 95% (fewer than 5 sequences with full chains: positions "
                               "treated as independent, so the interval is too narrow)")
        self.acceptance, self.acceptance_ci = [], []
        for k in range(self.steps):
            m, n = sum(self.matched[k]), sum(self.counted[k])
            self.acceptance.append(m / n if n else 0.0)
            self.acceptance_ci.append(_bootstrap(self.matched[k], self.counted[k]) if boot else wilson(m, n))

        def length(acc: list[int], den: list[int]) -> tuple[float, tuple[float, float]]:
            total, n = sum(acc), sum(den)
            if not n:
                return 1.0, (1.0, 1.0)
            if boot:
                return total / n, _bootstrap(acc, den)
            lo, hi = wilson(total - n, n * self.steps)  # on the accepted-draft fraction
            return total / n, (1 + lo * self.steps, 1 + hi * self.steps)

        self.accept_length_all, self.accept_length_all_ci = length(self.chain_accepted, self.chains)
        if self.replay_rounds:
            self.accept_length, self.accept_length_ci = length(self.replay_accepted, self.replay_rounds)
        else:
            self.accept_length, self.accept_length_ci = self.accept_length_all, self.accept_length_all_ci
        return self

    @property
    def tokens(self) -> int:
        return sum(self.counted[0]) if self.counted else 0

    def to_dict(self) -> dict:
        return {
            "wiring": self.candidate.name,
            "layers": [{"output_of": r.output_of} for r in self.candidate.layers],
            "described": describe(self.candidate.layers),
            "why": self.candidate.why,
            "acceptance_per_position": [round(a, 5) for a in self.acceptance],
            "acceptance_ci95": [[round(lo, 5), round(hi, 5)] for lo, hi in self.acceptance_ci],
            "conditional_acceptance": [round(m / n, 5) if n else None
                                       for m, n in zip(self.cond_matched, self.cond_counted)],
            "accept_length": round(self.accept_length, 4),
            "accept_length_ci95": [round(x, 4) for x in self.accept_length_ci],
            "accept_length_definition": "tokens per target forward of greedy chain decoding: chains replayed "
                                        "from the first full chain of each sequence, each next round starting "
                                        "after the accepted drafts and the target's token",
            "rounds": sum(self.replay_rounds),
            "accept_length_all_starts": round(self.accept_length_all, 4),
            "accept_length_all_starts_ci95": [round(x, 4) for x in self.accept_length_all_ci],
            "positions_scored": self.tokens,
            "chains": sum(self.chains),
            "sequences": len(self.chains),
            "ci_method": self.ci_method,
            "norms": self.norms,
            "seconds": round(self.seconds, 3),
        }


# --------------------------------------------------------------------------- drafter


def load_drafter_weights(root: Path) -> tuple[dict, dict]:
    """config.json and every tensor of a canonical (fixed) drafter folder."""
    from safetensors.torch import load_file

    from eagle3conv.checkpoint.index import open_checkpoint
    from eagle3conv.checkpoint.writer import prepared

    with prepared(root, "verify", write=False):  # a live fix-keys is waited for; an interrupted one finished
        return _load_drafter_weights(root, open_checkpoint, load_file)


def _load_drafter_weights(root: Path, open_checkpoint, load_file) -> tuple[dict, dict]:
    index = open_checkpoint(root)
    if index.config is None:
        raise UsageError(f"{root}: no config.json", hint=f"eagle3conv fix-keys {root}")
    if index.layout not in ("safetensors", "safetensors-sharded"):
        raise UsageError(f"{root}: verify reads a fixed safetensors drafter, this is {index.layout}",
                         hint=f"eagle3conv fix-keys {root} --out FIXED, then verify FIXED")
    tensors: dict = {}
    for f in index.weight_files:
        tensors.update(load_file(str(f)))
    return index.config, tensors


_EMBED_NAMES = ("model.embed_tokens.weight", "embed_tokens.weight", "model.language_model.embed_tokens.weight",
                "language_model.model.embed_tokens.weight", "transformer.wte.weight", "model.embed.weight")


def load_target_embeddings(path: str | os.PathLike, vocab: int, hidden: int):
    """The target's token embedding ``[V, H]`` from its safetensors (a file, or a model
    folder, sharded or not), reading only that tensor."""
    from safetensors import safe_open

    p = Path(path)
    files = [p] if p.is_file() else sorted(p.glob("*.safetensors")) if p.is_dir() else []
    if not files:
        raise UsageError(f"--embeddings {p}: no safetensors file there",
                         hint="give the target model's folder or the .safetensors file holding its embed_tokens")
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                name = next((n for n in _EMBED_NAMES if n in st.keys()), None)
                if name is None:
                    continue
                shape = tuple(st.get_slice(name).get_shape())
                if shape != (vocab, hidden):
                    raise WiringError(f"--embeddings {f}: {name} is {list(shape)}, the drafter needs "
                                      f"[{vocab}, {hidden}] (vocab_size, hidden_size): another target?")
                return st.get_tensor(name)
        except (OSError, ValueError) as err:  # safetensors raises these for unreadable files
            raise CheckpointReadError(f"--embeddings {f}: cannot read: {err}") from None
    raise UsageError(f"--embeddings {p}: no token embedding among its tensors (looked for {', '.join(_EMBED_NAMES)})")


def resolve_device(choice: str | None) -> str:
    """``auto`` (or None), ``cpu``, ``cuda`` or ``cuda:N``, checked against this machine."""
    import re as _re

    import torch

    choice = (choice or "auto").strip().lower()
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cpu":
        return "cpu"
    m = _re.fullmatch(r"cuda(?::(\d+))?", choice)
    if not m:
        raise UsageError(f"--device {choice!r}: use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise UsageError(f"--device {choice}: no CUDA device here", hint="use --device cpu or auto")
    if m.group(1) is not None and int(m.group(1)) >= torch.cuda.device_count():
        raise UsageError(f"--device {choice}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return choice


_device = resolve_device


def _dtype(choice: str, device: str):
    import torch

    table = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    if choice == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if choice not in table:
        raise UsageError(f"--dtype must be auto, bf16, fp16 or fp32, got {choice!r}")
    return table[choice]


def build_drafter(config: dict, tensors: dict, device: str, dtype, *, embeddings=None) -> tuple[Any, bool]:
    """The drafter, and whether it embeds from the captured embedding output (SGLang
    uses the target's table unless ``target_hidden_size`` differs from
    ``hidden_size``). ``embeddings``: the target's ``[V, H]`` table, for states
    that hold no embedding output."""
    import torch

    from eagle3conv.model.drafter import DrafterConfig, Eagle3Drafter

    from eagle3conv.errors import InvalidCheckpointError

    from eagle3conv.checkpoint.canonical import drafter_uses_own_embedding

    c = DrafterConfig.from_config(config)
    own = drafter_uses_own_embedding(c.hidden_size, c.target_hidden_size)
    if own and "embed_tokens.weight" not in tensors:
        raise InvalidCheckpointError("the drafter's hidden size differs from the target's, so SGLang embeds tokens with the "
                         "drafter's own embed_tokens, which this checkpoint lacks",
                         hint="convert it keeping the embedding: eagle3conv fix-keys SRC --keep-embed --out DIR")
    canonical = {"fc.weight", "lm_head.weight", "norm.weight"}
    if not canonical <= set(tensors) or not any(k.startswith("midlayer.") for k in tensors):
        raise InvalidCheckpointError(
            "the checkpoint is not in SGLang's names (fc, midlayer.*, norm, lm_head): verify runs fixed drafters",
            hint="eagle3conv fix-keys CKPT --out FIXED, then eagle3conv verify FIXED")
    if not own and embeddings is not None:
        sd = {k: v for k, v in tensors.items() if k != "embed_tokens.weight"}
        return Eagle3Drafter(config, sd, device=device, dtype=dtype, embed_tokens=embeddings,
                             norm_before_residual=False), False
    placeholder = None
    if not own:  # the captured embedding output is used, indexed by position; no V x H copy
        placeholder = torch.zeros(1, c.hidden_size, dtype=dtype, device=device).expand(c.vocab_size, c.hidden_size)
    sd = {k: v for k, v in tensors.items() if not (k == "embed_tokens.weight" and not own)}
    return Eagle3Drafter(config, sd, device=device, dtype=dtype, embed_tokens=placeholder,
                         norm_before_residual=False), not own


# --------------------------------------------------------------------------- evaluation


def _prefetch(items, depth: int = 2, pin: bool = False):
    """Iterate ``items`` in a background thread, ``depth`` ahead: reading and assembling
    the next batch (safetensors slices, the aux cat, pinning for an async copy)
    overlaps the drafter's forward on the current one."""
    import queue
    import threading

    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def work():
        try:
            for item in items:
                if stop.is_set():
                    return
                if pin:
                    item = dataclasses.replace(
                        item, aux=item.aux.pin_memory(),
                        embeddings=None if item.embeddings is None else item.embeddings.pin_memory())
                q.put(item)
            q.put(done)
        except BaseException as err:  # noqa: BLE001 - re-raised in the consumer
            q.put(err)

    t = threading.Thread(target=work, name="eagle3conv-prefetch", daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while t.is_alive():  # let a blocked producer finish its put
            try:
                q.get_nowait()
            except queue.Empty:
                t.join(timeout=0.05)


def _mapped_states(states) -> dict | None:
    """Zero-copy CPU views (``np.memmap``) of every hidden state in an eagle3conv
    states file, by LayerRef; None for other sources. The file was validated on
    open; offsets come from its safetensors header."""
    import struct
    import warnings

    import numpy as np
    import torch

    from eagle3conv.states.format import StatesFile, hidden_key

    if not isinstance(states, StatesFile):
        return None
    with open(states.path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    raw = np.memmap(states.path, dtype=np.uint8, mode="r")
    kinds = {"BF16": (np.uint16, torch.bfloat16), "F16": (np.float16, None), "F32": (np.float32, None)}
    out = {}
    for ref in states.layers:
        info = header[hidden_key(ref)]
        a, b = info["data_offsets"]
        np_dt, view = kinds[info["dtype"]]
        arr = raw[8 + n + a: 8 + n + b].view(np_dt).reshape(info["shape"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only map: we only ever read it
            t = torch.from_numpy(arr)
        out[ref] = t.view(view) if view is not None else t
    return out


class _GpuFeeder:
    """Batches of aux (and embedding) states on the GPU, double-buffered: a thread
    copies the next batch's rows from the memory-mapped file straight into a pinned
    buffer (one host copy, no cat), a side stream uploads it, and the drafter's
    stream waits only for that upload. Host reads, uploads and compute overlap."""

    def __init__(self, views: dict, refs: LayerSet, total: int, batch_size: int, with_emb: bool, device, dtype):
        import torch

        self.views, self.refs, self.total, self.bs = views, refs, total, batch_size
        self.with_emb, self.device, self.dtype = with_emb, device, dtype
        first = views[refs[0]]
        self.S, self.T = first.shape[1], first.shape[2]
        store = first.dtype
        k = len(refs)
        self.nbuf = 2
        self.aux = [torch.empty(batch_size, self.S, k * self.T, dtype=store).pin_memory() for _ in range(self.nbuf)]
        self.emb = ([torch.empty(batch_size, self.S, self.T, dtype=store).pin_memory() for _ in range(self.nbuf)]
                    if with_emb else None)
        self.stream = torch.cuda.Stream(device=device)

    def __iter__(self):
        import queue
        import threading

        import torch
        from eagle3conv.wiring.layers import EMBEDDING as EMB

        starts = list(range(0, self.total, self.bs))
        free: list[queue.Queue] = [queue.Queue() for _ in range(self.nbuf)]
        for q in free:
            q.put(None)  # buffer i is free (no pending upload)
        ready: queue.Queue = queue.Queue()
        stop = threading.Event()

        def fill():
            try:
                for j, start in enumerate(starts):
                    i = j % self.nbuf
                    ev = free[i].get()
                    if stop.is_set():
                        return
                    if ev is not None:
                        ev.synchronize()  # the previous upload from this buffer is done
                    end = min(start + self.bs, self.total)
                    n = end - start
                    for s, ref in enumerate(self.refs):
                        self.aux[i][:n, :, s * self.T:(s + 1) * self.T].copy_(self.views[ref][start:end])
                    if self.emb is not None:
                        self.emb[i][:n].copy_(self.views[EMB][start:end])
                    ready.put((i, start, end))
                ready.put(None)
            except BaseException as err:  # noqa: BLE001 - re-raised by the consumer
                ready.put(err)

        t = threading.Thread(target=fill, name="eagle3conv-feeder", daemon=True)
        t.start()
        try:
            while True:
                item = ready.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                i, start, end = item
                n = end - start
                with torch.cuda.stream(self.stream):
                    aux = self.aux[i][:n].to(self.device, non_blocking=True)
                    emb = self.emb[i][:n].to(self.device, non_blocking=True) if self.emb is not None else None
                    done = torch.cuda.Event()
                    done.record(self.stream)
                torch.cuda.current_stream(self.device).wait_event(done)
                aux.record_stream(torch.cuda.current_stream(self.device))
                if emb is not None:
                    emb.record_stream(torch.cuda.current_stream(self.device))
                free[i].put(done)
                yield start, end, aux.to(self.dtype), None if emb is None else emb.to(self.dtype)
        finally:
            stop.set()
            for q in free:
                q.put(None)
            t.join(timeout=5)


def evaluate(drafter, states, candidate: Candidate, *, steps: int, batch_size: int, target_embeds: bool,
             max_sequences: int | None = None, progress: Progress | None = None, labels=None) -> Score:
    """Score one wiring over the states (see the module docstring).

    Everything per position (norms, hits, chain lengths) is computed on the
    drafter's device and kept there; the host only reads batches (in a prefetch
    thread) and collects small per-sequence sums once at the end.
    """
    import torch

    t0 = time.perf_counter()
    dev, dt = drafter.device, drafter.dtype
    cuda = dev.type == "cuda"
    k_slots = len(candidate.layers)
    T = states.hidden_size
    total = states.num_sequences if max_sequences is None else min(max_sequences, states.num_sequences)
    acc: dict[str, list] = {"matched": [], "counted": [], "chain_acc": [], "chains": [], "cond_m": [],
                            "cond_n": []}
    norm_vals: list[list] = [[] for _ in range(k_slots)]
    keeps: list = []
    starts_a: list = []  # [B, S] leading matches of the chain started at each position
    starts_full: list = []  # [B, S] chain has a reference for every draft
    done = 0
    views = _mapped_states(states) if cuda else None
    if views is not None:
        feeder = _GpuFeeder(views, candidate.layers, total, batch_size, target_embeds, dev, dt)
        source = ((start, end, a, e) for start, end, a, e in feeder)
    else:
        batches = states.batches(candidate.layers, batch_size=batch_size, with_embeddings=target_embeds)
        source = ((b.start, b.stop, b.aux, b.embeddings) for b in _prefetch(batches, pin=cuda))
    all_ids, all_mask, all_loss = states.input_ids, states.attention_mask, states.loss_mask
    all_next = states.target_next if labels is None else labels  # -1: no reference token
    for start, stop, aux_b, emb_b in source:
        if done >= total:
            break
        take = min(stop - start, total - done)
        rows = slice(start, start + take)
        ids = all_ids[rows].to(dev, non_blocking=True)
        mask = all_mask[rows].to(dev, non_blocking=True).bool()
        loss = all_loss[rows].to(dev, non_blocking=True).bool() & mask
        tnext = all_next[rows].to(dev, non_blocking=True)
        aux = aux_b[:take].to(dev, non_blocking=True).to(dt)
        B, S = ids.shape
        keep = mask.clone()  # norms: real tokens, position 0 excluded (selected once, at the end)
        keep[:, 0] = False
        keeps.append(keep)
        for s in range(k_slots):  # fp32 accumulation, no upcast copy of the states
            norm_vals[s].append(torch.linalg.vector_norm(aux[..., s * T:(s + 1) * T], dim=-1,
                                                         dtype=torch.float32))
        if target_embeds:
            # The captured embedding output at position p *is* embed(x_p). Index it by position:
            # the drafter's id at (b, t) is b*S + t, so the ids it reads k steps ahead (the same row
            # shifted) land on embed(x_{t+k}). No vocabulary table, no unique(), no device sync.
            emb = emb_b[:take].to(dev, non_blocking=True).to(dt)
            drafter.embed_tokens = emb.reshape(B * S, T)
            run_ids = torch.arange(B * S, device=dev).view(B, S)
        else:
            run_ids = ids
        with torch.inference_mode():
            chain = drafter.draft_chain(aux, run_ids, steps)
        guesses = chain.target_ids  # [K, B, S] target vocab, on the device
        scored = torch.zeros(steps, B, S, dtype=torch.bool, device=dev)
        hit = torch.zeros(steps, B, S, dtype=torch.bool, device=dev)
        for k in range(1, steps + 1):  # draft k at chain start t guesses target_next[t+k]
            if k >= S:
                continue
            ok = loss[:, k:] & mask[:, k:] & (tnext[:, k:] >= 0)
            scored[k - 1, :, : S - k] = ok
            hit[k - 1, :, : S - k] = ok & (guesses[k - 1, :, : S - k] == tnext[:, k:])
        acc["matched"].append(hit.sum(2))  # [K, B]
        acc["counted"].append(scored.sum(2))
        full = scored.all(0)  # chains whose K drafts all have a reference
        lead = hit.long().cumprod(0)
        acc["chain_acc"].append(((lead.sum(0) + 1) * full).sum(1))
        starts_a.append(lead.sum(0).to(torch.int16))
        starts_full.append(full)
        acc["chains"].append(full.sum(1))
        prev = torch.cat([torch.ones(1, B, S, dtype=torch.bool, device=dev), lead[:-1].bool()])
        acc["cond_m"].append((hit & prev & full).sum((1, 2)))
        acc["cond_n"].append((prev & full).sum((1, 2)))
        done += take
        if progress:
            progress(done, total)
    got = {k: (torch.cat(v, dim=-1).cpu() if k in ("matched", "counted", "chain_acc", "chains")
               else torch.stack(v).sum(0).cpu()) if v else None for k, v in acc.items()}
    matched = got["matched"].tolist() if got["matched"] is not None else [[] for _ in range(steps)]
    counted = got["counted"].tolist() if got["counted"] is not None else [[] for _ in range(steps)]
    norms = []
    keep_all = torch.cat(keeps) if keeps else None
    for s in range(k_slots):
        v = torch.cat(norm_vals[s])[keep_all].double().cpu() if norm_vals[s] else torch.zeros(0)
        if v.numel() == 0:
            norms.append({"median": None, "p10": None, "p90": None, "tokens": 0})
            continue
        q = torch.quantile(v[:16_000_000], torch.tensor([0.1, 0.5, 0.9], dtype=torch.double))
        norms.append({"median": float(q[1]), "p10": float(q[0]), "p90": float(q[2]), "tokens": int(v.numel())})
    replay_acc, replay_rounds = _replay(starts_a, starts_full)
    score = Score(candidate, steps, matched, counted,
                  got["chain_acc"].tolist() if got["chain_acc"] is not None else [],
                  got["chains"].tolist() if got["chains"] is not None else [],
                  got["cond_m"].tolist() if got["cond_m"] is not None else [0] * steps,
                  got["cond_n"].tolist() if got["cond_n"] is not None else [0] * steps, norms,
                  replay_acc, replay_rounds)
    score.seconds = time.perf_counter() - t0
    return score.finish()


def _replay(starts_a: list, starts_full: list) -> tuple[list[int], list[int]]:
    """Greedy chain decoding replayed on teacher-forced results: from the first full chain
    of each sequence, a round accepts A_t drafts plus the target's own token and the next
    round starts A_t + 1 positions later (exact where the sequence is the target's own
    greedy output, as generated responses are)."""
    import numpy as np
    import torch

    if not starts_a:
        return [], []
    a_all = torch.cat(starts_a).cpu().numpy()
    f_all = torch.cat(starts_full).cpu().numpy()
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


def norm_comparison(score: Score, training_norms: dict | None) -> list[dict] | None:
    """Slot by slot: inference median next to training median; flagged beyond 2x."""
    if not training_norms or not training_norms.get("slots"):
        return None
    slots = training_norms["slots"]
    if len(slots) != len(score.norms):
        return None
    out = []
    for i, (inf, tr) in enumerate(zip(score.norms, slots)):
        a, b = inf.get("median"), tr.get("median")
        ratio = (a / b) if a and b else None
        flagged = ratio is not None and (ratio > NORM_FLAG_RATIO or ratio < 1 / NORM_FLAG_RATIO)
        out.append({"slot": i, "layer": str(score.candidate.layers[i]), "inference_median": a,
                    "training_median": b, "ratio": None if ratio is None else round(ratio, 4), "flagged": flagged})
    return out


def _norm_mismatch(cmp: list[dict] | None) -> float | None:
    if not cmp:
        return None
    vals = [abs(math.log(c["ratio"])) for c in cmp if c["ratio"]]
    return sum(vals) / len(vals) if vals else None


# --------------------------------------------------------------------------- candidates


def candidates(base: Candidate, trained: LayerSet | None, available: Sequence[LayerRef], num_layers: int | None,
               *, wide: bool = True) -> list[Candidate]:
    """The wirings worth scoring, among the layers the states hold."""
    have = set(available)
    out: list[Candidate] = []
    seen: set[LayerSet] = set()

    def add(name: str, layers: Sequence[LayerRef], why: str) -> None:
        layers = tuple(layers)
        if (layers in seen or len(set(layers)) != len(layers) or not all(r in have for r in layers)
                or any(a.output_of >= b.output_of for a, b in zip(layers, layers[1:]))):
            return
        seen.add(layers)
        out.append(Candidate(name, layers, why))

    base_layers = base.layers
    add(base.name, base_layers, base.why)
    if trained is not None:
        add("training record", trained, "the layers the training record names")
    for shift in (-1, 1):
        shifted = [LayerRef(r.output_of + shift) for r in base_layers if r.output_of + shift >= -1]
        if len(shifted) == len(base_layers):
            add(f"config shifted by {shift:+d}", shifted,
                "the off-by-one of engines numbering layer inputs vs outputs")
    emb = (EMBEDDING, *base_layers[:-1])
    add("with the embedding output", emb, "the seed incident's belief: training included the embedding output")
    if num_layers is not None and num_layers >= 4:
        d = engine_defaults(num_layers)
        add("engine default", d["output"].refs, f"what every engine captures with no ids ({d['output'].note})")
        add("SpecForge 2025-09 default", d["specforge-2025-09"].refs, d["specforge-2025-09"].note)
    if wide:
        for slot in range(len(base_layers)):
            for delta in (-2, -1, 1, 2):
                moved = list(base_layers)
                o = moved[slot].output_of + delta
                if o < -1:
                    continue
                moved[slot] = LayerRef(o)
                add(f"slot {slot} moved {delta:+d}", moved, "a wider search around the config's wiring")
    return out


# --------------------------------------------------------------------------- the command


@dataclass
class VerifyResult:
    checkpoint: Path
    states: dict
    device: str
    dtype: str
    steps: int
    wiring_check: dict
    scores: list[Score]
    comparisons: list[list[dict] | None]
    verdict: dict
    training_norms: dict | None
    seconds: dict
    min_accept: float | None
    saved: Path | None = None
    save_error: str | None = None

    @property
    def main(self) -> Score:
        return self.scores[0]

    @property
    def wiring_check_ok(self) -> bool:
        return bool(self.wiring_check.get("ok", True))

    @property
    def passed(self) -> bool:
        return self.min_accept is None or self.main.acceptance[0] >= self.min_accept

    def to_dict(self) -> dict:
        m = self.main
        return {
            "format": "eagle3conv-verify",
            "version": 1,
            "checkpoint": self.checkpoint.name,  # no local paths: the report travels with pushes
            "states": dict(self.states, path=Path(str(self.states.get("path", ""))).name),
            "device": self.device,
            "dtype": self.dtype,
            "steps": self.steps,
            "wiring": m.to_dict()["described"],
            "acceptance_per_position": m.to_dict()["acceptance_per_position"],
            "acceptance_ci95": m.to_dict()["acceptance_ci95"],
            "accept_length": m.to_dict()["accept_length"],
            "accept_length_ci95": m.to_dict()["accept_length_ci95"],
            "min_accept": self.min_accept,
            "passed": self.passed,
            "statistic": ("teacher-forced top-1 acceptance against the "
                          + ("data's next tokens (the states hold no target predictions)"
                             if any("data's next tokens" in n for n in self.states.get("verify_notes", []))
                             else "target's greedy next tokens")
                          + "; norms: per-token L2, position 0 excluded"),
            "results": [dict(s.to_dict(), norm_comparison=c) for s, c in zip(self.scores, self.comparisons)],
            "verdict": self.verdict,
            "wiring_check": self.wiring_check,
            "seconds": self.seconds,
            "saved": None if self.saved is None else str(self.saved),
            "save_error": self.save_error,
        }


def _out_refs(ids: Sequence[int] | None) -> LayerSet | None:
    return None if ids is None else tuple(LayerRef(int(i)) for i in ids)


def _config_candidate(config: dict, wiring: dict, num_layers: int | None, prefer: str) -> Candidate:
    """The wiring an engine would use with this config: eagle3conv's provenance if
    written, else the SGLang ids as the preferred version reads them, else the default."""
    prov = ((config.get("eagle3conv") or {}).get("aux_layers") or {}).get("layers")
    if isinstance(prov, list) and prov:
        return Candidate("config", tuple(LayerRef(x["output_of"]) for x in prov),
                         "config.json's eagle3conv.aux_layers (as written for every engine)")
    ids = ((config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"))
    if isinstance(ids, list) and ids:
        if -1 in ids:  # what the seed incident's author meant: [-1, 2, 30] = embedding + outputs 2, 30
            return Candidate("config", to_refs(ids, "output", num_layers),
                             f"config.json eagle_config ids {ids}, -1 read as the embedding output "
                             "(SGLang itself cannot capture it)")
        try:
            return Candidate("config", to_refs(ids, prefer, num_layers),
                             f"config.json eagle_config ids {ids} as {prefer} reads them")
        except WiringError as err:
            raise WiringError(f"config.json eagle_config ids {ids}: {err.message}",
                              hint="score a wiring explicitly with --layers, or fix it with eagle3conv config") from None
    top = config.get("eagle_aux_hidden_state_layer_ids")
    if isinstance(top, list) and top:
        return Candidate("config", to_refs(top, "input", num_layers), f"config.json top-level ids {top} (vLLM)")
    if num_layers is None:
        raise UsageError("config.json names no aux layers and the target's layer count is unknown",
                         hint="pass --target, or write the wiring with eagle3conv config")
    d = engine_defaults(num_layers)["output"]
    return Candidate("config", d.refs, "no ids in config.json: every engine's default")


def verify(
    path: str | os.PathLike,
    states_path: str | os.PathLike,
    *,
    wiring_options=None,
    steps: int = 3,
    device: str = "auto",
    dtype: str = "auto",
    search: bool = False,
    layers: Sequence[int] | None = None,
    min_accept: float | None = None,
    batch_size: int = 8,
    max_sequences: int | None = None,
    save: bool = True,
    progress: Callable[[str, int, int], None] | None = None,
    states_layers: Sequence[int] | None = None,
    embeddings: str | os.PathLike | None = None,
) -> VerifyResult:
    """Run the drafter on captured states and measure acceptance (see the module docstring).

    ``layers`` (output-of-layer ids) overrides the config's wiring.
    ``states_layers`` names the aux slots of sources that do not record them
    (SpecForge records, dumps without a manifest); without it they are taken to
    be the config's wiring, and the report says so. ``embeddings``: the target's
    safetensors, for states without the embedding output. States without the
    target's next tokens (SpecForge) are scored against the data's next tokens,
    and the report says so. Raises
    :class:`VerifyFailedError` (exit 4) when step-1 acceptance is below
    ``min_accept``, after saving the report.
    """
    from eagle3conv.states.readers import open_states
    from eagle3conv.wiring.apply import WiringOptions, check_only, gather
    from eagle3conv.wiring.check import sglang_preference

    t_start = time.perf_counter()
    if steps < 1 or steps > 16:
        raise UsageError(f"--steps must be between 1 and 16, got {steps}")
    if min_accept is not None and not 0 <= min_accept <= 1:
        raise UsageError(f"--min-accept is a fraction between 0 and 1, got {min_accept}")
    if max_sequences is not None and max_sequences < 1:
        raise UsageError(f"--max-sequences must be at least 1, got {max_sequences}")
    if batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {batch_size}")
    root = Path(path)
    opts = wiring_options or WiringOptions()
    config, tensors = load_drafter_weights(root)
    t_loaded = time.perf_counter()
    notes: list[str] = []
    states = open_states(states_path, layers=_out_refs(states_layers))
    if states.input_ids is None:
        raise CheckpointReadError(
            f"{states_path}: these states hold no token ids; verify compares drafts with the target's tokens",
            hint="capture with eagle3conv capture, or add input_ids.pt and target_next.pt to the dumps")
    labels = None
    if states.target_next is None:
        import torch

        labels = torch.full_like(states.input_ids, -1)
        labels[:, :-1] = states.input_ids[:, 1:]
        labels[~states.attention_mask.bool()] = -1
        ends = states.attention_mask.sum(1) - 1  # the last real token has no next token in the data
        labels[torch.arange(len(ends)), ends.clamp(min=0)] = -1
        notes.append("these states hold no target next tokens: drafts are scored against the data's next tokens "
                     "(a lower bound on acceptance unless the data is the target's own output)")
    ev = gather(root, None, config, opts)
    if ev.target is None and states.num_layers is not None:
        from eagle3conv.wiring.targets import TargetProfile

        ev.target = TargetProfile(name=states.target or "the captured target", hidden_size=states.hidden_size,
                                  num_hidden_layers=states.num_layers, vocab_size=states.vocab_size or 0)
    n = ev.target.num_hidden_layers if ev.target else states.num_layers
    prefer = sglang_preference(ev.target.architectures if ev.target else None,
                               ev.target.model_type if ev.target else None)
    fc = tensors.get("fc.weight")
    from eagle3conv.model.drafter import DrafterConfig

    dc = DrafterConfig.from_config(config)
    check = check_only(config, ev, fc_in=int(fc.shape[1]) if fc is not None else None,
                       target_hidden=dc.target_hidden_size, source_format="sglang",
                       fix_command=f"eagle3conv config {path}")
    if states.hidden_size != dc.target_hidden_size:
        raise WiringError(f"the states are {states.hidden_size} wide but the drafter reads target states of "
                          f"width {dc.target_hidden_size}: they come from another target")
    if layers is not None:
        base = Candidate("given", to_refs(list(layers), "output", n), f"--layers {','.join(map(str, layers))}")
    else:
        base = _config_candidate(config, check.to_dict(), n, prefer)
    if len(base.layers) != dc.num_aux:
        raise WiringError(f"the wiring names {len(base.layers)} layers ({describe(base.layers)}) but fc reads "
                          f"{dc.num_aux}")
    if states.layers is None:  # SpecForge records, dumps without a manifest: the slots are unnamed
        states = open_states(states_path, layers=base.layers)
        notes.append(f"the states do not say which layers their aux slots are: taken to be {describe(base.layers)} "
                     "(the wiring scored); pass --states-layers to name them")
        if search:
            notes.append("--search-wiring needs states that name their layers: only the stored slots were scored")
            search = False
    dev = _device(device)
    dt = _dtype(dtype, dev)
    table = None
    if embeddings is not None:
        table = load_target_embeddings(embeddings, dc.vocab_size, dc.hidden_size).to(dt)
    elif not states.has_embeddings and dc.target_hidden_size == dc.hidden_size:
        raise UsageError(f"{states_path}: these states hold no embedding output, and the drafter embeds with "
                         "the target's table", hint="pass the target's weights: --embeddings TARGET_DIR")
    drafter, target_embeds = build_drafter(config, tensors, dev, dt, embeddings=table)
    del tensors, table
    t_built = time.perf_counter()
    truth = ev.truth.layers if ev.truth else None
    cands = [base]
    if search:
        avail = [r for r in states.layers]
        cands = candidates(base, truth, avail, n)
        if not cands or cands[0] is not base:
            states.check_refs(base.layers)  # explains what is missing
    else:
        states.check_refs(base.layers)
    training = next((r for r in ev.records if r.norms), None)
    scores: list[Score] = []
    first_result = None
    for i, cand in enumerate(cands):
        cb = None
        if progress:
            def cb(done, total, _i=i, _c=cand):
                progress(f"{_c.name} ({_i + 1}/{len(cands)})", done, total)
        scores.append(evaluate(drafter, states, cand, steps=steps, batch_size=batch_size,
                               target_embeds=target_embeds, max_sequences=max_sequences, progress=cb,
                               labels=labels))
        if first_result is None:
            first_result = time.perf_counter()
            if scores[0].tokens == 0:
                raise CheckpointReadError(
                    f"{states_path}: nothing to score: no position has a reference token inside the loss mask "
                    f"({states.num_sequences} sequences, {states.num_tokens} real tokens)",
                    hint="capture longer sequences or with --generate N (the generated part is scored)")
        bad = [i for i, nm in enumerate(scores[-1].norms) if nm["median"] is not None
               and not all(math.isfinite(nm[k]) for k in ("median", "p10", "p90"))]
        if bad:
            raise CheckpointReadError(
                f"{states_path}: the hidden states of slot {bad[0]} ({cand.layers[bad[0]]}) are not finite "
                "(NaN or Inf): the capture went wrong", hint="capture again (a bf16 overflow? try --dtype fp32)")
    comparisons = []
    for s in scores:
        same = training is not None and training.layers == s.candidate.layers
        comparisons.append(norm_comparison(s, training.norms) if same or (
            training is not None and len(training.layers or ()) == len(s.candidate.layers)) else None)
    verdict = _verdict(scores, comparisons, search, path, ev.target.name if ev.target else None)
    t_end = time.perf_counter()
    result = VerifyResult(
        checkpoint=root, states=dict(states.summary(), verify_notes=notes), device=dev, dtype=str(dt).removeprefix("torch."),
        steps=steps, wiring_check=check.to_dict(), scores=scores, comparisons=comparisons, verdict=verdict,
        training_norms=None if training is None else training.norms,
        seconds={"load_drafter": round(t_loaded - t_start, 3), "build": round(t_built - t_loaded, 3),
                 "first_result": round((first_result or t_end) - t_start, 3), "total": round(t_end - t_start, 3)},
        min_accept=min_accept)
    if save:
        from eagle3conv._fs import atomic_write_text

        p = root / REPORT_FILE
        try:
            text = json.dumps(result.to_dict(), indent=2) + "\n"
            for local in {str(path), str(root), str(root.resolve())} - {"", "."}:
                text = text.replace(json.dumps(local)[1:-1], root.name)  # no local paths in a pushed report
            from eagle3conv._fs import folder_lock

            with folder_lock(root, exclusive=False, command="verify"):
                result.saved = atomic_write_text(p, text, durable=False)
        except OSError as err:  # a read-only checkpoint: keep the results, say so
            result.save_error = f"could not save {p}: {err.strerror or err} (use --no-save)"
        except FolderBusyError as err:
            result.save_error = f"could not save {p}: {err.message}"
    if not result.passed:
        raise VerifyFailedError(
            f"step-1 acceptance {result.main.acceptance[0]:.3f} is below --min-accept {min_accept}",
            hint=verdict.get("advice") or (f"see the report: {result.saved}" if result.saved else None),
            details=[f"{s.candidate.name}: {describe(s.candidate.layers)}: accept length {s.accept_length:.3f}"
                     for s in scores[:5]])
    return result


def smoke(path: str | os.PathLike, *, device: str = "auto", dtype: str = "auto") -> dict:
    """The structural smoke test (no states): strict load, random inputs at step 1
    (k*T wide) and step 2 (H wide), finite outputs, logits Vd wide, d2t in range."""
    from eagle3conv.model.drafter import check_mla_shapes, smoke_test

    config, tensors = load_drafter_weights(Path(path))
    dev = _device(device)
    dt = _dtype(dtype, dev)
    t0 = time.perf_counter()
    if "Eagle3DeepseekV2ForCausalLM" in (config.get("architectures") or []):
        check_mla_shapes(config, tensors)
        return {"checkpoint": str(path), "ok": True, "device": dev, "kind": "MLA drafter: tensor shapes checked "
                "(its forward is not implemented)", "seconds": round(time.perf_counter() - t0, 3)}
    r = smoke_test(config, tensors, dev, dtype=dt)
    return {"checkpoint": str(path), "ok": r.ok, "problems": list(r.problems), "device": dev,
            "dtype": str(dt).removeprefix("torch."), "step1_input_width": r.step1_input_width,
            "step2_input_width": r.step2_input_width, "logits_width": r.logits_width,
            "vocab_size": r.vocab_size, "embedding": r.embedding_source,
            "seconds": round(time.perf_counter() - t0, 3)}


def _verdict(scores: list[Score], comparisons, search: bool, path, target: str | None) -> dict:
    main = scores[0]
    out: dict[str, Any] = {"config_accept_length": round(main.accept_length, 4)}
    flagged = [c for c in (comparisons[0] or []) if c["flagged"]]
    if flagged:
        out["norm_flags"] = [f"slot {c['slot']} ({c['layer']}): inference median {c['inference_median']:.3g} vs "
                             f"training {c['training_median']:.3g} ({c['ratio']:.2f}x)" for c in flagged]
    if not search or len(scores) < 2:
        return out
    if main.effective_sequences < MIN_SEARCH_SEQUENCES:
        out.update({"decided_by": f"not decided: a wiring search needs at least {MIN_SEARCH_SEQUENCES} "
                    f"sequences with full chains (these states have {main.effective_sequences}); capture more",
                    "config_is_best": None})
        return out
    # rank by the every-chain-start accept length: same positions for every wiring, lowest variance
    ranked = sorted(range(len(scores)), key=lambda i: -scores[i].accept_length_all)
    best, second = scores[ranked[0]], scores[ranked[1]]
    diffs = {i: paired_difference(best, scores[i]) for i in ranked[1:]}
    tied = [ranked[0]] + [i for i in ranked[1:] if diffs[i][1] <= 0]
    separated = len(tied) == 1  # the leader's paired interval excludes 0 against every other wiring
    chosen, decided_by = ranked[0], "acceptance"
    out["paired_differences"] = [
        {"wiring": scores[i].candidate.name, "layers": describe(scores[i].candidate.layers),
         "accept_length_gap": round(d, 4), "ci95": [round(lo, 4), round(hi, 4)]}
        for i, (d, lo, hi) in diffs.items()]
    ambiguous = False
    if not separated:
        # Acceptance cannot tell the leaders apart. The norm fingerprint tells an embedding
        # output from a deep layer, not layer 13 from 14 (adjacent layers' norms differ by
        # less than two datasets' medians do), so it only overturns the config's (or the
        # training record's) wiring when that one's norms are out of line and another
        # leader's are clearly in line.

        def in_line(i: int) -> bool | None:
            cmp = comparisons[i]
            return None if cmp is None else not any(c["flagged"] for c in cmp)

        def clearly_in_line(i: int) -> bool:
            cmp = comparisons[i]
            return bool(cmp) and all(c["ratio"] and 0.8 <= c["ratio"] <= 1.25 for c in cmp)

        anchors = [i for i in tied if scores[i].candidate.name == "training record"] + ([0] if 0 in tied else [])
        anchor = next((i for i in anchors if in_line(i) is not False), None)
        ok = [i for i in tied if clearly_in_line(i)]
        if anchor is not None:
            chosen = anchor
            who = "the training record's" if scores[anchor].candidate.name == "training record" else "the config's"
            decided_by = (f"acceptance cannot separate {len(tied)} wirings; {who} wiring is among them"
                          + (" and its norms match training" if in_line(anchor) else "") + ", so it stands")
        elif ok:
            chosen = min(ok, key=lambda i: _norm_mismatch(comparisons[i]) or 0.0)
            decided_by = ("norm fingerprint (acceptance cannot separate the leaders; the config's norms are out "
                          "of line, this wiring's within 25% of training)")
        else:
            ambiguous = True
            decided_by = (f"ambiguous: acceptance cannot separate {len(tied)} wirings and the norms do not decide; "
                          "capture more tokens")
    win = scores[chosen]
    out.update({
        "best": win.candidate.name, "best_layers": describe(win.candidate.layers),
        "best_accept_length": round(win.accept_length, 4), "decided_by": decided_by, "tied": len(tied),
        "separated": separated, "runner_up": second.candidate.name if chosen == ranked[0] else best.candidate.name,
        "config_is_best": win is main,
    })
    if ambiguous:
        out["best"] = None
        out["best_layers"] = None
        return out
    if win is not main:
        ids = ",".join(map(str, to_ids(win.candidate.layers, "output")))
        tgt = f" --target {target}" if target else ""
        out["advice"] = (f"the drafter was most likely trained on {describe(win.candidate.layers)}; write it: "
                         f"eagle3conv config {path}{tgt} --trained-on {ids} --captured-at output")
    return out
