"""A training run's folder on disk: what may be overwritten, and the resumable state as one atomic unit.

``run_dir/checkpoint/`` is a MoT checkpoint folder that also holds the optimiser's full state
(``optimizer.safetensors``: every parameter's own tensors — its Adam step, which lags for an expert the
router skipped, and its moments) and the step counter with the optimiser's other values (``train_state.json``,
written last). It is written whole to ``checkpoint.tmp-PID`` and swapped into place, so a kill at any moment leaves either the
previous unit or the new one; ``recover_checkpoint`` finds the newest complete unit after a kill
between the two renames. Only safetensors and JSON are read.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..cli import logger
from ..engine.checkpoint import load_checkpoint, swap_into_place, write_checkpoint
from ..engine.mot import MoT
from ..errors import CheckpointError, ConfigError
from ..fsutil import check_out_place, pid_alive, remove_stale_temporaries, temp_parts, write_text_atomic

CHECKPOINT = "checkpoint"
STATE_FILE = "train_state.json"  # written last: a unit without it is incomplete
OPTIMIZER_FILE = "optimizer.safetensors"
LOG_FILE = "log.jsonl"
CONFIG_FILE = "train_config.json"
# what a run writes into its folder; --overwrite removes exactly these
RUN_FILES = (CHECKPOINT, LOG_FILE, CONFIG_FILE, "bank_log.jsonl", "bank_stage.json", "resolved_channels.json",
             "channel_profile.json", STATE_FILE, OPTIMIZER_FILE)


def is_run(run_dir: Path) -> bool:
    """True when run_dir holds (part of) a training run."""
    return any((run_dir / name).exists() for name in (CONFIG_FILE, CHECKPOINT, LOG_FILE))


# a resumed run may extend its steps, and continue on another device
RESUMABLE_CHANGES = ("output_dir", "max_steps", "log_every", "save_every", "device")


def check_same_config(run_dir: Path, config: dict, defaults: dict) -> None:
    """A resumed run must continue with the settings it started with: `config` (this run's TrainConfig as JSON) is
    compared with the folder's train_config.json (a field it lacks counts as its default in `defaults`); only
    RESUMABLE_CHANGES may differ."""
    saved = json.loads((run_dir / CONFIG_FILE).read_text())
    changed = sorted(k for k, v in config.items()
                     if k not in RESUMABLE_CHANGES and saved.get(k, defaults.get(k)) != v)
    if changed:
        detail = ", ".join(f"{k} {saved.get(k, defaults.get(k))!r} -> {config[k]!r}" for k in changed)
        raise ConfigError(f"'{run_dir}' was started with other settings ({detail}): resume it with its own config "
                          "(--output_dir alone), or start the changed config with --overwrite or another --output_dir.")


def prepare_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> bool:
    """Check what the folder holds against --resume / --overwrite; returns True when a run is to be resumed.

    A finished or partial run is never replaced silently: without --resume it needs --overwrite.
    """
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite exclude each other: continue the run, or replace it.")
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"output_dir '{run_dir}' is a file. Choose a folder for the run.")
    # a file, a read-only place; a folder holding files a run does not write (a run's own files and its temporaries
    # are replaced only with --overwrite, below; a user's files never are)
    check_out_place(run_dir, "--output_dir", overwrite=resume or overwrite,
                    ours=lambda path: path.name in RUN_FILES or (temp_parts(path) or ("",))[0] in RUN_FILES)
    if resume:
        if not (run_dir / CONFIG_FILE).is_file():
            raise ConfigError(f"Nothing to resume in '{run_dir}' (no {CONFIG_FILE}). Start the run without --resume.")
        return True
    if run_dir.is_dir() and is_run(run_dir):
        if not overwrite:
            raise ConfigError(
                f"'{run_dir}' already holds a training run. Continue it with --resume, replace it with --overwrite, "
                "or choose another --output_dir."
            )
        remove_run_files(run_dir, remove_folder=False)
    return False


def _parameter_names(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The module's names of the optimiser's parameters, in the order its state_dict numbers them."""
    names = {id(p): n for n, p in module.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def optimizer_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """The optimiser's full state_dict keyed by parameter name: its tensors ("<name>::<key>") and the rest as JSON."""
    order = _parameter_names(module, optimizer)
    saved = optimizer.state_dict()
    tensors, values = {}, {}
    for index, state in saved["state"].items():
        for key, value in state.items():
            if torch.is_tensor(value):
                tensors[f"{order[index]}::{key}"] = value.contiguous()
            else:
                values.setdefault(order[index], {})[key] = value
    groups = [{**group, "params": [order[i] for i in group["params"]]} for group in saved["param_groups"]]
    return tensors, {"param_groups": groups, "values": values}


def load_optimizer_state(unit: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                          saved: dict) -> None:
    """Give the optimiser back what optimizer_state wrote, every parameter its own step and moments."""
    index = {name: i for i, name in enumerate(_parameter_names(module, optimizer))}
    try:
        state: dict[int, dict] = {}
        for key, tensor in tensors.items():
            name, _, field = key.rpartition("::")
            state.setdefault(index[name], {})[field] = tensor.clone()  # owned, not backed by the file
        for name, fields in saved["values"].items():
            state.setdefault(index[name], {}).update(fields)
        groups = [{**group, "params": [index[n] for n in group["params"]]} for group in saved["param_groups"]]
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    except (KeyError, ValueError, TypeError) as exc:
        raise CheckpointError(f"the optimiser state in '{unit}' does not fit this run's translator ({exc}). "
                              "Start the run again with --overwrite.") from exc


def save_state(run_dir: Path, mot: MoT, optimizer: torch.optim.Optimizer, step: int, training: dict,
               metrics: dict) -> Path:
    """Write checkpoint + the optimiser's full state + step as one unit, atomically."""
    tensors, values = optimizer_state(mot.translator, optimizer)
    final = run_dir / CHECKPOINT
    tmp = final.with_name(final.name + f".tmp-{os.getpid()}")
    write_checkpoint(mot, tmp, training={**training, "steps_done": step}, metrics=metrics)
    save_file(tensors, str(tmp / OPTIMIZER_FILE))
    device = str(next(mot.translator.parameters()).device)  # a resume elsewhere says it continues to rounding only
    write_text_atomic(tmp / STATE_FILE, json.dumps({"step": step, "optimizer": values, "device": device}))
    return swap_into_place(tmp, final)


def saved_device(run_dir: Path) -> str | None:
    """The device the run's state unit was saved on (None for a unit that does not say)."""
    try:
        return json.loads((run_dir / CHECKPOINT / STATE_FILE).read_text()).get("device")
    except (OSError, ValueError, AttributeError):
        return None


def _unit_step(folder: Path) -> int | None:
    """The step of a complete state unit, or None when it is incomplete or unreadable."""
    try:
        state = json.loads((folder / STATE_FILE).read_text())
        return int(state["step"]) if (folder / OPTIMIZER_FILE).is_file() else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def recover_checkpoint(run_dir: Path) -> Path | None:
    """The run's complete state unit, restored from what a kill mid-swap left; None when there is none.

    Candidates are checkpoint/ and the checkpoint.tmp-/.old- folders of processes that are gone (or of
    this process: an earlier call that was interrupted). The newest complete one becomes checkpoint/;
    the other leftovers are removed.
    """
    final = run_dir / CHECKPOINT
    if (run_dir / STATE_FILE).is_file() and final.is_dir() and not (final / STATE_FILE).exists():
        for name in (OPTIMIZER_FILE, STATE_FILE):  # a run written before the unit layout: move its state in
            if (run_dir / name).exists():
                os.replace(run_dir / name, final / name)
    leftovers = [p for p in run_dir.glob(f"{CHECKPOINT}.*-*") if (parts := temp_parts(p)) and parts[0] == CHECKPOINT
                 and (parts[2] == os.getpid() or not pid_alive(parts[2]))]
    units = [(s, p) for p in [final, *leftovers] if p.is_dir() and (s := _unit_step(p)) is not None]
    if not units:
        return None
    step, best = max(units, key=lambda u: (u[0], u[1] == final))
    if best != final:
        if final.exists():
            shutil.rmtree(final)
        os.replace(best, final)
    for p in leftovers:
        if p.exists():
            shutil.rmtree(p, ignore_errors=True)
    return final


def load_state(run_dir: Path, mot: MoT, optimizer: torch.optim.Optimizer) -> int:
    """Restore translator weights and the optimiser's full state from the run's state unit; returns its step."""
    unit = recover_checkpoint(run_dir)
    if unit is None:
        raise CheckpointError(f"'{run_dir}' has no complete checkpoint to resume from. Start it again with --overwrite.")
    state = json.loads((unit / STATE_FILE).read_text())
    trained, _ = load_checkpoint(unit)
    mot.translator.load_state_dict(trained.translator.state_dict())
    try:
        tensors = load_file(str(unit / OPTIMIZER_FILE))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{unit / OPTIMIZER_FILE} is damaged ({exc}). Start the run again with --overwrite.") from exc
    if "optimizer" in state:
        load_optimizer_state(unit, mot.translator, optimizer, tensors, state["optimizer"])
    else:
        _load_moments_only(unit, mot, optimizer, tensors, state["adam_step"])
    return int(state["step"])


def _load_moments_only(unit: Path, mot: MoT, optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                       adam_step: float) -> None:
    """A unit written before the full optimiser state: its moments, and one Adam step for every parameter."""
    logger(__name__).warning(
        f"'{unit}' holds one Adam step for all parameters (an older MoT Viz): experts the router skipped resume with "
        "too high a step, so this run continues close to, not exactly as, an uninterrupted one. For an exact run, "
        "start it again with --overwrite.")
    for name, p in mot.translator.named_parameters():
        if f"{name}::exp_avg" in tensors:
            optimizer.state[p] = {
                "step": torch.tensor(adam_step),
                "exp_avg": tensors[f"{name}::exp_avg"].to(p.device, copy=True),
                "exp_avg_sq": tensors[f"{name}::exp_avg_sq"].to(p.device, copy=True),
            }


def has_state(run_dir: Path) -> bool:
    """True when a complete state unit exists (after recovering one from a kill mid-swap)."""
    return recover_checkpoint(run_dir) is not None


def read_log(path: Path) -> list[dict]:
    """The rows of a JSONL log; a torn last line (an interrupted append) is dropped, not an error."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def read_training_log(checkpoint: str, name: str = "log.jsonl") -> pd.DataFrame | None:
    """The checkpoint's log.jsonl (or bank_log.jsonl) as a DataFrame (one row per logged step), or None without one."""
    path = Path(checkpoint) / name
    if not path.is_file():
        return None
    rows = read_log(path)  # a torn last line (an interrupted append) is skipped
    return pd.DataFrame(rows) if rows else None


def truncate_log(path: Path, step: int) -> None:
    """Keep the log rows of steps up to the resumed one, so a resumed run never logs a step twice."""
    rows = [r for r in read_log(path) if isinstance(r.get("step"), int) and r["step"] <= step]
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))


def remove_run_files(run_dir: Path, remove_folder: bool) -> None:
    """Remove what a run writes (RUN_FILES: --overwrite, or a run refused before its first save, which then leaves
    nothing that blocks a rerun or --resume), and the folder too if remove_folder and it is then empty."""
    for name in RUN_FILES:
        p = run_dir / name
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    if remove_folder and run_dir.is_dir() and not any(run_dir.iterdir()):
        run_dir.rmdir()


def clean_run_dir(run_dir: Path) -> None:
    """Remove temporary files of dead writers (checkpoint units are left to recover_checkpoint)."""
    remove_stale_temporaries(run_dir, keep=lambda p: p.name.startswith(CHECKPOINT + "."))
