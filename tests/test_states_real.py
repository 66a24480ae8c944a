"""verify on the hidden states real engines and trainers write (issue 26 part A).

Each format is written from the tiny real target's captured states (tests/test_verify.py's
``world``) by that tool's own writer code where it runs on CPU (vLLM's connector writes with
``safetensors.torch.save_file``; NeMo Automodel's ``write_manifest``/``write_shard`` are imported
from its wheel when installed, else re-created byte for byte, sources in docs/states-formats.md),
and verify's figures on it must equal those on eagle3conv's own states file for the same tokens.
A folder written by ``capture --engine vllm``'s own code (vLLM stood in for on CPU) is read through
its ``eagle3conv-capture.json``: layers, loss mask, categories and the target's tokens from it.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from eagle3conv.spec.layers import outputs
from eagle3conv.states.format import StatesFile, write_states
from eagle3conv.verify import verify
from helpers import run
from test_verify import N_LAYERS, world  # noqa: F401 - the shared tiny target and its captured states


def _specforge_folder(st: StatesFile, folder: Path, layers) -> Path:
    """SpecForge 0.2.0 offline records (prepare_hidden_states.py's dict per sample) of ``layers``."""
    folder.mkdir(parents=True, exist_ok=True)
    mask = st.attention_mask.bool()
    aux = st.aux(outputs(*layers))
    last = st.hidden(N_LAYERS - 1)
    for b in range(st.num_sequences):
        n = int(mask[b].sum())
        rec = {"input_ids": st.input_ids[b, :n].clone(), "loss_mask": st.loss_mask[b, :n].long(),
               "hidden_state": last[b:b + 1, :n].clone(), "aux_hidden_state": aux[b:b + 1, :n].clone()}
        torch.save(rec, folder / f"data_{b}.ckpt")
    return folder


def test_specforge_unnamed_slots_cannot_check_the_wiring(world, tmp_path):  # noqa: F811
    """Records of other layers than the config names, no --states-layers: verify cannot tell, and
    must say so in its first line; no engine row says ok."""
    root, captured, drafter = world
    with StatesFile(captured) as st:
        folder = _specforge_folder(st, tmp_path / "sf", (0, 2, 5))  # not the config's 1, 3, 4
    res = run("verify", drafter, "--states", folder, "--embeddings", root / "target", "--no-save")
    first = res.stdout.splitlines()[0]
    assert "cannot check the wiring" in first, res.stdout
    assert not [ln for ln in res.stdout.splitlines() if ln.startswith("  ok  ")], res.stdout
    d = json.loads(run("verify", drafter, "--states", folder, "--embeddings", root / "target", "--no-save",
                       "--json").stdout)
    assert d["states"]["wiring_checked"] is False and "--states-layers" in d["states"]["wiring_unchecked_why"]
    # named by the user: checked, and the report says the check rests on that statement
    d = json.loads(run("verify", drafter, "--states", folder, "--embeddings", root / "target", "--no-save",
                       "--states-layers", "0,2,5", "--layers", "0,2,5", "--json").stdout)
    assert d["states"]["wiring_checked"] is True and "--states-layers" in d["states"]["layers_from"]


# --- vLLM 0.33.0 hidden-states files, as speculators 0.9.0 keeps them ---------------------------------

VLLM_IDS = (2, 4, 5, 6)  # vLLM's numbering: outputs of layers 1, 3, 4 and the last (5), as speculators asks


def write_vllm_file(path: Path, hidden_states: torch.Tensor, token_ids: torch.Tensor) -> None:
    """What vLLM's ExampleHiddenStatesConnector._write_tensors writes
    (example_hidden_states_connector.py:329-345, the dict of :414-418): safetensors.torch.save_file of
    exactly these two tensors, no metadata; speculators then renames it hs_{i}.safetensors
    (cli/generate_offline_data.py:139-160)."""
    from safetensors.torch import save_file

    save_file({"hidden_states": hidden_states, "token_ids": token_ids.clone()}, str(path))


def vllm_folder(st: StatesFile, root: Path, *, with_dataset: bool = True, ids=VLLM_IDS) -> Path:
    """speculators' layout: the preprocessed dataset (datasets' save_to_disk, as prepare_data.py:243
    writes it) with hidden_states/hs_{i}.safetensors inside (generate_offline_data.py:268)."""
    mask = st.attention_mask.bool()
    rows_ids, rows_loss = [], []
    hs_dir = root / "prepared" / "hidden_states" if with_dataset else root / "hs"
    hs_dir.mkdir(parents=True)
    stacked = torch.stack([st.hidden(i - 1) for i in ids], dim=2)  # [B, S, n, T]: layer order
    for b in range(st.num_sequences):
        n = int(mask[b].sum())
        write_vllm_file(hs_dir / f"hs_{b}.safetensors", stacked[b, :n].contiguous(), st.input_ids[b, :n])
        rows_ids.append(st.input_ids[b, :n].tolist())
        rows_loss.append(st.loss_mask[b, :n].long().tolist())
    if with_dataset:
        import datasets

        datasets.Dataset.from_dict({"input_ids": rows_ids, "loss_mask": rows_loss}).save_to_disk(
            str(root / "prepared"))
    return hs_dir


def _same_figures(got, ref) -> None:
    assert got.counted == ref.counted and got.matched == ref.matched
    assert got.chains == ref.chains and got.chain_accepted == ref.chain_accepted
    assert got.accept_length == ref.accept_length and got.acceptance == ref.acceptance
    assert [n["median"] for n in got.norms] == [n["median"] for n in ref.norms]
    assert got.tokens > 50


def test_vllm_files_score_like_the_states_file(world, tmp_path):  # noqa: F811
    root, captured, drafter = world
    with StatesFile(captured) as st:
        folder = vllm_folder(st, tmp_path)
        want_next = st.target_next.clone()
        real = st.attention_mask.bool()
    ref = verify(drafter, captured, embeddings=root / "target", save=False)
    res = verify(drafter, folder, embeddings=root / "target", states_layers=list(VLLM_IDS), save=False)
    _same_figures(res.main, ref.main)
    from eagle3conv.states.vllm import VllmStates

    vs = VllmStates(folder, vllm_ids=VLLM_IDS)
    with StatesFile(captured) as st:
        assert torch.equal(vs.aux(outputs(4, 1), slice(2, 9)), st.aux(outputs(4, 1), slice(2, 9)))
        assert torch.equal(vs.input_ids, st.input_ids) and torch.equal(vs.loss_mask, st.loss_mask)
    assert res.reference == "target" and res.states["source"] == "vllm"
    assert any("final norm and lm_head" in n for n in res.states["verify_notes"])
    assert "vLLM's numbering" in res.states["layers_from"] and res.states["wiring_checked"] is True
    assert res.states["has_loss_mask"] is True  # from speculators' dataset beside the files
    # the target's own next tokens, from its final norm and lm_head over the last slot
    from eagle3conv.verify.inputs import load_target_head, load_target_norm, target_next_from_head

    vs = VllmStates(folder, vllm_ids=VLLM_IDS, num_layers=N_LAYERS)
    assert vs.final_state == ("pre-norm", outputs(N_LAYERS - 1)[0])
    vs.final_state = ("pre-norm", outputs(N_LAYERS - 1)[0])
    got = target_next_from_head(vs, load_target_head(root / "target", 512, 64), load_target_norm(root / "target", 64))
    assert torch.equal(got[real], want_next[real])


def test_vllm_text_report_and_unstated_layers(world, tmp_path):  # noqa: F811
    root, captured, drafter = world
    with StatesFile(captured) as st:
        folder = vllm_folder(st, tmp_path, with_dataset=False)
    out = run("verify", drafter, "--states", folder, "--embeddings", root / "target", "--no-save",
              "--states-layers", "6,2,4,5").stdout  # any order: vLLM stacks in layer order
    assert "layers:     from --states-layers" in out and "the wiring check rests on that statement" in out
    assert "every token is scored" in out
    # no --states-layers: the first three slots labelled as the config's wiring, and said so
    out = run("verify", drafter, "--states", folder, "--embeddings", root / "target", "--no-save").stdout
    assert "cannot check the wiring" in out.splitlines()[0]
    assert "  ok  " not in out


# --- NeMo Automodel 0.7.0's EAGLE-3 cache -------------------------------------------------------------


@pytest.fixture(scope="module")
def nemo_cache_module():
    """NeMo Automodel's own cache writer: components/datasets/llm/eagle3_cache.py (and offline_cache.py)
    from the installed nemo_automodel 0.7.0 wheel (scripts/test.sh installs it --no-deps), imported
    alone: the package __init__s pull its training stack, so they are stood in for by empty packages."""
    import importlib
    import importlib.util
    import sys
    import types

    spec = importlib.util.find_spec("nemo_automodel")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("nemo_automodel 0.7.0 is not installed (scripts/test.sh installs it --no-deps)")
    base = Path(spec.submodule_search_locations[0])
    pkgs = {"nemo_automodel": base, "nemo_automodel.shared": base / "shared",
            "nemo_automodel.components": base / "components",
            "nemo_automodel.components.datasets": base / "components" / "datasets",
            "nemo_automodel.components.datasets.llm": base / "components" / "datasets" / "llm"}
    saved = {k: v for k, v in sys.modules.items() if k.startswith("nemo_automodel")}
    for name, folder in pkgs.items():
        mod = types.ModuleType(name)
        mod.__path__ = [str(folder)]
        sys.modules[name] = mod
    try:
        yield importlib.import_module("nemo_automodel.components.datasets.llm.eagle3_cache")
    finally:
        for k in [k for k in sys.modules if k.startswith("nemo_automodel")]:
            del sys.modules[k]
        sys.modules.update(saved)


def _target_distribution(target_logits, selected_token_ids, selected_token_mask, loss_mask):
    """NeMo's _compute_target_distribution (components/speculative/eagle/core.py:153-164), as written there."""
    target_top_ids = target_logits.argmax(dim=-1)
    position_mask = (selected_token_mask[target_top_ids] & loss_mask.bool()).unsqueeze(-1)
    draft_target_logits = target_logits.index_select(dim=-1, index=selected_token_ids.to(target_logits.device))
    return torch.softmax(draft_target_logits.float(), dim=-1).detach(), position_mask


def _shift_left(t):
    """NeMo's _shift_left_with_zero (components/speculative/eagle/target.py:30-39)."""
    return torch.cat((t[:, 1:], torch.zeros_like(t[:, :1])), dim=1)


def nemo_cache(mod, st: StatesFile, target, out: Path, *, shard_size: int = 5, draft_vocab=None,
               topk: int = 0, layers=(1, 3, 4)) -> Path:
    """What precompute_eagle3._run writes (precompute_eagle3.py:205-302): the target's embeddings, the
    manifest, then shards of _compute_batch_cache's fields, through NeMo's own writers. The target is
    run by transformers, as HFEagle3TargetModel.generate_batch does (hooks = outputs of layers[i]);
    ``target``: its model folder, or the loaded model."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(target)).eval() if isinstance(target, Path) else target
    mask = st.attention_mask.long()
    with torch.no_grad():
        logits = model(input_ids=st.input_ids, attention_mask=mask).logits
    vocab = int(model.config.vocab_size)
    sel = torch.arange(vocab) if draft_vocab is None else torch.tensor(sorted(draft_vocab))
    sel_mask = torch.zeros(vocab, dtype=torch.bool)
    sel_mask[sel] = True
    loss = st.loss_mask.long()
    probs, pmask = _target_distribution(_shift_left(logits), sel, sel_mask, _shift_left(loss))
    aux = st.aux(outputs(*layers)).float()
    out.mkdir(parents=True)
    mod.write_target_embeddings(str(out), model.get_input_embeddings().weight)
    mod.write_manifest(str(out), {"target_model": "the target", "target_vocab_size": vocab,
                                  "draft_vocab_size": int(sel.numel()), "seq_length": st.seq_len, "dtype": "fp32",
                                  "num_samples": st.num_sequences, "shard_size": shard_size,
                                  "target_probs_topk": topk, "aux_hidden_dim": st.hidden_size * len(layers),
                                  "aux_layer_ids": list(layers), "selected_token_ids": sel.tolist(),
                                  "input_data": "test", "split": None, "shuffle_seed": 42,
                                  "mask_reasoning_content": False, "mask_generation_prompt": False})
    for i, a in enumerate(range(0, st.num_sequences, shard_size)):
        r = slice(a, a + shard_size)
        sample = {"input_ids": _shift_left(st.input_ids[r]), "attention_mask": mask[r],
                  "loss_mask": _shift_left(loss[r]), "aux_hidden_states": aux[r], "position_mask": pmask[r]}
        if mod.is_compressed(topk, int(sel.numel())):
            v, ix = mod.compress_target_probs(probs[r], topk)
            sample.update(target_probs_values=v, target_probs_indices=ix)
        else:
            sample["target_probs"] = probs[r]
        mod.write_shard(str(out), i, sample)
    return out


def test_nemo_cache_scores_like_the_states_file(world, tmp_path, nemo_cache_module):  # noqa: F811
    root, captured, drafter = world
    with StatesFile(captured) as st:
        cache = nemo_cache(nemo_cache_module, st, root / "target", tmp_path / "cache")
    ref = verify(drafter, captured, embeddings=root / "target", save=False)
    res = verify(drafter, cache, save=False)  # its own target_embeddings.safetensors: no --embeddings
    _same_figures(res.main, ref.main)
    assert res.reference == "target" and res.states["source"] == "nemo" and res.states["wiring_checked"]
    assert "aux_layer_ids" in res.states["layers_from"]
    # what the reader gives, tensor by tensor, in verify's layout (x_0 is not in the cache)
    from eagle3conv.states.nemo import NemoStates

    ns = NemoStates(cache)
    with StatesFile(captured) as st:
        real = st.attention_mask.bool()
        assert torch.equal(ns.attention_mask, real) and torch.equal(ns.loss_mask[:, 1:], st.loss_mask[:, 1:])
        assert torch.equal(ns.input_ids[:, 1:][real[:, 1:]], st.input_ids[:, 1:][real[:, 1:]])
        assert torch.equal(ns.target_next[:, 1:][real[:, 1:]], st.target_next[:, 1:][real[:, 1:]])
        assert torch.equal(ns.aux(outputs(3, 1), slice(3, 11)), st.aux(outputs(3, 1), slice(3, 11)).float())
    # top-k compressed distributions: the same argmax
    with StatesFile(captured) as st:
        topk = nemo_cache(nemo_cache_module, st, root / "target", tmp_path / "topk", topk=4, shard_size=12)
        one = NemoStates(topk)  # every row in one shard: the rows are handed out without a copy
        assert torch.equal(one.aux(outputs(1, 3, 4), slice(2, 10)), st.aux(outputs(1, 3, 4), slice(2, 10)).float())
    _same_figures(verify(drafter, topk, save=False).main, ref.main)


def test_nemo_cache_with_a_small_draft_vocab_counts_outside_tokens_as_misses(world, tmp_path,  # noqa: F811
                                                                           nemo_cache_module):
    from eagle3conv.states.nemo import NemoStates

    root, captured, drafter = world
    with StatesFile(captured) as st:
        real = st.loss_mask.bool() & st.attention_mask.bool()
        keep = set(st.target_next[real][::2].tolist())
        cache = nemo_cache(nemo_cache_module, st, root / "target", tmp_path / "small", draft_vocab=keep)
        want = st.target_next.clone()
    ns = NemoStates(cache)
    inside = torch.tensor([int(t) in keep for t in want.flatten()]).view_as(want)
    scored = ns.loss_mask & ns.attention_mask
    assert torch.equal(ns.target_next[scored & inside], want[scored & inside])
    outside = scored & ~inside
    assert outside.any() and not any(int(t) in keep for t in ns.target_next[outside])
    assert any("outside the cache's draft vocabulary" in n for n in ns.notes)


# --- bad input: a clear error naming the file, nothing written, no traceback ------------------------


def _refused(drafter: Path, *args, code: int) -> str:
    before = sorted(p.name for p in drafter.iterdir())
    res = run("verify", drafter, *args, ok=code)
    assert "Traceback" not in res.stderr and res.exception is None or isinstance(res.exception, SystemExit)
    assert sorted(p.name for p in drafter.iterdir()) == before  # no eagle3conv-verify.json, nothing else
    return res.stderr


def test_a_folder_mixing_formats(world, tmp_path):  # noqa: F811
    root, captured, drafter = world
    with StatesFile(captured) as st:
        folder = vllm_folder(st, tmp_path, with_dataset=False)
        _specforge_folder(st, folder, (1, 3, 4))
    err = _refused(drafter, "--states", folder, "--embeddings", root / "target", code=1)
    assert "mixes formats" in err and "hs_0.safetensors" in err and "data_0.ckpt" in err


def test_a_nemo_shard_missing(world, tmp_path, nemo_cache_module):  # noqa: F811
    root, captured, drafter = world
    with StatesFile(captured) as st:
        cache = nemo_cache(nemo_cache_module, st, root / "target", tmp_path / "cache")
    (cache / "shard-000001.safetensors").unlink()
    err = _refused(drafter, "--states", cache, code=1)
    assert "shard-000001.safetensors: missing" in err and "12 samples in 3 shards" in err


def test_mismatched_sequence_counts_between_files(world, tmp_path, nemo_cache_module):  # noqa: F811
    from safetensors.torch import load_file, save_file

    root, captured, drafter = world
    with StatesFile(captured) as st:
        folder = vllm_folder(st, tmp_path / "a")
        cache = nemo_cache(nemo_cache_module, st, root / "target", tmp_path / "cache")
    # a vLLM file whose hidden_states and token_ids disagree
    bad = folder / "hs_3.safetensors"
    t = load_file(str(bad))
    write_vllm_file(bad, t["hidden_states"][:-1].contiguous(), t["token_ids"])
    err = _refused(drafter, "--states", folder, "--states-layers", "2,4,5,6", "--embeddings", root / "target", code=1)
    assert "hs_3.safetensors" in err and "positions but token_ids" in err
    # a file for a row the dataset does not have
    write_vllm_file(bad, t["hidden_states"], t["token_ids"])
    (folder / "hs_3.safetensors").rename(folder / "hs_40.safetensors")
    err = _refused(drafter, "--states", folder, "--states-layers", "2,4,5,6", "--embeddings", root / "target", code=1)
    assert "hs_40.safetensors names row 40" in err and "12 rows" in err
    # a NeMo shard holding fewer samples than the manifest puts in it
    shard = cache / "shard-000000.safetensors"
    t = load_file(str(shard))
    save_file({k: v[:4].contiguous() for k, v in t.items()}, str(shard))
    err = _refused(drafter, "--states", cache, code=1)
    assert "shard-000000.safetensors" in err and "puts 5 samples" in err


def test_layer_ids_out_of_range_for_the_target(world, tmp_path):  # noqa: F811
    root, captured, drafter = world
    with StatesFile(captured) as st:
        folder = vllm_folder(st, tmp_path)
    err = _refused(drafter, "--states", folder, "--states-layers", "2,4,5,9", "--embeddings", root / "target", code=3)
    assert str(folder) in err and "output of layer 8" in err and "6 layers" in err and "vLLM" in err


def test_a_nan_in_one_file(world, tmp_path):  # noqa: F811
    from safetensors.torch import load_file

    root, captured, drafter = world
    with StatesFile(captured) as st:
        folder = vllm_folder(st, tmp_path)
        sf = _specforge_folder(st, tmp_path / "sf", (1, 3, 4))
    bad = folder / "hs_5.safetensors"
    t = load_file(str(bad))
    t["hidden_states"][3, 1, 7] = float("nan")
    write_vllm_file(bad, t["hidden_states"], t["token_ids"])
    err = _refused(drafter, "--states", folder, "--states-layers", "2,4,5,6", "--embeddings", root / "target", code=1)
    assert "hs_5.safetensors: the hidden states of slot 1" in err and "not finite" in err
    rec = torch.load(sf / "data_7.ckpt")
    rec["aux_hidden_state"][0, 2, 70] = float("inf")
    torch.save(rec, sf / "data_7.ckpt")
    err = _refused(drafter, "--states", sf, "--states-layers", "1,3,4", "--embeddings", root / "target", code=1)
    assert "data_7.ckpt" in err and "not finite" in err


def test_embeddings_that_are_not_weights_are_a_clear_error(world, tmp_path):  # noqa: F811
    root, captured, drafter = world
    with StatesFile(captured) as st:
        sf = _specforge_folder(st, tmp_path / "sf", (1, 3, 4))
    junk = tmp_path / "model.bin"
    junk.write_bytes(b"\x00" * 4096)
    err = _refused(drafter, "--states", sf, "--embeddings", junk, code=1)
    assert "model.bin" in err and "not a readable safetensors file" in err


# --- a real target and a trained drafter: SmolLM2-135M and tests/data/smollm2-drafter ----------------

SMOL_DRAFTER = Path(__file__).parent / "data" / "smollm2-drafter"  # trained on outputs of layers 1, 14, 26
SMOL_PROMPTS = ["Explain volcanoes to a curious teenager.", "Write a short paragraph about DNA.",
                "Give me three interesting things about tea.", "Why do smartphones matter? Answer in one paragraph."]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """SmolLM2's states captured by eagle3conv (fp32, the target's greedy responses), its GGUF (the
    --embeddings every format is scored with: its table, final norm and lm_head, de-quantized), and the
    trained drafter copied out of the repository."""
    import shutil

    from eagle3conv.errors import Eagle3ConvError
    from eagle3conv.states.capture import capture_states
    from eagle3conv.states.target_model import load_target_model, smollm2_gguf_path

    try:
        target = load_target_model("smollm2-135m")
    except Eagle3ConvError as e:  # scripts/setup.sh installs it
        pytest.skip(f"SmolLM2 not installed: {e.message}")
    from eagle3conv.verify.inputs import use_loaded_target

    use_loaded_target(smollm2_gguf_path(), target.model)  # verify's --embeddings GGUF: loaded once
    root = tmp_path_factory.mktemp("smol")
    out = root / "states.safetensors"
    capture_states(target.model, target.tokenizer, SMOL_PROMPTS, out, layers=[1, 14, 26, 29], generate_tokens=32,
                   batch_size=4, dtype="fp32", target=target.name)
    drafter = root / "drafter"
    shutil.copytree(SMOL_DRAFTER, drafter)
    return out, smollm2_gguf_path(), drafter, target.model


def test_every_format_scores_the_trained_drafter_like_the_states_file(smollm2, tmp_path, nemo_cache_module):
    """The trained drafter's acceptance (well above 0) on SmolLM2's own tokens, read from vLLM's files,
    NeMo's cache and SpecForge's records of the same states: the same figures, exactly."""
    states, gguf, drafter, model = smollm2
    ref = verify(drafter, states, embeddings=gguf, save=False)
    assert ref.main.acceptance[0] > 0.2 and ref.reference == "target"
    with StatesFile(states) as st:
        folder = vllm_folder(st, tmp_path / "vllm", ids=(2, 15, 27, 30))  # outputs 1, 14, 26 and the last (29)
        cache = nemo_cache(nemo_cache_module, st, model, tmp_path / "nemo", shard_size=3, topk=4,
                           layers=(1, 14, 26))
        sf = tmp_path / "sf"
        sf.mkdir()
        mask = st.attention_mask.bool()
        aux = st.aux(outputs(1, 14, 26))
        with torch.no_grad():
            post = model.model.norm(st.hidden(29))  # SGLang's last_hidden_states: after the final norm
        for b in range(st.num_sequences):
            n = int(mask[b].sum())
            buf = io.BytesIO()
            torch.save({"input_ids": st.input_ids[b, :n].clone(), "loss_mask": st.loss_mask[b, :n].long(),
                        "hidden_state": post[b:b + 1, :n].clone(), "aux_hidden_state": aux[b:b + 1, :n].clone()},
                       buf)
            (sf / f"data_{b}.ckpt").write_bytes(buf.getvalue())
    got = {"vllm": verify(drafter, folder, embeddings=gguf, states_layers=[2, 15, 27, 30], save=False),
           "nemo": verify(drafter, cache, embeddings=gguf, save=False),
           "specforge": verify(drafter, sf, embeddings=gguf, states_layers=[1, 14, 26], save=False)}
    for name, res in got.items():
        assert res.reference == "target", name
        _same_figures(res.main, ref.main)


# --- the trainer's own data as the norm record ------------------------------------------------------


def test_training_states_give_the_norms_slot_by_slot(world, tmp_path):  # noqa: F811
    """--training-states: the per-slot norms of the data the drafter was trained on (here SpecForge
    records of outputs 1, 3, 4, which record no layers, and vLLM files with the last layer after them)
    next to the inference states', slot by slot; no metadata file written first."""
    root, captured, drafter = world
    with StatesFile(captured) as st:
        sf = _specforge_folder(st, tmp_path / "sf", (1, 3, 4))
        hs = vllm_folder(st, tmp_path / "v", with_dataset=False)
    res = verify(drafter, captured, training_states=sf, save=False)
    cmp = res.comparisons[0]
    assert [c["ratio"] for c in cmp] == [1.0, 1.0, 1.0]  # the same data: the same medians
    assert [c["training_median"] for c in cmp] == [n["median"] for n in res.main.norms]
    assert "--training-states" in res.training_norms["source"]
    # the incident's wiring at inference (the embedding output in slot 0) against the trained data
    wrong = verify(drafter, captured, training_states=hs, layers=[-1, 1, 3], save=False)
    got = wrong.comparisons[0]
    assert [c["training_median"] for c in got] == [c["training_median"] for c in cmp]  # vLLM: the first 3 slots
    assert all(c["ratio"] != 1.0 for c in got)
    out = run("verify", drafter, "--states", captured, "--training-states", sf, "--no-save").stdout
    assert "slot 0 vs training" in out


