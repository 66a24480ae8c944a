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

from eagle3conv.io.pread import pread_into
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


class GpuFeeder:
    """Batches of aux (and embedding) states on the GPU, double-buffered: threads read
    the next batch's rows into a pinned buffer (one host copy, no cat), a side stream
    uploads it, and the drafter's stream waits only for that upload. Host reads,
    uploads and compute overlap.

    With ``spans`` (:func:`state_spans`) and ``path``, each slot's rows -- one contiguous
    byte range of the file -- are read with ``preadv`` straight into a slot-major pinned
    buffer ``[slots, batch, positions, width]`` (large reads, no page faults), and the
    GPU puts the slots side by side after the upload. With ``rows`` (a states source's
    ``row_reader``: vLLM files, SpecForge records), each sequence is read by the reader
    straight into its row of a pinned ``[batch, positions, slots*width]`` buffer (the
    sequences of a batch side by side in the copy threads). Otherwise the rows are copied
    from the memory-mapped ``views``. The bytes, and so the numbers, are the same.

    On a CPU ``device`` the same code runs without pinned memory or streams (how tests and
    bench/ check it without a GPU); a batch is then a view of the feeder's buffer, valid
    until the next batch is asked for."""

    def __init__(self, views: dict | None, refs: LayerSet | None, total: int, batch_size: int, with_emb: bool,
                 device, dtype, *, spans: dict | None = None, path=None, rows=None):
        import torch

        self.views, self.refs, self.total, self.bs = views, refs, total, batch_size
        self.with_emb, self.device, self.dtype = with_emb, device, dtype
        self.cuda = device.type == "cuda"
        self.rows = rows
        if rows is not None:
            self.S, self.T, store, width = rows.seq_len, rows.hidden, rows.dtype, rows.width
            self.workers = min(batch_size, 8)  # one sequence (file) per copy thread
        else:
            first = views[refs[0]]
            self.S, self.T, store = first.shape[1], first.shape[2], first.dtype
            width = len(refs) * self.T
            self.workers = len(refs) + 1
        self.nbuf = 2
        need = [] if refs is None else list(refs) + ([EMBEDDING] if with_emb else [])
        self.spans = (spans if rows is None and spans is not None and path is not None
                      and all(r in spans for r in need) else None)
        self.path = path
        pin = self.cuda  # allocated pinned (not empty().pin_memory(), which fills a pageable copy first)
        if self.spans is not None:
            self.aux = [torch.empty(len(refs), batch_size, self.S, self.T, dtype=store, pin_memory=pin)
                        for _ in range(self.nbuf)]
            self.aux_bytes = [t.view(torch.uint8).numpy() for t in self.aux]
        else:
            self.aux = [torch.empty(batch_size, self.S, width, dtype=store, pin_memory=pin)
                        for _ in range(self.nbuf)]
        self.emb = ([torch.empty(batch_size, self.S, self.T, dtype=store, pin_memory=pin) for _ in range(self.nbuf)]
                    if with_emb else None)
        if self.spans is not None and self.emb is not None:
            self.emb_bytes = [t.view(torch.uint8).numpy() for t in self.emb]
        self.stream = torch.cuda.Stream(device=device) if self.cuda else None

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
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="eagle3conv-copy")
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
                    if self.rows is not None:  # each sequence read by its source's reader, into its row
                        futures = [pool.submit(self.rows.fill, start + r, self.aux[i][r],
                                               None if self.emb is None else self.emb[i][r]) for r in range(n)]
                    elif self.spans is not None:  # each slot's rows: one contiguous range of the file
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
                if not self.cuda:  # the same buffers, read in place; freed when the consumer is back
                    yield (start, end, self._host_aux(i, n).to(self.dtype),
                           None if self.emb is None else self.emb[i][:n].to(self.dtype))
                    free[i].put(None)
                    continue
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


    def _host_aux(self, i: int, n: int):
        """Buffer ``i``'s first ``n`` sequences as ``[n, S, slots*width]`` on the host (CPU device)."""
        if self.spans is not None:
            k = self.aux[i].shape[0]
            return self.aux[i][:, :n].permute(1, 2, 0, 3).reshape(n, self.S, k * self.T)
        return self.aux[i][:n]


def feeder_for(states, refs: LayerSet | None, *, total: int, batch_size: int, with_embeddings: bool, device,
               dtype) -> GpuFeeder | None:
    """The :class:`GpuFeeder` for ``states``: an eagle3conv states file by its header's byte ranges,
    a source with a ``row_reader`` (vLLM files, SpecForge records) by that; None for any other
    source, for no aux refs (``()``), or for embeddings a source does not hold (the plain path
    then explains). ``refs`` are checked as the plain path checks them."""
    infos = hidden_infos(states)  # the header read once for views and spans
    if infos is not None:
        return GpuFeeder(mapped_states(states, infos), refs, total, batch_size, with_embeddings, device, dtype,
                         spans=state_spans(states, infos), path=states.path)
    reader = getattr(states, "row_reader", None)
    if reader is None or (refs is not None and not len(refs)) or (with_embeddings and not states.has_embeddings):
        return None
    rows = reader(None if refs is None else states.check_refs(refs), with_embeddings)
    if rows is None:
        return None
    return GpuFeeder(None, refs, total, batch_size, with_embeddings, device, dtype, rows=rows)


def batches(states, refs: LayerSet, *, total: int, batch_size: int, with_embeddings: bool, device, dtype,
            feeder: bool = True) -> Iterator[tuple]:
    """``(start, stop, aux, embeddings)`` per batch of sequences (``embeddings`` None unless
    asked for). On a CUDA ``device`` an eagle3conv states file, vLLM files and SpecForge records
    go through :class:`GpuFeeder` (:func:`feeder_for`; unless ``feeder`` is False: the plain path,
    same numbers); otherwise the states' own batches, read ahead in a thread (pinned on CUDA)."""
    cuda = device.type == "cuda"
    fed = feeder_for(states, refs, total=total, batch_size=batch_size, with_embeddings=with_embeddings,
                     device=device, dtype=dtype) if cuda and feeder else None
    if fed is not None:
        yield from fed
        return
    for b in prefetch(states.batches(refs, batch_size=batch_size, with_embeddings=with_embeddings), pin=cuda):
        yield b.start, b.stop, b.aux, b.embeddings


__all__ = ["GpuFeeder", "batches", "feeder_for", "mapped_states", "prefetch", "pread_into", "state_spans"]
