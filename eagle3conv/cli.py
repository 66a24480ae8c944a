"""The command line: parse, call one library function, format the result.

Exit codes: 0 ok, 1 error, 2 usage, 3 checked and found invalid, 4 verify
failed (see eagle3conv/errors.py). ``--json`` prints exactly one JSON document
on stdout; progress and logs go to stderr. Tracebacks only with ``--debug``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import click

from eagle3conv import __version__
from eagle3conv.errors import EXIT_ERROR, EXIT_INVALID, Eagle3ConvError

_stdout = {"ok": True}  # False once stdout refused a write: nothing tries it again


def _out(text: str) -> None:
    """Write one piece of the command's output to stdout, flushed at once. A stdout that refuses
    it (``> /dev/full``, a closed pipe) raises :class:`StdoutError` naming stdout, and stdout is
    pointed at /dev/null so that nothing else, Python's own exit included, tries it again."""
    from eagle3conv.errors import StdoutError

    if not _stdout["ok"]:
        return
    if sys.stdout is None:  # started with stdout closed (`>&-`): Python then has no sys.stdout at all
        _stdout["ok"] = False
        raise StdoutError("cannot write the output to stdout: stdout is closed",
                          hint="run the command with stdout open (> FILE, or > /dev/null to discard it); the "
                               "command itself had finished: a rerun of fix-keys or config finds its work done")
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except OSError as e:
        _stdout["ok"] = False
        try:
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, sys.stdout.fileno())
            os.close(fd)
        except (OSError, ValueError, AttributeError):  # not a real file (Click's test runner)
            pass
        why = "the pipe was closed" if isinstance(e, BrokenPipeError) else (e.strerror or str(e))
        raise StdoutError(f"cannot write the output to stdout: {why}",
                          hint="check where stdout goes (a full disk, a closed pipe) and run the command again "
                               "(the command itself had finished: a rerun of fix-keys or config finds its work "
                               "done)") from None


def _out_quietly(text: str) -> None:
    """:func:`_out` for error reports: a stdout that refuses them is already reported on stderr."""
    from eagle3conv.errors import StdoutError

    try:
        _out(text)
    except StdoutError:
        pass


def _emit(as_json: bool, data: dict, text: str) -> None:
    _out(json.dumps(data, indent=2, default=str) if as_json else text)


class _ProgressBars:
    """The one progress display of every long command: ``progress(stage, done, total)``
    (:mod:`eagle3conv.io.progress`) on stderr. Each stage gets a tqdm bar (the previous
    stage's bar closes when the next begins); a stage announced with nothing to count
    (done 0, total None: push's steps) is printed as a line instead."""

    def __init__(self, **bar_options):
        self.options = bar_options
        self.bars: dict = {}

    def __call__(self, stage: str, done: int, total: int | None) -> None:
        bar = self.bars.get(stage)
        if bar is None:
            if done == 0 and total is None:
                click.echo(stage, err=True)
                return
            from tqdm import tqdm

            self.close()
            bar = self.bars[stage] = tqdm(total=total, desc=stage, file=sys.stderr, disable=None, leave=False,
                                          **self.options)
        bar.update(done - bar.n)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()

    def __enter__(self) -> _ProgressBars:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _os_error_message(e: OSError, target: str | None = None) -> tuple[str, str | None]:
    """An OSError from the file system, as the user needs it: the path and what the errno means."""
    import errno as _errno

    what = (e.strerror or os.strerror(e.errno)) if e.errno else str(e)
    where = e.filename if e.filename is not None else None
    if e.filename2 is not None:
        where = f"{e.filename} -> {e.filename2}"
    hints = {
        _errno.ENOSPC: "free space on that file system (or write elsewhere with --out) and run the command again",
        _errno.EDQUOT: "free space within your quota (or write elsewhere with --out) and run the command again",
        _errno.EROFS: "the file system is read-only; write elsewhere with --out",
        _errno.EACCES: "check the permissions of that path (or write elsewhere with --out)",
        _errno.EPERM: "check the permissions of that path (or write elsewhere with --out)",
        _errno.ENOTDIR: "a part of that path is a file, not a folder; check the path",
    }
    if e.errno in (_errno.EEXIST, _errno.ENOTDIR) and e.filename is not None:
        # a regular file where a folder must be (--out under a file)
        parts = [os.fspath(target or e.filename)]
        while os.path.dirname(parts[-1]) not in ("", parts[-1]):
            parts.append(os.path.dirname(parts[-1]))
        blocker = next((p for p in reversed(parts) if os.path.lexists(p) and not os.path.isdir(p)), None)
        if blocker is not None:
            return f"{blocker} is a file, not a folder, so {parts[0]} cannot be created", \
                "choose a path whose parent folders are folders"
    return f"{where}: {what}" if where else what, hints.get(e.errno)


