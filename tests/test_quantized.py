"""Quantized drafters made by compressed-tensors' own code (tests/quant_producer.py) from the trained
SmolLM2 drafter: fix-keys carries them byte for byte, refuses what a release cannot serve (SGLang
0.5.23's fc), --dequantize writes fc exactly as compressed-tensors' own decompressor computes it, bad
input is refused with nothing written, and verify measures the cost of quantization on real captured
SmolLM2 states against the bf16 original (docs/facts.md §14)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from eagle3conv.api import fix_keys
from eagle3conv.errors import InvalidCheckpointError
from eagle3conv.wiring.apply import WiringOptions

ct = pytest.importorskip("compressed_tensors")
from quant_producer import quantize_drafter  # noqa: E402

FIXTURE = Path(__file__).parent / "data" / "smollm2-drafter"
VLLM = WiringOptions(engines=("vllm==0.33.0",))


def _int4_group64():
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    return QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(num_bits=4, type="int", strategy="group",
                                                                           group_size=64, symmetric=True))


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    root = tmp_path_factory.mktemp("quantized")
    return {name: quantize_drafter(FIXTURE, root / name, preset)
            for name, preset in (("fp8", "FP8_DYNAMIC"), ("nvfp4", "NVFP4"), ("int4", _int4_group64()),
                                 ("fp8block", "FP8_BLOCK"), ("int8", "W8A8"))}


def _tree_of(folder: Path) -> dict:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _listing(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize("name", ["fp8", "nvfp4", "int4", "fp8block", "int8"])
def test_carried_byte_for_byte_for_vllm(quantized, tmp_path, name):
    out = tmp_path / "out"
    res = fix_keys(quantized[name], out=out, wiring_options=VLLM)
    src, got = _tree_of(quantized[name]), _tree_of(out)
    assert set(got) == set(src)
    for k in src:
        assert src[k].dtype == got[k].dtype and torch.equal(src[k].view(torch.uint8), got[k].view(torch.uint8)), k
    q = res.plan.quantization
    assert q is not None and "fc" in q.quantized and "lm_head" not in q.quantized
    rel = {r.release: r for r in q.releases}["vllm==0.33.0"]
    assert rel.serves_as_defined and rel.option == "speculative_config.quantization"
    assert rel.value == "compressed-tensors"
    assert "lm_head" in json.loads((out / "config.json").read_text())["quantization_config"]["ignore"]


@pytest.mark.parametrize("name", ["fp8", "nvfp4", "int4", "fp8block", "int8"])
def test_sglang_fc_is_an_error_with_both_fixes(quantized, tmp_path, name):
    out = tmp_path / "out"
    with pytest.raises(InvalidCheckpointError) as e:
        fix_keys(quantized[name], out=out, wiring_options=WiringOptions(engines=("sglang==0.5.23",)))
    assert any(d.startswith("fc: sglang 0.5.23 builds it as a plain bf16 Linear") for d in e.value.details)
    assert "--dequantize fc" in e.value.hint and "vllm" in e.value.hint
    assert not out.exists()


def _ct_decompressed(folder: Path, module: str) -> torch.Tensor:
    """compressed-tensors' own decompressor on one module's stored tensors."""
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.config import CompressionFormat
    from compressed_tensors.quantization import QuantizationScheme

    cfg = json.loads((folder / "config.json").read_text())["quantization_config"]
    group = cfg["config_groups"]["group_0"]
    scheme = QuantizationScheme(targets=group["targets"], weights=group["weights"],
                                input_activations=group.get("input_activations"))
    comp = BaseCompressor.get_value_from_registry(CompressionFormat(group["format"]).value)
    sd = {k.rsplit(".", 1)[1]: v for k, v in _tree_of(folder).items() if k.rsplit(".", 1)[0] == module}
    return comp.decompress(sd, scheme)["weight"]


def _from_spec_block(folder: Path, module: str) -> torch.Tensor:
    """The block scheme's definition, written out here: each [128, 128] block of codes times its scale."""
    sd = _tree_of(folder)
    codes, scale = sd[f"{module}.weight"].float(), sd[f"{module}.weight_scale"].float()
    o, i = codes.shape
    out = torch.empty(o, i)
    for bi in range(scale.shape[0]):
        for bj in range(scale.shape[1]):
            rows, cols = slice(bi * 128, (bi + 1) * 128), slice(bj * 128, (bj + 1) * 128)
            out[rows, cols] = codes[rows, cols] * scale[bi, bj]
    return out


