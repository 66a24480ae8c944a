"""One engine model (issue 20): the ids `config` writes and the rows every report shows come from the
same rules, and never contradict each other.

For every target family x every release read (each SGLang release, vLLM with each runner,
TensorRT-LLM) x several layer counts x training records (random, plus the edges: layer 0 first, the
last layer, the embedding output, layers next to each other), the config `config` writes for that
release makes it capture exactly what its row reports, the row is as trained whenever the rules allow
any id list to name the record, and the check never reports an error about a release whose row is as
trained. The MiniMax-M3-VL config the old model failed is one of the cases, through the CLI too.
"""

from __future__ import annotations

import json
import random

import pytest

from helpers import SGLANG_RELEASES, VLLM_RELEASES, run
from eagle3conv.spec import engines as E
from eagle3conv.spec.layers import EMBEDDING, LayerRef, outputs
from eagle3conv.wiring.check import check_wiring
from eagle3conv.wiring.config_ids import wiring_edits
from eagle3conv.wiring.metadata import TrainingRecord

FAMILIES = sorted(E.families())
RELEASES = ([f"sglang=={r}" for r in SGLANG_RELEASES] + [f"vllm=={v}:runner={r}" for v in VLLM_RELEASES
                                                          for r in ("mrv2", "v1")] + ["tensorrt-llm"])
LAYER_COUNTS = (8, 40, 61)


