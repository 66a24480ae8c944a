"""The folders match the import graph: packages in levels, no cycle, no upward import.

Every module of the package is parsed (nothing is imported or run), and every
import it makes -- at module level or inside a function, the lazy ones the CLI
uses to keep ``--help`` fast included -- is checked against the level table in
docs/architecture.md. A new edge that goes up a level fails here, in CI, instead
of waiting for a review.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "eagle3conv"

# unit -> the units it may import (besides itself). A unit is a subpackage or a
# top-level module. Kept in step with docs/architecture.md ("Levels").
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "version": set(),
    "findings": set(),
    "io": {"errors"},
    "spec": {"errors", "io", "findings"},
    "checkpoint": {"errors", "io", "spec", "findings"},
    "model": {"errors", "spec", "findings"},
    "wiring": {"errors", "version", "io", "spec", "findings", "checkpoint"},
    "states": {"errors", "version", "io", "spec", "wiring"},
    "verify": {"errors", "version", "io", "spec", "findings", "checkpoint", "model", "states", "wiring"},
    "hub": {"errors", "version", "io", "spec", "findings", "checkpoint", "model", "wiring", "verify"},
    "example": {"errors", "io", "spec"},
    "api": {"errors", "version", "io", "spec", "findings", "checkpoint", "model", "wiring", "states", "verify", "hub"},
    "publish": {"errors", "io", "spec", "findings", "checkpoint", "model", "wiring", "verify", "hub", "api"},
    "render": {"errors", "version", "io", "spec", "findings", "checkpoint", "wiring", "states", "verify", "hub", "api"},
    "cli": {"*"},
    "__main__": {"console"},
    "console": {"cli", "errors", "io"},  # the read-ahead validates headers with io/safetensors.py
    "__init__": {"*"},  # the lazy facade re-exports the public API
}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        yield path, ".".join(parts), is_pkg


def _imports(path: Path, module: str, is_pkg: bool):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_pkg:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield node.lineno, target
            if target == "eagle3conv":  # `from eagle3conv import x`: x is a unit
                for a in node.names:
                    yield node.lineno, f"eagle3conv.{a.name}"


def _edges():
    for path, module, is_pkg in _modules():
        src = _unit(module) if module != "eagle3conv" else "__init__"
        for line, target in _imports(path, module, is_pkg):
            if not target.startswith("eagle3conv.") :
                continue
            yield src, _unit(target), f"{path.relative_to(PKG.parent)}:{line} imports {target}"


def test_every_unit_has_a_level():
    units = {_unit(m) if m != "eagle3conv" else "__init__" for _, m, _ in _modules()}
    assert units <= set(ALLOWED), f"add to ALLOWED and docs/architecture.md: {sorted(units - set(ALLOWED))}"


def test_no_import_goes_up_a_level():
    bad = [where for src, dst, where in _edges()
           if dst != src and "*" not in ALLOWED.get(src, set()) and dst not in ALLOWED.get(src, set())]
    assert not bad, "forbidden imports:\n" + "\n".join(bad)


def test_the_level_table_has_no_cycle():
    seen: dict[str, int] = {}

    def visit(u: str, stack: tuple[str, ...]) -> None:
        if seen.get(u) == 2:
            return
        assert seen.get(u) != 1, f"cycle: {' -> '.join(stack + (u,))}"
        seen[u] = 1
        for v in ALLOWED.get(u, set()) - {"*"}:
            visit(v, stack + (u,))
        seen[u] = 2

    for u in ALLOWED:
        visit(u, ())


def test_only_the_command_line_imports_click():
    bad = []
    for path, module, is_pkg in _modules():
        if module in ("eagle3conv.cli", "eagle3conv.console"):  # the command line and its entry point
            continue
        for line, target in _imports(path, module, is_pkg):
            if target == "click" or target.startswith("click."):
                bad.append(f"{path.relative_to(PKG.parent)}:{line}")
    assert not bad, bad


def test_no_private_name_crosses_a_module_boundary():
    """`from x import _name` between modules (tests and bench included) hides an API nobody owns."""
    roots = [PKG, PKG.parent / "tests", PKG.parent / "bench"]
    bad = []
    for root in roots:
        for path in root.rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("eagle3conv"):
                    if any(part.startswith("_") and not part.startswith("__") for part in node.module.split(".")):
                        bad.append(f"{path}:{node.lineno} from {node.module}")
                    for a in node.names:
                        if a.name.startswith("_") and not a.name.startswith("__"):
                            bad.append(f"{path}:{node.lineno} {a.name} from {node.module}")
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


# Private attributes tests and bench may still touch, each with its reason.
PRIVATE_ATTRIBUTE_EXCEPTIONS = {
    # the GPU benchmark swaps the drafter's own step internals for candidate rewrites, to time them
    ("bench/bench_verify_gpu.py", "_qkv"),
}


def _private_names_defined_in_package() -> set[str]:
    names: set[str] = set()
    for path, _, _ in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_tests_and_bench_use_no_private_attribute_of_the_package():
    """`drafter._rope(...)`, `meta._decode(...)`: a private name of the package reached through an
    object or module from tests/ or bench/ (anything but self/cls) is an API nobody owns."""
    private = _private_names_defined_in_package()
    root = PKG.parent
    bad = []
    for folder in (root / "tests", root / "bench"):
        for path in folder.rglob("*.py"):
            rel = path.relative_to(root).as_posix()
            # names this file defines itself (its own helpers and classes) are its own business
            own = _private_names_in(path)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Attribute) or node.attr not in private or node.attr in own:
                    continue
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                if (rel, node.attr) in PRIVATE_ATTRIBUTE_EXCEPTIONS:
                    continue
                bad.append(f"{rel}:{node.lineno} .{node.attr}")
    assert not bad, "private attributes of eagle3conv used from tests/bench:\n" + "\n".join(bad)


def _private_names_in(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
    return names


# --------------------------------------------------------------------------- one engine model, typed


def _string_constants(path: Path):
    """Every string literal of a module except docstrings: (line, text)."""
    tree = ast.parse(path.read_text(), str(path))
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docs.add(id(body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def test_the_aux_id_fields_are_spelled_in_one_module():
    """One reader and one writer of the aux-id fields (spec/drafter.py): no other module spells them,
    and that one at most three times (the engine rules name the fields in mappings/engines/)."""
    spelled = [(path.relative_to(PKG.parent), line) for path, _, _ in _modules()
               for line, text in _string_constants(path) if "eagle_aux_hidden_state_layer_ids" in text]
    assert len(spelled) <= 3 and {str(p) for p, _ in spelled} <= {"eagle3conv/spec/drafter.py"}, spelled


def test_a_switch_name_is_spelled_in_few_modules():
    """issue 27's measure of the variant table: ``norm_before_fc`` (12 modules before it) is spelled in at
    most three -- the table's reader (spec/drafter.py), the forward's maths (model/drafter.py) and the
    example's trainer naming; everything else takes it from the variant table."""
    spelled = sorted(str(path.relative_to(PKG.parent)) for path, _, _ in _modules()
                     if "norm_before_fc" in path.read_text())
    assert len(spelled) <= 3, spelled


