"""Hostile inputs: each class gets a clear error (exit code, message naming the thing), never
"internal error" or a traceback, and with --json exactly one JSON document on stdout."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from conftest import PICO, load_st, save_st, snapshot
from eagle3conv.cli import main
from eagle3conv.example import canonical_tensors

ROOT = Path(__file__).resolve().parents[1]



def _default_sigint() -> None:
    """In the child: SIGINT as a terminal delivers it (a background shell job inherits it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)

def cli(*args, rc: int):
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exit_code == rc, f"exit {res.exit_code}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}\n{res.exception!r}"
    assert "internal error" not in res.output and "Traceback" not in res.output, res.output
    return res


def one_doc(res, rc: int) -> dict:
    d = json.loads(res.stdout)  # exactly one JSON document, nothing else
    assert d["exit_code"] == rc, d
    return d


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _message(d: dict) -> str:
    """The error message of a JSON document (inspect reports a planning error inside its result)."""
    return (d.get("plan_error") or d)["message"]


def _raw_safetensors(path: Path, header_bytes: bytes, data: bytes = b"") -> None:
    header_bytes += b" " * (-len(header_bytes) % 8)
    path.write_bytes(struct.pack("<Q", len(header_bytes)) + header_bytes + data)


def _edit_cfg(ck: Path, fn) -> None:
    cfg = json.loads((ck / "config.json").read_text())
    fn(cfg)
    (ck / "config.json").write_text(json.dumps(cfg))


# --- item 8 / 15: safetensors headers ---------------------------------------------------------

OK_ENTRY = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
HEADERS = {
    "dtype-list": (json.dumps({"a": {**OK_ENTRY, "dtype": ["F32"]}}).encode(), "an unknown dtype"),
    "dtype-dict": (json.dumps({"a": {**OK_ENTRY, "dtype": {"x": 1}}}).encode(), "an unknown dtype"),
    "shape-2^63": (json.dumps({"a": {**OK_ENTRY, "shape": [2**63]}}).encode(), "shape must be a list of integers"),
    "shape-2^64": (json.dumps({"a": {**OK_ENTRY, "shape": [2**64, 2]}}).encode(), "shape must be a list of integers"),
    "metadata-list": (json.dumps({"__metadata__": ["format", "pt"], "a": OK_ENTRY}).encode(), "__metadata__"),
    "nested-100k": (b"[" * 100_000 + b"]" * 100_000, "header is not valid JSON"),
    "nested-100k-object": (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "header is not valid JSON"),
}


@pytest.mark.parametrize("case", sorted(HEADERS))
def test_hostile_safetensors_header(tmp_path, case):
    raw, words = HEADERS[case]
    ck = tmp_path / "ck"
    ck.mkdir()
    _raw_safetensors(ck / "model.safetensors", raw, b"\0" * 8)
    (ck / "config.json").write_text("{}")
    res = cli("inspect", ck, rc=1)
    assert words in res.stderr, res.stderr
    d = one_doc(cli("inspect", ck, "--json", rc=1), 1)
    assert d["error"] == "CheckpointReadError" and words in d["message"]


def test_header_error_does_not_leak_the_files_first_bytes(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"hunter2!" + b"x" * 64)
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "model.safetensors").symlink_to(secret)
    leaked = str(struct.unpack("<Q", b"hunter2!")[0])
    # the link leaves the folder: refused by name, the target never opened
    res = cli("inspect", ck, rc=1)
    assert "symlink" in res.stderr
    assert leaked not in res.output and "hunter2" not in res.output
    assert leaked not in cli("inspect", ck, "--json", rc=1).stdout
    # followed on purpose, the header check runs and still echoes nothing read from the file
    res = cli("fix-keys", ck, "--dry-run", "--follow-symlinks", rc=1)
    assert "not a safetensors file" in res.stderr
    assert leaked not in res.output and "hunter2" not in res.output
    # the same bytes as a regular file inside the folder
    (ck / "model.safetensors").unlink()
    (ck / "model.safetensors").write_bytes(secret.read_bytes())
    res = cli("inspect", ck, rc=1)
    assert "not a safetensors file" in res.stderr
    assert leaked not in res.output and "hunter2" not in res.output
    assert leaked not in cli("inspect", ck, "--json", rc=1).stdout


# --- item 8 / 11 / 16: files that are not regular files -----------------------------------------


def test_dev_null_as_checkpoint():
    res = cli("inspect", "/dev/null", rc=1)
    assert "/dev/null: a character device" in res.stderr
    d = one_doc(cli("fix-keys", "/dev/null", "--json", rc=1), 1)
    assert "character device" in d["message"]


