"""How one long-context run (python -m mot_viz.eval.long_context) was made, as its summary.json stores it: what the
command runs from and layer_error rebuilds the run's documents from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .answers import MAX_NEW_TOKENS
from .kvcomm import KVCOMM_FRACTION
from .relay import RELAY_TOKENS

CONDITIONS = ("native", "no_context", "mot", "linear", "mean")  # the default conditions


@dataclass
class LongSettings:
    """How one long-context run was made; written beside its results."""

    checkpoint: str
    linear: str | None  # the closed-form map of the same window (default: "<checkpoint>-linear" when it exists)
    source: str  # "stacks", "qasper" or a .jsonl path (mot_viz.data.long_context)
    budgets: tuple[int, ...]
    n: int  # documents per budget
    seed: int
    max_new_tokens: int = MAX_NEW_TOKENS
    bootstrap: int = 1000
    conditions: tuple[str, ...] = CONDITIONS
    relay_tokens: int = RELAY_TOKENS  # the longest relay message, in source tokens (relay conditions only)
    direct: str | None = None  # the full-depth map without replay the "direct" condition answers from (--direct)
    kvcomm_fraction: float = KVCOMM_FRACTION  # share of the layers the kvcomm condition shares (--kvcomm_fraction)
    kvcomm_layers: tuple[int, ...] = ()  # the layers the kvcomm condition shared (set by run())

    @classmethod
    def from_json(cls, data: dict) -> LongSettings:
        return cls(**{**data, "budgets": tuple(data["budgets"]), "conditions": tuple(data["conditions"]),
                      "kvcomm_layers": tuple(data.get("kvcomm_layers", ()))})

    def command(self, out_dir: Path | None = None) -> str:
        """The command line that runs this evaluation (writing to `out_dir` when given)."""
        return ("python -m mot_viz.eval.long_context --checkpoint " + self.checkpoint
                + (f" --linear {self.linear}" if self.linear else "") + f" --source {self.source}"
                + f" --budgets {' '.join(map(str, self.budgets))} --n {self.n} --seed {self.seed}"
                + ("" if self.conditions == CONDITIONS else f" --conditions {' '.join(self.conditions)}")
                + ("" if self.relay_tokens == RELAY_TOKENS else f" --relay_tokens {self.relay_tokens}")
                + (f" --direct {self.direct}" if self.direct else "")
                + ("" if self.kvcomm_fraction == KVCOMM_FRACTION else f" --kvcomm_fraction {self.kvcomm_fraction}")
                + f" --max_new_tokens {self.max_new_tokens}" + (f" --out {out_dir}" if out_dir is not None else ""))
