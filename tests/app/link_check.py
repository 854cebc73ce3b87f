"""What the app restores from a result's link, for the tests that open shipped or live results by their links."""

from __future__ import annotations

import urllib.parse

from mot_viz.app.loaders import available_checkpoints
from mot_viz.app.permalink import parse_link
from mot_viz.app.settings import EXAMPLES_PER_DATASET, page_option_groups
from mot_viz.data.eval_data import BUILTIN_DATASETS
from mot_viz.engine.model_files import BUNDLED_MODELS


def restored(link: str):
    """What the app restores from a link's query (as a fresh session opened on it does): nothing may be ignored."""
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(link).query))
    parsed = parse_link(query, models=list(BUNDLED_MODELS), checkpoints=list(available_checkpoints()),
                        datasets=list(BUILTIN_DATASETS), examples=EXAMPLES_PER_DATASET,
                        option_groups=page_option_groups())
    assert not parsed.ignored and not parsed.typed, parsed.ignored
    return parsed
