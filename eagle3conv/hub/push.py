"""``push``: publish a checked drafter checkpoint to the Hugging Face Hub.

Steps, in order (nothing is sent before step 4)::

    1. pick the repo id          argument > eagle3conv-push.json > training_metadata.json "hub_repo_id"
    2. run the gate              the caller's (eagle3conv.publish.default_gate: fix-keys is a no-op + smoke test)
    3. select files, render card what a server needs; README.md rendered in memory (hub/card.py)
    4. create_repo(exist_ok)     then the branch for --revision when it does not exist yet
    5. upload LFS/xet content    preupload_lfs_files: streamed from disk, nothing committed yet
    6. one commit                create_commit: all files land together, or none do
    7. write eagle3conv-push.json (atomically), the only local file a push writes

The local folder is never modified otherwise: the card is uploaded from bytes.
A second push of an unchanged folder creates no commit: huggingface_hub drops
files whose remote oid equals the local one (sha256 for LFS files, git sha1 for
regular ones) and, when nothing is left, skips the commit and returns the head
(logging "No files have been modified since last commit"). ``push`` compares
that with the head it read before and reports ``unchanged=True``.

The token comes from the argument, else ``HF_TOKEN``, else the stored login
(``huggingface_hub.get_token``). It is never printed, logged or put in an error:
errors from huggingface_hub are re-raised as :class:`PushError` with the token
scrubbed from their text, and without the original exception attached.

The push record ``eagle3conv-push.json`` (never uploaded)::

    {
      "format": "eagle3conv-push", "version": 1,
      "repo_id": "org/name", "repo_type": "model",
      "endpoint": "https://huggingface.co",
      "revision": "main",              # the branch committed to, or "refs/pr/N" for --create-pr
      "commit": "<40 hex>", "commit_url": "...", "pr_url": null,
      "unchanged": false, "forced": false,
      "files": {"model.safetensors": 123, ...},   # sizes in bytes
      "eagle3conv_version": "0.1.0"
    }
"""

from __future__ import annotations

import re

import fnmatch
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

from eagle3conv.io.files import atomic_write_text
from eagle3conv.checkpoint.links import following, present, safe_member
from eagle3conv.io.progress import Progress
from eagle3conv.errors import (
    Eagle3ConvError,
    InvalidCheckpointError,
    PushError,
    UsageError,
    WriteError,
)
from eagle3conv.hub.card import Check, gather_facts, render_card
from eagle3conv.hub.options import PushOptions


PUSH_RECORD = "eagle3conv-push.json"
PUSH_RECORD_FORMAT = "eagle3conv-push"
PUSH_RECORD_VERSION = 1

# What a server needs, at the top of the checkpoint folder.
DEFAULT_FILES = (
    "*.safetensors",
    "model.safetensors.index.json",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "README.md",
    "training_metadata.json",
    "eagle3conv-*.json",
    "speculation_profile.json",  # verify's acceptance profile (eagle3conv.verify.profile.PROFILE_FILE)
)
# Never sent, whatever --include says: pickles (they can run code when loaded), trainer state,
# hidden files (eagle3conv's staging/journal/backup), and the push record itself.
NEVER_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
# Files push reads besides the ones it sends (repo id, card facts): judged like sent files.
READ_FILES = ("README.md", "training_metadata.json", "config.json", "eagle3conv-verify.json",
              "speculation_profile.json", PUSH_RECORD)

# steps that change nothing (create with exist_ok, reads) are tried RETRIES more times after a timeout or a
# failed connection (each request bounded by PushOptions.timeout, DEFAULT_TIMEOUT by default). Uploads are
# retried by huggingface_hub itself (5 more tries).
RETRIES = 2

Gate = Callable[[Path], Iterable[Check]]


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class PushFile:
    path: str  # in the repo
    size: int
    source: str  # "local", "generated" (the README card) or "plot" (push --plot's figure, embedded in the card)


class PushOutcome(str, Enum):
    """What ``push`` did: :class:`PushVerdict`'s code."""

    COMMITTED = "committed"  # one commit on the branch (``revision``; None: main)
    PULL_REQUEST = "pull-request"  # one commit in a new pull request (``pr_url``, ``pr_revision``)
    UNCHANGED = "unchanged"  # the repo already holds these files: no commit was made
    DRY_RUN = "dry-run"  # nothing was sent (the card and the files are what a push would send)
    REFUSED = "refused"  # the gate failed without --force: nothing was sent (the error's verdict, exit 3)


