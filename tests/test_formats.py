"""Mapping files: schema, integrity, detection, and golden output key lists for every trainer format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import eagle_config_path
from eagle3conv.io.data import data_path
from eagle3conv.spec.canonical import architecture_for, eval_dim, load_canonical, symbols_from_config
from eagle3conv.spec.formats import (
    CONDITIONS,
    DetectContext,
    Rule,
    format_names,
    get_format,
    load_format_file,
    load_formats,
)
from eagle3conv.checkpoint.index import open_checkpoint
from eagle3conv.checkpoint.plan import build_plan, load_config_file
from eagle3conv.errors import InvalidCheckpointError, MappingFileError, UsageError
from eagle3conv.example import EXAMPLE_FORMATS

FORMAT_FILES = sorted(data_path("formats").glob("*.json"))

# The SGLang key list every format must convert to, written out (not computed).
GOLDEN = [
    "d2t",
    "fc.weight",
    "lm_head.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.mlp.down_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "norm.weight",
    "t2d",
]
GOLDEN_WITH_EMBED = sorted(GOLDEN + ["embed_tokens.weight"])

# The later decoder layer a two-layer drafter adds, both engines' input-norm names written (docs/facts.md §6).
LAYER_1 = [
    "layers.1.hidden_norm.weight",
    "layers.1.input_layernorm.weight",
    "layers.1.mlp.down_proj.weight",
    "layers.1.mlp.gate_proj.weight",
    "layers.1.mlp.up_proj.weight",
    "layers.1.post_attention_layernorm.weight",
    "layers.1.self_attn.k_proj.weight",
    "layers.1.self_attn.o_proj.weight",
    "layers.1.self_attn.q_proj.weight",
    "layers.1.self_attn.v_proj.weight",
]
FC_NORM = ["fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"]
QK_NORM_0 = ["midlayer.self_attn.k_norm.weight", "midlayer.self_attn.q_norm.weight"]
QK_NORM_1 = ["layers.1.self_attn.k_norm.weight", "layers.1.self_attn.q_norm.weight"]
# a P-EAGLE drafter keeps its trained embedding (vLLM embeds with it)
PEAGLE = ["embed_tokens.weight", "mask_hidden"]

# example format -> (detected format, other matching formats, source keys dropped by default,
#                    source keys dropped with --keep-embed, has an embed to keep[, outputs beyond GOLDEN])
DETECTION = {
    "sglang": ("sglang", [], 0, 0, False),
    "sglang-fused": ("sglang", [], 0, 0, False),
    "specforge": ("specforge", ["sglang"], 0, 0, False),
    "specforge-runtime": ("specforge-runtime", ["specforge", "sglang"], 0, 0, False),
    "eagle": ("eagle", ["sglang"], 0, 0, False),
    "modelopt-train": ("modelopt-train", [], 7, 7, False),
    "modelopt-export": ("modelopt-export", [], 0, 0, False),
    # the old Model Optimizer export already uses SGLang's names
    "modelopt-export-old": ("sglang", [], 0, 0, False),
    "speculators": ("speculators", [], 1, 0, True),
    "angelslim": ("angelslim", ["sglang"], 1, 0, True),
    "draft-model-prefixed": ("draft-model-prefixed", [], 0, 0, False),
    # the trainers of 2026
    "automodel": ("automodel", [], 1, 0, True),
    "automodel-3.1": ("automodel", [], 1, 0, True, FC_NORM),
    "automodel-peagle": ("automodel", [], 0, 0, False, LAYER_1 + PEAGLE),
    "speculators-3.1": ("speculators", [], 1, 0, True, LAYER_1 + ["input_norm.weight"]),
    "speculators-qwen3": ("speculators", [], 1, 0, True, QK_NORM_0),
    "speculators-peagle": ("speculators", [], 0, 0, False, LAYER_1 + QK_NORM_0 + QK_NORM_1 + PEAGLE),
    "speculators-k5": ("speculators", [], 1, 0, True),
    # SpecForge's export has SGLang's names: told apart only with --from (a warning says so)
    "specforge-export": ("sglang", ["specforge-export"], 0, 0, False),
    "specforge-peagle": ("specforge-peagle", ["modelopt-export"], 0, 0, False, LAYER_1 + PEAGLE),
    "specforge-runtime-peagle": ("specforge-runtime", ["specforge-peagle", "modelopt-export"], 0, 0, False,
                                 LAYER_1 + PEAGLE),
    "modelopt-export-0.47": ("modelopt-export", [], 0, 0, False, LAYER_1),
}


def test_detection_table_covers_every_example_format():
    assert sorted(DETECTION) == sorted(EXAMPLE_FORMATS)


# --- the shipped mapping files ----------------------------------------------------------------


def test_mapping_files_are_there():
    names = {p.stem for p in FORMAT_FILES}
    assert "_common" in names
    assert names - {"_common"} == set(format_names())
    assert {"sglang", "specforge", "specforge-runtime", "eagle", "modelopt-train", "modelopt-export",
            "speculators", "angelslim", "draft-model-prefixed"} <= names


@pytest.mark.parametrize("path", FORMAT_FILES, ids=lambda p: p.stem)
def test_every_mapping_file_loads_and_validates(path):
    fmt = load_format_file(path)
    assert fmt.name == path.stem
    assert fmt.title and fmt.title != fmt.name
    raw = json.loads(path.read_text())
    assert len(fmt.rules) == len(raw["rules"])
    for rule in fmt.rules:
        assert rule.why.strip(), rule
    if fmt.name != "_common":
        assert isinstance(fmt.priority, int)
        assert set(fmt.detect) == {"all"} and fmt.detect["all"]


def test_priorities_are_distinct():
    formats, _ = load_formats()
    prios = [f.priority for f in formats.values()]
    assert len(set(prios)) == len(prios), "equal priorities make detection depend on names"


def _canonical_names() -> set[str]:
    names = set()
    for arch in load_canonical().values():
        names |= {t.name for t in arch.tensors} | {f.name for f in arch.fused}
        names |= {t.name.replace("{slot}", str(i)) for t in arch.templated for i in range(3)}
    return names


@pytest.mark.parametrize("path", FORMAT_FILES, ids=lambda p: p.stem)
def test_key_rules_target_canonical_names(path):
    fmt = load_format_file(path)
    for rule in fmt.rules:
        if rule.kind == "key":
            assert rule.to in _canonical_names(), rule.describe()


@pytest.mark.parametrize("path", FORMAT_FILES, ids=lambda p: p.stem)
def test_no_rule_is_shadowed_by_an_earlier_prefix(path):
    fmt = load_format_file(path)
    for i, early in enumerate(fmt.rules):
        if early.kind != "prefix":
            continue
        for late in fmt.rules[i + 1:]:
            if late.kind in ("key", "prefix"):
                assert not late.pattern.startswith(early.pattern), f"{late.describe()} never fires after {early.describe()}"


def test_rule_semantics():
    r = Rule("key", "a.b", "c.d", "why")
    assert r.match("a.b") == ("rename", "c.d") and r.match("a.bb") is None
    p = Rule("prefix", "layers.0.", "midlayer.", "why")
    assert p.match("layers.0.mlp.up_proj.weight") == ("rename", "midlayer.mlp.up_proj.weight")
    assert p.match("layers.1.mlp") is None
    import re

    d = Rule("drop", "inv_freq$", None, "why", re.compile("inv_freq$"))
    assert d.match("x.inv_freq") == ("drop", None) and d.match("x.weight") is None
    assert d.describe() == "drop /inv_freq$/"
    assert p.describe() == "layers.0.* -> midlayer.*"
    assert r.describe() == "a.b -> c.d"


def test_common_rules():
    _, common = load_formats()
    kinds = {r.kind for r in common.rules}
    assert kinds == {"drop", "refuse"}

    def fate(name):
        for r in common.rules:
            m = r.match(name)
            if m:
                return m[0]
        return None

    assert fate("midlayer.self_attn.rotary_emb.inv_freq") == "drop"
    assert fate("rotary_emb.inv_freq") == "drop"
    assert fate("midlayer.self_attn.rotary_emb.cos_cached") == "drop"
    assert fate("midlayer.mlp._extra_state") == "drop"
    assert fate("layers.1.mlp.up_proj.weight") is None  # a later decoder layer, in the engines' spelling
    assert fate("midlayer.1.mlp.up_proj.weight") == "refuse"
    assert fate("midlayer.0.mlp.up_proj.weight") == "refuse"
    assert fate("additional_layers.0.mlp.up_proj.weight") == "refuse"
    assert fate("layers.10.x") is None
    assert fate("layers.0.mlp.up_proj.weight") is None
    assert fate("midlayer.mlp.up_proj.weight") is None
    assert fate("midlayer.self_attn.rotary_emb.weight") is None


def test_get_format_unknown():
    with pytest.raises(UsageError, match="unknown source format 'nope'") as e:
        get_format("nope")
    assert "sglang" in e.value.hint


# --- schema violations --------------------------------------------------------------------------

GOOD = {
    "schema": 1,
    "name": "fmt",
    "title": "A test format",
    "priority": 5,
    "detect": {"all": [{"any_key_prefix": ["x."]}]},
    "rules": [{"prefix": "x.", "to": "", "why": "test"}],
}


def _write(tmp_path: Path, data, name="fmt") -> Path:
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return p


def _with(**changes):
    d = json.loads(json.dumps(GOOD))
    d.update(changes)
    return d


def test_good_file_loads(tmp_path):
    fmt = load_format_file(_write(tmp_path, GOOD))
    assert fmt.name == "fmt" and fmt.priority == 5 and len(fmt.rules) == 1
    assert not fmt.extracts and fmt.config_from is None


BAD = {
    "missing why": (_with(rules=[{"prefix": "x.", "to": ""}]), "has no 'why'"),
    "blank why": (_with(rules=[{"prefix": "x.", "to": "", "why": "  "}]), "has no 'why'"),
    "two kinds in one rule": (_with(rules=[{"prefix": "x.", "key": "x.a", "to": "", "why": "w"}]), "exactly one of"),
    "no kind": (_with(rules=[{"to": "", "why": "w"}]), "exactly one of"),
    "unknown rule field": (_with(rules=[{"prefix": "x.", "to": "", "why": "w", "note": 1}]), "unknown fields \\['note'\\]"),
    "to on a drop rule": (_with(rules=[{"drop_regex": "x", "to": "y", "why": "w"}]), "unknown fields \\['to'\\]"),
    "unknown top-level field": (_with(colour="red"), "unknown fields \\['colour'\\]"),
    "bad regex": (_with(rules=[{"drop_regex": "([", "why": "w"}]), "bad regex"),
    "bad refuse regex": (_with(rules=[{"refuse_regex": "*x", "why": "w"}]), "bad regex"),
    "name != file stem": (_with(name="other"), "must equal the file name 'fmt'"),
    "duplicate source rules": (
        _with(rules=[{"prefix": "x.", "to": "", "why": "a"}, {"prefix": "x.", "to": "y.", "why": "b"}]),
        "duplicate source rules",
    ),
    "two key rules to one target": (
        _with(rules=[{"key": "a", "to": "fc.weight", "why": "a"}, {"key": "b", "to": "fc.weight", "why": "b"}]),
        "two key rules map to the same target",
    ),
    "empty key": (_with(rules=[{"key": "", "to": "fc.weight", "why": "w"}]), "non-empty string"),
    "key without to": (_with(rules=[{"key": "a", "why": "w"}]), "need a string 'to'"),
    "rule not an object": (_with(rules=["x."]), "rule 0 is not an object"),
    "rules not a list": (_with(rules={"x.": ""}), "rules must be a list"),
    "wrong schema": (_with(schema=2), "schema must be 1"),
    "no priority": (_with(priority="high"), "priority must be an integer"),
    "detect not all": (_with(detect={"any": []}), "detect must be"),
    "unknown condition": (_with(detect={"all": [{"key_regex": "x"}]}), "unknown detect condition"),
    "empty conditions": (_with(detect={"all": []}), "non-empty list"),
    "bad nested condition": (_with(detect={"all": [{"any_of": [{"nope": 1}]}]}), "unknown detect condition"),
    "two conditions in one object": (
        _with(detect={"all": [{"layout": ["pickle"], "no_config": True}]}),
        "unknown detect condition",
    ),
    "unknown config_from": (_with(config_from="yaml"), "config_from 'yaml' is not known"),
    "not JSON": ("{oops", "unreadable"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_schema_violations_are_caught(tmp_path, case):
    data, msg = BAD[case]
    path = _write(tmp_path, data)
    with pytest.raises(MappingFileError, match=msg) as e:
        load_format_file(path)
    assert str(path) in e.value.message


def test_mapping_file_that_is_not_an_object(tmp_path):
    with pytest.raises(MappingFileError):
        load_format_file(_write(tmp_path, "[]"))


def test_known_conditions_all_evaluate(tmp_path):
    """Every condition name the schema accepts is one detection knows how to evaluate."""
    from eagle3conv.spec.formats import evaluate_condition

    ctx = DetectContext(frozenset({"x.a"}), {"architectures": ["A"], "f": 1}, "safetensors", None, tmp_path)
    args = {
        "any_key_prefix": ["x."], "config_field": "f", "no_config_field": "g", "config_architecture": ["A"],
        "no_config": False, "layout": ["safetensors"], "wrapper": [None], "path_regex": ".", "file_exists": ".",
        "any_of": [{"layout": ["safetensors"]}], "config_value": {"field": "f", "equals": 1},
    }
    assert set(args) == CONDITIONS
    for kind, arg in args.items():
        hit, why = evaluate_condition({kind: arg}, ctx)
        assert hit, kind
        assert isinstance(why, str) and why


# --- detection and golden output keys ---------------------------------------------------------------


def _plan(ckpt: Path, fmt: str, **kw):
    if fmt == "eagle" and "config_override" not in kw:
        kw["config_override"] = load_config_file(eagle_config_path(ckpt))
    return build_plan(open_checkpoint(ckpt), **kw)


@pytest.mark.parametrize("fmt", EXAMPLE_FORMATS)
def test_detection_and_golden_output_keys(make_ckpt, fmt):
    detected, others, dropped, dropped_keep, has_embed, *extra = DETECTION[fmt]
    extra = extra[0] if extra else []
    ckpt = make_ckpt(fmt)
    plan = _plan(ckpt, fmt)
    assert plan.ok, plan.errors
    assert plan.format.name == detected
    assert not plan.detection.forced and plan.detection.reasons
    assert [m.format.name for m in plan.candidates] == [detected] + others
    assert sorted(o.name for o in plan.outputs) == sorted(GOLDEN + extra)
    assert sum(d.action == "dropped" for d in plan.decisions) == dropped
    assert not any(d.action in ("unmapped", "refused") for d in plan.decisions)
    # every source key has exactly one decision
    assert sorted(d.source for d in plan.decisions) == sorted(plan.index.tensors)

    kept = _plan(ckpt, fmt, keep_embed=True)
    assert kept.ok, kept.errors
    assert sorted(o.name for o in kept.outputs) == sorted((GOLDEN_WITH_EMBED if has_embed else GOLDEN) + extra)
    assert sum(d.action == "dropped" for d in kept.decisions) == dropped_keep


def test_specforge_detected_by_folder_name(tmp_path, make_ckpt):
    ckpt = make_ckpt("sglang", name="epoch_3_step_3000")
    assert _plan(ckpt, "sglang").format.name == "specforge"
    assert _plan(make_ckpt("sglang", name="step_12"), "sglang").format.name == "specforge"
    assert _plan(make_ckpt("sglang", name="epoch_3_step_x"), "sglang").format.name == "sglang"


def test_undetectable_checkpoint(tmp_path, make_ckpt):
    from conftest import load_st, save_st

    ckpt = make_ckpt("sglang")
    t = load_st(ckpt / "model.safetensors")
    save_st({f"weird.{k}": v for k, v in t.items()}, ckpt / "model.safetensors")
    with pytest.raises(InvalidCheckpointError, match="cannot tell which trainer wrote this checkpoint") as e:
        _plan(ckpt, "sglang")
    assert "--from" in e.value.hint and "weird.d2t" in e.value.message


@pytest.mark.parametrize("fmt,forced", [("modelopt-export-old", "angelslim"), ("sglang", "specforge"),
                                         ("modelopt-export", "modelopt-export"), ("sglang", "modelopt-export")])
def test_from_override_works(make_ckpt, fmt, forced):
    plan = _plan(make_ckpt(fmt), fmt, source_format=forced)
    assert plan.ok, plan.errors
    assert plan.format.name == forced and plan.detection.forced
    assert plan.detection.reasons == ("chosen with --from",)
    assert sorted(o.name for o in plan.outputs) == GOLDEN


def test_wrong_from_gives_unmapped_errors(make_ckpt):
    plan = _plan(make_ckpt("modelopt-export"), "modelopt-export", source_format="sglang")
    assert not plan.ok
    unmapped = sorted(d.source for d in plan.decisions if d.action == "unmapped")
    assert unmapped == [
        "layers.0.hidden_norm.weight",
        "layers.0.input_layernorm.weight",
        "layers.0.mlp.down_proj.weight",
        "layers.0.mlp.gate_proj.weight",
        "layers.0.mlp.up_proj.weight",
        "layers.0.post_attention_layernorm.weight",
        "layers.0.self_attn.k_proj.weight",
        "layers.0.self_attn.o_proj.weight",
        "layers.0.self_attn.q_proj.weight",
        "layers.0.self_attn.v_proj.weight",
    ]
    for key in unmapped:
        assert any(e.startswith(f"{key}: unmapped") for e in plan.errors)
    assert any("midlayer.self_attn.q_proj.weight: required but missing" in e for e in plan.errors)
    with pytest.raises(InvalidCheckpointError) as e:
        plan.raise_for_errors()
    assert "--from" in e.value.hint and e.value.exit_code == 3
    assert "nothing was written" in e.value.message


def test_unknown_from(make_ckpt):
    with pytest.raises(UsageError, match="unknown source format"):
        _plan(make_ckpt("sglang"), "sglang", source_format="trainer-x")


# --- canonical.json and shapes -----------------------------------------------------------------------


def test_canonical_json_loads():
    table = load_canonical()
    assert set(table) == {"llama", "mla"}
    llama = table["llama"]
    assert llama.architecture == "LlamaForCausalLMEagle3"
    assert table["mla"].architecture == "Eagle3DeepseekV2ForCausalLM"
    required = sorted(t.name for t in llama.tensors if t.required and not t.when)  # gated rows: see test_contract
    assert required == sorted(set(GOLDEN) - {"d2t", "t2d"})
    assert {f.name for f in llama.fused} == {"midlayer.self_attn.qkv_proj.weight", "midlayer.mlp.gate_up_proj.weight",
                                             "layers.{layer}.self_attn.qkv_proj.weight",
                                             "layers.{layer}.mlp.gate_up_proj.weight"}
    assert "fc_norm.0.weight" not in llama.expand({"k": 3})  # only with the fc_norm switch
    # later decoder layers: 1..L-1, none for a one-layer drafter, both later-layer input norms
    assert not any(n.startswith("layers.") for n in llama.expand({"k": 3, "L": 1}))
    three = llama.expand({"k": 3, "L": 3})
    assert {"layers.1.input_layernorm.weight", "layers.1.hidden_norm.weight", "layers.2.mlp.down_proj.weight"} <= set(three)
    assert "layers.3.mlp.down_proj.weight" not in three and "layers.0.mlp.down_proj.weight" not in three
    assert {f.name for f in llama.fused_rows({"L": 3})} >= {"layers.2.self_attn.qkv_proj.weight"}
    expanded = llama.expand({"k": 3}, {"fc_norm": True})
    assert {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"} <= set(expanded)
    assert "fc_norm.3.weight" not in expanded
    # every shape expression parses and names known symbols only
    symbols = {"H", "T", "k", "L", "NH", "NKV", "HD", "I", "V", "Vd", "QL", "KL", "QK", "QR", "NV", "VH"}
    for arch in table.values():
        for t in arch.tensors + arch.templated:
            for dim in t.shape:
                assert eval_dim(dim, {s: 2 for s in symbols}) is not None, (t.name, dim)


def test_mla_when_clauses():
    mla = load_canonical()["mla"]
    with_lora = mla.expand({"QL": 1536, "k": 3})
    assert "midlayer.self_attn.q_a_proj.weight" in with_lora and "midlayer.self_attn.q_proj.weight" not in with_lora
    without = mla.expand({"QL": None, "k": 3})
    assert "midlayer.self_attn.q_proj.weight" in without and "midlayer.self_attn.q_a_proj.weight" not in without


def test_architecture_for():
    table = load_canonical()
    assert architecture_for({"architectures": ["LlamaForCausalLMEagle3"]}, ["fc.weight"]) is table["llama"]
    assert architecture_for({"architectures": ["Eagle3DeepseekV2ForCausalLM"]}, []) is table["mla"]
    assert architecture_for(None, ["midlayer.self_attn.kv_a_proj_with_mqa.weight"]) is table["mla"]


def test_eval_dim():
    s = {"H": 32, "NH": 4, "HD": 8, "KL": 512, "QR": 64, "k": 3, "T": 48}
    assert eval_dim("H", s) == 32
    assert eval_dim("2*H", s) == 64
    assert eval_dim("NH*HD", s) == 32
    assert eval_dim("KL+QR", s) == 576
    assert eval_dim("k*T", s) == 144
    assert eval_dim("7", s) == 7
    assert eval_dim(" 2 * H ", s) == 64
    assert eval_dim("2*H+NH*HD+1", s) == 97
    assert eval_dim("Vd", s) is None
    assert eval_dim("NKV*HD", {"NKV": None, "HD": 8}) is None
    for bad in ("H-1", "H/2", "2H", "", "H**2", "(H)"):
        with pytest.raises(MappingFileError, match="bad dimension expression"):
            eval_dim(bad, s)


def test_symbols_from_config():
    llama = load_canonical()["llama"]
    sym = symbols_from_config(
        {"hidden_size": 32, "num_attention_heads": 4, "vocab_size": 100,
         "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}}, llama)
    assert sym == {"H": 32, "T": 32, "NH": 4, "NKV": 4, "HD": 8, "I": None, "V": 100, "Vd": 100, "k": 3, "L": 1}
    top = symbols_from_config({"hidden_size": 32, "target_hidden_size": 64, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "head_dim": 16, "draft_vocab_size": 10,
                               "eagle_aux_hidden_state_layer_ids": [2, 3]}, llama)
    assert (top["T"], top["NKV"], top["HD"], top["Vd"], top["k"]) == (64, 2, 16, 10, 2)
