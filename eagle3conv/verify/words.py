"""The words of verify's verdict: what :class:`~eagle3conv.verify.search.Verdict`'s codes and
values say to people (the report's sentences and the text both come from here; no decision
reads them back). It reads the verdict's fields and imports none of its types: it sits below
:mod:`~eagle3conv.verify.search`."""

from __future__ import annotations

# what would separate the set, by :class:`~eagle3conv.verify.search.SeparationReason` (its value)
SEPARATION_WHY: dict[str, str] = {
    "factor": "more data like this would separate them",
    "no-gap": "some wirings in the set show no gap to the best at all",
    "unconfirmed": "the screen kept wirings verify did not confirm",
    "capped": "the screen stopped at its work cap before the data excluded them",
}


def coverage_summary(v) -> str | None:
    """A global search's coverage in one sentence (the report's ``coverage.summary``), once the
    verdict weighed its scores (``v.positions``); None for a search that was not global."""
    cov = v.coverage
    if cov is None or not cov.is_global or v.positions is None:
        return None
    return (f"global search: {cov.screened} wirings screened (every ascending set of the "
            f"{cov.layers} layers the states hold) on up to {cov.screen_positions} positions, "
            f"{cov.confirmed} confirmed on all {v.positions}"
            + (f", {cov.refined} more by local refinement" if cov.refined else ""))


def norm_flag_words(flagged: list[dict]) -> list[str]:
    """The config's slots whose norms are out of line with training (:func:`~eagle3conv.verify.search.norm_comparison`
    rows), one sentence each."""
    return [f"slot {c['slot']} ({c['layer']}): inference median {c['inference_median']:.3g} vs "
            f"training {c['training_median']:.3g} ({c['ratio']:.2f}x)" for c in flagged]


def statistic_words(by, log_step: int) -> str:
    """The statistics that narrowed the set, in order, for people (``acceptance, then the step-1 log score``)."""
    words = {"acceptance": "acceptance", "log-score": f"the step-{log_step + 1} log score",
             "norm-fingerprint": "the norm fingerprint"}
    return ", then ".join(words[b] for b in by)


def set_words(names: list[str], limit: int = 6, total: int | None = None) -> str:
    total = len(names) if total is None else total
    return "; ".join(names[:limit]) + (f"; and {total - min(limit, len(names))} more" if total > limit else "")


def verdict_words(v) -> tuple[str | None, str | None]:
    """A verdict's ``decided_by`` and ``advice`` (its status, :class:`~eagle3conv.verify.search.Grounds`,
    set, separation and coverage) in words."""
    g = v.grounds
    if v.status is None or g is None:
        return None, None
    if v.status == "undecided":
        return (f"not decided: a wiring search needs at least {g.min_sequences} sequences with full chains "
                f"(these states have {g.sequences}); capture more"), None
    return _decided_by(v, g), _advice(v, g)


