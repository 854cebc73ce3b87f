"""Translators: the cross-layer window translator, the per-token router and their mixture (method.md §4–§5)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from ..errors import ConfigError
from .direct_map import (PerLayerLinear, check_source_lists, listed_inputs, per_layer_reads, source_lists,
                         source_positions)


@dataclass
class TranslatorConfig:
    """Shape of one edge's translator pair (K and V each get their own modules)."""

    source_kv_hidden: int  # H_S = n_kv·d_h of the source
    target_kv_hidden: int  # H_T of the target
    window: int  # W, number of channels
    dim: int = 128  # D, translator width (reference 1024; CPU-scale default, method.md §12)
    heads: int = 4  # attention heads over the token axis; D % heads == 0
    depth: int = 1  # R, recurrent stages over the window
    mlp_ratio: int = 2  # FFN width multiplier r
    variant: str = "mot"  # "mot" (mixture of experts), "single" (one expert) or "linear" (closed-form ridge map only)
    num_experts: int = 4  # E, experts per K/V path (mot only)
    top_k: int = 2  # experts kept per token before the softmax
    output_activation: str = "gelu"  # "gelu" (reference, bounds outputs at ≈ -0.17) or "none"
    linear_residual: bool = False  # mot/single: add a linear map of the window (K and V) to the experts' output
    key_space: str = "post_rope"  # "post_rope" (method.md) or "pre_rope": keys translated before rotation
    # the linear map (variant linear, or a mixture's linear path) also reads the aligned source K and V of this many
    # tokens before each token (zeros before the context starts), each projected on linear_previous_dims principal
    # axes of the bank's token features (0: unprojected). 0: the token alone (method.md §13).
    linear_previous: int = 0
    linear_previous_dims: int = 0
    # source layers beyond the channel list whose aligned K and V the linear map also reads (more of the
    # source's depth at once); the experts and the router read the channel list's layers only (method.md §4–§5).
    linear_extra_layers: tuple[int, ...] = ()
    linear_extra_dims: int = 0  # the extra layers' K and V projected on this many principal axes of the bank (0: not)
    # the map's K and V outputs each confined to this many principal directions of its fitted values on the bank
    # (reduced-rank ridge, mot_viz.train.ridge), its weights stored as two factors; 0: full rank
    linear_rank: int = 0
    # the linear map block-diagonal: each window target layer's K and V from its own channel's source K and V only
    # (a map per layer, as the full-depth closed-form map of method.md §15 fits them)
    linear_per_layer: bool = False
    # a per-layer map's source layers by window layer (the full-depth top-k map of method.md §15): window layer w's K
    # from the K of linear_key_sources[w]'s source layers, its V from the V of linear_value_sources[w]'s, the same
    # number k for every layer, each layer among the translator's inputs (MoT.input_layers). Empty: each window
    # layer's own source K and V together.
    linear_key_sources: tuple[tuple[int, ...], ...] = ()
    linear_value_sources: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self):
        limits = {"source_kv_hidden": 65536, "target_kv_hidden": 65536, "window": 512, "dim": 16384, "heads": 256,
                  "depth": 64, "mlp_ratio": 64, "num_experts": 256}  # far above any real model: catches garbage
        for name, high in limits.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
                raise ConfigError(f"translator {name} must be an integer in [1, {high}], got {value!r}")
        if self.dim % self.heads:
            raise ConfigError(f"translator dim {self.dim} must be divisible by heads {self.heads}")
        if self.variant not in ("mot", "single", "linear"):
            raise ConfigError(f"variant must be 'mot', 'single' or 'linear', got '{self.variant}'")
        if self.key_space not in ("post_rope", "pre_rope"):
            raise ConfigError(f"key_space must be 'post_rope' or 'pre_rope', got '{self.key_space}'")
        if self.variant == "mot" and not 1 <= self.top_k <= self.num_experts:
            raise ConfigError(f"need 1 <= top_k <= num_experts, got top_k={self.top_k}, E={self.num_experts}")
        if not (isinstance(self.linear_previous, int) and 0 <= self.linear_previous <= 64
                and isinstance(self.linear_previous_dims, int) and 0 <= self.linear_previous_dims <= 65536):
            raise ConfigError("linear_previous must be an integer in [0, 64] and linear_previous_dims in [0, 65536], "
                              f"got {self.linear_previous!r} and {self.linear_previous_dims!r}")
        if self.output_activation not in ("gelu", "none"):
            raise ConfigError(f"output_activation must be 'gelu' or 'none', got '{self.output_activation}'")
        extra = self.linear_extra_layers
        if not (isinstance(extra, (list, tuple)) and all(isinstance(l, int) and not isinstance(l, bool) and l >= 0
                                                         for l in extra) and len(set(extra)) == len(extra)):
            raise ConfigError(f"linear_extra_layers must be distinct source layer indices, got {extra!r}")
        self.linear_extra_layers = tuple(extra)  # JSON gives a list
        if not (isinstance(self.linear_extra_dims, int) and 0 <= self.linear_extra_dims <= 65536):
            raise ConfigError(f"linear_extra_dims must be an integer in [0, 65536], got {self.linear_extra_dims!r}")
        if not (isinstance(self.linear_rank, int) and 0 <= self.linear_rank <= 65536):
            raise ConfigError(f"linear_rank must be an integer in [0, 65536], got {self.linear_rank!r}")
        if self.linear_extra_dims and not extra:
            raise ConfigError("linear_extra_dims projects linear_extra_layers: give the layers too, or leave it 0")
        if extra and not (self.variant == "linear" or self.linear_residual):
            raise ConfigError("linear_extra_layers are read by the linear map only: use variant 'linear' or "
                              "linear_residual=True (init 'linear'), or leave them empty")
        self.linear_key_sources = source_lists(self.linear_key_sources)
        self.linear_value_sources = source_lists(self.linear_value_sources)
        if self.linear_per_layer and (self.variant != "linear" or (extra and not self.linear_key_sources)
                                      or self.linear_previous or self.linear_rank):
            raise ConfigError("linear_per_layer maps each window layer from its own source layer: it needs variant "
                              "'linear' without linear_extra_layers (unless its source layers are listed), "
                              "linear_previous or linear_rank")
        check_source_lists(self.linear_key_sources, self.linear_value_sources, self.window, self.linear_per_layer)

    @property
    def source_count(self) -> int:
        """k: the source layers each window layer of a per-layer map reads (1: its own, K and V together)."""
        return len(self.linear_key_sources[0]) if self.linear_key_sources else 1

    @property
    def factored_rank(self) -> int:
        """The rank the linear map's weights are factored at: linear_rank where it is below the map's outputs
        (window · target K/V width), else 0 (one full matrix per K/V path)."""
        return self.linear_rank if 0 < self.linear_rank < self.window * self.target_kv_hidden else 0

    def to_json(self) -> dict:
        return asdict(self)


