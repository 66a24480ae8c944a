"""Source formats: the declarative mapping files, loaded into frozen objects.

Each file in ``mappings/formats/`` describes one trainer's spelling: how to
recognise it (``detect``), and rules that turn its names into SGLang's. Rules
are tried in order, the format's own first and then ``_common.json``'s; the
first that matches decides a key's fate:

- ``{"key": A, "to": B}``       rename one exact name
- ``{"prefix": P, "to": Q}``    rename by prefix
- ``{"drop_regex": R}``         drop, with the rule's reason
- ``{"refuse_regex": R}``       an error: the key cannot be served correctly

A key no rule matches is kept as it is. Either way, the resulting name must be
a canonical tensor (``mappings/canonical.json``) or a known fused tensor, or
the key is *unmapped* and nothing is written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from eagle3conv.io.data import data_path
from eagle3conv.errors import MappingFileError, UsageError

SCHEMA = 1
CONDITIONS = {
    "any_key_prefix",
    "config_field",
    "no_config_field",
    "config_architecture",
    "no_config",
    "layout",
    "wrapper",
    "path_regex",
    "file_exists",
    "any_of",
}


@dataclass(frozen=True)
class Rule:
    kind: str  # key | prefix | drop | refuse
    pattern: str
    to: str | None
    why: str
    regex: re.Pattern | None = None

    def match(self, name: str) -> tuple[str, str | None] | None:
        """(kind, new name) when this rule applies to ``name``."""
        if self.kind == "key":
            return ("rename", self.to) if name == self.pattern else None
        if self.kind == "prefix":
            return ("rename", self.to + name[len(self.pattern):]) if name.startswith(self.pattern) else None
        if self.regex.search(name):
            return (self.kind, None)
        return None

    def describe(self) -> str:
        if self.kind == "key":
            return f"{self.pattern} -> {self.to}"
        if self.kind == "prefix":
            return f"{self.pattern}* -> {self.to}*"
        return f"{self.kind} /{self.pattern}/"


@dataclass(frozen=True)
class Format:
    name: str
    title: str
    priority: int
    detect: dict
    rules: tuple[Rule, ...]
    path: Path
    extracts: bool = False  # the source holds a whole model; the drafter is a part of it
    config_from: str | None = None  # eagle_config | speculators | None
    config_required: str | None = None
    aux_numbering: str | None = None  # how this trainer numbers the aux ids in its config (None: unknown)
    aux_numbering_why: str | None = None
    later_layer_norm: str | None = None
    """The norm this trainer applies to a later decoder layer's input (multi-layer drafters):
    ``input_layernorm`` or ``hidden_norm``; None: unknown."""
    later_layer_norm_why: str | None = None


@dataclass(frozen=True)
class FormatMatch:
    format: Format
    reasons: tuple[str, ...]
    forced: bool = False


def _fail(path: Path, msg: str):
    raise MappingFileError(f"{path}: {msg}")


def _parse_rule(path: Path, i: int, raw: dict) -> Rule:
    if not isinstance(raw, dict):
        _fail(path, f"rule {i} is not an object")
    why = raw.get("why")
    if not isinstance(why, str) or not why.strip():
        _fail(path, f"rule {i} has no 'why'")
    kinds = [k for k in ("key", "prefix", "drop_regex", "refuse_regex") if k in raw]
    if len(kinds) != 1:
        _fail(path, f"rule {i} must have exactly one of key/prefix/drop_regex/refuse_regex, has {kinds}")
    kind = kinds[0]
    allowed = {kind, "why"} | ({"to"} if kind in ("key", "prefix") else set())
    extra = set(raw) - allowed
    if extra:
        _fail(path, f"rule {i} has unknown fields {sorted(extra)}")
    pattern = raw[kind]
    if not isinstance(pattern, str) or (kind == "key" and not pattern):
        _fail(path, f"rule {i}: {kind} must be a non-empty string")
    if kind in ("key", "prefix"):
        if not isinstance(raw.get("to"), str):
            _fail(path, f"rule {i}: {kind} rules need a string 'to'")
        return Rule(kind, pattern, raw["to"], why)
    try:
        rx = re.compile(pattern)
    except re.error as e:
        _fail(path, f"rule {i}: bad regex {pattern!r}: {e}")
    return Rule("drop" if kind == "drop_regex" else "refuse", pattern, None, why, rx)


def _check_conditions(path: Path, conds) -> None:
    if not isinstance(conds, list) or not conds:
        _fail(path, "detect conditions must be a non-empty list")
    for c in conds:
        if not isinstance(c, dict) or len(c) != 1 or next(iter(c)) not in CONDITIONS:
            _fail(path, f"unknown detect condition {c!r}; known: {sorted(CONDITIONS)}")
        if "any_of" in c:
            _check_conditions(path, c["any_of"])


def load_format_file(path: Path) -> Format:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        _fail(path, f"unreadable: {e}")
    if not isinstance(raw, dict):
        _fail(path, "must be a JSON object")
    if raw.get("schema") != SCHEMA:
        _fail(path, f"schema must be {SCHEMA}")
    known = {"schema", "name", "title", "priority", "detect", "rules", "extracts", "config_from", "config_required",
             "description", "aux_ids", "later_layer_norm"}
    extra = set(raw) - known
    if extra:
        _fail(path, f"unknown fields {sorted(extra)}")
    name = raw.get("name")
    if name != path.stem:
        _fail(path, f"name {name!r} must equal the file name {path.stem!r}")
    rules = raw.get("rules")
    if not isinstance(rules, list):
        _fail(path, "rules must be a list")
    parsed = tuple(_parse_rule(path, i, r) for i, r in enumerate(rules))
    sources = [(r.kind, r.pattern) for r in parsed]
    dup = {s for s in sources if sources.count(s) > 1}
    if dup:
        _fail(path, f"duplicate source rules {sorted(dup)}")
    key_targets = [r.to for r in parsed if r.kind == "key"]
    if len(set(key_targets)) != len(key_targets):
        _fail(path, "two key rules map to the same target")
    detect = raw.get("detect", {})
    if name != "_common":
        if not isinstance(raw.get("priority"), int):
            _fail(path, "priority must be an integer")
        if set(detect) != {"all"}:
            _fail(path, "detect must be {'all': [conditions]}")
        _check_conditions(path, detect["all"])
    if raw.get("config_from") not in (None, "eagle_config", "speculators"):
        _fail(path, f"config_from {raw.get('config_from')!r} is not known")
    aux = raw.get("aux_ids")
    if aux is not None:
        if (not isinstance(aux, dict) or set(aux) != {"numbering", "why"} or aux["numbering"] not in ("output", "input")
                or not isinstance(aux["why"], str) or not aux["why"].strip()):
            _fail(path, "aux_ids must be {\"numbering\": \"output\"|\"input\", \"why\": \"...\"}")
    later = raw.get("later_layer_norm")
    if later is not None and (not isinstance(later, dict) or set(later) != {"norm", "why"}
                              or later["norm"] not in ("input_layernorm", "hidden_norm")
                              or not isinstance(later["why"], str) or not later["why"].strip()):
        _fail(path, "later_layer_norm must be {\"norm\": \"input_layernorm\"|\"hidden_norm\", \"why\": \"...\"}")
    return Format(
        name=name,
        title=raw.get("title") or name,
        priority=raw.get("priority", 0),
        detect=detect,
        rules=parsed,
        path=path,
        extracts=bool(raw.get("extracts", False)),
        aux_numbering=aux["numbering"] if aux else None,
        aux_numbering_why=aux["why"] if aux else None,
        config_from=raw.get("config_from"),
        config_required=raw.get("config_required"),
        later_layer_norm=later["norm"] if later else None,
        later_layer_norm_why=later["why"] if later else None,
    )


@lru_cache(maxsize=1)
def load_formats() -> tuple[dict[str, Format], Format]:
    """All formats by name, and the common rules."""
    folder = data_path("formats")
    formats = {}
    common = None
    for p in sorted(folder.glob("*.json")):
        f = load_format_file(p)
        if f.name == "_common":
            common = f
        else:
            formats[f.name] = f
    if common is None:
        raise MappingFileError(f"{folder}: _common.json is missing")
    return formats, common


def format_names() -> list[str]:
    return sorted(load_formats()[0])


def get_format(name: str) -> Format:
    formats, _ = load_formats()
    if name not in formats:
        raise UsageError(f"unknown source format {name!r}", hint="known formats: " + ", ".join(sorted(formats)))
    return formats[name]


# --- detection -------------------------------------------------------------------

def evaluate_condition(cond: dict, ctx: "DetectContext") -> tuple[bool, str]:
    """One detection condition ``{kind: arg}``: whether it holds, and why in words."""
    (kind, arg), = cond.items()
    if kind == "any_key_prefix":
        hits = [p for p in arg if any(k.startswith(p) for k in ctx.keys)]
        return bool(hits), f"keys start with {', '.join(hits or arg)}"
    if kind == "config_field":
        return bool(ctx.config) and arg in ctx.config, f"config.json has {arg}"
    if kind == "no_config_field":
        return not (ctx.config and arg in ctx.config), f"config.json has no {arg}"
    if kind == "config_architecture":
        archs = (ctx.config or {}).get("architectures") or []
        return any(a in arg for a in archs), f"config.json architectures is {archs or arg}"
    if kind == "no_config":
        return (ctx.config is None) == bool(arg), "no config.json"
    if kind == "layout":
        return ctx.layout in arg, f"weights are {ctx.layout}"
    if kind == "wrapper":
        return ctx.wrapper in arg, f"weights are under {ctx.wrapper or arg[0]}"
    if kind == "path_regex":
        return bool(re.search(arg, ctx.root.as_posix())), f"folder name {ctx.root.name} matches {arg}"
    if kind == "file_exists":
        return (ctx.root / arg).exists(), f"{arg} is present"
    if kind == "any_of":
        results = [evaluate_condition(c, ctx) for c in arg]
        ok = [why for hit, why in results if hit]
        return bool(ok), (ok[0] if ok else " or ".join(why for _, why in results))
    raise AssertionError(kind)


@dataclass(frozen=True)
class DetectContext:
    keys: frozenset[str]
    config: dict | None
    layout: str
    wrapper: str | None
    root: Path


def detect(ctx: DetectContext) -> list[FormatMatch]:
    """Every format whose conditions all hold, best first."""
    formats, _ = load_formats()
    found = []
    for fmt in formats.values():
        results = [evaluate_condition(c, ctx) for c in fmt.detect["all"]]
        if all(hit for hit, _ in results):
            found.append(FormatMatch(fmt, tuple(why for _, why in results)))
    found.sort(key=lambda m: (-m.format.priority, m.format.name))
    return found