def records(n: int, rng: random.Random) -> list[tuple]:
    sets = [outputs(1, n // 2 - 1, n - 4), outputs(0, n // 2, n - 2), outputs(2, 3, 4), outputs(1, n - 2, n - 1),
            (EMBEDDING, *outputs(2, n // 2))]
    for _ in range(4):
        k = rng.choice((1, 3, 3, 5))
        sets.append(tuple(sorted(LayerRef(i) for i in rng.sample(range(-1, n), k))))
    return sets


def _case(family: str, spec: str, n: int, layers) -> None:
    rel = E.parse_engine(spec)
    rec = TrainingRecord(layers=layers, source="a test record")
    where = E.id_field(rel)
    can = E.ids_for(rel, family, n, layers) is not None
    try:
        edits = wiring_edits({}, rec, num_layers=n, target="t", family=family, releases=(rel,))
    except Exception as err:  # noqa: BLE001 - which error is the rules': checked below
        assert not can or not where.in_config, (family, spec, n, layers, err)
        return
    config: dict = {}
    for e in edits.config_edits:
        config[e.field] = e.new
    launch = edits.plan.ids(where) if not where.in_config else None
    report = check_wiring(config, records=[rec], num_layers=n, family=family, engines=[rel], explicit_engines=True)
    (row,) = report.rows
    label = (family, spec, n, layers, config.get("eagle_config"), config.get("eagle_aux_hidden_state_layer_ids"))
    # the row reports exactly what the release captures from the written config (the same rules)
    cap = E.capture(rel, config, family, n, launch_ids=launch)
    assert row.layers == cap.layers or not where.in_config, label
    # written wherever the rules allow: the release then captures the record
    if can:
        assert (cap.layers == layers), label
        if where.in_config:
            assert row.as_trained is True, label
    # the check never reports an error against a row that is as trained
    errors = [f for f in report.errors if f.subject == rel.spec]
    if row.as_trained:
        assert not errors, (label, errors)
    if where.in_config and not can:
        assert not row.ok or row.as_trained is not True, label


@pytest.mark.parametrize("family", FAMILIES)
def test_written_ids_and_rows_agree_for_every_release(family):
    rng = random.Random(f"engine-model-{family}")
    cases = 0
    for n in LAYER_COUNTS:
        for layers in records(n, rng):
            for spec in RELEASES:
                _case(family, spec, n, layers)
                cases += 1
    assert cases == len(LAYER_COUNTS) * 9 * len(RELEASES)


def test_default_set_written_config_serves_every_release_it_can(tmp_path):
    """The config written for the default set (no --engine): every default release whose field holds
    the list its priority release needs captures the record, and the check reports exactly the others."""
    rng = random.Random("default-set")
    for family in FAMILIES:
        for n in LAYER_COUNTS:
            for layers in records(n, rng)[:5]:
                rec = TrainingRecord(layers=layers, source="r")
                try:
                    edits = wiring_edits({}, rec, num_layers=n, target="t", family=family)
                except Exception:  # noqa: BLE001 - no release of some engine reading config.json can
                    continue
                config = {e.field: e.new for e in edits.config_edits}
                report = check_wiring(config, records=[rec], num_layers=n, family=family)
                for row in report.rows:
                    if not row.field.in_config or row.capture.error and row.capture.error.code == "engine-unsupported":
                        continue
                    errs = [f for f in report.errors if f.subject == row.release.spec]
                    assert bool(errs) == (row.as_trained is False and row.finding.level == "error"), (
                        family, n, layers, row.release, row.as_trained, errs)


def test_the_minimax_m3_vl_case_through_the_cli(make_ckpt, tmp_path):
    """issue 20's report: a 40-layer MiniMax-M3-VL target (layers in text_config), a drafter trained on
    outputs 2, 20, 37, a config with no ids, checked for SGLang 0.5.22: the old model said check: FAILED
    beside a row that said ok. One model: the row and the check agree, passed."""
    target = tmp_path / "target.json"
    target.write_text(json.dumps({
        "architectures": ["MiniMaxM3SparseForConditionalGeneration"], "model_type": "minimax_m3_vl",
        "text_config": {"hidden_size": 32, "num_hidden_layers": 40, "vocab_size": 1024, "num_attention_heads": 4,
                        "num_key_value_heads": 2}}))
    ck = make_ckpt("sglang")
    cfg = json.loads((ck / "config.json").read_text())
    cfg.pop("eagle_config", None)
    (ck / "config.json").write_text(json.dumps(cfg))
    res = run("config", ck, "--target", target, "--trained-on", "2,20,37", "--captured-at", "output",
              "--engine", "sglang==0.5.22", "--check", "--json")
    d = json.loads(res.stdout)["wiring"]
    (row,) = d["engines"]
    assert row["as_trained"] and row["captures"] == "outputs of layers 2, 20, 37" and d["ok"]
    assert not [f for f in d["findings"] if f["level"] == "error"]


def test_the_config_verdict_names_a_release_the_written_ids_do_not_serve(make_ckpt, tmp_path):
    """A DeepSeek-V3-family target whose training record is in input numbering: SGLang 0.5.12 and
    0.5.23 read the same field with different numberings, so no id list serves both; the verdict
    line must not say "for every engine" while a row warns."""
    target = tmp_path / "ds.json"
    target.write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                                  "hidden_size": 32, "num_hidden_layers": 61, "vocab_size": 1024,
                                  "num_attention_heads": 4, "num_key_value_heads": 4}))
    ck = make_ckpt("sglang")
    res = run("config", ck, "--target", target, "--trained-on", "3,31,59", "--captured-at", "input")
    d = json.loads(run("config", ck, "--target", target, "--check", "--json").stdout)["wiring"]
    missed = [r["release"] for r in d["engines"] if r["as_trained"] is False]
    first = res.stdout.splitlines()[0]
    assert missed, d["engines"]  # the older SGLang numbering reads [3, 31, 59] as other layers
    assert "for every engine release checked except" in first and all(m in first for m in missed), first


def test_every_config_json_carries_its_verdict_as_codes(make_ckpt, tmp_path):
    """issue 27: ``config --json`` carries the verdict its text leads with, as codes and values CI reads
    (``--check`` had none): the outcome, the counts, the layers written and the releases they do not serve."""
    target = tmp_path / "ds.json"
    target.write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                                  "hidden_size": 32, "num_hidden_layers": 61, "vocab_size": 1024,
                                  "num_attention_heads": 4, "num_key_value_heads": 4}))
    ck = make_ckpt("sglang")
    dry = json.loads(run("config", ck, "--target", target, "--trained-on", "3,31,59", "--captured-at", "input",
                         "--dry-run", "--json").stdout)
    missed = [r["release"] for r in dry["wiring"]["engines"] if r["as_trained"] is False]
    assert missed and dry["verdict"] == {"outcome": "wrote", "ok": True, "errors": 0, "warnings": len(missed),
                                         "layers": "outputs of layers 2, 30, 58", "except_releases": missed}
    run("config", ck, "--target", target, "--trained-on", "3,31,59", "--captured-at", "input")
    again = json.loads(run("config", ck, "--target", target, "--json").stdout)["verdict"]
    assert again["outcome"] == "already-wired" and again["layers"] == "outputs of layers 2, 30, 58"
    check = run("config", ck, "--target", target, "--check", "--json")
    v, w = json.loads(check.stdout)["verdict"], json.loads(check.stdout)["wiring"]
    assert v["outcome"] == ("passed" if w["ok"] else "failed") and v["ok"] is w["ok"]
    assert v["errors"] == sum(f["level"] == "error" for f in w["findings"])
    assert v["warnings"] == sum(f["level"] == "warning" for f in w["findings"])
    text = run("config", ck, "--target", target, "--check").stdout.splitlines()[0]
    assert text == f"check: passed ({v['errors']} errors, {v['warnings']} warning{'s' * (v['warnings'] != 1)})"


