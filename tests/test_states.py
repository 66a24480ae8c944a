"""Captured target states: the states file (write, read, every malformed field),
SGLang-style dumps, SpecForge records, detection. Real files in tmp_path.

Capture from a model lives in tests/test_capture.py.
"""

from __future__ import annotations

import gzip
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3conv.errors import CheckpointReadError, UnsafePickleError, UsageError, WiringError
from eagle3conv.states.format import (
    STATES_FORMAT,
    StatesFile,
    StatesWriter,
    hidden_key,
    write_states,
)
from eagle3conv.states.readers import DumpStates, SpecForgeStates, detect_states, open_states
from eagle3conv.spec.layers import EMBEDDING, LayerRef, outputs

B, S, T, N, V = 3, 7, 16, 6, 50
LENGTHS = [7, 4, 1]


def make_data(layers=(-1, 1, 2, 4), seed=0, loss=True):
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(S).unsqueeze(0) < torch.tensor(LENGTHS).unsqueeze(1)
    ids = torch.randint(0, V, (B, S), generator=g) * mask
    nxt = torch.randint(0, V, (B, S), generator=g) * mask
    hidden = {i: torch.randn(B, S, T, generator=g) * mask.unsqueeze(-1) * (i + 2) for i in layers}
    data = dict(input_ids=ids, attention_mask=mask, target_next=nxt, hidden=hidden)
    if loss:
        lm = mask.clone()
        lm[0, :3] = False
        data["loss_mask"] = lm
    return data


def write(path, **over):
    data = make_data()
    data.update(over)
    return write_states(path, num_layers=N, vocab_size=V, target="pico-target",
                        capture={"prompts": "p.txt", "generated": False}, **data)


@pytest.fixture
def states_path(tmp_path):
    return write(tmp_path / "states.safetensors")


# --------------------------------------------------------------------------- round trip


def test_round_trip(states_path):
    data = make_data()
    with StatesFile(states_path) as sf:
        assert sf.layers == (EMBEDDING, *outputs(1, 2, 4))
        assert (sf.num_layers, sf.hidden_size, sf.vocab_size) == (N, T, V)
        assert sf.shape == (B, S) and sf.num_tokens == sum(LENGTHS) and sf.lengths == LENGTHS
        assert sf.target == "pico-target" and sf.capture["prompts"] == "p.txt"
        assert sf.dtype == torch.bfloat16 and sf.version == 1
        assert torch.equal(sf.input_ids, data["input_ids"])
        assert torch.equal(sf.target_next, data["target_next"])
        assert torch.equal(sf.attention_mask, data["attention_mask"])
        assert torch.equal(sf.loss_mask, data["loss_mask"]) and sf.has_loss_mask
        assert torch.equal(sf.embeddings(), data["hidden"][-1].bfloat16())
        aux = sf.aux([LayerRef(4), LayerRef(1)])  # slot order, not storage order
        assert aux.shape == (B, S, 2 * T)
        assert torch.equal(aux[..., :T], data["hidden"][4].bfloat16())
        assert torch.equal(aux[..., T:], data["hidden"][1].bfloat16())
        assert torch.equal(sf.aux([2], rows=slice(1, 3)), data["hidden"][2][1:3].bfloat16())
        assert sf.aux([2], dtype="fp32").dtype == torch.float32
        assert sf.summary()["layers"] == [-1, 1, 2, 4]


