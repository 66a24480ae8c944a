"""render reads typed results, never their ``to_dict`` shapes (issue 27, review B5).

A result's ``to_dict`` is its JSON; the text is made from the typed objects (VerifyResult and its
views, LaunchResult / LaunchLine / LaunchCheck, Wiring / WiringReport / EngineRow), so a field renamed
on either side fails loudly (AttributeError, KeyError) instead of printing ``None`` or dropping a line.
Each test renders real results of the bundled fixtures through the typed path; a dict handed where a
typed result is wanted raises; and the launch and wiring text are made with every ``to_dict`` on the
way disabled, which proves they read none of them.
"""

from __future__ import annotations

import json

import pytest
import torch

from eagle3conv.example import Dims, write_example
from eagle3conv.states.format import write_states

TARGET = "smollm2-135m"
GOOD_LINE = ("python -m sglang.launch_server --model-path HuggingFaceTB/SmolLM2-135M-Instruct "
             "--speculative-algorithm EAGLE3 --speculative-draft-model-path drafter --speculative-num-steps 3 "
             "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4")
WRONG_LINE = ("python -m sglang.launch_server --model-path HuggingFaceTB/SmolLM2-135M-Instruct "
              "--speculative-algorithm EAGLE --speculative-draft-model-path drafter --quantization fp8")


