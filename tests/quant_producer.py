"""A quantized drafter made by compressed-tensors' own code (its presets, its qparams calculation,
its compressors, its config writer) from a real trained drafter: the SmolLM2 fixture.

Only the weight statistics (min/max per tensor, row or group) and the activation maxima (for the
static-scale FP8 preset's input_scale) are gathered here, as llm-compressor's observers would; every
scale, code, packing and config field is compressed-tensors' (pinned in requirements-oracle.txt).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

LINEAR = ("fc", "midlayer.self_attn.q_proj", "midlayer.self_attn.k_proj", "midlayer.self_attn.v_proj",
          "midlayer.self_attn.o_proj", "midlayer.mlp.gate_proj", "midlayer.mlp.up_proj", "midlayer.mlp.down_proj",
          "lm_head")


def _tree(tensors: dict) -> torch.nn.Module:
    root = torch.nn.Module()
    for name in LINEAR:
        w = tensors[name + ".weight"].float()
        parent = root
        *path, leaf = name.split(".")
        for part in path:
            if not hasattr(parent, part):
                parent.add_module(part, torch.nn.Module())
            parent = getattr(parent, part)
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        lin.weight.data.copy_(w)
        parent.add_module(leaf, lin)
    return root


def _observe(module, args) -> None:
    """Weight qparams as compressed-tensors computes them from min/max (calculate_qparams)."""
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    w = module.weight.data
    wa = module.quantization_scheme.weights
    strategy = str(wa.strategy.value if hasattr(wa.strategy, "value") else wa.strategy)
    gs = None
    if strategy == "tensor":
        lo, hi = w.min().reshape(1), w.max().reshape(1)
    elif strategy == "channel":
        lo, hi = w.min(dim=1, keepdim=True).values, w.max(dim=1, keepdim=True).values
    elif strategy == "block":
        bo, bi = wa.block_structure
        o, i = w.shape
        pad = torch.nn.functional.pad(w, (0, -i % bi, 0, -o % bo))
        b = pad.reshape(pad.shape[0] // bo, bo, pad.shape[1] // bi, bi)
        lo, hi = b.amin(dim=(1, 3)), b.amax(dim=(1, 3))
    else:  # group / tensor_group
        g = w.reshape(w.shape[0], -1, wa.group_size)
        lo, hi = g.min(dim=-1).values, g.max(dim=-1).values
        if strategy == "tensor_group":
            gs = generate_gparam(w.min(), w.max())
            module.weight_global_scale.data.copy_(gs)
    scale, zp = calculate_qparams(lo, hi, wa, global_scale=gs)
    module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
    if hasattr(module, "weight_zero_point"):
        module.weight_zero_point.data.copy_(zp.reshape(module.weight_zero_point.shape))


def quantize_drafter(src: Path, out: Path, preset: str, *, input_amax: dict[str, float] | None = None,
                     ignore: tuple[str, ...] = ("lm_head",)) -> Path:
    """``src`` (a fixed bf16 drafter) quantized with compressed-tensors' ``preset`` (FP8, NVFP4, W8A8,
    W4A16) into ``out``: its compressed tensors, the rest copied, its quantization_config."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationConfig, QuantizationStatus, apply_quantization_config,
                                                 preset_name_to_scheme)

    tensors = load_file(str(src / "model.safetensors"))
    model = _tree(tensors)
    scheme = preset_name_to_scheme(preset, ["Linear"]) if isinstance(preset, str) else preset
    config = QuantizationConfig(config_groups={"group_0": scheme}, ignore=list(ignore),
                                quantization_status=QuantizationStatus.FROZEN)
    apply_quantization_config(model, config)
    for name, module in model.named_modules():
        if getattr(module, "quantization_scheme", None) is None:
            continue
        _observe(module, None)
        if hasattr(module, "input_scale") and scheme.input_activations is not None \
                and not scheme.input_activations.dynamic:
            from compressed_tensors.quantization.utils import calculate_qparams

            amax = torch.tensor([float((input_amax or {}).get(name, 1.0))])
            s, _ = calculate_qparams(-amax, amax, scheme.input_activations)
            module.input_scale.data.copy_(s.reshape(module.input_scale.shape))
        if hasattr(module, "input_global_scale"):
            from compressed_tensors.quantization.utils import generate_gparam

            amax = torch.tensor(float((input_amax or {}).get(name, 1.0)))
            module.input_global_scale.data.copy_(generate_gparam(-amax, amax))
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    for k, v in tensors.items():
        if k.rsplit(".", 1)[0] not in LINEAR or k.rsplit(".", 1)[0] in ignore:
            sd[k] = v
    for name in ignore:  # kept in bf16, as the source
        sd[name + ".weight"] = tensors[name + ".weight"]
    save_file(sd, str(out / "model.safetensors"))
    shutil.copy(src / "config.json", out / "config.json")
    compressor.update_config(str(out))
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


class _Amax(torch.Tensor):
    """A weight that records the largest |input| its F.linear sees (an activation observer)."""

    @staticmethod
    def __new__(cls, data, name, store):
        t = torch.Tensor._make_subclass(cls, data, False)
        t.module, t.store = name, store
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tagged = [a for a in args if isinstance(a, _Amax)]
        if func is torch.nn.functional.linear and isinstance(args[1], _Amax):
            w = args[1]
            with torch._C.DisableTorchFunctionSubclass():
                amax = float(args[0].abs().max())
                w.store[w.module] = max(w.store.get(w.module, 0.0), amax)
                return func(args[0], w.as_subclass(torch.Tensor), *args[2:], **kwargs)
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if tagged and isinstance(out, torch.Tensor) and out.ndim == 2 and func.__name__ in ("to", "__getitem__",
                                                                                           "contiguous"):
            return _Amax(out, tagged[0].module, tagged[0].store)
        return out


def input_amax(drafter: Path, states: Path, *, max_sequences: int = 20) -> dict[str, float]:
    """Per linear module, the largest |input| the drafter's forward (every draft step) sees on captured
    states: the calibration llm-compressor's static activation observers make, for the FP8 preset's
    input_scale."""
    from eagle3conv.spec.layers import LayerRef
    from eagle3conv.states.readers import open_states
    from eagle3conv.verify.evaluate import Candidate, evaluate
    from eagle3conv.verify.inputs import build_drafter, load_drafter_weights

    config, tensors = load_drafter_weights(drafter)
    store: dict[str, float] = {}
    tensors = {k: (_Amax(v.float(), k.removesuffix(".weight"), store) if k.removesuffix(".weight") in LINEAR else v)
               for k, v in tensors.items()}
    runner, embeds = build_drafter(config, tensors, "cpu", torch.float32)
    st = open_states(states)
    layers = tuple(LayerRef(int(i)) for i in config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    evaluate(runner, st, Candidate("calibration", layers, "input_scale calibration"), steps=3, batch_size=4,
             target_embeds=embeds, max_sequences=max_sequences, feeder=False)
    return store
