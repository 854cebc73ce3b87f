"""Synthetic models: real architectures with seeded random weights and no tokenizer files.

``synthetic:<name>`` (load_model, every CLI's model arguments, the sidebar) builds the architecture of
configs/architectures/<name>.json (the bundled pair's two, and real-size ones copied from published config.json files)
with random weights drawn from a seed derived from the name; ``synthetic:<name>@<layers>`` keeps only the first
<layers> layers (the tests' reduced depth). Nothing needs a download, a model file or a dataset, so the engine's cost
can be measured at real sizes on a machine given only the code (scripts/gpu_check.py --synthetic).

There is no tokenizer: a synthetic model's "text" is its token ids written as numbers ("17 4021 883"), which a
generated word-level vocabulary maps back one to one. A context is drawn from a seeded id stream shared by the pair
(ids below both vocabularies), so the two tokenizations are the same ids and the alignment is the identity
(SYNTHETIC_ALIGNMENT). Random weights measure cost and numerics, never quality (NO_QUALITY).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path

import torch

from ..errors import ModelLoadError

SYNTHETIC_PREFIX = "synthetic:"
ARCHITECTURES = Path(__file__).resolve().parents[2] / "configs" / "architectures"
NO_QUALITY = "synthetic models (random weights): these numbers measure cost and numerics, no quality"
SYNTHETIC_ALIGNMENT = ("the alignment of two synthetic models is the identity on a shared id stream (both read the "
                       "same token ids; no tokenizer)")
STREAM_START = 16  # the id stream draws from [STREAM_START, shared vocabulary): no special token's id (the bundled
# pair's BOS, EOS, pad and unknown ids are all below it)
# the whole name (fullmatch: a trailing newline is no other model); an architecture name of at most 100 characters
_NAME = re.compile(r"synthetic:([A-Za-z0-9._-]{1,100}?)(?:@(\d+))?")
PROC, CGROUP = Path("/proc"), Path("/sys/fs/cgroup")  # where the process's memory limits are read
UNLIMITED = 2**60  # a cgroup v1 limit at or above this is "no limit" (the kernel writes 2^63 rounded to a page)


def is_synthetic(name: object) -> bool:
    """Whether a model name asks for a synthetic model."""
    return isinstance(name, str) and name.startswith(SYNTHETIC_PREFIX)


def synthetic_names() -> list[str]:
    """Every synthetic model name the shipped architecture configs offer."""
    return [SYNTHETIC_PREFIX + p.stem for p in sorted(ARCHITECTURES.glob("*.json"))]


def parse_name(name: str) -> tuple[str, int | None]:
    """(architecture, layers or None) of ``synthetic:<architecture>[@<layers>]``; ModelLoadError when unknown."""
    match = _NAME.fullmatch(name)
    known = ", ".join(synthetic_names()) or f"none (no JSON in {ARCHITECTURES})"
    if match is None or not (ARCHITECTURES / f"{match.group(1)}.json").is_file():
        raise ModelLoadError(f"Unknown synthetic model {_quoted(name)}: synthetic models are {known} (optionally "
                             "'@<layers>' for a reduced depth, e.g. synthetic:llama3.2-1b@2).")
    digits = match.group(2)
    if digits is not None and len(digits.lstrip("0")) > 6:  # far past any model's depth (and int()'s digit limit)
        raise ModelLoadError(f"{_quoted(name)} asks for a {len(digits):,}-digit number of layers: write "
                             f"synthetic:{match.group(1)}@<layers>, e.g. @2, or synthetic:{match.group(1)} for all.")
    return match.group(1), int(digits) if digits else None


def _quoted(name: str, most: int = 80) -> str:
    """A model name as a message quotes it: repr (a control character shows), cut short past `most` characters."""
    if len(name) <= most:
        return repr(name)
    return f"{name[:most // 2]!r}…{name[-(most // 4):]!r} ({len(name):,} characters)"


@functools.lru_cache(maxsize=None)
def architecture(arch: str) -> dict:
    """The shipped architecture file of `arch` (about, published, bos, config)."""
    return json.loads((ARCHITECTURES / f"{arch}.json").read_text())


def hf_config(name: str):
    """The transformers config of a synthetic model name (its depth cut to @layers when given)."""
    from transformers import AutoConfig  # heavy: only when a synthetic model is built

    arch, layers = parse_name(name)
    config = dict(architecture(arch)["config"])
    full = config["num_hidden_layers"]
    if layers is not None:
        if not 1 <= layers <= full:
            raise ModelLoadError(f"'{name}' asks for {layers} layers; {arch} has 1 to {full}: write "
                                 f"synthetic:{arch}@<1–{full}>, or synthetic:{arch} for all of them.")
        config["num_hidden_layers"] = layers
        if "layer_types" in config:
            config["layer_types"] = config["layer_types"][:layers]
    return AutoConfig.for_model(**config)


def _meta_model(config, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM  # heavy: only when a synthetic model is built

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def parameter_count(name: str) -> int:
    """Parameters of a synthetic model (tied embeddings counted once), from its config alone (nothing allocated)."""
    return sum(p.numel() for p in _meta_model(hf_config(name)).parameters())


def available_bytes(device: torch.device) -> int | None:
    """Memory this process may still allocate on a device: a GPU's free memory; on the CPU the least of the machine's
    available RAM (MemAvailable), the room under its cgroup's memory limits (v2 and v1, its own and those above it)
    and under its address-space and data rlimits. None where none of them can be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    rooms = [_meminfo_available(), _cgroup_room(), *_rlimit_rooms()]
    return min((r for r in rooms if r is not None), default=None)


