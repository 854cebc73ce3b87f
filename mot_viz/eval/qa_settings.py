"""What a QA evaluation run is, apart from running it: its settings as summary.json stores them (EvalSettings), the
passage cut to the run's context budget (truncate_context) and a checkpoint loaded to replay as the run did
(load_evaluated). python -m mot_viz.eval.evaluate runs them; lm_check, layer_error and patching rebuild a run's caches
from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..engine.alignment import encode
from ..engine.checkpoint import load_checkpoint
from ..engine.models import LoadedModel
from ..engine.mot import MoT
from ..engine.prompts import QAExample, build_prompt
from ..engine.replay_config import replay_mode
from ..sharing import registry
from .policy import DEFAULTS
from .sharing_settings import SharingSettings

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
class EvalSettings(SharingSettings):
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
    options: dict = field(default_factory=dict)  # the ways of sharing's options, by name (registry.run_options)
    recorded: dict = field(default_factory=dict)  # what their artifacts recorded (kvcomm's layers; set by run())

    @classmethod
    def offered(cls) -> tuple[str, ...]:
        return registry.choices("evaluate")

    @classmethod
    def from_json(cls, data: dict) -> EvalSettings:
        """The settings as summary.json stores them (lists for tuples; older runs lack the later fields)."""
        return cls(**{**cls.split_json(data), "datasets": tuple(data["datasets"]),
                      "conditions": tuple(data.get("conditions") or CONDITIONS)})

    def command(self, out_dir: Path | None = None) -> str:
        """The command line that runs this evaluation (writing to `out_dir` when given)."""
        return ("python -m mot_viz.eval.evaluate --checkpoint " + self.checkpoint
                + (f" --second {self.second}" if self.second else "")
                + f" --datasets {' '.join(self.datasets)} --n {self.n} --seed {self.seed}"
                + ("" if self.conditions == CONDITIONS else f" --conditions {' '.join(self.conditions)}")
                + ("" if self.replay == "checkpoint" else f" --replay {self.replay}")
                + self.option_args(self.conditions)
                + f" --max_new_tokens {self.max_new_tokens} --max_context_tokens {self.max_context_tokens}"
                + (f" --out {out_dir}" if out_dir is not None else ""))


def load_evaluated(path: str, settings: EvalSettings, source: LoadedModel, target: LoadedModel) -> MoT:
    """One evaluated checkpoint (--checkpoint or --second), replaying as settings.replay says."""
    mot = load_checkpoint(path, source, target)[0]
    mot.replay = replay_mode(mot.replay, settings.replay)
    return mot
