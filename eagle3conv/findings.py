"""One type for what a check found: :class:`Finding`.

Every check that reports an outcome (key names, tensor shapes, vocab maps,
config, aux-layer wiring, the smoke forward, the push gate) gives a
:class:`Finding` with a ``level``, an ``area`` and a ``code``. Decisions are
taken on those three; ``message`` and ``fix`` are for people and may be
reworded freely (``tests/test_findings.py`` rewords every message and checks
that no decision changes).

Codes are declared here, once, as module constants: a check imports the ones
it emits, so a misspelt code is an import error, and :class:`Finding` refuses
a code, level or area not declared here.

This module imports nothing from the rest of the package.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Level = Literal["error", "warning", "notice", "ok"]
LEVELS: tuple[str, ...] = ("error", "warning", "notice", "ok")

Area = Literal["keys", "shapes", "vocab", "config", "aux-layers", "smoke", "gate", "launch"]
KEYS, SHAPES, VOCAB, CONFIG, AUX_LAYERS, SMOKE, GATE, LAUNCH = AREAS = (
    "keys", "shapes", "vocab", "config", "aux-layers", "smoke", "gate", "launch")

# --------------------------------------------------------------------------- codes
# keys: which source tensor becomes which SGLang name
REFUSED_KEY = "refused-key"
UNMAPPED_KEY = "unmapped-key"
KEY_COLLISION = "key-collision"
FUSED_AND_UNFUSED = "fused-and-unfused"
MISSING_KEY = "missing-key"
EMBED_DROPPED = "embed-dropped"
EMBED_KEPT = "embed-kept"
MISSING_EMBEDDING = "missing-embedding"
EXTRACTED = "extracted"
MLA_NO_Q_LORA = "mla-no-q-lora"  # an MLA drafter without q_lora_rank: SGLang refuses it
LAYER_MISSING = "layer-missing"  # a decoder layer missing between others (layers.0, layers.2)
O_BIAS_ZEROS = "o-bias-zeros"  # o_proj's bias written as zeros (the engines build it when bias/attention_bias)
LATER_NORMS_DIFFER = "later-norms-differ"  # a later layer's input_layernorm and hidden_norm differ, neither known trained
# shapes: each tensor against the config
SPLIT_SHAPE = "split-shape"
SHAPE_MISMATCH = "shape-mismatch"
WEIGHT_DTYPE = "weight-dtype"
# vocab: d2t and t2d
VOCAB_MAP_DTYPE = "vocab-map-dtype"
NO_D2T = "no-d2t"
D2T_SHAPE = "d2t-shape"
D2T_DTYPE = "d2t-dtype"
D2T_CAST = "d2t-cast"
D2T_UNCHECKED = "d2t-unchecked"
D2T_AMBIGUOUS = "d2t-ambiguous"
D2T_ABSOLUTE = "d2t-absolute"
D2T_OUT_OF_VOCAB = "d2t-out-of-vocab"
D2T_NOT_INCREASING = "d2t-not-increasing"
T2D_SHAPE = "t2d-shape"
T2D_REBUILT = "t2d-rebuilt"
T2D_DISAGREES = "t2d-disagrees"
FULL_VOCAB_D2T = "full-vocab-d2t"  # an MLA drafter's d2t/t2d where the draft vocab is the full vocab
# config: the drafter's config.json
CONFIG_REPLACED = "config-replaced"
CONFIG_SOURCE = "config-source"
NO_VOCAB_SIZE = "no-vocab-size"
SERVED_WITHOUT = "served-without"  # a switch some engine releases ignore (the drafter is served without it)
LAYER_COUNT = "layer-count"  # num_hidden_layers is not the number of decoder layers the weights hold
CANNOT_SERVE = "cannot-serve"  # an engine release cannot load this drafter (layers, variant, architecture name)
MOE_DRAFTER = "moe-drafter"  # a drafter with an MoE MLP: no engine serves one as an EAGLE-3 drafter
# aux-layers: the wiring check (eagle3conv.wiring.check) and its glue
FC_WIDTH = "fc-width"
RECORDS_DISAGREE = "records-disagree"
RECORD_RANGE = "record-range"
RECORD_COUNT = "record-count"
TRAINED_ON_EMBEDDING = "trained-on-embedding"
BAD_EAGLE_CONFIG = "bad-eagle-config"
DUPLICATE_IDS = "duplicate-ids"
UNSORTED_IDS = "unsorted-ids"
ID_COUNT = "id-count"
BAD_IDS = "bad-ids"
# per engine release asked (its row): what it captures from the config vs the training record
IDS_AS_TRAINED = "ids-as-trained"  # ok: every release reading a field captures the trained layers
UNVERIFIED_IDS = "unverified-ids"  # the config names layers, no training record says which were trained
DISAGREES_WITH_TRAINING = "disagrees-with-training"  # no release reading a field captures the trained layers
ENGINE_CAPTURES_OTHER = "engine-captures-other"  # the config's own ids make a release capture other layers
ENGINE_CANNOT_CAPTURE = "engine-cannot-capture"  # the config's own ids name a state a release cannot capture
ENGINE_NEEDS_OTHER_IDS = "engine-needs-other-ids"  # no single id list serves every release asked of one engine
DEFAULTS_DISAGREE = "defaults-disagree"  # a release finds no ids and its default is not what was trained
DEFAULT_USED = "default-used"  # a release finds no ids in the field it reads and uses its default
DEFAULT_CANNOT_CAPTURE = "default-cannot-capture"  # a release's default does not fit the target
ENGINE_UNSUPPORTED = "engine-unsupported"  # the release serves no EAGLE-3 drafter on this target family
CAPTURE_SWITCHED_OFF = "capture-switched-off"  # the config turns the release's aux capture off
NO_IDS = "no-ids"
SPECFORGE_WINDOW = "specforge-window"
# config audit: fields one engine reads differently from another (area config)
AUDIT_DRAFT_VOCAB = "audit-draft-vocab"
AUDIT_D2T_IDENTITY = "audit-d2t-identity"
AUDIT_ROPE_FIELDS = "audit-rope-fields"
AUDIT_MAX_POSITIONS = "audit-max-positions"
AUDIT_ONE_ENGINE_FLAG = "audit-one-engine-flag"
AUDIT_USE_CACHE = "audit-use-cache"
AUDIT_D2T_MISSING = "audit-d2t-missing"  # a reduced draft vocab without d2t (where the vocab check did not run)
AUDIT_EMBED_DIFFERS = "audit-embed-differs"  # embed_tokens shipped and not the target's: vLLM embeds with it
AUDIT_EMBED_UNCOMPARED = "audit-embed-uncompared"  # embed_tokens shipped; the target's table not at hand
AUDIT_CONTEXT_UNKNOWN = "audit-context-unknown"  # no --max-context and the target names no context
AUDIT_ENGINE_DEFAULT = "audit-engine-default"  # a field left out that the engines fill in with their own default
AUDIT_EAGLE_CONFIG_NULL = "audit-eagle-config-null"  # eagle_config: null, which the engines read as absent
TARGET_HIDDEN = "target-hidden"
TARGET_VOCAB = "target-vocab"  # the drafter's vocab_size is not the target's
TARGET_LAYERS = "target-layers"  # the drafter's config records another target layer count
EVIDENCE_NOTE = "evidence-note"
# launch: a user's own launch line against the release's launch data (eagle3conv.spec.launch_check)
LAUNCH_UNKNOWN_OPTION = "launch-unknown-option"  # an option name (or --speculative-config key) the release lacks
LAUNCH_ABBREVIATED = "launch-abbreviated"  # an abbreviation the release's parser expands
LAUNCH_ALGORITHM = "launch-algorithm"  # no or the wrong speculative algorithm / method
LAUNCH_METHOD_FROM_PATH = "launch-method-from-path"  # vLLM picks the method from the drafter's path
LAUNCH_NO_DRAFT = "launch-no-draft"  # no drafter path on the line
LAUNCH_DRAFT_QUANTIZATION = "launch-draft-quantization"  # the draft inherits the target's --quantization
LAUNCH_KV_SCALES = "launch-kv-scales"  # a quantized draft KV cache without k_scale/v_scale
LAUNCH_FP16 = "launch-fp16"  # fp16 serving of a bf16-trained drafter
LAUNCH_OVERRIDES = "launch-overrides"  # target config overrides that do (SGLang) or do not (vLLM) reach the drafter
LAUNCH_CONTEXT = "launch-context"  # the served context against the drafter's: what the release does
LAUNCH_SWITCH = "launch-switch"  # a switch the drafter needs on this release is missing
LAUNCH_CANNOT_SERVE = "launch-cannot-serve"  # the release cannot load the drafter at all
LAUNCH_TARGET = "launch-target"  # the line serves another target than the one the drafter was checked for
# smoke: the drafter forward on random inputs
LOGITS_SHAPE = "logits-shape"
NONFINITE_LOGITS = "nonfinite-logits"
NONFINITE_HIDDEN = "nonfinite-hidden"
STATE_WIDTH = "state-width"
PREDICTION_OUT_OF_VOCAB = "prediction-out-of-vocab"
# quantized drafters (spec/quant.py, docs/facts.md §14)
QUANT_CONFIG = "quant-config"  # the quantization config: unknown method/algo, a method-less hf_quant_config.json
QUANT_TENSOR = "quant-tensor"  # a quantized module's tensors: a scale missing, a wrong dtype or shape, weight_shape
QUANT_EXCLUSION = "quant-exclusion"  # the exclusion list against the modules each release builds
QUANT_ENGINE = "quant-engine"  # a release cannot serve a quantized module as the scheme defines (SGLang's fc)
QUANT_DEQUANTIZED = "quant-dequantized"  # fix-keys --dequantize wrote a module in bf16
# gate: one pre-push check's outcome
GATE_PASSED = "passed"
GATE_FAILED = "failed"

CODES: frozenset[str] = frozenset(
    v for k, v in dict(globals()).items()
    if k.isupper() and isinstance(v, str)
    and k not in ("KEYS", "SHAPES", "VOCAB", "CONFIG", "AUX_LAYERS", "SMOKE", "GATE", "LAUNCH")
)
"""Every declared code."""

# The wiring codes that mean "the config's own ids contradict what the drafter was trained on".
CONFLICTS: frozenset[str] = frozenset({DISAGREES_WITH_TRAINING, RECORDS_DISAGREE})


@dataclass(frozen=True)
class Finding:
    """One outcome of one check. Branch on ``level``, ``area`` and ``code``, never on ``message``."""

    level: Level
    area: Area
    code: str
    message: str
    fix: str | None = None
    """The command or edit that fixes it, when one does."""
    subject: str | None = None
    """What it is about, when that is one thing: a tensor name, a forward step, a gate check's name."""

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"finding level {self.level!r} is not one of {LEVELS}")
        if self.area not in AREAS:
            raise ValueError(f"finding area {self.area!r} is not one of {AREAS}")
        if self.code not in CODES:
            raise ValueError(f"finding code {self.code!r} is not declared in eagle3conv.findings")

    @property
    def ok(self) -> bool:
        """Not an error."""
        return self.level != "error"

    # the pre-push gate's names for its checks (``name: detail`` in messages and the card)
    @property
    def name(self) -> str:
        return self.subject or self.area

    @property
    def detail(self) -> str:
        return self.message

    def to_dict(self) -> dict:
        return {"level": self.level, "area": self.area, "code": self.code, "message": self.message,
                "fix": self.fix, "subject": self.subject}


def errors(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.level == "error"]


def warnings(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.level == "warning"]


def by_area(findings: Iterable[Finding], *areas: str) -> list[Finding]:
    return [f for f in findings if f.area in areas]


def with_code(findings: Iterable[Finding], *codes: str) -> list[Finding]:
    return [f for f in findings if f.code in codes]


__all__ = ["Finding", "Level", "Area", "LEVELS", "AREAS", "CODES", "CONFLICTS", "errors", "warnings", "by_area",
           "with_code"]
