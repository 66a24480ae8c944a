"""``push`` as users call it: the Hub upload (:mod:`eagle3conv.hub.push`) behind the default gate.

The gate runs the same checks as ``inspect`` (so it sits above :mod:`eagle3conv.api`,
which the Hub package must not import) plus the drafter's smoke forward:

- ``canonical``: ``inspect`` plans no change (``fix-keys`` would be a no-op);
- ``aux-layers``: the wiring check agrees with the training record and the weights;
- ``smoke-test``: the drafter forward runs at step 1 and step 2 with finite outputs.
"""

from __future__ import annotations

import os
from pathlib import Path

from eagle3conv.errors import Eagle3ConvError
from eagle3conv.findings import AUX_LAYERS
from eagle3conv.hub.card import Check
from eagle3conv.hub.push import PushResult
from eagle3conv.hub.push import push as upload


def push(path: str | os.PathLike = ".", repo_id: str | None = None, **kwargs) -> PushResult:
    """Publish a checked drafter folder to the Hub (see :func:`eagle3conv.hub.push.push` for the
    options). ``gate`` defaults to :func:`default_gate`; ``gate=None`` runs no checks."""
    kwargs.setdefault("gate", default_gate)
    return upload(path, repo_id, **kwargs)


def gate_for(engines=(), launch: str | None = None):
    """The default gate, its wiring check covering these ``--engine`` releases (empty: the
    default set), and with ``launch`` the user's own launch line checked (``push --launch``).
    Raises :class:`~eagle3conv.errors.UsageError` for a bad one, before any push."""
    if not engines and launch is None:
        return default_gate
    from eagle3conv.spec.engines import parse_engine
    from eagle3conv.spec.launch import parse_line

    for e in engines:
        parse_engine(e)
    if launch is not None:
        parse_line(launch)  # a line that is no launch line is a usage error before anything is read

    def gate(path: Path) -> list[Check]:
        return default_gate(path, engines=tuple(engines), launch=launch)

    gate.__name__ = "default_gate"
    return gate


def default_gate(path: Path, engines: tuple[str, ...] = (), launch: str | None = None) -> list[Check]:
    """The checks ``push`` runs unless given another gate.

    - ``canonical``: ``inspect`` plans no change (``fix-keys`` would be a no-op): the
      names, dtypes and config are exactly what SGLang loads;
    - ``smoke-test``: the drafter forward (``eagle3conv.model.drafter.smoke_test``) runs on
      random inputs at step 1 and step 2 with finite outputs of the right widths (MLA
      drafters run their own forward, ``eagle3conv.model.mla``);
    - ``launch-line`` (with ``launch``): the user's launch line has no error for its release
      (:mod:`eagle3conv.spec.launch_check`, docs/facts.md §13; the card's launch section says what was checked).
    """
    from eagle3conv.api import inspect
    from eagle3conv.checkpoint.plan import line
    from eagle3conv.wiring.apply import WiringOptions

    checks: list[Check] = []
    try:
        result = inspect(path, wiring_options=WiringOptions(engines=tuple(engines)))
    except Eagle3ConvError as e:
        return [Check("canonical", False, e.message)]
    plan = result.plan
    if plan is None:
        why = getattr(result.plan_error, "message", str(result.plan_error))
        return [Check("canonical", False, f"no conversion plan: {why}")]
    wiring_errors = [f.message for f in plan.findings if f.level == "error" and f.area == AUX_LAYERS]
    key_errors = [line(f) for f in plan.findings if f.level == "error" and f.area != AUX_LAYERS]
    if wiring_errors:
        checks.append(Check("aux-layers", False, "; ".join(wiring_errors)))
    elif plan.wiring is not None:
        warned = [f.message for f in plan.wiring.findings if f.level == "warning"]
        what = ("config agrees with the training record and the weights" if plan.wiring.record_known
                else "no training record to check the config against; config ids agree with the weights")
        checks.append(Check("aux-layers", True, what + ("; warnings: " + " | ".join(warned) if warned else "")))
    if key_errors:
        checks.append(Check("canonical", False, "; ".join(key_errors[:5])))
    elif not plan.is_identity():
        renamed = sum(1 for d in plan.decisions if d.action != "kept")
        fields = [e.field for e in plan.config_edits]
        what = ", ".join(([f"{renamed} tensor name(s)"] if renamed else []) +
                         ([f"config.json {', '.join(fields)}"] if fields else [])) or "the file layout"
        checks.append(Check("canonical", False,
                            f"fix-keys would still change {what}; run `eagle3conv fix-keys {path}`"))
    else:
        checks.append(Check("canonical", True, "fix-keys has nothing to change"))
    checks.append(smoke_check(result.index))
    if launch is not None:
        checks.append(launch_gate_check(path, launch, engines))
    return checks


def launch_gate_check(path: Path, launch: str, engines: tuple[str, ...] = ()) -> Check:
    """``push --launch LINE``: the line judged for its release, as one gate check (its detail: the release,
    what was looked at, each finding with its fix, the corrected line)."""
    from eagle3conv.api import check_launch
    from eagle3conv.hub.card import LAUNCH_CHECK
    from eagle3conv.wiring.apply import WiringOptions

    try:
        c = check_launch(path, launch, options=WiringOptions(engines=tuple(engines)))
    except Eagle3ConvError as e:
        return Check(LAUNCH_CHECK, False, e.message)
    parts = [f"checked for {c.release}: {', '.join(c.checked)}"]
    parts += [f"{f.level}: {f.message}" + (f" (fix: {f.fix})" if f.fix else "") for f in c.findings]
    if c.corrected:
        parts.append(f"corrected: {c.corrected}")
    return Check(LAUNCH_CHECK, c.ok, "; ".join(parts))


def smoke_check(index) -> Check:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a forward over 16 tokens: thread start-up costs more than it saves
    try:
        return _smoke_checked(index)
    finally:
        torch.set_num_threads(threads)


def _smoke_checked(index) -> Check:
    from eagle3conv.verify.run import smoke_forward

    try:
        state = {name: index.read_torch(name) for name in index.tensors}
        # verify's own smoke forward (Llama-style or MLA: the class follows the architecture), in fp32
        r = smoke_forward(index.root, index.config or {}, state, device="cpu", dtype="fp32")
    except Eagle3ConvError as e:
        return Check("smoke-test", False, e.message)
    except Exception as e:  # noqa: BLE001 - a forward that crashes is a failed check
        return Check("smoke-test", False, f"{type(e).__name__}: {e}")
    if not r.ok:
        return Check("smoke-test", False, "; ".join(r.problems))
    f = r.forward
    kind = "MLA drafter forward: " if r.mla else ""
    notes = "; engine notes: " + " | ".join(f.engine_notes) if f.engine_notes else ""
    return Check("smoke-test", True, f"{kind}step 1 reads {f.step1_input_width} wide, step 2 {f.step2_input_width}, "
                                     f"{f.logits_width} draft logits{notes}")
