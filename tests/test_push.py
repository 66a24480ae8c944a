"""``push`` against a real Hub-compatible HTTP server on 127.0.0.1 (tests/hub_server.py).

The real huggingface_hub client talks to it over a real socket, with xet off (the
server speaks the LFS transfer, single-part and multipart). Nothing is mocked but the
client's retry *waits* (``time.sleep`` inside its backoff), so the fault tests, where
the client retries five times, stay fast.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import types
from pathlib import Path

import pytest

from conftest import PICO
from hub_server import HubServer
from eagle3conv.checkpoint.links import UnsafeLinkError
from eagle3conv.errors import EXIT_ERROR, EXIT_INVALID, EXIT_USAGE, InvalidCheckpointError, PushError, UsageError
from eagle3conv.example import write_example
from eagle3conv.hub.card import BEGIN, END, TAGS, read_verify_report
from eagle3conv.hub.push import PUSH_RECORD, read_record, select_files
from eagle3conv.publish import push
from eagle3conv.verify import REPORT_FILE as VERIFY_REPORT

TARGET = "org/pico-target"  # no built-in profile: the pico drafter is 32 wide
SECRET = "hf_SECRETtok3n_do_not_show_9f8e7d6c"


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def hub_env():
    """One server for the module; the client pointed at it, xet off, no retry waits."""
    import huggingface_hub.constants as constants
    from huggingface_hub.utils import _http

    server = HubServer(multipart_chunk=16 * 1024).start()
    mp = pytest.MonkeyPatch()
    # read at import by huggingface_hub: set both the environment (for subprocesses)
    # and the already-imported constants (for this process)
    mp.setenv("HF_ENDPOINT", server.url)
    mp.setenv("HF_HUB_DISABLE_XET", "1")
    mp.delenv("HF_TOKEN", raising=False)
    mp.setattr(constants, "ENDPOINT", server.url)
    mp.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", server.url + "/{repo_id}/resolve/{revision}/{filename}")
    mp.setattr(constants, "HF_HUB_DISABLE_XET", True)
    mp.setattr(_http, "time", types.SimpleNamespace(sleep=lambda s: None, time=time.time, monotonic=time.monotonic))
    yield server
    mp.undo()
    server.stop()


@pytest.fixture
def hub(hub_env):
    hub_env.clear_faults()
    hub_env.multipart_chunk = 16 * 1024
    hub_env.log.clear()
    return hub_env


def report_json(acceptance, accept_length, layers=(1, 14, 26)) -> str:
    """A verify report with these figures, in the one format verify writes (eagle3conv.verify.VerifyReport)."""
    from eagle3conv.verify import VerifyReport
    from eagle3conv.spec.layers import describe, outputs

    fig = {"acceptance_per_position": list(acceptance), "acceptance_ci95": [[a, a] for a in acceptance],
           "accept_length": accept_length, "accept_length_ci95": [accept_length, accept_length]}
    result = dict(fig, wiring="config", layers=[{"output_of": i} for i in layers],
                  described=describe(outputs(*layers)), positions_scored=100, sequences=10, rounds=50)
    doc = dict(fig, format="eagle3conv-verify", version=1, steps=len(acceptance), passed=True,
               states={"sequences": 10, "tokens": 120}, reference="target", results=[result],
               statistic="teacher-forced top-1 acceptance against the target's greedy next tokens",
               verdict={"config_accept_length": accept_length, "status": None})
    return VerifyReport.from_dict(doc).to_json()


@pytest.fixture(scope="module")
def canonical_src(tmp_path_factory):
    """The example drafter made canonical by fix-keys, plus what a training run leaves beside it."""
    from eagle3conv.api import fix_keys
    from eagle3conv.wiring.metadata import from_user, write_metadata_file

    root = tmp_path_factory.mktemp("src") / "drafter"
    import dataclasses

    write_example(root, "modelopt-export", PICO)
    rec = dataclasses.replace(from_user("2,15,27", "input"), target=TARGET, draft_vocab_size=PICO.draft_vocab)
    write_metadata_file(root, rec)
    fix_keys(root)
    (root / VERIFY_REPORT).write_text(report_json([0.8, 0.6, 0.45], 2.5))
    import torch

    torch.save({"epoch": 1, "global_step": 100}, root / "training_state.pt")  # trainer state: never sent
    (root / "notes.txt").write_text("scratch")  # not needed by a server
    (root / ".cache").mkdir()  # hidden: never sent
    (root / ".cache" / "x.safetensors").write_bytes(b"half")
    return root


@pytest.fixture
def ckpt(canonical_src, tmp_path):
    dest = tmp_path / "drafter"
    shutil.copytree(canonical_src, dest)
    return dest


_counter = iter(range(10_000))


@pytest.fixture
def repo():
    return f"org/drafter-{next(_counter)}"


def sent(hub, repo: str) -> list:
    """Requests this test made about ``repo`` (the shared server may still log a late request
    of an earlier test, about another repo)."""
    return [e for e in hub.log if repo in e.path]


def tree_hash(folder: Path, *, skip=(PUSH_RECORD,)) -> dict:
    out = {}
    for dirpath, _, files in os.walk(folder):
        for f in files:
            p = Path(dirpath) / f
            rel = p.relative_to(folder).as_posix()
            if rel not in skip:
                out[rel] = (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
    return out


def do_push(hub, path, repo_id, **kw):
    kw.setdefault("endpoint", hub.url)
    return push(path, repo_id, **kw)


SENT = {"model.safetensors", "config.json", "tokenizer_config.json", "training_metadata.json", VERIFY_REPORT, "README.md"}


# --------------------------------------------------------------------------- round trip


def test_round_trip_bytes_card_and_record(hub, ckpt, repo, tmp_path):
    from huggingface_hub import ModelCard, snapshot_download

    before = tree_hash(ckpt)
    result = do_push(hub, ckpt, repo)

    assert {f.path for f in result.files} == SENT
    skipped = dict(result.skipped)
    assert "training_state.pt" in skipped and "pickle" in skipped["training_state.pt"]
    assert ".cache/" in skipped and "notes.txt" in skipped
    assert not result.unchanged and len(result.commit) == 40
    assert hub.refs(repo)["main"] == result.commit
    assert hub.paths(repo) == SENT | {".gitattributes"}
    assert "lfs-part" in hub.routes() and "lfs-complete" in hub.routes()  # multipart transfer used

    out = Path(snapshot_download(repo, local_dir=tmp_path / "dl", endpoint=hub.url, token=False))
    for name in SENT - {"README.md"}:
        assert (out / name).read_bytes() == (ckpt / name).read_bytes(), name
    readme = (out / "README.md").read_text()
    assert readme == result.card

    # the local folder is byte-identical; only the push record was added
    assert tree_hash(ckpt) == before
    record = read_record(ckpt)
    assert record["repo_id"] == repo and record["commit"] == result.commit and record["revision"] == "main"
    assert PUSH_RECORD not in hub.paths(repo)

    card = ModelCard(readme)
    assert card.data.base_model == TARGET
    assert set(TAGS) <= set(card.data.tags)
    assert card.data.library_name
    text = card.text
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert "outputs of layers 1, 14, 26" in text
    from helpers import NEWEST_SGLANG, NEWEST_VLLM, OLDEST_SGLANG

    # every release checked, by the engine rules; releases that read alike share a row (issue 27)
    assert (f"| sglang {OLDEST_SGLANG}, {NEWEST_SGLANG} | `eagle_config.eagle_aux_hidden_state_layer_ids` in "
            "config.json | `[1, 14, 26]` |") in text
    assert f"| vllm {NEWEST_VLLM} | `eagle_aux_hidden_state_layer_ids` in config.json | `[2, 15, 27]` |" in text
    assert "eagle3_layers_to_capture: [1, 14, 26]" in text
    assert (f"python -m sglang.launch_server --model-path {TARGET} --speculative-algorithm EAGLE3 "
            f"--speculative-draft-model-path {repo} --speculative-num-steps 3 --speculative-eagle-topk 1 "
            "--speculative-num-draft-tokens 4") in text
    assert f"""vllm serve {TARGET} --speculative-config '{{"method": "eagle3", "model": "{repo}", "num_speculative_tokens": 3}}'""" in text
    assert "80.0% | 60.0% | 45.0%" in text and "Expected accept length: **2.50**" in text
    assert "passed: canonical" in text and "passed: smoke-test" in text


def test_second_push_of_unchanged_folder_makes_no_commit(hub, ckpt, repo):
    first = do_push(hub, ckpt, repo)
    commits = hub.commit_ids(repo)
    hub.log.clear()
    second = do_push(hub, ckpt, repo)
    assert second.unchanged and second.commit == first.commit
    assert hub.commit_ids(repo) == commits
    assert "commit" not in hub.routes()
    assert read_record(ckpt)["unchanged"] is True
    # the record names the repo: a push without --repo-id goes to the same place
    third = push(ckpt, endpoint=hub.url)
    assert third.repo_id == repo and third.unchanged


def test_default_endpoint_comes_from_hf_endpoint(hub, ckpt, repo):
    result = push(ckpt, repo)  # no endpoint=: huggingface_hub's HF_ENDPOINT
    assert result.endpoint == hub.url and hub.refs(repo)["main"] == result.commit


def test_create_pr_lands_on_refs_pr_and_main_is_unchanged(hub, ckpt, repo):
    first = do_push(hub, ckpt, repo)
    (ckpt / VERIFY_REPORT).write_text(report_json([0.9, 0.7, 0.5], 2.2))
    pr = do_push(hub, ckpt, repo, create_pr=True, commit_message="better acceptance")
    assert pr.pr_url.endswith(f"/{repo}/discussions/1") and pr.pr_revision == "refs/pr/1"
    refs = hub.refs(repo)
    assert refs["main"] == first.commit and refs["refs/pr/1"] == pr.commit != first.commit
    assert json.loads(hub.read(repo, VERIFY_REPORT, "refs/pr/1"))["acceptance_per_position"][0] == 0.9
    assert json.loads(hub.read(repo, VERIFY_REPORT, "main"))["acceptance_per_position"][0] == 0.8
    assert "90.0%" in hub.read(repo, "README.md", "refs/pr/1").decode()
    assert hub.repo(repo).commits[pr.commit].title == "better acceptance"
    assert read_record(ckpt)["revision"] == "refs/pr/1"


def test_revision_creates_and_reuses_a_branch(hub, ckpt, repo):
    r = do_push(hub, ckpt, repo, revision="v2")
    refs = hub.refs(repo)
    assert refs["v2"] == r.commit and refs["main"] != r.commit
    assert hub.paths(repo, "main") == {".gitattributes"}
    assert hub.paths(repo, "v2") == SENT | {".gitattributes"}
    again = do_push(hub, ckpt, repo, revision="v2")
    assert again.unchanged and hub.refs(repo)["v2"] == r.commit


def test_existing_repo_is_fine(hub, ckpt, repo):
    from huggingface_hub import HfApi

    HfApi(endpoint=hub.url, token=False).create_repo(repo)
    result = do_push(hub, ckpt, repo)
    assert hub.refs(repo)["main"] == result.commit
    assert [e.status for e in hub.log if e.route == "create"][-1] == 409


# --------------------------------------------------------------------------- faults


def _fault_case(hub, ckpt, repo, *, pre_create=True, **push_kw):
    from huggingface_hub import HfApi

    if pre_create:
        HfApi(endpoint=hub.url, token=False).create_repo(repo)
    commits, refs = hub.commit_ids(repo), hub.refs(repo)
    before = tree_hash(ckpt, skip=())
    with pytest.raises(PushError) as info:
        do_push(hub, ckpt, repo, **push_kw)
    err = info.value
    assert err.exit_code == EXIT_ERROR
    assert hub.commit_ids(repo) == commits and hub.refs(repo) == refs  # no half-made commit
    assert tree_hash(ckpt, skip=()) == before  # nothing changed locally, no push record
    assert not (ckpt / PUSH_RECORD).exists()
    return err


@pytest.mark.parametrize("route", ["lfs-part", "lfs-upload"])
def test_connection_dropped_mid_upload(hub, ckpt, repo, route):
    if route == "lfs-upload":
        hub.multipart_chunk = None
    hub.fault(route, drop_after=2000)
    err = _fault_case(hub, ckpt, repo)
    assert "connection" in err.message and "nothing was committed" in err.message
    assert "retrying is safe" in err.message
    assert not [e for e in hub.log if e.route == "commit"]
    # the same push succeeds once the network is back: retry is safe
    hub.clear_faults()
    ok = do_push(hub, ckpt, repo)
    assert hub.refs(repo)["main"] == ok.commit


def test_401_bad_token(hub, ckpt, repo):
    hub.require_token = "hf_the_right_one"
    err = _fault_case(hub, ckpt, repo, pre_create=False, token=SECRET)
    assert "401" in err.message and "nothing was committed" in err.message
    assert "HF_TOKEN" in err.hint and "hf auth login" in err.hint
    assert not hub.has_repo(repo)


def test_403_no_write_access(hub, ckpt, repo):
    hub.forbid = True
    err = _fault_case(hub, ckpt, repo, pre_create=False)
    assert "no write access to org" in err.message and "403" in err.message
    # an existing repo the token cannot write to: create_repo passes (exist_ok), the upload is refused
    hub.forbid = False
    from huggingface_hub import HfApi

    HfApi(endpoint=hub.url, token=False).create_repo(repo)
    hub.forbid = True
    err = _fault_case(hub, ckpt, repo, pre_create=False)
    assert "no write access to org" in err.message


def test_404_revision_for_pr_not_found(hub, ckpt, repo):
    err = _fault_case(hub, ckpt, repo, create_pr=True, revision="no-such-branch")
    assert "revision 'no-such-branch' not found" in err.message


def test_404_repo_not_found(hub, ckpt, repo):
    hub.fault("preupload", status=404, headers={"X-Error-Code": "RepoNotFound"})
    err = _fault_case(hub, ckpt, repo)
    assert f"repo {repo} not found" in err.message


@pytest.mark.parametrize("route", ["commit", "preupload", "lfs-batch"])
def test_500_nothing_committed(hub, ckpt, repo, route):
    hub.fault(route, status=500)
    err = _fault_case(hub, ckpt, repo)
    assert "500" in err.message and "nothing was committed" in err.message and "retrying is safe" in err.message


def test_token_never_shown(hub, ckpt, repo, caplog, capsys, monkeypatch):
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_DEBUG", True)  # the client logs curl commands
    caplog.set_level(logging.DEBUG)
    hub.require_token = SECRET
    ok = do_push(hub, ckpt, repo, token=SECRET, progress=print)
    # every Hub call carried the token (LFS storage URLs are pre-signed and take none)
    assert all(e.authorized for e in hub.log if e.route != "unknown" and e.route not in (
        "lfs-upload", "lfs-part", "lfs-complete", "lfs-verify"))
    # a careless server that echoes the Authorization header into its error
    (ckpt / "config.json").write_text((ckpt / "config.json").read_text() + "\n")
    hub.fault("commit", status=500, echo_auth=True)
    with pytest.raises(PushError) as info:
        do_push(hub, ckpt, repo, token=SECRET, progress=print, gate=None)
    err = info.value
    assert "***" in json.dumps(err.to_dict())  # the echoed header was there, scrubbed
    out = capsys.readouterr()
    assert "bad header Bearer ***" in caplog.text  # httpcore's debug log saw the echo, scrubbed
    for text in (str(err), json.dumps(err.to_dict()), caplog.text, out.out, out.err,
                 (ckpt / PUSH_RECORD).read_text()):
        assert SECRET not in text
    assert err.__cause__ is None and err.__context__ is None  # the client's exception is not attached
    assert ok.commit


# --------------------------------------------------------------------------- gate, card, dry run


def test_gate_refuses_a_non_canonical_checkpoint_and_force_overrides(hub, tmp_path, repo):
    raw = write_example(tmp_path / "raw", "modelopt-export", PICO)  # layers.0.* names: SGLang would skip them
    before = tree_hash(raw)
    with pytest.raises(InvalidCheckpointError) as info:
        do_push(hub, raw, repo)
    err = info.value
    assert err.exit_code == EXIT_INVALID and "refusing to push" in err.message
    assert any("fix-keys" in d for d in err.details) and "--force" in err.hint
    assert not sent(hub, repo) and tree_hash(raw) == before

    forced = do_push(hub, raw, repo, force=True)
    assert forced.forced
    card = hub.read(repo, "README.md").decode()
    assert "pushed with `--force`" in card and "FAILED: canonical" in card
    assert "forced" in hub.repo(repo).commits[forced.commit].title


def test_custom_gate_and_failure_reasons(hub, ckpt, repo):
    from eagle3conv.hub.card import Check

    def gate(path):
        return [Check("config-check", False, "aux ids disagree with training_metadata.json")]

    with pytest.raises(InvalidCheckpointError) as info:
        do_push(hub, ckpt, repo, gate=gate)
    assert info.value.details == ["config-check: aux ids disagree with training_metadata.json"]
    assert not sent(hub, repo)


def test_readme_user_text_and_front_matter_are_kept(hub, ckpt, repo):
    from huggingface_hub import HfApi, ModelCard

    user = "---\nlicense: mit\ntags:\n- mine\n---\n\n# My drafter\n\nTrained on my data. Keep this.\n"
    (ckpt / "README.md").write_text(user)
    first = do_push(hub, ckpt, repo)
    card = ModelCard(hub.read(repo, "README.md").decode())
    assert card.data.license == "mit" and card.data.tags[0] == "mine" and set(TAGS) <= set(card.data.tags)
    assert "# My drafter\n\nTrained on my data. Keep this." in card.text and card.text.count(BEGIN) == 1
    assert (ckpt / "README.md").read_text() == user  # the local README is never rewritten

    # the user edits their text; the generated block is replaced, not duplicated
    (ckpt / "README.md").write_text(user.replace("Keep this.", "Keep this, v2."))
    second = do_push(hub, ckpt, repo)
    text = hub.read(repo, "README.md").decode()
    assert second.commit != first.commit and "Keep this, v2." in text and text.count(BEGIN) == 1

    # text written on the Hub is kept too when the folder has no README.md
    (ckpt / "README.md").unlink()
    edited = text.replace("# My drafter", "# My drafter\n\nEdited on the Hub.")
    from huggingface_hub import CommitOperationAdd

    HfApi(endpoint=hub.url, token=False).create_commit(
        repo, [CommitOperationAdd("README.md", edited.encode())], commit_message="edit card")
    (ckpt / VERIFY_REPORT).write_text(report_json([0.7, 0.5, 0.4], 2.5))
    do_push(hub, ckpt, repo)
    text = hub.read(repo, "README.md").decode()
    assert "Edited on the Hub." in text and "**2.50**" in text and text.count(END) == 1


def test_dry_run_sends_nothing(hub, ckpt, repo):
    before = tree_hash(ckpt, skip=())
    result = do_push(hub, ckpt, repo, dry_run=True)
    assert not sent(hub, repo) and not hub.has_repo(repo)
    assert tree_hash(ckpt, skip=()) == before and not (ckpt / PUSH_RECORD).exists()
    sizes = {f.path: f.size for f in result.files}
    assert set(sizes) == SENT and sizes["model.safetensors"] == (ckpt / "model.safetensors").stat().st_size
    assert result.card and BEGIN in result.card and result.dry_run and result.commit is None
    assert sizes["README.md"] == len(result.card.encode())


def test_repo_id_required(hub, ckpt):
    with pytest.raises(UsageError) as info:
        push(ckpt, endpoint=hub.url)
    assert info.value.exit_code == EXIT_USAGE and "--repo-id" in info.value.hint
    with pytest.raises(UsageError):
        push(ckpt, "no-namespace", endpoint=hub.url)
    (ckpt / "training_metadata.json").write_text(
        json.dumps({**json.loads((ckpt / "training_metadata.json").read_text()), "hub_repo_id": "org/from-meta"}))
    assert push(ckpt, dry_run=True, endpoint=hub.url).repo_id == "org/from-meta"
    assert not sent(hub, "org/from-meta") and not sent(hub, "no-namespace")


# --------------------------------------------------------------------------- units


def test_select_files_rules(tmp_path):
    root = tmp_path / "c"
    (root / "sub").mkdir(parents=True)
    for name in ("model.safetensors", "config.json", "pytorch_model.bin", "training_state.pt", "README.md",
                 "eagle3conv-verify.json", PUSH_RECORD, ".hidden.json", "merges.txt", "notes.md", "sub/x.json"):
        (root / name).write_text("x")
    chosen, skipped = select_files(root)
    assert chosen == ["README.md", "config.json", "eagle3conv-verify.json", "merges.txt", "model.safetensors"]
    why = dict(skipped)
    assert "pickle" in why["pytorch_model.bin"] and "pickle" in why["training_state.pt"]
    assert why[PUSH_RECORD] == "the local push record" and why[".hidden.json"] == "hidden file"
    chosen, skipped = select_files(root, include=["sub/*.json", "*.bin", "notes.md"], exclude=["merges.txt"])
    assert "sub/x.json" in chosen and "notes.md" in chosen and "pytorch_model.bin" not in chosen
    assert "merges.txt" not in chosen


@pytest.mark.parametrize("report", [  # files eagle3conv verify did not write: no figures guessed from them
    {"acceptance_per_position": [0.5, 0.25]},
    {"results": {"acceptance": [50, 25], "accept_length": 1.7}},
    {"summary": {"per_position_acceptance": {"1": 0.9, "2": 0.8}}},
    {"something": "else"},
])
def test_verify_report_reader_refuses_foreign_files(tmp_path, report):
    (tmp_path / VERIFY_REPORT).write_text(json.dumps(report))
    v = read_verify_report(tmp_path)
    assert v.problem and "not an eagle3conv verify report" in v.problem and v.figures is None
    (tmp_path / VERIFY_REPORT).write_text("{broken")
    assert read_verify_report(tmp_path).problem
    (tmp_path / VERIFY_REPORT).write_text(report_json([0.5, 0.25], 1.6))
    v = read_verify_report(tmp_path)
    assert v.problem is None and v.figures.acceptance == (0.5, 0.25) and v.figures.accept_length == 1.6
    (tmp_path / VERIFY_REPORT).unlink()
    assert read_verify_report(tmp_path) is None


def test_progress_is_stage_done_total(hub, ckpt, repo):
    """push reports through the one progress signature: each step is announced as
    ``(message, 0, None)``, a step with nothing to count."""
    seen = []
    do_push(hub, ckpt, repo, progress=lambda *a: seen.append(a))
    assert seen and all(len(a) == 3 and isinstance(a[0], str) and a[1:] == (0, None) for a in seen)
    steps = [a[0] for a in seen]
    assert "checking the checkpoint" in steps and "committing" in steps
    assert steps[-1].startswith("committed ")


# --------------------------------------------------------------------------- the command line


def test_cli_push_dry_run_then_push_then_unchanged(hub, ckpt, repo):
    from click.testing import CliRunner

    from eagle3conv.cli import main

    def cli(*args, ok=0):
        res = CliRunner().invoke(main, [str(a) for a in args])
        assert res.exit_code == ok, f"{res.exit_code}\n{res.stdout}\n{res.stderr}\n{res.exception!r}"
        return res

    res = cli("push", ckpt, "--repo-id", repo, "--dry-run")
    assert "dry run: nothing sent" in res.stdout and "<!-- eagle3conv:begin -->" in res.stdout
    assert "check aux-layers: ok" in res.stdout
    assert not sent(hub, repo)  # a dry run sends nothing
    pushed = cli("push", ckpt, "--repo-id", repo, "--json")
    assert "checking the checkpoint\n" in pushed.stderr and "\ncommitting\n" in pushed.stderr  # steps as lines
    d = json.loads(pushed.stdout)
    assert d["commit"] and not d["unchanged"] and {"model.safetensors", "config.json", "README.md"} <= {
        f["path"] for f in d["files"]}
    again = cli("push", ckpt)  # the repo id comes from the push record
    assert "no commit made" in again.stdout


def test_cli_push_refuses_wrong_wiring(hub, ckpt, repo):
    from click.testing import CliRunner

    from eagle3conv.cli import main

    cfg_path = ckpt / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [-1, 1, 14]
    cfg_path.write_text(json.dumps(cfg))
    res = CliRunner().invoke(main, ["push", str(ckpt), "--repo-id", repo])
    assert res.exit_code == 3, res.stderr
    assert "embedding output" in res.stderr
    assert not sent(hub, repo)  # refused before anything was sent


def test_base_model_must_be_a_repo_id(hub, ckpt, repo):
    from eagle3conv.errors import UsageError

    with pytest.raises(UsageError, match="--base-model"):
        push(ckpt, repo, base_model="not a repo!!", dry_run=True)
    assert not sent(hub, repo)


def test_exclude_everything_names_the_exclude(hub, ckpt, repo):
    with pytest.raises(InvalidCheckpointError) as info:
        push(ckpt, repo, exclude=("*",), dry_run=True)
    assert "--exclude left them out" in info.value.message and "--exclude" in info.value.hint


def test_card_names_the_hub_repo_and_only_this_wirings_figures(hub, ckpt, repo):
    import json as _json

    from eagle3conv.hub.card import gather_facts, render_block

    cfg_path = ckpt / "config.json"
    cfg = _json.loads(cfg_path.read_text())
    cfg["eagle3conv"]["aux_layers"]["target"] = "smollm2-135m"  # a profile name, as fix-keys --target writes
    cfg_path.write_text(_json.dumps(cfg))
    meta = ckpt / "training_metadata.json"
    m = _json.loads(meta.read_text())
    m["target"] = None
    meta.write_text(_json.dumps(m))
    facts = gather_facts(ckpt, repo)
    assert facts.target == "HuggingFaceTB/SmolLM2-135M-Instruct"
    # a verify report measured with other layers than the card states: no figures shown as this drafter's
    (ckpt / VERIFY_REPORT).write_text(report_json([0.9, 0.8], 2.5, layers=(5, 6, 7)))
    block = render_block(gather_facts(ckpt, repo))
    assert "scored another wiring" in block and "90.0%" not in block


# --------------------------------------------------------------------------- symlinks (issue 9 item 5)


STORED = "hf_STOREDtoken_in_home_cache_42abcdef"


@pytest.fixture
def stored_token(tmp_path) -> Path:
    p = tmp_path / "home" / ".cache" / "huggingface" / "token"
    p.parent.mkdir(parents=True)
    p.write_text(STORED)
    return p


def _nothing_arrived(hub, repo):
    assert not sent(hub, repo)
    assert not [b for _, b in hub.bodies if STORED.encode() in b or STORED[:16].encode() in b]


@pytest.mark.parametrize("name", ["tokenizer.json", "README.md", "config.json", "model.safetensors"])
def test_push_refuses_a_link_to_a_stored_token(hub, ckpt, repo, stored_token, name):
    hub.record_bodies, hub.bodies[:] = True, []
    (ckpt / name).unlink(missing_ok=True)
    (ckpt / name).symlink_to(stored_token)
    before = tree_hash(ckpt, skip=())
    try:
        for kw in ({}, {"force": True}, {"gate": None, "force": True}):  # --force does not send it either
            with pytest.raises(UnsafeLinkError) as info:
                do_push(hub, ckpt, repo, **kw)
            err = info.value
            assert err.exit_code == EXIT_ERROR
            assert str(ckpt / name) in err.message and str(stored_token) in err.message
            assert "--follow-symlinks" in err.hint
            assert STORED not in json.dumps(err.to_dict())
        _nothing_arrived(hub, repo)
        assert not hub.has_repo(repo)
        assert tree_hash(ckpt, skip=()) == before
        # the CLI: one clear line, no traceback, no byte of the token
        from click.testing import CliRunner

        from eagle3conv.cli import main

        res = CliRunner().invoke(main, ["push", str(ckpt), "--repo-id", repo, "--force"])
        assert res.exit_code == EXIT_ERROR and "Traceback" not in res.output
        assert f"{ckpt / name}: a symlink to {stored_token}" in res.stderr
        assert STORED not in res.output
        _nothing_arrived(hub, repo)
    finally:
        hub.record_bodies = False


def test_push_follow_symlinks_sends_the_target_and_says_so(hub, ckpt, repo, tmp_path):
    from click.testing import CliRunner

    from eagle3conv.cli import main

    shared = tmp_path / "shared" / "tokenizer.json"
    shared.parent.mkdir()
    shared.write_text('{"model": {"type": "BPE"}}')
    (ckpt / "tokenizer.json").symlink_to(shared)
    with pytest.raises(UnsafeLinkError):
        do_push(hub, ckpt, repo)
    res = CliRunner().invoke(main, ["push", str(ckpt), "--repo-id", repo, "--follow-symlinks"])
    assert res.exit_code == 0, res.output
    assert f"followed symlink {ckpt / 'tokenizer.json'} -> {shared} (--follow-symlinks)" in res.stdout
    assert hub.read(repo, "tokenizer.json") == shared.read_bytes()
    assert (ckpt / "tokenizer.json").is_symlink()  # the local folder is left as it was
    r = do_push(hub, ckpt, repo, follow_symlinks=True, dry_run=True)
    assert r.to_dict()["followed_symlinks"] == [{"path": str(ckpt / "tokenizer.json"), "target": str(shared)}]


def test_push_dangling_link_and_fifo_are_clear_errors(hub, ckpt, repo, tmp_path):
    (ckpt / "tokenizer.json").symlink_to(tmp_path / "nowhere.json")
    with pytest.raises(UnsafeLinkError, match=r"tokenizer\.json: a link to .*nowhere\.json, which does not exist"):
        do_push(hub, ckpt, repo)
    (ckpt / "tokenizer.json").unlink()
    os.mkfifo(tmp_path / "pipe")
    (ckpt / "tokenizer.json").symlink_to(tmp_path / "pipe")
    with pytest.raises(UnsafeLinkError, match="a FIFO"):
        do_push(hub, ckpt, repo, follow_symlinks=True)  # never followed to a FIFO (the upload would hang)
    assert not sent(hub, repo)


def test_push_of_links_inside_the_folder_is_fine(hub, ckpt, repo):
    (ckpt / "tok").mkdir()
    (ckpt / "tok" / "tokenizer.json").write_text("{}")
    (ckpt / "tokenizer.json").symlink_to(Path("tok") / "tokenizer.json")
    res = do_push(hub, ckpt, repo)
    assert not res.followed_symlinks and hub.read(repo, "tokenizer.json") == b"{}"


# --------------------------------------------------------------------------- timeouts (issue 9 item 7)


class SilentServer:
    """Accepts every connection on 127.0.0.1 and never answers (never reads either)."""

    def __init__(self):
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.conns: list = []
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._t = threading.Thread(target=self._accept, daemon=True)
        self._t.start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def _timed_out(hub, ckpt, repo, *, bound, **kw):
    before = tree_hash(ckpt, skip=())
    t0 = time.monotonic()
    with pytest.raises(PushError) as info:
        do_push(hub, ckpt, repo, gate=None, **kw)
    took = time.monotonic() - t0
    assert took < bound, took
    assert tree_hash(ckpt, skip=()) == before and not (ckpt / PUSH_RECORD).exists()
    return info.value


def test_push_to_a_server_that_never_answers_ends_with_a_clear_error(hub, ckpt, repo, monkeypatch):
    silent = SilentServer()
    try:
        err = _timed_out(hub, ckpt, repo, bound=10, timeout=1, endpoint=silent.url)
        assert len(silent.conns) == 3  # tried three times, each on a new connection
    finally:
        silent.close()
    assert err.exit_code == EXIT_ERROR
    assert f"the Hub at {silent.url} did not answer within 1 s during the create step" in err.message
    assert "nothing was committed" in err.message and "retrying is safe" in err.message
    assert "--timeout" in err.hint
    # the CLI, with --timeout
    from click.testing import CliRunner

    from eagle3conv.cli import main

    import huggingface_hub.constants as constants

    silent = SilentServer()
    monkeypatch.setattr(constants, "ENDPOINT", silent.url)  # what HF_ENDPOINT sets
    try:
        t0 = time.monotonic()
        res = CliRunner().invoke(main, ["push", str(ckpt), "--repo-id", repo, "--timeout", "0.5", "--force", "--json"])
        took = time.monotonic() - t0
    finally:
        silent.close()
    assert res.exit_code == EXIT_ERROR, res.output
    doc = json.loads(res.stdout)
    assert doc["error"] == "PushError" and "did not answer within 0.5 s" in doc["message"]
    assert took < 60  # the gate's forward pass plus 3 x 0.5 s


@pytest.mark.parametrize("route, stall, stage", [
    ("repo-info", "body", "revision"),     # headers, then the body stalls
    ("repo-info", "answer", "revision"),   # the request is read, no answer
    ("preupload", "answer", "upload"),     # huggingface_hub retries this one itself
    ("lfs-batch", "body", "upload"),
])
def test_push_stalled_answer_times_out_with_nothing_committed(hub, ckpt, repo, route, stall, stage):
    from huggingface_hub import HfApi

    HfApi(endpoint=hub.url, token=False).create_repo(repo)
    commits, refs = hub.commit_ids(repo), hub.refs(repo)
    hub.fault(route, stall=stall)
    err = _timed_out(hub, ckpt, repo, bound=10, timeout=1)
    hub.clear_faults()
    assert f"did not answer within 1 s during the {stage} step" in err.message, err.message
    assert "nothing was committed" in err.message and "retrying is safe" in err.message
    assert hub.commit_ids(repo) == commits and hub.refs(repo) == refs
    assert not [e for e in sent(hub, repo) if e.route == "commit"]
    ok = do_push(hub, ckpt, repo, gate=None, timeout=1)  # the same push, once the server answers
    assert hub.refs(repo)["main"] == ok.commit


def test_push_commit_without_answer_does_not_claim_nothing_landed(hub, ckpt, repo):
    hub.fault("commit", stall="answer")
    err = _timed_out(hub, ckpt, repo, bound=10, timeout=1)
    hub.clear_faults()
    assert "during the commit step" in err.message and "may or may not have landed" in err.message
    assert "history" in err.message


def test_push_timeout_must_be_positive(hub, ckpt, repo):
    with pytest.raises(UsageError, match="--timeout"):
        do_push(hub, ckpt, repo, timeout=0)


# --------------------------------------------------------------------------- push --plot (issue 13)


def wiring_plot(path: Path) -> Path:
    """A real verify --plot figure (eagle3conv's own SVG writer) from a search's report dictionary."""
    from eagle3conv.verify.plot import write_plot

    profile = [[{"output_of": o, "step1_acceptance": a} for o, a in ((0, 0.2), (1, 0.5), (2, 0.3))]
               for _ in range(3)]
    d = {"verdict": {"best_layers": "outputs of layers 1, 14, 26", "coverage": {"slot_profile": profile}},
         "results": [{"described": "outputs of layers 1, 14, 26",
                      "layers": [{"output_of": i} for i in (1, 14, 26)],
                      "norms": [{"median": m} for m in (10.0, 20.0, 30.0)]}]}
    return write_plot(d, path)


def test_push_plot_is_uploaded_and_shown_in_the_card(hub, ckpt, repo, tmp_path):
    """issue 13: push --plot sends verify's figure next to README.md and the card's wiring
    section embeds it by the uploaded name; --dry-run lists it and sends nothing."""
    from click.testing import CliRunner

    from eagle3conv.cli import main

    fig = wiring_plot(tmp_path / "wiring.svg")  # outside the checkpoint folder: sent under its file name
    before = tree_hash(ckpt)
    dry = do_push(hub, ckpt, repo, plot=fig, dry_run=True)
    assert ("wiring.svg", fig.stat().st_size, "plot") in {(f.path, f.size, f.source) for f in dry.files}
    assert "![The wiring search" in dry.card and "](wiring.svg)" in dry.card
    assert not sent(hub, repo)
    res = CliRunner().invoke(main, ["push", str(ckpt), "--repo-id", repo, "--plot", str(fig), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "wiring.svg" in res.stdout and "(wiring plot, shown in the card)" in res.stdout
    assert not sent(hub, repo)

    result = do_push(hub, ckpt, repo, plot=fig)
    assert hub.paths(repo) == SENT | {".gitattributes", "wiring.svg"}
    assert hub.read(repo, "wiring.svg") == fig.read_bytes()  # the image bytes arrived
    card = hub.read(repo, "README.md").decode()
    assert card == result.card
    wiring = card[card.index("### Target layers it reads"):card.index("### Training")]
    assert "![The wiring search: acceptance per aux slot and candidate layer](wiring.svg)" in wiring
    assert tree_hash(ckpt) == before  # nothing local changed but the push record
    assert read_record(ckpt)["files"]["wiring.svg"] == fig.stat().st_size
    # without --plot the card embeds no figure
    assert "![The wiring search" not in do_push(hub, ckpt, repo, dry_run=True).card


def test_push_plot_inside_the_folder_keeps_its_path(hub, ckpt, repo):
    (ckpt / "plots").mkdir()
    fig = wiring_plot(ckpt / "plots" / "wiring search.svg")
    result = do_push(hub, ckpt, repo, plot=fig)
    assert hub.read(repo, "plots/wiring search.svg") == fig.read_bytes()
    assert "](plots/wiring%20search.svg)" in result.card  # a markdown link that resolves to the uploaded name
    assert [f.path for f in result.files].count("plots/wiring search.svg") == 1


def test_push_plot_bad_files_are_refused_before_anything_is_sent(hub, ckpt, repo, tmp_path, stored_token):
    # a link in the folder to a file outside it (a stored token): the same refusal as any pushed file
    (ckpt / "wiring.svg").symlink_to(stored_token)
    with pytest.raises(UnsafeLinkError, match="outside the checkpoint folder"):
        do_push(hub, ckpt, repo, plot=ckpt / "wiring.svg")
    (ckpt / "wiring.svg").unlink()
    os.mkfifo(tmp_path / "pipe.svg")
    with pytest.raises(UnsafeLinkError, match="a FIFO"):
        do_push(hub, ckpt, repo, plot=tmp_path / "pipe.svg", follow_symlinks=True)
    (tmp_path / "fake.png").write_text("not an image")
    with pytest.raises(UsageError, match="not a PNG file"):
        do_push(hub, ckpt, repo, plot=tmp_path / "fake.png")
    with pytest.raises(UsageError, match=r"must be an \.svg or \.png"):
        do_push(hub, ckpt, repo, plot=ckpt / "config.json")
    with pytest.raises(UsageError, match="no such file") as info:
        do_push(hub, ckpt, repo, plot=tmp_path / "missing.svg")
    assert "verify" in info.value.hint and "--plot" in info.value.hint
    # a figure outside the folder whose name is a file this push already sends
    wiring_plot(ckpt / "wiring.svg")
    with pytest.raises(UsageError, match="already sends a file named wiring.svg"):
        do_push(hub, ckpt, repo, plot=wiring_plot(tmp_path / "wiring.svg"), include=["*.svg"])
    assert not sent(hub, repo)
    from click.testing import CliRunner

    from eagle3conv.cli import main

    res = CliRunner().invoke(main, ["push", str(ckpt), "--repo-id", repo, "--plot", str(tmp_path / "fake.png")])
    assert res.exit_code == EXIT_USAGE and "Traceback" not in res.output and "not a PNG file" in res.stderr
    assert not sent(hub, repo)


def test_the_hub_client_names_eagle3conv(hub, ckpt, repo):
    """One HfApi, built in one place with the library's name and version (hub/push.py hub_api): every
    request says it comes from eagle3conv, as huggingface_hub's own CLI names itself."""
    from eagle3conv import __version__

    do_push(hub, ckpt, repo, token=False)
    by_route = {}
    for e in hub.log:
        by_route.setdefault(e.route, set()).add(e.user_agent)
    # the calls eagle3conv makes itself (huggingface_hub's internal helpers and the uploads to storage
    # URLs send their own agents)
    for route in ("create", "commit"):
        assert any(f"eagle3conv/{__version__}" in a for a in by_route.get(route, ())), (route, by_route)


def test_a_bug_in_the_card_raises_instead_of_dropping_a_section(ckpt, repo, monkeypatch):
    """The card's catches name the errors that mean "no such section" (an unknown target, a config the
    gate reported); any other error is a bug and surfaces, instead of a published card silently short
    of its layer count, its target's Hub id or its serving table."""
    from eagle3conv.hub.card import gather_facts, render_block
    from eagle3conv.spec import targets
    from eagle3conv.spec.drafter import DrafterSpec

    assert gather_facts(ckpt, repo, base_model="org/not-a-profile").target == "org/not-a-profile"  # no section
    assert "### Shape and serving" in render_block(gather_facts(ckpt, repo, base_model="smollm2-135m"))

    def bug(*args, **kwargs):
        raise RuntimeError("a bug in the profile lookup")

    with monkeypatch.context() as m:
        m.setattr(targets, "get_target", bug)
        with pytest.raises(RuntimeError, match="a bug"):
            gather_facts(ckpt, repo, base_model="smollm2-135m")
    facts = gather_facts(ckpt, repo, base_model="smollm2-135m")
    with monkeypatch.context() as m:
        m.setattr(DrafterSpec, "from_config", classmethod(lambda cls, *a, **k: bug()))
        with pytest.raises(RuntimeError, match="a bug"):
            render_block(facts)


# --------------------------------------------------------------------------- the verdict (issue 27, part 4)


def test_push_verdict_in_json_and_its_words_in_the_text(hub, ckpt, repo, tmp_path, monkeypatch):
    """Each outcome of a push as a code in ``--json``'s ``verdict`` (dry run, committed, unchanged, pull
    request; the gate passed, forced, or no checks), and the text's last line made from it; a push the gate
    refuses is an error whose document carries the verdict, naming the failed checks."""
    from eagle3conv.hub.card import Check
    from eagle3conv.hub.push import PushResult
    from eagle3conv.render import push_text

    def verdict_and_text(result):
        d = result.to_dict()
        with monkeypatch.context() as m:  # the text reads the typed result, never its document
            m.setattr(PushResult, "to_dict", lambda self: (_ for _ in ()).throw(AssertionError("read to_dict")))
            return d["verdict"], push_text(result).splitlines()

    v, lines = verdict_and_text(do_push(hub, ckpt, repo, dry_run=True))
    assert (v["outcome"], v["gate"], v["failed"], v["repo_id"]) == ("dry-run", "passed", [], repo)
    assert lines[0] == f"push: dry run for {repo}, nothing sent; every check passed"
    assert lines[-1] == "dry run: nothing sent" and not any(x.startswith("forced:") for x in lines)
    committed = do_push(hub, ckpt, repo)
    v, lines = verdict_and_text(committed)
    assert (v["outcome"], v["commit"], v["revision"]) == ("committed", committed.commit, None)
    assert lines[0] == f"push: committed to {repo}@main; every check passed"
    assert lines[-1] == f"committed {committed.commit} to {repo}@main ({committed.commit_url})"
    v, lines = verdict_and_text(do_push(hub, ckpt, repo))
    assert v["outcome"] == "unchanged" and lines[-1] == f"unchanged: {repo} already holds these files; no commit made"
    assert lines[0] == f"push: {repo} already holds these files, no commit made; every check passed"
    (ckpt / "extra.json").write_text("{}")
    pr = do_push(hub, ckpt, repo, create_pr=True, include=("extra.json",))
    v, lines = verdict_and_text(pr)
    assert (v["outcome"], v["pr_url"], v["pr_revision"]) == ("pull-request", pr.pr_url, pr.pr_revision) and pr.pr_url
    assert lines[0] == f"push: opened a pull request on {repo}; every check passed"
    assert lines[-1] == f"opened {pr.pr_url} ({pr.pr_revision}, commit {pr.commit})"
    v, lines = verdict_and_text(do_push(hub, ckpt, repo, gate=None, dry_run=True))
    assert v["gate"] == "no-checks" and not any(x.startswith("check ") for x in lines)
    assert lines[0] == f"push: dry run for {repo}, nothing sent; no checks ran"

    def failing(path):
        return [Check("config-check", False, "aux ids disagree"), Check("smoke-test", True, "ran")]

    with pytest.raises(InvalidCheckpointError) as info:
        do_push(hub, ckpt, repo, gate=failing)
    doc = info.value.to_dict()
    assert doc["verdict"] == {"outcome": "refused", "gate": "failed", "failed": ["config-check"], "repo_id": repo,
                              "revision": None, "commit": None, "commit_url": None, "pr_url": None,
                              "pr_revision": None}
    assert doc["error"] == "InvalidCheckpointError" and doc["exit_code"] == EXIT_INVALID
    assert "verdict" not in UsageError("x").to_dict()  # other errors' documents are as they were
    v, lines = verdict_and_text(do_push(hub, ckpt, repo, gate=failing, force=True, dry_run=True))
    assert (v["outcome"], v["gate"], v["failed"]) == ("dry-run", "forced", ["config-check"])
    assert lines[:4] == [f"push: dry run for {repo}, nothing sent; forced past the failed check config-check",
                         "check config-check: FAILED — aux ids disagree", "check smoke-test: ok — ran",
                         "forced: pushed despite failed checks (the card says so)"]
