"""Releases that read alike share a row: neighbouring releases of one engine whose rows say the same
thing (every field equal but the release's own name) are shown as one row, labelled with every
release (``sglang 0.5.12, 0.5.23``). The config check's rows (``--json``'s ``releases`` on each row,
the text), verify's scored rows and the card's tables group this way."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")


def alike(items: Iterable[T], engine: Callable[[T], str], body: Callable[[T], object]) -> list[list[T]]:
    """``items`` in order, neighbours of one ``engine`` with equal ``body`` grouped together."""
    out: list[list[T]] = []
    last: tuple[str, object] | None = None
    for it in items:
        key = (engine(it), body(it))
        if out and key == last:
            out[-1].append(it)
        else:
            out.append([it])
        last = key
    return out


def releases_label(names: Sequence[str]) -> str:
    """``sglang 0.5.12, 0.5.23`` for ``["sglang 0.5.12", "sglang 0.5.23"]``: the first release in full,
    the others by their version."""
    return ", ".join([names[0], *(n.split(" ", 1)[-1] for n in names[1:])])


__all__ = ["alike", "releases_label"]
