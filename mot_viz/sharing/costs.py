"""What a row of any evaluation records of a method's costs (each method says its own: Method.handed_bytes,
target_work, target_side):

* what is handed to the target: a relay, the message (UTF-8 bytes); a replayed translation (mot, linear, mean, …),
  the translated window (its target layers' K and V at every context position, fp16); direct, every layer's
  translated K and V; kvcomm, the source's own K and V at the shared layers; native, a full target cache of the
  context (what handing over a cache instead of the text would move); no context, nothing;
* what the target computes over the context: a replay over its N positions, a prefill of the message's M tokens (or,
  native, of the N context tokens), or nothing (direct, kvcomm, no context);
* the seconds before the target reads the question, the work that can be done ahead of the question excluded: the
  source's reading (in the use case the source holds its cache already) and relay's writing (its message needs no
  question, so it is written as soon as the source has read the context; the relay rows keep it in
  message_generate_seconds): relay, the target's prefill of the message; relay_q, the source writing for the question
  (its reading of its prompt included) + the target's prefill of the message; mot, alignment + translator + replay;
  direct, alignment + translator + assembling the cache; native, the target's prefill; kvcomm and no context,
  nothing; NaN where it is not measured (the linear and mean controls, built from the MoT's translation).
"""

from __future__ import annotations

import numpy as np

from ..engine.models import LoadedModel
from .method import Built
from .registry import method, names

MESSAGE_COLUMNS = ("message", "message_tokens", "message_bytes", "message_generate_seconds", "message_prefill_seconds")
# 1 where the source began to repeat itself and the message ends before the repeat (sharing.relay.repeats_itself);
# last in every results table, so that a table written before it still resumes
LOOPED_COLUMNS = ("message_looped",)
# per row: bytes handed to the target, what it computes over the context ("replay", "prefill" or "none") and over how
# many positions, and the seconds before it reads the question (the source's reading excluded)
COST_COLUMNS = ("handed_bytes", "target_work", "target_tokens", "target_side_seconds")


def cost_fields(condition: str, built: Built, tokens: int, target: LoadedModel, window_layers: int,
                target_side: float, source: LoadedModel | None = None) -> dict:
    """A row's columns of the method's own (Method.row_fields: a relay's message) and its cost columns
    (COST_COLUMNS), read from what it built for a context of `tokens` target tokens."""
    m = method(condition)
    work, work_tokens = m.target_work(built, tokens, len(target.prefix_ids))
    return {**m.row_fields(built),
            "handed_bytes": m.handed_bytes(built, tokens, target.spec, window_layers,
                                           None if source is None else source.spec),
            "target_work": work, "target_tokens": work_tokens, "target_side_seconds": target_side}


def cost_medians(rows) -> dict:
    """The cost columns of one condition's rows (a DataFrame) as a summary holds them: medians, and the work."""
    if "handed_bytes" not in rows or rows["handed_bytes"].isna().all():  # results written before these columns
        return {"handed_bytes": np.nan, "target_work": "", "target_tokens": np.nan}
    return {"handed_bytes": float(rows["handed_bytes"].median()), "target_work": str(rows["target_work"].iloc[0]),
            "target_tokens": float(rows["target_tokens"].median())}


def work_text(work: str, tokens: float) -> str:
    """What the target computes over the context, in words: "replay over 1,024", "prefill of 57", "nothing"."""
    if work in ("", "none") or tokens != tokens:
        return "nothing" if work == "none" else ""
    return f"{work} {'over' if work == 'replay' else 'of'} {tokens:,.0f}"


def sharing_stages(part) -> dict:
    """Median seconds of the sharing methods' own stages over an evaluation's rows (a DataFrame): each message's
    writing (the source reading its prompt and decoding) and reading (the target's prefill of the message), and the
    target side of a method with its own translation (direct: alignment + translator + assembling the cache)."""
    out = {}
    for condition in names(lambda m: m.message):
        rows = part[part["condition"] == condition]
        if len(rows):
            out[f"{condition}: source writes" + ("" if method(condition).for_question else " (done ahead)")] = \
                float(rows["message_generate_seconds"].median())
            out[f"{condition}: target reads"] = float(rows["message_prefill_seconds"].median())
    for condition in names(lambda m: bool(m.side)):
        rows = part[part["condition"] == condition]
        if len(rows):
            out[f"{condition}: {method(condition).side}"] = float(rows["target_side_seconds"].median())
    return out
