"""Aux-layer wiring end to end: the check's every finding, `config`, `targets`, fix-keys'
conversion of trainer ids, and the seed incident through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import snapshot
from eagle3conv.wiring.check import check_wiring
from eagle3conv.spec.layers import EMBEDDING, outputs
from eagle3conv.wiring.metadata import TrainingRecord, from_metadata_file, write_metadata_file
from helpers import NEWEST_SGLANG, NEWEST_VLLM, OLDEST_SGLANG, run

KIMI_DRAFTER = dict(hidden=32, target_hidden=7168, heads=4, kv_heads=2, head_dim=8, intermediate=64,
                    vocab=163840, draft_vocab=256)
NESTED = "eagle_config.eagle_aux_hidden_state_layer_ids"


def set_ids(ckpt: Path, nested=None, top=None) -> None:
    p = ckpt / "config.json"
    cfg = json.loads(p.read_text())
    cfg.pop("eagle_aux_hidden_state_layer_ids", None)
    if nested is None:
        cfg.pop("eagle_config", None)
    else:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": nested, "use_aux_hidden_state": True}
    if top is not None:
        cfg["eagle_aux_hidden_state_layer_ids"] = top
    p.write_text(json.dumps(cfg))


def captured_at_input(ckpt: Path, *ids: int) -> None:
    """training_metadata.json saying "captured at the input of layers <ids>" (a dump's words)."""
    write_metadata_file(ckpt, TrainingRecord(
        layers=outputs(*(i - 1 for i in ids)), source="SGLang aux dumps", convention="captured-at-input",
        raw_ids=list(ids), target="moonshotai/Kimi-K2.5"))


@pytest.fixture
def incident(make_ckpt):
    """The seed incident: a Kimi-K2.5 drafter trained on states captured at the input of
    layers 3, 31, 59, whose config was "fixed" to [-1, 2, 30]."""
    ck = make_ckpt("sglang", aux_ids=(-1, 2, 30), **KIMI_DRAFTER)
    captured_at_input(ck, 3, 31, 59)
    return ck


# --- the incident --------------------------------------------------------------------------------


def test_incident_is_refused_by_check_with_both_sides(incident):
    res = run("config", incident, "--target", "kimi-k2.5", "--check", ok=3)
    out = res.stdout
    assert out.startswith("check: FAILED")  # the verdict first
    assert "trained on: outputs of layers 2, 30, 58" in out
    assert f"sglang {OLDEST_SGLANG}: reads eagle_config.eagle_aux_hidden_state_layer_ids [-1, 2, 30]" in out
    assert "the embedding output (before layer 0), which SGLang cannot capture" in out
    assert f"fix (every BAD row): eagle3conv config {incident} --target kimi-k2.5" in out
    d = json.loads(run("config", incident, "--target", "kimi-k2.5", "--check", "--json", ok=3).stdout)
    (err,) = [f for f in d["wiring"]["findings"] if f["subject"] == f"sglang=={OLDEST_SGLANG}"]
    # no release reading the field captures the record from it: the ids contradict the record
    assert err["code"] == "disagrees-with-training" and "training captured outputs of layers 2, 30, 58" in err["message"]


def test_incident_is_refused_by_fix_keys_and_nothing_is_written(incident, tmp_path):
    before = snapshot(incident)
    res = run("fix-keys", incident, "--target", "kimi-k2.5", ok=3)
    assert "embedding output" in res.stderr
    assert "training captured outputs of layers 2, 30, 58" in res.stderr
    assert "--rewire" in res.stderr
    assert snapshot(incident) == before
    run("fix-keys", incident, "--target", "kimi-k2.5", "--out", tmp_path / "o", ok=3)
    assert not (tmp_path / "o").exists()


def test_incident_with_the_old_sglang_ids_fails_on_new_sglang(incident):
    # [2, 30, 58] is right for SGLang <= 0.5.12 only: SGLang >= 0.5.13 reads a Kimi (DeepSeek-family)
    # target's ids raw unless the first is 1, so it captures outputs 1, 29, 57 (issue 11)
    set_ids(incident, nested=[2, 30, 58])
    res = run("config", incident, "--target", "kimi-k2.5", "--check", "--json", ok=3)
    d = json.loads(res.stdout)
    assert d["wiring"]["ok"] is False
    rows = {r["engine"]: r for r in d["wiring"]["engines"]}
    old, new, vllm = f"sglang=={OLDEST_SGLANG}", f"sglang=={NEWEST_SGLANG}", f"vllm=={NEWEST_VLLM}"
    assert set(rows) == {old, new, vllm, "tensorrt-llm"}
    assert rows[old]["ok"] and rows[old]["captures"] == "outputs of layers 2, 30, 58"
    assert not rows[new]["ok"] and rows[new]["captures"] == "outputs of layers 1, 29, 57"
    assert rows[new]["needs"] == [3, 31, 59] and rows[new]["field"] == {"kind": "config", "name": NESTED}
    # the explicit ids make the newest SGLang capture other layers; vLLM finds no top-level ids and falls
    # back to its default [2, 30, 58] = outputs 1, 29, 57
    by = {f["subject"]: f for f in d["wiring"]["findings"] if f.get("subject")}
    assert by[new]["code"] == "engine-captures-other" and by[vllm]["code"] == "defaults-disagree"
    assert "outputs of layers 1, 29, 57" in by[new]["message"]
    assert by[new]["fix"] == f"eagle3conv config {incident} --target kimi-k2.5"
    text = run("config", incident, "--target", "kimi-k2.5", "--check", ok=3).stdout
    assert f"sglang {NEWEST_SGLANG}" in text and "captures outputs of layers 1, 29, 57" in text
    # asked only for the release it is right for: it passes
    run("config", incident, "--target", "kimi-k2.5", "--check", "--engine", old)
    run("config", incident, "--target", "kimi-k2.5", "--check", "--engine", new, ok=3)
    run("config", incident, "--target", "kimi-k2.5", "--check", "--engine", "nosuch", ok=2)
    # an unknown release says which known one it is read as
    res = run("config", incident, "--target", "kimi-k2.5", "--check", "--engine", "sglang==9.5.99", ok=3)
    assert f"sglang 9.5.99 is not known; read as {NEWEST_SGLANG}, the newest known" in res.stdout


def test_incident_fixed_by_config_then_checks_clean(incident):
    before = snapshot(incident)
    res = run("config", incident, "--target", "kimi-k2.5", "--json")
    d = json.loads(res.stdout)
    w = d["wiring"]["written"]
    ids = {f["field"]: f for f in w["ids"]}
    # Kimi, the DeepSeek file family: the newest SGLang's first-id rule wins; 0.5.12 is told what it needs
    assert ids[NESTED]["ids"] == [3, 31, 59] and ids["eagle_aux_hidden_state_layer_ids"]["ids"] == [3, 31, 59]
    assert ids["eagle3_layers_to_capture"] == {"field": "eagle3_layers_to_capture", "kind": "launch_option",
                                               "ids": [2, 30, 58], "read_by": ["tensorrt-llm"]}
    per = {e["engine"]: e["ids"] for e in w["per_engine"]}
    assert per[f"sglang=={OLDEST_SGLANG}"] == [2, 30, 58] and per[f"sglang=={NEWEST_SGLANG}"] == [3, 31, 59]
    assert "--speculative-algorithm EAGLE3" in w["launch"]["sglang"]
    assert "moonshotai/Kimi-K2.5" in w["launch"]["sglang"]
    assert d["written"] == ["config.json"]  # training_metadata.json already there
    cfg = json.loads((incident / "config.json").read_text())
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [3, 31, 59], "use_aux_hidden_state": True}
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [3, 31, 59]
    aux = cfg["eagle3conv"]["aux_layers"]
    assert aux["layers"] == [{"output_of": 2}, {"output_of": 30}, {"output_of": 58}]
    assert aux["target"] == "kimi-k2.5"
    assert {f["field"]: f["ids"] for f in aux["ids"]}["eagle3_layers_to_capture"] == [2, 30, 58]
    # only config.json changed, and the weights are untouched
    after = snapshot(incident)
    assert {k for k in after if after[k] != before.get(k)} == {"config.json"}
    run("config", incident, "--target", "kimi-k2.5", "--check")
    again = run("config", incident, "--target", "kimi-k2.5")
    assert again.stdout.startswith("config: already wired for outputs of layers 2, 30, 58; no changes")
    assert snapshot(incident) == after
    # --sglang-version old: an alias of --engine sglang==OLDEST, whose reading then wins
    old = run("config", incident, "--target", "kimi-k2.5", "--sglang-version", "old", "--json")
    written = {f["field"]: f["ids"] for f in json.loads(old.stdout)["wiring"]["written"]["ids"]}
    assert written[NESTED] == [2, 30, 58]


