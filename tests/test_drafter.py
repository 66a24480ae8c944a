"""Tests for eagle3conv.model.drafter: strict loading, dispatch, RoPE, causality, TTT chain.

Pico sizes: H=64, 4 heads, 2 kv heads, head_dim 16, I=128, V=256, Vd=96, and a
target hidden size T=48 != H (so fc is [64, 144]). The oracle test pins the
forward against vLLM's speculators package; install it with

    pip install --no-deps speculators==0.9.0 && \
    pip install hs-connectors==0.9.0 openai==3.57.0 datasets==5.2.0

(``--no-deps`` because speculators 0.9.0 pins transformers<=5.19; the extra
packages are what its import chain needs and change no pinned version).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from eagle3conv.errors import InvalidCheckpointError, UsageError
from eagle3conv.spec.engines import Run
from eagle3conv.model.drafter import (
    DrafterConfig,
    Eagle3Drafter,
    check_mla_shapes,
    expected_mla_shapes,
    expected_shapes,
    smoke_test,
)

H, T, V, VD, INTER = 64, 48, 256, 96, 128


def make_config(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": H,
        "target_hidden_size": T,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": INTER,
        "vocab_size": V,
        "draft_vocab_size": VD,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
    }
    config.update(overrides)
    return config


def make_state_dict(
    config: dict[str, Any], *, seed: int = 0, embed: bool = False
) -> dict[str, torch.Tensor]:
    """Random weights of the right shapes; a sorted random draft vocab for d2t/t2d."""
    gen = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {}
    for key, shape in expected_shapes(config).items():
        if key in ("d2t", "t2d") or (key == "embed_tokens.weight" and not embed):
            continue
        if len(shape) == 1:
            sd[key] = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:
            sd[key] = torch.randn(shape, generator=gen) / shape[1] ** 0.5
    vocab, draft_vocab = config["vocab_size"], config.get("draft_vocab_size", config["vocab_size"])
    targets = torch.randperm(vocab, generator=gen)[:draft_vocab].sort().values
    sd["d2t"] = targets - torch.arange(draft_vocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[targets] = True
    sd["t2d"] = t2d
    return sd


def make_drafter(config: dict[str, Any] | None = None, **kwargs: Any) -> Eagle3Drafter:
    config = config or make_config()
    sd = make_state_dict(config, embed=True)
    return Eagle3Drafter(config, sd, device="cpu", dtype=torch.float32, **kwargs)


def rand_inputs(
    drafter: Eagle3Drafter, batch: int = 2, seq: int = 12, seed: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    aux = torch.randn(batch, seq, drafter.config.fc_in_features, generator=gen)
    ids = torch.randint(0, V, (batch, seq), generator=gen)
    return aux, ids


# --------------------------------------------------------------------------- strict loading


def test_expected_shapes_cover_t_not_h() -> None:
    shapes = expected_shapes(make_config())
    assert shapes["fc.weight"] == (H, 3 * T)
    assert shapes["midlayer.self_attn.q_proj.weight"] == (64, 2 * H)
    assert shapes["midlayer.self_attn.k_proj.weight"] == (32, 2 * H)
    assert shapes["lm_head.weight"] == (VD, H)
    assert "fc.bias" not in shapes and not any(k.startswith("fc_norm") for k in shapes)


def test_loads_without_optional_tensors() -> None:
    config = make_config()
    sd = make_state_dict(config)
    del sd["t2d"]
    drafter = Eagle3Drafter(config, sd, dtype=torch.float32, embed_tokens=torch.randn(V, H))
    assert drafter.embedding_source == "caller"


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda sd: sd.pop("midlayer.hidden_norm.weight"), "missing: midlayer.hidden_norm.weight"),
        (lambda sd: sd.pop("d2t"), "missing: d2t"),
        (
            lambda sd: sd.__setitem__("layers.0.self_attn.q_proj.weight", torch.zeros(1)),
            "unexpected: layers.0.self_attn.q_proj.weight",
        ),
        (
            lambda sd: sd.__setitem__("fc.weight", torch.zeros(H, 3 * H)),
            "wrong shape: fc.weight: expected [64, 144], got [64, 192]",
        ),
        (
            lambda sd: sd.__setitem__("fc.bias", torch.zeros(H)),
            "unexpected: fc.bias",
        ),
        (
            lambda sd: sd.__setitem__("fc_norm.0.weight", torch.ones(T)),
            "unexpected: fc_norm.0.weight",
        ),
    ],
)
def test_strict_load_names_offending_key(mutate: Any, expected: str) -> None:
    config = make_config()
    sd = make_state_dict(config, embed=True)
    mutate(sd)
    with pytest.raises(InvalidCheckpointError) as info:
        Eagle3Drafter(config, sd, dtype=torch.float32)
    assert expected in info.value.details
    assert info.value.exit_code == 3


def test_strict_load_lists_every_problem_at_once() -> None:
    config = make_config()
    sd = make_state_dict(config, embed=True)
    sd.pop("norm.weight")
    sd["model.norm.weight"] = torch.ones(H)
    sd["lm_head.weight"] = torch.zeros(V, H)
    with pytest.raises(InvalidCheckpointError) as info:
        Eagle3Drafter(config, sd, dtype=torch.float32)
    assert info.value.details == [
        "missing: norm.weight",
        "unexpected: model.norm.weight",
        "wrong shape: lm_head.weight: expected [96, 64], got [256, 64]",
    ]
    assert "norm.weight" in info.value.message


def test_fc_norm_flag_requires_its_tensors() -> None:
    config = make_config(fc_norm=True)
    sd = make_state_dict(make_config(), embed=True)  # built without fc_norm
    with pytest.raises(InvalidCheckpointError) as info:
        Eagle3Drafter(config, sd, dtype=torch.float32)
    assert [d for d in info.value.details if "fc_norm" in d] == [
        f"missing: fc_norm.{i}.weight" for i in range(3)
    ]


def test_fc_bias_from_config() -> None:
    config = make_config(bias=True)
    drafter = make_drafter(config)
    assert drafter.fc_bias is not None and drafter.fc_bias.shape == (H,)


@pytest.mark.parametrize(
    ("d2t", "expected"),
    [
        (torch.full((VD,), V, dtype=torch.long), "outside the target vocab"),
        (torch.zeros(VD, dtype=torch.float32), "expected an integer dtype"),
    ],
)
def test_bad_d2t_is_rejected(d2t: torch.Tensor, expected: str) -> None:
    config = make_config()
    sd = make_state_dict(config, embed=True)
    sd["d2t"] = d2t
    with pytest.raises(InvalidCheckpointError, match=expected):
        Eagle3Drafter(config, sd, dtype=torch.float32)


def test_missing_draft_vocab_size_with_pruned_head() -> None:
    config = make_config()
    sd = make_state_dict(config, embed=True)
    del config["draft_vocab_size"]
    with pytest.raises(InvalidCheckpointError, match="draft_vocab_size") as info:
        Eagle3Drafter(config, sd, dtype=torch.float32)
    assert info.value.hint == f"set draft_vocab_size: {VD} in config.json"


def test_full_vocab_drafter_needs_no_d2t() -> None:
    config = make_config(draft_vocab_size=V)
    sd = make_state_dict(config, embed=True)
    del sd["d2t"]
    drafter = Eagle3Drafter(config, sd, dtype=torch.float32)
    assert torch.equal(drafter.d2t, torch.zeros(V, dtype=torch.long))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"num_hidden_layers": 2}, "num_hidden_layers is 2, but the weights hold 1 decoder layer"),  # layer 1 has no tensors
        ({"tie_word_embeddings": True}, "tie_word_embeddings"),
        ({"norm_before_fc": True}, "missing: input_norm.weight"),
        ({"hidden_size": None}, "hidden_size"),
        ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "rope"),
    ],
)
def test_unusable_configs(overrides: dict[str, Any], expected: str) -> None:
    base = make_config()
    sd = make_state_dict(base, embed=True)
    with pytest.raises(InvalidCheckpointError, match=expected):
        Eagle3Drafter(make_config(**overrides), sd, dtype=torch.float32)


def test_embedding_must_come_from_somewhere() -> None:
    config = make_config()
    sd = make_state_dict(config)
    with pytest.raises(UsageError, match="embed_tokens"):
        Eagle3Drafter(config, sd, dtype=torch.float32)
    with pytest.raises(UsageError, match=r"\[256, 64\]"):
        Eagle3Drafter(config, sd, dtype=torch.float32, embed_tokens=torch.zeros(V, T))


def test_caller_embedding_wins_over_checkpoint_copy() -> None:
    config = make_config()
    sd = make_state_dict(config, embed=True)
    target_embed = torch.randn(V, H)
    drafter = Eagle3Drafter(config, sd, dtype=torch.float32, embed_tokens=target_embed)
    assert drafter.embedding_source == "caller"
    assert torch.equal(drafter.embed_tokens, target_embed)


def test_config_flags_read_top_level_then_eagle_config() -> None:
    nested = make_config(
        eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 30], "norm_output": True}
    )
    c = DrafterConfig.from_config(nested)
    assert (c.num_aux, c.norm_output, c.fc_norm) == (2, True, False)
    top = make_config(
        eagle_config=None, eagle_aux_hidden_state_layer_ids=[1, 2, 3, 4], fc_norm=True
    )
    c = DrafterConfig.from_config(top)
    assert (c.num_aux, c.fc_norm, c.fc_in_features) == (4, True, 4 * T)
    assert DrafterConfig.from_config(make_config(eagle_config=None)).num_aux == 3


# --------------------------------------------------------------------------- smoke test


def test_smoke_test_passes_with_random_embedding() -> None:
    config = make_config(fc_norm=True, norm_output=True)
    result = smoke_test(config, make_state_dict(config), "cpu")
    assert result.ok, result.problems
    assert (result.step1_input_width, result.step2_input_width) == (3 * T, H)
    assert (result.logits_width, result.vocab_size) == (VD, V)
    assert result.embedding_source == "random"


def test_smoke_test_bf16_with_checkpoint_embedding() -> None:
    config = make_config()
    result = smoke_test(config, make_state_dict(config, embed=True), "cpu", dtype=torch.bfloat16)
    assert result.ok, result.problems
    assert result.embedding_source == "checkpoint"


def test_smoke_test_raises_on_bad_checkpoint() -> None:
    config = make_config()
    sd = make_state_dict(config)
    del sd["fc.weight"]
    with pytest.raises(InvalidCheckpointError, match=r"fc\.weight"):
        smoke_test(config, sd, "cpu")


# --------------------------------------------------------------------------- forward


def test_step1_and_step2_dispatch_by_width() -> None:
    drafter = make_drafter()
    aux, ids = rand_inputs(drafter)
    out1 = drafter.forward(aux, ids)
    assert out1.logits.shape == (2, 12, VD) and out1.hidden.shape == (2, 12, H)
    # H wide input skips fc: feeding fc(aux) by hand gives the same step.
    g = F.linear(aux, drafter.fc_weight)
    torch.testing.assert_close(drafter.forward(g, ids).logits, out1.logits)
    out2 = drafter.forward(out1.hidden, ids, position_offset=1)
    assert out2.logits.shape == (2, 12, VD)
    assert not torch.allclose(out2.logits, out1.logits)
    with pytest.raises(UsageError, match="width 100"):
        drafter.forward(torch.zeros(2, 12, 100), ids)


def test_target_ids_are_argmax_mapped_through_d2t() -> None:
    drafter = make_drafter()
    out = drafter.forward(*rand_inputs(drafter))
    draft = out.logits.argmax(-1)
    assert torch.equal(out.draft_ids, draft)
    assert torch.equal(out.target_ids, draft + drafter.d2t[draft])
    assert ((out.target_ids >= 0) & (out.target_ids < V)).all()


def test_norm_output_feeds_post_norm_state() -> None:
    config = make_config()
    sd = make_state_dict(config, embed=True)
    plain = Eagle3Drafter(config, sd, dtype=torch.float32)
    post = Eagle3Drafter(make_config(norm_output=True), sd, dtype=torch.float32)
    aux, ids = rand_inputs(plain)
    a, b = plain.forward(aux, ids), post.forward(aux, ids)
    torch.testing.assert_close(a.logits, b.logits)  # same head input either way
    rms = a.hidden.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    torch.testing.assert_close(b.hidden, post.norm * a.hidden / rms)


def test_norm_before_residual_changes_output_and_can_be_overridden() -> None:
    config = make_config(norm_before_residual=True)
    sd = make_state_dict(config, embed=True)
    vllm_style = Eagle3Drafter(config, sd, dtype=torch.float32)
    sglang_style = Eagle3Drafter(config, sd, dtype=torch.float32, run=Run(norm_before_residual=False))
    plain = Eagle3Drafter(make_config(), sd, dtype=torch.float32)
    aux, ids = rand_inputs(plain)
    assert not torch.allclose(vllm_style.forward(aux, ids).logits, plain.forward(aux, ids).logits)
    torch.testing.assert_close(
        sglang_style.forward(aux, ids).logits, plain.forward(aux, ids).logits
    )


@pytest.mark.parametrize(
    "rope",
    [
        {},
        {"rope_scaling": {"rope_type": "linear", "factor": 4.0}},
        {
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
        {
            "rope_scaling": {
                "type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 512,
                "beta_fast": 32,
                "beta_slow": 1,
            }
        },
        {"rope_theta": None, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
        {"rope_scaling": {"type": "mrope", "mrope_section": [4, 2, 2]}},
    ],
    ids=["default", "linear", "llama3", "yarn", "rope_parameters", "mrope-as-default"],
)
def test_rope_variants_run(rope: dict[str, Any]) -> None:
    config = make_config(**rope)
    drafter = make_drafter(config)
    aux, ids = rand_inputs(drafter, seq=40)
    out = drafter.forward(aux, ids, position_offset=100)
    assert torch.isfinite(out.logits).all()
    chain = drafter.draft_chain(aux, ids, 2)
    assert chain.target_ids.shape == (2, 2, 40)


def test_rope_matches_transformers_rotary_embedding() -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}
    drafter = make_drafter(make_config(rope_scaling=scaling))
    rope: dict[str, Any] = {"rope_scaling": scaling}  # old spelling, as drafter configs have it
    ref = LlamaRotaryEmbedding(
        LlamaConfig(hidden_size=H, num_attention_heads=4, head_dim=16, **rope)
    )
    positions = torch.arange(0, 300, 7)
    cos, sin = ref(torch.zeros(1, dtype=torch.float32), positions[None])
    mine_cos, mine_sin = drafter.rope(positions)
    torch.testing.assert_close(mine_cos, cos[0])
    torch.testing.assert_close(mine_sin, sin[0])
    assert drafter.rope_scale > 1.0  # yarn's attention factor is applied


def test_later_tokens_do_not_change_earlier_logits() -> None:
    drafter = make_drafter()
    aux, ids = rand_inputs(drafter, batch=1, seq=16)
    changed_ids, changed_aux = ids.clone(), aux.clone()
    changed_ids[:, 10] = (ids[:, 10] + 1) % V
    changed_aux[:, 10:] += 1.0
    a, b = drafter.forward(aux, ids), drafter.forward(changed_aux, changed_ids)
    torch.testing.assert_close(a.logits[:, :9], b.logits[:, :9])
    assert not torch.allclose(a.logits[:, 9:], b.logits[:, 9:])
    # In the chain, step 1 at t reads x_{t+1}, step k reads x_{t+k}: x_10 reaches t >= 10 - k.
    ca = drafter.draft_chain(aux, ids, 3, return_logits=True)
    cb = drafter.draft_chain(changed_aux, changed_ids, 3, return_logits=True)
    assert ca.logits is not None and cb.logits is not None
    for k in range(1, 4):
        torch.testing.assert_close(ca.logits[k - 1, :, : 10 - k], cb.logits[k - 1, :, : 10 - k])


def test_batch_rows_are_independent() -> None:
    drafter = make_drafter()
    aux, ids = rand_inputs(drafter, batch=3, seq=10)
    chain = drafter.draft_chain(aux, ids, 3, return_logits=True)
    single = drafter.draft_chain(aux[1:2], ids[1:2], 3, return_logits=True)
    assert chain.logits is not None and single.logits is not None
    torch.testing.assert_close(chain.logits[:, 1:2], single.logits, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- draft chain


def test_chain_step1_is_forward_on_shifted_tokens_and_labels_align() -> None:
    drafter = make_drafter()
    aux, ids = rand_inputs(drafter, seq=10)
    chain = drafter.draft_chain(aux, ids, 3, return_logits=True)
    shifted = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], dim=1)
    step1 = drafter.forward(aux, shifted)
    assert chain.logits is not None
    torch.testing.assert_close(chain.logits[0], step1.logits)
    assert torch.equal(chain.target_ids[0], step1.target_ids)
    for k in (1, 2, 3):
        assert torch.equal(chain.labels[k - 1, :, : 10 - k - 1], ids[:, k + 1 :])
        assert (chain.labels[k - 1, :, 10 - k - 1 :] == -1).all()
    assert chain.valid.sum().item() == 2 * (8 + 7 + 6)


def test_chain_is_exact_for_any_chunk_size() -> None:
    drafter = make_drafter()
    aux, ids = rand_inputs(drafter, seq=23)
    whole = drafter.draft_chain(aux, ids, 4, return_logits=True, chunk_size=1024)
    for chunk in (1, 5, 8):
        part = drafter.draft_chain(aux, ids, 4, return_logits=True, chunk_size=chunk)
        assert whole.logits is not None and part.logits is not None
        torch.testing.assert_close(part.logits, whole.logits, atol=1e-5, rtol=1e-5)


def test_chain_ttt_attention_against_dense_reference() -> None:
    """Step 2 by hand: query t sees step-1 keys 0..t and step-2's own key at t."""
    drafter = make_drafter()
    c = drafter.config
    aux, ids = rand_inputs(drafter, batch=1, seq=9)
    chain = drafter.draft_chain(aux, ids, 2, return_logits=True)
    seq = ids.shape[1]
    tok1 = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], dim=1)
    tok2 = torch.cat([ids[:, 2:], torch.zeros_like(ids[:, :2])], dim=1)
    step1 = drafter.forward(aux, tok1)
    _, _, k1, v1 = drafter.attention_inputs(aux, tok1)
    res2, q2, k2, v2 = drafter.attention_inputs(step1.hidden, tok2, position_offset=1)
    rep = c.num_heads // c.num_kv_heads
    keys = torch.cat([k1, k2], dim=2).repeat_interleave(rep, dim=1)
    values = torch.cat([v1, v2], dim=2).repeat_interleave(rep, dim=1)
    allowed = torch.cat([torch.ones(seq, seq).tril(), torch.eye(seq)], dim=1).bool()
    scores = q2 @ keys.transpose(-1, -2) / c.head_dim**0.5
    attn = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ values
    expected = drafter.finish(res2, attn)
    assert chain.logits is not None
    torch.testing.assert_close(chain.logits[1], expected.logits, atol=1e-5, rtol=1e-5)


