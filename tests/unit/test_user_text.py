"""Text that is not valid Unicode (a lone surrogate, e.g. a JSON "\\ud800" escape in a data file) is refused where
the library tokenizes text (mot_viz.engine.alignment.encode), with one ContextError that says what to fix, on every
path: a context to translate, a question to answer, and a page option a link escapes that way."""

from __future__ import annotations

import pytest

from mot_viz.app.permalink import decode_value, encode_value
from mot_viz.engine.alignment import encode
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.mot import translate
from mot_viz.engine.prompts import QAExample
from mot_viz.engine.testing import load_test_model, write_test_checkpoints
from mot_viz.errors import ContextError
from mot_viz.eval.answers import answer_from_cache

LONE = "Paris is the capital of France.\ud800 It lies on the Seine.\n"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    path = write_test_checkpoints(tmp_path_factory.mktemp("pretrained"))["smollm2-to-gemma3"]
    return load_checkpoint(str(path), source, target)[0], source, target


def test_encode_names_the_character_and_its_position(pair):
    with pytest.raises(ContextError, match=r"lone surrogate character \(U\+D800 at character 31\)") as info:
        encode(pair[2].tokenizer, LONE)
    assert "Remove that character" in str(info.value) and info.value.title == "Context problem"
    assert encode(pair[2].tokenizer, LONE.replace("\ud800", ""))  # without it, the same text is read


@pytest.mark.parametrize("where", ["start", "end", "low half"])
def test_a_context_with_a_lone_surrogate_is_a_context_error_not_a_type_error(pair, where):
    mot, source, target = pair
    text = {"start": "\ud800" + LONE, "end": LONE + "\udfff", "low half": LONE.replace("\ud800", "\udc00")}[where]
    with pytest.raises(ContextError, match="lone surrogate"):
        translate(mot, source, target, text)


def test_a_question_with_a_lone_surrogate_is_a_context_error(pair):
    mot, source, target = pair
    translation = translate(mot, source, target, LONE.replace("\ud800", ""))
    example = QAExample("q", "free text", LONE, "Where is \ud800 Paris?", ("France",))
    with pytest.raises(ContextError, match="lone surrogate"):
        answer_from_cache(target, translation.mixed_kv, example, "mot", max_new_tokens=2)


def test_a_valid_pair_of_surrogates_is_ordinary_text(pair):
    emoji = "Paris \U0001F600 is lovely.\n"  # one character outside the BMP (a surrogate pair in JSON)
    assert encode(pair[2].tokenizer, emoji)


def test_a_link_cannot_smuggle_a_lone_surrogate_into_a_page_option():
    assert decode_value('"\\ud800"') == '"\\ud800"'  # kept as the ASCII text it is: no widget offers it
    assert decode_value('["K", "\\udfff"]') == '["K", "\\udfff"]'
    assert decode_value('"\\ud83d\\ude00"') == "\U0001F600" and decode_value('"caf\\u00e9"') == "café"
    assert encode_value("\ud800") is None and encode_value(["K", "\ud800"]) is None