def test_fix_keys_rewire_writes_the_record(incident, tmp_path):
    out = tmp_path / "o"
    res = run("fix-keys", incident, "--target", "kimi-k2.5", "--rewire", "--out", out)
    assert "outputs of layers 2, 30, 58" in res.stdout
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [3, 31, 59]
    assert from_metadata_file(out).layers == outputs(2, 30, 58)  # the record travels with the weights


def test_user_flags_are_a_record(make_ckpt):
    ck = make_ckpt("sglang", aux_ids=(-1, 2, 30), **KIMI_DRAFTER)
    res = run("config", ck, "--target", "kimi-k2.5", "--trained-on", "3,31,59", "--captured-at", "input",
              "--check", ok=3)
    assert "--trained-on 3,31,59 --captured-at input" in res.stdout
    run("config", ck, "--target", "kimi-k2.5", "--trained-on", "3,31,59", "--captured-at", "input")
    written = from_metadata_file(ck)
    assert written.layers == outputs(2, 30, 58) and written.raw_ids == [3, 31, 59]
    assert written.convention == "input" and written.target == "moonshotai/Kimi-K2.5"
    run("config", ck, "--target", "kimi-k2.5", "--check")


# --- config command errors -----------------------------------------------------------------------


def test_config_needs_a_record(make_ckpt):
    ck = make_ckpt("sglang")
    before = snapshot(ck)
    res = run("config", ck, ok=2)
    assert "no training record names the layers" in res.stderr and "--trained-on" in res.stderr
    assert snapshot(ck) == before


