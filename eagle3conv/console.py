"""The console entry point: Ctrl-C at any instant gives one line and exit 130.

Importing click and the CLI takes tens of milliseconds; a SIGINT in that window
would otherwise print a ``KeyboardInterrupt`` traceback. Until the CLI is
imported (nothing is written before then), SIGINT exits at once; after, the
usual KeyboardInterrupt runs every cleanup, and whatever escapes the command's
own handler is reported here.

``eagle3conv verify DRAFTER --states FILE`` starts reading its weights and
states (a few threads, states in row order) before torch is imported, so the
disk works while Python imports and CUDA initialises (EAGLE3CONV_READ_AHEAD: the
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
    try:
        if "--json" in sys.argv[1:]:
            os.write(1, b'{"error": "Interrupted", "message": "interrupted", "hint": null, "details": [], '
                        b'"exit_code": 130}\n')
        os.write(2, _MESSAGE)
    except OSError:
        pass
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


def mem_available() -> int:
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


READ_CHUNK = 16 << 20


READ_AHEAD_MAX_HEADER = 1 << 20  # a states file's header is a few KiB; a larger one is read as plain bytes


def read_plan(path: str, striped: bool) -> list[tuple[str, int, int]]:
    """(path, offset, length) reads covering the file. ``striped``: a safetensors file whose large
    tensors are read a slice of each at a time, in row order -- states are stored one [sequences,
    positions, width] tensor per layer, so slice j of every layer is the same sequences, and the
    first batches of every layer are in the page cache first, as the drafter reads them.

    The header is parsed by the package's one strict reader (bounded size and depth, integer
    offsets inside the file, no overlaps): a file it refuses is not read ahead at all (the command
    reports it), and one whose header is larger than :data:`READ_AHEAD_MAX_HEADER` is read plainly."""
    size = os.path.getsize(path)
    if striped:
        from eagle3conv.errors import Eagle3ConvError
        from eagle3conv.io.safetensors import read_safetensors_header

        tensors = None
        try:
            with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
                n = int.from_bytes(f.read(8), "little")
        except OSError:
            return []
        if n <= READ_AHEAD_MAX_HEADER:
            try:
                tensors, _ = read_safetensors_header(path)
            except Eagle3ConvError:
                return []  # the command says what is wrong with it
        if tensors is not None:
            spans = sorted((t.start, t.end) for t in tensors.values())
            base = 8 + n
            small = [(a, b - a) for a, b in spans if b - a < 4 * READ_CHUNK]
            large = [(a, b - a) for a, b in spans if b - a >= 4 * READ_CHUNK]
            plan = [(path, 0, base)] + [(path, a, n) for a, n in small]
            if large:
                parts = max(1, min(256, max(n for _, n in large) // READ_CHUNK))
                for j in range(parts):
                    for a, n in large:
                        lo, hi = n * j // parts, n * (j + 1) // parts
                        plan.append((path, a + lo, hi - lo))
            return plan
    return [(path, off, min(4 * READ_CHUNK, size - off)) for off in range(0, size, 4 * READ_CHUNK)]


def read_ahead(plan: list[tuple[str, int, int]], info: dict, workers: int = 4) -> None:  # pragma: no cover
    """Read the plan's spans once, in order, with a few threads (a disk serves several requests
    at once faster than one), discarding the bytes: the page cache holds them when the command
    reaches them, and the disk works while Python imports torch and initialises CUDA. Each file
    is closed after its last span."""
    import threading

    lock = threading.Lock()
    nxt = [0]
    total = [0]
    fds: dict = {}
    left: dict = {}  # spans still to read per file: a file is closed after its last one
    for path, _, _ in plan:
        left[path] = left.get(path, 0) + 1

    def done_with(path: str) -> None:
        with lock:
            left[path] -= 1
            fd = fds.pop(path, -1) if not left[path] else -1
        if fd >= 0:
            os.close(fd)

    def work() -> None:
        try:
            read_spans()
        except BaseException:  # noqa: BLE001 - an optimisation: it never prints, never stops the command
            pass

    def read_spans() -> None:
        buf = bytearray(READ_CHUNK)
        mv = memoryview(buf)
        while True:
            with lock:
                if nxt[0] >= len(plan):
                    return
                path, off, length = plan[nxt[0]]
                nxt[0] += 1
                fd = fds.get(path)
                if fd is None:
                    try:
                        fd = fds[path] = os.open(path, open_flags(path, info))
                    except OSError:
                        fd = fds[path] = -1
            if fd < 0:
                done_with(path)
                continue
            end = off + length
            while off < end:
                try:
                    n = os.preadv(fd, [mv[: min(READ_CHUNK, end - off)]], off)
                except OSError:
                    break
                if not n:
                    break
                off += n
                with lock:
                    total[0] += n
            done_with(path)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for fd in fds.values():
        if fd >= 0:
            os.close(fd)
    info["read_ahead_bytes"] = total[0]
    info["read_ahead_done"] = round(time.perf_counter() - _T0, 3)


def _quietly(fn, *args) -> None:
    """Run ``fn`` in a thread that never prints: the read-ahead only warms the page cache."""
    try:
        fn(*args)
    except BaseException:  # noqa: BLE001
        pass


def open_flags(path: str, info: dict) -> int:
    """Read-only, never blocking (a FIFO put in a file's place between the check and the open gives
    no data instead of a hang), and not through a link except for the states file the user named."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    if path != info.get("_states"):
        flags |= getattr(os, "O_NOFOLLOW", 0)
    return flags


