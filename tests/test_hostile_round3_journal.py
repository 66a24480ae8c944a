"""Hostile folders, round three (issue 25, part A): journal keys, the journal's folder identity, a
closed stdout.

Everything is real: state folders and key files made as a user's dotfiles make them (links, modes,
owners, FIFOs), ``fix-keys`` in fresh processes killed with SIGKILL at each file-system step after
its commit point (the test hooks, docs/testing.md), an ext4 image re-attached under another loop
device (root only), a shell that closes stdout.

Running as root, the state-folder cases run the CLI without the capabilities that let root write
where nobody else may (``setpriv``), so a read-only or foreign home means to it what it means to
everyone else; the cases that need a file of another user (``chown``) run only as root.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from eagle3conv.checkpoint import writer
from eagle3conv.example import Dims, write_example

REPO = Path(__file__).resolve().parents[1]
DIMS = Dims(hidden=64, target_hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512,
            draft_vocab=300, aux_ids=(1, 3, 4))
JOURNAL, STAGING, BACKUP = writer.JOURNAL, writer.STAGING, writer.BACKUP
ROOT = os.geteuid() == 0
OTHER_UID = 4242  # a user that does not exist here: files chowned to it belong to someone else
NO_OVERRIDE = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]


def cli(args, *, env=None, timeout=180, plain_user=True):
    """The CLI in a fresh process; as root, without the capabilities that override file modes."""
    prefix = NO_OVERRIDE if ROOT and plain_user else []
    return subprocess.run([*prefix, sys.executable, "-m", "eagle3conv", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env or dict(os.environ))


def no_traceback(r) -> None:
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr


def snapshot(folder: Path) -> dict[str, str]:
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        elif p.is_dir():
            out[rel] = "dir"
    return out


def without_state(**env) -> dict:
    """The environment with none of the test run's state settings (conftest.py sets one), plus ``env``."""
    e = {k: v for k, v in os.environ.items() if k not in ("EAGLE3CONV_STATE_DIR", "XDG_STATE_HOME")}
    return dict(e, **{k: str(v) for k, v in env.items()})


def private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True)
    os.chmod(path, 0o700)
    return path


