"""The drafters of 2026 (issue 22), pinned to implementations written independently of eagle3conv's.

What each forward is compared with (all fp32 on CPU, ``atol = rtol = 1e-5``, :data:`TOL`):

* **Multi-layer Llama drafters** (2 and 3 layers): :class:`Reference`, the drafter rebuilt from
  transformers 5.24's own modules. Layer 0 as speculators' EAGLE-3 first layer computes it (the
  oracle of tests/test_drafter.py): a ``LlamaDecoderLayer`` whose q/k/v read ``2H``, the state
  split off as the residual, ``cat(input_layernorm(embed), hidden_norm(g))`` into its attention.
  Every later layer is transformers' ``LlamaDecoderLayer`` itself, fed the previous layer's
  output, its input norm loaded from ``layers.i.input_layernorm`` (vLLM 0.33.0) or
  ``layers.i.hidden_norm`` (SGLang 0.5.23). Steps 2+ run transformers' eager attention over a
  ``DynamicCache`` (one per layer, as transformers keeps it) with EAGLE-3's training-time-test
  mask, and, for a small case, attention written out query by query (:meth:`Reference.explicit_chain`).
* **Qwen3 drafters** (``Eagle3Qwen3ForCausalLM``): the same reference built from
  ``Qwen3DecoderLayer`` / ``Qwen3Attention``; layer 0's queries and keys by hand with
  ``Qwen3RMSNorm`` per head before RoPE; the default RoPE theta as transformers' ``Qwen3Config``
  sets it (which is what vLLM 0.33.0 receives, see :func:`test_qwen3_rope_theta_default_is_what_vllm_receives`).
* **norm_before_fc and k = 5**: the RMSNorm formula written out, in vLLM's
  ``combine_hidden_states`` order.
* **P-EAGLE**: vLLM 0.33.0's proposer layout (``copy_and_expand_eagle_inputs``) built by hand for
  every chain start and run through :class:`Reference` with plain causal attention, one pass.
* **2-layer MLA drafters**: layer 0 by tests/test_mla.py's oracle (transformers' DeepSeek-V3
  attention with ``2H`` inputs), layer 1 by transformers' ``DeepseekV3DecoderLayer`` (input ``H``).
* **Switches an engine ignores** (``without``): the drafter with those tensors taken out, and the
  computation written out.
* **speculators 0.9.0** (vLLM's trainer; skipped when not installed, as in tests/test_drafter.py):
  its ``Eagle3DraftModel`` with 2 or 3 layers, a Qwen3 first layer, norm_before_fc and k = 5.

Pico sizes: H 64, T 48 (so fc is ``[64, k*48]``), 4 heads, 2 kv heads, head_dim 16, I 128, V 256, Vd 96.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from eagle3conv.errors import UsageError
from eagle3conv.model.drafter import Eagle3Drafter, expected_shapes
from eagle3conv.model.mla import Eagle3MLADrafter
from eagle3conv.spec.engines import Run

H, T, NH, NKV, HD, INTER, V, VD = 64, 48, 4, 2, 16, 128, 256, 96
TOL = {"atol": 1e-5, "rtol": 1e-5}
QWEN3 = ("Eagle3Qwen3ForCausalLM", "PeagleQwen3ForCausalLM")
MASK_TOKEN = 5


def make_config(layers: int = 1, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": H,
        "target_hidden_size": T,
        "num_attention_heads": NH,
        "num_key_value_heads": NKV,
        "head_dim": HD,
        "intermediate_size": INTER,
        "vocab_size": V,
        "draft_vocab_size": VD,
        "num_hidden_layers": layers,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
    }
    config.update(overrides)
    return config


def qwen3_config(layers: int = 2, **overrides: Any) -> dict[str, Any]:
    return make_config(layers, **{"architectures": ["Eagle3Qwen3ForCausalLM"], "model_type": "qwen3",
                                  "rope_theta": 1e6, **overrides})


def make_state_dict(config: dict[str, Any], *, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights of every shape canonical.json gives the config (norms near 1, biases near 0),
    the checkpoint's own embedding, a sorted random draft vocab for d2t/t2d."""
    gen = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {}
    for key, shape in expected_shapes(config).items():
        if key in ("d2t", "t2d"):
            continue
        if key.endswith("o_proj.bias"):  # o_proj's bias (attention_bias): what fix-keys writes for a drafter
            sd[key] = torch.zeros(shape)  # trained without one; tests/test_contract.py pins a non-zero one
        elif key.endswith(".bias"):
            sd[key] = 0.1 * torch.randn(shape, generator=gen)
        elif key == "mask_hidden":
            sd[key] = torch.randn(shape, generator=gen)
        elif len(shape) == 1:
            sd[key] = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:
            sd[key] = torch.randn(shape, generator=gen) / shape[1] ** 0.5
    vocab, draft = config["vocab_size"], config["draft_vocab_size"]
    targets = torch.randperm(vocab, generator=gen)[:draft].sort().values
    sd["d2t"] = targets - torch.arange(draft)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[targets] = True
    sd["t2d"] = t2d
    return sd


def drafter(config: dict[str, Any], sd: dict[str, torch.Tensor], **run: Any) -> Eagle3Drafter:
    """The drafter run as ``run`` (:class:`Run`'s fields) says."""
    if "without" in run:
        run["without"] = frozenset(run["without"])
    return Eagle3Drafter(config, sd, dtype=torch.float32, run=Run(**run))


def inputs(width: int, batch: int = 2, seq: int = 12, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, width, generator=gen), torch.randint(0, V, (batch, seq), generator=gen)


def shifted(ids: torch.Tensor, n: int) -> torch.Tensor:
    """x_{t+n} at index t, 0 past the end (the tokens draft step n reads)."""
    out = torch.zeros_like(ids)
    out[:, : max(ids.shape[1] - n, 0)] = ids[:, n:]
    return out


