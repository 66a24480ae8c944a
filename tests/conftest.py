"""Shared fixtures: pico drafter checkpoints in every trainer's naming, and the
one post-condition every conversion test reuses (:func:`assert_sglang_checkpoint`).

Everything is real files in ``tmp_path``: safetensors written with
``safetensors.torch.save_file``, pickles with ``torch.save``. Nothing is mocked.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

# Every test, and every process a test starts, signs in-place journals with a key of this run's own
# (io/journalkey.py) and may use the test hooks (io/testhooks.py), which an installed eagle3conv
# ignores unless EAGLE3CONV_TEST_HOOKS=1.
os.environ["EAGLE3CONV_STATE_DIR"] = tempfile.mkdtemp(prefix="eagle3conv-test-state-")
os.environ["EAGLE3CONV_TEST_HOOKS"] = "1"

from eagle3conv.example import Dims, canonical_tensors, write_example  # noqa: E402

# The pico drafter: hidden 32, 4 heads of 8 (2 kv heads), a 1024-token target
# vocab pruned to 320 (canonical_tensors needs draft_vocab >= 256: it always
# keeps the first 256 ids), aux layers (1, 14, 26) -> fc in = 3*32.
PICO = Dims(
    hidden=32,
    target_hidden=32,
    heads=4,
    kv_heads=2,
    head_dim=8,
    intermediate=64,
    vocab=1024,
    draft_vocab=320,
    aux_ids=(1, 14, 26),
)

# What every converted Llama-style drafter holds (embed_tokens only with --keep-embed).
SGLANG_KEYS = frozenset({
    "d2t",
    "fc.weight",
    "lm_head.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.mlp.down_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "norm.weight",
    "t2d",
})

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


@pytest.fixture
def dims() -> Dims:
    return PICO


@pytest.fixture
def make_ckpt(tmp_path):
    """``make_ckpt(fmt, name=None, **dims_overrides)`` -> a fresh checkpoint folder in tmp_path.

    For ``eagle`` (no config.json, as the original EAGLE code writes it) the
    config lies beside the folder: see :func:`eagle_config_path`.
    """
    counter = {"n": 0}

    def make(fmt: str, name: str | None = None, **overrides) -> Path:
        counter["n"] += 1
        d = dataclasses.replace(PICO, **overrides)
        dest = tmp_path / (name or f"{fmt}-{counter['n']}")
        return write_example(dest, fmt, d)

    return make


def eagle_config_path(ckpt: Path) -> Path:
    """Where write_example puts the draft config of an ``eagle`` example."""
    return ckpt.parent / f"{ckpt.name}.config.json"


# --- reading a written checkpoint -------------------------------------------------------


def weight_files(folder: Path) -> list[Path]:
    return sorted(
        p for p in Path(folder).iterdir()
        if p.is_file() and p.suffix in WEIGHT_SUFFIXES and p.name != "training_state.pt"
    )


def load_sglang_tensors(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """All tensors of a safetensors checkpoint (sharded or not), read with safetensors itself.

    Returns (tensors, dtype names as the safetensors header spells them).
    """
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        shards = sorted(set(data["weight_map"].values()))
        total = 0
    else:
        data, shards = None, ["model.safetensors"]
    tensors: dict[str, torch.Tensor] = {}
    dtypes: dict[str, str] = {}
    for shard in shards:
        path = folder / shard
        raw = path.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + n])
        assert header.get("__metadata__", {}).get("format") == "pt", f"{shard}: no format=pt metadata"
        with safe_open(str(path), framework="pt") as f:
            for k in f.keys():
                assert k not in tensors, f"{k} in two shards"
                tensors[k] = f.get_tensor(k)
                dtypes[k] = header[k]["dtype"]
                if data is not None:
                    assert data["weight_map"][k] == shard, f"index puts {k} in the wrong shard"
                    total += tensors[k].numel() * tensors[k].element_size()
    if data is not None:
        assert set(data["weight_map"]) == set(tensors), "index weight_map != shard contents"
        assert data["metadata"]["total_size"] == total
    return tensors, dtypes


@lru_cache(maxsize=1)
def _llama_config_cls():
    from transformers import LlamaConfig

    return LlamaConfig


def assert_sglang_checkpoint(path, dims: Dims = PICO, *, keep_embed: bool = False, dtype: torch.dtype = torch.bfloat16,
                             expect_aux: dict | None = None) -> dict:
    """The post-condition of every conversion: exactly what SGLang's LlamaForCausalLMEagle3 loads.

    - the key set is the golden SGLang set (plus embed_tokens with ``keep_embed``;
      t2d may be absent when the head is not pruned);
    - no other weight file is left in the folder;
    - dtypes: weights ``dtype`` (bf16 unless cast), d2t I64, t2d BOOL;
    - shapes are the ones ``dims`` implies;
    - every tensor equals ``canonical_tensors(dims)`` by value;
    - config.json parses as a transformers LlamaConfig with the fields engines read.

    Returns the written config.
    """
    path = Path(path)
    tensors, st_dtypes = load_sglang_tensors(path)
    keep_embed = keep_embed or dims.target_hidden != dims.hidden  # SGLang then embeds with the drafter's own
    want = set(SGLANG_KEYS) | ({"embed_tokens.weight"} if keep_embed else set())
    if dims.draft_vocab == dims.vocab and "t2d" not in tensors:
        want.discard("t2d")  # optional for a full-vocab head: engines ignore it, nothing to rebuild
    assert set(tensors) == want, f"extra {sorted(set(tensors) - want)}, missing {sorted(want - set(tensors))}"
    has_index = (path / "model.safetensors.index.json").is_file()
    files = weight_files(path)
    assert all(p.suffix == ".safetensors" for p in files), f"stray weight files: {files}"
    if not has_index:
        assert [p.name for p in files] == ["model.safetensors"]

    ref = canonical_tensors(dims)
    H, T, k = dims.hidden, dims.target_hidden, len(dims.aux_ids)
    shapes = {
        "fc.weight": (H, k * T),
        "midlayer.self_attn.q_proj.weight": (dims.heads * dims.head_dim, 2 * H),
        "midlayer.self_attn.k_proj.weight": (dims.kv_heads * dims.head_dim, 2 * H),
        "midlayer.self_attn.v_proj.weight": (dims.kv_heads * dims.head_dim, 2 * H),
        "midlayer.self_attn.o_proj.weight": (H, dims.heads * dims.head_dim),
        "midlayer.mlp.gate_proj.weight": (dims.intermediate, H),
        "midlayer.mlp.up_proj.weight": (dims.intermediate, H),
        "midlayer.mlp.down_proj.weight": (H, dims.intermediate),
        "midlayer.input_layernorm.weight": (H,),
        "midlayer.hidden_norm.weight": (H,),
        "midlayer.post_attention_layernorm.weight": (H,),
        "norm.weight": (H,),
        "lm_head.weight": (dims.draft_vocab, H),
        "embed_tokens.weight": (dims.vocab, H),
        "d2t": (dims.draft_vocab,),
        "t2d": (dims.vocab,),
    }
    for name, t in tensors.items():
        assert tuple(t.shape) == shapes[name], f"{name}: shape {tuple(t.shape)} != {shapes[name]}"
        if name == "d2t":
            assert t.dtype == torch.int64 and st_dtypes[name] == "I64"
        elif name == "t2d":
            assert t.dtype == torch.bool and st_dtypes[name] == "BOOL"
        else:
            assert t.dtype == dtype, f"{name}: {t.dtype} != {dtype}"
        expected = ref[name].to(t.dtype)
        assert torch.equal(t, expected), f"{name}: values differ from the canonical drafter"
    # the vocab maps follow the engine contract: target = draft + d2t[draft]
    tids = torch.arange(dims.draft_vocab) + tensors["d2t"]
    if "t2d" in tensors:
        assert torch.equal(tensors["t2d"].nonzero().flatten(), tids)

    cfg_path = path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == dims.draft_vocab
    assert cfg["vocab_size"] == dims.vocab
    assert cfg["hidden_size"] == H
    assert not cfg.get("tie_word_embeddings", False)
    if T != H:
        assert cfg["target_hidden_size"] == T
    if expect_aux is not None:
        from eagle3conv.checkpoint.config import aux_ids_in

        assert aux_ids_in(cfg) == expect_aux
    hf = _llama_config_cls().from_pretrained(str(path))
    assert hf.architectures == ["LlamaForCausalLMEagle3"]
    assert hf.num_hidden_layers == 1
    assert hf.draft_vocab_size == dims.draft_vocab
    assert hf.hidden_size == H and hf.num_attention_heads == dims.heads
    assert hf.num_key_value_heads == dims.kv_heads and hf.head_dim == dims.head_dim
    return cfg


# --- byte-level snapshots (dry runs, idempotence) ----------------------------------------


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder`` (hidden ones included): bytes and mtime_ns."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for f in files:
            p = Path(root) / f
            st = p.lstat()
            out[str(p.relative_to(folder))] = (p.read_bytes() if not p.is_symlink() else os.readlink(p).encode(), st.st_mtime_ns)
        for d in dirs:
            out[str((Path(root) / d).relative_to(folder)) + "/"] = (b"", 0)
    return out


def save_st(tensors: dict, path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def load_st(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


# a tiny drafter (hidden 64, vocab 512) and a states file of random data for it: the read-ahead and
# hostile-input tests' shared fixture
TINY = Dims(hidden=64, target_hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512,
            draft_vocab=300, aux_ids=(1, 3, 4))


@pytest.fixture(scope="module")
def drafter_and_states(tmp_path_factory):
    from eagle3conv.states.format import write_states

    root = tmp_path_factory.mktemp("tiny")
    drafter = write_example(root / "drafter", "sglang", TINY)
    g = torch.Generator().manual_seed(0)
    B, S = 3, 40
    states = root / "states.safetensors"
    write_states(states, input_ids=torch.randint(0, 512, (B, S), generator=g),
                 attention_mask=torch.ones(B, S, dtype=torch.bool),
                 target_next=torch.randint(0, 512, (B, S), generator=g),
                 hidden={o: torch.randn(B, S, 64, generator=g) for o in (-1, 1, 3, 4)}, num_layers=6,
                 vocab_size=512, target="tiny")
    return drafter, states
