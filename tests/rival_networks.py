"""The networks of the ways of sharing trained here (python -m mot_viz.train.rival), trained for a few steps on a
tiny pair in tests: each run's settings at test size, and one network per method exported where a test's runs find
it."""

from __future__ import annotations

from pathlib import Path

from mot_viz.train import rival
from mot_viz.train.rival_checkpoint import NETWORKS

RIVALS = tuple(NETWORKS)  # every way of sharing trained here


def tiny_config(method: str, out: Path, steps: int = 2, **kw) -> rival.RivalConfig:
    """A run of `method` at test size: short LAMBADA contexts, narrow C2C networks, one row per step."""
    arch = {"dim": 32} if method.startswith("c2c") else {}
    return rival.RivalConfig(method=method, output_dir=str(out), architecture=arch, max_steps=steps, batch_size=1,
                             corpus="lambada", corpus_tokens=1500, min_context=8, max_context=24, held_out=2,
                             save_every=1, log_every=1, **kw)


def trained_networks(source, target, runs: Path, export: Path, prefix: str, steps: int = 2) -> dict[str, Path]:
    """Each method's network trained for `steps` steps on (source, target) and exported as `export`/<prefix>-<method>
    (where an evaluation finds it beside a checkpoint named <prefix>)."""
    out = {}
    for method in RIVALS:
        folder = export / f"{prefix}-{method}"
        rival.train(tiny_config(method, runs / method, steps), export=str(folder), models=(source, target),
                    progress=False)
        out[method] = folder
    return out
