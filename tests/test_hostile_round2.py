"""Hostile folders, round two (issue 19): the code added since the first safety pass.

Real FIFOs, real files, real subprocesses, a real /dev/full. Each case hung, deleted files,
printed a traceback or gave an internal error before.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hub_server import HubServer
from eagle3conv import console
from eagle3conv.checkpoint import writer
from eagle3conv.errors import JournalError, MappingFileError
from eagle3conv.example import Dims, write_example
from eagle3conv.io.files import remove_stale_temps, write_json_file

REPO = Path(__file__).resolve().parents[1]
DIMS = Dims(hidden=64, target_hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512,
            draft_vocab=300, aux_ids=(1, 3, 4))
JOURNAL, STAGING, BACKUP = writer.JOURNAL, writer.STAGING, writer.BACKUP


def run_cli(args, *, timeout=120, env=None, **kw):
    """The CLI in a fresh process; a hang is a failure (TimeoutExpired), never a stuck suite."""
    return subprocess.run([sys.executable, "-m", "eagle3conv", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env or dict(os.environ), **kw)


def one_doc(r) -> dict:
    return json.loads(r.stdout)  # exactly one JSON document, or this raises


def no_traceback(r) -> None:
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr


def snapshot(folder: Path) -> dict[str, str]:
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif stat.S_ISFIFO(p.lstat().st_mode):
            out[rel] = "fifo"
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        elif p.is_dir():
            out[rel] = "dir"
    return out


@pytest.fixture
def drafter(drafter_and_states, tmp_path):
    d = tmp_path / "drafter"
    shutil.copytree(drafter_and_states[0], d)
    return d


# --------------------------------------------------------------------------- 1. FIFOs named like temps

TEMP = "{}.a1b2c3d4.tmp"  # the shape tempfile.mkstemp gives our temps: .NAME.XXXXXXXX.tmp


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def bounded(fn, *args, timeout: float = 10.0):
    """``fn(*args)`` in a thread: a call that blocks (on a FIFO, say) fails the test instead of
    hanging the suite. Returns its result or re-raises its exception."""
    import threading

    out: dict = {}

    def call():
        try:
            out["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out["error"] = e

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{getattr(fn, '__name__', fn)} blocked for {timeout} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def test_config_does_not_hang_on_a_fifo_named_like_its_temp(drafter):
    traps = [fifo(drafter / TEMP.format(".config.json")), fifo(drafter / TEMP.format(".training_metadata.json"))]
    r = run_cli(["config", drafter, "--trained-on", "1,3,4", "--captured-at", "output"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert all(stat.S_ISFIFO(t.lstat().st_mode) for t in traps)  # never opened, never removed
    # and the folder is not left locked: another command runs at once
    assert run_cli(["config", drafter, "--check"], timeout=60).returncode == 0


def test_verify_report_and_plot_do_not_hang_on_fifos(drafter_and_states, drafter, tmp_path):
    _, states = drafter_and_states
    trap = fifo(drafter / TEMP.format(".eagle3conv-verify.json"))
    plot = tmp_path / "search.svg"
    trap2 = fifo(tmp_path / TEMP.format(".search.svg"))
    r = run_cli(["verify", drafter, "--states", states, "--device", "cpu", "--json"], timeout=120)
    assert r.returncode in (0, 3), r.stderr
    assert (drafter / "eagle3conv-verify.json").is_file()
    r = run_cli(["verify", drafter, "--states", states, "--device", "cpu", "--search-wiring", "--plot", plot,
                 "--no-save"], timeout=120)
    no_traceback(r)  # 3 sequences: the search is not decided, and the figure says why (item 6)
    assert stat.S_ISFIFO(trap.lstat().st_mode) and stat.S_ISFIFO(trap2.lstat().st_mode)


def test_push_does_not_hang_on_a_fifo_named_like_its_record_temp(tmp_path):
    from eagle3conv.api import fix_keys

    ckpt = write_example(tmp_path / "drafter", "modelopt-export", DIMS)
    fix_keys(ckpt)
    trap = fifo(ckpt / TEMP.format(".eagle3conv-push.json"))
    server = HubServer().start()
    try:
        env = dict(os.environ, HF_ENDPOINT=server.url, HF_HUB_DISABLE_XET="1", HF_TOKEN="hf_test_token")
        r = run_cli(["push", ckpt, "--repo-id", "org/fifo", "--force"], env=env, timeout=120)
    finally:
        server.stop()
    assert r.returncode == 0, r.stderr
    assert (ckpt / "eagle3conv-push.json").is_file() and stat.S_ISFIFO(trap.lstat().st_mode)


def test_stale_temp_cleanup_removes_only_regular_files_it_could_have_written(tmp_path):
    target = tmp_path / "config.json"
    dead = tmp_path / TEMP.format(".config.json")
    dead.write_text("half")
    other_shape = tmp_path / ".config.json.user-notes.tmp"
    other_shape.write_text("not ours")
    pipe = fifo(tmp_path / ".config.json.fifo0000.tmp")
    folder = tmp_path / ".config.json.dir00000.tmp"
    folder.mkdir()
    (folder / "keep").write_text("x")
    link = tmp_path / ".config.json.link0000.tmp"
    link.symlink_to(tmp_path / "elsewhere")
    sock = socket.socket(socket.AF_UNIX)
    sock_path = tmp_path / ".config.json.sock0000.tmp"
    sock.bind(str(sock_path))
    try:
        removed = bounded(remove_stale_temps, target)
    finally:
        sock.close()
    assert removed == [dead] and not dead.exists()
    assert other_shape.exists() and pipe.exists() and (folder / "keep").exists() and link.is_symlink()
    assert sock_path.exists()


def test_journal_style_writes_never_wait_on_a_fifo(tmp_path):
    path = fifo(tmp_path / "journal.json")
    with pytest.raises(OSError):
        bounded(write_json_file, path, {"a": 1})


# --------------------------------------------------------------------------- 2, 3. journals

def _digest(path: Path) -> str:
    return writer._digest(path)


def _entry(path: Path, name: str | None = None) -> dict:
    return {"name": name or path.name, "size": path.stat().st_size, "sha256": _digest(path)}


def _sign(root: Path, journal: dict, key: bytes | None = None) -> dict:
    from eagle3conv.io import journalkey

    key = key if key is not None else journalkey.load_key(create=True)
    return dict(journal, signature=journalkey.signature(key, writer.signed_part(journal)))


@pytest.fixture
def victims(tmp_path):
    """A converted folder beside the files a crafted journal went after: a trainer state, a pickle and
    a second weights file."""
    from eagle3conv.api import fix_keys

    ck = write_example(tmp_path / "ck", "modelopt-export", DIMS)
    fix_keys(ck)
    torch.save({"step": 1}, ck / "training_state.pt")
    torch.save({"w": torch.zeros(2)}, ck / "pytorch_model.bin")
    shutil.copy(ck / "model.safetensors", ck / "extra.safetensors")
    return ck


def _old(root: Path, names: list[str]) -> list[dict]:
    """How the writer identifies the files it replaces (size, mtime, first MiB)."""
    out = []
    for n in names:
        if not os.path.isfile(root / n):
            out.append({"name": n, "size": -1, "mtime_ns": -1, "sha256": "not a regular file"})
            continue
        st, head = (root / n).stat(), (root / n).read_bytes()[: 1 << 20]
        out.append({"name": n, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                    "sha256": hashlib.sha256(head).hexdigest()})
    return out


def _crafted(root: Path, *, version=writer.JOURNAL_VERSION, signed=False, key=None, replace=None, **extra) -> dict:
    """The reported attack: every file already 'moved in' with digests computed from the folder's own
    files, and the victims listed as replaced."""
    install = [_entry(root / "model.safetensors"), _entry(root / "config.json")]
    replace = replace or ["training_state.pt", "pytorch_model.bin", "extra.safetensors"]
    j = {"version": version, "writer": writer.WRITER_ID, "install": install, "replace": replace,
         "old": _old(root, replace), **extra}
    return _sign(root, j, key) if signed else j


COMMANDS = [["inspect", "--json"], ["verify", "--json"], ["fix-keys", "--out", "{out}", "--json"],
            ["config", "--check", "--json"], ["fix-keys", "--json"]]


def _refused_everywhere(root: Path, tmp_path: Path, *, why: str) -> None:
    before = snapshot(root)
    for i, cmd in enumerate(COMMANDS):
        args = [cmd[0], root, *[a.format(out=tmp_path / f"out{i}") for a in cmd[1:]]]
        r = run_cli(args, timeout=120)
        no_traceback(r)
        assert r.returncode == 3, (args, r.returncode, r.stderr)
        d = one_doc(r)
        assert d["error"] == "JournalError" and "nothing was touched" in d["message"], d
        assert why in d["message"], d["message"]
        assert str(root / JOURNAL) in d["hint"], d
        assert snapshot(root) == before, args
        assert not (tmp_path / f"out{i}").exists()


@pytest.mark.parametrize("case", ["v2", "unsigned", "other-key", "malformed-signature"])
def test_a_journal_this_writer_did_not_write_deletes_nothing(victims, tmp_path, case):
    if case == "v2":
        j, why = _crafted(victims, version=2), "version"
    elif case == "unsigned":
        j, why = _crafted(victims), "no signature"
    elif case == "other-key":
        j, why = _crafted(victims, signed=True, key=os.urandom(32)), "signature does not match"
    else:
        j, why = _crafted(victims, signature="00" * 32), "signature does not match"
    (victims / JOURNAL).write_text(json.dumps(j))
    _refused_everywhere(victims, tmp_path, why=why)
    (victims / JOURNAL).unlink()  # the way out the hint gives: the folder is readable again
    assert run_cli(["inspect", victims, "--json"]).stdout.count("JournalError") == 0


def test_a_signed_journal_for_another_folder_is_refused(victims, tmp_path):
    """The journal's folder identity is the files it replaces (issue 25): a journal carried into a
    folder of the same names whose file differs (another checkpoint, another epoch) is refused."""
    j = _crafted(victims, signed=True)
    copy = tmp_path / "copy"
    shutil.copytree(victims, copy)  # a journal copied (or downloaded) along with a folder
    torch.save({"w": torch.ones(2)}, copy / "pytorch_model.bin")  # ... that holds another file of that name
    (copy / JOURNAL).write_text(json.dumps(j))
    _refused_everywhere(copy, tmp_path, why="written for other files")


def test_a_signed_journal_whose_steps_the_writer_never_takes_is_refused(victims, tmp_path):
    """Signed by this user's key, but the folder is in no state the writer's order of steps leaves:
    new files moved in while the replaced ones are still in place."""
    (victims / JOURNAL).write_text(json.dumps(_crafted(victims, signed=True)))
    _refused_everywhere(victims, tmp_path, why="still in the folder although new files were moved in")


def test_a_signed_journal_with_a_stranger_in_the_backup_is_refused(victims, tmp_path):
    (victims / BACKUP).mkdir()
    (victims / BACKUP / "notes.txt").write_text("mine")
    j = _crafted(victims, signed=True, replace=["pytorch_model.bin"])
    os.replace(victims / "pytorch_model.bin", victims / BACKUP / "pytorch_model.bin")
    (victims / JOURNAL).write_text(json.dumps(j))
    _refused_everywhere(victims, tmp_path, why="holds files the journal does not replace")


def test_a_journal_naming_a_300_character_file_is_refused_before_anything(victims, tmp_path):
    long = "w" * 300 + ".safetensors"
    j = _crafted(victims, signed=True, replace=[long])
    (victims / JOURNAL).write_text(json.dumps(j))
    _refused_everywhere(victims, tmp_path, why="longer than this file system allows")
    (victims / JOURNAL).unlink()
    assert run_cli(["inspect", victims, "--json"]).stdout.count("JournalError") == 0


def test_a_recovery_the_file_system_stops_half_way_puts_everything_back(victims, monkeypatch):
    """A signed journal the writer left after its commit point; the second move fails: what was
    moved goes back, the journal stays, and the error says how to go on."""
    staging = victims / STAGING
    staging.mkdir()
    shutil.copy(victims / "model.safetensors", staging / "model.safetensors")
    shutil.copy(victims / "config.json", staging / "config.json")
    j = _sign(victims, {"version": writer.JOURNAL_VERSION, "writer": writer.WRITER_ID,
                        "install": [_entry(staging / "model.safetensors"), _entry(staging / "config.json")],
                        "replace": ["config.json", "model.safetensors", "pytorch_model.bin"],
                        "old": _old(victims, ["config.json", "model.safetensors", "pytorch_model.bin"])})
    (victims / JOURNAL).write_text(json.dumps(j))
    before = snapshot(victims)
    real = os.replace
    calls = []

    def failing(src, dst, *a, **kw):
        calls.append(src)
        if len(calls) == 2:
            raise OSError(28, "No space left on device", str(src))
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(writer.os, "replace", failing)
    with pytest.raises(JournalError) as e:
        writer.recover(victims)
    monkeypatch.undo()
    assert "the moves made were undone" in e.value.message and f"eagle3conv fix-keys {victims}" in e.value.hint
    after = snapshot(victims)
    assert {k: v for k, v in after.items() if not k.startswith(BACKUP)} == before
    # and the next command finishes it
    assert "completed" in writer.recover(victims)
    assert not (victims / JOURNAL).exists() and not staging.exists() and not (victims / "pytorch_model.bin").exists()


def test_the_writers_own_journal_is_signed_and_still_finished(victims, tmp_path):
    """What the writer itself leaves past its commit point is finished by the next command."""
    src = write_example(tmp_path / "src", "modelopt-export", DIMS)
    p = subprocess.Popen([sys.executable, "-m", "eagle3conv", "fix-keys", str(src)],
                         env=dict(os.environ, EAGLE3CONV_STALL_AT="after-commit:60"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    t0 = time.monotonic()
    while not (src / JOURNAL).exists() and p.poll() is None and time.monotonic() - t0 < 60:
        time.sleep(0.02)
    p.kill()
    p.wait()
    j = json.loads((src / JOURNAL).read_text())
    assert j["version"] == writer.JOURNAL_VERSION and len(j["signature"]) == 64
    r = run_cli(["inspect", src, "--json"])
    assert r.returncode == 0 and "completed" in one_doc(r)["recovered"], r.stderr
    assert not (src / JOURNAL).exists()


def test_journal_key_is_private_and_refused_otherwise(tmp_path, monkeypatch):
    from eagle3conv.io import journalkey

    monkeypatch.setenv("EAGLE3CONV_STATE_DIR", str(tmp_path / "state"))
    key = journalkey.load_key(create=True)
    assert key is not None and len(key) == 32
    path = journalkey.key_path()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert journalkey.load_key(create=True) == key == journalkey.load_key(create=False)
    os.chmod(path, 0o644)  # readable by others: not a secret any more
    assert journalkey.load_key(create=False) is None
    os.chmod(path, 0o600)
    os.chmod(path.parent, 0o777)
    assert journalkey.load_key(create=False) is None


def test_staging_leftovers_that_fix_keys_never_stages_are_not_removed(victims, tmp_path):
    (victims / STAGING).mkdir()
    (victims / STAGING / "holiday-photos.tar").write_text("mine")
    before = snapshot(victims)
    r = run_cli(["inspect", victims, "--json"])
    assert r.returncode == 3 and "never stages" in one_doc(r)["message"], r.stderr
    assert snapshot(victims) == before


# --------------------------------------------------------------------------- 4. the read-ahead

def _raw_states(path: Path, header: bytes, data: bytes = b"") -> Path:
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)
    return path


def hostile_states(tmp_path: Path) -> dict[str, Path]:
    deep = b"[" * 200_000 + b"]" * 200_000
    ok_entry = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    many = {f"t{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(60_000)}
    big = {f"t{i}": {"dtype": "F32", "shape": [2**40], "data_offsets": [0, 2**42]} for i in range(60_000)}
    return {
        "deep": _raw_states(tmp_path / "deep.safetensors", deep),
        "float-offsets": _raw_states(tmp_path / "float.safetensors",
                                     json.dumps({"a": dict(ok_entry, data_offsets=[0.5, 8.5])}).encode(), b"\0" * 8),
        "offsets-2^63": _raw_states(tmp_path / "huge.safetensors",
                                    json.dumps({"a": dict(ok_entry, data_offsets=[2**63, 2**63 + 8])}).encode(),
                                    b"\0" * 8),
        "many-spans": _raw_states(tmp_path / "many.safetensors", json.dumps(many).encode()),
        "huge-spans": _raw_states(tmp_path / "big.safetensors", json.dumps(big).encode()),
    }


def test_read_plan_parses_headers_strictly_or_reads_nothing(tmp_path):
    for name, path in hostile_states(tmp_path).items():
        plan = bounded(console.read_plan, str(path), True, timeout=20)  # never raises
        assert sum(n for _, _, n in plan) <= path.stat().st_size, name
        assert len(plan) <= 1 + path.stat().st_size // (4 * console.READ_CHUNK) + 1 or name == "many-spans", name


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


MEASURE = ("import resource, subprocess, sys, json\n"
           "p = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=120)\n"
           "print(json.dumps({'rc': p.returncode, 'out': p.stdout, 'err': p.stderr,"
           " 'maxrss_kb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))\n")


@pytest.mark.parametrize("case", ["deep", "float-offsets", "offsets-2^63", "many-spans", "huge-spans"])
def test_verify_on_hostile_states_is_one_clear_error_with_bounded_memory(drafter_and_states, tmp_path, case):
    drafter, _ = drafter_and_states
    path = hostile_states(tmp_path)[case]
    _evict(path)  # cold: the console reads ahead what is not cached
    script = REPO / "bin" / "eagle3conv"
    t0 = time.monotonic()
    m = subprocess.run([sys.executable, "-c", MEASURE, sys.executable, str(script), "verify", str(drafter),
                        "--states", str(path), "--json", "--no-save", "--device", "cpu"],
                       capture_output=True, text=True, timeout=180)
    took = time.monotonic() - t0
    d = json.loads(m.stdout)
    assert d["rc"] in (1, 3), d
    assert "Traceback" not in d["err"] and "internal error" not in d["err"], d["err"]
    assert json.loads(d["out"])["error"] in ("CheckpointReadError", "InvalidCheckpointError"), d["out"]
    assert d["maxrss_kb"] < 1_500_000, d["maxrss_kb"]  # torch's import alone is most of it
    assert took < 60


# --------------------------------------------------------------------------- 5. stdout that cannot be written

@pytest.mark.parametrize("json_flag", [True, False])
def test_stdout_to_dev_full_names_stdout(drafter, json_flag):
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "eagle3conv", "inspect", str(drafter),
                            *(["--json"] if json_flag else [])], stdout=full, stderr=subprocess.PIPE, text=True,
                           timeout=120)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
    assert "cannot write the output to stdout: No space left on device" in r.stderr, r.stderr
    assert str(drafter) not in r.stderr.splitlines()[0]  # stdout is to blame, not the checkpoint's disk


# --------------------------------------------------------------------------- 6. verify --plot

@pytest.mark.parametrize("case", ["folder", "proc", "no-search", "no-states", "link"])
def test_plot_options_are_checked_before_any_work(drafter_and_states, drafter, tmp_path, case):
    _, states = drafter_and_states
    (tmp_path / "afolder.svg").mkdir()
    (tmp_path / "link.svg").symlink_to(tmp_path / "nowhere.svg")
    plot, extra = {
        "folder": (tmp_path / "afolder.svg", ["--states", states, "--search-wiring"]),
        "proc": ("/proc/self/plot.svg", ["--states", states, "--search-wiring"]),
        "no-search": (tmp_path / "p.svg", ["--states", states]),
        "no-states": (tmp_path / "p.svg", ["--search-wiring"]),
        "link": (tmp_path / "link.svg", ["--states", states, "--search-wiring"]),
    }[case]
    t0 = time.monotonic()
    r = run_cli(["verify", drafter, *extra, "--plot", plot, "--device", "cpu"])
    assert r.returncode == 2, (r.returncode, r.stderr)
    no_traceback(r)
    assert "--plot" in r.stderr
    assert not (drafter / "eagle3conv-verify.json").exists()  # refused before any work
    assert time.monotonic() - t0 < 60


def test_plot_that_cannot_be_drawn_still_prints_the_results_and_the_real_reason(drafter_and_states, drafter,
                                                                                tmp_path):
    _, states = drafter_and_states  # 3 sequences: too few for a search verdict
    r = run_cli(["verify", drafter, "--states", states, "--search-wiring", "--plot", tmp_path / "p.svg",
                 "--device", "cpu", "--json", "--no-save"])
    no_traceback(r)
    d = one_doc(r)
    assert d["acceptance_per_position"] and "plot_error" in d, d.keys()
    assert "at least 10" in d["plot_error"] and "run verify with --search-wiring" not in d["plot_error"]
    assert r.returncode == 2 and "at least 10" in r.stderr


# --------------------------------------------------------------------------- 7. --engine with a huge release

def test_engine_release_of_5000_digits_is_a_usage_error(drafter):
    r = run_cli(["inspect", drafter, "--engine", "sglang==" + "1" * 5000])
    assert r.returncode == 2, r.stderr
    no_traceback(r)
    assert "is not a release number" in r.stderr and len(r.stderr) < 2000


# --------------------------------------------------------------------------- 8. test hooks

def _no_hooks_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "EAGLE3CONV_TEST_HOOKS"}
    return dict(env, **extra)


def test_hooks_are_ignored_without_the_switch(tmp_path):
    src = write_example(tmp_path / "src", "modelopt-export", DIMS)
    r = run_cli(["fix-keys", src], env=_no_hooks_env(EAGLE3CONV_KILL_AT_STEP="1", EAGLE3CONV_STALL_AT="x:inf",
                                                     EAGLE3CONV_CHUNK_BYTES="zero"))
    assert r.returncode == 0, r.stderr  # neither killed nor stalled nor refused


@pytest.mark.parametrize("env", [{"EAGLE3CONV_STALL_AT": "after-commit:inf"},
                                 {"EAGLE3CONV_STALL_AT": "after-commit:nan"},
                                 {"EAGLE3CONV_STALL_AT": "after-commit:600"},
                                 {"EAGLE3CONV_STALL_AT": "nowhere:1"},
                                 {"EAGLE3CONV_CHUNK_BYTES": "0"},
                                 {"EAGLE3CONV_CHUNK_BYTES": "lots"},
                                 {"EAGLE3CONV_KILL_AT_STEP": "-1"}])
def test_bad_hooks_are_a_usage_error_before_any_work(tmp_path, env):
    src = write_example(tmp_path / "src", "modelopt-export", DIMS)
    before = snapshot(src)
    r = run_cli(["fix-keys", src], env=dict(os.environ, **env))
    assert r.returncode == 2, r.stderr
    no_traceback(r)
    assert snapshot(src) == before


def test_a_stall_after_the_commit_changes_nothing_reported(tmp_path):
    src = write_example(tmp_path / "src", "modelopt-export", DIMS)
    r = run_cli(["fix-keys", src, "--json"], env=dict(os.environ, EAGLE3CONV_STALL_AT="after-commit:0.2"))
    assert r.returncode == 0, r.stderr
    d = one_doc(r)
    assert d["files"] == ["model.safetensors", "config.json"] and d["unchanged"] is False, d


# --------------------------------------------------------------------------- 9. the engine-rules loader

def _paths(o, pre=()):
    yield pre
    if isinstance(o, dict):
        for k, v in o.items():
            yield from _paths(v, pre + (k,))
    elif isinstance(o, list):
        for i, v in enumerate(o):
            yield from _paths(v, pre + (i,))


def test_every_wrongly_typed_field_of_an_engine_file_is_a_mapping_error(tmp_path):
    """Each field of each engine file replaced by a value of every JSON type: the loader answers with
    its own error naming the file, never a TypeError (a list as 'explicit' was one)."""
    from eagle3conv.spec import engines

    root = REPO / "mappings" / "engines"
    fams = engines.load_families_file(root / "families.json")
    cases = 0
    for f in sorted(root.glob("*.json")):
        if f.name == "families.json":
            continue
        raw = json.loads(f.read_text())
        for path in list(_paths(raw))[1:]:
            for value in ([1, 2], {"a": 1}, [], None, 7):
                mutated = json.loads(json.dumps(raw))
                node = mutated
                for k in path[:-1]:
                    node = node[k]
                node[path[-1]] = value
                q = tmp_path / f.name
                q.write_text(json.dumps(mutated))
                cases += 1
                try:
                    engines.load_engine_file(q, fams)
                except MappingFileError as e:
                    assert str(q) in e.message
    assert cases > 1000


# --------------------------------------------------------------------------- 10. Ctrl-C at start-up

def test_the_launcher_takes_ctrl_c_before_anything_else():
    """The installed launcher is eagle3conv's own (bin/eagle3conv): its first statements install
    the SIGINT handler with the built-in _signal, before any other import (pip's generated launcher
    imported re first, ~8 ms, during which Ctrl-C printed a traceback; bench/ctrl_c_start.py)."""
    text = (REPO / "bin" / "eagle3conv").read_text()
    assert text.startswith("#!python\n")
    body = [n for n in ast.parse(text).body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    first_import = body[0]
    assert isinstance(first_import, ast.Import) and first_import.names[0].name == "_signal"
    installed = next(i for i, n in enumerate(body) if isinstance(n, ast.If) and "_signal.signal" in ast.unparse(n))
    package = next(i for i, n in enumerate(body) if isinstance(n, ast.ImportFrom) and n.module.startswith("eagle3conv"))
    assert installed < package
    assert all(isinstance(n, (ast.Import, ast.FunctionDef, ast.Assign, ast.If)) for n in body[:installed])
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"bin/eagle3conv" = "eagle3conv"' in pyproject and "\n[project.scripts]" not in pyproject


def test_the_launcher_hands_ctrl_c_over_to_the_console(drafter):
    """Started through the launcher, a Ctrl-C well after start-up still goes through the console's
    handling (one line, exit 130, one JSON document)."""
    import signal

    p = subprocess.Popen([sys.executable, str(REPO / "bin" / "eagle3conv"), "verify", str(drafter), "--json",
                          "--device", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # past start-up, whatever the machine's load: the console is importing torch (its libraries are
    # mapped); a fixed sleep of 0.4 s signalled Python's own start-up on a loaded machine
    maps = Path(f"/proc/{p.pid}/maps")
    deadline = time.monotonic() + 60
    while p.poll() is None and time.monotonic() < deadline:
        try:
            if "libtorch" in maps.read_text():
                break
        except OSError:
            break
        time.sleep(0.01)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    if p.returncode == 0:
        pytest.skip("the command finished before the signal")
    assert p.returncode == 130 and "Traceback" not in err, (p.returncode, err)
    assert json.loads(out)["exit_code"] == 130


# --------------------------------------------------------------------------- 11. fields the engines fill in

@pytest.mark.parametrize("edit,code,words", [
    (lambda c: c.pop("rms_norm_eps"), "audit-engine-default", "rms_norm_eps = 1e-06"),
    (lambda c: c.pop("head_dim"), "audit-engine-default", "head_dim = hidden_size // num_attention_heads"),
    (lambda c: c.__setitem__("eagle_config", None), "audit-eagle-config-null", "read it as no eagle_config"),
])
def test_config_check_says_what_the_engines_assume(drafter, edit, code, words):
    cfg = json.loads((drafter / "config.json").read_text())
    edit(cfg)
    (drafter / "config.json").write_text(json.dumps(cfg))
    r = run_cli(["config", drafter, "--check", "--json"])
    no_traceback(r)
    found = [f for f in one_doc(r)["wiring"]["findings"] if f["code"] == code]
    assert found and words in found[0]["message"], one_doc(r)["wiring"]["findings"]


# --------------------------------------------------------------------------- the other JSON files a folder holds

@pytest.mark.parametrize("name", ["eagle3conv-push.json", "training_metadata.json"])
def test_push_never_reads_a_fifo_in_place_of_its_json_files(tmp_path, name):
    """push --dry-run without --repo-id reads the push record, then training_metadata.json for a repo
    id: a FIFO in either place is refused or skipped, never waited on."""
    from eagle3conv.api import fix_keys

    ckpt = write_example(tmp_path / "drafter", "modelopt-export", DIMS)
    fix_keys(ckpt)
    (ckpt / name).unlink(missing_ok=True)
    fifo(ckpt / name)
    r = run_cli(["push", ckpt, "--dry-run"], timeout=60)
    no_traceback(r)
    assert r.returncode in (1, 2, 3), r.stderr


def test_hf_cache_ref_that_is_not_a_commit_is_not_followed(tmp_path):
    repo = tmp_path / "models--org--name"
    (repo / "snapshots" / "abc1234").mkdir(parents=True)
    (repo / "snapshots" / "other").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("../../../../etc")
    r = run_cli(["inspect", repo, "--json"])  # two snapshots and no usable ref: the user is asked to pick one
    assert r.returncode == 2 and "2 snapshots and no refs/main" in one_doc(r)["message"], r.stdout
    (repo / "refs" / "main").write_text("abc1234\n")
    r = run_cli(["inspect", repo, "--json"])
    assert "abc1234" in one_doc(r)["message"] and "/etc" not in one_doc(r)["message"], r.stdout
