"""verify on the drafters of 2026, each engine release emulated as it serves them (issue 22).

The tiny real target of tests/test_verify.py (a random 6-layer Llama, states captured by
eagle3conv's own capture). Each drafter here is the pico example extended with real tensors
(a second decoder layer, input_norm, Qwen3 q/k norms, mask_hidden, five aux states); the states'
next tokens are replaced by the drafter's own step-1 guesses computed independently of verify,
run the way one engine runs it. verify must then report step-1 acceptance of exactly 1 for the
engine releases that run it that way, less for the others, and say why in their rows.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3conv.spec.canonical import expected
from eagle3conv.spec.drafter import DrafterSpec
from eagle3conv.spec.engines import Run
from eagle3conv.spec.layers import outputs
from eagle3conv.states.format import StatesFile, write_states
from eagle3conv.verify import load_drafter_weights
from helpers import NEWEST_SGLANG, NEWEST_VLLM, OLDEST_SGLANG, engine_rows, run
from test_verify import world  # noqa: F401 (the module-scoped tiny target and its captured states)

OLD, NEW, VLLM = f"sglang=={OLDEST_SGLANG}", f"sglang=={NEWEST_SGLANG}", f"vllm=={NEWEST_VLLM}"
TRAINED = (1, 3, 4)


def extend(drafter: Path, dest: Path, *, seed: int = 1, differ: bool = True, drop: tuple[str, ...] = (),
           **config) -> Path:
    """A copy of ``drafter`` with ``config`` merged in and every tensor the new config implies that the
    copy lacks, random but real (norms near 1). ``differ``: a later layer's hidden_norm differs from its
    input_layernorm. ``drop``: tensor names left out."""
    shutil.copytree(drafter, dest)
    cfg = json.loads((dest / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in TRAINED]  # vLLM: the same layers as SGLang
    cfg.update(config)
    (dest / "config.json").write_text(json.dumps(cfg))
    f = dest / "model.safetensors"
    tensors = load_file(str(f))
    g = torch.Generator().manual_seed(seed)
    for name, e in expected(DrafterSpec.from_config(cfg)).items():
        later_norm = name.startswith("layers.") and name.endswith(("input_layernorm.weight", "hidden_norm.weight"))
        if name in tensors or not (e.required or later_norm) or name in drop:
            continue
        shape = tuple(int(d) for d in e.shape)
        if "norm" in name and name.endswith(".weight"):
            t = 1 + 0.3 * torch.randn(shape, generator=g)
        else:
            t = 0.1 * torch.randn(shape, generator=g)
        tensors[name] = t.to(torch.bfloat16)
    for name in list(tensors):
        if name.endswith(".hidden_norm.weight") and name.startswith("layers.") and not differ:
            tensors[name] = tensors[name.replace("hidden_norm", "input_layernorm")].clone()
    save_file({k: v for k, v in tensors.items() if k not in drop}, str(f))
    return dest


def labelled(drafter: Path, captured: Path, out: Path, **run_as) -> Path:
    """The captured states with target_next replaced by ``drafter``'s own step-1 guesses under the
    trained layers, run with ``run_as`` (:class:`Run`'s fields): independent of verify."""
    from eagle3conv.model import build_drafter

    config, tensors = load_drafter_weights(drafter)
    with StatesFile(captured) as st:
        ids, mask = st.input_ids, st.attention_mask.bool()
        emb = st.embeddings()
        table = torch.zeros(config["vocab_size"], config["hidden_size"])
        table[ids[mask]] = emb[mask].float()
        d = build_drafter(config, tensors, dtype=torch.float32, embed_tokens=table, run=Run(**run_as))
        nxt = torch.zeros_like(ids)
        nxt[:, :-1] = ids[:, 1:]
        guess = d.forward(st.aux(outputs(*TRAINED)).float(), nxt).target_ids
        tn = st.target_next.clone()
        tn[:, 1:] = guess[:, :-1]
        write_states(out, input_ids=st.input_ids, attention_mask=st.attention_mask, target_next=tn,
                     hidden={ref: st.hidden(ref) for ref in st.layers}, num_layers=st.num_layers,
                     vocab_size=st.vocab_size, target=st.target, loss_mask=st.loss_mask, dtype="fp32")
    return out


def verify_json(drafter: Path, states: Path, *args: str, ok: int | None = 0) -> dict:
    return json.loads(run("verify", drafter, "--states", states, "--steps", "2", "--no-save", "--json", *args,
                          ok=ok).stdout)


def test_two_layer_drafter_engines_differ_until_fix_keys_writes_the_trained_norm(world, tmp_path):  # noqa: F811
    """A 2-layer drafter whose layers.1 input_layernorm and hidden_norm differ: vLLM normalises layer 1's
    input with input_layernorm, SGLang with hidden_norm. States labelled by the drafter run as vLLM runs it
    are matched exactly on vLLM's row only; after fix-keys --later-norm input_layernorm both names hold the
    trained norm and every row matches."""
    _, captured, drafter = world
    two = extend(drafter, tmp_path / "two", num_hidden_layers=2)
    states = labelled(two, captured, tmp_path / "vllm.safetensors", later_layer_norm="input_layernorm")
    d = verify_json(two, states)
    rows = engine_rows(d)
    assert rows[VLLM]["acceptance"][0] == 1.0
    assert rows[NEW]["acceptance"][0] < 0.9 and rows[OLD]["acceptance"][0] < 0.9
    assert rows[VLLM]["forward"]["later_layer_norm"] == "input_layernorm"
    assert rows[NEW]["forward"]["later_layer_norm"] == "hidden_norm"

    fixed = tmp_path / "fixed"
    res = run("fix-keys", two, "--out", fixed, "--later-norm", "input_layernorm", "--json")
    plan = json.loads(res.stdout)["plan"]
    (copied,) = [x for x in plan["decisions"] if x["action"] == "copied"]
    assert copied["targets"] == ["layers.1.input_layernorm.weight", "layers.1.hidden_norm.weight"]
    out = load_file(str(fixed / "model.safetensors"))
    assert torch.equal(out["layers.1.hidden_norm.weight"], out["layers.1.input_layernorm.weight"])
    rows = engine_rows(verify_json(fixed, states))
    assert rows[VLLM]["acceptance"][0] == rows[NEW]["acceptance"][0] == rows[OLD]["acceptance"][0] == 1.0


def test_differing_later_norms_without_a_record_are_a_warning_with_the_fix(world, tmp_path):  # noqa: F811
    _, _, drafter = world
    two = extend(drafter, tmp_path / "two", num_hidden_layers=2)
    d = json.loads(run("inspect", two, "--json").stdout)
    (w,) = [f for f in d["plan"]["findings"] if f["code"] == "later-norms-differ"]
    assert w["level"] == "warning" and "--later-norm" in w["fix"]
    assert "sglang 0.5.12-" in w["message"] and "vllm" in w["message"]


def test_one_later_norm_name_is_served_untrained_by_the_other_engine_until_fix_keys(world, tmp_path):  # noqa: F811
    """Trainers of multi-layer drafters (speculators, Model Optimizer) write layers.N.input_layernorm only:
    SGLang, which normalises later layers with hidden_norm, serves an untrained norm (ones); verify's rows
    show it; fix-keys writes the trained norm under both names and the rows agree."""
    _, captured, drafter = world
    only = extend(drafter, tmp_path / "only", num_hidden_layers=2, drop=("layers.1.hidden_norm.weight",))
    states = labelled(only, captured, tmp_path / "only.safetensors", later_layer_norm="input_layernorm")
    rows = engine_rows(verify_json(only, states))
    assert rows[VLLM]["acceptance"][0] == 1.0 and rows[NEW]["acceptance"][0] < 0.9
    assert any("layers.1.hidden_norm.weight is missing" in e and "untrained" in e for e in rows[NEW]["emulated"])
    fixed = tmp_path / "fixed"
    run("fix-keys", only, "--out", fixed)
    out = load_file(str(fixed / "model.safetensors"))
    src = load_file(str(only / "model.safetensors"))
    assert torch.equal(out["layers.1.hidden_norm.weight"], src["layers.1.input_layernorm.weight"])
    assert torch.equal(out["layers.1.input_layernorm.weight"], src["layers.1.input_layernorm.weight"])
    rows = engine_rows(verify_json(fixed, states))
    assert rows[VLLM]["acceptance"][0] == rows[NEW]["acceptance"][0] == rows[OLD]["acceptance"][0] == 1.0


def test_five_aux_states(world, tmp_path):  # noqa: F811
    """fc reads five aux states: verify runs it (it crashed on a row capturing three); a release that
    would capture another number of states is not scored and says why."""
    _, captured, drafter = world
    import dataclasses

    from eagle3conv.example import Dims, write_example

    five = (0, 1, 2, 3, 4)
    dims = dataclasses.replace(Dims(hidden=64, target_hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128,
                                    vocab=512, draft_vocab=300), aux_ids=five)
    d5 = write_example(tmp_path / "five", "sglang", dims)
    with StatesFile(captured) as st:
        vocab = st.vocab_size
    cfg = json.loads((d5 / "config.json").read_text())
    assert cfg["vocab_size"] == vocab
    d = verify_json(d5, captured, "--target", str(_target_config(tmp_path)), ok=None)
    assert [x["output_of"] for x in d["results"][0]["layers"]] == list(five)
    rows = engine_rows(d)
    assert rows["tensorrt-llm"]["not_scored"]  # its default captures another number of states
    assert rows[NEW]["acceptance"] is not None


def _target_config(tmp_path: Path) -> Path:
    path = tmp_path / "target.json"
    path.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                                "num_hidden_layers": 6, "vocab_size": 512, "num_attention_heads": 4}))
    return path


