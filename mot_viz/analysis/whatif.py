"""Expert what-if (the Expert routing page): the same context translated with every token's gates overridden —
one expert forced, one dropped, or uniform — beside the router's own choice, and how each expert's tokens fare.

Only the gates change (mot_viz.engine.translator.GateOverride): the experts, the linear path (if any), the
alignment and the replay are the checkpoint's own, so a difference is the router's doing. The what-if reuses
the router's translation up to the translator and its replay below the window (mot.translate_again).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from ..engine.cache_errors import KV_NAMES, per_token_errors, token_vectors
from ..engine.layout import context_positions
from ..engine.models import LoadedModel
from ..engine.mot import MoT, Translation, translate_again
from ..engine.prompts import QAExample
from ..engine.translator import GateOverride
from ..eval.answers import Answer, MAX_NEW_TOKENS, answer_from_cache, first_answer_logprobs
from .cache_metrics import cache_error_table
from .shift.metrics import kl_divergence


@dataclass
class WhatIf:
    """One gate choice on one context: its translation and what it does to the cache and the answer."""

    label: str
    translation: Translation  # native_kv shared with the router's own translation
    errors: pd.DataFrame  # cache_error_table: per (comparison, K/V, layer)
    first_token_kl: float | None  # KL(native ‖ this) of the first answer token; None without a question
    answer: Answer | None  # None without a question


def override_label(override: GateOverride) -> str:
    return {"router": "the router's own gates", "force": f"every token to expert {override.expert}",
            "drop": f"expert {override.expert} dropped (router's top-k of the others)",
            "uniform": "uniform gates over all experts"}[override.mode]


@torch.no_grad()
def what_if(mot: MoT, source: LoadedModel, target: LoadedModel, base: Translation, override: GateOverride,
            example: QAExample | None = None, suffix: str | None = None,
            max_new_tokens: int = MAX_NEW_TOKENS) -> WhatIf:
    """Translate base's context again under `override` (the router's own choice: base itself) and measure it.

    With an example (and its prompt suffix), the first answer token's KL to native and the answer are computed.
    """
    translation = base if override.mode == "router" else translate_again(mot, source, target, base, override)
    errors = cache_error_table(translation, mot.channels)
    kl, answer = None, None
    if example is not None:
        if suffix is not None:
            kl = kl_divergence(*first_answer_logprobs(target, [base.native_kv, translation.mixed_kv], suffix))
        answer = answer_from_cache(target, translation.mixed_kv, example, "mot", max_new_tokens, suffix)
    return WhatIf(override_label(override), translation, errors, kl, answer)


def expert_error_table(translation: Translation, mot: MoT) -> pd.DataFrame:
    """Per mixture (K, V) and expert: tokens whose largest gate it holds, their share of the context and their mean
    relative L2 error and cosine of the translated window against native (all window layers together)."""
    out = translation.translated
    p = translation.prefix_len
    rows = []
    for j, (kv, routing) in enumerate(zip(KV_NAMES, (out.key_routing, out.value_routing))):
        if routing is None:
            continue
        cand = torch.cat([token_vectors(translation.injected_kv[i][j]) for i in range(mot.channels.window)], -1)
        ref = torch.cat([token_vectors(context_positions(translation.native_kv[t], p)[j])
                         for t in mot.channels.target_layers], -1)
        errors = per_token_errors(cand, ref)
        top = routing.gates[0].argmax(-1)  # [N]
        for e in range(routing.gates.shape[-1]):
            mine = top == e
            n = int(mine.sum())
            rows.append({"mixture": kv, "expert": e, "tokens": n, "share": n / len(top),
                         "rel_l2": float(errors["rel_l2"][mine].mean()) if n else float("nan"),
                         "cosine": float(errors["cosine"][mine].mean()) if n else float("nan")})
    return pd.DataFrame(rows)
