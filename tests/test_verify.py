"""verify on a tiny real transformers target: alignment, statistics, search, report, exit codes.

The target is a random 6-layer Llama (no download); its states are captured by
eagle3conv's own capture. To test alignment without a trained drafter, the
states' next tokens are replaced by what the drafter itself guesses under a
known wiring: verify must then report step-1 acceptance of exactly 1 for that
wiring, and an off-by-one in the alignment would give ~0. The real trained
drafter on SmolLM2 is tests/test_e2e_smollm2.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from eagle3conv.example import Dims, write_example
from eagle3conv.states.format import StatesFile, write_states
from eagle3conv.verify import REPORT_FILE, load_drafter_weights, verify, wilson
from eagle3conv.verify.search import Coverage
from eagle3conv.spec.layers import outputs
from helpers import NEWEST_SGLANG, NEWEST_VLLM, OLDEST_SGLANG, engine_rows, run

OLD, NEW, VLLM = f"sglang=={OLDEST_SGLANG}", f"sglang=={NEWEST_SGLANG}", f"vllm=={NEWEST_VLLM}"

N_LAYERS = 6


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from eagle3conv.states.capture import capture_states

    root = tmp_path_factory.mktemp("verify")
    vocab = {t: i for i, t in enumerate(["[UNK]", "[PAD]", "<s>", "</s>"] + [f"w{i}" for i in range(508)])}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", bos_token="<s>",
                                  eos_token="</s>")
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=N_LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=1,
                      eos_token_id=3, bos_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    rnd = random.Random(0)
    prompts = [" ".join(f"w{rnd.randrange(508)}" for _ in range(rnd.randrange(8, 16))) for _ in range(12)]
    captured = root / "captured.safetensors"
    capture_states(model, tok, prompts, captured, generate_tokens=8, chat_template=False, dtype="fp32",
                   target="tiny-llama")
    dims = Dims(hidden=64, target_hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128,
                vocab=len(tok), draft_vocab=300, aux_ids=(1, 3, 4))
    drafter = write_example(root / "drafter", "sglang", dims)
    model.save_pretrained(root / "target")  # the target's weights, for --embeddings (its own lm_head: not tied)
    return root, captured, drafter


def guesses_under(drafter_dir: Path, states_path: Path, layers) -> torch.Tensor:
    """Step-1 guesses of the drafter at every position, computed independently of verify:
    one plain forward in SGLang's draft-extend layout (tokens shifted left by one)."""
    from eagle3conv.model.drafter import Eagle3Drafter

    config, tensors = load_drafter_weights(drafter_dir)
    with StatesFile(states_path) as st:
        ids, mask = st.input_ids, st.attention_mask.bool()
        emb = st.embeddings()
        table = torch.zeros(config["vocab_size"], config["hidden_size"])
        table[ids[mask]] = emb[mask].float()
        d = Eagle3Drafter(config, tensors, dtype=torch.float32, embed_tokens=table)
        aux = st.aux(outputs(*layers)).float()
    nxt = torch.zeros_like(ids)
    nxt[:, :-1] = ids[:, 1:]
    out = d.forward(aux, nxt)  # logits at t guess token t+2
    return out.target_ids


def states_labelled_by(world, layers, name: str) -> Path:
    """The captured states with target_next replaced by the drafter's own step-1 guesses
    under ``layers``: target_next[t+1] = guess at t."""
    root, captured, drafter = world
    g = guesses_under(drafter, captured, layers)
    with StatesFile(captured) as st:
        tn = st.target_next.clone()
        tn[:, 1:] = g[:, :-1]
        hidden = {ref: st.hidden(ref) for ref in st.layers}
        out = root / name
        write_states(out, input_ids=st.input_ids, attention_mask=st.attention_mask, target_next=tn,
                     hidden=hidden, num_layers=st.num_layers, vocab_size=st.vocab_size, target=st.target,
                     loss_mask=st.loss_mask, dtype="fp32")
    return out


def test_step1_alignment_is_exact(world):
    _, _, drafter = world
    labelled = states_labelled_by(world, (1, 3, 4), "self-labelled.safetensors")
    res = verify(drafter, labelled, steps=3, save=False)
    main_ = res.main
    assert main_.candidate.layers == outputs(1, 3, 4)
    assert main_.acceptance[0] == 1.0 and main_.tokens > 50
    assert res.reference == "target" and "target's greedy next tokens" in res.to_dict()["statistic"]
    # the same drafter on the real target tokens: a random drafter is never right
    real = verify(drafter, world[1], steps=3, save=False)
    assert real.main.acceptance[0] < 0.05


def test_search_names_the_wiring_the_labels_came_from(world, tmp_path):
    root, _, drafter = world
    labelled = states_labelled_by(world, (0, 2, 3), "labelled-023.safetensors")  # config says 1, 3, 4
    # the labels are the fp32 forward's own guesses: exact in fp32 only (a search with --dtype auto
    # runs in bf16 on a CPU with native bf16 matmul, where this random drafter's near-ties differ)
    res = verify(drafter, labelled, steps=2, search=True, save=False, dtype="fp32")
    names = {s.candidate.name: s for s in res.scores}
    assert "config shifted by -1" in names and "with the embedding output" in names
    best = max(res.scores, key=lambda s: s.accept_length)
    assert best.candidate.layers == outputs(0, 2, 3) and best.acceptance[0] == 1.0
    v = res.verdict
    assert v.best_layers == "outputs of layers 0, 2, 3" and v.decided_by == "acceptance" and v.separated
    assert v.status == "named"
    assert v.advice.endswith("--trained-on 0,2,3 --captured-at output")
    assert not v.config_is_best
    # the text report names it and prints the command that writes it
    text = run("verify", drafter, "--states", labelled, "--steps", "2", "--search-wiring", "--dtype", "fp32",
               "--no-save").stdout
    assert "trained on (most likely): outputs of layers 0, 2, 3 — decided by acceptance" in text
    assert f"fix: {v.advice}" in text


