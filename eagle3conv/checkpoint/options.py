"""``FixOptions``: how ``fix-keys`` (and ``inspect``, which plans the same fix) reads and writes a checkpoint.

Declared once: the command line generates its options from these fields (:mod:`eagle3conv.io.options`);
the wiring options are :class:`eagle3conv.wiring.options.WiringOptions`. Imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3conv.io.dtypes import DTYPE_CHOICES
from eagle3conv.io.options import option
from eagle3conv.spec.drafter import LATER_LAYER_NORMS


def _modules(text: str) -> tuple[str, ...]:
    return tuple(m.strip() for m in text.split(",") if m.strip())


@dataclass(frozen=True)
class FixOptions:
    """What ``fix-keys`` is asked to do; ``inspect`` plans with the fields it shares."""

    out: str | None = option(path={}, help="Write to this new folder instead of in place.")
    source_format: str | None = option(flag="--from", metavar="FORMAT", help=(
        "Source format, overriding detection (see `eagle3conv formats`)."))
    config: str | None = option(path={"exists": True, "dir_okay": True}, help=(
        "Use this config.json (for checkpoints that ship none, e.g. the original EAGLE code)."))
    keep_embed: bool = option(False, help=(
        "Keep embed_tokens (dropped by default: SGLang replaces it, vLLM would serve a stale copy)."))
    dtype: str | None = option(choices=DTYPE_CHOICES, help=(
        "Cast floating-point weights (default: keep the source dtype)."))
    max_shard_size: str | int | None = option(metavar="SIZE", help=(
        "Shard the output, e.g. 5GB (default: shard like the source)."))
    dry_run: bool = option(False, help="Print the plan; write nothing.")
    dequantize: tuple[str, ...] = option((), metavar="MODULES", parse=_modules, unparse=",".join, help=(
        "Write these quantized modules (comma-separated, e.g. fc) in bf16, dequantized exactly as their scheme "
        "defines: for a release that cannot quantize them (SGLang 0.5.23's fc)."))
    later_norm: str | None = option(choices=tuple(LATER_LAYER_NORMS), help=(
        "Multi-layer drafters: the norm the later layers were trained with (vLLM reads input_layernorm, SGLang "
        "hidden_norm); written under both names. Default: the trainer's, where its format says."))
    follow_symlinks: bool = option(False, help=(
        "Read files that are symlinks leaving the folder through their link (refused by default); each one "
        "followed is named in the output."))
    accept_journal: bool = option(False, help=(
        "Finish your own interrupted in-place fix-keys from a journal eagle3conv cannot check (unsigned, older, "
        "or signed with a key you no longer have); every new file is still checked against it."))


# the options of `fix-keys` in the order its --help lists them: PLANNING, the wiring options, --rewire, WRITING
PLANNING = ("out", "source_format", "config", "keep_embed", "dtype", "max_shard_size", "dry_run", "dequantize",
            "later_norm")
WRITING = ("follow_symlinks", "accept_journal")
# what `inspect` takes (its own help for --config and --keep-embed: cli.py)
INSPECTING = ("source_format", "config", "keep_embed", "later_norm")

GROUPS = {"planning": PLANNING, "writing": WRITING, "inspect": INSPECTING}  # the groups cli.py names

__all__ = ["GROUPS", "FixOptions", "INSPECTING", "PLANNING", "WRITING"]
