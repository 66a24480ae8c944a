"""``evaluate.screen`` against ``evaluate`` itself: the screen's step-1 hits of every wiring (fc
composed from per-slot projections of each layer) equal step-1 hits scored the ordinary way,
and the screen records how long each of its phases took."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from eagle3conv.example import Dims, write_example
from eagle3conv.spec.engines import Run
from eagle3conv.spec.layers import LayerRef
from eagle3conv.states.format import write_states
from eagle3conv.states.readers import open_states
from eagle3conv.verify import Candidate, build_drafter, evaluate, load_drafter_weights
from eagle3conv.verify.evaluate import NO_DROP, ScreenBound, screen

DIMS = Dims(hidden=64, target_hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512,
            draft_vocab=300, aux_ids=(1, 3, 4))


@pytest.fixture(scope="module", params=["every position", "after a prompt"])
def planted(tmp_path_factory, request):
    """Layer outputs that drift over the layers (neighbours alike) and reference tokens planted
    from the drafter's own step-1 guesses with outputs 1, 3, 4: graded hits, few ties. "after a
    prompt": a loss mask scores only positions after a prompt of 9 to 20 tokens, so the screen
    runs the rest of step 1 on the scored columns only (attention still over every position)."""
    root = tmp_path_factory.mktemp("screen")
    folder = write_example(root / "drafter", "sglang", DIMS)
    config, tensors = load_drafter_weights(folder)
    drafter, target_embeds = build_drafter(config, tensors, "cpu", torch.float32)
    assert target_embeds
    g = torch.Generator().manual_seed(1)
    B, S, T = 4, 48, 64
    base = torch.randn(B, S, T, generator=g)
    hidden = {-1: torch.randn(B, S, T, generator=g)}
    walk = torch.zeros(B, S, T)
    for o in range(6):
        walk += torch.randn(B, S, T, generator=g) * 0.3
        hidden[o] = base + walk
    drafter.embed_tokens = hidden[-1].reshape(B * S, T)
    ids = torch.arange(B * S).view(B, S)
    tokens = torch.zeros_like(ids)
    tokens[:, :S - 1] = ids[:, 1:]
    guess = drafter.forward(torch.cat([hidden[o] for o in (1, 3, 4)], -1), tokens).target_ids
    target_next = torch.randint(0, 512, (B, S), generator=g)
    target_next[:, 1:] = guess[:, :-1]
    path = root / "states.safetensors"
    loss_mask = None
    if request.param == "after a prompt":
        loss_mask = torch.ones(B, S, dtype=torch.bool)
        for b, n in enumerate((9, 20, 14, 17)):
            loss_mask[b, :n] = False
    write_states(path, input_ids=torch.randint(0, 512, (B, S), generator=g),
                 attention_mask=torch.ones(B, S, dtype=torch.bool), target_next=target_next,
                 hidden=hidden, num_layers=6, vocab_size=512, dtype="fp32", target="tiny", loss_mask=loss_mask)
    return drafter, path


def test_screen_hits_equal_evaluate_step1_hits(planted):
    drafter, path = planted
    states = open_states(path)
    refs = sorted(states.layers, key=lambda r: r.output_of)
    sets = [tuple(c) for c in itertools.combinations(refs, 3)]
    res, kept = screen(drafter, states, sets, rows=states.num_sequences, target_embeds=True, bound=NO_DROP)
    assert len(sets) == 35 and sorted(kept) == list(range(35))
    assert all(n == res.positions for n in (sum(res.counted),)) and res.complete
    per_wiring = []
    for i, ls in enumerate(sets):
        sc = evaluate(drafter, open_states(path), Candidate("w", ls, "test"), steps=1, batch_size=4,
                      target_embeds=True)
        assert res.hits[i] == sc.matched[0], ls  # the same hits, sequence by sequence
        assert res.counted == sc.counted[0]
        per_wiring.append(sum(sc.matched[0]))
    # the screen's own log score, per sequence, is the verdict's (logscore.log_scores at step 1)
    from eagle3conv.verify.logscore import log_scores

    for i in (0, 17, 34):
        mine = res.log_score(i)
        ref = log_scores(drafter, open_states(path), [sets[i]], steps=1, batch_size=4, target_embeds=True)[0]
        assert mine.counted == ref.counted
        assert mine.logp[0] == pytest.approx(ref.logp[0], rel=1e-4, abs=1e-3)
    planted_i = sets.index(tuple(LayerRef(o) for o in (1, 3, 4)))
    assert per_wiring[planted_i] == sum(res.counted)  # the planted wiring is right everywhere
    assert kept[0] == planted_i and len(set(per_wiring)) > 5  # graded, not all tied
    # the phases: the projections, then one entry per stage (positions doubling, every wiring kept)
    phases = list(res.phase_seconds)
    assert phases[0] == "project" and phases[1].startswith("stage 1: 35 wirings x 64 positions")
    assert len(phases) == 1 + len(res.stages) and all(st["kept"] == 35 for st in res.stages)
    assert [st["positions"] for st in res.stages] == NO_DROP.stages(res.stages[-1]["positions"])
    assert all(v >= 0 for v in res.phase_seconds.values())


def test_rows_share_a_forward_only_while_the_wirings_do_not_fill_one(planted, monkeypatch):
    """A row joins a group (its scored columns and keys padded to the group's) only while the
    wirings do not fill a forward on the rows before it; grouped or one row to a forward, the same
    hits and log scores."""
    drafter, path = planted
    states = open_states(path)
    refs = sorted(states.layers, key=lambda r: r.output_of)
    sets = [tuple(c) for c in itertools.combinations(refs, 3)]
    seen: list[int] = []
    finish = drafter.finish

    def spy(residual, attn, **kw):
        seen.append(residual.shape[1])  # the positions each wiring scores in this forward
        return finish(residual, attn, **kw)

    monkeypatch.setattr(drafter, "finish", spy)
    S = states.input_ids.shape[1]  # a row scores fewer positions than it has columns
    out = {}
    for tokens in (35 * 48 * 4, 35 * 40):  # every row fits one forward; one row already fills it
        seen.clear()
        out[tokens] = screen(drafter, states, sets, rows=states.num_sequences, target_embeds=True, bound=NO_DROP,
                             chunk_tokens=tokens)[0]
        out[tokens, "positions"] = max(seen)
    assert out[35 * 48 * 4, "positions"] > S >= out[35 * 40, "positions"]  # rows grouped, then one at a time
    grouped, alone = out[35 * 48 * 4], out[35 * 40]
    assert grouped.hits == alone.hits and grouped.positions == alone.positions
    for i in range(len(sets)):
        assert torch.allclose(grouped.vectors[i], alone.vectors[i], rtol=1e-5, atol=1e-5)


def test_state_spans_read_the_same_rows_as_the_mapped_views(planted):
    """The GPU feeder's direct reads (one byte range per slot and batch) land on the same rows
    as the memory-mapped views it reads otherwise."""
    import os

    import numpy as np

    from eagle3conv.verify.feed import mapped_states, pread_into, state_spans

    _, path = planted
    states = open_states(path)
    views, spans = mapped_states(states), state_spans(states)
    assert set(spans) == set(views) == set(states.layers)
    fd = os.open(path, os.O_RDONLY)
    try:
        for ref, view in views.items():
            start, row = spans[ref]
            dst = np.empty((2, *view.shape[1:]), dtype=np.float32)
            pread_into(fd, dst, start + 1 * row, path)  # sequences 1 and 2
            assert torch.equal(torch.from_numpy(dst), view[1:3])
    finally:
        os.close(fd)


def _variant_states(root, drafter, T: int, target_embeds: bool, wiring=(1, 3, 4)):
    """Drifting layer outputs and reference tokens planted from the drafter's own guesses (the
    drafter embeds by position from the captured embedding output, or with its own table)."""
    g = torch.Generator().manual_seed(2)
    B, S = 4, 40
    base = torch.randn(B, S, T, generator=g)
    hidden = {-1: torch.randn(B, S, T, generator=g)}
    walk = torch.zeros(B, S, T)
    for o in range(6):
        walk += torch.randn(B, S, T, generator=g) * (0.3 + 0.2 * o)  # layers of different scales
        hidden[o] = base + walk
    input_ids = torch.randint(0, 512, (B, S), generator=g)
    ids = input_ids
    if target_embeds:
        drafter.embed_tokens = hidden[-1].reshape(B * S, T)
        ids = torch.arange(B * S).view(B, S)
    with torch.inference_mode():
        guess = drafter.draft_chain(torch.cat([hidden[o] for o in wiring], -1), ids, 1).target_ids[0]
    target_next = torch.randint(0, 512, (B, S), generator=g)
    target_next[:, 1:] = guess[:, :-1]
    path = root / "states.safetensors"
    write_states(path, input_ids=input_ids,
                 attention_mask=torch.ones(B, S, dtype=torch.bool), target_next=target_next,
                 hidden=hidden, num_layers=6, vocab_size=512, dtype="fp32", target="tiny")
    return path


VARIANTS = ["norm_before_fc", "sglang without fc (k x T == H)", "fc and attention biases, norm_before_residual",
            "eagle-3.1 fc_norm", "fc_norm ignored (run without it)"]


def variant_drafter(tmp_path, variant: str, dtype=torch.float32):
    """A pico drafter of one step-1 variant (:data:`VARIANTS`): ``(drafter, target_embeds, T)``."""
    if variant != "sglang without fc (k x T == H)":
        dims, T, without = DIMS, 64, ()
    else:
        dims = Dims(hidden=192, target_hidden=64, heads=4, kv_heads=2, head_dim=48, intermediate=128, vocab=512,
                    draft_vocab=300, aux_ids=(1, 3, 4))
        T, without = 64, ("fc",)
    folder = write_example(tmp_path / "drafter", "sglang", dims)
    config, tensors = load_drafter_weights(folder)
    if variant == "norm_before_fc":
        g = torch.Generator().manual_seed(3)
        tensors["input_norm.weight"] = (1 + 0.4 * torch.randn(3 * T, generator=g)).to(tensors["fc.weight"].dtype)
        config["norm_before_fc"] = True
    if "fc_norm" in variant:
        g = torch.Generator().manual_seed(4)
        for i in range(3):
            tensors[f"fc_norm.{i}.weight"] = (1 + 0.4 * torch.randn(T, generator=g)).to(tensors["fc.weight"].dtype)
        config["fc_norm"] = True
        without = ("fc_norm",) if "ignored" in variant else ()
    if variant.startswith("fc and attention biases"):
        g = torch.Generator().manual_seed(5)
        config.update(bias=True, attention_bias=True, norm_before_residual=True)
        dt_ = tensors["fc.weight"].dtype
        tensors["fc.bias"] = (0.3 * torch.randn(dims.hidden, generator=g)).to(dt_)
        for n, width in (("q", dims.heads * dims.head_dim), ("k", dims.kv_heads * dims.head_dim),
                         ("v", dims.kv_heads * dims.head_dim), ("o", dims.hidden)):
            tensors[f"midlayer.self_attn.{n}_proj.bias"] = (0.2 * torch.randn(width, generator=g)).to(dt_)
    drafter, target_embeds = build_drafter(config, tensors, "cpu", dtype, run=Run(without=frozenset(without)))
    assert (drafter.input_norm is not None) == (variant == "norm_before_fc")
    assert bool(drafter.fc_norm) == (variant == "eagle-3.1 fc_norm")
    return drafter, target_embeds, T


@pytest.mark.parametrize("variant", VARIANTS)
def test_screen_runs_the_step_the_chain_runs(tmp_path, variant):
    """The screen composes step 1 from per-slot projections; for an EAGLE-3.1 drafter with
    input_norm over the concatenation (norm_before_fc), for SGLang's width dispatch (k x T ==
    hidden_size: no fc) and for a drafter with fc, q/k/v and o biases whose residual is the normed
    state (what the split step adds, RoPE'd, to every wiring's sum) it must still score what the
    chain scores, wiring by wiring."""
    drafter, target_embeds, T = variant_drafter(tmp_path, variant)
    path = _variant_states(tmp_path, drafter, T, target_embeds)
    states = open_states(path)
    refs = sorted(states.layers, key=lambda r: r.output_of)
    sets = [tuple(c) for c in itertools.combinations(refs, 3)]
    res, kept = screen(drafter, states, sets, rows=states.num_sequences, target_embeds=target_embeds,
                       bound=NO_DROP)
    from eagle3conv.verify.logscore import log_scores

    for i, ls in enumerate(sets):
        sc = evaluate(drafter, open_states(path), Candidate("w", ls, "test"), steps=1, batch_size=4,
                      target_embeds=target_embeds)
        assert res.hits[i] == sc.matched[0], ls
    for i in (0, 11, 34):
        ref = log_scores(drafter, open_states(path), [sets[i]], steps=1, batch_size=4,
                         target_embeds=target_embeds)[0]
        assert res.log_score(i).logp[0] == pytest.approx(ref.logp[0], rel=1e-4, abs=1e-3)  # rounding only
    planted_i = sets.index(tuple(LayerRef(o) for o in (1, 3, 4)))
    assert kept[0] == planted_i
    # fewer wirings than slot-layer pairs: each wiring's q/k/v by its own matmul (and RoPE), the same scores
    few, _ = screen(drafter, states, sets[:3], rows=states.num_sequences, target_embeds=target_embeds, bound=NO_DROP)
    assert few.hits == res.hits[:3]
    for i in range(3):
        assert few.log_score(i).logp[0] == pytest.approx(res.log_score(i).logp[0], rel=1e-4, abs=1e-3)


def test_a_two_layer_drafter_is_screened_over_the_prompt_columns_too(tmp_path):
    """A later decoder layer attends over every column's layer-0 output. With a prompt before the
    scored positions the screen ran the later layers on the scored columns only, so its hits and
    log scores were not the chain's; now it runs them on every column (the real 2-layer SmolLM2
    fixture, states drifting over 6 layers, a loss mask after prompts of 9 to 20 tokens)."""
    from pathlib import Path

    from eagle3conv.verify.logscore import log_scores

    config, tensors = load_drafter_weights(Path(__file__).parent / "data" / "smollm2-drafter-2layer")
    drafter, target_embeds = build_drafter(config, tensors, "cpu", torch.float32)
    assert len(drafter.later) == 1 and target_embeds
    g = torch.Generator().manual_seed(4)
    B, S, T = 3, 36, 576
    base = torch.randn(B, S, T, generator=g) * 4
    hidden = {-1: torch.randn(B, S, T, generator=g)}
    walk = torch.zeros(B, S, T)
    for o in range(6):
        walk += torch.randn(B, S, T, generator=g) * 2
        hidden[o] = base + walk
    drafter.embed_tokens = hidden[-1].reshape(B * S, T)
    ids = torch.arange(B * S).view(B, S)
    with torch.inference_mode():
        guess = drafter.draft_chain(torch.cat([hidden[o] for o in (1, 3, 4)], -1), ids, 1).target_ids[0]
    target_next = torch.randint(0, 49152, (B, S), generator=g)
    target_next[:, 1:] = guess[:, :-1]
    loss_mask = torch.ones(B, S, dtype=torch.bool)
    for b, n in enumerate((9, 20, 14)):
        loss_mask[b, :n] = False
    path = tmp_path / "states.safetensors"
    write_states(path, input_ids=torch.randint(0, 49152, (B, S), generator=g),
                 attention_mask=torch.ones(B, S, dtype=torch.bool), target_next=target_next, hidden=hidden,
                 num_layers=30, vocab_size=49152, dtype="fp32", target="tiny", loss_mask=loss_mask)
    states = open_states(path)
    sets = [tuple(LayerRef(o) for o in w) for w in ((1, 3, 4), (0, 2, 5), (-1, 1, 3), (2, 4, 5))]
    res, _ = screen(drafter, states, sets, rows=states.num_sequences, target_embeds=True, bound=NO_DROP)
    for i, ls in enumerate(sets):
        sc = evaluate(drafter, open_states(path), Candidate("w", ls, "test"), steps=1, batch_size=4,
                      target_embeds=True)
        assert res.hits[i] == sc.matched[0], ls
        ref = log_scores(drafter, open_states(path), [ls], steps=1, batch_size=4, target_embeds=True)[0]
        assert res.log_score(i).logp[0] == pytest.approx(ref.logp[0], rel=1e-4, abs=1e-3)


def test_a_second_screen_takes_the_first_screens_scores_where_it_has_them(planted):
    """Refinement screens again wirings the global screen read on some positions: with ``known`` it
    takes those scores (the same states and labels: the same positions in the same order) and
    computes only the rest, with the same result as computing everything."""
    drafter, path = planted
    states = open_states(path)
    refs = sorted(states.layers, key=lambda r: r.output_of)
    sets = [tuple(c) for c in itertools.combinations(refs, 3)]
    bound = ScreenBound(first=16)
    first, _ = screen(drafter, states, sets, rows=states.num_sequences, target_embeds=True, bound=bound)
    left_early = [i for i in range(len(sets)) if 0 < len(first.vectors[i]) < first.total]
    assert left_early  # some wirings left before the end: a second screen has part of their scores
    pick = [sets[i] for i in left_early[:6]] + [sets[first.alive[0]]]
    index = [sets.index(ls) for ls in pick]
    nodrop = replace(NO_DROP, first=16)
    again, _ = screen(drafter, states, pick, rows=states.num_sequences, target_embeds=True, bound=nodrop,
                      known=(first, index))
    fresh, _ = screen(drafter, states, pick, rows=states.num_sequences, target_embeds=True, bound=nodrop)
    assert again.pos_row == fresh.pos_row
    for i in range(len(pick)):
        assert torch.allclose(again.vectors[i], fresh.vectors[i], atol=1e-5), pick[i]
        assert torch.equal(again.hit_vectors[i], fresh.hit_vectors[i]) and again.hits[i] == fresh.hits[i]
    taken = sum(len(first.vectors[k]) for k in index)
    assert again.work == fresh.work - taken and fresh.work == len(pick) * fresh.total
    # fewer rows read the same positions first, in the same order: what the first screen has is taken
    fewer = states.num_sequences - 1
    other, _ = screen(drafter, states, pick, rows=fewer, target_embeds=True, bound=nodrop, known=(first, index))
    alone, _ = screen(drafter, states, pick, rows=fewer, target_embeds=True, bound=nodrop)
    assert other.work < alone.work and other.pos_row == alone.pos_row
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(other.vectors, alone.vectors))
