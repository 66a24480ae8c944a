"""``PushOptions``: how :func:`eagle3conv.push` publishes a folder (the ``push`` command's options).

Declared once: the command line generates its options from these fields (:mod:`eagle3conv.io.options`).
Imports nothing heavy (``push --help`` reads it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from eagle3conv.io.options import option

# Every request to the Hub gets this long (seconds) to connect, send, or receive each piece of its
# answer; steps that change nothing (create with exist_ok, reads) are tried RETRIES more times after
# a timeout or a failed connection. Uploads are retried by huggingface_hub itself (5 more tries).
DEFAULT_TIMEOUT = 60.0


@dataclass(frozen=True)
class PushOptions:
    """What to publish, where and how (see :func:`eagle3conv.hub.push.push`)."""

    repo_id: str | None = option(metavar="ORG/NAME", help=(
        "Hub repo. Default: this folder's last push (eagle3conv-push.json), else training_metadata.json's "
        "hub_repo_id."))
    private: bool = option(False, help="Create the repo private (an existing repo keeps its visibility).")
    revision: str | None = option(metavar="BRANCH", help=(
        "Commit to BRANCH, creating it from main if needed; with --create-pr, the branch the PR targets."))
    create_pr: bool = option(False, help="Open a pull request (refs/pr/N) instead of committing to the branch.")
    commit_message: str | None = option(help="Commit summary (default: 'Upload EAGLE-3 drafter with eagle3conv').")
    include: Sequence[str] = option((), multiple=True, metavar="GLOB", help=(
        "Also send files matching GLOB (relative path; repeatable). Pickles and hidden files are never sent."))
    exclude: Sequence[str] = option((), multiple=True, metavar="GLOB", help=(
        "Do not send files matching GLOB (repeatable). --exclude README.md sends no card."))
    base_model: str | None = option(metavar="REPO", help=(
        "Target model for the card's base_model and launch lines (default: training metadata / config)."))
    force: bool = option(False, help="Push even if checks fail; the model card says which failed.")
    dry_run: bool = option(False, help="List the files (with sizes) and print the card; send nothing.")
    follow_symlinks: bool = option(False, help=(
        "Send files that are symlinks leaving the folder (refused by default); each one is named."))
    timeout: float | None = option(DEFAULT_TIMEOUT, show_default=True, metavar="SECONDS", help=(
        "Give up on a request the Hub does not answer within SECONDS (reads and repo creation are tried 3 "
        "times); nothing is committed then and pushing again is safe."))
    """Seconds each request to the Hub may take (None: no bound, as huggingface_hub)."""
    plot: str | os.PathLike | None = option(metavar="FILE", path={}, help=(
        "Also send the wiring-search figure FILE (from verify --plot, .svg or .png; under its file name, or its "
        "path inside the folder) and show it in the card's wiring section."))
    """The wiring-search figure (``verify --plot``, SVG or PNG), sent and embedded in the card."""


# the options of `push`, in the order its --help lists them: these, then --engine and --launch, then --plot
SENDING = ("repo_id", "private", "revision", "create_pr", "commit_message", "include", "exclude", "base_model",
           "force", "dry_run", "follow_symlinks", "timeout")

GROUPS = {"sending": SENDING}  # the groups of options cli.py names

__all__ = ["GROUPS", "DEFAULT_TIMEOUT", "SENDING", "PushOptions"]
