"""MLA drafters through verify's smoke test, the push gate and the model card.

All on the real MLA drafter trained on SmolLM2-135M (tests/data/smollm2-drafter-mla,
outputs 1, 14, 26): the gate and ``verify`` without states run its real forward
(docs/facts.md §10), so a drafter whose shapes are right but whose weights are
broken is refused; the card pushed to a real HTTP server describes the latent
attention dims and the RoPE.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from test_push import do_push, hub, hub_env  # noqa: F401 - the real Hub server fixtures
from eagle3conv.checkpoint.index import open_checkpoint
from eagle3conv.errors import EXIT_INVALID
from eagle3conv.hub.card import gather_facts, render_block
from eagle3conv.publish import default_gate, smoke_check

FIXTURE = Path(__file__).parent / "data" / "smollm2-drafter-mla"
ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "eagle3conv", *args], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.fixture
def mla(tmp_path) -> Path:
    dest = tmp_path / "mla"
    shutil.copytree(FIXTURE, dest)
    return dest


def _poison(folder: Path, key: str = "midlayer.self_attn.kv_b_proj.weight") -> None:
    """Right names and shapes, broken weights: only a real forward notices."""
    f = folder / "model.safetensors"
    t = load_file(str(f))
    t[key] = torch.full_like(t[key], float("nan"))
    save_file(t, str(f), metadata={"format": "pt"})


def test_verify_smoke_runs_the_mla_forward(mla):
    r = _cli("verify", str(mla), "--target", "smollm2-135m", "--json")  # the target it was trained on
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["ok"] and "forward ran" in d["kind"]
    assert d["wiring"]["findings"] and not [f for f in d["wiring"]["findings"] if f["level"] == "error"]
    # the same SmolLM2 drafter checked against Kimi-K2.5: the forward runs, the wiring check says
    # the drafter reads 576-wide states and Kimi's are 7168 wide (exit 3)
    r = _cli("verify", str(mla), "--target", "kimi-k2.5", "--json")
    assert r.returncode == EXIT_INVALID, r.stderr
    k = json.loads(r.stdout)
    assert "forward ran" in k["kind"] and not k["ok"]
    assert any(f["code"] == "target-hidden" and f["level"] == "error" for f in k["wiring"]["findings"])
    assert (d["step1_input_width"], d["step2_input_width"], d["logits_width"]) == (3 * 576, 576, 2048)
    assert d["engine_notes"] == []

    _poison(mla)
    r = _cli("verify", str(mla), "--json")
    assert r.returncode == EXIT_INVALID, r.stdout + r.stderr
    d = json.loads(r.stdout)
    assert not d["ok"] and any("non-finite" in p for p in d["problems"])


def test_push_gate_runs_the_mla_forward(mla):
    ok = smoke_check(open_checkpoint(mla))
    assert ok.ok and "MLA drafter forward" in ok.detail and "2048 draft logits" in ok.detail, ok.detail
    _poison(mla)
    bad = smoke_check(open_checkpoint(mla))
    assert not bad.ok and "non-finite" in bad.detail, bad.detail


def test_push_of_an_mla_drafter_card_describes_mla(hub, mla):  # noqa: F811
    from eagle3conv.api import fix_keys

    fix_keys(mla)
    checks = {c.name: c for c in default_gate(mla)}
    assert all(c.ok for c in checks.values()), [(c.name, c.detail) for c in checks.values()]
    assert "MLA drafter forward" in checks["smoke-test"].detail
    res = do_push(hub, mla, "org/smollm2-mla")
    assert not res.forced
    card = hub.read("org/smollm2-mla", "README.md").decode()
    assert "multi-head latent attention (MLA)" in card
    for row in ("| `q_lora_rank` | 128 |", "| `kv_lora_rank` | 64 |",
                "| `qk_nope_head_dim` / `qk_rope_head_dim` | 32 / 16 |", "| `v_head_dim` | 32 |",
                "| RoPE theta | 100000.0 |", "interleaved pairs (`rope_interleave: true`)"):
        assert row in card, row
    assert "`yarn` (run as DeepSeek yarn), factor 4.0, original context 2048" in card
    assert "PASSED" in card or "passed" in card


def test_card_names_the_engine_differences_of_an_mla_config(tmp_path):
    cfg = json.loads((FIXTURE / "config.json").read_text())
    cfg.update(rope_interleave=False, q_lora_rank=None)
    cfg.pop("rope_scaling")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    block = render_block(gather_facts(tmp_path, "org/x"))
    assert "| `q_lora_rank` | null |" in block and "SGLang refuses this drafter" in block
    assert "half-split (`rope_interleave: false`)" in block and "vLLM always uses interleaved" in block
    assert "| RoPE scaling | none |" in block

    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 32}))
    assert "latent attention" not in render_block(gather_facts(llama, "org/y"))
