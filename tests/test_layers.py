"""Aux-layer numbering of training records (output, input, captured-at-input), pinned to docs/facts.md §5.
How an engine release reads config ids is the engine rules' (tests/test_engines.py); the Kimi cases
below check both against each other."""

from __future__ import annotations

import random

import pytest

from eagle3conv.errors import UsageError, WiringError
from eagle3conv.spec.engines import capture, default_capture, ids_for
from eagle3conv.spec.layers import (
    CONVENTIONS,
    EMBEDDING,
    LayerRef,
    convention_names,
    convert,
    describe,
    get_convention,
    is_ascending,
    outputs,
    parse_ids,
    to_ids,
    to_refs,
    validate_refs,
)

KIMI = 61  # Kimi-K2.5 / DeepSeek-V3 layer count


# --------------------------------------------------------------------------- LayerRef


def test_layer_ref_words():
    assert str(LayerRef(2)) == "output of layer 2"
    assert str(EMBEDDING) == "embedding output"
    assert EMBEDDING.is_embedding and not LayerRef(0).is_embedding


@pytest.mark.parametrize("bad", [-2, 1.0, True, "3"])
def test_layer_ref_rejects_non_layers(bad):
    with pytest.raises(UsageError):
        LayerRef(bad)


def test_layer_ref_is_frozen_and_hashable():
    ref = LayerRef(3)
    with pytest.raises(AttributeError):
        ref.output_of = 4  # type: ignore[misc]
    assert {ref, LayerRef(3)} == {ref}


@pytest.mark.parametrize(
    ("refs", "words"),
    [
        (outputs(2, 30, 58), "outputs of layers 2, 30, 58"),
        (
            (EMBEDDING, LayerRef(2), LayerRef(30)),
            "the embedding output and outputs of layers 2, 30",
        ),
        ((EMBEDDING, LayerRef(2)), "the embedding output and output of layer 2"),
        ((EMBEDDING,), "the embedding output"),
        (outputs(5), "output of layer 5"),
        ((LayerRef(2), EMBEDDING), "output of layer 2, the embedding output"),
        ((), "no layers"),
    ],
)
def test_describe(refs, words):
    assert describe(refs) == words


# --------------------------------------------------------------------------- registry


def test_registry_names():
    assert set(CONVENTIONS) == {"output", "input", "captured-at-input"}
    for name, conv in CONVENTIONS.items():
        assert conv.name == name and conv.description and conv.used_by
    assert set(convention_names()) == set(CONVENTIONS)
    assert get_convention("Captured_At_Input").name == "captured-at-input"


@pytest.mark.parametrize("engine_name", ["sglang", "sglang-old", "sglang-new", "vllm", "trtllm"])
def test_engine_names_are_not_record_numberings(engine_name):
    """How an engine reads ids depends on its release and the target: the engine rules say it."""
    with pytest.raises(UsageError) as err:
        get_convention(engine_name)
    assert "--engine" in err.value.message


def test_unknown_convention_lists_known_names():
    with pytest.raises(UsageError) as err:
        to_refs([1], "llamacpp", 32)
    assert "llamacpp" in err.value.message and "captured-at-input" in err.value.message


# --------------------------------------------------------------------------- single ids


def _expected(convention: str, ids: tuple[int, ...], n: int) -> tuple[int, ...] | None:
    """Independent statement of each convention: output_of per id, or None if invalid."""
    if convention == "output":
        ok = all(-1 <= i <= n - 1 for i in ids)
        return ids if ok else None
    if convention == "input":
        return tuple(i - 1 for i in ids) if all(0 <= i <= n for i in ids) else None
    assert convention == "captured-at-input"
    return tuple(i - 1 for i in ids) if all(0 <= i <= n - 1 for i in ids) else None


@pytest.mark.parametrize("convention", sorted(CONVENTIONS))
@pytest.mark.parametrize("n", [4, 5, 32, 61])
def test_every_id_pair_against_the_definition(convention, n):
    """All ordered pairs of ids in -2..N+1, each convention, checked against _expected."""
    for a in range(-2, n + 2):
        for b in range(-2, n + 2):
            if a == b:
                continue
            want = _expected(convention, (a, b), n)
            if want is None:
                with pytest.raises(WiringError):
                    to_refs((a, b), convention, n)
            else:
                assert to_refs((a, b), convention, n) == outputs(*want)


# --------------------------------------------------------------------------- round trips


def _random_sets(n: int, rng: random.Random, count: int = 25):
    population = list(range(-1, n))
    for _ in range(count):
        k = rng.randint(1, min(5, len(population)))
        yield tuple(LayerRef(i) for i in rng.sample(population, k))


