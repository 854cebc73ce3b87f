"""Every way of sharing a context, by name, in the order an evaluation's rows list them; what each evaluation may
answer under; the options the methods declare (every evaluation's parser takes them from here, add_options) and the
checks a run's methods make before any model loads.

A new way of sharing is one module (a `Method`, declaring its options and what it loads) and one line here, or a
call of register() for one defined outside the package.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping

from ..errors import ConfigError
from .c2c import C2C, C2C_PR
from .direct import DIRECT
from .interlat import INTERLAT
from .kvcomm import KVCOMM
from .linear import LINEAR
from .lsc import LSC
from .mean import MEAN
from .method import Loading, Method, Option, Request
from .mot import MOT
from .names import FLOOR, REFERENCE, SECOND, TRANSLATED  # the evaluations and pages import them from here
from .native import NATIVE
from .no_context import NO_CONTEXT
from .random_window import RANDOM
from .relay import RELAY, RELAY_Q

REGISTRY: dict[str, Method] = {m.name: m for m in (NATIVE, NO_CONTEXT, MOT, RANDOM, LINEAR, MEAN, RELAY, RELAY_Q,
                                                   DIRECT, KVCOMM, C2C_PR, C2C, LSC, INTERLAT)}
KINDS = ("evaluate", "long_context", "conversation", "shards")  # the evaluations that answer under these methods
# the settings of an evaluation that are the MoT under another name: a shard count's, the whole document's, a second
# checkpoint of the pair (python -m mot_viz.eval.evaluate --second)
MOT_ALIASES = {"whole": "mot", "shards": "mot", "evidence": "mot", "second": "mot"}
# REFERENCE, FLOOR, TRANSLATED (names.py): the bounds every ratio is measured between, and the way of sharing every
# paired test compares with, the conditions the evaluations' tables name; SECOND: evaluate --second's checkpoint
# (which each evaluation answers under, and which pairs it compares: mot_viz.eval.policy)


def method(name: str) -> Method:
    """The method a condition of any evaluation is: "relay_2" → relay, "shards_4" / "whole" → mot; a ConfigError
    naming the choices for an unknown one."""
    base = re.sub(r"_\d+$", "", name)
    found = REGISTRY.get(MOT_ALIASES.get(base, base)) or REGISTRY.get(name)
    if found is None:
        raise ConfigError(f"unknown way of sharing {name!r}: choose from {' '.join(REGISTRY)}.")
    return found


def methods(names) -> list[Method]:
    """The methods of `names`, in the registry's order (the order rows and tables list them); check_names' error for
    a name not registered."""
    check_names(tuple(names), tuple(REGISTRY), flag="unknown conditions:")
    return [m for m in REGISTRY.values() if m.name in names]


def choices(kind: str) -> tuple[str, ...]:
    """The methods an evaluation (one of KINDS) can answer under (Method.evaluations), in the registry's order."""
    if kind not in KINDS:
        raise ConfigError(f"unknown evaluation {kind!r}: choose from {' '.join(KINDS)}.")
    return tuple(name for name, m in REGISTRY.items() if kind in m.evaluations)


def names(where=lambda m: True, among=None) -> tuple[str, ...]:
    """The names of the methods `where` holds for (of `among`, when given), in the registry's order."""
    return tuple(name for name, m in REGISTRY.items() if where(m) and (among is None or name in among))


def controls(among) -> tuple[str, ...]:
    """The controls of the MoT among `among` (Method.control), in the registry's order."""
    return names(lambda m: m.control, among)


def control_pairs(among) -> tuple[tuple[str, str], ...]:
    """Each control of `among` that carries the context (a map of the window) against each that holds none (a tie):
    what the map's window holds of the context."""
    held = names(lambda m: m.control and m.tie is None, among)
    return tuple((a, b) for a in held for b in names(lambda m: m.control and m.tie is not None, among))


