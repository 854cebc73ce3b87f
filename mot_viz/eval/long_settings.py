"""How a long-document run is set up: LongSettings (how one python -m mot_viz.eval.long_context run was made, as its
summary.json stores it; layer_error and patching rebuild the run's documents from it) and whether a document fits a
model beside its question and answer (check_budget) — shared by long_context, shards, conversation and the Long
context page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..data.long_context import MIN_BUDGET
from ..errors import ContextError, MotVizError
from ..sharing import registry
from .answers import MAX_NEW_TOKENS
from .policy import DEFAULTS
from .sharing_settings import SharingSettings

CONDITIONS = DEFAULTS["long_context"]  # the default conditions
QUESTION_ROOM = 96  # target tokens kept free after a budget for the prompt's frame and the question


@dataclass
class LongSettings(SharingSettings):
    """How one long-context run was made; written beside its results."""

    checkpoint: str
    source: str  # "stacks", "qasper" or a .jsonl path (mot_viz.data.long_context)
    budgets: tuple[int, ...]
    n: int  # documents per budget
    seed: int
    max_new_tokens: int = MAX_NEW_TOKENS
    bootstrap: int = 1000
    conditions: tuple[str, ...] = CONDITIONS
    options: dict = field(default_factory=dict)  # the ways of sharing's options, by name (registry.run_options)
    recorded: dict = field(default_factory=dict)  # what their artifacts recorded (kvcomm's layers; set by run())

    @classmethod
    def offered(cls) -> tuple[str, ...]:
        return registry.choices("long_context")

    @classmethod
    def from_json(cls, data: dict) -> LongSettings:
        return cls(**{**cls.split_json(data), "budgets": tuple(data["budgets"]),
                      "conditions": tuple(data["conditions"])})

    def command(self, out_dir: Path | None = None) -> str:
        """The command line that runs this evaluation (writing to `out_dir` when given)."""
        return ("python -m mot_viz.eval.long_context --checkpoint " + self.checkpoint + f" --source {self.source}"
                + f" --budgets {' '.join(map(str, self.budgets))} --n {self.n} --seed {self.seed}"
                + ("" if self.conditions == CONDITIONS else f" --conditions {' '.join(self.conditions)}")
                + self.option_args(self.conditions)
                + f" --max_new_tokens {self.max_new_tokens}" + (f" --out {out_dir}" if out_dir is not None else ""))


def check_budget(budget: int, models: dict[str, tuple[str, int | None]], max_new_tokens: int = MAX_NEW_TOKENS,
                 error: type[MotVizError] = ContextError) -> None:
    """Raise `error` when a `budget`-token document, its question and its answer do not fit a model's positions;
    models: role -> (name, max_positions)."""
    room = QUESTION_ROOM + max_new_tokens
    for role, (name, limit) in models.items():
        if limit and budget + room > limit and limit - room < MIN_BUDGET:  # no document fits beside such an answer
            longest = limit - QUESTION_ROOM - budget  # the longest answer beside this document
            raise error(f"answers of up to {max_new_tokens} tokens leave no room for a document in the {role} model "
                        f"'{name}', which allows {limit} positions. "
                        + (f"Pass --max_new_tokens {longest} or less for {budget}-token documents." if longest > 0
                           else f"Pass a smaller --max_new_tokens, and documents of under {limit - QUESTION_ROOM} "
                           "tokens." if limit > QUESTION_ROOM + MIN_BUDGET else "Choose another model."))
        if limit and budget + room > limit:
            raise error(f"a {budget}-token document does not fit the {role} model '{name}': it allows {limit} "
                        f"positions and the question and answer need about {room} more. Choose a length of at most "
                        f"{limit - room} tokens.")
