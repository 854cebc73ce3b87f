"""A checkpoint a way of sharing reads beside the MoT (--direct, --linear, --second), read and checked before any model
loads."""

from __future__ import annotations

from collections.abc import Callable

from ..engine.checkpoint import read_config
from ..errors import CheckpointError, MotVizError


def checked_config(flag: str, path: str) -> dict:
    """read_config of the checkpoint passed as `flag`, any failure raised as CheckpointError naming the flag."""
    try:
        return read_config(path)
    except (MotVizError, OSError, ValueError) as exc:
        raise CheckpointError(f"{flag} {path}: {exc} Pass a checkpoint folder written by MoT Viz "
                              "(config.json + translator.safetensors), e.g. pretrained/smollm2-to-gemma3.") from exc


def full_depth(config: dict) -> bool:
    """Whether a checkpoint's config translates every target layer (what replay 'none' needs)."""
    return [c["dst_layer_idx"] for c in config["channels"]] == list(range(config["target"]["num_layers"]))


def same_pair(config: dict, other: dict) -> bool:
    """Whether two checkpoints' configs were made for one model pair (their models' fingerprints)."""
    return all(other[k].get("fingerprint") == config[k].get("fingerprint") for k in ("source", "target"))


def first_offered(folders, accept: Callable[[dict], bool], skip: str | None = None,
                  read: Callable[[str], dict] = read_config):
    """The first checkpoint folder of `folders` (other than `skip`) whose config.json (as `read` reads it: a MoT
    checkpoint's by default) `accept` takes; one that does not read is passed over (the app offers the others)."""
    for folder in folders:
        if folder == skip:
            continue
        try:
            config = read(folder)
        except MotVizError:
            continue
        if accept(config):
            return folder
    return None