def _limited_memory():  # old behaviour read /dev/zero until memory ran out: keep that bounded here
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def test_dev_zero_as_config_is_refused_unread(make_ckpt):
    ck = make_ckpt("sglang")
    r = subprocess.run([sys.executable, "-m", "eagle3conv", "inspect", str(ck), "--config", "/dev/zero", "--json"],
                       capture_output=True, text=True, timeout=120, env=_env(), preexec_fn=_limited_memory)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    d = json.loads(r.stdout)
    assert "/dev/zero: a character device, not a regular config.json" in _message(d)


@pytest.mark.parametrize("flag", ["--config", "--metadata"])
def test_fifo_as_config_or_metadata_does_not_hang(make_ckpt, tmp_path, flag):
    ck = make_ckpt("sglang")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    try:
        r = subprocess.run([sys.executable, "-m", "eagle3conv", "inspect", str(ck), flag, str(fifo), "--json"],
                           capture_output=True, text=True, timeout=60, env=_env())
    except subprocess.TimeoutExpired:
        pytest.fail(f"inspect {flag} FIFO hung")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert "a FIFO (named pipe)" in _message(json.loads(r.stdout))


def test_oversized_json_refused_before_reading(make_ckpt, monkeypatch):
    import eagle3conv.io.jsonfile as jf

    monkeypatch.setattr(jf, "MAX_JSON_BYTES", 100)
    ck = make_ckpt("sglang")
    res = cli("inspect", ck, rc=1)
    assert "config.json is at most 100 bytes" in res.stderr


# --- item 11: pickles bounded before torch.load -------------------------------------------------


