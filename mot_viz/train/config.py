"""A training run's configuration (saved as train_config.json beside its checkpoints) and the train CLI's parsing.

Every mistake in the arguments or the config file raises ConfigError before any model is loaded.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from .bank import BankConfig
from .devices import AUTOCAST_MODES


LAYER_WEIGHTINGS = ("none", "map_residual")  # bank_layer_weighting (mot_viz.train.fit.bank_stage)


@dataclass
class TrainConfig:
    """Everything one training run needs; saved as train_config.json beside the checkpoints.

    The defaults are the shipped recipe (docs/decisions.md): a cached bank of three genres, the closed-form map fitted
    on it, a mixture that starts as that map, 800 bank steps, then 40 replay steps of the Context Correction Loss plus a
    translation term. A config file holds only what differs: the pair, the window, the bank's size, the variant.
    """

    source: str = "smollm2-135m"  # source model: bundled name, Hub id, folder or .gguf
    target: str = "gemma3-270m"  # target model
    output_dir: str = "runs/mot"  # run folder: checkpoints, log.jsonl, train_config.json
    layer_alignment: str = "terminal"  # injection | terminal | depth-ratio
    min_window_size_ratio: float = 0.3  # smallest window the depth-ratio search tries, as a share of min(L_S, L_T)
    max_window_size_ratio: float = 0.3  # largest window the depth-ratio search tries; terminal: the window size
    injection_layer_start_idx: int = 0  # injection mode: first target layer
    injection_window_size: int = 6  # injection mode: window size
    proxy_steps: int = 32  # depth-ratio search: steps per proxy translator
    proxy_val_sequences: int = 8  # depth-ratio search: validation rows per proxy score
    max_steps: int = 40  # optimiser steps of the replay stage (the Context Correction Loss)
    batch_size: int = 2  # rows per micro-batch (replay is row-wise)
    grad_accum_steps: int = 1  # micro-batches per optimiser step
    total_tokens: int = 128  # tokens per training sequence
    prefix_tokens: int = 64  # P: the cache holds P-1 tokens, the prompt the next 64
    num_sequences: int = 2048  # size of the training bank drawn from the prose corpus
    learning_rate: float = 1e-4  # peak learning rate of the replay stage (the reference's, at 500 steps of 16 rows)
    weight_decay: float = 0.01  # AdamW weight decay (both stages)
    warmup_steps: int = 5  # linear warm-up steps before the cosine decay of the replay stage
    grad_clip_norm: float = 1.0  # gradient norm clip (both stages)
    mse_weight: float = 1.0  # λ in CE + λ·(MSE_K + MSE_V) of the replayed cache (method.md §7)
    translation_weight: float = 1.0  # λ_tr: + λ_tr·MSE of the injected window K/V against native (project term)
    balance_weight: float = 0.01  # Switch-style router load balancing (both stages); 0 = off
    init: str = "linear"  # linear: start from the closed-form ridge map fitted on the bank | random
    key_space: str = "pre_rope"  # pre_rope: translate keys before rotation | post_rope (method.md)
    bank_corpus: str = "lambada+sotu+brown"  # text of the training bank (mot_viz.train.bank.CORPORA)
    bank_tokens: int = 98304  # target tokens in the cached training bank (init=linear or bank_steps > 0)
    bank_min_tokens: int = 32  # shortest bank context
    bank_max_tokens: int = 448  # longest bank context (the app's and the evaluator's lengths)
    bank_steps: int = 800  # stage 1: steps on the bank's translation term alone, before the replay stage
    bank_batch: int = 8  # contexts per bank step
    bank_crop: int = 128  # tokens per context crop in a bank step
    bank_learning_rate: float = 5e-4  # peak learning rate of stage 1
    bank_layer_weighting: str = "map_residual"  # stage 1 per window layer: map_residual (÷ the map's MSE on it) | none
    bank_cross_fit: int = 0  # stage 1 on a fixed map: train on its output refitted without each context's fold (0: its own)
    train_linear_path: bool = False  # init=linear: also update the fitted linear path (default: kept fixed)
    linear_from: str = ""  # init=linear: copy the linear path from this linear checkpoint instead of fitting it again
    linear_previous: int = 1  # the linear map also reads this many tokens before each token (0: the token alone)
    linear_previous_dims: int = 256  # each earlier token projected on this many principal axes of the bank (0: not)
    linear_extra_layers: list[int] = dataclasses.field(default_factory=list)  # source layers only the map also reads
    linear_extra_dims: int = 0  # the extra layers' K and V projected on this many principal axes of the bank (0: not)
    linear_rank: int = 0  # the map's K and V outputs each on this many principal directions (reduced-rank ridge; 0: full)
    linear_rank_balanced: bool = False  # reduced-rank fit: every window layer weighed alike (1 / RMS of its target)
    log_every: int = 5  # optimiser steps per log line
    save_every: int = 10  # optimiser steps per checkpoint
    seed: int = 42  # seeds the bank, the translator's init and the row order
    translator_dim: int = 64  # width of each expert's transformer
    translator_heads: int = 4  # attention heads per expert block
    translator_depth: int = 1  # expert blocks per window layer
    translator_mlp_ratio: int = 2  # expert MLP width ÷ translator_dim
    variant: str = "mot"  # mot (router + experts) | single (one expert) | linear (closed-form map only)
    mot_num_translators: int = 4  # experts per K/V path (mot)
    mot_top_k: int = 2  # experts kept per token before the gate softmax (mot)
    output_activation: str = "none"  # none | gelu (the reference's last layer)
    topk_sparse_attn: int | None = 32  # None: dense replay
    num_bottom_full_attn: int = 2  # replay: layers below this attend densely, window layers excepted (method.md §6)
    device: str = ""  # cpu | cuda | cuda:N: where models, bank, fits and translator run (empty: $MOT_VIZ_DEVICE, else cpu)
    autocast: str = "none"  # none | bf16: bfloat16 autocast of the replay stage's forward passes (float32 weights kept)

    def __post_init__(self):
        if self.layer_alignment not in ("injection", "terminal", "depth-ratio"):
            raise ConfigError(f"layer_alignment must be injection, terminal or depth-ratio, not {self.layer_alignment}")
        if not (self.max_window_size_ratio >= self.min_window_size_ratio > 0):
            raise ConfigError("need max_window_size_ratio >= min_window_size_ratio > 0")
        if not 0 < self.prefix_tokens < self.total_tokens:
            raise ConfigError("need 0 < prefix_tokens < total_tokens")
        if self.max_steps < 0 or self.batch_size < 1 or self.grad_accum_steps < 1:
            raise ConfigError("max_steps must be >= 0, batch_size and grad_accum_steps >= 1")
        if self.max_steps == 0 and self.bank_steps == 0 and self.variant != "linear":
            raise ConfigError("nothing to train: set max_steps (replay stage) or bank_steps (bank stage) above 0")
        if self.bank_layer_weighting not in LAYER_WEIGHTINGS:
            raise ConfigError(f"bank_layer_weighting must be one of {LAYER_WEIGHTINGS}, not "
                              f"'{self.bank_layer_weighting}'")
        if self.init not in ("random", "linear"):
            raise ConfigError(f"init must be 'random' or 'linear', not '{self.init}'")
        if self.linear_from and (self.init != "linear" or self.variant == "linear"):
            raise ConfigError("linear_from is for a mixture or single translator with init 'linear' (it copies that "
                              "checkpoint's linear path as the fixed residual path)")
        if not (isinstance(self.bank_cross_fit, int) and (self.bank_cross_fit == 0 or 2 <= self.bank_cross_fit <= 64)):
            raise ConfigError(f"bank_cross_fit is a number of folds, 0 (off) or 2 to 64; got {self.bank_cross_fit!r}")
        if self.bank_cross_fit and (self.init != "linear" or self.variant == "linear" or self.train_linear_path
                                    or not self.bank_steps):
            raise ConfigError("bank_cross_fit is for the bank stage (bank_steps > 0) of a mixture or single translator "
                              "on a fixed linear map (init 'linear', train_linear_path false)")
        if self.linear_rank_balanced and (not self.linear_rank or self.linear_from):
            raise ConfigError("linear_rank_balanced weighs the window layers in a reduced-rank fit: set linear_rank too, "
                              "and fit the map here (a map copied with linear_from is fitted already)")
        if self.bank_steps < 0 or self.translation_weight < 0 or self.balance_weight < 0:
            raise ConfigError("bank_steps, translation_weight and balance_weight must be >= 0")
        for name in ("learning_rate", "bank_learning_rate", "grad_clip_norm"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")
        for name in ("weight_decay", "mse_weight"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.autocast not in AUTOCAST_MODES:
            raise ConfigError(f"autocast must be one of {AUTOCAST_MODES}, not {self.autocast!r}")
        if not isinstance(self.device, str):
            raise ConfigError(f"device must be a text like 'cpu', 'cuda' or 'cuda:1' (empty: $MOT_VIZ_DEVICE), got "
                              f"{self.device!r}")
        if self.log_every < 1 or self.save_every < 1 or self.warmup_steps < 0:
            raise ConfigError("log_every and save_every must be >= 1, warmup_steps >= 0")

    def translator_kwargs(self, **overrides) -> dict:
        """The translator's shape as MoT.build keyword arguments (the one mapping of these fields)."""
        return {"dim": self.translator_dim, "heads": self.translator_heads, "depth": self.translator_depth,
                "mlp_ratio": self.translator_mlp_ratio, "variant": self.variant, "num_experts": self.mot_num_translators,
                "top_k": self.mot_top_k, "output_activation": self.output_activation, "key_space": self.key_space,
                "linear_residual": self.init == "linear" and self.variant != "linear",
                "linear_previous": self.linear_previous, "linear_previous_dims": self.linear_previous_dims,
                "linear_extra_layers": tuple(self.linear_extra_layers), "linear_extra_dims": self.linear_extra_dims,
                "linear_rank": self.linear_rank, **overrides}

    @property
    def uses_bank(self) -> bool:
        return self.init == "linear" or self.variant == "linear" or self.bank_steps > 0

    def check_bank_length(self, limits: dict[str, int]) -> None:
        """Refuse (ConfigError) a bank whose longest context exceeds what a model allows: `limits` maps each model's
        name to its longest context in tokens. Checked once the models are loaded, before a bank or a run folder."""
        if not self.uses_bank:
            return
        name, limit = min(limits.items(), key=lambda item: item[1])
        if self.bank_max_tokens > limit:
            raise ConfigError(f"bank_max_tokens {self.bank_max_tokens} is longer than the model '{name}' allows "
                              f"({limit} tokens): set --bank_max_tokens to at most {limit} (and --bank_min_tokens "
                              "no higher).")

    def check_linear_widths(self, token_features: int, extra_features: int) -> None:
        """Refuse (ConfigError) projections wider than what they project: linear_extra_dims above the extra layers'
        `extra_features`, linear_previous_dims above a token's `token_features` (the pair's K/V widths and the window
        decide both; 0: no such projection). Checked once the window is known, before a bank or a run folder."""
        if self.linear_extra_dims and extra_features and self.linear_extra_dims > extra_features:
            raise ConfigError(f"linear_extra_dims {self.linear_extra_dims} is more than the {extra_features} features "
                              f"of the extra layers: set --linear_extra_dims to at most {extra_features}.")
        if self.linear_previous_dims and token_features and self.linear_previous_dims > token_features:
            raise ConfigError(f"linear_previous_dims {self.linear_previous_dims} is more than the {token_features} "
                              "features of a token this pair and window give the map: set --linear_previous_dims to "
                              f"at most {token_features} (0: earlier tokens unprojected).")

    def bank_config(self) -> BankConfig:
        return BankConfig(corpus=self.bank_corpus, num_tokens=self.bank_tokens, min_tokens=self.bank_min_tokens,
                          max_tokens=self.bank_max_tokens, seed=self.seed)

    @classmethod
    def from_json(cls, data: dict) -> "TrainConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown training config keys: {unknown}. Known keys: python -m mot_viz.train.train --help")
        try:
            return cls(**data)
        except TypeError as exc:  # e.g. a string where a number belongs
            raise ConfigError(f"invalid training config: {exc}") from exc


