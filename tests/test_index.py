"""The lazy checkpoint index: every accepted layout, every refusal, and no tensor bytes read."""

from __future__ import annotations

import argparse
import json
import os
import pickle
import struct
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from conftest import PICO, assert_sglang_checkpoint, save_st
from eagle3conv.api import fix_keys
from eagle3conv.checkpoint.index import open_checkpoint, read_safetensors_header
from eagle3conv.cli import main
from eagle3conv.errors import CheckpointReadError, UnsafePickleError, UsageError
from eagle3conv.example import canonical_tensors

def _drafter() -> dict:
    t = canonical_tensors(PICO)
    t.pop("embed_tokens.weight")
    return t


def _cfg(src: Path, dst: Path) -> None:
    (dst / "config.json").write_text((src / "config.json").read_text())


def _header(path: Path) -> tuple[int, dict]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return n, json.loads(raw[8 : 8 + n])


def _write_raw_safetensors(path: Path, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


# --- safetensors ------------------------------------------------------------------------


def test_single_safetensors(make_ckpt):
    ckpt = make_ckpt("sglang")
    idx = open_checkpoint(ckpt)
    assert idx.layout == "safetensors"
    assert idx.root == ckpt
    assert [p.name for p in idx.weight_files] == ["model.safetensors"]
    assert idx.config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert [p.name for p in idx.other_files] == ["tokenizer_config.json"]
    ref = _drafter()
    assert set(idx.tensors) == set(ref)
    for name, t in ref.items():
        info = idx.tensors[name]
        assert info.shape == tuple(t.shape)
        assert info.nbytes == t.numel() * t.element_size()
    assert idx.total_bytes == sum(t.numel() * t.element_size() for t in ref.values())
    # the file itself can be passed too
    by_file = open_checkpoint(ckpt / "model.safetensors")
    assert set(by_file.tensors) == set(ref) and by_file.root == ckpt


def test_offsets_point_at_each_tensors_bytes(make_ckpt):
    ckpt = make_ckpt("sglang")
    path = ckpt / "model.safetensors"
    idx = open_checkpoint(ckpt)
    raw = path.read_bytes()
    with safe_open(str(path), framework="pt") as f:
        for name, info in idx.tensors.items():
            t = f.get_tensor(name)
            want = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            assert raw[info.start : info.end] == want, name
            if info.dtype != "BF16":
                assert (idx.read_array(name) == t.numpy()).all()
            assert torch.equal(idx.read_torch(name), t)


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
def test_building_the_index_reads_headers_only(tmp_path, make_ckpt):
    """A 1 GiB (sparse) safetensors file is indexed by reading its header and nothing else."""
    open_checkpoint(make_ckpt("sglang"))  # warm-up: lazy imports read files too
    big = tmp_path / "big"
    big.mkdir()
    n = 1 << 29  # BF16 elements: 1 GiB of data
    header = {"__metadata__": {"format": "pt"}, "huge": {"dtype": "BF16", "shape": [n], "data_offsets": [0, 2 * n]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path = big / "model.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + 2 * n)  # a hole: no disk used
    before = _rchar()
    idx = open_checkpoint(big)
    read = _rchar() - before
    assert idx.tensors["huge"].nbytes == 2 * n
    assert idx.tensors["huge"].start == 8 + len(raw) and idx.tensors["huge"].end == 8 + len(raw) + 2 * n
    assert read < 64 * 1024, f"indexing read {read} bytes"


def test_sharded_with_index(tmp_path, make_ckpt):
    src = make_ckpt("sglang")
    t = _drafter()
    names = sorted(t)
    ck = tmp_path / "sharded"
    ck.mkdir()
    a = {k: t[k] for k in names[:7]}
    b = {k: t[k] for k in names[7:]}
    save_st(a, ck / "model-00001-of-00002.safetensors")
    save_st(b, ck / "model-00002-of-00002.safetensors")
    wm = {k: "model-00001-of-00002.safetensors" for k in a} | {k: "model-00002-of-00002.safetensors" for k in b}
    (ck / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    _cfg(src, ck)
    idx = open_checkpoint(ck)
    assert idx.layout == "safetensors-sharded"
    assert [p.name for p in idx.weight_files] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert set(idx.tensors) == set(t)
    assert idx.tensors[names[0]].file.name == "model-00001-of-00002.safetensors"
    assert idx.tensors[names[-1]].file.name == "model-00002-of-00002.safetensors"
    # passing the index file itself works too
    assert set(open_checkpoint(ck / "model.safetensors.index.json").tensors) == set(t)
    # and it converts, keeping the two shards
    out = tmp_path / "out"
    res = fix_keys(ck, out=out)
    assert [f for f, _ in res.shards] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert_sglang_checkpoint(out)


def _two_shards(tmp_path, make_ckpt):
    src = make_ckpt("sglang")
    t = _drafter()
    names = sorted(t)
    ck = tmp_path / "bad-index"
    ck.mkdir()
    _cfg(src, ck)
    return ck, t, names


def test_index_lists_a_key_the_shard_lacks(tmp_path, make_ckpt):
    ck, t, names = _two_shards(tmp_path, make_ckpt)
    save_st({k: t[k] for k in names[1:]}, ck / "model-00001-of-00001.safetensors")
    wm = {k: "model-00001-of-00001.safetensors" for k in names}  # names[0] is listed, absent
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(CheckpointReadError) as e:
        open_checkpoint(ck)
    assert "model-00001-of-00001.safetensors" in e.value.message
    assert "1 listed but absent" in e.value.message
    assert any(names[0] in d and "not in it" in d for d in e.value.details)


def test_shard_holds_a_key_the_index_does_not_list(tmp_path, make_ckpt):
    ck, t, names = _two_shards(tmp_path, make_ckpt)
    save_st({k: t[k] for k in names[:5]}, ck / "model-00001-of-00002.safetensors")
    save_st({k: t[k] for k in names[5:]}, ck / "model-00002-of-00002.safetensors")
    wm = {k: "model-00001-of-00002.safetensors" for k in names[:4]}  # names[4] unlisted
    wm |= {k: "model-00002-of-00002.safetensors" for k in names[5:]}
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(CheckpointReadError) as e:
        open_checkpoint(ck)
    assert "model-00001-of-00002.safetensors" in e.value.message
    assert any(names[4] in d and "does not list" in d for d in e.value.details)


def test_index_lists_a_missing_shard(tmp_path, make_ckpt):
    ck, t, names = _two_shards(tmp_path, make_ckpt)
    save_st(t, ck / "model-00001-of-00002.safetensors")
    wm = {k: "model-00001-of-00002.safetensors" for k in names} | {"extra.weight": "model-00002-of-00002.safetensors"}
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(CheckpointReadError, match="model-00002-of-00002.safetensors, which does not exist"):
        open_checkpoint(ck)


@pytest.mark.parametrize("index_json", ['{"metadata": {}}', '{"weight_map": {}}', "[1, 2]", "{not json"])
def test_index_json_malformed(tmp_path, make_ckpt, index_json):
    ck, t, names = _two_shards(tmp_path, make_ckpt)
    save_st(t, ck / "model-00001-of-00001.safetensors")
    (ck / "model.safetensors.index.json").write_text(index_json)
    with pytest.raises(CheckpointReadError, match="model.safetensors.index.json"):
        open_checkpoint(ck)


@pytest.mark.parametrize("shard", ["../x.safetensors", "/etc/x.safetensors", "sub/../../x.safetensors", "a\\..\\x.safetensors", ""])
def test_shard_name_outside_the_folder_is_refused(tmp_path, make_ckpt, shard):
    ck, t, names = _two_shards(tmp_path, make_ckpt)
    # a real file where ../x.safetensors points, so only the name check can refuse it
    save_st(t, tmp_path / "x.safetensors")
    wm = {k: shard for k in names}
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(CheckpointReadError) as e:
        open_checkpoint(ck)
    assert "points outside the checkpoint folder" in e.value.message
    assert repr(shard) in e.value.message


def test_several_safetensors_without_index(tmp_path, make_ckpt):
    ck, t, names = _two_shards(tmp_path, make_ckpt)
    save_st({k: t[k] for k in names[:5]}, ck / "a.safetensors")
    save_st({k: t[k] for k in names[5:]}, ck / "b.safetensors")
    idx = open_checkpoint(ck)
    assert idx.layout == "safetensors-multi" and set(idx.tensors) == set(t)
    # the same key in two files is an error naming it
    save_st({names[0]: t[names[0]]}, ck / "c.safetensors")
    with pytest.raises(CheckpointReadError, match=f"c.safetensors: tensors also present in another file: {names[0]}"):
        open_checkpoint(ck)


# --- broken safetensors --------------------------------------------------------------------


def test_truncated_safetensors(make_ckpt):
    ck = make_ckpt("sglang")
    path = ck / "model.safetensors"
    raw = path.read_bytes()
    path.write_bytes(raw[:-5])
    with pytest.raises(CheckpointReadError) as e:
        open_checkpoint(ck)
    assert "model.safetensors" in e.value.message and "truncated" in e.value.message
    assert e.value.hint and "download" in e.value.hint
    # cut inside the header: still a clear error, not a crash
    path.write_bytes(raw[:40])
    with pytest.raises(CheckpointReadError, match="truncated"):
        open_checkpoint(ck)
    path.write_bytes(raw[:3])
    with pytest.raises(CheckpointReadError, match="not a safetensors file"):
        open_checkpoint(ck)


def test_padded_safetensors(make_ckpt):
    ck = make_ckpt("sglang")
    with open(ck / "model.safetensors", "ab") as f:
        f.write(b"\0" * 16)
    with pytest.raises(CheckpointReadError, match="truncated or padded"):
        open_checkpoint(ck)


def test_corrupted_header_json(make_ckpt):
    ck = make_ckpt("sglang")
    path = ck / "model.safetensors"
    raw = bytearray(path.read_bytes())
    raw[8] = ord("#")  # the header's opening brace
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointReadError, match="header is not valid JSON"):
        open_checkpoint(ck)


def test_header_entries_validated(tmp_path):
    path = tmp_path / "model.safetensors"
    cases = {
        "unknown dtype": ({"a": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 2]}}, 2),
        "spans": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, 4),
        "malformed header entry": ({"a": {"dtype": "F32", "shape": [2]}}, 8),
        "negative dimension": ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 0]}}, 0),
        "not a JSON object": ([1, 2], 0),
    }
    for words, (header, nbytes) in cases.items():
        _write_raw_safetensors(path, header, b"\0" * nbytes)
        with pytest.raises(CheckpointReadError, match=words):
            read_safetensors_header(path)