def test_cli_report_saved_and_min_accept_exit_4(world, tmp_path):
    import shutil

    _, captured, drafter = world
    ck = tmp_path / "d"
    shutil.copytree(drafter, ck)
    res = run("verify", ck, "--states", captured, "--min-accept", "0.5", ok=4)
    assert "below --min-accept 0.5" in res.stderr
    saved = json.loads((ck / REPORT_FILE).read_text())
    assert saved["passed"] is False and len(saved["acceptance_per_position"]) == 3
    from eagle3conv.hub.card import read_verify_report

    summary = read_verify_report(ck)
    assert summary is not None and summary.figures.acceptance == tuple(saved["acceptance_per_position"])
    ok = run("verify", ck, "--states", captured, "--json", "--steps", "2", "--no-save")
    d = json.loads(ok.stdout)
    assert d["steps"] == 2 and d["results"][0]["ci_method"].startswith("bootstrap")
    assert json.loads((ck / REPORT_FILE).read_text())["steps"] == 3  # --no-save left it


def test_norms_exclude_position_zero_and_compare_with_training(world, tmp_path):
    import shutil

    from eagle3conv.wiring.metadata import TrainingRecord, norm_stats, write_metadata_file

    _, captured, drafter = world
    ck = tmp_path / "d"
    shutil.copytree(drafter, ck)
    with StatesFile(captured) as st:
        mask = st.attention_mask.bool()
        slots = []
        for ref in outputs(1, 3, 4):
            h = st.hidden(ref)
            keep = mask.clone()
            keep[:, 0] = False
            slots.append(norm_stats(h[keep], skip_first=0))  # rows already exclude position 0
    # training said: slot 0 had 10x the norm we see now
    train = [{"median": s["median"] * (10 if i == 0 else 1), "p10": s["p10"], "p90": s["p90"] * 10}
             for i, s in enumerate(slots)]
    write_metadata_file(ck, TrainingRecord(layers=outputs(1, 3, 4), source="test",
                                           norms={"slots": train}, convention="output", raw_ids=[1, 3, 4]))
    res = verify(ck, captured, save=False)
    inf = res.main.norms
    for s, ref in zip(slots, inf):
        assert ref["median"] == pytest.approx(s["median"], rel=1e-4)
    cmp = res.comparisons[0]
    assert [c["flagged"] for c in cmp] == [True, False, False]
    assert cmp[0]["ratio"] == pytest.approx(0.1, rel=1e-3)
    assert res.verdict.norm_flags and "norm_flags" in res.to_dict()["verdict"]


def test_layers_not_captured(world, tmp_path):
    _, captured, drafter = world
    res = run("verify", drafter, "--states", captured, "--layers", "1,3,9", "--no-save", ok=3)
    assert "output id 9 (slot 2) is out of range -1..5" in res.stderr
    few = tmp_path / "few.safetensors"
    with StatesFile(captured) as st:
        write_states(few, input_ids=st.input_ids, attention_mask=st.attention_mask, target_next=st.target_next,
                     hidden={r: st.hidden(r) for r in st.layers if r.output_of in (-1, 1, 3, 4)},
                     num_layers=st.num_layers, vocab_size=st.vocab_size, dtype="fp32")
    res = run("verify", drafter, "--states", few, "--layers", "0,2,3", "--no-save", ok=3)
    assert "output of layer 0, the output of layer 2" in res.stderr and "not captured" in res.stderr
    # the search only scores what the states hold
    d = json.loads(run("verify", drafter, "--states", few, "--search-wiring", "--no-save", "--json").stdout)
    scored = {tuple(x["output_of"] for x in r["layers"]) for r in d["results"]}
    assert scored == {(1, 3, 4), (-1, 1, 3), (-1, 3, 4), (-1, 1, 4)}  # every ascending set of what they hold
    # 4 of the target's 7 layers: not a global search, so no wiring is named "most likely trained on"
    v = d["verdict"]
    assert v["coverage"]["global"] is False and v["coverage"]["missing_layers"] == [0, 2, 5]
    assert v["status"] in ("stands", "ambiguous", "undecided") and "most likely" not in (v.get("advice") or "")


def test_wrong_width_states(world, tmp_path):
    root, captured, _ = world
    other = write_example(tmp_path / "o", "sglang", Dims())  # T = 576: a SmolLM2 drafter
    res = run("verify", other, "--states", captured, "--no-save", ok=3)
    assert "another target" in res.stderr


def test_wilson():
    lo, hi = wilson(50, 100)
    assert lo < 0.5 < hi and hi - lo == pytest.approx(0.19, abs=0.01)
    assert wilson(0, 0) == (0.0, 1.0)


def test_smoke_without_states(world):
    _, _, drafter = world
    d = json.loads(run("verify", drafter, "--json").stdout)
    assert d["ok"] and d["step1_input_width"] == 3 * 64 and d["step2_input_width"] == 64
    assert d["logits_width"] == 300 and d["device"] == "cpu"


def test_smoke_is_a_typed_result_whose_json_is_the_commands(world):
    """`eagle3conv.smoke` returns a frozen SmokeResult (not a dict); `verify` without states prints its
    to_dict(), and render's text reads the same object."""
    import dataclasses

    from eagle3conv import SmokeResult, WiringOptions, smoke
    from eagle3conv.render import smoke_text

    _, _, drafter = world
    assert smoke(drafter, device="cpu").wiring_ok is None  # no wiring options: the forward alone
    r = smoke(drafter, device="cpu", wiring_options=WiringOptions())  # as the command runs it
    assert isinstance(r, SmokeResult) and r.ok and r.forward_ok and r.wiring_ok and r.problems == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.device = "cuda"  # type: ignore[misc]
    d = json.loads(run("verify", drafter, "--json").stdout)
    untimed = lambda doc: {k: v for k, v in doc.items() if k != "seconds"}  # noqa: E731
    assert untimed(r.to_dict()) == untimed(d) and list(r.to_dict()) == list(d)
    assert "ok: True" in smoke_text(r) and "forward problems: none" in smoke_text(r)


def _data_labelled(world, name: str) -> Path:
    """The captured states with target_next = the data's next token, and each sequence's last
    token left out of the loss mask (the data has no token after it): what verify must
    derive by itself from states that hold no next tokens."""
    root, captured, _ = world
    with StatesFile(captured) as st:
        ids, mask = st.input_ids, st.attention_mask.bool()
        tn = torch.zeros_like(ids)
        tn[:, :-1] = ids[:, 1:]
        tn[~mask] = 0
        loss = st.loss_mask.clone()
        loss[torch.arange(len(ids)), mask.sum(1) - 1] = False
        out = root / name
        write_states(out, input_ids=ids, attention_mask=st.attention_mask, target_next=tn,
                     hidden={r: st.hidden(r) for r in st.layers}, num_layers=st.num_layers,
                     vocab_size=st.vocab_size, loss_mask=loss, dtype="fp32")
    return out


