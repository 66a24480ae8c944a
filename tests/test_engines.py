"""Engine capture rules (mappings/engines/*.json) and their interpreter, eagle3conv.spec.engines.

The expectations below are written from the rule tables of docs/facts.md §9
(SGLang per model file and release, vLLM per runner, TensorRT-LLM's launch
option), independently of the JSON files they check.
"""

from __future__ import annotations

import itertools
import random
import json
import shutil
from pathlib import Path

import pytest

from eagle3conv.io.data import data_path
from eagle3conv.errors import MappingFileError, UsageError
from eagle3conv.spec import engines as E
from eagle3conv.spec.layers import EMBEDDING, LayerRef, outputs
from eagle3conv.spec.targets import get_target, load_target_file, target_from_config

from helpers import NEWEST_SGLANG, NEWEST_VLLM, OLDEST_SGLANG, SGLANG_RELEASES

ROOT = Path(__file__).resolve().parents[1]
NESTED = "eagle_config.eagle_aux_hidden_state_layer_ids"
TOP = "eagle_aux_hidden_state_layer_ids"
FAMILY_NAMES = [f["name"] for f in json.loads(data_path("engines", "families.json").read_text())["families"]]


def nested(ids):
    return {"eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ids)}}


def top(ids):
    return {"eagle_aux_hidden_state_layer_ids": list(ids)}


def both(ids):
    return {**top(ids), **nested(ids)}


def v(text):
    return E.parse_version(text)


def _summary(cap) -> str:
    """A capture in words, for assertion messages."""
    return f"{cap.engine} reads {cap.reads} {cap.ids} -> {cap.layers} ({cap.error.message if cap.error else 'ok'})"


# --------------------------------------------------------------------------- the real data


def test_the_shipped_rules_load_and_name_their_sources():
    fams = E.families()
    assert {"deepseek_v2", "glm4_moe_lite", "gpt_oss", "minimax_m3_vl", "llama", "qwen3", "glm4_moe",
            "minimax_m2", "gemma3"} <= set(fams)
    assert set(E.engines()) == {"sglang", "vllm", "tensorrt-llm"}
    for eng in E.engines().values():
        for rule in eng.rules:
            assert rule.why.strip() and rule.source.strip()
            assert rule.family == "*" or rule.family in fams


@pytest.mark.parametrize(
    "arch,model_type,family",
    [
        ("DeepseekV3ForCausalLM", "kimi_k2", "deepseek_v2"),
        ("DeepseekV2ForCausalLM", None, "deepseek_v2"),
        ("DeepseekV32ForCausalLM", None, "deepseek_v2"),
        ("KimiK25ForConditionalGeneration", "kimi_k25", "deepseek_v2"),
        ("GlmMoeDsaForCausalLM", None, "deepseek_v2"),
        ("Glm4MoeLiteForCausalLM", None, "glm4_moe_lite"),
        ("Glm4MoeForCausalLM", None, "glm4_moe"),
        ("GptOssForCausalLM", None, "gpt_oss"),
        ("MiniMaxM3SparseForConditionalGeneration", None, "minimax_m3_vl"),
        ("MiniMaxM2ForCausalLM", None, "minimax_m2"),
        ("LlamaForCausalLM", None, "llama"),
        ("Phi3ForCausalLM", None, "llama"),
        ("Qwen2ForCausalLM", None, "qwen2"),
        ("Qwen3MoeForCausalLM", None, "qwen3_moe"),
        ("Gemma3ForCausalLM", None, "gemma3"),
        ("SomethingNewForCausalLM", "kimi_k2", "deepseek_v2"),  # model_type when the architecture is unknown
        ("SomethingNewForCausalLM", "nothing", None),
    ],
)
def test_family_table(arch, model_type, family):
    assert E.family_for([arch], model_type) == family


def test_every_target_profile_names_its_family():
    want = {"kimi-k2.5": "deepseek_v2", "kimi-k2": "deepseek_v2", "deepseek-v3": "deepseek_v2",
            "gpt-oss-120b": "gpt_oss", "llama-3.1-8b": "llama", "llama-3.3-70b": "llama",
            "smollm2-135m": "llama", "qwen3-8b": "qwen3", "qwen3-32b": "qwen3", "qwen3-235b-a22b": "qwen3_moe"}
    for name, family in want.items():
        assert get_target(name).family == family


def _write(tmp_path, name, data):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def test_a_config_read_target_gets_its_family(tmp_path):
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "config.json").write_text(json.dumps({
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "text_config": {"model_type": "kimi_k2", "hidden_size": 7168, "num_hidden_layers": 61,
                        "vocab_size": 163840}}))
    assert target_from_config(tmp_path / "k").family == "deepseek_v2"
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "config.json").write_text(json.dumps({
        "architectures": ["UnheardOfForCausalLM"], "model_type": "unheard_of",
        "hidden_size": 64, "num_hidden_layers": 8, "vocab_size": 100}))
    assert target_from_config(tmp_path / "u").family is None


def _profile(**change):
    data = json.loads(data_path("targets", "kimi-k2.json").read_text())
    data.update(change)
    return data