class CrossAttentionBlock(nn.Module):
    """Pre-LN cross-attention of a query stream over one layer's context stream, then an FFN."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.query_norm = nn.LayerNorm(dim)
        self.context_norm = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ffn_norm = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, query: torch.Tensor, context: torch.Tensor) -> torch.Tensor:  # (B, N, D) each
        c = self.context_norm(context)
        # no mask: the translator sees the whole context at once (method.md §4, deliberate)
        query = query + self.attn(self.query_norm(query), c, c, need_weights=False)[0]
        return query + self.ffn(self.ffn_norm(query))


class CrossLayerWindowTranslator(nn.Module):
    """Maps an aligned source block [B, N, W, H_S] to a target block [B, N, W, H_T] (method.md §4)."""

    def __init__(self, cfg: TranslatorConfig):
        super().__init__()
        self.window = cfg.window
        self.out_hidden = cfg.target_kv_hidden
        self.input_norm = nn.LayerNorm(cfg.source_kv_hidden)
        self.input_proj = nn.Linear(cfg.source_kv_hidden, cfg.dim)  # shared by all W layers
        self.recurrent_blocks = nn.ModuleList(
            nn.ModuleList(CrossAttentionBlock(cfg.dim, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.window))
            for _ in range(cfg.depth)
        )
        self.output_norm = nn.LayerNorm(cfg.window * cfg.dim)
        self.output_proj = nn.Linear(cfg.window * cfg.dim, cfg.window * cfg.target_kv_hidden)
        self.output_act = nn.GELU() if cfg.output_activation == "gelu" else nn.Identity()

    def forward(self, x: torch.Tensor, queries: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, N, W, H_S] -> [B, M, W, H_T] for the M token positions in `queries` (all N when None).

        Every token is context for every query, and a query's stream never reads another query's, so the
        output at a position does not depend on which other positions are computed (sparse expert dispatch).
        """
        b, n, w, _ = x.shape
        p = nn.functional.gelu(self.input_proj(self.input_norm(x)))  # (B, N, W, D)
        h = p[:, :, 0] if queries is None else p[:, queries, 0]
        for stage in self.recurrent_blocks:
            outputs = []
            for i, block in enumerate(stage):
                h = block(h, p[:, :, i])
                outputs.append(h)
        fused = torch.cat(outputs, dim=-1)  # (B, M, W·D), last stage only
        return self.output_act(self.output_proj(self.output_norm(fused))).view(b, h.shape[1], w, self.out_hidden)


