"""Target profiles (mappings/targets/*.json) and target config readers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3conv.io.data import data_path
from eagle3conv.errors import CheckpointReadError, MappingFileError, UsageError
from eagle3conv.spec import targets
from eagle3conv.spec.engines import default_capture, default_engines
from eagle3conv.spec.layers import outputs
from eagle3conv.spec.targets import (
    NUMBERS,
    TargetProfile,
    list_targets,
    get_target,
    load_target_file,
    target_from_config,
    target_names,
)

# docs/facts.md §7, copied: name -> (architectures[0], hidden, layers, vocab)
FACTS_TABLE = {
    "kimi-k2.5": ("KimiK25ForConditionalGeneration", 7168, 61, 163840),
    "kimi-k2": ("DeepseekV3ForCausalLM", 7168, 61, 163840),
    "deepseek-v3": ("DeepseekV3ForCausalLM", 7168, 61, 129280),
    "llama-3.1-8b": ("LlamaForCausalLM", 4096, 32, 128256),
    "llama-3.3-70b": ("LlamaForCausalLM", 8192, 80, 128256),
    "qwen3-8b": ("Qwen3ForCausalLM", 4096, 36, 151936),
    "qwen3-32b": ("Qwen3ForCausalLM", 5120, 64, 151936),
    "qwen3-235b-a22b": ("Qwen3MoeForCausalLM", 4096, 94, 151936),
    "gpt-oss-120b": ("GptOssForCausalLM", 2880, 36, 201088),
    "smollm2-135m": ("LlamaForCausalLM", 576, 30, 49152),
}


# --------------------------------------------------------------------------- built-in profiles


def test_every_profile_file_loads():
    files = sorted(p.stem for p in data_path("targets").glob("*.json"))
    assert files == sorted(FACTS_TABLE)
    assert target_names() == tuple(sorted(FACTS_TABLE))
    for name in files:
        profile = load_target_file(data_path("targets", f"{name}.json"))
        assert isinstance(profile, TargetProfile) and profile.name == name


@pytest.mark.parametrize("name", sorted(FACTS_TABLE))
def test_profiles_match_the_facts_table(name):
    arch, hidden, layers, vocab = FACTS_TABLE[name]
    profile = get_target(name)
    assert profile.architectures[0] == arch
    assert (profile.hidden_size, profile.num_hidden_layers, profile.vocab_size) == (
        hidden,
        layers,
        vocab,
    )
    # the facts doc is a source of exactly those three numbers
    numbers = profile.sources["numbers"]
    for key in ("hidden_size", "num_hidden_layers", "vocab_size"):
        assert "facts" in numbers[key]
    assert (
        profile.sources["upstream"]
        == f"https://huggingface.co/{profile.hf_repo}/blob/main/config.json"
    )


@pytest.mark.parametrize("profile", list_targets(), ids=lambda p: p.name)
def test_profile_numbers_are_consistent(profile):
    if profile.head_dim is None:  # MLA targets
        assert profile.model_type in ("kimi_k25", "kimi_k2", "deepseek_v3")
    else:
        assert profile.num_attention_heads % profile.num_key_value_heads == 0
        if "llama" in profile.name:
            assert profile.head_dim * profile.num_attention_heads == profile.hidden_size
    n = profile.num_hidden_layers  # every default release captures the same states for the built-in targets
    assert {default_capture(r, profile.family, n).layers for r in default_engines()} == {
        outputs(1, n // 2 - 1, n - 4)}


def test_kimi_defaults_through_the_profile():
    p = get_target("kimi-k2.5")
    assert default_capture("vllm", p.family, p.num_hidden_layers).ids == (2, 30, 58)
    assert default_capture("sglang", p.family, p.num_hidden_layers).layers == outputs(1, 29, 57)


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("kimi-k2.5", "kimi-k2.5"),
        ("Kimi-K2.6", "kimi-k2.5"),
        ("moonshotai/Kimi-K2.5", "kimi-k2.5"),
        ("deepseek-r1", "deepseek-v3"),
        ("meta-llama/Llama-3.1-70B-Instruct", "llama-3.3-70b"),
        (" QWEN/qwen3-8b ", "qwen3-8b"),
        ("smollm2-135m-instruct", "smollm2-135m"),
    ],
)
def test_load_by_name_alias_or_repo(query, name):
    assert get_target(query).name == name


def test_unknown_target_lists_known_names():
    with pytest.raises(UsageError) as err:
        get_target("llama-2-7b")
    assert "llama-2-7b" in err.value.message
    for name in FACTS_TABLE:
        assert name in err.value.message


def test_profiles_are_frozen():
    profile = get_target("qwen3-8b")
    with pytest.raises(AttributeError):
        profile.hidden_size = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        profile.sources["upstream"] = "x"  # type: ignore[index]


# --------------------------------------------------------------------------- schema errors


def _good() -> dict:
    return json.loads(data_path("targets", "qwen3-8b.json").read_text(encoding="utf-8"))


def _write(folder: Path, data: object, name: str = "qwen3-8b") -> Path:
    path = folder / f"{name}.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def _mutations():
    def drop(key):
        return lambda d: d.pop(key)

    def put(key, value):
        return lambda d: d.__setitem__(key, value)

    def src(key, value):
        return lambda d: d["sources"].__setitem__(key, value)

    return {
        "missing hidden_size": drop("hidden_size"),
        "unknown key": put("hidden_sise", 4096),
        "name not file name": put("name", "qwen3-9b"),
        "zero layers": put("num_hidden_layers", 0),
        "string vocab": put("vocab_size", "151936"),
        "bool number": put("hidden_size", True),
        "null required": put("vocab_size", None),
        "empty architectures": put("architectures", []),
        "aliases not a list": put("aliases", "qwen"),
        "empty description": put("description", " "),
        "bad text_config_key": put("text_config_key", 3),
        "sources not object": put("sources", []),
        "upstream not url": src("upstream", "config.json"),
        "number without source": lambda d: d["sources"]["numbers"].pop("head_dim"),
        "source for a null number": lambda d: d.__setitem__("head_dim", None),
        "unknown reference": lambda d: d["sources"]["numbers"].__setitem__("head_dim", ["nowhere"]),
        "single source not flagged": lambda d: d["sources"]["numbers"].__setitem__(
            "head_dim", ["llmprof"]
        ),
        "flagged but checked": src("unchecked", ["hidden_size"]),
        "unknown sources key": src("checked_by", "me"),
        "notes not text": src("notes", ["a"]),
    }


@pytest.mark.parametrize("mutation", sorted(_mutations()))
def test_schema_errors_are_caught(tmp_path, mutation):
    data = _good()
    _mutations()[mutation](data)
    with pytest.raises(MappingFileError) as err:
        load_target_file(_write(tmp_path, data))
    assert "qwen3-8b.json" in err.value.message


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", ""])
def test_unreadable_profile_files(tmp_path, text):
    with pytest.raises(MappingFileError):
        load_target_file(_write(tmp_path, text))


def test_single_source_numbers_must_be_flagged(tmp_path):
    data = _good()
    data["sources"]["numbers"]["head_dim"] = ["llmprof"]
    data["sources"]["unchecked"] = sorted([*data["sources"]["unchecked"], "head_dim"])
    assert load_target_file(_write(tmp_path, data)).head_dim == 128


def test_optional_numbers_may_be_null(tmp_path):
    data = _good()
    data["head_dim"] = None
    del data["sources"]["numbers"]["head_dim"]
    assert load_target_file(_write(tmp_path, data)).head_dim is None


def test_alias_claimed_twice_is_an_error(tmp_path):
    _write(tmp_path, _good())
    other = _good()
    other["name"] = "qwen3-8b-copy"
    other["hf_repo"] = "someone/else"
    _write(tmp_path, other, "qwen3-8b-copy")  # same alias Qwen/Qwen3-8B-Base
    with pytest.raises(MappingFileError, match="claimed by both"):
        targets.index_targets(tmp_path)


# --------------------------------------------------------------------------- target_from_config

LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
}

KIMI_K25_CONFIG = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config"},
    "model_type": "kimi_k25",
    "text_config": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "num_attention_heads": 64,
        "num_hidden_layers": 61,
        "max_position_embeddings": 262144,
        "num_key_value_heads": 64,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "vocab_size": 163840,
    },
    "vision_config": {"vt_hidden_size": 1152, "vt_num_hidden_layers": 27},
}


def _model_dir(tmp_path: Path, name: str, config: object) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def test_plain_llama_folder(tmp_path):
    profile = target_from_config(_model_dir(tmp_path, "Llama-3.1-8B-Instruct", LLAMA_CONFIG))
    assert profile.name == "Llama-3.1-8B-Instruct"
    assert (profile.hidden_size, profile.num_hidden_layers, profile.vocab_size) == (
        4096,
        32,
        128256,
    )
    assert (profile.num_attention_heads, profile.num_key_value_heads) == (32, 8)
    assert profile.head_dim == 128  # derived by transformers
    assert profile.intermediate_size == 14336
    assert profile.architectures == ("LlamaForCausalLM",) and profile.text_config_key is None
    assert default_capture("trtllm", profile.family, profile.num_hidden_layers).ids == (1, 15, 28)


def test_config_file_path_and_name(tmp_path):
    folder = _model_dir(tmp_path, "my-llama", LLAMA_CONFIG)
    assert target_from_config(folder / "config.json").name == "my-llama"
    odd = tmp_path / "Kimi-K2-Instruct-config.json"
    odd.write_text(json.dumps(LLAMA_CONFIG), encoding="utf-8")
    assert target_from_config(odd).name == "Kimi-K2-Instruct-config"


def test_kimi_k25_nested_text_config(tmp_path):
    profile = target_from_config(_model_dir(tmp_path, "Kimi-K2.5", KIMI_K25_CONFIG))
    builtin = get_target("kimi-k2.5")
    assert profile.name == "Kimi-K2.5"
    assert profile.text_config_key == "text_config"
    assert profile.architectures == builtin.architectures and profile.model_type == "kimi_k25"
    for key in NUMBERS:
        assert getattr(profile, key) == getattr(builtin, key), key


@pytest.mark.parametrize("key", ["language_config", "llm_config"])
def test_other_nested_text_configs(tmp_path, key):
    config = {"architectures": ["SomeVLModel"], "model_type": "some_vl", key: LLAMA_CONFIG}
    profile = target_from_config(_model_dir(tmp_path, "vl", config))
    assert profile.text_config_key == key and profile.num_hidden_layers == 32


def test_model_type_transformers_does_not_know(tmp_path):
    config = dict(LLAMA_CONFIG, model_type="brand_new_lm", architectures=["BrandNewForCausalLM"])
    profile = target_from_config(_model_dir(tmp_path, "new", config))
    assert (profile.hidden_size, profile.num_hidden_layers, profile.vocab_size) == (
        4096,
        32,
        128256,
    )
    assert profile.head_dim is None  # not in the file, and nothing derives it


def test_transformers_attribute_names(tmp_path):
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "vocab_size": 50257,
    }
    profile = target_from_config(_model_dir(tmp_path, "gpt2", config))
    assert (profile.hidden_size, profile.num_hidden_layers, profile.num_attention_heads) == (
        768,
        12,
        12,
    )


def test_mla_config_has_no_head_dim(tmp_path):
    config = dict(KIMI_K25_CONFIG["text_config"], model_type="deepseek_v3")
    profile = target_from_config(_model_dir(tmp_path, "dsv3", config))
    assert profile.head_dim is None and profile.num_hidden_layers == 61


def test_no_library_default_slips_in(tmp_path):
    config = {k: v for k, v in LLAMA_CONFIG.items() if k != "vocab_size"}
    with pytest.raises(CheckpointReadError, match="vocab_size"):
        target_from_config(_model_dir(tmp_path, "novocab", config))


@pytest.mark.parametrize("profile", list_targets(), ids=lambda p: p.name)
def test_builtin_profiles_round_trip_through_a_config(tmp_path, profile):
    text = {k: getattr(profile, k) for k in NUMBERS if getattr(profile, k) is not None}
    if profile.head_dim is None:
        text["kv_lora_rank"] = 512
    config = {"architectures": list(profile.architectures), "model_type": profile.model_type}
    if profile.text_config_key:
        config[profile.text_config_key] = text
    else:
        config.update(text)
    read = target_from_config(_model_dir(tmp_path, profile.name, config))
    for key in NUMBERS:
        assert getattr(read, key) == getattr(profile, key), key


def test_missing_config(tmp_path):
    with pytest.raises(CheckpointReadError, match="no target config"):
        target_from_config(tmp_path)
    with pytest.raises(CheckpointReadError):
        target_from_config(tmp_path / "nowhere" / "config.json")


@pytest.mark.parametrize("text", ["{broken", "[1, 2, 3]", '"llama"'])
def test_malformed_config(tmp_path, text):
    (tmp_path / "config.json").write_text(text, encoding="utf-8")
    with pytest.raises(CheckpointReadError):
        target_from_config(tmp_path)


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "siglip_vision_model", "image_size": 224},
        dict(LLAMA_CONFIG, model_type="unknown_lm", hidden_size="4096"),
        dict(LLAMA_CONFIG, model_type="unknown_lm", num_hidden_layers=0),
    ],
)
def test_configs_without_usable_numbers(tmp_path, config):
    with pytest.raises(CheckpointReadError):
        target_from_config(_model_dir(tmp_path, "bad", config))


# --------------------------------------------------------------------------- the command's verdict (issue 27)


def _targets_json(*args) -> dict:
    from helpers import run

    return json.loads(run("targets", *args, "--json").stdout)


def test_targets_json_carries_whether_the_default_ids_capture_alike():
    """`targets --json` carries its verdict: per target whether every release checked by default captures the
    same layers from a config naming none (and which), and over the list the worst of them."""
    d = _targets_json()
    assert d["verdict"] == {"outcome": "alike", "targets": len(list_targets()), "differ": [], "cannot": []}
    smol = next(t for t in d["targets"] if t["name"] == "smollm2-135m")
    assert smol["verdict"] == {"outcome": "alike", "layer_sets": [[1, 14, 26]], "cannot": []}
    assert _targets_json("kimi-k2.5")["targets"][0]["verdict"]["layer_sets"] == [[1, 29, 57]]


def test_targets_verdict_names_the_releases_whose_default_cannot_capture(tmp_path):
    """A 4-layer target: every release's default names one state twice, so none captures with no ids."""
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FooForCausalLM"], "model_type": "foo",
                                                      "hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 100}))
    d = _targets_json(str(tmp_path))
    releases = [a["release"] for a in d["targets"][0]["default_aux_layers"]]
    assert d["targets"][0]["verdict"] == {"outcome": "cannot", "layer_sets": [], "cannot": releases}
    assert d["verdict"]["outcome"] == "cannot" and d["verdict"]["cannot"] == [d["targets"][0]["name"]]


def test_targets_verdict_differ_when_the_releases_capture_other_layers():
    from eagle3conv.api import DefaultCapture, DefaultsOutcome, TargetsResult, TargetSummary
    from eagle3conv.render import targets_text, targets_verdict_words

    p = get_target("smollm2-135m")
    a, b = default_engines()[:2]
    t = TargetSummary(p, (DefaultCapture(a, (2, 15, 27), outputs(1, 14, 26), None),
                          DefaultCapture(b, (3, 16, 28), outputs(2, 15, 27), None)))
    assert t.verdict().outcome is DefaultsOutcome.DIFFER and t.verdict().layer_sets == ((1, 14, 26), (2, 15, 27))
    assert TargetsResult((t,)).verdict().differ == ("smollm2-135m",)
    assert "[1, 14, 26], [2, 15, 27]" in targets_text(TargetsResult((t,)))  # the list's column is the verdict's
    assert "different layers" in targets_verdict_words(t.verdict())