def _target_of(argv: list[str]) -> str | None:
    """The path a command writes or reads: its --out, else its first argument (for messages only)."""
    for i, a in enumerate(argv):
        if a == "--out" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--out="):
            return a[len("--out="):]
    rest = [a for a in argv[1:] if not a.startswith("-")]
    return rest[0] if rest else None


class _Group(click.Group):
    """One catch for the whole tool: our errors become a message and an exit code."""

    argv: list[str] = []  # the command and its arguments, as given (kept by main() for messages)

    def main(self, args=None, *rest, **kw):
        given = list(sys.argv[1:] if args is None else args)
        # --json, --debug and --verbose belong to the group and may stand anywhere on the line (before a
        # lone --): they are moved in front of the command, so every command honours them alike
        cut = given.index("--") if "--" in given else len(given)
        flags = [a for a in given[:cut] if a in GLOBAL_FLAGS]
        given = [a for a in given[:cut] if a not in GLOBAL_FLAGS] + given[cut:]
        self.argv = given
        return super().main(flags + given, *rest, **kw)

    def invoke(self, ctx: click.Context):
        argv = self.argv
        try:
            from eagle3conv.io import testhooks

            testhooks.check()  # a bad test hook is a usage error before any work (io/testhooks.py)
            return super().invoke(ctx)
        except Eagle3ConvError as e:
            _report(ctx, e)
        except KeyboardInterrupt:
            interrupted(ctx.meta.get("eagle3conv.json", False) or "--json" in argv)
        except click.UsageError as e:
            # bad flags: with --json, still exactly one JSON document on stdout
            if "--json" in argv or ctx.meta.get("eagle3conv.json", False):
                _out_quietly(json.dumps({"error": "UsageError", "message": e.format_message(), "hint": None,
                                         "details": [], "exit_code": e.exit_code}, indent=2))
            raise
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except OSError as e:  # the file system said no (ENOSPC, EROFS, EACCES, ENOTDIR...): say where and why
            from eagle3conv.errors import FileSystemError

            message, hint = _os_error_message(e, _target_of(argv))
            if e.filename is None and _target_of(argv):
                message = f"{_target_of(argv)}: {message}"
            err = FileSystemError(f"cannot complete: {message}", hint=hint)
            _report(ctx, err)
        except RecursionError:
            from eagle3conv.errors import CheckpointReadError

            _report(ctx, CheckpointReadError("an input is nested too deeply to read (a hostile or corrupt file)",
                                             hint="check the files named on the command line"))
        except MemoryError:
            _report(ctx, Eagle3ConvError("ran out of memory",
                                         hint="close other programs or run on a machine with more memory"))
        except Exception as e:  # noqa: BLE001 - an eagle3conv bug: say so, show the trace with --debug
            if ctx.meta.get("eagle3conv.debug", False):
                traceback.print_exc()
            err = Eagle3ConvError(f"internal error ({type(e).__name__}: {e}); rerun with --debug and report it")
            if ctx.meta.get("eagle3conv.json", False):
                _out_quietly(json.dumps(err.to_dict(), indent=2, default=str))
            click.echo(f"error: {err.message}", err=True)
            ctx.exit(EXIT_ERROR)


def _report(ctx: click.Context, e: Eagle3ConvError) -> None:
    debug = ctx.meta.get("eagle3conv.debug", False)
    as_json = ctx.meta.get("eagle3conv.json", False)
    if debug:
        traceback.print_exc()
    if as_json:
        _out_quietly(json.dumps(e.to_dict(), indent=2, default=str))
    click.echo(f"error: {e.message}", err=True)
    for line in e.details[:50]:
        click.echo(f"  - {line}", err=True)
    if len(e.details) > 50:
        click.echo(f"  … {len(e.details) - 50} more (use --json for all)", err=True)
    if e.hint:
        click.echo(f"hint: {e.hint}", err=True)
    ctx.exit(e.exit_code)


INTERRUPTED = "interrupted; your files are as they were (an in-place write finishes or rolls back on the next run)"


def interrupted_message() -> str:
    """What Ctrl-C tells the user: the truth about an in-place write committed before it came."""
    writer = sys.modules.get("eagle3conv.checkpoint.writer")  # loaded only by commands that write
    committed = getattr(writer, "committed", None) if writer is not None else None
    if committed:
        return (f"interrupted after fix-keys committed: {committed[-1]} holds the new checkpoint "
                "(it was proven before the commit)")
    return INTERRUPTED