@pytest.mark.parametrize("name", ["fp8", "nvfp4", "int4", "fp8block", "int8"])
def test_dequantize_fc_matches_compressed_tensors(quantized, tmp_path, name):
    out = tmp_path / "out"
    fix_keys(quantized[name], out=out, dequantize=("fc",))
    got = _tree_of(out)
    assert got["fc.weight"].dtype == torch.bfloat16
    assert not [k for k in got if k.startswith("fc.") and k != "fc.weight"]
    if name == "fp8block":  # compressed-tensors 0.17.0 cannot decompress blocks that do not divide [576, 1728]
        want = _from_spec_block(quantized[name], "fc")
    else:
        want = _ct_decompressed(quantized[name], "fc").float()
    assert torch.equal(got["fc.weight"], want.to(torch.bfloat16))
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert "fc" in cfg["ignore"] and "model.fc" in cfg["ignore"]


def _bad(tmp_path, quantized, name, edit) -> Path:
    src = tmp_path / "bad"
    shutil.copytree(quantized[name], src)
    tensors = load_file(str(src / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    edit(tensors, config)
    save_file(tensors, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps(config))
    return src


@pytest.mark.parametrize("name,edit,needle", [
    ("fp8", lambda t, c: t.pop("midlayer.mlp.up_proj.weight_scale"), "midlayer.mlp.up_proj.weight_scale is missing"),
    ("fp8", lambda t, c: t.__setitem__("fc.weight_scale", torch.ones(3, 1)), "fc.weight_scale: shape [3, 1]"),
    ("int4", lambda t, c: t.__setitem__("fc.weight_shape", torch.tensor([576, 1664])),
     "fc.weight_shape holds [576, 1664] but the config implies [O=576, I=1728]"),
    ("nvfp4", lambda t, c: t.__setitem__("midlayer.self_attn.o_proj.weight_packed",
                                         t["midlayer.self_attn.o_proj.weight_packed"][:, :100].contiguous()),
     "midlayer.self_attn.o_proj.weight_packed: shape [576, 100]"),
])
def test_bad_quantized_tensors_are_refused(quantized, tmp_path, name, edit, needle):
    src = _bad(tmp_path, quantized, name, edit)
    before = _listing(src)
    with pytest.raises(InvalidCheckpointError) as e:
        fix_keys(src, out=tmp_path / "out", wiring_options=VLLM)
    assert any(needle in d for d in e.value.details), e.value.details
    assert not (tmp_path / "out").exists() and _listing(src) == before


def test_unknown_quant_method_is_refused(quantized, tmp_path):
    src = _bad(tmp_path, quantized, "fp8",
               lambda t, c: c["quantization_config"].__setitem__("quant_method", "bitsandbytes"))
    with pytest.raises(InvalidCheckpointError) as e:
        fix_keys(src, out=tmp_path / "out", wiring_options=VLLM)
    assert "quant_method 'bitsandbytes'" in e.value.message and not (tmp_path / "out").exists()


def test_quantized_embedding_is_refused(quantized, tmp_path):
    def edit(t, c):
        t["embed_tokens.weight"] = torch.zeros(49152, 576, dtype=torch.float8_e4m3fn)
        t["embed_tokens.weight_scale"] = torch.ones(49152, 1)

    src = _bad(tmp_path, quantized, "fp8", edit)
    with pytest.raises(InvalidCheckpointError) as e:
        fix_keys(src, out=tmp_path / "out", wiring_options=VLLM, keep_embed=True)
    assert any(d.startswith("embed_tokens is quantized") for d in e.value.details)


def test_method_less_hf_quant_config_is_flagged(tmp_path):
    src = tmp_path / "bf16"
    shutil.copytree(FIXTURE, src)
    (src / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"},
                                                          "quantization": {"quant_algo": None}}))
    res = fix_keys(src, dry_run=True)
    found = [f for f in res.plan.findings if f.code == "quant-config"]
    assert found and found[0].level == "warning" and "unquant" in found[0].fix


