"""What a QA evaluation run is, apart from running it: its settings as summary.json stores them (EvalSettings), the
passage cut to the run's context budget (truncate_context) and a checkpoint loaded to replay as the run did
(load_evaluated). python -m mot_viz.eval.evaluate runs them; lm_check, layer_error and patching rebuild a run's caches
from them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..engine.alignment import encode
from ..engine.checkpoint import load_checkpoint
from ..engine.models import LoadedModel
from ..engine.mot import MoT
from ..engine.prompts import QAExample, build_prompt
from ..engine.replay_config import replay_mode
from ..sharing.kvcomm import KVCOMM_FRACTION
from ..sharing.registry import DEFAULTS, names
from ..sharing.relay import RELAY_TOKENS

CONDITIONS = DEFAULTS["evaluate"]

MIN_CONTEXT_TOKENS = 16  # truncate_context keeps at least this many passage tokens


def truncate_context(target: LoadedModel, example: QAExample, budget: int) -> QAExample:
    """Right-truncate the example's passage so the context part fits `budget` target tokens."""
    prompt = build_prompt(example, target.chat_frame)
    if len(encode(target.tokenizer, prompt.context_text)) <= budget:
        return example
    overhead = len(encode(target.tokenizer, prompt.context_text.replace(example.context, "")))
    ids = encode(target.tokenizer, example.context)[: max(MIN_CONTEXT_TOKENS, budget - overhead)]
    return replace(example, context=target.tokenizer.decode(ids))


@dataclass
class EvalSettings:
    """How one evaluation run was made; written beside its results."""

    checkpoint: str
    second: str | None
    datasets: tuple[str, ...]
    n: int
    seed: int
    max_new_tokens: int
    max_context_tokens: int
    bootstrap: int
    conditions: tuple[str, ...] = CONDITIONS  # native is always among them: retained shares divide by it
    prompt: str = "plain"  # "chat template" when the target is chat-tuned (data.build_prompt); set by run()
    replay: str = "checkpoint"  # each checkpoint's own replay, or "dense" / "sparse" for both (replay_config.replay_mode)
    relay_tokens: int = RELAY_TOKENS  # the longest relay message, in source tokens (relay conditions only)
    direct: str | None = None  # the full-depth map without replay the "direct" condition answers from (--direct)
    kvcomm_fraction: float = KVCOMM_FRACTION  # share of the layers the kvcomm condition shares (--kvcomm_fraction)
    kvcomm_layers: tuple[int, ...] = ()  # the layers the kvcomm condition shared, chosen by the run (set by run())
    kvcomm_scores: tuple[float, ...] = ()  # per layer, the calibration's attention on the context (set by run())

    @classmethod
    def from_json(cls, data: dict) -> EvalSettings:
        """The settings as summary.json stores them (lists for tuples; older runs lack the later fields)."""
        return cls(**{**data, "datasets": tuple(data["datasets"]),
                      "conditions": tuple(data.get("conditions") or CONDITIONS)})

    def command(self, out_dir: Path | None = None) -> str:
        """The command line that runs this evaluation (writing to `out_dir` when given)."""
        return ("python -m mot_viz.eval.evaluate --checkpoint " + self.checkpoint
                + (f" --second {self.second}" if self.second else "")
                + f" --datasets {' '.join(self.datasets)} --n {self.n} --seed {self.seed}"
                + ("" if self.conditions == CONDITIONS else f" --conditions {' '.join(self.conditions)}")
                + ("" if self.replay == "checkpoint" else f" --replay {self.replay}")
                + ("" if self.relay_tokens == RELAY_TOKENS or not names(lambda m: m.message, self.conditions)
                   else f" --relay_tokens {self.relay_tokens}")
                + (f" --direct {self.direct}" if self.direct else "")
                + ("" if self.kvcomm_fraction == KVCOMM_FRACTION or not names(lambda m: m.needs.kvcomm, self.conditions)
                   else f" --kvcomm_fraction {self.kvcomm_fraction}")
                + f" --max_new_tokens {self.max_new_tokens} --max_context_tokens {self.max_context_tokens}"
                + (f" --out {out_dir}" if out_dir is not None else ""))


def load_evaluated(path: str, settings: EvalSettings, source: LoadedModel, target: LoadedModel) -> MoT:
    """One evaluated checkpoint (--checkpoint or --second), replaying as settings.replay says."""
    mot = load_checkpoint(path, source, target)[0]
    mot.replay = replay_mode(mot.replay, settings.replay)
    return mot
