"""The console entry point: Ctrl-C at any instant gives one line and exit 130.

Importing click and the CLI takes tens of milliseconds; a SIGINT in that window
would otherwise print a ``KeyboardInterrupt`` traceback. Until the CLI is
imported (nothing is written before then), SIGINT exits at once; after, the
usual KeyboardInterrupt runs every cleanup, and whatever escapes the command's
own handler is reported here.

``eagle3conv verify DRAFTER --states FILE`` starts reading its weights and
states (a few threads, states in row order, ``eagle3conv.io.readahead``) before torch is imported,
so the disk works while Python imports and CUDA initialises (EAGLE3CONV_READ_AHEAD: the
number of reader threads, 0 turns it off); not when they are already cached. When torch's own
files are cold too (after a reboot or a dropped page cache), torch is imported first and the
reading starts after it: reading during that import queues its many small reads behind the large
ones (bench/README.md, "verify from a truly cold page cache").
With EAGLE3CONV_PHASES set, one line on stderr gives the seconds since start of each phase.
"""

import os
import signal
import sys
import time

_T0 = time.perf_counter()

_MESSAGE = b"interrupted; your files are as they were (an in-place write finishes or rolls back on the next run)\n"


def _early_sigint(signum, frame):  # pragma: no cover - timing dependent
    if "--json" in sys.argv[1:]:
        os.write(1, b'{"error": "Interrupted", "message": "interrupted", "hint": null, "details": [], '
                    b'"exit_code": 130}\n')
    os.write(2, _MESSAGE)
    os._exit(130)


def verify_inputs(argv: list[str]) -> list[str]:
    """The files ``eagle3conv verify DRAFTER --states FILE`` will read, weights first: the drafter
    folder's ``*.safetensors`` and the states file, last (with a folder of dumps, nothing). Only the
    plain spelling is recognised; anything unusual gives [] (the command itself reports errors).
    Only regular files of the folder itself: a link (which may leave the folder) is never read
    ahead -- the command decides about links, with its own checks (docs/architecture.md)."""
    if len(argv) < 3 or argv[1] != "verify" or argv[2].startswith("-"):
        return []
    states = None
    for i, a in enumerate(argv[3:], 3):
        if a == "--states" and i + 1 < len(argv):
            states = argv[i + 1]
        elif a.startswith("--states="):
            states = a.split("=", 1)[1]
    files = []
    try:
        with os.scandir(argv[2]) as it:
            files = sorted(e.path for e in it if e.name.endswith(".safetensors") and e.is_file(follow_symlinks=False))
    except OSError:
        return []
    if not states or not os.path.isfile(states):
        return []  # no states file (the smoke test, or a folder of dumps): nothing is read ahead
    return files + [states]


def torch_cached() -> bool:
    """Whether torch's own ``__init__.py`` is in the page cache (found without importing torch).
    When it is not, torch's files are cold too (after a reboot or a dropped page cache) and the
    import reads hundreds of small files from the disk. True when it cannot tell."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return True
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return True
    if getattr(os, "RWF_NOWAIT", None) is None:
        return True
    from eagle3conv.io.readahead import cached

    return cached([spec.origin])


def start_read_ahead(argv: list[str], info: dict) -> bool:
    """For ``verify``, start reading its weights and states in a daemon thread, before the
    heavy imports, when they fit in half the available memory (else reading ahead would
    only evict what it read before the command gets there) and are not cached already. When
    torch's own files are cold too, torch is imported first: reading ahead during that import
    queues its many small reads behind large ones (bench/README.md, "verify from a truly cold
    page cache")."""
    from eagle3conv.io.readahead import cached, mem_available, prefetch

    files = verify_inputs(argv)
    try:  # EAGLE3CONV_READ_AHEAD: reader threads (0: off)
        workers = int(os.environ.get("EAGLE3CONV_READ_AHEAD") or 4)
    except ValueError:
        workers = 4
    if not files or workers < 1:
        return False
    try:
        size = sum(os.path.getsize(p) for p in files)
    except OSError:
        return False
    if size > mem_available() // 2:
        return False
    if cached(files):
        info["read_ahead"] = "inputs already cached"
        return False
    if not torch_cached():
        import torch  # noqa: F401  (verify imports it next anyway)

        info["read_ahead_after_import_torch"] = round(time.perf_counter() - _T0, 3)
    return prefetch(files, info, workers, striped_last=True, follow={files[-1]})


def run() -> None:
    phases: dict = {}
    previous = signal.getsignal(signal.SIGINT)
    early = previous is signal.default_int_handler
    if early:
        signal.signal(signal.SIGINT, _early_sigint)
    try:
        start_read_ahead(sys.argv, phases)
        from eagle3conv import cli
    finally:
        if early:
            signal.signal(signal.SIGINT, previous)
    phases["import_cli"] = round(time.perf_counter() - _T0, 3)
    try:
        try:
            _main(cli)
        except KeyboardInterrupt:
            cli.interrupted("--json" in sys.argv[1:])
    except SystemExit as e:
        _finish(phases, e.code)
        raise
    _finish(phases, 0)


def _finish(phases: dict, code) -> None:
    """The command is done: report the phases (EAGLE3CONV_PHASES), and after ``verify`` on a GPU
    exit at once -- its output is written and flushed, and tearing down the CUDA context and
    the pinned buffers takes seconds nobody waits for. Everything else exits normally."""
    if os.environ.get("EAGLE3CONV_PHASES"):  # seconds since the console started, for benchmarks
        phases["exit"] = round(time.perf_counter() - _T0, 3)
        os.write(2, ("eagle3conv phases: " + _json_line(phases) + "\n").encode())
    torch = sys.modules.get("torch")
    if (len(sys.argv) > 1 and sys.argv[1] == "verify" and (code is None or isinstance(code, int))
            and torch is not None and torch.cuda.is_initialized()):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code or 0)


def _json_line(d: dict) -> str:
    import json

    return json.dumps({k: v for k, v in d.items() if not k.startswith("_")})


def _main(cli) -> None:
    # click's standalone mode turns a KeyboardInterrupt outside a command into "Aborted!" (exit 1)
    import click

    try:
        rv = cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        raise KeyboardInterrupt from None
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)
