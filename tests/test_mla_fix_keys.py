"""fix-keys for MLA drafters (``Eagle3DeepseekV2ForCausalLM``) from every trainer that writes them.

Each test lays the real MLA drafter trained on SmolLM2 (tests/data/smollm2-drafter-mla)
out the way a trainer or engine writes it, runs the real ``fix-keys`` (a subprocess
where the exit code matters), and checks the output against the fixture byte for
byte, with the same strictness as for Llama drafters:

- TorchSpec's export (``torchspec/models/draft/keymap.py``: ``midlayer.`` -> ``layers.0.``)
  and Model Optimizer's kimik2 export (``hf_spec_export.py`` KIMIK2_EAGLE_SINGLE_LAYER:
  ``layers.0.self_attn.q_a_proj`` ...), read by the modelopt-export rules;
- Model Optimizer's kimik2 training folder (``eagle_module.layers.0.*`` beside the base model);
- a folder saved from a running SGLang (``model.``-prefixed, ``fused_qkv_a_proj_with_mqa``
  and ``gate_up_proj`` fused): split back, prefix stripped;
- a required MLA tensor missing: refused (SGLang never checks and serves uninitialised memory);
- ``q_lora_rank`` missing: read off ``q_a_proj``; a direct ``q_proj``: refused (SGLang refuses it);
- ``draft_vocab_size`` always explicit; ``d2t``/``t2d`` only when the vocab is reduced.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3conv.api import fix_keys, inspect
from eagle3conv.errors import EXIT_INVALID

FIXTURE = Path(__file__).parent / "data" / "smollm2-drafter-mla"
ROOT = Path(__file__).resolve().parent.parent
A = "midlayer.self_attn."


@pytest.fixture(scope="module")
def canon():
    return load_file(str(FIXTURE / "model.safetensors")), json.loads((FIXTURE / "config.json").read_text())


def _write(dest: Path, tensors: dict, config: dict) -> Path:
    dest.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dest / "model.safetensors"),
              metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest


def _rename(t: dict, old: str, new: str) -> dict:
    return {(new + k[len(old):] if k.startswith(old) else k): v for k, v in t.items()}


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "eagle3conv", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def _same_as_fixture(out: Path, canon_tensors: dict, *, without=()) -> None:
    got = load_file(str(out / "model.safetensors"))
    want = {k: v for k, v in canon_tensors.items() if k not in without}
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


def test_torchspec_and_modelopt_kimik2_exports(tmp_path, canon):
    t, cfg = canon
    src = _write(tmp_path / "export", _rename(t, "midlayer.", "layers.0."), cfg)
    res = fix_keys(src, out=tmp_path / "fixed")
    _same_as_fixture(tmp_path / "fixed", t)
    config = json.loads((tmp_path / "fixed" / "config.json").read_text())
    assert config["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and config["q_lora_rank"] == 128
    assert res.plan.format.name == "modelopt-export"


def test_modelopt_kimik2_training_folder(tmp_path, canon):
    t, cfg = canon
    eagle = {"eagle_module." + k: v for k, v in _rename(t, "midlayer.", "layers.0.").items() if k != "t2d"}
    base = {"model.embed_tokens.weight": torch.zeros(8, 576, dtype=torch.bfloat16),
            "model.layers.0.self_attn.q_a_proj.weight": torch.zeros(4, 576, dtype=torch.bfloat16)}
    drafter_cfg = {k: v for k, v in cfg.items() if k not in ("eagle_config",)}
    whole = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "hidden_size": 576,
             "num_hidden_layers": 30, "vocab_size": cfg["vocab_size"],
             "eagle_config": dict(drafter_cfg, eagle_aux_hidden_state_layer_ids=[1, 14, 26])}
    src = _write(tmp_path / "train", {**base, **eagle}, whole)
    res = fix_keys(src, out=tmp_path / "fixed")
    assert res.plan.format.name == "modelopt-train"
    _same_as_fixture(tmp_path / "fixed", t)  # t2d rebuilt from d2t, equal to the trainer's
    config = json.loads((tmp_path / "fixed" / "config.json").read_text())
    assert config["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and config["kv_lora_rank"] == 64


def test_sglang_engine_dump_fused_and_prefixed_is_split_back(tmp_path, canon):
    t, cfg = canon
    f = dict(t)
    f[A + "fused_qkv_a_proj_with_mqa.weight"] = torch.cat([f.pop(A + "q_a_proj.weight"),
                                                           f.pop(A + "kv_a_proj_with_mqa.weight")])
    f["midlayer.mlp.gate_up_proj.weight"] = torch.cat([f.pop("midlayer.mlp.gate_proj.weight"),
                                                       f.pop("midlayer.mlp.up_proj.weight")])
    src = _write(tmp_path / "dump", _rename(f, "", "model."), cfg)
    plan = inspect(src).plan
    split = {d.source: d.targets for d in plan.decisions if d.action == "split"}
    assert split["model." + A + "fused_qkv_a_proj_with_mqa.weight"] == (A + "q_a_proj.weight",
                                                                        A + "kv_a_proj_with_mqa.weight")
    fix_keys(src, out=tmp_path / "fixed")
    _same_as_fixture(tmp_path / "fixed", t)
    got = load_file(str(tmp_path / "fixed" / "model.safetensors"))
    assert not any(k.startswith("model.") or "fused" in k for k in got)

    # q_lora_rank missing as well: read off the fused rows (total - kv_lora_rank - qk_rope_head_dim)
    no_rank = {k: v for k, v in cfg.items() if k != "q_lora_rank"}
    src2 = _write(tmp_path / "dump2", _rename(f, "", "model."), no_rank)
    fix_keys(src2, out=tmp_path / "fixed2")
    _same_as_fixture(tmp_path / "fixed2", t)
    assert json.loads((tmp_path / "fixed2" / "config.json").read_text())["q_lora_rank"] == 128


@pytest.mark.parametrize("missing", [A + "kv_a_layernorm.weight", A + "kv_b_proj.weight", "lm_head.weight"])
def test_a_missing_mla_tensor_is_refused(tmp_path, canon, missing):
    t, cfg = canon
    src = _write(tmp_path / "src", {k: v for k, v in t.items() if k != missing}, cfg)
    r = _cli("fix-keys", str(src), "--out", str(tmp_path / "fixed"), "--json")
    assert r.returncode == EXIT_INVALID, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert missing in json.dumps(doc) and "required but missing" in json.dumps(doc)
    assert not (tmp_path / "fixed").exists()


def test_q_lora_rank_is_written_from_q_a_proj_and_a_direct_q_proj_is_refused(tmp_path, canon):
    t, cfg = canon
    no_rank = {k: v for k, v in cfg.items() if k != "q_lora_rank"}
    res = fix_keys(_write(tmp_path / "a", t, no_rank), out=tmp_path / "fixed")
    assert {e.field: e.new for e in res.plan.config_edits}["q_lora_rank"] == 128
    assert json.loads((tmp_path / "fixed" / "config.json").read_text())["q_lora_rank"] == 128
    _same_as_fixture(tmp_path / "fixed", t)

    direct = {k: v for k, v in t.items() if not k.startswith(A + "q_")}
    direct[A + "q_proj.weight"] = torch.zeros(4 * 48, 2 * 576, dtype=torch.bfloat16)
    r = _cli("fix-keys", str(_write(tmp_path / "b", direct, dict(no_rank, q_lora_rank=None))),
             "--out", str(tmp_path / "fixed_b"), "--json")
    assert r.returncode == EXIT_INVALID, r.stdout + r.stderr
    assert "requires q_lora_rank" in r.stdout and not (tmp_path / "fixed_b").exists()


def test_draft_vocab_size_explicit_and_vocab_maps_only_when_reduced(tmp_path, canon):
    t, cfg = canon
    # a full-vocab MLA drafter (Kimi-K2.5's: draft vocab = vocab, no d2t) with an identity d2t/t2d
    # and no draft_vocab_size
    vocab = 4096
    full = dict(t)
    full["lm_head.weight"] = torch.randn(vocab, 576).to(torch.bfloat16)
    full["d2t"] = torch.zeros(vocab, dtype=torch.int64)
    full["t2d"] = torch.ones(vocab, dtype=torch.bool)
    full_cfg = {k: v for k, v in cfg.items() if k != "draft_vocab_size"} | {"vocab_size": vocab}
    res = fix_keys(_write(tmp_path / "full", full, full_cfg), out=tmp_path / "fixed")
    got = load_file(str(tmp_path / "fixed" / "model.safetensors"))
    assert "d2t" not in got and "t2d" not in got
    config = json.loads((tmp_path / "fixed" / "config.json").read_text())
    assert config["draft_vocab_size"] == vocab  # explicit, or SGLang serves the target's lm_head
    assert any(f.code == "full-vocab-d2t" for f in res.plan.findings)
    dropped = {d.source for d in res.plan.decisions if d.action == "dropped"}
    assert {"d2t", "t2d"} <= dropped

    # a full-vocab d2t that moves tokens cannot be served: refused
    moved = dict(full, d2t=torch.ones(vocab, dtype=torch.int64))
    moved["d2t"][-1] = 0
    r = _cli("fix-keys", str(_write(tmp_path / "moved", moved, full_cfg)), "--out", str(tmp_path / "f2"), "--json")
    assert r.returncode == EXIT_INVALID, r.stdout + r.stderr
    assert "non-zero offsets" in r.stdout

    # the reduced vocab (the fixture) keeps d2t and t2d
    fix_keys(_write(tmp_path / "reduced", t, cfg), out=tmp_path / "fixed3")
    got = load_file(str(tmp_path / "fixed3" / "model.safetensors"))
    assert torch.equal(got["d2t"], t["d2t"]) and torch.equal(got["t2d"], t["t2d"])


def test_specforge_mla_drafter(tmp_path, canon):
    """SpecForge's MLA drafter (specforge/modeling/draft/deepseek_eagle3.py, DeepseekV3ForCausalLMEagle3):
    canonical ``midlayer.*`` names, a frozen ``embed_tokens`` saved beside them, its own class name in
    ``architectures``. fix-keys renames the architecture to the one SGLang registers, drops the stale
    embedding and keeps every other tensor byte for byte."""
    t, cfg = canon
    sf = dict(t, **{"embed_tokens.weight": torch.randn(cfg["vocab_size"], 576).to(torch.bfloat16)})
    sf_cfg = {k: v for k, v in cfg.items() if k != "eagle_config"} | {"architectures": ["DeepseekV3ForCausalLMEagle3"]}
    res = fix_keys(_write(tmp_path / "specforge", sf, sf_cfg), out=tmp_path / "fixed")
    _same_as_fixture(tmp_path / "fixed", t)
    config = json.loads((tmp_path / "fixed" / "config.json").read_text())
    assert config["architectures"] == ["Eagle3DeepseekV2ForCausalLM"]
    edit = {e.field: e for e in res.plan.config_edits}["architectures"]
    assert "SpecForge" in edit.why and edit.old == ["DeepseekV3ForCausalLMEagle3"]
    assert {d.source for d in res.plan.decisions if d.action == "dropped"} == {"embed_tokens.weight"}