def test_modelopt_nested_exclusions_are_normalised(quantized, tmp_path):
    """hf_spec_export's nested form in hf_quant_config.json only; exclude_modules names the whole model."""
    def edit(t, c):
        c.pop("quantization_config")

    src = _bad(tmp_path, quantized, "fp8", edit)
    tensors = load_file(str(src / "model.safetensors"))
    fp8 = {k: v for k, v in tensors.items()}
    for k in [k for k in fp8 if k.endswith("weight_scale")]:
        fp8[k] = fp8[k].reshape(-1).amax().reshape(()) * 0 + 1.0  # per-tensor scales (Model Optimizer FP8)
    fp8 = {k: v for k, v in fp8.items()}
    save_file(fp8, str(src / "model.safetensors"))
    (src / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt", "version": "0.47.0"},
        "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None,
                         "exclude_modules": ["lm_head", "eagle_module.lm_head", "model.layers.0.mlp.*"]}}))
    res = fix_keys(src, dry_run=True, wiring_options=VLLM)
    codes = [(f.level, f.code, f.subject) for f in res.plan.findings]
    assert ("warning", "quant-exclusion", "quantization_config") in codes  # model.layers.0.mlp.* names nothing
    q = res.plan.quantization
    assert q.method == "modelopt" and q.scheme == "fp8-tensor"
    assert "lm_head" in q.exclude_written and "model.fc" not in q.exclude_written
    written = {e.field: e.new for e in res.plan.config_edits}["quantization_config"]
    assert written["quant_method"] == "modelopt" and written["quant_algo"] == "FP8"


# --------------------------------------------------------------------------- Model Optimizer, Quark layouts

def _modelopt_nvfp4(ct_folder: Path, dest: Path) -> Path:
    """compressed-tensors' NVFP4 codes re-laid as Model Optimizer's quantize_drafter.py writes NVFP4
    (byte for byte its layout: X.weight uint8 packed low nibble first, X.weight_scale E4M3 per 16,
    X.weight_scale_2 fp32 scalar, X.input_scale; quant_method modelopt_fp4, ignore + exclude_modules;
    nvidia-modelopt 0.47.0 torch/quantization/qtensor/nvfp4_tensor.py:338, :345-400 and
    NVIDIA/Model-Optimizer@0bea10e5 examples/speculative_decoding/scripts/quantize_drafter.py)."""
    dest.mkdir()
    sd = _tree_of(ct_folder)
    out = {}
    for k, v in sd.items():
        m, _, leaf = k.rpartition(".")
        if leaf == "weight_packed":
            out[f"{m}.weight"] = v
        elif leaf == "weight_global_scale":
            out[f"{m}.weight_scale_2"] = (1.0 / v.float()).reshape(())
        elif leaf == "input_global_scale":
            out[f"{m}.input_scale"] = (1.0 / v.float()).reshape(())
        else:
            out[k] = v
    save_file(out, str(dest / "model.safetensors"))
    cfg = json.loads((ct_folder / "config.json").read_text())
    cfg["quantization_config"] = {"producer": {"name": "modelopt", "version": "0.48.0"}, "quant_algo": "NVFP4",
                                  "kv_cache_quant_algo": None, "group_size": 16, "quant_method": "modelopt_fp4",
                                  "exclude_modules": ["lm_head", "*embed_tokens*"],
                                  "ignore": ["lm_head", "*embed_tokens*", "*lm_head", "*norm"]}
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def test_modelopt_nvfp4_flat_form(quantized, tmp_path):
    src = _modelopt_nvfp4(quantized["nvfp4"], tmp_path / "mo")
    res = fix_keys(src, out=tmp_path / "vllm", wiring_options=VLLM)
    q = res.plan.quantization
    assert (q.method, q.algo, q.scheme) == ("modelopt", "NVFP4", "nvfp4")
    assert {r.release: r.value for r in q.releases} == {"vllm==0.33.0": "modelopt_fp4"}
    assert _tree_of(tmp_path / "vllm").keys() == _tree_of(src).keys()
    with pytest.raises(InvalidCheckpointError):
        fix_keys(src, out=tmp_path / "sg", wiring_options=SGLANG)
    res = fix_keys(src, out=tmp_path / "deq", wiring_options=SGLANG, dequantize=("fc",))
    assert {r.release: r.value for r in res.plan.quantization.releases} == {"sglang==0.5.23": "modelopt_fp4"}
    sd = _tree_of(src)
    # Model Optimizer's own definition (NVFP4QTensor.dequantize): per_block_scale = scale * double_scale,
    # then e2m1[code] * per_block_scale, element 2j in the low nibble
    e2m1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6])
    packed = sd["fc.weight"]
    codes = torch.empty(packed.shape[0], packed.shape[1] * 2, dtype=torch.long)
    codes[:, 0::2], codes[:, 1::2] = (packed & 0x0F).long(), (packed >> 4).long()
    per_block = sd["fc.weight_scale"].float() * sd["fc.weight_scale_2"]
    want = (e2m1[codes].reshape(packed.shape[0], -1, 16) * per_block.unsqueeze(-1)).reshape(packed.shape[0], -1)
    assert torch.equal(_tree_of(tmp_path / "deq")["fc.weight"], want.to(torch.bfloat16))


