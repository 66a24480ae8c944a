"""Write mappings/engines/options/*.json: every launch option name a released engine wheel accepts.

The wheel is read, never imported (its dependencies need not be installed): the argument
definitions are parsed with ``ast``.

* SGLang 0.5.12: every ``add_argument("--name", ...)`` of ``srt/server_args.py``.
* SGLang 0.5.23: the fields of the ``arg_groups/fields/*.py`` namespace classes (``A[T, "help"]`` or
  ``A[T, Arg(...)]``; ``Arg(no_cli=True)`` has no option; the name is ``Arg.cli_name`` or
  ``--`` + the field name with ``-`` for ``_``, plus ``Arg.aliases``), as
  ``arg_utils.add_cli_args_from_dataclass`` registers them, plus the options
  ``ServerArgs.add_cli_args`` (server_args.py) adds by hand.
* vLLM 0.33.0: every ``add_argument("--name", ...)`` of ``engine/arg_utils.py`` (EngineArgs) and
  ``entrypoints/common/cli_args.py`` (``vllm serve``'s own), the ``--field-name`` options
  ``BaseFrontendArgs.add_cli_args`` makes from the fields of its dataclasses, and the keys of
  ``SpeculativeConfig`` (``config/speculative.py``), which ``--speculative-config`` accepts
  (the class forbids any other key: ``config/utils.py``).

Usage (the wheels from ``pip download --no-deps sglang==0.5.23 vllm==0.33.0 -d /tmp/wheels``)::

    python scripts/read_launch_options.py /tmp/wheels/sglang-0.5.23-*.whl /tmp/wheels/vllm-0.33.0-*.whl
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "mappings" / "engines" / "options"


def _const(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None


def _arg_keywords(meta: ast.AST) -> dict:
    if isinstance(meta, ast.Call) and getattr(meta.func, "id", None) == "Arg":
        return {k.arg: k.value for k in meta.keywords if k.arg}
    return {}


def sglang_options(wheel: zipfile.ZipFile) -> dict[str, str]:
    """option name -> where it is defined (file:line inside the wheel)."""
    out: dict[str, str] = {}
    base = "sglang/srt/arg_groups/fields/"
    if not any(n.startswith(base) for n in wheel.namelist()):  # before the namespaces (0.5.12): add_argument calls
        name = "sglang/srt/server_args.py"
        _add_argument_names(ast.parse(wheel.read(name)), name, out)
        return out
    for name in sorted(n for n in wheel.namelist() if n.startswith(base) and n.endswith(".py")):
        tree = ast.parse(wheel.read(name))
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            if not any(isinstance(s, ast.Assign) and any(getattr(t, "id", "") == "_NS_PATH" for t in s.targets)
                       for s in cls.body):
                continue
            for stmt in cls.body:
                if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
                    continue
                ann = stmt.annotation
                if not (isinstance(ann, ast.Subscript) and getattr(ann.value, "id", None) == "A"):
                    continue
                elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
                if len(elts) < 2:
                    continue
                meta = elts[1]
                kw = _arg_keywords(meta)
                if not kw and not (isinstance(meta, ast.Constant) and isinstance(meta.value, str)):
                    continue  # no Arg: not registered (add_cli_args_from_dataclass skips it)
                if kw.get("no_cli") is not None and _const(kw["no_cli"]) is True:
                    continue
                field = stmt.target.id
                cli = _const(kw["cli_name"]) if "cli_name" in kw else "--" + field.replace("_", "-")
                where = f"{name}:{stmt.lineno}"
                out.setdefault(cli, where)
                for alias in (_const(kw["aliases"]) if "aliases" in kw else None) or []:
                    out.setdefault(alias, where)
    name = "sglang/srt/server_args.py"
    tree = ast.parse(wheel.read(name))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "add_cli_args":
            _add_argument_names(node, name, out)
    return out


def _add_argument_names(tree: ast.AST, name: str, out: dict[str, str]) -> None:
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "add_argument":
            for a in call.args:
                v = _const(a)
                if isinstance(v, str) and v.startswith("-"):
                    out.setdefault(v, f"{name}:{call.lineno}")


def _dataclass_fields(tree: ast.AST, classes: set[str]) -> list[tuple[str, int]]:
    fields = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name in classes):
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) \
                    and not stmt.target.id.startswith("_"):
                fields.append((stmt.target.id, stmt.lineno))
    return fields


def vllm_options(wheel: zipfile.ZipFile) -> tuple[dict[str, str], dict[str, str]]:
    """(``vllm serve`` option -> file:line, ``--speculative-config`` key -> file:line)."""
    serve: dict[str, str] = {}
    name = "vllm/engine/arg_utils.py"
    _add_argument_names(ast.parse(wheel.read(name)), name, serve)
    name = "vllm/entrypoints/common/cli_args.py"
    tree = ast.parse(wheel.read(name))
    _add_argument_names(tree, name, serve)
    for field, line in _dataclass_fields(tree, {"BaseFrontendArgs", "FrontendArgs"}):
        serve.setdefault("--" + field.replace("_", "-"), f"{name}:{line}")
    spec: dict[str, str] = {}
    name = "vllm/config/speculative.py"
    for field, line in _dataclass_fields(ast.parse(wheel.read(name)), {"SpeculativeConfig"}):
        spec.setdefault(field, f"{name}:{line}")
    return serve, spec


def _version(path: str, package: str) -> str:
    m = re.search(rf"{package}-([0-9][^-]*)-", Path(path).name)
    if not m:
        raise SystemExit(f"{path}: not a {package} wheel")
    return m.group(1)


def write(engine: str, release: str, options: dict[str, str], keys: dict[str, str] | None, how: str) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    doc = {"schema": 1, "engine": engine, "release": release, "read_by": "scripts/read_launch_options.py",
           "how": how, "options": dict(sorted(options.items()))}
    if keys is not None:
        doc["speculative_config_keys"] = dict(sorted(keys.items()))
    path = OUT / f"{engine}-{release}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def main(argv: list[str]) -> None:
    for path in argv:
        with zipfile.ZipFile(path) as wheel:
            if Path(path).name.startswith("sglang-"):
                release = _version(path, "sglang")
                p = write("sglang", release, sglang_options(wheel), None,
                          "the fields of sglang/srt/arg_groups/fields/*.py as add_cli_args_from_dataclass registers "
                          "them, and server_args.py ServerArgs.add_cli_args's own add_argument calls")
            elif Path(path).name.startswith("vllm-"):
                release = _version(path, "vllm")
                serve, keys = vllm_options(wheel)
                p = write("vllm", release, serve, keys,
                          "add_argument calls of vllm/engine/arg_utils.py and vllm/entrypoints/common/cli_args.py, "
                          "the FrontendArgs fields, and the SpeculativeConfig fields of vllm/config/speculative.py")
            else:
                raise SystemExit(f"{path}: not an sglang or vllm wheel")
        print(f"wrote {p}")


if __name__ == "__main__":
    main(sys.argv[1:])