def interrupted(as_json: bool) -> None:
    """Ctrl-C: one line on stderr (one JSON document with --json), exit 130."""
    message = interrupted_message()
    if as_json:
        _out_quietly(json.dumps({"error": "Interrupted", "message": message, "hint": None, "details": [],
                                 "exit_code": 130}, indent=2))
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    raise SystemExit(130)


GLOBAL_FLAGS = ("--json", "--debug", "--verbose")


def _global_flag(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    """--json / --debug / --verbose (anywhere on the line, see _Group.main): remembered for the command."""
    if value:
        ctx.meta[f"eagle3conv.{param.name}"] = True
    return value


def _flag(name: str) -> bool:
    """A global flag of the running command (``json``, ``debug``, ``verbose``)."""
    return bool(click.get_current_context().meta.get(f"eagle3conv.{name}", False))


class _LazyChoice(click.Choice):
    """A Choice whose values come from the data when first needed (``--help`` of that command, or its
    value checked), so that building the command line reads nothing."""

    def __init__(self, load) -> None:
        self._load, self._choices = load, None
        super().__init__(())

    @property
    def choices(self) -> tuple:
        if self._choices is None:
            self._choices = tuple(self._load())
        return self._choices

    @choices.setter
    def choices(self, value) -> None:
        if value:
            self._choices = tuple(value)


class _ListedChoice(click.Option):
    """An option of many choices: a short metavar, and the choices listed after its help text."""

    def get_help_record(self, ctx: click.Context):
        text = self.help
        self.help = f"{text} One of: {', '.join(self.type.choices)}."
        try:
            return super().get_help_record(ctx)
        finally:
            self.help = text


def _checked(check):
    def callback(ctx: click.Context, param: click.Parameter, value):
        problem = check(value) if value is not None else None
        if problem:
            raise click.BadParameter(problem, ctx=ctx, param=param)
        return value
    return callback


# the options models (frozen dataclasses whose fields carry their options: eagle3conv/io/options.py), imported
# only when a command's options are first needed, so that `eagle3conv --help` reads none of them
WIRING = "eagle3conv.wiring.options:WiringOptions"
VERIFY = "eagle3conv.verify.options:VerifyOptions"
PUSH = "eagle3conv.hub.options:PushOptions"
FIX = "eagle3conv.checkpoint.options:FixOptions"
CAPTURE = "eagle3conv.states.options:CaptureOptions"


def _module(ref: str):
    import importlib

    return importlib.import_module(ref.split(":")[0])


def _model(ref: str):
    return getattr(_module(ref), ref.split(":")[1])


def _click_option(model, name: str, help: str | None = None) -> click.Option:
    """The Click option of one field of an options model (its metadata: :mod:`eagle3conv.io.options`)."""
    from eagle3conv.io.options import flag_of, is_flag, option_fields, spec_of, value_type

    f = option_fields(model)[name]
    spec = spec_of(f)
    kw: dict = {"help": help or spec.help}
    if spec.negates or is_flag(model, f):
        kw["is_flag"] = True
    else:
        if spec.choices is not None:
            kw["type"] = click.Choice(spec.choices) if isinstance(spec.choices, tuple) else _LazyChoice(spec.choices)
        elif spec.path is not None:
            kw["type"] = click.Path(path_type=str, **spec.path)
        elif value_type(model, f) is not str:
            kw["type"] = value_type(model, f)
        if f.default not in (None, ()):
            kw["default"] = f.default
        for key in ("metavar", "multiple", "show_default", "required"):
            if getattr(spec, key):
                kw[key] = getattr(spec, key)
    if spec.check is not None:
        kw["callback"] = _checked(spec.check)
    return click.Option([flag_of(f), name], **kw)


class _Generated:
    """Options generated from a model's fields, made when the command's options are first needed."""

    def __init__(self, ref: str, names: tuple[str, ...], help: dict | None) -> None:
        self.ref, self.names, self.help = ref, names, help or {}

    def build(self) -> list[click.Option]:
        model = _model(self.ref)
        groups = getattr(_module(self.ref), "GROUPS", {})
        names = [n for name in self.names for n in groups.get(name, (name,))]
        return [_click_option(model, n, self.help.get(n)) for n in names]


class _Command(click.Command):
    """A command whose generated options (:func:`_options`) are made on first use of its parameters."""

    @property
    def params(self) -> list:
        if any(isinstance(p, _Generated) for p in self._params):
            self._params[:] = [q for p in self._params for q in (p.build() if isinstance(p, _Generated) else [p])]
        return self._params

    @params.setter
    def params(self, value: list) -> None:
        self._params = value


_Group.command_class = _Command


def _options(ref: str, *names: str, help: dict | None = None):
    """The options of these fields (or groups of fields: the model module's ``GROUPS``) of the model ``ref``,
    listed in this order; ``help``: a command's own wording of some. The command receives the model
    itself (:func:`_receives`)."""
    def decorate(f):
        if not hasattr(f, "__click_params__"):
            f.__click_params__ = []
        f.__click_params__.append(_Generated(ref, names, help))
        return f
    return decorate


def _receives(**models: str):
    """The command gets one object per options model (``wiring=WIRING``) in place of its fields."""
    import functools

    def decorate(f):
        @functools.wraps(f)
        def command(*args, **kwargs):
            from eagle3conv.io.options import from_given, option_fields

            for arg, ref in models.items():
                model = _model(ref)
                fields = option_fields(model)
                kwargs[arg] = from_given(model, {n: kwargs.pop(n) for n in list(kwargs) if n in fields})
            return f(*args, **kwargs)
        return command
    return decorate


def _launch_option(help: str):
    """--launch LINE: the user's own launch line, checked as ``eagle3conv launch --check`` does."""
    return click.option("--launch", "launch", metavar="LINE", help=help)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="eagle3conv")
