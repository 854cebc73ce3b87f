"""How the target replays a context with the injected window (method.md §6), or does not (a full-depth map,
method.md §15): the setting a MoT checkpoint carries, and the modes an evaluation may replay it under."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass
class ReplayConfig:
    """How the target replays the context with the injected window (method.md §6)."""

    topk_sparse_attn: int | None = 32  # k of sparse attention; None replays densely everywhere
    num_bottom_full_attn: int = 2  # layers below this stay dense (window layers are always sparse)
    # no replay (method.md §15, full-depth mapping): the translated K/V of every target layer are the target's cache
    # as they are, after its own BOS prefix; the target never runs over the context. Needs a window of every layer.
    direct: bool = False

    def __post_init__(self):
        if self.topk_sparse_attn is not None and self.topk_sparse_attn < 1:
            raise ConfigError("topk_sparse_attn must be >= 1 (or None for dense replay)")
        if self.num_bottom_full_attn < 0:
            raise ConfigError("num_bottom_full_attn must be >= 0")


REPLAY_MODES = ("checkpoint", "dense", "sparse", "none")


def replay_mode(replay: ReplayConfig, mode: str) -> ReplayConfig:
    """A checkpoint's replay under a mode: its own ("checkpoint"), dense everywhere, the method's sparse
    default (top-32 from layer 2 up, method.md §6), or none (the translated K/V are the cache: ReplayConfig.direct,
    for a window of every target layer). Whether sparse replay suits a pair is measured per pair."""
    if mode not in REPLAY_MODES:
        raise ConfigError(f"replay mode must be one of {', '.join(REPLAY_MODES)}, not '{mode}'")
    return {"checkpoint": replay, "dense": ReplayConfig(topk_sparse_attn=None), "sparse": ReplayConfig(),
            "none": ReplayConfig(topk_sparse_attn=None, direct=True)}[mode]
