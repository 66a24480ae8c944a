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

_MESSAGE = b"interrupted; your files are as they were (an in-place write finishes or rolls back on the next run)\n"


def _early_sigint(signum, frame):  # pragma: no cover - timing dependent
    if "--json" in sys.argv[1:]:
        os.write(1, b'{"error": "Interrupted", "message": "interrupted", "hint": null, "details": [], '
                    b'"exit_code": 130}\n')
    os.write(2, _MESSAGE)
    os._exit(130)


def run() -> None:
    previous = signal.getsignal(signal.SIGINT)
    early = previous is signal.default_int_handler
    if early:
        signal.signal(signal.SIGINT, _early_sigint)
    try:
        from eagle3conv import cli
    finally:
        if early:
            signal.signal(signal.SIGINT, previous)
    try:
        _main(cli)
    except KeyboardInterrupt:
        cli.interrupted("--json" in sys.argv[1:])


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
