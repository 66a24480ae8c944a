"""Target models: built-in profiles (``mappings/targets/*.json``) and config readers.

A profile holds the numbers eagle3conv checks a drafter against (hidden size,
layer count, vocab) and, for each number, where it comes from. Engine default
aux layers are not stored: the engine rules derive them from ``num_hidden_layers``
and the target's family (:func:`eagle3conv.spec.engines.default_capture`).

Profile file schema (validated at load; unknown keys are errors)::

    name                 str, equal to the file name without .json
    aliases              [str]      other names, matched case-insensitively
    description          str
    hf_repo              str        the Hugging Face repo the numbers describe
    architectures        [str]      top-level config.json "architectures"
    model_type           str        top-level config.json "model_type"
    text_config_key      str|null   where the language model's numbers live
                                    (Kimi-K2.5: "text_config"); null = top level
    family               str        the engine model-file family
                                    (mappings/engines/families.json); must be
                                    the one its architectures/model_type name
    hidden_size, num_hidden_layers, vocab_size                 int > 0
    num_attention_heads, num_key_value_heads, intermediate_size int > 0 | null
    head_dim             int > 0 | null (null: MLA, no single head size)
    max_position_embeddings int > 0 | null  the context the target serves (the default
                                    of --max-context); null where no source names it
    sources:
      upstream           str        URL of the upstream config.json
      references         {id: str}  what each source is
      numbers            {field: [reference id, ...]}  one entry per non-null number
      unchecked          [field]    numbers with fewer than two sources, flagged
      notes              str        (optional)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from eagle3conv.io.data import data_path
from eagle3conv.errors import CheckpointReadError, MappingFileError, UsageError
from eagle3conv.spec.layers import MAX_LAYERS

log = logging.getLogger(__name__)

REQUIRED_NUMBERS = ("hidden_size", "num_hidden_layers", "vocab_size")
OPTIONAL_NUMBERS = ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                    "max_position_embeddings")
NUMBERS = REQUIRED_NUMBERS + OPTIONAL_NUMBERS
_STRING_KEYS = ("name", "description", "hf_repo", "model_type", "family")
_KEYS = frozenset(
    _STRING_KEYS + NUMBERS + ("aliases", "architectures", "text_config_key", "sources")
)
_SOURCE_KEYS = frozenset({"upstream", "references", "numbers", "unchecked", "notes"})
# Where multimodal wrappers nest the language model's config.
_TEXT_CONFIG_KEYS = ("text_config", "language_config", "llm_config")


@dataclass(frozen=True)
class TargetProfile:
    """The numbers of one target model that a drafter must agree with."""

    name: str
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    architectures: tuple[str, ...] = ()
    model_type: str | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int | None = None
    max_position_embeddings: int | None = None
    """The target's served context (its config.json), the default of ``--max-context``."""
    aliases: tuple[str, ...] = ()
    description: str = ""
    hf_repo: str | None = None
    text_config_key: str | None = None
    family: str | None = None
    """The engine model-file family (docs/facts.md §9); None when the table does not know it."""
    sources: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


# --------------------------------------------------------------------------- profile files


