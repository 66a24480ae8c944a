"""A user's own launch line, judged against the release's launch data (docs/facts.md §13).

:func:`check_line` takes a :class:`~eagle3conv.spec.launch.ParsedLine` (an SGLang command, a
``vllm serve`` command, or vLLM's ``--speculative-config`` JSON alone), the drafter's config and
tensor names, and returns a :class:`LaunchCheck`: one finding (area ``launch``) per problem,
each naming the release and its fix, and the corrected command with every fix applied.

What it looks at, each read from the released code (mappings/engines/launch.json says where):

* option names the release does not have (and ``--speculative-config`` keys vLLM refuses), with
  the nearest spelling (:mod:`difflib`);
* SGLang ``--speculative-algorithm`` other than EAGLE3 (EAGLE captures no aux states: accept
  length 1.0); vLLM without ``method`` (picked from the drafter's path) or with another method;
* SGLang's draft inheriting the target's ``--quantization`` (awq/gptq fail at start-up, fp8 runs a
  bf16 drafter online-quantized); a quantized KV cache the draft follows while the drafter ships no
  ``k_scale``/``v_scale`` (scale 1.0); fp16 serving of a bf16-trained drafter;
* ``--json-model-override-args`` (SGLang: applied to the drafter too) and ``--hf-overrides``
  (vLLM: target only);
* the served context against the drafter's (SGLang refuses to start; vLLM raises the drafter's
  positions for cache-only RoPE, else lowers the server's ``max_model_len``);
* the switches the drafter needs on the release (the sliding-window option, parallel drafting),
  and a release that cannot load the drafter at all.
"""

from __future__ import annotations

import difflib
import json
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from eagle3conv.findings import (
    LAUNCH,
    LAUNCH_ABBREVIATED,
    LAUNCH_ALGORITHM,
    LAUNCH_CANNOT_SERVE,
    LAUNCH_CONTEXT,
    LAUNCH_DRAFT_QUANTIZATION,
    LAUNCH_FP16,
    LAUNCH_KV_SCALES,
    LAUNCH_METHOD_FROM_PATH,
    LAUNCH_NO_DRAFT,
    LAUNCH_OVERRIDES,
    LAUNCH_SWITCH,
    LAUNCH_UNKNOWN_OPTION,
    Finding,
)
from eagle3conv.spec.engines import EngineRelease, cannot_load, drafter_kind, window_launch_option
from eagle3conv.spec.launch import SHORTCUTS, LaunchRule, ParsedLine, normal, option_names, rule_for, switch_asked

UNQUANTIZED_KV = (None, "auto", "bf16", "bfloat16", "fp16", "float16", "half", "float32", "fp32")
FAILS_TO_START = ("awq", "gptq")  # SGLang looks for the drafter's own awq/gptq config and fails without one


@dataclass(frozen=True)
class Edit:
    """One fix to the user's line: give ``name`` (an option, or a ``--speculative-config`` key) ``value``."""

    name: str
    value: Any
    key: bool = False  # a speculative-config key, not an option


@dataclass(frozen=True)
class LaunchCheck:
    release: EngineRelease
    findings: tuple[Finding, ...]
    corrected: str | None  # the user's line with every fix applied (None: nothing to correct)
    names_from: str | None  # the release whose option names were checked
    names_note: str | None
    checked: tuple[str, ...]  # what was looked at, in words (the card's launch section says it)
    target: str | None = None  # the target the line names
    draft: str | None = None  # the drafter path (or repo) the line names

    @property
    def ok(self) -> bool:
        return not any(f.level == "error" for f in self.findings)

    def to_dict(self) -> dict:
        return {"release": self.release.spec, "label": str(self.release), "ok": self.ok,
                "findings": [f.to_dict() for f in self.findings], "corrected": self.corrected,
                "option_names_from": self.names_from, "option_names_note": self.names_note,
                "checked": list(self.checked)}


