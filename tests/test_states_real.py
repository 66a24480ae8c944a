"""verify on the hidden states real engines and trainers write (issue 26 part A).

Each format is written from the tiny real target's captured states (tests/test_verify.py's
``world``) by that tool's own writer code where it runs on CPU (vLLM's connector writes with
``safetensors.torch.save_file``; NeMo Automodel's ``write_manifest``/``write_shard`` are imported
from its wheel when installed, else re-created byte for byte, sources in docs/states-formats.md),
and verify's figures on it must equal those on eagle3conv's own states file for the same tokens.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from eagle3conv.spec.layers import outputs
from eagle3conv.states.format import StatesFile
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
    assert res.reference == "target" and res.states["source"] == "vllm"
    assert any("final norm and lm_head" in n for n in res.states["verify_notes"])
    assert "vLLM's numbering" in res.states["layers_from"] and res.states["wiring_checked"] is True
    assert res.states["has_loss_mask"] is True  # from speculators' dataset beside the files
    # the target's own next tokens, from its final norm and lm_head over the last slot
    from eagle3conv.states.vllm import VllmStates
    from eagle3conv.verify.inputs import load_target_head, load_target_norm, target_next_from_head

    vs = VllmStates(folder, vllm_ids=VLLM_IDS, num_layers=N_LAYERS)
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
