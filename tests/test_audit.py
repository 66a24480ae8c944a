"""The config audit (issue 11): every finding, with its fix, on real config dicts and through
`config --check` on a real checkpoint."""

from __future__ import annotations

import json

from click.testing import CliRunner

from eagle3conv.cli import main
from eagle3conv.wiring.audit import audit_config

BASE = {"architectures": ["LlamaForCausalLMEagle3"], "vocab_size": 1000, "draft_vocab_size": 100,
        "rope_scaling": None, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "max_position_embeddings": 8192, "use_cache": True, "rms_norm_eps": 1e-5, "head_dim": 64}
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
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    (f,) = audit_config(cfg, NAMES)
    assert f.code == "audit-rope-fields" and "has rope_parameters (default) but no rope_scaling" in f.message
    assert "no top-level rope_theta" in f.message and "theta 10000" in f.message
    # a rope_scaling object alone: transformers 5.24 converts it itself (issue 28: no false alarm)
    cfg = {k: v for k, v in BASE.items() if k != "rope_parameters"}
    assert audit_config({**cfg, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, NAMES) == []


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


def test_d2t_missing_while_the_vocab_is_reduced():
    (f,) = audit_config(BASE, NAMES - {"d2t"})
    assert f.code == "audit-d2t-missing" and f.level == "error" and "draft_vocab_size 100 below the vocab 1000" in f.message
    assert "d2t" in f.fix
    assert audit_config({**BASE, "draft_vocab_size": 1000}, NAMES - {"d2t"}) == []  # the full vocab needs none


def test_missing_d2t_is_named_once_where_the_vocab_check_runs(make_ckpt, tmp_path):
    """inspect and config --check run the vocab check (no-d2t) and the audit: one message, not two."""
    from safetensors.torch import load_file, save_file

    ck = make_ckpt("sglang")
    f = ck / "model.safetensors"
    save_file({k: v for k, v in load_file(str(f)).items() if k not in ("d2t", "t2d")}, str(f))
    res = CliRunner().invoke(main, ["inspect", str(ck), "--json"])
    text = res.stdout
    found = json.loads(text)["plan"]["findings"]
    assert sum("there is no d2t" in f["message"] for f in found) == 1
    assert "below the vocab" not in text and "audit-d2t-missing" not in text
    res = CliRunner().invoke(main, ["config", str(ck), "--check", "--json"])  # refused by the vocab check first
    assert res.exit_code == 3 and res.stdout.count("there is no d2t") == 1 and "below the vocab" not in res.stdout


def test_embed_tokens_compared_with_the_target():
    names = NAMES | {"embed_tokens.weight"}
    (f,) = audit_config(BASE, names)  # nothing to compare with: a notice saying so
    assert f.code == "audit-embed-uncompared" and f.level == "notice" and "not checked" in f.message
    differs = {"rows": 40, "of": 1000, "max_abs_diff": 0.5, "identical": False, "how": "captured rows"}
    (f,) = audit_config(BASE, names, embedding_comparison=differs)
    assert f.code == "audit-embed-differs" and f.level == "warning" and "40 of 1000 rows compared" in f.message
    assert "max difference 0.5" in f.message and "vLLM embeds with it" in f.message
    assert audit_config(BASE, names, embedding_comparison={**differs, "identical": True}) == []
    # a drafter narrower than its target embeds with its own table in every engine: nothing to say
    assert audit_config({**BASE, "hidden_size": 64, "target_hidden_size": 128}, names) == []


def test_max_context_defaults_to_the_targets(make_ckpt, tmp_path):
    """--max-context defaults to the target profile's max_position_embeddings (with its source);
    a profile without one makes the audit say it could not check."""
    from eagle3conv.spec.targets import get_target

    assert get_target("smollm2-135m").max_position_embeddings == 8192
    assert get_target("kimi-k2.5").max_position_embeddings == 262144  # text_config's, two sources
    (f,) = audit_config({**BASE, "max_position_embeddings": 2048}, NAMES, max_context=8192,
                        max_context_from="smollm2-135m's max_position_embeddings")
    assert "8192-token context served (smollm2-135m's max_position_embeddings)" in f.message
    (f,) = audit_config(BASE, NAMES, context_unknown="no context known")
    assert f.code == "audit-context-unknown" and f.level == "notice" and "--max-context" in f.fix
    ck = make_ckpt("sglang")
    p = ck / "config.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "max_position_embeddings": 2048}))

    def findings(*extra):
        res = CliRunner().invoke(main, ["config", str(ck), "--check", "--json", *extra])
        return {f["code"]: f for f in json.loads(res.stdout)["wiring"]["findings"]}

    got = findings("--target", "smollm2-135m")
    assert "smollm2-135m's max_position_embeddings" in got["audit-max-positions"]["message"]
    assert "at least 8192" in got["audit-max-positions"]["fix"]
    assert "audit-max-positions" not in findings("--target", "smollm2-135m", "--max-context", "2048")
    # a target whose config.json names no max_position_embeddings: the audit says it could not check
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30,
        "vocab_size": 49152, "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536}))
    got = findings("--target", str(target))
    assert "audit-max-positions" not in got and "names no max_position_embeddings" in \
        got["audit-context-unknown"]["message"]
    assert "audit-context-unknown" not in findings()  # no target: nothing to default to, nothing said


def test_launch_lines_always_name_eagle3(make_ckpt, tmp_path):
    """With EAGLE instead of EAGLE3, SGLang captures no aux states (accept length 1.0, no warning):
    every launch line eagle3conv writes (config/fix-keys and the model card) names EAGLE3."""
    import re

    from eagle3conv.hub.card import gather_facts, render_card
    from eagle3conv.spec.layers import outputs
    from eagle3conv.wiring.config_ids import wiring_edits
    from eagle3conv.wiring.metadata import TrainingRecord

    ck = make_ckpt("sglang")
    cfg = json.loads((ck / "config.json").read_text())
    edits = wiring_edits(cfg, TrainingRecord(outputs(1, 15, 28), "test", convention="output"), num_layers=32,
                         target="llama-3.1-8b", target_repo="meta-llama/Llama-3.1-8B-Instruct")
    launch = edits.launch(str(ck))
    for engine, line in launch.items():
        if engine != "tensorrt_llm_layers":
            assert "EAGLE3" in line.upper(), (engine, line)
    assert "--speculative-algorithm EAGLE3 " in launch["sglang"] and '"method": "eagle3"' in launch["vllm"]
    assert "Eagle3" in launch["tensorrt_llm"]
    card = render_card(gather_facts(ck, "me/drafter"))
    section = card[card.index("### Launch"):]
    commands = re.findall(r"```bash\n(.*?)\n```", section, re.S)
    assert len(commands) == 3 and all("EAGLE3" in c.upper() for c in commands), commands
    assert "decoding_type: Eagle3" in section
