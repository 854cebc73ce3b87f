"""Text relay: the source writes a message and the target reads only that message (method.md §15, "Text relay").

The text counterpart of handing over a cache, in two protocols:

* ``relay``: the source reads the context before any question is known and summarises it for another model
  (KVComm's natural-language baseline instruction);
* ``relay_q``: C2C's text-to-text protocol: the source sees the question and writes the background needed to solve
  it (C2C's baseline instruction).

Either way the source reads the instruction, then the passage (KVComm's order), and decodes greedily, inside its
chat template when it has one, until its end of turn or ``max_tokens`` tokens (256 by default, C2C's length and
KVComm's README's, so that a message ends where the source stops, not at the cap: a message at the cap is counted,
``Relay.capped``). The target then prefills the message as its context, in the prompt it answers ``native`` in
(mot_viz.engine.prompts.build_prompt, the message in the passage's place), and answers the question after it exactly
as under ``native``. What is handed over is the message's bytes. What it costs after the question arrives: for
``relay``, whose message needs no question, the target's prefill of the message (the source's writing is work done
ahead, as the source's prefill is for the cache methods, and is reported apart); for ``relay_q``, the source's
writing too (its message needs the question).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from ..cli import run_cli
from ..engine import hf
from ..engine.alignment import encode
from ..engine.checkpoint import read_config, spec_from_json
from ..engine.models import LoadedModel, kv_cache_bytes
from ..engine.mot import native_cache, target_context_ids
from ..engine.prompts import PLAIN, QAExample, build_prompt
from ..errors import ConfigError, ContextError
from ..fsutil import write_csv_atomic, write_text_atomic

RELAY_CONDITIONS = ("relay", "relay_q")
RELAY_TOKENS = 256  # the longest message, in source tokens (--relay_tokens): C2C's and KVComm's README's length
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
    tokens: int  # source tokens generated (at most the relay's max_tokens)
    generate_seconds: float  # the source reading its prompt and writing the message
    kv: list[hf.KV]  # the target's own prefill of its prompt with the message as the context
    prefill_seconds: float  # that prefill
    capped: bool = False  # the source wrote max_tokens tokens without ending its turn (the message may stop mid-sentence)

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


def write_message(source: LoadedModel, example: QAExample, condition: str,
                  max_tokens: int = RELAY_TOKENS) -> tuple[str, int, float]:
    """The source's message about the example (greedy, until its end of turn or max_tokens tokens): (text, tokens,
    seconds); the message is at the cap when tokens == max_tokens.

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
                                hf.eos_ids(source.model, source.tokenizer))
    seconds = time.perf_counter() - start
    return source.tokenizer.decode(tokens, skip_special_tokens=True).strip(), len(tokens), seconds


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
    message, tokens, generate_seconds = write_message(source, example, condition, max_tokens)
    kv, prefill_seconds = read_message(target, example, message)
    return Relay(condition, message, tokens, generate_seconds, kv, prefill_seconds, capped=tokens >= max_tokens)


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


# ----- what each way of sharing the context hands over and costs, from an evaluation's examples.csv ----------------

FP16_BYTES = 2  # bytes per value of a cache handed over (fp16 / bf16), as kv_cache_bytes counts


def layers_bytes(tokens, layers: int, kv_hidden: int):
    """Bytes of K and V at `layers` layers over `tokens` positions (a number or an array), fp16: a translated window,
    a full-depth map's cache, the layers kvcomm shares."""
    return tokens * layers * 2 * kv_hidden * FP16_BYTES


def sharing_costs(rows: pd.DataFrame, config: dict) -> pd.DataFrame:
    """Per condition of an evaluation with relay rows (mot_viz.eval.evaluate's examples.csv; `config`: its
    checkpoint's config.json): what the target is handed (the message's tokens and bytes; the translated window's
    bytes, the window's target layers' K and V at every context position; a full target cache of the context's
    bytes) and the mean seconds of each stage (the source writing, the target's prefill of the message, building
    the cache, answering), over the examples every condition answered.

    The answer's seconds are the example's batch decoding shared evenly among its conditions (answers_from_caches),
    so a relay row's whole seconds (``seconds`` + ``ahead_seconds``) less its writing and prefill are every
    condition's answer share, and a cache's building seconds are its row's whole seconds less that share (native: the
    target's prefill; mot: every stage of the translation, the source's reading included). ``ahead_seconds``: the
    part of the building that can be done before the question (the source's prefill; relay's writing);
    ``after_question_seconds``: the rest, and the answer.
    """
    scored = rows[rows["condition"] != "skipped"]
    # results written before the work done ahead was apart hold it inside "seconds"
    ahead = scored["ahead_seconds"].fillna(0.0) if "ahead_seconds" in scored else 0.0 * scored["seconds"]
    scored = scored.assign(ahead_seconds=ahead, whole_seconds=scored["seconds"] + ahead)
    relayed = scored[scored["condition"].isin(RELAY_CONDITIONS)]
    if relayed.empty:
        raise ConfigError("these results have no relay rows: evaluate with --conditions ... relay relay_q")
    share = (relayed["whole_seconds"] - relayed["message_generate_seconds"] - relayed["message_prefill_seconds"])
    answer = pd.Series(share.to_numpy(), index=list(zip(relayed["dataset"], relayed["id"]))).groupby(level=0).mean()
    target = spec_from_json(config["target"])
    window = len(config["channels"])
    out = []
    for condition, part in scored.groupby("condition", sort=False):
        keys = list(zip(part["dataset"], part["id"]))
        share_here = answer.reindex(keys).to_numpy()
        tokens = part["context_tokens"].to_numpy()
        relay_row = condition in RELAY_CONDITIONS
        out.append({
            "condition": condition, "n": len(part),
            "context_tokens": float(tokens.mean()),
            "message_tokens": float(part["message_tokens"].mean()) if relay_row else float("nan"),
            "message_bytes": float(part["message_bytes"].mean()) if relay_row else float("nan"),
            "window_bytes": float(layers_bytes(tokens, window, target.kv_hidden).mean()),
            "full_cache_bytes": float(sum(kv_cache_bytes(target, int(t)) for t in tokens) / len(tokens)),
            "write_seconds": float(part["message_generate_seconds"].mean()) if relay_row else float("nan"),
            "read_seconds": float(part["message_prefill_seconds"].mean()) if relay_row else float("nan"),
            "build_seconds": float((part["whole_seconds"].to_numpy() - share_here).mean()),
            "answer_seconds": float(share_here.mean()),
            "ahead_seconds": float(part["ahead_seconds"].mean()),
            "after_question_seconds": float(part["seconds"].mean()),
            "seconds": float(part["whole_seconds"].mean()),
        })
    return pd.DataFrame(out)