def test_config_trained_on_needs_captured_at(make_ckpt):
    ck = make_ckpt("sglang")
    assert "--captured-at input|output" in run("config", ck, "--trained-on", "2,15,27", ok=2).stderr
    assert "--captured-at goes with --trained-on" in run("config", ck, "--captured-at", "input", ok=2).stderr


def test_config_refuses_an_unfixed_checkpoint(make_ckpt):
    ck = make_ckpt("speculators")
    res = run("config", ck, "--trained-on", "2,15,27", "--captured-at", "input", ok=2)
    assert "not yet in SGLang's layout" in res.stderr and "eagle3conv fix-keys" in res.stderr


def test_config_dry_run_writes_nothing(make_ckpt):
    ck = make_ckpt("sglang")
    before = snapshot(ck)
    res = run("config", ck, "--trained-on", "1,14,26", "--captured-at", "output", "--dry-run")
    assert "dry run: nothing written" in res.stdout and snapshot(ck) == before


def test_config_refuses_a_set_sglang_cannot_capture(make_ckpt):
    ck = make_ckpt("sglang")
    before = snapshot(ck)
    res = run("config", ck, "--trained-on", "0,14,26", "--captured-at", "input", ok=3)
    assert "embedding output" in res.stderr and snapshot(ck) == before


def test_config_wrong_count_for_fc(make_ckpt):
    ck = make_ckpt("sglang")
    res = run("config", ck, "--trained-on", "1,2,14,26", "--captured-at", "output", ok=3)
    assert "training captured 4 layers" in res.stderr and "fc reads 3" in res.stderr


