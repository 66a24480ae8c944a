"""The trainable MLA drafter of bench/smollm2 (issue 12's fixture) against transformers' DeepSeek-V3.

``bench/smollm2/common.py`` trains ``tests/data/smollm2-drafter-mla`` with its own MLA step
(``TrainableMLADrafter``). These tests pin that step to an independent implementation:
transformers' ``DeepseekV3Attention`` and its yarn rotary embedding, adapted as an EAGLE-3 drafter
needs (q_a/kv_a read the 2H-wide input, latent norms use ``rms_norm_eps``). Random weights, CPU.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")

BENCH = Path(__file__).resolve().parents[1] / "bench" / "smollm2"
sys.path.insert(0, str(BENCH))
import common  # noqa: E402

TARGET = SimpleNamespace(rope_parameters={"rope_theta": 100000.0, "rope_type": "default"}, rms_norm_eps=1e-5,
                         max_position_embeddings=8192, bos_token_id=1, eos_token_id=2, pad_token_id=2)


def _drafter(seed: int = 0) -> tuple[common.TrainableMLADrafter, dict]:
    config = common.mla_drafter_config(intermediate_size=64, draft_vocab_size=300, target_config=TARGET)
    gen = torch.Generator().manual_seed(seed)
    embed = torch.randn(common.VOCAB, common.HIDDEN, generator=gen)
    torch.manual_seed(seed)
    model = common.TrainableMLADrafter(config, embed)
    with torch.no_grad():  # norms away from 1 so a swapped or skipped norm shows
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn(p.shape, generator=gen))
    return model, config


def _inputs(seed: int = 1, b: int = 2, s: int = 37):
    gen = torch.Generator().manual_seed(seed)
    aux = 3 * torch.randn(b, s, 3 * common.HIDDEN, generator=gen)
    ids = torch.randint(0, common.VOCAB, (b, s), generator=gen)
    return aux, ids


def test_mla_config_has_the_kimi_style_fields_and_fits_h576():
    _, config = _drafter()
    assert config["architectures"] == ["Eagle3DeepseekV2ForCausalLM"]
    assert config["hidden_size"] == 576 and config["q_lora_rank"] and config["rope_interleave"] is True
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    assert config["rope_scaling"]["type"] == "yarn" and config["rope_scaling"]["factor"] > 1


def test_yarn_rope_equals_transformers():
    _, config = _drafter()
    got = common.check_yarn_against_transformers(config)
    assert got["inv_freq_max_abs_diff"] == 0.0
    assert got["cos_factor"][0] == pytest.approx(got["cos_factor"][1], abs=1e-12)
    assert got["softmax_scale"][0] == pytest.approx(got["softmax_scale"][1], rel=1e-12)
    # the yarn attention scale is not the plain one: factor 4 -> (0.1 ln 4 + 1)^2 = 1.2963
    assert got["softmax_scale"][0] == pytest.approx(48**-0.5 * (0.1 * torch.log(torch.tensor(4.0)).item() + 1) ** 2)


def test_step1_equals_transformers_deepseek_v3_attention():
    model, _ = _drafter()
    aux, ids = _inputs()
    tok = common.shifted(ids, 1)
    with torch.no_grad():
        mine = model.chain(aux, [tok])[0]
    ref = common.mla_step1_oracle(model, aux, tok)
    assert float((mine - ref).abs().max()) <= 1e-4 * float(ref.abs().max())


def test_non_interleaved_rope_would_be_caught(monkeypatch):
    """The oracle tells the interleaved (GPT-J) layout from the NeoX one (TorchSpec's old bug)."""
    model, _ = _drafter()
    aux, ids = _inputs()
    tok = common.shifted(ids, 1)
    ref = common.mla_step1_oracle(model, aux, tok)
    monkeypatch.setattr(common, "_deinterleave", lambda x: x)
    with torch.no_grad():
        neox = model.chain(aux, [tok])[0]
    assert float((neox - ref).abs().max()) > 1e-3 * float(ref.abs().max())


def test_chain_step_k_attends_causal_step1_keys_plus_its_own_column():
    """Training-time test: position t of step 2 depends on step 1 at 0..t only (no future leak)."""
    model, _ = _drafter()
    aux, ids = _inputs(b=1, s=20)
    tokens = [common.shifted(ids, k + 1) for k in range(3)]
    with torch.no_grad():
        base = model.chain(aux, tokens)
        aux2 = aux.clone()
        aux2[:, 12:] += 5.0  # change the future of position 11
        moved = model.chain(aux2, tokens)
    for k in range(3):
        assert torch.equal(base[k][:, :12], moved[k][:, :12])
        assert not torch.allclose(base[k][:, 12:], moved[k][:, 12:])


def test_state_dict_names_are_the_canonical_mla_names():
    from eagle3conv.model.drafter import expected_mla_shapes

    model, config = _drafter()
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    want = {k: tuple(v) for k, v in expected_mla_shapes(config).items()
            if k not in ("d2t", "t2d", "embed_tokens.weight")}
    assert got == want


def test_lost_wiring_config_strips_both_id_fields():
    cfg = common.drafter_config(intermediate_size=64, draft_vocab_size=300,
                                target_config=SimpleNamespace(**vars(TARGET), num_attention_heads=9,
                                                              num_key_value_heads=3, head_dim=64),
                                layers=(4, 11, 21), strip_ids=True)
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] is None
    assert "eagle_aux_hidden_state_layer_ids" in cfg and cfg["eagle_aux_hidden_state_layer_ids"] is None
    kept = common.drafter_config(intermediate_size=64, draft_vocab_size=300,
                                 target_config=SimpleNamespace(**vars(TARGET), num_attention_heads=9,
                                                               num_key_value_heads=3, head_dim=64))
    assert kept["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    assert "eagle_aux_hidden_state_layer_ids" not in kept  # the old fixture's config is unchanged
