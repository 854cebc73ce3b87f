"""MoT checkpoints: a folder with ``config.json`` and ``translator.safetensors`` (method.md §10, project layout).

Only safetensors and JSON are ever read; a folder holding a pickle instead is refused. A checkpoint
records both models' geometry fingerprints, so loading it for another pair fails before any weight is used.

A mixture initialised from a closed-form linear map keeps that map as a fixed residual path (``linear.*``
weights, most of its bytes). Written with ``shared_linear``, the checkpoint stores those weights once: its
config.json names the linear checkpoint they equal (relative path + SHA-256 of its weights file) and loading
reads them from there. ``checkpoint_zip`` always writes a self-contained copy.
"""

from __future__ import annotations

import json
from dataclasses import asdict
import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save, save_file

from ..errors import CheckpointError, ConfigError
from ..fsutil import named, temp_parts, write_text_atomic
from .channels import Channels
from .model_cache import file_sha256
from .models import ModelSpec
from .mot import MoT, check_pair
from .replay_config import ReplayConfig
from .translator import TranslatorConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "translator.safetensors"
FORMAT_VERSION = 1
SHARED_LINEAR = "shared_linear"  # config key: {"checkpoint": relative folder, "sha256": of its weights file}
LINEAR_PREFIX = "linear."  # the translator's closed-form path (the residual path of a linear-initialised mixture)
_PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")


def weights_sha256(folder: Path) -> str:
    """SHA-256 of a checkpoint folder's weights file (what a shared linear path is checked against)."""
    return file_sha256(Path(folder) / WEIGHTS_FILE)