def test_the_card_says_unnamed_states_do_not_check_the_wiring(world, tmp_path):  # noqa: F811
    import shutil

    from eagle3conv.hub.card import gather_facts, render_block

    root, captured, drafter = world
    mine = tmp_path / "drafter"
    shutil.copytree(drafter, mine)
    with StatesFile(captured) as st:
        sf = _specforge_folder(st, tmp_path / "sf", (0, 2, 5))
    run("verify", mine, "--states", sf, "--embeddings", root / "target")
    card = render_block(gather_facts(mine, "me/drafter"))
    assert "do not check the wiring" in card
    run("verify", mine, "--states", sf, "--embeddings", root / "target", "--states-layers", "0,2,5",
        "--layers", "0,2,5")  # named: checked, and the card does not say otherwise
    assert "do not check the wiring" not in render_block(gather_facts(mine, "me/drafter"))


# --- vLLM files with eagle3conv's capture record (capture --engine vllm) ---------------------------

CATS = ("code", "math", "chat")


def _world_tokenizer():
    """tests/test_verify.py's world tokenizer (same vocabulary, so the prompts re-tokenize to its ids)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["[UNK]", "[PAD]", "<s>", "</s>"] + [f"w{i}" for i in range(508)])}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", bos_token="<s>",
                                   eos_token="</s>"), {i: t for t, i in vocab.items()}


class _Engine:
    """vLLM on CPU for one capture: each request's greedy response is the world's (the target's own,
    captured by eagle3conv), and its file is what ExampleHiddenStatesConnector writes
    (example_hidden_states_connector.py:329-345: save_file of hidden_states [S, n, T] and token_ids,
    a .lock beside it) holding the world's real states of the ids asked for."""

    def __init__(self, st: StatesFile, **kw):
        self.st, self.kw = st, kw

    def generate(self, prompts, params, use_tqdm=True):
        import types

        from safetensors.torch import save_file

        from eagle3conv.spec.drafter import AUX_KEY

        storage = Path(self.kw["kv_transfer_config"]["kv_connector_extra_config"]["shared_storage_path"])
        storage.mkdir(parents=True, exist_ok=True)
        ids = self.kw["speculative_config"]["draft_model_config"]["hf_config"][AUX_KEY]
        st, outs = self.st, []
        for r, (p, sp) in enumerate(zip(prompts, params)):
            n = int(st.attention_mask[r].sum())
            prompt = p["prompt_token_ids"]
            assert prompt == st.input_ids[r, :len(prompt)].tolist()
            gen = st.input_ids[r, len(prompt):n].tolist() + [int(st.target_next[r, n - 1])]
            assert len(gen) <= sp.kw["max_tokens"] and sp.kw["extra_args"]["kv_transfer_params"]["include_output_tokens"]
            path = storage / f"req-{r}.safetensors"
            Path(str(path) + ".lock").write_text("")
            save_file({"hidden_states": torch.stack([st.hidden(i - 1, slice(r, r + 1))[0, :n] for i in ids], 1),
                       "token_ids": torch.tensor(prompt + gen[:-1], dtype=torch.long)}, str(path))
            outs.append(types.SimpleNamespace(kv_transfer_params={"hidden_states_path": str(path)},
                                              outputs=[types.SimpleNamespace(token_ids=gen, finish_reason="length")]))
        return outs


