"""The kvcomm condition: selective layer sharing between two models of one architecture (tiny models)."""

import pytest
import torch

from mot_viz.engine import hf
from mot_viz.engine.alignment import encode
from mot_viz.engine.mot import native_cache, target_context_ids
from mot_viz.engine.prompts import QAExample, build_prompt
from mot_viz.engine.testing import load_test_model
from mot_viz.errors import ConfigError
from mot_viz.eval.answers import answer_from_cache, answers_from_caches
from mot_viz.sharing.caches import condition_caches
from mot_viz.eval.evaluate import check_settings
from mot_viz.eval.qa_settings import EvalSettings
from mot_viz.sharing.kvcomm import (KVCommSelection, check_kvcomm_fraction, check_kvcomm_pair, context_attention,
                                 kvcomm_cache, kvcomm_selection, select_layers)

EXAMPLE = QAExample("1", "squad/validation", "The Eiffel Tower is a wrought-iron lattice tower in Paris, France.",
                    "Where is the tower?", ("Paris",))
CLOSED = QAExample("b", "boolq/validation", "Cats purr when they are content.", "do cats purr", ("yes",),
                   ("yes", "no"), 0)


@pytest.fixture(scope="module")
def model():
    return load_test_model("smollm2-135m")


def context_ids(model, example=EXAMPLE):
    return target_context_ids(model, build_prompt(example, model.chat_frame).context_text)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return float((a - b).abs().max()) <= 1e-5 * max(float(b.abs().max()), 1e-12)


def first_logits(model, cache, plan=None, example=EXAMPLE) -> torch.Tensor:
    suffix = model.ids_tensor(encode(model.tokenizer, build_prompt(example, model.chat_frame).suffix_text))
    return hf.run(model.model, suffix, kv=cache, plan=plan, logits_to_keep=1).logits[0, -1]


def test_sharing_every_layer_of_the_same_model_is_native(model):
    ids = context_ids(model)
    selection = kvcomm_selection(model, model, [EXAMPLE], fraction=1.0)
    assert selection.layers == tuple(range(model.spec.num_layers))
    shared = kvcomm_cache(model, model, ids, selection)
    assert shared.plan.hide == {}
    native = native_cache(model, ids)
    for (k, v), (nk, nv) in zip(shared.kv, native, strict=True):
        assert torch.equal(k, nk) and torch.equal(v, nv)
    for example in (EXAMPLE, CLOSED):
        ids = context_ids(model, example)
        shared, native = kvcomm_cache(model, model, ids, selection), native_cache(model, ids)
        ours = answer_from_cache(model, shared.kv, example, "kvcomm", plan=shared.plan)
        theirs = answer_from_cache(model, native, example, "native")
        assert ours.text == theirs.text and ours.score == theirs.score
        assert ours.choice_logprobs == theirs.choice_logprobs


def test_unshared_layers_read_token_0_only(model):
    ids = context_ids(model)
    selection = KVCommSelection((1, 2), (0.0,) * 4, 0.5, 0.5, ("1",))
    shared = kvcomm_cache(model, model, ids, selection)
    n = shared.kv[0][0].shape[2]
    assert shared.plan.hide == {0: (1, n), 3: (1, n)}
    # what an unshared layer holds after token 0 is never read: noise there changes nothing
    torch.manual_seed(0)
    noisy = [(torch.cat([k[:, :, :1], torch.randn_like(k[:, :, 1:])], 2),
              torch.cat([v[:, :, :1], torch.randn_like(v[:, :, 1:])], 2)) if layer in (0, 3) else (k, v)
             for layer, (k, v) in enumerate(shared.kv)]
    assert close(first_logits(model, noisy, shared.plan), first_logits(model, shared.kv, shared.plan))
    # and the hiding is real: without the plan the logits are native's, and they differ
    assert not close(first_logits(model, shared.kv, shared.plan), first_logits(model, shared.kv))
    # unshared layers read token 0 exactly as they would a cache holding token 0 alone, at the same positions:
    # with every layer unshared, the question's logits equal those of a one-token cache whose question positions
    # continue after the whole context
    none = kvcomm_cache(model, model, ids, KVCommSelection((), (0.0,) * 4, 0.0, 0.5, ("1",)))
    suffix = model.ids_tensor(encode(model.tokenizer, build_prompt(EXAMPLE, model.chat_frame).suffix_text))
    one = [(k[:, :, :1], v[:, :, :1]) for k, v in none.kv]
    positions = torch.arange(n, n + suffix.shape[1])[None]
    reference = model.model(input_ids=suffix, cache=hf.cache_from_kv(one), position_ids=positions,
                            use_cache=True, attention_mask=torch.ones(1, 1 + suffix.shape[1], dtype=torch.long)
                            ).logits[0, -1]
    assert close(first_logits(model, none.kv, none.plan), reference)


