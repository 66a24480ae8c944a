"""``verify --target kimi-k2.5`` with captured states, for both families of public Kimi drafters.

A Kimi-K2.5-width drafter (hidden 7168, fc over 3 x 7168, Kimi's 163840-token vocab with a
256-token draft head and its d2t/t2d; everything else kept small so a CPU runs it in
seconds), once as the MLA drafter (``Eagle3DeepseekV2ForCausalLM``, Kimi's yarn RoPE) and
once as the Llama-type drafter, on a states file of the 61-layer target: the embedding
output and all 61 layer outputs, each layer drawn at its own scale so a state's norm says
which layer it came from. The labels (the target's next tokens) are the drafter's own
step-1 guesses from outputs 2, 30, 58 -- the seed incident's training layers -- so a
release that feeds those layers scores acceptance 1 and any other wiring scores ~0.

What is checked, per family: the config TorchSpec's Kimi training writes (nested ids
``[2, 30, 58]``, nothing top-level) is read as outputs 2, 30, 58 by SGLang 0.5.12 and one
layer earlier by 0.5.13+ (the first-id rule), vLLM and TensorRT-LLM fall back to their
defaults -- each row's figure measured on the states, not asserted from the table; the
per-slot norms verify reports are those of the layers it says it fed; and after
``eagle3conv config --trained-on 2,30,58 --engine sglang==0.5.23`` the current releases
all feed the trained layers (docs/facts.md §9).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from eagle3conv.model import build_drafter
from eagle3conv.spec.canonical import expected
from eagle3conv.spec.drafter import DrafterSpec
from eagle3conv.states.format import write_states
from helpers import NEWEST_SGLANG, NEWEST_VLLM, OLDEST_SGLANG, engine_rows, run

OLD, NEW, VLLM = f"sglang=={OLDEST_SGLANG}", f"sglang=={NEWEST_SGLANG}", f"vllm=={NEWEST_VLLM}"

H, V, DV, LAYERS = 7168, 163840, 256, 61
B, S = 2, 12
TRAINED = (2, 30, 58)


def scale(layer: int) -> float:
    """The scale layer ``layer``'s output is drawn at (the embedding output is layer -1): 4% apart
    from one layer to the next, well above the spread of a median norm over 22 tokens (~0.3%)."""
    return 1.04 ** (layer + 1)


def kimi_config(kind: str) -> dict:
    c = {"hidden_size": H, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
         "vocab_size": V, "draft_vocab_size": DV, "rms_norm_eps": 1e-5, "max_position_embeddings": 262144,
         "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "hidden_act": "silu",
         "rope_theta": 50000.0,
         # what TorchSpec's Kimi training config writes: nested ids only (docs/facts.md §9)
         "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(TRAINED), "use_aux_hidden_state": True}}
    if kind == "mla":
        yarn = {"type": "yarn", "rope_type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
                "beta_fast": 1, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
        c.update(architectures=["Eagle3DeepseekV2ForCausalLM"], model_type="kimi_k2", q_lora_rank=32,
                 kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, num_key_value_heads=2,
                 rope_scaling=yarn, rope_parameters=dict(yarn, rope_theta=50000.0))
    else:
        c.update(architectures=["LlamaForCausalLMEagle3"], model_type="llama", num_key_value_heads=1, head_dim=64)
    return c


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    """(states path, {family: drafter folder}) -- states labelled per family by its own guesses."""
    root = tmp_path_factory.mktemp("kimi")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (B, S), generator=g)
    hidden = {layer: torch.randn(B, S, H, generator=g) * scale(layer) for layer in range(-1, LAYERS)}
    table = torch.zeros(V, H)
    table[ids.flatten()] = hidden[-1].flatten(0, 1)  # the target's embedding of the tokens the states hold
    out = {}
    for kind in ("mla", "llama"):
        config = kimi_config(kind)
        tensors = {}
        for name, e in expected(DrafterSpec.from_config(config)).items():
            if not e.required:
                continue
            if name == "d2t":
                hot = torch.randperm(V, generator=g)[:DV].sort().values
                tensors["d2t"] = hot - torch.arange(DV)
                tensors["t2d"] = torch.zeros(V, dtype=torch.bool)
                tensors["t2d"][hot] = True
            elif name.endswith("norm.weight"):
                tensors[name] = torch.ones(e.shape, dtype=torch.bfloat16)
            else:
                tensors[name] = (torch.randn(e.shape, generator=g) / math.sqrt(e.shape[-1])).to(torch.bfloat16)
        folder = root / kind
        folder.mkdir()
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(config, indent=2))
        # labels: the drafter's step-1 guesses from outputs 2, 30, 58, in SGLang's draft-extend
        # layout (row t reads token t+1, guesses token t+2 = target_next[t+1])
        drafter = build_drafter(config, {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()},
                                dtype=torch.float32, embed_tokens=table)
        nxt = torch.zeros_like(ids)
        nxt[:, :-1] = ids[:, 1:]
        with torch.inference_mode():
            guess = drafter.forward(torch.cat([hidden[i] for i in TRAINED], -1), nxt).target_ids
        labels = torch.zeros_like(ids)
        labels[:, 1:] = guess[:, :-1]
        states = root / f"{kind}.safetensors"
        write_states(states, input_ids=ids, attention_mask=torch.ones(B, S, dtype=torch.long), target_next=labels,
                     hidden=hidden, num_layers=LAYERS, vocab_size=V, target="kimi-k2.5", dtype="fp32")
        out[kind] = (folder, states)
    return out


def _verify(folder: Path, states: Path) -> dict:
    r = run("verify", folder, "--states", states, "--target", "kimi-k2.5", "--steps", "1", "--no-save", "--json")
    return json.loads(r.stdout)


def _rows(doc: dict) -> dict:
    return engine_rows(doc)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mla", "llama"])
def test_kimi_drafter_verified_engine_by_engine(kimi, tmp_path, kind):
    folder, states = kimi[kind]
    doc = _verify(folder, states)
    rows = _rows(doc)
    old, new, vllm = rows[OLD], rows[NEW], rows[VLLM]
    # the seed incident's two readings of [2, 30, 58], measured on the states
    assert old["captures"] == "outputs of layers 2, 30, 58" and old["acceptance"][0] == 1.0
    assert new["captures"] == "outputs of layers 1, 29, 57" and new["acceptance"][0] < 0.5
    assert vllm["captures"] == "outputs of layers 1, 29, 57" and vllm["acceptance"][0] < 0.5  # its default
    assert old["accept_length"] > new["accept_length"]
    # the norms verify reports are those of the layers it says it fed (each layer has its own scale)
    score = doc["results"][0]
    fed = [ref["output_of"] for ref in score["layers"]]
    assert fed == [1, 29, 57]  # SGLang's current reading leads the report
    for slot, layer in enumerate(fed):
        assert score["norms"][slot]["median"] == pytest.approx(math.sqrt(H) * scale(layer), rel=0.012)
        assert score["norms"][slot]["median"] != pytest.approx(math.sqrt(H) * scale(layer + 1), rel=0.012)

    # written for the current releases, every one of them feeds the trained layers
    fixed = tmp_path / "fixed"
    shutil.copytree(folder, fixed)
    run("config", fixed, "--target", "kimi-k2.5", "--trained-on", "2,30,58", "--captured-at", "output",
        "--engine", NEW)
    rows = _rows(_verify(fixed, states))
    for engine in (NEW, VLLM, "tensorrt-llm"):
        assert rows[engine]["captures"] == "outputs of layers 2, 30, 58", engine
        assert rows[engine]["acceptance"][0] == 1.0, engine
    assert rows[OLD]["captures"] == "outputs of layers 3, 31, 59"
    assert rows[OLD]["acceptance"][0] < 0.5