def _within_one_ulp(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of one floating dtype differ by at most one unit in the last place everywhere."""
    eps, tiny = torch.finfo(a.dtype).eps, torch.finfo(a.dtype).smallest_normal
    a, b = a.double(), b.double()
    return bool(((a - b).abs() <= (a.abs().maximum(b.abs()) * eps).clamp(min=tiny)).all())


def _share_linear(state: dict[str, torch.Tensor], final: Path, linear: Path) -> tuple[dict, dict]:
    """Drop the linear.* weights that equal those of the checkpoint at `linear`; the config entry naming it.

    "Equal" allows one unit in the last place of the stored dtype: the same closed-form fit, repeated on another
    run, can round a few weights the other way (an fp16 export already moves every weight by up to half that).
    The largest difference is recorded; the shared weights are the ones loaded.
    """
    own = {k: v for k, v in state.items() if k.startswith(LINEAR_PREFIX)}
    if not own:
        raise CheckpointError("shared_linear was given, but this translator has no linear path to share.")
    if Path(linear).resolve() == Path(final).resolve():
        raise CheckpointError(f"shared_linear names '{linear}', the checkpoint being saved: a checkpoint cannot store "
                              "its linear path in itself by reference. Name the linear checkpoint it was initialised "
                              "from, or save it in full (no shared_linear).")
    theirs = _linear_weights(Path(linear), Path(final))
    if set(own) != set(theirs) or any(v.dtype != theirs[k].dtype or v.shape != theirs[k].shape
                                      or not _within_one_ulp(v, theirs[k]) for k, v in own.items()):
        raise CheckpointError(f"the linear path is not the one stored in '{linear}' (other weights or dtype): "
                              "save it in full, or share the linear checkpoint it was initialised from.")
    reference = {"checkpoint": os.path.relpath(Path(linear).resolve(), Path(final).resolve()),
                 "sha256": weights_sha256(Path(linear)),
                 "max_abs_difference": max(float((v.double() - theirs[k].double()).abs().max()) for k, v in own.items())}
    return {k: v for k, v in state.items() if k not in own}, reference


def write_checkpoint(mot: MoT, folder: Path, dtype: torch.dtype = torch.float32, training: dict | None = None,
                     metrics: dict | None = None, extra: dict | None = None, shared_linear: Path | None = None,
                     final: Path | None = None) -> Path:
    """Write config.json and the weights into a fresh folder (not atomic: see save_checkpoint).

    shared_linear: a linear checkpoint whose weights this translator's linear path equals; they are then stored
    there only, referenced relative to `final` (where the folder will live; default: `folder`).
    """
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
    if shared_linear is not None:
        try:
            state, config[SHARED_LINEAR] = _share_linear(state, final or folder, shared_linear)
        except CheckpointError:
            shutil.rmtree(folder, ignore_errors=True)
            raise
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    save_file(state, str(folder / WEIGHTS_FILE), metadata={"format_version": str(FORMAT_VERSION)})
    return folder


def swap_into_place(tmp: Path, path: Path, overwrite: bool = False) -> Path:
    """Rename a finished folder over path; a kill between the renames leaves path.old-PID and tmp, both whole.

    It removes only what the new folder replaces: a file at path, or (unless `overwrite`, which the caller passes
    for a user's --overwrite or for files it carries over itself) a folder holding names the new one lacks, is
    refused with ConfigError, tmp removed and path untouched."""
    if path.exists() or path.is_symlink():
        lacking = sorted({p.name for p in path.iterdir()} - {p.name for p in tmp.iterdir()}) if path.is_dir() else []
        if not path.is_dir() or (lacking and not overwrite):
            shutil.rmtree(tmp, ignore_errors=True)
            what = f"holds files it did not write ({named(lacking)})" if path.is_dir() else "is a file"
            raise ConfigError(f"{path} {what}, which writing this folder there would delete. Pass a new or empty "
                              "folder" + (", or --overwrite to replace them." if path.is_dir() else "."))
        old = path.with_name(path.name + f".old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)
    return path


def save_checkpoint(mot: MoT, path: str | Path, dtype: torch.dtype = torch.float32,
                    training: dict | None = None, metrics: dict | None = None, extra: dict | None = None,
                    shared_linear: str | Path | None = None, overwrite: bool = False) -> Path:
    """Write the checkpoint folder atomically (a temporary folder renamed into place); see write_checkpoint.
    A folder at path holding other files than a checkpoint's is replaced only with `overwrite` (swap_into_place)."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    write_checkpoint(mot, tmp, dtype, training, metrics, extra,
                     shared_linear=None if shared_linear is None else Path(shared_linear), final=path)
    return swap_into_place(tmp, path, overwrite)


def read_config(path: str | Path) -> dict:
    """The checkpoint's config.json, validated for the keys MoT Viz needs."""
    path = Path(path)
    cfg_file = path / CONFIG_FILE
    if not path.is_dir() or not cfg_file.is_file():
        pickles = [p.name for p in path.glob("*") if p.suffix in _PICKLE_SUFFIXES] if path.is_dir() else []
        if pickles:
            raise CheckpointError(
                f"'{path}' holds {', '.join(pickles)} but no {CONFIG_FILE}: MoT Viz never loads pickles. "
                "Convert the checkpoint to safetensors + config.json with mot_viz.engine.checkpoint.save_checkpoint."
            )
        torn = sorted(p.name for p in path.parent.glob(f"{path.name}.*-*") if (parts := temp_parts(p))
                      and parts[0] == path.name and p.is_dir()) if not path.exists() else []
        if torn:  # a training run killed between a save's two renames: its state is whole in these folders
            raise CheckpointError(f"'{path}' is missing: a save of its training run was interrupted between its two "
                                  f"renames and left {', '.join(torn)}. `python -m mot_viz.train.train --output_dir "
                                  f"{path.parent} --resume` recovers it, then continues the run to its max_steps.")
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


def _linear_weights(linear: Path, named_by: Path, sha256: str | None = None) -> dict[str, torch.Tensor]:
    """The linear.* weights of the checkpoint `linear`, which `named_by` names as its shared linear path (checked
    against the SHA-256 recorded for them, when given).

    They must be stored there in full: a shared path that is itself shared makes a chain, and one that leads back
    (a checkpoint naming itself, or two naming each other) would be followed forever.
    """
    onward = read_config(linear).get(SHARED_LINEAR)
    if onward is not None:
        here = Path(named_by).resolve()
        if Path(linear).resolve() == here:
            what = "itself: a cycle"
        elif isinstance(onward, dict) and (Path(linear) / str(onward.get("checkpoint"))).resolve() == here:
            what = "which names it back: a cycle"
        else:
            what = "which stores its own linear path by reference too: a chain"
        raise CheckpointError(
            f"'{named_by}' names '{linear}' as the checkpoint holding its linear path ('{SHARED_LINEAR}' in "
            f"{CONFIG_FILE}), {what}. A shared linear path must be stored in full where it is named: point "
            f"'{SHARED_LINEAR}' at the linear checkpoint it was initialised from (with its SHA-256), or download the "
            "checkpoint as a zip from the app (self-contained).")
    if sha256 is not None and weights_sha256(linear) != sha256:
        raise CheckpointError(f"the linear checkpoint '{linear}' changed since '{named_by}' was saved (SHA-256 "
                              "differs): restore it, or re-export this checkpoint in full.")
    return {k: v for k, v in read_weights(linear).items() if k.startswith(LINEAR_PREFIX)}


def read_weights(path: str | Path, config: dict | None = None) -> dict[str, torch.Tensor]:
    """The checkpoint's stored tensors (their stored dtype), a shared linear path read from its own checkpoint."""
    path = Path(path)
    config = read_config(path) if config is None else config
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"'{path}' has no {WEIGHTS_FILE}.")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{weights} is corrupt or truncated ({exc}). Re-download or re-train it.") from exc
    shared = config.get(SHARED_LINEAR)
    if shared is None:
        return state
    try:
        linear = (path / shared["checkpoint"]).resolve()
        expected = str(shared["sha256"])
    except (TypeError, KeyError) as exc:
        raise CheckpointError(f"{path / CONFIG_FILE}: '{SHARED_LINEAR}' is malformed ({exc}).") from exc
    if not (linear / WEIGHTS_FILE).is_file():
        raise CheckpointError(f"'{path}' stores its linear path in the checkpoint '{linear}', which is missing. Keep "
                              "the two folders side by side as shipped, or download the checkpoint as a zip from "
                              "the app (self-contained).")
    shared_state = _linear_weights(linear, path, expected)
    clash = sorted(set(shared_state) & set(state))
    if clash:
        raise CheckpointError(f"{weights} stores {clash[:3]} itself and also names a shared linear path.")
    return {**state, **shared_state}