def greedy_rollout(drafter: Eagle3Drafter, aux: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """Tokens where x_{t+2} is the drafter's own step-1 guess, so step 1 always matches."""
    seq = aux.shape[1]
    ids = torch.zeros(aux.shape[0], seq, dtype=torch.long)
    ids[:, :2] = first
    for t in range(seq - 2):
        out = drafter.forward(aux[:, : t + 1], ids[:, 1 : t + 2])
        ids[:, t + 2] = out.target_ids[:, t]
    return ids


def test_accept_lengths_same_with_and_without_teacher_forcing() -> None:
    drafter = make_drafter()
    aux, _ = rand_inputs(drafter, batch=2, seq=14)
    ids = greedy_rollout(drafter, aux, torch.tensor([[3, 5], [7, 11]]))
    forced = drafter.draft_chain(aux, ids, 4)
    own = drafter.draft_chain(aux, ids, 4, teacher_forcing=False)
    assert forced.matches[0, :, : 14 - 2].all()  # step 1 matches by construction
    lengths = forced.accept_lengths()
    assert (lengths[:, : 14 - 2] >= 1).all()
    assert torch.equal(lengths, own.accept_lengths())
    assert torch.equal(forced.target_ids[0], own.target_ids[0])


def test_chain_rejects_bad_inputs() -> None:
    drafter = make_drafter()
    aux, ids = rand_inputs(drafter)
    with pytest.raises(UsageError, match="num_steps"):
        drafter.draft_chain(aux, ids, 0)
    with pytest.raises(UsageError, match="width"):
        drafter.draft_chain(aux[..., :H], ids, 2)
    with pytest.raises(UsageError, match="positions"):
        drafter.draft_chain(aux, ids[:, :5], 2)


# --------------------------------------------------------------------------- MLA


def make_mla_config(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["Eagle3DeepseekV2ForCausalLM"],
        "hidden_size": H,
        "num_attention_heads": 4,
        "q_lora_rank": 32,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "intermediate_size": INTER,
        "vocab_size": V,
        "draft_vocab_size": VD,
        "num_hidden_layers": 1,
        "fc_norm": True,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]},
    }
    config.update(overrides)
    return config


