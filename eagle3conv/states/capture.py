"""Run a transformers target over prompts and write a ``states.safetensors``.

:func:`capture_states` works in two passes so that memory stays at one batch:

1. tokenize every prompt (through the chat template when asked and the
   tokenizer has one), and, with ``generate_tokens > 0``, let the target answer
   each prompt greedily, so the states cover the target's own output (the
   setting where verify's teacher-forced acceptance equals real acceptance).
   Every sequence's length is then known, so the file's header is fixed.
2. forward each batch (right padding) with ``output_hidden_states=True`` and
   write its rows straight into the file (:class:`~eagle3conv.states.format.StatesWriter`).

Which tensor is which (pinned by tests/test_states.py against forward hooks,
transformers 5.24): ``hidden_states[0]`` is the embedding output and
``hidden_states[i + 1]`` the output of decoder layer ``i`` for ``i < N - 1``;
the LAST entry is the final norm's output, not the last layer's. The output of
layer ``N - 1`` is therefore taken from a forward hook on the last decoder layer.

``target_next`` is the argmax of the logits at every position. ``loss_mask``
marks the generated tokens when the target answered; for ``{"messages": [...]}``
prompts whose last message is the assistant's, it marks that message; it is
not stored when no prompt has a response part (then every token counts).

Prompts files (:func:`read_prompts`): ``.txt`` (one prompt per non-empty line)
or ``.jsonl`` (one object per line: ``{"prompt": "..."}`` or
``{"messages": [{"role": ..., "content": ...}, ...]}``, either with an optional
``"category": "..."``, kept per sequence in the states file for verify's
per-category figures).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3conv.errors import CheckpointReadError, UsageError
from eagle3conv.io.devices import resolve_dtype
from eagle3conv.io.progress import Progress  # stage "generate" or "forward"; counts are sequences
from eagle3conv.states.format import StatesWriter, category_counts, is_category, known_categories
from eagle3conv.spec.layers import EMBEDDING, LayerRef

if TYPE_CHECKING:
    from torch import Tensor


LAST_LAYER_SOURCE = "forward hook on the last decoder layer (pre-norm)"


# --------------------------------------------------------------------------- prompts


@dataclass(frozen=True)
class Prompt:
    """One prompt: plain ``text`` or chat ``messages`` (exactly one is set), and its
    ``category`` when the prompts file gives one."""

    text: str | None = None
    messages: tuple[Mapping[str, Any], ...] | None = None
    category: str | None = None

    @classmethod
    def of(cls, item: Any, where: str = "prompt") -> Prompt:
        if isinstance(item, Prompt):
            return item
        if isinstance(item, str):
            return cls(text=item)
        if isinstance(item, Mapping):
            category = item.get("category")
            if category is not None and not is_category(category):
                raise UsageError(f"{where}: \"category\" must be a non-empty string, got {json.dumps(category)[:60]}",
                                 hint="write it as \"category\": \"code\" (or leave it out)")
            if isinstance(item.get("prompt"), str):
                return cls(text=item["prompt"], category=category)
            msgs = item.get("messages")
            if isinstance(msgs, list) and msgs and all(
                    isinstance(m, Mapping) and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str) for m in msgs):
                return cls(messages=tuple(dict(m) for m in msgs), category=category)
            raise UsageError(f"{where}: expected {{\"prompt\": \"...\"}} or {{\"messages\": "
                             f"[{{\"role\": ..., \"content\": ...}}, ...]}}, got {json.dumps(item)[:120]}")
        raise UsageError(f"{where}: a prompt is a string or an object, got {type(item).__name__}")

    def as_messages(self) -> list[dict]:
        if self.messages is not None:
            return [dict(m) for m in self.messages]
        return [{"role": "user", "content": self.text}]

    @property
    def has_response(self) -> bool:
        return self.messages is not None and self.messages[-1].get("role") == "assistant"


def read_prompts(path: str | os.PathLike) -> list[Prompt]:
    """Prompts from a ``.txt`` (one per line) or ``.jsonl`` file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{p}: no such prompts file") from None
    except OSError as e:
        raise CheckpointReadError(f"{p}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise CheckpointReadError(f"{p}: not UTF-8 text ({e})") from None
    prompts = []
    if p.suffix == ".jsonl":
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise CheckpointReadError(f"{p} line {n}: not valid JSON ({e})") from None
            prompts.append(Prompt.of(obj, f"{p} line {n}"))
    elif p.suffix == ".txt":
        prompts = [Prompt(text=line) for line in text.splitlines() if line.strip()]
    else:
        raise UsageError(f"{p}: a prompts file is .txt (one prompt per line) or .jsonl")
    if not prompts:
        raise UsageError(f"{p}: holds no prompts")
    return prompts


# --------------------------------------------------------------------------- result


class CaptureOutcome(str, Enum):
    """What ``capture`` did: :class:`CaptureVerdict`'s code (a refusal is an error, exit 2 or 3, not a verdict)."""

    WROTE = "wrote"  # the states were captured and written
    PLANNED = "planned"  # --engine vllm --dry-run: the invocation printed, nothing run


class CaptureNote(str, Enum):
    """What the capture did otherwise than asked, or left for the user to know (codes; render says them)."""

    NO_CHAT_TEMPLATE = "no-chat-template"  # a chat template was asked for; the tokenizer has none: plain text
    AT_MAX_LENGTH = "at-max-length"  # sequences reached --max-length (cut there, or exactly that long)
    CHOSEN_LAYERS = "chosen-layers"  # only the layers asked: verify can search wirings of those layers only


@dataclass(frozen=True)
class CaptureVerdict:
    """``capture``'s verdict in codes and values (the text's first line and ``--json``'s ``verdict``):
    ``layers`` (output-of ids, -1 the embedding output) stored or to be stored of the target's ``num_layers``,
    ``every_layer`` when that is each of them (the states can check every wiring), ``layers_asked`` (None:
    every layer); ``sequences``, ``tokens`` and ``generated_tokens`` written (None: planned), the tokens
    ``generate`` asked per prompt; the chat template asked and used (None: not known before the run);
    ``at_max_length``: sequences that reached ``max_length`` (None: not counted); ``notes``: codes."""

    outcome: CaptureOutcome
    layers: tuple[int, ...]
    num_layers: int
    layers_asked: tuple[int, ...] | None
    sequences: int | None
    tokens: int | None
    generated_tokens: int | None
    generate: int
    max_length: int
    chat_template_asked: bool
    chat_template_used: bool | None
    at_max_length: int | None = None
    notes: tuple[CaptureNote, ...] = ()

    @property
    def every_layer(self) -> bool:
        return set(range(self.num_layers)) <= set(self.layers)

    def to_dict(self) -> dict:
        return {"outcome": self.outcome.value, "every_layer": self.every_layer, "layers": list(self.layers),
                "num_layers": self.num_layers,
                "layers_asked": None if self.layers_asked is None else list(self.layers_asked),
                "sequences": self.sequences, "tokens": self.tokens, "generated_tokens": self.generated_tokens,
                "generate": self.generate, "max_length": self.max_length,
                "chat_template_asked": self.chat_template_asked, "chat_template_used": self.chat_template_used,
                "at_max_length": self.at_max_length, "notes": [n.value for n in self.notes]}


def capture_verdict(outcome: CaptureOutcome, *, layers: Sequence[int], num_layers: int,
                    layers_asked: Iterable[int] | None, chat_template_asked: bool, chat_template_used: bool | None,
                    at_max_length: int | None = None, **values) -> CaptureVerdict:
    """The verdict of a capture (or of its plan), its notes decided from the values."""
    notes = []
    if chat_template_asked and chat_template_used is False:
        notes.append(CaptureNote.NO_CHAT_TEMPLATE)
    if at_max_length:
        notes.append(CaptureNote.AT_MAX_LENGTH)
    if not set(range(num_layers)) <= set(layers):
        notes.append(CaptureNote.CHOSEN_LAYERS)
    asked = None if layers_asked is None else tuple(sorted({int(i) for i in layers_asked}))
    return CaptureVerdict(outcome, tuple(layers), num_layers, asked, chat_template_asked=chat_template_asked,
                          chat_template_used=chat_template_used, at_max_length=at_max_length,
                          notes=tuple(notes), **values)


@dataclass
class CaptureResult:
    path: Path
    sequences: int
    seq_len: int
    tokens: int
    generated_tokens: int
    layers: tuple[int, ...]
    num_layers: int
    hidden_size: int
    vocab_size: int
    dtype: str
    seconds: float
    capture: dict = field(default_factory=dict)
    categories: dict | None = None  # sequences per prompt category; None: the prompts named none
    target_load_seconds: float | None = None  # loading the target (eagle3conv.api.capture sets it)
    layers_asked: tuple[int, ...] | None = None  # the layers asked for (None: every layer)
    chat_template_asked: bool = True
    at_max_length: int = 0  # sequences whose length reached max_length

    def verdict(self) -> CaptureVerdict:
        """What was captured, against what was asked (codes and values; render says them)."""
        info = self.capture
        return capture_verdict(CaptureOutcome.WROTE, layers=self.layers, num_layers=self.num_layers,
                               layers_asked=self.layers_asked, chat_template_asked=self.chat_template_asked,
                               chat_template_used=info.get("chat_template"), at_max_length=self.at_max_length,
                               sequences=self.sequences, tokens=self.tokens, generated_tokens=self.generated_tokens,
                               generate=info.get("generate_tokens", 0), max_length=info.get("max_length", 0))

    def to_dict(self) -> dict:
        return {
            "path": str(self.path), "sequences": self.sequences, "seq_len": self.seq_len,
            "tokens": self.tokens, "generated_tokens": self.generated_tokens,
            "layers": list(self.layers), "num_layers": self.num_layers,
            "hidden_size": self.hidden_size, "vocab_size": self.vocab_size,
            "dtype": self.dtype, "seconds": round(self.seconds, 3), "capture": self.capture,
            "categories": self.categories, "verdict": self.verdict().to_dict(),
        }


# --------------------------------------------------------------------------- model plumbing


def _text_config(model: Any) -> Any:
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def decoder_layers(model: Any) -> Sequence[Any]:
    """The decoder layer list of a causal LM (``model.model.layers`` for Llama-style models)."""
    base = None
    if hasattr(model, "get_decoder"):
        try:
            base = model.get_decoder()
        except (AttributeError, NotImplementedError):
            base = None
    for cand in (base, getattr(model, "model", None)):
        layers = getattr(cand, "layers", None)
        if layers is not None and len(layers) > 0:
            return layers
    raise UsageError(
        f"capture supports decoder-only models whose layers are model.model.layers; "
        f"{type(model).__name__} has none")


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), _text_config(model), tokenizer):
        v = getattr(src, "eos_token_id", None)
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(int(i) for i in v)
    return ids