def _meminfo_available() -> int | None:
    try:
        with open(PROC / "meminfo") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def _read_bytes(path: Path) -> int | None:
    """A cgroup file's number of bytes; None for "max" (no limit) or a file that cannot be read."""
    try:
        text = path.read_text().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _cgroup_room() -> int | None:
    """Bytes left under the tightest memory limit of this process's cgroup and those above it (cgroup v2
    memory.max - memory.current, v1 memory.limit_in_bytes - memory.usage_in_bytes); None when none is set."""
    try:
        lines = (PROC / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    rooms = []
    for line in lines:
        _, controllers, where = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            base, limit_name, usage_name = CGROUP, "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            base, limit_name, usage_name = CGROUP / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        own = Path(where.strip().lstrip("/"))
        for folder in {base / own, *(base / up for up in own.parents)}:  # a container mounts its own at base
            limit = _read_bytes(folder / limit_name)
            if limit is not None and limit < UNLIMITED:
                rooms.append(max(limit - (_read_bytes(folder / usage_name) or 0), 0))
    return min(rooms, default=None)


def _rlimit_rooms() -> list[int | None]:
    """Bytes left under RLIMIT_AS (the address space, VmSize) and RLIMIT_DATA (VmData); None where unlimited."""
    import resource

    try:
        with open(PROC / "self" / "status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        status = {}
    rooms = []
    for limit, used in ((resource.RLIMIT_AS, "VmSize"), (resource.RLIMIT_DATA, "VmData")):
        soft = resource.getrlimit(limit)[0]
        try:
            in_use = int(status[used].split()[0]) * 1024
        except (KeyError, ValueError):
            in_use = 0
        rooms.append(None if soft == resource.RLIM_INFINITY else max(soft - in_use, 0))
    return rooms


def check_fits(names: list[str], device: torch.device, dtype: torch.dtype = torch.float32) -> None:
    """Refuse (ModelLoadError), before anything is loaded, synthetic models whose weights together exceed the memory
    this process may still allocate on the device (available_bytes); names that are not synthetic are not counted.
    A command loading a pair passes both names, so neither is built when the two cannot fit."""
    synthetic = [n for n in names if is_synthetic(n)]
    if not synthetic:
        return
    size = torch.empty(0, dtype=dtype).element_size()
    needed = sum(parameter_count(n) for n in synthetic) * size
    free = available_bytes(device)
    if free is not None and needed > free:
        what = " and ".join(synthetic)
        raise ModelLoadError(
            f"{what} need{'s' * (len(synthetic) == 1)} {needed / 2**30:.1f} GiB for {str(dtype).removeprefix('torch.')} "
            f"weights (activations come on top), but {device} has {free / 2**30:.1f} GiB free for this process (its "
            "memory limits counted): use a device with more memory, bfloat16, or fewer layers "
            "(synthetic:<name>@<layers>).")


def model_seed(name: str, seed: int = 0) -> int:
    """The weights' seed of a synthetic model: its name (and depth) hashed with `seed`."""
    return int.from_bytes(hashlib.sha256(f"{name}#{seed}".encode()).digest()[:4], "little")


@functools.lru_cache(maxsize=None)
def synthetic_tokenizer(vocab_size: int, bos_id: int | None):
    """A word-level tokenizer whose token i is the number i written out (with `bos_id`, that id is ``<bos>`` and the
    tokenizer adds it by default, as Gemma's does). No file: the vocabulary is generated."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors  # heavy: only for a synthetic model
    from transformers import PreTrainedTokenizerFast

    # special tokens are words, never numbers: a tokenizer splits every special token out of the text, digits too
    unk = "<unk>"  # a word that is not a number in the vocabulary maps here
    specials = {STREAM_START - 1: unk, **({} if bos_id is None else {bos_id: "<bos>"})}
    vocab = {specials.get(i, str(i)): i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if bos_id is None:
        return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=unk, model_max_length=int(1e9))
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos_id)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=unk, bos_token="<bos>", model_max_length=int(1e9))


def build(name: str, dtype: torch.dtype, device: torch.device) -> tuple[torch.nn.Module, object]:
    """A synthetic model's transformers module (seeded random weights, built on `device`) and its tokenizer.

    The same name gives the same weights on one kind of device (the CPU's and a GPU's generators differ: build on
    the CPU and move the model to compare the two).
    """
    config = hf_config(name)
    arch, _ = parse_name(name)
    model = _meta_model(config, dtype).to_empty(device=device)  # allocated once, on the device: no default init
    torch.manual_seed(model_seed(name))
    model.init_weights()  # the family's own initialisation (norms, buffers such as RoPE's frequencies included)
    bos = config.bos_token_id if architecture(arch).get("bos") else None
    return model, synthetic_tokenizer(config.vocab_size, bos)


def shared_vocab(*vocab_sizes: int) -> int:
    """The ids every synthetic model of a pair reads: below the smallest vocabulary."""
    return min(vocab_sizes)


def synthetic_ids(n: int, vocab_size: int, seed: int = 0) -> list[int]:
    """n token ids from the seeded stream, uniform over [STREAM_START, vocab_size)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(STREAM_START, vocab_size, (n,), generator=generator).tolist()


def synthetic_text(n: int, vocab_size: int, seed: int = 0) -> str:
    """The "text" of n ids of the stream: each id written out, which every synthetic tokenizer reads back."""
    return " ".join(map(str, synthetic_ids(n, vocab_size, seed)))

