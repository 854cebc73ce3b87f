"""The other ways of sharing a context (method.md §15) in the evaluations beside mot_viz.eval.evaluate: the text relay
(``relay``, ``relay_q``: mot_viz.eval.relay), the full-depth map without replay (``direct``:
engine.mot.translate_direct) and selective layer sharing (``kvcomm``: mot_viz.eval.kvcomm). long_context, conversation
and shards share here their checks, the models these conditions need, and what each row records of a condition's
costs:

* what is handed to the target: relay, the message (UTF-8 bytes); a replayed translation (mot, linear, mean, …), the
  translated window (its target layers' K and V at every context position, fp16); direct, every layer's translated
  K and V; kvcomm, the source's own K and V at the shared layers; native, a full target cache of the context (what
  handing over a cache instead of the text would move); no context, nothing;
* what the target computes over the context: a replay over its N positions, a prefill of the message's M tokens (or,
  native, of the N context tokens), or nothing (direct, kvcomm, no context);
* the seconds before the target reads the question, the work that can be done ahead of the question excluded: the
  source's reading (in the use case the source holds its cache already) and relay's writing (its message needs no
  question, so it is written as soon as the source has read the context; the relay rows keep it in
  message_generate_seconds): relay, the target's prefill of the message; relay_q, the source writing for the question
  (its reading of its prompt included) + the target's prefill of the message; mot, alignment + translator + replay;
  direct, alignment + translator + assembling the cache; native, the target's prefill; kvcomm and no context,
  nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from ..engine.alignment import encode
from ..engine.checkpoint import load_checkpoint, read_config
from ..engine.models import LoadedModel, ModelSpec, kv_cache_bytes
from ..engine.mot import MoT
from ..engine.prompts import QAExample
from ..errors import CheckpointError, ConfigError, MotVizError
from .answers import ConditionCaches
from .kvcomm import KVCommSelection, check_kvcomm_fraction, check_kvcomm_pair, kvcomm_selection
from .relay import (RELAY_CONDITIONS, Relay, check_relay_tokens, layers_bytes, message_fields, read_message,
                    source_prompt, write_message)

SHARING = (*RELAY_CONDITIONS, "direct", "kvcomm")
MESSAGE_COLUMNS = ("message", "message_tokens", "message_bytes", "message_generate_seconds", "message_prefill_seconds")
# per row: bytes handed to the target, what it computes over the context ("replay", "prefill" or "none") and over how
# many positions, and the seconds before it reads the question (the source's reading excluded)
COST_COLUMNS = ("handed_bytes", "target_work", "target_tokens", "target_side_seconds")


@dataclass(frozen=True)
class SharingModels:
    """What the sharing conditions of a run need beside the MoT: the direct map and the kvcomm layer choice."""

    direct: MoT | None = None
    kvcomm: KVCommSelection | None = None


def checked_config(flag: str, path: str) -> dict:
    """read_config of the checkpoint passed as `flag`, any failure raised as CheckpointError naming the flag."""
    try:
        return read_config(path)
    except (MotVizError, OSError, ValueError) as exc:
        raise CheckpointError(f"{flag} {path}: {exc} Pass a checkpoint folder written by MoT Viz "
                              "(config.json + translator.safetensors), e.g. pretrained/smollm2-to-gemma3.") from exc


def full_depth(config: dict) -> bool:
    """Whether a checkpoint's config translates every target layer (what replay 'none' needs)."""
    return [c["dst_layer_idx"] for c in config["channels"]] == list(range(config["target"]["num_layers"]))