@dataclass
class Routing:
    """Per-token routing of one mixture."""

    logits: torch.Tensor  # [B, N, E]
    gates: torch.Tensor  # [B, N, E], softmax over the kept top-k, zeros elsewhere


@dataclass(frozen=True)
class GateOverride:
    """A what-if on every token's gates (the Expert routing page): the router's own choice, one expert forced,
    one expert dropped (the router's top-k among the others), or uniform gates over all experts."""

    mode: str = "router"  # router | force | drop | uniform
    expert: int | None = None  # force / drop: which expert

    def __post_init__(self):
        if self.mode not in ("router", "force", "drop", "uniform"):
            raise ConfigError(f"gate override mode must be router, force, drop or uniform, not '{self.mode}'")
        if (self.mode in ("force", "drop")) != (self.expert is not None):
            raise ConfigError("force and drop need an expert index; router and uniform take none")

    def gates(self, logits: torch.Tensor, top_k: int) -> torch.Tensor:
        """Gates [B, N, E] from router logits [B, N, E] under this override."""
        num_experts = logits.shape[-1]
        if self.expert is not None and not 0 <= self.expert < num_experts:
            raise ConfigError(f"expert {self.expert} does not exist: this mixture has experts 0–{num_experts - 1}")
        if self.mode == "force":
            return nn.functional.one_hot(torch.full(logits.shape[:-1], self.expert, device=logits.device),
                                         num_experts).to(logits.dtype)
        if self.mode == "uniform":
            return torch.full_like(logits, 1.0 / num_experts)
        if self.mode == "drop":
            logits = logits.clone()
            logits[..., self.expert] = float("-inf")
            top_k = min(top_k, num_experts - 1)
        return top_k_gates(logits, top_k)


