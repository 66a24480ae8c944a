"""The acceptance profile (speculation_profile.json, Model Optimizer's schema 1.0) and prompt categories.

Unit parts here run on small real files and arrays; the end to end on a real target
(SmolLM2-135M captured on CPU, prompts with categories, verify, push to the local Hub
server) is in tests/test_e2e_categories.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from eagle3conv.errors import CheckpointReadError, UsageError
from eagle3conv.states.capture import Prompt, read_prompts
from eagle3conv.states.format import StatesFile, write_states
from eagle3conv.verify.evaluate import Candidate, Score
from eagle3conv.verify.profile import (
    NO_CATEGORY,
    category_figures,
    chain_rates,
    read_profile,
    validation,
)
from eagle3conv.verify.stats import replay, replay_histogram
from eagle3conv.spec.layers import outputs


def _replay_by_hand(leading, full):
    """The greedy replay written out independently: from the first full chain, a round accepts
    leading[t] drafts and the next starts leading[t] + 1 later; each round's length is 1 + accepted."""
    out = []
    for a, f in zip(leading, full):
        lengths = []
        starts = [t for t in range(len(f)) if f[t]]
        t = starts[0] if starts else len(f)
        while t < len(f) and f[t]:
            lengths.append(1 + int(a[t]))
            t += int(a[t]) + 1
        out.append(lengths)
    return out


def test_replay_histogram_counts_the_rounds_replay_makes():
    rng = np.random.default_rng(3)
    steps = 4
    leading = rng.integers(0, steps + 1, size=(12, 80))
    full = rng.random((12, 80)) > 0.03
    full[:, -steps:] = False
    full[5] = False  # a sequence without a full chain: no rounds
    hist = replay_histogram(leading, full, steps)
    by_hand = _replay_by_hand(leading, full)
    for h, lengths in zip(hist, by_hand):
        assert h == [lengths.count(L) for L in range(1, steps + 2)]
    acc, rounds = replay(leading, full)
    assert acc == [sum(x) for x in by_hand] and rounds == [len(x) for x in by_hand]
    assert hist[5] == [0] * (steps + 1)


def _score(hists, steps=3, acc=None):
    """A Score whose greedy replay made the rounds of ``hists`` (per sequence, counts of length 1..K+1)."""
    n = len(hists)
    accepted = [sum((i + 1) * c for i, c in enumerate(h)) for h in hists]
    rounds = [sum(h) for h in hists]
    matched = acc or [[r for r in rounds] for _ in range(steps)]
    counted = [[2 * r + 1 for r in rounds] for _ in range(steps)]
    s = Score(Candidate("config", outputs(1, 2, 3), "t"), steps, matched, counted, accepted, rounds,
              [0] * steps, [0] * steps, [], accepted, rounds, [list(h) for h in hists])
    assert len(s.chains) == n
    return s.finish()


def test_chain_rates_from_the_rounds():
    # 10 rounds: 4 of length 1, 3 of 2, 2 of 3, 1 of 4  ->  P(L>=2)=.6, P(L>=3)=.3, P(L>=4)=.1
    s = _score([[3, 2, 1, 1], [1, 1, 1, 0]])
    r = chain_rates(s)
    assert r["marginal_accept_rates"] == pytest.approx([0.6, 0.3, 0.1])
    assert r["conditional_accept_rates"] == pytest.approx([0.6, 0.5, 1 / 3], abs=1e-6)
    mean = (4 * 1 + 3 * 2 + 2 * 3 + 1 * 4) / 10
    assert r["mean_accept_length"] == pytest.approx(mean) == pytest.approx(s.accept_length)
    assert r["mean_accept_length"] == pytest.approx(1 + sum(r["marginal_accept_rates"]))
    per_req = ((3 + 4 + 3 + 4) / 7 + (1 + 2 + 3) / 3) / 2
    assert r["mean_accept_length_per_request"] == pytest.approx(per_req, abs=1e-6)
    assert r["acceptance_length_histogram"] == {"1": 4, "2": 3, "3": 2, "4": 1}


