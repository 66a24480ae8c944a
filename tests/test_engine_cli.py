"""--engine through the commands (issue 11): the per-engine wiring report on config --check,
inspect, fix-keys, verify's smoke test and the push gate, on real checkpoints; the seed incident
before and after SGLang's first-id rule and TorchSpec's Kimi exports, each flagged on the release
that reads them one layer off."""

from __future__ import annotations

import json
from pathlib import Path


from conftest import snapshot
from eagle3conv.spec.layers import outputs
from eagle3conv.wiring.metadata import TrainingRecord, write_metadata_file
from helpers import NEWEST_SGLANG, NEWEST_VLLM, OLDEST_SGLANG, run

OLD, NEW, VLLM = f"sglang=={OLDEST_SGLANG}", f"sglang=={NEWEST_SGLANG}", f"vllm=={NEWEST_VLLM}"
NESTED = "eagle_config.eagle_aux_hidden_state_layer_ids"

KIMI_DRAFTER = dict(hidden=32, target_hidden=7168, heads=4, kv_heads=2, head_dim=8, intermediate=64,
                    vocab=163840, draft_vocab=256)


def set_ids(ckpt: Path, nested=None, top=None) -> None:
    p = ckpt / "config.json"
    cfg = json.loads(p.read_text())
    cfg.pop("eagle_aux_hidden_state_layer_ids", None)
    cfg.pop("eagle_config", None)
    if nested is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": nested, "use_aux_hidden_state": True}
    if top is not None:
        cfg["eagle_aux_hidden_state_layer_ids"] = top
    p.write_text(json.dumps(cfg))


def kimi(make_ckpt, trained_outputs, nested=None, top=None) -> Path:
    ck = make_ckpt("sglang", **KIMI_DRAFTER)
    set_ids(ck, nested, top)
    write_metadata_file(ck, TrainingRecord(layers=outputs(*trained_outputs), source="TorchSpec run",
                                           convention="output", raw_ids=list(trained_outputs),
                                           target="moonshotai/Kimi-K2.5"))
    return ck


def rows(wiring: dict) -> dict[str, dict]:
    return {r["engine"]: r for r in wiring["engines"]}


def written(wiring: dict) -> dict[str, list]:
    return {f["field"]: f["ids"] for f in wiring["written"]["ids"]}


def test_seed_incident_before_and_after_the_first_id_rule_inspect(make_ckpt):
    # trained on outputs 2, 30, 58, nested ids [2, 30, 58]: right for SGLang 0.5.12, one layer off on >= 0.5.13.
    # inspect shows what fix-keys would write ([3, 31, 59] for the newest SGLang) and, per release, what the
    # written config captures
    ck = kimi(make_ckpt, (2, 30, 58), nested=[2, 30, 58], top=[3, 31, 59])
    d = json.loads(run("inspect", ck, "--json").stdout)
    w = d["plan"]["wiring"]
    assert written(w)[NESTED] == [3, 31, 59]
    r = rows(w)
    assert r[NEW]["ok"] and r[NEW]["captures"] == "outputs of layers 2, 30, 58"
    assert r[OLD]["as_trained"] is False and r[OLD]["needs"] == [2, 30, 58]
    assert r[OLD]["finding"]["level"] == "warning"  # no list serves both: the newest wins, 0.5.12 is told
    assert r[VLLM]["ok"] and r["tensorrt-llm"]["needs"] == [2, 30, 58]
    text = run("inspect", ck).stdout
    assert f"ok   sglang {NEWEST_SGLANG}" in text and f"warn sglang {OLDEST_SGLANG}" in text
    assert f"--engine {OLD}" in text  # the fix that writes that release's ids
    # asked for 0.5.12 only: nothing to change in the ids
    d = json.loads(run("inspect", ck, "--engine", OLD, "--json").stdout)
    assert written(d["plan"]["wiring"])[NESTED] == [2, 30, 58]
    assert list(rows(d["plan"]["wiring"])) == [OLD]
    # the two releases asked by name, 0.5.12 first: 0.5.12's ids are written, the newest gets the warning
    d = json.loads(run("inspect", ck, "--engine", OLD, "--engine", NEW, "--json").stdout)
    assert written(d["plan"]["wiring"])[NESTED] == [2, 30, 58]
    (warn,) = [f for f in d["plan"]["wiring"]["findings"] if f["code"] == "engine-needs-other-ids"]
    assert f"for sglang {NEWEST_SGLANG} write [3, 31, 59]" in warn["message"]