def _f(level: str, code: str, rel: EngineRelease, message: str, fix: str | None) -> Finding:
    return Finding(level, LAUNCH, code, f"{rel}: {message}", fix, subject=rel.spec)


class _Line:
    """The parsed line with the release's data at hand: values by role, edits collected."""

    def __init__(self, parsed: ParsedLine, rule: LaunchRule, rel: EngineRelease, names) -> None:
        self.p, self.rule, self.rel, self.names = parsed, rule, rel, names
        self.edits: list[Edit] = []
        self.findings: list[Finding] = []
        self.spec = dict(parsed.spec or {})
        by_source: dict[str, set[str]] = {}
        for name, where in (names.sources or {}).items():
            by_source.setdefault(where, set()).add(name)
        self.aliases = by_source

    def spellings(self, option: str) -> set[str]:
        src = (self.names.sources or {}).get(option)
        return self.aliases.get(src, {option}) if src else {option}

    def value(self, role: str) -> Any:
        o = self.rule.role(role)
        if o is None:
            return None
        if o.key:
            return self.spec.get(o.key)
        if o.option:
            names = self.spellings(o.option)
            found = [x.value for x in self.p.options if normal(self.p.engine, x.name) in names]
            return found[-1] if found else None
        return self.p.positional[0] if self.p.positional else None

    def given(self, role: str) -> bool:
        o = self.rule.role(role)
        if o is None:
            return False
        if o.key:
            return o.key in self.spec
        names = self.spellings(o.option) if o.option else set()
        return any(normal(self.p.engine, x.name) in names for x in self.p.options)

    def available(self, role: str) -> bool:
        """Whether the release has the role's option (or key); True when its names were not read."""
        o = self.rule.role(role)
        if o is None:
            return False
        if self.names.read_from is None:
            return True
        return (o.option in self.names.options) if o.option else (not o.key or not self.names.keys
                                                                  or o.key in self.names.keys)

    def fix(self, role: str, value: Any) -> str:
        o = self.rule.role(role)
        self.edits.append(Edit(o.key or o.option, value, key=bool(o.key)))
        return f"set {o.name} {value}" if o.option else f"set \"{o.key}\": {json.dumps(value)} in --speculative-config"

    def add(self, level: str, code: str, message: str, fix: str | None) -> None:
        self.findings.append(_f(level, code, self.rel, message, fix))


def check_line(parsed: ParsedLine, release: EngineRelease, config: Mapping[str, Any] | None, *,
               tensor_names: Iterable[str] = (), drafter: str | None = None,
               target_context: tuple[int, str] | None = None, hf_quant: Mapping | None = None) -> LaunchCheck:
    """Judge ``parsed`` for ``release`` and the drafter (``config``, ``tensor_names``; ``drafter``:
    its path, for the fixes). ``target_context``: the target's context and where it comes from,
    used when the line sets none."""
    cfg = dict(config or {})
    original = parsed
    names = option_names(release)
    line = _Line(parsed, rule_for(release), release, names)
    checked = ["option names" + (f" (read from {release.engine} {names.read_from})" if names.read_from else
                                  " (none read for this engine: not checked)")]
    parsed = _renamed(parsed, _unknown(line))  # the later checks (and the corrected line) read the right names
    line.p, line.spec = parsed, dict(parsed.spec or {})
    refused = cannot_load(release, cfg, tensor_names)
    if refused:
        line.add("error", LAUNCH_CANNOT_SERVE, "; ".join(r.removeprefix(f"{release} ") for r in refused),
                 "serve the drafter on another engine release (eagle3conv launch CKPT shows the lines)")
    checked += _algorithm(line, cfg, drafter)
    checked += _quantization(line, cfg, set(tensor_names), hf_quant)
    checked += _dtype(line, cfg)
    checked += _overrides(line, cfg)
    checked += _context(line, cfg, target_context)
    checked += _switches(line, cfg)
    renamed = parsed != original
    corrected = _apply(parsed, line.edits) if line.edits or renamed else None
    return LaunchCheck(release, tuple(line.findings), corrected, names.read_from, names.note, tuple(checked),
                       line.value("target"), line.value("draft"))