@pytest.fixture(scope="module")
def vllm_capture(world, tmp_path_factory):  # noqa: F811
    """A folder written by capture --engine vllm's own code (run_vllm_capture: its file checks and moves,
    its record, its rename), vLLM stood in for by :class:`_Engine`; and eagle3conv's own states file of
    the same tokens with the same categories."""
    import sys
    import types

    from eagle3conv.states.vllm_capture import VllmCapturePlan, run_vllm_capture, vllm_ids_for

    root, captured, _ = world
    base = tmp_path_factory.mktemp("vllm-capture")
    tok, inv = _world_tokenizer()
    tdir = base / "target"
    tok.save_pretrained(tdir)
    (tdir / "config.json").write_bytes((root / "target" / "config.json").read_bytes())
    with StatesFile(captured) as st:
        cats = [None if b == st.num_sequences - 1 else CATS[b % 3] for b in range(st.num_sequences)]
        starts = [int(st.loss_mask[b].int().argmax()) for b in range(st.num_sequences)]
        prompts = [{"prompt": " ".join(inv[i] for i in st.input_ids[b, :p].tolist()), **({"category": c} if c else {})}
                   for b, (p, c) in enumerate(zip(starts, cats))]
        ref = write_states(base / "ref.safetensors", input_ids=st.input_ids, attention_mask=st.attention_mask,
                           target_next=st.target_next, hidden={i: st.hidden(i) for i in range(-1, N_LAYERS)},
                           num_layers=N_LAYERS, vocab_size=st.vocab_size, target="tiny-llama", loss_mask=st.loss_mask,
                           dtype="fp32", categories=cats)
        mod = types.ModuleType("vllm")
        mod.__version__, mod.SamplingParams = "0.33.0", lambda **kw: types.SimpleNamespace(kw=kw)
        mod.LLM = lambda **kw: _Engine(st, **kw)
        saved = sys.modules.get("vllm")
        sys.modules["vllm"] = mod
        try:
            plan = VllmCapturePlan(target=str(tdir), num_layers=N_LAYERS, hidden_size=64, vocab_size=st.vocab_size,
                                   vllm_ids=vllm_ids_for(None, N_LAYERS), out=base / "states", generate=9,
                                   dtype="float32", chat_template=False)
            run_vllm_capture(plan, prompts)
        finally:
            if saved is None:
                sys.modules.pop("vllm")
            else:
                sys.modules["vllm"] = saved
    return base / "states", ref, cats


