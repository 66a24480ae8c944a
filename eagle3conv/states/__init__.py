"""Captured target states: eagle3conv's ``states.safetensors`` (format), readers for
vLLM hidden-states files (vllm), NeMo Automodel caches (nemo), SpecForge features and
patched-server aux dumps (readers), capturing from a transformers
target (capture, target_model). See each module's docstring for the layouts.

Imports here are lazy so that ``import eagle3conv.states`` stays cheap.
"""

_EXPORTS = {
    "StatesFile": "format", "StatesWriter": "format", "write_states": "format",
    "CapturedStates": "format", "StatesBatch": "format", "STATES_FORMAT": "format",
    "STATES_VERSION": "format", "STATES_FILE": "format",
    "open_states": "readers", "detect_states": "readers", "DumpStates": "readers",
    "SpecForgeStates": "readers", "VllmStates": "vllm", "NemoStates": "nemo",
    "capture_states": "capture", "read_prompts": "capture", "Prompt": "capture",
    "CaptureResult": "capture",
    "load_target_model": "target_model", "LoadedTarget": "target_model",
    "smollm2_gguf_path": "target_model", "CAPTURE_TARGETS": "target_model",
}


def __getattr__(name):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(name)
    import importlib

    return getattr(importlib.import_module(f"eagle3conv.states.{mod}"), name)


__all__ = sorted(_EXPORTS)
