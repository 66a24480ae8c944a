"""Training records: every reader, the metadata file's schema, and the seed incident."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from eagle3conv.checkpoint.index import open_checkpoint
from eagle3conv.errors import CheckpointReadError, UsageError, WiringError
from eagle3conv.example import write_example
from eagle3conv.spec.layers import EMBEDDING, outputs
from eagle3conv.wiring.metadata import (
    METADATA_FILE,
    TrainingRecord,
    find_training_record,
    from_config,
    from_dump_manifest,
    from_metadata_file,
    from_specforge_state,
    from_user,
    norm_stats,
    write_metadata_file,
)

KIMI = 61


def _incident_record(**kw) -> TrainingRecord:
    base = dict(
        layers=outputs(2, 30, 58),
        source="dumped at the input of layers 3, 31, 59",
        convention="captured-at-input",
        raw_ids=[3, 31, 59],
        target="moonshotai/Kimi-K2.5",
        draft_vocab_size=32000,
        norms={"slots": [{"median": 10.0, "p10": 8.0, "p90": 12.0},
                         {"median": 40.0, "p10": 30.0, "p90": 50.0},
                         {"median": 90.0, "p10": 70.0, "p90": 120.0}]},
        tokens=4096,
        includes_embedding=False,
    )
    base.update(kw)
    return TrainingRecord(**base)


def _write(tmp_path: Path, obj) -> Path:
    p = tmp_path / METADATA_FILE
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


# --------------------------------------------------------------------------- metadata file


def test_incident_metadata_input_of_3_31_59_is_outputs_2_30_58(tmp_path):
    p = _write(tmp_path, {
        "format": "eagle3conv-training-metadata", "version": 1, "target": "moonshotai/Kimi-K2.5",
        "layers": [{"output_of": 2}, {"output_of": 30}, {"output_of": 58}],
        "convention": "captured-at-input", "raw_ids": [3, 31, 59], "includes_embedding": False,
    })
    rec = from_metadata_file(p)
    assert rec.layers == outputs(2, 30, 58)
    assert EMBEDDING not in rec.layers and rec.includes_embedding is False
    assert rec.convention == "captured-at-input" and rec.raw_ids == [3, 31, 59]
    assert "outputs of layers 2, 30, 58" in rec.describe()


def test_metadata_round_trip(tmp_path):
    rec = _incident_record()
    path = write_metadata_file(tmp_path, rec)
    assert path == tmp_path / METADATA_FILE
    back = from_metadata_file(path)
    assert back.layers == rec.layers
    assert (back.convention, back.raw_ids, back.target) == ("captured-at-input", [3, 31, 59], rec.target)
    assert (back.draft_vocab_size, back.tokens, back.includes_embedding) == (32000, 4096, False)
    assert back.norms["slots"] == rec.norms["slots"]
    assert "position 0 excluded" in back.norms["statistic"]
    # the folder works as well as the file; a folder without one gives None
    assert from_metadata_file(tmp_path).layers == rec.layers
    empty = tmp_path / "empty"
    empty.mkdir()
    assert from_metadata_file(empty) is None


def test_write_fills_raw_ids_from_convention(tmp_path):
    rec = TrainingRecord(layers=outputs(2, 30, 58), source="t", convention="input")
    back = from_metadata_file(write_metadata_file(tmp_path / "m.json", rec))
    assert back.raw_ids == [3, 31, 59] and back.includes_embedding is False


def test_write_refuses_record_without_layers(tmp_path):
    with pytest.raises(UsageError, match="without layers"):
        write_metadata_file(tmp_path / "m.json", TrainingRecord(layers=None, source="x"))


def test_write_refuses_contradicting_raw_ids(tmp_path):
    with pytest.raises(WiringError, match="raw_ids"):
        write_metadata_file(tmp_path / "m.json", _incident_record(raw_ids=[2, 30, 58]))


GOOD = {
    "format": "eagle3conv-training-metadata", "version": 1,
    "layers": [{"output_of": 2}, {"output_of": 30}, {"output_of": 58}],
}


@pytest.mark.parametrize(
    "obj, error, field",
    [
        ("{not json", CheckpointReadError, "not valid JSON"),
        ([1, 2], CheckpointReadError, "JSON object"),
        ({**GOOD, "format": "other"}, CheckpointReadError, "'format'"),
        ({**GOOD, "version": 2}, CheckpointReadError, "'version'"),
        ({**GOOD, "version": "1"}, CheckpointReadError, "'version'"),
        ({k: v for k, v in GOOD.items() if k != "layers"}, CheckpointReadError, "'layers'"),
        ({**GOOD, "layers": []}, CheckpointReadError, "'layers'"),
        ({**GOOD, "layers": [2, 30, 58]}, CheckpointReadError, r"'layers\[0\]'"),
        ({**GOOD, "layers": [{"output_of": -2}]}, CheckpointReadError, r"'layers\[0\]'"),
        ({**GOOD, "layers": [{"output_of": 2}, {"output_of": 2}]}, WiringError, "'layers'"),
        ({**GOOD, "convention": "sglang"}, CheckpointReadError, "'convention'"),
        ({**GOOD, "convention": "captured-at-input", "raw_ids": [2, 30, 58]}, WiringError, "'raw_ids'"),
        ({**GOOD, "raw_ids": [3, 31]}, WiringError, "'raw_ids'"),
        ({**GOOD, "raw_ids": "3,31,59"}, CheckpointReadError, "'raw_ids'"),
        ({**GOOD, "includes_embedding": True}, WiringError, "'includes_embedding'"),
        ({**GOOD, "includes_embedding": "no"}, CheckpointReadError, "'includes_embedding'"),
        ({**GOOD, "tokens": -1}, CheckpointReadError, "'tokens'"),
        ({**GOOD, "tokens": 1.5}, CheckpointReadError, "'tokens'"),
        ({**GOOD, "draft_vocab_size": 0}, CheckpointReadError, "'draft_vocab_size'"),
        ({**GOOD, "target": 5}, CheckpointReadError, "'target'"),
        ({**GOOD, "norms": {"slots": [{"median": 1, "p10": 0, "p90": 2}]}}, WiringError, "'norms.slots'"),
        ({**GOOD, "norms": {"slots": [{"median": 1, "p10": 0, "p90": 2}] * 2 + [{"median": 1}]}},
         CheckpointReadError, r"'norms.slots\[2\].p10'"),
        ({**GOOD, "norms": {"slots": [{"median": 5, "p10": 6, "p90": 7}] * 3}},
         CheckpointReadError, r"p10 <= median <= p90"),
        ({**GOOD, "norms": [1, 2, 3]}, CheckpointReadError, "'norms'"),
    ],
)
def test_malformed_metadata_names_the_field(tmp_path, obj, error, field):
    p = _write(tmp_path, obj)
    with pytest.raises(error, match=field) as info:
        from_metadata_file(p)
    assert str(p) in info.value.message


def test_embedding_in_metadata(tmp_path):
    p = _write(tmp_path, {**GOOD, "layers": [{"output_of": -1}, {"output_of": 2}, {"output_of": 30}],
                          "convention": "output", "raw_ids": [-1, 2, 30], "includes_embedding": True})
    rec = from_metadata_file(p)
    assert rec.layers == (EMBEDDING, *outputs(2, 30)) and rec.includes_embedding is True


# --------------------------------------------------------------------------- SpecForge


def test_specforge_runtime_example_via_open_checkpoint(tmp_path):
    index = open_checkpoint(write_example(tmp_path / "sf", "specforge-runtime"))
    rec = from_specforge_state(index.extras)
    assert rec.layers == outputs(1, 14, 26)
    assert rec.convention == "output" and rec.raw_ids == [1, 14, 26]
    assert rec.target == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "capture_layers" in rec.source and rec.includes_embedding is False
    found = find_training_record(index.root, index.extras, index.config)
    assert found[0].layers == outputs(1, 14, 26)
    # config.json's nested ids are not recognisably Model Optimizer's: numbering unknown
    assert found[-1].layers is None and found[-1].raw_ids == [1, 14, 26]
    assert "unknown" in found[-1].source


def test_specforge_provenance_dict_and_args():
    rec = from_specforge_state({"specforge_model_provenance": {"capture_layers": [1, 29, 57], "target_model": "k"}})
    assert rec.layers == outputs(1, 29, 57) and rec.target == "k"
    ns = argparse.Namespace(aux_hidden_states_layers=[1, 15, 27], target_model_path="t")
    rec = from_specforge_state({"args": ns})
    assert rec.layers == outputs(1, 15, 27) and rec.target == "t" and "args.aux_hidden_states_layers" in rec.source
    rec = from_specforge_state({"args": {"capture_layers": [2, 3, 4]}})
    assert rec.layers == outputs(2, 3, 4)


def test_specforge_nothing_recorded():
    assert from_specforge_state({}) is None
    assert from_specforge_state({"args": argparse.Namespace(lr=1e-4)}) is None
    rec = from_specforge_state({"specforge_model_provenance": [["target_model", "x"]]})
    assert rec.layers is None and rec.target == "x" and "offline" in rec.source


def test_specforge_malformed_provenance():
    with pytest.raises(CheckpointReadError, match="capture_layers"):
        from_specforge_state({"specforge_model_provenance": [["capture_layers", "1,2"]]})
    with pytest.raises(CheckpointReadError, match="pairs"):
        from_specforge_state({"specforge_model_provenance": [["capture_layers"]]})


# --------------------------------------------------------------------------- config


def _example_config(tmp_path, fmt):
    return json.loads((write_example(tmp_path / fmt, fmt) / "config.json").read_text())


def test_config_modelopt_training(tmp_path):
    rec = from_config(_example_config(tmp_path, "modelopt-train"))
    assert rec.layers == outputs(1, 14, 26) and rec.convention == "output"
    assert "Model Optimizer training" in rec.source and rec.draft_vocab_size == 2048


def test_config_modelopt_export_flag():
    rec = from_config({"architectures": ["LlamaForCausalLMEagle3"],
                       "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57], "use_last_layernorm": True}})
    assert rec.layers == outputs(1, 29, 57) and "use_last_layernorm" in rec.source


def test_config_unknown_nested_numbering(tmp_path):
    rec = from_config(_example_config(tmp_path, "modelopt-export"))
    assert rec.layers is None and rec.convention is None and rec.raw_ids == [1, 14, 26]
    assert "numbering unknown" in rec.source


def test_config_speculators_is_input_numbering(tmp_path):
    rec = from_config(_example_config(tmp_path, "speculators"))
    assert rec.convention == "input" and rec.raw_ids == [2, 15, 27]
    assert rec.layers == outputs(1, 14, 26)
    assert rec.target == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_config_nothing(tmp_path):
    assert from_config(None) is None
    assert from_config(_example_config(tmp_path, "angelslim")) is None


def test_config_modelopt_training_out_of_range():
    cfg = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30,
           "eagle_config": {"hidden_size": 64, "eagle_aux_hidden_state_layer_ids": [1, 14, 30]}}
    with pytest.raises(WiringError, match="eagle_config.eagle_aux_hidden_state_layer_ids"):
        from_config(cfg)


# --------------------------------------------------------------------------- dumps


def _dumps(folder: Path, scales=(1.0, 5.0, 20.0), tokens=9, width=8):
    folder.mkdir()
    g = torch.Generator().manual_seed(0)
    for slot, s in enumerate(scales):
        x = torch.randn(tokens, width, generator=g) * s
        x[0] *= 1000  # position 0 is an outlier: the statistics leave it out
        torch.save(x, folder / f"aux_{slot}.pt")
    return folder


def test_dump_manifest_incident(tmp_path):
    d = _dumps(tmp_path / "d")
    (d / "manifest.json").write_text(json.dumps({"captured_at_input_of": [3, 31, 59], "target": "kimi-k2.5"}))
    rec = from_dump_manifest(d, with_norms=True)
    assert rec.layers == outputs(2, 30, 58) and rec.convention == "captured-at-input"
    assert rec.raw_ids == [3, 31, 59] and rec.target == "kimi-k2.5" and rec.includes_embedding is False
    med = [s["median"] for s in rec.norms["slots"]]
    assert med == sorted(med) and med[-1] < 1000  # position 0 excluded
    assert rec.tokens == 8


def test_dump_without_manifest(tmp_path):
    rec = from_dump_manifest(_dumps(tmp_path / "d"))
    assert rec.layers is None and rec.raw_ids is None and "not recorded" in rec.source
    empty = tmp_path / "e"
    empty.mkdir()
    assert from_dump_manifest(empty) is None


def test_dump_manifest_errors(tmp_path):
    d = _dumps(tmp_path / "d")
    (d / "manifest.json").write_text(json.dumps({"captured_at_input_of": [3, 31]}))
    with pytest.raises(WiringError, match="3 aux_<slot>.pt files"):
        from_dump_manifest(d)
    (d / "manifest.json").write_text(json.dumps({"target": "x"}))
    with pytest.raises(CheckpointReadError, match="captured_at_input_of"):
        from_dump_manifest(d)
    (d / "manifest.json").write_text("[")
    with pytest.raises(CheckpointReadError, match="not valid JSON"):
        from_dump_manifest(d)
    (d / "aux_1.pt").unlink()
    (d / "manifest.json").unlink()
    with pytest.raises(CheckpointReadError, match="aux_0.pt"):
        from_dump_manifest(d)


def test_norm_stats_skips_position_zero():
    x = torch.ones(5, 4)
    x[0] = 100.0
    s = norm_stats(x)
    assert s == {"median": 2.0, "p10": 2.0, "p90": 2.0, "tokens": 4}


# --------------------------------------------------------------------------- user


def test_from_user_input_and_output():
    rec = from_user("3,31,59", "input", KIMI)
    assert rec.layers == outputs(2, 30, 58) and rec.convention == "input"
    assert "--captured-at input" in rec.source
    assert from_user("[2, 30, 58]", "output", KIMI).layers == outputs(2, 30, 58)
    assert from_user("0,2,30", "input").layers == (EMBEDDING, *outputs(1, 29))


def test_from_user_errors():
    with pytest.raises(UsageError, match="--captured-at"):
        from_user("3,31,59", "middle", KIMI)
    with pytest.raises(UsageError):
        from_user("a,b", "input", KIMI)
    with pytest.raises(WiringError):
        from_user("3,31,62", "input", KIMI)


# --------------------------------------------------------------------------- all


def test_find_metadata_file_first(tmp_path):
    root = write_example(tmp_path / "sf", "specforge-runtime")
    write_metadata_file(root, TrainingRecord(layers=outputs(1, 14, 26), source="test", convention="output"))
    index = open_checkpoint(root)
    found = find_training_record(index.root, index.extras, index.config)
    assert [r.source.split(" ")[0].rstrip(",") for r in found][:2] == [METADATA_FILE, "training_state.pt"]
    assert found[0].layers == found[1].layers == outputs(1, 14, 26)


def test_find_nothing(tmp_path):
    assert find_training_record(None, None, None) == []
    assert find_training_record(tmp_path, {}, {}) == []
