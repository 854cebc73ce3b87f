"""Text relay: the source writes a message and the target reads only that message (method.md §15, "Text relay").

The text counterpart of handing over a cache, in two protocols:

* ``relay``: the source reads the context before any question is known and summarises it for another model
  (KVComm's natural-language baseline instruction);
* ``relay_q``: C2C's text-to-text protocol: the source sees the question and writes the background needed to solve
  it (C2C's baseline instruction).

Either way the source reads the instruction, then the passage (KVComm's order), and decodes greedily, inside its
chat template when it has one, until its end of turn or ``max_tokens`` tokens (256 by default, C2C's length and
KVComm's README's, so that a message ends where the source stops, not at the cap: a message at the cap is counted,
``Relay.capped``). One departure from both papers: a message also ends where the source begins to repeat itself (its
last ``LOOP_TOKENS`` tokens already stood in the message, in that order), without the repeat (``Relay.looped``): a
135M source often loops instead of ending its turn, and such a message runs to the cap (docs/decisions.md 36). The
target then prefills the message as its context, in the prompt it answers ``native`` in
(mot_viz.engine.prompts.build_prompt, the message in the passage's place), and answers the question after it exactly
as under ``native``. What is handed over is the message's bytes. What it costs after the question arrives: for
``relay``, whose message needs no question, the target's prefill of the message (the source's writing is work done
ahead, as the source's prefill is for the cache methods, and is reported apart); for ``relay_q``, the source's
writing too (its message needs the question).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ..engine import hf
from ..engine.alignment import encode
from ..engine.models import LoadedModel, ModelSpec
from ..engine.mot import MoT, native_cache, target_context_ids
from ..engine.prompts import PLAIN, QAExample, build_prompt
from ..errors import ConfigError, ContextError
from .method import Built, Inputs, Method, Option, Request

RELAY_CONDITIONS = ("relay", "relay_q")
RELAY_TOKENS = 256  # the longest message, in source tokens (--relay_tokens): C2C's and KVComm's README's length
TOKENS_OPTION = Option("relay_tokens", int, RELAY_TOKENS, "longest message the source writes under the relays, in "
                       "source tokens (relay: a summary of the context written before the question is known; relay_q: "
                       "the background for the question)")
LOOP_TOKENS = 24  # a message ends where the source repeats a run of this many of its own tokens (docs/decisions.md)
# KVComm's natural-language baseline (Zephyroam/KVComm, eval.py)
SUMMARY_INSTRUCTION = ("Summarize the context passage in a concise way, as it will be used by another agent to answer "
                       "the question.")
# C2C's text-to-text baseline (thu-nics/C2C, rosetta/baseline/multi_stage.py)
BACKGROUND_INSTRUCTION = "Briefly describe the most useful background to solve the problem:\n\n{question}"


@dataclass(frozen=True)
class Relay:
    """One relay of one context: the source's message and the target's cache of it."""

    condition: str  # "relay" or "relay_q"
    message: str  # what the source wrote (special tokens dropped, outer blanks stripped): all the target reads
    tokens: int  # the message's source tokens (at most the relay's max_tokens; a loop's repeat not counted)
    generate_seconds: float  # the source reading its prompt and writing the message
    kv: list[hf.KV]  # the target's own prefill of its prompt with the message as the context
    prefill_seconds: float  # that prefill
    capped: bool = False  # the source wrote max_tokens tokens without ending its turn (it may stop mid-sentence)
    looped: bool = False  # the source began to repeat itself: the message ends before the repeat (repeats_itself)
    # several agents writing in parallel (relay_parts): the slowest one's writing, their wall time (None: one writer)
    wall_seconds: float | None = None

    @property
    def ahead_seconds(self) -> float:
        """The work done before the question arrives: ``relay``'s writing (its message needs no question); none for
        ``relay_q``, whose message is written for the question."""
        return self.generate_seconds if self.condition == "relay" else 0.0

    @property
    def after_question_seconds(self) -> float:
        """The relay's part of the time to the first answer token (the question's own prefill apart): the target's
        prefill of the message, and for ``relay_q`` the source's writing before it."""
        return self.generate_seconds + self.prefill_seconds - self.ahead_seconds

    @property
    def bytes(self) -> int:
        """What is handed over: the message in UTF-8."""
        return len(self.message.encode("utf-8"))


