"""The §9.1 injection-start sweep (trained / perturbation / checkpoint error profile) and its saved results."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ...engine.channels import Channels, injection_channels
from ...engine.controls import relative_perturbation
from ...engine.layout import window_blocks
from ...engine.models import LoadedModel
from ...engine.mot import MoT, Translation, native_cache, replay, translate
from ...errors import ConfigError
from ...eval.answers import answer_from_cache
from ...sharing.names import REFERENCE
from .cases import WINDOW_CONDITIONS, ContextCase, window_caches
from .metrics import TRACE_CONDITIONS, WindowShift, structural_advantage
from .trace import trace_cache
from .window import KL_PAIRS, WindowRun, _mot_replay, run_window

MODES = ("trained", "perturbation", "checkpoint-error-profile")
MODE_LABELS = {
    "trained": "trained translator per start",
    "perturbation": "training-free: native window + random perturbation of fixed relative size",
    "checkpoint-error-profile": "training-free: native window + random perturbation with the checkpoint's error profile",
}
_PERTURBATION_SEED_OFFSET = 7919  # keeps the injected perturbation's draws apart from the random control's


# ----- §9.1 injection-start sweep ---------------------------------------------------------------------------


def valid_starts(num_target_layers: int, window: int, num_source_layers: int | None = None) -> list[int]:
    """Every start whose window fits the target (and, given the source depth, maps inside the source, §3)."""
    starts = []
    for s in range(0, num_target_layers - window + 1):
        try:
            injection_channels(num_source_layers or num_target_layers, num_target_layers, s, window)
        except ConfigError:
            continue
        starts.append(s)
    if not starts:
        raise ConfigError(f"no injection window of size {window} fits a {num_target_layers}-layer target")
    return starts


TABLES = ("summary", "tokens", "trajectories", "per_example")  # a saved sweep's CSVs, beside meta.json
SWEEP_FILES = ("meta.json", *(f"{name}.csv" for name in TABLES))  # what SweepResult.save writes


@dataclass
class SweepConfig:
    """One injection-start sweep (method.md §9.1 with the §9.2 trace at each start)."""

    mode: str = "perturbation"  # trained | perturbation | checkpoint-error-profile
    window: int = 4  # W, target layers per window
    starts: tuple[int, ...] | None = None  # None: every valid start
    perturbation_size: float = 0.5  # perturbation mode: ‖δ‖/‖N‖ per (token, layer) vector
    seed: int = 0  # random directions: perturbation and random control
    controls: bool = True  # also replay dir_only and mag_only
    task_metric: bool = True  # greedy answers (F1 / accuracy); off for a quick KL + trace sweep
    max_new_tokens: int = 16  # greedy answer length for the task metric
    max_answer_tokens: int = 4  # teacher-forced answer tokens traced

    def __post_init__(self):
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, not {self.mode!r}")
        if self.window < 1:
            raise ConfigError("window must be >= 1")
        if self.perturbation_size < 0:
            raise ConfigError("perturbation_size must be >= 0")


@dataclass
class SweepResult:
    """A finished sweep as data: what was run, and long-format frames for plots and CSV."""

    meta: dict  # config, pair, dataset, n, timings, mode
    summary: pd.DataFrame  # one row per start
    tokens: pd.DataFrame  # one row per (start, condition, example, answer token)
    trajectories: pd.DataFrame  # per (start, condition, token_index, k): median/mean ρ, medians of α/‖s‖, β/‖s‖, cos
    per_example: pd.DataFrame  # one row per (start, example): scores and KLs

    def save(self, folder: str | Path) -> Path:
        """Write meta.json and summary/tokens/trajectories/per_example CSVs into folder."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "meta.json").write_text(json.dumps(self.meta, indent=2, default=str))
        for name in TABLES:
            getattr(self, name).to_csv(folder / f"{name}.csv", index=False, float_format="%.7g")  # float32-level digits
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> "SweepResult":
        folder = Path(folder)
        meta = json.loads((folder / "meta.json").read_text())
        frames = {n: pd.read_csv(folder / f"{n}.csv") for n in TABLES}
        return cls(meta, **frames)


def error_profile(translation: Translation, channels: Channels) -> tuple[torch.Tensor, torch.Tensor]:
    """The checkpoint's relative error ‖Tr − N‖/‖N‖ per (token, window layer), for K and V: each [1, N, W, 1]."""
    nk, nv = translation.native_window_blocks(channels)
    rel = lambda tr, n: (tr - n).norm(dim=-1, keepdim=True) / n.norm(dim=-1, keepdim=True).clamp(min=1e-8)
    return rel(translation.translated.keys, nk), rel(translation.translated.values, nv)