@click.option("--json", "json", is_flag=True, expose_value=False, is_eager=True, callback=_global_flag,
              help="Print one JSON document on stdout (anywhere on the command line).")
@click.option("--debug", "debug", is_flag=True, expose_value=False, is_eager=True, callback=_global_flag,
              help="Show tracebacks (anywhere on the command line).")
@click.option("--verbose", "verbose", is_flag=True, expose_value=False, is_eager=True, callback=_global_flag,
              help="Show the full plan, every record and where each came from (anywhere on the command line).")
def main() -> None:
    """Make EAGLE-3 drafters load, wire and serve correctly in SGLang, vLLM and TensorRT-LLM.

    \b
    Example:
      eagle3conv inspect ckpt/
      eagle3conv fix-keys ckpt/
    """


@main.command("inspect")
@click.argument("checkpoint", type=click.Path(path_type=str))
@_options(FIX, "inspect", help={"config": "Use this config.json (for checkpoints that ship none).",
                                         "keep_embed": "Plan as if embed_tokens were kept."})
@_options(WIRING, "inspect")
@_receives(plan=FIX, wiring=WIRING)
def inspect_cmd(checkpoint, plan, wiring):
    """Show a checkpoint: its format and why, tensors, config, aux layers, and what fix-keys would change or refuse.

    Writes nothing (except finishing an interrupted in-place fix-keys).
    Exits 3 when fix-keys would refuse the checkpoint.

    \b
    Example:
      eagle3conv inspect ./epoch_9_step_30000
    """
    json_ = _flag("json")
    from eagle3conv.api import inspect
    from eagle3conv.render import inspect_text

    wiring.releases()  # a bad --engine is a usage error before anything is read
    res = inspect(checkpoint, plan, wiring_options=wiring)
    _emit(json_, res.to_dict(), inspect_text(res, verbose=_flag("verbose")))
    if res.plan is not None and not res.plan.ok:
        click.get_current_context().exit(EXIT_INVALID)
    if res.plan_error is not None:
        click.get_current_context().exit(getattr(res.plan_error, "exit_code", EXIT_ERROR))


@main.command("fix-keys")
@click.argument("checkpoint", type=click.Path(path_type=str))
@_options(FIX, "planning")
@_options(WIRING, "fix-keys")
@_options(FIX, "writing")
@_receives(fix=FIX, wiring=WIRING)
def fix_keys_cmd(checkpoint, fix, wiring):
    """Rename a drafter's weights to exactly what SGLang loads, strictly, and prove the result.

    Every source key is renamed, kept, split or dropped by a named rule; any
    other key, a missing tensor, a wrong shape or a broken vocab map stops the
    command before anything is written (exit 3). In place by default, crash-safe;
    the output is re-read and compared byte for byte with the source.

    Aux-layer ids are converted from the trainer's numbering and written for
    SGLang, vLLM and eagle3conv's provenance; ids that contradict a training
    record (training_metadata.json, SpecForge provenance, --trained-on) stop the
    command unless --rewire.

    \b
    Example:
      eagle3conv fix-keys ./kimi-drafter --out ./kimi-drafter-sglang
    """
    json_ = _flag("json")
    from eagle3conv.api import fix_keys
    from eagle3conv.render import fix_text

    wiring.releases()  # a bad --engine is a usage error before anything is read
    with _ProgressBars(unit="B", unit_scale=True, unit_divisor=1024) as progress:
        res = fix_keys(checkpoint, fix, progress=progress, wiring_options=wiring)
    for link, target_path in res.followed_symlinks:
        click.echo(f"followed symlink {link} -> {target_path} (--follow-symlinks)", err=True)
    _emit(json_, res.to_dict(), fix_text(res, verbose=_flag("verbose")))


