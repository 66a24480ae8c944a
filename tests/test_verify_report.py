"""The verify report contract: what ``verify`` writes is what the model card shows.

``verify`` saves ``eagle3conv-verify.json`` through :class:`eagle3conv.verify.VerifyReport`
and ``push``'s card reads it through the same type. Round trip: the CLI's ``verify
--json`` figures (per-position acceptance, the replayed accept length and its
interval, tokens) must be the card's (``push --dry-run``); a file that is not a
verify report this eagle3conv reads is refused with a message naming the field,
and the card then shows no figures (it never guesses keys or recomputes one).
Real parts only: a pico drafter, states captured from a tiny real Llama.
"""

from __future__ import annotations

import json
import random
import shutil

import pytest

from eagle3conv.errors import CheckpointReadError
from eagle3conv.example import Dims, write_example
from eagle3conv.verify import REPORT_FILE, VerifyReport
from helpers import run

PREAMBLE = "From `eagle3conv-verify.json`"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A canonical pico drafter (aux ids 1, 3, 4 of a 6-layer target) and states of a tiny real Llama."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from eagle3conv.states.capture import capture_states
    from eagle3conv.wiring.metadata import from_user, write_metadata_file

    root = tmp_path_factory.mktemp("report")
    vocab = {t: i for i, t in enumerate(["[UNK]", "[PAD]", "<s>", "</s>"] + [f"w{i}" for i in range(508)])}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", bos_token="<s>",
                                  eos_token="</s>")
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=1,
                      eos_token_id=3, bos_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    rnd = random.Random(1)
    prompts = [" ".join(f"w{rnd.randrange(508)}" for _ in range(rnd.randrange(8, 16))) for _ in range(12)]
    states = root / "states.safetensors"
    capture_states(model, tok, prompts, states, generate_tokens=8, chat_template=False, dtype="fp32",
                   target="tiny-llama")
    dims = Dims(hidden=64, target_hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128,
                vocab=len(tok), draft_vocab=300, aux_ids=(1, 3, 4))
    drafter = write_example(root / "drafter", "sglang", dims)
    write_metadata_file(drafter, from_user("1,3,4", "output"))  # the card states this wiring
    from eagle3conv.api import fix_keys

    fix_keys(drafter)  # writes every engine's ids: what push's gate asks for
    return drafter, states


@pytest.fixture
def ck(world, tmp_path):
    dest = tmp_path / "drafter"
    shutil.copytree(world[0], dest)
    return dest


def card_of(folder) -> str:
    d = json.loads(run("push", folder, "--repo-id", "org/drafter", "--dry-run", "--json").stdout)
    return d["card"]


def verification(card: str) -> str:
    return card[card.index("### Verification"):card.index("### Checks before publishing")]


def test_card_shows_exactly_what_verify_reported(world, ck):
    _, states = world
    d = json.loads(run("verify", ck, "--states", states, "--json").stdout)
    saved = VerifyReport.load(ck)  # the file verify wrote, read back through the one contract
    assert saved.to_dict()["results"] == d["results"] and saved.main.accept_length == d["accept_length"]
    card = verification(card_of(ck))
    # the numbers verify printed, as the card prints them: nothing recomputed
    row = "| acceptance | " + " | ".join(f"{a:.1%}" for a in d["acceptance_per_position"]) + " |"
    assert row in card
    lo, hi = d["accept_length_ci95"]
    main_ = d["results"][0]
    assert (f"Expected accept length: **{d['accept_length']:.2f}** tokens per verification step "
            f"(95% interval {lo:.2f} to {hi:.2f}; greedy chain decoding replayed over {main_['rounds']} rounds)"
            ) in card
    assert (f"{PREAMBLE} ({d['states']['sequences']} sequences, {d['states']['tokens']} tokens, "
            f"{main_['positions_scored']} positions scored)") in card
    assert d["statistic"] in card and "Verify verdict: passed." in card
    # a report scored with --layers other than the card's wiring: no figures as this drafter's
    run("verify", ck, "--states", states, "--layers", "0,3,4")
    card = verification(card_of(ck))
    assert "Not shown: the last `eagle3conv verify` scored another wiring (outputs of layers 0, 3, 4)" in card
    assert "| acceptance |" not in card


def test_card_takes_a_search_entry_for_its_own_wiring(world, ck):
    _, states = world
    d = json.loads(run("verify", ck, "--states", states, "--layers", "0,3,4", "--search-wiring", "--json").stdout)
    mine = next(r for r in d["results"] if [x["output_of"] for x in r["layers"]] == [1, 3, 4])
    card = verification(card_of(ck))
    row = "| acceptance | " + " | ".join(f"{a:.1%}" for a in mine["acceptance_per_position"]) + " |"
    assert row in card and f"**{mine['accept_length']:.2f}**" in card
    assert "Verify verdict" not in card  # the threshold was about the scored wiring, not this one


@pytest.mark.parametrize("doc, field", [
    ({"acceptance_per_position": [0.8, 0.6, 0.45], "engine": "sglang"}, "'format'"),  # a foreign file
    ({"format": "eagle3conv-verify", "version": 2, "results": []}, "version 2"),
    ("[1, 2]", "not an object"),
    ("{broken", "not valid JSON"),
])
def test_foreign_or_malformed_reports_are_refused(ck, doc, field):
    (ck / REPORT_FILE).write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(CheckpointReadError) as info:
        VerifyReport.load(ck)
    assert field in info.value.message and REPORT_FILE in info.value.message
    assert "eagle3conv verify" in info.value.hint
    card = verification(card_of(ck))
    assert card.startswith("### Verification\n\nNot verified: ") and field in card and "%" not in card


