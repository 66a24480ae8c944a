"""``draft_chain(columns=...)``, the chains started at chosen indices only, against the whole chain
at those indices; and ``evaluate``, which drafts on a CPU only the chains some scored draft needs,
against the same evaluate drafting every chain."""

from __future__ import annotations

import pytest
import torch

from eagle3conv.errors import UsageError
from eagle3conv.example import Dims, write_example
from eagle3conv.model.drafter import Eagle3Drafter
from eagle3conv.spec.layers import LayerRef
from eagle3conv.states.format import write_states
from eagle3conv.states.readers import open_states
from eagle3conv.verify import Candidate, build_drafter, evaluate, load_drafter_weights

DIMS = Dims(hidden=64, target_hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512,
            draft_vocab=300, aux_ids=(1, 3, 4))


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    folder = write_example(tmp_path_factory.mktemp("cols") / "drafter", "sglang", DIMS)
    config, tensors = load_drafter_weights(folder)
    d, _ = build_drafter(config, tensors, "cpu", torch.float32)
    return d


@pytest.mark.parametrize("chunk", [5, 512])
@pytest.mark.parametrize("cols", [[0, 1, 2, 9, 17, 30, 38, 39], list(range(12, 40)), [39]])
def test_chains_at_chosen_starts_are_the_whole_chains_there(drafter, chunk, cols):
    g = torch.Generator().manual_seed(7)
    B, S = 3, 40
    aux = torch.randn(B, S, 3 * 64, generator=g)
    ids = torch.randint(0, 512, (B, S), generator=g)
    full = drafter.draft_chain(aux, ids, 3, return_logits=True, chunk_size=chunk)
    c = torch.tensor(cols)
    part = drafter.draft_chain(aux, ids, 3, return_logits=True, chunk_size=chunk, columns=c)
    assert part.target_ids.shape == (3, B, len(cols))
    assert torch.equal(part.target_ids, full.target_ids[:, :, c])
    assert torch.equal(part.labels, full.labels[:, :, c])
    assert torch.allclose(part.logits, full.logits[:, :, c], atol=1e-5, rtol=1e-5)


def test_chosen_starts_are_refused_where_a_later_layer_reads_every_index(tmp_path):
    folder = write_example(tmp_path / "two", "sglang", DIMS)
    config, tensors = load_drafter_weights(folder)
    d, _ = build_drafter(config, tensors, "cpu", torch.float32)
    assert d.drafts_columns
    d.parallel_mask_token = 5  # P-EAGLE drafts in parallel: its mask slots follow every index
    assert not d.drafts_columns
    d.parallel_mask_token = None
    d.later = [object()]  # any later decoder layer: step 1 then needs every index's layer-0 output
    assert not d.drafts_columns
    with pytest.raises(UsageError, match="one-layer"):
        d.draft_chain(torch.zeros(1, 4, 3 * 64), torch.zeros(1, 4, dtype=torch.long), 2, columns=torch.tensor([1]))


def test_evaluate_drafting_the_scored_chains_only_gives_every_figure_unchanged(drafter, tmp_path, monkeypatch):
    """States with prompts of 6 to 25 tokens (not scored) and one row scored nowhere: the chains
    drafted are the scored ones; the figures (acceptance per step, chains, replay, norms) equal
    those of evaluate drafting every chain."""
    g = torch.Generator().manual_seed(8)
    B, S, T = 5, 48, 64
    hidden = {o: torch.randn(B, S, T, generator=g) for o in range(-1, 5)}
    loss = torch.ones(B, S, dtype=torch.bool)
    for b, n in enumerate((6, 25, 14, 9, S)):
        loss[b, :n] = False
    mask = torch.ones(B, S, dtype=torch.bool)
    mask[2, 40:] = False
    loss &= mask
    ids = torch.arange(B * S).view(B, S)
    drafter.embed_tokens = hidden[-1].reshape(B * S, T)
    chain = drafter.draft_chain(torch.cat([hidden[o] for o in (1, 3, 4)], -1), ids, 3,
                                embeddings=hidden[-1].reshape(B * S, T)).target_ids
    target_next = torch.randint(0, 512, (B, S), generator=g)
    t = torch.arange(0, S - 2, 3)  # the chains started at t: drafts 1 and 2 planted as the references
    target_next[:, t + 1], target_next[:, t + 2] = chain[0][:, t], chain[1][:, t]
    for b, n in enumerate((6, 25, 14, 9)):  # the chains whose first scored draft is the 2nd or the 3rd
        target_next[b, n], target_next[b, n + 1] = chain[1][b, n - 2], chain[2][b, n - 2]
    path = tmp_path / "states.safetensors"
    write_states(path, input_ids=torch.randint(0, 512, (B, S), generator=g), attention_mask=mask,
                 target_next=target_next, hidden=hidden, num_layers=5, vocab_size=512, dtype="fp32",
                 target="tiny", loss_mask=loss)
    cand = Candidate("w", tuple(LayerRef(o) for o in (1, 3, 4)), "test")
    drafted = []
    real = Eagle3Drafter.draft_chain

    def spy(self, *a, **k):
        drafted.append(k.get("columns"))
        return real(self, *a, **k)

    monkeypatch.setattr(Eagle3Drafter, "draft_chain", spy)
    some = evaluate(drafter, open_states(path), cand, steps=3, batch_size=2, target_embeds=True)
    assert drafted and all(c is not None for c in drafted)
    assert sum(int(c.numel()) for c in drafted) < 3 * S  # prompt starts were not drafted
    monkeypatch.setattr(Eagle3Drafter, "drafts_columns", property(lambda self: False))
    drafted.clear()
    every = evaluate(drafter, open_states(path), cand, steps=3, batch_size=2, target_embeds=True)
    assert drafted and all(c is None for c in drafted)
    a, b = some.to_dict(), every.to_dict()
    a.pop("seconds"), b.pop("seconds")
    assert a == b
    assert sum(some.matched[0]) > 10 and sum(some.matched[1]) > 4  # hits at steps 1 and 2 were compared
    assert sum(some.matched[2]) >= 4  # the 3rd drafts of chains started two before the prompt's end
