"""vLLM files and SpecForge records through verify's feeder (issue 26: the real formats read as fast
as the states file, on the GPU too).

On CUDA, verify reads vLLM ``hs_{i}.safetensors`` and SpecForge records through the same
double-buffered feeder as its own states file, each sequence read by the source's ``row_reader``
straight into its row of the batch buffer. The same code runs on the CPU without pinned memory:
here every batch it hands out must equal, bit for bit, the states file's rows of the same tokens
(slots in stored order, reordered, skipped; the embedding output; short last batches after longer
sequences were in the same buffer rows).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from eagle3conv.spec.layers import EMBEDDING, outputs
from eagle3conv.states.format import StatesFile
from eagle3conv.states.readers import SpecForgeStates
from eagle3conv.states.vllm import VllmStates
from eagle3conv.verify.feed import feeder_for
from test_states_real import VLLM_IDS, _specforge_folder, vllm_folder, write_vllm_file
from test_verify import world  # noqa: F401 - the shared tiny target and its captured states

CPU = torch.device("cpu")


def _fed(states, refs, *, with_embeddings=False, batch_size=5):
    """Every batch the feeder hands out on the CPU, copied before the next is asked for."""
    fed = feeder_for(states, refs, total=states.num_sequences, batch_size=batch_size,
                     with_embeddings=with_embeddings, device=CPU, dtype=torch.float32)
    assert fed is not None and fed.rows is not None  # the source's own reader, not the plain path
    return [(a, b, aux.clone(), None if emb is None else emb.clone()) for a, b, aux, emb in fed]


def _same_as_states_file(batches, st: StatesFile, refs, *, with_embeddings=False) -> None:
    assert [b[0] for b in batches] == list(range(0, st.num_sequences, batches[0][1]))
    assert batches[-1][1] == st.num_sequences
    for start, stop, aux, emb in batches:
        assert torch.equal(aux, st.aux(refs, slice(start, stop))), (refs, start)
        if with_embeddings:
            assert torch.equal(emb, st.embeddings(slice(start, stop)))


def test_vllm_rows_through_the_feeder_are_the_states_file_rows(world, tmp_path):  # noqa: F811
    _, captured, _ = world
    with StatesFile(captured) as st:
        folder = vllm_folder(st, tmp_path / "a", with_dataset=False)
        emb_folder = vllm_folder(st, tmp_path / "b", with_dataset=False, ids=(0, 2, 4, 6))
        vs = VllmStates(folder, vllm_ids=VLLM_IDS)
        for refs in (outputs(1, 3, 4), outputs(1, 3, 4, 5), outputs(4, 1), outputs(3), outputs(5, 1)):
            for bs in (5, 12):
                _same_as_states_file(_fed(vs, refs, batch_size=bs), st, refs)
        ve = VllmStates(emb_folder, vllm_ids=(0, 2, 4, 6))
        for refs in (outputs(1, 3), outputs(3, 5), (EMBEDDING,) + outputs(3)):
            _same_as_states_file(_fed(ve, refs, with_embeddings=True), st, refs, with_embeddings=True)
        # the plain path reads through the same reader
        assert torch.equal(vs.aux(outputs(4, 1), slice(3, 11)), st.aux(outputs(4, 1), slice(3, 11)))


def test_specforge_rows_through_the_feeder_are_the_states_file_rows(world, tmp_path):  # noqa: F811
    _, captured, _ = world
    with StatesFile(captured) as st:
        folder = _specforge_folder(st, tmp_path / "sf", (1, 3, 4))
        sf = SpecForgeStates(folder, layers=outputs(1, 3, 4))
        for refs in (outputs(1, 3, 4), outputs(4, 1), outputs(3)):
            _same_as_states_file(_fed(sf, refs), st, refs)
        assert feeder_for(sf, outputs(1), total=12, batch_size=4, with_embeddings=True, device=CPU,
                          dtype=torch.float32) is None  # no embedding output in the records: the plain path explains


def test_vllm_files_of_mixed_dtypes_take_the_plain_path(tmp_path):
    """Files of one folder in different dtypes: no byte-for-byte reader; the rows are read through
    safetensors and cast to the first file's dtype, as before."""
    g = torch.Generator().manual_seed(0)
    hs = [torch.randn(s, 2, 8, generator=g) for s in (5, 3)]
    write_vllm_file(tmp_path / "hs_0.safetensors", hs[0].bfloat16(), torch.arange(5))
    write_vllm_file(tmp_path / "hs_1.safetensors", hs[1], torch.arange(3))
    vs = VllmStates(tmp_path, vllm_ids=(1, 2))
    assert vs.row_reader(None) is None
    assert feeder_for(vs, outputs(0, 1), total=2, batch_size=2, with_embeddings=False, device=CPU,
                      dtype=torch.float32) is None
    got = vs.aux(outputs(0, 1))
    assert got.dtype == torch.bfloat16
    assert torch.equal(got[1, :3], hs[1].bfloat16().reshape(3, 16)) and not got[1, 3:].any()


def test_pread_scatter_fills_more_buffers_than_one_call_takes(tmp_path):
    from eagle3conv.io.pread import IOV_MAX, pread_scatter

    data = os.urandom(40_000)
    p = Path(tmp_path / "f.bin")
    p.write_bytes(data)
    sizes = [1 + (i * 7) % 13 for i in range(IOV_MAX * 2 + 5)]
    bufs = [memoryview(bytearray(n)) for n in sizes]
    fd = os.open(p, os.O_RDONLY)
    try:
        pread_scatter(fd, bufs, 123, p)
    finally:
        os.close(fd)
    assert b"".join(bytes(b) for b in bufs) == data[123:123 + sum(sizes)]
