"""One of each piece of infrastructure: safetensors layout/reader, atomic JSON, dtype and
device resolution, and the one progress signature ``(stage, done, total)``."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from safetensors.torch import load_file

from eagle3conv.api import fix_keys
from eagle3conv.errors import CheckpointReadError, UsageError
from eagle3conv.io import dtypes
from eagle3conv.io.devices import resolve_device, resolve_dtype
from eagle3conv.io.files import atomic_write_json, write_json_file
from eagle3conv.io.safetensors import header_layout, pwrite_all, read_safetensors_header


def test_fix_keys_progress_is_stage_done_total(make_ckpt, tmp_path):
    seen = []
    res = fix_keys(make_ckpt("specforge"), out=tmp_path / "out", progress=lambda *a: seen.append(a))
    assert seen and all(len(call) == 3 and call[0] == "write" for call in seen)
    done = [d for _, d, _ in seen]
    assert done == sorted(done) and len(set(done)) == len(done)  # grows at every call
    total = seen[-1][2]
    assert {t for _, _, t in seen} == {total} and done[-1] == total
    written = sum(info.nbytes for f in (tmp_path / "out").glob("*.safetensors")
                  for info in read_safetensors_header(f)[0].values())
    assert total == written == res.written.bytes_written


def test_header_layout_is_read_back_by_the_validated_reader(tmp_path):
    tensors = {"b": torch.arange(6, dtype=torch.int64).reshape(2, 3), "a": torch.ones(5, dtype=torch.bfloat16),
               "m": torch.tensor([True, False, True])}
    entries = [(n, dtypes.from_torch(t.dtype), list(t.shape)) for n, t in tensors.items()]
    header, placed = header_layout(entries, {"format": "pt"})
    assert len(header) % 8 == 0 and [n for _, n in placed] == [t.nbytes for t in tensors.values()]
    path = tmp_path / "x.safetensors"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        pwrite_all(fd, header, 0)
        for t, (off, _) in zip(tensors.values(), placed, strict=True):
            pwrite_all(fd, t.contiguous().view(torch.uint8).numpy(), len(header) + off, chunk=3)
    finally:
        os.close(fd)
    infos, meta = read_safetensors_header(path)
    assert meta == {"format": "pt"} and set(infos) == set(tensors)
    got = load_file(path)
    for name, t in tensors.items():
        assert torch.equal(got[name], t), name
    os.truncate(path, path.stat().st_size - 1)
    with pytest.raises(CheckpointReadError, match="truncated"):
        read_safetensors_header(path)


def test_pwrite_all_raises_on_a_short_write(tmp_path):
    r, w = os.pipe()  # pwrite on a pipe fails: never a silent partial write
    try:
        with pytest.raises(OSError):
            pwrite_all(w, b"abc", 0)
    finally:
        os.close(r)
        os.close(w)


def test_atomic_write_json_refuses_nan_and_keeps_the_old_file(tmp_path):
    p = tmp_path / "config.json"
    atomic_write_json(p, {"a": 1}, mode=0o600)
    assert json.loads(p.read_text()) == {"a": 1} and (p.stat().st_mode & 0o777) == 0o600
    with pytest.raises(ValueError):
        atomic_write_json(p, {"a": math.nan})
    assert json.loads(p.read_text()) == {"a": 1}
    assert sorted(x.name for x in tmp_path.iterdir()) == ["config.json"]  # no temp left behind
    write_json_file(tmp_path / "journal.json", {"b": [1, 2]})
    assert (tmp_path / "journal.json").read_text() == '{\n  "b": [\n    1,\n    2\n  ]\n}\n'


def test_one_dtype_resolver():
    assert resolve_dtype("BF16") is torch.bfloat16 and resolve_dtype(" half ") is torch.float16
    assert resolve_dtype("float") is torch.float32 and resolve_dtype(torch.float16) is torch.float16
    assert resolve_dtype("auto", "cpu") is torch.float32 and resolve_dtype("auto", "cuda:0") is torch.bfloat16
    with pytest.raises(UsageError, match=r"states dtype must be bf16, fp16 or fp32, got 'auto'"):
        resolve_dtype("auto", what="states dtype")  # auto needs a device
    with pytest.raises(UsageError, match="--dtype must be auto, bf16, fp16 or fp32"):
        resolve_dtype("int8", "cpu")
    with pytest.raises(UsageError):
        resolve_dtype(torch.int64)
    assert dtypes.torch_name("BF16") == "bfloat16" and dtypes.storage_view("BF16")[1] == "bfloat16"
    assert dtypes.storage_view("F32") == (dtypes.numpy_dtype("F32"), None)


def test_one_device_resolver():
    assert resolve_device(None) in ("cpu", "cuda") and resolve_device(" CPU ") == "cpu"
    with pytest.raises(UsageError, match="use auto, cpu, cuda or cuda:N"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="no CUDA device here"):
            resolve_device("cuda:0")
