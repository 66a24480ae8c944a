"""Two commands on one folder, crafted journals, read-only folders, modes and Ctrl-C.

Real processes throughout: the races are made deterministic with the
``EAGLE3CONV_STALL_AT=POINT:SECONDS`` hook (a command sleeps at a named point)
and ``EAGLE3CONV_LOCK_WAIT`` (how long a command waits for another one)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3conv.example import Dims, write_example

DIMS = Dims(hidden=32, target_hidden=32, heads=4, kv_heads=2, head_dim=8, intermediate=64, vocab=1024, draft_vocab=128)
WIRING = ["--trained-on", "2,15,27", "--captured-at", "input"]
JOURNAL = ".eagle3conv-journal.json"
STAGING = ".eagle3conv-staging"



def _default_sigint() -> None:
    """In the child: SIGINT as a terminal delivers it (a background shell job inherits it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)

def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones too) → sha256."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
        elif p.is_symlink():
            out[str(p.relative_to(folder))] = "-> " + os.readlink(p)
    return out


def env_with(**extra) -> dict:
    return dict(os.environ, **{k: str(v) for k, v in extra.items()})


def run_cli(args, timeout=120, **extra):
    return subprocess.run([sys.executable, "-m", "eagle3conv", *args], env=env_with(**extra),
                          capture_output=True, text=True, timeout=timeout)