def _mincore():
    """libc's ``mmap``, ``munmap`` and ``mincore`` (ctypes), or None where they cannot be had."""
    global _MINCORE
    if _MINCORE is None:
        _MINCORE = False
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_long]
            libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
            _MINCORE = (ctypes, libc)
        except (ImportError, OSError, AttributeError):
            pass
    return _MINCORE or None


_MINCORE = None


def resident(fd: int, samples: int | None = None) -> tuple[int, int] | None:
    """How many of the open file's pages are in the page cache, of how many asked: the page at
    each of ``samples`` places, or every page (None). Asked with ``mincore`` on a mapping of the
    file (mapping reads nothing); None where it cannot be asked -- also where the caller neither
    owns the file nor may write it (a torch installed by root, a shared cache), for which Linux
    answers only for the pages this process has mapped, that is "none"."""
    import mmap

    lib = _mincore()
    if lib is None:
        return None
    st = os.fstat(fd)
    euid = os.geteuid()
    if euid != 0 and st.st_uid != euid and not os.access(f"/proc/self/fd/{fd}", os.W_OK):
        return None
    size = st.st_size
    page = mmap.PAGESIZE
    pages = (size + page - 1) // page
    if not pages:
        return 0, 0
    ctypes, libc = lib
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        return None
    try:
        if samples is None:
            vec = ctypes.create_string_buffer(pages)
            if libc.mincore(addr, size, vec) != 0:
                return None
            return sum(b & 1 for b in vec.raw), pages
        vec = ctypes.create_string_buffer(1)
        hits = 0
        for j in range(samples):
            if libc.mincore(addr + (size * j // samples) // page * page, 1, vec) != 0:
                return None
            hits += vec.raw[0] & 1
        return hits, samples
    finally:
        libc.munmap(addr, size)


def cached(files: list[str], samples: int = 16) -> bool:
    """Whether the files look fully in the page cache: the page at each of ``samples`` places in
    each is resident. Asked with ``mincore`` where it answers (a query: it reads nothing), else a
    one-page ``preadv(RWF_NOWAIT)`` at those places (it fails instead of waiting for the disk, but
    it may start the kernel's read-ahead of a missing page and, on a fast disk, find it read: a
    cold file taken for cached now and then). False when the kernel cannot say. Reading ahead
    files already cached only costs memory bandwidth."""
    nowait = getattr(os, "RWF_NOWAIT", None)
    buf = bytearray(4096)
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                         | (getattr(os, "O_NOFOLLOW", 0) if path != files[-1] else 0))
        except OSError:
            return False
        try:
            there = resident(fd, samples)
            if there is None:
                if nowait is None:
                    return False
                size = os.fstat(fd).st_size
                for j in range(samples):
                    os.preadv(fd, [buf], size * j // samples, nowait)
            elif there[0] < there[1]:
                return False
        except OSError:  # BlockingIOError: not cached; EOPNOTSUPP etc.: cannot tell
            return False
        finally:
            os.close(fd)
    return True


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
    if getattr(os, "RWF_NOWAIT", None) is None and _mincore() is None:
        return True
    return cached([spec.origin])


def start_read_ahead(argv: list[str], info: dict) -> bool:
    """For ``verify``, start reading its weights and states in a daemon thread, before the
    heavy imports, when they fit in half the available memory (else reading ahead would
    only evict what it read before the command gets there) and are not cached already. When
    torch's own files are cold too, torch is imported first (bench/README.md, "verify from a
    truly cold page cache": reading during that import slowed it by as much as it saved, or more)."""
    files = verify_inputs(argv)
    try:  # EAGLE3CONV_READ_AHEAD: reader threads (0: off)
        workers = int(os.environ.get("EAGLE3CONV_READ_AHEAD") or 4)
    except ValueError:
        workers = 4
    if not files or workers < 1:
        return False
    info["_states"] = files[-1]  # not a phase: the one file read through a link
    try:
        size = sum(os.path.getsize(p) for p in files)
    except OSError:
        return False
    if size > mem_available() // 2:
        return False
    if cached(files):
        info["read_ahead"] = "inputs already cached"
        return False
    if not torch_cached():  # read after the import: during it, its reads queue behind ours
        try:
            import torch  # noqa: F401  (verify imports it next anyway)
        except Exception:  # a broken install: verify reports it, with its own message
            return False
        info["read_ahead_after_import_torch"] = round(time.perf_counter() - _T0, 3)
    import threading

    plan = [span for i, p in enumerate(files) for span in read_plan(p, striped=i == len(files) - 1)]
    threading.Thread(target=_quietly, args=(read_ahead, plan, info, min(workers, 16)),
                     name="eagle3conv-read-ahead", daemon=True).start()
    info["read_ahead_files"] = len(files)
    info["read_ahead_threads"] = min(workers, 16)
    return True


def hold_closed_std_fds() -> None:
    """A standard stream the command was started without (``>&-``) gets /dev/null under its number,
    so that no file the command opens later takes that number, and no write meant for stdout (the
    early Ctrl-C handler's) lands in it. ``sys.stdout`` stays None: the CLI then names the closed stdout."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            try:
                got = os.open(os.devnull, os.O_RDWR)
            except OSError:
                return
            if got != fd:
                os.dup2(got, fd)
                os.close(got)


def run() -> None:
    phases: dict = {}
    hold_closed_std_fds()
    previous = signal.getsignal(signal.SIGINT)
    # Python's default handler, or the launcher's own early one (eagle3conv/_launch.py)
    early = previous is signal.default_int_handler or getattr(previous, "eagle3conv_early", False)
    if early:
        signal.signal(signal.SIGINT, _early_sigint)
    try:
        try:
            start_read_ahead(sys.argv, phases)
        except Exception:  # noqa: BLE001 - an optimisation: whatever it meets, the command itself reports
            pass
        from eagle3conv import cli
    finally:
        if early:
            signal.signal(signal.SIGINT, signal.default_int_handler)
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
            except (OSError, ValueError, AttributeError):  # AttributeError: started with it closed (None)
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
