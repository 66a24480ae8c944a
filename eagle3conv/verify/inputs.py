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
from eagle3conv.spec.canonical import EMBED, LM_HEAD, VOCAB_MAPS
from eagle3conv.spec.engines import Run


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


def _target_files(path: str | os.PathLike) -> list[Path]:
    p = Path(path)
    return [p] if p.is_file() else sorted(p.glob("*.safetensors")) if p.is_dir() else []


def _target_tensor(files: list[Path], names: tuple[str, ...], vocab: int, hidden: int):
    """The first of ``names`` found in ``files``, checked to be ``[vocab, hidden]`` (only that
    tensor is read); None when none is there."""
    from safetensors import safe_open

    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                name = next((n for n in names if n in st.keys()), None)
                if name is None:
                    continue
                shape = tuple(st.get_slice(name).get_shape())
                if shape != (vocab, hidden):
                    raise WiringError(f"--embeddings {f}: {name} is {list(shape)}, the drafter needs "
                                      f"[{vocab}, {hidden}] (vocab_size, hidden_size): another target?")
                return st.get_tensor(name)
        except (WiringError, CheckpointReadError):
            raise
        except Exception as err:  # noqa: BLE001 - safetensors raises its own error types for files it cannot read
            raise CheckpointReadError(f"--embeddings {f}: not a readable safetensors file ({type(err).__name__}: "
                                      f"{err})", hint="give the target's model folder, a .safetensors file or "
                                                      "a .gguf") from None
    return None


def _gguf_target(path: str | os.PathLike):
    """The target a ``.gguf`` file holds, de-quantized to fp32 by transformers (loaded once per path)."""
    key = str(Path(path).resolve())
    if key not in _GGUF_LOADED:
        from eagle3conv.states.target_model import load_target_model

        _GGUF_LOADED.clear()  # one target at a time: a Kimi-size model is not kept twice
        _GGUF_LOADED[key] = load_target_model(path).model
    return _GGUF_LOADED[key]


_GGUF_LOADED: dict = {}


def use_loaded_target(path: str | os.PathLike, model) -> None:
    """Read the GGUF at ``path`` from ``model``, already loaded from it (by
    :func:`eagle3conv.states.target_model.load_target_model`), instead of loading it again."""
    _GGUF_LOADED.clear()
    _GGUF_LOADED[str(Path(path).resolve())] = model


def _is_gguf(path: str | os.PathLike) -> bool:
    return Path(path).is_file() and Path(path).suffix == ".gguf"


def _gguf_tensor(path, which: str, vocab: int, hidden: int):
    model = _gguf_target(path)
    mod = model.get_input_embeddings() if which == "embed" else model.get_output_embeddings()
    w = None if mod is None else mod.weight.detach()
    if w is not None and tuple(w.shape) != (vocab, hidden):
        raise WiringError(f"--embeddings {path}: its {which} table is {list(w.shape)}, the drafter needs "
                          f"[{vocab}, {hidden}] (vocab_size, hidden_size): another target?")
    return w


def load_target_embeddings(path: str | os.PathLike, vocab: int, hidden: int, *, names: tuple[str, ...] = EMBED_NAMES):
    """The target's token embedding ``[V, H]`` from its safetensors (a file, or a model
    folder, sharded or not), reading only that tensor; from a ``.gguf`` file, de-quantized.
    ``names``: the tensor names to look for (NeMo's target_embeddings.safetensors says ``weight``)."""
    if _is_gguf(path):
        return _gguf_tensor(path, "embed", vocab, hidden)
    files = _target_files(path)
    if not files:
        raise UsageError(f"--embeddings {path}: no safetensors file there",
                         hint="give the target model's folder, its .safetensors file holding embed_tokens, or its "
                              ".gguf")
    table = _target_tensor(files, names, vocab, hidden)
    if table is None:
        raise UsageError(f"--embeddings {path}: no token embedding among its tensors (looked for "
                         f"{', '.join(names)})")
    return table


HEAD_NAMES = ("lm_head.weight", "language_model.lm_head.weight", "model.language_model.lm_head.weight")