def source_prompt(source: LoadedModel, example: QAExample, condition: str) -> str:
    """The text the source reads before it writes (after its BOS prefix, if any), in its chat turns when it has them.

    ``relay``: KVComm's summary instruction, then the passage (KVComm's order: "Instruction: … Context: …"); no
    question. ``relay_q``: C2C's instruction with the question, then the passage. This departs from C2C, whose source
    sees the question alone (its task has no passage): here the source has read the context, which is what it could
    add. C2C's target then reads a three-turn
    chat (the instruction, the background as the assistant's turn, the question); here the target reads the background
    in the passage's place of the ``native`` prompt and then the question, so every condition is answered from the
    same prompt.
    """
    if condition == "relay":
        request = SUMMARY_INSTRUCTION
    elif condition == "relay_q":
        request = BACKGROUND_INSTRUCTION.format(question=example.question)
    else:
        raise ConfigError(f"unknown relay condition {condition!r}; choose from {RELAY_CONDITIONS}")
    frame = source.chat_frame or PLAIN
    return f"{frame.head}{request}\n\nPassage: {example.context}{frame.foot}"


@dataclass(frozen=True)
class Written:
    """One message as the source wrote it."""

    text: str  # special tokens dropped, outer blanks stripped
    tokens: int  # the message's source tokens (a loop's repeat not counted)
    seconds: float  # the source reading its prompt and writing, the repeat included
    looped: bool  # the source began to repeat itself and was stopped there

    @property
    def generated(self) -> int:
        """The tokens the source generated: the message's and, when it looped, the repeat's."""
        return self.tokens + (LOOP_TOKENS if self.looped else 0)


def repeats_itself(tokens: list[int], n: int = LOOP_TOKENS) -> bool:
    """True when the last n tokens already stood earlier in `tokens`, in that order: the source has begun to loop."""
    if len(tokens) <= n:
        return False
    tail = tokens[-n:]
    return any(tokens[start:start + n] == tail for start in range(len(tokens) - n))


def write_message(source: LoadedModel, example: QAExample, condition: str,
                  max_tokens: int = RELAY_TOKENS) -> Written:
    """The source's message about the example (greedy, until its end of turn, until it begins to repeat itself (the
    repeat dropped) or after max_tokens tokens); the message is at the cap when its tokens == max_tokens.

    Raises ContextError when the prompt and the message do not fit the source's positions.
    """
    ids = source.prefix_ids + encode(source.tokenizer, source_prompt(source, example, condition))
    if len(ids) + max_tokens > source.spec.max_positions:
        raise ContextError(
            f"The source's {condition} prompt ({len(ids)} tokens) and a message of up to {max_tokens} tokens need "
            f"{len(ids) + max_tokens} positions; the source model '{source.spec.name}' allows "
            f"{source.spec.max_positions}. Shorten the context (--max_context_tokens) or the message (--relay_tokens).")
    start = time.perf_counter()
    tokens = hf.greedy_generate(source.model, None, source.ids_tensor(ids), max_tokens,
                                hf.eos_ids(source.model, source.tokenizer), stop_when=repeats_itself)
    seconds = time.perf_counter() - start
    looped = repeats_itself(tokens)
    if looped:
        tokens = tokens[:-LOOP_TOKENS]
    return Written(source.tokenizer.decode(tokens, skip_special_tokens=True).strip(), len(tokens), seconds, looped)


def target_prompt_example(example: QAExample, message: str) -> QAExample:
    """The example the target answers under a relay: the message in the passage's place, the same question."""
    return replace(example, context=message)


def read_message(target: LoadedModel, example: QAExample, message: str) -> tuple[list[hf.KV], float]:
    """The target's cache of its native prompt with the message as the context, and the seconds of that prefill."""
    text = build_prompt(target_prompt_example(example, message), target.chat_frame).context_text
    ids = target_context_ids(target, text)
    start = time.perf_counter()
    kv = native_cache(target, ids)
    return kv, time.perf_counter() - start


def relay(source: LoadedModel, target: LoadedModel, example: QAExample, condition: str,
          max_tokens: int = RELAY_TOKENS) -> Relay:
    """The source writes its message about the example and the target reads it (only it)."""
    written = write_message(source, example, condition, max_tokens)
    kv, prefill_seconds = read_message(target, example, written.text)
    return Relay(condition, written.text, written.tokens, written.seconds, kv, prefill_seconds,
                 capped=written.tokens >= max_tokens, looped=written.looped)


def check_relay_tokens(relay_tokens: int, source_positions: int | None, context_tokens: int,
                       flag: str = "--relay_tokens") -> None:
    """Raise ConfigError for a message length no relay can write: below 1, or more than the source can generate
    after a context of `context_tokens` tokens within its `source_positions` (unknown: None)."""
    if relay_tokens < 1:
        raise ConfigError(f"{flag} must be at least 1, got {relay_tokens}. Pass {flag} {RELAY_TOKENS} (the default).")
    if source_positions and relay_tokens + context_tokens > source_positions:
        raise ConfigError(
            f"{flag} {relay_tokens} is more than the source can write after a context of {context_tokens} tokens: "
            f"it holds {source_positions} positions. Pass {flag} {max(source_positions - context_tokens, 1)} or less.")


