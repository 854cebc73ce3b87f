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
from ..engine.models import LoadedModel, load_model
from ..engine.mot import MoT
from ..engine.replay_config import replay_mode
from ..errors import ConfigError, ContextError
from ..fsutil import remove_stale_temporaries
from .bank import BankConfig, build_bank
from .fit import fit_linear


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
    # a full-depth map without replay (method.md §15): every target layer from its depth-matched source layer, one
    # ridge map per layer, the translated K/V used as the target's whole cache (ReplayConfig.direct)
    direct: bool = False

    def __post_init__(self):
        if self.tokens < 256:
            raise ConfigError(f"a quick fit needs at least 256 bank tokens, got {self.tokens}")
        if not 0 < self.window_ratio <= 1 or self.window_size < 1:
            raise ConfigError("need 0 < window_ratio <= 1 and window_size >= 1")


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


def fits_dir() -> Path:
    """Where quick fits are saved (<cache>/fits)."""
    return cache_dir() / "fits"


def quickfit_dir(source: LoadedModel, target: LoadedModel, cfg: QuickFitConfig) -> Path:
    """Where the fit of (pair, cfg) is saved: <cache>/fits/<source>-to-<target>-<hash>."""
    ident = json.dumps({"source": source.spec.fingerprint, "target": target.spec.fingerprint, **asdict(cfg)},
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
    mot = MoT.build(source.spec, target.spec, channels, variant="linear", key_space=cfg.key_space,
                    linear_per_layer=cfg.direct)
    if cfg.direct:  # every page and evaluation that loads it uses the translated K/V as the cache
        mot.replay = replay_mode(mot.replay, "none")
    bank_cfg = BankConfig(corpus=cfg.corpus, num_tokens=cfg.tokens, min_tokens=cfg.min_context_tokens,
                          max_tokens=cfg.max_context_tokens, seed=cfg.seed)
    report("building the bank: source prefill, alignment and the target's own window K/V", 0.0)
    try:
        bank = build_bank(mot, source, target, bank_cfg, progress=progress,
                          on_progress=lambda done, total: report(f"bank: {done:,} of {total:,} tokens",
                                                                 0.9 * done / total))
    except ContextError as exc:  # its message names the evaluator's flag; this command has its own
        reads = _reads(source, target)
        raise _too_long(cfg, reads, f"one of them is longer in source tokens than the source model "
                                    f"'{source.spec.name}' reads ({reads[source.spec.name]})") from exc
    bank_seconds = time.perf_counter() - t0
    report("fitting the ridge map in closed form", 0.9)
    fit = fit_linear(mot, bank)
    seconds = time.perf_counter() - t0
    recipe = "full-depth direct map, no replay" if cfg.direct else "quick linear fit"
    training = {"recipe": f"{recipe} (mot_viz.train.quickfit)", "source": source.spec.name,
                "target": target.spec.name, **asdict(cfg),
                "data": f"{cfg.corpus} bank of {int(bank.lengths.sum())} target tokens in {bank.num_contexts} "
                        f"contexts of {cfg.min_context_tokens}-{cfg.max_context_tokens} tokens",
                "seconds": round(seconds, 1), "bank_seconds": round(bank_seconds, 1)}
    save_checkpoint(mot, out, dtype=torch.float16, training=training, metrics={"linear_fit": fit})
    report(f"fitted in {seconds:.0f} s", 1.0)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fit the closed-form linear translator of a model pair.")
    parser.add_argument("--source", required=True, help="source model: bundled name, Hub id, folder or .gguf")
    parser.add_argument("--target", required=True, help="target model: bundled name, Hub id, folder or .gguf")
    parser.add_argument("--tokens", type=int, default=QuickFitConfig.tokens, help="target tokens in the bank")
    parser.add_argument("--window_start", type=int, default=None,
                        help="first target layer of the window (default: the terminal window)")
    parser.add_argument("--window_size", type=int, default=QuickFitConfig.window_size,
                        help="layers in the window when --window_start is given")
    parser.add_argument("--max_context_tokens", type=int, default=QuickFitConfig.max_context_tokens,
                        help="longest bank context, in target tokens (lower it for a model with a short context)")
    parser.add_argument("--key_space", choices=("pre_rope", "post_rope"), default=QuickFitConfig.key_space,
                        help="translate keys before rotation (pre_rope) or as cached (post_rope)")
    parser.add_argument("--direct", action="store_true",
                        help="fit a full-depth map without replay: every target layer's K/V from its depth-matched "
                             "source layer, used as the target's whole cache (the target never reads the context)")
    parser.add_argument("--out", default=None,
                        help="also copy the fitted checkpoint folder here (a new folder, e.g. under pretrained/)")
    args = parser.parse_args(argv)

    def body() -> None:
        cfg = QuickFitConfig(tokens=args.tokens, window_start=args.window_start, window_size=args.window_size,
                             key_space=args.key_space, max_context_tokens=args.max_context_tokens,
                             min_context_tokens=min(QuickFitConfig.min_context_tokens, args.max_context_tokens),
                             direct=args.direct)
        source, target = load_model(args.source), load_model(args.target)
        fitted = fit_pair(source, target, cfg, progress=True)
        if args.out:  # a copy of the cached fit (its config and weights), e.g. a shipped checkpoint
            if Path(args.out).exists():
                raise ConfigError(f"--out {args.out} exists. Pass a new folder, or remove it first.")
            shutil.copytree(fitted, args.out)
            fitted = Path(args.out)
        print(fitted)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
