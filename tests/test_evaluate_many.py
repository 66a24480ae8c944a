"""``evaluate_many`` (several wirings in one pass over the states: what no wiring changes done once
per batch) against ``evaluate`` of each wiring in turn.

The drafters are built in float64, where the two paths' only difference (sums reassociated: fc as
per-slot projections, the attention input as its embedding and hidden halves) cannot flip a guess,
so every figure of every score must be equal. The reference tokens are planted from the drafter's
own 3-step chain on one wiring (each position from one of the three steps), so every step has hits
to lose: a RoPE position, a token or a key off by one shows at once. A real trained drafter on real
captured states (fp32) is in tests/test_e2e_smollm2.py.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from eagle3conv.spec.layers import LayerRef
from eagle3conv.states.format import write_states
from eagle3conv.states.readers import open_states
from eagle3conv.verify import Candidate, evaluate
from eagle3conv.verify.evaluate import evaluate_many

from test_screen import VARIANTS, variant_drafter

STEPS = 3
PLANTED = (1, 3, 4)


def _states(path, drafter, T: int, target_embeds: bool, *, prompt: bool):
    """Drifting layer outputs; the reference at each position planted from step 1, 2 or 3 of the
    drafter's chain on outputs 1, 3, 4 (by position mod 3); with ``prompt`` a loss mask scores only
    the positions after prompts of 7 to 15 tokens (the chains are drafted at those starts only)."""
    g = torch.Generator().manual_seed(7)
    B, S = 5, 36
    base = torch.randn(B, S, T, generator=g, dtype=torch.float64)
    hidden = {-1: torch.randn(B, S, T, generator=g, dtype=torch.float64)}
    walk = torch.zeros(B, S, T, dtype=torch.float64)
    for o in range(6):
        walk += torch.randn(B, S, T, generator=g, dtype=torch.float64) * (0.3 + 0.2 * o)
        hidden[o] = base + walk
    input_ids = torch.randint(0, min(512, drafter.embed_tokens.shape[0]), (B, S), generator=g)  # in its table
    ids = input_ids
    if target_embeds:
        drafter.embed_tokens = hidden[-1].reshape(B * S, T).to(drafter.dtype)
        ids = torch.arange(B * S).view(B, S)
    with torch.inference_mode():
        chain = drafter.draft_chain(torch.cat([hidden[o] for o in PLANTED], -1).to(drafter.dtype), ids,
                                    STEPS).target_ids
    target_next = torch.randint(0, 512, (B, S), generator=g)
    for t in range(1, S):  # draft k at start t guesses target_next[t + k]
        k = (t - 1) % STEPS + 1
        if t - k >= 0:
            target_next[:, t] = chain[k - 1, :, t - k]
    loss_mask = None
    if prompt:
        loss_mask = torch.ones(B, S, dtype=torch.bool)
        for b, n in enumerate((7, 15, 9, 12, 10)):
            loss_mask[b, :n] = False
    write_states(path, input_ids=input_ids, attention_mask=torch.ones(B, S, dtype=torch.bool),
                 target_next=target_next, hidden={o: h.float() for o, h in hidden.items()}, num_layers=6,
                 vocab_size=512, dtype="fp32", target="tiny", loss_mask=loss_mask)
    return path


def _same(one, many) -> None:
    for a, b in zip(one, many, strict=True):
        da, db = a.to_dict(), b.to_dict()
        da.pop("seconds"), db.pop("seconds")
        assert da == db, a.candidate.layers
        assert (a.matched, a.counted, a.replay_hist) == (b.matched, b.counted, b.replay_hist)


@pytest.mark.parametrize("prompt", [False, True], ids=["every position", "after a prompt"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_many_wirings_score_what_each_scores_alone(tmp_path, variant, prompt):
    """Every step-1 variant the screen splits, with and without a prompt (chains at some starts only),
    the captured embeddings or the drafter's own table: 20 wirings (more than their slot-layer pairs:
    each pair's share of the hidden half precomputed) and 3 (fewer: one matmul per wiring)."""
    drafter, target_embeds, T = variant_drafter(tmp_path, variant, torch.float64)
    states = open_states(_states(tmp_path / "states.safetensors", drafter, T, target_embeds, prompt=prompt))
    refs = sorted(states.layers, key=lambda r: r.output_of)
    sets = [tuple(c) for c in itertools.combinations(refs, 3)]
    cands = [Candidate(f"w{i}", ls, "test") for i, ls in enumerate(sets)]
    one = [evaluate(drafter, states, c, steps=STEPS, batch_size=2, target_embeds=target_embeds) for c in cands]
    planted = next(s for s in one if s.candidate.layers == tuple(LayerRef(o) for o in PLANTED))
    # each step is planted at a third of the positions: every step hits there
    assert all(sum(m) > 0.3 * sum(n) for m, n in zip(planted.matched, planted.counted, strict=True)), planted.matched
    _same(one, evaluate_many(drafter, states, cands, steps=STEPS, batch_size=2, target_embeds=target_embeds))
    few = [0, 7, 19]
    _same([one[i] for i in few], evaluate_many(drafter, states, [cands[i] for i in few], steps=STEPS, batch_size=2,
                                               target_embeds=target_embeds))


