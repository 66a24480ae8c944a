"""Launch lines as engine data (mappings/engines/launch.json, spec/launch.py) and the check of a
user's own line (spec/launch_check.py, ``eagle3conv launch --check``): issue 28.

The option names each release accepts were read from the released wheels' argument definitions by
scripts/read_launch_options.py (sglang 0.5.12 / 0.5.23 srt/server_args.py and arg_groups/fields/*.py,
vllm 0.33.0 engine/arg_utils.py, entrypoints/common/cli_args.py, config/speculative.py); these tests
read the committed data only."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from eagle3conv.spec.engines import parse_engine
from eagle3conv.spec.launch import build_line, launch_rules, option_names, parse_line, rule_for
from eagle3conv.spec.launch_check import check_line
from helpers import run
from test_verify import world  # noqa: F401 (the module-scoped tiny target and its captured states)

REPO = Path(__file__).resolve().parents[1]
SGLANG, VLLM = parse_engine("sglang==0.5.23"), parse_engine("vllm==0.33.0")
LLAMA = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
         "hidden_size": 4096, "torch_dtype": "bfloat16", "max_position_embeddings": 131072,
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}}
BASE_SGLANG = ("python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct "
               "--speculative-algorithm EAGLE3 --speculative-draft-model-path ./drafter")
BASE_VLLM = {"method": "eagle3", "model": "./drafter", "num_speculative_tokens": 3}


def codes(check) -> dict[str, str]:
    return {f.code: f.level for f in check.findings}


def judged(text: str, cfg=LLAMA, release=None, names=(), context=None):
    parsed = parse_line(text)
    rel = release or (SGLANG if parsed.engine == "sglang" else VLLM)
    return check_line(parsed, rel, cfg, tensor_names=set(names), drafter="./drafter", target_context=context)


# --- the data -----------------------------------------------------------------------------------------


def test_every_option_the_launch_data_names_is_one_the_release_accepts():
    """launch.json's options exist in the option names read from that release's wheel (no typo can ship)."""
    checked = 0
    for engine, rules in launch_rules().items():
        for rule in rules:
            for release in rule.option_names:
                names = option_names(parse_engine(f"{engine}=={release}"))
                assert names.read_from == release
                for role in rule.options.values():
                    if role.option and not (engine == "sglang" and release == "0.5.12"
                                            and role.role == "draft_kv_cache_dtype"):
                        assert role.option in names.options, (engine, release, role.option)
                        checked += 1
                    if role.key and names.keys:
                        assert role.key in names.keys, (engine, release, role.key)
                        checked += 1
    assert checked > 30
    # sglang 0.5.12 has no draft-only KV dtype option; 0.5.23 has it (spec.py:151)
    assert "--speculative-draft-kv-cache-dtype" not in option_names(parse_engine("sglang==0.5.12")).options
    assert "--speculative-draft-kv-cache-dtype" in option_names(SGLANG).options


def test_every_launch_fact_names_its_source_and_the_draft_quantization_hook_is_data():
    for engine, rules in launch_rules().items():
        for rule in rules:
            for role in rule.options.values():
                assert role.source and role.why, (engine, role.role)
    assert rule_for(SGLANG).role("draft_quantization").option == "--speculative-draft-model-quantization"
    assert rule_for(VLLM).role("draft_quantization").key == "quantization"
    assert "spec.py:216" in rule_for(SGLANG).role("draft_quantization").source
    assert "speculative.py:435" in rule_for(VLLM).role("draft_quantization").source


# --- the one builder ----------------------------------------------------------------------------------


def test_the_builder_takes_the_draft_quantization_value():
    sg = build_line(SGLANG, LLAMA, drafter="./d", target="T", draft_quantization="fp8")
    assert sg.argv[-2:] == ("--speculative-draft-model-quantization", "fp8")
    vl = build_line(VLLM, LLAMA, drafter="./d", target="T", draft_quantization="fp8")
    assert json.loads(vl.argv[vl.argv.index("--speculative-config") + 1])["quantization"] == "fp8"
    # a quantized target: SGLang's draft opts out of inheriting it, said as a need
    sg = build_line(SGLANG, LLAMA, drafter="./d", target="T", quantization="fp8", tp=4)
    assert "--speculative-draft-model-quantization unquant" in sg.text and "--tp-size 4" in sg.text
    assert any("unquant" in n for n in sg.needs)


def test_a_windowed_drafter_gets_the_window_option_on_sglang_only():
    cfg = {**LLAMA, "layer_types": ["sliding_attention"], "sliding_window": 2048}
    assert "--speculative-draft-window-size 2048" in build_line(SGLANG, cfg, drafter="./d", target="T").text
    assert "window" not in build_line(VLLM, cfg, drafter="./d", target="T").text


def test_a_peagle_qwen3_drafter_gets_no_sglang_line_and_vllm_drafts_in_parallel(tmp_path):
    """Issue 28's case: config marked both SGLang rows 'cannot serve' and printed an SGLang line anyway;
    its vLLM line lacked parallel_drafting, which the card's had. One builder now makes both."""
    src = tmp_path / "pe"
    run("example", src, "--format", "speculators-peagle")
    out = tmp_path / "pe-out"
    fixed = json.loads(run("fix-keys", src, "--out", out, "--json").stdout)["plan"]["wiring"]["written"]["launch"]
    assert "sglang" not in fixed and f'"model": "{out}"' in fixed["vllm"]  # fix-keys' lines name its output
    res = run("config", out, "--trained-on", "1,14,26", "--captured-at", "output", "--dry-run", "--json")
    launch = json.loads(res.stdout)["wiring"]["written"]["launch"]
    assert "sglang" not in launch and "cannot serve" in launch["sglang_refused"]
    spec = json.loads(shlex.split(launch["vllm"])[-1])
    assert spec == {"method": "eagle3", "model": str(out), "num_speculative_tokens": 3, "parallel_drafting": True}
    text = run("config", out, "--trained-on", "1,14,26", "--captured-at", "output", "--dry-run").stdout
    assert "SGLang:        no line:" in text and "python -m sglang" not in text
    from eagle3conv.hub.card import gather_facts, render_card

    card = render_card(gather_facts(out, "me/pe"))
    section = card[card.index("### Launch"):]
    assert "SGLang: not served" in section and "sglang.launch_server" not in section
    assert '"parallel_drafting": true' in section
    rows = run("launch", out, "--json")
    d = json.loads(rows.stdout)
    by = {r["release"]: r for r in d["rows"]}
    assert by["sglang==0.5.23"]["line"] is None and by["sglang==0.5.23"]["refused"]
    assert '"parallel_drafting": true' in by["vllm==0.33.0"]["line"]