def labels() -> dict[str, str]:
    """Each method's label, as the pages and reports name it."""
    return {name: m.label for name, m in REGISTRY.items()}


def check_names(conditions: tuple[str, ...], known: tuple[str, ...], flag: str = "--conditions") -> None:
    """Raise ConfigError for a condition outside `known`."""
    unknown = [c for c in conditions if c not in known]
    if unknown:
        raise ConfigError(f"{flag} {' '.join(unknown)}: choose from {' '.join(known)}.")


def check(request: Request) -> None:
    """Every registered method's checks of a run's settings (Method.check), before any model loads."""
    for m in REGISTRY.values():
        m.check(request)


def register(way: Method) -> None:
    """Add a way of sharing defined outside this package (after those registered here, in the rows' order); a name
    already taken is refused."""
    if way.name in REGISTRY or way.name in MOT_ALIASES:
        raise ConfigError(f"a way of sharing named {way.name!r} is registered already: choose another name.")
    REGISTRY[way.name] = way


def unregister(name: str) -> None:
    """Remove a way of sharing added by register() (a test's own)."""
    REGISTRY.pop(name, None)


def options(among=None) -> dict[str, Option]:
    """The options of the methods `among` (names; None: every method), by name, in the registry's order (an option
    two methods share counted once)."""
    ways = REGISTRY.values() if among is None else methods(among)
    return {o.name: o for m in ways for o in m.options}


def add_options(parser: argparse.ArgumentParser, among) -> None:
    """Every option of the methods `among` (an evaluation's: choices(kind)) as flags of its parser (not given: None,
    so that a flag given for a method not asked for is told apart from its default; run_options resolves them)."""
    for o in options(among).values():
        owners = " ".join(m.name for m in REGISTRY.values() if o in m.options)
        shown = "" if o.default is None else f"; default {o.default}"
        parser.add_argument(o.flag, type=o.type, default=None, help=f"{o.help} [{owners}{shown}]")


def run_options(given: Mapping, asked, among, checkpoint: str = "", flag: str = "--conditions") -> dict:
    """A run's options, by name, from what its command line (or page) gave (`given`: name -> value, None where not
    given): a value given for an option no asked method reads is refused (ConfigError naming `flag`); one not given is
    found beside `checkpoint` (Option.beside) when an asked method reads it, else its default. `among`: the methods
    the run may answer under (choices(kind)), whose options the result holds."""
    out = {}
    for name, o in options(among).items():
        readers = [m.name for m in REGISTRY.values() if o in m.options and m.name in asked]
        value = given.get(name)
        if value is not None and not readers:
            owners = " or ".join(m.name for m in REGISTRY.values() if o in m.options)
            raise ConfigError(f"{o.flag} {value} is read by {owners}, which this run does not answer under: add "
                              f"{owners.split(' or ')[0]} to {flag}, or leave {o.flag} out.")
        if value is None and readers and o.beside is not None and checkpoint:
            value = o.beside(checkpoint)
        out[name] = o.default if value is None else value
    return out


def option_args(opts: Mapping, asked, among) -> str:
    """The flags that give `opts` again on a command line (a run's command), for the options an asked method reads,
    where they differ from the default."""
    parts = []
    for name, o in options(among).items():
        value = opts.get(name)
        if value is not None and value != o.default and any(o in m.options for m in methods(asked)):
            parts.append(f" {o.flag} {value}")
    return "".join(parts)


def load_artifacts(asked, loading: Loading) -> dict[str, object]:
    """What each asked method loads once per run (Method.load), by method name (None: nothing)."""
    return {m.name: m.load(loading) for m in methods(asked)}


def recorded(artifacts: Mapping) -> dict:
    """What a run's settings record of the loaded artifacts (Method.record), e.g. kvcomm's layer choice."""
    out = {}
    for name, artifact in artifacts.items():
        if artifact is not None:
            out.update(REGISTRY[name].record(artifact))
    return out