def test_no_decision_reads_display_text():
    """Engine identity and the kind of id field are typed (EngineRelease, IdField): nothing turns a
    display label back into a release or asks a field name whether it is a launch option."""
    bad = []
    for path, _, _ in _modules():
        text = path.read_text()
        for needle in ('startswith("launch option', ".label.replace(", 'parse_engine(row[', "parse_engine(r["):
            if needle in text:
                bad.append(f"{path.relative_to(PKG.parent)}: {needle}")
    assert not bad, bad


# Verdicts are typed data (issue 27): a decision branches on codes and values, and the words for them are
# made in one place (verify/words.py, render.py), from those codes -- never stored and read back.
WORDS_MODULES = {"eagle3conv/verify/words.py", "eagle3conv/render.py"}


def _prose(text: str) -> bool:
    return len(text.split()) >= 3  # a phrase, not a code or a name


def test_no_decision_compares_prose():
    """No comparison anywhere in the package reads a phrase (``x == "the screen stopped ..."``,
    ``"no target next tokens" in note``), and verify's ``decide`` spells no sentence at all: its
    words are verify/words.py's, made from the verdict's codes and values."""
    bad = []
    for path, _, _ in _modules():
        tree = ast.parse(path.read_text(), str(path))
        phrases = {t.id for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                   and isinstance(n.value.value, str) and _prose(n.value.value)
                   for t in n.targets if isinstance(t, ast.Name)}  # CAPPED_WHY = "the screen stopped ..."
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                for c in (node.left, *node.comparators):
                    if (isinstance(c, ast.Constant) and isinstance(c.value, str) and _prose(c.value)) or (
                            isinstance(c, ast.Name) and c.id in phrases):
                        what = c.value[:40] if isinstance(c, ast.Constant) else c.id
                        bad.append(f"{path.relative_to(PKG.parent)}:{node.lineno} compares {what!r}")
    for rel, name in DECIDERS:
        tree = ast.parse((PKG.parent / rel).read_text())
        found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name.split(".")[-1]
                 and (name.count(".") == 0 or any(isinstance(c, ast.ClassDef) and c.name == name.split(".")[0]
                                                  and n in c.body for c in ast.walk(tree)))]
        assert len(found) == 1, (rel, name)
        body = found[0].body[1:] if ast.get_docstring(found[0]) else found[0].body  # its docstring aside
        for node in (n for stmt in body for n in ast.walk(stmt)):
            if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)
                                                   and _prose(node.value)):
                bad.append(f"{rel}:{node.lineno}: {name} spells words")
    assert not bad, bad


