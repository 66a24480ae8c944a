"""Launch lines as engine data (docs/facts.md §13): ``mappings/engines/launch.json`` read, the one builder, the parser.

``launch.json`` says, per engine and release range, the command, the option (or
``--speculative-config`` key) for each role a drafter's launch needs -- the target, the drafter,
the algorithm or method and its one right spelling, the speculative steps, tensor parallelism,
the target's and the draft's quantization and KV-cache dtype, the dtype, config overrides, the
served context, P-EAGLE's parallel drafting -- each with its default and the file:line it was
read from in the released wheel. ``mappings/engines/options/ENGINE-RELEASE.json`` lists every
option name a release accepts (written by ``scripts/read_launch_options.py`` from the wheel's
argument definitions).

:func:`build_line` is the only place a launch line is made (``config``, ``fix-keys``, ``verify``,
``launch`` and the model card all ask it): no line for a release that cannot load the drafter
(:func:`eagle3conv.spec.engines.cannot_load`), and every switch the drafter needs on that release
in it (the sliding-window option, parallel drafting). :func:`parse_line` reads a user's own line
(an SGLang command, a ``vllm serve`` command, or a bare ``--speculative-config`` JSON object);
:mod:`eagle3conv.spec.launch_check` judges it.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import Any

from eagle3conv.errors import MappingFileError, UsageError
from eagle3conv.io.data import data_path
from eagle3conv.spec.drafter import flag
from eagle3conv.spec.engine_rules import ReleaseRange, parse_range
from eagle3conv.spec.engines import EngineRelease, as_release, cannot_load, window_launch_option
from eagle3conv.spec.variants import Handling, Switch, switches

LAUNCH_FILE = "launch.json"
NUM_STEPS = 3  # the speculative steps every line eagle3conv prints uses (a chain: top-k 1)
SHORTCUTS = {"--spec-method": "method", "--spec-model": "model", "--spec-tokens": "num_speculative_tokens"}
"""vLLM 0.33.0's shortcut options, merged into the speculative settings (engine/arg_utils.py:1869-1873, 2108-2121)."""
OPTION_FIELDS = {"option", "key", "positional", "value", "default", "why", "source", "wrong", "opt_out",
                 "fix_value", "reaches_drafter", "case", "needs", "missing"}


@dataclass(frozen=True)
class LaunchOption:
    """One role of a launch line: a command-line ``option``, or a ``key`` of the speculative settings
    (vLLM's ``--speculative-config``, TensorRT-LLM's YAML), or the ``positional`` argument."""

    role: str
    option: str | None
    key: str | None
    positional: bool
    value: str | None  # the one right value (the algorithm / method spelling)
    default: Any
    why: str
    source: str
    wrong: Mapping[str, str] = field(default_factory=dict)  # a wrong value -> what it does
    opt_out: str | None = None
    fix_value: str | None = None
    reaches_drafter: bool | None = None
    case: str | None = None  # "upper": the value is read upper-cased
    needs: str | None = None
    """A role named after a switch (mappings/variants.json): why a line for a drafter with the switch carries
    it (``{rel}``) ..."""
    missing: str | None = None
    """... and what a user's line without it does (``{key}``)."""

    @property
    def name(self) -> str:
        """How messages name it: ``--quantization``, ``speculative_config.quantization``."""
        return self.option or (f"speculative_config.{self.key}" if self.key else "the positional argument")

    @property
    def inherits(self) -> str | None:
        """The role whose value it takes when unset (``default`` ``inherit:ROLE``)."""
        d = self.default
        return d.split(":", 1)[1] if isinstance(d, str) and d.startswith("inherit:") else None


@dataclass(frozen=True)
class LaunchRule:
    """How one engine's releases in ``releases`` are launched."""

    engine: str
    releases: ReleaseRange
    command: tuple[str, ...]
    commands: tuple[tuple[str, ...], ...]
    option_names: Mapping[str, str]  # release read -> options file
    abbreviations: bool
    options: Mapping[str, LaunchOption]
    context_below: Mapping[str, Any] | None

    def role(self, name: str) -> LaunchOption | None:
        return self.options.get(name)

    def switch_roles(self) -> list[tuple[Switch, LaunchOption]]:
        """The roles that turn on a drafter switch (named after a switch of mappings/variants.json), in the
        table's order."""
        return [(s, role) for s in switches() if (role := self.options.get(s.name)) is not None]


