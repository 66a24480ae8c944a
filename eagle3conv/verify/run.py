"""The ``verify`` and ``smoke`` operations: input checks, then load, score, decide, report.

:func:`verify` checks its arguments and the inputs (drafter, states, wiring,
embeddings) before any scoring, then evaluates the config's (or ``--layers'``)
wiring, and with ``search`` the candidates around it, decides
(:func:`eagle3conv.verify.search.decide`) and saves the report
(:class:`eagle3conv.verify.report.VerifyReport`).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3conv.errors import CheckpointReadError, FolderBusyError, UsageError, VerifyFailedError, WiringError
from eagle3conv.verify.evaluate import Candidate, Score, evaluate, evaluate_many
from eagle3conv.io.progress import Progress
from eagle3conv.io.devices import resolve_device, resolve_dtype
from eagle3conv.verify.inputs import (
    build_drafter,
    data_labels,
    load_drafter_weights,
    load_target_embeddings,
    load_target_head,
    load_target_norm,
    target_next_from_head,
    target_num_layers,
)
from eagle3conv.verify.options import VerifyOptions
from eagle3conv.verify.report import REPORT_FILE, EngineScore, VerifyResult
from eagle3conv.verify.search import (
    Coverage,
    MIN_SEARCH_SEQUENCES,
    REFINE_CONFIRM,
    REFINE_ROUNDS,
    candidates,
    config_candidate,
    decide,
    global_search,
    names_layers,
    norm_comparison,
    refine,
    screen_bound,
    screen_dtype,
    set_members,
)
from eagle3conv.spec.canonical import D2T, EMBED, LM_HEAD, drafter_uses_own_embedding
from eagle3conv.spec.engines import Run
from eagle3conv.spec.layers import LayerRef, LayerSet, describe, to_refs
from eagle3conv.states.format import NO_NEXT_TOKENS

if TYPE_CHECKING:
    from eagle3conv.model.drafter import SmokeTestResult
    from eagle3conv.spec.targets import TargetProfile
    from eagle3conv.wiring.apply import Wiring


def verify(path: str | os.PathLike, states_path: str | os.PathLike, options: VerifyOptions | None = None, *,
           progress: Progress | None = None, **fields) -> VerifyResult:
    """Run the drafter on captured states and measure acceptance (see the module docstring).

    ``options`` (or its fields as keywords: ``verify(d, s, steps=2, search=True)``) say what
    to do. States without the target's next tokens (SpecForge) are scored against the data's
    next tokens, and the report says so. Raises :class:`VerifyFailedError` (exit 4) when
    step-1 acceptance is below ``min_accept``, after saving the report. Its steps are the
    calls below, in order (:class:`_Verification`, one method each).
    """
    t_start = time.perf_counter()
    opts = replace(options or VerifyOptions(), **fields)
    opts.check()
    run = _Verification(path, states_path, opts, progress, t_start)  # inputs read and checked
    run.choose_wiring()     # the wiring scored first: --layers, the --engine's capture, or the config's
    run.prepare_serving()   # the target's embeddings/head, each release's forward, the embedding audit
    run.build()             # the drafter as the reference engine runs it (and the screen's copy)
    run.score()             # the wiring, or the global search's survivors, on every position
    run.refine()            # a global search: the single-slot neighbours of the set, until nothing new
    result = run.decide()   # every engine release scored, the verdict, the report
    if opts.reference_drafter is not None:
        result.quantization = _quantization_cost(result, run, opts, progress)
    run.save(result)
    if not result.passed:
        raise VerifyFailedError(
            f"step-1 acceptance {result.main.acceptance[0]:.3f} is below --min-accept {opts.min_accept}",
            hint=result.verdict.advice or (f"see the report: {result.saved}" if result.saved else None),
            details=[f"{s.candidate.name}: {describe(s.candidate.layers)}: accept length {s.accept_length:.3f}"
                     for s in result.scores[:5]])
    return result


def _quantization_cost(result: VerifyResult, run, opts: VerifyOptions, progress) -> dict:
    """The reference (bf16) drafter scored on the same states and wiring, and the accept-length
    difference with its paired 95% interval (sequences resampled jointly)."""
    from eagle3conv.verify.stats import paired_difference

    ref = verify(opts.reference_drafter, run.states_path,
                 replace(opts, reference_drafter=None, raw_modules=(), search=False, save=False, min_accept=None,
                         layers=[r.output_of for r in result.main.candidate.layers]), progress=progress)
    d, lo, hi = paired_difference(result.main, ref.main)
    return {"quantization_config": run.quantization, "reference": Path(str(opts.reference_drafter)).name,
            "raw_modules": list(opts.raw_modules),
            "accept_length": round(result.main.accept_length_all, 4), "reference_accept_length":
            round(ref.main.accept_length_all, 4), "difference": round(d, 4),
            "ci95": [round(lo, 4), round(hi, 4)] if math.isfinite(lo + hi) else None,
            "definition": "accept length over every chain start, this drafter minus the reference drafter, "
                          "same states and wiring, resampling sequences jointly"}


def _captured_target(states) -> TargetProfile:
    """A stand-in profile for the target the states were captured from, when no --target or record names
    one: its name (as the states give it) and the sizes the states record."""
    from eagle3conv.spec.targets import TargetProfile

    return TargetProfile(name=states.target or "the captured target", hidden_size=states.hidden_size,
                         num_hidden_layers=states.num_layers, vocab_size=states.vocab_size or 0)


class _Verification:
    """The state of one :func:`verify`, one method per step (called in the order :func:`verify`
    lists them)."""

    def __init__(self, path, states_path, opts: VerifyOptions, progress: Progress | None, t_start: float) -> None:
        from eagle3conv.model.drafter import DrafterConfig
        from eagle3conv.states.readers import open_states
        from eagle3conv.wiring.apply import WiringOptions, gather

        self.path, self.states_path, self.opts, self.progress = path, states_path, opts, progress
        self.t_start = t_start
        self.dev = resolve_device(opts.device)
        self.dt = resolve_dtype(opts.dtype, self.dev)
        self.root = Path(path)
        self.wopts = opts.wiring_options or WiringOptions()
        self.config, self.tensors = load_drafter_weights(self.root)
        self.t_loaded = time.perf_counter()
        self.notes: list[str] = []
        from eagle3conv.verify.inputs import dequantize_drafter

        self.quantization = (self.config or {}).get("quantization_config")
        self.stored = (self.config, dict(self.tensors)) if self.quantization is not None else None
        self.config, self.tensors, qnotes = dequantize_drafter(self.config, self.tensors,
                                                               raw_modules=tuple(opts.raw_modules))
        self.notes += qnotes
        self.states = open_states(states_path, stated=opts.states_layers)
        if self.states.input_ids is None:
            raise CheckpointReadError(
                f"{states_path}: these states hold no token ids; verify compares drafts with the target's tokens",
                hint="capture with eagle3conv capture, or add input_ids.pt and target_next.pt to the dumps")
        self.labels, self.reference, self.data_note = None, "target", None
        if self.states.target_next is None:
            self.labels = data_labels(self.states.input_ids, self.states.attention_mask)
            self.reference = "data"
            self.data_note = ("these states hold no target next tokens: drafts are scored against the data's next "
                              "tokens (a lower bound on acceptance unless the data is the target's own output)")
            self.notes.append(self.data_note)
        ev = gather(self.root, None, self.config, self.wopts)
        if ev.target is None and self.states.num_layers is not None:  # no profile: the states' own target
            ev = replace(ev, target=_captured_target(self.states))
        self.ev = ev
        self.n = ev.target.num_hidden_layers if ev.target else self.states.num_layers
        if self.n is None and opts.embeddings is not None:  # the target's own config.json beside its weights
            self.n = target_num_layers(opts.embeddings)
        _check_layers_exist(self.states, self.n, states_path)
        self.wiring_checked = self.states.layers is not None
        self.family = ev.target.family if ev.target else None
        self.dc = dc = DrafterConfig.from_config(self.config)
        self.check = self.checked()
        if self.states.hidden_size != dc.target_hidden_size:
            raise WiringError(f"the states are {self.states.hidden_size} wide but the drafter reads target states "
                              f"of width {dc.target_hidden_size}: they come from another target")
        self.search = opts.search
        self.scores: list[Score] = []
        self.first_result: float | None = None
        self.found = None  # what the global search found (search.ScreenSearch), None: no global search
        self.refinement: tuple[dict, list] | None = None  # local refinement's record and what it left unconfirmed
        self.screened = None  # the global screen's ScreenResult, until the verdict is decided
        self.got_log: dict = {}
        self.screened_logs: dict = {}  # layers -> the screens' own log score, for wirings they read everywhere

    def checked(self):
        """The wiring check of this drafter as it is (the embedding audit, once the forwards are built,
        completes it: :func:`~eagle3conv.wiring.apply.completed`)."""
        from eagle3conv.wiring.apply import check_fixed

        return check_fixed(self.config, self.tensors, self.wopts, ev=self.ev, path=self.path,
                           target_hidden=self.dc.target_hidden_size, audit=False)

    def choose_wiring(self) -> None:
        """The wiring scored first: ``--layers``, else what the first ``--engine`` captures from
        this config, else the config's (its ids as the engines read them, or their default). A
        config naming no layers turns the global search on; states that do not name their slots
        are read as this wiring (and turn it off). Once the search is settled here, so is the
        dtype: a search with ``--dtype auto`` on a CPU with native bf16 matmul runs in bf16."""
        opts, config = self.opts, self.config
        if opts.layers is None and not names_layers(config) and not self.search:
            self.search = True
            self.notes.append("config.json names no aux layers: verify ran the global wiring search by itself "
                              "(as with --search-wiring)")
        asked = self.check.report.rows[0] if self.wopts.asked() and self.check.report.rows else None
        if opts.layers is not None:
            base = Candidate("given", to_refs(list(opts.layers), "output", self.n),
                             f"--layers {','.join(map(str, opts.layers))}")
        elif asked is not None and asked.layers:
            # --engine E: verify's own score feeds what E captures from this config (E's row, the engine rules)
            base = Candidate("config", asked.layers,
                             f"what {asked.release} captures from this config (the first --engine)")
        else:
            base = config_candidate(config, self.n, self.family, self.check.report.rows)
        if len(base.layers) != self.dc.num_aux:
            raise WiringError(f"the wiring names {len(base.layers)} layers ({describe(base.layers)}) but fc reads "
                              f"{self.dc.num_aux}")
        if self.states.layers is None:  # SpecForge records, dumps without a manifest: the slots are unnamed
            from eagle3conv.states.readers import open_states

            self.states = open_states(self.states_path, layers=base.layers, num_layers=self.n)
            self.wiring_checked = False
            self.notes.append(f"the states do not say which layers their aux slots are: taken to be "
                              f"{describe(base.layers)} (the wiring scored); pass --states-layers to name them")
            if self.search:
                self.notes.append("--search-wiring needs states that name their layers: only the stored slots "
                                  "were scored")
                self.search = False
        self.base = base
        auto = str(self.opts.dtype).strip().lower() == "auto"
        if self.search and auto and (sdt := screen_dtype(self.dev, self.dt)) is not self.dt:
            # a search on a CPU with native bf16 matmul runs in bf16 throughout, as on a GPU (docs/facts.md §12)
            self.dt = sdt
            self.notes.append("the search ran in bf16 (--dtype auto on a CPU with native bf16 matmul, as on a GPU): "
                              "pass --dtype fp32 to confirm its wirings in fp32")

    def prepare_serving(self) -> None:
        """The target's embedding table (and head, where a release serves it in place of the
        drafter's), each engine release's forward (:class:`_Serving`), the audit of a stale
        ``embed_tokens``, and which forward verify's own score uses."""
        dc, config, tensors, dt = self.dc, self.config, self.tensors, self.dt
        table = raw_table = None
        if self.opts.embeddings is not None:
            raw_table = load_target_embeddings(self.opts.embeddings, dc.vocab_size, dc.hidden_size)
            table = raw_table.to(dt)
        elif getattr(self.states, "embedding_table_path", None) is not None:  # NeMo's cache keeps the table
            raw_table = load_target_embeddings(self.states.embedding_table_path, dc.vocab_size, dc.hidden_size,
                                               names=("weight",))
            table = raw_table.to(dt)
        elif not self.states.has_embeddings and dc.target_hidden_size == dc.hidden_size:
            raise UsageError(f"{self.states_path}: these states hold no embedding output, and the drafter embeds "
                             "with the target's table", hint="pass the target's weights: --embeddings TARGET_DIR")
        head = None
        if self.opts.embeddings is not None and config.get("draft_vocab_size") is None and LM_HEAD in tensors:
            # an engine that serves the target's head in place of the drafter's (no draft_vocab_size) is run with it
            from eagle3conv.spec.engines import serving as engine_serving

            if any(engine_serving(r, config, tensors.keys(), target_head_at_hand=True).target_head
                   for r in self.wopts.releases()):
                head = load_target_head(self.opts.embeddings, dc.vocab_size, dc.hidden_size, table=raw_table)
        target_read = (raw_table, head)  # as stored: own_tokens takes the head from them, not from disk again
        head = None if head is None else head.to(dt)
        own = drafter_uses_own_embedding(dc.hidden_size, dc.target_hidden_size)
        self.serving = _Serving(config, tensors, self.states, table, self.wopts, head, raw_table=raw_table,
                                own_only=own, stored=self.stored)
        self.table = table
        if EMBED in tensors and not own:
            from eagle3conv.wiring.apply import completed
            from eagle3conv.wiring.audit import audit_embedding

            audit = audit_embedding(self.serving.compare(), where=f"{self.path}/config.json")
            self.check = completed(self.check, audit)
        self.own_tokens(*target_read)
        self.main_fw = self.serving.main()
        ran = self.serving.describe(self.main_fw)
        if self.wopts.asked():
            self.notes.append(f"the drafter ran as {self.main_fw.engine} runs it (the first --engine)"
                              + "".join(f"; {d}" for d in ran))
        elif ran:
            self.notes.append(f"the drafter ran as {self.main_fw.engine} runs it (verify's reference forward)"
                              + "".join(f"; {d}" for d in ran))

    def own_tokens(self, table=None, head=None) -> None:
        """States without the target's next tokens that hold its last hidden state (SpecForge's
        post-norm ``hidden_state``; a stored output of the last layer, pre-norm): given the
        target's weights, its own greedy next tokens from its final norm and lm_head replace the
        data's as the reference. ``table``, ``head``: the target's, already read from --embeddings
        (None: not read)."""
        st, where = self.states, self.opts.embeddings
        if st.target_next is not None or where is None:
            return
        fs = st.final_state
        last = LayerRef(self.n - 1) if self.n else None
        if fs is None and st.layers is not None and last in st.layers:
            fs = ("pre-norm", last)
        if fs is None:
            return
        dc = self.dc
        want = (dc.vocab_size, dc.target_hidden_size)
        table, head = (t if t is not None and tuple(t.shape) == want else None for t in (table, head))
        if head is None:  # not read yet (or another width); a tied head is the table already read
            head = load_target_head(where, *want, table=table)
        norm = load_target_norm(where, dc.target_hidden_size) if fs[0] == "pre-norm" else None
        if head is None or (fs[0] == "pre-norm" and norm is None):
            self.notes.append(f"--embeddings {where}: no lm_head{'' if head is None else ' or final norm'} found: "
                              "the target's own next tokens could not be computed; scored against the data's")
            return
        st.final_state = fs
        self.labels = target_next_from_head(st, head, norm, device=self.dev)
        self.reference = "target"
        self.notes[:] = [n for n in self.notes if n is not self.data_note]  # that note no longer holds
        st.notes = tuple(n for n in st.notes if NO_NEXT_TOKENS not in n)  # the reader's "cannot" no longer holds
        self.notes.append("scored against the target's own next tokens, computed from "
                          + ("its lm_head over the stored post-norm last hidden state" if fs[0] == "post-norm" else
                             f"its final norm and lm_head over the stored {fs[1]} (before the norm)")
                          + f" with the weights in --embeddings {where}")

    def build(self) -> None:
        """The drafter as the reference forward runs it; for a search on a CPU with native bf16
        matmul, a bf16 copy the screen ranks with. The weights are let go where no engine row
        needs them again."""
        kw = {"embeddings": self.table, "head": self.serving.head, "run": self.main_fw.settled(raw_modules=())}
        self.drafter, self.target_embeds = build_drafter(self.config, self.tensors, self.dev, self.dt, **kw)
        self.screener = self.drafter
        sdt = screen_dtype(self.dev, self.dt)
        if self.search and sdt is not self.dt:  # the screen only ranks: bf16 where the CPU has it
            self.screener, _ = build_drafter(self.config, self.tensors, self.dev, sdt, **kw)
        if not self.serving.needs_tensors(self.check.report.rows, self.main_fw):
            self.tensors = self.table = None  # no engine runs the drafter otherwise: the weights are not needed again
            self.serving.release()
        self.t_built = time.perf_counter()

    def score(self) -> None:
        """The wirings scored on every position: the chosen one, or with a search the evidence
        (config, record, engine defaults) and the global screen's survivors."""
        states, base = self.states, self.base
        cands = [base]
        if self.search:
            self.avail = list(states.layers)
            truth = self.ev.truth.layers if self.ev.truth else None
            cands = candidates(base, truth, self.avail, self.n, wide=False, family=self.family)
            if not cands or cands[0] is not base:
                states.check_refs(base.layers)  # explains what is missing
            cands, self.found, self.screened = global_search(
                self.screener, states, cands, self.avail, self.dc.num_aux, self.n, target_embeds=self.target_embeds,
                labels=self.labels, max_sequences=self.opts.max_sequences, progress=self.progress,
                bound=screen_bound(self.dev, self.opts.search_budget))
        else:
            states.check_refs(base.layers)
        if cands:  # the first (the config's wiring where the states hold it) alone: the plain verify's numbers
            self.confirm(0, cands[0], len(cands))
        self.confirm_many(cands[1:], len(cands))
        if self.screened is not None:
            self.harvest(self.screened)

    def confirm(self, i: int, cand: Candidate, of: int) -> None:
        """One wiring scored on every position (acceptance per draft step, norms); the first
        result's time is recorded, and states with nothing to score refused (evaluate refuses states
        that are not finite)."""
        cb = None
        if self.progress:
            def cb(_stage, done, total):
                self.progress(f"{cand.name} ({i + 1}/{of})", done, total)
        o = self.opts
        self.scores.append(evaluate(self.drafter, self.states, cand, steps=o.steps, batch_size=o.batch_size,
                                    target_embeds=self.target_embeds, max_sequences=o.max_sequences, progress=cb,
                                    labels=self.labels))
        if self.first_result is None:
            self.first_result = time.perf_counter()
            if self.scores[0].tokens == 0:
                raise CheckpointReadError(
                    f"{self.states_path}: nothing to score: no position has a reference token inside the loss "
                    f"mask ({self.states.num_sequences} sequences, {self.states.num_tokens} real tokens)",
                    hint="capture longer sequences or with --generate N (the generated part is scored)")

    def confirm_many(self, cands: list[Candidate], of: int) -> None:
        """Wirings scored on every position together (:func:`evaluate_many`: what no wiring changes
        done once per batch), after the first result."""
        if not cands:
            return
        cb = None
        if self.progress:
            done = len(self.scores)

            def cb(_stage, d, total):
                self.progress(f"{len(cands)} wirings ({done + 1}-{done + len(cands)}/{of})", d, total)
        o = self.opts
        self.scores.extend(evaluate_many(self.drafter, self.states, cands, steps=o.steps, batch_size=o.batch_size,
                                         target_embeds=self.target_embeds, max_sequences=o.max_sequences,
                                         progress=cb, labels=self.labels))

    def harvest(self, res) -> None:
        """Keep a screen's own log score of every wiring it read on every position."""
        for j, ls in enumerate(res.sets):
            if ls not in self.screened_logs and (got := res.log_score(j)) is not None:
                self.screened_logs[ls] = got

    def log_score(self, idx):
        """The step-1 log score of scores ``idx``, only where acceptance leaves a global search
        tied: the screen's own where it read the wiring everywhere, else computed the same way
        (in its dtype)."""
        from eagle3conv.verify.logscore import log_scores

        want = [i for i in idx if i not in self.got_log]
        for i in [i for i in want if self.scores[i].candidate.layers in self.screened_logs]:
            self.got_log[i] = self.screened_logs[self.scores[i].candidate.layers]
        want = [i for i in want if i not in self.got_log]
        if want:
            o = self.opts
            self.got_log.update(zip(want, log_scores(
                self.screener, self.states, [self.scores[i].candidate.layers for i in want], steps=1,
                batch_size=o.batch_size, target_embeds=self.target_embeds, labels=self.labels,
                max_sequences=o.max_sequences)))
        return [self.got_log[i] for i in idx]

    def refine(self) -> None:
        """A global search on enough sequences: local refinement (:func:`_refine`); what the
        screen and refinement kept but did not confirm is counted (and listed up to a cap)."""
        found = self.found
        if found is not None and found.is_global and self.scores[0].effective_sequences >= MIN_SEARCH_SEQUENCES:
            rec = _refine(self.scores, self.confirm_many, self.screener, self.states, self.screened, self.avail,
                          self.log_score, self.harvest, target_embeds=self.target_embeds, labels=self.labels,
                          max_sequences=self.opts.max_sequences, progress=self.progress)
            self.refinement = (rec, rec.pop("pending"))
        self.screened = None

    def decide(self) -> VerifyResult:
        """Each engine release scored as it serves this config, the norms against training's,
        the verdict (:func:`~eagle3conv.verify.search.decide`), and the result."""
        o, scores, states = self.opts, self.scores, self.states
        engine_scores = _score_engines(self.check.report.rows, scores, self.drafter, states, steps=o.steps,
                                       batch_size=o.batch_size, target_embeds=self.target_embeds,
                                       max_sequences=o.max_sequences, labels=self.labels, serving=self.serving,
                                       main_fw=self.main_fw, device=self.dev, dtype=self.dt)
        self.serving.release()
        training = next((r for r in self.ev.records if r.norms), None)
        t_norms, t_layers = (training.norms, training.layers) if training is not None else (None, None)
        if o.training_states is not None:  # the trainer's own data: its norms, slot by slot
            t_norms, t_layers = training_norms(o.training_states, self.dc.num_aux, self.n,
                                               scored=scores[0].candidate.layers), None
        comparisons = []
        for s in scores:
            same = t_norms is not None and (t_layers == s.candidate.layers or t_layers is None
                                            or len(t_layers) == len(s.candidate.layers))
            comparisons.append(norm_comparison(s, t_norms) if same else None)
        ev = self.ev
        coverage = None if self.found is None else Coverage.of(self.found, *(self.refinement or ()))
        verdict = decide(scores, comparisons, self.search, self.path, ev.target.name if ev.target else None,
                         coverage=coverage,
                         config_names_layers=o.layers is not None or names_layers(self.config),
                         log_score=self.log_score, capture=self._capture_record(),
                         # the screen's dtype: bf16 on a CPU with native bf16 matmul
                         log_dtype=str(self.screener.dtype).removeprefix("torch."))
        self.screener = None
        t_end = time.perf_counter()
        return VerifyResult(
            checkpoint=self.root, states=dict(states.summary(), verify_notes=self.notes, **self._wiring_basis()),
            device=self.dev,
            dtype=str(self.dt).removeprefix("torch."), steps=o.steps, wiring=self.check, scores=scores,
            comparisons=comparisons, verdict=verdict, training_norms=t_norms,
            seconds={"load_drafter": round(self.t_loaded - self.t_start, 3),
                     "build": round(self.t_built - self.t_loaded, 3),
                     "first_result": round((self.first_result or t_end) - self.t_start, 3),
                     "total": round(t_end - self.t_start, 3)},
            min_accept=o.min_accept, reference=self.reference, engine_scores=engine_scores,
            categories=states.categories, embedding_comparison=self.serving.embedding_comparison)

    def _wiring_basis(self) -> dict:
        """Whether these states can check the wiring, and what the slots' layers rest on."""
        if self.wiring_checked:
            return {"wiring_checked": True, "layers_from": self.states.layers_from}
        return {"wiring_checked": False, "layers_from": None,
                "wiring_unchecked_why": "the states do not record which layers their slots hold, so they were "
                                        "labelled with the wiring scored (the config's own ids): a wrong config "
                                        "scores exactly like the right one; name the slots with --states-layers "
                                        "(in the numbering of the run that wrote them)"}

    def _capture_record(self) -> dict | None:
        """How the states were captured (for the verdict's advice on what to capture), and whether
        ``--max-sequences`` left some of them unread."""
        cap = dict(getattr(self.states, "capture", None) or {})
        held, limit = self.states.num_sequences, self.opts.max_sequences
        if limit is not None and limit < held:
            cap.update(max_sequences=limit, sequences_held=held)
        return cap or None

    def save(self, result: VerifyResult) -> None:
        """The acceptance profile (:mod:`eagle3conv.verify.profile`) and the report beside the
        drafter (under the folder's shared lock, no local paths in either); a read-only or busy
        folder keeps the results and says why nothing was saved."""
        if not self.opts.save:
            return
        from eagle3conv.io.files import folder_lock
        from eagle3conv.verify.profile import save_profile

        root, path = self.root, self.path
        try:  # no local paths in a pushed report
            with folder_lock(root, exclusive=False, command="verify"):
                result.profile = Path(save_profile(result, root))
                result.saved = result.report().save(root, local_paths=(str(path), str(root), str(root.resolve())))
        except OSError as err:  # a read-only checkpoint: keep the results, say so
            result.save_error = f"could not save {root / REPORT_FILE}: {err.strerror or err} (use --no-save)"
        except FolderBusyError as err:
            result.save_error = f"could not save {root / REPORT_FILE}: {err.message}"