def ttt_mask(seq: int, step: int) -> torch.Tensor:
    """[S, (step+1)*S] bool: step ``step+1``'s query at t sees step 1's keys 0..t and each later
    step's key at t (keys ordered step by step, as a DynamicCache appends them)."""
    eye = torch.eye(seq, dtype=torch.bool)
    return torch.cat([torch.ones(seq, seq, dtype=torch.bool).tril()] + [eye] * step, dim=1)


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm written out: x / sqrt(mean(x^2) + eps) * weight."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, **TOL)


# --------------------------------------------------------------------------- the reference


class Reference:
    """A Llama or Qwen3 EAGLE-3 drafter rebuilt from transformers 5.24's modules, fp32, eager attention.

    ``later_norm`` is the tensor loaded into each later layer's ``input_layernorm``:
    ``"input_layernorm"`` as vLLM 0.33.0 serves it, ``"hidden_norm"`` as SGLang 0.5.23 does.
    """

    def __init__(self, config: dict[str, Any], sd: dict[str, torch.Tensor], *,
                 later_norm: str = "hidden_norm", without: tuple[str, ...] = ()) -> None:
        from transformers import LlamaConfig, Qwen3Config
        from transformers.models.llama import modeling_llama as llama
        from transformers.models.qwen3 import modeling_qwen3 as qwen3

        self.qwen3 = any(a in QWEN3 for a in config["architectures"])
        self.config, self.sd = config, sd
        self.eps = config["rms_norm_eps"]
        self.k = config.get("num_aux_hidden_states") or len(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
        self.norm_output = bool(config.get("norm_output")) and "norm_output" not in without
        self.norm_before_residual = bool(config.get("norm_before_residual"))
        bias = bool(config.get("attention_bias")) and "attention_bias" not in without
        layers = config.get("num_hidden_layers", 1)
        rope: dict[str, Any] = {"rope_theta": config["rope_theta"]} if config.get("rope_theta") is not None else {}
        if config.get("rope_scaling"):
            rope["rope_scaling"] = dict(config["rope_scaling"])  # the old spelling, as drafter configs have it
        cfg = (Qwen3Config if self.qwen3 else LlamaConfig)(
            hidden_size=H, intermediate_size=INTER, num_attention_heads=NH, num_key_value_heads=NKV,
            head_dim=HD, num_hidden_layers=layers, rms_norm_eps=self.eps, hidden_act="silu",
            max_position_embeddings=2048, attention_bias=bias, **rope,
        )
        cfg._attn_implementation = "eager"
        self.cfg = cfg
        decoder = qwen3.Qwen3DecoderLayer if self.qwen3 else llama.LlamaDecoderLayer
        norm = qwen3.Qwen3RMSNorm if self.qwen3 else llama.LlamaRMSNorm
        rotary = qwen3.Qwen3RotaryEmbedding if self.qwen3 else llama.LlamaRotaryEmbedding
        self.layers = [decoder(cfg, i).eval() for i in range(layers)]
        first = self.layers[0].self_attn  # layer 0 reads cat(embed, hidden), 2H wide
        for name, rows in (("q", NH * HD), ("k", NKV * HD), ("v", NKV * HD)):
            setattr(first, f"{name}_proj", torch.nn.Linear(2 * H, rows, bias=bias))
        self.rotary = rotary(cfg)
        self.hidden_norm = norm(H, eps=self.eps)
        self.norm = norm(H, eps=self.eps)
        with torch.no_grad():
            for i, layer in enumerate(self.layers):
                p = "midlayer." if i == 0 else f"layers.{i}."
                # o_proj's bias: both engines build it under attention_bias or bias (canonical.json's o_bias),
                # whatever they do with q/k/v's; vLLM's Qwen3 drafter never does
                layer.self_attn.o_proj = torch.nn.Linear(NH * HD, H, bias=p + "self_attn.o_proj.bias" in sd)
                weights = {n: sd[p + n] for n in layer.state_dict() if p + n in sd}
                weights["input_layernorm.weight"] = sd[p + ("input_layernorm" if i == 0 else later_norm) + ".weight"]
                layer.load_state_dict(weights, strict=True)
            self.hidden_norm.weight.copy_(sd["midlayer.hidden_norm.weight"])
            self.norm.weight.copy_(sd["norm.weight"])
        self.input_norm = self.fc_norms = None
        if config.get("norm_before_fc") and "norm_before_fc" not in without:
            self.input_norm = norm(self.k * T, eps=self.eps)
            self.input_norm.weight.data.copy_(sd["input_norm.weight"])
        if config.get("fc_norm") and "fc_norm" not in without:
            self.fc_norms = [norm(T, eps=self.eps) for _ in range(self.k)]
            for i, n in enumerate(self.fc_norms):
                n.weight.data.copy_(sd[f"fc_norm.{i}.weight"])

    @torch.no_grad()
    def project_aux(self, aux: torch.Tensor) -> torch.Tensor:
        """vLLM's combine_hidden_states: input_norm over the concatenation, per-chunk fc_norm, fc."""
        if self.input_norm is not None:
            aux = self.input_norm(aux)
        if self.fc_norms is not None:
            aux = torch.cat([n(c) for n, c in zip(self.fc_norms, aux.chunk(self.k, -1), strict=True)], -1)
        return F.linear(aux, self.sd["fc.weight"], self.sd.get("fc.bias"))

    def _first_layer_input(self, state: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """speculators' Eagle3FirstLayerMixin: the residual is the state (its hidden_norm with
        norm_before_residual), the attention reads cat(input_layernorm(embed), hidden_norm(state))."""
        embeds = F.embedding(tokens, self.sd["embed_tokens.weight"])
        hidden = self.hidden_norm(state)
        residual = hidden if self.norm_before_residual else state
        return residual, torch.cat([self.layers[0].input_layernorm(embeds), hidden], dim=-1)

    def _head(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        normed = self.norm(h)
        return F.linear(normed, self.sd["lm_head.weight"]), normed if self.norm_output else h

    @torch.no_grad()
    def step(self, state: torch.Tensor, tokens: torch.Tensor, offset: int = 0,
             allowed: torch.Tensor | None = None, cache: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step over an H-wide state: logits and the next step's state. Plain causal
        attention unless ``allowed`` (bool, queries x cached keys) says otherwise."""
        b, s, _ = state.shape
        if allowed is None:
            allowed = torch.ones(s, s, dtype=torch.bool).tril()
        mask = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[None, None]
        positions = torch.arange(offset, offset + s)[None].expand(b, s)
        cos_sin = self.rotary(state, positions)
        residual, x = self._first_layer_input(state, tokens)
        first = self.layers[0]
        out, _ = first.self_attn(x, cos_sin, mask, cache=cache)
        h = residual + out
        h = h + first.mlp(first.post_attention_layernorm(h))
        for layer in self.layers[1:]:  # transformers' own decoder layer, fed the previous layer's output
            h = layer(h, attention_mask=mask, position_embeddings=cos_sin, cache=cache)
        return self._head(h)

    @torch.no_grad()
    def chain(self, aux: torch.Tensor, ids: torch.Tensor, steps: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Teacher-forced TTT steps: step k reads x_{t+k} at position t+k-1 and attends over a
        DynamicCache (each layer's own keys) with :func:`ttt_mask`."""
        from transformers import DynamicCache

        cache, state = DynamicCache(), self.project_aux(aux)
        logits, states = [], []
        for k in range(steps):
            step_logits, state = self.step(state, shifted(ids, k + 1), k, ttt_mask(ids.shape[1], k), cache)
            logits.append(step_logits)
            states.append(state)
        return logits, states

    @torch.no_grad()
    def explicit_chain(self, aux: torch.Tensor, ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """The same chain with every layer's attention written out query by query: step k's
        query at t reads exactly step 1's keys at 0..t and steps 2..k's keys at t, of its own
        layer. Small cases only (a Python loop per query)."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        keys: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in self.layers]

        def attention(i: int, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor], step: int) -> torch.Tensor:
            att = self.layers[i].self_attn
            b, s, _ = x.shape
            q = att.q_proj(x).view(b, s, -1, HD)
            k = att.k_proj(x).view(b, s, -1, HD)
            if self.qwen3:
                q, k = att.q_norm(q), att.k_norm(k)
            q, k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), *cos_sin)
            v = att.v_proj(x).view(b, s, -1, HD).transpose(1, 2)
            keys[i].append((k, v))
            out = torch.empty(b, NH, s, HD)
            for t in range(s):
                ks = [keys[i][0][0][:, :, : t + 1]] + [keys[i][j][0][:, :, t : t + 1] for j in range(1, step + 1)]
                vs = [keys[i][0][1][:, :, : t + 1]] + [keys[i][j][1][:, :, t : t + 1] for j in range(1, step + 1)]
                kk = torch.cat(ks, dim=2).repeat_interleave(NH // NKV, dim=1)
                vv = torch.cat(vs, dim=2).repeat_interleave(NH // NKV, dim=1)
                weights = (q[:, :, t : t + 1] @ kk.transpose(-1, -2) * HD**-0.5).softmax(-1)
                out[:, :, t : t + 1] = weights @ vv
            return att.o_proj(out.transpose(1, 2).reshape(b, s, NH * HD))

        state, logits = self.project_aux(aux), []
        for step in range(steps):
            b, s, _ = state.shape
            cos_sin = self.rotary(state, torch.arange(step, step + s)[None].expand(b, s))
            residual, x = self._first_layer_input(state, shifted(ids, step + 1))
            h = residual + attention(0, x, cos_sin, step)
            h = h + self.layers[0].mlp(self.layers[0].post_attention_layernorm(h))
            for i, layer in enumerate(self.layers[1:], 1):
                h = h + attention(i, layer.input_layernorm(h), cos_sin, step)
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            step_logits, state = self._head(h)
            logits.append(step_logits)
        return logits


def check_chain(chain: Any, want: list[torch.Tensor], d2t: torch.Tensor) -> None:
    assert chain.logits is not None
    for k, logits in enumerate(want):
        torch.testing.assert_close(chain.logits[k], logits, **TOL)
        ids = logits.argmax(-1)
        assert torch.equal(chain.target_ids[k], ids + d2t[ids])


# --------------------------------------------------------------------------- 1. multi-layer Llama

ENGINES = {"vllm": "input_layernorm", "sglang": "hidden_norm"}
VARIANTS = {
    "eagle3": {},
    "eagle3.1": {"fc_norm": True, "norm_output": True},
    "norm_before_residual": {"norm_before_residual": True},
    "attention_bias": {"attention_bias": True},
    "yarn": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}},
}


@pytest.mark.parametrize("variant", list(VARIANTS.values()), ids=list(VARIANTS))
@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("layers", [2, 3])
def test_multi_layer_matches_transformers_decoder_layers(layers: int, engine: str, variant: dict[str, Any]) -> None:
    """forward (step 1 from aux, step 2 from the returned state) and a 3-step draft_chain equal the
    reference whose later layers are transformers' LlamaDecoderLayer with the engine's input norm."""
    config = make_config(layers, **variant)
    sd = make_state_dict(config)
    norm = ENGINES[engine]
    mine = drafter(config, sd, later_layer_norm=norm)
    ref = Reference(config, sd, later_norm=norm)
    aux, ids = inputs(3 * T)
    tokens = shifted(ids, 1)

    out1 = mine.forward(aux, tokens)
    want1, state1 = ref.step(ref.project_aux(aux), tokens)
    torch.testing.assert_close(out1.logits, want1, **TOL)
    torch.testing.assert_close(out1.hidden, state1, **TOL)  # norm_output: the post-norm state
    out2 = mine.forward(out1.hidden, shifted(ids, 2), position_offset=1)
    want2, state2 = ref.step(state1, shifted(ids, 2), 1)
    torch.testing.assert_close(out2.logits, want2, **TOL)
    torch.testing.assert_close(out2.hidden, state2, **TOL)

    chain = mine.draft_chain(aux, ids, 3, return_logits=True, chunk_size=5)
    check_chain(chain, ref.chain(aux, ids, 3)[0], sd["d2t"])

    # the pin can fail: the other engine's norm gives other logits
    other = Reference(config, sd, later_norm=ENGINES["sglang" if engine == "vllm" else "vllm"])
    assert not close(out1.logits, other.step(other.project_aux(aux), tokens)[0])


@pytest.mark.parametrize("layers", [2, 3])
def test_engines_differ_exactly_when_the_later_norms_differ(layers: int) -> None:
    """vLLM normalises a later layer's input with layers.i.input_layernorm, SGLang with
    layers.i.hidden_norm: different logits when the two tensors differ, identical ones when equal."""
    config = make_config(layers)
    sd = make_state_dict(config)
    aux, ids = inputs(3 * T)
    tokens = shifted(ids, 1)

    def logits(sd: dict[str, torch.Tensor], norm: str) -> torch.Tensor:
        return drafter(config, sd, later_layer_norm=norm).forward(aux, tokens).logits

    assert not close(logits(sd, "input_layernorm"), logits(sd, "hidden_norm"))
    same = dict(sd)
    for i in range(1, layers):
        same[f"layers.{i}.hidden_norm.weight"] = sd[f"layers.{i}.input_layernorm.weight"].clone()
    assert torch.equal(logits(same, "input_layernorm"), logits(same, "hidden_norm"))
    # one differing layer is enough
    one = dict(same)
    one[f"layers.{layers - 1}.hidden_norm.weight"] = sd[f"layers.{layers - 1}.hidden_norm.weight"]
    assert not close(logits(one, "input_layernorm"), logits(one, "hidden_norm"))


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("layers", [2, 3])
def test_chain_ttt_attention_per_layer_by_hand(layers: int, arch: str) -> None:
    """draft_chain's training-time-test attention, every layer, against attention written out per
    query (each layer keeps its own keys: step k at t sees step 1's keys 0..t plus steps 2..k's
    keys at t). A small case: 1 x 6 positions, 4 steps, chunk size 4 (two chunks)."""
    config = qwen3_config(layers) if arch == "qwen3" else make_config(layers, norm_output=True)
    sd = make_state_dict(config)
    mine = drafter(config, sd, later_layer_norm="input_layernorm")
    ref = Reference(config, sd, later_norm="input_layernorm")
    aux, ids = inputs(3 * T, batch=1, seq=6, seed=4)
    chain = mine.draft_chain(aux, ids, 4, return_logits=True, chunk_size=4)
    want = ref.explicit_chain(aux, ids, 4)
    check_chain(chain, want, sd["d2t"])
    # the explicit construction agrees with the transformers' cache + mask one, and differs from
    # what plain causal attention at step 2 would give (so the TTT mask is what is pinned)
    for a, b in zip(want, ref.chain(aux, ids, 4)[0], strict=True):
        torch.testing.assert_close(a, b, **TOL)
    plain = mine.forward(ref.chain(aux, ids, 1)[1][0], shifted(ids, 2), position_offset=1)
    assert not close(plain.logits, want[1])


# --------------------------------------------------------------------------- 2. Qwen3 drafters


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("variant", [{}, {"attention_bias": True, "norm_output": True}], ids=["plain", "bias"])
def test_qwen3_matches_transformers_qwen3(engine: str, variant: dict[str, Any]) -> None:
    """A 2-layer Eagle3Qwen3ForCausalLM drafter: layer 1 is transformers' Qwen3DecoderLayer
    (Qwen3Attention: q/k RMSNorm per head, then RoPE), layer 0 the same attention on 2H inputs."""
    config = qwen3_config(2, **variant)
    sd = make_state_dict(config)
    mine = drafter(config, sd, later_layer_norm=ENGINES[engine])
    ref = Reference(config, sd, later_norm=ENGINES[engine])
    aux, ids = inputs(3 * T)
    out = mine.forward(aux, shifted(ids, 1))
    want, state = ref.step(ref.project_aux(aux), shifted(ids, 1))
    torch.testing.assert_close(out.logits, want, **TOL)
    torch.testing.assert_close(out.hidden, state, **TOL)
    check_chain(mine.draft_chain(aux, ids, 3, return_logits=True), ref.chain(aux, ids, 3)[0], sd["d2t"])
    # the same weights as a Llama drafter (no q/k norms) give other logits: the norms are pinned
    sd_llama = {k: v for k, v in sd.items() if "q_norm" not in k and "k_norm" not in k}
    if variant.get("attention_bias"):  # a Llama drafter builds o_proj with a bias too: zeros, as fix-keys writes
        sd_llama.update({f"{p}self_attn.o_proj.bias": torch.zeros(H) for p in ("midlayer.", "layers.1.")})
    llama = drafter(make_config(2, **{**variant, "rope_theta": 1e6}), sd_llama, later_layer_norm=ENGINES[engine])
    assert not close(llama.forward(aux, shifted(ids, 1)).logits, want)


def test_qwen3_layer0_queries_and_keys_by_hand() -> None:
    """Layer 0 of a Qwen3 drafter (2H input): q and k are RMSNorm'd per head (Qwen3RMSNorm over
    head_dim, one weight shared by the heads, eps rms_norm_eps) and then rotated; v is neither."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    config = qwen3_config(1, rms_norm_eps=1e-2, attention_bias=True)  # a large eps shows the eps
    sd = make_state_dict(config)
    mine = drafter(config, sd)
    aux, ids = inputs(3 * T, seq=9)
    residual, q, k, v = mine.attention_inputs(aux, ids, position_offset=3)

    eps, p = config["rms_norm_eps"], "midlayer."
    g = aux @ sd["fc.weight"].T
    x = torch.cat([rms(F.embedding(ids, sd["embed_tokens.weight"]), sd[p + "input_layernorm.weight"], eps),
                   rms(g, sd[p + "hidden_norm.weight"], eps)], dim=-1)
    b, s, _ = x.shape

    def heads(name: str, n: int) -> torch.Tensor:
        w, bias = sd[f"{p}self_attn.{name}_proj.weight"], sd[f"{p}self_attn.{name}_proj.bias"]
        return (x @ w.T + bias).view(b, s, n, HD)

    def qwen3_norm(t: torch.Tensor, name: str) -> torch.Tensor:
        norm = Qwen3RMSNorm(HD, eps=eps)
        norm.weight.data.copy_(sd[f"{p}self_attn.{name}.weight"])
        return norm(t)

    inv_freq = 1.0 / config["rope_theta"] ** (torch.arange(0, HD, 2).float() / HD)
    angles = torch.arange(3, 3 + s).float()[:, None] * inv_freq
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()

    def rope(t: torch.Tensor) -> torch.Tensor:  # [B, S, n, HD] -> [B, n, S, HD], rotate-half
        t = t.transpose(1, 2)
        return t * cos + torch.cat([-t[..., HD // 2 :], t[..., : HD // 2]], -1) * sin

    torch.testing.assert_close(residual, g, **TOL)
    torch.testing.assert_close(q, rope(qwen3_norm(heads("q", NH), "q_norm")), **TOL)
    torch.testing.assert_close(k, rope(qwen3_norm(heads("k", NKV), "k_norm")), **TOL)
    torch.testing.assert_close(v, heads("v", NKV).transpose(1, 2), **TOL)
    # the order matters: the norm after RoPE gives other queries
    after = qwen3_norm(rope(heads("q", NH)).transpose(1, 2), "q_norm").transpose(1, 2)
    assert not close(q, after)


def test_qwen3_rope_theta_default_is_what_vllm_receives() -> None:
    """A Qwen3 drafter whose config has no rope_theta runs RoPE with the theta transformers'
    Qwen3Config sets, which is what vLLM 0.33.0 builds its Qwen3 layers from.

    vLLM's Qwen3DecoderLayer calls ``set_default_rope_theta(config, 1000000)`` (models/qwen3.py:188),
    but that only fills ``rope_theta`` when ``rope_parameters`` lacks it (transformers_utils/config.py:
    600-606), and vLLM builds the drafter's config with transformers' own class
    (``HFConfigParser`` -> ``AutoConfig``), whose ``convert_rope_params_to_dict`` already put
    ``rope_theta = default_theta = 10000`` there (transformers 5.20.0, in vLLM's pin
    ``>=5.16.1,<5.21.0``, and 5.24 alike). So the 1e6 default is never reached: read, not run.
    """
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    config = qwen3_config(1)
    del config["rope_theta"]
    hf = Qwen3Config.from_dict(config)
    assert "rope_theta" in hf.rope_parameters  # why vLLM's set_default_rope_theta is a no-op
    positions = torch.arange(0, 400, 7)
    cos, sin = Qwen3RotaryEmbedding(hf)(torch.zeros(1), positions[None])
    mine_cos, mine_sin = drafter(config, make_state_dict(config)).rope(positions)
    torch.testing.assert_close(mine_cos, cos[0], **TOL)
    torch.testing.assert_close(mine_sin, sin[0], **TOL)
    # and it matters: theta 1e6 would rotate differently
    other_cos, _ = drafter({**config, "rope_theta": 1e6}, make_state_dict(config)).rope(positions)
    assert not close(other_cos, cos[0])


# --------------------------------------------------------------------------- 3. norm_before_fc, k = 5


AUX_NORMS = {"none": (False, False), "fc_norm": (False, True), "input_norm": (True, False),
             "input_norm+fc_norm": (True, True)}


@pytest.mark.parametrize("norms", list(AUX_NORMS))
@pytest.mark.parametrize("k", [3, 5])
def test_norm_before_fc_and_k_aux_states_by_hand(k: int, norms: str) -> None:
    """Step 1 of a drafter over k aux states (fc [H, k*T]) with norm_before_fc: one RMSNorm
    (input_norm.weight, k*T wide) over the whole concatenation, then each T-wide chunk's fc_norm,
    then fc: vLLM's combine_hidden_states order. The H-wide state written out by hand gives the
    same step (forward skips fc on it)."""
    norm_before_fc, fc_norm = AUX_NORMS[norms]
    config = make_config(2, num_aux_hidden_states=k, norm_before_fc=norm_before_fc, fc_norm=fc_norm,
                         eagle_config={"eagle_aux_hidden_state_layer_ids": list(range(1, k + 1))})
    sd = make_state_dict(config)
    assert sd["fc.weight"].shape == (H, k * T)
    assert ("input_norm.weight" in sd) == norm_before_fc and ("fc_norm.0.weight" in sd) == fc_norm
    mine = drafter(config, sd)
    aux, ids = inputs(k * T)
    aux = aux * torch.linspace(0.2, 5.0, k * T)  # chunks of different scales: each norm shows
    eps = config["rms_norm_eps"]

    u = rms(aux, sd["input_norm.weight"], eps) if norm_before_fc else aux
    if fc_norm:
        u = torch.cat([rms(c, sd[f"fc_norm.{i}.weight"], eps) for i, c in enumerate(u.split(T, -1))], -1)
    g = u @ sd["fc.weight"].T

    out, by_hand = mine.forward(aux, ids), mine.forward(g, ids)
    torch.testing.assert_close(out.logits, by_hand.logits, **TOL)
    torch.testing.assert_close(out.hidden, by_hand.hidden, **TOL)
    ref = Reference(config, sd)
    torch.testing.assert_close(out.logits, ref.step(ref.project_aux(aux), ids)[0], **TOL)
    # the pin can fail: with a norm left out, or the two the other way round, g differs
    if norms != "none":
        assert not close(mine.forward(aux @ sd["fc.weight"].T, ids).logits, out.logits)
    if norm_before_fc and fc_norm:
        chunks = [rms(c, sd[f"fc_norm.{i}.weight"], eps) for i, c in enumerate(aux.split(T, -1))]
        swapped = rms(torch.cat(chunks, -1), sd["input_norm.weight"], eps) @ sd["fc.weight"].T
        assert not close(mine.forward(swapped, ids).logits, out.logits)


# --------------------------------------------------------------------------- 4. P-EAGLE


PEAGLE = {
    "1-layer": make_config(1, parallel_drafting=True, mask_token_id=MASK_TOKEN),
    "2-layer": make_config(2, parallel_drafting=True, mask_token_id=MASK_TOKEN),
    "2-layer-k5-eagle3.1": make_config(2, parallel_drafting=True, mask_token_id=MASK_TOKEN, norm_before_fc=True,
                                       fc_norm=True, num_aux_hidden_states=5,
                                       eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4, 5]}),
    "qwen3-2-layer": qwen3_config(2, architectures=["PeagleQwen3ForCausalLM"], mask_token_id=MASK_TOKEN),
}


@pytest.mark.parametrize("case", list(PEAGLE))
def test_parallel_drafting_is_vllm_proposer_layout(case: str) -> None:
    """draft_chain(parallel=True) against vLLM 0.33.0's proposer layout for every chain start t,
    built by hand: slots 0..t hold (x_{j+1}, fc(aux[j])) (slot t is the bonus token), then K-1 mask
    slots hold (mask_token_id, fc(mask_hidden)), positions 0..t+K-1 consecutive, one pass of plain
    causal attention; draft i comes from slot t+i-1. Position 1 is the ordinary chain's step 1."""
    config = PEAGLE[case]
    k = config.get("num_aux_hidden_states", 3)
    sd = make_state_dict(config)
    if case == "1-layer":
        sd["mask_hidden"] = sd["mask_hidden"].view(1, k * T)  # as vLLM registers it; any view loads
    mine = drafter(config, sd)
    ref = Reference(config, sd)
    steps, (aux, ids) = 4, inputs(k * T, batch=2, seq=9, seed=7)
    chain = mine.draft_chain(aux, ids, steps, return_logits=True, parallel=True, chunk_size=4)
    assert chain.logits is not None

    g, mask_g = ref.project_aux(aux), ref.project_aux(sd["mask_hidden"].view(1, 1, -1))
    tokens = shifted(ids, 1)
    b, seq = ids.shape
    for t in range(seq):
        state = torch.cat([g[:, : t + 1], mask_g.expand(b, steps - 1, H)], dim=1)
        slots = torch.cat([tokens[:, : t + 1], torch.full((b, steps - 1), MASK_TOKEN)], dim=1)
        want, _ = ref.step(state, slots)  # positions 0 .. t+K-1, causal, one pass
        torch.testing.assert_close(chain.logits[:, :, t], want[:, t : t + steps].transpose(0, 1), **TOL)
        ids_t = want[:, t : t + steps].argmax(-1).T
        assert torch.equal(chain.target_ids[:, :, t], ids_t + sd["d2t"][ids_t])

    plain = mine.draft_chain(aux, ids, steps, return_logits=True)
    assert plain.logits is not None
    torch.testing.assert_close(chain.logits[0], plain.logits[0], **TOL)
    assert not close(chain.logits[1:], plain.logits[1:])  # the later positions are not chained
    assert torch.equal(chain.labels, plain.labels)


def test_parallel_drafting_token_read_as_vllm_reads_it() -> None:
    """vLLM 0.33.0's proposer takes the mask-slot token from dflash_config.mask_token_id,
    mask_token_id, dspark_noise_token_id, pard_token, ptd_token_id, in that order; NeMo Automodel's
    vLLM export and vLLM's own speculators update_peagle write pard_token. A drafter that carries
    only pard_token drafts as the one with mask_token_id; mask_token_id wins over pard_token."""
    base = {k: v for k, v in PEAGLE["1-layer"].items() if k != "mask_token_id"}
    sd = make_state_dict(PEAGLE["1-layer"])
    aux, ids = inputs(3 * T, seq=8)

    def parallel(config: dict[str, Any]) -> torch.Tensor:
        chain = drafter(config, sd).draft_chain(aux, ids, 3, return_logits=True, parallel=True)
        assert chain.logits is not None
        return chain.logits

    want = parallel({**base, "mask_token_id": MASK_TOKEN})
    assert torch.equal(parallel({**base, "pard_token": MASK_TOKEN}), want)
    assert torch.equal(parallel({**base, "ptd_token_id": MASK_TOKEN}), want)
    assert torch.equal(parallel({**base, "mask_token_id": MASK_TOKEN, "pard_token": MASK_TOKEN + 1}), want)
    assert not close(parallel({**base, "pard_token": MASK_TOKEN + 1}), want)
    with pytest.raises(UsageError, match="mask token"):
        parallel(base)


# --------------------------------------------------------------------------- 5. 2-layer MLA


class MLAReference:
    """tests/test_mla.py's oracle for layer 0 (transformers' DeepSeek-V3 attention on 2H inputs),
    transformers' DeepseekV3DecoderLayer (dense MLP, input H) for each later layer."""

    def __init__(self, config: dict[str, Any], sd: dict[str, torch.Tensor], later_norm: str) -> None:
        import copy

        from test_mla import Oracle
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer

        self.first = Oracle(config, sd)
        ds = copy.deepcopy(self.first.attn.config)
        layers = config["num_hidden_layers"]
        ds.first_k_dense_replace = layers  # every layer dense, as vLLM's DeepseekV2MLP
        self.later = []
        with torch.no_grad():
            for i in range(1, layers):
                layer = DeepseekV3DecoderLayer(ds, layer_idx=i).eval()
                for norm in (layer.self_attn.q_a_layernorm, layer.self_attn.kv_a_layernorm):
                    if norm is not None:
                        norm.variance_epsilon = config["rms_norm_eps"]  # transformers hard-codes 1e-6
                p = f"layers.{i}."
                weights = {n: sd[p + n] for n in layer.state_dict() if p + n in sd}
                weights["input_layernorm.weight"] = sd[f"{p}{later_norm}.weight"]
                layer.load_state_dict(weights, strict=True)
                self.later.append(layer)

    @torch.no_grad()
    def step(self, state: torch.Tensor, tokens: torch.Tensor, offset: int, allowed: torch.Tensor,
             cache: Any) -> tuple[torch.Tensor, torch.Tensor]:
        o = self.first
        b, s, _ = state.shape
        embeds = F.embedding(tokens, o.sd["embed_tokens.weight"])
        x = torch.cat((o.norms["input_layernorm"](embeds), o.norms["hidden_norm"](state)), dim=-1)
        cos_sin = o.rotary(x, torch.arange(offset, offset + s)[None].expand(b, s))
        mask = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[None, None]
        out, _ = o.attn(x, cos_sin, mask, cache=cache)
        h = state + out
        h = h + o.mlp(o.norms["post_attention_layernorm"](h))
        for layer in self.later:
            h = layer(h, attention_mask=mask, position_embeddings=cos_sin, cache=cache)
        normed = o.norms["norm"](h)
        return F.linear(normed, o.sd["lm_head.weight"]), normed if o.config.get("norm_output") else h

    def chain(self, aux: torch.Tensor, ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
        from transformers import DynamicCache

        cache, state, logits = DynamicCache(), self.first.project_aux(aux), []
        for k in range(steps):
            step_logits, state = self.step(state, shifted(ids, k + 1), k, ttt_mask(ids.shape[1], k), cache)
            logits.append(step_logits)
        return logits


@pytest.mark.parametrize("later_norm", ["input_layernorm", "hidden_norm"])
@pytest.mark.parametrize(
    "variant", [{}, {"rope_scaling": None, "fc_norm": True, "norm_output": True}, {"q_lora_rank": None}],
    ids=["kimi-yarn", "eagle3.1", "no-q-lora"],
)
def test_two_layer_mla_matches_transformers_deepseek_v3(variant: dict[str, Any], later_norm: str) -> None:
    """A 2-layer MLA drafter (vLLM 0.33.0 serves it; SGLang 0.5.23 refuses): every step of a
    3-step chain equals layer 0 from tests/test_mla.py's oracle plus transformers'
    DeepseekV3DecoderLayer as layer 1, whose q_a/kv_a (or q_proj) read H."""
    from test_mla import make_config as mla_config
    from test_mla import make_state_dict as mla_state_dict

    config = mla_config(num_hidden_layers=2, **variant)
    sd = mla_state_dict(config)
    assert sd["layers.1.self_attn.kv_a_proj_with_mqa.weight"].shape[1] == config["hidden_size"]
    mine = Eagle3MLADrafter(config, sd, dtype=torch.float32, run=Run(later_layer_norm=later_norm))
    ref = MLAReference(config, sd, later_norm)
    aux, ids = inputs(3 * config["hidden_size"], seq=10)
    want = ref.chain(aux, ids, 3)
    check_chain(mine.draft_chain(aux, ids, 3, return_logits=True, chunk_size=4), want, sd["d2t"])
    torch.testing.assert_close(mine.forward(aux, shifted(ids, 1)).logits, want[0], **TOL)
    other = MLAReference(config, sd, "hidden_norm" if later_norm == "input_layernorm" else "input_layernorm")
    assert not close(other.chain(aux, ids, 1)[0], want[0])


# --------------------------------------------------------------------------- 6. switches left out


def test_without_fc_norm_is_the_drafter_without_its_tensors() -> None:
    config = make_config(2, fc_norm=True)
    sd = make_state_dict(config)
    aux, ids = inputs(3 * T)
    aux = aux * torch.linspace(0.2, 5.0, 3 * T)
    skipped = drafter(config, sd, without={"fc_norm"})
    stripped = drafter(make_config(2), {k: v for k, v in sd.items() if not k.startswith("fc_norm.")})
    out = skipped.forward(aux, ids)
    assert torch.equal(out.logits, stripped.forward(aux, ids).logits)
    torch.testing.assert_close(out.hidden, skipped.forward(aux @ sd["fc.weight"].T, ids).hidden, **TOL)
    assert not close(drafter(config, sd).forward(aux, ids).logits, out.logits)


def test_without_norm_before_fc_is_the_drafter_without_input_norm() -> None:
    config = make_config(2, norm_before_fc=True, fc_norm=True)
    sd = make_state_dict(config)
    aux, ids = inputs(3 * T)
    aux = aux * torch.linspace(0.2, 5.0, 3 * T)
    skipped = drafter(config, sd, without={"norm_before_fc"})
    stripped = drafter(make_config(2, fc_norm=True), {k: v for k, v in sd.items() if k != "input_norm.weight"})
    out = skipped.forward(aux, ids)
    assert torch.equal(out.logits, stripped.forward(aux, ids).logits)
    eps = config["rms_norm_eps"]
    g = torch.cat([rms(c, sd[f"fc_norm.{i}.weight"], eps) for i, c in enumerate(aux.split(T, -1))], -1)
    torch.testing.assert_close(out.hidden, skipped.forward(g @ sd["fc.weight"].T, ids).hidden, **TOL)
    assert not close(drafter(config, sd).forward(aux, ids).logits, out.logits)


def test_without_norm_output_feeds_the_pre_norm_state() -> None:
    config = make_config(2, norm_output=True)
    sd = make_state_dict(config)
    aux, ids = inputs(3 * T)
    skipped = drafter(config, sd, without={"norm_output"})
    plain = drafter(make_config(2), sd)
    a, b = skipped.draft_chain(aux, ids, 3, return_logits=True), plain.draft_chain(aux, ids, 3, return_logits=True)
    assert a.logits is not None and b.logits is not None
    assert torch.equal(a.logits, b.logits)
    check_chain(a, Reference(config, sd, without=("norm_output",)).chain(aux, ids, 3)[0], sd["d2t"])
    honoured = drafter(config, sd).draft_chain(aux, ids, 3, return_logits=True)
    assert honoured.logits is not None
    torch.testing.assert_close(honoured.logits[0], a.logits[0], **TOL)  # step 1 is the same
    assert not close(honoured.logits[1], a.logits[1])  # the state fed to step 2 is not


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_without_attention_bias_drops_the_qkv_biases(arch: str) -> None:
    config = (qwen3_config if arch == "qwen3" else make_config)(2, attention_bias=True)
    sd = make_state_dict(config)
    aux, ids = inputs(3 * T)
    skipped = drafter(config, sd, without={"attention_bias"})
    plain_config = {**config, "attention_bias": False}
    stripped = drafter(plain_config, {k: v for k, v in sd.items() if not k.endswith("_proj.bias")})  # o_proj's: zeros
    out = skipped.forward(aux, ids)
    assert torch.equal(out.logits, stripped.forward(aux, ids).logits)
    torch.testing.assert_close(out.logits, Reference(plain_config, sd).step(aux @ sd["fc.weight"].T, ids)[0], **TOL)
    # layer 0's values by hand, no bias
    _, _, _, v = skipped.attention_inputs(aux, ids)
    x = torch.cat([rms(F.embedding(ids, sd["embed_tokens.weight"]), sd["midlayer.input_layernorm.weight"], 1e-6),
                   rms(aux @ sd["fc.weight"].T, sd["midlayer.hidden_norm.weight"], 1e-6)], -1)
    torch.testing.assert_close(v, (x @ sd["midlayer.self_attn.v_proj.weight"].T).view(2, 12, NKV, HD).transpose(1, 2),
                               **TOL)
    assert not close(drafter(config, sd).forward(aux, ids).logits, out.logits)


def test_without_every_switch_at_once() -> None:
    """All four left out (an engine that reads none of them) is the plain drafter."""
    config = make_config(2, fc_norm=True, norm_output=True, norm_before_fc=True, attention_bias=True)
    sd = make_state_dict(config)
    plain = {k: v for k, v in sd.items()
             if not (k.startswith("fc_norm.") or k == "input_norm.weight" or k.endswith("_proj.bias"))}
    aux, ids = inputs(3 * T)
    a = drafter(config, sd, without={"fc_norm", "norm_output", "norm_before_fc", "attention_bias"})
    b = drafter(make_config(2), plain)
    ca, cb = a.draft_chain(aux, ids, 3, return_logits=True), b.draft_chain(aux, ids, 3, return_logits=True)
    assert ca.logits is not None and cb.logits is not None
    assert torch.equal(ca.logits, cb.logits)


# --------------------------------------------------------------------------- speculators (vLLM's trainer)


def speculators_model(config: dict[str, Any], sd: dict[str, torch.Tensor]) -> Any:
    """speculators 0.9.0's Eagle3DraftModel with the same weights (eager attention). Its later
    layers are transformers' decoder layers with their own input_layernorm (vLLM's choice)."""
    from transformers import LlamaConfig, Qwen3Config

    from helpers import speculators_draft_model

    qwen3 = any(a in QWEN3 for a in config["architectures"])
    layer = (Qwen3Config if qwen3 else LlamaConfig)(
        hidden_size=H, intermediate_size=INTER, num_attention_heads=NH, num_key_value_heads=NKV,
        head_dim=HD, vocab_size=V, num_hidden_layers=config["num_hidden_layers"],
        rms_norm_eps=config["rms_norm_eps"], max_position_embeddings=2048, rope_theta=config["rope_theta"],
    )
    layer._attn_implementation = "eager"
    model = speculators_draft_model(layer, config, VD, norm_before_residual=False,
                                    norm_before_fc=config.get("norm_before_fc", False))
    weights = {k.replace("midlayer.", "layers.0."): v for k, v in sd.items()
               if not (k.startswith("layers.") and k.endswith(".hidden_norm.weight"))}  # no such norm there
    result = model.load_state_dict(weights, strict=False)
    assert result.unexpected_keys == []
    assert sorted(result.missing_keys) == ["verifier_lm_head.weight", "verifier_norm.weight"]
    return model


SPECULATORS = {
    "2-layer": (make_config, 2, {"norm_output": True}),
    "3-layer": (make_config, 3, {"fc_norm": True}),
    "qwen3-2-layer": (qwen3_config, 2, {}),
    "k5-norm_before_fc": (make_config, 2, {"norm_before_fc": True, "num_aux_hidden_states": 5,
                                            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4, 5]}}),
}


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize("case", list(SPECULATORS))
def test_oracle_speculators_multi_layer_ttt(case: str) -> None:
    """Same weights, same inputs: every TTT step equals speculators' (T == H there, its fc_norm is
    H wide); eagle3conv run as vLLM (later layers normalised with input_layernorm)."""
    if importlib.util.find_spec("speculators") is None:  # not installed: skip
        pytest.importorskip("speculators")
    build, layers, extra = SPECULATORS[case]
    config = build(layers, target_hidden_size=None, **extra)
    sd = make_state_dict(config)
    oracle = speculators_model(config, sd)
    mine = drafter(config, sd, later_layer_norm="input_layernorm")
    k = config.get("num_aux_hidden_states", 3)
    gen = torch.Generator().manual_seed(3)
    seq, steps = 24, 3
    aux, ids = torch.randn(1, seq, k * H, generator=gen), torch.randint(0, V, (1, seq), generator=gen)
    captured: list[torch.Tensor] = []
    hook = oracle.lm_head.register_forward_hook(lambda _m, _i, out: captured.append(out))
    with torch.no_grad():
        oracle(hidden_states=aux[:, :-1], input_ids=ids[:, 1:], document_ids=torch.zeros(1, seq - 1, dtype=torch.long),
               position_ids=torch.arange(seq - 1)[None], ttt_steps=steps)
    hook.remove()
    chain = mine.draft_chain(aux, ids, steps, return_logits=True, chunk_size=8)
    assert chain.logits is not None and len(captured) == steps
    for j in range(steps):
        torch.testing.assert_close(chain.logits[j, :, : seq - 1], captured[j], **TOL)
    sglang = drafter(config, sd, later_layer_norm="hidden_norm").draft_chain(aux, ids, 1, return_logits=True)
    assert sglang.logits is not None and not close(sglang.logits[0, :, : seq - 1], captured[0])