class GateOutcome(str, Enum):
    """What the pre-push checks said (:class:`PushVerdict`'s ``gate``)."""

    PASSED = "passed"  # every check passed
    FORCED = "forced"  # checks failed (``failed``) and --force pushed past them: the card says so
    FAILED = "failed"  # checks failed (``failed``): the push was refused
    NO_CHECKS = "no-checks"  # no check ran (the library's ``gate=None``): the card says so


@dataclass(frozen=True)
class PushVerdict:
    """``push``'s verdict in codes and values (``--json``'s ``verdict``; the text's last line, and its
    ``forced:`` line): what was sent where, what the gate said and the checks that ``failed`` (their names)."""

    outcome: PushOutcome
    gate: GateOutcome
    repo_id: str
    failed: tuple[str, ...] = ()
    revision: str | None = None
    commit: str | None = None
    commit_url: str | None = None
    pr_url: str | None = None
    pr_revision: str | None = None

    def to_dict(self) -> dict:
        return {"outcome": self.outcome.value, "gate": self.gate.value, "failed": list(self.failed),
                "repo_id": self.repo_id, "revision": self.revision, "commit": self.commit,
                "commit_url": self.commit_url, "pr_url": self.pr_url, "pr_revision": self.pr_revision}


@dataclass
class PushResult:
    repo_id: str
    endpoint: str
    revision: str | None  # the branch asked for (None: main)
    create_pr: bool
    dry_run: bool
    files: list[PushFile]
    skipped: list[tuple[str, str]]  # (path, why it is not sent)
    card: str | None
    checks: list[Check]
    forced: bool
    unchanged: bool = False
    commit: str | None = None
    commit_url: str | None = None
    pr_url: str | None = None
    pr_revision: str | None = None
    repo_url: str | None = None
    record: Path | None = None
    followed_symlinks: list[tuple[str, str]] | None = None  # (link, target) read via --follow-symlinks

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def verdict(self) -> PushVerdict:
        """What was sent (or, dry run, would be) and what the gate said."""
        outcome = (PushOutcome.DRY_RUN if self.dry_run else PushOutcome.UNCHANGED if self.unchanged
                   else PushOutcome.PULL_REQUEST if self.pr_url else PushOutcome.COMMITTED)
        gate = GateOutcome.FORCED if self.forced else GateOutcome.PASSED if self.checks else GateOutcome.NO_CHECKS
        return PushVerdict(outcome, gate, self.repo_id, tuple(c.name for c in self.checks if not c.ok),
                           self.revision, self.commit, self.commit_url, self.pr_url, self.pr_revision)

    def to_dict(self) -> dict:
        return {
            "repo_id": self.repo_id,
            "endpoint": self.endpoint,
            "revision": self.revision,
            "create_pr": self.create_pr,
            "dry_run": self.dry_run,
            "files": [{"path": f.path, "size": f.size, "source": f.source} for f in self.files],
            "total_bytes": self.total_bytes,
            "skipped": [{"path": p, "why": w} for p, w in self.skipped],
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
            "forced": self.forced,
            "unchanged": self.unchanged,
            "commit": self.commit,
            "commit_url": self.commit_url,
            "pr_url": self.pr_url,
            "pr_revision": self.pr_revision,
            "repo_url": self.repo_url,
            "record": str(self.record) if self.record else None,
            "card": self.card,
            "followed_symlinks": [{"path": a, "target": b} for a, b in self.followed_symlinks or []],
            "verdict": self.verdict().to_dict(),
        }


# --------------------------------------------------------------------------- the gate


def _run_gate(gate: Gate, path: Path) -> list[Check]:
    try:
        return list(gate(path))
    except Eagle3ConvError as e:
        return [Check(getattr(gate, "__name__", "gate"), False, e.message)]


# --------------------------------------------------------------------------- files


def _hidden(rel: str) -> bool:
    return any(part.startswith(".") for part in rel.split("/"))


def _never(rel: str) -> str | None:
    name = rel.rsplit("/", 1)[-1]
    if _hidden(rel):
        return "hidden file"
    if name == PUSH_RECORD:
        return "the local push record"
    if name == "training_state.pt" or name.endswith(NEVER_SUFFIXES):
        return "a pickle (can run code when loaded); push safetensors"
    return None