@main.command("formats")
def formats_cmd():
    """List the source formats fix-keys understands, with their rules.

    \b
    Example:
      eagle3conv formats --json
    """
    json_ = _flag("json")
    from eagle3conv.spec.formats import load_formats

    from eagle3conv.api import FormatsResult
    from eagle3conv.render import formats_text

    res = FormatsResult.of(load_formats())
    _emit(json_, res.to_dict(), formats_text(res))


@main.command("example")
@click.argument("dest", type=click.Path(path_type=str), default="example-drafter")
@click.option("--format", "fmt", default="modelopt-export", show_default=True, metavar="FORMAT",
              type=_LazyChoice(lambda: _example_formats()), cls=_ListedChoice, help="Trainer naming to write it in.")
def example_cmd(dest, fmt):
    """Write a small, deterministic example drafter checkpoint in a trainer's naming.

    It is the embedded default the README's first command runs on: a real
    safetensors checkpoint (hidden 64, SmolLM2's 49152-token vocab pruned to
    2048) that SGLang would silently skip until fix-keys renames it.

    \b
    Example:
      eagle3conv example ./example-drafter && eagle3conv fix-keys ./example-drafter
    """
    json_ = _flag("json")
    from eagle3conv.api import ExampleResult
    from eagle3conv.example import write_example
    from eagle3conv.render import example_text

    res = ExampleResult(write_example(dest, fmt), fmt)
    _emit(json_, res.to_dict(), example_text(res))


def _example_formats() -> tuple[str, ...]:
    from eagle3conv.example import example_formats

    return example_formats()


@main.command("config")
@click.argument("checkpoint", type=click.Path(path_type=str))
@_options(WIRING, "config")
@click.option("--check", is_flag=True, help="Only check config vs training record vs weights vs target; write nothing.")
@click.option("--dry-run", is_flag=True, help="Show what would be written; write nothing.")
@click.option("--no-metadata", is_flag=True, help="Do not write training_metadata.json when there is none.")
@_receives(wiring=WIRING)
def config_cmd(checkpoint, check, dry_run, no_metadata, wiring):
    """Write the aux layers a drafter was trained on into config.json, for every engine, or --check them.

    Writes nested eagle_config ids (SGLang), top-level ids (vLLM) and a
    provenance block naming the layers explicitly; prints TensorRT-LLM's
    eagle3_layers_to_capture and launch lines. --check exits 3 when the config
    disagrees with the training record, the weights or the target.

    \b
    Example:
      eagle3conv config ./kimi-drafter --target kimi-k2.5 --trained-on 3,31,59 --captured-at input
      eagle3conv config ./kimi-drafter --target kimi-k2.5 --check
    """
    json_ = _flag("json")
    from eagle3conv.api import configure
    from eagle3conv.render import config_text

    wiring.releases()  # a bad --engine is a usage error before anything is read
    res = configure(checkpoint, options=wiring, check=check, dry_run=dry_run, write_metadata=not no_metadata)
    _emit(json_, res.to_dict(), config_text(res, verbose=_flag("verbose")))
    if check and not res.wiring.report.ok:
        click.get_current_context().exit(EXIT_INVALID)


@main.command("launch")
@click.argument("checkpoint", type=click.Path(path_type=str))
@_options(WIRING, "target", "engines", help={
    "target": "The target model: a built-in profile (see `eagle3conv targets`), a Hub repo, or a path to its "
              "config.json or model folder (default: the one a training record names).",
    "engines": "The engine releases to print lines for (and, with --check, the release the line is checked for); "
               "as for config."})
@click.option("--tp", type=int, metavar="N", help="Tensor parallelism the lines pass (default: none, the engine's 1).")
@click.option("--drafter", metavar="PATH_OR_REPO",
              help="The drafter path or Hub repo the lines name (default: CHECKPOINT as given).")
