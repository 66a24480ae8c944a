"""The drafter's step-1 pieces against its own forward, for every step-1 variant.

verify's wiring screen sums each slot's projection once per layer instead of running fc per
wiring: it calls the drafter's ``slot_projection`` / ``slot_sq_mean`` / ``combine`` (and
``embed``, ``attention``, ``layer0_residual``). Commit 226da56 fixed a screen that had its own copy
of step 1 and drifted from the forward on EAGLE-3.1 drafters (input_norm). Here the pieces are held
to the forward's step 1 -- the draft chain's first-step logits -- to float tolerance for each switch
combination the fixtures have: plain fc, fc's bias, EAGLE-3.1's per-slot fc_norm, norm_before_fc's
input_norm over the concatenation, SGLang's width dispatch (no fc when k x T == H), an engine that
ignores fc_norm / norm_before_fc (run without them), norm_before_residual, two decoder layers, and
an MLA drafter (with fc_norm, its RoPE layout flipped by the run).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from eagle3conv.model import build_drafter
from eagle3conv.spec.engines import Run

from test_forward_2026 import make_config, make_state_dict
from test_mla import make_config as mla_config
from test_mla import make_state_dict as mla_state_dict

LLAMA: dict[str, tuple[dict[str, Any], Run]] = {
    "plain": ({}, Run()),
    "fc bias": ({"bias": True}, Run()),
    "eagle-3.1 fc_norm": ({"fc_norm": True, "norm_output": True}, Run()),
    "norm_before_fc": ({"norm_before_fc": True}, Run()),
    "norm_before_fc, fc bias, norm_before_residual": ({"norm_before_fc": True, "bias": True,
                                                       "norm_before_residual": True}, Run()),
    "fc_norm ignored": ({"fc_norm": True}, Run(without=frozenset({"fc_norm"}))),
    "norm_before_fc ignored": ({"norm_before_fc": True}, Run(without=frozenset({"norm_before_fc"}))),
    "two layers, fc_norm": ({"fc_norm": True, "num_hidden_layers": 2}, Run(later_layer_norm="input_layernorm")),
    "k x T == H, fc applied": ({"target_hidden_size": 64 // 4, "num_aux_hidden_states": 4,
                                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4]}}, Run()),
    "k x T == H, no fc (width dispatch)": ({"target_hidden_size": 64 // 4, "num_aux_hidden_states": 4,
                                            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4]},
                                            "bias": True, "fc_norm": True},
                                           Run(without=frozenset({"fc", "fc_norm"}))),
}


def _drafters():
    for name, (over, run) in LLAMA.items():
        over = dict(over)
        config = make_config(over.pop("num_hidden_layers", 1), **over)
        yield name, config, make_state_dict(config), run
    mla = mla_config(fc_norm=True, rope_interleave=True)
    yield "mla, fc_norm, half-split RoPE", mla, mla_state_dict(mla), Run(rope_interleave=False)


CASES = list(_drafters())


def _step1_from_pieces(d, aux: torch.Tensor, ids: torch.Tensor, table: torch.Tensor | None) -> torch.Tensor:
    """Step 1's logits from the public pieces: per-slot projections combined, then layer 0's
    attention inputs over the combined state (H wide: no fc), causal attention, the rest."""
    c = d.config
    t = c.target_hidden_size
    slots = [aux[..., s * t:(s + 1) * t] for s in range(c.num_aux)]
    means = [d.slot_sq_mean(x) for x in slots]
    g = d.combine((d.slot_projection(x, s) for s, x in enumerate(slots)),
                  None if means[0] is None else means)
    residual, q, k, v = d.attention_inputs(g, ids, embeddings=table)
    return d.finish(residual, d.attention(q, k, v)).logits


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_step1_pieces_equal_the_forwards_step1(case) -> None:
    _, config, sd, run = case
    d = build_drafter(config, sd, dtype=torch.float32, run=run)
    c = d.config
    assert d.step1_factors
    gen = torch.Generator().manual_seed(7)
    aux = torch.randn(2, 11, c.fc_in_features, generator=gen) * 3
    ids = torch.randint(0, c.vocab_size, (2, 11), generator=gen)
    want = d.draft_chain(aux, ids, 1, return_logits=True).logits[0]
    tokens = torch.zeros_like(ids)  # draft_chain's step 1 reads x_{t+1} at index t
    tokens[:, :-1] = ids[:, 1:]
    got = _step1_from_pieces(d, aux, tokens, None)
    assert torch.allclose(got, want, atol=2e-5, rtol=1e-4), float((got - want).abs().max())


@pytest.mark.parametrize("case", CASES[:4] + CASES[-1:], ids=[c[0] for c in CASES[:4] + CASES[-1:]])
def test_embeddings_by_position_are_the_forwards_argument(case) -> None:
    """``embeddings=``: a table the ids index instead of the drafter's (verify's captured embedding
    outputs, the ids being positions); the drafter's own table is left as it was."""
    _, config, sd, run = case
    d = build_drafter(config, sd, dtype=torch.float32, run=run)
    own = d.embed_tokens
    gen = torch.Generator().manual_seed(8)
    aux = torch.randn(2, 9, d.config.fc_in_features, generator=gen)
    ids = torch.randint(0, d.config.vocab_size, (2, 9), generator=gen)
    want = d.draft_chain(aux, ids, 3, return_logits=True).logits
    table = own[ids].reshape(18, -1)  # embed(x_p) at position p
    positions = torch.arange(18).view(2, 9)
    got = d.draft_chain(aux, positions, 3, return_logits=True, embeddings=table).logits
    valid = torch.tensor([[k + 1 + t < 9 for t in range(9)] for k in range(3)])[:, None, :, None]
    # past the end both read a placeholder token (id 0 / position 0): not compared, as it is never scored
    assert torch.allclose(got * valid, want * valid, atol=1e-5, rtol=1e-5)
    assert d.embed_tokens is own


def test_a_run_is_its_own_cache_key() -> None:
    """Two Runs that run the drafter alike are equal (and hash alike) whatever the report says about
    them; any forward field tells them apart."""
    a = Run(norm_before_residual=False, without=frozenset({"fc_norm"}), why="sglang 0.5.12", source="x.py:1")
    b = Run(norm_before_residual=False, without=frozenset({"fc_norm"}), why="sglang 0.5.23", source="y.py:2")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != Run(norm_before_residual=True, without=frozenset({"fc_norm"}))
    assert a != Run(norm_before_residual=False)
    assert Run(own_embedding="unless_equal").settled(own=False) == Run()
    assert Run().settled(raw_modules=("fc",)) != Run()