def test_overlapping_offsets(tmp_path):
    path = tmp_path / "model.safetensors"
    header = {
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
    }
    _write_raw_safetensors(path, header, b"\0" * 24)
    with pytest.raises(CheckpointReadError, match="'b' overlaps or leaves a hole"):
        read_safetensors_header(path)
    # a hole is refused the same way
    header["b"]["data_offsets"] = [24, 40]
    _write_raw_safetensors(path, header, b"\0" * 40)
    with pytest.raises(CheckpointReadError, match="overlaps or leaves a hole"):
        read_safetensors_header(path)


def test_huge_header_length_refused(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(CheckpointReadError, match="header length"):
        read_safetensors_header(path)


# --- pickles ---------------------------------------------------------------------------------


def test_pytorch_model_bin(tmp_path, make_ckpt):
    src = make_ckpt("sglang")
    ck = tmp_path / "bin"
    ck.mkdir()
    t = _drafter()
    torch.save(t, ck / "pytorch_model.bin")
    _cfg(src, ck)
    idx = open_checkpoint(ck)
    assert idx.layout == "pickle" and idx.wrapper is None
    assert set(idx.tensors) == set(t)
    assert all(i.start is None for i in idx.tensors.values())
    assert (idx.read_array("d2t") == t["d2t"].numpy()).all()
    out = tmp_path / "out"
    fix_keys(ck, out=out)
    assert_sglang_checkpoint(out)


def test_pytorch_model_bin_index(tmp_path, make_ckpt):
    src = make_ckpt("sglang")
    ck = tmp_path / "binsharded"
    ck.mkdir()
    t = _drafter()
    names = sorted(t)
    torch.save({k: t[k] for k in names[:6]}, ck / "pytorch_model-00001-of-00002.bin")
    torch.save({k: t[k] for k in names[6:]}, ck / "pytorch_model-00002-of-00002.bin")
    wm = {k: "pytorch_model-00001-of-00002.bin" for k in names[:6]} | {k: "pytorch_model-00002-of-00002.bin" for k in names[6:]}
    (ck / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    _cfg(src, ck)
    idx = open_checkpoint(ck)
    assert idx.layout == "pickle-sharded"
    assert set(idx.tensors) == set(t)
    out = tmp_path / "out"
    fix_keys(ck, out=out)
    assert_sglang_checkpoint(out)
    # the weight_map is checked against pickled shards too
    wm[names[0]] = "pytorch_model-00002-of-00002.bin"
    (ck / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    with pytest.raises(CheckpointReadError, match="weight_map disagrees"):
        open_checkpoint(ck)


@pytest.mark.parametrize("wrapper", ["state_dict", "module", "model_state_dict", "model"])
def test_pt_wrappers(tmp_path, make_ckpt, wrapper):
    src = make_ckpt("sglang")
    ck = tmp_path / "pt"
    ck.mkdir()
    t = _drafter()
    torch.save({wrapper: t, "epoch": 3, "optimizer": {"state": {0: {"exp_avg": torch.ones(2)}}}}, ck / "model.pt")
    _cfg(src, ck)
    idx = open_checkpoint(ck)
    assert idx.wrapper == wrapper
    assert set(idx.tensors) == set(t)
    assert idx.extras == {"epoch": 3}  # optimizer state is not carried
    out = tmp_path / "out"
    fix_keys(ck, out=out)
    assert_sglang_checkpoint(out)


def test_pickle_non_tensor_entries_are_skipped_and_listed(tmp_path, make_ckpt):
    src = make_ckpt("sglang")
    ck = tmp_path / "pt"
    ck.mkdir()
    t = _drafter()
    t["step"] = 7
    torch.save(t, ck / "model.pth")
    _cfg(src, ck)
    idx = open_checkpoint(ck)
    assert idx.skipped == ["step"] and "step" not in idx.tensors


def test_pickle_without_tensors(tmp_path):
    ck = tmp_path / "empty"
    ck.mkdir()
    torch.save({"epoch": 1}, ck / "model.pt")
    with pytest.raises(CheckpointReadError, match="no tensors found"):
        open_checkpoint(ck)
    torch.save([torch.ones(2)], ck / "model.pt")
    with pytest.raises(CheckpointReadError, match="holds a list, not a state dict"):
        open_checkpoint(ck)


def test_specforge_runtime_training_state(make_ckpt, tmp_path):
    ck = make_ckpt("specforge-runtime")
    idx = open_checkpoint(ck)
    assert idx.layout == "training-state"
    assert idx.wrapper == "draft_state_dict"
    assert set(idx.tensors) == set(_drafter())
    assert isinstance(idx.extras["args"], argparse.Namespace) and idx.extras["args"].lr == 1e-4
    assert ["capture_layers", [1, 14, 26]] in idx.extras["specforge_model_provenance"]
    assert idx.extras["global_step"] == 100
    # the file itself, too
    assert open_checkpoint(ck / "training_state.pt").layout == "training-state"
    out = tmp_path / "out"
    fix_keys(ck, out=out)
    assert_sglang_checkpoint(out)


def test_legacy_training_state_without_weights(tmp_path):
    ck = tmp_path / "legacy"
    ck.mkdir()
    torch.save({"epoch": 1, "args": argparse.Namespace(lr=1.0), "optimizer": {"state": {}}}, ck / "training_state.pt")
    with pytest.raises(CheckpointReadError, match="no tensors found"):
        open_checkpoint(ck)


def test_legacy_non_zip_pickle(tmp_path, make_ckpt):
    src = make_ckpt("sglang")
    ck = tmp_path / "legacy"
    ck.mkdir()
    torch.save(_drafter(), ck / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    _cfg(src, ck)
    assert set(open_checkpoint(ck).tensors) == set(_drafter())


def test_truncated_pickles(tmp_path):
    for zipped in (True, False):
        ck = tmp_path / f"trunc-{zipped}"
        ck.mkdir()
        torch.save({"a": torch.ones(1000)}, ck / "model.pt", _use_new_zipfile_serialization=zipped)
        raw = (ck / "model.pt").read_bytes()
        (ck / "model.pt").write_bytes(raw[: len(raw) // 2])
        with pytest.raises(CheckpointReadError, match="model.pt: not a readable torch checkpoint"):
            open_checkpoint(ck)


def test_text_file_named_like_a_pickle(tmp_path):
    ck = tmp_path / "text"
    ck.mkdir()
    (ck / "pytorch_model.bin").write_bytes(b"hello world, not a pickle at all")
    with pytest.raises(CheckpointReadError, match="pytorch_model.bin"):
        open_checkpoint(ck)


# --- the malicious pickle ---------------------------------------------------------------------


class _Touch:
    def __init__(self, marker: Path, how: str):
        self.marker, self.how = str(marker), how

    def __reduce__(self):
        if self.how == "open":
            return (open, (self.marker, "w"))
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("how", ["open", "os.system"])
@pytest.mark.parametrize("container", ["torch-zip", "raw-pickle", "inside-state-dict"])
def test_malicious_pickle_is_refused_unrun(tmp_path, how, container):
    marker = tmp_path / "PWNED"
    ck = tmp_path / "evil"
    ck.mkdir()
    payload = _Touch(marker, how)
    if container == "torch-zip":
        torch.save(payload, ck / "pytorch_model.bin")
    elif container == "raw-pickle":
        with open(ck / "pytorch_model.bin", "wb") as f:
            pickle.dump(payload, f, protocol=2)
    else:
        torch.save({"fc.weight": torch.ones(2, 2), "evil": payload}, ck / "pytorch_model.bin")
    assert not marker.exists()
    with pytest.raises(UnsafePickleError) as e:
        open_checkpoint(ck)
    assert not marker.exists(), "the pickle ran code"
    assert "refused to unpickle" in e.value.message and "nothing in it was run" in e.value.message
    assert "pytorch_model.bin" in e.value.message
    assert e.value.hint and "safetensors" in e.value.hint

    runner = CliRunner()
    for cmd in (["inspect", str(ck)], ["fix-keys", str(ck), "--out", str(tmp_path / "out")]):
        res = runner.invoke(main, cmd)
        assert res.exit_code == 1, res.output
        assert "error:" in res.stderr and "refused to unpickle" in res.stderr
        assert "Traceback" not in res.output
        assert not marker.exists()
    assert not (tmp_path / "out").exists()


# --- Hugging Face cache layout -------------------------------------------------------------------


def _hf_cache(tmp_path: Path, src: Path) -> tuple[Path, Path]:
    repo = tmp_path / "hub" / "models--org--drafter"
    blobs = repo / "blobs"
    rev = "0123456789abcdef0123456789abcdef01234567"
    snap = repo / "snapshots" / rev
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, name in enumerate(("model.safetensors", "config.json", "tokenizer_config.json")):
        sha = f"{i:064x}"
        (blobs / sha).write_bytes((src / name).read_bytes())
        (snap / name).symlink_to(Path("../../blobs") / sha)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    return repo, snap


@pytest.mark.parametrize("via", ["repo", "snapshot"])
def test_hf_cache_layout(tmp_path, make_ckpt, via):
    repo, snap = _hf_cache(tmp_path, make_ckpt("modelopt-export"))
    before = {p: p.read_bytes() for p in (repo / "blobs").iterdir()}
    idx = open_checkpoint(repo if via == "repo" else snap)
    assert idx.root == snap
    assert idx.layout == "safetensors"
    assert "layers.0.self_attn.q_proj.weight" in idx.tensors
    assert idx.config["draft_vocab_size"] == PICO.draft_vocab
    assert [p.name for p in idx.other_files] == ["tokenizer_config.json"]
    out = tmp_path / "out"
    fix_keys(repo if via == "repo" else snap, out=out)
    assert_sglang_checkpoint(out)
    assert not (out / "tokenizer_config.json").is_symlink()
    # the cache is never rewritten in place
    with pytest.raises(UsageError, match="Hugging Face cache"):
        fix_keys(repo if via == "repo" else snap)
    assert {p: p.read_bytes() for p in (repo / "blobs").iterdir()} == before


def test_hf_cache_without_refs(tmp_path, make_ckpt):
    repo, snap = _hf_cache(tmp_path, make_ckpt("sglang"))
    (repo / "refs" / "main").unlink()
    assert open_checkpoint(repo).root == snap  # the only snapshot
    (repo / "snapshots" / "other").mkdir()
    with pytest.raises(UsageError, match="2 snapshots and no refs/main") as e:
        open_checkpoint(repo)
    assert str(snap) in e.value.hint


# --- folders that are not (one) checkpoint ----------------------------------------------------


def test_dcp_folder_refused(tmp_path):
    ck = tmp_path / "dcp"
    ck.mkdir()
    (ck / "__0_0.distcp").write_bytes(b"\0" * 64)
    (ck / ".metadata").write_bytes(b"\x80\x04.")
    with pytest.raises(CheckpointReadError) as e:
        open_checkpoint(ck)
    assert "DCP" in e.value.message and "dcp_to_torch_save" in e.value.hint
    assert type(e.value) is CheckpointReadError


def test_folder_of_state_subfolders_suggests_one(tmp_path):
    root = tmp_path / "run"
    for i in range(3):
        (root / f"state_{i}").mkdir(parents=True)
        torch.save({"midlayer.norm.weight": torch.ones(2)}, root / f"state_{i}" / "pytorch_model.bin")
    with pytest.raises(UsageError) as e:
        open_checkpoint(root)
    assert "3 training checkpoints" in e.value.message and "state_0" in e.value.message
    assert str(root / "state_2") in e.value.hint


def test_several_pickles_without_index(tmp_path):
    ck = tmp_path / "many"
    ck.mkdir()
    torch.save({"a": torch.ones(1)}, ck / "a.pt")
    torch.save({"b": torch.ones(1)}, ck / "b.pt")
    with pytest.raises(UsageError, match="several pickled files") as e:
        open_checkpoint(ck)
    assert "a.pt" in e.value.message and "b.pt" in e.value.message


def test_nothing_found(tmp_path):
    ck = tmp_path / "empty"
    ck.mkdir()
    (ck / "README.md").write_text("hi")
    with pytest.raises(CheckpointReadError, match="no weights found"):
        open_checkpoint(ck)
    with pytest.raises(CheckpointReadError, match="no such file or folder"):
        open_checkpoint(tmp_path / "nope")
    with pytest.raises(UsageError, match="not a checkpoint file"):
        open_checkpoint(ck / "README.md")


def test_config_json_broken(make_ckpt):
    ck = make_ckpt("sglang")
    (ck / "config.json").write_text("{broken")
    with pytest.raises(CheckpointReadError, match="config.json: not valid JSON"):
        open_checkpoint(ck)