def _bad(path: Path, message: str) -> MappingFileError:
    return MappingFileError(f"target profile {path}: {message}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_sources(path: Path, data: Mapping[str, Any]) -> None:
    sources = data["sources"]
    if not isinstance(sources, dict):
        raise _bad(path, "'sources' must be an object")
    unknown = set(sources) - _SOURCE_KEYS
    missing = {"upstream", "references", "numbers", "unchecked"} - set(sources)
    if unknown or missing:
        raise _bad(path, f"'sources' keys: unknown {sorted(unknown)}, missing {sorted(missing)}")
    refs, numbers, unchecked = sources["references"], sources["numbers"], sources["unchecked"]
    if not isinstance(sources.get("notes", ""), str):
        raise _bad(path, "'sources.notes' must be a string")
    if not isinstance(sources["upstream"], str) or not sources["upstream"].startswith("https://"):
        raise _bad(path, "'sources.upstream' must be an https URL")
    if not isinstance(refs, dict) or not all(isinstance(v, str) and v for v in refs.values()):
        raise _bad(path, "'sources.references' must map ids to descriptions")
    if not isinstance(numbers, dict) or not isinstance(unchecked, list):
        raise _bad(path, "'sources.numbers' must be an object and 'sources.unchecked' a list")
    present = {k for k in NUMBERS if data.get(k) is not None}
    if set(numbers) != present:
        raise _bad(
            path,
            f"'sources.numbers' must cover exactly the numbers given: missing "
            f"{sorted(present - set(numbers))}, extra {sorted(set(numbers) - present)}",
        )
    for key, ids in numbers.items():
        if not isinstance(ids, list) or not ids or not all(i in refs for i in ids):
            raise _bad(path, f"'sources.numbers.{key}' must list ids from 'sources.references'")
    single = sorted(k for k, ids in numbers.items() if len(set(ids)) < 2)
    if sorted(unchecked) != single:
        raise _bad(
            path,
            f"'sources.unchecked' must list exactly the numbers with fewer than two sources: "
            f"{single}, got {sorted(unchecked)}",
        )


def _check_family(path: Path, data: Mapping[str, Any]) -> None:
    from eagle3conv.spec.engines import families, family_for

    family = data["family"]
    if family not in families():
        raise _bad(path, f"'family' is '{family}', not a family of mappings/engines/families.json "
                         f"({', '.join(sorted(families()))})")
    implied = family_for(data["architectures"], data["model_type"])
    if implied is not None and implied != family:
        raise _bad(path, f"'family' is '{family}' but its architectures/model_type belong to '{implied}'")


def _validate(path: Path, data: object) -> TargetProfile:
    if not isinstance(data, dict):
        raise _bad(path, "the top level must be an object")
    unknown, missing = set(data) - _KEYS, _KEYS - set(data)
    if unknown or missing:
        raise _bad(path, f"unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    for key in _STRING_KEYS:
        if not isinstance(data[key], str) or not data[key].strip():
            raise _bad(path, f"'{key}' must be a non-empty string")
    if data["name"] != path.stem:
        raise _bad(path, f"'name' is '{data['name']}' but the file is named {path.name}")
    for key in ("aliases", "architectures"):
        value = data[key]
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise _bad(path, f"'{key}' must be a list of non-empty strings")
    if not data["architectures"]:
        raise _bad(path, "'architectures' must not be empty")
    if data["text_config_key"] is not None and not isinstance(data["text_config_key"], str):
        raise _bad(path, "'text_config_key' must be a string or null")
    for key in NUMBERS:
        value = data[key]
        allowed_null = key in OPTIONAL_NUMBERS
        if not ((_is_int(value) and value > 0) or (value is None and allowed_null)):
            kind = "a positive integer or null" if allowed_null else "a positive integer"
            raise _bad(path, f"'{key}' must be {kind}, got {value!r}")
    _check_sources(path, data)
    _check_family(path, data)
    return TargetProfile(
        name=data["name"],
        aliases=tuple(data["aliases"]),
        description=data["description"],
        hf_repo=data["hf_repo"],
        architectures=tuple(data["architectures"]),
        model_type=data["model_type"],
        text_config_key=data["text_config_key"],
        family=data["family"],
        sources=MappingProxyType(data["sources"]),
        **{key: data[key] for key in NUMBERS},
    )


def load_target_file(path: str | Path) -> TargetProfile:
    """Load and validate one profile file. Raises :class:`MappingFileError`."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _bad(path, f"cannot be read as JSON: {err}") from err
    return _validate(path, data)


def _keys_of(profile: TargetProfile) -> list[str]:
    names = [profile.name, *profile.aliases]
    if profile.hf_repo:
        names.append(profile.hf_repo)
    return [n.lower() for n in names]


@cache
def index_targets(folder: Path) -> tuple[tuple[TargetProfile, ...], Mapping[str, TargetProfile]]:
    """The profiles of a folder of target files, and each lowercased name/alias/repo -> profile;
    a key two profiles claim raises MappingFileError. Cached per folder."""
    profiles = tuple(
        load_target_file(p) for p in sorted(folder.glob("*.json"), key=lambda p: p.stem)
    )
    by_key: dict[str, TargetProfile] = {}
    for profile in profiles:
        for key in _keys_of(profile):
            other = by_key.setdefault(key, profile)
            if other is not profile:
                raise MappingFileError(
                    f"target name or alias '{key}' is claimed by both "
                    f"{other.name} and {profile.name}"
                )
    return profiles, MappingProxyType(by_key)


def _targets_folder() -> Path:
    return data_path("targets")


def list_targets() -> tuple[TargetProfile, ...]:
    """Every built-in profile, sorted by name."""
    return index_targets(_targets_folder())[0]


def target_names() -> tuple[str, ...]:
    """The built-in profile names (for CLI choices)."""
    return tuple(p.name for p in list_targets())


def get_target(name_or_alias: str) -> TargetProfile:
    """A built-in profile by name, alias or Hugging Face repo id (case-insensitive)."""
    found = index_targets(_targets_folder())[1].get(name_or_alias.strip().lower())
    if found is None:
        raise UsageError(
            f"unknown target '{name_or_alias}'; known targets: {', '.join(target_names())}",
            hint="or give the path of the target's config.json or model folder",
        )
    return found


# --------------------------------------------------------------------------- config.json


def _config_file(path: Path) -> Path:
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise CheckpointReadError(
            f"no target config at {file}",
            hint="pass a model folder holding config.json, or the file itself",
        )
    return file


def _read_json(file: Path) -> dict[str, Any]:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise CheckpointReadError(
            f"{file} is not a text file: --target wants a target's config.json, its model folder, "
            "or a built-in profile name", hint="eagle3conv targets lists the built-in profiles") from None
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointReadError(f"cannot read {file} as JSON: {err}") from err
    if not isinstance(data, dict):
        raise CheckpointReadError(f"{file} is not a JSON object")
    return data


def _text_part(raw: Mapping[str, Any]) -> tuple[str | None, Mapping[str, Any]]:
    for key in _TEXT_CONFIG_KEYS:
        if isinstance(raw.get(key), dict):
            return key, raw[key]
    return None, raw


def _from_transformers(file: Path, text_raw: Mapping[str, Any]) -> dict[str, Any] | None:
    """The numbers as transformers reads them (attribute maps, derived head_dim), or None
    when transformers does not know the model type. Only numbers the file itself
    declares are taken, so no library default slips in."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(
            str(file), local_files_only=True, trust_remote_code=False
        )
    except Exception as err:  # unknown model_type, remote code, a transformers quirk
        log.debug("transformers cannot read %s (%s); reading the JSON itself", file, err)
        return None
    text = config.get_text_config()
    spelled = getattr(text, "attribute_map", {})  # standard name -> the name the file uses

    def declared(key: str) -> bool:
        return key in text_raw or spelled.get(key) in text_raw

    # MLA has no single head size (transformers reports the rope dim as head_dim).
    derive_head_dim = declared("num_attention_heads") and "kv_lora_rank" not in text_raw
    return {
        key: getattr(text, key, None)
        for key in NUMBERS
        if declared(key) or (key == "head_dim" and derive_head_dim)
    }


def target_from_config(path: str | Path) -> TargetProfile:
    """A profile read from a target's config.json (a file, or a folder holding one).

    transformers' ``AutoConfig`` (offline, no remote code) reads it where it can;
    otherwise the JSON is read directly, taking the language model's numbers from a
    nested ``text_config`` (Kimi-K2.5) when there is one. The name is the folder's.
    Raises :class:`CheckpointReadError` for a missing or malformed config.
    """
    path = Path(path)
    file = _config_file(path)
    raw = _read_json(file)
    text_key, text_raw = _text_part(raw)
    numbers = _from_transformers(file, text_raw) or {k: text_raw.get(k) for k in NUMBERS}
    missing = [k for k in REQUIRED_NUMBERS if numbers.get(k) is None]
    if missing:
        where = f"'{text_key}' of {file}" if text_key else str(file)
        raise CheckpointReadError(
            f"{where} has no {', '.join(missing)}: is it a language model's config?"
        )
    for key in NUMBERS:
        value = numbers.get(key)
        if value is not None and not (_is_int(value) and value > 0):
            raise CheckpointReadError(f"{file}: '{key}' must be a positive integer, got {value!r}")
    if numbers["num_hidden_layers"] > MAX_LAYERS:  # every range over the target's layers stays small
        raise CheckpointReadError(f"{file}: 'num_hidden_layers' is {numbers['num_hidden_layers']}; eagle3conv "
                                  f"takes a target of at most {MAX_LAYERS} layers")
    values: dict[str, Any] = {key: numbers.get(key) for key in NUMBERS}
    architectures = raw.get("architectures") or ()
    from eagle3conv.spec.engines import family_for

    model_types = [m for m in (raw.get("model_type"), text_raw.get("model_type")) if isinstance(m, str)]
    family = family_for([a for a in architectures if isinstance(a, str)], *model_types)
    folder = file.parent.resolve()
    name = folder.name if file.name == "config.json" else file.stem
    return TargetProfile(
        name=name,
        description=f"read from {file}",
        architectures=tuple(str(a) for a in architectures),
        model_type=raw.get("model_type"),
        text_config_key=text_key,
        family=family,
        sources=MappingProxyType({"config": str(file)}),
        **values,
    )
