"""Reading a small YAML record a trainer writes beside its weights (NeMo Automodel's recipe snapshot,
``config.yaml``): regular file only, bounded in size, read once, plain data only.

PyYAML (a declared dependency; transformers and huggingface-hub need it too) parses it in two passes
over the same bytes. The first walks only the parser's events, before any node is built: an alias
(``*name``: one anchor repeated, the "billion laughs" bomb; no recipe snapshot writes one) and
nesting deeper than :data:`MAX_DEPTH` are refused there. The second builds the data with the safe
loader (no Python objects: a ``!!python/...`` tag is refused). Errors say what is wrong and where
(line and column), and never quote the file: a file that failed its check may hold anything.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from eagle3conv.errors import CheckpointReadError
from eagle3conv.io.jsonfile import read_small_file

# A recipe snapshot is the training recipe's YAML: a few hundred bytes to a few KB (the one
# eagle3conv.example writes is 153 bytes). 64 KiB is ten times a large recipe and reads in about
# 0.2 s with libyaml, 1.3 s with the pure-Python parser, on a loaded 2-core machine (256 KiB: 1.0 s
# and 5.5 s; 5 MB took 111 s and 1.2 GB before this cap, issue 25).
MAX_YAML_BYTES = 64 * 1024
MAX_DEPTH = 64  # a recipe nests a few levels; the parser recurses per level

_WHAT = {  # PyYAML's error classes, in words that quote nothing of the file
    "ScannerError": "a token YAML cannot read",
    "ParserError": "a structure YAML cannot parse",
    "ComposerError": "a document YAML cannot compose (one document expected)",
    "ConstructorError": "a tag or value the safe loader does not build (such as !!python/object)",
}


def _int_digits() -> int:
    """Python's limit on the digits of an integer read from text (4300 by default, 3.11+)."""
    return getattr(sys, "get_int_max_str_digits", lambda: 4300)() or 4300


def _loader():
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _where(e) -> str:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _check_events(text: str, path: Path, error: type) -> None:
    """The first pass: parser events only, nothing built; aliases and deep nesting refused."""
    import yaml

    depth = 0
    for event in yaml.parse(text, Loader=_loader()):
        if isinstance(event, yaml.AliasEvent):
            raise error(f"{path}: not a plain record: it uses a YAML alias{_where_event(event)}; a recipe "
                        "snapshot has none (an alias can repeat a value without bound)",
                        hint="write the values out in full")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise error(f"{path}: nested more than {MAX_DEPTH} levels deep{_where_event(event)}; "
                            "a recipe snapshot is not")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _where_event(event) -> str:
    mark = event.start_mark
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""


def read_yaml_file(path: Path, what: str = "YAML file", *, max_bytes: int = MAX_YAML_BYTES,
                   error: type = CheckpointReadError) -> Any:
    """Parse one small YAML file into plain data (dicts, lists, strings, numbers, booleans, None)."""
    import yaml

    raw = read_small_file(path, what, max_bytes, error=error)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte {e.start} is not)") from None
    try:
        _check_events(text, path, error)
        return yaml.load(text, Loader=_loader())  # noqa: S506 - the safe loader, aliases refused above
    except yaml.MarkedYAMLError as e:
        raise error(f"{path}: not valid YAML: {_WHAT.get(type(e).__name__, 'not YAML')}{_where(e)}") from None
    except yaml.reader.ReaderError as e:
        raise error(f"{path}: not valid YAML: a character YAML does not allow (a control character such as "
                    f"NUL) at character {e.position}") from None
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML ({type(e).__name__})") from None
    except ValueError as e:  # an integer of more than 4,300 digits (Python's limit), a date that is none
        raise error(f"{path}: not valid YAML: an integer of more than {_int_digits()} digits "
                    "(Python reads no longer one)" if "digits" in str(e) else
                    f"{path}: not valid YAML: a value that cannot be built ({type(e).__name__})") from None
    except RecursionError:
        raise error(f"{path}: not valid YAML (nested too deeply to parse)") from None