@pytest.fixture(scope="module")
def specforge_records(world, tmp_path_factory):
    """The same sequences as SpecForge offline records (.ckpt and .ckpt.gz, no layers, no
    next tokens, no embedding output) plus the target's embedding table as safetensors."""
    import gzip
    import io

    from safetensors.torch import save_file

    _, captured, _ = world
    folder = tmp_path_factory.mktemp("specforge")
    with StatesFile(captured) as st:
        mask = st.attention_mask.bool()
        aux = st.aux(outputs(1, 3, 4))
        last = st.hidden(N_LAYERS - 1)
        emb = st.embeddings()
        vocab = st.vocab_size
        for b in range(st.num_sequences):
            n = int(mask[b].sum())
            rec = {"input_ids": st.input_ids[b, :n].clone(), "loss_mask": st.loss_mask[b, :n].long(),
                   "hidden_state": last[b:b + 1, :n].clone(), "aux_hidden_state": aux[b:b + 1, :n].clone()}
            if b % 2:
                buf = io.BytesIO()
                torch.save(rec, buf)
                (folder / f"data_{b}.ckpt.gz").write_bytes(gzip.compress(buf.getvalue()))
            else:
                torch.save(rec, folder / f"data_{b}.ckpt")
        table = torch.zeros(vocab, emb.shape[-1])
        table[st.input_ids[mask]] = emb[mask].float()
    emb_file = tmp_path_factory.mktemp("target") / "model.safetensors"
    save_file({"model.embed_tokens.weight": table}, str(emb_file))
    return folder, emb_file


def test_specforge_records_score_like_the_states_file(world, specforge_records):
    _, _, drafter = world
    folder, emb_file = specforge_records
    reference = verify(drafter, _data_labelled(world, "data-labelled.safetensors"), save=False).main
    res = verify(drafter, folder, embeddings=emb_file, states_layers=[1, 3, 4], save=False)
    got = res.main
    assert got.counted == reference.counted and got.matched == reference.matched
    assert got.chains == reference.chains and got.chain_accepted == reference.chain_accepted
    assert got.tokens > 50
    assert any("data's next tokens" in n for n in res.states["verify_notes"])
    assert res.reference == "data" and res.to_dict()["reference"] == "data"
    assert "against the data's next tokens" in res.to_dict()["statistic"]
    # unnamed slots: taken to be the scored wiring, and said so; no embeddings: a clear error
    unnamed = verify(drafter, folder, embeddings=emb_file, save=False)
    assert unnamed.main.counted == reference.counted
    assert any("do not say which layers" in n for n in unnamed.states["verify_notes"])
    res = run("verify", drafter, "--states", folder, "--no-save", ok=2)
    assert "no embedding output" in res.stderr and "--embeddings" in res.stderr


def test_embeddings_of_another_target(world, tmp_path):
    from safetensors.torch import save_file

    _, captured, drafter = world
    bad = tmp_path / "m.safetensors"
    save_file({"model.embed_tokens.weight": torch.zeros(100, 64)}, str(bad))
    res = run("verify", drafter, "--states", captured, "--embeddings", bad, "--no-save", ok=3)
    assert "[100, 64]" in res.stderr and "another target" in res.stderr


def test_target_table_path_gives_the_same_drafts(world, specforge_records):
    """--embeddings (a [V, H] table indexed by token) against the captured embedding
    output (indexed by position): on the self-labelled states both must be exact."""
    _, _, drafter = world
    _, emb_file = specforge_records
    labelled = states_labelled_by(world, (1, 3, 4), "self-labelled-2.safetensors")
    res = verify(drafter, labelled, embeddings=emb_file, save=False)
    assert res.main.acceptance[0] == 1.0 and res.main.tokens > 50


# --- bad input found in review: clear errors, nothing lost ---------------------------------------


def test_nothing_to_score_is_an_error_with_json(world, tmp_path):
    _, captured, drafter = world
    res = run("verify", drafter, "--states", captured, "--max-sequences", "0", "--no-save", "--json", ok=2)
    assert json.loads(res.stdout)["exit_code"] == 2
    empty = tmp_path / "noloss.safetensors"
    with StatesFile(captured) as st:
        write_states(empty, input_ids=st.input_ids, attention_mask=st.attention_mask, target_next=st.target_next,
                     hidden={r: st.hidden(r) for r in st.layers}, num_layers=st.num_layers,
                     vocab_size=st.vocab_size, loss_mask=torch.zeros_like(st.attention_mask), dtype="fp32")
    res = run("verify", drafter, "--states", empty, "--no-save", "--json", "--min-accept", "0.5", ok=1)
    d = json.loads(res.stdout)
    assert "nothing to score" in d["message"]


def test_non_finite_states_are_refused(world, tmp_path):
    _, captured, drafter = world
    bad = tmp_path / "nan.safetensors"
    with StatesFile(captured) as st:
        hidden = {r: st.hidden(r).clone() for r in st.layers}
        hidden[outputs(3)[0]][0, 2, 5] = float("nan")
        write_states(bad, input_ids=st.input_ids, attention_mask=st.attention_mask, target_next=st.target_next,
                     hidden=hidden, num_layers=st.num_layers, vocab_size=st.vocab_size, dtype="fp32")
    res = run("verify", drafter, "--states", bad, "--no-save", ok=1)
    assert "not finite" in res.stderr and "output of layer 3" in res.stderr


def test_read_only_checkpoint_still_reports(world, tmp_path, monkeypatch):
    import shutil

    _, captured, drafter = world
    ck = tmp_path / "ro"
    shutil.copytree(drafter, ck)

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    import eagle3conv.io.files as fs

    monkeypatch.setattr(fs.tempfile, "mkstemp", refuse)  # a read-only folder (root ignores chmod)
    res = run("verify", ck, "--states", captured, "--json")
    d = json.loads(res.stdout)
    assert d["saved"] is None and "could not save" in d["save_error"] and "--no-save" in d["save_error"]
    assert "warning: could not save" in res.stderr
    assert not (ck / REPORT_FILE).exists() and not list(ck.glob(".*tmp"))