def start_cli(args, **extra):
    return subprocess.Popen([sys.executable, "-m", "eagle3conv", *args], env=env_with(**extra),
                            preexec_fn=_default_sigint,  # a Ctrl-C the test sends is not one a shell's `&` ignored
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(cond, timeout=60.0):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out waiting"
        time.sleep(0.02)


def one_json(stdout: str) -> dict:
    return json.loads(stdout)  # exactly one document, or this raises


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    """A trainer-named checkpoint (``old``) and what in-place fix-keys makes of it (``new``)."""
    base = tmp_path_factory.mktemp("ref")
    src = write_example(base / "src", "sglang-fused", DIMS)
    fixed = base / "fixed"
    shutil.copytree(src, fixed)
    r = run_cli(["fix-keys", str(fixed)])
    assert r.returncode == 0, r.stderr
    return src, snapshot(src), snapshot(fixed)


@pytest.fixture
def work(ref, tmp_path):
    src, _, _ = ref
    w = tmp_path / "ckpt"
    shutil.copytree(src, w)
    return w


# --------------------------------------------------------------------------- crafted journals


def _v2(install, replace):
    return {"version": 2, "writer": "eagle3conv fix-keys", "install": install, "replace": replace}


def _craft(kind: str, root: Path, victim: Path):
    """Write a crafted journal (and whatever else the attack needs) into ``root``."""
    j = root / JOURNAL
    rel = os.path.relpath(victim, root)
    staged_cfg = {"name": "config.json", "size": 2, "sha256": hashlib.sha256(b"{}").hexdigest()}
    if kind == "dotdot-v1":  # the report's reproducer, as the old writer wrote journals
        j.write_text(json.dumps({"version": 1, "install": [], "replace": [rel]}))
    elif kind == "dotdot-replace":
        (root / STAGING).mkdir()
        (root / STAGING / "config.json").write_text("{}")
        j.write_text(json.dumps(_v2([staged_cfg], [rel])))
    elif kind == "dotdot-install":
        (root / STAGING).mkdir()
        (root / STAGING / "config.json").write_text("{}")
        j.write_text(json.dumps(_v2([staged_cfg, {"name": rel, "size": 2, "sha256": "0" * 64}], ["config.json"])))
    elif kind == "absolute":
        j.write_text(json.dumps(_v2([staged_cfg], [str(victim)])))
    elif kind == "symlink-replace":
        (root / "weights.safetensors").symlink_to(victim)
        j.write_text(json.dumps(_v2([staged_cfg], ["weights.safetensors"])))
    elif kind == "symlink-staging":
        (root / STAGING).symlink_to(victim.parent)
        j.write_text(json.dumps(_v2([{"name": "model.safetensors", "size": 1, "sha256": "0" * 64}, staged_cfg],
                                    ["model.safetensors"])))
    elif kind == "own-weights":  # deletes the folder's own weights, installs nothing
        j.write_text(json.dumps(_v2([], ["model.safetensors", "config.json"])))
    elif kind == "own-weights-unstaged":  # claims new files that are not there
        j.write_text(json.dumps(_v2([{"name": "model.safetensors", "size": 5, "sha256": "0" * 64}, staged_cfg],
                                    ["model.safetensors", "config.json"])))
    elif kind == "malformed":
        j.write_text("{not json")
    elif kind == "wrong-types":
        j.write_text(json.dumps({"version": 2, "writer": "eagle3conv fix-keys", "install": "model.safetensors",
                                 "replace": 3}))
    elif kind == "not-an-object":
        j.write_text("[]")
    else:
        raise AssertionError(kind)


CRAFTED = ["dotdot-v1", "dotdot-replace", "dotdot-install", "absolute", "symlink-replace", "symlink-staging",
           "own-weights", "own-weights-unstaged", "malformed", "wrong-types", "not-an-object"]


@pytest.mark.parametrize("kind", CRAFTED)
def test_crafted_journal_touches_nothing_and_says_so(work, tmp_path, kind):
    victim = tmp_path / "outside" / "victim.txt"
    victim.parent.mkdir()
    victim.write_text("precious")
    (victim.parent / "config.json").write_text("outside config")
    _craft(kind, work, victim)
    before = snapshot(tmp_path)
    for args in (["inspect", str(work), "--json"], ["fix-keys", str(work), "--json"],
                 ["config", str(work), "--check", "--json"], ["fix-keys", str(work), "--dry-run", "--json"]):
        r = run_cli(args)
        assert r.returncode == 3, (args, r.returncode, r.stdout, r.stderr)
        d = one_json(r.stdout)
        assert d["error"] == "JournalError", d
        assert JOURNAL in d["message"] and "nothing was touched" in d["message"], d
        assert f"rm -r {work / JOURNAL}" in d["hint"], d  # says how to get unstuck
        assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
        assert snapshot(tmp_path) == before, args
    assert victim.read_text() == "precious"
    # the way out the message gives works: remove the journal, and the folder is usable again
    (work / JOURNAL).unlink()
    if (work / "weights.safetensors").is_symlink():
        (work / "weights.safetensors").unlink()  # the crafted link, not part of the checkpoint
    r = run_cli(["inspect", str(work), "--json"])
    assert r.returncode == 0, r.stderr


def test_valid_journal_still_rolls_forward(ref, work):
    """A journal the writer wrote (killed just after the commit point) is finished by inspect."""
    _, old, new = ref
    p = start_cli(["fix-keys", str(work)], EAGLE3CONV_STALL_AT="after-commit:60")
    wait_for(lambda: (work / JOURNAL).exists() or p.poll() is not None)
    p.kill()
    p.wait()
    assert (work / JOURNAL).exists()
    r = run_cli(["inspect", str(work), "--json"])
    assert r.returncode == 0, r.stderr
    assert "completed an interrupted fix-keys" in one_json(r.stdout)["recovered"]
    assert snapshot(work) == new


# --------------------------------------------------------------------------- races


def _busy(r, pid: int, verb: str = "writing"):
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert f"another eagle3conv (pid {pid}, fix-keys) is {verb}" in r.stderr, r.stderr
    assert "internal error" not in r.stderr


@pytest.mark.parametrize("other", [
    ["inspect"], ["inspect", "--json"], ["config", "--check"], ["push", "--dry-run", "--repo-id", "a/b"],
    ["fix-keys"], ["fix-keys", "--dry-run"], ["config", *WIRING],
])
def test_command_beside_a_stalled_in_place_fix_keys_refuses_clearly(ref, work, other):
    """A second command while fix-keys stages the folder never deletes its staging folder:
    it waits, then refuses naming the writer; fix-keys then commits the real conversion."""
    _, old, new = ref
    release = work.parent / "release"
    w = start_cli(["fix-keys", str(work)], EAGLE3CONV_STALL_AT=f"before-journal:@{release}")
    try:
        wait_for(lambda: (work / STAGING / "config.json").exists() or w.poll() is not None)
        assert w.poll() is None
        args = [other[0], str(work), *other[1:]]
        r = run_cli(args, EAGLE3CONV_LOCK_WAIT="0.5")
        assert w.poll() is None  # the writer was live (stalled) during the whole second command
        _busy(r, w.pid)
        if "--json" in other:
            assert one_json(r.stdout)["error"] == "FolderBusyError"
    finally:
        release.touch()
    out, err = w.communicate(timeout=120)
    assert w.returncode == 0, err
    assert snapshot(work) == new  # converted, not silently left trainer-named


def test_reader_waits_for_a_writer_and_sees_the_new_checkpoint(ref, work):
    _, old, new = ref
    w = start_cli(["fix-keys", str(work)], EAGLE3CONV_STALL_AT="before-journal:2")
    wait_for(lambda: (work / STAGING / "config.json").exists() or w.poll() is not None)
    r = run_cli(["inspect", str(work), "--json"], EAGLE3CONV_LOCK_WAIT="60")
    assert r.returncode == 0, r.stderr
    assert w.wait(timeout=120) == 0
    d = one_json(r.stdout)
    assert snapshot(work) == new
    assert "fc.weight" in {t["name"] for t in d["tensors"]}  # it read the converted folder


def test_config_during_fix_keys_is_not_lost(tmp_path):
    """config run while an in-place fix-keys (re-sharding) stages the folder: config waits
    for it and edits the committed folder, so its edit survives."""
    src = write_example(tmp_path / "src", "sglang", DIMS)
    w = start_cli(["fix-keys", str(src), "--max-shard-size", "20KB"], EAGLE3CONV_STALL_AT="before-journal:3")
    wait_for(lambda: (src / STAGING / "config.json").exists() or w.poll() is not None)
    assert w.poll() is None
    r = run_cli(["config", str(src), *WIRING], EAGLE3CONV_LOCK_WAIT="60")
    assert w.wait(timeout=120) == 0
    assert r.returncode == 0, r.stderr
    cfg = json.loads((src / "config.json").read_text())
    assert cfg.get("eagle_aux_hidden_state_layer_ids") == [2, 15, 27], cfg
    assert "eagle3conv" in cfg
    meta = json.loads((src / "training_metadata.json").read_text())
    assert "1, 14, 26" in json.dumps(meta) or meta  # written from the same record
    assert (src / "model.safetensors.index.json").exists()  # and the re-shard happened too
    assert run_cli(["config", str(src), "--check"]).returncode == 0


def test_two_out_runs_to_one_folder(ref, tmp_path):
    src, old, new = ref
    dest = tmp_path / "dest"
    release = tmp_path / "release"
    a = start_cli(["fix-keys", str(src), "--out", str(dest)], EAGLE3CONV_STALL_AT=f"out-before-rename:@{release}")
    try:
        wait_for(lambda: any(tmp_path.glob(".dest.eagle3conv-tmp-*/config.json")) or a.poll() is not None)
        assert a.poll() is None
        r = run_cli(["fix-keys", str(src), "--out", str(dest), "--json"])
        assert r.returncode == 1, (r.stdout, r.stderr)
        d = one_json(r.stdout)
        assert d["error"] == "FolderBusyError" and f"pid {a.pid}" in d["message"], d
    finally:
        release.touch()
    assert a.wait(timeout=120) == 0
    r = run_cli(["fix-keys", str(src), "--out", str(dest)])
    assert r.returncode == 2 and "already exists" in r.stderr, r.stderr
    assert "ENOTEMPTY" not in r.stderr and "internal error" not in r.stderr
    assert snapshot(dest) == {k: v for k, v in new.items() if not k.startswith(".")}
    assert snapshot(src) == old
    assert not list(tmp_path.glob(".dest.eagle3conv-tmp-*"))


# --------------------------------------------------------------------------- after the commit point


@pytest.mark.parametrize("args", [["verify"], ["config", "--check"], ["fix-keys", "--dry-run"], ["inspect"]])
def test_read_only_commands_finish_a_committed_conversion(ref, work, args):
    """Killed past the commit point, the folder is finished by the next command, whichever it is."""
    _, old, new = ref
    p = start_cli(["fix-keys", str(work)], EAGLE3CONV_STALL_AT="after-commit:60")
    wait_for(lambda: (work / JOURNAL).exists() or p.poll() is not None)
    p.kill()
    p.wait()
    r = run_cli([args[0], str(work), *args[1:]])
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert snapshot(work) == new


def test_ctrl_c_after_the_commit_tells_the_truth(ref, work):
    _, old, new = ref
    release = work.parent / "release"
    p = start_cli(["fix-keys", str(work)], EAGLE3CONV_STALL_AT=f"after-commit:@{release}")
    wait_for(lambda: (work / JOURNAL).exists() or p.poll() is not None)
    p.send_signal(signal.SIGINT)
    time.sleep(0.5)
    release.touch()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "holds the new checkpoint" in err and "as they were" not in err, err
    assert snapshot(work) == new  # and it is so: committed and finished


def test_ctrl_c_before_the_commit_leaves_the_old_files(ref, work):
    _, old, new = ref
    p = start_cli(["fix-keys", str(work)], EAGLE3CONV_STALL_AT="before-journal:60")
    wait_for(lambda: (work / STAGING / "config.json").exists() or p.poll() is not None)
    time.sleep(1.0)  # well into the stall just before the commit point (the last moment to roll back)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "as they were" in err, err
    assert snapshot(work) == old


# --------------------------------------------------------------------------- temps and modes


def test_stale_temps_are_removed_by_the_next_write_but_live_ones_kept(tmp_path):
    src = write_example(tmp_path / "src", "sglang", DIMS)
    # named as tempfile.mkstemp names them (8 characters of [a-z0-9_]): the only names the cleanup removes
    dead = [src / ".training_metadata.json.k1ll3d00.tmp", src / ".eagle3conv-verify.json.abc123_x.tmp"]
    for d in dead:
        d.write_text("half")
    live = src / ".training_metadata.json.l1v3wr1t.tmp"
    live.write_text("in progress")
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a live writer holds its temp
    try:
        r = run_cli(["config", str(src), *WIRING])
        assert r.returncode == 0, r.stderr
        assert (src / "training_metadata.json").exists()
        assert not dead[0].exists()  # the killed writer's temp of the same file is gone
        assert live.exists()  # a live writer's is not
    finally:
        os.close(fd)
    from eagle3conv.io.files import atomic_write_text

    atomic_write_text(src / "eagle3conv-verify.json", "{}\n")
    assert not dead[1].exists()


def test_in_place_keeps_file_modes(ref, work):
    for p in work.iterdir():
        p.chmod(0o600)
    r = run_cli(["fix-keys", str(work)])
    assert r.returncode == 0, r.stderr
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in work.iterdir()}
    assert modes == {n: 0o600 for n in modes}, modes