def test_releases_that_read_alike_share_a_row(make_ckpt, tmp_path):
    """issue 27 (the docs said so, the reports printed identical SGLang rows): neighbouring releases of one
    engine whose rows are identical share one row in the text, labelled with each; ``--json`` keeps one
    entry per release (each findable by its ``release``) and names the row's releases on each. Releases
    that read the config otherwise keep their own rows."""
    from helpers import NEWEST_SGLANG, OLDEST_SGLANG

    ck = make_ckpt("sglang", target_hidden=576, vocab=49152)
    run("config", ck, "--target", "smollm2-135m", "--trained-on", "1,14,26", "--captured-at", "output")
    text = run("config", ck, "--target", "smollm2-135m", "--check").stdout
    both = f"sglang {OLDEST_SGLANG}, {NEWEST_SGLANG}"
    assert f"ok   {both}: reads eagle_config.eagle_aux_hidden_state_layer_ids [1, 14, 26]" in text, text
    assert f"sglang {NEWEST_SGLANG}:" not in text and f"sglang {OLDEST_SGLANG}:" not in text
    rows = json.loads(run("config", ck, "--target", "smollm2-135m", "--check", "--json").stdout)["wiring"]["engines"]
    by = {r["release"]: r for r in rows}
    assert by[f"sglang {OLDEST_SGLANG}"]["releases"] == by[f"sglang {NEWEST_SGLANG}"]["releases"] == [
        f"sglang {OLDEST_SGLANG}", f"sglang {NEWEST_SGLANG}"]
    assert all(r["releases"] == [r["release"]] for r in rows if not r["release"].startswith("sglang "))
    # a DeepSeek-V3-family target: the two SGLang releases read the ids with different numberings
    target = tmp_path / "ds.json"
    target.write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                                  "hidden_size": 32, "num_hidden_layers": 61, "vocab_size": 1024,
                                  "num_attention_heads": 4, "num_key_value_heads": 4}))
    ds = make_ckpt("sglang")
    run("config", ds, "--target", target, "--trained-on", "3,31,59", "--captured-at", "input")
    text = run("config", ds, "--target", target, "--check").stdout
    assert f"sglang {NEWEST_SGLANG}: reads" in text and f"sglang {OLDEST_SGLANG}: reads" in text and both not in text
