"""Options declared once: a dataclass field carries its command-line option.

An options model is a frozen dataclass (``WiringOptions``, ``VerifyOptions``,
``PushOptions``, ``FixOptions``, ``CaptureOptions``) whose fields are made with :func:`option`: the
field's default is the option's default, its metadata the flag, the help text,
the choices, the metavar and how a typed value is read from the text. The command
line (``eagle3conv/cli.py``, the only user of Click) generates its options from
these fields and hands each command the model; :func:`flags` writes a model back
as the options that give it, for the commands eagle3conv tells users to run.
Nothing here imports Click (the library uses the models without it).
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

OPTION = "eagle3conv.option"  # the metadata key of a field that is a command-line option


@dataclass(frozen=True)
class Option:
    """A field's command-line option (the metadata :func:`option` stores)."""

    help: str
    flag: str | None = None
    """The option's name (``--search-wiring``); default: ``--`` + the field name with dashes."""
    metavar: str | None = None
    choices: tuple[str, ...] | Callable[[], Iterable[str]] | None = None
    """The values allowed, or a function returning them from the data (called when first needed)."""
    type: type | None = None
    """``int``, ``float`` or ``str`` on the command line; default: the field's annotation."""
    path: dict | None = None
    """A path option: ``exists``, ``file_okay``, ``dir_okay`` (as Click's Path takes them)."""
    multiple: bool = False
    show_default: bool = False
    required: bool = False
    """The command line must give it (the field's default is then the library's, None)."""
    parse: Callable[[str], Any] | None = None
    """How the field's value is read from the text given (``"3,31,59"`` -> ``(3, 31, 59)``)."""
    unparse: Callable[[Any], str] | None = None
    """The inverse of ``parse``, for :func:`flags`."""
    negates: bool = False
    """A flag that sets the field to False (``--no-save`` for ``save=True``)."""
    check: Callable[[Any], str | None] | None = None
    """What is wrong with a value given on the command line (``"must be a positive number of tokens"``), or None."""


def option(default: Any = None, *, help: str, **spec) -> Any:
    """A dataclass field that is also a command-line option (the keywords: :class:`Option`'s)."""
    return dataclasses.field(default=default, metadata={OPTION: Option(help=help, **spec)})


def spec_of(f: dataclasses.Field) -> Option | None:
    return f.metadata.get(OPTION)


def option_fields(model: type) -> dict[str, dataclasses.Field]:
    """The fields of ``model`` that are command-line options, by name, in declaration order."""
    return {f.name: f for f in dataclasses.fields(model) if OPTION in f.metadata}


def flag_of(f: dataclasses.Field) -> str:
    spec = spec_of(f)
    return spec.flag if spec is not None and spec.flag else "--" + f.name.replace("_", "-")


def is_flag(model: type, f: dataclasses.Field) -> bool:
    """An on/off option: a bool field."""
    return value_type(model, f) is bool


_TYPES = {"bool": bool, "int": int, "float": float}


def value_type(model: type, f: dataclasses.Field) -> type:
    """What the command line reads for the field: its spec's ``type``, else the annotation's
    (``int | None`` -> int); text when the field parses its value or holds anything else.
    The annotation is read as written (these modules postpone annotations): nothing is evaluated."""
    spec = spec_of(f)
    if spec.type is not None:
        return spec.type
    if spec.parse is not None or spec.multiple:
        return str
    hint = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
    first = next((part.strip() for part in hint.split("|") if part.strip() != "None"), "")
    return _TYPES.get(first, str)


def from_given(model: type, given: dict[str, Any], **extra) -> Any:
    """The model from the values the command line read (text parsed by each field's ``parse``)."""
    values = {}
    for name, f in option_fields(model).items():
        if name not in given:
            continue
        v, spec = given[name], spec_of(f)
        if v is None:  # not given: the field's default
            continue
        if spec.multiple:
            v = tuple(v or ())
        elif spec.negates:
            v = not v
        elif spec.parse is not None:
            v = spec.parse(v)
        values[name] = v
    return model(**values, **extra)


def flags(opts: Any, names: Iterable[str] | None = None) -> str:
    """The options that give ``opts`` (every option field not at its default; ``names``: only those),
    quoted for a shell, in declaration order: ``--target kimi-k2.5 --engine sglang==0.5.23``."""
    fields = option_fields(type(opts))
    keep = list(fields) if names is None else [n for n in fields if n in set(names)]
    parts: list[str] = []
    for name in keep:
        f = fields[name]
        spec, value = spec_of(f), getattr(opts, name)
        if value == f.default:
            continue
        flag = flag_of(f)
        if spec.multiple:
            for v in value:
                parts += [flag, str(v)]
        elif is_flag(type(opts), f):
            parts.append(flag)
        else:
            parts += [flag, spec.unparse(value) if spec.unparse is not None else str(value)]
    return " ".join(shlex.quote(p) for p in parts)


__all__ = ["OPTION", "Option", "flag_of", "flags", "from_given", "is_flag", "option", "option_fields", "spec_of",
           "value_type"]
