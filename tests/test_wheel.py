"""mappings/ ships inside the wheel: build one, install it (not editable) and load every mapping from it."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mappings_load_from_an_installed_wheel(tmp_path):
    dist = tmp_path / "dist"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr
    (wheel,) = dist.glob("eagle3conv-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "eagle3conv/_mappings/canonical.json" in names
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