def test_mla_shape_check() -> None:
    config = make_mla_config()
    shapes = expected_mla_shapes(config)
    assert shapes["midlayer.self_attn.q_a_proj.weight"] == (32, 2 * H)
    assert shapes["midlayer.self_attn.kv_a_proj_with_mqa.weight"] == (16 + 8, 2 * H)
    assert shapes["midlayer.self_attn.q_b_proj.weight"] == (4 * 24, 32)
    assert shapes["midlayer.self_attn.kv_b_proj.weight"] == (4 * 32, 16)
    assert shapes["midlayer.self_attn.o_proj.weight"] == (H, 4 * 16)
    sd = {
        k: torch.zeros(s)
        for k, s in shapes.items()
        if k not in ("d2t", "t2d", "embed_tokens.weight")
    }
    sd["d2t"] = torch.zeros(VD, dtype=torch.long)
    check_mla_shapes(config, sd)
    sd["midlayer.self_attn.q_a_proj.weight"] = torch.zeros(32, H)
    sd.pop("fc_norm.2.weight")
    with pytest.raises(InvalidCheckpointError) as info:
        check_mla_shapes(config, sd)
    assert info.value.details == [
        "missing: fc_norm.2.weight",
        "wrong shape: midlayer.self_attn.q_a_proj.weight: expected [32, 128], got [32, 64]",
    ]
    with pytest.raises(InvalidCheckpointError, match="q_lora_rank"):
        check_mla_shapes(make_mla_config(q_lora_rank=None), sd)


