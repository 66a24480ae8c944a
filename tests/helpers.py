"""Helpers the test files share (imported as ``from helpers import ...``; pytest puts tests/ on the path)."""

from __future__ import annotations

from click.testing import CliRunner

from eagle3conv.cli import main


def run(*args, ok: int | None = 0):
    """The CLI in-process through Click's runner; asserts the exit code unless ``ok`` is None."""
    res = CliRunner().invoke(main, [str(a) for a in args])
    if ok is not None:
        assert res.exit_code == ok, f"exit {res.exit_code}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}\n{res.exception!r}"
    return res
