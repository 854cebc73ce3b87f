"""Randomly initialised models and translators: tiny ones for fast tests of the library and the app, and seeded
translators of a recipe's shape for synthetic pairs (synthetic_mot; mot_viz.engine.synthetic builds the models).

The app swaps its model loader for :func:`load_test_model` when ``MOT_VIZ_TEST_MODELS=1``
(see mot_viz.app.settings), so every page can be driven in seconds. The bundled names map to a tiny
Llama (the source, like SmolLM2) and a tiny Gemma 3 (the target); their tokenizers differ in
vocabulary size, so the two tokenizations of one text differ and the alignment is exercised.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from ..errors import ConfigError, ModelLoadError
from .channels import injection_channels, terminal_channels
from .checkpoint import save_checkpoint
from .models import LoadedModel, prepare_model
from .mot import MoT
from .replay_config import ReplayConfig

CORPUS = [
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France.",
    "It is named after the engineer Gustave Eiffel, whose company designed and built the tower.",
    "Question: Where is the tower? Answer: in Paris. Numbers 1234 and 56.78 appear here.",
    "Café naïve résumé — emoji 🙂 and tabs\tand newlines\n are part of real text.",
    "A translator maps the key-value cache of one language model into the cache space of another.",
]
FAMILIES = ("gpt2", "opt", "qwen2", "llama", "gemma3_text")

# bundled name -> (family, vocab size, layers, seed, BOS prefix) of its tiny stand-in; like Gemma, the
# target's tokenizer starts every sequence with BOS, so its caches hold one position more than the context
TEST_MODELS: dict[str, tuple[str, int, int, int, bool]] = {
    "smollm2-135m": ("llama", 300, 4, 0, False),
    "gemma3-270m": ("gemma3_text", 400, 6, 1, True),
}
# the app caps contexts at 1,024 target tokens; tiny byte-level tokenizers need room for a SQuAD passage
TEST_MAX_POSITIONS = 4096


@functools.lru_cache(maxsize=None)
def tiny_tokenizer(vocab_size: int = 300, bos: bool = False):
    """A byte-level BPE trained on CORPUS; two vocab sizes give two tokenizations of the same text.

    With `bos`, the tokenizer adds a ``<bos>`` token by default, as Gemma's does (so LoadedModel.prefix_ids is [bos]).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<eos>", "<bos>"] if bos else ["<eos>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    if not bos:
        return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    bos_id = tok.token_to_id("<bos>")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos_id)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", bos_token="<bos>")


def tiny_config(family: str, vocab_size: int, layers: int = 4, max_positions: int = 256):
    """A transformers config of `family` with hidden size 32 (GQA where the family has it)."""
    from transformers import Gemma3TextConfig, GPT2Config, LlamaConfig, OPTConfig, Qwen2Config

    common = dict(vocab_size=vocab_size, eos_token_id=0, bos_token_id=0)
    if family == "gpt2":
        return GPT2Config(n_embd=32, n_layer=layers, n_head=4, n_positions=max_positions, **common)
    if family == "opt":
        return OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=layers, num_attention_heads=4,
                         max_position_embeddings=max_positions, word_embed_proj_dim=32, pad_token_id=1, **common)
    if family == "qwen2":
        return Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=max_positions, **common)
    if family == "llama":
        return LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=max_positions, **common)
    if family == "gemma3_text":
        types = ["sliding_attention" if i % 3 != 2 else "full_attention" for i in range(layers)]
        return Gemma3TextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                                num_key_value_heads=1, head_dim=16, sliding_window=8, layer_types=types,
                                max_position_embeddings=max_positions, pad_token_id=1, **common)
    raise ValueError(f"unknown family {family!r}; choose one of {FAMILIES}")


def tiny_model(family: str, vocab_size: int = 300, layers: int = 4, seed: int = 0,
               max_positions: int = 256, name: str | None = None, bos: bool = False) -> LoadedModel:
    """A tiny random model of `family` with its own tiny tokenizer, prepared like a real one (named `name`)."""
    from transformers import (Gemma3ForCausalLM, GPT2LMHeadModel, LlamaForCausalLM, OPTForCausalLM,
                              Qwen2ForCausalLM)

    classes = {"gpt2": GPT2LMHeadModel, "opt": OPTForCausalLM, "qwen2": Qwen2ForCausalLM,
               "llama": LlamaForCausalLM, "gemma3_text": Gemma3ForCausalLM}
    torch.manual_seed(seed)
    tok = tiny_tokenizer(vocab_size, bos)
    model = classes[family](tiny_config(family, len(tok), layers, max_positions))
    return prepare_model(model, tok, name or f"tiny-{family}-{vocab_size}-{layers}")