# the functions that decide a command's verdict: codes and values only, no sentence (render says them)
DECIDERS = (
    ("eagle3conv/verify/search.py", "decide"),
    ("eagle3conv/api.py", "ConfigResult.verdict"),
    ("eagle3conv/api.py", "TargetSummary.verdict"),
    ("eagle3conv/api.py", "TargetsResult.verdict"),
    ("eagle3conv/api.py", "FormatsResult.verdict"),
    ("eagle3conv/api.py", "LaunchResult.verdict"),
    ("eagle3conv/api.py", "ExampleResult.verdict"),
    ("eagle3conv/hub/push.py", "PushResult.verdict"),
    ("eagle3conv/states/capture.py", "capture_verdict"),
    ("eagle3conv/states/capture.py", "CaptureResult.verdict"),
    ("eagle3conv/states/vllm_capture.py", "VllmCapturePlan.verdict"),
    ("eagle3conv/verify/run.py", "SmokeResult.verdict"),
)


def test_verdicts_are_typed_and_every_code_has_words():
    """Each result's verdict is a frozen type of codes and values (what --json carries), and the words
    module says every code: a new reason, outcome or status without words fails here."""
    import dataclasses

    from eagle3conv.api import ConfigOutcome, ConfigVerdict
    from eagle3conv.checkpoint.plan import PlanOutcome, PlanVerdict
    from eagle3conv.findings import Finding
    from eagle3conv.render import config_verdict_words, plan_verdict_words
    from eagle3conv.verify.search import Coverage, Grounds, Separation, SeparationReason
    from eagle3conv.verify.words import SEPARATION_WHY
    from eagle3conv.wiring.apply import Wiring
    from eagle3conv.wiring.check import WiringReport

    for cls in (ConfigVerdict, PlanVerdict, Coverage, Grounds, Separation, WiringReport, Wiring):
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls
    assert set(SEPARATION_WHY) == {r.value for r in SeparationReason}
    err = Finding("error", "keys", "unmapped-key", "x.weight: unmapped")
    for o in ConfigOutcome:
        assert config_verdict_words(ConfigVerdict(o, "write", 0, 0, layers="outputs of layers 1, 2, 3"))
    for o in PlanOutcome:
        if o is not PlanOutcome.CANNOT_PLAN:  # inspect says its plan_error instead
            assert plan_verdict_words(PlanVerdict(o, 1, first_error=err))
    # targets, formats and capture (issue 27): a verdict each, typed; every code with its words
    from eagle3conv.api import (DefaultCapture, DefaultsOutcome, FormatsVerdict, ListOutcome, TargetsVerdict,
                                TargetSummary, TargetVerdict)
    from eagle3conv.render import capture_note_words, capture_verdict_words, targets_verdict_words
    from eagle3conv.states.capture import CaptureNote, CaptureOutcome, CaptureVerdict, capture_verdict

    for cls in (TargetVerdict, TargetsVerdict, TargetSummary, DefaultCapture, FormatsVerdict, CaptureVerdict):
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls
    for o in DefaultsOutcome:
        assert targets_verdict_words(TargetVerdict(o, ((1, 2, 3),), ("sglang 0.5.23",)))
    assert [o.value for o in ListOutcome] == ["listed"]  # formats decides nothing: it lists
    for o in CaptureOutcome:
        v = capture_verdict(o, layers=(-1, 1), num_layers=4, layers_asked=(1,), chat_template_asked=True,
                            chat_template_used=False, at_max_length=2, sequences=3, tokens=30, generated_tokens=0,
                            generate=0, max_length=10)
        assert capture_verdict_words(v) and set(v.notes) == set(CaptureNote)
        assert len(capture_note_words(v)) == len(CaptureNote)
    # launch, push and example (issue 27): a verdict each, typed; every code with its words
    from eagle3conv.api import ExampleOutcome, ExampleResult, ExampleVerdict, LaunchOutcome, LaunchVerdict
    from eagle3conv.hub.push import GateOutcome, PushOutcome, PushVerdict
    from eagle3conv.render import example_text, launch_verdict_words, push_done_words, push_verdict_words

    for cls in (LaunchVerdict, PushVerdict, ExampleVerdict, ExampleResult):
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls
    said = {launch_verdict_words(LaunchVerdict(o, 3, ("sglang 0.5.23",), "sglang 0.5.23", ("e",), 1))
            for o in LaunchOutcome}
    assert len(said) == len(LaunchOutcome) - 1  # served and cannot-serve share a sentence: "N of M serve"
    for words in (push_verdict_words, push_done_words):
        said = {words(PushVerdict(o, GateOutcome.PASSED, "me/d", commit="c", pr_url="u"))
                for o in PushOutcome if o is not PushOutcome.REFUSED}  # a refused push is an error: its message
        assert len(said) == len(PushOutcome) - 1 and all(said)
    said = {push_verdict_words(PushVerdict(PushOutcome.DRY_RUN, g, "me/d", ("smoke-test",)))
            for g in GateOutcome if g is not GateOutcome.FAILED}  # failed: the refusal, an error
    assert len(said) == len(GateOutcome) - 1
    assert [o.value for o in ExampleOutcome] == ["wrote"]  # example decides nothing: it writes the example
    # verify's smoke test (verify without states): its verdict typed, every outcome with its words
    from eagle3conv.render import smoke_verdict_words
    from eagle3conv.verify.run import SmokeOutcome, SmokeVerdict

    assert SmokeVerdict.__dataclass_params__.frozen
    assert len({smoke_verdict_words(SmokeVerdict(o)) for o in SmokeOutcome}) == len(SmokeOutcome)
    assert example_text(ExampleResult(Path("d"), "sglang")) == "wrote an example sglang drafter to d"