def test_config_keeps_the_config_mode(tmp_path):
    src = write_example(tmp_path / "src", "sglang", DIMS)
    (src / "config.json").chmod(0o600)
    assert run_cli(["config", str(src), *WIRING]).returncode == 0
    assert stat.S_IMODE((src / "config.json").stat().st_mode) == 0o600


# --------------------------------------------------------------------------- read-only folders


def _ro_mount_works(tmp: Path) -> str | None:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return "needs root and unshare for a read-only bind mount"
    a, b = tmp / "ro-probe-a", tmp / "ro-probe-b"
    a.mkdir()
    b.mkdir()
    r = subprocess.run(["unshare", "-m", "sh", "-c",
                        f"mount --bind {a} {b} && mount -o remount,ro,bind {b} && ! touch {b}/x 2>/dev/null"],
                       capture_output=True, text=True)
    return None if r.returncode == 0 else f"read-only bind mounts do not work here: {r.stderr.strip()}"


def run_ro(src: Path, mnt: Path, args: list[str], **extra):
    """Run the CLI with ``src`` mounted read-only at ``mnt`` (a private mount namespace)."""
    cmd = " ".join(f"'{a}'" for a in [sys.executable, "-m", "eagle3conv", *args])
    script = f"mount --bind '{src}' '{mnt}' && mount -o remount,ro,bind '{mnt}' && exec {cmd}"
    return subprocess.run(["unshare", "-m", "sh", "-c", script], env=env_with(**extra),
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def ro(tmp_path):
    why = _ro_mount_works(tmp_path)
    if why:
        pytest.skip(why)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    return mnt


@pytest.mark.parametrize("args", [
    ["inspect", "{m}", "--json"], ["fix-keys", "{m}", "--out", "{out}"], ["fix-keys", "{m}", "--dry-run"],
    ["config", "{m}", "--check"], ["verify", "{m}"], ["push", "{m}", "--dry-run", "--repo-id", "a/b"],
])
def test_read_only_source_works_for_every_reading_command(ref, tmp_path, ro, args):
    src = tmp_path / "fixed"
    shutil.copytree(ref[0], src)
    assert run_cli(["fix-keys", str(src)]).returncode == 0  # canonical, so push/verify/config have work to do
    (src / STAGING).mkdir()  # even with a dead writer's staging folder left behind
    (src / STAGING / "model.safetensors").write_bytes(b"partial")
    before = snapshot(src)
    out = tmp_path / "out"
    r = run_ro(src, ro, [a.format(m=ro, out=out) for a in args])
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "internal error" not in r.stderr and "Read-only" not in r.stderr, r.stderr
    assert snapshot(src) == before
    if "--out" in args:
        assert (out / "model.safetensors").exists()


def test_read_only_folder_with_a_committed_journal_says_so(ref, work, ro):
    p = start_cli(["fix-keys", str(work)], EAGLE3CONV_STALL_AT="after-commit:60")
    wait_for(lambda: (work / JOURNAL).exists() or p.poll() is not None)
    p.kill()
    p.wait()
    before = snapshot(work)
    r = run_ro(work, ro, ["inspect", str(ro), "--json"])
    assert r.returncode == 3, (r.stdout, r.stderr)
    d = one_json(r.stdout)
    assert "has an interrupted fix-keys but is read-only" in d["message"], d
    assert f"eagle3conv fix-keys {ro}" in d["hint"], d
    assert snapshot(work) == before


def test_in_place_on_a_read_only_folder_is_a_clear_error(ref, work, ro):
    before = snapshot(work)
    r = run_ro(work, ro, ["fix-keys", str(ro), "--json"])
    assert r.returncode == 1, (r.stdout, r.stderr)
    d = one_json(r.stdout)
    assert "read-only" in d["message"] and "--out" in d["hint"], d
    assert snapshot(work) == before
