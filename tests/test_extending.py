"""docs/extending.md's checklists, enforced: each test fails when one step of adding an engine release,
a target family, a target profile, a trainer format or a drafter architecture is forgotten."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from eagle3conv import model
from eagle3conv.example import EXAMPLE_FORMATS
from eagle3conv.spec import engines as E
from eagle3conv.spec.canonical import load_canonical
from eagle3conv.spec.engine_rules import DRAFTER_KINDS
from eagle3conv.spec.formats import format_names
from eagle3conv.spec.targets import list_targets

ROOT = Path(__file__).parents[1]
MAPPINGS = ROOT / "mappings"


def _section(doc: str, number: int) -> str:
    text = (ROOT / "docs" / doc).read_text()
    m = re.search(rf"^## §{number} .*?(?=^## §|\Z)", text, flags=re.M | re.S)
    assert m, f"docs/{doc} has no §{number}"
    return m.group(0)


def _engine_files() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((MAPPINGS / "engines").glob("*.json"))
            if p.stem not in ("families", "launch")}  # launch.json: the launch lines (spec/launch.py)


def test_the_checklists_name_files_that_exist():
    text = (ROOT / "docs" / "extending.md").read_text()
    paths = set(re.findall(r"`((?:eagle3conv|mappings|tests|docs|bench)/[\w./-]+?)`", text))
    assert len(paths) >= 12, paths
    missing = [p for p in sorted(paths) if "<" not in p and not (ROOT / p).exists()]
    assert not missing, missing


# --- an engine release ------------------------------------------------------------------------


@pytest.mark.parametrize("engine", [e for e, d in _engine_files().items() if d["releases"]])
def test_each_engines_first_and_last_release_read_are_in_the_facts(engine):
    releases = _engine_files()[engine]["releases"]
    facts = _section("facts.md", 9)
    for release in (releases[0], releases[-1]):
        assert re.search(rf"(?<![\d.]){re.escape(release)}(?![\d])", facts), (engine, release)


def test_the_readme_names_the_sglang_releases_the_alias_means():
    releases = _engine_files()["sglang"]["releases"]
    readme = (ROOT / "README.md").read_text()
    assert f"{releases[0]} and {releases[-1]} today" in readme


def _families() -> list[str]:
    return [f["name"] for f in json.loads((MAPPINGS / "engines" / "families.json").read_text())["families"]]


def test_every_release_resolves_a_rule_for_every_family_and_a_forward_for_every_drafter():
    families = _families()
    for engine, data in _engine_files().items():
        for release in data["releases"] or [None]:
            rel = E.parse_engine(engine if release is None else f"{engine}=={release}")
            for family in families:
                E.rule_for(rel, family)  # raises on a gap in the release ranges
            for kind in DRAFTER_KINDS:
                E.forward_rule(rel, kind)


# --- a target family and a target profile -----------------------------------------------------


def test_every_family_is_named_in_the_facts():
    families = _families()
    facts = _section("facts.md", 9)
    missing = [f for f in families if f"`{f}`" not in facts]
    assert not missing, missing


def test_every_target_profile_is_in_the_readme_and_the_facts_table():
    readme = (ROOT / "README.md").read_text()
    targets_paragraph = readme[readme.index("### `eagle3conv targets"):]
    targets_paragraph = targets_paragraph[:targets_paragraph.index("\n### ")]
    for profile in list_targets():
        assert profile.name in targets_paragraph, profile.name
        assert any(a in _section("facts.md", 7) for a in profile.architectures), profile.name


# --- a trainer format ---------------------------------------------------------------------------


def test_every_format_has_an_example_and_a_facts_row():
    trainers = _section("facts.md", 6)
    for name in format_names():
        assert name in EXAMPLE_FORMATS, f"{name}: no example writer in eagle3conv/example.py"
        assert f"`{name}`" in trainers, f"{name}: no row in docs/facts.md §6"


def test_every_format_is_in_the_golden_detection_table():
    from test_formats import DETECTION

    assert set(format_names()) <= set(DETECTION)


# --- a drafter architecture --------------------------------------------------------------------


def test_every_drafter_architecture_has_a_forward_and_engine_data():
    archs = set(load_canonical())
    assert archs == set(DRAFTER_KINDS) == set(model.FORWARDS)
    for key, forward in model.FORWARDS.items():
        drafter_cls, config_cls = forward()
        assert hasattr(config_cls, "from_config") and callable(drafter_cls), key


# --- a drafter variant (a switch) --------------------------------------------------------------

from eagle3conv.errors import MappingFileError  # noqa: E402
from eagle3conv.spec.canonical import SYMBOLS, load_canonical_file  # noqa: E402
from eagle3conv.spec.engine_rules import load_engine_file, load_families_file  # noqa: E402
from eagle3conv.spec.variants import Handling, load_switches, switches  # noqa: E402

# where a switch's name may stand as a string literal outside spec/ and model/ (the ast scan below):
# example.py writes other tools' files (trainer configs) in their own field names
SPELLED_ELSEWHERE = {
    "eagle3conv/example.py": None,
}


def _variants_raw() -> dict:
    return json.loads((MAPPINGS / "variants.json").read_text())


def test_every_switch_has_a_handling_in_every_forward_entry():
    table = switches()
    for engine, data in _engine_files().items():
        for i, entry in enumerate(data["forward"]):
            for s in table:
                if s.engine is None:  # no engine file records it: the table says why
                    assert s.engine_why, s.name
                    continue
                assert s.engine.field in entry, (engine, i, s.name)
                value = entry[s.engine.field]
                assert value is None or value in s.engine.values, (engine, i, s.name, value)
    for eng in E.engines().values():
        for fw in eng.forward:
            assert set(fw.switches) == {s for s in table if s.engine}, eng.name
            assert all(isinstance(h, Handling) for h in fw.switches.values())


def test_a_forward_entry_keeps_a_switchs_reading_only_as_its_handling():
    """The engine model reads a release's switch through ``Forward.switches`` (a Handling), never through a
    second copy of the data's text (``norm_before_residual``, ``layers`` and ``sliding_window`` were)."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(E.Forward)}
    assert not fields & {s.engine.field for s in switches() if s.engine}