def load_target_head(path: str | os.PathLike, vocab: int, hidden: int, *, table=None):
    """The target's ``lm_head`` ``[V, H]`` from its safetensors (a file, or a model folder),
    or its token embedding when the folder's config.json ties the two
    (``tie_word_embeddings``; ``table``: that embedding, already read); None when neither
    can be told from what is there."""
    if _is_gguf(path):
        return _gguf_tensor(path, "head", vocab, hidden)
    head = _target_tensor(_target_files(path), HEAD_NAMES, vocab, hidden)
    if head is not None:
        return head
    cfg = _config_beside(path)
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    tied = cfg.get("tie_word_embeddings", text.get("tie_word_embeddings"))
    if tied is not True:
        return None
    return table if table is not None else load_target_embeddings(path, vocab, hidden)



def _config_beside(path) -> dict:
    """The target's config.json beside its weights (a model folder, or the folder of a weights file),
    as a dict; {} when there is none or it does not read (the callers then find nothing to use)."""
    from eagle3conv.io.jsonfile import read_json_file

    p = Path(path)
    cfg_file = (p if p.is_dir() else p.parent) / "config.json"
    try:
        cfg = read_json_file(cfg_file, "config.json", want_object=False) if cfg_file.is_file() else {}
    except CheckpointReadError:
        cfg = {}
    return cfg if isinstance(cfg, dict) else {}

NORM_NAMES = ("model.norm.weight", "model.language_model.norm.weight", "language_model.model.norm.weight",
              "norm.weight")


def load_target_norm(path: str | os.PathLike, hidden: int):
    """The target's final RMSNorm ``(weight [H], eps)`` from its weights (a model folder with
    config.json, a safetensors file beside one, or a ``.gguf``); None when it is not there."""
    if _is_gguf(path):
        model = _gguf_target(path)
        inner = getattr(model, "model", None)
        norm = getattr(inner, "norm", None)
        eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", None)
        if norm is None or eps is None or tuple(norm.weight.shape) != (hidden,):
            return None
        return norm.weight.detach(), float(eps)
    from safetensors import safe_open

    cfg = _config_beside(path)
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    eps = text.get("rms_norm_eps")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool):
        return None
    for f in _target_files(path):
        try:
            with safe_open(str(f), framework="pt") as st:
                name = next((n for n in NORM_NAMES if n in st.keys()), None)
                if name is not None and tuple(st.get_slice(name).get_shape()) == (hidden,):
                    return st.get_tensor(name), float(eps)
        except Exception as err:  # noqa: BLE001 - safetensors' own error types
            raise CheckpointReadError(f"--embeddings {f}: not a readable safetensors file ({type(err).__name__}: "
                                      f"{err})") from None
    return None


def target_num_layers(path: str | os.PathLike) -> int | None:
    """N, the target's decoder layer count, from the config.json beside its weights (or its GGUF)."""
    if _is_gguf(path):
        cfg = _gguf_target(path).config
        cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        return getattr(cfg, "num_hidden_layers", None)
    cfg = _config_beside(path)
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    n = text.get("num_hidden_layers")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def target_next_from_head(states, head, norm=None, *, device="cpu", rows: int = 4, chunk: int = 1024):
    """The target's own greedy next token at every position, ``[B, S]`` int64 (0 at padding):
    ``argmax(lm_head(h))`` over its last hidden state ``h``, after its final RMSNorm when
    ``norm`` (``(weight, eps)``) is given (a layer output before the norm), as given otherwise
    (already post-norm). Read ``rows`` sequences at a time, ``chunk`` positions per matmul, in
    fp32 (the target's logits are argmax'd exactly as transformers' forward computes them)."""
    import torch

    from eagle3conv.model.ops import rms_norm

    kind, ref = states.final_state
    w = head.to(device=device, dtype=torch.float32)
    nw = None if norm is None else norm[0].to(device=device, dtype=torch.float32)
    out = torch.zeros(states.num_sequences, states.seq_len, dtype=torch.long)
    for start in range(0, states.num_sequences, rows):
        sl = slice(start, min(start + rows, states.num_sequences))
        h = states.final_hidden(sl) if kind == "post-norm" else states.aux([ref], sl)
        h = h.to(device=device, dtype=torch.float32)
        if not bool(torch.isfinite(h).all()):
            where = states.find_non_finite(None) or states.path
            raise CheckpointReadError(f"{where}: the target's last hidden state is not finite (NaN or Inf): the "
                                      "capture went wrong", hint="capture again (a bf16 overflow?)")
        if nw is not None:
            h = rms_norm(h, nw, norm[1])
        flat = h.reshape(-1, h.shape[-1])
        got = torch.cat([(flat[i:i + chunk] @ w.T).argmax(-1) for i in range(0, flat.shape[0], chunk)])
        out[sl] = got.view(h.shape[0], h.shape[1]).cpu()
    out[~states.attention_mask.bool()] = 0
    return out


