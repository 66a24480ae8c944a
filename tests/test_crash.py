"""fix-keys survives SIGKILL at every step: the folder holds the old checkpoint,
the new one, or a state the next run completes or rolls back by itself."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3conv.errors import WriteError
from eagle3conv.example import Dims, write_example

DIMS = Dims(hidden=32, target_hidden=32, heads=4, kv_heads=2, head_dim=8, intermediate=64, vocab=1024, draft_vocab=128)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones too) → sha256."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def run_cli(args, env_extra=None, timeout=120):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "eagle3conv", *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    base = tmp_path_factory.mktemp("ref")
    src = write_example(base / "src", "sglang-fused", DIMS)
    old = snapshot(src)
    fixed = base / "fixed"
    shutil.copytree(src, fixed)
    r = run_cli(["fix-keys", str(fixed)])
    assert r.returncode == 0, r.stderr
    new = snapshot(fixed)
    assert old != new
    return src, old, new


def _count_steps(src: Path, tmp: Path, chunk: str) -> int:
    probe = tmp / "probe"
    shutil.copytree(src, probe)
    code = (
        "import sys; from eagle3conv.checkpoint import writer; from eagle3conv.api import fix_keys;"
        f"fix_keys({str(probe)!r}); print(writer.steps_taken())"
    )
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, EAGLE3CONV_CHUNK_BYTES=chunk),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip())


@pytest.mark.slow
def test_in_place_sigkill_at_every_step(reference, tmp_path):
    src, old, new = reference
    chunk = "16384"  # small chunks: many kill points inside tensor copies
    total = _count_steps(src, tmp_path, chunk)
    assert total > 20
    seen = {"old": 0, "new": 0, "pending": 0, "rolled back": 0, "rolled forward": 0}
    for step in range(1, total + 1):
        work = tmp_path / f"k{step}"
        shutil.copytree(src, work)
        r = run_cli(["fix-keys", str(work)], {"EAGLE3CONV_KILL_AT_STEP": str(step), "EAGLE3CONV_CHUNK_BYTES": chunk})
        assert r.returncode == -signal.SIGKILL, (step, r.returncode, r.stderr)
        state = snapshot(work)
        if state == old:
            seen["old"] += 1
        elif state == new:
            seen["new"] += 1
        else:
            # a torn state must be one the next run finishes: a journal or a staging folder
            assert any(k.startswith((".eagle3conv-journal", ".eagle3conv-staging", ".eagle3conv-backup")) for k in state), (step, sorted(state))
            seen["pending"] += 1
        # the next command (here a read-only inspect) completes or rolls back by itself
        r2 = run_cli(["inspect", str(work), "--json"])
        assert r2.returncode == 0, r2.stderr
        after = snapshot(work)
        assert after in (old, new), (step, sorted(after))
        if state not in (old, new):
            seen["rolled back" if after == old else "rolled forward"] += 1
        # and fix-keys from there always ends at the same new checkpoint
        r3 = run_cli(["fix-keys", str(work)])
        assert r3.returncode == 0, r3.stderr
        assert snapshot(work) == new
        shutil.rmtree(work)
    # the kill points covered every phase: before the commit point (rolled back),
    # after it (rolled forward), and the clean-up after the swap
    assert seen["rolled back"] > 0 and seen["rolled forward"] > 0 and seen["new"] > 0, seen


@pytest.mark.slow
def test_out_sigkill_leaves_no_partial_output(reference, tmp_path):
    src, old, new = reference
    chunk = "16384"
    for step in range(1, 40, 3):
        dest = tmp_path / f"out{step}"
        r = run_cli(["fix-keys", str(src), "--out", str(dest)], {"EAGLE3CONV_KILL_AT_STEP": str(step), "EAGLE3CONV_CHUNK_BYTES": chunk})
        assert snapshot(src) == old
        if r.returncode == 0:
            assert snapshot(dest) == {k: v for k, v in new.items()}
            continue
        assert r.returncode == -signal.SIGKILL
        assert not dest.exists() or snapshot(dest) == new, step
        # a later run cleans the dead run's hidden staging folder and succeeds
        r2 = run_cli(["fix-keys", str(src), "--out", str(dest)])
        if not dest.exists() or not any(dest.iterdir()):
            assert r2.returncode == 0, r2.stderr
        assert snapshot(dest) == new
        assert not list(tmp_path.glob(f".out{step}.eagle3conv-tmp-*"))


@pytest.mark.slow
def test_in_place_random_time_kills(tmp_path):
    """Real SIGKILLs at random instants of a larger in-place run."""
    dims = Dims(hidden=256, target_hidden=256, heads=8, kv_heads=2, head_dim=32, intermediate=1024, vocab=4096, draft_vocab=1024)
    src = write_example(tmp_path / "src", "modelopt-export", dims)
    old = snapshot(src)
    ref = tmp_path / "ref"
    shutil.copytree(src, ref)
    assert run_cli(["fix-keys", str(ref)]).returncode == 0
    new = snapshot(ref)
    rng = random.Random(1234)
    env = dict(os.environ, EAGLE3CONV_CHUNK_BYTES="65536")
    for i in range(6):
        work = tmp_path / f"w{i}"
        shutil.copytree(src, work)
        p = subprocess.Popen([sys.executable, "-m", "eagle3conv", "fix-keys", str(work)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.2, 1.5))
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert run_cli(["inspect", str(work)]).returncode == 0
        assert snapshot(work) in (old, new)
        assert run_cli(["fix-keys", str(work)]).returncode == 0
        assert snapshot(work) == new


def test_corrupted_write_is_caught_and_nothing_committed(tmp_path, monkeypatch):
    """The proof re-reads the output: a write that went wrong is refused before the commit."""
    src = write_example(tmp_path / "src", "modelopt-export", DIMS)
    old = snapshot(src)
    real = os.copy_file_range
    calls = {"n": 0}

    def corrupting(src_fd, dst_fd, count, offset_src=None, offset_dst=None, *a, **k):
        """A copy that lands one flipped byte in the output (a kernel, disk or offset bug)."""
        done = real(src_fd, dst_fd, count, offset_src, offset_dst, *a, **k)
        calls["n"] += 1
        if calls["n"] == 1 and done:
            b = os.pread(src_fd, 1, offset_src)
            os.pwrite(dst_fd, bytes([b[0] ^ 0xFF]), offset_dst)
        return done

    monkeypatch.setattr(os, "copy_file_range", corrupting)
    from eagle3conv.api import fix_keys

    with pytest.raises(WriteError) as e:
        fix_keys(src, out=tmp_path / "out")
    assert "differ" in " ".join(e.value.details)
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.eagle3conv-tmp-*"))
    calls["n"] = 0
    with pytest.raises(WriteError):
        fix_keys(src)
    assert snapshot(src) == old


def test_in_place_is_idempotent_and_byte_stable(reference, tmp_path):
    src, old, new = reference
    work = tmp_path / "w"
    shutil.copytree(src, work)
    assert run_cli(["fix-keys", str(work)]).returncode == 0
    stats = {p.name: p.stat().st_mtime_ns for p in work.iterdir()}
    r = run_cli(["fix-keys", str(work)])
    assert r.returncode == 0
    assert "already SGLang-ready" in r.stdout
    assert snapshot(work) == new
    assert {p.name: p.stat().st_mtime_ns for p in work.iterdir()} == stats


@pytest.mark.slow
def test_config_survives_sigkill(tmp_path):
    """`config` replaces config.json by rename, before writing training_metadata.json:
    killed at any time, config.json is the old or the new one (never half), and a rerun
    gives exactly the clean result."""
    import json

    src = write_example(tmp_path / "src", "sglang", DIMS)
    args = ["--trained-on", "2,15,27", "--captured-at", "input"]
    clean = tmp_path / "clean"
    shutil.copytree(src, clean)
    t0 = time.perf_counter()
    r = run_cli(["config", str(clean), *args])
    duration = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr
    old_cfg, new_cfg = (src / "config.json").read_bytes(), (clean / "config.json").read_bytes()
    assert old_cfg != new_cfg
    # the one write step: killed after the temp file is complete, before the rename
    work = tmp_path / "step"
    shutil.copytree(src, work)
    r = run_cli(["config", str(work), *args], {"EAGLE3CONV_KILL_AT_STEP": "1"})
    assert r.returncode == -signal.SIGKILL
    assert (work / "config.json").read_bytes() == old_cfg and not (work / "training_metadata.json").exists()
    rng = random.Random(0)
    for i in range(8):
        work = tmp_path / f"k{i}"
        shutil.copytree(src, work)
        env = dict(os.environ)
        p = subprocess.Popen([sys.executable, "-m", "eagle3conv", "config", str(work), *args], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.3, 1.0) * duration)
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert (work / "config.json").read_bytes() in (old_cfg, new_cfg)
        json.loads((work / "config.json").read_text())
        r = run_cli(["config", str(work), *args])
        assert r.returncode == 0, r.stderr
        assert snapshot(work) == snapshot(clean)
