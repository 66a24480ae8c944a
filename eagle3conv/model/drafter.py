"""The EAGLE-3 drafter forward, as SGLang's ``LlamaForCausalLMEagle3`` runs it.

This module receives tensors and a config dict (the drafter's ``config.json``
as a dict) and knows nothing about files. Weights use eagle3conv's canonical
spelling (SGLang's, unprefixed, unfused): ``fc.weight``, ``midlayer.*``,
``norm.weight``, ``lm_head.weight``, ``d2t``, ... (see :func:`expected_shapes`).

One draft step (upstream: sglang ``python/sglang/srt/models/llama_eagle3.py``)::

    g    = fc(cat(fc_norm_i(aux_i)))        if last dim == k*T  (step 1)
         = h                                if last dim == H    (steps 2+, fc skipped)
    res  = g                                (hidden_norm(g) if norm_before_residual)
    x    = cat(input_layernorm(embed(tok)), hidden_norm(g))      # embeds first
    h    = res + o_proj(causal_gqa_attention(rope(q(x)), rope(k(x)), v(x)))
    h    = h + mlp(post_attention_layernorm(h))                  # SwiGLU
    logits = lm_head(norm(h))               # draft vocab, width Vd
    target_id = argmax + d2t[argmax]
    next step's state = h (pre-norm), or norm(h) if norm_output

Two entry points:

* :meth:`Eagle3Drafter.forward` runs one step over whole sequences with plain
  causal attention (SGLang's draft-extend layout).
* :meth:`Eagle3Drafter.draft_chain` runs K steps teacher-forced over whole
  sequences with EAGLE-3's training-time-test attention and returns per-step
  predictions aligned with the tokens they guess (see its docstring).

:func:`smoke_test` is a structural check on random inputs;
:func:`check_mla_shapes` checks the tensor shapes of MLA drafters
(``Eagle3DeepseekV2ForCausalLM``), whose forward is
:class:`eagle3conv.model.mla.Eagle3MLADrafter` (a subclass of this one).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from eagle3conv.errors import InvalidCheckpointError, UsageError
from eagle3conv.spec.canonical import (
    D2T, EMBED, FC, FC_BIAS, FIRST_LAYER, LM_HEAD, MASK_HIDDEN, NORM, T2D, ExpectedTensor, expected, shape_matches,
)
from eagle3conv.spec.config_check import layer_count_problem
from eagle3conv.spec.drafter import AUX_KEY, LATER_LAYER_NORMS, DrafterSpec
from eagle3conv.spec.variants import switches
from eagle3conv.spec.engines import Run
from eagle3conv.findings import (
    LOGITS_SHAPE,
    NONFINITE_HIDDEN,
    NONFINITE_LOGITS,
    PREDICTION_OUT_OF_VOCAB,
    SMOKE,
    STATE_WIDTH,
    Finding,
)
from eagle3conv.model.ops import apply_rope, argmax, rms_norm, rope_inv_freq

__all__ = [
    "ChainKeys",
    "DraftChain",
    "DrafterConfig",
    "Eagle3Drafter",
    "SmokeTestResult",
    "StepOutput",
    "check_mla_shapes",
    "expected_mla_shapes",
    "expected_shapes",
    "smoke_test",
]

_MAX_LISTED = 20  # offending keys named in an error message before "... and N more"

#: the switches a run may leave out, as an engine release that ignores them does (mappings/variants.json)
SKIPPABLE = tuple(s.name for s in switches() if s.skippable)


# --------------------------------------------------------------------------- config


def parallel_drafting_token(config: Mapping[str, Any]) -> int | None:
    """The token id of P-EAGLE's mask slots, looked up where vLLM reads it, in its order (the engine
    rules' ``mask_token_fields``; docs/facts.md §11). None when there is none."""
    from eagle3conv.spec.engines import mask_token

    return mask_token("vllm", config)


def require_int(config: Mapping[str, Any], name: str) -> int:
    value = config.get(name)
    if value is None:
        raise InvalidCheckpointError(f"config.json: required field {name!r} is missing")
    return int(value)


@dataclass(frozen=True)
class DrafterConfig:
    """The numbers and switches of a Llama-style EAGLE-3 drafter, read from config.json.

    ``num_aux`` is the length of the declared aux-layer ids, else 3 (SGLang's
    ``LlamaForCausalLMEagle3`` hard-codes ``fc`` as ``3 * target_hidden_size`` wide).
    """

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    num_aux: int
    rms_norm_eps: float
    hidden_act: str
    fc_bias: bool
    fc_norm: bool
    norm_output: bool
    norm_before_residual: bool
    draft_vocab_declared: bool
    attention_bias: bool
    spec: DrafterSpec = field(compare=False, repr=False)
    """The parsed contract (:class:`~eagle3conv.spec.drafter.DrafterSpec`) with ``k`` = ``num_aux``."""
    num_layers: int = 1
    norm_before_fc: bool = False
    qk_norm: bool = False
    parallel_drafting: bool = False
    mask_token_id: int | None = None
    """P-EAGLE's mask-slot token, read as vLLM reads it (:func:`parallel_drafting_token`)."""

    @property
    def fc_in_features(self) -> int:
        return self.num_aux * self.target_hidden_size

    def expected(self) -> dict[str, ExpectedTensor]:
        """The tensors the strict loader accepts: :func:`eagle3conv.spec.canonical.expected`."""
        return expected(self.spec)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, architecture: str = "llama") -> DrafterConfig:
        """Parse and sanity-check a drafter config; raise InvalidCheckpointError if unusable.

        The config is read once, by :meth:`DrafterSpec.from_config`; ``architecture`` is the
        canonical table the loader holds the tensors to ("llama", or "mla" for the MLA class)."""
        spec = DrafterSpec.from_config(config, architecture=architecture)
        hidden = require_int(config, "hidden_size")
        heads = require_int(config, "num_attention_heads")
        if spec.tie_word_embeddings:
            raise InvalidCheckpointError(
                "config.json: tie_word_embeddings is true, so SGLang would use the embedding as "
                "lm_head and ignore the drafter's pruned head",
                hint="set tie_word_embeddings to false in the drafter's config.json",
            )
        require_int(config, "vocab_size")
        require_int(config, "intermediate_size")
        num_aux = spec.k or 3
        spec = spec.with_(k=num_aux)
        return cls(
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(spec.NKV),  # type: ignore[arg-type]
            head_dim=int(spec.HD),  # type: ignore[arg-type]
            intermediate_size=int(spec.I),  # type: ignore[arg-type]
            vocab_size=int(spec.V),  # type: ignore[arg-type]
            draft_vocab_size=int(spec.Vd),  # type: ignore[arg-type]
            target_hidden_size=int(spec.T),  # type: ignore[arg-type]
            num_aux=num_aux,
            rms_norm_eps=spec.rms_norm_eps,
            hidden_act=spec.hidden_act,
            fc_bias=spec.on("fc_bias"),
            fc_norm=spec.on("fc_norm"),
            norm_output=spec.on("norm_output"),
            norm_before_residual=spec.on("norm_before_residual"),
            draft_vocab_declared=spec.draft_vocab_declared,
            attention_bias=spec.on("attention_bias"),
            spec=spec,
            num_layers=spec.L,
            norm_before_fc=spec.on("norm_before_fc"),
            qk_norm=spec.on("qk_norm"),
            parallel_drafting=spec.on("parallel_drafting"),
            mask_token_id=parallel_drafting_token(config),
        )