def _nearest(name: str, names: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.6)
    return close[0] if close else None


def _renamed(parsed: ParsedLine, renames: Mapping[Any, str]) -> ParsedLine:
    """``parsed`` with each misspelt option (by its place) or speculative-config key renamed."""
    if not renames:
        return parsed
    options = tuple(replace(o, name=renames.get(o.index, o.name)) for o in parsed.options)
    spec = None if parsed.spec is None else {
        renames.get(("key", k), k): v for k, v in parsed.spec.items()
        if renames.get(("key", k), k) == k or renames[("key", k)] not in parsed.spec}  # a given key wins
    return replace(parsed, options=options, spec=spec)


def _unknown(line: _Line) -> dict:
    """Report the names the release lacks; returns the renames to the nearest spelling."""
    names, engine = line.names, line.p.engine
    renames: dict = {}
    if names.read_from is None:
        return renames
    for o in line.p.options:
        n = normal(engine, o.name)
        if engine == "vllm" and n.startswith("--speculative-config."):
            continue  # its key is checked with the JSON's
        if n in names.options or (engine == "vllm" and n.startswith("--no-") and "--" + n[5:] in names.options):
            continue
        expand = [x for x in names.options if x.startswith(n)] if line.rule.abbreviations else []
        if len(expand) == 1:
            line.add("notice", LAUNCH_ABBREVIATED, f"{o.name} is read as {expand[0]} (argparse expands abbreviations)",
                     f"write {expand[0]} in full")
            continue
        near = _nearest(n, names.options)
        if near:
            renames[o.index] = near
        line.add("error", LAUNCH_UNKNOWN_OPTION,
                 f"{o.name} is not an option of this release" + (f" (did you mean {near}?)" if near else "")
                 + ": the server refuses to start", f"write {near}" if near else f"drop {o.name}")
    if engine == "vllm" and names.keys:
        for key in line.spec:
            if key not in names.keys:
                near = _nearest(key, names.keys)
                if near:
                    renames[("key", key)] = near
                line.add("error", LAUNCH_UNKNOWN_OPTION,
                         f"--speculative-config has the key \"{key}\", which SpeculativeConfig does not have "
                         f"(it forbids any other key: the server refuses to start)"
                         + (f"; did you mean \"{near}\"?" if near else ""),
                         f"write \"{near}\"" if near else f"drop \"{key}\"")
    return renames


def _algorithm(line: _Line, cfg: Mapping, drafter: str | None) -> list[str]:
    algo = line.rule.role("algorithm")
    value = line.value("algorithm")
    have = str(value).upper() if algo.case == "upper" and value is not None else value
    path = line.value("draft")
    if path is None:
        target = drafter or "DRAFTER"
        line.add("error", LAUNCH_NO_DRAFT, f"the line names no drafter ({line.rule.role('draft').name})",
                 line.fix("draft", target))
    if value is None and line.p.engine == "vllm":
        method = _vllm_method(str(path or drafter or ""))
        if method == algo.value:
            line.add("warning", LAUNCH_METHOD_FROM_PATH,
                     f"--speculative-config has no \"method\": vLLM picks {method} only because the drafter's path "
                     f"contains '{method}'; the same folder renamed runs as an independent draft model",
                     line.fix("algorithm", algo.value))
        else:
            line.add("error", LAUNCH_METHOD_FROM_PATH,
                     f"--speculative-config has no \"method\" and the drafter's path ({path or drafter}) does not "
                     f"contain 'eagle3': vLLM runs it as method {method}"
                     + (f" ({algo.wrong[method]})" if method in algo.wrong else ""),
                     line.fix("algorithm", algo.value))
    elif value is None:
        line.add("error", LAUNCH_ALGORITHM, f"the line has no {algo.name}: the server runs without speculative "
                                            "decoding", line.fix("algorithm", algo.value))
    elif have != algo.value:
        why = algo.wrong.get(have) or f"{value} is not the EAGLE-3 {('algorithm', 'method')[bool(algo.key)]}"
        line.add("error", LAUNCH_ALGORITHM, f"{algo.name} {value}: {why}", line.fix("algorithm", algo.value))
    return [f"{algo.name} (must be {algo.value})", f"{line.rule.role('draft').name}"]