def test_vllm_capture_read_by_its_record(world, vllm_capture):  # noqa: F811
    """capture --engine vllm's folder, no --states-layers: layers, loss mask, categories and the
    target's tokens from its record, and every figure (per category too) equal to those on
    eagle3conv's own states file of the same tokens."""
    from eagle3conv.states.readers import open_states
    from eagle3conv.verify.profile import category_figures

    root, captured, drafter = world
    folder, ref_path, cats = vllm_capture
    vs = open_states(folder)
    with StatesFile(ref_path) as ref:
        assert vs.layers == tuple(outputs(*range(-1, N_LAYERS))) and vs.num_layers == N_LAYERS
        assert torch.equal(vs.loss_mask, ref.loss_mask) and vs.has_loss_mask
        assert vs.categories == tuple(cats)
        scored = vs.loss_mask
        assert torch.equal(vs.target_next[scored], ref.target_next[scored])
        assert bool((vs.target_next[~vs.attention_mask] == -1).all())
    assert "--states-layers" not in vs.layers_from and "eagle3conv-capture.json" in vs.layers_from
    got = verify(drafter, folder, save=False)
    want = verify(drafter, ref_path, save=False)
    _same_figures(got.main, want.main)
    assert got.reference == "target" and got.states["wiring_checked"] is True
    assert got.categories == want.categories == tuple(cats)
    per_got, per_want = category_figures(got.main, got.categories), category_figures(want.main, want.categories)
    assert per_got == per_want and set(per_got) == {"code", "math", "chat", "(none)"}
    text = run("verify", drafter, "--states", folder, "--no-save").stdout
    assert "eagle3conv-capture.json" in text and "rests on that statement" not in text, text
    assert "cannot check the wiring" not in text.splitlines()[0]


