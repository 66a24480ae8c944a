"""The screen's per-wiring kernels against the plain computations they replace:
``log_score_at`` (a log-softmax and an argmax, ``rows`` rows at a time, the argmax found
through ``amax``, ties at it through a second ``amax`` without ref's column), ``ops.argmax``
(the drafter's guesses: bf16 rows upcast in blocks) and ``slot_sum`` (a wiring's per-slot
projections summed in one pass), and the screen's hits on a vocab map that sends two draft ids
to one token (the argmax path)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from eagle3conv.example import Dims, write_example
from eagle3conv.model.ops import argmax
from eagle3conv.states.format import write_states
from eagle3conv.states.readers import open_states
from eagle3conv.verify import Candidate, build_drafter, evaluate, load_drafter_weights
from eagle3conv.verify.evaluate import NO_DROP, log_score_at, screen, slot_sum


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 37, 256, None])
def test_log_score_at_is_log_softmax_and_argmax_ties_included(dtype, rows):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(3, 400, 64, generator=g) * 2).round().to(dtype)  # integer logits: many ties at the top
    ref = torch.randint(0, 64, (3, 400), generator=g)
    ref[0] = x[0].float().argmax(-1)  # the first largest: hits
    top = x[1].float().amax(-1, keepdim=True)
    last = 63 - (x[1].float() == top).flip(-1).int().argmax(-1)  # the last largest: a hit only when it is alone
    ref[1] = last
    lp, first = log_score_at(x, ref, rows=rows)
    want_lp = F.log_softmax(x.float(), -1).gather(-1, ref[..., None]).squeeze(-1)
    want = x.argmax(-1) == ref
    assert lp.dtype == torch.float32 and lp.shape == ref.shape
    assert torch.equal(lp, want_lp)
    assert torch.equal(first, want)
    tied_last = (x[1].float() == top).sum(-1) > 1
    assert bool(tied_last.any()) and not bool(first[1][tied_last].any())  # ties go to the first, as argmax
    assert bool(first[0].all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows", [1, 5, 256])
def test_argmax_is_torchs_ties_and_nan_included(dtype, rows):
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(2, 300, 96, generator=g) * 2).round().to(dtype)  # integer logits: many ties at the top
    x[0, 7, 40] = float("nan")  # NaN counts as the largest, as torch.argmax takes it
    x[0, 8, [3, 50]] = float("nan")  # the first NaN
    x[1, 9] = float("-inf")  # every value equal
    got = argmax(x, rows=rows)
    assert got.dtype == torch.long and got.shape == (2, 300)
    assert torch.equal(got, x.argmax(-1))
    assert int(got[0, 7]) == 40 and int(got[0, 8]) == 3 and int(got[1, 9]) == 0
    assert bool(((x == x.amax(-1, keepdim=True)).sum(-1) > 1).any())  # ties were there to break


def test_slot_sum_is_the_sum_of_each_slots_row():
    g = torch.Generator().manual_seed(4)
    for dtype in (torch.float32, torch.bfloat16):
        table = torch.randn(3, 7, 2, 5, 6, generator=g).to(dtype)
        part = torch.randint(0, 7, (11, 3), generator=g)
        want = sum(table[s, part[:, s]].double() for s in range(3))
        got = slot_sum(table, part)
        assert got.shape == (11, 2, 5, 6) and got.dtype == dtype
        # fp32 accumulation, one rounding: within one rounding of the exact sum
        eps = torch.finfo(dtype).eps
        assert torch.allclose(got.double(), want, rtol=eps, atol=eps * float(want.abs().max()))
    one = torch.randn(1, 4, 3, generator=g)
    assert torch.equal(slot_sum(one, torch.tensor([[2], [0]])), one[0, [2, 0]])


def test_a_vocab_map_with_two_ids_for_one_token_scores_hits_by_the_guess(tmp_path):
    """d2t sending two draft ids to one target token: a step-1 guess of either is that token, so
    the screen compares the guesses (its argmax) and its hits stay evaluate's."""
    dims = Dims(hidden=64, target_hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512,
                draft_vocab=300, aux_ids=(1, 3, 4))
    folder = write_example(tmp_path / "drafter", "sglang", dims)
    config, tensors = load_drafter_weights(folder)
    drafter, target_embeds = build_drafter(config, tensors, "cpu", torch.float32)
    d2t = drafter.d2t.clone()
    tgt = torch.arange(d2t.numel()) + d2t
    d2t[5] = int(tgt[6]) - 5  # draft ids 5 and 6 both give target token tgt[6]
    drafter.d2t = d2t
    drafter.lm_head[5:7] *= 8  # ids 5 and 6 often the argmax: a guess of 5 is the shared token too
    g = torch.Generator().manual_seed(5)
    B, S, T = 3, 40, 64
    hidden = {o: torch.randn(B, S, T, generator=g) for o in range(-1, 5)}
    drafter.embed_tokens = hidden[-1].reshape(B * S, T)
    ids = torch.arange(B * S).view(B, S)
    tokens = torch.zeros_like(ids)
    tokens[:, :S - 1] = ids[:, 1:]
    guess = drafter.forward(torch.cat([hidden[o] for o in (1, 3, 4)], -1), tokens).draft_ids
    target_next = torch.randint(0, 512, (B, S), generator=g)
    target_next[:, 1:] = tgt[6]  # every reference is the shared token ...
    target_next[:, 1::3] = (guess + drafter.d2t[guess])[:, :-1][:, ::3][:, :target_next[:, 1::3].shape[1]]
    path = tmp_path / "states.safetensors"
    write_states(path, input_ids=torch.randint(0, 512, (B, S), generator=g),
                 attention_mask=torch.ones(B, S, dtype=torch.bool), target_next=target_next, hidden=hidden,
                 num_layers=5, vocab_size=512, dtype="fp32", target="tiny")
    states = open_states(path)
    refs = sorted(states.layers, key=lambda r: r.output_of)
    sets = [tuple(c) for c in itertools.combinations(refs, 3)][:8]
    res, _ = screen(drafter, states, sets, rows=B, target_embeds=target_embeds, bound=NO_DROP)
    for i, ls in enumerate(sets):
        sc = evaluate(drafter, open_states(path), Candidate("w", ls, "test"), steps=1, batch_size=4,
                      target_embeds=target_embeds)
        assert res.hits[i] == sc.matched[0], ls
    five = (guess == 5)[:, :-1] & (target_next[:, 1:] == tgt[6])
    assert int(five.sum()) > 3  # hits that a draft-id comparison (t2d of the token is 6, not 5) would miss