def test_norm_before_fc_is_served_without_by_sglang_before_0_5_17(world, tmp_path):  # noqa: F811
    _, captured, drafter = world
    nbf = extend(drafter, tmp_path / "nbf", norm_before_fc=True)
    states = labelled(nbf, captured, tmp_path / "nbf.safetensors")
    rows = engine_rows(verify_json(nbf, states))
    assert rows[NEW]["acceptance"][0] == rows[VLLM]["acceptance"][0] == 1.0
    assert rows[OLD]["acceptance"][0] < 0.9
    assert rows[OLD]["forward"]["without"] == ["norm_before_fc"]
    assert any("norm_before_fc" in e and "ignores it" in e for e in rows[OLD]["emulated"])


def test_qwen3_drafter_is_scored_as_vllm_and_sglang_says_it_cannot_serve_it(world, tmp_path):  # noqa: F811
    _, captured, drafter = world
    q3 = extend(drafter, tmp_path / "q3", architectures=["Eagle3Qwen3ForCausalLM"])
    states = labelled(q3, captured, tmp_path / "q3.safetensors", later_layer_norm="input_layernorm")
    d = verify_json(q3, states)
    rows = engine_rows(d)
    assert rows[VLLM]["acceptance"][0] == 1.0
    assert d["results"][0]["acceptance_per_position"][0] == 1.0  # verify's own run is vLLM's
    for spec in (OLD, NEW):
        assert "cannot serve a Qwen3 drafter" in rows[spec]["not_scored"]
    text = run("config", q3, "--check", ok=None).stdout
    assert "CANNOT SERVE" in text and "Qwen3" in text