def test_every_gated_tensor_names_a_switch():
    names = {s.name: s for s in switches()}
    canonical = json.loads((MAPPINGS / "canonical.json").read_text())
    gated = set()
    for arch, raw in canonical["architectures"].items():
        for row in raw["tensors"]:
            when = row.get("when")
            if when is None or when.lstrip("!") in SYMBOLS:
                continue
            assert when in names, (arch, row["name"], when)
            assert row["name"] in names[when].tensors, (arch, row["name"], when)
            gated.add((row["name"], when))
        for v in raw.get("variant_architectures", []):
            assert v["when"] in names, (arch, v)
    assert {(t, s.name) for s in switches() for t in s.tensors} == gated


def _string_literals(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out[node.value] = out.get(node.value, 0) + 1
    return out


def test_no_module_outside_spec_and_model_spells_a_switch_name():
    names = {s.name for s in switches()}
    found = {}
    for path in sorted((ROOT / "eagle3conv").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("eagle3conv/spec/", "eagle3conv/model/")):
            continue
        spelled = {k: n for k, n in _string_literals(path).items() if k in names}
        if spelled:
            found[rel] = spelled
    allowed = {k: v for k, v in SPELLED_ELSEWHERE.items() if v is not None}
    assert {k: v for k, v in found.items() if SPELLED_ELSEWHERE.get(k, 0) is not None} == allowed, \
        "ask spec/ (DrafterSpec.switches, spec.variants.switch) instead of spelling a switch's name"


def test_the_scan_sees_a_switch_name_spelled_in_a_module(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('def f(cfg):\n    return cfg.get("norm_before_fc")\n')
    assert _string_literals(module)["norm_before_fc"] == 1


def _table_with(tmp_path, **row) -> tuple:
    raw = _variants_raw()
    base = {"name": "new_norm", "on_when": {"flags": ["new_norm"]}, "tensors": [], "stage": "step1",
            "skippable": True, "words": "new_norm (a hypothetical norm)", "card": "new_norm", "fix_keys": None,
            "engine": {"field": "new_norm", "values": {"config": "honoured", "ignored": "ignored"}},
            "source": "a test"}
    raw["switches"].append({**base, **row})
    path = tmp_path / "variants.json"
    path.write_text(json.dumps(raw))
    return load_switches(path)


def test_a_new_switch_without_its_engine_entries_fails_loudly(tmp_path):
    table = _table_with(tmp_path)
    families = load_families_file(MAPPINGS / "engines" / "families.json")
    for stem in E.ENGINE_FILES:
        with pytest.raises(MappingFileError, match=r"missing fields \['new_norm'\]"):
            load_engine_file(MAPPINGS / "engines" / f"{stem}.json", families, table)
    # with its entry in every forward rule (here: not read), the engine file loads and says so
    for stem in E.ENGINE_FILES:
        raw = json.loads((MAPPINGS / "engines" / f"{stem}.json").read_text())
        for entry in raw["forward"]:
            entry["new_norm"] = None
        path = tmp_path / f"{stem}.json"
        path.write_text(json.dumps(raw))
        eng = load_engine_file(path, families, table)
        assert all(fw.handling("fc_norm") is not None for fw in eng.forward)
        assert {h for fw in eng.forward for s, h in fw.switches.items() if s.name == "new_norm"} == {Handling.NOT_READ}


def test_a_new_switch_gating_a_tensor_needs_its_canonical_rows(tmp_path):
    table = _table_with(tmp_path, tensors=["new_norm.weight"])
    with pytest.raises(MappingFileError, match="new_norm.weight"):
        load_canonical_file(MAPPINGS / "canonical.json", table)
    raw = json.loads((MAPPINGS / "canonical.json").read_text())
    raw["architectures"]["llama"]["tensors"].append(
        {"name": "new_norm.weight", "shape": ["H"], "required": True, "when": "new_norm_typo", "why": "a test"})
    path = tmp_path / "canonical.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(MappingFileError, match="new_norm_typo"):
        load_canonical_file(path, table)


@pytest.mark.parametrize("change, message", [
    ({"stage": "prefill"}, "'stage' must be one of"),
    ({"engine": {"field": "new_norm", "values": {"config": "kept"}}}, "engine 'values' must be among"),
    ({"engine": {"field": "new_norm", "values": {"refused": "refused"}}}, "needs its 'refused' sentence"),
    ({"engine": None}, "give 'engine'"),
    ({"name": "fc_norm"}, "declared twice"),
    ({"on_when": {"any_of": ["no_such_switch"]}}, "the table lacks"),
    ({"on_when": {"computed": "moon_phase"}}, "'computed' must be one of"),
    ({"tensors": ["input_norm.weight"]}, "gated by two switches"),
    ({"engine": {"field": "fc_norm", "values": {"config": "honoured"}}}, "same engine forward field"),
    ({"fix_keys": {"field": "bias", "why": "x"}}, "config fields in on_when"),
])
def test_the_variant_table_is_validated(tmp_path, change, message):
    with pytest.raises(MappingFileError, match=message):
        _table_with(tmp_path, **change)


def test_the_variant_checklist_is_in_extending():
    text = (ROOT / "docs" / "extending.md").read_text()
    m = re.search(r"^## A new drafter variant.*?(?=^## |\Z)", text, flags=re.M | re.S)
    assert m, "docs/extending.md has no 'A new drafter variant' checklist"
    for step in ("mappings/variants.json", "mappings/canonical.json", "mappings/engines/", "Handling",
                 "docs/facts.md", "tests/test_extending.py"):
        assert step in m.group(0), step


def test_a_launch_role_named_after_a_switch_says_what_it_is_needed_for():
    from eagle3conv.spec import launch

    raw = {"key": "parallel_drafting", "default": False, "why": "w", "source": "s"}
    with pytest.raises(MappingFileError, match="named after a switch"):
        launch.read_option("vllm", "parallel_drafting", raw)
    with pytest.raises(MappingFileError, match="named after a switch"):
        launch.read_option("vllm", "steps", {**raw, "needs": "n", "missing": "m"})
    role = launch.read_option("vllm", "parallel_drafting", {**raw, "needs": "{rel} n", "missing": "m {key}"})
    assert role.needs == "{rel} n"
    rule = launch.rule_for("vllm")
    assert [s.name for s, _ in rule.switch_roles()] == ["parallel_drafting"]


def test_every_computed_condition_is_computed():
    from eagle3conv.spec import drafter
    from eagle3conv.spec.variants import COMPUTED

    assert set(drafter.DIMENSIONAL_CONDITIONS) | {"sliding_window"} == set(COMPUTED)
    wide = drafter.DrafterSpec.from_config({"hidden_size": 192, "target_hidden_size": 64, "num_attention_heads": 4,
                                            "num_hidden_layers": 2, "layer_types": ["sliding_attention"] * 2,
                                            "sliding_window": 64}, validate=False)
    assert {s.on_when.computed for s in wide.switches} == set(COMPUTED)
    assert not {s.on_when.computed for s in wide.with_(k=2, L=1).switches} & set(drafter.DIMENSIONAL_CONDITIONS)


@pytest.mark.parametrize("value", [["fc_norm"], {"fields": [], "why": "w"}, {"fields": ["fc_norm", 3], "why": "w"},
                                   {"fields": ["fc_norm"]}])
def test_a_format_files_config_top_level_is_validated(tmp_path, value):
    from eagle3conv.spec.formats import load_format_file

    raw = json.loads((MAPPINGS / "formats" / "speculators.json").read_text())
    assert load_format_file(MAPPINGS / "formats" / "speculators.json").config_top_level == tuple(
        raw["config_top_level"]["fields"])
    raw["config_top_level"] = value
    path = tmp_path / "speculators.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(MappingFileError, match="config_top_level"):
        load_format_file(path)
@pytest.mark.parametrize("rename", [("d2t", "draft_to_target"), ("midlayer.", "layers.0.")])
def test_a_canonical_rename_in_the_data_without_the_code_fails_at_load(tmp_path, monkeypatch, rename):
    """The names the code spells (spec/canonical.py's constants) are checked against canonical.json's
    rows when it loads: renaming one in the data only is a MappingFileError naming it, not a loader
    that silently looks for a name no row has."""
    from eagle3conv.errors import MappingFileError
    from eagle3conv.spec import canonical

    old, new = rename
    text = (MAPPINGS / "canonical.json").read_text().replace(f'"{old}', f'"{new}')  # every row (and fused part) so named
    (tmp_path / "canonical.json").write_text(text)
    monkeypatch.setattr(canonical, "data_path", lambda *parts: tmp_path.joinpath(*parts))
    canonical.load_canonical.cache_clear()
    try:
        with pytest.raises(MappingFileError, match=re.escape(repr(old))):
            canonical.load_canonical()
    finally:
        canonical.load_canonical.cache_clear()


@pytest.mark.parametrize("kind", sorted(E.EXPLICIT_KINDS))
def test_every_id_rule_kind_has_its_inverse_in_ids_for(kind, monkeypatch):
    """docs/extending.md (a new engine release, step 7): for every wiring a rule kind can capture (found
    by trying every id list), ``ids_for`` finds ids that capture it; a kind whose inverse ids_for lacks
    makes config and fix-keys refuse with a false "no id list ... makes ... capture"."""
    import dataclasses
    import itertools

    from eagle3conv.spec.drafter import with_field
    from eagle3conv.spec.layers import LayerRef

    rel = E.as_release("sglang")
    rule = dataclasses.replace(E.rule_for(rel, None), explicit=kind, supported=True)
    monkeypatch.setattr(E, "rule_for", lambda engine, family: rule)
    n, interpret, field = 8, E.EXPLICIT_KINDS[kind], E.id_field(rel)
    assert field.in_config
    lost = []
    for outs in itertools.combinations(range(n - 1), 3):  # neither the embedding nor the last layer's output
        boundaries = tuple(o + 1 for o in outs)
        if not any(interpret(ids, n) == boundaries for ids in itertools.product(range(-1, n + 2), repeat=3)):
            continue  # no id list captures it under this kind: ids_for rightly finds none
        ids = E.ids_for(rel, None, n, [LayerRef(o) for o in outs])
        got = E.capture(rel, with_field({}, field.name, list(ids)), None, n).layers if ids is not None else None
        if got != tuple(LayerRef(o) for o in outs):
            lost.append((outs, ids, got))
    assert not lost, f"{kind}: ids_for finds no (or wrong) ids for wirings it can capture: {lost[:3]}"


def test_every_config_shape_a_format_may_name_has_its_builder():
    """docs/extending.md (a new trainer format, step 2): a ``config_from`` name the format loader accepts
    (spec/formats.py CONFIG_FROM) has its builder in checkpoint/config.py, and no builder is unreachable."""
    from eagle3conv.checkpoint.config import CONFIG_BUILDERS
    from eagle3conv.spec.formats import CONFIG_FROM

    assert set(CONFIG_BUILDERS) == set(CONFIG_FROM)
