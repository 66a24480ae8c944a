"""The console entry point: Ctrl-C at any instant gives one line and exit 130.

Importing click and the CLI takes tens of milliseconds; a SIGINT in that window
would otherwise print a ``KeyboardInterrupt`` traceback. Until the CLI is
imported (nothing is written before then), SIGINT exits at once; after, the
usual KeyboardInterrupt runs every cleanup, and whatever escapes the command's
own handler is reported here.
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


def _verify_inputs(argv: list[str]) -> list[str]:
    """The files ``eagle3conv verify DRAFTER --states FILE`` will read, weights first: the drafter
    folder's ``*.safetensors`` and the states file (a folder of dumps is left alone). Only the
    plain spelling is recognised; anything unusual gives [] (the command itself reports errors)."""
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
            files = sorted(e.path for e in it if e.name.endswith(".safetensors") and e.is_file())
    except OSError:
        return []
    if states and os.path.isfile(states):
        files.append(states)
    return files if states else []


def _mem_available() -> int:
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _read_ahead(files: list[str], info: dict) -> None:  # pragma: no cover - a background thread
    """Read ``files`` once, discarding the bytes: the page cache holds them when the command
    reaches them, and the disk works while Python imports torch and initialises CUDA."""
    buf = bytearray(8 << 20)
    mv = memoryview(buf)
    total = 0
    for path in files:
        try:
            with open(path, "rb", buffering=0) as f:
                while n := f.readinto(mv):
                    total += n
        except OSError:
            continue
    info["read_ahead_bytes"] = total
    info["read_ahead_done"] = round(time.perf_counter() - _T0, 3)


def start_read_ahead(argv: list[str], info: dict) -> bool:
    """For ``verify``, start reading its weights and states in a daemon thread, before the
    heavy imports, when they fit in half the available memory (else reading ahead would
    only evict what it read before the command gets there)."""
    files = _verify_inputs(argv)
    if not files or os.environ.get("EAGLE3CONV_NO_READ_AHEAD"):
        return False
    try:
        size = sum(os.path.getsize(p) for p in files)
    except OSError:
        return False
    if size > _mem_available() // 2:
        return False
    import threading

    threading.Thread(target=_read_ahead, args=(files, info), name="eagle3conv-read-ahead", daemon=True).start()
    info["read_ahead_files"] = len(files)
    return True


def run() -> None:
    phases: dict = {}
    start_read_ahead(sys.argv, phases)
    previous = signal.getsignal(signal.SIGINT)
    early = previous is signal.default_int_handler
    if early:
        signal.signal(signal.SIGINT, _early_sigint)
    try:
        from eagle3conv import cli
    finally:
        if early:
            signal.signal(signal.SIGINT, previous)
    phases["import_cli"] = round(time.perf_counter() - _T0, 3)
    try:
        _main(cli)
    except KeyboardInterrupt:
        cli.interrupted("--json" in sys.argv[1:])
    finally:
        if os.environ.get("EAGLE3CONV_PHASES"):  # seconds since the console started, for benchmarks
            phases["exit"] = round(time.perf_counter() - _T0, 3)
            os.write(2, ("eagle3conv phases: " + _json_line(phases) + "\n").encode())


def _json_line(d: dict) -> str:
    return "{" + ", ".join(f'"{k}": {v!r}' if not isinstance(v, str) else f'"{k}": "{v}"'
                           for k, v in d.items()) + "}"


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
