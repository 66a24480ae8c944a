"""The console's read-ahead for ``eagle3conv verify``: what it reads, in which order, and that a
fresh process (a real subprocess, as a user runs it) still prints exactly one JSON document."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3conv import console

REPO = Path(__file__).resolve().parents[1]


def test_verify_inputs_are_the_weights_then_the_states(drafter_and_states):
    drafter, states = drafter_and_states
    files = console.verify_inputs(["eagle3conv", "verify", str(drafter), "--states", str(states), "--json"])
    assert files == sorted(str(p) for p in drafter.glob("*.safetensors")) + [str(states)]
    assert console.verify_inputs(["eagle3conv", "verify", str(drafter), f"--states={states}"])[-1] == str(states)
    # other commands, the smoke test (no states), a missing folder: nothing is read ahead
    assert console.verify_inputs(["eagle3conv", "inspect", str(drafter)]) == []
    assert console.verify_inputs(["eagle3conv", "verify", str(drafter)]) == []
    assert console.verify_inputs(["eagle3conv", "verify", str(drafter / "nope"), "--states", str(states)]) == []


def test_read_ahead_is_skipped_when_the_files_do_not_fit_in_memory(drafter_and_states, monkeypatch):
    drafter, states = drafter_and_states
    argv = ["eagle3conv", "verify", str(drafter), "--states", str(states)]
    monkeypatch.setattr(console, "mem_available", lambda: 0)
    assert console.start_read_ahead(argv, {}) is False


def test_states_are_read_every_layer_a_slice_at_a_time(drafter_and_states, monkeypatch):
    """The striped plan covers every byte of the file exactly once, and reads the first slice of
    every layer's tensor before the second slice of any (the first batches come first)."""
    _, states = drafter_and_states
    monkeypatch.setattr(console, "READ_CHUNK", 256)  # every hidden tensor (3*40*64*2 bytes) counts as large
    plan = console.read_plan(str(states), striped=True)
    spans = sorted((off, off + n) for _, off, n in plan if n)
    assert spans[0][0] == 0 and spans[-1][1] == states.stat().st_size
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous, no overlap, no gap
    header_n = int.from_bytes(states.read_bytes()[:8], "little")
    header = json.loads(states.read_bytes()[8:8 + header_n])
    starts = sorted(8 + header_n + v["data_offsets"][0] for k, v in header.items()
                    if k.startswith("hidden") or (k != "__metadata__" and len(v["shape"]) == 3))
    assert len(starts) == 4
    first_slices = [off for _, off, _ in plan if off in starts]
    pos = [i for i, (_, off, _) in enumerate(plan) if off in starts]
    assert sorted(first_slices) == starts and pos == list(range(pos[0], pos[0] + 4))
    # and a file that is not safetensors is read front to back
    junk = states.parent / "junk.bin"
    junk.write_bytes(b"x" * 3000)
    assert [(o, n) for _, o, n in console.read_plan(str(junk), striped=True)] == [(0, 1024), (1024, 1024),
                                                                                  (2048, 952)]


def evict(paths) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def test_cached_tells_a_cached_file_from_an_evicted_one(tmp_path):
    f = tmp_path / "blob.bin"
    f.write_bytes(os.urandom(4 << 20))
    if not console.cached([str(f)]):
        pytest.skip("this kernel cannot tell a cached file (mincore, preadv RWF_NOWAIT)")
    evict_for_sure([f])  # a page someone reads right then comes back: evicted again
    for _ in range(20):  # asking reads nothing: the answer stays "cold", and the file stays out
        assert not console.cached([str(f)])
    if resident([f]) is not None:
        time.sleep(0.05)
        assert resident([f]) is False
    f.read_bytes()
    assert console.cached([str(f)])
    fd = os.open(f, os.O_RDONLY)
    try:
        every, sampled = console.resident(fd), console.resident(fd, 16)
    finally:
        os.close(fd)
    if every is not None:  # every page of a file just read whole, and each of the 16 sampled
        import mmap

        pages = (4 << 20) // mmap.PAGESIZE
        assert every == (pages, pages) and sampled == (16, 16)


