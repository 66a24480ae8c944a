"""Feeding state batches to the drafter: a prefetch thread, and on CUDA a double-buffered feeder.

:func:`batches` is what :func:`eagle3conv.verify.evaluate.evaluate` iterates:
``(start, stop, aux, embeddings)`` per batch of sequences. On CUDA, an
eagle3conv states file is read through :class:`GpuFeeder` (memory-mapped rows
copied straight into pinned buffers, uploaded on a side stream); every other
case goes through the states' own ``batches()`` in a :func:`prefetch` thread.
Both give the same numbers; the feeder only overlaps reading, upload and compute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from eagle3conv.spec.layers import EMBEDDING, LayerSet


def prefetch(items, depth: int = 2, pin: bool = False):
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


def hidden_infos(states) -> dict | None:
    """Each hidden state's :class:`~eagle3conv.io.safetensors.TensorInfo` (dtype, shape, byte
    range) in an eagle3conv states file, by LayerRef, from one read of the validated header;
    None for other sources."""
    from eagle3conv.io.safetensors import read_safetensors_header
    from eagle3conv.states.format import StatesFile, hidden_key

    if not isinstance(states, StatesFile):
        return None
    header, _ = read_safetensors_header(states.path)
    return {ref: header[hidden_key(ref)] for ref in states.layers}


def mapped_states(states, infos: dict | None = None) -> dict | None:
    """Zero-copy CPU views (``np.memmap``) of every hidden state in an eagle3conv
    states file, by LayerRef; None for other sources. Byte offsets come from the
    validated safetensors header reader (:func:`hidden_infos`, or ``infos`` already read)."""
    import warnings

    import numpy as np
    import torch

    from eagle3conv.io import dtypes

    infos = hidden_infos(states) if infos is None else infos
    if infos is None:
        return None
    raw = np.memmap(states.path, dtype=np.uint8, mode="r")
    out = {}
    for ref, info in infos.items():
        np_dt, view = dtypes.storage_view(info.dtype)
        arr = raw[info.start: info.end].view(np_dt).reshape(info.shape)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only map: we only ever read it
            t = torch.from_numpy(arr)
        out[ref] = t.view(getattr(torch, view)) if view is not None else t
    return out


def state_spans(states, infos: dict | None = None) -> dict | None:
    """Where each hidden state's rows lie in an eagle3conv states file: by LayerRef,
    ``(first byte, bytes per sequence)`` (the tensors are ``[sequences, positions, width]``,
    row-major); None for other sources. Offsets from :func:`hidden_infos` (or ``infos``)."""
    infos = hidden_infos(states) if infos is None else infos
    if infos is None:
        return None
    out = {}
    for ref, info in infos.items():
        rows = info.shape[0] if info.shape else 0
        if not rows or (info.end - info.start) % rows:
            return None
        out[ref] = (info.start, (info.end - info.start) // rows)
    return out


def pread_into(fd: int, dst, offset: int, path) -> None:
    """Fill the contiguous numpy array ``dst`` with the file's bytes from ``offset``."""
    import os

    from eagle3conv.errors import CheckpointReadError

    mv = memoryview(dst).cast("B")
    got = 0
    while got < len(mv):
        n = os.preadv(fd, [mv[got:]], offset + got)
        if n <= 0:
            raise CheckpointReadError(f"{path}: the file ended early (was it truncated while verify read it?)")
        got += n


