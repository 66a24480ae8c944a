"""``capture --engine vllm``: the vLLM 0.33.0 invocation, checked against vLLM's own classes.

A real vLLM run needs GPUs (docs/capture-at-scale.md says what was not run here). What runs
on CPU:

* the plan and ``--dry-run``: the exact ``LLM(...)`` keyword arguments, ``SamplingParams``
  and ``vllm serve`` line, the numbering (vLLM id = output-of id + 1), the refusals;
* ``test_vllm_own_classes_accept_the_invocation``: vLLM 0.33.0's ``KVTransferConfig``,
  ``EngineArgs``, ``SamplingParams``, ``ExtractHiddenStatesConfig`` and ``SpeculativeConfig``'s
  fields take exactly what the plan builds, in a subprocess whose path holds vLLM (installed
  with ``pip install 'eagle3conv[vllm]'``, or the CPU-importable set that
  ``scripts/vllm_config_site.sh DIR`` installs; point ``EAGLE3CONV_VLLM_SITE`` at DIR);
* the file handling of a run (wait for the connector's lock, move to ``hs_{i}``, check the
  token ids, write the sidecar, rename into place; nothing at ``--out`` on failure), with the
  engine replaced by a stand-in that writes each file with the connector's own call
  (``safetensors.torch.save_file({"hidden_states", "token_ids"})``, vLLM 0.33.0
  ``example_hidden_states_connector.py:343, 415-418``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from eagle3conv.cli import main
from eagle3conv.errors import CheckpointReadError, UsageError, WriteError
from eagle3conv.states.vllm_capture import (
    SIDECAR,
    VllmCapturePlan,
    parse_vllm_args,
    read_capture_record,
    run_vllm_capture,
    vllm_ids_for,
)

N, T, V = 30, 576, 49152  # SmolLM2-135M's shape


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A target folder as vLLM reads it: config.json written by transformers itself, and a tokenizer."""
    from transformers import LlamaConfig

    from test_capture import tiny_tokenizer

    root = tmp_path_factory.mktemp("target")
    LlamaConfig(architectures=["LlamaForCausalLM"], num_hidden_layers=N, hidden_size=T, intermediate_size=1536,
                num_attention_heads=9, num_key_value_heads=3, vocab_size=V).save_pretrained(root)
    tiny_tokenizer().save_pretrained(root)
    return root


def _plan(target, out, **kw):
    return VllmCapturePlan(target=str(target), num_layers=N, hidden_size=T, vocab_size=V,
                           vllm_ids=vllm_ids_for(kw.pop("layers", [1, 14, 26]), N), out=out, **kw)


def test_numbering_is_vllms():
    assert vllm_ids_for([26, 1, 14, -1], N) == (0, 2, 15, 27)  # the embedding (vLLM id 0) always, ascending
    assert vllm_ids_for(None, N) == tuple(range(N + 1))  # every layer: 0 .. N (N = last layer, pre-norm)
    with pytest.raises(UsageError, match=r"layers \[30\] do not exist"):
        vllm_ids_for([30], N)


