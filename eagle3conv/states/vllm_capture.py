"""``capture --engine vllm``: a large target's states from vLLM 0.33.0's ``extract_hidden_states``.

For targets no single machine runs through transformers (Kimi-K2.5), the states
come from vLLM itself, tensor-parallel, in the layout speculators 0.9.0's data
generation keeps (docs/capture-at-scale.md says where each fact comes from):

* vLLM runs the target with the speculative method ``extract_hidden_states`` and
  its ``ExampleHiddenStatesConnector`` (:func:`llm_kwargs`); for every request the
  connector writes one safetensors file, ``hidden_states [S, n, T]`` (the ``n``
  ids given, in layer order) and ``token_ids [S]``, and a ``.lock`` beside it;
* with ``--generate N`` the request decodes greedily (temperature 0) and asks
  the connector for its output tokens too (``include_output_tokens``): the file
  then covers the prompt and the target's own response but its last token (the
  last token is the target's output, never an input);
* each finished file is moved to ``hs_{i}.safetensors`` (``i`` = the prompt's
  line), as speculators' ``generate_offline_data`` names them;
* :data:`SIDECAR` records what the files do not: the ids in vLLM's numbering and
  in eagle3conv's, the target, each sequence's prompt length (the loss mask is the
  response), its category and the target's token after the file's last position.

The folder is built under a hidden temp name beside ``--out`` and renamed into
place once every file is checked (``token_ids`` equal to the ids sent, the
shape as asked), so ``--out`` never holds half a capture. ``--dry-run`` prints the
exact invocation (``LLM(**kwargs)``, the ``SamplingParams``, and the equivalent
``vllm serve`` line for speculators' own data generation) and runs nothing.

vLLM numbering: id ``i`` is the output of decoder layer ``i - 1``; 0 is the
embedding output and ``N`` the last layer's output before the final norm.
eagle3conv's ``--layers`` are output-of ids (-1 = embedding), so id = output_of + 1;
the embedding output (vLLM id 0) is always captured, as ``capture`` does on CPU.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3conv.errors import CheckpointReadError, Eagle3ConvError, UsageError, WriteError
from eagle3conv.spec.drafter import AUX_KEY

if TYPE_CHECKING:
    from eagle3conv.states.capture import CaptureVerdict

VLLM_RELEASE = "0.33.0"  # the release whose method, connector and file layout docs/capture-at-scale.md reads
VLLM_REQUIREMENT = f"vllm=={VLLM_RELEASE}"
METHOD = "extract_hidden_states"
CONNECTOR = "ExampleHiddenStatesConnector"
SIDECAR = "eagle3conv-capture.json"
SIDECAR_FORMAT = "eagle3conv-capture"
SIDECAR_VERSION = 1
FILE_PATTERN = "hs_{}.safetensors"
NUMBERING = ("vllm: id i is the output of decoder layer i-1; 0 is the embedding output; "
             "num_layers is the last layer's output before the final norm")


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class VllmCapturePlan:
    """What one vLLM capture runs: the target, the ids (vLLM numbering, ascending), the
    engine options, and where the files go."""

    target: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    vllm_ids: tuple[int, ...]
    out: Path
    tensor_parallel_size: int = 1
    max_length: int = 512
    generate: int = 0
    dtype: str = "bfloat16"
    chat_template: bool = True
    trust_remote_code: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)  # further LLM(...) keyword arguments (--vllm-arg)
    layers_asked: tuple[int, ...] | None = None  # the output-of layers asked for (None: every layer)

    def verdict(self, result: VllmCaptureResult | None = None, *, prompts: int | None = None) -> CaptureVerdict:
        """The capture's verdict (:class:`~eagle3conv.states.capture.CaptureVerdict`): planned (``--dry-run``;
        its ``sequences`` are the ``prompts`` it would run), or with the run's ``result``, what it wrote."""
        from eagle3conv.states.capture import CaptureOutcome, capture_verdict

        ran = ({"sequences": prompts, "tokens": None, "generated_tokens": None} if result is None else
               {"sequences": result.sequences, "tokens": result.tokens, "generated_tokens": result.generated_tokens})
        return capture_verdict(CaptureOutcome.PLANNED if result is None else CaptureOutcome.WROTE,
                               layers=self.output_of, num_layers=self.num_layers, layers_asked=self.layers_asked,
                               chat_template_asked=self.chat_template,
                               chat_template_used=None if result is None else result.sidecar.get("chat_template"),
                               generate=self.generate, max_length=self.max_length, **ran)

    @property
    def output_of(self) -> tuple[int, ...]:
        """The same layers in eagle3conv's numbering (output of layer i; -1 the embedding output)."""
        return tuple(i - 1 for i in self.vllm_ids)

    def speculative_config(self) -> dict:
        return {"method": METHOD, "num_speculative_tokens": 1,
                "draft_model_config": {"hf_config": {AUX_KEY: list(self.vllm_ids)}}}  # the field vLLM reads

    def kv_transfer_config(self, storage: str | os.PathLike) -> dict:
        return {"kv_connector": CONNECTOR, "kv_role": "kv_producer",
                "kv_connector_extra_config": {"shared_storage_path": str(storage)}}

    def llm_kwargs(self, storage: str | os.PathLike) -> dict:
        """``vllm.LLM(**kwargs)``: the target, tensor-parallel, with the capture method and connector."""
        out = {"model": self.target, "tensor_parallel_size": self.tensor_parallel_size, "dtype": self.dtype,
               "max_model_len": self.max_length, "speculative_config": self.speculative_config(),
               "kv_transfer_config": self.kv_transfer_config(storage)}
        if self.trust_remote_code:
            out["trust_remote_code"] = True
        out.update(self.extra)
        return out

    def sampling_kwargs(self, prompt_tokens: int) -> dict:
        """``vllm.SamplingParams(**kwargs)`` for one prompt: greedy; with ``generate`` the
        connector keeps the response's tokens too (all but the last)."""
        new = max(1, min(self.generate, self.max_length - prompt_tokens)) if self.generate else 1
        return {"temperature": 0.0, "max_tokens": new, "detokenize": False,
                "extra_args": {"kv_transfer_params": {"include_output_tokens": self.generate > 0}}}

    def serve_argv(self, storage: str | os.PathLike) -> list[str]:
        """The equivalent ``vllm serve`` line (for speculators' ``generate-offline-data``)."""
        argv = ["vllm", "serve", self.target, "--tensor-parallel-size", str(self.tensor_parallel_size),
                "--dtype", self.dtype, "--max-model-len", str(self.max_length),
                "--speculative-config", json.dumps(self.speculative_config()),
                "--kv-transfer-config", json.dumps(self.kv_transfer_config(storage))]
        if self.trust_remote_code:
            argv.append("--trust-remote-code")
        for k, v in self.extra.items():
            argv += [f"--{k.replace('_', '-')}", v if isinstance(v, str) else json.dumps(v)]
        return argv

    def invocation(self, storage: str | os.PathLike | None = None) -> dict:
        """What ``--dry-run`` prints: every argument, exactly as the run would pass it."""
        storage = storage or self.staging_hint()
        return {
            "engine": f"vllm (tested argument construction: {VLLM_REQUIREMENT})",
            "llm_kwargs": self.llm_kwargs(storage),
            "sampling_params": self.sampling_kwargs(0) if not self.generate else
            dict(self.sampling_kwargs(0), max_tokens=f"min({self.generate}, {self.max_length} - prompt tokens)"),
            "prompts": "TokensPrompt(prompt_token_ids=...) per prompt, tokenized here"
                       + (" through the chat template" if self.chat_template else " as plain text"),
            "serve": " ".join(shlex.quote(a) for a in self.serve_argv(self.out.parent / f"{self.out.name}-connector")),
            "vllm_layer_ids": list(self.vllm_ids),
            "layers": {"numbering": "eagle3conv: output of layer i; -1 the embedding output",
                       "output_of": list(self.output_of)},
            "out": str(self.out),
            "files": [FILE_PATTERN.format("{i}"), SIDECAR],
        }

    def staging_hint(self) -> str:
        return str(self.out.parent / f".{self.out.name}.eagle3conv-XXXX" / "connector")