def build_drafter(config: dict, tensors: dict, device: str, dtype, *, embeddings=None, head=None,
                  run: Run | None = None) -> tuple[Any, bool]:
    """The drafter, and whether it embeds from the captured embedding output (SGLang
    uses the target's table unless ``target_hidden_size`` differs from
    ``hidden_size``). ``embeddings``: the target's ``[V, H]`` table, for states
    that hold no embedding output. The class follows the architecture
    (:func:`eagle3conv.model.drafter_class`): Llama-style or MLA
    (``Eagle3DeepseekV2ForCausalLM``, docs/facts.md §9-10).

    ``run``: how an engine release runs it (:func:`eagle3conv.spec.engines.serving`, its embedding
    settled: :meth:`~eagle3conv.spec.engines.Run.settled`); None: as config.json says, the residual
    un-normed (SGLang ignores norm_before_residual, docs/facts.md §9). A run that
    uses the target's head (``run.target_head``) is given it as ``head`` (``[V, H]``): it replaces
    the drafter's ``lm_head`` and its vocab map, as SGLang does for a config without
    ``draft_vocab_size``."""
    import torch

    from eagle3conv.errors import InvalidCheckpointError
    from eagle3conv.model import build_drafter as build
    from eagle3conv.model import drafter_config
    from eagle3conv.spec.canonical import drafter_uses_own_embedding, in_canonical_names

    run = Run(norm_before_residual=False) if run is None else run
    if run.target_head:
        if head is None:
            raise UsageError("this run uses the target's lm_head, and none was given",
                             hint="pass the target's weights with --embeddings")
        tensors = {k: v for k, v in tensors.items() if k not in VOCAB_MAPS}
        tensors[LM_HEAD] = head
        config = {**config, "draft_vocab_size": int(head.shape[0])}
    c = drafter_config(config, tensors.keys())
    if drafter_uses_own_embedding(c.hidden_size, c.target_hidden_size):
        if EMBED not in tensors:
            raise InvalidCheckpointError("the drafter's hidden size differs from the target's, so SGLang embeds tokens "
                                         "with the drafter's own embed_tokens, which this checkpoint lacks",
                                         hint="convert it keeping the embedding: eagle3conv fix-keys SRC --keep-embed "
                                              "--out DIR")
        run = run.settled(own=True)
    if not in_canonical_names(config, tensors.keys()):
        raise InvalidCheckpointError(
            "the checkpoint is not in SGLang's names (fc, midlayer.*, norm, lm_head): verify runs fixed drafters",
            hint="eagle3conv fix-keys CKPT --out FIXED, then eagle3conv verify FIXED")
    table = embeddings
    if table is None:  # the captured embedding output, indexed by position (the forward's embeddings=): no V x H copy
        table = torch.zeros(1, c.hidden_size, dtype=dtype, device=device).expand(c.vocab_size, c.hidden_size)
    drafter = build(config, tensors, device=device, dtype=dtype, embed_tokens=table, run=run)
    return drafter, embeddings is None and drafter.embedding_source == "caller"


