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


def mapped_states(states) -> dict | None:
    """Zero-copy CPU views (``np.memmap``) of every hidden state in an eagle3conv
    states file, by LayerRef; None for other sources. Byte offsets come from the
    validated safetensors header reader (the file was validated on open, too)."""
    import warnings

    import numpy as np
    import torch

    from eagle3conv.io import dtypes
    from eagle3conv.io.safetensors import read_safetensors_header
    from eagle3conv.states.format import StatesFile, hidden_key

    if not isinstance(states, StatesFile):
        return None
    header, _ = read_safetensors_header(states.path)
    raw = np.memmap(states.path, dtype=np.uint8, mode="r")
    out = {}
    for ref in states.layers:
        info = header[hidden_key(ref)]
        np_dt, view = dtypes.storage_view(info.dtype)
        arr = raw[info.start: info.end].view(np_dt).reshape(info.shape)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only map: we only ever read it
            t = torch.from_numpy(arr)
        out[ref] = t.view(getattr(torch, view)) if view is not None else t
    return out


class GpuFeeder:
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
        # allocated pinned (not empty().pin_memory(), which fills a pageable copy first)
        self.aux = [torch.empty(batch_size, self.S, k * self.T, dtype=store, pin_memory=True)
                    for _ in range(self.nbuf)]
        self.emb = ([torch.empty(batch_size, self.S, self.T, dtype=store, pin_memory=True) for _ in range(self.nbuf)]
                    if with_emb else None)
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
                    jobs = [(self.aux[i][:n, :, s * self.T:(s + 1) * self.T], self.views[ref])
                            for s, ref in enumerate(self.refs)]
                    if self.emb is not None:
                        jobs.append((self.emb[i][:n], self.views[EMBEDDING]))
                    for f in [pool.submit(dst.copy_, src[start:end]) for dst, src in jobs]:
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
            pool.shutdown(wait=False)


def batches(states, refs: LayerSet, *, total: int, batch_size: int, with_embeddings: bool, device, dtype,
            feeder: bool = True) -> Iterator[tuple]:
    """``(start, stop, aux, embeddings)`` per batch of sequences (``embeddings`` None unless
    asked for). On a CUDA ``device`` an eagle3conv states file goes through
    :class:`GpuFeeder` (unless ``feeder`` is False: the plain path, same numbers);
    otherwise the states' own batches, read ahead in a thread (pinned on CUDA)."""
    cuda = device.type == "cuda"
    views = mapped_states(states) if cuda and feeder else None
    if views is not None:
        yield from GpuFeeder(views, refs, total, batch_size, with_embeddings, device, dtype)
        return
    for b in prefetch(states.batches(refs, batch_size=batch_size, with_embeddings=with_embeddings), pin=cuda):
        yield b.start, b.stop, b.aux, b.embeddings


__all__ = ["GpuFeeder", "batches", "mapped_states", "prefetch"]