def test_raw_layout_and_metadata(states_path):
    tensors = load_file(states_path)
    assert set(tensors) == {"input_ids", "target_next", "attention_mask", "loss_mask", "hidden.embedding",
                            "hidden.output_of.1", "hidden.output_of.2", "hidden.output_of.4"}
    assert tensors["attention_mask"].dtype == torch.bool
    with open(states_path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    meta = header["__metadata__"]
    assert meta["format"] == STATES_FORMAT and meta["version"] == "1"
    assert json.loads(meta["layers"]) == [-1, 1, 2, 4]
    assert json.loads(meta["capture"]) == {"generated": False, "prompts": "p.txt"}
    assert (8 + n) % 8 == 0
    for name, spec in header.items():  # every tensor starts aligned to its item size
        if name != "__metadata__":
            assert spec["data_offsets"][0] % tensors[name].element_size() == 0


def test_fp32_and_no_loss_mask(tmp_path):
    data = make_data(loss=False)
    p = write_states(tmp_path / "s.safetensors", num_layers=N, vocab_size=V, dtype="fp32", **data)
    with StatesFile(p) as sf:
        assert sf.dtype == torch.float32 and not sf.has_loss_mask
        assert torch.equal(sf.loss_mask, sf.attention_mask)
        assert torch.equal(sf.hidden(1), data["hidden"][1])


def test_batches_stream_rows(states_path):
    data = make_data()
    with StatesFile(states_path) as sf:
        got = list(sf.batches([2, -1], batch_size=2, with_embeddings=True))
        assert [(b.start, b.stop) for b in got] == [(0, 2), (2, 3)]
        assert torch.equal(torch.cat([b.aux for b in got]),
                           torch.cat([data["hidden"][2], data["hidden"][-1]], -1).bfloat16())
        assert sum(b.num_tokens for b in got) == sum(LENGTHS)
        assert all(b.embeddings is not None for b in got)
        assert list(sf.batches([], batch_size=5))[0].aux is None
        with pytest.raises(UsageError):
            list(sf.batches([1], batch_size=0))


def test_missing_layer_names_what_is_there(states_path):
    with StatesFile(states_path) as sf:
        with pytest.raises(WiringError) as e:
            sf.aux(outputs(1, 3, 5))
        msg = e.value.message
        assert "output of layer 3, the output of layer 5 were not captured" in msg
        assert "the embedding output and outputs of layers 1, 2, 4" in msg
        with pytest.raises(WiringError, match="repeat"):
            sf.aux([1, 1])
        with pytest.raises(UsageError, match="name the aux layers"):
            sf.aux(None)


def test_closed_file_refuses(states_path):
    sf = StatesFile(states_path)
    sf.close()
    with pytest.raises(UsageError, match="closed"):
        sf.aux([1])


# --------------------------------------------------------------------------- writer safety


def test_writer_streams_in_batches(tmp_path):
    data = make_data()
    p = tmp_path / "s.safetensors"
    with StatesWriter(p, num_sequences=B, seq_len=S, hidden_size=T, num_layers=N, vocab_size=V,
                      layers=[1, 2, 4], with_loss_mask=True) as w:
        for start in (2, 0):  # any order
            rows = slice(start, start + 2 if start == 0 else B)
            w.write(start, input_ids=data["input_ids"][rows], attention_mask=data["attention_mask"][rows],
                    target_next=data["target_next"][rows], loss_mask=data["loss_mask"][rows],
                    hidden={k: v[rows] for k, v in data["hidden"].items()})
    with StatesFile(p) as sf:
        assert torch.equal(sf.aux([4]), data["hidden"][4].bfloat16())
    assert os.listdir(tmp_path) == ["s.safetensors"]


def test_writer_never_leaves_a_half_file(tmp_path):
    p = tmp_path / "s.safetensors"
    p.write_bytes(b"the old file")
    data = make_data()
    with pytest.raises(UsageError, match="row 2 was never written"):
        with StatesWriter(p, num_sequences=B, seq_len=S, hidden_size=T, num_layers=N, vocab_size=V,
                          layers=[1, 2, 4], with_loss_mask=True) as w:
            rows = slice(0, 2)
            w.write(0, input_ids=data["input_ids"][rows], attention_mask=data["attention_mask"][rows],
                    target_next=data["target_next"][rows], loss_mask=data["loss_mask"][rows],
                    hidden={k: v[rows] for k, v in data["hidden"].items()})
    assert p.read_bytes() == b"the old file"
    assert os.listdir(tmp_path) == ["s.safetensors"]
    with pytest.raises(RuntimeError):
        with StatesWriter(p, num_sequences=1, seq_len=2, hidden_size=T, num_layers=N, vocab_size=V,
                          layers=[]):
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == ["s.safetensors"]


def test_writer_checks_its_input(tmp_path):
    data = make_data()
    p = tmp_path / "s.safetensors"
    with pytest.raises(UsageError, match="embedding output"):
        write(p, hidden={1: data["hidden"][1]})
    with pytest.raises(UsageError, match="do not exist"):
        write(p, hidden={-1: data["hidden"][-1], 6: data["hidden"][1]})
    with pytest.raises(UsageError, match="expected shape"):
        write(p, target_next=data["target_next"][:, :3])
    with pytest.raises(UsageError, match="bf16, fp16 or fp32"):
        write(p, dtype="int8")
    left = data["attention_mask"].flip(1)
    with pytest.raises(UsageError, match="rows 0..3: attention_mask row 1 is not right padded"):
        write(p, attention_mask=left)
    with pytest.raises(UsageError, match="target_next holds ids outside 0..49"):
        write(p, target_next=data["target_next"] + V)
    with pytest.raises(UsageError, match="loss_mask is 1 at a padding position"):
        write(p, loss_mask=torch.ones(B, S, dtype=torch.bool))
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------- malformed files


def _rewrite(src, dst, *, meta=None, drop=(), tensors=None):
    with open(src, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        old_meta = json.loads(f.read(n))["__metadata__"]
    ts = {k: v for k, v in load_file(src).items() if k not in drop}
    ts.update(tensors or {})
    m = dict(old_meta)
    for k, v in (meta or {}).items():
        if v is None:
            m.pop(k, None)
        else:
            m[k] = v
    save_file(ts, str(dst), metadata=m)
    return dst


MALFORMED = [
    ("format", dict(meta={"format": "something-else"}), "field 'format'"),
    ("no-meta-field", dict(meta={"hidden_size": None}), "lacks field 'hidden_size'"),
    ("version-new", dict(meta={"version": "2"}), "reads states version 1"),
    ("version-text", dict(meta={"version": "one"}), "field 'version' must be an integer"),
    ("num-layers", dict(meta={"num_layers": "-3"}), "field 'num_layers' must be a positive"),
    ("layers-json", dict(meta={"layers": "[1, 2"}), "field 'layers' is not valid JSON"),
    ("layers-type", dict(meta={"layers": '["a"]'}), "field 'layers' must be a JSON list of integers"),
    ("layers-no-embedding", dict(meta={"layers": "[1, 2, 4]"}), "must include -1"),
    ("layers-order", dict(meta={"layers": "[-1, 4, 2, 1]"}), "ascending"),
    ("layers-range", dict(meta={"layers": "[-1, 1, 2, 4, 9]"}), "outside -1..5"),
    ("capture", dict(meta={"capture": "[]"}), "field 'capture' must be a JSON object"),
    ("missing-hidden", dict(drop=["hidden.output_of.2"]), "missing tensor hidden.output_of.2"),
    ("missing-ids", dict(drop=["target_next"]), "missing tensor target_next"),
    ("extra-hidden", dict(tensors={"hidden.output_of.3": torch.zeros(B, S, T, dtype=torch.bfloat16)}),
     "unexpected tensor hidden.output_of.3"),
    ("ids-dtype", dict(tensors={"input_ids": torch.zeros(B, S, dtype=torch.int32)}), "field 'input_ids'"),
    ("ids-empty", dict(tensors={k: torch.zeros(B, 0, dtype=torch.int64) for k in ("input_ids",)}),
     "field 'input_ids' must hold at least one token"),
    ("next-shape", dict(tensors={"target_next": torch.zeros(B, S + 1, dtype=torch.int64)}),
     "field 'target_next'"),
    ("mask-dtype", dict(tensors={"attention_mask": torch.ones(B, S)}), "field 'attention_mask'"),
    ("hidden-dtype", dict(tensors={"hidden.output_of.1": torch.zeros(B, S, T, dtype=torch.int32)}),
     "field 'hidden.output_of.1' must be bf16"),
    ("hidden-shape", dict(tensors={"hidden.output_of.1": torch.zeros(B, S, T + 1, dtype=torch.bfloat16)}),
     "field 'hidden.output_of.1' must be [3, 7, 16]"),
    ("hidden-mixed", dict(tensors={"hidden.output_of.1": torch.zeros(B, S, T, dtype=torch.float32)}),
     "the other hidden states are"),
    ("mask-values", dict(tensors={"attention_mask": torch.full((B, S), 2, dtype=torch.int8)}), "only 0 and 1"),
    ("mask-empty-row", dict(tensors={"attention_mask": torch.zeros(B, S, dtype=torch.bool)}), "no real token"),
    ("mask-left-pad", dict(tensors={"attention_mask": torch.tensor([[0] + [1] * (S - 1)] * B, dtype=torch.bool)}),
     "row 0 is not right padded"),
    ("ids-vocab", dict(tensors={"input_ids": torch.full((B, S), V, dtype=torch.int64)}), "ids outside 0..49"),
    ("loss-pad", dict(tensors={"loss_mask": torch.ones(B, S, dtype=torch.bool)}), "1 at a padding position"),
    ("loss-values", dict(tensors={"loss_mask": torch.full((B, S), 3, dtype=torch.uint8)}), "field 'loss_mask'"),
]


@pytest.mark.parametrize("case,change,message", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_states_file(states_path, tmp_path, case, change, message):
    bad = _rewrite(states_path, tmp_path / f"{case}.safetensors", **change)
    with pytest.raises(CheckpointReadError) as e:
        StatesFile(bad)
    assert message in e.value.message
    assert str(bad) in e.value.message


def test_not_a_safetensors_file(tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(b"\xff" * 64)
    with pytest.raises(CheckpointReadError, match="not a readable safetensors file"):
        StatesFile(p)
    with pytest.raises(CheckpointReadError, match="no such states file"):
        StatesFile(tmp_path / "absent.safetensors")
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointReadError, match="not an eagle3conv states file"):
        StatesFile(tmp_path / "model.safetensors")


def test_truncated_file(states_path, tmp_path):
    data = states_path.read_bytes()
    p = tmp_path / "cut.safetensors"
    p.write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointReadError, match="not a readable safetensors file"):
        StatesFile(p)


# --------------------------------------------------------------------------- SGLang-style dumps


def make_dump(folder, *, manifest=True, lengths=(5, 3), ids=True, nxt=True, emb=False, extra=None):
    folder.mkdir(parents=True, exist_ok=True)
    n = sum(lengths)
    g = torch.Generator().manual_seed(1)
    aux = [torch.randn(n, T, generator=g) * (k + 1) for k in range(3)]
    for k, a in enumerate(aux):
        torch.save(a.bfloat16(), folder / f"aux_{k}.pt")
    if ids:
        torch.save(torch.arange(n), folder / "input_ids.pt")
    if nxt:
        torch.save(torch.arange(n) + 1, folder / "target_next.pt")
    if emb:
        torch.save(torch.randn(n, T, generator=g).bfloat16(), folder / "embeddings.pt")
    if manifest:
        m = {"captured_at_input_of": [3, 31, 59], "target": "kimi-k2.5", "num_layers": 61,
             "sequence_lengths": list(lengths)}
        m.update(extra or {})
        (folder / "manifest.json").write_text(json.dumps(m))
    return [a.bfloat16() for a in aux]


def test_dump_reader(tmp_path):
    aux = make_dump(tmp_path / "d", emb=True)
    st = open_states(tmp_path / "d")
    assert isinstance(st, DumpStates) and st.source == "aux-dump"
    assert st.layers == (*outputs(2, 30, 58), EMBEDDING)
    assert st.num_layers == 61 and st.hidden_size == T and st.target == "kimi-k2.5"
    assert st.shape == (2, 5) and st.lengths == [5, 3]
    assert st.input_ids.tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 0, 0]]
    assert st.target_next.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 0, 0]]
    got = st.aux(outputs(58, 2))
    assert got.shape == (2, 5, 2 * T)
    assert torch.equal(got[1, :3, :T], aux[2][5:])
    assert torch.equal(got[0, :, T:], aux[0][:5])
    assert torch.equal(got[1, 3:], torch.zeros(2, 2 * T, dtype=torch.bfloat16))
    assert torch.equal(st.aux(None)[0, :, T:2 * T], aux[1][:5])
    assert st.embeddings().shape == (2, 5, T)
    with pytest.raises(WiringError, match="output of layer 29 was not captured"):
        st.aux(outputs(29))
    b = list(st.batches(outputs(2, 30, 58), batch_size=1))
    assert [x.aux.shape for x in b] == [(1, 5, 3 * T)] * 2