def field_help() -> dict[str, str]:
    """Each TrainConfig field's end-of-line comment (the --help of its flag): one place documents a field."""
    comments = dict(re.findall(r"^    (\w+): [^=\n]+=[^#\n]*#\s*(.+)$", inspect.getsource(TrainConfig), re.M))
    return {f.name: comments.get(f.name, f.name.replace("_", " ")) for f in dataclasses.fields(TrainConfig)}


def parse_args(argv: list[str] | None = None) -> tuple[TrainConfig, bool, bool]:
    """--config FILE, then --key value overrides for any TrainConfig field, plus --resume / --overwrite.

    Every mistake in the arguments or the config file raises ConfigError before any model is loaded.
    """
    parser = argparse.ArgumentParser(description="Train a MoT translator with the Context Correction Loss.")
    parser.add_argument("--config", help="JSON file of TrainConfig fields")
    parser.add_argument("--resume", action="store_true", help="continue the run in --output_dir from its checkpoint")
    parser.add_argument("--overwrite", action="store_true", help="replace the run already in --output_dir")
    helps = field_help()
    for f in dataclasses.fields(TrainConfig):
        default = _default(f.name)
        metavar = "I,J,…" if isinstance(default, list) else type(default).__name__.upper()
        parser.add_argument(f"--{f.name}", default=None, metavar=metavar, help=f"{helps[f.name]} (default {default!r})")
    args = parser.parse_args(argv)
    data = _read_json(Path(args.config), "--config") if args.config else {}
    if args.resume and args.output_dir and not args.config and (Path(args.output_dir) / "train_config.json").exists():
        data = _read_json(Path(args.output_dir) / "train_config.json", "the run's train_config.json")
        data.pop("device", None)  # a run resumes on this machine's device (--device, else $MOT_VIZ_DEVICE)
    types = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
    for name in types:
        raw = getattr(args, name)
        if raw is None:
            continue
        current = data.get(name, _default(name))
        try:
            if raw.lower() == "none" and "None" in str(types[name]):  # "none" is also a value of some text fields
                data[name] = None
            elif isinstance(current, list):  # comma-separated integers (linear_extra_layers)
                data[name] = [int(x) for x in raw.split(",") if x.strip()]
            elif isinstance(current, bool):
                data[name] = raw.lower() in ("1", "true", "yes")
            elif isinstance(current, int) or types[name] in ("int", "int | None"):
                data[name] = int(raw)
            elif isinstance(current, float):
                data[name] = float(raw)
            else:
                data[name] = raw
        except ValueError:
            raise ConfigError(f"--{name} {raw!r} is not a number (or a list of numbers); it takes a value like "
                              f"{current!r}.") from None
    return TrainConfig.from_json(data), args.resume, args.overwrite


def read_recipe(path: str | Path, flag: str) -> TrainConfig:
    """The TrainConfig of a JSON recipe file; ConfigError naming `flag` (the command's own) when it cannot be read or
    holds an invalid value."""
    return TrainConfig.from_json(_read_json(Path(path), flag))


def _default(name: str):
    """A TrainConfig field's default value (a fresh one for fields with a default factory)."""
    f = TrainConfig.__dataclass_fields__[name]
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{what} '{path}' cannot be read ({exc.strerror}). Give the path of a JSON config file.") from exc
    except ValueError as exc:
        raise ConfigError(f"{what} '{path}' is not valid JSON ({exc}). Fix the file; configs/ has examples.") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{what} '{path}' must hold a JSON object of TrainConfig fields, not {type(data).__name__}.")
    return data