def test_passes_bounded_by_memory_score_the_same(tmp_path):
    """A memory bound that holds the projections of 4 layers in each of 3 slots: the wirings go in several
    passes (a wiring left alone is :func:`evaluate`'d), the same scores in the order given; with
    labels (some positions without a reference) and max_sequences too."""
    drafter, target_embeds, T = variant_drafter(tmp_path, VARIANTS[0], torch.float64)
    states = open_states(_states(tmp_path / "states.safetensors", drafter, T, target_embeds, prompt=True))
    refs = sorted(states.layers, key=lambda r: r.output_of)
    cands = [Candidate(f"w{i}", ls, "test") for i, ls in enumerate(itertools.combinations(refs, 3)) if i % 4 == 0]
    labels = states.target_next.clone()
    labels[:, ::5] = -1
    kw = dict(steps=STEPS, batch_size=2, target_embeds=target_embeds, labels=labels, max_sequences=4)
    one = [evaluate(drafter, states, c, **kw) for c in cands]
    S = states.input_ids.shape[1]
    c = drafter.config
    per_pair = 2 * S * (c.hidden_size + (c.num_heads + 2 * c.num_kv_heads) * c.head_dim) * 8  # fp64, batch 2
    seen: list = []
    many = evaluate_many(drafter, states, cands, memory_bytes=12 * per_pair, progress=lambda *a: seen.append(a), **kw)
    _same(one, many)
    labels_seen = {a[0] for a in seen}
    assert len(labels_seen) > 1 and any(x.endswith(" wirings") for x in labels_seen)  # several passes, some together
    assert all(a[1] <= a[2] == 4 for a in seen)


def test_a_drafter_the_split_does_not_cover_is_scored_wiring_by_wiring(tmp_path):
    """A two-layer drafter (its later layer attends over every index's layer-0 output: no split):
    each wiring :func:`evaluate`'d, the same scores."""
    from eagle3conv.model import build_drafter

    from test_forward_2026 import make_config, make_state_dict

    config = make_config(2)
    drafter = build_drafter(config, make_state_dict(config), dtype=torch.float64)
    assert drafter.later and not drafter.drafts_columns
    T = drafter.config.target_hidden_size
    states = open_states(_states(tmp_path / "states.safetensors", drafter, T, False, prompt=False))
    refs = sorted(states.layers, key=lambda r: r.output_of)
    cands = [Candidate(f"w{i}", ls, "test") for i, ls in enumerate(itertools.combinations(refs, 3)) if i % 5 == 0]
    kw = dict(steps=STEPS, batch_size=2, target_embeds=False)
    _same([evaluate(drafter, states, c, **kw) for c in cands], evaluate_many(drafter, states, cands, **kw))