def _expressible(convention: str, refs, n: int) -> bool:
    layers = [r.output_of for r in refs]
    if convention in ("output", "input"):
        return True
    assert convention == "captured-at-input"
    return n - 1 not in layers


@pytest.mark.parametrize("convention", sorted(CONVENTIONS))
def test_round_trips(convention):
    rng = random.Random(f"round-trip-{convention}")
    for n in range(4, 101):
        for refs in _random_sets(n, rng):
            if not _expressible(convention, refs, n):
                with pytest.raises(WiringError):
                    to_ids(refs, convention, n)
                continue
            ids = to_ids(refs, convention, n)
            assert to_refs(ids, convention, n) == refs, (convention, n, refs, ids)
            assert to_ids(to_refs(ids, convention, n), convention, n) == ids


def test_conversions_between_every_pair_preserve_tensors():
    rng = random.Random("pairs")
    for n in range(4, 101, 7):
        for refs in _random_sets(n, rng):
            for a in CONVENTIONS:
                for b in CONVENTIONS:
                    if _expressible(a, refs, n) and _expressible(b, refs, n):
                        assert to_refs(convert(to_ids(refs, a, n), a, b, n), b, n) == refs


def test_without_num_layers_only_the_upper_bound_is_skipped():
    assert to_refs([2, 300], "input") == outputs(1, 299)
    with pytest.raises(WiringError):
        to_refs([-1, 2], "input")
    with pytest.raises(WiringError):
        to_refs([2, 300], "input", 61)


@pytest.mark.parametrize("bad", [[1.5, 2], ["2", 3], [True, 3]])
def test_non_integer_ids_are_usage_errors(bad):
    with pytest.raises(UsageError):
        to_refs(bad, "output", 32)


@pytest.mark.parametrize("bad_n", [0, -3, 2.5, True])
def test_bad_layer_count(bad_n):
    with pytest.raises(UsageError):
        to_refs([1], "output", bad_n)


def test_duplicates_rejected():
    with pytest.raises(WiringError, match="repeat id 2"):
        to_refs([2, 2, 5], "input", KIMI)
    with pytest.raises(WiringError, match="repeat the output of layer 2"):
        to_ids(outputs(2, 5, 2), "output", KIMI)
    with pytest.raises(WiringError):
        validate_refs(outputs(3, 3))


def test_validate_refs_range():
    assert validate_refs(outputs(0, 60), KIMI) == outputs(0, 60)
    with pytest.raises(WiringError, match="61 layers"):
        validate_refs(outputs(1, 61), KIMI)


# --------------------------------------------------------------------------- the Kimi cases