def select_files(root: Path, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> tuple[list[str], list[tuple[str, str]]]:
    """(files to send, (file, why not) for every other file). Paths are relative, POSIX.

    The default set is :data:`DEFAULT_FILES` at the top of the folder; ``include``
    globs (matched against the relative path, subfolders allowed) add to it and
    ``exclude`` globs remove from it. Pickles, hidden files and the push record
    are never sent.
    """
    chosen, skipped = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            if not present(full):  # links to FIFOs or dangling ones stay: check_links names them
                continue
            top = "/" not in rel
            wanted = top and any(fnmatch.fnmatch(name, p) for p in DEFAULT_FILES)
            if any(fnmatch.fnmatch(rel, p) for p in include):
                wanted = True
            if any(fnmatch.fnmatch(rel, p) for p in exclude):
                skipped.append((rel, "excluded by --exclude"))
                continue
            never = _never(rel)
            if never is not None:
                skipped.append((rel, never))
            elif wanted:
                chosen.append(rel)
            else:
                skipped.append((rel, "not needed by a server (add it with --include)"))
    # hidden top-level entries (staging folders, journals) are reported, not walked
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".") and entry.is_dir():
            skipped.append((entry.name + "/", "hidden folder"))
    return sorted(chosen), skipped


def check_links(root: Path, names: Iterable[str], *, follow: bool = False) -> list[tuple[str, str]]:
    """Refuse (:class:`~eagle3conv.checkpoint.links.UnsafeLinkError`) any of ``names`` -- and of
    :data:`READ_FILES` -- that resolves outside ``root``, to a non-regular file, or nowhere.

    With ``follow``, links to regular files outside are allowed; returns them as (link, target).
    Reads no file.
    """
    wanted = sorted(set(names) | {n for n in READ_FILES if present(root / n)})
    with following() if follow else nullcontext() as followed:
        for rel in wanted:
            safe_member(root, root / rel, follow=follow)
    return list(followed or [])


