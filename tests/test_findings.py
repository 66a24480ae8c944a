"""Typed findings: decisions read a finding's level, area and code (and a training
record's kind), never the wording of a message or a record's description.

Every decision path is run twice on real checkpoints, once as written and once with
every message and every record description reworded (prefixed with a label that
the old code branched on, and reversed), and must decide the same way.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import PICO, snapshot
from eagle3conv import findings
from eagle3conv.cli import main
from eagle3conv.example import write_example
from eagle3conv.findings import CODES, CONFLICTS, Finding
from eagle3conv.wiring.metadata import TrainingRecord

PACKAGE = Path(findings.__file__).parent
TARGET = "org/pico-target"
NESTED = "eagle_config.eagle_aux_hidden_state_layer_ids"


# --------------------------------------------------------------------------- rewording


def _reword(text: str) -> str:
    # starts with the label the old code split errors on, and the description prefixes
    # it re-ordered records by; the rest reversed so no phrase survives
    return "aux layers: config.json training_metadata REWORDED " + text[::-1]


@pytest.fixture(params=["as-written", "reworded"])
def wording(request, monkeypatch):
    """Run the test as written, then with every Finding message/fix and every
    TrainingRecord source reworded at construction."""
    if request.param == "reworded":
        post_init = Finding.__post_init__

        def reworded_finding(self):
            post_init(self)
            object.__setattr__(self, "message", _reword(self.message))
            if self.fix is not None:
                object.__setattr__(self, "fix", _reword(self.fix))

        init = TrainingRecord.__init__

        def reworded_record(self, *args, **kw):
            init(self, *args, **kw)
            if not self.source.startswith("aux layers: "):  # records are copied with their source
                object.__setattr__(self, "source", _reword(self.source))

        monkeypatch.setattr(Finding, "__post_init__", reworded_finding)
        monkeypatch.setattr(TrainingRecord, "__init__", reworded_record)
    return request.param


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def canonical(root: Path) -> Path:
    """The example drafter made canonical by fix-keys, with the training record beside it."""
    from eagle3conv.api import fix_keys
    from eagle3conv.wiring.metadata import from_user, write_metadata_file

    write_example(root, "modelopt-export", PICO)
    rec = dataclasses.replace(from_user("2,15,27", "input"), target=TARGET, draft_vocab_size=PICO.draft_vocab)
    write_metadata_file(root, rec)
    fix_keys(root)
    return root


def set_ids(ckpt: Path, nested, top) -> None:
    p = ckpt / "config.json"
    cfg = json.loads(p.read_text())
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": nested, "use_aux_hidden_state": True}
    cfg["eagle_aux_hidden_state_layer_ids"] = top
    p.write_text(json.dumps(cfg))


def add_unmapped_key(ckpt: Path) -> None:
    from safetensors.torch import load_file, save_file

    t = load_file(ckpt / "model.safetensors")
    t["extra.weight"] = t["fc.weight"].clone()
    save_file(t, ckpt / "model.safetensors", metadata={"format": "pt"})


# --------------------------------------------------------------------------- the type


def test_rewording_takes_effect(wording):
    f = Finding("error", "keys", findings.UNMAPPED_KEY, "x.weight: unmapped")
    assert (f.message == "x.weight: unmapped") == (wording == "as-written")


def test_undeclared_codes_levels_and_areas_are_refused():
    with pytest.raises(ValueError, match="not declared"):
        Finding("error", "keys", "unmaped-key", "typo")
    with pytest.raises(ValueError, match="level"):
        Finding("fatal", "keys", findings.UNMAPPED_KEY, "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="area"):
        Finding("error", "weights", findings.UNMAPPED_KEY, "x")  # type: ignore[arg-type]
    f = Finding("warning", "aux-layers", findings.NO_IDS, "m", "fix it")
    assert f.ok and f.to_dict() == {"level": "warning", "area": "aux-layers", "code": "no-ids", "message": "m",
                                    "fix": "fix it", "subject": None}
    assert findings.errors([f]) == [] and findings.warnings([f]) == [f]
    assert findings.by_area([f], "keys") == [] and findings.with_code([f], "no-ids") == [f]


def test_findings_module_imports_nothing_from_the_package():
    tree = ast.parse((PACKAGE / "findings.py").read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m and m.startswith("eagle3conv")]


# Calls that construct a Finding, and the position of their ``code`` argument.
_CODE_ARG = {"Finding": 2, "_f": 1, "_add": 1, "problem": 0}


def _code_args(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        if fn not in _CODE_ARG:
            continue
        kw = {k.arg: k.value for k in node.keywords}
        pos = _CODE_ARG[fn]
        arg = kw.get("code", node.args[pos] if len(node.args) > pos else None)
        yield fn, node.lineno, arg


def test_every_code_the_package_emits_is_declared():
    seen: set[str] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "findings.py":
            continue
        for fn, line, arg in _code_args(path):
            where = f"{path.relative_to(PACKAGE)}:{line} {fn}(...)"
            if fn == "problem" and not isinstance(arg, ast.Name):
                continue  # not a finding helper here
            # a code is a constant imported from eagle3conv.findings: a typo is an import error
            assert isinstance(arg, ast.Name), f"{where}: code must be a constant from eagle3conv.findings"
            if arg.id == "code":  # a helper passing its own parameter on
                continue
            assert arg.id.isupper() and getattr(findings, arg.id, None) in CODES, f"{where}: {arg.id} is not declared"
            seen.add(getattr(findings, arg.id))
    # the wiring check emits every one of its codes through declared constants
    check_codes = {getattr(findings, n.id) for n in ast.walk(ast.parse((PACKAGE / "wiring" / "check.py").read_text()))
                   if isinstance(n, ast.Name) and n.id.isupper() and getattr(findings, n.id, None) in CODES}
    assert len(check_codes) >= 15 and check_codes <= CODES
    assert CONFLICTS <= check_codes
    assert len(seen) >= 50


def test_conflict_codes_are_the_declared_ones():
    from eagle3conv.wiring import apply

    assert apply.CONFLICTS is CONFLICTS
    assert CONFLICTS == {findings.DISAGREES_WITH_TRAINING, findings.RECORDS_DISAGREE}


# --------------------------------------------------------------------------- decisions, reworded


def test_fix_keys_tells_a_wiring_conflict_from_key_errors(wording, make_ckpt):
    incident = make_ckpt("sglang", aux_ids=(-1, 2, 30))  # SGLang cannot capture the embedding output
    from eagle3conv.spec.layers import outputs
    from eagle3conv.wiring.metadata import write_metadata_file

    write_metadata_file(incident, TrainingRecord(layers=outputs(1, 14, 26), source="dumps", convention="output",
                                                 raw_ids=[1, 14, 26], target=TARGET))
    before = snapshot(incident)
    res = run("fix-keys", incident, "--json")
    assert res.exit_code == 3, res.output
    d = json.loads(res.stdout)
    assert d["error"] == "WiringError"  # not InvalidCheckpointError: every error is an aux-layer one
    assert snapshot(incident) == before
    assert ("training captured outputs of layers 1, 14, 26" in d["message"]) == (wording == "as-written")

    keys = make_ckpt("sglang")
    add_unmapped_key(keys)
    res = run("fix-keys", keys, "--json")
    assert res.exit_code == 3, res.output
    d = json.loads(res.stdout)
    assert d["error"] == "InvalidCheckpointError"
    # a key error's text starts with the old wiring label when reworded: still a key error
    assert d["details"][0].startswith("aux layers: ") == (wording == "reworded")


def test_rewire_and_conversion_of_trainer_ids(wording, make_ckpt, tmp_path):
    ck = make_ckpt("sglang", aux_ids=(0, 13, 25))
    from eagle3conv.spec.layers import outputs
    from eagle3conv.wiring.metadata import write_metadata_file

    write_metadata_file(ck, TrainingRecord(layers=outputs(1, 14, 26), source="dumps", convention="output",
                                           raw_ids=[1, 14, 26], target=TARGET))
    assert run("fix-keys", ck, "--out", tmp_path / "refused").exit_code == 3
    assert not (tmp_path / "refused").exists()
    res = run("fix-keys", ck, "--rewire", "--out", tmp_path / "o")
    assert res.exit_code == 0, res.output
    cfg = json.loads((tmp_path / "o" / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]

    # Model Optimizer's nested ids, numbering known from the weights' names: the config record
    # is decoded through its field (config_field), not through its description
    mo = make_ckpt("modelopt-export")
    res = run("fix-keys", mo, "--out", tmp_path / "sf")
    assert res.exit_code == 0, res.output
    cfg = json.loads((tmp_path / "sf" / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert cfg["eagle3conv"]["aux_layers"]["layers"] == [{"output_of": 1}, {"output_of": 14}, {"output_of": 26}]


def test_config_check_exit_codes(wording, make_ckpt):
    ck = make_ckpt("sglang", aux_ids=(1, 14, 26))
    assert run("config", ck, "--check").exit_code == 0  # warnings only (no record)
    set_ids(ck, [-1, 14, 26], None)
    assert run("config", ck, "--check").exit_code == 3


def test_push_gate_passes_and_fails_by_area(wording, tmp_path):
    from eagle3conv.errors import InvalidCheckpointError
    from eagle3conv.publish import push

    good = canonical(tmp_path / "good")
    res = push(good, "org/drafter", dry_run=True, endpoint="http://127.0.0.1:9")
    assert [(c.name, c.ok) for c in res.checks] == [("aux-layers", True), ("canonical", True), ("smoke-test", True)]
    assert all(c.area == "gate" for c in res.checks)

    wired_wrong = canonical(tmp_path / "wired-wrong")
    set_ids(wired_wrong, [0, 13, 25], [1, 14, 26])  # contradicts training_metadata.json
    with pytest.raises(InvalidCheckpointError) as info:
        push(wired_wrong, "org/drafter", dry_run=True, endpoint="http://127.0.0.1:9")
    assert [d.split(":", 1)[0] for d in info.value.details] == ["aux-layers"]  # a wiring failure, no key failure

    extra = canonical(tmp_path / "extra-key")
    add_unmapped_key(extra)  # a key error
    with pytest.raises(InvalidCheckpointError) as info:
        push(extra, "org/drafter", dry_run=True, endpoint="http://127.0.0.1:9")
    # key errors, and no aux-layer failure (the old code told them apart by the text's first words)
    assert [d.split(":", 1)[0] for d in info.value.details] == ["canonical", "smoke-test"]
    forced = push(extra, "org/drafter", dry_run=True, force=True, endpoint="http://127.0.0.1:9")
    assert forced.forced and [c.name for c in forced.checks if not c.ok] == ["canonical", "smoke-test"]
    assert "FAILED: canonical" in forced.card


def test_card_orders_records_by_kind(wording, tmp_path):
    from eagle3conv.hub.card import gather_facts

    ck = canonical(tmp_path / "d")  # training_metadata.json + eagle3conv's provenance + the config's ids
    facts = gather_facts(ck, "org/drafter")
    assert [r.kind for r in facts.records] == ["metadata", "provenance"]  # the config's own ids left out
    assert facts.layers_trained and [r.output_of for r in facts.layers] == [1, 14, 26]
    (ck / "training_metadata.json").unlink()
    facts = gather_facts(ck, "org/drafter")
    assert [r.kind for r in facts.records] == ["provenance"]
    assert [r.output_of for r in facts.layers] == [1, 14, 26]


def test_smoke_findings_are_typed(wording, make_ckpt):
    import torch
    from safetensors.torch import load_file

    from eagle3conv.model.drafter import smoke_test

    ck = make_ckpt("sglang")
    cfg = json.loads((ck / "config.json").read_text())
    state = load_file(ck / "model.safetensors")
    assert smoke_test(cfg, state).ok
    state["fc.weight"] = torch.full_like(state["fc.weight"], float("nan"))
    r = smoke_test(cfg, state)
    assert not r.ok and {(f.area, f.code, f.subject) for f in r.findings} >= {
        ("smoke", findings.NONFINITE_LOGITS, "step 1"), ("smoke", findings.NONFINITE_HIDDEN, "step 1")}
    assert r.problems == tuple(f.message for f in r.findings)