def checkpoint_zip(path: Path) -> bytes:
    """A checkpoint folder's config.json and weights as a self-contained zip, for download (a shared linear
    path is written into the zipped weights)."""
    import io
    import zipfile

    config = read_config(path)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        if SHARED_LINEAR in config:
            state = read_weights(path, config)
            config = {k: v for k, v in config.items() if k != SHARED_LINEAR}
            archive.writestr(f"{path.name}/{CONFIG_FILE}", json.dumps(config, indent=2))
            archive.writestr(f"{path.name}/{WEIGHTS_FILE}",
                             save(state, metadata={"format_version": str(FORMAT_VERSION)}))
        else:
            for name in (CONFIG_FILE, WEIGHTS_FILE):
                archive.write(path / name, f"{path.name}/{name}")
    return buffer.getvalue()


def load_checkpoint(path: str | Path, source=None, target=None) -> tuple[MoT, dict]:
    """Rebuild the MoT of a checkpoint folder (float32, eval mode) and return it with its config.

    When the loaded source/target models are given, they must be the pair the checkpoint was made for, and the
    translator goes to the target's device.
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
    state = read_weights(path, config)
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
    if target is not None:
        mot.to(target.device)
    mot.eval()
    return mot, config


def copy_linear_path(mot: MoT, path: str | Path) -> dict:
    """Set `mot`'s linear path to the map of the linear checkpoint at `path` (same pair, window and key space).

    A mixture that starts from a shipped linear map (rather than a fit of its own, which may round a few weights
    differently) can then store that path by reference, exactly (save_checkpoint's shared_linear). Returns a
    report like fit.fit_linear's, naming the checkpoint.
    """
    linear, config = load_checkpoint(path)
    if mot.translator.linear is None:
        raise CheckpointError("this translator has no linear path to copy into (use init 'linear').")
    if linear.translator.config.variant != "linear":
        raise CheckpointError(f"'{path}' is a {linear.translator.config.variant!r} checkpoint, not a linear map.")
    same = (linear.source.fingerprint == mot.source.fingerprint and linear.target.fingerprint == mot.target.fingerprint
            and linear.channels == mot.channels
            and linear.translator.config.key_space == mot.translator.config.key_space
            and all(getattr(linear.translator.config, k) == getattr(mot.translator.config, k)
                    for k in ("linear_previous", "linear_previous_dims", "linear_extra_layers",
                              "linear_extra_dims", "linear_rank")))
    if not same:
        raise CheckpointError(f"'{path}' maps another pair, window, key space or token context than this translator: "
                              "copy the linear checkpoint of the same window, or fit one (leave linear_from empty).")
    with torch.no_grad():
        mot.translator.linear.load_state_dict(linear.translator.linear.state_dict())
    fit = (config.get("metrics") or {}).get("linear_fit") or (config.get("metrics") or {}).get("bank", {})
    return {"from": str(path), "sha256": weights_sha256(Path(path)),
            **{k: fit[k] for k in ("lambda_k", "lambda_v", "train_tokens") if k in fit}}


def spec_from_json(d: dict) -> ModelSpec:
    """A model spec as a checkpoint's config.json stores it."""
    d = dict(d)
    d["sliding_layers"] = tuple(d.get("sliding_layers", ()))
    return ModelSpec(**d)


def mot_config_json(mot: MoT) -> dict:
    """What a checkpoint's config.json says of a MoT: the two model specs, channels, translator and replay."""
    return {
        "source": mot.source.to_json(),
        "target": mot.target.to_json(),
        "channels": mot.channels.to_json(),
        "translator": mot.translator.config.to_json(),
        "replay": asdict(mot.replay),
    }