def test_dump_without_manifest(tmp_path):
    aux = make_dump(tmp_path / "d", manifest=False, nxt=False)
    st = open_states(tmp_path / "d")
    assert st.layers is None and st.shape == (1, 8) and st.target_next is None
    assert torch.equal(st.aux(None)[0], torch.cat(aux, -1))
    with pytest.raises(WiringError, match="does not record which target layers") as e:
        st.aux(outputs(2))
    assert "manifest.json" in e.value.hint
    assert any("target_next" in n for n in st.notes)
    with pytest.raises(WiringError, match="holds no embedding output"):
        st.embeddings()
    named = open_states(tmp_path / "d", layers=[2, 30, 58])
    assert torch.equal(named.aux([30])[0], aux[1])
    with pytest.raises(WiringError, match="2 layers given for 3 aux slots"):
        open_states(tmp_path / "d", layers=[2, 30])


def test_dump_errors(tmp_path):
    make_dump(tmp_path / "a", extra={"sequence_lengths": [4, 3]})
    with pytest.raises(CheckpointReadError, match="sums to 7 but the dumps hold 8"):
        DumpStates(tmp_path / "a")
    make_dump(tmp_path / "b")
    torch.save(torch.zeros(5, T), tmp_path / "b" / "aux_1.pt")
    with pytest.raises(CheckpointReadError, match="every slot must hold the same tokens"):
        DumpStates(tmp_path / "b")
    make_dump(tmp_path / "c")
    torch.save(torch.arange(3), tmp_path / "c" / "input_ids.pt")
    with pytest.raises(CheckpointReadError, match=r"input_ids.pt: shape \[3\], expected \[8\]"):
        DumpStates(tmp_path / "c")
    make_dump(tmp_path / "d")
    torch.save(torch.zeros(8), tmp_path / "d" / "target_next.pt")
    with pytest.raises(CheckpointReadError, match="token ids must be integers"):
        DumpStates(tmp_path / "d")
    make_dump(tmp_path / "e")
    torch.save({"not": "a tensor"}, tmp_path / "e" / "aux_0.pt")
    with pytest.raises(CheckpointReadError, match="expected one tensor"):
        DumpStates(tmp_path / "e")
    make_dump(tmp_path / "f")
    (tmp_path / "f" / "aux_2.pt").unlink()
    with pytest.raises(WiringError, match="names 3 layers but the folder holds 2"):
        DumpStates(tmp_path / "f")
    make_dump(tmp_path / "g", extra={"sequence_lengths": "8"})
    with pytest.raises(CheckpointReadError, match="sequence_lengths"):
        DumpStates(tmp_path / "g")


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_dump_pickles_are_weights_only(tmp_path):
    make_dump(tmp_path / "d")
    torch.save({"x": Evil()}, tmp_path / "d" / "aux_0.pt")
    with pytest.raises(UnsafePickleError):
        DumpStates(tmp_path / "d")