def _nested(ids):
    return {"eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ids)}}


def _top(ids):
    return {"eagle_aux_hidden_state_layer_ids": list(ids)}


def test_kimi_defaults_are_one_set_of_tensors():
    """vLLM [2,30,58] == SGLang [1,29,57] == TRT-LLM {1,29,57} == outputs 1, 29, 57, by every
    release's rule for a DeepSeek-family target."""
    want = outputs(1, 29, 57)
    assert to_refs([2, 30, 58], "input", KIMI) == to_refs([1, 29, 57], "output", KIMI) == want
    for rel in ("sglang==0.5.12", "sglang"):
        assert capture(rel, _nested([1, 29, 57]), "deepseek_v2", KIMI).layers == want
        assert ids_for(rel, "deepseek_v2", KIMI, want) == (1, 29, 57)
    assert capture("vllm", _top([2, 30, 58]), "deepseek_v2", KIMI).layers == want
    assert ids_for("trtllm", "deepseek_v2", KIMI, want) == (1, 29, 57)
    for rel in ("sglang==0.5.12", "sglang", "vllm", "trtllm"):
        assert default_capture(rel, "deepseek_v2", KIMI).layers == want
    assert describe(want) == "outputs of layers 1, 29, 57"


def test_sglang_2_30_58_before_and_after_the_first_id_rule():
    """Public Kimi drafters ship [2, 30, 58]: SGLang 0.5.12 adds 1 (outputs 2, 30, 58); from 0.5.13
    a first id other than 1 is used raw (outputs 1, 29, 57), as vLLM reads the same list."""
    assert capture("sglang==0.5.12", _nested([2, 30, 58]), "deepseek_v2", KIMI).layers == outputs(2, 30, 58)
    assert capture("sglang==0.5.13", _nested([2, 30, 58]), "deepseek_v2", KIMI).layers == outputs(1, 29, 57)
    assert capture("vllm", _top([2, 30, 58]), "deepseek_v2", KIMI).layers == outputs(1, 29, 57)


def test_captured_at_input_of_3_31_59():
    """The seed incident's training data: inputs of layers 3, 31, 59."""
    refs = to_refs([3, 31, 59], "captured-at-input", KIMI)
    assert refs == outputs(2, 30, 58)
    assert ids_for("sglang==0.5.12", "deepseek_v2", KIMI, refs) == (2, 30, 58)
    assert ids_for("sglang", "deepseek_v2", KIMI, refs) == (3, 31, 59)
    assert ids_for("vllm", "deepseek_v2", KIMI, refs) == (3, 31, 59)
    assert to_ids(refs, "input", KIMI) == (3, 31, 59)
    assert to_ids(refs, "output", KIMI) == (2, 30, 58)


def test_incident_set_holds_the_embedding_and_no_sglang_release_captures_it():
    """The "fix" to [-1, 2, 30], read as output-of-layer ids."""
    refs = to_refs([-1, 2, 30], "output", KIMI)
    assert refs == (EMBEDDING, LayerRef(2), LayerRef(30))
    assert describe(refs) == "the embedding output and outputs of layers 2, 30"
    for rel, why in (("sglang==0.5.12", "embedding output"), ("sglang", "never captured")):
        assert ids_for(rel, "deepseek_v2", KIMI, refs) is None
        cap = capture(rel, _nested([-1, 2, 30]), "deepseek_v2", KIMI)  # 0.5.12: -1 + 1; 0.5.23: -1 raw
        assert cap.layers is None and why in cap.error.message, cap.error
    # vLLM's DeepSeek model file captures inside its layer loop: no embedding output either; its shared
    # capture code (a Llama-family target) takes id 0 as the embedding output
    assert ids_for("vllm", "deepseek_v2", KIMI, refs) is None
    assert ids_for("vllm", "llama", KIMI, refs) == (0, 3, 31) == to_ids(refs, "input", KIMI)


def test_last_layer_output_is_beyond_sglang():
    last = outputs(1, 29, 60)
    for rel in ("sglang==0.5.12", "sglang"):
        assert ids_for(rel, "deepseek_v2", KIMI, last) is None
    assert to_ids(last, "output", KIMI) == (1, 29, 60)
    assert to_ids(last, "input", KIMI) == (2, 30, 61)
    assert ids_for("vllm", "deepseek_v2", KIMI, last) == (2, 30, 61)
    with pytest.raises(WiringError):
        to_ids(last, "captured-at-input", KIMI)


def test_first_id_rule_cannot_start_with_layer_0():
    """From 0.5.13 a DeepSeek-family list whose first id is 1 is read +1: no list names the output of
    layer 0 in the first slot; 0.5.12 reads [0, 29, 57] +1 as outputs 0, 29, 57."""
    assert ids_for("sglang", "deepseek_v2", KIMI, outputs(0, 29, 57)) is None
    assert ids_for("sglang==0.5.12", "deepseek_v2", KIMI, outputs(0, 29, 57)) == (0, 29, 57)


@pytest.mark.parametrize(("n", "same"), [(61, (1, 29, 57)), (32, (1, 15, 28))])
def test_engine_defaults(n, same):
    for family in ("deepseek_v2", "llama", None):
        for rel in ("sglang==0.5.12", "sglang", "vllm", "trtllm"):
            cap = default_capture(rel, family, n)
            assert cap.fell_back and cap.layers == outputs(*same), (rel, family, cap)


def test_engine_defaults_small_targets():
    cap = default_capture("sglang", "llama", 4)  # [2, 2, 1]: the same state twice, which no engine captures twice
    assert cap.layers is None and cap.error is not None
    assert default_capture("sglang", "llama", 9).layers == outputs(1, 3, 5)


# --------------------------------------------------------------------------- helpers


@pytest.mark.parametrize("text", ["2,30,58", "[2, 30, 58]", " 2 30 58 ", "2, 30,58"])
def test_parse_ids(text):
    assert parse_ids(text) == (2, 30, 58)


def test_parse_ids_negative_and_bad():
    assert parse_ids("[-1, 2, 30]") == (-1, 2, 30)
    with pytest.raises(UsageError):
        parse_ids("2,thirty")


def test_is_ascending():
    assert is_ascending([2, 30, 58]) and is_ascending(outputs(-1, 2, 30))
    assert is_ascending((EMBEDDING, LayerRef(0)))
    assert not is_ascending([30, 2, 58]) and not is_ascending([2, 2])
    assert is_ascending([]) and is_ascending([7])