@click.option("--check", "check", metavar="LINE",
              help="Check your own launch line instead: an SGLang command, a `vllm serve` command, or vLLM's "
                   "--speculative-config JSON. Exit 3 when it has an error; the corrected command is printed.")
@_options(WIRING, "max_context",
          help={"max_context": "The context served, for --check when the line sets none (default: the target's)."})
@_receives(wiring=WIRING)
def launch_cmd(checkpoint, tp, drafter, check, wiring):
    """Print the launch line of each engine release for a drafter, or --check your own.

    The lines come from the engine data (mappings/engines/launch.json): no line
    for a release that cannot load the drafter, and every switch the drafter
    needs on that release in it. --check reads your line and reports option
    names the release lacks (with the nearest spelling) and the launch traps
    (EAGLE instead of EAGLE3, vLLM's method taken from the path, the draft
    inheriting --quantization, FP8 KV without scales, fp16 serving, config
    overrides, the served context, a missing window or parallel-drafting switch),
    each with its fix, then the corrected command.

    \b
    Example:
      eagle3conv launch ./drafter --target llama-3.1-8b --tp 2
      eagle3conv launch ./drafter --check "python -m sglang.launch_server --model-path M --speculative-algorithm EAGLE --speculative-draft-model-path ./drafter"
    """
    json_ = _flag("json")
    from eagle3conv.api import launch
    from eagle3conv.render import launch_text

    wiring.releases()  # a bad --engine is a usage error before anything is read
    res = launch(checkpoint, options=wiring, tp=tp, check=check, drafter=drafter)
    _emit(json_, res.to_dict(), launch_text(res))
    if not res.ok:
        click.get_current_context().exit(EXIT_INVALID)


@main.command("targets")
@click.argument("name", required=False)
def targets_cmd(name):
    """List the built-in target profiles (or show one, with its sources and each engine's default aux layers).

    \b
    Example:
      eagle3conv targets
      eagle3conv targets kimi-k2.5 --json
    """
    json_ = _flag("json")
    from eagle3conv.render import targets_text
    from eagle3conv.wiring.apply import resolve_target
    from eagle3conv.spec.targets import list_targets

    if name is not None and not name.strip():
        from eagle3conv.errors import UsageError

        raise UsageError("targets NAME: the name is empty", hint="eagle3conv targets lists them all")
    from eagle3conv.api import TargetsResult, target_summary

    profiles = [resolve_target(name)] if name else list(list_targets())
    res = TargetsResult(tuple(target_summary(p, detail=bool(name)) for p in profiles), detail=bool(name))
    _emit(json_, res.to_dict(), targets_text(res))


@main.command("push")
@click.argument("checkpoint", required=False, default=".", type=click.Path(path_type=str))
@_options(PUSH, "sending")
@_options(WIRING, "push",
          help={"engines": "The engine releases the wiring check covers (as for config)."})
@_launch_option("Check your launch line too (as `eagle3conv launch --check`): an error refuses the push unless "
                "--force; the card's launch section says what was checked.")
@_options(PUSH, "plot")
@_receives(options=PUSH, wiring=WIRING)
def push_cmd(checkpoint, launch, options, wiring):
    """Publish a checked drafter to the Hugging Face Hub, with a model card that records its wiring.

    Before anything is sent, the fix-keys check, the aux-layer wiring check and
    a structural forward run; a failure refuses the push (exit 3) unless
    --force, and then the card says so. Sends only what a server needs, in one
    commit; an unchanged folder makes no commit. The token comes from HF_TOKEN
    or `hf auth login` and is never printed.

    \b
    Example:
      eagle3conv push ckpt-sglang/ --repo-id me/kimi-k25-eagle3 --create-pr
    """
    json_ = _flag("json")
    from pathlib import Path

    from eagle3conv.publish import gate_for, push
    from eagle3conv.render import push_text

    with _ProgressBars() as progress:
        res = push(Path(checkpoint), options=options, gate=gate_for(wiring.engines, launch), progress=progress)
    _emit(json_, res.to_dict(), push_text(res))


@main.command("verify")
@click.argument("checkpoint", type=click.Path(path_type=str))
@click.option("--states", "states", type=click.Path(exists=True, path_type=str),
              help="Captured target states: an eagle3conv states.safetensors; vLLM hidden-states files "
                   "(hs_<i>.safetensors, as speculators' generate-offline-data keeps them); a NeMo Automodel "
                   "EAGLE-3 cache (manifest.json + shard-*.safetensors); SpecForge .ckpt records; or per-slot "
                   "aux dumps (aux_0.pt, ... + manifest.json: the layout of patched-server dump pipelines, not "
                   "an SGLang release's). Without it: the structural smoke test only.")