def test_bad_device_and_unfixed_checkpoint(world, tmp_path):
    _, captured, drafter = world
    assert "use auto, cpu, cuda or cuda:N" in run("verify", drafter, "--states", captured, "--device", "mps",
                                                   "--no-save", ok=2).stderr
    if not torch.cuda.is_available():
        assert "no CUDA device here" in run("verify", drafter, "--states", captured, "--device", "cuda:0",
                                            "--no-save", ok=2).stderr
    raw = write_example(tmp_path / "raw", "modelopt-export", Dims(hidden=64, target_hidden=64, heads=4, kv_heads=2,
                                                                  head_dim=16, intermediate=128, vocab=512,
                                                                  draft_vocab=300, aux_ids=(1, 3, 4)))
    res = run("verify", raw, "--states", captured, "--no-save", ok=3)
    assert "not in SGLang's names" in res.stderr and "eagle3conv fix-keys" in res.stderr


def test_search_needs_enough_sequences(world, tmp_path):
    _, captured, drafter = world
    res = verify(drafter, captured, search=True, max_sequences=3, save=False)
    assert res.verdict.decided_by.startswith("not decided") and res.verdict.advice is None
    assert res.verdict.status == "undecided" and res.verdict.best is None
    assert "best" not in res.to_dict()["verdict"] and "advice" not in res.to_dict()["verdict"]


def _score(name, layers, per_seq_accepted, chains=100):
    from eagle3conv.verify import Candidate, Score

    n = len(per_seq_accepted)
    s = Score(Candidate(name, outputs(*layers), "t"), 1, [[0] * n], [[chains] * n], list(per_seq_accepted),
              [chains] * n, [0], [0], [{"median": 1.0, "p10": 1.0, "p90": 1.0, "tokens": 1}])
    return s.finish()


def test_verdict_rules():
    from eagle3conv.verify import decide

    def cmp(flag):
        return [{"slot": 0, "layer": "x", "inference_median": 1.0, "training_median": 1.0, "ratio": 3.0 if flag else 1.0,
                 "flagged": flag}]

    seqs = 12
    tie = [150] * seqs
    config = _score("config", (1, 14, 26), tie)
    neighbour = _score("slot 1 moved -1", (1, 13, 26), [150 + (10 if i % 2 else -9) for i in range(seqs)])
    far = _score("config shifted by +1", (2, 15, 27), [120] * seqs)
    # a tie, the config's norms in line: the config stands (the fingerprint cannot tell neighbours apart)
    v = decide([config, neighbour, far], [cmp(False), cmp(False), cmp(False)], True, "ck", None)
    assert v.best_layers == "outputs of layers 1, 14, 26" and "stands" in v.decided_by and v.advice is None
    assert v.status == "stands"
    # the config's norms out of line: the fingerprint picks the neighbour in line
    glob = Coverage(is_global=True, layers=31, screened=4495, screen_positions=900, confirmed=3)
    v = decide([config, neighbour, far], [cmp(True), cmp(False), cmp(False)], True, "ck", None, coverage=glob)
    assert v.best_layers == "outputs of layers 1, 13, 26" and v.decided_by.startswith("norm fingerprint")
    assert "--trained-on 1,13,26" in v.advice and v.status == "named"
    # the same scores from a search that did not cover every layer: nothing is named, the tie is listed
    v = decide([config, neighbour, far], [cmp(True), cmp(False), cmp(False)], True, "ck", None)
    assert v.status == "ambiguous" and v.best is None and "most likely" not in (v.advice or "")
    assert v.tied_set == ["outputs of layers 1, 13, 26", "outputs of layers 1, 14, 26"]
    assert v.positions_to_separate and v.positions_to_separate > config.tokens
    # the config clearly behind, two leaders tied, no norms: nothing is named
    lead1 = _score("a", (3, 14, 26), [180] * seqs)
    lead2 = _score("b", (4, 14, 26), [180 + (10 if i % 2 else -9) for i in range(seqs)])
    v = decide([far, lead1, lead2], [None, None, None], True, "ck", None)
    assert v.best is None and v.status == "ambiguous"
    assert v.decided_by.startswith("the data cannot tell which of 2 wirings the drafter was trained on")
    # the set, and what would separate it: never a config command for one member
    assert [c.layers for c in v.confidence_set] == ["outputs of layers 4, 14, 26", "outputs of layers 3, 14, 26"]
    assert v.to_separate.sequences > seqs and "eagle3conv config" not in v.advice
    assert "capture about" in v.advice and "no config is written for any one of them" in v.advice
    # separated by acceptance
    v = decide([far, _score("c", (1, 14, 26), [190] * seqs)], [None, None], True, "ck", "smollm2-135m",
               coverage=glob)
    assert v.decided_by == "acceptance" and v.separated and v.status == "named"
    assert v.advice.endswith("--target smollm2-135m --trained-on 1,14,26 --captured-at output")
    # the config clearly worse: said first, with the command, whether or not a winner is named
    assert v.config_worse and v.advice.startswith("the config's wiring (outputs of layers 2, 15, 27) is clearly worse")
    # separated, but only in a neighbourhood: reported as the best found there, never "most likely trained on"
    v = decide([far, _score("c", (1, 14, 26), [190] * seqs)], [None, None], True, "ck", None)
    assert v.status == "ambiguous" and v.best is None and v.best_found == "outputs of layers 1, 14, 26"
    assert "not a global search" in v.decided_by and "most likely" not in v.advice
    assert v.config_worse and "--trained-on 1,14,26" in v.advice
    # no ids in config.json: the engines' default never stands on its own, even when tied
    v = decide([config, neighbour, far], [cmp(False), cmp(False), cmp(False)], True, "ck", None, coverage=glob,
               config_names_layers=False)
    assert v.status == "ambiguous" and v.best is None and "config.json names no aux layers" in v.advice


def test_replay_follows_greedy_rounds():
    import numpy as np

    from eagle3conv.verify.stats import replay

    # chain starts 0..7 of one sequence; A = leading accepted drafts; the last 3 starts lack references
    a = np.array([[2, 9, 9, 0, 3, 9, 9, 9, 1, 1]], dtype=np.int16)
    full = np.array([[True, True, True, True, True, True, True, False, False, False]])
    acc, rounds = replay(a, full)
    # rounds start at 0 (accept 2, +target token) -> 3 (0) -> 4 (3) -> 8: no reference, stop
    assert rounds == [3] and acc == [(1 + 2) + (1 + 0) + (1 + 3)]
    acc, rounds = replay(np.zeros((1, 4), dtype=np.int16), np.zeros((1, 4), dtype=bool))
    assert rounds == [0] and acc == [0]


def test_report_has_no_local_paths(world, tmp_path):
    import shutil

    _, captured, drafter = world
    ck = tmp_path / "d"
    shutil.copytree(drafter, ck)
    verify(ck, captured)
    text = (ck / REPORT_FILE).read_text()
    assert str(tmp_path) not in text and str(captured.parent) not in text


