"""Layer alignment ("channels") between a source and a target model (method.md §3).

A channel is a pair (source layer, target layer); a window of channels is strictly increasing in both.
The proxy window search over depth-ratio candidates lives with training (mot_viz.train.train).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class Channels:
    """An injection window: source layers feed target layers, pairwise."""

    source_layers: tuple[int, ...]
    target_layers: tuple[int, ...]

    def __post_init__(self):
        if len(self.source_layers) != len(self.target_layers) or not self.source_layers:
            raise ConfigError("channels need the same, non-zero number of source and target layers")
        for seq in (self.source_layers, self.target_layers):
            if any(b <= a for a, b in zip(seq, seq[1:])):
                raise ConfigError(f"channel layers must be strictly increasing, got {seq}")

    @property
    def window(self) -> int:
        return len(self.target_layers)

    @property
    def start(self) -> int:
        """t_0: the first injected target layer."""
        return self.target_layers[0]

    @property
    def end(self) -> int:
        """t_{W-1}: the last injected target layer."""
        return self.target_layers[-1]

    def pairs(self) -> list[tuple[int, int]]:
        return list(zip(self.source_layers, self.target_layers))

    def to_json(self) -> list[dict]:
        return [{"src_layer_idx": s, "dst_layer_idx": t} for s, t in self.pairs()]

    @classmethod
    def from_json(cls, rows: list[dict]) -> "Channels":
        return cls(tuple(r["src_layer_idx"] for r in rows), tuple(r["dst_layer_idx"] for r in rows))


def injection_channels(num_source_layers: int, num_target_layers: int, start: int, window: int) -> Channels:
    """Target layers start..start+window-1, source layers aligned by depth from the top."""
    if window < 1 or start < 0 or start + window - 1 >= num_target_layers:
        raise ConfigError(
            f"injection window start={start}, size={window} does not fit a target with {num_target_layers} layers; "
            f"valid starts are 0..{num_target_layers - window}"
        )
    s0 = num_source_layers - 1 - (num_target_layers - 1 - start)
    if s0 < 0 or s0 + window - 1 >= num_source_layers:
        raise ConfigError(
            f"injection start {start} maps to source layer {s0}, outside the source's {num_source_layers} layers; "
            "choose a later start or a smaller window"
        )
    return Channels(tuple(range(s0, s0 + window)), tuple(range(start, start + window)))


def window_size(n: int, ratio: float) -> int:
    """clamp(round(n · ratio), 1, n) with Python's half-to-even round (method.md §3)."""
    return min(max(round(n * ratio), 1), n)


def terminal_channels(num_source_layers: int, num_target_layers: int, ratio: float) -> Channels:
    """The top w layers of each model, w = clamp(round(min(L_S, L_T) · ratio), 1, min)."""
    w = window_size(min(num_source_layers, num_target_layers), ratio)
    return Channels(
        tuple(range(num_source_layers - w, num_source_layers)),
        tuple(range(num_target_layers - w, num_target_layers)),
    )


def depth_candidates(num_layers: int, n: int) -> list[int]:
    """n strictly increasing layer indices of a num_layers model, spread by relative depth."""
    if n == 1:
        return [num_layers - 1]
    out, prev = [], -1
    for p in range(n):
        proposal = round(p / (n - 1) * (num_layers - 1))
        idx = min(max(proposal, prev + 1), num_layers - 1 - (n - 1 - p))
        out.append(idx)
        prev = idx
    return out


def depth_ratio_candidates(num_source_layers: int, num_target_layers: int) -> list[tuple[int, int]]:
    """Candidate channels paired position by position; the smaller model gets the identity list."""
    n = min(num_source_layers, num_target_layers)
    return list(zip(depth_candidates(num_source_layers, n), depth_candidates(num_target_layers, n)))


def depth_ratio_window(num_source_layers: int, num_target_layers: int, start: int, size: int) -> Channels:
    """A contiguous run of `size` depth-ratio candidates beginning at candidate `start`."""
    cands = depth_ratio_candidates(num_source_layers, num_target_layers)
    if start < 0 or size < 1 or start + size > len(cands):
        raise ConfigError(f"depth-ratio window start={start}, size={size} outside 0..{len(cands)} candidates")
    chosen = cands[start : start + size]
    return Channels(tuple(s for s, _ in chosen), tuple(t for _, t in chosen))


def window_size_range(num_source_layers: int, num_target_layers: int, min_ratio: float, max_ratio: float) -> tuple[int, int]:
    """(m_min, m_max) of the depth-ratio window search."""
    if not (max_ratio >= min_ratio > 0):
        raise ConfigError("need max_window_size_ratio >= min_window_size_ratio > 0")
    n = min(num_source_layers, num_target_layers)
    m_min = min(max(1, round(n * min_ratio)), n)
    m_max = min(max(m_min, round(n * max_ratio)), n)
    return m_min, m_max


def sparse_source_layer(channels: Channels, target_layer: int, num_source_layers: int) -> int:
    """The source layer whose attention gives target_layer its sparse indices (piecewise-linear, method.md §6)."""
    pairs = channels.pairs()
    if len(pairs) == 1:
        return pairs[0][0]
    if target_layer <= pairs[0][1]:
        (s_l, t_l), (s_r, t_r) = pairs[0], pairs[1]
    elif target_layer >= pairs[-1][1]:
        (s_l, t_l), (s_r, t_r) = pairs[-2], pairs[-1]
    else:
        i = max(i for i, (_, t) in enumerate(pairs[:-1]) if t <= target_layer)
        (s_l, t_l), (s_r, t_r) = pairs[i], pairs[i + 1]
    src = s_l if t_r == t_l else round(s_l + (target_layer - t_l) / (t_r - t_l) * (s_r - s_l))
    return min(max(src, 0), num_source_layers - 1)