def _check_layers_exist(states, n: int | None, where) -> None:
    """Layers the states name must exist in the target (its N from --target, the record or the states)."""
    if n is None or states.layers is None:
        return
    bad = [r for r in states.layers if r.output_of >= n]
    if bad:
        raise WiringError(f"{where}: the states' slots name {describe(bad)}, but the target has {n} layers "
                          f"(outputs 0..{n - 1}); the layers come from {states.layers_from or 'the states'}",
                          hint="check --states-layers (vLLM files: vLLM's ids, 1..N) or --target")


def training_norms(path, k: int, n: int | None, *, scored: LayerSet, batch_size: int = 8) -> dict:
    """Per-slot L2-norm statistics (median, p10, p90 over real tokens, position 0 left out, as
    verify's own) of the trainer's own data at ``path``: its k aux slots (the stored ones; of
    k+1 stored, the first k, as speculators trains: the last is the verifier's final state), or
    the scored wiring's layers where the data names every layer (a states file)."""
    import torch

    from eagle3conv.states.readers import open_states

    st = open_states(path, num_layers=n)
    t = st.hidden_size
    stored = len(st.layers) if st.layers is not None else st.aux(None, slice(0, 1)).shape[-1] // t
    if stored in (k, k + 1):
        refs = None
    elif st.layers is not None and all(r in st.layers for r in scored):
        refs = scored
    else:
        raise WiringError(f"--training-states {path}: holds {stored} slots"
                          + (f" ({describe(st.layers)})" if st.layers is not None else "")
                          + f", neither the drafter's {k} nor a set holding the scored wiring ({describe(scored)})")
    vals: list[list] = [[] for _ in range(k)]
    for b in st.batches(refs, batch_size=batch_size):
        keep = b.attention_mask.bool().clone()
        keep[:, 0] = False
        if b.aux.shape[-1] < k * t:
            raise WiringError(f"--training-states {path}: {b.aux.shape[-1] // t} slots, the drafter reads {k}")
        for s in range(k):
            vals[s].append(torch.linalg.vector_norm(b.aux[..., s * t:(s + 1) * t], dim=-1, dtype=torch.float32)[keep])
    slots = []
    for v in vals:
        x = torch.cat(v).double() if v else torch.zeros(0)
        if not x.numel():
            raise CheckpointReadError(f"--training-states {path}: no token past position 0 to take norms of")
        if not bool(torch.isfinite(x).all()):
            raise CheckpointReadError(f"--training-states {path}: hidden states are not finite (NaN or Inf)")
        q = torch.quantile(x[:16_000_000], torch.tensor([0.1, 0.5, 0.9], dtype=torch.double))
        slots.append({"median": float(q[1]), "p10": float(q[0]), "p90": float(q[2]), "tokens": int(x.numel())})
    return {"slots": slots, "source": f"--training-states ({st.source}, {st.num_sequences} sequences)"}