def test_dry_run_prints_the_exact_invocation(target, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi", "category": "chat"}\n')
    out = tmp_path / "kimi-states"
    res = CliRunner().invoke(main, ["--json", "capture", "--engine", "vllm", "--target", str(target),
                                    "--prompts", str(prompts), "--out", str(out), "--layers", "1,14,26",
                                    "--tensor-parallel-size", "8", "--generate", "64", "--max-length", "2048",
                                    "--trust-remote-code", "--vllm-arg", "gpu_memory_utilization=0.85",
                                    "--dry-run"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    storage = d["llm_kwargs"]["kv_transfer_config"]["kv_connector_extra_config"]["shared_storage_path"]
    assert d["llm_kwargs"] == {
        "model": str(target), "tensor_parallel_size": 8, "dtype": "bfloat16", "max_model_len": 2048,
        "speculative_config": {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                               "draft_model_config": {"hf_config": {
                                   "eagle_aux_hidden_state_layer_ids": [0, 2, 15, 27]}}},
        "kv_transfer_config": {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                               "kv_connector_extra_config": {"shared_storage_path": storage}},
        "trust_remote_code": True, "gpu_memory_utilization": 0.85}
    assert d["sampling_params"]["temperature"] == 0.0
    assert d["sampling_params"]["extra_args"] == {"kv_transfer_params": {"include_output_tokens": True}}
    assert d["layers"]["output_of"] == [-1, 1, 14, 26] and d["prompt_count"] == 1
    v = d["verdict"]  # issue 27: planned, nothing run; the layers it would keep of the target's, against those asked
    assert (v["outcome"], v["layers"], v["layers_asked"], v["num_layers"], v["every_layer"]) == (
        "planned", [-1, 1, 14, 26], [1, 14, 26], N, False)
    assert (v["sequences"], v["tokens"], v["chat_template_used"], v["notes"]) == (1, None, None, ["chosen-layers"])
    assert d["serve"].startswith(f"vllm serve {target} --tensor-parallel-size 8 ")
    assert "--speculative-config '" in d["serve"] and "--kv-transfer-config '" in d["serve"]
    assert not out.exists()  # a dry run writes nothing
    text = CliRunner().invoke(main, ["capture", "--engine", "vllm", "--target", str(target), "--prompts",
                                     str(prompts), "--out", str(out), "--dry-run"])
    assert text.exit_code == 0 and "vllm.LLM(**{" in text.output and "nothing was run" in text.output


def test_refusals_before_any_work(target, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hi\n")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("keep")
    base = ["capture", "--target", str(target), "--prompts", str(prompts)]
    cases = [
        (["--engine", "vllm", "--out", str(full), "--dry-run"], "already exists and is not an empty folder"),
        (["--engine", "vllm", "--out", str(tmp_path / "o"), "--device", "cpu"], "--device is for --engine transformers"),
        (["--out", str(tmp_path / "s.safetensors"), "--dry-run"], "--dry-run is for --engine vllm"),
        (["--out", str(tmp_path / "s.safetensors"), "--tensor-parallel-size", "2"], "is for --engine vllm"),
        (["--engine", "vllm", "--out", str(tmp_path / "o"), "--vllm-arg", "speculative_config=1", "--dry-run"],
         "capture sets it"),
        (["--engine", "vllm", "--out", str(tmp_path / "o"), "--layers", "31", "--dry-run"], "do not exist"),
    ]
    for extra, message in cases:
        res = CliRunner().invoke(main, base + extra)
        assert res.exit_code != 0 and message in res.output, (extra, res.output)
        assert "Traceback" not in res.output
    assert (full / "x").read_text() == "keep"
    assert parse_vllm_args(["enforce_eager=true", "--max-num-seqs=8", "x=abc"]) == {
        "enforce_eager": True, "max_num_seqs": 8, "x": "abc"}


def test_serve_line_uses_only_vllm_0_33_options(target, tmp_path):
    """Every option of the serve line, and every --speculative-config key, is one vLLM 0.33.0 defines
    (mappings/engines/options/vllm-0.33.0.json: read from the wheel's argument definitions), and the
    project's own launch-line parser reads back the same settings."""
    from eagle3conv.spec.launch import option_names, parse_line

    plan = _plan(target, tmp_path / "o", tensor_parallel_size=8, trust_remote_code=True,
                 extra={"gpu_memory_utilization": 0.85})
    line = " ".join(__import__("shlex").quote(a) for a in plan.serve_argv(tmp_path / "c"))
    parsed = parse_line(line)
    known = option_names("vllm==0.33.0")
    assert known.read_from == "0.33.0"
    assert parsed.engine == "vllm" and parsed.positional[-1:] == (str(target),)
    assert {o.name for o in parsed.options} <= known.options, {o.name for o in parsed.options} - known.options
    assert set(parsed.spec) <= known.keys and dict(parsed.spec) == plan.speculative_config()
    assert parsed.value("--tensor-parallel-size") == "8"


# --------------------------------------------------------------------------- against vLLM's own classes


def _vllm_path() -> str | None:
    site = os.environ.get("EAGLE3CONV_VLLM_SITE")
    if site and Path(site, "vllm").is_dir():
        return site
    if importlib.util.find_spec("vllm") is not None:
        return ""
    return None


CHECK = r'''
import dataclasses, json, sys, typing
plan = json.loads(sys.argv[1])
import vllm
assert vllm.__version__.startswith("0.33.0"), vllm.__version__
from vllm.config import KVTransferConfig, SpeculativeConfig
from vllm.config.speculative import SpeculativeMethod
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.transformers_utils.configs.extract_hidden_states import ExtractHiddenStatesConfig
from transformers import AutoConfig

kw = plan["llm_kwargs"]
kv = KVTransferConfig(**kw["kv_transfer_config"])
assert kv.is_kv_producer and kv.kv_connector == "ExampleHiddenStatesConnector"
assert kv.get_from_extra_config("shared_storage_path", None) == plan["storage"]
fields = {f.name for f in dataclasses.fields(EngineArgs)}
assert set(kw) <= fields, set(kw) - fields
ea = EngineArgs(**kw)  # LLM(**kw) hands its keywords to EngineArgs
assert ea.tensor_parallel_size == kw["tensor_parallel_size"] and ea.speculative_config == kw["speculative_config"]
serve = plan["serve_argv"]
assert serve[:3] == ["vllm", "serve", kw["model"]]
flags = serve[3:]
for flag, value in zip(flags[::2], flags[1::2]):
    name = flag[2:].replace("-", "_")
    assert name in fields, flag
    want = kw[name]
    got = json.loads(value) if isinstance(want, (dict, list, int, float)) else value
    assert got == want, (flag, got, want)
spec = kw["speculative_config"]
assert set(spec) <= set(SpeculativeConfig.__dataclass_fields__), set(spec)
assert spec["method"] in typing.get_args(SpeculativeMethod) or spec["method"] in str(SpeculativeMethod)
hf = ExtractHiddenStatesConfig(AutoConfig.from_pretrained(kw["model"]), **spec["draft_model_config"]["hf_config"])
ids = list(hf.eagle_aux_hidden_state_layer_ids)
assert ids == plan["ids"] and min(ids) >= 0 and max(ids) <= hf.num_hidden_layers
assert hf.architectures == ["ExtractHiddenStatesModel"]
sp = SamplingParams(**plan["sampling"])
assert sp.temperature == 0.0 and sp.max_tokens == plan["sampling"]["max_tokens"]
assert sp.extra_args["kv_transfer_params"] == {"include_output_tokens": True}
print("vllm", vllm.__version__, "accepts the invocation")
'''


def test_vllm_own_classes_accept_the_invocation(target, tmp_path):
    path = _vllm_path()
    if path is None:
        pytest.skip("vLLM 0.33.0 is not importable: pip install 'eagle3conv[vllm]', or "
                    "bash scripts/vllm_config_site.sh DIR and set EAGLE3CONV_VLLM_SITE=DIR")
    plan = _plan(target, tmp_path / "o", tensor_parallel_size=8, generate=16, max_length=1024,
                 extra={"gpu_memory_utilization": 0.85, "enforce_eager": True})
    storage = str(tmp_path / "connector")
    doc = {"llm_kwargs": plan.llm_kwargs(storage), "serve_argv": plan.serve_argv(storage), "storage": storage,
           "ids": list(plan.vllm_ids), "sampling": plan.sampling_kwargs(100)}
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR")
    if path:
        env["PYTHONPATH"] = os.pathsep.join([path, env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-c", CHECK, json.dumps(doc)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "accepts the invocation" in res.stdout


# --------------------------------------------------------------------------- a run's file handling


class _Engine:
    """Stands in for vLLM on CPU: each request 'generates' a fixed continuation and its file is
    written as the connector writes it (hidden_states [S, n, T], token_ids [S]; a .lock beside it)."""

    def __init__(self, *, corrupt: int | None = None, **kwargs):
        self.kwargs = kwargs
        self.corrupt = corrupt

    def generate(self, prompts, params, use_tqdm=True):
        storage = Path(self.kwargs["kv_transfer_config"]["kv_connector_extra_config"]["shared_storage_path"])
        n = len(self.kwargs["speculative_config"]["draft_model_config"]["hf_config"][
            "eagle_aux_hidden_state_layer_ids"])
        outs = []
        for r, (p, sp) in enumerate(zip(prompts, params)):
            gen = [7 + r] * sp.kw["max_tokens"]
            keep = p["prompt_token_ids"] + (gen[:-1] if sp.kw["extra_args"]["kv_transfer_params"][
                "include_output_tokens"] else [])
            if r == self.corrupt:
                keep = keep[:-1]
            path = storage / f"req-{r}.safetensors"
            storage.mkdir(parents=True, exist_ok=True)
            Path(str(path) + ".lock").write_text("")
            save_file({"hidden_states": torch.zeros(len(keep), n, T, dtype=torch.bfloat16),
                       "token_ids": torch.tensor(keep, dtype=torch.long)}, str(path))
            outs.append(types.SimpleNamespace(kv_transfer_params={"hidden_states_path": str(path)},
                                              outputs=[types.SimpleNamespace(token_ids=gen, finish_reason="length")]))
        return outs


def _fake_vllm(monkeypatch, **engine):
    class Params:
        def __init__(self, **kw):
            self.kw = kw

    mod = types.ModuleType("vllm")
    mod.__version__ = "0.33.0"
    mod.LLM = lambda **kw: _Engine(**engine, **kw)
    mod.SamplingParams = Params
    monkeypatch.setitem(sys.modules, "vllm", mod)


def test_run_moves_checks_and_records_every_file(target, tmp_path, monkeypatch):
    _fake_vllm(monkeypatch)
    out = tmp_path / "states"
    prompts = [{"prompt": "what is two plus two", "category": "math"}, {"prompt": "hello world"}]
    res = run_vllm_capture(_plan(target, out, generate=4), prompts)
    assert sorted(p.name for p in out.iterdir()) == ["eagle3conv-capture.json", "hs_0.safetensors", "hs_1.safetensors"]
    side = json.loads((out / SIDECAR).read_text())
    assert side["format"] == "eagle3conv-capture" and side["vllm_layer_ids"] == [0, 2, 15, 27]
    assert side["layers"] == [{"output_of": i} for i in (-1, 1, 14, 26)]
    s0 = side["sequences"][0]
    assert s0["file"] == "hs_0.safetensors" and s0["category"] == "math" and s0["next_token"] == 7
    assert s0["tokens"] == s0["prompt_tokens"] + 3 and s0["generated"] == 4
    assert side["sequences"][1]["category"] is None
    assert res.categories == {"(none)": 1, "math": 1}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
    # the record reads back, and says what the files cannot: the target's tokens on the response, the loss mask
    from safetensors import safe_open

    rec = read_capture_record(out)
    assert rec.vllm_ids == (0, 2, 15, 27) and rec.output_of == (-1, 1, 14, 26) and rec.categories == ("math", None)
    seq = rec.sequences[0]
    with safe_open(str(out / seq.file), framework="pt") as f:
        ids = f.get_tensor("token_ids").tolist()
    nxt = seq.target_next(ids)
    p = seq.prompt_tokens
    assert nxt[: p - 1] == [-1] * (p - 1) and nxt[p - 1:] == [7, 7, 7, 7]  # 4 greedy tokens: 3 in the file, 1 after
    assert seq.loss_mask() == [False] * p + [True] * 3


def test_the_record_refuses_what_it_cannot_read(target, tmp_path, monkeypatch):
    _fake_vllm(monkeypatch)
    out = tmp_path / "states"
    run_vllm_capture(_plan(target, out, generate=2), ["the cat"])
    good = json.loads((out / SIDECAR).read_text())
    for change, message in (({"format": "x"}, "'format' must be"), ({"version": 2}, "version 2"),
                            ({"vllm_layer_ids": [2, 0]}, "'vllm_layer_ids' must be"),
                            ({"layers": [{"output_of": 0}]}, "'layers' must be"),
                            ({"sequences": [dict(good["sequences"][0], prompt_tokens=999)]}, "is more than"),
                            ({"sequences": [dict(good["sequences"][0], file="hs_7.safetensors")]}, "must be 'hs_0")):
        (out / SIDECAR).write_text(json.dumps(dict(good, **change)))
        with pytest.raises(CheckpointReadError, match=message):
            read_capture_record(out)
    assert read_capture_record(tmp_path) is None


def test_a_bad_file_leaves_nothing_at_out(target, tmp_path, monkeypatch):
    _fake_vllm(monkeypatch, corrupt=1)
    out = tmp_path / "states"
    with pytest.raises(WriteError, match="hs_1.safetensors: token_ids differ"):
        run_vllm_capture(_plan(target, out, generate=2), ["the cat", "the dog"])
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_runs_verdict_says_what_it_wrote_against_its_plan(target, tmp_path):
    """issue 27: the run's --json verdict: written (sequences, tokens), every layer or those asked, the chat
    template asked and the one the target's tokenizer let it use (its record's)."""
    from eagle3conv.states.vllm_capture import VllmCaptureResult

    plan = _plan(target, tmp_path / "o", layers=None, generate=4)
    res = VllmCaptureResult(out=plan.out, sequences=2, tokens=40, generated_tokens=8, vllm_ids=plan.vllm_ids,
                            categories=None, sidecar={"chat_template": False}, plan=plan)
    v = res.to_dict()["verdict"]
    assert (v["outcome"], v["every_layer"], v["layers_asked"], v["sequences"], v["tokens"]) == (
        "wrote", True, None, 2, 40)
    assert (v["chat_template_asked"], v["chat_template_used"], v["notes"]) == (True, False, ["no-chat-template"])