class GpuFeeder:
    """Batches of aux (and embedding) states on the GPU, double-buffered: threads read
    the next batch's rows into a pinned buffer (one host copy, no cat), a side stream
    uploads it, and the drafter's stream waits only for that upload. Host reads,
    uploads and compute overlap.

    With ``spans`` (:func:`state_spans`) and ``path``, each slot's rows -- one contiguous
    byte range of the file -- are read with ``preadv`` straight into a slot-major pinned
    buffer ``[slots, batch, positions, width]`` (large reads, no page faults), and the
    GPU puts the slots side by side after the upload. Otherwise the rows are copied from
    the memory-mapped ``views``. The bytes, and so the numbers, are the same."""

    def __init__(self, views: dict, refs: LayerSet, total: int, batch_size: int, with_emb: bool, device, dtype,
                 *, spans: dict | None = None, path=None):
        import torch

        self.views, self.refs, self.total, self.bs = views, refs, total, batch_size
        self.with_emb, self.device, self.dtype = with_emb, device, dtype
        first = views[refs[0]]
        self.S, self.T = first.shape[1], first.shape[2]
        store = first.dtype
        k = len(refs)
        self.nbuf = 2
        need = list(refs) + ([EMBEDDING] if with_emb else [])
        self.spans = spans if spans is not None and path is not None and all(r in spans for r in need) else None
        self.path = path
        # allocated pinned (not empty().pin_memory(), which fills a pageable copy first)
        if self.spans is not None:
            self.aux = [torch.empty(k, batch_size, self.S, self.T, dtype=store, pin_memory=True)
                        for _ in range(self.nbuf)]
            self.aux_bytes = [t.view(torch.uint8).numpy() for t in self.aux]
        else:
            self.aux = [torch.empty(batch_size, self.S, k * self.T, dtype=store, pin_memory=True)
                        for _ in range(self.nbuf)]
        self.emb = ([torch.empty(batch_size, self.S, self.T, dtype=store, pin_memory=True) for _ in range(self.nbuf)]
                    if with_emb else None)
        if self.spans is not None and self.emb is not None:
            self.emb_bytes = [t.view(torch.uint8).numpy() for t in self.emb]
        self.stream = torch.cuda.Stream(device=device)

    def __iter__(self):
        import queue
        import threading

        import torch

        starts = list(range(0, self.total, self.bs))
        free: list[queue.Queue] = [queue.Queue() for _ in range(self.nbuf)]
        for q in free:
            q.put(None)  # buffer i is free (no pending upload)
        ready: queue.Queue = queue.Queue()
        stop = threading.Event()

        from concurrent.futures import ThreadPoolExecutor

        # the host copies of one batch (one per slot, and the embedding) run side by side: each is a
        # page-cache (or disk) read into pinned memory, and torch releases the GIL while copying
        pool = ThreadPoolExecutor(max_workers=len(self.refs) + 1, thread_name_prefix="eagle3conv-copy")
        import os

        fd = os.open(self.path, os.O_RDONLY) if self.spans is not None else -1

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
                    if self.spans is not None:  # each slot's rows: one contiguous range of the file
                        jobs = [(self.aux_bytes[i][s, :n], ref) for s, ref in enumerate(self.refs)]
                        if self.emb is not None:
                            jobs.append((self.emb_bytes[i][:n], EMBEDDING))
                        futures = [pool.submit(pread_into, fd, dst, self.spans[ref][0] + start * self.spans[ref][1],
                                               self.path) for dst, ref in jobs]
                    else:
                        copies = [(self.aux[i][:n, :, s * self.T:(s + 1) * self.T], self.views[ref])
                                  for s, ref in enumerate(self.refs)]
                        if self.emb is not None:
                            copies.append((self.emb[i][:n], self.views[EMBEDDING]))
                        futures = [pool.submit(dst.copy_, src[start:end]) for dst, src in copies]
                    for f in futures:
                        f.result()
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
                    if self.spans is not None:  # [slots, batch, S, T] -> [n, S, slots*T] on the GPU
                        raw = self.aux[i].to(self.device, non_blocking=True)
                        aux = raw[:, :n].permute(1, 2, 0, 3).reshape(n, self.S, len(self.refs) * self.T)
                    else:
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
            alive = t.is_alive()
            pool.shutdown(wait=not alive)
            if fd >= 0 and not alive:  # (a reader still running keeps its descriptor)
                os.close(fd)


def batches(states, refs: LayerSet, *, total: int, batch_size: int, with_embeddings: bool, device, dtype,
            feeder: bool = True) -> Iterator[tuple]:
    """``(start, stop, aux, embeddings)`` per batch of sequences (``embeddings`` None unless
    asked for). On a CUDA ``device`` an eagle3conv states file goes through
    :class:`GpuFeeder` (unless ``feeder`` is False: the plain path, same numbers);
    otherwise the states' own batches, read ahead in a thread (pinned on CUDA)."""
    cuda = device.type == "cuda"
    infos = hidden_infos(states) if cuda and feeder else None  # the header read once for views and spans
    if infos is not None:
        yield from GpuFeeder(mapped_states(states, infos), refs, total, batch_size, with_embeddings, device, dtype,
                             spans=state_spans(states, infos), path=states.path)
        return
    for b in prefetch(states.batches(refs, batch_size=batch_size, with_embeddings=with_embeddings), pin=cuda):
        yield b.start, b.stop, b.aux, b.embeddings


__all__ = ["GpuFeeder", "batches", "mapped_states", "prefetch", "pread_into", "state_spans"]
