"""The canonical tensor table (mappings/canonical.json) and the shapes a config implies."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache

from eagle3conv.io.data import data_path
from eagle3conv.errors import MappingFileError

_TERM = re.compile(r"^[A-Za-z][A-Za-z0-9]*$|^[0-9]+$")


@dataclass(frozen=True)
class CanonicalTensor:
    name: str
    shape: tuple[str, ...]
    required: bool
    why: str
    when: str | None = None  # symbol that must be set (or "!SYM": unset) for the tensor to belong


@dataclass(frozen=True)
class Fused:
    name: str
    into: tuple[str, ...]
    rows: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Architecture:
    key: str  # llama | mla
    architecture: str
    tensors: tuple[CanonicalTensor, ...]
    fused: tuple[Fused, ...]
    templated: tuple[CanonicalTensor, ...]  # names with {slot}, expanded once k is known

    def expand(self, symbols: dict) -> dict[str, CanonicalTensor]:
        """Canonical tensors for a concrete config (slots expanded, `when` applied)."""
        out = {}
        for t in self.tensors:
            if t.when:
                sym = t.when.lstrip("!")
                present = symbols.get(sym) not in (None, 0)
                if present == t.when.startswith("!"):
                    continue
            out[t.name] = t
        k = symbols.get("k") or 0
        for t in self.templated:
            for slot in range(int(k)):
                name = t.name.replace("{slot}", str(slot))
                out[name] = CanonicalTensor(name, t.shape, t.required, t.why)
        return out


def eval_dim(expr: str, symbols: dict) -> int | None:
    """Evaluate a dimension like "NH*HD", "2*H" or "KL+QR". None if a symbol is unknown."""
    total = 0
    for term in expr.split("+"):
        prod = 1
        for factor in term.split("*"):
            factor = factor.strip()
            if not _TERM.match(factor):
                raise MappingFileError(f"bad dimension expression {expr!r}")
            if factor.isdigit():
                prod *= int(factor)
            else:
                v = symbols.get(factor)
                if v is None:
                    return None
                prod *= int(v)
        total += prod
    return total


def _load_arch(key: str, raw: dict, path) -> Architecture:
    tensors, templated, fused = [], [], []
    names = set()
    for t in raw["tensors"]:
        missing = {"name", "shape", "required", "why"} - set(t)
        if missing:
            raise MappingFileError(f"{path}: {key} tensor {t.get('name')!r} lacks {sorted(missing)}")
        if t["name"] in names:
            raise MappingFileError(f"{path}: {key} lists {t['name']} twice")
        names.add(t["name"])
        for d in t["shape"]:
            eval_dim(d, {})  # syntax check
        ct = CanonicalTensor(t["name"], tuple(t["shape"]), bool(t["required"]), t["why"], t.get("when"))
        (templated if "{slot}" in ct.name else tensors).append(ct)
    for f in raw.get("fused", []):
        if len(f["into"]) != len(f["rows"]) or not set(f["into"]) <= names:
            raise MappingFileError(f"{path}: fused {f['name']} must split into listed canonical tensors")
        fused.append(Fused(f["name"], tuple(f["into"]), tuple(f["rows"]), f["why"]))
    return Architecture(key, raw["architecture"], tuple(tensors), tuple(fused), tuple(templated))


@lru_cache(maxsize=1)
def load_canonical() -> dict[str, Architecture]:
    path = data_path("canonical.json")
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise MappingFileError(f"{path}: unreadable: {e}") from e
    if raw.get("schema") != 1:
        raise MappingFileError(f"{path}: schema must be 1")
    return {k: _load_arch(k, v, path) for k, v in raw["architectures"].items()}


MLA_ARCHITECTURES = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")


def architecture_for(config: dict | None, keys) -> Architecture:
    table = load_canonical()
    archs = (config or {}).get("architectures") or []
    if any(a in MLA_ARCHITECTURES for a in archs) or any("kv_a_proj_with_mqa" in k for k in keys):
        return table["mla"]
    return table["llama"]


def symbols_from_config(config: dict, arch: Architecture) -> dict:
    """Shape symbols from a drafter config. Missing values stay None."""
    c = config
    h = c.get("hidden_size")
    nh = c.get("num_attention_heads")
    eagle = c.get("eagle_config") if isinstance(c.get("eagle_config"), dict) else {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") or c.get("eagle_aux_hidden_state_layer_ids")
    sym = {
        "H": h,
        "T": c.get("target_hidden_size") or h,
        "NH": nh,
        "NKV": c.get("num_key_value_heads") or nh,
        "HD": c.get("head_dim") or (h // nh if h and nh else None),
        "I": c.get("intermediate_size"),
        "V": c.get("vocab_size"),
        "Vd": c.get("draft_vocab_size") or c.get("vocab_size"),
        "k": len(ids) if isinstance(ids, list) and ids else None,
    }
    if arch.key == "mla":
        qn, qr, vh = c.get("qk_nope_head_dim"), c.get("qk_rope_head_dim"), c.get("v_head_dim")
        sym.update(
            QL=c.get("q_lora_rank"),
            KL=c.get("kv_lora_rank"),
            QR=qr,
            VH=vh,
            QK=(qn + qr) if qn is not None and qr is not None else None,
            NV=(qn + vh) if qn is not None and vh is not None else None,
        )
    return sym


def drafter_uses_own_embedding(hidden_size: int | None, target_hidden_size: int | None) -> bool:
    """Which embedding table SGLang embeds the drafter's tokens with: the target's (False) or the
    drafter's own ``embed_tokens`` (True). SGLang shares the target's table with the drafter
    unless ``target_hidden_size`` differs from the drafter's ``hidden_size``: a table of the
    target's width cannot feed the drafter's layer. fix-keys, verify and push's gate all ask here."""
    return target_hidden_size is not None and hidden_size is not None and target_hidden_size != hidden_size


def embedding_source(config: dict) -> str:
    """``"drafter"`` or ``"target"``: :func:`drafter_uses_own_embedding` for a config."""
    h = config.get("hidden_size")
    t = config.get("target_hidden_size") or h
    return "drafter" if drafter_uses_own_embedding(h, t) else "target"
