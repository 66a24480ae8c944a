"""The library's front door: ``inspect`` and ``fix_keys`` return result objects.

The CLI is a thin layer over these; a Python user gets the same behaviour::

    from eagle3conv import fix_keys
    result = fix_keys("ckpt/", out="ckpt-sglang/")
    print(result.plan.format.format.name, result.written.files)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from eagle3conv.checkpoint.index import CheckpointIndex, open_checkpoint
from eagle3conv.checkpoint.plan import Plan, build_plan, load_config_file
from eagle3conv.checkpoint.writer import (
    WriteResult,
    parse_size,
    plan_shards,
    recover,
    write_in_place,
    write_out,
)
from eagle3conv.errors import UsageError


@dataclass
class InspectResult:
    index: CheckpointIndex
    plan: Plan | None
    plan_error: Exception | None  # a plan that could not even be built (e.g. no config)
    recovered: str | None

    def to_dict(self) -> dict:
        idx = self.index
        d = {
            "checkpoint": str(idx.root),
            "layout": idx.layout,
            "weight_files": [str(p) for p in idx.weight_files],
            "wrapper": idx.wrapper,
            "tensors": [
                {"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "bytes": t.nbytes}
                for t in sorted(idx.tensors.values(), key=lambda t: t.name)
            ],
            "total_bytes": idx.total_bytes,
            "config": _config_summary(idx.config),
            "other_files": [p.name for p in idx.other_files],
            "recovered": self.recovered,
        }
        if self.plan is not None:
            d["plan"] = self.plan.to_dict()
            d["plan"]["shards"] = [
                {"file": f, "tensors": [o.name for o in outs]} for f, outs in plan_shards(self.plan)
            ]
        if self.plan_error is not None:
            d["plan_error"] = getattr(self.plan_error, "to_dict", lambda: {"message": str(self.plan_error)})()
        return d


@dataclass
class FixResult:
    plan: Plan
    mode: str  # in-place | out | dry-run
    output: Path | None
    unchanged: bool
    written: WriteResult | None
    recovered: str | None
    shards: list

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "output": str(self.output) if self.output else None,
            "unchanged": self.unchanged,
            "recovered": self.recovered,
            "files": self.written.files if self.written else [],
            "bytes_written": self.written.bytes_written if self.written else 0,
            "tensors_verified": self.written.verified if self.written else 0,
            "shards": [{"file": f, "tensors": [o.name for o in outs]} for f, outs in self.shards],
            "plan": self.plan.to_dict(),
        }


def _config_summary(cfg: dict | None) -> dict | None:
    if cfg is None:
        return None
    keys = (
        "architectures", "model_type", "hidden_size", "target_hidden_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
        "draft_vocab_size", "rope_theta", "rope_scaling", "tie_word_embeddings", "torch_dtype",
        "speculators_model_type",
    )
    out = {k: cfg[k] for k in keys if k in cfg}
    if isinstance(cfg.get("eagle_config"), dict):
        out["eagle_config"] = cfg["eagle_config"]
    if "eagle_aux_hidden_state_layer_ids" in cfg:
        out["eagle_aux_hidden_state_layer_ids"] = cfg["eagle_aux_hidden_state_layer_ids"]
    return out


def _in_hf_cache(root: Path) -> bool:
    return root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--")


def inspect(path: str | Path, *, source_format: str | None = None, config: str | Path | None = None,
            keep_embed: bool = False, dtype: str | None = None) -> InspectResult:
    """Index a checkpoint and plan its fix without writing anything but a crash recovery."""
    p = Path(path)
    recovered = recover(p) if p.is_dir() else None
    index = open_checkpoint(p)
    plan, err = None, None
    try:
        plan = build_plan(
            index,
            source_format=source_format,
            config_override=load_config_file(config) if config else None,
            keep_embed=keep_embed,
            dtype=dtype,
        )
    except UsageError as e:
        err = e
    except Exception as e:  # noqa: BLE001 - inspect shows why planning failed
        from eagle3conv.errors import Eagle3ConvError

        if not isinstance(e, Eagle3ConvError):
            raise
        err = e
    return InspectResult(index, plan, err, recovered)


def fix_keys(
    path: str | Path,
    *,
    out: str | Path | None = None,
    source_format: str | None = None,
    config: str | Path | None = None,
    keep_embed: bool = False,
    dtype: str | None = None,
    max_shard_size: str | int | None = None,
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
) -> FixResult:
    """Rename a drafter checkpoint to the names SGLang loads, strictly, and prove the result.

    In place unless ``out`` is given. Raises :class:`InvalidCheckpointError`
    (exit 3) listing every unmapped, missing or colliding key; nothing is written then.
    """
    p = Path(path)
    recovered = recover(p) if p.is_dir() and not dry_run else None
    index = open_checkpoint(p)
    plan = build_plan(
        index,
        source_format=source_format,
        config_override=load_config_file(config) if config else None,
        keep_embed=keep_embed,
        dtype=dtype,
    )
    plan.raise_for_errors()
    size = parse_size(max_shard_size) if isinstance(max_shard_size, str) else max_shard_size
    shards = plan_shards(plan, size)
    if dry_run:
        return FixResult(plan, "dry-run", Path(out) if out else index.root, plan.is_identity() and out is None, None, None, shards)
    if out is not None:
        result = write_out(plan, Path(out), max_shard_size=size, progress=progress)
        return FixResult(plan, "out", Path(out), False, result, recovered, shards)
    if plan.is_identity() and size is None:
        return FixResult(plan, "in-place", index.root, True, None, recovered, shards)
    if plan.format.format.extracts:
        dropped = sum(1 for d in plan.decisions if d.action == "dropped")
        raise UsageError(
            f"{index.root}: a whole-model {plan.format.format.name} checkpoint; fixing it in place would delete "
            f"{dropped} base-model tensors",
            hint=f"write the drafter to a new folder: eagle3conv fix-keys {path} --out DIR",
        )
    if _in_hf_cache(index.root):
        raise UsageError(
            f"{index.root}: a Hugging Face cache snapshot; eagle3conv does not rewrite the cache",
            hint=f"eagle3conv fix-keys {path} --out DIR",
        )
    if index.root != p and p.is_file() and len(index.weight_files) == 1 and p.name != index.weight_files[0].name:
        raise UsageError(f"{p}: unexpected file")
    result = write_in_place(plan, max_shard_size=size, progress=progress)
    return FixResult(plan, "in-place", index.root, False, result, recovered, shards)
