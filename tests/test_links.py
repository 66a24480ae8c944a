"""Files of a checkpoint folder that are symlinks: inside the folder (or, for a Hugging Face
cache snapshot, inside its ``models--*`` repo folder) they are read; anywhere else -- or to a
FIFO, or nowhere -- they are refused by name, never a byte of what they point to shown,
unless ``--follow-symlinks`` (fix-keys) asks for them, and then the output says so.

Real files, real links, a real FIFO, the real CLI.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import assert_sglang_checkpoint
from eagle3conv.api import fix_keys, inspect
from eagle3conv.checkpoint.index import open_checkpoint
from eagle3conv.checkpoint.links import UnsafeLinkError
from eagle3conv.cli import main
from eagle3conv.errors import EXIT_ERROR

SECRET = "hf_LINKEDsecret_0123456789abcdefXYZ"


@pytest.fixture
def secret(tmp_path) -> Path:
    """A stored token outside every checkpoint folder, as `hf auth login` leaves it."""
    p = tmp_path / "home" / ".cache" / "huggingface" / "token"
    p.parent.mkdir(parents=True)
    p.write_text(SECRET)
    return p


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def no_secret(*texts) -> None:
    for t in texts:
        assert SECRET not in (t or "") and SECRET[:12] not in (t or "")


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if "eagle3conv-tmp" in p.name)


# --- companions: fix-keys --out copies them --------------------------------------------------


@pytest.mark.parametrize("name", ["tokenizer.json", "README.md", "chat_template.jinja"])
def test_fix_keys_out_refuses_a_companion_linking_to_a_secret(make_ckpt, secret, tmp_path, name):
    ck = make_ckpt("modelopt-export")
    (ck / name).symlink_to(secret)
    out = tmp_path / "out"
    with pytest.raises(UnsafeLinkError) as e:
        fix_keys(ck, out=out)
    err = e.value
    assert err.exit_code == EXIT_ERROR
    assert str(ck / name) in err.message and str(secret) in err.message and "outside the checkpoint" in err.message
    assert "--follow-symlinks" in err.hint
    no_secret(err.message, err.hint, *err.details)
    assert not out.exists() and not leftovers(tmp_path)  # nothing was written

    res = cli("fix-keys", ck, "--out", out, "--json")
    assert res.exit_code == EXIT_ERROR, res.output
    doc = json.loads(res.stdout)  # exactly one JSON document
    assert doc["error"] == "UnsafeLinkError" and name in doc["message"]
    assert "Traceback" not in res.output
    no_secret(res.stdout, res.stderr)
    assert not out.exists()


def test_fix_keys_follow_symlinks_copies_the_target_and_says_so(make_ckpt, tmp_path):
    ck = make_ckpt("modelopt-export")
    shared = tmp_path / "shared" / "tokenizer.json"
    shared.parent.mkdir()
    shared.write_text('{"model": {"type": "BPE"}}')
    (ck / "tokenizer.json").symlink_to(shared)
    out = tmp_path / "out"
    res = cli("fix-keys", ck, "--out", out, "--follow-symlinks")
    assert res.exit_code == 0, res.output
    assert f"followed symlink {ck / 'tokenizer.json'} -> {shared}" in res.stderr
    assert not (out / "tokenizer.json").is_symlink()
    assert (out / "tokenizer.json").read_bytes() == shared.read_bytes()
    assert_sglang_checkpoint(out)
    r = fix_keys(ck, out=tmp_path / "out2", follow_symlinks=True)
    assert r.followed_symlinks == [(str(ck / "tokenizer.json"), str(shared))]
    assert r.to_dict()["followed_symlinks"] == [{"path": str(ck / "tokenizer.json"), "target": str(shared)}]


# --- files every command reads ---------------------------------------------------------------


def test_weights_link_leaving_the_folder_is_refused_by_inspect_fix_keys_and_verify(make_ckpt, tmp_path):
    ck = make_ckpt("sglang")
    elsewhere = tmp_path / "elsewhere" / "weights.safetensors"
    elsewhere.parent.mkdir()
    shutil.move(ck / "model.safetensors", elsewhere)
    (ck / "model.safetensors").symlink_to(elsewhere)
    for command in (("inspect", ck), ("fix-keys", ck, "--out", tmp_path / "o"), ("verify", ck)):
        res = cli(*command)
        assert res.exit_code == EXIT_ERROR, (command, res.output)
        assert f"{ck / 'model.safetensors'}: a symlink to {elsewhere}" in res.stderr, res.stderr
        assert "Traceback" not in res.output
    assert not (tmp_path / "o").exists()
    # asked for explicitly: read through the link, and said so
    res = cli("fix-keys", ck, "--out", tmp_path / "o", "--follow-symlinks")
    assert res.exit_code == 0, res.output
    assert "followed symlink" in res.stderr and str(elsewhere) in res.stderr
    assert_sglang_checkpoint(tmp_path / "o")


@pytest.mark.parametrize("name", ["config.json", "training_metadata.json", "model.safetensors.index.json"])
def test_metadata_files_linking_outside_are_refused(make_ckpt, secret, name):
    ck = make_ckpt("sglang")
    if name == "model.safetensors.index.json":
        (ck / name).symlink_to(secret)
    else:
        (ck / name).unlink(missing_ok=True)
        (ck / name).symlink_to(secret)
    with pytest.raises(UnsafeLinkError) as e:
        open_checkpoint(ck)
    assert name in e.value.message and str(secret) in e.value.message
    no_secret(e.value.message, e.value.hint)
    res = cli("inspect", ck, "--json")
    assert res.exit_code == EXIT_ERROR and json.loads(res.stdout)["error"] == "UnsafeLinkError"
    no_secret(res.stdout, res.stderr)


def test_dangling_link_and_fifo_are_clear_errors(make_ckpt, tmp_path):
    ck = make_ckpt("modelopt-export")
    (ck / "tokenizer.json").symlink_to(tmp_path / "gone" / "tokenizer.json")
    with pytest.raises(UnsafeLinkError, match=r"tokenizer\.json: a link to .*gone.*dangling"):
        fix_keys(ck, out=tmp_path / "o1")
    (ck / "tokenizer.json").unlink()

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (ck / "tokenizer.json").symlink_to(fifo)
    for follow in (False, True):  # a FIFO is refused even when following links
        with pytest.raises(UnsafeLinkError, match=r"tokenizer\.json: points to .*pipe, a FIFO"):
            fix_keys(ck, out=tmp_path / "o2", follow_symlinks=follow)
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists() and not leftovers(tmp_path)

    # a dangling weights link says so (it used to read as "no weights found")
    (ck / "tokenizer.json").unlink()
    (ck / "model.safetensors").unlink()
    (ck / "model.safetensors").symlink_to(tmp_path / "gone.safetensors")
    res = cli("inspect", ck)
    assert res.exit_code == EXIT_ERROR and "dangling" in res.stderr and "model.safetensors" in res.stderr


def test_links_inside_the_folder_are_fine(make_ckpt, tmp_path):
    ck = make_ckpt("modelopt-export")
    (ck / "assets").mkdir()
    (ck / "assets" / "tok.json").write_text("{}")
    (ck / "tokenizer.json").symlink_to(Path("assets") / "tok.json")
    fix_keys(ck, out=tmp_path / "out")
    assert (tmp_path / "out" / "tokenizer.json").read_text() == "{}"


# --- Hugging Face cache snapshots ------------------------------------------------------------


def _hf_cache(tmp_path: Path, src: Path) -> tuple[Path, Path]:
    repo = tmp_path / "hub" / "models--org--drafter"
    rev = "0123456789abcdef0123456789abcdef01234567"
    snap = repo / "snapshots" / rev
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, name in enumerate(("model.safetensors", "config.json", "tokenizer_config.json")):
        sha = f"{i:064x}"
        (repo / "blobs" / sha).write_bytes((src / name).read_bytes())
        (snap / name).symlink_to(Path("../../blobs") / sha)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    return repo, snap


def test_hf_cache_snapshot_links_into_blobs_work_and_links_out_of_the_repo_do_not(make_ckpt, tmp_path, secret):
    repo, snap = _hf_cache(tmp_path, make_ckpt("modelopt-export"))
    assert inspect(snap).index.root == snap
    fix_keys(repo, out=tmp_path / "out")
    assert_sglang_checkpoint(tmp_path / "out")
    res = cli("inspect", snap)
    assert res.exit_code == 0, res.output
    # a snapshot file pointing out of its models--* folder is refused like any other
    (snap / "tokenizer.json").symlink_to(secret)
    with pytest.raises(UnsafeLinkError, match="outside the checkpoint folder") as e:
        fix_keys(repo, out=tmp_path / "out2")
    assert str(repo) in e.value.message
    no_secret(e.value.message)
