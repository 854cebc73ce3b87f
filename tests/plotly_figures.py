"""Reading the plotly figures an AppTest run shows (shared by the app's page tests)."""

from __future__ import annotations

import base64
import json

import numpy as np
from streamlit.testing.v1 import AppTest


def _decode(value):
    """Plotly writes numeric arrays as {dtype, bdata (base64), shape}; turn them back into numpy arrays."""
    if isinstance(value, dict) and "bdata" in value:
        array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = [int(n) for n in str(value.get("shape", len(array))).split(",")]
        return array.reshape(shape)
    if isinstance(value, dict):
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def figures(at: AppTest) -> list[dict]:
    """The figures shown, as plotly JSON with numeric arrays decoded."""
    return [_decode(json.loads(chart.proto.spec)) for chart in at.get("plotly_chart")]
