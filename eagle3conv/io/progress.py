"""The one progress-callback signature of every long operation.

``progress(stage, done, total)``: ``stage`` names the step (``"write"`` for
fix-keys' writer, ``"generate"``/``"forward"`` for capture, a wiring candidate for
verify, a sentence for push); ``done`` and ``total`` count its units (bytes,
sequences), ``total`` is None when unknown. A call with ``done == 0`` and
``total is None`` announces a step that has nothing to count (push's messages).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Progress"]

Progress = Callable[[str, int, "int | None"], None]