def check_direct_flag(conditions: tuple[str, ...], direct_path: str | None, checkpoint: str, config: dict) -> None:
    """Raise ConfigError/CheckpointError unless the "direct" condition and --direct come together, with a full-depth
    map without replay of the pair of --checkpoint (whose config.json is `config`)."""
    wanted = "direct" in conditions
    if wanted != bool(direct_path):
        raise ConfigError("the 'direct' condition needs --direct CHECKPOINT (a full-depth map without replay, e.g. "
                          "pretrained/smollm2-to-gemma3-direct)" if wanted else
                          f"--direct {direct_path} is read by the 'direct' condition: add direct to --conditions")
    if not wanted:
        return
    direct = checked_config("--direct", direct_path)
    if any(direct[k].get("fingerprint") != config[k].get("fingerprint") for k in ("source", "target")):
        raise CheckpointError(f"--direct {direct_path} was made for another model pair than --checkpoint "
                              f"{checkpoint}. Pass a direct map of the same pair.")
    if not (direct.get("replay") or {}).get("direct") or not full_depth(direct):
        raise CheckpointError(f"--direct {direct_path} replays its window; the 'direct' condition needs a full-depth "
                              "map without replay: fit one with python -m mot_viz.train.quickfit --direct.")


def check_sharing(conditions: tuple[str, ...], config: dict, checkpoint: str, relay_tokens: int,
                  direct: str | None, kvcomm_fraction: float, context_tokens: int) -> None:
    """Raise ConfigError/CheckpointError for sharing settings no run can use, before a model loads: a message length
    the source cannot write after `context_tokens` tokens, direct without --direct (or --direct without direct), a
    kvcomm condition on a pair of other cache shapes or tokenizers."""
    check_relay_tokens(relay_tokens, config["source"].get("max_positions") if set(conditions) & set(RELAY_CONDITIONS)
                       else None, context_tokens)
    check_direct_flag(conditions, direct, checkpoint, config)
    check_kvcomm_fraction(kvcomm_fraction)
    if "kvcomm" in conditions:
        check_kvcomm_pair(config["source"], config["target"])


def load_sharing(conditions: tuple[str, ...], direct: str | None, kvcomm_fraction: float, source: LoadedModel,
                 target: LoadedModel, calibration: list[QAExample]) -> SharingModels:
    """The direct map (when "direct" is asked for) and the kvcomm layer choice, calibrated on `calibration` (when
    "kvcomm" is)."""
    return SharingModels(
        load_checkpoint(direct, source, target)[0] if "direct" in conditions else None,
        kvcomm_selection(source, target, calibration, kvcomm_fraction)
        if "kvcomm" in conditions and calibration else None)


def method(condition: str) -> str:
    """The way of sharing a condition of any evaluation is: "relay_2" → "relay", "shards_4" / "whole" → "mot"."""
    base = re.sub(r"_\d+$", "", condition)
    return {"whole": "mot", "shards": "mot", "evidence": "mot"}.get(base, base)


@dataclass(frozen=True)
class RelayParts:
    """A relay written by several source agents, each from its own part of the context, read by one target."""

    relay: Relay  # the joined message, the target's cache of it; tokens and generate_seconds summed over the agents
    slowest_seconds: float  # the slowest agent's writing (the agents' wall time when they write in parallel)
    source_tokens: tuple[int, ...]  # each agent's cache when done: its prompt (BOS prefix included) and its message


def relay_parts(source: LoadedModel, target: LoadedModel, example: QAExample, texts: list[str], condition: str,
                max_tokens: int) -> RelayParts:
    """Several source agents each write their message from their own part of the context (relay.write_message of
    the example with that part as its passage); the target reads the messages joined in order, a blank line apart
    (relay.read_message), and only them."""
    parts = [replace(example, context=text) for text in texts]
    written = [write_message(source, part, condition, max_tokens) for part in parts]
    message = "\n\n".join(text for text, _, _ in written if text)
    kv, prefill = read_message(target, example, message)
    prompts = [len(source.prefix_ids + encode(source.tokenizer, source_prompt(source, part, condition)))
               for part in parts]
    return RelayParts(Relay(condition, message, sum(n for _, n, _ in written), sum(s for _, _, s in written), kv,
                            prefill, capped=any(n >= max_tokens for _, n, _ in written)),
                      max(s for _, _, s in written), tuple(p + n for p, (_, n, _) in zip(prompts, written)))