# --- a user's own line --------------------------------------------------------------------------------


def test_a_clean_line_passes():
    c = judged(BASE_SGLANG)
    assert c.ok and not c.findings and c.corrected is None
    c = judged(f"vllm serve meta-llama/Llama-3.1-8B-Instruct --speculative-config '{json.dumps(BASE_VLLM)}'")
    assert c.ok and not c.findings


def test_unknown_option_names_get_the_nearest_spelling_and_are_corrected():
    c = judged(BASE_SGLANG + " --speculative-num-stepz 3")
    (f,) = [f for f in c.findings if f.code == "launch-unknown-option"]
    assert f.level == "error" and "--speculative-num-steps" in f.message and f.subject == "sglang==0.5.23"
    assert "--speculative-num-steps 3" in c.corrected and "stepz" not in c.corrected
    spec = {**BASE_VLLM, "num_spec_tokens": 3}
    del spec["num_speculative_tokens"]
    c = judged(json.dumps(spec))
    assert codes(c)["launch-unknown-option"] == "error"
    assert json.loads(c.corrected) == BASE_VLLM
    # vLLM's shortcut options are read into the speculative settings (and said once when corrected)
    c = judged("vllm serve M --spec-model ./my-drafter --spec-tokens 3")
    assert codes(c) == {"launch-method-from-path": "error"} and "--spec-model" not in c.corrected
    assert json.loads(shlex.split(c.corrected)[-1]) == {"model": "./my-drafter", "num_speculative_tokens": 3,
                                                        "method": "eagle3"}
    # vLLM reads underscores as dashes: not an unknown name
    assert judged(f"vllm serve M --max_model_len 4096 --speculative-config '{json.dumps(BASE_VLLM)}'").ok