def test_a_field_of_the_wrong_type_is_named(world, ck):
    _, states = world
    run("verify", ck, "--states", states)
    good = json.loads((ck / REPORT_FILE).read_text())
    for path, value, named in (
        (("results", 0, "accept_length"), None, "'results[0].accept_length' must be a finite number"),
        (("results", 0, "acceptance_per_position"), [80.0, 60.0, 45.0], "fractions between 0 and 1"),
        (("results", 0, "accept_length_ci95"), [2.0], "an interval"),
        (("verdict", "status"), "probably", "'verdict' is malformed"),
        (("passed",), "yes", "'passed' must be a JSON true/false"),
    ):
        bad = json.loads(json.dumps(good))
        obj = bad
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
        (ck / REPORT_FILE).write_text(json.dumps(bad))
        with pytest.raises(CheckpointReadError) as info:
            VerifyReport.load(ck)
        assert named in info.value.message, info.value.message
        assert "Not verified: " in verification(card_of(ck))


def test_report_without_accept_length_shows_no_computed_one(world, ck):
    """The card used to compute 1 + sum(cumprod(acceptance)) for a report without an accept
    length: a number with another definition than the replayed one verify stands behind."""
    _, states = world
    run("verify", ck, "--states", states)
    doc = json.loads((ck / REPORT_FILE).read_text())
    for r in [doc, *doc["results"]]:
        del r["accept_length"]
    (ck / REPORT_FILE).write_text(json.dumps(doc))
    card = verification(card_of(ck))
    assert "Expected accept length" not in card and "Not verified: " in card


def test_save_and_load_round_trip(world, ck):
    from eagle3conv.verify import verify

    _, states = world
    res = verify(ck, states, save=False)
    report = res.report()
    back = VerifyReport.load(report.save(ck))
    assert back == report and back.to_json() == report.to_json()
    assert back.reference == "target" and back.verdict.status is None
    assert back.main.layers == (1, 3, 4) and back.main.accept_length == round(res.main.accept_length, 4)
    # a local path anywhere in the document is written as the folder's name
    doc = dict(report.to_dict(), save_error=f"could not save {ck}/x")
    path = VerifyReport.from_dict(doc).save(ck, local_paths=(str(ck),))
    assert str(ck) not in path.read_text() and '"could not save drafter/x"' in path.read_text()
    assert VerifyReport.load(path).main == report.main


def test_verify_package_layers_have_no_circle():
    """Each module of eagle3conv/verify imports (at any depth, lazily too) only modules
    below it in this order: no import circle inside the package."""
    import ast
    from pathlib import Path

    import eagle3conv.verify as pkg

    order = ["options", "stats", "feed", "logscore", "evaluate", "words", "search", "profile", "report", "plot", "inputs", "run"]
    folder = Path(pkg.__file__).parent
    assert sorted(p.stem for p in folder.glob("*.py")) == sorted(order + ["__init__"])
    for i, name in enumerate(order):
        tree = ast.parse((folder / f"{name}.py").read_text())
        used = {n.module.split(".")[2] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                and n.module.startswith("eagle3conv.verify.")}
        used |= {a.name.split(".")[2] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
                 if a.name.startswith("eagle3conv.verify.")}
        assert used <= set(order[:i]), f"verify/{name}.py imports {sorted(used - set(order[:i]))}"
        assert not any(isinstance(n, ast.ImportFrom) and n.module == "eagle3conv.verify" for n in ast.walk(tree))


def test_confidence_set_text_counts_every_member_not_only_the_listed():
    """The report lists the screen's unconfirmed survivors up to a cap (LISTED) but counts them all
    (to_separate.members): the text says how many more there are, and that some are not listed."""
    from eagle3conv.render import confidence_set_lines

    confirmed = [{"layers": f"outputs of layers 1, {i}, 26", "confirmed": True, "accept_length_all_starts": 1.8}
                 for i in range(5, 20)]
    unconfirmed = [{"layers": f"outputs of layers 2, {i}, 25", "confirmed": False} for i in range(3, 23)]
    from eagle3conv.verify.search import Verdict

    def verdict(members, counted=None):
        return Verdict.from_dict({"config_accept_length": 1.0, "status": "stands", "confidence_set": members,
                                  "set_statistic": "acceptance",
                                  **({"to_separate": {"members": counted}} if counted else {})})

    lines = confidence_set_lines(verdict(confirmed + unconfirmed, 569))
    assert len(lines) == 1 + 12 + 1
    assert lines[-1] == "  ... and 557 more (534 of them kept by the screen or refinement, counted but not listed)"
    assert lines[1].endswith("accept length 1.8000 over every chain start")
    # every member listed: no word of unlisted ones
    assert confidence_set_lines(verdict(confirmed + unconfirmed, 35))[-1] == "  ... and 23 more"
    assert confidence_set_lines(verdict(confirmed[:3]))[-1].startswith("  outputs of layers 1, 7, 26")


def test_a_submodule_import_leaves_the_packages_function_of_its_name():
    """``eagle3conv.verify`` exports ``evaluate`` (the function) and holds ``evaluate`` (the module); the
    package's names are looked up lazily, and importing the submodule first must not make
    ``from eagle3conv.verify import evaluate`` hand back the module (bench_verify_gpu.py did, on the H200)."""
    import subprocess
    import sys

    code = ("import eagle3conv.verify.evaluate, eagle3conv.verify.run\n"
            "from eagle3conv.verify import evaluate\n"
            "import eagle3conv\n"
            "assert callable(evaluate) and evaluate.__module__ == 'eagle3conv.verify.evaluate', evaluate\n"
            "assert eagle3conv.verify.evaluate is evaluate and callable(eagle3conv.verify)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