def test_a_file_mincore_cannot_answer_for_is_asked_the_old_way(tmp_path, monkeypatch):
    """Linux's mincore answers "none resident" for a file the caller neither owns nor may write
    (a torch installed by root, a shared cache): such a file is left to the read probe, not
    taken for cold on every run."""
    f = tmp_path / "blob.bin"
    f.write_bytes(os.urandom(1 << 20))
    f.read_bytes()
    fd = os.open(f, os.O_RDONLY)
    try:
        if console.resident(fd) is None:
            pytest.skip("mincore cannot be had here")
        monkeypatch.setattr(os, "geteuid", lambda: os.stat(f).st_uid + 12345)  # someone else's file
        monkeypatch.setattr(os, "access", lambda path, mode: False)  # ... and not writable
        assert console.resident(fd) is None
    finally:
        os.close(fd)
    assert console.cached([str(f)]) is (getattr(os, "RWF_NOWAIT", None) is not None)


def test_without_mincore_the_read_probe_still_tells(tmp_path, monkeypatch):
    """Where mincore cannot be had, one-page preadv(RWF_NOWAIT) reads answer (a cached file is
    cached; a cold one mostly cold: the probe may read a missing page, so only the cached side
    is exact)."""
    f = tmp_path / "blob.bin"
    f.write_bytes(os.urandom(1 << 20))
    f.read_bytes()
    monkeypatch.setattr(console, "resident", lambda fd, samples=None: None)
    if getattr(os, "RWF_NOWAIT", None) is None:
        assert console.cached([str(f)]) is False
        return
    assert console.cached([str(f)]) is True
    assert console.cached([str(tmp_path / "missing.bin")]) is False


def kernel_tells(paths) -> bool:
    """Read ``paths`` whole (they are cached then); whether the console says so (:func:`console.cached`)."""
    for p in paths:
        Path(p).read_bytes()
    return console.cached([str(p) for p in paths])


def resident(paths) -> bool | None:
    """Whether any page of ``paths`` is in the page cache (:func:`console.resident`, every page:
    mincore, which reads nothing); None where it cannot be asked. A read probe would not do: a
    buffered read that finds a page missing may start the kernel's read-ahead of it and bring
    back the very pages it asks about (what made these tests flaky on a busy disk)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            got = console.resident(fd)
        finally:
            os.close(fd)
        if got is None:
            return None
        if got[0]:
            return True
    return False


def evict_for_sure(paths, tries: int = 5) -> None:
    """Evict ``paths`` from the page cache and check that they are out (``mincore`` where it
    answers, else the console's own probe); a page someone reads right then comes back, so it
    is evicted again."""

    def out() -> bool:
        there = resident(paths)
        return not (console.cached([str(p) for p in paths]) if there is None else there)

    for _ in range(tries):
        evict(paths)
        # a read-ahead already under way (started by an earlier probe) lands after the eviction:
        # out now and still out a moment later
        if out():
            time.sleep(0.05)
            if out():
                return
    raise AssertionError(f"{paths}: still in the page cache after {tries} evictions")


def test_fresh_process_reads_ahead_and_keeps_stdout_one_json_document(drafter_and_states):
    """Each run's page-cache state is made by the test right before it, never left to the run
    before (whose read-ahead thread may still be reading when a tiny run exits, so whether its
    inputs are all cached afterwards depends on the machine's load: issue 25)."""
    drafter, states = drafter_and_states
    env = dict(os.environ, PYTHONPATH=str(REPO), EAGLE3CONV_PHASES="1")
    cmd = [sys.executable, "-m", "eagle3conv", "verify", str(drafter), "--states", str(states), "--json",
           "--no-save", "--device", "cpu"]
    inputs = [*drafter.glob("*.safetensors"), states]
    _torch_init().read_bytes()  # torch's files cached (else torch is imported first: still read ahead, later)
    can_tell = kernel_tells(inputs)
    if can_tell:
        evict_for_sure(inputs)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)  # exactly one JSON document: the phases line went to stderr
    assert len(doc["acceptance_per_position"]) == 3
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("eagle3conv phases:")]
    assert len(lines) == 1
    phases = json.loads(lines[0].split(":", 1)[1])
    weights = sum(f.stat().st_size for f in drafter.glob("*.safetensors"))
    assert phases["read_ahead_files"] == 2
    if "read_ahead_bytes" in phases:  # the daemon thread may still be reading when a tiny run exits
        assert phases["read_ahead_bytes"] == weights + states.stat().st_size
    assert 0 < phases["import_cli"] <= phases["exit"]
    # run again with the inputs cached (read whole here): nothing is read ahead (where the kernel can tell)
    assert kernel_tells(inputs) == can_tell
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    warm = json.loads([ln for ln in again.stderr.splitlines() if ln.startswith("eagle3conv phases:")][0]
                      .split(":", 1)[1])
    if can_tell:
        assert warm.get("read_ahead") == "inputs already cached" and "read_ahead_files" not in warm
    # without the variable: no phases line
    env.pop("EAGLE3CONV_PHASES")
    q = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert q.returncode == 0 and "eagle3conv phases" not in q.stderr
    assert json.loads(q.stdout)["acceptance_per_position"] == doc["acceptance_per_position"]