def encode_prompt(tokenizer: Any, prompt: Prompt, chat: bool, max_length: int) -> tuple[list[int], int]:
    """Token ids and the index where the response starts (len(ids) when none)."""
    def ids_of(text: str, special: bool) -> list[int]:
        return list(tokenizer(text, add_special_tokens=special)["input_ids"])

    if chat:
        msgs = prompt.as_messages()
        if prompt.has_response:
            full = tokenizer.apply_chat_template(msgs, tokenize=False)
            head = tokenizer.apply_chat_template(msgs[:-1], tokenize=False, add_generation_prompt=True)
            ids = ids_of(full, False)
            start = len(ids_of(head, False)) if full.startswith(head) else len(ids)
        else:
            ids = ids_of(tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True), False)
            start = len(ids)
    else:
        if prompt.messages is not None:
            raise UsageError("chat messages need a chat template: the tokenizer has none, or chat_template=False")
        ids = ids_of(prompt.text, True)
        start = len(ids)
    if not ids:
        raise UsageError(f"a prompt tokenized to nothing: {prompt.text or prompt.messages!r}")
    ids = ids[:max_length]
    return ids, min(start, len(ids))


def _generate(model: Any, rows: list[list[int]], budgets: list[int], pad_id: int,
              eos: set[int], device: Any) -> list[list[int]]:
    """Greedy continuations of ``rows`` (left padded for the batch), each cut at
    its first eos (kept) and at its budget."""
    import torch

    longest = max(len(r) for r in rows)
    ids = torch.full((len(rows), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, longest - len(r):] = torch.tensor(r)
        mask[i, longest - len(r):] = 1
    new = max(budgets)
    if new <= 0:
        return [[] for _ in rows]
    out = model.generate(
        input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=new,
        do_sample=False, temperature=None, top_p=None, top_k=None, num_beams=1,
        pad_token_id=pad_id, eos_token_id=sorted(eos) or None,
    )
    gen = out[:, longest:].cpu().tolist()
    result = []
    for g, budget in zip(gen, budgets):
        g = g[:budget]
        for j, t in enumerate(g):
            if t in eos:
                g = g[: j + 1]
                break
        result.append(g)
    return result


# --------------------------------------------------------------------------- capture


def wanted_layers(layers: Iterable[int] | None, num_layers: int, kept: str) -> list[int]:
    """The output-of ``layers`` to capture besides the embedding output (None: every layer),
    ascending; :class:`UsageError` for a layer the target lacks (``kept``: how the message says
    the embedding output is kept, "stored" or "captured")."""
    if layers is None:
        return list(range(num_layers))
    wanted = sorted({int(i) for i in layers} - {-1})
    bad = [i for i in wanted if i < 0 or i >= num_layers]
    if bad:
        raise UsageError(f"layers {bad} do not exist: the target has {num_layers} layers (0..{num_layers - 1}); "
                         f"-1 is the embedding output, always {kept}")
    return wanted


def capture_states(
    model: Any,
    tokenizer: Any,
    prompts: Iterable[Prompt | str | Mapping],
    out: str | os.PathLike,
    *,
    layers: Iterable[int] | None = None,
    max_length: int = 512,
    batch_size: int = 4,
    generate_tokens: int = 0,
    chat_template: bool = True,
    dtype: Any = "bf16",
    device: Any = None,
    target: str | None = None,
    progress: Progress | None = None,
    capture_info: Mapping | None = None,
    on_size: Callable[[int, str], None] | None = None,
) -> CaptureResult:
    """Capture ``model``'s hidden states over ``prompts`` into ``out`` (a ``states.safetensors``).

    ``layers``: output-of-layer ints to store (``None`` = every layer); the
    embedding output is always stored. ``max_length`` caps each sequence
    (prompt plus generated tokens). ``dtype``: storage dtype (bf16, fp16, fp32);
    the model runs in its own dtype. ``device``: move the model there first
    (default: where it is). ``target``: the name recorded in the file (default:
    the model config's ``_name_or_path``). ``on_size(bytes, how)`` is called once the
    sequences are known, before anything is written: the file's estimated size and
    how it breaks down. Returns a :class:`CaptureResult`.
    """
    import torch

    from eagle3conv.version import __version__

    t0 = time.perf_counter()
    for name, v, low in (("max_length", max_length, 2), ("batch_size", batch_size, 1),
                         ("generate_tokens", generate_tokens, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise UsageError(f"{name} must be an integer >= {low}, got {v!r}")
    store_dtype = resolve_dtype(dtype, what="states dtype")
    items = [Prompt.of(p, f"prompt {i}") for i, p in enumerate(prompts)]
    if not items:
        raise UsageError("no prompts to capture")
    cfg = _text_config(model)
    n_layers, hidden, vocab = int(cfg.num_hidden_layers), int(cfg.hidden_size), int(cfg.vocab_size)
    blocks = decoder_layers(model)
    if len(blocks) != n_layers:
        raise UsageError(f"the config says {n_layers} layers but the model has {len(blocks)}")
    layers = None if layers is None else tuple(layers)  # read twice: the layers stored, the verdict's asked
    wanted = wanted_layers(layers, n_layers, "stored")
    if device is not None:
        model.to(device)
    dev = next(model.parameters()).device
    model.eval()

    has_template = bool(getattr(tokenizer, "chat_template", None))
    chat = chat_template and has_template
    pad_id = tokenizer.pad_token_id
    eos = _eos_ids(model, tokenizer)
    if pad_id is None:
        pad_id = min(eos) if eos else 0

    # pass 1: token ids (and the target's own answers)
    encoded = [encode_prompt(tokenizer, p, chat, max_length) for p in items]
    seqs = [ids for ids, _ in encoded]
    starts = [s for _, s in encoded]
    response = [p.has_response and s < len(ids) for p, (ids, s) in zip(items, encoded)]
    generated = 0
    if generate_tokens > 0:
        with torch.inference_mode():
            for b in range(0, len(seqs), batch_size):
                rows = seqs[b: b + batch_size]
                budgets = [min(generate_tokens, max_length - len(r)) for r in rows]
                gens = _generate(model, rows, budgets, pad_id, eos, dev)
                for j, g in enumerate(gens):
                    starts[b + j] = len(seqs[b + j])
                    seqs[b + j] = seqs[b + j] + g
                    response[b + j] = True
                    generated += len(g)
                if progress:
                    progress("generate", min(b + batch_size, len(seqs)), len(seqs))
    with_loss_mask = any(response)

    seq_len = max(len(s) for s in seqs)
    info = {
        "tool": "eagle3conv", "version": __version__,
        "prompts": len(items), "chat_template": chat,
        "generated": generate_tokens > 0, "generate_tokens": generate_tokens,
        "generated_total": generated, "max_length": max_length,
        "dtype": str(store_dtype).removeprefix("torch."),
        "model_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "model_class": type(model).__name__,
        "last_layer": LAST_LAYER_SOURCE,
        "transformers": _version("transformers"), "torch": torch.__version__,
    }
    categories = known_categories(p.category for p in items)
    info.update(dict(capture_info or {}))
    name = target if target is not None else (getattr(cfg, "_name_or_path", None) or
                                              getattr(model.config, "_name_or_path", None) or "")

    if on_size is not None:
        on_size(*estimate_size(len(seqs), seq_len, hidden, 1 + len(wanted), store_dtype.itemsize))

    # pass 2: forward and write
    last_out: dict[str, Tensor] = {}

    def hook(_mod, _inp, output):
        last_out["h"] = output[0] if isinstance(output, (tuple, list)) else output

    handle = blocks[-1].register_forward_hook(hook)
    tokens = 0
    try:
        with StatesWriter(out, num_sequences=len(seqs), seq_len=seq_len, hidden_size=hidden,
                          num_layers=n_layers, vocab_size=vocab, layers=[-1, *wanted], target=str(name),
                          dtype=store_dtype, with_loss_mask=with_loss_mask, capture=info,
                          categories=categories) as writer, \
                torch.inference_mode():
            for b in range(0, len(seqs), batch_size):
                rows = seqs[b: b + batch_size]
                n = len(rows)
                width = max(len(r) for r in rows)
                ids = torch.full((n, width), pad_id, dtype=torch.long)
                mask = torch.zeros((n, width), dtype=torch.bool)
                for j, r in enumerate(rows):
                    ids[j, : len(r)] = torch.tensor(r)
                    mask[j, : len(r)] = True
                last_out.clear()
                res = model(input_ids=ids.to(dev), attention_mask=mask.long().to(dev),
                            output_hidden_states=True, use_cache=False)
                hs = res.hidden_states
                if hs is None or len(hs) != n_layers + 1:
                    raise UsageError(f"{type(model).__name__} returned {0 if hs is None else len(hs)} "
                                     f"hidden states; expected {n_layers + 1} (embedding + each layer)")
                if "h" not in last_out:
                    raise UsageError("the forward hook on the last decoder layer never fired")

                def full(t: Tensor) -> Tensor:  # [n, width, ...] -> [n, seq_len, ...], zero padding
                    t = t.detach().cpu()
                    z = torch.zeros((n, seq_len, *t.shape[2:]), dtype=t.dtype)
                    z[:, :width] = t
                    pad = ~fmask
                    z[pad] = 0
                    return z

                fmask = torch.zeros((n, seq_len), dtype=torch.bool)
                fmask[:, :width] = mask
                hidden_rows = {EMBEDDING: full(hs[0]).to(store_dtype)}
                for i in wanted:
                    src = last_out["h"] if i == n_layers - 1 else hs[i + 1]
                    hidden_rows[LayerRef(i)] = full(src).to(store_dtype)
                nxt = full(res.logits.argmax(dim=-1))
                lm = None
                if with_loss_mask:
                    lm = torch.zeros((n, seq_len), dtype=torch.bool)
                    for j in range(n):
                        k = b + j
                        if response[k]:
                            lm[j, starts[k]: len(seqs[k])] = True
                        else:
                            lm[j, : len(seqs[k])] = True
                writer.write(b, input_ids=full(ids), attention_mask=fmask, target_next=nxt,
                             hidden=hidden_rows, loss_mask=lm)
                tokens += int(mask.sum())
                del res, hs
                if progress:
                    progress("forward", b + n, len(seqs))
    finally:
        handle.remove()
    return CaptureResult(
        path=Path(out), sequences=len(seqs), seq_len=seq_len, tokens=tokens, generated_tokens=generated,
        layers=(-1, *wanted), num_layers=n_layers, hidden_size=hidden, vocab_size=vocab,
        dtype=info["dtype"], seconds=time.perf_counter() - t0, capture=info,
        categories=category_counts(categories),
        layers_asked=None if layers is None else tuple(int(i) for i in layers), chat_template_asked=chat_template,
        at_max_length=sum(len(q) >= max_length for q in seqs),
    )


def estimate_size(sequences: int, seq_len: int, hidden: int, states: int, itemsize: int) -> tuple[int, str]:
    """A states file's size in bytes (hidden states, then ids, mask, next tokens, loss
    mask; the header is a few kB more) and how it breaks down, for people."""
    hidden_bytes = sequences * seq_len * hidden * states * itemsize
    total = hidden_bytes + sequences * seq_len * (8 + 1 + 8 + 1)
    return total, (f"{sequences} sequences x {seq_len} positions x {states} hidden states (embedding output + "
                   f"{states - 1} layers) x {hidden} x {itemsize} bytes")


def _version(dist: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