def test_validation_checks_rather_than_assumes():
    ok = validation(1.9, [0.6, 0.3])
    assert ok["mean_consistency"]["passed"] and ok["marginal_monotonicity"]["passed"]
    bad = validation(2.5, [0.3, 0.6])  # a cut-short vector and an increasing one both fail
    assert not bad["mean_consistency"]["passed"] and not bad["marginal_monotonicity"]["passed"]
    assert bad["marginal_monotonicity"]["violations"][0]["position"] == 1


def test_category_figures_are_the_category_sequences_alone():
    hists = [[3, 2, 1, 1], [1, 1, 1, 0], [0, 0, 0, 5], [2, 0, 0, 0]]
    s = _score(hists)
    per = category_figures(s, ["code", "chat", "code", None])
    assert list(per) == [NO_CATEGORY, "chat", "code"]
    alone = _score([hists[0], hists[2]])
    assert per["code"]["accept_length"] == round(alone.accept_length, 4)
    assert per["code"]["accept_length_ci95"] == [round(x, 4) for x in alone.accept_length_ci]
    assert per["code"]["sequences"] == 2 and per[NO_CATEGORY]["sequences"] == 1
    assert per["code"]["acceptance_length_histogram"] == {"1": 3, "2": 2, "3": 1, "4": 6}
    assert category_figures(s, None) is None


def test_prompts_carry_a_category(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "a", "category": "math"}\n{"messages": [{"role": "user", "content": "b"}], '
                 '"category": "chat"}\n{"prompt": "c"}\n')
    assert [x.category for x in read_prompts(p)] == ["math", "chat", None]
    for bad in ('{"prompt": "a", "category": 3}', '{"prompt": "a", "category": ""}'):
        p.write_text(bad + "\n")
        with pytest.raises(UsageError, match="line 1: \"category\" must be a non-empty string"):
            read_prompts(p)
    assert Prompt.of("x").category is None


def _tiny_states(path, categories):
    b, s, t = 3, 5, 4
    mask = torch.ones(b, s, dtype=torch.bool)
    ids = torch.ones(b, s, dtype=torch.long)
    hidden = {-1: torch.ones(b, s, t), 0: torch.ones(b, s, t)}
    return write_states(path, input_ids=ids, attention_mask=mask, target_next=ids, hidden=hidden, num_layers=2,
                        vocab_size=10, dtype="fp32", categories=categories)


def test_states_file_keeps_categories(tmp_path):
    path = _tiny_states(tmp_path / "s.safetensors", ["code", None, "chat"])
    with StatesFile(path) as sf:
        assert sf.categories == ("code", None, "chat")
        assert sf.summary()["categories"] == {NO_CATEGORY: 1, "chat": 1, "code": 1}
    with StatesFile(_tiny_states(tmp_path / "n.safetensors", None)) as sf:
        assert sf.categories is None and sf.summary()["categories"] is None
    with pytest.raises(UsageError, match="categories holds 2 entries for 3 sequences"):
        _tiny_states(tmp_path / "bad.safetensors", ["a", "b"])
    assert not (tmp_path / "bad.safetensors").exists()


def test_states_file_refuses_malformed_categories(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    src = _tiny_states(tmp_path / "s.safetensors", ["code", None, "chat"])
    with safe_open(str(src), framework="pt") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
    for raw, why in (('["a", 1, "b"]', "entry 1 must be a non-empty string or null"),
                     ('{"a": 1}', "must be a list"), ("[", "is not valid JSON")):
        bad = tmp_path / "bad.safetensors"
        save_file(tensors, str(bad), metadata=dict(meta, categories=raw))
        with pytest.raises(CheckpointReadError, match=f"field 'categories' {why}"):
            StatesFile(bad)


def test_read_profile_refuses_what_is_not_a_profile(tmp_path):
    p = tmp_path / "speculation_profile.json"
    for doc, field in (({"schema_version": "2.0"}, "schema_version"),
                       ({"schema_version": "1.0", "num_speculative_tokens": 0}, "num_speculative_tokens"),
                       ({"schema_version": "1.0", "num_speculative_tokens": 2, "mean_accept_length": 0.5},
                        "mean_accept_length")):
        p.write_text(json.dumps(doc))
        with pytest.raises(CheckpointReadError, match=f"'{field}' must be"):
            read_profile(tmp_path)
    p.write_text("{")
    with pytest.raises(CheckpointReadError, match="not a readable JSON file"):
        read_profile(p)