def _no_dict(*_a, **_k):
    raise AssertionError("render read a to_dict() document")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny drafter and random states that name their layers (json_sidebyside's tiny inputs)."""
    root = tmp_path_factory.mktemp("typed")
    d = Dims(hidden=64, target_hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512,
             draft_vocab=300, aux_ids=(1, 3, 4))
    write_example(root / "drafter", "sglang", d)
    g = torch.Generator().manual_seed(0)
    b, s = 3, 40
    write_states(root / "states.safetensors", input_ids=torch.randint(0, 512, (b, s), generator=g),
                 attention_mask=torch.ones(b, s, dtype=torch.bool), target_next=torch.randint(0, 512, (b, s), generator=g),
                 hidden={o: torch.randn(b, s, 64, generator=g) for o in (-1, 1, 3, 4)}, num_layers=6, vocab_size=512,
                 target="tiny")
    return root / "drafter", root / "states.safetensors"


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    """A modelopt example fixed into SGLang's names for SmolLM2 (the launch fixtures)."""
    from eagle3conv.api import fix_keys
    from eagle3conv.wiring.options import WiringOptions

    root = tmp_path_factory.mktemp("fixed")
    write_example(root / "src", "modelopt-export")
    fix_keys(root / "src", out=root / "drafter", wiring_options=WiringOptions(target=TARGET))
    return root / "drafter"


@pytest.mark.parametrize("kw", [{}, {"search": True}, {"layers": [1, 3, 4]}], ids=["config", "search", "layers"])
def test_verify_text_renders_the_typed_result_and_refuses_its_dict(tiny, kw):
    from eagle3conv.render import verify_text
    from eagle3conv.verify import verify

    drafter, states = tiny
    res = verify(drafter, states, save=False, steps=2, **kw)
    text = verify_text(res)
    d = res.to_dict()
    m = d["results"][0]
    assert text.splitlines()[0].startswith(f"verify: accept length {m['accept_length']:.3f} "
                                           f"[{m['accept_length_ci95'][0]:.3f}, {m['accept_length_ci95'][1]:.3f}]")
    assert f"states:     states.safetensors ({d['states']['source']}; {d['states']['sequences']} sequences, " \
           f"{d['states']['tokens']} tokens; target tiny)" in text
    assert ("wiring search (accept length over every chain start" in text) == (len(d["results"]) > 1)
    labels = [line[7:].split(":")[0] for line in text.splitlines() if line[:7] in ("  ok   ", "  warn ", "  ?    ",
                                                                                "  BAD  ", "  n/a  ")]
    for e in d["wiring_check"]["engine_scores"]:  # every release's row, scored or not (alike ones share a row)
        engine, _, version = e["release"].partition(" ")
        assert any(x.startswith(engine) and version in x for x in labels), (e["release"], labels)
    with pytest.raises(AttributeError):
        verify_text(d)


def _rename_key(monkeypatch, cls, method, old, new):
    """Make ``cls.method`` return its dict with the key ``old`` renamed to ``new``."""
    original = getattr(cls, method)

    def renamed(self):
        d = original(self)
        d[new] = d.pop(old)
        return d

    monkeypatch.setattr(cls, method, renamed)


def test_a_field_renamed_where_the_states_summary_is_made_fails_the_text_loudly(tiny, monkeypatch):
    """The text used to read ``st.get("tokens")``: a renamed key printed "None tokens". Now the typed view
    reads each field by its name and the rename is an error."""
    from eagle3conv.render import verify_text
    from eagle3conv.states.format import CapturedStates
    from eagle3conv.verify import verify

    _rename_key(monkeypatch, CapturedStates, "summary", "tokens", "num_tokens")
    res = verify(*tiny, save=False, steps=2)
    with pytest.raises(KeyError, match="tokens"):
        verify_text(res)


@pytest.mark.parametrize("check", [None, GOOD_LINE, WRONG_LINE], ids=["lines", "check-good", "check-wrong"])
def test_launch_text_reads_no_dict(fixed, check, monkeypatch):
    from eagle3conv.api import LaunchResult, launch
    from eagle3conv.render import launch_check_lines, launch_text
    from eagle3conv.spec.launch import LaunchLine
    from eagle3conv.spec.launch_check import LaunchCheck
    from eagle3conv.wiring.options import WiringOptions

    res = launch(fixed, options=WiringOptions(target=TARGET if check is None else None), check=check)
    d = res.to_dict()
    for cls in (LaunchResult, LaunchLine, LaunchCheck):
        monkeypatch.setattr(cls, "to_dict", _no_dict)
    text = launch_text(res)
    lines = text.splitlines()
    if check is None:
        assert lines[0] == f"launch: {sum(bool(r['line']) for r in d['rows'])} of {len(d['rows'])} engine " \
                           "releases serve this drafter"
    else:
        assert lines[0] == launch_check_lines(res.check)[0]
        assert lines[0].startswith(f"launch check for {d['check']['label']}: "
                                   f"{'passed' if d['check']['ok'] else 'FAILED'}")
    for r in d["rows"]:
        if r["line"]:
            assert any(line.endswith(f": {r['line']}") for line in lines), r
    with pytest.raises(AttributeError):
        launch_text(d)
    if res.check is not None:
        with pytest.raises(AttributeError):
            launch_check_lines(d["check"])


def test_the_wiring_rows_are_rendered_from_the_typed_wiring(fixed, monkeypatch):
    """config's and inspect's wiring (and the plan's, which now keeps the typed Wiring instead of its
    document) render with every wiring to_dict disabled; the plan's JSON still carries the document."""
    from eagle3conv.api import configure, inspect
    from eagle3conv.render import wiring_lines
    from eagle3conv.wiring.apply import Wiring
    from eagle3conv.wiring.check import WiringReport
    from eagle3conv.wiring.config_ids import WiringEdits
    from eagle3conv.wiring.options import WiringOptions

    opts = WiringOptions(target=TARGET, trained_on="1,14,26", captured_at="output")
    res = configure(fixed, options=opts, dry_run=True)
    plan = inspect(fixed, wiring_options=opts).plan
    assert isinstance(plan.wiring.report, Wiring)
    doc = plan.to_dict()["wiring"]
    assert doc == plan.wiring.report.to_dict(str(fixed)) and doc["written"]["launch"]
    w = res.wiring.to_dict(str(fixed))
    for cls, name in ((Wiring, "to_dict"), (WiringReport, "to_dict"), (WiringEdits, "to_dict"),
                      (WiringEdits, "fields")):
        monkeypatch.setattr(cls, name, _no_dict)
    for wiring in (res.wiring, plan.wiring.report):
        lines = wiring_lines(wiring, verbose=True)
        assert lines[0] == f"trained on: {w['trained_on']['described']} ({w['trained_on']['source']})"
        for f in w["written"]["ids"]:
            where = f["field"] if f["kind"] == "config" else f"launch option {f['field']}"
            assert f"  {where} = {f['ids']}   (read by {', '.join(f['read_by'])})" in lines
        shown = [x for x in lines if x.startswith("  ok ") or x.startswith("  BAD ") or x.startswith("  warn ")]
        assert len(shown) == len({tuple(r["releases"]) for r in w["engines"]})
        for r in (r for r in w["engines"] if r["release"] == r["releases"][0]):  # --verbose: the runner, the notes
            assert (f"       runner: {r['runner_assumed']}" in lines) == bool(r["runner_assumed"]), r["release"]
            assert all(f"       ({note})" in lines for note in r["notes"]), r["release"]
    assert any(r["runner_assumed"] for r in w["engines"])  # vLLM's default runner: the line is exercised
    with pytest.raises(AttributeError):
        wiring_lines(w)


def test_the_smoke_text_renders_the_typed_wiring(fixed):
    from eagle3conv.render import smoke_text
    from eagle3conv.verify import smoke
    from eagle3conv.wiring.apply import Wiring
    from eagle3conv.wiring.options import WiringOptions

    r = smoke(fixed, wiring_options=WiringOptions(target=TARGET))
    assert isinstance(r.wiring, Wiring)
    d = r.to_dict()
    assert d["wiring"] == r.wiring.to_dict(str(fixed)) and d["wiring_ok"] is r.wiring_ok
    text = smoke_text(r)
    assert "wiring:\n  trained on: " in text and f"ok: {r.ok}" in text


def test_the_smoke_verdict_is_typed_and_its_words_make_the_ok_line(fixed):
    """verify without states carries a typed verdict (SmokeVerdict: runs / forward-failed /
    wiring-failed / both-failed, the forward's problems, the wiring check's error codes), in --json
    and as the text's ``ok:`` line."""
    import dataclasses

    from eagle3conv.findings import LOGITS_SHAPE, Finding
    from eagle3conv.render import smoke_text
    from eagle3conv.verify import smoke
    from eagle3conv.verify.run import SmokeOutcome
    from eagle3conv.wiring.options import WiringOptions

    r = smoke(fixed, wiring_options=WiringOptions(target=TARGET))
    v = r.verdict()
    assert v.outcome is SmokeOutcome.RUNS and v.wiring_errors == () and r.to_dict()["verdict"] == {
        "outcome": "runs", "problems": [], "wiring_errors": []}
    assert "ok: True" in smoke_text(r)
    bad = dataclasses.replace(r.forward, ok=False, findings=(Finding("error", "smoke", LOGITS_SHAPE, "step 1: NaN"),))
    cases = {SmokeOutcome.FORWARD_FAILED: dataclasses.replace(r, forward=bad),
             SmokeOutcome.WIRING_FAILED: dataclasses.replace(r, wiring_ok=False),
             SmokeOutcome.BOTH_FAILED: dataclasses.replace(r, forward=bad, wiring_ok=False)}
    lines = {"forward-failed": "ok: False (the forward failed)",
             "wiring-failed": "ok: False (the wiring failed; the forward itself ran clean)",
             "both-failed": "ok: False (the forward and the wiring failed)"}
    for outcome, res in cases.items():
        assert res.verdict().outcome is outcome and res.to_dict()["verdict"]["outcome"] == outcome.value
        assert lines[outcome.value] in smoke_text(res)
    assert cases[SmokeOutcome.FORWARD_FAILED].verdict().problems == ("step 1: NaN",)


def test_a_figure_renamed_in_the_scores_document_fails_the_text_loudly(tiny, monkeypatch):
    """The wiring's figures are the report's (as rounded there): a figure the score's document stops
    stating under its name is an error in the text, not "None chains"."""
    from eagle3conv.render import verify_text
    from eagle3conv.verify import verify
    from eagle3conv.verify.evaluate import Score

    _rename_key(monkeypatch, Score, "to_dict", "chains", "full_chains")
    res = verify(*tiny, save=False, steps=2)
    with pytest.raises(ValueError, match="states no chains"):
        verify_text(res)


def test_the_verdicts_set_members_and_paired_differences_are_typed():
    """The confidence set's members and the paired differences are typed values (search.SetMember,
    PairedDifference): the report's entries round-trip byte for byte, and the text reads their
    fields, so a dict where a member is wanted fails loudly."""
    import dataclasses

    from eagle3conv.render import confidence_set_lines
    from eagle3conv.verify.search import PairedDifference, SetMember, Verdict

    members = [{"wiring": "search #1", "layers": "outputs of layers 1, 14, 26", "confirmed": True,
                "accept_length_all_starts": 1.8424, "accept_length_gap": [0.0, -0.01, 0.01],
                "log_score_gap": [0.001, None, 0.002]},
               {"wiring": "config", "layers": "outputs of layers 2, 14, 26", "confirmed": True,
                "accept_length_all_starts": 1.8401},
               {"layers": "outputs of layers 3, 14, 26", "confirmed": False}]
    pds = [{"wiring": "config", "layers": "outputs of layers 2, 14, 26", "accept_length_gap": 0.0023,
            "ci95": [-0.01, 0.014], "excluded": False}]
    v = Verdict.from_dict({"config_accept_length": 1.84, "status": "ambiguous", "confidence_set": members,
                           "paired_differences": pds, "set_statistic": "acceptance"})
    assert all(isinstance(m, SetMember) for m in v.confidence_set)
    assert isinstance(v.paired_differences[0], PairedDifference)
    d = v.to_dict()
    assert d["confidence_set"] == members and d["paired_differences"] == pds
    lines = confidence_set_lines(v)
    assert lines[1] == "  outputs of layers 1, 14, 26: accept length 1.8424 over every chain start"
    assert lines[3] == "  outputs of layers 3, 14, 26: kept by the screen, not confirmed"
    with pytest.raises(AttributeError):
        confidence_set_lines(dataclasses.replace(v, confidence_set=tuple(members)))


# --------------------------------------------------------------------------- inspect, fix-keys, config (review B5)


def _no_plan_dicts(monkeypatch):
    """Every to_dict on the way from a plan or a config result to its text disabled: the result, the plan and
    its decisions, outputs, config edits, quantization and wiring."""
    from eagle3conv.api import ConfigResult, FixResult, InspectResult
    from eagle3conv.checkpoint.config import ConfigEdit
    from eagle3conv.checkpoint.plan import Decision, Output, Plan
    from eagle3conv.checkpoint.quantized import DraftQuantization
    from eagle3conv.errors import Eagle3ConvError
    from eagle3conv.spec.launch import LaunchLine
    from eagle3conv.wiring.apply import Wiring
    from eagle3conv.wiring.check import WiringReport
    from eagle3conv.wiring.config_ids import WiringEdits

    for cls, name in ((InspectResult, "to_dict"), (FixResult, "to_dict"), (ConfigResult, "to_dict"),
                      (Plan, "to_dict"), (Decision, "to_dict"), (Output, "to_dict"), (ConfigEdit, "to_dict"),
                      (DraftQuantization, "to_dict"), (Eagle3ConvError, "to_dict"), (LaunchLine, "to_dict"),
                      (Wiring, "to_dict"), (WiringReport, "to_dict"), (WiringEdits, "to_dict"),
                      (WiringEdits, "fields"), (WiringEdits, "launch")):
        monkeypatch.setattr(cls, name, _no_dict)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Unconverted drafters (a modelopt export, a SpecForge checkpoint), a folder no plan can be made of (no
    config), and the smollm2 drafter quantized FP8 by compressed-tensors' own code."""
    from pathlib import Path

    root = tmp_path_factory.mktemp("sources")
    for fmt in ("modelopt-export", "specforge"):
        write_example(root / fmt, fmt)
    write_example(root / "no-config", "modelopt-export")
    (root / "no-config" / "config.json").unlink()
    out = {"modelopt-export": root / "modelopt-export", "specforge": root / "specforge",
           "no-config": root / "no-config"}
    try:
        import compressed_tensors  # noqa: F401
        import sys

        sys.path.insert(0, str(Path(__file__).parent))
        from quant_producer import quantize_drafter

        out["fp8"] = quantize_drafter(Path(__file__).parent / "data" / "smollm2-drafter", root / "fp8", "FP8_DYNAMIC")
    except ImportError:
        pass
    return out


@pytest.mark.parametrize("name", ["modelopt-export", "specforge", "no-config", "fixed"])
@pytest.mark.parametrize("verbose", [False, True], ids=["plain", "verbose"])
def test_inspect_text_reads_no_dict(sources, fixed, name, verbose, monkeypatch):
    from eagle3conv.api import inspect
    from eagle3conv.render import inspect_text
    from eagle3conv.wiring.options import WiringOptions

    res = inspect(fixed if name == "fixed" else sources[name], wiring_options=WiringOptions(target=TARGET))
    d = res.to_dict()
    _no_plan_dicts(monkeypatch)
    text = inspect_text(res, verbose=verbose)
    lines = text.splitlines()
    if name == "no-config":
        assert lines[0] == f"inspect: fix-keys cannot plan: {d['plan_error']['message']}"
        assert (f"hint: {d['plan_error']['hint']}" in lines) == bool(d["plan_error"]["hint"])
    else:
        p = d["plan"]
        assert lines[0].startswith(f"inspect: a {p['format']} checkpoint ({p['format_title']}); ")
        assert f"  writes:   {p['architecture']}" in lines
        assert f"  output:   {len(p['outputs'])} tensors, " in text
        for s in p["shards"]:
            assert f"    {s['file']}: {len(s['tensors'])} tensors" in lines
        for o in p["outputs"]:
            if o.get("cast_from") or o.get("rewritten"):
                assert any(x.startswith(f"    *  {o['name']}: ") for x in lines), o
        shown = [x for x in lines if x.startswith("    ") and x[4:6].strip() in ("=", "~", "/", "x", "!!", "+")]
        assert len(shown) >= sum(dec["action"] not in ("kept", "dropped") for dec in p["decisions"])
    assert lines[1] == f"checkpoint: {d['checkpoint']}"
    assert f"tensors:    {len(d['tensors'])}, " in text
    for t in d["tensors"][:200]:
        assert any(x.startswith(f"  {t['name']} ") and f" {t['dtype']:>5}  {str(t['shape'])}" in x for x in lines), t
    with pytest.raises(AttributeError):
        inspect_text(d)


@pytest.mark.parametrize("mode", ["dry-run", "out", "out-verbose", "unchanged", "fp16", "fp8"])
def test_fix_text_reads_no_dict(sources, fixed, tmp_path, mode, monkeypatch):
    import shutil

    from eagle3conv.api import fix_keys
    from eagle3conv.render import fix_text
    from eagle3conv.wiring.options import WiringOptions

    if mode == "fp8" and "fp8" not in sources:
        pytest.skip("compressed-tensors is not installed")
    src = {"fp8": sources.get("fp8"), "unchanged": tmp_path / "fixed"}.get(mode, sources["modelopt-export"])
    if mode == "unchanged":
        shutil.copytree(fixed, src)
    kw = {"dry-run": dict(dry_run=True), "unchanged": {}, "fp16": dict(out=tmp_path / "o", dtype="fp16"),
          "fp8": dict(out=tmp_path / "o")}.get(mode, dict(out=tmp_path / "o"))
    opts = WiringOptions(engines=("vllm==0.33.0",)) if mode == "fp8" else WiringOptions(target=TARGET)
    res = fix_keys(src, wiring_options=opts, **kw)
    d = res.to_dict()
    _no_plan_dicts(monkeypatch)
    text = fix_text(res, verbose=mode == "out-verbose")
    lines = text.splitlines()
    p = d["plan"]
    if mode == "unchanged":
        assert d["unchanged"] and lines[0] == f"fix-keys: {d['output']} is already SGLang-ready; left byte-for-byte unchanged"
    elif mode != "dry-run":
        assert lines[0] == (f"fix-keys: wrote {d['output']}: {len(d['files'])} files, " + lines[0].split(" files, ")[1])
        assert f"; {d['tensors_verified']} tensors re-read and proven equal" in lines[0] and d["tensors_verified"]
    assert f"format:   {p['format']} — {p['format_title']}" in lines
    for e in p["config_edits"]:
        assert any(e["field"] in x and f"({e['why']})" in x for x in lines), e
    if mode in ("dry-run", "out-verbose"):
        assert f"output:   {len(p['outputs'])} tensors, " in text
        for s in d["shards"]:
            assert f"  {s['file']}: {len(s['tensors'])} tensors" in lines
    if mode in ("fp16",):  # cast lines are the plan's: --verbose or --dry-run show them
        assert sum(bool(o.get("cast_from")) for o in p["outputs"]) > 0
        monkeypatch.undo()
        verbose = fix_text(res, verbose=True)
        _no_plan_dicts(monkeypatch)
        assert verbose == fix_text(res, verbose=True)
        for o in p["outputs"]:
            if o.get("cast_from"):
                assert f"  *  {o['name']}: cast from {o['cast_from']}" in verbose.splitlines(), o
    if mode == "fp8":
        q = p["quantization"]
        assert q and lines.count(next(x for x in lines if x.startswith("quantized: "))) == 1
        assert f"quantized: {q['title']} ({q['method']} {q['algo']}): {', '.join(q['quantized'])}" in text
        for r in q["releases"]:
            assert any(x.startswith(f"           {r['release']}: ") for x in lines), r
    with pytest.raises(AttributeError):
        fix_text(d)


@pytest.mark.parametrize("mode", ["check", "dry-run", "write", "already-wired"])
def test_config_text_reads_no_dict(fixed, tmp_path, mode, monkeypatch):
    import shutil

    from eagle3conv.api import configure
    from eagle3conv.render import config_text
    from eagle3conv.wiring.options import WiringOptions

    folder = tmp_path / "drafter"
    shutil.copytree(fixed, folder)
    if mode != "already-wired":  # a config naming no layers (fix-keys wrote them: its provenance, the ids)
        config = json.loads((folder / "config.json").read_text())
        config.pop("eagle3conv")
        config.pop("eagle_aux_hidden_state_layer_ids")
        config["eagle_config"].pop("eagle_aux_hidden_state_layer_ids")
        (folder / "config.json").write_text(json.dumps(config))
        (folder / "training_metadata.json").unlink(missing_ok=True)
    opts = WiringOptions(target=TARGET, trained_on="1,14,26", captured_at="output")
    res = configure(folder, options=opts, check=mode == "check", dry_run=mode in ("dry-run", "already-wired"))
    d = res.to_dict()
    _no_plan_dicts(monkeypatch)
    text = config_text(res, verbose=True)
    lines = text.splitlines()
    assert lines[1] == f"checkpoint: {d['checkpoint']}"
    t = d["target"]
    assert f"target:     {t['name']} ({t['num_hidden_layers']} layers, hidden {t['hidden_size']})" in lines
    for r in d["records"]:
        assert f"record:     {r['described']}" in lines
    w = d["wiring"]["written"]
    if mode == "check":
        assert not any(x.startswith("launch:") or x.startswith("wrote:") for x in lines)
    else:
        assert w is not None and w["launch"]
        for e in w["config_edits"]:
            assert any(x.startswith(f"config.json: {e['field']}") for x in lines), e
        assert bool(w["config_edits"]) == (mode != "already-wired")
        for key, line in w["launch"].items():
            if not key.endswith("_layers"):
                assert any(x.endswith(f" {line}") for x in lines), key
        assert any("  # eagle3.yaml: " in x for x in lines)  # TensorRT-LLM's file, inline
        assert lines[-1] == ("dry run: nothing written" if d["mode"] == "dry-run"
                             else f"wrote: {', '.join(d['written'])}")
    with pytest.raises(AttributeError):
        config_text(d)
    if w and w["config_edits"]:
        from eagle3conv.render import edit_line

        with pytest.raises(AttributeError):
            edit_line(w["config_edits"][0])


def test_a_key_renamed_in_the_plan_document_leaves_the_text_as_it_was(sources, tmp_path, monkeypatch):
    """The text read ``o.get("cast_from")``, ``plan.get("shards")`` and ``plan.get("quantization")``: renaming
    those keys in the JSON silently dropped the cast lines, the files and the quantized section. Now the
    JSON's spelling never reaches the text."""
    from eagle3conv.api import fix_keys
    from eagle3conv.checkpoint.plan import Output, Plan
    from eagle3conv.render import fix_text

    res = fix_keys(sources["modelopt-export"], out=tmp_path / "o", dtype="fp16")
    before = fix_text(res, verbose=True)
    assert " cast from " in before and "output files:" in before
    out_dict, plan_dict = Output.to_dict, Plan.to_dict

    def renamed(f, **names):
        def to_dict(self, *a, **k):
            d = f(self, *a, **k)
            return {names.get(key, key): v for key, v in d.items()}
        return to_dict

    monkeypatch.setattr(Output, "to_dict", renamed(out_dict, cast_from="cast_from_dtype", rewritten="rebuilt"))
    monkeypatch.setattr(Plan, "to_dict", renamed(plan_dict, quantization="quant", outputs="tensors"))
    assert fix_text(res, verbose=True) == before


# --------------------------------------------------------------------------- launch's and example's verdicts


@pytest.mark.parametrize("case", ["served", "cannot-serve", "check-passed", "check-failed"])
def test_launch_verdict_is_typed_and_leads_the_text(fixed, tmp_path, case, monkeypatch):
    """``launch --json`` carries its verdict (every release has a line / some cannot serve it, named / the
    user's line passed / its errors, by code); the text's first line is made from it alone."""
    from eagle3conv.api import LaunchResult, LaunchVerdict, fix_keys, launch
    from eagle3conv.render import launch_text, launch_verdict_words
    from eagle3conv.wiring.options import WiringOptions

    folder = fixed
    if case == "cannot-serve":  # P-EAGLE: SGLang cannot serve it (tests/test_launch.py)
        write_example(tmp_path / "src", "speculators-peagle")
        folder = tmp_path / "drafter"
        fix_keys(tmp_path / "src", out=folder, wiring_options=WiringOptions(target=TARGET))
    good = GOOD_LINE.replace("draft-model-path drafter", f"draft-model-path {fixed}") + " --context-length 2048"
    check = {"check-passed": good, "check-failed": WRONG_LINE}.get(case)
    res = launch(folder, options=WiringOptions(target=TARGET if check is None else None), check=check)
    d = res.to_dict()
    v = d["verdict"]
    assert v["outcome"] == case and v["ok"] is d["ok"] is (case != "check-failed")
    assert v["releases"] == len(d["rows"]) and v["cannot"] == [r["label"] for r in d["rows"] if r["line"] is None]
    assert bool(v["cannot"]) == (case == "cannot-serve")
    if check is None:
        assert v["checked"] is None and v["errors"] == [] and v["warnings"] == 0
    else:
        found = d["check"]["findings"]
        assert v["checked"] == d["check"]["label"]
        assert v["errors"] == [f["code"] for f in found if f["level"] == "error"]
        assert v["warnings"] == sum(f["level"] == "warning" for f in found)
        assert bool(v["errors"]) == (case == "check-failed")
    assert launch_text(res).splitlines()[0] == launch_verdict_words(res.verdict())
    made_up = LaunchVerdict(res.verdict().outcome, 7, ("x y",), "sglang 9.9", ("a-b",), 2)
    monkeypatch.setattr(LaunchResult, "verdict", lambda self: made_up)
    first = launch_text(res).splitlines()[0]  # the words come from the verdict, whatever the rows say
    assert first == ("launch: 6 of 7 engine releases serve this drafter" if check is None else
                     f"launch check for sglang 9.9: {'FAILED' if case == 'check-failed' else 'passed'} "
                     "(1 error, 2 warnings)")


def test_example_verdict_says_it_wrote_the_example(tmp_path, monkeypatch):
    """``example`` decides nothing: its verdict says so in a code (``wrote``), with the format and the folder;
    its one line of text is made from that verdict."""
    import json as json_

    from click.testing import CliRunner

    from eagle3conv.api import ExampleOutcome, ExampleResult
    from eagle3conv.cli import main
    from eagle3conv.render import example_text

    r = CliRunner().invoke(main, ["example", str(tmp_path / "d"), "--format", "specforge", "--json"])
    assert r.exit_code == 0, r.output
    d = json_.loads(r.stdout)
    assert d == {"path": str(tmp_path / "d"), "format": "specforge",
                 "verdict": {"outcome": "wrote", "format": "specforge", "path": str(tmp_path / "d")}}
    assert [o.value for o in ExampleOutcome] == ["wrote"]
    text = CliRunner().invoke(main, ["example", str(tmp_path / "e"), "--format", "specforge"]).stdout
    assert text == f"wrote an example specforge drafter to {tmp_path / 'e'}\n"
    monkeypatch.setattr(ExampleResult, "to_dict", _no_dict)
    assert example_text(ExampleResult(tmp_path / "e", "specforge")) == text.rstrip("\n")