def load_test_model(name: str) -> LoadedModel:
    """The tiny stand-in of a bundled model name (its spec keeps the name asked for, as load_model does).

    Any other name fails the way an unknown model does.
    """
    if name not in TEST_MODELS:
        raise ModelLoadError(
            f"Cannot load model '{name}': test mode (MOT_VIZ_TEST_MODELS=1) only knows {', '.join(TEST_MODELS)}."
        )
    family, vocab, layers, seed, bos = TEST_MODELS[name]
    return tiny_model(family, vocab, layers, seed, max_positions=TEST_MAX_POSITIONS, name=name, bos=bos)


def write_test_checkpoints(root: str | Path) -> dict[str, Path]:
    """Randomly initialised checkpoints for the tiny test pair, written under `root`.

    ``smollm2-to-gemma3`` (MoT, 4 experts, top-2, on a linear path that also reads the previous token, as shipped),
    ``smollm2-to-gemma3-single`` (no router) and ``gemma3-to-smollm2`` (the reverse pair, which does not fit the
    default models) and ``smollm2-to-gemma3-linear`` (a linear map of the default window, reading the previous token
    too: the pages' linear baseline).
    """
    root = Path(root)
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    plans = {
        "smollm2-to-gemma3": (source, target, dict(variant="mot", num_experts=4, top_k=2, linear_residual=True,
                                                   linear_previous=1, linear_previous_dims=8)),
        "smollm2-to-gemma3-single": (source, target, dict(variant="single")),
        "gemma3-to-smollm2": (target, source, dict(variant="mot", num_experts=4, top_k=2)),
        "smollm2-to-gemma3-linear": (source, target, dict(variant="linear", linear_previous=1, linear_previous_dims=8)),
    }
    out = {}
    for i, (name, (src, tgt, kwargs)) in enumerate(plans.items()):
        torch.manual_seed(100 + i)
        channels = terminal_channels(src.spec.num_layers, tgt.spec.num_layers, 0.5)
        mot = MoT.build(src.spec, tgt.spec, channels, dim=32, heads=4, output_activation="none", **kwargs)
        randomize_linear_path(mot, std=0.05)
        out[name] = save_checkpoint(mot, root / name, training={"source": src.spec.name, "target": tgt.spec.name},
                                    metrics={"note": "randomly initialised test checkpoint"})
    return out


def randomize_linear_path(mot: MoT, std: float | None = None) -> None:
    """Random weights for the translator's linear path, if it has one (a fitted map is never all zeros): normal with
    `std`, else with 1/sqrt of each matrix's larger side (a projection that keeps the features' scale)."""
    if mot.translator.linear is None:
        return
    with torch.no_grad():
        for tensor in [*mot.translator.linear.parameters(), *mot.translator.linear.buffers()]:
            scale = std if std is not None else (max(tensor.shape) ** -0.5 if tensor.dim() >= 2 else 0.02)
            torch.nn.init.normal_(tensor, std=scale)


def synthetic_mot(source: LoadedModel, target: LoadedModel, recipe, seed: int = 0) -> MoT:
    """A translator of the shape a training recipe (a TrainConfig) gives the pair, with seeded random weights, on the
    target's device: what a synthetic pair is translated with (no checkpoint can fit random models). The recipe's
    window (terminal or injection; a depth-ratio search needs data and is refused), its translator and its replay."""
    l_s, l_t = source.spec.num_layers, target.spec.num_layers
    if recipe.layer_alignment == "terminal":
        channels = terminal_channels(l_s, l_t, recipe.max_window_size_ratio)
    elif recipe.layer_alignment == "injection":
        channels = injection_channels(l_s, l_t, recipe.injection_layer_start_idx, recipe.injection_window_size)
    else:
        raise ConfigError(f"a synthetic pair's translator takes a terminal or injection window; the recipe's "
                          f"'{recipe.layer_alignment}' window is searched on data: set layer_alignment to terminal.")
    torch.manual_seed(seed)
    mot = MoT.build(source.spec, target.spec, channels, ReplayConfig(recipe.topk_sparse_attn,
                                                                      recipe.num_bottom_full_attn),
                    **recipe.translator_kwargs())
    randomize_linear_path(mot)
    return mot.to(target.device).eval()