def handed_over_bytes(cost) -> float:
    """What a condition hands the target (a row of sharing_costs): relay: the message; mot: the translated window;
    native: a full target cache of the context (what handing over a cache instead of the text would move); no
    context: nothing."""
    if cost.condition in RELAY_CONDITIONS:
        return cost.message_bytes
    return {"mot": cost.window_bytes, "native": cost.full_cache_bytes, "no_context": 0.0}.get(cost.condition,
                                                                                            float("nan"))


def costs_markdown(costs: pd.DataFrame) -> str:
    """sharing_costs as a markdown table (bytes handed over, seconds per example by stage)."""
    lines = ["| condition | n | context tokens | message tokens | handed over (bytes) "
             "| building the cache, s (source writes + target reads) | answering, s | total, s "
             "| done ahead of the question, s | after the question, s |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in costs.itertuples():
        relayed = r.condition in RELAY_CONDITIONS
        build = f"{r.build_seconds:.2f} ({r.write_seconds:.2f} + {r.read_seconds:.2f})" if relayed \
            else f"{r.build_seconds:.2f}"
        lines.append(f"| {r.condition} | {r.n} | {r.context_tokens:.0f} | {f'{r.message_tokens:.1f}' if relayed else ''} "
                     f"| {handed_over_bytes(r):,.0f} | {build} | {r.answer_seconds:.2f} | {r.seconds:.2f} "
                     f"| {r.ahead_seconds:.2f} | {r.after_question_seconds:.2f} |")
    return "\n".join(lines)


def message_fields(relay: Relay) -> dict:
    """A relay row's message columns."""
    return {"message": relay.message, "message_tokens": relay.tokens, "message_bytes": relay.bytes,
            "message_generate_seconds": relay.generate_seconds, "message_prefill_seconds": relay.prefill_seconds}


def main(argv: list[str] | None = None) -> int:
    """python -m mot_viz.eval.relay RESULTS: write costs.md / costs.csv (sharing_costs) into an evaluation folder."""
    parser = argparse.ArgumentParser(description="What each way of sharing the context hands over and costs, from "
                                                 "an evaluation folder with relay rows (python -m mot_viz.eval.evaluate)")
    parser.add_argument("results", help="the evaluation's --out folder (examples.csv, summary.json)")
    args = parser.parse_args(argv)

    def body() -> None:
        folder = Path(args.results)
        try:
            settings = json.loads((folder / "summary.json").read_text())["settings"]
            rows = pd.read_csv(folder / "examples.csv", dtype={"message": str}, keep_default_na=False,
                               na_values=[""])
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(f"{folder} is not an evaluation folder ({exc}). Pass the --out folder of "
                              "python -m mot_viz.eval.evaluate.") from exc
        costs = sharing_costs(rows, read_config(settings["checkpoint"]))
        write_csv_atomic(folder / "costs.csv", costs)
        table = costs_markdown(costs)
        note = ("Means per example. Handed over: relay, the message (UTF-8); mot, the translated window (its target "
                "layers' K and V at every context position, fp16); native, a full target cache of the context (fp16); "
                "what the source reads is in every row's own build time (mot: the source's prefill; relay: its "
                "reading and writing). Answering: the example's batch decoding shared evenly among its conditions. "
                "Done ahead of the question: the source's prefill (mot, direct, kvcomm) and relay's writing (its "
                "message needs no question; relay_q's does); after the question: the rest, to the whole answer.")
        write_text_atomic(folder / "costs.md", f"Results: {folder}. {note}\n\n{table}\n")
        print(table)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