def test_read_ahead_never_follows_a_link_out_of_the_folder_nor_waits_on_a_fifo(drafter_and_states, tmp_path):
    """A downloaded folder must not make eagle3conv read a file outside it: a weight file that is a
    link (to a secret, say) is not read ahead -- verify itself refuses it by name -- and a FIFO in a
    weight file's place is neither listed nor able to block the reader."""
    drafter, states = drafter_and_states
    secret = tmp_path / "token"
    secret.write_bytes(b"hf_secret")
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    for f in drafter.iterdir():
        (hostile / f.name).write_bytes(f.read_bytes())
    (hostile / "extra.safetensors").symlink_to(secret)
    os.mkfifo(hostile / "fifo.safetensors")
    argv = ["eagle3conv", "verify", str(hostile), "--states", str(states)]
    files = console.verify_inputs(argv)
    assert str(hostile / "extra.safetensors") not in files and str(hostile / "fifo.safetensors") not in files
    assert files[-1] == str(states)
    # the open the readers use refuses a link in the folder even if one is swapped in after the listing
    info = {"_states": str(states)}
    with pytest.raises(OSError):
        os.open(hostile / "extra.safetensors", console.open_flags(str(hostile / "extra.safetensors"), info))
    fd = os.open(hostile / "fifo.safetensors", console.open_flags(str(hostile / "fifo.safetensors"), info))
    os.close(fd)  # returned at once: O_NONBLOCK, no writer needed
    # the states file the user named may itself be a link
    link = tmp_path / "states-link.safetensors"
    link.symlink_to(states)
    os.close(os.open(link, console.open_flags(str(link), {"_states": str(link)})))


def test_states_folder_reads_nothing_ahead(drafter_and_states, tmp_path):
    """With a folder of dumps as --states nothing is read ahead (so no drafter file is ever taken
    for the user-named states file, which alone may be read through a link)."""
    drafter, _ = drafter_and_states
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    assert console.verify_inputs(["eagle3conv", "verify", str(drafter), "--states", str(dumps)]) == []
    assert console.start_read_ahead(["eagle3conv", "verify", str(drafter), "--states", str(dumps)], {}) is False


def skip_unless_the_kernel_can_tell(folder: Path) -> None:
    """Skip where the console cannot tell a cold file from a cached one (neither mincore nor
    preadv(RWF_NOWAIT) answers). Asked of a file of its own, so that no probe touches a file the
    test needs cold."""
    probe = folder / "probe.bin"
    probe.write_bytes(os.urandom(1 << 20))
    evict_for_sure([probe])
    if console.cached([str(probe)]):
        pytest.skip("this kernel cannot tell a cold file from a cached one (mincore, preadv RWF_NOWAIT)")


def _torch_init() -> Path:
    import importlib.util

    return Path(importlib.util.find_spec("torch").origin)


def test_with_torch_itself_cold_torch_is_imported_before_reading_ahead(drafter_and_states, tmp_path):
    """torch's own files cold (a dropped page cache): reading ahead during its import would queue
    the import's small reads behind large ones (bench/README.md, "verify from a truly cold page
    cache"), so torch is imported first and the cold inputs are read ahead after it; with torch
    cached, they are read ahead at once."""
    drafter, states = drafter_and_states
    inputs = [*drafter.glob("*.safetensors"), states]
    argv = ["eagle3conv", "verify", str(drafter), "--states", str(states)]
    skip_unless_the_kernel_can_tell(drafter.parent)
    evict_for_sure([_torch_init(), *inputs])
    info: dict = {}
    assert console.start_read_ahead(argv, info) is True
    assert "read_ahead_after_import_torch" in info and info["read_ahead_files"] == 2
    # torch cached, the inputs cold: read ahead at once. Fresh copies (the probe above may have
    # started a read-ahead of the files it asked about, racing with a second eviction of them)
    _torch_init().read_bytes()
    copy = tmp_path / "drafter"
    copy.mkdir()
    for f in drafter.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    states_copy = tmp_path / "states.safetensors"
    states_copy.write_bytes(states.read_bytes())
    evict_for_sure([*copy.glob("*.safetensors"), states_copy])
    warm: dict = {}
    assert console.start_read_ahead(["eagle3conv", "verify", str(copy), "--states", str(states_copy)], warm) is True
    assert "read_ahead" not in warm and "read_ahead_after_import_torch" not in warm