@pytest.mark.parametrize(
    "change,message",
    [
        ({"family": "no_such_family"}, "not a family of mappings/engines/families.json"),
        ({"family": "llama"}, "belong to 'deepseek_v2'"),
        ({"family": 7}, "'family' must be a non-empty string"),
    ],
)
def test_target_profile_family_is_validated(tmp_path, change, message):
    with pytest.raises(MappingFileError, match=message):
        load_target_file(_write(tmp_path, "kimi-k2", _profile(**change)))


def test_target_profile_without_family_is_refused(tmp_path):
    data = _profile()
    del data["family"]
    with pytest.raises(MappingFileError, match=r"missing keys \['family'\]"):
        load_target_file(_write(tmp_path, "kimi-k2", data))


# --------------------------------------------------------------------------- schema validation


@pytest.fixture
def rules_dir(tmp_path):
    folder = tmp_path / "engines"
    shutil.copytree(data_path("engines"), folder)
    return folder


def _edit(folder, name, fn):
    path = folder / f"{name}.json"
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))
    return path


def _load(folder):
    E.load_rules_folder.cache_clear()
    try:
        return E.load_rules_folder(folder)
    finally:
        E.load_rules_folder.cache_clear()


def test_copied_rules_load(rules_dir):
    fams, engs, names = _load(rules_dir)
    assert names["trtllm"] == "tensorrt-llm" and "deepseek_v2" in fams


def _rule(data, family, releases="*"):
    return next(r for r in data["rules"] if r["family"] == family and r["releases"] == releases)


BAD_SGLANG = [
    ("unknown top-level field", lambda d: d.update(extra=1), r"unknown fields \['extra'\]"),
    ("rule without why", lambda d: _rule(d, "*").pop("why"), r"rule 0: .*missing fields \['why'\]"),
    ("rule without source", lambda d: _rule(d, "*").pop("source"), r"missing fields \['source'\]"),
    ("empty why", lambda d: _rule(d, "*").update(why=" "), r"'why' must be a non-empty string"),
    ("unknown rule field", lambda d: _rule(d, "*").update(shift=1), r"unknown fields \['shift'\]"),
    ("unknown family", lambda d: _rule(d, "*").update(family="nope"), "family 'nope' is not in families.json"),
    ("unknown kind", lambda d: _rule(d, "*").update(explicit="plus_two"), "explicit 'plus_two' is not one of"),
    ("bad default kind", lambda d: _rule(d, "*").update(default="plus_one_if_first_is_1"), "default '"),
    ("non-boolean reach", lambda d: _rule(d, "*").update(embedding="no"), "'embedding' must be true or false"),
    ("overlapping ranges", lambda d: _rule(d, "deepseek_v2", "<0.5.13").update(releases="<0.5.14"), "overlap"),
    ("gap in the '*' rules", lambda d: _rule(d, "*").update(releases=">=0.5.13"), "gap"),
    ("bad range", lambda d: _rule(d, "*").update(releases="~0.5"), "bad release range"),
    ("empty range", lambda d: _rule(d, "deepseek_v2", "<0.5.13").update(releases=">=0.5.13,<0.5.13"), "empty"),
    ("releases out of order", lambda d: d["releases"].reverse(), "ascending"),
    ("unparsable release", lambda d: d["releases"].append("next"), "not a release number"),
    ("wrong engine name", lambda d: d.update(engine="sglang2"), "the file is named sglang.json"),
    ("bad default term", lambda d: d["default_ids"].update(ids=["2", "N/2"]), "'N/2' is not a number"),
    ("unsupported rule with a kind", lambda d: _rule(d, "minimax_m3", "<0.5.16").update(explicit="raw"),
     r"unknown fields \['explicit'\]"),
    ("capture ids without source", lambda d: d["capture_ids"][0].pop("source"), r"missing fields \['source'\]"),
    ("read with field and option", lambda d: d["capture_ids"][0]["read"][0].update(launch_option="x"),
     "exactly one of 'field' or 'launch_option'"),
    ("fc width without why", lambda d: d["fc_width"][0].pop("why"), r"missing fields \['why'\]"),
    ("fc width unknown drafter", lambda d: d["fc_width"][0].update(drafters=["medusa"]), "drafters must be among"),
    ("schema", lambda d: d.update(schema=2), "'schema' must be 1"),
    ("forward without source", lambda d: d["forward"][0].pop("source"), r"forward 0: .*missing fields \['source'\]"),
    ("forward bad value", lambda d: d["forward"][1].update(rope_interleave="sometimes"),
     r"'rope_interleave' must be one of \['config', 'always'\] or null"),
    ("forward missing a drafter", lambda d: d["forward"].pop(), "forward for mla drafters: the release ranges must cover"),
    ("no forward", lambda d: d.pop("forward"), r"missing fields \['forward'\]"),
]


@pytest.mark.parametrize("what,edit,message", BAD_SGLANG, ids=[b[0] for b in BAD_SGLANG])
def test_bad_engine_files_are_refused(rules_dir, what, edit, message):
    _edit(rules_dir, "sglang", edit)
    with pytest.raises(MappingFileError, match=message):
        _load(rules_dir)