def test_config_target_from_a_config_path_with_text_config(make_ckpt, tmp_path):
    tgt = tmp_path / "kimi-target"
    tgt.mkdir()
    (tgt / "config.json").write_text(json.dumps({
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "text_config": {"hidden_size": 7168, "num_hidden_layers": 61, "vocab_size": 163840,
                        "num_attention_heads": 64, "num_key_value_heads": 64}}))
    ck = make_ckpt("sglang", aux_ids=(2, 30, 58), **KIMI_DRAFTER)
    res = run("config", ck, "--target", tgt, "--trained-on", "3,31,59", "--captured-at", "input", "--json")
    d = json.loads(res.stdout)
    assert d["target"]["num_hidden_layers"] == 61
    # the config's ids meant the record only in SGLang <= 0.5.12: the current release wins,
    # and the report says what 0.5.12 needs
    written = {f["field"]: f["ids"] for f in d["wiring"]["written"]["ids"]}
    assert written[NESTED] == [3, 31, 59]
    (warn,) = [f for f in d["wiring"]["findings"] if f["code"] == "engine-needs-other-ids"]
    assert f"for sglang {OLDEST_SGLANG} write [2, 30, 58]" in warn["message"]
    per = {e["engine"]: e["ids"] for e in d["wiring"]["written"]["per_engine"]}
    assert per[f"sglang=={OLDEST_SGLANG}"] == [2, 30, 58] and per[f"sglang=={NEWEST_SGLANG}"] == [3, 31, 59]
    # --engine picks the release the ids are written for
    res = run("config", ck, "--target", tgt, "--engine", f"sglang=={OLDEST_SGLANG}", "--json")
    d = json.loads(res.stdout)
    assert {f["field"]: f["ids"] for f in d["wiring"]["written"]["ids"]}[NESTED] == [2, 30, 58] and d["wiring"]["ok"]
    run("config", ck, "--target", tgt, "--check", "--engine", f"sglang=={OLDEST_SGLANG}")
    run("config", ck, "--target", tgt, "--check", ok=3)  # the default set includes the newest SGLang


def test_config_out_of_range_for_target(make_ckpt):
    ck = make_ckpt("sglang")  # hidden 32 drafter: wrong target width too
    res = run("config", ck, "--target", "smollm2-135m", "--trained-on", "1,14,40", "--captured-at", "output", ok=3)
    assert "out of range" in res.stderr or "has 30 layers" in res.stderr


def test_config_from_dumps_manifest(make_ckpt, tmp_path):
    ck = make_ckpt("sglang", aux_ids=(1, 14, 26))
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "manifest.json").write_text(json.dumps({"captured_at_input_of": [2, 15, 27]}))
    d = json.loads(run("config", ck, "--dumps", dumps, "--json").stdout)
    assert d["wiring"]["trained_on"]["described"] == "outputs of layers 1, 14, 26"
    (nested,) = [f for f in d["wiring"]["written"]["ids"] if f["field"] == NESTED]
    assert nested["ids"] == [1, 14, 26] and len(nested["read_by"]) == 2  # both SGLang releases checked


# --- fix-keys converts trainer ids ---------------------------------------------------------------