def test_inspect_exits_3_when_an_asked_release_cannot_capture_the_record(make_ckpt):
    # a drafter trained on the output of layer 0 in its first slot: no DeepSeek-family SGLang >= 0.5.13 id
    # captures it (docs/facts.md §9); asked by name, that is an error and fix-keys refuses
    ck = kimi(make_ckpt, (0, 30, 58), nested=[0, 30, 58], top=[1, 31, 59])
    res = run("inspect", ck, "--engine", NEW, "--json", ok=3)
    w = json.loads(res.stdout)["plan"]["wiring"]
    assert not rows(w)[NEW]["ok"] and rows(w)[NEW]["needs"] is None
    run("inspect", ck, "--engine", OLD)


def test_verify_smoke_shows_the_engine_report_and_exits_3(make_ckpt):
    ck = kimi(make_ckpt, (2, 30, 58), nested=[2, 30, 58], top=[3, 31, 59])
    res = run("verify", ck, "--target", "kimi-k2.5", "--json", ok=3)
    d = json.loads(res.stdout)
    assert d["ok"] is False and not d["problems"]  # the forward itself is fine: the wiring is not
    assert d["forward_ok"] is True and d["wiring_ok"] is False
    assert not rows(d["wiring"])[NEW]["ok"]
    assert any(f["code"] == "engine-captures-other" and f["level"] == "error" and f["subject"] == NEW
               for f in d["wiring"]["findings"])
    text = run("verify", ck, "--target", "kimi-k2.5", ok=3).stdout
    assert f"BAD  sglang {NEWEST_SGLANG}" in text and "captures outputs of layers 1, 29, 57" in text
    # the top lines say what failed, not a bare False beside an empty problem list
    assert "ok: False (the wiring failed; the forward itself ran clean)" in text
    assert "forward problems: none" in text and "problems: []" not in text
    d = json.loads(run("verify", ck, "--target", "kimi-k2.5", "--engine", OLD, "--json").stdout)
    assert d["ok"] is True and list(rows(d["wiring"])) == [OLD]


def test_torchspec_vllm_export_is_flagged_on_sglang_0_5_12(make_ckpt):
    # TorchSpec's Kimi MLA drafters: trained on outputs 1, 29, 57; its vLLM export writes [2, 30, 58] in both
    ck = kimi(make_ckpt, (1, 29, 57), nested=[2, 30, 58], top=[2, 30, 58])
    d = json.loads(run("config", ck, "--target", "kimi-k2.5", "--check", "--json", ok=3).stdout)
    r = rows(d["wiring"])
    assert r[NEW]["ok"] and r[VLLM]["ok"]
    assert not r[OLD]["ok"] and r[OLD]["captures"] == "outputs of layers 2, 30, 58"
    # one list serves both SGLang releases here ([1, 29, 57]): 0.5.12 is an error, not a warning
    (err,) = [f for f in d["wiring"]["findings"] if f["code"] == "engine-captures-other"]
    assert err["subject"] == OLD and f"needs {NESTED} = [1, 29, 57]" in err["message"]
    run("config", ck, "--target", "kimi-k2.5", "--check", "--engine", "sglang", "--engine", "vllm")
    # config writes the list both SGLang releases read alike, and then every default release is right
    before = snapshot(ck)
    d = json.loads(run("config", ck, "--target", "kimi-k2.5", "--json").stdout)
    assert written(d["wiring"])[NESTED] == [1, 29, 57] and d["wiring"]["ok"]
    assert all(r["ok"] for r in d["wiring"]["engines"])
    assert snapshot(ck) != before
    run("config", ck, "--target", "kimi-k2.5", "--check")


