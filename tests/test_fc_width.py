"""A drafter whose k aux states add up to its own width (k x target_hidden_size == hidden_size):
SGLang 0.5.12-0.5.23 applies fc only when its input is not hidden_size wide, so it serves the
drafter without fc at step 1; vLLM 0.33.0 always applies fc to the target's states
(docs/facts.md §11). The rows say so, and verify scores each release as it runs."""

from __future__ import annotations

import json

import torch

from eagle3conv.example import Dims, write_example
from eagle3conv.spec.engines import forward_rule, parse_engine, serve_finding, served_without
from eagle3conv.spec.variants import Handling
from eagle3conv.states.format import write_states
from eagle3conv.verify import build_drafter, load_drafter_weights
from helpers import NEWEST_SGLANG, NEWEST_VLLM, OLDEST_SGLANG, engine_rows, run

WIDE = Dims(hidden=192, target_hidden=64, heads=4, kv_heads=2, head_dim=48, intermediate=128, vocab=512,
            draft_vocab=300, aux_ids=(1, 3, 4))


def test_the_rules_say_who_dispatches_on_width():
    for rel in (OLDEST_SGLANG, NEWEST_SGLANG):
        for kind in ("llama", "mla"):
            assert forward_rule(parse_engine(f"sglang=={rel}"), kind).handling("fc") is Handling.IGNORED
    for kind in ("llama", "mla"):
        assert forward_rule(parse_engine(f"vllm=={NEWEST_VLLM}"), kind).handling("fc") is Handling.HONOURED


def test_sglang_rows_say_it_serves_the_drafter_without_fc(tmp_path):
    folder = write_example(tmp_path / "wide", "sglang", WIDE)
    cfg = json.loads((folder / "config.json").read_text())
    assert served_without(f"sglang=={NEWEST_SGLANG}", cfg) == ("fc",)
    f = serve_finding(f"sglang=={NEWEST_SGLANG}", cfg, asked=False)
    assert f is not None and f"{NEWEST_SGLANG} applies fc only when its input is not hidden_size wide" in f.message
    assert "serves the drafter without fc at step 1" in f.message
    assert serve_finding(f"vllm=={NEWEST_VLLM}", cfg, asked=False) is None
    # the usual widths: nobody skips fc
    narrow = write_example(tmp_path / "narrow", "sglang", Dims(hidden=64, target_hidden=64, heads=4, kv_heads=2,
                                                               head_dim=16, intermediate=128, vocab=512,
                                                               draft_vocab=300, aux_ids=(1, 3, 4)))
    assert served_without(f"sglang=={NEWEST_SGLANG}", json.loads((narrow / "config.json").read_text())) == ()


def test_verify_scores_each_release_as_it_runs(tmp_path):
    """States labelled by the drafter run with fc (as trained, as vLLM serves it): vLLM's row scores
    them as its guesses; SGLang's row, run without fc, scores far lower, and says why."""
    folder = write_example(tmp_path / "wide", "sglang", WIDE)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [2, 4, 5]  # vLLM's ids (inputs of layers) for outputs 1, 3, 4
    (folder / "config.json").write_text(json.dumps(cfg))
    config, tensors = load_drafter_weights(folder)
    drafter, target_embeds = build_drafter(config, tensors, "cpu", torch.float32)
    assert not target_embeds  # the drafter is wider than the target: it embeds with its own table
    g = torch.Generator().manual_seed(4)
    B, S, T = 12, 24, 64
    hidden = {o: torch.randn(B, S, T, generator=g) * (1 + o / 4) for o in range(-1, 6)}
    input_ids = torch.randint(0, 512, (B, S), generator=g)
    with torch.inference_mode():
        guess = drafter.draft_chain(torch.cat([hidden[o] for o in (1, 3, 4)], -1), input_ids, 1).target_ids[0]
    target_next = torch.randint(0, 512, (B, S), generator=g)
    target_next[:, 1:] = guess[:, :-1]
    states = tmp_path / "states.safetensors"
    write_states(states, input_ids=input_ids, attention_mask=torch.ones(B, S, dtype=torch.bool),
                 target_next=target_next, hidden=hidden, num_layers=6, vocab_size=512, dtype="fp32", target="tiny")
    doc = json.loads(run("verify", folder, "--states", states, "--steps", "1", "--no-save", "--json",
                         "--device", "cpu", "--dtype", "fp32", ok=None).stdout)
    rows = engine_rows(doc)
    vllm, sglang = rows[f"vllm=={NEWEST_VLLM}"], rows[f"sglang=={NEWEST_SGLANG}"]
    assert vllm["acceptance"][0] == 1.0  # the labels are its own guesses
    assert sglang["acceptance"][0] < 0.5
    assert any("serves the drafter without fc at step 1" in e for e in sglang["emulated"])
    assert not any("fc" in e for e in vllm.get("emulated") or [])
