"""Any pair in seconds: the closed-form linear translator of a window, fitted on a small bank and saved as a
checkpoint folder in the user cache (method.md §13, "Linear"), so every page works on a pair nobody trained.

    python -m mot_viz.train.quickfit --source smollm2-135m --target gemma3-270m --tokens 4096

The bank (mot_viz.train.bank) and the fit (mot_viz.train.fit.fit_linear) are the ones training uses; a second request
for the same (pair, window, bank) loads the saved checkpoint instead of fitting again; concurrent requests (two
browser tabs, two processes) fit it once, the others wait for it under a file lock.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from filelock import FileLock

from ..cli import run_cli
from ..engine.channels import Channels, terminal_channels
from ..engine.checkpoint import CONFIG_FILE, save_checkpoint
from ..engine.model_cache import cache_dir
from ..engine.models import LoadedModel, load_model, model_geometry
from ..engine.mot import MoT
from ..engine.replay_config import replay_mode
from ..errors import ConfigError, ContextError
from ..fsutil import check_out_place, remove_stale_temporaries
from .bank import CORPORA, BankConfig, build_bank, complete_bank
from .direct import DIRECT_K, DIRECT_LAMBDA, Moments, affine, cached_moments, fit_every_layer, layer_block
from .fit import fit_linear
from .mean_vector import heldout_texts
from .window_fidelity import fidelity_table


@dataclass(frozen=True)
class QuickFitConfig:
    """The window and the bank of a quick linear fit (defaults: a few thousand tokens of LAMBADA prose)."""

    tokens: int = 4096  # target tokens in the bank
    corpus: str = "lambada"  # mot_viz.train.bank.CORPORA
    window_ratio: float = 0.3  # terminal window: the top round(ratio · min(L_S, L_T)) layers of each model
    window_start: int | None = None  # or a window of `window_size` target layers from this one (depth-matched source)
    window_size: int = 5
    key_space: str = "pre_rope"  # keys translated before rotation (post_rope for method.md's default)
    min_context_tokens: int = 32  # shortest bank context
    max_context_tokens: int = 256  # longest bank context (shorter contexts build faster)
    seed: int = 0
    # a full-depth map without replay (method.md §15): one ridge map per target layer, the translated K/V used as the
    # target's whole cache (ReplayConfig.direct)
    direct: bool = False
    # the direct map's recipe: "top_k" (its paper's: each target layer's K from the K, its V from the V, of the top_k
    # source layers of highest held-out single-layer R², fixed penalty direct_lambda read as direct_lambda_kind;
    # mot_viz.train.direct) or "depth_matched" (each target layer from its depth-matched source layer's K and V
    # together, λ per layer chosen on held-out contexts)
    direct_recipe: str = "top_k"
    top_k: int = DIRECT_K
    direct_lambda: float = DIRECT_LAMBDA
    direct_lambda_kind: str = "absolute"  # or "relative" (times the Gram's mean diagonal)

    def __post_init__(self):
        if self.tokens < 256:
            raise ConfigError(f"a quick fit needs at least 256 bank tokens, got {self.tokens}")
        if not 0 < self.window_ratio <= 1 or self.window_size < 1:
            raise ConfigError("need 0 < window_ratio <= 1 and window_size >= 1")
        if self.direct_recipe not in DIRECT_RECIPES:
            raise ConfigError(f"--direct_recipe must be one of {', '.join(DIRECT_RECIPES)}, not '{self.direct_recipe}'")
        if self.direct_lambda_kind not in ("absolute", "relative"):
            raise ConfigError(f"--lambda_kind must be absolute or relative, not '{self.direct_lambda_kind}'")
        if self.top_k < 1 or not self.direct_lambda > 0:
            raise ConfigError(f"need --k >= 1 and --lam > 0, got {self.top_k} and {self.direct_lambda}")

    @property
    def top_k_direct(self) -> bool:
        return self.direct and self.direct_recipe == "top_k"


DIRECT_RECIPES = ("top_k", "depth_matched")
DIRECT_SETTINGS = ("direct_recipe", "top_k", "direct_lambda", "direct_lambda_kind")  # a window's fit has none
# (tokens, shortest and longest context) of each recipe's bank when the command is not told: the quick linear fit's
# few thousand tokens; the top-k map's ~100k tokens in 1,024-token contexts (its paper calibrates on ~500 × 1k
# tokens); the depth-matched map's 16k in 32–448 (the QA contexts' lengths)
BANK_DEFAULTS = {"linear": (4096, 32, 256), "top_k": (102400, 1024, 1024), "depth_matched": (16384, 32, 448)}
VAL_FRACTION = 0.1  # the bank's last contexts held out of every fit (their rows score it)


def check_direct_size(cfg: QuickFitConfig, num_source_layers: int, source_kv_hidden: int) -> None:
    """Raise ConfigError (one line with the fix) unless a top-k direct map of cfg fits a source of this shape: k at
    most its layers, and more calibration tokens outside the held-out share than the map has features per layer."""
    if not cfg.top_k_direct:
        return
    if cfg.top_k > num_source_layers:
        raise ConfigError(f"--k {cfg.top_k} asks for more source layers than the source has ({num_source_layers}): "
                          f"pass --k {num_source_layers} or less.")
    features = cfg.top_k * source_kv_hidden
    if cfg.tokens * (1 - VAL_FRACTION) <= features:
        raise ConfigError(f"a top-{cfg.top_k} direct map has {features:,} features per target layer ({cfg.top_k} "
                          f"source layers × {source_kv_hidden}), more than the {cfg.tokens * (1 - VAL_FRACTION):,.0f} "
                          f"calibration tokens it fits on: pass --tokens {int(features / (1 - VAL_FRACTION)) + 1} or "
                          "more (the paper calibrates on ~500k), or a smaller --k.")


def quickfit_channels(source: LoadedModel, target: LoadedModel, cfg: QuickFitConfig) -> Channels:
    """The terminal window, or window_size target layers from window_start with source layers at the same depth."""
    ls, lt = source.spec.num_layers, target.spec.num_layers
    if cfg.direct:
        if ls < lt:
            raise ConfigError(f"a direct map feeds each of the target's {lt} layers from its own source layer, but the "
                              f"source has {ls}. Choose a source with at least as many layers as the target.")
        cfg = replace(cfg, window_start=0, window_size=lt)
    if cfg.window_start is None:
        return terminal_channels(ls, lt, cfg.window_ratio)
    if not 0 <= cfg.window_start <= lt - cfg.window_size:
        raise ConfigError(f"a window of {cfg.window_size} layers from {cfg.window_start} does not fit the target's "
                          f"{lt} layers; choose a start from 0 to {lt - cfg.window_size}.")
    targets = tuple(range(cfg.window_start, cfg.window_start + cfg.window_size))
    sources = tuple(min(ls - 1, round((t + 0.5) * ls / lt - 0.5)) for t in targets)
    if len(set(sources)) < len(sources):  # a shallower source: consecutive layers from the depth-matched start
        first = min(sources[0], ls - len(targets))
        sources = tuple(range(first, first + len(targets)))
    return Channels(sources, targets)


def every_other_layer(source: LoadedModel, channels: Channels) -> tuple[int, ...]:
    """The source layers outside the channel list: what a top-k direct map's bank holds besides them (every source
    layer is a candidate for every target layer)."""
    return tuple(l for l in range(source.spec.num_layers) if l not in channels.source_layers)


def fits_dir() -> Path:
    """Where quick fits are saved (<cache>/fits)."""
    return cache_dir() / "fits"


def quickfit_dir(source: LoadedModel, target: LoadedModel, cfg: QuickFitConfig) -> Path:
    """Where the fit of (pair, cfg) is saved: <cache>/fits/<source>-to-<target>-<hash>."""
    settings = asdict(cfg)
    if not cfg.direct:  # the direct map's settings do not name a window's fit
        for name in DIRECT_SETTINGS:
            settings.pop(name)
    ident = json.dumps({"source": source.spec.fingerprint, "target": target.spec.fingerprint, **settings},
                       sort_keys=True)
    kind = "direct" if cfg.direct else "linear"
    name = f"{Path(source.spec.name).name}-to-{Path(target.spec.name).name}-{kind}-"
    return fits_dir() / (name + hashlib.sha256(ident.encode()).hexdigest()[:12])


def fit_pair(source: LoadedModel, target: LoadedModel, cfg: QuickFitConfig = QuickFitConfig(),
             on_progress: Callable[[str, float], None] | None = None, progress: bool = False) -> Path:
    """Fit (or find) the linear translator of the pair and return its checkpoint folder.

    on_progress(message, fraction done) reports the bank build and the fit (the app's progress bar). A request made
    while another thread or process fits the same (pair, cfg) waits for it and returns its checkpoint.
    """
    out = quickfit_dir(source, target, cfg)
    if (out / CONFIG_FILE).is_file():
        return out
    check_direct_size(cfg, source.spec.num_layers, source.spec.kv_hidden)
    reads = _reads(source, target)
    shorter = min(reads, key=reads.get)
    if cfg.max_context_tokens > reads[shorter]:  # refused before anything is written
        raise _too_long(cfg, reads, f"the model '{shorter}' reads at most {reads[shorter]}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out.with_name(out.name + ".lock"))):
        if (out / CONFIG_FILE).is_file():  # fitted by whoever held the lock before us
            return out
        remove_stale_temporaries(out.parent)  # folders of fits whose process died while saving
        return _fit(source, target, cfg, out, on_progress or (lambda message, fraction: None), progress)


def _reads(*models: LoadedModel) -> dict[str, int]:
    """The longest context each model reads, in its own tokens (after its BOS), by model name."""
    return {m.spec.name: m.spec.max_positions - len(m.prefix_ids) for m in models}


def _too_long(cfg: QuickFitConfig, reads: dict[str, int], problem: str) -> ContextError:
    """The error of a bank whose contexts one of the models cannot read, with this command's fix."""
    return ContextError(
        f"The quick fit's bank holds contexts of up to {cfg.max_context_tokens} target tokens, but {problem}. Pass a "
        f"smaller --max_context_tokens to python -m mot_viz.train.quickfit (at most {min(reads.values())}, less when "
        "the source's tokenizer splits text finer than the target's).")


def _fit(source: LoadedModel, target: LoadedModel, cfg: QuickFitConfig, out: Path,
         report: Callable[[str, float], None], progress: bool) -> Path:
    """Build the bank, fit the ridge map and save the checkpoint at out (fit_pair holds the lock)."""
    t0 = time.perf_counter()
    channels = quickfit_channels(source, target, cfg)
    torch.manual_seed(cfg.seed)
    # a top-k direct map's bank holds every source layer (the channel list's, then the others): all are candidates
    extra = every_other_layer(source, channels) if cfg.top_k_direct else ()
    mot = MoT.build(source.spec, target.spec, channels, variant="linear", key_space=cfg.key_space,
                    linear_per_layer=cfg.direct and not cfg.top_k_direct, linear_extra_layers=extra)
    if cfg.direct:  # every page and evaluation that loads it uses the translated K/V as the cache
        mot.replay = replay_mode(mot.replay, "none")
    bank_cfg = BankConfig(corpus=cfg.corpus, num_tokens=cfg.tokens, min_tokens=cfg.min_context_tokens,
                          max_tokens=cfg.max_context_tokens, seed=cfg.seed,
                          shard_contexts=4 if cfg.top_k_direct else 16)  # 4 contexts of every layer: ~1 GB
    report("building the bank: source prefill, alignment and the target's own window K/V", 0.0)
    on_progress = lambda done, total: report(f"bank: {done:,} of {total:,} tokens", 0.9 * done / total)
    try:
        if cfg.top_k_direct:  # summed shard by shard: every source layer over ~100k tokens is several GB
            folder, manifest = complete_bank(mot, source, target, bank_cfg, progress=progress, on_progress=on_progress)
        else:
            bank = build_bank(mot, source, target, bank_cfg, progress=progress, on_progress=on_progress)
            manifest = {"num_tokens": int(bank.lengths.sum()), "num_contexts": bank.num_contexts}
    except ContextError as exc:  # its message names the evaluator's flag; this command has its own
        reads = _reads(source, target)
        raise _too_long(cfg, reads, f"one of them is longer in source tokens than the source model "
                                    f"'{source.spec.name}' reads ({reads[source.spec.name]})") from exc
    bank_seconds = time.perf_counter() - t0
    report("fitting the ridge map in closed form", 0.9)
    if cfg.top_k_direct:
        mot, fit = _fit_top_k(mot, source, target, cfg, cached_moments(folder, manifest, VAL_FRACTION, progress))
        metrics = {"direct_fit": fit}
    else:
        metrics = {"linear_fit": fit_linear(mot, bank, val_fraction=VAL_FRACTION)}
    seconds = time.perf_counter() - t0
    recipe = {"top_k": f"full-depth direct map, no replay: each target layer from its top {cfg.top_k} source "
                       f"layers by held-out R², {cfg.direct_lambda_kind} λ = {cfg.direct_lambda:g}",
              "depth_matched": "full-depth direct map, no replay: each target layer from its depth-matched source "
                               "layer"}[cfg.direct_recipe] if cfg.direct else "quick linear fit"
    settings = {k: v for k, v in asdict(cfg).items()
                if cfg.direct or k not in DIRECT_SETTINGS}
    training = {"recipe": f"{recipe} (mot_viz.train.quickfit)", "source": source.spec.name,
                "target": target.spec.name, **settings,
                "data": f"{cfg.corpus} bank of {manifest['num_tokens']} target tokens in {manifest['num_contexts']} "
                        f"contexts of {cfg.min_context_tokens}-{cfg.max_context_tokens} tokens ("
                        f"{CORPORA[cfg.corpus]}); the last {VAL_FRACTION:.0%} of contexts held out of the fit",
                "seconds": round(seconds, 1), "bank_seconds": round(bank_seconds, 1)}
    save_checkpoint(mot, out, dtype=torch.float16, training=training, metrics=metrics)
    report(f"fitted in {seconds:.0f} s", 1.0)
    return out


FIDELITY_TEXTS = 16  # held-out LAMBADA passages the fit's attention-output cosine is measured on


def _fit_top_k(bank_mot: MoT, source: LoadedModel, target: LoadedModel, cfg: QuickFitConfig,
               moments: dict[str, tuple[Moments, Moments]]) -> tuple[MoT, dict]:
    """The top-k direct map fitted on the bank's moments (mot_viz.train.direct), and its report: per target layer the
    chosen source layers and the held-out R² (of the map; of the depth-matched and of the best single source layer;
    of the map with the penalty read the other way), then the attention-output cosine on held-out text."""
    t0 = time.perf_counter()
    h_s, h_t = bank_mot.source.kv_hidden, bank_mot.target.kv_hidden
    relative = cfg.direct_lambda_kind == "relative"
    fits = fit_every_layer(moments, h_s, h_t, cfg.top_k, cfg.direct_lambda, relative)
    inputs = bank_mot.input_layers  # the bank's layer order: the channel list's source layers, then the others
    chosen = {name: tuple(tuple(inputs[p] for p in f.sources) for f in layer_fits) for name, layer_fits in fits.items()}
    mot = MoT.build(source.spec, target.spec, bank_mot.channels, replay=bank_mot.replay, variant="linear",
                    key_space=cfg.key_space, linear_per_layer=True,
                    linear_extra_layers=bank_mot.translator.config.linear_extra_layers,
                    linear_key_sources=chosen["k"], linear_value_sources=chosen["v"])
    linear = mot.translator.linear
    with torch.no_grad():
        for name, proj in (("k", linear.key_proj), ("v", linear.value_proj)):
            for t, f in enumerate(fits[name]):
                weight, bias = affine(moments[name][0], layer_block(f.sources, h_s), layer_block([t], h_t), f.weight,
                                      f.x_mean, f.y_mean)
                proj.weight[t].copy_(weight)
                proj.bias[t].copy_(bias)
    train, val = moments["k"]
    report = {"k": cfg.top_k, "lambda": cfg.direct_lambda, "lambda_kind": cfg.direct_lambda_kind,
              "train_tokens": train.n, "val_tokens": val.n, "features": cfg.top_k * h_s, "layers": []}
    for t in range(mot.target.num_layers):
        row = {"layer": t}
        for name, label in (("k", "key"), ("v", "value")):
            f = fits[name][t]
            row |= {f"{label}_sources": list(chosen[name][t]), f"{label}_r2": round(f.r2, 4),
                    f"{label}_r2_depth_matched": round(f.single_r2[t], 4),  # input position t: channel t's source
                    f"{label}_r2_best_single": round(max(f.single_r2), 4),
                    f"{label}_r2_{'absolute' if relative else 'relative'}_lambda": round(f.other_r2, 4)}
        report["layers"].append(row)
    # half the shorter model's reach: the source's tokens may outnumber the target's
    longest = min(448, min(_reads(source, target).values()) // 2)
    texts = heldout_texts(target, "lambada-heldout", FIDELITY_TEXTS, longest)
    table = fidelity_table(mot, source, target, texts, progress=False)
    cosine = table.groupby("layer").attn_out_cos.mean()
    for row in report["layers"]:
        row["attn_out_cos"] = round(float(cosine[row["layer"]]), 4)
    tokens = int(table.groupby("context").tokens.first().sum())
    report["attn_out_cos_text"] = f"{len(texts)} held-out LAMBADA passages ({tokens} tokens), the native queries"
    report["seconds"] = round(time.perf_counter() - t0, 1)
    return mot, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fit the closed-form linear translator of a model pair.")
    parser.add_argument("--source", required=True, help="source model: bundled name, Hub id, folder or .gguf")
    parser.add_argument("--target", required=True, help="target model: bundled name, Hub id, folder or .gguf")
    parser.add_argument("--tokens", type=int, default=None,
                        help="target tokens in the bank (default: 4,096 for a window; 102,400 for the top-k direct "
                             "map; 16,384 for the depth-matched one)")
    parser.add_argument("--window_start", type=int, default=None,
                        help="first target layer of the window (default: the terminal window)")
    parser.add_argument("--window_size", type=int, default=QuickFitConfig.window_size,
                        help="layers in the window when --window_start is given")
    parser.add_argument("--max_context_tokens", type=int, default=None,
                        help="longest bank context, in target tokens (default: 256 for a window; 1,024 for the top-k "
                             "direct map, whose contexts all have this length; 448 for the depth-matched one); lower "
                             "it for a model with a short context")
    parser.add_argument("--key_space", choices=("pre_rope", "post_rope"), default=QuickFitConfig.key_space,
                        help="translate keys before rotation (pre_rope) or as cached (post_rope)")
    parser.add_argument("--direct", action="store_true",
                        help="fit a full-depth map without replay, used as the target's whole cache (the target "
                             "never reads the context): by default its paper's recipe (--direct_recipe top_k)")
    parser.add_argument("--direct_recipe", choices=DIRECT_RECIPES, default=QuickFitConfig.direct_recipe,
                        help="top_k: each target layer's K from the K, its V from the V, of the --k source layers "
                             "that predict it best on held-out tokens (single-layer R²), fixed λ --lam "
                             "(--lambda_kind); "
                             "depth_matched: each target layer from its depth-matched source layer's K and V, λ per "
                             "layer chosen on held-out tokens")
    parser.add_argument("--k", type=int, default=DIRECT_K, help="source layers per target layer (top_k recipe)")
    parser.add_argument("--lam", type=float, default=DIRECT_LAMBDA, help="ridge penalty of the top_k recipe")
    parser.add_argument("--lambda_kind", choices=("absolute", "relative"), default=QuickFitConfig.direct_lambda_kind,
                        help="--lam added to the centred Gram summed over the calibration tokens (absolute), or times "
                             "its mean diagonal (relative)")
    parser.add_argument("--out", default=None,
                        help="also copy the fitted checkpoint folder here (a new folder, e.g. under pretrained/)")
    args = parser.parse_args(argv)

    def body() -> None:
        if args.out:  # a folder holding files, a file, a place it cannot write: refused before hours of fitting
            check_out_place(Path(args.out), ours=lambda path: False)
        tokens, shortest, longest = BANK_DEFAULTS[args.direct_recipe if args.direct else "linear"]
        longest = args.max_context_tokens or longest
        shortest = longest if args.direct and args.direct_recipe == "top_k" else min(shortest, longest)
        cfg = QuickFitConfig(tokens=args.tokens or tokens, window_start=args.window_start,
                             window_size=args.window_size, key_space=args.key_space, max_context_tokens=longest,
                             min_context_tokens=shortest, direct=args.direct, direct_recipe=args.direct_recipe,
                             top_k=args.k, direct_lambda=args.lam, direct_lambda_kind=args.lambda_kind)
        geometry = model_geometry(args.source)  # checked before any model loads where its config can be read
        if geometry is not None:
            check_direct_size(cfg, *geometry)
        source, target = load_model(args.source), load_model(args.target)
        fitted = fit_pair(source, target, cfg, progress=True)
        if args.out:  # a copy of the cached fit (its config and weights), e.g. a shipped checkpoint
            shutil.copytree(fitted, args.out, dirs_exist_ok=True)  # --out is new or empty
            fitted = Path(args.out)
        print(fitted)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
