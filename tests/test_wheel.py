"""mappings/ ships inside the wheel: build one, install it (not editable) and load every mapping from it."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr
    (built,) = dist.glob("eagle3conv-*.whl")
    return built


@pytest.mark.slow
def test_mappings_load_from_an_installed_wheel(tmp_path, wheel):
    names = zipfile.ZipFile(wheel).namelist()
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "Provides-Extra: capture" in meta  # pip install 'eagle3conv[capture]' (README, Install)
    assert "gguf==0.19.0; extra == 'capture'" in meta and "accelerate==1.15.0; extra == 'capture'" in meta
    assert "eagle3conv/_mappings/engines/launch.json" in names
    assert "eagle3conv/_mappings/engines/options/sglang-0.5.23.json" in names
    assert "eagle3conv/_mappings/canonical.json" in names
    assert "eagle3conv/_mappings/variants.json" in names
    assert any(n.startswith("eagle3conv/_mappings/formats/") for n in names)
    assert any(n.startswith("eagle3conv/_mappings/targets/") for n in names)
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    probe = (
        "import eagle3conv, json\n"
        "from eagle3conv.io.data import data_root\n"
        "from eagle3conv.spec.formats import load_formats\n"
        "from eagle3conv.spec.canonical import load_canonical\n"
        "from eagle3conv.spec.targets import list_targets\n"
        "print(json.dumps({'pkg': eagle3conv.__file__, 'data': str(data_root()),"
        " 'formats': sorted(load_formats()[0]), 'arch': sorted(load_canonical()), 'targets': len(list_targets())}))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(site))
    r = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    import json

    got = json.loads(r.stdout)
    assert got["pkg"].startswith(str(site)), got
    assert got["data"] == str(site / "eagle3conv" / "_mappings")
    assert "modelopt-export" in got["formats"] and "speculators" in got["formats"]
    assert got["arch"] == ["llama", "mla"]
    assert got["targets"] >= 10


def test_every_extra_the_readme_installs_is_declared_with_the_pins_of_requirements_txt():
    """README's Install section: `pip install 'eagle3conv[capture]'` brings what capture needs (gguf, accelerate:
    transformers loads GGUF targets with them), pinned as requirements.txt pins them."""
    import re
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(r"pip install 'eagle3conv\[(\w+)\]'", readme))
    assert {"capture", "plot"} <= named and named <= set(extras), (named, sorted(extras))
    pins = dict(line.split("==") for line in (ROOT / "requirements.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    for req in extras["capture"]:
        name, version = req.split("==")
        assert pins.get(name) == version, req
    assert {r.split("==")[0] for r in extras["capture"]} == {"gguf", "accelerate"}


@pytest.mark.slow
def test_the_wheel_with_the_capture_extra_resolves_to_the_pinned_cpu_set(tmp_path, wheel):
    """`pip install 'eagle3conv[capture]'` as README's Install section says, resolved by pip itself (--dry-run,
    nothing installed; a fresh venv takes minutes, scripts/readme_commands.py runs every README command in one):
    it brings gguf and accelerate, torch exactly as pinned and no CUDA runtime (nvidia-*) on a machine whose
    index holds the CPU build (as setup.sh expects), and every pin of requirements.txt that it installs agrees."""
    import json

    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q", "--report",
                        str(report), f"{wheel}[capture]"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
           for i in json.loads(report.read_text())["install"]}
    assert {"gguf", "accelerate", "torch", "transformers", "safetensors", "click"} <= set(got), sorted(got)
    assert got["torch"].split("+")[0] == "2.13.0"
    assert not [n for n in got if n.startswith(("nvidia-", "triton"))], sorted(got)
    pins = dict(line.split("==") for line in (ROOT / "requirements.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    assert {n: (v, got[n]) for n, v in pins.items() if n in got and got[n].split("+")[0] != v} == {}


def test_capture_without_gguf_names_the_documented_extra(tmp_path, monkeypatch):
    """`pip install eagle3conv` without the extra, then capture on a GGUF target: the error says to install
    what README's Install section documents, `eagle3conv[capture]` (it said `pip install gguf==0.19.0`, and
    without accelerate, transformers' own 'cannot load the model')."""
    import importlib.util

    from eagle3conv.errors import Eagle3ConvError
    from eagle3conv.states.target_model import load_target_model

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    real = importlib.util.find_spec
    for missing, pin in (("gguf", "gguf==0.19.0"), ("accelerate", "accelerate==1.15.0")):
        # transformers 5.24 refuses a GGUF file without accelerate too ("accelerate is required when loading a
        # GGUF file", seen in a fresh venv without it)
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, m=missing: None if name == m
                            else real(name, *a))
        with pytest.raises(Eagle3ConvError) as e:
            load_target_model(gguf)
        assert f"'{missing}', which is not installed" in str(e.value)
        assert e.value.hint == f"pip install 'eagle3conv[capture]' (it brings {pin})"