def _refine(scores: list[Score], confirm, screener, states, screened, avail, log_score, harvest, *,
            target_embeds: bool, labels, max_sequences: int | None, progress) -> dict:
    """Local refinement after the confirmations: the single-slot neighbours of every member of
    the current set (:func:`~eagle3conv.verify.search.set_members`: acceptance, then the log
    score) are compared with its best on the log score with the screen's bound (on the
    positions the screen read, then again on all the data for those it does not exclude:
    :func:`~eagle3conv.verify.search.refine`), and the ones it keeps are confirmed; again
    around the new set, until a round confirms nothing new (at most REFINE_ROUNDS rounds,
    REFINE_CONFIRM wirings). A trained wiring one slot away from a confirmed one is
    therefore never missed."""
    done = {s.candidate.layers for s in scores}
    rounds: list[dict] = []
    added = 0
    left: list = []  # kept by refinement's screens but not confirmed (its caps)
    for _ in range(REFINE_ROUNDS):
        members, ref = set_members(scores, log_score)
        leaders = [scores[i].candidate.layers for i in members]
        keep, rec, again = refine(screener, states, screened, scores[ref].candidate.layers, leaders, done, avail,
                                  target_embeds=target_embeds, labels=labels, max_sequences=max_sequences,
                                  progress=progress)
        if again is not None:
            harvest(again)
        take = keep[:max(0, REFINE_CONFIRM - added)]
        rec["confirmed"] = [describe(x) for x in take]
        rec["not_confirmed"] = [describe(x) for x in keep[len(take):]]
        left += keep[len(take):] + rec.pop("_not_screened_again", [])
        rounds.append(rec)
        confirm([Candidate(f"refined #{added + j + 1}", ls, "one slot from a leader, not excluded by the screen's bound")
                 for j, ls in enumerate(take)], len(scores) + len(take))
        added += len(take)
        if not take or added >= REFINE_CONFIRM:
            break
    # what the verdict keeps in its set unconfirmed: the screen's survivors and refinement's leftovers
    have = {sc.candidate.layers for sc in scores}
    pending = list(dict.fromkeys([screened.sets[i] for i in screened.alive] + left))
    pending = [x for x in pending if x not in have]
    return {"rounds": rounds, "confirmed": added, "pending": pending,
            "not_confirmed": [x for r in rounds for x in r["not_confirmed"]],
            "rule": "every single-slot change of each member of the set (k slots x every captured layer, ascending), "
                    "compared with the set's best on the log score with the screen's bound, on the screen's "
                    "positions then on all the data; the ones kept are confirmed; again around the new set until "
                    "nothing new"}