def _decided_by(v, g) -> str:
    how = statistic_words(g.by, g.log_step)
    verb = " leaves" if len(g.by) == 1 else ", leave"
    size = g.size
    if v.status == "stands":
        who = "the training record's" if g.standing == "training-record" else "the config's"
        out = ((f"{how}{verb} {size} wirings within 95% of the best and {who} wiring is among them"
                if size > 1 else f"{how}{verb} only {who} wiring within 95% of the best")
               + (" (its norms match training)" if g.standing_in_line else "") + ", so it stands")
        ls = v.log_score
        if size > 1 and ls and ls["leader"] != g.chosen and ls["separated"]:
            out += f" (the log score prefers {ls['leader']}: see verdict.log_score)"
        return out
    if g.neighbourhood:
        cov = v.coverage
        where = ("only the wirings near the evidence were scored" if cov is None else
                 f"the states hold {cov.layers} of the target's layers (missing: "
                 + ", ".join(map(str, cov.missing_layers[:8]))
                 + (" ..." if len(cov.missing_layers) > 8 else "") + ")")
        return (f"best in the searched neighbourhood: {g.chosen}, separated from the wirings scored, but not a "
                f"global search ({where}); capture every layer (eagle3conv capture without --layers) and search "
                "again")
    if v.status == "named":
        if g.statistic == "acceptance":
            return "acceptance"
        if g.statistic == "log-score":
            nxt = v.log_score["differences"][0]
            return (f"log score: acceptance cannot separate {g.tied} wirings; the log-probability the drafter gives "
                    f"the target's token at draft step {g.log_step + 1} (a proper scoring rule, on "
                    f"{v.log_score['positions']} positions) separates this one from every wiring acceptance leaves "
                    f"tied with it (closest: {nxt['layers']}, {nxt['log_score_gap']:+.4f} nats "
                    f"[{nxt['ci95'][0]:+.4f}, {nxt['ci95'][1]:+.4f}] paired)")
        return ("norm fingerprint: acceptance cannot separate the leaders, and of them only this wiring's norms are "
                "in line with training")
    n_unconfirmed, cov = g.unconfirmed, v.coverage
    what = f"{size} wirings" + (f" ({n_unconfirmed} of them kept by the screen, not confirmed)"
                                if n_unconfirmed else "")
    more = v.to_separate
    why = type(more.reason)
    if more.reason is why.FACTOR:
        sep = f"about {more.sequences} sequences like these ({more.sequences_now} now) would separate them"
    elif more.reason is why.CAPPED:
        scr = cov.screen
        fin = scr.get("to_finish") or {}
        what_cap = "its time budget" if scr.get("stopped_by") == "seconds" else "its work cap"
        sep = (f"the screen stopped at {what_cap} with {n_unconfirmed} of them not excluded, after "
               f"{scr['read']['positions']} of {scr['read']['of']} positions: the work, not the data, ran "
               f"out; about {fin.get('seconds')} s more (verify --search-budget {fin.get('budget')}) would "
               "read every position for them, or a training record would decide" + _leaders_words(cov, g.leaders))
    elif more.reason is why.UNCONFIRMED:
        sep = (f"the screen read all {more.sequences_now} sequences and could not exclude "
               f"{n_unconfirmed} of them" + (_leaders_words(cov, g.leaders) or
                                             ": more data may (capture more and search again)"))
    else:
        sep = "no amount of data like this separates them at the gaps seen (some show none); a training record would"
    listed = set_words([c.layers for c in v.confidence_set], total=size)
    return (f"the data cannot tell which of {what} the drafter was trained on ({how}{verb} "
            f"them all within 95% of the best: {listed}); {sep}" + _not_global(cov))


def _advice(v, g) -> str | None:
    tgt = f" --target {g.target}" if g.target else ""

    def command(ids) -> str:
        return f"eagle3conv config {g.path}{tgt} --trained-on {','.join(map(str, ids))} --captured-at output"

    one = g.size == 1  # the data points at one wiring (named, or the best of a neighbourhood)
    advice = None
    if v.status != "ambiguous" and (not g.chosen_is_config or not g.config_names_layers):
        advice = f"the drafter was most likely trained on {g.chosen}; write it: {command(g.chosen_ids)}"
    capture_advice = _capture_advice(v, g) if v.status == "ambiguous" and g.size > 1 else None
    if v.config_worse:  # said first, whether or not a wiring is named
        d, lo, hi = g.config_gap
        what = "the config's wiring" if g.config_names_layers else "the engines' default (config.json names no layers)"
        first = (f"{what} ({g.config}) is clearly worse than the best by accept length "
                 f"({g.best}: +{d:.3f} [{lo:+.3f}, {hi:+.3f}] paired)")
        if advice is not None:
            return f"{first}; {advice}"
        if one:
            return f"{first}; the best found is not named (see the verdict); to write it: {command(g.best_ids)}"
        return f"{first}; {capture_advice}"
    if v.status == "ambiguous" and not g.config_names_layers:
        return ("config.json names no aux layers and the search names none; "
                + (f"the best found: {g.best}, to write it: {command(g.best_ids)}" if one else capture_advice))
    return capture_advice if capture_advice is not None else advice


