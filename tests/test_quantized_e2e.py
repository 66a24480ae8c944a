"""The cost of quantization measured on real captured SmolLM2 states: the trained SmolLM2 drafter
quantized by compressed-tensors' own code (tests/quant_producer.py), converted by fix-keys (fc
dequantized for SGLang where needed), and verified against the bf16 original with ``--reference``
(paired interval over sequences). FP8's cost is within its interval of zero; NVFP4's is measured; and
SGLang 0.5.23's fc (a plain bf16 Linear, docs/facts.md §14) is scored as it would load it -- FP8 codes
unscaled, a packed fc at its random init -- beside the right forward, to show what fix-keys' error
prevents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3conv.api import fix_keys
from eagle3conv.verify import verify
from eagle3conv.wiring.apply import WiringOptions

pytest.importorskip("compressed_tensors")
from quant_producer import quantize_drafter  # noqa: E402

FIXTURE = Path(__file__).parent / "data" / "smollm2-drafter"
HELDOUT_CHATS = Path(__file__).parent / "data" / "smollm2-heldout.jsonl"
VLLM = WiringOptions(engines=("vllm==0.33.0",))
SGLANG = WiringOptions(engines=("sglang==0.5.23",))


@pytest.fixture(scope="module")
def states(tmp_path_factory):
    from eagle3conv.errors import Eagle3ConvError
    from eagle3conv.states.capture import capture_states
    from eagle3conv.states.target_model import load_target_model

    try:
        target = load_target_model("smollm2-135m")
    except Eagle3ConvError as e:
        pytest.skip(f"SmolLM2 not installed: {e.message}")
    chats = [json.loads(line) for line in HELDOUT_CHATS.read_text(encoding="utf-8").splitlines() if line.strip()]
    out = tmp_path_factory.mktemp("smollm2-q") / "states.safetensors"
    capture_states(target.model, target.tokenizer, chats[:40], out, layers=[1, 14, 26], batch_size=10, dtype="bf16",
                   target=target.name)
    return out


@pytest.fixture(scope="module")
def drafters(tmp_path_factory):
    root = tmp_path_factory.mktemp("qdrafters")
    out = {}
    for name, preset in (("fp8", "FP8_DYNAMIC"), ("nvfp4", "NVFP4")):
        q = quantize_drafter(FIXTURE, root / f"{name}-src", preset)
        fix_keys(q, out=root / name, wiring_options=VLLM)  # what vLLM 0.33.0 serves: every module quantized
        out[name] = root / name
    return out


def _cost(res):
    c = res.quantization
    assert c is not None and c["ci95"] is not None
    return c["difference"], c["ci95"]


def test_fp8_costs_nothing_measurable(states, drafters):
    res = verify(drafters["fp8"], states, reference_drafter=FIXTURE, wiring_options=VLLM, save=False)
    d, (lo, hi) = _cost(res)
    assert lo <= 0.0 <= hi, (d, lo, hi)  # within its paired interval of zero
    assert abs(d) < 0.05
    assert any("dequantized as the scheme defines" in n for n in res.states["verify_notes"])


def test_nvfp4_cost_is_measured_and_sglang_raw_fc_is_far_worse(states, drafters):
    nv = verify(drafters["nvfp4"], states, reference_drafter=FIXTURE, wiring_options=VLLM, save=False)
    d_nv, (lo, hi) = _cost(nv)
    assert hi - lo < 0.2 and d_nv < 0.05  # measured, with an interval; not better than bf16 beyond noise
    raw = verify(drafters["fp8"], states, reference_drafter=FIXTURE, wiring_options=VLLM, save=False,
                 raw_modules=("fc",))
    d_raw, (_, hi_raw) = _cost(raw)
    assert hi_raw < 0 and d_raw < d_nv - 0.3, (d_raw, d_nv)  # what SGLang would serve: far below the right forward


def test_sglang_row_runs_fc_as_sglang_loads_it(states, drafters):
    """With --engine sglang==0.5.23 the release's row is scored with fc's codes unscaled, beside verify's
    own (right) score; fix-keys refused the folder for SGLang, this is what that error prevents."""
    res = verify(drafters["fp8"], states, wiring_options=SGLANG, save=False)
    row = res.engine_scores[0]
    assert any("plain bf16 Linear" in e for e in row.emulated)
    assert row.paired_vs_main["ci95"][1] < 0 and row.score.accept_length_all < res.main.accept_length_all - 0.3


def test_static_fp8_activations_are_emulated(states, tmp_path):
    """compressed-tensors' static FP8 preset (per-tensor weights, per-tensor static input scales
    calibrated on the captured states): verify quantizes each module's input with its input_scale, as a
    static-activation kernel does. Calibrated, it costs little; an input_scale far too small (inputs
    saturating at 448 x scale) costs much more -- what the emulation is there to show."""
    from quant_producer import input_amax

    amax = input_amax(FIXTURE, states)
    assert set(amax) >= {"fc", "midlayer.self_attn.q_proj", "lm_head"}
    good = quantize_drafter(FIXTURE, tmp_path / "static-src", "FP8", input_amax=amax)
    bad = quantize_drafter(FIXTURE, tmp_path / "static-bad-src", "FP8", input_amax={k: v / 30 for k, v in amax.items()})
    fix_keys(good, out=tmp_path / "static", wiring_options=VLLM)
    fix_keys(bad, out=tmp_path / "static-bad", wiring_options=VLLM)
    ok = verify(tmp_path / "static", states, reference_drafter=FIXTURE, wiring_options=VLLM, save=False)
    assert any("static FP8 activations emulated" in n for n in ok.states["verify_notes"])
    d_ok, _ = _cost(ok)
    wrong = verify(tmp_path / "static-bad", states, reference_drafter=FIXTURE, wiring_options=VLLM, save=False)
    d_bad, (_, hi_bad) = _cost(wrong)
    assert abs(d_ok) < 0.05 and hi_bad < 0 and d_bad < d_ok - 0.05, (d_ok, d_bad)
