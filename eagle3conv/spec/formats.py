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

Besides its rules, a format may say what is known about its trainer's output beyond names:

- ``config_set``: config fields written whatever the source config says, each with its ``why``
  (SpecForge 0.2.0's ``norm_output``, which means the opposite of every engine's);
- ``findings``: warnings or notices that hold when their ``when`` conditions do (the same
  conditions as ``detect``): what no rename can fix, or an ambiguity the user must settle;
- ``record``: where the trainer records its aux layers outside config.json (a file beside the
  weights, a field in it) and its default when that file is absent.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from eagle3conv.io.data import data_path
from eagle3conv.errors import MappingFileError, UsageError
from eagle3conv.findings import CODES
from eagle3conv.spec.drafter import LATER_LAYER_NORMS, read_field
from eagle3conv.spec.engine_rules import is_default_term

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
    "config_value",
}
CONFIG_FROM = ("eagle_config", "speculators", "automodel")


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
class ConfigSetting:
    """A config field a format writes whatever its source config says (``config_set``)."""

    field: str
    value: Any
    why: str
    source_warning: dict | None = None
    """``{"equals": V, "code": C, "message": M}``: a warning when the source config holds V."""


@dataclass(frozen=True)
class FormatFinding:
    """A warning or notice a format declares, given when its ``when`` conditions all hold."""

    when: tuple[dict, ...]
    level: str
    code: str
    message: str
    fix: str | None = None


@dataclass(frozen=True)
class RecordSpec:
    """Where a trainer records its aux layers outside config.json (``record``)."""

    file: str
    dirs: tuple[dict, ...]
    """``{"dir": ".", "when_path": regex?}``: folders, relative to the weights, searched in order; a
    ``when_path`` folder only when the weights' folder path matches it."""
    field: str
    numbering: str
    default_ids: tuple[str, ...]
    """The trainer's default (terms in N, the target's layer count), used when no file is found."""
    layers_field: str
    """The source config field that holds N ..."""
    layers_unless: str | None
    """... unless this switch of the source config is on (then it holds something else)."""
    target_field: str | None
    """The field of the record file that names the target."""
    why: str


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
    config_set: tuple[ConfigSetting, ...] = ()
    config_top_level: tuple[str, ...] = ()
    """The top-level fields ``config_from`` carries into the drafter's config (speculators: beside
    transformer_layer_config)."""
    findings: tuple[FormatFinding, ...] = ()
    record: RecordSpec | None = None


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
        if "config_value" in c:
            arg = c["config_value"]
            if not isinstance(arg, dict) or set(arg) != {"field", "equals"} or not isinstance(arg["field"], str) \
                    or not arg["field"]:
                _fail(path, f"config_value must be {{\"field\": \"a.b\", \"equals\": value}}, got {arg!r}")


def _why(path: Path, where: str, raw: dict) -> str:
    why = raw.get("why")
    if not isinstance(why, str) or not why.strip():
        _fail(path, f"{where} has no 'why'")
    return why


