"""A drafter's sliding window (layer_types + sliding_window): vLLM 0.33.0 applies it from the config,
SGLang 0.5.12-0.5.23 only from the launch option --speculative-draft-window-size (docs/facts.md §11).

The rows, the card's table and launch line, and verify's emulation notes say so, on the drafter
speculators' trainer writes by default (every layer windowed at 2048)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3conv.errors import MappingFileError
from eagle3conv.spec.variants import Handling
from eagle3conv.spec.engines import (
    draft_window,
    forward_rule,
    load_engine_file,
    load_families_file,
    parse_engine,
    serve_finding,
    serving,
    window_launch_option,
)
from helpers import NEWEST_SGLANG, NEWEST_VLLM, OLDEST_SGLANG, run

REPO = Path(__file__).resolve().parents[1]
OPTION = "--speculative-draft-window-size"


def llama(**kw):
    return {"model_type": "llama", "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 2,
            "hidden_size": 64, **kw}


@pytest.mark.parametrize("cfg, want", [
    (llama(layer_types=["sliding_attention"] * 2, sliding_window=2048), (2048, (0, 1))),
    (llama(layer_types=["full_attention", "sliding_attention"], sliding_window=512), (512, (1,))),
    # entries past the drafter's layers (a target's layer_types) are not the drafter's
    (llama(layer_types=["full_attention", "full_attention", "sliding_attention"], sliding_window=512), None),
    (llama(layer_types=["sliding_attention"] * 2, sliding_window=None), None),
    (llama(layer_types=["sliding_attention"] * 2, sliding_window=True), None),
    (llama(layer_types=["sliding_attention"] * 2, sliding_window=0), None),
    (llama(layer_types="sliding_attention", sliding_window=2048), None),
    (llama(sliding_window=2048), None),
    # transformers' Qwen3Config keeps the window only with use_sliding_window
    (llama(model_type="qwen3", layer_types=["sliding_attention"] * 2, sliding_window=2048), None),
    (llama(model_type="qwen3", layer_types=["sliding_attention"] * 2, sliding_window=2048, use_sliding_window=False),
     None),
    (llama(model_type="qwen3", layer_types=["sliding_attention"] * 2, sliding_window=2048, use_sliding_window=True),
     (2048, (0, 1))),
])
def test_the_window_a_config_gives_its_layers(cfg, want):
    assert draft_window(cfg) == want


def test_the_rules_say_who_reads_the_window():
    for rel in (OLDEST_SGLANG, NEWEST_SGLANG):
        fw = forward_rule(parse_engine(f"sglang=={rel}"), "llama")
        assert (fw.handling("sliding_window"), fw.sliding_window_option) == (Handling.LAUNCH_OPTION, OPTION)
    assert forward_rule(parse_engine(f"vllm=={NEWEST_VLLM}"), "llama").handling("sliding_window") is Handling.HONOURED
    assert forward_rule(parse_engine(f"vllm=={NEWEST_VLLM}"), "mla").handling("sliding_window") is Handling.IGNORED
    assert forward_rule(parse_engine("tensorrt-llm"), "llama").handling("sliding_window") is Handling.NOT_READ


@pytest.mark.parametrize("edit, match", [
    ({"sliding_window_option": None}, "names the launch option exactly when"),
    ({"sliding_window": "config"}, "names the launch option exactly when"),
    ({"sliding_window_option": "speculative-draft-window-size"}, "must be a launch option"),
    ({"sliding_window": "sometimes"}, "'sliding_window' must be one of"),
])
def test_the_loader_refuses_a_window_rule_it_cannot_act_on(tmp_path, edit, match):
    root = REPO / "mappings" / "engines"
    raw = json.loads((root / "sglang.json").read_text())
    entry = raw["forward"][-1] if raw["forward"][-1]["drafters"] == ["llama"] else next(
        f for f in raw["forward"] if f["drafters"] == ["llama"])
    for k, v in edit.items():
        if v is None:
            entry.pop(k)
        else:
            entry[k] = v
    bad = tmp_path / "sglang.json"
    bad.write_text(json.dumps(raw))
    with pytest.raises(MappingFileError, match=match):
        load_engine_file(bad, load_families_file(root / "families.json"))


def test_sglang_rows_warn_with_the_launch_option_vllm_rows_do_not():
    cfg = llama(layer_types=["sliding_attention"] * 2, sliding_window=2048)
    for rel in (OLDEST_SGLANG, NEWEST_SGLANG):
        f = serve_finding(f"sglang=={rel}", cfg, asked=False)
        assert f is not None and f.level == "warning"
        assert f"reads the window only from the launch option {OPTION}" in f.message
        assert "layers 0, 1" in f.message and f.fix == f"launch sglang with {OPTION} 2048"
        assert window_launch_option(f"sglang=={rel}", cfg) == f"{OPTION} 2048"
    assert serve_finding(f"vllm=={NEWEST_VLLM}", cfg, asked=False) is None
    assert window_launch_option(f"vllm=={NEWEST_VLLM}", cfg) is None
    # one windowed layer of two: the option windows both, and the message says so
    part = llama(layer_types=["full_attention", "sliding_attention"], sliding_window=512)
    assert "the option windows every draft layer" in serve_finding(f"sglang=={NEWEST_SGLANG}", part,
                                                                    asked=False).message
    # no window: no word
    assert serve_finding(f"sglang=={NEWEST_SGLANG}", llama(layer_types=["full_attention"] * 2), asked=False) is None


def test_verify_says_what_it_does_not_emulate():
    cfg = llama(layer_types=["sliding_attention"] * 2, sliding_window=2048)
    v = serving(f"vllm=={NEWEST_VLLM}", cfg)
    assert any("applies the drafter's sliding window of 2048 tokens" in m and "up to 2048 tokens" in m
               for m in v.not_emulated)
    s = serving(f"sglang=={NEWEST_SGLANG}", cfg)
    assert any(f"launched with {OPTION} 2048" in m for m in s.not_emulated)
    assert any("sliding window" in m for m in serving("tensorrt-llm", cfg).not_read)
    assert not any("window" in m for m in serving(f"vllm=={NEWEST_VLLM}", llama()).not_emulated)


@pytest.fixture(scope="module")
def speculators_drafter(tmp_path_factory):
    """speculators 0.9.0's EAGLE-3.1 drafter as its trainer writes it by default, through fix-keys."""
    d = tmp_path_factory.mktemp("window")
    run("example", d / "src", "--format", "speculators-3.1")
    run("fix-keys", d / "src", "--out", d / "out")
    cfg = json.loads((d / "out" / "config.json").read_text())
    assert draft_window(cfg) == (2048, (0, 1)), "the example is no longer windowed: pick another"
    return d / "out"


def test_config_check_rows_and_the_card(speculators_drafter):
    doc = json.loads(run("config", speculators_drafter, "--target", "smollm2-135m", "--check", "--json").stdout)
    rows = {r["engine"]: r for r in doc["wiring"]["engines"]}
    sg = rows[f"sglang=={NEWEST_SGLANG}"]["serve"]
    assert sg["code"] == "served-without" and sg["fix"] == f"launch sglang with {OPTION} 2048"
    assert rows[f"vllm=={NEWEST_VLLM}"]["serve"] is None
    card = json.loads(run("push", speculators_drafter, "--repo-id", "me/w", "--dry-run", "--json",
                          ok=None).stdout)["card"]
    assert "a sliding window of 2048 tokens on layers 0, 1." in card
    assert f"| sglang {NEWEST_SGLANG} | as configured; its sliding window only when launched with `{OPTION} 2048` |" \
        in card
    assert f"| vllm {NEWEST_VLLM} | as configured |" in card
    launch = next(line for line in card.splitlines() if "sglang.launch_server" in line)
    assert launch.endswith(f"{OPTION} 2048")
    text = run("config", speculators_drafter, "--target", "smollm2-135m", "--check").stdout
    assert f"launch sglang with {OPTION} 2048" in text
