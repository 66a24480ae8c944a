"""Tests for eagle3conv.model.mla: the MLA drafter forward, pinned to transformers.

The oracle is transformers 5.24's DeepSeek-V3 attention
(``models/deepseek_v3/modeling_deepseek_v3.py``: ``DeepseekV3Attention``,
``DeepseekV3MLP``, ``DeepseekV3RMSNorm``, ``DeepseekV3RotaryEmbedding``), an
implementation written independently of eagle3conv's, adapted to the EAGLE-3
drafter as docs/facts.md §10 describes: q_a/kv_a (or q_proj) read 2H features,
the latent norms use ``rms_norm_eps``, one key/value head per query head, an
explicit additive mask for eager attention. Steps 2+ run the same attention over
the concatenated keys of every step so far (transformers' latent cache) with
EAGLE-3's training-time-test mask.

Pico sizes: H 64, 4 heads, q_lora 32, kv_lora 16, nope 16, rope 8, v 16, I 128,
V 256, Vd 96.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from eagle3conv.errors import InvalidCheckpointError
from eagle3conv.model import build_drafter, drafter_class
from eagle3conv.model.drafter import Eagle3Drafter, smoke_test
from eagle3conv.spec.engines import Run
from eagle3conv.model.mla import (
    Eagle3MLADrafter,
    MLAConfig,
    expected_mla_tensors,
    mla_rope,
    yarn_get_mscale,
)

H, NH, QL, KL, NOPE, ROPE, VH, INTER, V, VD = 64, 4, 32, 16, 16, 8, 16, 128, 256, 96
A = "midlayer.self_attn."

KIMI_YARN = {  # Kimi-K2.5's rope scaling (TorchSpec kimi_k25_eagle3_mla.json)
    "type": "yarn",
    "factor": 64.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 1.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}


def make_config(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["Eagle3DeepseekV2ForCausalLM"],
        "model_type": "kimi_k2",
        "hidden_size": H,
        "num_attention_heads": NH,
        "q_lora_rank": QL,
        "kv_lora_rank": KL,
        "qk_nope_head_dim": NOPE,
        "qk_rope_head_dim": ROPE,
        "v_head_dim": VH,
        "intermediate_size": INTER,
        "vocab_size": V,
        "draft_vocab_size": VD,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "rope_theta": 50000.0,
        "rope_scaling": dict(KIMI_YARN),
        "max_position_embeddings": 262144,
        "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57]},
    }
    config.update(overrides)
    return config


def make_state_dict(config: dict[str, Any], *, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights of the right shapes (norm weights near 1), a sorted random draft vocab."""
    gen = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {}
    for key, shape in expected_mla_tensors(MLAConfig.from_config(config)).items():
        if key in ("d2t", "t2d"):
            continue
        if len(shape) == 1:
            sd[key] = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:
            sd[key] = torch.randn(shape, generator=gen) / shape[1] ** 0.5
    vocab, draft_vocab = config["vocab_size"], config["draft_vocab_size"]
    targets = torch.randperm(vocab, generator=gen)[:draft_vocab].sort().values
    sd["d2t"] = targets - torch.arange(draft_vocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[targets] = True
    sd["t2d"] = t2d
    return sd


# --------------------------------------------------------------------------- oracle


class Oracle:
    """The drafter rebuilt from transformers' DeepSeek-V3 modules, fp32, eager attention."""

    def __init__(self, config: dict[str, Any], sd: dict[str, torch.Tensor]) -> None:
        from transformers import DeepseekV3Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
            DeepseekV3Attention,
            DeepseekV3MLP,
            DeepseekV3RMSNorm,
            DeepseekV3RotaryEmbedding,
        )

        eps = config["rms_norm_eps"]
        scaling = config.get("rope_scaling")
        rope = {"rope_type": "default", "rope_theta": config["rope_theta"]}
        if scaling:
            rope = {k: v for k, v in scaling.items() if k != "type"}
            rope.update(rope_type="yarn", rope_theta=config["rope_theta"])
        ds = DeepseekV3Config(
            hidden_size=H,
            intermediate_size=INTER,
            num_attention_heads=NH,
            num_key_value_heads=NH,  # MLA: keys and values expanded per head
            q_lora_rank=config["q_lora_rank"],
            kv_lora_rank=KL,
            qk_nope_head_dim=NOPE,
            qk_rope_head_dim=ROPE,
            v_head_dim=VH,
            rms_norm_eps=eps,
            hidden_act="silu",
            max_position_embeddings=config["max_position_embeddings"],
            rope_interleave=config.get("rope_interleave", True),
            rope_parameters=rope,
            attention_bias=False,
        )
        ds._attn_implementation = "eager"
        attn = DeepseekV3Attention(ds, layer_idx=0)
        # EAGLE-3: the first projections read cat(embedding, hidden), 2H wide.
        if config["q_lora_rank"] is None:
            attn.q_proj = torch.nn.Linear(2 * H, NH * (NOPE + ROPE), bias=False)
        else:
            attn.q_a_proj = torch.nn.Linear(2 * H, config["q_lora_rank"], bias=False)
            attn.q_a_layernorm.variance_epsilon = eps  # hard-coded 1e-6 in transformers
        attn.kv_a_proj_with_mqa = torch.nn.Linear(2 * H, KL + ROPE, bias=False)
        attn.kv_a_layernorm.variance_epsilon = eps
        self.attn = attn.eval()
        self.rotary = DeepseekV3RotaryEmbedding(ds)
        self.mlp = DeepseekV3MLP(ds).eval()
        self.norms = {
            name: DeepseekV3RMSNorm(H, eps=eps)
            for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm", "norm")
        }
        with torch.no_grad():
            for key, value in sd.items():
                if key.startswith(A):
                    getattr(self.attn, key[len(A) : -len(".weight")]).weight.copy_(value)
                elif key.startswith("midlayer.mlp."):
                    getattr(self.mlp, key.split(".")[2]).weight.copy_(value)
            for name, norm in self.norms.items():
                prefix = "" if name == "norm" else "midlayer."
                norm.weight.copy_(sd[f"{prefix}{name}.weight"])
        self.sd = sd
        self.config = config

    def project_aux(self, aux: torch.Tensor) -> torch.Tensor:
        if self.config.get("fc_norm"):
            from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm

            chunks = []
            for i, chunk in enumerate(aux.chunk(3, dim=-1)):
                norm = DeepseekV3RMSNorm(chunk.shape[-1], eps=self.config["rms_norm_eps"])
                norm.weight.data.copy_(self.sd[f"fc_norm.{i}.weight"])
                chunks.append(norm(chunk))
            aux = torch.cat(chunks, dim=-1)
        return F.linear(aux, self.sd["fc.weight"])

    @torch.no_grad()
    def chain(
        self, aux: torch.Tensor, tokens: list[torch.Tensor], steps: int
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Logits and next-step states of ``steps`` TTT steps; step k reads tokens[k-1]
        at positions k-1 .. k-1+S-1, keys of all steps so far, TTT mask."""
        from transformers import DynamicCache

        s = aux.shape[1]
        cache = DynamicCache()
        state = self.project_aux(aux)
        logits, states = [], []
        for k in range(steps):
            # query t sees step 1's keys 0..t and its own chain's keys of steps 2..k+1
            allowed = torch.cat(
                [torch.ones(s, s, dtype=torch.bool).tril()]
                + [torch.eye(s, dtype=torch.bool)] * k,
                dim=1,
            )
            step_logits, state = self.step(state, tokens[k], k, allowed, cache)
            logits.append(step_logits)
            states.append(state)
        return logits, states

    @torch.no_grad()
    def step(
        self,
        state: torch.Tensor,
        tokens: torch.Tensor,
        offset: int,
        allowed: torch.Tensor | None = None,
        cache: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer pass over an H-wide state; plain causal attention by default."""
        b, s, _ = state.shape
        if allowed is None:
            allowed = torch.ones(s, s, dtype=torch.bool).tril()
        embeds = F.embedding(tokens, self.sd["embed_tokens.weight"])
        x = torch.cat(
            (self.norms["input_layernorm"](embeds), self.norms["hidden_norm"](state)), dim=-1
        )
        cos, sin = self.rotary(x, torch.arange(offset, offset + s)[None].expand(b, s))
        mask = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[None, None]
        out, _ = self.attn(x, (cos, sin), mask, cache=cache)
        h = state + out  # residual: the un-normed state
        h = h + self.mlp(self.norms["post_attention_layernorm"](h))
        normed = self.norms["norm"](h)
        logits = F.linear(normed, self.sd["lm_head.weight"])
        return logits, normed if self.config.get("norm_output") else h


VARIANTS = {
    "kimi-yarn": {},
    "default-rope": {"rope_scaling": None},
    "yarn-defaults": {
        "rope_scaling": {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096},
        "max_position_embeddings": 40 * 4096,
    },
    "deepseek-v3-yarn": {
        "rope_theta": 10000.0,
        "max_position_embeddings": 40 * 4096,
        "rope_scaling": {
            "type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    },
    "not-interleaved": {"rope_interleave": False},
    "eagle3.1": {"fc_norm": True, "norm_output": True},
    # a large eps makes every norm's eps visible (the latent norms' included)
    "large-eps": {"rms_norm_eps": 0.5},
    "no-q-lora": {"q_lora_rank": None},
}


def shifted(ids: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.zeros_like(ids)
    out[:, : ids.shape[1] - n] = ids[:, n:]
    return out


@pytest.mark.parametrize("variant", list(VARIANTS.values()), ids=list(VARIANTS))
def test_oracle_transformers_deepseek_v3(variant: dict[str, Any]) -> None:
    """Same weights, same inputs: logits and next-step states of steps 1-3 (steps 2+
    with TTT attention) equal transformers' DeepSeek-V3 attention in fp32 on CPU."""
    config = make_config(**variant)
    sd = make_state_dict(config)
    drafter = Eagle3MLADrafter(config, sd, dtype=torch.float32)
    oracle = Oracle(config, sd)

    gen = torch.Generator().manual_seed(1)
    batch, seq, steps = 2, 24, 3
    aux = torch.randn(batch, seq, 3 * H, generator=gen)
    ids = torch.randint(0, V, (batch, seq), generator=gen)
    tokens = [shifted(ids, k + 1) for k in range(steps)]
    want_logits, want_states = oracle.chain(aux, tokens, steps)

    chain = drafter.draft_chain(aux, ids, steps, return_logits=True, chunk_size=7)
    assert chain.logits is not None
    for k in range(steps):
        torch.testing.assert_close(chain.logits[k], want_logits[k], atol=1e-5, rtol=1e-5)
        want_ids = want_logits[k].argmax(-1)
        assert torch.equal(chain.target_ids[k], want_ids + sd["d2t"][want_ids])

    # next-step states: step 1 through forward() (plain causal = step 1 of the chain),
    # step 2 through the chain's own pieces (TTT attention over both steps' keys)
    out1 = drafter.forward(aux, tokens[0])
    torch.testing.assert_close(out1.logits, want_logits[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out1.hidden, want_states[0], atol=1e-5, rtol=1e-5)
    with torch.inference_mode():
        _, _, k1, v1 = drafter.attention_inputs(aux, tokens[0])
        residual, q2, k2, v2 = drafter.attention_inputs(out1.hidden, tokens[1], position_offset=1)
        out2 = drafter.finish(residual, drafter.ttt_attention(q2, [k1, k2], [v1, v2], 5))
    torch.testing.assert_close(out2.hidden, want_states[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out2.logits, want_logits[1], atol=1e-5, rtol=1e-5)

    # forward() on an H-wide state skips fc (SGLang's width test) and is plain causal
    plain = drafter.forward(out1.hidden, tokens[1], position_offset=1)
    want_plain_logits, want_plain_state = oracle.step(want_states[0], tokens[1], 1)
    torch.testing.assert_close(plain.logits, want_plain_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(plain.hidden, want_plain_state, atol=1e-5, rtol=1e-5)


def test_oracle_is_sensitive_to_the_rope_layout() -> None:
    """The oracle comparison can fail: the same weights run with the other RoPE layout
    (what a neox/interleaved training mismatch does) give different logits."""
    config = make_config()
    sd = make_state_dict(config)
    oracle = Oracle(make_config(rope_interleave=False), sd)
    drafter = Eagle3MLADrafter(config, sd, dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    aux = torch.randn(1, 16, 3 * H, generator=gen)
    ids = torch.randint(0, V, (1, 16), generator=gen)
    want, _ = oracle.chain(aux, [shifted(ids, 1)], 1)
    got = drafter.forward(aux, shifted(ids, 1)).logits
    assert (got - want[0]).abs().max() > 1e-3


# --------------------------------------------------------------------------- numbers


def test_kimi_softmax_scale_and_yarn_by_hand() -> None:
    """Kimi-K2.5's MLA drafter: qk_head_dim = 128 + 64 = 192, yarn factor 64,
    mscale = mscale_all_dim = 1, beta_fast = beta_slow = 1, rope_theta 50000,
    original_max_position_embeddings 4096, 64 rope dims."""
    kimi = make_config(
        hidden_size=7168,
        intermediate_size=18432,
        num_attention_heads=64,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        vocab_size=163840,
        draft_vocab_size=163840,
    )
    rope = mla_rope(kimi, MLAConfig.from_config(kimi))

    # softmax scale = 192^-0.5 * mscale^2, mscale = 0.1 * 1 * ln(64) + 1
    ln64 = 4.1588830833596715  # ln 64 = 6 ln 2 = 6 * 0.6931471805599453
    mscale = 0.1 * ln64 + 1  # 1.4158883083359672
    assert yarn_get_mscale(64.0, 1.0) == pytest.approx(mscale, abs=1e-15)
    # 192^-0.5 = 0.07216878364870322; mscale^2 = 2.0047396...; product 0.144680...
    assert rope.softmax_scale == pytest.approx(0.07216878364870322 * mscale**2, rel=1e-12)
    assert rope.softmax_scale == pytest.approx(0.144680, abs=5e-7)
    assert rope.softmax_scale / 192**-0.5 == pytest.approx(2.00474, abs=1e-5)  # ~2x plain

    # cos/sin factor = mscale(64, mscale=1) / mscale(64, mscale_all_dim=1) * attn_factor = 1
    assert rope.cos_sin_scale == 1.0

    # correction dim for 1 rotation: 64 * ln(4096 / (2 pi)) / (2 ln 50000)
    #   = 64 * 6.47989 / 21.63956 = 19.165 -> low = floor = 19, high = ceil = 20.
    cd = 64 * math.log(4096 / (2 * math.pi)) / (2 * math.log(50000))
    assert cd == pytest.approx(19.165, abs=1e-3)
    # ramp over the 32 frequencies: 0 up to index 19, 1 from index 20, so the first
    # 20 frequencies keep theta^(-2i/64) and the last 12 are divided by the factor 64.
    plain = 1.0 / 50000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    want = torch.cat((plain[:20], plain[20:] / 64)).float()
    torch.testing.assert_close(rope.inv_freq, want, rtol=1e-6, atol=0)


def test_default_rope_keeps_the_plain_scale() -> None:
    config = make_config(rope_scaling=None)
    rope = mla_rope(config, MLAConfig.from_config(config))
    assert rope.rope_type == "default"
    assert rope.softmax_scale == (NOPE + ROPE) ** -0.5
    assert rope.cos_sin_scale == 1.0
    torch.testing.assert_close(
        rope.inv_freq, 1.0 / 50000.0 ** (torch.arange(0, ROPE, 2).float() / ROPE)
    )


def test_yarn_without_mscale_all_dim_keeps_the_plain_softmax_scale() -> None:
    """mscale_all_dim absent (SGLang: 0): softmax scale unchanged, cos/sin x (0.1 ln f + 1)."""
    config = make_config(
        rope_scaling={"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096}
    )
    rope = mla_rope(config, MLAConfig.from_config(config))
    assert rope.softmax_scale == (NOPE + ROPE) ** -0.5
    assert rope.cos_sin_scale == pytest.approx(0.1 * math.log(40.0) + 1)


@pytest.mark.parametrize(
    ("scaling", "expected"),
    [
        ({"rope_type": "linear", "factor": 2.0}, "not supported for MLA"),
        ({"type": "yarn", "original_max_position_embeddings": 4096}, "'factor'"),
        ({"type": "yarn", "factor": 4.0}, "'original_max_position_embeddings'"),
    ],
)
def test_unusable_rope_scaling_is_refused(scaling: dict[str, Any], expected: str) -> None:
    config = make_config(rope_scaling=scaling)
    with pytest.raises(InvalidCheckpointError, match=expected) as info:
        Eagle3MLADrafter(config, make_state_dict(make_config()), dtype=torch.float32)
    assert info.value.exit_code == 3


# --------------------------------------------------------------------------- loading


def test_expected_tensors_come_from_the_canonical_table() -> None:
    shapes = expected_mla_tensors(MLAConfig.from_config(make_config()))
    assert shapes[f"{A}q_a_proj.weight"] == (QL, 2 * H)
    assert shapes[f"{A}q_b_proj.weight"] == (NH * (NOPE + ROPE), QL)
    assert shapes[f"{A}kv_a_proj_with_mqa.weight"] == (KL + ROPE, 2 * H)
    assert shapes[f"{A}kv_b_proj.weight"] == (NH * (NOPE + VH), KL)
    assert shapes[f"{A}o_proj.weight"] == (H, NH * VH)
    assert shapes["fc.weight"] == (H, 3 * H)
    assert f"{A}q_proj.weight" not in shapes
    assert "fc.bias" not in shapes and not any(k.startswith("fc_norm") for k in shapes)
    no_lora = expected_mla_tensors(MLAConfig.from_config(make_config(q_lora_rank=None)))
    assert no_lora[f"{A}q_proj.weight"] == (NH * (NOPE + ROPE), 2 * H)
    assert not any("q_a_" in k or "q_b_" in k for k in no_lora)
    with_norm = expected_mla_tensors(MLAConfig.from_config(make_config(fc_norm=True, bias=True)))
    assert with_norm["fc.bias"] == (H,)
    fc_norms = [k for k in with_norm if k.startswith("fc_norm")]
    assert fc_norms == [f"fc_norm.{i}.weight" for i in range(3)]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda sd: sd.pop(f"{A}kv_b_proj.weight"), [f"missing: {A}kv_b_proj.weight"]),
        (
            lambda sd: sd.__setitem__(f"{A}kv_a_proj_with_mqa.weight", torch.zeros(KL, 2 * H)),
            [f"wrong shape: {A}kv_a_proj_with_mqa.weight: expected [24, 128], got [16, 128]"],
        ),
        (
            lambda sd: sd.__setitem__(f"{A}q_a_proj.weight", torch.zeros(QL, H)),
            [f"wrong shape: {A}q_a_proj.weight: expected [32, 128], got [32, 64]"],
        ),
        (
            lambda sd: sd.__setitem__(f"{A}q_proj.weight", torch.zeros(NH * 24, 2 * H)),
            [f"unexpected: {A}q_proj.weight"],
        ),
        (lambda sd: sd.pop("d2t"), ["missing: d2t"]),
    ],
    ids=["missing-kv_b_proj", "kv_a-shape", "q_a-1H-wide", "q_proj-with-q_lora", "missing-d2t"],
)
def test_strict_load_names_offending_key(mutate: Any, expected: list[str]) -> None:
    config = make_config()
    sd = make_state_dict(config)
    mutate(sd)
    with pytest.raises(InvalidCheckpointError) as info:
        Eagle3MLADrafter(config, sd, dtype=torch.float32)
    assert info.value.details == expected
    assert info.value.exit_code == 3
    assert "MLA drafter checkpoint" in info.value.message


def test_prefused_qkv_a_is_refused_with_a_split_hint() -> None:
    """SGLang caches a pre-fused fused_qkv_a_proj_with_mqa and then drops it; say how to split."""
    config = make_config()
    sd = make_state_dict(config)
    fused = torch.cat((sd.pop(f"{A}q_a_proj.weight"), sd.pop(f"{A}kv_a_proj_with_mqa.weight")))
    sd[f"{A}fused_qkv_a_proj_with_mqa.weight"] = fused
    with pytest.raises(InvalidCheckpointError) as info:
        Eagle3MLADrafter(config, sd, dtype=torch.float32)
    assert info.value.details == [
        f"missing: {A}kv_a_proj_with_mqa.weight",
        f"missing: {A}q_a_proj.weight",
        f"unexpected: {A}fused_qkv_a_proj_with_mqa.weight",
    ]
    assert "drops it" in info.value.message
    assert info.value.hint is not None
    assert "first 32" in info.value.hint and "remaining 24" in info.value.hint


def test_no_q_lora_loads_but_notes_that_sglang_refuses_it() -> None:
    config = make_config(q_lora_rank=None)
    drafter = build_drafter(config, make_state_dict(config), dtype=torch.float32)
    assert isinstance(drafter, Eagle3MLADrafter)
    assert drafter.q_proj is not None and drafter.q_a_proj is None
    assert any("SGLang refuses" in n for n in drafter.engine_notes)
    result = smoke_test(config, make_state_dict(config))
    assert result.ok, result.problems
    assert any("q_lora_rank" in n for n in result.engine_notes)
    # with q_lora_rank set there is nothing to note
    assert Eagle3MLADrafter(make_config(), make_state_dict(make_config())).engine_notes == []


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"rope_interleave": False}, "vLLM ignores the flag"),
        ({"norm_before_residual": True}, "SGLang's MLA layer ignores it"),
    ],
)
def test_engine_notes_name_what_one_engine_ignores(overrides: dict, expected: str) -> None:
    config = make_config(**overrides)
    drafter = Eagle3MLADrafter(config, make_state_dict(config), run=Run(norm_before_residual=False))
    assert len(drafter.engine_notes) == 1 and expected in drafter.engine_notes[0]


def test_build_drafter_picks_the_class_by_architecture() -> None:
    config = make_config()
    assert drafter_class(config) is Eagle3MLADrafter
    v3 = make_config(architectures=["Eagle3DeepseekV3ForCausalLM"])
    assert drafter_class(v3) is Eagle3MLADrafter
    assert drafter_class({"architectures": ["LlamaForCausalLMEagle3"]}) is Eagle3Drafter
    drafter = build_drafter(config, make_state_dict(config), dtype=torch.float32)
    assert type(drafter) is Eagle3MLADrafter
    assert drafter.config.head_dim == NOPE + ROPE and drafter.config.num_kv_heads == NH


def test_smoke_test_runs_mla() -> None:
    config = make_config(fc_norm=True, norm_output=True)
    sd = make_state_dict(config)
    del sd["embed_tokens.weight"]
    result = smoke_test(config, sd)
    assert result.ok, result.problems
    assert (result.step1_input_width, result.step2_input_width, result.logits_width) == (
        3 * H,
        H,
        VD,
    )
    assert result.embedding_source == "random" and result.engine_notes == ()
    sd.pop(f"{A}kv_b_proj.weight")
    with pytest.raises(InvalidCheckpointError, match="kv_b_proj"):
        smoke_test(config, sd)


def test_norm_before_fc_is_refused() -> None:
    with pytest.raises(InvalidCheckpointError, match="norm_before_fc"):
        Eagle3MLADrafter(make_config(norm_before_fc=True), make_state_dict(make_config()))