# --------------------------------------------------------------------------- oracle


def speculators_model(config: dict[str, Any], sd: dict[str, torch.Tensor]) -> Any:
    """vLLM speculators' Eagle3DraftModel with the same weights (eager attention)."""
    from transformers import LlamaConfig

    from helpers import speculators_draft_model

    rope: dict[str, Any] = {
        "rope_theta": config["rope_theta"],
        "rope_scaling": config.get("rope_scaling"),
    }
    layer = LlamaConfig(
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_attention_heads=config["num_attention_heads"],
        num_key_value_heads=config["num_key_value_heads"],
        head_dim=config["head_dim"],
        vocab_size=config["vocab_size"],
        num_hidden_layers=1,
        rms_norm_eps=config["rms_norm_eps"],
        max_position_embeddings=config["max_position_embeddings"],
        **rope,
    )
    layer._attn_implementation = "eager"
    model = speculators_draft_model(layer, config, config["draft_vocab_size"])
    result = model.load_state_dict(
        {k.replace("midlayer.", "layers.0."): v for k, v in sd.items()}, strict=False
    )
    assert result.unexpected_keys == []
    assert sorted(result.missing_keys) == ["verifier_lm_head.weight", "verifier_norm.weight"]
    return model


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"fc_norm": True, "norm_output": True},
        {"norm_before_residual": True},
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        },
    ],
    ids=["eagle3", "eagle3.1", "norm_before_residual", "llama3-rope"],
)
def test_oracle_speculators_ttt(variant: dict[str, Any]) -> None:
    """Same weights, same inputs: every TTT step's logits equal speculators' in fp32.

    speculators (0.9.0) trains on (hidden_states[t], input_ids[t]) pairs already
    shifted (its shift_batch: drop the last state and the first token), teacher-forces
    step k with the ground-truth tokens shifted by k, and masks attention causal
    over step 1's keys plus each later step's key at the same index. speculators
    has no target_hidden_size, so T == H here.
    """
    if importlib.util.find_spec("speculators") is None:  # not installed: skip
        pytest.importorskip("speculators")
    # Installed but broken (say, openai or datasets missing): fail, do not skip.
    config = make_config(target_hidden_size=None, **variant)
    sd = make_state_dict(config, embed=True)
    oracle = speculators_model(config, sd)
    drafter = Eagle3Drafter(config, sd, dtype=torch.float32)

    gen = torch.Generator().manual_seed(3)
    seq, steps = 40, 4
    aux = torch.randn(1, seq, 3 * H, generator=gen)
    ids = torch.randint(0, V, (1, seq), generator=gen)
    captured: list[torch.Tensor] = []
    hook = oracle.lm_head.register_forward_hook(lambda _m, _i, out: captured.append(out))
    with torch.no_grad():
        draft_tokens = oracle(
            hidden_states=aux[:, :-1],
            input_ids=ids[:, 1:],
            document_ids=torch.zeros(1, seq - 1, dtype=torch.long),
            position_ids=torch.arange(seq - 1)[None],
            ttt_steps=steps,
        )
    hook.remove()

    chain = drafter.draft_chain(aux, ids, steps, return_logits=True, chunk_size=16)
    assert chain.logits is not None and len(captured) == steps
    for k in range(steps):
        torch.testing.assert_close(chain.logits[k, :, : seq - 1], captured[k], atol=1e-4, rtol=1e-4)
        oracle_targets = draft_tokens[k] + oracle.d2t[draft_tokens[k]]
        assert torch.equal(chain.target_ids[k, :, : seq - 1], oracle_targets)


