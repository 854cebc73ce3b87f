"""The user cache of converted models: GGUF files de-quantised once into float32 Hugging Face folders.

A converted folder lives in ``$MOT_VIZ_CACHE/models`` (default ``~/.cache/mot_viz/models``). It is written
under a file lock into a temporary folder and renamed into place, so a half-written conversion is never used;
its marker ``mot_viz_conversion.json`` records every file's size (and each safetensors file's sha256), and a
folder whose files no longer match is converted again. Bundled models and users' own .gguf files (keyed by
the file's sha256) share this one path.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
from filelock import FileLock

from ..errors import ModelLoadError
from ..fsutil import remove_stale_temporaries, write_text_atomic

Progress = Callable[[str], None]
log = logging.getLogger(__name__)

CONVERSION_VERSION = 1  # bump when the conversion recipe changes, so old folders are rebuilt
MARKER = "mot_viz_conversion.json"  # written last: a folder without it is a half-written one


def _progress(message: str) -> None:
    log.info(message)


def _cache_error(path: Path, problem: str) -> ModelLoadError:
    where = "MOT_VIZ_CACHE points to" if "MOT_VIZ_CACHE" in os.environ else "The default model cache is"
    return ModelLoadError(
        f"{where} '{path}', which {problem}. MoT Viz keeps converted models there and needs a writable folder: "
        "set MOT_VIZ_CACHE to a folder you can write to (e.g. `export MOT_VIZ_CACHE=$HOME/.cache/mot_viz`)."
    )


def cache_dir() -> Path:
    """The user cache folder (``$MOT_VIZ_CACHE`` or ``~/.cache/mot_viz``); refused if a file or not writable."""
    root = Path(os.environ.get("MOT_VIZ_CACHE") or Path.home() / ".cache" / "mot_viz").expanduser()
    if root.exists() and not root.is_dir():
        raise _cache_error(root, "is a file, not a folder")
    if root.is_dir() and not os.access(root, os.W_OK | os.X_OK):
        raise _cache_error(root, "is not writable")
    return root


def models_root() -> Path:
    """``<cache>/models``, created if needed."""
    cache = cache_dir()
    root = cache / "models"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _cache_error(cache, f"cannot hold the folder models/ ({exc.strerror})") from exc
    if not os.access(root, os.W_OK | os.X_OK):
        raise _cache_error(cache, "holds a models/ folder that is not writable")
    return root


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def gguf_digest(path: Path, progress: Progress = _progress) -> str:
    """sha256 of a local file, remembered by (path, size, mtime) so a later start does not re-read a GB."""
    stat, key = path.stat(), str(path.resolve())
    index_file = models_root() / "gguf-digests.json"
    try:
        index = json.loads(index_file.read_text())
    except (OSError, ValueError):
        index = {}
    index = index if isinstance(index, dict) else {}
    seen = index.get(key)
    if isinstance(seen, dict) and (seen.get("size"), seen.get("mtime_ns")) == (stat.st_size, stat.st_mtime_ns):
        return seen["sha256"]
    progress(f"hashing {path.name} ({stat.st_size / 1e6:.0f} MB, once) ...")
    digest = file_sha256(path)
    index[key] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest}
    write_text_atomic(index_file, json.dumps(index, indent=1))
    return digest


def gguf_architecture(path: Path) -> str | None:
    """The architecture a GGUF file's header names (general.architecture), or None when the header cannot be read
    (conversion then reports the damage). Only the header is parsed: the tensors are mapped, never read."""
    from gguf import GGUFReader

    try:
        field = GGUFReader(path).get_field("general.architecture")
        return None if field is None else str(field.contents())
    except Exception:  # a truncated or malformed header, however the parser fails on it
        return None


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """De-quantise a GGUF file to a float32 Hugging Face folder at out_dir (atomic: tmp folder + rename)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out_dir.with_name(out_dir.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    start = time.time()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                     dtype=torch.float32)
        model.hf_quantizer = None  # a de-quantised GGUF model refuses save_pretrained otherwise
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / MARKER).write_text(json.dumps(
            {"source": gguf_path.name, "version": CONVERSION_VERSION, "seconds": round(time.time() - start, 1)}
        ))
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after the rename; a failed attempt leaves nothing


def _marker(folder: Path) -> dict | None:
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _damaged(folder: Path, marker: dict) -> list[str]:
    """Recorded files that are missing or have another size (a stat per file: cheap at every load)."""
    files = marker.get("files", {})
    if not isinstance(files, dict):
        return [MARKER]
    return [name for name, rec in files.items()
            if not (folder / name).is_file() or (folder / name).stat().st_size != rec.get("size")]


def _file_record(folder: Path) -> dict:
    """Size of every file in a converted folder, plus the sha256 of the weights (read once, at conversion)."""
    record = {}
    for p in sorted(folder.iterdir()):
        if p.is_file() and p.name != MARKER:
            record[p.name] = {"size": p.stat().st_size}
            if p.suffix == ".safetensors":
                record[p.name]["sha256"] = file_sha256(p)
    return record


def converted_folder(key: str, label: str, gguf: Callable[[Path], Path], convert: Callable[[Path, Path], None],
                     progress: Progress | None = None) -> Path:
    """The verified converted folder ``<cache>/models/<key>-v<N>``, converting once if missing or damaged.

    gguf(work_dir) returns the GGUF file (it may assemble it in work_dir); convert(gguf_path, out_dir) writes
    the folder atomically. Safe across processes: one converts under the lock, the others wait and reuse.
    """
    progress = progress or _progress
    root = models_root()
    out_dir = root / f"{key}-v{CONVERSION_VERSION}"
    marker = _marker(out_dir)
    if marker is not None and "files" in marker and not _damaged(out_dir, marker):
        return out_dir
    with FileLock(str(root / f"{key}.lock")):
        remove_stale_temporaries(root)  # folders of conversions whose process died
        marker = _marker(out_dir)  # another process may have converted it while we waited
        damaged = [MARKER] if marker is None else _damaged(out_dir, marker)
        if damaged:
            if out_dir.exists():
                progress(f"{out_dir} is incomplete or damaged ({', '.join(damaged)}); converting it again")
            shutil.rmtree(out_dir, ignore_errors=True)
            work = root / f"{key}.work-{os.getpid()}"
            work.mkdir(exist_ok=True)
            try:
                gguf_path = gguf(work)
                start = time.time()
                progress(f"converting {label} to a float32 Hugging Face folder (once; ~1 min on 2 cores) ...")
                convert(gguf_path, out_dir)
            except ModelLoadError:
                raise
            except Exception as exc:
                raise ModelLoadError(
                    f"Cannot convert the GGUF model '{label}': {type(exc).__name__}: {exc}. Expected a complete "
                    "GGUF model file; this one may be truncated, damaged or of an architecture transformers cannot "
                    "read: download it again (bundled models: rerun `bash scripts/setup.sh`)."
                ) from exc
            finally:
                shutil.rmtree(work, ignore_errors=True)
            progress(f"converted in {time.time() - start:.0f} s -> {out_dir}")
            marker = _marker(out_dir) or {}
        if "files" not in marker:  # also upgrades folders converted before sizes were recorded
            write_text_atomic(out_dir / MARKER, json.dumps({**marker, "files": _file_record(out_dir)}, indent=1))
    return out_dir