def _map_profile(profile: torch.Tensor, window: int) -> torch.Tensor:
    """A [1, N, W_ck, 1] profile onto `window` positions by relative position in the window."""
    w_ck = profile.shape[2]
    if w_ck == window:
        return profile
    idx = [round(i * (w_ck - 1) / (window - 1)) if window > 1 else (w_ck - 1) // 2 for i in range(window)]
    return profile[:, :, idx]


def perturbed_window(native_k: torch.Tensor, native_v: torch.Tensor, size_k: float | torch.Tensor,
                     size_v: float | torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The training-free injected window: N + a random direction of relative size `size` per (token, layer) vector.

    native_*: blocks [1, N, W, H]; size_*: a number (perturbation mode) or a [1, N, W_ck, 1] error profile
    (checkpoint-error-profile mode), mapped onto the W window positions by relative position.
    K is drawn first, then V, from one generator seeded with `seed`.
    """
    gen = torch.Generator().manual_seed(seed)
    window = native_k.shape[2]
    size_k = _map_profile(size_k, window) if isinstance(size_k, torch.Tensor) else size_k
    size_v = _map_profile(size_v, window) if isinstance(size_v, torch.Tensor) else size_v
    return relative_perturbation(native_k, size_k, gen), relative_perturbation(native_v, size_v, gen)


def _derived_seed(seed: int, example: int, start: int) -> int:
    return seed * 1_000_003 + example * 1009 + start


ProgressFn = Callable[[float, str], None]


def sweep(target: LoadedModel, cases: Sequence[ContextCase], cfg: SweepConfig, *,
          num_source_layers: int | None = None, mot_for_start: Callable[[int], MoT] | None = None,
          source: LoadedModel | None = None, profile_mot: MoT | None = None,
          progress: ProgressFn | None = None, meta: dict | None = None) -> SweepResult:
    """Run the injection-start sweep on the cases (method.md §9.1 + §9.2 per start).

    * perturbation: needs only the target;
    * checkpoint-error-profile: needs `profile_mot` (any window) and `source`;
    * trained: needs `mot_for_start(start) -> MoT` (trained with that injection window) and `source`.
    The training-free modes replay densely; trained MoTs replay the way they were trained.
    """
    if cfg.mode != "perturbation" and source is None:
        raise ConfigError(f"mode {cfg.mode!r} needs the source model")
    if cfg.mode == "trained" and mot_for_start is None:
        raise ConfigError("mode 'trained' needs mot_for_start")
    if cfg.mode == "checkpoint-error-profile" and profile_mot is None:
        raise ConfigError("mode 'checkpoint-error-profile' needs a loaded checkpoint (profile_mot)")
    if not cases:
        raise ConfigError("the sweep needs at least one context")
    l_t = target.spec.num_layers
    if num_source_layers is None and source is not None:
        num_source_layers = source.spec.num_layers
    starts = list(cfg.starts) if cfg.starts is not None else valid_starts(l_t, cfg.window, num_source_layers)
    conditions = ("full_mix", "dir_only", "mag_only", "random") if cfg.controls else ("full_mix", "random")
    t_begin = time.perf_counter()
    per_start: dict[int, list[WindowRun]] = {s: [] for s in starts}
    native_scores: list[float] = []
    total = len(cases) * len(starts)
    done = 0
    for ei, case in enumerate(cases):
        native = native_cache(target, case.target_ids)
        native_trace = trace_cache(target, native, case.suffix_ids, case.answer_ids)
        native_score = None
        if cfg.task_metric and case.example is not None:
            native_score = answer_from_cache(target, native, case.example, "native", cfg.max_new_tokens).score
            native_scores.append(native_score)
        profile = None
        if cfg.mode == "checkpoint-error-profile":
            translation = translate(profile_mot, source, target, case.context_text)
            profile = error_profile(translation, profile_mot.channels)
        for start in starts:
            channels = injection_channels(num_source_layers or l_t, l_t, start, cfg.window)
            nk, nv = window_blocks(native, channels.target_layers, len(target.prefix_ids))
            seed = _derived_seed(cfg.seed, ei, start)
            full_mix = None
            if cfg.mode == "trained":
                mot = mot_for_start(start)
                if mot.channels.target_layers != channels.target_layers:
                    raise ConfigError(f"the MoT for start {start} injects {mot.channels.target_layers}, "
                                      f"not {channels.target_layers}")
                tr = translate(mot, source, target, case.context_text, with_native=False)
                wk, wv, full_mix = tr.translated.keys, tr.translated.values, tr.mixed_kv
                replay_fn = _mot_replay(mot, target, tr)
            else:
                sizes = profile if profile is not None else (cfg.perturbation_size, cfg.perturbation_size)
                wk, wv = perturbed_window(nk, nv, *sizes, seed=seed + _PERTURBATION_SEED_OFFSET)
                replay_fn = lambda k, v, layers=channels.target_layers, ids=case.target_ids: \
                    replay(target, ids, layers, k, v, sparse=None)
            caches = window_caches(replay_fn, nk, nv, wk, wv, conditions, seed,
                                   ready={"full_mix": full_mix} if full_mix is not None else None)
            per_start[start].append(run_window(target, case, native_trace, caches, channels, ei, cfg.task_metric,
                                               native_score, cfg.max_new_tokens))
            done += 1
            if progress:
                progress(done / total, f"context {ei + 1}/{len(cases)}, window start {start}")
    return _collect(target, cases, cfg, starts, per_start, native_scores, num_source_layers,
                    time.perf_counter() - t_begin, meta or {})


def _collect(target: LoadedModel, cases: Sequence[ContextCase], cfg: SweepConfig, starts: list[int],
             per_start: dict[int, list[WindowRun]], native_scores: list[float], num_source_layers: int | None,
             seconds: float, meta: dict) -> SweepResult:
    l_t = target.spec.num_layers
    kinds = {c.example.kind for c in cases if c.example is not None}
    metric = "f1" if kinds == {"extractive"} else "accuracy" if kinds == {"closed"} else "score"
    rows, token_frames, traj_frames, example_rows = [], [], [], []
    for start in starts:
        runs = per_start[start]
        end = start + cfg.window - 1
        ws = WindowShift(cfg.mode, start, end, l_t, [t for r in runs for t in r.shifts],
                         {c: sum(r.skipped.get(c, 0) for r in runs) for c in TRACE_CONDITIONS})
        row: dict = {"mode": cfg.mode, "start": start, "end": end, "k0": ws.k0, "num_upper_layers": ws.num_upper_layers,
                     "n_examples": len(runs)}
        for ei, r in enumerate(runs):
            example_rows.append({"start": start, "example": ei, **{f"{metric}_{c}": v for c, v in r.scores.items()},
                                 **{f"answer_logprob_{c}": v for c, v in r.answer_logprob.items()},
                                 **{f"kl_{k}": v for k, v in r.kl.items()}})
        for cond in (REFERENCE, *WINDOW_CONDITIONS):
            vals = [r.answer_logprob[cond] for r in runs if cond in r.answer_logprob]
            if vals:
                row[f"answer_logprob_{cond}"] = float(np.mean(vals))
                if cond != REFERENCE:
                    row[f"delta_answer_logprob_{cond}"] = row[f"answer_logprob_{cond}"] - row["answer_logprob_native"]
        for cond in ("native", "full_mix", "dir_only", "mag_only"):
            vals = [r.scores[cond] for r in runs if cond in r.scores]
            if vals:
                row[f"{metric}_{cond}"] = float(np.mean(vals))
        for cond in ("full_mix", "dir_only", "mag_only"):
            if f"{metric}_{cond}" in row and f"{metric}_native" in row:
                row[f"delta_{cond}"] = row[f"{metric}_{cond}"] - row[f"{metric}_native"]
        for a, b in KL_PAIRS:
            vals = [r.kl[f"{a}||{b}"] for r in runs if f"{a}||{b}" in r.kl]
            if vals:
                row[f"kl_{a}||{b}"] = float(np.mean(vals))
        sums = {c: ws.summary(c) for c in TRACE_CONDITIONS}
        for cond, s in sums.items():
            row.update({f"{cond}_{k}": v for k, v in asdict(s).items()})
        row.update(structural_advantage(sums["full_mix"], sums["random"]))
        rows.append(row)
        tok = ws.tokens()
        tok.insert(0, "start", start)
        token_frames.append(tok)
        traj = ws.trajectories()
        traj.insert(0, "start", start)
        traj_frames.append(traj)
    meta = {
        "target": target.spec.name, **meta,  # a caller's names (e.g. bundled names) win over the spec's
        "mode": cfg.mode, "mode_label": MODE_LABELS[cfg.mode], "config": asdict(cfg), "metric": metric,
        "target_layers": l_t, "num_source_layers": num_source_layers,
        "starts": starts, "n_examples": len(cases), "seconds": round(seconds, 1),
        "native_metric": float(np.mean(native_scores)) if native_scores else None,
    }
    return SweepResult(meta, pd.DataFrame(rows), pd.concat(token_frames, ignore_index=True),
                       pd.concat(traj_frames, ignore_index=True), pd.DataFrame(example_rows))


def find_sweeps(root: str | Path, source: str | None = None, target: str | None = None) -> dict[str, Path]:
    """Saved sweeps under root (folders with meta.json), optionally only those of one model pair: name -> folder.

    Ordered as MODES (trained sweeps, the real curve, first), then by name; folders of unknown mode last.
    """
    root = Path(root)
    found: list[tuple[int, str, Path]] = []
    if not root.is_dir():
        return {}
    for meta_file in root.glob("*/meta.json"):
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if (source is None or meta.get("source") == source) and (target is None or meta.get("target") == target):
            rank = MODES.index(meta["mode"]) if meta.get("mode") in MODES else len(MODES)
            found.append((rank, meta_file.parent.name, meta_file.parent))
    return {name: folder for _, name, folder in sorted(found)}