def test_plain_drafter_does_not_import_transformers():
    """transformers costs seconds of start-up (12.7 s cold on the H200 box): a plain
    silu + default-RoPE drafter must load and run without it."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from eagle3conv.example import Dims, canonical_tensors, llama_config\n"
        "from eagle3conv.model.drafter import smoke_test\n"
        "d = Dims(hidden=32, target_hidden=32, heads=4, kv_heads=2, head_dim=8, intermediate=64, vocab=1024, draft_vocab=320)\n"
        "r = smoke_test(llama_config(d), canonical_tensors(d))\n"
        "assert r.ok, r.problems\n"
        "print('transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_shape_matches_is_the_one_reading_of_a_rows_shape() -> None:
    """mask_hidden (canonical.json any_view) in another shape of k*T elements fits, a wrong size does
    not; the planner and the loader both ask spec.canonical.shape_matches (test_formats_2026's
    any_view test runs both on a real checkpoint)."""
    from eagle3conv.spec.canonical import load_canonical, shape_matches

    row = next(t for t in load_canonical()["llama"].tensors if t.name == "mask_hidden")
    assert shape_matches(row, (1, 1, 12), {"k": 3, "T": 4}) and shape_matches(row, (12,), {"k": 3, "T": 4})
    assert not shape_matches(row, (1, 13), {"k": 3, "T": 4})
    assert shape_matches(row, (5,), {"k": 3})  # a size the config leaves unknown matches any
    fc = next(t for t in load_canonical()["llama"].tensors if t.name == "fc.weight")
    assert not shape_matches(fc, (12, 2), {"H": 2, "k": 3, "T": 4})  # no any_view: the dims, in order