# --------------------------------------------------------------------------- SpecForge


def make_record(path, seq, seed, *, k=3, batched=True, compress=False, drop=None, **over):
    g = torch.Generator().manual_seed(seed)
    lead = (1,) if batched else ()
    rec = {
        "input_ids": torch.randint(0, V, (seq,), generator=g),
        "loss_mask": (torch.arange(seq) >= 2).long(),
        "hidden_state": torch.randn(*lead, seq, T, generator=g).bfloat16(),
        "aux_hidden_state": torch.randn(*lead, seq, k * T, generator=g).bfloat16(),
        "rid": f"req-{seed}",
    }
    rec.update(over)
    if drop:
        del rec[drop]
    path.parent.mkdir(parents=True, exist_ok=True)
    if compress:
        with gzip.open(path, "wb") as f:
            torch.save(rec, f)
    else:
        torch.save(rec, path)
    return rec


def test_specforge_folder_ckpt_and_gz(tmp_path):
    root = tmp_path / "cache" / "hidden_states"
    r0 = make_record(root / "rows_0-2" / "data_0.ckpt", 6, 0)
    r1 = make_record(root / "rows_0-2" / "data_1.ckpt.gz", 4, 1, compress=True, batched=False)
    r10 = make_record(root / "rows_0-2" / "data_10.ckpt", 5, 2)
    assert detect_states(tmp_path / "cache") == "specforge"
    st = open_states(tmp_path / "cache")
    assert isinstance(st, SpecForgeStates) and st.layers is None and st.num_aux == 3
    assert st.shape == (3, 6) and st.lengths == [6, 4, 5]  # data_10 after data_1 (natural order)
    assert st.target_next is None and st.hidden_size == T
    assert torch.equal(st.input_ids[1, :4], r1["input_ids"])
    assert st.loss_mask.tolist()[2] == [False, False, True, True, True, False]
    assert torch.equal(st.aux(None)[0], r0["aux_hidden_state"][0])
    assert torch.equal(st.final_hidden(slice(2, 3))[0, :5], r10["hidden_state"][0])
    with pytest.raises(WiringError, match="does not record which target layers"):
        st.aux(outputs(1))
    named = open_states(tmp_path / "cache", layers=[1, 2, 3])
    got = named.aux(outputs(3, 1), rows=slice(1, 2))
    assert torch.equal(got[0, :4, :T], r1["aux_hidden_state"][:, 2 * T:])
    assert torch.equal(got[0, :4, T:], r1["aux_hidden_state"][:, :T])
    with pytest.raises(WiringError, match=r"hold 3 aux slots \(48 = 3 x 16\)"):
        open_states(tmp_path / "cache", layers=[1, 2])
    single = open_states(root / "rows_0-2" / "data_1.ckpt.gz")
    assert single.shape == (1, 4)
    assert any("data tokens" in n for n in st.notes)