def top_k_gates(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Softmax over each token's top-k logits, zeros elsewhere (method.md §5)."""
    if top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits.softmax(dim=-1)


class Router(nn.Module):
    """Per-token gate over E experts from the flattened aligned source block (method.md §5)."""

    def __init__(self, in_features: int, dim: int, num_experts: int, top_k: int):
        super().__init__()
        hidden = max(64, min(dim, in_features))
        self.net = nn.Sequential(nn.LayerNorm(in_features), nn.Linear(in_features, hidden), nn.GELU(),
                                 nn.Linear(hidden, num_experts))
        self.top_k = top_k

    def forward(self, x: torch.Tensor, override: GateOverride | None = None) -> Routing:  # x: (B, N, W, H_S)
        logits = self.net(x.flatten(2))  # (B, N, E)
        gates = top_k_gates(logits, self.top_k) if override is None else override.gates(logits, self.top_k)
        return Routing(logits=logits, gates=gates)


class MixtureOfTranslators(nn.Module):
    """E window translators mixed per token by a router; each expert computes only the tokens routed to it."""

    def __init__(self, cfg: TranslatorConfig):
        super().__init__()
        self.translators = nn.ModuleList(CrossLayerWindowTranslator(cfg) for _ in range(cfg.num_experts))
        self.router = Router(cfg.window * cfg.source_kv_hidden, cfg.dim, cfg.num_experts, cfg.top_k)

    def forward(self, x: torch.Tensor, override: GateOverride | None = None) -> tuple[torch.Tensor, Routing | None]:
        if len(self.translators) == 1:
            return self.translators[0](x), None
        routing = self.router(x, override)
        rows = []
        for row in range(x.shape[0]):
            context = x[row : row + 1]
            mixed = None
            for expert, translator in enumerate(self.translators):
                gate = routing.gates[row, :, expert]  # (N,)
                routed = gate.nonzero().squeeze(-1)  # top-k leaves the other tokens' gates at exactly 0
                if routed.numel() == 0:
                    continue
                weighted = translator(context, routed)[0] * gate[routed, None, None]  # (M, W, H_T)
                if mixed is None:
                    mixed = weighted.new_zeros(x.shape[1], *weighted.shape[1:])
                mixed = mixed.index_add(0, routed, weighted)
            rows.append(mixed)
        return torch.stack(rows), routing


class LinearKVMap(nn.Module):
    """An affine map from the aligned source window's K and V together to the target window's K and to its V.

    The closed-form baseline (method.md §13, "Linear"): its weights are fitted by ridge regression
    (mot_viz.train.ridge); inside a mixture it is the residual path the experts refine (``linear_residual``).
    With ``linear_previous`` it also reads the tokens before each token (:func:`previous_features`).
    """

    def __init__(self, cfg: TranslatorConfig):
        super().__init__()
        self.per_layer = cfg.linear_per_layer
        extra_features = 2 * len(cfg.linear_extra_layers) * cfg.source_kv_hidden
        # (linear_extra_dims is 0 without extra layers: TranslatorConfig checks)
        token_features = 2 * cfg.window * cfg.source_kv_hidden + (cfg.linear_extra_dims or extra_features)
        if extra_features and cfg.linear_extra_dims:  # fitted with the map (fit.fit_linear), saved with it
            self.register_buffer("extra_basis", torch.zeros(extra_features, cfg.linear_extra_dims))
        else:
            self.extra_basis = None
        self.previous = cfg.linear_previous
        n_features = token_features + self.previous * (cfg.linear_previous_dims or token_features)
        self.window, self.out_hidden = cfg.window, cfg.target_kv_hidden
        if self.previous and cfg.linear_previous_dims:  # fitted with the map (fit.fit_linear), saved with it
            self.register_buffer("previous_basis", torch.zeros(token_features, cfg.linear_previous_dims))
        else:
            self.previous_basis = None
        out, rank = cfg.window * cfg.target_kv_hidden, cfg.factored_rank
        # reduced rank: features -> rank (key_down) -> window (key_proj); fitted by fit.fit_linear
        self.key_down = nn.Linear(n_features, rank, bias=False) if rank else None
        self.value_down = nn.Linear(n_features, rank, bias=False) if rank else None
        self.key_sources = self.value_sources = None  # input positions [W, k] of listed source layers (select_inputs)
        if self.per_layer:  # one map per window layer (engine.direct_map): [k·H_S → H_T], K from K and V from V
            # where source layers are listed, else [2·H_S → H_T] from its own source layer's K and V
            width = (cfg.source_count if cfg.linear_key_sources else 2) * cfg.source_kv_hidden
            self.key_proj = PerLayerLinear(cfg.window, width, cfg.target_kv_hidden)
            self.value_proj = PerLayerLinear(cfg.window, width, cfg.target_kv_hidden)
        else:
            self.key_proj = nn.Linear(rank or n_features, out)
            self.value_proj = nn.Linear(rank or n_features, out)
        for proj in (self.key_proj, self.value_proj):  # zeros until fitted: an unfitted map writes nothing
            nn.init.zeros_(proj.weight)
            nn.init.zeros_(proj.bias)

    def select_inputs(self, cfg: TranslatorConfig, input_layers: tuple[int, ...]) -> None:
        """Where each window layer's listed source layers (linear_key_sources, linear_value_sources) stand among the
        translator's input layers (MoT.input_layers); MoT calls it once it knows them."""
        if cfg.linear_key_sources:
            self.key_sources, self.value_sources = source_positions(cfg.linear_key_sources, cfg.linear_value_sources,
                                                                    input_layers)

    def token_features(self, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Aligned source blocks [B, N, W + extra layers, H_S] -> each token's own features [B, N, F]: the window's
        K and V, then the extra layers' (projected on extra_basis where the map has one)."""
        x = features(keys[:, :, :self.window], values[:, :, :self.window])
        if keys.shape[2] == self.window:
            return x
        extra = features(keys[:, :, self.window:], values[:, :, self.window:])
        return torch.cat([x, extra if self.extra_basis is None else extra @ self.extra_basis], dim=-1)

    def inputs(self, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Aligned source blocks [B, N, W + extra layers, H_S] -> the map's input [B, N, n_features] (per layer:
        [B, N, W, 2·H_S], each window layer's own K and V)."""
        if self.per_layer:
            return torch.cat([keys, values], dim=-1)
        return previous_features(self.token_features(keys, values), self.previous, self.previous_basis)

    def forward(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, n = keys.shape[:2]
        if self.key_sources is not None:  # window layer w: K from its key sources' K, V from its value sources' V
            key_inputs, value_inputs = listed_inputs(keys, values, self.key_sources, self.value_sources)
            return self.key_proj(key_inputs), self.value_proj(value_inputs)  # each (B, N, W, H_T)
        x = self.inputs(keys, values)
        shape = (b, n, self.window, self.out_hidden)
        keys = self.key_proj(x if self.key_down is None else self.key_down(x))
        values = self.value_proj(x if self.value_down is None else self.value_down(x))
        return keys.reshape(shape), values.reshape(shape)


def linear_inputs_text(cfg: TranslatorConfig) -> str:
    """What the linear map reads (and, for a reduced-rank map, its rank), in words (the app's explanations)."""
    text = _linear_reads(cfg)
    if cfg.factored_rank:
        text += f" (its K and its V output each of rank {cfg.factored_rank}: reduced-rank ridge)"
    return text


def _linear_reads(cfg: TranslatorConfig) -> str:
    if cfg.linear_per_layer:
        return per_layer_reads(cfg.source_count, bool(cfg.linear_key_sources))
    extra = cfg.linear_extra_layers
    projected = (f", the latter projected on {cfg.linear_extra_dims} principal axes of the bank"
                 if cfg.linear_extra_dims else "")
    layers = (f" (of the window's source layers and source layer{'s' * (len(extra) > 1)} "
              f"{', '.join(map(str, extra))}{projected})" if extra else "")
    if cfg.linear_previous == 0:
        return f"each token's aligned source K and V{layers}"
    earlier = "the previous token's" if cfg.linear_previous == 1 else f"the {cfg.linear_previous} previous tokens'"
    axes = f", projected on {cfg.linear_previous_dims} principal axes of the bank" if cfg.linear_previous_dims else ""
    return f"each token's aligned source K and V{layers} and {earlier}{axes}"


def features(keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Aligned source blocks [B, N, W, H_S] (K and V) -> the linear map's token features [B, N, 2·W·H_S]."""
    return torch.cat([keys.flatten(2), values.flatten(2)], dim=-1)


def previous_features(x: torch.Tensor, previous: int, basis: torch.Tensor | None = None) -> torch.Tensor:
    """Token features [B, N, F] -> [x_t, x_{t-1}, …, x_{t-previous}] (zeros before the context starts), each earlier
    token's features projected on `basis` [F, r] if given. previous = 0: x itself."""
    if previous == 0:
        return x
    parts = [x]
    for d in range(1, previous + 1):
        earlier = torch.zeros_like(x)
        earlier[:, d:] = x[:, :-d]
        parts.append(earlier if basis is None else earlier @ basis)
    return torch.cat(parts, dim=-1)


@dataclass
class TranslatorOutput:
    """Translated window blocks and the routing that produced them."""

    keys: torch.Tensor  # [B, N_t, W, H_T]
    values: torch.Tensor  # [B, N_t, W, H_T]
    key_routing: Routing | None  # None for the single variant
    value_routing: Routing | None


class KVTranslator(nn.Module):
    """The K path and the V path of one edge; independent modules, no weight sharing."""

    def __init__(self, cfg: TranslatorConfig):
        super().__init__()
        self.config = cfg
        if cfg.variant != "linear":
            make = MixtureOfTranslators if cfg.variant == "mot" else CrossLayerWindowTranslator
            self.key_translator = make(cfg)
            self.value_translator = make(cfg)
        self.linear = LinearKVMap(cfg) if cfg.variant == "linear" or cfg.linear_residual else None

    def _path(self, module: nn.Module, x: torch.Tensor, override: GateOverride | None
              ) -> tuple[torch.Tensor, Routing | None]:
        if isinstance(module, MixtureOfTranslators):
            return module(x, override)
        return module(x), None

    def forward(self, keys: torch.Tensor, values: torch.Tensor, override: GateOverride | None = None,
                linear_out: tuple[torch.Tensor, torch.Tensor] | None = None) -> TranslatorOutput:
        """keys, values: aligned source blocks [B, N_t, W, H_S] of the channel list's source layers, followed by
        those of linear_extra_layers (read by the linear map only); override: a what-if on both mixtures' gates;
        linear_out: the linear path's (K, V) output for these tokens, computed beforehand (a training stage that keeps
        the fitted map fixed computes it once per bank context), instead of running the map here."""
        if self.config.variant == "linear":
            k, v = self.linear(keys, values) if linear_out is None else linear_out
            return TranslatorOutput(keys=k, values=v, key_routing=None, value_routing=None)
        w = self.config.window
        k, k_routing = self._path(self.key_translator, keys[:, :, :w], override)
        v, v_routing = self._path(self.value_translator, values[:, :, :w], override)
        if self.linear is not None:
            lin_k, lin_v = self.linear(keys, values) if linear_out is None else linear_out
            k, v = k + lin_k, v + lin_v
        return TranslatorOutput(keys=k, values=v, key_routing=k_routing, value_routing=v_routing)

    def silence_experts(self) -> None:
        """Zero every expert's output projection, so the translator starts as exactly its linear path.

        The experts' outputs are then GELU(0) = 0 (or 0), while the projections still receive gradients:
        training starts where the closed-form map ends and the experts learn what it misses.
        """
        if self.linear is None:
            raise ConfigError("silence_experts needs a linear path (variant 'linear' or linear_residual=True)")
        for module in self.modules():
            if isinstance(module, CrossLayerWindowTranslator):
                nn.init.zeros_(module.output_proj.weight)
                nn.init.zeros_(module.output_proj.bias)


def gate_balance(gates: torch.Tensor) -> dict[str, float]:
    """CV² of importance and load, and the importance entropy, of one mixture's gates [B, N, E] (method.md §5)."""
    eps = torch.finfo(gates.dtype).eps
    importance = gates.sum(dim=(0, 1))
    load = (gates > 0).to(gates.dtype).sum(dim=(0, 1))

    def cv2(v: torch.Tensor) -> float:
        return float(v.var(unbiased=False) / (v.mean() ** 2 + eps))

    p = (importance / importance.sum().clamp(min=eps)).clamp(min=eps)
    return {
        "gate_importance_cv2": cv2(importance),
        "gate_load_cv2": cv2(load),
        "gate_importance_entropy": float(-(p * p.log()).sum()),
    }