def test_mapped_views_equal_the_states_reader(world):
    """The feeder's zero-copy views (offsets from the validated header reader) hold
    exactly the rows StatesFile reads, for every stored layer."""
    from eagle3conv.verify.feed import mapped_states

    _, captured, _ = world
    with StatesFile(captured) as st:
        views = mapped_states(st)
        assert set(views) == set(st.layers)
        for ref in st.layers:
            assert torch.equal(views[ref], st.hidden(ref)), ref
    assert mapped_states(object()) is None  # other sources: the plain path


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU feeder needs CUDA")
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_gpu_feeder_equals_the_plain_path(world, tmp_path, dtype):
    """On CUDA, the double-buffered feeder and the plain batch path give identical counts and
    norms (layers scaled apart, so a slot mix-up would show); 3 batches of 5, the last short."""
    from eagle3conv.verify import Candidate, build_drafter, evaluate

    _, captured, drafter = world
    path = tmp_path / f"scaled-{dtype}.safetensors"
    with StatesFile(captured) as st:
        hidden = {r: st.hidden(r) * (1 + r.output_of) for r in st.layers}
        write_states(path, input_ids=st.input_ids, attention_mask=st.attention_mask, target_next=st.target_next,
                     hidden=hidden, num_layers=st.num_layers, vocab_size=st.vocab_size, loss_mask=st.loss_mask,
                     dtype=dtype)
    config, tensors = load_drafter_weights(drafter)
    model, target_embeds = build_drafter(config, tensors, "cuda", torch.float32)
    cand = Candidate("t", outputs(1, 3, 4), "t")
    runs = [evaluate(model, StatesFile(path), cand, steps=3, batch_size=5, target_embeds=target_embeds, feeder=f)
            for f in (True, False)]
    fast, plain = runs
    assert fast.tokens > 50
    assert fast.matched == plain.matched and fast.counted == plain.counted
    assert fast.chains == plain.chains and fast.chain_accepted == plain.chain_accepted
    assert fast.replay_accepted == plain.replay_accepted and fast.norms == plain.norms
    assert len({round(n["median"], 3) for n in fast.norms}) == 3


def test_engines_side_by_side(world, tmp_path):
    """verify scores what each engine release captures from this config: a config whose nested
    ids (SGLang: +1) and top-level ids (vLLM: raw) name different layers shows both figures, on
    states whose labels are the drafter's own guesses from outputs 0, 2, 3 (what vLLM captures)."""
    import shutil

    _, _, drafter = world
    labelled = states_labelled_by(world, (0, 2, 3), "labelled-023-engines.safetensors")
    d2 = tmp_path / "d2"
    shutil.copytree(drafter, d2)
    cfg = json.loads((d2 / "config.json").read_text())
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True}
    cfg["eagle_aux_hidden_state_layer_ids"] = [1, 3, 4]  # vLLM reads these raw: outputs 0, 2, 3
    (d2 / "config.json").write_text(json.dumps(cfg))
    d = json.loads(run("verify", d2, "--states", labelled, "--steps", "2", "--no-save", "--json").stdout)
    rows = engine_rows(d)
    sg, vl = rows[NEW], rows[VLLM]
    assert sg["captures"] == "outputs of layers 1, 3, 4" and vl["captures"] == "outputs of layers 0, 2, 3"
    assert vl["acceptance"][0] == 1.0 and sg["acceptance"][0] < 0.9  # the labels came from vLLM's layers
    assert sg["accept_length"] == rows[OLD]["accept_length"] < vl["accept_length"]
    text = run("verify", d2, "--states", labelled, "--steps", "2", "--no-save").stdout
    assert f"vllm {NEWEST_VLLM}: outputs of layers 0, 2, 3: accept length" in text
    assert "step-1 acceptance 1.000" in text
    # --engine narrows it to the releases asked
    d = json.loads(run("verify", d2, "--states", labelled, "--steps", "2", "--no-save", "--json",
                       "--engine", "vllm").stdout)
    assert [r["engine"] for r in d["wiring_check"]["engines"]] == [VLLM]
    # ... and verify's own score feeds what that engine captures: vLLM's outputs 0, 2, 3, accepted
    assert [x["output_of"] for x in d["results"][0]["layers"]] == [0, 2, 3]
    assert d["acceptance_per_position"][0] == 1.0
    d = json.loads(run("verify", d2, "--states", labelled, "--steps", "2", "--no-save", "--json",
                       "--engine", NEW, "--engine", "vllm").stdout)
    assert [x["output_of"] for x in d["results"][0]["layers"]] == [1, 3, 4]  # the first --engine leads


def _labelled_with(drafter_dir: Path, captured: Path, layers, out: Path) -> Path:
    """The captured states with target_next replaced by ``drafter_dir``'s own step-1 guesses
    under ``layers`` (run as its config says, with the target's embedding)."""
    g = guesses_under(drafter_dir, captured, layers)
    with StatesFile(captured) as st:
        tn = st.target_next.clone()
        tn[:, 1:] = g[:, :-1]
        hidden = {ref: st.hidden(ref) for ref in st.layers}
        write_states(out, input_ids=st.input_ids, attention_mask=st.attention_mask, target_next=tn,
                     hidden=hidden, num_layers=st.num_layers, vocab_size=st.vocab_size, target=st.target,
                     loss_mask=st.loss_mask, dtype="fp32")
    return out