def _recompressed(src: Path, dst: Path, numel: int | None = None) -> None:
    """Copy a torch zip with every record deflated (torch itself stores them). ``numel``: make
    the saved 200-element tensor claim that many elements, with a storage record of that many
    (zero) floats: a few MB on disk that inflate to ``4 * numel`` bytes (the zip bomb)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            extra = 0
            if numel is not None and info.filename.endswith("/data.pkl"):
                assert data.count(b"K\xc8") == 2  # BININT1 200: the storage's numel and the shape
                data = data.replace(b"K\xc8", b"J" + struct.pack("<i", numel))
            if numel is not None and info.filename.endswith("/data/0"):
                extra = 4 * numel - len(data)
            zi = zipfile.ZipInfo(info.filename)
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi._compresslevel = 1
            with zout.open(zi, "w", force_zip64=bool(extra)) as f:
                f.write(data)
                chunk = b"\0" * (16 << 20)
                while extra > 0:
                    f.write(chunk[: min(extra, len(chunk))])
                    extra -= len(chunk)


def test_compressed_pickle_records_refused(tmp_path):
    src = tmp_path / "plain.pt"
    torch.save({"fc.weight": torch.ones(4, 4)}, src)
    ck = tmp_path / "ck"
    ck.mkdir()
    _recompressed(src, ck / "model.pt")
    d = one_doc(cli("inspect", ck, "--json", rc=1), 1)
    assert "is compressed" in d["message"] and "zip bomb" in d["message"]


def test_outsized_pickle_record_refused_with_bounded_memory(tmp_path):
    """A .pt whose pickle record (not its tensor storages) is 24 MB: refused before unpickling,
    in a subprocess whose peak RSS stays under a loose 1 GB."""
    ck = tmp_path / "ck"
    ck.mkdir()
    torch.save({"fc.weight": torch.ones(4, 4), "notes": "x" * (24 << 20)}, ck / "model.pt")
    probe = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run([sys.executable, '-m', 'eagle3conv', 'inspect', sys.argv[1], '--json'],"
        " capture_output=True, text=True)\n"
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "sys.stderr.write(r.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", probe, str(ck)], capture_output=True, text=True, timeout=300,
                       env=_env(), preexec_fn=_limited_memory)
    rc, maxrss_kib = map(int, r.stdout.split())
    assert rc == 1, r.stderr
    assert "pickle record" in r.stderr and "is 2516" in r.stderr and "Traceback" not in r.stderr
    assert maxrss_kib < 1024 * 1024, f"peak RSS {maxrss_kib} KiB"


def test_old_style_pickle_over_the_cap_refused(tmp_path, monkeypatch):
    import eagle3conv.io.pickle as pickle_io

    monkeypatch.setattr(pickle_io, "MAX_LEGACY_PICKLE", 1000)
    ck = tmp_path / "ck"
    ck.mkdir()
    torch.save({"fc.weight": torch.ones(64, 64)}, ck / "model.pt", _use_new_zipfile_serialization=False)
    d = one_doc(cli("inspect", ck, "--json", rc=1), 1)
    assert "old-style (non-zip) torch pickle" in d["message"]


# --- item 9: config fields engines read --------------------------------------------------------

BAD_CONFIGS = {
    "hidden_size-missing": (lambda c: c.pop("hidden_size"), "hidden_size is missing"),
    "hidden_size-null": (lambda c: c.update(hidden_size=None), "hidden_size is missing"),
    "hidden_size-string": (lambda c: c.update(hidden_size="32"), "hidden_size is '32'; expected an integer from 1"),
    "hidden_size-float": (lambda c: c.update(hidden_size=32.5), "hidden_size is 32.5; expected an integer from 1"),
    "intermediate_size-missing": (lambda c: c.pop("intermediate_size"), "intermediate_size is missing"),
    "num_attention_heads-missing": (lambda c: c.pop("num_attention_heads"), "num_attention_heads is missing"),
    "head_dim-0": (lambda c: c.update(head_dim=0), "head_dim is 0; expected an integer from 1"),
    "rope_theta-nan": (lambda c: c.update(rope_theta=float("nan")), "rope_theta is nan; expected a finite number"),
    "rms_norm_eps-string": (lambda c: c.update(rms_norm_eps="1e-5"), "rms_norm_eps is '1e-5'"),
    "tie_word_embeddings-string": (lambda c: c.update(tie_word_embeddings="false"), "tie_word_embeddings is 'false'"),
    "kv-heads-not-dividing": (lambda c: c.update(num_key_value_heads=3), "not a multiple of num_key_value_heads 3"),
    "nan-in-an-unknown-field": (lambda c: c.update(some_extra={"x": float("inf")}), "some_extra.x is inf"),
    "rope_scaling-factor": (lambda c: c.update(rope_scaling={"rope_type": "linear", "factor": -2}),
                            "rope_scaling.factor is -2"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_fix_keys_refuses_configs_no_engine_loads(make_ckpt, tmp_path, case):
    mutate, words = BAD_CONFIGS[case]
    ck = make_ckpt("modelopt-export")
    _edit_cfg(ck, mutate)
    before = snapshot(ck)
    out = tmp_path / "out"
    d = one_doc(cli("fix-keys", ck, "--out", out, "--json", rc=3), 3)
    assert d["error"] == "InvalidCheckpointError"
    assert any(words in x for x in [d["message"], *d["details"]]), d
    assert not out.exists() and snapshot(ck) == before


@pytest.mark.parametrize("command", ["inspect", "config", "verify", "push"])
def test_every_command_refuses_a_bad_config_with_exit_3(make_ckpt, command):
    ck = make_ckpt("sglang")
    _edit_cfg(ck, lambda c: c.update(hidden_size="32"))
    args = {"inspect": ["inspect", ck], "config": ["config", ck, "--check"], "verify": ["verify", ck],
            "push": ["push", ck, "--repo-id", "me/d", "--dry-run"]}[command]
    res = cli(*args, "--json", rc=3)
    assert "hidden_size is '32'" in res.stdout + res.stderr
    json.loads(res.stdout)


# --- item 10: one embedding rule -----------------------------------------------------------------

WIDE = {"target_hidden": 64}  # the target is wider than the drafter (hidden 32)


def test_wider_target_without_embedding_refused_everywhere(make_ckpt, tmp_path):
    ck = make_ckpt("sglang", **WIDE)
    t = load_st(ck / "model.safetensors")
    del t["embed_tokens.weight"]
    save_st(t, ck / "model.safetensors")
    d = one_doc(cli("fix-keys", ck, "--out", tmp_path / "o", "--json", rc=3), 3)
    assert any("embed_tokens.weight: required but missing" in x for x in d["details"])
    assert not (tmp_path / "o").exists()
    cli("inspect", ck, rc=3)
    res = cli("push", ck, "--repo-id", "me/d", "--dry-run", rc=3)
    assert "embed_tokens.weight: required but missing" in res.stderr


def test_wider_target_keeps_the_drafters_embedding(make_ckpt, tmp_path):
    import dataclasses

    ck = make_ckpt("modelopt-export", **WIDE)
    t = load_st(ck / "model.safetensors")
    t["embed_tokens.weight"] = canonical_tensors(dataclasses.replace(PICO, **WIDE))["embed_tokens.weight"]
    save_st(t, ck / "model.safetensors")
    out = tmp_path / "o"
    res = cli("fix-keys", ck, "--out", out, rc=0)
    assert "embed_tokens.weight kept: target_hidden_size 64 differs from hidden_size 32" in res.stdout
    assert torch.equal(load_st(out / "model.safetensors")["embed_tokens.weight"], t["embed_tokens.weight"])
    cli("push", out, "--repo-id", "me/d", "--dry-run", rc=0)  # the gate agrees: nothing left to change
    # the same drafter with a target of its own width still has its (stale) copy dropped
    same = make_ckpt("modelopt-export")
    t = load_st(same / "model.safetensors")
    t["embed_tokens.weight"] = canonical_tensors(PICO)["embed_tokens.weight"]
    save_st(t, same / "model.safetensors")
    cli("fix-keys", same, "--out", tmp_path / "o2", rc=0)
    assert "embed_tokens.weight" not in load_st(tmp_path / "o2" / "model.safetensors")


# --- item 8: the file system says no -------------------------------------------------------------


@pytest.fixture
def mounted(tmp_path):
    """``mounted(opts)`` -> a fresh tmpfs mounted with ``opts`` (root only; skipped elsewhere)."""
    points = []

    def mount(opts: str) -> Path:
        p = tmp_path / f"mnt{len(points)}"
        p.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(p)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        points.append(p)
        return p

    yield mount
    for p in points:
        subprocess.run(["umount", "-l", str(p)], capture_output=True)


@pytest.mark.parametrize("case", ["ENOSPC", "EROFS"])
def test_filesystem_refusals_are_clear(make_ckpt, mounted, case):
    ck = make_ckpt("modelopt-export", vocab=65536, draft_vocab=8192)  # a 512 KiB lm_head
    where = mounted("size=256k" if case == "ENOSPC" else "ro,size=1m")
    before = snapshot(ck)
    d = one_doc(cli("fix-keys", ck, "--out", where / "out", "--json", rc=1), 1)
    assert d["error"] == "FileSystemError"
    words = "No space left on device" if case == "ENOSPC" else "Read-only file system"
    assert words in d["message"] and str(where) in d["message"], d
    assert snapshot(ck) == before


def test_out_under_a_regular_file(make_ckpt, tmp_path):
    ck = make_ckpt("modelopt-export")
    (tmp_path / "afile").write_text("x")
    d = one_doc(cli("fix-keys", ck, "--out", tmp_path / "afile" / "sub", "--json", rc=1), 1)
    assert f"{tmp_path / 'afile'} is a file, not a folder" in d["message"]
    assert (tmp_path / "afile").read_text() == "x"


def test_out_under_proc(make_ckpt):
    ck = make_ckpt("modelopt-export")
    d = one_doc(cli("fix-keys", ck, "--out", "/proc/eagle3conv-x/y", "--json", rc=1), 1)
    assert d["error"] == "FileSystemError" and "/proc/" in d["message"]


# --- items 8 / 17: --json and --debug in either position; internal errors in JSON ----------------


def test_json_before_the_command(make_ckpt, tmp_path):
    ck = make_ckpt("sglang")
    d = json.loads(cli("--json", "inspect", ck, rc=0).stdout)
    assert d["layout"] == "safetensors"
    d = one_doc(cli("--json", "inspect", tmp_path / "nope", rc=1), 1)
    assert d["error"] == "CheckpointReadError"
    res = CliRunner().invoke(main, ["--debug", "inspect", str(tmp_path / "nope")])
    assert res.exit_code == 1 and "Traceback (most recent call last)" in res.stderr


def test_internal_error_with_json_still_prints_one_document(make_ckpt, monkeypatch):
    import eagle3conv.api

    def broken(*a, **k):
        raise ZeroDivisionError("injected")

    monkeypatch.setattr(eagle3conv.api, "inspect", broken)
    res = CliRunner().invoke(main, ["inspect", str(make_ckpt("sglang")), "--json"])
    assert res.exit_code == 1
    d = json.loads(res.stdout)
    assert "internal error (ZeroDivisionError: injected)" in d["message"] and d["exit_code"] == 1


# --- item 14: Ctrl-C at any instant --------------------------------------------------------------

def _launcher_saying_ready() -> str:
    """The installed launcher (bin/eagle3conv) with 'ready' written once its first statement has taken
    Ctrl-C: a signal sent before then would test Python's start-up, not eagle3conv."""
    src = (Path(__file__).parents[1] / "bin" / "eagle3conv").read_text()
    taken = "    _signal.signal(_signal.SIGINT, _interrupted)\n"
    assert src.count(taken) == 1
    return src.replace(taken, taken + "sys.argv[0] = 'eagle3conv'\nos.write(2, b'ready\\n')\n")


READY = _launcher_saying_ready()


@pytest.mark.parametrize("delay_ms", [0, 5, 10, 20, 40, 200])
def test_ctrl_c_early_is_one_line_and_exit_130(make_ckpt, delay_ms):
    """SIGINT from the first line of eagle3conv's entry point on (while click, the CLI and torch
    import, while parsing, while running) -> one line on stderr, exit 130, one JSON doc."""
    ck = make_ckpt("sglang")
    # verify's smoke test imports torch: long enough that the signal always comes while it runs
    p = subprocess.Popen([sys.executable, "-c", READY, "verify", str(ck), "--json", "--device", "cpu"],
                         preexec_fn=_default_sigint,  # a Ctrl-C the test sends is not one a shell's `&` ignored
                         stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_env())
    assert p.stderr.readline() == "ready\n"
    time.sleep(delay_ms / 1000)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, (p.returncode, out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().startswith("interrupted"), err
    assert json.loads(out)["exit_code"] == 130
