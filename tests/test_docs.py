"""The README cannot drift from the CLI: every command and option appears in it."""

from __future__ import annotations

import re
from pathlib import Path

import click

from eagle3conv.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_every_command_and_option_is_in_the_readme():
    missing = []
    for name, cmd in main.commands.items():
        if f"eagle3conv {name}" not in README:
            missing.append(f"command {name}")
        for p in cmd.params:
            if isinstance(p, click.Option):
                longs = [o for o in p.opts if o.startswith("--")]
                if longs and not any(re.search(re.escape(o) + r"\b", README) for o in longs):
                    missing.append(f"{name} {longs[0]}")
    assert not missing, f"missing from README.md: {missing}"


def test_every_command_help_ends_with_an_example():
    for name, cmd in main.commands.items():
        assert "Example:" in (cmd.help or ""), name


def test_readme_names_the_two_setup_commands_and_ci_runs_the_test_one():
    assert "bash scripts/example.sh" in README
    assert "bash scripts/test.sh" in README
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_exit_codes_documented_match_errors():
    from eagle3conv import errors

    for code in (errors.EXIT_OK, errors.EXIT_ERROR, errors.EXIT_USAGE, errors.EXIT_INVALID, errors.EXIT_VERIFY_FAILED):
        assert re.search(rf"^\| {code} \|", README, re.M), code


def _readme_commands() -> list[str]:
    """The commands scripts/readme_commands.py runs against an installed wheel (read from README.md itself)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_commands", ROOT / "scripts" / "readme_commands.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.readme_commands(README)


def test_every_command_the_readme_shows_parses(tmp_path, monkeypatch):
    """Each eagle3conv line of README's ```bash blocks and each command heading (placeholders given the values
    scripts/readme_commands.py runs them with) is a command line the CLI accepts: a renamed option or command,
    or a wrong value type, fails here in milliseconds; scripts/readme_commands.py runs them all from a wheel."""
    import shlex

    commands = _readme_commands()
    heads = re.findall(r"^### `eagle3conv (\S+)", README, re.M)
    assert {c.split()[1] for c in commands if c.startswith("eagle3conv ")} >= {h.rstrip("`") for h in heads}
    monkeypatch.chdir(tmp_path)
    for name in ("prompts.txt", "prompts.jsonl", "states.safetensors"):
        (tmp_path / name).write_text("")
    bad = []
    for line in commands:
        if not line.startswith("eagle3conv "):
            assert line in ("bash scripts/example.sh", "bash scripts/test.sh"), line
            continue
        args = shlex.split(line)[1:]
        assert not [a for a in args if re.fullmatch(r"\[?[A-Z][A-Z_/]+\]?", a)], f"a placeholder left: {line}"
        ctx = main.make_context("eagle3conv", list(args), resilient_parsing=True)
        try:
            main.get_command(ctx, args[0]).make_context(args[0], args[1:], parent=ctx)
        except click.UsageError as e:
            bad.append(f"{line}: {e}")
    assert not bad, bad


def test_the_quick_start_says_what_example_sh_runs():
    """README's Quick start line for scripts/example.sh lists every eagle3conv command the script runs."""
    ran = sorted(set(re.findall(r"^\$E (\S+)", (ROOT / "scripts" / "example.sh").read_text(), re.M)) - {"example"})
    said = re.search(r"bash scripts/example\.sh +# (.*)", README).group(1)
    assert [c for c in ran if not re.search(rf"\b{c}\b", said)] == [], (ran, said)
