"""A network trained here for another way of sharing (method.md §15: C2C's projection path, LSC's shared latent
space, Interlat's latent hand-off) as a checkpoint: config.json + weights.safetensors, made for one model pair; and
the networks by name (each defined in its own module of this wing: c2c, lsc, interlat).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..engine.checkpoint import spec_from_json, swap_into_place
from ..engine.models import ModelSpec
from ..errors import CheckpointError, ConfigError
from . import c2c, interlat, lsc
from .rival_caches import KEY_SPACES

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.safetensors"
FORMAT = "mot-viz-way-of-sharing"


@dataclass(frozen=True)
class Network:
    """How a trained way of sharing builds its network: `build(source, target, architecture)` → nn.Module, and the
    architecture's defaults (its paper's recipe, or this project's recorded departure from it)."""

    build: Callable[[ModelSpec, ModelSpec, dict], nn.Module]
    defaults: dict


NETWORKS: dict[str, Network] = {name: Network(*made) for m in (c2c, lsc, interlat) for name, made in m.NETWORKS.items()}


def network(name: str) -> Network:
    if name not in NETWORKS:
        raise ConfigError(f"no way of sharing named {name!r} is trained here: choose from {' '.join(NETWORKS)}.")
    return NETWORKS[name]


def architecture(name: str, given: dict | None = None) -> dict:
    """A way's architecture settings: its defaults updated by `given` (an unknown key refused)."""
    defaults = network(name).defaults
    unknown = sorted(set(given or {}) - set(defaults))
    if unknown:
        raise ConfigError(f"{name} has no architecture setting {', '.join(unknown)}: choose from "
                          f"{', '.join(defaults)}.")
    arch = {**defaults, **(given or {})}
    if "key_space" in arch and arch["key_space"] not in KEY_SPACES:
        raise ConfigError(f"key_space {arch['key_space']!r}: choose from {' '.join(KEY_SPACES)}.")
    return arch


@dataclass
class TrainedCheckpoint:
    """A trained way of sharing for one model pair: its network and what config.json records of it."""

    method: str
    source: ModelSpec
    target: ModelSpec
    architecture: dict
    net: nn.Module
    training: dict
    metrics: dict

    @classmethod
    def new(cls, method: str, source: ModelSpec, target: ModelSpec, arch: dict | None = None,
            training: dict | None = None) -> "TrainedCheckpoint":
        arch = architecture(method, arch)
        return cls(method, source, target, arch, network(method).build(source, target, arch), training or {}, {})

    def config(self) -> dict:
        return {"format": FORMAT, "method": self.method, "source": self.source.to_json(),
                "target": self.target.to_json(), "architecture": self.architecture, "training": self.training,
                "metrics": self.metrics}

    def write(self, folder: str | Path, dtype: torch.dtype = torch.float16) -> Path:
        """config.json + weights.safetensors into `folder` (made here)."""
        folder = Path(folder)
        folder.mkdir(parents=True)
        state = {k: v.detach().to(dtype).contiguous() for k, v in self.net.state_dict().items()}
        save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": FORMAT})
        (folder / CONFIG_FILE).write_text(json.dumps(self.config(), indent=2))
        return folder

    def save(self, folder: str | Path, dtype: torch.dtype = torch.float16) -> Path:
        """write() whole or not at all (a temporary folder swapped into place); fp16 by default: what is shipped."""
        folder = Path(folder)
        tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        self.write(tmp, dtype)
        return swap_into_place(tmp, folder, overwrite=True)


def read_trained_config(path: str | Path, flag: str = "") -> dict:
    """A trained way of sharing's config.json, checked to be one (CheckpointError naming `flag` otherwise)."""
    where = f"{flag} {path}".strip()
    file = Path(path) / CONFIG_FILE
    try:
        config = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{where}: no readable {CONFIG_FILE} ({exc}). Pass a folder written by python -m "
                              "mot_viz.train.rival, e.g. pretrained/smollm2-to-gemma3-c2c-pr.") from exc
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise CheckpointError(f"{where} is not a trained way of sharing (its {CONFIG_FILE} lacks format "
                              f"{FORMAT!r}); pass a folder written by python -m mot_viz.train.rival.")
    return config


def is_trained_folder(path: str | Path) -> bool:
    """Whether `path` holds a network of another way of sharing trained here (not a MoT checkpoint)."""
    try:
        config = json.loads((Path(path) / CONFIG_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(config, dict) and config.get("format") == FORMAT


def load_trained(path: str | Path, source: ModelSpec | None = None, target: ModelSpec | None = None,
                 expect: str | None = None) -> TrainedCheckpoint:
    """A trained way of sharing's checkpoint (float32 weights), checked against the models it will run with."""
    config = read_trained_config(path)
    if expect and config["method"] != expect:
        raise CheckpointError(f"{path} holds a {config['method']} network, not {expect}.")
    for role, spec in (("source", source), ("target", target)):
        if spec is not None and config[role]["fingerprint"] != spec.fingerprint:
            raise CheckpointError(f"{path} was trained for the {role} {config[role]['name']}, not {spec.name}.")
    ckpt = TrainedCheckpoint.new(config["method"], spec_from_json(config["source"]), spec_from_json(config["target"]),
                                 config["architecture"], config.get("training"))
    ckpt.metrics = config.get("metrics") or {}
    state = load_file(str(Path(path) / WEIGHTS_FILE))
    ckpt.net.load_state_dict({k: v.float() for k, v in state.items()})
    ckpt.net.eval()
    return ckpt