SGLANG = WiringOptions(engines=("sglang==0.5.23",))


def test_quark_fp8_layout(tmp_path):
    """AMD Quark's FP8 layout (amd/Kimi-K2.5-Eagle3-FP8: per-tensor weight and input scales, lm_head
    excluded; config keys as vLLM 0.33.0 quark.py:243, :385-442 reads them), from compressed-tensors'
    static FP8 preset's codes and scales."""
    ct_folder = quantize_drafter(FIXTURE, tmp_path / "ct", "FP8")
    dest = tmp_path / "quark"
    dest.mkdir()
    sd = {k: (v.reshape(()) if k.endswith("_scale") else v) for k, v in _tree_of(ct_folder).items()}
    save_file(sd, str(dest / "model.safetensors"))
    cfg = json.loads((ct_folder / "config.json").read_text())
    fp8 = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False}
    cfg["quantization_config"] = {"quant_method": "quark", "global_quant_config": {"weight": fp8, "input_tensors": fp8,
                                                                                   "output_tensors": None},
                                  "layer_quant_config": {}, "exclude": ["lm_head"]}
    (dest / "config.json").write_text(json.dumps(cfg))
    res = fix_keys(dest, out=tmp_path / "out", wiring_options=VLLM)
    q = res.plan.quantization
    assert (q.method, q.scheme) == ("quark", "fp8-tensor") and "fc" in q.static_input
    assert {r.release: r.value for r in q.releases} == {"vllm==0.33.0": "quark"}


def test_static_fp8_input_quantizes_the_linear_input():
    from eagle3conv.model.quant import StaticFP8Input

    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(8, 16, generator=g), torch.randn(3, 16, generator=g) * 3
    scale = 0.01
    wq = StaticFP8Input(w, scale)
    want = torch.nn.functional.linear(((x / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale), w)
    assert torch.equal(torch.nn.functional.linear(x, wq), want)
    assert not torch.equal(want, torch.nn.functional.linear(x, w))
    sliced = wq.to(torch.float32)[:, :8]  # the screen slices fc per slot: the scale goes with it
    assert isinstance(sliced, StaticFP8Input) and sliced.input_scale == scale


def test_card_states_the_precision_and_smoke_and_config_run(quantized, tmp_path):
    """A fixed quantized drafter: the push card's precision section (scheme, each release's serving and
    option, the cost not yet measured), the smoke forward (dequantized) and `config --check` accept it."""
    from eagle3conv.api import configure
    from eagle3conv.hub.card import gather_facts, render_card
    from eagle3conv.verify import smoke

    out = tmp_path / "fixed"
    fix_keys(quantized["fp8"], out=out, wiring_options=VLLM)
    card = render_card(gather_facts(out, "me/smol-fp8"))
    assert "### Precision" in card and "compressed-tensors float-quantized" in card
    assert "| vllm 0.33.0 | as stored | `speculative_config.quantization compressed-tensors` |" in card
    assert "| sglang 0.5.23 | **no**: it builds fc unquantized" in card
    assert "Cost of quantization: not measured" in card
    assert "### Precision" not in render_card(gather_facts(FIXTURE, "me/smol"))
    assert smoke(out).forward_ok
    configure(out, options=VLLM, check=True)
    with pytest.raises(InvalidCheckpointError):  # SGLang 0.5.23 cannot serve its fc: the check says so
        configure(out, options=SGLANG, check=True)


def test_renamed_with_their_weights_from_model_optimizer_names(quantized, tmp_path):
    """Model Optimizer's export naming (layers.0.*): every scale follows its weight to midlayer.*."""
    src = tmp_path / "mo-names"
    src.mkdir()
    sd = {k.replace("midlayer.", "layers.0."): v for k, v in _tree_of(quantized["fp8"]).items()}
    save_file(sd, str(src / "model.safetensors"))
    shutil.copy(quantized["fp8"] / "config.json", src / "config.json")
    res = fix_keys(src, out=tmp_path / "out", wiring_options=VLLM)
    assert res.plan.format.name == "modelopt-export"
    got = _tree_of(tmp_path / "out")
    for k, v in _tree_of(quantized["fp8"]).items():
        assert torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), k
    assert "midlayer.mlp.down_proj.weight_scale" in got and not [k for k in got if k.startswith("layers.0.")]