def _vllm_method(path: str) -> str:
    """The method vLLM 0.33.0 picks for a drafter path when none is given (launch.json's algorithm)."""
    p = path.lower()
    for needle, method in (("eagle-", "eagle"), ("eagle3", "eagle3"), ("dflash", "dflash"), ("dspark", "dspark")):
        if needle in p:
            return method
    return "draft_model"


def _has_scales(tensor_names: set[str]) -> bool:
    return any(n.endswith(("k_scale", "v_scale")) for n in tensor_names)


def _draft_quantization(line: _Line, cfg: Mapping, hf_quant, q, dq) -> None:
    """The draft's quantization against the drafter's own (its quantization_config or
    hf_quant_config.json, read by :func:`eagle3conv.spec.quant.launch_quant`; docs/facts.md §14)."""
    from eagle3conv.spec import quant

    target_q, draft_q = line.value("quantization"), line.value("draft_quantization")
    if line.rel.engine == "vllm":
        draft_q = line.spec.get(dq.key) if dq.key else draft_q
    own = quant.launch_quant(line.rel.engine, line.rel.version, drafter_kind(cfg), dict(cfg), hf_quant, ())
    quantized = bool(cfg.get("quantization_config")) or not (hf_quant is None or quant.hf_quant_method_missing(hf_quant))
    if quantized:
        if own.value is None or draft_q == own.value:
            return
        if draft_q is None and not (dq.inherits == "quantization" and target_q not in (None, dq.opt_out)):
            return  # unset, the draft folder's own config decides
        why = (f"{dq.name} {draft_q}: the drafter is stored {own.value}" if draft_q is not None else
               f"{q.name} {target_q} with no {dq.name}: the draft takes {target_q}, which 0.5.23 keeps over the "
               f"drafter's own {own.value} when it calls them compatible")
        line.add("error" if draft_q == dq.opt_out else "warning", LAUNCH_DRAFT_QUANTIZATION,
                 why + " (docs/facts.md §14)", line.fix("draft_quantization", own.value))
        return
    if dq.inherits == "quantization" and target_q not in (None, dq.opt_out) and draft_q is None:
        fails = str(target_q).startswith(FAILS_TO_START)
        line.add("error" if fails else "warning", LAUNCH_DRAFT_QUANTIZATION,
                 f"{q.name} {target_q} with no {dq.name}: the draft takes {target_q} too, and this drafter is not "
                 "quantized -- " + (f"start-up fails looking for its {target_q} config" if fails else
                                    f"its bf16-trained weights run {target_q}-quantized online"),
                 line.fix("draft_quantization", dq.opt_out))


