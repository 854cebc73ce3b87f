"""Building an evaluation's settings in tests with the ways of sharing's options given as keywords
(relay_tokens=5, direct=..., linear=...), as a command line gives them as flags."""

from __future__ import annotations

from mot_viz.sharing import registry


def settings_of(cls, **kw):
    """`cls` (an evaluation's settings dataclass) with every keyword that names an option of a way of sharing moved
    into its `options`, the others passed as they are; options not given take their defaults."""
    names = registry.options()
    given = {k: v for k, v in kw.items() if k in names}
    options = {name: o.default for name, o in registry.options(cls.offered()).items()}
    return cls(**{k: v for k, v in kw.items() if k not in names}, options={**options, **kw.pop("options", {}), **given})