def test_exclusions_that_leave_a_bf16_module_quantizable_are_an_error(quantized, tmp_path):
    src = _bad(tmp_path, quantized, "fp8", lambda t, c: c["quantization_config"].__setitem__("ignore", []))
    with pytest.raises(InvalidCheckpointError) as e:
        fix_keys(src, out=tmp_path / "out", wiring_options=VLLM)
    assert any(d.startswith("lm_head: held in bf16, but") for d in e.value.details)


def test_fix_keys_text_says_what_each_release_must_be_told(quantized, tmp_path):
    from click.testing import CliRunner

    from eagle3conv.cli import main

    r = CliRunner().invoke(main, ["fix-keys", str(quantized["nvfp4"]), "--out", str(tmp_path / "o"),
                                  "--engine", "vllm==0.33.0", "--engine", "sglang==0.5.23", "--dequantize", "fc"])
    assert r.exit_code == 0, r.output
    assert "quantized: compressed-tensors NVFP4" in r.output
    assert "sglang==0.5.23: serves it as stored; launch with --speculative-draft-model-quantization " \
           "compressed-tensors" in r.output


def test_modelopt_export_nested_config_gets_its_quant_method(quantized, tmp_path):
    """hf_spec_export 0.47.0 writes the nested dict into config.json without quant_method: fix-keys adds it."""
    def edit(t, c):
        for k in [k for k in t if k.endswith("weight_scale")]:
            t[k] = t[k].float().amax().reshape(())  # per-tensor scales, as Model Optimizer FP8 stores them
        c["quantization_config"] = {"producer": {"name": "modelopt", "version": "0.47.0"},
                                    "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None,
                                                     "exclude_modules": ["lm_head"]}}

    src = _bad(tmp_path, quantized, "fp8", edit)
    res = fix_keys(src, out=tmp_path / "out", wiring_options=VLLM)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "modelopt" and "lm_head" in cfg["quantization"]["exclude_modules"]
    assert res.plan.quantization.scheme == "fp8-tensor"


def test_launch_lines_carry_the_draft_quantization(quantized, tmp_path):
    """Issue 29: every line of a quantized drafter carries each release's draft quantization option (the
    builder reads it from the drafter's own config); a release that does not serve it as defined gets none."""
    from eagle3conv.api import launch
    from eagle3conv.spec.launch import build_line

    out = tmp_path / "vllm"
    fix_keys(quantized["fp8"], out=out, wiring_options=VLLM)
    cfg = json.loads((out / "config.json").read_text())
    vl = launch(out, options=VLLM).rows[0]
    assert json.loads(vl.argv[vl.argv.index("--speculative-config") + 1])["quantization"] == "compressed-tensors"
    sg = launch(out, options=SGLANG).rows[0]  # its fc would load as raw codes: no line, the reason
    assert sg.argv is None and any("plain bf16 Linear" in r and "--dequantize fc" in r for r in sg.refused)
    deq = tmp_path / "deq"
    fix_keys(quantized["fp8"], out=deq, wiring_options=SGLANG, dequantize=("fc",))
    sg = launch(deq, options=SGLANG).rows[0]
    assert sg.argv[-2:] == ("--speculative-draft-model-quantization", "compressed-tensors")
    assert "--speculative-draft-model-quantization compressed-tensors" in launch(
        deq, options=SGLANG).rows[0].text
    from eagle3conv.hub.card import gather_facts, render_card

    card = render_card(gather_facts(out, "me/smol-fp8"))
    assert "SGLang: not served (sglang 0.5.23 loads the quantized fc as a plain bf16 Linear" in card
    assert '"quantization": "compressed-tensors"' in card
    # from the config alone too (config / card), and a bf16 drafter is unchanged
    assert build_line("sglang==0.5.23", cfg, drafter="d", target="T").argv[-1] == "compressed-tensors"
    bf16 = json.loads((FIXTURE / "config.json").read_text())
    assert "quantization" not in build_line("sglang==0.5.23", bf16, drafter="d", target="T").text


