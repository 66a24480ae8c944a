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


__all__ = ["SEPARATION_WHY", "coverage_summary"]
