"""Aux-layer numbering: every convention, pinned to docs/facts.md §5."""

from __future__ import annotations

import random

import pytest

from eagle3conv.errors import UsageError, WiringError
from eagle3conv.spec.engines import sglang_ids
from eagle3conv.spec.layers import (
    ALIASES,
    CONVENTIONS,
    EMBEDDING,
    LayerRef,
    convention_names,
    convert,
    describe,
    engine_defaults,
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
    assert set(CONVENTIONS) == {"output", "input", "sglang-old", "sglang-new", "captured-at-input"}
    for name, conv in CONVENTIONS.items():
        assert conv.name == name and conv.description and conv.used_by
    assert set(convention_names()) == set(CONVENTIONS) | set(ALIASES)


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("trtllm", "output"),
        ("tensorrt-llm", "output"),
        ("TensorRT_LLM", "output"),
        ("specforge", "output"),
        ("modelopt", "output"),
        ("angelslim", "output"),
        ("vllm", "input"),
        ("speculators", "input"),
        ("eagle", "input"),
        ("sglang-old", "sglang-old"),
        ("SGLang_New", "sglang-new"),
    ],
)
def test_aliases(alias, name):
    assert get_convention(alias).name == name


def test_bare_sglang_is_ambiguous():
    with pytest.raises(UsageError, match=r"sglang-old.*sglang-new"):
        get_convention("sglang")


def test_unknown_convention_lists_known_names():
    with pytest.raises(UsageError) as err:
        to_refs([1], "llamacpp", 32)
    assert "llamacpp" in err.value.message and "sglang-new" in err.value.message


# --------------------------------------------------------------------------- single ids


def _expected(convention: str, ids: tuple[int, ...], n: int) -> tuple[int, ...] | None:
    """Independent statement of each convention: output_of per id, or None if invalid."""
    if convention == "output":
        ok = all(-1 <= i <= n - 1 for i in ids)
        return ids if ok else None
    if convention == "input":
        return tuple(i - 1 for i in ids) if all(0 <= i <= n for i in ids) else None
    if convention == "captured-at-input":
        return tuple(i - 1 for i in ids) if all(0 <= i <= n - 1 for i in ids) else None
    if convention == "sglang-old" or (convention == "sglang-new" and ids[0] == 1):
        return ids if all(0 <= i <= n - 2 for i in ids) else None
    assert convention == "sglang-new"
    return tuple(i - 1 for i in ids) if all(1 <= i <= n - 1 for i in ids) else None


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
    if convention == "captured-at-input":
        return n - 1 not in layers
    sglang_ok = -1 not in layers and n - 1 not in layers
    if convention == "sglang-old":
        return sglang_ok
    return sglang_ok and layers[0] != 0  # sglang-new


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
            # ids -> refs -> ids is a fixed point after one step (sglang-new may pick
            # the first-id-1 form of the same tensors)
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
        to_refs([-1, 2], "sglang-old")
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
        to_refs([2, 2, 5], "vllm", KIMI)
    with pytest.raises(WiringError, match="repeat the output of layer 2"):
        to_ids(outputs(2, 5, 2), "output", KIMI)
    # input 1 and sglang-new raw 1 are both the output of layer 0: still one id each
    with pytest.raises(WiringError):
        validate_refs(outputs(3, 3))


def test_validate_refs_range():
    assert validate_refs(outputs(0, 60), KIMI) == outputs(0, 60)
    with pytest.raises(WiringError, match="61 layers"):
        validate_refs(outputs(1, 61), KIMI)


# --------------------------------------------------------------------------- the Kimi cases


def test_kimi_defaults_are_one_set_of_tensors():
    """vLLM [2,30,58] == SGLang [1,29,57] == TRT-LLM {1,29,57} == outputs 1, 29, 57."""
    want = outputs(1, 29, 57)
    assert to_refs([2, 30, 58], "vllm", KIMI) == want
    assert to_refs([1, 29, 57], "sglang-old", KIMI) == want
    assert to_refs([1, 29, 57], "sglang-new", KIMI) == want
    assert to_refs([1, 29, 57], "trtllm", KIMI) == want
    assert to_ids(want, "sglang-old", KIMI) == to_ids(want, "sglang-new", KIMI) == (1, 29, 57)
    assert to_ids(want, "vllm", KIMI) == (2, 30, 58)
    assert describe(want) == "outputs of layers 1, 29, 57"