def test_specforge_errors(tmp_path):
    make_record(tmp_path / "a" / "x.ckpt", 4, 0, drop="aux_hidden_state")
    with pytest.raises(CheckpointReadError, match="missing tensor aux_hidden_state"):
        open_states(tmp_path / "a")
    make_record(tmp_path / "b" / "x.ckpt", 4, 0, k=3)
    make_record(tmp_path / "b" / "y.ckpt", 4, 1, k=2)
    with pytest.raises(CheckpointReadError, match="widths hidden_state 16, aux_hidden_state 32 differ"):
        open_states(tmp_path / "b")
    make_record(tmp_path / "c" / "x.ckpt", 4, 0, loss_mask=torch.ones(3))
    with pytest.raises(CheckpointReadError, match="field 'loss_mask' has 3 positions"):
        open_states(tmp_path / "c")
    make_record(tmp_path / "d" / "x.ckpt", 4, 0, aux_hidden_state=torch.zeros(1, 4, 20))
    with pytest.raises(CheckpointReadError, match="not a multiple"):
        open_states(tmp_path / "d")
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "x.ckpt.gz").write_bytes(b"not gzip at all")
    with pytest.raises(CheckpointReadError, match="not a readable gzip file"):
        open_states(tmp_path / "e")
    with gzip.open(tmp_path / "f.ckpt.gz", "wb") as f:
        torch.save({"x": Evil()}, f)
    with pytest.raises(UnsafePickleError):
        open_states(tmp_path / "f.ckpt.gz")
    torch.save([1, 2], tmp_path / "g.ckpt")
    with pytest.raises(CheckpointReadError, match="a SpecForge record is a dict"):
        open_states(tmp_path / "g.ckpt")


