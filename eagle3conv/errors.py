"""One exception hierarchy for the whole package.

Every error carries the exit code the CLI returns for it and an optional
``hint``: the command or flag to try next. The CLI catches
:class:`Eagle3ConvError` once, prints ``error: <message>`` (and ``hint:``),
and exits with ``exit_code``. Nothing else in the package prints.

Exit codes (documented in the README):

====  =================================================================
0     success
1     error: unreadable input, I/O failure, a refused operation
2     usage: bad flags or arguments (Click uses 2 as well)
3     checked and found invalid: the checkpoint or config breaks a rule
      (unmapped keys, wrong shapes, bad vocab maps, wrong aux wiring)
4     verify ran and the drafter failed its threshold
====  =================================================================
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INVALID = 3
EXIT_VERIFY_FAILED = 4


class Eagle3ConvError(Exception):
    """Base class. ``message`` names the file or key and says why; ``verdict``, where a command's refusal is
    its verdict (push's gate), that typed verdict (its ``to_dict`` is the document's ``verdict``)."""

    exit_code = EXIT_ERROR
    verdict = None

    def __init__(self, message: str, *, hint: str | None = None, details: list[str] | None = None,
                 verdict=None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = list(details or [])
        self.verdict = verdict

    def to_dict(self) -> dict:
        d = {
            "error": type(self).__name__,
            "message": self.message,
            "hint": self.hint,
            "details": self.details,
            "exit_code": self.exit_code,
        }
        if self.verdict is not None:
            d["verdict"] = self.verdict.to_dict()
        return d


class UsageError(Eagle3ConvError):
    """The user asked for something that does not make sense."""

    exit_code = EXIT_USAGE


class CheckpointReadError(Eagle3ConvError):
    """A checkpoint file is missing, truncated, malformed or unreadable."""


class UnsafePickleError(CheckpointReadError):
    """A pickle asks to run code or build objects outside the weights-only allowlist."""


class WriteError(Eagle3ConvError):
    """Writing the output failed; the user's files were left as they were."""


class InvalidCheckpointError(Eagle3ConvError):
    """The checkpoint was read and breaks a rule (keys, shapes, vocab maps, config)."""

    exit_code = EXIT_INVALID


class MappingFileError(Eagle3ConvError):
    """A mapping or target data file is malformed (a bug in eagle3conv's data)."""


class WiringError(InvalidCheckpointError):
    """The aux-layer configuration disagrees with the training record or the target."""


class VerifyFailedError(Eagle3ConvError):
    """verify ran and the drafter fell below its threshold."""

    exit_code = EXIT_VERIFY_FAILED


class PushError(Eagle3ConvError):
    """Publishing to the Hub failed; nothing half-made was left on the server."""


class FolderBusyError(Eagle3ConvError):
    """Another eagle3conv process is writing (or reading) the folder; nothing was touched."""


class JournalError(InvalidCheckpointError):
    """An interrupted-write journal eagle3conv cannot trust or act on; nothing was touched."""


class JournalKeyError(Eagle3ConvError):
    """An in-place write found no usable journal key to sign its crash journal with; nothing was
    written (an unsigned journal could never be finished after a crash)."""


class FileSystemError(Eagle3ConvError):
    """The file system refused a read or a write (no space, read-only, permissions, a file where a folder
    was expected); the message names the path and the reason."""


class StdoutError(Eagle3ConvError):
    """The command's output could not be written to stdout (a full disk, a closed pipe); the
    command itself ran (and wrote whatever files it writes) before that."""