def handed_bytes(condition: str, tokens: int, target: ModelSpec, window_layers: int, relay: Relay | None = None,
                 kvcomm: KVCommSelection | None = None, source: ModelSpec | None = None) -> float:
    """Bytes a condition hands the target for a context of `tokens` target tokens (module docstring)."""
    way = method(condition)
    if way in RELAY_CONDITIONS:
        return float(relay.bytes)
    if way == "native":
        return float(kv_cache_bytes(target, tokens))
    if way == "no_context":
        return 0.0
    if way == "kvcomm":
        return float(layers_bytes(tokens, len(kvcomm.layers), source.kv_hidden))
    layers = target.num_layers if way == "direct" else window_layers
    return float(layers_bytes(tokens, layers, target.kv_hidden))


def target_work(condition: str, tokens: int, relay: Relay | None = None, prefix: int = 0) -> tuple[str, int]:
    """What the target computes over the context and over how many positions: ("replay", N), ("prefill", M) or
    ("none", 0). prefix: the target's BOS positions, not counted in a relay's M."""
    way = method(condition)
    if way in RELAY_CONDITIONS:
        return "prefill", int(relay.kv[0][0].shape[2]) - prefix
    if way == "native":
        return "prefill", tokens
    return ("none", 0) if way in ("direct", "kvcomm", "no_context") else ("replay", tokens)


def target_side(condition: str, timings: dict[str, float], relay: Relay | None = None,
                writing: float | None = None) -> float:
    """Seconds before the target reads the question over a condition's cache, the work done ahead of the question
    excluded (module docstring), from the stages of the translation it came from (`timings`) or its relay (`writing`:
    relay_q's agents' wall time writing, when several write in parallel; default the relay's own; relay's writing is
    done ahead). NaN where it is not measured (the linear and mean controls, built from the MoT's translation)."""
    way = method(condition)
    if way == "relay":
        return relay.prefill_seconds
    if way == "relay_q":
        return (relay.generate_seconds if writing is None else writing) + relay.prefill_seconds
    if way in ("mot", "direct"):
        return sum(timings.get(stage, 0.0) for stage in ("alignment", "translator", "replay", "assemble"))
    return {"native": timings.get("native_prefill", np.nan), "no_context": 0.0, "kvcomm": 0.0}.get(way, np.nan)


def target_side_seconds(condition: str, built: ConditionCaches) -> float:
    """target_side of a condition of answers.condition_caches."""
    return target_side(condition, (built.direct if condition == "direct" else built.translation).timings,
                       built.relays.get(condition))


def cost_fields(condition: str, tokens: int, target: LoadedModel, window_layers: int, target_side: float,
                relay: Relay | None = None, kvcomm: KVCommSelection | None = None,
                source: LoadedModel | None = None) -> dict:
    """A row's message columns (relay only; the message's carriage returns written as line breaks, which a CSV
    writer quotes, so a row stays one record) and cost columns (COST_COLUMNS)."""
    work, work_tokens = target_work(condition, tokens, relay, len(target.prefix_ids))
    message = {} if relay is None else {**message_fields(relay), "message": relay.message.replace("\r", "\n")}
    return {**message,
            "handed_bytes": handed_bytes(condition, tokens, target.spec, window_layers, relay, kvcomm,
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


def check_conditions(conditions: tuple[str, ...], known: tuple[str, ...], flag: str = "--conditions") -> None:
    """Raise ConfigError for a condition outside `known`."""
    unknown = [c for c in conditions if c not in known]
    if unknown:
        raise ConfigError(f"{flag} {' '.join(unknown)}: choose from {' '.join(known)}.")


def sharing_stages(part) -> dict:
    """Median seconds of the sharing conditions' own stages over an evaluation's rows (a DataFrame): each relay's
    writing (the source reading its prompt and decoding) and reading (the target's prefill of the message), and the
    direct map's target side (alignment + translator + assembling the cache)."""
    out = {}
    for condition in RELAY_CONDITIONS:
        rows = part[part["condition"] == condition]
        if len(rows):
            out[f"{condition}: source writes" + (" (done ahead)" if condition == "relay" else "")] = \
                float(rows["message_generate_seconds"].median())
            out[f"{condition}: target reads"] = float(rows["message_prefill_seconds"].median())
    direct = part[part["condition"] == "direct"]
    if len(direct):
        out["direct: alignment + translator + assemble"] = float(direct["target_side_seconds"].median())
    return out