def plot_member(root: Path, plot: str | os.PathLike, *, follow: bool = False) -> tuple[Path, str]:
    """``push --plot``'s figure: (the file to read, its path in the repo), checked before anything is sent.

    An SVG or PNG (as ``verify --plot`` writes it). Inside the checkpoint folder it keeps its
    relative path; elsewhere it is sent under its file name. Either way it passes the checks
    every pushed file does (:func:`~eagle3conv.checkpoint.links.safe_member`: a regular file,
    not a link leaving its folder unless ``follow``), and its first bytes must be the format
    its name says."""
    from eagle3conv.verify.plot import FORMATS

    p = Path(plot).expanduser()
    suffix = p.suffix.lower()
    if suffix not in FORMATS:
        raise UsageError(f"--plot {plot}: the figure must be an .svg or .png file (as verify --plot writes)")
    draw = "draw it first: eagle3conv verify CHECKPOINT --states STATES --search-wiring --plot wiring.svg"
    if not os.path.lexists(p):
        raise UsageError(f"--plot {plot}: no such file", hint=draw)
    full = Path(os.path.realpath(p.parent)) / p.name  # the folder resolved, the file itself not: a link is checked
    try:
        rel, fence = full.relative_to(root).as_posix(), root
    except ValueError:
        rel, fence = full.name, full.parent
    never = _never(rel)
    if never is not None:
        raise UsageError(f"--plot {plot}: not sent ({never})", hint="rename the figure")
    safe_member(fence, full, follow=follow)
    try:  # O_NONBLOCK: a FIFO swapped in after the check gives no bytes instead of a hang
        with os.fdopen(os.open(full, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as f:
            head = f.read(256)
    except OSError as err:
        raise UsageError(f"--plot {plot}: cannot read it: {err.strerror or err}") from None
    ok = (head.startswith(b"\x89PNG\r\n\x1a\n") if suffix == ".png"
          else head.lstrip().startswith((b"<svg", b"<?xml")) and b"<svg" in head)
    if not ok:
        raise UsageError(f"--plot {plot}: not a{' PNG' if suffix == '.png' else 'n SVG'} file (its first bytes "
                         "say otherwise)", hint=draw)
    return full, rel


# --------------------------------------------------------------------------- the client


def hub_api(endpoint: str, token: str | None):
    """The one ``HfApi`` eagle3conv builds: the endpoint, the token (False: send none), and the
    library's name and version for the Hub's attribution, as huggingface_hub's own CLI does."""
    from huggingface_hub import HfApi

    from eagle3conv.version import __version__

    return HfApi(endpoint=endpoint, token=token if token else False, library_name="eagle3conv",
                 library_version=__version__)


# --------------------------------------------------------------------------- repo id, record


def read_record(root: Path) -> dict | None:
    """The push record of ``root``, or None (also for a malformed one)."""
    from eagle3conv.errors import CheckpointReadError
    from eagle3conv.io.jsonfile import read_json_file

    p = root / PUSH_RECORD
    if not p.exists():
        return None
    try:  # a regular file inside the folder, bounded, strict: a FIFO in its place never hangs push
        obj = read_json_file(safe_member(root, p), "push record")
    except CheckpointReadError:
        return None
    if not isinstance(obj, dict) or obj.get("format") != PUSH_RECORD_FORMAT:
        return None
    return obj


def _write_record(root: Path, record: dict) -> Path:
    p = root / PUSH_RECORD
    text = json.dumps(record, indent=2, sort_keys=False) + "\n"
    try:
        atomic_write_text(p, text)
    except OSError as e:
        raise WriteError(f"{p}: pushed, but the push record could not be written: {e.strerror or e}") from e
    return p


def resolve_repo_id(root: Path, repo_id: str | None) -> tuple[str, str]:
    """(repo id, where it came from). Raises :class:`UsageError` when none is known."""
    if repo_id:
        source = "--repo-id"
    else:
        rec = read_record(root)
        if rec and isinstance(rec.get("repo_id"), str):
            repo_id, source = rec["repo_id"], PUSH_RECORD
        else:
            from eagle3conv.errors import CheckpointReadError
            from eagle3conv.io.jsonfile import read_json_file

            meta = root / "training_metadata.json"
            try:
                value = (read_json_file(safe_member(root, meta), "training metadata").get("hub_repo_id")
                         if meta.exists() else None)  # a link leaving the folder is not read
            except CheckpointReadError:
                value = None
            if isinstance(value, str) and value:
                repo_id, source = value, "training_metadata.json hub_repo_id"
    if not repo_id:
        raise UsageError(
            f"{root}: no repo id: this folder has no earlier push ({PUSH_RECORD}) and its metadata names none",
            hint=f"eagle3conv push {root} --repo-id ORG/NAME",
        )
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        raise UsageError(f"repo id '{repo_id}' (from {source}) must be ORG/NAME", hint="--repo-id ORG/NAME")
    try:
        from huggingface_hub.utils import validate_repo_id

        validate_repo_id(repo_id)
    except Exception as e:  # noqa: BLE001 - HFValidationError
        raise UsageError(f"repo id '{repo_id}' (from {source}) is not valid: {e}", hint="--repo-id ORG/NAME") from None
    return repo_id, source


# --------------------------------------------------------------------------- errors


def _scrub(text: str, token: str | None) -> str:
    if token and len(token) >= 4:
        text = text.replace(token, "***")
    return text


def _walk(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _to_push_error(exc: BaseException, *, stage: str, repo_id: str, revision: str | None,
                   endpoint: str, token: str | None, timeout: float | None = None) -> Eagle3ConvError:
    """Map a huggingface_hub / transport error to an eagle3conv error with the token scrubbed."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError, RevisionNotFoundError

    org = repo_id.split("/")[0]
    http = next((e for e in _walk(exc) if isinstance(e, HfHubHTTPError) and getattr(e, "response", None) is not None), None)
    transport = next((e for e in _walk(exc) if isinstance(e, httpx2.TransportError)), None)
    # An error answer means the commit was refused as a whole; only a commit request that got
    # no answer at all leaves it unknown whether it landed.
    safe_retry = not (stage == "commit" and http is None)
    nothing = "nothing was committed" if safe_retry else "the commit request got no answer, so it may or may not have landed"
    retry = ("retrying is safe: files already uploaded are not sent again" if safe_retry
             else f"check the repo's history on {endpoint}/{repo_id} before retrying")
    original = _scrub(f"{type(exc).__name__}: {exc}".strip(), token).splitlines()
    details = [line for line in original if line.strip()][:8]
    where = f"{stage} step"
    if http is not None:
        status = http.response.status_code
        if status == 401:
            return PushError(
                f"the Hub at {endpoint} did not accept the credentials for {repo_id} (401 Unauthorized, {where}); "
                f"{nothing}",
                hint="set HF_TOKEN to a token with write access, or run `hf auth login`", details=details)
        if status == 403:
            return PushError(
                f"no write access to {org} on {endpoint} (403 Forbidden, {where}); {nothing}",
                hint=f"use a token that can write to {org}, or push to your own namespace with --repo-id USER/NAME",
                details=details)
        if status == 404:
            if isinstance(http, RevisionNotFoundError) or "RevisionNotFound" in str(http.response.headers.get("X-Error-Code")):
                return PushError(
                    f"revision '{revision or 'main'}' not found in {repo_id} ({where}); {nothing}",
                    hint="--create-pr opens a pull request against an existing branch; push to a new branch with "
                         "--revision NAME (without --create-pr)", details=details)
            return PushError(
                f"repo {repo_id} not found on {endpoint} (404, {where}); {nothing}",
                hint="check --repo-id, and that the token can see the repo", details=details)
        if status in (409, 412):
            return PushError(
                f"{repo_id}@{revision or 'main'} changed while pushing ({status}, {where}); {nothing}",
                hint="push again", details=details)
        if status >= 500 or status == 429:
            return PushError(
                f"the Hub answered {status} during the {where} for {repo_id}; {nothing}; {retry}",
                hint="try again later", details=details)
        return PushError(f"the Hub refused the {where} for {repo_id} ({status}); {nothing}", details=details)
    if isinstance(transport, httpx2.TimeoutException):
        bound = f"within {timeout:g} s " if timeout else ""
        tries = "" if stage in ("upload", "commit") else f", {RETRIES + 1} attempts"
        return PushError(
            f"the Hub at {endpoint} did not answer {bound}during the {where} for {repo_id} "
            f"({type(transport).__name__}{tries}); {nothing}; {retry}",
            hint="check the network and the endpoint, then push again"
                 + (" (--timeout SECONDS allows slower answers)" if timeout else ""),
            details=details)
    if transport is not None:
        return PushError(
            f"the connection to {endpoint} failed during the {where} for {repo_id} ({type(transport).__name__}); "
            f"{nothing}; {retry}", hint="check the network and push again", details=details)
    return PushError(f"push to {repo_id} failed during the {where}: {details[0] if details else type(exc).__name__}; "
                     f"{nothing}", details=details)


# --------------------------------------------------------------------------- push


@contextmanager
def _scrubbed_logs(token: str | None):
    """While pushing, no log record anywhere in the process carries the token.

    huggingface_hub hides the Authorization header itself; this also covers text a
    server sends back (an error header or body that echoes the request), which
    httpx's and httpcore's debug logs would otherwise repeat verbatim.
    """
    if not token or len(token) < 4:
        yield
        return
    previous = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - leave a record that cannot be formatted alone
            return record
        if token in message:
            record.msg, record.args = message.replace(token, "***"), ()
        return record

    logging.setLogRecordFactory(factory)
    try:
        yield
    finally:
        if logging.getLogRecordFactory() is factory:
            logging.setLogRecordFactory(previous)


@contextmanager
def _bounded_requests(timeout: float | None):
    """While pushing, every request huggingface_hub sends has ``timeout`` seconds per phase.

    huggingface_hub's shared client is built with no timeout at all; its public
    ``set_client_factory`` swaps in one like it (same request hook, redirects, proxies from
    the environment) with the bound, and the factory in effect before is put back after.
    """
    if timeout is None:
        yield
        return
    import httpx2
    from huggingface_hub.utils import _http, set_client_factory

    previous = getattr(_http, "_GLOBAL_CLIENT_FACTORY", None) or _http.default_client_factory

    def bounded() -> httpx2.Client:
        return httpx2.Client(event_hooks={"request": [_http.hf_request_event_hook]}, follow_redirects=True,
                             timeout=httpx2.Timeout(timeout))

    set_client_factory(bounded)
    try:
        yield
    finally:
        set_client_factory(previous)


def _again(step: Callable, say: Callable[[str], None], retries: int = RETRIES):
    """Run an idempotent request step; after a timeout or a failed connection try it again
    (at most ``retries`` times, 1 s then 2 s apart). Other errors go through at once."""
    import httpx2

    for attempt in range(retries + 1):
        try:
            return step()
        except (httpx2.TimeoutException, httpx2.ConnectError) as e:
            if attempt == retries:
                raise
            say(f"no answer ({type(e).__name__}); trying again ({attempt + 2} of {retries + 1})")
            time.sleep(2 ** attempt)


def _resolve_token(token: str | None) -> str | None:
    if token:
        return token
    env = os.environ.get("HF_TOKEN")
    if env:
        return env
    try:
        from huggingface_hub import get_token

        return get_token()
    except Exception:  # noqa: BLE001 - no stored login
        return None


def _remote_readme(api, repo_id: str, revision: str) -> str | None:
    """The README.md on the Hub at ``revision`` (text the user may have written there), or None.

    Fetched from ``api.endpoint`` directly: huggingface_hub's download helpers build their
    URL from the endpoint read at import time.
    """
    from urllib.parse import quote

    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = f"{api.endpoint}/{repo_id}/resolve/{quote(revision, safe='')}/README.md"
    response = get_session().get(url, headers=build_hf_headers(token=api.token), follow_redirects=True)
    if response.status_code == 404:
        return None
    hf_raise_for_status(response)
    return response.content.decode("utf-8", errors="replace")


def push(path: str | os.PathLike = ".", repo_id: str | None = None, options: PushOptions | None = None, *,
         gate: Gate | None, token: str | None = None, endpoint: str | None = None,
         progress: Progress | None = None, **fields) -> PushResult:
    """Publish the checkpoint folder ``path`` to the Hub repo ``repo_id`` in one commit.

    ``options`` (or its fields as keywords: ``push(d, repo, create_pr=True)``) say how
    (:class:`~eagle3conv.hub.options.PushOptions`). Raises :class:`UsageError` (exit 2) for a missing or
    malformed repo id or path, :class:`InvalidCheckpointError` (exit 3) when the gate fails and ``force``
    is false, and :class:`PushError` (exit 1) when the Hub or the connection fails — in which case nothing
    was committed. ``dry_run`` sends nothing at all. ``gate`` is the pre-push check
    (:func:`eagle3conv.publish.default_gate` from the public ``eagle3conv.push``); ``gate=None`` runs no
    checks (the card says so).

    A file to send or read that is a symlink leaving the folder (or to a FIFO, a device, or
    nothing) is refused before anything is sent (:class:`UnsafeLinkError`, exit 1) unless
    ``follow_symlinks``; links followed are listed in ``PushResult.followed_symlinks``.
    ``timeout`` bounds each request to the Hub (seconds; None: no bound, as huggingface_hub).
    ``plot``: the wiring-search figure (``verify --plot``, SVG or PNG), sent with the other files
    (:func:`plot_member` says under which name) and embedded in the card's wiring section.
    """
    opts = replace(options or PushOptions(), **fields, **({} if repo_id is None else {"repo_id": repo_id}))
    hub = _Hub(gate, token, endpoint, progress)
    root = Path(path).expanduser()
    if root.is_file():
        root = root.parent
    if not root.is_dir():
        return _push(path, opts, hub)  # says why
    from eagle3conv.checkpoint.writer import prepared

    with prepared(root, "push", write=False):  # a live fix-keys or config is waited for, never read half-done
        return _push(path, opts, hub)


@dataclass(frozen=True)
class _Hub:
    """Who checks and where it goes: not options a user gives on the command line."""

    gate: Gate | None
    token: str | None
    endpoint: str | None
    progress: Progress | None


def _push(path: str | os.PathLike, opts: PushOptions, hub: _Hub) -> PushResult:
    """:func:`push`'s steps, in order."""
    say = _sayer(hub.progress)
    root = _folder(path)
    _check_options(timeout=opts.timeout, revision=opts.revision, base_model=opts.base_model)
    followed, plot_file = _links(root, opts.include, opts.exclude, opts.plot, follow=opts.follow_symlinks, say=say)
    repo_id, _ = resolve_repo_id(root, opts.repo_id)
    checks = _gate(hub.gate, root, repo_id, force=opts.force, follow=opts.follow_symlinks, say=say)
    sel = _select(root, opts.include, opts.exclude, opts.plot, plot_file, force=opts.force)
    forced = opts.force and any(not c.ok for c in checks)

    def card_for(existing: str | None) -> str:
        facts = gather_facts(root, repo_id, base_model=opts.base_model, checks=checks,
                             checks_run=hub.gate is not None, forced=forced, plot=sel.plot_name)
        return render_card(facts, existing)

    ep = (hub.endpoint or _default_endpoint()).rstrip("/")
    if opts.dry_run:
        card = card_for(sel.local_readme) if sel.with_card else None
        files = sel.files + ([PushFile("README.md", len(card.encode()), "generated")] if card is not None else [])
        return PushResult(repo_id, ep, opts.revision, opts.create_pr, True, files, sel.skipped, card, checks, forced,
                          followed_symlinks=followed)
    message = opts.commit_message or f"Upload EAGLE-3 drafter with eagle3conv{' (forced past failed checks)' if forced else ''}"
    sent = _send(root, sel, card_for, repo_id=repo_id, endpoint=ep, token=_resolve_token(hub.token),
                 private=opts.private, revision=opts.revision, create_pr=opts.create_pr, message=message,
                 timeout=opts.timeout, say=say)
    info = sent.info
    unchanged = info.oid == sent.head and not info.pr_url
    result = PushResult(repo_id, ep, opts.revision, opts.create_pr, False, sent.files, sel.skipped, sent.card, checks,
                        forced, unchanged=unchanged, commit=info.oid, commit_url=info.commit_url, pr_url=info.pr_url,
                        pr_revision=info.pr_revision, repo_url=str(sent.repo_url), followed_symlinks=followed)
    say("unchanged: the repo already holds these files; no commit was made" if unchanged
        else f"committed {info.oid[:12]}" + (f", pull request {info.pr_url}" if info.pr_url else ""))
    result.record = _write_record(root, _record_of(result, opts.revision or "main"))
    return result


# --------------------------------------------------------------------------- push's steps


def _sayer(progress: Progress | None) -> Callable[[str], None]:
    def say(message: str) -> None:  # a step with nothing to count (see eagle3conv.io.progress)
        if progress:
            progress(message, 0, None)
    return say


def _folder(path) -> Path:
    root = Path(path).expanduser()
    if root.is_file():
        root = root.parent
    if not root.is_dir():
        raise UsageError(f"{path}: not a checkpoint folder")
    return root.resolve()


def _check_options(*, timeout: float | None, revision: str | None, base_model: str | None) -> None:
    if timeout is not None and not timeout > 0:
        raise UsageError(f"--timeout {timeout}: give a number of seconds above 0")
    if revision is not None and (not revision.strip() or revision.startswith("refs/")):
        raise UsageError(f"--revision '{revision}': give a branch name such as 'v2' or 'main'")
    if base_model is not None and not re.fullmatch(r"[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?", base_model):
        raise UsageError(f"--base-model '{base_model}': give a Hub repo id such as 'moonshotai/Kimi-K2.5'")


def _links(root: Path, include, exclude, plot, *, follow: bool, say) -> tuple[list, tuple[Path, str] | None]:
    """The links a push would read (refused unless ``follow``) and where ``--plot``'s figure is."""
    followed = check_links(root, select_files(root, include, exclude)[0], follow=follow)
    plot_file: tuple[Path, str] | None = None
    if plot is not None:
        with following() if follow else nullcontext() as log:
            plot_file = plot_member(root, plot, follow=follow)
        followed += [x for x in log or [] if x not in followed]
    for link, target in followed:
        say(f"following symlink {link} -> {target} (--follow-symlinks)")
    return followed, plot_file


def _gate(gate: Gate | None, root: Path, repo_id: str, *, force: bool, follow: bool, say) -> list[Check]:
    """The pre-push checks; a failure refuses the push unless ``force`` (the error carries the verdict)."""
    if gate is None:
        return []
    say("checking the checkpoint")
    with following() if follow else nullcontext():
        checks = _run_gate(gate, root)
    failed = [c for c in checks if not c.ok]
    if failed and not force:
        raise InvalidCheckpointError(
            f"{root}: refusing to push: {len(failed)} check{'s' if len(failed) != 1 else ''} failed; "
            "nothing was sent",
            details=[f"{c.name}: {c.detail}" for c in failed],
            hint="fix the checkpoint (eagle3conv fix-keys, the config check, verify) or pass --force "
                 "to push anyway (the card will say so)",
            verdict=PushVerdict(PushOutcome.REFUSED, GateOutcome.FAILED, repo_id, tuple(c.name for c in failed)),
        )
    return checks


@dataclass(frozen=True)
class _Selection:
    """What a push sends from the folder: its files (README.md apart), the figure, whether a card goes."""

    local_files: list[str]
    skipped: list[tuple[str, str]]
    files: list[PushFile]
    with_card: bool
    local_readme: str | None
    plot_file: tuple[Path, str] | None
    plot_name: str | None


def _select(root: Path, include, exclude, plot, plot_file, *, force: bool) -> _Selection:
    names, skipped = select_files(root, include, exclude)
    weights = [n for n in names if n.endswith(".safetensors")]
    if not weights and not force:
        excluded = [s for s, why in skipped if s.endswith(".safetensors")]
        raise InvalidCheckpointError(
            f"{root}: no .safetensors weights to push" + (" (--exclude left them out)" if excluded and exclude else ""),
            details=[f"{s}: {why}" for s, why in skipped][:10],
            hint=("drop the --exclude pattern that matches them" if excluded and exclude
                  else f"convert first: eagle3conv fix-keys {root} --out DIR"))
    with_card = "README.md" in names or not any(fnmatch.fnmatch("README.md", p) for p in exclude)
    local_files = [n for n in names if n != "README.md"]
    plot_name = None
    if plot_file is not None:
        plot_name = plot_file[1]
        if plot_name == "README.md" or (plot_name in names and plot_file[0].parent != root / Path(plot_name).parent):
            raise UsageError(f"--plot {plot}: this push already sends a file named {plot_name}",
                             hint="rename the figure")
        local_files = [n for n in local_files if n != plot_name]
    local_readme = (root / "README.md").read_text(encoding="utf-8", errors="replace") if "README.md" in names else None
    files = [PushFile(n, (root / n).stat().st_size, "local") for n in local_files]
    if plot_file is not None:
        files.append(PushFile(plot_name, plot_file[0].stat().st_size, "plot"))
    return _Selection(local_files, skipped, files, with_card, local_readme, plot_file, plot_name)


@dataclass(frozen=True)
class _Sent:
    repo_url: object
    head: str
    info: object  # huggingface_hub's CommitInfo
    card: str | None
    files: list[PushFile]


def _send(root: Path, sel: _Selection, card_for: Callable[[str | None], str], *, repo_id: str, endpoint: str,
          token: str | None, private: bool, revision: str | None, create_pr: bool, message: str,
          timeout: float | None, say) -> _Sent:
    """Create the repo and branch if needed, write the card over the README there (or the local one),
    and commit every file in one commit on top of the branch's head. Any client failure is a
    :class:`PushError` naming its stage; nothing was committed then."""
    from huggingface_hub import CommitOperationAdd
    from huggingface_hub.errors import RevisionNotFoundError

    api = hub_api(endpoint, token)
    stage = "create"
    branch = revision or "main"
    files = list(sel.files)
    failure: Eagle3ConvError | None = None
    try:
        with _scrubbed_logs(token), _bounded_requests(timeout):
            say(f"creating {repo_id} on {endpoint} (if needed)")
            repo_url = _again(lambda: api.create_repo(repo_id, private=private, exist_ok=True), say)
            stage = "revision"
            try:
                head = _again(lambda: api.repo_info(repo_id, revision=branch, timeout=timeout).sha, say)
            except RevisionNotFoundError:
                if create_pr:
                    raise
                say(f"creating branch {branch}")
                _again(lambda: api.create_branch(repo_id, branch=branch, exist_ok=True), say)
                head = _again(lambda: api.repo_info(repo_id, revision=branch, timeout=timeout).sha, say)
            card = None
            if sel.with_card:
                stage = "card"
                base = (sel.local_readme if sel.local_readme is not None
                        else _again(lambda: _remote_readme(api, repo_id, branch), say))
                card = card_for(base)
                files.append(PushFile("README.md", len(card.encode()), "generated"))
            ops = [CommitOperationAdd(path_in_repo=n, path_or_fileobj=str(root / n)) for n in sel.local_files]
            if sel.plot_file is not None:
                ops.append(CommitOperationAdd(path_in_repo=sel.plot_name, path_or_fileobj=str(sel.plot_file[0])))
            if card is not None:
                ops.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=card.encode("utf-8")))
            stage = "upload"
            total = sum(f.size for f in files)
            say(f"uploading {len(ops)} files ({total:,} bytes) to {repo_id}")
            api.preupload_lfs_files(repo_id, additions=ops, revision=branch, create_pr=create_pr, free_memory=False)
            stage = "commit"
            say("committing")
            info = api.create_commit(repo_id, ops, commit_message=message, revision=branch, create_pr=create_pr,
                                     parent_commit=head if not create_pr else None)
    except Eagle3ConvError:
        raise
    except Exception as exc:  # noqa: BLE001 - every client failure becomes a PushError
        failure = _to_push_error(exc, stage=stage, repo_id=repo_id, revision=revision, endpoint=endpoint,
                                 token=token, timeout=timeout)
    if failure is not None:
        # raised outside the handler: the client's exception (whose text may hold what a
        # server echoed back) is neither the cause nor the context of what the user sees
        raise failure
    return _Sent(repo_url, head, info, card, files)


def _record_of(result: PushResult, branch: str) -> dict:
    """``eagle3conv-push.json``: what was pushed where (the next push's default repo id)."""
    from eagle3conv.version import __version__

    return {
        "format": PUSH_RECORD_FORMAT,
        "version": PUSH_RECORD_VERSION,
        "repo_id": result.repo_id,
        "repo_type": "model",
        "endpoint": result.endpoint,
        "revision": result.pr_revision or branch,
        "commit": result.commit,
        "commit_url": result.commit_url,
        "pr_url": result.pr_url,
        "unchanged": result.unchanged,
        "forced": result.forced,
        "files": {f.path: f.size for f in result.files},
        "eagle3conv_version": __version__,
    }


def _default_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


__all__ = [
    "DEFAULT_FILES", "PUSH_RECORD", "Gate", "GateOutcome", "PushFile", "PushOutcome", "PushResult", "PushVerdict",
    "plot_member", "push", "read_record", "resolve_repo_id", "select_files",
]


push.__doc__ = _push.__doc__