def vllm_ids_for(layers: Iterable[int] | None, num_layers: int) -> tuple[int, ...]:
    """vLLM ids for eagle3conv output-of ``layers`` (None: every layer); the embedding
    output (id 0) is always included. :class:`UsageError` for a layer the target lacks."""
    from eagle3conv.states.capture import wanted_layers

    return tuple([0] + [i + 1 for i in wanted_layers(layers, num_layers, "captured")])


def target_dims(target: str, *, trust_remote_code: bool = False) -> tuple[int, int, int]:
    """(num_layers, hidden_size, vocab_size) from the target's config.json (its text config
    for multimodal targets), read by transformers as vLLM reads it."""
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(target, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds; the user needs the words
        raise CheckpointReadError(f"--target {target}: cannot read its config.json ({type(e).__name__}: {e})"[:500],
                                  hint="pass a model folder or Hub id vLLM can load; add --trust-remote-code "
                                       "for targets with their own config code") from None
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    try:
        return int(text.num_hidden_layers), int(text.hidden_size), int(text.vocab_size)
    except (AttributeError, TypeError) as e:
        raise CheckpointReadError(f"--target {target}: its config names no num_hidden_layers/hidden_size/"
                                  f"vocab_size ({e})") from None


def parse_vllm_args(items: Sequence[str]) -> dict:
    """``--vllm-arg KEY=VALUE`` pairs as LLM keyword arguments (VALUE read as JSON, else a string)."""
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().removeprefix("--").replace("-", "_")
        if not sep or not key.isidentifier():
            raise UsageError(f"--vllm-arg {item!r}: write KEY=VALUE, e.g. --vllm-arg gpu_memory_utilization=0.9")
        if key in ("model", "speculative_config", "kv_transfer_config", "tensor_parallel_size", "dtype",
                   "max_model_len", "trust_remote_code"):
            raise UsageError(f"--vllm-arg {key}: capture sets it (see --dry-run); use its own option")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


# --------------------------------------------------------------------------- the run


@dataclass
class VllmCaptureResult:
    out: Path
    sequences: int
    tokens: int
    generated_tokens: int
    vllm_ids: tuple[int, ...]
    categories: dict | None
    sidecar: dict
    plan: VllmCapturePlan | None = None  # what was run (its verdict says what was asked)

    def verdict(self) -> CaptureVerdict | None:
        """What was captured, against what was asked (a :class:`~eagle3conv.states.capture.CaptureVerdict`)."""
        return None if self.plan is None else self.plan.verdict(self)

    def to_dict(self) -> dict:
        v = self.verdict()
        return {"engine": "vllm", "out": str(self.out), "sequences": self.sequences, "tokens": self.tokens,
                "generated_tokens": self.generated_tokens, "vllm_layer_ids": list(self.vllm_ids),
                "layers": [i - 1 for i in self.vllm_ids], "categories": self.categories,
                "sidecar": str(self.out / SIDECAR), "verdict": None if v is None else v.to_dict()}


def check_out_folder(out: Path) -> None:
    """``--out`` for a vLLM capture: a new folder (or an empty one) in an existing folder."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out}: already exists and is not an empty folder; capture never writes over files",
                         hint="name a new folder")
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: the folder {out.parent} does not exist")


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError:
        raise Eagle3ConvError("capture --engine vllm needs vLLM, which is not installed",
                              hint="pip install 'eagle3conv[vllm]' (vLLM " + VLLM_RELEASE + ", on a GPU machine)") from None
    return vllm


def run_vllm_capture(plan: VllmCapturePlan, prompts: Sequence[Any], *, progress=None) -> VllmCaptureResult:
    """Run the capture (needs vLLM and GPUs); see the module docstring."""
    from transformers import AutoTokenizer

    from eagle3conv.states.capture import Prompt, encode_prompt
    from eagle3conv.states.format import category_counts, known_categories

    check_out_folder(plan.out)
    vllm = _import_vllm()
    items = [Prompt.of(p, f"prompt {i}") for i, p in enumerate(prompts)]
    if not items:
        raise UsageError("no prompts to capture")
    tok = AutoTokenizer.from_pretrained(plan.target, trust_remote_code=plan.trust_remote_code)
    chat = plan.chat_template and bool(getattr(tok, "chat_template", None))
    budget = plan.max_length - 1  # room for the one token every request generates (max_model_len = max_length)
    encoded = [encode_prompt(tok, p, chat, budget) for p in items]
    staging = Path(tempfile.mkdtemp(prefix=f".{plan.out.name}.eagle3conv-", dir=plan.out.parent))
    try:
        storage = staging / "connector"
        llm = vllm.LLM(**plan.llm_kwargs(storage))
        params = [vllm.SamplingParams(**plan.sampling_kwargs(len(ids))) for ids, _ in encoded]
        outputs = llm.generate([{"prompt_token_ids": ids} for ids, _ in encoded], params, use_tqdm=True)
        sequences = []
        for i, (out, (ids, start), p) in enumerate(zip(outputs, encoded, items, strict=True)):
            sequences.append(_keep_file(plan, staging, i, out, ids, start if not plan.generate else len(ids), p))
            if progress:
                progress("files", i + 1, len(items))
        shutil.rmtree(storage, ignore_errors=True)
        sidecar = _sidecar(plan, sequences, chat, vllm.__version__)
        (staging / SIDECAR).write_text(json.dumps(sidecar, indent=2) + "\n", encoding="utf-8")
        if plan.out.exists():
            plan.out.rmdir()  # empty, checked above
        os.replace(staging, plan.out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return VllmCaptureResult(out=plan.out, sequences=len(sequences), tokens=sum(s["tokens"] for s in sequences),
                             generated_tokens=sum(s["generated"] for s in sequences), vllm_ids=plan.vllm_ids,
                             categories=category_counts(known_categories(s["category"] for s in sequences)),
                             sidecar=sidecar, plan=plan)


def _keep_file(plan: VllmCapturePlan, staging: Path, i: int, out: Any, ids: list[int], response_start: int,
               prompt: Any) -> dict:
    """Wait for the connector's file of request ``i``, check it, move it to ``hs_{i}``; its sidecar entry."""
    import fcntl

    from safetensors import safe_open

    params = getattr(out, "kv_transfer_params", None) or {}
    src = params.get("hidden_states_path")
    if not src:
        raise WriteError(f"vLLM returned no hidden_states_path for prompt {i}: the {CONNECTOR} did not run",
                         hint="check the vLLM log; run with --dry-run to see the configuration")
    lock = Path(src + ".lock")
    if lock.exists():
        with open(lock) as lf:
            fcntl.flock(lf, fcntl.LOCK_SH)  # the connector holds LOCK_EX until the file is written
        lock.unlink(missing_ok=True)
    generated = list(out.outputs[0].token_ids)
    expect = ids + (generated[:-1] if plan.generate else [])
    dest = staging / FILE_PATTERN.format(i)
    shutil.move(src, dest)
    with safe_open(str(dest), framework="pt") as f:
        got = f.get_tensor("token_ids").tolist()
        shape = list(f.get_slice("hidden_states").get_shape())
    if got != expect:
        raise WriteError(f"{dest.name}: token_ids differ from the {len(expect)} ids sent for prompt {i}")
    want = [len(expect), len(plan.vllm_ids), plan.hidden_size]
    if shape != want:
        raise WriteError(f"{dest.name}: hidden_states is {shape}, expected {want} (tokens, ids, hidden size)")
    return {"file": dest.name, "tokens": len(expect), "prompt_tokens": response_start,
            "generated": len(generated) if plan.generate else 0,
            "next_token": generated[-1] if generated else None,
            "finish_reason": getattr(out.outputs[0], "finish_reason", None), "category": prompt.category}


def _sidecar(plan: VllmCapturePlan, sequences: list[dict], chat: bool, vllm_version: str) -> dict:
    from eagle3conv.version import __version__

    return {
        "format": SIDECAR_FORMAT, "version": SIDECAR_VERSION,
        "written_by": f"eagle3conv {__version__} capture --engine vllm",
        "engine": {"name": "vllm", "version": vllm_version, "method": METHOD, "connector": CONNECTOR,
                   "tensor_parallel_size": plan.tensor_parallel_size, "dtype": plan.dtype},
        "target": plan.target, "num_layers": plan.num_layers, "hidden_size": plan.hidden_size,
        "vocab_size": plan.vocab_size,
        "vllm_layer_ids": list(plan.vllm_ids), "layer_numbering": NUMBERING,
        "layers": [{"output_of": i} for i in plan.output_of],
        "chat_template": chat, "generate_tokens": plan.generate, "max_length": plan.max_length,
        "loss_mask": "positions >= prompt_tokens: the target's own response (every position when it equals tokens)",
        "sequences": sequences,
    }


# --------------------------------------------------------------------------- reading the record


@dataclass(frozen=True)
class CapturedSequence:
    """One sequence of :data:`SIDECAR`: its file, lengths, the token after its last position, category."""

    file: str
    tokens: int
    prompt_tokens: int
    generated: int  # tokens vLLM decoded (0: the response, if any, came from the prompts file)
    next_token: int | None
    category: str | None

    def loss_mask(self) -> list[bool]:
        """Per position: scored (the target's response), or every position without a response."""
        if self.prompt_tokens >= self.tokens:
            return [True] * self.tokens
        return [t >= self.prompt_tokens for t in range(self.tokens)]

    def target_next(self, token_ids: Sequence[int]) -> list[int]:
        """The target's greedy next token per position where the capture knows it, -1 where it does
        not: in a response vLLM generated, the file's next token; after the last position,
        ``next_token``; at prompt positions (and in a response the prompts file gave) nothing."""
        if len(token_ids) != self.tokens:
            raise CheckpointReadError(f"{self.file}: {len(token_ids)} token ids, the record says {self.tokens}")
        out = [-1] * self.tokens
        if self.generated:
            for t in range(max(self.prompt_tokens - 1, 0), self.tokens - 1):
                out[t] = int(token_ids[t + 1])
        if self.next_token is not None:
            out[-1] = int(self.next_token)
        return out


@dataclass(frozen=True)
class CaptureRecord:
    """:data:`SIDECAR`, validated: what a reader of the ``hs_{i}`` files needs and they do not hold."""

    path: Path
    target: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    vllm_ids: tuple[int, ...]
    sequences: tuple[CapturedSequence, ...]

    @property
    def output_of(self) -> tuple[int, ...]:
        return tuple(i - 1 for i in self.vllm_ids)

    @property
    def categories(self) -> tuple[str | None, ...] | None:
        from eagle3conv.states.format import known_categories

        return known_categories(s.category for s in self.sequences)


def read_capture_record(folder: str | os.PathLike) -> CaptureRecord | None:
    """The folder's :data:`SIDECAR`, or None when it has none; :class:`CheckpointReadError` naming
    the field when it is not one this eagle3conv reads."""
    from eagle3conv.io.jsonfile import read_json_file
    from eagle3conv.states.format import is_category

    path = Path(folder) / SIDECAR
    if not path.is_file():
        return None
    doc = read_json_file(path, SIDECAR)

    def bad(key: str, want: str) -> CheckpointReadError:
        return CheckpointReadError(f"{path}: '{key}' must be {want}, it is {doc.get(key) if isinstance(doc, dict) else doc!r}"[:300])

    def integer(obj: dict, key: str, low: int = 0, where: str = "") -> int:
        v = obj.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise CheckpointReadError(f"{path}: '{where}{key}' must be an integer >= {low}, it is {v!r}")
        return v

    if not isinstance(doc, dict) or doc.get("format") != SIDECAR_FORMAT:
        raise bad("format", repr(SIDECAR_FORMAT))
    if doc.get("version") != SIDECAR_VERSION:
        raise CheckpointReadError(f"{path}: version {doc.get('version')!r}; this eagle3conv reads version "
                                  f"{SIDECAR_VERSION}", hint="upgrade eagle3conv")
    n = integer(doc, "num_layers", 1)
    ids = doc.get("vllm_layer_ids")
    if (not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
            or ids != sorted(set(ids)) or ids[0] < 0 or ids[-1] > n):
        raise bad("vllm_layer_ids", f"ascending distinct ids in 0..{n} (vLLM's numbering)")
    layers = doc.get("layers")
    if layers != [{"output_of": i - 1} for i in ids]:
        raise bad("layers", "the vllm_layer_ids in eagle3conv's numbering (each id minus 1)")
    seqs = doc.get("sequences")
    if not isinstance(seqs, list) or not seqs:
        raise bad("sequences", "a non-empty list")
    out = []
    for i, s in enumerate(seqs):
        where = f"sequences[{i}]."
        if not isinstance(s, dict) or s.get("file") != FILE_PATTERN.format(i):
            raise CheckpointReadError(f"{path}: '{where}file' must be {FILE_PATTERN.format(i)!r}")
        tokens = integer(s, "tokens", 1, where)
        prompt = integer(s, "prompt_tokens", 0, where)
        if prompt > tokens:
            raise CheckpointReadError(f"{path}: '{where}prompt_tokens' {prompt} is more than its {tokens} tokens")
        nxt = s.get("next_token")
        if nxt is not None:
            nxt = integer(s, "next_token", 0, where)
        cat = s.get("category")
        if cat is not None and not is_category(cat):
            raise CheckpointReadError(f"{path}: '{where}category' must be a non-empty string or null")
        out.append(CapturedSequence(file=s["file"], tokens=tokens, prompt_tokens=prompt,
                                    generated=integer(s, "generated", 0, where), next_token=nxt, category=cat))
    target = doc.get("target")
    if not isinstance(target, str):
        raise bad("target", "the target's name")
    return CaptureRecord(path=path, target=target, num_layers=n, hidden_size=integer(doc, "hidden_size", 1),
                         vocab_size=integer(doc, "vocab_size", 1), vllm_ids=tuple(ids), sequences=tuple(out))


__all__ = [
    "CONNECTOR", "FILE_PATTERN", "METHOD", "CaptureRecord", "CapturedSequence", "read_capture_record", "NUMBERING", "SIDECAR", "SIDECAR_FORMAT", "SIDECAR_VERSION",
    "VLLM_RELEASE", "VLLM_REQUIREMENT", "VllmCapturePlan", "VllmCaptureResult", "check_out_folder",
    "parse_vllm_args", "run_vllm_capture", "target_dims", "vllm_ids_for",
]
