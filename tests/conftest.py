"""Shared fixtures. Tiny randomly initialised models of every supported family come from mot_viz.testing
(the app's tests use the same builders); the real bundled pair is loaded once per session."""

from __future__ import annotations

import pytest

from mot_viz.models import LoadedModel, load_model
from mot_viz.testing import CORPUS, FAMILIES, tiny_config, tiny_model, tiny_tokenizer  # noqa: F401  (re-exported)


@pytest.fixture(scope="session")
def real_source() -> LoadedModel:
    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def real_target() -> LoadedModel:
    return load_model("gemma3-270m")


@pytest.fixture(scope="session")
def app_cache(tmp_path_factory):
    """A user cache folder (MOT_VIZ_CACHE) of the app tests' own: what they fit or save never reaches ~/.cache."""
    return tmp_path_factory.mktemp("mot_viz_cache")
