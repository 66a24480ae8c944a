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