def switch_asked(rel: EngineRelease, cfg: Mapping[str, Any], sw: Switch) -> bool:
    """Whether a launch line for this drafter must turn ``sw`` on: its config sets the switch's flag and the
    release honours it (only when the line asks, the launch role says)."""
    from eagle3conv.spec.engines import drafter_kind, forward_rule

    return any(flag(cfg, f) for f in sw.on_when.flags) \
        and forward_rule(rel, drafter_kind(cfg)).switches.get(sw) is Handling.HONOURED


def _fail(message: str) -> MappingFileError:
    return MappingFileError(f"launch data {data_path('engines', LAUNCH_FILE)}: {message}")


def read_option(engine: str, role: str, raw: Any) -> LaunchOption:
    """One role of a launch rule, read and checked (MappingFileError naming the role)."""
    where = f"{engine} option '{role}'"
    if not isinstance(raw, dict) or set(raw) - OPTION_FIELDS:
        raise _fail(f"{where} must be an object with keys among {sorted(OPTION_FIELDS)}")
    for key in ("why", "source"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise _fail(f"{where} needs a non-empty '{key}'")
    named = role in {s.name for s in switches()}
    if named != all(isinstance(raw.get(k), str) and raw[k].strip() for k in ("needs", "missing")) \
            or (not named and ({"needs", "missing"} & set(raw))):
        raise _fail(f"{where}: a role named after a switch of mappings/variants.json (and only such a role) says "
                    "what a line 'needs' it for and what a line 'missing' it does")
    ways = [bool(raw.get("option")), bool(raw.get("key")), bool(raw.get("positional"))]
    if sum(ways) != 1:
        raise _fail(f"{where} needs exactly one of 'option', 'key' or 'positional'")
    return LaunchOption(role, raw.get("option"), raw.get("key"), bool(raw.get("positional")), raw.get("value"),
                        raw.get("default"), raw["why"], raw["source"], MappingProxyType(dict(raw.get("wrong") or {})),
                        raw.get("opt_out"), raw.get("fix_value"), raw.get("reaches_drafter"), raw.get("case"),
                        raw.get("needs"), raw.get("missing"))


def _rule(engine: str, raw: Any) -> LaunchRule:
    if not isinstance(raw, dict):
        raise _fail(f"{engine}: each entry must be an object")
    try:
        releases = parse_range(raw.get("releases"))
    except ValueError as e:
        raise _fail(f"{engine}: {e}") from None
    for key in ("commands_source", "abbreviations_source"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise _fail(f"{engine}: '{key}' must say where it was read")
    options = {role: read_option(engine, role, o) for role, o in (raw.get("options") or {}).items()}
    for role in ("target", "draft", "algorithm", "steps", "tp"):
        if role not in options:
            raise _fail(f"{engine}: no '{role}' option")
    cb = raw.get("context_below")
    if cb is not None and not (isinstance(cb, dict) and cb.get("source") and cb.get("why")):
        raise _fail(f"{engine}: 'context_below' needs 'why' and 'source'")
    return LaunchRule(engine, releases, tuple(raw["command"]), tuple(tuple(c) for c in raw["commands"]),
                      MappingProxyType(dict(raw.get("option_names") or {})), bool(raw.get("abbreviations")),
                      MappingProxyType(options), None if cb is None else MappingProxyType(dict(cb)))


@cache
def launch_rules() -> Mapping[str, tuple[LaunchRule, ...]]:
    """Every engine's launch rules (mappings/engines/launch.json), read and checked once."""
    path = data_path("engines", LAUNCH_FILE)
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise MappingFileError(f"launch data {path}: cannot read it ({e})") from None
    if raw.get("schema") != 1 or not isinstance(raw.get("engines"), dict):
        raise _fail("expected schema 1 and an 'engines' object")
    return MappingProxyType({name: tuple(_rule(name, r) for r in rules) for name, rules in raw["engines"].items()})


def rule_for(release: EngineRelease | str) -> LaunchRule:
    rel = as_release(release)
    for rule in launch_rules().get(rel.engine, ()):
        if not rel.version or rel.version in rule.releases:
            return rule
    raise MappingFileError(f"launch data: no launch rule covers {rel}")


@cache
def _names_file(name: str) -> Mapping[str, Any]:
    path = data_path("engines", name)
    try:
        return MappingProxyType(json.loads(path.read_text()))
    except (OSError, ValueError) as e:
        raise MappingFileError(f"launch option names {path}: cannot read it ({e})") from None


@dataclass(frozen=True)
class OptionNames:
    """The option names (and ``--speculative-config`` keys) a release accepts, as read from a wheel."""

    read_from: str | None  # the release whose wheel was read (None: no names known for this engine)
    options: frozenset[str]
    keys: frozenset[str]
    note: str | None = None  # the release asked is not the one read
    sources: Mapping[str, str] = field(default_factory=dict)
    """Option name -> where the wheel defines it (names sharing one definition are aliases)."""


def option_names(release: EngineRelease | str) -> OptionNames:
    """The names of the release read nearest to ``release`` (the release itself when read)."""
    from eagle3conv.spec.engine_rules import parse_version

    rel = as_release(release)
    files = rule_for(rel).option_names
    if not files:
        return OptionNames(None, frozenset(), frozenset())
    read = sorted(files, key=parse_version)
    pick = min(read, key=lambda r: (abs(_distance(parse_version(r), rel.version)), r)) if rel.version else read[-1]
    doc = _names_file(files[pick])
    note = None if rel.release == pick else (
        f"the option names of {rel} were not read; {rel.engine} {pick}'s (the nearest release read) are used")
    return OptionNames(pick, frozenset(doc.get("options") or ()), frozenset(doc.get("speculative_config_keys") or ()),
                       note, MappingProxyType(dict(doc.get("options") or {})))


def _distance(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    weight = 1
    total = 0
    for x, y in zip(reversed(a), reversed(b)):
        total += (x - y) * weight
        weight *= 1000
    return total


# --------------------------------------------------------------------------- the builder


@dataclass(frozen=True)
class LaunchLine:
    """One release's launch line for a drafter, or why there is none (``refused``)."""

    release: EngineRelease
    argv: tuple[str, ...] | None
    refused: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()  # the switches the drafter needs on this release, in words (each in argv)
    extra_file: str | None = None  # TensorRT-LLM: the YAML the line names, its text
    extra_name: str | None = None

    @property
    def text(self) -> str | None:
        return None if self.argv is None else shlex.join(self.argv)

    @property
    def one_line(self) -> str | None:
        """The line with the file it names, if any, inline after ``#`` (its text on one line): ready to paste."""
        if self.text is None or not self.extra_file:
            return self.text
        return f"{self.text}  # {self.extra_name}: {self.extra_file.replace(chr(10), ' ')}"

    def to_dict(self) -> dict:
        return {"release": self.release.spec, "label": str(self.release), "line": self.text,
                "argv": None if self.argv is None else list(self.argv), "refused": list(self.refused),
                "needs": list(self.needs), "extra_file": self.extra_name, "extra_text": self.extra_file}


def _spec_json(settings: Mapping[str, Any]) -> str:
    return json.dumps(dict(settings), separators=(", ", ": "))


def build_line(release: EngineRelease | str, config: Mapping[str, Any] | None, *, drafter: str,
               target: str | None, tp: int | None = None, steps: int = NUM_STEPS,
               quantization: str | None = None, draft_quantization: str | None = None,
               capture_ids: Sequence[int] | None = None, tensor_names: Iterable[str] = (),
               hf_quant: Mapping[str, Any] | None = None) -> LaunchLine:
    """The launch line of ``release`` for the drafter at ``drafter`` (its ``config``): the target
    (``TARGET`` when unknown), ``tp``, the target's ``quantization`` (SGLang's draft then opts out
    with ``unquant`` unless ``draft_quantization`` names the drafter's own), ``draft_quantization``
    (the draft's method, where the release has an option for it), ``capture_ids`` (TensorRT-LLM's
    ``eagle3_layers_to_capture``). None ``argv`` with ``refused`` when the release cannot load it."""
    from eagle3conv.spec import quant
    from eagle3conv.spec.engines import drafter_kind

    rel = as_release(release)
    cfg = config or {}
    names = tuple(tensor_names)
    refused = cannot_load(rel, cfg, names)
    if refused:
        return LaunchLine(rel, None, refused)
    if rel.engine in ("sglang", "vllm"):  # the drafter's own quantization (docs/facts.md §14), from one place
        dq = quant.launch_quant(rel.engine, rel.version, drafter_kind(cfg), dict(cfg), hf_quant, names)
        if dq.refused:
            return LaunchLine(rel, None, tuple(f"{rel} {r}" for r in dq.refused))
        draft_quantization = draft_quantization or dq.value
    rule = rule_for(rel)
    build = {"sglang": _sglang, "vllm": _vllm, "tensorrt-llm": _trtllm}.get(rel.engine)
    if build is None:
        raise MappingFileError(f"launch data: no line builder for {rel.engine}")
    return build(rel, rule, cfg, drafter=drafter, target=target or "TARGET", tp=tp, steps=steps,
                 quantization=quantization, draft_quantization=draft_quantization, capture_ids=capture_ids)


def _opt(rule: LaunchRule, role: str) -> LaunchOption:
    o = rule.role(role)
    if o is None:
        raise MappingFileError(f"launch data: {rule.engine} has no '{role}' option")
    return o


def _sglang(rel, rule, cfg, *, drafter, target, tp, steps, quantization, draft_quantization, capture_ids):
    o = lambda role: _opt(rule, role).option  # noqa: E731 - the option of a role
    argv = [*rule.command, o("target"), target, o("algorithm"), _opt(rule, "algorithm").value, o("draft"), drafter,
            o("steps"), str(steps), o("topk"), "1", o("draft_tokens"), str(steps + 1)]
    needs = []
    if tp:
        argv += [o("tp"), str(tp)]
    if quantization:
        argv += [o("quantization"), quantization]
    dq = _opt(rule, "draft_quantization")  # both SGLang releases read have it (options/sglang-*.json)
    if draft_quantization or (quantization and dq.inherits == "quantization"):
        value = draft_quantization or dq.opt_out
        argv += [dq.option, value]
        if not draft_quantization:
            needs.append(f"{dq.option} {value}: the draft would otherwise take the target's --quantization")
    window = window_launch_option(rel, cfg)
    if window:
        argv += window.split()
        needs.append(f"{window}: {rel} reads the drafter's sliding window only from this option")
    return LaunchLine(rel, tuple(argv), needs=tuple(needs))


def _vllm(rel, rule, cfg, *, drafter, target, tp, steps, quantization, draft_quantization, capture_ids):
    settings: dict[str, Any] = {_opt(rule, "algorithm").key: _opt(rule, "algorithm").value,
                                _opt(rule, "draft").key: drafter, _opt(rule, "steps").key: steps}
    needs = []
    for sw, role in rule.switch_roles():
        if switch_asked(rel, cfg, sw):
            settings[role.key] = True
            needs.append(f"{role.name}: true: {role.needs.format(rel=rel)}")
    if draft_quantization:
        settings[_opt(rule, "draft_quantization").key] = draft_quantization
    argv = [*rule.command, target, _opt(rule, "spec_config").option, _spec_json(settings)]
    if tp:
        argv += [_opt(rule, "tp").option, str(tp)]
    if quantization:
        argv += [_opt(rule, "quantization").option, quantization]
    return LaunchLine(rel, tuple(argv), needs=tuple(needs))


def _trtllm(rel, rule, cfg, *, drafter, target, tp, steps, quantization, draft_quantization, capture_ids):
    name = "eagle3.yaml"
    argv = [*rule.command, target, _opt(rule, "extra_options").option, name]
    if tp:
        argv += [_opt(rule, "tp").option, str(tp)]
    lines = ["speculative_config:", f"  {_opt(rule, 'algorithm').key}: {_opt(rule, 'algorithm').value}",
             f"  {_opt(rule, 'steps').key}: {steps}", f"  {_opt(rule, 'draft').key}: {drafter}"]
    if capture_ids is not None:
        lines.append(f"  eagle3_layers_to_capture: {sorted(capture_ids)}")
    else:
        lines.append("  # eagle3_layers_to_capture: unknown (no explicit aux-layer set)")
    return LaunchLine(rel, tuple(argv), extra_file="\n".join(lines), extra_name=name)


def trtllm_capture_ids(family: str | None, num_layers: int | None, layers) -> list[int] | None:
    """TensorRT-LLM's ``eagle3_layers_to_capture`` for the trained ``layers`` on a ``num_layers``-layer target
    of ``family`` (its rule: :func:`eagle3conv.spec.engines.ids_for`); None when no layers are known or no
    id list can be told."""
    from eagle3conv.errors import Eagle3ConvError
    from eagle3conv.spec.engines import ids_for, parse_engine

    if not layers:
        return None
    try:
        ids = ids_for(parse_engine("tensorrt-llm"), family, num_layers, layers)
    except Eagle3ConvError:
        return None
    return None if ids is None else list(ids)


def launch_lines(releases: Iterable[EngineRelease], config: Mapping[str, Any] | None, *, drafter: str,
                 target: str | None, tp: int | None = None, capture_ids: Sequence[int] | None = None,
                 tensor_names: Iterable[str] = (), quantization: str | None = None,
                 draft_quantization: str | None = None,
                 hf_quant: Mapping[str, Any] | None = None) -> dict[str, LaunchLine]:
    """One line per engine: the first of ``releases`` of each engine (asked first, then newest)."""
    out: dict[str, LaunchLine] = {}
    tensor_names = tuple(tensor_names)
    for rel in releases:
        if rel.engine not in out:
            out[rel.engine] = build_line(rel, config, drafter=drafter, target=target, tp=tp,
                                         capture_ids=capture_ids, tensor_names=tensor_names, quantization=quantization,
                                         draft_quantization=draft_quantization, hf_quant=hf_quant)
    return out


# --------------------------------------------------------------------------- the parser


@dataclass(frozen=True)
class ParsedOption:
    name: str  # as written
    value: str | None
    index: int  # where in argv


@dataclass(frozen=True)
class ParsedLine:
    """A user's launch line, read: which engine, its options, the target, the speculative settings."""

    engine: str
    argv: tuple[str, ...]
    command: tuple[str, ...]
    env: Mapping[str, str]
    options: tuple[ParsedOption, ...]
    positional: tuple[str, ...]
    spec: Mapping[str, Any] | None  # vLLM's --speculative-config (and --speculative-config.KEY values)
    spec_only: bool = False  # the user gave only the --speculative-config JSON

    def value(self, name: str) -> str | None:
        """The last value given to option ``name`` (normalised spelling), or None."""
        found = [o.value for o in self.options if normal(self.engine, o.name) == name]
        return found[-1] if found else None


def normal(engine: str, name: str) -> str:
    """An option name as the engine's parser reads it (vLLM reads ``_`` as ``-`` before any ``.``)."""
    if engine == "vllm" and name.startswith("--"):
        head, dot, tail = name[2:].partition(".")
        return "--" + head.replace("_", "-") + dot + tail
    return name


def _engine_of(argv: Sequence[str]) -> tuple[str, int] | None:
    for name, rules in launch_rules().items():
        for rule in rules:
            for cmd in rule.commands:
                if tuple(argv[:len(cmd)]) == cmd:
                    return name, len(cmd)
                # a path to the interpreter or a venv's launcher: /usr/bin/python3 -m sglang.launch_server
                if len(argv) >= len(cmd) and argv[0].rsplit("/", 1)[-1] == cmd[0] and \
                        tuple(argv[1:len(cmd)]) == cmd[1:]:
                    return name, len(cmd)
    return None


def parse_line(text: str) -> ParsedLine:
    """Read a user's launch line. Raises :class:`UsageError` for text that is no launch line of an
    engine eagle3conv knows (with what it expected)."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            spec = json.loads(stripped)
        except ValueError as e:
            raise UsageError(f"the --speculative-config JSON does not parse: {e}",
                             hint="pass the JSON object exactly as given to vllm serve --speculative-config") from None
        if not isinstance(spec, dict):
            raise UsageError("the --speculative-config JSON must be an object")
        return ParsedLine("vllm", (), (), {}, (), (), MappingProxyType(spec), spec_only=True)
    try:
        argv = shlex.split(stripped.replace("\\\n", " "))
    except ValueError as e:
        raise UsageError(f"the launch line does not parse as a shell command: {e}") from None
    env = {}
    while argv and "=" in argv[0] and not argv[0].startswith("-") and argv[0].split("=", 1)[0].isidentifier():
        k, v = argv.pop(0).split("=", 1)
        env[k] = v
    if argv and argv[0] == "env":
        argv.pop(0)
        while argv and "=" in argv[0] and argv[0].split("=", 1)[0].isidentifier():
            k, v = argv.pop(0).split("=", 1)
            env[k] = v
    found = _engine_of(argv)
    if found is None:
        known = "; ".join(" ".join(c) for rules in launch_rules().values() for r in rules for c in r.commands)
        raise UsageError(f"'{shlex.join(argv[:3])}' is not a launch command eagle3conv knows",
                         hint=f"give the whole line, starting with one of: {known}; or vLLM's --speculative-config "
                              "JSON object alone")
    engine, n = found
    options, positional = _options(engine, argv, n)
    spec = _spec_settings(engine, options) if engine == "vllm" else None
    return ParsedLine(engine, tuple(argv), tuple(argv[:n]), MappingProxyType(env), tuple(options), tuple(positional),
                      None if spec is None else MappingProxyType(spec))


def _options(engine: str, argv: Sequence[str], start: int) -> tuple[list[ParsedOption], list[str]]:
    options, positional = [], []
    i = start
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("-") and tok != "-" and not _is_number(tok):
            if "=" in tok and tok.startswith("--"):
                name, value = tok.split("=", 1)
                options.append(ParsedOption(name, value, i))
            else:
                nxt = argv[i + 1] if i + 1 < len(argv) else None
                takes = nxt is not None and (not nxt.startswith("-") or _is_number(nxt) or nxt == "-")
                options.append(ParsedOption(tok, nxt if takes else None, i))
                i += 1 if takes else 0
        else:
            positional.append(tok)
        i += 1
    return options, positional


def _is_number(tok: str) -> bool:
    try:
        float(tok)
        return True
    except ValueError:
        return False


def _spec_settings(engine: str, options: Sequence[ParsedOption]) -> dict | None:
    spec: dict | None = None
    for o in options:
        name = normal(engine, o.name)
        if name in ("--speculative-config", "-sc") and o.value is not None:
            try:
                value = json.loads(o.value)
            except ValueError as e:
                raise UsageError(f"{o.name}: the JSON does not parse: {e}",
                                 hint="quote the JSON object for the shell: --speculative-config '{\"method\": ...}'")\
                    from None
            if not isinstance(value, dict):
                raise UsageError(f"{o.name} must be a JSON object")
            spec = {**(spec or {}), **value}
        elif name in SHORTCUTS and o.value is not None:  # --spec-method / --spec-model / --spec-tokens
            spec = {**(spec or {}), SHORTCUTS[name]: int(o.value) if o.value.isdigit() else o.value}
        elif name.startswith("--speculative-config.") and o.value is not None:
            key = name.split(".", 1)[1]
            try:
                value = json.loads(o.value)
            except ValueError:
                value = o.value
            spec = {**(spec or {}), key: value}
    if spec is not None:
        spec = {str(k).replace("-", "_"): v for k, v in spec.items()}  # arg_utils.py reads '-' as '_'
    return spec


__all__ = ["LaunchOption", "LaunchRule", "LaunchLine", "OptionNames", "ParsedLine", "ParsedOption", "NUM_STEPS",
           "SHORTCUTS", "build_line", "trtllm_capture_ids", "launch_lines", "launch_rules", "option_names", "parse_line", "rule_for", "normal",
           "read_option", "switch_asked"]