def _copy_with(drafter: Path, dest: Path, extra_tensors: dict | None = None, **config) -> Path:
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(drafter, dest)
    cfg = json.loads((dest / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [2, 4, 5]  # vLLM reads these raw: outputs 1, 3, 4 as SGLang
    (dest / "config.json").write_text(json.dumps({**cfg, **config}))
    if extra_tensors:
        f = dest / "model.safetensors"
        save_file({**load_file(str(f)), **extra_tensors}, str(f))
    return dest


def test_engines_emulate_norm_before_residual(world, tmp_path):
    """issue 11 serving emulation: vLLM honours norm_before_residual, SGLang ignores it. States
    labelled by the drafter run as its config says (norm_before_residual true) are matched
    exactly on vLLM only; SGLang's row says what it runs differently."""
    _, captured, drafter = world
    d2 = _copy_with(drafter, tmp_path / "nbr", norm_before_residual=True)
    labelled = _labelled_with(d2, captured, (1, 3, 4), tmp_path / "nbr.safetensors")
    d = json.loads(run("verify", d2, "--states", labelled, "--steps", "2", "--no-save", "--json").stdout)
    rows = engine_rows(d)
    sg, vl = rows[NEW], rows[VLLM]
    assert sg["captures"] == vl["captures"] == "outputs of layers 1, 3, 4"
    assert vl["acceptance"][0] == 1.0 and sg["acceptance"][0] < 0.9
    assert vl["forward"]["norm_before_residual"] is True and sg["forward"]["norm_before_residual"] is False
    assert any("norm_before_residual is true" in e and "SGLang ignores it" in e for e in sg["emulated"])
    assert vl["emulated"] == [] and vl["paired_vs_main"]["ci95"][0] > 0
    assert round(d["results"][0]["acceptance_per_position"][0], 4) == sg["acceptance"][0]  # verify's main run is SGLang's
    text = run("verify", d2, "--states", labelled, "--steps", "2", "--no-save").stdout
    assert "runs differently: norm_before_residual is true in config.json, but SGLang ignores it" in text
    # --engine vllm: verify's own score runs as vLLM does
    d = json.loads(run("verify", d2, "--states", labelled, "--steps", "2", "--no-save", "--json",
                       "--engine", "vllm").stdout)
    assert d["results"][0]["acceptance_per_position"][0] == 1.0
    assert any(f"as vllm {NEWEST_VLLM} runs it" in n for n in d["states"]["verify_notes"])


def test_engines_emulate_whose_embedding(world, tmp_path):
    """issue 11 serving emulation: SGLang embeds with the target's table, vLLM with the drafter's
    own embed_tokens unless it is the target's. A random embed_tokens shows up on vLLM only;
    one equal to the target's rows (compared against the captured embedding output) does not."""
    _, captured, drafter = world
    labelled = _labelled_with(drafter, captured, (1, 3, 4), tmp_path / "emb.safetensors")
    config, _ = load_drafter_weights(drafter)
    V, H = config["vocab_size"], config["hidden_size"]
    gen = torch.Generator().manual_seed(3)
    rnd = _copy_with(drafter, tmp_path / "rnd", {"embed_tokens.weight": torch.randn(V, H, generator=gen) * 0.02})
    d = json.loads(run("verify", rnd, "--states", labelled, "--steps", "2", "--no-save", "--json").stdout)
    rows = engine_rows(d)
    sg, vl = rows[NEW], rows[VLLM]
    assert sg["acceptance"][0] == 1.0 and vl["acceptance"][0] < 0.5
    assert sg["forward"]["embedding"] == "target's" and vl["forward"]["embedding"] == "drafter's own"
    cmp = d["wiring_check"]["embedding_comparison"]
    assert cmp["identical"] is False and 10 < cmp["rows"] < V and cmp["of"] == V and cmp["max_abs_diff"] > 0
    assert any(f"{cmp['rows']} of {V} rows compared" in e for e in vl["emulated"])
    (f,) = [f for f in d["wiring_check"]["findings"] if f["code"] == "audit-embed-differs"]  # the audit says it too
    assert f"{cmp['rows']} of {V} rows compared" in f["message"] and "drop embed_tokens.weight" in f["fix"]
    # embed_tokens equal to the target's on the rows the states hold: the same numbers as SGLang on
    # these states, but vLLM compares the whole table (torch.equal), so "identical" is not claimed
    with StatesFile(captured) as st:
        ids, mask = st.input_ids, st.attention_mask.bool()
        table = torch.zeros(V, H)
        table[ids[mask]] = st.embeddings()[mask].float()
    same = _copy_with(drafter, tmp_path / "same", {"embed_tokens.weight": table})
    d = json.loads(run("verify", same, "--states", labelled, "--steps", "2", "--no-save", "--json").stdout)
    rows = engine_rows(d)
    assert rows[VLLM]["acceptance"][0] == 1.0
    cmp = d["wiring_check"]["embedding_comparison"]
    assert cmp["identical"] is None and cmp["identical_rows"] is True
    assert not [f for f in d["wiring_check"]["findings"] if f["code"] == "audit-embed-differs"]
    (f,) = [f for f in d["wiring_check"]["findings"] if f["code"] == "audit-embed-uncompared"]
    assert f"{cmp['rows']} rows the states hold equal the target's" in f["message"] and "--embeddings" in f["fix"]


def test_the_embedding_audit_completes_the_one_wiring_check(world, tmp_path, monkeypatch):
    """A drafter with its own embed_tokens: the embedding audit is added to verify's wiring check, which
    is made once (it was made a second time, the same, to add it)."""
    import eagle3conv.wiring.apply as apply

    _, captured, drafter = world
    config, _ = load_drafter_weights(drafter)
    V, H = config["vocab_size"], config["hidden_size"]
    gen = torch.Generator().manual_seed(3)
    rnd = _copy_with(drafter, tmp_path / "rnd", {"embed_tokens.weight": torch.randn(V, H, generator=gen) * 0.02})
    made = []
    real = apply.check_fixed
    monkeypatch.setattr(apply, "check_fixed", lambda *a, **kw: made.append(kw) or real(*a, **kw))
    res = verify(rnd, captured, layers=(1, 3, 4), steps=2, save=False)
    assert len(made) == 1
    codes = [f["code"] for f in res.wiring_check["findings"]]
    assert codes[-1] == "audit-embed-differs", codes  # the audit comes last, as assembled() puts it


def test_plot_svg_and_bad_paths(world, tmp_path):
    """issue 13: verify --plot draws each slot's acceptance per layer from the global search; SVG needs nothing."""
    import xml.etree.ElementTree as ET

    _, captured, drafter = world
    out = tmp_path / "search.svg"
    d = json.loads(run("verify", drafter, "--states", captured, "--search-wiring", "--plot", out, "--no-save",
                       "--json").stdout)
    assert d["plot"] == str(out)
    profile = d["verdict"]["coverage"]["slot_profile"]
    assert len(profile) == 3 and all(len(slot) >= 3 for slot in profile)
    root = ET.parse(out).getroot()  # well-formed SVG
    assert root.tag.endswith("svg")
    ns = "{http://www.w3.org/2000/svg}"
    dots = root.findall(f".//{ns}circle")
    assert len(dots) == sum(len(slot) for slot in profile)  # one point per slot and screened layer
    assert len([c for c in dots if c.get("fill") == "#d62728"]) == 3  # the winner's layer in each slot
    # bad suffix, missing folder: usage errors before any work, nothing written
    res = run("verify", drafter, "--states", captured, "--search-wiring", "--plot", tmp_path / "x.jpg", ok=2)
    assert ".svg or .png" in res.stderr and not (tmp_path / "x.jpg").exists()
    res = run("verify", drafter, "--states", captured, "--search-wiring", "--plot", tmp_path / "no" / "x.svg", ok=2)
    assert "does not exist" in res.stderr


def test_plot_png_needs_matplotlib(world, tmp_path):
    import importlib.util

    _, captured, drafter = world
    png = tmp_path / "search.png"
    if importlib.util.find_spec("matplotlib") is None:  # a clear usage error, before any work
        res = run("verify", drafter, "--states", captured, "--search-wiring", "--plot", png, ok=2)
        assert "pip install 'eagle3conv[plot]'" in res.stderr and not png.exists()
        return
    run("verify", drafter, "--states", captured, "--search-wiring", "--plot", png, "--no-save")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_log_score_separates_what_acceptance_ties():
    """issue 13: where acceptance ties a global search's leaders and no record or config stands,
    the step-1 log score (paired over sequences) names the leader it separates from every
    wiring acceptance leaves tied with it -- and says so; never against a clear acceptance
    difference, and never when its own intervals overlap."""
    from eagle3conv.verify import decide
    from eagle3conv.verify.logscore import LogScore

    seqs = 12
    glob = Coverage(is_global=True, layers=31, screened=4495, screen_positions=900, confirmed=3)
    far = _score("engine default", (1, 14, 26), [120] * seqs)
    a = _score("search #1", (4, 13, 21), [180] * seqs)
    b = _score("search #2", (4, 11, 21), [180 + (10 if i % 2 else -9) for i in range(seqs)])
    scores = [far, a, b]

    def logs(means, noise=0.0):
        out = {}
        for i, m in enumerate(means):
            rows = [(m + (noise if (j + i) % 2 else -noise)) * 100 for j in range(seqs)]
            out[i] = LogScore(scores[i].candidate.layers, [rows], [[100] * seqs])
        calls = []

        def log_score(idx):
            calls.append(list(idx))
            return [out[i] for i in idx]

        return log_score, calls

    # without the log score (the old decision): nothing named
    v = decide(scores, [None] * 3, True, "ck", None, coverage=glob, config_names_layers=False)
    assert v.status == "ambiguous" and v.best is None and v.statistic is None
    # the log score separates outputs 4, 11, 21 from its acceptance-tied neighbour
    fn, calls = logs([-3.0, -1.70, -1.65])
    v = decide(scores, [None] * 3, True, "ck", None, coverage=glob, config_names_layers=False, log_score=fn)
    assert v.status == "named" and v.statistic == "log-score" and v.best_layers == "outputs of layers 4, 11, 21"
    assert v.decided_by.startswith("log score:") and "proper scoring rule" in v.decided_by
    assert v.log_score["separated"] and v.log_score["differences"][0]["ci95"][0] > 0
    assert "--trained-on 4,11,21" in v.advice and "most likely trained on" in v.advice
    assert 0 not in sum(calls, [])  # the clearly worse default needs no log score
    # overlapping log-score intervals: still ambiguous, and the verdict says the log score was consulted
    fn, _ = logs([-3.0, -1.70, -1.69], noise=0.2)
    v = decide(scores, [None] * 3, True, "ck", None, coverage=glob, config_names_layers=False, log_score=fn)
    assert v.status == "ambiguous" and v.best is None and not v.log_score["separated"]
    assert "(acceptance, then the step-1 log score, leave them all within 95% of the best" in v.decided_by
    assert v.set_statistic == "acceptance, then the step-1 log score" and len(v.confidence_set) == 2
    # a wiring clearly above the log-score leader in acceptance: the log score never overrides it
    top = _score("search #1", (4, 13, 21), [190] * seqs)
    above = _score("search #3", (4, 12, 21), [188 + (30 if i % 2 else -30) for i in range(seqs)])
    lead = _score("search #2", (4, 11, 21), [180 + (30 if i % 2 else -30) for i in range(seqs)])
    scores = [far, top, above, lead]
    fn, _ = logs([-3.0, -1.80, -1.80, -1.50])
    v = decide(scores, [None] * 4, True, "ck", None, coverage=glob, config_names_layers=False, log_score=fn)
    assert v.tied == 3 and v.log_score["leader"] == "outputs of layers 4, 11, 21"
    assert v.log_score["acceptance_above"] == ["outputs of layers 4, 12, 21"] and not v.log_score["separated"]
    assert v.status == "ambiguous" and v.best is None
    # outside a global search the log score is not consulted (nothing is named there anyway)
    fn, calls = logs([-3.0, -1.70, -1.65])
    v = decide([far, a, b], [None] * 3, True, "ck", None, config_names_layers=False, log_score=fn)
    assert v.status == "ambiguous" and not calls and v.log_score is None


def test_engines_emulate_the_targets_head(world, tmp_path):
    """Without draft_vocab_size in config.json SGLang replaces the drafter's lm_head with the
    target's, vLLM keeps the drafter's (docs/facts.md §9). With the target's weights at hand
    (--embeddings), verify runs each engine with the head it serves: on states whose labels are
    the drafter's step-1 guesses through the target's head (computed here independently),
    SGLang's rows accept every draft and vLLM's do not; without the target's weights the
    SGLang rows say the head could not be emulated."""
    import shutil

    from safetensors.torch import load_file, save_file

    from eagle3conv.model.drafter import Eagle3Drafter

    root, captured, drafter = world
    target = root / "target"
    config, tensors = load_drafter_weights(drafter)
    head = load_file(str(target / "model.safetensors"))["lm_head.weight"].float()
    with_target_head = {k: v for k, v in tensors.items() if k not in ("d2t", "t2d")} | {"lm_head.weight": head}
    with StatesFile(captured) as st:
        ids, mask = st.input_ids, st.attention_mask.bool()
        table = torch.zeros(config["vocab_size"], config["hidden_size"])
        table[ids[mask]] = st.embeddings()[mask].float()
        d = Eagle3Drafter({**config, "draft_vocab_size": config["vocab_size"]}, with_target_head,
                          dtype=torch.float32, embed_tokens=table)
        nxt = torch.zeros_like(ids)
        nxt[:, :-1] = ids[:, 1:]
        guess = d.forward(st.aux(outputs(1, 3, 4)).float(), nxt).target_ids
        tn = st.target_next.clone()
        tn[:, 1:] = guess[:, :-1]
        labelled = tmp_path / "labelled-target-head.safetensors"
        write_states(labelled, input_ids=st.input_ids, attention_mask=st.attention_mask, target_next=tn,
                     hidden={ref: st.hidden(ref) for ref in st.layers}, num_layers=st.num_layers,
                     vocab_size=st.vocab_size, target=st.target, loss_mask=st.loss_mask, dtype="fp32")
    # a full-vocabulary drafter (as Kimi-K2.5's: draft vocab = vocab, no d2t) whose config lacks
    # draft_vocab_size (with a reduced head verify refuses it outright)
    d2 = tmp_path / "d2"
    shutil.copytree(drafter, d2)
    full = {k: v for k, v in tensors.items() if k not in ("d2t", "t2d")}
    full["lm_head.weight"] = torch.randn(config["vocab_size"], config["hidden_size"],
                                         generator=torch.Generator().manual_seed(1)).to(tensors["lm_head.weight"].dtype)
    (d2 / "model.safetensors").unlink()
    save_file(full, str(d2 / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((d2 / "config.json").read_text())
    cfg.pop("draft_vocab_size", None)
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True}
    cfg["eagle_aux_hidden_state_layer_ids"] = [2, 4, 5]  # vLLM reads these raw: outputs 1, 3, 4 as SGLang
    (d2 / "config.json").write_text(json.dumps(cfg))

    args = ("verify", d2, "--states", labelled, "--steps", "2", "--no-save", "--json")
    d = json.loads(run(*args, "--embeddings", target).stdout)
    rows = engine_rows(d)
    sg, vl = rows[NEW], rows[VLLM]
    assert sg["captures"] == vl["captures"] == "outputs of layers 1, 3, 4"
    assert sg["forward"]["head"] == "target's" and vl["forward"]["head"] == "drafter's own"
    assert any("replaces the drafter's lm_head" in e for e in sg["emulated"]) and not sg["not_emulated"]
    assert sg["acceptance"][0] == 1.0 and vl["acceptance"][0] < 0.9
    assert d["acceptance_per_position"][0] == 1.0  # verify's own score runs as SGLang serves it
    # without the target's weights: the drafter's own head, and the row says what it could not run
    d = json.loads(run(*args).stdout)
    sg = engine_rows(d)[NEW]
    assert sg["forward"]["head"] == "drafter's own" and sg["acceptance"][0] < 0.9
    assert any("target's lm_head" in e and "--embeddings" in e for e in sg["not_emulated"])


def test_a_drafter_narrower_than_its_target_embeds_with_its_own_table_in_every_engine(world, tmp_path):
    """A drafter whose hidden size differs from the target's ships its own embed_tokens, and every
    engine embeds with it (a table of the target's width cannot feed it): verify scores it on
    captured states, every engine row says so, and nothing tries to compare tables of two widths."""
    root, captured, _ = world
    with StatesFile(captured) as st:
        vocab = st.vocab_size
    narrow = write_example(tmp_path / "narrow", "sglang", Dims(hidden=32, target_hidden=64, heads=4, kv_heads=2,
                                                                 head_dim=8, intermediate=64, vocab=vocab,
                                                                 draft_vocab=300, aux_ids=(1, 3, 4)))
    d = json.loads(run("verify", narrow, "--states", captured, "--steps", "2", "--no-save", "--json").stdout)
    rows = list(engine_rows(d).values())
    assert rows and all(r["forward"]["embedding"] == "drafter's own" for r in rows if r.get("forward"))
    assert not any("embeds with the drafter's own" in e for r in rows for e in r.get("emulated", []))
    assert "embedding_comparison" not in d["wiring_check"]
    assert d["acceptance_per_position"] and d["results"][0]["positions_scored"] > 0


def test_embedding_rows_seen_identical_are_not_called_the_whole_table(world):
    """vLLM compares the whole table (torch.equal): rows the states hold that match the captured
    embedding output say nothing of the others, so ``identical`` stays None (not True) and the
    comparison says which rows were not compared."""
    from eagle3conv.verify.inputs import compare_embeddings

    _, captured, _ = world
    with StatesFile(captured) as st:
        ids, mask = st.input_ids, st.attention_mask.bool()
        own = torch.zeros(st.vocab_size, st.hidden_size)
        own[ids[mask]] = st.embeddings()[mask].float()
        cmp = compare_embeddings(own, st)
        assert 0 < cmp["rows"] < cmp["of"] and cmp["max_abs_diff"] == 0.0
        assert cmp["identical"] is None and cmp["identical_rows"] is True and "not compared" in cmp["how"]
        # every row compared through the target's own table: identical means identical
        assert compare_embeddings(own, st, table=own.clone())["identical"] is True
        other = own.clone()
        other[-1, 0] += 1.0  # a row the states never hold
        assert compare_embeddings(own, st, table=other)["identical"] is False
        # a table of another width is not compared row by row
        assert compare_embeddings(torch.zeros(st.vocab_size, 8), st)["identical"] is False


def test_the_config_wiring_is_described_in_plain_words():
    """The wiring verify scores from config.json's ids says which release's reading it took them by (the
    report prints the layers beside it), never an internal numbering's name."""
    from eagle3conv.spec.engines import default_engines
    from eagle3conv.verify.search import config_candidate
    from eagle3conv.wiring.check import engine_rows as rows_of

    cfg = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}}
    # the newest SGLang reads them (the first engine's priority release); the DeepSeek/Kimi path reads a
    # first id other than 1 raw
    for family, want in (("llama", [2, 30, 58]), ("deepseek_v2", [1, 29, 57])):
        rows = rows_of(cfg, None, None, family, 61, default_engines(), explicit=False, fix_command="x")
        cand = config_candidate(cfg, 61, family, rows)
        assert [r.output_of for r in cand.layers] == want
        assert cand.why == f"config.json eagle_config.eagle_aux_hidden_state_layer_ids [2, 30, 58], as sglang {NEWEST_SGLANG} reads them"
    from eagle3conv.spec.engines import parse_engine

    rows = rows_of(cfg, None, None, "deepseek_v2", 61, (parse_engine(f"sglang=={OLDEST_SGLANG}"),), explicit=True,
                   fix_command="x")
    assert [r.output_of for r in config_candidate(cfg, 61, "deepseek_v2", rows).layers] == [2, 30, 58]