def test_masked_attention_with_grouped_heads_is_sdpas_gqa(tmp_path):
    """``attention`` under a mask on a CPU runs the query heads that share a key head as one block;
    the same numbers as SDPA's own grouped-query attention, on a mask that is not causal."""
    dims = Dims(hidden=64, target_hidden=64, heads=6, kv_heads=2, head_dim=16, intermediate=128, vocab=512,
                draft_vocab=300, aux_ids=(1, 3, 4))
    config, tensors = load_drafter_weights(write_example(tmp_path / "drafter", "sglang", dims))
    drafter, _ = build_drafter(config, tensors, "cpu", torch.float32)
    assert drafter.gqa
    g = torch.Generator().manual_seed(6)
    q = torch.randn(3, 6, 9, 16, generator=g)
    k, v = torch.randn(3, 2, 20, 16, generator=g), torch.randn(3, 2, 20, 16, generator=g)
    cols = torch.tensor([2, 3, 5, 8, 9, 12, 15, 18, 19])
    mask = torch.arange(20)[None, :] <= cols[:, None]
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert torch.allclose(drafter.attention(q, k, v, mask), want, atol=1e-6, rtol=1e-5)
    # the other head order (key head h % 2, not h // 3): differs
    wrong = F.scaled_dot_product_attention(q, k.repeat(1, 3, 1, 1), v.repeat(1, 3, 1, 1), attn_mask=mask)
    assert not torch.allclose(drafter.attention(q, k, v, mask), wrong, atol=1e-3)