def _parse_config_set(path: Path, raw) -> tuple[ConfigSetting, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        _fail(path, "config_set must be a list")
    out = []
    for i, item in enumerate(raw):
        where = f"config_set {i}"
        if not isinstance(item, dict) or not {"field", "value", "why"} <= set(item) \
                or set(item) - {"field", "value", "why", "source_warning"}:
            _fail(path, f"{where} must be {{\"field\", \"value\", \"why\"[, \"source_warning\"]}}")
        if not isinstance(item["field"], str) or not item["field"]:
            _fail(path, f"{where}: field must be a non-empty string")
        warn = item.get("source_warning")
        if warn is not None and (not isinstance(warn, dict) or set(warn) != {"equals", "code", "message"}
                                 or warn["code"] not in CODES or not isinstance(warn["message"], str)):
            _fail(path, f"{where}: source_warning must be {{\"equals\", \"code\" (a declared finding code), "
                        "\"message\"}")
        out.append(ConfigSetting(item["field"], item["value"], _why(path, where, item), warn))
    fields = [c.field for c in out]
    if len(set(fields)) != len(fields):
        _fail(path, "config_set sets a field twice")
    return tuple(out)


def _parse_findings(path: Path, raw) -> tuple[FormatFinding, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        _fail(path, "findings must be a list")
    out = []
    for i, item in enumerate(raw):
        where = f"finding {i}"
        if not isinstance(item, dict) or not {"when", "level", "code", "message"} <= set(item) \
                or set(item) - {"when", "level", "code", "message", "fix"}:
            _fail(path, f"{where} must be {{\"when\", \"level\", \"code\", \"message\"[, \"fix\"]}}")
        _check_conditions(path, item["when"])
        if item["level"] not in ("warning", "notice"):
            _fail(path, f"{where}: level must be warning or notice, got {item['level']!r}")
        if item["code"] not in CODES:
            _fail(path, f"{where}: code {item['code']!r} is not declared in eagle3conv.findings")
        if not isinstance(item["message"], str) or not item["message"].strip():
            _fail(path, f"{where}: message must be a non-empty string")
        fix = item.get("fix")
        if fix is not None and not isinstance(fix, str):
            _fail(path, f"{where}: fix must be a string")
        out.append(FormatFinding(tuple(item["when"]), item["level"], item["code"], item["message"], fix))
    return tuple(out)




def _parse_record(path: Path, raw) -> RecordSpec | None:
    if raw is None:
        return None
    required = {"file", "dirs", "field", "numbering", "default_ids", "target_layers", "why"}
    if not isinstance(raw, dict) or not required <= set(raw) or set(raw) - required - {"target_field"}:
        _fail(path, f"record must have the fields {sorted(required)} (and optionally target_field)")
    for k in ("file", "field"):
        if not isinstance(raw[k], str) or not raw[k]:
            _fail(path, f"record.{k} must be a non-empty string")
    if raw.get("target_field") is not None and not isinstance(raw["target_field"], str):
        _fail(path, "record.target_field must be a string")
    if raw["numbering"] not in ("output", "input"):
        _fail(path, "record.numbering must be output or input")
    dirs = raw["dirs"]
    if not isinstance(dirs, list) or not dirs or any(
            not isinstance(d, dict) or "dir" not in d or set(d) - {"dir", "when_path"}
            or not isinstance(d["dir"], str) for d in dirs):
        _fail(path, "record.dirs must be a non-empty list of {\"dir\": \"..\"[, \"when_path\": regex]}")
    for d in dirs:
        if "when_path" in d:
            try:
                re.compile(d["when_path"])
            except (re.error, TypeError) as e:
                _fail(path, f"record.dirs: bad when_path {d['when_path']!r}: {e}")
    ids = raw["default_ids"]
    if not isinstance(ids, list) or not ids or any(not isinstance(t, str) for t in ids):
        _fail(path, "record.default_ids must be a non-empty list of terms in N (\"1\", \"N//2-1\", \"N-4\")")
    for t in ids:
        if not is_default_term(t):
            _fail(path, f"record.default_ids: term {t!r} is not INT, N or N//2, optionally +c or -c")
    layers = raw["target_layers"]
    if not isinstance(layers, dict) or "field" not in layers or set(layers) - {"field", "unless"} \
            or not all(isinstance(v, str) and v for v in layers.values()):
        _fail(path, "record.target_layers must be {\"field\": F[, \"unless\": SWITCH]}: the source config field "
                    "holding the target's layer count, unless a switch says it holds something else")
    return RecordSpec(raw["file"], tuple(dirs), raw["field"], raw["numbering"], tuple(ids), layers["field"],
                      layers.get("unless"), raw.get("target_field"), _why(path, "record", raw))


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
             "description", "aux_ids", "later_layer_norm", "config_set", "findings", "record", "config_top_level"}
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
    if raw.get("config_from") not in (None, *CONFIG_FROM):
        _fail(path, f"config_from {raw.get('config_from')!r} is not known")
    aux = raw.get("aux_ids")
    if aux is not None:
        if (not isinstance(aux, dict) or set(aux) != {"numbering", "why"} or aux["numbering"] not in ("output", "input")
                or not isinstance(aux["why"], str) or not aux["why"].strip()):
            _fail(path, "aux_ids must be {\"numbering\": \"output\"|\"input\", \"why\": \"...\"}")
    top = raw.get("config_top_level")
    if top is not None and (not isinstance(top, dict) or set(top) != {"fields", "why"} or not top["fields"]
                            or not isinstance(top["fields"], list)
                            or not all(isinstance(f, str) and f for f in top["fields"])
                            or not isinstance(top["why"], str) or not top["why"].strip()):
        _fail(path, "config_top_level must be {\"fields\": [field, ...], \"why\": \"...\"}")
    later = raw.get("later_layer_norm")
    if later is not None and (not isinstance(later, dict) or set(later) != {"norm", "why"}
                              or later["norm"] not in LATER_LAYER_NORMS
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
        config_set=_parse_config_set(path, raw.get("config_set")),
        config_top_level=tuple(top["fields"]) if top else (),
        findings=_parse_findings(path, raw.get("findings")),
        record=_parse_record(path, raw.get("record")),
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
        return read_field(ctx.config, arg)[0], f"config.json has {arg}"
    if kind == "no_config_field":
        return not read_field(ctx.config, arg)[0], f"config.json has no {arg}"
    if kind == "config_value":
        found, value = read_field(ctx.config, arg["field"])
        want = arg["equals"]
        same = found and value == want and type(value) is type(want)  # true is not 1
        return same, f"config.json has {arg['field']}: {json.dumps(want)}"
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


def holds(conds, ctx: DetectContext) -> bool:
    """Whether every condition of a list holds (a format finding's ``when``)."""
    return all(evaluate_condition(c, ctx)[0] for c in conds)


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