def test_vllm_capture_states_layers_must_agree(world, vllm_capture):  # noqa: F811
    _, _, drafter = world
    folder, _, _ = vllm_capture
    ids = ",".join(str(i) for i in range(N_LAYERS + 1))
    d = json.loads(run("verify", drafter, "--states", folder, "--states-layers", ids, "--no-save", "--json").stdout)
    assert d["states"]["wiring_checked"] is True and "--states-layers" not in d["states"]["layers_from"]
    res = run("verify", drafter, "--states", folder, "--states-layers", "2,4,5,6", "--no-save", ok=3)
    assert "conflicts with the ids this capture recorded" in res.stderr and "0,1,2,3,4,5,6" in res.stderr
    assert "Traceback" not in res.stderr


def test_vllm_capture_record_and_files_must_agree(world, vllm_capture, tmp_path):  # noqa: F811
    import shutil

    from eagle3conv.states.readers import open_states
    from eagle3conv.states.vllm_capture import SIDECAR

    _, _, drafter = world
    folder, ref_path, cats = vllm_capture
    one = open_states(folder / "hs_1.safetensors")  # one file: its own entry of the folder's record
    with StatesFile(ref_path) as ref:
        n = int(ref.attention_mask[1].sum())
        assert one.categories == (cats[1],) and torch.equal(one.loss_mask[0], ref.loss_mask[1, :n])
    short = shutil.copytree(folder, tmp_path / "short")
    (short / "hs_11.safetensors").unlink()
    err = run("verify", drafter, "--states", short, "--no-save", ok=1).stderr
    assert "records 12 sequences, but the folder holds 11" in err and "Traceback" not in err
    other = shutil.copytree(folder, tmp_path / "other")
    side = json.loads((other / SIDECAR).read_text())
    side["sequences"][3]["tokens"] += 1
    side["sequences"][3]["prompt_tokens"] += 1
    (other / SIDECAR).write_text(json.dumps(side))
    err = run("verify", drafter, "--states", other, "--no-save", ok=1).stderr
    assert "hs_3.safetensors: holds" in err and "do not belong together" in err