class _Serving:
    """Per engine release, how it runs this drafter: its :class:`~eagle3conv.spec.engines.Run`
    (docs/facts.md §9: RoPE layout, norm_before_residual, whose embedding, ...), settled with what
    only verify can tell (the drafter's own embed_tokens compared with the target's once, when an
    engine would use it; a quantized drafter's modules the release loads unscaled)."""

    def __init__(self, config: dict, tensors: dict, states, table, opts, head=None, *, raw_table=None,
                 own_only: bool = False, stored=None) -> None:
        self.stored = stored  # a quantized drafter's config and stored tensors: each release's own dequantization
        self._raw: dict = {}  # release -> the quantized modules it loads unscaled (SGLang's fc)
        self.config, self.tensors, self.states, self.table, self.opts = config, tensors, states, table, opts
        self.raw_table = raw_table  # the target's table as stored, for the comparison (table: cast to verify's dtype)
        self.own_only = own_only  # the drafter is narrower/wider than the target: every engine uses its own table
        self.head = head  # the target's lm_head (from --embeddings), for engines that use it
        self.names = frozenset(tensors)  # kept when the weights are released
        self.head_at_hand = head is not None
        self.embedding_comparison: dict | None = None

    def release(self) -> None:
        self.tensors = self.table = self.head = self.raw_table = self.stored = None

    def of(self, rel) -> Run:
        from eagle3conv.spec.engines import serving

        run = serving(rel, self.config, self.names, target_head_at_hand=self.head_at_hand)
        if self.stored is not None and rel not in self._raw:
            from eagle3conv.verify.inputs import raw_modules_for

            self._raw[rel] = raw_modules_for(rel, self.stored[0], self.stored[1].keys())
        return run.settled(own=self._own(run), raw_modules=self._raw.get(rel, ()))

    def tensors_for(self, run: Run) -> tuple[dict, dict]:
        """The config and tensors a release runs: a quantized drafter dequantized as that release loads it."""
        if not run.raw_modules:
            return self.config, self.tensors
        from eagle3conv.verify.inputs import dequantize_drafter

        config, tensors, _ = dequantize_drafter(self.stored[0], dict(self.stored[1]), raw_modules=run.raw_modules)
        return config, tensors

    def main(self) -> Run:
        """verify's own forward: the first --engine release that can serve the drafter, else the first
        default release that can (SGLang's newest first), else SGLang's newest as configured."""
        from eagle3conv.spec.engines import default_engines, parse_engine

        asked = self.opts.releases() if self.opts.asked() else ()
        newest = parse_engine("sglang")
        order = [*asked, newest, *(r for r in default_engines() if r != newest)]
        return next((run for run in map(self.of, order) if not run.refused), self.of(asked[0] if asked else newest))

    def compare(self) -> dict | None:
        """The drafter's own embed_tokens against the target's (computed once)."""
        if (self.embedding_comparison is None and self.tensors is not None and not self.own_only
                and EMBED in self.tensors):
            from eagle3conv.verify.inputs import compare_embeddings

            self.embedding_comparison = compare_embeddings(self.tensors[EMBED], self.states,
                                                           table=self.raw_table)
        return self.embedding_comparison

    def _own(self, run: Run) -> bool:
        if self.own_only:  # a table of the target's width cannot feed the drafter: every engine uses its own
            return True
        if run.own_embedding != "unless_equal":
            return run.own_embedding == "always"
        cmp = self.compare() or {}
        return cmp.get("identical") is not True  # not shown identical: the engine keeps its own

    def describe(self, run: Run) -> list[str]:
        """The emulated differences from what config.json says (the embedding decision included)."""
        out = list(run.differences)
        for m in run.raw_modules:
            out.append(f"{run.engine} builds {m} as a plain bf16 Linear: run with {m}'s stored codes unscaled (or "
                       "its random init, for a packed weight it skips), as it loads them (docs/facts.md §14)")
        if run.own_embedding == "always" and not self.own_only:  # settled from "unless_equal": the tables differ
            cmp = self.embedding_comparison or {}
            seen = (f"{cmp['rows']} of {cmp['of']} rows compared ({cmp['how']}), max difference "
                    f"{cmp['max_abs_diff']:.3g}" if cmp.get("max_abs_diff") is not None else cmp.get("how", ""))
            out.append(f"{run.engine} embeds with the drafter's own embed_tokens, which differs from the "
                       f"target's ({seen})" if cmp.get("identical") is False else
                       f"{run.engine} embeds with the drafter's own embed_tokens (not compared with the "
                       f"target's: {seen})")
        return out

    def needs_tensors(self, rows, main_run: Run) -> bool:
        mine = main_run.settled(raw_modules=())
        return any(self.of(r.release) != mine for r in rows if r.layers)


