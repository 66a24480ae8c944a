"""One drafter contract: the strict loaders accept exactly what fix-keys writes.

Driven by mappings/canonical.json: for every architecture (llama, mla) and every optional or
variant row of its table (a row that is not plainly required: fc.bias, fc_norm.*, q/k/v biases,
embed_tokens, d2t, t2d, MLA's q_lora_rank rows and its direct q_proj), a pico checkpoint
holding that tensor is written as real safetensors in SGLang's names, put through
``eagle3conv fix-keys``, and the output is loaded with :func:`eagle3conv.model.build_drafter`
(the strict loader verify and push's gate use). It must load; one extra tensor and one missing
tensor must each be refused.

Then attention biases end to end (fix-keys -> verify -> push --dry-run through the CLI), and
the biased forward against an independent computation.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from eagle3conv.cli import main
from eagle3conv.errors import InvalidCheckpointError
from eagle3conv.example import Dims, llama_config
from eagle3conv.io.data import data_path
from eagle3conv.model import build_drafter
from eagle3conv.spec.canonical import expected, load_canonical
from eagle3conv.spec.drafter import SWITCH_FIELDS, DrafterSpec

PICO = Dims(hidden=32, target_hidden=32, heads=4, kv_heads=2, head_dim=8, intermediate=64, vocab=512,
            draft_vocab=128, aux_ids=(1, 14, 26))


def mla_config(**overrides) -> dict:
    config = {
        "architectures": ["Eagle3DeepseekV2ForCausalLM"],
        "model_type": "kimi_k2",
        "hidden_size": 32,
        "num_attention_heads": 4,
        "q_lora_rank": 24,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
        "intermediate_size": 64,
        "vocab_size": 512,
        "draft_vocab_size": 128,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 26]},
    }
    config.update(overrides)
    return config


def base_config(arch: str) -> dict:
    return llama_config(PICO) if arch == "llama" else mla_config()


def variant_rows() -> list[tuple[str, str]]:
    """(architecture, row name) for every row that is optional, gated (`when`) or conditionally
    required (`required_if`)."""
    raw = json.loads(data_path("canonical.json").read_text())
    out = []
    for arch, table in raw["architectures"].items():
        for row in table["tensors"]:
            if not row["required"] or row.get("when") or row.get("required_if"):
                out.append((arch, row["name"]))
    return out


def row_of(arch: str, name: str):
    table = load_canonical()[arch]
    return next(t for t in table.tensors + table.templated if t.name == name)


def matches(row_name: str, name: str) -> bool:
    pattern = re.escape(row_name).replace(re.escape("{slot}"), "[0-9]+").replace(re.escape("{layer}"), "[1-9][0-9]*")
    return re.fullmatch(pattern, name) is not None


def case(arch: str, name: str) -> tuple[dict, dict, DrafterSpec]:
    """(config as written, config the row needs, the spec the tensors follow) for one variant row.

    A row gated on a config switch gets its tensor but NOT the switch: fix-keys must set it from
    the weights (a Qwen3 drafter's q/k norms: its architecture name). A row of a later decoder layer
    ({layer}) gets a second layer's tensors but a config saying one layer: fix-keys must count them.
    A row gated on a symbol (MLA's QL) gets a config where the symbol fits."""
    written = base_config(arch)
    row = row_of(arch, name)
    needed = dict(written)
    if row.when in SWITCH_FIELDS:
        needed[SWITCH_FIELDS[row.when]] = True
    elif row.when == "qk_norm":
        needed["architectures"] = ["Eagle3Qwen3ForCausalLM"]
    elif row.when == "o_bias":  # o_proj's bias: built by the engines when bias (or attention_bias) is set
        written["bias"] = needed["bias"] = True
    elif row.when == "!QL":
        written["q_lora_rank"] = needed["q_lora_rank"] = None
    if "{layer}" in name:
        needed["num_hidden_layers"] = 2
    spec = DrafterSpec.from_config(needed)
    return written, needed, spec


def tensors_for(spec: DrafterSpec, extra_row: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor the spec requires plus those of ``extra_row``, real values (valid vocab maps)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, e in expected(spec).items():
        later_norm = re.fullmatch(r"layers\.[0-9]+\.(input_layernorm|hidden_norm)\.weight", name) is not None
        if not (e.required or later_norm or matches(extra_row, name)):
            continue
        shape = tuple(int(d) for d in e.shape)
        if name == "d2t":
            out[name] = torch.zeros(shape, dtype=torch.int64)  # draft id i -> target id i
        elif name == "t2d":
            t2d = torch.zeros(shape, dtype=torch.bool)
            t2d[: spec.Vd] = True
            out[name] = t2d
        elif name.endswith("norm.weight") or re.search(r"norm\.[0-9]+\.weight$", name):
            out[name] = (1 + 0.1 * torch.randn(shape, generator=g)).to(torch.bfloat16)
        else:
            out[name] = (0.05 * torch.randn(shape, generator=g)).to(torch.bfloat16)
    return out


def fix_keys(src: Path, out: Path, *flags: str) -> None:
    res = CliRunner().invoke(main, ["fix-keys", str(src), "--out", str(out), *flags])
    assert res.exit_code == 0, f"fix-keys exit {res.exit_code}\n{res.stdout}\n{res.stderr}"


def write(folder: Path, config: dict, tensors: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    return folder


def load(folder: Path, state: dict | None = None):
    config = json.loads((folder / "config.json").read_text())
    state = load_file(str(folder / "model.safetensors")) if state is None else state
    embed = torch.randn(config["vocab_size"], config["hidden_size"]) * 0.02
    return build_drafter(config, state, dtype=torch.float32, embed_tokens=embed)


def all_table_names(spec: DrafterSpec) -> list[str]:
    """Every tensor name either architecture's table can produce at this spec's k, sorted."""
    names = set()
    for arch in load_canonical().values():
        names |= set(arch.expand({"k": spec.k}, {"fc_bias": True, "fc_norm": True, "attention_bias": True}))
        for t in arch.tensors:
            names.add(t.name)
    return sorted(names)


@pytest.mark.parametrize("arch,name", variant_rows(), ids=lambda v: v)
def test_loader_accepts_exactly_what_fix_keys_writes(tmp_path, arch, name):
    written, needed, spec = case(arch, name)
    src = write(tmp_path / "src", written, tensors_for(spec, name))
    out = tmp_path / "out"
    if row_of(arch, name).when == "!QL":
        # MLA with a direct q_proj (no q_lora_rank): only vLLM builds it; SGLang's Eagle3 MLA layer
        # refuses a null q_lora_rank (docs/facts.md §3), so fix-keys, which writes what SGLang loads,
        # refuses it by name and writes nothing -- while the forward itself still runs it strictly.
        res = CliRunner().invoke(main, ["fix-keys", str(src), "--out", str(out)])
        assert res.exit_code == 3 and "q_lora_rank" in res.output + (res.stderr or ""), res.output
        assert not out.exists()
        if "{layer}" in name:
            (src / "config.json").write_text(json.dumps(needed))
        load(src)
        return
    fix_keys(src, out, *(["--keep-embed"] if name == "embed_tokens.weight" else []))
    config = json.loads((out / "config.json").read_text())
    state = load_file(str(out / "model.safetensors"))
    assert any(matches(name, k) for k in state), f"fix-keys dropped {name}"
    row = row_of(arch, name)
    if row.when in SWITCH_FIELDS:  # fix-keys wrote the switch the tensor needs
        assert config[SWITCH_FIELDS[row.when]] is True
    if row.when == "qk_norm":
        assert config["architectures"] == ["Eagle3Qwen3ForCausalLM"]
    if "{layer}" in name:
        assert config["num_hidden_layers"] == 2
    out_spec = DrafterSpec.from_config(config)
    table = expected(out_spec.with_(k=out_spec.k or 3))
    assert set(state) <= set(table) and {n for n, e in table.items() if e.required} <= set(state)

    load(out)  # the strict loader takes fix-keys' output as it is

    extra = next(n for n in all_table_names(out_spec) if n not in table)
    shape = (4,)
    with pytest.raises(InvalidCheckpointError, match=re.escape(f"unexpected: {extra}")):
        load(out, {**state, extra: torch.zeros(shape)})
    # missing: the row's own tensor where the contract requires it, else fc.weight
    own = sorted(n for n in state if matches(name, n) and table[n].required)
    gone = own[0] if own else "fc.weight"
    with pytest.raises(InvalidCheckpointError, match=re.escape(f"missing: {gone}")):
        load(out, {k: v for k, v in state.items() if k != gone})


@pytest.mark.parametrize("arch", ["llama", "mla"])
def test_minimal_drafter_round_trips(tmp_path, arch):
    """Only the plainly required tensors, Vd == V: no d2t, t2d or embedding; loads after fix-keys."""
    config = {**base_config(arch), "draft_vocab_size": None}
    config.pop("draft_vocab_size")
    spec = DrafterSpec.from_config(config)
    tensors = {k: v for k, v in tensors_for(spec, "").items() if k != "d2t"}
    src = write(tmp_path / "src", config, tensors)
    fix_keys(src, tmp_path / "out")
    load(tmp_path / "out")


def test_bias_without_the_switch_is_named(tmp_path):
    """Half a set of biases (q only) with attention_bias turned on by fix-keys: k/v biases are
    missing, and fix-keys says so before writing anything."""
    config = llama_config(PICO)
    spec = DrafterSpec.from_config({**config, "attention_bias": True})
    tensors = tensors_for(spec, "midlayer.self_attn.q_proj.bias")
    for p in "kv":
        tensors.pop(f"midlayer.self_attn.{p}_proj.bias")
    src = write(tmp_path / "src", config, tensors)
    res = CliRunner().invoke(main, ["fix-keys", str(src), "--out", str(tmp_path / "out")])
    assert res.exit_code == 3
    assert "midlayer.self_attn.k_proj.bias: required but missing" in res.output
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- attention biases end to end


def biased_checkpoint(folder: Path, *, switch: bool) -> Path:
    """A pico Llama drafter with q/k/v biases; ``switch``: config says attention_bias: true."""
    config = llama_config(PICO)
    spec = DrafterSpec.from_config({**config, "attention_bias": True})
    tensors = tensors_for(spec, "midlayer.self_attn.q_proj.bias", seed=1)
    if switch:
        config["attention_bias"] = True
    return write(folder, config, tensors)


def pico_states(path: Path, seed: int = 0) -> Path:
    """Real states for the pico drafter (T = 32, a 30-layer target, outputs 1, 14, 26 and the
    embedding output), random values: verify runs on them and reports an acceptance."""
    from eagle3conv.states.format import write_states

    g = torch.Generator().manual_seed(seed)
    b, s = 3, 12
    ids = torch.randint(0, PICO.vocab, (b, s), generator=g)
    hidden = {i: torch.randn(b, s, PICO.target_hidden, generator=g) for i in (-1, 1, 14, 26)}
    return write_states(path, input_ids=ids, attention_mask=torch.ones(b, s, dtype=torch.long),
                        target_next=torch.randint(0, PICO.vocab, (b, s), generator=g), hidden=hidden,
                        num_layers=30, vocab_size=PICO.vocab, target="example/pico-target", dtype="fp32")


def cli(*args, ok: int = 0):
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exit_code == ok, f"exit {res.exit_code}\n{res.stdout}\n{res.stderr}\n{res.exception!r}"
    return res


@pytest.mark.parametrize("switch", [True, False], ids=["attention_bias-set", "attention_bias-unset"])
def test_attention_biases_fix_keys_verify_push(tmp_path, switch):
    """The user's bug: fix-keys exited 0 on a drafter with q/k/v biases, then verify refused it
    (exit 3, "unexpected: midlayer.self_attn.q_proj.bias") and push's gate failed."""
    src = biased_checkpoint(tmp_path / "src", switch=switch)
    out = tmp_path / "fixed"
    cli("fix-keys", src, "--out", out)
    config = json.loads((out / "config.json").read_text())
    assert config["attention_bias"] is True
    assert {f"midlayer.self_attn.{p}_proj.bias" for p in "qkv"} <= set(load_file(str(out / "model.safetensors")))
    states = pico_states(tmp_path / "states.safetensors")
    report = json.loads(cli("verify", out, "--states", states, "--steps", "2", "--no-save", "--json").stdout)
    assert report["passed"] is True and report["steps"] == 2 and report["wiring"] == "outputs of layers 1, 14, 26"
    smoke = json.loads(cli("verify", out, "--json").stdout)
    assert smoke["ok"] is True
    res = cli("push", out, "--repo-id", "someone/pico-biased", "--dry-run")
    assert "dry run: nothing sent" in res.stdout
    assert "check smoke-test: ok" in res.stdout and "check canonical: ok" in res.stdout


def reference_step1(config: dict, sd: dict, aux: torch.Tensor, ids: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
    """Step-1 logits with transformers' LlamaAttention (attention_bias=True) as the attention,
    built with hidden_size 2H so q/k/v read cat(embed, hidden) as the drafter's do, its o_proj
    replaced by the drafter's [H, NH*HD] one; transformers' RMSNorm, MLP and rotary embedding."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (LlamaAttention, LlamaMLP, LlamaRMSNorm,
                                                          LlamaRotaryEmbedding)

    h, eps = config["hidden_size"], config["rms_norm_eps"]
    wide = LlamaConfig(hidden_size=2 * h, num_attention_heads=config["num_attention_heads"],
                       num_key_value_heads=config["num_key_value_heads"], head_dim=config["head_dim"],
                       attention_bias=True, rope_theta=config["rope_theta"],
                       max_position_embeddings=config["max_position_embeddings"])
    wide._attn_implementation = "sdpa"
    attn = LlamaAttention(wide, layer_idx=0)
    p = "midlayer.self_attn."
    attn.o_proj = torch.nn.Linear(config["num_attention_heads"] * config["head_dim"], h,
                                  bias=f"{p}o_proj.bias" in sd)
    with torch.no_grad():
        for n in "qkv":
            getattr(attn, f"{n}_proj").weight.copy_(sd[f"{p}{n}_proj.weight"])
            getattr(attn, f"{n}_proj").bias.copy_(sd[f"{p}{n}_proj.bias"])
        attn.o_proj.weight.copy_(sd[f"{p}o_proj.weight"])
        if f"{p}o_proj.bias" in sd:  # both engines build o_proj with a bias under attention_bias
            attn.o_proj.bias.copy_(sd[f"{p}o_proj.bias"])
    mlp = LlamaMLP(LlamaConfig(hidden_size=h, intermediate_size=config["intermediate_size"], hidden_act="silu"))
    with torch.no_grad():
        for n in ("gate", "up", "down"):
            getattr(mlp, f"{n}_proj").weight.copy_(sd[f"midlayer.mlp.{n}_proj.weight"])

    def norm(key: str) -> LlamaRMSNorm:
        m = LlamaRMSNorm(h, eps=eps)
        with torch.no_grad():
            m.weight.copy_(sd[key])
        return m

    with torch.no_grad():
        g = aux @ sd["fc.weight"].T
        x = torch.cat((norm("midlayer.input_layernorm.weight")(embed[ids]),
                       norm("midlayer.hidden_norm.weight")(g)), dim=-1)
        positions = torch.arange(ids.shape[1])[None]
        cos_sin = LlamaRotaryEmbedding(wide)(x, positions)
        out, _ = attn(x, position_embeddings=cos_sin, attention_mask=None)
        hs = g + out
        hs = hs + mlp(norm("midlayer.post_attention_layernorm.weight")(hs))
        return norm("norm.weight")(hs) @ sd["lm_head.weight"].T


def test_biased_forward_matches_transformers_attention():
    config = {**llama_config(PICO), "attention_bias": True}
    spec = DrafterSpec.from_config(config)
    sd = {k: v.float() if v.is_floating_point() else v
          for k, v in tensors_for(spec, "midlayer.self_attn.q_proj.bias", seed=2).items()}
    g = torch.Generator().manual_seed(3)
    for n in "qkv":  # biases large enough to move the logits
        sd[f"midlayer.self_attn.{n}_proj.bias"] = torch.randn(sd[f"midlayer.self_attn.{n}_proj.bias"].shape, generator=g)
    embed = torch.randn(PICO.vocab, PICO.hidden, generator=g) * 0.5
    aux = torch.randn(2, 9, 3 * PICO.target_hidden, generator=g)
    ids = torch.randint(0, PICO.vocab, (2, 9), generator=g)
    drafter = build_drafter(config, sd, dtype=torch.float32, embed_tokens=embed)
    got = drafter.forward(aux, ids).logits
    want = reference_step1(config, sd, aux, ids, embed)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the biases are used: without them the logits move well beyond the tolerance
    unbiased = {k: (torch.zeros_like(v) if k.endswith("_proj.bias") else v) for k, v in sd.items()}
    moved = (build_drafter(config, unbiased, dtype=torch.float32, embed_tokens=embed).forward(aux, ids).logits - got)
    assert moved.abs().max() > 1e-2


def test_attention_bias_declared_but_absent_is_refused(tmp_path):
    """attention_bias: true and no biases: SGLang would serve uninitialised biases; fix-keys
    names all three and writes nothing."""
    config = {**llama_config(PICO), "attention_bias": True}
    spec = DrafterSpec.from_config(llama_config(PICO))
    src = write(tmp_path / "src", config, tensors_for(spec, ""))
    res = cli("fix-keys", src, "--out", tmp_path / "out", "--json", ok=3)
    errors = json.loads(res.stdout)["details"]
    for p in "qkv":
        assert any(e.startswith(f"midlayer.self_attn.{p}_proj.bias: required but missing") for e in errors), errors
    assert not (tmp_path / "out").exists()


def test_biases_kept_and_each_release_says_whether_it_serves_them(tmp_path):
    """SGLang builds q/k/v without bias whatever attention_bias says; vLLM builds them with it
    (the engine rules, docs/facts.md §11): SGLang's rows warn that it serves the drafter without them."""
    src = biased_checkpoint(tmp_path / "src", switch=True)
    d = json.loads(cli("inspect", src, "--json").stdout)
    rows = {r["engine"]: r for r in d["plan"]["wiring"]["engines"]}
    sglang = [r for spec, r in rows.items() if spec.startswith("sglang")]
    assert sglang and all(r["serve"]["code"] == "served-without" and "attention_bias" in r["serve"]["message"]
                          for r in sglang)
    assert rows[next(s for s in rows if s.startswith("vllm"))]["serve"] is None


def test_spec_reads_a_config_once():
    """DrafterSpec: dims, architecture (by name or by MLA tensor names), aux ids in both places."""
    config = {**llama_config(PICO), "eagle_aux_hidden_state_layer_ids": [2, 15, 27], "attention_bias": True,
              "bias": True, "use_aux_norm": True}
    spec = DrafterSpec.from_config(config)
    assert (spec.architecture, spec.H, spec.T, spec.k, spec.NH, spec.NKV, spec.HD, spec.I, spec.V, spec.Vd) == (
        "llama", 32, 32, 3, 4, 2, 8, 64, 512, 128)
    assert spec.aux.nested == [1, 14, 26] and spec.aux.top_level == [2, 15, 27] and spec.aux.ids == [1, 14, 26]
    assert spec.aux.fields() == {"eagle_config.eagle_aux_hidden_state_layer_ids": [1, 14, 26],
                                 "eagle_aux_hidden_state_layer_ids": [2, 15, 27]}
    assert (spec.on("attention_bias"), spec.on("fc_bias"), spec.on("fc_norm")) == (True, True, True)
    assert DrafterSpec.from_config(mla_config()).architecture == "mla"
    assert DrafterSpec.from_config(mla_config(architectures=["Eagle3DeepseekV3ForCausalLM"])).architecture == "mla"
    keys = ["midlayer.self_attn.kv_a_proj_with_mqa.weight"]
    assert DrafterSpec.from_config(llama_config(PICO), keys).architecture == "mla"
    mla = DrafterSpec.from_config(mla_config())
    assert mla.symbols()["QK"] == 12 and mla.symbols()["NV"] == 16
    with pytest.raises(InvalidCheckpointError, match="hidden_size"):
        DrafterSpec.from_config({**config, "hidden_size": -1})
    # k and T from fc's width when the config leaves them out
    bare = DrafterSpec.from_config({k: v for k, v in llama_config(PICO).items() if k != "eagle_config"})
    assert (bare.k, bare.inferred_from_fc(96).k, bare.inferred_from_fc(96).T) == (None, 3, 32)


def test_o_proj_bias_written_as_zeros_when_the_engines_would_build_one(tmp_path):
    """bias: true (fc has a bias) makes SGLang and vLLM build o_proj with a bias too; a drafter without one
    would be served uninitialised memory. fix-keys writes zeros (what it was trained with), says so, and
    the strict loader then gives the same logits as the drafter without the bias."""
    config = {**llama_config(PICO), "bias": True}
    spec = DrafterSpec.from_config(config)
    tensors = {k: v for k, v in tensors_for(spec, "fc.bias").items() if k != "midlayer.self_attn.o_proj.bias"}
    src = write(tmp_path / "src", config, tensors)
    res = cli("fix-keys", src, "--out", tmp_path / "out", "--json")
    d = json.loads(res.stdout)
    (f,) = [x for x in d["plan"]["findings"] if x["code"] == "o-bias-zeros"]
    assert f["subject"] == "midlayer.self_attn.o_proj.bias"
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert out["midlayer.self_attn.o_proj.bias"].dtype == torch.bfloat16
    assert torch.equal(out["midlayer.self_attn.o_proj.bias"], torch.zeros(PICO.hidden, dtype=torch.bfloat16))
    load(tmp_path / "out")
