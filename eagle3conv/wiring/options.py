"""``WiringOptions``: what the user said about the target and the layers the drafter was trained on.

One declaration serves the library (``inspect``/``fix_keys``/``configure``/``launch`` take it), the
command line (its options are generated from these fields, :mod:`eagle3conv.io.options`) and the
fix commands eagle3conv prints (:meth:`WiringOptions.flags`). Imports nothing heavy: the command
line reads it to build ``--help``.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3conv.errors import UsageError
from eagle3conv.io import options as _options
from eagle3conv.io.options import option

ENGINE_HELP = ("Check (and write ids) for this engine release: ENGINE or ENGINE==RELEASE, e.g. sglang==0.5.23, "
               "vllm==0.33, trtllm; repeatable. A bare name means the newest known release. vLLM's runner: "
               "vllm==0.33.0:runner=v1 (default mrv2). Default: the releases each engine's rules check by default "
               "(mappings/engines/*.json check_by_default; `eagle3conv targets NAME` shows what each captures).")

SGLANG_VERSIONS = ("auto", "old", "new")


def _positive_tokens(value: int) -> str | None:
    return "must be a positive number of tokens" if value < 1 else None


@dataclass(frozen=True)
class WiringOptions:
    """What the user said on the command line (all optional)."""

    target: str | None = option(metavar="TARGET", help=(
        "The target model: a built-in profile (see `eagle3conv targets`) or a path to its config.json or model "
        "folder."))
    trained_on: str | None = option(metavar="IDS", help=(
        "The layers the drafter was trained on, e.g. 3,31,59 (with --captured-at)."))
    captured_at: str | None = option(choices=("input", "output"), help=(
        "How --trained-on counts: 'input' (id L = input of layer L = output of L-1; vLLM, dump file names) or "
        "'output' (id i = output of layer i; SpecForge, TensorRT-LLM)."))
    metadata: str | None = option(path={"exists": True}, help=(
        "A training_metadata.json (or its folder) recording the layers the drafter was trained on."))
    dumps: str | None = option(path={"exists": True, "file_okay": False}, help=(
        "A folder of aux dumps (aux_0.pt, ... with manifest.json) naming the capture layers."))
    sglang_version: str = option("auto", choices=SGLANG_VERSIONS, show_default=True, help=(
        "An alias: old = --engine sglang==OLDEST, new = --engine sglang==NEWEST (the oldest and newest SGLang "
        "releases eagle3conv read, `eagle3conv targets NAME` shows them), put before any other --engine; auto: "
        "nothing."))
    """``--sglang-version old|new``: an alias of ``--engine sglang==OLDEST`` / ``sglang==NEWEST`` (the
    oldest and newest SGLang releases read), put before any ``--engine``; ``auto``: nothing."""
    engines: tuple[str, ...] = option((), flag="--engine", metavar="ENGINE[==RELEASE]", multiple=True,
                                      help=ENGINE_HELP)
    """``--engine`` (repeatable): ``sglang==0.5.23``, ``vllm``...; empty: the default set."""
    max_context: int | None = option(metavar="TOKENS", check=_positive_tokens, help=(
        "The longest context the drafter will serve: the config audit warns when max_position_embeddings is "
        "below it (default: the target's max_position_embeddings where its profile names one)."))
    """``--max-context``: the longest context served (the audit's max_position_embeddings check)."""
    rewire: bool = option(False, help=(
        "When the config's aux-layer ids contradict the training record, write the record's layers."))

    def asked(self) -> tuple[str, ...]:
        """The ``--engine`` specs asked, ``--sglang-version`` (an alias) first."""
        from eagle3conv.spec.engines import edge_release

        if self.sglang_version in ("old", "new"):
            alias = edge_release("sglang", "oldest" if self.sglang_version == "old" else "newest").spec
            return (alias, *self.engines)
        if self.sglang_version not in ("auto", None):
            raise UsageError(f"--sglang-version must be auto, old or new, got '{self.sglang_version}'")
        return tuple(self.engines)

    def releases(self) -> tuple:
        """The engine releases to check and write for (parsed; UsageError on a bad one)."""
        from eagle3conv.spec.engines import default_engines, parse_engine

        asked = self.asked()
        if not asked:
            return default_engines()
        out = []
        for text in asked:
            rel = parse_engine(text)
            if rel not in out:
                out.append(rel)
        return tuple(out)

    def flags(self, command: str) -> str:
        """The options of ``eagle3conv COMMAND`` that give these (generated from the fields: a fix command
        eagle3conv prints repeats what the user said, nothing more, nothing lost)."""
        return _options.flags(self, COMMAND_FIELDS[command])


# the wiring options each command takes, in the order its --help lists them
WIRING = ("target", "trained_on", "captured_at", "metadata", "sglang_version", "engines", "max_context")
COMMAND_FIELDS = {
    "inspect": WIRING,
    "fix-keys": WIRING + ("rewire",),
    "config": WIRING + ("dumps",),
    "verify": WIRING,
    "launch": ("target", "engines", "max_context"),
    "push": ("engines",),
}

GROUPS = COMMAND_FIELDS  # cli.py names a group of options by its command

__all__ = ["GROUPS", "COMMAND_FIELDS", "ENGINE_HELP", "SGLANG_VERSIONS", "WIRING", "WiringOptions"]
