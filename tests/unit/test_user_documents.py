"""A user's own document for the Long context and Multi-agent pages (mot_viz.data.user_documents): an uploaded file is
read or refused in one message, a pasted document and its questions are checked as the sidebar's free text is, and a
page's text too long for a link goes in it by its fingerprint (mot_viz.app.permalink)."""

from __future__ import annotations

import json

import pytest

from mot_viz.app.permalink import (FINGERPRINT, MAX_TEXT_IN_LINK, decode_value, encode_value, page_params,
                                   parse_link, text_digest)
from mot_viz.data.coqa import Turn
from mot_viz.data.user_documents import (MAX_UPLOAD_BYTES, USER_SOURCE, check_document, document_label,
                                         parse_questions, questions_text, read_upload, user_conversation,
                                         user_long_document)
from mot_viz.engine.testing import load_test_model
from mot_viz.errors import ContextError, DataFormatError

STORY = "The Eiffel Tower was designed by the company of Gustave Eiffel. It was built from 1887 to 1889 in Paris.\n"


@pytest.fixture(scope="module")
def tokenizer():
    return load_test_model("gemma3-270m").tokenizer


def readers(tokenizer, most: int = 10_000):
    return {"target": ("target-model", tokenizer, most), "source": ("source-model", tokenizer, 10_000)}


def jsonl(*rows) -> bytes:
    return "\n".join(json.dumps(r) for r in rows).encode()


# ----- uploads ---------------------------------------------------------------------------------------------------


def test_a_txt_upload_is_the_document_without_a_byte_order_mark():
    got = read_upload("story.txt", "\ufeff".encode() + STORY.encode())
    assert got.text == STORY and got.questions == () and got.name == "story.txt"
    assert read_upload("Story.TXT", "café ☕".encode()).text == "café ☕"


def test_a_jsonl_upload_is_one_document_with_its_questions_in_order():
    got = read_upload("chat.jsonl", jsonl({"context": STORY, "question": "Who designed it?", "answers": ["Eiffel"]},
                                          {"context": STORY, "question": "Where?", "answers": ["Paris", "in Paris"]})
                      + b"\n\n")
    assert got.text == STORY
    assert got.questions == (Turn("Who designed it?", ("Eiffel",)), Turn("Where?", ("Paris", "in Paris")))


@pytest.mark.parametrize("name, data, match", [
    ("model.bin", b"\x00\x01", "neither a .txt nor a .jsonl file"),
    ("doc.txt", b"abc\x00def", r"not a text file \(it holds a NUL byte at byte 3\)"),
    ("doc.txt", b"caf\xe9 latin-1", r"not UTF-8 text \(byte 3 cannot be read\)"),
    ("doc.txt", b"x" * (MAX_UPLOAD_BYTES + 1), r"is 1.0 MB; a page reads files of at most 1 MB"),
    ("doc.jsonl", b"{not json", r"'doc.jsonl', line 1: invalid JSON"),
    ("doc.jsonl", jsonl({"context": STORY, "question": "Q?"}), r"line 1: missing key 'answers'"),
    ("doc.jsonl", jsonl({"context": STORY, "question": "Q?", "choices": ["a", "b"], "label": 0}), "give 'answers'"),
    ("doc.jsonl", jsonl({"context": STORY, "question": "Q?", "answers": ["a"]},
                        {"context": "Another.", "question": "Q?", "answers": ["a"]}),
     r"line 2: its context differs from the first line's"),
    ("doc.jsonl", b"\n \n", "holds no line"),
])
def test_a_file_that_is_not_one_readable_document_is_one_message(name, data, match):
    with pytest.raises(DataFormatError, match=match) as info:
        read_upload(name, data)
    assert "\n" not in str(info.value) and len(str(info.value)) < 400  # one line, not the file's contents


def test_a_jsonl_escape_that_is_not_valid_unicode_is_a_context_error():
    data = b'{"context": "Paris \\ud800 is lovely.", "question": "Where?", "answers": ["Paris"]}'
    with pytest.raises(ContextError, match="lone surrogate"):
        read_upload("doc.jsonl", data)


# ----- typed questions ---------------------------------------------------------------------------------------------


def test_typed_questions_read_back_as_written():
    turns = parse_questions("Who designed it? | Gustave Eiffel | Eiffel\n\n  Where? |Paris \nWhen?\n")
    assert turns == (Turn("Who designed it?", ("Gustave Eiffel", "Eiffel")), Turn("Where?", ("Paris",)),
                     Turn("When?", ()))
    assert parse_questions(questions_text(turns)) == turns


# ----- pasted documents ------------------------------------------------------------------------------------------


