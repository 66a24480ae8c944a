"""``VerifyOptions``: what :func:`eagle3conv.verify.verify` is asked to do (the ``verify`` command's options).

Declared once: the command line generates its options from these fields (:mod:`eagle3conv.io.options`).
Imports nothing heavy (``verify --help`` reads it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from eagle3conv.errors import UsageError
from eagle3conv.io.dtypes import DTYPE_CHOICES
from eagle3conv.io.options import option


def _ids(text: str) -> tuple[int, ...]:
    from eagle3conv.spec.layers import parse_ids  # when a value is read: --help imports nothing more

    return parse_ids(text)


def _ids_text(ids) -> str:
    return ",".join(str(i) for i in ids)


@dataclass(frozen=True)
class VerifyOptions:
    """What :func:`verify` is asked to do (the ``verify`` command's options).

    ``layers`` (output-of-layer ids) overrides the config's wiring. ``states_layers``
    names the stored slots of sources that do not record them, in the numbering of the run
    that wrote them (vLLM's ids for vLLM files; output-of-layer ids for SpecForge records and
    dumps without a manifest); without it they are taken to be the config's wiring, and the
    report says these states cannot check the wiring. ``embeddings``: the target's weights (a
    model folder, a safetensors file or a GGUF), for states without the embedding output and
    for the target's own next tokens where the states hold its last hidden state.
    ``training_states``: the trainer's own data, whose per-slot norms are compared with the
    inference states'. ``min_accept``: the step-1 acceptance below which verify fails
    (exit 4, after saving the report)."""

    wiring_options: object = None
    layers: Sequence[int] | None = option(metavar="IDS", parse=_ids, unparse=_ids_text, help=(
        "Score this wiring (output-of-layer ids, -1 = embedding output) instead of the config's."))
    states_layers: Sequence[int] | None = option(metavar="IDS", parse=_ids, unparse=_ids_text, help=(
        "The layers of the stored slots, for states that do not record them, in the numbering of the run that "
        "wrote them: vLLM files take the ids vLLM was given (id i = output of layer i-1, N = the last layer's); "
        "SpecForge records and dumps without manifest.json take output-of-layer ids. Without it these states "
        "cannot check the wiring (the report says so). Files from capture --engine vllm need none: their "
        "eagle3conv-capture.json names them."))
    embeddings: str | os.PathLike | None = option(path={"exists": True}, help=(
        "The target's weights (a model folder, a .safetensors file or a .gguf): its embedding table for states "
        "without the embedding output, and its final norm and lm_head for its own next tokens where the states "
        "hold its last hidden state."))
    training_states: str | os.PathLike | None = option(path={"exists": True}, metavar="PATH", help=(
        "The trainer's own data (any format --states reads): its per-slot norms are compared with the inference "
        "states', slot by slot."))
    search: bool = option(False, flag="--search-wiring", help=(
        "Search every wiring of the layers the states hold (screened on step-1 acceptance, the best confirmed "
        "with the config's, the record's and engine defaults) and name the one the drafter was trained on where "
        "the data separates it. Automatic when config.json names no layers."))
    search_budget: float | None = option(metavar="SECONDS", help=(
        "The seconds the search's screen may spend (it stops at a stage boundary and says what more would "
        "read); default: 15 on a GPU, on a CPU a work cap the report names."))
    """Seconds the search's screen may spend (None: 15 s on a GPU, else its work cap)."""
    steps: int = option(3, show_default=True, help="Draft steps per chain.")
    min_accept: float | None = option(help=(
        "Fail (exit 4) when step-1 acceptance is below this fraction."))
    device: str = option("auto", show_default=True, help="auto (GPU when present), cpu, cuda, cuda:N.")
    dtype: str = option("auto", choices=("auto", *DTYPE_CHOICES), show_default=True,
                        help=("auto: bf16 on GPU, fp32 on CPU (a wiring search: bf16 where the CPU has "
                              "native bf16 matmul)."))
    batch_size: int = option(8, show_default=True, help="Sequences per forward.")
    max_sequences: int | None = option(help="Score only the first N sequences.")
    save: bool = option(True, flag="--no-save", negates=True, help=(
        "Do not write eagle3conv-verify.json into the checkpoint folder."))
    reference_drafter: str | os.PathLike | None = option(
        flag="--reference", path={"exists": True, "file_okay": False}, metavar="BF16_DRAFTER", help=(
            "A quantized drafter's bf16 original: scored on the same states and wiring; the report gives the "
            "accept-length cost of quantization with its paired 95% interval."))
    """A bf16 drafter to score on the same states and wiring: the report's quantization cost."""
    raw_modules: Sequence[str] = ()
    """Quantized modules run as a release that builds them unquantized loads them (SGLang's fc)."""

    def check(self) -> None:
        """Refuse values no run can use, before anything is read."""
        if self.steps < 1 or self.steps > 16:
            raise UsageError(f"--steps must be between 1 and 16, got {self.steps}")
        if self.min_accept is not None and not 0 <= self.min_accept <= 1:
            raise UsageError(f"--min-accept is a fraction between 0 and 1, got {self.min_accept}")
        if self.max_sequences is not None and self.max_sequences < 1:
            raise UsageError(f"--max-sequences must be at least 1, got {self.max_sequences}")
        if self.batch_size < 1:
            raise UsageError(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.search_budget is not None and not self.search_budget > 0:
            raise UsageError(f"--search-budget is seconds above 0, got {self.search_budget}")


# the options of `verify`, in the order its --help lists them (after --states and the wiring options)
SCORING = ("layers", "states_layers", "embeddings", "training_states", "search", "search_budget", "steps",
           "min_accept", "device", "dtype", "batch_size", "max_sequences")

GROUPS = {"scoring": SCORING}  # the groups of options cli.py names

__all__ = ["GROUPS", "SCORING", "VerifyOptions"]