def test_a_torch_that_cannot_be_imported_reads_nothing_ahead(drafter_and_states, tmp_path, monkeypatch):
    """torch cold and its import failing (a broken install): the console reads nothing ahead and
    leaves the error to verify's own handling instead of a traceback from the entry point."""
    drafter, states = drafter_and_states
    copy = tmp_path / "drafter"
    copy.mkdir()
    for f in drafter.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    argv = ["eagle3conv", "verify", str(copy), "--states", str(states)]
    monkeypatch.setattr(console, "cached", lambda files, samples=16: False)
    monkeypatch.setattr(console, "torch_cached", lambda: False)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    info: dict = {}
    assert console.start_read_ahead(argv, info) is False
    assert "read_ahead_files" not in info and "read_ahead_after_import_torch" not in info
    monkeypatch.undo()
    info = {}
    monkeypatch.setattr(console, "cached", lambda files, samples=16: False)
    monkeypatch.setattr(console, "torch_cached", lambda: False)
    assert console.start_read_ahead(argv, info) is True and "read_ahead_after_import_torch" in info


def test_fresh_process_with_torch_cold_imports_it_then_reads_ahead(drafter_and_states, tmp_path):
    """A real fresh process: torch's ``__init__.py`` and the inputs evicted. The console imports
    torch before the CLI and before any read-ahead, and stdout is still one JSON document."""
    drafter, states = drafter_and_states
    env = dict(os.environ, PYTHONPATH=str(REPO), EAGLE3CONV_PHASES="1")
    skip_unless_the_kernel_can_tell(drafter.parent)
    copy = tmp_path / "drafter"  # fresh copies: nothing else has touched (or is reading ahead) these
    copy.mkdir()
    for f in drafter.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    states_copy = tmp_path / "states.safetensors"
    states_copy.write_bytes(states.read_bytes())
    cmd = [sys.executable, "-m", "eagle3conv", "verify", str(copy), "--states", str(states_copy), "--json",
           "--no-save", "--device", "cpu"]
    evict_for_sure([_torch_init(), *copy.glob("*.safetensors"), states_copy])
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert len(json.loads(p.stdout)["acceptance_per_position"]) == 3
    phases = json.loads([ln for ln in p.stderr.splitlines() if ln.startswith("eagle3conv phases:")][0]
                        .split(":", 1)[1])
    assert "read_ahead" not in phases and phases["read_ahead_files"] == 2
    assert 0 < phases["read_ahead_after_import_torch"] <= phases["import_cli"] <= phases["exit"]
    if "read_ahead_done" in phases:  # the daemon thread may still be reading when a tiny run exits
        assert phases["read_ahead_done"] >= phases["read_ahead_after_import_torch"]


def test_many_files_are_read_with_few_descriptors_open(tmp_path):
    """Each file is closed after its last span: a process allowed 64 open files reads a plan of
    2,000 files whole (keeping every file open until the end ran out of descriptors)."""
    for i in range(2000):
        (tmp_path / f"f{i}.bin").write_bytes(bytes([i % 251]) * (i % 97 + 1))
    code = (
        "import os, resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "from eagle3conv import console\n"
        "files = sorted(os.path.join(sys.argv[1], n) for n in os.listdir(sys.argv[1]))\n"
        "plan = [span for p in files for span in console.read_plan(p, striped=False)]\n"
        "info = {}\n"
        "console.read_ahead(plan, info, 4)\n"
        "print(len(files), info['read_ahead_bytes'] == sum(os.path.getsize(p) for p in files))\n"
    )
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=dict(os.environ, PYTHONPATH=str(REPO)),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["2000", "True"]