def _score_engines(rows, scores: list[Score], drafter, states, *, serving: _Serving | None = None,
                   main_fw=None, device=None, dtype=None, **kw) -> list[EngineScore]:
    """Serving emulation, side by side: for each engine release's row of the wiring check
    (:class:`~eagle3conv.spec.engines.EngineRow`), score the aux layers it captures from this
    config, run the way that release runs the drafter (RoPE layout, norm_before_residual, whose
    embedding: docs/facts.md §9), reusing a score already made for the same layers and forward.
    One :class:`EngineScore` per row, beside the row (never written into it)."""
    from eagle3conv.verify.stats import paired_difference

    main_key = main_fw.settled(raw_modules=()) if serving is not None else None  # verify's own dequantization
    done = {(s.candidate.layers, main_key): s for s in scores}
    built = {main_key: (drafter, kw.get("target_embeds"))}
    out: list[EngineScore] = []
    for row in rows:
        rel = row.release
        run = serving.of(rel) if serving is not None else None
        info = {"run": run, "emulated": tuple(serving.describe(run)) if run is not None else ()}
        if row.layers is None:
            why = (row.capture.error.message if row.capture.error else row.capture.unknown
                   or "the engine captures nothing usable from this config")
            out.append(EngineScore(rel.spec, str(rel), not_scored=why, **info))
            continue
        if run is not None and run.refused:
            out.append(EngineScore(rel.spec, str(rel), not_scored="; ".join(run.refused), **info))
            continue
        k = drafter.config.num_aux
        if len(row.layers) != k:
            out.append(EngineScore(rel.spec, str(rel), not_scored=f"{rel} captures {len(row.layers)} states but the "
                                   f"drafter's fc reads {k}: it cannot run this drafter as configured (its row says "
                                   "what to write or launch with)", **info))
            continue
        refs = row.layers
        key = run  # a Run is its own key: releases that run the drafter alike share one build and score
        s = done.get((refs, key))
        if s is None:
            try:
                states.check_refs(refs)
            except (WiringError, UsageError) as err:
                out.append(EngineScore(rel.spec, str(rel), not_scored=f"the states do not hold what {rel} captures: "
                                                                      f"{err.message}", **info))
                continue
            if key not in built:
                if serving.tensors is None:  # pragma: no cover - needs_tensors kept them
                    out.append(EngineScore(rel.spec, str(rel), not_scored="the drafter's weights were released "
                                                                          "before this engine's forward was built",
                                           **info))
                    continue
                config, tensors = serving.tensors_for(run)
                built[key] = build_drafter(config, tensors, device, dtype, embeddings=serving.table,
                                           head=serving.head, run=run)
            runner, embeds = built[key]
            s = evaluate(runner, states, Candidate(f"engine {rel.spec}", refs,
                                                   f"what {rel} captures from this config, run as it "
                                                   "runs the drafter"), **{**kw, "target_embeds": embeds})
            done[(refs, key)] = s
        paired = None
        if scores:
            d, lo, hi = paired_difference(s, scores[0])
            paired = {"difference": round(d, 4), "ci95": [round(lo, 4), round(hi, 4)] if math.isfinite(lo + hi) else None,
                      "definition": "accept length over every chain start, this engine minus verify's main score, "
                                    "resampling sequences jointly"}
        out.append(EngineScore(rel.spec, str(rel), score=s, paired_vs_main=paired, **info))
    return out