@_options(WIRING, "verify")
@_options(VERIFY, "scoring")
@click.option("--plot", "plot", type=click.Path(path_type=str), metavar="FILE",
              help="Draw the wiring search per aux slot (and the slots' norms vs training) to FILE: .svg "
                   "(no dependency) or .png (pip install 'eagle3conv[plot]').")
@_options(VERIFY, "save")
@_launch_option("Also check your launch line (as `eagle3conv launch --check`); exit 3 when it has an error.")
@_options(VERIFY, "reference_drafter")
@_receives(options=VERIFY, wiring=WIRING)
def verify_cmd(checkpoint, states, plot, launch, options, wiring):
    """Run the drafter on captured target states: acceptance per draft position, accept length, and the wiring.

    Teacher-forced top-1 acceptance of each draft against the target's own greedy
    tokens, with 95% intervals; per aux slot, the inference states' norms next
    to the training record's; with --search-wiring, which wiring the drafter was
    trained on. The report is saved as eagle3conv-verify.json (push puts it on
    the model card). Exit 4 when below --min-accept.

    \b
    Example:
      eagle3conv verify ./drafter --states states.safetensors --search-wiring
    """
    json_ = _flag("json")
    from eagle3conv.render import verify_text
    from dataclasses import replace

    from eagle3conv.verify import smoke, verify

    if plot:  # every option is checked before any work
        from eagle3conv.errors import UsageError
        from eagle3conv.verify.plot import check_plot_path

        if states is None:
            raise UsageError("--plot draws the wiring search over captured states, and no --states was given",
                             hint="add --states FILE --search-wiring, or leave out --plot")
        if not options.search:
            raise UsageError("--plot draws the wiring search, and --search-wiring was not given",
                             hint="add --search-wiring (it screens every wiring of the captured layers)")
        check_plot_path(plot)
    if launch is not None:
        from eagle3conv.spec.launch import parse_line

        parse_line(launch)  # a line that is no launch line is a usage error before any work
    wiring.releases()  # a bad --engine is a usage error before anything is read
    if states is None:
        from eagle3conv.render import smoke_text

        r = smoke(checkpoint, device=options.device, dtype=options.dtype, wiring_options=wiring)
        d = r.to_dict()
        checked = _verify_launch(d, checkpoint, wiring, launch)
        _emit(json_, d, smoke_text(r) + _launch_tail(checked))
        if not r.ok or (checked is not None and not checked.ok):
            click.get_current_context().exit(EXIT_INVALID)
        return

    with _ProgressBars(unit="seq") as progress:
        res = verify(checkpoint, states, replace(options, wiring_options=wiring), progress=progress)
    d = res.to_dict()
    checked = _verify_launch(d, checkpoint, wiring, launch)
    plot_error = None
    if plot:  # the results are printed whatever happens to the figure
        from eagle3conv.verify.plot import write_plot

        try:
            d["plot"] = str(write_plot(d, plot))
        except (Eagle3ConvError, OSError) as e:
            plot_error = e if isinstance(e, Eagle3ConvError) else Eagle3ConvError(
                f"--plot {plot}: cannot write the figure: {e.strerror or e}")
            d["plot_error"] = plot_error.message
    _emit(json_, d, "" if json_ else verify_text(res) + _launch_tail(checked))
    if res.save_error:
        click.echo(f"warning: {res.save_error}", err=True)
    if plot_error is not None:
        click.echo(f"error: {plot_error.message}", err=True)
        if plot_error.hint:
            click.echo(f"hint: {plot_error.hint}", err=True)
        click.get_current_context().exit(plot_error.exit_code)
    if not res.wiring_check_ok or (checked is not None and not checked.ok):
        click.get_current_context().exit(EXIT_INVALID)


def _verify_launch(d: dict, checkpoint: str, opts, launch: str | None):
    """verify --launch: the user's launch line judged (a LaunchCheck, put in ``d["launch_check"]``);
    None without --launch."""
    if launch is None:
        return None
    from eagle3conv.api import check_launch

    check = check_launch(checkpoint, launch, options=opts)
    d["launch_check"] = check.to_dict()
    return check


def _launch_tail(check) -> str:
    """verify --launch's check (a LaunchCheck, or None) as the text's last lines."""
    if check is None:
        return ""
    from eagle3conv.render import launch_check_lines

    return "\n" + "\n".join(launch_check_lines(check))