def test_render_spells_no_finding_code():
    """render.py reads finding codes through their owner (findings.py), and the verdicts' codes through their
    enums, never as literals."""
    import eagle3conv.findings as F
    from eagle3conv.api import ConfigOutcome, DefaultsOutcome, ExampleOutcome, LaunchOutcome, ListOutcome
    from eagle3conv.checkpoint.plan import PlanOutcome
    from eagle3conv.hub.push import GateOutcome, PushOutcome
    from eagle3conv.states.capture import CaptureNote, CaptureOutcome
    from eagle3conv.verify.run import SmokeOutcome

    codes = {v for k, v in vars(F).items() if k.isupper() and isinstance(v, str) and "-" in v}
    codes |= {o.value for e in (ConfigOutcome, PlanOutcome, DefaultsOutcome, ListOutcome, CaptureOutcome, CaptureNote,
                                LaunchOutcome, PushOutcome, GateOutcome, ExampleOutcome, SmokeOutcome)
              for o in e if "-" in o.value}  # the one-word codes ("wrote", "passed") are also plain words
    codes -= {"dry-run"}  # also the word of config's and fix-keys' ``mode`` (check / write / dry-run), not a code
    render = PKG / "render.py"
    spelled = [(line, text) for line, text in _string_constants(render) if text in codes]
    assert not spelled, spelled


def test_engine_results_are_frozen_types():
    import dataclasses
    import typing

    from eagle3conv.spec import engines
    from eagle3conv.verify.report import EngineScore

    for cls in (engines.EngineRelease, engines.IdField, engines.Capture, engines.EngineRow, engines.IdsPlan,
                EngineScore):
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls
    hints = typing.get_type_hints(engines.Capture)
    assert "Finding" in str(hints["error"]) and "IdField" in str(hints["field"])


# The orchestrators read as their named steps (issue 20): each stays short enough to follow on one
# screen; a step that grows goes into its own function or method, not back into the orchestrator.
ORCHESTRATORS = {
    "eagle3conv/wiring/check.py": "check_wiring",
    "eagle3conv/checkpoint/plan.py": "build_plan",
    "eagle3conv/verify/run.py": "verify",
    "eagle3conv/hub/push.py": "_push",
}
ORCHESTRATOR_MAX_LINES = 80