@pytest.mark.parametrize("algo", ["EAGLE", "eagle", "NEXTN"])
def test_sglang_eagle_instead_of_eagle3_is_an_error_with_the_fix(algo):
    c = judged(BASE_SGLANG.replace("EAGLE3", algo))
    assert codes(c) == {"launch-algorithm": "error"}
    assert "accept length" in c.findings[0].message and "--speculative-algorithm EAGLE3" in c.corrected
    assert judged(c.corrected).ok


@pytest.mark.parametrize("path, level", [("./my-drafter", "error"), ("./llama3-eagle3-drafter", "warning"),
                                         ("./eagle-eagle3", "error")])
def test_vllm_without_method_picks_it_from_the_path(path, level):
    c = judged(json.dumps({"model": path, "num_speculative_tokens": 3}))
    assert codes(c) == {"launch-method-from-path": level}
    assert json.loads(c.corrected)["method"] == "eagle3"


def test_sglang_draft_inherits_the_target_quantization():
    c = judged(BASE_SGLANG + " --quantization awq")
    assert codes(c) == {"launch-draft-quantization": "error"}  # start-up fails
    assert "--speculative-draft-model-quantization unquant" in c.corrected and judged(c.corrected).ok
    assert codes(judged(BASE_SGLANG + " --quantization fp8")) == {"launch-draft-quantization": "warning"}
    assert judged(BASE_SGLANG + " --quantization fp8 --speculative-draft-model-quantization unquant").ok
    # a drafter with its own quantization config is left to it; vLLM's draft never inherits
    assert not judged(BASE_SGLANG + " --quantization fp8", cfg={**LLAMA, "quantization_config": {"x": 1}}).findings
    assert not judged(f"vllm serve M --quantization awq --speculative-config '{json.dumps(BASE_VLLM)}'").findings


def test_fp8_kv_cache_without_scales():
    c = judged(BASE_SGLANG + " --kv-cache-dtype fp8_e4m3")
    assert codes(c) == {"launch-kv-scales": "warning"}
    assert "--speculative-draft-kv-cache-dtype auto" in c.corrected and not judged(c.corrected).findings
    assert not judged(BASE_SGLANG + " --kv-cache-dtype fp8_e4m3", names={"midlayer.self_attn.k_proj.k_scale",
                                                                          "midlayer.self_attn.v_proj.v_scale"}).findings
    old = judged(BASE_SGLANG + " --kv-cache-dtype fp8_e4m3", release=parse_engine("sglang==0.5.12"))
    assert "--kv-cache-dtype auto" in old.corrected  # 0.5.12 has no draft-only option
    c = judged(f"vllm serve M --kv-cache-dtype fp8 --speculative-config '{json.dumps(BASE_VLLM)}'")
    assert codes(c) == {"launch-kv-scales": "warning"}
    assert json.loads(shlex.split(c.corrected)[-1])["kv_cache_dtype"] == "auto"


def test_fp16_serving_of_a_bf16_drafter():
    c = judged(BASE_SGLANG + " --dtype half")
    assert codes(c) == {"launch-fp16": "warning"} and "--dtype bfloat16" in c.corrected
    assert not judged(BASE_SGLANG + " --dtype half", cfg={**LLAMA, "torch_dtype": "float16"}).findings


def test_model_overrides_reach_the_sglang_drafter_and_not_vllm():
    over = shlex.quote(json.dumps({"max_position_embeddings": 262144}))
    assert codes(judged(BASE_SGLANG + f" --json-model-override-args {over}")) == {"launch-overrides": "warning"}
    c = judged(f"vllm serve M --hf-overrides {over} --speculative-config '{json.dumps(BASE_VLLM)}'")
    assert codes(c) == {"launch-overrides": "notice"}


def test_served_context_above_the_drafters_what_each_release_does():
    short = {**LLAMA, "max_position_embeddings": 2048, "rope_scaling": None}
    c = judged(BASE_SGLANG + " --context-length 32768", cfg=short)
    assert codes(c) == {"launch-context": "error"} and "refuses to start" in c.findings[0].message
    assert judged("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 " + BASE_SGLANG + " --context-length 32768",
                  cfg=short).ok
    yarn = {**short, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}}
    spec = json.dumps(BASE_VLLM)
    c = judged(f"vllm serve M --max-model-len 32768 --speculative-config '{spec}'", cfg=yarn)
    assert codes(c) == {"launch-context": "warning"} and "lowers the server's max_model_len" in c.findings[0].message
    c = judged(f"vllm serve M --speculative-config '{spec}'", cfg=short, context=(32768, "the target's"))
    assert codes(c) == {"launch-context": "notice"}  # cache-only RoPE: vLLM raises the drafter's positions