def test_peagle_drafter_drafts_in_parallel_on_vllm_only(world, tmp_path):  # noqa: F811
    _, captured, drafter = world
    pe = extend(drafter, tmp_path / "pe", parallel_drafting=True, mask_token_id=7)
    states = labelled(pe, captured, tmp_path / "pe.safetensors")
    d = verify_json(pe, states)
    rows = engine_rows(d)
    assert rows[VLLM]["acceptance"][0] == 1.0 and rows[VLLM]["forward"]["parallel_mask_token"] == 7
    for spec in (OLD, NEW):
        assert "P-EAGLE" in rows[spec]["not_scored"]
    # without a mask token vLLM cannot start it either
    bare = extend(drafter, tmp_path / "bare", parallel_drafting=True)
    d = verify_json(bare, states, ok=None)
    assert "mask token" in engine_rows(d)[VLLM]["not_scored"]


@pytest.mark.parametrize("bad,match", [
    ({"drop": ("input_norm.weight",), "norm_before_fc": True}, "input_norm.weight: required but missing"),
    ({"drop": ("layers.1.mlp.down_proj.weight",), "num_hidden_layers": 2},
     "layers.1.mlp.down_proj.weight: required but missing"),
    ({"drop": ("layers.1.hidden_norm.weight", "layers.1.input_layernorm.weight"), "num_hidden_layers": 2},
     "layers.1: neither layers.1.input_layernorm.weight nor layers.1.hidden_norm.weight"),
])
def test_a_switch_or_layer_without_its_tensors_is_named(world, tmp_path, bad, match):  # noqa: F811
    _, _, drafter = world
    broken = extend(drafter, tmp_path / "broken", **bad)
    res = run("fix-keys", broken, "--out", tmp_path / "out", ok=3)
    assert match in res.stdout + res.stderr and "Traceback" not in res.stderr


def test_a_launch_option_default_of_another_width_is_named(tmp_path):
    """TensorRT-LLM takes its aux layers from a launch option: without a record its default (three
    layers) cannot feed a five-state fc, and its row says what to launch with."""
    import dataclasses

    from eagle3conv.example import Dims, write_example

    d5 = write_example(tmp_path / "five", "sglang", dataclasses.replace(Dims(), aux_ids=(1, 5, 10, 14, 26)))
    d = json.loads(run("config", d5, "--target", "smollm2-135m", "--check", "--json", ok=None).stdout)
    rows = {r["engine"]: r for r in d["wiring"]["engines"]}
    f = rows["tensorrt-llm"]["finding"]
    assert f["code"] == "fc-width" and "launch it with 5 layers" in f["message"]


def test_the_card_says_which_releases_serve_the_drafter(world, tmp_path):  # noqa: F811
    """push --dry-run's card: the drafter's layers, aux states and switches, and per release checked
    by default whether it serves it; a P-EAGLE drafter gets vLLM's parallel-drafting launch line and
    no SGLang one."""
    _, _, drafter = world
    pe = extend(drafter, tmp_path / "pe", parallel_drafting=True, mask_token_id=7, num_hidden_layers=2,
                differ=False)
    fixed = tmp_path / "fixed"
    run("fix-keys", pe, "--out", fixed)
    card = json.loads(run("push", fixed, "--repo-id", "me/pe", "--dry-run", "--json", ok=None).stdout)["card"]
    assert "2 decoder layers, 3 aux states into `fc`" in card and "`parallel drafting (P-EAGLE)`" in card
    # both SGLang releases read it alike: one row (issue 27)
    assert f"| sglang {OLDEST_SGLANG}, {NEWEST_SGLANG} | cannot load it: cannot serve a P-EAGLE drafter" in card
    assert f"| vllm {NEWEST_VLLM} | as configured |" in card
    assert '"parallel_drafting": true' in card and "SGLang: not served" in card
    assert "sglang.launch_server" not in card
