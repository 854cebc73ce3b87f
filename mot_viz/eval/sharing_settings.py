"""The part of an evaluation's settings that belongs to its ways of sharing: the run's options (by Option.name, as
the methods declare them) and what their artifacts recorded (Method.record). summary.json stores each as a key of
its own beside the evaluation's fields, as the flags name them, so a run's settings read the same whichever methods
are registered."""

from __future__ import annotations

from dataclasses import asdict, fields

from ..sharing import registry

OWN = ("options", "recorded")  # the fields of a settings dataclass that hold the ways of sharing's part


class SharingSettings:
    """Mixed into an evaluation's settings dataclass, which has the fields `options` and `recorded` (dicts) and says
    which methods it may answer under (`offered()`)."""

    @classmethod
    def offered(cls) -> tuple[str, ...]:
        raise NotImplementedError

    def __post_init__(self) -> None:
        """Every option of the offered methods holds a value: the given one, else its default."""
        given = {k: v for k, v in self.options.items() if v is not None}
        self.options = {name: o.default for name, o in registry.options(self.offered()).items()} | given

    def to_json(self) -> dict:
        """The settings as summary.json stores them: the options and the records as keys of their own."""
        data = {k: v for k, v in asdict(self).items() if k not in OWN}
        return {**data, **self.options, **self.recorded}

    @classmethod
    def split_json(cls, data: dict) -> dict:
        """The keyword arguments of the settings as summary.json stores them: the offered methods' options it holds
        (__post_init__ gives the others their defaults), what they recorded, and the evaluation's own fields."""
        options = registry.options(cls.offered())
        records = {key for m in registry.methods(cls.offered()) for key in m.records}
        own = {f.name for f in fields(cls)} - set(OWN)
        return {**{k: v for k, v in data.items() if k in own},
                "options": {k: v for k, v in data.items() if k in options},
                "recorded": {k: v for k, v in data.items() if k in records}}

    def option_args(self, asked) -> str:
        """The flags that give this run's options again on its command line."""
        return registry.option_args(self.options, asked, self.offered())
