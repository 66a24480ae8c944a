"""verify's weight loader: ``read_to_device`` gives the bytes ``safetensors`` gives.

The pipelined reader (preadv into a ring of pinned buffers, copied out piece by piece)
is what ``load_drafter_weights`` uses on CUDA; on CPU the same code runs with plain
buffers, so the piece arithmetic -- tensors split across pieces, pieces spanning
tensors, several files, host-kept names -- is checked here byte for byte.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3conv.checkpoint.index import open_checkpoint
from eagle3conv.errors import CheckpointReadError
from eagle3conv.verify.inputs import HOST_TENSORS, read_to_device


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "fc.weight": torch.randn(24, 72, generator=g).to(torch.bfloat16),
        "norm.weight": torch.randn(24, generator=g),
        "d2t": torch.randint(-5, 5, (17,), generator=g),
        "t2d": torch.rand(31, generator=g) > 0.5,
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "embed_tokens.weight": torch.randn(40, 24, generator=g).to(torch.float16),
    }


def _folder(tmp_path: Path, shards: int) -> Path:
    folder = tmp_path / f"ckpt{shards}"
    folder.mkdir()
    everything = _tensors(0)
    names = sorted(everything)
    for i in range(shards):
        part = {n: everything[n] for n in names[i::shards]}
        save_file(part, str(folder / f"model-{i:05d}-of-{shards:05d}.safetensors"))
    return folder


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("chunk", [7, 64, 1000, 1 << 20])
def test_read_to_device_equals_safetensors(tmp_path, shards, chunk):
    folder = _folder(tmp_path, shards)
    want = {}
    for f in sorted(folder.glob("*.safetensors")):
        want.update(load_file(str(f)))
    index = open_checkpoint(folder)
    got = read_to_device(index.tensors, "cpu", host=HOST_TENSORS, chunk=chunk, depth=2)
    assert set(got) == set(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name].view(-1).view(torch.uint8), t.view(-1).view(torch.uint8)), name


def test_read_to_device_says_which_file_was_cut_short(tmp_path):
    folder = _folder(tmp_path, 1)
    index = open_checkpoint(folder)
    f = next(folder.glob("*.safetensors"))
    f.write_bytes(f.read_bytes()[:-40])  # truncated after the header was validated
    with pytest.raises(CheckpointReadError, match="ended early"):
        read_to_device(index.tensors, "cpu", chunk=64)
