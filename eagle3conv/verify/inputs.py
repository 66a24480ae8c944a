"""What ``verify`` reads before scoring: the drafter, where to run it, the target's embeddings, the labels.

* :func:`load_drafter_weights` / :func:`build_drafter`: a fixed (canonical,
  safetensors) drafter folder → :class:`eagle3conv.model.drafter.Eagle3Drafter`,
  and whether it embeds from the captured embedding output.
* :func:`load_target_embeddings`: the target's ``[V, H]`` token embedding, for
  states that hold no embedding output.
* :func:`data_labels`: the reference tokens of states that hold no target
  predictions: the data's own next tokens.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from eagle3conv.errors import CheckpointReadError, UsageError, WiringError


def load_drafter_weights(root: Path) -> tuple[dict, dict]:
    """config.json and every tensor of a canonical (fixed) drafter folder."""
    from safetensors.torch import load_file

    from eagle3conv.checkpoint.index import open_checkpoint
    from eagle3conv.checkpoint.writer import prepared

    with prepared(root, "verify", write=False):  # a live fix-keys is waited for; an interrupted one finished
        index = open_checkpoint(root)
        if index.config is None:
            raise UsageError(f"{root}: no config.json", hint=f"eagle3conv fix-keys {root}")
        if index.layout not in ("safetensors", "safetensors-sharded"):
            raise UsageError(f"{root}: verify reads a fixed safetensors drafter, this is {index.layout}",
                             hint=f"eagle3conv fix-keys {root} --out FIXED, then verify FIXED")
        tensors: dict = {}
        for f in index.weight_files:
            tensors.update(load_file(str(f)))
        return index.config, tensors


EMBED_NAMES = ("model.embed_tokens.weight", "embed_tokens.weight", "model.language_model.embed_tokens.weight",
                "language_model.model.embed_tokens.weight", "transformer.wte.weight", "model.embed.weight")


def load_target_embeddings(path: str | os.PathLike, vocab: int, hidden: int):
    """The target's token embedding ``[V, H]`` from its safetensors (a file, or a model
    folder, sharded or not), reading only that tensor."""
    from safetensors import safe_open

    p = Path(path)
    files = [p] if p.is_file() else sorted(p.glob("*.safetensors")) if p.is_dir() else []
    if not files:
        raise UsageError(f"--embeddings {p}: no safetensors file there",
                         hint="give the target model's folder or the .safetensors file holding its embed_tokens")
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                name = next((n for n in EMBED_NAMES if n in st.keys()), None)
                if name is None:
                    continue
                shape = tuple(st.get_slice(name).get_shape())
                if shape != (vocab, hidden):
                    raise WiringError(f"--embeddings {f}: {name} is {list(shape)}, the drafter needs "
                                      f"[{vocab}, {hidden}] (vocab_size, hidden_size): another target?")
                return st.get_tensor(name)
        except (OSError, ValueError) as err:  # safetensors raises these for unreadable files
            raise CheckpointReadError(f"--embeddings {f}: cannot read: {err}") from None
    raise UsageError(f"--embeddings {p}: no token embedding among its tensors (looked for {', '.join(EMBED_NAMES)})")


def build_drafter(config: dict, tensors: dict, device: str, dtype, *, embeddings=None) -> tuple[Any, bool]:
    """The drafter, and whether it embeds from the captured embedding output (SGLang
    uses the target's table unless ``target_hidden_size`` differs from
    ``hidden_size``). ``embeddings``: the target's ``[V, H]`` table, for states
    that hold no embedding output. The class follows the architecture
    (:func:`eagle3conv.model.drafter_class`): Llama-style or MLA
    (``Eagle3DeepseekV2ForCausalLM``, docs/facts.md §10)."""
    import torch

    from eagle3conv.errors import InvalidCheckpointError
    from eagle3conv.model import drafter_class, drafter_config

    from eagle3conv.spec.canonical import drafter_uses_own_embedding

    cls = drafter_class(config, tensors.keys())
    c = drafter_config(config, tensors.keys())
    own = drafter_uses_own_embedding(c.hidden_size, c.target_hidden_size)
    if own and "embed_tokens.weight" not in tensors:
        raise InvalidCheckpointError("the drafter's hidden size differs from the target's, so SGLang embeds tokens with the "
                         "drafter's own embed_tokens, which this checkpoint lacks",
                         hint="convert it keeping the embedding: eagle3conv fix-keys SRC --keep-embed --out DIR")
    canonical = {"fc.weight", "lm_head.weight", "norm.weight"}
    if not canonical <= set(tensors) or not any(k.startswith("midlayer.") for k in tensors):
        raise InvalidCheckpointError(
            "the checkpoint is not in SGLang's names (fc, midlayer.*, norm, lm_head): verify runs fixed drafters",
            hint="eagle3conv fix-keys CKPT --out FIXED, then eagle3conv verify FIXED")
    if not own and embeddings is not None:
        sd = {k: v for k, v in tensors.items() if k != "embed_tokens.weight"}
        return cls(config, sd, device=device, dtype=dtype, embed_tokens=embeddings,
                   norm_before_residual=False), False
    placeholder = None
    if not own:  # the captured embedding output is used, indexed by position; no V x H copy
        placeholder = torch.zeros(1, c.hidden_size, dtype=dtype, device=device).expand(c.vocab_size, c.hidden_size)
    sd = {k: v for k, v in tensors.items() if not (k == "embed_tokens.weight" and not own)}
    return cls(config, sd, device=device, dtype=dtype, embed_tokens=placeholder,
               norm_before_residual=False), not own


def data_labels(input_ids, attention_mask):
    """The data's next token at every position, -1 where there is none (padding, and
    each sequence's last real token): the reference for states without target
    predictions (SpecForge records)."""
    import torch

    labels = torch.full_like(input_ids, -1)
    labels[:, :-1] = input_ids[:, 1:]
    labels[~attention_mask.bool()] = -1
    ends = attention_mask.sum(1) - 1  # the last real token has no next token in the data
    labels[torch.arange(len(ends)), ends.clamp(min=0)] = -1
    return labels


__all__ = ["EMBED_NAMES", "build_drafter", "data_labels", "load_drafter_weights", "load_target_embeddings"]