def _quantization(line: _Line, cfg: Mapping, tensor_names: set[str], hf_quant: Mapping | None = None) -> list[str]:
    rule, out = line.rule, []
    q, dq = rule.role("quantization"), rule.role("draft_quantization")
    if q is not None and dq is not None:
        out.append(f"{dq.name} (unset: " + (f"takes {q.name}" if dq.inherits else "the drafter's own config") + ")")
        _draft_quantization(line, cfg, hf_quant, q, dq)
    kv, dkv = rule.role("kv_cache_dtype"), rule.role("draft_kv_cache_dtype")
    if kv is not None and dkv is not None:
        out.append(f"{dkv.name} (unset: follows {kv.name})")
        effective = line.value("draft_kv_cache_dtype") or (line.value("kv_cache_dtype")
                                                          if dkv.inherits == "kv_cache_dtype" else None)
        if effective not in UNQUANTIZED_KV and not _has_scales(tensor_names):
            how = (f"{kv.name} {effective}, which the draft's KV cache follows" if not line.given("draft_kv_cache_dtype")
                   else f"{dkv.name} {effective}")
            fix = (line.fix("draft_kv_cache_dtype", dkv.fix_value) if line.available("draft_kv_cache_dtype") else
                   f"{line.fix('kv_cache_dtype', dkv.fix_value)} (this release has no {dkv.name}: the draft's KV "
                   f"cache follows {kv.name})")
            line.add("warning", LAUNCH_KV_SCALES,
                     f"{how}, and the drafter ships no k_scale/v_scale: its KV cache runs {effective} at scale 1.0 "
                     "(a public measurement: accept length 2.6-2.8 -> 1.79)", fix)
    return out


def _trained_dtype(cfg: Mapping) -> str | None:
    d = cfg.get("torch_dtype") or cfg.get("dtype")
    return d if isinstance(d, str) else None


def _dtype(line: _Line, cfg: Mapping) -> list[str]:
    o = line.rule.role("dtype")
    if o is None:
        return []
    value = line.value("dtype")
    if value in ("half", "float16", "fp16") and _trained_dtype(cfg) == "bfloat16":
        line.add("warning", LAUNCH_FP16,
                 f"{o.name} {value} serves the drafter in fp16 (the draft runs in the server's dtype), and it was "
                 "trained in bf16: the feature fusion overflows (a public report: acceptance 0.06 of 15)",
                 line.fix("dtype", "bfloat16"))
    return [f"{o.name} against the drafter's torch_dtype"]


def _overrides(line: _Line, cfg: Mapping) -> list[str]:
    o = line.rule.role("model_overrides")
    if o is None:
        return []
    raw = line.value("model_overrides")
    if raw in (None, "{}"):
        return [o.name]
    try:
        over = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return [o.name]
    if not isinstance(over, dict):
        return [o.name]
    changed = sorted(k for k, v in over.items() if cfg.get(k) != v)
    if not changed:
        return [o.name]
    if o.reaches_drafter:
        line.add("warning", LAUNCH_OVERRIDES,
                 f"{o.name} is applied to the drafter's config too: it changes the drafter's {', '.join(changed)} "
                 "from what config.json says",
                 f"keep in {o.name} only what is right for the drafter as well, or write the drafter's fields into "
                 "its config.json to the same values")
    else:
        line.add("notice", LAUNCH_OVERRIDES,
                 f"{o.name} stays with the target (a dict is not passed to the draft): the drafter keeps its own "
                 f"{', '.join(changed)}", f"write {', '.join(changed)} into the drafter's config.json if it needs them")
    return [o.name]


def rope_types(cfg: Mapping) -> list[str]:
    """The drafter's RoPE types, as its config spells them (``default`` when none)."""
    out = []
    for key in ("rope_parameters", "rope_scaling"):
        v = cfg.get(key)
        if isinstance(v, Mapping):
            subs = [x for x in v.values() if isinstance(x, Mapping)] if not ({"rope_type", "type"} & set(v)) else [v]
            out += [str(s.get("rope_type") or s.get("type") or "default") for s in subs]
    return out or ["default"]


