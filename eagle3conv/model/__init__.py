"""The drafter forwards: Llama-style (:mod:`.drafter`) and MLA (:mod:`.mla`).

:func:`build_drafter` picks the class from the config's ``architectures``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

    from eagle3conv.model.drafter import DrafterConfig, Eagle3Drafter
    from eagle3conv.spec.engines import Run

__all__ = ["FORWARDS", "build_drafter", "drafter_class", "drafter_config", "is_mla_config"]

def _llama():
    from eagle3conv.model.drafter import DrafterConfig, Eagle3Drafter

    return Eagle3Drafter, DrafterConfig


def _mla():
    from eagle3conv.model.mla import Eagle3MLADrafter, MLAConfig

    return Eagle3MLADrafter, MLAConfig


FORWARDS = {"llama": _llama, "mla": _mla}
"""Architecture key (mappings/canonical.json ``architectures``) -> (drafter class, config class), imported
when asked. An architecture in canonical.json without a forward here fails ``tests/test_extending.py``
(docs/extending.md)."""


def _architecture_key(config: Mapping[str, Any], keys: Any) -> str:
    from eagle3conv.spec.canonical import architecture_for

    return architecture_for(dict(config), list(keys)).key


def _forward(config: Mapping[str, Any], keys: Any, which: int):
    return FORWARDS[_architecture_key(config, keys)]()[which]


def is_mla_config(config: Mapping[str, Any], keys: Any = ()) -> bool:
    """True for an MLA drafter: an Eagle3DeepseekV2/V3 architecture, or MLA tensor names."""
    return _architecture_key(config, keys) == "mla"


def drafter_class(config: Mapping[str, Any], keys: Any = ()) -> type[Eagle3Drafter]:
    """The forward class of the config's architecture (Eagle3MLADrafter for MLA, else Eagle3Drafter)."""
    return _forward(config, keys, 0)


def drafter_config(config: Mapping[str, Any], keys: Any = ()) -> DrafterConfig:
    """The parsed config: an MLAConfig for MLA drafters, else a DrafterConfig."""
    return _forward(config, keys, 1).from_config(config)


def build_drafter(
    config: Mapping[str, Any], state_dict: Mapping[str, Tensor], *, run: Run | None = None, **kwargs: Any
) -> Eagle3Drafter:
    """Load a drafter strictly with the class its architecture needs, run as ``run`` says (how an
    engine release runs it: :func:`eagle3conv.spec.engines.serving`; None: as config.json says).

    ``kwargs`` are :class:`~eagle3conv.model.drafter.Eagle3Drafter`'s (``device``,
    ``dtype``, ``embed_tokens``).
    """
    return drafter_class(config, state_dict.keys())(config, state_dict, run=run, **kwargs)
