"""Shared fixtures: tiny randomly initialised models of every supported family, and the real bundled pair."""

from __future__ import annotations

import functools

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM, OPTConfig, OPTForCausalLM, PreTrainedTokenizerFast, Qwen2Config,
                          Qwen2ForCausalLM)

from mot_viz.models import LoadedModel, load_model, prepare_model

CORPUS = [
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France.",
    "It is named after the engineer Gustave Eiffel, whose company designed and built the tower.",
    "Question: Where is the tower? Answer: in Paris. Numbers 1234 and 56.78 appear here.",
    "Café naïve résumé — emoji 🙂 and tabs\tand newlines\n are part of real text.",
    "A translator maps the key-value cache of one language model into the cache space of another.",
]
FAMILIES = ("gpt2", "opt", "qwen2", "llama", "gemma3_text")


@functools.lru_cache(maxsize=None)
def tiny_tokenizer(vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on CORPUS; two vocab sizes give two tokenizations of the same text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


@functools.lru_cache(maxsize=None)
def tiny_tokenizer_with_bos(vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """Like tiny_tokenizer, but it adds a BOS token by default, as Gemma's does."""
    from tokenizers.processors import TemplateProcessing

    tok = Tokenizer.from_str(tiny_tokenizer(vocab_size).backend_tokenizer.to_str())
    tok.add_special_tokens(["<bos>"])
    bos = tok.token_to_id("<bos>")
    tok.post_processor = TemplateProcessing(single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", bos)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", bos_token="<bos>")


def tiny_config(family: str, vocab_size: int, layers: int = 4):
    common = dict(vocab_size=vocab_size, eos_token_id=0, bos_token_id=0)
    if family == "gpt2":
        return GPT2Config(n_embd=32, n_layer=layers, n_head=4, n_positions=256, **common)
    if family == "opt":
        return OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=layers, num_attention_heads=4,
                         max_position_embeddings=256, word_embed_proj_dim=32, pad_token_id=1, **common)
    if family == "qwen2":
        return Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=256, **common)
    if family == "llama":
        return LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=256, **common)
    if family == "gemma3_text":
        types = ["sliding_attention" if i % 3 != 2 else "full_attention" for i in range(layers)]
        return Gemma3TextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                                num_key_value_heads=1, head_dim=16, sliding_window=8, layer_types=types,
                                max_position_embeddings=256, pad_token_id=1, **common)
    raise ValueError(family)


_CLASSES = {"gpt2": GPT2LMHeadModel, "opt": OPTForCausalLM, "qwen2": Qwen2ForCausalLM, "llama": LlamaForCausalLM,
            "gemma3_text": Gemma3ForCausalLM}


def tiny_model(family: str, vocab_size: int = 300, layers: int = 4, seed: int = 0, bos: bool = False) -> LoadedModel:
    """A tiny random model of `family` with its own tiny tokenizer, prepared like a real one."""
    torch.manual_seed(seed)
    tok = tiny_tokenizer_with_bos(vocab_size) if bos else tiny_tokenizer(vocab_size)
    model = _CLASSES[family](tiny_config(family, len(tok), layers))
    return prepare_model(model, tok, f"tiny-{family}-{vocab_size}-{layers}{'-bos' if bos else ''}")


@pytest.fixture(scope="session")
def real_source() -> LoadedModel:
    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def real_target() -> LoadedModel:
    return load_model("gemma3-270m")
