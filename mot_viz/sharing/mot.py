"""``mot``: the MoT's translated window, replayed by the target over the context (method.md §6)."""

from __future__ import annotations

from .method import Built, Inputs, Method, target_stages_seconds, translated_seconds
from .names import TRANSLATED


class TranslatedWindow(Method):
    def build(self, inputs: Inputs) -> Built:
        """The translation's mixed cache (translate replays it); its source prefill is done ahead."""
        t = inputs.translation
        return Built(t.mixed_kv, translated_seconds(t), t.timings.get("source_prefill", 0.0))

    def target_side(self, built: Built | None, timings) -> float:
        return target_stages_seconds(timings)


MOT = TranslatedWindow(TRANSLATED, "MoT-translated cache", patchable=True,
                           short="MoT (translated window, replayed)")