def test_vllm_capture_without_generated_responses(world, vllm_capture, tmp_path):  # noqa: F811
    """A record whose responses vLLM did not decode (no --generate): the target's tokens are not
    known there, so none are taken from the record; verify computes them from the last slot."""
    import shutil

    from eagle3conv.states.readers import open_states
    from eagle3conv.states.vllm_capture import SIDECAR

    root, _, drafter = world
    folder, ref_path, _ = vllm_capture
    given = shutil.copytree(folder, tmp_path / "given")
    side = json.loads((given / SIDECAR).read_text())
    for s in side["sequences"]:
        s["generated"] = 0
    (given / SIDECAR).write_text(json.dumps(side))
    st = open_states(given)
    assert st.target_next is None and st.final_state == ("pre-norm", outputs(N_LAYERS - 1)[0]) and st.has_loss_mask
    got = verify(drafter, given, embeddings=root / "target", save=False)
    want = verify(drafter, ref_path, save=False)
    assert got.reference == "target" and any("final norm and lm_head" in n for n in got.states["verify_notes"])
    _same_figures(got.main, want.main)


def test_vllm_capture_record_names_its_target_size(vllm_capture):
    from eagle3conv.errors import WiringError
    from eagle3conv.states.readers import open_states

    folder, _, _ = vllm_capture
    assert open_states(folder, num_layers=N_LAYERS).num_layers == N_LAYERS
    with pytest.raises(WiringError, match="records a target of 6 layers, but the target named has 8"):
        open_states(folder, num_layers=8)
