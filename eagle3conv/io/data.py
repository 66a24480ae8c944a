"""Where the declarative data files (mappings/) live.

In a source checkout or an editable install they are the top-level
``mappings/`` folder; a wheel ships the same folder as ``eagle3conv/_mappings``
(pyproject's force-include). Code never hard-codes either location.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent  # the eagle3conv package folder


def data_root() -> Path:
    installed = _PACKAGE / "_mappings"
    if installed.is_dir():
        return installed
    source = _PACKAGE.parent / "mappings"
    if source.is_dir():
        return source
    raise FileNotFoundError(
        f"eagle3conv's mapping data is missing: looked in {installed} and {source}"
    )


def data_path(*parts: str) -> Path:
    return data_root().joinpath(*parts)