def test_fix_keys_specforge_provenance_written(make_ckpt, tmp_path):
    ck = make_ckpt("specforge-runtime")  # provenance capture_layers [1, 14, 26], output-of-layer
    run("fix-keys", ck, "--out", tmp_path / "o")
    cfg = json.loads((tmp_path / "o" / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert "specforge_model_provenance" in cfg["eagle3conv"]["aux_layers"]["source"]


def test_fix_keys_speculators_null_ids_not_dropped_silently(make_ckpt, tmp_path):
    ck = make_ckpt("speculators")
    p = ck / "config.json"
    cfg = json.loads(p.read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = None  # what speculators 0.9.0 convert writes
    p.write_text(json.dumps(cfg))
    res = run("fix-keys", ck, "--out", tmp_path / "o")
    assert "config has no aux-layer ids" in res.stdout
    res = run("fix-keys", ck, "--out", tmp_path / "o2", "--trained-on", "2,15,27", "--captured-at", "input")
    cfg = json.loads((tmp_path / "o2" / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]


def test_fix_keys_idempotent_after_wiring(make_ckpt):
    ck = make_ckpt("specforge-runtime")
    run("fix-keys", ck)
    before = snapshot(ck)
    assert "already SGLang-ready" in run("fix-keys", ck).stdout
    assert snapshot(ck) == before


def test_inspect_shows_the_wiring(incident):
    res = run("inspect", incident, "--target", "kimi-k2.5", ok=3)
    assert "aux layers:" in res.stdout
    assert "trained on: outputs of layers 2, 30, 58" in res.stdout
    assert "REFUSED: " in res.stdout and "embedding output" in res.stdout


# --- targets -------------------------------------------------------------------------------------


def test_targets_lists_every_profile():
    res = run("targets")
    for name in ("kimi-k2.5", "kimi-k2", "deepseek-v3", "llama-3.1-8b", "llama-3.3-70b", "qwen3-8b", "qwen3-32b",
                 "qwen3-235b-a22b", "gpt-oss-120b", "smollm2-135m"):
        assert name in res.stdout
    d = json.loads(run("targets", "--json").stdout)
    assert len(d["targets"]) == 10


def test_targets_one_profile():
    d = json.loads(run("targets", "kimi-k2.5", "--json").stdout)["targets"][0]
    assert d["num_hidden_layers"] == 61 and d["hidden_size"] == 7168
    aux = {a["engine"]: a for a in d["default_aux_layers"]}
    assert {a["captures"] for a in aux.values()} == {"outputs of layers 1, 29, 57"}
    assert aux[f"vllm=={NEWEST_VLLM}"]["default_ids"] == [2, 30, 58] and aux["tensorrt-llm"]["default_ids"] == [1, 29, 57]
    assert "upstream" in d["sources"]
    text = run("targets", "kimi-k2.5").stdout
    assert f"sglang {NEWEST_SGLANG}: its default [2, 30, 58] -> outputs of layers 1, 29, 57" in text


def test_targets_unknown():
    assert "unknown target" in run("targets", "gpt-9", ok=2).stderr


# --- check_wiring: every finding -----------------------------------------------------------------


def rec(*layers, source="training_metadata.json"):
    return TrainingRecord(layers=tuple(layers) and outputs(*layers), source=source)


def codes(rep) -> dict[str, str]:
    return {f.code: f.level for f in rep.findings}


def cfg(nested=None, top=None) -> dict:
    c: dict = {}
    if nested is not None:
        c["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": nested}
    if top is not None:
        c["eagle_aux_hidden_state_layer_ids"] = top
    return c


KW = dict(fc_in=3 * 7168, target_hidden=7168, num_layers=61)


def test_check_all_good():
    rep = check_wiring(cfg([1, 29, 57], [2, 30, 58]), records=[rec(1, 29, 57)], **KW)
    assert rep.ok and codes(rep) == {"ids-as-trained": "ok"}
    assert all(r.as_trained for r in rep.rows) and len(rep.rows) == 4
    # what each release reads, by the engine rules
    assert rep.reads()[NESTED] == {f"sglang {OLDEST_SGLANG}": "outputs of layers 1, 29, 57",
                                   f"sglang {NEWEST_SGLANG}": "outputs of layers 1, 29, 57"}
    assert rep.reads()["eagle_aux_hidden_state_layer_ids"] == {f"vllm {NEWEST_VLLM}": "outputs of layers 1, 29, 57"}


def test_check_fc_width_and_counts():
    assert codes(check_wiring(cfg([1, 29, 57]), fc_in=100, target_hidden=7168))["fc-width"] == "error"
    rep = check_wiring(cfg([1, 29]), **KW)
    assert codes(rep)["id-count"] == "error" and "names 2 layers but fc reads 3" in rep.errors[0].message
    assert codes(check_wiring(cfg(), records=[rec(1, 29)], **KW))["record-count"] == "error"


def test_check_duplicates_unsorted_range():
    assert codes(check_wiring(cfg([2, 2, 58]), **KW))["duplicate-ids"] == "error"
    rep = check_wiring(cfg([30, 2, 58]), **KW)
    assert codes(rep)["unsorted-ids"] == "error" and "layer order" in rep.errors[0].message
    # a state the target does not have: every release reading the list says so, on its row
    rep = check_wiring(cfg([2, 30, 61]), **KW)
    assert codes(rep)["engine-cannot-capture"] == "error"
    assert {f.subject for f in rep.errors} == {f"sglang=={OLDEST_SGLANG}", f"sglang=={NEWEST_SGLANG}"}
    assert codes(check_wiring(cfg(top=[2, 30, 62]), **KW))["engine-cannot-capture"] == "error"
    assert codes(check_wiring(cfg(), records=[rec(2, 30, 61)], **KW))["record-range"] == "error"


def test_check_embedding():
    rep = check_wiring(cfg([-1, 2, 30]), **KW)
    (old,) = [f for f in rep.errors if f.subject == f"sglang=={OLDEST_SGLANG}"]
    assert old.code == "engine-cannot-capture" and "embedding output" in old.message
    # trained on the embedding output: a Llama-family target's vLLM captures it (id 0), SGLang cannot
    emb = TrainingRecord(layers=(EMBEDDING, *outputs(2, 30)), source="x")
    rep = check_wiring(cfg(top=[0, 3, 31]), records=[emb], family="llama", **KW)
    assert codes(rep)["trained-on-embedding"] == "warning"
    rows = {r.release.engine: r for r in rep.rows}
    assert rows["vllm"].as_trained and rows["sglang"].as_trained is False


def test_check_disagreements():
    rep = check_wiring(cfg([1, 29, 57]), records=[rec(2, 30, 58)], **KW)
    e = next(f for f in rep.errors if f.code == "disagrees-with-training")
    assert "captures outputs of layers 1, 29, 57" in e.message
    assert "training captured outputs of layers 2, 30, 58" in e.message
    rep = check_wiring(cfg(top=[2, 30, 58]), records=[rec(2, 30, 58)], **KW)
    assert any(f.code == "disagrees-with-training" and f.subject == f"vllm=={NEWEST_VLLM}" for f in rep.errors)
    # right for one release reading the field, wrong for another: not a contradiction of the record
    rep = check_wiring(cfg([2, 30, 58], [3, 31, 59]), records=[rec(2, 30, 58)], family="deepseek_v2", **KW)
    assert codes(rep)["engine-captures-other"] == "error" and "disagrees-with-training" not in codes(rep)
    rep = check_wiring(cfg(), records=[rec(2, 30, 58), rec(1, 29, 57, source="other")], **KW)
    assert codes(rep)["records-disagree"] == "error"


def test_check_one_sglang_version():
    # a DeepSeek-family target: no single nested list serves SGLang 0.5.12 and 0.5.23; the
    # current release wins and 0.5.12 is a warning naming its ids
    rep = check_wiring(cfg([3, 31, 59], [3, 31, 59]), records=[rec(2, 30, 58)], family="deepseek_v2", **KW)
    assert rep.ok and codes(rep) == {"engine-needs-other-ids": "warning", "ids-as-trained": "ok"}
    assert f"for sglang {OLDEST_SGLANG} write [2, 30, 58]" in rep.warnings[0].message
    # the family comes from the target, not from a name: on a Llama-family target every SGLang adds 1
    rep = check_wiring(cfg([3, 31, 59], [3, 31, 59]), records=[rec(2, 30, 58)], family="llama", **KW)
    assert codes(rep)["disagrees-with-training"] == "error"
    assert {r.release.spec for r in rep.rows if not r.ok} == {f"sglang=={OLDEST_SGLANG}", f"sglang=={NEWEST_SGLANG}"}


def test_check_no_ids():
    rep = check_wiring(cfg(), **KW)
    assert codes(rep) == {"no-ids": "warning"}
    msg = rep.warnings[0].message
    assert f"sglang {NEWEST_SGLANG} captures outputs of layers 1, 29, 57" in msg
    assert all(r.capture.fell_back and r.capture.ids is not None for r in rep.rows)
    assert {r.capture.ids for r in rep.rows} == {(2, 30, 58), (1, 29, 57)}  # vLLM/SGLang terms, TRT's terms
    assert codes(check_wiring(cfg(), records=[rec(2, 30, 58)], **KW))["defaults-disagree"] == "error"
    assert codes(check_wiring(cfg(), records=[rec(1, 29, 57)], **KW)) == {"no-ids": "warning"}
    rep = check_wiring(cfg(), source_format="specforge", **KW)
    assert codes(rep)["specforge-window"] == "warning"
    assert any("middle layer 30 instead of 29" in w.message for w in rep.warnings)
    # the reported case: a 40-layer MiniMax-M3-VL target, no ids, trained on outputs 2, 20, 37, checked for
    # SGLang 0.5.22 alone: its model file shifts the default ids too, so the row is ok and so is the check
    from eagle3conv.spec.engines import parse_engine

    rep = check_wiring(cfg(), records=[rec(2, 20, 37)], family="minimax_m3_vl", fc_in=3 * 7168, target_hidden=7168,
                       num_layers=40, engines=[parse_engine("sglang==0.5.22")], explicit_engines=True)
    assert rep.ok and rep.rows[0].as_trained, rep.errors
    assert codes(rep) == {"no-ids": "warning"} and "matches the training record" in rep.warnings[0].message


def test_check_one_engine_missing():
    rep = check_wiring(cfg(top=[2, 30, 58]), **KW)
    assert codes(rep)["default-used"] == "warning" and NESTED in rep.warnings[0].message
    rep = check_wiring(cfg(top=[3, 31, 59]), records=[rec(2, 30, 58)], **KW)
    assert codes(rep)["defaults-disagree"] == "error"
    assert {f.subject for f in rep.errors} == {f"sglang=={OLDEST_SGLANG}", f"sglang=={NEWEST_SGLANG}"}
    rep = check_wiring(cfg([1, 29, 57]), **KW)
    assert codes(rep)["default-used"] == "warning"
    assert "eagle_aux_hidden_state_layer_ids is absent" in next(f for f in rep.warnings if f.code == "default-used").message


def test_check_unverified_ids():
    """No record: the warning says what each asked SGLang release reads, by the engine rules for the
    target's family -- not the two generic numberings, which named a reading (PR #25454's first-id
    rule) that only the DeepSeek family's releases have."""
    rep = check_wiring(cfg([2, 30, 58]), family="deepseek_v2", **KW)
    assert codes(rep)["unverified-ids"] == "warning"
    (w,) = [f for f in rep.warnings if f.code == "unverified-ids"]
    assert f"sglang {OLDEST_SGLANG} reads outputs of layers 2, 30, 58" in w.message
    assert f"sglang {NEWEST_SGLANG} reads outputs of layers 1, 29, 57" in w.message  # the first-id rule
    rep = check_wiring(cfg([2, 30, 58]), family="llama", **KW)
    (w,) = [f for f in rep.warnings if f.code == "unverified-ids"]
    assert f"sglang {NEWEST_SGLANG} reads outputs of layers 2, 30, 58" in w.message  # no first-id rule there
    assert "PR #25454" not in w.message
    # without the target's layer count the rows read the ids all the same (no range check), for the
    # families the table does not single out, and say what they cannot know
    rep = check_wiring(cfg([2, 30, 58]), fc_in=3 * 7168, target_hidden=7168)
    (w,) = [f for f in rep.warnings if f.code == "unverified-ids"]
    assert "PR #25454" not in w.message and "outputs of layers 2, 30, 58" in w.message
    vllm = next(r for r in rep.rows if r.release.engine == "vllm")
    assert vllm.layers is None and "--target" in vllm.capture.unknown


def test_check_target_width(make_ckpt):
    ck = make_ckpt("sglang")  # a hidden-32 drafter
    res = run("config", ck, "--target", "kimi-k2.5", "--check", ok=3)
    assert "reads target states of width 32, but kimi-k2.5's hidden size is 7168" in res.stdout


# --- review findings -------------------------------------------------------------------------------


def test_empty_id_entries_are_refused(make_ckpt):
    ck = make_ckpt("sglang")
    for bad in ("1,,14,26", ",1,14,26", "1,14,26,"):
        res = run("config", ck, "--trained-on", bad, "--captured-at", "output", "--dry-run", ok=2)
        assert "empty entry" in res.stderr
    from eagle3conv.spec.layers import parse_ids

    assert parse_ids("[2, 30, 58]") == (2, 30, 58) and parse_ids("2 30 58") == (2, 30, 58)


def test_eagle_config_that_is_not_an_object(make_ckpt):
    ck = make_ckpt("sglang")
    p = ck / "config.json"
    cfg = json.loads(p.read_text())
    cfg["eagle_config"] = "hello"
    p.write_text(json.dumps(cfg))
    res = run("config", ck, "--check", ok=3)
    assert "eagle_config must be an object" in res.stdout


def test_config_writes_config_first_and_readable_metadata(make_ckpt):
    import os
    import stat

    ck = make_ckpt("sglang")
    (ck / ".config.json.eagle3conv-tmp").write_text("{half")  # left by a killed earlier run
    run("config", ck, "--trained-on", "1,14,26", "--captured-at", "output")
    assert not (ck / ".config.json.eagle3conv-tmp").exists()
    mode = stat.S_IMODE(os.stat(ck / "training_metadata.json").st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask


def test_config_names_shape_problems(make_ckpt):
    ck = make_ckpt("sglang")
    p = ck / "config.json"
    cfg = json.loads(p.read_text())
    cfg["hidden_size"] = 128
    p.write_text(json.dumps(cfg))
    res = run("config", ck, "--trained-on", "1,14,26", "--captured-at", "output", ok=3)
    assert "not yet in SGLang's layout" not in res.stderr and "nothing was written" in res.stderr


def test_targets_empty_name():
    assert "the name is empty" in run("targets", "", ok=2).stderr
