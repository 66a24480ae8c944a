"""docs/extending.md's checklists, enforced: each test fails when one step of adding an engine release,
a target family, a target profile, a trainer format or a drafter architecture is forgotten."""

from __future__ import annotations

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