def test_orchestrators_are_short_lists_of_named_steps():
    long = []
    for rel, name in ORCHESTRATORS.items():
        tree = ast.parse((PKG.parent / rel).read_text())
        found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
        assert found, f"{rel} defines no {name}() at module level"
        lines = found[0].end_lineno - found[0].lineno + 1
        if lines > ORCHESTRATOR_MAX_LINES:
            long.append(f"{rel}:{found[0].lineno} {name}() is {lines} lines")
    assert not long, "orchestrators grown past their steps:\n" + "\n".join(long)


# The canonical names the code spells are constants of spec/canonical.py, checked against
# mappings/canonical.json when it loads (review 3 B8): a literal of one elsewhere in the package is a
# second spelling a rename in the data would miss. The example writes each trainer's own names byte
# for byte (a canonical rename must not change what a trainer wrote), and verify/inputs.py's *_NAMES
# are the names of a target model's weights, not the drafter's.
CANONICAL_LITERALS_ALLOWED = {
    "eagle3conv/example.py": None,  # None: the whole module
    "eagle3conv/verify/inputs.py": {"EMBED_NAMES", "HEAD_NAMES", "NORM_NAMES"},
}


def _named_literals(tree: ast.AST, names: set[str], allowed_targets: set[str]) -> list[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in allowed_targets
                                                for t in node.targets):
            skip |= {id(n) for n in ast.walk(node.value)}
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
            and id(node) not in skip]


def test_canonical_names_are_spelled_once():
    from eagle3conv.spec.canonical import NAMED

    names = set(NAMED)
    bad = []
    for path, module, is_pkg in _modules():
        rel = str(path.relative_to(PKG.parent))
        if rel.startswith("eagle3conv/spec/"):
            continue
        allowed = CANONICAL_LITERALS_ALLOWED.get(rel, set())
        if allowed is None:
            continue
        for line in _named_literals(ast.parse(path.read_text(), rel), names, allowed):
            bad.append(f"{rel}:{line}")
    assert not bad, ("canonical tensor names spelled as literals (use the constants of "
                     "eagle3conv/spec/canonical.py):\n" + "\n".join(bad))


# Every command's operation is on the library's front door (review 3 B10): `from eagle3conv import X`
# gives a Python user what the command runs, and the command itself calls that same function.
COMMAND_OPERATIONS = {
    "inspect": ("inspect",), "fix-keys": ("fix_keys",), "config": ("configure",), "launch": ("launch",),
    "verify": ("verify", "smoke"), "capture": ("capture",), "push": ("push",), "example": ("write_example",),
    "formats": ("load_formats",), "targets": ("list_targets",),
}


def test_the_front_door_has_every_commands_operation():
    import eagle3conv
    from eagle3conv.cli import main

    assert set(main.commands) == set(COMMAND_OPERATIONS), "a command without its front-door operation named here"
    tree = ast.parse((PKG / "cli.py").read_text())
    bodies = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    missing = []
    for command, ops in COMMAND_OPERATIONS.items():
        fn = bodies[main.commands[command].callback.__name__]
        imported = {a.asname or a.name for n in ast.walk(fn) if isinstance(n, ast.ImportFrom)
                    and (n.module or "").startswith("eagle3conv") for a in n.names}
        for op in ops:
            if op not in eagle3conv.__all__ or not callable(getattr(eagle3conv, op)):
                missing.append(f"eagle3conv.{op} ({command})")
            elif op not in imported:
                missing.append(f"`{command}` does not call eagle3conv.{op}")
    assert not missing, missing
    import eagle3conv.verify  # the subpackage is then the attribute `verify`: it still runs verify()
    from eagle3conv import api

    assert callable(eagle3conv.verify) and eagle3conv.verify.verify is api.verify
    assert eagle3conv.SmokeResult.__dataclass_params__.frozen and eagle3conv.smoke.__annotations__["return"] in (
        "SmokeResult", eagle3conv.SmokeResult)


def test_no_decision_in_verify_reads_a_candidates_display_name():
    """A wiring's ``name`` ("config", "training record", "engine sglang==0.5.23") is what people read;
    verify decides on its fields (``Candidate.record``, the layers), never by comparing the name."""
    bad = []
    for path in sorted((PKG / "verify").glob("*.py")):
        rel = str(path.relative_to(PKG.parent))
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            names = any(isinstance(s, ast.Attribute) and s.attr == "name" for s in sides)
            literal = any(isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides)
            if names and literal:
                bad.append(f"{rel}:{node.lineno}")
    assert not bad, bad
