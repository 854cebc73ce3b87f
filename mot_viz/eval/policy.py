"""Which ways of sharing each evaluation answers under — by default, and in every run whatever --conditions asks —
and which pairs python -m mot_viz.eval.evaluate's paired tests compare: the evaluations' policy. The ways of sharing
themselves (mot_viz.sharing) say only what they are and where they may run (Method.evaluations)."""

from __future__ import annotations

from ..sharing import registry
from ..sharing.c2c import C2C, C2C_PR
from ..sharing.direct import DIRECT
from ..sharing.interlat import INTERLAT
from ..sharing.kvcomm import KVCOMM
from ..sharing.linear import LINEAR
from ..sharing.lsc import LSC
from ..sharing.mean import MEAN
from ..sharing.names import FLOOR, REFERENCE, SECOND, TRANSLATED
from ..sharing.random_window import RANDOM
from ..sharing.relay import RELAY, RELAY_Q

# what each evaluation answers under when --conditions is not given (conversation: always, the tables compare with them)
DEFAULTS = {"evaluate": (REFERENCE, FLOOR, TRANSLATED, RANDOM.name),
            "long_context": (REFERENCE, FLOOR, TRANSLATED, LINEAR.name, MEAN.name),
            "conversation": (REFERENCE, TRANSLATED, FLOOR), "shards": ()}
# what each evaluation answers under in every run, whatever --conditions asks (native: every ratio divides by it; a
# conversation's and the shards' tables compare with all three)
ALWAYS = {"evaluate": (REFERENCE,), "long_context": (REFERENCE,), "conversation": (REFERENCE, TRANSLATED, FLOOR),
          "shards": (REFERENCE, TRANSLATED, FLOOR)}
# python -m mot_viz.eval.evaluate's paired tests (paired.csv, in this order: the shipped folders' and the results
# pages' tables list them so): the MoT against each control and the reference, the second checkpoint against the
# MoT and the controls with no context in them, each other way of sharing against the MoT and the floor
EVALUATE_PAIRS = ((TRANSLATED, RANDOM.name), (TRANSLATED, FLOOR), (TRANSLATED, MEAN.name), (TRANSLATED, REFERENCE),
                  (TRANSLATED, SECOND), (SECOND, MEAN.name), (SECOND, FLOOR),
                  *((TRANSLATED, m.name) for m in (RELAY, RELAY_Q)),
                  *((m.name, FLOOR) for m in (RELAY, RELAY_Q)),
                  *(p for m in (KVCOMM, DIRECT, C2C_PR, C2C, LSC, INTERLAT) for p in ((TRANSLATED, m.name), (m.name, FLOOR))))


def on_request(kind: str) -> tuple[str, ...]:
    """The ways of sharing an evaluation answers under only when --conditions asks for them, in the registry's
    order (a way registered later included)."""
    return tuple(c for c in registry.choices(kind) if c not in ALWAYS[kind])


def with_always(kind: str, asked) -> tuple[str, ...]:
    """A run's conditions: those asked and every run's, in the registry's order."""
    return registry.names(among={*ALWAYS[kind], *asked})