def expected_shapes(config: Mapping[str, Any] | DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Llama-style drafter with this config may hold, canonical name -> shape.

    From mappings/canonical.json (:func:`eagle3conv.spec.canonical.expected`). Optional tensors
    (``t2d``, ``embed_tokens.weight``, and ``d2t`` when the draft vocab is the full vocab) are
    included; the loader tells them apart by the rows' ``required`` (:func:`check_tensors`).
    """
    c = config if isinstance(config, DrafterConfig) else DrafterConfig.from_config(config)
    return _shapes(c.expected())


def _shapes(table: Mapping[str, ExpectedTensor]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for name, e in table.items():
        if any(d is None for d in e.shape):  # a symbol the config does not set: a table bug
            raise InvalidCheckpointError(
                f"mappings/canonical.json: cannot size {name} {list(e.row.shape)} from the config"
            )
        shapes[name] = tuple(int(d) for d in e.shape)  # type: ignore[arg-type]
    return shapes


def check_tensors(
    state_dict: Mapping[str, Tensor],
    table: Mapping[str, ExpectedTensor],
    symbols: Mapping[str, Any],
    what: str,
) -> None:
    """Raise one InvalidCheckpointError naming every missing, unexpected or misshapen key.

    ``table``: the tensors the config implies (:func:`eagle3conv.spec.canonical.expected`, with
    ``symbols`` its shape symbols); a shape fits as the planner reads it (``shape_matches``)."""
    shapes = _shapes(table)
    missing = sorted(k for k, e in table.items() if k not in state_dict and e.required)
    unexpected = sorted(k for k in state_dict if k not in shapes)
    wrong = [
        f"{k}: expected {list(shape)}, got {list(state_dict[k].shape)}"
        for k, shape in shapes.items()
        if k in state_dict and not shape_matches(table[k].row, tuple(state_dict[k].shape), symbols)
    ]
    details = (
        [f"missing: {k}" for k in missing]
        + [f"unexpected: {k}" for k in unexpected]
        + [f"wrong shape: {w}" for w in wrong]
    )
    if not details:
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected")
    if wrong:
        parts.append(f"{len(wrong)} misshapen")
    listed = details[:_MAX_LISTED]
    if len(details) > _MAX_LISTED:
        listed.append(f"... and {len(details) - _MAX_LISTED} more")
    raise InvalidCheckpointError(
        f"{what} does not match its config ({', '.join(parts)} tensors): " + "; ".join(listed),
        hint="rename keys to eagle3conv's canonical (SGLang) spelling and check config.json "
        f"(hidden_size, heads, head_dim, intermediate_size, draft_vocab_size, "
        f"target_hidden_size, num_hidden_layers, {AUX_KEY}, num_aux_hidden_states, fc_norm, norm_before_fc, "
        "bias, attention_bias)",
        details=details,
    )


def _check_vocab_maps(vocab_size: int, state_dict: Mapping[str, Tensor]) -> None:
    """d2t must be integral and map every draft id into the target vocab; t2d is a mask."""
    problems: list[str] = []
    d2t = state_dict.get(D2T)
    if d2t is not None:
        if d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
            problems.append(f"d2t has dtype {d2t.dtype}; expected an integer dtype")
        else:
            targets = torch.arange(d2t.numel(), device=d2t.device) + d2t.long()
            bad = torch.nonzero((targets < 0) | (targets >= vocab_size)).flatten()
            if bad.numel():
                shown = ", ".join(str(i) for i in bad[:10].tolist())
                problems.append(
                    f"d2t maps {bad.numel()} draft ids outside the target vocab "
                    f"[0, {vocab_size}) (draft ids {shown})"
                )
    t2d = state_dict.get(T2D)
    if t2d is not None and t2d.dtype.is_floating_point:
        problems.append(f"t2d has dtype {t2d.dtype}; expected bool")
    if problems:
        raise InvalidCheckpointError("bad vocab map: " + "; ".join(problems), details=problems)


# --------------------------------------------------------------------------- outputs


@dataclass(frozen=True)
class StepOutput:
    """One draft step over ``[B, S]`` positions.

    ``hidden`` is what the next step receives: the pre-norm state, or the
    post-norm state when the config sets ``norm_output``. The guesses (``draft_ids``,
    ``target_ids``) are the logits' argmax, computed when first read: a caller that scores
    the logits itself (the wiring screen) does not pay for a pass it does not use.
    """

    logits: Tensor  # [B, S, Vd]
    hidden: Tensor  # [B, S, H]
    d2t: Tensor  # [Vd] the vocab map's offsets (target id = draft id + d2t[draft id])

    @functools.cached_property
    def draft_ids(self) -> Tensor:  # [B, S] argmax in the draft vocab (ops.argmax: the same, faster on a CPU)
        return argmax(self.logits)

    @functools.cached_property
    def target_ids(self) -> Tensor:  # [B, S] draft_ids + d2t[draft_ids]
        return self.draft_ids + self.d2t[self.draft_ids]


@dataclass(frozen=True)
class DraftChain:
    """K draft steps over whole sequences, aligned with the tokens they guess.

    For ``input_ids`` ``x`` of shape ``[B, S]``: ``target_ids[k-1, b, t]`` is the
    drafter's step-k guess for ``x[b, t+k+1]`` and ``labels[k-1, b, t]`` is that
    token, or -1 where ``t+k+1 >= S``. ``logits`` is ``[K, B, S, Vd]`` when asked for.
    """

    target_ids: Tensor  # [K, B, S] int64
    labels: Tensor  # [K, B, S] int64, -1 where there is no reference token
    logits: Tensor | None = None

    @property
    def num_steps(self) -> int:
        return self.target_ids.shape[0]

    @property
    def valid(self) -> Tensor:
        """[K, B, S] bool: a reference token exists."""
        return self.labels >= 0

    @property
    def matches(self) -> Tensor:
        """[K, B, S] bool: the step-k guess equals the reference token."""
        return (self.target_ids == self.labels) & self.valid

    def accept_lengths(self) -> Tensor:
        """[B, S] int64: leading steps accepted by greedy verification of a chain started at t.

        A position whose later steps have no reference token counts them as rejected;
        restrict to ``t <= S - K - 2`` for chains that could accept all K steps.
        """
        return self.matches.long().cumprod(dim=0).sum(dim=0)


# --------------------------------------------------------------------------- drafter


class Eagle3Drafter:
    """A Llama-style EAGLE-3 drafter (``LlamaForCausalLMEagle3``) with strict weight loading.

    Args:
        config: the drafter's config.json as a dict.
        state_dict: tensors under canonical names (see :func:`expected_shapes`). Every
            tensor must be used and none may be missing; offending keys are listed in
            an :class:`~eagle3conv.errors.InvalidCheckpointError`.
        embed_tokens: ``[V, H]`` token embedding, normally the target's (SGLang replaces
            the drafter's own). Defaults to the checkpoint's ``embed_tokens.weight``.
        device, dtype: where and in which float dtype to run. ``d2t`` stays int64.
        run: how an engine release runs the drafter (:class:`~eagle3conv.spec.engines.Run`, from
            :func:`eagle3conv.spec.engines.serving`), read here once: the residual norm, the later
            layers' input norm, the switches it ignores, whose embedding, P-EAGLE's mask token, the
            RoPE layout (MLA). Default: as config.json says.

    Raises:
        InvalidCheckpointError: the config or tensors break a rule.
        UsageError: no embedding is available.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        state_dict: Mapping[str, Tensor],
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.bfloat16,
        embed_tokens: Tensor | None = None,
        run: Run | None = None,
    ) -> None:
        layers = layer_count_problem(config, state_dict)  # before the key lists: one error naming the field
        if layers is not None:
            raise InvalidCheckpointError(f"drafter checkpoint: {layers.message}", hint=layers.fix)
        c = self._parse_config(config)
        if not c.draft_vocab_declared and LM_HEAD in state_dict:
            rows = state_dict[LM_HEAD].shape[0]
            if rows != c.vocab_size:
                raise InvalidCheckpointError(
                    f"config.json has no draft_vocab_size but lm_head.weight has {rows} rows "
                    f"(vocab_size {c.vocab_size}): SGLang and TensorRT-LLM would replace the "
                    "drafter's head with the target's",
                    hint=f"set draft_vocab_size: {rows} in config.json",
                )
        self._check_state(state_dict, c)
        _check_vocab_maps(c.vocab_size, state_dict)
        run = Run() if run is None else run
        if run.later_layer_norm not in LATER_LAYER_NORMS:
            raise UsageError(f"later_layer_norm must be one of {LATER_LAYER_NORMS}, got {run.later_layer_norm!r}")
        unknown = set(run.without) - set(SKIPPABLE)
        if unknown:
            raise UsageError(f"cannot run without {sorted(unknown)}; only without {SKIPPABLE}")
        if "fc" in run.without and c.fc_in_features != c.hidden_size:
            raise UsageError("only a drafter whose k aux states are hidden_size wide can run without fc")
        #: how this drafter is run (an engine release's reading of it; Run(): as config.json says)
        self.run = run
        #: the switches this run ignores as an engine release does (their tensors are loaded, unused)
        self.without = frozenset(run.without)
        #: the norm a later decoder layer applies to its input (vLLM: input_layernorm, SGLang: hidden_norm)
        self.later_layer_norm = run.later_layer_norm
        #: P-EAGLE run as vLLM drafts in parallel: the mask token of draft positions 2.. (None: chained)
        self.parallel_mask_token = run.parallel_mask_token
        self.config = c = self._run_config(c, run)
        self.device = torch.device(device)
        self.dtype = dtype

        def w(key: str) -> Tensor:
            return state_dict[key].to(device=self.device, dtype=dtype)

        self._names = frozenset(state_dict)
        #: tensors this run's engine reads that the checkpoint lacks: run as initialised (norms: ones)
        self.untrained: list[str] = []
        self.fc_weight = w(FC)
        self.fc_bias = w(FC_BIAS) if c.fc_bias else None
        use = self.uses
        self.fc_norm = [w(f"fc_norm.{i}.weight") for i in range(c.num_aux)] if use("fc_norm") else []
        self.input_norm = w("input_norm.weight") if use("norm_before_fc") else None
        p = FIRST_LAYER
        self._load_attention(w)
        self.gate_proj, self.up_proj, self.down_proj = (
            w(f"{p}mlp.{n}_proj.weight") for n in ("gate", "up", "down")
        )
        self.input_layernorm = w(f"{p}input_layernorm.weight")
        self.hidden_norm = w(f"{p}hidden_norm.weight")
        self.post_attention_layernorm = w(f"{p}post_attention_layernorm.weight")
        #: decoder layers 1..L-1 (a multi-layer drafter), each a dict of its weights
        self.later: list[dict[str, Any]] = [self._load_later_layer(w, f"layers.{i}.") for i in range(1, c.num_layers)]
        self.norm = w(NORM)
        self.lm_head = w(LM_HEAD)
        self.mask_hidden = w(MASK_HIDDEN).reshape(-1) if MASK_HIDDEN in state_dict else None
        d2t = state_dict.get(D2T)
        self.d2t = (
            d2t.to(device=self.device, dtype=torch.long)
            if d2t is not None
            else torch.zeros(c.draft_vocab_size, dtype=torch.long, device=self.device)
        )

        if run.own_embedding != "never" and EMBED in state_dict:
            # the drafter's own table (an engine that keeps it: "unless_equal" runs the same numbers either way)
            self.embed_tokens = w(EMBED)
            self.embedding_source = "checkpoint"
        elif embed_tokens is not None:
            if tuple(embed_tokens.shape) != (c.vocab_size, c.hidden_size):
                raise UsageError(
                    f"embed_tokens has shape {list(embed_tokens.shape)}; the drafter needs "
                    f"[{c.vocab_size}, {c.hidden_size}] (vocab_size, hidden_size)"
                )
            self.embed_tokens = embed_tokens.to(device=self.device, dtype=dtype)
            self.embedding_source = "caller"
        elif EMBED in state_dict:
            self.embed_tokens = w(EMBED)
            self.embedding_source = "checkpoint"
        else:
            raise UsageError(
                "no token embedding: the checkpoint has no embed_tokens.weight and none was given",
                hint="pass the target model's embedding matrix as embed_tokens",
            )

        if c.hidden_act in ("silu", "swish"):
            self._act = F.silu  # every known EAGLE-3 drafter; transformers' import costs seconds
        else:
            from transformers.activations import ACT2FN

            if c.hidden_act not in ACT2FN:
                raise InvalidCheckpointError(f"config.json: unknown hidden_act {c.hidden_act!r}")
            self._act = ACT2FN[c.hidden_act]
        self._init_rope(config)

    def _run_config(self, c: DrafterConfig, run: Run) -> DrafterConfig:
        """The parsed config as ``run`` runs it (the residual norm; MLA: the RoPE layout too)."""
        return c if run.norm_before_residual is None else replace(c, norm_before_residual=run.norm_before_residual)

    def uses(self, switch: str) -> bool:
        """Whether this run applies a config switch: set in config.json and not ignored (``without``)."""
        return bool(getattr(self.config, switch)) and switch not in self.without

    # ------------------------------------------------------------------ hooks
    # Eagle3MLADrafter (eagle3conv/model/mla.py) overrides these; everything else
    # (fc, the MLP, the head, d2t, SDPA and TTT attention, draft_chain) is shared.

    _attn_scale: float | None = None  # softmax scale; None = SDPA's 1/sqrt(qk head dim)
    o_bias: Tensor | None = None  # o_proj's bias (Llama drafters with attention_bias or bias)

    @staticmethod
    def _parse_config(config: Mapping[str, Any]) -> DrafterConfig:
        return DrafterConfig.from_config(config)

    def _check_state(self, state_dict: Mapping[str, Tensor], c: DrafterConfig) -> None:
        check_tensors(state_dict, c.expected(), c.spec.symbols(), "drafter checkpoint")

    def _load_attention(self, w: Any) -> None:
        att = self._load_llama_attention(w, FIRST_LAYER)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (att[n] for n in ("q", "k", "v", "o"))
        self.q_bias, self.k_bias, self.v_bias, self.o_bias = (att[f"{n}_bias"] for n in "qkvo")
        self.q_norm, self.k_norm = att["q_norm"], att["k_norm"]

    def _load_llama_attention(self, w: Any, prefix: str) -> dict[str, Any]:
        p = f"{prefix}self_attn."
        att: dict[str, Any] = {n: w(f"{p}{n}_proj.weight") for n in "qkvo"}
        # o_proj's bias: built by both engines when attention_bias or bias is set (fix-keys writes zeros if absent)
        att["o_bias"] = w(f"{p}o_proj.bias") if self.config.spec.flags()["o_bias"] else None
        # attention_bias: q/k/v biases (canonical.json: present iff set); SGLang builds q/k/v without them
        for n in "qkv":
            att[f"{n}_bias"] = w(f"{p}{n}_proj.bias") if self.uses("attention_bias") else None
        # a Qwen3 drafter: per-head RMSNorm on q and k before RoPE
        att["q_norm"], att["k_norm"] = ((w(f"{p}q_norm.weight"), w(f"{p}k_norm.weight"))
                                        if self.config.qk_norm else (None, None))
        return att

    def _load_later_layer(self, w: Any, prefix: str) -> dict[str, Any]:
        """A decoder layer after the first: its attention (:meth:`_load_later_attention`), MLP and
        norms; ``in_norm`` is the one this run normalises the layer's input with."""
        layer = {"attn": self._load_later_attention(w, prefix)}
        for n in ("gate", "up", "down"):
            layer[n] = w(f"{prefix}mlp.{n}_proj.weight")
        name = f"{prefix}{self.later_layer_norm}.weight"
        if name in self._names:
            layer["in_norm"] = w(name)
        else:  # as the engines do: a missing norm keeps its initial value, ones (docs/facts.md §11)
            layer["in_norm"] = torch.ones(self.config.hidden_size, device=self.device, dtype=self.dtype)
            self.untrained.append(name)
        layer["post_norm"] = w(f"{prefix}post_attention_layernorm.weight")
        return layer

    def _load_later_attention(self, w: Any, prefix: str) -> dict[str, Any]:
        return self._load_llama_attention(w, prefix)

    def _init_rope(self, config: Mapping[str, Any]) -> None:
        inv_freq, self._rope_scale = rope_inv_freq(config, self.config)
        self._inv_freq = inv_freq.to(self.device)

    # ------------------------------------------------------------------ pieces

    def _rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos/sin ``[S, hd]`` for integer positions, computed in fp32 like transformers."""
        freqs = positions.float()[:, None] * self._inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self._rope_scale).to(self.dtype)
        sin = (emb.sin() * self._rope_scale).to(self.dtype)
        return cos, sin

    def _project_aux(self, hidden: Tensor) -> Tensor:
        """Step 1: input_norm over the concatenation (norm_before_fc), per-chunk fc_norm (EAGLE-3.1),
        then fc; k*T -> H. The order is the engines' (vLLM combine_hidden_states, SGLang's forward)."""
        eps = self.config.rms_norm_eps
        if self.input_norm is not None:
            hidden = rms_norm(hidden, self.input_norm, eps)
        if self.fc_norm:
            chunks = hidden.chunk(self.config.num_aux, dim=-1)
            hidden = torch.cat(
                [rms_norm(x, wt, eps) for x, wt in zip(chunks, self.fc_norm, strict=True)],
                dim=-1,
            )
        return F.linear(hidden, self.fc_weight, self.fc_bias)

    # Step 1 factored per aux slot, for a caller that sums many wirings' slots (verify's screen):
    # combine(slot_projection(x_s, s) for each slot s, slot_sq_mean(x_s) for each s) is step 1's
    # output (_project_aux's; run without fc, the aux states themselves) up to rounding (the sums
    # are reassociated: tests/test_step1_pieces.py holds the two together for every variant).

    @property
    def step1_factors(self) -> bool:
        """Whether step 1 is a sum of per-slot linear maps scaled once per position (False with both
        norm_before_fc and fc_norm: the concatenation's norm does not factor through fc_norm)."""
        return not (self.input_norm is not None and self.fc_norm and "fc" not in self.without)

    @property
    def step1_bias(self) -> Tensor | None:
        """What step 1 adds after the per-slot sum: fc's bias (None: no bias, or run without fc)."""
        return None if "fc" in self.without else self.fc_bias

    def slot_projection(self, state: Tensor, slot: int, *, out: Tensor | None = None) -> Tensor:
        """Step 1's linear part of aux slot ``slot`` holding ``state`` ``[..., T]`` -> ``[..., H]``: fc's
        columns of that slot over the slot's fc_norm (EAGLE-3.1) and input_norm's weight
        (norm_before_fc; its 1/rms is :meth:`combine`'s); run without fc (SGLang's width dispatch),
        the state in the slot's place. ``out``: written there."""
        T = self.config.target_hidden_size
        cols = slice(slot * T, (slot + 1) * T)
        if "fc" in self.without:
            res = state.new_zeros(*state.shape[:-1], self.config.hidden_size) if out is None else out.zero_()
            res[..., cols] = state
            return res
        x = state
        if self.fc_norm:
            x = self.fc_norm[slot] * F.rms_norm(x, (T,), eps=self.config.rms_norm_eps)
        if self.input_norm is not None:
            x = x * self.input_norm[cols]
        return torch.matmul(x, self.fc_weight[:, cols].t(), out=out)

    def slot_sq_mean(self, state: Tensor) -> Tensor | None:
        """What :meth:`combine` needs of a slot's ``state`` for input_norm's 1/rms over the
        concatenation: its mean square ``[...]`` in fp32; None when step 1 has no such norm."""
        if self.input_norm is None or "fc" in self.without:
            return None
        return state.float().pow(2).mean(-1)

    def combine(self, parts: Iterable[Tensor], sq_means: Iterable[Tensor] | None = None, *,
                bias: Tensor | None | str = "step1") -> Tensor:
        """Step 1's output from its slots' :meth:`slot_projection` (``parts``, summed in order): times
        input_norm's 1/rms of the concatenation, ``rsqrt(mean over the slots' sq_means + eps)``
        (``sq_means``: their :meth:`slot_sq_mean`, None when that is None), plus :attr:`step1_bias`.
        Parts taken further through a linear map L (and their bias through it) are combined with
        ``bias=L(step1_bias)`` (None where :attr:`step1_bias` is None)."""
        it = iter(parts)
        g = next(it)
        for p in it:
            g = g + p
        if sq_means is not None:
            it = iter(sq_means)
            ms, n = next(it), 1
            for m in it:
                ms, n = ms + m, n + 1
            g = (g.float() * torch.rsqrt(ms / n + self.config.rms_norm_eps)[..., None]).to(g.dtype)
        b = self.step1_bias if isinstance(bias, str) else bias
        return g if b is None else g + b

    def _input_state(self, hidden: Tensor) -> Tensor:
        """Dispatch on width as SGLang does: H wide -> own state, else fc over aux states."""
        c = self.config
        hidden = hidden.to(device=self.device, dtype=self.dtype)
        width = hidden.shape[-1]
        if width == c.hidden_size:
            return hidden
        if width == c.fc_in_features:
            return self._project_aux(hidden)
        raise UsageError(
            f"hidden input has width {width}; expected {c.fc_in_features} "
            f"({c.num_aux} aux states x target_hidden_size {c.target_hidden_size}) at step 1 "
            f"or {c.hidden_size} (the drafter's own state) at later steps"
        )

    def embed(self, input_ids: Tensor, embeddings: Tensor | None = None) -> Tensor:
        """The token embeddings of ``input_ids``: rows of ``embeddings`` when given (a table the ids
        index instead: verify's captured embedding outputs, indexed by position), else of the
        drafter's table."""
        return F.embedding(input_ids.to(self.device), self.embed_tokens if embeddings is None else embeddings)

    def layer0_residual(self, g: Tensor) -> Tensor:
        """The residual layer 0 adds its attention output to: ``g``, or ``hidden_norm(g)`` where the
        run norms the residual (norm_before_residual)."""
        return rms_norm(g, self.hidden_norm, self.config.rms_norm_eps) if self.config.norm_before_residual else g

    def _layer_input(self, g: Tensor, input_ids: Tensor, embeddings: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The residual (``g``, or ``hidden_norm(g)`` with ``norm_before_residual``) and the
        attention input ``cat(input_layernorm(embed(ids)), hidden_norm(g))``, 2H wide, embedding
        first: the same for every attention the drafter may have (Llama, MLA)."""
        c = self.config
        eps = c.rms_norm_eps
        h = g.shape[-1]
        x = g.new_empty(*g.shape[:-1], 2 * h)  # the norms are written into its halves: no cat
        embeds = self.embed(input_ids, embeddings)
        rms_norm(embeds, self.input_layernorm, eps, out=x[..., :h])
        normed_g = rms_norm(g, self.hidden_norm, eps, out=x[..., h:])
        residual = normed_g if c.norm_before_residual else g
        return residual, x

    def _project(self, x: Tensor, att: Mapping[str, Any], position_offset: int | Tensor
                 ) -> tuple[Tensor, Tensor, Tensor]:
        """RoPE'd q [B,nh,S,hd] and k, v [B,nkv,S,hd] of one Llama (or Qwen3) attention over ``x``
        (``position_offset``: the RoPE position of index 0, or a tensor of each index's position)."""
        c = self.config
        b, s, _ = x.shape
        q = F.linear(x, att["q"], att["q_bias"]).view(b, s, c.num_heads, c.head_dim)
        k = F.linear(x, att["k"], att["k_bias"]).view(b, s, c.num_kv_heads, c.head_dim)
        v = F.linear(x, att["v"], att["v_bias"]).view(b, s, c.num_kv_heads, c.head_dim).transpose(1, 2)
        if att["q_norm"] is not None:  # Qwen3: per-head RMSNorm before RoPE
            q = rms_norm(q, att["q_norm"], c.rms_norm_eps)
            k = rms_norm(k, att["k_norm"], c.rms_norm_eps)
        positions = (position_offset.to(self.device) if isinstance(position_offset, Tensor)
                     else torch.arange(position_offset, position_offset + s, device=self.device))
        cos, sin = self._rope(positions)
        return apply_rope(q.transpose(1, 2), cos, sin), apply_rope(k.transpose(1, 2), cos, sin), v

    def _qkv(
        self, g: Tensor, input_ids: Tensor, position_offset: int | Tensor, embeddings: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Residual, then RoPE'd q [B,nh,S,hd] and k, v [B,nkv,S,hd] from cat(embeds, hidden)."""
        residual, x = self._layer_input(g, input_ids, embeddings)
        att = {"q": self.q_proj, "k": self.k_proj, "v": self.v_proj, "q_bias": self.q_bias, "k_bias": self.k_bias,
               "v_bias": self.v_bias, "q_norm": self.q_norm, "k_norm": self.k_norm}
        return (residual, *self._project(x, att, position_offset))

    def _later_qkv(self, h: Tensor, layer: Mapping[str, Any], position_offset: int) -> tuple[Tensor, ...]:
        """A later layer's residual (its input ``h``) and q, k, v from its normed input (H wide)."""
        x = rms_norm(h, layer["in_norm"], self.config.rms_norm_eps)
        return (h, *self._project(x, layer["attn"], position_offset))

    def _layer_end(self, residual: Tensor, attn: Tensor, o_proj: Tensor, post_norm: Tensor,
                   mlp: tuple[Tensor, Tensor, Tensor], o_bias: Tensor | None = None) -> Tensor:
        """o_proj + residual, then the SwiGLU MLP + residual: one decoder layer's output."""
        b, _, s, _ = attn.shape
        attn = attn.transpose(1, 2).reshape(b, s, -1)  # num_heads * value head dim
        h = residual + F.linear(attn, o_proj, o_bias)
        x = rms_norm(h, post_norm, self.config.rms_norm_eps)
        gate, up, down = mlp
        return h + F.linear(self._act(F.linear(x, gate)) * F.linear(x, up), down)

    def _layers(self, residual: Tensor, attn: Tensor, position_offset: int, attend) -> Tensor:
        """Layer 0's end, then every later layer; ``attend(i, q, k, v)`` is layer i's attention."""
        h = self._layer_end(residual, attn, self.o_proj, self.post_attention_layernorm,
                            (self.gate_proj, self.up_proj, self.down_proj), self.o_bias)
        for i, layer in enumerate(self.later, 1):
            res, q, k, v = self._later_qkv(h, layer, position_offset)
            h = self._layer_end(res, attend(i, q, k, v), layer["attn"]["o"], layer["post_norm"],
                                (layer["gate"], layer["up"], layer["down"]), layer["attn"].get("o_bias"))
        return h

    def _head(self, h: Tensor) -> StepOutput:
        """Final norm, head, d2t; the next step's state (post-norm with norm_output)."""
        normed = rms_norm(h, self.norm, self.config.rms_norm_eps)
        logits = F.linear(normed, self.lm_head)
        return StepOutput(logits=logits, hidden=normed if self.uses("norm_output") else h, d2t=self.d2t)

    def _causal(self, i: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.gqa, scale=self._attn_scale)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        """Layer 0's attention of ``q`` over ``k``, ``v`` (SDPA with this drafter's key/value heads and
        softmax scale): under the boolean ``mask`` ``[Sq, Sk]``, causal without one."""
        if mask is None:
            return self._causal(0, q, k, v)
        b, hq, s, d = q.shape
        hk = k.shape[1]
        if self.gqa and hq != hk and mask.dim() == 2 and q.device.type == "cpu":
            # the heads that share a key head as one longer query block: the same attention, and on a CPU
            # about a fifth faster than SDPA's enable_gqa (bench/README.md, issue 30 third round)
            g = hq // hk
            out = F.scaled_dot_product_attention(q.reshape(b, hk, g * s, d), k, v, attn_mask=mask.repeat(g, 1),
                                                 scale=self._attn_scale)
            return out.view(b, hq, s, -1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.gqa, scale=self._attn_scale)

    def _finish(self, residual: Tensor, attn: Tensor, position_offset: int = 0) -> StepOutput:
        """o_proj + residual, SwiGLU MLP + residual, any later layers (causal attention), head, d2t."""
        return self._head(self._layers(residual, attn, position_offset, self._causal))

    @property
    def attn_scale(self) -> float | None:
        """The softmax scale attention uses (None: SDPA's ``1/sqrt(qk head dim)``; MLA: yarn's)."""
        return self._attn_scale

    @property
    def drafts_columns(self) -> bool:
        """Whether :meth:`draft_chain` can draft chosen chain starts only (``columns``): a one-layer
        Llama-attention step (later layers attend over every index's layer-0 output, and MLA
        computes its attention input its own way), drafting in a chain as built (not P-EAGLE's parallel
        drafting, whose mask slots follow every index)."""
        return (not self.later and self.parallel_mask_token is None and type(self)._qkv is Eagle3Drafter._qkv
                and type(self)._project is Eagle3Drafter._project and type(self)._layers is Eagle3Drafter._layers)

    @property
    def gqa(self) -> bool:
        """Grouped-query attention: fewer key/value heads than query heads."""
        return self.config.num_kv_heads != self.config.num_heads

    # ------------------------------------------------------------------ public

    @torch.inference_mode()
    def forward(self, hidden: Tensor, input_ids: Tensor, *, position_offset: int = 0,
                embeddings: Tensor | None = None) -> StepOutput:
        """One draft step over whole sequences with plain causal attention.

        Args:
            hidden: ``[B, S, k*T]`` concatenated target aux states (step 1; ``fc`` is
                applied) or ``[B, S, H]`` the drafter's own previous state (steps 2+;
                ``fc`` is skipped). The width decides, as in SGLang.
            input_ids: ``[B, S]`` target-vocab token ids; ``input_ids[:, t]`` is the token
                that follows the state ``hidden[:, t]`` (SGLang's draft-extend layout:
                tokens shifted left by one against the states).
            position_offset: RoPE position of index 0.
            embeddings: a table ``input_ids`` index instead of the drafter's (:meth:`embed`).

        ``logits[:, t]`` guesses the token after ``input_ids[:, t]``. Right-padded
        batches are fine: attention is causal, so padding only affects its own rows.
        Every decoder layer runs (layer 0 on cat(embedding, state), later ones on the
        previous layer's output).
        """
        g = self._input_state(hidden)
        residual, q, k, v = self._qkv(g, input_ids, position_offset, embeddings)
        return self._finish(residual, self._causal(0, q, k, v), position_offset)

    __call__ = forward

    # One step in pieces, for tests and benchmarks that put their own attention
    # between the two halves: ``finish(residual, attn(q, k, v))`` is ``forward``.

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos/sin ``[S, rope dim]`` for integer positions, in the drafter's dtype."""
        return self._rope(positions)

    @property
    def rope_scale(self) -> float:
        """The factor cos/sin are multiplied by (yarn's attention factor; 1.0 for plain RoPE)."""
        return self._rope_scale

    def attention_inputs(
        self, hidden: Tensor, input_ids: Tensor, *, position_offset: int = 0, embeddings: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The first half of :meth:`forward`: residual, then layer 0's RoPE'd q ``[B,nh,S,d]``, k and v.

        ``hidden`` is ``[B, S, k*T]`` aux states (``fc`` applied) or ``[B, S, H]`` the
        drafter's own state, as in :meth:`forward` (``embeddings`` too).
        """
        return self._qkv(self._input_state(hidden), input_ids, position_offset, embeddings)

    def finish(self, residual: Tensor, attn: Tensor, *, position_offset: int = 0) -> StepOutput:
        """The second half of :meth:`forward`: o_proj + residual, MLP, any later layers (with causal
        attention), head, d2t. ``attn`` is layer 0's attention output ``[B, heads, S, value head dim]``.
        """
        return self._finish(residual, attn, position_offset)

    @torch.inference_mode()
    def draft_chain(
        self,
        aux: Tensor,
        input_ids: Tensor,
        num_steps: int,
        *,
        teacher_forcing: bool = True,
        return_logits: bool = False,
        chunk_size: int = 512,
        parallel: bool | None = None,
        embeddings: Tensor | None = None,
        columns: Tensor | None = None,
    ) -> DraftChain:
        """Run ``num_steps`` draft steps over whole sequences, as EAGLE-3's training-time test.

        Layout: ``input_ids[:, t]`` is token ``x_t`` and ``aux[:, t]`` the target's aux
        states at position ``t`` (captured in the same forward, so the target's own
        next-token guess from it is ``x_{t+1}``). Steps are 1-based, chains start at t:

        * step 1 at t reads ``(aux[t], x_{t+1})`` at RoPE position ``t`` and guesses
          ``x_{t+2}``;
        * step k at t reads ``(h_{k-1}[t], x_{t+k})`` at position ``t+k-1``, where
          ``h_{k-1}[t]`` is step k-1's state at the *same* index, and guesses ``x_{t+k+1}``.

        So ``result.target_ids[k-1, :, t]`` is compared with ``input_ids[:, t+k+1]``
        (``result.labels``). This is SGLang's draft chain: after the target emits
        ``x_{t+1}`` from position t, the drafter proposes ``x_{t+2}, x_{t+3}, ...``, and
        greedy verification accepts draft k iff drafts 1..k-1 were accepted and
        draft k equals the target's token. With ``teacher_forcing`` (default, as
        SpecForge and speculators train), step k reads the reference token
        ``x_{t+k}`` instead of its own step k-1 guess; when ``input_ids`` is the
        target's greedy output the two agree on every accepted prefix, so
        :meth:`DraftChain.accept_lengths` is exact either way. Positions past the
        end read token 0 and have label -1.

        Attention, as SpecForge's ``LlamaAttention`` with ``cache_hidden`` and
        speculators' TTT mask: step 1 is causal over the sequence; at step k the
        query at t attends to step 1's keys at positions ``0..t`` plus steps
        2..k's keys at index t only (the chain's own earlier drafts), exactly as
        SGLang's KV cache holds them during one draft chain. Each decoder layer keeps
        its own keys. It is exact, computed with SDPA in query chunks of ``chunk_size``
        to bound memory.

        ``parallel`` (P-EAGLE, vLLM's parallel drafting; None: as built, ``parallel_mask_token``):
        steps 2..K are not chained but drafted in the same pass as step 1: step k at t reads the
        mask token (``parallel_mask_token``, else config.json's ``mask_token_id``) and
        ``fc(mask_hidden)`` at position ``t+k-1``, attending step 1's keys at ``0..t`` and the mask
        slots before it, as vLLM's proposer lays them out.

        ``embeddings``: a table the ids index instead of the drafter's (:meth:`embed`; verify: the
        captured embedding outputs, the ids being positions).

        ``columns`` (ascending indices; only where :attr:`drafts_columns`): the chains started at
        those indices only. Step 1's keys and values are still computed at every index (each chain
        attends to them); the rest of step 1 and every later step run at ``columns`` alone, so the
        result's ``[K, B, len(columns)]`` equals the full chain's at those indices up to rounding.
        """
        c = self.config
        if num_steps < 1:
            raise UsageError(f"num_steps must be >= 1, got {num_steps}")
        if aux.shape[-1] != c.fc_in_features:
            raise UsageError(
                f"aux has width {aux.shape[-1]}; expected {c.fc_in_features} "
                f"({c.num_aux} x target_hidden_size {c.target_hidden_size})"
            )
        if aux.shape[:2] != input_ids.shape:
            raise UsageError(
                f"aux is {list(aux.shape[:2])} positions, input_ids {list(input_ids.shape)}"
            )
        if parallel is None:
            parallel = self.parallel_mask_token is not None
        mask_token = self.parallel_mask_token if self.parallel_mask_token is not None else c.mask_token_id
        if parallel and (self.mask_hidden is None or mask_token is None):
            raise UsageError("parallel drafting needs mask_hidden and a mask token id in config.json "
                             "(mask_token_id, or pard_token / ptd_token_id as vLLM also reads them)")
        ids = input_ids.to(self.device).long()
        seq = ids.shape[1]
        cols = None
        if columns is not None:
            if parallel or not self.drafts_columns:
                raise UsageError("draft_chain(columns=...) needs a one-layer Llama-attention drafter drafting in a chain")
            cols = columns.to(self.device).long()

        def shifted(n: int) -> Tensor:  # x_{t+n} at index t, 0 past the end
            out = torch.zeros_like(ids)
            if n < seq:
                out[:, : seq - n] = ids[:, n:]
            return out

        def labels(n: int) -> Tensor:  # x_{t+n} at index t, -1 past the end
            out = torch.full_like(ids, -1)
            if n < seq:
                out[:, : seq - n] = ids[:, n:]
            return out

        def at_starts(x: Tensor) -> Tensor:  # [B, S] at the chains drafted (every index without columns)
            return x if cols is None else x[:, cols]

        tokens = shifted(1)
        # step 1 reads the target's aux states: through fc, unless this run is an engine that dispatches
        # on width and k x T equals H (SGLang: "fc" in without); fc_in == H makes the width ambiguous
        state = (aux.to(device=self.device, dtype=self.dtype) if "fc" in self.without
                 else self._project_aux(aux.to(device=self.device, dtype=self.dtype)))
        mask_state = None
        if parallel:
            mask_state = self._project_aux(self.mask_hidden.to(self.dtype)).expand_as(state)
        caches: list[ChainKeys | None] = [None] * c.num_layers
        target_ids, all_logits = [], []
        for step in range(num_steps):

            def attend(i: int, q: Tensor, k: Tensor, v: Tensor, step: int = step) -> Tensor:
                if step == 0:
                    if num_steps > 1:
                        caches[i] = ChainKeys(k, v, num_steps - 1, chunk_size, cols)
                    if cols is not None:  # the chains' starts only, over step 1's keys at every index
                        return self.attention(q[:, :, cols], k, v,
                                              torch.arange(seq, device=self.device)[None, :] <= cols[:, None])
                    return self._causal(i, q, k, v)
                cache = caches[i]
                assert cache is not None
                cache.add(k, v)
                return cache.attention(q, enable_gqa=self.gqa, scale=self._attn_scale)

            at = step if cols is None or step == 0 else cols + step  # step k at index t: RoPE position t + k - 1
            residual, q, k, v = self._qkv(state, tokens, at, embeddings)
            if step == 0 and cols is not None:
                residual = residual[:, cols]
            out = self._head(self._layers(residual, attend(0, q, k, v), step, attend))
            target_ids.append(out.target_ids)
            if return_logits:
                all_logits.append(out.logits)
            if parallel:
                state = mask_state
                tokens = torch.full_like(ids, int(mask_token))  # type: ignore[arg-type]
            else:
                state = out.hidden
                tokens = at_starts(shifted(step + 2)) if teacher_forcing else out.target_ids
        return DraftChain(
            target_ids=torch.stack(target_ids),
            labels=torch.stack([at_starts(labels(k + 2)) for k in range(num_steps)]),
            logits=torch.stack(all_logits) if return_logits else None,
        )

    def ttt_attention(
        self, q: Tensor, keys: list[Tensor], values: list[Tensor], chunk_size: int
    ) -> Tensor:
        """Query t attends keys[0][:t+1] (causal) and keys[j][t] for j >= 1 (diagonal).

        The attention :meth:`draft_chain` runs at step ``len(keys)``; see :class:`ChainKeys`.
        """
        cache = ChainKeys(keys[0], values[0], len(keys) - 1, chunk_size)
        for k, v in zip(keys[1:], values[1:], strict=True):
            cache.add(k, v)
        return cache.attention(q, enable_gqa=self.gqa, scale=self._attn_scale)


class ChainKeys:
    """One draft chain's keys and values, for the training-time-test attention of steps 2+.

    At step k the query at t attends step 1's keys at ``0..t`` (causal) and the keys of
    steps 2..k at index t only (the chain's own drafts). Per query chunk ``[a, b)``
    that is one SDPA call over ``[diag_2 | ... | diag_k | keys_1[:b]]`` with the mask
    ``[eye ... eye | all a | causal]`` (key order does not change attention). Step 1's
    keys are copied once, after a region of ``extra_steps * chunk`` rows; each chunk
    writes only its diagonal keys into that region, so the keys SDPA reads are one
    contiguous slice and nothing is concatenated per chunk. Buffers are sequence-major
    (``[B, rows, heads, dim]``, read through a transposed view), as flash attention
    stores them.
    """

    def __init__(self, k0: Tensor, v0: Tensor, extra_steps: int, chunk_size: int, cols: Tensor | None = None) -> None:
        b, heads, seq, _ = k0.shape
        self.seq = seq  # queries: one per index, or one per chain start in ``cols`` (ascending)
        self.cols = cols
        if cols is not None:
            self.seq = int(cols.numel())
            self.ends = (cols + 1).tolist()  # query i attends step 1's keys 0..cols[i]
        self.chunk = max(1, min(chunk_size, self.seq))
        self.pad = extra_steps * self.chunk
        self.k = k0.new_empty(b, self.pad + seq, heads, k0.shape[-1])
        self.v = v0.new_empty(b, self.pad + seq, heads, v0.shape[-1])
        self.k[:, self.pad :].copy_(k0.transpose(1, 2))
        self.v[:, self.pad :].copy_(v0.transpose(1, 2))
        self.extra_k: list[Tensor] = []
        self.extra_v: list[Tensor] = []
        self.capacity = extra_steps

    def add(self, k: Tensor, v: Tensor) -> None:
        """The keys and values of the next step (``[B, heads, S, dim]``, any strides)."""
        if len(self.extra_k) >= self.capacity:
            raise ValueError(f"ChainKeys holds {self.capacity} later steps")
        self.extra_k.append(k)
        self.extra_v.append(v)

    def attention(self, q: Tensor, *, enable_gqa: bool, scale: float | None) -> Tensor:
        """Attention of the latest step's queries ``q`` ``[B, heads, S, dim]``."""
        seq, n = self.seq, len(self.extra_k)
        out = q.new_empty(*q.shape[:-1], self.v.shape[-1])  # value head dim (MLA: != q's)
        device = q.device
        for a in range(0, seq, self.chunk):
            b = min(a + self.chunk, seq)
            size = b - a
            lo = self.pad - n * size
            for j, (kj, vj) in enumerate(zip(self.extra_k, self.extra_v, strict=True)):
                rows = slice(lo + j * size, lo + (j + 1) * size)
                self.k[:, rows].copy_(kj[:, :, a:b].transpose(1, 2))
                self.v[:, rows].copy_(vj[:, :, a:b].transpose(1, 2))
            end = b if self.cols is None else self.ends[b - 1]  # step 1's keys the chunk's last query reads
            k = self.k[:, lo : self.pad + end].transpose(1, 2)
            v = self.v[:, lo : self.pad + end].transpose(1, 2)
            eye = torch.eye(size, dtype=torch.bool, device=device)
            if self.cols is None:
                causal = torch.cat([torch.ones(size, a, dtype=torch.bool, device=device),
                                    torch.ones(size, size, dtype=torch.bool, device=device).tril()], dim=1)
            else:
                causal = torch.arange(end, device=device)[None, :] <= self.cols[a:b, None]
            mask = torch.cat([eye.repeat(1, n), causal], dim=1)
            out[:, :, a:b] = F.scaled_dot_product_attention(
                q[:, :, a:b], k, v, attn_mask=mask, enable_gqa=enable_gqa, scale=scale
            )
        return out


# --------------------------------------------------------------------------- smoke test


@dataclass(frozen=True)
class SmokeTestResult:
    """What :func:`smoke_test` saw. ``ok`` is true when ``findings`` is empty."""

    ok: bool
    findings: tuple[Finding, ...]
    """One error (area ``smoke``) per problem; ``subject`` is the step."""
    step1_input_width: int  # k*T
    step2_input_width: int  # H
    logits_width: int  # Vd
    vocab_size: int  # V
    embedding_source: str  # "caller", "checkpoint" or "random"
    engine_notes: tuple[str, ...] = ()  # MLA: where SGLang and vLLM differ on this config

    @property
    def problems(self) -> tuple[str, ...]:
        return tuple(f.message for f in self.findings)


@torch.inference_mode()
def smoke_test(
    config: Mapping[str, Any],
    state_dict: Mapping[str, Tensor],
    device: torch.device | str = "cpu",
    *,
    dtype: torch.dtype = torch.float32,
    embed_tokens: Tensor | None = None,
    batch: int = 2,
    seq_len: int = 8,
    seed: int = 0,
) -> SmokeTestResult:
    """Load strictly, then run random inputs at step 1 (k*T wide) and step 2 (H wide).

    Llama-style and MLA drafters alike (the class follows the config's architecture).
    Checks: outputs finite, logits ``Vd`` wide, d2t-mapped targets inside ``[0, V)``,
    and the step-2 state ``H`` wide. Without any embedding, a random one is used
    (the check is structural). Loading errors are raised, not reported.
    """
    from eagle3conv.model import drafter_class

    cls = drafter_class(config, state_dict.keys())  # Eagle3Drafter or Eagle3MLADrafter
    c = cls._parse_config(config)
    gen = torch.Generator().manual_seed(seed)
    source = None
    if embed_tokens is None and EMBED not in state_dict:
        embed_tokens = torch.randn(c.vocab_size, c.hidden_size, generator=gen) * 0.02
        source = "random"
    drafter = cls(config, state_dict, device=device, dtype=dtype, embed_tokens=embed_tokens)
    aux = torch.randn(batch, seq_len, c.fc_in_features, generator=gen)
    ids = torch.randint(0, c.vocab_size, (batch, seq_len), generator=gen)
    problems: list[Finding] = []

    def problem(code: str, step: str, message: str) -> None:
        problems.append(Finding("error", SMOKE, code, message, subject=step))

    out1 = drafter.forward(aux, ids)
    out2 = drafter.forward(out1.hidden, ids, position_offset=1)
    for name, out in (("step 1", out1), ("step 2", out2)):
        if out.logits.shape != (batch, seq_len, c.draft_vocab_size):
            problem(LOGITS_SHAPE, name, f"{name}: logits shape {list(out.logits.shape)}")
        if not torch.isfinite(out.logits).all():
            problem(NONFINITE_LOGITS, name, f"{name}: non-finite logits")
        if not torch.isfinite(out.hidden).all():
            problem(NONFINITE_HIDDEN, name, f"{name}: non-finite hidden state")
        if out.hidden.shape[-1] != c.hidden_size:
            problem(STATE_WIDTH, name, f"{name}: state width {out.hidden.shape[-1]} != {c.hidden_size}")
        if ((out.target_ids < 0) | (out.target_ids >= c.vocab_size)).any():
            problem(PREDICTION_OUT_OF_VOCAB, name, f"{name}: d2t maps a prediction outside [0, {c.vocab_size})")
    return SmokeTestResult(
        ok=not problems,
        findings=tuple(problems),
        step1_input_width=c.fc_in_features,
        step2_input_width=c.hidden_size,
        logits_width=c.draft_vocab_size,
        vocab_size=c.vocab_size,
        embedding_source=source or drafter.embedding_source,
        engine_notes=tuple(getattr(drafter, "engine_notes", ())),
    )


# --------------------------------------------------------------------------- MLA


def expected_mla_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of an MLA drafter (``Eagle3DeepseekV2ForCausalLM``), canonical names.

    Follows SGLang's ``kimi_k25_eagle3.py``: DeepSeek-V2 MLA with ``q_lora_rank``,
    whose first projections (``q_a_proj``, ``kv_a_proj_with_mqa``) read the ``2H``
    wide ``cat(input_layernorm(embed), hidden_norm(h))``; a dense SwiGLU MLP of
    ``intermediate_size``; ``fc`` over ``k`` aux states (k from the aux ids, else 3);
    per-chunk ``fc_norm`` when ``fc_norm`` (or legacy ``use_aux_norm``) is set.
    The table is mappings/canonical.json's "mla" rows (:func:`eagle3conv.spec.canonical.expected`).
    """
    if config.get("q_lora_rank") is None:
        raise InvalidCheckpointError(
            "config.json: q_lora_rank is missing; SGLang's Eagle3 MLA layer requires it"
        )
    for name in ("hidden_size", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
                 "qk_rope_head_dim", "v_head_dim", "intermediate_size", "vocab_size"):
        require_int(config, name)
    return _shapes(_mla_table(config))


def _mla_table(config: Mapping[str, Any]) -> dict[str, ExpectedTensor]:
    spec = DrafterSpec.from_config(config, validate=False, architecture="mla")
    return expected(spec.with_(k=spec.k or 3))


def check_mla_shapes(config: Mapping[str, Any], state_dict: Mapping[str, Tensor]) -> None:
    """Structural check of an MLA drafter: every key present, expected and correctly shaped.

    Only shapes (and the vocab maps' ranges) are checked; there is no MLA forward.
    ``t2d`` and ``embed_tokens.weight`` are optional; ``d2t`` is optional when the
    draft vocab is the full vocab (SGLang's MLA loader accepts its absence).
    Raises InvalidCheckpointError naming the offending keys.
    """
    expected_mla_shapes(config)  # the config's required fields checked first
    vocab = int(config["vocab_size"])
    spec = DrafterSpec.from_config(config, validate=False, architecture="mla")
    check_tensors(state_dict, _mla_table(config), spec.with_(k=spec.k or 3).symbols(), "MLA drafter checkpoint")
    _check_vocab_maps(vocab, state_dict)
