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
