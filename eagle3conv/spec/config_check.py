"""One validator for the drafter config fields the engines read: types and ranges.

A table, not code per field: each entry names the field, what it must be, and
whether the engines need it. ``check_drafter_config`` lists every violation
(field, value, what is expected); ``validate_drafter_config`` raises them as one
:class:`InvalidCheckpointError` (exit 3). inspect, fix-keys, config, verify and
push's gate all go through it, so a config no engine can load is never written
or served.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from eagle3conv.errors import InvalidCheckpointError
from eagle3conv.findings import CONFIG, LAYER_COUNT, Finding
from eagle3conv.spec.drafter import AUX_KEY, NESTED_AUX_FIELD, architecture_key, aux_ids
from eagle3conv.spec.layers import MAX_LAYERS
from eagle3conv.spec.variants import switches

# kind: "pos_int" (integer >= 1), "layer_count" (1..MAX_LAYERS), "pos_num" (finite number > 0), "bool", "str", "dict", "str_list",
# "int_list"; required: the drafter cannot be built without it. null counts as absent (the third column
# records which fields HF configs write as null).
FIELDS: dict[str, tuple[str, bool, bool]] = {
    "hidden_size": ("pos_int", True, False),
    "num_attention_heads": ("pos_int", True, False),
    "intermediate_size": ("pos_int", True, False),
    "num_key_value_heads": ("pos_int", False, True),
    "head_dim": ("pos_int", False, True),
    "vocab_size": ("pos_int", False, True),
    "draft_vocab_size": ("pos_int", False, True),
    "target_hidden_size": ("pos_int", False, True),
    "num_hidden_layers": ("layer_count", False, True),
    "max_position_embeddings": ("pos_int", False, True),
    "rms_norm_eps": ("pos_num", False, True),
    "rope_theta": ("pos_num", False, True),
    "rope_scaling": ("dict", False, True),
    "rope_parameters": ("dict", False, True),
    # MLA (DeepSeek-style) drafters; q_lora_rank is null in models without a query LoRA
    "q_lora_rank": ("pos_int", False, True),
    "kv_lora_rank": ("pos_int", False, True),
    "qk_nope_head_dim": ("pos_int", False, True),
    "qk_rope_head_dim": ("pos_int", False, True),
    "v_head_dim": ("pos_int", False, True),
    "tie_word_embeddings": ("bool", False, True),
    # the config fields that set a switch (mappings/variants.json's on_when flags and fields)
    **{f: ("bool", False, True) for s in switches() for f in s.on_when.config_fields},
    "num_aux_hidden_states": ("layer_count", False, True),
    "mask_token_id": ("nonneg_int", False, True),
    "mlp_bias": ("bool", False, True),
    "hidden_act": ("str", False, True),
    "model_type": ("str", False, True),
    "architectures": ("str_list", False, True),
    AUX_KEY: ("int_list", False, True),
}
# numbers inside rope_scaling / rope_parameters that must be finite and positive when present
ROPE_NUMBERS = ("factor", "rope_theta", "original_max_position_embeddings", "beta_fast", "beta_slow",
                "low_freq_factor", "high_freq_factor", "mscale", "mscale_all_dim", "attention_factor")
MAX_INT = 2**31 - 1  # engines keep sizes in 32-bit ints
EXPECTED = {
    "pos_int": "an integer from 1 to 2^31-1",
    "layer_count": f"an integer from 1 to {MAX_LAYERS}",
    "nonneg_int": "an integer from 0 to 2^31-1",
    "pos_num": "a finite number > 0",
    "bool": "true or false",
    "str": "a string",
    "dict": "an object",
    "str_list": "a list of strings",
    "int_list": "a list of integers",
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _ok(kind: str, v: Any) -> bool:
    if kind == "pos_int":
        return _is_int(v) and 1 <= v <= MAX_INT
    if kind == "layer_count":  # a count of layers or slots: every range built from it stays small
        return _is_int(v) and 1 <= v <= MAX_LAYERS
    if kind == "nonneg_int":
        return _is_int(v) and 0 <= v <= MAX_INT
    if kind == "pos_num":
        return (_is_int(v) or isinstance(v, float)) and math.isfinite(v) and v > 0
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "str":
        return isinstance(v, str)
    if kind == "dict":
        return isinstance(v, dict)
    if kind == "str_list":
        return isinstance(v, list) and all(isinstance(x, str) for x in v)
    if kind == "int_list":
        return isinstance(v, list) and all(_is_int(x) for x in v)
    raise AssertionError(kind)


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _nonfinite(config: Mapping[str, Any], where: str) -> list[tuple[str, str]]:
    """NaN / Infinity anywhere in the config, as (field path, message): no engine's JSON parser reads
    them back."""
    out, stack = [], [("", config)]
    while stack:
        prefix, node = stack.pop()
        items = node.items() if isinstance(node, Mapping) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            name = f"{prefix}.{k}" if isinstance(k, str) and prefix else f"{prefix}[{k}]" if not isinstance(k, str) else k
            if isinstance(v, float) and not math.isfinite(v):
                out.append((name, f"{where}: {name} is {v!r}; expected a finite number (NaN and Infinity are not JSON)"))
            elif isinstance(v, (Mapping, list)):
                stack.append((name, v))
    return sorted(set(out))


def check_fields(config: Any, names, where: str = "config.json") -> list[str]:
    """Only the named fields' types and ranges (for a raw source config read before the drafter's
    own config is known, e.g. ``architectures`` during format detection)."""
    if not isinstance(config, Mapping):
        return []
    out = []
    for name in names:
        kind = FIELDS[name][0]
        if config.get(name) is not None and not _ok(kind, config[name]):
            out.append(f"{where}: {name} is {_show(config[name])}; expected {EXPECTED[kind]}")
    return out


def check_drafter_config(config: Mapping[str, Any], where: str = "config.json") -> list[str]:
    """Every violation in ``config``, each naming the field, its value and what is expected."""
    if not isinstance(config, Mapping):
        return [f"{where}: expected a JSON object, got {type(config).__name__}"]
    by_field: dict[str, str] = {}  # field path -> its one problem (a type problem wins over NaN)
    for name, (kind, required, _nullable) in FIELDS.items():
        if name not in config or config[name] is None:
            if required:
                by_field[name] = f"{where}: {name} is missing; expected {EXPECTED[kind]}"
            continue
        v = config[name]
        if not _ok(kind, v):
            by_field[name] = f"{where}: {name} is {_show(v)}; expected {EXPECTED[kind]}"
    for block in ("rope_scaling", "rope_parameters"):
        rope = config.get(block)
        if isinstance(rope, dict):
            for key in ROPE_NUMBERS:
                if rope.get(key) is not None and not _ok("pos_num", rope[key]):
                    by_field[f"{block}.{key}"] = (f"{where}: {block}.{key} is {_show(rope[key])}; "
                                                  f"expected {EXPECTED['pos_num']}")
    ids = aux_ids(config).nested
    if ids is not None and not _ok("int_list", ids):
        by_field[NESTED_AUX_FIELD] = f"{where}: {NESTED_AUX_FIELD} is {_show(ids)}; expected {EXPECTED['int_list']}"
    for name, message in _nonfinite(config, where):
        by_field.setdefault(name, message)
    problems: list[str] = list(by_field.values())
    if problems:
        return problems
    # relations between valid fields
    h, nh, nkv = config["hidden_size"], config["num_attention_heads"], config.get("num_key_value_heads")
    mla = architecture_key(config) == "mla" or config.get("kv_lora_rank") is not None
    if config.get("head_dim") is None and not mla and h % nh:
        problems.append(f"{where}: hidden_size {h} is not divisible by num_attention_heads {nh} and there is no "
                        "head_dim; expected head_dim, or heads that divide hidden_size")
    if nkv is not None and nh % nkv:
        problems.append(f"{where}: num_attention_heads {nh} is not a multiple of num_key_value_heads {nkv}")
    vocab, draft = config.get("vocab_size"), config.get("draft_vocab_size")
    if vocab is not None and draft is not None and draft > vocab:
        problems.append(f"{where}: draft_vocab_size {draft} is larger than vocab_size {vocab}")
    problems += _mask_token_past_vocab(config, vocab, where)
    return problems


def _mask_token_past_vocab(config: Mapping[str, Any], vocab: int | None, where: str) -> list[str]:
    """The P-EAGLE mask token id, where vLLM reads it (the engine rules' ``mask_token_fields``), is a
    row of the embedding vLLM builds with ``vocab_size`` rows (docs/facts.md §11): an id past it
    embeds no token."""
    from eagle3conv.spec.engines import mask_token

    token = mask_token("vllm", config)
    if vocab is None or token is None or token < vocab:
        return []
    return [f"{where}: the P-EAGLE mask token id is {token}, but vocab_size is {vocab}: vLLM embeds the mask "
            f"token with the drafter's {vocab}-row embedding (ids 0..{vocab - 1}), which has no row {token}; "
            "expected the id of the token the run masked the parallel slots with"]


def layer_count_problem(config: Mapping[str, Any] | None, tensor_names, *, where: str = "config.json",
                        ckpt: str = "CKPT") -> Finding | None:
    """``num_hidden_layers`` against the decoder layers the weights hold (``tensor_names`` in SGLang's
    names: layer 0 ``midlayer.*``, then ``layers.{i}.*``): the engines build ``num_hidden_layers`` layers
    whatever the weights hold (docs/facts.md §11), so a difference is an error (area config, code
    ``layer-count``) naming what each release does and the fix; None when they agree. A gap between
    layers is the plan's own error (``layer-missing``), not this one."""
    from eagle3conv.spec.canonical import layer_of
    from eagle3conv.spec.engines import drafter_kind, layer_count_outcomes, layers_span

    n = config.get("num_hidden_layers") if isinstance(config, Mapping) else None
    found = [i for name in tensor_names if (i := layer_of(name)) is not None]
    if not _is_int(n) or n < 1 or not found:
        return None
    held = max(found) + 1
    if held == n:
        return None
    names = "midlayer.*" + (f", layers.1.*{'' if held == 2 else f' .. layers.{held - 1}.*'}" if held > 1 else "")
    engines = "; ".join(layer_count_outcomes(n, held, drafter_kind(config)))
    fix = (f"eagle3conv fix-keys {ckpt} rewrites num_hidden_layers to {held} (or set \"num_hidden_layers\": "
           f"{held} in {where})")
    if n > held:
        fix += f"; if the trained drafter had {layers_span(held, n - 1)} too, convert the trainer's checkpoint again"
    return Finding(
        "error", CONFIG, LAYER_COUNT,
        f"{where}: num_hidden_layers is {n}, but the weights hold {held} decoder layer{'s' if held != 1 else ''} "
        f"({names}): " + (engines or f"the engines build {n}") + " (docs/facts.md §11)", fix,
        subject="num_hidden_layers")


def validate_drafter_config(config: Mapping[str, Any], where: str = "config.json", *,
                            only: tuple[str, ...] | None = None) -> None:
    """Raise :class:`InvalidCheckpointError` (exit 3) listing every violation, if any
    (``only``: just those fields)."""
    problems = check_drafter_config(config, where) if only is None else check_fields(config, only, where)
    if problems:
        first = problems[0]
        raise InvalidCheckpointError(
            f"{first}" + (f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})"
                          if len(problems) > 1 else ""),
            details=problems,
            hint="correct these fields in the drafter's config.json (or pass a correct one with --config)",
        )
