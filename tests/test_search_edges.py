"""The wiring search on inputs off its main path: a NaN in one captured layer, states missing a
layer, a screen stopped by its work cap, a config wiring that stands in a set of several.

Each uses test_search_recall's pico drafters with planted wirings (real tensors, the real
``verify``): the point is what the verdict keeps in its set and what it tells the user."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from eagle3conv.errors import CheckpointReadError
from eagle3conv.render import verify_text
from eagle3conv.spec.layers import describe, outputs
from eagle3conv.verify import verify
from eagle3conv.verify.search import SeparationReason
from test_search_recall import make_case


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_nan_in_one_layer_is_refused_by_the_screen_not_searched_around(tmp_path):
    """One NaN element of layer 6 made every wiring reading it score NaN; the NaN wiring led every
    comparison and the screen dropped nothing (56 of 56 kept). Now: a clear error naming the layer."""
    folder, path, _, _, _ = make_case(tmp_path, 8, nan_layer=6)
    with pytest.raises(CheckpointReadError) as err:
        verify(folder, path, save=False, search=True, steps=1)
    assert "the captured output of layer 6 is not finite (NaN or Inf)" in err.value.message
    assert "--dtype fp32" in err.value.hint


def test_states_missing_a_layer_keep_every_survivor_and_say_what_was_not_searched(tmp_path):
    """A search over states without layer 6 is not global: wirings reading layer 6 were never scored,
    and the screen's survivors the verdict did not confirm still count in the set."""
    folder, path, planted, _, _ = make_case(tmp_path, 9, drop_layers=(6,))
    v = verify(folder, path, save=False, search=True, steps=1).verdict
    cov = v.coverage
    assert cov.is_global is False and cov.missing_layers == (6,)
    assert v.status in ("ambiguous", "undecided") and v.best is None
    size = v.to_separate.members if v.to_separate else len(v.confidence_set)
    confirmed = [c for c in v.confidence_set if c.confirmed]
    # the screen's survivors verify did not confirm are counted in the set, not dropped
    assert size == len(confirmed) + cov.unconfirmed_count
    assert "the states lack 1 of the target's layers (6)" in v.decided_by
    assert "capture every layer" in v.decided_by and "capture every layer" in (v.advice or "")
    # the planted wiring reads layer 6: it cannot be in the set, and the text says why
    assert 6 in planted and describe(outputs(*planted)) not in [c.layers for c in v.confidence_set]


def _capped_screen(monkeypatch):
    ev = importlib.import_module("eagle3conv.verify.evaluate")
    real = ev.screen

    def screen(*a, **kw):  # the real screen, with a work cap it reaches after its first stage
        kw["bound"] = dataclasses.replace(kw.get("bound") or ev.ScreenBound(), max_work=1, max_tail=0.5)
        return real(*a, **kw)

    monkeypatch.setattr(ev, "screen", screen)


def test_a_screen_stopped_by_its_work_cap_keeps_its_survivors_and_blames_the_cap(tmp_path, monkeypatch):
    """At the work cap the unexcluded wirings all stay in the set, and the text says the work ran out,
    not the data: more sequences like these would not finish the screen."""
    folder, path, planted, _, _ = make_case(tmp_path, 10)
    _capped_screen(monkeypatch)
    v = verify(folder, path, save=False, search=True, steps=1).verdict
    cov = v.coverage
    assert cov.screen["complete"] is False and len(cov.screen["stages"]) == 1
    assert cov.unconfirmed_count > 0  # survivors past what verify confirms: counted, not dropped
    assert v.status == "ambiguous" and v.best is None
    confirmed = [c for c in v.confidence_set if c.confirmed]
    assert v.to_separate.members == len(confirmed) + cov.unconfirmed_count
    assert v.to_separate.reason is SeparationReason.CAPPED
    assert v.to_dict()["to_separate"]["why"].startswith("the screen stopped at its work cap")
    assert describe(outputs(*planted)) in [c.layers for c in v.confidence_set]
    assert "the work, not the data, ran out" in v.decided_by
    assert "more sequences like these would not finish it" in v.advice and "capture about" not in v.advice


def test_a_config_that_stands_in_a_set_of_several_is_not_called_most_likely(tmp_path):
    """k = 5 configs of the recall cases name a wrong wiring; where the data cannot exclude it, it
    stands, and the text says it is one of a set rather than "trained on (most likely)"."""
    for seed in (39, 54, 102):  # k = 5 recall cases whose config wiring stood in a set of 12-21
        sub = tmp_path / str(seed)
        sub.mkdir()
        folder, path, planted, k, _ = make_case(sub, seed)
        assert k == 5
        res = verify(folder, path, save=False, search=True, steps=1)
        v = res.verdict
        if v.status == "stands" and len(v.confidence_set) > 1:
            text = verify_text(res)
            assert f"stands (in the set, not singled out by the data): {v.best_layers}" in text
            assert "trained on (most likely)" not in text
            return
    pytest.fail("no k = 5 case stood in a set of several: pick other seeds")