def test_a_pasted_document_is_a_long_example_of_its_own_length(tokenizer):
    doc = user_long_document(STORY, " Who designed it? ", "Gustave Eiffel | Eiffel", readers(tokenizer))
    tokens = len(tokenizer(STORY, add_special_tokens=False)["input_ids"])
    assert doc.tokens == doc.budget == tokens and doc.source == USER_SOURCE and doc.depth == ""
    assert doc.example.context == STORY and doc.example.question == "Who designed it?"
    assert doc.example.answers == ("Gustave Eiffel", "Eiffel") and doc.example.kind == "extractive"
    start = STORY.index("Gustave Eiffel")
    assert doc.evidence == (start, start + len("Gustave Eiffel"))
    assert user_long_document(STORY, "Who?", "", readers(tokenizer)).example.answers == ()  # not scored
    assert user_long_document(STORY, "Who?", "Napoleon", readers(tokenizer)).evidence is None


@pytest.mark.parametrize("text, question, match", [
    ("", "Who?", "The document is empty"),
    (" \n\t", "Who?", "The document is empty"),
    (STORY, "  ", "Ask a question about the document"),
    ("Paris \ud800 is lovely.", "Where?", r"lone surrogate character \(U\+D800 at character 6\)"),
    (STORY, "Where \udfff?", "lone surrogate"),
])
def test_an_unusable_document_or_question_is_one_context_error(tokenizer, text, question, match):
    with pytest.raises(ContextError, match=match):
        user_long_document(text, question, "", readers(tokenizer))


def test_a_document_too_long_for_a_model_names_its_length_and_the_limit(tokenizer):
    tokens = check_document(STORY, readers(tokenizer))
    assert tokens["target"] == tokens["source"] > 10
    with pytest.raises(ContextError, match=rf"is {tokens['target']} tokens long for the target model 'target-model', "
                                           r"which reads at most 10 here. Shorten the document."):
        user_long_document(STORY, "Who?", "", readers(tokenizer, most=10))
    source_short = {**readers(tokenizer), "source": ("source-model", tokenizer, 5)}
    with pytest.raises(ContextError, match="for the source model 'source-model', which reads at most 5"):
        check_document(STORY, source_short, "story")


def test_a_pasted_conversation_needs_a_reference_answer_for_every_turn(tokenizer):
    got = user_conversation(STORY, "Who designed it? | Gustave Eiffel\nWhere? | Paris", readers(tokenizer))
    assert got.story == STORY and [t.question for t in got.turns] == ["Who designed it?", "Where?"]
    assert got.turns[1].answers == ("Paris",) and got.source == USER_SOURCE
    with pytest.raises(ContextError, match=r"Question 2 \('Where\?'\) has no reference answer"):
        user_conversation(STORY, "Who designed it? | Eiffel\nWhere?", readers(tokenizer))
    with pytest.raises(ContextError, match="Ask at least one question"):
        user_conversation(STORY, "\n \n", readers(tokenizer))
    with pytest.raises(ContextError, match="Question 1 is empty"):
        user_conversation(STORY, " | Eiffel", readers(tokenizer))
    with pytest.raises(ContextError, match="The story is empty"):
        user_conversation("", "Who? | Eiffel", readers(tokenizer))


def test_a_document_is_named_by_its_first_words_and_length():
    assert document_label("Short  text\n") == f"{USER_SOURCE} “Short text” (12 characters)"
    long = document_label("word " * 100)
    assert long.startswith(f"{USER_SOURCE} “word word") and "…” (500 characters)" in long


# ----- a page's text in a link -----------------------------------------------------------------------------------

LINK_ARGS = dict(models=["smollm2-135m"], checkpoints=["c"], datasets=["squad"], examples=50)


@pytest.mark.parametrize("text", ["x" * (MAX_TEXT_IN_LINK + 1), "é" * 700])  # long, or long once percent-encoded
def test_a_page_text_too_long_for_a_link_goes_by_its_fingerprint(text):
    params = page_params({"pg.long.text": text, "pg.long.question": "Who?", "pg.long.doc": 3})
    assert params == {"long.text": FINGERPRINT + text_digest(text), "long.question": "Who?", "long.doc": "3"}
    restored = parse_link(params, **LINK_ARGS, recall_text={text_digest(text): text}.get)
    assert restored.page == {"pg.long.text": text, "pg.long.question": "Who?", "pg.long.doc": 3}
    assert not restored.ignored
    lost = parse_link(params, **LINK_ARGS)
    assert "pg.long.text" not in lost.page and lost.page["pg.long.question"] == "Who?"
    assert len(lost.ignored) == 1 and params["long.text"] in lost.ignored[0] and "paste the text again" in lost.ignored[0]


def test_a_short_page_text_is_carried_itself_even_when_it_looks_like_a_fingerprint():
    assert page_params({"pg.long.text": "Paris."}) == {"long.text": "Paris."}
    lookalike = FINGERPRINT + "0123456789abcdef"
    assert encode_value(lookalike) == json.dumps(lookalike) and decode_value(encode_value(lookalike)) == lookalike
    assert parse_link(page_params({"pg.long.text": lookalike}), **LINK_ARGS).page == {"pg.long.text": lookalike}