def test_missing_switches_the_drafter_needs():
    cfg = {**LLAMA, "layer_types": ["sliding_attention"], "sliding_window": 2048}
    c = judged(BASE_SGLANG, cfg=cfg)
    assert codes(c) == {"launch-switch": "warning"}
    assert "--speculative-draft-window-size 2048" in c.corrected and judged(c.corrected, cfg=cfg).ok


def test_the_launch_command_checks_a_line_and_exits_3_on_an_error(tmp_path):
    ck = tmp_path / "d"
    run("example", ck, "--format", "sglang")
    line = f"python -m sglang.launch_server --model-path M --speculative-algorithm EAGLE --speculative-draft-model-path {ck}"
    res = run("launch", ck, "--check", line, "--max-context", "2048", ok=3)
    first = res.stdout.splitlines()[0]
    assert first.startswith("launch check for sglang 0.5.23: FAILED")
    assert "fix: set --speculative-algorithm EAGLE3" in res.stdout and "corrected: " in res.stdout
    d = json.loads(run("launch", ck, "--check", line, "--max-context", "2048", "--json", ok=3).stdout)
    assert d["ok"] is False and d["check"]["findings"][0]["code"] == "launch-algorithm"
    assert [r["release"] for r in d["rows"]] == ["sglang==0.5.23"]
    good = line.replace("EAGLE ", "EAGLE3 ")
    assert run("launch", ck, "--check", good, "--max-context", "2048").stdout.startswith("launch check for sglang 0.5.23: passed")
    res = run("launch", ck, "--check", "docker run foo", ok=2)
    assert "not a launch command" in res.stderr
    res = run("launch", ck, "--check", "trtllm-serve M --extra_llm_api_options x.yaml", ok=2)
    assert "not supported" in res.stderr


def test_verify_and_push_check_the_launch_line_and_the_card_says_so(tmp_path):
    ck = tmp_path / "d"
    run("example", ck, "--format", "sglang")
    bad = (f"python -m sglang.launch_server --model-path M --speculative-algorithm EAGLE "
           f"--speculative-draft-model-path {ck} --context-length 2048")
    res = run("verify", ck, "--launch", bad, "--json", ok=3)  # the smoke test passes; the line does not
    d = json.loads(res.stdout)
    assert d["ok"] is True and d["launch_check"]["ok"] is False
    assert d["launch_check"]["findings"][0]["code"] == "launch-algorithm"
    res = run("push", ck, "--repo-id", "me/d", "--dry-run", "--launch", bad, ok=3)
    assert "launch-line" in res.stderr and "EAGLE3" in res.stderr
    card = run("push", ck, "--repo-id", "me/d", "--dry-run", "--force", "--launch", bad).stdout
    section = card[card.index("### Launch"):]
    assert "`eagle3conv push --launch` was checked: **errors found**" in section
    assert "checked for sglang 0.5.23" in section and "--speculative-algorithm (must be EAGLE3)" in section
    good = bad.replace("EAGLE ", "EAGLE3 ")
    card = run("push", ck, "--repo-id", "me/d", "--dry-run", "--launch", good).stdout
    assert "`eagle3conv push --launch` was checked: no errors" in card


def test_verify_rows_not_scored_do_not_read_ok_and_the_states_line_names_no_none(world, tmp_path):  # noqa: F811
    """Issue 28: a row verify could not score read 'ok ... not scored: ...', and states naming no target
    printed 'target None'."""
    from test_verify_2026 import extend, labelled

    _, captured, drafter = world
    q3 = extend(drafter, tmp_path / "q3", architectures=["Eagle3Qwen3ForCausalLM"])
    states = labelled(q3, captured, tmp_path / "q3.safetensors", later_layer_norm="input_layernorm")
    text = run("verify", q3, "--states", states, "--no-save", ok=None).stdout
    not_scored = [line for line in text.splitlines() if ": not scored: " in line]
    assert not_scored and all(not line.lstrip().startswith("ok") for line in not_scored), not_scored
    assert "target None" not in text
    states_line = next(line for line in text.splitlines() if line.startswith("states:"))
    assert "target " in states_line or "the states name no target" in states_line


