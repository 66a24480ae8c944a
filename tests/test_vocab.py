"""d2t / t2d: the engine contract target_id = draft_id + d2t[draft_id], checked and repaired."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import PICO, assert_sglang_checkpoint, load_sglang_tensors, load_st, save_st
from eagle3conv.api import fix_keys
from eagle3conv.checkpoint.index import open_checkpoint
from eagle3conv.checkpoint.plan import build_plan
from eagle3conv.checkpoint.vocab import check_vocab
from eagle3conv.errors import InvalidCheckpointError
from eagle3conv.example import canonical_tensors


V = 1024


def _tids(vd=PICO.draft_vocab) -> np.ndarray:
    """Sorted target ids of a draft vocab that reaches near the end of the target vocab."""
    rng = np.random.default_rng(0)
    rest = np.sort(rng.choice(np.arange(256, V), vd - 256, replace=False))
    return np.concatenate([np.arange(256), rest]).astype(np.int64)


def _t2d(tids) -> np.ndarray:
    t = np.zeros(V, dtype=bool)
    t[tids] = True
    return t


def _offsets(tids) -> np.ndarray:
    return tids - np.arange(len(tids), dtype=np.int64)


# --- check_vocab directly ----------------------------------------------------------------------


def test_valid_offsets():
    tids = _tids()
    res = check_vocab(_offsets(tids), _t2d(tids), V, len(tids))
    assert res.errors == [] and res.notices == []
    assert res.reading == "offsets"
    assert not res.d2t_changed and not res.t2d_changed
    assert np.array_equal(res.d2t, _offsets(tids))
    assert np.array_equal(res.target_ids, tids)
    assert np.array_equal(res.t2d, _t2d(tids))


def test_identity_offsets():
    d2t = np.zeros(300, dtype=np.int64)
    res = check_vocab(d2t, None, V, 300)
    assert res.errors == [] and res.reading == "identity"
    assert np.array_equal(res.t2d, _t2d(np.arange(300)))  # rebuilt
    assert res.t2d_changed


def test_absolute_d2t_detected_and_converted():
    tids = _tids()
    res = check_vocab(tids.copy(), _t2d(tids), V, len(tids))
    assert res.errors == []
    assert res.reading == "absolute"
    assert res.d2t_changed and not res.t2d_changed
    assert np.array_equal(res.d2t, _offsets(tids))
    assert any(n.startswith("d2t held absolute target ids, not offsets: converted to offsets") for n in res.notices)
    # without t2d it is still unambiguous: read as offsets, these ids run past the vocab
    res2 = check_vocab(tids.copy(), None, V, len(tids))
    assert res2.errors == [] and res2.reading == "absolute"
    assert np.array_equal(res2.d2t, _offsets(tids))
    assert np.array_equal(res2.t2d, _t2d(tids))


def _ambiguous():
    # [1, 2, 3, 4] as absolute ids, or as offsets -> ids [1, 3, 5, 7]: both valid in a 1024 vocab
    return np.array([1, 2, 3, 4], dtype=np.int64)


def test_ambiguous_decided_by_t2d_absolute():
    d = _ambiguous()
    res = check_vocab(d, _t2d([1, 2, 3, 4]), V, 4)
    assert res.errors == [] and res.reading == "absolute"
    assert res.d2t.tolist() == [1, 1, 1, 1]


def test_ambiguous_decided_by_t2d_offsets():
    d = _ambiguous()
    res = check_vocab(d, _t2d([1, 3, 5, 7]), V, 4)
    assert res.errors == [] and res.reading == "offsets"
    assert res.d2t.tolist() == [1, 2, 3, 4] and not res.d2t_changed


def test_ambiguous_without_t2d_is_an_error():
    res = check_vocab(_ambiguous(), None, V, 4)
    assert res.errors == ["d2t reads as valid offsets and as valid absolute target ids, and no t2d decides between them"]
    assert res.d2t is None


def test_ambiguous_with_a_t2d_that_fits_neither():
    res = check_vocab(_ambiguous(), _t2d([10, 11, 12, 13]), V, 4)
    assert len(res.errors) == 1 and "no t2d decides" in res.errors[0]


def test_out_of_range():
    d = np.array([0, 0, 2000], dtype=np.int64)
    res = check_vocab(d, None, V, 3)
    assert res.errors == ["d2t maps draft id 2 to target id 2002, outside the vocab [0, 1024) (1 such ids)"]
    neg = check_vocab(np.array([-5, 0, 0], dtype=np.int64), None, V, 3)
    assert neg.errors == ["d2t maps draft id 0 to target id -5, outside the vocab [0, 1024) (1 such ids)"]


def test_non_increasing():
    d = np.array([0, 0, -1, 5], dtype=np.int64)
    res = check_vocab(d, None, V, 4)
    assert res.errors == [
        "d2t target ids are not strictly increasing (draft ids 1 and 2 map to 1 and 1): "
        "two draft ids share a token or the map is scrambled"
    ]


def test_t2d_missing_rebuilt():
    tids = _tids()
    res = check_vocab(_offsets(tids), None, V, len(tids))
    assert res.errors == []
    assert res.t2d_changed and np.array_equal(res.t2d, _t2d(tids))
    assert any(n.startswith("t2d was missing: rebuilt from d2t") for n in res.notices)


def test_t2d_inconsistent_is_an_error():
    tids = _tids()
    t2d = _t2d(tids)
    t2d[tids[5]] = False
    t2d[1000 if not t2d[1000] else 1001] = True
    res = check_vocab(_offsets(tids), t2d, V, len(tids))
    assert res.errors == [f"t2d disagrees with d2t at 2 target ids (t2d marks {len(tids)} ids, d2t maps to {len(tids)})"]
    assert res.t2d is None


def test_t2d_wrong_shape():
    tids = _tids()
    res = check_vocab(_offsets(tids), np.ones(V - 1, dtype=bool), V, len(tids))
    assert "t2d has shape [1023], expected [1024] (vocab_size)" in res.errors
    res = check_vocab(None, np.ones(V - 1, dtype=bool), V, V)
    assert res.errors == ["t2d has shape [1023], expected [1024] (vocab_size)"]


def test_t2d_as_integers_is_converted():
    tids = _tids()
    res = check_vocab(_offsets(tids), _t2d(tids).astype(np.uint8), V, len(tids))
    assert res.errors == [] and res.t2d_changed and res.t2d.dtype == np.bool_


def test_full_vocab_without_d2t_is_fine():
    res = check_vocab(None, None, V, V)
    assert res.errors == [] and res.d2t is None and res.t2d is None
    kept = check_vocab(None, np.ones(V, dtype=bool), V, V)
    assert kept.errors == [] and kept.t2d.all()


def test_full_vocab_with_identity_d2t():
    res = check_vocab(np.zeros(V, dtype=np.int64), None, V, V)
    assert res.errors == [] and res.reading == "identity" and res.t2d is None


def test_pruned_head_without_d2t_is_an_error():
    res = check_vocab(None, None, V, 320)
    assert res.errors == [
        "lm_head has 320 rows but vocab_size is 1024 and there is no d2t: engines cannot map draft ids to target ids"
    ]


def test_int32_d2t_converted():
    tids = _tids()
    res = check_vocab(_offsets(tids).astype(np.int32), _t2d(tids), V, len(tids))
    assert res.errors == [] and res.d2t_changed
    assert res.d2t.dtype == np.int64 and np.array_equal(res.d2t, _offsets(tids))
    assert res.notices == ["d2t converted from int32 to int64 (what SGLang and vLLM index with)"]


def test_d2t_shape_and_dtype_errors():
    assert check_vocab(np.zeros(10, dtype=np.int64), None, V, 11).errors == ["d2t has shape [10], expected [11] (lm_head rows)"]
    assert check_vocab(np.zeros((2, 5), dtype=np.int64), None, V, 10).errors == ["d2t has shape [2, 5], expected [10] (lm_head rows)"]
    assert check_vocab(np.zeros(10, dtype=np.float32), None, V, 10).errors == ["d2t has dtype float32; it must hold integer offsets"]
    assert check_vocab(np.zeros(10, dtype=np.int64), None, None, 10).errors == [
        "config.json has no vocab_size: cannot check d2t against the target vocab"
    ]


# --- through the plan and the writer ------------------------------------------------------------


def _edit(ckpt, fn):
    t = load_st(ckpt / "model.safetensors")
    fn(t)
    save_st(t, ckpt / "model.safetensors")


def test_absolute_d2t_written_as_offsets(make_ckpt, tmp_path):
    ck = make_ckpt("sglang")
    ref = canonical_tensors(PICO)
    tids = ref["d2t"] + torch.arange(PICO.draft_vocab)
    _edit(ck, lambda t: t.__setitem__("d2t", tids.clone()))
    plan = build_plan(open_checkpoint(ck))
    assert plan.ok, plan.errors
    d2t_out = next(o for o in plan.outputs if o.name == "d2t")
    assert d2t_out.data is not None and d2t_out.to_dict()["rewritten"]
    assert any("absolute target ids" in n for n in plan.notices)
    assert not plan.is_identity()
    out = tmp_path / "out"
    fix_keys(ck, out=out)
    assert_sglang_checkpoint(out)  # d2t equals the canonical offsets
    got, _ = load_sglang_tensors(out)
    assert torch.equal(got["d2t"], ref["d2t"])


def test_int32_d2t_and_uint8_t2d_written_canonical(make_ckpt, tmp_path):
    ck = make_ckpt("sglang")

    def narrow(t):
        t["d2t"] = t["d2t"].to(torch.int32)
        t["t2d"] = t["t2d"].to(torch.uint8)

    _edit(ck, narrow)
    out = tmp_path / "out"
    res = fix_keys(ck, out=out)
    assert {o.name: o.dtype for o in res.plan.outputs if o.name in ("d2t", "t2d")} == {"d2t": "I64", "t2d": "BOOL"}
    assert_sglang_checkpoint(out)


def test_missing_t2d_rebuilt_on_write(make_ckpt, tmp_path):
    ck = make_ckpt("modelopt-export")  # Model Optimizer exports ship no t2d
    plan = build_plan(open_checkpoint(ck))
    t2d = next(o for o in plan.outputs if o.name == "t2d")
    assert t2d.source is None and t2d.data is not None
    out = tmp_path / "out"
    fix_keys(ck, out=out)
    assert_sglang_checkpoint(out)


def test_inconsistent_t2d_stops_the_write(make_ckpt, tmp_path):
    ck = make_ckpt("sglang")

    def flip(t):
        t["t2d"][1000] = ~t["t2d"][1000]

    _edit(ck, flip)
    with pytest.raises(InvalidCheckpointError) as e:
        fix_keys(ck, out=tmp_path / "out")
    assert any(d.startswith("t2d disagrees with d2t at 1 target ids") for d in e.value.details)
    assert not (tmp_path / "out").exists()


def test_pruned_head_without_d2t_stops_the_write(make_ckpt, tmp_path):
    ck = make_ckpt("sglang")
    _edit(ck, lambda t: (t.pop("d2t"), t.pop("t2d")))
    with pytest.raises(InvalidCheckpointError) as e:
        fix_keys(ck, out=tmp_path / "out")
    assert any("there is no d2t" in d for d in e.value.details)


def test_vocab_maps_from_a_pickle(make_ckpt, tmp_path):
    ck = make_ckpt("draft-model-prefixed")  # model.pt: d2t read through torch, not the file offsets
    obj = torch.load(ck / "model.pt")
    obj["state_dict"]["draft_model.d2t"] = obj["state_dict"]["draft_model.d2t"].to(torch.int32)
    torch.save(obj, ck / "model.pt")
    out = tmp_path / "out"
    fix_keys(ck, out=out)
    assert_sglang_checkpoint(out)
