"""Test hooks: honoured only when ``EAGLE3CONV_TEST_HOOKS=1`` is set (docs/testing.md).

The crash and race tests need a command to die or wait at a named instant, and
to move bytes in small chunks. An installed eagle3conv ignores every hook unless
that one switch is on, so a variable left in a user's environment changes
nothing. With the switch on, every hook is parsed and checked once, before a
command does any work (:func:`check`, called by the CLI): a bad value is a usage
error then, never an internal error half-way, and never after a commit. A hook
never changes what a command reports; it can only stop or delay it.

``EAGLE3CONV_KILL_AT_STEP=N``
    SIGKILL the process at the N-th filesystem step of a write (N >= 1).
``EAGLE3CONV_STALL_AT=POINT:SECONDS[,POINT:SECONDS]``
    Sleep at the named point (0 to :data:`MAX_STALL` seconds); ``POINT:@FILE``
    waits there until FILE exists (at most :data:`MAX_STALL` seconds).
    Points: ``before-journal``, ``after-commit``, ``out-before-rename``.
``EAGLE3CONV_CHUNK_BYTES=N``
    The writer's chunk size in bytes (4096 to 256 MiB).
"""

from __future__ import annotations

import math
import os
import signal
import time
from dataclasses import dataclass, field

SWITCH = "EAGLE3CONV_TEST_HOOKS"
MAX_STALL = 120.0  # seconds: a stalled command holds its folder's lock at most this long
POINTS = ("before-journal", "after-commit", "out-before-rename")
CHUNK_RANGE = (4096, 256 << 20)


@dataclass(frozen=True)
class Hooks:
    kill_at_step: int | None = None
    stalls: dict = field(default_factory=dict)  # point -> seconds (float) or "@FILE"
    chunk_bytes: int | None = None
    problems: tuple[str, ...] = ()


def _parse(env) -> Hooks:
    if env.get(SWITCH) != "1":
        return Hooks()
    problems = []
    kill = None
    raw = env.get("EAGLE3CONV_KILL_AT_STEP")
    if raw:
        if raw.isdigit() and len(raw) <= 9 and int(raw) >= 1:
            kill = int(raw)
        else:
            problems.append(f"EAGLE3CONV_KILL_AT_STEP={raw[:40]!r}: expected a whole number of steps >= 1")
    chunk = None
    raw = env.get("EAGLE3CONV_CHUNK_BYTES")
    if raw:
        lo, hi = CHUNK_RANGE
        if raw.isdigit() and len(raw) <= 12 and lo <= int(raw) <= hi:
            chunk = int(raw)
        else:
            problems.append(f"EAGLE3CONV_CHUNK_BYTES={raw[:40]!r}: expected a number of bytes from {lo} to {hi}")
    stalls = {}
    raw = env.get("EAGLE3CONV_STALL_AT")
    if raw:
        for item in raw.split(","):
            name, sep, arg = item.strip().partition(":")
            if name not in POINTS or not sep:
                problems.append(f"EAGLE3CONV_STALL_AT item {item[:60]!r}: expected POINT:SECONDS or POINT:@FILE "
                                f"with POINT one of {', '.join(POINTS)}")
                continue
            if arg.startswith("@") and len(arg) > 1:
                stalls[name] = arg
                continue
            try:
                seconds = float(arg)
            except ValueError:
                seconds = math.nan
            if not (math.isfinite(seconds) and 0 <= seconds <= MAX_STALL):
                problems.append(f"EAGLE3CONV_STALL_AT item {item[:60]!r}: seconds must be a number from 0 to "
                                f"{MAX_STALL:g}")
                continue
            stalls[name] = seconds
    return Hooks(kill, stalls, chunk, tuple(problems))


_hooks: Hooks | None = None


def hooks() -> Hooks:
    global _hooks
    if _hooks is None:
        _hooks = _parse(os.environ)
    return _hooks


def check() -> None:
    """Raise :class:`~eagle3conv.errors.UsageError` for a bad hook (only with the switch on)."""
    problems = hooks().problems
    if problems:
        from eagle3conv.errors import UsageError

        raise UsageError(f"{problems[0]} ({SWITCH}=1 turns the test hooks on)", details=list(problems),
                         hint=f"fix the variable, or unset {SWITCH} (the hooks are for eagle3conv's own tests)")


def chunk_bytes(default: int) -> int:
    return hooks().chunk_bytes or default


class StepCounter:
    """Counts the filesystem steps of a write; SIGKILLs at ``EAGLE3CONV_KILL_AT_STEP``."""

    def __init__(self):
        self.count = 0

    def __call__(self) -> None:
        self.count += 1
        kill = hooks().kill_at_step
        if kill is not None and self.count >= kill:
            os.kill(os.getpid(), signal.SIGKILL)


def stall(point: str) -> None:
    """Wait at ``point`` if ``EAGLE3CONV_STALL_AT`` names it; never raises (a Ctrl-C while
    waiting is the caller's, as at any other instant)."""
    arg = hooks().stalls.get(point)
    if arg is None:
        return
    if isinstance(arg, str):
        deadline = time.monotonic() + MAX_STALL
        while not os.path.exists(arg[1:]) and time.monotonic() < deadline:
            time.sleep(0.02)
        return
    time.sleep(arg)