# --- the launch report reads as the report contract says ------------------------------------------------


def test_releases_that_print_the_same_line_share_one_row(tmp_path):
    """README: "releases that read alike share a row". SGLang 0.5.12 and 0.5.23 print the same line for a plain
    Llama drafter: one row naming both; a windowed drafter's rows stay apart from vLLM's, and a release whose
    line differs keeps its own row."""
    from eagle3conv.render import alike_rows

    src, out = tmp_path / "m", tmp_path / "d"
    run("example", src, "--format", "modelopt-export")
    run("fix-keys", src, "--out", out, "--target", "smollm2-135m")
    text = run("launch", out, "--target", "smollm2-135m").stdout
    rows = [x for x in text.splitlines() if x.startswith("  ok ") or x.startswith("  BAD ")]
    assert [r.split(":")[0].split(None, 1)[1] for r in rows] == ["sglang 0.5.12, 0.5.23", "vllm 0.33.0",
                                                                 "tensorrt-llm"], text
    d = json.loads(run("launch", out, "--target", "smollm2-135m", "--json").stdout)
    assert [r["release"] for r in d["rows"]][:2] == ["sglang==0.5.12", "sglang==0.5.23"]  # --json keeps each release
    from dataclasses import replace

    from eagle3conv.api import launch
    from eagle3conv.wiring.options import WiringOptions

    a, b = launch(out, options=WiringOptions(target="smollm2-135m")).rows[:2]
    assert len(alike_rows([a, b])) == 1
    assert len(alike_rows([a, replace(b, argv=(*b.argv, "--tp", "2"))])) == 2
    refused = [replace(r, argv=None, refused=(f"{r.release} cannot serve a Qwen3 drafter",)) for r in (a, b)]
    ((label, first, why),) = alike_rows(refused)
    assert label == "sglang 0.5.12, 0.5.23" and first is refused[0] and why == ("cannot serve a Qwen3 drafter",)


def test_a_line_serving_another_target_than_the_drafters_is_a_warning(tmp_path):
    """A P-EAGLE drafter wired for SmolLM2 (its provenance says so) checked on a `vllm serve Qwen/Qwen3-8B` line:
    the report used to say only 'target: SmolLM2' and check the context as SmolLM2's, without a word that the
    line serves another model."""
    src, out = tmp_path / "pe", tmp_path / "ped"
    run("example", src, "--format", "speculators-peagle")
    run("fix-keys", src, "--out", out)
    line = ("vllm serve Qwen/Qwen3-8B --speculative-config "
            f"'{{\"method\": \"eagle3\", \"model\": \"{out}\", \"num_speculative_tokens\": 3, \"parallel_drafting\": true}}'")
    d = json.loads(run("launch", out, "--check", line, "--json").stdout)
    (warn,) = [f for f in d["check"]["findings"] if f["code"] == "launch-target"]
    assert warn["level"] == "warning" and "Qwen/Qwen3-8B" in warn["message"] and "smollm2-135m" in warn["message"]
    assert "--target Qwen/Qwen3-8B" in warn["fix"]
    same = line.replace("Qwen/Qwen3-8B", "HuggingFaceTB/SmolLM2-135M-Instruct")
    d = json.loads(run("launch", out, "--check", same, "--json").stdout)
    assert not [f for f in d["check"]["findings"] if f["code"] == "launch-target"]


def test_the_checked_lines_row_names_the_drafter_path_the_line_names(tmp_path):
    """With --check, the release's row is the user's line as eagle3conv builds it: it names their drafter path
    (it named the CHECKPOINT argument, so the row was not the line to paste where the drafter lives elsewhere)."""
    src, out = tmp_path / "m", tmp_path / "d"
    run("example", src, "--format", "modelopt-export")
    run("fix-keys", src, "--out", out, "--target", "smollm2-135m")
    line = '{"method": "eagle3", "model": "/models/my-drafter", "num_speculative_tokens": 3}'
    d = json.loads(run("launch", out, "--check", line, "--json").stdout)
    (row,) = d["rows"]
    assert '"model": "/models/my-drafter"' in row["line"], row["line"]
    d = json.loads(run("launch", out, "--check", line, "--drafter", "me/d", "--json").stdout)
    assert '"model": "me/d"' in d["rows"][0]["line"]  # --drafter still wins