def test_answers_batch_reads_a_kvcomm_cache_under_its_plan(model):
    selection = KVCommSelection((1, 2), (0.0,) * 4, 0.5, 0.5, ("1",))
    built = condition_caches(None, model, model, EXAMPLE, translation=_FakeTranslation(context_ids(model)),
                             conditions=("native", "kvcomm"), artifacts={"kvcomm": selection})
    assert set(built.plans) == {"kvcomm"} and built.seconds["kvcomm"] > 0
    together = answers_from_caches(model, {"native": native_cache(model, context_ids(model)),
                                           "no_context": None, "kvcomm": built.kv["kvcomm"]}, EXAMPLE,
                                   plans=built.plans)
    alone = answer_from_cache(model, built.kv["kvcomm"], EXAMPLE, "kvcomm", plan=built.plans["kvcomm"])
    assert together["kvcomm"].text == alone.text


class _FakeTranslation:
    """The one thing condition_caches reads of a translation for the native and kvcomm conditions."""

    def __init__(self, ids):
        self.target_ids, self.timings = ids, {}
        self.native_kv = None


def test_a_pair_of_other_shapes_is_refused_in_one_line():
    small, gemma = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    with pytest.raises(ConfigError) as info:
        check_kvcomm_pair(small.spec, gemma.spec)
    message = str(info.value)
    assert "\n" not in message and "4 layers" in message and "smollm2-to-smollm2" in message
    with pytest.raises(ConfigError, match="one shape per layer"):
        kvcomm_selection(small, gemma, [EXAMPLE])
    # the evaluator refuses it before any model loads
    settings = EvalSettings("pretrained/smollm2-to-gemma3", None, ("squad",), 1, 0, 24, 448, 10,
                            ("native", "kvcomm"))
    with pytest.raises(ConfigError, match="one shape per layer"):
        check_settings(settings)


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5])
def test_fraction_outside_0_1_is_refused(fraction):
    with pytest.raises(ConfigError, match="--kvcomm_fraction must be in"):
        check_kvcomm_fraction(fraction)


def test_layer_choice_follows_the_score():
    scores = torch.zeros(30)
    scores[[3, 7, 25]] = torch.tensor([0.9, 0.8, 1.0])
    assert select_layers(scores, fraction=0.1, alpha=1.0) == (3, 7, 25)
    # the Gaussian prior alone picks the middle of the depth (μ = 14.5; the tie at distance 4.5 goes shallower)
    assert select_layers(scores, fraction=0.3, alpha=0.0) == tuple(range(10, 19))
    assert select_layers(torch.rand(30), fraction=0.3, alpha=0.0) == tuple(range(10, 19))
    assert len(select_layers(scores, fraction=0.01)) == 1


def test_scores_are_the_questions_attention_on_the_context(model):
    ids = context_ids(model)
    suffix = encode(model.tokenizer, build_prompt(EXAMPLE, model.chat_frame).suffix_text)
    masses = context_attention(model, native_cache(model, ids), suffix, len(model.prefix_ids))
    assert masses.shape == (model.spec.num_layers,)
    assert bool(((masses > 0) & (masses < 1)).all())
    selection = kvcomm_selection(model, model, [EXAMPLE], fraction=0.5, alpha=1.0)
    assert selection.scores == tuple(float(m) for m in masses)
    assert selection.layers == select_layers(masses, 0.5, 1.0)