def test_vllm_rules_must_name_known_runners(rules_dir):
    _edit(rules_dir, "vllm", lambda d: d["capture_ids"][0].update(runners=["mrv3"]))
    with pytest.raises(MappingFileError, match=r"unknown runners \['mrv3'\]"):
        _load(rules_dir)


def test_every_runner_needs_its_capture_fields(rules_dir):
    _edit(rules_dir, "vllm", lambda d: d["capture_ids"].pop())
    with pytest.raises(MappingFileError, match="capture_ids for runner v1"):
        _load(rules_dir)


def test_an_unpinned_engine_cannot_use_release_ranges(rules_dir):
    _edit(rules_dir, "tensorrt-llm", lambda d: d["rules"][0].update(releases=">=1.0"))
    with pytest.raises(MappingFileError, match="no releases read"):
        _load(rules_dir)


BAD_FAMILIES = [
    ("claimed twice", lambda d: d["families"][1]["architectures"].append("DeepseekV3ForCausalLM"),
     "'DeepseekV3ForCausalLM' belongs to both deepseek_v2 and glm4_moe_lite"),
    ("no why", lambda d: d["families"][0].pop("why"), r"missing fields \['why'\]"),
    ("unknown field", lambda d: d["families"][0].update(alias="x"), r"unknown fields \['alias'\]"),
    ("no architectures", lambda d: d["families"][0].update(architectures=[]), "list of non-empty strings"),
    ("reserved name", lambda d: d["families"][0].update(name="*"), "reserved or repeated"),
]


@pytest.mark.parametrize("what,edit,message", BAD_FAMILIES, ids=[b[0] for b in BAD_FAMILIES])
def test_bad_family_tables_are_refused(rules_dir, what, edit, message):
    _edit(rules_dir, "families", edit)
    with pytest.raises(MappingFileError, match=message):
        _load(rules_dir)


def test_a_removed_family_breaks_the_rules_that_name_it(rules_dir):
    _edit(rules_dir, "families", lambda d: d.update(families=[f for f in d["families"] if f["name"] != "gpt_oss"]))
    with pytest.raises(MappingFileError, match="family 'gpt_oss' is not in families.json"):
        _load(rules_dir)


def test_unreadable_rule_file(rules_dir):
    (rules_dir / "vllm.json").write_text("{not json")
    with pytest.raises(MappingFileError, match="cannot be read as JSON"):
        _load(rules_dir)


# --------------------------------------------------------------------------- releases


def test_parse_engine():
    assert str(E.parse_engine("sglang==0.5.23")) == "sglang 0.5.23"
    assert E.parse_engine("sglang==0.5.23").note is None
    assert E.parse_engine("sglang") == E.parse_engine(f"sglang=={NEWEST_SGLANG}")
    assert E.parse_engine("SGLang").version == v(NEWEST_SGLANG)
    rel = E.parse_engine("vllm==0.33:runner=v1")
    assert rel.spec == f"vllm=={NEWEST_VLLM}:runner=v1" and rel.label == f"vllm {NEWEST_VLLM}"
    assert E.parse_engine(rel.spec) == rel  # the spelling round-trips, no display text parsed
    assert E.parse_engine("vllm==0.33") == E.parse_engine("vllm==0.33.0")
    assert E.parse_engine("vllm==0.33").note is None
    for name in ("trtllm", "trt-llm", "tensorrt-llm"):
        assert E.parse_engine(name).engine == "tensorrt-llm" and E.parse_engine(name).note is None


def test_parse_engine_unknown_versions_say_how_they_are_read():
    new = E.parse_engine("sglang==9.5.40")
    assert new.version == v(NEWEST_SGLANG)
    assert new.note == f"sglang 9.5.40 is not known; read as {NEWEST_SGLANG}, the newest known"
    old = E.parse_engine("sglang==0.5.11")
    assert old.version == v(OLDEST_SGLANG) and "oldest known" in old.note
    between = E.parse_engine("sglang==0.5.13.post1")
    assert between.version == v("0.5.13.post1") and "rules of its release range apply" in between.note
    assert E.rule_for(between, "deepseek_v2").explicit == "plus_one_if_first_is_1"
    assert E.parse_engine("vllm==9.34.1").note == f"vllm 9.34.1 is not known; read as {NEWEST_VLLM}, the newest known"
    assert "not pinned to releases" in E.parse_engine("trtllm==1.2.0").note
    # the note reaches the capture result
    assert new.note in E.capture(new, nested([1, 2, 3]), "llama", 32).notes


@pytest.mark.parametrize("text", ["", "sglan", "sglang==", "sglang==zero", "vllm==1.2.3.4", "trtllm==x"])
def test_parse_engine_refuses_bad_input(text):
    with pytest.raises(UsageError):
        E.parse_engine(text)


def test_default_engines_come_from_the_data():
    assert [str(e) for e in E.default_engines()] == [f"sglang {OLDEST_SGLANG}", f"sglang {NEWEST_SGLANG}",
                                                     f"vllm {NEWEST_VLLM}", "tensorrt-llm"]
    assert E.edge_release("sglang", "oldest").spec == f"sglang=={OLDEST_SGLANG}"
    assert E.edge_release("sglang", "newest").spec == f"sglang=={NEWEST_SGLANG}"