def good_key(path: Path) -> Path:
    path.write_text(os.urandom(32).hex() + "\n")
    os.chmod(path, 0o600)
    return path


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A source drafter (modelopt-export, converted 1 file -> 1 file) and what fix-keys makes of it."""
    base = tmp_path_factory.mktemp("ref")
    src = write_example(base / "src", "modelopt-export", DIMS)
    fixed = base / "fixed"
    shutil.copytree(src, fixed)
    r = cli(["fix-keys", fixed], plain_user=False)
    assert r.returncode == 0, r.stderr
    return src, snapshot(src), snapshot(fixed)


# --------------------------------------------------------------------------- 1. no usable journal key

def _home(tmp: Path, kind: str) -> dict:
    """HOME set up as ``kind``; the state folder is the default one under it."""
    home = tmp / "home"
    home.mkdir()
    if kind == "read-only":
        os.chmod(home, 0o555)
    elif kind == "foreign":
        os.chown(home, OTHER_UID, OTHER_UID)
    return without_state(HOME=home)


def _state(tmp: Path, kind: str) -> tuple[dict, Path]:
    """EAGLE3CONV_STATE_DIR set up as ``kind``; returns the environment and the folder the key is in."""
    d = tmp / "state"
    if kind == "symlinked":  # a dotfile manager's link to a private folder: used, through the link
        target = private_dir(tmp / "dotfiles" / "state")
        d.symlink_to(target)
        return without_state(EAGLE3CONV_STATE_DIR=d), target
    if kind == "symlink-to-0777":
        target = tmp / "shared"
        target.mkdir()
        os.chmod(target, 0o777)
        d.symlink_to(target)
        return without_state(EAGLE3CONV_STATE_DIR=d), d
    if kind == "a file":
        d.write_text("not a folder")
        return without_state(EAGLE3CONV_STATE_DIR=d), d
    if kind == "under a file":
        d.write_text("not a folder")
        return without_state(EAGLE3CONV_STATE_DIR=d / "eagle3conv"), d / "eagle3conv"
    if kind == "relative":
        return without_state(EAGLE3CONV_STATE_DIR="relative/state"), None
    private_dir(d)
    key = d / "journal.key"
    if kind == "read-only, with a key":
        good_key(key)
        os.chmod(d, 0o500)
    elif kind == "mode 0777":
        os.chmod(d, 0o777)
    elif kind == "another user's folder":
        os.chown(d, OTHER_UID, OTHER_UID)
    elif kind == "read-only, no key":
        os.chmod(d, 0o500)
    elif kind == "key: symlink":
        key.symlink_to(good_key(tmp / "elsewhere.key"))
    elif kind == "key: FIFO":
        os.mkfifo(key, 0o600)
    elif kind == "key: folder":
        key.mkdir()
    elif kind == "key: empty":
        key.touch(0o600)
    elif kind == "key: garbage":
        key.write_bytes(b"\xff\xfe not hex at all\n")
        os.chmod(key, 0o600)
    elif kind == "key: 0644":
        good_key(key)
        os.chmod(key, 0o644)
    elif kind == "key: too long":
        key.write_text("ab" * 500 + "\n")
        os.chmod(key, 0o600)
    elif kind == "key: another user's":
        good_key(key)
        os.chown(key, OTHER_UID, OTHER_UID)
    elif kind != "read-only, with a key":
        raise AssertionError(kind)
    return without_state(EAGLE3CONV_STATE_DIR=d), d


# case -> (how it is set up, what the refusal says about it; None: the key is usable and the write signed)
CASES = {
    "HOME read-only": ("home", "read-only", "cannot be created"),
    "HOME another user's": ("home", "foreign", "cannot be created"),
    "HOME=/": ("home", "/", "cannot be created"),
    "state folder mode 0777": ("state", "mode 0777", "can be written by other users (mode 0777)"),
    "state folder another user's": ("state", "another user's folder", "belongs to another user"),
    "state folder a link to a 0777 folder": ("state", "symlink-to-0777", "can be written by other users"),
    "state folder a file": ("state", "a file", "is not a folder"),
    "state folder under a file": ("state", "under a file", "cannot be used (Not a directory)"),
    "state folder relative": ("state", "relative", "is not an absolute path"),
    "state folder read-only, no key": ("state", "read-only, no key", "cannot be created"),
    "key a symlink": ("state", "key: symlink", "is a symbolic link"),
    "key a FIFO": ("state", "key: FIFO", "is a FIFO"),
    "key a folder": ("state", "key: folder", "is a folder"),
    "key empty": ("state", "key: empty", "is empty"),
    "key garbage": ("state", "key: garbage", "does not hold a key"),
    "key mode 0644": ("state", "key: 0644", "can be read by other users (mode 0644)"),
    "key too long": ("state", "key: too long", "longer than a key"),
    "key another user's": ("state", "key: another user's", "belongs to another user"),
    # usable: the write goes ahead, signed (a read-only folder holding a key worked before too)
    "state folder a link to a private folder": ("state", "symlinked", None),
    "state folder read-only, with a key": ("state", "read-only, with a key", None),
}
NEEDS_ROOT = {"HOME another user's", "state folder another user's", "key another user's"}


@pytest.mark.parametrize("case", list(CASES))
def test_in_place_fix_keys_refuses_before_writing_when_it_cannot_sign(converted, tmp_path, case):
    """Issue 25 #1: 18 ways to have no usable journal key; each is refused before anything is
    written, naming what is wrong and EAGLE3CONV_STATE_DIR, and the hint, followed, converts the
    folder. The usable ones (a link to a private folder, a read-only folder holding a key, none yet)
    sign the journal with the key in that folder."""
    src, old, new = converted
    how, kind, says = CASES[case]
    if case in NEEDS_ROOT and not ROOT:
        pytest.skip("needs root to make a file of another user")
    if case == "HOME=/" and ROOT:
        pytest.skip("as root, / is this user's own folder (run as another user, it is the container case)")
    if (how == "home" or "read-only" in kind) and ROOT and shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to run as root without overriding file modes")
    ck = tmp_path / "ck"
    shutil.copytree(src, ck)
    if how == "home":
        env, where = (without_state(HOME="/"), Path("/.local")) if kind == "/" else (_home(tmp_path, kind), None)
    else:
        env, where = _state(tmp_path, kind)
    r = cli(["fix-keys", ck, "--json"], env=env)
    no_traceback(r)
    doc = json.loads(r.stdout)
    if says is None:
        assert r.returncode == 0, r.stderr
        assert snapshot(ck) == new
        key = where / "journal.key"  # the journal was signed with this folder's key, made 0600 if new
        assert key.is_file() and not key.is_symlink() and stat.S_IMODE(key.stat().st_mode) == 0o600
        return
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert doc["error"] == "JournalKeyError", doc
    assert says in doc["message"] and "nothing was written" in doc["message"], doc["message"]
    if where is not None:
        assert str(where) in doc["message"] or str(where) in doc["hint"], doc
    assert "EAGLE3CONV_STATE_DIR" in doc["hint"] and f"eagle3conv fix-keys {ck} --out DIR" in doc["hint"], doc
    assert snapshot(ck) == old  # not a byte written: no staging folder, no journal
    # the hint, followed: a folder of one's own as EAGLE3CONV_STATE_DIR
    mine = tmp_path / "my-state"
    r = cli(["fix-keys", ck], env=without_state(EAGLE3CONV_STATE_DIR=mine))
    assert r.returncode == 0, r.stderr
    assert snapshot(ck) == new


# --------------------------------------------------------------------------- 1. hints after a kill

def _count_steps(src: Path, tmp: Path) -> int:
    probe = tmp / "probe"
    shutil.copytree(src, probe)
    code = ("from eagle3conv.checkpoint import writer; from eagle3conv.api import fix_keys;"
            f"fix_keys({str(probe)!r}); print(writer.steps_taken())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip())


@pytest.fixture(scope="module")
def killed(converted, tmp_path_factory) -> list[Path]:
    """One copy of the source per file-system step from the commit point on, each with in-place
    fix-keys SIGKILLed at that step (the test hook): every state a crash after the commit leaves."""
    src = converted[0]
    tmp = tmp_path_factory.mktemp("killed")
    total = _count_steps(src, tmp)
    states: list[Path] = []
    for step in range(total, 0, -1):
        work = tmp / f"k{step}"
        shutil.copytree(src, work)
        r = subprocess.run([sys.executable, "-m", "eagle3conv", "fix-keys", str(work)], capture_output=True,
                           text=True, timeout=180, env=dict(os.environ, EAGLE3CONV_KILL_AT_STEP=str(step)))
        assert r.returncode == -signal.SIGKILL, (step, r.returncode, r.stderr)
        if (work / JOURNAL).exists():
            states.append(work)
        else:
            shutil.rmtree(work)  # done (the last step), or before the commit point (test_crash.py covers those)
            if states:
                break
    assert len(states) >= 4, states  # the commit, each move, the backup's and the staging's removal
    return states


def _copies(states: list[Path], tmp: Path) -> list[Path]:
    out = []
    for s in states:
        shutil.copytree(s, tmp / s.name, symlinks=True)
        out.append(tmp / s.name)
    return out


def _run_hint(hint: str, start: str, env: dict):
    """Run the `eagle3conv ...` command the hint gives, exactly as written there."""
    i = hint.index(start)
    end = hint.index(" (", i) if " (" in hint[i:] else len(hint)
    argv = shlex.split(hint[i:end])
    assert argv[0] == "eagle3conv", argv
    return cli(argv[1:], env=env, plain_user=False)


@pytest.mark.slow
@pytest.mark.parametrize("lost", ["key changed", "older unsigned journal"])
def test_after_a_kill_past_the_commit_the_refusal_hint_leads_to_the_new_checkpoint(converted, killed, tmp_path,
                                                                                   lost):
    """Issue 25 #1: killed at each step of the roll-forward, then the journal cannot be checked any
    more (the key changed -- a fresh container, a new HOME -- or an older eagle3conv wrote it
    unsigned). Every command refuses, touching nothing, and its hint, run as written, finishes the
    conversion: the folder is exactly the new checkpoint, and every command works on it again."""
    new = converted[2]
    for work in _copies(killed, tmp_path):
        if lost == "older unsigned journal":
            j = json.loads((work / JOURNAL).read_text())
            for k in ("signature", "old"):
                j.pop(k)
            j["version"] = 2
            (work / JOURNAL).write_text(json.dumps(j))
        env = without_state(EAGLE3CONV_STATE_DIR=tmp_path / f"fresh-{work.name}")
        before = snapshot(work)
        r = cli(["inspect", work, "--json"], env=env, plain_user=False)
        no_traceback(r)
        doc = json.loads(r.stdout)
        assert r.returncode == 3 and doc["error"] == "JournalError", (work.name, doc)
        assert "nothing was touched" in doc["message"] and "cannot check this journal" in doc["message"], doc
        assert snapshot(work) == before
        r = _run_hint(doc["hint"], f"eagle3conv fix-keys {work} --accept-journal", env)
        assert r.returncode == 0, (work.name, r.stderr)
        assert snapshot(work) == new, work.name
        r = cli(["inspect", work, "--json"], env=env, plain_user=False)
        assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_a_journal_removed_by_hand_after_a_kill_has_a_hint_that_leads_to_a_working_folder(converted, killed,
                                                                                           tmp_path):
    """Round three's trap: killed during the roll-forward, the journal removed by hand (what the old
    hint said), every command refused again with that same hint. Now the hint says where the old
    and new files are and which leftovers to remove; moving the old files back and removing them
    gives back the old checkpoint, and in-place fix-keys then converts it."""
    _, old, new = converted
    first = next(w for w in reversed(killed) if (w / BACKUP).is_dir() and any((w / BACKUP).iterdir()))
    work = _copies([first], tmp_path)[0]
    (work / JOURNAL).unlink()
    r = cli(["inspect", work, "--json"], plain_user=False)
    no_traceback(r)
    doc = json.loads(r.stdout)
    assert r.returncode == 3 and "the journal is missing" in doc["message"], doc
    assert f"rm {work / JOURNAL}" not in doc["hint"]  # the advice that led here is not given again
    assert str(work / BACKUP) in doc["hint"] and str(work / STAGING) in doc["hint"], doc["hint"]
    for f in (work / BACKUP).iterdir():  # "move out of them what you want to keep": the old files
        os.replace(f, work / f.name)
    i = doc["hint"].index("rm -r ")
    leftovers = shlex.split(doc["hint"][i + len("rm -r "):doc["hint"].index(")", i)])
    assert {Path(p).name for p in leftovers} == {p.name for p in work.iterdir() if p.name.startswith(".eagle3conv")}
    subprocess.run(["rm", "-r", *leftovers], check=True)
    assert snapshot(work) == old
    assert cli(["fix-keys", work], plain_user=False).returncode == 0
    assert snapshot(work) == new


# --------------------------------------------------------------------------- 2. the folder's identity

def _stalled_after_commit(folder: Path) -> None:
    """In-place fix-keys on ``folder``, SIGKILLed while it waits right after its commit point."""
    p = subprocess.Popen([sys.executable, "-m", "eagle3conv", "fix-keys", str(folder)],
                         env=dict(os.environ, EAGLE3CONV_STALL_AT="after-commit:120"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    t0 = time.monotonic()
    while not (folder / JOURNAL).exists() and p.poll() is None and time.monotonic() - t0 < 120:
        time.sleep(0.02)
    p.kill()
    p.wait()
    assert (folder / JOURNAL).exists() and (folder / STAGING).is_dir()


def _loop(image: Path) -> str:
    return subprocess.run(["losetup", "--find", "--show", str(image)], check=True, capture_output=True,
                          text=True).stdout.strip()


def _remount_unavailable() -> str | None:
    if not ROOT:
        return "needs root to attach a loop device"
    if not all(shutil.which(t) for t in ("losetup", "mkfs.ext4", "mount", "umount")):
        return "needs losetup, mkfs.ext4, mount"
    return None


def test_a_journal_survives_the_same_disk_attached_under_another_device_number(converted, tmp_path):
    """Issue 25 #2, for real: an ext4 disk image, fix-keys killed after its commit, the disk
    unmounted and attached again as another loop device (another st_dev, as after a reboot or a
    re-plugged disk). The next command finishes the conversion instead of refusing the journal."""
    why = _remount_unavailable()
    if why:
        pytest.skip(why)
    src, _, new = converted
    image, mnt = tmp_path / "disk.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    loops = [_loop(image)]
    mounted = False
    try:
        subprocess.run(["mount", loops[0], str(mnt)], check=True)
        mounted = True
        work = mnt / "ck"
        shutil.copytree(src, work)
        _stalled_after_commit(work)
        dev_before = os.stat(work).st_dev
        subprocess.run(["umount", str(mnt)], check=True)
        mounted = False
        loops.append(_loop(image))  # the first is still attached: the disk comes back as another device
        subprocess.run(["mount", loops[1], str(mnt)], check=True)
        mounted = True
        assert os.stat(work).st_dev != dev_before
        r = cli(["inspect", work, "--json"], plain_user=False)
        no_traceback(r)
        assert r.returncode == 0, r.stdout
        assert json.loads(r.stdout)["recovered"].startswith("completed an interrupted fix-keys"), r.stdout
        assert snapshot(work) == new
    finally:
        if mounted:
            subprocess.run(["umount", str(mnt)], check=False)
        for dev in loops:
            subprocess.run(["losetup", "-d", dev], check=False)


def test_a_journal_survives_its_folder_moving_to_another_file_system(converted, tmp_path):
    """Issue 25 #2, where no disk can be remounted: the interrupted folder copied, times kept, to
    another file system (a new device and inode, as a restore from a backup gives): the journal's
    folder identity is the files it replaces, so the copy is finished there."""
    src, _, new = converted
    work = tmp_path / "ck"
    shutil.copytree(src, work)
    _stalled_after_commit(work)
    shm = Path("/dev/shm")
    other = Path(tempfile.mkdtemp(dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else tmp_path)) / "ck"
    try:
        shutil.copytree(work, other, symlinks=True)  # copy2: modification times kept
        assert (os.stat(other).st_dev, os.stat(other).st_ino) != (os.stat(work).st_dev, os.stat(work).st_ino)
        r = cli(["inspect", other, "--json"], plain_user=False)
        no_traceback(r)
        assert r.returncode == 0, r.stdout
        assert snapshot(other) == new
    finally:
        shutil.rmtree(other.parent, ignore_errors=True)


def test_a_journal_for_other_files_of_the_same_names_is_refused_without_accusing_anyone(converted, tmp_path):
    """The identity still tells folders apart: the interrupted folder's journal and staging carried
    into another checkpoint of the same names (another epoch) are refused, touching nothing, and
    the message says what differs rather than who wrote it."""
    src, _, _ = converted
    work = tmp_path / "ck"
    shutil.copytree(src, work)
    _stalled_after_commit(work)
    other = write_example(tmp_path / "epoch2", "modelopt-export", DIMS)
    os.utime(other / "model.safetensors", ns=(1, 1))  # written at another time
    shutil.copytree(work / STAGING, other / STAGING)
    shutil.copy(work / JOURNAL, other / JOURNAL)
    before = snapshot(other)
    r = cli(["inspect", other, "--json"], plain_user=False)
    no_traceback(r)
    doc = json.loads(r.stdout)
    assert r.returncode == 3 and "written for other files" in doc["message"], doc
    assert "another user" not in doc["message"] and "another machine" not in doc["message"]
    assert snapshot(other) == before


# --------------------------------------------------------------------------- 8. a closed stdout

@pytest.mark.parametrize("entry", ["module", "launcher"])
@pytest.mark.parametrize("json_flag", [True, False])
def test_a_closed_stdout_is_named_and_exits_1(converted, tmp_path, entry, json_flag):
    """Issue 25 #8: `>&-` (the shell closes stdout: Python then has no sys.stdout). The command runs,
    then says that stdout is closed, exit 1, no traceback, nothing written into another file."""
    src, _, _ = converted
    out = tmp_path / "out"
    start = [sys.executable, *(["-m", "eagle3conv"] if entry == "module" else [str(REPO / "bin" / "eagle3conv")])]
    for args in (["inspect", str(src)], ["fix-keys", str(src), "--out", str(out)]):
        line = shlex.join([*start, *args, *(["--json"] if json_flag else [])]) + " >&-"
        r = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=180)
        assert r.returncode == 1, (args, r.returncode, r.stderr)
        assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
        assert "Exception ignored" not in r.stderr, r.stderr
        assert "cannot write the output to stdout: stdout is closed" in r.stderr, r.stderr
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