@main.command("capture")
@_options(CAPTURE, "capture")
@_receives(options=CAPTURE)
def capture_cmd(options):
    """Run a target on prompts and save its hidden states for verify.

    Writes eagle3conv's states file (atomically): token ids, masks, the target's
    greedy next tokens and the hidden states of every (or each chosen) layer,
    each named explicitly. For targets too large for transformers, --engine vllm
    runs vLLM's extract_hidden_states (tensor-parallel) and writes the files
    speculators' data generation keeps, with eagle3conv-capture.json naming the
    layers (docs/capture-at-scale.md); verify also reads what NeMo Automodel or
    SpecForge write (docs/states-formats.md).

    \b
    Example:
      eagle3conv capture --target smollm2-135m --prompts prompts.jsonl --generate 64 --out states.safetensors
      eagle3conv capture --engine vllm --target moonshotai/Kimi-K2.5 --trust-remote-code \\
          --tensor-parallel-size 8 --prompts prompts.jsonl --generate 256 --out kimi-states --dry-run
    """
    json_ = _flag("json")
    options.check()  # options the engine does not take, values no capture can use: before anything is read
    if options.engine == "vllm":
        _capture_vllm(json_, options)
        return
    from eagle3conv.api import capture
    from eagle3conv.errors import UsageError
    from eagle3conv.render import capture_text, human_bytes
    from eagle3conv.spec.layers import parse_ids

    from pathlib import Path

    from eagle3conv.io.devices import resolve_device

    o = options
    dev = resolve_device(o.device)
    out_p = Path(o.out)
    for what, src in (("--prompts", Path(o.prompts)), ("--target", Path(o.target))):
        if src.exists() and out_p.exists() and os.path.samefile(src, out_p) or src.resolve() == out_p.resolve():
            raise UsageError(f"--out {o.out} is the {what} file: capture would overwrite its own input",
                             hint="write the states to a new file")
    if not out_p.parent.is_dir():
        raise UsageError(f"--out {o.out}: the folder {out_p.parent} does not exist")
    with _ProgressBars(unit="seq") as progress:
        res = capture(o.target, o.prompts, o.out, layers=parse_ids(o.layers) if o.layers else None,
                      max_length=o.max_length, batch_size=o.batch_size, generate=o.generate,
                      chat_template=o.chat_template, dtype=o.dtype, device=dev, progress=progress,
                      capture_info={"prompts_file": str(o.prompts)},
                      on_size=lambda n, how: click.echo(
                          f"capture: {o.out} will be about {human_bytes(n)} ({how})", err=True))
    d = dict(res.to_dict(), target_load_seconds=round(res.target_load_seconds, 3))
    _emit(json_, d, capture_text(d, res.verdict()))


_VLLM_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _capture_vllm(json_, o) -> None:
    """capture --engine vllm (``o``: the CaptureOptions, checked): the plan (checked before anything runs),
    then --dry-run's print or the run."""
    from pathlib import Path

    from eagle3conv.render import capture_plan_text, capture_text
    from eagle3conv.spec.layers import parse_ids
    from eagle3conv.states.capture import read_prompts
    from eagle3conv.states.vllm_capture import (
        VllmCapturePlan, check_out_folder, parse_vllm_args, run_vllm_capture, target_dims, vllm_ids_for,
    )

    items = read_prompts(o.prompts)
    out_p = Path(o.out)
    check_out_folder(out_p)
    extra = parse_vllm_args(o.vllm_args)
    n, hidden, vocab = target_dims(o.target, trust_remote_code=o.trust_remote_code)
    layers = parse_ids(o.layers) if o.layers else None
    plan = VllmCapturePlan(target=o.target, num_layers=n, hidden_size=hidden, vocab_size=vocab,
                           vllm_ids=vllm_ids_for(layers, n), out=out_p, layers_asked=layers,
                           tensor_parallel_size=o.tensor_parallel_size, max_length=o.max_length,
                           generate=o.generate, dtype=_VLLM_DTYPES[o.dtype], chat_template=o.chat_template,
                           trust_remote_code=o.trust_remote_code, extra=extra)
    if o.dry_run:
        v = plan.verdict(prompts=len(items))
        d = dict(plan.invocation(), dry_run=True, prompts_file=str(o.prompts), prompt_count=len(items),
                 verdict=v.to_dict())
        _emit(json_, d, capture_plan_text(d, v))
        return
    with _ProgressBars(unit="file") as progress:
        res = run_vllm_capture(plan, items, progress=progress)
    d = res.to_dict()
    _emit(json_, d, capture_text(d, res.verdict()))