def _max_abs_diff(a, b, rows: int = 4096) -> float:
    """max |a - b| over two equal-shape tables, a block of rows at a time, in the coarser of the
    two dtypes (no full-size float copies of a Kimi-size table)."""
    import torch

    coarse = min((a.dtype, b.dtype), key=lambda d: torch.finfo(d).bits)
    out = 0.0
    for i in range(0, a.shape[0], rows):
        d = (a[i:i + rows].to(coarse).float() - b[i:i + rows].to(coarse).float()).abs().max().item()
        out = max(out, d)
    return out


def compare_embeddings(own, states, *, table=None, max_sequences: int = 64) -> dict:
    """Whether the drafter's own ``embed_tokens`` (``own``, ``[V, H]``) is the target's,
    as vLLM decides it (``torch.equal`` on the whole table, docs/facts.md §4). With the
    target's ``table`` (as stored: not cast to verify's dtype) the whole tables are compared;
    otherwise the rows of the token ids the captured states hold, against the captured
    embedding output (the first ``max_sequences`` sequences). Both sides are cast to the
    coarser of the two dtypes. Returns ``rows`` (rows compared), ``of`` (the vocab size),
    ``max_abs_diff``, ``identical`` and ``how``. ``identical`` is True only when every row
    was compared and none differs, False when a row differs, None when nothing (or only
    some rows, all equal: ``identical_rows`` True) could be compared."""
    import torch

    width = int(own.shape[1]) if own.ndim == 2 else None
    if table is not None:
        if tuple(table.shape) != tuple(own.shape):
            return {"rows": 0, "of": int(own.shape[0]), "max_abs_diff": None, "identical": False,
                    "how": f"the target's table is {list(table.shape)}, the drafter's {list(own.shape)}"}
        diff = _max_abs_diff(own, table) if own.numel() else 0.0
        return {"rows": int(own.shape[0]), "of": int(own.shape[0]), "max_abs_diff": diff,
                "identical": diff == 0.0,
                "how": "the whole table against the target's (--embeddings)"}
    if not states.has_embeddings:
        return {"rows": 0, "of": int(own.shape[0]), "max_abs_diff": None, "identical": None,
                "how": "the states hold no embedding output and no --embeddings was given"}
    if width != states.hidden_size:
        return {"rows": 0, "of": int(own.shape[0]), "max_abs_diff": None, "identical": False,
                "how": f"the drafter's table is {width} wide, the target's embedding output {states.hidden_size}"}
    take = min(max_sequences, states.num_sequences)
    ids = states.input_ids[:take]
    mask = states.attention_mask[:take].bool()
    captured = states.embeddings(slice(0, take))[mask]
    tokens = ids[mask].long()
    if not tokens.numel():
        return {"rows": 0, "of": int(own.shape[0]), "max_abs_diff": None, "identical": None,
                "how": "the states hold no real token"}
    if int(tokens.max()) >= own.shape[0]:
        return {"rows": 0, "of": int(own.shape[0]), "max_abs_diff": None, "identical": False,
                "how": f"the states hold token id {int(tokens.max())}, outside the drafter's {own.shape[0]}-row table"}
    mine = own[tokens]
    coarse = min((mine.dtype, captured.dtype), key=lambda d: torch.finfo(d).bits)
    a, b = mine.to(coarse).float(), captured.to(coarse).float()
    diff = (a - b).abs().max().item()
    rows = int(tokens.unique().numel())
    every = rows == int(own.shape[0])
    how = (f"the rows of the {rows} token ids in the first {take} sequences against the captured embedding "
           f"output, in {str(coarse).removeprefix('torch.')}")
    if diff == 0.0 and not every:
        how += f"; the other {int(own.shape[0]) - rows} rows were not compared (pass the target's weights with --embeddings)"
    return {"rows": rows, "of": int(own.shape[0]), "max_abs_diff": diff,
            "identical": (True if every else None) if diff == 0.0 else False,
            "identical_rows": diff == 0.0, "how": how}


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