def test_max_sequences_is_named_before_capturing_more(tmp_path):
    """With --max-sequences reading 10 of 12 sequences, the advice says to read them all first
    instead of only asking for a larger capture."""
    folder, path, _, _, _ = make_case(tmp_path, 2)  # a case left with a set of several on 10 sequences
    v = verify(folder, path, save=False, search=True, steps=1, max_sequences=10).verdict
    assert v.status == "ambiguous", v.decided_by
    assert "first verify without --max-sequences (it read 10 of the 12 sequences these states hold)" in v.advice
    full = verify(folder, path, save=False, search=True, steps=1).verdict
    assert "--max-sequences" not in (full.advice or "")


def test_a_search_budget_stops_the_screen_and_says_what_more_would_read(tmp_path):
    """--search-budget: the screen stops at a stage boundary when the next stage would pass the
    user's seconds (here: less than any stage takes), keeps every wiring not excluded, and the
    report says how much was read and what reading the rest would take, as a budget to give."""
    from click.testing import CliRunner

    from eagle3conv.cli import main

    folder, path, planted, _, _ = make_case(tmp_path, 10)
    v = verify(folder, path, save=False, search=True, steps=1, search_budget=1e-6).verdict
    scr = v.coverage.screen
    assert scr["complete"] is False and scr["stopped_by"] == "seconds" and len(scr["stages"]) == 1
    assert scr["read"]["positions"] == scr["stages"][0]["positions"] < scr["read"]["of"]
    fin = scr["to_finish"]
    left = scr["stages"][0]["kept"] * (scr["read"]["of"] - scr["read"]["positions"])
    assert fin["work"] == left and fin["seconds"] > 0 and fin["budget"] >= fin["seconds"]
    assert describe(outputs(*planted)) in [c.layers for c in v.confidence_set]
    assert v.status == "ambiguous" and "its time budget" in v.decided_by
    assert f"verify --search-budget {fin['budget']}" in v.decided_by
    bad = CliRunner().invoke(main, ["verify", str(folder), "--states", str(path), "--search-budget", "0", "--no-save"])
    assert bad.exit_code != 0 and "--search-budget is seconds above 0" in bad.output


def test_a_large_set_is_reported_ranked_with_its_leaders_and_what_would_separate_them(tmp_path, monkeypatch):
    """A set of more survivors than verify confirms: the screen's survivors come ranked by their
    log score, with each one's gap to the leader and the sequences its own bound would need to
    exclude it, and the text names the few that lead the set and how many sequences would leave at
    most 3 -- not a flat list."""
    from eagle3conv.verify import search

    monkeypatch.setattr(search, "MAX_CONFIRM", 2)  # most survivors stay unconfirmed
    folder, path, planted, _, _ = make_case(tmp_path, 11)  # a recall case whose screen keeps 35 wirings
    v = verify(folder, path, save=False, search=True, steps=1).verdict
    ss = v.coverage.screen_set
    assert ss["size"] == v.coverage.screen_kept > 3 and ss["sequences"] > 0
    gaps = [r["gap"] for r in ss["ranked"]]
    assert gaps[0] == 0 and all(g >= 0 for g in gaps)
    scores = [r["step1_log_score"] for r in ss["ranked"]]
    assert scores == sorted(scores, reverse=True)
    need = [r["sequences_to_exclude"] for r in ss["ranked"][1:] if r["sequences_to_exclude"] is not None]
    assert need and all(n >= ss["sequences"] for n in need)
    assert set(ss["to_leave"]) <= {"1", "3", "10"}
    if ss["size"] <= len(ss["ranked"]) and all(r["sequences_to_exclude"] for r in ss["ranked"][1:]):
        assert ss["to_leave"]["1"] == max(need)  # every member but the leader excluded: the hardest one's
    assert v.status == "ambiguous"
    assert f"the screen's {ss['size']} survivors are led by {ss['ranked'][0]['layers']}" in v.decided_by
    if ss["to_leave"].get("3"):
        assert f"about {ss['to_leave']['3']} would leave at most 3" in v.decided_by


def test_a_search_with_dtype_auto_runs_in_the_screen_dtype_and_says_so(tmp_path):
    """On a CPU with native bf16 matmul the screen ranks in bf16; with ``--dtype auto`` the
    confirmations run in it too (as on a GPU: about half the fp32 cost there), the report's dtype
    and a note say so, and an explicit ``--dtype fp32`` keeps them in fp32. A plain verify is fp32."""
    from eagle3conv.verify.search import screen_dtype

    folder, path, _, _, _ = make_case(tmp_path, 8)
    native = screen_dtype("cpu", torch.float32) is torch.bfloat16
    auto = verify(folder, path, save=False, search=True, steps=1, device="cpu")
    note = [n for n in auto.states["verify_notes"] if n.startswith("the search ran in bf16")]
    assert auto.dtype == ("bfloat16" if native else "float32") and bool(note) == native
    fp32 = verify(folder, path, save=False, search=True, steps=1, device="cpu", dtype="fp32")
    assert fp32.dtype == "float32"
    assert not [n for n in fp32.states["verify_notes"] if n.startswith("the search ran in bf16")]
    # the same wirings confirmed either way (the screen is bf16 in both); their figures in each dtype
    assert [s.candidate.layers for s in auto.scores] == [s.candidate.layers for s in fp32.scores]
    plain = verify(folder, path, save=False, steps=1, device="cpu", layers=(0, 1, 2))  # one wiring, no search
    assert plain.dtype == "float32"