def message_fields(relay: Relay) -> dict:
    """A relay row's message columns (the message's carriage returns written as line breaks, which a CSV writer
    quotes, so a row stays one record); the slowest agent's writing where several wrote."""
    return {"message": relay.message.replace("\r", "\n"), "message_tokens": relay.tokens,
            "message_bytes": relay.bytes, "message_generate_seconds": relay.generate_seconds,
            "message_prefill_seconds": relay.prefill_seconds, "message_looped": int(relay.looped),
            "message_generate_max_seconds": relay.wall_seconds}



@dataclass(frozen=True)
class RelayParts:
    """A relay written by several source agents, each from its own part of the context, read by one target."""

    relay: Relay  # the joined message, the target's cache of it; tokens and generate_seconds summed over the agents
    source_tokens: tuple[int, ...]  # each agent's cache when done: its prompt (BOS prefix included) and its message


def relay_parts(source: LoadedModel, target: LoadedModel, example: QAExample, texts: list[str], condition: str,
                max_tokens: int) -> RelayParts:
    """Several source agents each write their message from their own part of the context (write_message of the
    example with that part as its passage); the target reads the messages joined in order, a blank line apart
    (read_message), and only them."""
    parts = [replace(example, context=text) for text in texts]
    written = [write_message(source, part, condition, max_tokens) for part in parts]
    message = "\n\n".join(w.text for w in written if w.text)
    kv, prefill = read_message(target, example, message)
    prompts = [len(source.prefix_ids + encode(source.tokenizer, source_prompt(source, part, condition)))
               for part in parts]
    return RelayParts(Relay(condition, message, sum(w.tokens for w in written), sum(w.seconds for w in written), kv,
                            prefill, capped=any(w.tokens >= max_tokens for w in written),
                            looped=any(w.looped for w in written), wall_seconds=max(w.seconds for w in written)),
                      tuple(p + w.generated for p, w in zip(prompts, written)))


class TextRelay(Method):
    """A relay: the source writes a message, the target reads it; written before the question unless for_question."""

    def check(self, request: Request) -> None:
        check_relay_tokens(TOKENS_OPTION.of(request.options), request.config["source"].get("max_positions")
                           if set(request.conditions) & set(RELAY_CONDITIONS) else None, request.context_tokens)

    def build(self, inputs: Inputs) -> Built:
        """The source writes from the passage the MoT's source read, the target reads only its message."""
        written = relay(inputs.source, inputs.target, inputs.example, self.name, TOKENS_OPTION.of(inputs.options))
        return Built(written.kv, written.generate_seconds + written.prefill_seconds, written.ahead_seconds,
                     held=written)

    def by_agents(self, agents, k: int | None):
        """Each agent writes from its shard (one reader: from the passage), the hub reads the messages."""
        texts = [agents.example.context] if k is None else [s.text.strip() for s in agents.pieces(k)]
        parts = relay_parts(agents.source, agents.target, agents.example, texts, self.name,
                            TOKENS_OPTION.of(agents.options))
        return agents.read(parts.relay.kv, parts.source_tokens, parts.relay)

    def handed_bytes(self, built: Built | None, tokens: int, target: ModelSpec, window_layers: int,
                     source: ModelSpec | None = None) -> float:
        """The message, in UTF-8."""
        return float(built.held.bytes)

    def handed_what(self, built: Built | None, target: ModelSpec, window_layers: int) -> str:
        return f"the message's text ({built.held.tokens} source tokens, UTF-8)"

    def stages(self, built: Built, timings: dict[str, float]) -> list[tuple[str, float]]:
        return [("message writing", built.held.generate_seconds),
                ("target prefill of the message", built.held.prefill_seconds)]

    def carries(self, mot: MoT, artifact=None) -> tuple[int, ...] | None:
        return None  # the target's cache holds the message's positions, not the context's

    def target_work(self, built: Built | None, tokens: int, prefix: int = 0) -> tuple[str, int]:
        """The target's prefill of the message's M tokens (its BOS positions, `prefix`, not counted)."""
        return "prefill", int(built.held.kv[0][0].shape[2]) - prefix

    def target_side(self, built: Built | None, timings) -> float:
        """relay: the target's prefill of the message (the writing is done ahead); relay_q: the source's writing too
        (the agents' wall time when several write in parallel)."""
        relay = built.held
        if not self.for_question:
            return relay.prefill_seconds
        writing = relay.generate_seconds if relay.wall_seconds is None else relay.wall_seconds
        return writing + relay.prefill_seconds

    def row_fields(self, built: Built) -> dict:
        return message_fields(built.held)


RELAY = TextRelay("relay", "Text relay (the source's summary of the context, read by the target)", (TOKENS_OPTION,),
                  reads_example=True, comparable=False, message=True, short="text relay (summary)")
RELAY_Q = TextRelay("relay_q", "Question-aware text relay (the source's background for the question, read by the "
                    "target)", (TOKENS_OPTION,), reads_example=True, comparable=False, message=True, for_question=True,
                    short="text relay (background for the question)")
