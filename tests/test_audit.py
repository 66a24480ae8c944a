"""The config audit (issue 11): every finding, with its fix, on real config dicts and through
`config --check` on a real checkpoint."""

from __future__ import annotations

import json

from click.testing import CliRunner

from eagle3conv.cli import main
from eagle3conv.wiring.audit import audit_config

BASE = {"architectures": ["LlamaForCausalLMEagle3"], "vocab_size": 1000, "draft_vocab_size": 100,
        "rope_scaling": None, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "max_position_embeddings": 8192, "use_cache": True}
NAMES = {"fc.weight", "lm_head.weight", "d2t", "t2d", "midlayer.self_attn.q_proj.weight"}


def codes(findings):
    return sorted(f.code for f in findings)


def test_a_clean_config_has_no_findings():
    assert audit_config(BASE, NAMES, read_d2t=lambda: [0] * 100, max_context=8192) == []


def test_draft_vocab_size_missing_with_own_lm_head():
    cfg = {k: v for k, v in BASE.items() if k != "draft_vocab_size"}
    (f,) = audit_config(cfg, NAMES)
    assert f.code == "audit-draft-vocab" and "SGLang then uses the target's lm_head" in f.message
    assert "draft_vocab_size" in f.fix and f.level == "warning" and f.area == "config"
    assert audit_config(cfg, NAMES - {"lm_head.weight"}) == []


def test_identity_d2t_with_the_full_vocab():
    cfg = {**BASE, "draft_vocab_size": 1000}
    (f,) = audit_config(cfg, NAMES, read_d2t=lambda: [0] * 1000)
    assert f.code == "audit-d2t-identity" and "vLLM refuses" in f.message and f.fix.startswith("drop d2t")
    assert audit_config(cfg, NAMES, read_d2t=lambda: [0] * 999 + [1]) == []  # not the identity
    assert audit_config(BASE, NAMES, read_d2t=lambda: [0] * 100) == []  # a reduced vocab needs its d2t


def test_rope_fields_not_both_written():
    cfg = {k: v for k, v in BASE.items() if k != "rope_scaling"}
    (f,) = audit_config(cfg, NAMES)
    assert f.code == "audit-rope-fields" and "has rope_parameters but no rope_scaling" in f.message
    cfg = {k: v for k, v in BASE.items() if k != "rope_parameters"}
    assert "has rope_scaling but no rope_parameters" in audit_config(cfg, NAMES)[0].message


def test_max_positions_below_the_served_context():
    (f,) = audit_config({**BASE, "max_position_embeddings": 2048}, NAMES, max_context=32768)
    assert f.code == "audit-max-positions" and "2048" in f.message and "at least 32768" in f.fix
    assert audit_config({**BASE, "max_position_embeddings": 2048}, NAMES) == []  # no context given


def test_flags_only_one_engine_honours():
    found = audit_config({**BASE, "rope_interleave": False}, NAMES | {"fc.bias"})
    assert codes(found) == ["audit-one-engine-flag"] * 2
    assert any("vLLM always applies interleaved RoPE" in f.message for f in found)
    assert any("vLLM ignores .bias" in f.message for f in found)
    mla = {**BASE, "architectures": ["Eagle3DeepseekV2ForCausalLM"], "norm_before_fc": True}
    (f,) = audit_config(mla, NAMES)
    assert "honoured by neither" in f.message
    assert audit_config({**BASE, "norm_before_fc": True}, NAMES) == []  # a Llama drafter: SGLang reads it


def test_use_cache_false():
    (f,) = audit_config({**BASE, "use_cache": False}, NAMES)
    assert f.code == "audit-use-cache" and "use_cache: true" in f.fix


def test_config_check_shows_the_audit(make_ckpt):
    ck = make_ckpt("sglang")
    p = ck / "config.json"
    cfg = json.loads(p.read_text())
    cfg.update(use_cache=False, max_position_embeddings=2048, rope_interleave=False)
    cfg.pop("draft_vocab_size", None)
    p.write_text(json.dumps(cfg))
    res = CliRunner().invoke(main, ["config", str(ck), "--check", "--max-context", "32768", "--json"])
    d = json.loads(res.stdout)
    got = {f["code"] for f in d["wiring"]["findings"]}
    assert {"audit-use-cache", "audit-max-positions", "audit-one-engine-flag"} <= got, got
    text = CliRunner().invoke(main, ["config", str(ck), "--check", "--max-context", "32768"]).stdout
    assert "use_cache: false" in text and "fix: set use_cache: true" in text
    res = CliRunner().invoke(main, ["config", str(ck), "--check", "--max-context", "0"])
    assert res.exit_code == 2