class SmokeOutcome(str, Enum):
    """What ``verify`` without states decided (:class:`SmokeVerdict`)."""

    RUNS = "runs"  # the forward ran clean and the wiring check (where one ran) found no error
    FORWARD_FAILED = "forward-failed"  # the forward on random inputs went wrong (NaN, a shape, ...)
    WIRING_FAILED = "wiring-failed"  # the forward ran clean; the wiring check found an error
    BOTH_FAILED = "both-failed"


@dataclass(frozen=True)
class SmokeVerdict:
    """:class:`SmokeResult`'s verdict: its outcome, the forward's problems and the wiring check's
    error codes (None: no wiring check ran)."""

    outcome: SmokeOutcome
    problems: tuple[str, ...] = ()
    wiring_errors: tuple[str, ...] | None = None

    def to_dict(self) -> dict:
        return {"outcome": self.outcome.value, "problems": list(self.problems),
                "wiring_errors": None if self.wiring_errors is None else list(self.wiring_errors)}


@dataclass(frozen=True)
class SmokeResult:
    """What ``verify`` without states found (:func:`smoke`): the drafter's forward on random inputs
    (:class:`~eagle3conv.model.drafter.SmokeTestResult`) and, where a target is known, the wiring
    check. ``ok``: the forward ran clean and the wiring check (if any) found no error."""

    checkpoint: str
    forward: SmokeTestResult
    device: str
    dtype: str  # torch's name: float32, bfloat16, float16
    seconds: float
    mla: bool  # an MLA drafter (Eagle3DeepseekV2ForCausalLM): the report says which forward ran
    wiring: Wiring | None = None  # the wiring check (wiring.apply.Wiring), when one ran
    wiring_ok: bool | None = None  # None: no wiring check

    @property
    def forward_ok(self) -> bool:
        return self.forward.ok

    @property
    def ok(self) -> bool:
        return self.forward.ok and self.wiring_ok is not False

    @property
    def problems(self) -> tuple[str, ...]:
        return self.forward.problems

    def verdict(self) -> SmokeVerdict:
        """The outcome as a code, with the forward's problems and the wiring check's error codes."""
        errors = None if self.wiring is None else tuple(f.code for f in self.wiring.report.findings
                                                        if f.level == "error")
        wiring_bad = self.wiring_ok is False
        outcome = (SmokeOutcome.RUNS if self.forward.ok and not wiring_bad else
                   SmokeOutcome.WIRING_FAILED if self.forward.ok else
                   SmokeOutcome.BOTH_FAILED if wiring_bad else SmokeOutcome.FORWARD_FAILED)
        return SmokeVerdict(outcome, tuple(self.forward.problems), errors)

    @property
    def kind(self) -> str | None:
        """Which forward ran, where it is not the Llama-style one."""
        return "MLA drafter (Eagle3DeepseekV2ForCausalLM): its forward ran" if self.mla else None

    def to_dict(self) -> dict:
        r = self.forward
        d = {"checkpoint": self.checkpoint, "ok": self.ok, "forward_ok": r.ok, "problems": list(r.problems),
             "device": self.device, "dtype": self.dtype, "step1_input_width": r.step1_input_width,
             "step2_input_width": r.step2_input_width, "logits_width": r.logits_width,
             "vocab_size": r.vocab_size, "embedding": r.embedding_source, "seconds": round(self.seconds, 3)}
        if self.mla:
            d["kind"] = self.kind
            d["engine_notes"] = list(r.engine_notes)
        if self.wiring is not None:
            d["wiring"] = self.wiring.to_dict(self.checkpoint)  # its launch lines name the folder as given
            d["wiring_ok"] = self.wiring_ok
        d["verdict"] = self.verdict().to_dict()
        return d