def _leaders_words(coverage, leaders: int) -> str:
    """The screen's survivors for people: the few that lead them (step-1 log score gap to the
    best) and how many sequences like these would leave at most 3, and one (``screen_ranking``)."""
    ss = coverage.screen_set if coverage is not None else None
    if not ss:
        return ""
    lead = ss["ranked"][:leaders]
    words = "; ".join(f"{r['layers']}" + (f" ({-r['gap']:+.4f} nats)" if j else "") for j, r in enumerate(lead))
    out = f"; the screen's {ss['size']} survivors are led by {words} (step-1 log score on {ss['positions']} positions)"
    tl = ss.get("to_leave") or {}
    sep = [f"about {tl[k]} would leave at most {k}" for k in ("3", "1") if tl.get(k)]
    if sep:
        out += f"; of sequences like these ({ss['sequences']} read), " + ", ".join(sep)
    return out


def _not_global(coverage) -> str:
    """The words a set needs when the search did not cover every layer: wirings reading the missing
    ones were never scored, so the set speaks only for the layers held."""
    if coverage is None or coverage.is_global:
        return ""
    miss = coverage.missing_layers
    return (f"; and the states lack {len(miss)} of the target's layers ("
            + ", ".join(map(str, miss[:8])) + (" ..." if len(miss) > 8 else "")
            + "), so wirings reading them were never scored: capture every layer (eagle3conv capture without "
            "--layers) and search again")


def _capture_advice(v, g) -> str:
    """What to do when the set has several members: the set, and what to capture."""
    members = [c.layers for c in v.confidence_set]
    sep = v.to_separate
    why = type(sep.reason)
    cap = g.capture or {}
    gen = cap.get("generate_tokens")
    cmd = (f"eagle3conv capture --target {g.target or 'TARGET'} --prompts PROMPTS --out more-states.safetensors"
           + (f" --generate {gen}" if gen else ""))
    if sep.reason is why.FACTOR:
        how = (f"capture about {sep.sequences} sequences like these ({sep.sequences_now} now) and verify "
               f"again ({cmd}, with that many prompts)")
    elif sep.reason is why.CAPPED:
        fin = (v.coverage.screen or {}).get("to_finish") or {}
        how = ("keep the training record (training_metadata.json) beside the drafter: the screen stopped at its "
               "work cap after its first positions, so more sequences like these would not finish it"
               + (f"; or give the screen about {fin['seconds']:.0f} s more: verify --search-budget {fin['budget']}"
                  if fin.get("seconds") is not None else ""))
    elif sep.reason is why.UNCONFIRMED:
        tl = (v.coverage.screen_set or {}).get("to_leave") or {}
        few = next(((k, tl[k]) for k in ("3", "1") if tl.get(k)), None)
        how = ((f"capture about {few[1]} sequences like these ({sep.sequences_now} now; the screen's estimate "
                f"to leave at most {few[0]} of its survivors) and verify again ({cmd}), or keep the training record "
                "(training_metadata.json) beside the drafter") if few else
               (f"capture several times the {sep.sequences_now} sequences these states hold and verify again "
                f"({cmd}), or keep the training record (training_metadata.json) beside the drafter"))
    else:
        how = (f"more data like this may not separate them ({SEPARATION_WHY[sep.reason.value]}); keep the training "
               f"record (training_metadata.json) beside the drafter, or capture other prompts ({cmd})")
    if cap.get("max_sequences"):  # the data at hand was not all read
        how = (f"first verify without --max-sequences (it read {cap['max_sequences']} of the "
               f"{cap['sequences_held']} sequences these states hold); then, if they still cannot, {how}")
    size = sep.members
    return (f"the data cannot tell {size} wirings apart ({set_words(members, total=size)}): no config is written "
            f"for any one of them; to separate them, {how}" + _not_global(v.coverage))


__all__ = ["SEPARATION_WHY", "coverage_summary", "norm_flag_words", "set_words", "statistic_words", "verdict_words"]