def _sglang_context(cfg: Mapping) -> int | None:
    """The drafter's context as SGLang derives it (get_context_length): max_position_embeddings times
    rope_scaling's factor, unless that has original_max_position_embeddings or is llama3."""
    mpe = cfg.get("max_position_embeddings")
    if not isinstance(mpe, int) or isinstance(mpe, bool):
        return None
    # under transformers 5 config.rope_scaling is rope_parameters, standardised: llama3, yarn and longrope
    # get original_max_position_embeddings (modeling_rope_utils.py standardize_rope_params)
    rs = next((v for v in (cfg.get("rope_scaling"), cfg.get("rope_parameters")) if isinstance(v, Mapping)), None)
    kind = (rs or {}).get("rope_type") or (rs or {}).get("type")
    factor = 1
    if rs and "original_max_position_embeddings" not in rs and kind not in ("llama3", "yarn", "longrope"):
        factor = rs.get("factor", 1) if isinstance(rs.get("factor", 1), (int, float)) else 1
    return int(factor * mpe)


def _context(line: _Line, cfg: Mapping, target_context: tuple[int, str] | None) -> list[str]:
    o, below = line.rule.role("context_length"), line.rule.context_below
    if o is None or below is None:
        return []
    given = line.value("context_length")
    served = (int(given), o.name) if isinstance(given, str) and given.isdigit() else target_context
    if served is None:
        return [f"the served context ({o.name} not given, no target context known: not checked)"]
    n, where = served
    mpe = cfg.get("max_position_embeddings")
    what, detail = _context_outcome(below, cfg, n)
    if what == "refuses":
        derived, env = detail, below.get("override_env")
        if line.p.env.get(env) in ("1", "true", "True"):
            line.add("notice", LAUNCH_CONTEXT, f"the served context {n} ({where}) is above the drafter's {derived}; "
                     f"with {env}=1 it overrides the drafter's max_position_embeddings to {n}",
                     f"set max_position_embeddings in config.json to at least {n} (the range it was trained for)")
        else:
            line.add("error", LAUNCH_CONTEXT,
                     f"the served context {n} ({where}) is above the drafter's derived context {derived} "
                     f"(max_position_embeddings {mpe}): the server refuses to start (_derive_context_length)",
                     f"set max_position_embeddings in the drafter's config.json to at least {n}, or launch with "
                     f"{env}=1")
    elif what is not None and line.spec.get("method", "eagle3") != "draft_model":
        types = detail
        if what == "raises":
            line.add("notice", LAUNCH_CONTEXT, f"the drafter's max_position_embeddings {mpe} is below the served "
                     f"{n} ({where}); its RoPE ({', '.join(types)}) only sizes a cache, so vLLM raises it to {n}",
                     None)
        else:
            line.add("warning", LAUNCH_CONTEXT,
                     f"the drafter's max_position_embeddings {mpe} is below the served {n} ({where}) and its RoPE "
                     f"({', '.join(types)}) is not cache-only: the default model runner lowers the server's "
                     f"max_model_len to the drafter's, with a warning only",
                     f"set max_position_embeddings in the drafter's config.json to at least {n} if it was trained "
                     "for that range, or serve the shorter context knowingly")
    return [f"the served context against the drafter's max_position_embeddings ({where})"]


def _switches(line: _Line, cfg: Mapping) -> list[str]:
    out = []
    option = window_launch_option(line.rel, cfg)
    if option:
        name, value = option.split()
        have = next((x.value for x in line.p.options if x.name == name), None)
        if have != value:
            line.add("warning", LAUNCH_SWITCH,
                     f"the drafter was trained with a sliding window of {value} tokens and the line "
                     + ("does not pass" if have is None else f"passes {have} for") + f" {name}: "
                     f"the release reads the window only from that option",
                     _fix_option(line, name, value))
        out.append(name)
    for sw, role in line.rule.switch_roles():
        if switch_asked(line.rel, cfg, sw) and line.spec.get(role.key) is not True:
            line.add("warning", LAUNCH_SWITCH, role.missing.format(key=role.key), line.fix(role.role, True))
        out.append(role.name)
    return out


def _fix_option(line: _Line, name: str, value: str) -> str:
    line.edits.append(Edit(name, value))
    return f"set {name} {value}"