def test_sglang_2_30_58_old_versus_new():
    """Public Kimi drafters ship [2, 30, 58]: old SGLang adds 1 (outputs 2, 30, 58);
    new SGLang sees a first id other than 1 and uses them raw (outputs 1, 29, 57)."""
    assert to_refs([2, 30, 58], "sglang-old", KIMI) == outputs(2, 30, 58)
    assert to_refs([2, 30, 58], "sglang-new", KIMI) == outputs(1, 29, 57)
    assert to_refs([2, 30, 58], "sglang-new", KIMI) == to_refs([2, 30, 58], "vllm", KIMI)


def test_captured_at_input_of_3_31_59():
    """The seed incident's training data: inputs of layers 3, 31, 59."""
    refs = to_refs([3, 31, 59], "captured-at-input", KIMI)
    assert refs == outputs(2, 30, 58)
    assert to_ids(refs, "sglang-old", KIMI) == (2, 30, 58)
    assert to_ids(refs, "sglang-new", KIMI) == (3, 31, 59)
    assert to_ids(refs, "vllm", KIMI) == (3, 31, 59)
    assert to_ids(refs, "output", KIMI) == (2, 30, 58)


def test_incident_set_holds_the_embedding_and_is_not_sglang_expressible():
    """The "fix" to [-1, 2, 30], read as output-of-layer ids."""
    refs = to_refs([-1, 2, 30], "output", KIMI)
    assert refs == (EMBEDDING, LayerRef(2), LayerRef(30))
    assert describe(refs) == "the embedding output and outputs of layers 2, 30"
    for version in ("sglang-old", "sglang-new"):
        with pytest.raises(WiringError) as err:
            to_ids(refs, version, KIMI)
        assert "embedding output" in err.value.message and "SGLang" in err.value.message
    with pytest.raises(WiringError, match="embedding output"):
        to_refs([-1, 2, 30], "sglang-old", KIMI)
    with pytest.raises(WiringError, match="no SGLang release can capture the embedding output"):
        sglang_ids(refs, "deepseek_v2", KIMI)
    # vLLM can: id 0 is the embedding there
    assert to_ids(refs, "vllm", KIMI) == (0, 3, 31)


def test_last_layer_output_is_beyond_sglang():
    last = outputs(1, 29, 60)
    for version in ("sglang-old", "sglang-new"):
        with pytest.raises(WiringError, match="last layer"):
            to_ids(last, version, KIMI)
    assert to_ids(last, "output", KIMI) == (1, 29, 60)
    assert to_ids(last, "input", KIMI) == (2, 30, 61)
    with pytest.raises(WiringError):
        to_ids(last, "captured-at-input", KIMI)


def test_sglang_new_cannot_start_with_layer_0():
    with pytest.raises(WiringError, match="first id of 1"):
        to_ids(outputs(0, 29, 57), "sglang-new", KIMI)
    assert to_ids(outputs(0, 29, 57), "sglang-old", KIMI) == (0, 29, 57)
    # elsewhere than the first slot, layer 0's output is fine in raw ids
    assert to_ids(outputs(5, 0), "sglang-new", KIMI) == (6, 1)


# --------------------------------------------------------------------------- defaults


@pytest.mark.parametrize(
    ("n", "same", "specforge_window"),
    [(61, (1, 29, 57), (1, 30, 57)), (32, (1, 15, 28), (1, 16, 28))],
)
def test_engine_defaults(n, same, specforge_window):
    defaults = engine_defaults(n)
    assert set(defaults) == {"output", "input", "sglang", "specforge-2025-09"}
    assert defaults["output"].ids == (1, n // 2 - 1, n - 4) == same
    assert defaults["input"].ids == (2, n // 2, n - 3)
    assert defaults["sglang"].ids == (2, n // 2, n - 3)
    for key in ("output", "input", "sglang"):
        assert defaults[key].refs == outputs(*same)
        d = defaults[key]
        assert to_refs(d.ids, d.convention, n) == d.refs
    assert defaults["specforge-2025-09"].refs == outputs(*specforge_window)
    # the SGLang fallback equals explicit ids [1, N//2-1, N-4] in both versions
    assert sglang_ids(defaults["sglang"].refs, "deepseek_v2", n).ids == same


def test_engine_defaults_small_targets():
    assert engine_defaults(4)["output"].refs == outputs(1, 1, 0)  # what the engines do
    with pytest.raises(UsageError, match="at least 4 layers"):
        engine_defaults(3)


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
