"""Name resolution: "13b" -> ModelSpec, "dgx-h100" -> hardware_profiles/dgx-h100.yaml.

Owns lookup and the "unknown name, here is what exists" errors; no shapes or hardware
numbers live here (see zsim.spec.presets and hardware_profiles/)."""

from __future__ import annotations

import difflib
import math
from importlib.resources import files
from pathlib import Path

from zsim.errors import ConfigError
from zsim.spec.hardware import HardwareProfile
from zsim.spec.hf_config import read_hf_config
from zsim.spec.model import ModelSpec, synthetic
from zsim.spec.presets import ALIASES, HF_IDS, PRESETS

PROFILES_DIR = Path(str(files("zsim.hardware_profiles")))
"""Shipped hardware profiles: the repository's hardware_profiles/ folder, installed as the
data package zsim.hardware_profiles (pyproject.toml)."""

DEFAULT_HARDWARE = "dgx-h100"


def model_names() -> list[str]:
    """Preset names followed by their short aliases."""
    return list(PRESETS) + list(ALIASES)


def resolve_model(name: str | None = None, *, params: float | None = None) -> ModelSpec:
    """A preset or alias name, the Hugging Face hub id of a preset's checkpoint
    ("meta-llama/Llama-2-13b-hf", any case), a path to a HuggingFace config.json
    (zsim.spec.hf_config), or a synthetic model of exactly `params` parameters.

    Raises:
        ConfigError: unknown name (the message suggests the nearest preset), an
            unreadable or unmodelled config, or neither/both of name and params given.
    """
    if (name is None) == (params is None):
        raise ConfigError("model", name, "give exactly one of --model or --params")
    if params is not None:
        if isinstance(params, bool) or not math.isfinite(params) or params != int(params) \
                or params <= 0:
            raise ConfigError("params", params, "must be a positive whole number")
        return synthetic(int(params))
    assert name is not None
    key = name.lower()
    key = ALIASES.get(key, HF_IDS.get(key, key))
    if key in PRESETS:
        return PRESETS[key]
    if name.endswith(".json") or Path(name).is_file():
        return read_hf_config(Path(name))
    raise ConfigError("model", name, _unknown_model(name))


def _unknown_model(name: str) -> str:
    """Why `name` resolves to nothing: the nearest preset by spelling (difflib, over
    names, aliases and hub ids) where one is near, and what else works."""
    known = [*model_names(), *HF_IDS]
    # 0.85: a typo of a name (llama-2-13 for llama2-13b, 0.9), not another model spelt
    # alike (mistral-7b is 0.82 from mixtral-8x7b).
    near = difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.85)
    hint = ""
    if near:
        preset = ALIASES.get(near[0], HF_IDS.get(near[0], near[0]))
        hint = f"nearest preset: {preset}; "
    return (f"unknown model; {hint}give a preset (`zsim models` lists them) or a path to "
            "a Hugging Face config.json")


def hardware_names() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def resolve_hardware(name: str) -> HardwareProfile:
    """A profile name from hardware_profiles/ or a path to a profile YAML.

    Raises:
        ConfigError: unknown name (the message lists profiles) or a bad profile file.
    """
    path = PROFILES_DIR / f"{name}.yaml"
    if path.is_file():
        return HardwareProfile.from_yaml(path)
    if name.endswith((".yaml", ".yml")) and Path(name).is_file():
        return HardwareProfile.from_yaml(Path(name))
    raise ConfigError("hardware", name, f"unknown hardware; known: {', '.join(hardware_names())}")