def smoke(path: str | os.PathLike, *, device: str = "auto", dtype: str = "auto", wiring_options=None) -> SmokeResult:
    """The structural smoke test (no states): strict load, random inputs at step 1
    (k*T wide) and step 2 (H wide), finite outputs, logits Vd wide, d2t in range.
    With ``wiring_options`` naming a target (or a record naming one), the wiring check
    too, engine by engine: its errors make ``ok`` false. ``forward_ok`` (and ``problems``)
    is the forward's own verdict, ``wiring_ok`` the wiring's."""
    config, tensors = load_drafter_weights(Path(path))
    from eagle3conv.verify.inputs import dequantize_drafter

    config, tensors, _ = dequantize_drafter(config, tensors)  # a quantized drafter: its weights as the scheme defines
    r = smoke_forward(path, config, tensors, device=device, dtype=dtype)
    if wiring_options is None:
        return r
    from eagle3conv.wiring.apply import check_fixed, gather

    t = config.get("target_hidden_size") or config.get("hidden_size")
    w = check_fixed(config, tensors, wiring_options, ev=gather(Path(path), None, config, wiring_options),
                    path=path, target_hidden=t if isinstance(t, int) else None,
                    read_d2t=lambda: tensors[D2T].tolist())
    return replace(r, wiring=w, wiring_ok=bool(w.report.ok))


def smoke_forward(path, config: dict, tensors: dict, *, device: str = "auto", dtype: str = "auto") -> SmokeResult:
    """The drafter's forward on random inputs (:func:`eagle3conv.model.drafter.smoke_test`) on
    ``device`` in ``dtype`` (``auto``: bf16 on GPU, fp32 on CPU), timed: the one smoke wrapper,
    for ``verify`` without states and push's gate alike. Loading errors are raised."""
    from eagle3conv.model import is_mla_config
    from eagle3conv.model.drafter import smoke_test

    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    t0 = time.perf_counter()
    r = smoke_test(config, tensors, dev, dtype=dt)
    return SmokeResult(checkpoint=str(path), forward=r, device=dev, dtype=str(dt).removeprefix("torch."),
                       seconds=time.perf_counter() - t0, mla=is_mla_config(config, tensors.keys()))