def test_launch_check_reads_the_drafters_own_quantization(quantized, tmp_path):
    """--check of an SGLang line for a quantized drafter: its hf_quant_config.json counts as its own
    quantization (no false warning), a wrong or inherited value is fixed to the drafter's."""
    from eagle3conv.api import launch

    src = _modelopt_nvfp4(quantized["nvfp4"], tmp_path / "mo")
    deq = tmp_path / "deq"
    fix_keys(src, out=deq, wiring_options=SGLANG, dequantize=("fc",))
    cfg = json.loads((deq / "config.json").read_text())
    qc = cfg.pop("quantization_config")
    (deq / "config.json").write_text(json.dumps(cfg))
    (deq / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": qc["quant_algo"], "group_size": 16,
                                                            "exclude_modules": qc["ignore"]}}))
    base = f"python -m sglang.launch_server --model-path T --speculative-algorithm EAGLE3 --speculative-draft-model-path {deq}"
    c = launch(deq, options=SGLANG, check=base + " --quantization fp8").check
    assert [f.code for f in c.findings] == ["launch-draft-quantization"]
    assert "--speculative-draft-model-quantization modelopt_fp4" in c.corrected
    assert not launch(deq, options=SGLANG, check=base).check.findings  # unset: the draft's own config decides
    c = launch(deq, options=SGLANG, check=base + " --speculative-draft-model-quantization unquant").check
    assert [(f.code, f.level) for f in c.findings] == [("launch-draft-quantization", "error")]
    assert "--speculative-draft-model-quantization modelopt_fp4" in c.corrected


def test_config_reads_a_packed_nvfp4_fc_at_its_logical_width(quantized, tmp_path):
    """Model Optimizer's NVFP4 fc.weight holds two values per byte: config's fc-width check reads
    its in-features as twice the stored columns (3 x hidden), not as half a slot."""
    from eagle3conv.api import configure

    src = _modelopt_nvfp4(quantized["nvfp4"], tmp_path / "mo")
    out = tmp_path / "fixed"
    fix_keys(src, out=out, wiring_options=VLLM)
    hidden = json.loads((out / "config.json").read_text())["hidden_size"]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_slice("fc.weight").get_shape()[1] * 2 == 3 * hidden  # packed
    res = configure(out, options=VLLM, check=True)
    assert res.wiring.report.num_aux == 3


def test_config_launch_lines_read_the_quantized_modules(quantized, tmp_path):
    """config's written launch lines (--json wiring.written.launch) come from the same builder with the
    drafter's tensors: vLLM's carries the draft quantization, SGLang 0.5.23 (raw-code fc) gets none."""
    import subprocess
    import sys

    out = tmp_path / "fixed"
    fix_keys(quantized["fp8"], out=out, wiring_options=VLLM)
    res = subprocess.run([sys.executable, "-m", "eagle3conv", "config", str(out), "--trained-on", "1,14,26",
                          "--captured-at", "output", "--engine", "vllm==0.33.0", "--dry-run", "--json"],
                         capture_output=True, text=True)
    launch = json.loads(res.stdout)["wiring"]["written"]["launch"]
    assert json.loads(launch["vllm"].split(" --speculative-config ")[1].split(" --")[0].strip("'"))[
        "quantization"] == "compressed-tensors"
    assert "sglang" not in launch and "plain bf16 Linear" in launch["sglang_refused"]
