"""Options declared once: the command line is generated from the options models, and gives them back.

Each options model (WiringOptions, VerifyOptions, PushOptions, FixOptions, CaptureOptions) is a frozen dataclass whose
fields carry their command-line option (eagle3conv/io/options.py). For every option field of every
command: the model with that field set, written back as options by ``flags()``, parsed by the real
command (through Click, the command's own callback, up to the library call it makes) is the same model.
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import sys

import pytest
from click.testing import CliRunner

import eagle3conv.api
import eagle3conv.publish
import eagle3conv.verify
from eagle3conv.checkpoint.options import FixOptions
from eagle3conv.cli import main
from eagle3conv.errors import UsageError
from eagle3conv.hub.options import PushOptions
from eagle3conv.io.options import flags, option_fields, spec_of, value_type
from eagle3conv.states.options import CaptureOptions
from eagle3conv.verify.options import VerifyOptions
from eagle3conv.wiring.options import COMMAND_FIELDS, WiringOptions
from helpers import NEWEST_SGLANG, VLLM_RELEASES

MODELS = (WiringOptions, VerifyOptions, PushOptions, FixOptions, CaptureOptions)


class Captured(UsageError):
    """Raised by the stand-in for the library call: the command got this far."""


def sample(model, name: str, tmp_path):
    """A value of the field that is not its default (a path that exists where the option wants one)."""
    f = option_fields(model)[name]
    spec = spec_of(f)
    if model is CaptureOptions and name == "layers":
        return "1,14,26"  # the text given: capture reads it where it always did
    if name == "engines":
        return (f"sglang=={NEWEST_SGLANG}", f"vllm=={VLLM_RELEASES[-1]}")
    if name in ("layers", "states_layers"):
        return (3, 31, 59)
    if name == "dequantize":
        return ("fc", "lm_head")
    if spec.choices is not None:
        choices = tuple(spec.choices() if callable(spec.choices) else spec.choices)
        return next(c for c in reversed(choices) if c != f.default)
    if spec.path is not None:
        where = tmp_path / f"{name}-dir"
        where.mkdir(exist_ok=True)
        if spec.path.get("file_okay", True):
            where = where / "file.json"
            where.write_text("{}")
        return str(where)
    if spec.multiple:
        return ("it's one", "*.bin")
    kind = value_type(model, f)
    if kind is bool:
        return not f.default
    if kind is int:
        return 7
    if kind is float:
        return 0.25
    return "a value, it's quoted"


def capture(monkeypatch, args: list[str]) -> dict:
    """Run ``eagle3conv ARGS`` with the library calls replaced by a stand-in that keeps what it was given."""
    got: dict = {}

    def keep(name):
        def stand_in(*a, **kw):
            got.update(kw, args=a, call=name)
            raise Captured("captured")
        return stand_in

    for module, name in ((eagle3conv.api, "inspect"), (eagle3conv.api, "fix_keys"), (eagle3conv.api, "configure"),
                         (eagle3conv.api, "launch"), (eagle3conv.publish, "push"), (eagle3conv.verify, "verify")):
        monkeypatch.setattr(module, name, keep(name))
    # capture checks its model first, on either engine: the stand-in keeps the model it was handed
    monkeypatch.setattr(CaptureOptions, "check", lambda self: keep("capture")(self))
    res = CliRunner().invoke(main, args)
    assert got, f"the command stopped before its library call (exit {res.exit_code}):\n{res.output}"
    return got


# command -> (the models it receives, how to run it, where the library call finds each model)
def _invocation(command: str, tmp_path) -> list[str]:
    if command == "capture":  # its arguments are options: the required ones come with the model (BASE)
        return ["capture"]
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(exist_ok=True)
    if command == "verify":
        states = tmp_path / "states.safetensors"
        states.write_bytes(b"")
        return ["verify", str(ckpt), "--states", str(states)]
    return [command, str(ckpt)]


def received(command: str, got: dict) -> dict:
    if command == "capture":
        return {CaptureOptions: got["args"][0]}
    if command == "verify":
        options = got["args"][2]
        return {WiringOptions: options.wiring_options, VerifyOptions: dataclasses.replace(options, wiring_options=None)}
    if command == "push":
        return {PushOptions: got["options"]}
    if command == "config" or command == "launch":
        return {WiringOptions: got["options"]}
    return {WiringOptions: got["wiring_options"], FixOptions: got["args"][1]}


COMMAND_MODELS = {
    "inspect": {WiringOptions: COMMAND_FIELDS["inspect"], FixOptions: ("source_format", "config", "keep_embed",
                                                                      "later_norm")},
    "fix-keys": {WiringOptions: COMMAND_FIELDS["fix-keys"], FixOptions: tuple(option_fields(FixOptions))},
    "config": {WiringOptions: COMMAND_FIELDS["config"]},
    "launch": {WiringOptions: COMMAND_FIELDS["launch"]},
    "verify": {WiringOptions: COMMAND_FIELDS["verify"], VerifyOptions: tuple(option_fields(VerifyOptions))},
    "push": {PushOptions: tuple(option_fields(PushOptions))},
    "capture": {CaptureOptions: tuple(option_fields(CaptureOptions))},
}


def base(model, tmp_path) -> dict:
    """The options a command cannot run without (capture's --target, --prompts, --out), each a real value."""
    if model is not CaptureOptions:
        return {}
    return {n: sample(model, n, tmp_path) for n in ("target", "prompts", "out")}
CASES = [(command, model, name) for command, models in COMMAND_MODELS.items()
         for model, names in models.items() for name in names]


@pytest.mark.parametrize("command,model,name", CASES, ids=[f"{c}-{m.__name__}-{n}" for c, m, n in CASES])
def test_flags_parsed_back_by_the_command_give_the_options(monkeypatch, tmp_path, command, model, name):
    opts = model(**{**base(model, tmp_path), name: sample(model, name, tmp_path)})
    text = flags(opts, COMMAND_MODELS[command][model])
    assert text, f"{name}: flags() wrote nothing for a value not at its default"
    got = capture(monkeypatch, _invocation(command, tmp_path) + shlex.split(text))
    assert received(command, got)[model] == opts


def test_every_field_of_every_command_at_once(monkeypatch, tmp_path):
    """All options together (and the command's other models left at their defaults)."""
    for command, models in COMMAND_MODELS.items():
        want = {m: m(**{n: sample(m, n, tmp_path) for n in names}) for m, names in models.items()}
        args = [part for m, o in want.items() for part in shlex.split(flags(o, models[m]))]
        got = received(command, capture(monkeypatch, _invocation(command, tmp_path) + args))
        for m, o in want.items():
            assert got[m] == o, (command, m.__name__)


def test_the_fix_commands_eagle3conv_prints_repeat_the_wiring_options(monkeypatch, tmp_path):
    """``WiringOptions.flags(command)``, the options of the fix-keys/config lines eagle3conv tells users to
    run, give back every wiring option that command takes (--max-context and --sglang-version included)."""
    for command in ("fix-keys", "config"):
        opts = WiringOptions(**{n: sample(WiringOptions, n, tmp_path) for n in COMMAND_FIELDS[command]})
        got = capture(monkeypatch, _invocation(command, tmp_path) + shlex.split(opts.flags(command)))
        assert received(command, got)[WiringOptions] == opts
    assert WiringOptions(dumps=str(tmp_path)).flags("fix-keys") == ""  # fix-keys takes no --dumps


def test_every_option_field_is_on_a_command_with_its_help():
    """No option declared and left off the command line; the help Click shows is the field's own (or the
    command's wording of it, given where the command generates it)."""
    from eagle3conv.io.options import flag_of

    shown = {}
    for name, cmd in main.commands.items():
        for p in cmd.params:
            shown.setdefault(p.opts[0], []).append((name, p.help))
    for model in MODELS:
        for fname, f in option_fields(model).items():
            flag = flag_of(f)
            assert flag in shown, f"{model.__name__}.{fname} ({flag}) is on no command"
            helps = [h for _, h in shown[flag]]
            assert spec_of(f).help in helps, (fname, helps)


def test_dtype_and_example_choices_come_from_the_data():
    from eagle3conv.example import example_formats
    from eagle3conv.io.dtypes import DTYPE_CHOICES, USER_DTYPES

    assert set(DTYPE_CHOICES) <= set(USER_DTYPES) and len({USER_DTYPES[d] for d in DTYPE_CHOICES}) == len(DTYPE_CHOICES)
    choices = {name: {p.name: getattr(p.type, "choices", None) for p in cmd.params} for name, cmd in main.commands.items()}
    assert tuple(choices["fix-keys"]["dtype"]) == DTYPE_CHOICES
    assert tuple(choices["capture"]["dtype"]) == DTYPE_CHOICES
    assert tuple(choices["verify"]["dtype"]) == ("auto", *DTYPE_CHOICES)
    assert tuple(choices["example"]["fmt"]) == example_formats()


def test_the_command_line_imports_no_options_model_until_a_command_needs_it():
    """`eagle3conv --help` stays fast: importing the CLI reads no options model and no mapping."""
    code = ("import sys, eagle3conv.cli; print(sorted(m for m in sys.modules if m.startswith('eagle3conv')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "options" not in out and "spec" not in out, out