def _apply(parsed: ParsedLine, edits: list[Edit]) -> str:
    """The user's line with ``edits`` applied (their other options kept, in their order)."""
    spec = dict(parsed.spec or {})
    for e in edits:
        if e.key:
            spec[e.name] = e.value
    if parsed.spec_only:
        return json.dumps(spec)
    pairs: list[list[Any]] = []
    for o in parsed.options:
        n = normal(parsed.engine, o.name)
        if parsed.engine == "vllm" and (n in ("--speculative-config", "-sc", *SHORTCUTS)
                                        or n.startswith("--speculative-config.")):
            continue  # said once, in the --speculative-config written below
        pairs.append([o.name, o.value])
    for e in edits:
        if e.key:
            continue
        hit = [p for p in pairs if normal(parsed.engine, p[0]) == e.name]
        if hit:
            hit[-1][1] = e.value
        else:
            pairs.append([e.name, e.value])
    argv = [f"{k}={v}" for k, v in parsed.env.items()] + list(parsed.command) + list(parsed.positional[:1])
    for name, value in pairs:
        argv += [name] if value is None else [name, str(value)]
    if parsed.engine == "vllm" and (spec or any(e.key for e in edits)):
        argv += ["--speculative-config", json.dumps(spec)]
    argv += list(parsed.positional[1:])
    return shlex.join(argv)


def _releases_words(engine: str) -> str:
    """``SGLang 0.5.12-0.5.23``: an engine and the span of its releases read."""
    from eagle3conv.spec.engine_rules import engines

    eng = engines()[engine]
    span = eng.oldest if eng.oldest == eng.newest else f"{eng.oldest}-{eng.newest}"
    return f"{eng.title} {span}" if span else eng.title


def context_outcomes(cfg: Mapping, served: int) -> list[str]:
    """What each engine's releases do when ``served`` tokens exceed the drafter's context, in words
    (launch.json ``context_below``): SGLang refuses to start, vLLM raises the drafter's positions for a
    cache-only RoPE and otherwise lowers the server's max_model_len. Empty when none is affected."""
    from eagle3conv.spec.launch import launch_rules

    out = []
    mpe = cfg.get("max_position_embeddings")
    for engine, rules in launch_rules().items():
        for rule in rules:
            below = rule.context_below
            if below is None:
                continue
            who = _releases_words(engine)
            what, detail = _context_outcome(below, cfg, served)
            if what == "refuses":
                out.append(f"{who} refuses to start (the drafter's derived context {detail} is below it) unless "
                           f"{below.get('override_env')}=1")
            elif what == "raises":
                out.append(f"{who} raises the drafter's max_position_embeddings to {served} (its RoPE, "
                           f"{', '.join(detail)}, only sizes a cache)")
            elif what == "lowers":
                out.append(f"{who} lowers the server's max_model_len to the drafter's {mpe} (its RoPE, "
                           f"{', '.join(detail)}, is not cache-only), with a warning only")
    return out


def _context_outcome(below: Mapping[str, Any], cfg: Mapping, served: int) -> tuple[str | None, Any]:
    """What a release does (its launch data's ``context_below``) when ``served`` tokens exceed the drafter's
    context: ``("refuses", derived context)`` (SGLang's derived context is below it), ``("raises", RoPE types)``
    (a cache-only RoPE: vLLM raises the drafter's positions), ``("lowers", RoPE types)`` (vLLM lowers the
    server's max_model_len); ``(None, None)`` when the context fits."""
    if below["behaviour"] == "refuses":
        derived = _sglang_context(cfg)
        return ("refuses", derived) if derived is not None and served > derived else (None, None)
    mpe = cfg.get("max_position_embeddings")
    if not (isinstance(mpe, int) and mpe < served):
        return None, None
    types = rope_types(cfg)
    return ("raises" if all(t in below["cache_only_rope_types"] for t in types) else "lowers"), types


__all__ = ["LaunchCheck", "Edit", "check_line", "context_outcomes", "rope_types"]
