"""The drafter forwards: Llama-style (:mod:`.drafter`) and MLA (:mod:`.mla`).

:func:`build_drafter` picks the class from the config's ``architectures``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

    from eagle3conv.model.drafter import DrafterConfig, Eagle3Drafter

__all__ = ["build_drafter", "drafter_class", "drafter_config", "is_mla_config"]


def is_mla_config(config: Mapping[str, Any], keys: Any = ()) -> bool:
    """True for an MLA drafter: an Eagle3DeepseekV2/V3 architecture, or MLA tensor names."""
    from eagle3conv.spec.canonical import architecture_for

    return architecture_for(dict(config), list(keys)).key == "mla"


def drafter_class(config: Mapping[str, Any], keys: Any = ()) -> type[Eagle3Drafter]:
    """Eagle3MLADrafter for MLA configs, else Eagle3Drafter."""
    if is_mla_config(config, keys):
        from eagle3conv.model.mla import Eagle3MLADrafter

        return Eagle3MLADrafter
    from eagle3conv.model.drafter import Eagle3Drafter

    return Eagle3Drafter


def drafter_config(config: Mapping[str, Any], keys: Any = ()) -> DrafterConfig:
    """The parsed config: an MLAConfig for MLA drafters, else a DrafterConfig."""
    if is_mla_config(config, keys):
        from eagle3conv.model.mla import MLAConfig

        return MLAConfig.from_config(config)
    from eagle3conv.model.drafter import DrafterConfig

    return DrafterConfig.from_config(config)


def build_drafter(
    config: Mapping[str, Any], state_dict: Mapping[str, Tensor], **kwargs: Any
) -> Eagle3Drafter:
    """Load a drafter strictly with the class its architecture needs.

    ``kwargs`` are :class:`~eagle3conv.model.drafter.Eagle3Drafter`'s (``device``,
    ``dtype``, ``embed_tokens``, ``norm_before_residual``).
    """
    return drafter_class(config, state_dict.keys())(config, state_dict, **kwargs)