__all__ = ["EMBED_NAMES", "HEAD_NAMES", "NORM_NAMES", "build_drafter", "compare_embeddings", "data_labels",
           "load_drafter_weights", "load_target_embeddings", "load_target_head", "load_target_norm",
           "target_next_from_head", "target_num_layers", "use_loaded_target"]


def dequantize_drafter(config: dict, tensors: dict, *, raw_modules: tuple[str, ...] = (),
                       emulate_activations: bool = True) -> tuple[dict, dict, list[str]]:
    """A quantized drafter's tensors as a release computes them: each quantized module's weight
    dequantized as its scheme defines (model/quant.py), and, for a module with a stored
    ``input_scale`` of a static FP8 scheme, its input quantized to FP8 with that scale
    (:class:`~eagle3conv.model.quant.StaticFP8Input`). ``raw_modules``: modules a release builds as
    plain bf16 Linears (SGLang 0.5.23's fc): their stored codes unscaled, or left at a random init
    when the release skips a packed tensor. Returns (config without quantization_config, tensors in
    canonical names only, notes saying what was emulated). A bf16 drafter comes back unchanged."""
    import torch

    from eagle3conv.checkpoint.dequant import dequantize, raw_codes
    from eagle3conv.model.quant import StaticFP8Input
    from eagle3conv.spec import quant as q

    qc = q.read_quant_config(config, None)
    if qc is None:
        return config, tensors, []
    groups: dict[str, dict] = {}
    for name in list(tensors):
        module, leaf = q.split_name(name)
        if leaf in q.load_quant_data().companions:
            groups.setdefault(module, {})[leaf] = tensors.pop(name)
    notes = [f"quantized drafter ({qc.label}): {len(groups)} modules dequantized as the scheme defines"]
    static = []
    for module, parts in sorted(groups.items()):
        if module + ".weight" in tensors:
            parts["weight"] = tensors.pop(module + ".weight")
        w_name = qc.scheme.weight_name
        if w_name not in parts:
            continue
        shape = tuple(int(x) for x in parts["weight_shape"].tolist()) if "weight_shape" in parts else None
        if shape is None:
            rows = parts[w_name].shape[0]
            cols = parts[w_name].shape[1] * (2 if qc.scheme.packed == "fp4x2" else 1)
            shape = (rows, cols)
        if module in raw_modules:
            w = raw_codes(qc.scheme, parts, shape)
            if w is None:
                w = torch.nn.init.kaiming_uniform_(torch.empty(shape), a=5 ** 0.5)  # nn.Linear's init
                notes.append(f"{module}: skipped by the release (packed), run at nn.Linear's random init")
            else:
                notes.append(f"{module}: run as the release loads it: the stored codes unscaled, scales dropped")
            tensors[module + ".weight"] = w
            continue
        w = dequantize(qc.scheme, parts, shape, qc.symbols)
        scale = parts.get("input_scale")
        if emulate_activations and scale is not None and qc.scheme.activation == "fp8_static_if_input_scale":
            w = StaticFP8Input(w, float(scale.float().reshape(-1)[0]))
            static.append(module)
        tensors[module + ".weight"] = w
    if static:
        notes.append(f"static FP8 activations emulated for {', '.join(static)} (input quantized with input_scale)")
    return {k: v for k, v in config.items() if k != "quantization_config"}, tensors, notes


__all__.append("dequantize_drafter")


def raw_modules_for(release, config: dict, names) -> tuple[str, ...]:
    """The quantized modules a release builds as plain bf16 Linears and so loads unscaled (or, packed,
    not at all): SGLang 0.5.23's fc (the engines' ``quantization`` rules, docs/facts.md §14)."""
    from eagle3conv.spec import quant as q
    from eagle3conv.spec.drafter import architecture_key

    if q.read_quant_config(config, None) is None:
        return ()
    eq = q.engine_quant(release.engine, release.version, architecture_key(config, names))
    if eq is None:
        return ()
    modules = {q.split_name(n)[0] for n in names if q.is_companion(n)}
    return tuple(sorted(m for m in modules if eq.handles(q.role_of(m)) == "raw_codes"))


__all__.append("raw_modules_for")
