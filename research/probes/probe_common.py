"""What the fidelity probes share: a checkpoint's bank, the probe split, window cosines as markdown, reports.

One-off research code, kept to rerun the probes whose numbers docs/results/training.md cites; not part of the library.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.models import LoadedModel, load_model
from mot_viz.engine.mot import MoT
from mot_viz.errors import ConfigError
from mot_viz.train.window_fidelity import vector_fidelity
from mot_viz.fsutil import write_text_atomic
from mot_viz.train.bank import Bank, build_bank
from mot_viz.train.config import TrainConfig


def checkpoint_bank(checkpoint: Path, source: LoadedModel | None = None, target: LoadedModel | None = None
                    ) -> tuple[MoT, LoadedModel, LoadedModel, Bank]:
    """A checkpoint's MoT, its source and target models (loaded by the names it records unless given), and the bank
    its training read (built first if missing), with the settings its config.json records under "training" (as
    mot_viz.train.train builds it: the train seed)."""
    config = json.loads((Path(checkpoint) / "config.json").read_text())
    training = config.get("training", config)
    missing = [k for k in ("bank_corpus", "bank_tokens", "bank_min_tokens", "bank_max_tokens", "seed")
               if k not in training]
    if missing:
        raise ConfigError(f"{checkpoint} records no training bank ({', '.join(missing)} missing from its config.json); "
                          "give a checkpoint trained from a bank (its config has bank_corpus, bank_tokens, …)")
    known = {f.name for f in dataclasses.fields(TrainConfig)}  # the record also holds run facts (steps_done, …)
    cfg = TrainConfig(**{k: v for k, v in training.items() if k in known}).bank_config()
    source = source or load_model(config["source"]["name"])
    target = target or load_model(config["target"]["name"])
    mot, _ = load_checkpoint(checkpoint, source, target)
    mot.eval()
    return mot, source, target, build_bank(mot, source, target, cfg)


WINDOW_COSINES = ("raw_k", "cent_k", "raw_v", "cent_v")


def window_cosines(contexts) -> dict[str, torch.Tensor]:
    """Per window layer, the mean over contexts of the raw and centered cosine of K and of V to native (the probe
    scripts' scores): contexts, a sequence of (K, V, native K, native V) blocks [N, W, H], one per context.
    Returns {"raw_k", "cent_k", "raw_v", "cent_v"}: each [W]."""
    contexts = list(contexts)
    window = contexts[0][2].shape[1]
    scores = {m: torch.zeros(window) for m in WINDOW_COSINES}
    for keys, values, native_keys, native_values in contexts:
        for kv, pred, ref in (("k", keys, native_keys), ("v", values, native_values)):
            for layer in range(window):
                f = vector_fidelity(pred[:, layer], ref[:, layer])
                scores[f"raw_{kv}"][layer] += f["raw_cos"] / len(contexts)
                scores[f"cent_{kv}"][layer] += f["centered_cos"] / len(contexts)
    return scores


def probe_split(bank) -> tuple[list[int], list[int], list[int]]:
    """The probe scripts' bank contexts (fit, λ, held-out): the bank's held-out share (Bank.split) and its training
    contexts split again, the last tenth (at least one) choosing a map's λ."""
    train, val = bank.split()
    n_lam = max(1, round(len(train) * 0.1))
    return train[:-n_lam], train[-n_lam:], val


def held_out_items(bank, contexts: list[int], keys: torch.Tensor, values: torch.Tensor) -> list[tuple]:
    """Predicted K and V rows [n, W·H] of bank `contexts` (their rows concatenated in that order) -> window_cosines'
    items: per context (K, V, native K, native V) blocks [N, W, H]."""
    items, offset = [], 0
    window = bank.target_keys.shape[1]
    for i in contexts:
        n, rows = int(bank.lengths[i]), bank.rows([i])
        items.append((keys[offset:offset + n].float().view(n, window, -1),
                      values[offset:offset + n].float().view(n, window, -1),
                      bank.target_keys[rows], bank.target_values[rows]))
        offset += n
    return items


def window_cosine_cells(scores: dict[str, torch.Tensor]) -> str:
    """window_cosines as markdown cells: raw V and centered V per layer, then the window means of raw K, centered K,
    raw V and centered V (the columns of window_cosine_header)."""
    return (" | ".join(f"{float(v):.3f}" for m in ("raw_v", "cent_v") for v in scores[m]) + " | "
            + " | ".join(f"{float(scores[m].mean()):.3f}" for m in WINDOW_COSINES))


def window_cosine_header(layers) -> str:
    """The column names of window_cosine_cells for the window's target layers."""
    return (" | ".join(f"{m} L{layer}" for m in ("raw V", "cent V") for layer in layers)
            + " | raw K | cent K | raw V | cent V")


def write_lines(path: Path | None, lines: list[str]) -> None:
    """A script's report (markdown lines) written to `path`, its folder made first; no path: nothing written."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, "\n".join(lines) + "\n")