# --------------------------------------------------------------------------- detection


def test_detection(tmp_path, states_path):
    assert detect_states(states_path) == "eagle3conv"
    assert detect_states(tmp_path) == "eagle3conv"  # folder holding states.safetensors
    assert isinstance(open_states(tmp_path), StatesFile)
    with pytest.raises(UsageError, match="records its own layers"):
        open_states(states_path, layers=[1])
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointReadError, match="a folder with none of") as e:
        open_states(tmp_path / "empty")
    assert "eagle3conv capture" in e.value.hint
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(CheckpointReadError, match="not captured states"):
        open_states(tmp_path / "notes.txt")
    with pytest.raises(CheckpointReadError, match="no such file or folder"):
        open_states(tmp_path / "nothing")


def test_hidden_key():
    assert hidden_key(EMBEDDING) == "hidden.embedding"
    assert hidden_key(LayerRef(29)) == hidden_key(29) == "hidden.output_of.29"


def test_a_killed_writers_temp_is_removed_but_a_live_ones_is_not(tmp_path):
    import fcntl
    import os

    from eagle3conv.io.files import remove_stale_temps

    out = tmp_path / "s.safetensors"
    stale = tmp_path / ".s.safetensors.abc123_x.tmp"  # named as mkstemp names them
    stale.write_bytes(b"x" * 1000)  # left by a SIGKILLed capture: nobody holds its lock
    live = tmp_path / ".s.safetensors.live9999.tmp"
    live.write_bytes(b"y")
    fd = os.open(live, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another writer, still running
    try:
        assert remove_stale_temps(out) == [stale]
        assert not stale.exists() and live.exists()
    finally:
        os.close(fd)
