"""The command line through click's CliRunner: exit codes, stdout/stderr split, JSON, writes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from conftest import PICO, assert_sglang_checkpoint, eagle_config_path, load_st, save_st, snapshot
from eagle3conv.spec.formats import format_names
from eagle3conv.cli import main
from eagle3conv.example import EXAMPLE_FORMATS, Dims, example_formats
from helpers import plan_errors, run

def one_json(res) -> dict:
    """stdout holds exactly one JSON document and nothing else."""
    return json.loads(res.stdout)


def _add_key(ckpt: Path, key: str, value=None) -> None:
    t = load_st(ckpt / "model.safetensors")
    t[key] = torch.ones(2) if value is None else value
    save_st(t, ckpt / "model.safetensors")


# --- help, version, formats, example -------------------------------------------------------------


@pytest.mark.parametrize("cmd", [[], ["inspect"], ["fix-keys"], ["formats"], ["example"], ["config"], ["targets"], ["push"], ["verify"], ["capture"], ["launch"]])
def test_help_has_an_example_block(cmd):
    res = run(*cmd, "--help")
    assert "Example:" in res.stdout
    example = res.stdout.split("Example:", 1)[1]
    assert "eagle3conv" in example.splitlines()[1]
    assert res.stderr == ""


def test_every_command_is_covered_by_the_help_test():
    assert set(main.commands) == {"inspect", "fix-keys", "formats", "example", "config", "targets", "push", "verify", "capture",
                                 "launch"}


def test_version():
    res = run("--version")
    from eagle3conv import __version__

    assert __version__ in res.stdout


def test_formats_command():
    res = run("formats")
    names = [line.split()[0] for line in res.stdout.strip().splitlines()]
    assert sorted(names) == format_names()
    assert "_common" not in names
    data = one_json(run("formats", "--json"))
    assert [f["name"] for f in data["formats"]] == names  # same order: by priority
    prios = [f["priority"] for f in data["formats"]]
    assert prios == sorted(prios, reverse=True)
    for f in data["formats"]:
        assert f["title"] and f["rules"]
        assert all(r["rule"] and r["why"] for r in f["rules"])
        # the common rules are shown with every format
        assert any("rotary_emb" in r["rule"] for r in f["rules"])
    # it decides nothing about the user's files: its verdict says so, as a code (issue 27)
    assert data["verdict"] == {"outcome": "listed", "formats": len(names)}


def test_example_command_then_fix(tmp_path):
    dest = tmp_path / "example-drafter"
    res = run("example", dest)
    assert f"wrote an example modelopt-export drafter to {dest}" in res.stdout
    assert (dest / "model.safetensors").is_file() and (dest / "config.json").is_file()
    out = tmp_path / "fixed"
    run("fix-keys", dest, "--out", out)
    assert_sglang_checkpoint(out, Dims())  # the default example dims


@pytest.mark.parametrize("fmt", [f for f in EXAMPLE_FORMATS if f != "eagle"])
def test_example_every_format_json(tmp_path, fmt):
    dest = tmp_path / fmt
    data = one_json(run("example", dest, "--format", fmt, "--json"))
    assert data == {"path": str(dest), "format": fmt,
                    "verdict": {"outcome": "wrote", "format": fmt, "path": str(dest)}}  # it decides nothing
    insp = one_json(run("inspect", dest, "--json"))
    assert insp["plan"]["ok"], plan_errors(insp["plan"])


def test_example_refusals(tmp_path):
    res = run("example", tmp_path / "x", "--format", "nope", ok=2)
    # a Choice of the example registry: every name in the error (and in --help), nothing written
    assert "'nope' is not one of" in res.stderr and all(f"'{f}'" in res.stderr for f in example_formats())
    assert not (tmp_path / "x").exists()
    help_text = " ".join(run("example", "--help").stdout.split())
    assert "One of: " + ", ".join(example_formats()) + "." in help_text.replace("- ", "-")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    res = run("example", tmp_path / "full", ok=2)
    assert "already exists and is not empty" in res.stderr
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == ["f"]


@pytest.mark.parametrize("draft_vocab", [128, 1024])
def test_example_small_and_full_draft_vocab(make_ckpt, tmp_path, draft_vocab):
    ck = make_ckpt("modelopt-export", draft_vocab=draft_vocab)
    out = tmp_path / "o"
    run("fix-keys", ck, "--out", out)
    assert_sglang_checkpoint(out, dataclasses.replace(PICO, draft_vocab=draft_vocab))


# --- inspect ------------------------------------------------------------------------------------------


def test_inspect_text(make_ckpt):
    ck = make_ckpt("modelopt-export")
    res = run("inspect", ck)
    out = res.stdout
    assert f"checkpoint: {ck}" in out
    assert "layout:     safetensors (1 weight file(s))" in out
    assert "layers.0.self_attn.q_proj.weight" in out
    assert "format:   modelopt-export" in out and "because keys start with layers.0." in out
    assert "~  layers.0.self_attn.q_proj.weight  -> midlayer.self_attn.q_proj.weight" in out
    assert "t2d: rewritten" in out
    assert "note:     t2d was missing" in out
    assert "eagle_config=" in out and "other files: tokenizer_config.json" in out
    assert res.stderr == ""


def test_inspect_json_is_one_document(make_ckpt):
    ck = make_ckpt("sglang-fused")
    before = snapshot(ck)
    res = run("inspect", ck, "--json")
    d = one_json(res)
    assert res.stderr == ""
    assert d["checkpoint"] == str(ck) and d["layout"] == "safetensors"
    assert {t["name"] for t in d["tensors"]} >= {"model.midlayer.self_attn.qkv_proj.weight"}
    assert d["plan"]["format"] == "sglang" and d["plan"]["ok"] and not d["plan"]["identity"]
    assert sorted(o["name"] for o in d["plan"]["outputs"]) == sorted(
        ["d2t", "fc.weight", "lm_head.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
         "midlayer.mlp.down_proj.weight", "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight",
         "midlayer.post_attention_layernorm.weight", "midlayer.self_attn.k_proj.weight",
         "midlayer.self_attn.o_proj.weight", "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.v_proj.weight",
         "norm.weight", "t2d"])
    assert d["plan"]["shards"] == [{"file": "model.safetensors", "tensors": [o["name"] for o in d["plan"]["outputs"]]}]
    assert d["config"]["draft_vocab_size"] == PICO.draft_vocab
    assert snapshot(ck) == before  # inspect writes nothing


def test_inspect_identity(make_ckpt):
    res = run("inspect", make_ckpt("sglang"))
    assert "already SGLang-ready: fix-keys would change nothing" in res.stdout


def test_inspect_exit_3_with_unmapped(make_ckpt):
    ck = make_ckpt("sglang")
    _add_key(ck, "extra.weight")
    res = run("inspect", ck, ok=3)
    assert "ERROR:    extra.weight: unmapped" in res.stdout
    d = one_json(run("inspect", ck, "--json", ok=3))
    assert d["plan"]["ok"] is False
    assert plan_errors(d["plan"]) == ["extra.weight: unmapped: SGLang would skip it silently"]
    # issue 27: the verdict the text leads with, as codes (the plan's findings once: no errors/notices copies)
    assert d["verdict"]["outcome"] == "refused" and d["verdict"]["first_error"]["code"] == "unmapped-key"
    assert "errors" not in d["plan"] and "notices" not in d["plan"]


def test_fix_keys_and_inspect_json_carry_the_verdict(make_ckpt):
    """issue 27: inspect's and fix-keys' first line is a verdict that --json carries as codes and values."""
    ck = make_ckpt("modelopt-export")
    d = one_json(run("fix-keys", ck, "--dry-run", "--json"))
    counts: dict = {}
    for dec in d["plan"]["decisions"]:
        if dec["action"] in ("renamed", "split", "dropped"):
            counts[dec["action"]] = counts.get(dec["action"], 0) + 1
    v = d["verdict"]
    assert v["outcome"] == "rewrite" and v["keys"] == counts and counts and v["errors"] == 0
    assert v["config_edits"] == len(d["plan"]["config_edits"])
    first = run("fix-keys", ck, "--dry-run").stdout.splitlines()[0]
    assert f"rename {counts['renamed']} key" in first, first
    assert one_json(run("inspect", make_ckpt("sglang"), "--json"))["verdict"]["outcome"] == "ready"


def test_inspect_eagle_without_and_with_config(make_ckpt):
    ck = make_ckpt("eagle")
    res = run("inspect", ck, ok=2)
    assert "fix-keys cannot plan: no config.json for this eagle checkpoint" in res.stdout
    assert "hint: pass the drafter's config with --config" in res.stdout
    d = one_json(run("inspect", ck, "--json", ok=2))
    assert d["plan_error"]["error"] == "UsageError" and d["plan_error"]["exit_code"] == 2
    res = run("inspect", ck, "--config", eagle_config_path(ck))
    assert "architectures: ['LlamaForCausalLM'] -> ['LlamaForCausalLMEagle3']" in res.stdout


# --- fix-keys ----------------------------------------------------------------------------------------


def test_fix_keys_dry_run_writes_nothing(make_ckpt, tmp_path):
    ck = make_ckpt("modelopt-export")
    before = snapshot(ck)
    listing = sorted(p.name for p in tmp_path.iterdir())
    res = run("fix-keys", ck, "--dry-run")
    assert res.stdout.startswith("fix-keys (dry run, nothing written): would ")
    assert "~  layers.0.mlp.up_proj.weight  -> midlayer.mlp.up_proj.weight" in res.stdout
    run("fix-keys", ck, "--dry-run", "--out", tmp_path / "out", "--dtype", "fp32", "--max-shard-size", "10KB")
    d = one_json(run("fix-keys", ck, "--dry-run", "--json"))
    assert d["mode"] == "dry-run" and d["files"] == [] and d["bytes_written"] == 0
    assert snapshot(ck) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == listing  # no out folder, no temp folder


def test_fix_keys_out(make_ckpt, tmp_path):
    ck = make_ckpt("speculators")
    before = snapshot(ck)
    out = tmp_path / "sglang-ready"
    res = run("fix-keys", ck, "--out", out)
    assert f"wrote {out}" in res.stdout and "15 tensors re-read and proven equal to their source" in res.stdout
    assert_sglang_checkpoint(out)
    assert (out / "tokenizer_config.json").read_text() == (ck / "tokenizer_config.json").read_text()
    assert snapshot(ck) == before  # the source is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([ck.name, out.name])  # no temp folder left


def test_fix_keys_out_json(make_ckpt, tmp_path):
    ck = make_ckpt("specforge-runtime")
    out = tmp_path / "o"
    res = run("fix-keys", ck, "--out", out, "--json")
    d = one_json(res)
    assert d["mode"] == "out" and d["output"] == str(out) and not d["unchanged"]
    assert d["files"] == ["model.safetensors", "config.json", "tokenizer_config.json"]
    assert d["tensors_verified"] == 15
    assert d["plan"]["format"] == "specforge-runtime"
    assert_sglang_checkpoint(out)


def test_fix_keys_out_sharded(make_ckpt, tmp_path):
    ck = make_ckpt("modelopt-export")
    out = tmp_path / "o"
    res = run("fix-keys", ck, "--out", out, "--max-shard-size", "20KiB", "--json")
    d = one_json(res)
    shards = [s["file"] for s in d["shards"]]
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert_sglang_checkpoint(out)


def test_fix_keys_in_place_then_idempotent(make_ckpt):
    ck = make_ckpt("modelopt-export")
    res = run("fix-keys", ck)
    assert f"wrote {ck}" in res.stdout
    assert_sglang_checkpoint(ck)
    names = sorted(p.name for p in ck.iterdir())
    assert names == ["config.json", "model.safetensors", "tokenizer_config.json"]  # no staging, journal, backup
    first = snapshot(ck)
    res = run("fix-keys", ck)
    assert res.stdout.startswith(f"fix-keys: {ck} is already SGLang-ready; left byte-for-byte unchanged")
    assert snapshot(ck) == first  # bytes and mtimes
    d = one_json(run("fix-keys", ck, "--json"))
    assert d["unchanged"] is True and d["files"] == []
    assert snapshot(ck) == first


@pytest.mark.parametrize("fmt", ["draft-model-prefixed", "specforge-runtime", "sglang-fused"])
def test_in_place_from_other_layouts(make_ckpt, fmt):
    ck = make_ckpt(fmt)
    run("fix-keys", ck)
    assert_sglang_checkpoint(ck)
    first = snapshot(ck)
    assert "already SGLang-ready" in run("fix-keys", ck).stdout
    assert snapshot(ck) == first


def test_in_place_reshard(make_ckpt):
    ck = make_ckpt("sglang")
    run("fix-keys", ck, "--max-shard-size", "20KiB")
    assert (ck / "model.safetensors.index.json").is_file()
    assert not (ck / "model.safetensors").exists()
    assert_sglang_checkpoint(ck)


def test_exit_3_unmapped_nothing_written(make_ckpt, tmp_path):
    ck = make_ckpt("modelopt-export")
    _add_key(ck, "extra.weight")
    _add_key(ck, "layers.0.self_attn.foo.weight")
    before = snapshot(ck)
    for extra in ([], ["--out", tmp_path / "out"]):
        res = run("fix-keys", ck, *extra, ok=3)
        assert res.stdout == ""
        err = res.stderr
        assert "cannot produce a correct SGLang checkpoint (2 problems); nothing was written" in err
        assert "  - extra.weight: unmapped: SGLang would skip it silently" in err
        assert "  - layers.0.self_attn.foo.weight: unmapped (maps to midlayer.self_attn.foo.weight)" in err
        assert "hint: run `eagle3conv inspect`" in err and "--from" in err
        assert "Traceback" not in res.output
    assert snapshot(ck) == before
    assert not (tmp_path / "out").exists()
    d = one_json(run("fix-keys", ck, "--json", ok=3))
    assert d["error"] == "InvalidCheckpointError" and d["exit_code"] == 3
    assert len(d["details"]) == 2
    assert snapshot(ck) == before


def test_many_problems_are_capped_on_stderr_not_in_json(make_ckpt):
    ck = make_ckpt("sglang")
    t = load_st(ck / "model.safetensors")
    for i in range(60):
        t[f"extra{i:02d}.weight"] = torch.ones(1)
    save_st(t, ck / "model.safetensors")
    res = run("fix-keys", ck, ok=3)
    assert "… 10 more (use --json for all)" in res.stderr
    assert len(one_json(run("fix-keys", ck, "--json", ok=3))["details"]) == 60


@pytest.mark.parametrize("args,words", [
    (["--from", "zzz"], "unknown source format 'zzz'"),
    (["--dtype", "int8"], "Invalid value for '--dtype'"),
    (["--max-shard-size", "lots"], "--max-shard-size 'lots'"),
    (["--config", "/nonexistent/config.json"], "does not exist"),
    (["--no-such-flag"], "No such option"),
])
def test_exit_2_on_usage_errors(make_ckpt, tmp_path, args, words):
    ck = make_ckpt("modelopt-export")
    before = snapshot(ck)
    res = run("fix-keys", ck, *args, ok=2)
    assert words in res.stderr
    assert "Traceback" not in res.output
    assert snapshot(ck) == before


def test_exit_2_out_not_empty_and_eagle_without_config(make_ckpt, tmp_path):
    ck = make_ckpt("sglang")
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    res = run("fix-keys", ck, "--out", out, ok=2)
    assert "already exists and is not an empty folder" in res.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    eagle = make_ckpt("eagle")
    res = run("fix-keys", eagle, ok=2)
    assert "no config.json for this eagle checkpoint" in res.stderr and "hint:" in res.stderr
    res = run("fix-keys", eagle, "--config", eagle_config_path(eagle), "--out", tmp_path / "e")
    assert_sglang_checkpoint(tmp_path / "e")


def test_exit_2_missing_argument():
    res = run("fix-keys", ok=2)
    assert "Missing argument" in res.stderr


def test_exit_1_on_unreadable_input(make_ckpt, tmp_path):
    res = run("inspect", tmp_path / "nope", ok=1)
    assert res.stderr.strip() == f"error: {tmp_path / 'nope'}: no such file or folder"
    assert res.stdout == ""
    ck = make_ckpt("sglang")
    raw = (ck / "model.safetensors").read_bytes()
    (ck / "model.safetensors").write_bytes(raw[:-100])
    for cmd in ("inspect", "fix-keys"):
        res = run(cmd, ck, ok=1)
        assert "error:" in res.stderr and "truncated" in res.stderr
        assert "hint: the file was probably cut off" in res.stderr
        assert "Traceback" not in res.output
    d = one_json(run("inspect", ck, "--json", ok=1))
    assert d["error"] == "CheckpointReadError" and d["exit_code"] == 1


def test_debug_shows_the_traceback(tmp_path):
    quiet = run("inspect", tmp_path / "nope", ok=1)
    assert "Traceback" not in quiet.output
    loud = run("inspect", tmp_path / "nope", "--debug", ok=1)
    assert "Traceback (most recent call last)" in loud.stderr
    assert "CheckpointReadError" in loud.stderr
    assert loud.stdout == ""


def test_internal_error_message_and_debug(make_ckpt, monkeypatch):
    """An eagle3conv bug (here injected) gives a one-line message, and a traceback only with --debug."""
    import eagle3conv.api

    def broken(*a, **k):
        raise ZeroDivisionError("injected")

    monkeypatch.setattr(eagle3conv.api, "inspect", broken)
    ck = make_ckpt("sglang")
    quiet = run("inspect", ck, ok=1)
    assert "internal error (ZeroDivisionError: injected)" in quiet.stderr
    assert "rerun with --debug and report it" in quiet.stderr
    assert "Traceback" not in quiet.output
    loud = run("inspect", ck, "--debug", ok=1)
    assert "Traceback (most recent call last)" in loud.stderr


def test_hf_cache_in_place_refused_with_hint(make_ckpt, tmp_path):
    src = make_ckpt("modelopt-export")
    repo = tmp_path / "models--org--d"
    snap = repo / "snapshots" / "abc"
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for name in ("model.safetensors", "config.json"):
        (repo / "blobs" / name).write_bytes((src / name).read_bytes())
        (snap / name).symlink_to(Path("../../blobs") / name)
    res = run("fix-keys", repo, ok=2)
    assert "a Hugging Face cache snapshot" in res.stderr and "--out DIR" in res.stderr
    run("fix-keys", repo, "--out", tmp_path / "o")
    assert_sglang_checkpoint(tmp_path / "o")


def test_whole_model_in_place_refused(make_ckpt, tmp_path):
    ck = make_ckpt("modelopt-train")
    before = snapshot(ck)
    res = run("fix-keys", ck, ok=2)
    assert "fixing it in place would delete 7 base-model tensors" in res.stderr
    assert snapshot(ck) == before


def test_keep_embed_and_dtype_flags(make_ckpt, tmp_path):
    ck = make_ckpt("angelslim")
    out = tmp_path / "o"
    res = run("fix-keys", ck, "--out", out, "--keep-embed", "--dtype", "bf16")
    assert "embed_tokens.weight dropped" not in res.stdout
    assert_sglang_checkpoint(out, keep_embed=True)
    res = run("fix-keys", ck, "--out", tmp_path / "o2")
    assert "note:     embed_tokens.weight dropped" in res.stdout
    assert_sglang_checkpoint(tmp_path / "o2")


def test_json_with_a_bad_flag_still_prints_one_json_document():
    res = run("verify", "/tmp", "--steps", "x", "--json", ok=2)
    d = one_json(res)
    assert d["error"] == "UsageError" and d["exit_code"] == 2 and "--steps" in d["message"]
    assert "Invalid value" in res.stderr
    assert run("verify", "/tmp", "--steps", "x", ok=2).stdout == ""  # without --json, nothing on stdout
