"""The config audit: config.json fields that make one engine serve the drafter differently
from another, or refuse it, each with its fix (docs/facts.md §9).

:func:`audit_config` reads the drafter's config, the names (and, for ``d2t``, the values)
of its tensors and the target, and returns warnings (area ``config``):

* ``draft_vocab_size`` missing while the drafter has its own ``lm_head``: SGLang then uses
  the target's head;
* ``d2t`` holding the identity map while the draft vocab equals the target's: vLLM refuses
  it at load (drop it); ``d2t`` missing while the draft vocab is reduced (an error: no
  engine can map the drafts; where the vocab check also runs, only its message is kept);
* ``embed_tokens`` shipped while the drafter embeds with the target's table: vLLM embeds
  with it unless it is the target's (:func:`audit_embedding` compares, when the target's
  embedding or captured embedding outputs are at hand; otherwise a notice says it could not);
* ``rope_parameters`` written without ``rope_scaling`` (readers before transformers 5 fall back
  to plain RoPE); a ``rope_scaling`` object alone, or ``"rope_scaling": null``, is read right by
  transformers 5.24, which converts it itself;
* ``max_position_embeddings`` below the context served (``--max-context``, default the
  target's own ``max_position_embeddings``; a notice when neither is known);
* flags only one engine honours: the input norm before fc on an MLA drafter (neither),
  ``rope_interleave: false`` (SGLang only), an ``fc.bias`` tensor (vLLM ignores it);
  ``norm_before_residual: true`` (vLLM only) is reported by the config reader;
* ``use_cache: false`` (strict Hub config validation refuses it);
* fields left out that the engines fill in with their config class's default (``rms_norm_eps``,
  ``head_dim``: canonical.json ``config_defaults``), and ``eagle_config: null``, which both
  engines read as no ``eagle_config`` at all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from eagle3conv.findings import (
    AUDIT_CONTEXT_UNKNOWN,
    AUDIT_EAGLE_CONFIG_NULL,
    AUDIT_ENGINE_DEFAULT,
    AUDIT_D2T_IDENTITY,
    AUDIT_D2T_MISSING,
    AUDIT_EMBED_DIFFERS,
    AUDIT_EMBED_UNCOMPARED,
    AUDIT_DRAFT_VOCAB,
    AUDIT_MAX_POSITIONS,
    AUDIT_ONE_ENGINE_FLAG,
    AUDIT_ROPE_FIELDS,
    AUDIT_USE_CACHE,
    CONFIG,
    Finding,
)
from eagle3conv.spec.canonical import D2T, EMBED, FC_BIAS, LM_HEAD, architecture_for, drafter_uses_own_embedding
from eagle3conv.spec.drafter import AUX_KEY, NORM_BEFORE_FC, architecture_key

_NBF = NORM_BEFORE_FC.on_when.flags[0]  # the config field of the input norm before fc


def _w(code: str, message: str, fix: str) -> Finding:
    return Finding("warning", CONFIG, code, message, fix)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def audit_config(
    config: Mapping[str, Any],
    tensor_names: set[str] | frozenset[str],
    *,
    read_d2t: Callable[[], Any] | None = None,
    target_vocab: int | None = None,
    max_context: int | None = None,
    max_context_from: str | None = None,
    context_unknown: str | None = None,
    embedding_comparison: Mapping[str, Any] | None = None,
    where: str = "config.json",
) -> list[Finding]:
    """The audit's findings for one drafter config (see the module text). ``read_d2t``
    returns the ``d2t`` values (a sequence of integers) when asked; ``target_vocab``:
    the target's vocab size (default: the config's ``vocab_size``); ``max_context``:
    the longest context the drafter will be served at, ``max_context_from`` where that
    figure comes from (default ``--max-context``); ``context_unknown``: why no context
    is known (a notice says the check could not run); ``embedding_comparison``: the
    drafter's ``embed_tokens`` against the target's (see :func:`audit_embedding`)."""
    out: list[Finding] = []
    cfg = config or {}
    vocab = target_vocab if _is_int(target_vocab) else cfg.get("vocab_size")
    draft_vocab = cfg.get("draft_vocab_size")
    mla = architecture_key(cfg, tensor_names) == "mla"  # the one MLA decision (spec.drafter)

    if LM_HEAD in tensor_names and draft_vocab is None:
        out.append(_w(AUDIT_DRAFT_VOCAB,
                      f"{where} has no draft_vocab_size but the drafter ships its own lm_head: SGLang then "
                      "uses the target's lm_head instead of the drafter's",
                      f"set draft_vocab_size in {where} to lm_head.weight's row count"))
    if D2T in tensor_names and read_d2t is not None and _is_int(vocab):
        vd = draft_vocab if _is_int(draft_vocab) else None
        try:
            d2t = [int(x) for x in read_d2t()]
        except Exception:  # noqa: BLE001 - an unreadable d2t is the vocab check's to report
            d2t = None
        if d2t is not None and len(d2t) == vocab and (vd is None or vd == vocab) and not any(d2t):
            out.append(_w(AUDIT_D2T_IDENTITY,
                          f"d2t maps every draft token to itself and the draft vocab equals the target's "
                          f"({vocab}): vLLM refuses such a d2t at load; SGLang does not need it",
                          "drop d2t (and t2d) from the weights: the full vocab needs no map"))
    if D2T not in tensor_names and _is_int(vocab) and _is_int(draft_vocab) and draft_vocab < vocab:
        out.append(Finding("error", CONFIG, AUDIT_D2T_MISSING,
                           f"{where} has draft_vocab_size {draft_vocab} below the vocab {vocab} but the weights hold "
                           "no d2t: SGLang and vLLM then read draft id i as target id i, and acceptance collapses",
                           "add the d2t of the training run (the trainer's vocab mapping), or convert again with "
                           "eagle3conv fix-keys, which checks and repairs the vocab maps"))
    if EMBED in tensor_names and not drafter_uses_own_embedding(
            cfg.get("hidden_size"), cfg.get("target_hidden_size")):
        out += audit_embedding(embedding_comparison, where=where)
    out += _rope_fields(cfg, where)
    mpe = cfg.get("max_position_embeddings")
    if _is_int(mpe) and _is_int(max_context) and mpe < max_context:
        from eagle3conv.spec.launch_check import context_outcomes

        what = context_outcomes(cfg, max_context)
        out.append(_w(AUDIT_MAX_POSITIONS,
                      f"max_position_embeddings is {mpe}, below the {max_context}-token context served "
                      f"({max_context_from or '--max-context'})"
                      + (": " + "; ".join(what) if what else "")
                      + "; where it serves longer, positions beyond it are out of the drafter's trained range",
                      f"set max_position_embeddings in {where} to at least {max_context} if the drafter was trained "
                      "for that range, or serve a shorter context (--context-length / --max-model-len)"))
    elif not _is_int(max_context) and context_unknown:
        out.append(Finding("notice", CONFIG, AUDIT_CONTEXT_UNKNOWN,
                           f"max_position_embeddings was not checked against the served context: {context_unknown}",
                           "pass --max-context N (the longest context you serve)"))
    # norm_before_residual: true (vLLM only) is reported by the config reader (checkpoint/config.py)
    if mla and cfg.get(_NBF):  # the engine rules: neither SGLang's nor vLLM's MLA drafter applies it
        out.append(_w(AUDIT_ONE_ENGINE_FLAG,
                      f"{_NBF} on an MLA drafter is honoured by neither SGLang nor vLLM",
                      f"drop {_NBF} from {where} (the engines ignore it) or retrain without it"))
    if cfg.get("rope_interleave") is False:
        out.append(_w(AUDIT_ONE_ENGINE_FLAG,
                      "rope_interleave: false is honoured by SGLang only; vLLM always applies interleaved RoPE, "
                      "so one of the two serves the drafter with the RoPE layout it was not trained with",
                      "keep the layout the drafter was trained with, and serve it on the engine that honours it"))
    if FC_BIAS in tensor_names:
        out.append(_w(AUDIT_ONE_ENGINE_FLAG,
                      "the drafter has an fc.bias: vLLM ignores .bias tensors silently, SGLang adds it",
                      "serve on SGLang, or fold the bias away and retrain"))
    if cfg.get("use_cache") is False:
        out.append(_w(AUDIT_USE_CACHE,
                      f"{where} has use_cache: false: strict Hub config validation refuses it",
                      f"set use_cache: true in {where}"))
    out += _engine_defaults(cfg, tensor_names, where)
    return out


def _rope_fields(cfg: Mapping[str, Any], where: str) -> list[Finding]:
    """Only ``rope_parameters`` written (no ``rope_scaling`` object): readers before transformers 5 read
    ``rope_scaling`` and fall back to plain RoPE. The other way round needs nothing: transformers 5.24
    turns a ``rope_scaling`` object into ``rope_parameters`` itself and reads ``rope_scaling`` back from
    it, and ``"rope_scaling": null`` is no RoPE scaling at all (docs/facts.md §13)."""
    scaling, params = cfg.get("rope_scaling"), cfg.get("rope_parameters")
    if not isinstance(params, Mapping) or isinstance(scaling, Mapping):
        return []
    kinds = {str(params.get("rope_type") or params.get("type") or "default")} if not any(
        isinstance(v, Mapping) for v in params.values()) else {
        str(v.get("rope_type") or v.get("type") or "default") for v in params.values() if isinstance(v, Mapping)}
    thetas = [params.get("rope_theta")] + [v.get("rope_theta") for v in params.values() if isinstance(v, Mapping)]
    # readers before transformers 5 take rope_theta from the top level, else their default 10000
    theta_only_there = "rope_theta" not in cfg and any(t is not None and t != 10000 for t in thetas)
    if kinds <= {"default"} and not theta_only_there:
        return []  # plain RoPE either way, and rope_theta where every reader finds it
    return [_w(AUDIT_ROPE_FIELDS,
               f"{where} has rope_parameters ({', '.join(sorted(kinds))}) but no rope_scaling"
               + (" and no top-level rope_theta" if theta_only_there else "")
               + ": readers before transformers 5 read only rope_scaling and rope_theta, and fall back to plain "
                 "RoPE" + (" with theta 10000" if theta_only_there else ""),
               f"write rope_scaling (and rope_theta) in {where} with the same settings as rope_parameters")]


def _engine_defaults(cfg: Mapping[str, Any], tensor_names, where: str) -> list[Finding]:
    """What the engines assume for fields the config leaves out (canonical.json ``config_defaults``),
    and for ``eagle_config: null`` (docs/facts.md §3)."""
    out = []
    for d in architecture_for(dict(cfg), tensor_names).config_defaults:
        if cfg.get(d.field) is not None:
            continue
        assumed = (f"the engines assume {d.field} = {d.assumed}" if d.assumed is not None
                   else f"the engines assume their own default for {d.field}")
        out.append(Finding(d.level, CONFIG, AUDIT_ENGINE_DEFAULT,
                           f"{where} has no {d.field}: {assumed} ({d.why})",
                           f"write {d.field} into {where} with the value the drafter was trained with"))
    if "eagle_config" in cfg and cfg["eagle_config"] is None:
        out.append(_w(AUDIT_EAGLE_CONFIG_NULL,
                      f"{where} has eagle_config: null: SGLang and vLLM read it as no eagle_config at all, so "
                      "SGLang captures its default aux layers (it reads ids only from eagle_config) and no switch "
                      f"is read from it (use_aux_hidden_state stays true, {_NBF} comes from the top level)",
                      f"remove eagle_config from {where}, or write it as an object with {AUX_KEY} "
                      "(eagle3conv config does)"))
    return out


def audit_embedding(comparison: Mapping[str, Any] | None, *, where: str = "config.json") -> list[Finding]:
    """The finding for a drafter that ships ``embed_tokens`` while it embeds with the target's
    table: SGLang replaces it with the target's, vLLM keeps it unless identical (docs/facts.md
    §4, §9). ``comparison`` (from verify: ``rows`` compared of ``of``, ``max_abs_diff``,
    ``identical``, ``how``) says whether it is the target's; None or ``identical`` None:
    a notice that it could not be compared."""
    cmp = dict(comparison or {})
    if cmp.get("identical") is True:
        return []
    if cmp.get("identical") is False:
        seen = (f"{cmp.get('rows')} of {cmp.get('of')} rows compared, max difference {cmp['max_abs_diff']:.3g}"
                if cmp.get("max_abs_diff") is not None else str(cmp.get("how") or "compared"))
        return [_w(AUDIT_EMBED_DIFFERS,
                   f"the weights hold an embed_tokens that is not the target's ({seen}): vLLM embeds with it, "
                   "SGLang with the target's, so the two engines draft differently",
                   "drop embed_tokens.weight from the weights (both engines then share the target's), or copy "
                   "the target's exactly")]
    if cmp.get("identical_rows"):
        return [Finding("notice", CONFIG, AUDIT_EMBED_UNCOMPARED,
                        f"the weights hold an embed_tokens whose {cmp.get('rows')} rows the states hold equal the "
                        f"target's; the other {int(cmp.get('of') or 0) - int(cmp.get('rows') or 0)} rows were not "
                        "compared: vLLM embeds with the drafter's table unless the whole table is identical to the "
                        "target's, SGLang always uses the target's",
                        "run eagle3conv verify with --embeddings TARGET_DIR (it compares the whole table), or drop "
                        + EMBED)]
    why = cmp.get("how") or "the target's embedding is not at hand"
    return [Finding("notice", CONFIG, AUDIT_EMBED_UNCOMPARED,
                    f"the weights hold an embed_tokens; whether it is the target's was not checked ({why}): vLLM "
                    "embeds with it unless it is identical to the target's, SGLang always uses the target's",
                    "run eagle3conv verify with captured states (it compares the rows), or drop embed_tokens.weight")]