def test_torchspec_training_config_nested_only(make_ckpt):
    # its training config: nested [1, 29, 57] only. Both SGLang releases add 1 (first id 1); vLLM's default
    # runner finds no top-level ids and falls back to its default [2, 30, 58], right by luck
    ck = kimi(make_ckpt, (1, 29, 57), nested=[1, 29, 57])
    d = json.loads(run("config", ck, "--target", "kimi-k2.5", "--check", "--json").stdout)
    r = rows(d["wiring"])
    assert all(x["ok"] for x in r.values())
    assert r[VLLM]["fell_back"] and r[VLLM]["ids"] == [2, 30, 58]


def test_fix_keys_writes_for_the_asked_release_and_names_the_others(make_ckpt, tmp_path):
    ck = kimi(make_ckpt, (2, 30, 58), nested=[2, 30, 58], top=[3, 31, 59])
    out = tmp_path / "o"
    res = run("fix-keys", ck, "--target", "kimi-k2.5", "--out", out, "--json")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [3, 31, 59]  # the newest SGLang wins
    warn = [f for f in json.loads(res.stdout)["plan"]["wiring"]["findings"] if f["code"] == "engine-needs-other-ids"]
    assert len(warn) == 1 and f"for sglang {OLDEST_SGLANG} write [2, 30, 58]" in warn[0]["message"]
    out2 = tmp_path / "o2"
    run("fix-keys", ck, "--target", "kimi-k2.5", "--engine", OLD, "--out", out2)
    cfg = json.loads((out2 / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 30, 58]
    res = run("fix-keys", ck, "--engine", "vllm==abc", "--out", tmp_path / "o3", ok=2)
    assert "not a release number" in res.stderr and not (tmp_path / "o3").exists()


def test_push_gate_covers_the_asked_releases(make_ckpt):
    from eagle3conv.publish import default_gate

    ck = kimi(make_ckpt, (2, 30, 58), nested=[2, 30, 58], top=[3, 31, 59])
    run("config", ck, "--target", "kimi-k2.5", "--engine", OLD)  # written for SGLang 0.5.12
    checks = {c.name: c for c in default_gate(ck, engines=(OLD,))}
    assert checks["aux-layers"].ok and checks["canonical"].ok, checks
    # the default set includes the newest SGLang, for which fix-keys would still rewrite the ids
    checks = {c.name: c for c in default_gate(ck)}
    assert not checks["canonical"].ok and "eagle_config" in checks["canonical"].detail
    res = run("push", ck, "--repo-id", "me/x", "--engine", "nosuch", "--dry-run", ok=2)
    assert "unknown engine 'nosuch'" in res.stderr


def test_vllm_runner_choice(make_ckpt):
    """issue 11: vLLM's two runners read different fallback fields (docs/facts.md §9). A config
    with only the nested ids: the default runner (mrv2, named in the report as assumed) falls
    back to its default layers; --engine vllm==0.33.0:runner=v1 reads the nested ids raw."""
    import pytest

    from eagle3conv.errors import UsageError
    from eagle3conv.spec.engines import parse_engine

    ck = kimi(make_ckpt, (2, 30, 58), nested=[3, 31, 59])
    d = json.loads(run("config", ck, "--check", "--target", "kimi-k2.5", "--engine", "vllm", "--json", ok=None).stdout)
    (row,) = d["wiring"]["engines"]
    assert row["runner"] == "mrv2" and "mrv2, vllm's default runner" in row["runner_assumed"]
    assert row["fell_back"] and row["engine"] == VLLM
    d = json.loads(run("config", ck, "--check", "--target", "kimi-k2.5", "--engine", f"{VLLM}:runner=v1",
                       "--json", ok=None).stdout)
    (row,) = d["wiring"]["engines"]
    assert row["engine"] == f"{VLLM}:runner=v1" and row["release"] == f"vllm {NEWEST_VLLM} (v1 runner)"
    assert row["runner"] == "v1" and row["runner_assumed"] is None
    assert row["reads"] == "eagle_config.eagle_aux_hidden_state_layer_ids" and row["ids"] == [3, 31, 59]
    assert row["captures"] == "outputs of layers 2, 30, 58" and row["ok"]  # raw: input of 3 = output of 2
    text = run("config", ck, "--check", "--target", "kimi-k2.5", "--engine", "vllm", "--verbose", ok=None).stdout
    assert "runner: mrv2, vllm's default runner" in text
    # bad spellings: usage errors naming what is known
    res = run("config", ck, "--check", "--engine", "vllm:runner=v3", ok=2)
    assert "unknown vLLM runner 'v3'; known: mrv2, v1" in res.stderr
    res = run("config", ck, "--check", "--engine", "sglang:runner=v1", ok=2)
    assert "SGLang has no runner choice" in res.stderr
    with pytest.raises(UsageError, match="no runner after"):
        parse_engine("vllm:runner=")
    assert parse_engine("vllm:runner=v1") != parse_engine("vllm")  # two releases to check, side by side


def test_card_ids_follow_the_engine_rules(make_ckpt):
    """issue 11, one copy of the id conventions: the card's ids come from the engine rules for the
    target's family. A SmolLM2 (llama.py: +1 in every release) drafter trained on outputs 2, 14, 26 gets
    [2, 14, 26] for every SGLang release, in one row the releases share (they read alike: issue 27); a
    Kimi drafter gets each release's own, one row each."""
    from eagle3conv.hub.card import gather_facts, render_card

    ck = make_ckpt("sglang")
    write_metadata_file(ck, TrainingRecord(layers=outputs(2, 14, 26), source="a run", convention="output",
                                           raw_ids=[2, 14, 26], target="HuggingFaceTB/SmolLM2-135M-Instruct"))
    card = render_card(gather_facts(ck, "me/smol-drafter"))
    row = {line.split("|")[1].strip(): line for line in card.splitlines()
           if line.startswith("| sglang ") and "in config.json" in line}  # the ids table
    assert "`[2, 14, 26]`" in row[f"sglang {OLDEST_SGLANG}, {NEWEST_SGLANG}"] and len(row) == 1, row
    kimi_ck = kimi(make_ckpt, (2, 30, 58), nested=[3, 31, 59])
    card = render_card(gather_facts(kimi_ck, "me/kimi-drafter"))
    row = {line.split("|")[1].strip(): line for line in card.splitlines()
           if line.startswith("| sglang ") and "in config.json" in line}
    assert "`[3, 31, 59]`" in row[f"sglang {NEWEST_SGLANG}"] and "`[2, 30, 58]`" in row[f"sglang {OLDEST_SGLANG}"]


def test_written_sglang_ids_follow_the_family(make_ckpt):
    """config --sglang-version new on a Llama-family target: the old copy of the conventions wrote
    the DeepSeek-path ids [3, 15, 27] (outputs 3, 15, 27 on SGLang's llama.py); the engine rules
    write [2, 14, 26], which every SGLang release reads as the trained outputs 2, 14, 26."""
    ck = make_ckpt("sglang", target_hidden=576, vocab=49152)
    res = run("config", ck, "--target", "smollm2-135m", "--trained-on", "2,14,26", "--captured-at", "output",
              "--sglang-version", "new", "--json")
    cfg = json.loads((ck / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 14, 26], res.stdout
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [3, 15, 27]  # vLLM: input-of-layer ids
    (nested,) = [f for f in cfg["eagle3conv"]["aux_layers"]["ids"] if f["field"] == NESTED]
    assert nested["read_by"] == [f"sglang {NEWEST_SGLANG}"]  # --sglang-version new = --engine sglang==NEWEST
    run("config", ck, "--target", "smollm2-135m", "--check")  # and every default release reads it alike