def test_release_ranges():
    r = E.parse_range(">=0.5.13,<0.5.17")
    assert v("0.5.13") in r and v("0.5.16") in r and v("0.5.17") not in r and v("0.5.12.post1") not in r
    assert v("0.5.12.post1") in E.parse_range("<0.5.13")
    assert v("9.9") in E.parse_range("*")


# --------------------------------------------------------------------------- SGLang, every family x release


def sglang_expected(family, release, ids, n):
    """(boundaries or None, error-or-None) as docs/facts.md §9 states the SGLang rules."""
    ver = v(release)
    since = {"minimax_m3": "0.5.16", "minimax_m3_vl": "0.5.18", "glm5_next": "0.5.20"}
    if family in since and ver < v(since[family]):
        return "unsupported"
    if ids is None:
        ids = [2, n // 2, n - 3]
        shift = 1 if family == "minimax_m3_vl" else 0
    elif family in ("deepseek_v2", "glm4_moe_lite") and ver >= v("0.5.13"):
        shift = 1 if ids[0] == 1 else 0
    elif family == "gpt_oss" and ver >= v("0.5.17"):
        shift = 0 if max(ids) == n else 1
    else:
        shift = 1
    bounds = [i + shift for i in ids]
    embedding = family == "gpt_oss" and v("0.5.17") <= ver < v("0.5.21")
    final = (family == "gpt_oss" and ver >= v("0.5.17")) or (
        family in ("minimax_m3", "minimax_m3_vl") and ver >= v("0.5.23"))
    for b in bounds:
        if b < 0 or b > n or (b == 0 and not embedding) or (b == n and not final):
            return "error"
    return tuple(LayerRef(b - 1) for b in sorted(bounds))


def _id_lists(n):
    return [None, [1, n // 2 - 1, n - 4], [2, n // 2, n - 3], [3, n // 2 + 1, n - 2], [-1, 2, n // 2],
            [0, 5, 9], [1, 5, n - 1], [2, 5, n - 1], [2, 5, n], [1, 5, n], [n - 3, 2, n // 2]]


@pytest.mark.parametrize("release", SGLANG_RELEASES)
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_sglang_rules_per_family_and_release(family, release):
    rel = E.parse_engine(f"sglang=={release}")
    for n in (61, 36):
        for ids in _id_lists(n):
            config = {} if ids is None else nested(ids)
            got = E.capture(rel, config, family, n)
            want = sglang_expected(family, release, ids, n)
            label = f"{family} {release} n={n} ids={ids}: {_summary(got)}"
            if want in ("unsupported", "error"):
                assert not got.ok and got.layers is None, label
                if want == "unsupported":
                    assert "cannot serve an EAGLE-3 drafter" in got.error.message, label
                    continue
            else:
                assert got.ok and got.layers == want, label
            assert got.reads == (NESTED if ids is not None else "default")
            assert got.fell_back == (ids is None)
            assert got.why and got.source


def test_sglang_reads_only_the_nested_ids():
    got = E.capture("sglang==0.5.23", top([2, 30, 58]), "llama", 61)
    assert got.fell_back and got.reads == "default" and NESTED in got.fallback_why
    assert got.layers == outputs(1, 29, 57)
    # the top-level ids sized nothing: the Llama drafter's fc comes from the nested ids or 3
    assert (got.fc_field, got.fc_slots) == ("default (3)", 3)


def test_sglang_use_aux_hidden_state_false_captures_nothing():
    got = E.capture("sglang==0.5.23", {"eagle_config": {"use_aux_hidden_state": False,
                                                        "eagle_aux_hidden_state_layer_ids": [1, 2, 3]}},
                    "llama", 32)
    assert not got.ok and "use_aux_hidden_state is false" in got.error.message


def test_sglang_empty_ids_capture_nothing():
    got = E.capture("sglang==0.5.23", nested([]), "llama", 32)
    assert not got.ok and "empty list" in got.error.message


def test_non_integer_ids_are_an_error_not_a_crash():
    got = E.capture("sglang==0.5.23", nested([1, "2", 3]), "llama", 32)
    assert not got.ok and "not a list of integer ids" in got.error.message
    got = E.capture("vllm", {"eagle_aux_hidden_state_layer_ids": "2,30,58"}, "llama", 61)
    assert not got.ok and "not a list of integer ids" in got.error.message


def test_repeated_ids_are_an_error():
    got = E.capture("vllm", top([2, 2, 30]), "llama", 61)
    assert not got.ok and "named twice" in got.error.message


def test_ids_out_of_depth_order_are_captured_in_depth_order():
    got = E.capture("vllm", top([30, 2, 58]), "llama", 61)
    assert got.ok and got.layers == outputs(1, 29, 57)
    assert any("depth order" in n for n in got.notes)


def test_mla_drafter_fc_width_reads_top_level_ids_on_sglang():
    config = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], **top([1, 2, 3, 4])}
    got = E.capture("sglang==0.5.23", config, "deepseek_v2", 61)
    assert (got.fc_field, got.fc_slots) == (TOP, 4)
    assert not got.ok and "sizes the drafter's fc for 4" in got.error.message


def test_num_aux_hidden_states_sizes_fc():
    got = E.capture("sglang==0.5.23", {"num_aux_hidden_states": 3, **nested([1, 2, 3, 4])}, "llama", 32)
    assert (got.fc_field, got.fc_slots) == ("num_aux_hidden_states", 3)
    assert not got.ok and "captures 4 states" in got.error.message


def test_minimax_m3_vl_shifts_its_default():
    got = E.capture("sglang==0.5.23", {}, "minimax_m3_vl", 60)
    assert got.fell_back and got.kind == "plus_one" and got.layers == outputs(2, 30, 57)
    assert E.capture("sglang==0.5.23", {}, "minimax_m2", 60).layers == outputs(1, 29, 56)
    assert not E.capture("sglang==0.5.17", {}, "minimax_m3_vl", 60).ok


def test_gpt_oss_max_rule():
    n = 36
    raw_ids, plus_ids = [2, 18, n], [1, 17, n - 1]
    for release in ("0.5.17", "0.5.21", "0.5.23"):
        assert E.capture(f"sglang=={release}", nested(raw_ids), "gpt_oss", n).layers == outputs(1, 17, 35)
        assert E.capture(f"sglang=={release}", nested(plus_ids), "gpt_oss", n).layers == outputs(1, 17, 35)
    old = E.capture("sglang==0.5.16", nested(raw_ids), "gpt_oss", n)
    assert not old.ok and "before layer 37" in old.error.message
    old = E.capture("sglang==0.5.16", nested(plus_ids), "gpt_oss", n)
    assert not old.ok and "output of the last layer" in old.error.message
    # boundary 0 (the embedding output): read in 0.5.17-0.5.20 only
    assert E.capture("sglang==0.5.17", nested([-1, 17, 34]), "gpt_oss", n).layers == (EMBEDDING, *outputs(17, 34))
    assert not E.capture("sglang==0.5.23", nested([-1, 17, 34]), "gpt_oss", n).ok


def test_unknown_family_reads_with_the_common_rule_and_says_so():
    got = E.capture("sglang==0.5.23", nested([2, 30, 58]), None, 61)
    assert got.layers == outputs(2, 30, 58)
    assert any("family is not known" in n for n in got.notes)
    with pytest.raises(UsageError, match="unknown target family 'deepseek'"):
        E.capture("sglang==0.5.23", nested([2, 30, 58]), "deepseek", 61)


def test_bad_runner_and_layer_count():
    with pytest.raises(UsageError, match="no runner choice"):
        E.capture("sglang", {}, "llama", 32, runner="v1")
    with pytest.raises(UsageError, match="unknown vLLM runner 'v3'"):
        E.capture("vllm", {}, "llama", 32, runner="v3")
    with pytest.raises(UsageError, match="positive integer"):
        E.capture("vllm", {}, "llama", 0)


# --------------------------------------------------------------------------- vLLM


@pytest.mark.parametrize("runner", ["mrv2", "v1", None])
@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_moe", "gpt_oss", "minimax_m2", "deepseek_v2"])
def test_vllm_rules(runner, family):
    n = 61
    rel = E.parse_engine("vllm==0.33.0")
    got = E.capture(rel, top([2, 30, 58]), family, n, runner)
    assert (got.reads, got.kind, got.layers) == (TOP, "raw", outputs(1, 29, 57))
    assert got.runner == (runner or "mrv2")
    got = E.capture(rel, top([2, 30, n]), family, n, runner)  # id N: the last layer's output
    assert got.layers == outputs(1, 29, 60)
    got = E.capture(rel, top([0, 30, 58]), family, n, runner)  # id 0: the embedding output
    if family == "deepseek_v2":
        assert not got.ok and "embedding output" in got.error.message
    else:
        assert got.layers == (EMBEDDING, *outputs(29, 57))
    assert not E.capture(rel, top([2, 30, n + 1]), family, n, runner).ok
    # nested ids only: the default runner falls back to the model default, the V1 runner reads them raw
    got = E.capture(rel, nested([1, 29, 57]), family, n, runner)
    if runner == "v1":
        assert (got.reads, got.fell_back, got.layers) == (NESTED, False, outputs(0, 28, 56))
    else:
        assert got.fell_back and got.layers == outputs(1, 29, 57)
        assert TOP in got.fallback_why and "eagle_config.layer_ids" in got.fallback_why


def test_vllm_fallback_fields():
    assert E.capture("vllm", {"eagle_config": {"layer_ids": [2, 30, 58]}}, "llama", 61).reads == "eagle_config.layer_ids"
    got = E.capture("vllm", {"dflash_config": {"target_layer_ids": [1, 29, 57]}}, "llama", 61)
    assert got.reads == "dflash_config.target_layer_ids" and got.layers == outputs(1, 29, 57)
    got = E.capture("vllm", {**top([]), **nested([2, 30, 58])}, "llama", 61, "v1")
    assert got.reads == NESTED  # an empty top-level list counts as absent


def test_vllm_fc_width_never_comes_from_the_top_level_ids():
    got = E.capture("vllm", top([2, 20, 30, 58]), "llama", 61)
    assert (got.fc_field, got.fc_slots) == ("default (3)", 3)
    assert not got.ok and "captures 4 states but sizes the drafter's fc for 3" in got.error.message
    got = E.capture("vllm", both([2, 20, 30, 58]), "llama", 61)
    assert got.ok and (got.fc_field, got.fc_slots) == (NESTED, 4)


@pytest.mark.parametrize("family", ["glm4_moe_lite", "glm4_moe", "gemma3", "qwen2_moe"])
def test_vllm_unsupported_families(family):
    got = E.capture("vllm", top([2, 30, 58]), family, 61)
    assert not got.ok and "cannot serve an EAGLE-3 drafter" in got.error.message


# --------------------------------------------------------------------------- TensorRT-LLM


def test_tensorrt_llm_reads_its_launch_option():
    got = E.capture("trtllm", both([9, 9, 9]), "deepseek_v2", 61, launch_ids=[1, 29, 57])
    assert got.reads == "launch option eagle3_layers_to_capture" and got.layers == outputs(1, 29, 57)
    got = E.capture("trtllm", both([2, 30, 58]), "deepseek_v2", 61)
    assert got.fell_back and got.layers == outputs(1, 29, 57)
    assert E.capture("trtllm", {}, "llama", 32, launch_ids=[1, 15, 31]).layers == outputs(1, 15, 31)
    assert not E.capture("trtllm", {}, "llama", 32, launch_ids=[-1, 15, 30]).ok
    assert E.capture("trtllm", {}, "llama", 32).fc_field is None  # not known for this engine


# --------------------------------------------------------------------------- the seed incident


def test_seed_incident_kimi_drafter_trained_on_outputs_2_30_58():
    kimi = get_target("kimi-k2.5")
    n, fam, trained = kimi.num_hidden_layers, kimi.family, outputs(2, 30, 58)
    old, new = E.parse_engine("sglang==0.5.12"), E.parse_engine("sglang==0.5.13")

    # [-1, 2, 30]: the embedding output in slot 0 -- unusable on SGLang before and after
    for rel in (old, new):
        assert not E.capture(rel, nested([-1, 2, 30]), fam, n).ok
    # [2, 30, 58]: right before the first-id rule, one layer off after it
    assert E.capture(old, nested([2, 30, 58]), fam, n).layers == trained
    assert E.capture(new, nested([2, 30, 58]), fam, n).layers == outputs(1, 29, 57)
    # [3, 31, 59]: one off before, right after
    assert E.capture(old, nested([3, 31, 59]), fam, n).layers == outputs(3, 31, 59)
    assert E.capture(new, nested([3, 31, 59]), fam, n).layers == trained
    # so no single nested list serves both; ids_for says what each release needs
    assert E.ids_for(old, fam, n, trained) == (2, 30, 58)
    assert E.ids_for(new, fam, n, trained) == (3, 31, 59)
    assert E.ids_for("vllm", fam, n, trained) == (3, 31, 59)
    # the other families never had the first-id rule: [2, 30, 58] is right on every release
    for release in SGLANG_RELEASES:
        assert E.capture(f"sglang=={release}", nested([2, 30, 58]), "llama", n).layers == trained


# --------------------------------------------------------------------------- TorchSpec's Kimi worked example


def _verdicts(config, trained):
    fam, n = "deepseek_v2", 61
    out = {}
    for label, rel, runner in [("sglang<=0.5.12", "sglang==0.5.12", None), ("sglang>=0.5.13", "sglang==0.5.13", None),
                               ("sglang 0.5.23", "sglang==0.5.23", None), ("vllm mrv2", "vllm", "mrv2"),
                               ("vllm v1", "vllm", "v1"), ("trtllm", "trtllm", None)]:
        got = E.capture(rel, config, fam, n, runner)
        out[label] = ("right" if got.layers == trained else "off", got.fell_back)
    return out


def test_torchspec_training_config_nested_1_29_57():
    # trained on the entries of layers 2, 30, 58 = the outputs of layers 1, 29, 57
    trained = outputs(1, 29, 57)
    assert _verdicts(nested([1, 29, 57]), trained) == {
        "sglang<=0.5.12": ("right", False),
        "sglang>=0.5.13": ("right", False),  # first id 1 -> +1
        "sglang 0.5.23": ("right", False),
        "vllm mrv2": ("right", True),  # no top-level ids: the model default, right by luck
        "vllm v1": ("off", False),  # reads the nested ids raw: entries 1, 29, 57
        "trtllm": ("right", True),
    }
    assert E.capture("vllm", nested([1, 29, 57]), "deepseek_v2", 61, "v1").layers == outputs(0, 28, 56)


def test_torchspec_vllm_export_top_level_and_nested_2_30_58():
    trained = outputs(1, 29, 57)
    assert _verdicts(both([2, 30, 58]), trained) == {
        "sglang<=0.5.12": ("off", False),  # +1 -> entries 3, 31, 59: the regression PR #25454 fixed
        "sglang>=0.5.13": ("right", False),  # first id 2 -> raw
        "sglang 0.5.23": ("right", False),
        "vllm mrv2": ("right", False),
        "vllm v1": ("right", False),
        "trtllm": ("right", True),
    }
    assert E.capture("sglang==0.5.12", both([2, 30, 58]), "deepseek_v2", 61).layers == outputs(2, 30, 58)


# --------------------------------------------------------------------------- ids_for


def _all_releases():
    out = [(E.parse_engine(f"sglang=={r}"), None) for r in SGLANG_RELEASES]
    out += [(E.parse_engine("vllm"), "mrv2"), (E.parse_engine("vllm"), "v1"), (E.parse_engine("trtllm"), None)]
    return out


def _config_with(rel, runner, ids):
    where = E.id_field(rel, runner)
    if not where.in_config:
        return {}, list(ids)
    config: dict = {}
    node = config
    *parents, leaf = where.name.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = list(ids)
    return config, None


def _layer_sets(n):
    return [outputs(1, n // 2 - 1, n - 4), outputs(2, 30 % n, n - 3), outputs(0, 5, 9), outputs(1, 5, n - 1),
            outputs(3, 5, n - 1), (EMBEDDING, *outputs(5, 9)), outputs(9, 5, 20), outputs(1, 5, n - 2)]


@pytest.mark.parametrize("family", FAMILY_NAMES + [None])
def test_ids_for_round_trips_capture(family):
    for (rel, runner), n in itertools.product(_all_releases(), (61, 36)):
        for layers in _layer_sets(n):
            ids = E.ids_for(rel, family, n, layers, runner)
            label = f"{rel} {runner} {family} n={n} {layers} -> {ids}"
            if ids is not None:
                config, launch = _config_with(rel, runner, ids)
                got = E.capture(rel, config, family, n, runner, launch_ids=launch)
                assert got.ok and got.layers == layers, label
                continue
            # None: no id list works. Each rule shifts a whole list by 0 or 1, so an id list
            # capturing `layers` must take each id from {b-1, b} (b = output + 1): try them all.
            for combo in itertools.product(*[(r.output_of, r.output_of + 1) for r in layers]):
                config, launch = _config_with(rel, runner, combo)
                got = E.capture(rel, config, family, n, runner, launch_ids=launch)
                assert got.layers != layers, f"{label}, but {combo} works"


def test_ids_for_none_where_no_id_list_works():
    n = 61
    # DeepSeek-family SGLang >= 0.5.13 cannot capture the output of layer 0 in the first slot
    assert E.ids_for("sglang==0.5.13", "deepseek_v2", n, outputs(0, 29, 57)) is None
    assert E.ids_for("sglang==0.5.12", "deepseek_v2", n, outputs(0, 29, 57)) == (0, 29, 57)
    # SGLang never reaches the embedding output, nor (most families) the last layer's output
    assert E.ids_for("sglang", "llama", n, (EMBEDDING, *outputs(5, 9))) is None
    assert E.ids_for("sglang", "llama", n, outputs(1, 29, 60)) is None
    assert E.ids_for("sglang==0.5.23", "gpt_oss", n, outputs(1, 29, 60)) == (1, 29, 60)
    assert E.ids_for("sglang==0.5.16", "gpt_oss", n, outputs(1, 29, 60)) is None
    # vLLM reaches both ends, except the DeepSeek model's embedding output
    assert E.ids_for("vllm", "llama", n, (EMBEDDING, *outputs(5, 60))) == (0, 6, 61)
    assert E.ids_for("vllm", "deepseek_v2", n, (EMBEDDING, *outputs(5, 9))) is None
    # engines deliver depth order: a drafter trained on another order cannot be served
    assert E.ids_for("vllm", "llama", n, outputs(29, 1, 57)) is None
    # families an engine cannot serve
    assert E.ids_for("vllm", "glm4_moe_lite", n, outputs(1, 29, 57)) is None
    assert E.ids_for("sglang==0.5.15", "minimax_m3", n, outputs(1, 29, 57)) is None


def test_id_field():
    assert E.id_field("sglang") == E.IdField("config", NESTED)
    assert E.id_field("vllm") == E.IdField("config", TOP) == E.id_field("vllm", "v1")
    trt = E.id_field("trtllm")
    assert trt == E.IdField("launch_option", "eagle3_layers_to_capture") and not trt.in_config
    assert str(trt) == "launch option eagle3_layers_to_capture"


# --------------------------------------------------------------------------- docs


def test_facts_section_9_names_every_rule_kind_family_and_engine_file():
    text = (ROOT / "docs" / "facts.md").read_text()
    section = text[text.index("## §9"):]
    for kind in E.EXPLICIT_KINDS:
        assert f"`{kind}`" in section, kind
    for family in E.families():
        assert f"`{family}`" in section, family
    for name in ("sglang.json", "vllm.json", "tensorrt-llm.json", "families.json", "0.5.13", "0.5.17"):
        assert name in section, name


def test_forward_rules_per_engine():
    """issue 11: how each engine runs the drafter where engines differ (docs/facts.md §9)."""
    mla = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "rope_interleave": False, "norm_before_residual": True}
    names = {"lm_head.weight", "embed_tokens.weight"}
    sg, vl, trt = (E.serving(e, mla, names) for e in ("sglang", "vllm==0.33.0", "trtllm"))
    assert (sg.rope_interleave, sg.norm_before_residual, sg.own_embedding) == (False, False, "never")
    assert (vl.rope_interleave, vl.norm_before_residual, vl.own_embedding) == (True, True, "unless_equal")
    assert any("SGLang ignores it" in d for d in sg.differences)
    assert any("vLLM always runs interleaved RoPE" in d for d in vl.differences)
    assert sg.not_emulated and "target's lm_head" in sg.not_emulated[0]  # no draft_vocab_size
    assert not vl.not_emulated and trt.not_read and not sg.not_read
    llama = {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 32000}
    sg, vl = E.serving("sglang", llama, {"lm_head.weight"}), E.serving("vllm", llama, {"lm_head.weight"})
    assert sg.rope_interleave is None and vl.own_embedding == "never"  # no embed_tokens: the target's
    assert not sg.differences and not vl.differences and not sg.not_emulated


# --------------------------------------------------------------------------- the SGLang ids to write (issue 11)
# One copy of the id conventions: the ids eagle3conv writes, and the card's, come from the engine rules.

KIMI_N = 61


def _served(*specs):
    return tuple(E.parse_engine(x) for x in specs)


def test_plan_portable_default():
    plan = E.plan_ids(outputs(1, 29, 57), "deepseek_v2", KIMI_N, E.default_engines())
    assert dict((w.name, ids) for w, ids in plan.fields) == {NESTED: (1, 29, 57), TOP: (2, 30, 58)}
    assert dict((w.name, ids) for w, ids in plan.launch) == {"eagle3_layers_to_capture": (1, 29, 57)}


def test_plan_kimi_drafter_trained_on_outputs_2_30_58():
    """0.5.12 needs [2, 30, 58], 0.5.13 and later [3, 31, 59]: no list serves both; the first
    release given (the priority) decides, and each release's need is kept."""
    old, new = E.parse_engine(f"sglang=={OLDEST_SGLANG}"), E.parse_engine("sglang")
    plan = E.plan_ids(outputs(2, 30, 58), "deepseek_v2", KIMI_N, (new, old))
    assert plan.ids(E.id_field(new)) == (3, 31, 59)
    assert plan.need(old) == (2, 30, 58) and plan.need(new) == (3, 31, 59)
    plan = E.plan_ids(outputs(2, 30, 58), "deepseek_v2", KIMI_N, (old, new))
    assert plan.ids(E.id_field(old)) == (2, 30, 58)


def test_plan_falls_back_to_the_release_that_can():
    old, new = E.parse_engine(f"sglang=={OLDEST_SGLANG}"), E.parse_engine("sglang")
    plan = E.plan_ids(outputs(0, 29, 57), "deepseek_v2", KIMI_N, (new, old))
    assert plan.ids(E.id_field(old)) == (0, 29, 57) and plan.need(new) is None


def test_plan_follows_the_family_not_one_rule_for_all():
    """SGLang's llama.py adds 1 in every release: for a Llama target every release reads [2, 30, 58]
    as outputs 2, 30, 58, and [3, 31, 59] names outputs 3, 31, 59."""
    plan = E.plan_ids(outputs(2, 30, 58), "llama", 80, _served(f"sglang=={OLDEST_SGLANG}", "sglang"))
    assert plan.fields == ((E.IdField("config", NESTED), (2, 30, 58)),)
    assert E.capture("sglang", nested([3, 31, 59]), "llama", 80).layers == outputs(3, 31, 59)


def test_plan_serves_every_release_whenever_one_list_can():
    """For random layer sets: the planned list makes every release reading the field capture the set
    whenever some single list does (checked against every candidate list)."""
    rng = random.Random("plan")
    rels = E.default_engines()
    for family in ("deepseek_v2", "llama", "gpt_oss", "minimax_m3_vl"):
        for n in (8, 32, 61):
            for _ in range(30):
                refs = tuple(sorted(LayerRef(i) for i in rng.sample(range(0, n - 1), rng.randint(1, 4))))
                plan = E.plan_ids(refs, family, n, rels)
                for where, ids in plan.fields:
                    readers = [r for r in rels if E.id_field(r) == where]
                    got = sum(E.capture(r, _config_with(r, None, ids)[0], family, n).layers == refs for r in readers)
                    best = max(sum(E.capture(r, _config_with(r, None, need)[0], family, n).layers == refs
                                   for r in readers) for _, need in plan.needs if need is not None)
                    assert got == best, (family, n, refs, where, ids)


def test_capture_and_ids_without_a_layer_count():
    """The target's layer count unknown: explicit ids are read all the same; the default list and the
    largest-id rule cannot be told, and the capture says so."""
    got = E.capture("sglang", nested([1, 14, 26]), "llama", None)
    assert got.layers == outputs(1, 14, 26) and any("not checked" in note for note in got.notes)
    assert E.ids_for("vllm", "llama", None, outputs(1, 14, 26)) == (2, 15, 27)
    dflt = E.capture("sglang", {}, "llama", None)
    assert dflt.layers is None and dflt.error is None and dflt.fell_back and "--target" in dflt.unknown
    gpt = E.capture("sglang", nested([1, 17, 36]), "gpt_oss", None)
    assert gpt.layers is None and "layer count" in gpt.unknown
    assert E.ids_for("sglang", "gpt_oss", None, outputs(1, 17, 30)) is None  # the rule needs the count
    assert E.plan_ids(outputs(1, 14, 26), "llama", None, E.default_engines()).fields
