"""Helpers the test files share (imported as ``from helpers import ...``; pytest puts tests/ on the path)."""

from __future__ import annotations

from click.testing import CliRunner

from eagle3conv.cli import main


def run(*args, ok: int | None = 0):
    """The CLI in-process through Click's runner; asserts the exit code unless ``ok`` is None."""
    res = CliRunner().invoke(main, [str(a) for a in args])
    if ok is not None:
        assert res.exit_code == ok, f"exit {res.exit_code}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}\n{res.exception!r}"
    return res


# The releases the engine rules were read for, from the data itself: a test that means "the newest SGLang
# release" says NEWEST_SGLANG, so that adding a release to mappings/engines/sglang.json changes no test.
def _releases(engine: str) -> list[str]:
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "mappings" / "engines" / f"{engine}.json"
    return list(json.loads(path.read_text(encoding="utf-8"))["releases"])


SGLANG_RELEASES = _releases("sglang")
NEWEST_SGLANG, OLDEST_SGLANG = SGLANG_RELEASES[-1], SGLANG_RELEASES[0]
VLLM_RELEASES = _releases("vllm")
NEWEST_VLLM = VLLM_RELEASES[-1]


def engine_rows(verify_doc: dict) -> dict[str, dict]:
    """A verify report's engine rows, each with its serving-emulation score beside it (by --engine spec)."""
    w = verify_doc["wiring_check"]
    scores = {s["engine"]: s for s in w.get("engine_scores") or []}
    return {r["engine"]: {**r, **scores.get(r["engine"], {})} for r in w["engines"]}


def speculators_draft_model(layer, config: dict, draft_vocab_size: int, **switches):
    """speculators' ``Eagle3DraftModel`` (the independent forward the drafter is pinned to) around
    the transformers layer config ``layer``, with the EAGLE-3 switches of ``config``
    (``switches`` override them: ``norm_before_residual``, ``norm_before_fc``, ``fc_norm``,
    ``norm_output``), in eval mode; the caller loads the weights."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    flags = {k: config.get(k, False) for k in ("norm_before_residual", "fc_norm", "norm_output")}
    flags.update(switches)
    spec = Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=draft_vocab_size,
        eagle_aux_hidden_state_layer_ids=config["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"]),
        ),
        **flags,
    )
    return Eagle3DraftModel(spec).eval()


def _plan_lines(plan: dict, levels: tuple[str, ...]) -> list[str]:
    from eagle3conv.checkpoint.plan import line
    from eagle3conv.findings import Finding

    return [line(Finding(**f)) for f in plan["findings"] if f["level"] in levels]


def plan_notices(plan: dict) -> list[str]:
    """A ``--json`` plan's warnings and notices as fix-keys prints them (the plan carries them once, as
    findings)."""
    return _plan_lines(plan, ("warning", "notice"))


def plan_errors(plan: dict) -> list[str]:
    """A ``--json`` plan's errors as fix-keys prints them."""
    return _plan_lines(plan, ("error",))
