"""``verify``: the drafter forward on captured target states, acceptance, and the wiring diagnosis.

Data flow::

    drafter folder ──load──▶ Eagle3Drafter (strict)          states (eagle3conv file, vLLM, NeMo,
    config + records ──gather/check──▶ the config's wiring    SpecForge, aux dumps) ──batches──▶
    candidates (config, ±1, with embedding, defaults, …) ──evaluate each──▶ Score ──▶ report

What is measured, for a wiring (the aux layers fed to ``fc``, in slot order):

* **Teacher-forced top-1 acceptance per draft position.** The chain started at
  position t (after the target emitted token t+1) drafts tokens t+2, t+3, …
  exactly as SGLang runs it (step 1 from the aux states, steps 2+ from the
  drafter's own state, EAGLE-3 training-time-test attention, ``d2t`` mapping).
  Draft k is compared with ``target_next[t+k]``, the target's own greedy token
  at that position. A position counts when it is a real token and (when the
  states mark one) inside the loss mask, e.g. the target's generated response.
* **Accept length**: tokens per target forward of greedy chain decoding,
  replayed on the teacher-forced results from each sequence's first full
  chain (a round accepts its leading matches plus the target's own token; the
  next round starts after them). The average of ``1 + leading matches`` over
  every chain start is reported too and ranks wirings (same positions for
  every wiring). Conditional acceptance of draft k given drafts 1..k-1 too. Where
  the states' sequences carry a prompt category, the same figures per category.
* **Acceptance profile**: the replay's rounds by accept length give Model Optimizer's
  ``speculation_profile.json`` (marginal and conditional rates, mean accept length per
  step and per request, histogram), saved beside the report (``profile``).
* **Confidence intervals**: 95%, by bootstrap over sequences (positions in one
  sequence are correlated); with fewer than 5 sequences, Wilson intervals over
  positions, and the report says so.
* **Norm fingerprint**: per aux slot, the per-token L2 norm of the inference
  states (median, p10, p90; **position 0 of every sequence excluded**, as its
  massive activations dominate plain means) next to the training statistics
  from ``training_metadata.json``; a slot whose median differs by more than 2x
  is flagged. The embedding output's norm is far from a deep layer's.
* **Wiring search** (``search=True``): every ascending wiring of the layers the states
  hold is screened on the step-1 log score, each read only until the data excludes it
  against the leader (``evaluate.ScreenBound``, docs/facts.md §12); the survivors and the
  evidence (the config's wiring, the training record's, each shifted by one, the
  embedding-included variant, each engine's default) are scored on every position; local
  refinement adds the single-slot changes of the leaders the data does not exclude
  against the best. The verdict is a confidence set: every wiring not excluded at 95%
  against the best (acceptance, then the log score, then the norm fingerprint). One is
  named when the set has one member (and the search covered every layer), or the training
  record's or the config's wiring stands when it is in the set; else the set is reported
  with how many sequences would separate it. Fewer than ``MIN_SEARCH_SEQUENCES``
  sequences: nothing is named. The report says which statistics decided.

The package, bottom up (each module imports only those above it)::

    options    VerifyOptions: the verify command's options, declared once (light: --help reads it)
    stats      wilson, bootstrap, paired_difference, paired_ratio_bound, t_quantile, replay(_histogram): pure numpy
    feed       prefetch thread, CUDA double-buffered feeder over memory-mapped states
    logscore   log_scores: the step-1 log score per wiring and sequence (the screen's ranking)
    evaluate   Candidate, Score, evaluate, screen: one wiring over every batch; many at step 1
    words      the verdict's sentences, from its codes and values (what the report and the text say)
    search     config_candidate, candidates, global_search, refine, norm_comparison, Verdict, decide
    profile    speculation_profile.json (Model Optimizer's schema 1.0) and the per-category figures
    report     VerifyResult, VerifyReport: the eagle3conv-verify.json contract  (evaluate, search, profile)
    plot       verify --plot: the search's figure
    inputs     drafter loading, device/dtype, target embeddings, data labels
    run        verify() and smoke(): one method per step (_Verification), in order
"""

from __future__ import annotations

import sys
import types

# the names this package re-exports -> the module each comes from; imported when first asked for, so that
# ``import eagle3conv.verify.options`` (the command line's --help) does not import torch
_EXPORTS = {
    "Progress": "eagle3conv.io.progress",
    "resolve_device": "eagle3conv.io.devices", "resolve_dtype": "eagle3conv.io.devices",
    **dict.fromkeys(("Candidate", "Score", "evaluate"), "eagle3conv.verify.evaluate"),
    **dict.fromkeys(("build_drafter", "data_labels", "load_drafter_weights", "load_target_embeddings"),
                    "eagle3conv.verify.inputs"),
    **dict.fromkeys(("PROFILE_FILE", "build_profile", "read_profile"), "eagle3conv.verify.profile"),
    **dict.fromkeys(("REPORT_FILE", "VerifyReport", "VerifyResult", "WiringFigures"), "eagle3conv.verify.report"),
    "VerifyOptions": "eagle3conv.verify.options",
    **dict.fromkeys(("smoke", "verify"), "eagle3conv.verify.run"),
    **dict.fromkeys(("MIN_SEARCH_SEQUENCES", "NORM_FLAG_RATIO", "Verdict", "candidates", "config_candidate", "decide",
                     "norm_comparison"), "eagle3conv.verify.search"),
    **dict.fromkeys(("bootstrap", "paired_difference", "replay", "wilson"), "eagle3conv.verify.stats"),
}


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MIN_SEARCH_SEQUENCES", "NORM_FLAG_RATIO", "PROFILE_FILE", "REPORT_FILE", "Candidate", "Progress", "Score", "Verdict",
    "VerifyOptions", "VerifyReport", "VerifyResult", "WiringFigures", "bootstrap", "build_drafter", "candidates", "config_candidate",
    "data_labels", "decide", "evaluate", "load_drafter_weights", "load_target_embeddings", "norm_comparison",
    "paired_difference", "read_profile", "build_profile", "replay", "resolve_device", "resolve_dtype", "smoke", "verify", "wilson",
]


class _Package(types.ModuleType):
    """This package, callable as :func:`verify`: once imported, a package's subpackage is the
    attribute of its name (``eagle3conv.verify``), which would otherwise shadow the front door's
    ``from eagle3conv import verify`` (eagle3conv/__init__.py) with a module."""

    def __call__(self, *args, **kwargs):
        return __getattr__("verify")(*args, **kwargs)

    def __setattr__(self, name: str, value) -> None:
        # importing a submodule binds it as this package's attribute: ``evaluate`` the module would then
        # hide ``evaluate`` the function this package exports (the names are looked up lazily, above)
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
