"""MoT checkpoints: a folder with ``config.json`` and ``translator.safetensors`` (method.md §10, project layout).

Only safetensors and JSON are ever read; a folder holding a pickle instead is refused. A checkpoint
records both models' geometry fingerprints, so loading it for another pair fails before any weight is used.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .channels import Channels
from .errors import CheckpointError, ConfigError
from .fsutil import write_text_atomic
from .mot import MoT, ReplayConfig, check_pair, mot_config_json, spec_from_json
from .translator import TranslatorConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "translator.safetensors"
FORMAT_VERSION = 1
_PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")


def write_checkpoint(mot: MoT, folder: Path, dtype: torch.dtype = torch.float32, training: dict | None = None,
                     metrics: dict | None = None, extra: dict | None = None) -> Path:
    """Write config.json and the weights into a fresh folder (not atomic: see save_checkpoint)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    config = {"format_version": FORMAT_VERSION, **mot_config_json(mot), "training": training or {},
              "metrics": metrics or {}, **(extra or {})}
    state = {k: v.detach().to(dtype).contiguous() for k, v in mot.translator.state_dict().items()}
    nonfinite = [k for k, v in state.items() if not torch.isfinite(v).all()]
    if nonfinite:  # NaN from a diverged run, or Inf from a value beyond fp16's range
        shutil.rmtree(folder, ignore_errors=True)
        raise CheckpointError(f"refusing to save NaN/Inf weights ({', '.join(nonfinite[:5])}) as {dtype}: "
                              "the run diverged (lower the learning rate) or the values exceed the dtype's range.")
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    save_file(state, str(folder / WEIGHTS_FILE), metadata={"format_version": str(FORMAT_VERSION)})
    return folder


def swap_into_place(tmp: Path, path: Path) -> Path:
    """Rename a finished folder over path; a kill between the renames leaves path.old-PID and tmp, both whole."""
    if path.exists():
        old = path.with_name(path.name + f".old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)
    return path


def save_checkpoint(mot: MoT, path: str | Path, dtype: torch.dtype = torch.float32,
                    training: dict | None = None, metrics: dict | None = None, extra: dict | None = None) -> Path:
    """Write the checkpoint folder atomically (a temporary folder renamed into place)."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    write_checkpoint(mot, tmp, dtype, training, metrics, extra)
    return swap_into_place(tmp, path)


def read_config(path: str | Path) -> dict:
    """The checkpoint's config.json, validated for the keys MoT Viz needs."""
    path = Path(path)
    cfg_file = path / CONFIG_FILE
    if not path.is_dir() or not cfg_file.is_file():
        pickles = [p.name for p in path.glob("*") if p.suffix in _PICKLE_SUFFIXES] if path.is_dir() else []
        if pickles:
            raise CheckpointError(
                f"'{path}' holds {', '.join(pickles)} but no {CONFIG_FILE}: MoT Viz never loads pickles. "
                "Convert the checkpoint to safetensors + config.json with mot_viz.checkpoint.save_checkpoint."
            )
        raise CheckpointError(f"'{path}' is not a MoT checkpoint folder (no {CONFIG_FILE}).")
    try:
        config = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{cfg_file} is not valid JSON ({exc}).") from exc
    if not isinstance(config, dict):
        raise CheckpointError(f"{cfg_file} holds a JSON {type(config).__name__}, not the object MoT Viz writes.")
    missing = [k for k in ("source", "target", "channels", "translator") if k not in config]
    if missing:
        raise CheckpointError(f"{cfg_file} lacks {', '.join(missing)}; it was not written by MoT Viz.")
    return config


def record_metrics(path: str | Path, key: str, value: dict) -> None:
    """Set metrics[key] in a checkpoint's config.json (written atomically); the weights are untouched."""
    config = read_config(path)
    config.setdefault("metrics", {})[key] = value
    write_text_atomic(Path(path) / CONFIG_FILE, json.dumps(config, indent=2))


def checkpoint_zip(path: Path) -> bytes:
    """A checkpoint folder's config.json and weights as a zip, for download."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in ("config.json", "translator.safetensors"):
            archive.write(path / name, f"{path.name}/{name}")
    return buffer.getvalue()


def load_checkpoint(path: str | Path, source=None, target=None) -> tuple[MoT, dict]:
    """Rebuild the MoT of a checkpoint folder (float32, eval mode) and return it with its config.

    When the loaded source/target models are given, they must be the pair the checkpoint was made for.
    Nothing is returned on any error: a corrupt, truncated or incomplete weights file raises CheckpointError.
    """
    path = Path(path)
    config = read_config(path)
    try:
        mot = MoT(spec_from_json(config["source"]), spec_from_json(config["target"]),
                  Channels.from_json(config["channels"]), TranslatorConfig(**config["translator"]),
                  ReplayConfig(**config.get("replay", {})))
    except (TypeError, KeyError, ValueError, AttributeError, ConfigError) as exc:  # rows missing keys, wrong types
        raise CheckpointError(f"{path / CONFIG_FILE} has an invalid configuration ({type(exc).__name__}: {exc}). "
                              "Re-export the checkpoint with MoT Viz or restore its config.json.") from exc
    if source is not None and target is not None:
        check_pair(mot, source, target)
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"'{path}' has no {WEIGHTS_FILE}.")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{weights} is corrupt or truncated ({exc}). Re-download or re-train it.") from exc
    expected = mot.translator.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{weights} does not match its config: missing {missing[:5]}{'…' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'…' if len(unexpected) > 5 else ''}."
        )
    bad = [k for k, v in state.items() if v.shape != expected[k].shape]
    if bad:
        raise CheckpointError(f"{weights}: wrong shapes for {bad[:5]}.")
    nonfinite = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if nonfinite:
        raise CheckpointError(
            f"{weights} holds NaN or Inf values in {', '.join(nonfinite[:5])}{'…' if len(nonfinite) > 5 else ''}: "
            "the training run diverged or the file was damaged. Use an earlier checkpoint or retrain."
        )
    mot.translator.load_state_dict({k: v.float() for k, v in state.items()})
    mot.eval()
    return mot, config
