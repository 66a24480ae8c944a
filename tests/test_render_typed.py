"""render reads typed results, never their ``to_dict`` shapes (issue 27, review B5).

A result's ``to_dict`` is its JSON; the text is made from the typed objects (VerifyResult and its
views, LaunchResult / LaunchLine / LaunchCheck, Wiring / WiringReport / EngineRow), so a field renamed
on either side fails loudly (AttributeError, KeyError) instead of printing ``None`` or dropping a line.
Each test renders real results of the bundled fixtures through the typed path; a dict handed where a
typed result is wanted raises; and the launch and wiring text are made with every ``to_dict`` on the
way disabled, which proves they read none of them.
"""

from __future__ import annotations

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


def test_a_field_renamed_where_the_states_summary_is_made_fails_the_text_loudly(tiny, monkeypatch):
    """The text used to read ``st.get("tokens")``: a renamed key printed "None tokens". Now the typed view
    reads each field by its name and the rename is an error."""
    from eagle3conv.render import verify_text
    from eagle3conv.states.format import CapturedStates
    from eagle3conv.verify import verify

    summary = CapturedStates.summary

    def renamed(self):
        d = summary(self)
        d["num_tokens"] = d.pop("tokens")
        return d

    monkeypatch.setattr(CapturedStates, "summary", renamed)
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


def test_a_figure_renamed_in_the_scores_document_fails_the_text_loudly(tiny, monkeypatch):
    """The wiring's figures are the report's (as rounded there): a figure the score's document stops
    stating under its name is an error in the text, not "None chains"."""
    from eagle3conv.render import verify_text
    from eagle3conv.verify import verify
    from eagle3conv.verify.evaluate import Score

    to_dict = Score.to_dict

    def renamed(self):
        d = to_dict(self)
        d["full_chains"] = d.pop("chains")
        return d

    monkeypatch.setattr(Score, "to_dict", renamed)
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
